"""Exercises of notebook 05: asking for a layout inside jit, on Auto and on Explicit axes."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import Exercise, answer_errors
from spmd_course.utils.inspecting import collectives, compile_with_log

P = PartitionSpec


def _mesh(kind: AxisType) -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))


# Exercise 1: reach P(None, 'model') from P('data', None) without a full copy on any device ----------------------


def _check_to_columns(f: Any) -> None:
    assert callable(f), f"give a function to_columns(v); got {type(f).__name__}"
    mesh = _mesh(AxisType.Auto)
    values = np.arange(128 * 512, dtype=np.float32).reshape(128, 512)
    target = NamedSharding(mesh, P(None, "model"))
    with jax.set_mesh(mesh):
        x = jax.device_put(values, NamedSharding(mesh, P("data", None)))
        with answer_errors("jax.jit(your function) on a (128, 512) array at P('data', None)"):
            compiled, _ = compile_with_log(jax.jit(f).lower(x))
            out = compiled(x)
    assert isinstance(out, jax.Array) and out.shape == (128, 512), (
        "return the array itself, in its new layout (same shape, same values)"
    )
    assert out.sharding.is_equivalent_to(target, 2), (
        f"the result came out as {getattr(out.sharding, 'spec', out.sharding)}, not P(None, 'model'); "
        "inside jit on Auto axes jax.device_put changes nothing: ask with jax.lax.with_sharding_constraint"
    )
    assert np.array_equal(np.asarray(out), values), "the values changed: a reshard moves data, it never changes it"
    ops = collectives(compiled)
    whole = max((op.result_bytes for op in ops.ops), default=0)
    assert whole < values.nbytes, (
        "the right layout, but the compiled program gathers the whole (128, 512) array on every device "
        "(XLA's 'Involuntary full rematerialization'); stop at P('data', 'model') on the way, a local slice"
    )
    assert ops.result_bytes < values.nbytes, (
        f"the right layout, but the collectives return {ops.result_bytes} bytes per device in all, as much as "
        f"the whole array ({values.nbytes} bytes): a full copy in pieces is still a full copy. Stop at "
        "P('data', 'model') on the way, a local slice, and gather only the columns each device keeps"
    )


def _to_columns_solution(v):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))  # the notebook's
    v = jax.lax.with_sharding_constraint(v, NamedSharding(mesh, P("data", "model")))  # a local slice
    return jax.lax.with_sharding_constraint(v, NamedSharding(mesh, P(None, "model")))  # gather the kept columns


def _to_columns_direct(v):
    return jax.lax.with_sharding_constraint(v, NamedSharding(_mesh(AxisType.Auto), P(None, "model")))


def _to_columns_device_put(v):
    return jax.device_put(v, NamedSharding(_mesh(AxisType.Auto), P(None, "model")))


def _to_columns_reshard(v):
    return jax.reshard(v, NamedSharding(_mesh(AxisType.Auto), P(None, "model")))


def _to_columns_waypoint_only(v):
    return jax.lax.with_sharding_constraint(v, NamedSharding(_mesh(AxisType.Auto), P("data", "model")))


def _to_columns_two_halves(v):  # a full copy in two gathers of half the columns each, then a slice
    mesh = _mesh(AxisType.Auto)
    left = jax.lax.with_sharding_constraint(v[:, :256], NamedSharding(mesh, P()))
    right = jax.lax.with_sharding_constraint(v[:, 256:], NamedSharding(mesh, P()))
    return jax.lax.with_sharding_constraint(jnp.concatenate([left, right], axis=1),
                                            NamedSharding(mesh, P(None, "model")))


to_columns = Exercise(
    title="Exercise 1: a reshard through a waypoint",
    checker=_check_to_columns,
    solution=_to_columns_solution,
    wrong=(_to_columns_direct, _to_columns_device_put, _to_columns_reshard, _to_columns_waypoint_only,
           lambda v: v, _to_columns_two_halves),
    hint="two with_sharding_constraint calls: first P('data', 'model'), then P(None, 'model')",
    explanation=(
        "P('data', 'model') is a local slice of P('data', None): no data moves. From there each device "
        "gathers only its half of the columns over 'data' (an all-gather of (128, 256)), instead of the whole "
        "array that the direct constraint gathers."
    ),
)


# Exercise 2: an ambiguous matmul on Explicit axes ---------------------------------------------------------------


def _moved_bytes(compiled: Any) -> int:
    """What a compiled program's collectives produce on each device, all together."""
    return sum(op.result_bytes for op in collectives(compiled).ops)


def _check_rows_matmul(f: Any) -> None:
    assert callable(f), f"give a function f(a, b); got {type(f).__name__}"
    mesh = _mesh(AxisType.Explicit)
    rng = np.random.default_rng(5)
    a_values = rng.normal(size=(128, 256)).astype(np.float32)
    b_values = rng.normal(size=(256, 64)).astype(np.float32)
    with jax.set_mesh(mesh):
        a = jax.device_put(a_values, P(None, "model"))
        b = jax.device_put(b_values, P("model", None))
        with answer_errors("jax.jit(your function) on a: f32[128,256@model], b: f32[256@model,64]"):
            compiled, _ = compile_with_log(jax.jit(f).lower(a, b))  # keeps XLA's rematerialization warning quiet
            out = compiled(a, b)
        direct = _moved_bytes(jax.jit(_rows_matmul_solution).lower(a, b).compile())
    assert isinstance(out, jax.Array) and out.shape == (128, 64), (
        f"return the product a @ b, of shape (128, 64); got {getattr(out, 'shape', type(out).__name__)}"
    )
    typ = str(jax.typeof(out))
    assert typ == "float32[128@data,64]", (
        f"the result's type is {typ}; ask for rows split over 'data' and whole columns: "
        "jnp.matmul(a, b, out_sharding=P('data', None))"
    )
    assert np.allclose(np.asarray(out), a_values @ b_values, rtol=1e-4, atol=1e-3), "the values are not a @ b"
    moved = _moved_bytes(compiled)
    assert moved <= direct, (
        f"the right layout, but the compiled program's collectives produce {moved:,} bytes on each device, "
        f"against {direct:,} when the matmul itself is told where its product goes: a reshard before or after "
        "the matmul copies whole operands or the whole product. Pass out_sharding=P('data', None) to "
        "jnp.matmul itself"
    )


def _rows_matmul_solution(a, b):
    return jnp.matmul(a, b, out_sharding=P("data", None))


rows_matmul = Exercise(
    title="Exercise 2: say where the product goes",
    checker=_check_rows_matmul,
    solution=_rows_matmul_solution,
    wrong=(
        lambda a, b: a @ b,
        lambda a, b: jnp.matmul(a, b, out_sharding=P(None, None)),
        lambda a, b: jnp.matmul(a, b, out_sharding=P("data", "model")),
        lambda a, b: jax.reshard(a @ b, P("data", None)),
        lambda a, b: jax.lax.with_sharding_constraint(a @ b, P("data", None)),
        # layouts fixed around the matmul, not by it: b (then a) copied whole, or the whole product summed
        lambda a, b: jax.reshard(a, P("data", None)) @ jax.reshard(b, P(None, None)),
        lambda a, b: jax.reshard(jnp.matmul(a, b, out_sharding=P(None, None)), P("data", None)),
    ),
    hint="jnp.matmul takes out_sharding=; P('data', None) means rows over 'data', columns whole",
    explanation=(
        "Both operands split the contracting dimension over 'model', so each device holds partial sums and "
        "the result's layout is ambiguous: Explicit axes refuse to guess. out_sharding=P('data', None) says "
        "which; the compiler then adds up each row block's partial sums within each 'model' pair (an all-reduce)."
    ),
)
