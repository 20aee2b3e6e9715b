"""The TPU side of the notebooks' compiler facts.

A notebook asserts a compiler fact either for every backend (no guard) or for the CPU backend only
(``if CPU:``). The unguarded ones must also hold where the course runs on 8 real TPUs. This file compiles
programs ahead of time for a TPU v5e-8 (``v5e:2x4``) or, for notebook 17, a ``v5e:8x8`` slice (no TPU
needed) and checks those facts on the TPU program; where a notebook asserts a fact on the CPU only because
the TPU program differs, the test asserts the TPU's form. What it checks, and where each program comes from:

- 02, 05 and 06: the notebooks' own programs (a constraint inside ``jit``, ``score``, ``chain``,
  ``reshard_via``, a ``shard_map`` body), imported from ``src/spmd_course/models.py`` (cells tagged ``save``);
  08: its modules, layouts and ``block_grads``, read from its source by ``from_notebook``;
- 01, 05, 06 and 09's one-operator programs (a matmul, a sum, one collective): written here at the
  notebook's shapes and layouts, because the operator is the program (naming it would add nothing);
- 07, 08, 09, 14: the train steps of the notebooks' MLPs; the model classes and layouts are the notebook's
  own, read from its source by ``from_notebook`` (which follows 08's and 09's import of notebook 07's MLP
  from ``src/spmd_course/models.py``), the step is ``abstract_train_step`` below; 14's feed-forward block is the
  notebook's too (its wide gradient-accumulation steps, whose HBM the notebook reads stored, are compiled in
  ``tests/test_14_sequence_batch.py``);
- 12: the four strategies' train steps, the rules-while-tracing gotcha and the init program, all the
  notebook's code (its model from ``src/spmd_course/models.py``, the rest read from its source);
- 13: none here; its wide TPU programs, whose figures the notebook reads stored, are compiled with the
  notebook's own code in ``tests/test_13_training_memory.py`` (with the checks that were here);
- 17: the notebook's ``compile_for`` and layouts, for ``v5e:8x8``: three at a real width (the five at its own
  size, and the stored programs it reads, are compiled in ``tests/test_17_mesh_shape.py``).

libtpu is loaded by the ``chips``/``tpu_pod`` fixtures, when a test first needs it, not at collection.
The largest compiles (over a minute each on 2 cores) are marked ``slow`` (``make test-slow``): they run on
both lines in CI, since each line has its own libtpu. Not checked here: 00, 03, 04, 10, 11, 15, 16 and 21 to 24.
Notebooks 04, 10, 11, 15 and 21 to 23 compile their TPU programs themselves and assert on them (so do 13 and 14
for some of theirs; 13, 14, 16 and 17 read some stored, each checked by its own test file); 24 is PyTorch/XLA.
Skipped, with the reason, where libtpu is not installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.linen import logical_to_mesh_axes
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from course_support import from_notebook, notebook_11
from spmd_course.utils import collectives, compile_effort, compile_with_log, memory_per_device, quiet

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def chips(tpu_devices):
    """The 8 chips of a TPU v5e-8, in the order the topology lists them (libtpu is loaded here, when a test first
    asks for them, not when pytest collects this file; skips with the reason where libtpu is missing)."""
    return list(tpu_devices)


def tpu_mesh(chips, shape, names, order=None, axis_type=None):
    devices = np.array([chips[i] for i in (order or range(len(chips)))]).reshape(shape)
    return Mesh(devices, names, axis_types=(axis_type or AxisType.Auto,) * len(names))


def struct(shape, mesh, spec, dtype=None):
    """An input of the given shape and layout that exists only as a type (nothing is allocated)."""
    return jax.ShapeDtypeStruct(shape, dtype or jnp.float32, sharding=NamedSharding(mesh, spec))


def compile_tpu(f, *args, **jit_kwargs):
    with quiet():  # libtpu's start-up lines
        return jax.jit(f, **jit_kwargs).lower(*args).compile()


def summary(compiled):
    return [(op.kind, op.shapes, op.group_size) for op in collectives(compiled).ops]


def typed(compiled):
    """(kind, per-device type, group size) of each collective."""
    return [(op.kind, op.result_type, op.group_size) for op in collectives(compiled).ops]


def equivalent(sharding, mesh, spec, ndim=2):
    return sharding.is_equivalent_to(NamedSharding(mesh, spec), ndim)


# --- the notebooks' own code, read from their sources by course_support.from_notebook -----------------------

N_PARAMS = 64 * 256 + 256 + 256 * 10 + 10


def path_name(path):
    return "/".join(str(k.key) for k in path if hasattr(k, "key"))


def integer_labels_loss(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def abstract_module(mesh, make, layout):
    """(graphdef, state) of what ``make()`` builds (a module, or a tuple of them), its state as types laid out on
    ``mesh`` as ``layout`` says (name -> spec, matched on the end of each leaf's name; ``P()`` for the rest):
    nothing is allocated."""
    graphdef, state = nnx.split(nnx.eval_shape(make))

    def spec_of(path):
        name = path_name(path)
        return next((spec for key, spec in layout.items() if name.endswith(key)), P())

    return graphdef, jax.tree_util.tree_map_with_path(lambda p, s: struct(s.shape, mesh, spec_of(p), s.dtype), state)


def compile_module(graphdef, state, *args, method=None, **jit_kwargs):
    """The program of ``method(module, *args)`` (default: calling the module), for the module ``graphdef``
    and the abstract ``state`` rebuild."""
    return compile_tpu(lambda state, *a: (method or (lambda m, *b: m(*b)))(nnx.merge(graphdef, state), *a), state,
                       *args, **jit_kwargs)


def abstract_train_step(mesh, model_cls, layout, x_spec, y_spec, loss=integer_labels_loss):
    """The course's donated train step, compiled for ``mesh`` with each parameter (and its Adam moments) laid
    out as ``layout`` says (name -> spec; the step counters replicated); ``loss(model, x, y)``."""

    def create():
        model = model_cls(nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    graphdef, abstract = abstract_module(mesh, create, layout)

    def step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)

        loss_value, grads = nnx.value_and_grad(lambda model: loss(model, x, y))(model)
        optimizer.update(model, grads)
        return loss_value, nnx.state((model, optimizer))

    with jax.set_mesh(mesh):
        return compile_tpu(step, abstract, struct((64, 64), mesh, x_spec), struct((64,), mesh, y_spec, jnp.int32),
                           donate_argnums=0)


# --- 01 meshes --------------------------------------------------------------------------------------------


def test_01_ambiguous_matmul_is_one_all_reduce(chips):
    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    compiled = compile_tpu(lambda a, w: a @ w, struct((16, 8), mesh, P(None, "model")), struct((8, 4), mesh,
                                                                                               P("model", None)))
    assert [kind for kind, *_ in summary(compiled)] == ["all-reduce"]


def test_01_device_order_does_not_change_the_program(chips):
    order = [0, 1, 3, 2, 4, 5, 7, 6]  # any other order of the same chips
    programs = []
    for o in (None, order):
        mesh = tpu_mesh(chips, (8,), ("data",), o)
        programs.append(compile_tpu(lambda a: jnp.sum(a, axis=0), struct((128, 64), mesh, P("data", None))))
    assert summary(programs[0]) == [("all-reduce", ((64,),), 8)]
    assert programs[0].as_text() == programs[1].as_text()


# --- 02 partitionspec ------------------------------------------------------------------------------------


def test_02_sharded_creation_writes_one_block_per_chip(chips):
    mesh = tpu_mesh(chips, (4, 2), ("data", "model"), axis_type=AxisType.Explicit)
    with jax.set_mesh(mesh):
        split = compile_tpu(lambda: jnp.zeros((1024, 1024), out_sharding=P("data", "model")))
        whole = compile_tpu(lambda: jnp.zeros((1024, 1024)))
    assert memory_per_device(split).output == 1024 * 1024 * 4 // 8
    assert memory_per_device(whole).output == 1024 * 1024 * 4


def test_02_uneven_split_inside_jit_is_padded_and_summed_once(chips):
    from spmd_course.models import sum_of_cosines  # notebook 02's

    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    uneven = NamedSharding(mesh, P("data"))
    compiled = compile_tpu(partial(sum_of_cosines, layout=uneven), jax.ShapeDtypeStruct((10,), jnp.float32))
    hlo = compiled.as_text()
    assert "f32[12]" in hlo and "f32[3]" in hlo
    assert collectives(compiled).count("all-reduce") == 1


# --- 05 constraints, Auto and Explicit axes --------------------------------------------------------------


def test_05_device_put_inside_jit_is_ignored_and_a_constraint_is_not(chips):
    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    x = struct((128, 512), mesh, P("data", None))
    programs = []
    for tool in (jax.device_put, jax.lax.with_sharding_constraint):
        lowered = jax.jit(lambda v, tool=tool: tool(v, NamedSharding(mesh, P("model"))) * 2).lower(x)
        with quiet():
            programs.append((lowered.as_text(), lowered.compile()))
    (ignored_text, ignored), (pinned_text, pinned) = programs
    assert "sharding_constraint" not in ignored_text and collectives(ignored).count() == 0
    assert equivalent(ignored.output_shardings, mesh, P("data", None))  # still rows over data
    assert "sharding_constraint" in pinned_text and collectives(pinned).count() > 0
    assert equivalent(pinned.output_shardings, mesh, P("model", None))


def test_05_which_tool_reshards_on_which_axis_type(chips):
    tools = {AxisType.Auto: (jax.device_put, jax.lax.with_sharding_constraint),
             AxisType.Explicit: (jax.device_put, jax.reshard)}
    layouts = {}
    for axis_type, pair in tools.items():
        mesh = tpu_mesh(chips, (4, 2), ("data", "model"), axis_type=axis_type)
        with jax.set_mesh(mesh):
            for tool in pair:
                compiled = compile_tpu(lambda v, tool=tool: tool(v, P("model", None)),
                                       struct((128, 512), mesh, P("data", None)))
                layouts[axis_type, tool.__name__] = equivalent(compiled.output_shardings, mesh, P("model", None))
    assert layouts == {(AxisType.Auto, "device_put"): False, (AxisType.Auto, "with_sharding_constraint"): True,
                       (AxisType.Explicit, "device_put"): True, (AxisType.Explicit, "reshard"): True}


def test_05_a_constraint_splits_a_batch_that_arrives_unplaced(chips):
    from spmd_course.models import score  # notebook 05's

    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    w, batch = struct((256, 16), mesh, P()), jax.ShapeDtypeStruct((128, 256), jnp.float32)  # a NumPy batch
    rows = NamedSharding(mesh, P("data", None))
    plain, pinned = compile_tpu(score, w, batch), compile_tpu(partial(score, pin=rows), w, batch)
    assert plain.input_shardings[0][1].is_fully_replicated
    assert equivalent(pinned.input_shardings[0][1], mesh, P("data", None))
    assert "all-reduce" in collectives(pinned).kinds


def test_05_out_shardings_delivers_the_layout_asked_for(chips):
    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    x, w = struct((128, 512), mesh, P("data", None)), struct((512, 256), mesh, P(None, "model"))
    rows_whole = NamedSharding(mesh, P("data", None))
    free, asked = compile_tpu(jnp.matmul, x, w), compile_tpu(jnp.matmul, x, w, out_shardings=rows_whole)
    inside = compile_tpu(lambda a, b: jax.lax.with_sharding_constraint(a @ b, rows_whole), x, w)
    assert equivalent(free.output_shardings, mesh, P("data", "model")) and collectives(free).count() == 0
    assert equivalent(asked.output_shardings, mesh, P("data", None))
    assert equivalent(inside.output_shardings, mesh, P("data", None))


def test_05_pinning_the_hidden_activation_moves_activations_not_a_weight(chips):
    from spmd_course.models import chain  # notebook 05's

    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    x = struct((128, 512), mesh, P("data", None))
    w1, w2 = struct((512, 1024), mesh, P("model", None)), struct((1024, 512), mesh, P("model", None))
    rows = NamedSharding(mesh, P("data", None))
    chosen, pinned = (collectives(compile_tpu(f, x, w1, w2)) for f in (chain, partial(chain, pin=rows)))
    assert "all-to-all" in chosen.kinds and "all-to-all" not in pinned.kinds
    assert pinned.estimated_bytes < chosen.estimated_bytes / 2
    assert all(shape[0] == 128 // 4 for op in pinned.ops for shape in op.shapes)  # a device's rows: activations


def test_05_a_waypoint_gathers_only_the_kept_columns(chips):
    from spmd_course.models import reshard_via  # notebook 05's

    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    x, target = struct((128, 512), mesh, P("data", None)), NamedSharding(mesh, P(None, "model"))
    via = NamedSharding(mesh, P("data", "model"))
    (direct_c, direct_log), (waypoint_c, waypoint_log) = (compile_with_log(jax.jit(f).lower(x)) for f in (
        lambda v: reshard_via(v, target), lambda v: reshard_via(v, via, target)))
    assert [op.result_type for op in collectives(direct_c).ops] == ["f32[128,512]"]  # all of x, on every chip
    assert [op.result_type for op in collectives(waypoint_c).ops] == ["f32[128,256]"]  # only the kept columns
    assert equivalent(waypoint_c.output_shardings, mesh, P(None, "model"))
    assert "Involuntary" not in waypoint_log
    if "TPU_STDERR_LOG_LEVEL" not in os.environ:  # why notebook 05 asserts the warning on the CPU backend only
        assert "Involuntary" not in direct_log


REMATERIALIZING_ON_TPU = """
import numpy as np, jax
from jax.experimental import topologies
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
from spmd_course.models import reshard_via
from spmd_course.utils import compile_with_log, tpu_compiler_available
tpu_compiler_available()
topo = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")
mesh = Mesh(np.array(topo.devices).reshape(4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
x = jax.ShapeDtypeStruct((128, 512), np.float32, sharding=NamedSharding(mesh, P("data", None)))
direct = jax.jit(lambda v: reshard_via(v, NamedSharding(mesh, P(None, "model"))))
print("warned:", "Involuntary full rematerialization" in compile_with_log(direct.lower(x))[1])
"""


def test_05_libtpu_prints_the_rematerialization_warning_when_asked(tpu_devices):
    # Notebook 05's prose: libtpu logs the warning too, but shows it on stderr only with TPU_STDERR_LOG_LEVEL=1.
    env = {**os.environ, "TPU_STDERR_LOG_LEVEL": "1", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", REMATERIALIZING_ON_TPU], env=env, capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert "warned: True" in run.stdout, run.stdout + run.stderr[-2000:]


def test_05_explicit_axes_programs(chips):
    auto = tpu_mesh(chips, (4, 2), ("data", "model"))
    mesh = tpu_mesh(chips, (4, 2), ("data", "model"), axis_type=AxisType.Explicit)
    with jax.set_mesh(mesh):
        layer_sum = compile_tpu(lambda x, w: (x @ w).sum(axis=0), struct((128, 512), mesh, P("data", None)),
                                struct((512, 256), mesh, P(None, "model")))
        by_rows = compile_tpu(lambda a, b: jnp.matmul(a, b, out_sharding=P("data", None)),
                              struct((128, 256), mesh, P(None, "model")), struct((256, 512), mesh, P("model", None)))
    with jax.set_mesh(auto):
        silent = compile_tpu(jnp.add, struct((128, 512), auto, P("data", None)), struct((128, 512), auto,
                                                                                      P(None, "data")))
    assert collectives(layer_sum).kinds == {"all-reduce"} and collectives(layer_sum).ops[0].group_size == 4
    assert [(kind, group) for kind, _, group in summary(by_rows)] == [("all-reduce", 2)]
    assert collectives(silent).count() > 0  # the mismatched operand, moved without a word


# --- 06 shard_map ----------------------------------------------------------------------------------------


def test_06_each_collective_written_is_one_op(chips):
    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    x, x_rows = struct((16, 8), mesh, P("data", "model")), struct((16, 8), mesh, P("data", None))

    def program(f, in_specs, out_specs, *args):
        return compile_tpu(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs), *args)

    def positions(b):
        return 2 * b, jnp.full((1, 1), jax.lax.axis_index("data") * 2 + jax.lax.axis_index("model"))

    ring = [(i, (i + 1) % 4) for i in range(4)]
    blocks = program(positions, P("data", "model"), (P("data", "model"),) * 2, x)
    sums = program(lambda b: jax.lax.psum(b.sum(axis=0), "data"), P("data", None), P(), x_rows)
    a2a = program(lambda b: jax.lax.all_to_all(b, "data", split_axis=1, concat_axis=0, tiled=True),
                  P("data", None), P(None, "data"), x_rows)
    shift = program(lambda b: jax.lax.ppermute(b, "data", ring), P("data", "model"), P("data", "model"),
                    struct((4, 2), mesh, P("data", "model")))
    assert collectives(blocks).count() == 0
    assert typed(sums) == [("all-reduce", "f32[8]", 4)]
    assert [(kind, group) for kind, _, group in summary(a2a)] == [("all-to-all", 4)]
    assert collectives(a2a).ops[0].result_bytes == 4 * 8 * 4 and a2a.output_shardings.shard_shape((16, 8)) == (16, 2)
    assert typed(shift) == [("collective-permute", "f32[1,1]", 4)]


def test_06_all_gather_and_psum_scatter(chips):
    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))

    def scatter(shape):
        return jax.jit(jax.shard_map(lambda b: jax.lax.psum_scatter(b, "data", scatter_dimension=0, tiled=True),
                                     mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"))).lower(
            struct(shape, mesh, P("data", "model")))

    gather = compile_tpu(jax.shard_map(lambda b: jax.lax.all_gather(b, "data", tiled=True, to="invarying"), mesh=mesh,
                                       in_specs=P("data", "model"), out_specs=P(None, "model")),
                         struct((16, 8), mesh, P("data", "model")))
    small = scatter((16, 8))
    with quiet():
        small_c, large_c = small.compile(), scatter((512, 256)).compile()
    (ag,), (rs,) = collectives(gather).ops, collectives(small_c).ops
    # What notebook 06 asserts on every backend: one all-gather of whole columns, one collective of 4 devices,
    # handed to the compiler as a reduce-scatter ...
    assert (ag.kind, ag.group_size, np.prod(ag.shapes[0])) == ("all-gather", 4, 16 * 4)
    assert rs.group_size == 4 and "stablehlo.reduce_scatter" in small.as_text()
    # ... which the TPU compiler lays out as f32[4,4,4] (the CPU's: f32[16,4]), and, this small, writes as an
    # all-reduce and a slice (the CPU's: reduce-scatter f32[1,4]); a large one stays a reduce-scatter
    assert ag.result_type == "f32[4,4,4]" and (rs.kind, rs.result_type) == ("all-reduce", "f32[4,4]")
    assert re.search(r"f32\[1,4\]\S* dynamic-slice\(", small_c.as_text())
    assert typed(large_c) == [("reduce-scatter", "f32[32,128]", 4)]


def test_06_partly_manual_and_in_specs_on_an_auto_mesh(chips):
    from spmd_course.models import sums_of_product  # notebook 06's

    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    x_rows, w = struct((16, 8), mesh, P("data", None)), struct((8, 16), mesh, P(None, "model"))
    full = compile_tpu(jax.shard_map(sums_of_product, mesh=mesh, in_specs=(P("data", None), P()), out_specs=P()),
                       x_rows, w)
    on_auto = compile_tpu(jax.shard_map(lambda b: 2 * b, mesh=mesh, in_specs=P(), out_specs=P()), x_rows)
    assert "all-gather" in collectives(full).kinds  # the whole w, gathered for in_specs=P()
    (op,) = collectives(on_auto).ops
    assert op.kind == "all-gather" and np.prod(op.shapes[0]) == 16 * 8  # the whole array ...
    assert op.result_type == "f32[4,4,8]"  # ... in the TPU compiler's layout (the CPU's: f32[16,8])


# --- 07 data parallelism ---------------------------------------------------------------------------------


def test_07_data_parallel_step_all_reduces_every_gradient_once(chips):
    mesh = tpu_mesh(chips, (8,), ("data",))
    comm = collectives(abstract_train_step(mesh, from_notebook("07", "MLP").MLP, {}, P("data"), P("data")))
    assert comm.kinds == {"all-reduce"} and all(op.group_size == 8 for op in comm.ops)
    assert comm.result_bytes == N_PARAMS * 4 + 4  # every gradient, plus the 4-byte loss


# --- 08 tensor parallelism -------------------------------------------------------------------------------


def test_08_column_then_row_forward_is_one_all_reduce_of_the_logits(chips):
    mesh, nb = tpu_mesh(chips, (8,), ("model",)), from_notebook("08", "MLP", "megatron")
    graphdef, state = abstract_module(mesh, lambda: nb.MLP(nnx.Rngs(0)), nb.megatron)
    forward = compile_module(graphdef, state, struct((64, 64), mesh, P()))
    assert summary(forward) == [("all-reduce", ((64, 10),), 8)]


def test_08_feed_forward_block_layouts(chips):
    mesh, nb = tpu_mesh(chips, (8,), ("model",)), from_notebook("08", "FeedForward", "megatron")

    def compiled(layout):
        graphdef, state = abstract_module(mesh, lambda: nb.FeedForward(nnx.Rngs(0)), layout)
        return collectives(compile_module(graphdef, state, struct((64, 64), mesh, P()),
                                          out_shardings=NamedSharding(mesh, P())))

    online = {"linear1/kernel": P(None, "model"), "linear2/kernel": P(None, "model")}  # the notebook's online_rule
    every_kernel_columns, column_then_row = compiled(online), compiled(nb.megatron)
    assert "all-reduce" not in every_kernel_columns.kinds and "all-gather" in every_kernel_columns.kinds
    assert [(op.kind, op.shapes) for op in column_then_row.ops] == [("all-reduce", ((64, 64),))]


def test_08_attention_heads_on_model_all_reduce_only_the_output(chips):
    mesh, nb = tpu_mesh(chips, (8,), ("model",)), from_notebook("08", "Attention", "heads_layout")
    graphdef, state = abstract_module(mesh, lambda: nb.Attention(64, 8, rngs=nnx.Rngs(1)), nb.heads_layout)
    compiled = compile_module(graphdef, state, struct((4, 16, 64), mesh, P()), out_shardings=NamedSharding(mesh, P()))
    assert summary(compiled) == [("all-reduce", ((4, 16, 64),), 8)]


@pytest.mark.parametrize("tokens", [64, 512])
def test_08_backward_of_a_block_all_reduces_output_and_input_gradient(chips, tokens):
    tp_mesh = tpu_mesh(chips, (8,), ("model",))
    dp_mesh = tpu_mesh(chips, (8,), ("data",))
    nb = from_notebook("08", "FeedForward", "megatron", "block_grads")

    def compiled(mesh, layout, act):
        graphdef, state = abstract_module(mesh, lambda: nb.FeedForward(nnx.Rngs(0)), layout)
        tokens_in = struct((tokens, 64), mesh, act)
        return collectives(compile_module(graphdef, state, tokens_in, tokens_in, method=nb.block_grads))

    tp = compiled(tp_mesh, nb.megatron, P())
    dp = compiled(dp_mesh, {}, P("data"))
    assert tp.kinds == {"all-reduce"} and [op.shapes for op in tp.ops] == [((tokens, 64),)] * 2
    assert dp.kinds == {"all-reduce"} and dp.result_bytes == (64 * 256 + 256 + 256 * 64 + 64) * 4


def test_08_tensor_parallel_train_step_all_reduces_the_logits_only(chips):
    mesh, nb = tpu_mesh(chips, (8,), ("model",)), from_notebook("08", "MLP", "megatron")
    ops = collectives(abstract_train_step(mesh, nb.MLP, nb.megatron, P(), P()))
    assert [(op.kind, op.shapes) for op in ops.ops] == [("all-reduce", ((64, 10),))]


# --- 09 2-D parallelism ----------------------------------------------------------------------------------


def test_09_two_d_matmul_cases(chips):
    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    a = struct((64, 64), mesh, P("data", "model"))
    case2 = compile_tpu(lambda a, b: a @ b, a, struct((64, 256), mesh, P(None, "model")),
                        out_shardings=NamedSharding(mesh, P("data", "model")))
    case3 = compile_tpu(lambda a, b: a @ b, a, struct((64, 256), mesh, P("model", None)))
    (gather,) = collectives(case2).ops
    # What notebook 09 asserts on every backend: one all-gather along `model` of the input's 16 x 64 block ...
    assert gather.kind == "all-gather" and gather.group_size == 2 and np.prod(gather.shapes[0]) == 16 * 64
    # ... which the TPU compiler gathers in bfloat16, in its own layout (the CPU's is f32[16,64])
    assert gather.result_type == "bf16[2,32,16]"
    assert summary(case3) == [("all-reduce", ((16, 256),), 2)]


def test_09_two_d_train_step_talks_along_rows_and_columns(chips):
    mesh, nb = tpu_mesh(chips, (4, 2), ("data", "model")), from_notebook("09", "MLP", "MLP2D", "layout")
    ops = collectives(abstract_train_step(mesh, nb.MLP2D, nb.layout, P("data", None), P("data")))
    along_model = [op for op in ops.ops if op.group_size == 2]
    along_data = [op for op in ops.ops if op.group_size == 4]
    half_params = 64 * 128 + 128 + 128 * 10 + 10
    assert len(along_model) + len(along_data) == ops.count()
    assert [(op.kind, op.shapes) for op in along_model] == [("all-reduce", ((16, 10),))]
    assert {op.kind for op in along_data} == {"all-reduce"}
    assert sum(op.result_bytes for op in along_data) == (half_params + 1) * 4


# --- 12 the transformer: four strategies from rule tables --------------------------------------------------


@pytest.fixture(scope="module")
def transformer(chips):
    """Each of notebook 12's strategies on the TPU's chips: its mesh, state and batch, and its compiled train step."""
    nb = notebook_11()
    setups, steps = {}, {}
    for name, (cpu_mesh, rules) in nb.STRATEGIES.items():
        mesh = tpu_mesh(chips, cpu_mesh.devices.shape, cpu_mesh.axis_names)
        with nnx.logical_axis_rules(rules):
            shardings = nnx.get_named_sharding(nb.abstract, mesh)
            tokens = struct((nb.BATCH, nb.SEQ + 1), mesh, logical_to_mesh_axes(("batch", None)), jnp.int32)
        state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nb.abstract, shardings)
        replicated = NamedSharding(mesh, P())
        with jax.set_mesh(mesh):
            steps[name] = compile_tpu(nb.with_rules(rules, nb.train_step), state, tokens, donate_argnums=0,
                                      out_shardings=(shardings, replicated, replicated),
                                      compiler_options=nb.FAST_COMPILE)
        setups[name] = (mesh, state, tokens)
    return nb, setups, steps


def test_12_building_on_one_device_needs_the_whole_state_there(chips):
    nb = notebook_11()
    one = memory_per_device(compile_tpu(lambda: nnx.state(nb.build()), compiler_options=nb.FAST_COMPILE,
                                        out_shardings=jax.sharding.SingleDeviceSharding(chips[0])))
    whole = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nb.abstract))
    assert one.argument == 0 and one.footprint >= whole


def test_12_data_parallel_all_reduces_the_gradients_once(transformer):
    nb, _, steps = transformer
    c = collectives(steps["data"])
    param_bytes = 4 * (nb.n_split + nb.n_embed_only)
    assert c.kinds == {"all-reduce"} and param_bytes <= c.result_bytes <= param_bytes + 16


def test_12_tensor_parallel_sums_activations(transformer):
    nb, _, steps = transformer
    c = collectives(steps["tensor"])
    assert c.kinds <= {"all-reduce", "all-gather"}
    # Notebook 12 asserts 2 + 6 per layer on the CPU (embedding, attention out, MLP down forward; head, MLP up
    # and q, k, v input gradients back) and says the TPU compiler adds q, k and v's input gradients first.
    assert sum(s == (nb.BATCH, nb.SEQ, nb.D_MODEL) for op in c.ops for s in op.shapes) == 2 + 4 * nb.NUM_LAYERS
    gathers = sorted(s for op in c.ops if op.kind == "all-gather" for s in op.shapes)
    assert gathers == [(nb.BATCH, nb.SEQ, 8)] * 2  # the accuracy's argmax: each chip's best score and its index


def test_12_two_d_activations_over_model_gradients_over_data(transformer):
    nb, _, steps = transformer
    c = collectives(steps["2-D"])
    over_model = [op for op in c.ops if op.group_size == 2]
    over_data = [op for op in c.ops if op.group_size == 4]
    grad_bytes = 4 * (nb.n_split // 2 + nb.n_embed_only)
    assert len(over_model) + len(over_data) == len(c.ops)
    assert all(nb.is_activation(s, nb.BATCH // 4) for op in over_model for s in op.shapes)
    assert {op.kind for op in over_data} == {"all-reduce"}
    assert grad_bytes <= sum(op.result_bytes for op in over_data) <= grad_bytes + 16


@pytest.mark.slow
def test_12_fsdp_gathers_weights_and_needs_the_activation_constraint(transformer):
    nb, setups, steps = transformer
    assert "all-gather" in collectives(steps["FSDP"]).kinds
    mesh, state, tokens = setups["FSDP"]
    with jax.set_mesh(mesh):
        loose = collectives(compile_tpu(nb.loss_only, state, tokens, compiler_options=nb.FAST_COMPILE))
        pinned = collectives(compile_tpu(nb.with_rules(nb.STRATEGIES["FSDP"][1], nb.loss_only), state, tokens,
                                         compiler_options=nb.FAST_COMPILE))
    assert any(nb.is_activation(s, nb.BATCH) for op in loose.ops for s in op.shapes)
    assert not any(nb.is_activation(s, nb.BATCH) for op in pinned.ops for s in op.shapes)


def test_12_rules_are_read_while_tracing(chips):
    nb = notebook_11()
    mesh, rules = tpu_mesh(chips, (8,), ("data",)), nb.STRATEGIES["data"][1]
    x = struct((8, 4), mesh, P())

    def constrained(lowered):
        return "sharding_constraint" in lowered.as_text()

    with nnx.logical_axis_rules(rules):
        no_mesh = constrained(jax.jit(nb.double).lower(x))
    with jax.set_mesh(mesh):
        first = constrained(jax.jit(nb.double).lower(x))
        with nnx.logical_axis_rules(rules):
            again = constrained(jax.jit(nb.double).lower(x))
        fixed = constrained(jax.jit(nb.with_rules(rules, nb.double)).lower(x))
    assert [no_mesh, first, again, fixed] == [False, False, False, True]


# --- 14 sequence parallelism, gradient accumulation, an Explicit mesh, what comes next -------------------


def test_14_tensor_parallel_block_all_reduces_the_residual_stream(chips):
    mesh, nb = tpu_mesh(chips, (8,), ("model",)), from_notebook("14", "block", "param_specs")
    b, s, d, f = 4, 128, 64, 256
    shapes = {"scale": (d,), "up": (d, f), "down": (f, d)}
    params = {name: struct(shape, mesh, nb.param_specs[name]) for name, shape in shapes.items()}
    # the notebook's block with the activations between the regions replicated (its TP layout)
    compiled = compile_tpu(partial(nb.block, between=P(), mesh=mesh), params, struct((b, s, d), mesh, P()))
    # notebook 14 shows the TPU's kinds, and the sequence-parallel block's shapes; these are the TP shapes
    assert [(kind, shapes) for kind, shapes, _ in summary(compiled)] == [("all-reduce", ((b, s, d),))]


def test_14_explicit_mesh_train_step_talks_along_rows_and_columns(chips):
    mesh = tpu_mesh(chips, (4, 2), ("data", "model"), axis_type=AxisType.Explicit)
    rows = NamedSharding(mesh, P("data", None))

    def one_hot_loss(model, x, y):  # the row-parallel layer told where its result goes
        return optax.softmax_cross_entropy(model(x, out_sharding=rows), jax.nn.one_hot(y, 10)).mean()

    nb = from_notebook("14", "MLP", "layout")
    ops = collectives(abstract_train_step(mesh, nb.MLP, nb.layout, P("data", None), P("data"), loss=one_hot_loss)).ops
    assert [(op.kind, op.shapes) for op in ops if op.group_size == 2] == [("all-reduce", ((16, 10),))]
    assert {op.kind for op in ops if op.group_size == 4} == {"all-reduce"}  # the gradients, over data


def test_14_expert_context_and_pipeline_collectives(chips):
    def program(f, axis, shape, dtype=jnp.float32):
        mesh = tpu_mesh(chips, (8,), (axis,))
        return collectives(compile_tpu(jax.shard_map(f, mesh=mesh, in_specs=P(axis), out_specs=P(axis)),
                                       struct(shape, mesh, P(), dtype)))

    def ring_pass(kv):
        def step(_, carry):
            kv, seen = carry
            kv = jax.lax.ppermute(kv, "context", perm=[(i, (i + 1) % 8) for i in range(8)])
            return kv, seen + kv

        return jax.lax.fori_loop(0, 7, step, (kv, kv))[1]

    dispatch = program(lambda b: jax.lax.all_to_all(b, "expert", split_axis=1, concat_axis=1, tiled=True),
                       "expert", (8, 8, 8, 4), jnp.int32)
    ring = program(ring_pass, "context", (8, 16))
    stages = program(lambda a: jax.lax.ppermute(a, "stage", perm=[(s, s + 1) for s in range(7)]), "stage", (8, 16))
    assert [(op.kind, op.group_size) for op in dispatch.ops] == [("all-to-all", 8)]
    assert [(op.kind, op.in_loop) for op in ring.ops] == [("collective-permute", True)]
    assert [op.kind for op in stages.ops] == ["collective-permute"]


# --- 17 choosing a mesh shape --------------------------------------------------------------------------

def _layouts_on_v5e_8x8(tpu_pod, names, sizes):
    """Notebook 17's layouts, its own ``compile_for``, compiled for v5e:8x8: {name: (HBM per chip, state bytes per
    chip)}. ``sizes``: a real width instead of the notebook's toy one (D_MODEL, NUM_LAYERS, NUM_HEADS, D_FF,
    VOCAB, SEQ, BATCH), compiled at the least effort (minutes at the default for 64 chips). The five layouts
    at the notebook's own width, default effort, are compiled in tests/test_17_mesh_shape.py."""
    from spmd_course.models import MyTransformer

    size_names = ("D_MODEL", "NUM_LAYERS", "NUM_HEADS", "D_FF", "VOCAB", "SEQ", "BATCH")
    given = {"MyTransformer": MyTransformer, **dict(zip(size_names, sizes, strict=True))}
    nb = from_notebook("17", "build", "graphdef", "TWO_D", "FSDP_TP", "LAYOUTS", "FAST_COMPILE", "make_step",
                       "compile_for", "state_bytes", given=given)
    found = {}
    with compile_effort("O0"):
        for name in names:
            shape, rules = nb.LAYOUTS[name]
            with quiet():
                program, state = nb.compile_for(shape, rules, devices=tpu_pod)
            found[name] = (memory_per_device(program).footprint, nb.state_bytes(state))
            del program
    return found


@pytest.mark.slow
def test_17_model_parallel_layouts_in_tpu_hbm_at_a_real_width(tpu_pod):
    """d_model 4096, d_ff 16384, 32 heads, 32,768 tokens of vocabulary, 64 sequences of 512 (472 million
    parameters): in TPU HBM, tensor parallelism needs more than 2-D and FSDP x TP the least, the order
    notebook 17 reads from the CPU compiler at its toy size. (Pure data parallelism and FSDP take longer
    to compile at this width and are left out.)"""
    found = _layouts_on_v5e_8x8(tpu_pod, ["2-D", "tensor", "FSDP x TP"], sizes=(4096, 1, 32, 16384, 32768, 512, 64))
    hbm = {name: footprint for name, (footprint, _) in found.items()}
    assert hbm["tensor"] > hbm["2-D"] > hbm["FSDP x TP"] > 512 * 2**20  # well above the chip's 128 MiB of VMEM


def test_reading_a_program_the_notebook_imports_gives_the_saved_one():
    from spmd_course import models

    assert from_notebook("08", "MLP").MLP is models.MLP  # notebook 07's, as 08 imports it
    assert from_notebook("09", "MLP2D").MLP2D.__mro__[1] is models.MLP  # 09's subclass of it


def test_reading_a_definition_the_notebook_no_longer_binds_once_names_it():
    with pytest.raises(LookupError, match=r"07_data_parallel.py binds 'NoSuchModel' at the top level 0 times"):
        from_notebook("07", "NoSuchModel")
    with pytest.raises(LookupError, match=r"12_transformer.py binds 'c' at the top level \d+ times, not once"):
        from_notebook("12", "c")  # rebound in several cells: ambiguous
