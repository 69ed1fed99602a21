"""Counting what ran: launches of gtnorm's Triton kernels and calls of its attention op.

A test that says gtnorm's kernels ran checks it with these counts, which the code under test produces (a flag the test
sets, or an environment check, cannot fail). Every kernel of the attention and the edge projection launches through a
:class:`gtnorm.triton.launcher.Launcher` (gtnorm/triton/attention_launch.py, edge_projection_launch.py), compiled or
interpreted: patching ``Launcher.launch`` sees each launch. The op's entry points (``ops.attention_forward`` /
``ops.attention_backward``) are counted too: one call per attention call, whether or not the graph had edges (a graph
without edges launches no walk).

Usable from other processes (Anemoi's own tests in a subprocess, the ranks of a distributed test): the counts are
plain dicts of ints.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

FORWARD = "graph_attention_forward_kernel"
BY_DESTINATION = "edge_softmax_backward_by_destination_kernel"
BY_SOURCE = "edge_softmax_backward_by_source_kernel"
# The op's entry points, counted under these names beside the kernels.
FORWARD_CALLS = "attention_forward()"
BACKWARD_CALLS = "attention_backward()"
# The PyG path of gtnorm's layer where its kernels could have run (what the Triton backend must not take), and
# where they could not (CPU tensors without the interpreter: on a CUDA machine, a test that builds on the CPU),
# which Anemoi's Triton backend falls back from in the same way.
PYG_CALLS = "reference_graph_transformer_attention()"
PYG_CALLS_WITHOUT_KERNELS = "reference_graph_transformer_attention() where no kernel can run"


def kernel_name(kernel) -> str:
    # A JITFunction and the interpreter's InterpretedFunction both carry the Python function's name.
    return getattr(kernel, "__name__", None) or kernel.fn.__name__


@contextlib.contextmanager
def count_launches() -> Iterator[Counter]:
    """Counts, while the block runs: launches per kernel name (FORWARD, BY_DESTINATION, BY_SOURCE, the projection's
    and the column sums'), calls of the op's forward and backward (FORWARD_CALLS, BACKWARD_CALLS) and calls of the
    layer's PyG path (PYG_CALLS where the kernels could have run on the query's device, PYG_CALLS_WITHOUT_KERNELS
    where they could not). Restores everything on exit, also after an exception."""
    from gtnorm._runtime import triton_can_run_on
    from gtnorm.nn import conv
    from gtnorm.triton import ops
    from gtnorm.triton.launcher import Launcher

    counts: Counter = Counter()
    launch, forward, backward, pyg = Launcher.launch, ops.attention_forward, ops.attention_backward, None

    def counting_launch(self, grid, args, kwargs):
        counts[kernel_name(self.kernel)] += 1
        return launch(self, grid, args, kwargs)

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    pyg = conv.reference_graph_transformer_attention

    def counted_pyg(query, *args, **kwargs):
        counts[PYG_CALLS if triton_can_run_on(query.device) else PYG_CALLS_WITHOUT_KERNELS] += 1
        return pyg(query, *args, **kwargs)

    Launcher.launch = counting_launch
    # ops' own functions call these by their module-level names (the custom ops were registered with wrappers that
    # look them up at call time: _attention_forward_op / _attention_backward_op), so patching the module covers the
    # eager Function, the custom ops and torch.compile's graphs alike.
    ops.attention_forward = counted(FORWARD_CALLS, forward)
    ops.attention_backward = counted(BACKWARD_CALLS, backward)
    conv.reference_graph_transformer_attention = counted_pyg
    try:
        yield counts
    finally:
        Launcher.launch = launch
        ops.attention_forward, ops.attention_backward = forward, backward
        conv.reference_graph_transformer_attention = pyg


def attention_ran(counts: dict[str, int]) -> str | None:
    """None where the counts (count_launches', or a plain dict of them from another process) show gtnorm's
    attention kernels ran forward and backward and never its PyG path; else what is missing (for an assertion's
    message)."""
    missing = [name for name in (FORWARD, BY_DESTINATION, BY_SOURCE) if not counts.get(name)]
    if missing or counts.get(PYG_CALLS):
        return f"kernels without a launch: {missing}; PyG path calls: {counts.get(PYG_CALLS, 0)}; counts: {counts}"
    return None
