"""Quick mode's one change to the Triton interpreter: a device function called from a kernel no longer patches
``triton.language`` again when the kernel's launch has already patched it.

The interpreter patches the language module (``inspect.getmembers`` over it, its tensor class and its math module)
once per launch, and again on every call of a ``@triton.jit`` helper from inside the kernel. gtnorm's kernels call
their helpers once per edge block, so on quick mode's tiny graphs those repeated patches were half of the
interpreter's time (cProfile, triton 3.9: 72 of 138 s on era_to_h_tiny). A repeated patch changes nothing: the
launch's patch is in place until the launch ends, and the helper's own patch was never undone anyway. So the
helper call skips it when every language module its globals hold is already patched, and patches as before
otherwise. Where the interpreter's internals are not the ones this was written against, nothing is changed.
"""

from __future__ import annotations

import functools
import inspect


def skip_repeated_language_patches() -> bool:
    """Installs the skip (once); True if it is in place."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    function = getattr(interpreter, "InterpretedFunction", None)
    patch_lang = getattr(interpreter, "_patch_lang", None)
    if function is None or patch_lang is None or not hasattr(function, "rewrite"):
        return False
    if getattr(function.__call__, "_skips_repeated_patches", False):
        return True

    def patched(lang) -> bool:
        # _patch_lang_core sets multiple_of to a functools.partial on every module it patches; restore() undoes it.
        return isinstance(getattr(lang, "multiple_of", None), functools.partial)

    @functools.cache
    def languages(fn) -> tuple:
        """The language modules a helper's globals hold, as _patch_lang finds them (a module's imports stay put)."""
        return tuple(v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))

    def call(self, *args, **kwargs):
        langs = languages(self.fn)
        if not langs or not all(patched(lang) for lang in langs):
            patch_lang(self.fn)  # outside a launch, or a module the launch did not patch: as the interpreter does
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    call._skips_repeated_patches = True
    function.__call__ = call
    return True
