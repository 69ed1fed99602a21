"""Device probe of session 14 (A/B of two checkouts, one process each): host time per call of the op (loop wall
time, no sync inside) for the code on PYTHONPATH, beside Anemoi's kernel; tag = argv[1]."""

import sys
import time

import torch
import triton

import gtnorm
from benchmarks.graphs.catalog import load_graph
from benchmarks.host_time import loop_us

try:
    from anemoi.models.triton.gt import graph_transformer_attention_conv as anemoi_conv
    from anemoi.models.triton.utils import edge_index_to_csc
except ImportError:
    anemoi_conv = None


def enqueue_us(fn, leaves=(), reps=8, trials=7):
    for _ in range(3):
        fn()
    times = []
    for _ in range(trials):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(3e8))
        t = time.perf_counter()
        for _ in range(reps):
            for leaf in leaves:
                leaf.grad = None
            fn()
        times.append((time.perf_counter() - t) / reps * 1e6)
    torch.cuda.synchronize()
    return sorted(times)[trials // 2]


def rows(tag, graph_name, heads, channels=64, with_anemoi=True):
    device = torch.device("cuda")
    graph = load_graph(graph_name)
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16).requires_grad_()

    q = randn(graph.num_dst, heads, channels)
    k, v = randn(graph.num_src, heads, channels), randn(graph.num_src, heads, channels)
    e = randn(graph.num_edges, heads, channels)
    w_q = torch.ones(channels, device=device, requires_grad=True)
    w_k = torch.ones(channels, device=device, requires_grad=True)
    grad = torch.randn_like(q)
    edge_index = graph.edge_index.to(device)
    layout = gtnorm.GraphLayout.from_edge_index(edge_index, (graph.num_src, graph.num_dst))
    leaves = [q, k, v, e, w_q, w_k]

    def op(norm=True):
        kw = dict(qk_norm=True, q_norm_weight=w_q, k_norm_weight=w_k) if norm else {}
        return gtnorm.graph_transformer_attention(q, k, v, e, layout, **kw)

    found = {
        "op_fb": lambda: op().backward(grad),
        "op_fb_nonorm": lambda: op(False).backward(grad),
    }
    if anemoi_conv is not None and with_anemoi:
        csc, perm, reverse = edge_index_to_csc(edge_index, (graph.num_src, graph.num_dst), reverse=True)
        q_norm = torch.nn.RMSNorm(channels, eps=1e-6).to(device)
        k_norm = torch.nn.RMSNorm(channels, eps=1e-6).to(device)
        leaves += [q_norm.weight, k_norm.weight]

        def anemoi(norm):
            edges = e.index_select(0, perm) if perm is not None else e
            qq, kk = (q_norm(q), k_norm(k)) if norm else (q, k)
            return anemoi_conv(qq, kk, v, edges, csc, reverse)

        found["anemoi_fb_norm"] = lambda: anemoi(True).backward(grad)
        found["anemoi_fb_nonorm"] = lambda: anemoi(False).backward(grad)
    out = {}
    for name, fn in found.items():
        out[name] = (loop_us(fn, leaves), enqueue_us(fn, leaves))
    with torch.no_grad():
        out["op_fwd"] = (loop_us(op), enqueue_us(op))
        if "anemoi_fb_norm" in found:
            out["anemoi_fwd_norm"] = (loop_us(lambda: anemoi(True)), enqueue_us(lambda: anemoi(True)))
    for name, (loop, enq) in out.items():
        print(f"{tag:4s} {graph_name:15s} H{heads:<3d} {name:18s} loop {loop:8.1f} us  host {enq:8.1f} us", flush=True)
    if graph.num_edges > 1_000_000 or graph_name == "h_to_h":
        ms = triton.testing.do_bench(lambda: op().backward(grad), grad_to_none=leaves, return_mode="median")
        print(f"{tag:4s} {graph_name:15s} H{heads:<3d} op_fb do_bench {ms:.4f} ms", flush=True)


def main():
    tag = sys.argv[1]
    x = torch.zeros(16, device="cuda", requires_grad=True)
    print(f"{tag} trivial backward {loop_us(lambda: (x * 2).sum().backward(), [x]):.1f} us", flush=True)
    for spec in ["h_to_h_tiny:16", "h_to_h_small:16", "era_to_h_small:4", "h_to_era_small:4",
                 "h_to_h:16"]:  # fmt: skip
        name, heads = spec.split(":")
        rows(tag, name, int(heads), with_anemoi=name != "h_to_h")


if __name__ == "__main__":
    main()
