"""Anemoi modules and gtnorm's drop-ins built from the same arguments, tiny graphs for them, and one training
step that returns everything the tests compare (output, input gradients, every parameter's gradient).

Sizes stay tiny: on the CPU the kernels run through the Triton interpreter (about 1 ms per program).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
from anemoi.models.distributed.shapes import BipartiteGraphShardInfo, GraphShardInfo  # noqa: E402
from anemoi.models.layers import mapper as anemoi_mapper  # noqa: E402
from anemoi.models.layers import processor as anemoi_processor  # noqa: E402
from torch import nn  # noqa: E402

import gtnorm.anemoi  # noqa: E402

HIDDEN_CHANNELS = 16  # num_channels: 2 heads x 8 channels
DATA_CHANNELS = 5
COORD_CHANNELS = 4  # the destinations' own input (Anemoi's node attributes)
EDGE_DIM = 3

# Anemoi's layer_kernels for each kind of QK norm. "layer" is Anemoi's default (AutocastLayerNorm, no bias).
NORM_KERNELS = {
    "off": None,
    "layer": {},
    "layer_bias": {
        "QueryNorm": {"_target_": "anemoi.models.layers.normalization.AutocastLayerNorm", "_partial_": True},
        "KeyNorm": {"_target_": "anemoi.models.layers.normalization.AutocastLayerNorm", "_partial_": True},
    },
    "rms": {
        "QueryNorm": {"_target_": "torch.nn.RMSNorm", "_partial_": True},
        "KeyNorm": {"_target_": "torch.nn.RMSNorm", "_partial_": True},
    },
    "other": {
        "QueryNorm": {"_target_": "tests.anemoi.setups.SoftsignNorm", "_partial_": True},
        "KeyNorm": {"_target_": "tests.anemoi.setups.SoftsignNorm", "_partial_": True},
    },
}

ANEMOI_CLASSES = {
    "processor": anemoi_processor.GraphTransformerProcessor,
    "encoder": anemoi_mapper.GraphTransformerForwardMapper,
    "decoder": anemoi_mapper.GraphTransformerBackwardMapper,
}
GTNORM_CLASSES = {
    "processor": gtnorm.anemoi.GraphTransformerProcessor,
    "encoder": gtnorm.anemoi.GraphTransformerForwardMapper,
    "decoder": gtnorm.anemoi.GraphTransformerBackwardMapper,
}
# (num_src, num_dst) of one copy of each graph.
GRAPH_SIZES = {"processor": (10, 10), "encoder": (16, 6), "decoder": (6, 16)}
ZERO_GRADIENT = 1e-6


class SoftsignNorm(nn.Module):
    """A QK norm gtnorm does not fuse (applied before the kernels): x / (1 + |x|) * weight."""

    def __init__(self, normalized_shape: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.softsign(x) * self.weight


@dataclass(frozen=True)
class Case:
    kind: str  # "processor" | "encoder" | "decoder"
    norm: str = "layer"  # a NORM_KERNELS key
    batch: int = 2  # copies of the graph (batch x ensemble), as Anemoi's graph providers expand them
    num_chunks: int = 1  # processor: layers per checkpoint = num_layers / num_chunks; mappers: edge chunks
    checkpoint: bool = True
    shard_strategy: str = "edges"
    edge_pre_mlp: bool = False
    attn_channels: int | None = None
    channels: int = HIDDEN_CHANNELS  # num_channels (the hidden width)
    heads: int = 2
    trainable_size: int = 0  # trainable edge parameters per edge (Anemoi's graph providers' trainable_size)
    extra: dict = field(default_factory=dict)

    def with_(self, **changes) -> Case:
        return replace(self, **changes)

    def arguments(self, backend: str) -> dict:
        """The constructor arguments, as a model config would give them."""
        args = dict(
            num_channels=self.channels,
            num_chunks=self.num_chunks,
            num_heads=self.heads,
            mlp_hidden_ratio=2.0,
            edge_dim=EDGE_DIM + self.trainable_size,
            attn_channels=self.attn_channels,
            qk_norm=self.norm != "off",
            layer_kernels=NORM_KERNELS[self.norm] or {},
            shard_strategy=self.shard_strategy,
            graph_attention_backend=backend,
            edge_pre_mlp=self.edge_pre_mlp,
            gradient_checkpointing=self.checkpoint,
            **self.extra,
        )
        if self.kind == "processor":
            args.update(num_layers=2 if self.num_chunks > 1 else 1)
        elif self.kind == "encoder":
            args.update(in_channels_src=DATA_CHANNELS, in_channels_dst=COORD_CHANNELS)
        else:
            args.update(in_channels_src=self.channels, in_channels_dst=COORD_CHANNELS, out_channels_dst=DATA_CHANNELS)
        return args


def build_pair(
    case: Case, backend: str, device: torch.device, seed: int = 0, anemoi_backend: str = "pyg"
) -> tuple[nn.Module, nn.Module]:
    """(Anemoi's module on ``anemoi_backend``, gtnorm's drop-in on ``backend``), the latter loaded with the
    former's state_dict. Every parameter is moved away from its initial value first (norm weights of ones,
    zero biases), so that a kernel ignoring one would show."""
    torch.manual_seed(seed)
    anemoi_module = ANEMOI_CLASSES[case.kind](**case.arguments(anemoi_backend))
    with torch.no_grad():
        for p in anemoi_module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    gtnorm_module = GTNORM_CLASSES[case.kind](**case.arguments(backend))
    gtnorm_module.load_state_dict(anemoi_module.state_dict(), strict=True)
    return anemoi_module.to(device), gtnorm_module.to(device)


def random_edges(num_src: int, num_dst: int, generator: torch.Generator) -> torch.Tensor:
    """[2, M] sorted by destination (as Anemoi's graph providers give them); in-degrees 0 to 5, so some
    destinations receive no edge at all."""
    degree = torch.randint(0, 6, (num_dst,), generator=generator)
    dst = torch.arange(num_dst).repeat_interleave(degree)
    src = torch.randint(0, num_src, (dst.numel(),), generator=generator)
    return torch.stack([src, dst])


@dataclass
class Inputs:
    x: tuple[torch.Tensor, ...]  # processor: (x,); mappers: (x_src, x_dst)
    edge_attr: torch.Tensor  # [B*M, EDGE_DIM]
    edge_index: torch.Tensor  # [2, B*M], B copies of the graph
    batch: int

    def leaves(self) -> list[torch.Tensor]:
        return [*self.x, self.edge_attr]


def make_inputs(case: Case, device: torch.device, seed: int = 1, graph=None) -> Inputs:
    """Inputs on B copies of ``graph`` ((edge_index [2, M] sorted by destination, num_src, num_dst)), by
    default a random one of GRAPH_SIZES[case.kind]."""
    generator = torch.Generator().manual_seed(seed)
    if graph is None:
        num_src, num_dst = GRAPH_SIZES[case.kind]
        one_copy = random_edges(num_src, num_dst, generator)
    else:
        one_copy, num_src, num_dst = graph
    offsets = torch.tensor([[num_src], [num_dst]])
    edge_index = torch.cat([one_copy + b * offsets for b in range(case.batch)], dim=1)
    edge_attr = torch.randn(edge_index.shape[1], EDGE_DIM, generator=generator)
    b = case.batch
    if case.kind == "processor":
        x = (torch.randn(b * num_dst, case.channels, generator=generator),)
    else:
        src_channels = DATA_CHANNELS if case.kind == "encoder" else case.channels
        x = (
            torch.randn(b * num_src, src_channels, generator=generator),
            torch.randn(b * num_dst, COORD_CHANNELS, generator=generator),
        )
    to = dict(device=device)
    return Inputs(tuple(t.to(**to) for t in x), edge_attr.to(**to), edge_index.to(**to), b)


def forward(module: nn.Module, case: Case, inputs: Inputs) -> torch.Tensor:
    """The module's output as Anemoi's models call it (the encoder's: the new hidden state)."""
    if case.kind == "processor":
        return module(
            inputs.x[0], inputs.batch, GraphShardInfo(), edge_attr=inputs.edge_attr, edge_index=inputs.edge_index
        )
    out = module(
        inputs.x,
        batch_size=inputs.batch,
        shard_info=BipartiteGraphShardInfo(),
        edge_attr=inputs.edge_attr,
        edge_index=inputs.edge_index,
    )
    return out[1] if case.kind == "encoder" else out


@dataclass
class StepResult:
    output: torch.Tensor
    input_grads: list[torch.Tensor | None]
    param_grads: dict[str, torch.Tensor | None]


def training_step(module: nn.Module, case: Case, inputs: Inputs, autocast_dtype: torch.dtype | None = None):
    """Forward (under autocast if asked) and backward of sum(out * w), w fixed: the output and every
    gradient, detached."""
    module.train()
    module.zero_grad(set_to_none=True)
    leaves = [t.detach().clone().requires_grad_() for t in inputs.leaves()]
    inputs = Inputs(tuple(leaves[:-1]), leaves[-1], inputs.edge_index, inputs.batch)
    autocast = torch.autocast(inputs.edge_index.device.type, dtype=autocast_dtype) if autocast_dtype else nullcontext()
    with autocast:
        out = forward(module, case, inputs)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device)
    (out.float() * weights).sum().backward()
    return StepResult(
        out.detach().float(),
        [t.grad for t in leaves],
        {name: p.grad for name, p in getattr(module, "_orig_mod", module).named_parameters()},  # torch.compile's too
    )


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected||, in float64."""
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    assert torch.isfinite(actual).all(), "non-finite values"
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def assert_steps_match(actual: StepResult, expected: StepResult, tol: float) -> None:
    """Output, input gradients and every parameter's gradient within ``tol`` (norm-wise relative error).

    A gradient that is zero in exact arithmetic (the key projection's bias without a QK norm: a shift of
    every score of a destination, which its softmax ignores) holds rounding noise only; there both sides must
    be below ZERO_GRADIENT of the largest gradient's norm instead.
    """
    assert actual.output.shape == expected.output.shape
    assert rel_error(actual.output, expected.output) <= tol, rel_error(actual.output, expected.output)
    expected_grads = {f"input {i}": g for i, g in enumerate(expected.input_grads)} | expected.param_grads
    actual_grads = {f"input {i}": g for i, g in enumerate(actual.input_grads)} | actual.param_grads
    assert actual_grads.keys() == expected_grads.keys()
    largest = max(g.double().norm().item() for g in expected_grads.values() if g is not None)
    for name, e in expected_grads.items():
        a = actual_grads[name]
        assert (a is None) == (e is None), f"{name}: gradient presence differs"
        if e is None:
            continue
        if e.double().norm().item() < ZERO_GRADIENT * largest:
            assert a.double().norm().item() < ZERO_GRADIENT * largest, f"{name}: gradient should be ~0"
        else:
            assert rel_error(a, e) <= tol, f"{name}: gradient error {rel_error(a, e):.2e}"


def make_provider(kind: str, seed: int = 2, trainable_size: int = 0):
    """Anemoi's StaticGraphProvider over a random graph of GRAPH_SIZES[kind] (it sorts the edges by destination),
    with ``trainable_size`` trainable parameters per edge appended to its attributes."""
    from anemoi.models.layers.graph_provider import StaticGraphProvider
    from torch_geometric.data import HeteroData

    num_src, num_dst = GRAPH_SIZES[kind]
    generator = torch.Generator().manual_seed(seed)
    edge_index = random_edges(num_src, num_dst, generator)
    graph = HeteroData()
    graph["edge_index"] = edge_index[:, torch.randperm(edge_index.shape[1], generator=generator)]
    graph["edge_attr"] = torch.randn(edge_index.shape[1], EDGE_DIM, generator=generator)
    return StaticGraphProvider(graph, ["edge_attr"], num_src, num_dst, trainable_size=trainable_size)


class ProviderModel(nn.Module):
    """A module wired as Anemoi's models wire theirs: its edges from a StaticGraphProvider every step."""

    def __init__(self, case: Case, provider: nn.Module, module: nn.Module):
        super().__init__()
        self.case, self.provider, self.module = case, provider, module

    def forward(self, x: tuple[torch.Tensor, ...]) -> torch.Tensor:
        edge_attr, edge_index, edge_shard_sizes = self.provider.get_edges(batch_size=self.case.batch)
        inputs = Inputs(x, edge_attr, edge_index, self.case.batch)
        if self.case.kind == "processor":
            shard_info = GraphShardInfo(edges=edge_shard_sizes)
            return self.module(x[0], self.case.batch, shard_info, edge_attr=edge_attr, edge_index=edge_index)
        return forward(self.module, self.case, inputs)
