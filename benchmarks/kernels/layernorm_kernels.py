"""Fused LayerNorm against fused RMSNorm, kernel by kernel, on the graph benchmark's graphs (issue 12).

    python -m benchmarks.kernels.layernorm_kernels [--graphs h_to_h h_to_era era_to_h dop_enc_large] [--dtype bfloat16]

For each graph (H = 16, C = 64): gtnorm.graph_transformer_attention with qk_norm="rms" (weights), "layer" with
weights and biases (the graph benchmark's fused_layer) and "layer" with weights only (Anemoi's default,
AutocastLayerNorm(bias=False)). Prints forward and forward+backward medians (do_bench), the peak memory one
forward+backward allocates beyond its inputs, and each kernel's time in it (torch.profiler, mean of 10 calls),
then each LayerNorm row against the RMSNorm row.
"""

from __future__ import annotations

import argparse

import torch
import triton

import gtnorm
from benchmarks.graphs.catalog import load_graph
from benchmarks.graphs.variants import make_inputs

KERNELS = {"fwd": "forward_kernel", "by_dst": "by_destination", "by_src": "by_source", "col_sum": "column_sum"}
CONFIGS = {"rms": ("rms", False), "layer_wb": ("layer", True), "layer_w": ("layer", False)}
PROFILED_CALLS = 10


def _measure(inputs, qk_norm: str, biases: bool) -> dict:
    kwargs = dict(qk_norm=qk_norm, q_norm_weight=inputs.q_norm_weight, k_norm_weight=inputs.k_norm_weight)
    if biases:
        kwargs.update(q_norm_bias=inputs.q_norm_bias, k_norm_bias=inputs.k_norm_bias)
    leaves = [inputs.query, inputs.key, inputs.value, inputs.edge_attr, inputs.q_norm_weight, inputs.k_norm_weight]
    leaves += [inputs.q_norm_bias, inputs.k_norm_bias] if biases else []

    def forward():
        q, k, v, e = inputs.query, inputs.key, inputs.value, inputs.edge_attr
        return gtnorm.graph_transformer_attention(q, k, v, e, inputs.layout, eps=inputs.eps, **kwargs)

    def forward_backward():
        forward().backward(inputs.grad_out)

    with torch.no_grad():
        row = {"fwd_ms": triton.testing.do_bench(forward, warmup=25, rep=100)}
    row["fwd_bwd_ms"] = triton.testing.do_bench(forward_backward, warmup=25, rep=100, grad_to_none=leaves)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    forward_backward()
    torch.cuda.synchronize()
    row["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(PROFILED_CALLS):
            forward_backward()
        torch.cuda.synchronize()
    for t in leaves:
        t.grad = None
    for column, name in KERNELS.items():
        times = [e.device_time_total for e in profile.key_averages() if name in e.key]
        row[column] = sum(times) / PROFILED_CALLS / 1000
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", nargs="+", default=["h_to_h", "h_to_era", "era_to_h", "dop_enc_large"])
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    header = f"{'graph':14s} {'config':9s} {'fwd ms':>7s} {'f+b ms':>7s} {'peak MiB':>9s}"
    header += "".join(f" {c:>7s}" for c in KERNELS) + f" {'fwd/rms':>8s} {'f+b/rms':>8s} {'peak/rms':>8s}"
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, H = 16, C = 64; kernel columns: ms per forward+backward")
    print(header)
    for name in args.graphs:
        inputs = make_inputs(load_graph(name), 16, 64, getattr(torch, args.dtype), torch.device("cuda"), 1e-5)
        rows = {config: _measure(inputs, *CONFIGS[config]) for config in CONFIGS}
        for config, row in rows.items():
            ratios = [row[k] / rows["rms"][k] for k in ("fwd_ms", "fwd_bwd_ms", "peak_mib")]
            print(f"{name:14s} {config:9s} {row['fwd_ms']:7.3f} {row['fwd_bwd_ms']:7.3f} {row['peak_mib']:9.1f}"
                  + "".join(f" {row[c]:7.3f}" for c in KERNELS) + "".join(f" {r:8.3f}" for r in ratios),
                  flush=True)  # fmt: skip
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
