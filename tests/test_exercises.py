"""Every exercise's checker accepts its reference solution and rejects every listed wrong answer.

This is what keeps a checker from rotting: if a library change makes the reference
answer fail, or makes the checker accept anything, this test fails.
"""

import importlib
import pkgutil

import pytest

import exercises
from utils.exercises import NOT_ANSWERED, Exercise


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


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_reference_solution_passes(qualname, exercise, capsys):
    assert exercise.check(exercise.solution) is True, capsys.readouterr().out
    assert "correct" in capsys.readouterr().out


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_wrong_answers_fail(qualname, exercise, capsys):
    for wrong in exercise.wrong:
        assert exercise.check(wrong) is False, f"{qualname} accepted the wrong answer {wrong!r}"
    assert exercise.check(NOT_ANSWERED) is False
    assert "not answered yet" in capsys.readouterr().out


@pytest.mark.parametrize("qualname,exercise", EXERCISES, ids=[q for q, _ in EXERCISES])
def test_reveal_prints_the_solution(qualname, exercise, capsys):
    exercise.reveal()
    out = capsys.readouterr().out
    assert "reference solution" in out and len(out.splitlines()) >= 2
