"""Helper behaviour that notebooks 03 and 04 rely on, tested here so the notebooks assert only their lessons.

- the pictures of 03 (3-D arrays: labels with bytes, panels that follow the mesh's columns);
- the once-wrong cases of ex03's checkers: a hint that blamed the dtype for "replicated on all 8", and an
  explanation that said copies follow device ids (they follow mesh position);
- the premises of ex04: the replica groups it asks about are what the compiler writes for an all-gather
  over 'data', and its byte estimate does not depend on the backend's gather dtype.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from test_drawing import tile_labels

from exercises import ex03_namedsharding, ex04_propagation_resharding
from utils.drawing import draw_sharding
from utils.inspecting import collectives

MESH = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


# --- 03's pictures ----------------------------------------------------------------------------------------------


def test_3d_blocks_are_labelled_with_their_full_shape_and_bytes():
    labels = tile_labels(draw_sharding((2, 128, 512), NamedSharding(MESH, P(None, "data", "model"))))
    assert len(labels) == 8 and all("(2, 32, 256)\n64.0 KiB" in label for label in labels)
    assert labels[3].startswith("dev 3\n")


def test_a_sharded_leading_dimension_gives_one_panel_per_mesh_column():
    fig = draw_sharding((2, 128, 512), NamedSharding(MESH, P("model", "data", None)))
    assert [ax.get_title() for ax in fig.axes] == ["dim 0 = 0:1", "dim 0 = 1:2"]
    labels = tile_labels(fig)
    assert [label.split("\n")[0] for label in labels] == [f"dev {d}" for d in (0, 2, 4, 6, 1, 3, 5, 7)]
    assert all("(1, 32, 512)\n64.0 KiB" in label for label in labels)


def test_a_kernel_split_over_model_is_drawn_as_two_decks_of_four():
    labels = tile_labels(draw_sharding((512, 1024), NamedSharding(MESH, P(None, "model"))))
    assert "dev 0,2,4,6\n(512, 512)\n1.0 MiB\n4 copies" in labels


# --- ex03: the once-wrong cases ---------------------------------------------------------------------------------


def test_ex03_eight_times_the_array_is_not_blamed_on_the_dtype_alone():
    eight_copies = 8 * 512 * 1024 * 2  # P(): every device holds the whole bfloat16 array (= 4 copies of f32)
    with pytest.raises(AssertionError) as caught:
        ex03_namedsharding.mesh_bytes.checker(eight_copies)
    assert "P()" in str(caught.value) and "2 bytes" in str(caught.value)


def test_ex03_replica_zero_follows_mesh_position_not_device_id():
    reversed_mesh = Mesh(np.array(jax.devices())[::-1].reshape(4, 2), ("data", "model"),
                         axis_types=(AxisType.Explicit,) * 2)
    a = jax.device_put(np.zeros((128, 512), np.float32), NamedSharding(reversed_mesh, P("data", None)))
    first = {s.device.id for s in a.addressable_shards if s.replica_id == 0}
    assert first == set(reversed_mesh.device_ids[:, 0].tolist()) == {7, 5, 3, 1}  # the mesh's left column
    assert ex03_namedsharding.first_replicas.solution == first
    with pytest.raises(AssertionError, match="mesh order, not by device id"):
        ex03_namedsharding.first_replicas.checker({0, 2, 4, 6})  # the lower id of each pair: the once-wrong reading
    assert "mesh position, not device ids" in ex03_namedsharding.first_replicas.explanation


# --- ex04: the premises ---------------------------------------------------------------------------------------------


def test_ex04_the_groups_it_asks_about_are_an_all_gather_over_data():
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    a = jax.ShapeDtypeStruct((128, 256), jnp.float32, sharding=NamedSharding(mesh, P("model", "data")))
    b = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=NamedSharding(mesh, P()))
    compiled = jax.jit(lambda a, b: a @ b).lower(a, b).compile()
    (op,) = collectives(compiled).ops
    line = next(s for s in compiled.as_text().splitlines() if f"%{op.name} = " in s)
    assert op.kind == "all-gather" and op.group_size == 4
    assert "replica_groups=[2,4]<=[4,2]T(1,0)" in line
    groups = [sorted(g) for g in ex04_propagation_resharding.read_groups.solution]
    assert groups == mesh.device_ids.T.tolist()  # the mesh's columns: devices that differ only in 'data'


def test_ex04_the_byte_estimate_counts_float32_whatever_the_gather_dtype(tpu_devices):
    tpu_mesh = Mesh(np.array(tpu_devices).reshape(4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    fsdp = NamedSharding(tpu_mesh, P(("data", "model"), None))
    x = jax.ShapeDtypeStruct((128, 256), jnp.float32, sharding=fsdp)
    w = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=fsdp)
    (op,) = collectives(jax.jit(lambda x, w: x @ w).lower(x, w).compile()).ops
    assert re.match(r"bf16\[256,512\]", op.result_type)  # the TPU gathers w as bfloat16 ...
    assert op.shapes[0] == (256, 512) and op.group_size == 8  # ... with the shape and group the checker reads


# --- 04 section 3: reading replica groups -------------------------------------------------------------------------
# The visible cell of 04 section 3 reads the groups of case 3 (a sum over 'model') and case 4 (a gather over 'data')
# from their HLO lines, whatever spelling the compiler chose. These are the spellings seen on the CPU (jax 0.12 and
# 0.10.2) and for a TPU v5e-8 compiled ahead of time, and the explicit list another backend may write.
ROWS, COLUMNS = np.arange(8).reshape(4, 2).tolist(), np.arange(8).reshape(4, 2).T.tolist()
SPELLINGS = {
    "replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, use_global_device_ids=true": ROWS,
    "replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}, dimensions={0}": COLUMNS,
    "replica_groups=mesh['axis_0'=1,'axis_1'=2,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_1'}, use": ROWS,
    "replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2] {'axis_0'}, dimensions={0}": COLUMNS,
    "replica_groups=[4,2]<=[8], to_apply=%add.clone": ROWS,
    "replica_groups=[2,4]<=[4,2]T(1,0), dimensions={1}": COLUMNS,
    "replica_groups={{0,2,4,6},{1,3,5,7}}, dimensions={0}": COLUMNS,
}


@pytest.fixture(scope="module")
def nb04():
    from tests.test_tpu_side import from_notebook

    return from_notebook("04", "hlo_line", "read_groups", "iota_groups")


@pytest.mark.parametrize("line,groups", SPELLINGS.items(), ids=range(len(SPELLINGS)))
def test_04_reads_every_spelling_of_replica_groups(nb04, line, groups):
    assert nb04.read_groups(line) == groups


def test_04_names_the_line_it_cannot_read(nb04):
    with pytest.raises(ValueError, match="no replica groups in: %fusion"):
        nb04.read_groups("%fusion = f32[32,256] fusion(%p), kind=kCustom, calls=%all-reduce-scatter")


def test_04_section_3_reads_the_tpu_programs_groups(nb04, tpu_devices):
    from utils.capture import quiet

    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=tpu_devices)
    wanted = {(P(None, "model"), P("model", None)): ROWS, (P("data", None), P(None, "data")): COLUMNS}
    for (spec_a, spec_b), groups in wanted.items():
        args = [jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
                for shape, spec in (((128, 256), spec_a), ((256, 512), spec_b))]
        with quiet():
            compiled = jax.jit(jnp.matmul).lower(*args).compile()
        (op,) = collectives(compiled).ops
        assert nb04.read_groups(nb04.hlo_line(compiled, op)) == groups  # positions in mesh order, as on the CPU
