"""Exercises of notebook 26: how much slower a published plan is than the planner's top plan, and on which term."""

from __future__ import annotations

import math

from spmd_course.utils import stored_plans
from spmd_course.utils.exercises import Exercise, near, plain, positive_number

_ROW = "v5e 128B 1x v5e-256"
_PARTS = ("compute", "memory", "exposed communication", "host transfers")


def _plans() -> tuple[dict, dict]:
    """(the planner's top plan, the published plan) of the row, from the stored rankings."""
    entry = stored_plans.load()["published"][_ROW]
    return entry["plans"][0], entry["plans"][entry["published_place"] - 1]


def _slowdown() -> float:
    top, published = _plans()
    return published["step_seconds"] / top["step_seconds"] - 1


def _check_published_slowdown(answer: object) -> None:
    answer = plain(answer)
    top, published = _plans()
    x = positive_number(answer, "the fraction")
    assert not near(x, published["step_seconds"] / top["step_seconds"], 0.005), (
        "that is the ratio of the two steps; subtract 1 for how much longer"
    )
    assert not 1 < x < 100, f"give a fraction, not a percentage: {x!r}% is {x / 100!r}"
    assert not near(x, 1 - top["step_seconds"] / published["step_seconds"], 0.005), (
        "that is the top plan's saving as a fraction of the published step: divide by the top plan's step instead"
    )
    assert near(x, _SLOWDOWN, 0.01), (
        f"{x!r} is not it: (published step - top step) / top step, from the two plans' step_seconds"
    )


_SLOWDOWN = _slowdown()


published_slowdown = Exercise(
    title="Exercise 1: how much slower the published plan is",
    checker=_check_published_slowdown,
    solution=_SLOWDOWN,
    wrong=(_SLOWDOWN + 1, 1 - 1 / (1 + _SLOWDOWN), 100 * _SLOWDOWN, 0.5),
    hint="entry['plans'][0] is the top plan, entry['plans'][entry['published_place'] - 1] the published one",
    explanation=(
        "About 0.087: 16.6 s against 15.3 s. The planner's reason line says the same (+8.7%), and the next "
        "exercise finds the term behind it."
    ),
)


def _losing_term() -> tuple[str, float]:
    top, published = _plans()
    gaps = {part: published["parts"][part] - top["parts"][part] for part in _PARTS}
    name = max(gaps, key=gaps.get)
    return name, gaps[name]


def _check_losing_term(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, (tuple, list)) and len(answer) == 2, f"give a pair (part, seconds); got {answer!r}"
    name, seconds = answer
    assert isinstance(name, str) and name in _PARTS, f"the part is one of {', '.join(_PARTS)}; got {name!r}"
    published = _plans()[1]
    right_name, right_seconds = _TERM
    biggest = max(_PARTS, key=lambda part: published["parts"][part])
    assert not (name == biggest != right_name), (
        f"{name} is the published plan's largest part, but the top plan spends about as long on it: compare the "
        "two plans part by part"
    )
    assert name == right_name, f"the published plan does not lose most on {name}: subtract the top plan's parts"
    seconds = positive_number(seconds, "the seconds")
    assert near(seconds, right_seconds, 0.02), (
        f"{seconds!r} s is not the difference: the published plan's {name} minus the top plan's"
    )


_TERM = _losing_term()


losing_term = Exercise(
    title="Exercise 2: on which term the published plan loses",
    checker=_check_losing_term,
    solution=_TERM,
    wrong=(("compute", 0.0), ("exposed communication", 0.68), (_TERM[0], 2 * _TERM[1]), (_TERM[0], math.pi)),
    hint="for each part, published['parts'][part] - top['parts'][part]; the largest difference is the answer",
    explanation=(
        "Memory, about +2.0 s of estimated HBM time. The pure FSDP plan has the longer exposed communication, "
        "by about 0.7 s, but that is less than what the 16 x 16 plan loses on memory, so it wins. The reason "
        "line under the row says the same: 'it loses most on memory, +2.02 s'."
    ),
)
