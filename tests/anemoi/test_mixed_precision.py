"""GPU: gtnorm's drop-ins against Anemoi's own Triton and PyG backends under fp16 and bf16 autocast, on the
benchmark's level-5 graphs (benchmarks/graphs/catalog.py), each side's error measured against an fp32 run of
Anemoi's PyG backend: output, input gradients and every parameter's gradient.

The bound, per tensor: gtnorm's error at most SLACK times the larger of the errors of Anemoi's two backends run
under the same autocast, plus the error of rounding the fp32 reference itself once to the autocast dtype (what
any result stored in that dtype carries; measured per tensor, not a fixed unit). gtnorm's kernels run with
counted launches (tests/launches.py).
"""

from __future__ import annotations

import pytest
import torch

from tests.anemoi.setups import ANEMOI_CLASSES, Case, build_pair, make_inputs, rel_error, training_step
from tests.launches import attention_ran, count_launches
from tests.requirements import SCIPY, require_module

SLACK = 1.25
GRAPHS = {"processor": "h_to_h_small", "encoder": "era_to_h_small", "decoder": "h_to_era_small"}


def benchmark_graph(kind: str):
    catalog = require_module("benchmarks.graphs.catalog", SCIPY)
    graph = catalog.load_graph(GRAPHS[kind])
    return graph.edge_index, graph.num_src, graph.num_dst


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("norm", ["off", "layer", "rms"])
@pytest.mark.parametrize("kind", ["processor", "encoder", "decoder"])
def test_autocast_error_within_anemoi_s(kind, norm, dtype):
    device = torch.device("cuda")
    case = Case(kind, norm=norm, batch=1, channels=256, heads=4)
    inputs = make_inputs(case, device, graph=benchmark_graph(kind))
    reference, gtnorm_module = build_pair(case, "triton", device)  # reference: Anemoi's PyG backend
    anemoi_triton = ANEMOI_CLASSES[kind](**case.arguments("triton")).to(device)
    anemoi_triton.load_state_dict(reference.state_dict())
    expected = training_step(reference, case, inputs)
    anemoi_step = training_step(anemoi_triton, case, inputs, autocast_dtype=dtype)
    pyg_step = training_step(reference, case, inputs, autocast_dtype=dtype)
    with count_launches() as launches:
        gtnorm_step = training_step(gtnorm_module, case, inputs, autocast_dtype=dtype)
    assert attention_ran(launches) is None, attention_ran(launches)

    named = {"output": (gtnorm_step.output, anemoi_step.output, pyg_step.output, expected.output)}
    for i, e in enumerate(expected.input_grads):
        named[f"input {i} grad"] = (gtnorm_step.input_grads[i], anemoi_step.input_grads[i], pyg_step.input_grads[i], e)
    for name, e in expected.param_grads.items():
        if e is not None and e.norm() > 0:
            named[name] = (gtnorm_step.param_grads[name], anemoi_step.param_grads[name], pyg_step.param_grads[name], e)
    worst = []
    for name, (g, a, p, e) in named.items():
        bound = SLACK * max(rel_error(a, e), rel_error(p, e)) + rel_error(e.to(dtype), e)
        worst.append((rel_error(g, e) / bound, name, rel_error(g, e), rel_error(a, e), rel_error(p, e), bound))
    worst.sort(reverse=True)
    print(f"{kind} {norm} {dtype}: closest call {worst[0][1:]}")
    for _, name, err_gtnorm, err_triton, err_pyg, bound in worst:
        others = f"Anemoi's triton {err_triton:.2e}, pyg {err_pyg:.2e}"
        assert err_gtnorm <= bound, f"{name}: {err_gtnorm:.2e} > {bound:.2e} ({others})"
