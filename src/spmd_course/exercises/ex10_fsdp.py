"""Exercises of notebook 10: the FSDP rule, and the Adam state it leaves on each device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from spmd_course.utils.exercises import Exercise, answer_errors, plain

_N = 8  # devices on the 'fsdp' axis

# A test state: names, shapes, and what FSDP must do with each.
_STATE = {
    "embed": (1024, 64),  # large; both dimensions divide by 8
    "w_in": (10, 256),  # large; only dimension 1 divides by 8
    "w_odd": (10, 250),  # large; no dimension divides by 8 -> replicate
    "w_out": (256, 10),  # large; only dimension 0 divides by 8 (the course's linear2/kernel)
    "w_24": (24, 100),  # large; dimension 0 divides by 8 but not by 16
    "w_12": (12, 100),  # large; both dimensions divide by 4, neither by 8 -> replicate
    "mid": (1032,),  # large, just above 1,024 (and below 1,500): split
    "big_vec": (2048,),  # large 1-D
    "scale": (1024,),  # exactly 1,024 elements: not more than 1,024 -> replicate
    "bias": (256,),  # small
    "count": (),  # a scalar
}


def _entries(spec: PartitionSpec, ndim: int) -> list:
    return list(spec) + [None] * (ndim - len(spec))


def _check_fsdp_rule(rule: object) -> None:
    assert callable(rule), f"give a function fsdp_spec(path, leaf) that returns a PartitionSpec; got {rule!r}"
    state = {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in _STATE.items()}
    specs = {}
    for name, leaf in state.items():
        with answer_errors(f"your function, for {name} {leaf.shape} (leaf is a jax.ShapeDtypeStruct: use "
                           "leaf.shape, leaf.ndim and leaf.size),"):
            specs[name] = rule((jax.tree_util.DictKey(name),), leaf)
    for name, leaf in state.items():
        spec = specs[name]
        assert isinstance(spec, PartitionSpec), (
            f"for {name} {leaf.shape} your function returned {spec!r}; return a PartitionSpec such as P() or "
            "P(None, 'fsdp')"
        )
        assert len(spec) <= leaf.ndim, f"{name} {leaf.shape} got {spec}: more entries than dimensions"
        entries = _entries(spec, leaf.ndim)
        assert all(e in (None, "fsdp") for e in entries), f"{name} got {spec}: use only 'fsdp' and None"
        split = [d for d, e in enumerate(entries) if e == "fsdp"]
        assert len(split) <= 1, (
            f"{name} got {spec}: the 'fsdp' axis appears {len(split)} times, but a mesh axis can split only one "
            "dimension of an array (its 8 devices cannot be 8 ways along two dimensions at once)"
        )
        divisible = [d for d, n in enumerate(leaf.shape) if n % _N == 0]
        if leaf.size > 1024 and divisible:
            assert split, f"{name} {leaf.shape} has {leaf.size} elements (more than 1,024): split it on 'fsdp'"
            assert split[0] in divisible, (
                f"{name} {leaf.shape} got {spec}: dimension {split[0]} has {leaf.shape[split[0]]} entries, which "
                f"do not split {_N} ways; pick a dimension that {_N} divides"
            )
        elif leaf.size > 1024:
            assert not split, f"{name} {leaf.shape} got {spec}, but no dimension divides by {_N}: replicate it"
        else:
            assert not split, (
                f"{name} {leaf.shape} has only {leaf.size} elements (not more than 1,024): keep it replicated, P()"
            )


def _solution_fsdp_spec(path, leaf):
    if leaf.size > 1024:
        for dim, size in enumerate(leaf.shape):
            if size % 8 == 0:
                return PartitionSpec(*[None] * dim, "fsdp")
    return PartitionSpec()


fsdp_rule = Exercise(
    title="Exercise 1: the FSDP rule",
    checker=_check_fsdp_rule,
    solution=_solution_fsdp_spec,
    wrong=(
        # always dimension 0, whether it divides or not
        lambda path, leaf: PartitionSpec("fsdp") if leaf.size > 1024 else PartitionSpec(),
        # everything split, whatever its size
        lambda path, leaf: PartitionSpec("fsdp") if leaf.ndim else PartitionSpec(),
        # nothing split: that is data parallelism
        lambda path, leaf: PartitionSpec(),
        # threshold off by one: 1,024 elements is not "more than 1,024"
        lambda path, leaf: PartitionSpec("fsdp") if leaf.ndim == 1 and leaf.size >= 1024 else _solution_fsdp_spec(
            path, leaf
        ),
        # one axis on two dimensions: not a valid layout
        lambda path, leaf: PartitionSpec("fsdp", "fsdp") if leaf.shape == (1024, 64) else _solution_fsdp_spec(
            path, leaf
        ),
        # the last dimension only: replicates (256, 10), whose dimension 0 divides
        lambda path, leaf: PartitionSpec(*[None] * (leaf.ndim - 1), "fsdp")
        if leaf.size > 1024 and leaf.shape[-1] % 8 == 0 else PartitionSpec(),
        # divisible by 16 instead of by the 8 devices: replicates (24, 100)
        lambda path, leaf: next((PartitionSpec(*[None] * d, "fsdp") for d, n in enumerate(leaf.shape) if n % 16 == 0),
                                PartitionSpec()) if leaf.size > 1024 else PartitionSpec(),
        # divisible by 4 instead of by the 8 devices: splits (12, 100), which 8 devices cannot divide evenly
        lambda path, leaf: next((PartitionSpec(*[None] * d, "fsdp") for d, n in enumerate(leaf.shape) if n % 4 == 0),
                                PartitionSpec()) if leaf.size > 1024 else PartitionSpec(),
        # a threshold of 1,500 elements instead of 1,024: replicates (1032,)
        lambda path, leaf: _solution_fsdp_spec(path, leaf) if leaf.size > 1500 else PartitionSpec(),
        # a threshold of 2,000 elements: replicates (1032,)
        lambda path, leaf: _solution_fsdp_spec(path, leaf) if leaf.size > 2000 else PartitionSpec(),
        # a function that fails: rejected with its error, not a crash
        lambda path, leaf: PartitionSpec("fsdp") if leaf.shape[0] % 8 == 0 else PartitionSpec(),
    ),
    hint=(
        "if leaf.size > 1024, loop over enumerate(leaf.shape) and return P(*[None] * dim, 'fsdp') for the first "
        "size that 8 divides; otherwise (and if none divides) return P()"
    ),
    explanation=(
        "Returning specs (or shardings) instead of moving arrays lets one rule lay out parameters, optimizer state "
        "and jit's in/out shardings alike."
    ),
)


_ADAM_FSDP = 2 * (64 * 512 // 8 + 512 * 10 // 8 + 512 + 10) * 4  # 42,064


def _check_adam_bytes(n: object) -> None:
    n = plain(n)
    assert isinstance(n, int) and not isinstance(n, bool), f"give a whole number of bytes; got {n!r}"
    assert n != 2 * (64 * 512 + 512 + 512 * 10 + 10) * 4, "that is the replicated (data-parallel) size"
    assert n != 2 * (64 * 512 + 512 + 512 * 10 + 10) * 4 // 8, (
        "not everything is split: the biases (512 and 10 elements) are under the 1,024 threshold and stay whole"
    )
    assert n != _ADAM_FSDP // 2, "Adam keeps two moments, mu and nu"
    assert n != 2 * (64 * 512 // 8 + 512 * 10 // 8) * 4, "the biases have moments too, whole on every device"
    assert n != _ADAM_FSDP + 4, "leave out the 4-byte counter"
    assert n == _ADAM_FSDP, (
        f"{n} bytes is not it: each moment has the parameters' shapes; the kernels (64x512, 512x10) are split 8 "
        "ways, the biases (512, 10) are whole; two moments of 4-byte floats"
    )


adam_bytes_per_device = Exercise(
    title="Exercise 2: Adam state per device under FSDP",
    checker=_check_adam_bytes,
    solution=_ADAM_FSDP,
    wrong=(307_280, 38_410, _ADAM_FSDP // 2, _ADAM_FSDP + 4, 2 * (64 * 512 // 8 + 512 * 10 // 8) * 4),
    hint="one moment = (64*512/8 + 512*10/8 + 512 + 10) floats; Adam has two; 4 bytes per float",
    explanation=(
        "2 x (4,096 + 640 + 512 + 10) x 4 = 42,064 bytes, against 307,280 bytes replicated: 7.3x less, not 8x, "
        "because the biases are replicated."
    ),
)
