"""Small test graphs (edge_index [2, M], row 0 = source, row 1 = destination) of the kinds gtnorm serves,
random inputs on them, and the error measure the tests compare results with.

Sizes stay small on the CPU, where the kernels run through the Triton interpreter; ``scale`` grows them on
a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tests.conftest import HAS_CUDA


@dataclass(frozen=True)
class SmallGraph:
    name: str
    edge_index: torch.Tensor  # [2, M]
    num_src: int
    num_dst: int


def _ring_neighbours(n_src: int, n_dst: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """Each destination receives k sources around its position on a ring (jittered): local, like a mesh."""
    dst = torch.arange(n_dst).repeat_interleave(k)
    centre = (torch.arange(n_dst) * n_src) // max(n_dst, 1)
    offsets = torch.randint(-k, k + 1, (n_dst * k,), generator=generator)
    src = (centre.repeat_interleave(k) + offsets) % n_src
    return torch.stack([src, dst])


def random_bipartite(scale: int, generator: torch.Generator) -> SmallGraph:
    """Random edges; the last destinations and sources take part in none (zero in- and out-degree)."""
    n_src, n_dst, m = 23 * scale, 17 * scale, 70 * scale
    src = torch.randint(0, n_src - 3, (m,), generator=generator)
    dst = torch.randint(0, n_dst - 4, (m,), generator=generator)
    return SmallGraph("random_bipartite", torch.stack([src, dst]), n_src, n_dst)


def encoder_like(scale: int, generator: torch.Generator) -> SmallGraph:
    """Many data nodes into few hidden nodes, varying in-degree (2 to 12)."""
    n_src, n_dst = 64 * scale, 12 * scale
    parts = [_ring_neighbours(n_src, n_dst, k, generator) for k in (2, 5, 12)]
    edge_index = torch.cat(parts, dim=1)[:, : 3 * n_dst * 6]
    return SmallGraph("encoder_like", edge_index, n_src, n_dst)


def decoder_like(scale: int, generator: torch.Generator) -> SmallGraph:
    """Each data node receives its 3 nearest hidden nodes."""
    n_src, n_dst = 12 * scale, 40 * scale
    return SmallGraph("decoder_like", _ring_neighbours(n_src, n_dst, 3, generator), n_src, n_dst)


def processor_like(scale: int, generator: torch.Generator) -> SmallGraph:
    """Square graph with self-loops and duplicate edges, edges in a shuffled order."""
    n = 20 * scale
    ring = _ring_neighbours(n, n, 4, generator)
    loops = torch.arange(n).repeat(2, 1)
    duplicates = ring[:, : n // 2]
    edge_index = torch.cat([ring, loops, duplicates], dim=1)
    edge_index = edge_index[:, torch.randperm(edge_index.shape[1], generator=generator)]
    return SmallGraph("processor_like", edge_index, n, n)


GRAPH_BUILDERS = {f.__name__: f for f in (random_bipartite, encoder_like, decoder_like, processor_like)}
GRAPH_SCALE = 40 if HAS_CUDA else 1


def draw_seed() -> int:
    """A seed for a generator of its own, drawn from torch's global one (which tests/conftest.py seeds per test and
    names in a failure's report). Not ``torch.seed()``: that reseeds the global generator from the OS, and every
    draw after it could not be repeated."""
    return int(torch.randint(2**31, ()).item())


def make_graph(name: str, seed: int | None = None, scale: int = GRAPH_SCALE) -> SmallGraph:
    generator = torch.Generator().manual_seed(seed if seed is not None else draw_seed())
    return GRAPH_BUILDERS[name](scale, generator)


def random_inputs(
    graph: SmallGraph, heads: int, channels: int, *, edge_attr=True, norm_weights=False, norm_biases=False
) -> dict:
    """Fresh float64 CPU tensors: query [N_dst, H, C], key and value [N_src, H, C], edge_attr [M, H, C] (None
    without), with ``norm_weights`` the norm weights q_norm_weight / k_norm_weight [C], far from 1 on purpose (a
    kernel that ignored them would pass with ones), and with ``norm_biases`` the LayerNorm biases q_norm_bias /
    k_norm_bias [C], far from 0."""
    n_edges = graph.edge_index.shape[1]
    inputs = {
        "query": torch.randn(graph.num_dst, heads, channels, dtype=torch.float64),
        "key": torch.randn(graph.num_src, heads, channels, dtype=torch.float64),
        "value": torch.randn(graph.num_src, heads, channels, dtype=torch.float64),
        "edge_attr": torch.randn(n_edges, heads, channels, dtype=torch.float64) if edge_attr else None,
    }
    if norm_weights:
        inputs["q_norm_weight"] = 1.0 + 0.5 * torch.randn(channels, dtype=torch.float64)
        inputs["k_norm_weight"] = 1.0 + 0.5 * torch.randn(channels, dtype=torch.float64)
    if norm_biases:
        inputs["q_norm_bias"] = 0.5 * torch.randn(channels, dtype=torch.float64)
        inputs["k_norm_bias"] = 0.5 * torch.randn(channels, dtype=torch.float64)
    return inputs


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64; a non-finite value (an unwritten output) fails."""
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    assert torch.isfinite(actual).all(), "non-finite values (unwritten output?)"
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def key_bias_error(actual: torch.Tensor, expected: torch.Tensor, key_grad: torch.Tensor) -> float:
    """The error of a key norm's bias gradient. Adding one vector to every key shifts each destination's scores
    by one constant, which the softmax ignores, so that gradient is 0 in exact arithmetic and what is left is
    rounding (a relative error would divide by ~0). It is measured against the key gradient [N_src, H, C]
    instead, times sqrt(N_src): the bias gradient sums N_src rows of the same size."""
    error = (actual.detach().double().cpu() - expected.detach().double().cpu()).norm().item()
    assert torch.isfinite(actual).all(), "non-finite values (unwritten output?)"
    return error / (key_grad.detach().double().cpu().norm().item() * max(1, key_grad.shape[0]) ** 0.5)


# Past 2**31 elements: node rows of 16 heads x 64 channels (1024 elements) pass it from 2**31 / 1024 = 2,097,152.
ROWS_PAST_INT32_AT_1024 = 2_200_000


def ring_with_tail(num_src: int, num_dst: int, tail: int, device) -> torch.Tensor:
    """[2, M] sorted by destination: source i sends to destination i % num_dst (every source has an edge, so the
    last source rows are read), and the last ``tail`` destinations also receive an edge from each of the last
    ``tail`` sources. The edges with the highest ids are those into the last destinations."""
    src = torch.arange(num_src, device=device)
    last_dst = torch.arange(num_dst - tail, num_dst, device=device).repeat_interleave(tail)
    last_src = torch.arange(num_src - tail, num_src, device=device).repeat(tail)
    edge_index = torch.stack([torch.cat([src, last_src]), torch.cat([src % num_dst, last_dst])])
    return edge_index[:, torch.sort(edge_index[1], stable=True).indices]


@dataclass(frozen=True)
class Selection:
    """A few destinations and the part of the graph they see: what a reference computes on instead of the whole
    graph, when the loss reads only those destinations' outputs (then only their edges and the sources they
    read get gradients)."""

    dst: torch.Tensor  # [S] destination ids, unique
    edges: torch.Tensor  # [E] ids of the edges into them
    src: torch.Tensor  # [U] the sources of those edges, unique
    local_edge_index: torch.Tensor  # [2, E]: those edges in the numbering of src and dst

    @classmethod
    def of(cls, edge_index: torch.Tensor, num_dst: int, dst: torch.Tensor) -> Selection:
        position = torch.full((num_dst,), -1, dtype=torch.long, device=edge_index.device)
        position[dst] = torch.arange(dst.numel(), device=dst.device)
        edges = torch.nonzero(position[edge_index[1]] >= 0).flatten()
        src, local_src = torch.unique(edge_index[0, edges], return_inverse=True)
        return cls(dst, edges, src, torch.stack([local_src, position[edge_index[1, edges]]]))


def last_and_random(num: int, last: int, random: int, extra: torch.Tensor | None = None) -> torch.Tensor:
    """The last ``last`` ids of ``num``, ``random`` others (from torch's global generator) and ``extra``, unique."""
    parts = [torch.arange(num - last, num), torch.randperm(num - last)[:random]]
    return torch.unique(torch.cat(parts + ([extra.cpu()] if extra is not None else [])))
