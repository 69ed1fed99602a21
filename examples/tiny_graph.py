"""The README's example: the layer on a tiny graph, forward and backward, the same code on a GPU and a CPU (on a
CPU the layer takes its PyG path; examples/layer_cpu.py runs the fused kernels there through the interpreter).

    python examples/tiny_graph.py
"""

import torch

import gtnorm

device = "cuda" if torch.cuda.is_available() else "cpu"
heads, channels = 4, 32
# 4 source nodes -> 2 destination nodes, 3 incoming edges each; row 0 = source, row 1 = destination (as in PyG).
edge_index = torch.tensor([[0, 1, 2, 1, 2, 3], [0, 0, 0, 1, 1, 1]], device=device)
query = torch.randn(2, heads, channels, device=device, requires_grad=True)  # [N_dst, H, C]
key = torch.randn(4, heads, channels, device=device)  # [N_src, H, C]
value = torch.randn(4, heads, channels, device=device)  # [N_src, H, C]
edge_attr = torch.randn(6, heads, channels, device=device)  # [M, H, C]: one row per edge

conv = gtnorm.GraphTransformerConv(channels, qk_norm=True).to(device)  # RMSNorm on q and k, fused on a GPU
out = conv(query, key, value, edge_attr, edge_index, size=(4, 2))  # [N_dst, H, C]
out.square().sum().backward()
print(out.shape, query.grad.shape, conv.q_norm.weight.grad.shape)  # [2, 4, 32] twice, then [32]
