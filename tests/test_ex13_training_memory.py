"""Notebook 13's exercise 1 asks for bytes: a right answer written another way is accepted, and an answer in
another unit (GB, GiB, MB, MiB: learners divide by either) is rejected with a hint that names the unit."""

import numpy as np
import pytest

from spmd_course.exercises import ex13_training_memory as ex
from spmd_course.utils.exercises import Verdict

RIGHT = ex.zero_bytes.solution  # (29,312,500,000, 15,531,250,000, 1,750,000,000)


@pytest.mark.parametrize("answer", [
    RIGHT,
    list(RIGHT),
    tuple(np.int64(b) for b in RIGHT),
    np.array(RIGHT),
    (2.93125e10, 1.553125e10, 1.75e9),  # scientific notation
    (4 * 7e9 + 12 * 7e9 / 64, 2 * 7e9 + 14 * 7e9 / 64, 16 * 7e9 / 64),  # the arithmetic, as floats
    (29_312_500_000, 15_531_250_000, 1_750_000_000),
], ids=["ints", "list", "numpy ints", "numpy array", "1e notation", "arithmetic", "underscores"])
def test_right_answer_in_bytes_is_accepted_however_written(answer):
    outcome = ex.zero_bytes.outcome(answer)
    assert outcome.verdict is Verdict.CORRECT, outcome.error


@pytest.mark.parametrize("answer, unit", [
    ((29.3125, 15.53125, 1.75), "GB"),
    (tuple(b / 2**30 for b in RIGHT), "GiB"),
    ((27.3, 14.46, 1.63), "GiB"),  # GiB as format_bytes prints them, rounded
    ((RIGHT[0], RIGHT[1], RIGHT[2] / 2**30), "GiB"),  # one entry in GiB
    (tuple(b / 2**20 for b in RIGHT), "MiB"),
    (tuple(b / 10**6 for b in RIGHT), "MB"),
], ids=["GB", "GiB", "GiB rounded", "one GiB", "MiB", "MB"])
def test_an_answer_in_another_unit_gets_a_hint_naming_it(answer, unit):
    outcome = ex.zero_bytes.outcome(answer)
    assert outcome.verdict is Verdict.WRONG
    assert f"look like {unit} " in str(outcome.error) and "bytes" in str(outcome.error)


def test_every_listed_wrong_answer_is_rejected():
    for wrong in ex.zero_bytes.wrong:
        assert ex.zero_bytes.verdict(wrong) is Verdict.WRONG, wrong
