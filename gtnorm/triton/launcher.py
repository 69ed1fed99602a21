"""Launching a kernel's compiled binary again without Triton's per-call argument binding.

``kernel[grid](*args, **kwargs)`` binds every argument to the kernel's signature, specialises each one through
Triton's runtime, builds a cache key string from the result and the options, and only then finds the compiled
binary: for the edge walks' ~35 arguments that is ~50 us of host time per launch on an H100 host, against ~13 us
for the binary's own launcher (benchmarks/NOTES.md, v14), on graphs whose kernels take a few microseconds.

:class:`Launcher` keeps the compiled binaries of one kernel under its own key, computed from exactly what
Triton's specialisation reads (``specialization_key``): per tensor its dtype and whether its address is 16-byte
aligned; per integer whether it is 1, whether it divides by 16 and whether it fits 32 or 64 bits; the type of any
other value; the exact value of every constexpr and of every option. Calls with equal keys are specialised
alike, so they run the same binary (tests/triton/test_launcher.py checks the rule against Triton's own
specialiser). A key seen for the first time, the interpreter, launch hooks (profilers) and triton < 3.6 take
Triton's path. A cached launch skips one more of Triton's per-call checks: that the module globals a kernel reads
have not changed since it was compiled (gtnorm's kernels read module constants only).
"""

from __future__ import annotations

import torch
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from gtnorm._runtime import TRITON_VERSION

try:
    from triton import knobs
except ImportError:  # triton < 3.4: launches take Triton's path (DIRECT_LAUNCH_MIN_TRITON)
    knobs = None

# The binaries' calling convention and the specialisation rule mirrored here are those of triton >= 3.6 (read in
# its source; tests/triton/test_launcher.py checks the rule against its specialiser). Older versions, whose
# convention or hooks differ, always take Triton's path.
DIRECT_LAUNCH_MIN_TRITON = (3, 6)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Keys per kernel: dtypes, alignments, flags and constexprs have few values each; past this something varies
# that should not (then the cache starts over rather than grow).
_MAX_BINARIES = 256


def specialization_key(value):
    """What Triton's specialisation of a non-constexpr argument depends on."""
    if isinstance(value, torch.Tensor):
        return _tensor_key(value)
    if type(value) is int:
        return value == 1, not value % 16, _INT32_MIN <= value <= _INT32_MAX, _INT64_MIN <= value <= _INT64_MAX
    return type(value)


class Launcher:
    """``Launcher(kernel)[grid](*args, **kwargs)`` launches as ``kernel[grid](*args, **kwargs)`` does."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._binaries: dict = {}  # key -> (compiled kernel, the values of the parameters after the positional ones)
        # The interpreter runs its own kind of function, with no binaries.
        self._direct = isinstance(kernel, JITFunction) and TRITON_VERSION >= DIRECT_LAUNCH_MIN_TRITON
        if self._direct:
            self._param_names = frozenset(kernel.signature.parameters)
            self._constexpr = tuple(p.is_constexpr for p in kernel.params)
            self._constexpr_names = frozenset(p.name for p in kernel.params if p.is_constexpr)

    def clear(self) -> None:
        """Forgets the binaries: the next launch of every key takes Triton's path (and its hooks) again."""
        self._binaries.clear()

    def __getitem__(self, grid: tuple[int, ...]):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid: tuple[int, ...], args: tuple, kwargs: dict) -> None:
        if not self._direct or _hooked(self.kernel):
            self.kernel[grid](*args, **kwargs)
            return
        device = driver.active.get_current_device()
        # One comprehension over ~35 arguments, no call per argument: the key is most of a cached launch's Python.
        key = (
            device,
            *kwargs.items(),
            *[a if constexpr else _tensor_key(a) if isinstance(a, torch.Tensor) else specialization_key(a)
              for a, constexpr in zip(args, self._constexpr, strict=False)],
        )  # fmt: skip
        found = self._binaries.get(key)
        if found is None:
            self._first_launch(key, grid, args, kwargs)
            return
        binary, tail = found
        grid_y = grid[1] if len(grid) > 1 else 1
        grid_z = grid[2] if len(grid) > 2 else 1
        stream = driver.active.get_current_stream(device)
        # The calling convention of CompiledKernel.__getitem__'s runner, without launch metadata (no hooks).
        binary.run(grid[0], grid_y, grid_z, stream, binary.function, binary.packed_metadata, None, None, None,
                   *args, *tail)  # fmt: skip

    def _first_launch(self, key, grid, args, kwargs) -> None:
        binary = self.kernel[grid](*args, **kwargs)
        if binary is None or not hasattr(binary, "packed_metadata"):  # compiled asynchronously: not yet a binary
            return
        params = {name: value for name, value in kwargs.items() if name in self._param_names}
        if not params.keys() <= self._constexpr_names:
            return  # a run-time argument passed by name: the key would hold its value, so every call takes this path
        bound = self.kernel.signature.bind(*args, **params)
        bound.apply_defaults()
        tail = tuple(bound.arguments.values())[len(args) :]
        if len(self._binaries) >= _MAX_BINARIES:
            self._binaries.clear()
        self._binaries[key] = (binary, tail)


def _hooked(kernel) -> bool:
    """Launch hooks (profilers) and pre-run hooks run only on Triton's own path."""
    runtime = knobs.runtime
    active = _hook_set(runtime.launch_enter_hook) or _hook_set(runtime.launch_exit_hook)
    return active or bool(getattr(kernel, "pre_run_hooks", None))


def _hook_set(hook) -> bool:
    # Newer Triton keeps a HookChain there, never None: set when it holds a hook. Older Triton: None or a callable.
    return hook is not None and bool(getattr(hook, "calls", True))


def _tensor_key(value: torch.Tensor):
    return value.dtype, not value.data_ptr() & 15
