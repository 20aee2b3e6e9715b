"""Valid answers to notebook 17's exercises that a checker once rejected, or could: each must stay accepted.

Exercise 2 used to ask for one mesh shape and compared it with footprints measured once, on one line's
CPU compiler, 0.5 MiB from the budget: a learner whose own table (another jax line, real devices) put
that shape just over the budget answered correctly and was marked wrong. The exercise now asks for the
choice as a function, and the checker tries it on tables of its own, so its verdict does not depend on
what any machine measured.
"""

import pytest

from spmd_course.exercises import ex17_mesh_shape as ex
from spmd_course.utils.exercises import Verdict


def choose_with_a_loop(table, budget):
    best = None
    for name, (size, count) in table.items():
        if size <= budget and (best is None or (count, size) < (table[best][1], table[best][0])):
            best = name
    return best


def choose_by_sorting(table, budget):
    fits = sorted((count, size, name) for name, (size, count) in table.items() if size <= budget)
    return fits[0][2] if fits else None


def choose_from_a_table_measured_elsewhere(table, budget):
    """A correct rule, written by a learner whose footprints differ from this machine's."""
    candidates = {name: value for name, value in table.items() if value[0] <= budget}
    if not candidates:
        return None
    fewest = min(count for _, count in candidates.values())
    return min((size, name) for name, (size, count) in candidates.items() if count == fewest)[1]


@pytest.mark.parametrize("choose", [choose_with_a_loop, choose_by_sorting, choose_from_a_table_measured_elsewhere])
def test_ex17_choose_layout_accepts_every_correct_rule(choose):
    outcome = ex.choose_layout.outcome(choose)
    assert outcome.verdict is Verdict.CORRECT, outcome.error


def test_ex17_choose_layout_reads_no_measured_footprints():
    assert not hasattr(ex, "_FOOTPRINT")  # the once hard-coded table of one machine's measurements
    for table, budget, want in ex._CASES:
        assert ex._choose(table, budget) == want


@pytest.mark.parametrize("answer", [[ex._two_d(4, 16), ex._fsdp_tp(4, 16)]], ids=["a list"])
def test_ex17_state_bytes_accepts_a_list(answer):
    assert ex.state_bytes.outcome(answer).verdict is Verdict.CORRECT
