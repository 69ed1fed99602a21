"""The whole model's training step, phase by phase: memory allocated at each mapper chunk and processor chunk
boundary (forward, recomputation under checkpointing, and the moment each chunk's output gradient arrives in the
backward, and inside a mapper chunk's backward the ends of its output head, its block and its embedding) and the
allocator's peak between two boundaries.

    python -m benchmarks.model.phases --graph o1280_r7 --mapper-chunks 4 --variant gtnorm/blocks/mlpckpt/efused

benchmarks.model.memory names what is alive at the peak, but its recording (the allocator's history with Python
stacks) fails inside a compiled block's backward (a SystemError from autograd's apply, torch 2.11); these
boundaries need no recording, so they measure the compiled step users run. One warm step is logged, after one that
compiles. A boundary whose phase peaked above ``--list-above`` GiB lists the sizes of the blocks alive there.
With ``--trace`` the logged step's allocator history is recorded without stacks, which works there, and the blocks
alive at the step's peak are listed by the phase that allocated them (benchmarks.model.trace).
Under a variant that compiles the whole model the marks are graph breaks at every chunk boundary (and the
logged step recompiles): it measures the model compiled in chunk-long pieces, not the one graph users run, whose
peak shows only in the unlogged first step (compiling included: the first line's "peak since the last").
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections import Counter
from pathlib import Path

import torch
from anemoi.models.layers import mapper as anemoi_mapper
from anemoi.models.layers import processor as anemoi_processor

from benchmarks.graphs.measure import clear_grads
from benchmarks.model.run import Case, add_case_arguments, case_of_arguments
from benchmarks.model.trace import AllocatorTrace, format_report

GIB = 2**30


class PhaseLog:
    """Boundaries of a step: (label, GiB allocated there, GiB peak since the previous boundary). On the CPU the
    memory reads are zero (the labels alone: what the tests check)."""

    def __init__(self, list_above_gib: float = float("inf"), trace: AllocatorTrace | None = None):
        self.on = False
        self.trace = trace
        self.list_above_gib = list_above_gib
        self.boundaries: list[tuple[str, float, float]] = []
        self.calls: Counter = Counter()

    def mark(self, label: str) -> None:
        if not self.on:
            return
        allocated = peak = 0.0
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            allocated, peak = torch.cuda.memory_allocated() / GIB, torch.cuda.max_memory_allocated() / GIB
            torch.cuda.reset_peak_memory_stats()
        self.boundaries.append((label, allocated, peak))
        if self.trace is not None:
            self.trace.mark(label)
        line = f"{label:48s} allocated {allocated:7.2f}  peak since the last {peak:7.2f}"
        if peak > self.list_above_gib:
            line += "  alive (GiB): " + " ".join(f"{size:.2f}" for size in alive_block_sizes())
        print(line, flush=True)

    def mark_gradient(self, tensor, label: str) -> None:
        """A boundary where ``tensor``'s gradient is computed (the start of its producer's backward)."""
        if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
            tensor.register_hook(lambda grad: self.mark(label))


def alive_block_sizes(min_bytes: int = 2**29) -> list[float]:
    """GiB of every allocated block of at least ``min_bytes``, largest first."""
    blocks = (block for segment in torch.cuda.memory_snapshot() for block in segment["blocks"])
    sizes = (block["size"] / GIB for block in blocks if block["state"] == "active_allocated")
    return sorted((size for size in sizes if size >= min_bytes / GIB), reverse=True)


@contextlib.contextmanager
def logged_chunks(log: PhaseLog):
    """Anemoi's mapper and processor chunk functions (gtnorm's mappers call them through super()) wrapped with
    boundaries; restored on exit. A chunk's second call in a step is its recomputation under checkpointing."""
    mapper_chunk = anemoi_mapper.GraphTransformerBaseMapper.run_processor_chunk
    layer_chunk = anemoi_processor.GraphTransformerProcessor.run_layer_chunk

    def run_processor_chunk(self, chunk_partition, chunk_id, *args, **kwargs):
        name = type(self).__name__.replace("GraphTransformer", "")
        log.calls[name, chunk_id] += 1
        phase = "forward" if log.calls[name, chunk_id] % 2 else "recomputed"
        log.mark(f"{name} chunk {chunk_id} {phase}")
        if phase == "forward":  # the backward's boundaries inside the chunk, on the tensors the backward uses
            self.pre_process, self.post_process = _marked_ends(log, f"{name} chunk {chunk_id} backward", self)
        try:
            out = mapper_chunk(self, chunk_partition, chunk_id, *args, **kwargs)
        finally:
            self.__dict__.pop("pre_process", None), self.__dict__.pop("post_process", None)
        log.mark(f"{name} chunk {chunk_id} {phase}, done")
        log.mark_gradient(out, f"{name} chunk {chunk_id} backward")
        return out

    def run_layer_chunk(self, chunk_start, data, *args, **kwargs):
        log.mark(f"processor layers {chunk_start}+")
        out = layer_chunk(self, chunk_start, data, *args, **kwargs)
        log.mark(f"processor layers {chunk_start}+, done")
        log.mark_gradient(out[0], f"processor layers {chunk_start}+ backward")
        return out

    anemoi_mapper.GraphTransformerBaseMapper.run_processor_chunk = run_processor_chunk
    anemoi_processor.GraphTransformerProcessor.run_layer_chunk = run_layer_chunk
    try:
        yield log
    finally:
        anemoi_mapper.GraphTransformerBaseMapper.run_processor_chunk = mapper_chunk
        anemoi_processor.GraphTransformerProcessor.run_layer_chunk = layer_chunk


def _marked_ends(log: PhaseLog, label: str, mapper) -> tuple:
    """The mapper's pre_process and post_process, marking where the backward passes them: the output head's
    backward done (the block's output gradient), the block's done (its destination input's gradient), the
    embedding's done (the gradient of the chunk's slice of the destinations' input)."""
    pre_process, post_process = mapper.pre_process, mapper.post_process

    def marked_pre_process(x, *args, **kwargs):
        log.mark_gradient(x[1], f"{label}: embedding done")
        embedded = pre_process(x, *args, **kwargs)
        log.mark_gradient(embedded[1], f"{label}: block done")
        return embedded

    def marked_post_process(x_dst, *args, **kwargs):
        log.mark_gradient(x_dst, f"{label}: head done")
        return post_process(x_dst, *args, **kwargs)

    return marked_pre_process, marked_post_process


def logged_step(case: Case, log: PhaseLog) -> list[tuple[str, float, float]]:
    """One step that compiles (not logged), then one logged step of ``case``: its boundaries."""
    with logged_chunks(log):
        for logged in (False, True):
            clear_grads(case.leaves)
            log.on, log.calls = logged, Counter()
            if logged and log.trace is not None:
                log.trace.start()
            log.mark("step starts")
            case.train()
            log.mark("step ends")
            if logged and log.trace is not None:
                log.trace.stop()
    clear_grads(case.leaves)
    return log.boundaries


def main(argv: list[str] | None = None) -> list:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model.phases", description=__doc__.split("\n\n")[0])
    add_case_arguments(parser)
    parser.add_argument("--list-above", type=float, default=float("inf"), help="GiB; see above")
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for the boundaries")
    trace_help = "record the allocator's history (no stacks) and list what is alive at the peak"
    parser.add_argument("--trace", action="store_true", help=trace_help)
    args = parser.parse_args(argv)
    case = case_of_arguments(args, "benchmarks.model.phases")
    trace = AllocatorTrace() if args.trace else None
    boundaries = logged_step(case, PhaseLog(args.list_above, trace))
    print(f"the step's peak: {max(peak for _, _, peak in boundaries):.2f} GiB allocated")
    if trace is not None:
        print(format_report(trace.peak()))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        run = {"device": torch.cuda.get_device_name(), "state_gib": case.state_mib / 1024} | vars(args)
        rows = [{"boundary": label, "allocated_gib": allocated, "peak_since_gib": peak}
                for label, allocated, peak in boundaries]  # fmt: skip
        run |= {"out": str(args.out), "list_above": None if args.list_above == float("inf") else args.list_above}
        args.out.write_text(json.dumps({"run": run, "boundaries": rows}, indent=1))
    return boundaries


if __name__ == "__main__":
    main()
