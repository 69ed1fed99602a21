"""What each variant of the graph benchmark needs in GPU memory, predicted from the tensor sizes: so that a graph
too large for some variants (h_to_era_o1280) runs the ones that fit and reports the others as "OOM" without
spending minutes compiling them first.

Units (bytes): a node or edge row is H * C * element size (2 KiB at 16 x 64 in bf16):
    Q = N_dst rows (q, dO, out, dq each), K = N_src rows (k, v, dk, dv each), E = M rows (e, de),
    S = M * H * 4 (one fp32 number per edge and head: the backward's a and da scratch, each), s = N_dst * H * 4.
The harness holds the inputs for every variant (``inputs_bytes``): q, dO (2Q), k, v (2K), e (E), edge_index and
the layout's index arrays (~44 bytes per edge). On top of that, each variant's peak during one call (forward under
no_grad, or forward+backward) is the sum of what is alive at its largest moment:

- fused, fused_layer, no_norm: forward out (Q) + lse (s); forward+backward out, dq (2Q), dk, dv (2K), de (E),
  a and da (2S), D and the query statistics (3s).
- unfused*: a normalised copy of q (Q) and k (K) before the same kernels; forward+backward also dq' and dq alive
  together at the norm's backward (+2Q over fused's forward+backward, +K).
- anemoi_* (Anemoi main's kernel, anemoi-models 0.19 ``triton/gt.py``): its forward keeps an fp32 copy of the
  output (2Q at bf16) beside out; with the norm outside, a normalised q (Q) and k (K); its backward allocates
  dq', dk', dv, de, D, and the norm's backward dq.
- anemoi_fused_qk: the branch's kernel, taken to store like main's kernel without the normalised copies.
- pyg*: PyG's message passing materialises per-edge rows: gathered q', k', v (3E), k' + e and v + e (2E), the
  messages (E); its backward as many again. Never near a fit where e alone is tens of GB.
- lin_edge_fused_layer: e = lin_edge(x) materialised (E) beside the inputs' e, its de (E), x [M, 11] fp32 and its
  gradient; fused_projection: the same where the dispatch rule materialises e (decoders with a norm), else x and
  per-node sums only.

These are estimates (the allocator's rounding and fragmentation come on top: leave ~5 %); the run compares them
with the device's memory only to skip what cannot fit by a clear margin (run.py).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
INDEX_BYTES_PER_EDGE = 44  # edge_index (2 int64: 16) + the layout (27 at O1280: 505 MiB for 19.8M edges), rounded up
EDGE_DIM = 11  # variants.EDGE_DIM (not imported: variants imports gtnorm, this module stays import-light)


@dataclass(frozen=True)
class Sizes:
    num_src: int
    num_dst: int
    num_edges: int
    heads: int
    channels: int
    element_size: int  # bytes of one element of q, k, v, e (2 for bf16 and fp16)

    @property
    def row(self) -> int:
        return self.heads * self.channels * self.element_size

    @property
    def q(self) -> int:
        return self.num_dst * self.row

    @property
    def k(self) -> int:
        return self.num_src * self.row

    @property
    def e(self) -> int:
        return self.num_edges * self.row

    @property
    def scratch(self) -> int:
        return self.num_edges * self.heads * 4

    @property
    def node_scratch(self) -> int:
        return self.num_dst * self.heads * 4

    @property
    def fp32_q(self) -> int:
        return self.num_dst * self.heads * self.channels * 4


def inputs_bytes(sizes: Sizes) -> int:
    """What the harness holds before any variant runs: q, dO, k, v, e and the index arrays."""
    return 2 * sizes.q + 2 * sizes.k + sizes.e + INDEX_BYTES_PER_EDGE * sizes.num_edges


def _fused(s: Sizes) -> tuple[int, int]:
    forward = s.q + s.node_scratch
    backward = 2 * s.q + 2 * s.k + s.e + 2 * s.scratch + 3 * s.node_scratch
    return forward, backward


def extra_bytes(variant: str, sizes: Sizes) -> tuple[int, int]:
    """(forward, forward+backward) bytes a variant allocates on top of the inputs at its peak."""
    s = sizes
    fwd, fwd_bwd = _fused(s)
    if variant in ("fused", "fused_layer", "no_norm"):
        return fwd, fwd_bwd
    if variant.startswith("unfused"):
        return fwd + s.q + s.k, fwd_bwd + 2 * s.q + 2 * s.k
    if variant.startswith("anemoi"):
        kernel_fwd = s.q + s.fp32_q + s.node_scratch
        kernel_bwd = kernel_fwd + s.q + 2 * s.k + s.e + s.node_scratch
        if variant == "anemoi_fused_qk":
            return kernel_fwd, kernel_bwd
        return kernel_fwd + s.q + s.k, kernel_bwd + 2 * s.q + 2 * s.k
    if variant.startswith("pyg"):
        return 6 * s.e + s.q, 12 * s.e + 3 * s.q
    if variant in ("lin_edge_fused_layer", "fused_projection"):
        x = s.num_edges * EDGE_DIM * 4
        materialised = variant == "lin_edge_fused_layer" or s.num_edges < 3 * s.num_dst + 1  # decoders: 3 per node
        e_terms = (s.e, 2 * s.e) if materialised else (0, 0)
        return fwd + x + e_terms[0], fwd_bwd + 2 * x + e_terms[1]
    raise ValueError(f"no memory model for variant {variant!r}")


def predicted_peak_bytes(variant: str, sizes: Sizes) -> dict[str, int]:
    """{"fwd": bytes, "fwd_bwd": bytes}: the inputs plus the variant's extra at its peak."""
    held = inputs_bytes(sizes)
    fwd, fwd_bwd = extra_bytes(variant, sizes)
    return {"fwd": held + fwd, "fwd_bwd": held + fwd_bwd}


def predicted_oom(variant: str, sizes: Sizes, device_bytes: int, margin: float = 1.0) -> dict[str, str | None]:
    """{mode: None if it may fit, else the "OOM: predicted ..." status to report}: a mode is skipped only where its
    predicted peak exceeds the device's memory times ``margin``."""
    peaks = predicted_peak_bytes(variant, sizes)
    return {
        mode: (
            f"OOM: predicted peak {peak / GIB:.0f} GiB > {device_bytes / GIB:.0f} GiB of the device (not run)"
            if peak > margin * device_bytes
            else None
        )
        for mode, peak in peaks.items()
    }


def memory_table(variants, sizes: Sizes) -> str:
    """A markdown table of every variant's predicted peak (GiB), forward / forward+backward."""
    lines = [
        f"inputs held: {inputs_bytes(sizes) / GIB:.1f} GiB",
        "",
        "| variant | predicted peak GiB, fwd | fwd+bwd |",
        "| --- | --- | --- |",
    ]
    for name in variants:
        peaks = predicted_peak_bytes(name, sizes)
        lines.append(f"| {name} | {peaks['fwd'] / GIB:.1f} | {peaks['fwd_bwd'] / GIB:.1f} |")
    return "\n".join(lines) + "\n"
