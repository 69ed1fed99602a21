"""benchmarks.model.idle's reading of a Chrome trace on the CPU: the GPU's gaps, whether the host was late, and the
host ops named at the launch after each gap (the profiling itself needs CUDA)."""

from dataclasses import replace

import pytest

from benchmarks.model.idle import (
    call_starts,
    enclosing_label,
    format_summary,
    gaps_in_windows,
    host_waits,
    idle_of_case,
    model_waits,
    summarize,
    summarize_waits,
)


def _kernel(ts, dur, correlation):
    return {"ph": "X", "cat": "kernel", "name": f"k{correlation}", "ts": ts, "dur": dur,
            "args": {"correlation": correlation}}  # fmt: skip


def _launch(ts, correlation, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2.0, "tid": tid,
            "args": {"correlation": correlation}}  # fmt: skip


def _op(ts, dur, name, tid=1, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}


def _trace():
    """Kernels 10-20, 21-40 (a 1 us gap), 100-110 (launched at 90, late: the host was in aten::index on the
    processor), 200-210 (launched at 50, early: the kernel waited) and 205-230 on another stream (overlapping)."""
    return [
        _op(0, 300, "processor", cat="user_annotation"),
        _op(85, 10, "aten::index"),
        _op(86, 5, "aten::nonzero"),
        _op(150, 100, "autograd::engine::evaluate_function: CheckpointFunctionBackward", tid=2),
        _op(40, 20, "aten::mm", tid=2),
        _launch(5, 1), _kernel(10, 10, 1),
        _launch(15, 2), _kernel(21, 19, 2),
        _launch(90, 3), _kernel(100, 10, 3),
        _launch(50, 4, tid=2), _kernel(200, 10, 4),
        _launch(160, 5, tid=2), _kernel(205, 25, 5),
    ]  # fmt: skip


def test_gaps_are_found_and_the_busy_time_merges_streams():
    busy, gaps = gaps_in_windows(_trace(), [(0.0, 240.0)], min_gap_us=5.0)
    assert busy == pytest.approx(10 + 19 + 10 + 30)
    assert [(gap.start_us, gap.length_us) for gap in gaps] == [(0.0, 10.0), (40.0, 60.0), (110.0, 90.0)]


def test_a_late_launch_is_the_host_s_and_named_by_its_ops():
    _, gaps = gaps_in_windows(_trace(), [(0.0, 240.0)], min_gap_us=5.0)
    late = gaps[1]
    assert late.host_late
    assert late.label == "processor > aten::nonzero"
    assert late.opened_in == "processor"  # the host was in the processor's forward, between ops, when the GPU ran dry
    early = gaps[2]  # launched at 50, inside aten::mm on the engine's thread, before the GPU ran dry at 110
    assert not early.host_late
    assert early.label == "aten::mm"
    assert early.opened_in == "(no op)"


def test_the_window_limits_the_kernels():
    busy, gaps = gaps_in_windows(_trace(), [(0.0, 60.0)], min_gap_us=5.0)
    assert busy == pytest.approx(29.0)
    assert len(gaps) == 1


def test_labels_name_the_module_node_and_innermost_op():
    stack = ["step", "autograd::engine::evaluate_function: MmBackward0", "aten::mm"]
    assert enclosing_label(stack) == "MmBackward0 > aten::mm"
    assert enclosing_label(["decoder", "aten::cat"]) == "decoder > aten::cat"
    assert enclosing_label(["decoder"]) == "decoder"
    assert enclosing_label([]) == "(no op)"


def test_summary_is_per_step_and_ranks_labels():
    busy, gaps = gaps_in_windows(_trace(), [(0.0, 240.0)], min_gap_us=5.0)
    summary = summarize(240.0, busy, gaps, steps=1)
    assert summary["idle_ms"] == pytest.approx((240 - 69) / 1e3)
    assert summary["host_late_ms"] == pytest.approx(0.070)  # the step's first launch (at 5) and the late one
    assert summary["by_label"][0]["label"] == "(no op) -> aten::mm"
    assert summary["by_label"][1]["label"] == "processor -> processor > aten::nonzero"
    assert summarize(480.0, 2 * busy, gaps + gaps, steps=2)["gaps"] == 3


def test_without_the_host_s_events_gaps_are_named_by_the_kernel_after_them():
    """The GPU-only pass: no launches or host ops recorded."""
    gpu_only = [event for event in _trace() if event["cat"] == "kernel"]
    busy, gaps = gaps_in_windows(gpu_only, [(10.0, float("inf"))], min_gap_us=5.0)
    assert busy == pytest.approx(69.0)
    assert [gap.next_kernel for gap in gaps] == ["k3", "k4"]
    assert not any(gap.host_late for gap in gaps)
    summary = summarize(300.0, busy, gaps, steps=1, key=lambda gap: gap.next_kernel)
    assert [row["label"] for row in summary["by_label"]] == ["k4", "k3"]
    text = format_summary("gtnorm/blocks", summary, 5.0, traced=False)
    assert "late for" not in text and "kernel after the gap" in text
    traced = summarize(240.0, *gaps_in_windows(_trace(), [(0.0, 240.0)], min_gap_us=5.0), steps=1)
    assert "late for 0.1" in format_summary("gtnorm/blocks", traced, 5.0)


def _marker(ts):
    return {
        "ph": "X",
        "cat": "kernel",
        "name": "at::cuda::(anonymous namespace)::spin_kernel(long)",
        "ts": ts,
        "dur": 1.0,
        "args": {"correlation": 99},
    }


def test_gaps_are_placed_in_their_call():
    """The traced pass counts from each window's start; the GPU-only pass from the marker kernel launched first in
    each call, which is neither busy time nor the end of a gap."""
    _, gaps = gaps_in_windows(_trace(), [(0.0, 240.0)], min_gap_us=5.0)
    assert [gap.at_us for gap in gaps] == [0.0, 40.0, 110.0]
    gpu_only = [_marker(3.0)] + [event for event in _trace() if event["cat"] == "kernel"] + [_marker(235.0)]
    busy, gaps = gaps_in_windows(gpu_only, [(3.0, float("inf"))], 5.0, call_starts(gpu_only))
    assert call_starts(gpu_only) == [3.0, 235.0]
    assert busy == pytest.approx(69.0)  # the markers' microseconds not counted
    assert [(gap.start_us, gap.next_kernel, gap.at_us) for gap in gaps] == [
        (3.0, "k1", 0.0), (40.0, "k3", 37.0), (110.0, "k4", 107.0)
    ]  # fmt: skip
    _, before_any_call = gaps_in_windows(gpu_only, [(0.0, float("inf"))], 5.0, [50.0])
    assert before_any_call[0].at_us is None


def test_the_summary_says_where_each_label_s_gaps_fall():
    busy, gaps = gaps_in_windows(_trace(), [(0.0, 240.0)], min_gap_us=5.0)
    two_calls = gaps + [replace(gap, start_us=gap.start_us + 240.0) for gap in gaps]  # the same places again
    summary = summarize(480.0, 2 * busy, two_calls, steps=2)
    rows = {row["label"]: row["at_ms"] for row in summary["by_label"]}
    assert rows["processor -> processor > aten::nonzero"] == [0]  # 40 us: ms 0, once for both calls
    text = format_summary("gtnorm/blocks", summary, 5.0)
    assert "at ms" in text and "call wall" in text


def _runtime(ts, dur, name, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "tid": tid, "args": {}}


def _waiting_trace():
    """In the decoder's aten::index (host thread 1) a 300 us stream sync (a blocking copy), then a 150 us launch
    (the queue full) in the processor, a 20 us copy (no wait), and the probe's own 400 us device sync at the end."""
    return [
        _op(0, 1000, "idle_probe_step", cat="user_annotation"),
        _op(100, 200, "processor", cat="user_annotation"),
        _op(400, 400, "decoder", cat="user_annotation"),
        _op(450, 320, "aten::index"),
        _runtime(150, 150, "cudaLaunchKernel"),
        _runtime(460, 300, "cudaStreamSynchronize"),
        _runtime(780, 20, "cudaMemcpyAsync"),
        _runtime(850, 400, "cudaDeviceSynchronize"),
    ]  # fmt: skip


def test_host_waits_are_long_runtime_calls_named_by_the_host_s_ops():
    waits = host_waits(_waiting_trace(), [(0.0, 1000.0)], min_wait_us=100.0)
    assert [(w.call, w.length_us, w.label, w.at_us) for w in waits] == [
        ("cudaDeviceSynchronize", 400.0, "idle_probe_step", 850.0),
        ("cudaStreamSynchronize", 300.0, "decoder > aten::index", 460.0),
        ("cudaLaunchKernel", 150.0, "processor", 150.0),
    ]
    assert host_waits(_waiting_trace(), [(0.0, 400.0)], min_wait_us=100.0)[0].call == "cudaLaunchKernel"
    rows = model_waits(_waiting_trace(), [(0.0, 1000.0)], 100.0, steps=2)  # the probe's own sync left out
    assert [(row["wait"], row["ms"], row["at_ms"]) for row in rows] == [
        ("cudaStreamSynchronize in decoder > aten::index", 0.15, [0]),
        ("cudaLaunchKernel in processor", 0.075, [0]),
    ]


def test_the_summary_lists_the_host_s_waits():
    busy, gaps = gaps_in_windows(_trace(), [(0.0, 240.0)], min_gap_us=5.0)
    summary = summarize(240.0, busy, gaps, steps=1)
    assert "host waits" not in format_summary("gtnorm/blocks", summary, 5.0)
    waits = host_waits(_waiting_trace(), [(0.0, 1000.0)], min_wait_us=100.0)
    summary |= {"host_waits": summarize_waits(waits, steps=1), "min_wait_us": 100.0}
    text = format_summary("gtnorm/blocks", summary, 5.0)
    assert "host waits (runtime calls of >= 100 us" in text
    assert "cudaStreamSynchronize in decoder > aten::index" in text


def test_an_unknown_call_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="call must be one of"):
        idle_of_case(object(), steps=1, min_gap_us=20.0, call="eval")
