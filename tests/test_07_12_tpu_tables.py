"""Notebooks 07 and 12 on a TPU v5e-8 at the compiler's default effort.

Both notebooks print their memory tables from the CPU compiler, which runs them. What a learner on a TPU v5e-8
sees instead is a program compiled at the default effort (the one ``jax.jit`` uses): each notebook states that
in a hidden cell's table (07 §4 ``TPU_DONATION``, 12 §6 ``TPU_STRATEGIES``). This file compiles the notebooks'
own programs for ``v5e:2x4`` ahead of time and checks every figure of both tables and the lessons the notebooks
draw from them. About 15 s of CPU for 07's two compiles and 11's four: marked slow (``make test-slow``).

Run as a script (``python tests/test_07_12_tpu_tables.py``) it prints the figures for the tables."""

from __future__ import annotations

import functools

import pytest

from spmd_course.utils.tpu import tpu_compiler_available

TPU_OK, TPU_WHY = tpu_compiler_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not TPU_OK, reason=TPU_WHY)]

KiB = 1024


@functools.cache
def chips():
    from jax.experimental import topologies

    from spmd_course.utils import quiet

    with quiet():
        return list(topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices)


@functools.cache
def donation_on_tpu():
    """07 §4's step (the notebook's MLP, loss and Adam), its batch split over 8 chips, without and with donation:
    {"no donation" | "donate_argnums": Memory}."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from course_support import from_notebook
    from spmd_course.utils import memory_per_device, quiet

    nb = from_notebook("07", "MLP", "step")
    mesh = Mesh(np.array(chips()), ("data",))
    graphdef, state = nnx.split(nnx.eval_shape(lambda: (model := nb.MLP(nnx.Rngs(0)), nnx.Optimizer(
        model, optax.adam(1e-2), wrt=nnx.Param))))
    replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    state = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated), state)
    x = jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=rows)
    y = jax.ShapeDtypeStruct((64,), jnp.int32, sharding=rows)

    def train(state, x, y):  # nnx.jit's step as a function of the state: the notebook's train_step
        model, optimizer = nnx.merge(graphdef, state)
        loss = nb.step(model, optimizer, x, y)
        return loss, nnx.state((model, optimizer))

    with quiet():
        return {label: memory_per_device(jax.jit(train, donate_argnums=donate).lower(state, x, y).compile())
                for label, donate in (("no donation", ()), ("donate_argnums", (0,)))}


@functools.cache
def strategies_on_tpu():
    """12 §6's four train steps (the notebook's model, rule tables and step) on 8 chips, donated, at the default
    effort: {strategy: (Memory, Collectives)}."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from flax.linen import logical_to_mesh_axes
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from course_support import notebook_11
    from spmd_course.utils import collectives, memory_per_device, quiet

    nb = notebook_11()
    figures = {}
    for name, (cpu_mesh, rules) in nb.STRATEGIES.items():
        mesh = Mesh(np.array(chips()).reshape(cpu_mesh.devices.shape), cpu_mesh.axis_names,
                    axis_types=cpu_mesh.axis_types)
        with nnx.logical_axis_rules(rules):
            shardings = nnx.get_named_sharding(nb.abstract, mesh)
            batch = logical_to_mesh_axes(("batch", None))
        state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nb.abstract, shardings)
        tokens = jax.ShapeDtypeStruct((nb.BATCH, nb.SEQ + 1), jnp.int32, sharding=NamedSharding(mesh, batch))
        replicated = NamedSharding(mesh, P())
        with quiet(), jax.set_mesh(mesh):
            compiled = jax.jit(nb.with_rules(rules, nb.train_step), donate_argnums=0,
                               out_shardings=(shardings, replicated, replicated)).lower(state, tokens).compile()
        figures[name] = (memory_per_device(compiled), collectives(compiled))
    return figures


def _kib(n):
    return round(n / KiB, 1)


def _exact_or_skip(memories):
    if any(m.allocated is None for m in memories):  # jax 0.10.2: footprint is the estimated sum, not HBM
        pytest.skip("the tables hold jax 0.12's figures (libtpu 0.0.50.1), which report the HBM allocated")


def test_07_donation_table_on_tpu():
    from course_support import from_notebook

    table = from_notebook("07", "TPU_DONATION").TPU_DONATION
    memory = donation_on_tpu()
    _exact_or_skip(memory.values())
    for label, m in memory.items():
        assert table[label] == (_kib(m.argument), _kib(m.output), _kib(m.temp), _kib(m.alias), _kib(m.footprint))


def test_07_donation_saves_hbm_on_tpu_too():
    memory = donation_on_tpu()
    plain, donated = memory["no donation"], memory["donate_argnums"]
    assert plain.alias == 0 and donated.alias > 0
    assert donated.footprint < plain.footprint  # on every line: HBM on jax 0.12, the estimate on 0.10


def test_12_strategy_table_on_tpu():
    from course_support import from_notebook

    table = from_notebook("12", "TPU_STRATEGIES").TPU_STRATEGIES
    figures = strategies_on_tpu()
    _exact_or_skip(m for m, _ in figures.values())
    assert set(table) == set(figures)
    for name, (m, comm) in figures.items():
        counts = {kind: n for kind, n in comm.counts.items() if n}
        assert table[name] == (_kib(m.footprint), _kib(m.alias), counts, _kib(comm.estimated_bytes)), name


def test_12_lessons_hold_on_tpu():
    figures = strategies_on_tpu()
    sent = {name: comm.estimated_bytes for name, (_, comm) in figures.items()}
    state = {name: m.alias for name, (m, _) in figures.items()}
    assert state["data"] > state["2-D"] > state["tensor"] > state["FSDP"]  # the state each chip keeps
    assert sent["tensor"] > 3 * sent["data"]  # activations cost more than gradients, at this size
    assert "all-gather" in figures["FSDP"][1].kinds  # FSDP gathers its weights


if __name__ == "__main__":
    for label, m in donation_on_tpu().items():
        print("07", label, (_kib(m.argument), _kib(m.output), _kib(m.temp), _kib(m.alias), _kib(m.footprint)))
    for name, (m, comm) in strategies_on_tpu().items():
        print("11", name, (_kib(m.footprint), _kib(m.alias), {k: n for k, n in comm.counts.items() if n},
                           _kib(comm.estimated_bytes)))
