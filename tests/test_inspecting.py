"""Collectives, per-device memory and shard tables read from real compiled programs."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils.inspecting import (
    COLLECTIVES,
    Collectives,
    collectives,
    compile_with_log,
    format_bytes,
    memory_per_device,
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
        "  %d-start = (f32[4]{0}, f32[4]{0}) all-gather-start(%w), replica_groups={}",
        "  %d-done = f32[4]{0} all-gather-done(%d-start)",
        "  %e = s32[2]{0} collective-permute(%v), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}",
        "  %g = s32[2]{0} collective-permute(%v), "
        "source_target_pairs={{0,2},{2,4},{4,6},{6,0},{1,3},{3,5},{5,7},{7,1}}",
        "  %h = (f32[1,8]{1,0}, /*index=1*/f32[1,8]{1,0}) all-to-all(%a, %b), replica_groups={{0,1}}",
        "  %f = f32[8]{0} add(%p, %q)",
    ])
    found = collectives(text)
    assert [op.kind for op in found.ops] == ["all-reduce", "all-gather", "reduce-scatter", "all-gather",
                                             "collective-permute", "collective-permute", "all-to-all"]
    assert [op.group_size for op in found.ops] == [4, 2, 4, 8, 4, 4, 2]  # two rings of 4 in the 6th
    assert [op.result_bytes for op in found.ops] == [16 * 8 * 4, 64 * 4, 8 * 8 * 2, 2 * 4 * 4, 2 * 4, 2 * 4, 64]
    assert [op.result_type for op in found.ops] == ["f32[16,8]", "f32[64]", "bf16[8,8]", "2 x f32[4]", "s32[2]",
                                                    "s32[2]", "2 x f32[1,8]"]
    assert found.counts["all-gather"] == 2  # the -done half is not counted
    assert [op.shapes for op in found.ops] == [((16, 8),), ((64,),), ((8, 8),), ((4,), (4,)), ((2,),), ((2,),),
                                               ((1, 8), (1, 8))]


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


def test_shard_table_computed_from_a_layout_agrees_with_the_runtime():
    for spec in [P(), P("data"), P(None, "model"), P("data", "model"), P(("model", "data"))]:
        x = jax.device_put(jnp.ones((16, 8)), NamedSharding(MESH, spec))
        assert shard_table((16, 8), NamedSharding(MESH, spec)).rows == shard_table(x).rows


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
