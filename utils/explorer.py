"""An interactive sharding explorer: pick a mesh, a shape and a PartitionSpec, see the layout.

Two layers, so the answers can be tested without a browser:

- :func:`layout_report` and :func:`matmul_report` are the pure core. They take
  what a learner types (text such as ``"4, 2"``, ``"data, model"``,
  ``"P('data', None)"``, or real tuples and ``PartitionSpec`` objects) and
  return a small report: the course's type string (``f32[128@data,512@model]``),
  the bytes each device holds, the picture, and for a matmul the collectives
  of the compiled program. They never raise for bad input: a report with
  ``error`` set explains in plain words what is wrong and what to change, and
  ``jax_error`` quotes what JAX itself raises for the same choice.
- :func:`explore` wraps them in ipywidgets controls whose output re-renders on
  every change. Without ipywidgets it says why and shows the default report.

Matmuls are compiled on ``jax.ShapeDtypeStruct`` operands, so any size can be
explored: nothing is allocated. Meshes use ``AxisType.Auto`` axes, so the
compiler propagates shardings and inserts collectives the classic way.

``error_kind`` is one of: ``"unparsable"`` (text that cannot be read), ``"mesh"``
(mesh shape and axis names that do not fit together), ``"too-few-devices"``,
``"unknown-axis"``, ``"axis-reused"``, ``"too-many-entries"``, ``"uneven"``
(a dimension not divisible by its number of blocks), ``"matmul-shapes"``
(including mismatched contracting dimensions) and ``"compile"`` (anything
else JAX refused, quoted).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import functools
import html
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .drawing import draw_sharding, draw_shardings
from .inspecting import Collectives, Memory, ShardTable, collectives, format_bytes, memory_per_device, shard_table
from .layout import Tile, check_spec, spec_entries, tiles, type_string

__all__ = [
    "DEFAULTS",
    "DTYPES",
    "ERROR_KINDS",
    "LayoutReport",
    "MatmulReport",
    "explore",
    "layout_report",
    "matmul_report",
    "parse_axis_names",
    "parse_shape",
    "parse_spec",
]

DTYPES = ("float32", "bfloat16", "float16", "int8")
"""The element types the explorer's dropdown offers (any NumPy/JAX dtype name works in the reports)."""

ERROR_KINDS = (
    "unparsable", "mesh", "too-few-devices", "unknown-axis", "axis-reused", "too-many-entries", "uneven",
    "matmul-shapes", "compile",
)


class _Problem(Exception):
    """An explained problem with the learner's input: becomes a report's ``error``."""

    def __init__(self, kind: str, message: str, jax_error: str | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.jax_error = kind, message, jax_error


# --------------------------------------------------------------------------- parsing


def _strip_brackets(text: str) -> str:
    text = text.strip()
    while len(text) >= 2 and text[0] + text[-1] in ("()", "[]"):
        text = text[1:-1].strip()
    return text


def parse_shape(value: Any, *, what: str = "array shape") -> tuple[int, ...]:
    """``"128, 512"``, ``"(128, 512)"``, ``"128x512"``, ``128`` or ``(128, 512)`` -> ``(128, 512)``.

    An empty text is a scalar, ``()``. Raises ValueError naming the fix.
    """
    example = "128, 512" if what == "array shape" else "4, 2"
    if isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not a size: write it like {example}")
    if isinstance(value, int | np.integer):
        value = (int(value),)
    if isinstance(value, str):
        body = _strip_brackets(value)
        body = re.sub(r"(?<=\d)\s*[x×*]\s*(?=\d)", ",", body)  # 128x512
        tokens = [t for t in re.split(r"[,\s]+", body) if t]
        try:
            value = tuple(int(t) for t in tokens)
        except ValueError:
            raise ValueError(
                f"{what} {value.strip()!r} is not a list of whole numbers: write it like {example}"
            ) from None
    if not isinstance(value, tuple | list) or not all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) for d in value
    ):
        raise ValueError(f"{what} {value!r} is not a list of whole numbers: write it like {example}")
    shape = tuple(int(d) for d in value)
    if any(d < 1 for d in shape):
        raise ValueError(f"{what} {shape} has a size below 1: every size must be a whole number >= 1")
    return shape


def parse_axis_names(value: Any) -> tuple[str, ...]:
    """``"data, model"``, ``"('data', 'model')"`` or ``('data', 'model')`` -> ``('data', 'model')``."""
    if isinstance(value, str):
        body = _strip_brackets(value)
        value = tuple(t.strip("'\"") for t in re.split(r"[,\s]+", body) if t) if body else ()
    if not isinstance(value, tuple | list) or not all(isinstance(n, str) for n in value):
        raise ValueError(f"mesh axis names {value!r} are not names: write them like data, model")
    bad = [n for n in value if not n.isidentifier()]
    if bad:
        raise ValueError(
            f"mesh axis name {bad[0]!r} is not a plain name: use letters, digits and _, such as data, model"
        )
    return tuple(value)


_P_NAMES = ("P", "PartitionSpec")


def _entry(node: ast.AST, text: str) -> str | tuple[str, ...] | None:
    """One PartitionSpec entry from its syntax tree: None, an axis name, or a tuple of names."""
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
        return node.value
    if isinstance(node, ast.Name):
        return node.id  # a bare name such as data: the axis 'data'
    if isinstance(node, ast.Tuple | ast.List):
        names = [_entry(e, text) for e in node.elts]
        if not names or not all(isinstance(n, str) for n in names):
            raise ValueError(
                f"in {text!r}, a tuple entry must list mesh axis names, such as ('data', 'model'): "
                "it shards one dimension over several axes"
            )
        return tuple(names)  # type: ignore[arg-type]
    shown = ast.unparse(node) if hasattr(ast, "unparse") else "?"
    raise ValueError(
        f"in {text!r}, {shown} is not a mesh axis name: each entry is a name such as 'data', "
        "a tuple of names such as ('data', 'model'), or None (sizes belong in the mesh shape)"
    )


def _entry_value(entry: Any, text: str) -> str | tuple[str, ...] | None:
    """One PartitionSpec entry given as a Python value rather than text."""
    if entry is None or (isinstance(entry, str) and entry):
        return entry
    if isinstance(entry, tuple | list) and entry and all(isinstance(a, str) and a for a in entry):
        return tuple(entry)
    raise ValueError(
        f"in {text}, {entry!r} is not a mesh axis name: each entry is a name such as 'data', "
        "a tuple of names such as ('data', 'model'), or None"
    )


def parse_spec(value: Any) -> PartitionSpec:
    """Read a PartitionSpec from what a learner types, without ``eval``.

    Accepts ``"P('data', None)"``, ``"PartitionSpec('data')"``, ``"'data', None"``,
    ``"data, model"`` (bare names are axis names), ``"('data','model'), None"``
    (a dimension over two axes, then a replicated one), ``""`` or ``"P()"``
    (fully replicated), a real ``PartitionSpec``, or a tuple of entries. The
    text is what goes between the parentheses of ``P(...)``. Raises ValueError
    naming the fix.
    """
    if isinstance(value, PartitionSpec):
        return value
    if value is None:
        return PartitionSpec()
    if isinstance(value, tuple | list):
        return PartitionSpec(*[_entry_value(e, repr(tuple(value))) for e in value])
    if not isinstance(value, str):
        raise ValueError(f"a PartitionSpec is written like P('data', None); got {type(value).__name__} {value!r}")
    text = value.strip()
    if not text:
        return PartitionSpec()
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ValueError(
            f"cannot read {text!r} as a PartitionSpec: write it like P('data', None) or data, model"
        ) from None
    if isinstance(tree, ast.Call):
        func = tree.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name not in _P_NAMES:
            raise ValueError(f"cannot read {text!r} as a PartitionSpec: write it like P('data', None)")
        if tree.keywords:
            raise ValueError(
                f"in {text!r}, keyword arguments are not supported here: list one entry per dimension, "
                "like P('data', None)"
            )
        nodes = list(tree.args)
    elif isinstance(tree, ast.Tuple | ast.List):
        nodes = list(tree.elts)
    else:
        nodes = [tree]
    return PartitionSpec(*[_entry(n, text) for n in nodes])


def _parse_dtype(dtype: Any) -> np.dtype:
    import jax.numpy as jnp  # noqa: F401  (registers bfloat16 and friends with NumPy)

    try:
        return np.dtype(dtype)
    except TypeError:
        raise _Problem("unparsable", f"{dtype!r} is not an element type: use one of {', '.join(DTYPES)}") from None


# --------------------------------------------------------------------------- building blocks


def _describe(err: BaseException) -> str:
    """'IndivisibleError: ...': an exception on one line, without the source location JAX appends."""
    text = " ".join(str(err).split("This error occurs at source")[0].split())
    if len(text) > 400:
        text = text[:397] + "..."
    return f"{type(err).__name__}: {text}"


def _jax_says(fn: Callable[[], Any]) -> str | None:
    """What JAX raises for ``fn()``, on one line, or None when it accepts it.

    Anything printed meanwhile is dropped: jax 0.12 prints a stray source line
    before raising IndivisibleError for an uneven jit result.
    """
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            fn()
    except Exception as err:
        return _describe(err)
    return None


def _suggest_mesh(ndim: int, n: int) -> tuple[int, ...]:
    """A mesh of ``ndim`` axes with exactly ``n`` devices, largest axis first: (8, 2) -> (4, 2)."""
    primes, k, rest = [], 2, n
    while rest > 1:
        while rest % k == 0:
            primes.append(k)
            rest //= k
        k += 1
    slots = [1] * max(ndim, 1)
    for p in sorted(primes, reverse=True):
        slots[slots.index(min(slots))] *= p
    return tuple(sorted(slots, reverse=True))


def _build_mesh(mesh_shape: Any, axis_names: Any, devices: Sequence[Any] | None) -> tuple[Any, list[str]]:
    """An Auto-axes mesh on the first prod(shape) devices, or a _Problem saying what to change."""
    import jax
    from jax.sharding import AxisType

    try:
        shape = parse_shape(mesh_shape, what="mesh shape")
        names = parse_axis_names(axis_names)
    except ValueError as err:
        raise _Problem("unparsable", str(err)) from None
    if not shape:
        raise _Problem("mesh", "the mesh shape is empty: give one size per mesh axis, such as 4, 2")
    if len(names) != len(shape):
        raise _Problem(
            "mesh",
            f"the mesh shape {shape} has {len(shape)} ax{'is' if len(shape) == 1 else 'es'} but {len(names)} "
            f"axis name{'' if len(names) == 1 else 's'} {names}: "
            f"give one name per size, such as {', '.join(('data', 'model', 'stage', 'expert')[: len(shape)])}",
        )
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise _Problem(
            "mesh",
            f"the mesh axis name {twice!r} is used twice in {names}: every mesh axis needs its own name "
            "(JAX does not catch this: jax.make_mesh builds a mesh with fewer axes than you asked for)",
        )
    available = list(devices) if devices is not None else jax.devices()
    need = math.prod(shape)
    if need > len(available):
        said = _jax_says(
            lambda: jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=available)
        )
        more = (
            f" (more simulated CPU devices need a fresh kernel: restart it and call setup_devices({need}) first)"
            if devices is None else ""
        )
        raise _Problem(
            "too-few-devices",
            f"the mesh {shape} needs {' × '.join(map(str, shape))} = {need} devices, but only {len(available)} "
            f"are available: pick sizes whose product is at most {len(available)}, such as "
            f"{_suggest_mesh(len(shape), len(available))}{more}",
            said,
        )
    try:
        mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=available[:need])
    except Exception as err:
        raise _Problem("mesh", f"JAX could not build the mesh {shape} {names}", _describe(err)) from None
    notes = []
    if need < len(available):
        notes.append(f"the mesh uses the first {need} of the {len(available)} devices")
    return mesh, notes


def _spec_problem(spec: PartitionSpec, mesh: Any, ndim: int, who: str) -> _Problem | None:
    """check_spec's explanation, classified, with what JAX says about the same spec."""
    import jax

    sizes = dict(mesh.shape)
    try:
        check_spec(spec, sizes, ndim)
    except ValueError as err:
        message = f"{who}{err}"
        if len(spec) > ndim:
            kind = "too-many-entries"
            said = _jax_says(lambda: jax.ShapeDtypeStruct((1,) * ndim, np.float32, sharding=NamedSharding(mesh, spec)))
        else:
            try:
                used = [a for axes in spec_entries(spec, ndim) for a in axes]
            except ValueError:
                return _Problem("unparsable", message)
            kind = "unknown-axis" if any(a not in sizes for a in used) else "axis-reused"
            said = _jax_says(lambda: NamedSharding(mesh, spec))
            if kind == "unknown-axis":
                message += ". Fix: use one of those names, or give the mesh an axis with that name"
        return _Problem(kind, message, said)
    return None


def _uneven_problem(shape: tuple[int, ...], sharding: NamedSharding, who: str, where: str) -> _Problem | None:
    """Explain a dimension that its blocks do not divide, with what XLA would pad it to."""
    sizes = dict(sharding.mesh.shape)
    for dim, (n, axes) in enumerate(zip(shape, spec_entries(sharding.spec, len(shape)), strict=True)):
        k = math.prod(sizes[a] for a in axes)
        if axes and n % k:
            block = -(-n // k)
            fixes = [str(m) for m in (n // k * k, block * k) if m > 0]
            return _Problem(
                "uneven",
                f"{who}dimension {dim} has size {n}, which does not split into {k} equal blocks over "
                f"{_axes_text(axes)}: JAX refuses this layout {where} (IndivisibleError). Inside a jit program "
                f"XLA can still use it for intermediate values by padding every block to {block} "
                f"(the hatched area in the picture). Fix: make dimension {dim} a multiple of {k} "
                f"(such as {' or '.join(fixes)}), or shard it over fewer devices",
            )
    return None


def _png_html(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="sharding picture" style="max-width:100%" src="data:image/png;base64,{data}"/>'


def _tile_bytes(all_tiles: list[Tile], itemsize: int) -> int:
    return max((math.prod(t.padded) for t in all_tiles), default=1) * itemsize


def _copies_note(spec: PartitionSpec, mesh: Any, ndim: int, who: str = "") -> str | None:
    used = {a for axes in spec_entries(spec, ndim) for a in axes}
    free = [a for a in mesh.axis_names if a not in used]
    copies = math.prod(dict(mesh.shape)[a] for a in free)
    if copies == 1:
        return None
    return f"{who}not sharded over {', '.join(repr(a) for a in free)}: every block has {copies} copies"


_ERROR_STYLE = "border-left:4px solid #c62828;background:#fdecea;color:#222;padding:6px 10px;margin:4px 0"
_NOTE_STYLE = "color:#555;margin:2px 0"


_TITLES = {"unparsable": "Cannot read this:", "mesh": "Not a valid mesh:", "too-few-devices": "Not a valid mesh:"}


def _error_html(title: str, error: str, jax_error: str | None) -> str:
    parts = [f'<div class="explorer-error" style="{_ERROR_STYLE}"><b>{html.escape(title)}</b> {html.escape(error)}']
    if jax_error:
        parts.append(f'<div style="margin-top:4px">JAX says: <code>{html.escape(jax_error)}</code></div>')
    else:
        parts.append('<div style="margin-top:4px">(JAX itself raises nothing for this choice.)</div>')
    parts.append("</div>")
    return "".join(parts)


def _notes_html(notes: Sequence[str]) -> str:
    return "".join(f'<div style="{_NOTE_STYLE}">{html.escape(n)}</div>' for n in notes)


# --------------------------------------------------------------------------- one array


@dataclass(frozen=True, eq=False)
class LayoutReport:
    """Everything the explorer shows for one array: what ``layout_report`` returns.

    ``error`` is None for a layout JAX accepts. For an uneven layout it explains
    the refusal, and ``figure``/``table`` still describe the layout with XLA's
    padding. ``jax_error`` quotes what JAX raises for the same choice.
    """

    mesh_shape: tuple[int, ...] | None = None
    axis_names: tuple[str, ...] | None = None
    shape: tuple[int, ...] | None = None
    spec: PartitionSpec | None = None
    dtype: str = "float32"
    sharding: NamedSharding | None = None
    type_string: str | None = None
    table: ShardTable | None = None
    figure: Any = field(default=None, repr=False)
    error: str | None = None
    error_kind: str | None = None
    jax_error: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def bytes_per_device(self) -> dict[int, int]:
        """Bytes of real data on each device (device id -> bytes); empty when there is no layout."""
        return self.table.bytes_per_device if self.table is not None else {}

    @property
    def allocated_bytes_per_device(self) -> int | None:
        """What each device allocates: the largest block, padded as XLA pads uneven layouts."""
        if self.sharding is None or self.shape is None:
            return None
        return _tile_bytes(tiles(self.shape, self.sharding), np.dtype(self.dtype).itemsize)

    @property
    def array_bytes(self) -> int | None:
        return None if self.shape is None else math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def bytes_line(self) -> str:
        """One sentence: what each device holds, against the whole array."""
        if self.table is None:
            return ""
        per = set(self.bytes_per_device.values())
        n = len(self.bytes_per_device)
        total = format_bytes(self.array_bytes or 0)
        copies = self.table.total_bytes / max(self.array_bytes or 1, 1)
        if len(per) == 1:
            head = f"each of the {n} devices holds {format_bytes(per.pop())}"
        else:
            head = f"devices hold {format_bytes(min(per))} to {format_bytes(max(per))} of real data"
            head += f" (each allocates {format_bytes(self.allocated_bytes_per_device or 0)} with padding)"
        return f"{head}, of a {total} array; all devices together hold {copies:.3g}x the array"

    def __str__(self) -> str:
        if self.type_string is None:
            return f"invalid layout ({self.error_kind}): {self.error}"
        lines = [f"{self.type_string}   {self.spec} on mesh {self.mesh_shape} {self.axis_names}", self.bytes_line()]
        lines += list(self.notes)
        if self.error:
            lines.append(f"invalid layout ({self.error_kind}): {self.error}")
        if self.jax_error:
            lines.append(f"JAX says: {self.jax_error}")
        return "\n".join(line for line in lines if line)

    def to_html(self) -> str:
        """The report as HTML: what the explorer widget shows."""
        parts = []
        if self.type_string is not None:
            mesh = ", ".join(f"{a}={s}" for a, s in zip(self.axis_names or (), self.mesh_shape or (), strict=True))
            parts.append(
                f'<div style="font-size:1.15em;margin:2px 0"><code class="type-string">'
                f"{html.escape(self.type_string)}</code></div>"
                f'<div style="{_NOTE_STYLE}">{html.escape(str(self.spec))} on mesh({html.escape(mesh)})</div>'
            )
        if self.error:
            title = _TITLES.get(self.error_kind or "", "Not a valid layout:")
            parts.append(_error_html(title, self.error, self.jax_error))
        if self.figure is not None:
            parts.append(_png_html(self.figure))
        if self.table is not None:
            parts.append(f'<div class="bytes-line">Per device: {html.escape(self.bytes_line())}</div>')
        parts.append(_notes_html(self.notes))
        if self.table is not None:
            parts.append(
                "<details><summary>shard table (one row per device)</summary>"
                f"<pre>{html.escape(str(self.table))}</pre></details>"
            )
        return '<div class="explorer-report">' + "".join(parts) + "</div>"

    def _repr_html_(self) -> str:
        return self.to_html()


def _operand(
    who: str, where: str, shape: Any, spec: Any, mesh: Any
) -> tuple[tuple[int, ...], PartitionSpec, NamedSharding, _Problem | None]:
    """Parse and check one array's shape and spec; an uneven layout is returned, not raised."""
    try:
        shape = parse_shape(shape)
        spec = parse_spec(spec)
    except ValueError as err:
        raise _Problem("unparsable", f"{who}{err}") from None
    problem = _spec_problem(spec, mesh, len(shape), who)
    if problem is not None:
        raise problem
    sharding = NamedSharding(mesh, spec)
    return shape, spec, sharding, _uneven_problem(shape, sharding, who, where)


@functools.cache
def _identity() -> Any:
    import jax

    return jax.jit(lambda x: x)


def layout_report(
    mesh_shape: Any,
    axis_names: Any,
    array_shape: Any,
    spec: Any,
    *,
    dtype: Any = "float32",
    devices: Sequence[Any] | None = None,
    draw: bool = True,
) -> LayoutReport:
    """Describe one array laid out on a mesh: type string, bytes per device, picture.

    Every argument may be text as a learner types it (``"4, 2"``, ``"data, model"``,
    ``"128, 512"``, ``"P('data', 'model')"``) or the real thing (tuples, a
    ``PartitionSpec``). The mesh is built with ``jax.make_mesh`` (Auto axes) on
    the first prod(mesh_shape) of ``devices`` (default ``jax.devices()``).
    Nothing is allocated. Bad input gives a report whose ``error`` explains it.
    """
    base: dict[str, Any] = {}
    try:
        np_dtype = _parse_dtype(dtype)
        base["dtype"] = np_dtype.name
        mesh, notes = _build_mesh(mesh_shape, axis_names, devices)
        base.update(mesh_shape=tuple(mesh.devices.shape), axis_names=tuple(mesh.axis_names))
        where = "for any real array (jax.device_put, jit arguments and results)"
        shape, pspec, sharding, uneven = _operand("", where, array_shape, spec, mesh)
    except _Problem as p:
        return LayoutReport(**base, error=p.message, error_kind=p.kind, jax_error=p.jax_error)
    import jax

    sds = jax.ShapeDtypeStruct(shape, np_dtype, sharding=sharding)
    copies = _copies_note(pspec, mesh, len(shape))
    notes += [copies] if copies else []
    report = dict(
        base, shape=shape, spec=pspec, sharding=sharding, type_string=type_string(shape, sharding, dtype=np_dtype),
        table=shard_table(sds), notes=tuple(notes),
    )
    if uneven is not None:
        report.update(error=uneven.message, error_kind=uneven.kind, jax_error=_jax_says(lambda: _identity().lower(sds)))
    if draw:
        try:
            report["figure"] = draw_sharding(sds)
        except ValueError as err:  # draw_sharding refuses layouts needing too many panels
            report["notes"] = (*report["notes"], f"no picture: {err}")
    return LayoutReport(**report)


# --------------------------------------------------------------------------- matmul


@dataclass(frozen=True, eq=False)
class MatmulReport:
    """What the explorer shows for ``x @ w``: operand and result layouts and the collectives.

    ``bytes_per_device`` maps ``"x"``, ``"w"`` and ``"x @ w"`` to the bytes of
    each device's block (padded, for an uneven layout).

    ``out_sharding`` is the result's sharding in the compiled program (the one
    requested with ``out_spec``, or the one the compiler chose);
    ``collectives`` and ``memory`` are read from that compiled program.
    """

    mesh_shape: tuple[int, ...] | None = None
    axis_names: tuple[str, ...] | None = None
    lhs_shape: tuple[int, ...] | None = None
    lhs_spec: PartitionSpec | None = None
    rhs_shape: tuple[int, ...] | None = None
    rhs_spec: PartitionSpec | None = None
    out_spec: PartitionSpec | None = None
    dtype: str = "float32"
    lhs_type: str | None = None
    rhs_type: str | None = None
    out_shape: tuple[int, ...] | None = None
    out_type: str | None = None
    out_sharding: Any = None
    collectives: Collectives | None = None
    memory: Memory | None = None
    bytes_per_device: dict[str, int] = field(default_factory=dict)
    figure: Any = field(default=None, repr=False)
    error: str | None = None
    error_kind: str | None = None
    jax_error: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def type_strings(self) -> str | None:
        """``f32[512@data,1024@model] @ f32[1024,1024@model] -> f32[512@data,1024@model]``."""
        if self.lhs_type is None or self.rhs_type is None:
            return None
        return f"{self.lhs_type} @ {self.rhs_type}" + (f" -> {self.out_type}" if self.out_type else "")

    def __str__(self) -> str:
        lines = [self.type_strings or ""]
        if self.bytes_per_device:
            lines.append("per device: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in self.bytes_per_device.items()))
        if self.collectives is not None:
            lines.append(str(self.collectives))
        lines += list(self.notes)
        if self.error:
            lines.append(f"invalid ({self.error_kind}): {self.error}")
        if self.jax_error:
            lines.append(f"JAX says: {self.jax_error}")
        return "\n".join(line for line in lines if line)

    def to_html(self) -> str:
        """The report as HTML: what the explorer widget shows."""
        parts = []
        if self.type_strings:
            parts.append(
                f'<div style="font-size:1.15em;margin:2px 0"><code class="type-string">'
                f"{html.escape(self.type_strings)}</code></div>"
            )
        if self.error:
            title = _TITLES.get(self.error_kind or "", "Cannot compile this matmul:")
            parts.append(_error_html(title, self.error, self.jax_error))
        if self.figure is not None:
            parts.append(_png_html(self.figure))
        if self.bytes_per_device:
            held = ", ".join(f"{k} {format_bytes(v)}" for k, v in self.bytes_per_device.items())
            parts.append(f'<div class="bytes-line">Per device: {html.escape(held)}</div>')
        if self.memory is not None:
            parts.append(f'<div style="{_NOTE_STYLE}">compiled program, {html.escape(str(self.memory))}</div>')
        if self.collectives is not None:
            parts.append(f'<pre class="collectives">{html.escape(str(self.collectives))}</pre>')
        parts.append(_notes_html(self.notes))
        return '<div class="explorer-report">' + "".join(parts) + "</div>"

    def _repr_html_(self) -> str:
        return self.to_html()


def _contracting(shape: tuple[int, ...]) -> int:
    """Index of the contracting dimension of a matmul's right operand."""
    return 0 if len(shape) == 1 else len(shape) - 2


def _axes_text(axes: tuple[str, ...]) -> str:
    if not axes:
        return "not split"
    return repr(axes[0]) if len(axes) == 1 else "(" + ", ".join(repr(a) for a in axes) + ")"


def _reading(found: Collectives, lhs_axes: tuple[str, ...], rhs_axes: tuple[str, ...], k: int) -> str:
    """One sentence on the collectives, tied to how the contracting dimension is split."""
    if not found.ops:
        return "No collectives: each device already holds the slices its block of the result needs."
    counts = ", ".join(f"{n} {kind}" for kind, n in found.counts.items() if n)
    text = f"The compiler inserted {counts}."
    if lhs_axes and lhs_axes == rhs_axes and "all-reduce" in found.kinds:
        text += (
            f" Both operands split the contracting dimension (size {k}) over {_axes_text(lhs_axes)}: each device "
            "multiplies matching slices into a partial sum, and the all-reduce adds the partial sums up."
        )
    elif lhs_axes != rhs_axes:
        text += (
            f" The contracting dimension (size {k}) is split differently in the two operands "
            f"({_axes_text(lhs_axes)} in x, {_axes_text(rhs_axes)} in w), "
            "so data must move before the slices line up."
        )
    return text


def matmul_report(
    mesh_shape: Any,
    axis_names: Any,
    lhs_shape: Any,
    lhs_spec: Any,
    rhs_shape: Any,
    rhs_spec: Any,
    *,
    out_spec: Any = None,
    dtype: Any = "float32",
    devices: Sequence[Any] | None = None,
    draw: bool = True,
) -> MatmulReport:
    """Compile ``jnp.matmul`` for two laid-out operands and report what the compiler did.

    Arguments are read like :func:`layout_report`'s. The operands are
    ``jax.ShapeDtypeStruct`` with ``NamedSharding``; the program is
    ``jax.jit(jnp.matmul, out_shardings=...)`` (``out_spec=None`` or ``""`` lets
    the compiler choose the result's layout). Collectives come from
    ``utils.inspecting.collectives`` of the compiled program; nothing runs.
    """
    import jax
    import jax.numpy as jnp

    base: dict[str, Any] = {}
    try:
        np_dtype = _parse_dtype(dtype)
        base["dtype"] = np_dtype.name
        mesh, notes = _build_mesh(mesh_shape, axis_names, devices)
        base.update(mesh_shape=tuple(mesh.devices.shape), axis_names=tuple(mesh.axis_names))
        where = "for a jit argument"
        a_shape, a_spec, a_sh, a_uneven = _operand("x (left operand): ", where, lhs_shape, lhs_spec, mesh)
        base.update(lhs_shape=a_shape, lhs_spec=a_spec, lhs_type=type_string(a_shape, a_sh, dtype=np_dtype))
        b_shape, b_spec, b_sh, b_uneven = _operand("w (right operand): ", where, rhs_shape, rhs_spec, mesh)
        base.update(rhs_shape=b_shape, rhs_spec=b_spec, rhs_type=type_string(b_shape, b_sh, dtype=np_dtype))
        try:
            o_spec = None if out_spec is None or (isinstance(out_spec, str) and not out_spec.strip()) \
                else parse_spec(out_spec)
        except ValueError as err:
            raise _Problem("unparsable", f"result: {err}") from None
        base["out_spec"] = o_spec
        a = jax.ShapeDtypeStruct(a_shape, np_dtype, sharding=a_sh)
        b = jax.ShapeDtypeStruct(b_shape, np_dtype, sharding=b_sh)
        plain = [jax.ShapeDtypeStruct(s, np_dtype) for s in (a_shape, b_shape)]
        said = _jax_says(lambda: jax.eval_shape(jnp.matmul, *plain))
        if not a_shape or not b_shape:
            raise _Problem(
                "matmul-shapes", "a matmul needs operands with at least 1 dimension: give both shapes, such as "
                "512, 1024 and 1024, 1024", said,
            )
        kb = _contracting(b_shape)
        if a_shape[-1] != b_shape[kb]:
            raise _Problem(
                "matmul-shapes",
                f"the contracting dimensions do not match: x's last dimension is {a_shape[-1]} but w's dimension "
                f"{kb} is {b_shape[kb]}. In x @ w they must be equal: make w's shape "
                f"{(*b_shape[:kb], a_shape[-1], *b_shape[kb + 1:])} or x's shape {(*a_shape[:-1], b_shape[kb])}",
                said,
            )
        if said is not None:
            raise _Problem(
                "matmul-shapes",
                f"the leading (batch) dimensions {a_shape[:-2]} and {b_shape[:-2]} do not broadcast: make them "
                "equal, or 1 where one operand should be reused",
                said,
            )
        out_shape = tuple(jax.eval_shape(jnp.matmul, *plain).shape)
        base["out_shape"] = out_shape
        o_sh = None
        if o_spec is not None:
            problem = _spec_problem(o_spec, mesh, len(out_shape), "result: ")
            if problem is not None:
                raise problem
            o_sh = NamedSharding(mesh, o_spec)
        uneven = a_uneven or b_uneven or (
            _uneven_problem(out_shape, o_sh, "result: ", "for a jit result") if o_sh is not None else None
        )
    except _Problem as p:
        return MatmulReport(**base, error=p.message, error_kind=p.kind, jax_error=p.jax_error)

    itemsize = np_dtype.itemsize
    held = {"x": _tile_bytes(tiles(a_shape, a_sh), itemsize), "w": _tile_bytes(tiles(b_shape, b_sh), itemsize)}
    fn = jax.jit(jnp.matmul, out_shardings=o_sh) if o_sh is not None else jax.jit(jnp.matmul)
    if uneven is not None:  # still drawn, with XLA's padding
        arrays = {"x": a, "w": b}
        if o_sh is not None:
            arrays["x @ w"] = jax.ShapeDtypeStruct(out_shape, np_dtype, sharding=o_sh)
        return MatmulReport(
            **base, bytes_per_device=held, error=uneven.message, error_kind=uneven.kind, notes=tuple(notes),
            jax_error=_jax_says(lambda: fn.lower(a, b).compile()),
            figure=draw_shardings(arrays, ncols=3) if draw else None,
        )
    try:
        compiled = fn.lower(a, b).compile()
    except Exception as err:
        return MatmulReport(
            **base, error="JAX refused to compile this matmul; its message is below", error_kind="compile",
            jax_error=_describe(err), notes=tuple(notes),
        )
    out_sharding = compiled.output_shardings
    found = collectives(compiled)
    out_type = None
    if isinstance(out_sharding, NamedSharding):
        out_type = type_string(out_shape, out_sharding, dtype=np_dtype)
        held["x @ w"] = _tile_bytes(tiles(out_shape, out_sharding), itemsize)
    k = a_shape[-1]
    lhs_axes = spec_entries(a_spec, len(a_shape))[-1]
    rhs_axes = spec_entries(b_spec, len(b_shape))[kb]
    notes.append(_reading(found, lhs_axes, rhs_axes, k))
    if o_spec is None and isinstance(out_sharding, NamedSharding):
        notes.append(f"result layout chosen by the compiler: {out_sharding.spec} (set a result spec to force one)")
    figure = None
    if draw:
        arrays: dict[str, Any] = {"x": a, "w": b}
        if isinstance(out_sharding, NamedSharding):
            arrays["x @ w"] = jax.ShapeDtypeStruct(out_shape, np_dtype, sharding=out_sharding)
        figure = draw_shardings(arrays, ncols=3)
    return MatmulReport(
        **base, out_type=out_type, out_sharding=out_sharding, collectives=found, memory=memory_per_device(compiled),
        bytes_per_device=held, figure=figure, notes=tuple(notes),
    )


# --------------------------------------------------------------------------- the widget


DEFAULTS = {
    "mesh_shape": "4, 2",
    "axis_names": "data, model",
    "mode": "array",
    "dtype": "float32",
    "shape": "128, 512",
    "spec": "P('data', 'model')",
    "lhs_shape": "512, 1024",
    "lhs_spec": "P('data', 'model')",
    "rhs_shape": "1024, 1024",
    "rhs_spec": "P(None, 'model')",
    "out_spec": "",
}


def _render(values: dict[str, str], devices: Sequence[Any] | None = None) -> tuple[Any, str]:
    """(report, HTML) for the explorer's control values; never raises."""
    try:
        if values.get("mode") == "matmul":
            report: Any = matmul_report(
                values["mesh_shape"], values["axis_names"], values["lhs_shape"], values["lhs_spec"],
                values["rhs_shape"], values["rhs_spec"], out_spec=values.get("out_spec") or None,
                dtype=values["dtype"], devices=devices,
            )
        else:
            report = layout_report(
                values["mesh_shape"], values["axis_names"], values["shape"], values["spec"],
                dtype=values["dtype"], devices=devices,
            )
        return report, report.to_html()
    except Exception as err:
        message = f"the explorer hit an unexpected problem ({type(err).__name__}: {err}); change a value to retry"
        return None, _error_html("Sorry:", message, None)


@functools.cache
def _explorer_class() -> type:
    import ipywidgets as w

    class Explorer(w.VBox):
        """The explorer widget: ``controls`` (name -> widget), ``output``, and the last ``report``."""

        def __init__(self, devices: Sequence[Any] | None = None) -> None:
            wide = w.Layout(width="260px")
            style = {"description_width": "90px"}

            def text(name: str, label: str, placeholder: str = "") -> Any:
                return w.Text(value=DEFAULTS[name], description=label, placeholder=placeholder,
                              continuous_update=False, layout=wide, style=style)

            self.controls: dict[str, Any] = {
                "mesh_shape": text("mesh_shape", "mesh shape", "4, 2"),
                "axis_names": text("axis_names", "axis names", "data, model"),
                "dtype": w.Dropdown(options=list(DTYPES), value=DEFAULTS["dtype"], description="dtype",
                                    layout=w.Layout(width="200px"), style={"description_width": "50px"}),
                "mode": w.ToggleButtons(options=[("one array", "array"), ("matmul x @ w", "matmul")],
                                        value=DEFAULTS["mode"], style={"button_width": "120px"}),
                "shape": text("shape", "array shape", "128, 512"),
                "spec": text("spec", "spec", "P('data', None)"),
                "lhs_shape": text("lhs_shape", "x shape", "512, 1024"),
                "lhs_spec": text("lhs_spec", "x spec", "P('data', None)"),
                "rhs_shape": text("rhs_shape", "w shape", "1024, 1024"),
                "rhs_spec": text("rhs_spec", "w spec", "P(None, 'model')"),
                "out_spec": text("out_spec", "result spec", "auto"),
            }
            c = self.controls
            self.devices = devices
            self.output = w.Output(layout=w.Layout(border="1px solid #ddd", padding="4px"))
            self.report: Any = None
            self._array_box = w.HBox([c["shape"], c["spec"]])
            self._matmul_box = w.VBox([
                w.HBox([c["lhs_shape"], c["lhs_spec"]]),
                w.HBox([c["rhs_shape"], c["rhs_spec"]]),
                w.HBox([c["out_spec"], w.HTML('<span style="color:#555">empty: the compiler chooses</span>')]),
            ])
            help_text = w.HTML(
                '<span style="color:#555">Type a value and press Enter. A spec is what goes inside '
                "<code>P(...)</code>: <code>P('data', None)</code>, <code>data, model</code>, "
                "<code>('data', 'model'), None</code>.</span>"
            )
            super().__init__([
                w.HBox([c["mesh_shape"], c["axis_names"], c["dtype"]]),
                c["mode"], self._array_box, self._matmul_box, help_text, self.output,
            ])
            for control in c.values():
                control.observe(self._changed, names="value")
            self.refresh()

        def values(self) -> dict[str, str]:
            return {name: control.value for name, control in self.controls.items()}

        def _changed(self, change: Any) -> None:
            self.refresh()

        def refresh(self) -> None:
            """Recompute the report and replace what the output area shows."""
            matmul = self.controls["mode"].value == "matmul"
            self._array_box.layout.display = "none" if matmul else None
            self._matmul_box.layout.display = None if matmul else "none"
            self.report, page = _render(self.values(), self.devices)
            plain = str(self.report) if self.report is not None else "unexpected problem"
            self.output.outputs = (
                {"output_type": "display_data", "data": {"text/html": page, "text/plain": plain}, "metadata": {}},
            )

    return Explorer


class _NoWidgets:
    """What ``explore()`` returns without ipywidgets: the reason, and the default report."""

    def __init__(self, reason: str, devices: Sequence[Any] | None) -> None:
        self.reason = reason
        self.report, self._page = _render(dict(DEFAULTS), devices)

    def _repr_html_(self) -> str:
        return f'<div style="{_ERROR_STYLE}">{html.escape(self.reason)}</div>{self._page}'

    def __repr__(self) -> str:
        return f"{self.reason}\n\n{self.report}"


def explore(*, devices: Sequence[Any] | None = None) -> Any:
    """An interactive sharding explorer for Jupyter: returns an ipywidgets widget to display.

    Controls: mesh shape and axis names, element type, one array or a matmul,
    the shapes and PartitionSpecs; the output below re-renders on every change
    (press Enter in a text box) with the picture, the type string, the bytes per
    device, the collectives of a matmul, or the explanation of an invalid choice.
    ``devices`` defaults to ``jax.devices()``. Without ipywidgets it returns an
    object that displays why, and the report for the default layout.
    """
    try:
        cls = _explorer_class()
    except ImportError:
        return _NoWidgets(
            "The interactive explorer needs ipywidgets, which this kernel cannot import: install it "
            "(pip install ipywidgets) and restart the kernel. Meanwhile, layout_report(...) and "
            "matmul_report(...) from utils.explorer give the same answers; here is the default layout:",
            devices,
        )
    return cls(devices)
