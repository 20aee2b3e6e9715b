"""Exercise 2 of notebook 11 (the FSDP step by hand in shard_map): each listed wrong answer is rejected for
its own reason. (tests/test_exercises.py runs the listed wrong answers too; here each is named.)"""

import pytest

from spmd_course.exercises import ex11_fsdp_step as ex
from spmd_course.utils.exercises import Verdict

# Exercise 2 (FSDP by hand in shard_map): each listed wrong answer is rejected for its own reason, so a checker
# that starts rejecting them all for one generic reason (a crash turned into a message) fails here.
BY_HAND_REASONS = {
    "_wrong_psum_then_slice": "all-reduces whole kernel gradients",
    "_wrong_psum_no_slice": "have shape (512, 256), not (64, 256)",
    "_wrong_not_scaled": "8 times the full-batch gradient",
    "_wrong_mean_of_grads": "0.125 times the full-batch gradient",
    "_wrong_gather_axis": "dot_general",
    "_wrong_untiled": "dot_general",
    "_wrong_scatter_dimension": "must be divisible",
    "_wrong_local_loss": "out_specs",
}


def test_fsdp_by_hand_lists_every_named_mistake():
    assert sorted(f.__name__ for f in ex.fsdp_by_hand.wrong) == sorted(BY_HAND_REASONS)


@pytest.mark.parametrize("name", sorted(BY_HAND_REASONS))
def test_fsdp_by_hand_rejects_each_mistake_for_its_reason(name):
    outcome = ex.fsdp_by_hand.outcome(getattr(ex, name))
    assert outcome.verdict is Verdict.WRONG, f"{name}: {outcome.verdict}"
    assert BY_HAND_REASONS[name] in str(outcome.error), str(outcome.error)


def test_fsdp_by_hand_hint_only_after_a_wrong_answer(capsys):
    from spmd_course.utils.exercises import NOT_ANSWERED

    ex.fsdp_by_hand.check(NOT_ANSWERED)
    assert "psum_scatter" not in capsys.readouterr().out  # the method is not given away before a try
    ex.fsdp_by_hand.check(ex._wrong_psum_then_slice)
    assert "Hint:" in capsys.readouterr().out
