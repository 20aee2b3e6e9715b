"""What the compiler did: collectives in the HLO, per-device memory, shard tables.

These read the *compiled* program (``jax.jit(f).lower(*args).compile()``),
which is the partitioned, per-device program: the only place where the
collectives that GSPMD/Shardy inserted can be seen and counted.

On the CPU backend a reduce-scatter never appears: the partitioner emits an
all-reduce followed by a dynamic-slice, and only the GPU and TPU compilers fuse
that pair into a reduce-scatter. Count what the CPU program contains, and say so.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    "shard_table",
]

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16, "bf16": 16,
         "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128,
         "f8e4m3fn": 8, "f8e5m2": 8}
_OP = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+"
    r"(?P<kind>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\("
)
_ARRAY = re.compile(r"(?P<dtype>[a-z]+[0-9]*[a-z0-9]*)\[(?P<dims>[0-9,]*)\]")


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

    ``result_bytes`` is the size of what the op produces on each device;
    ``group_size`` the number of devices that talk in each group;
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
    """The shape of each array the op produces (a fused op produces several)."""

    @property
    def estimated_bytes(self) -> float:
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
    """Every collective found in a compiled program, in program order."""

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
        return {op.kind for op in self.ops}

    @property
    def result_bytes(self) -> int:
        return sum(op.result_bytes for op in self.ops)

    @property
    def estimated_bytes(self) -> float:
        return sum(op.estimated_bytes for op in self.ops)

    def __str__(self) -> str:
        if not self.ops:
            return "no collectives: each device computes without talking to the others"
        lines = [f"{'collective':<19}{'result (per device)':<28}{'group':>6}{'ring estimate':>14}"]
        for op in self.ops:
            shown = op.result_type
            if len(shown) > 27:  # a fused tuple of many arrays: say how many, and their size
                shown = f"{shown.count('[')} arrays, {format_bytes(op.result_bytes)}"
            lines.append(f"{op.kind:<19}{shown:<28}{op.group_size:>6}{format_bytes(op.estimated_bytes):>14}")
        lines.append(f"{'total (estimated: ring formula, not measured)':<53}{format_bytes(self.estimated_bytes):>14}")
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


def _short_type(type_text: str) -> str:
    """'f32[4,8]{1,0}' -> 'f32[4,8]'; a tuple of equal arrays -> '4 x f32[4,8]'."""
    text = re.sub(r"/\*.*?\*/", "", re.sub(r"\{[0-9,]*\}", "", type_text)).strip()  # drop layouts, comments
    if text.startswith("("):
        parts = [p.strip() for p in text.strip("()").split(", ") if p.strip()]
        if parts and len(set(parts)) == 1:
            return f"{len(parts)} x {parts[0]}"
        return " + ".join(parts)
    return text


def _type_shapes(type_text: str) -> tuple[tuple[int, ...], ...]:
    return tuple(
        tuple(int(d) for d in m.group("dims").split(",") if d)
        for m in _ARRAY.finditer(re.sub(r"/\*.*?\*/", "", type_text))
        if m.group("dtype") in _BITS
    )


def _type_bytes(type_text: str) -> int:
    total = 0
    for m in _ARRAY.finditer(type_text):
        dtype = m.group("dtype")
        if dtype not in _BITS:
            continue
        dims = [int(d) for d in m.group("dims").split(",") if d]
        total += math.prod(dims) * _BITS[dtype] // 8
    return total


def _group_size(line: str, total_devices: int | None) -> int:
    """Devices per group, from any of the replica_groups spellings XLA prints."""
    # Shardy mesh form: replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}
    m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", line)
    if m:
        sizes = dict((k, int(v)) for k, v in re.findall(r"'([^']+)'=(\d+)", m.group(1)))
        names = re.findall(r"'([^']+)'", m.group(2))
        return math.prod(sizes[n] for n in names) if names else 1
    # iota form: replica_groups=[4,2]<=[8]  (4 groups of 2)
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
        sizes: dict[int, int] = {}
        for v in list(group):
            sizes[root(v)] = sizes.get(root(v), 0) + 1
        return max(max(sizes.values(), default=2), 2)
    return total_devices or 1


def collectives(compiled: Any) -> Collectives:
    """Find the collectives the compiler inserted, with per-device sizes.

    ``compiled`` is ``jax.jit(f).lower(*args).compile()`` (or its
    ``as_text()``). Ops inside fused or called computations count too; the
    ``-done`` halves of async pairs are not counted twice.
    """
    text = _hlo_text(compiled)
    m = re.search(r"num_partitions=(\d+)", text)
    total = int(m.group(1)) if m else None
    ops = []
    for line in text.splitlines():
        hit = _OP.match(line)
        if not hit:
            continue
        ops.append(
            CollectiveOp(
                kind=hit.group("kind"),
                name=hit.group("name"),
                result_type=_short_type(hit.group("type")),
                result_bytes=_type_bytes(hit.group("type")),
                group_size=_group_size(line, total),
                shapes=_type_shapes(hit.group("type")),
            )
        )
    return Collectives(tuple(ops))


def compile_with_log(lowered: Any) -> tuple[Any, str]:
    """Compile ``lowered`` and return ``(compiled, log)``: what XLA printed meanwhile.

    XLA's C++ warnings (such as "Involuntary full rematerialization", printed
    when a reshard goes through a full replica) bypass Python's ``warnings``
    and ``sys.stderr``; they go straight to file descriptor 2. This captures
    that descriptor during compilation so a notebook can show and assert them.
    Each fresh compilation prints again; a cached one prints nothing.
    """
    import jax

    if not isinstance(lowered, jax.stages.Lowered):
        raise TypeError(
            f"compile_with_log takes a Lowered program, e.g. jax.jit(f).lower(*args); got {type(lowered).__name__}"
        )
    with tempfile.TemporaryFile(mode="w+b") as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            compiled = lowered.compile()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        return compiled, log.read().decode(errors="replace")


@dataclass(frozen=True)
class Memory:
    """Per-device buffer sizes from ``compiled.memory_analysis()``, in bytes."""

    argument: int
    output: int
    temp: int
    alias: int
    peak: int | None = None
    raw: Any = field(default=None, repr=False, compare=False)

    @property
    def total(self) -> int:
        """Arguments + outputs + temporaries, less buffers shared by donation."""
        return self.argument + self.output + self.temp - self.alias

    def __str__(self) -> str:
        parts = [f"arguments {format_bytes(self.argument)}", f"outputs {format_bytes(self.output)}",
                 f"temporaries {format_bytes(self.temp)}"]
        if self.alias:
            parts.append(f"aliased {format_bytes(self.alias)}")
        return "per device: " + ", ".join(parts)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def memory_per_device(compiled: Any) -> Memory:
    """Per-device argument, output and temporary bytes of a compiled program.

    On the CPU backend these are the sizes for one device's shard of the
    program (the compiled program *is* the per-device program).
    """
    if isinstance(compiled, str) or not hasattr(compiled, "memory_analysis"):
        _hlo_text(compiled)  # raises the helpful TypeError
        raise TypeError("memory_per_device needs the compiled program, not its text")
    stats = compiled.memory_analysis()
    if stats is None:
        raise RuntimeError("this backend reports no memory analysis for the compiled program")
    return Memory(
        argument=int(stats.argument_size_in_bytes),
        output=int(stats.output_size_in_bytes),
        temp=int(stats.temp_size_in_bytes),
        alias=int(stats.alias_size_in_bytes),
        peak=int(getattr(stats, "peak_memory_in_bytes", 0)) or None,
        raw=stats,
    )


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
