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

from benchmarks.graphs.catalog import load_graph
from benchmarks.kernel_sweep import AttentionProblem


def profile_graph(name: str, heads: int, channels: int) -> None:
    problem = AttentionProblem.on_graph(load_graph(name), heads, channels)
    for qk_norm in (True, False):
        problem.forward_backward(qk_norm)  # compiles outside the profiled range
        torch.cuda.synchronize()
        print(f"profiling {name}, qk_norm={qk_norm}", flush=True)
        torch.cuda.profiler.start()
        problem.forward_backward(qk_norm)
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
