"""tests/launches.py, the counts that prove gtnorm's kernels ran: one attention call forward and backward is one
launch of each edge walk and one call of each op entry; the PyG backend launches none; the patches are undone."""

import torch

import gtnorm
from gtnorm.triton import ops
from gtnorm.triton.launcher import Launcher
from tests.conftest import DEVICE
from tests.launches import (
    BACKWARD_CALLS,
    BY_DESTINATION,
    BY_SOURCE,
    FORWARD,
    FORWARD_CALLS,
    PYG_CALLS,
    PYG_CALLS_WITHOUT_KERNELS,
    attention_ran,
    count_launches,
)


def _inputs():
    edge_index = torch.tensor([[0, 1, 2, 2], [0, 0, 1, 2]], device=DEVICE)
    q, k, v = (torch.randn(3, 2, 4, device=DEVICE, requires_grad=True) for _ in range(3))
    return q, k, v, edge_index


def test_one_call_is_one_launch_of_each_walk():
    q, k, v, edge_index = _inputs()
    layout = gtnorm.GraphLayout.from_edge_index(edge_index, (3, 3))
    with count_launches() as launches:
        out = gtnorm.graph_transformer_attention(q, k, v, None, layout, qk_norm=True)
        out.sum().backward()
    assert (launches[FORWARD], launches[BY_DESTINATION], launches[BY_SOURCE]) == (1, 1, 1), launches
    assert (launches[FORWARD_CALLS], launches[BACKWARD_CALLS], launches[PYG_CALLS]) == (1, 1, 0), launches
    assert attention_ran(launches) is None


def test_pyg_backend_launches_nothing_and_patches_are_undone():
    q, k, v, edge_index = _inputs()
    launch, forward = Launcher.launch, ops.attention_forward
    conv = gtnorm.GraphTransformerConv(4, backend="pyg")
    with count_launches() as launches:
        conv(q, k, v, None, edge_index).sum().backward()
    assert launches[PYG_CALLS] == 1 and launches[FORWARD] == launches[FORWARD_CALLS] == 0, launches
    assert attention_ran(launches) is not None
    assert Launcher.launch is launch and ops.attention_forward is forward


def test_pyg_calls_where_no_kernel_can_run_are_counted_apart(monkeypatch):
    """A CPU tensor on a CUDA machine without the interpreter has no kernel to run: its PyG call is not the Triton
    backend failing (tests/anemoi/test_upstream.py asserts on PYG_CALLS alone)."""
    import gtnorm._runtime

    q, k, v, edge_index = _inputs()
    conv = gtnorm.GraphTransformerConv(4, backend="pyg")
    monkeypatch.setattr(gtnorm._runtime, "triton_can_run_on", lambda device: False)
    with count_launches() as launches:
        conv(q, k, v, None, edge_index)
    assert (launches[PYG_CALLS], launches[PYG_CALLS_WITHOUT_KERNELS]) == (0, 1), launches
