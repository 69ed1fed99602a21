"""The ways of computing a norm on q and k followed by graph-transformer attention that the benchmark compares,
all on the same inputs and the same norm parameters: five with RMSNorm, and with LayerNorm (Anemoi's default QK
norm) the fused kernels against eager / compiled LayerNorm before gtnorm's unfused kernels or Anemoi's own Triton
kernel; the same attention without the norm (what the fused norm's cost is measured against); and, with LayerNorm,
edge features projected from raw attributes by Anemoi's lin_edge, materialised before the kernels or fused into
them (their raw attributes, weight and bias are made on first use: EdgeProjectionInputs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor

import gtnorm
from gtnorm.nn.reference import reference_graph_transformer_attention
from gtnorm.triton.config import launch_config_for

RMS_VARIANTS = ("pyg", "pyg_compiled", "unfused", "unfused_compiled_norm", "fused")
# Anemoi main's kernel (anemoi-models, no norm inside) after torch's RMSNorm, eager and compiled: the RMSNorm
# counterparts of anemoi_layer / anemoi_compiled_layer (issue 50).
ANEMOI_RMS_VARIANTS = ("anemoi_rms", "anemoi_compiled_rms")
LAYER_NORM_VARIANTS = (
    "pyg_layer", "unfused_layer", "unfused_compiled_layer", "anemoi_layer", "anemoi_compiled_layer", "fused_layer"
)
PROJECTION_VARIANTS = ("lin_edge_fused_layer", "fused_projection")
# Kernels of others that live outside this repository, run only when the user names their files
# (benchmarks/peer_kernels.py; `python -m benchmarks.graphs --anemoi-fused-qk PATH`).
PEER_VARIANTS = ("anemoi_fused_qk",)
VARIANTS = (*RMS_VARIANTS, *ANEMOI_RMS_VARIANTS, *LAYER_NORM_VARIANTS, "no_norm", *PROJECTION_VARIANTS, *PEER_VARIANTS)
# Raw attributes per edge of the projection variants: Anemoi's lin_edge input (edge length, direction and
# trainable edge parameters) is about this wide.
EDGE_DIM = 11
COMPILED_VARIANTS = frozenset(
    {"pyg_compiled", "unfused_compiled_norm", "unfused_compiled_layer", "anemoi_compiled_layer", "anemoi_compiled_rms"}
)
# Anemoi's kernel is a CUDA-only custom op (device_types="cuda"): it has no interpreter path.
CUDA_ONLY_VARIANTS = frozenset(
    {"anemoi_rms", "anemoi_compiled_rms", "anemoi_layer", "anemoi_compiled_layer", "anemoi_fused_qk"}
)
DESCRIPTIONS = {
    "pyg": "torch.nn.RMSNorm on q, k + the PyG MessagePassing of GraphTransformerConv(backend='pyg'), eager",
    "pyg_compiled": "the pyg variant under torch.compile",
    "unfused": "gtnorm.rms_norm on q, k + gtnorm.graph_transformer_attention(qk_norm=False)",
    "unfused_compiled_norm": "torch.compile'd F.rms_norm on q, k + gtnorm.graph_transformer_attention(qk_norm=False)",
    "fused": "gtnorm.graph_transformer_attention(qk_norm=True): RMSNorm inside the attention kernels",
    "anemoi_rms": "eager F.rms_norm (weight) on q, k + Anemoi main's Triton kernel (anemoi.models.triton.gt, as "
    "anemoi-models ships it; no norm inside), called as anemoi_layer calls it",
    "anemoi_compiled_rms": "torch.compile'd F.rms_norm on q, k + Anemoi main's Triton kernel (the anemoi_rms path "
    "otherwise)",
    "pyg_layer": "torch.nn.LayerNorm on q, k + the PyG MessagePassing, eager (the LayerNorm variants' reference)",
    "unfused_layer": "eager F.layer_norm on q, k + gtnorm.graph_transformer_attention(qk_norm=False)",
    "unfused_compiled_layer": "torch.compile'd F.layer_norm on q, k + gtnorm's kernels with qk_norm=False",
    "anemoi_layer": "eager F.layer_norm on q, k + Anemoi's Triton kernel (anemoi.models.triton.gt), CSC built once "
    "outside the timed region, edge features gathered into CSC order inside it only where the edges are not "
    "sorted by destination (as Anemoi's block does)",
    "anemoi_compiled_layer": "torch.compile'd F.layer_norm on q, k + Anemoi's Triton kernel: what an Anemoi user who "
    "compiles runs (the anemoi_layer path otherwise)",
    "fused_layer": "gtnorm.graph_transformer_attention(qk_norm='layer'): LayerNorm (weight, bias) inside the kernels",
    "no_norm": "gtnorm.graph_transformer_attention(qk_norm=False) on the raw q, k: the same kernels without the "
    "norm, so another function (not in the accuracy check); what the fused norm's cost is measured against",
    "lin_edge_fused_layer": f"e = F.linear(raw attributes [M, {EDGE_DIM}], lin_edge weight, bias) in the operands' "
    "dtype (as autocast runs Anemoi's lin_edge), then fused_layer on it: projection + attention, e materialised",
    "fused_projection": "gtnorm.graph_transformer_attention(qk_norm='layer', edge_features=raw attributes, "
    "edge_weight=lin_edge weight.t(), edge_bias=lin_edge bias): the projection inside the kernels, e never stored",
    "anemoi_fused_qk": "Anemoi's fused-QK-norm kernel (branch feat/triton-gt-fused-qk-norm of ecmwf/anemoi-core, "
    "loaded from --anemoi-fused-qk PATH), RMSNorm inside its kernels without affine weights (the branch has none), "
    "on a CSC built once outside the timed region: a function other than fused's, not in the accuracy check",
}


@dataclass
class BenchInputs:
    """One graph's inputs. q, k, v, e and the norm weights are leaves that require grad."""

    query: Tensor  # [N_dst, H, C]
    key: Tensor  # [N_src, H, C]
    value: Tensor  # [N_src, H, C]
    edge_attr: Tensor  # [M, H, C], in edge_index order
    q_norm_weight: Tensor  # [C]
    k_norm_weight: Tensor  # [C]
    q_norm_bias: Tensor  # [C], LayerNorm variants only
    k_norm_bias: Tensor  # [C], LayerNorm variants only
    grad_out: Tensor  # [N_dst, H, C]: the fixed upstream gradient of every backward
    edge_index: Tensor  # [2, M] int64, row 0 = source, row 1 = destination
    layout: gtnorm.GraphLayout  # built once per graph, outside every timed region (as in training)
    eps: float
    edge_projection: EdgeProjectionInputs | None = None  # the projection variants', made on first use
    projection_norm: str = "layer"  # the projection variants' qk_norm: "layer", "rms" or "none"
    projection_edge_dim: int = EDGE_DIM  # their raw attributes per edge

    @property
    def num_src(self) -> int:
        return self.key.shape[0]

    @property
    def num_dst(self) -> int:
        return self.query.shape[0]

    @property
    def channels(self) -> int:
        return self.query.shape[2]

    def nbytes(self) -> int:
        """Memory the inputs hold (tensors, edge_index, layout): what every variant finds already allocated."""
        tensors = [getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)]
        layout = [*self.layout.by_dst.tensors(), *self.layout.by_src.tensors()]
        return sum(t.numel() * t.element_size() for t in tensors + layout if isinstance(t, Tensor))


def make_inputs(
    graph, heads: int, channels: int, dtype: torch.dtype, device: torch.device, eps: float, seed: int = 0
) -> BenchInputs:
    """Random q, k, v, e, upstream gradient, norm weights 1 + 0.1 * randn and biases 0.1 * randn (not ones and
    zeros: a parameter that does nothing would hide a kernel that ignores it)."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int, grad: bool = True) -> Tensor:
        return torch.randn(*shape, generator=generator, device=device, dtype=dtype).requires_grad_(grad)

    def norm_weight(offset: float = 1.0) -> Tensor:
        w = offset + 0.1 * torch.randn(channels, generator=generator, device=device, dtype=torch.float32)
        return w.to(dtype).requires_grad_()

    edge_index = graph.edge_index.to(device=device, dtype=torch.int64)
    return BenchInputs(
        query=randn(graph.num_dst, heads, channels),
        key=randn(graph.num_src, heads, channels),
        value=randn(graph.num_src, heads, channels),
        edge_attr=randn(graph.num_edges, heads, channels),
        q_norm_weight=norm_weight(),
        k_norm_weight=norm_weight(),
        q_norm_bias=norm_weight(0.0),
        k_norm_bias=norm_weight(0.0),
        grad_out=randn(graph.num_dst, heads, channels, grad=False),
        edge_index=edge_index,
        layout=gtnorm.GraphLayout.from_edge_index(edge_index, num_nodes=(graph.num_src, graph.num_dst)),
        eps=eps,
    )


@dataclass
class EdgeProjectionInputs:
    """Raw edge attributes and Anemoi's lin_edge parameters (float32 leaves, as a model holds them under
    autocast; the attributes require grad, as Anemoi's trainable edge parameters do)."""

    edge_features: Tensor  # [M, D]
    weight: Tensor  # [H * C, D], torch.nn.Linear's layout
    bias: Tensor  # [H * C]

    @property
    def leaves(self) -> tuple[Tensor, Tensor, Tensor]:
        return self.edge_features, self.weight, self.bias


def edge_projection_inputs(inputs: BenchInputs, edge_dim: int = EDGE_DIM, seed: int = 1) -> EdgeProjectionInputs:
    """The inputs' raw attributes and lin_edge parameters, made once (the same for every projection variant): the
    weight scaled so that e is of the size of k and v."""
    if inputs.edge_projection is None:
        device = inputs.query.device
        generator = torch.Generator(device=device).manual_seed(seed)
        width = inputs.query.shape[1] * inputs.channels

        def randn(*shape: int, scale: float = 1.0) -> Tensor:
            x = torch.randn(*shape, generator=generator, device=device, dtype=torch.float32)
            return (scale * x).requires_grad_()

        inputs.edge_projection = EdgeProjectionInputs(
            edge_features=randn(inputs.edge_attr.shape[0], edge_dim),
            weight=randn(width, edge_dim, scale=edge_dim**-0.5),
            bias=randn(width, scale=0.1),
        )
    return inputs.edge_projection


def cast_inputs(inputs: BenchInputs, dtype: torch.dtype) -> BenchInputs:
    """The same values in another dtype, as fresh leaves (the fp32 reference of the accuracy check)."""

    def cast(t: Tensor) -> Tensor:
        return t.detach().to(dtype).requires_grad_(t.requires_grad)

    tensors = ("query", "key", "value", "edge_attr", "q_norm_weight", "k_norm_weight", "q_norm_bias", "k_norm_bias")
    tensors += ("grad_out",)
    return BenchInputs(
        **{name: cast(getattr(inputs, name)) for name in tensors},
        edge_index=inputs.edge_index,
        layout=inputs.layout,
        eps=inputs.eps,
    )


@dataclass
class Variant:
    name: str
    forward: Callable[[], Tensor]  # returns out [N_dst, H, C]
    # What receives gradients, in the order dq, dk, dv, de, dwq, dwk (pyg: its own norm modules' weights). The
    # LayerNorm variants' biases get gradients too (timed), but are not among the compared results.
    leaves: tuple[Tensor, ...]


def build_variant(name: str, inputs: BenchInputs, peer_paths: dict | None = None) -> Variant:
    """``peer_paths``: {peer variant: the path its files load from} (benchmarks/peer_kernels.py)."""
    if name in PEER_VARIANTS:
        path = (peer_paths or {}).get(name)
        if path is None:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{name} runs a kernel from outside this repository: give its path ({flag})")
        return _anemoi_fused_qk_variant(inputs, path)
    if name in LAYER_NORM_VARIANTS:
        return _build_layer_norm_variant(name, inputs)
    if name in ANEMOI_RMS_VARIANTS:
        return _build_anemoi_rms_variant(name, inputs)
    if name in PROJECTION_VARIANTS:
        return _build_projection_variant(name, inputs)
    q, k, v, e, layout, eps = inputs.query, inputs.key, inputs.value, inputs.edge_attr, inputs.layout, inputs.eps
    wq, wk, channels = inputs.q_norm_weight, inputs.k_norm_weight, (inputs.channels,)
    if name in ("pyg", "pyg_compiled"):
        # Anemoi's path: torch.nn.RMSNorm modules, then the PyG MessagePassing (no layer checks, no host syncs).
        q_norm, k_norm = (torch.nn.RMSNorm(inputs.channels, eps=eps).to(device=q.device, dtype=q.dtype) for _ in "qk")
        with torch.no_grad():
            q_norm.weight.copy_(wq)
            k_norm.weight.copy_(wk)
        edge_index, size = inputs.edge_index, (inputs.num_src, inputs.num_dst)

        def pyg_forward() -> Tensor:
            return reference_graph_transformer_attention(q, k, v, e, edge_index, size, q_norm=q_norm, k_norm=k_norm)

        # dynamic=False: kernels specialised to this graph's sizes, as a training run on one graph gets them.
        forward = torch.compile(pyg_forward, dynamic=False) if name == "pyg_compiled" else pyg_forward
        return Variant(name, forward, (q, k, v, e, q_norm.weight, k_norm.weight))

    leaves = (q, k, v, e, wq, wk)
    if name == "fused":
        return Variant(
            name,
            lambda: gtnorm.graph_transformer_attention(
                q, k, v, e, layout, qk_norm=True, q_norm_weight=wq, k_norm_weight=wk, eps=eps
            ),
            leaves,
        )
    if name == "no_norm":
        return Variant(name, lambda: gtnorm.graph_transformer_attention(q, k, v, e, layout), (q, k, v, e))
    if name == "unfused":
        norm = lambda x, w: gtnorm.rms_norm(x, channels, w, eps)
    elif name == "unfused_compiled_norm":
        norm = torch.compile(lambda x, w: F.rms_norm(x, channels, w, eps), dynamic=False)
    else:
        raise ValueError(f"unknown variant {name!r}; expected one of {VARIANTS}")
    return Variant(name, lambda: gtnorm.graph_transformer_attention(norm(q, wq), norm(k, wk), v, e, layout), leaves)


def _build_layer_norm_variant(name: str, inputs: BenchInputs) -> Variant:
    q, k, v, e, layout, eps = inputs.query, inputs.key, inputs.value, inputs.edge_attr, inputs.layout, inputs.eps
    wq, wk, bq, bk = inputs.q_norm_weight, inputs.k_norm_weight, inputs.q_norm_bias, inputs.k_norm_bias
    channels = (inputs.channels,)
    leaves = (q, k, v, e, wq, wk)
    if name == "fused_layer":
        return Variant(
            name,
            lambda: gtnorm.graph_transformer_attention(
                q,
                k,
                v,
                e,
                layout,
                qk_norm="layer",
                q_norm_weight=wq,
                q_norm_bias=bq,
                k_norm_weight=wk,
                k_norm_bias=bk,
                eps=eps,
            ),  # fmt: skip
            leaves,
        )

    def layer_norm(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        return F.layer_norm(x, channels, w, b, eps)

    if name == "pyg_layer":
        edge_index, size = inputs.edge_index, (inputs.num_src, inputs.num_dst)
        return Variant(
            name,
            lambda: reference_graph_transformer_attention(
                q,
                k,
                v,
                e,
                edge_index,
                size,
                q_norm=lambda x: layer_norm(x, wq, bq),
                k_norm=lambda x: layer_norm(x, wk, bk),
            ),  # fmt: skip
            leaves,
        )
    compiled = name in ("unfused_compiled_layer", "anemoi_compiled_layer")
    norm = torch.compile(layer_norm, dynamic=False) if compiled else layer_norm
    if name in ("anemoi_layer", "anemoi_compiled_layer"):
        return Variant(name, _anemoi_attention(inputs, norm), leaves)
    return Variant(
        name, lambda: gtnorm.graph_transformer_attention(norm(q, wq, bq), norm(k, wk, bk), v, e, layout), leaves
    )


def _build_anemoi_rms_variant(name: str, inputs: BenchInputs) -> Variant:
    wq, wk, eps, channels = inputs.q_norm_weight, inputs.k_norm_weight, inputs.eps, (inputs.channels,)

    def rms_norm(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:  # b: _anemoi_attention's LayerNorm signature
        return F.rms_norm(x, channels, w, eps)

    norm = torch.compile(rms_norm, dynamic=False) if name == "anemoi_compiled_rms" else rms_norm
    q, k, v, e = inputs.query, inputs.key, inputs.value, inputs.edge_attr
    return Variant(name, _anemoi_attention(inputs, norm, with_bias=False), (q, k, v, e, wq, wk))


def _anemoi_attention(inputs: BenchInputs, layer_norm, with_bias: bool = True) -> Callable[[], Tensor]:
    """Anemoi's path with qk_norm on: LayerNorm (or RMSNorm: ``with_bias`` False) on q and k, then its Triton
    kernel, called as its GraphTransformerProcessorBlock does (anemoi/models/layers/block.py, apply_gt): CSC and
    reverse index built with its edge_index_to_csc (here once, outside the timed region, like gtnorm's layout;
    benchmarks.peer_kernels.anemoi_csc), edge features gathered into CSC order only when the graph's edges are not
    sorted by destination."""
    if inputs.query.device.type != "cuda":
        raise RuntimeError("Anemoi's Triton kernel is a CUDA-only custom op")
    from anemoi.models.triton.gt import graph_transformer_attention_conv

    from benchmarks.peer_kernels import anemoi_csc

    q, k, v, e = inputs.query, inputs.key, inputs.value, inputs.edge_attr
    wq, wk, bq, bk = inputs.q_norm_weight, inputs.k_norm_weight, inputs.q_norm_bias, inputs.k_norm_bias
    if not with_bias:
        bq = bk = None
    num_nodes = (inputs.num_src, inputs.num_dst)
    csc, perm, reverse = anemoi_csc(inputs.edge_index, num_nodes)

    def forward() -> Tensor:
        edges = e.index_select(0, perm) if perm is not None else e
        return graph_transformer_attention_conv(layer_norm(q, wq, bq), layer_norm(k, wk, bk), v, edges, csc, reverse)

    return forward


def _anemoi_fused_qk_variant(inputs: BenchInputs, path) -> Variant:
    if inputs.query.device.type != "cuda":
        raise RuntimeError("Anemoi's fused-QK kernel runs on CUDA only")
    from benchmarks.peer_kernels import anemoi_csc, load_anemoi_fused_qk

    attention = load_anemoi_fused_qk(path, "rms")
    q, k, v, e = inputs.query, inputs.key, inputs.value, inputs.edge_attr
    csc, perm, reverse = anemoi_csc(inputs.edge_index, (inputs.num_src, inputs.num_dst))

    def forward() -> Tensor:
        edges = e.index_select(0, perm) if perm is not None else e
        return attention(q, k, v, edges, csc, reverse)

    return Variant("anemoi_fused_qk", forward, (q, k, v, e))


def _build_projection_variant(name: str, inputs: BenchInputs) -> Variant:
    """Leaves: q, k, v, raw attributes, lin_edge weight and bias, norm weights and biases."""
    q, k, v, layout, eps = inputs.query, inputs.key, inputs.value, inputs.layout, inputs.eps
    kind = inputs.projection_norm
    norm = {}
    for side in ("q", "k"):  # leaves in the order q weight, q bias, k weight, k bias (those the norm has)
        if kind != "none":
            norm[f"{side}_norm_weight"] = getattr(inputs, f"{side}_norm_weight")
        if kind == "layer":
            norm[f"{side}_norm_bias"] = getattr(inputs, f"{side}_norm_bias")
    qk_norm = kind if kind != "none" else False
    projection = edge_projection_inputs(inputs, inputs.projection_edge_dim)
    x, weight, bias = projection.leaves
    leaves = (q, k, v, *projection.leaves, *norm.values())
    # Passed in, so that the kernels project whatever the op's dispatch rule (config.edge_projection_pays) picks.
    plan = launch_config_for(*q.shape[1:], x.shape[1] + 1, q.device)
    if name == "fused_projection":
        return Variant(
            name,
            lambda: gtnorm.graph_transformer_attention(
                q,
                k,
                v,
                None,
                layout,
                qk_norm=qk_norm,
                eps=eps,
                edge_features=x,
                edge_weight=weight.t(),
                edge_bias=bias,
                launch=plan,
                **norm,
            ),  # fmt: skip
            leaves,
        )
    if name == "lin_edge_fused_layer":

        def materialised() -> Tensor:
            e = F.linear(x.to(q.dtype), weight.to(q.dtype), bias.to(q.dtype)).view(x.shape[0], *q.shape[1:])
            return gtnorm.graph_transformer_attention(q, k, v, e, layout, qk_norm=qk_norm, eps=eps, **norm)

        return Variant(name, materialised, leaves)
    raise ValueError(f"unknown variant {name!r}; expected one of {VARIANTS}")
