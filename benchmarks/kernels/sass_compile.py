"""Compiling a recorded launch (sass_launches.Launch) for sm_90 on a machine without a GPU, and reading the binary
with the NVIDIA tools that triton's pip wheels bundle (ptxas, cuobjdump, nvdisasm).

A launch is bound and specialised by the kernel's own Triton binder, as Triton's runtime does at a launch: the
16-byte alignment of every tensor, int 1 -> constexpr, ints % 16 -> tt.divisibility. Then triton.compile(ASTSource(
kernel, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32)).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

SM90 = GPUTarget("cuda", 90, 32)
LEGACY_PTX_VERSION = 88  # the newest PTX the bundled CUDA 12.x ptxas reads


def nvidia_tool(name: str) -> Path:
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: sass_count needs the NVIDIA tools that triton's pip wheels bundle (ptxas, "
            f"cuobjdump, nvdisasm); install triton from pip (pip install triton)"
        )
    return path


def toolchain_environment(ptxas: str, cache_dir: str | None = None) -> dict[str, str]:
    """The variables to set before any compile. ``ptxas`` "legacy": the bundled plain `ptxas` (CUDA 12.x) with PTX
    8.8, as triton <= 3.8 assembles sm_90 (it takes ptxas-blackwell only for arch >= 100); "triton": what the
    installed triton itself takes for sm_90 (3.9: ptxas-blackwell, CUDA 13.x, its newest PTX)."""
    env = {
        # triton 3.6's default (3.9 warns that it will change)
        "TRITON_DEFAULT_FP_FUSION": os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"),
        # legacy and triton assemble different binaries from the same cache key
        # under a cache the caller chose (a test's fresh one), else the temporary directory
        "TRITON_CACHE_DIR": cache_dir
        or str(Path(os.environ.get("TRITON_CACHE_DIR") or tempfile.gettempdir()) / "sass_count_cache" / ptxas),
    }
    if ptxas == "legacy":
        env["TRITON_PTXAS_BLACKWELL_PATH"] = str(nvidia_tool("ptxas"))
    return env


@dataclasses.dataclass
class CompiledLaunch:
    binary: object  # triton.compiler.CompiledKernel: .asm["ptx" | "ttgir" | "cubin"], .metadata
    signature: dict[str, str]  # parameter -> Triton type ("*bf16", "i32", "constexpr", ...)
    attrs: dict  # (parameter index,) -> [["tt.divisibility", 16]] where Triton specialised on it
    dropped: list[str]  # launch keywords that are neither this kernel's parameters nor compile options


def compile_launch(kernel, launch, target: GPUTarget = SM90) -> CompiledLaunch:
    backend = make_backend(target)
    kwargs = dict(launch.kwargs)
    if not isinstance(kernel, JITFunction):
        # Under TRITON_INTERPRET=1 triton.jit makes InterpretedFunctions, and the interpreter leaves triton.language
        # patched for itself once a jit function has been called from Python: no compile is sound in such a process.
        raise RuntimeError(
            f"{getattr(kernel, '__name__', kernel)} is not a compilable Triton kernel ({type(kernel).__name__}): "
            "run sass_count without TRITON_INTERPRET=1"
        )
    # What JITFunction.run adds before binding.
    kwargs.setdefault("debug", bool(kernel.debug) or knobs.runtime.debug)
    kwargs.setdefault("instrumentation_mode", knobs.compilation.instrumentation_mode)
    # A copy's kernel may not take a constexpr the plan passes; that keyword is dropped, and reported.
    options = backend.parse_options({}).__dict__
    dropped = [k for k in kwargs if k not in kernel.signature.parameters and k not in options]
    for k in dropped:
        kwargs.pop(k)
    if os.environ.get("TRITON_PTXAS_BLACKWELL_PATH", "").endswith("/ptxas"):  # the legacy ptxas
        kwargs.setdefault("ptx_version", LEGACY_PTX_VERSION)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    source = ASTSource(kernel, signature, constexprs, attrs)
    binary = triton.compile(source, target=target, options=options.__dict__)
    return CompiledLaunch(binary, signature, attrs, dropped)


def _run_on_cubin(tool: str, *flags: str, cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run(
            [str(nvidia_tool(tool)), *flags, f.name], capture_output=True, text=True, check=True
        ).stdout


def disassemble(cubin: bytes) -> str:
    return _run_on_cubin("nvdisasm", "-c", cubin=cubin)


def resource_usage(cubin: bytes) -> dict[str, int]:
    """reg / stack / local / shared of the binary itself."""
    out = _run_on_cubin("cuobjdump", "-res-usage", cubin=cubin)
    return {k.lower(): int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL|SHARED):(\d+)", out)}


def ptxas_info(ptx: str, options: dict) -> dict:
    """Registers and spill bytes from `ptxas -v` on the PTX, with the flags triton's make_cubin passes
    (the PTX carries .maxnreg): the binary itself does not record its spills."""
    ptxas = get_ptxas(SM90.arch).path
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        fmad = [] if options.get("enable_fp_fusion", True) else ["--fmad=false"]
        cmd = [
            ptxas,
            "-lineinfo",
            *fmad,
            "-v",
            "--regAllocOptLevel=2",
            "--gpu-name=sm_90a",
            str(src),
            "-o",
            str(Path(tmp) / "k.o"),
        ]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    info = {}
    if m := re.search(r"Used (\d+) registers", log):
        info["regs"] = int(m.group(1))
    if m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log):
        info["spill_st"], info["spill_ld"] = int(m.group(1)), int(m.group(2))
    return info
