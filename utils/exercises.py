"""Self-checking exercises: the learner's answer is checked in the notebook, and
the reference solution can be revealed on demand.

An :class:`Exercise` pairs a checker (a function that raises ``AssertionError``
with a helpful message when an answer is wrong) with a reference solution and
at least one wrong answer. The course's tests feed both through the checker,
so a checker that stops accepting the solution, or starts accepting anything,
fails CI.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NOT_ANSWERED", "Exercise"]


class _NotAnswered:
    def __repr__(self) -> str:
        return "NOT_ANSWERED"


NOT_ANSWERED: Any = _NotAnswered()
"""Placeholder that exercise cells start with: checking it prints a nudge, not an error."""


@dataclass
class Exercise:
    """One exercise: ``check(answer)`` prints a verdict and returns True or False.

    ``checker(answer)`` must raise ``AssertionError`` (with a message that
    helps) when the answer is wrong. ``solution`` is the reference answer (a
    value or a function); ``wrong`` holds answers the checker must reject.
    """

    title: str
    checker: Callable[[Any], None]
    solution: Any
    wrong: tuple[Any, ...] = ()
    hint: str = ""
    explanation: str = ""
    _solution_source: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if not callable(self.checker):
            raise TypeError(f"Exercise {self.title!r}: checker must be a function that raises AssertionError")
        if not self.wrong:
            raise ValueError(
                f"Exercise {self.title!r}: give at least one wrong answer, so tests prove the checker can fail"
            )

    def check(self, answer: Any) -> bool:
        """Print whether ``answer`` is right (and why not); return True when it is."""
        if answer is NOT_ANSWERED:
            print(f"[{self.title}] not answered yet: replace NOT_ANSWERED with your answer."
                  + (f" Hint: {self.hint}" if self.hint else ""))
            return False
        try:
            self.checker(answer)
        except AssertionError as err:
            print(f"[{self.title}] not yet: {err}" + (f"\nHint: {self.hint}" if self.hint else ""))
            return False
        except Exception as err:  # a wrong answer may break the checker's own code
            print(f"[{self.title}] not yet: checking it raised {type(err).__name__}: {err}")
            return False
        print(f"[{self.title}] correct." + (f" {self.explanation}" if self.explanation else ""))
        return True

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
