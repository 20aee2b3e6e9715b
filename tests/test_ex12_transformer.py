"""Valid answers to notebook 12's exercises that a checker once rejected: each must stay accepted."""

import pytest

from spmd_course.exercises import ex12_transformer as ex
from spmd_course.utils.exercises import Verdict

SOLUTION = dict(ex.fsdp_tensor_rules.solution)


def _rules(**targets):
    """The reference rule table with some targets written another way."""
    return tuple((name, targets.get(name, target)) for name, target in SOLUTION.items())


@pytest.mark.parametrize(
    "rules",
    [
        _rules(batch=("data",)),  # was rejected: a one-axis tuple is the same rule as the axis name
        _rules(batch=("data",), embed=("data",), vocab=("model",), heads=("model",), mlp=("model",)),
        _rules(batch=["data"]),  # NNX accepts a list of axes too
        [list(pair) for pair in SOLUTION.items()],  # the table as a list of lists
        tuple(reversed(SOLUTION.items())),  # rules in another order
    ],
    ids=["batch ('data',)", "all as 1-tuples", "batch ['data']", "lists", "reversed"],
)
def test_ex12_fsdp_tensor_rules_accepts_every_spelling_of_the_rules(rules):
    outcome = ex.fsdp_tensor_rules.outcome(rules)
    assert outcome.verdict is Verdict.CORRECT, outcome.error

