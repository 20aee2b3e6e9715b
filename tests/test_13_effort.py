"""Notebook 13 compiles its TPU programs at the least effort, O0, and says what the default effort (the one a
training run gets) does to its ZeRO steps. This checks that table on the notebook's own steps (read from the
notebook, not copied): O0 places nothing in VMEM, the default keeps over 100 MiB there and needs 1.07x,
1.32x and 2.78x less HBM. Slow (three default-effort compiles, 10-15 s of CPU each), so marked slow."""

import pytest

from spmd_course.utils.tpu import tpu_compiler_available

TPU_OK, TPU_WHY = tpu_compiler_available()
pytestmark = [pytest.mark.skipif(not TPU_OK, reason=TPU_WHY), pytest.mark.slow]
MiB = 2**20
# the notebook's table: stage -> (HBM at O0, HBM at the default effort, O0 / default), MiB
TABLE = {"ZeRO-1": (440.1, 412.8, 1.07), "ZeRO-2": (328.1, 248.6, 1.32), "ZeRO-3": (224.1, 80.7, 2.78)}


def spaces(lowered, level):
    """MiB per memory space from the compiler's own report, compiled at `level`."""
    from spmd_course.utils import compile_effort, memory_spaces, quiet

    with compile_effort(level), quiet():
        report = memory_spaces(lowered.lowered)  # nnx.jit's Lowered wraps jax's
    return {name: size / MiB for name, size in report.items()}


@pytest.mark.parametrize("stage", sorted(TABLE))
def test_13_o0_keeps_everything_in_hbm_and_the_default_effort_needs_less(stage):
    import jax
    from jax.experimental import topologies
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from course_support import notebook_12  # the notebook's own definitions, read from its source
    from spmd_course.utils import quiet

    nb = notebook_12()
    with quiet():
        chips = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,), devices=chips)
    data = jax.ShapeDtypeStruct((nb.TOKENS, nb.WIDE["width"]), nb.jnp.float32, sharding=NamedSharding(mesh, P("data")))
    lowered = nb.make_step(stage, mesh).lower(*nb.abstract(stage, mesh, layers=2, **nb.WIDE), data, data)
    o0, default = spaces(lowered, "O0"), spaces(lowered, "UNKNOWN")
    hbm_o0, hbm_default, ratio = TABLE[stage]
    assert o0.get("vmem", 0) == 0 and default["vmem"] > 100  # O0: nothing in VMEM; default: over 100 MiB
    assert abs(o0["default"] - hbm_o0) < 0.5 and abs(default["default"] - hbm_default) < 0.5, (o0, default)
    assert abs(o0["default"] / default["default"] - ratio) < 0.01
