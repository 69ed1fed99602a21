"""What each rank runs for tests/distributed/test_compiled_breaks.py: Anemoi's processor, encoder and decoder and
gtnorm's drop-ins, compiled (``aot_eager``) and run sharded over the model group for two training steps, with
dynamo's graph breaks counted per module and side."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from tests.anemoi.setups import Case, build_pair, make_inputs
from tests.distributed.anemoi_ranks import random_graph, sharded_training_step


def count_breaks(rank: int, world_size: int, kinds: list[str]) -> dict:
    """{kind: {side: {reason: count}}}."""
    group = dist.new_group(list(range(world_size)))
    breaks = {}
    for kind in kinds:
        case = Case(kind, batch=1, shard_strategy="edges", heads=5, channels=40)
        anemoi_module, gtnorm_module = build_pair(case, "triton", torch.device("cpu"))
        graph = random_graph(kind, torch.Generator().manual_seed(3))
        inputs = make_inputs(case, torch.device("cpu"), graph=graph)
        breaks[kind] = {}
        for side, module in (("anemoi", anemoi_module), ("gtnorm", gtnorm_module)):
            torch._dynamo.reset()
            counters.clear()
            compiled = torch.compile(module, backend="aot_eager")
            for _ in range(2):
                sharded_training_step(compiled, case, inputs, group)
            breaks[kind][side] = {" ".join(reason.split())[:400]: n for reason, n in counters["graph_break"].items()}
    return breaks
