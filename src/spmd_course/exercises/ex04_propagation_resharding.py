"""Exercises of notebook 04: predict a matmul's collectives, estimate their bytes, read replica groups.

The first two checkers compile on a (4, 2) mesh with Auto axes named ('data', 'model'), built from
the devices JAX runs on, so the verdict is what the compiler does, not a stored answer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import Exercise, plain
from spmd_course.utils.inspecting import COLLECTIVES, collectives

P = PartitionSpec


def _auto_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def _fsdp_program():
    """x @ w with both operands' first dimension cut over all 8 devices, compiled."""
    fsdp = NamedSharding(_auto_mesh(), P(("data", "model"), None))
    x = jax.ShapeDtypeStruct((128, 256), jnp.float32, sharding=fsdp)
    w = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=fsdp)
    return jax.jit(lambda x, w: x @ w).lower(x, w).compile()


# Exercise 1 ---------------------------------------------------------------------------------------------

def _check_predict_collective(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, dict), (
        f"give a dict of collective kind to count, such as {{'all-reduce': 1}}; got {answer!r}"
    )
    unknown = [k for k in answer if k not in COLLECTIVES]
    assert not unknown, f"unknown collective kind(s) {unknown}; the kinds are {list(COLLECTIVES)}"
    assert all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in answer.values()), (
        f"counts must be whole numbers >= 0, such as {{'all-reduce': 1}}; got {answer!r}"
    )
    predicted = {k: n for k, n in answer.items() if n}
    compiled = {k: n for k, n in collectives(_fsdp_program()).counts.items() if n}
    if predicted != compiled:
        if "all-reduce" in predicted:
            raise AssertionError(
                f"you predicted {predicted}, the compiled program has {compiled}. An all-reduce sums partial "
                "products; here x's cut dimension is its rows (not contracting), so no device computes a "
                "partial sum"
            )
        raise AssertionError(f"you predicted {predicted}, but the compiled program has {compiled}")


predict_collective = Exercise(
    title="Exercise 1: predict the collective",
    checker=_check_predict_collective,
    solution={"all-gather": 1},
    wrong=({"all-reduce": 1}, {}, {"all-gather": 2}, {"all-gather": 1, "reduce-scatter": 1}, "all-gather"),
    hint="which operand is cut along the contracting dimension (w's rows, x's columns)? That is case 2",
    explanation=(
        "w is cut along the contracting dimension (its rows) and x is not (x's cut dimension is its rows, which "
        "the output keeps): case 2. Every device all-gathers w over all 8 devices, then multiplies its own 16 "
        "rows of x locally; the output stays P(('data', 'model'), None). This is what FSDP does before each layer."
    ),
)


# Exercise 2 ---------------------------------------------------------------------------------------------

def _ring_estimate_f32() -> float:
    """The ring-formula estimate for the compiled all-gather, counting w's float32 elements at 4 bytes.

    The shape and group size come from the compiled program; the element size is float32's, so the answer
    is the same on a TPU, whose compiler gathers matmul operands as bfloat16.
    """
    (op,) = collectives(_fsdp_program()).ops
    n = op.group_size
    return (n - 1) / n * int(np.prod(op.shapes[0])) * 4


def _check_predict_bytes(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, int | float) and not isinstance(answer, bool), (
        f"give a number of bytes; got {answer!r}"
    )
    assert np.isfinite(answer), f"give a finite number of bytes; got {answer!r}"
    truth = _ring_estimate_f32()
    if abs(float(answer) - truth) > 0.5:
        hints = {
            256 * 512 * 4: "that is the size of the gathered w on each device, not what each device sends",
            256 * 512 * 4 / 8: "that is one device's shard of w; in a ring each device passes on 7 such shards",
            2 * 7 / 8 * 256 * 512 * 4: "that is the all-reduce formula; an all-gather sends (N-1)/N x its result",
            3 / 4 * 256 * 512 * 4: "that takes a group of 4; w is cut over both mesh axes, 8 devices",
        }
        raise AssertionError(hints.get(float(answer), f"{answer} bytes is not the ring-formula estimate"))


predict_bytes = Exercise(
    title="Exercise 2: estimate the bytes",
    checker=_check_predict_bytes,
    solution=7 / 8 * 256 * 512 * 4,
    wrong=(256 * 512 * 4, 256 * 512 * 4 // 8, 2 * 7 / 8 * 256 * 512 * 4, 3 / 4 * 256 * 512 * 4),
    hint="an all-gather over N devices sends (N-1)/N x the bytes it produces; here it produces all of w",
    explanation=(
        "The all-gather produces the whole w, 256 x 512 x 4 B = 512 KiB, on each device, in a group of N = 8: "
        "the ring estimate is 7/8 x 512 KiB = 448 KiB = 458752 bytes sent per device. It is an estimate from "
        "the formula, not a measurement."
    ),
)


# Exercise 3 ---------------------------------------------------------------------------------------------

_GROUPS_TEXT = "[2,4]<=[4,2]T(1,0)"


def _iota_groups() -> set[frozenset[int]]:
    """Decode [2,4]<=[4,2]T(1,0): number 0..7, lay out as [4, 2], transpose, read 2 groups of 4."""
    return {frozenset(g) for g in np.arange(8).reshape(4, 2).T.reshape(2, 4).tolist()}


def _check_read_groups(answer: object) -> None:
    answer = plain(answer)  # a numpy array of positions becomes a tuple of rows
    assert isinstance(answer, tuple | frozenset), (
        f"give a list of groups of mesh positions (0 to 7), such as [{{0, 1}}, {{2, 3}}]; got {answer!r}"
    )
    assert all(isinstance(g, tuple | frozenset) for g in answer), (
        f"each group is a set (or list) of mesh positions, such as {{0, 1}}; got {answer!r}"
    )
    assert all(isinstance(i, int) and not isinstance(i, bool) for g in answer for i in g), (
        f"mesh positions are integers; got {answer!r}"
    )
    groups = [frozenset(g) for g in answer]
    assert all(len(set(g)) == len(g) for g in answer), (
        f"a position appears twice inside one group of {answer!r}: a group lists each device once"
    )
    assert len(set(groups)) == len(groups), (
        f"{sorted(sorted(g) for g in groups)} lists the same group twice: the groups split the 8 devices, so "
        "each position is in exactly one group"
    )
    flat = sorted(i for g in groups for i in g)
    assert flat == list(range(8)), (
        f"the groups hold positions {flat}: the groups split the 8 devices, so each of 0..7 is in exactly one"
    )
    groups_set = set(groups)
    truth = _iota_groups()
    if groups_set == {frozenset(range(4)), frozenset(range(4, 8))}:
        raise AssertionError(
            "that reads 0..7 straight into [2,4]; the T(1,0) says: lay 0..7 out as [4,2] first, then transpose"
        )
    if groups_set == {frozenset({2 * r, 2 * r + 1}) for r in range(4)}:
        raise AssertionError(
            "those are the rows of [4,2], groups over 'model'; the groups are [2,4]: 2 groups of 4, after "
            "the transpose"
        )
    assert groups_set == truth, (
        f"{sorted(sorted(g) for g in groups)} is not it: lay 0..7 out as [4,2], transpose it, and read the rows "
        "of the [2,4] result"
    )


read_groups = Exercise(
    title="Exercise 3: read the replica groups",
    checker=_check_read_groups,
    solution=[{0, 2, 4, 6}, {1, 3, 5, 7}],
    wrong=([{0, 1, 2, 3}, {4, 5, 6, 7}], [{0, 1}, {2, 3}, {4, 5}, {6, 7}], [{0, 4}, {1, 5}, {2, 6}, {3, 7}],
           [{0, 2, 4, 6}], "data", [{0, 2, 4, 6}, {1, 3, 5, 7}, {1, 3, 5, 7}], [[0, 2, 4, 6], [1, 3, 5, 7, 7]]),
    hint="number the devices 0..7, lay them out as [4, 2], transpose to [2, 4], and read each row as a group",
    explanation=(
        "np.arange(8).reshape(4, 2).T is [[0, 2, 4, 6], [1, 3, 5, 7]]: the columns of the (4, 2) mesh, devices "
        "that share a 'model' index and differ in 'data'. So this all-gather runs over 'data', in 2 groups of 4 "
        "(the numbers are positions in the mesh's device order, mesh.devices.flat; they are device ids only "
        "where the mesh lists the devices in id order, as it does on simulated CPU devices but not on a TPU host)."
    ),
)
