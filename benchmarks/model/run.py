"""The whole model anemoi-training builds from its default graph-transformer config (benchmarks/model/config.py),
Anemoi's own against gtnorm's: a training step (forward, MSE, backward; fp16 autocast as ``16-mixed``),
inference (``torch.inference_mode``), each one's peak memory, and the time to the first step (compiling
included), in alternating rounds.

    python -m benchmarks.model --out benchmarks/out/model                  # O96 -> r5 and O320 -> r6, LN and off
    python -m benchmarks.model --graphs o96_r5 --norms off --variants anemoi/blocks gtnorm/blocks

Variants are SIDE/MODE[/OPTION] (benchmarks/model/build.py): sides anemoi, gtnorm (the built model converted by
use_gtnorm_attention), gtnorm_config (the config switch alone); modes default (the default ``compile:`` list,
which compiles nothing), blocks (each side's block classes in the list), whole (torch.compile(model)); option
``nockpt``: the processor without gradient checkpointing (Anemoi's own config flag, either side); ``efull``:
gtnorm's blocks with ``lin_edge`` materialised instead of fused into the kernels.
Needs a CUDA device (Anemoi's Triton backend runs on CUDA only); ``--tiny`` runs a tiny model on the O2 -> level-0
graph, on the CPU too (gtnorm through the Triton interpreter, Anemoi on its PyG fallback; a check that the
benchmark runs, not a measurement). Writes results.json and results.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from benchmarks.anemoi.run import run_environment
from benchmarks.graphs.measure import TimingSettings, free_memory, guarded, measure_call, relative_error, retime_call
from benchmarks.model.build import (
    apply_compile_mode,
    build_model,
    compiled_modules,
    make_batch,
    make_target,
    training_loss,
)
from benchmarks.model.config import DataSpec, ModelSpec
from benchmarks.model.graph import MODEL_GRAPHS, build_model_graph
from benchmarks.model.report import print_summary, write_outputs
from gtnorm.anemoi import block as gtnorm_block

DEFAULT_VARIANTS = ("anemoi/default", "anemoi/blocks", "gtnorm/default", "gtnorm/blocks", "gtnorm_config/blocks")
NORMS = ("layer", "off")  # the QK norm when on (Anemoi's AutocastLayerNorm) and the default, off
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


OPTIONS = ("nockpt", "efull")


@dataclass(frozen=True)
class Variant:
    side: str
    mode: str
    options: tuple[str, ...] = ()  # nockpt: the processor not checkpointed; efull: gtnorm's lin_edge materialised

    @classmethod
    def parse(cls, name: str) -> Variant:
        side, mode, *options = name.split("/")
        if not set(options) <= set(OPTIONS):
            raise ValueError(f"unknown variant option in {name!r} (known: {', '.join(OPTIONS)})")
        return cls(side, mode, tuple(options))

    @property
    def name(self) -> str:
        return "/".join((self.side, self.mode, *self.options))


def state_mib(model: torch.nn.Module) -> float:
    """Parameters and buffers: what the model itself holds on the device."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


class Case:
    """One variant's model on the device, with its training step and inference."""

    def __init__(self, variant: Variant, spec: ModelSpec, data: DataSpec, graph, dtype, device):
        self.variant = variant
        fuse = gtnorm_block.FUSE_EDGE_PROJECTION
        gtnorm_block.FUSE_EDGE_PROJECTION = fuse and "efull" not in variant.options  # read as blocks are built
        try:
            model = build_model(variant.side, spec, data, graph)
        finally:
            gtnorm_block.FUSE_EDGE_PROJECTION = fuse
        model.processor.gradient_checkpointing = "nockpt" not in variant.options
        self.model = model.to(device)
        self.state_mib = state_mib(self.model)
        backend = "inductor" if device.type == "cuda" else "aot_eager"  # inductor on the CPU needs a C++ toolchain
        self.runnable = apply_compile_mode(self.model, variant.side, variant.mode, backend)
        self.compiled = compiled_modules(self.model)
        self.x = make_batch(self.model, data).to(device)
        self.target = make_target(self.model, data).to(device)
        self.dtype, self.device = dtype, device
        self.leaves = list(self.model.parameters())

    def calls(self) -> tuple:
        """(mode, call, the leaves whose gradients it makes) for the training step and inference."""
        return ("train", self.train, self.leaves), ("infer", self.infer, [])

    def train(self) -> None:
        self.runnable.train()
        with torch.autocast(self.device.type, dtype=self.dtype):
            loss = training_loss(self.runnable, self.x, self.target)
        loss.backward()

    def infer(self) -> torch.Tensor:
        self.runnable.eval()
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=self.dtype):
            return self.runnable({"data": self.x})["data"]


def first_call_s(fn, device: torch.device) -> float:
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def measure_variants(cases: list[Case], settings: TimingSettings, rounds: int) -> dict:
    """Every case's first step, then its timed steps and peak memory, then more rounds of every case in turn
    (each time the median over the rounds: alternating spreads the machine's drift over all cases)."""
    row, outputs = {}, {}
    for case in cases:
        device = case.device
        entry = {"compiled_modules": len(case.compiled), "state_mib": case.state_mib}
        first, status = guarded(lambda case=case: first_call_s(case.train, case.device))
        entry["first_step_s"] = first
        if first is None:
            entry |= {"train": {"status": status}, "infer": {"status": status}}
            row[case.variant.name] = entry
            continue
        out, _ = guarded(case.infer)
        if out is not None:
            outputs[case.variant.name] = out.float()
        for mode, fn, leaves in case.calls():
            measured = asdict(measure_call(fn, device, settings, leaves))
            measured["ms_rounds"] = [measured["ms"]] if measured["ms"] is not None else []
            if measured.get("extra_mib") is not None:  # the model's own state + what its step allocates
                measured["peak_mib"] = case.state_mib + measured["extra_mib"]
            entry[mode] = measured
        row[case.variant.name] = entry
        free_memory()
    for _ in range(rounds - 1):
        for case in cases:
            entry = row[case.variant.name]
            for mode, fn, leaves in case.calls():
                if entry[mode].get("ms_rounds"):
                    ms = retime_call(fn, case.device, settings, leaves)
                    if ms is not None:
                        entry[mode]["ms_rounds"].append(ms)
    for entry in row.values():
        for mode in ("train", "infer"):
            if entry[mode].get("ms_rounds"):
                entry[mode]["ms"] = statistics.median(entry[mode]["ms_rounds"])
    reference = outputs.get(cases[0].variant.name)
    if reference is not None:
        for name, out in outputs.items():
            row[name]["output_rel_error"] = relative_error(out, reference)
    return row


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/model"), help="output directory")
    parser.add_argument("--graphs", nargs="+", choices=list(MODEL_GRAPHS), help="default: o96_r5 o320_r6")
    parser.add_argument("--norms", nargs="+", choices=NORMS, default=list(NORMS))
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp16", help="autocast dtype (16-mixed: fp16)")
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), help="SIDE/MODE[/nockpt]")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every variant in turn; times are medians")
    parser.add_argument("--rep-ms", type=float, default=1000.0, help="do_bench's measuring budget per timing")
    parser.add_argument("--min-calls", type=int, default=4, help="timed calls per round at least")
    parser.add_argument("--layers", type=int, default=None, help="processor layers (default: the config's 16)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model on o2_r0, CPU allowed: runs, not timed")
    args = parser.parse_args(argv)
    args.graphs = args.graphs or (["o2_r0"] if args.tiny else ["o96_r5", "o320_r6"])
    return args


# --tiny: small enough for the Triton interpreter, with chunked processor and mappers as the default config.
TINY_MODEL = dict(num_channels=16, num_heads=2, num_layers=2, processor_chunks=2, mapper_chunks=2)
TINY_DATA = DataSpec(num_variables=12, forcings=("insolation",), diagnostics=("tp",))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        if not args.tiny:
            raise SystemExit("benchmarks.model needs a CUDA device (Anemoi's Triton backend runs on CUDA only); "
                             "--tiny runs on the CPU")  # fmt: skip
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before gtnorm's kernels are first defined
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    variants = [Variant.parse(name) for name in args.variants]
    data = TINY_DATA if args.tiny else DataSpec()
    base = ModelSpec(**TINY_MODEL) if args.tiny else ModelSpec()
    layers = args.layers or base.num_layers
    settings = TimingSettings(warmup_ms=100.0, rep_ms=args.rep_ms, min_calls=args.min_calls)
    meta = {"data": asdict(data), "batch_size": 1, "dtype": args.dtype, "rounds": args.rounds}
    meta["started"] = time.strftime("%Y-%m-%d %H:%M %Z")
    results = {"meta": run_environment(device, base) | meta | {"min_calls": args.min_calls}, "rows": []}
    start = time.perf_counter()
    for graph_name in args.graphs:
        graph = build_model_graph(graph_name, verbose=True)
        sizes = {"data_nodes": graph["data"].num_nodes, "hidden_nodes": graph["hidden"].num_nodes} | {
            f"{src}_to_{dst}_edges": graph[(src, "to", dst)].edge_index.shape[1] for src, _, dst in graph.edge_types
        }
        for norm in args.norms:
            torch._dynamo.reset()  # a new training process: no earlier row's compilations count towards limits
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            spec = replace(base, qk_norm=norm == "layer", num_layers=layers)
            cases = [Case(v, spec, data, graph, DTYPES[args.dtype], device) for v in variants]
            row = {"graph": graph_name, "norm": norm, "sizes": sizes, "layers": layers}
            row["variants"] = measure_variants(cases, settings, args.rounds)
            results["rows"].append(row)
            print(f"[{time.perf_counter() - start:6.0f} s] {graph_name} {norm} done", flush=True)
            del cases
            free_memory()
            results["meta"]["wall_s"] = time.perf_counter() - start
            write_outputs(results, args.out)  # after every row: a later failure keeps what was measured
    print_summary(results)
    return results
