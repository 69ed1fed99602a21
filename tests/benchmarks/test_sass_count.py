"""benchmarks/kernels/sass_count on the CPU: the SASS reader on a hand-written listing whose loops are known, and the
three walk kernels compiled for sm_90 end to end by the command line in a process of its own: the CPU tests run
under TRITON_INTERPRET=1, whose jit functions cannot be compiled, and whose interpreter leaves triton.language patched
for itself once any test has called a jit function from Python.

Needs the ptxas, cuobjdump and nvdisasm that triton's pip wheels bundle: without them the tests fail, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.kernels import sass_compile, sass_launches, sass_loops
from benchmarks.kernels.sass_launches import KERNELS

REPO = Path(__file__).resolve().parents[2]

# An edge loop (0x40..0xf0) under a loop over slots (0x30..0x120): at the last edge of a node (@P1 BRA not taken)
# the loop also runs 0x90..0xb0, the per-iteration branch; the NOP is padding. After the EXIT, the `BRA self`
# that pads every kernel.
LISTING = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   ISETP.GE.AND P0, PT, R0, 0x10, PT ;
        /*0020*/               @P0 EXIT ;
.L_x_3:
        /*0030*/                   MOV R2, RZ ;
.L_x_0:
        /*0040*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0050*/                   SHF.L.U32 R5, R4, 0x10, RZ ;
        /*0060*/                   FFMA R6, R5, R5, R6 ;
        /*0070*/                   ISETP.NE.AND P1, PT, R2, R3, PT ;
        /*0080*/               @P1 BRA `(.L_x_1) ;
        /*0090*/                   MUFU.EX2 R7, R6 ;
        /*00a0*/                   STG.E desc[UR4][R8.64], R7 ;
        /*00b0*/                   IMAD.MOV.U32 R6, RZ, RZ, RZ ;
.L_x_1:
        /*00c0*/                   IADD3 R2, R2, 0x1, RZ ;
        /*00d0*/                   NOP ;
        /*00e0*/                   ISETP.GE.AND P2, PT, R2, R9, PT ;
        /*00f0*/              @!P2 BRA `(.L_x_0) ;
        /*0100*/                   IADD3 R0, R0, 0x20, RZ ;
        /*0110*/                   ISETP.GE.AND P0, PT, R0, 0x10, PT ;
        /*0120*/              @!P0 BRA `(.L_x_3) ;
        /*0130*/                   EXIT ;
.L_x_2:
        /*0140*/                   BRA `(.L_x_2);
"""


def addresses(instructions, indices):
    return [instructions[i].address for i in indices]


def test_triton_bundles_the_nvidia_tools():
    for tool in ("ptxas", "cuobjdump", "nvdisasm"):
        assert sass_compile.nvidia_tool(tool).is_file()


def test_parse_sass_reads_instructions_and_labels():
    instructions, labels = sass_loops.parse_sass(LISTING)
    assert len(instructions) == 21
    assert labels == {".L_x_3": 3, ".L_x_0": 4, ".L_x_1": 12, ".L_x_2": 20}
    branch = instructions[15]
    assert (branch.address, branch.predicate, branch.opcode, branch.operands) == (0xF0, "@!P2", "BRA", "`(.L_x_0)")
    assert (instructions[11].opcode, instructions[11].base) == ("IMAD.MOV.U32", "IMAD")


def test_the_hot_loop_is_the_innermost_and_knows_its_per_iteration_branch():
    instructions, labels = sass_loops.parse_sass(LISTING)
    outer, inner = sass_loops.find_loops(instructions, labels)  # biggest first; the `BRA self` is no loop
    assert (outer.header, outer.latches, outer.innermost) == (0x30, [0x120], False)
    assert (inner.header, inner.latches, inner.innermost) == (0x40, [0xF0], True)
    assert sass_loops.hot_loop([outer, inner]) is inner
    assert addresses(instructions, inner.instructions) == list(range(0x40, 0x100, 0x10))
    assert addresses(instructions, inner.every_iteration) == [0x40, 0x50, 0x60, 0x70, 0x80, 0xC0, 0xD0, 0xE0, 0xF0]
    per_node = sorted(set(inner.instructions) - set(inner.every_iteration))
    assert [instructions[i].opcode for i in per_node] == ["MUFU.EX2", "STG.E", "IMAD.MOV.U32"]


def test_counts_leave_out_nops_and_sum_to_the_loop():
    count = sass_loops.count_sass(LISTING)
    assert (count.total, count.loop_len, count.loop_every) == (20, 11, 8)
    assert count.loop_categories == {"mem": 2, "cvt": 1, "fp32": 1, "int": 3, "ctrl": 2, "mufu": 1, "mov": 1}
    assert count.loop_opcodes["ISETP.NE.AND"] == 1 and "NOP" not in count.loop_opcodes
    listing = sass_loops.loop_listing(count).splitlines()
    assert listing[0] == "// hot loop 0x0040..0x00f0 (11 instructions)"
    assert len(listing) == 1 + 12 and "/*00f0*/" in listing[-1]


@pytest.mark.parametrize(
    "line, category",
    [
        ("FFMA R1, R2, R3, R4", "fp32"),
        ("MUFU.EX2 R1, R2", "mufu"),
        ("SHFL.BFLY PT, R1, R2, 0x1, 0x1f", "shfl"),
        ("FSEL R1, R2, RZ, P0", "sel"),
        ("LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]", "mem"),
        ("IMAD R1, R2, R3, R4", "int"),
        ("SHF.L.U32 R5, R4, 0x2, RZ", "int"),
        # ptxas' moves on the FMA pipes
        ("IMAD.MOV.U32 R6, RZ, RZ, R3", "mov"),
        ("IMAD R4, RZ, RZ, R3", "mov"),
        ("HFMA2.MMA R3, -RZ, RZ, 0, 0", "mov"),
        # bf16 unpacked into fp32
        ("SHF.L.U32 R5, R4, 0x10, RZ", "cvt"),
        ("IMAD.U32 R5, R4, 0x10000, RZ", "cvt"),
        ("LOP3.LUT R5, R4, 0xffff0000, RZ, 0xc0, !PT", "cvt"),
        ("HADD2.F32 R5, -RZ, R4.H0_H0", "cvt"),
        ("NOP", "other"),
        ("NEWOP R1, R2", "other"),
    ],
)
def test_opcode_categories(line, category):
    (instruction,), _ = sass_loops.parse_sass(f"        /*0000*/                   {line} ;")
    assert sass_loops.category(instruction) == category


def test_launch_overrides():
    launch = sass_launches.Launch((4, 1), (), {"NUM_STAGES": 3, "num_warps": 1, "maxnreg": 160})
    changed = sass_launches.apply_overrides("bwd_dst", launch, ["bwd_dst:maxnreg=0", "fwd:NUM_STAGES=1", "num_warps=4"])
    assert changed.kwargs == {"NUM_STAGES": 3, "num_warps": 4}
    assert launch.kwargs["maxnreg"] == 160


@pytest.mark.parametrize("variant", ["rms", "layer"])
def test_launches_with_the_fused_edge_projection(variant):
    """--edge-features D records the walks as the projection path launches them (EDGE_PROJ, D attributes and a bias,
    no edge rows; the by-source pass under the projection's register cap), with its node-block kernels stubbed out."""
    launches = sass_launches.capture_launches(variant, degree=8, edge_features=11)
    assert set(launches) == set(KERNELS)
    for short in ("fwd", "bwd_dst"):
        kwargs = launches[short].kwargs
        assert kwargs["EDGE_PROJ"] and kwargs["EDGE_DIM"] == 11 and kwargs["HAS_EDGE_BIAS"], short
        assert not kwargs["HAS_EDGE_ATTR"], short
    assert not launches["bwd_src"].kwargs["HAS_EDGE_ATTR"]
    assert launches["bwd_src"].kwargs["maxnreg"] == 128
    plain = sass_launches.capture_launches(variant, degree=8)
    assert plain["fwd"].kwargs["HAS_EDGE_ATTR"] and not plain["fwd"].kwargs["EDGE_PROJ"]
    assert "maxnreg" not in plain["bwd_src"].kwargs


def test_the_command_line_compiles_every_walk_for_sm90(tmp_path):
    """The rms variant's three kernels through `python -m benchmarks.kernels.sass_count`, in a fresh process without
    the interpreter: a table row per kernel whose loop counts add up, and the dumps -v and --dump write."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    command = [sys.executable, "-m", "benchmarks.kernels.sass_count", "--variant", "rms", "--dump", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["kernel", "variant", "w"])
    columns = lines[header].replace("|", " ").replace("spill st/ld", "spill").split()  # "0/0": stores / loads
    rows = {}
    for line in lines[header + 2 : header + 2 + len(KERNELS)]:
        fields = line.replace("|", " ").split()
        rows[fields[0]] = dict(zip(columns, fields, strict=True))
    assert set(rows) == set(KERNELS)
    for short, row in rows.items():
        assert row["variant"] == "rms"
        assert 0 < int(row["regs"]) <= 255 and row["spill"] == "0/0", row
        loop, every, total = int(row["loop"]), int(row["every"]), int(row["total"])
        # The walks' edge loops hold 200 to 1,000 instructions (bf16, H=16, C=64).
        assert 100 <= loop < total <= 5000 and 0 < every <= loop, row
        assert sum(int(row[category]) for category in sass_loops.CATEGORIES) == loop, row
        assert int(row["mem"]) > 0 and int(row["fp32"]) > 0
        sass = (tmp_path / f"{short}-rms.sass").read_text()
        assert KERNELS[short][1] in sass
        assert (tmp_path / f"{short}-rms.loop.sass").read_text().startswith("// hot loop")


def test_compiling_an_interpreted_kernel_is_refused():
    interpreted = type("InterpretedFunction", (), {"__name__": "walk_kernel"})()
    launch = sass_launches.Launch((1,), (), {})
    with pytest.raises(RuntimeError, match="walk_kernel is not a compilable Triton kernel.*TRITON_INTERPRET"):
        sass_compile.compile_launch(interpreted, launch)
