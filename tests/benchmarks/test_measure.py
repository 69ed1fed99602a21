"""The timing harness's call budget (benchmarks/graphs/measure.py): at least ``min_calls`` timed calls per
measurement, whatever ``rep_ms`` allows. do_bench and the CUDA syncs are stood in for, so it runs on the CPU."""

import time

import pytest
import torch
import triton.testing

from benchmarks.graphs import measure


@pytest.fixture
def recorded_budgets(monkeypatch):
    budgets = []

    def fake_do_bench(fn, warmup, rep, grad_to_none, return_mode):
        budgets.append(rep)
        fn()
        return 1.0

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    return budgets


def slow_call():
    time.sleep(0.02)  # a 20 ms step


def test_budget_raised_to_min_calls(recorded_budgets):
    settings = measure.TimingSettings(rep_ms=50.0, min_calls=8)
    measure._gpu_median_ms(slow_call, settings, [])
    # Two 20 ms calls estimate the budget: 8 calls need about 160 ms, not do_bench's 50 ms (2 calls).
    assert recorded_budgets[0] >= 8 * 20.0


def test_budget_kept_where_it_buys_enough_calls(recorded_budgets):
    settings = measure.TimingSettings(rep_ms=5000.0, min_calls=8)
    measure._gpu_median_ms(slow_call, settings, [])
    assert recorded_budgets == [5000.0]


def test_gradients_cleared_before_each_estimating_call(recorded_budgets):
    leaf = torch.zeros(3, requires_grad=True)
    seen = []

    def step():
        seen.append(leaf.grad)
        (leaf * 2).sum().backward()

    measure._gpu_median_ms(step, measure.TimingSettings(rep_ms=1.0, min_calls=4), [leaf])
    assert seen[:2] == [None, None]  # the two estimating calls; do_bench clears its own


def test_cpu_calls_take_turns_after_an_untimed_round(monkeypatch):
    order, clock = [], iter(range(1000))
    monkeypatch.setattr(measure.time, "perf_counter", lambda: next(clock))
    calls = {"fwd": lambda: order.append("fwd"), "fwd_bwd": lambda: order.append("fwd_bwd")}
    medians = measure.interleaved_cpu_medians_ms(calls, rounds=3)
    assert order == ["fwd", "fwd_bwd"] * 4  # the first round untimed, then three timed in turn
    assert medians == {"fwd": 1e3, "fwd_bwd": 1e3}  # each call spans one tick of the stand-in clock


def test_cpu_medians_clear_gradients_before_every_call():
    leaf = torch.zeros(3, requires_grad=True)
    seen = []

    def step():
        seen.append(leaf.grad)
        (leaf * 2).sum().backward()

    measure.interleaved_cpu_medians_ms({"fwd_bwd": step}, rounds=2, leaves=[leaf])
    assert seen == [None, None, None] and leaf.grad is None
