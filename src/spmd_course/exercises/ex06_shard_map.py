"""Exercises of notebook 06: per-device programs with jax.shard_map."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spmd_course.utils.exercises import Exercise, answer_errors, plain
from spmd_course.utils.inspecting import collectives

P = PartitionSpec


def _auto_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


# Exercise 1: column sums with shard_map --------------------------------------------------------


def _column_input() -> jax.Array:
    values = np.random.default_rng(5).normal(size=(32, 8)).astype(np.float32)
    return jax.device_put(values, NamedSharding(_auto_mesh(), P("data", None)))


def _producer(jaxpr: Any, var: Any) -> Any:
    """The equation whose output ``var`` is, looking inside jit; None for an input or a constant."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # a ClosedJaxpr on jax 0.10, a Jaxpr on 0.12
    for eqn in jaxpr.eqns:
        if any(out is var for out in eqn.outvars):
            if eqn.primitive.name in ("jit", "pjit"):
                inner = eqn.params["jaxpr"]
                return _producer(inner, getattr(inner, "jaxpr", inner).outvars[eqn.outvars.index(var)])
            return eqn
    return None


def _check_column_sums(f: Any) -> None:
    assert callable(f), f"give a function column_sums(x); got {type(f).__name__}"
    x = _column_input()
    with answer_errors("your function, traced on a (32, 8) array split by P('data', None),"):
        closed = jax.make_jaxpr(f)(x)
    assert "shard_map" in str(closed), (
        "the function must call jax.shard_map (this exercise is about writing the per-device program); "
        "jnp.sum alone lets the compiler do it"
    )
    outvars = closed.jaxpr.outvars
    last = _producer(closed, outvars[0]) if len(outvars) == 1 else None
    assert last is not None and last.primitive.name == "shard_map", (
        "the result must come straight out of jax.shard_map: here "
        + (f"{last.primitive.name} runs after it, so the compiler, not your per-device program, finishes the "
           "sum" if last is not None else "it does not")
        + ". Sum inside the body and add the partial sums with jax.lax.psum"
    )
    assert "psum" in str(last.params["jaxpr"]), (
        "the per-device program never adds up the blocks' partial sums: without a jax.lax.psum over the "
        "devices that hold different rows, each device has only its own rows' sums"
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
    ops = collectives(compiled)
    assert "all-gather" not in ops.kinds, (
        "the answer is right but gathers the whole array first: sum each block, then add the (8,) partial sums"
    )
    least = collectives(jax.jit(_column_sums_solution).lower(x).compile()).result_bytes
    assert ops.result_bytes <= least, (
        f"the answer is right but its collectives return {ops.result_bytes} bytes per device, where "
        f"{least} bytes (the 8 column sums) are enough: sum each block over its rows first, then psum the "
        "(8,) partial sums, not the whole blocks"
    )
    manual = last.params.get("newly_manual_axes", last.params.get("axis_names", frozenset()))
    assert "data" in set(manual), (
        "the rows are split over 'data', so the per-device program must see 'data' (leave axis_names at its "
        "default, or include 'data'): here only " + ", ".join(sorted(map(str, manual))) + " is manual, so the "
        "compiler, not your program, adds up the row blocks"
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


def _column_sums_whole_input(x):  # in_specs=P(): every device gets all rows, and the psum counts them 4 times
    return jax.shard_map(lambda b: jax.lax.psum(b.sum(axis=0), "data"), mesh=_auto_mesh(),
                         in_specs=P(), out_specs=P())(x)


def _column_sums_identity(x):  # a shard_map that does nothing: jnp.sum after it is the compiler's all-reduce
    return jax.shard_map(lambda b: b, mesh=_auto_mesh(), in_specs=P("data", None), out_specs=P("data", None))(x).sum(0)


def _column_sums_outside(x):  # partial sums per device, added up outside the shard_map by the compiler
    return jax.shard_map(lambda b: b.sum(axis=0, keepdims=True), mesh=_auto_mesh(), in_specs=P("data", None),
                         out_specs=P("data", None))(x).sum(0)


def _column_sums_psum_then_sum(x):  # a psum of whole blocks, then the column sum outside: 8x the bytes
    return jax.shard_map(lambda b: jax.lax.psum(b, "data"), mesh=_auto_mesh(), in_specs=P("data", None),
                         out_specs=P())(x).sum(0)


def _column_sums_psum_whole_blocks(x):  # the sum over rows after the psum: each device sends its (8, 8) block
    return jax.shard_map(lambda b: jax.lax.psum(b, "data").sum(axis=0), mesh=_auto_mesh(),
                         in_specs=P("data", None), out_specs=P())(x)


def _column_sums_model_only(x):  # only 'model' is manual: the compiler, not the body, adds up the row blocks
    return jax.shard_map(lambda b: jax.lax.psum(b.sum(axis=0), "model") / 2, mesh=_auto_mesh(),
                         in_specs=P(None, None), out_specs=P(), axis_names={"model"})(x)


def _column_sums_pmean(x):  # a right answer written another way: the mean of the 4 partial sums, times 4
    return jax.shard_map(lambda b: 4 * jax.lax.pmean(b.sum(axis=0), "data"), mesh=_auto_mesh(),
                         in_specs=P("data", None), out_specs=P())(x)


def _column_sums_both_axes(x):  # also right: split the columns over 'model' too, and psum over 'data' only
    return jax.shard_map(lambda b: jax.lax.psum(b.sum(axis=0), "data"), mesh=_auto_mesh(),
                         in_specs=P("data", "model"), out_specs=P("model"))(x)


column_sums = Exercise(
    title="Exercise 1: column sums by hand",
    checker=_check_column_sums,
    solution=_column_sums_solution,
    wrong=(
        lambda x: jnp.sum(x, axis=0),
        _column_sums_no_psum,
        _column_sums_gather_first,
        _column_sums_wrong_axis,
        _column_sums_whole_input,
        _column_sums_identity,
        _column_sums_outside,
        _column_sums_psum_then_sum,
        jax.jit(_column_sums_identity),
        _column_sums_psum_whole_blocks,
        _column_sums_model_only,
    ),
    hint="inside jax.shard_map each device sees an (8, 8) block; sum it over axis 0, then jax.lax.psum over 'data'",
    explanation=(
        "Each device sums its 8 rows, and one psum over 'data' (an all-reduce of 8 floats) adds the four "
        "partial sums; the result is the same on every device, so out_specs=P() is true."
    ),
)


# Exercise 2: where a ring shift comes from -------------------------------------------------------


def _ring_source(device_id: int) -> int:
    mesh = _auto_mesh()
    ids = mesh.device_ids.astype(np.float32)  # (4, 2): each device's own id
    x = jax.device_put(ids, NamedSharding(mesh, P("data", "model")))
    reverse_ring = [(i, (i - 1) % 4) for i in range(4)]
    y = jax.shard_map(lambda b: jax.lax.ppermute(b, "data", reverse_ring), mesh=mesh,
                      in_specs=P("data", "model"), out_specs=P("data", "model"))(x)
    shard = next(s for s in y.addressable_shards if s.device.id == device_id)
    return int(np.asarray(shard.data).item())


def _check_ring_source(answer: Any) -> None:
    answer = plain(answer)  # a Device becomes its id
    assert isinstance(answer, int) and not isinstance(answer, bool), f"give a device id (0 to 7); got {answer!r}"
    source = _ring_source(6)
    (row,), (col,) = np.nonzero(_auto_mesh().device_ids == 6)  # where device 6 sits on this mesh
    assert answer == source, (
        f"device {answer} is not it: device 6 sits at data index {row}, model index {col}; the pair (i, i - 1) "
        "sends from data index i to i - 1 along the same model column, and index 0 sends to index 3"
    )


ring_source = Exercise(
    title="Exercise 2: where does the shifted block come from?",
    checker=_check_ring_source,
    solution=0,
    wrong=(4, 1, 7, 6),
    hint=("find device 6 on the mesh picture (row = data index, column = model index); the pair (i, i - 1) sends "
          "from data index i to i - 1 in the same column: which index sends to device 6's?"),
    explanation=(
        "The pair (i, (i - 1) % 4) sends from data index i to index i - 1 in the same model column, so each "
        "device receives the block of the device one data index below it, and the device at data index 3 "
        "receives from index 0 (the wrap-around). Device 6's position on the mesh picture, not its id, gives "
        "the answer: the ids sit elsewhere where the mesh orders devices otherwise (a TPU host's follows the "
        "chips' wiring)."
    ),
)


# Exercise 3: the out_specs of an all_to_all -------------------------------------------------------


def _check_all_to_all_out_specs(spec: Any) -> None:
    assert isinstance(spec, PartitionSpec), f"give a PartitionSpec such as P('data', None); got {spec!r}"
    mesh = _auto_mesh()
    values = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
    x = jax.device_put(values, NamedSharding(mesh, P(None, "data")))
    with answer_errors(f"jax.shard_map(..., in_specs=P(None, 'data'), out_specs={spec})"):
        y = jax.shard_map(lambda b: jax.lax.all_to_all(b, "data", split_axis=0, concat_axis=1, tiled=True),
                          mesh=mesh, in_specs=P(None, "data"), out_specs=spec)(x)
    assert y.shape == values.shape, (
        f"with out_specs={spec} the blocks assemble into shape {y.shape}, not (16, 8): each device now holds "
        "a (4, 8) block (whole columns, a quarter of the rows); which dimension is split, and over which axis?"
    )
    assert np.array_equal(np.asarray(y), values), (
        f"the shape is right but the blocks land in the wrong places with out_specs={spec}"
    )


all_to_all_out_specs = Exercise(
    title="Exercise 3: put the blocks back together",
    checker=_check_all_to_all_out_specs,
    solution=P("data", None),
    wrong=(P(None, "data"), P(), P("model", None), P(None, None)),
    hint="each device starts with a (16, 2) block; after the all_to_all it holds a (4, 8) block",
    explanation=(
        "all_to_all splits each (16, 2) block into 4 row pieces, sends piece j to device j of 'data', and "
        "concatenates what arrives along the columns: each device ends with its quarter of the rows, whole, "
        "which is P('data', None)."
    ),
)
