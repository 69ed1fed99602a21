"""Developer probe: what torch.compile captures of the sharded processor, and what it gains, by scope.

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node 2 benchmarks/distributed/compile_scope.py

Anemoi's level-6 processor (2 layers, LayerNorm QK norm, bf16 autocast, checkpointing, edges strategy) on 2
GPUs, each side (Anemoi's Triton backend, gtnorm's drop-in) three ways: eager; ``torch.compile(processor)`` (what
benchmarks/distributed/run.py times); and every graph-transformer block compiled in place (``block.compile()``, as
anemoi-training compiles the classes its config lists). Per way: the median training step (after Anemoi's gradient
reduction) and inference, the first step's seconds, the frames and ops dynamo compiled (a compile counter wrapping
inductor), and the inference output against the side's eager one. Rank 0 prints a line per way
(benchmarks/NOTES.md, v23).
"""

from __future__ import annotations

import copy
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

if __package__ in (None, ""):  # run as a script (torchrun): import from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
from anemoi.models.distributed.graph import gather_tensor
from anemoi.models.distributed.shapes import get_shard_sizes
from anemoi.models.layers.block import GraphTransformerBaseBlock
from torch._dynamo.testing import CompileCounterWithBackend

from benchmarks.anemoi.run import ModelSpec, build_modules
from benchmarks.distributed.run import median_ms
from benchmarks.distributed.sharding import reduce_gradients_as_anemoi, sharded_processor
from benchmarks.graphs.catalog import load_graph

SPEC = ModelSpec(processor_layers=2)
STEPS = 10
WARMUP = 2  # steps after the first (compiling) one, untimed


def main() -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    # A rank that fails alone leaves the other waiting in a collective: this ends the wait.
    dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=60))
    group = dist.new_group(list(range(dist.get_world_size())))
    if rank == 0:
        load_graph("h_to_h", verbose=True)
    dist.barrier()
    graph = load_graph("h_to_h")
    generator = torch.Generator().manual_seed(0)  # the same inputs on every rank
    x = torch.randn(graph.num_src, SPEC.num_channels, generator=generator).to(device)  # [N, C]
    edge_attr = torch.randn(graph.num_edges, SPEC.edge_dim, generator=generator).to(device)  # [M, D]
    edge_index = graph.edge_index.to(device)  # [2, M]
    hidden = get_shard_sizes(x, 0, group)
    start = sum(hidden[:rank])
    x_local = x[start : start + hidden[rank]]  # [hidden[rank], C]
    grad_out = torch.randn(hidden[rank], SPEC.num_channels, generator=torch.Generator().manual_seed(1 + rank))
    grad_out = grad_out.to(device)  # [hidden[rank], C]

    def run(module, train: bool = True):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = sharded_processor(module, x_local.requires_grad_(train), hidden, edge_attr, edge_index, group)
        if train:
            out.backward(grad_out.to(out.dtype))
            reduce_gradients_as_anemoi(module, group)
        return out

    for side in ("anemoi", "gtnorm"):
        eager = build_modules(SPEC, "processor", "layer", device)[side]
        module_counter, block_counter = CompileCounterWithBackend("inductor"), CompileCounterWithBackend("inductor")
        blocks = copy.deepcopy(eager)
        for block in blocks.modules():
            if isinstance(block, GraphTransformerBaseBlock):
                block.compile(backend=block_counter)
        ways = {
            "eager": (eager, None),
            "compiled module": (torch.compile(eager, backend=module_counter), module_counter),
            "compiled blocks": (blocks, block_counter),
        }
        reference = None
        for way, (module, counter) in ways.items():
            module.train()
            begin = time.perf_counter()
            run(module)
            torch.cuda.synchronize()
            first_s = time.perf_counter() - begin
            for _ in range(WARMUP):
                run(module)
            step_ms = median_ms(lambda module=module: run(module), STEPS, group, torch.cuda.synchronize)
            module.eval()
            with torch.inference_mode():
                out = gather_tensor(run(module, train=False).float(), 0, hidden, group)
                infer_ms = median_ms(
                    lambda module=module: run(module, train=False), STEPS, group, torch.cuda.synchronize
                )
            reference = out if reference is None else reference
            error = ((out - reference).norm() / reference.norm()).item()
            frames = f"{counter.frame_count} frames, {counter.op_count} ops" if counter else "-"
            if rank == 0:
                print(f"{side:7s} {way:16s} step {step_ms:6.1f} ms  inference {infer_ms:5.1f} ms  first step "
                      f"{first_s:5.1f} s  compiled: {frames}  output vs eager {error:.1e}", flush=True)  # fmt: skip
        del eager, blocks, ways
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
