"""gtnorm's attention over two processes, split by heads (gtnorm.distributed): each process holds a block of the
nodes and edges, the attention runs on half the heads each, and the result is checked against one process.

    python examples/head_parallel.py                        # CPU: spawns 2 processes (gloo, Triton interpreter)
    torchrun --nproc_per_node 2 examples/head_parallel.py   # 2 GPUs (NCCL)
"""

import os
import socket

import torch

if not torch.cuda.is_available():  # the interpreter is chosen when the kernels are first defined: set it first
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import gtnorm  # noqa: E402
from gtnorm.distributed import HeadParallelPlan, balanced_split, head_parallel_attention  # noqa: E402


def run(rank: int, world: int) -> None:
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # the same graph and inputs on every process
    heads, channels, num_src, num_dst = 4, 16, 30, 20
    dst = torch.arange(num_dst).repeat_interleave(5)
    edge_index = torch.stack([torch.randint(0, num_src, (dst.numel(),)), dst]).to(device)  # [2, M]
    layout = gtnorm.GraphLayout.from_edge_index(edge_index, (num_src, num_dst))  # the whole graph, on every rank

    def rand(*shape):
        return torch.randn(*shape, device=device, requires_grad=True)

    query, key, value = rand(num_dst, heads, channels), rand(num_src, heads, channels), rand(num_src, heads, channels)
    edge_attr = rand(layout.num_edges, heads, channels)  # [M, H, C]
    q_weight, k_weight = rand(channels), rand(channels)  # RMSNorm weights, shared by the heads

    # This process's rows: consecutive blocks, rank 0's first (any split works; the plan records it).
    def mine(t):
        sizes = balanced_split(len(t), world)
        return t[sum(sizes[:rank]) : sum(sizes[: rank + 1])]

    # Once per graph: one all_gather checks that the processes agree (else the same ValueError on all).
    plan = HeadParallelPlan.build(
        layout,
        dst_rows=len(mine(query)),
        src_rows=len(mine(key)),
        edge_rows=len(mine(edge_attr)),
        heads=heads,
        channels=channels,
    )
    out = head_parallel_attention(
        mine(query), mine(key), mine(value), mine(edge_attr), layout, plan,
        qk_norm="rms", q_norm_weight=q_weight, k_norm_weight=k_weight,
    )  # fmt: skip  # [this rank's destination rows, H, C]
    out.square().sum().backward()  # the processes' losses add up to the whole output's
    parallel = (out.detach(), mine(query.grad), q_weight.grad)  # the norm weight's gradient: whole on every rank

    for t in (query, key, value, edge_attr, q_weight, k_weight):
        t.grad = None
    whole = gtnorm.graph_transformer_attention(
        query, key, value, edge_attr, layout, qk_norm="rms", q_norm_weight=q_weight, k_norm_weight=k_weight
    )
    whole.square().sum().backward()
    single = (mine(whole.detach()), mine(query.grad), q_weight.grad)
    for name, a, b in zip(("out", "d query", "d q_norm weight"), parallel, single, strict=True):
        print(f"rank {rank}: {name} relative error {((a - b).norm() / b.norm()).item():.1e}")
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name


def spawned(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    run(rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        run(dist.get_rank(), dist.get_world_size())
        dist.destroy_process_group()
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(spawned, args=(2, port), nprocs=2)
