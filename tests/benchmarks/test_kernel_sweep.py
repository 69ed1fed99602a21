"""The kernel sweep's bookkeeping (benchmarks/kernels/kernel_sweep.py), on the CPU: every kernel it reports is found
through the Launchers that launch it (a kernel moved between modules once left the sweep failing before any
measurement), launch-setting specs change the plan's fields they name, and norms and edge terms are axes of one run."""

from __future__ import annotations

from benchmarks.kernels import kernel_sweep
from gtnorm.triton import config as launch_config


def test_every_swept_kernel_has_a_launcher():
    kernels = kernel_sweep.swept_kernels()
    assert set(kernels) == set(kernel_sweep.KERNELS)
    assert all(kernel.fn.__name__ == name for name, kernel in kernels.items())


def test_setting_specs_change_the_named_fields():
    plan = launch_config.attention_launch_config(16, 64)
    changed = kernel_sweep.parse_setting("dst:h4,w2,s2/src:r128")(plan, 16)
    assert (changed.by_destination.block_h, changed.by_destination.head_groups) == (4, 4)
    assert (changed.by_destination.num_warps, changed.by_destination.num_stages) == (2, 2)
    assert changed.by_source.max_registers == 128
    assert changed.forward == plan.forward
    assert kernel_sweep.parse_setting("default")(plan, 16) == plan


def test_norms_and_edge_terms_are_a_matrix_of_one_process():
    args = kernel_sweep.parse_args(["--norms", "rms", "layer", "none", "--edges", "rows", "proj"])
    assert [kernel_sweep.NORMS[norm] for norm in args.norms] == [True, "layer", False]
    assert (args.edges, args.edge_features) == (["rows", "proj"], 11)
    defaults = kernel_sweep.parse_args([])
    assert (defaults.norms, defaults.edges) == (["rms"], ["rows"])
