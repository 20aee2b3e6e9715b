"""Exercises of notebook 24: translating between PyTorch/XLA and JAX, and reading torch_xla's spec strings.

The checkers need neither torch nor torch_xla, so they run in every environment of the course.
tests/test_exercises.py checks their reference answers against torch_xla where it is installed
(`make test-xla`).
"""

from __future__ import annotations

import re

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import Exercise
from spmd_course.utils.layout import tiles

MESH_AXES = {"data": 4, "model": 2}
"""The notebook's (4, 2) mesh, in both frameworks: devices [[0, 1], [2, 3], [4, 5], [6, 7]]."""


def _mesh_42() -> jax.sharding.Mesh:
    """torch_xla's ``xs.Mesh(np.arange(8), (4, 2))``: devices in id order, whatever order jax.make_mesh picks."""
    devices = sorted(jax.devices(), key=lambda d: d.id)[:8]
    return Mesh(np.array(devices).reshape(4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def spec_string(partition_spec: tuple, shape: tuple[int, ...]) -> str:
    """The string torch_xla prints for ``xs.mark_sharding(t, mesh, partition_spec)`` on the (4, 2) mesh.

    Both frameworks build the same HLO sharding; this writes it the way torch_xla does: the number of
    blocks per dimension, then (if blocks are copied) the number of copies, then the devices of block
    after block in row-major order.
    """
    layout = tiles(shape, NamedSharding(_mesh_42(), PartitionSpec(*partition_spec)))
    copies = len(layout[0].devices)
    if len(layout) == 1:
        return "{replicated}"
    counts = [len({(t.start[d], t.stop[d]) for t in layout}) for d in range(len(shape))]
    dims = counts + ([copies] if copies > 1 else [])
    devices = [d for t in layout for d in t.devices]
    suffix = " last_tile_dim_replicate" if copies > 1 else ""
    return "{devices=[" + ",".join(map(str, dims)) + "]" + ",".join(map(str, devices)) + suffix + "}"


def _trimmed(spec: PartitionSpec) -> tuple:
    entries = tuple(spec)
    while entries and entries[-1] is None:
        entries = entries[:-1]
    return entries


def _check_linear_weight_spec(spec: object) -> None:
    if isinstance(spec, tuple) and not isinstance(spec, PartitionSpec):
        raise AssertionError(f"{spec} is torch_xla's form; JAX wants a PartitionSpec: P(...)")
    assert isinstance(spec, PartitionSpec), f"expected a PartitionSpec such as P(...); got {type(spec).__name__}"
    assert len(spec) <= 2, (
        f"{spec} has {len(spec)} entries, but the kernel (64, 8) has 2 dimensions: JAX refuses a longer spec"
    )
    if _trimmed(spec) == (None, "model"):
        raise AssertionError(
            f"{spec} copies torch's spec unchanged, but the JAX kernel is the transpose of the torch weight: "
            "(64, 8) = (in, out) against torch's (8, 64) = (out, in)"
        )
    assert _trimmed(spec) == ("model",), (
        f"{spec} is not the same layout: torch's (None, 'model') splits the weight's second dimension, the "
        "64 inputs, over 'model'; find that dimension in the (64, 8) kernel"
    )


linear_weight_spec = Exercise(
    title="Exercise 1: from mark_sharding to a PartitionSpec",
    checker=_check_linear_weight_spec,
    solution=PartitionSpec("model", None),
    wrong=(
        PartitionSpec(None, "model"),
        ("model", None),
        PartitionSpec("data", None),
        PartitionSpec("model", None, None),  # one entry too many: JAX refuses it for a 2-D kernel
    ),
    hint="nn.Linear(64, 8).weight is (out, in) = (8, 64); the JAX kernel is (in, out) = (64, 8)",
    explanation=(
        "torch's (None, 'model') on the (8, 64) weight splits its 64 inputs; in the (64, 8) kernel the inputs "
        "are the first dimension, so JAX writes P('model', None) (or P('model')): the row-parallel layer."
    ),
)

_TARGET = "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"


def _axis_name(entry: object) -> str | None:
    """A mesh axis as torch_xla reads a spec entry: a name, its index in the mesh (a Python int), or None."""
    axes = list(MESH_AXES)
    if type(entry) is int:  # torch_xla tests type(p) is int: True and numpy integers are refused, as here
        assert 0 <= entry < len(axes), (
            f"{entry} is not an axis of the mesh: its axes are 0 ('data') and 1 ('model'), by name or by index"
        )
        return axes[entry]
    assert entry is None or (isinstance(entry, str) and entry in MESH_AXES), (
        f"{entry!r} is not an axis of the mesh {MESH_AXES}: give an axis name (or its index, a Python int), "
        "a tuple of them, or None"
    )
    return entry


def _check_spec_from_string(answer: object) -> None:
    assert isinstance(answer, tuple) and not isinstance(answer, PartitionSpec), (
        f"torch_xla's mark_sharding takes a plain tuple such as ('data', None); got {answer!r}"
    )
    assert len(answer) == 2, (
        f"{answer} has {len(answer)} {'entry' if len(answer) == 1 else 'entries'}; torch_xla wants exactly one "
        "per dimension of the (8, 16) tensor"
    )
    used: list[str] = []
    named: list[object] = []
    for entry in answer:
        assert not (isinstance(entry, tuple) and not entry), (
            f"{answer}: an empty tuple is not an entry; write None for a dimension kept whole"
        )
        names = entry if isinstance(entry, tuple) else (entry,)
        assert all(not isinstance(n, tuple) for n in names), f"{entry!r}: torch_xla refuses nested tuples"
        names = tuple(_axis_name(n) for n in names)
        used += [n for n in names if n is not None]
        named.append(names if isinstance(entry, tuple) else names[0])
    twice = sorted({n for n in used if used.count(n) > 1})
    assert not twice, f"{answer} uses {twice} more than once; a mesh axis can split only one dimension"
    got = spec_string(tuple(named), (8, 16))
    assert got == _TARGET, f"{answer} makes torch_xla print {got}, not {_TARGET}"


spec_from_string = Exercise(
    title="Exercise 2: read a spec string",
    checker=_check_spec_from_string,
    solution=("model", None),
    wrong=(("data", None), (None, "model"), ("model",), PartitionSpec("model", None), ("model", ()),
           ["model", None],  # a list: mark_sharding caches by spec, and a list is unhashable (TypeError)
           (0, None), (2, None), (True, None), (np.int64(1), None)),  # by index: 0 is 'data'; 2 no axis; not ints
    hint="[2,1,4]: 2 blocks of rows, 1 block of columns, 4 copies of each block; which mesh axis has size 2?",
    explanation=(
        "Rows split in 2 over 'model', columns whole, and each block copied on the 4 devices of its 'model' "
        "column of the mesh: devices 0,2,4,6 hold the first rows, 1,3,5,7 the others. torch_xla also takes an "
        "axis by its index in the mesh, so (1, None) is the same answer."
    ),
)

_TARGET_3 = "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"


def _check_string_from_spec(answer: object) -> None:
    assert isinstance(answer, str), (
        f"answer with the string torch_xla prints, such as '{{devices=[...]...}}'; got {answer!r}"
    )
    # torch_xla prints no space around ',', '[', ']', '=' or braces; one space before the suffix
    given = re.sub(r"\s*([,\[\]{}=])\s*", r"\1", " ".join(answer.split()))
    assert given.startswith("{devices=[") or given == "{replicated}", (
        f"{answer!r} does not look like a spec string: it starts with '{{devices=[' or is '{{replicated}}'"
    )
    dims = given[len("{devices=[") :].split("]")[0] if given.startswith("{devices=[") else ""
    assert dims == "1,2,4", (
        f"the block counts [{dims}] are not right: one entry per tensor dimension (how many blocks), then one "
        "for the number of copies of each block"
    )
    assert given == _TARGET_3, (
        f"{answer!r}: the block counts are right, but not the device list or its suffix; list the devices of "
        "the first block of columns, then of the second, and mark the last entry as copies"
    )


string_from_spec = Exercise(
    title="Exercise 3: predict the spec string",
    checker=_check_string_from_spec,
    solution=_TARGET_3,
    wrong=(
        "{devices=[1,2]0,1}",
        "{devices=[1,2,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}",
        "{devices=[1,4,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}",
        "{devices=[1,2,4]0,2,4,6,1,3,5,7}",
    ),
    hint="(None, 'model'): 1 block of rows, 2 blocks of columns, each on the 4 devices of one 'model' column",
    explanation=(
        "Columns 0:8 live on devices 0,2,4,6 (model index 0) and columns 8:16 on 1,3,5,7; 'last_tile_dim_replicate' "
        "says the trailing 4 counts copies, not blocks."
    ),
)
