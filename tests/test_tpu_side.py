"""The TPU side of the notebooks' compiler facts.

A notebook asserts a compiler fact either for every backend (no guard) or for the CPU backend only
(``if CPU:``). The unguarded ones must then also hold where the course runs on 8 real TPUs. This
compiles the notebooks' programs, at the notebooks' shapes and layouts, ahead of time for a TPU v5e-8
(``v5e:2x4``, no TPU needed) and checks each unguarded fact on the TPU program. Notebooks that show a
TPU program beside the CPU one (04, 10, 14, 15, 16) assert their TPU side themselves; this covers the
others. Skipped, with the reason, where libtpu is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest

from utils.tpu import tpu_compiler_available

TPU_OK, TPU_WHY = tpu_compiler_available()
pytestmark = pytest.mark.skipif(not TPU_OK, reason=TPU_WHY)

if TPU_OK:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from jax.experimental import topologies
    from jax.sharding import AxisType, Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from utils import collectives, memory_per_device, quiet


@pytest.fixture(scope="module")
def chips():
    """The 8 chips of a TPU v5e-8, in the order the topology lists them."""
    with quiet():
        return list(topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices)


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


# --- the course MLP (notebooks 07 to 10) and its train step, on abstract state ----------------------------


class MLP(nnx.Module if TPU_OK else object):
    def __init__(self, rngs):
        self.linear1 = nnx.Linear(64, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))


class MLP2D(MLP):  # notebook 09: the hidden activation pinned to P('data', 'model')
    def __call__(self, x):
        return self.linear2(jax.lax.with_sharding_constraint(jax.nn.relu(self.linear1(x)), P("data", "model")))


N_PARAMS = 64 * 256 + 256 + 256 * 10 + 10


def path_name(path):
    return "/".join(str(k.key) for k in path if hasattr(k, "key"))


def abstract_train_step(mesh, model_cls, layout, x_spec, y_spec):
    """The course's donated train step, compiled for ``mesh`` with each parameter (and its Adam moments) laid
    out as ``layout`` says (name -> spec; the step counters replicated)."""

    def create():
        model = model_cls(nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    graphdef, state = nnx.split(nnx.eval_shape(create))

    def spec_of(path):
        name = path_name(path)
        return next((spec for key, spec in layout.items() if name.endswith(key)), P())

    abstract = jax.tree_util.tree_map_with_path(lambda p, s: struct(s.shape, mesh, spec_of(p), s.dtype), state)

    def step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss, nnx.state((model, optimizer))

    with jax.set_mesh(mesh):
        return compile_tpu(step, abstract, struct((64, 64), mesh, x_spec), struct((64,), mesh, y_spec, jnp.int32),
                           donate_argnums=0)


MEGATRON = {"linear1/kernel": P(None, "model"), "linear1/bias": P("model"), "linear2/kernel": P("model", None)}


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
    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    uneven = NamedSharding(mesh, P("data"))

    def sum_of_cosines(a):
        return jnp.cos(jax.lax.with_sharding_constraint(a * 2, uneven)).sum()

    compiled = compile_tpu(sum_of_cosines, jax.ShapeDtypeStruct((10,), jnp.float32))
    hlo = compiled.as_text()
    assert "f32[12]" in hlo and "f32[3]" in hlo
    assert collectives(compiled).count("all-reduce") == 1


# --- 07 data parallelism ---------------------------------------------------------------------------------


def test_07_data_parallel_step_all_reduces_every_gradient_once(chips):
    mesh = tpu_mesh(chips, (8,), ("data",))
    comm = collectives(abstract_train_step(mesh, MLP, {}, P("data"), P("data")))
    assert comm.kinds == {"all-reduce"} and all(op.group_size == 8 for op in comm.ops)
    assert comm.result_bytes == N_PARAMS * 4 + 4  # every gradient, plus the 4-byte loss


# --- 08 tensor parallelism -------------------------------------------------------------------------------


def test_08_column_then_row_forward_is_one_all_reduce_of_the_logits(chips):
    mesh = tpu_mesh(chips, (8,), ("model",))
    forward = compile_tpu(
        lambda w1, b1, w2, b2, x: jax.nn.relu(x @ w1 + b1) @ w2 + b2,
        struct((64, 256), mesh, P(None, "model")), struct((256,), mesh, P("model")),
        struct((256, 10), mesh, P("model", None)), struct((10,), mesh, P()), struct((64, 64), mesh, P()),
    )
    assert summary(forward) == [("all-reduce", ((64, 10),), 8)]


def test_08_feed_forward_block_layouts(chips):
    mesh = tpu_mesh(chips, (8,), ("model",))

    def block(w1, w2, x):
        return jax.nn.relu(x @ w1) @ w2

    def compiled(spec2):
        return collectives(compile_tpu(
            block, struct((64, 256), mesh, P(None, "model")), struct((256, 64), mesh, spec2),
            struct((64, 64), mesh, P()), out_shardings=NamedSharding(mesh, P()),
        ))

    every_kernel_columns, column_then_row = compiled(P(None, "model")), compiled(P("model", None))
    assert "all-reduce" not in every_kernel_columns.kinds and "all-gather" in every_kernel_columns.kinds
    assert [(op.kind, op.shapes) for op in column_then_row.ops] == [("all-reduce", ((64, 64),))]


def test_08_attention_heads_on_model_all_reduce_only_the_output(chips):
    mesh = tpu_mesh(chips, (8,), ("model",))
    heads, width = 8, 64

    def attention(wq, wk, wv, wo, x):
        b, t, _ = x.shape
        q, k, v = ((x @ w).reshape(b, t, heads, width // heads) for w in (wq, wk, wv))
        weights = jax.nn.softmax(jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(width // heads), axis=-1)
        return jnp.einsum("bhts,bshd->bthd", weights, v).reshape(b, t, width) @ wo

    column = struct((width, width), mesh, P(None, "model"))
    compiled = compile_tpu(attention, column, column, column, struct((width, width), mesh, P("model", None)),
                           struct((4, 16, width), mesh, P()), out_shardings=NamedSharding(mesh, P()))
    assert summary(compiled) == [("all-reduce", ((4, 16, 64),), 8)]


@pytest.mark.parametrize("tokens", [64, 512])
def test_08_backward_of_a_block_all_reduces_output_and_input_gradient(chips, tokens):
    tp_mesh = tpu_mesh(chips, (8,), ("model",))
    dp_mesh = tpu_mesh(chips, (8,), ("data",))

    def grads(w1, b1, w2, b2, x, dy):
        def f(w1, b1, w2, b2, x):
            return jnp.sum(jnp.tanh(jax.nn.relu(x @ w1 + b1) @ w2 + b2) * dy)

        return jax.grad(f, argnums=(0, 1, 2, 3, 4))(w1, b1, w2, b2, x)

    def compiled(mesh, layout, act):
        return collectives(compile_tpu(
            grads, struct((64, 256), mesh, layout[0]), struct((256,), mesh, layout[1]),
            struct((256, 64), mesh, layout[2]), struct((64,), mesh, P()),
            struct((tokens, 64), mesh, act), struct((tokens, 64), mesh, act),
        ))

    tp = compiled(tp_mesh, (P(None, "model"), P("model"), P("model", None)), P())
    dp = compiled(dp_mesh, (P(), P(), P()), P("data"))
    assert tp.kinds == {"all-reduce"} and [op.shapes for op in tp.ops] == [((tokens, 64),)] * 2
    assert dp.kinds == {"all-reduce"} and dp.result_bytes == (64 * 256 + 256 + 256 * 64 + 64) * 4


def test_08_tensor_parallel_train_step_all_reduces_the_logits_only(chips):
    mesh = tpu_mesh(chips, (8,), ("model",))
    ops = collectives(abstract_train_step(mesh, MLP, MEGATRON, P(), P()))
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
    mesh = tpu_mesh(chips, (4, 2), ("data", "model"))
    ops = collectives(abstract_train_step(mesh, MLP2D, MEGATRON, P("data", None), P("data")))
    along_model = [op for op in ops.ops if op.group_size == 2]
    along_data = [op for op in ops.ops if op.group_size == 4]
    half_params = 64 * 128 + 128 + 128 * 10 + 10
    assert len(along_model) + len(along_data) == ops.count()
    assert [(op.kind, op.shapes) for op in along_model] == [("all-reduce", ((16, 10),))]
    assert {op.kind for op in along_data} == {"all-reduce"}
    assert sum(op.result_bytes for op in along_data) == (half_params + 1) * 4
