"""Shared memory, registers and spills of every attention kernel as Triton compiled it, per launch plan:

    python -m benchmarks.kernels.shared_memory --out FILE.json [--quick]

For each head layout, raw-attribute count D and norm, runs one forward+backward (bf16, fused edge projection) under
the default plan, under plans that force the node-block kernels' channel tile (16 .. 256) and under whole-row tiles
(the plan before issue 30), and records what each compiled kernel holds, or for a launch that fails, the shared
memory Triton asked for. tests/triton/test_config.py checks config.node_block_shared_bytes against these figures on
the CPU, so that CI catches a plan that would not fit (GPU only: the interpreter compiles nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

import gtnorm
from gtnorm._runtime import shared_memory_per_block
from gtnorm.triton import edge_projection_launch, ops
from gtnorm.triton.config import attention_launch_config
from gtnorm.triton.launcher import Launcher

LAYOUTS = [(16, 64), (8, 128), (4, 256), (6, 160), (2, 512), (1, 1024), (4, 1024), (1, 4096), (32, 32), (64, 16)]
EDGE_DIMS = [1, 8, 32, 64]
FORCED_TILES = [0, 16, 32, 64, 128, 256]  # 0: each head's whole row (the plan before issue 30)


def _launchers() -> dict[str, Launcher]:
    found = {}
    for module in (ops, edge_projection_launch):
        for value in vars(module).values():
            if isinstance(value, Launcher):
                found[value.kernel.__name__] = value
    return found


def _constexprs(key: tuple) -> dict:
    return {item[0]: item[1] for item in key if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)}


def _run_once(heads, channels, edge_dim, norm, plan, device):
    generator = torch.Generator(device=device).manual_seed(0)
    num_src, num_dst, num_edges = 600, 300, 3000
    edge_index = torch.stack([
        torch.randint(0, num_src, (num_edges,), device=device, generator=generator),
        torch.randint(0, num_dst, (num_edges,), device=device, generator=generator),
    ])  # fmt: skip
    layout = gtnorm.GraphLayout.from_edge_index(edge_index, (num_src, num_dst), search_order=False)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=device, dtype=dtype, generator=generator).requires_grad_()

    q, k, v = randn(num_dst, heads, channels), randn(num_src, heads, channels), randn(num_src, heads, channels)
    features = randn(num_edges, edge_dim, dtype=torch.float32)
    weight = randn(edge_dim, heads * channels, dtype=torch.float32)
    bias = randn(heads * channels, dtype=torch.float32)
    norm_weights = {}
    if norm != "none":
        norm_weights = dict(
            q_norm_weight=randn(channels, dtype=torch.float32), k_norm_weight=randn(channels, dtype=torch.float32)
        )
    out = gtnorm.graph_transformer_attention(
        q, k, v, None, layout, qk_norm=norm if norm != "none" else False, edge_features=features, edge_weight=weight,
        edge_bias=bias, launch=plan, **norm_weights,
    )  # fmt: skip
    out.float().square().sum().backward()
    torch.cuda.synchronize()


def record(layouts, edge_dims, norms, tiles, device) -> list[dict]:
    launchers = _launchers()
    failures: list[dict] = []

    def recording(name, launcher):
        first_launch = launcher._first_launch

        def wrapped(key, grid, args, kwargs):
            try:
                first_launch(key, grid, args, kwargs)
            except OutOfResources as error:
                failures.append(dict(kernel=name, **_constexprs(key), failed=True, required=error.required))
                raise

        return wrapped

    for name, launcher in launchers.items():
        launcher._first_launch = recording(name, launcher)
    rows = []
    for heads, channels in layouts:
        for edge_dim in edge_dims:
            for norm in norms:
                default = attention_launch_config(heads, channels, edge_dim + 1, shared_memory_per_block(device))
                for tile in ["default", *tiles]:
                    plan = default
                    if tile != "default":
                        plan = dataclasses.replace(
                            plan, projection=dataclasses.replace(plan.projection, channel_block=tile)
                        )
                    for launcher in launchers.values():
                        launcher.clear()
                    failures.clear()
                    status = "ok"
                    try:
                        _run_once(heads, channels, edge_dim, norm, plan, device)
                    except OutOfResources:
                        status = "out of resources"
                    case = dict(heads=heads, channels=channels, edge_dim=edge_dim, norm=norm, tile=tile)
                    print(f"{case}: {status}", flush=True)
                    for name, launcher in launchers.items():
                        for key, (binary, _) in launcher._binaries.items():
                            rows.append(dict(
                                **case, kernel=name, **_constexprs(key), shared=binary.metadata.shared,
                                registers=binary.n_regs, spills=binary.n_spills,
                            ))  # fmt: skip
                    rows += [dict(**case, **failure) for failure in failures]
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layouts", nargs="+", default=[f"{h}x{c}" for h, c in LAYOUTS], help="HxC ...")
    parser.add_argument("--edge-dims", nargs="+", type=int, default=EDGE_DIMS)
    parser.add_argument("--norms", nargs="+", default=["none", "rms", "layer"])
    parser.add_argument("--tiles", nargs="+", type=int, default=FORCED_TILES)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    layouts = [tuple(int(n) for n in spec.split("x")) for spec in args.layouts]
    rows = record(layouts, args.edge_dims, args.norms, args.tiles, device)
    meta = dict(device=torch.cuda.get_device_name(device), limit=shared_memory_per_block(device))
    args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=0, default=str))
    print(f"{len(rows)} records -> {args.out}")


if __name__ == "__main__":
    main()
