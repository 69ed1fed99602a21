"""Plain layout build (search_order=False) of two versions of gtnorm/triton/layout.py, beside Anemoi's CSC
conversion, alternating in one process (device probe of session 13; layout.py imports torch only, so both load).

    python benchmarks/results/h100-2026-11-23-v13/probes/build_ab.py BASE_LAYOUT_PY h_to_h h_to_h_small ...

BASE_LAYOUT_PY: e.g. ``git show fca8b69:gtnorm/triton/layout.py > base_layout.py``. Prints per graph the medians
of 3 rounds (do_bench medians, ms) and whether both builds give equal tensors.
"""

import importlib.util
import sys

import torch
import triton
from anemoi.models.triton.utils import edge_index_to_csc

from benchmarks.graphs.catalog import load_graph


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def _builds(base, new, edge_index, sizes) -> dict:
    return {
        "base": lambda: base.GraphLayout.from_edge_index(edge_index, sizes, search_order=False),
        "new": lambda: new.GraphLayout.from_edge_index(edge_index, sizes, search_order=False),
        "csc": lambda: edge_index_to_csc(edge_index, sizes, reverse=True),
    }


def main() -> None:
    base = load(sys.argv[1], "layout_base")
    new = load("gtnorm/triton/layout.py", "layout_new")
    device = torch.device("cuda")
    for name in sys.argv[2:]:
        graph = load_graph(name)
        edge_index = graph.edge_index.to(device=device, dtype=torch.int64)
        builds = _builds(base, new, edge_index, (graph.num_src, graph.num_dst))
        pairs = zip(builds["base"]().tensors(), builds["new"]().tensors(), strict=True)
        same = all(a.dtype == b.dtype and torch.equal(a, b) for a, b in pairs)
        rounds = {key: [] for key in builds}
        for _ in range(3):
            for key, fn in builds.items():
                rounds[key].append(ms(fn))
        med = {key: sorted(times)[1] for key, times in rounds.items()}
        print(f"{name:16s} M={edge_index.shape[1]:8d} same={same} base {med['base']:.3f} new {med['new']:.3f} "
              f"csc {med['csc']:.3f} ms | base/csc {med['base'] / med['csc']:.2f} new/csc "
              f"{med['new'] / med['csc']:.2f}  rounds {rounds}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
