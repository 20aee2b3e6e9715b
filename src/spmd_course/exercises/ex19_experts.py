"""Exercises of notebook 19: expert parallelism (a mixture of experts on an `expert` axis)."""

from __future__ import annotations

import math

import numpy as np

from spmd_course.utils.exercises import Exercise, answer_errors, plain

# Exercise 1: 256 experts, top-8, width 7,168 in bf16, 4,096 tokens per device, capacity factor 1, 64 devices.
_E, _K, _D, _TOKENS, _N = 256, 8, 7168, 4096, 64
_C = math.ceil(1.0 * _K * _TOKENS / _E)  # 128 slots per expert
_BUFFER = _E * _C * _D * 2  # 448 MiB
_SENT = _BUFFER * (_N - 1) // _N


def _check_a2a_bytes(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, tuple) and len(answer) == 2, (
        f"give a pair (bytes of the all-to-all's result per device, bytes each device sends to others); got {answer!r}"
    )
    assert all(isinstance(v, int | float) and not isinstance(v, bool) for v in answer), (
        f"give two numbers of bytes; got {answer!r}"
    )
    buffer, sent = answer
    assert buffer != _BUFFER // _K, "each token makes k = 8 choices: the buffer holds 8 x 4,096 token slots in all"
    assert buffer != 2 * _BUFFER, "bf16 is 2 bytes per element, not 4"
    assert buffer != _BUFFER * _N, "the capacity is per device's group of 4,096 tokens, not the whole batch's"
    assert buffer == _BUFFER, (
        f"the result: {buffer} is not it. It is the (E, C, D) buffer: C = ceil(1.0 x 8 x 4096 / 256) slots per "
        "expert, 256 experts, 7,168 values of 2 bytes each"
    )
    assert sent != buffer, "one block of the buffer stays on its own device: it is not sent"
    assert abs(sent - _SENT) <= 1, (
        f"sent: {sent} is not it. Each device keeps the block for its own experts, 1/64 of the buffer, and sends "
        "the rest"
    )


a2a_bytes = Exercise(
    title="Exercise 1: one all-to-all's bytes",
    checker=_check_a2a_bytes,
    solution=(_BUFFER, _SENT),
    wrong=((_BUFFER, _BUFFER), (2 * _BUFFER, 2 * _SENT), (_BUFFER // _K, _SENT // _K), (_BUFFER * _N, _SENT * _N),
           (_BUFFER, _BUFFER // _N), (_SENT, _BUFFER)),
    hint="the buffer is experts x capacity x width x 2 bytes, with capacity = ceil(factor x k x tokens / experts); "
    "a device sends all but its own 1/64 of it",
    explanation=(
        "448 MiB per all-to-all, 441 MiB of it sent: k x tokens x width x 2 bytes, whatever the number of experts. "
        "A layer runs four per training step (dispatch and combine, forward and backward), more if rematerialised."
    ),
)


# Exercise 2: the dispatch all-to-all inside jax.shard_map.
def _expected(blocks: np.ndarray, n: int) -> np.ndarray:
    """blocks (n devices, E, C, D) -> each device's (E / n, n x C, D): its experts' slots from every device."""
    devices, experts, slots, width = blocks.shape
    per = experts // n
    out = blocks.reshape(devices, n, per, slots, width)  # [source, destination, local expert, slot, width]
    return out.transpose(1, 2, 0, 3, 4).reshape(n, per, devices * slots, width)


def _check_to_experts(answer: object) -> None:
    import jax
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    assert callable(answer), f"give a function to_experts(sent) to call inside jax.shard_map; got {answer!r}"
    n = 8
    mesh = jax.make_mesh((n,), ("expert",), axis_types=(AxisType.Auto,))
    for experts in (8, 16):
        blocks = np.arange(n * experts * 3 * 2, dtype=np.float32).reshape(n, experts, 3, 2)  # C = 3, D = 2
        call = jax.shard_map(lambda b: answer(b[0])[None], mesh=mesh, in_specs=P("expert"), out_specs=P("expert"))
        with answer_errors(f"to_experts on a (E={experts}, C=3, D=2) buffer per device"):
            got = np.asarray(call(blocks))
        want = _expected(blocks, n)
        assert got.shape == want.shape, (
            f"with {experts} experts on 8 devices each device must hold (E / 8, 8 x C, D) = {want.shape[1:]}; "
            f"got {got.shape[1:]} (split the experts, axis 0; concatenate the slots, axis 1; tiled=True)"
        )
        assert np.array_equal(got, want), (
            f"with {experts} experts: the shape is right but the values are not where they belong: device d must "
            "receive block d of every device's expert axis, in order of the sending device, along the slots"
        )


def _solution_to_experts(sent):
    import jax

    return jax.lax.all_to_all(sent, "expert", split_axis=0, concat_axis=1, tiled=True)


def _wrong_direction(sent):
    import jax

    return jax.lax.all_to_all(sent, "expert", split_axis=1, concat_axis=0, tiled=True)


def _wrong_swapped_blocks(sent):
    import jax

    per = sent.shape[0] // 8
    out = jax.lax.all_to_all(sent, "expert", split_axis=0, concat_axis=1, tiled=True)
    return out.reshape(per, 8, -1, out.shape[-1])[:, ::-1].reshape(out.shape)  # devices in reverse order


def _wrong_gather(sent):
    import jax

    return jax.lax.all_gather(sent, "expert", axis=1, tiled=True)[: sent.shape[0] // 8]  # someone else's experts


to_experts = Exercise(
    title="Exercise 2: the dispatch all-to-all",
    checker=_check_to_experts,
    solution=_solution_to_experts,
    wrong=(_wrong_direction, _wrong_swapped_blocks, _wrong_gather, lambda sent: sent,
           lambda sent: sent.reshape(sent.shape[0] // 8, -1, sent.shape[-1])),
    hint="jax.lax.all_to_all(sent, 'expert', split_axis=..., concat_axis=..., tiled=True): split the axis that "
    "says which expert, concatenate along the slots",
    explanation=(
        "split_axis=0 cuts the experts into 8 blocks, block d goes to device d; concat_axis=1 stacks what arrives "
        "along the slots, in the order of the sending device. The combine is the reverse: split_axis=1, "
        "concat_axis=0."
    ),
)


# Exercise 3: the load-balancing loss when the router sends every choice to one expert.
def _balance(f: np.ndarray, p: np.ndarray) -> float:
    return float(len(f) * np.sum(f * p))


_COLLAPSED = _balance(np.eye(8)[0], np.eye(8)[0])  # 8.0


def _check_collapsed(answer: object) -> None:
    answer = plain(answer)
    assert isinstance(answer, int | float) and not isinstance(answer, bool), f"give a number; got {answer!r}"
    assert answer != 1, "1 is the loss of a perfectly balanced router; this one sends everything to one expert"
    assert answer != 1 / 8, "the loss multiplies by the number of experts, E x sum of f_e x p_e"
    assert abs(answer - _COLLAPSED) < 1e-9, (
        f"{answer} is not it: f is 1 for one expert and 0 elsewhere, p the same, so sum f_e x p_e = 1; times E"
    )


collapsed_balance = Exercise(
    title="Exercise 3: a collapsed router's load-balancing loss",
    checker=_check_collapsed,
    solution=_COLLAPSED,
    wrong=(1, 1.0 / 8, 0, 64, 2),
    hint="E x sum over experts of f_e x p_e, with f the fraction of choices and p the mean probability per expert",
    explanation=(
        "8, its largest value: the loss runs from 1 (every expert used equally) to E (one expert takes everything), "
        "and its gradient through p pushes the router's probability away from the overused experts."
    ),
)

