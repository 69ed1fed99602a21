"""Anemoi's graph-transformer encoder and decoder (forward / backward mappers) with gtnorm's fused attention."""

from __future__ import annotations

from anemoi.models.layers import mapper as anemoi_mapper

from gtnorm.anemoi.block import use_gtnorm_attention


class GraphTransformerForwardMapper(anemoi_mapper.GraphTransformerForwardMapper):
    """A drop-in for ``anemoi.models.layers.mapper.GraphTransformerForwardMapper`` (the encoder, data -> hidden):
    the same keyword arguments, state_dict keys and forward, with gtnorm's fused attention + QK norm. In a model
    config: ``_target_: gtnorm.anemoi.GraphTransformerForwardMapper``.
    """

    def __init__(self, *, graph_attention_backend: str = "triton", **kwargs) -> None:
        super().__init__(graph_attention_backend=graph_attention_backend, **kwargs)
        use_gtnorm_attention(self, graph_attention_backend)


class GraphTransformerBackwardMapper(anemoi_mapper.GraphTransformerBackwardMapper):
    """A drop-in for ``anemoi.models.layers.mapper.GraphTransformerBackwardMapper`` (the decoder, hidden -> data):
    the same keyword arguments, state_dict keys and forward, with gtnorm's fused attention + QK norm. In a model
    config: ``_target_: gtnorm.anemoi.GraphTransformerBackwardMapper``.
    """

    def __init__(self, *, graph_attention_backend: str = "triton", **kwargs) -> None:
        super().__init__(graph_attention_backend=graph_attention_backend, **kwargs)
        use_gtnorm_attention(self, graph_attention_backend)
