"""The attention's outputs kept from a checkpointed forward for its recompute (gtnorm/triton/kept_outputs.py): the
step bitwise that of plain checkpointing, the forward kernels launched once per call instead of twice, eager, with a
compiled region inside an eager checkpoint, and where torch.compile traces the checkpoint."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch._dynamo
from torch.utils.checkpoint import checkpoint

import gtnorm
from gtnorm.triton import kept_outputs
from gtnorm.triton.kept_outputs import _KeptOutputs, _Phase, attention_outputs_kept
from tests.conftest import DEVICE, HAS_CUDA
from tests.graphs import make_graph, rel_error
from tests.launches import FORWARD, FORWARD_CALLS, count_launches

HEADS, CHANNELS, EDGE_DIM = 2, 8, 3
COMPILE_BACKEND = "inductor" if HAS_CUDA else "aot_eager"


class TwoLayers(torch.nn.Module):
    """Two attention calls with the fused edge projection and LayerNorm, a residual add after each (the pattern of
    Anemoi's blocks: the add is where inductor reuses the output's buffer)."""

    def __init__(self, graph):
        super().__init__()
        width = HEADS * CHANNELS
        self.layout = gtnorm.GraphLayout.from_edge_index(graph.edge_index.to(DEVICE), (graph.num_src, graph.num_dst))
        self.lin = torch.nn.ModuleList(torch.nn.Linear(width, 3 * width) for _ in range(2))
        self.edge = torch.nn.Linear(EDGE_DIM, width)
        self.q_norm, self.k_norm = torch.nn.LayerNorm(CHANNELS), torch.nn.LayerNorm(CHANNELS)
        self.edge_features = torch.randn(graph.edge_index.shape[1], EDGE_DIM)

    def attention(self, i: int, x: torch.Tensor) -> torch.Tensor:  # x: [N, H * C], N = num_src = num_dst
        q, k, v = self.lin[i](x).unflatten(-1, (3, HEADS, CHANNELS)).unbind(1)
        return gtnorm.graph_transformer_attention(
            q, k, v, None, self.layout, qk_norm="layer",
            q_norm_weight=self.q_norm.weight, q_norm_bias=self.q_norm.bias,
            k_norm_weight=self.k_norm.weight, k_norm_bias=self.k_norm.bias,
            edge_features=self.edge_features.to(x.device), edge_weight=self.edge.weight.t(),
            edge_bias=self.edge.bias,
        )  # fmt: skip

    def layer(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.attention(i, x).flatten(1) + x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(1, self.layer(0, x))


def make_module():
    graph = make_graph("processor_like", seed=0)
    assert graph.num_src == graph.num_dst
    torch.manual_seed(1)
    module = TwoLayers(graph).to(DEVICE)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module, torch.randn(graph.num_dst, HEADS * CHANNELS, device=DEVICE)


def step(module, x, region):
    """Forward through ``region(module, x)`` and backward of a fixed weighting: the output and every gradient."""
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    out = region(module, x)
    (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    return [out.detach(), x.grad, *(p.grad for p in module.parameters())]


def plain(module, x):
    return checkpoint(module, x, use_reentrant=False)


def kept(module, x):
    return checkpoint(module, x, use_reentrant=False, context_fn=attention_outputs_kept())


def assert_bitwise(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert (a is None and e is None) or torch.equal(a, e)


def test_kept_outputs_launch_the_forward_once_and_leave_the_step_bitwise():
    module, x = make_module()
    with count_launches() as plain_launches:
        expected = step(module, x, plain)
    with count_launches() as launches:
        actual = step(module, x, kept)
    assert plain_launches[FORWARD] == 4 and launches[FORWARD] == 2, (plain_launches, launches)
    assert_bitwise(actual, expected)
    assert_bitwise(step(module, x, lambda m, x: m(x)), expected)  # and both are the uncheckpointed step


def test_an_output_changed_in_place_after_the_forward_does_not_reach_the_recompute():
    """The record keeps a copy of the output row: the region's own in-place add on it changes nothing."""

    def in_place(module, x, context_fn):
        def region(x):
            out = module.attention(0, x).flatten(1)
            y = torch.tanh(out) + x
            out.mul_(2)  # the attention's output itself: what the recompute rebuilds and the product saves
            return y * out

        return checkpoint(region, x, use_reentrant=False, context_fn=context_fn)

    module, x = make_module()
    expected = step(module, x, lambda m, x: in_place(m, x, torch.utils.checkpoint.noop_context_fn))
    assert_bitwise(step(module, x, lambda m, x: in_place(m, x, attention_outputs_kept())), expected)


def test_the_record_lives_with_the_graph_and_no_phase_outlives_its_region(monkeypatch):
    """A forward whose backward never runs (a dropped loss) frees what it recorded with its graph; after a region's
    forward and after its recompute no phase is left active."""
    made = []

    def recording_contexts():
        forward_context, recompute_context = eager_contexts()
        made.append(weakref.ref(forward_context.kept))
        return forward_context, recompute_context

    eager_contexts = kept_outputs._eager_contexts
    monkeypatch.setattr(kept_outputs, "_eager_contexts", recording_contexts)
    module, x = make_module()
    out = kept(module, x.requires_grad_())
    assert getattr(kept_outputs._active, "phase", None) is None
    assert len(made) == 1 and len(made[0]().calls) == 2
    del out
    gc.collect()
    assert made[0]() is None
    step(module, x, kept)
    assert getattr(kept_outputs._active, "phase", None) is None


def test_a_recompute_that_asks_for_another_call_runs_it_and_trusts_nothing_kept():
    kept_outputs = _KeptOutputs()
    recorded = [torch.zeros(3, 2, 4), torch.zeros(5, 2, 4)]
    with _Phase(kept_outputs, replaying=False) as phase:
        for out in recorded:
            phase.run(lambda q: (q, q.new_zeros(q.shape[:2]), None), out)
    assert len(kept_outputs.calls) == 2
    other = torch.ones(4, 2, 4)
    with _Phase(kept_outputs, replaying=True) as phase:
        out, _, _ = phase.run(lambda q: (q, q.new_ones(4, 2), None), other)
        assert out is other and not kept_outputs.calls
        fresh = torch.ones(5, 2, 4)
        assert phase.run(lambda q: (q, q, None), fresh)[0] is fresh


@pytest.mark.parametrize("where", ["region compiled inside", "checkpoint compiled"])
def test_compiled(where):
    """A compiled module inside an eager checkpoint (Anemoi's compiled blocks: the op finds the record when it runs;
    bitwise the plain checkpoint around the same compiled module) and a compiled function around the checkpoint (a
    whole compiled model: the selective-checkpoint policy; its backward graph differs from plain checkpointing's,
    so within fp32 rounding of it)."""
    module, x = make_module()
    torch._dynamo.reset()
    if where == "region compiled inside":
        compiled = torch.compile(module, backend=COMPILE_BACKEND)
        region, reference = (lambda m, x: kept(compiled, x)), (lambda m, x: plain(compiled, x))
    else:
        region, reference = torch.compile(kept, backend=COMPILE_BACKEND), torch.compile(plain, backend=COMPILE_BACKEND)
    expected = step(module, x, reference)
    step(module, x, region)  # compiles
    with count_launches() as launches:
        actual = step(module, x, region)
    torch._dynamo.reset()
    assert launches[FORWARD_CALLS] == 2 and launches[FORWARD] == 2, launches
    if where == "region compiled inside":
        assert_bitwise(actual, expected)
        return
    for a, e in zip(actual, expected, strict=True):
        assert (a is None and e is None) or rel_error(a, e) < 1e-5
