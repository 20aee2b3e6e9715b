"""Exercises of notebook 21: compiling for TPU pods you don't have."""

from __future__ import annotations

from spmd_course.utils.exercises import Exercise, plain

_BLOCK = 128 * 1024  # elements of one device's (128, 1024) block of x
_GATHER = (_BLOCK * 4, _BLOCK * 2)  # (CPU float32, TPU bf16)


def _check_gather_bytes(answer: object) -> None:
    answer = plain(answer)  # numpy integers, whole floats and a list are as good
    assert isinstance(answer, tuple) and len(answer) == 2, f"give a pair (CPU bytes, TPU bytes); got {answer!r}"
    cpu, tpu = answer
    assert all(isinstance(n, int) and not isinstance(n, bool) for n in answer), (
        f"give two whole numbers of bytes; got {answer!r}"
    )
    assert (cpu, tpu) != (_GATHER[1], _GATHER[0]), "swapped: the CPU gathers float32, the TPU bf16"
    assert cpu == _GATHER[0], (
        f"CPU: {cpu} is not it. The result is the (128, 1024) block in float32, 4 bytes per element"
    )
    assert tpu != _GATHER[0], (
        "the TPU compiler does not gather float32 here: it converts the matmul operand to bf16 first"
    )
    assert tpu == _GATHER[1], f"TPU: {tpu} is not it. The same (128, 1024) elements in bf16, 2 bytes each"


gather_bytes = Exercise(
    title="Exercise 1: the all-gather's result on each compiler",
    checker=_check_gather_bytes,
    solution=_GATHER,
    wrong=((_GATHER[1], _GATHER[0]), (_GATHER[0], _GATHER[0]), (_BLOCK * 4 * 2, _BLOCK * 2 * 2), (_BLOCK, _BLOCK)),
    hint="result_bytes is the gathered block: 128 x 1024 elements, 4 bytes each in float32, 2 in bf16",
    explanation=(
        "524,288 bytes on CPU against 262,144 on TPU: the TPU multiplies float32 in bf16 by default, so it "
        "gathers bf16 and moves half the bytes."
    ),
)


_MATRICES = 8_029_995_008  # 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336) + 2 x 128256 x 4096
_SCALES = 266_240  # 2 x 32 x 4096 + 4096
_STATE = 3 * 4 * (_MATRICES // 256 + _SCALES // 64)  # parameter, mu and nu: float32 each


def _check_state_per_chip(n: object) -> None:
    n = plain(n)  # a numpy integer or a whole float (from `/`) is as good
    assert isinstance(n, int) and not isinstance(n, bool), f"give a whole number of bytes; got {n!r}"
    assert n != 3 * 4 * (_MATRICES + _SCALES), "that is the whole state: data parallelism puts it on every chip"
    assert n != 3 * 4 * (_MATRICES + _SCALES) // 256, (
        "not everything is split 256 ways: the norm scales have only an 'embed' dimension, split 64 ways over 'data'"
    )
    assert n != 4 * (_MATRICES // 256 + _SCALES // 64), "that is the parameters alone; Adam adds mu and nu"
    assert n != 3 * 2 * (_MATRICES // 256 + _SCALES // 64), "the state is float32 here: 4 bytes per number, not 2"
    assert n != _STATE + 8, "leave out the two step counters"
    assert n == _STATE, (
        f"{n} bytes is not it: parameters, mu and nu are three arrays of each shape, 4 bytes per element; "
        "matrices split 256 ways, norm scales 64 ways"
    )


state_per_chip = Exercise(
    title="Exercise 2: the state one chip stores",
    checker=_check_state_per_chip,
    solution=_STATE,
    wrong=(
        3 * 4 * (_MATRICES + _SCALES),
        3 * 4 * (_MATRICES + _SCALES) // 256,
        4 * (_MATRICES // 256 + _SCALES // 64),
        3 * 2 * (_MATRICES // 256 + _SCALES // 64),
        _STATE + 8,
    ),
    hint="3 arrays (parameter, mu, nu) x 4 bytes x (8,029,995,008 / 256 + 266,240 / 64)",
    explanation=(
        "376,455,936 bytes (359 MiB), the 'arguments' of the fitting row less the tokens and counters: 1/256 of "
        "the 90 GiB the data-parallel rows would put on every chip."
    ),
)


_HBM_GIB = {"v5e": 15.75, "v6e": 31.24, "v5p": 95.73}  # HBM one program may use, the compiler's (notebook 21)


def _check_which_generations(answer: object) -> None:
    answer = plain(answer)  # a set becomes a frozenset; numpy strings stay strings
    assert isinstance(answer, (set, frozenset)), f"give a set of names such as {{'v5e'}}; got {answer!r}"
    unknown = set(answer) - set(_HBM_GIB)
    assert not unknown, f"{sorted(unknown)} is not one of {sorted(_HBM_GIB)}"
    expected = {name for name, gib in _HBM_GIB.items() if gib > 40}
    assert "v5e" not in answer, "a v5e program may use 15.75 GiB: 40 GiB is more than two and a half of them"
    assert "v6e" not in answer, "a v6e program may use 31.24 GiB: more than a v5e, still less than 40 GiB"
    assert answer == expected, "the v5p's 95.73 GiB per chip holds it"


which_generations = Exercise(
    title="Exercise 3: which chips could hold it",
    checker=_check_which_generations,
    solution={"v5p"},
    wrong=({"v6e", "v5p"}, {"v5e", "v6e", "v5p"}, set(), "v5p", {"v5p", "v4"}),
    hint="compare 40 GiB with each generation's HBM per chip in section 1's table",
    explanation=(
        "Only a v5p chip (95.73 GiB usable) holds 40 GiB. On v5e or v6e, split the state instead (FSDP, TP), as "
        "section 6 does; and compile for the v5p topology to confirm, since its program is not the v5e's."
    ),
)
