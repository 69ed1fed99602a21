"""The whole model anemoi-training builds from its default graph-transformer config (benchmarks/model/config.py),
Anemoi's own against gtnorm's: a training step (forward, MSE, backward; fp16 autocast as ``16-mixed``),
inference (``torch.inference_mode``), each one's peak memory, and the time to the first step (compiling
included), in alternating rounds.

    python -m benchmarks.model --out benchmarks/out/model                  # O96 -> r5 and O320 -> r6, LN and off
    python -m benchmarks.model --graphs o96_r5 --norms off --variants anemoi/blocks gtnorm/blocks
    python -m benchmarks.model --graphs o1280_r7 --norms layer --mapper-chunks 4 16 --isolate   # 9 km

Variants are SIDE/MODE[/OPTION] (benchmarks/model/build.py): sides anemoi, gtnorm (the built model converted by
use_gtnorm_attention), gtnorm_config (the config switch alone); modes default (the default ``compile:`` list,
which compiles nothing), blocks (each side's block classes in the list), whole (torch.compile(model)); option
``nockpt``: the processor without gradient checkpointing (Anemoi's own config flag, either side); ``efull``:
gtnorm's blocks with ``lin_edge`` materialised instead of fused into the kernels.
Needs a CUDA device (Anemoi's Triton backend runs on CUDA only); ``--tiny`` runs a tiny model on the O2 -> level-0
graph, on the CPU too (gtnorm through the Triton interpreter, Anemoi on its PyG fallback; a check that the
benchmark runs, not a measurement). Writes results.json and results.md.

``--mapper-chunks`` is an axis (the encoder's and decoder's ``num_chunks``; the config's is 4). ``--isolate`` runs
each variant in a process of its own, as a training run would: one that crashes (an illegal memory access leaves
the process's CUDA context unusable) or runs out of memory is a row of the table, with its error, and cannot
disturb the others; memory is then each process's own. Rounds then alternate within a variant only. Several
compiled variants are always isolated (except ``--tiny``): both sides' compiled blocks share Anemoi's forward
methods, whose compiled graphs torch.compile caches per method under one recompile limit.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from benchmarks.anemoi.run import run_environment
from benchmarks.graphs.measure import (
    TimingSettings,
    clear_grads,
    free_memory,
    guarded,
    measure_call,
    relative_error,
    retime_call,
)
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
from benchmarks.model.report import KEEP_OPTION, print_summary, write_outputs
from gtnorm.anemoi import block as gtnorm_block
from gtnorm.anemoi import mapper as gtnorm_mapper
from gtnorm.triton import config as gtnorm_triton_config

DEFAULT_VARIANTS = ("anemoi/default", "anemoi/blocks", "gtnorm/default", "gtnorm/blocks", "gtnorm_config/blocks")
NORMS = ("layer", "off")  # the QK norm when on (Anemoi's AutocastLayerNorm) and the default, off
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


# nockpt: the processor not checkpointed; efull: gtnorm's lin_edge materialised; limit64: torch.compile's recompile
# limit raised from torch's default 8 to 64 (not what a default user has; one variant per process: --isolate);
# static: torch.compile keeps every size static (automatic_dynamic_shapes off, the limit raised to 64: one graph per
# chunk size; --isolate too); mlpckpt: gtnorm's mappers run the row-wise work on their destinations in checkpointed
# parts of NODE_CHUNK_ROWS rows (their node_chunk_rows); efused: gtnorm's lin_edge fused into the kernels on every
# graph of 200k edges or more (the decoder's too, which config.edge_projection_pays materialises below 2^30 feature
# elements); ckptall: gtnorm's decoder checkpoints its last chunk too, as Anemoi's loop does (gtnorm keeps it);
# keep<N> (keep1, keep3, ...): gtnorm's processor runs its last N layers outside the checkpoints
# (layers_outside_checkpoint); keepattn: gtnorm's processor keeps its attention outputs for the recompute
# (keep_attention_outputs). Anemoi's processor has neither choice, so Anemoi's side refuses them.
OPTIONS = ("nockpt", "efull", "limit64", "static", "mlpckpt", "efused", "ckptall", "keepattn")
GTNORM_ONLY_OPTIONS = ("keepattn",)
PROCESS_OPTIONS = ("limit64", "static", "efused", "ckptall")  # set for the whole process
NODE_CHUNK_ROWS = 2**17


def apply_process_options(options) -> None:
    """The PROCESS_OPTIONS among ``options``, set for this process (which then runs the variant that names them);
    the others are the variant's own (Case)."""
    options = set(options)
    if options & {"limit64", "static"}:
        torch._dynamo.config.recompile_limit = 64
    if "static" in options:
        torch._dynamo.config.automatic_dynamic_shapes = False
    if "efused" in options:
        gtnorm_triton_config._PROJECTION_MIN_DEGREE = 0.0
    if "ckptall" in options:
        anemoi_loop = gtnorm_mapper.anemoi_mapper.GraphTransformerBaseMapper.mapper_forward_with_edge_sharding
        gtnorm_mapper._chunks_with_the_last_kept = anemoi_loop


@dataclass(frozen=True)
class Variant:
    side: str
    mode: str
    options: tuple[str, ...] = ()  # OPTIONS

    @classmethod
    def parse(cls, name: str) -> Variant:
        side, mode, *options = name.split("/")
        if not all(option in OPTIONS or KEEP_OPTION.fullmatch(option) for option in options):
            raise ValueError(f"unknown variant option in {name!r} (known: {', '.join(OPTIONS)}, keep<N>)")
        if side == "anemoi" and any(KEEP_OPTION.fullmatch(o) or o in GTNORM_ONLY_OPTIONS for o in options):
            raise ValueError(f"{name!r}: keep<N> and {', '.join(GTNORM_ONLY_OPTIONS)} are gtnorm's only")
        return cls(side, mode, tuple(options))

    @property
    def processor_layers_kept(self) -> int:
        """N of a keep<N> option, else 0."""
        kept = [int(m.group(1)) for m in map(KEEP_OPTION.fullmatch, self.options) if m]
        return kept[-1] if kept else 0

    @property
    def name(self) -> str:
        return "/".join((self.side, self.mode, *self.options))


def shares_compiled_code(variants: list[Variant]) -> bool:
    """Whether the variants would share compiled code in one process: gtnorm's blocks run Anemoi's forward methods,
    whose compiled graphs torch.compile caches per method under one recompile limit (8), so the variant compiled
    later falls back to eager where the earlier one used the limit up (O320 on an H200: gtnorm's step 386.6 ms
    after Anemoi's blocks in one process, 343.3 ms in its own)."""
    return sum(variant.mode != "default" for variant in variants) > 1


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
        if variant.processor_layers_kept:
            model.processor.layers_outside_checkpoint = variant.processor_layers_kept
        if "keepattn" in variant.options:
            model.processor.keep_attention_outputs = True
        if "mlpckpt" in variant.options:
            for mapper in model.modules():
                if isinstance(mapper, gtnorm_mapper._NodeChunkRows):
                    mapper.node_chunk_rows = NODE_CHUNK_ROWS
        self.model = model.to(device)
        self.state_mib = state_mib(self.model)
        backend = "inductor" if device.type == "cuda" else "aot_eager"  # inductor on the CPU needs a C++ toolchain
        self.runnable = apply_compile_mode(self.model, variant.side, variant.mode, backend)
        self.compiled = compiled_modules(self.model)
        self.x = make_batch(self.model, data).to(device)
        self.target = make_target(self.model, data).to(device)
        # The batch each call reads, on the device as in training: counted in its peak (at O1280, 7.1 GiB).
        self.inputs_mib = {"train": (self.x.nbytes + self.target.nbytes) / 2**20, "infer": self.x.nbytes / 2**20}
        self.dtype, self.device = dtype, device
        self.leaves = list(self.model.parameters())

    def calls(self) -> tuple:
        """(mode, call, the leaves whose gradients it makes) for the training step and inference."""
        return ("train", self.train, self.leaves), ("infer", self.infer, [])

    def _mode(self, training: bool) -> None:
        # Set only when it changes: module.train() walks every submodule (~1,000 here, ~5 ms of host time a call
        # at O320), which a user's training loop does once per epoch, not per step.
        if self.runnable.training != training:
            self.runnable.train(training)

    def train(self) -> None:
        self._mode(True)
        with torch.autocast(self.device.type, dtype=self.dtype):
            loss = training_loss(self.runnable, self.x, self.target)
        loss.backward()

    def infer(self) -> torch.Tensor:
        self._mode(False)
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=self.dtype):
            return self.runnable({"data": self.x})["data"]


def add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments naming one case on the GPU: what benchmarks.model.memory and .phases take."""
    parser.add_argument("--graph", choices=list(MODEL_GRAPHS), default="o320_r6")
    parser.add_argument("--norm", choices=NORMS, default="layer")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp16")
    parser.add_argument("--mapper-chunks", type=int, default=ModelSpec().mapper_chunks)
    parser.add_argument("--variant", default="gtnorm/blocks")


def case_of_arguments(args: argparse.Namespace, tool: str) -> Case:
    """The case add_case_arguments named, on the GPU (its process options set); ``tool`` names the caller in the
    error raised without CUDA."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{tool} needs a CUDA device")
    spec = replace(ModelSpec(), qk_norm=args.norm == "layer", mapper_chunks=args.mapper_chunks)
    variant = Variant.parse(args.variant)
    apply_process_options(variant.options)
    graph = build_model_graph(args.graph, verbose=True)
    return Case(variant, spec, DataSpec(), graph, DTYPES[args.dtype], torch.device("cuda"))


def first_call_s(fn, device: torch.device) -> float:
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _allocated_mib(device: torch.device) -> float:
    if device.type != "cuda":
        return 0.0
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device) / 2**20


def measure_variants(cases: list[Case], settings: TimingSettings, rounds: int) -> tuple[dict, dict]:
    """Every case's first step, then its timed steps and peak memory, then more rounds of every case in turn
    (each time the median over the rounds: alternating spreads the machine's drift over all cases).
    Returns (the row's variants, each variant's inference output on the CPU)."""
    row, outputs = {}, {}
    for case in cases:
        device = case.device
        entry = {"compiled_modules": len(case.compiled), "state_mib": case.state_mib}
        before = _allocated_mib(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        first, status = guarded(lambda case=case: first_call_s(case.train, case.device))
        entry["first_step_s"] = first
        if device.type == "cuda":  # compiling included: autotuning's copies, a recompiled graph's first run
            entry["first_step_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        if first is None:
            entry |= {"train": {"status": status}, "infer": {"status": status}}
            row[case.variant.name] = entry
            continue
        out, _ = guarded(case.infer)
        if out is not None:
            outputs[case.variant.name] = out.float().cpu()  # on the device it would count in the next variant's peak
        del out
        clear_grads(case.leaves)
        # What the side keeps on the device from one step to the next (gtnorm's layout and partition caches):
        # allocated outside every timed call, so counted in the peak here, by the same rule for both sides.
        entry["persistent_mib"] = _allocated_mib(device) - before
        for mode, fn, leaves in case.calls():
            measured = asdict(measure_call(fn, device, settings, leaves))
            measured["ms_rounds"] = [measured["ms"]] if measured["ms"] is not None else []
            if measured.get("extra_mib") is not None:  # state + what it keeps + the batch + what the call allocates
                measured["inputs_mib"] = case.inputs_mib[mode]
                measured["peak_mib"] = case.state_mib + entry["persistent_mib"] + case.inputs_mib[mode]
                measured["peak_mib"] += measured["extra_mib"]
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
    return row, outputs


def compare_outputs(row: dict, outputs: dict) -> None:
    """Each variant's inference output against the row's first variant's (relative error, in the row)."""
    names = [name for name in row if name in outputs]
    if names:
        reference = outputs[names[0]]
        for name in names:
            row[name]["output_rel_error"] = relative_error(outputs[name], reference)


def run_isolated(args, graph_name: str, norm: str, chunks: int, variant: str, scratch: Path) -> tuple[dict, object]:
    """One variant measured by ``python -m benchmarks.model`` in a child process: (its entry, its inference output
    or None). A child that dies gives an entry whose status says how, from its last lines of output."""
    out = scratch / variant.replace("/", "_")
    command = [
        sys.executable, "-m", "benchmarks.model", "--graphs", graph_name, "--norms", norm, "--variants", variant,
        "--mapper-chunks", str(chunks), "--dtype", args.dtype, "--rounds", str(args.rounds), "--rep-ms",
        str(args.rep_ms), "--min-calls", str(args.min_calls), "--out", str(out), "--save-output", str(out / "out.pt"),
        *(["--layers", str(args.layers)] if args.layers else []), *(["--tiny"] if args.tiny else []),
    ]  # fmt: skip
    tail = collections.deque(maxlen=30)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
        for line in child.stdout:
            print(f"    {variant}: {line}", end="", flush=True)
            tail.append(line.strip())
    results = out / "results.json"
    if child.returncode == 0 and results.is_file():
        entry = json.loads(results.read_text())["rows"][0]["variants"][variant]
        saved = out / "out.pt"
        return entry, torch.load(saved) if saved.is_file() else None
    raised = [line for line in tail if re.match(r"[\w.]+(Error|Exception)\b", line)]  # "torch.X: message"
    why = (raised or list(tail) or ["no output"])[-1][:240]
    status = f"crash (exit code {child.returncode}): {why}"
    return {"first_step_s": None, "train": {"status": status}, "infer": {"status": status}}, None


def git_commit() -> str | None:
    """The code's commit: GTNORM_COMMIT where set (a copy of the checkout on another machine may carry a stale
    .git), else git's, marked where the working tree has changes."""
    if os.environ.get("GTNORM_COMMIT"):
        return os.environ["GTNORM_COMMIT"]
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if found.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return found.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


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
    parser.add_argument("--mapper-chunks", nargs="+", type=int, default=None,
                        help="the mappers' num_chunks, an axis (default: the config's 4)")  # fmt: skip
    parser.add_argument("--isolate", action="store_true", help="each variant in its own process (see above)")
    parser.add_argument("--save-output", type=Path, default=None, help=argparse.SUPPRESS)  # --isolate's children
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
    if shares_compiled_code(variants) and not args.tiny and not args.isolate:
        print("several compiled variants: each runs in its own process (--isolate)", flush=True)
        args.isolate = True
    process_options = {option for v in variants for option in v.options if option in PROCESS_OPTIONS}
    if process_options and len(variants) > 1 and not args.isolate:
        raise SystemExit(f"{'/'.join(sorted(process_options))} set the process's compiler: run with --isolate")
    data = TINY_DATA if args.tiny else DataSpec()
    base = ModelSpec(**TINY_MODEL) if args.tiny else ModelSpec()
    layers = args.layers or base.num_layers
    settings = TimingSettings(warmup_ms=100.0, rep_ms=args.rep_ms, min_calls=args.min_calls)
    meta = {"data": asdict(data), "batch_size": 1, "dtype": args.dtype, "rounds": args.rounds}
    meta["started"] = time.strftime("%Y-%m-%d %H:%M %Z")
    # The allocator's settings decide whether a step near the device's memory fits (expandable segments: v30).
    meta["cuda_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    meta |= {"commit": git_commit(), "isolated": args.isolate}
    results = {"meta": run_environment(device, base) | meta | {"min_calls": args.min_calls}, "rows": []}
    # Every row says which run it came from: rows of several runs can share a results file.
    provenance = {key: results["meta"][key] for key in ("device", "started", "commit")}
    provenance["recompile_limit"] = torch._dynamo.config.recompile_limit  # torch's: limit64 is its variant's own
    if not args.isolate:  # this process runs the variant (alone, or as an --isolate child)
        apply_process_options(process_options)
    start = time.perf_counter()
    for graph_name in args.graphs:
        graph = build_model_graph(graph_name, verbose=True)
        sizes = {"data_nodes": graph["data"].num_nodes, "hidden_nodes": graph["hidden"].num_nodes} | {
            f"{src}_to_{dst}_edges": graph[(src, "to", dst)].edge_index.shape[1] for src, _, dst in graph.edge_types
        }
        for norm in args.norms:
            for chunks in args.mapper_chunks or [base.mapper_chunks]:
                spec = replace(base, qk_norm=norm == "layer", num_layers=layers, mapper_chunks=chunks)
                row = {"graph": graph_name, "norm": norm, "mapper_chunks": chunks, "sizes": sizes, "layers": layers}
                row["run"] = provenance
                if args.isolate:
                    row["variants"], outputs = {}, {}
                    with tempfile.TemporaryDirectory() as scratch:
                        for variant in args.variants:
                            entry, out = run_isolated(args, graph_name, norm, chunks, variant, Path(scratch))
                            row["variants"][variant] = entry
                            if out is not None:
                                outputs[variant] = out.float()
                            # After every variant: a run stopped part way keeps what was measured.
                            write_outputs(results | {"rows": [*results["rows"], row]}, args.out)
                else:
                    # A new training process's compiler state: no earlier row's compilations count towards its
                    # limits (which stay torch's defaults, as anemoi-training leaves them).
                    torch._dynamo.reset()
                    cases = [Case(v, spec, data, graph, DTYPES[args.dtype], device) for v in variants]
                    row["variants"], outputs = measure_variants(cases, settings, args.rounds)
                    del cases
                    free_memory()
                    if args.save_output is not None and outputs:
                        args.save_output.parent.mkdir(parents=True, exist_ok=True)
                        torch.save(next(iter(outputs.values())).half(), args.save_output)
                compare_outputs(row["variants"], outputs)
                del outputs
                results["rows"].append(row)
                print(f"[{time.perf_counter() - start:6.0f} s] {graph_name} {norm} {chunks} chunks done", flush=True)
                results["meta"]["wall_s"] = time.perf_counter() - start
                write_outputs(results, args.out)  # after every row: a later failure keeps what was measured
    print_summary(results)
    return results
