"""Exercises of notebook 05: constraints inside jit, and shard_map by hand."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from utils.exercises import Exercise, answer_errors
from utils.inspecting import collectives

P = PartitionSpec


def _auto_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


# Exercise 1: column sums with shard_map --------------------------------------------------------


def _column_input() -> jax.Array:
    values = np.random.default_rng(5).normal(size=(32, 8)).astype(np.float32)
    return jax.device_put(values, NamedSharding(_auto_mesh(), P("data", None)))


def _check_column_sums(f: Any) -> None:
    assert callable(f), f"give a function column_sums(x); got {type(f).__name__}"
    x = _column_input()
    with answer_errors("your function, traced on a (32, 8) array split by P('data', None),"):
        jaxpr = str(jax.make_jaxpr(f)(x))
    assert "shard_map" in jaxpr, (
        "the function must call jax.shard_map (this exercise is about writing the per-device program); "
        "jnp.sum alone lets the compiler do it"
    )
    with answer_errors("your function"):
        y = f(x)
    assert isinstance(y, jax.Array), f"column_sums(x) should return a JAX array; got {type(y).__name__}"
    assert y.shape == (8,), f"the column sums of a (32, 8) array have shape (8,); got {y.shape}"
    got, want = np.asarray(y), np.asarray(x).sum(axis=0)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-4), (
        f"the numbers differ from jnp.sum(x, axis=0): first three {', '.join(f'{v:.3f}' for v in got[:3])} "
        f"instead of {', '.join(f'{v:.3f}' for v in want[:3])}; is every block's partial sum added up, "
        "over the right mesh axis?"
    )
    with answer_errors("compiling your function with jax.jit"):
        compiled = jax.jit(f).lower(x).compile()
    kinds = collectives(compiled).kinds
    assert "all-gather" not in kinds, (
        "the answer is right but gathers the whole array first: sum each block, then add the (8,) partial sums"
    )


def _column_sums_solution(x):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))  # the notebook's

    def per_device(block):  # block: (8, 8), the rows this device holds
        return jax.lax.psum(block.sum(axis=0), "data")

    return jax.shard_map(per_device, mesh=mesh, in_specs=P("data", None), out_specs=P())(x)


def _column_sums_no_psum(x):
    return jax.shard_map(lambda b: b.sum(axis=0), mesh=_auto_mesh(), in_specs=P("data", None),
                         out_specs=P(), check_vma=False)(x)


def _column_sums_gather_first(x):
    return jax.shard_map(lambda b: jax.lax.all_gather(b, "data", tiled=True, to="invarying").sum(axis=0),
                         mesh=_auto_mesh(), in_specs=P("data", None), out_specs=P())(x)


def _column_sums_wrong_axis(x):
    return jax.shard_map(lambda b: jax.lax.psum(b.sum(axis=0), "model"), mesh=_auto_mesh(),
                         in_specs=P("data", None), out_specs=P(), check_vma=False)(x)


column_sums = Exercise(
    title="Exercise 1: column sums by hand",
    checker=_check_column_sums,
    solution=_column_sums_solution,
    wrong=(
        lambda x: jnp.sum(x, axis=0),
        _column_sums_no_psum,
        _column_sums_gather_first,
        _column_sums_wrong_axis,
    ),
    hint="inside jax.shard_map each device sees an (8, 8) block; sum it over axis 0, then jax.lax.psum over 'data'",
    explanation=(
        "Each device sums its 8 rows, and one psum over 'data' (an all-reduce of 8 floats) adds the four "
        "partial sums; the result is the same on every device, so out_specs=P() is true."
    ),
)


# Exercise 2: the per-leaf constraint of a batch --------------------------------------------------

_BATCH_SHAPES = {"x": (128, 64), "label": (128,), "mask_tb": (16, 128)}
_BATCH_WANT = {"x": P("data", None), "label": P("data"), "mask_tb": P(None, "data")}


def _check_batch_constraint(spec: Any) -> None:
    mesh = _auto_mesh()
    batch = {k: jnp.zeros(s, jnp.int32 if k == "label" else jnp.float32) for k, s in _BATCH_SHAPES.items()}
    with jax.set_mesh(mesh), answer_errors("jax.lax.with_sharding_constraint(batch, your answer)"):
        out = jax.jit(lambda b: jax.lax.with_sharding_constraint(b, spec))(batch)
    for name, want in _BATCH_WANT.items():
        got = out[name].sharding
        ok = got.is_equivalent_to(NamedSharding(mesh, want), out[name].ndim)
        got_spec = getattr(got, "spec", got)
        assert ok, (
            f"batch[{name!r}] (shape {_BATCH_SHAPES[name]}) came out as {got_spec}; its batch dimension "
            f"(the one of size 128) should be split over 'data' and nothing else"
        )


batch_constraint = Exercise(
    title="Exercise 2: constrain a batch leaf by leaf",
    checker=_check_batch_constraint,
    solution={"x": P("data", None), "label": P("data"), "mask_tb": P(None, "data")},
    wrong=(
        P("data"),
        {"x": P("data", None), "label": P("data"), "mask_tb": P("data", None)},
        {"x": P("data", "model"), "label": P("data"), "mask_tb": P(None, "data")},
        P(),
    ),
    hint="give a dict with the batch's keys; for each leaf, put 'data' at the position of its size-128 dimension",
    explanation=(
        "A single spec is applied to every leaf's first dimensions, which is wrong for the time-major mask; "
        "a dict of specs (a pytree matching the batch) says where the batch dimension is in each leaf."
    ),
)


# Exercise 3: what psum_scatter compiles to -------------------------------------------------------


def _psum_scatter_kinds() -> set[str]:
    mesh = _auto_mesh()
    x = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("data", "model")))
    f = jax.shard_map(lambda b: jax.lax.psum_scatter(b, "data", scatter_dimension=0, tiled=True),
                      mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"))
    return collectives(jax.jit(f).lower(x).compile()).kinds


def _check_psum_scatter(answer: Any) -> None:
    assert isinstance(answer, str), f"give the collective's HLO name as a string, e.g. 'all-gather'; got {answer!r}"
    name = answer.strip().lower().replace("_", "-")
    actual = _psum_scatter_kinds()
    assert actual == {name}, (
        f"{answer!r} is not what the compiled program contains; it is one op that sums across the devices "
        "and leaves each device only its own slice of the sum"
    )


psum_scatter_collective = Exercise(
    title="Exercise 3: what does psum_scatter lower to?",
    checker=_check_psum_scatter,
    solution="reduce-scatter",
    wrong=("all-reduce", "all-gather", "psum_scatter", "all-to-all"),
    hint="the names are the ones utils.collectives prints: all-reduce, all-gather, reduce-scatter, ...",
    explanation=(
        "psum_scatter is a reduce-scatter: the sum of an all-reduce, but each device keeps 1/N of it, "
        "so it moves half the bytes of the all-reduce."
    ),
)


# Exercise 4: where a ring shift comes from -------------------------------------------------------


def _ring_source(device_id: int) -> int:
    mesh = _auto_mesh()
    ids = np.vectorize(lambda d: d.id)(mesh.devices).astype(np.float32)  # (4, 2): each device's own id
    x = jax.device_put(ids, NamedSharding(mesh, P("data", "model")))
    ring = [(i, (i + 1) % 4) for i in range(4)]
    y = jax.shard_map(lambda b: jax.lax.ppermute(b, "data", ring), mesh=mesh,
                      in_specs=P("data", "model"), out_specs=P("data", "model"))(x)
    shard = next(s for s in y.addressable_shards if s.device.id == device_id)
    return int(np.asarray(shard.data).item())


def _check_ring_source(answer: Any) -> None:
    assert isinstance(answer, int) and not isinstance(answer, bool), f"give a device id (0 to 7); got {answer!r}"
    source = _ring_source(6)
    assert answer == source, (
        f"device {answer} is not it: device 6 sits at data index 3, model index 0; the pair (i, i+1) sends "
        "from data index i to i+1 along the same model column"
    )


ring_source = Exercise(
    title="Exercise 4: where does the shifted block come from?",
    checker=_check_ring_source,
    solution=4,
    wrong=(5, 0, 7, 2),
    hint="find device 6 on the mesh picture (row = data index, column = model index), then step one row back",
    explanation=(
        "Device 6 is at (data=3, model=0). The pair (2, 3) sends data index 2's block to data index 3 in the "
        "same model column: device 4."
    ),
)
