"""Exercises of notebook 09: collectives and constraints on a (4, 2) data x model mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import Exercise, answer_errors, plain
from spmd_course.utils.inspecting import COLLECTIVES, collectives


def _mesh_4x2() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def _check_gradient_group_size(n: object) -> None:
    n = plain(n)
    assert isinstance(n, int) and not isinstance(n, bool), f"give a whole number of devices; got {n!r}"
    assert n != 8, "8 would be every device: but the 2 devices of a row hold different gradient halves"
    assert n != 2, "2 is the size of a row (the 'model' axis): that group adds up partial activations"
    assert n == 4, (
        f"{n} is not it: the gradient of a parameter block must be summed over every device that holds "
        "that block but saw different examples"
    )


gradient_group_size = Exercise(
    title="Exercise 1: group size of the gradient all-reduce",
    checker=_check_gradient_group_size,
    solution=4,
    wrong=(8, 2, 1),
    hint="which devices hold the same half of linear1/kernel but saw different examples?",
    explanation=(
        "The 4 devices of a mesh column (the 'data' axis) hold the same parameter half and different quarters "
        "of the batch: their gradients are summed in groups of 4."
    ),
)


def _check_activation_spec(spec: object) -> None:
    assert isinstance(spec, PartitionSpec), f"expected a PartitionSpec such as P(...); got {type(spec).__name__}"
    mesh = _mesh_4x2()
    assert len(spec) <= 2, f"{spec} has {len(spec)} entries, but the activation has only 2 dimensions"
    with answer_errors(f"{spec}, laying out a (64, 256) activation on this mesh,"):
        given = NamedSharding(mesh, spec)
        shard = given.shard_shape((64, 256))  # unknown axis, an axis used twice, uneven sizes
    want = NamedSharding(mesh, PartitionSpec("data", "model"))
    assert given.is_equivalent_to(want, 2), (
        f"{spec} gives each device a {shard} block of the (64, 256) activation; the examples (rows) should "
        "be split 4 ways on 'data' and the hidden units (columns) 2 ways on 'model': (16, 128)"
    )


activation_spec = Exercise(
    title="Exercise 2: pin the hidden activation to both axes",
    checker=_check_activation_spec,
    solution=PartitionSpec("data", "model"),
    wrong=(PartitionSpec("model", "data"), PartitionSpec("data"), PartitionSpec(None, "model"),
           PartitionSpec("data", "data")),
    hint="one entry per dimension: first the examples, then the hidden units",
    explanation="P('data', 'model'): each device holds a (16, 128) block, f32[64@data,256@model].",
)


def _check_replicated_input_collective(answer: object) -> None:
    choices = (*COLLECTIVES, "none")
    assert isinstance(answer, str) and answer in choices, f"answer with one of {choices}; got {answer!r}"
    mesh = _mesh_4x2()
    x = jax.device_put(jnp.zeros((64, 64)), NamedSharding(mesh, PartitionSpec("data", None)))
    w = jax.device_put(jnp.zeros((64, 256)), NamedSharding(mesh, PartitionSpec("model", None)))
    found = collectives(jax.jit(lambda a, b: a @ b).lower(x, w).compile())
    truth = "none" if not found.ops else found.ops[0].kind
    assert answer == truth, (
        f"the compiled program has {', '.join(sorted(found.kinds)) or 'no collective'}, not {answer!r}. "
        "x is whole along its 64 features on every device: what does it cost to keep only the half of them "
        "that matches this device's rows of w?"
    )


replicated_input_collective = Exercise(
    title="Exercise 3: a replicated operand meets a sharded contracting dimension",
    checker=_check_replicated_input_collective,
    solution="all-reduce",
    wrong=("all-gather", "none", "reduce-scatter"),
    hint="slicing an operand that is already whole on a device is free; then count which operands are split on k",
    explanation=(
        "x is replicated across 'model', so each device slices the 32 features that match its 32 rows of w "
        "for free. Now both operands are split on the contracting dimension (case 3): local partial sums, "
        "f32[64@data,256]{U:model} (a (16, 256) block each), added up by an all-reduce over 'model'."
    ),
)
