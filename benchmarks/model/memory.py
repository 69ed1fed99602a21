"""Where the whole model's training step reaches its peak memory, and what is alive there.

    python -m benchmarks.model.memory --graph o1280_r7 --norm layer --mapper-chunks 4 --variant gtnorm/blocks

One warm step (or, with ``--first-step``, the first: compiling, autotuning and cache filling included) is
recorded by the CUDA caching allocator's history (``torch.cuda.memory._record_memory_history``,
Python stacks), then replayed: the moment allocated memory is highest, and every block alive at that moment
grouped by the line of anemoi-models, gtnorm or torch that allocated it (the innermost frame of those packages;
allocations made by autograd's engine, outside any Python frame, form a group of their own). What was allocated
before the step (the model's parameters, its inputs, caches kept from earlier steps) is one group too. Needs a CUDA
device; the recording slows the step down, so it is not timed.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.graphs.measure import clear_grads
from benchmarks.model.run import Case, add_case_arguments, case_of_arguments

GIB = 2**30
# Frames from these paths name an allocation site; the innermost such frame wins.
# Compiled graphs allocate from inductor's generated modules (torchinductor_<user>/), autotuning from torch/_inductor.
SITE_PACKAGES = (
    "anemoi/models/", "gtnorm/", "torch/nn/", "torch/utils/checkpoint", "torch/_tensor", "torch/_inductor/",
    "torchinductor_",
)  # fmt: skip
BEFORE_STEP = "allocated before the step (parameters, inputs, kept caches)"
NO_FRAME = "autograd's engine (backward, no Python frame)"


def allocation_site(frames: list[dict]) -> str:
    """'path:line function' of the innermost frame from SITE_PACKAGES (frames are innermost first)."""
    for frame in frames:
        filename = frame["filename"].replace("\\", "/")
        for package in SITE_PACKAGES:
            at = filename.find(package)
            if at >= 0:
                return f"{filename[at:]}:{frame['line']} {frame['name']}"
    return NO_FRAME if not frames else f"{frames[0]['filename'].split('/')[-1]}:{frames[0]['line']} {frames[0]['name']}"


def peak_of_trace(events: list[dict], before_bytes: int) -> dict:
    """Replays alloc / free events: the peak's bytes (with what was allocated before), the index of the event that
    reached it, and the bytes alive there per allocation site."""
    freed = "free_completed" if any(e["action"] == "free_completed" for e in events) else "free_requested"
    alive, total, peak, peak_at = {}, before_bytes, before_bytes, -1
    for index, event in enumerate(events):
        if event["action"] == "alloc":
            alive[event["addr"]] = event
            total += event["size"]
            if total > peak:
                peak, peak_at = total, index
        elif event["action"] == freed:
            total -= event["size"]
            alive.pop(event["addr"], None)
    alive, sites = {}, defaultdict(int)
    for event in events[: peak_at + 1]:  # again, up to the peak: who is alive there
        if event["action"] == "alloc":
            alive[event["addr"]] = event
        elif event["action"] == freed:
            alive.pop(event["addr"], None)
    for event in alive.values():
        sites[allocation_site(event.get("frames", []))] += event["size"]
    # Blocks allocated before the step and freed during it would count twice in the replay: the peak includes
    # before_bytes whole, which overstates it by at most what the step frees of them (gradients are cleared first).
    sites[BEFORE_STEP] = before_bytes
    last = events[peak_at] if peak_at >= 0 else None
    return {
        "peak_gib": peak / GIB,
        "reached_by": allocation_site(last.get("frames", [])) if last else BEFORE_STEP,
        "events": len(events),
        "alive_gib_by_site": {site: b / GIB for site, b in sorted(sites.items(), key=lambda item: -item[1])},
    }


def step_peak(case: Case, first_step: bool = False, max_entries: int = 4_000_000) -> dict:
    """One recorded training step of ``case`` (the first, or one after a warm one) and its peak's anatomy
    (peak_of_trace)."""
    clear_grads(case.leaves)
    if not first_step:
        case.train()  # compiles, fills the caches
        clear_grads(case.leaves)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        case.train()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = snapshot["device_traces"][torch.cuda.current_device()]
    result = peak_of_trace(events, before)
    result["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
    clear_grads(case.leaves)
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model.memory", description=__doc__.split("\n\n")[0])
    add_case_arguments(parser)
    parser.add_argument("--first-step", action="store_true", help="record the first step, not a warm one")
    parser.add_argument("--top", type=int, default=15, help="allocation sites printed")
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for the whole result")
    args = parser.parse_args(argv)
    case = case_of_arguments(args, "benchmarks.model.memory")
    result = {
        "graph": args.graph,
        "norm": args.norm,
        "mapper_chunks": args.mapper_chunks,
        "variant": args.variant,
        "first_step": args.first_step,
    }
    result |= {"device": torch.cuda.get_device_name(), "state_gib": case.state_mib / 1024}
    result |= step_peak(case, args.first_step)
    step = "first step" if args.first_step else "warm step"
    print(f"## {args.graph}, QK norm {args.norm}, {args.mapper_chunks} mapper chunks, {args.variant}, {step}: peak "
          f"{result['peak_gib']:.1f} GiB (max_memory_allocated {result['max_memory_allocated_gib']:.1f}), reached "
          f"by {result['reached_by']}; alive there, GiB:")  # fmt: skip
    for site, gib in list(result["alive_gib_by_site"].items())[: args.top]:
        print(f"    {gib:7.2f}  {site}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
