"""Where the whole model's training step goes, one variant per process: per module (forward of the encoder,
processor and decoder; the backward, recomputation included, as the rest of the step) and per kind of GPU work
(GEMMs, attention, norms, fused element-wise, indexing and copies, other) of the step and of inference, and their
difference (what the backward and the recomputation add), with host time beside GPU time.

    python -m benchmarks.model.profile --graph o800_r7 --mapper-chunks 4 --variant anemoi/blocks
    python -m benchmarks.model.profile --graph o800_r7 --mapper-chunks 4 --variant gtnorm/blocks

What recomputation under checkpointing costs is the step of a variant with ``/nockpt`` (the processor not
checkpointed) against the same variant checkpointed: run both. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.graphs.measure import clear_grads
from benchmarks.model.run import Case, add_case_arguments, case_of_arguments, git_commit

# Kernel name fragments -> kind of work; the first match wins, in this order.
KINDS = (
    ("attention", ("graph_attention", "edge_softmax", "edge_features_grad", "edge_weight_grad", "project_rows",
                   "add_expanded_rows", "column_sum", "_gt_fwd", "_gt_bwd")),
    ("GEMM", ("gemm", "sm90", "sm80", "cutlass", "nvjet", "xmma", "wgmma", "splitk")),
    ("norm", ("layer_norm", "layernorm", "rms_norm", "welford")),
    ("fused element-wise (inductor)", ("triton_poi", "triton_red", "triton_per")),
    ("indexing, sort, copy", ("index", "gather", "scatter", "sort", "copy", "cat", "unique", "cumsum", "radix")),
    ("element-wise (eager)", ("elementwise", "vectorized", "reduce")),
)  # fmt: skip
MODULES = ("encoder", "processor", "decoder")


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    for kind, fragments in KINDS:
        if any(fragment in name for fragment in fragments):
            return kind
    return "other"


class ModuleHooks:
    """Hooks around the forward of the model's encoder, processor and decoder (of a ModuleDict of them, the first):
    ``before(name)`` and ``after(name)``, overridden; ``remove()`` takes them off."""

    def __init__(self, model: torch.nn.Module):
        self.handles = []
        for name in MODULES:
            module = getattr(model, name)
            module = module["0"] if isinstance(module, torch.nn.ModuleDict) else module
            self.handles.append(module.register_forward_pre_hook(lambda *_, name=name: self.before(name)))
            self.handles.append(module.register_forward_hook(lambda *_, name=name: self.after(name)))

    def before(self, name: str) -> None:
        pass

    def after(self, name: str) -> None:
        pass

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class ForwardTimer(ModuleHooks):
    """CUDA events around the first forward of each of the model's encoder, processor and decoder in a step
    (a checkpoint's recomputation calls inner functions, not these modules)."""

    def __init__(self, model: torch.nn.Module):
        self.starts: dict[str, torch.cuda.Event] = {}
        self.ends: dict[str, torch.cuda.Event] = {}
        super().__init__(model)

    def before(self, name: str) -> None:
        self._record(self.starts, name)

    def after(self, name: str) -> None:
        self._record(self.ends, name)

    @staticmethod
    def _record(events: dict, name: str) -> None:
        if name not in events:
            events[name] = torch.cuda.Event(enable_timing=True)
            events[name].record()

    def take(self) -> dict[str, float]:
        """ms per module of the step just run (synchronises), and ready for the next step."""
        torch.cuda.synchronize()
        times = {name: self.starts[name].elapsed_time(end) for name, end in self.ends.items()}
        self.starts, self.ends = {}, {}
        return times


def kernel_times(call, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """GPU ms per call of ``call``: by kind of work, and by kernel."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            call()
        torch.cuda.synchronize()
    kinds, kernels = defaultdict(float), defaultdict(float)
    for event in prof.key_averages():
        if event.device_time_total > 0:
            kinds[kind_of(event.key)] += event.device_time_total / steps / 1e3
            kernels[event.key] += event.device_time_total / steps / 1e3
    return dict(kinds), dict(kernels)


def op_times(call, steps: int, top: int = 40) -> list[tuple[str, str, float]]:
    """The torch ops whose own kernels take the most GPU time per call of ``call``, by input shapes: (op, shapes,
    ms). Kernels name no tensor; the op that launched them does (inductor's and gtnorm's launches have no op)."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            call()
        torch.cuda.synchronize()
    ops = [
        (event.key, str(event.input_shapes), event.self_device_time_total / steps / 1e3)
        for event in prof.key_averages(group_by_input_shape=True)
        if event.key.startswith("aten::") and event.self_device_time_total > 0
    ]
    return sorted(ops, key=lambda op: -op[2])[:top]


def warmed_call(case: Case, call: str = "train"):
    """The case's training step (its gradients cleared first) or, with ``call="infer"``, its inference call, after
    two unmeasured calls (compiles and caches built)."""

    def step():
        clear_grads(case.leaves)
        case.train()

    run = step if call == "train" else case.infer
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    return run


def profile_case(case: Case, steps: int) -> dict:
    """Per-call means of: the step's wall and host time (calls returned), its forward per module, GPU time per
    kind of work and per kernel of the step and of inference, and the step's torch ops with the most GPU time."""
    # The step before any inference call: inference compiles blocks anew and can use up torch's recompile limit
    # (Anemoi's blocks at O800, profiled after inference: a 1,898 ms step against the benchmark's 1,711).
    step = warmed_call(case)
    timer = ForwardTimer(case.model)
    forward = defaultdict(float)
    wall = host = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        step()
        host += time.perf_counter() - start
        for name, ms in timer.take().items():  # synchronises
            forward[name] += ms / steps
        wall += time.perf_counter() - start
    timer.remove()
    step_kinds, step_kernels = kernel_times(step, steps)
    step_ops = op_times(step, steps)
    for _ in range(2):
        case.infer()
    infer_kinds, infer_kernels = kernel_times(case.infer, steps)
    return {
        "wall_ms": 1e3 * wall / steps,
        "host_ms": 1e3 * host / steps,
        "forward_ms": dict(forward),
        "step_by_kind": step_kinds,
        "inference_by_kind": infer_kinds,
        "step_kernels": step_kernels,
        "inference_kernels": infer_kernels,
        "step_ops": step_ops,
    }


def format_profile(name: str, p: dict, top: int = 15) -> str:
    """The profile as text: kinds of work for the step, inference and their difference; the step's top kernels."""
    step, infer = sum(p["step_by_kind"].values()), sum(p["inference_by_kind"].values())
    forward = " ".join(f"{k} {v:.1f}" for k, v in p["forward_ms"].items())
    lines = [
        f"{name}: step wall {p['wall_ms']:.1f}, host {p['host_ms']:.1f}, GPU kernels {step:.1f} (inference "
        f"{infer:.1f}); forward: {forward}, backward+recompute+rest {p['wall_ms'] - sum(p['forward_ms'].values()):.1f}",
        f"    {'GPU ms by kind':32s} {'step':>8s} {'inference':>10s} {'step - inference':>17s}",
    ]
    kinds = sorted(p["step_by_kind"], key=lambda kind: -p["step_by_kind"][kind])
    for kind in kinds + sorted(set(p["inference_by_kind"]) - set(kinds)):
        s, i = p["step_by_kind"].get(kind, 0.0), p["inference_by_kind"].get(kind, 0.0)
        lines.append(f"    {kind:32s} {s:8.1f} {i:10.1f} {s - i:17.1f}")
    lines.append(f"    {'total':32s} {step:8.1f} {infer:10.1f} {step - infer:17.1f}")
    lines.append("    step's top kernels (ms, of which inference):")
    for key, ms in sorted(p["step_kernels"].items(), key=lambda item: -item[1])[:top]:
        lines.append(f"      {ms:8.2f} {p['inference_kernels'].get(key, 0.0):8.2f}  {kind_of(key)[:12]:12s} {key[:90]}")
    if p.get("step_ops"):
        lines.append("    step's top torch ops by their kernels' GPU time (ms, input shapes):")
        lines += [f"      {ms:8.2f}  {op} {shapes[:100]}" for op, shapes, ms in p["step_ops"][:top]]
    return "\n".join(lines)


def format_comparison(profiles: dict[str, dict]) -> str:
    """Two or more saved profiles (--out), side by side: the step's GPU ms by kind of work, and by kernel where
    the first and the last differ most."""
    names = list(profiles)
    first, last = profiles[names[0]], profiles[names[-1]]
    header = "".join(f" {name[:18]:>18s}" for name in names)
    lines = [f"    {'step GPU ms by kind':32s}{header}"]
    kinds = sorted(
        {kind for p in profiles.values() for kind in p["step_by_kind"]}, key=lambda k: -first["step_by_kind"].get(k, 0)
    )
    for kind in kinds + ["total"]:
        cells = [
            sum(p["step_by_kind"].values()) if kind == "total" else p["step_by_kind"].get(kind, 0.0)
            for p in profiles.values()
        ]
        lines.append(f"    {kind:32s}" + "".join(f" {ms:18.1f}" for ms in cells))
    kernels = set(first["step_kernels"]) | set(last["step_kernels"])
    change = {key: last["step_kernels"].get(key, 0.0) - first["step_kernels"].get(key, 0.0) for key in kernels}
    lines.append(f"    kernels that differ most, {names[-1]} - {names[0]} (ms):")
    for key in sorted(change, key=lambda key: -abs(change[key]))[:15]:
        lines.append(f"      {change[key]:+8.2f}  {kind_of(key)[:12]:12s} {key[:90]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model.profile", description=__doc__.split("\n\n")[0])
    add_case_arguments(parser)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the profile, every kernel's time, as JSON")
    parser.add_argument("--compare", type=Path, nargs="+", help="print saved profiles (--out) side by side; no GPU")
    args = parser.parse_args(argv)
    if args.compare:
        print(format_comparison({path.stem: json.loads(path.read_text()) for path in args.compare}))
        return
    case = case_of_arguments(args, "benchmarks.model.profile")
    print(f"## {args.graph}, QK norm {args.norm}, {args.dtype}, {args.mapper_chunks} mapper chunks: per call (ms)")
    profile = profile_case(case, args.steps)
    print(format_profile(args.variant, profile), flush=True)
    if args.out is not None:
        meta = {name: getattr(args, name) for name in ("graph", "norm", "dtype", "mapper_chunks", "variant", "steps")}
        meta |= {"device": torch.cuda.get_device_name(), "commit": git_commit()}
        args.out.write_text(json.dumps({"meta": meta, **profile}, indent=1))


if __name__ == "__main__":
    main()
