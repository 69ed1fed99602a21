"""gtnorm in Anemoi: drop-ins for anemoi-models' graph-transformer processor, encoder and decoder.

Switch a model by changing the ``_target_`` of its processor / encoder / decoder config to the classes here
(same arguments, same state_dict keys: existing checkpoints load as they are), or convert a built model in
place with :func:`use_gtnorm_attention`. Their blocks run gtnorm's fused attention with the QK norm inside
the kernels: the block's own ``q_norm`` / ``k_norm`` (Anemoi's ``layer_kernels.QueryNorm`` / ``KeyNorm``) are
fused when they are LayerNorm (Anemoi's default, AutocastLayerNorm) or RMSNorm over the channels of a head,
and applied unfused before the kernels otherwise.

A model's graph providers are built inside the model, not from its config: :func:`use_gtnorm_attention` on the
built model also converts them (and Anemoi's mappers), so that each step's edges are registered
with gtnorm's layout cache and found with no host sync (gtnorm/anemoi/graph_provider.py). With the config switch
alone they are found by content, one host sync per new tensor.

Needs anemoi-models 0.19 (tested with 0.19.0; older versions are refused at import, newer ones warned about); see
docs/anemoi.md ("Installing") for installing it.
"""

try:
    import anemoi.models.layers.block  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "gtnorm.anemoi needs anemoi-models (tested with 0.19.0). It declares torch<2.11, so install it without "
        "its pins: pip install --no-deps anemoi-models==0.19.0 && pip install 'gtnorm[anemoi]'"
    ) from exc

import importlib.metadata
import warnings

# anemoi-models versions the drop-ins are built for. 0.18 and 0.17 build their mappers from other arguments
# (hidden_dim where 0.19 takes num_channels), and their graph providers and edge sharding differ.
SUPPORTED_ANEMOI_MODELS = (0, 19)


def check_anemoi_models_version(found: str) -> None:
    """ImportError for anemoi-models older than the supported minor version, a warning for a newer (untested) one."""
    release = tuple(int(part) for part in found.split(".")[:2] if part.isdigit())
    supported = ".".join(map(str, SUPPORTED_ANEMOI_MODELS))
    if release < SUPPORTED_ANEMOI_MODELS:
        raise ImportError(
            f"gtnorm.anemoi supports anemoi-models {supported}.x (tested with 0.19.0), found {found}: its blocks, "
            f"processor and mappers take other arguments. Install it with: pip install --no-deps anemoi-models==0.19.0"
        )
    if release > SUPPORTED_ANEMOI_MODELS:
        warnings.warn(
            f"gtnorm.anemoi is tested with anemoi-models {supported}.x (0.19.0), found {found}: untested",
            stacklevel=2,
        )


check_anemoi_models_version(importlib.metadata.version("anemoi-models"))

from gtnorm.anemoi.block import GraphTransformerMapperBlock, GraphTransformerProcessorBlock  # noqa: E402
from gtnorm.anemoi.convert import use_gtnorm_attention  # noqa: E402
from gtnorm.anemoi.graph_provider import StaticGraphProvider  # noqa: E402
from gtnorm.anemoi.mapper import GraphTransformerBackwardMapper, GraphTransformerForwardMapper  # noqa: E402
from gtnorm.anemoi.model import AnemoiModelEncProcDec  # noqa: E402
from gtnorm.anemoi.processor import GraphTransformerProcessor  # noqa: E402

__all__ = [
    "AnemoiModelEncProcDec",
    "GraphTransformerBackwardMapper",
    "GraphTransformerForwardMapper",
    "GraphTransformerMapperBlock",
    "GraphTransformerProcessor",
    "GraphTransformerProcessorBlock",
    "StaticGraphProvider",
    "use_gtnorm_attention",
]
