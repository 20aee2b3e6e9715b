"""Notebook 04's own code: section 3 reads replica groups from a collective's HLO line, whatever spelling the
compiler chose (read from the notebook's source by ``from_notebook``, not copied)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from course_support import from_notebook
from spmd_course.utils.inspecting import collectives

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
    return from_notebook("04", "hlo_line", "read_groups", "iota_groups")


@pytest.mark.parametrize("line,groups", SPELLINGS.items(), ids=range(len(SPELLINGS)))
def test_04_reads_every_spelling_of_replica_groups(nb04, line, groups):
    assert nb04.read_groups(line) == groups


def test_04_names_the_line_it_cannot_read(nb04):
    with pytest.raises(ValueError, match="no replica groups in: %fusion"):
        nb04.read_groups("%fusion = f32[32,256] fusion(%p), kind=kCustom, calls=%all-reduce-scatter")


def test_04_section_3_reads_the_tpu_programs_groups(nb04, tpu_devices):
    from spmd_course.utils.capture import quiet

    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=tpu_devices)
    wanted = {(P(None, "model"), P("model", None)): ROWS, (P("data", None), P(None, "data")): COLUMNS}
    for (spec_a, spec_b), groups in wanted.items():
        args = [jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
                for shape, spec in (((128, 256), spec_a), ((256, 512), spec_b))]
        with quiet():
            compiled = jax.jit(jnp.matmul).lower(*args).compile()
        (op,) = collectives(compiled).ops
        assert nb04.read_groups(nb04.hlo_line(compiled, op)) == groups  # positions in mesh order, as on the CPU
