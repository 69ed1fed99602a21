"""benchmarks/distributed/scale_out.py: its partition is Anemoi's, and its cost model gives back what it was
calibrated on."""

from __future__ import annotations

import pytest
import torch

from tests.requirements import ANEMOI_MODELS, SCIPY, require_module

require_module("anemoi.models", ANEMOI_MODELS)
require_module("scipy", SCIPY)

from anemoi.models.distributed.khop_edges import build_graph_partition  # noqa: E402

from benchmarks.distributed import scale_out  # noqa: E402
from benchmarks.graphs.catalog import GraphSpec, build_edges  # noqa: E402


@pytest.mark.parametrize("kind", scale_out.KINDS)
@pytest.mark.parametrize("gpus", [2, 3, 4])
def test_edge_shares_are_anemoi_s_partition(kind, gpus):
    """Destination rows and edges per GPU as Anemoi's build_graph_partition splits them; for the processor the
    halo is every source outside the GPU's own block, for the mappers the sources are those the edges touch."""
    spec = GraphSpec(kind="processor", level=2) if kind == "processor" else GraphSpec(kind, 2, 8)
    edge_index, num_src, num_dst = build_edges(spec)
    graph = scale_out.Graph(kind, torch.from_numpy(edge_index), num_src, num_dst)
    share = scale_out.EdgePartition(graph, None).worst_share(gpus)
    anemoi = build_graph_partition(graph.edge_index, gpus, (num_src, num_dst))
    assert share.edges == max(anemoi.edge_splits) and share.dst == max(anemoi.dst_splits)
    starts = [0, *torch.tensor(anemoi.edge_splits).cumsum(0).tolist()]
    dst_starts = [0, *torch.tensor(anemoi.dst_splits).cumsum(0).tolist()]
    used = [graph.edge_index[0, starts[r] : starts[r + 1]].unique() for r in range(gpus)]
    if kind == "processor":
        halos = [((u < dst_starts[r]) | (u >= dst_starts[r + 1])).sum().item() for r, u in enumerate(used)]
        assert share.halo == max(halos) and share.src == max(
            h + d for h, d in zip(halos, anemoi.dst_splits, strict=True)
        )
    else:
        assert share.src == max(u.numel() for u in used)


def test_locality_order_is_a_permutation():
    order = scale_out.locality_order(3)
    assert torch.equal(order.sort().values, torch.arange(scale_out.grids.icosahedral_num_nodes(3)))


@pytest.mark.parametrize("kind", scale_out.KINDS)
def test_one_gpu_on_the_measured_graph_gives_the_measurement(kind):
    n_src, n_dst, m = scale_out.R6_SIZES[kind]
    whole = scale_out.Share(n_dst, n_src, m, 0)
    assert scale_out.module_ms(kind, whole) == pytest.approx(scale_out.MEASURED_MS[kind])
    halves = scale_out.Share(n_dst / 2, n_src / 2, m / 2, 0)
    assert scale_out.module_ms(kind, halves) == pytest.approx(scale_out.MEASURED_MS[kind] / 2)
    expected_gib = scale_out.MEASURED_MIB[kind] / 1024 / (2 if kind == "processor" else 1)
    assert scale_out.module_gib(kind, whole) == pytest.approx(expected_gib)
