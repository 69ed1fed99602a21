"""Once per graph: how far the fused op is from the PyG reference. Reported, never asserted (the tests assert).

In bf16, fused vs pyg compares two roundings of the same math, so both are also compared with the PyG path
run in fp32 on the same values: that says which of the two is closer to the exact result.
"""

from __future__ import annotations

import torch
from torch import Tensor

from benchmarks.graphs.measure import clear_grads, guarded, relative_error
from benchmarks.graphs.variants import BenchInputs, build_variant, cast_inputs

RESULT_NAMES = ("out", "dq", "dk", "dv", "de", "dwq", "dwk")


def outputs_and_grads(variant_name: str, inputs: BenchInputs) -> dict[str, Tensor]:
    variant = build_variant(variant_name, inputs)
    clear_grads(variant.leaves)
    out = variant.forward()
    out.backward(inputs.grad_out)
    result = {"out": out.detach()}
    result.update(zip(RESULT_NAMES[1:], (leaf.grad for leaf in variant.leaves), strict=True))
    clear_grads(variant.leaves)
    return result


def compare(actual: dict[str, Tensor] | str, expected: dict[str, Tensor] | str) -> dict[str, float] | str:
    """Relative error per result, or why there is none (a side that ran out of memory or failed)."""
    for side in (actual, expected):
        if isinstance(side, str):
            return side
    return _result_or_status(lambda: {name: relative_error(actual[name], expected[name]) for name in RESULT_NAMES})


def check_accuracy(inputs: BenchInputs, layer_norm: bool = True) -> dict[str, dict[str, float] | str]:
    """{comparison: {result: ‖a − b‖ / ‖b‖} or a status such as "OOM"} for out and all six gradients, for the
    fused RMSNorm and (``layer_norm``) the fused LayerNorm.

    The fp32 reference holds fp32 copies of every input and PyG's per-edge fp32 intermediates; on the largest
    graphs it may not fit next to the other results and is then reported as OOM.
    """
    fused = _result_or_status(lambda: outputs_and_grads("fused", inputs))
    pyg = _result_or_status(lambda: outputs_and_grads("pyg", inputs))
    report = {"fused vs pyg": compare(fused, pyg)}
    if inputs.query.dtype != torch.float32:
        reference = _result_or_status(lambda: outputs_and_grads("pyg", cast_inputs(inputs, torch.float32)))
        report["fused vs pyg fp32"] = compare(fused, reference)
        report["pyg vs pyg fp32"] = compare(pyg, reference)
    if layer_norm:
        fused_layer = _result_or_status(lambda: outputs_and_grads("fused_layer", inputs))
        pyg_layer = _result_or_status(lambda: outputs_and_grads("pyg_layer", inputs))
        report["fused_layer vs pyg_layer"] = compare(fused_layer, pyg_layer)
        if inputs.query.dtype != torch.float32:
            reference = _result_or_status(lambda: outputs_and_grads("pyg_layer", cast_inputs(inputs, torch.float32)))
            report["fused_layer vs pyg_layer fp32"] = compare(fused_layer, reference)
            report["pyg_layer vs pyg_layer fp32"] = compare(pyg_layer, reference)
    return report


def _result_or_status(fn):
    result, status = guarded(fn)
    return status if result is None else result
