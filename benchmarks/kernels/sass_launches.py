"""The attention walk kernels' launches exactly as gtnorm's launch plan makes them, recorded on the CPU, and the
kernels to compile for them (the package's, or same-named ones from a modified copy of a kernel module).

attention_launch.attention_forward and attention_backward run on small CPU tensors with the module's three walk
Launchers replaced by recorders: the arguments, constexprs and options (num_warps, maxnreg) are what the plan
(gtnorm/triton/config.py) passes for that problem, and no kernel runs. gtnorm is imported inside the functions, so
that sass_count's --pythonpath can pick the checkout first.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

# short name -> (attention_launch's Launcher attribute, the kernel's function name, the module defining it)
KERNELS = {
    "fwd": ("launch_forward_walk", "graph_attention_forward_kernel", "gtnorm.triton.forward_kernel"),
    "bwd_dst": (
        "launch_by_destination_walk",
        "edge_softmax_backward_by_destination_kernel",
        "gtnorm.triton.backward_kernels",
    ),
    "bwd_src": ("launch_by_source_walk", "edge_softmax_backward_by_source_kernel", "gtnorm.triton.backward_kernels"),
}
# variant -> (qk_norm, whether the q norm has a bias, whether the k norm has one). Norms carry their weights as the
# modules do: RMSNorm a weight, LayerNorm a weight and a bias (torch.nn.LayerNorm), "none" nothing.
VARIANTS = {
    "rms": ("rms", False, False),
    "layer": ("layer", True, True),
    "none": ("none", None, None),
}
DTYPE = "bfloat16"
NODES = 50  # destinations and sources: no count divisible by 16, as on real graphs


@dataclasses.dataclass
class Launch:
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict  # constexprs passed by name and the launch options (num_warps, maxnreg, ...)


def capture_launches(
    variant: str = "rms",
    heads: int = 16,
    channels: int = 64,
    nodes: int = NODES,
    degree: int = 12,
    edge_attr: bool = True,
    edge_features: int = 0,
    seed: int = 0,
) -> dict[str, Launch]:
    """short name -> the walk's launch in attention_forward + attention_backward, for ``nodes`` destinations and
    sources, each destination with ``degree`` distinct random
    sources, bf16 [nodes, heads, channels] rows. ``edge_features`` D > 0: the fused edge projection (D fp32 raw
    attributes per edge, a weight and a bias, no edge rows); its node-block kernels are not launched (they are not
    walks), so their outputs stay empty."""
    import torch

    import gtnorm.triton.attention_launch as al

    qk_norm, q_bias, k_bias = VARIANTS[variant]
    recorded: dict[str, Launch] = {}

    class Recorder:
        def __init__(self, short: str):
            self.short = short

        def __getitem__(self, grid):
            def record(*args, **kwargs):
                recorded[self.short] = Launch(tuple(grid), args, kwargs)

            return record

    class ProjectionStub:
        """attention_launch's EdgeProjection without its node-block kernels."""

        def __init__(self, *args):
            pass

        def project(self, *args, **kwargs):
            pass

        def add_expanded(self, *args, **kwargs):
            pass

        def partial_rows(self, *args):
            return 1

        def weight_grads(self, *args):
            return None, None

    saved = {attr: getattr(al, attr) for attr, _, _ in KERNELS.values()}
    saved["EdgeProjection"] = al.EdgeProjection
    for short, (attr, _, _) in KERNELS.items():
        setattr(al, attr, Recorder(short))
    al.EdgeProjection = ProjectionStub
    try:
        gen = torch.Generator().manual_seed(seed)
        dtype = getattr(torch, DTYPE)
        dst = torch.arange(nodes).repeat_interleave(degree)
        src = torch.stack([torch.randperm(nodes, generator=gen)[:degree] for _ in range(nodes)]).flatten()
        edge_index = torch.stack([src, dst])
        q, k, v = (torch.randn(nodes, heads, channels, generator=gen).to(dtype) for _ in range(3))
        num_edges = edge_index.shape[1]
        e = x = w = b = None
        if edge_features:
            x = torch.randn(num_edges, edge_features, generator=gen)
            w = torch.randn(edge_features, heads * channels, generator=gen).to(dtype)
            b = torch.randn(heads * channels, generator=gen).to(dtype)
        elif edge_attr:
            e = torch.randn(num_edges, heads, channels, generator=gen).to(dtype)
        normed = qk_norm != "none"
        inputs = dict(
            query=q, key=k, value=v, edge_attr=e, edge_features=x, edge_weight=w, edge_bias=b,
            q_norm_weight=torch.ones(channels, dtype=dtype) if normed else None,
            q_norm_bias=torch.zeros(channels, dtype=dtype) if q_bias else None,
            k_norm_weight=torch.ones(channels, dtype=dtype) if normed else None,
            k_norm_bias=torch.zeros(channels, dtype=dtype) if k_bias else None,
            graph=[edge_index], qk_norm=qk_norm, eps_q=1e-6, eps_k=1e-6,
        )  # fmt: skip
        out, lse, query_proj = al.attention_forward(**inputs)
        al.attention_backward(grad_out=out, lse=lse, query_proj=query_proj, edge_features_grad=False, **inputs)
    finally:
        for attr, original in saved.items():
            setattr(al, attr, original)
    return recorded


def apply_overrides(short: str, launch: Launch, sets: list[str]) -> Launch:
    """``[kernel:]NAME=VALUE`` items (sass_count's --set) replace a launch keyword of ``short``'s launch: a constexpr
    passed by name, num_warps, maxnreg, ... Values are Python literals, else strings; maxnreg=0 removes the cap, as
    KernelLaunch.compile_options does."""
    kwargs = dict(launch.kwargs)
    for item in sets:
        target, _, assignment = item.rpartition(":")
        if target and target != short:
            continue
        name, _, value = assignment.partition("=")
        try:
            kwargs[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[name] = value
        if name == "maxnreg" and not kwargs[name]:
            kwargs.pop(name)
    return dataclasses.replace(launch, kwargs=kwargs)


def load_module(spec: str):
    """A dotted module name, or the path of a .py file, loaded under a name of its own (its imports of gtnorm's
    helpers resolve as usual)."""
    if not (spec.endswith(".py") or os.sep in spec):
        return importlib.import_module(spec)
    path = Path(spec).resolve()
    name = "_sass_count_" + re.sub(r"\W", "_", str(path))
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # Triton reads a kernel's source and globals through its module
    module_spec.loader.exec_module(module)
    return module


def resolve_kernels(modules: list[str]) -> dict[str, tuple[object, str]]:
    """short name -> (the kernel, where it came from): the package's, unless one of ``modules`` (later ones win)
    defines a function of the same name."""
    found = {
        short: (getattr(importlib.import_module(default), fn_name), default)
        for short, (_, fn_name, default) in KERNELS.items()
    }
    for spec in modules:
        module = load_module(spec)
        for short, (_, fn_name, _) in KERNELS.items():
            if hasattr(module, fn_name):
                found[short] = (getattr(module, fn_name), spec)
    return found
