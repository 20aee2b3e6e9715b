"""Notebook 04's pictures of ``C = A @ B``: what one device holds, fetches and adds up.

:func:`matmul_traffic` works out the textbook plan for one device (which blocks of A and B it holds,
which it must fetch and from whom, whether its block of C is a partial sum to be added over a mesh
axis); :func:`draw_matmul` draws that plan, B above C and A to its left, on one scale. Only notebook
04 uses them, so they live in their own module rather than in ``utils``; the notebook imports them with
``from spmd_course.matmul_pictures import draw_matmul, matmul_traffic``. They build on the shared pieces of
``utils.layout`` (blocks of a sharding) and ``utils.drawing`` (labelled blocks, cards, label sizing), so a
matmul looks like every other picture.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, Sharding
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from spmd_course.utils.drawing import _draw_tiles, _finish, _tile_lines  # shared with utils.drawing's own pictures
from spmd_course.utils.layout import Tile, _Box, as_layout, check_spec, pending_marker, spec_entries, tiles, type_string

__all__ = ["MatmulTraffic", "OperandTraffic", "Piece", "draw_matmul", "matmul_traffic"]


# --- the plan: which blocks of C = A @ B one device holds, needs, and must fetch -------------------------------------


@dataclass(frozen=True)
class Piece(_Box):
    """A rectangle of an operand that one device needs for its output block.

    ``source`` is the device it comes from: the device itself when ``held``,
    else the nearest holder on the mesh (fewest differing mesh coordinates,
    then lowest id); ``axes`` are the mesh axes where the two differ, those
    of the all-gather that brings it.
    """

    start: tuple[int, ...]
    stop: tuple[int, ...]
    holders: tuple[int, ...]
    source: int
    held: bool
    axes: tuple[str, ...]


@dataclass(frozen=True)
class OperandTraffic:
    """One matmul input as seen by one device: what it holds, needs, and lacks.

    ``needed_start``/``needed_stop`` bound the rectangle the device multiplies
    (its output rows or columns times its contraction range); ``pieces`` cover
    that rectangle, one per block of the operand it overlaps.
    """

    shape: tuple[int, ...]
    held: Tile
    needed_start: tuple[int, ...]
    needed_stop: tuple[int, ...]
    pieces: tuple[Piece, ...]

    @property
    def needed_shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.needed_start, self.needed_stop, strict=True))

    @property
    def missing(self) -> tuple[Piece, ...]:
        """The needed pieces the device does not hold: they must be fetched (an all-gather)."""
        return tuple(p for p in self.pieces if not p.held)

    @property
    def gather_axes(self) -> tuple[str, ...]:
        """Mesh axes the missing pieces come over, in mesh order (``()`` when nothing is missing)."""
        axes = {a for p in self.missing for a in p.axes}
        return tuple(a for a in self.mesh_axes if a in axes)

    @property
    def fetched_elements(self) -> int:
        return sum(math.prod(p.shape) for p in self.missing)

    mesh_axes: tuple[str, ...] = ()


@dataclass(frozen=True)
class MatmulTraffic:
    """What one device does for ``C = A @ B`` under the textbook plan.

    The plan: fetch the missing pieces of A and B (all-gather), multiply, and,
    when A and B split the contracting dimension alike, add the partial sums
    over ``partial_axes`` (all-reduce, or reduce-scatter when C is split over
    them too). ``out`` is the device's block of C; ``computed_start``/``_stop``
    bound what it multiplies out before the reduction. XLA picks this plan when
    C's layout follows from A's and B's; asked for another, it may move data
    otherwise: check the program with ``utils.inspecting.collectives``.
    """

    device: int
    mesh_shape: dict[str, int]
    lhs: OperandTraffic
    rhs: OperandTraffic
    out: Tile
    computed_start: tuple[int, int]
    computed_stop: tuple[int, int]
    contracting: tuple[int, int]
    partial_axes: tuple[str, ...]

    @property
    def computed_shape(self) -> tuple[int, int]:
        return (self.computed_stop[0] - self.computed_start[0], self.computed_stop[1] - self.computed_start[1])

    @property
    def reduction(self) -> str | None:
        """'all-reduce', 'reduce-scatter', or None when the output block is complete."""
        if not self.partial_axes:
            return None
        return "reduce-scatter" if self.computed_shape != self.out.shape else "all-reduce"

    @property
    def collectives(self) -> tuple[str, ...]:
        """The collectives of the plan: one all-gather per operand with missing pieces, then the reduction."""
        kinds = ["all-gather" for op in (self.lhs, self.rhs) if op.missing]
        if self.reduction:
            kinds.append(self.reduction)
        return tuple(kinds)

    def summary(self, names: tuple[str, str, str] = ("A", "B", "C")) -> str:
        """One sentence: what moves for this device, e.g. "dev 0 fetches 1 block of A over 'model' (all-gather)"."""
        parts = []
        for name, op in zip(names[:2], (self.lhs, self.rhs), strict=True):
            if op.missing:
                n = len(op.missing)
                parts.append(f"fetches {n} block{'s' if n > 1 else ''} of {name} over {_axes_text(op.gather_axes)}"
                             " (all-gather)")
        if self.partial_axes:
            parts.append(f"holds a pending sum {pending_marker(self.partial_axes)} of its {names[2]} block: adds over "
                         f"{_axes_text(self.partial_axes)} ({self.reduction})")
        if not parts:
            return f"dev {self.device} holds everything its {names[2]} block needs: nothing moves"
        return f"dev {self.device} " + "; ".join(parts)


def _axes_text(axes: tuple[str, ...]) -> str:
    return " and ".join(repr(a) for a in axes)


def _without(spec: PartitionSpec, axes: Sequence[str]) -> PartitionSpec:
    """A 2-D ``spec`` with ``axes`` dropped from every dimension (a dimension left with none is whole)."""
    return PartitionSpec(*(tuple(a for a in entry if a not in axes) or None for entry in spec_entries(spec, 2)))


def _device_coords(mesh: Any) -> dict[int, tuple[int, ...]]:
    return {int(d.id): tuple(int(i) for i in idx) for idx, d in np.ndenumerate(mesh.devices)}


def _own_tile(shape: tuple[int, ...], sharding: Sharding, device: int) -> Tile:
    return next(t for t in tiles(shape, sharding) if device in t.devices)


def _operand(
    shape: tuple[int, ...], sharding: NamedSharding, device: int, start: tuple[int, int], stop: tuple[int, int],
) -> OperandTraffic:
    mesh = sharding.mesh
    coords = _device_coords(mesh)
    names = tuple(mesh.axis_names)
    pieces = []
    for t in tiles(shape, sharding):
        a = tuple(max(x, y) for x, y in zip(t.start, start, strict=True))
        b = tuple(min(x, y) for x, y in zip(t.stop, stop, strict=True))
        if any(x >= y for x, y in zip(a, b, strict=True)):
            continue
        held = device in t.devices

        def distance(d: int) -> tuple[int, int]:
            return sum(x != y for x, y in zip(coords[d], coords[device], strict=True)), d

        source = device if held else min(t.devices, key=distance)
        axes = tuple(n for n, x, y in zip(names, coords[source], coords[device], strict=True) if x != y)
        pieces.append(Piece(a, b, t.devices, source, held, axes))
    return OperandTraffic(tuple(shape), _own_tile(shape, sharding, device), start, stop, tuple(pieces), names)


def _matmul_sharding(name: str, shape: tuple[int, ...], sharding: Any, mesh: Any) -> NamedSharding:
    if isinstance(sharding, PartitionSpec) and mesh is None:
        raise ValueError(f"{name}: {sharding} needs a mesh; pass NamedSharding(mesh, {sharding})")
    if not isinstance(sharding, NamedSharding | PartitionSpec):
        raise TypeError(
            f"{name}: matmul traffic reads mesh axes, so it needs a NamedSharding(mesh, P(...)); "
            f"got {type(sharding).__name__}"
        )
    if isinstance(sharding, NamedSharding) and mesh is not None and (
        tuple(sharding.mesh.axis_names) != tuple(mesh.axis_names)
        or not np.array_equal(sharding.mesh.device_ids, mesh.device_ids)
    ):
        raise ValueError(
            f"{name} lives on another mesh than A: put A, B and C on the same mesh "
            f"(same axis names, same devices in the same places)"
        )
    named = sharding if isinstance(sharding, NamedSharding) else None
    try:
        check_spec(named.spec if named else sharding, dict((named.mesh if named else mesh).shape), len(shape))
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    return named or NamedSharding(mesh, sharding)


def matmul_traffic(
    lhs_shape: tuple[int, int],
    lhs_sharding: NamedSharding,
    rhs_shape: tuple[int, int],
    rhs_sharding: NamedSharding,
    out_sharding: NamedSharding | PartitionSpec,
    device: Any = 0,
) -> MatmulTraffic:
    """Which blocks device ``device`` holds, needs and must fetch for ``C = A @ B``.

    ``A`` is ``(M, K)``, ``B`` is ``(K, N)``, ``C`` is ``(M, N)``; the three
    shardings must be ``NamedSharding`` on one mesh (``out_sharding`` may be a
    bare ``PartitionSpec``, read on A's mesh). The device owes C's block under
    ``out_sharding``. If A and B split K over the same mesh axes, it multiplies
    its own slice of K and its block is a partial sum over those axes;
    otherwise it needs all of K. Whatever it needs and does not hold is a
    :class:`Piece` to fetch, from the nearest device that holds it.
    """
    lhs_shape, rhs_shape = _matmul_shape("A", lhs_shape), _matmul_shape("B", rhs_shape)
    if lhs_shape[1] != rhs_shape[0]:
        raise ValueError(
            f"A {lhs_shape} @ B {rhs_shape}: A's columns ({lhs_shape[1]}) must equal B's rows ({rhs_shape[0]})"
        )
    lhs_sharding = _matmul_sharding("A", lhs_shape, lhs_sharding, None)
    mesh = lhs_sharding.mesh
    rhs_sharding = _matmul_sharding("B", rhs_shape, rhs_sharding, mesh)
    out_shape = (lhs_shape[0], rhs_shape[1])
    out_sharding = _matmul_sharding("C", out_shape, out_sharding, mesh)
    coords = _device_coords(mesh)
    try:
        device_id = -1 if isinstance(device, bool) else int(getattr(device, "id", device))
    except (TypeError, ValueError):
        device_id = -1
    if device_id not in coords:
        raise ValueError(f"device {device!r} is not on this mesh; pick one of its ids {sorted(coords)}")

    k_lhs = spec_entries(lhs_sharding.spec, 2)[1]
    k_rhs = spec_entries(rhs_sharding.spec, 2)[0]
    partial = k_lhs if k_lhs and k_lhs == k_rhs else ()
    if partial:
        own = _own_tile(lhs_shape, lhs_sharding, device_id)
        k0, k1 = own.start[1], own.stop[1]
    else:
        k0, k1 = 0, lhs_shape[1]

    compute_spec = _without(out_sharding.spec, partial)
    computed = _own_tile(out_shape, NamedSharding(mesh, compute_spec), device_id)
    (m0, n0), (m1, n1) = computed.start, computed.stop
    return MatmulTraffic(
        device=device_id,
        mesh_shape=dict(mesh.shape),
        lhs=_operand(lhs_shape, lhs_sharding, device_id, (m0, k0), (m1, k1)),
        rhs=_operand(rhs_shape, rhs_sharding, device_id, (k0, n0), (k1, n1)),
        out=_own_tile(out_shape, out_sharding, device_id),
        computed_start=(m0, n0),
        computed_stop=(m1, n1),
        contracting=(k0, k1),
        partial_axes=partial,
    )


def _matmul_shape(name: str, shape: Any) -> tuple[int, int]:
    if (
        not isinstance(shape, tuple | list)
        or len(shape) != 2
        or not all(isinstance(d, int | np.integer) and not isinstance(d, bool) and d > 0 for d in shape)
    ):
        raise ValueError(
            f"{name} must be a 2-D shape such as (512, 1024) with sizes >= 1; got {shape!r}: "
            f"matmul traffic covers (M, K) @ (K, N)"
        )
    return (int(shape[0]), int(shape[1]))


# --- the picture -----------------------------------------------------------------------------------------------------


_HELD = _FETCH = _OUT = "black"  # the roles differ by line style (solid, dashed and hatched, dotted), not by
# colour: in the course's pictures colour means device only


def _matmul_operand(name: str, x: Any, mesh: Any = None) -> tuple[tuple[int, ...], Any, Any]:
    """(shape, dtype, sharding) of a matmul operand: an array, a ShapeDtypeStruct, or a (shape, sharding) pair."""
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], Sharding | PartitionSpec):
        x, sharding = x
    else:
        sharding = None
    try:
        return as_layout(x, sharding, mesh)
    except (TypeError, ValueError) as err:
        raise type(err)(
            f"{name}: {err}. Each operand is a sharded jax.Array, a ShapeDtypeStruct with a sharding, "
            f"or a (shape, NamedSharding) pair"
        ) from None


def _outline(ax: Axes, start: Sequence[int], stop: Sequence[int], shape: Sequence[int], gid: str, **style: Any) -> None:
    """An outline (or hatched overlay) over rows start[0]:stop[0], columns start[1]:stop[1] of a 2-D panel."""
    y0, x0 = start[0] / shape[0], start[1] / shape[1]
    h, w = (stop[0] - start[0]) / shape[0], (stop[1] - start[1]) / shape[1]
    ax.add_patch(Rectangle((x0, y0), w, h, gid=gid, zorder=2.0, **style))


def draw_matmul(lhs: Any, rhs: Any, out: Any, *, device: Any = 0, title: str | None = None,
                names: tuple[str, str, str] = ("A", "B", "C"), show_bytes: bool = False) -> Figure:
    """Draw ``C = A @ B`` as one device sees it: what it holds, fetches, and adds up.

    ``lhs`` (A, shape (M, K)), ``rhs`` (B, (K, N)) and ``out`` (C, (M, N)) are
    each a sharded ``jax.Array``, a ``jax.ShapeDtypeStruct`` with a sharding,
    or a ``(shape, NamedSharding)`` pair; ``out`` may also be just C's
    ``NamedSharding`` or ``PartitionSpec`` (e.g. ``compiled.output_shardings``).
    The classic layout, on one scale: B above C, A to the left of C, so A's
    rows line up with C's rows and B's columns with C's columns. For
    ``device``: its blocks of A and B are outlined with a solid black line ("held by dev 0");
    pieces it needs but does not hold are hatched with a dashed outline ("fetched from dev 1":
    an all-gather); its block of C is outlined with a dotted line, with "pending sum
    {U:model}" when A and B split the contracting dimension alike (an
    all-reduce, or a reduce-scatter when C is split over that axis too), and
    C's title gives the pending sum's type, e.g. ``f32[512,1024]{U:model} → ...``.
    Blocks it does not use are faded; the title says what moves. A dimension
    more than 4x another is drawn shorter, and the panels say 'not to scale'.

    The geometry is :func:`matmul_traffic`, the textbook plan;
    assert against it, and against the compiled program's collectives.
    """
    a_shape, a_dtype, a_sh = _matmul_operand(names[0], lhs)
    mesh = getattr(a_sh, "mesh", None)
    b_shape, b_dtype, b_sh = _matmul_operand(names[1], rhs, mesh)
    if isinstance(out, PartitionSpec | Sharding):
        c_sh, c_dtype = out, np.result_type(a_dtype, b_dtype)
    else:
        c_shape, c_dtype, c_sh = _matmul_operand(names[2], out, mesh)
        if len(a_shape) == 2 and len(b_shape) == 2 and c_shape != (a_shape[0], b_shape[1]):
            raise ValueError(
                f"{names[2]} has shape {c_shape}, but {names[0]} {a_shape} @ {names[1]} {b_shape} has shape "
                f"{(a_shape[0], b_shape[1])}: pass the matmul's output (or just its sharding)"
            )
    traffic = matmul_traffic(a_shape, a_sh, b_shape, b_sh, c_sh, device)
    c_shape = (a_shape[0], b_shape[1])
    c_sh = c_sh if isinstance(c_sh, Sharding) else as_layout(c_shape, c_sh, mesh)[2]
    d = traffic.device
    # one scale for M, K and N; where the longest is over 4x the shortest, lengths go as size**p (shortest: 1/4)
    dims = (a_shape[0], a_shape[1], c_shape[1])
    p = min(1.0, math.log(4) / math.log(max(dims) / max(min(dims), 1)) if max(dims) > 4 * min(dims) else 1.0)
    m, k, n = (max(v, 1) ** p for v in dims)
    scale = min(8.5 / (k + n), 5.5 / (k + m))
    legend_in, head_in = 0.7, 0.75
    fig = plt.figure(figsize=(scale * (k + n) + 1.8, scale * (k + m) + 1.9 + legend_in + head_in))
    grid = fig.add_gridspec(2, 2, width_ratios=[k, n], height_ratios=[k, m])
    panels = [  # name, shape, dtype, sharding, operand traffic, grid cell, anchor, height:width
        (names[0], a_shape, a_dtype, a_sh, traffic.lhs, grid[1, 0], "NE", m / k),
        (names[1], b_shape, b_dtype, b_sh, traffic.rhs, grid[0, 1], "SW", k / n),
        (f"{names[2]} = {names[0]} @ {names[1]}", c_shape, c_dtype, c_sh, None, grid[1, 1], "NW", m / n),
    ]
    for name, shape, dtype, sh, op, cell, anchor, ratio in panels:
        ax = fig.add_subplot(cell, anchor=anchor)
        panel_tiles = tiles(shape, sh)
        roles = _matmul_roles(traffic, op, panel_tiles)
        labelled = [(t, _tile_lines(t, np.dtype(dtype).itemsize, show_bytes, roles.get(i, ())))
                    for i, t in enumerate(panel_tiles)]
        texts = _draw_tiles(ax, shape, sh, labelled, 0, 1, ratio)
        for i, (t, text) in enumerate(zip(panel_tiles, texts, strict=True)):
            if i not in roles:
                text.set_alpha(0.45)
                text.get_bbox_patch().set_alpha(0.35)
                _outline(ax, t.start, t.stop, shape, "faded", facecolor="white", alpha=0.6, linewidth=0)
            else:
                edge = _OUT if op is None else _HELD if d in t.devices else _FETCH
                text.get_bbox_patch().set(edgecolor=edge, linewidth=1.5, alpha=0.9)
        if op is not None:
            _outline(ax, op.held.start, op.held.stop, shape, "held", fill=False, edgecolor=_HELD, linewidth=3)
            for p in op.missing:
                _outline(ax, p.start, p.stop, shape, "fetched", fill=False, hatch="xx", edgecolor=_FETCH,
                         linewidth=2.5, linestyle="--")
        else:
            if traffic.partial_axes:
                _outline(ax, traffic.computed_start, traffic.computed_stop, shape, "partial", fill=False,
                         edgecolor=_OUT, linewidth=0, hatch="//")
            _outline(ax, traffic.out.start, traffic.out.stop, shape, "out", fill=False, edgecolor=_OUT, linewidth=3,
                     linestyle=":")
            ax.yaxis.set_label_position("right")  # A's ylabel, on the left, names these rows too
        if name == names[1]:
            ax.xaxis.set_label_position("top")  # C's xlabel, below C, names these columns too
        kind = type_string(shape, sh, dtype=dtype)
        if op is None and traffic.partial_axes:  # C: the pending sum, then the reduction's result
            pending = type_string(shape, NamedSharding(sh.mesh, _without(sh.spec, traffic.partial_axes)), dtype=dtype)
            kind = f"{pending}{pending_marker(traffic.partial_axes)} → {kind}"
        ax.set_title(f"{name}\n{kind}   {sh.spec}", fontsize=9)
    handles = [
        Patch(facecolor="none", edgecolor=_HELD, linewidth=2.5, label=f"held by dev {d}"),
        Patch(facecolor="none", edgecolor=_FETCH, hatch="xx", linewidth=2, linestyle="--",
              label=f"needed by dev {d}, held elsewhere: fetched (all-gather)"),
        Patch(facecolor="none", edgecolor=_OUT, linewidth=2.5, linestyle=":", label=f"dev {d}'s block of {names[2]}"),
        Patch(facecolor="0.93", edgecolor="0.8", label=f"not used by dev {d}"),
    ]
    if traffic.partial_axes:
        handles.insert(3, Patch(facecolor="none", edgecolor=_OUT, hatch="//", linewidth=0,
                                label=f"pending sums {pending_marker(traffic.partial_axes)} dev {d} computes: "
                                      f"added over {_axes_text(traffic.partial_axes)} ({traffic.reduction})"))
    fig.legend(handles=handles, loc="lower center", ncol=3 if len(handles) > 4 else 2, fontsize=8, frameon=False)
    summary = traffic.summary((names[0], names[1], names[2]))
    fig.suptitle(f"{title}\n{summary}" if title else summary, fontsize=10)
    fig_h = fig.get_size_inches()[1]
    return _finish(fig, rect=(0, legend_in / fig_h, 1, 1 - head_in / fig_h))


def _matmul_roles(traffic: MatmulTraffic, op: Any, panel_tiles: list[Tile]) -> dict[int, list[str]]:
    """The role line of each block that matters to the device.

    It is line 7 of a block's label: see ``spmd_course.utils.drawing._tile_lines``.
    """
    d = traffic.device
    roles: dict[int, list[str]] = {}
    for i, t in enumerate(panel_tiles):
        if op is not None:  # an input: held, fetched, or not used
            pieces = [p for p in op.pieces if p.holders == t.devices and _inside(p, t)]
            if d in t.devices:
                roles[i] = [f"held by dev {d}" if pieces else f"held by dev {d} (not needed)"]
            elif pieces:
                (p,) = pieces
                part = "" if p.shape == t.shape else f"{p.index_string()} "
                roles[i] = [f"{part}fetched from dev {p.source}"]
        elif d in t.devices:  # the output: the device's own block
            if traffic.partial_axes:
                roles[i] = [f"dev {d}'s block: pending sum {pending_marker(traffic.partial_axes)}"]
            else:
                roles[i] = [f"dev {d}'s block: complete"]
        elif traffic.reduction == "reduce-scatter" and _overlaps(t, traffic.computed_start, traffic.computed_stop):
            roles[i] = [f"gets a partial sum from dev {d}"]
    return roles


def _overlaps(t: Tile, start: Sequence[int], stop: Sequence[int]) -> bool:
    return all(max(a, x) < min(b, y) for a, b, x, y in zip(t.start, t.stop, start, stop, strict=True))


def _inside(p: Any, t: Tile) -> bool:
    return all(a <= x and y <= b for a, b, x, y in zip(t.start, t.stop, p.start, p.stop, strict=True))
