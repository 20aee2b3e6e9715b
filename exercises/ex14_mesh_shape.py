"""Exercises of notebook 14: reading and choosing a mesh shape."""

from __future__ import annotations

import numpy as np

from utils.exercises import Exercise

# Notebook 14's model: d_model 512, 2 layers, d_ff 2048, vocabulary 512, sequences of 32.
N_SPLIT = 2 * (4 * 512**2 + 2 * 512 * 2048) + 2 * 512 * 512  # matrices with 'heads', 'mlp' or 'vocab'
N_EMBED_ONLY = 5 * 2 * 512 + 32 * 512  # layer norms and the position table
SHAPES = [(64, 1), (32, 2), (16, 4), (8, 8), (1, 64)]


def _state_bytes(model_axis: int) -> int:
    return 12 * (N_SPLIT // model_axis + N_EMBED_ONLY) + 8


def _check_state_bytes(n: object) -> None:
    assert isinstance(n, int | np.integer) and not isinstance(n, bool), f"give a whole number of bytes; got {n!r}"
    assert n != _state_bytes(4), "that divides by 4, the data axis: the data axis repeats the state, 'model' splits it"
    assert n != 12 * (N_SPLIT + N_EMBED_ONLY) // 16 + 8, (
        "the layer norms and the position table have only 'embed', which no axis splits: they stay whole")
    assert n != 4 * (N_SPLIT // 16 + N_EMBED_ONLY) + 8, "that is the parameters only: Adam adds two moments"
    assert n != _state_bytes(16) - 8, "almost: add the 8 bytes of step counters"
    assert n == _state_bytes(16), (
        f"{n} is not it: 12 bytes x (n_split / 16 + n_embed_only) + 8, with the model axis = 16")


state_bytes = Exercise(
    title="Exercise 1: the state on a (4, 16) mesh",
    checker=_check_state_bytes,
    solution=_state_bytes(16),
    wrong=(_state_bytes(4), _state_bytes(64), 12 * (N_SPLIT + N_EMBED_ONLY) // 16 + 8, _state_bytes(16) - 8,
           4 * (N_SPLIT // 16 + N_EMBED_ONLY) + 8),
    hint="only the model axis (16) divides the state, and only its n_split part; 12 bytes per parameter",
    explanation=(
        "12 x (6,815,744 / 16 + 21,504) + 8 = 5,369,864 bytes (5.1 MiB), between the (16, 4) and (8, 8) rows "
        "... and the same as on a (1, 16) or (2, 16) mesh: the data axis never changes the state per device."
    ),
)

# Footprints (arguments + temporaries per device), as notebook 14 measures them (MiB).
_FOOTPRINT = {(64, 1): 130.5, (32, 2): 65.5, (16, 4): 33.0, (8, 8): 23.5, (1, 64): 92.9}


def _check_pick(shape: object) -> None:
    assert isinstance(shape, tuple) and len(shape) == 2, f"give one mesh shape as a tuple (data, model); got {shape!r}"
    assert all(_is_whole(v) for v in shape), f"a mesh shape is two whole numbers, such as (16, 4); got {shape!r}"
    shape = tuple(int(v) for v in shape)
    assert shape in _FOOTPRINT, f"{shape} is not one of the five shapes {SHAPES}"
    assert _FOOTPRINT[shape] <= 24, (
        f"{shape} needs about {_FOOTPRINT[shape]:.0f} MiB per device (the footprint column): it does not fit")
    assert shape == (8, 8), f"{shape} does not fit either"


pick_shape = Exercise(
    title="Exercise 2: pick a shape for 24 MiB per device",
    checker=_check_pick,
    solution=(8, 8),
    wrong=((16, 4), (64, 1), (1, 64), (32, 2)),
    hint="first drop every shape whose footprint is over 24 MiB; then compare the bytes moved of what is left",
    explanation=(
        "Only (8, 8) fits (about 23.5 MiB), so it wins even though (16, 4) moves slightly fewer bytes. Memory "
        "decides first; among the shapes that fit, communication decides."
    ),
)


def _is_whole(v: object) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def _check_divisibility(answer: object) -> None:
    assert isinstance(answer, tuple | list) and len(answer) == 2, (
        f"give two lists of shapes, (lowers, whole_heads); got {answer!r}")
    for label, part in zip(("lowers", "whole heads"), answer, strict=True):
        assert isinstance(part, list | tuple | set) and all(
            isinstance(s, tuple | list) and len(s) == 2 and all(_is_whole(v) for v in s) for s in part
        ), f"{label}: give a list of mesh shapes such as [(32, 2), (16, 4)]; got {part!r}"
    lowers, whole = ({(int(d), int(m)) for d, m in part} for part in answer)
    want_lowers = {(d, m) for d, m in SHAPES if 96 % d == 0}
    want_whole = {(d, m) for d, m in want_lowers if 16 % m == 0}
    assert lowers == want_lowers, (
        f"lowers: {sorted(lowers)}. The batch of 96 must divide into 'data' blocks: 96 / d must be whole")
    assert whole == want_whole, (
        f"whole heads: {sorted(whole)}. A device holds whole heads when 'model' divides the 16 heads "
        "(and the shape lowers at all)")


divisibility = Exercise(
    title="Exercise 3: 16 heads, a batch of 96",
    checker=_check_divisibility,
    solution=([(32, 2), (16, 4), (8, 8), (1, 64)], [(32, 2), (16, 4), (8, 8)]),
    wrong=(
        (SHAPES, [(64, 1), (32, 2), (16, 4), (8, 8)]),  # forgot the batch
        ([(32, 2), (16, 4), (8, 8), (1, 64)], [(32, 2), (16, 4), (8, 8), (1, 64)]),  # 64 splits 16 heads
        ([(32, 2), (16, 4), (8, 8)], [(32, 2), (16, 4), (8, 8)]),  # (1, 64) lowers: 96 / 1 is whole
    ),
    hint="the batch constrains 'data' (96 / d whole); the heads constrain 'model' (16 / m whole)",
    explanation=(
        "96 is not divisible by 64, so (64, 1) raises IndivisibleError; the other four lower. Of those, (1, 64) "
        "splits each of the 16 heads over 4 devices (extra score all-reduces, no error); the rest keep whole heads."
    ),
)
