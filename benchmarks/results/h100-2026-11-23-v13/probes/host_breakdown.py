"""Where the host time of one forward+backward call of the op goes (device probe of session 13): wall time per
call of loops with no sync inside (benchmarks.host_time.loop_us), bf16, H = 16, C = 64, RMSNorm weights.

    python benchmarks/results/h100-2026-11-23-v13/probes/host_breakdown.py h_to_h_tiny
"""

import sys

import torch
import triton
import triton.language as tl

import gtnorm
from benchmarks.graphs.catalog import load_graph
from benchmarks.host_time import loop_us
from gtnorm.triton import ops


@triton.jit
def _three_args(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _many_args(
    x_ptr, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15, p16, p17, p18, p19, p20, p21, p22, p23,
    p24, p25, p26, p27, p28, i1, i2, i3, i4, i5, i6, f1, f2, f3, f4, n, A: tl.constexpr, B: tl.constexpr,
    C: tl.constexpr, D: tl.constexpr, E: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def main() -> None:
    device = torch.device("cuda")
    graph = load_graph(sys.argv[1] if len(sys.argv) > 1 else "h_to_h_tiny")
    heads, channels = 16, 64
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16).requires_grad_()

    q = randn(graph.num_dst, heads, channels)
    k, v = randn(graph.num_src, heads, channels), randn(graph.num_src, heads, channels)
    e = randn(graph.num_edges, heads, channels)
    w_q = torch.ones(channels, device=device, requires_grad=True)
    w_k = torch.ones(channels, device=device, requires_grad=True)
    grad = torch.randn_like(q)
    layout = gtnorm.GraphLayout.from_edge_index(graph.edge_index.to(device), (graph.num_src, graph.num_dst))
    leaves = [q, k, v, e, w_q, w_k]
    x = torch.zeros(64, device=device)
    inputs = [q, k, v, e, None, None, None, w_q, None, w_k, None, *layout.tensors()]

    def op(norm=True):
        params = dict(qk_norm=True, q_norm_weight=w_q, k_norm_weight=w_k) if norm else {}
        return gtnorm.graph_transformer_attention(q, k, v, e, layout, **params)

    def row(label, fn, grads=()):
        print(f"{label:40s} {loop_us(fn, grads):8.1f} us", flush=True)

    row("empty launch 3 args", lambda: _three_args[(1,)](x, 16, BLOCK=16))
    many = [x] * 28 + [1, 2, 3, 4, 5, 6, 0.5, 0.25, 1e-5, 1e-6, 16]
    row("empty launch 45 args", lambda: _many_args[(1,)](x, *many, A=True, B=False, C=1, D=64, E=2, BLOCK=16))
    row("torch.empty x10", lambda: [torch.empty((1000, 16), device=device) for _ in range(10)])
    row("trivial backward", lambda: (w_q * 2).sum().backward(), [w_q])
    with torch.no_grad():
        row("raw attention_forward", lambda: ops.attention_forward(*inputs, "rms", 1e-6, 1e-6))
        _, lse, _ = ops.attention_forward(*inputs, "rms", 1e-6, 1e-6)
        saved = [grad, q, k, v, e, None, None, None, w_q, None, w_k, None, lse, None, *layout.tensors()]
        row("raw attention_backward", lambda: ops.attention_backward(*saved, "rms", 1e-6, 1e-6, False))
        row("op forward no_grad", op)
    row("op forward with grad (graph dropped)", op)
    row("op forward+backward", lambda: op().backward(grad), leaves)
    row("op f+b, no norm (4 leaves)", lambda: op(norm=False).backward(grad), leaves[:4])
    apply = ops._EagerGraphAttention.apply
    row("Function.apply f+b (no checks)", lambda: apply(None, *inputs, "rms", 1e-6, 1e-6)[0].backward(grad), leaves)


if __name__ == "__main__":
    main()
