"""Exercises of notebook 04: predict the collectives of a matmul, and write a sharding constraint.

The checkers compile on the notebook's mesh, a (4, 2) mesh with Auto axes named
('data', 'model'), so the verdict is what the compiler does, not a stored answer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from utils.exercises import Exercise, answer_errors
from utils.inspecting import COLLECTIVES, collectives

P = PartitionSpec


def _auto_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def _fsdp_program():
    """x @ w with both operands' first dimension cut over all 8 devices, compiled."""
    mesh = _auto_mesh()
    fsdp = NamedSharding(mesh, P(("data", "model"), None))
    x = jax.device_put(jnp.ones((128, 256), jnp.float32), fsdp)
    w = jax.device_put(jnp.ones((256, 512), jnp.float32), fsdp)
    return jax.jit(lambda x, w: x @ w).lower(x, w).compile()


def _check_predict_collective(answer: object) -> None:
    assert isinstance(answer, dict), (
        f"give a dict of collective kind to count, such as {{'all-reduce': 1}}; got {answer!r}"
    )
    unknown = [k for k in answer if k not in COLLECTIVES]
    assert not unknown, f"unknown collective kind(s) {unknown}; the kinds are {list(COLLECTIVES)}"
    assert all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in answer.values()), (
        f"counts must be whole numbers >= 0, such as {{'all-reduce': 1}}; got {answer!r}"
    )
    predicted = {k: n for k, n in answer.items() if n}
    measured = {k: n for k, n in collectives(_fsdp_program()).counts.items() if n}
    if predicted != measured:
        if "all-reduce" in predicted:
            raise AssertionError(
                f"you predicted {predicted}, the compiled program has {measured}. An all-reduce sums partial "
                "products; here x's cut dimension is its rows (not contracting), so no device computes a "
                "partial sum"
            )
        raise AssertionError(f"you predicted {predicted}, but the compiled program has {measured}")


predict_collective = Exercise(
    title="Exercise 1: predict the collective",
    checker=_check_predict_collective,
    solution={"all-gather": 1},
    wrong=({"all-reduce": 1}, {}, {"all-gather": 2}, {"all-gather": 1, "reduce-scatter": 1}, "all-gather"),
    hint="which operand is cut along the contracting dimension (w's rows, x's columns)? That is case 2",
    explanation=(
        "w is cut along the contracting dimension (its rows) and x is not (x's cut dimension is its rows, which "
        "the output keeps): case 2. Every device all-gathers w over all 8 devices, then multiplies its own 16 "
        "rows of x locally; the output stays P(('data', 'model'), None). This is what FSDP does before each layer."
    ),
)


def _check_predict_bytes(answer: object) -> None:
    assert isinstance(answer, int | float | np.integer | np.floating) and not isinstance(answer, bool), (
        f"give a number of bytes; got {answer!r}"
    )
    assert np.isfinite(answer), f"give a finite number of bytes; got {answer!r}"
    measured = collectives(_fsdp_program()).estimated_bytes
    if abs(float(answer) - measured) > 0.5:
        hints = {
            256 * 512 * 4: "that is the size of the gathered w on each device, not what each device sends",
            256 * 512 * 4 / 8: "that is one device's shard of w; each device sends it to 7 others in the ring",
            2 * 7 / 8 * 256 * 512 * 4: "that is the all-reduce formula; an all-gather sends (N-1)/N x its result",
        }
        raise AssertionError(hints.get(float(answer), f"{answer} bytes is not what the compiled program sends"))


predict_bytes = Exercise(
    title="Exercise 2: predict the bytes",
    checker=_check_predict_bytes,
    solution=7 / 8 * 256 * 512 * 4,
    wrong=(256 * 512 * 4, 256 * 512 * 4 // 8, 2 * 7 / 8 * 256 * 512 * 4, 3 / 4 * 256 * 512 * 4),
    hint="an all-gather over N devices sends (N-1)/N x the bytes it produces; here it produces all of w",
    explanation=(
        "The all-gather produces the whole w, 256 x 512 x 4 B = 512 KiB, on each device, in a group of N = 8: "
        "7/8 x 512 KiB = 448 KiB = 458752 bytes sent per device."
    ),
)


def _check_write_constraint(constrain: object) -> None:
    assert callable(constrain), f"give a function y -> y with a constraint, e.g. lambda y: ...; got {constrain!r}"
    mesh = _auto_mesh()
    rng = np.random.default_rng(4)
    xv = rng.standard_normal((128, 256)).astype(np.float32)
    wv = rng.standard_normal((256, 512)).astype(np.float32)
    with jax.set_mesh(mesh):
        x = jax.device_put(xv, NamedSharding(mesh, P("data", None)))
        w = jax.device_put(wv, NamedSharding(mesh, P(None, "model")))
        with answer_errors("your function, called on x @ w inside jax.jit,"):
            out = jax.jit(lambda x, w: constrain(x @ w))(x, w)
    assert isinstance(out, jax.Array) and out.shape == (128, 512), (
        f"constrain must return the (128, 512) array it is given; got {type(out).__name__} "
        f"{getattr(out, 'shape', '')}"
    )
    np.testing.assert_allclose(np.asarray(out), xv @ wv, rtol=1e-4, atol=1e-4,
                               err_msg="the values changed: a constraint must only change the layout")
    spec = getattr(out.sharding, "spec", None)
    target = NamedSharding(mesh, P(None, "model"))
    if out.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2):
        raise AssertionError(
            "the output is still P('data', 'model'): your function did not change the layout "
            "(note that jax.device_put inside jit does nothing on an Auto mesh)"
        )
    assert out.sharding.is_equivalent_to(target, 2), f"the output is {spec}, not P(None, 'model')"


def _constrain(y):
    return jax.lax.with_sharding_constraint(y, P(None, "model"))


write_constraint = Exercise(
    title="Exercise 3: write the constraint",
    checker=_check_write_constraint,
    solution=_constrain,
    wrong=(
        lambda y: jax.device_put(y, NamedSharding(_auto_mesh(), P(None, "model"))),
        lambda y: jax.lax.with_sharding_constraint(y, P("model", None)),
        lambda y: jax.reshard(y, P(None, "model")),
        lambda y: y,
        P(None, "model"),
    ),
    hint="on Auto axes, jax.lax.with_sharding_constraint(y, sharding) pins the layout of y inside jit",
    explanation=(
        "with_sharding_constraint(y, P(None, 'model')) pins the product's layout; the compiler inserts one "
        "all-gather along 'data' to honour it. jax.device_put would be ignored inside jit here, and jax.reshard "
        "is only for Explicit axes."
    ),
)
