"""Exercises of notebook 00: reading a layout from a spec."""

from __future__ import annotations

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import Exercise, plain


def _mesh_8() -> jax.sharding.Mesh:
    return jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))


def _check_columns_spec(spec: object) -> None:
    assert isinstance(spec, PartitionSpec), f"expected a PartitionSpec such as P(...); got {type(spec).__name__}"
    assert len(spec) <= 2, f"{spec} has {len(spec)} entries, but the array has 2 dimensions: one entry per dimension"
    try:
        sharding = NamedSharding(_mesh_8(), spec)
    except Exception as err:  # an unknown axis (ValueError) or a repeated one (DuplicateSpecError)
        raise AssertionError(f"{spec} is not a valid spec on the 1-D mesh with axis 'data': {err}") from None
    shard = sharding.shard_shape((128, 512))
    assert shard == (128, 64), f"{spec} gives each device a {shard} block, not (128, 64)"


columns_spec = Exercise(
    title="Exercise 1: split the columns",
    checker=_check_columns_spec,
    solution=PartitionSpec(None, "data"),
    wrong=(
        PartitionSpec("data"),
        PartitionSpec(),
        "data",
        PartitionSpec(None, "data", None),  # three entries for a 2-D array
        PartitionSpec(None, "model"),  # the 1-D mesh has no 'model' axis
    ),
    hint="the second dimension (512 columns) is the one to split; None keeps a dimension whole",
    explanation="P(None, 'data') keeps all 128 rows and gives each of the 8 devices 512/8 = 64 columns.",
)


def _check_bytes_per_device(n: object) -> None:
    n = plain(n)
    assert isinstance(n, int) and not isinstance(n, bool), f"give a whole number of bytes; got {n!r}"
    assert n == 64 * 64 * 4, (
        f"{n} bytes is not it: f32[256@data,128@model] on a (4, 2) mesh gives blocks of "
        "(256/4, 128/2) elements of 4 bytes"
    )


bytes_per_device = Exercise(
    title="Exercise 2: bytes per device",
    checker=_check_bytes_per_device,
    solution=64 * 64 * 4,
    wrong=(256 * 128 * 4, 64 * 64, 64 * 128 * 4, 16384.5, True),
    hint="divide each dimension by the size of the mesh axis named after '@', then multiply by 4 bytes",
    explanation="(256/4) x (128/2) = 64 x 64 elements x 4 bytes = 16 KiB on every device.",
)
