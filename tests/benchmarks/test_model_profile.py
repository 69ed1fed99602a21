"""benchmarks.model.profile's bookkeeping on the CPU: kernels sorted into kinds, and the step, inference and their
difference per kind as printed (the profiling itself needs CUDA)."""

import json

import pytest

from benchmarks.model.profile import format_profile, kind_of, main


@pytest.mark.parametrize(
    "kernel, kind",
    [
        ("_gt_bwd_src_pass", "attention"),
        ("graph_attention_by_destination_kernel", "attention"),
        ("sm90_xmma_gemm_f16f16_f32", "GEMM"),
        ("triton_per_fused_native_layer_norm_0", "norm"),
        ("triton_poi_fused_add_mul_3", "fused element-wise (inductor)"),
        ("void at::native::index_elementwise_kernel", "indexing, sort, copy"),
        ("something_else", "other"),
    ],
)
def test_kernels_are_sorted_into_kinds(kernel, kind):
    assert kind_of(kernel) == kind


def test_format_gives_the_backward_as_step_minus_inference():
    profile = {
        "wall_ms": 30.0,
        "host_ms": 5.0,
        "forward_ms": {"encoder": 4.0, "processor": 3.0, "decoder": 2.0},
        "step_by_kind": {"GEMM": 12.0, "attention": 8.0},
        "inference_by_kind": {"GEMM": 4.0, "attention": 3.0, "other": 0.5},
        "step_kernels": {"sm90_gemm": 12.0, "_gt_bwd_src_pass": 5.0, "_gt_fwd": 3.0},
        "inference_kernels": {"sm90_gemm": 4.0, "_gt_fwd": 3.0},
        "step_ops": [("aten::index_select", "[[5, 208], [], [3]]", 1.5)],
    }
    text = format_profile("anemoi/blocks", profile)
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()[2:5]}
    assert rows["GEMM"] == ["12.0", "4.0", "8.0"]
    assert rows["attention"] == ["8.0", "3.0", "5.0"]
    assert rows["other"] == ["0.0", "0.5", "-0.5"]
    assert "total" in text and "20.0" in text and "7.5" in text and "12.5" in text
    assert "backward+recompute+rest 21.0" in text
    assert text.splitlines()[-1].split() == ["1.50", "aten::index_select", "[[5,", "208],", "[],", "[3]]"]


def test_needs_cuda(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        main(["--graph", "o96_r5"])


def test_compare_prints_saved_profiles_side_by_side(tmp_path, capsys):
    """--compare reads profiles written by --out and needs no GPU: kinds side by side, kernels by their change."""
    anemoi = {
        "step_by_kind": {"GEMM": 10.0, "attention": 4.0},
        "step_kernels": {"sm90_gemm": 10.0, "_gt_bwd_dst_pass": 4.0},
    }
    gtnorm = {
        "step_by_kind": {"GEMM": 9.0, "attention": 6.0},
        "step_kernels": {"sm90_gemm": 9.0, "graph_attention_x": 6.0},
    }
    paths = []
    for name, profile in (("anemoi", anemoi), ("gtnorm", gtnorm)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"meta": {}, **profile}))
    main(["--compare", *map(str, paths)])
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:4]}
    assert rows == {"GEMM": ["10.0", "9.0"], "attention": ["4.0", "6.0"], "total": ["14.0", "15.0"]}
    changes = [line.split()[:2] for line in lines[5:]]
    assert changes == [["+6.00", "attention"], ["-4.00", "attention"], ["-1.00", "GEMM"]]
