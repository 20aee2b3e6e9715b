"""Exercises of notebook 22: porting pmap code to jit and shard_map."""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import Exercise, answer_errors, plain
from spmd_course.utils.inspecting import collectives

P = PartitionSpec


def _rtol() -> float:
    """1e-5 on CPU; accelerators multiply float32 at lower precision by default (TF32, bf16 passes)."""
    return 1e-5 if jax.default_backend() == "cpu" else 1e-2


def _mesh_8() -> jax.sharding.Mesh:
    return jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))


# Exercise 1: migrate a pmap step to jax.jit + NamedSharding ---------------------------------------


def _regression_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(12)
    x = rng.normal(size=(64, 16)).astype(np.float32)
    y = (x @ np.arange(16, dtype=np.float32) / 16 + 0.1 * rng.normal(size=64)).astype(np.float32)
    w = np.zeros(16, np.float32)
    return w, x, y


def _old_step(w, x, y):
    g = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - 0.1 * jax.lax.pmean(g, "data")


def _pmap_result() -> np.ndarray:
    w, x, y = _regression_data()
    out = jax.pmap(_old_step, axis_name="data")(np.stack([w] * 8), x.reshape(8, 8, 16), y.reshape(8, 8))
    return np.asarray(out[0])


def _check_migrate(answer: Any) -> None:
    answer = plain(answer)  # a list is as good as a tuple
    assert isinstance(answer, tuple) and len(answer) == 3, (
        f"give a triple (new_step, w_spec, batch_spec); got {type(answer).__name__}"
    )
    new_step, w_spec, batch_spec = answer
    assert callable(new_step), f"the first item must be your step function; got {type(new_step).__name__}"
    for name, spec in (("w_spec", w_spec), ("batch_spec", batch_spec)):
        assert isinstance(spec, PartitionSpec), f"{name} must be a PartitionSpec such as P(...); got {spec!r}"
    mesh = _mesh_8()
    w, x, y = _regression_data()
    # y has one dimension, so it takes batch_spec's first entry: P('data', None) on x is P('data') on y
    y_spec = P(*tuple(batch_spec)[:1])
    with answer_errors("placing w (16,) by w_spec, x (64, 16) by batch_spec and y (64,) by its first entry on "
                       "the mesh ('data',)"):
        w_placed = jax.device_put(w, NamedSharding(mesh, w_spec))
        x_placed = jax.device_put(x, NamedSharding(mesh, batch_spec))
        y_placed = jax.device_put(y, NamedSharding(mesh, y_spec))
    stepped = jax.jit(new_step)
    with answer_errors("your step, called as new_step(w, x, y),"):
        try:
            jaxpr = str(jax.make_jaxpr(new_step)(w_placed, x_placed, y_placed))
        except NameError as err:
            raise AssertionError(
                f"{err}: under jax.jit no axis is bound, so delete the pmean; the compiler inserts the all-reduce"
            ) from None
    assert "shard_map" not in jaxpr and "psum" not in jaxpr, (
        "this exercise asks for plain jax.jit with shardings: write the single-device step, no shard_map, "
        "no collectives"
    )
    with answer_errors("your step, under jax.jit,"):
        got = np.asarray(stepped(w_placed, x_placed, y_placed))
    want = _pmap_result()
    assert got.shape == (16,), f"the new weight should have shape (16,); got {got.shape}"
    assert np.allclose(got, want, rtol=_rtol(), atol=_rtol() / 10), (
        f"the new weight differs from the pmap step's: first three {np.round(got[:3], 5)} instead of "
        f"{np.round(want[:3], 5)}; is the loss the mean over all 64 examples, with the same learning rate?"
    )
    block = x_placed.sharding.shard_shape(x.shape)
    assert block != x.shape, (
        "the numbers are right but every device holds, and computes, the whole batch: split the batch over "
        "'data' to make it data parallel"
    )
    assert block == (8, 16), (
        f"batch_spec gives each device a block {block} of x (64, 16): data parallelism gives each device "
        "8 whole examples, so split dimension 0 (the examples) over 'data', not the features"
    )
    with answer_errors("compiling your step"):
        compiled = stepped.lower(w_placed, x_placed, y_placed).compile()
    comm = collectives(compiled)
    assert comm.kinds == {"all-reduce"}, (
        f"the compiled step has {sorted(comm.kinds) or 'no collectives'}, where data parallelism has only the "
        "all-reduce of the gradient: keep the weight whole on every device (replicated), and let each device "
        "keep its own block of the batch (nothing gathered)"
    )


def _migrate_solution_step(w, x, y):
    g = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - 0.1 * g


def _summed_loss_step(w, x, y):  # mistook pmean for "sum the loss"
    g = jax.grad(lambda w: jnp.sum((x @ w - y) ** 2))(w)
    return w - 0.1 * g


def _lr_times_8_step(w, x, y):  # the learning rate scaled by the device count, as for a summed gradient
    g = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - 0.8 * g


def _local_mean_step(w, x, y):  # the mean over one device's 8 examples, as the pmap body saw them
    g = jax.grad(lambda w: jnp.mean((x[:8] @ w - y[:8]) ** 2))(w)
    return w - 0.1 * g


def _replicating_step(w, x, y):  # a constraint that gathers the whole batch onto every device
    x = jax.lax.with_sharding_constraint(x, NamedSharding(_mesh_8(), P()))
    return _migrate_solution_step(w, x, y)


class _StepAndSpecs(tuple):
    """The answer triple, shown by ``reveal()`` as the code to type rather than as a function object."""

    def __repr__(self) -> str:
        step, w_spec, batch_spec = self
        source = textwrap.dedent(inspect.getsource(step)).replace(step.__name__, "new_step")
        return f"{source}\nanswer_1 = (new_step, {w_spec}, {batch_spec})"


migrate_to_jit = Exercise(
    title="Exercise 1: migrate a pmap step to jax.jit",
    checker=_check_migrate,
    solution=_StepAndSpecs((_migrate_solution_step, P(), P("data"))),
    wrong=(
        (_old_step, P(), P("data")),
        (_migrate_solution_step, P(), P()),
        (_migrate_solution_step, P("data"), P("data")),
        (_summed_loss_step, P(), P("data")),
        (_migrate_solution_step, P(), P(None, "data")),  # splits the features, not the examples
        (_lr_times_8_step, P(), P("data")),
        (_local_mean_step, P(), P("data")),
        (_replicating_step, P(), P("data")),
    ),
    hint="delete the pmean and write the step as for one device; replicate the weight, split the batch",
    explanation=(
        "The single-device step, with w placed by P() and the batch by P('data'): jax.jit sees a mean over "
        "a batch split 8 ways and inserts the all-reduce that pmean used to do."
    ),
)


# Exercise 2: the factor of pmean kept inside shard_map, on a 2-D mesh ------------------------------


def _measured_factor() -> float:
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
    _, x, y = _regression_data()
    w = np.linspace(-1, 1, 16, dtype=np.float32)

    def loss(w, x, y):
        return jnp.mean((x @ w - y) ** 2)

    def body(w, x, y):
        return jax.lax.pmean(jax.grad(loss)(w, x, y), "data")

    ported = jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P())
    g = np.asarray(jax.jit(ported)(w, x, y))
    g_true = np.asarray(jax.grad(loss)(w, x, y))
    return float(np.median(g / g_true))


def _check_factor(answer: Any) -> None:
    answer = plain(answer)  # a factor measured with numpy, np.float32(2.0), is the number 2
    assert isinstance(answer, int | float) and not isinstance(answer, bool), f"give a number; got {answer!r}"
    measured = _measured_factor()
    assert abs(answer - measured) < 0.05 * measured, (  # the wrong factors are far apart: 8, 4, 1
        f"{answer} is not what the ported step gives. The implicit sum comes from the transpose of the cast "
        "to 'varying': over which mesh axes does the loss vary? Not over all 8 devices"
    )


pmean_factor = Exercise(
    title="Exercise 2: how wrong is pmean inside shard_map?",
    checker=_check_factor,
    solution=2,
    wrong=(8, 4, 1, 0.5),
    hint="the batch varies over 'data' only; the 4 devices along 'model' hold the same examples",
    explanation=(
        "The loss varies over 'data' (2 devices) only, so the gradient of the replicated weight is "
        "summed over 'data': 2 per-device means, twice the mean. pmean of that sum changes nothing."
    ),
)
