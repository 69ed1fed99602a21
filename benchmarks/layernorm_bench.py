"""Standalone LayerNorm: torch.compile(F.layer_norm), eager F.layer_norm and Liger's Triton LayerNorm (when
``liger_kernel`` is installed), as % of copy bandwidth: what a standalone Triton LayerNorm in gtnorm would have to
beat. One was measured against them and did not earn its place (benchmarks/NOTES.md, v7); gtnorm's LayerNorm lives
fused in the attention kernels only.

    python -m benchmarks.layernorm_bench [--channels 64 128 256 512 1024] [--elements-log2 28] [--dtype bfloat16]
                                         [--out DIR]

For x [M, C] with M*C = 2**elements_log2, weight and bias (torch.nn.LayerNorm's defaults): forward (read x, write
y) and backward (read x and dy, write dx, reduce dw and db: 3 tensors of x's size) times, each as % of the
device-to-device copy bandwidth measured in the same run (read + written bytes). The backward is timed alone, by
replaying autograd on a kept graph. Before timing, every variant's y, dx, dw and db are checked against
F.layer_norm in float64 (relative Frobenius error, printed). Prints a table and writes JSON when --out is given.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch._functorch.config
import torch.nn.functional as F
import triton

from benchmarks.kernel_sweep import copy_bandwidth


def _liger_layer_norm():
    """Liger's LayerNorm function, or None (with the reason printed) where it cannot be imported."""
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    except Exception as exc:  # not installed, or its package init failing on this torch/triton: skip, say why
        print(f"liger_kernel skipped: {exc!r}")
        return None
    return lambda x, w, b, eps: LigerLayerNormFunction.apply(x, w, b, eps)


def _timings(norm, x, weight, bias, grad_y) -> tuple[float, float]:
    with torch.no_grad():
        forward_ms = triton.testing.do_bench(lambda: norm(x, weight, bias), warmup=25, rep=200, return_mode="median")
    y = norm(x, weight, bias)
    backward_ms = triton.testing.do_bench(
        lambda: torch.autograd.grad(y, (x, weight, bias), grad_y, retain_graph=True),
        warmup=25, rep=200, return_mode="median",
    )  # fmt: skip
    return forward_ms, backward_ms


def _errors(norm, x, weight, bias, grad_y, eps) -> float:
    """The largest relative error of y, dx, dw, db against F.layer_norm in float64 on the same inputs."""
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    ref = F.layer_norm(leaves[0], (x.shape[-1],), leaves[1], leaves[2], eps)
    ref_grads = torch.autograd.grad(ref, leaves, grad_y.double())
    y = norm(x, weight, bias)
    grads = torch.autograd.grad(y, (x, weight, bias), grad_y)
    return max(((a.double() - b).norm() / b.norm()).item() for a, b in zip((y, *grads), (ref, *ref_grads), strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--channels", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--elements-log2", type=int, default=28)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    # The backward is replayed on a kept graph (retain_graph), which Inductor's donated buffers forbid.
    torch._functorch.config.donated_buffer = False
    bandwidth = copy_bandwidth()
    liger = _liger_layer_norm()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s; {args.dtype}, "
          f"M*C = 2^{args.elements_log2}; liger_kernel {'found' if liger else 'skipped'}")  # fmt: skip
    eps = 1e-5
    rows = []
    print(f"{'C':>6} {'variant':14s} {'fwd ms':>8} {'fwd %bw':>8} {'bwd ms':>8} {'bwd %bw':>8} {'max rel err':>11}")
    for channels in args.channels:
        torch._dynamo.reset()  # every size compiles afresh, under the recompile limit
        n_rows = 2**args.elements_log2 // channels
        x = torch.randn(n_rows, channels, device="cuda", dtype=dtype, requires_grad=True)
        weight = (1 + 0.1 * torch.randn(channels, device="cuda")).to(dtype).requires_grad_()
        bias = (0.1 * torch.randn(channels, device="cuda")).to(dtype).requires_grad_()
        grad_y = torch.randn_like(x)
        tensor_bytes = x.numel() * x.element_size()
        variants = {
            # A fresh compile per size, specialised to it (a reused one would turn dynamic after the first C).
            "torch.compile": torch.compile(lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps), dynamic=False),
            "eager": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps),
        }
        if liger is not None:
            variants["liger"] = lambda x, w, b: liger(x, w, b, eps)
        for name, norm in variants.items():
            error = _errors(norm, x, weight, bias, grad_y, eps)
            fwd, bwd = _timings(norm, x, weight, bias, grad_y)
            row = dict(channels=channels, variant=name, fwd_ms=fwd, bwd_ms=bwd, max_rel_error=error,
                       fwd_pct=100 * 2 * tensor_bytes / bandwidth / (fwd * 1e-3),
                       bwd_pct=100 * 3 * tensor_bytes / bandwidth / (bwd * 1e-3))  # fmt: skip
            rows.append(row)
            print(f"{channels:6d} {name:14s} {fwd:8.3f} {row['fwd_pct']:7.1f}% {bwd:8.3f} {row['bwd_pct']:7.1f}% "
                  f"{error:11.2e}", flush=True)  # fmt: skip
        del x, weight, bias, grad_y
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        result = dict(device=torch.cuda.get_device_name(), bandwidth=bandwidth, dtype=args.dtype, rows=rows)
        (args.out / "layernorm_bench.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
