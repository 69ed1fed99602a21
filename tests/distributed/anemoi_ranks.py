"""What each rank runs for tests/distributed/test_anemoi_sharding.py: Anemoi's processor / encoder / decoder
(Anemoi's own, and gtnorm's drop-in) sharded over the model group, against the same module run whole: a training
step, and inference under torch.inference_mode.

The sharded step feeds the module as Anemoi's model does and reduces the parameter gradients as Anemoi's
training does (benchmarks/distributed/sharding.py); the output is gathered and every rank takes the same loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from benchmarks.distributed.sharding import reduce_gradients_as_anemoi, sharded_module_output
from tests.anemoi.setups import (
    Case,
    Inputs,
    StepResult,
    assert_steps_match,
    build_pair,
    forward,
    make_inputs,
    rel_error,
    training_step,
)
from tests.launches import count_launches

# Both sides compute in float32; the sharded run adds partial sums in another order (halo rows, the
# reduction of parameter gradients), a few ulps per block.
TOL = 2e-5
# (num_src, num_dst) per module, odd so that the balanced shards are uneven ([6, 5] and such).
GRAPH_SIZES = {"processor": (9, 9), "encoder": (13, 5), "decoder": (5, 13)}


@dataclass(frozen=True)
class ShardedCase:
    name: str
    case: Case
    side: str  # "gtnorm" | "anemoi"
    compiled: bool = False  # under torch.compile(module, backend="aot_eager"), as anemoi-training compiles it


def sharded_cases() -> list[ShardedCase]:
    """Every module and strategy with 5 heads (split [3, 2] over two ranks) and odd node counts, both sides
    (gtnorm's with Anemoi's default gradient checkpointing, whose recomputation repeats the collectives; Anemoi's
    without, to save time); then 2 heads (an even split) with RMSNorm for the processor's head strategy.

    Not 3 heads: Anemoi 0.19's head all-to-all fails on a rank holding exactly one head (its buffer for the
    received [1, H, N, C] chunks gets the channels_last format of the one-head [1, 1, N, C] shard, which
    torch.distributed refuses as non-contiguous), with either attention backend.
    """
    cases = []
    for kind in ("processor", "encoder", "decoder"):
        for strategy in ("edges", "heads"):
            case = Case(kind, batch=1, shard_strategy=strategy, heads=5, channels=40)
            cases.append(ShardedCase(f"{kind}-{strategy}-5heads-gtnorm", case, "gtnorm"))
            cases.append(ShardedCase(f"{kind}-{strategy}-5heads-anemoi", case.with_(checkpoint=False), "anemoi"))
    case = Case("processor", batch=1, shard_strategy="heads", norm="rms", checkpoint=False)
    cases.append(ShardedCase("processor-heads-2heads-rms-gtnorm", case, "gtnorm"))
    # Mapper chunks within each GPU's shard (what lowers a mapper's peak memory at scale).
    case = Case("decoder", batch=1, shard_strategy="edges", heads=5, channels=40, num_chunks=3)
    cases.append(ShardedCase("decoder-edges-5heads-3chunks-gtnorm", case, "gtnorm"))
    # The compiled drop-ins: processor and decoder on the edge strategy, the encoder on the head strategy.
    for kind, strategy in (("processor", "edges"), ("decoder", "edges"), ("encoder", "heads")):
        case = Case(kind, batch=1, shard_strategy=strategy, heads=5, channels=40)
        cases.append(ShardedCase(f"{kind}-{strategy}-5heads-compiled-gtnorm", case, "gtnorm", compiled=True))
    return cases


def random_graph(kind: str, generator: torch.Generator) -> tuple[torch.Tensor, int, int]:
    """(edge_index [2, M] sorted by destination, num_src, num_dst). A processor graph is symmetric (Anemoi's
    halo exchange relies on it: a rank sends the nodes whose edges it sees reversed); in-degrees 0 to 4."""
    num_src, num_dst = GRAPH_SIZES[kind]
    degree = torch.randint(0, 5, (num_dst,), generator=generator)
    dst = torch.arange(num_dst).repeat_interleave(degree)
    src = torch.randint(0, num_src, (dst.numel(),), generator=generator)
    edges = torch.stack([src, dst])
    if kind == "processor":
        edges = torch.cat([edges, edges.flip(0)], dim=1).unique(dim=1)
    order = torch.argsort(edges[1] * num_src + edges[0])
    return edges[:, order], num_src, num_dst


def sharded_training_step(module, case: Case, inputs: Inputs, group) -> StepResult:
    """:func:`tests.anemoi.setups.training_step` under the model group, parameter gradients reduced as
    Anemoi's training reduces them."""
    module.train()
    module.zero_grad(set_to_none=True)
    leaves = [t.detach().clone().requires_grad_() for t in inputs.leaves()]
    out = sharded_module_output(module, case.kind, tuple(leaves[:-1]), leaves[-1], inputs.edge_index, group)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    (out * weights).sum().backward()
    reduce_gradients_as_anemoi(module, group)
    params = getattr(module, "_orig_mod", module).named_parameters()  # a compiled module's names unprefixed
    return StepResult(out.detach(), [t.grad for t in leaves], {n: p.grad for n, p in params})


def check_case(item: ShardedCase, group) -> dict:
    """{"error": None or what differs, "output_error": relative error of the sharded output, "inference_error",
    "launches": what ran on this rank, counted (tests/launches.py: launches per kernel, calls of gtnorm's op and
    of its PyG path)}."""
    case = item.case
    anemoi_module, gtnorm_module = build_pair(case, "triton", torch.device("cpu"))
    module = gtnorm_module if item.side == "gtnorm" else anemoi_module
    if item.compiled:
        module = torch.compile(module, backend="aot_eager")
    inputs = make_inputs(case, torch.device("cpu"), graph=random_graph(case.kind, torch.Generator().manual_seed(3)))
    whole = training_step(module, case, inputs)
    # Counted on the sharded runs only: what this rank ran on its shard.
    with count_launches() as launches:
        sharded = sharded_training_step(module, case, inputs, group)
        # Inference (torch.inference_mode, eval: the processor chunks its edges and sums the chunks), whole and
        # sharded.
        module.eval()
        with torch.inference_mode():
            sharded_inference = sharded_module_output(
                module, case.kind, inputs.x, inputs.edge_attr, inputs.edge_index, group
            )
    with torch.inference_mode():
        whole_inference = forward(module, case, inputs)
    result = {"error": None, "output_error": rel_error(sharded.output, whole.output)}
    result["inference_error"] = rel_error(sharded_inference, whole_inference)
    result["launches"] = dict(launches)
    try:
        assert_steps_match(sharded, whole, TOL)
    except AssertionError as exc:
        result["error"] = f"rank {dist.get_rank()}: {exc}"
    return result


def run_anemoi_cases(rank: int, world_size: int, names: list[str]) -> dict:
    cases = {item.name: item for item in sharded_cases()}
    group = dist.new_group(list(range(world_size)))  # the model communication group
    return {name: check_case(cases[name], group) for name in names}
