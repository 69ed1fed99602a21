"""Reading ``nvdisasm -c`` SASS text: its instructions, the natural loops of its control-flow graph, the hot loop
and the opcode categories that benchmarks.kernels.sass_count prints.

The hot loop of an edge walk is the innermost loop with the most instructions: the forward's pipelined form wraps
its edge loop in a loop over slots, and that outer loop is not the one. Within it, the instructions of the blocks
that dominate every latch run at every iteration; the rest sit under a per-iteration branch (a node's first or
last edge).
"""

from __future__ import annotations

import collections
import dataclasses
import re

CATEGORIES = ("mem", "fp32", "cvt", "shfl", "mufu", "sel", "int", "mov", "ctrl", "other")
# By opcode, the part before the first '.'; category() refines the few opcodes ptxas uses as moves or to unpack bf16.
_OPCODES = {
    "mem": "LDG STG LDGSTS LDS STS LDSM STSM DEPBAR BAR LDGDEPBAR LDL STL LD ST ATOM ATOMG ATOMS RED REDG LDC ULDC "
    "MEMBAR FENCE CCTL ERRBAR SYNCS UBLKCP UTMALDG UTMASTG",
    "fp32": "FFMA FMUL FADD FMNMX FSETP FSET FCHK FRND FSWZADD HFMA2 HADD2 HMUL2 HMNMX2 HSETP2 DFMA DADD DMUL",
    "cvt": "F2F F2FP PRMT I2F F2I I2FP F2IP I2I",
    "shfl": "SHFL",
    "mufu": "MUFU",
    "sel": "SEL FSEL USEL",
    "int": "IMAD IADD3 IADD LEA SHF LOP3 ISETP IABS IMNMX IMUL SHL SHR POPC FLO BREV PLOP3 P2R R2P VIADD VIMNMX "
    "VIADDMNMX SGXT BMSK UIADD3 ULEA ULOP3 USHF UIMAD UISETP UPLOP3 UP2UR USGXT UBMSK UIMNMX UFLO UPOPC UBREV "
    "ULEPC LEPC",
    "mov": "MOV UMOV MOV32I R2UR S2R S2UR CS2R UR2R",
    "ctrl": "BRA BRX JMP JMX BSSY BSYNC EXIT RET CALL WARPSYNC BMOV YIELD BPT KILL NANOSLEEP ELECT",
}
OPCODE_CATEGORY = {op: cat for cat, ops in _OPCODES.items() for op in ops.split()}
CATEGORY_LEGEND = (
    "mem LDG/STG/LDGSTS/LDS/STS/LDSM/BAR/DEPBAR/LDC..; fp32 FFMA/FMUL/FADD/FMNMX/FSETP; cvt F2F/F2FP/PRMT/I2F + bf16 "
    "unpack (SHF.L 0x10, IMAD.U32 0x10000, LOP3 0xffff0000); sel SEL/FSEL; int IMAD/IADD3/LEA/SHF/LOP3/ISETP/U*; "
    "mov MOV/UMOV/R2UR/S2R/CS2R/IMAD.MOV/HFMA2.MMA -RZ; ctrl BRA/BSSY/BSYNC/EXIT.."
)

# `        /*0a10*/               @!P2 BRA `(.L_x_3) ;`: address, predicate, opcode with modifiers, operands.
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\s*([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_BRANCHES = ("BRA", "BRX", "JMP")
_ENDS = ("EXIT", "RET")


@dataclasses.dataclass
class Instruction:
    address: int
    predicate: str  # "" or e.g. "@!P2"
    opcode: str  # with its modifiers: "IMAD.MOV.U32"
    operands: str
    line: str

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


@dataclasses.dataclass
class Loop:
    header: int  # address of its first instruction
    latches: list[int]  # addresses of the branches back to the header
    blocks: frozenset[int]
    instructions: list[int]  # indices into the parsed instructions, NOPs included
    every_iteration: list[int]  # those in blocks that dominate every latch
    innermost: bool = True


@dataclasses.dataclass
class SassCount:
    """One kernel's SASS: ``total`` and the hot loop's counts exclude NOPs (alignment padding, never issued)."""

    sass: str
    total: int
    loops: list[Loop]  # biggest first
    hot: Loop | None
    loop_len: int
    loop_every: int
    loop_categories: collections.Counter
    loop_opcodes: collections.Counter


def parse_sass(text: str) -> tuple[list[Instruction], dict[str, int]]:
    """The instructions in address order, and label -> index of the instruction it names."""
    instructions, labels, pending = [], {}, []
    for line in text.splitlines():
        if m := _LABEL.match(line):
            pending.append(m.group(1))
        elif m := _INSTRUCTION.match(line):
            labels.update(dict.fromkeys(pending, len(instructions)))
            pending = []
            address, predicate, opcode, operands = m.groups()
            instructions.append(
                Instruction(int(address, 16), (predicate or "").strip(), opcode, operands.strip(), line.strip())
            )
    labels.update(dict.fromkeys(pending, len(instructions)))
    return instructions, labels


def category(ins: Instruction) -> str:
    op, base, operands = ins.opcode, ins.base, ins.operands
    if base == "NOP":
        return "other"
    # ptxas moves registers on the FMA pipes, to balance them against the ALU's.
    if (
        op.startswith("IMAD.MOV")
        or (op.startswith("IMAD") and operands.split(", ")[1:3] == ["RZ", "RZ"])
        or (base == "HFMA2" and op.endswith(".MMA") and "-RZ, RZ" in operands)
    ):
        return "mov"
    if op.startswith("HADD2.F32"):
        return "cvt"
    # bf16 -> fp32 is no conversion instruction but a shift into the high half (low bf16: x << 16, or x * 0x10000)
    # or a mask of it (high bf16: x & 0xffff0000).
    if (
        (base == "SHF" and op.startswith("SHF.L.U32") and re.search(r", 0x10, RZ$", operands))
        or (base == "IMAD" and op.startswith("IMAD.U32") and "0x10000" in operands)
        or (base == "LOP3" and "0xffff0000" in operands)
    ):
        return "cvt"
    return OPCODE_CATEGORY.get(base, "other")


def categorise(instructions: list[Instruction]) -> collections.Counter:
    return collections.Counter(category(ins) for ins in instructions)


def _basic_blocks(instructions: list[Instruction], labels: dict[str, int]) -> tuple[list[range], dict[int, set]]:
    """Blocks (index ranges) split at branch targets and after branches and exits, and block -> successors."""
    n = len(instructions)
    targets = {}  # branch index -> target index
    for i, ins in enumerate(instructions):
        if ins.base in _BRANCHES and (m := _BRANCH_TARGET.search(ins.operands)) and m.group(1) in labels:
            targets[i] = labels[m.group(1)]
    leaders = {0} | set(targets.values()) | {i + 1 for i in targets}
    leaders |= {i + 1 for i, ins in enumerate(instructions) if ins.base in _ENDS}
    leaders = sorted(x for x in leaders if x < n)
    blocks = [range(start, end) for start, end in zip(leaders, [*leaders[1:], n], strict=False)]
    block_of = {i: b for b, block in enumerate(blocks) for i in block}
    successors = collections.defaultdict(set)
    for b, block in enumerate(blocks):
        last = block[-1]
        ins = instructions[last]
        unconditional = not ins.predicate or ins.predicate == "@PT"
        if last in targets:
            successors[b].add(block_of[targets[last]])
        falls_through = not (unconditional and (ins.base in _ENDS or last in targets))
        if falls_through and b + 1 < len(blocks):
            successors[b].add(b + 1)
    return blocks, successors


def _dominators(num_blocks: int, predecessors: dict[int, set]) -> dict[int, set]:
    every = set(range(num_blocks))
    dom = {b: ({b} if b == 0 or not predecessors[b] else set(every)) for b in range(num_blocks)}
    changed = True
    while changed:
        changed = False
        for b in range(1, num_blocks):
            if predecessors[b]:
                new = {b} | set.intersection(*(dom[p] for p in predecessors[b]))
                if new != dom[b]:
                    dom[b], changed = new, True
    return dom


def find_loops(instructions: list[Instruction], labels: dict[str, int]) -> list[Loop]:
    """The natural loops, biggest first. A back edge is a branch to a block at or before its own; its loop is the
    header plus every block that reaches the latch without passing the header; back edges to one header make one
    loop."""
    blocks, successors = _basic_blocks(instructions, labels)
    predecessors = collections.defaultdict(set)
    for b, ss in successors.items():
        for s in ss:
            predecessors[s].add(b)
    latches_of, body_of = collections.defaultdict(set), collections.defaultdict(set)  # by header block
    for b, ss in successors.items():
        for h in ss:
            if blocks[h].start > blocks[b].start:
                continue
            body, stack = {h, b}, [b]
            while stack:
                x = stack.pop()
                if x == h:
                    continue
                for p in predecessors[x] - body:
                    body.add(p)
                    stack.append(p)
            latches_of[h].add(b)
            body_of[h] |= body
    dom = _dominators(len(blocks), predecessors)
    loops = []
    for h, body in body_of.items():
        indices = sorted(i for b in body for i in blocks[b])
        if len(indices) <= 2:  # the `BRA self` that pads the code after its EXIT
            continue
        always = set.intersection(*(dom[b] for b in latches_of[h])) & body
        loops.append(
            Loop(
                header=instructions[blocks[h].start].address,
                latches=sorted(instructions[blocks[b][-1]].address for b in latches_of[h]),
                blocks=frozenset(body),
                instructions=indices,
                every_iteration=sorted(i for b in always for i in blocks[b]),
            )
        )
    for loop in loops:
        loop.innermost = not any(other.blocks < loop.blocks for other in loops)
    return sorted(loops, key=lambda loop: -len(loop.instructions))


def hot_loop(loops: list[Loop]) -> Loop | None:
    inner = [loop for loop in loops if loop.innermost]
    return max(inner, key=lambda loop: len(loop.instructions)) if inner else None


def count_sass(text: str) -> SassCount:
    instructions, labels = parse_sass(text)
    loops = find_loops(instructions, labels)
    hot = hot_loop(loops)
    issued = [ins for ins in instructions if ins.base != "NOP"]
    in_loop = [instructions[i] for i in hot.instructions if instructions[i].base != "NOP"] if hot else []
    return SassCount(
        sass=text,
        total=len(issued),
        loops=loops,
        hot=hot,
        loop_len=len(in_loop),
        loop_every=sum(instructions[i].base != "NOP" for i in hot.every_iteration) if hot else 0,
        loop_categories=categorise(in_loop),
        loop_opcodes=collections.Counter(ins.opcode for ins in in_loop),
    )


def loop_listing(count: SassCount) -> str:
    """The hot loop's lines of the SASS, from its header to its last latch, under a one-line heading."""
    lo, hi = count.hot.header, max(count.hot.latches)
    lines = [line for line in count.sass.splitlines() if (m := _INSTRUCTION.match(line)) and lo <= int(m[1], 16) <= hi]
    return f"// hot loop {lo:#06x}..{hi:#06x} ({count.loop_len} instructions)\n" + "\n".join(lines)
