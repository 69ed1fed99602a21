"""benchmarks/kernels/sass_count on the CPU: the SASS reader on a hand-written listing whose loops are known, and the
three walk kernels compiled for sm_90 end to end, under the TRITON_INTERPRET=1 the CPU tests run with
(sass_compile swaps the interpreter's functions for JITFunctions while it compiles).

Needs the ptxas, cuobjdump and nvdisasm that triton's pip wheels bundle: without them the tests fail, saying so.
"""

from __future__ import annotations

import pytest
import triton.language as tl

from benchmarks.kernels import sass_compile, sass_count, sass_launches, sass_loops
from benchmarks.kernels.sass_launches import KERNELS

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


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The rms variant's three kernels, compiled into a fresh cache: (rows by kernel, triton.language's objects
    before, after)."""
    language = lambda: (tl.zeros, tl.sum, tl.range)  # InterpretedFunctions and a class, under the interpreter
    before = language()
    cache = str(tmp_path_factory.mktemp("triton_cache"))
    with pytest.MonkeyPatch.context() as env:
        for name, value in sass_compile.toolchain_environment("legacy", cache).items():
            env.setenv(name, value)
        rows = sass_count.count_kernels(list(KERNELS), ["rms"])
    return {row.kernel: row for row in rows}, before, language()


@pytest.mark.parametrize("short", list(KERNELS))
def test_a_real_kernel_compiles_for_sm90_with_a_hot_loop(compiled, short):
    row = compiled[0][short]
    count = row.counts
    assert 0 < row.regs <= 255
    assert KERNELS[short][1] in count.sass
    assert count.hot is not None and count.hot.innermost
    # The walks' edge loops hold 200 to 1,000 instructions (bf16, H=16, C=64).
    assert 100 <= count.loop_len < count.total <= 5000
    assert 0 < count.loop_every <= count.loop_len
    assert sum(count.loop_categories.values()) == count.loop_len
    assert count.loop_categories["mem"] > 0 and count.loop_categories["fp32"] > 0


def test_compiling_leaves_triton_language_as_it_was(compiled):
    _, before, after = compiled
    assert all(a is b for a, b in zip(before, after, strict=True))


def test_the_table_prints_a_row_per_kernel(compiled, capsys):
    sass_count.print_table(list(compiled[0].values()))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["kernel", "variant", "w"]
    assert [line.split()[:2] for line in lines[2:5]] == [[short, "rms"] for short in KERNELS]
