"""gtnorm in Anemoi: an Anemoi graph-transformer processor built from a model-config entry whose ``_target_``
names gtnorm's drop-in, loaded from a checkpoint of Anemoi's own processor, and one training step.

On a GPU: the level-6 processor graph of benchmarks/graphs (40,962 nodes; built and cached on first use),
Anemoi's sizes (1024 channels, 16 heads), fp16 autocast. On a CPU: a tiny graph, fp32, gtnorm's kernels
through the Triton interpreter (Anemoi's own blocks log that they fall back to PyG there: gtnorm's do not).
Needs anemoi-models (docs/anemoi.md, "Installing").

    python examples/anemoi_processor.py
"""

import os
import sys
import time
from pathlib import Path

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before gtnorm's kernels are first defined

from anemoi.models.distributed.shapes import GraphShardInfo  # noqa: E402
from anemoi.models.layers.processor import GraphTransformerProcessor as AnemoiProcessor  # noqa: E402
from hydra.utils import instantiate  # noqa: E402

import gtnorm.anemoi  # noqa: E402, F401  (fails with install instructions if anemoi-models is missing)

device = torch.device("cuda" if ON_GPU else "cpu")
torch.manual_seed(0)

# The processor entry of an Anemoi model config; switching to gtnorm changes only the _target_.
processor_config = {
    "_target_": "gtnorm.anemoi.GraphTransformerProcessor",  # Anemoi: ...layers.processor.GraphTransformerProcessor
    "num_layers": 2,
    "num_chunks": 1,
    "num_channels": 1024 if ON_GPU else 32,
    "num_heads": 16 if ON_GPU else 4,
    "mlp_hidden_ratio": 4.0,
    "edge_dim": 3,
    "qk_norm": True,  # Anemoi's default QueryNorm / KeyNorm: LayerNorm without bias, fused into the kernels
    "layer_kernels": {},
    "graph_attention_backend": "triton",
}

if ON_GPU:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's benchmarks package
    from benchmarks.graphs.catalog import load_graph

    graph = load_graph("h_to_h", verbose=True)
    edge_index, num_nodes = graph.edge_index, graph.num_dst  # [2, M], sorted by destination
else:
    num_nodes = 16
    dst = torch.arange(num_nodes).repeat_interleave(4)  # every node receives 4 neighbours
    edge_index = torch.stack([torch.randint(0, num_nodes, dst.shape), dst])  # [2, M]: source, destination
edge_index = edge_index.to(device)

# A "checkpoint" of Anemoi's own processor loads into gtnorm's as it is: same state_dict keys.
anemoi_config = processor_config | {"_target_": "anemoi.models.layers.processor.GraphTransformerProcessor"}
anemoi_processor = instantiate(anemoi_config).to(device)
processor = instantiate(processor_config).to(device)
processor.load_state_dict(anemoi_processor.state_dict(), strict=True)
assert isinstance(processor, AnemoiProcessor)

channels = processor_config["num_channels"]
x = torch.randn(num_nodes, channels, device=device, requires_grad=True)  # [N, channels]: the hidden state
edge_attr = torch.randn(edge_index.shape[1], 3, device=device, requires_grad=True)  # [M, edge_dim]
optimizer = torch.optim.AdamW(processor.parameters(), lr=1e-4)


def training_step() -> float:
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.float16, enabled=ON_GPU):
        out = processor(x, 1, GraphShardInfo(), edge_attr=edge_attr, edge_index=edge_index)  # [N, channels]
    loss = out.float().square().mean()
    loss.backward()
    optimizer.step()
    return loss.item()


if ON_GPU:
    training_step()  # the first call compiles the kernels and builds the graph's layout
    torch.cuda.synchronize()
start = time.perf_counter()
loss = training_step()
if ON_GPU:
    torch.cuda.synchronize()
print(
    f"{'GPU' if ON_GPU else 'CPU (Triton interpreter)'}: processor of {processor_config['num_layers']} layers on "
    f"{num_nodes:,} nodes / {edge_index.shape[1]:,} edges; training step {1e3 * (time.perf_counter() - start):.1f} "
    f"ms, loss {loss:.4f}"
)
assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in processor.parameters())
print("ok: a training step of Anemoi's processor on gtnorm's fused attention")
