"""Where the Triton kernels can run, and the checks that say so before a launch."""

from __future__ import annotations

import contextlib
import functools
import os

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreter_active() -> bool:
    """True when Triton kernels run on the CPU through the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_can_run_on(device: torch.device) -> bool:
    """Compiled Triton needs a CUDA device; the interpreter runs on CPU tensors only."""
    if interpreter_active():
        return device.type == "cpu"
    return device.type == "cuda"


def check_triton_device(device: torch.device, what: str) -> None:
    if triton_can_run_on(device):
        return
    if device.type == "cpu":
        raise RuntimeError(
            f"{what}: the Triton kernels need CUDA tensors; on the CPU they only run through the Triton "
            "interpreter (set TRITON_INTERPRET=1 before importing gtnorm), or use the PyG/torch path"
        )
    raise RuntimeError(f"{what}: tensors on {device} cannot run the Triton kernels here")


def check_dtype(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {tensor.dtype}")


def resolve_eps(eps: float | None, dtype: torch.dtype) -> float:
    """torch.nn.RMSNorm's rule as its kernels apply it: ``eps=None`` means the machine epsilon of the type the
    statistics are computed in. For float16/bfloat16 inputs torch computes in float32 and so uses float32's
    epsilon (not the 16-bit one its documentation names); gtnorm's kernels also compute in float32."""
    if eps is None:
        return float(torch.finfo(torch.promote_types(dtype, torch.float32)).eps)
    if not eps >= 0.0:
        raise ValueError(f"eps must be a non-negative float, got {eps}")
    return float(eps)


# Tests set this to fill every output and scratch buffer of the kernels with NaN before they run, so an element
# a kernel forgets to write cannot pass by holding a stale value.
POISON_OUTPUTS = False


def new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised buffer for a kernel to fill (NaN-filled while POISON_OUTPUTS is set)."""
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; a nominal 1 elsewhere (the interpreter has none)."""
    return _cuda_sm_count(device) if device.type == "cuda" else 1


@functools.cache
def _cuda_sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def device_guard(device: torch.device):
    """Triton launches on the current CUDA device: make it the tensors' one."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
