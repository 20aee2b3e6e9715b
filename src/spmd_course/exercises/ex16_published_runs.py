"""Exercises of notebook 16: the step a published row implies, and MFU against HFU."""

from __future__ import annotations

from spmd_course.utils.exercises import Exercise, near, plain, positive_number
from spmd_course.utils.timing import CHIPS

# Exercise 1: 150 TFLOP/s per chip published, 7e9 parameters, 4 x 2,048 tokens per chip, 6NT FLOPs per chip
_N, _T, _PUBLISHED = 7e9, 4 * 2048, 150e12
_PEAK = CHIPS["v5e"].peak_flops  # 197e12
_IMPLIED = 6 * _N * _T / _PUBLISHED  # about 2.29 s


def _check_implied_step(answer: object) -> None:
    s = positive_number(answer, "the step time")
    assert not near(s, 6 * _N * _T / _PEAK, 0.02), (
        "that divides by the chip's peak: the row ran at 150 TFLOP/s, so its step took the FLOPs over 150e12"
    )
    assert not near(s, 2 * _N * _T / _PUBLISHED, 0.02), (
        "2 N T is the forward pass alone: a training step does 6 N T (forward 2, backward 4)"
    )
    assert not near(s, 6 * _N * 2048 / _PUBLISHED, 0.02), "each chip holds 4 sequences: T = 4 x 2,048 tokens"
    assert not near(s, _IMPLIED * _PEAK / _PUBLISHED, 0.02), (
        "that divides by the MFU as well: the FLOPs over the published rate already give the step"
    )
    assert near(s, _IMPLIED, 0.02), f"{s:.3g} s is not it: the row's FLOPs per chip over its TFLOP/s per chip"


implied_step = Exercise(
    title="Exercise 1: the step a published row implies",
    checker=_check_implied_step,
    solution=_IMPLIED,
    wrong=(6 * _N * _T / _PEAK, 2 * _N * _T / _PUBLISHED, 6 * _N * 2048 / _PUBLISHED, _IMPLIED * _PEAK / _PUBLISHED,
           1.0),
    hint="6 x 7e9 x (4 x 2048) FLOPs per chip per step, at 150e12 FLOP/s per chip",
    explanation=(
        "About 2.29 s: 6 x 7e9 x 8,192 = 3.44e14 FLOPs per chip, over 150 TFLOP/s. The row's MFU is 150 / 197 = "
        "76%. Nobody timed a 2.29 s step: it is implied by the published rate and the trainer's own FLOP count, "
        "so it is only as right as that count."
    ),
)


# Exercise 2: 60% MFU counted as 6NT; full remat runs 8NT
_MFU = 0.60
_HFU = _MFU * 8 / 6  # 0.80


def _check_hardware_utilisation(answer: object) -> None:
    answer = plain(answer)
    assert not (isinstance(answer, (int, float)) and not isinstance(answer, bool) and 1 < answer <= 100), (
        f"give a fraction, not a percentage: {answer!r}% is {answer / 100!r}"
    )
    u = positive_number(answer, "the HFU")
    assert not near(u, _MFU, 0.01), "that is the MFU: the chip also runs the recomputed forward pass"
    assert not near(u, _MFU * 6 / 8, 0.01), (
        "the chip runs more FLOPs than the model counts, in the same step, so its utilisation is higher, not lower"
    )
    assert u <= 1, f"{u!r} is above 1: no chip runs faster than its peak"
    assert near(u, _HFU, 0.01), f"{u!r} is not it: the same step, 8 N T FLOPs instead of 6 N T"


hardware_utilisation = Exercise(
    title="Exercise 2: MFU against HFU",
    checker=_check_hardware_utilisation,
    solution=_HFU,
    wrong=(_MFU, _MFU * 6 / 8, 80, 1.2, 0.7),
    hint="the step time is the same; only the FLOPs counted change, from 6 N T to 8 N T",
    explanation=(
        "0.80: 60% x 8 / 6. MFU is the fair number for comparing runs, because it does not reward recomputation; "
        "HFU says how busy the matrix units were. At 80% HFU there is little left to gain in the matmuls, and "
        "the way to a higher MFU is to recompute less (a lighter remat policy, if the memory allows)."
    ),
)
