"""Exercises of notebook 15: a step's compute time, and the batch above which communication hides."""

from __future__ import annotations

from spmd_course.utils.exercises import Exercise, near, positive_number
from spmd_course.utils.timing import CHIPS

# Exercise 1: 1.3e9 parameters, 64 x 2,048 tokens over 8 GPUs, float32 without tensor cores (67 TFLOP/s)
_N, _TOKENS, _GPUS, _F32, _BF16 = 1.3e9, 64 * 2048, 8, 67e12, CHIPS["H100"].peak_flops
_COMPUTE = 6 * _N * _TOKENS / _GPUS / _F32  # about 1.91 s


def _check_compute_seconds(answer: object) -> None:
    s = positive_number(answer, "the seconds")
    assert not near(s, 2 * _N * _TOKENS / _GPUS / _F32, 0.03), (
        "that is the forward pass alone (2 FLOPs per parameter per token): the backward pass does twice as much"
    )
    assert not near(s, 4 * _N * _TOKENS / _GPUS / _F32, 0.03), (
        "the backward pass computes two gradients per matmul (inputs and weights): 4 FLOPs, not 2, so 6 in all"
    )
    assert not near(s, _COMPUTE * _F32 / _BF16, 0.03), (
        "989 TFLOP/s is the bf16 tensor-core peak; this step runs in float32 without tensor cores, at 67"
    )
    assert not near(s, _COMPUTE * _GPUS, 0.03), "each GPU computes its own 1/8 of the batch: divide by 8"
    assert near(s, _COMPUTE, 0.03), (
        f"{s:.3g} s is not it: 6 x parameters x tokens per GPU, divided by the peak FLOP/s"
    )


compute_seconds = Exercise(
    title="Exercise 1: one step's compute time",
    checker=_check_compute_seconds,
    solution=_COMPUTE,
    wrong=(
        2 * _N * _TOKENS / _GPUS / _F32,
        4 * _N * _TOKENS / _GPUS / _F32,
        _COMPUTE * _F32 / _BF16,
        _COMPUTE * _GPUS,
        1.0,
    ),
    hint="6 x 1.3e9 x (64 x 2048 / 8) FLOPs per GPU, divided by 67e12 FLOP/s",
    explanation=(
        "About 1.91 s: 6 x 1.3e9 x 16,384 = 1.28e14 FLOPs per GPU at 67 TFLOP/s. In bf16 on the tensor cores the "
        "same step would take 0.13 s, which is why nobody trains in plain float32."
    ),
)


# Exercise 2: DP all-reduce of N bf16 gradients over a ring of 16 v6e chips against a 4N-FLOPs-per-token backward
_C, _W, _RING = CHIPS["v6e"].peak_flops, CHIPS["v6e"].axis_bandwidth(16, 16), 16  # 918e12, 200e9: a ring
_CROSSOVER = 2 * (_RING - 1) / _RING * 2 / 4 * _C / _W  # bytes per parameter sent / FLOPs per parameter per token


def _check_crossover_tokens(answer: object) -> None:
    t = positive_number(answer, "the tokens per chip")
    assert not near(t, _CROSSOVER / 2, 0.03), (
        "half the answer: a ring all-reduce is a reduce-scatter and then an all-gather, so each chip sends (n-1)/n "
        "of the bytes twice; and W is what one chip sends along one axis, ICI / ports = 200 GB/s, not 400"
    )
    assert not near(t, _CROSSOVER * 16 / 15, 0.03), (
        "close: a ring of 16 sends (n-1)/n = 15/16 of the array in each of its two phases, not all of it"
    )
    assert not near(t, _CROSSOVER * 4 / 6, 0.03), (
        "the all-reduce overlaps the backward pass, 4N FLOPs per token, not 6N"
    )
    assert not near(t, _CROSSOVER * 2, 0.03), (
        "twice the answer: the gradients are bf16 here, 2 bytes each, not 4; and W is ICI / ports = 200 GB/s along "
        "a ring (both directions of its two links), not 100"
    )
    assert near(t, _CROSSOVER, 0.03), (
        f"{t:,.0f} is not it: bytes sent = 2 x 15/16 x 2N; time = bytes / W; the backward pass = 4N x tokens / C"
    )


crossover_tokens = Exercise(
    title="Exercise 2: tokens per chip for the all-reduce to hide",
    checker=_check_crossover_tokens,
    solution=_CROSSOVER,
    wrong=(_CROSSOVER / 2, _CROSSOVER * 16 / 15, _CROSSOVER * 4 / 6, _CROSSOVER * 2, 1000),
    hint="set 2 x (15/16) x 2N / W equal to 4N x t / C and solve for t; N cancels",
    explanation=(
        "About 4,300 tokens per chip: t = (2 x 15/16 x 2 / 4) x C/W = 0.94 x 4,590. A v6e computes 4.6 times "
        "faster than a v5e but sends only twice as fast, so it needs more tokens per chip to hide the same sum."
    ),
)


# Exercise 3: the collective-permutes one step of section 2's FSDP block runs, every loop trip counted. The
# compiler writes each of the 3 weight gradients' reduce-scatter as a loop of 2 trips with 4 permutes each, and
# 1 permute after it (tests/test_15_step_time.py reads the same count from the compiled program).
_GRADIENTS, _PER_TRIP, _TRIPS, _AFTER = 3, 4, 2, 1
_PERMUTES = _GRADIENTS * (_PER_TRIP * _TRIPS + _AFTER)  # 27


def _check_loop_permutes(answer: object) -> None:
    n = positive_number(answer, "the number of collective-permutes")
    assert n == int(n), f"count whole collective-permutes; got {n!r}"
    assert n != _GRADIENTS * (_PER_TRIP + _AFTER), (
        "that counts each loop's body once: a loop body runs once per trip, so multiply its permutes by `trips`"
    )
    assert n != _GRADIENTS * _PER_TRIP * _TRIPS, "close: each gradient's loop is followed by one more permute"
    assert n != _PER_TRIP * _TRIPS + _AFTER, "that is one gradient's: the block has three weight matrices"
    assert n == _PERMUTES, f"{n:g} is not it: sum `op.trips` over the collective-permutes that collectives() lists"


loop_permutes = Exercise(
    title="Exercise 3: count a loop by its trips",
    checker=_check_loop_permutes,
    solution=_PERMUTES,
    wrong=(_GRADIENTS * (_PER_TRIP + _AFTER), _GRADIENTS * _PER_TRIP * _TRIPS, _PER_TRIP * _TRIPS + _AFTER, 3),
    hint="sum(op.trips for op in collectives(program).ops if op.kind == 'collective-permute')",
    explanation=(
        "27: each of the 3 weight gradients is reduce-scattered by a loop of 2 trips with 4 permutes each, then 1 "
        "more, so 3 x (4 x 2 + 1). Reading each loop body once gives 15, and undercounts the bytes by the same factor."
    ),
)
