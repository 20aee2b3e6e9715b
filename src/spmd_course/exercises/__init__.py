"""Checkers and reference answers for the notebooks' exercises, one module per notebook.

Each module defines :class:`utils.exercises.Exercise` objects. A notebook cell
calls ``ex.check(answer)``; ``ex.reveal()`` prints the reference answer. The
tests in ``tests/test_exercises.py`` feed every reference answer (must pass)
and every listed wrong answer (must fail) through its checker.
"""
