"""Exercises of notebook 23: which rows each host loads, and which lines hang a multi-host job."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import jax
import numpy as np

from spmd_course.utils.exercises import Exercise, plain

# The 1-D mesh jax.make_mesh builds on a TPU v5e-16 (v5e:4x4): the host of each position, in mesh order.
V5E_16_HOSTS = (0, 0, 1, 1, 1, 1, 0, 2, 3, 3, 3, 3, 2, 2, 2, 0)
BATCH = 128


def host_rows(hosts: Sequence[int], host: int, rows: int) -> list[tuple[int, int]]:
    """The row ranges a host loads for a batch of ``rows`` on P('data') over a 1-D mesh, in row order."""
    block = rows // len(hosts)
    return [(p * block, (p + 1) * block) for p, h in enumerate(hosts) if h == host]


def _as_range(block: object) -> tuple[int, int] | None:
    """(start, stop) from a pair of whole numbers, or a slice or range with a step of 1 (what index maps hold).

    Numbers from numpy and whole floats count (`plain`), so an array of shape (n, 2) is a list of ranges too.
    """
    if isinstance(block, slice | range):
        start, stop, step = (plain(v) for v in (block.start, block.stop, block.step))
        block = (start, stop) if step in (None, 1) else None
    block = plain(block)
    if isinstance(block, tuple) and len(block) == 2 and all(type(v) is int for v in block):
        return block[0], block[1]
    return None


def _rows_covered(ranges: list) -> list[int]:
    return [row for start, stop in ranges for row in range(start, stop)]


def _check_rows_of_host(answer: object) -> None:
    if isinstance(answer, np.ndarray | jax.Array):  # an array of shape (n, 2)
        answer = np.asarray(answer).tolist()
    ranges = [_as_range(block) for block in answer] if isinstance(answer, list | tuple) else [None]
    assert None not in ranges, (
        f"give a list of (start, stop) ranges of whole numbers (or slices), such as [(0, 8), (40, 48)]; got {answer!r}"
    )
    answer = ranges
    assert all(0 <= start < stop <= BATCH for start, stop in answer), (
        f"each range must satisfy 0 <= start < stop <= {BATCH}; got {answer!r}"
    )
    truth = _rows_covered(host_rows(V5E_16_HOSTS, 2, BATCH))
    given = _rows_covered(answer)
    assert len(given) == len(set(given)), f"{answer} loads some rows twice: each row the host holds, once"
    assert set(given) == set(truth), (
        f"{answer} is not the set of rows host 2's devices hold: each of the 16 positions holds 128 / 16 = 8 rows, "
        "and host 2 drives the positions where the list says 2 (they are not one contiguous run)"
    )
    assert given == sorted(given), (
        f"{answer} has the right rows in the wrong order: make_array_from_process_local_data takes this host's rows "
        "in the order of the global batch"
    )


rows_of_host = Exercise(
    title="Exercise 1: the rows of host 2 on a v5e-16",
    checker=_check_rows_of_host,
    solution=[(56, 64), (96, 120)],
    wrong=([(64, 96)], [(56, 64), (96, 104), (104, 112)], [(96, 120), (56, 64)], [(56, 120)],
           [(56, 64), (56, 64), (96, 120)], "56:64, 96:120",
           np.array([[64, 96]]), [(np.int64(56), np.int64(64)), (96, 112)], [(56.5, 64), (96, 120)]),
    hint="position p of the mesh holds rows 8p to 8p + 8; find the positions whose host is 2",
    explanation="Positions 7, 12, 13, 14 hold rows 56:64, 96:104, 104:112 and 112:120. Listing the four blocks "
                "separately is right too; `rows_to_load` in the script finds them with "
                "`sharding.addressable_devices_indices_map`.",
)


def _check_rows_per_process(answer: object) -> None:
    answer = plain(answer)  # np.int64, a whole float or a 0-d array count as the number
    assert isinstance(answer, numbers.Real) and not isinstance(answer, bool) and float(answer).is_integer(), (
        f"give a whole number; got {answer!r}"
    )
    assert answer != 2048 // 16, (
        f"{answer} rows would be right if each host held its own rows; here every data row's pair of devices "
        "spans two hosts, so each host also holds the rows of its partner"
    )
    assert answer == 4 * (2048 // 32), (
        f"{answer} is not it: the batch splits into 32 blocks of 64 rows (one per data row); each of a host's 4 "
        "devices sits in a different data row"
    )


rows_per_process = Exercise(
    title="Exercise 2: rows per process when 'model' spans hosts",
    checker=_check_rows_per_process,
    solution=256,
    wrong=(128, 64, 2048, 32),
    hint="a model pair joins two hosts, so no data row holds two devices of the same host",
    explanation="2048 / 32 = 64 rows per data row; a host's 4 devices sit in 4 different data rows: 256 rows, "
                "the same 256 as the host it shares them with.",
)


HANGS = frozenset({"b", "d", "e"})


def _check_which_hang(answer: object) -> None:
    answer = plain(answer)  # a list or tuple of letters counts as the set of them
    assert isinstance(answer, frozenset | tuple) and all(isinstance(a, str) for a in answer), (
        f'give a set of letters, such as {{"a"}}; got {answer!r}'
    )
    letters = {a.strip().lower().strip("()") for a in answer}
    assert letters <= {"a", "b", "c", "d", "e"}, f"the choices are a, b, c, d and e; got {sorted(letters)}"
    extra, missing = sorted(letters - HANGS), sorted(HANGS - letters)
    assert not extra, (
        f"({extra[0]}) does not hang: it only reads a value this process already holds (a replicated output) "
        "or does a side effect, which is what belongs under process_index() == 0"
    )
    assert not missing, (
        f"({missing[0]}) hangs too: it runs a collective (Orbax's save, an all-gather, or the all-gather with which "
        "device_put checks that every process passed the same values) that the other processes never call, so "
        "process 0 waits for them"
    )


which_hang = Exercise(
    title="Exercise 3: which lines hang",
    checker=_check_which_hang,
    solution={"b", "d", "e"},
    wrong=({"b", "d"}, {"b"}, {"d"}, {"e"}, {"a", "b", "d", "e"}, {"b", "c", "d", "e"}, {"a", "b", "c", "d", "e"},
           set(), "bde"),
    hint="which calls are collectives, that every process must reach? One of them hides inside jax.device_put",
    explanation="(b) Orbax's save, (d) process_allgather and (e) device_put of host data onto devices of every "
                "process (it all-gathers the data to check that each process passed the same) are collectives: "
                "under process_index() == 0 only process 0 calls them, and it waits for the others, with no time "
                "limit of its own once the processes have run a collective together. (a) and (c) read a replicated "
                "value that process 0 already holds.",
)
