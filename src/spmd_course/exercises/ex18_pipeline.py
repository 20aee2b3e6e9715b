"""Exercises of the pipeline notebook: the bubble, the micro-batches it takes, which layers a stage holds."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from spmd_course.utils.exercises import Exercise, answer_errors, plain


def _number(answer: object, what: str) -> float:
    answer = plain(answer)
    assert isinstance(answer, int | float | Fraction) and not isinstance(answer, bool), (
        f"give {what} as a number; got {answer!r}"
    )
    return float(answer)


# Exercise 1: GPipe with P = 4 stages and M = 12 micro-batches.
_P, _M = 4, 12
_BUBBLE = (_P - 1) / (_M + _P - 1)  # 3 / 15


def _check_bubble(answer: object) -> None:
    value = _number(answer, "the idle fraction, between 0 and 1")
    assert 0 <= value <= 1, f"a fraction of the iterations lies between 0 and 1; got {value}"
    assert abs(value - (1 - _BUBBLE)) > 1e-6, (
        "that is the busy fraction, M / (M + P - 1): the question asks the idle one"
    )
    assert abs(value - (_P - 1) / _M) > 1e-6, (
        "(P - 1) / M is the idle time relative to the useful time, not a fraction of the loop: the loop runs "
        "M + P - 1 iterations"
    )
    assert abs(value - _P / (_M + _P)) > 1e-6, "P - 1 stages wait, not P: the loop runs M + P - 1 iterations"
    assert abs(value - _BUBBLE) < 1e-6, (
        f"{value} is not it: every device runs the loop's M + P - 1 = {_M + _P - 1} iterations, and is idle in "
        f"P - 1 = {_P - 1} of them"
    )


bubble_fraction = Exercise(
    title="Exercise 1: GPipe's bubble",
    checker=_check_bubble,
    solution=_BUBBLE,
    wrong=(1 - _BUBBLE, (_P - 1) / _M, _P / (_M + _P), 0.3, 3),
    hint="count the loop's iterations, M + P - 1, and the ones in which a stage has no micro-batch, P - 1",
    explanation="3 of 15 iterations, 20%: each device waits for the pipeline to fill and then to drain.",
)


# Exercise 2: the fewest micro-batches for a bubble of at most 10%, with 8 stages: GPipe, and 4 passes.
def _fewest(stages: int, passes: int, limit: float = 0.1) -> int:
    m = 1
    while (stages - 1) / (passes * m + stages - 1) > limit + 1e-12:
        m += 1
    return m


_GPIPE, _CIRCULAR = _fewest(8, 1), _fewest(8, 4)  # 63 and 16


def _check_needed(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, tuple | list) and len(answer) == 2, (
        f"give a pair (micro-batches for GPipe, micro-batches for the circular schedule with 4 passes); got {answer!r}"
    )
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in answer), (
        f"micro-batches are whole numbers; got {answer!r}"
    )
    gpipe, circular = answer
    for name, m, passes, best in (("GPipe", gpipe, 1, _GPIPE), ("circular", circular, 4, _CIRCULAR)):
        bubble = 7 / (passes * m + 7) if m > 0 else 1.0
        assert m != 70 or passes != 1, (
            "70 comes from (P - 1) / M <= 10%, the bubble relative to the useful time; the fraction of the loop "
            "is (P - 1) / (M + P - 1)"
        )
        assert bubble <= 0.1 + 1e-12, (
            f"{name}: with {m} micro-batches the bubble is {bubble:.1%}, above 10% "
            f"(P - 1 = 7 idle iterations of {passes} x M + 7)"
        )
        assert m == best, (
            f"{name}: {m} micro-batches give a bubble of {bubble:.1%}, within 10%, but fewer do too: find the "
            "smallest"
        )


micro_batches_needed = Exercise(
    title="Exercise 2: micro-batches for a 10% bubble",
    checker=_check_needed,
    solution=(_GPIPE, _CIRCULAR),
    wrong=((70, 18), (64, 16), (63, 63), (62, 16), (63, 15), (16, 63), (63, 18)),
    hint="solve 7 / (M + 7) <= 0.1 for GPipe, and 7 / (4 M + 7) <= 0.1 with 4 passes; round up",
    explanation=(
        "63 and 16: four passes divide the micro-batches needed by about four, at four times the sends. Smaller "
        "micro-batches also mean smaller matmuls, so M cannot grow forever."
    ),
)


# Exercise 3: which layers to_stages gives a stage.
def _placement(stage: int, stages: int, repeats: int, layers: int) -> list[int]:
    """What to_stages does to a stack numbered 0..layers-1: reshape (repeats, stages, chunk), swap the first two."""
    order = np.arange(layers).reshape(repeats, stages, -1).swapaxes(0, 1)
    return [int(v) for v in order[stage].reshape(-1)]


_CASES = ((0, 8, 1, 32), (3, 8, 1, 32), (3, 8, 2, 32), (7, 8, 2, 32), (1, 4, 2, 16), (2, 4, 3, 24), (0, 2, 4, 8))


def _check_layers(answer: object) -> None:
    assert callable(answer), f"give a function layers_of(stage, stages, repeats, layers); got {answer!r}"
    for stage, stages, repeats, layers in _CASES:
        call = f"layers_of({stage}, {stages}, {repeats}, {layers})"
        with answer_errors(call):
            raw = answer(stage, stages, repeats, layers)
        try:
            got = [int(v) for v in np.asarray(raw).reshape(-1)] if raw is not None else None
        except (TypeError, ValueError):
            got = None
        assert got is not None, f"{call} must return a list of layer numbers; got {raw!r}"
        want = _placement(stage, stages, repeats, layers)
        assert len(got) == len(want), (
            f"{call} returned {len(got)} layers; each stage holds layers / stages = {len(want)}"
        )
        assert repeats == 1 or got != list(range(stage * len(want), (stage + 1) * len(want))), (
            f"{call} returned {got}: consecutive layers, as GPipe places them; with {repeats} passes each stage "
            f"holds {repeats} chunks, one per pass round the ring"
        )
        assert sorted(got) == sorted(want), f"{call} returned {got}; to_stages gives that stage {want}"
        assert got == want, (
            f"{call} returned the right layers in the wrong order, {got}: the stage runs its chunk of the first "
            f"pass first, each chunk's layers in order: {want}"
        )


def _solution_layers(stage, stages, repeats, layers):
    chunk = layers // (stages * repeats)
    return [(v * stages + stage) * chunk + j for v in range(repeats) for j in range(chunk)]


stage_layers = Exercise(
    title="Exercise 3: the layers of a stage",
    checker=_check_layers,
    solution=_solution_layers,
    wrong=(
        lambda s, p, r, n: list(range(s * n // p, (s + 1) * n // p)),  # GPipe's placement for every schedule
        lambda s, p, r, n: list(range(s, n, p)),  # every P-th layer: right only for chunks of one layer
        lambda s, p, r, n: _solution_layers(s, p, r, n)[::-1],  # the right layers, backwards
        lambda s, p, r, n: [(s * r + v) * (n // (p * r)) + j for v in range(r) for j in range(n // (p * r))],
        lambda s, p, r, n: [v + 1 for v in _solution_layers(s, p, r, n)],  # numbered from 1
    ),
    hint="cut the stack into stages x repeats chunks of layers / (stages x repeats) layers; stage s holds chunks "
    "s, s + stages, s + 2 stages, ...; chunk c is layers c x chunk to (c + 1) x chunk - 1",
    explanation=(
        "Stage s holds chunks s, s + P, ...: a micro-batch's pass v runs chunk v P + s on stage s, so after the "
        "last stage it comes back round to stage 0 for the next chunk."
    ),
)
