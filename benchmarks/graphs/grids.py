"""Node sets of the benchmark graphs, as unit-sphere xyz (x = cos(lat) cos(lon), y = cos(lat) sin(lon), z = sin(lat)).

* ``octahedral_grid(n)``: the octahedral reduced Gaussian grid O_n that ERA5 / IFS data live on.
* ``icosahedral_mesh(level)``: the hidden mesh of Anemoi's multi-scale processor, an icosahedron refined
  ``level`` times, with every level's triangles kept (the processor draws edges from all of them).

Everything is deterministic numpy: the same call gives bit-identical arrays in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def latlon_to_xyz(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Radians in, [n, 3] float64 unit vectors out."""
    cos_lat = np.cos(lat)
    return np.stack([cos_lat * np.cos(lon), cos_lat * np.sin(lon), np.sin(lat)], axis=1)


def octahedral_num_points(n: int) -> int:
    """2 * sum_{i=1..n} (4i + 16) = 4n(n + 9)."""
    return 4 * n * (n + 9)


def octahedral_row_lengths(n: int) -> np.ndarray:
    """Longitudes per latitude row, north to south: 20, 24, ..., 4n + 16, 4n + 16, ..., 20."""
    i = np.arange(1, n + 1)
    half = 4 * i + 16
    return np.concatenate([half, half[::-1]])


# Above this many latitude rows numpy's leggauss (dense eigenvalues, O(n^3): 25 s for O1280's 2560 rows on 2 cores)
# gives way to scipy's roots_legendre (0.5 s). The two differ in the last bit (1e-16), so the graphs up to O640
# keep leggauss and with it their edges, bit for bit.
LEGGAUSS_MAX_ROWS = 1280


def gaussian_nodes(num_rows: int) -> np.ndarray:
    """The Gauss-Legendre nodes (sines of the Gaussian latitudes) of ``num_rows`` rows, ascending."""
    if num_rows <= LEGGAUSS_MAX_ROWS:
        return np.polynomial.legendre.leggauss(num_rows)[0]
    from scipy.special import roots_legendre

    return roots_legendre(num_rows)[0]


def octahedral_latlon(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Latitudes and longitudes (radians) of O_n, row by row from north to south, each row eastwards from 0."""
    if n < 1:
        raise ValueError(f"octahedral grid needs n >= 1, got {n}")
    nodes = gaussian_nodes(2 * n)  # ascending, so reverse for north-to-south rows
    row_lat = np.arcsin(nodes[::-1])
    row_len = octahedral_row_lengths(n)
    row_start = np.concatenate([[0], np.cumsum(row_len)[:-1]])
    lat = np.repeat(row_lat, row_len)
    position_in_row = np.arange(int(row_len.sum())) - np.repeat(row_start, row_len)
    lon = 2.0 * np.pi * position_in_row / np.repeat(row_len, row_len)
    return lat, lon


def octahedral_grid(n: int) -> np.ndarray:
    """O_n as [4n(n + 9), 3] unit vectors."""
    return latlon_to_xyz(*octahedral_latlon(n))


# The regular icosahedron (the one trimesh, and so Anemoi, starts from), faces wound counter-clockwise seen
# from outside.
_PHI = (1.0 + 5.0**0.5) / 2.0
_ICOSAHEDRON_VERTICES = np.array(
    [
        [-1, _PHI, 0], [1, _PHI, 0], [-1, -_PHI, 0], [1, -_PHI, 0],
        [0, -1, _PHI], [0, 1, _PHI], [0, -1, -_PHI], [0, 1, -_PHI],
        [_PHI, 0, -1], [_PHI, 0, 1], [-_PHI, 0, -1], [-_PHI, 0, 1],
    ],
    dtype=np.float64,
)  # fmt: skip
_ICOSAHEDRON_FACES = np.array(
    [
        [0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11],
        [1, 5, 9], [5, 11, 4], [11, 10, 2], [10, 7, 6], [7, 1, 8],
        [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8], [3, 8, 9],
        [4, 9, 5], [2, 4, 11], [6, 2, 10], [8, 6, 7], [9, 8, 1],
    ],
    dtype=np.int64,
)  # fmt: skip


def icosahedral_num_nodes(level: int) -> int:
    return 10 * 4**level + 2


@dataclass(frozen=True)
class IcosahedralMesh:
    """Refined icosahedron: ``vertices`` [10 * 4**level + 2, 3]; ``triangles[l]`` [20 * 4**l, 3] for l = 0..level.

    Vertices of level l are the first ``icosahedral_num_nodes(l)`` rows, so ``triangles[l]`` indexes into the
    same vertex array as the finest level.
    """

    vertices: np.ndarray
    triangles: tuple[np.ndarray, ...]

    @property
    def level(self) -> int:
        return len(self.triangles) - 1


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _refine(vertices: np.ndarray, triangles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split every triangle in four at its edge midpoints (projected to the sphere).

    One new vertex per undirected edge, appended after the old vertices in ascending (low, high) vertex-index
    order of its edge: deterministic, and it keeps the old vertices as a prefix.
    """
    num_old = len(vertices)
    a, b, c = triangles.T
    # Edges ab, bc, ca of every triangle, each keyed by its (low, high) endpoints so both windings coincide.
    first = np.stack([a, b, c], axis=1).ravel()
    second = np.stack([b, c, a], axis=1).ravel()
    low, high = np.minimum(first, second), np.maximum(first, second)
    keys, edge_id = np.unique(low * num_old + high, return_inverse=True)
    midpoints = _normalise(vertices[keys // num_old] + vertices[keys % num_old])
    mid = (edge_id.reshape(-1, 3) + num_old).T  # mid[0] on ab, mid[1] on bc, mid[2] on ca
    ab, bc, ca = mid
    # Three corner triangles and the centre one, same winding as the parent; children of one parent adjacent.
    children = np.stack(
        [
            np.stack([a, ab, ca], axis=1),
            np.stack([b, bc, ab], axis=1),
            np.stack([c, ca, bc], axis=1),
            np.stack([ab, bc, ca], axis=1),
        ],
        axis=1,
    ).reshape(-1, 3)
    return np.concatenate([vertices, midpoints]), children


def icosahedral_mesh(level: int) -> IcosahedralMesh:
    """Icosahedron refined ``level`` times; every level's triangle list kept."""
    if level < 0:
        raise ValueError(f"refinement level must be >= 0, got {level}")
    vertices = _normalise(_ICOSAHEDRON_VERTICES)
    triangles = [_ICOSAHEDRON_FACES]
    for _ in range(level):
        vertices, finer = _refine(vertices, triangles[-1])
        triangles.append(finer)
    return IcosahedralMesh(vertices=vertices, triangles=tuple(triangles))
