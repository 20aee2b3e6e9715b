"""Exercises of notebook 08: the column/row pairing and what tensor parallelism sends."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import Exercise, answer_errors, plain
from spmd_course.utils.inspecting import COLLECTIVES, collectives


def _model_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((8,), ("model",), axis_types=(AxisType.Auto,))


def _check_row_parallel_spec(spec: object) -> None:
    assert isinstance(spec, PartitionSpec), f"expected a PartitionSpec such as P(...); got {type(spec).__name__}"
    mesh = _model_mesh()
    assert len(spec) <= 2, f"{spec} has {len(spec)} entries, but the kernel has only 2 dimensions"
    with answer_errors(f"{spec}, laying out a (256, 10) kernel on this mesh,"):
        given = NamedSharding(mesh, spec)
        shard = given.shard_shape((256, 10))  # unknown axis, an axis used twice, uneven sizes
    row_parallel = NamedSharding(mesh, PartitionSpec("model", None))
    assert given.is_equivalent_to(row_parallel, 2), (
        f"{spec} gives each device a {shard} block of the (256, 10) kernel; row-parallel means each device "
        "holds some of the 256 rows (the hidden units that linear1 computed on it) and all 10 columns"
    )


row_parallel_spec = Exercise(
    title="Exercise 1: make the second kernel row-parallel",
    checker=_check_row_parallel_spec,
    solution=PartitionSpec("model", None),
    wrong=(PartitionSpec(None, "model"), PartitionSpec(), "model", PartitionSpec("model", "model")),
    hint="device k computed hidden units 32k to 32k+31; which part of linear2/kernel multiplies exactly those?",
    explanation=(
        "P('model', None) gives each device the 32 rows of linear2/kernel that match its 32 hidden units, "
        "so the second matmul is a local partial sum and one all-reduce finishes it."
    ),
)


def _check_column_column_collective(answer: object) -> None:
    choices = (*COLLECTIVES, "none")
    assert isinstance(answer, str) and answer in choices, f"answer with one of {choices}; got {answer!r}"
    mesh = _model_mesh()
    h = jax.device_put(jnp.zeros((64, 256)), NamedSharding(mesh, PartitionSpec(None, "model")))
    w2 = jax.device_put(jnp.zeros((256, 64)), NamedSharding(mesh, PartitionSpec(None, "model")))
    found = collectives(jax.jit(lambda a, b: a @ b).lower(h, w2).compile())
    truth = "none" if not found.ops else found.ops[0].kind
    assert answer == truth, (
        f"the compiled program has {', '.join(sorted(found.kinds)) or 'no collective'}, not {answer!r}. "
        "h is sharded on the contracting dimension (256), w2 is not: which operand must become whole?"
    )


column_column_collective = Exercise(
    title="Exercise 2: two column-parallel layers in a row",
    checker=_check_column_column_collective,
    solution="all-gather",
    wrong=("all-reduce", "none", "reduce-scatter"),
    hint="only one operand is sharded on the contracting dimension; w2's 'model' axis is on its output columns",
    explanation=(
        "h is split on the 256 hidden units, w2 is split on its output columns: no device has the matching "
        "pieces of the sum, so the compiler all-gathers h to (64, 256) on every device first."
    ),
)


def _check_tp_allreduce_bytes(n: object) -> None:
    n = plain(n)
    assert isinstance(n, int) and not isinstance(n, bool), f"give a whole number of bytes; got {n!r}"
    assert n != 2 * 7 * 1024 * 10 * 4 // 8, (
        "that is the ring estimate of what each device sends, 2(N-1)/N x the result; the question asks for the "
        "bytes the all-reduce produces"
    )
    assert n == 1024 * 10 * 4, (
        f"{n} bytes is not it: the all-reduce adds up partial logits, one float32 per example and class, "
        "and its result is replicated (whole) on every device"
    )


tp_allreduce_bytes = Exercise(
    title="Exercise 3: bytes of the tensor-parallel all-reduce",
    checker=_check_tp_allreduce_bytes,
    solution=1024 * 10 * 4,
    wrong=(1024 * 256 * 4, 1024 * 10 * 4 // 8, (64 * 256 + 256 + 256 * 10 + 10) * 4, 2 * 7 * 1024 * 10 * 4 // 8,
           2 * 1024 * 10 * 4),
    hint="what does the all-reduce add up: the hidden activations, the logits, or the gradients?",
    explanation=(
        "The all-reduce produces the (1024, 10) float32 logits on every device: 40960 bytes, 16 times the "
        "2560 bytes at batch 64. The ring formula estimates that each device sends 2 x 7/8 of that."
    ),
)
