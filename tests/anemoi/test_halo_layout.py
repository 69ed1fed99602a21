"""The layout anemoi-core main's "edges" sharding hands a processor block (halo exchange, anemoi-core main's
``GraphTransformerProcessorBlock._forward_edges_shard_strategy``): each rank holds its local destination nodes, and
its sources are those nodes followed by the halo rows received from other ranks; the edges are relabelled to that
shard-local numbering, and the block calls ``get_qkve((x_plus_halo, x_local), edge_attr)`` and its edge-sharded
attention with size (local + halo, local). anemoi-models 0.19 has the two block methods that path calls; here they
are called as main calls them, on one process (the halo rows gathered by indexing), for gtnorm's block and Anemoi's,
against each block run on the whole graph. The bipartite mapper case: the same for a mapper block, whose sources
are another node set (the shard's source rows: those its edges reach)."""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
from anemoi.models.layers import block as anemoi_block  # noqa: E402
from anemoi.models.layers.utils import load_layer_kernels  # noqa: E402

import gtnorm.anemoi  # noqa: E402
from tests.anemoi.setups import rel_error  # noqa: E402

CHANNELS, HEADS, EDGE_DIM = 32, 4, 3
TOL = 2e-5  # float32 on both sides; the shard sums its edges in the same order as the whole graph


def random_graph(num_src: int, num_dst: int, generator: torch.Generator, symmetric: bool) -> torch.Tensor:
    degree = torch.randint(1, 5, (num_dst,), generator=generator)
    dst = torch.arange(num_dst).repeat_interleave(degree)
    edges = torch.stack([torch.randint(0, num_src, (dst.numel(),), generator=generator), dst])
    if symmetric:
        edges = torch.cat([edges, edges.flip(0)], dim=1).unique(dim=1)
    return edges[:, torch.argsort(edges[1] * num_src + edges[0])]


def shard(edges: torch.Tensor, local_dst: torch.Tensor, num_src: int, local_src: torch.Tensor | None):
    """A rank's view: its destinations' edges relabelled to local ids (destinations 0..n_local-1; sources: the
    rank's own nodes first, then the halo, in ascending id), and the global ids of its sources in that order."""
    keep = torch.isin(edges[1], local_dst)
    src, dst = edges[0, keep], edges[1, keep]
    own = local_src if local_src is not None else local_dst
    halo = torch.tensor(sorted(set(src.tolist()) - set(own.tolist())), dtype=torch.long)
    sources = torch.cat([own, halo])
    src_id = torch.full((num_src,), -1, dtype=torch.long)
    src_id[sources] = torch.arange(sources.numel())
    dst_id = torch.full((int(edges[1].max()) + 1,), -1, dtype=torch.long)
    dst_id[local_dst] = torch.arange(local_dst.numel())
    return torch.stack([src_id[src], dst_id[dst]]), sources, keep


def attention(block, x_src, x_dst, edge_attr, edge_index, size):
    """What anemoi-core main's edge-sharded processor block computes between its norms: q from x_dst, k and v from
    x_src, the attention over edge_index of the given (N_src, N_dst) size."""
    query, key, value, edges = block.get_qkve((x_src, x_dst), edge_attr)
    return block._forward_edges_sharded_attention(
        query, key, value, edges, edge_index, size, num_chunks=1, edges_are_dst_sorted=True
    )


@pytest.mark.parametrize("kind", ["processor", "mapper"])
def test_halo_layout_matches_the_whole_graph(kind):
    generator = torch.Generator().manual_seed(0)
    num_src, num_dst = (30, 30) if kind == "processor" else (40, 20)
    edges = random_graph(num_src, num_dst, generator, symmetric=kind == "processor")
    classes = {
        "processor": (anemoi_block.GraphTransformerProcessorBlock, gtnorm.anemoi.GraphTransformerProcessorBlock),
        "mapper": (anemoi_block.GraphTransformerMapperBlock, gtnorm.anemoi.GraphTransformerMapperBlock),
    }[kind]
    args = dict(
        in_channels=CHANNELS, hidden_dim=2 * CHANNELS, out_channels=CHANNELS, edge_dim=EDGE_DIM, num_heads=HEADS,
        bias=True, qk_norm=True, layer_kernels=load_layer_kernels(), graph_attention_backend="triton",
    )  # fmt: skip
    if kind == "mapper":
        args["update_src_nodes"] = False
    torch.manual_seed(1)
    anemoi_module = classes[0](**{**args, "graph_attention_backend": "pyg"})
    gtnorm_module = classes[1](**args)
    gtnorm_module.load_state_dict(anemoi_module.state_dict())
    x_src = torch.randn(num_src, CHANNELS, generator=generator)
    x_dst = x_src if kind == "processor" else torch.randn(num_dst, CHANNELS, generator=generator)
    edge_attr = torch.randn(edges.shape[1], EDGE_DIM, generator=generator)

    # Two "ranks": each holds a contiguous share of the destinations (the processor's own nodes are its sources).
    shares = [torch.arange(0, num_dst // 2 + 1), torch.arange(num_dst // 2 + 1, num_dst)]
    for module in (gtnorm_module, anemoi_module):
        whole = attention(module, x_src, x_dst, edge_attr, edges, (num_src, num_dst))
        for local_dst in shares:
            local_src = None if kind == "processor" else torch.unique(edges[0, torch.isin(edges[1], local_dst)])
            edge_index, sources, keep = shard(edges, local_dst, num_src, local_src)
            size = (sources.numel(), local_dst.numel())
            out = attention(module, x_src[sources], x_dst[local_dst], edge_attr[keep], edge_index, size)
            assert rel_error(out, whole[local_dst]) <= TOL, type(module)
    # And gtnorm's block computes Anemoi's function on the whole graph.
    expected = attention(anemoi_module, x_src, x_dst, edge_attr, edges, (num_src, num_dst))
    actual = attention(gtnorm_module, x_src, x_dst, edge_attr, edges, (num_src, num_dst))
    assert rel_error(actual, expected) <= 1e-5
