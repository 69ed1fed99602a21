"""What each rank runs for tests/distributed/test_head_parallel.py: gtnorm.distributed.head_parallel_attention
against the single-process op on the whole tensors, and the errors of ranks that disagree."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from gtnorm import GraphLayout, graph_transformer_attention
from gtnorm.distributed import HeadParallelPlan, head_parallel_attention

# Both sides run the same kernels per head in float32; the norm parameters' gradients are summed in another
# order (per-rank partial sums, then the all-reduce).
TOL = 1e-5
CHANNELS = 8
ZERO_GRADIENT = 1e-4  # gradients of O(1) inputs below this norm are rounding noise


@dataclass(frozen=True)
class HeadParallelCase:
    name: str
    heads: int
    qk_norm: bool | str
    edge_features: bool = True
    # Rows of each rank (rank 0, rank 1): deliberately uneven, and not the balanced split.
    dst_rows: tuple[int, int] = (5, 4)
    src_rows: tuple[int, int] = (3, 8)
    edge_rows: tuple[int, int] = (17, 13)
    check_determinism: bool = False  # run twice, compare bitwise (one case: the interpreter is slow)


CASES = [
    HeadParallelCase("5heads-rms", heads=5, qk_norm="rms"),
    HeadParallelCase("5heads-layer", heads=5, qk_norm="layer", check_determinism=True),
    HeadParallelCase("2heads-no-norm-no-edges", heads=2, qk_norm=False, edge_features=False),
    HeadParallelCase("3heads-rms-empty-rank", heads=3, qk_norm="rms", dst_rows=(9, 0), edge_rows=(30, 0)),
]


def small_graph() -> GraphLayout:
    """30 random edges from 11 sources into 9 destinations, in no particular order; the last source and the
    last destination take part in none."""
    generator = torch.Generator().manual_seed(2)
    edge_index = torch.stack(
        [torch.randint(0, 10, (30,), generator=generator), torch.randint(0, 8, (30,), generator=generator)]
    )
    return GraphLayout.from_edge_index(edge_index, (11, 9))


def _inputs(case: HeadParallelCase, layout: GraphLayout) -> dict:
    generator = torch.Generator().manual_seed(11)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    h, c = case.heads, CHANNELS
    inputs = dict(
        query=randn(layout.num_dst, h, c),
        key=randn(layout.num_src, h, c),
        value=randn(layout.num_src, h, c),
        edge_attr=randn(layout.num_edges, h, c) if case.edge_features else None,
    )
    if case.qk_norm:
        inputs.update(q_norm_weight=1 + 0.3 * randn(c), k_norm_weight=1 + 0.3 * randn(c))
    if case.qk_norm == "layer":
        inputs.update(q_norm_bias=0.3 * randn(c), k_norm_bias=0.3 * randn(c))
    return inputs


def _rows(case: HeadParallelCase, rank: int) -> dict:
    """This rank's block of rows of each row-split input."""
    blocks = {}
    for names, rows in (
        (("query",), case.dst_rows),
        (("key", "value"), case.src_rows),
        (("edge_attr",), case.edge_rows),
    ):
        for name in names:
            blocks[name] = slice(sum(rows[:rank]), sum(rows[: rank + 1]))
    return blocks


def _step(fn, inputs: dict, out_weights: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """fn's output and the gradient of every input, for the loss sum(out * out_weights)."""
    leaves = {name: t.clone().requires_grad_() for name, t in inputs.items() if t is not None}
    out = fn(leaves)
    (out * out_weights).sum().backward()
    return out.detach(), {name: t.grad for name, t in leaves.items()}


def check_case(case: HeadParallelCase, rank: int) -> dict:
    """Relative errors of this rank's output rows and of every gradient (this rank's rows; the norm parameters'
    whole), and whether a second run is bitwise equal (if the case asks). The loss is the sum over the ranks of
    each rank's output rows times fixed weights: the single-process reference is the whole output times all."""
    layout = small_graph()
    inputs = _inputs(case, layout)
    rows = _rows(case, rank)
    plan = HeadParallelPlan.build(
        layout,
        dst_rows=case.dst_rows[rank],
        src_rows=case.src_rows[rank],
        edge_rows=case.edge_rows[rank] if case.edge_features else None,
        heads=case.heads,
        channels=CHANNELS,
    )

    def whole(leaves):
        operands = [leaves.get(name) for name in ("query", "key", "value", "edge_attr")]
        params = {name: t for name, t in leaves.items() if "norm" in name}
        return graph_transformer_attention(*operands, layout, qk_norm=case.qk_norm, **params)

    def head_parallel(leaves):
        operands = [leaves[name][rows[name]] if name in leaves else None for name in ("query", "key", "value")]
        edge_attr = leaves["edge_attr"][rows["edge_attr"]] if "edge_attr" in leaves else None
        params = {name: t for name, t in leaves.items() if "norm" in name}
        return head_parallel_attention(*operands, edge_attr, layout, plan, qk_norm=case.qk_norm, **params)

    weights = torch.randn(layout.num_dst, case.heads, CHANNELS, generator=torch.Generator().manual_seed(5))
    expected_out, expected_grads = _step(whole, inputs, weights)
    out, grads = _step(head_parallel, inputs, weights[rows["query"]])
    errors = {"output": _rel_error(out, expected_out[rows["query"]])}
    for name, expected in expected_grads.items():
        mine = rows.get(name, slice(None))  # the norm parameters: whole on every rank
        errors[name] = _rel_error(grads[name][mine], expected[mine])
        if name in rows:  # rows of other ranks get no gradient here
            others = torch.ones(len(expected), dtype=torch.bool)
            others[mine] = False
            errors[f"{name} (other ranks' rows)"] = grads[name][others].abs().max().item() if others.any() else 0.0
    deterministic = None
    if case.check_determinism:
        again_out, again_grads = _step(head_parallel, inputs, weights[rows["query"]])
        deterministic = torch.equal(out, again_out) and all(torch.equal(grads[n], again_grads[n]) for n in grads)
    return {"errors": errors, "deterministic": deterministic, "heads": plan.heads}


def _rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected||; for a gradient that is zero in exact arithmetic (the key norm's bias:
    it shifts all scores of a destination alike, which the softmax ignores), ||actual|| / ZERO_GRADIENT instead,
    as both hold rounding noise only."""
    actual, expected = actual.double(), expected.double()
    if expected.norm() < ZERO_GRADIENT:
        return actual.norm().item() / ZERO_GRADIENT * TOL
    return ((actual - expected).norm() / expected.norm()).item()


# Plans the ranks disagree on: (name, this rank's HeadParallelPlan.build arguments).
DISAGREEMENTS = {
    "heads": lambda rank: dict(heads=4 + rank),
    "rows-total": lambda rank: dict(dst_rows=5),
    "edge-features": lambda rank: dict(edge_rows=None if rank else 17),
    "invalid-on-one-rank": lambda rank: dict(heads=-1 if rank else 4),
}


def disagreement_errors(rank: int) -> dict:
    """The message each disagreement raises on this rank (None if it raised nothing)."""
    layout = small_graph()
    messages = {}
    for name, arguments in DISAGREEMENTS.items():
        build = dict(dst_rows=(5, 4)[rank], src_rows=(3, 8)[rank], edge_rows=(17, 13)[rank], heads=4, channels=CHANNELS)
        build.update(arguments(rank))
        try:
            HeadParallelPlan.build(layout, **build)
            messages[name] = None
        except ValueError as exc:
            messages[name] = str(exc)
    return messages


def run_head_parallel_cases(rank: int, world_size: int) -> dict:
    results = {case.name: check_case(case, rank) for case in CASES}
    results["disagreements"] = disagreement_errors(rank)
    dist.barrier()
    return results
