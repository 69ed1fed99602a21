"""gtnorm's attention over several processes (torch.distributed): the fused op run head-parallel.

    plan = HeadParallelPlan.build(layout, dst_rows=..., src_rows=..., edge_rows=..., heads=H, channels=C)  # once
    out = head_parallel_attention(q, k, v, e, layout, plan, qk_norm="rms", q_norm_weight=wq, k_norm_weight=wk)

Inside Anemoi, its own sharding (``shard_strategy`` "heads" or "edges") already does this around gtnorm's blocks
(see :mod:`gtnorm.anemoi`); this package is for models outside Anemoi. Importing it defines gtnorm's kernels:
on a CPU, set ``TRITON_INTERPRET=1`` before.
"""

from gtnorm.distributed.head_parallel import head_parallel_attention
from gtnorm.distributed.plan import HeadParallelPlan, balanced_split

__all__ = ["HeadParallelPlan", "balanced_split", "head_parallel_attention"]
