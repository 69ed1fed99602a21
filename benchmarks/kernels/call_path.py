"""The path around the kernels: layout builds and cache hits, host time per call, beside Anemoi's own path.

    python -m benchmarks.kernels.call_path [--graphs h_to_h_small ...] [--heads 16 4] [--out DIR]

Per graph (bf16, C = 64, RMSNorm on q and k with affine weights):
- layout: GraphLayout.from_edge_index with and without the visiting-order search, a cache hit by identity and
  by content (a clone), 4 batch copies from the base layout (repeat and a content hit on a fresh expansion),
  beside Anemoi's ``edge_index_to_csc`` of the same graph and of its 4 copies (what its block runs every call);
- forward+backward: GPU time (CUDA events, median) and host time per call (the GPU kept busy by a long sleep
  kernel queued first, so the host loop never waits; a call that syncs shows up as the sleep's length) for
  gtnorm's op on a prebuilt layout, gtnorm's layer with the same edge_index tensor every call and with a fresh
  clone every call, Anemoi's path as its block runs it (torch RMSNorm on q and k, edge_index_to_csc, its Triton
  kernel), the same on a prebuilt CSC (the pair of gtnorm's op), and Anemoi's kernel alone on a prebuilt CSC (the
  pair of gtnorm's op without a norm).
Needs CUDA; Anemoi's rows need anemoi-models.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton

import gtnorm
from benchmarks.graphs.catalog import load_graph
from benchmarks.peer_kernels import anemoi_csc
from gtnorm.triton.layout_cache import LayoutCache

try:
    from anemoi.models.triton.gt import graph_transformer_attention_conv as anemoi_conv
except ImportError:  # anemoi-models is optional
    anemoi_conv = None

DEFAULT_GRAPHS = ("era_to_h_small", "h_to_h_small", "h_to_era_small", "h_to_h", "era_to_h", "h_to_era")
COPIES = 4


def gpu_ms(fn, leaves=()) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, grad_to_none=list(leaves), return_mode="median")


def host_us(fn, leaves=(), reps: int = 8, trials: int = 5) -> float:
    """Host time per call while the GPU is busy: nothing the host does waits for the GPU, unless it syncs (then
    the result is about the queued sleep, ~0.25 s). Few calls per trial, so that their launches stay well inside
    the GPU's launch queue (a full queue blocks the host); median over trials."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(trials):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(5e8))  # ~0.25 s of GPU time queued ahead of the calls
        start = time.perf_counter()
        for _ in range(reps):
            for leaf in leaves:
                leaf.grad = None
            fn()
        times.append((time.perf_counter() - start) / reps * 1e6)
    torch.cuda.synchronize()
    return sorted(times)[trials // 2]


def layout_rows(graph, device) -> dict:
    edge_index = graph.edge_index.to(device=device, dtype=torch.int64)
    sizes = (graph.num_src, graph.num_dst)
    copies = torch.cat([edge_index + b * torch.tensor([[sizes[0]], [sizes[1]]], device=device)
                        for b in range(COPIES)], dim=1)  # fmt: skip
    rows = {
        "build_searched_ms": gpu_ms(lambda: gtnorm.GraphLayout.from_edge_index(edge_index, sizes)),
        "build_fast_ms": gpu_ms(lambda: gtnorm.GraphLayout.from_edge_index(edge_index, sizes, search_order=False)),
    }
    cache = LayoutCache()
    cache.get(edge_index, *sizes)
    rows["hit_identity_us"] = host_us(lambda: cache.get(edge_index, *sizes))
    rows["hit_content_ms"] = gpu_ms(lambda: cache.get(edge_index.clone(), *sizes))
    base = gtnorm.GraphLayout.from_edge_index(edge_index, sizes)
    rows[f"repeat{COPIES}_ms"] = gpu_ms(lambda: base.repeat(COPIES))
    cache.get(copies, COPIES * sizes[0], COPIES * sizes[1])
    rows[f"hit_content_{COPIES}_copies_ms"] = gpu_ms(
        lambda: cache.get(copies.clone(), COPIES * sizes[0], COPIES * sizes[1])
    )
    if anemoi_conv is not None:  # the graphs' edges are sorted by destination, as Anemoi's providers give them
        rows["anemoi_csc_ms"] = gpu_ms(lambda: anemoi_csc(edge_index, sizes, dst_sorted=True))
        rows[f"anemoi_csc_{COPIES}_copies_ms"] = gpu_ms(
            lambda: anemoi_csc(copies, (COPIES * sizes[0], COPIES * sizes[1]), dst_sorted=True)
        )
    return rows


def call_rows(graph, heads: int, channels: int, device) -> dict:
    dtype = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype).requires_grad_()

    q, k, v = (
        randn(graph.num_dst, heads, channels),
        randn(graph.num_src, heads, channels),
        randn(graph.num_src, heads, channels),
    )
    e = randn(graph.edge_index.shape[1], heads, channels)
    grad = torch.randn(graph.num_dst, heads, channels, generator=gen, device=device, dtype=dtype)
    edge_index = graph.edge_index.to(device=device, dtype=torch.int64)
    sizes = (graph.num_src, graph.num_dst)
    conv = gtnorm.GraphTransformerConv(channels, qk_norm=True, backend="triton").to(device)
    with torch.no_grad():
        for norm in (conv.q_norm, conv.k_norm):
            norm.weight.add_(0.1 * torch.randn(channels, generator=gen, device=device))
    layout = gtnorm.GraphLayout.from_edge_index(edge_index, sizes)
    w_q, w_k = conv.q_norm.weight, conv.k_norm.weight
    leaves = [q, k, v, e, w_q, w_k]

    def op():
        out = gtnorm.graph_transformer_attention(q, k, v, e, layout, qk_norm=True, q_norm_weight=w_q,
                                                 k_norm_weight=w_k, eps=conv.q_norm.eps)  # fmt: skip
        out.backward(grad)

    def op_no_norm():
        gtnorm.graph_transformer_attention(q, k, v, e, layout).backward(grad)

    def layer_same():
        conv(q, k, v, e, edge_index, size=sizes).backward(grad)

    def layer_clone():
        conv(q, k, v, e, edge_index.clone(), size=sizes).backward(grad)

    paths = {"gtnorm_op": op, "gtnorm_op_no_norm": op_no_norm}
    paths |= {"gtnorm_layer": layer_same, "gtnorm_layer_fresh_clone": layer_clone}
    if anemoi_conv is not None:
        q_norm = torch.nn.RMSNorm(channels, eps=conv.q_norm.eps).to(device)
        k_norm = torch.nn.RMSNorm(channels, eps=conv.k_norm.eps).to(device)
        with torch.no_grad():
            q_norm.weight.copy_(w_q), k_norm.weight.copy_(w_k)
        leaves += [q_norm.weight, k_norm.weight]
        csc, perm, reverse = anemoi_csc(edge_index, sizes)

        def anemoi_block():
            csc_, perm_, reverse_ = anemoi_csc(edge_index, sizes, dst_sorted=True)
            edges = e.index_select(0, perm_) if perm_ is not None else e
            anemoi_conv(q_norm(q), k_norm(k), v, edges, csc_, reverse_).backward(grad)

        def anemoi_norm_kernel():
            edges = e.index_select(0, perm) if perm is not None else e
            anemoi_conv(q_norm(q), k_norm(k), v, edges, csc, reverse).backward(grad)

        def anemoi_kernel():
            edges = e.index_select(0, perm) if perm is not None else e
            anemoi_conv(q, k, v, edges, csc, reverse).backward(grad)

        paths |= {"anemoi_block_path": anemoi_block, "anemoi_norm_kernel": anemoi_norm_kernel}
        paths |= {"anemoi_kernel_only": anemoi_kernel}
    rows = {}
    for name, fn in paths.items():
        rows[f"{name}_gpu_ms"] = gpu_ms(fn, leaves)
        rows[f"{name}_host_us"] = host_us(fn, leaves)
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", nargs="+", default=list(DEFAULT_GRAPHS))
    parser.add_argument("--heads", nargs="+", type=int, default=[16, 4])
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "graphs": {}}  # fmt: skip
    for name in args.graphs:
        graph = load_graph(name)
        entry = {"layout": layout_rows(graph, device)}
        for heads in args.heads:
            entry[f"H{heads}"] = call_rows(graph, heads, args.channels, device)
        results["graphs"][name] = entry
        print(name, json.dumps(entry, indent=1), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "call_path.json").write_text(json.dumps(results, indent=1))
    _print_table(results)
    return results


def _print_table(results) -> None:
    print(f"\n{results['device']}, torch {results['torch']}, triton {results['triton']}")
    for name, entry in results["graphs"].items():
        lay = entry["layout"]
        print(f"{name}: layout ms: search {lay['build_searched_ms']:.2f}, fast {lay['build_fast_ms']:.3f}, "
              f"anemoi csc {lay.get('anemoi_csc_ms', float('nan')):.3f}; hit identity {lay['hit_identity_us']:.1f} us, "
              f"content {lay['hit_content_ms']:.3f} ms, {COPIES} copies: repeat {lay[f'repeat{COPIES}_ms']:.3f}, "
              f"hit {lay[f'hit_content_{COPIES}_copies_ms']:.3f}, "
              f"anemoi csc {lay.get(f'anemoi_csc_{COPIES}_copies_ms', float('nan')):.3f}")  # fmt: skip
        for key, rows in entry.items():
            if key == "layout":
                continue
            paths = [p.removesuffix("_gpu_ms") for p in rows if p.endswith("_gpu_ms")]
            cells = [f"{p} {rows[p + '_gpu_ms']:.3f}ms/{rows[p + '_host_us']:.0f}us" for p in paths]
            print(f"  {key} fwd+bwd gpu/host: " + "; ".join(cells))


if __name__ == "__main__":
    main()
