"""What the compiler did: collectives in the HLO, per-device memory, shard tables.

These read the *compiled* program (``jax.jit(f).lower(*args).compile()``, also ahead of time for a TPU
topology): the per-device program, the only place the partitioner's collectives can be counted. Backends differ:

- a reduce-scatter the *partitioner* inserts (the gradient of a weight at ``P('data', None)``) is, on
  CPU, an ``all-reduce`` then a ``dynamic-slice``, reported as the all-reduce it is; the TPU compiler
  fuses the pair (a fusion calling ``%all-reduce-scatter``), reported as one reduce-scatter;
- ``jax.lax.psum_scatter`` is a ``reduce-scatter`` on CPU; on TPU only where each device's part fills
  whole 8-row tiles (``f32[32,512]`` over 4 devices), else an ``all-reduce`` of the whole array;
- the TPU gathers f32 matmul operands as bf16 (half the bytes: ``result_bytes`` follows the stated
  type) and runs some collectives as async chains, each counted once;
- the GPU writes ``-start``/``-done`` pairs and may flatten a combined all-reduce into one 1-D buffer:
  kinds, groups and bytes stay exact, the per-array shapes are lost.
"""

from __future__ import annotations

import contextlib
import math
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .capture import quiet
from .layout import as_layout, tiles

__all__ = ["COLLECTIVES", "CollectiveOp", "Collectives", "Memory", "ScheduleStep", "ShardRow", "ShardTable",
           "collectives", "compile_with_log", "format_bytes", "memory_per_device", "memory_spaces", "schedule",
           "shard_table"]

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16, "bf16": 16,
         "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128,
         "f8e4m3fn": 8, "f8e5m2": 8, "f8e4m3fnuz": 8, "f8e5m2fnuz": 8, "f8e4m3b11fnuz": 8}
_ARRAY = re.compile(r"(?P<dtype>[a-z]+[0-9]*[a-z0-9]*)\[(?P<dims>[0-9,]*)\]")
_INSTR = re.compile(r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<rest>.*)$")
_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(
    r"\b(?P<key>calls|to_apply|body|condition|true_computation|false_computation|branch_computations)="
    r"(?P<target>\{[^}]*\}|%?[\w.\-]+)"
)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class _Printed:
    """Shown in a notebook by its ``__str__`` (a table), not a dataclass repr."""

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


@dataclass(frozen=True)
class CollectiveOp:
    """One collective of the compiled per-device program.

    ``name``: its HLO instruction (a TPU fused reduce-scatter: the fusion); ``result_type``: the per-device
    result without layouts (``'4 x f32[8]'`` for a tuple of equal arrays), ``result_bytes`` its size as
    stated (no TPU tile padding); ``group_size``: devices per group (a collective-permute: its largest ring);
    ``shapes``: each array produced (one flat one where the GPU flattened a combined op); ``form``: ``'op'``,
    ``'async'`` (a start/done pair, an async wrapper, a TPU chain) or ``'fused'``; ``in_loop``: stated once
    in a ``while`` body (``loop``, the innermost); ``trips``: runs per call, the product of its loops' trip
    counts (None where a count cannot be read, e.g. a condition that depends on data).
    ``estimated_bytes`` is an estimate, what each device sends under the textbook ring algorithm.
    """

    kind: str
    name: str
    result_type: str
    result_bytes: int
    group_size: int
    shapes: tuple[tuple[int, ...], ...] = ()
    form: str = "op"
    in_loop: bool = False
    trips: int | None = 1
    loop: str = ""

    @property
    def runs(self) -> int:
        """How many times it runs per call: ``trips``, or a ValueError naming the loop whose count is unknown."""
        if self.trips is None:
            raise ValueError(f"{self.kind} {self.name!r} sits in loop {self.loop!r}, whose trip count cannot be "
                             "read from the program (its condition is not a counter compared with a constant)")
        return self.trips

    @property
    def estimated_bytes(self) -> float:
        """Ring-formula estimate of the bytes each device sends in ONE run (not measured); 0 for a group of one."""
        n = self.group_size
        share = {"all-gather": (n - 1) / n, "reduce-scatter": n - 1, "all-reduce": 2 * (n - 1) / n,
                 "all-to-all": (n - 1) / n, "collective-permute": 1.0}[self.kind]
        return 0.0 if n <= 1 else share * self.result_bytes


@dataclass(frozen=True)
class Collectives(_Printed):
    """Every collective found in a compiled program, in program order (see :func:`collectives`)."""

    ops: tuple[CollectiveOp, ...]

    @property
    def counts(self) -> dict[str, int]:
        """Runs per kind, every kind present (0 where absent): an op in a loop counts once per trip."""
        return {k: sum(op.runs for op in self.ops if op.kind == k) for k in COLLECTIVES}

    def count(self, kind: str | None = None) -> int:
        """How many collectives of ``kind`` run per call (all kinds when None), each loop's op once per trip."""
        if kind is None:
            return sum(op.runs for op in self.ops)
        if kind not in COLLECTIVES:
            raise ValueError(f"unknown collective {kind!r}; expected one of {COLLECTIVES}")
        return self.counts[kind]

    @property
    def kinds(self) -> set[str]:
        return {op.kind for op in self.ops}

    @property
    def result_bytes(self) -> int:
        """Sum of the ops' per-device result sizes over every run (an op in a loop once per trip)."""
        return sum(op.result_bytes * op.runs for op in self.ops)

    @property
    def estimated_bytes(self) -> float:
        """Sum of the ops' ring-formula estimates over every run: an estimate, not a measurement."""
        return sum(op.estimated_bytes * op.runs for op in self.ops)

    def __str__(self) -> str:
        if not self.ops:
            return "no collectives: each device computes without talking to the others"
        labels = [op.kind + (f" (in loop, x{op.trips or '?'})" if op.in_loop else "") for op in self.ops]
        width = max(19, max(len(label) for label in labels) + 1)
        lines = [f"{'collective':<{width}}{'result (per device)':<28}{'group':>6}{'ring estimate':>14}"
                 + ("  (per run)" if any(op.in_loop for op in self.ops) else "")]
        for label, op in zip(labels, self.ops, strict=True):
            shown = op.result_type
            if len(shown) > 27:  # a combined op of many arrays: say how many, and their size
                shown = f"{len(op.shapes)} arrays, {format_bytes(op.result_bytes)}"
            lines.append(f"{label:<{width}}{shown:<28}{op.group_size:>6}{format_bytes(op.estimated_bytes):>14}")
        total = "total (estimated: ring formula, not measured)"
        known = all(op.trips is not None for op in self.ops)
        lines.append(f"{total:<{width + 34}}{format_bytes(self.estimated_bytes) if known else 'unknown':>14}")
        if any(op.in_loop for op in self.ops):
            lines.append("(in loop, xN): stated once in a loop body, runs N times; the total counts every run"
                         + ("" if known else " (x?: a loop whose trip count cannot be read)"))
        return "\n".join(lines)


def _hlo_text(compiled: Any) -> str:
    if isinstance(compiled, str):
        return compiled
    import jax

    if isinstance(compiled, jax.stages.Lowered):
        raise TypeError("this is a Lowered program (before partitioning, so it has no collectives yet): "
                        "call .compile() on it first, e.g. jax.jit(f).lower(x).compile()")
    if isinstance(compiled, jax.stages.Wrapped) or (callable(compiled) and not hasattr(compiled, "as_text")):
        raise TypeError("pass the compiled program, not the function: jax.jit(f).lower(*args).compile()")
    if not hasattr(compiled, "as_text"):
        raise TypeError(f"expected a compiled program from jax.jit(f).lower(*args).compile(), or its HLO text; "
                        f"got {type(compiled).__name__}")
    return compiled.as_text()


def _partitions(text: str) -> int | None:
    """The number of devices the program runs on (``num_partitions``), None where the text does not say."""
    m = re.search(r"num_partitions=(\d+)", text)
    return int(m.group(1)) if m else None


def _strip_type(type_text: str) -> str:
    """Drop layouts (``{1,0}``, ``{1,0:T(8,128)(2,1)S(1)}``) and ``/*index=5*/`` comments from an HLO type."""
    text = re.sub(r"/\*.*?\*/", "", type_text)
    return re.sub(r"\]\{[^{}]*\}", "]", text).strip()


def _tuple_elements(type_text: str) -> list[str]:
    """Top-level elements of a tuple type ``(a, (b, c), d)``; ``[type_text]`` for an array."""
    text = type_text.strip()
    if not text.startswith("("):
        return [text]
    parts, depth, current = [], 0, ""
    for ch in text[1:-1]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current.strip())
    return parts


def _short_type(type_text: str) -> str:
    """'f32[4,8]{1,0:T(8,128)}' -> 'f32[4,8]'; a tuple of equal arrays -> '4 x f32[4,8]'."""
    text = _strip_type(type_text)
    if text.startswith("("):
        parts = _tuple_elements(text)
        if parts and len(set(parts)) == 1:
            return f"{len(parts)} x {parts[0]}"
        return " + ".join(parts)
    return text


def _arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(m.group("dtype"), tuple(int(d) for d in m.group("dims").split(",") if d))
            for m in _ARRAY.finditer(_strip_type(type_text)) if m.group("dtype") in _BITS]


def _groups(line: str, n: int) -> list[list[int]]:
    """A collective's groups of partition ids (a collective-permute: its pairs) from any spelling XLA prints:
    Shardy's ``mesh['axis_0'=4,'axis_1'=2] {'axis_1'}`` (the compiler's mesh, not the user's; perhaps with
    ``device_ids=([4,2]T(1,0))``), iota ``[2,4]<=[4,2]T(1,0)``, explicit ``{{0,1},{2,3}}``, ``{}`` (all ``n``)."""
    def ints(text: str | None) -> list[int]:
        return [int(v) for v in re.findall(r"\d+", text or "")]

    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=(\S+))?\s*\{([^}]*)\}", line)
    if m:
        sizes = [(k, int(v)) for k, v in re.findall(r"'([^']+)'=(\d+)", m.group(1))]
        iota = re.fullmatch(r"\(\[([\d,]+)\](?:T\(([\d,]+)\))?\)", m.group(2) or "")
        ids = (np.arange(math.prod(v for _, v in sizes)).reshape(ints(iota.group(1))).transpose(ints(iota.group(2))
               or None) if iota else np.array(ints(m.group(2)) or range(math.prod(v for _, v in sizes))))
        keep = [i for i, (k, _) in enumerate(sizes) if f"'{k}'" in m.group(3)]
        ids = ids.reshape([v for _, v in sizes]).transpose([i for i in range(len(sizes)) if i not in keep] + keep)
        return ids.reshape(-1, math.prod(sizes[i][1] for i in keep)).tolist()
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:
        dims = ints(m.group(3))
        return np.arange(math.prod(dims)).reshape(dims).transpose(ints(m.group(4)) or None).reshape(int(m.group(1)),
                                                                                                 -1).tolist()
    m = re.search(r"(?:replica_groups|source_target_pairs)=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", line)
    return [ints(g) for g in re.findall(r"\{([\d,]*)\}", m.group(1))] if m else [list(range(n))]


def _group_size(line: str, total_devices: int | None) -> int:
    """Devices per group; for a collective-permute, its largest ring (several may run side by side)."""
    groups = _groups(line, total_devices or 1)
    if "source_target_pairs=" not in line:
        return len(groups[0])
    rings: list[set[int]] = []  # the connected groups of the pair graph
    for pair in map(set, groups):
        rings = [r for r in rings if not r & pair] + [pair.union(*(r for r in rings if r & pair))]
    return max(2, *map(len, rings))


@dataclass(frozen=True)
class _Instr:
    name: str
    type: str
    opcode: str
    operands: tuple[str, ...]
    attrs: str
    line: str

    @property
    def called(self) -> list[tuple[str, str]]:
        """(attribute, computation) for every computation this instruction calls."""
        return [(m.group("key"), target) for m in _CALLS.finditer(self.attrs)
                for target in re.findall(r"%?([\w.\-]+)", m.group("target"))]

    @property
    def channel(self) -> str | None:
        m = re.search(r"\bchannel_id=(\d+)", self.attrs)
        return m.group(1) if m else None


def _matching(text: str, start: int) -> int:
    """Index just past the bracket that closes the one at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _parse_instr(line: str) -> _Instr | None:
    m = _INSTR.match(line)
    if not m:
        return None
    rest = m.group("rest")
    words = rest.split(None, 1)
    end = _matching(rest, 0) if rest.startswith("(") else len(words[0]) if words else 0
    type_text, after = rest[:end], rest[end:]
    op = re.match(r"\s*(?P<opcode>[\w\-]+)\(", after)
    if not op:
        return None
    close = _matching(after, op.end() - 1)
    operands = tuple(re.findall(r"%([\w.\-]+)", after[op.end() - 1:close]))
    return _Instr(m.group("name"), type_text, op.group("opcode"), operands, after[close:], line)


def _parse_module(text: str) -> tuple[dict[str, list[_Instr]], list[str]]:
    """Computations (name -> instructions in text order) and the roots to walk from (ENTRY, else all)."""
    comps: dict[str, list[_Instr]] = {}
    entry: str | None = None
    current = ""
    for line in text.splitlines():
        if line and not line[0].isspace():
            header = _HEADER.match(line)
            if header and not line.startswith("HloModule"):
                current = header.group("name")
                comps.setdefault(current, [])
                if header.group("entry"):
                    entry = current
                continue
            if line.startswith("}"):
                current = ""
                continue
        instr = _parse_instr(line)
        if instr is not None:
            comps.setdefault(current, []).append(instr)
    roots = [entry] if entry is not None else list(comps)
    return comps, roots


_PASS_THROUGH = ("copy", "convert", "bitcast", "reshape")
_FLIP = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE", "EQ": "EQ", "NE": "NE"}


def _through(instr: _Instr | None, where: dict[str, _Instr]) -> _Instr | None:
    """Follow copies, converts and bitcasts back to the instruction that made the value."""
    while instr is not None and instr.opcode in _PASS_THROUGH and instr.operands:
        instr = where.get(instr.operands[0])
    return instr


def _constant(instr: _Instr | None, where: dict[str, _Instr]) -> int | None:
    """The integer a scalar ``constant(N)`` holds (through copies), else None."""
    instr = _through(instr, where)
    m = re.search(r"\bconstant\((-?\d+)\)", instr.line) if instr is not None and instr.opcode == "constant" else None
    return int(m.group(1)) if m else None


def _element(instr: _Instr | None, where: dict[str, _Instr]) -> int | None:
    """k when the value is element k of the computation's tuple parameter (through copies), else None."""
    instr = _through(instr, where)
    if instr is None or instr.opcode != "get-tuple-element" or not instr.operands:
        return None
    source = where.get(instr.operands[0])
    m = re.search(r"\bindex=(\d+)", instr.attrs)
    return int(m.group(1)) if m and source is not None and source.opcode == "parameter" else None


def _trip_count(loop: _Instr, comps: dict[str, list[_Instr]], caller: list[_Instr]) -> int | None:
    """How many times a ``while`` instruction runs its body, read from the program; None if it cannot be read.

    ``known_trip_count`` in its ``backend_config`` where the compiler wrote one (the CPU compiler does).
    Otherwise (the TPU compiler writes none) from the induction variable: the condition's root compares
    element k of the loop's tuple with a constant (``LT``, ``LE``, ``GT``, ``GE``, ``NE``), the body's root
    tuple sets element k to element k plus (or minus) a constant, and the loop's operand starts element k
    at a constant of ``caller``, the computation the loop sits in.
    """
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attrs)
    if m:
        return int(m.group(1))
    called = dict(loop.called)
    cond, body = comps.get(called.get("condition", ""), []), comps.get(called.get("body", ""), [])
    if not cond or not body or not loop.operands:
        return None
    at = {i.name: i for i in cond}
    root = next((i for i in cond if i.line.lstrip().startswith("ROOT")), cond[-1])
    direction = re.search(r"direction=(\w+)", root.attrs)
    if root.opcode != "compare" or not direction or len(root.operands) != 2:
        return None
    a, b = (at.get(o) for o in root.operands)
    relation = direction.group(1)
    k, limit = _element(a, at), _constant(b, at)
    if k is None:  # constant first: compare(N, i), direction=GT is i < N
        k, limit, relation = _element(b, at), _constant(a, at), _FLIP[relation]
    if k is None or limit is None:
        return None
    at_body = {i.name: i for i in body}
    out = next((i for i in body if i.line.lstrip().startswith("ROOT")), body[-1])
    step_instr = _through(at_body.get(out.operands[k]), at_body) if out.opcode == "tuple" and k < len(
        out.operands) else None
    if step_instr is None or step_instr.opcode not in ("add", "subtract") or len(step_instr.operands) != 2:
        return None
    x, y = (at_body.get(o) for o in step_instr.operands)
    if _element(x, at_body) == k and _constant(y, at_body) is not None:
        step = _constant(y, at_body)
    elif step_instr.opcode == "add" and _element(y, at_body) == k and _constant(x, at_body) is not None:
        step = _constant(x, at_body)
    else:
        return None
    step = -step if step_instr.opcode == "subtract" else step
    at_caller = {i.name: i for i in caller}
    start_tuple = at_caller.get(loop.operands[0])
    start = (_constant(at_caller.get(start_tuple.operands[k]), at_caller)
             if start_tuple is not None and start_tuple.opcode == "tuple" and k < len(start_tuple.operands) else None)
    if start is None or step == 0:
        return None
    gap = {"LT": limit - start, "LE": limit - start + (1 if step > 0 else 0), "GT": start - limit,
           "GE": start - limit + (1 if step < 0 else 0), "NE": limit - start}.get(relation)
    if gap is None:
        return None
    if relation == "NE":
        return gap // step if gap % step == 0 and gap // step >= 0 else None
    size = abs(step)
    if (relation in ("LT", "LE") and step < 0) or (relation in ("GT", "GE") and step > 0):
        return None if gap > 0 else 0  # counts away from its limit: never ends, or never starts
    return max(0, -(-gap // size))


_KIND = {**{k: k for k in COLLECTIVES}, **{f"{k}-start": k for k in COLLECTIVES}}


def _fused_reduce_scatter(body: list[_Instr]) -> tuple[_Instr, str] | None:
    """(all-reduce, result type) when a fused computation is an all-reduce whose every result is sliced.

    The TPU compiler writes the partitioner's reduce-scatter as a fusion calling ``%all-reduce-scatter``: an
    all-reduce and a ``dynamic-slice`` of its result (of each element, for a combined all-reduce of a tuple).
    The result type is the slices'. An element used whole makes it an all-reduce fused with other work (None).
    """
    reduces = [i for i in body if i.opcode in ("all-reduce", "all-reduce-start")]
    if len(reduces) != 1:
        return None
    reduce = reduces[0]
    arity = len(_tuple_elements(_strip_type(reduce.type))) if reduce.opcode == "all-reduce" else 1
    source = {reduce.name: 0}  # instruction -> which element of the all-reduce's result it carries
    pieces: dict[int, _Instr] = {}
    for instr in body:  # text order is a topological order
        if not instr.operands or instr.operands[0] not in source:
            continue
        element = source[instr.operands[0]]
        if instr.opcode == "dynamic-slice":
            pieces.setdefault(element, instr)
        elif instr.opcode == "get-tuple-element" and arity > 1:
            m = re.search(r"\bindex=(\d+)", instr.attrs)
            if m:
                source[instr.name] = int(m.group(1))
        elif instr.opcode in ("all-reduce-done", "bitcast", "copy", "reshape"):
            source[instr.name] = element
    if len(pieces) != arity:  # an element used whole: not a reduce-scatter
        return None
    if arity == 1:
        return reduce, pieces[0].type
    return reduce, "(" + ", ".join(_strip_type(pieces[i].type) for i in range(arity)) + ")"


@dataclass(frozen=True)
class _Event:
    """What one scheduled instruction does: ``kind`` a collective's kind (None if it is no collective, or is
    an asynchronous one's done); ``op`` the instruction carrying its groups; ``result`` its result type;
    ``asynchronous``/``done``: a start, and the name of the done that ends it; ``matmul``: the dot or
    convolution a non-collective instruction runs (itself or inside its fusion)."""

    kind: str | None = None
    op: _Instr | None = None
    result: str = ""
    asynchronous: bool = False
    done: str | None = None
    matmul: _Instr | None = None


def _calls(i: _Instr, comps: dict[str, list[_Instr]]) -> list[_Instr]:
    """What a fusion or an async wrapper runs."""
    return [x for _, c in i.called for x in comps.get(c, [])] if i.opcode in ("fusion", "async-start") else []


def _is_done(i: _Instr, comps: dict[str, list[_Instr]]) -> bool:
    return (i.opcode.endswith("-done") and i.opcode[:-5] in (*COLLECTIVES, "async")) or any(
        "AsyncCollectiveDone" in x.attrs for x in _calls(i, comps))


def _event(i: _Instr, body: list[_Instr], at: int, comps: dict[str, list[_Instr]]) -> _Event:
    """Classify ``body[at]`` as :func:`collectives` reads it: a collective (an asynchronous one's start, with the
    done that ends it), a matmul, or neither."""
    inner = _calls(i, comps)
    found = [x for x in inner if x.opcode in _KIND]
    start = (i.opcode in _KIND and i.opcode.endswith("-start")) or (bool(found) and (
        i.opcode == "async-start" or any("AsyncCollectiveStart" in x.attrs for x in inner)))
    mm = next((x for x in [i, *inner] if x.opcode in ("dot", "convolution")), None)
    if mm is not None and not start:
        return _Event(matmul=mm)
    if not (start or found or i.opcode in _KIND) or _is_done(i, comps):
        return _Event()
    fused = _fused_reduce_scatter(inner) if found and not start else None
    op = fused[0] if fused else found[0] if found else i
    parts = _tuple_elements(_strip_type(i.type))
    result = fused[1] if fused else parts[1] if i.opcode.endswith("-start") and len(parts) > 1 else op.type
    done = None
    chain = {i.name}  # its done: the first later instruction that consumes it and is a done
    for later in body[at + 1:] if start else []:
        if chain & set(later.operands):
            if _is_done(later, comps):
                done = later.name
                break
            chain.add(later.name)
    return _Event("reduce-scatter" if fused else _KIND[op.opcode], op, result, start, done)


def _axes(op: _Instr | None, sizes: dict[str, int], n: int) -> tuple[str, ...]:
    """The mesh axes (``sizes``: name -> size, in mesh order) a collective's groups span."""
    if op is None:
        return ()
    spread = {k for g in _groups(op.line, n) for k, c in zip(sizes, np.unravel_index(g, [*sizes.values()]),
                                                                strict=True) if len(set(c)) > 1}
    return tuple(k for k in sizes if k in spread)


def collectives(compiled: Any) -> Collectives:
    """Find the collectives the compiler inserted, with per-device sizes.

    ``compiled`` is ``jax.jit(f).lower(*args).compile()`` for any backend (a TPU topology ahead of time too), or
    its ``as_text()``. In program order from the entry computation, each collective instruction is listed once,
    loop bodies (``trips``: the counts and byte totals count every trip), branches, fusions and async wrappers
    included; an async pair or TPU chain (one ``channel_id``) once; a fusion of an all-reduce whose every result
    is dynamic-sliced (the TPU's reduce-scatter) as one reduce-scatter; a combined op as one op listing each
    array in ``shapes``. Not counted: ``ragged-all-to-all``, ``collective-broadcast``, ``send``/``recv``.
    """
    text = _hlo_text(compiled)
    total = _partitions(text)
    comps, roots = _parse_module(text)
    ops: list[CollectiveOp] = []
    seen_channels: set[tuple[str, str]] = set()
    visited: set[str] = set()

    def add(kind: str, instr: _Instr, type_text: str, form: str, loop: tuple[str, int | None] | None,
            group_line: str) -> None:
        arrays = _arrays(type_text)
        ops.append(CollectiveOp(
            kind=kind, name=instr.name, result_type=_short_type(type_text),
            result_bytes=sum(math.prod(shape) * _BITS[dtype] // 8 for dtype, shape in arrays),
            group_size=_group_size(group_line, total), shapes=tuple(shape for _, shape in arrays), form=form,
            in_loop=loop is not None, trips=loop[1] if loop else 1, loop=loop[0] if loop else "",
        ))

    def visit(comp: str, loop: tuple[str, int | None] | None, context: str) -> None:
        """``context``: 'op' for sequential code, 'fused' inside a fusion, 'async' inside an async wrapper;
        ``loop``: the innermost loop's name and the runs per call of its body (None outside loops)."""
        if comp in visited or comp not in comps:
            return
        visited.add(comp)
        body = comps[comp]
        done_types = {i.operands[0]: i.type for i in body if i.opcode.endswith("-done") and i.operands}
        async_chain = any('custom_call_target="AsyncCollective' in i.attrs for i in body)
        for instr in body:
            kind = _KIND.get(instr.opcode)
            if kind is not None:
                key = (kind, instr.channel) if instr.channel else None
                if context != "op" and key is not None and key in seen_channels:
                    continue  # a later step of an async chain already counted
                if key is not None:
                    seen_channels.add(key)
                if instr.opcode.endswith("-start"):
                    elements = _tuple_elements(instr.type)
                    result = done_types.get(instr.name, elements[1] if len(elements) > 1 else instr.type)
                    add(kind, instr, result, "async", loop, instr.line)
                else:
                    form = "async" if context == "async" or async_chain else context
                    add(kind, instr, instr.type, form, loop, instr.line)
            for key_, callee in instr.called:
                if instr.opcode == "fusion" and callee in comps and callee not in visited:
                    pair = _fused_reduce_scatter(comps[callee])
                    if pair is not None:
                        reduce, result = pair
                        channel = ("reduce-scatter", reduce.channel) if reduce.channel else None
                        visited.add(callee)
                        if channel is None or channel not in seen_channels:
                            if channel is not None:
                                seen_channels.add(channel)
                            add("reduce-scatter", instr, result, "fused", loop, reduce.line)
                        continue
                if key_ == "to_apply" and instr.opcode != "call":
                    continue  # a reduction's scalar computation
                inner = context
                if instr.opcode == "fusion":
                    inner = "fused" if context == "op" else context
                elif instr.opcode.startswith("async-"):
                    inner = "async"
                inner_loop = loop
                if instr.opcode == "while" and key_ in ("body", "condition"):
                    trips = _trip_count(instr, comps, body)
                    outer = 1 if loop is None else loop[1]
                    inner_loop = (instr.name, None if trips is None or outer is None else trips * outer)
                visit(callee, inner_loop, inner)

    for root in roots:
        visit(root, None, "op")
    return Collectives(tuple(ops))


def compile_with_log(lowered: Any) -> tuple[Any, str]:
    """Compile ``lowered`` and return ``(compiled, log)``: what XLA printed meanwhile.

    XLA's C++ warnings ("Involuntary full rematerialization", when a reshard goes through a full
    replica) go straight to file descriptors 1 and 2, past ``warnings`` and ``sys.stderr``; this
    catches them (:func:`utils.capture.quiet`) so a notebook can assert them. A cached compile prints nothing.
    """
    import jax

    if not isinstance(lowered, jax.stages.Lowered):
        raise TypeError(f"compile_with_log takes a Lowered program, e.g. jax.jit(f).lower(*args); "
                        f"got {type(lowered).__name__}")
    with quiet() as out:
        compiled = lowered.compile()
    return compiled, out.text


@dataclass(frozen=True)
class Memory(_Printed):
    """Buffer sizes of one device's compiled program, in bytes, from ``compiled.memory_analysis()``.

    ``argument``/``output``: its shards of the inputs and outputs; ``temp``: temporaries as the compiler
    reports them; ``alias``: output bytes reusing a donated input (counted in both); ``peak``: the
    compiler's most-live figure; ``allocated``: bytes allocated in device memory (``total_allocation_bytes``,
    jax 0.12+); ``platform``: ``'cpu'``, ``'tpu'``, ``'gpu'`` or ``''``.

    ``footprint`` is the memory the program needs on each device: on CPU and GPU ``total``, an upper bound;
    on TPU ``allocated``, the HBM, equal to the byte to the compiler's memory-usage report (space
    ``default``) on every program checked (v5e:2x4, libtpu 0.0.50.1). jax 0.10 lacks it, so there it is
    ``total``, an estimate, because ``temp`` is not the HBM the temporaries take: it ran 0.2% to 41% high
    against the report (notebook 13's ZeRO steps 0.2-32%, notebook 21's 8B step 41%). TPU arrays count in
    their tiled layout (f32 ``[100,100]`` is stored ``[104,128]``). ``peak`` counts on-chip VMEM too, so it
    is not HBM; :func:`memory_spaces` reads the two apart. TPU figures depend on the compiler's effort: at
    O0 nothing is placed in VMEM, so HBM is higher (2.78x for notebook 13's ZeRO-3 step).
    """

    argument: int
    output: int
    temp: int
    alias: int
    peak: int | None = None
    generated_code: int = 0
    platform: str = ""
    allocated: int | None = None

    @property
    def total(self) -> int:
        """Arguments + outputs + temporaries, less buffers shared by donation."""
        return self.argument + self.output + self.temp - self.alias

    @property
    def footprint(self) -> int:
        """Memory per device: on TPU the HBM the compiler allocated where known, else ``total`` (see the class)."""
        if self.platform == "tpu" and self.allocated is not None:
            return self.allocated
        return self.total

    def __str__(self) -> str:
        parts = [f"arguments {format_bytes(self.argument)}", f"outputs {format_bytes(self.output)}",
                 f"temporaries {format_bytes(self.temp)}"]
        if self.alias:
            parts.append(f"aliased {format_bytes(self.alias)}")
        if self.platform == "tpu":
            hbm = format_bytes(self.footprint)
            parts.append(f"HBM {hbm}" if self.allocated is not None else f"HBM about {hbm} (their sum, an estimate)")
            if self.peak is not None:
                parts.append(f"peak {format_bytes(self.peak)} counting on-chip VMEM too (not HBM)")
        where = "per device" if self.platform in ("", "cpu") else f"per {self.platform.upper()} device"
        return f"{where}: " + ", ".join(parts)


def _platform(compiled: Any) -> str:
    """The platform the program was compiled for, from its input or output shardings ('' if none say)."""
    import jax

    for shardings in ("input_shardings", "output_shardings"):
        with contextlib.suppress(Exception):  # a program without shardings says nothing
            for sharding in jax.tree_util.tree_leaves(getattr(compiled, shardings)):
                for device in getattr(sharding, "device_set", ()):
                    return str(device.platform)
    return ""


def memory_per_device(compiled: Any) -> Memory:
    """Per-device argument, output, temporary and peak bytes of a compiled program (one TPU chip's, on TPU).

    The compiled program *is* the per-device program; :class:`Memory` says what each field means where.
    """
    if isinstance(compiled, str) or not hasattr(compiled, "memory_analysis"):
        _hlo_text(compiled)  # raises the helpful TypeError
        raise TypeError("memory_per_device needs the compiled program, not its text")
    stats = compiled.memory_analysis()
    if stats is None:
        raise RuntimeError("this backend reports no memory analysis for the compiled program")
    allocated = getattr(stats, "total_allocation_bytes", None)
    return Memory(
        argument=int(stats.argument_size_in_bytes),
        output=int(stats.output_size_in_bytes),
        temp=int(stats.temp_size_in_bytes),
        alias=int(stats.alias_size_in_bytes),
        peak=int(getattr(stats, "peak_memory_in_bytes", 0) or 0) or None,
        generated_code=int(getattr(stats, "generated_code_size_in_bytes", 0) or 0),
        platform=_platform(compiled),
        allocated=int(allocated) if allocated else None,
    )


_SPACE = re.compile(r"^Memory Space: (\w+) \(color=\d+\)\s*\nTotal bytes: (\d+)", re.MULTILINE)


def memory_spaces(lowered: Any) -> dict[str, int]:
    """Bytes per device in each memory space, from the compiler's own memory-usage report.

    Compiles ``lowered`` once more with ``compiler_options={"xla_dump_to": <temporary folder>}`` and
    reads ``*memory-usage-report.txt``: ``'default'`` is device memory (HBM on a TPU) on every backend;
    a TPU program adds ``'vmem'`` (on-chip) and ``'smem'`` (scalars). One more compilation: use it where
    the figure is the lesson.
    """
    import jax

    if not isinstance(lowered, jax.stages.Lowered):
        raise TypeError(
            "memory_spaces takes a Lowered program, e.g. jax.jit(f).lower(*args), since it compiles it again "
            f"with the memory report switched on; got {type(lowered).__name__}"
        )
    with tempfile.TemporaryDirectory(prefix="memory-report-") as folder:
        lowered.compile(compiler_options={"xla_dump_to": folder})
        reports = sorted(Path(folder).glob("*memory-usage-report.txt"))
        if not reports:
            raise RuntimeError("this backend wrote no memory-usage report; its memory spaces cannot be read")
        text = reports[-1].read_text()
    spaces = {name: int(total) for name, total in _SPACE.findall(text)}
    if "default" not in spaces:
        raise RuntimeError(f"the memory-usage report names no default space: {text[:200]!r}")
    return spaces


@dataclass(frozen=True)
class ShardRow:
    """One device's piece of an array."""

    device: int
    index: str
    replica: int
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class ShardTable(_Printed):
    """Every device's shard of one array: what ``x.addressable_shards`` says, as a table."""

    rows: tuple[ShardRow, ...]
    global_shape: tuple[int, ...]
    itemsize: int

    @property
    def bytes_per_device(self) -> dict[int, int]:
        return {r.device: r.nbytes for r in self.rows}

    @property
    def total_bytes(self) -> int:
        """Bytes summed over all devices: replicas count once per device."""
        return sum(r.nbytes for r in self.rows)

    @property
    def array_bytes(self) -> int:
        return math.prod(self.global_shape) * self.itemsize

    @property
    def shard_shapes(self) -> set[tuple[int, ...]]:
        return {r.shape for r in self.rows}

    def __str__(self) -> str:
        lines = [f"{'device':>6}  {'index':<24}{'replica':>7}  {'shape':<14}{'bytes':>10}"]
        lines += [f"{r.device:>6}  {r.index:<24}{r.replica:>7}  {r.shape!s:<14}{format_bytes(r.nbytes):>10}"
                  for r in self.rows]
        lines.append(f"total over devices {format_bytes(self.total_bytes)} for a {format_bytes(self.array_bytes)} "
                     f"array ({self.total_bytes / max(self.array_bytes, 1):.2g}x)")
        return "\n".join(lines)


def shard_table(x: Any, sharding: Any = None, *, mesh: Any = None) -> ShardTable:
    """One row per device: which slice of ``x`` it holds, replica id, shape, bytes.

    For a ``jax.Array`` the rows are ``x.addressable_shards`` (what the runtime holds); for a shape plus
    ``sharding`` they are computed, so a layout can be priced before it exists (replicas in mesh order, as JAX).
    """
    import jax

    shape, dtype, sharding = as_layout(x, sharding, mesh)
    itemsize = np.dtype(dtype).itemsize
    rows = []
    if isinstance(x, jax.Array):
        for s in sorted(x.addressable_shards, key=lambda s: s.device.id):
            index = ", ".join("{}:{}".format(*sl.indices(n)[:2]) for sl, n in zip(s.index, shape, strict=True))
            rows.append(ShardRow(s.device.id, f"[{index}]", s.replica_id, tuple(s.data.shape), int(s.data.nbytes)))
    else:
        for t in tiles(shape, sharding):
            for replica, dev in enumerate(t.devices):
                rows.append(ShardRow(dev, t.index_string(), replica, t.shape, math.prod(t.shape) * itemsize))
        rows.sort(key=lambda r: r.device)
    return ShardTable(tuple(rows), shape, itemsize)


@dataclass(frozen=True)
class ScheduleStep:
    """One matmul or collective in scheduled order (:func:`schedule`). ``kind``: ``'matmul'`` or one of
    :data:`COLLECTIVES`; ``name``: its instruction (an asynchronous one's start); ``result_type`` as in
    :class:`CollectiveOp`; ``axes``: the mesh axes a collective's groups span; ``overlaps``: the matmuls run
    between an asynchronous collective's start and done; ``in_loop``: from a loop body, listed once;
    ``trips``: how many times it runs per call (its loops' trip counts multiplied; None if one is unreadable)."""

    kind: str
    name: str
    result_type: str
    axes: tuple[str, ...] = ()
    asynchronous: bool = False
    overlaps: int = 0
    in_loop: bool = False
    trips: int | None = 1


def schedule(compiled: Any, mesh: Any) -> list[ScheduleStep]:
    """The entry computation's matmuls and collectives, in the order the compiler scheduled them (the order
    a CPU, GPU or TPU program compiled ahead of time runs them), to see what waits for what.

    Matmuls: ``dot``, ``convolution`` or a fusion of one. Collectives as :func:`collectives` reads them; an asynchronous
    one (``-start``/``-done``, ``async-start``, a TPU ``AsyncCollectiveStart`` fusion) once, at its start. A loop
    body's steps stand where the loop runs, once each, with their ``trips``. ``mesh`` (a ``Mesh`` or a dict of axis
    sizes) names each collective's axes: partition ids are positions in its flattened device order.
    """
    text = _hlo_text(compiled)
    try:
        sizes = {str(k): int(v) for k, v in dict(getattr(mesh, "shape", mesh)).items()}
    except (TypeError, ValueError):
        raise TypeError(f"schedule needs the mesh the program was compiled for (a jax.sharding.Mesh, or a dict "
                        f"such as {{'data': 4, 'model': 2}}); got {type(mesh).__name__}") from None
    n = _partitions(text) or 1
    if math.prod(sizes.values()) != n:
        raise ValueError(f"the program runs on {n} devices (num_partitions), the mesh {sizes} on "
                         f"{math.prod(sizes.values())}: pass the mesh the program was compiled with")
    comps, roots = _parse_module(text)
    steps: list[ScheduleStep] = []

    def walk(body: list[_Instr], loop: tuple[str, int | None] | None) -> None:
        pending: dict[str, int] = {}  # the done that ends an asynchronous collective -> its step
        trips, in_loop = (loop[1] if loop else 1), loop is not None
        for at, i in enumerate(body):
            event = _event(i, body, at, comps)
            if i.name in pending:  # its done: the matmuls since its start ran while it transferred
                k = pending.pop(i.name)
                steps[k] = replace(steps[k], result_type=_short_type(i.type), overlaps=sum(s.kind == "matmul"
                                                                                            for s in steps[k + 1:]))
            elif i.opcode == "while":
                inner = _trip_count(i, comps, body)
                walk(comps.get(dict(i.called).get("body", ""), []),
                     (i.name, None if inner is None or trips is None else inner * trips))
            elif event.matmul is not None:
                steps.append(ScheduleStep("matmul", i.name, _short_type(event.matmul.type), in_loop=in_loop,
                                          trips=trips))
            elif event.kind is not None:
                if event.done:
                    pending[event.done] = len(steps)
                steps.append(ScheduleStep(event.kind, i.name, _short_type(event.result), _axes(event.op, sizes, n),
                                          event.asynchronous, 0, in_loop, trips))

    walk(comps.get(roots[0], []) if roots else [], None)
    return steps
