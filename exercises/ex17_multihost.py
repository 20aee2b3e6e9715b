"""Exercises of notebook 17: which process holds what in multi-host data parallelism."""

from __future__ import annotations

from utils.exercises import Exercise


def _check_rows(answer: object) -> None:
    assert isinstance(answer, tuple) and len(answer) == 2, f"give a (start, stop) tuple; got {answer!r}"
    assert answer == (32, 48), (
        f"{answer} is not it: 4 processes x 2 devices = 8 devices of 8 rows; process 2 drives the 5th and "
        "6th devices of the mesh"
    )


rows_of_process = Exercise(
    title="Exercise 1: rows of process 2",
    checker=_check_rows,
    solution=(32, 48),
    wrong=((16, 24), (32, 40), (48, 64), [32, 48]),
    hint="devices are ordered process by process; each device holds 64 / 8 = 8 rows",
    explanation="Process 2 drives global devices 4 and 5, which hold rows 32:40 and 40:48.",
)


def _check_local_batch(answer: object) -> None:
    assert isinstance(answer, int) and not isinstance(answer, bool), f"give a whole number; got {answer!r}"
    assert answer == 2048 // 16, (
        f"{answer} rows is not it: the batch is split over all 64 devices, and each process drives 4 of them"
    )


local_batch = Exercise(
    title="Exercise 2: rows per process",
    checker=_check_local_batch,
    solution=128,
    wrong=(32, 2048, 512),
    hint="rows per device = 2048 / 64; a process passes the rows of all its local devices",
    explanation="2048 / 64 = 32 rows per device, x 4 local devices = 128 rows per process.",
)
