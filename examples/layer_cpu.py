"""gtnorm on a CPU: GraphTransformerConv's PyG path, and the same layer on the fused Triton kernels run through
the Triton interpreter (for trying and testing the kernels; ~40x slower than the PyG path), on a small graph.

    python examples/layer_cpu.py
"""

import os

# The interpreter is chosen when gtnorm's kernels are first defined: set it before they are used.
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import gtnorm  # noqa: E402

torch.manual_seed(0)
heads, channels = 4, 32
num_src, num_dst = 300, 100  # a bipartite graph, as an encoder's data -> hidden nodes

# Every destination receives 8 random sources. Row 0 = source, row 1 = destination (PyG's convention).
dst = torch.arange(num_dst).repeat_interleave(8)
src = torch.randint(0, num_src, (dst.numel(),))
edge_index = torch.stack([src, dst])  # [2, M]

query = torch.randn(num_dst, heads, channels, requires_grad=True)  # [N_dst, H, C]
key = torch.randn(num_src, heads, channels, requires_grad=True)  # [N_src, H, C]
value = torch.randn(num_src, heads, channels, requires_grad=True)  # [N_src, H, C]
edge_attr = torch.randn(edge_index.shape[1], heads, channels, requires_grad=True)  # [M, H, C]
inputs = (query, key, value, edge_attr, edge_index)

outputs = {}
for backend in ("pyg", "triton"):
    conv = gtnorm.GraphTransformerConv(channels, qk_norm=True, backend=backend)  # RMSNorm on q and k
    out = conv(*inputs, size=(num_src, num_dst))  # [N_dst, H, C]
    out.square().sum().backward()
    outputs[backend] = (out.detach(), query.grad.clone(), conv.q_norm.weight.grad.clone())
    query.grad = key.grad = value.grad = edge_attr.grad = None

for name, pyg, fused in zip(("out", "d query", "d q_norm.weight"), outputs["pyg"], outputs["triton"], strict=True):
    error = ((fused - pyg).norm() / pyg.norm()).item()
    print(f"{name:16s} fused vs pyg: relative error {error:.1e}")
    assert error < 1e-4, name
print("ok: the fused kernels compute what the PyG path computes")
