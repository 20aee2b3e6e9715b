"""The pipeline notebook's claims that it leaves to the tests: its pipeline without the cast of the parameters
to varying over `data` sums their gradients inside the backward loop (the notebook's box in §5), and its
pipeline gives the reference's gradients for other shapes than the notebook's."""

from __future__ import annotations

import ast
from functools import partial

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from course_support import REPO, from_notebook
from spmd_course.utils import collectives

CAST = 'params = jax.lax.pcast(params, batch_axes, to="varying")'


@pytest.fixture(scope="module")
def nb():
    return from_notebook("18", "layer", "stack", "loss_fn", "to_stages", "from_stages", "pipeline_loss",
                         "pipelined")


def _without_the_cast(nb):
    """The notebook's pipeline_loss with its cast of the parameters removed, compiled from its own source."""
    source = (REPO / "notebooks" / "18_pipeline.py").read_text()
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "pipeline_loss"]
    text = ast.get_source_segment(source, node)
    assert text.count(CAST) == 1, "the notebook's pipeline_loss no longer casts its parameters as this test expects"
    namespace = dict(vars(nb))
    exec(text.replace(CAST, "pass"), namespace)
    return namespace["pipeline_loss"]


def _data(layers, micro, rows, width=16, hidden=32):
    rng = np.random.default_rng(3)
    params = {"up": rng.standard_normal((layers, width, hidden), np.float32) / np.sqrt(width),
              "down": rng.standard_normal((layers, hidden, width), np.float32) / (4 * np.sqrt(hidden))}
    x, y = (rng.standard_normal((micro, rows, width), np.float32) for _ in range(2))
    return params, x, y


def test_without_the_cast_the_gradients_are_summed_inside_the_loop_once_per_iteration_and_layer(nb):
    mesh = jax.make_mesh((4, 2), ("stage", "data"), axis_types=(AxisType.Auto,) * 2)
    params, x, y = _data(layers=32, micro=8, rows=4)
    placed = jax.device_put(nb.to_stages(params, 4), NamedSharding(mesh, P("stage")))
    naive = jax.jit(jax.value_and_grad(jax.shard_map(
        partial(_without_the_cast(nb), batch_axes=("data",)), mesh=mesh,
        in_specs=(P("stage"), P(None, "data"), P(None, "data")), out_specs=(P(), P("stage"))), has_aux=True))
    program = naive.lower(placed, x, y).compile()
    sums = [op for op in collectives(program).ops if op.kind == "all-reduce" and op.group_size == 2]
    assert sums and all(op.in_loop for op in sums)
    assert {op.trips for op in sums} == {(8 + 4 - 1) * 8}  # 11 iterations x 8 layers per stage: 88, as the box says
    (loss, _), grads = program(placed, x, y)  # the same numbers all the same
    ref_loss, ref_grads = jax.jit(jax.value_and_grad(nb.loss_fn))(params, x.reshape(-1, 16), y.reshape(-1, 16))
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), nb.from_stages(grads),
                 ref_grads)
    fixed = nb.pipelined(mesh, batch_axes=("data",)).lower(placed, x, y).compile()
    assert not [op for op in collectives(fixed).ops if op.kind == "all-reduce" and op.in_loop]


@pytest.mark.parametrize("stages,repeats,micro", [(2, 1, 3), (4, 2, 4), (2, 3, 5)])
def test_the_pipeline_equals_the_reference_for_other_shapes(nb, stages, repeats, micro):
    mesh = jax.make_mesh((stages,), ("stage",), axis_types=(AxisType.Auto,), devices=jax.devices()[:stages])
    params, x, y = _data(layers=stages * repeats * 2, micro=micro, rows=2)
    placed = jax.device_put(nb.to_stages(params, stages, repeats), NamedSharding(mesh, P("stage")))
    (loss, log), grads = nb.pipelined(mesh, repeats)(placed, x, y)
    ref_loss, ref_grads = jax.jit(jax.value_and_grad(nb.loss_fn))(params, x.reshape(-1, 16), y.reshape(-1, 16))
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), nb.from_stages(grads),
                 ref_grads)
    log = np.asarray(log)
    assert log.shape == (stages, repeats * micro + stages - 1)
    assert all(sorted(log[s][log[s] >= 0]) == list(range(repeats * micro)) for s in range(stages))


def test_to_stages_and_from_stages_are_inverse(nb):
    params, _, _ = _data(layers=24, micro=1, rows=1)
    staged = nb.to_stages(params, 4, 3)
    assert staged["up"].shape == (4, 3, 2, 16, 32)
    np.testing.assert_array_equal(staged["up"][1, 2, 0], params["up"][(2 * 4 + 1) * 2])  # chunk 9, its first layer
    jax.tree.map(np.testing.assert_array_equal, nb.from_stages(staged), params)
