"""benchmarks.model.trace: the replay of an allocator history (synthetic, so it runs on the CPU)."""

from __future__ import annotations

from benchmarks.model.trace import AliveBlock, Marker, format_report, peak_report


def _alloc(addr, size):
    return {"action": "alloc", "addr": addr, "size": size}


def _free(addr, size, action="free_requested"):
    return {"action": action, "addr": addr, "size": size}


def test_the_peak_its_phase_and_what_is_alive_there_by_phase_and_order():
    markers = [Marker("a", 1, 512), Marker("b", 1, 1024)]
    events = [
        _alloc(1, 512), _free(1, 512),  # marker a
        _alloc(100, 4000), _alloc(200, 3000), _free(100, 4000),
        _alloc(1, 1024), _free(1, 1024),  # marker b
        _alloc(300, 5000), _alloc(1, 512), _alloc(400, 6000),  # the peak: base + 3000 + 5000 + 512 + 6000
        _free(300, 5000), _free(400, 6000),
    ]  # fmt: skip
    report = peak_report(events, markers, base_bytes=10_000, min_bytes=2000)
    assert report.peak_bytes == 10_000 + 3000 + 5000 + 512 + 6000
    assert report.phase == "b"
    assert report.alive == [AliveBlock(6000, "b", 3), AliveBlock(5000, "b", 1), AliveBlock(3000, "a", 2)]
    assert report.events == [("alloc", 5000, 1, 18_000), ("alloc", 6000, 3, 24_512)]
    assert "phase 'b'" in format_report(report)


def test_frees_count_when_completed_where_the_history_has_completions():
    events = [_alloc(100, 4000), _free(100, 4000), _alloc(200, 3000), _free(100, 4000, "free_completed")]
    report = peak_report(events, [], base_bytes=0, min_bytes=1)
    assert report.peak_bytes == 7000  # freed at completion, after the second allocation
    assert report.alive == [AliveBlock(4000, "before the first boundary", 1),
                            AliveBlock(3000, "before the first boundary", 2)]  # fmt: skip
