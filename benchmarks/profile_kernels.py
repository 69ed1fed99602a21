"""Developer tool: one forward+backward per graph (qk_norm with affine weights, then off) between
cudaProfilerStart/Stop, for Nsight Compute to read the attention kernels' hardware counters.

    ncu --profile-from-start off --clock-control none -k regex:"graph_attention|edge_softmax" \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__inst_executed.sum \\
        python -m benchmarks.profile_kernels era_to_h h_to_h h_to_era dop_enc_large

Each graph warms up (compiles) outside the profiled range. How benchmarks/NOTES.md's v4 counters were taken.
"""

from __future__ import annotations

import argparse

import torch

import gtnorm
from benchmarks.graphs.catalog import load_graph


def _fwd_bwd(inputs, weights, layout, grad_out, qk_norm: bool) -> None:
    for t in (*inputs, *weights):
        t.grad = None
    norm = dict(qk_norm=True, q_norm_weight=weights[0], k_norm_weight=weights[1]) if qk_norm else {}
    gtnorm.graph_transformer_attention(*inputs, layout, **norm).backward(grad_out)


def profile_graph(name: str, heads: int, channels: int, dtype=torch.bfloat16) -> None:
    graph = load_graph(name)
    layout = gtnorm.GraphLayout.from_edge_index(graph.edge_index.cuda(), (graph.num_src, graph.num_dst))
    inputs = [
        torch.randn(n, heads, channels, device="cuda", dtype=dtype).requires_grad_()
        for n in (graph.num_dst, graph.num_src, graph.num_src, graph.num_edges)
    ]
    weights = [(1 + 0.1 * torch.randn(channels, device="cuda")).to(dtype).requires_grad_() for _ in range(2)]
    grad_out = torch.randn(graph.num_dst, heads, channels, device="cuda", dtype=dtype)
    for qk_norm in (True, False):
        _fwd_bwd(inputs, weights, layout, grad_out, qk_norm)  # compiles outside the profiled range
        torch.cuda.synchronize()
        print(f"profiling {name}, qk_norm={qk_norm}", flush=True)
        torch.cuda.profiler.start()
        _fwd_bwd(inputs, weights, layout, grad_out, qk_norm)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("graphs", nargs="+")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--channels", type=int, default=64)
    args = parser.parse_args()
    for name in args.graphs:
        profile_graph(name, args.heads, args.channels)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
