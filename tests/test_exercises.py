"""Every exercise's checker accepts its reference solution and rejects every listed wrong answer.

This is what keeps a checker from rotting: if a library change makes the reference
answer fail, or makes the checker accept anything, this test fails. A wrong answer
must be rejected by an AssertionError (a verdict with a message for the learner),
not by the checker crashing on it.
"""

import importlib
import pkgutil

import pytest

import exercises
from utils.exercises import NOT_ANSWERED, Exercise, Outcome, Verdict


def _all_exercises() -> list[tuple[str, Exercise]]:
    found = []
    for info in sorted(pkgutil.iter_modules(exercises.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"exercises.{info.name}")
        for name, value in sorted(vars(module).items()):
            if isinstance(value, Exercise):
                found.append((f"{info.name}.{name}", value))
    return found


EXERCISES = _all_exercises()


def test_every_notebook_with_exercises_has_at_least_two():
    per_module: dict[str, int] = {}
    for qualname, _ in EXERCISES:
        per_module[qualname.split(".")[0]] = per_module.get(qualname.split(".")[0], 0) + 1
    assert per_module, "no exercises found"
    assert all(n >= 2 for n in per_module.values()), per_module


def _describe(outcome: Outcome) -> str:
    return f"{outcome.verdict.value}: {type(outcome.error).__name__}: {outcome.error}" if outcome.error else "no error"


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_reference_solution_passes(qualname, exercise, capsys):
    outcome = exercise.outcome(exercise.solution)
    assert outcome.verdict is Verdict.CORRECT, f"{qualname} rejects its own solution ({_describe(outcome)})"
    assert exercise.check(exercise.solution) is True
    assert capsys.readouterr().out.startswith(f"[{exercise.title}] correct.")


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_wrong_answers_fail_with_a_message(qualname, exercise, capsys):
    problems = []
    for i, wrong in enumerate(exercise.wrong):
        outcome = exercise.outcome(wrong)
        if outcome.verdict is not Verdict.WRONG:
            problems.append(f"wrong[{i}] {wrong!r}: {_describe(outcome)}")
        elif not str(outcome.error).strip():
            problems.append(f"wrong[{i}] {wrong!r}: rejected by an AssertionError with no message for the learner")
    assert not problems, f"{qualname}: wrong answers not rejected by an AssertionError:\n" + "\n".join(problems)
    assert exercise.check(exercise.wrong[0]) is False
    assert capsys.readouterr().out.startswith(f"[{exercise.title}] not yet: ")


def _raises_name_error(*args, **kwargs):
    return undefined_name  # noqa: F821 - a learner's typo


# Answers of the wrong kind, or functions that fail: each checker must answer them with a message, not crash.
ODD_ANSWERS = {
    "None": None, "a string": "nonsense", "a float": 3.5, "a negative int": -1, "True": True,
    "a mixed list": [1, "a"], "a dict": {"a": 1}, "a function returning None": lambda *a, **k: None,
    "a function returning a string": lambda *a, **k: "x", "a function that raises": _raises_name_error,
}


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_answers_of_the_wrong_kind_get_a_message(qualname, exercise):
    problems = []
    for label, odd in ODD_ANSWERS.items():
        outcome = exercise.outcome(odd)
        if outcome.verdict is not Verdict.WRONG:
            problems.append(f"{label}: {_describe(outcome)}")
    assert not problems, f"{qualname} does not reject every odd answer with a message:\n" + "\n".join(problems)


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_placeholder_gets_a_nudge(qualname, exercise, capsys):
    assert exercise.verdict(NOT_ANSWERED) is Verdict.NOT_ANSWERED
    assert exercise.check(NOT_ANSWERED) is False
    assert "not answered yet" in capsys.readouterr().out


def _toy(checker) -> Exercise:
    return Exercise(title="Toy", checker=checker, solution=1, wrong=(2,), hint="think")


# The toy checkers raise AssertionError themselves: pytest rewrites assert statements in this file.
def _is_one(answer):
    if answer != 1:
        raise AssertionError(f"{answer} is not 1")


def _crashes_on_strings(answer):
    if answer + 0 != 1:  # a str answer raises TypeError here: the checker never validated its kind
        raise AssertionError("not 1")


def test_four_verdicts_are_told_apart(capsys):
    ex = _toy(_crashes_on_strings)
    assert [ex.verdict(a) for a in (1, 2, NOT_ANSWERED, "1")] == [
        Verdict.CORRECT, Verdict.WRONG, Verdict.NOT_ANSWERED, Verdict.CHECKER_ERROR]
    outcome = ex.outcome("1")
    assert isinstance(outcome.error, TypeError)
    assert ex.outcome(2).error.args == ("not 1",)
    assert capsys.readouterr().out == ""  # outcome and verdict never print


def test_check_reports_a_checker_error_as_the_checkers_failure(capsys):
    assert _toy(_crashes_on_strings).check("1") is False
    out = capsys.readouterr().out
    assert out.startswith("[Toy] checker error: the checker itself failed")
    assert "TypeError" in out and "test_exercises.py:" in out
    assert "not yet" not in out and "Hint" not in out


def test_check_prints_the_checkers_message_and_the_hint(capsys):
    assert _toy(_is_one).check(2) is False
    assert capsys.readouterr().out == "[Toy] not yet: 2 is not 1\nHint: think\n"
    assert _toy(_is_one).check(1) is True
    assert capsys.readouterr().out.startswith("[Toy] correct.")


def test_interrupts_are_not_swallowed():
    def interrupted(answer):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _toy(interrupted).check(1)


def test_an_exercise_needs_a_wrong_answer_and_a_callable_checker():
    with pytest.raises(ValueError, match="at least one wrong answer"):
        Exercise(title="T", checker=_is_one, solution=1)
    with pytest.raises(TypeError, match="checker must be a function"):
        Exercise(title="T", checker=None, solution=1, wrong=(2,))


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_reveal_prints_the_solution(qualname, exercise, capsys):
    exercise.reveal()
    out = capsys.readouterr().out
    assert "reference solution" in out and len(out.splitlines()) >= 2


# Notebook 18's checkers compute torch_xla's spec strings without torch_xla (exercises.ex18_pytorch_xla.spec_string),
# so they run everywhere. Where torch_xla is installed (.venv-xla: `make test-xla`), hold them to what it prints.
SPEC_STRING_CASES = [
    ((8, 8, 16), (None, "data", "model")),
    ((8,), ("data",)),
    ((8,), (("data", "model"),)),
    ((8, 16), ("model", None)),  # exercise 2's answer
    ((8, 16), (None, "model")),  # exercise 3's question
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torchax, inside torch_xla, imports old JAX names
def test_ex18_pytorch_xla_spec_strings_are_what_torch_xla_prints():
    import os

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ.setdefault("CPU_NUM_DEVICES", "8")
    torch = pytest.importorskip("torch")
    torch_xla = pytest.importorskip("torch_xla")
    import jax
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    from exercises import ex18_pytorch_xla as ex18

    shardy = jax.config.jax_use_shardy_partitioner  # every mark_sharding switches it off: restore it after
    try:
        xr.use_spmd()
        mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
        for shape, spec in SPEC_STRING_CASES:
            t = torch.zeros(shape).to(torch_xla.device())
            xs.mark_sharding(t, mesh, spec)
            assert torch_xla._XLAC._get_xla_sharding_spec(t) == ex18.spec_string(spec, shape), (shape, spec)
        assert ex18.spec_string(ex18.spec_from_string.solution, (8, 16)) == ex18._TARGET
        assert ex18.spec_string((None, "model"), (8, 16)) == ex18.string_from_spec.solution
    finally:
        jax.config.update("jax_use_shardy_partitioner", shardy)
