"""Developer sweep: per-kernel times and register counts of the attention kernels under launch settings.

    python -m benchmarks.kernels.kernel_sweep [--graphs era_to_h h_to_h ...] [--norms rms layer none]
        [--edges rows proj none] [--settings default bwd:h4 ...]

For each graph (bf16, H=16, C=64), edge term, QK norm (with affine weights) and setting, in one process (a kernel
change is measured against every norm and edge term in one call: v41 found a forward change measured with LayerNorm
only that had slowed RMSNorm's by 24 %), runs forward+backward under torch.profiler and prints the mean time of each
kernel, its registers per thread and spills, how many cp.async copies its PTX holds (software-pipelined loads), the
other kernels of the step (torch's sums and copies) with the largest of them, the kernels' sum against the step's
own time (do_bench: L2 flushed before each call, host time included where the GPU waits for it), and the forward /
backward / total as % of the HBM floor (bytes that must move ÷ copy bandwidth measured in this run). Edge terms:
``rows``, edge features e [M, H, C]; ``proj``, the fused edge projection (``--edge-features`` D fp32 raw attributes
per edge requiring grad, edge weight and bias), whose floor is still the one of e (the ratio is then against the
materialised path's floor), with ``--linear-weight`` the weight passed as Anemoi passes lin_edge's (``weight.t()``);
``none``, no edge term (the same kernels, e left out): walks no fused edge projection can beat, so the bound against
which its kernels are judged; its floor counts no e rows. Settings are overrides of the plan
``gtnorm.triton.config.attention_launch_config`` returns, written as specs (``parse_setting``) and passed to the op
as its ``launch`` argument; the defaults live there. This is how the numbers in benchmarks/NOTES.md were taken
(before v41 one norm and edge term a process: ``--layer-norm``, ``--no-qk-norm``, ``--edge-features D``,
``--no-edge-attr``).

Another checkout's kernels under this harness: a folder holding only its ``gtnorm`` package, first on sys.path
(``python -c "import sys; sys.path.insert(0, TREE); import runpy; ..."``), leaves ``benchmarks`` this checkout's.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import torch
import triton
from torch.profiler import ProfilerActivity, profile

import gtnorm
from benchmarks.graphs.catalog import load_graph
from gtnorm.triton import attention_launch, edge_projection_launch
from gtnorm.triton import config as launch_config
from gtnorm.triton.launcher import Launcher

KERNELS = {
    "graph_attention_forward_kernel": "fwd",
    "edge_softmax_backward_by_destination_kernel": "by_dst",
    "edge_softmax_backward_by_source_kernel": "by_src",
    "edge_weight_grad_kernel": "dW",
    # The fused edge projection's node-block products (forward and backward calls together) and d edge_features.
    "project_rows_kernel": "proj",
    "add_expanded_rows_kernel": "expand",
    "edge_features_grad_kernel": "dx",
}


def parse_setting(spec: str):
    """A launch-setting override from a spec such as ``fwd:h16,w4,e32,s3/bwd:h8,w1,s4``.

    Parts split by ``/``: ``fwd``, ``dst``, ``src`` or ``bwd`` (both backward passes) followed by fields
    ``h`` (heads per program), ``w`` (warps), ``e`` (edges per program), ``s`` (pipeline stages), ``r`` (register
    cap per thread); or ``prj`` (the edge projection's node-block and d edge_features kernels) with ``p`` and ``x``
    (nodes per program projecting and expanding), ``w`` (their warps), ``e`` (edges per program of d
    edge_features).
    ``default`` changes nothing.
    """
    fields = {"h": "block_h", "w": "num_warps", "e": "edges_per_program", "s": "num_stages", "r": "max_registers"}
    projection_fields = {"p": "project_block", "x": "expand_block", "w": "node_warps", "e": "edge_block"}
    kernels = {"fwd": ("forward",), "dst": ("by_destination",), "src": ("by_source",), "prj": ("projection",)}
    kernels["bwd"] = kernels["dst"] + kernels["src"]

    def change(cfg, num_heads):
        for part in spec.split("/"):
            if part == "default":
                continue
            target, _, values = part.partition(":")
            names = projection_fields if target == "prj" else fields
            updates = {names[v[0]]: int(v[1:]) for v in values.split(",")}
            if "block_h" in updates:
                updates["head_groups"] = triton.cdiv(num_heads, updates["block_h"])
            for attr in kernels[target]:
                cfg = dataclasses.replace(cfg, **{attr: dataclasses.replace(getattr(cfg, attr), **updates)})
        return cfg

    return change


def copy_bandwidth(nbytes: int = 2**30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * nbytes / (ms * 1e-3)


def floor_bytes(n_src: int, n_dst: int, n_edges: int, row_bytes: int, index_bytes: int) -> tuple[int, int]:
    """(forward, backward) bytes that must move once: forward reads q, k, v, e and writes out; backward reads q,
    k, v, e, dO and writes dq, dk, dv, de; each also reads its index arrays (benchmarks/graphs/measure.py's
    hbm_floor_bytes counts the same)."""
    forward = (2 * n_dst + 2 * n_src + n_edges) * row_bytes + index_bytes
    backward = (3 * n_dst + 4 * n_src + 2 * n_edges) * row_bytes + index_bytes
    return forward, backward


LAUNCH_MODULES = (attention_launch, edge_projection_launch)
LAUNCHERS = [value for module in LAUNCH_MODULES for value in vars(module).values() if isinstance(value, Launcher)]


def swept_kernels() -> dict:
    """KERNELS' Triton functions by name, found through the launch modules' Launchers (a kernel moved between
    modules is still found; one no Launcher launches is an error, not a silently missing column)."""
    by_name = {launcher.kernel.fn.__name__: launcher.kernel for launcher in LAUNCHERS}
    missing = set(KERNELS) - set(by_name)
    if missing:
        raise RuntimeError(f"no Launcher in {[m.__name__ for m in LAUNCH_MODULES]} launches {sorted(missing)}")
    return {name: by_name[name] for name in KERNELS}


def record_compiled_kernels() -> dict:
    """Wraps the kernels' launch so the compiled kernel objects (with n_regs, n_spills) can be read back."""
    compiled = {}
    for name, kernel in swept_kernels().items():
        launch = kernel.run

        def run(*args, _launch=launch, _name=name, **kwargs):
            compiled[_name] = _launch(*args, **kwargs)
            return compiled[_name]

        kernel.run = run
    return compiled


def kernel_times(step, repeats: int = 5) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Mean device time (ms) per call of ``step`` (``repeats`` calls) of each attention kernel, and of every other
    kernel the step launches (name, ms), largest first."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            step()
        torch.cuda.synchronize()
    times, others = {}, []
    for event in prof.key_averages():
        total = event.device_time_total
        if event.key in KERNELS:
            times[KERNELS[event.key]] = total / repeats / 1e3
        elif total and getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            others.append((event.key, total / repeats / 1e3))
    return times, sorted(others, key=lambda item: -item[1])


@dataclasses.dataclass
class AttentionProblem:
    """Random bf16 inputs of one graph's attention (H heads x C channels), its layout and a fixed dO."""

    layout: gtnorm.GraphLayout
    inputs: list  # q [N_dst, H, C], k, v [N_src, H, C], e [M, H, C], leaves
    weights: list  # q and k norm weights [C], leaves
    grad_out: torch.Tensor  # [N_dst, H, C]
    projection: dict = dataclasses.field(default_factory=dict)  # edge_features [M, D], edge_weight, edge_bias
    linear_weight: bool = False  # edge_weight is held as [H * C, D] (torch.nn.Linear's) and passed transposed

    @classmethod
    def on_graph(
        cls,
        graph,
        heads: int,
        channels: int,
        dtype=torch.bfloat16,
        edge_dim: int = 0,
        linear_weight: bool = False,
        edge_attr: bool = True,
    ) -> AttentionProblem:
        """``linear_weight``: the edge weight held as torch.nn.Linear holds it ([H * C, D]) and passed transposed, as
        Anemoi's blocks pass lin_edge.weight. ``edge_attr`` False (and no edge_dim): no edge term at all."""
        layout = gtnorm.GraphLayout.from_edge_index(graph.edge_index.cuda(), (graph.num_src, graph.num_dst))
        inputs = [
            torch.randn(n, heads, channels, device="cuda", dtype=dtype).requires_grad_()
            for n in (graph.num_dst, graph.num_src, graph.num_src, graph.num_edges)
        ]
        weights = [(1 + 0.1 * torch.randn(channels, device="cuda")).to(dtype).requires_grad_() for _ in range(2)]
        grad_out = torch.randn(graph.num_dst, heads, channels, device="cuda", dtype=dtype)
        projection = {}
        if not edge_attr:
            inputs[3] = None
        if edge_dim:  # e from raw attributes inside the kernels, in place of the e rows
            inputs[3] = None
            weight = torch.randn(edge_dim, heads * channels, device="cuda") / edge_dim**0.5
            projection = dict(
                edge_features=torch.randn(graph.num_edges, edge_dim, device="cuda").requires_grad_(),
                edge_weight=(weight.t().contiguous() if linear_weight else weight).requires_grad_(),
                edge_bias=torch.randn(heads * channels, device="cuda").requires_grad_(),
            )
        return cls(layout, inputs, weights, grad_out, projection, linear_weight)

    def forward_backward(self, qk_norm: bool | str, launch=None) -> None:
        """One forward+backward, leaf grads reset first (qk_norm: False, True or "layer", with both affine weights;
        launch: the plan)."""
        for t in (*self.inputs, *self.weights, *self.projection.values()):
            if t is not None:
                t.grad = None
        norm = dict(qk_norm=qk_norm, q_norm_weight=self.weights[0], k_norm_weight=self.weights[1]) if qk_norm else {}
        projection = dict(self.projection)
        if self.linear_weight:
            projection["edge_weight"] = projection["edge_weight"].t()
        out = gtnorm.graph_transformer_attention(*self.inputs, self.layout, **norm, **projection, launch=launch)
        out.backward(self.grad_out)


NORMS = {"rms": True, "layer": "layer", "none": False}  # --norms: the op's qk_norm
EDGES = ("rows", "proj", "none")  # --edges: e rows, the fused edge projection, no edge term


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", nargs="+", default=["era_to_h", "h_to_h", "h_to_era", "dop_enc_large"])
    parser.add_argument("--settings", nargs="+", default=["default"], help="specs, see parse_setting")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--norms", nargs="+", choices=list(NORMS), default=["rms"], help="QK norms, each in turn")
    parser.add_argument("--edges", nargs="+", choices=EDGES, default=["rows"], help="edge terms, each in turn")
    parser.add_argument("--edge-features", type=int, default=11, help="D of --edges proj (Anemoi's 11)")
    parser.add_argument(
        "--linear-weight", action="store_true", help="the edge weight as lin_edge.weight.t() (Anemoi's strides)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    heads, channels, dtype = args.heads, args.channels, torch.bfloat16
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    compiled = record_compiled_kernels()
    for name in args.graphs:
        graph = load_graph(name)
        for edges in args.edges:
            edge_dim = args.edge_features if edges == "proj" else 0
            problem = AttentionProblem.on_graph(
                graph, heads, channels, dtype, edge_dim, args.linear_weight, edges != "none"
            )
            edge_rows = 0 if edges == "none" else graph.num_edges
            fwd_bytes, bwd_bytes = floor_bytes(
                graph.num_src, graph.num_dst, edge_rows, heads * channels * dtype.itemsize,
                problem.layout.index_bytes(),
            )  # fmt: skip
            default = launch_config.attention_launch_config(heads, channels, edge_dim + 1 if edge_dim else 0)
            for norm, setting in itertools.product(args.norms, args.settings):
                launch = parse_setting(setting)(default, heads)
                label = f"{name:14s} {edges}/{norm:5s} {setting:10s}"

                def step(problem=problem, launch=launch, qk_norm=NORMS[norm]):
                    problem.forward_backward(qk_norm=qk_norm, launch=launch)

                try:
                    for launcher in LAUNCHERS:  # the step's first launches take Triton's path, which records them
                        launcher.clear()
                    step()
                except Exception as error:  # a setting the compiler rejects: report it, go on with the others
                    print(f"{label}: failed: {str(error).strip().splitlines()[-1]}", flush=True)
                    continue
                times, others = kernel_times(step)
                # The same step timed whole (do_bench: L2 flushed before each call, host time included where the
                # GPU waits for it): what the kernels' sum leaves out.
                wall = triton.testing.do_bench(step, return_mode="median")
                fwd = times["fwd"]
                # Backward: everything but the forward's walk (the projection's node-block products included).
                bwd = sum(ms for short, ms in times.items() if short != "fwd") + sum(ms for _, ms in others)
                regs = " ".join(
                    f"{short} {times[short]:.3f} ms (r{compiled[k].n_regs}, s{compiled[k].n_spills},"
                    f" a{compiled[k].asm['ptx'].count('cp.async.ca') + compiled[k].asm['ptx'].count('cp.async.cg')})"
                    for k, short in KERNELS.items()
                    if short in times
                )
                largest = f"{others[0][0][:40]} {others[0][1]:.3f} ms" if others else "-"
                regs += f" other {sum(ms for _, ms in others):.3f} ms (largest: {largest})"
                regs += f" sum {fwd + bwd:.3f} ms wall {wall:.3f} ms"
                print(
                    f"{label} {regs} | floor: fwd {100 * fwd_bytes / bandwidth / (fwd * 1e-3):.0f}%"
                    f" bwd {100 * bwd_bytes / bandwidth / (bwd * 1e-3):.0f}%"
                    f" total {100 * (fwd_bytes + bwd_bytes) / bandwidth / ((fwd + bwd) * 1e-3):.0f}%",
                    flush=True,
                )
            del problem, step
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
