"""Memory traffic and kernel count of a compiled XLA program, read off its optimized HLO.

Every top-level instruction of the ENTRY computation (a fusion, a copy, a reduction) is one pass over memory: it
reads its operands and writes its result. Summing those bytes gives the traffic when nothing stays in cache between
passes, the regime of a tree of parameters much larger than the cache. An in-place update (a ``scatter`` or
``dynamic-update-slice``, or a fusion whose root is one) writes into its first operand's buffer: it moves its
other operands and writes as many bytes as its largest one (the update), not the buffer. A model, not a
measurement: it counts bytes, not time, and nothing for a ``conditional``, which passes its operands by reference
(lpjax's conditionals are the rare paths: an exact finiteness re-check, a growth check).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

_ITEMSIZE = {
    **dict.fromkeys(("pred", "s8", "u8", "f8e4m3fn", "f8e5m2"), 1),
    **dict.fromkeys(("s16", "u16", "f16", "bf16"), 2),
    **dict.fromkeys(("s32", "u32", "f32"), 4),
    **dict.fromkeys(("s64", "u64", "f64"), 8),
}
_NO_KERNEL = {"parameter", "tuple", "get-tuple-element", "constant", "bitcast", "after-all"}
_NO_TRAFFIC = _NO_KERNEL | {"conditional"}
_IN_PLACE = {"scatter", "dynamic-update-slice"}
_CALLS = {"call": "to_apply", "while": "body"}  # an opcode that runs another computation: the attribute naming it
_COMPUTATION = re.compile(r"^(ENTRY )?%([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")


class Pass(NamedTuple):
    """One top-level instruction: its name, opcode, and the bytes it reads and writes."""

    name: str
    opcode: str
    read: int
    written: int


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape such as ``f32[1024,64]{1,0}`` or a tuple of shapes."""
    found = re.findall(r"(\w+)\[([\d,]*)\]", shape)
    return sum(math.prod(int(d) for d in dims.split(",") if d) * _ITEMSIZE.get(dtype, 0) for dtype, dims in found)


def passes(hlo_text: str, computation: str | None = None) -> list[Pass]:
    """The passes over memory of the ENTRY computation of an optimized HLO module (``compiled.as_text()``), or of
    the computation named ``computation`` (e.g. a loop body of :func:`loop_bodies`: its passes per trip)."""
    computations, entry = _computations(hlo_text)
    sizes: dict[str, int] = {}
    out = []
    for name, shape, opcode, rest in computations[computation or entry]:
        sizes[name] = shape_bytes(shape)
        if opcode in _NO_TRAFFIC:
            continue
        operands = [sizes.get(o, 0) for o in re.findall(r"%([\w.\-]+)", rest.split("), ")[0])]
        fused = computations.get(_called(rest, "calls"), []) if opcode == "fusion" else []
        if (fused[-1][2] if fused else opcode) in _IN_PLACE and len(operands) > 1:  # updates operand 0 in place
            out.append(Pass(name, opcode, sum(operands[1:]), max(operands[1:])))
        else:
            out.append(Pass(name, opcode, sum(operands), sizes[name]))
    return out


def _computations(hlo_text: str) -> tuple[dict[str, list[tuple[str, ...]]], str]:
    """Every computation's instructions as ``(name, shape, opcode, rest of the line)``, and the ENTRY's name."""
    computations: dict[str, list[tuple[str, ...]]] = {}
    current, entry = None, None
    for line in hlo_text.splitlines():
        if header := _COMPUTATION.match(line):
            current = header.group(2)
            computations[current] = []
            entry = current if header.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif current is not None and (match := _INSTRUCTION.match(line)):
            computations[current].append(match.groups())
    if entry is None:
        raise ValueError("not an HLO module: no ENTRY computation")
    return computations, entry


def loop_bodies(hlo_text: str) -> list[str]:
    """Names of the body computations of the ``while`` loops of a compiled program, largest first."""
    computations, _ = _computations(hlo_text)
    bodies = {_called(rest, "body") for ops in computations.values() for _, _, opcode, rest in ops if opcode == "while"}
    return sorted(bodies, key=lambda name: -len(computations[name]))


def _called(rest: str, attribute: str) -> str:
    return re.search(attribute + r"=%([\w.\-]+)", rest).group(1)


def kernel_count(hlo_text: str) -> int:
    """Work instructions (a fusion, a dot, a copy, a conditional, a custom call: not ``parameter``, ``tuple``,
    ``constant``...) of a compiled program's ENTRY computation and, once each, of its loops' bodies; a ``call``
    (XLA:CPU outlines loops into one) counts what it calls. On a GPU each is about one kernel launch, so this is the
    CPU's stand-in for the kernels one step launches."""
    computations, entry = _computations(hlo_text)

    def count(name: str) -> int:
        work = computations[name]
        return sum(count(_called(r, _CALLS[op])) if op in _CALLS else op not in _NO_KERNEL for _, _, op, r in work)

    return count(entry)


def by_output(hlo_text: str, output_labels: list[str], tree_bytes: int) -> dict[str, dict]:
    """Traffic per kind of result, in trees: the passes writing each labelled output, temporaries, reductions.

    ``output_labels[i]`` names the program's ``i``-th output (e.g. ``"first moment"``); passes whose result is
    not an output are ``"temporary"`` (a tree-sized intermediate), ``"reduction"`` (a scalar or small result,
    such as a finiteness check) or ``"copy"``.
    """
    root = next(line for line in hlo_text[hlo_text.index("\nENTRY") :].splitlines() if "ROOT" in line)
    outputs = re.findall(r"%([\w.\-]+)", root.split(" tuple(", 1)[1])  # what the ENTRY's ROOT tuple returns
    if len(outputs) != len(output_labels):
        raise ValueError(f"{len(outputs)} outputs, {len(output_labels)} labels")
    label_of = dict(zip(outputs, output_labels))
    table: dict[str, dict] = {}
    for p in passes(hlo_text):
        unlabelled = "temporary" if p.written * 16 >= tree_bytes else "reduction"
        label = "copy" if p.opcode == "copy" else label_of.get(p.name, unlabelled)
        row = table.setdefault(label, {"passes": 0, "read_trees": 0.0, "written_trees": 0.0})
        row["passes"] += 1
        row["read_trees"] += p.read / tree_bytes
        row["written_trees"] += p.written / tree_bytes
    return table


def summary(hlo_text: str, tree_bytes: int) -> dict:
    """Totals of :func:`passes`, also in units of ``tree_bytes`` (the bytes of one parameter-shaped tree)."""
    found = passes(hlo_text)
    read, written = sum(p.read for p in found), sum(p.written for p in found)
    return {
        "passes": len(found),
        "copies": sum(p.opcode == "copy" for p in found),
        "read_bytes": read,
        "written_bytes": written,
        "read_trees": read / tree_bytes,
        "written_trees": written / tree_bytes,
        "traffic_trees": (read + written) / tree_bytes,
    }
