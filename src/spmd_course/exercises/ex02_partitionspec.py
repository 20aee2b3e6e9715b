"""Exercises of notebook 02: writing specs and predicting the blocks they give."""

from __future__ import annotations

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import Exercise, plain


def _mesh_42() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))


def _check_block_16x512(spec: object) -> None:
    assert isinstance(spec, PartitionSpec), f"expected a PartitionSpec such as P(...); got {type(spec).__name__}"
    try:
        sharding = NamedSharding(_mesh_42(), spec)
    except Exception as err:  # a repeated or unknown axis
        raise AssertionError(f"{spec} is not a valid spec on the (4, 2) mesh: {type(err).__name__}: {err}") from None
    assert len(spec) <= 2, f"{spec} has {len(spec)} entries, but the array has 2 dimensions"
    shard = sharding.shard_shape((128, 512))
    assert shard == (16, 512), f"{spec} gives each device a {shard} block, not (16, 512)"


block_16x512 = Exercise(
    title="Exercise 1: a (16, 512) block on every device",
    checker=_check_block_16x512,
    solution=PartitionSpec(("data", "model")),
    wrong=(
        PartitionSpec("data"),
        PartitionSpec("data", "model"),
        PartitionSpec(None, ("data", "model")),
        PartitionSpec("data", "data"),
        ("data", "model"),
    ),
    hint="128 rows / 16 = 8: the rows must be split over both mesh axes at once, with a tuple of axis names",
    explanation=(
        "P(('data', 'model')) splits the 128 rows 4 x 2 = 8 ways and keeps the 512 columns whole. "
        "P(('model', 'data')) and P(('data', 'model'), None) give the same block shape."
    ),
)


def _check_predict_shard_shape(shape: object) -> None:
    shape = plain(shape)
    assert isinstance(shape, tuple) and all(isinstance(n, int) and not isinstance(n, bool) for n in shape), (
        f"give the shape as a tuple of whole numbers, such as (64, 96, 8); got {shape!r}"
    )
    assert len(shape) == 3, f"the array has 3 dimensions, so its blocks do too; got {len(shape)} numbers"
    truth = NamedSharding(_mesh_42(), PartitionSpec(None, ("data", "model"))).shard_shape((64, 96, 8))
    assert shape == truth, (
        f"{shape} is not it: dimension 0 is None (whole), dimension 1 is split over data and model "
        "together, and the omitted dimension 2 stays whole"
    )


predict_shard_shape = Exercise(
    title="Exercise 2: predict the shard shape",
    checker=_check_predict_shard_shape,
    solution=(64, 12, 8),
    wrong=((64, 24, 8), (64, 48, 8), (16, 48, 8), (64, 12, 4), (64, 12), (64, 12.5, 8), "(64, 12, 8)"),
    hint="divide each dimension by the product of the sizes of the mesh axes in its entry; a missing entry is None",
    explanation="(64, 96 / (4 x 2), 8) = (64, 12, 8): 96 split 8 ways, the other dimensions whole.",
)


def _devices_holding_rows(start: int, stop: int) -> set[int]:
    """Ids of the devices whose block of a (128, 512) array under P(('model', 'data')) meets rows start:stop."""
    sharding = NamedSharding(_mesh_42(), PartitionSpec(("model", "data")))
    held = set()
    for device, index in sharding.devices_indices_map((128, 512)).items():
        lo, hi = index[0].start or 0, 128 if index[0].stop is None else index[0].stop
        if lo < stop and hi > start:
            held.add(device.id)
    return held


def _check_rows_32_64(devices: object) -> None:
    devices = plain(devices)  # Device objects become their ids
    assert isinstance(devices, frozenset | tuple) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in devices
    ), (
        f"give the device ids as a set of whole numbers, such as {{0, 1}}; got {devices!r}"
    )
    truth = _devices_holding_rows(32, 64)
    given = set(devices)
    missing, extra = sorted(truth - given), sorted(given - truth)
    assert not missing and not extra, (
        f"{sorted(given)} is not it"
        + (f"; some device you left out also holds part of rows 32:64 ({len(missing)} missing)" if missing else "")
        + (f"; device(s) {extra} hold none of rows 32:64" if extra else "")
    )


rows_32_64 = Exercise(
    title="Exercise 3: who holds rows 32:64?",
    checker=_check_rows_32_64,
    solution={4, 6},
    wrong=({2, 3}, {4}, {4, 5}, {1, 3}, {4, 6, 8}, 4),
    hint=(
        "blocks are 16 rows, so rows 32:64 are blocks 2 and 3; section 3 says which mesh position holds which "
        "block when 'model' is the first axis of the tuple"
    ),
    explanation=(
        "Blocks 2 and 3 have model = 0 and data = 2 and 3: the devices at mesh positions (2, 0) and (3, 0), "
        "ids 4 and 6 on the usual device order. Under P(('data', 'model')) it would be devices 2 and 3."
    ),
)
