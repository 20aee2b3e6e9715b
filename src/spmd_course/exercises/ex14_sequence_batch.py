"""Exercises of notebook 14: sequence parallelism, gradient accumulation, Explicit meshes."""

from __future__ import annotations

import numpy as np
from jax.sharding import PartitionSpec

from spmd_course.utils.exercises import Exercise, answer_errors, plain

# Exercise 1: a residual-stream activation bf16[8, 2048, 4096] on a `model` axis of 8 devices.
_ACT = 8 * 2048 * 4096 * 2  # bytes of the whole activation in bf16: 128 MiB
_TP, _SP = _ACT, _ACT // 8


def _check_activation_bytes(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, tuple) and len(answer) == 2, (
        f"give a pair (bytes per device under tensor parallelism, bytes per device under sequence parallelism); "
        f"got {answer!r}"
    )
    tp, sp = answer
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in answer), (
        f"give whole numbers of bytes; got {answer!r}"
    )
    assert (tp, sp) != (_SP, _TP), "swapped: tensor parallelism is the one that keeps the whole activation everywhere"
    assert (tp, sp) != (2 * _TP, 2 * _SP), "the activation is bf16: 2 bytes per element, not 4"
    assert tp == _TP, (
        f"tensor parallelism: {tp} is not it. Between the tensor-parallel regions every device of the `model` "
        "axis holds the whole activation: 8 x 2048 x 4096 elements of 2 bytes"
    )
    assert sp != _SP // 8, "only the sequence is split, 8 ways: not the batch as well"
    assert sp == _SP, (
        f"sequence parallelism: {sp} is not it. P(None, 'model', None) splits the 2048 positions 8 ways; "
        "each device keeps 8 x 256 x 4096 elements"
    )


activation_bytes = Exercise(
    title="Exercise 1: activation memory between the regions",
    checker=_check_activation_bytes,
    solution=(_TP, _SP),
    wrong=((_SP, _TP), (2 * _TP, 2 * _SP), (_TP, _SP // 8), (_TP, _TP), (_SP, _SP)),
    hint="bf16 is 2 bytes; tensor parallelism keeps all 8 x 2048 x 4096 elements on each device, sequence "
    "parallelism 1/8 of the positions",
    explanation=(
        "128 MiB against 16 MiB per device, for every activation between the regions (the residual stream, the "
        "layer norm's output, dropout's mask): in a deep model, saved for the backward pass, once per layer."
    ),
)


# Exercise 2: micro-batches that keep a P('data') batch split over 8 devices, each device's share contiguous.
_DEVICES = 8


def _check_split(answer: object) -> None:
    assert callable(answer), f"give a function micro_batches(x, n); got {answer!r}"
    for batch, n in ((64, 4), (128, 8), (32, 2)):
        x = np.arange(batch * 3, dtype=np.float32).reshape(batch, 3)
        with answer_errors(f"micro_batches(x, {n}) for x of shape {x.shape}"):
            out = np.asarray(answer(x, n))
        assert out.shape == (n, batch // n, 3), (
            f"micro_batches(x, {n}) for x of shape {x.shape} returned shape {out.shape}; it must be "
            f"(n, {batch} // n, 3) = {(n, batch // n, 3)}: the micro-batch index first, for jax.lax.scan"
        )
        rows = out[:, :, 0].astype(int) // 3  # which row of x each entry came from
        assert np.array_equal(np.sort(rows.ravel()), np.arange(batch)) and np.array_equal(
            out.reshape(-1, 3), x[rows.ravel()]), (
            f"for x of shape {x.shape}: every row of x must appear exactly once, whole (move rows, not features)"
        )
        per_device, share = batch // _DEVICES, batch // n // _DEVICES  # device d holds rows d * per_device ...
        for m in range(n):
            held = np.bincount(rows[m] // per_device, minlength=_DEVICES)
            assert np.all(held == share), (
                f"for a batch of {batch} on {_DEVICES} devices, micro-batch {m} of {n} takes {held.tolist()} rows "
                f"from devices 0..7; each device must give it the same number ({share}), or the devices that hold "
                "none of it sit idle (consecutive rows of x put micro-batch m on one device only)"
            )
            for d in range(_DEVICES):
                at = np.nonzero(rows[m] // per_device == d)[0]  # where device d's rows sit in micro-batch m
                slot = np.arange(d * share, (d + 1) * share)  # the positions P('data') gives device d
                assert np.array_equal(at, slot), (
                    f"for a batch of {batch} and n = {n}, micro-batch {m} puts device {d}'s rows at positions "
                    f"{at.tolist()}; split by P('data'), positions {slot[0]} to {slot[-1]} of a micro-batch belong "
                    f"to device {d}, so these rows would move between devices (an all-gather or a "
                    "collective-permute): keep the devices in order, each device's rows together"
                )
                got, first = rows[m][slot], d * per_device + m * share
                assert np.array_equal(got, np.arange(first, first + share)), (
                    f"for a batch of {batch} and n = {n}, micro-batch {m} takes rows {got.tolist()} of device {d} "
                    f"(which holds rows {d * per_device} to {(d + 1) * per_device - 1}); it must take the "
                    f"contiguous run {first} to {first + share - 1}, in order: micro-batch 0 gets each device's "
                    f"first {share} rows, micro-batch 1 the next {share}, and so on"
                )


def _solution_split(x, n):
    per_share = x.shape[0] // (8 * n)
    # (device, micro-batch, row within the share, ...) -> (micro-batch, device, row, ...) -> (micro-batch, row, ...)
    return x.reshape(8, n, per_share, *x.shape[1:]).swapaxes(0, 1).reshape(n, 8 * per_share, *x.shape[1:])


micro_batches = Exercise(
    title="Exercise 2: micro-batches from contiguous shares",
    checker=_check_split,
    solution=_solution_split,
    wrong=(
        lambda x, n: x.reshape(-1, n, *x.shape[1:]).swapaxes(0, 1),  # the strided split: shares not contiguous
        lambda x, n: x.reshape(n, -1, *x.shape[1:]),  # consecutive rows: one micro-batch per device
        lambda x, n: x.reshape(8, n, -1, *x.shape[1:]).reshape(n, -1, *x.shape[1:]),  # no swap: consecutive again
        lambda x, n: x.reshape(8, n, -1, *x.shape[1:]).swapaxes(0, 1),  # the device axis left in the shape
        lambda x, n: np.stack([x[: x.shape[0] // n]] * n),  # the first micro-batch n times
        lambda x, n: _solution_split(x, n) + 1,  # changes the data
        # device-minor order: row k of every device, then row k + 1 ... (under jit, an all-gather)
        lambda x, n: x.reshape(8, n, -1, *x.shape[1:]).transpose(1, 2, 0, 3).reshape(n, -1, *x.shape[1:]),
        # the devices in reverse order (under jit, a collective-permute)
        lambda x, n: _solution_split(x[::-1].reshape(8, -1, *x.shape[1:])[:, ::-1].reshape(x.shape), n),
    ),
    hint="reshape x to (8, n, rows // (8 * n), ...): device, micro-batch, row within the share; swap the first "
    "two axes; then merge the device and row axes: reshape to (n, rows // n, ...)",
    explanation=(
        "Every device gives each micro-batch the same number of rows, so the result keeps its 'data' split "
        "(f32[n, rows // n @data, ...]) and nothing moves; contiguous shares suit a loader that reads each "
        "device's rows in order."
    ),
)


# Exercise 3: the out_sharding of the row-parallel layer on an Explicit (4, 2) ('data', 'model') mesh.
def _entries(spec: PartitionSpec, ndim: int) -> tuple:
    return tuple(spec) + (None,) * (ndim - len(spec))


def _check_out_sharding(answer: object) -> None:
    assert isinstance(answer, PartitionSpec), (
        f"give a PartitionSpec such as P('data', 'model'); got {answer!r}"
    )
    assert len(answer) <= 2, f"the logits are 2-D (examples, classes); {answer} has {len(answer)} entries"
    rows, cols = _entries(answer, 2)
    assert rows == "data", (
        f"{answer}: the examples stay split over 'data' as they came in (rows {rows!r}); "
        "anything else gathers or re-splits the batch"
    )
    assert cols is None, (
        f"{answer}: splitting the classes over 'model' is a valid layout (a reduce-scatter), but the softmax "
        "needs whole rows of logits on each device"
    )


row_parallel_out = Exercise(
    title="Exercise 3: out_sharding for the row-parallel layer",
    checker=_check_out_sharding,
    solution=PartitionSpec("data", None),
    wrong=(PartitionSpec(), PartitionSpec("data", "model"), PartitionSpec(None, "model"), PartitionSpec("model"),
           PartitionSpec(None, None), ("data", None)),
    hint="the examples keep their 'data' split; the 10 classes must be whole on each device for the softmax",
    explanation=(
        "P('data', None), or P('data'): the 2 devices of each 'model' row all-reduce their partial logits, as the "
        "compiler chose on the Auto mesh of notebook 09."
    ),
)
