"""Scale-out plan on paper: time and memory per GPU of one training step of Anemoi's encoder / processor /
decoder with gtnorm's blocks, sharded over 1-16 GPUs, for O1280 <-> level 8 and O2560 <-> level 9.

    python -m benchmarks.distributed.scale_out                  # O320 (check), O1280, O2560; prints markdown
    python -m benchmarks.distributed.scale_out --targets 1280   # O1280 <-> r8 only

How (benchmarks/NOTES.md, "Scale-out plan", says why):
- The graphs are built (benchmarks/graphs: same rules as the benchmark graphs) and partitioned as Anemoi 0.19
  partitions them: destination nodes in balanced contiguous index blocks, each with its incoming edges; the
  processor's "edges" strategy adds a halo of source nodes, the mappers use every source their edges touch.
  Two hidden-node orders: the mesh's own (coarse levels first, as refinement appends nodes) and a locality
  order (hidden nodes renumbered along a Morton curve of latitude / longitude).
- Time and memory per GPU come from the H100 measurements of one module on the whole level-6 graph
  (benchmarks/NOTES.md v6: gtnorm, LayerNorm QK norm, bf16, gradient checkpointing), split into
  a part per destination node, per source node and per edge, and scaled by each GPU's share.
- Communication: bytes each GPU sends per step over an assumed all-to-all bandwidth per GPU.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.graphs import grids
from benchmarks.graphs.catalog import GraphSpec, build_edges, resolve_cache_dir

KINDS = ("encoder", "processor", "decoder")
GPUS = (1, 2, 4, 8, 16)
TARGETS = {320: 6, 1280: 8, 2560: 9}  # octahedral grid N -> icosahedron level

# The model: Anemoi's defaults for its graph transformer (benchmarks/anemoi/run.py ModelSpec), with the
# processor depth of AIFS (16 layers) instead of the benchmark's 2.
CHANNELS, HEADS, MLP_RATIO, DATA_VARS, PROCESSOR_LAYERS = 1024, 16, 4, 100, 16
# Multiply-accumulates per row of one module's dense layers (forward), in millions: a destination row runs
# lin_query, lin_self, projection and the MLP; a source row lin_key and lin_value (the encoder's also its
# 100 -> 1024 embedding, the decoder's destination row also its 1024 -> 100 output layer).
_SQ = CHANNELS * CHANNELS / 1e6
DST_MMAC = {"encoder": 3 * _SQ + 2 * MLP_RATIO * _SQ, "processor": 3 * _SQ + 2 * MLP_RATIO * _SQ}
DST_MMAC["decoder"] = DST_MMAC["encoder"] + CHANNELS * DATA_VARS / 1e6
SRC_MMAC = {"encoder": 2 * _SQ + DATA_VARS * CHANNELS / 1e6, "processor": 2 * _SQ, "decoder": 2 * _SQ}

# H100 (benchmarks/NOTES.md v6), gtnorm, LayerNorm QK norm, bf16, one module on the level-6
# graph, batch 1, checkpointing on: training step ms and extra peak MiB (anemoi-bf16/results.json; the
# processor's are of 2 layers); attention kernel ms per call, forward + (forward + backward) for the
# checkpoint's recomputation (results.json, variant fused_layer). Graph sizes (N_src, N_dst, M) of r6.
MEASURED_MS = {"encoder": 54.59, "processor": 34.82 / 2, "decoder": 152.78}
MEASURED_MIB = {"encoder": 10831.0, "processor": 5183.0, "decoder": 23855.0}
KERNEL_MS = {"encoder": 1.153 + 4.753, "processor": 0.498 + 2.284, "decoder": 2.251 + 8.354}
R6_SIZES = {
    "encoder": (421120, 40962, 662072),
    "processor": (40962, 40962, 327660),
    "decoder": (40962, 421120, 1263360),
}
# Bytes of activations per row kept at a module's peak (weights to split the measured peak among rows):
# a destination row holds ~10 tensors of CHANNELS and 3 of the MLP's width in bf16, a source row its key,
# value and normalised input, an edge its features and their gradient (bf16) and the kernels' per-head floats.
MEM_BYTES = {
    "dst": (10 * CHANNELS + 3 * MLP_RATIO * CHANNELS) * 2,
    "src": 3 * CHANNELS * 2,
    "edge": 4 * CHANNELS + 8 * HEADS,
}
PARAMS = PROCESSOR_LAYERS * (5 + 2 * MLP_RATIO) * _SQ * 1e6 + 2 * (5 + 2 * MLP_RATIO) * _SQ * 1e6
STATE_BYTES_PER_PARAM = 16  # fp32 weight, gradient and Adam's two moments: replicated on every GPU
LAYOUT_BYTES_PER_EDGE = 56  # edge_index (2 x int64) + gtnorm's two edge walks (5 x int32 each)
RESIDUAL_BYTES = 4 * CHANNELS  # a hidden node's float32 state: the processor's checkpoints, halo rows
# Assumed all-to-all bandwidth per GPU (bytes out): NVLink within a node of 8; InfiniBand (one 400 Gb/s link
# per GPU) for the peers on another node.
NVLINK_BPS, IB_BPS, GPUS_PER_NODE = 300e9, 45e9, 8
PASSES = 3  # forward, the checkpoint's recomputation, backward
GIB = 2**30


@dataclass
class Graph:
    kind: str
    edge_index: torch.Tensor  # [2, M]
    num_src: int
    num_dst: int

    @property
    def num_edges(self) -> int:
        return self.edge_index.shape[1]


def load(kind: str, grid: int, level: int) -> Graph:
    spec = GraphSpec(kind="processor", level=level) if kind == "processor" else GraphSpec(kind, level, grid)
    path = resolve_cache_dir() / f"plan-{kind}-{spec.cache_key()}.pt"
    if path.is_file():
        stored = torch.load(path, weights_only=True)
    else:
        edge_index, num_src, num_dst = build_edges(spec)
        stored = {"edge_index": torch.from_numpy(np.ascontiguousarray(edge_index, dtype=np.int64))}
        stored |= {"num_src": num_src, "num_dst": num_dst}
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(stored, path)
    return Graph(kind, stored["edge_index"], stored["num_src"], stored["num_dst"])


def locality_order(level: int) -> torch.Tensor:
    """[N] new index of each hidden node: renumbered along a Morton (Z-order) curve of latitude / longitude."""
    xyz = grids.icosahedral_mesh(level).vertices
    lat = np.arcsin(np.clip(xyz[:, 2], -1, 1))
    lon = np.arctan2(xyz[:, 1], xyz[:, 0])
    bits = 16
    y = ((lat / np.pi + 0.5) * (2**bits - 1)).astype(np.int64)
    x = ((lon / (2 * np.pi) + 0.5) * (2**bits - 1)).astype(np.int64)
    code = np.zeros_like(x)
    for b in range(bits):
        code |= ((x >> b) & 1) << (2 * b) | ((y >> b) & 1) << (2 * b + 1)
    new_index = np.empty(len(code), dtype=np.int64)
    new_index[np.argsort(code, kind="stable")] = np.arange(len(code))
    return torch.from_numpy(new_index)


def balanced(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + 1 if r < extra else base for r in range(parts)]


@dataclass
class Share:
    """The largest per-GPU share of a module's rows under the "edges" strategy."""

    dst: int
    src: int  # source rows a GPU computes keys and values for (processor: its own nodes and the halo)
    edges: int
    halo: int  # processor: source rows received from other GPUs


class EdgePartition:
    """A module's graph as Anemoi's "edges" strategy partitions it, for any number of GPUs: edges sorted by
    destination (after renumbering the hidden nodes along ``hidden_order``, if given)."""

    def __init__(self, graph: Graph, hidden_order: torch.Tensor | None):
        src, dst = graph.edge_index
        if hidden_order is not None:
            if graph.kind in ("processor", "encoder"):
                dst = hidden_order[dst]
            if graph.kind in ("processor", "decoder"):
                src = hidden_order[src]
        order = torch.argsort(dst, stable=True)
        self.src, self.dst, self.graph = src[order], dst[order], graph

    def worst_share(self, gpus: int) -> Share:
        """The largest per-GPU rows (each count's maximum over the GPUs)."""
        bounds = torch.tensor([0, *balanced(self.graph.num_dst, gpus)]).cumsum(0)
        cuts = torch.searchsorted(self.dst, bounds).tolist()
        worst = Share(0, 0, 0, 0)
        for rank in range(gpus):
            used = self.src[cuts[rank] : cuts[rank + 1]].unique()
            own = int(bounds[rank + 1] - bounds[rank])
            if self.graph.kind == "processor":
                halo = int(((used < bounds[rank]) | (used >= bounds[rank + 1])).sum())
                share = Share(own, own + halo, cuts[rank + 1] - cuts[rank], halo)
            else:
                share = Share(own, used.numel(), cuts[rank + 1] - cuts[rank], 0)
            worst = Share(*(max(a, b) for a, b in zip(vars(worst).values(), vars(share).values(), strict=True)))
        return worst


def head_shares(graph: Graph, gpus: int) -> Share:
    """ "heads": every row set split evenly (the attention sees all rows of a 1/gpus share of the heads)."""
    return Share(math.ceil(graph.num_dst / gpus), math.ceil(graph.num_src / gpus), math.ceil(graph.num_edges / gpus), 0)


def module_ms(kind: str, share: Share) -> float:
    """One module (one processor layer) on one GPU's share, from the H100 measurement of the whole r6 graph."""
    n_src, n_dst, m = R6_SIZES[kind]
    dense_ms = MEASURED_MS[kind] - KERNEL_MS[kind]
    dense_per_mmac = dense_ms / (n_dst * DST_MMAC[kind] + n_src * SRC_MMAC[kind])
    return (
        dense_per_mmac * (share.dst * DST_MMAC[kind] + share.src * SRC_MMAC[kind]) + KERNEL_MS[kind] * share.edges / m
    )


def module_gib(kind: str, share: Share) -> float:
    n_src, n_dst, m = R6_SIZES[kind]

    def weight(d, s, e):
        return d * MEM_BYTES["dst"] + s * MEM_BYTES["src"] + e * MEM_BYTES["edge"]

    measured = MEASURED_MIB[kind] * 2**20 / GIB
    if kind == "processor":
        measured /= 2  # two layers measured: one layer's peak (their checkpoints are counted apart)
    return measured * weight(share.dst, share.src, share.edges) / weight(n_dst, n_src, m)


def alltoall_seconds(bytes_out: float, gpus: int) -> float:
    """Time to send ``bytes_out`` from one GPU spread evenly over its peers."""
    if gpus == 1:
        return 0.0
    peers_off_node = max(0, gpus - GPUS_PER_NODE)
    on_node = bytes_out * (min(gpus, GPUS_PER_NODE) - 1) / (gpus - 1)
    off_node = bytes_out * peers_off_node / (gpus - 1)
    return max(on_node / NVLINK_BPS, off_node / IB_BPS) if off_node else on_node / NVLINK_BPS


@dataclass
class Estimate:
    ms: float  # compute + communication, not overlapped
    comm_ms: float
    gib: float
    halo: int  # processor halo rows per GPU


def estimate(graphs: dict, gpus: int, strategy: str, partitions: dict | None, in_out_sharded: bool) -> Estimate:
    """``partitions``: kind -> EdgePartition for the "edges" strategy, None for "heads"."""
    if strategy == "heads":
        shares = {kind: head_shares(g, gpus) for kind, g in graphs.items()}
    else:
        shares = {kind: partitions[kind].worst_share(gpus) for kind in KINDS}
    compute_ms = sum(module_ms(k, shares[k]) * (PROCESSOR_LAYERS if k == "processor" else 1) for k in KINDS)
    n_hidden, n_data = graphs["processor"].num_dst, graphs["encoder"].num_src
    frac_out = (gpus - 1) / gpus
    if strategy == "heads":
        # q, k, v, edge features in and the output back, bf16, per attention block and pass.
        rows = {k: 2 * g.num_dst + 2 * g.num_src + g.num_edges for k, g in graphs.items()}
        per_step = rows["encoder"] + rows["decoder"] + PROCESSOR_LAYERS * rows["processor"]
        bytes_out = PASSES * per_step * 2 * CHANNELS / gpus * frac_out
    else:
        # Processor: each layer's halo rows (float32); decoder: the hidden state gathered on every GPU, its
        # gradient all-reduced (~2x).
        halo_bytes = PROCESSOR_LAYERS * PASSES * shares["processor"].halo * RESIDUAL_BYTES
        bytes_out = halo_bytes + (PASSES + 1) * n_hidden * RESIDUAL_BYTES * frac_out
    bytes_out += 2 * PARAMS * 4 * frac_out  # the gradients' all-reduce (DDP)
    comm_ms = 1e3 * alltoall_seconds(bytes_out, gpus)

    data_rows = math.ceil(n_data / gpus) if in_out_sharded else n_data
    fixed = PARAMS * STATE_BYTES_PER_PARAM + 3 * data_rows * DATA_VARS * 4  # input, output, its gradient
    if strategy == "heads":
        fixed += sum(g.num_edges for g in graphs.values()) * LAYOUT_BYTES_PER_EDGE  # whole graphs on every GPU
    else:
        fixed += sum(shares[k].edges for k in KINDS) * LAYOUT_BYTES_PER_EDGE
    hidden_rows = shares["processor"].dst
    checkpoints = (PROCESSOR_LAYERS + 2) * hidden_rows * RESIDUAL_BYTES
    if strategy != "heads":
        checkpoints += n_hidden * RESIDUAL_BYTES  # the decoder's gathered hidden state
    peak = max(module_gib(k, shares[k]) for k in KINDS)
    gib = fixed / GIB + checkpoints / GIB + peak
    return Estimate(compute_ms + comm_ms, comm_ms, gib, shares["processor"].halo)


def table(grid: int, level: int) -> str:
    graphs = {kind: load(kind, grid, level) for kind in KINDS}
    as_built = {kind: EdgePartition(g, None) for kind, g in graphs.items()}
    order = locality_order(level)
    local = {kind: EdgePartition(g, order) for kind, g in graphs.items()}
    g = graphs
    lines = [
        f"### O{grid} -> r{level} -> O{grid}: {g['encoder'].num_src:,} data nodes, {g['processor'].num_dst:,} hidden "
        f"nodes; edges: encoder {g['encoder'].num_edges:,}, processor {g['processor'].num_edges:,}, decoder "
        f"{g['decoder'].num_edges:,}",
        "",
        "| GPUs | edges, as configured: ms / comm ms / GiB / halo rows | edges, locality order, data sharded | heads, "
        "data sharded: ms / comm ms / GiB |",
        "|---|---|---|---|",
    ]
    for gpus in GPUS:
        cells = [
            estimate(graphs, gpus, "edges", as_built, in_out_sharded=False),
            estimate(graphs, gpus, "edges", local, in_out_sharded=True),
            estimate(graphs, gpus, "heads", None, in_out_sharded=True),
        ]
        text = [
            f"{e.ms:,.0f} / {e.comm_ms:,.0f} / {e.gib:,.1f}" + (f" / {e.halo:,}" if i < 2 else "")
            for i, e in enumerate(cells)
        ]
        lines.append(f"| {gpus} | " + " | ".join(text) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", type=int, choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    text = "\n".join(table(grid, TARGETS[grid]) for grid in args.targets)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
