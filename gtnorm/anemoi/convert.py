"""Switch a built Anemoi model (or any module holding Anemoi's graph-transformer parts) to gtnorm, in place."""

from __future__ import annotations

from anemoi.models.layers import graph_provider as anemoi_graph_provider
from anemoi.models.layers import mapper as anemoi_mapper
from anemoi.models.layers import processor as anemoi_processor
from anemoi.models.models import encoder_processor_decoder as anemoi_model
from torch import nn

from gtnorm.anemoi import graph_provider, mapper, model, processor
from gtnorm.anemoi.block import convert_blocks
from gtnorm.anemoi.bounding import bounding_indices_as_buffers

# Anemoi's classes -> gtnorm's subclasses that add methods only (no parameters, buffers or state_dict keys), so
# that re-classing a built instance is complete (the model's plain attribute is set after re-classing).
_GTNORM_CLASSES = {
    anemoi_mapper.GraphTransformerForwardMapper: mapper.GraphTransformerForwardMapper,
    anemoi_mapper.GraphTransformerBackwardMapper: mapper.GraphTransformerBackwardMapper,
    anemoi_processor.GraphTransformerProcessor: processor.GraphTransformerProcessor,
    anemoi_graph_provider.StaticGraphProvider: graph_provider.StaticGraphProvider,
    anemoi_model.AnemoiModelEncProcDec: model.AnemoiModelEncProcDec,
}


def use_gtnorm_attention(module: nn.Module, graph_attention_backend: str | None = None) -> nn.Module:
    """Switch, in place, everything of Anemoi's graph transformer inside ``module`` (itself included) to gtnorm;
    returns ``module``.

    - Every graph-transformer block runs gtnorm's fused attention + QK norm (gtnorm/anemoi/block.py).
    - Every StaticGraphProvider registers its per-step expansion into batch copies with gtnorm's layout cache, so
      that the layers find their layouts with no host sync from the second step on
      (gtnorm/anemoi/graph_provider.py); the providers' node counts are read to the host here, once. Every
      graph-transformer mapper prepares its chunks once per graph, not every step (gtnorm/anemoi/mapper.py).
    - A GraphTransformerProcessor can run its last layers outside gradient checkpointing (its
      ``layers_outside_checkpoint``, 0 as converted: gtnorm/anemoi/processor.py).
    - An AnemoiModelEncProcDec adds its residual out of place: its backward needs no sorting index backward
      (gtnorm/anemoi/model.py).
    - Every output bounding holds the columns it bounds on the model's device, as non-persistent buffers: its
      indexing makes no host sync (gtnorm/anemoi/bounding.py).

    Parameters and state_dict keys do not change (gtnorm's classes add none; the boundings' buffers are not
    saved), so this works on a model built from any config or loaded from a checkpoint:
    ``use_gtnorm_attention(model, "triton")``.
    ``graph_attention_backend``: "triton" (gtnorm's kernels where they can run, the PyG path elsewhere) or
    "pyg" (the PyG reference) for every block; None keeps each block's own setting, which Anemoi has already
    turned from "triton" into "pyg" if the block was built without CUDA.
    """
    convert_blocks(module, graph_attention_backend)
    for part in module.modules():
        gtnorm_class = _GTNORM_CLASSES.get(type(part))
        if gtnorm_class is not None:
            part.__class__ = gtnorm_class
        if isinstance(part, model.AnemoiModelEncProcDec):
            part.check_residual_indices()
        if isinstance(part, graph_provider.StaticGraphProvider):
            graph_provider.base_node_counts(part.edge_inc)
    bounding_indices_as_buffers(module)
    return module
