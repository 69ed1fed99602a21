"""Where the whole model's training step goes, Anemoi against gtnorm: per module (forward of the encoder,
processor and decoder; the backward, recomputation included, as the rest of the step) and per kind of GPU work
(GEMMs, attention, norms, fused element-wise, indexing and copies, other), with host time beside GPU time.

    python -m benchmarks.model.profile --graph o320_r6 --norm layer --variants anemoi/blocks gtnorm/blocks

What recomputation under checkpointing costs is the step of a variant with ``/nockpt`` (the processor not
checkpointed) against the same variant checkpointed: run both here. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import replace

import torch

from benchmarks.graphs.measure import clear_grads
from benchmarks.model.config import DataSpec, ModelSpec
from benchmarks.model.graph import MODEL_GRAPHS, build_model_graph
from benchmarks.model.run import DTYPES, Case, Variant

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


class ForwardTimer:
    """CUDA events around the first forward of each of the model's encoder, processor and decoder in a step
    (hooks on the modules; a checkpoint's recomputation calls inner functions, not these modules)."""

    def __init__(self, model: torch.nn.Module):
        self.starts: dict[str, torch.cuda.Event] = {}
        self.ends: dict[str, torch.cuda.Event] = {}
        self.handles = []
        for name in MODULES:
            module = getattr(model, name)
            module = module["0"] if isinstance(module, torch.nn.ModuleDict) else module
            self.handles.append(module.register_forward_pre_hook(lambda *_, name=name: self._record(self.starts, name)))
            self.handles.append(module.register_forward_hook(lambda *_, name=name: self._record(self.ends, name)))

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

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def profile_case(case: Case, steps: int) -> dict:
    """Per-step means of: wall, host (calls returned), forward per module, GPU time per kind of work."""

    def step():
        clear_grads(case.leaves)
        case.train()

    for _ in range(2):
        step()
    torch.cuda.synchronize()
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
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kinds, top = defaultdict(float), defaultdict(float)
    for event in prof.key_averages():
        if event.device_time_total > 0:
            kinds[kind_of(event.key)] += event.device_time_total / steps / 1e3
            top[event.key] += event.device_time_total / steps / 1e3
    return {
        "wall_ms": 1e3 * wall / steps,
        "host_ms": 1e3 * host / steps,
        "forward_ms": dict(forward),
        "gpu_ms_by_kind": dict(kinds),
        "top_kernels": sorted(top.items(), key=lambda item: -item[1])[:12],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", choices=list(MODEL_GRAPHS), default="o320_r6")
    parser.add_argument("--norm", choices=("layer", "off"), default="layer")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp16")
    parser.add_argument("--variants", nargs="+", default=["anemoi/blocks", "gtnorm/blocks"])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.model.profile needs a CUDA device")
    device, data = torch.device("cuda"), DataSpec()
    spec = replace(ModelSpec(), qk_norm=args.norm == "layer")
    graph = build_model_graph(args.graph)
    print(f"## {args.graph}, QK norm {args.norm}, {args.dtype}: per training step (ms)")
    for name in args.variants:
        torch._dynamo.reset()
        case = Case(Variant.parse(name), spec, data, graph, DTYPES[args.dtype], device)
        p = profile_case(case, args.steps)
        gpu = sum(p["gpu_ms_by_kind"].values())
        forward = " ".join(f"{k} {v:.1f}" for k, v in p["forward_ms"].items())
        print(f"{name}: wall {p['wall_ms']:.1f}, host {p['host_ms']:.1f}, GPU kernels {gpu:.1f}; forward: {forward}, "
              f"backward+recompute+rest {p['wall_ms'] - sum(p['forward_ms'].values()):.1f}")  # fmt: skip
        for kind, ms in sorted(p["gpu_ms_by_kind"].items(), key=lambda item: -item[1]):
            print(f"    {kind:32s} {ms:8.1f} ({100 * ms / gpu:4.1f} %)")
        for key, ms in p["top_kernels"]:
            print(f"      {ms:8.2f}  {key[:100]}")
        del case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
