"""Build the whole model on both sides, and its inputs, as anemoi-training does.

Sides (same seed, same state_dict):
  ``anemoi``         AnemoiModelEncProcDec from the default config, on Anemoi's Triton backend.
  ``gtnorm``         the same built model converted in place by :func:`gtnorm.anemoi.use_gtnorm_attention`.
  ``gtnorm_config``  the config switch alone: the processor's and mappers' ``_target_`` set to gtnorm's drop-ins.
Compile modes (anemoi-models' own ``mark_for_compilation``, which anemoi-training calls with the config's list):
  ``default``  the default ``compile:`` list (GraphTransformerConv; compiles nothing in anemoi-models 0.19).
  ``blocks``   each side's processor and mapper block classes listed.
  ``whole``    the model in torch.compile.
"""

from __future__ import annotations

import torch
from anemoi.models.utils.compile import mark_for_compilation
from omegaconf import OmegaConf

from benchmarks.model import config as model_config_module
from benchmarks.model.config import DataSpec, ModelSpec

SIDES = ("anemoi", "gtnorm", "gtnorm_config")
MODES = ("default", "blocks", "whole")


def build_model(side: str, spec: ModelSpec, data: DataSpec, graph, seed: int = 0) -> torch.nn.Module:
    """The side's AnemoiModelEncProcDec on the CPU, its parameters drawn from ``seed`` (the same on every side)."""
    from hydra.utils import get_class

    import gtnorm.anemoi

    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    config = model_config_module.model_config(spec, data, gtnorm_targets=side == "gtnorm_config")
    indices = model_config_module.data_indices(data)
    torch.manual_seed(seed)
    model = get_class(config.model.model._target_)(  # as anemoi-training instantiates it
        model_config=config,
        data_indices=indices,
        statistics={"data": None},
        n_step_input=data.n_step_input,
        n_step_output=data.n_step_output,
        graph_data=graph,
    )
    if side == "gtnorm":
        # "triton": gtnorm's kernels wherever they can run; without CUDA Anemoi has set its blocks to "pyg".
        gtnorm.anemoi.use_gtnorm_attention(model, "triton")
    return model


def compile_list(side: str, mode: str) -> list[dict]:
    """The ``compile:`` list a user of ``side`` writes for ``mode`` ("default" or "blocks")."""
    if mode == "default":
        return model_config_module.DEFAULT_COMPILE_LIST
    if mode == "blocks":
        anemoi = side == "anemoi"
        classes = model_config_module.ANEMOI_BLOCK_CLASSES if anemoi else model_config_module.GTNORM_BLOCK_CLASSES
        return [{"module": name} for name in classes]
    raise ValueError(f"no compile list for mode {mode!r}")


def apply_compile_mode(model: torch.nn.Module, side: str, mode: str, backend: str = "inductor") -> torch.nn.Module:
    """The model as it runs in ``mode``; "whole" returns torch.compile(model) (sharing its parameters)."""
    if mode == "whole":
        return torch.compile(model, backend=backend)
    compile_config = compile_list(side, mode)
    if backend != "inductor":
        compile_config = [entry | {"options": {"backend": backend}} for entry in compile_config]
    return mark_for_compilation(model, OmegaConf.create(compile_config))


def compiled_modules(model: torch.nn.Module) -> list[str]:
    """Names of the submodules that ``Module.compile()`` marked (what a compile list did)."""
    return [name for name, module in model.named_modules() if getattr(module, "_compiled_call_impl", None) is not None]


def make_batch(model: torch.nn.Module, data: DataSpec, batch_size: int = 1, seed: int = 1) -> torch.Tensor:
    """A normalised input batch [batch, n_step_input, ensemble 1, grid, input variables] for the model."""
    generator = torch.Generator().manual_seed(seed)
    num_grid = model.node_attributes.num_nodes["data"]
    num_inputs = model.num_input_channels["data"]
    return torch.randn(batch_size, data.n_step_input, 1, num_grid, num_inputs, generator=generator)


def make_target(model: torch.nn.Module, data: DataSpec, batch_size: int = 1, seed: int = 2) -> torch.Tensor:
    """A target [batch, n_step_output, ensemble 1, grid, output variables]."""
    generator = torch.Generator().manual_seed(seed)
    num_grid = model.node_attributes.num_nodes["data"]
    num_outputs = model.num_output_channels["data"]
    return torch.randn(batch_size, data.n_step_output, 1, num_grid, num_outputs, generator=generator)


def training_loss(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The forecaster's step without its scalers: the model's prediction and its mean squared error."""
    prediction = model({"data": x})["data"]
    return torch.nn.functional.mse_loss(prediction.float(), target)
