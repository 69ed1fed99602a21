"""Anemoi's graph-transformer processor, encoder and decoder, each built twice from the same arguments and
state_dict: anemoi-models' own Triton backend against gtnorm.anemoi's drop-in. Per row (module x QK norm x
autocast dtype): a training step (forward + backward, Anemoi's default gradient checkpointing), inference
(``torch.inference_mode``), the extra peak memory of each, and the two sides' inference outputs compared.

    python -m benchmarks.anemoi --out benchmarks/out/anemoi           # full set: level-6 and level-5 graphs
    python -m benchmarks.anemoi --quick                               # level 6, no norm and LayerNorm, fp16

What finding layouts by content costs in these blocks: ``python -m benchmarks.anemoi.layout_reuse``.

Needs a CUDA device and anemoi-models (its Triton backend runs on CUDA only). Graphs come from
benchmarks/graphs/catalog.py (built and cached on first use). Writes results.json, results.md and results.png.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path

import torch
from anemoi.models.distributed.shapes import BipartiteGraphShardInfo, GraphShardInfo
from anemoi.models.layers.mapper import GraphTransformerBackwardMapper, GraphTransformerForwardMapper
from anemoi.models.layers.processor import GraphTransformerProcessor

import gtnorm.anemoi
from benchmarks.anemoi.report import print_summary, write_outputs
from benchmarks.graphs.catalog import load_graph
from benchmarks.graphs.measure import (
    Measurement,
    TimingSettings,
    free_memory,
    guarded,
    measure_call,
    relative_error,
    retime_call,
)
from gtnorm.triton.layout_cache import register_batch_copies

# Row name -> (module kind, benchmark graph).
MODULES = {
    "processor r6": ("processor", "h_to_h"),
    "processor r5": ("processor", "h_to_h_small"),
    "encoder O320->r6": ("encoder", "era_to_h"),
    "encoder O96->r5": ("encoder", "era_to_h_small"),
    "decoder r6->O320": ("decoder", "h_to_era"),
    "decoder r5->O96": ("decoder", "h_to_era_small"),
}
QUICK_MODULES = ("processor r6", "encoder O320->r6", "decoder r6->O320")
# QK norm -> Anemoi's layer_kernels (None: qk_norm=False). "layer" is Anemoi's default QueryNorm / KeyNorm.
NORMS = {
    "off": None,
    "layer": {},
    "rms": {
        "QueryNorm": {"_target_": "torch.nn.RMSNorm", "_partial_": True},
        "KeyNorm": {"_target_": "torch.nn.RMSNorm", "_partial_": True},
    },
}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# Each module eager and under torch.compile(module) (default mode; inductor, aot_eager on the CPU), the compiled one
# wrapping the eager one (the same parameters).
SIDES = ("anemoi", "anemoi_compiled", "gtnorm", "gtnorm_compiled")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")


@dataclass(frozen=True)
class ModelSpec:
    """The blocks' sizes: Anemoi's graph-transformer defaults (1024 channels, 16 heads of 64), with a
    four-layer processor (every layer is the same block; Anemoi's models run 16)."""

    num_channels: int = 1024
    num_heads: int = 16
    mlp_hidden_ratio: float = 4.0
    edge_dim: int = 3  # edge length and direction
    processor_layers: int = 4
    data_channels: int = 100  # variables per data-grid node
    coord_channels: int = 4  # sin/cos of latitude and longitude of the destination nodes
    shard_strategy: str = "edges"  # Anemoi's default; what its blocks do under a model group of several GPUs

    def arguments(self, kind: str, norm: str, backend: str) -> dict:
        args = dict(
            num_channels=self.num_channels,
            num_chunks=1,
            num_heads=self.num_heads,
            mlp_hidden_ratio=self.mlp_hidden_ratio,
            edge_dim=self.edge_dim,
            qk_norm=NORMS[norm] is not None,
            layer_kernels=NORMS[norm] or {},
            graph_attention_backend=backend,
            shard_strategy=self.shard_strategy,
        )
        if kind == "processor":
            return args | dict(num_layers=self.processor_layers)
        if kind == "encoder":
            return args | dict(in_channels_src=self.data_channels, in_channels_dst=self.coord_channels)
        return args | dict(
            in_channels_src=self.num_channels, in_channels_dst=self.coord_channels, out_channels_dst=self.data_channels
        )


def build_modules(
    spec: ModelSpec, kind: str, norm: str, device: torch.device, mode: str = "default"
) -> dict[str, torch.nn.Module]:
    """Anemoi's module on its Triton backend and gtnorm's drop-in with its state_dict, each also compiled (in
    torch.compile's ``mode``)."""
    anemoi_classes = {
        "processor": GraphTransformerProcessor,
        "encoder": GraphTransformerForwardMapper,
        "decoder": GraphTransformerBackwardMapper,
    }
    gtnorm_classes = {
        "processor": gtnorm.anemoi.GraphTransformerProcessor,
        "encoder": gtnorm.anemoi.GraphTransformerForwardMapper,
        "decoder": gtnorm.anemoi.GraphTransformerBackwardMapper,
    }
    # As in a process that trains one model: the compilations of earlier rows would count towards this row's
    # recompile limits. Within a row, Anemoi's maybe_checkpoint is one function for every module of both sides,
    # compiled anew for each call site, training and inference: past dynamo's default limit of 8 it would run
    # eager without a word.
    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch.manual_seed(0)
    anemoi_module = anemoi_classes[kind](**spec.arguments(kind, norm, "triton")).to(device)
    gtnorm_module = gtnorm_classes[kind](**spec.arguments(kind, norm, "triton")).to(device)
    gtnorm_module.load_state_dict(anemoi_module.state_dict())
    backend = "inductor" if device.type == "cuda" else "aot_eager"  # inductor on the CPU needs a C++ toolchain
    return {
        "anemoi": anemoi_module,
        "anemoi_compiled": torch.compile(anemoi_module, backend=backend, mode=mode),
        "gtnorm": gtnorm_module,
        "gtnorm_compiled": torch.compile(gtnorm_module, backend=backend, mode=mode),
    }


@dataclass
class Problem:
    """One graph's inputs, as Anemoi's models hand them to the module (batch size 1)."""

    kind: str
    x: tuple[torch.Tensor, ...]  # processor: (x [N, channels],); mappers: (x_src, x_dst)
    edge_attr: torch.Tensor  # [M, edge_dim]
    edge_index: torch.Tensor  # [2, M], sorted by destination (as Anemoi's graph providers give it)

    def leaves(self) -> list[torch.Tensor]:
        return [*self.x, self.edge_attr]

    def new_edge_index(self, registered: bool) -> torch.Tensor:  # [2, M]
        """The graph in a new tensor, as Anemoi's graph providers hand one over every step (a ``torch.cat`` of the
        batch's copies); ``registered``: registered as copies of the base graph, as gtnorm's graph provider does
        (gtnorm.anemoi.use_gtnorm_attention)."""
        edge_index = torch.cat([self.edge_index], dim=1)
        if registered:
            num_nodes = (self.x[0].shape[0], self.x[-1].shape[0])
            register_batch_copies(edge_index, self.edge_index, num_nodes, 1)
        return edge_index

    def forward(self, module: torch.nn.Module, edge_index: torch.Tensor | None = None) -> torch.Tensor:
        edge_index = self.edge_index if edge_index is None else edge_index
        if self.kind == "processor":
            return module(self.x[0], 1, GraphShardInfo(), edge_attr=self.edge_attr, edge_index=edge_index)
        out = module(
            self.x, batch_size=1, shard_info=BipartiteGraphShardInfo(), edge_attr=self.edge_attr,
            edge_index=edge_index,
        )  # fmt: skip
        return out[1] if self.kind == "encoder" else out


def make_problem(spec: ModelSpec, kind: str, graph, device: torch.device) -> Problem:
    """Random inputs on ``graph`` (a benchmarks.graphs.catalog.BenchGraph)."""
    src_channels = {"processor": spec.num_channels, "encoder": spec.data_channels, "decoder": spec.num_channels}
    x_src = torch.randn(graph.num_src, src_channels[kind], device=device)
    x = (x_src,) if kind == "processor" else (x_src, torch.randn(graph.num_dst, spec.coord_channels, device=device))
    edge_attr = torch.randn(graph.num_edges, spec.edge_dim, device=device)
    problem = Problem(kind, x, edge_attr, graph.edge_index.to(device))
    for t in problem.leaves():
        t.requires_grad_()
    return problem


def inference_call(module: torch.nn.Module, problem: Problem, dtype: torch.dtype, device: torch.device):
    """The module's inference on the problem (``torch.inference_mode``, autocast to dtype), returning its output."""
    registered = is_gtnorm(module)

    def infer():
        torch.compiler.cudagraph_mark_step_begin()  # mode="reduce-overhead": a new step may reuse graph outputs
        module.eval()
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype):
            return problem.forward(module, problem.new_edge_index(registered))

    return infer


def training_call(module: torch.nn.Module, problem: Problem, dtype: torch.dtype, device: torch.device, grad_out):
    """A training step of the module on the problem: forward under autocast to dtype, backward from grad_out."""
    registered = is_gtnorm(module)

    def train_step():
        # mode="reduce-overhead": each step starts a new CUDA-graph generation, whose outputs may overwrite the last
        # step's (without it the second step fails on both sides); no effect in the other modes or eager.
        torch.compiler.cudagraph_mark_step_begin()
        module.train()
        with torch.autocast(device.type, dtype=dtype):
            out = problem.forward(module, problem.new_edge_index(registered))
        out.backward(grad_out)

    return train_step


def is_gtnorm(module: torch.nn.Module) -> bool:
    return type(getattr(module, "_orig_mod", module)).__module__.startswith("gtnorm.")


def measure_row(
    modules, problem: Problem, dtype: torch.dtype, settings: TimingSettings, device, rounds: int = 1
) -> dict:
    """Training step and inference of every side, and their inference outputs compared. With ``rounds`` > 1 the
    sides are timed again in turn, and each time is the median over the rounds (the level-5 / O96 blocks are
    host-bound steps whose times drift by 10-20 % within one run; alternating sides spreads that drift over all of
    them instead of charging it to whichever side ran at the wrong moment). Memory comes from the first round."""
    row = {}
    outputs = {}
    calls = {}  # side -> {mode: (fn, leaves)}, for the later rounds
    for side in SIDES:
        module = modules[side]
        leaves = [*problem.leaves(), *module.parameters()]
        infer = inference_call(module, problem, dtype, device)
        first_call = time.perf_counter()
        out, status = guarded(infer)  # torch.compile compiles here (and at the first training step below)
        first_infer_s = _synchronized_since(first_call, device)
        if out is None:
            row[side] = {"train": asdict(Measurement(status)), "infer": asdict(Measurement(status))}
            continue
        outputs[side] = out.float()
        grad_out = torch.randn_like(out, dtype=out.dtype)  # outside inference_mode: a normal tensor
        del out
        train_step = training_call(module, problem, dtype, device, grad_out)
        first_call = time.perf_counter()
        guarded(train_step)
        first_train_s = _synchronized_since(first_call, device)
        row[side] = {
            "train": asdict(measure_call(train_step, device, settings, leaves)) | {"first_call_s": first_train_s},
            "infer": asdict(measure_call(infer, device, settings, [])) | {"first_call_s": first_infer_s},
        }
        calls[side] = {"train": (train_step, leaves), "infer": (infer, [])}
        del grad_out
        free_memory()
    measured_calls = [row[side][mode] for side in calls for mode in calls[side]]
    for measured in measured_calls:
        measured["ms_rounds"] = [measured["ms"]] if measured["ms"] is not None else []
    for _ in range(rounds - 1):
        for side, side_calls in calls.items():
            for mode, (fn, leaves) in side_calls.items():
                if row[side][mode]["ms_rounds"]:
                    ms = retime_call(fn, device, settings, leaves)
                    if ms is not None:
                        row[side][mode]["ms_rounds"].append(ms)
    for measured in measured_calls:
        if measured["ms_rounds"]:
            measured["ms"] = statistics.median(measured["ms_rounds"])
    calls.clear()
    free_memory()
    if {"anemoi", "gtnorm"} <= outputs.keys():
        row["output_rel_error"] = relative_error(outputs["gtnorm"], outputs["anemoi"])
    return row


def _synchronized_since(start: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.anemoi", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/anemoi"), help="output directory")
    parser.add_argument("--quick", action="store_true", help="level-6 rows, no norm and LayerNorm, fp16 only")
    parser.add_argument("--modules", nargs="+", choices=list(MODULES), help="rows to run (default: all)")
    parser.add_argument("--norms", nargs="+", choices=list(NORMS), help="QK norms (default: all)")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), help="autocast dtypes (default: both)")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="do_bench's measuring budget per timing")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every side in turn; times are medians")
    parser.add_argument(
        "--min-calls", type=int, default=8, help="timed calls per round at least (rep-ms is raised where needed)"
    )
    parser.add_argument("--processor-layers", type=int, default=ModelSpec.processor_layers)
    parser.add_argument("--compile-mode", default="default", choices=COMPILE_MODES, help="torch.compile's mode")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    args.modules = args.modules or (list(QUICK_MODULES) if args.quick else list(MODULES))
    args.norms = args.norms or (["off", "layer"] if args.quick else list(NORMS))
    args.dtypes = args.dtypes or (["fp16"] if args.quick else list(DTYPES))
    return args


def run_environment(device: torch.device, spec: ModelSpec) -> dict:
    """What a result file records of the machine, the versions and the model's sizes."""
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})",
        "torch": torch.__version__,
        "triton": version("triton"),
        "anemoi_models": version("anemoi-models"),
        "python": platform.python_version(),
        "model": asdict(spec),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.anemoi needs a CUDA device: Anemoi's Triton backend runs on CUDA only")
    device = torch.device("cuda")
    spec = ModelSpec(processor_layers=args.processor_layers)
    settings = TimingSettings(warmup_ms=25.0, rep_ms=args.rep_ms, min_calls=args.min_calls)
    results = {
        "meta": {
            **run_environment(device, spec),
            "batch_size": 1,
            "gradient_checkpointing": True,
            "rounds": args.rounds,
            "min_calls": args.min_calls,
            "compile_mode": args.compile_mode,
        },
        "rows": [],
    }
    start = time.perf_counter()
    for name in args.modules:
        kind, graph_name = MODULES[name]
        problem = make_problem(spec, kind, load_graph(graph_name, verbose=True), device)
        for norm in args.norms:
            # Every row's modules share their classes' code: without a reset, dynamo's per-code cache limit would
            # send later rows back to eager.
            torch._dynamo.reset()
            modules = build_modules(spec, kind, norm, device, args.compile_mode)
            for dtype_name in args.dtypes:
                row = measure_row(modules, problem, DTYPES[dtype_name], settings, device, args.rounds)
                row |= {"module": name, "graph": graph_name, "edges": problem.edge_index.shape[1]}
                row |= {"norm": norm, "dtype": dtype_name}
                results["rows"].append(row)
                print(f"[{time.perf_counter() - start:6.0f} s] {name} {norm} {dtype_name} done", flush=True)
            del modules
            free_memory()
        del problem
        free_memory()
    results["meta"]["wall_s"] = time.perf_counter() - start
    write_outputs(results, args.out, plot=not args.no_plot)
    print_summary(results)
    return results
