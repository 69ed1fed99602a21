"""Developer tool: one forward+backward per graph and QK norm between cudaProfilerStart/Stop, for Nsight Compute to
read the attention kernels' hardware counters.

    ncu --profile-from-start off --clock-control none -k regex:"graph_attention|edge_softmax|edge_|rows_kernel" \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__inst_executed.sum \\
        python -m benchmarks.kernels.profile_kernels era_to_h h_to_h h_to_era dop_enc_large --norms rms layer off

``--edge-features D``: the fused edge projection (D raw attributes per edge) in place of e rows. Each graph and norm
warms up (compiles) outside the profiled range. How benchmarks/NOTES.md's v4 and v25 counters were taken.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.graphs.catalog import load_graph
from benchmarks.kernels.kernel_sweep import AttentionProblem

NORMS = {"rms": True, "layer": "layer", "off": False}


def profile_graph(name: str, heads: int, channels: int, norms: list[str], edge_dim: int) -> None:
    problem = AttentionProblem.on_graph(load_graph(name), heads, channels, edge_dim=edge_dim)
    for norm in norms:
        problem.forward_backward(NORMS[norm])  # compiles outside the profiled range
        torch.cuda.synchronize()
        print(f"profiling {name}, norm {norm}, edge features {edge_dim or 'rows'}", flush=True)
        torch.cuda.profiler.start()
        problem.forward_backward(NORMS[norm])
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("graphs", nargs="+")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--norms", nargs="+", choices=sorted(NORMS), default=["rms", "off"])
    parser.add_argument("--edge-features", type=int, default=0, help="D: the fused edge projection (0: e rows)")
    args = parser.parse_args()
    for name in args.graphs:
        profile_graph(name, args.heads, args.channels, args.norms, args.edge_features)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
