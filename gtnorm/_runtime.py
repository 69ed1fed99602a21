"""Where the Triton kernels can run, and the checks that say so before a launch."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import sys
import warnings

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Triton decides between the interpreter and the compiler when a function is decorated with @triton.jit, i.e. when
# gtnorm's kernel modules are imported; changing TRITON_INTERPRET afterwards does not change those functions.
# Every kernel module imports the row helpers of this module before it defines a kernel, so the type of those
# helpers says how all of gtnorm's kernels were defined.
_KERNEL_HELPERS_MODULE = "gtnorm.rmsnorm.math"
_kernels_interpreted: bool | None = None  # recorded once the kernels exist; they never change afterwards


def interpreter_active() -> bool:
    """True when ``TRITON_INTERPRET=1`` asks for the Triton interpreter (kernels on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kernels_interpreted() -> bool | None:
    """How gtnorm's Triton kernels were defined: True for the interpreter, False compiled, None not yet (their
    modules are not imported, so the next import follows ``TRITON_INTERPRET`` as it is then)."""
    global _kernels_interpreted
    if _kernels_interpreted is None:
        helpers = sys.modules.get(_KERNEL_HELPERS_MODULE)
        if helpers is not None:
            from triton.runtime.jit import JITFunction, KernelInterface

            defined = [value for value in vars(helpers).values() if isinstance(value, KernelInterface)]
            if defined:  # none while the module is still being imported
                _kernels_interpreted = not isinstance(defined[0], JITFunction)
    return _kernels_interpreted


def _mode_changed_after_definition() -> bool:
    defined = kernels_interpreted()
    return defined is not None and defined != interpreter_active()


def triton_can_run_on(device: torch.device) -> bool:
    """Compiled Triton needs a CUDA device; the interpreter runs on CPU tensors only. False on every device when
    ``TRITON_INTERPRET`` was changed after gtnorm's kernels were defined (they keep the mode they were made in)."""
    # Not checked while torch.compile traces: what it reads changes at the first eager call, a recompile each time.
    if not torch.compiler.is_compiling() and _mode_changed_after_definition():
        return False
    if interpreter_active():
        return device.type == "cpu"
    return device.type == "cuda"


# The kernels' edge loops run range() over bounds loaded from the graph's offsets; the interpreter of Triton
# before 3.7 cannot (compiled Triton can, from the oldest version pyproject.toml allows).
INTERPRETER_MIN_TRITON = (3, 7)
# Read once here (from the package metadata, without importing triton): torch.compile traces the checks below.
TRITON_VERSION = tuple(int(part) for part in importlib.metadata.version("triton").split(".")[:2])


def check_triton_device(device: torch.device, what: str) -> None:
    """Raises a RuntimeError saying why, unless the Triton kernels can run on ``device`` tensors now."""
    if triton_can_run_on(device):
        check_interpreter_version(what)
        return
    if _mode_changed_after_definition():
        was, now = ("1", "unset or 0") if kernels_interpreted() else ("unset or 0", "1")
        raise RuntimeError(
            f"{what}: TRITON_INTERPRET is now {now}, but gtnorm's Triton kernels were defined when it was {was} "
            "(Triton fixes interpreter or compiled when a kernel module is imported). Set TRITON_INTERPRET before "
            "the first use of gtnorm's kernels (before building a GraphTransformerConv or importing "
            "gtnorm.triton.ops / gtnorm.rmsnorm.functional) and start a fresh process, or use the PyG/torch path"
        )
    if device.type == "cpu":
        raise RuntimeError(
            f"{what}: the Triton kernels need CUDA tensors; on the CPU they only run through the Triton "
            "interpreter (set TRITON_INTERPRET=1 before gtnorm's kernels are first used), or use the PyG/torch path"
        )
    raise RuntimeError(f"{what}: tensors on {device} cannot run the Triton kernels here")


def check_interpreter_version(what: str) -> None:
    """Raises a RuntimeError where the Triton interpreter is asked for but its triton cannot run the kernels (for a
    caller that knows the kernels can run on its device: triton_can_run_on)."""
    if interpreter_active() and TRITON_VERSION < INTERPRETER_MIN_TRITON:
        need = ".".join(map(str, INTERPRETER_MIN_TRITON))
        raise RuntimeError(
            f"{what}: the Triton interpreter of triton {'.'.join(map(str, TRITON_VERSION))} cannot run "
            f"gtnorm's kernels (their loops run over loaded bounds); it needs triton >= {need}. Install a newer "
            "triton, run on a CUDA GPU, or use the PyG/torch path"
        )


_warned_interpreter_auto = False


def warn_auto_uses_interpreter(device: torch.device) -> None:
    """Call where ``backend="auto"`` has chosen the Triton kernels for tensors on ``device``: the first time that
    means the Triton interpreter (CPU tensors under ``TRITON_INTERPRET=1``), warns once per process that this path
    is about 40x slower than the PyG path that ``auto`` would take without ``TRITON_INTERPRET``."""
    global _warned_interpreter_auto
    if torch.compiler.is_compiling():  # a warning would break the traced graph; the eager calls say it
        return
    if _warned_interpreter_auto or device.type != "cpu" or not interpreter_active():
        return
    _warned_interpreter_auto = True
    warnings.warn(
        "backend='auto' runs gtnorm's Triton kernels through the Triton interpreter on the CPU because "
        "TRITON_INTERPRET=1 is set: about 40x slower than the PyG path, which 'auto' takes on the CPU without "
        "TRITON_INTERPRET (or pass backend='pyg'). The interpreter is for testing the kernels.",
        stacklevel=3,
    )


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


@torch.compiler.assume_constant_result
@functools.cache
def _cuda_sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# Shared memory a program may use where no CUDA device says (the interpreter, plans made on a CPU): an H100's and
# an H200's opt-in limit per block (cudaDevAttrMaxSharedMemoryPerBlockOptin).
DEFAULT_SHARED_MEMORY = 232_448


def shared_memory_per_block(device: torch.device) -> int:
    """The most shared memory (bytes) one program may use on a CUDA device (its opt-in limit); elsewhere the figure
    of the H100 and H200, so that plans made on a CPU are those of those GPUs."""
    return _cuda_shared_memory(device) if device.type == "cuda" else DEFAULT_SHARED_MEMORY


# The device queries are constants to torch.compile: traced, torch.cuda.get_device_properties breaks the graph (the
# edge projection's dispatch asks for the plan while the layer is traced).
@torch.compiler.assume_constant_result
@functools.cache
def _cuda_shared_memory(device: torch.device) -> int:
    properties = torch.cuda.get_device_properties(device)
    return getattr(properties, "shared_memory_per_block_optin", 0) or properties.shared_memory_per_block


def device_guard(device: torch.device):
    """Triton launches on the current CUDA device: make it the tensors' one."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
