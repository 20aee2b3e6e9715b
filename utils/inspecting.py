"""What the compiler did: collectives in the HLO, per-device memory, shard tables.

These read the *compiled* program (``jax.jit(f).lower(*args).compile()``),
which is the partitioned, per-device program: the only place where the
collectives that GSPMD/Shardy inserted can be seen and counted. A program
compiled ahead of time for a TPU topology (``jax.experimental.topologies``,
no TPU needed) is read the same way.

The backend that compiled the program changes how a collective is written:

- A reduce-scatter that the *partitioner* inserts (the gradient of a weight
  sharded ``P('data', None)``, for example) appears in a CPU program as an
  ``all-reduce`` followed by a ``dynamic-slice``: the CPU compiler keeps the
  pair, and :func:`collectives` reports what is there, an all-reduce. The TPU
  compiler fuses the pair into one op, a ``fusion`` that calls a computation
  named ``%all-reduce-scatter``; :func:`collectives` counts it as one
  reduce-scatter. A reduce-scatter written by hand (``jax.lax.psum_scatter``
  in ``shard_map``) is a ``reduce-scatter`` op on CPU. On TPU it is one when
  each device's part fills whole 8-row tiles: scattering ``f32[32,512]`` or
  ``f32[64,512]`` over 4 devices (8 or 16 rows each) gives a reduce-scatter,
  but ``f32[16,512]`` or ``f32[40,512]`` (4 or 10 rows each) an ``all-reduce``
  of the whole array (and 6 rows each a padded reduce-scatter plus a
  collective-permute).
- The TPU compiler converts f32 matmul operands to bf16 before gathering them
  (the TPU's default matmul precision), so its all-gathers move half the
  bytes of the CPU's; ``result_bytes`` follows the type the program states.
- The TPU compiler runs some collectives asynchronously, split into a start,
  several steps that overlap with compute, and a done; each such chain is one
  collective here.
- The GPU compiler runs most collectives as ``-start``/``-done`` pairs, and
  often flattens a combined all-reduce into one 1-D buffer (``f32[8320]`` for
  an ``f32[8,16,64]`` and an ``f32[8,16,1]``): the kinds, groups and bytes it
  reports are exact, the per-array shapes are gone.
"""

from __future__ import annotations

import contextlib
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .capture import quiet
from .layout import as_layout, tiles

__all__ = [
    "COLLECTIVES",
    "CollectiveOp",
    "Collectives",
    "Memory",
    "ShardRow",
    "ShardTable",
    "collectives",
    "compile_with_log",
    "format_bytes",
    "memory_per_device",
    "memory_spaces",
    "shard_table",
]

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
FORMS = ("op", "async", "fused")

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
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""  # pragma: no cover


@dataclass(frozen=True)
class CollectiveOp:
    """One collective of the compiled per-device program.

    - ``kind``: one of :data:`COLLECTIVES`.
    - ``name``: the HLO instruction's name (for a TPU fused reduce-scatter, the
      fusion's name), to find it in ``compiled.as_text()``.
    - ``result_type``: the per-device type of what the op produces, without
      layouts (``{1,0:T(8,128)}``): ``'bf16[1024,1024]'``; a tuple of equal
      arrays is ``'4 x f32[8]'``.
    - ``result_bytes``: the size of that result on each device, from the type
      the program states (so a bf16 all-gather counts 2 bytes per element; TPU
      tile padding is not included). For an async pair, the bytes of the
      result only, not of the start op's (operand, result, ...) tuple.
    - ``group_size``: how many devices talk in each group (for
      collective-permute, the size of the largest ring of its
      source-target pairs).
    - ``shapes``: the shape of each array the op produces, as the program
      states it: several for a combined op, one 1-D shape for an op the
      compiler flattened (GPU), so compare kinds, groups and bytes across
      backends, not shapes.
    - ``form``: how the program writes it: ``'op'`` (one synchronous
      instruction), ``'async'`` (a ``-start``/``-done`` pair, an
      ``async-start`` wrapper, or the TPU's chain of async-collective fusions),
      ``'fused'`` (inside a fusion: the TPU's all-reduce + dynamic-slice fusion
      that is one reduce-scatter, or a collective fused with other work).
    - ``in_loop``: inside a ``while`` loop (a ``fori_loop`` or ``scan`` body): the
      program states it once, and it runs once per iteration.

    ``estimated_bytes`` is an *estimate*, not a measurement: what each device would send under the
    textbook ring algorithm, computed from the result size and group size the program states:
    all-gather (N-1)/N x result, reduce-scatter (N-1) x result,
    all-reduce 2(N-1)/N x result, all-to-all (N-1)/N x result,
    collective-permute 1 x result.
    """

    kind: str
    name: str
    result_type: str
    result_bytes: int
    group_size: int
    shapes: tuple[tuple[int, ...], ...] = ()
    form: str = "op"
    in_loop: bool = False

    @property
    def estimated_bytes(self) -> float:
        """Ring-formula estimate of the bytes each device sends (not measured); 0 for a group of one."""
        n, b = self.group_size, self.result_bytes
        if n <= 1:
            return 0.0
        return {
            "all-gather": (n - 1) / n * b,
            "reduce-scatter": (n - 1) * b,
            "all-reduce": 2 * (n - 1) / n * b,
            "all-to-all": (n - 1) / n * b,
            "collective-permute": float(b),
        }[self.kind]


@dataclass(frozen=True)
class Collectives:
    """Every collective found in a compiled program, in program order (see :func:`collectives`)."""

    ops: tuple[CollectiveOp, ...]

    @property
    def counts(self) -> dict[str, int]:
        """Count per kind, every kind present (0 where absent)."""
        return {k: sum(op.kind == k for op in self.ops) for k in COLLECTIVES}

    def count(self, kind: str | None = None) -> int:
        """How many collectives of ``kind`` (all kinds when None)."""
        if kind is None:
            return len(self.ops)
        if kind not in COLLECTIVES:
            raise ValueError(f"unknown collective {kind!r}; expected one of {COLLECTIVES}")
        return self.counts[kind]

    @property
    def kinds(self) -> set[str]:
        """The kinds present."""
        return {op.kind for op in self.ops}

    @property
    def result_bytes(self) -> int:
        """Sum of the ops' per-device result sizes (each op once, loop bodies once)."""
        return sum(op.result_bytes for op in self.ops)

    @property
    def estimated_bytes(self) -> float:
        """Sum of the ops' ring-formula estimates: an estimate, not a measurement."""
        return sum(op.estimated_bytes for op in self.ops)

    def __str__(self) -> str:
        if not self.ops:
            return "no collectives: each device computes without talking to the others"
        labels = [op.kind + (" (in loop)" if op.in_loop else "") for op in self.ops]
        width = max(19, max(len(label) for label in labels) + 1)
        lines = [f"{'collective':<{width}}{'result (per device)':<28}{'group':>6}{'ring estimate':>14}"]
        for label, op in zip(labels, self.ops, strict=True):
            shown = op.result_type
            if len(shown) > 27:  # a combined op of many arrays: say how many, and their size
                shown = f"{len(op.shapes)} arrays, {format_bytes(op.result_bytes)}"
            lines.append(f"{label:<{width}}{shown:<28}{op.group_size:>6}{format_bytes(op.estimated_bytes):>14}")
        total = "total (estimated: ring formula, not measured)"
        lines.append(f"{total:<{width + 34}}{format_bytes(self.estimated_bytes):>14}")
        if any(op.in_loop for op in self.ops):
            lines.append("(in loop): stated once in the loop body, runs once per iteration; counted once")
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def _hlo_text(compiled: Any) -> str:
    if isinstance(compiled, str):
        return compiled
    import jax

    if isinstance(compiled, jax.stages.Lowered):
        raise TypeError(
            "this is a Lowered program (before partitioning, so it has no collectives yet): "
            "call .compile() on it first, e.g. jax.jit(f).lower(x).compile()"
        )
    if isinstance(compiled, jax.stages.Wrapped) or (callable(compiled) and not hasattr(compiled, "as_text")):
        raise TypeError(
            "pass the compiled program, not the function: jax.jit(f).lower(*args).compile()"
        )
    if not hasattr(compiled, "as_text"):
        raise TypeError(
            f"expected a compiled program from jax.jit(f).lower(*args).compile(), or its HLO text; "
            f"got {type(compiled).__name__}"
        )
    return compiled.as_text()


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
    return [
        (m.group("dtype"), tuple(int(d) for d in m.group("dims").split(",") if d))
        for m in _ARRAY.finditer(_strip_type(type_text))
        if m.group("dtype") in _BITS
    ]


def _type_shapes(type_text: str) -> tuple[tuple[int, ...], ...]:
    return tuple(shape for _, shape in _arrays(type_text))


def _type_bytes(type_text: str) -> int:
    return sum(math.prod(shape) * _BITS[dtype] // 8 for dtype, shape in _arrays(type_text))


def _group_size(line: str, total_devices: int | None) -> int:
    """Devices per group, from any of the replica_groups spellings XLA prints."""
    # Shardy mesh form: replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, possibly with
    # ", device_ids=([4,2]T(1,0))" between the mesh and the axes that talk.
    m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", line)
    if m:
        sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", m.group(1))}
        names = re.findall(r"'([^']+)'", m.group(2))
        if all(n in sizes for n in names):
            return math.prod(sizes[n] for n in names) if names else 1
        return total_devices or 1
    # iota form: replica_groups=[4,2]<=[8], or transposed [2,4]<=[4,2]T(1,0): [groups, group size]
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
    if m:
        return int(m.group(2))
    # explicit form: replica_groups={{0,1},{2,3}}
    m = re.search(r"replica_groups=\{\{([^}]*)\}", line)
    if m:
        return len([v for v in m.group(1).split(",") if v.strip()])
    # collective-permute: source_target_pairs={{0,2},{2,4},...} -> the devices of one ring (a connected
    # group of the pair graph); several independent rings run side by side.
    m = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", line)
    if m:
        pairs = [(int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)\}", m.group(1))]
        group: dict[int, int] = {}

        def root(v: int) -> int:
            while group.setdefault(v, v) != v:
                v = group[v]
            return v

        for a, b in pairs:
            group[root(a)] = root(b)
        sizes_: dict[int, int] = {}
        for v in list(group):
            sizes_[root(v)] = sizes_.get(root(v), 0) + 1
        return max(max(sizes_.values(), default=2), 2)
    return total_devices or 1  # replica_groups={} : every device


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
        out = []
        for m in _CALLS.finditer(self.attrs):
            for target in re.findall(r"%?([\w.\-]+)", m.group("target")):
                out.append((m.group("key"), target))
        return out

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


_KIND = {**{k: k for k in COLLECTIVES}, **{f"{k}-start": k for k in COLLECTIVES}}


def _fused_reduce_scatter(body: list[_Instr]) -> tuple[_Instr, str] | None:
    """(all-reduce, result type) when a fused computation is an all-reduce whose every result is sliced.

    The TPU compiler writes the partitioner's reduce-scatter as a fusion calling ``%all-reduce-scatter``:
    an all-reduce followed by a ``dynamic-slice`` of its result, or, where it combined several gradients
    into one all-reduce of a tuple, a ``get-tuple-element`` and a ``dynamic-slice`` of each element. The
    result type is the slice's (``'f32[64,2048]'``) or the tuple of the slices' types; an element used
    whole makes it an all-reduce fused with other work, not a reduce-scatter (None).
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


def collectives(compiled: Any) -> Collectives:
    """Find the collectives the compiler inserted, with per-device sizes.

    ``compiled`` is ``jax.jit(f).lower(*args).compile()`` for any backend (CPU,
    GPU, or a TPU topology compiled ahead of time), or its ``as_text()``.

    What is counted, walking the program from its entry computation in order:

    - each collective instruction once (all-reduce, all-gather,
      reduce-scatter, all-to-all, collective-permute), including those inside
      called computations: loop bodies (``in_loop``), conditional branches,
      fusions, ``async-start`` wrappers. A loop body's collective is counted
      once, not once per iteration;
    - an async pair (``all-gather-start``/``all-gather-done`` and the like)
      once, with the bytes of its result (the ``-done`` op's type);
    - the TPU's async chains (fusions that repeat one collective with the same
      ``channel_id`` in a start, several overlap steps and a done) once;
    - a fusion whose computation is an all-reduce followed by a
      dynamic-slice of it (how the TPU compiler writes a reduce-scatter) as
      one reduce-scatter, with the slice's type and the all-reduce's groups;
      the all-reduce inside it is not counted again. A combined all-reduce of
      several arrays whose every element is sliced is one reduce-scatter whose
      result is the tuple of the slices.

    A combined op (the compiler merged several collectives of the same kind
    and group into one) is one op whose ``result_type`` joins the arrays
    (``'f32[64,128] + f32[16,512]'``, or ``'4 x f32[8]'`` when equal), whose
    ``shapes`` lists each array and whose ``result_bytes`` is their sum; the
    table prints ``'N arrays, size'`` when the type is long. CPU and TPU keep
    each array's shape. The GPU compiler often flattens a combined all-reduce
    into one 1-D buffer (``all-reduce f32[8320]`` for an ``f32[8,16,64]`` and
    an ``f32[8,16,1]``): it is reported as the one array the program states,
    so the per-array shapes are lost while the bytes stay exact. On GPU,
    async ``-start``/``-done`` pairs are the usual form, counted once with the
    ``-done`` result.

    An unfused all-reduce + dynamic-slice (the CPU's spelling of the
    partitioner's reduce-scatter) is reported as the all-reduce it is. Each
    instruction of the program text counts once, even where its computation is
    called from two places; computations the entry never calls are skipped.
    Not counted: ``ragged-all-to-all``, ``collective-broadcast``,
    ``send``/``recv`` (none appears in the course's programs).
    """
    text = _hlo_text(compiled)
    m = re.search(r"num_partitions=(\d+)", text)
    total = int(m.group(1)) if m else None
    comps, roots = _parse_module(text)
    ops: list[CollectiveOp] = []
    seen_channels: set[tuple[str, str]] = set()
    visited: set[str] = set()

    def add(kind: str, instr: _Instr, type_text: str, form: str, in_loop: bool, group_line: str) -> None:
        ops.append(CollectiveOp(
            kind=kind, name=instr.name, result_type=_short_type(type_text), result_bytes=_type_bytes(type_text),
            group_size=_group_size(group_line, total), shapes=_type_shapes(type_text), form=form, in_loop=in_loop,
        ))

    def visit(comp: str, in_loop: bool, context: str) -> None:
        """``context``: 'op' for sequential code, 'fused' inside a fusion, 'async' inside an async wrapper."""
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
                    add(kind, instr, result, "async", in_loop, instr.line)
                else:
                    form = "async" if context == "async" or async_chain else context
                    add(kind, instr, instr.type, form, in_loop, instr.line)
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
                            add("reduce-scatter", instr, result, "fused", in_loop, reduce.line)
                        continue
                if key_ == "to_apply" and instr.opcode != "call":
                    continue  # a reduction's scalar computation
                inner = context
                if instr.opcode == "fusion":
                    inner = "fused" if context == "op" else context
                elif instr.opcode.startswith("async-"):
                    inner = "async"
                visit(callee, in_loop or (instr.opcode == "while" and key_ in ("body", "condition")), inner)

    for root in roots:
        visit(root, False, "op")
    return Collectives(tuple(ops))


def compile_with_log(lowered: Any) -> tuple[Any, str]:
    """Compile ``lowered`` and return ``(compiled, log)``: what XLA printed meanwhile.

    XLA's C++ warnings (such as "Involuntary full rematerialization", printed
    when a reshard goes through a full replica) bypass Python's ``warnings``
    and ``sys.stderr``; they go straight to file descriptors 1 and 2. This
    catches them during compilation (with :func:`utils.capture.quiet`) so a
    notebook can show and assert them. Each fresh compilation prints again; a
    cached one prints nothing.
    """
    import jax

    if not isinstance(lowered, jax.stages.Lowered):
        raise TypeError(
            f"compile_with_log takes a Lowered program, e.g. jax.jit(f).lower(*args); got {type(lowered).__name__}"
        )
    with quiet() as out:
        compiled = lowered.compile()
    return compiled, out.text


@dataclass(frozen=True)
class Memory:
    """Buffer sizes of one device's compiled program, in bytes, from ``compiled.memory_analysis()``.

    - ``argument``: the input buffers one device holds (its shard of every argument).
    - ``output``: the output buffers it holds.
    - ``temp``: the program's temporaries, as the compiler reports them (on
      TPU not the HBM it allocates for them; see below).
    - ``alias``: output bytes that reuse an input buffer (donation); counted in both of them.
    - ``peak``: the compiler's figure for the most memory live at once (None where not reported).
    - ``allocated``: the bytes the compiler allocated in the device's main
      memory (``total_allocation_bytes``; jax 0.12 and later, None before).
    - ``generated_code``: size of the compiled code (0 on CPU).
    - ``peak_unpadded``: ``peak`` without TPU tile padding (jax 0.12 and later; None before).
    - ``platform``: ``'cpu'``, ``'tpu'``, ``'gpu'`` (``''`` when unknown).
    - ``raw``: the ``CompiledMemoryStats`` itself, for fields not copied here.

    ``footprint`` is the memory the program needs on each device: on TPU its
    HBM. On CPU and GPU it is ``total`` (arguments + outputs + temporaries -
    aliased), an upper bound since not every temporary is live at once; on CPU
    ``peak`` is ``argument + output`` and leaves temporaries out.

    On TPU every array is counted in its tiled layout (f32/bf16 ``[100,100]``
    is stored as ``[104,128]``: 53,248 bytes in f32 rather than 40,000), and
    ``footprint`` is ``allocated`` where jax reports it, else ``total``. How
    that was checked: programs compiled for ``v5e:2x4`` with
    ``XLA_FLAGS=--xla_dump_to=DIR``, against the compiler's own
    ``DIR/*memory-usage-report.txt`` (space ``default`` is HBM, ``vmem`` the
    chip's 128 MiB of on-chip memory), on libtpu 0.0.50.1 (jax 0.12) and
    0.0.42.1 (jax 0.10):

    ============================  ===============  ===============  ======  =====
    per chip, MiB                 HBM (report)     ``total``        VMEM    peak
    libtpu                        0.0.50 / 0.0.42  0.0.50 / 0.0.42  (both)  (both)
    ============================  ===============  ===============  ======  =====
    ``sum((sin(a) @ a.T) @ a)``   64.00 / 64.00    64.00 / 64.00    96.00   160.0
    Adam step, MLP 2048x8192      109.08 / 99.03   109.91 / 98.19   112.00  220.2
    the same, donated             61.04 / 53.03    61.97 / 53.94    112.00  172.1
    Adam step, MLP 4096x16384     904.95 / 904.95  1129.5 / 1161.5  96.06   776.4
    the same, donated             712.84 / 712.84  937.5 / 937.5    96.25   584.2
    ============================  ===============  ===============  ======  =====

    (``a`` is a replicated ``f32[4096,4096]``; the steps split their weights
    and batch over 8 chips, batch 2048 and 4096 rows.) ``allocated`` equals
    the report's HBM to the byte in every program, so it is the footprint on
    jax 0.12. ``total`` is within 1 MiB of it for the small programs but
    224-257 MiB (25-32%) above it for the large step, because ``temp`` is not
    the HBM allocated for temporaries: 737 MiB (769 MiB on 0.0.42.1) against
    513 MiB allocated for the large step, 0 against 0.8 MiB for the 2048x8192
    step on 0.0.42.1. On jax 0.10, which lacks ``allocated``, ``footprint`` is
    that ``total``: an estimate.

    ``peak`` is not an HBM figure: it counts on-chip VMEM as well (160 MiB for
    64 MiB of HBM above), and it is not HBM + VMEM either (776 MiB for 905 MiB
    of HBM and 96 MiB of VMEM; 220.2 MiB for 99.03 + 112.00 on libtpu
    0.0.42.1). ``memory_analysis()`` has no VMEM figure: :func:`memory_spaces`
    reads it (and HBM exactly, on both jax lines) from the memory-usage report.
    """

    argument: int
    output: int
    temp: int
    alias: int
    peak: int | None = None
    generated_code: int = 0
    peak_unpadded: int | None = None
    platform: str = ""
    allocated: int | None = None
    raw: Any = field(default=None, repr=False, compare=False)

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

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


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
    """Per-device argument, output, temporary and peak bytes of a compiled program.

    The compiled program *is* the per-device program, so every number is for
    one device (one TPU chip). See :class:`Memory` for what each field means on
    CPU and on TPU (tile padding, which memory ``temp`` and ``peak`` count).
    """
    if isinstance(compiled, str) or not hasattr(compiled, "memory_analysis"):
        _hlo_text(compiled)  # raises the helpful TypeError
        raise TypeError("memory_per_device needs the compiled program, not its text")
    stats = compiled.memory_analysis()
    if stats is None:
        raise RuntimeError("this backend reports no memory analysis for the compiled program")
    unpadded = getattr(stats, "peak_unpadded_heap_bytes", None)
    allocated = getattr(stats, "total_allocation_bytes", None)
    return Memory(
        argument=int(stats.argument_size_in_bytes),
        output=int(stats.output_size_in_bytes),
        temp=int(stats.temp_size_in_bytes),
        alias=int(stats.alias_size_in_bytes),
        peak=int(getattr(stats, "peak_memory_in_bytes", 0) or 0) or None,
        generated_code=int(getattr(stats, "generated_code_size_in_bytes", 0) or 0),
        peak_unpadded=int(unpadded) if unpadded else None,
        platform=_platform(compiled),
        allocated=int(allocated) if allocated else None,
        raw=stats,
    )


_SPACE = re.compile(r"^Memory Space: (\w+) \(color=\d+\)\s*\nTotal bytes: (\d+)", re.MULTILINE)


def memory_spaces(lowered: Any) -> dict[str, int]:
    """Bytes per device in each memory space, from the compiler's own memory-usage report.

    Compiles ``lowered`` once more with the report switched on for that one
    compilation (``compiler_options={"xla_dump_to": <temporary folder>}``, the
    per-compile form of ``XLA_FLAGS=--xla_dump_to``), reads
    ``*memory-usage-report.txt`` and removes the folder. Keys are the
    report's space names: ``'default'`` is device memory (HBM on a TPU) on
    every backend; a TPU program adds ``'vmem'`` (on-chip memory, which
    ``memory_analysis()`` does not report apart) and ``'smem'`` (scalars).
    Costs one more compilation, so use it where the figure is the lesson.
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
class ShardTable:
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
        for r in self.rows:
            lines.append(
                f"{r.device:>6}  {r.index:<24}{r.replica:>7}  {r.shape!s:<14}{format_bytes(r.nbytes):>10}"
            )
        lines.append(
            f"total over devices {format_bytes(self.total_bytes)} for a "
            f"{format_bytes(self.array_bytes)} array ({self.total_bytes / max(self.array_bytes, 1):.2g}x)"
        )
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def shard_table(x: Any, sharding: Any = None, *, mesh: Any = None) -> ShardTable:
    """One row per device: which slice of ``x`` it holds, replica id, shape, bytes.

    For a real ``jax.Array`` the rows come from ``x.addressable_shards``
    (what the runtime holds). For a shape plus ``sharding`` they are computed
    (what the layout implies), so a layout can be priced before it exists.
    """
    import jax

    shape, dtype, sharding = as_layout(x, sharding, mesh)
    itemsize = np.dtype(dtype).itemsize
    rows = []
    if isinstance(x, jax.Array):
        for s in sorted(x.addressable_shards, key=lambda s: s.device.id):
            bounds = [
                (sl.start or 0, sl.stop if sl.stop is not None else n) for sl, n in zip(s.index, shape, strict=True)
            ]
            rows.append(ShardRow(
                device=s.device.id,
                index="[" + ", ".join(f"{a}:{b}" for a, b in bounds) + "]",
                replica=s.replica_id,
                shape=tuple(s.data.shape),
                nbytes=int(s.data.nbytes),
            ))
    else:
        for t in tiles(shape, sharding):
            for replica, dev in enumerate(t.devices):
                rows.append(ShardRow(dev, t.index_string(), replica, t.shape, math.prod(t.shape) * itemsize))
        rows.sort(key=lambda r: r.device)
    return ShardTable(tuple(rows), shape, itemsize)
