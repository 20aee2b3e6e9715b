"""Collectives, per-device memory and shard tables read from real compiled programs.

The TPU cases compile real programs ahead of time for a TPU v5e:2x4 topology (the ``tpu_devices``
fixture; no TPU needed, skipped where libtpu is absent) next to the same program for 8 CPU devices.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils.inspecting import (
    COLLECTIVES,
    Collectives,
    collectives,
    compile_with_log,
    format_bytes,
    memory_per_device,
    memory_spaces,
    shard_table,
)

MESH = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def _matmul(x_spec, w_spec, m=128, k=512, n=1024):
    x = jax.device_put(jnp.ones((m, k)), NamedSharding(MESH, x_spec))
    w = jax.device_put(jnp.ones((k, n)), NamedSharding(MESH, w_spec))
    return jax.jit(lambda a, b: a @ b).lower(x, w).compile()


def test_no_collectives_when_no_contracting_dim_is_sharded():
    found = collectives(_matmul(P("data", None), P(None, "model")))
    assert found.count() == 0 and found.kinds == set() and found.estimated_bytes == 0
    assert str(found).startswith("no collectives: each device computes without talking to the others")


def test_row_parallel_matmul_needs_one_all_reduce_over_model():
    found = collectives(_matmul(P(None, "model"), P("model", None)))
    assert found.counts == {"all-reduce": 1, "all-gather": 0, "reduce-scatter": 0, "all-to-all": 0,
                            "collective-permute": 0}
    (op,) = found.ops
    assert op.result_type == "f32[128,1024]" and op.result_bytes == 128 * 1024 * 4
    assert op.group_size == 2  # the 'model' axis
    assert op.estimated_bytes == 2 * (2 - 1) / 2 * 128 * 1024 * 4
    assert "all-reduce" in str(found) and "total" in str(found)


def test_fsdp_like_matmul_all_gathers_over_all_eight():
    found = collectives(_matmul(P(("data", "model"), None), P(("data", "model"), None)))
    assert found.count("all-gather") == 1 and found.count() == 1
    (op,) = found.ops
    assert op.group_size == 8 and op.result_bytes == 512 * 1024 * 4
    assert op.estimated_bytes == 7 / 8 * 512 * 1024 * 4


def test_text_input_and_every_replica_group_spelling():
    text = "\n".join([
        "HloModule m, num_partitions=8",
        "  %a = f32[16,8]{1,0} all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add",
        "  %b = f32[64]{0} all-gather(%y), channel_id=2, replica_groups=[4,2]<=[8], dimensions={0}",
        "  ROOT %c = bf16[8,8]{1,0} reduce-scatter(%z), replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}",
        "  %d-start = (f32[1]{0}, f32[8]{0}) all-gather-start(%w), replica_groups={}",
        "  %d-done = f32[8]{0} all-gather-done(%d-start)",
        "  %e = s32[2]{0} collective-permute(%v), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}",
        "  %g = s32[2]{0} collective-permute(%v), "
        "source_target_pairs={{0,2},{2,4},{4,6},{6,0},{1,3},{3,5},{5,7},{7,1}}",
        "  %h = (f32[1,8]{1,0}, /*index=1*/f32[1,8]{1,0}) all-to-all(%a, %b), replica_groups={{0,1}}",
        "  %i = f32[4,2]{1,0:T(8,128)} all-reduce(%x), replica_groups=[2,4]<=[4,2]T(1,0), to_apply=%add",
        "  %j = f32[4]{0} all-reduce(%x), replica_groups=mesh['axis_0'=1,'axis_1'=2,'axis_2'=4], "
        "device_ids=([4,2]T(1,0)) {'axis_1'}, to_apply=%add",
        "  %f = f32[8]{0} add(%p, %q)",
    ])
    found = collectives(text)
    assert [op.kind for op in found.ops] == ["all-reduce", "all-gather", "reduce-scatter", "all-gather",
                                             "collective-permute", "collective-permute", "all-to-all",
                                             "all-reduce", "all-reduce"]
    assert [op.group_size for op in found.ops] == [4, 2, 4, 8, 4, 4, 2, 4, 2]  # two rings of 4 in the 6th
    assert [op.result_bytes for op in found.ops] == [16 * 8 * 4, 64 * 4, 8 * 8 * 2, 8 * 4, 2 * 4, 2 * 4, 64,
                                                     4 * 2 * 4, 4 * 4]
    assert [op.result_type for op in found.ops] == ["f32[16,8]", "f32[64]", "bf16[8,8]", "f32[8]", "s32[2]",
                                                    "s32[2]", "2 x f32[1,8]", "f32[4,2]", "f32[4]"]
    assert found.counts["all-gather"] == 2  # the -done half is not counted
    assert [op.shapes for op in found.ops] == [((16, 8),), ((64,),), ((8, 8),), ((8,),), ((2,),), ((2,),),
                                               ((1, 8), (1, 8)), ((4, 2),), ((4,),)]
    assert [op.form for op in found.ops] == ["op"] * 3 + ["async"] + ["op"] * 5


def test_async_pairs_count_once_with_the_result_bytes():
    """Every async spelling: -start/-done pairs (result from the -done), and async-start wrapping a computation."""
    text = "\n".join([
        "HloModule m, num_partitions=8",
        "%wrapped_reduce_scatter (p: f32[64]) -> f32[8] {",
        "  %p = f32[64]{0} parameter(0)",
        "  ROOT %rs = f32[8]{0} reduce-scatter(%p), channel_id=3, replica_groups=[1,8]<=[8], dimensions={0}, "
        "to_apply=%add",
        "}",
        "ENTRY %main (x: f32[8]) -> f32[8] {",
        "  %x = f32[8]{0} parameter(0)",
        "  %ag-start = (f32[8]{0}, f32[64]{0}) all-gather-start(%x), channel_id=1, replica_groups=[1,8]<=[8], "
        "dimensions={0}",
        "  %ag-done = f32[64]{0} all-gather-done(%ag-start)",
        "  %ar-start = f32[64]{0} all-reduce-start(%ag-done), channel_id=2, replica_groups={{0,1},{2,3},{4,5},{6,7}}, "
        "to_apply=%add",
        "  %ar-done = f32[64]{0} all-reduce-done(%ar-start)",
        "  %rs-start = ((f32[64]{0}), f32[8]{0}) async-start(%ar-done), calls=%wrapped_reduce_scatter",
        "  %rs-done = f32[8]{0} async-done(%rs-start), calls=%wrapped_reduce_scatter",
        "  %cp-start = (f32[8]{0}, f32[8]{0}, u32[], u32[]) collective-permute-start(%rs-done), channel_id=4, "
        "source_target_pairs={{0,1},{1,0}}",
        "  ROOT %cp-done = f32[8]{0} collective-permute-done(%cp-start)",
        "}",
    ])
    found = collectives(text)
    assert [(op.kind, op.name, op.result_type, op.result_bytes, op.group_size, op.form) for op in found.ops] == [
        ("all-gather", "ag-start", "f32[64]", 256, 8, "async"),
        ("all-reduce", "ar-start", "f32[64]", 256, 2, "async"),
        ("reduce-scatter", "rs", "f32[8]", 32, 8, "async"),
        ("collective-permute", "cp-start", "f32[8]", 32, 2, "async"),
    ]


def test_collectives_in_loop_bodies_count_every_trip_and_branches_once():
    body = jax.jit(lambda x, w: jax.lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w), x))
    x = jax.device_put(jnp.ones((64, 128)), NamedSharding(MESH, P(None, "model")))
    w = jax.device_put(jnp.ones((128, 128)), NamedSharding(MESH, P("model", None)))
    found = collectives(body.lower(x, w).compile())
    (op,) = [op for op in found.ops if op.kind == "all-reduce"]  # stated once in the body, run 3 times
    assert (op.in_loop, op.trips) == (True, 3) and found.count("all-reduce") == 3
    assert all(op.trips == 3 for op in found.ops)
    assert found.result_bytes == 3 * sum(op.result_bytes for op in found.ops)
    assert found.estimated_bytes == 3 * sum(op.estimated_bytes for op in found.ops)
    assert "(in loop, x3)" in str(found) and "runs N times" in str(found)
    text = "\n".join([
        "HloModule m, num_partitions=8",
        "%body (p: f32[8]) -> f32[8] {",
        "  %p = f32[8]{0} parameter(0)",
        "  ROOT %ar = f32[8]{0} all-reduce(%p), channel_id=1, replica_groups=[4,2]<=[8], to_apply=%add",
        "}",
        "%cond (p: f32[8]) -> pred[] {",
        "  ROOT %c = pred[] constant(true)",
        "}",
        "%unused (p: f32[8]) -> f32[8] {",
        "  ROOT %ag = f32[8]{0} all-gather(%p), channel_id=9, replica_groups=[4,2]<=[8], dimensions={0}",
        "}",
        "%branch (p: f32[8]) -> f32[8] {",
        "  ROOT %a2a = f32[8]{0} all-to-all(%p), channel_id=2, replica_groups=[4,2]<=[8], dimensions={0}",
        "}",
        "ENTRY %main (x: f32[8]) -> f32[8] {",
        "  %x = f32[8]{0} parameter(0)",
        "  %w = f32[8]{0} while(%x), condition=%cond, body=%body",
        "  %w2 = f32[8]{0} while(%w), condition=%cond, body=%body",
        "  ROOT %k = f32[8]{0} conditional(%i, %w2), branch_computations={%branch, %branch}",
        "}",
    ])
    found = collectives(text)  # each instruction of the program text once, wherever it is called from; unused: none
    assert [(op.kind, op.in_loop, op.trips) for op in found.ops] == [("all-reduce", True, None),
                                                                      ("all-to-all", False, 1)]
    with pytest.raises(ValueError, match=r"loop 'w'.*trip count cannot be read"):  # its condition is no counter
        found.count()
    assert "x?" in str(found) and "unknown" in str(found)


def test_count_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        Collectives(()).count("allreduce")
    assert set(Collectives(()).counts) == set(COLLECTIVES)


def test_collectives_bad_input_says_what_to_pass():
    x = jnp.ones((8, 8))
    f = jax.jit(lambda a: a * 2)
    with pytest.raises(TypeError, match=r"call \.compile\(\) on it first"):
        collectives(f.lower(x))
    with pytest.raises(TypeError, match="not the function"):
        collectives(f)
    with pytest.raises(TypeError, match="not the function"):
        collectives(lambda a: a)
    with pytest.raises(TypeError, match="got int"):
        collectives(3)


def test_memory_per_device_is_per_device():
    compiled = _matmul(P("data", None), P(None, "model"))
    mem = memory_per_device(compiled)
    assert mem.argument == 32 * 512 * 4 + 512 * 512 * 4  # the x shard plus the w shard
    assert mem.output == 32 * 512 * 4
    assert mem.temp == 0 and mem.total == mem.argument + mem.output
    assert str(mem).startswith("per device: arguments 1.1 MiB")


def test_memory_per_device_bad_input():
    with pytest.raises(TypeError, match="compiled program"):
        memory_per_device("HloModule m")
    with pytest.raises(TypeError, match=r"\.compile\(\)"):
        memory_per_device(jax.jit(lambda a: a).lower(jnp.ones(2)))


def test_shard_table_of_a_real_array():
    x = jax.device_put(jnp.ones((16, 8)), NamedSharding(MESH, P("data", None)))
    table = shard_table(x)
    assert [r.device for r in table.rows] == list(range(8))
    assert [r.replica for r in table.rows] == [0, 1] * 4
    assert table.rows[2].index == "[4:8, 0:8]"
    assert table.shard_shapes == {(4, 8)}
    assert table.total_bytes == 2 * x.nbytes and table.array_bytes == x.nbytes
    assert "(2x)" in str(table)


_ORDERS = {"ids": list(range(8)), "reversed": list(range(7, -1, -1)), "v5e ring": [0, 1, 2, 3, 7, 6, 5, 4],
           "shuffled": [5, 2, 7, 0, 3, 6, 1, 4]}


@pytest.mark.parametrize("order", _ORDERS, ids=str)
@pytest.mark.parametrize("shape,names", [((4, 2), ("data", "model")), ((2, 4), ("data", "model")), ((8,), ("data",)),
                                         ((2, 2, 2), ("data", "model", "pipe"))], ids=str)
def test_shard_table_computed_from_a_layout_numbers_replicas_as_jax_does(order, shape, names):
    devices = np.array(jax.devices())[_ORDERS[order]].reshape(shape)
    mesh = Mesh(devices, names, axis_types=(AxisType.Auto,) * len(shape))
    specs = [P(), P(names[0]), P(None, names[-1]), P(names)]
    for spec in specs + ([P(names[-1], names[0]), P(names[1], None)] if len(names) > 1 else []):
        sharding = NamedSharding(mesh, spec)
        x = jax.device_put(jnp.ones((16, 8)), sharding)
        computed = shard_table(jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=sharding))
        assert computed.rows == shard_table(x).rows, spec
        assert [(r.device, r.replica) for r in computed.rows] == sorted(
            (s.device.id, s.replica_id) for s in x.addressable_shards)


def test_shard_table_replicas_follow_the_mesh_not_the_ids():
    mesh_rev = Mesh(np.array(jax.devices())[::-1].reshape(4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    rows = shard_table((16, 8), NamedSharding(mesh_rev, P("data", None))).rows
    assert [(r.device, r.replica) for r in rows][:4] == [(0, 1), (1, 0), (2, 1), (3, 0)]


def test_shard_table_bad_input():
    with pytest.raises(TypeError, match=r"jax\.Array"):
        shard_table({"a": 1})


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1536, 3 * 2**20, 5 * 2**30)] == [
        "0 B", "1023 B", "1.5 KiB", "3.0 MiB", "5.0 GiB"]


def test_compile_with_log_captures_xla_warnings():
    x = jax.device_put(jnp.ones((128, 512)), NamedSharding(MESH, P("data", None)))
    to_model = NamedSharding(MESH, P(None, "model"))
    lowered = jax.jit(lambda a: jax.lax.with_sharding_constraint(a * 3.0, to_model)).lower(x)
    compiled, log = compile_with_log(lowered)
    assert collectives(compiled).count("all-gather") >= 1
    assert "Involuntary full rematerialization" in log


def test_compile_with_log_is_quiet_when_xla_is():
    compiled, log = compile_with_log(jax.jit(lambda a: a + 1).lower(jnp.ones(4)))
    assert log == "" and compiled.as_text()


def test_compile_with_log_bad_input():
    with pytest.raises(TypeError, match="takes a Lowered program"):
        compile_with_log(jax.jit(lambda a: a))


def test_table_summarises_long_fused_results():
    text = "  %a = (f32[256]{0}, f32[256,64]{1,0}, f32[64]{0}, f32[64,10]{1,0}) all-reduce(%x), replica_groups={{0,1}}"
    line = str(collectives(text)).splitlines()[1]
    assert "4 arrays, 67.8 KiB" in line  # (256 + 256*64 + 64 + 64*10) * 4 bytes


# --- programs compiled for a TPU topology, next to the same program for 8 CPU devices ---------------------------


@pytest.fixture(scope="module")
def meshes(tpu_devices):
    """{'tpu': a (4, 2) mesh of v5e:2x4 chips, 'cpu': the same mesh of the 8 simulated CPU devices}."""
    tpu = Mesh(np.array(tpu_devices).reshape(4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    return {"tpu": tpu, "cpu": MESH}


def _struct(mesh, shape, spec, dtype=np.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def _compile(mesh, f, *layouts, **jit_kwargs):
    """Compile ``f`` for ``mesh`` from (shape, spec) pairs; out_shardings given as specs."""
    if "out_shardings" in jit_kwargs:
        jit_kwargs["out_shardings"] = jax.tree.map(
            lambda spec: NamedSharding(mesh, spec), jit_kwargs["out_shardings"], is_leaf=lambda x: isinstance(x, P))
    structs = [_struct(mesh, shape, spec) for shape, spec in layouts]
    return jax.jit(f, **jit_kwargs).lower(*structs).compile()


MATMULS = {  # (512, 1024) @ (1024, 1024) on the (4, 2) mesh: the collectives both compilers insert
    "contracting dim unsharded, x's columns gathered": (P("data", "model"), P(None, "model"), "all-gather", 2),
    "contracting dim sharded over model": (P("data", "model"), P("model", None), "all-reduce", 2),
    "no contracting dim sharded": (P("data", None), P(None, "model"), None, 0),
    "contracting dim sharded over data": (P(None, "data"), P("data", None), "all-reduce", 4),
}


@pytest.mark.parametrize("case", list(MATMULS))
def test_matmul_collectives_are_the_same_on_tpu_and_cpu(meshes, case):
    x_spec, w_spec, kind, group = MATMULS[case]
    for backend, mesh in meshes.items():
        found = collectives(_compile(mesh, lambda a, b: a @ b, ((512, 1024), x_spec), ((1024, 1024), w_spec)))
        assert found.count() == (0 if kind is None else 1), (backend, str(found))
        if kind is not None:
            assert (found.ops[0].kind, found.ops[0].group_size) == (kind, group), backend


def test_tpu_gathers_matmul_operands_in_bf16(meshes):
    x_spec, w_spec = P("data", "model"), P(None, "model")
    ops = {b: collectives(_compile(m, lambda a, b: a @ b, ((512, 1024), x_spec), ((1024, 1024), w_spec))).ops[0]
           for b, m in meshes.items()}
    assert ops["cpu"].result_type == "f32[128,1024]" and ops["cpu"].result_bytes == 128 * 1024 * 4
    assert ops["tpu"].result_type == "bf16[128,1024]" and ops["tpu"].result_bytes == 128 * 1024 * 2  # half
    assert ops["tpu"].estimated_bytes == ops["cpu"].estimated_bytes / 2
    # without a matmul there is no conversion: a plain reshard gathers f32 on both
    for mesh in meshes.values():
        (op,) = collectives(_compile(mesh, lambda w: w * 2, ((1024, 1024), P("data", "model")),
                                     out_shardings=P(None, "model"))).ops
        assert (op.kind, op.result_type, op.group_size) == ("all-gather", "f32[1024,512]", 4)


def _loss(x, w):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def test_fsdp_gradient_tpu_fuses_the_reduce_scatter_cpu_does_not(meshes):
    grads = {b: _compile(m, jax.grad(_loss, argnums=1), ((512, 1024), P("data", None)),
                         ((1024, 1024), P("data", None)), out_shardings=P("data", None))
             for b, m in meshes.items()}
    tpu, cpu = collectives(grads["tpu"]), collectives(grads["cpu"])
    assert [(op.kind, op.result_type, op.group_size) for op in tpu.ops] == [
        ("all-gather", "bf16[1024,1024]", 4), ("reduce-scatter", "f32[256,1024]", 4)]
    assert tpu.count("all-reduce") == 0 and tpu.ops[1].form == "fused"
    # how the TPU program writes it: a fusion calling %all-reduce-scatter, an all-reduce and a dynamic-slice inside
    text = grads["tpu"].as_text()
    assert re.search(r"%fusion[.\d]* = f32\[256,1024\]\S* fusion\(.*kind=kCustom, calls=%all-reduce-scatter", text)
    inside = text.split("%all-reduce-scatter (", 1)[1].split("\n}", 1)[0]
    assert " all-reduce(" in inside and " dynamic-slice(" in inside
    # the CPU keeps the partitioner's all-reduce + dynamic-slice: reported as the all-reduce it is
    assert [(op.kind, op.result_type, op.group_size) for op in cpu.ops] == [
        ("all-gather", "f32[1024,1024]", 4), ("all-reduce", "f32[1024,1024]", 4)]
    assert cpu.count("reduce-scatter") == 0 and "dynamic-slice" in grads["cpu"].as_text()


def test_fused_reduce_scatter_of_a_combined_all_reduce_is_one_reduce_scatter():
    """The TPU fuses a combined all-reduce of two gradients and their slices: one reduce-scatter of both slices."""
    def module(second_use):
        return "\n".join([
            "HloModule m, num_partitions=8",
            "%all-reduce-scatter (a: f32[512,128], b: f32[128,512]) -> (f32[64,128], f32[16,512]) {",
            "  %a = f32[512,128]{1,0} parameter(0)",
            "  %b = f32[128,512]{1,0} parameter(1)",
            "  %ar = (f32[512,128]{1,0:T(8,128)}, f32[128,512]{1,0:T(8,128)}) all-reduce(%a, %b), channel_id=1, "
            "replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add",
            "  %g0 = f32[512,128]{1,0} get-tuple-element(%ar), index=0",
            "  %s0 = f32[64,128]{1,0:T(8,128)S(1)} dynamic-slice(%g0, %i, %z), dynamic_slice_sizes={64,128}",
            "  %g1 = f32[128,512]{1,0} get-tuple-element(%ar), index=1",
            second_use,
            "  ROOT %t = (f32[64,128]{1,0}, f32[16,512]{1,0}) tuple(%s0, %s1)",
            "}",
            "ENTRY %main (x: f32[512,128], y: f32[128,512]) -> (f32[64,128], f32[16,512]) {",
            "  %x = f32[512,128]{1,0} parameter(0)",
            "  %y = f32[128,512]{1,0} parameter(1)",
            "  ROOT %f = (f32[64,128]{1,0}, f32[16,512]{1,0}) fusion(%x, %y), kind=kCustom, calls=%all-reduce-scatter",
            "}",
        ])

    (op,) = collectives(module("  %s1 = f32[16,512]{1,0} dynamic-slice(%g1, %i, %z), dynamic_slice_sizes={16,512}")).ops
    assert (op.kind, op.result_type, op.shapes, op.group_size, op.form) == (
        "reduce-scatter", "f32[64,128] + f32[16,512]", ((64, 128), (16, 512)), 8, "fused")
    assert op.result_bytes == (64 * 128 + 16 * 512) * 4
    # one element used whole (added, not sliced): not a reduce-scatter, so the all-reduce it is
    (op,) = collectives(module("  %s1 = f32[128,512]{1,0} add(%g1, %g1)")).ops
    assert (op.kind, op.result_type) == ("all-reduce", "f32[512,128] + f32[128,512]")


def test_tpu_fuses_the_combined_gradient_reduce_scatter_in_a_scan(tpu_devices):
    """Residual blocks scanned over layers, weights split over 8 devices: one reduce-scatter for both gradients."""
    def loss(ws, x):
        def block(h, w):
            return h + jax.nn.relu(h @ w[0]) @ w[1], None
        return jnp.mean(jax.lax.scan(block, x, ws)[0] ** 2)

    mesh = Mesh(np.array(tpu_devices), ("data",), axis_types=(AxisType.Auto,))
    split = P(None, "data")
    ws = (_struct(mesh, (2, 128, 512), split), _struct(mesh, (2, 512, 128), split))
    grad = jax.jit(jax.grad(loss), out_shardings=(NamedSharding(mesh, split),) * 2)
    found = collectives(grad.lower(ws, _struct(mesh, (512, 128), P("data"))).compile())
    (rs,) = [op for op in found.ops if op.kind == "reduce-scatter"]
    assert rs.in_loop and rs.form == "fused" and sorted(rs.shapes) == [(16, 512), (64, 128)], str(found)
    assert rs.result_bytes == (16 * 512 + 64 * 128) * 4
    assert found.count("all-reduce") == 0, str(found)


def test_psum_scatter_is_a_reduce_scatter_on_cpu_and_a_small_one_an_all_reduce_on_tpu(meshes):
    for backend, mesh in meshes.items():
        scatter = jax.shard_map(lambda a: jax.lax.psum_scatter(a, "data", scatter_dimension=0, tiled=True),
                                mesh=mesh, in_specs=P(None, None), out_specs=P("data", None))
        for rows in (16, 32, 40, 64):  # each device keeps rows / 4 of them
            (op,) = collectives(jax.jit(scatter).lower(_struct(mesh, (rows, 512), P())).compile()).ops
            if backend == "tpu" and rows in (16, 40):  # 4 or 10 rows each, not whole 8-row tiles: all rows summed
                assert (op.kind, op.result_type, op.group_size) == ("all-reduce", f"f32[{rows},512]", 4)
            else:
                assert (op.kind, op.result_type, op.group_size, op.form) == (
                    "reduce-scatter", f"f32[{rows // 4},512]", 4, "op"), backend


def test_tpu_async_chains_count_once(meshes):
    """FSDP over two layers: the TPU overlaps one gather with compute, written as fusions sharing a channel."""
    def loss(ws, x):
        return jnp.sum(jnp.tanh(jnp.tanh(x @ ws[0]) @ ws[1]) ** 2)

    fsdp = P(("data", "model"), None)
    found = {}
    for backend, mesh in meshes.items():
        ws = [_struct(mesh, (1024, 1024), fsdp)] * 2
        compiled = jax.jit(jax.grad(loss), out_shardings=[NamedSharding(mesh, fsdp)] * 2).lower(
            ws, _struct(mesh, (512, 1024), fsdp)).compile()
        found[backend] = (collectives(compiled), compiled.as_text())
    (tpu, text), (cpu, _) = found["tpu"], found["cpu"]
    assert 'custom_call_target="AsyncCollectiveStart"' in text  # the async spelling is there...
    gather_channels = set(re.findall(r" all-gather\(.*?channel_id=(\d+)", text))
    assert len(re.findall(r" all-gather\(", text)) > len(gather_channels)  # ...repeating one gather per step
    assert tpu.count("all-gather") == len(gather_channels) == cpu.count("all-gather")  # ...counted once
    assert any(op.form == "async" for op in tpu.ops)
    reductions = [c.count("reduce-scatter") + c.count("all-reduce") for c in (tpu, cpu)]
    assert reductions[0] == reductions[1]  # the TPU's fused reduce-scatter is the CPU's all-reduce + slice
    assert tpu.count("all-to-all") == cpu.count("all-to-all")


def test_ppermute_and_reshard_all_to_all_on_tpu_and_cpu(meshes):
    for backend, mesh in meshes.items():
        ring = jax.shard_map(lambda a: jax.lax.ppermute(a, "data", [(i, (i + 1) % 4) for i in range(4)]),
                             mesh=mesh, in_specs=P("data", None), out_specs=P("data", None))
        compiled = jax.jit(ring).lower(_struct(mesh, (512, 1024), P("data", None))).compile()
        (op,) = collectives(compiled).ops
        assert (op.kind, op.result_type, op.result_bytes, op.group_size) == (
            "collective-permute", "f32[128,1024]", 128 * 1024 * 4, 4), backend
        # the TPU sends it asynchronously: a -start whose type is (operand, result, ...); the result counts once
        assert op.form == ("async" if backend == "tpu" else "op")
        if backend == "tpu":
            assert {"collective-permute-start(", "collective-permute-done("} <= set(
                re.findall(r"collective-permute-\w+\(", compiled.as_text()))
        (op,) = collectives(_compile(mesh, lambda a: a * 2, ((512, 1024), P("data", None)),
                                     out_shardings=P(None, "data"))).ops
        assert (op.kind, op.result_bytes, op.group_size) == ("all-to-all", 128 * 1024 * 4, 4), backend


def test_collectives_in_loop_bodies_on_tpu_and_cpu(meshes):
    for backend, mesh in meshes.items():
        fori = _compile(mesh, lambda x, w: jax.lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w), x),
                        ((512, 1024), P(None, "model")), ((1024, 1024), P("model", None)))
        found = collectives(fori)
        (op,) = [op for op in found.ops if op.kind == "all-reduce"]
        assert op.group_size == 2 and op.trips == 3 and found.count("all-reduce") == 3, backend  # TPU: the counter
        assert all(op.in_loop for op in found.ops), backend
        scan = _compile(mesh, lambda x, ws: jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0],
                        ((512, 1024), P("data", None)), ((3, 1024, 1024), P(None, "data", None)))
        (op,) = collectives(scan).ops
        assert (op.kind, op.group_size, op.in_loop, op.trips) == ("all-gather", 4, True, 3), backend


def test_memory_per_device_on_tpu(meshes):
    x_spec, w_spec = P("data", "model"), P("model", None)
    mem = {b: memory_per_device(_compile(m, lambda a, b: a @ b, ((512, 1024), x_spec), ((1024, 1024), w_spec)))
           for b, m in meshes.items()}
    shards = 128 * 512 * 4 + 512 * 1024 * 4  # x's (128, 512) shard + w's (512, 1024) shard
    assert mem["tpu"].argument == mem["cpu"].argument == shards == 2_359_296  # per chip; no padding at these shapes
    assert mem["tpu"].output == mem["cpu"].output == 128 * 1024 * 4
    assert (mem["tpu"].platform, mem["cpu"].platform) == ("tpu", "cpu")
    assert str(mem["tpu"]).startswith("per TPU device: arguments 2.2 MiB")
    assert "HBM" in str(mem["tpu"]) and "counting on-chip VMEM too (not HBM)" in str(mem["tpu"])
    assert str(mem["cpu"]).startswith("per device: arguments 2.2 MiB") and "peak" not in str(mem["cpu"])
    # TPU: footprint is the HBM the compiler allocated (jax 0.12 reports it), else the sum of the parts
    if jax.__version_info__ >= (0, 12):
        assert mem["tpu"].allocated is not None and mem["tpu"].footprint == mem["tpu"].allocated
    else:
        assert mem["tpu"].allocated is None and mem["tpu"].footprint == mem["tpu"].total
        assert "(their sum, an estimate)" in str(mem["tpu"])
    # CPU: peak leaves temporaries out (it is arguments + outputs); footprint is total there
    assert mem["cpu"].peak == mem["cpu"].argument + mem["cpu"].output and mem["cpu"].footprint == mem["cpu"].total


def test_tpu_memory_counts_tile_padding_and_temp_leaves_out_on_chip_buffers(meshes):
    add = {b: memory_per_device(_compile(m, lambda a, b: a + b, ((100, 100), P()), ((100, 100), P())))
           for b, m in meshes.items()}
    assert add["cpu"].argument == 2 * 100 * 100 * 4
    assert add["tpu"].argument == 2 * 104 * 128 * 4  # f32[100,100] stored in (8, 128) tiles: [104, 128]
    if jax.__version_info__ >= (0, 12):
        assert add["tpu"].peak == 3 * 104 * 128 * 4
    grad = _compile(meshes["tpu"], jax.grad(_loss, argnums=1), ((512, 1024), P("data", None)),
                    ((1024, 1024), P("data", None)), out_shardings=P("data", None))
    mem = memory_per_device(grad)
    # the gathered weight lives in on-chip VMEM (layouts ending S(1)): counted in peak, not in HBM
    assert mem.temp == 0 and "S(1)}" in grad.as_text()
    assert mem.argument + mem.output <= mem.footprint < mem.peak


@pytest.fixture(scope="module")
def sin_matmul(tpu_devices):
    """sum((sin(a) @ a.T) @ a) for a replicated f32[4096,4096] on the v5e:2x4 chips: (lowered, compiled), compiled
    once at the default effort for both tests below (each compile of it costs seconds of CPU)."""
    mesh = Mesh(np.array(tpu_devices), ("data",), axis_types=(AxisType.Auto,))
    lowered = jax.jit(lambda a: jnp.sum((jnp.sin(a) @ a.T) @ a)).lower(_struct(mesh, (4096, 4096), P()))
    return lowered, lowered.compile()


def test_tpu_footprint_is_hbm_and_peak_counts_vmem_too(sin_matmul):
    """sum((sin(a) @ a.T) @ a) for a replicated f32[4096,4096]: 64 MiB of HBM; the compiler keeps sin(a) and a bf16
    copy (96 MiB) in on-chip VMEM, which peak counts and footprint does not."""
    mem = memory_per_device(sin_matmul[1])
    assert mem.argument == 64 * 2**20 and mem.temp == 0 and mem.platform == "tpu"
    assert abs(mem.footprint - 64 * 2**20) <= 4096  # the argument, plus scalars each in a 512-byte tile
    assert mem.peak == mem.argument + mem.output + 96 * 2**20  # 160 MiB: not an HBM figure
    text = str(mem)
    assert "HBM 64.0 MiB" in text or "HBM about 64.0 MiB" in text
    assert "peak 160.0 MiB counting on-chip VMEM too (not HBM)" in text


def test_memory_spaces_reads_hbm_and_vmem_apart(sin_matmul):
    """The compiler's own report, one compilation more: 64 MiB of HBM and 96 MiB of VMEM, on both jax lines."""
    lowered, compiled = sin_matmul
    spaces = memory_spaces(lowered)
    assert abs(spaces["default"] - 64 * 2**20) <= 4096 and spaces["vmem"] == 96 * 2**20
    assert abs(memory_per_device(compiled).footprint - spaces["default"]) <= 4096


def test_memory_spaces_on_cpu_and_bad_input():
    """A CPU program has one space, its device memory; a compiled program or its text is refused with the fix."""
    lowered = jax.jit(lambda a: a @ a.T).lower(_struct(MESH, (256, 128), P("data", None)))
    spaces = memory_spaces(lowered)
    assert set(spaces) == {"default"} and spaces["default"] >= memory_per_device(lowered.compile()).argument
    for bad in (lowered.compile(), lowered.as_text(), None):
        with pytest.raises(TypeError, match=r"jax.jit\(f\).lower"):
            memory_spaces(bad)


REPORT_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from spmd_course.utils.capture import quiet
    from spmd_course.utils.inspecting import memory_per_device
    from spmd_course.utils.tpu import tpu_compiler_available

    assert tpu_compiler_available()[0]
    with quiet():
        chips = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices
    mesh = Mesh(np.array(chips), ("d",))

    def struct(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    def sin_matmuls(a):
        return jnp.sum((jnp.sin(a) @ a.T) @ a)

    adam = optax.adam(1e-3)

    def adam_step(params, state, x):
        def loss(p):
            return jnp.mean((jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] - x) ** 2)
        value, grads = jax.value_and_grad(loss)(params)
        updates, state = adam.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    def adam_step_donated(params, state, x):
        return adam_step(params, state, x)

    D, H = 2048, 8192
    specs = {"w1": P("d", None), "b1": P(), "w2": P(None, "d")}
    params = {"w1": struct((D, H), specs["w1"]), "b1": struct((H,), specs["b1"]), "w2": struct((H, D), specs["w2"])}
    state = jax.tree_util.tree_map_with_path(  # Adam's moments split like their parameters, the counter whole
        lambda path, x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
            mesh, specs.get(getattr(path[-1], "key", None), P()) if x.ndim else P())),
        jax.eval_shape(adam.init, params))
    out = (jax.tree.map(lambda x: x.sharding, params), jax.tree.map(lambda x: x.sharding, state),
           NamedSharding(mesh, P()))
    x = struct((D, D), P("d", None))
    compiled = {
        "sin_matmuls": jax.jit(sin_matmuls).lower(struct((4096, 4096), P())).compile(),
        "adam_step": jax.jit(adam_step, out_shardings=out).lower(params, state, x).compile(),
        "adam_step_donated": jax.jit(adam_step_donated, out_shardings=out, donate_argnums=(0, 1)).lower(
            params, state, x).compile(),
    }
    found = {}
    for name, c in compiled.items():
        mem = memory_per_device(c)
        found[name] = {"footprint": mem.footprint, "peak": mem.peak, "allocated": mem.allocated,
                       "total": mem.total, "alias": mem.alias, "platform": mem.platform}
    print(json.dumps(found))
""")


def _report_totals(dump, name):
    """'Total bytes' per memory space of the compiler's memory-usage report for module jit_<name>."""
    (report,) = dump.glob(f"*.jit_{name}.*memory-usage-report.txt")
    return {space: int(size) for space, size in
            re.findall(r"Memory Space: (\w+) \(color=\d+\)\nTotal bytes: (\d+)", report.read_text())}


@pytest.mark.slow
def test_tpu_footprint_matches_the_compilers_memory_report(tpu_devices, tmp_path):
    """The compiler's own account (XLA_FLAGS=--xla_dump_to): space 'default' is HBM, 'vmem' the on-chip memory."""
    dump = tmp_path / "dump"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_dump_to={dump}")
    run = subprocess.run([sys.executable, "-c", REPORT_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    for name, mem in found.items():
        spaces = _report_totals(dump, name)
        hbm, vmem = spaces["default"], spaces["vmem"]
        assert mem["platform"] == "tpu" and vmem > 0, (name, spaces)
        if mem["allocated"] is not None:  # jax 0.12: the compiler's HBM allocation, to the byte
            assert mem["footprint"] == mem["allocated"] == hbm, (name, mem, spaces)
        else:  # jax 0.10: arguments + outputs + temporaries - aliased, within 1 MiB here (an estimate)
            assert mem["footprint"] == mem["total"] and abs(mem["footprint"] - hbm) <= 2**20, (name, mem, spaces)
        assert mem["footprint"] < mem["peak"], (name, mem, spaces)  # peak counts VMEM too
    # ...but it is HBM + VMEM only for the simplest program: the step's differs from that sum (above it on
    # libtpu 0.0.42.1, below on 0.0.50.1)
    sin, step = _report_totals(dump, "sin_matmuls"), _report_totals(dump, "adam_step")
    assert abs(found["sin_matmuls"]["footprint"] - 64 * 2**20) <= 4096 and sin["vmem"] == 96 * 2**20
    assert abs(found["sin_matmuls"]["peak"] - (sin["default"] + sin["vmem"])) <= 4096
    assert abs(found["adam_step"]["peak"] - (step["default"] + step["vmem"])) > 2**19
    assert found["adam_step_donated"]["alias"] > 0
    assert found["adam_step_donated"]["footprint"] < found["adam_step"]["footprint"]  # the state updated in place


def test_platform_of_a_program_without_arguments(tpu_devices):
    """Read from the output shardings when there are no inputs: a constructor compiled for TPU says so."""
    mesh = Mesh(np.array(tpu_devices), ("data",), axis_types=(AxisType.Auto,))
    for m, platform, shown in ((mesh, "tpu", "per TPU device: "), (MESH, "cpu", "per device: ")):
        compiled = jax.jit(lambda: jnp.zeros((8, 128)), out_shardings=NamedSharding(m, P())).lower().compile()
        mem = memory_per_device(compiled)
        assert (mem.argument, mem.platform) == (0, platform) and str(mem).startswith(shown)


def _mlp_step(params, x):
    """An SGD step of a two-layer MLP: two weight gradients, which the compilers may combine into one collective."""
    def loss(params):
        return jnp.mean((jax.nn.relu(x @ params["w1"]) @ params["w2"] - x) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


def test_tpu_combined_reduce_scatter_of_two_gradients_counts_once(tpu_devices):
    """FSDP on a 1-D mesh: the TPU sums both gradients in one all-reduce of a tuple and slices each element."""
    found = {}
    for backend, devices in (("tpu", tpu_devices), ("cpu", jax.devices())):
        mesh = Mesh(np.array(devices), ("data",), axis_types=(AxisType.Auto,))
        params = {"w1": _struct(mesh, (512, 2048), P("data", None)), "w2": _struct(mesh, (2048, 512), P("data", None))}
        step = jax.jit(_mlp_step, out_shardings=({k: v.sharding for k, v in params.items()}, NamedSharding(mesh, P())))
        compiled = step.lower(params, _struct(mesh, (256, 512), P("data", None))).compile()
        found[backend] = (collectives(compiled), compiled.as_text())
    (tpu, text), (cpu, _) = found["tpu"], found["cpu"]
    (scatter,) = [op for op in tpu.ops if op.kind == "reduce-scatter"]
    assert (scatter.result_type, scatter.form, scatter.group_size) == ("f32[64,2048] + f32[256,512]", "fused", 8)
    assert scatter.shapes == ((64, 2048), (256, 512)) and scatter.result_bytes == (64 * 2048 + 256 * 512) * 4
    assert [op.result_type for op in tpu.ops if op.kind == "all-reduce"] == ["f32[]"]  # only the loss is summed whole
    # what the program says: one all-reduce of a tuple, a get-tuple-element and a dynamic-slice per gradient
    inside = text.split("%all-reduce-scatter", 1)[1].split("\n}", 1)[0]
    assert re.search(r"= \(f32\[512,2048\]\S*, f32\[2048,512\]\S*\) all-reduce\(", inside)
    assert inside.count(" get-tuple-element(") == 2 and inside.count(" dynamic-slice(") == 2
    # the CPU keeps the partitioner's combined all-reduce of the whole gradients, then slices
    (summed,) = [op for op in cpu.ops if op.kind == "all-reduce"]
    assert cpu.count("reduce-scatter") == 0 and {(512, 2048), (2048, 512)} <= set(summed.shapes)


def test_a_fused_all_reduce_used_whole_is_not_a_reduce_scatter():
    """Parser rule: only a fusion that slices every result of its all-reduce is a reduce-scatter."""
    def module(root: str) -> str:
        return "\n".join([
            "HloModule m, num_partitions=8",
            "%fused (a: f32[64], b: f32[16]) -> (f32[8], f32[16]) {",
            "  %a = f32[64]{0} parameter(0)",
            "  %b = f32[16]{0} parameter(1)",
            "  %ar = (f32[64]{0}, f32[16]{0}) all-reduce(%a, %b), channel_id=1, replica_groups=[1,8]<=[8], "
            "to_apply=%add",
            "  %g0 = f32[64]{0} get-tuple-element(%ar), index=0",
            "  %g1 = f32[16]{0} get-tuple-element(%ar), index=1",
            "  %s0 = f32[8]{0} dynamic-slice(%g0, %i), dynamic_slice_sizes={8}",
            "  %s1 = f32[2]{0} dynamic-slice(%g1, %i), dynamic_slice_sizes={2}",
            f"  ROOT %t = {root}",
            "}",
            "ENTRY %main (x: f32[64], y: f32[16]) -> f32[8] {",
            "  %x = f32[64]{0} parameter(0)",
            "  %y = f32[16]{0} parameter(1)",
            "  ROOT %f = (f32[8]{0}, f32[16]{0}) fusion(%x, %y), kind=kCustom, calls=%fused",
            "}",
        ])

    (op,) = collectives(module("(f32[8]{0}, f32[2]{0}) tuple(%s0, %s1)")).ops
    assert (op.kind, op.result_type, op.form) == ("reduce-scatter", "f32[8] + f32[2]", "fused")
    # the second result is used whole: an all-reduce fused with other work, reported as the all-reduce it is
    text = module("(f32[8]{0}, f32[16]{0}) tuple(%s0, %g1)").replace("  %s1 = f32[2]{0} dynamic-slice(%g1, %i), "
                                                                      "dynamic_slice_sizes={2}\n", "")
    (op,) = collectives(text).ops
    assert (op.kind, op.result_type, op.form) == ("all-reduce", "f32[64] + f32[16]", "fused")


def test_a_64_chip_program(tpu_pod):
    """A v5e:8x8 slice: groups of 8 along each axis of an (8, 8) mesh, of 64 over both; the order of the chips in
    the mesh changes which chip runs which part, not the per-chip program."""
    mesh = jax.make_mesh((8, 8), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=tpu_pod)
    reshaped = Mesh(np.array(tpu_pod).reshape(8, 8), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    texts = []
    for m in (mesh, reshaped):
        compiled = _compile(m, lambda a, b: a @ b, ((512, 1024), P("data", "model")), ((1024, 1024), P("model", None)))
        (op,) = collectives(compiled).ops
        assert (op.kind, op.result_type, op.group_size) == ("all-reduce", "f32[64,1024]", 8)
        texts.append(compiled.as_text())
    assert texts[0] == texts[1]
    grad = _compile(mesh, jax.grad(_loss, argnums=1), ((512, 1024), P(("data", "model"), None)),
                    ((1024, 1024), P()), out_shardings=P())
    (op,) = collectives(grad).ops  # data parallelism over all 64 chips: one all-reduce of the whole gradient
    assert (op.kind, op.result_type, op.group_size) == ("all-reduce", "f32[1024,1024]", 64)
    mem = memory_per_device(grad)
    assert mem.argument == 8 * 1024 * 4 + 1024 * 1024 * 4 and mem.platform == "tpu"  # an 8-row shard of x, all of w
