"""Package attributes imported from their modules on first use.

Triton fixes interpreter or compiled mode when a kernel is defined, i.e. when gtnorm's kernel modules are imported.
Importing them lazily lets ``import gtnorm`` (or ``gtnorm.nn``, ``gtnorm.triton``, ``gtnorm.rmsnorm``) come
before ``TRITON_INTERPRET`` is set, and keeps ``import gtnorm`` cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module


def lazy_exports(namespace: dict, exports: dict[str, str]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for a package whose public names live in submodules.

    ``namespace`` is the package's ``globals()``; ``exports`` maps each public name to the module defining it.
    The first access imports that module and caches the value in the namespace, so later accesses are plain
    attribute reads.
    """

    def __getattr__(name: str):
        if name in exports:
            value = getattr(import_module(exports[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
