"""Exercises of notebook 24, without torch: right answers in torch_xla's other spellings, wrong ones refused.

The checkers compute torch_xla's spec strings with JAX alone, so these run in every environment;
tests/test_exercises.py holds the strings against torch_xla where it is installed (`make test-xla`).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from spmd_course.exercises import ex24_pytorch_xla as ex
from spmd_course.utils.exercises import Verdict


@pytest.mark.parametrize("answer", [("model", None), (("model",), None), (1, None), ((1,), None)])
def test_spec_from_string_accepts_an_axis_by_name_or_by_index(answer):
    """torch_xla's mark_sharding reads an int as the mesh axis of that index: axis 1 of the (4, 2) mesh is 'model'."""
    assert ex.spec_from_string.verdict(answer) is Verdict.CORRECT


@pytest.mark.parametrize(("answer", "says"), [
    ((0, None), "not {devices=[2,1,4]"),  # axis 0 is 'data'
    ((2, None), "its axes are 0 ('data') and 1 ('model')"),
    ((-1, None), "its axes are 0 ('data') and 1 ('model')"),
    ((True, None), "not an axis of the mesh"),  # torch_xla refuses bools and numpy integers (type(p) is int)
    ((np.int64(1), None), "not an axis of the mesh"),
    ((("model", 1), None), "more than once"),
    ((("model", ("data",)), None), "nested tuples"),
])
def test_spec_from_string_refuses_wrong_indices_with_the_reason(answer, says):
    with pytest.raises(AssertionError, match=re.escape(says)):
        ex.spec_from_string.checker(answer)


@pytest.mark.parametrize(("spec", "string"), [
    (("model", None), ex._TARGET),
    ((None, "model"), ex._TARGET_3),
    (("data", "model"), "{devices=[4,2]0,1,2,3,4,5,6,7}"),
    ((None, None), "{replicated}"),
    ((("data", "model"), None), "{devices=[8,1]0,1,2,3,4,5,6,7}"),
])
def test_spec_string_writes_what_the_layout_is(spec, string):
    assert ex.spec_string(spec, (8, 16)) == string


@pytest.mark.parametrize("answer", [P("model", None), P("model"), P(("model",), None)])
def test_linear_weight_spec_accepts_every_spelling(answer):
    assert ex.linear_weight_spec.verdict(answer) is Verdict.CORRECT


@pytest.mark.parametrize("exercise", [ex.linear_weight_spec, ex.spec_from_string, ex.string_from_spec])
def test_every_listed_wrong_answer_is_refused_and_the_solution_accepted(exercise):
    assert exercise.verdict(exercise.solution) is Verdict.CORRECT
    assert all(exercise.verdict(wrong) is Verdict.WRONG for wrong in exercise.wrong)
