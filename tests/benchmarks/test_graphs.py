"""Benchmark graphs: grid and mesh geometry, the three edge rules against brute force, catalog and cache.

Only O <= 160 / r <= 6 are built here; the full-size O320 / O640 encoders take seconds and are checked by hand
(see the encoder-coverage note below).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist

from benchmarks.graphs import catalog, edges, grids
from benchmarks.graphs.catalog import SUITES, BenchGraph, graph_names, load_graph

SMALL_AND_TINY = SUITES["small"] + SUITES["tiny"]


@pytest.fixture(scope="module")
def mesh6() -> grids.IcosahedralMesh:
    return grids.icosahedral_mesh(6)


@pytest.fixture(scope="module")
def built() -> dict[str, BenchGraph]:
    """Small and tiny named graphs, built once without the cache."""
    return {name: catalog.build_graph(name) for name in SMALL_AND_TINY}


def assert_on_unit_sphere(xyz: np.ndarray) -> None:
    assert xyz.dtype == np.float64 and xyz.ndim == 2 and xyz.shape[1] == 3
    np.testing.assert_allclose(np.linalg.norm(xyz, axis=1), 1.0, atol=1e-12)


def undirected_edge_count(triangles: np.ndarray) -> int:
    a, b, c = triangles.T
    pairs = np.sort(np.stack([np.r_[a, b, c], np.r_[b, c, a]], axis=1), axis=1)
    return len(np.unique(pairs, axis=0))


# --- octahedral reduced Gaussian grid -----------------------------------------------------------------------


@pytest.mark.parametrize("n, expected", [(1, 40), (8, 544), (96, 40_320), (320, 421_120)])
def test_octahedral_point_count(n, expected):
    xyz = grids.octahedral_grid(n)
    assert len(xyz) == expected == 4 * n * (n + 9) == grids.octahedral_num_points(n)
    assert_on_unit_sphere(xyz)


def test_octahedral_point_count_o640_formula():
    assert grids.octahedral_num_points(640) == 1_661_440
    assert grids.octahedral_row_lengths(640).sum() == 1_661_440


def test_octahedral_rows():
    n = 24
    lat, lon = grids.octahedral_latlon(n)
    row_len = grids.octahedral_row_lengths(n)
    assert row_len[0] == row_len[-1] == 20 and row_len[n - 1] == row_len[n] == 4 * n + 16
    row_lat = lat[np.cumsum(row_len) - 1]
    assert np.all(np.diff(row_lat) < 0), "rows run north to south"
    np.testing.assert_allclose(row_lat, -row_lat[::-1], atol=1e-14)  # Gaussian latitudes are symmetric
    np.testing.assert_allclose(np.sin(row_lat[::-1]), np.polynomial.legendre.leggauss(2 * n)[0], atol=1e-14)
    first_in_row = np.r_[0, np.cumsum(row_len)[:-1]]
    assert np.all(lon[first_in_row] == 0.0)
    # Equal spacing within each row, no two points alike.
    np.testing.assert_allclose(lon[first_in_row + 1], 2 * np.pi / row_len)
    assert len(np.unique(np.round(grids.octahedral_grid(n), 12), axis=0)) == len(lat)


# --- icosahedral mesh ----------------------------------------------------------------------------------------


def test_icosahedral_node_counts_and_triangles(mesh6):
    assert mesh6.level == 6 and len(mesh6.vertices) == 40_962
    assert_on_unit_sphere(mesh6.vertices)
    for level, triangles in enumerate(mesh6.triangles):
        num_nodes = grids.icosahedral_num_nodes(level)
        assert num_nodes == 10 * 4**level + 2
        assert triangles.shape == (20 * 4**level, 3)
        # Level l's triangles use exactly the first num_nodes vertices, every one of them.
        assert np.array_equal(np.unique(triangles), np.arange(num_nodes))
        # A closed triangulation of the sphere: V - E + F = 2.
        assert undirected_edge_count(triangles) == 30 * 4**level
        assert num_nodes - 30 * 4**level + len(triangles) == 2


def test_icosahedral_levels_are_prefixes(mesh6):
    assert [grids.icosahedral_num_nodes(r) for r in (5, 6, 7)] == [10_242, 40_962, 163_842]
    for level in range(6):
        coarse = grids.icosahedral_mesh(level)
        assert np.array_equal(coarse.vertices, mesh6.vertices[: len(coarse.vertices)])
        for a, b in zip(coarse.triangles, mesh6.triangles[: level + 1], strict=True):
            assert np.array_equal(a, b)


def test_icosahedral_spacing_is_near_uniform(mesh6):
    # Midpoint refinement keeps the mesh within a modest spread; a broken refinement shows up here.
    from scipy.spatial import cKDTree

    dist, _ = cKDTree(mesh6.vertices).query(mesh6.vertices, k=2)
    assert dist[:, 1].max() / dist[:, 1].min() < 1.4


# --- processor: multi-scale edges ----------------------------------------------------------------------------


@pytest.mark.parametrize("level, expected", [(0, 60), (2, 1260), (5, 81_900), (6, 327_660)])
def test_multiscale_edge_count(mesh6, level, expected):
    mesh = grids.icosahedral_mesh(level) if level < 6 else mesh6
    edge_index = edges.multiscale_edges(mesh)
    assert edge_index.shape == (2, expected) and expected == 20 * (4 ** (level + 1) - 1)
    src, dst = edge_index
    assert not np.any(src == dst)
    forward = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert forward == set(zip(dst.tolist(), src.tolist(), strict=True)), "every edge in both directions"


def test_multiscale_edges_of_each_level_present():
    mesh = grids.icosahedral_mesh(3)
    edge_set = set(map(tuple, edges.multiscale_edges(mesh).T.tolist()))
    for triangles in mesh.triangles:
        a, b, c = triangles.T
        for s, d in ((a, b), (b, c), (c, a)):
            assert set(zip(s.tolist(), d.tolist(), strict=True)) <= edge_set


# --- decoder: k nearest --------------------------------------------------------------------------------------


@pytest.mark.parametrize("grid, level", [(8, 2), (24, 3)])
def test_decoder_sources_are_the_three_nearest(grid, level):
    data = grids.octahedral_grid(grid)
    hidden = grids.icosahedral_mesh(level).vertices
    edge_index = edges.knn_edges(hidden, data, 3)
    assert edge_index.shape == (2, 3 * len(data))
    src, dst = edge_index
    assert np.array_equal(dst, np.repeat(np.arange(len(data)), 3))
    dist = cdist(data, hidden)
    chosen = np.sort(dist[dst, src].reshape(-1, 3), axis=1)
    # Compare distances, not indices, so a tie for third place cannot fail the test.
    np.testing.assert_allclose(chosen, np.sort(dist, axis=1)[:, :3], rtol=0, atol=1e-12)


# --- encoder: cutoff radius, capped ---------------------------------------------------------------------------


@pytest.mark.parametrize("grid, level", [(8, 2), (16, 2), (24, 3)])
def test_encoder_matches_brute_force(grid, level):
    data = grids.octahedral_grid(grid)
    hidden = grids.icosahedral_mesh(level).vertices
    result = edges.cutoff_edges(data, hidden, 0.6, 64)
    spacing = cdist(hidden, hidden)
    np.fill_diagonal(spacing, np.inf)
    assert result.radius == pytest.approx(0.6 * spacing.min(axis=1).max(), rel=1e-12)

    dist = cdist(hidden, data)  # [dst, src]
    src, dst = result.edge_index
    assert np.all(dist[dst, src] <= result.radius * (1 + 1e-12)), "every edge within the radius"
    assert result.num_capped_destinations == 0 and np.bincount(dst).max() <= 64
    # Uncapped, the edges are every in-radius pair (away from the boundary, where rounding may decide).
    must = set(zip(*np.nonzero(dist < result.radius * (1 - 1e-9)), strict=True))
    got = set(zip(dst.tolist(), src.tolist(), strict=True))
    assert must <= got


def test_encoder_cap_keeps_the_nearest():
    data = grids.octahedral_grid(16)
    hidden = grids.icosahedral_mesh(2).vertices
    cap = 8
    result = edges.cutoff_edges(data, hidden, 0.6, cap)
    src, dst = result.edge_index
    dist = cdist(hidden, data)
    in_radius = dist < result.radius
    degree = np.bincount(dst, minlength=len(hidden))
    np.testing.assert_array_equal(degree, np.minimum(in_radius.sum(axis=1), cap))
    assert result.num_capped_destinations == int((in_radius.sum(axis=1) > cap).sum()) > 0
    for node in np.flatnonzero(in_radius.sum(axis=1) > cap):
        kept = src[dst == node]
        dropped = np.setdiff1d(np.flatnonzero(in_radius[node]), kept)
        assert dist[node, kept].max() <= dist[node, dropped].min() + 1e-12


# Encoder coverage (Anemoi's cutoff rule has no fix-up for unreached data nodes). Checked by hand for the full
# suite: O320 -> r6 and O640 -> r7 reach every data node, the farthest data node from any hidden node lying at
# 0.952 and 0.960 of the radius; the 64 cap never binds there. The coarse r2 mesh is irregular enough that a
# few data nodes lie outside every hidden node's radius (O8: 4 of 544 at +-70.8 deg, O16: 16 of 1600).
@pytest.mark.parametrize(
    "name, unreached",
    [("era_to_h_small", 0), ("dop_enc_small", 0), ("era_to_h_tiny", 4), ("dop_enc_tiny", 16)],
)
def test_encoder_coverage(built, name, unreached):
    graph = built[name]
    reached = torch.zeros(graph.num_src, dtype=torch.bool)
    reached[graph.edge_index[0]] = True
    assert int((~reached).sum()) == unreached
    assert catalog.source_coverage(graph) == pytest.approx(1 - unreached / graph.num_src)


def test_encoder_coverage_margin_o96_r5():
    # Every data node is reached because even the farthest lies well inside the radius, not by a hair.
    from scipy.spatial import cKDTree

    data = grids.octahedral_grid(96)
    hidden = grids.icosahedral_mesh(5).vertices
    radius = 0.6 * edges.max_nearest_neighbour_distance(hidden)
    farthest, _ = cKDTree(hidden).query(data, k=1)
    assert farthest.max() / radius == pytest.approx(0.952, abs=0.005)


# --- catalog --------------------------------------------------------------------------------------------------


def test_suites_and_names():
    assert SUITES["full"] == ("era_to_h", "h_to_h", "h_to_era", "dop_enc_large")
    assert set(SUITES) == {"full", "small", "tiny"}
    names = graph_names()
    assert len(names) == len(set(names)) == 13  # the suites' 12 and h_to_era_o1280, by name only
    for suite in SUITES.values():
        assert [catalog.GRAPH_SPECS[n].kind for n in suite] == ["encoder", "processor", "decoder", "encoder"]
        assert set(suite) <= set(names)


def test_full_suite_definitions():
    # Not built here (seconds, and memory); their sizes follow from the definitions.
    specs = catalog.GRAPH_SPECS
    assert (specs["era_to_h"].grid, specs["era_to_h"].level) == (320, 6)
    assert specs["h_to_h"].level == 6
    assert (specs["h_to_era"].grid, specs["h_to_era"].level, specs["h_to_era"].num_nearest) == (320, 6, 3)
    assert (specs["dop_enc_large"].grid, specs["dop_enc_large"].level) == (640, 7)
    for name in ("era_to_h", "dop_enc_large"):
        assert (specs[name].cutoff_factor, specs[name].max_neighbours) == (0.6, 64)
    assert 3 * grids.octahedral_num_points(320) == 1_263_360
    assert specs["era_to_h"].describe() == "O320 -> icosahedron r6, cutoff 0.6, <=64 nearest"


@pytest.mark.parametrize("name", SMALL_AND_TINY)
def test_graph_shape_direction_order(built, name):
    graph = built[name]
    spec = catalog.GRAPH_SPECS[name]
    ei = graph.edge_index
    assert ei.dtype == torch.int64 and ei.dim() == 2 and ei.shape[0] == 2 and ei.is_contiguous()
    assert graph.kind == spec.kind and graph.name == name
    num_data = grids.octahedral_num_points(spec.grid) if spec.grid else None
    num_hidden = grids.icosahedral_num_nodes(spec.level)
    expected_sizes = {
        "encoder": (num_data, num_hidden),  # source = data node, destination = hidden node
        "processor": (num_hidden, num_hidden),
        "decoder": (num_hidden, num_data),  # source = hidden node, destination = data node
    }[spec.kind]
    assert (graph.num_src, graph.num_dst) == expected_sizes
    assert int(ei.min()) >= 0 and int(ei[0].max()) < graph.num_src and int(ei[1].max()) < graph.num_dst
    # Sorted by (dst, src) strictly: the documented order, and no duplicate edges.
    key = ei[1] * graph.num_src + ei[0]
    assert bool((key[1:] > key[:-1]).all())
    if spec.kind == "decoder":
        assert graph.num_edges == 3 * graph.num_dst and graph.in_degree_stats() == (3, 3.0, 3)
    if spec.kind == "encoder":
        lo, _, hi = graph.in_degree_stats()
        assert 1 <= lo < hi <= 64


@pytest.mark.parametrize("name", ["era_to_h_small", "h_to_h_small", "h_to_era_tiny", "dop_enc_tiny"])
def test_build_is_deterministic(built, name):
    again = catalog.build_graph(name)
    assert torch.equal(again.edge_index, built[name].edge_index)
    assert (again.num_src, again.num_dst, again.description) == (
        built[name].num_src,
        built[name].num_dst,
        built[name].description,
    )


def test_tiny_suite_is_tiny(built):
    for name in SUITES["tiny"]:
        graph = built[name]
        assert graph.num_dst <= 600 and graph.num_src <= 1600 and graph.num_edges <= 2000
    # Varied in-degree, so the kernels' per-destination loops see short and long rows.
    for name, (lo, hi) in {"era_to_h_tiny": (2, 20), "h_to_h_tiny": (6, 15), "dop_enc_tiny": (9, 44)}.items():
        stats = built[name].in_degree_stats()
        assert (stats[0], stats[2]) == (lo, hi)


def test_in_degree_stats_counts_isolated_destinations():
    graph = BenchGraph("g", "encoder", torch.tensor([[0, 1, 2, 0], [0, 0, 0, 2]]), 3, 4, "")
    assert graph.num_edges == 4
    assert graph.in_degree_stats() == (0, 1.0, 3)


# --- on-disk cache --------------------------------------------------------------------------------------------


def test_cache_round_trip(tmp_path, monkeypatch, built, capsys):
    first = load_graph("h_to_era_tiny", cache_dir=tmp_path, verbose=True)
    assert capsys.readouterr().out.count("\n") == 1  # one progress line
    files = list(tmp_path.iterdir())
    assert files == [catalog.cache_path("h_to_era_tiny", tmp_path)]  # no temporary file left behind
    assert torch.equal(first.edge_index, built["h_to_era_tiny"].edge_index)

    def no_building(*args, **kwargs):
        raise AssertionError("should have been read from the cache")

    monkeypatch.setattr(catalog, "build_edges", no_building)
    second = load_graph("h_to_era_tiny", cache_dir=tmp_path)
    assert torch.equal(second.edge_index, first.edge_index)
    assert (second.name, second.kind, second.num_src, second.num_dst, second.description) == (
        first.name,
        first.kind,
        first.num_src,
        first.num_dst,
        first.description,
    )


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(catalog.CACHE_ENV_VAR, str(tmp_path))
    load_graph("h_to_h_tiny")
    assert catalog.cache_path("h_to_h_tiny").parent == tmp_path
    assert catalog.cache_path("h_to_h_tiny").is_file()
    monkeypatch.delenv(catalog.CACHE_ENV_VAR)
    assert catalog.resolve_cache_dir() == catalog.DEFAULT_CACHE_DIR


def test_changed_definition_changes_the_cache_key(tmp_path, monkeypatch):
    import dataclasses

    name = "era_to_h_tiny"
    spec = catalog.GRAPH_SPECS[name]
    original = load_graph(name, cache_dir=tmp_path)
    keys = {spec.cache_key()}
    for change in (dict(cutoff_factor=0.7), dict(max_neighbours=8), dict(grid=12), dict(level=3)):
        keys.add(dataclasses.replace(spec, **change).cache_key())
    assert len(keys) == 5
    monkeypatch.setattr(catalog, "FORMAT_VERSION", catalog.FORMAT_VERSION + 1)
    assert spec.cache_key() not in keys
    monkeypatch.undo()

    wider = dataclasses.replace(spec, cutoff_factor=0.7)
    monkeypatch.setitem(catalog.GRAPH_SPECS, name, wider)
    changed = load_graph(name, cache_dir=tmp_path)
    assert changed.num_edges > original.num_edges  # built afresh, not the stale file
    assert len(list(tmp_path.iterdir())) == 2


def test_unreadable_or_mismatched_cache_file_is_rebuilt(tmp_path, built):
    name = "h_to_h_tiny"
    path = catalog.cache_path(name, tmp_path)
    path.write_bytes(b"truncated")
    assert torch.equal(load_graph(name, cache_dir=tmp_path).edge_index, built[name].edge_index)
    torch.save(dict(definition="something else", edge_index=torch.zeros(2, 1, dtype=torch.long)), path)
    assert torch.equal(load_graph(name, cache_dir=tmp_path).edge_index, built[name].edge_index)
    torch.save([1, 2], path)
    assert torch.equal(load_graph(name, cache_dir=tmp_path).edge_index, built[name].edge_index)


# --- the 9 km decoder (h_to_era_o1280, issue 50): by name only, its variants each in a process -------------------


def test_o1280_decoder_is_named_outside_every_suite():
    spec = catalog.GRAPH_SPECS["h_to_era_o1280"]
    assert (spec.kind, spec.level, spec.grid, spec.num_nearest) == ("decoder", 7, 1280, 3)
    assert grids.octahedral_num_points(1280) == 6_599_680 and grids.icosahedral_num_nodes(7) == 163_842
    assert 3 * grids.octahedral_num_points(1280) == 19_799_040
    assert all("h_to_era_o1280" not in suite for suite in SUITES.values())
    assert catalog.ISOLATED_GRAPHS == {"h_to_era_o1280"}
    assert spec.describe() == "icosahedron r7 -> O1280, 3 nearest hidden nodes per data node"


def test_gaussian_nodes_from_scipy_above_the_threshold_agree_with_leggauss(monkeypatch):
    # Up to O640 the nodes are leggauss's, bit for bit (the cached graphs' edges stay the same).
    assert np.array_equal(grids.gaussian_nodes(96), np.polynomial.legendre.leggauss(96)[0])
    monkeypatch.setattr(grids, "LEGGAUSS_MAX_ROWS", 64)
    from_scipy = grids.gaussian_nodes(200)
    np.testing.assert_allclose(from_scipy, np.polynomial.legendre.leggauss(200)[0], rtol=0, atol=1e-14)
    assert np.all(np.diff(from_scipy) > 0)


def test_decoder_edges_without_the_global_sort_are_sort_by_destinations():
    data = grids.octahedral_grid(24)
    hidden = grids.icosahedral_mesh(3).vertices
    from scipy.spatial import cKDTree

    _, nearest = cKDTree(hidden).query(data, k=3)
    expected = edges.sort_by_destination(nearest.ravel(), np.repeat(np.arange(len(data)), 3), len(hidden))
    got = edges.knn_edges(hidden, data, 3)
    assert got.dtype == np.int64 and np.array_equal(got, expected)


def test_memory_model_at_o1280():
    from benchmarks.graphs.memory import GIB, Sizes, inputs_bytes, predicted_oom, predicted_peak_bytes

    sizes = Sizes(163_842, 6_599_680, 19_799_040, heads=16, channels=64, element_size=2)
    assert sizes.e == 19_799_040 * 2048 and inputs_bytes(sizes) / GIB == pytest.approx(64.4, abs=0.1)
    h200 = 139 * GIB
    fused = predicted_peak_bytes("fused", sizes)
    assert fused["fwd"] / GIB == pytest.approx(77.4, abs=0.1)
    assert fused["fwd_bwd"] / GIB == pytest.approx(131.5, abs=0.1)
    assert predicted_oom("fused", sizes, h200) == {"fwd": None, "fwd_bwd": None}
    anemoi = predicted_oom("anemoi_compiled_rms", sizes, h200)
    assert anemoi["fwd"] is None and anemoi["fwd_bwd"].startswith("OOM: predicted peak 180 GiB > 139 GiB")
    assert all(predicted_oom("pyg", sizes, h200).values())
    small = Sizes(10_242, 40_320, 120_960, 16, 64, 2)
    assert not any(any(predicted_oom(v, small, h200).values()) for v in ("pyg", "anemoi_rms", "fused_projection"))


def test_a_cuda_error_that_poisons_the_context_is_a_crash():
    from benchmarks.graphs.measure import guarded, is_crash

    def illegal():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ...")

    _, status = guarded(illegal)
    assert is_crash(status) and status == "crash: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert guarded(lambda: 1 / 0)[1].startswith("error: ZeroDivisionError")


def _fake_child(monkeypatch, script: str):
    import sys

    from benchmarks.graphs import run

    command = lambda graph, variant, settings, out: [sys.executable, "-c", script, str(out)]  # noqa: E731
    monkeypatch.setattr(run, "child_command", command)


def test_a_variant_in_a_child_process_reports_what_the_child_measured(tmp_path, monkeypatch):
    from benchmarks.graphs import run

    script = (
        "import json, pathlib, sys; out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True); print('measuring'); "
        "m = dict(status='ok', ms=1.5, peak_mib=2.0, extra_mib=1.0); "
        "g = dict(floor=dict(fwd_bytes=10, fwd_bwd_bytes=30), inputs_mib=3.0, "
        "variants=dict(fused=dict(fwd=m, fwd_bwd=m))); "
        "(out / 'results.json').write_text(json.dumps(dict(graphs=[g])))"
    )
    _fake_child(monkeypatch, script)
    measured, graph = run.measure_variant_in_child("g", "fused", None, tmp_path, "[t]")
    assert measured["fwd"]["ms"] == 1.5 and graph["floor"]["fwd_bwd_bytes"] == 30
    assert (tmp_path / "fused.log").read_text() == "measuring\n"


def test_a_child_that_dies_is_a_crash_cell(tmp_path, monkeypatch):
    from benchmarks.graphs import run

    script = (
        "import os, sys; print('RuntimeError: CUDA error: an illegal memory access was encountered'); "
        "sys.stdout.flush(); os.abort()"
    )
    _fake_child(monkeypatch, script)
    measured, graph = run.measure_variant_in_child("g", "anemoi_rms", None, tmp_path, "[t]")
    assert graph is None
    for mode in ("fwd", "fwd_bwd"):
        status = measured[mode]["status"]
        assert status.startswith("crash: exit code -6: RuntimeError: CUDA error: an illegal memory access"), status
    _fake_child(monkeypatch, "import time; time.sleep(30)")
    measured, _ = run.measure_variant_in_child("g", "anemoi_rms", None, tmp_path, "[t]", timeout_s=0.5)
    assert measured["fwd"]["status"].startswith("crash: timed out")


def test_child_command_passes_the_runs_settings(tmp_path):
    from benchmarks.graphs import run
    from benchmarks.graphs.measure import Settings, TimingSettings

    settings = Settings(torch.float16, 16, 64, 1e-5, ("fused",), TimingSettings(warmup_ms=5.0, rep_ms=20.0), True,
                        {"anemoi_fused_qk": tmp_path})  # fmt: skip
    command = run.child_command("h_to_era_o1280", "anemoi_fused_qk", settings, tmp_path / "x")
    assert command[1:3] == ["-m", "benchmarks.graphs"]
    args = run.parse_args(command[3:], on_gpu=True)
    assert (args.graphs, args.variants, args.dtype, args.heads, args.channels) == (
        ["h_to_era_o1280"], ["anemoi_fused_qk"], "float16", 16, 64
    )
    assert (args.eps, args.warmup_ms, args.rep_ms, args.anemoi_fused_qk) == (1e-5, 5.0, 20.0, tmp_path)
    assert args.no_check and args.no_plot and args.quick is False and args.isolate is False
    assert args.out == tmp_path / "x"


def _graph_result(name, variants, pct=None):
    m = lambda ms: dict(status="ok", ms=ms, peak_mib=10.0, extra_mib=5.0)  # noqa: E731
    return dict(
        name=name, kind="decoder", num_src=3, num_dst=4, num_edges=12, fused_pct_of_floor=pct,
        variants={v: (dict(fwd=m(ms), fwd_bwd=m(2 * ms)) if isinstance(ms, float) else dict(fwd=ms, fwd_bwd=ms))
                  for v, ms in variants.items()},
    )  # fmt: skip


def test_the_readme_table_takes_anemois_kernels_and_the_o1280_run(tmp_path, monkeypatch):
    import json

    from benchmarks.graphs import quick

    monkeypatch.setattr(quick, "REPO", tmp_path)
    meta = dict(device="GPU X", dtype="bfloat16", heads=16, channels=64, torch="2.11.0", triton="3.6.0",
                started="2026-11-27 10:00:00")  # fmt: skip
    main, extra = tmp_path / "dev" / "graphs", tmp_path / "dev" / quick.EXTRA_RESULTS_FOLDER
    main.mkdir(parents=True)
    variants = dict(pyg=4.0, pyg_compiled=2.0, unfused=1.5, fused=1.0, anemoi_rms=3.0, anemoi_compiled_rms=2.5,
                    anemoi_fused_qk=1.4, fused_layer=1.1, anemoi_layer=3.3, anemoi_compiled_layer=2.2)  # fmt: skip
    graphs = [_graph_result("g1", variants, dict(fwd=90.0, fwd_bwd=70.0))]
    (main / "results.json").write_text(json.dumps(dict(meta=meta, graphs=graphs)))
    table = quick.committed_gpu_summary(main)
    row = next(line for line in table.splitlines() if line.startswith("| g1 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = next(line for line in table.splitlines() if line.startswith("| graph "))
    assert len(cells) == header.count("|") - 1 == 14
    assert cells[7:11] == ["2.50 / 5.00", "1.40 / 2.80", "2.0× / 2.0×", "3.00× / 2.50× / 1.40×"]
    assert cells[11] == "90% / 70%"
    assert "h_to_era_o1280" not in table

    extra.mkdir()
    crash = dict(status="crash: RuntimeError: CUDA error: an illegal memory access", ms=None, peak_mib=None,
                 extra_mib=None)  # fmt: skip
    oom = dict(status="OOM: predicted peak 180 GiB > 139 GiB of the device (not run)", ms=None, peak_mib=None,
               extra_mib=None)  # fmt: skip
    big = _graph_result("h_to_era_o1280", dict(fused=40.0, anemoi_rms=crash, anemoi_compiled_rms=oom), None)
    (extra / "results.json").write_text(json.dumps(dict(meta=meta, graphs=[big])))
    table = quick.committed_gpu_summary(main)
    row = next(line for line in table.splitlines() if line.startswith("| h_to_era_o1280 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:11] == ["–", "–", "–", "40.00 / 80.00", "OOM / OOM", "–", "– / –", "– / – / –"]
    assert cells[11:13] == ["– / –", "– / 5"]
    assert "h_to_era_o1280: its own run (GPU X, run of 2026-11-27; from dev/graphs-o1280/)" in table
