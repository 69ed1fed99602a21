"""A visiting order for the kernels from node coordinates: nodes sorted along a Z-order (Morton) curve of their
latitude/longitude, so that nodes visited one after another gather the same neighbours while those are still
in the GPU's L2 cache. The order changes speed only, never results; this shows the second half on the CPU
(fused kernels through the Triton interpreter), a GPU run gets the first.

    python examples/node_order.py
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before gtnorm's kernels are first used

import gtnorm  # noqa: E402


def morton_order(lat: torch.Tensor, lon: torch.Tensor, bits: int = 16) -> torch.Tensor:
    """[N] node ids in Z-order of (lat, lon) in degrees: a permutation for GraphLayout's dst_order/src_order."""
    y = ((lat + 90) / 180 * (2**bits - 1)).long()
    x = ((lon % 360) / 360 * (2**bits - 1)).long()
    code = torch.zeros_like(x)
    for bit in range(bits):
        code |= ((x >> bit) & 1) << (2 * bit) | ((y >> bit) & 1) << (2 * bit + 1)
    return torch.argsort(code)


def random_points(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lat, lon) in degrees and xyz [n, 3] of n random points on the unit sphere."""
    xyz = torch.nn.functional.normalize(torch.randn(n, 3, dtype=torch.float64), dim=1)
    lat, lon = torch.rad2deg(torch.asin(xyz[:, 2])), torch.rad2deg(torch.atan2(xyz[:, 1], xyz[:, 0]))
    return lat, lon, xyz


torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
num_src, num_dst, neighbours = 400, 120, 6  # data -> hidden, as an encoder
src_lat, src_lon, src_xyz = random_points(num_src)
dst_lat, dst_lon, dst_xyz = random_points(num_dst)

# Each hidden (destination) node receives its 6 nearest data (source) nodes.
nearest = torch.cdist(dst_xyz, src_xyz).topk(neighbours, largest=False).indices  # [N_dst, 6]
edge_index = torch.stack([nearest.flatten(), torch.arange(num_dst).repeat_interleave(neighbours)]).to(device)

by_coordinates = gtnorm.GraphLayout.from_edge_index(
    edge_index,
    num_nodes=(num_src, num_dst),
    dst_order=morton_order(dst_lat, dst_lon).to(device),
    src_order=morton_order(src_lat, src_lon).to(device),
)
default = gtnorm.GraphLayout.from_edge_index(edge_index, num_nodes=(num_src, num_dst))

heads, channels = 2, 16
q = torch.randn(num_dst, heads, channels, device=device)  # [N_dst, H, C]
k = torch.randn(num_src, heads, channels, device=device)  # [N_src, H, C]
v = torch.randn(num_src, heads, channels, device=device)  # [N_src, H, C]
out_coordinates = gtnorm.graph_transformer_attention(q, k, v, None, by_coordinates, qk_norm=True)
out_default = gtnorm.graph_transformer_attention(q, k, v, None, default, qk_norm=True)
difference = (out_coordinates - out_default).abs().max().item()
print(f"max |difference| between the two visiting orders: {difference:.1e}")
assert difference < 1e-5
print("ok: the same result in either order")
