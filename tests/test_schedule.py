"""spmd_course.utils.schedule: a compiled train step as its sequence of matmuls and collectives.

CPU programs of the usual layouts (data parallel, tensor parallel, FSDP, a 2-D mesh), the same on a mesh of
reversed devices, every replica-group spelling in HLO text, and a TPU v5e:2x4 program compiled ahead of time
(skipped where libtpu is absent). The picture of a step is draw_timeline's (tests/test_step_pictures.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import schedule


def _step(w1, w2, x):
    """One SGD step of a two-layer tanh MLP."""
    def loss(w1, w2):
        return jnp.sum(jnp.tanh(jnp.tanh(x @ w1) @ w2))

    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
    return w1 - 0.1 * g1, w2 - 0.1 * g2


def _compiled(shape, names, w1, w2, x, devices=None):
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=devices)
    ns = lambda spec: NamedSharding(mesh, spec)
    args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=ns(spec))
            for s, spec in (((64, 256), w1), ((256, 64), w2), ((32, 64), x))]
    return jax.jit(_step, out_shardings=(ns(w1), ns(w2))).lower(*args).compile(), mesh


LAYOUTS = {
    "dp": ((8,), ("data",), P(), P(), P("data")),
    "tp": ((8,), ("model",), P(None, "model"), P("model", None), P()),
    "fsdp": ((8,), ("fsdp",), P("fsdp", None), P("fsdp", None), P("fsdp")),
    "2d": ((4, 2), ("data", "model"), P(None, "model"), P("model", None), P("data")),
}


def _summary(steps):
    return [s.kind if s.kind == "matmul" else (s.kind, s.axes) for s in steps]


def test_data_parallel_reduces_the_gradients_over_data_after_the_matmuls():
    steps = schedule(*_compiled(*LAYOUTS["dp"]))
    assert _summary(steps) == ["matmul"] * 5 + [("all-reduce", ("data",))]  # both gradients in one all-reduce
    assert steps[-1].result_type == "f32[256,64] + f32[64,256]" and not steps[-1].asynchronous


def test_tensor_parallel_sums_over_model_between_matmuls():
    steps = schedule(*_compiled(*LAYOUTS["tp"]))
    kinds = _summary(steps)
    assert kinds.count(("all-reduce", ("model",))) == 1 and {k for k in kinds if k != "matmul"} == {
        ("all-reduce", ("model",))}
    at = kinds.index(("all-reduce", ("model",)))
    assert kinds[:at] == ["matmul"] * 2 and "matmul" in kinds[at + 1:]  # the layer-2 partial sums, then backward
    assert steps[at].result_type == "f32[32,64]"


def test_fsdp_gathers_each_weight_over_fsdp_before_its_first_matmul():
    steps = schedule(*_compiled(*LAYOUTS["fsdp"]))
    assert all(s.axes == ("fsdp",) for s in steps if s.kind != "matmul")
    assert [s.kind for s in steps[:2]] == ["all-gather"] * 2 and steps[2].kind == "matmul"
    assert [s.result_type for s in steps[:2]] == ["f32[64,256]", "f32[256,64]"]  # whole weights, gathered


def test_a_2d_mesh_with_transposed_groups_names_each_axis():
    compiled, mesh = _compiled(*LAYOUTS["2d"])
    text = compiled.as_text()
    assert "replica_groups=[2,4]<=[4,2]T(1,0)" in text or "{{0,2,4,6},{1,3,5,7}}" in text  # 'data': strided
    steps = schedule(compiled, mesh)
    assert [k for k in _summary(steps) if k != "matmul"] == [("all-reduce", ("model",)), ("all-reduce", ("data",))]
    assert schedule(compiled, {"data": 4, "model": 2}) == steps  # axis names and sizes serve as well


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_axes_do_not_depend_on_the_device_order(layout):
    reversed_devices = jax.devices()[:8][::-1]
    assert _summary(schedule(*_compiled(*LAYOUTS[layout]))) == _summary(
        schedule(*_compiled(*LAYOUTS[layout], devices=reversed_devices)))


def test_every_replica_group_spelling_and_an_async_pair_from_text():
    text = "\n".join([
        "HloModule m, is_scheduled=true, num_partitions=8",
        "ENTRY %main (x: f32[8]) -> f32[8] {",
        "  %a = f32[16,8]{1,0} all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add",
        "  %b = f32[64]{0} all-gather(%y), channel_id=2, replica_groups=[4,2]<=[8], dimensions={0}",
        "  %c = bf16[8,8]{1,0} reduce-scatter(%z), replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}",
        "  %d-start = (f32[1]{0}, f32[8]{0}) all-gather-start(%w), replica_groups={}",
        "  %m = f32[8,8]{1,0} dot(%p, %q), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "  %d-done = f32[8]{0} all-gather-done(%d-start)",
        "  %g = s32[2]{0} collective-permute(%v), "
        "source_target_pairs={{0,2},{2,4},{4,6},{6,0},{1,3},{3,5},{5,7},{7,1}}",
        "  %i = f32[4,2]{1,0} all-reduce(%x), replica_groups=[2,4]<=[4,2]T(1,0), to_apply=%add",
        "  %j = f32[4]{0} all-reduce(%x), replica_groups=mesh['axis_0'=1,'axis_1'=2,'axis_2'=4], "
        "device_ids=([4,2]T(1,0)) {'axis_1'}, to_apply=%add",
        "  ROOT %f = f32[8]{0} add(%p, %q)",
        "}",
    ])
    steps = schedule(text, {"x": 4, "y": 2})  # position p = 2x + y
    assert [(s.name, s.axes) for s in steps] == [
        ("a", ("x", "y")), ("b", ("y",)), ("c", ("x",)), ("d-start", ("x", "y")), ("m", ()), ("g", ("x",)),
        ("i", ("x",)), ("j", ("y",))]
    gather = steps[3]
    assert (gather.kind, gather.result_type, gather.asynchronous, gather.overlaps) == ("all-gather", "f32[8]", True, 1)
    assert not any(s.asynchronous for s in steps if s is not gather)


def test_a_loop_body_is_listed_once_with_its_trips():
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(mesh, P(None, "model")))
    w = jax.ShapeDtypeStruct((128, 128), jnp.float32, sharding=NamedSharding(mesh, P("model", None)))
    looped = jax.jit(lambda x, w: jax.lax.fori_loop(0, 5, lambda i, h: jnp.tanh(h @ w), x)).lower(x, w).compile()
    steps = schedule(looped, mesh)
    inside = [s for s in steps if s.in_loop]
    assert inside and {s.trips for s in inside} == {5}  # one body, five trips: read from the program
    assert ("matmul", 5) in {(s.kind, s.trips) for s in inside} and all(s.trips == 1 for s in steps if not s.in_loop)


def test_bad_input_says_what_to_pass():
    compiled, mesh = _compiled(*LAYOUTS["dp"])
    with pytest.raises(TypeError, match="compiled program"):
        schedule(jax.jit(_step), mesh)
    with pytest.raises(TypeError, match="the mesh the program was compiled for"):
        schedule(compiled, 8)
    with pytest.raises(ValueError, match=r"runs on 8 devices .* pass the mesh the program was compiled with"):
        schedule(compiled, {"data": 4})


def test_tpu_step_overlaps_an_asynchronous_gather_with_a_matmul(tpu_devices):
    """FSDP over both axes of a (4, 2) v5e mesh: the TPU starts a gather, runs a matmul, then waits for it."""
    mesh = Mesh(np.array(tpu_devices).reshape(4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    fsdp = NamedSharding(mesh, P(("data", "model"), None))
    ws = [jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=fsdp)] * 2

    def loss(ws, x):
        return jnp.sum(jnp.tanh(jnp.tanh(x @ ws[0]) @ ws[1]) ** 2)

    x = jax.ShapeDtypeStruct((512, 1024), jnp.float32, sharding=fsdp)
    compiled = jax.jit(jax.grad(loss), out_shardings=[fsdp] * 2).lower(ws, x).compile()
    assert 'custom_call_target="AsyncCollectiveStart"' in compiled.as_text()
    steps = schedule(compiled, mesh)
    overlapped = [s for s in steps if s.asynchronous and s.overlaps > 0]
    assert overlapped and all(s.kind == "all-gather" for s in overlapped)
    assert {s.axes for s in steps if s.kind != "matmul"} == {("data", "model")}  # every collective spans both
    assert overlapped[0].result_type.endswith("[1024,1024]")  # a whole weight, gathered while a matmul runs
