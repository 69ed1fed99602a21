"""What is alive at a step's peak, from the allocator's history recorded without stacks.

benchmarks.model.memory names its blocks by their Python stacks, which fail inside a compiled block's backward
(torch 2.11); recorded without stacks, the history still holds every allocation and free with its size, so a
replay finds the peak and the blocks alive there. They are named by the phase boundary (benchmarks.model.phases)
after which each was allocated and by their order in it; the compiled code's buffer list (TORCH_LOGS=output_code)
names them further by size and order. A boundary is found in the history by a marker: a small tensor allocated
and freed at once, whose address and size the history shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIB = 2**20
_MARKER_BYTES = 512  # the allocator's smallest block: a marker of k blocks is k * 512 bytes


@dataclass(frozen=True)
class Marker:
    label: str
    addr: int
    size: int  # bytes


@dataclass(frozen=True)
class AliveBlock:
    size: int  # bytes
    phase: str  # the last boundary before its allocation
    order: int  # its allocation's number after that boundary (1: the first)


@dataclass(frozen=True)
class PeakReport:
    peak_bytes: int  # allocated at the peak, with what was allocated before recording started
    phase: str  # the boundary before the peak
    alive: list[AliveBlock]  # blocks allocated since recording started and alive at the peak, largest first
    events: list[tuple[str, int, int, int]]  # (action, bytes, order, allocated after it): the phase's large events


class AllocatorTrace:
    """Records the allocator's history (no stacks) between start() and stop(); mark() puts a boundary in it."""

    def __init__(self, max_entries: int = 4_000_000):
        self.max_entries = max_entries
        self.markers: list[Marker] = []
        self.base_bytes = 0
        self.events: list[dict] = []

    def start(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history("all", context=None, stacks="python", max_entries=self.max_entries)
        self.base_bytes = torch.cuda.memory_allocated()
        self.markers = []

    def mark(self, label: str) -> None:
        size = _MARKER_BYTES * (1 + len(self.markers) % 61)  # sizes vary, so that a real block rarely matches
        marker = torch.empty(size, dtype=torch.uint8, device="cuda")
        self.markers.append(Marker(label, marker.data_ptr(), size))
        del marker

    def stop(self) -> None:
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        device = torch.cuda.current_device()
        self.events = [{"action": e["action"], "addr": e["addr"], "size": e["size"]}
                       for e in snapshot["device_traces"][device]]  # fmt: skip
        if len(self.events) >= self.max_entries:
            raise RuntimeError(f"the history kept its last {self.max_entries} events only: raise max_entries")

    def peak(self, min_bytes: int = 256 * MIB) -> PeakReport:
        return peak_report(self.events, self.markers, self.base_bytes, min_bytes)


def peak_report(events: list[dict], markers: list[Marker], base_bytes: int, min_bytes: int) -> PeakReport:
    """Replays ``events`` (the history's allocs and frees; as benchmarks.model.memory, a block counts as freed at
    free_completed where the history has those, else at free_requested) from ``base_bytes``: the largest allocated
    total, the blocks of at least ``min_bytes`` alive there, and the large allocations and frees of the phase the
    peak is in, in order, up to the peak."""
    freed = "free_completed" if any(e["action"] == "free_completed" for e in events) else "free_requested"
    phase_at = _phases(events, markers)
    allocated, peak, peak_index = base_bytes, base_bytes, -1
    for index, event in enumerate(events):
        if event["action"] == "alloc":
            allocated += event["size"]
        elif event["action"] == freed:
            allocated -= event["size"]
        if allocated > peak:
            peak, peak_index = allocated, index
    alive: dict[int, AliveBlock] = {}  # by address
    order_of: dict[int, int] = {}  # an alive block's allocation number in its phase
    phase_events: list[tuple[str, int, int, int]] = []
    allocated, order, phase = base_bytes, 0, "before the first boundary"
    for index, event in enumerate(events[: peak_index + 1]):
        if phase_at[index] != phase:
            phase, order, phase_events = phase_at[index], -1, []  # the marker's own allocation is number 0
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            order += 1
            allocated += size
            alive[addr], order_of[addr] = AliveBlock(size, phase, order), order
            if size >= min_bytes:
                phase_events.append(("alloc", size, order, allocated))
        elif action == freed:
            allocated -= size
            block = alive.pop(addr, None)
            if size >= min_bytes:
                phase_events.append(("free", size, block.order if block and block.phase == phase else 0, allocated))
    large = sorted((b for b in alive.values() if b.size >= min_bytes), key=lambda b: b.size, reverse=True)
    return PeakReport(peak, phase_at[peak_index] if peak_index >= 0 else "none", large, phase_events)


def _phases(events: list[dict], markers: list[Marker]) -> list[str]:
    """Each event's phase: the label of the last marker allocated before it (markers found in order)."""
    phases, phase, next_marker = [], "before the first boundary", 0
    for event in events:
        if next_marker < len(markers):
            marker = markers[next_marker]
            if event["action"] == "alloc" and event["addr"] == marker.addr and event["size"] == marker.size:
                phase, next_marker = marker.label, next_marker + 1
        phases.append(phase)
    return phases


def format_report(report: PeakReport) -> str:
    gib = 2**30
    lines = [f"allocator history: peak {report.peak_bytes / gib:.2f} GiB in phase '{report.phase}'",
             "alive at the peak (GiB, allocated in phase #n):"]  # fmt: skip
    lines += [f"  {b.size / gib:7.2f}  {b.phase} #{b.order}" for b in report.alive]
    lines.append("the peak phase's large events up to the peak (GiB, #n, allocated after):")
    lines += [f"  {action:5s} {size / gib:7.2f}  #{order:<6d} {total / gib:7.2f}"
              for action, size, order, total in report.events]  # fmt: skip
    return "\n".join(lines)
