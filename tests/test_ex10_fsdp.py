"""Exercise 1 of notebook 10 (the FSDP rule): the checker's test state catches each near miss, and accepts the
rule written the ways learners commonly write it. (tests/test_exercises.py runs the listed wrong answers too;
here each is named, so a failure says which mistake slipped through.)"""

import math

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from spmd_course.exercises import ex10_fsdp as ex
from spmd_course.utils.exercises import Verdict


def _first_divisible(leaf, by=8, more_than=1024):
    if leaf.size > more_than:
        for dim, size in enumerate(leaf.shape):
            if size % by == 0:
                return P(*[None] * dim, "fsdp")
    return P()


def _full_spec(path, leaf):  # every dimension named, the trailing ones None
    spec = _first_divisible(leaf)
    return P(*(list(spec) + [None] * (leaf.ndim - len(spec))))


def _last_divisible(path, leaf):  # any dimension 8 divides is right, not only the first
    dims = [d for d, n in enumerate(leaf.shape) if n % 8 == 0]
    if math.prod(leaf.shape) > 1024 and dims:
        return P(*[None] * dims[-1], "fsdp")
    return P()


def _numpy_sizes(path, leaf):  # np.prod for the size, >= 1025 for "more than 1,024"
    if int(np.prod(leaf.shape)) >= 1025:
        for dim, size in enumerate(leaf.shape):
            if size % 8 == 0:
                return P(*[None] * dim, ("fsdp",))
    return P()


NEAR_MISSES = {
    "divisible by 4, not by the 8 devices": lambda path, leaf: _first_divisible(leaf, by=4),
    "divisible by 16": lambda path, leaf: _first_divisible(leaf, by=16),
    "a threshold of 1,500 elements": lambda path, leaf: _first_divisible(leaf, more_than=1500),
    "a threshold of 2,000 elements": lambda path, leaf: _first_divisible(leaf, more_than=2000),
    "1,024 elements counted as large": lambda path, leaf: _first_divisible(leaf, more_than=1023),
}


@pytest.mark.parametrize("mistake", sorted(NEAR_MISSES))
def test_each_near_miss_is_rejected_with_a_message(mistake):
    outcome = ex.fsdp_rule.outcome(NEAR_MISSES[mistake])
    assert outcome.verdict is Verdict.WRONG, f"{mistake}: {outcome.verdict}"
    assert str(outcome.error).strip()


@pytest.mark.parametrize("rule", [lambda path, leaf: _first_divisible(leaf), _full_spec, _last_divisible,
                                  _numpy_sizes], ids=["first divisible", "full spec", "last divisible", "numpy"])
def test_right_rules_written_other_ways_are_accepted(rule):
    assert ex.fsdp_rule.outcome(rule).verdict is Verdict.CORRECT


def test_the_listed_wrong_answers_include_the_near_misses():
    # the 4-, 1,500- and 2,000- variants are in the exercise's own list, so the generic test runs them as well
    assert len(ex.fsdp_rule.wrong) >= 11
