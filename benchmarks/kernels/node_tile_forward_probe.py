# ruff: noqa: B023  (closures called inside the loop iteration that defines them)
"""Scratch experiment (issue 50): the forward over degree-sized edge tiles, one node per step, against the walk.

A program takes nodes_per_program slots; per node, its edges in tiles of DEG positions [DEG, BLOCK_H, BLOCK_C]:
all DEG gathers issued together, the query loaded and normalised once, online softmax across a node's tiles.
Variant FLAT: the tiles of the program's nodes walked as one flattened, pipelined loop (tile list from the layout),
first/last flags per tile.

python -m benchmarks.kernels.node_tile_forward_probe [--small]   (probe of NOTES v39; removed after its run)
"""

import argparse
import math
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())

from gtnorm.triton.tiles import load_norm_param, load_row, normalize_heads, row_tile_offsets, store_row  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit
def _tile_step(q, m, denom, acc, t, end, w_k, b_k, key_ptr, value_ptr, edge_attr_ptr, csc_src_ptr, csc_edge_id_ptr,
               offsets, mask, row_len, C, score_scale, eps_k, HAS_EDGE_ATTR: tl.constexpr, NORM: tl.constexpr,
               DEG: tl.constexpr):
    pos = t + tl.arange(0, DEG)
    valid = pos < end
    src = tl.load(csc_src_ptr + pos, mask=valid, other=0)
    rows = src.to(tl.int64)[:, None, None] * row_len + offsets[None, :, :]
    tmask = valid[:, None, None] & mask[None, :, :]
    k = tl.load(key_ptr + rows, mask=tmask, other=0.0).to(tl.float32)
    v = tl.load(value_ptr + rows, mask=tmask, other=0.0).to(tl.float32)
    k = normalize_heads(k, w_k, b_k, C, eps_k, NORM)
    if HAS_EDGE_ATTR:
        eid = tl.load(csc_edge_id_ptr + pos, mask=valid, other=0)
        erows = eid.to(tl.int64)[:, None, None] * row_len + offsets[None, :, :]
        e = tl.load(edge_attr_ptr + erows, mask=tmask, other=0.0).to(tl.float32)
        k += e
        v += e
    s = tl.sum(q[None, :, :] * k, axis=2) * score_scale  # [DEG, BLOCK_H]
    s = tl.where(valid[:, None], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=0))
    p = tl.exp2(s - m_new[None, :])
    rescale = tl.exp2(m - m_new)
    denom = denom * rescale + tl.sum(p, axis=0)
    acc = acc * rescale[:, None] + tl.sum(p[:, :, None] * v, axis=0)
    return m_new, denom, acc


@triton.jit
def node_tile_forward_kernel(
    query_ptr, key_ptr, value_ptr, edge_attr_ptr, q_weight_ptr, q_bias_ptr, k_weight_ptr, k_bias_ptr,
    dst_offsets_ptr, dst_by_slot_ptr, csc_src_ptr, csc_edge_id_ptr, out_ptr, lse_ptr,
    num_slots, nodes_per_program, H, C: tl.constexpr, score_scale, eps_q, eps_k,
    HAS_EDGE_ATTR: tl.constexpr, NORM: tl.constexpr, HAS_Q_WEIGHT: tl.constexpr, HAS_Q_BIAS: tl.constexpr,
    HAS_K_WEIGHT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, DEG: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    row_len = H * C
    offsets, mask, offs_h = row_tile_offsets(tl.program_id(1) * BLOCK_H, H, C, BLOCK_H, BLOCK_C)
    w_q = load_norm_param(q_weight_ptr, C, HAS_Q_WEIGHT, 1.0, BLOCK_C)
    b_q = load_norm_param(q_bias_ptr, C, HAS_Q_BIAS, 0.0, BLOCK_C)
    w_k = load_norm_param(k_weight_ptr, C, HAS_K_WEIGHT, 1.0, BLOCK_C)
    b_k = load_norm_param(k_bias_ptr, C, False, 0.0, BLOCK_C)
    slot = tl.program_id(0) * nodes_per_program
    last_slot = tl.minimum(slot + nodes_per_program, num_slots)
    while slot < last_slot:
        node = tl.load(dst_by_slot_ptr + slot)
        start = tl.load(dst_offsets_ptr + slot)
        end = tl.load(dst_offsets_ptr + slot + 1)
        q = normalize_heads(load_row(query_ptr, node, offsets, mask, row_len), w_q, b_q, C, eps_q, NORM)
        m = tl.full([BLOCK_H], float("-inf"), tl.float32)
        denom = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
        for t in tl.range(start, end, DEG, num_stages=NUM_STAGES):
            m, denom, acc = _tile_step(
                q, m, denom, acc, t, end, w_k, b_k, key_ptr, value_ptr, edge_attr_ptr, csc_src_ptr,
                csc_edge_id_ptr, offsets, mask, row_len, C, score_scale, eps_k, HAS_EDGE_ATTR, NORM, DEG)
        store_row(out_ptr, node, offsets, mask, row_len, acc / denom[:, None])
        tl.store(lse_ptr + node.to(tl.int64) * H + offs_h, m + tl.log2(denom), mask=offs_h < H)
        slot += 1


@triton.jit
def flat_tile_forward_kernel(
    query_ptr, key_ptr, value_ptr, edge_attr_ptr, q_weight_ptr, q_bias_ptr, k_weight_ptr, k_bias_ptr,
    tile_start_ptr, tile_end_ptr, tile_node_ptr, csc_src_ptr, csc_edge_id_ptr, out_ptr, lse_ptr,
    num_tiles, tiles_per_program, H, C: tl.constexpr, score_scale, eps_q, eps_k,
    HAS_EDGE_ATTR: tl.constexpr, NORM: tl.constexpr, HAS_Q_WEIGHT: tl.constexpr, HAS_Q_BIAS: tl.constexpr,
    HAS_K_WEIGHT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, DEG: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Tiles never cross nodes; a program's tile run holds whole nodes (tiles_per_program is a bound: the run is
    cut at node boundaries by the host's tile_program_start list, here approximated: runs of whole nodes)."""
    row_len = H * C
    offsets, mask, offs_h = row_tile_offsets(tl.program_id(1) * BLOCK_H, H, C, BLOCK_H, BLOCK_C)
    w_q = load_norm_param(q_weight_ptr, C, HAS_Q_WEIGHT, 1.0, BLOCK_C)
    b_q = load_norm_param(q_bias_ptr, C, HAS_Q_BIAS, 0.0, BLOCK_C)
    w_k = load_norm_param(k_weight_ptr, C, HAS_K_WEIGHT, 1.0, BLOCK_C)
    b_k = load_norm_param(k_bias_ptr, C, False, 0.0, BLOCK_C)
    first_tile = tl.load(tiles_per_program + tl.program_id(0))
    last_tile = tl.load(tiles_per_program + tl.program_id(0) + 1)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    for t in tl.range(first_tile, last_tile, num_stages=NUM_STAGES):
        node = tl.load(tile_node_ptr + t)
        prev = tl.load(tile_node_ptr + t - 1, mask=t > first_tile, other=-1)
        nxt = tl.load(tile_node_ptr + t + 1, mask=t + 1 < last_tile, other=-1)
        first = node != prev
        last = node != nxt
        start = tl.load(tile_start_ptr + t)
        end = tl.load(tile_end_ptr + t)
        q = normalize_heads(load_row(query_ptr, node, offsets, mask, row_len), w_q, b_q, C, eps_q, NORM)
        m = tl.where(first, float("-inf"), m)
        denom = tl.where(first, 0.0, denom)
        acc = tl.where(first, 0.0, acc)
        m, denom, acc = _tile_step(
            q, m, denom, acc, start, end, w_k, b_k, key_ptr, value_ptr, edge_attr_ptr, csc_src_ptr,
            csc_edge_id_ptr, offsets, mask, row_len, C, score_scale, eps_k, HAS_EDGE_ATTR, NORM, DEG)
        if last:
            store_row(out_ptr, node, offsets, mask, row_len, acc / denom[:, None])
            tl.store(lse_ptr + node.to(tl.int64) * H + offs_h, m + tl.log2(denom), mask=offs_h < H)


def tile_list(dst_offsets, dst_by_slot, busy, deg, nodes_per_program):
    """Tiles of <= deg positions, never crossing a node; program p takes the tiles of slots p*npp .. (p+1)*npp."""
    off = dst_offsets[: busy + 1].long()
    counts = off[1:] - off[:-1]
    ntiles = (counts + deg - 1) // deg
    tile_slot = torch.repeat_interleave(torch.arange(busy, device=off.device), ntiles)
    first_tile_of_slot = torch.cumsum(ntiles, 0) - ntiles
    j = torch.arange(tile_slot.numel(), device=off.device) - first_tile_of_slot[tile_slot]
    start = off[tile_slot] + j * deg
    end = torch.minimum(start + deg, off[tile_slot + 1])
    node = dst_by_slot[:busy].long()[tile_slot]
    cum = torch.cat([torch.zeros(1, dtype=torch.long, device=off.device), torch.cumsum(ntiles, 0)])
    prog = cum[torch.arange(0, busy + nodes_per_program, nodes_per_program, device=off.device).clamp(max=busy)]
    prog = torch.unique_consecutive(prog)
    return start.int(), end.int(), node.int(), prog.int()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", nargs="+", default=["h_to_era", "h_to_h", "era_to_h"])
    ap.add_argument("--norms", nargs="+", default=["rms", "layer"])
    ap.add_argument("--small", action="store_true", help="a small random graph (interpreter check)")
    args = ap.parse_args()
    from gtnorm.triton.attention_launch import NORM_CODES, attention_forward, layout_tensors

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    H, C = 16, 64
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    if args.small:
        graphs = []
        g = torch.Generator().manual_seed(0)
        ns, nd, mm = 50, 40, 300
        ei = torch.stack([torch.randint(0, ns, (mm,), generator=g), torch.randint(0, nd, (mm,), generator=g)])
        graphs.append(("small", ei, ns, nd))
    else:
        from benchmarks.graphs.catalog import load_graph

        graphs = []
        for name in args.graphs:
            bg = load_graph(name, verbose=True)
            graphs.append((name, bg.edge_index, bg.num_src, bg.num_dst))
    for name, ei, ns, nd in graphs:
        ei = ei.to(dev)
        M = ei.shape[1]
        torch.manual_seed(0)
        q = torch.randn(nd, H, C, device=dev, dtype=dtype)
        k = torch.randn(ns, H, C, device=dev, dtype=dtype)
        v = torch.randn(ns, H, C, device=dev, dtype=dtype)
        e = torch.randn(M, H, C, device=dev, dtype=dtype)
        wq = 1 + 0.1 * torch.randn(C, device=dev, dtype=dtype)
        bq = 0.1 * torch.randn(C, device=dev, dtype=dtype)
        wk = 1 + 0.1 * torch.randn(C, device=dev, dtype=dtype)
        lay = layout_tensors([ei], ns, nd)
        dst_offsets, dst_by_slot, _, csc_src, csc_edge_id, dst_without, *_ = lay
        busy = nd - dst_without.numel()
        mean_deg = M / busy
        for norm in args.norms:
            qb = bq if norm == "layer" else None

            def walk():
                return attention_forward(q, k, v, e, None, None, None, wq, qb, wk, None, list(lay), norm, 1e-6, 1e-6)

            ref_out, ref_lse, _ = walk()
            results = []
            configs = []
            for deg in (4, 8, 16):
                for bh, warps in ((16, 4), (8, 2), (4, 1), (8, 1)):
                    if deg * bh * C // (warps * 32) > 64:
                        continue
                    for npp, stages in ((1, 1), (8, 1), (1, 2)):
                        configs.append(("node", deg, bh, warps, npp, stages))
                    for npp, stages in ((8, 3), (32, 3)):
                        configs.append(("flat", deg, bh, warps, npp, stages))
            if args.small:
                configs = [("node", 4, 8, 2, 4, 1), ("flat", 4, 8, 2, 8, 3), ("node", 8, 16, 4, 1, 2)]
            for cfg in configs:
                kind, deg, bh, warps, npp, stages = cfg
                if kind == "node" and deg < mean_deg / 2 and deg < 16:
                    pass
                out = torch.empty_like(q)
                lse = torch.empty(nd, H, device=dev, dtype=torch.float32)
                common = dict(HAS_EDGE_ATTR=True, NORM=NORM_CODES[norm], HAS_Q_WEIGHT=True, HAS_Q_BIAS=qb is not None,
                              HAS_K_WEIGHT=True, BLOCK_H=bh, BLOCK_C=C, DEG=deg, NUM_STAGES=stages, num_warps=warps)
                if kind == "node":
                    grid = (triton.cdiv(busy, npp), H // bh)

                    def run(out=out, lse=lse, grid=grid, npp=npp, common=common):
                        node_tile_forward_kernel[grid](
                            q, k, v, e, wq, bq, wk, wk, dst_offsets, dst_by_slot, csc_src, csc_edge_id, out, lse,
                            busy, npp, H, C, LOG2E / math.sqrt(C), 1e-6, 1e-6, **common)
                else:
                    ts, te, tn, prog = tile_list(dst_offsets, dst_by_slot, busy, deg, npp)
                    grid = (prog.numel() - 1, H // bh)

                    def run(out=out, lse=lse, grid=grid, common=common, ts=ts, te=te, tn=tn, prog=prog):
                        flat_tile_forward_kernel[grid](
                            q, k, v, e, wq, bq, wk, wk, ts, te, tn, csc_src, csc_edge_id, out, lse,
                            tn.numel(), prog, H, C, LOG2E / math.sqrt(C), 1e-6, 1e-6, **common)
                try:
                    run()
                    busy_nodes = dst_by_slot[:busy].long()
                    err = ((out[busy_nodes].float() - ref_out[busy_nodes].float()).abs().max().item())
                    lerr = (lse[busy_nodes] - ref_lse[busy_nodes]).abs().max().item()
                    ms = triton.testing.do_bench(run, warmup=5, rep=40) if dev == "cuda" else float("nan")
                    results.append((ms, cfg, err, lerr))
                except Exception as exc:  # noqa: BLE001
                    results.append((float("inf"), cfg, str(exc)[:100], None))
            walk_ms = triton.testing.do_bench(walk, warmup=5, rep=40) if dev == "cuda" else float("nan")
            print(f"\n== {name} M={M:,} busy={busy:,} mean_deg={mean_deg:.1f} norm={norm}: walk (op) {walk_ms:.3f} ms")
            for ms, cfg, err, lerr in sorted(results, key=lambda r: r[0])[:12]:
                print(f"  {cfg}: {ms:.3f} ms ({walk_ms / ms:.2f}x)  out err {err}  lse err {lerr}")
            bad = [r for r in results if not isinstance(r[2], float) or r[2] > 0.05]
            for r in bad[:5]:
                print("  BAD", r)


if __name__ == "__main__":
    main()
