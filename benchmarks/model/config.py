"""anemoi-training's default graph-transformer model config, as the values a user trains with.

Mirrors ``training/src/anemoi/training/config/model/graphtransformer.yaml`` of anemoi-training 0.17.1 (the release
that builds anemoi-models 0.19's multi-dataset models): 1024 channels, 16 heads, MLP ratio 4 (GELU), a 16-layer
processor in ``num_chunks: 4``, encoder and decoder in ``num_chunks: 4``, gradient checkpointing everywhere,
``shard_strategy: edges``, the Triton attention backend, no edge pre-MLP, ``qk_norm: False`` (AutocastLayerNorm
without bias when on), edge attributes ``edge_length`` + ``edge_dirs`` with 8 trainable parameters per
sub-graph, 8 trainable parameters per node set, a sum latent aggregator, a skip connection from the last input
step, ReLU bounding of ``tp`` and the ``compile:`` list. The data side (variables, steps) is the benchmark's own:
a typical global model's size, written in :class:`DataSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

# anemoi-training's default `compile:` list: the attention module only. In anemoi-models 0.19 with the Triton
# backend no module of that class exists (the blocks call a function), so it compiles nothing.
DEFAULT_COMPILE_LIST = [{"module": "anemoi.models.layers.conv.GraphTransformerConv"}]

# What a user lists to compile each side's blocks (anemoi-models matches the exact class, not subclasses).
ANEMOI_BLOCK_CLASSES = (
    "anemoi.models.layers.block.GraphTransformerProcessorBlock",
    "anemoi.models.layers.block.GraphTransformerMapperBlock",
)
GTNORM_BLOCK_CLASSES = (
    "gtnorm.anemoi.block.GraphTransformerProcessorBlock",
    "gtnorm.anemoi.block.GraphTransformerMapperBlock",
)

# The config switch: the modules' `_target_` in a model config, Anemoi's -> gtnorm's drop-ins.
GTNORM_TARGETS = {
    "anemoi.models.layers.processor.GraphTransformerProcessor": "gtnorm.anemoi.GraphTransformerProcessor",
    "anemoi.models.layers.mapper.GraphTransformerForwardMapper": "gtnorm.anemoi.GraphTransformerForwardMapper",
    "anemoi.models.layers.mapper.GraphTransformerBackwardMapper": "gtnorm.anemoi.GraphTransformerBackwardMapper",
    "anemoi.models.models.AnemoiModelEncProcDec": "gtnorm.anemoi.AnemoiModelEncProcDec",
}


@dataclass(frozen=True)
class DataSpec:
    """The dataset the model trains on (the benchmark's choice: a global model of 100 variables)."""

    num_variables: int = 100  # of which forcings and diagnostics below; the rest prognostic
    forcings: tuple[str, ...] = ("cos_latitude", "sin_latitude", "cos_longitude", "sin_longitude", "insolation", "lsm")
    diagnostics: tuple[str, ...] = ("tp", "cp")
    n_step_input: int = 2
    n_step_output: int = 1

    def variable_names(self) -> list[str]:
        named = [*self.forcings, *self.diagnostics]
        return [f"var_{i}" for i in range(self.num_variables - len(named))] + named


@dataclass(frozen=True)
class ModelSpec:
    """The model's sizes: the default config's, except where a test shrinks them."""

    num_channels: int = 1024
    num_heads: int = 16
    num_layers: int = 16
    processor_chunks: int = 4
    mapper_chunks: int = 4
    mlp_hidden_ratio: float = 4.0
    trainable_edge: int = 8
    trainable_node: int = 8
    qk_norm: bool = False


def _block_arguments(spec: ModelSpec, num_chunks: int) -> dict:
    """What the processor, encoder and decoder entries of the YAML share."""
    return {
        "num_channels": spec.num_channels,
        "trainable_size": spec.trainable_edge,
        "sub_graph_edge_attributes": ["edge_length", "edge_dirs"],
        "num_chunks": num_chunks,
        "mlp_hidden_ratio": spec.mlp_hidden_ratio,
        "mlp_implementation": "mlp",
        "num_heads": spec.num_heads,
        "qk_norm": spec.qk_norm,
        "cpu_offload": False,
        "gradient_checkpointing": True,
        "layer_kernels": "${model.layer_kernels}",
        "shard_strategy": "edges",
        "graph_attention_backend": "triton",
        "edge_pre_mlp": False,
    }


def model_config(spec: ModelSpec = ModelSpec(), data: DataSpec = DataSpec(), gtnorm_targets: bool = False):
    """The config AnemoiModelEncProcDec is built from (``config.model``), resolved; ``gtnorm_targets``: with the
    model's, processor's and mappers' ``_target_`` switched to gtnorm's drop-ins (the config switch alone)."""
    processor = {
        "_target_": "anemoi.models.layers.processor.GraphTransformerProcessor",
        **_block_arguments(spec, spec.processor_chunks),
        "num_layers": spec.num_layers,
    }
    encoder = {
        "_target_": "anemoi.models.layers.mapper.GraphTransformerForwardMapper",
        **_block_arguments(spec, spec.mapper_chunks),
    }
    decoder = {
        "_target_": "anemoi.models.layers.mapper.GraphTransformerBackwardMapper",
        **_block_arguments(spec, spec.mapper_chunks),
        "initialise_data_extractor_zero": False,
    }
    if gtnorm_targets:
        for entry in (processor, encoder, decoder):
            entry["_target_"] = GTNORM_TARGETS[entry["_target_"]]
    model_class = "anemoi.models.models.AnemoiModelEncProcDec"
    model = {
        "num_channels": spec.num_channels,
        "cpu_offload": False,
        "keep_batch_sharded": True,
        "model": {"_target_": GTNORM_TARGETS[model_class] if gtnorm_targets else model_class,
                  "hidden_nodes_name": "hidden", "latent_skip": True},
        "layer_kernels": {
            "LayerNorm": {"_target_": "torch.nn.LayerNorm"},
            "Linear": {"_target_": "torch.nn.Linear"},
            "Activation": {"_target_": "torch.nn.GELU"},
            "QueryNorm": {"_target_": "anemoi.models.layers.normalization.AutocastLayerNorm", "bias": False},
            "KeyNorm": {"_target_": "anemoi.models.layers.normalization.AutocastLayerNorm", "bias": False},
        },
        "processor": processor,
        "encoders": {"0": {"source_datasets": ["data"], "dataset_fusing_strategy": "not_supported",
                           "mapper": encoder}},
        "latent_aggregator": {"_target_": "anemoi.models.layers.aggregator.SumAggregator"},
        "decoders": {"0": {"target_datasets": ["data"], "target_node_features": ["encoded_data"],
                           "mapper": decoder}},
        "residual": {"datasets": {"data": {"_target_": "anemoi.models.layers.residual.SkipConnection", "step": -1}}},
        "node_trainable_parameters": {"data": spec.trainable_node, "hidden": spec.trainable_node},
        "compile": DEFAULT_COMPILE_LIST,
        "bounding": {"datasets": {"data": [{"_target_": "anemoi.models.layers.bounding.ReluBounding",
                                            "variables": ["tp"]}]}},
    }  # fmt: skip
    config = OmegaConf.create({"model": model})
    OmegaConf.resolve(config)
    return config


def data_indices(data: DataSpec = DataSpec()) -> dict:
    """anemoi-models' IndexCollection of the one dataset, "data"."""
    from anemoi.models.data_indices.collection import IndexCollection

    names = data.variable_names()
    data_config = DictConfig({"forcing": list(data.forcings), "diagnostic": list(data.diagnostics)})
    return {"data": IndexCollection(data_config, {name: i for i, name in enumerate(names)})}
