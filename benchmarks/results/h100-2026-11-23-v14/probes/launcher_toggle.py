"""Device probe of session 14: the Launcher's direct path against Triton's own path, in one process, alternating
rounds (it sets the launchers' private _direct flag)."""
import statistics
import sys

import torch

import gtnorm
from benchmarks.graphs.catalog import load_graph
from benchmarks.host_time import loop_us
from gtnorm.triton import ops
from gtnorm.triton.launcher import Launcher

LAUNCHERS = [v for v in vars(ops).values() if isinstance(v, Launcher)]
try:
    from anemoi.models.triton.gt import graph_transformer_attention_conv as anemoi_conv
    from anemoi.models.triton.utils import edge_index_to_csc
except ImportError:
    anemoi_conv = None


def setup(name, heads, channels=64):
    device = torch.device("cuda")
    graph = load_graph(name)
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16).requires_grad_()

    q = randn(graph.num_dst, heads, channels)
    k, v = randn(graph.num_src, heads, channels), randn(graph.num_src, heads, channels)
    e = randn(graph.num_edges, heads, channels)
    w_q = torch.ones(channels, device=device, requires_grad=True)
    w_k = torch.ones(channels, device=device, requires_grad=True)
    grad = torch.randn_like(q)
    edge_index = graph.edge_index.to(device)
    layout = gtnorm.GraphLayout.from_edge_index(edge_index, (graph.num_src, graph.num_dst))
    leaves = [q, k, v, e, w_q, w_k]

    def op(norm=True):
        kw = dict(qk_norm=True, q_norm_weight=w_q, k_norm_weight=w_k) if norm else {}
        return gtnorm.graph_transformer_attention(q, k, v, e, layout, **kw)

    def fwd():
        with torch.no_grad():
            op()

    rows = {"op_fb": (lambda: op().backward(grad), leaves), "op_fb_nonorm": (lambda: op(False).backward(grad), leaves),
            "op_fwd": (fwd, ())}
    if anemoi_conv is not None:
        csc, perm, reverse = edge_index_to_csc(edge_index, (graph.num_src, graph.num_dst), reverse=True)

        def anemoi():
            edges = e.index_select(0, perm) if perm is not None else e
            anemoi_conv(q, k, v, edges, csc, reverse).backward(grad)

        rows["anemoi_fb_nonorm"] = (anemoi, leaves)
    return rows


def main():
    specs = sys.argv[1:] or ["h_to_h_tiny:16", "h_to_h_small:16", "era_to_h_small:4", "h_to_era_small:4"]
    for spec in specs:
        name, heads = spec.split(":")
        rows = setup(name, int(heads))
        got = {}
        for _ in range(5):
            for mode in ("triton", "direct"):
                for launcher in LAUNCHERS:
                    launcher._direct = mode == "direct"
                for row, (fn, leaves) in rows.items():
                    if row.startswith("anemoi") and mode == "direct":
                        continue
                    got.setdefault((row, mode if not row.startswith("anemoi") else "-"), []).append(
                        loop_us(fn, leaves, reps=100, trials=3))
        for (row, mode), vals in got.items():
            print(f"{name:15s} H{heads:<3s} {row:17s} {mode:7s} median {statistics.median(vals):8.1f} us  "
                  f"rounds {' '.join(f'{v:.0f}' for v in vals)}", flush=True)


if __name__ == "__main__":
    main()
