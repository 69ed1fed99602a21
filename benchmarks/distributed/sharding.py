"""Anemoi's processor / encoder / decoder driven as Anemoi's model drives them under model sharding, and the
reduction Anemoi's training applies to their parameter gradients. Shared by benchmarks/distributed/run.py and
tests/distributed/.

What the model does (anemoi/models/models/encoder_processor_decoder.py, anemoi-models 0.19): the hidden nodes
are sharded over the model group in balanced parts and stay sharded from the encoder's output to the decoder's
input; the data nodes are replicated; every graph provider shards its edges by destination
(``shard_edges_1hop``) before the module sees them; the batch size is 1. Each rank then takes the same loss of
the decoder's whole output.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from anemoi.models.distributed.graph import gather_tensor, shard_tensor
from anemoi.models.distributed.khop_edges import shard_edges_1hop
from anemoi.models.distributed.shapes import BipartiteGraphShardInfo, GraphShardInfo, get_shard_sizes
from torch import Tensor, nn


def sharded_processor(module: nn.Module, x_local: Tensor, nodes: list[int], edge_attr, edge_index, group) -> Tensor:
    """The processor on this rank's hidden nodes ``x_local`` [nodes[rank], C] (of all ``nodes``), the whole
    graph's edges ``edge_attr`` [M, E] / ``edge_index`` [2, M] given; returns this rank's nodes [nodes[rank], C]."""
    num_nodes = sum(nodes)
    edge_attr, edge_index, edges = shard_edges_1hop(edge_attr, edge_index, num_nodes, num_nodes, group)
    shard_info = GraphShardInfo(nodes=nodes, edges=edges)
    return module(x_local, 1, shard_info, edge_attr=edge_attr, edge_index=edge_index, model_comm_group=group)


def sharded_encoder(module: nn.Module, x_data: Tensor, x_hidden_local: Tensor, hidden: list[int], edge_attr,
                    edge_index, group) -> Tensor:  # fmt: skip
    """The encoder from the replicated data nodes ``x_data`` [N_data, F] into this rank's hidden nodes
    ``x_hidden_local`` [hidden[rank], F_h]; returns their new state [hidden[rank], C], kept sharded."""
    edge_attr, edge_index, edges = shard_edges_1hop(edge_attr, edge_index, len(x_data), sum(hidden), group)
    shard_info = BipartiteGraphShardInfo(src_nodes=None, dst_nodes=hidden, edges=edges)
    _, out = module(
        (x_data, x_hidden_local), 1, shard_info, edge_attr, edge_index, model_comm_group=group, keep_x_dst_sharded=True
    )
    return out


def sharded_decoder(module: nn.Module, x_hidden_local: Tensor, hidden: list[int], x_data: Tensor, edge_attr,
                    edge_index, group) -> Tensor:  # fmt: skip
    """The decoder from this rank's hidden nodes [hidden[rank], C] to the replicated data nodes ``x_data``
    [N_data, F_d]; returns the whole output [N_data, F_out] on every rank."""
    edge_attr, edge_index, edges = shard_edges_1hop(edge_attr, edge_index, sum(hidden), len(x_data), group)
    shard_info = BipartiteGraphShardInfo(src_nodes=hidden, dst_nodes=None, edges=edges)
    return module((x_hidden_local, x_data), 1, shard_info, edge_attr, edge_index, model_comm_group=group)


def sharded_module_output(module: nn.Module, kind: str, x: tuple[Tensor, ...], edge_attr, edge_index, group) -> Tensor:
    """One module alone, its whole inputs given on every rank (hidden nodes sharded here, as the model shards
    them), its whole output returned on every rank (the hidden nodes gathered)."""
    hidden_input = x[0] if kind == "processor" else (x[1] if kind == "encoder" else x[0])
    hidden = get_shard_sizes(hidden_input, 0, group)
    hidden_local = shard_tensor(hidden_input, 0, hidden, group)
    if kind == "processor":
        return gather_tensor(
            sharded_processor(module, hidden_local, hidden, edge_attr, edge_index, group), 0, hidden, group
        )
    if kind == "encoder":
        out = sharded_encoder(module, x[0], hidden_local, hidden, edge_attr, edge_index, group)
        return gather_tensor(out, 0, hidden, group)
    return sharded_decoder(module, hidden_local, hidden, x[1], edge_attr, edge_index, group)


def reduce_gradients_as_anemoi(module: nn.Module, group) -> None:
    """What anemoi-training does to the parameter gradients of a model sharded over ``group``: every gradient
    is multiplied by the group's size (``register_gradient_scaling_hooks``: each rank saw only part of the
    graph), then DDP averages it over all ranks. With one model group (no data parallelism besides) this sums
    the ranks' partial gradients. In place; one all_reduce over the flattened gradients."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1).float() for g in grads]) * group.size()
    dist.all_reduce(flat)  # DDP's reduction runs over every rank, not only the model group
    flat /= dist.get_world_size()
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))
