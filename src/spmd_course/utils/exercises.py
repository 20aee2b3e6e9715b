"""Self-checking exercises: the learner's answer is checked in the notebook; the solution is revealed on demand.

An :class:`Exercise` pairs a checker (raising ``AssertionError`` with a helpful message for a wrong answer)
with a reference solution and at least one wrong answer; the tests feed both through the checker, so a
checker that rejects the solution or accepts anything fails CI. Any other exception is a *checker error*,
not the learner's mistake, and ``check`` says so.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import numbers
import textwrap
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import PartitionSpec

__all__ = ["NOT_ANSWERED", "Exercise", "Outcome", "Verdict", "answer_errors", "near", "plain", "positive_number"]


class Verdict(enum.StrEnum):
    """The outcome of checking one answer."""

    CORRECT = "correct"
    WRONG = "wrong"  # the checker raised AssertionError: the answer is wrong, with a message why
    NOT_ANSWERED = "not_answered"  # the placeholder is still there
    CHECKER_ERROR = "checker_error"  # the checker raised something else: the checker failed, not the learner


class Outcome(NamedTuple):
    """A :class:`Verdict` with the exception the checker raised (None when it raised nothing)."""

    verdict: Verdict
    error: Exception | None


class _NotAnswered:
    def __repr__(self) -> str:
        return "NOT_ANSWERED"


NOT_ANSWERED: Any = _NotAnswered()
"""Placeholder that exercise cells start with: checking it prints a nudge, not an error."""


def plain(answer: object) -> object:
    """``answer`` in the one spelling checkers compare: Python numbers, tuples, frozensets and device ids.

    Right answers come by many routes (``np.int64``, a whole float ``16384.0``, ``Device`` objects, a list for
    a tuple), so: a bool stays a bool; a whole real number becomes an ``int``, another a ``float``; an array
    its number or nested tuples; a list or tuple a tuple, a set a frozenset, a dict a dict, items made plain;
    a ``jax.Device`` its id. Anything else comes back unchanged.
    """
    if isinstance(answer, bool | np.bool_):
        return bool(answer)
    if isinstance(answer, numbers.Integral):
        return int(answer)
    if isinstance(answer, numbers.Real):
        value = float(answer)
        return int(value) if value.is_integer() else value
    if isinstance(answer, np.ndarray | jax.Array):
        return plain(np.asarray(answer).tolist())
    if isinstance(answer, jax.Device):
        return answer.id
    if isinstance(answer, PartitionSpec):
        return answer
    if isinstance(answer, list | tuple):
        return tuple(plain(item) for item in answer)
    if isinstance(answer, set | frozenset):
        return frozenset(plain(item) for item in answer)
    if isinstance(answer, dict):
        return {plain(key): plain(value) for key, value in answer.items()}
    return answer


def positive_number(answer: object, what: str) -> float:
    """``answer`` as a float, for a checker that wants a positive quantity (seconds, bytes, a fraction).

    Raises the ``AssertionError`` a learner reads (naming ``what``) for anything but a real number above 0;
    ``np.float32(1.9)`` and ``16384`` are numbers, ``True`` and ``"2"`` are not.
    """
    answer = plain(answer)
    assert isinstance(answer, int | float) and not isinstance(answer, bool), f"give {what} as a number; got {answer!r}"
    assert answer > 0, f"{what} is positive; got {answer!r}"
    return float(answer)


def near(a: float, b: float, tolerance: float = 0.01) -> bool:
    """Whether ``a`` is within ``tolerance`` of ``b``, relative to ``b`` (0.02: within 2%; by default 1%).

    Checkers use it to tell a right number from a near miss. ``b`` must not be 0 (a ValueError)."""
    if b == 0:
        raise ValueError("near compares relative to b, so b must not be 0")
    return abs(a / b - 1) <= tolerance


@contextlib.contextmanager
def answer_errors(what: str = "your answer") -> Iterator[None]:
    """Inside a checker, around code that runs the learner's answer: an exception there is a wrong answer.

    It becomes an ``AssertionError`` starting with ``what`` and quoting the error's first line. Keep the block
    narrow: an exception from the checker's own code must stay a checker error.
    """
    try:
        yield
    except AssertionError:
        raise
    except Exception as err:
        lines = str(err).strip().splitlines()
        first = lines[0] if lines else ""
        detail = f"{type(err).__name__}: {first[:300]}" if first else type(err).__name__
        raise AssertionError(f"{what} raised {detail}") from err


@dataclass
class Exercise:
    """One exercise: ``check(answer)`` prints a verdict and returns True or False.

    ``checker(answer)`` raises ``AssertionError`` (with a message that helps) for a wrong answer; ``solution``
    is the reference (a value or a function); ``wrong`` holds answers the checker must reject. ``hint`` is
    printed only under a wrong answer: a learner shown the method before trying has been told, not taught.
    """

    title: str
    checker: Callable[[Any], None]
    solution: Any
    wrong: tuple[Any, ...] = ()
    hint: str = ""
    explanation: str = ""

    def __post_init__(self) -> None:
        if not callable(self.checker):
            raise TypeError(f"Exercise {self.title!r}: checker must be a function that raises AssertionError")
        if not self.wrong:
            raise ValueError(
                f"Exercise {self.title!r}: give at least one wrong answer, so tests prove the checker can fail"
            )

    def outcome(self, answer: Any) -> Outcome:
        """Check ``answer`` without printing: the :class:`Verdict` and the exception behind it."""
        if answer is NOT_ANSWERED:
            return Outcome(Verdict.NOT_ANSWERED, None)
        try:
            self.checker(answer)
        except AssertionError as err:
            return Outcome(Verdict.WRONG, err)
        except Exception as err:
            return Outcome(Verdict.CHECKER_ERROR, err)
        return Outcome(Verdict.CORRECT, None)

    def verdict(self, answer: Any) -> Verdict:
        """Check ``answer`` without printing: correct, wrong, not answered, or checker error."""
        return self.outcome(answer).verdict

    def check(self, answer: Any) -> bool:
        """Print whether ``answer`` is right (and why not); return True when it is."""
        verdict, err = self.outcome(answer)
        if verdict is Verdict.NOT_ANSWERED:
            print(f"[{self.title}] not answered yet: replace NOT_ANSWERED with your answer. A hint appears "
                  "after a wrong answer; reveal() shows the reference solution.")
        elif verdict is Verdict.WRONG:
            print(f"[{self.title}] not yet: {err}" + (f"\nHint: {self.hint}" if self.hint else ""))
        elif verdict is Verdict.CHECKER_ERROR:
            print(f"[{self.title}] checker error: the checker itself failed, so this is no verdict on your "
                  f"answer. It raised {type(err).__name__}: {err}{self._where(err)}. Check that your answer "
                  "is the kind of value the exercise asks for; if it is, the exercise has a bug.")
        else:
            print(f"[{self.title}] correct." + (f" {self.explanation}" if self.explanation else ""))
        return verdict is Verdict.CORRECT

    def _where(self, err: BaseException | None) -> str:
        """' (in file.py:line)': the checker's own line that failed, else the deepest frame."""
        frames = traceback.extract_tb(err.__traceback__) if err is not None else []
        own = getattr(getattr(self.checker, "__code__", None), "co_filename", None)
        mine = [f for f in frames if f.filename == own]
        frame = (mine or frames or [None])[-1]
        return f" (in {Path(frame.filename).name}:{frame.lineno})" if frame else ""

    def reveal(self) -> None:
        """Print the reference solution (its source code, for a function)."""
        if callable(self.solution) and not isinstance(self.solution, type):
            try:
                text = textwrap.dedent(inspect.getsource(self.solution))
            except (OSError, TypeError):
                text = repr(self.solution)
        else:
            text = repr(self.solution)
        print(f"[{self.title}] reference solution:\n{text}")
        if self.explanation:
            print(self.explanation)
