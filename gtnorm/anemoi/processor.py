"""Anemoi's GraphTransformerProcessor with gtnorm's fused attention + QK norm in every block."""

from __future__ import annotations

from anemoi.models.layers import processor as anemoi_processor

from gtnorm.anemoi.block import convert_blocks


class GraphTransformerProcessor(anemoi_processor.GraphTransformerProcessor):
    """A drop-in for ``anemoi.models.layers.processor.GraphTransformerProcessor``: the same keyword arguments,
    the same parameters and state_dict keys, the same forward; its blocks run gtnorm's attention kernels with the
    QK norm fused (see :mod:`gtnorm.anemoi`). In a model config: ``_target_: gtnorm.anemoi.GraphTransformerProcessor``.
    """

    def __init__(self, *, graph_attention_backend: str = "triton", **kwargs) -> None:
        super().__init__(graph_attention_backend=graph_attention_backend, **kwargs)
        convert_blocks(self, graph_attention_backend)
