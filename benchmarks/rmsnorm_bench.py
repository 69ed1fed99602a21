"""Standalone RMSNorm: gtnorm's Triton kernels against torch.compile(F.rms_norm), as % of copy bandwidth.

    python -m benchmarks.rmsnorm_bench [--channels 64 128 1024 4096] [--elements-log2 28] [--dtype bfloat16]

For x [M, C] with M*C = 2**elements_log2 and an affine weight: forward (read x, write y) and backward (read x
and dy, write dx, reduce dw: 3 tensors of x's size) times, each as % of the device-to-device copy bandwidth
measured in the same run (read + written bytes). The backward is timed alone, by replaying autograd on a kept
graph. Prints a table and writes JSON next to it when --out is given.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch._functorch.config
import torch.nn.functional as F
import triton

import gtnorm
from benchmarks.kernel_sweep import copy_bandwidth


def _timings(norm, x, weight, grad_y) -> tuple[float, float]:
    with torch.no_grad():
        forward_ms = triton.testing.do_bench(lambda: norm(x, weight), warmup=25, rep=200, return_mode="median")
    y = norm(x, weight)
    backward_ms = triton.testing.do_bench(
        lambda: torch.autograd.grad(y, (x, weight), grad_y, retain_graph=True),
        warmup=25, rep=200, return_mode="median",
    )  # fmt: skip
    return forward_ms, backward_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--channels", type=int, nargs="+", default=[64, 128, 1024, 4096])
    parser.add_argument("--elements-log2", type=int, default=28)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    # The backward is replayed on a kept graph (retain_graph), which Inductor's donated buffers forbid.
    torch._functorch.config.donated_buffer = False
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s; {args.dtype}, "
          f"M*C = 2^{args.elements_log2}")
    eps = 1e-6
    rows = []
    print(f"{'C':>6} {'variant':14s} {'fwd ms':>8} {'fwd %bw':>8} {'bwd ms':>8} {'bwd %bw':>8}")
    for channels in args.channels:
        n_rows = 2**args.elements_log2 // channels
        x = torch.randn(n_rows, channels, device="cuda", dtype=dtype, requires_grad=True)
        weight = (1 + 0.1 * torch.randn(channels, device="cuda")).to(dtype).requires_grad_()
        grad_y = torch.randn_like(x)
        tensor_bytes = x.numel() * x.element_size()
        variants = {
            "gtnorm": lambda x, w: gtnorm.rms_norm(x, (x.shape[-1],), w, eps),
            # A fresh compile per size, specialised to it (a reused one would turn dynamic after the first C).
            "torch.compile": torch.compile(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps), dynamic=False),
        }
        for name, norm in variants.items():
            fwd, bwd = _timings(norm, x, weight, grad_y)
            row = dict(channels=channels, variant=name, fwd_ms=fwd, bwd_ms=bwd,
                       fwd_pct=100 * 2 * tensor_bytes / bandwidth / (fwd * 1e-3),
                       bwd_pct=100 * 3 * tensor_bytes / bandwidth / (bwd * 1e-3))  # fmt: skip
            rows.append(row)
            print(f"{channels:6d} {name:14s} {fwd:8.3f} {row['fwd_pct']:7.1f}% {bwd:8.3f} {row['bwd_pct']:7.1f}%",
                  flush=True)  # fmt: skip
        del x, weight, grad_y
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        result = dict(device=torch.cuda.get_device_name(), bandwidth=bandwidth, dtype=args.dtype, rows=rows)
        (args.out / "rmsnorm_bench.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
