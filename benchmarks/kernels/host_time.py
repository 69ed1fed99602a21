"""Developer probe: where the host time of one forward+backward call goes, and how fast this host launches.

    python -m benchmarks.kernels.host_time [--graphs h_to_h_tiny h_to_h_small] [--profile] [--anemoi-fused-qk PATH]

Per graph (bf16, H = 16, C = 64, RMSNorm with affine weights): wall time per call of a loop of calls with no
sync inside (on a graph whose kernels take a few microseconds that is the host's time; CUDA-event GPU time
beside it says whether it is), for gtnorm's op on a prebuilt layout (RMSNorm with weights, and no norm) and Anemoi's
kernel on a prebuilt CSC (no norm), and with ``--anemoi-fused-qk`` Anemoi's fused-QK-norm kernel (RMSNorm without
weights; benchmarks/peer_kernels.py loads it from the path given).
The op captured in a CUDA graph (torch.cuda.graph) and replayed. The layer: eager, torch.compile'd, and compiled
with mode="reduce-overhead" (CUDA graphs).
Calibration rows: an empty Triton kernel and a torch.add launched in a loop (microseconds per launch).
``--profile``: cProfile of gtnorm's call on the first graph, top functions by own time, then torch.profiler
tables (host time per op, device time per kernel) of gtnorm's op and Anemoi's kernels on every graph.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import torch._inductor.config
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

import gtnorm
from benchmarks.graphs.catalog import load_graph
from benchmarks.peer_kernels import anemoi_csc, load_anemoi_fused_qk

try:
    from anemoi.models.triton.gt import graph_transformer_attention_conv as anemoi_conv
except ImportError:  # anemoi-models is optional
    anemoi_conv = None


@triton.jit
def _empty_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def loop_us(fn, leaves=(), reps: int = 200, trials: int = 5) -> float:
    """Wall time per call of ``reps`` calls in a row, synced only around the loop (median of trials)."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(trials):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            for leaf in leaves:
                leaf.grad = None
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / reps * 1e6)
    return sorted(times)[trials // 2]


def gpu_us(fn, leaves=()) -> float:
    return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=list(leaves), return_mode="median")


def paths(graph, heads: int, channels: int, device, fused_qk=None):
    dtype = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype).requires_grad_()

    q, k, v = (
        randn(graph.num_dst, heads, channels),
        randn(graph.num_src, heads, channels),
        randn(graph.num_src, heads, channels),
    )
    e = randn(graph.num_edges, heads, channels)
    w_q, w_k = (
        (torch.ones(channels, device=device) + 0.1 * torch.randn(channels, device=device)).requires_grad_(),
        (torch.ones(channels, device=device)).requires_grad_(),
    )
    grad = torch.randn(graph.num_dst, heads, channels, device=device, dtype=dtype)
    edge_index = graph.edge_index.to(device)
    sizes = (graph.num_src, graph.num_dst)
    layout = gtnorm.GraphLayout.from_edge_index(edge_index, sizes)
    leaves = [q, k, v, e, w_q, w_k]

    def op_fwd():
        with torch.no_grad():
            gtnorm.graph_transformer_attention(q, k, v, e, layout, qk_norm=True, q_norm_weight=w_q, k_norm_weight=w_k)

    def op():
        out = gtnorm.graph_transformer_attention(q, k, v, e, layout, qk_norm=True, q_norm_weight=w_q, k_norm_weight=w_k)
        out.backward(grad)

    def op_no_norm():
        gtnorm.graph_transformer_attention(q, k, v, e, layout).backward(grad)

    # The op with its layout prebuilt captures as it is (no sync, no lookup): one replay per step.
    cuda_graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up on a side stream, as torch.cuda.graph asks
            for t in leaves:
                t.grad = None
            op()
    torch.cuda.current_stream().wait_stream(side)
    for t in leaves:
        t.grad = None
    with torch.cuda.graph(cuda_graph):
        op()

    conv = gtnorm.GraphTransformerConv(channels, qk_norm=True, backend="triton").to(device)
    conv_leaves = [q, k, v, e, *conv.parameters()]

    def layer(module=conv):
        module(q, k, v, e, edge_index, size=sizes).backward(grad)

    # CUDA graphs (torch.compile's reduce-overhead): the layout lookup is split off, the kernels captured.
    torch._inductor.config.graph_partition = True
    captured = torch.compile(conv, mode="reduce-overhead", fullgraph=True)
    compiled = torch.compile(conv, fullgraph=True)
    found = {
        "gtnorm_op_fwd": (op_fwd, ()),
        "gtnorm_op": (op, leaves),
        "gtnorm_op_no_norm": (op_no_norm, leaves[:4]),
        "gtnorm_op_cuda_graph": (cuda_graph.replay, ()),
        "gtnorm_layer": (layer, conv_leaves),
        "gtnorm_layer_compiled": (lambda: layer(compiled), conv_leaves),
        "gtnorm_layer_cudagraph": (lambda: layer(captured), conv_leaves),
    }
    if anemoi_conv is not None:
        csc, perm, reverse = anemoi_csc(edge_index, sizes)

        def anemoi_fwd():
            with torch.no_grad():
                edges = e.index_select(0, perm) if perm is not None else e
                anemoi_conv(q, k, v, edges, csc, reverse)

        def anemoi():
            edges = e.index_select(0, perm) if perm is not None else e
            anemoi_conv(q, k, v, edges, csc, reverse).backward(grad)

        found |= {"anemoi_kernel_fwd": (anemoi_fwd, ()), "anemoi_kernel": (anemoi, leaves[:4])}
        if fused_qk is not None:

            def anemoi_fused_qk():
                edges = e.index_select(0, perm) if perm is not None else e
                fused_qk(q, k, v, edges, csc, reverse).backward(grad)

            found["anemoi_fused_qk"] = (anemoi_fused_qk, leaves[:4])
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", nargs="+", default=["h_to_h_tiny", "h_to_h_small"])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--calibrate-only", action="store_true")
    parser.add_argument("--anemoi-fused-qk", metavar="PATH", help="see benchmarks/peer_kernels.py")
    args = parser.parse_args(argv)
    fused_qk = load_anemoi_fused_qk(args.anemoi_fused_qk, "rms") if args.anemoi_fused_qk else None
    device = torch.device("cuda")
    x = torch.zeros(16, device=device)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    leaf = torch.zeros(16, device=device, requires_grad=True)
    print(f"calibration: empty Triton launch {loop_us(lambda: _empty_kernel[(1,)](x, 16, BLOCK=16)):.1f} us, "
          f"torch.add {loop_us(lambda: torch.add(x, x)):.1f} us, "
          f"(leaf * 2).sum().backward() {loop_us(lambda: (leaf * 2).sum().backward(), [leaf]):.1f} us")  # fmt: skip
    for name in [] if args.calibrate_only else args.graphs:
        graph = load_graph(name)
        for path, (fn, leaves) in paths(graph, args.heads, 64, device, fused_qk).items():
            print(f"{name:14s} {path:18s} loop {loop_us(fn, leaves):8.1f} us/call   gpu {gpu_us(fn, leaves):8.1f} us",
                  flush=True)  # fmt: skip
    if args.profile:
        found = paths(load_graph(args.graphs[0]), args.heads, 64, device, fused_qk)
        fn, leaves = found["gtnorm_op"]
        loop_us(fn, leaves)
        profiler = cProfile.Profile()
        profiler.enable()
        loop_us(fn, leaves, reps=100, trials=1)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
        for name in args.graphs:
            found = paths(load_graph(name), args.heads, 64, device, fused_qk)
            for path in ("gtnorm_op", "gtnorm_op_no_norm", "anemoi_kernel", "anemoi_fused_qk"):
                if path in found:
                    print_torch_profile(f"{name} {path}", *found[path])


def print_torch_profile(path: str, fn, leaves, reps: int = 20) -> None:
    """torch.profiler over ``reps`` calls: per op, host time (self CPU) and device time per call."""
    loop_us(fn, leaves)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for leaf in leaves:
                leaf.grad = None
            fn()
        torch.cuda.synchronize()
    print(f"\n{path}: torch.profiler over {reps} calls (totals; divide by {reps} for one call)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
