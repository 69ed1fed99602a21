"""Developer probe: the MLP's exact GELU in its GEMMs' epilogues, against cuBLAS and torch's GELU (issue 49, item 3).

    python -m benchmarks.kernels.mlp_epilogue [--rows 163842 647200] [--tiles 128x256x64 128x128x64 ...]

Anemoi's MLP (Linear 1024 -> 4096, exact GELU, Linear 4096 -> 1024) spends ~108 ms of an O800 step in three
element-wise passes over [rows, 4096] tensors (benchmarks/NOTES.md v31, v36): the GELU, the activation made again
in the backward for the second weight's gradient, and the GELU's backward. cuBLAS has no epilogue for the exact
(erf) GELU, so moving them into the GEMMs needs a Triton GEMM at cuBLAS's rate. A pointer-based tl.dot GEMM reached
about half of it on the H200 (v36); this probe measures the Hopper form: a persistent kernel reading both operands
through TMA tensor descriptors, one program per SM walking output tiles. Two epilogues, each against what torch runs:

- forward: ``h = x W1^T + b1`` and ``a = gelu(h)`` from one GEMM, against cuBLAS addmm then torch's GELU;
- backward: ``dh = (dy W2) * gelu'(h)`` and ``a = gelu(h)`` (what the second weight's gradient reads) from one GEMM
  that reads h in its epilogue, against cuBLAS mm then torch's GELU and its backward.

Prints each one's time, its rate and its error against fp32 torch; the first lines name the GPU and versions.
Needs CUDA; tests/benchmarks/test_mlp_epilogue.py checks the kernels' results under the Triton interpreter.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# constexpr: a compiled kernel reads no other globals (the interpreter does, so only a GPU run finds a plain float).
_SQRT_HALF = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@dataclass(frozen=True)
class Tile:
    """A GEMM's output tile, its K step, and its launch settings."""

    m: int
    n: int
    k: int
    warps: int = 8
    stages: int = 3

    @classmethod
    def parse(cls, text: str) -> Tile:
        """'MxNxK[xWARPSxSTAGES]', e.g. 128x256x64 or 128x128x64x4x4."""
        return cls(*(int(part) for part in text.split("x")))


@triton.jit
def _gelu(h):
    return 0.5 * h * (1.0 + tl.erf(h * _SQRT_HALF))


@triton.jit
def _gelu_grad(h):
    return 0.5 * (1.0 + tl.erf(h * _SQRT_HALF)) + h * _INV_SQRT_2PI * tl.exp(-0.5 * h * h)


@triton.jit
def gemm_gelu_kernel(
    a_ptr,  # [M, K]
    b_ptr,  # [N, K]: a Linear's weight (forward: W1) or, transposed, the next one's (backward: W2^T, contiguous)
    bias_ptr,  # [N] (forward) or unused
    h_ptr,  # [M, N]: forward: out, the pre-activation; backward: in, the saved pre-activation
    out_ptr,  # [M, N] out: forward: gelu(h); backward: dh = (a b^T) * gelu'(h)
    act_ptr,  # [M, N] out, backward only: gelu(h), which the second weight's gradient reads
    M,
    N,
    K,
    BACKWARD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
):
    """One program per SM walks output tiles (persistent); operands and results move through TMA descriptors."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    h_desc = tl.make_tensor_descriptor(h_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    out_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    act_desc = tl.make_tensor_descriptor(act_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
        # Consecutive programs take the N tiles of one row block: its A rows are read once from HBM, then from L2.
        row, col = (tile // tiles_n) * BLOCK_M, (tile % tiles_n) * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            acc = tl.dot(a_desc.load([row, k * BLOCK_K]), b_desc.load([col, k * BLOCK_K]).T, acc)
        if BACKWARD:
            h = h_desc.load([row, col]).to(tl.float32)
            out_desc.store([row, col], (acc * _gelu_grad(h)).to(out_ptr.dtype.element_ty))
            act_desc.store([row, col], _gelu(h).to(act_ptr.dtype.element_ty))
        else:
            bias = tl.load(bias_ptr + col + tl.arange(0, BLOCK_N), mask=col + tl.arange(0, BLOCK_N) < N)
            # GELU of h as stored (rounded to its dtype), as torch's GELU reads the addmm's output.
            h = (acc + bias.to(tl.float32)[None, :]).to(h_ptr.dtype.element_ty)
            h_desc.store([row, col], h)
            out_desc.store([row, col], _gelu(h.to(tl.float32)).to(out_ptr.dtype.element_ty))


def _launch(a, b, bias, h, out, act, backward: bool, tile: Tile, programs: int) -> None:
    M, K = a.shape
    N = b.shape[0]
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=a.device))
    grid = (min(programs, triton.cdiv(M, tile.m) * triton.cdiv(N, tile.n)),)
    gemm_gelu_kernel[grid](
        a, b, bias, h, out, act, M, N, K, BACKWARD=backward, BLOCK_M=tile.m, BLOCK_N=tile.n, BLOCK_K=tile.k,
        NUM_PROGRAMS=grid[0], num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, tile: Tile, programs: int):
    """(h, gelu(h)) with h = x weight^T + bias, from one GEMM.

    Shapes: x [M, K], weight [N, K], bias [N] -> h [M, N], gelu(h) [M, N]."""
    h = x.new_empty((x.shape[0], weight.shape[0]))
    activated = torch.empty_like(h)
    _launch(x, weight, bias, h, activated, activated, False, tile, programs)
    return h, activated


def linear_gelu_backward(
    grad_y: torch.Tensor, weight2_t: torch.Tensor, h: torch.Tensor, tile: Tile, programs: int
):  # fmt: skip
    """(dh, gelu(h)) with dh = (grad_y weight2) * gelu'(h), from one GEMM (weight2_t: the second Linear's weight
    transposed and contiguous, [N, K]).

    Shapes: grad_y [M, K], weight2_t [N, K], h [M, N] -> dh [M, N], gelu(h) [M, N]."""
    grad_h, activated = torch.empty_like(h), torch.empty_like(h)
    _launch(grad_y, weight2_t, grad_y, h, grad_h, activated, True, tile, programs)
    return grad_h, activated


def _rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def _bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=50, rep=300)


def measure(rows: int, tiles: list[Tile], hidden: int = 1024, width: int = 4096) -> None:
    """Both epilogues against torch at ``rows`` rows, for each tile; one line each."""
    device, dtype = torch.device("cuda"), torch.float16
    programs = torch.cuda.get_device_properties(device).multi_processor_count
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(rows, hidden, device=device, dtype=dtype, generator=generator)
    w1 = torch.randn(width, hidden, device=device, dtype=dtype, generator=generator) / hidden**0.5
    b1 = torch.randn(width, device=device, dtype=dtype, generator=generator) / 10
    w2_t = (torch.randn(hidden, width, device=device, dtype=dtype, generator=generator) / width**0.5).t().contiguous()
    grad_y = torch.randn(rows, hidden, device=device, dtype=dtype, generator=generator)
    flops = 2 * rows * hidden * width
    h_ref = torch.addmm(b1.float(), x.float(), w1.float().t())
    h = torch.addmm(b1, x, w1.t())
    grad_h_ref = torch.ops.aten.gelu_backward(grad_y.float() @ w2_t.float().t(), h.float())
    torch_forward = _bench(lambda: torch.nn.functional.gelu(torch.addmm(b1, x, w1.t())))
    torch_backward = _bench(lambda: (torch.ops.aten.gelu_backward(grad_y @ w2_t.t(), h), torch.nn.functional.gelu(h)))
    print(f"rows {rows}: torch forward (addmm, GELU) {torch_forward:.3f} ms, cuBLAS mm alone "
          f"{_bench(lambda: x @ w1.t()):.3f} ms; torch backward (mm, GELU backward, GELU) {torch_backward:.3f} ms",
          flush=True)  # fmt: skip
    for tile in tiles:
        try:
            _, activated = linear_gelu(x, w1, b1, tile, programs)
            grad_h, _ = linear_gelu_backward(grad_y, w2_t, h, tile, programs)
            forward = _bench(lambda tile=tile: linear_gelu(x, w1, b1, tile, programs))
            backward = _bench(lambda tile=tile: linear_gelu_backward(grad_y, w2_t, h, tile, programs))
        except Exception as error:  # a tile that does not fit the SM's shared memory or registers: a line, not a stop
            cause = error.__cause__ or error  # a CompilationError names the line; its cause says what is wrong there
            print(f"  {tile}: {type(error).__name__}: {str(cause)[:300]}", flush=True)
            continue
        print(f"  {tile}: forward {forward:.3f} ms ({flops / forward / 1e9:.0f} TF/s, {torch_forward / forward:.2f}x "
              f"torch, error {_rel_error(activated, torch.nn.functional.gelu(h_ref)):.1e}); backward {backward:.3f} "
              f"ms ({torch_backward / backward:.2f}x torch, error {_rel_error(grad_h, grad_h_ref):.1e})",
              flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.kernels.mlp_epilogue", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[163842, 647200], help="O800's processor, decoder chunk")
    # Shared memory (operand stages and the epilogue's output tiles), compiled with triton 3.6 for sm_90: all fit
    # Hopper's 227 KB in both epilogues but the first, whose backward takes 272 KB (its line reports the failure).
    tiles = ["128x256x64x8x3", "128x256x64x8x2", "256x128x64x8x2", "128x128x64x4x4", "128x128x64x8x3", "128x128x64x4x3"]
    parser.add_argument("--tiles", nargs="+", default=tiles, help="MxNxK[xWARPSxSTAGES]")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.kernels.mlp_epilogue needs CUDA (tests/benchmarks/test_mlp_epilogue.py: the CPU)")
    print(torch.cuda.get_device_name(), f"torch {torch.__version__}, triton {triton.__version__}", flush=True)
    for rows in args.rows:
        measure(rows, [Tile.parse(text) for text in args.tiles])


if __name__ == "__main__":
    main()
