"""Peers' attention kernels that live outside this repository, loaded from where the user points.

Anemoi's fused-QK-norm kernel (the ``feat/triton-gt-fused-qk-norm`` branch of ecmwf/anemoi-core) is not in any
released anemoi-models; a benchmark compares against it only when given its files:

    python -m benchmarks.kernels.host_time --anemoi-fused-qk ~/anemoi-core          # a checkout of that branch
    python -m benchmarks.kernels.host_time --anemoi-fused-qk path/to/triton/gt.py   # or gt.py beside norm.py, utils.py

Nothing is copied: the branch's ``gt.py``, ``norm.py`` and ``utils.py`` are imported from that folder. They import
each other as ``anemoi.models.triton.*``, which names the installed anemoi-models' modules; while they load, those
names point at the branch's files and are put back afterwards, so the installed package is untouched.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

PACKAGE = "anemoi.models.triton"
# Imported in this order: each imports only those before it.
FILES = ("utils", "norm", "gt")
TRITON_DIR_IN_CHECKOUT = Path("models/src/anemoi/models/triton")
# The branch's qk_norm argument: 0 none, 1 RMSNorm, 2 LayerNorm (normalisation without affine parameters).
QK_NORM_CODES = {"none": 0, "rms": 1, "layer": 2}


def find_triton_dir(path: str | Path) -> Path:
    """The folder holding the branch's gt.py: ``path`` itself, its parent (a file), or a checkout's copy."""
    path = Path(path).expanduser()
    in_package = PACKAGE.replace(".", "/")
    candidates = [path.parent] if path.is_file() else [path, path / TRITON_DIR_IN_CHECKOUT, path / in_package]
    for folder in candidates:
        if all((folder / f"{name}.py").is_file() for name in FILES):
            return folder
    raise FileNotFoundError(
        f"no Anemoi fused-QK kernel at {path}: expected gt.py, norm.py and utils.py in it, or an anemoi-core "
        f"checkout holding them under {TRITON_DIR_IN_CHECKOUT}"
    )


def _load(folder: Path) -> dict[str, ModuleType]:
    saved = {name: sys.modules.get(f"{PACKAGE}.{name}") for name in FILES}
    loaded = {}
    try:
        for name in FILES:
            spec = importlib.util.spec_from_file_location(f"gtnorm_peer_anemoi_fused_qk.{name}", folder / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[f"{PACKAGE}.{name}"] = module  # what the next file's imports find
            spec.loader.exec_module(module)
            loaded[name] = module
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(f"{PACKAGE}.{name}", None)
            else:
                sys.modules[f"{PACKAGE}.{name}"] = module
    return loaded


def load_anemoi_fused_qk(path: str | Path, qk_norm: str = "rms") -> Callable:
    """Anemoi's fused-QK attention as ``attention(q, k, v, edges_csc, csc, reverse)``.

    Shapes: q [N_dst, H, C]; k, v [N_src, H, C]; edges_csc [M, H, C] in CSC order; csc = (row [M], colptr
    [N_dst + 1]) and reverse = (rowptr, edge_ids, edge_dst) as Anemoi's ``edge_index_to_csc(..., reverse=True)``
    gives them. The norm has no affine parameters (the branch dropped them)."""
    if qk_norm not in QK_NORM_CODES:
        raise ValueError(f"qk_norm must be one of {sorted(QK_NORM_CODES)}, got {qk_norm!r}")
    gt = _load(find_triton_dir(path))["gt"]
    code = QK_NORM_CODES[qk_norm]

    def attention(q, k, v, edges_csc, csc, reverse):
        return gt.GraphTransformerFunction.apply(q, k, v, edges_csc, csc, reverse, code)

    return attention


def anemoi_csc(edge_index, num_nodes: tuple[int, int], dst_sorted: bool | None = None):
    """Anemoi's ``edge_index_to_csc(edge_index, num_nodes, reverse=True)`` as its block calls it: (csc, perm,
    reverse). Its graph providers hand over edges sorted by destination and its block says so
    (``edges_are_dst_sorted``, anemoi-models 0.19), so the CSC keeps the edge order and ``perm`` is None: the edge
    features are used as they are, not gathered. ``dst_sorted`` None: checked here with Anemoi's own check (a host
    sync: outside timed regions).

    Shapes: edge_index [2, M] (src, dst)."""
    from anemoi.models.distributed.khop_edges import is_edge_index_dst_sorted
    from anemoi.models.triton.utils import edge_index_to_csc

    if dst_sorted is None:
        dst_sorted = is_edge_index_dst_sorted(edge_index)
    return edge_index_to_csc(edge_index, num_nodes=num_nodes, reverse=True, edges_are_dst_sorted=dst_sorted)
