"""The layout cache: reuse by identity, by registered provenance and by content (clones, batch copies, inference
tensors), never a false hit (other graphs of the same shape, in-place writes, other strides), bounded memory.
Through the layer, so each reuse is also checked against the PyG backend's answer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gtnorm.triton.layout import GraphLayout
from gtnorm.triton.layout_cache import (
    LayoutCache,
    cached_graph_value,
    cached_layout,
    clear_layout_cache,
    register_batch_copies,
)
from tests.conftest import DEVICE, HAS_CUDA
from tests.graphs import SmallGraph, make_graph
from tests.nn.test_conv import _call, _pyg_on, make_conv


@pytest.fixture(autouse=True)
def empty_layout_cache():
    clear_layout_cache()
    yield
    clear_layout_cache()


def _expanded(graph: SmallGraph, copies: int) -> SmallGraph:
    """Anemoi's batch expansion, a fresh tensor each call: copies concatenated, node ids offset per copy."""
    increment = torch.tensor([[graph.num_src], [graph.num_dst]])
    edge_index = torch.cat([graph.edge_index + b * increment for b in range(copies)], dim=1)
    return SmallGraph(f"{graph.name}x{copies}", edge_index, copies * graph.num_src, copies * graph.num_dst)


def _assert_matches_pyg(conv, graph, edge_index):
    out, inputs = _call(conv, graph, edge_index)
    torch.testing.assert_close(out, _pyg_on(graph, edge_index, inputs), rtol=1e-5, atol=1e-5)


def test_same_edge_index_builds_once(count_layout_builds):
    graph = make_graph("random_bipartite", seed=5)
    edge_index = graph.edge_index.to(DEVICE)
    conv = make_conv(8, backend="triton")
    for _ in range(3):
        _call(conv, graph, edge_index)
    # Another module on the same graph (a processor's next block) shares the layout.
    _call(make_conv(8, backend="triton", seed=1), graph, edge_index)
    # So does a view of the same memory, and a clone (same content).
    _call(conv, graph, edge_index[:, :])
    _assert_matches_pyg(conv, graph, edge_index.clone())
    _assert_matches_pyg(conv, graph, edge_index.int())
    assert len(count_layout_builds) == 1


def test_batch_copies_reuse_the_base_layout(count_layout_builds):
    graph = make_graph("encoder_like", seed=3)
    conv = make_conv(8, backend="triton")
    cached_layout(graph.edge_index.to(DEVICE), (graph.num_src, graph.num_dst))  # as a model registers its graph
    for copies in (3, 3, 2):
        expanded = _expanded(graph, copies)
        _assert_matches_pyg(conv, expanded, expanded.edge_index.to(DEVICE))  # a new tensor every step
    assert len(count_layout_builds) == 1
    layout = cached_layout(_expanded(graph, 3).edge_index.to(DEVICE), (3 * graph.num_src, 3 * graph.num_dst))
    assert layout.num_edges == 3 * graph.edge_index.shape[1]


def test_inference_tensors_hit_by_content(count_layout_builds):
    graph = make_graph("decoder_like", seed=10)
    conv = make_conv(8, backend="triton")
    with torch.inference_mode():
        edge_index = graph.edge_index.to(DEVICE) + 0  # an inference tensor: no version counter
        out, inputs = _call(conv, graph, edge_index)
        _call(conv, graph, edge_index)
        expected = _pyg_on(graph, edge_index, inputs)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # The layout first met in inference serves training (its tensors are no inference tensors).
    query = torch.randn(graph.num_dst, 2, 8, device=DEVICE, requires_grad=True)
    key, value = torch.randn(2, graph.num_src, 2, 8, device=DEVICE)
    conv(query, key, value, None, graph.edge_index.to(DEVICE), size=(graph.num_src, graph.num_dst)).sum().backward()
    assert len(count_layout_builds) == 1


def test_inference_tensor_seen_before_hits_by_identity(count_layout_builds, count_compares):
    """An inference tensor seen before (or a view of the same elements) is found with no compare; a new one holding
    the same graph is compared once."""
    graph = make_graph("processor_like", seed=21)
    conv = make_conv(8, backend="triton")
    cached_layout(graph.edge_index.to(DEVICE), (graph.num_src, graph.num_dst))
    with torch.inference_mode():
        edge_index = graph.edge_index.to(DEVICE) + 0
        _call(conv, graph, edge_index)
        assert len(count_compares) == 1
        for again in (edge_index, edge_index[:, :], edge_index, edge_index.view(2, -1)):
            out, inputs = _call(conv, graph, again)
            torch.testing.assert_close(out, _pyg_on(graph, again, inputs), rtol=1e-5, atol=1e-5)
        assert len(count_compares) == 1
        _call(conv, graph, edge_index.clone())  # a new tensor: compared
    assert len(count_compares) == 2 and len(count_layout_builds) == 1


@pytest.mark.parametrize("copies", [1, 3])
def test_inference_tensor_written_in_place_raises(copies, count_compares):
    """Without a version counter the write cannot be seen by identity: the hit's device-side check raises instead of
    serving the old layout. On the CPU, where it raises at once (on CUDA it ends the process: the next test)."""
    graph = make_graph("encoder_like", seed=22)
    cached_layout(graph.edge_index, (graph.num_src, graph.num_dst))
    num_nodes = (copies * graph.num_src, copies * graph.num_dst)
    with torch.inference_mode():
        edge_index = _expanded(graph, copies).edge_index
        layout = cached_layout(edge_index, num_nodes)
        assert cached_layout(edge_index, num_nodes) is layout  # the check passes while the content is the graph's
        edge_index[0, -1] = (edge_index[0, -1] + 1) % num_nodes[0]
        with pytest.raises(RuntimeError, match="changed in place"):
            cached_layout(edge_index, num_nodes)
    assert len(count_compares) == 1


_WRITE_INTO_AN_INFERENCE_GRAPH = """
import torch
from gtnorm.triton.layout_cache import cached_layout
from tests.graphs import make_graph

graph = make_graph("encoder_like", seed=22)
num_nodes = (graph.num_src, graph.num_dst)
with torch.inference_mode():
    edge_index = graph.edge_index.cuda()
    cached_layout(edge_index, num_nodes)
    cached_layout(edge_index, num_nodes)
    torch.cuda.synchronize()
    print("content unchanged: passed", flush=True)
    edge_index[0, -1] = (edge_index[0, -1] + 1) % num_nodes[0]
    cached_layout(edge_index, num_nodes)
    torch.cuda.synchronize()
print("changed content served", flush=True)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_inference_tensor_written_in_place_fails_on_the_device():
    """On CUDA the check is a device-side assertion: it ends the process's CUDA context, so it runs in a process of
    its own, which must get past the unchanged lookups and then fail rather than serve the changed content."""
    result = subprocess.run(
        [sys.executable, "-c", _WRITE_INTO_AN_INFERENCE_GRAPH], capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert "content unchanged: passed" in result.stdout, result.stderr[-2000:]
    assert result.returncode != 0 and "changed content served" not in result.stdout
    assert "device-side assert" in result.stderr, result.stderr[-2000:]


def test_registered_batch_copies_hit_by_identity(count_layout_builds, count_compares):
    """Registered copies get their layout with no compare: the layout a content lookup of the same graph gets."""
    graph = make_graph("encoder_like", seed=23)
    base = graph.edge_index.to(DEVICE)
    conv = make_conv(8, backend="triton")
    for _ in range(3):  # a new tensor every step, as Anemoi's graph providers make them
        expanded = _expanded(graph, 3)
        edge_index = expanded.edge_index.to(DEVICE)
        register_batch_copies(edge_index, base, (graph.num_src, graph.num_dst), 3)
        _assert_matches_pyg(conv, expanded, edge_index)
        assert count_compares == [] and len(count_layout_builds) == 1  # the base: built at the first lookup
    num_nodes = (expanded.num_src, expanded.num_dst)
    assert cached_layout(edge_index, num_nodes) is cached_layout(edge_index.clone(), num_nodes)
    assert len(count_compares) == 1  # the clone's
    with torch.inference_mode():  # an inference tensor made from a normal base: registered, and checked
        edge_index = torch.cat([base, base + torch.tensor([[graph.num_src], [graph.num_dst]], device=DEVICE)], 1)
        register_batch_copies(edge_index, base, (graph.num_src, graph.num_dst), 2)
        layout = cached_layout(edge_index, (2 * graph.num_src, 2 * graph.num_dst))
        assert len(count_compares) == 1 and layout.num_edges == 2 * base.shape[1]


def test_registered_inference_copies_written_in_place_raise():
    """A registered inference tensor's hits are checked like any inference tensor's: a write raises. On the CPU,
    where it raises at once (test_inference_tensor_written_in_place_fails_on_the_device covers CUDA)."""
    graph = make_graph("encoder_like", seed=23)
    base = graph.edge_index.clone()
    num_nodes = (2 * graph.num_src, 2 * graph.num_dst)
    with torch.inference_mode():
        edge_index = torch.cat([base, base + torch.tensor([[graph.num_src], [graph.num_dst]])], 1)
        register_batch_copies(edge_index, base, (graph.num_src, graph.num_dst), 2)
        cached_layout(edge_index, num_nodes)
        edge_index[1, 0] += 1
        with pytest.raises(RuntimeError, match="changed in place"):
            cached_layout(edge_index, num_nodes)


def test_registered_tensors_written_in_place_are_compared(count_layout_builds, count_compares):
    """A write into a registered tensor, or into its base before the tensor's first lookup, leaves it to the
    content path: never the layout of what was registered."""
    graph = make_graph("processor_like", seed=24)
    base = graph.edge_index.clone().to(DEVICE)
    sizes = (graph.num_src, graph.num_dst)
    cached_layout(base, sizes)
    written = _expanded(graph, 2)
    edge_index = written.edge_index.to(DEVICE)
    register_batch_copies(edge_index, base, sizes, 2)
    edge_index[1, :4] = (edge_index[1, :4] + 1) % written.num_dst  # the tensor itself
    _assert_matches_pyg(make_conv(8, backend="triton"), written, edge_index)
    assert len(count_compares) == 1 and len(count_layout_builds) == 2

    edge_index = _expanded(graph, 2).edge_index.to(DEVICE)
    register_batch_copies(edge_index, base, sizes, 2)
    base[0, :3] = (base[0, :3] + 1) % graph.num_src  # its base, after the expansion
    _assert_matches_pyg(make_conv(8, backend="triton"), written, edge_index)
    assert len(count_compares) == 2 and len(count_layout_builds) == 2  # found by content: copies of the graph


def test_dead_aliases_are_dropped():
    graph = make_graph("encoder_like", seed=26)
    base = graph.edge_index.to(DEVICE)
    cache = LayoutCache()
    for _ in range(300):
        cache.register_batch_copies(torch.cat([base, base + 100], 1), base, (graph.num_src, graph.num_dst), 2)
    assert len(cache._aliases) < 130


def test_chunks_of_equal_shape_keep_their_own_layouts(count_layout_builds):
    """Anemoi's decoder splits a graph into mapper chunks of equal shape and different content: no false hits."""
    graph = make_graph("decoder_like", seed=4)
    chunks = graph.edge_index.chunk(4, dim=1)
    shapes = {c.shape for c in chunks}
    conv = make_conv(8, backend="triton")
    for _ in range(2):
        for chunk in chunks:
            chunk_graph = SmallGraph("chunk", chunk, graph.num_src, graph.num_dst)
            _assert_matches_pyg(conv, chunk_graph, chunk.clone().to(DEVICE))
    assert len(shapes) == 1 and len(count_layout_builds) == 4


def test_in_place_write_rebuilds(count_layout_builds):
    graph = make_graph("processor_like", seed=6)
    edge_index = graph.edge_index.clone().to(DEVICE)
    original = edge_index.clone()
    conv = make_conv(8, backend="triton")
    _call(conv, graph, edge_index)
    edge_index[1, :5] = (edge_index[1, :5] + 1) % graph.num_dst  # same memory, new graph
    _assert_matches_pyg(conv, graph, edge_index)
    assert len(count_layout_builds) == 2
    # A write through a view bumps the shared version counter too.
    edge_index[0].fill_(0)
    _assert_matches_pyg(conv, graph, edge_index)
    assert len(count_layout_builds) == 3
    # Written back to the first graph's content: found again.
    edge_index.copy_(original)
    _assert_matches_pyg(conv, graph, edge_index)
    assert len(count_layout_builds) == 3


def test_same_memory_with_other_strides_is_another_graph(count_layout_builds):
    num_nodes = 30
    memory = (torch.arange(2 * num_nodes) * 7 % num_nodes).to(DEVICE)
    by_rows = memory.view(2, num_nodes)  # sources are the first half of memory
    interleaved = memory.view(num_nodes, 2).t()  # same memory and shape, sources at even positions
    assert by_rows.data_ptr() == interleaved.data_ptr() and by_rows.shape == interleaved.shape
    graph = SmallGraph("square", by_rows.cpu(), num_nodes, num_nodes)
    conv = make_conv(8, backend="triton")
    _call(conv, graph, by_rows)
    _assert_matches_pyg(conv, graph, interleaved)
    assert len(count_layout_builds) == 2


def test_other_node_counts_are_another_graph(count_layout_builds):
    graph = make_graph("random_bipartite", seed=8)
    edge_index = graph.edge_index.to(DEVICE)
    conv = make_conv(8, backend="triton")
    _call(conv, graph, edge_index)
    bigger = SmallGraph("bigger", graph.edge_index, graph.num_src + 2, graph.num_dst + 3)
    out, _ = _call(conv, bigger, edge_index)
    assert len(count_layout_builds) == 2 and out.shape[0] == graph.num_dst + 3


def test_freed_memory_reused_by_another_graph_is_not_hit(count_layout_builds):
    """A new graph may be allocated where a freed one was (same data_ptr, shape, version 0): it must not be
    served the freed graph's layout."""
    graph = make_graph("processor_like", seed=9)
    conv = make_conv(8, backend="triton")
    _call(conv, graph, graph.edge_index.clone().to(DEVICE))  # the edge_index dies after the call
    for _ in range(3):
        shuffled = graph.edge_index[:, torch.randperm(graph.edge_index.shape[1])].to(DEVICE)
        _assert_matches_pyg(conv, graph, shuffled)
        del shuffled
    assert len(count_layout_builds) == 4


def test_least_recently_used_graph_is_evicted(count_layout_builds):
    cache = LayoutCache(max_graphs=2)
    graphs = [make_graph("decoder_like", seed=s) for s in range(3)]
    for g in graphs + graphs[1:]:
        cache.get(g.edge_index, g.num_src, g.num_dst)
    assert len(count_layout_builds) == 3 and len(cache) == 2
    cache.get(graphs[0].edge_index, graphs[0].num_src, graphs[0].num_dst)
    assert len(count_layout_builds) == 4 and len(cache) == 2


def test_derived_graphs_live_in_their_parent_s_entry(count_layout_builds, count_compares):
    """Graphs registered as derived from another (a mapper's chunks) are found by identity with no compare, do not
    count against max_graphs, keep their parent in the LRU when looked up, and go with it when it is evicted."""
    cache = LayoutCache(max_graphs=2)
    parent, other, third = (make_graph("decoder_like", seed=s) for s in (3, 4, 5))
    parts = [make_graph("encoder_like", seed=s) for s in range(4)]  # any graphs: the cache trusts the caller
    for part in parts:
        cache.register_derived_graph(part.edge_index, part.num_src, part.num_dst, parent.edge_index,
                                     (parent.num_src, parent.num_dst))  # fmt: skip
    assert len(cache) == 1
    count_compares.clear()
    for _ in range(2):
        for part in parts:
            cache.get(part.edge_index, part.num_src, part.num_dst)
    assert len(count_layout_builds) == 4 and count_compares == [] and len(cache) == 1
    cache.get(other.edge_index, other.num_src, other.num_dst)
    cache.get(parts[0].edge_index, parts[0].num_src, parts[0].num_dst)  # the parent is now the newest
    cache.get(third.edge_index, third.num_src, third.num_dst)  # evicts `other`, not the parent
    assert len(cache) == 2 and len(count_layout_builds) == 6
    cache.get(parts[1].edge_index, parts[1].num_src, parts[1].num_dst)
    cache.get(third.edge_index, third.num_src, third.num_dst)
    assert len(count_layout_builds) == 6
    cache.get(other.edge_index, other.num_src, other.num_dst)  # evicts the parent, and its derived graphs with it
    cache.get(parts[1].edge_index, parts[1].num_src, parts[1].num_dst)  # now a graph of its own
    assert len(count_layout_builds) == 8
    # Kept, not copied: once written in place, its layout (built before) is not served; the new content gets its own.
    written = parts[2].edge_index.clone()
    cache.register_derived_graph(written, parts[2].num_src, parts[2].num_dst, third.edge_index,
                                 (third.num_src, third.num_dst))  # fmt: skip
    before = cache.get(written, parts[2].num_src, parts[2].num_dst)
    written[1] = written[1].flip(0)
    found = cache.get(written, parts[2].num_src, parts[2].num_dst)
    assert found is not before
    fresh = GraphLayout.from_edge_index(written.clone(), (parts[2].num_src, parts[2].num_dst))
    assert all(torch.equal(a, b) for a, b in zip(found.tensors(), fresh.tensors(), strict=True))
    with pytest.raises(ValueError, match="inference"):
        with torch.inference_mode():
            inferred = parts[0].edge_index.clone()
        cache.register_derived_graph(inferred, parts[0].num_src, parts[0].num_dst, parent.edge_index,
                                     (parent.num_src, parent.num_dst))  # fmt: skip
    with pytest.raises(ValueError, match="edge_index must"):
        cache.register_derived_graph(parts[0].edge_index[0], parts[0].num_src, parts[0].num_dst, parent.edge_index,
                                     (parent.num_src, parent.num_dst))  # fmt: skip


def test_graph_values_are_computed_once_per_graph_and_derivation(count_layout_builds, count_compares):
    """A value derived from a graph (gtnorm/anemoi/mapper.py keeps Anemoi's mapper chunks so) is computed once and
    found again as a layout is: by identity with no compare, by content for a clone; never for another graph of the
    same shape, another derivation or batch copies; gone when the graph is evicted. No layout is built for it."""
    cache = LayoutCache(max_graphs=2)
    graph, other = (make_graph("decoder_like", seed=s) for s in (3, 4))
    computed = []

    def value(g, derivation, edge_index=None):
        edge_index = g.edge_index if edge_index is None else edge_index
        return cache.graph_value(
            edge_index, g.num_src, g.num_dst, derivation, lambda: computed.append(derivation) or (derivation, g.name)
        )

    assert value(graph, "a") == ("a", graph.name)
    count_compares.clear()
    assert value(graph, "a") == ("a", graph.name) and computed == ["a"] and count_compares == []
    assert value(graph, "a", graph.edge_index.clone()) == ("a", graph.name) and computed == ["a"]
    value(graph, "b")
    value(other, "a")
    assert computed == ["a", "b", "a"]
    twice = _expanded(graph, 2)
    cache.register_batch_copies(twice.edge_index, graph.edge_index, (graph.num_src, graph.num_dst), 2)
    value(twice, "a")
    assert computed == ["a", "b", "a", "a"]
    assert count_layout_builds == []
    value(make_graph("encoder_like", seed=1), "a")  # a third graph: the least recently used one is evicted
    value(other, "a")
    assert computed == ["a", "b", "a", "a", "a", "a"]
    with pytest.raises(TypeError, match="unhashable"):
        cached_graph_value(graph.edge_index, (graph.num_src, graph.num_dst), ["a list"], lambda: None)


def test_graph_value_no_longer_current_is_computed_and_kept_again():
    graph = make_graph("decoder_like", seed=3)
    sizes = (graph.num_src, graph.num_dst)
    made = []

    def value(is_current=None):
        return cached_graph_value(graph.edge_index, sizes, "d", lambda: made.append(None) or [len(made)], is_current)

    first = value()
    assert value() is first and value(lambda v: v[0] == 1) is first and len(made) == 1
    second = value(lambda v: v[0] != 1)  # the kept value is stale: computed again, and kept in its place
    assert second == [2] and value() is second and len(made) == 2
    assert cached_graph_value(graph.edge_index, sizes, "none", lambda: None) is None
    assert cached_graph_value(graph.edge_index, sizes, "none", lambda: made.append(None)) is None and len(made) == 2


def test_pyg_backend_builds_no_layout(count_layout_builds):
    _call(make_conv(8, backend="pyg"), make_graph("decoder_like", seed=11))
    assert count_layout_builds == []


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="shape"):
        cached_layout(torch.zeros(3, 4, dtype=torch.long), (2, 2))
    with pytest.raises(ValueError, match="num_nodes"):
        cached_layout(torch.zeros(2, 4, dtype=torch.long), (2, -2))
    base = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="copies \\* M"):
        register_batch_copies(torch.zeros(2, 6, dtype=torch.long), base, (2, 2), 2)
    with pytest.raises(ValueError, match="copies"):
        register_batch_copies(base, base, (2, 2), 0)
    with pytest.raises(TypeError, match="int64 or int32"):
        register_batch_copies(base.float(), base, (2, 2), 1)
    with pytest.raises(TypeError, match="int64 or int32"):
        cached_graph_value(base.float(), (2, 2), "a derivation", lambda: None)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_identity_hit_makes_no_host_sync():
    graph = make_graph("encoder_like", seed=2)
    edge_index = graph.edge_index.cuda()
    conv = make_conv(8, backend="triton", device="cuda")
    _, inputs = _call(conv, graph, edge_index)
    args = (inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"], edge_index)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:  # the lookup and the op's launches
        conv(*args, size=(graph.num_src, graph.num_dst))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_inference_and_registered_hits_make_no_host_sync():
    """The identity hit of an inference tensor (its asynchronous check included) and the first lookups of
    registered batch copies, inference tensors, with the layer's launches."""
    graph = make_graph("encoder_like", seed=27)
    base = graph.edge_index.cuda()
    increment = torch.tensor([[graph.num_src], [graph.num_dst]]).cuda()
    expanded = _expanded(graph, 2)
    conv = make_conv(8, backend="triton", device="cuda")
    _call(conv, graph, base)  # the base graph: built
    with torch.inference_mode():
        seen = base + 0
        _, inputs = _call(conv, graph, seen)  # a new inference tensor: compared once
        _, copies_inputs = _call(conv, expanded)
    names = ("query", "key", "value", "edge_attr")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            conv(*(inputs[k] for k in names), seen, size=(graph.num_src, graph.num_dst))
            for _ in range(2):
                made = torch.cat([base, base + increment], 1)
                register_batch_copies(made, base, (graph.num_src, graph.num_dst), 2)
                conv(*(copies_inputs[k] for k in names), made, size=(expanded.num_src, expanded.num_dst))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()  # the asynchronous checks passed


@pytest.mark.parametrize("backend", ["triton", "pyg"])
def test_compiled_layer_has_no_graph_break_and_sees_new_graphs(backend, recwarn):
    """fullgraph=True: the lookup is an op of its own (tracing cannot follow it), so the compiled layer still
    finds every graph by content, in-place writes included; the PyG path checks indices on the device."""
    backend_kind = "inductor" if HAS_CUDA else "aot_eager"  # inductor on the CPU would need a C++ toolchain
    graph = make_graph("processor_like", seed=18)
    edge_index = graph.edge_index.clone().to(DEVICE)
    conv = torch.compile(make_conv(8, backend=backend), fullgraph=True, backend=backend_kind)
    for _ in range(2):
        _assert_matches_pyg(conv, graph, edge_index)
        edge_index[1, :10] = (edge_index[1, :10] + 3) % graph.num_dst
    assert not [w for w in recwarn if "dynamo" in str(w.message).lower() or "graph break" in str(w.message)]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_graphs_of_the_compiled_layer_see_new_graphs():
    """mode="reduce-overhead" replays CUDA graphs: the lookup must still run for every call, so two graphs of one
    shape and different content (Anemoi's decoder chunks) each get their own layout."""
    conv = torch.compile(make_conv(8, backend="triton", device="cuda"), mode="reduce-overhead", fullgraph=True)
    first = make_graph("processor_like", seed=18)
    edge_index = first.edge_index.clone().cuda()
    for step in range(4):
        _assert_matches_pyg(conv, first, edge_index.clone())
        edge_index[1, : 10 + step] = (edge_index[1, : 10 + step] + 3) % first.num_dst
