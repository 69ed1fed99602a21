"""Row-wise work on a mapper's destinations in checkpointed parts: the memory of one part instead of all rows.

A mapper chunk of the decoder at O1280 is 1.65M grid nodes (the yaml's 4 chunks); what its training step keeps for
the backward is mostly the row-wise work on them: the block's MLP (LayerNorm, 4096-wide Linear, GELU, Linear) and
the decoder's output head (LayerNorm, Linear). Run in checkpointed parts, that work keeps only each part's input;
each part runs again in its own backward. Under the mapper's own checkpoint (Anemoi's, non-reentrant) the MLP's
parts cost no extra forward in eager mode: the chunk's recomputation stops once the parts' inputs are made (torch's
non-reentrant checkpoints stop early), so each part runs twice, as without parts (the output head, the chunk's
last work, may run parts once more). benchmarks/NOTES.md, v28. Compiled, the block's graph would recompute the
parts in its backward and inductor schedules them together (every part's tensors alive at once, v30): the mapper
block runs an MLP of the default config's form as one op instead (mlp_parts.py), other MLPs here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def in_checkpointed_parts(
    fn: Callable[..., Tensor],
    x: Tensor,  # [N, C]
    rows: int | None,
    cond: Tensor | None = None,  # [N, C_cond]: split with the rows it conditions
) -> Tensor:  # [N, C_out]
    """fn(x) (fn(x, cond=cond) where cond is given) in checkpointed parts of at most ``rows`` rows when gradients
    are taken and x has more rows; else in one call. fn must act on each row alone."""
    kwargs = {} if cond is None else {"cond": cond}
    if rows is None or not torch.is_grad_enabled() or x.shape[0] <= rows:
        return fn(x, **kwargs)
    parts = x.split(rows)
    conds = cond.split(rows) if cond is not None else (None,) * len(parts)
    return torch.cat(
        [checkpoint(_call, fn, part, c, use_reentrant=False) for part, c in zip(parts, conds, strict=True)]
    )


def _call(fn: Callable[..., Tensor], x: Tensor, cond: Tensor | None) -> Tensor:
    return fn(x) if cond is None else fn(x, cond=cond)
