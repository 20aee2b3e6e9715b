"""Where each block of an array lives, from a shape and a sharding: the geometry behind the drawings and tables.

It also answers for arrays that do not exist, uneven layouts included (XLA pads those inside ``jit``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, Sharding

__all__ = ["Tile", "as_layout", "check_spec", "pending_marker", "short_dtype", "spec_entries", "tiles",
           "type_string"]


def short_dtype(dtype: Any) -> str:
    """'float32' -> 'f32', 'bfloat16' -> 'bf16', 'int4' -> 'i4', 'float8_e4m3fn' -> 'f8_e4m3fn': the short
    names ``jax.typeof(x).str_short(short_dtypes=True)`` prints, so the course's types read as JAX's."""
    name = np.dtype(dtype).name
    m = re.fullmatch(r"(b?float|u?int|complex)(\d+.*)", name)
    return name if m is None else {"float": "f", "bfloat": "bf", "int": "i", "uint": "u", "complex": "c"}[m[1]] + m[2]


class _Box:
    """A rectangle of an array: ``start``/``stop`` bound each dimension.

    Private but shared: :class:`Tile` here, and ``Piece`` in ``src/spmd_course/matmul_pictures.py``, are boxes.
    """

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

    ``devices`` are in replica order (JAX's ``replica_id``: mesh order, not id order). ``padded`` is the block
    size XLA allocates per dimension (larger than ``shape`` only for uneven layouts).
    """

    start: tuple[int, ...]
    stop: tuple[int, ...]
    devices: tuple[int, ...]
    padded: tuple[int, ...]

    @property
    def is_uneven(self) -> bool:
        return self.shape != self.padded


def spec_entries(spec: PartitionSpec, ndim: int) -> list[tuple[str, ...]]:
    """The mesh axes of each array dimension, ``()`` where replicated: ``P('data')`` on 2-D is ``[('data',), ()]``."""
    out: list[tuple[str, ...]] = []
    entries = tuple(spec.partitions)  # not tuple(spec): JAX refuses that for a spec with unreduced axes
    for entry in entries + (None,) * (ndim - len(entries)):
        if entry is None:
            out.append(())
        elif isinstance(entry, str):
            out.append((entry,))
        elif isinstance(entry, tuple | list) and all(isinstance(a, str) for a in entry):
            out.append(tuple(entry))
        else:
            raise ValueError(f"PartitionSpec entry {entry!r} is not a mesh axis name: use a name such as 'data', "
                             "a tuple of names such as ('data', 'model'), or None")
    return out


def check_spec(spec: PartitionSpec, mesh_axes: dict[str, int], ndim: int) -> None:
    """Raise a ValueError that names the fix if ``spec`` cannot describe an ``ndim`` array."""
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"expected a PartitionSpec such as P('data', None); got {type(spec).__name__}")
    if len(spec.partitions) > ndim:
        raise ValueError(f"{spec} has {len(spec.partitions)} entries but the array has {ndim} dimension(s): "
                         f"give at most one entry per dimension, e.g. P({', '.join(['None'] * ndim)})")
    seen: dict[str, int] = {}
    for dim, axes in enumerate(spec_entries(spec, ndim)):
        for axis in axes:
            if axis not in mesh_axes:
                raise ValueError(f"{spec} names mesh axis {axis!r}, which this mesh does not have; "
                                 f"its axes are {tuple(mesh_axes)}")
            if axis in seen:
                raise ValueError(f"{spec} uses mesh axis {axis!r} for dimensions {seen[axis]} and {dim}; "
                                 f"a mesh axis can shard at most one dimension (replicate one with None, "
                                 f"or shard a dimension over several axes with a tuple like ('data', 'model'))")
            seen[axis] = dim


def as_layout(x: Any, sharding: Any = None, mesh: Any = None) -> tuple[tuple[int, ...], Any, Sharding]:
    """(shape, dtype, sharding) of a sharded ``jax.Array``, a ``ShapeDtypeStruct``, or a shape with ``sharding``.

    ``sharding`` may be a ``PartitionSpec`` with ``mesh=`` or under ``jax.set_mesh``.
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
        raise TypeError(f"expected a jax.Array, a jax.ShapeDtypeStruct, or a shape tuple such as (128, 512); "
                        f"got {type(x).__name__}. Convert with jnp.asarray(...) and place it with jax.device_put")

    if isinstance(sharding, PartitionSpec):
        if mesh is None:
            mesh = jax.sharding.get_mesh() if hasattr(jax.sharding, "get_mesh") else None
            if mesh is None or not getattr(mesh, "axis_names", ()):
                raise ValueError(f"{sharding} needs a mesh: pass mesh=..., use NamedSharding(mesh, {sharding}), "
                                 "or run inside `with jax.set_mesh(mesh):`")
        check_spec(sharding, dict(mesh.shape), len(shape))
        sharding = NamedSharding(mesh, sharding)
    elif isinstance(sharding, NamedSharding):
        check_spec(sharding.spec, dict(sharding.mesh.shape), len(shape))
    elif not isinstance(sharding, Sharding):
        raise TypeError(f"expected a jax.sharding.Sharding such as NamedSharding(mesh, P('data')); "
                        f"got {type(sharding).__name__}")
    return shape, dtype, sharding


def tiles(shape: tuple[int, ...], sharding: Sharding) -> list[Tile]:
    """The distinct blocks of an array of ``shape``, sorted by position, and the devices holding each (replica order).

    For a ``NamedSharding`` they are computed as XLA pads: n split k ways gives blocks of ceil(n/k), so an
    uneven dimension ends in a short (or empty) block. Other shardings use JAX's ``devices_indices_map``.
    """
    if isinstance(sharding, NamedSharding):
        return _named_tiles(shape, sharding)
    groups: dict[tuple[tuple[int, ...], ...], list[int]] = {}
    for device, index in sharding.devices_indices_map(tuple(shape)).items():
        groups.setdefault(tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True)), []).append(device.id)
    return _in_order(Tile(tuple(a for a, _ in b), tuple(c for _, c in b), tuple(ids), tuple(c - a for a, c in b))
                     for b, ids in groups.items())


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
    padded = tuple(-(-n // math.prod(sizes[a] for a in axes)) for axes, n in zip(entries, shape, strict=True))
    return _in_order(Tile(tuple(min(b * k, n) for b, k, n in zip(block, padded, shape, strict=True)),
                          tuple(min((b + 1) * k, n) for b, k, n in zip(block, padded, shape, strict=True)),
                          tuple(devs), padded)  # devs in mesh order
                     for block, devs in groups.items())


def _in_order(items: Any) -> list[Tile]:
    return sorted(items, key=lambda t: (t.start, t.devices))


def pending_marker(axes: Any) -> str:
    """The pending-sum marker as ``jax.typeof`` prints it: ``{U:model}``, ``{U:(data,model)}``; ``''`` for none.

    A value carrying it holds partial sums still to be added over those mesh axes ("unreduced").
    """
    axes = tuple(axes)
    if not all(isinstance(a, str) for a in axes):
        raise ValueError(f"pending_marker takes mesh axis names such as ('model',); got {axes!r}")
    return "{U:" + (axes[0] if len(axes) == 1 else f"({','.join(axes)})") + "}" if axes else ""


def type_string(x: Any, sharding: Any = None, mesh: Any = None, *, dtype: Any = None) -> str:
    """The course's type notation, as ``jax.typeof`` prints it on Explicit meshes, for any mesh.

    ``f32[128@data,512@model]``; several axes read ``16@(data,model)``; unreduced axes add ``{U:model}``.
    ``dtype`` names the element type of a bare shape (default float32).
    """
    shape, x_dtype, sharding = as_layout(x, sharding, mesh)
    dtype = x_dtype if dtype is None else dtype
    entries = spec_entries(sharding.spec, len(shape)) if isinstance(sharding, NamedSharding) else [()] * len(shape)
    dims = [f"{n}@{axes[0]}" if len(axes) == 1 else f"{n}@({','.join(axes)})" if axes else str(n)
            for n, axes in zip(shape, entries, strict=True)]
    pending = ""
    if isinstance(sharding, NamedSharding) and getattr(sharding.spec, "unreduced", None):
        pending = pending_marker(a for a in sharding.mesh.axis_names if a in sharding.spec.unreduced)
    return f"{short_dtype(dtype)}[{','.join(dims)}]{pending}"
