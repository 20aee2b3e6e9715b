"""Exercises of notebook 13: training memory (ZeRO stages, mixed precision)."""

from __future__ import annotations

import math

from jax.sharding import PartitionSpec

from spmd_course.utils.exercises import Exercise, answer_errors, plain

# --- Exercise 1: bytes per device under each ZeRO stage --------------------------------------------------------

_PSI = 7_000_000_000  # parameters
_N = 64  # devices
_PARAM, _GRAD, _OPT = 2, 2, 12  # bytes per parameter: bf16 parameters, bf16 gradients, float32 master + mu + nu

_ZERO_1 = (_PARAM + _GRAD) * _PSI + _OPT * _PSI // _N  # 29,312,500,000
_ZERO_2 = _PARAM * _PSI + (_GRAD + _OPT) * _PSI // _N  # 15,531,250,000
_ZERO_3 = (_PARAM + _GRAD + _OPT) * _PSI // _N  # 1,750,000,000


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-3)


def _check_zero_bytes(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, tuple) and len(answer) == 3, (
        f"give a tuple of three numbers (ZeRO-1, ZeRO-2, ZeRO-3), bytes per device; got {answer!r}"
    )
    assert all(isinstance(b, int | float) and not isinstance(b, bool) and math.isfinite(b) for b in answer), (
        f"each entry is a number of bytes; got {answer!r}"
    )
    z1, z2, z3 = answer
    for unit, size in (("GB (10**9 bytes)", 10**9), ("GiB (2**30 bytes)", 2**30), ("MB (10**6 bytes)", 10**6),
                       ("MiB (2**20 bytes)", 2**20)):
        if any(_close(given * size, right) for given, right in zip(answer, (_ZERO_1, _ZERO_2, _ZERO_3), strict=True)):
            raise AssertionError(
                f"those look like {unit}: the question asks for bytes, so multiply by {size:,} "
                "(or count 7e9 parameters x bytes per parameter directly)"
            )
    assert _close(z3, _ZERO_3), (
        f"ZeRO-3: {z3:,} is not it. ZeRO-3 splits everything: (2 + 2 + 12) bytes x 7e9 parameters / 64 devices"
    )
    assert not _close(z1, _PARAM * _PSI + _OPT * _PSI // _N), (
        "ZeRO-1 keeps the whole gradient on every device too: add its 2 bytes per parameter"
    )
    assert not _close(z1, _ZERO_2), "ZeRO-1 does not split the gradient: that is ZeRO-2's step"
    assert _close(z1, _ZERO_1), (
        f"ZeRO-1: {z1:,} is not it. Parameters (2 bytes) and gradients (2 bytes) whole on every device; the "
        "12 bytes of master weights and Adam moments split 64 ways"
    )
    assert not _close(z2, _PARAM * _PSI + _OPT * _PSI // _N), (
        "ZeRO-2 still holds a gradient, but only its 1/64: add 2 x 7e9 / 64 bytes"
    )
    assert _close(z2, _ZERO_2), (
        f"ZeRO-2: {z2:,} is not it. Parameters whole (2 bytes each); gradients and optimizer state "
        "(2 + 12 bytes) split 64 ways"
    )


zero_bytes = Exercise(
    title="Exercise 1: bytes per device under ZeRO-1, 2 and 3",
    checker=_check_zero_bytes,
    solution=(_ZERO_1, _ZERO_2, _ZERO_3),
    wrong=(
        (_ZERO_3, _ZERO_3, _ZERO_3),  # everything divided at every stage
        (_ZERO_2, _ZERO_2, _ZERO_3),  # ZeRO-1 splitting the gradient
        (_PARAM * _PSI + _OPT * _PSI // _N, _ZERO_2, _ZERO_3),  # ZeRO-1 without the gradient
        (_ZERO_1, _PARAM * _PSI + _OPT * _PSI // _N, _ZERO_3),  # ZeRO-2 without its gradient slice
        (16 * _PSI, 16 * _PSI, 16 * _PSI // _N),  # nothing split before ZeRO-3
        (29.3125, 15.53125, 1.75),  # gigabytes (10**9 bytes)
        (_ZERO_1 / 2**30, _ZERO_2 / 2**30, _ZERO_3 / 2**30),  # gibibytes: 27.30, 14.46, 1.63
        (round(_ZERO_1 / 2**30, 2), round(_ZERO_2 / 2**30, 2), round(_ZERO_3 / 2**30, 2)),  # the same, as printed
        (_ZERO_1, _ZERO_2, _ZERO_3 / 2**30),  # one entry in GiB
        (_ZERO_1 / 10**6, _ZERO_2 / 10**6, _ZERO_3 / 10**6),  # megabytes
    ),
    hint="per device: (what a stage keeps whole) x 7e9 + (what it splits) x 7e9 / 64, with 2 + 2 + 12 bytes",
    explanation=(
        "29.3, 15.5 and 1.75 GB: ZeRO-1 divides only the 12 optimizer bytes, ZeRO-2 also the gradient's 2, "
        "ZeRO-3 all 16, which is 16/64 = 0.25 bytes per parameter per device."
    ),
)


# --- Exercise 2: the three stages as PartitionSpecs -------------------------------------------------------------

def _entries(spec: PartitionSpec, ndim: int = 3) -> tuple:
    return tuple(spec) + (None,) * (ndim - len(spec))


def _check_zero_specs(fn: object) -> None:
    assert callable(fn), f"give a function zero_specs(stage) that returns three PartitionSpecs; got {fn!r}"
    expected = {1: (False, False, True), 2: (False, True, True), 3: (True, True, True)}
    names = ("the parameter", "the gradient", "the Adam moments")
    for stage, splits in expected.items():
        with answer_errors(f"zero_specs({stage})"):
            specs = plain(fn(stage))  # a list of three specs is as good as a tuple
        assert isinstance(specs, tuple) and len(specs) == 3, (
            f"zero_specs({stage}) must return a tuple of three PartitionSpecs; got {specs!r}"
        )
        for name, spec, split in zip(names, specs, splits, strict=True):
            assert isinstance(spec, PartitionSpec), (
                f"zero_specs({stage}): {name}'s spec must be a PartitionSpec such as P() or P(None, 'data'); "
                f"got {spec!r}"
            )
            assert len(spec) <= 3, f"zero_specs({stage}): {spec} has more entries than the kernel's 3 dimensions"
            entries = _entries(spec)
            assert all(e in (None, "data") for e in entries), (
                f"zero_specs({stage}): {spec} names an axis other than 'data'"
            )
            assert entries[0] is None, (
                f"zero_specs({stage}): {spec} splits the layer axis, so each device would hold whole layers of its "
                "own; split a dimension inside the layer, P(None, 'data'), so that every device holds a slice of "
                "every layer"
            )
            assert entries.count("data") <= 1, f"zero_specs({stage}): {spec} uses 'data' on two dimensions"
            if split:
                assert "data" in entries, f"ZeRO-{stage} splits {name}: give it P(None, 'data'), not {spec}"
            else:
                assert "data" not in entries, (
                    f"ZeRO-{stage} keeps {name} whole on every device: P(), not {spec}"
                )


def _solution_zero_specs(stage):
    split = {1: (False, False, True), 2: (False, True, True), 3: (True, True, True)}[stage]
    return tuple(PartitionSpec(None, "data") if s else PartitionSpec() for s in split)


zero_specs = Exercise(
    title="Exercise 2: ZeRO stages as PartitionSpecs",
    checker=_check_zero_specs,
    solution=_solution_zero_specs,
    wrong=(
        # the layer axis split
        lambda stage: tuple(PartitionSpec("data") if s else PartitionSpec()
                            for s in {1: (0, 0, 1), 2: (0, 1, 1), 3: (1, 1, 1)}[stage]),
        # the stages shifted by one: ZeRO-1 already splits the gradient
        lambda stage: _solution_zero_specs(min(stage + 1, 3)),
        # everything split at every stage
        lambda stage: _solution_zero_specs(3),
        # the parameter split from ZeRO-2 on, the gradient only at ZeRO-3
        lambda stage: (_solution_zero_specs(3)[0] if stage >= 2 else PartitionSpec(),
                       _solution_zero_specs(3)[1] if stage == 3 else PartitionSpec(), PartitionSpec(None, "data")),
        # two specs, not three: the gradient's forgotten
        lambda stage: _solution_zero_specs(stage)[::2],
        # a stage the function does not know: it raises
        lambda stage: _solution_zero_specs({1: 1, 2: 2}[stage]),
    ),
    hint="ZeRO-1 splits the optimizer state, ZeRO-2 also the gradient, ZeRO-3 also the parameter; split = "
    "P(None, 'data'), whole = P()",
    explanation=(
        "Each stage is a choice of which arrays get P(None, 'data'): the same model and step, three sharding "
        "rules, and the compiler inserts the collectives each one needs."
    ),
)
