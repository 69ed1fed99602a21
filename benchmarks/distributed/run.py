"""Anemoi's O320 <-> level-6 encoder, processor and decoder as one model, trained on 1 and on 2 GPUs under
Anemoi's model sharding (``shard_strategy`` "edges" and "heads"): gtnorm's drop-ins against Anemoi's own
Triton backend, each eager and under ``torch.compile(module)`` (Anemoi's way: anemoi-training compiles the
modules its config lists). Per row: the training step's and the inference's median time, the first (compiling)
step apart, and each GPU's peak memory; per strategy, side and mode the scaling efficiency t(1 GPU) / (2 x t(2
GPUs)).

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node 2 benchmarks/distributed/run.py --out benchmarks/out/distributed
    torchrun --nproc_per_node 1 benchmarks/distributed/run.py --out ...      # the 1-GPU rows only

With 2 processes, rank 0 first measures the 1-GPU rows alone (the other rank waits), then both measure the
2-GPU rows. Before any timing, every module is checked on the GPUs (NCCL): sharded over the ranks against the
same module run whole, in float32 (TF32 off), output and every gradient after Anemoi's gradient reduction
(benchmarks/distributed/sharding.py), and the output of inference (``torch.inference_mode``), on the real graphs
with a narrow model (5 heads: an uneven [3, 2] split), both sides eager and gtnorm's drop-ins compiled too; and
gtnorm.distributed.head_parallel_attention against the single-process op on the processor graph.

Compiled rows run for the strategies of ``--compiled-strategies`` (default: edges, Anemoi's default and the one
that scales): each compiles three modules per side for training and again for inference, ~1 minute per GPU count.

One step, as Anemoi's model runs it: the data nodes replicated, the hidden nodes sharded from the encoder's
output to the decoder's input, each graph's edges sharded by destination, bf16 autocast, gradient
checkpointing, batch 1; the loss of the decoder's whole output; then the gradients' all-reduce of
anemoi-training (DDP) when sharded. Writes results.json and results.md under --out; prints the table.
On the CPU (gloo; ``--graphs tiny``) it only shows that the script works: the kernels run through the Triton
interpreter under TRITON_INTERPRET=1, the PyG path otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path

if __package__ in (None, ""):  # run as a script (torchrun benchmarks/distributed/run.py): import from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
from anemoi.models.distributed.shapes import get_shard_sizes

from benchmarks.anemoi.run import ModelSpec, build_modules
from benchmarks.distributed.sharding import (
    reduce_gradients_as_anemoi,
    sharded_decoder,
    sharded_encoder,
    sharded_module_output,
    sharded_processor,
)
from benchmarks.graphs.catalog import load_graph
from benchmarks.graphs.measure import MIB, free_memory, guarded, relative_error
from gtnorm import GraphLayout, graph_transformer_attention
from gtnorm.distributed import HeadParallelPlan, balanced_split, head_parallel_attention

GRAPHS = {  # --graphs -> (encoder, processor, decoder) graph names of benchmarks/graphs/catalog.py
    "r6": ("era_to_h", "h_to_h", "h_to_era"),
    "r5": ("era_to_h_small", "h_to_h_small", "h_to_era_small"),
    "tiny": ("era_to_h_tiny", "h_to_h_tiny", "h_to_era_tiny"),
}
KINDS = ("encoder", "processor", "decoder")
SIDES = ("anemoi", "gtnorm")
MODES = ("eager", "compiled")  # benchmarks.anemoi.run.build_modules' keys: side, f"{side}_compiled"
STRATEGIES = ("edges", "heads")
NORM = "layer"  # Anemoi's default QK norm (AutocastLayerNorm)
CHECK_SPEC = ModelSpec(num_channels=80, num_heads=5, mlp_hidden_ratio=2.0, processor_layers=1)
# A rank that fails inside a step leaves its peers waiting in a collective: this ends the wait (and the run).
COLLECTIVE_TIMEOUT = timedelta(minutes=4)
CHECK_TOL = 1e-4  # float32 on graphs of 10^5-10^6 edges: per-rank sums in another order than the whole run's


@dataclass
class Setup:
    rank: int
    world: int
    device: torch.device
    graphs: dict  # kind -> BenchGraph


def init() -> Setup:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (NVLS) on the lent machines
    cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:  # plain `python run.py`: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT, device_id=device if cuda else None)
    return Setup(dist.get_rank(), dist.get_world_size(), device, {})


def load_graphs(setup: Setup, names: tuple[str, str, str]) -> None:
    """Rank 0 builds missing graphs into the cache first; then every rank reads them."""
    if setup.rank == 0:
        for name in names:
            load_graph(name, verbose=True)
    dist.barrier()
    setup.graphs = {kind: load_graph(name) for kind, name in zip(KINDS, names, strict=True)}


@dataclass
class Inputs:
    """The model's inputs on one graph set, replicated on every rank (batch 1)."""

    x_data: torch.Tensor  # [N_data, data_channels]: the encoder's sources
    x_hidden: torch.Tensor  # [N_hidden, coord_channels]: the hidden nodes' attributes
    y_coords: torch.Tensor  # [N_data, coord_channels]: the decoder's destinations
    edges: dict  # kind -> (edge_attr [M, edge_dim], edge_index [2, M])
    grad_out: torch.Tensor  # [N_data, data_channels]: dLoss/dOutput


def make_inputs(spec: ModelSpec, setup: Setup, seed: int = 0) -> Inputs:
    generator = torch.Generator().manual_seed(seed)  # the same on every rank

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(setup.device)

    n_data, n_hidden = setup.graphs["encoder"].num_src, setup.graphs["encoder"].num_dst
    edges = {
        kind: (randn(g.num_edges, spec.edge_dim), g.edge_index.to(setup.device)) for kind, g in setup.graphs.items()
    }
    return Inputs(
        x_data=randn(n_data, spec.data_channels),
        x_hidden=randn(n_hidden, spec.coord_channels),
        y_coords=randn(n_data, spec.coord_channels),
        edges=edges,
        grad_out=randn(n_data, spec.data_channels),
    )


def module_key(side: str, mode: str) -> str:
    return side if mode == "eager" else f"{side}_compiled"


def build_model(spec: ModelSpec, strategy: str, device: torch.device) -> dict:
    """module_key(side, mode) -> kind -> module; both sides of a kind share one state_dict, a compiled module
    wraps its eager one; dynamo's caches emptied first (build_modules)."""
    model = {}
    for kind in KINDS:
        built = build_modules(replace(spec, shard_strategy=strategy), kind, NORM, device)
        for key, module in built.items():
            model.setdefault(key, {})[kind] = module
    return model


def model_forward(modules: dict, inputs: Inputs, group, dtype=torch.bfloat16) -> torch.Tensor:
    """encoder -> processor -> decoder, sharded over ``group`` (None: one GPU); the whole output [N_data, F]."""
    hidden = get_shard_sizes(inputs.x_hidden, 0, group)
    rank = dist.get_rank(group) if group is not None else 0
    start = sum(hidden[:rank])
    x_hidden = inputs.x_hidden[start : start + hidden[rank]]
    with torch.autocast(inputs.x_data.device.type, dtype=dtype, enabled=dtype != torch.float32):
        latent = sharded_encoder(modules["encoder"], inputs.x_data, x_hidden, hidden, *inputs.edges["encoder"], group)
        latent = sharded_processor(modules["processor"], latent, hidden, *inputs.edges["processor"], group)
        return sharded_decoder(modules["decoder"], latent, hidden, inputs.y_coords, *inputs.edges["decoder"], group)


def training_step(modules: dict, inputs: Inputs, group, dtype=torch.bfloat16) -> None:
    """Forward and backward, sharded over ``group``."""
    for module in modules.values():
        module.train()
    out = model_forward(modules, inputs, group, dtype)
    out.backward(inputs.grad_out.to(out.dtype))
    if group is not None:
        for module in modules.values():
            reduce_gradients_as_anemoi(module, group)


def inference(modules: dict, inputs: Inputs, group, dtype=torch.bfloat16) -> torch.Tensor:
    """The model's forward as Anemoi's inference runs it: eval mode, ``torch.inference_mode``."""
    for module in modules.values():
        module.eval()
    with torch.inference_mode():
        return model_forward(modules, inputs, group, dtype)


def timed_steps(modules: dict, inputs: Inputs, group, setup: Setup, warmup: int, steps: int) -> dict:
    """Median training-step and inference times (ms) over ``steps`` calls after ``warmup``, the first call of each
    apart (s; torch.compile compiles there), and this GPU's peak memory (MiB) over the training steps."""
    params = [p for module in modules.values() for p in module.parameters()]
    sync = torch.cuda.synchronize if setup.device.type == "cuda" else (lambda: None)

    def step():
        for p in params:
            p.grad = None
        training_step(modules, inputs, group)

    def infer():
        inference(modules, inputs, group)

    first = {}
    for name, call in (("step", step), ("infer", infer)):
        sync()
        begin = time.perf_counter()
        call()
        sync()
        first[name] = time.perf_counter() - begin
        for _ in range(warmup - 1):
            call()
    sync()
    infer_ms = median_ms(infer, steps, group, sync)
    if setup.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ms = median_ms(step, steps, group, sync)
    peak = torch.cuda.max_memory_allocated() / MIB if setup.device.type == "cuda" else None
    for p in params:
        p.grad = None
    return {"ms": ms, "infer_ms": infer_ms, "peak_mib": peak, "first_step_s": first["step"],
            "first_infer_s": first["infer"]}  # fmt: skip


def median_ms(call, steps: int, group, sync) -> float:
    """Median wall time (ms) of ``steps`` calls, each started together on every rank of ``group`` (None: one
    process) and ``sync``'d before and after."""
    times = []
    for _ in range(steps):
        if group is not None:
            dist.barrier(group)  # start together: a step's time includes waiting for the slower rank
        sync()
        begin = time.perf_counter()
        call()
        sync()
        times.append(1e3 * (time.perf_counter() - begin))
    return statistics.median(times)


def check_sharded_equals_whole(setup: Setup, group, compiled_strategies) -> list[dict]:
    """Every module, strategy and side eager, and gtnorm's drop-ins compiled under ``compiled_strategies``,
    float32: the sharded step's output and gradients, and the sharded inference's output, against the whole
    module's on this rank. Rows: the largest relative error (and where) per case."""
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    inputs = make_inputs(CHECK_SPEC, setup, seed=1)
    rows = []
    for strategy in STRATEGIES:
        model = build_model(CHECK_SPEC, strategy, setup.device)
        cases = [(side, "eager") for side in SIDES] + [("gtnorm", "compiled")] * (strategy in compiled_strategies)
        for kind in KINDS:
            for side, mode in cases:
                module = model[module_key(side, mode)][kind]
                result, status = guarded(lambda module=module, kind=kind: _check_module(module, kind, inputs, group))
                rows.append({"kind": kind, "strategy": strategy, "side": side, "mode": mode, "status": status,
                             **(result or {})})  # fmt: skip
        del model
        free_memory()
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return rows


def _check_module(module, kind: str, inputs: Inputs, group) -> dict:
    # The processor and the decoder read the hidden state (CHECK_SPEC.num_channels wide): a random one.
    generator = torch.Generator().manual_seed(2)
    state = torch.randn(len(inputs.x_hidden), CHECK_SPEC.num_channels, generator=generator).to(inputs.x_data.device)
    x = {"encoder": (inputs.x_data, inputs.x_hidden), "processor": (state,), "decoder": (state, inputs.y_coords)}[kind]
    edge_attr, edge_index = inputs.edges[kind]
    results = {}
    for name, run_group in (("whole", None), ("sharded", group)):
        module.train()
        module.zero_grad(set_to_none=True)
        leaves = [t.detach().clone().requires_grad_() for t in (*x, edge_attr)]
        out = sharded_module_output(module, kind, tuple(leaves[:-1]), leaves[-1], edge_index, run_group)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.device)
        (out * weights).sum().backward()
        if run_group is not None:
            reduce_gradients_as_anemoi(module, run_group)
        grads = {f"input {i}": t.grad for i, t in enumerate(leaves)}
        grads |= {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
        results[name] = (out.detach(), {n: g.detach().clone() for n, g in grads.items() if g is not None})
    # Inference after training: Anemoi's processor keeps tensors of an inference_mode call that its next training
    # step cannot save for backward (RuntimeError: "Inference tensors cannot be saved for backward").
    inferred = {}
    module.eval()
    for name, run_group in (("whole", None), ("sharded", group)):
        with torch.inference_mode():
            inferred[name] = sharded_module_output(module, kind, x, edge_attr, edge_index, run_group)
    module.train()
    (out_w, grads_w), (out_s, grads_s) = results["whole"], results["sharded"]
    errors = {"output": relative_error(out_s, out_w), "inference": relative_error(*inferred.values())}
    largest = max(g.double().norm().item() for g in grads_w.values())
    for name, g in grads_w.items():
        if name not in grads_s:
            errors[name] = float("inf")
        elif g.double().norm().item() < 1e-6 * largest:  # zero in exact arithmetic: both sides noise only
            errors[name] = grads_s[name].double().norm().item() / largest
        else:
            errors[name] = relative_error(grads_s[name], g)
    worst = max(errors, key=errors.get)
    return {
        "max_rel_error": errors[worst],
        "worst": worst,
        "output_rel_error": errors["output"],
        "inference_rel_error": errors["inference"],
        "ok": errors[worst] <= CHECK_TOL,
    }


def check_head_parallel(setup: Setup, group, heads: int = 5, channels: int = 64) -> dict:
    """gtnorm.distributed.head_parallel_attention on the processor graph against the single-process op, float32
    with LayerNorm: this rank's output rows and input gradients, the norm parameters' whole gradients."""
    graph = setup.graphs["processor"]
    layout = GraphLayout.from_edge_index(graph.edge_index.to(setup.device), (graph.num_src, graph.num_dst))
    generator = torch.Generator().manual_seed(4)

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(setup.device).requires_grad_()

    q, k, v = (rand(n, heads, channels) for n in (graph.num_dst, graph.num_src, graph.num_src))
    e = rand(graph.num_edges, heads, channels)
    norms = {name: rand(channels) for name in ("q_norm_weight", "q_norm_bias", "k_norm_weight", "k_norm_bias")}
    weights = torch.randn(graph.num_dst, heads, channels, generator=generator).to(setup.device)
    sizes = {n: balanced_split(n, setup.world) for n in {graph.num_dst, graph.num_src, graph.num_edges}}

    def mine(t):
        part = sizes[len(t)]
        return t[sum(part[: setup.rank]) : sum(part[: setup.rank + 1])]

    plan = HeadParallelPlan.build(
        layout, dst_rows=len(mine(q)), src_rows=len(mine(k)), edge_rows=len(mine(e)), heads=heads,
        channels=channels, group=group,
    )  # fmt: skip
    out = head_parallel_attention(mine(q), mine(k), mine(v), mine(e), layout, plan, qk_norm="layer", **norms)
    (out * mine(weights)).sum().backward()
    leaves = [q, k, v, e, *norms.values()]
    parallel = [out.detach()] + [mine(t.grad) for t in leaves[:4]] + [t.grad for t in leaves[4:]]
    for t in leaves:
        t.grad = None
    whole = graph_transformer_attention(q, k, v, e, layout, qk_norm="layer", **norms)
    (whole * weights).sum().backward()
    single = [mine(whole.detach())] + [mine(t.grad) for t in leaves[:4]] + [t.grad for t in leaves[4:]]
    names = ["output", "query", "key", "value", "edge_attr", *norms]
    errors = {}
    for name, a, b in zip(names, parallel, single, strict=True):
        # The key norm's bias shifts all scores of a destination alike: its gradient is rounding noise, measured
        # against the key norm weight's gradient.
        scale = single[names.index("k_norm_weight")].norm().item()
        errors[name] = (a - b).norm().item() / scale if name == "k_norm_bias" else relative_error(a, b)
    worst = max(errors, key=errors.get)
    return {"kind": "head_parallel_attention", "strategy": f"{heads} heads", "side": "gtnorm", "status": "ok",
            "max_rel_error": errors[worst], "worst": worst, "ok": errors[worst] <= CHECK_TOL}  # fmt: skip


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/distributed"))
    parser.add_argument("--graphs", choices=list(GRAPHS), default="r6")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--processor-layers", type=int, default=2)
    parser.add_argument("--skip-check", action="store_true", help="no equality check before timing")
    parser.add_argument("--compiled-strategies", nargs="*", choices=STRATEGIES, default=["edges"],
                        help="strategies whose rows (and gtnorm's checks) also run compiled")  # fmt: skip
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    setup = init()
    load_graphs(setup, GRAPHS[args.graphs])
    group = dist.new_group(list(range(setup.world))) if setup.world > 1 else None  # the model comm group
    results = {"meta": meta(setup, args), "checks": [], "rows": []}
    start = time.perf_counter()

    def log(message):
        if setup.rank == 0:
            print(f"[{time.perf_counter() - start:6.1f} s] {message}", flush=True)

    if group is not None and not args.skip_check:
        results["checks"] = check_sharded_equals_whole(setup, group, args.compiled_strategies)
        checked, status = guarded(lambda: check_head_parallel(setup, group))
        results["checks"].append(checked or {"kind": "head_parallel_attention", "strategy": "-", "side": "gtnorm",
                                             "status": status, "ok": False})  # fmt: skip
        failed = [c for c in results["checks"] if not c.get("ok")]
        log(f"equality checks: {len(results['checks']) - len(failed)} passed, {len(failed)} failed")

    spec = replace(ModelSpec(), processor_layers=args.processor_layers)
    inputs = make_inputs(spec, setup)
    for gpus in sorted({1, setup.world}):
        for strategy in STRATEGIES if gpus > 1 else STRATEGIES[:1]:  # on one GPU the strategy does nothing
            model = build_model(spec, strategy, setup.device)
            modes = MODES if strategy in args.compiled_strategies else ("eager",)
            for mode, side in ((mode, side) for mode in modes for side in SIDES):
                row = {"gpus": gpus, "strategy": strategy, "side": side, "mode": mode}
                if gpus == setup.world or setup.rank == 0:  # 1-GPU rows: rank 0 alone, the others wait
                    modules, run_group = model[module_key(side, mode)], group if gpus > 1 else None
                    measured, status = guarded(
                        lambda: timed_steps(modules, inputs, run_group, setup, args.warmup, args.steps)  # noqa: B023
                    )
                    row |= {"status": status, **(measured or {})}
                if gpus > 1:  # every GPU's time and peak memory
                    gathered = [None] * setup.world
                    dist.all_gather_object(gathered, row)
                    row = {**gathered[0], "ms": max_or_none(g.get("ms") for g in gathered),
                           "infer_ms": max_or_none(g.get("infer_ms") for g in gathered),
                           "peak_mib_per_gpu": [g.get("peak_mib") for g in gathered],
                           "status": ", ".join(sorted({g["status"] for g in gathered}))}  # fmt: skip
                results["rows"].append(row)
                log(f"{gpus} GPU(s) {strategy} {side} {mode}: {row.get('status')}, step / inference ms "
                    f"{row.get('ms')} / {row.get('infer_ms')}")
                if setup.rank == 0:  # what ran so far survives a run cut short
                    write_outputs(results, args.out)
                free_memory()
            del model
            free_memory()
            dist.barrier()
    results["meta"]["wall_s"] = time.perf_counter() - start
    if setup.rank == 0:
        add_efficiency(results)
        write_outputs(results, args.out)
        print(markdown(results))
    dist.barrier()
    dist.destroy_process_group()


def max_or_none(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def add_efficiency(results: dict) -> None:
    """scaling efficiency = t(1 GPU) / (gpus x t(gpus)), per strategy, side and mode."""
    single = {(r["side"], r["mode"]): r.get("ms") for r in results["rows"] if r["gpus"] == 1}
    for row in results["rows"]:
        t1, t = single.get((row["side"], row["mode"])), row.get("ms")
        row["efficiency"] = t1 / (row["gpus"] * t) if t1 and t and row["gpus"] > 1 else None


def meta(setup: Setup, args) -> dict:
    cuda = setup.device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name(setup.device) if cuda else platform.processor() or "cpu",
        "gpus": setup.world,
        "backend": dist.get_backend(),
        "torch": torch.__version__,
        "triton": version("triton"),
        "anemoi_models": version("anemoi-models"),
        "graphs": dict(zip(KINDS, GRAPHS[args.graphs], strict=True)),
        "model": asdict(replace(ModelSpec(), processor_layers=args.processor_layers)),
        "norm": NORM,
        "dtype": "bf16 autocast",
        "compile": "torch.compile(module), mode default (inductor; aot_eager on the CPU)",
        "compiled_strategies": list(args.compiled_strategies),
        "steps": {"warmup": args.warmup, "timed": args.steps},
        "check_model": asdict(CHECK_SPEC),
        "check_tol": CHECK_TOL,
    }


def markdown(results: dict) -> str:
    m = results["meta"]
    lines = [
        f"# Anemoi encoder/processor/decoder on {m['gpus']} x {m['device']} ({m['graphs']})",
        "",
        f"torch {m['torch']}, triton {m['triton']}, anemoi-models {m['anemoi_models']}, {m['dtype']}, QK norm "
        f"{m['norm']}, {m['model']['processor_layers']} processor layers, median of {m['steps']['timed']} steps.",
        "",
        "| GPUs | strategy | side | mode | step ms | inference ms | first step s | peak MiB per GPU | scaling "
        "efficiency | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def number(value, spec):
        return format(value, spec) if value else "-"

    for r in results["rows"]:
        peaks = r.get("peak_mib_per_gpu") or [r.get("peak_mib")]
        peak = " / ".join(f"{p:,.0f}" for p in peaks if p is not None) or "-"
        lines.append(
            f"| {r['gpus']} | {r['strategy']} | {r['side']} | {r['mode']} | {number(r.get('ms'), '.1f')} "
            f"| {number(r.get('infer_ms'), '.1f')} | {number(r.get('first_step_s'), '.1f')} | {peak} "
            f"| {number(r.get('efficiency'), '.2f')} | {r.get('status')} |"
        )
    if results["checks"]:
        lines += ["", f"Equality checks (float32, sharded vs whole, tolerance {m['check_tol']:g}):", ""]
        lines += ["| module | strategy | side | mode | max rel. error | where | inference rel. error | ok |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for c in results["checks"]:
            err = f"{c['max_rel_error']:.1e}" if "max_rel_error" in c else c["status"]
            infer = f"{c['inference_rel_error']:.1e}" if "inference_rel_error" in c else "-"
            lines.append(
                f"| {c['kind']} | {c['strategy']} | {c['side']} | {c.get('mode', 'eager')} | {err} "
                f"| {c.get('worst', '-')} | {infer} | {c.get('ok')} |"
            )
    return "\n".join(lines) + "\n"


def write_outputs(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown(results))


if __name__ == "__main__":
    main()
