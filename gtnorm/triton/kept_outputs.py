"""The attention's outputs kept from a checkpointed forward for the backward's recompute of it.

Under gradient checkpointing (``torch.utils.checkpoint.checkpoint``, non-reentrant, as Anemoi checkpoints its
processor in chunks of layers) the backward runs a region's forward again to rebuild what its backward reads, so
every attention call inside runs its forward kernels twice a step. What the recompute needs from a call is its
outputs alone: ``out`` [N_dst, H, C], ``lse`` [N_dst, H] and, with the fused edge projection, ``query_proj``
[N_dst, H, D + 1]. Kept from the forward, the recompute takes them instead of launching the kernels; the kernels
are deterministic, so the step is bitwise the same, for that memory held from a region's forward to its recompute.

:func:`attention_outputs_kept` is the ``context_fn`` that asks for it:

- eager, and where an eager checkpoint runs compiled blocks (Anemoi's ``compile:`` list), the region's forward
  records every call's outputs in order and its recompute replays them: the op's implementation looks the record
  up when it runs (:func:`run_or_replay`), never when it is traced. The output row is kept as a copy: inside a
  compiled graph the op's output buffer is free once its last reader has run, and inductor writes the next
  element-wise result into it (the residual add does, in Anemoi's blocks).
- where torch.compile traces the checkpoint itself (a whole compiled model), the same choice is a selective
  checkpoint policy: the op's outputs saved, everything else recomputed as plain checkpointing does.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_active = threading.local()  # .phase: the _Phase of the region whose forward or recompute is running, if any


class _KeptOutputs:
    """The outputs of one region's attention calls, in the order its forward made them."""

    def __init__(self) -> None:
        self.calls: deque[tuple[Tensor, Tensor, Tensor | None]] = deque()


class _Phase:
    """Context manager: while it is entered, the region's attention calls record (forward) or replay (recompute)."""

    def __init__(self, kept: _KeptOutputs, replaying: bool) -> None:
        self.kept, self.replaying = kept, replaying

    def __enter__(self) -> _Phase:
        self.outer = getattr(_active, "phase", None)
        _active.phase = self
        return self

    def __exit__(self, *exc) -> None:
        _active.phase = self.outer

    def run(self, forward: Callable[..., tuple], query: Tensor, *args, **kwargs) -> tuple:
        calls = self.kept.calls
        if self.replaying:
            if calls and _made_for(calls[0][0], query):
                return calls.popleft()
            # Not the call the forward made next (the recompute took another path): nothing kept is trusted.
            calls.clear()
            return forward(query, *args, **kwargs)
        out, lse, query_proj = forward(query, *args, **kwargs)
        calls.append((out.clone(), lse, query_proj))
        return out, lse, query_proj


def _made_for(out: Tensor, query: Tensor) -> bool:
    return out.shape == query.shape and out.dtype == query.dtype and out.device == query.device


def run_or_replay(forward: Callable[..., tuple], query: Tensor, *args, **kwargs) -> tuple:
    """``forward(query, *args, **kwargs)`` (the op's kernels: (out, lse, query_proj)), recorded or replayed where a
    region that keeps the attention's outputs is running."""
    phase = getattr(_active, "phase", None)
    if phase is None:
        return forward(query, *args, **kwargs)
    return phase.run(forward, query, *args, **kwargs)


def _eager_contexts() -> tuple[_Phase, _Phase]:
    kept = _KeptOutputs()
    return _Phase(kept, replaying=False), _Phase(kept, replaying=True)


def _save_attention_outputs(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    if op is torch.ops.gtnorm.graph_attention_forward.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def attention_outputs_kept() -> Callable[[], tuple]:
    """A ``context_fn`` for ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: the region's attention
    outputs kept from its forward for its recompute (module docstring). Call it where the checkpoint is made: under
    torch.compile's tracing it is a selective-checkpoint policy, otherwise the eager record."""
    if torch.compiler.is_compiling():
        return functools.partial(create_selective_checkpoint_contexts, _save_attention_outputs)
    return _eager_contexts
