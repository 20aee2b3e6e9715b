"""Where each block of an array lives: the geometry behind the drawings and tables.

Everything here is computed from a shape and a sharding, so it also answers
"what would this layout look like?" for arrays that do not exist, including
uneven layouts JAX itself refuses to build (XLA pads those inside ``jit``).
Bad input is turned into errors that say what to change, before JAX sees it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, Sharding

__all__ = ["MatmulTraffic", "OperandTraffic", "Piece", "Tile", "as_layout", "check_spec", "matmul_traffic",
           "short_dtype", "spec_entries", "tiles", "type_string"]


def short_dtype(dtype: Any) -> str:
    """'float32' -> 'f32', 'bfloat16' -> 'bf16', 'uint8' -> 'u8': the short names HLO and ``jax.typeof`` use."""
    name = np.dtype(dtype).name
    m = re.fullmatch(r"(b?float|u?int|complex)(\d+)", name)
    return name if m is None else {"float": "f", "bfloat": "bf", "int": "i", "uint": "u", "complex": "c"}[m[1]] + m[2]


class _Box:
    """A rectangle of an array: ``start``/``stop`` bound each dimension."""

    start: tuple[int, ...]
    stop: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.start, self.stop, strict=True))

    def index_string(self) -> str:
        """Like numpy's indexing: '[0:32, 0:256]'."""
        return "[" + ", ".join(f"{a}:{b}" for a, b in zip(self.start, self.stop, strict=True)) + "]"


@dataclass(frozen=True)
class Tile(_Box):
    """One distinct block of an array and every device that holds a copy of it.

    ``devices`` are in replica order, as JAX numbers copies (``replica_id``):
    mesh order, not id order. ``padded`` is the per-dimension block size XLA
    allocates (larger than ``shape`` only for uneven layouts).
    """

    start: tuple[int, ...]
    stop: tuple[int, ...]
    devices: tuple[int, ...]
    padded: tuple[int, ...]

    @property
    def is_uneven(self) -> bool:
        return self.shape != self.padded


def spec_entries(spec: PartitionSpec, ndim: int) -> list[tuple[str, ...]]:
    """The mesh axes of each array dimension, ``()`` for a replicated dimension.

    Omitted trailing dimensions are replicated: ``P('data')`` on a 2-D array
    is ``[('data',), ()]``.
    """
    out: list[tuple[str, ...]] = []
    for entry in tuple(spec) + (None,) * (ndim - len(spec)):
        if entry is None:
            out.append(())
        elif isinstance(entry, str):
            out.append((entry,))
        elif isinstance(entry, tuple | list) and all(isinstance(a, str) for a in entry):
            out.append(tuple(entry))
        else:
            raise ValueError(
                f"PartitionSpec entry {entry!r} is not a mesh axis name: use a name such as 'data', "
                "a tuple of names such as ('data', 'model'), or None"
            )
    return out


def check_spec(spec: PartitionSpec, mesh_axes: dict[str, int], ndim: int) -> None:
    """Raise a ValueError that names the fix if ``spec`` cannot describe an ``ndim`` array."""
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"expected a PartitionSpec such as P('data', None); got {type(spec).__name__}")
    if len(spec) > ndim:
        raise ValueError(
            f"{spec} has {len(spec)} entries but the array has {ndim} dimension(s): "
            f"give at most one entry per dimension, e.g. P({', '.join(['None'] * ndim)})"
        )
    seen: dict[str, int] = {}
    for dim, axes in enumerate(spec_entries(spec, ndim)):
        for axis in axes:
            if axis not in mesh_axes:
                raise ValueError(
                    f"{spec} names mesh axis {axis!r}, which this mesh does not have; "
                    f"its axes are {tuple(mesh_axes)}"
                )
            if axis in seen:
                raise ValueError(
                    f"{spec} uses mesh axis {axis!r} for dimensions {seen[axis]} and {dim}; "
                    f"a mesh axis can shard at most one dimension (replicate one with None, "
                    f"or shard a dimension over several axes with a tuple like ('data', 'model'))"
                )
            seen[axis] = dim


def as_layout(x: Any, sharding: Any = None, mesh: Any = None) -> tuple[tuple[int, ...], Any, Sharding]:
    """Normalise what a learner passes into (shape, dtype, sharding).

    Accepts a sharded ``jax.Array``; a ``jax.ShapeDtypeStruct`` with a sharding;
    or a shape tuple plus ``sharding`` (a ``Sharding``, or a ``PartitionSpec``
    with ``mesh=`` or under ``jax.set_mesh``).
    """
    import jax

    dtype: Any = np.float32
    if isinstance(x, jax.Array | jax.ShapeDtypeStruct):
        shape, dtype = tuple(x.shape), x.dtype
        sharding = x.sharding if sharding is None else sharding
        if sharding is None:
            raise ValueError("this ShapeDtypeStruct has no sharding: pass sharding=NamedSharding(mesh, P(...))")
    elif isinstance(x, tuple | list) and all(isinstance(d, int | np.integer) for d in x):
        shape = tuple(int(d) for d in x)
        if any(d < 0 for d in shape):
            raise ValueError(f"array shape {shape} has a negative dimension")
        if sharding is None:
            raise ValueError(f"a bare shape {shape} needs a layout: pass sharding=NamedSharding(mesh, P(...))")
    else:
        raise TypeError(
            f"expected a jax.Array, a jax.ShapeDtypeStruct, or a shape tuple such as (128, 512); "
            f"got {type(x).__name__}. Convert with jnp.asarray(...) and place it with jax.device_put"
        )

    if isinstance(sharding, PartitionSpec):
        if mesh is None:
            mesh = jax.sharding.get_mesh() if hasattr(jax.sharding, "get_mesh") else None
            if mesh is None or not getattr(mesh, "axis_names", ()):
                raise ValueError(
                    f"{sharding} needs a mesh: pass mesh=..., use NamedSharding(mesh, {sharding}), "
                    "or run inside `with jax.set_mesh(mesh):`"
                )
        check_spec(sharding, dict(mesh.shape), len(shape))
        sharding = NamedSharding(mesh, sharding)
    elif isinstance(sharding, NamedSharding):
        check_spec(sharding.spec, dict(sharding.mesh.shape), len(shape))
    elif not isinstance(sharding, Sharding):
        raise TypeError(
            f"expected a jax.sharding.Sharding such as NamedSharding(mesh, P('data')); "
            f"got {type(sharding).__name__}"
        )
    return shape, dtype, sharding


def tiles(shape: tuple[int, ...], sharding: Sharding) -> list[Tile]:
    """The distinct blocks of an array of ``shape`` and the devices holding each.

    For a ``NamedSharding`` the blocks are computed from the mesh and spec the
    way XLA pads: n split k ways gives blocks of ceil(n/k), so an uneven
    dimension ends in a short (or empty) block. Other shardings use JAX's own
    ``devices_indices_map``. Tiles are sorted by position; each one's devices
    are in replica order (the order of the mesh, or of the device assignment).
    """
    if isinstance(sharding, NamedSharding):
        return _named_tiles(shape, sharding)
    groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for device, index in sharding.devices_indices_map(tuple(shape)).items():
        bounds = tuple(
            (s.start or 0, s.stop if s.stop is not None else n)
            for s, n in zip(index, shape, strict=True)
        )
        groups.setdefault(bounds, []).append(device.id)
    return _in_order(
        Tile(
            tuple(a for a, _ in b), tuple(c for _, c in b), tuple(ids),
            tuple(c - a for a, c in b),
        )
        for b, ids in groups.items()
    )


def _named_tiles(shape: tuple[int, ...], sharding: NamedSharding) -> list[Tile]:
    mesh = sharding.mesh
    names = list(mesh.axis_names)
    sizes = dict(mesh.shape)
    entries = spec_entries(sharding.spec, len(shape))
    ids = np.vectorize(lambda d: d.id, otypes=[int])(mesh.devices)
    groups: dict[tuple[int, ...], list[int]] = {}
    for coord in np.ndindex(*mesh.devices.shape):
        block = []
        for axes in entries:
            b = 0
            for axis in axes:  # first axis is the major one, as in JAX
                b = b * sizes[axis] + coord[names.index(axis)]
            block.append(b)
        groups.setdefault(tuple(block), []).append(int(ids[coord]))
    out = []
    for block, devs in groups.items():
        start, stop, padded = [], [], []
        for b, axes, n in zip(block, entries, shape, strict=True):
            k = math.prod(sizes[a] for a in axes)
            size = -(-n // k)
            start.append(min(b * size, n))
            stop.append(min((b + 1) * size, n))
            padded.append(size)
        out.append(Tile(tuple(start), tuple(stop), tuple(devs), tuple(padded)))  # devs in mesh order
    return _in_order(out)


def _in_order(items: Any) -> list[Tile]:
    return sorted(items, key=lambda t: (t.start, t.devices))


def type_string(x: Any, sharding: Any = None, mesh: Any = None, *, dtype: Any = None) -> str:
    """The course's type notation: ``f32[128@data,512@model]``.

    A dimension sharded over several axes reads ``16@(data,model)``, as
    ``jax.typeof`` prints it on Explicit meshes; this works on any mesh.
    ``dtype`` names the element type of a bare shape (default float32).
    """
    shape, x_dtype, sharding = as_layout(x, sharding, mesh)
    dtype = x_dtype if dtype is None else dtype
    entries = spec_entries(sharding.spec, len(shape)) if isinstance(sharding, NamedSharding) else [()] * len(shape)
    dims = [f"{n}@{axes[0]}" if len(axes) == 1 else f"{n}@({','.join(axes)})" if axes else str(n)
            for n, axes in zip(shape, entries, strict=True)]
    return f"{short_dtype(dtype)}[{','.join(dims)}]"


# ---------------------------------------------------------------------------------------------------------------
# Matmul traffic: which blocks of C = A @ B one device holds, needs, and must fetch.


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
            parts.append(f"holds only a partial sum of its {names[2]} block: adds over "
                         f"{_axes_text(self.partial_axes)} ({self.reduction})")
        if not parts:
            return f"dev {self.device} holds everything its {names[2]} block needs: nothing moves"
        return f"dev {self.device} " + "; ".join(parts)


def _axes_text(axes: tuple[str, ...]) -> str:
    return " and ".join(repr(a) for a in axes)


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

    out_entries = spec_entries(out_sharding.spec, 2)
    compute_spec = PartitionSpec(*(tuple(a for a in axes if a not in partial) or None for axes in out_entries))
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
