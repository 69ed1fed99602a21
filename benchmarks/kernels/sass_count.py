"""Developer tool: static SASS counts of the attention walk kernels (forward, backward by destination, backward by
source) for sm_90 (H100/H200), compiled on a machine without a GPU.

    python -m benchmarks.kernels.sass_count                     # every kernel x variant, a table
    python -m benchmarks.kernels.sass_count --kernel bwd_dst --variant rms -v --dump /tmp/sass
    python -m benchmarks.kernels.sass_count --module /tmp/my_backward_kernels.py   # a modified copy of a module
    python -m benchmarks.kernels.sass_count --pythonpath ../gtnorm-branch          # another checkout (a worktree)
    python -m benchmarks.kernels.sass_count --set bwd_dst:maxnreg=0 --set fwd:NUM_STAGES=1
    python -m benchmarks.kernels.sass_count --edge-features 11   # the walks of the fused edge projection

For each kernel and QK-norm variant (rms, layer, none): the launch the plan makes for a small bf16 problem (H x C,
a random graph of 50 nodes with --degree in-edges each; sass_launches), compiled for sm_90 as Triton's runtime
would compile it there (sass_compile), then per thread registers and spills (ptxas -v), the kernel's SASS
instructions, and for its hot loop, the edge loop (sass_loops): its instructions, those that run at every
iteration (not under a node's first/last-edge branch) and the loop's instructions by category. Static counts:
what one iteration issues, not what it costs; a change that removes instructions from the loop is then measured
on a GPU (kernel_sweep). ``--ptxas legacy`` (the default) assembles with the CUDA 12.x ptxas, as triton 3.6 does
on an H100/H200; ``--ptxas triton``, with what the installed triton takes for sm_90.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import sys
from pathlib import Path

from benchmarks.kernels import sass_compile, sass_launches, sass_loops
from benchmarks.kernels.sass_launches import DTYPE, KERNELS, NODES, VARIANTS
from benchmarks.kernels.sass_loops import CATEGORIES, SassCount


@dataclasses.dataclass
class KernelCount:
    kernel: str  # short name, a key of KERNELS
    variant: str
    origin: str  # the module (or file) its kernel came from
    grid: tuple[int, ...]
    num_warps: int
    maxnreg: int | None
    shared: int  # bytes
    constexprs: dict  # the launch keywords that are the kernel's parameters
    regs: int
    spill_st: int  # bytes
    spill_ld: int
    counts: SassCount
    compiled: sass_compile.CompiledLaunch


def count_kernel(kernel, origin: str, short: str, variant: str, launch: sass_launches.Launch) -> KernelCount:
    compiled = sass_compile.compile_launch(kernel, launch)
    binary = compiled.binary
    options = binary.metadata._asdict()
    info = sass_compile.ptxas_info(binary.asm["ptx"], options)
    reg = sass_compile.resource_usage(binary.asm["cubin"]).get("reg")
    if reg != info.get("regs"):  # re-assembling the PTX should give the binary's own count
        print(f"warning: {short}/{variant}: cubin REG {reg} != ptxas -v {info.get('regs')}")
        info["regs"] = reg
    parameters = inspect.signature(kernel.fn).parameters
    return KernelCount(
        kernel=short,
        variant=variant,
        origin=origin,
        grid=launch.grid,
        num_warps=options["num_warps"],
        maxnreg=options.get("maxnreg"),
        shared=options.get("shared"),
        constexprs={k: v for k, v in launch.kwargs.items() if k in parameters},
        regs=info.get("regs"),
        spill_st=info.get("spill_st", 0),
        spill_ld=info.get("spill_ld", 0),
        counts=sass_loops.count_sass(sass_compile.disassemble(binary.asm["cubin"])),
        compiled=compiled,
    )


def count_kernels(
    kernels: list[str],
    variants: list[str],
    modules: list[str] = (),
    sets: list[str] = (),
    problem: dict | None = None,
    dump: str | None = None,
    verbose: bool = False,
) -> list[KernelCount]:
    """Every (variant, kernel), in that order. ``problem``: capture_launches' keywords (heads, channels, degree,
    edge_attr, ...)."""
    resolved = sass_launches.resolve_kernels(list(modules))
    rows = []
    for variant in variants:
        launches = sass_launches.capture_launches(variant, **(problem or {}))
        for short in kernels:
            kernel, origin = resolved[short]
            launch = sass_launches.apply_overrides(short, launches[short], list(sets))
            row = count_kernel(kernel, origin, short, variant, launch)
            rows.append(row)
            if dump:
                write_dump(row, Path(dump))
            if verbose:
                print_detail(row)
    return rows


def write_dump(row: KernelCount, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{row.kernel}-{row.variant}"
    asm = row.compiled.binary.asm
    (out / f"{stem}.sass").write_text(row.counts.sass)
    (out / f"{stem}.ptx").write_text(asm["ptx"])
    (out / f"{stem}.ttgir").write_text(asm["ttgir"])
    if row.counts.hot:
        (out / f"{stem}.loop.sass").write_text(sass_loops.loop_listing(row.counts))


def print_detail(row: KernelCount) -> None:
    """-v: what the launch was specialised on, every loop, the hot loop's opcodes."""
    signature, counts = row.compiled.signature, row.counts
    print(
        f"== {row.kernel} / {row.variant} from {row.origin}: grid {row.grid}, "
        f"num_warps {row.num_warps}, maxnreg {row.maxnreg}, shared {row.shared} B"
    )
    print("   constexprs:", row.constexprs)
    names = list(signature)
    scalars = {n: t for n, t in signature.items() if not t.startswith("*") and n not in row.constexprs}
    print(
        "   runtime scalars:",
        {n: t for n, t in scalars.items() if t != "constexpr"},
        "specialised to constexpr:",
        [n for n, t in scalars.items() if t == "constexpr"],
    )
    print("   divisible by 16:", [names[k[0]] for k, v in row.compiled.attrs.items() if v])
    if row.compiled.dropped:
        print("   launch keywords not in this kernel's signature (dropped):", row.compiled.dropped)
    for loop in counts.loops:
        print(
            f"   loop header {loop.header:#06x} latches {[hex(a) for a in loop.latches]}: "
            f"{len(loop.instructions)} instrs ({len(loop.every_iteration)} every iteration)"
            f"{' innermost' if loop.innermost else ''}{'  <- hot' if loop is counts.hot else ''}"
        )
    print("   hot loop opcodes:", ", ".join(f"{op} {n}" for op, n in counts.loop_opcodes.most_common()))


def print_table(rows: list[KernelCount]) -> None:
    head = (
        f"{'kernel':8} {'variant':6} {'w':>2} {'cap':>4} {'regs':>4} {'spill st/ld':>11} {'total':>6} | "
        + f"{'loop':>5} {'every':>5} "
        + " ".join(f"{c:>5}" for c in CATEGORIES)
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        spill = f"{r.spill_st}/{r.spill_ld}"
        c = r.counts
        cats = " ".join(f"{c.loop_categories.get(name, 0):>5}" for name in CATEGORIES)
        print(
            f"{r.kernel:8} {r.variant:6} {r.num_warps:>2} {r.maxnreg or '-':>4} {r.regs:>4} "
            f"{spill:>11} {c.total:>6} | {c.loop_len:>5} {c.loop_every:>5} {cats}"
        )
    print(
        "# w: num_warps; cap: maxnreg; regs/spills: ptxas -v; total: SASS instructions (NOPs excluded); loop: the "
        "innermost loop with the most instructions (-v lists all); every: its instructions in blocks that run at "
        "every iteration (not under a per-node first/last branch); by category:"
    )
    print("#", sass_loops.CATEGORY_LEGEND)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", action="append", choices=list(KERNELS), help="repeatable; default all")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS), help="repeatable; default all")
    parser.add_argument(
        "--module",
        action="append",
        default=[],
        help="dotted module or .py path whose kernels (same function names) replace the package's; "
        "repeatable, later wins",
    )
    parser.add_argument("--pythonpath", help="import gtnorm from this checkout (e.g. a git worktree) instead")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="[KERNEL:]NAME=VALUE",
        help="override a launch keyword, e.g. bwd_dst:maxnreg=0, fwd:NUM_STAGES=1, bwd_src:num_warps=4",
    )
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument(
        "--degree",
        type=int,
        default=12,
        help="in-edges per destination: sets the forward's pipelining (>= 8: NUM_STAGES 3) and the "
        "nodes per backward program (16 edges / degree; 1 becomes a constexpr)",
    )
    parser.add_argument("--no-edge-attr", action="store_true", help="HAS_EDGE_ATTR false: no edge term")
    parser.add_argument(
        "--edge-features", type=int, default=0, metavar="D", help="the fused edge projection from D raw attributes"
    )
    parser.add_argument(
        "--ptxas",
        choices=("legacy", "triton"),
        default="legacy",
        help="legacy: the bundled CUDA 12.x ptxas and PTX 8.8 (what triton 3.6 uses for sm_90); "
        "triton: the installed triton's own choice (3.9: CUDA 13.x ptxas-blackwell)",
    )
    parser.add_argument("--dump", metavar="DIR", help="write <kernel>-<variant>.{sass,loop.sass,ptx,ttgir} there")
    parser.add_argument("-v", "--verbose", action="store_true", help="launch details, every loop, loop opcodes")
    args = parser.parse_args(argv)
    if args.pythonpath:
        sys.path.insert(0, str(Path(args.pythonpath).resolve()))  # before anything imports gtnorm
    os.environ.update(sass_compile.toolchain_environment(args.ptxas))
    problem = dict(
        heads=args.heads,
        channels=args.channels,
        degree=args.degree,
        edge_attr=not args.no_edge_attr,
        edge_features=args.edge_features,
    )
    rows = count_kernels(
        args.kernel or list(KERNELS),
        args.variant or list(VARIANTS),
        args.module,
        args.set,
        problem,
        args.dump,
        args.verbose,
    )

    import triton
    from triton.backends.nvidia.compiler import get_ptxas

    import gtnorm

    ptxas = get_ptxas(sass_compile.SM90.arch)
    print(
        f"# sm_90a, triton {triton.__version__}, ptxas {ptxas.version} ({Path(ptxas.path).name}), "
        f"gtnorm from {Path(gtnorm.__file__).parent}; {DTYPE} H={args.heads} C={args.channels}, "
        f"{NODES} nodes x {args.degree} in-edges, "
        + (
            f"fused edge projection of {args.edge_features} attributes"
            if args.edge_features
            else f"edge_attr={not args.no_edge_attr}"
        )
    )
    origins = sorted({f"{r.kernel}: {r.origin}" for r in rows if not r.origin.startswith("gtnorm.triton.")})
    if origins:
        print("# kernels from:", "; ".join(origins))
    if args.set:
        print("# overrides:", " ".join(args.set))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
