"""GraphTransformerConv and the functional op: at Anemoi's processor size in bfloat16 on a GPU; on a CPU on a small
graph in float32, the kernels through the Triton interpreter (about 10 s of one core).

    python examples/layer_and_op.py
"""

import os

import torch

# Without CUDA the kernels run through the Triton interpreter, which is chosen when gtnorm's kernels are first
# defined: set it before they are used (docs/cpu.md).
on_gpu = torch.cuda.is_available()
if not on_gpu:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import gtnorm  # noqa: E402

torch.manual_seed(0)
device, dtype = (torch.device("cuda"), torch.bfloat16) if on_gpu else (torch.device("cpu"), torch.float32)
# A square (processor) graph: every node receives `degree` random neighbours.
heads, channels, num_nodes, degree = (16, 64, 40962, 8) if on_gpu else (4, 32, 32, 4)

dst = torch.arange(num_nodes, device=device).repeat_interleave(degree)
src = torch.randint(0, num_nodes, (dst.numel(),), device=device)
edge_index = torch.stack([src, dst])  # [2, M]: row 0 = source, row 1 = destination (PyG's convention)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)


query = randn(num_nodes, heads, channels)  # [N_dst, H, C]
key = randn(num_nodes, heads, channels)  # [N_src, H, C]
value = randn(num_nodes, heads, channels)  # [N_src, H, C]
edge_attr = randn(edge_index.shape[1], heads, channels)  # [M, H, C]

# The layer: holds the q_norm / k_norm RMSNorm modules; builds the graph's layout on first sight of this
# edge_index tensor and reuses it while the tensor is alive and unmodified.
conv = gtnorm.GraphTransformerConv(channels, qk_norm=True, backend="triton").to(device)
out = conv(query, key, value, edge_attr, edge_index, size=(num_nodes, num_nodes))  # [N_dst, H, C]
out.float().square().sum().backward()
print(f"layer: out {tuple(out.shape)} {out.dtype}, |d q_norm.weight| = {conv.q_norm.weight.grad.norm():.3g}")

# The functional op takes the layout explicitly: build it once per graph.
layout = gtnorm.GraphLayout.from_edge_index(edge_index, num_nodes=(num_nodes, num_nodes))
w_q = torch.ones(channels, device=device, requires_grad=True)
w_k = torch.ones(channels, device=device, requires_grad=True)
out2 = gtnorm.graph_transformer_attention(
    query, key, value, edge_attr, layout, qk_norm=True, q_norm_weight=w_q, k_norm_weight=w_k
)
out2.float().square().sum().backward()
# The layer's fresh norm weights are ones too: the same function of the same inputs.
difference = (out2.float() - out.float()).abs().max().item()
print(f"functional: max |out2 - out| = {difference:.3g}")
assert difference < 1e-2

# The PyG path of the same layer, for comparison (in bf16 both round, so compare loosely).
reference = gtnorm.GraphTransformerConv(channels, qk_norm=True, backend="pyg").to(device)
expected = reference(query, key, value, edge_attr, edge_index, size=(num_nodes, num_nodes))
error = ((out.float() - expected.float()).norm() / expected.float().norm()).item()
print(f"fused vs pyg ({str(dtype).removeprefix('torch.')}): relative error {error:.1e}")
assert error < 3e-2
print("ok")
