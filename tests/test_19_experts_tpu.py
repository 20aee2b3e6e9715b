"""notebook 19's Mixtral-shaped training step, compiled for v5p:2x4x4 at the compiler's default effort.

The notebook lowers its own ``mixtral_step`` (cheap) but cannot afford to compile it: at the default effort,
the effort ``jax.jit`` uses, that takes minutes of CPU. It prints the compiled program's figures in a table,
``MIXTRAL_V5P``. This test compiles the notebook's ``mixtral_step`` (read from its source, not a copy) and checks
every figure of that table, and the formula of the all-to-all's bytes against the compiled program. Minutes of
compiling: marked slow (``make test-slow``)."""

from __future__ import annotations

import pytest

from spmd_course.utils.tpu import tpu_compiler_available

TPU_OK, TPU_WHY = tpu_compiler_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not TPU_OK, reason=TPU_WHY)]

GiB, MiB = 2**30, 2**20


@pytest.fixture(scope="module")
def compiled():
    import jax
    from jax.experimental import topologies
    from jax.sharding import AxisType

    from course_support import from_notebook
    from spmd_course.utils import compile_effort, quiet

    nb = from_notebook("19", "capacity_of", "route", "experts_ffn", "moe", "rms_norm", "mixtral_step", "MIXTRAL_V5P")
    with quiet():
        chips = topologies.get_topology_desc(topology_name="v5p:2x4x4", platform="tpu").devices
    mesh = jax.make_mesh((4, 8), ("fsdp", "expert"), axis_types=(AxisType.Auto,) * 2, devices=chips)
    lowered, n_params = nb.mixtral_step(mesh)
    with compile_effort(None), quiet():  # the default effort, whatever an earlier test left set
        program = lowered.compile()
    return nb, mesh, program, n_params


def test_the_figures_in_the_notebooks_table(compiled):
    from spmd_course.utils import collectives, estimate_step, memory_per_device

    nb, mesh, program, n_params = compiled
    table = nb.MIXTRAL_V5P
    memory, ops, step = memory_per_device(program), collectives(program), estimate_step(program, mesh)
    if memory.allocated is None:  # jax 0.10.2: footprint is the estimated sum
        pytest.skip("the table holds jax 0.12's figures with libtpu 0.0.50.1, which reports the HBM allocated")
    assert abs(memory.footprint / GiB - table["HBM per chip (GiB)"]) < 0.05
    a2a = [op for op in ops.ops if op.kind == "all-to-all" and op.in_loop]
    assert len(a2a) == table["all-to-alls per layer"] and all(op.trips == 32 for op in a2a)
    buffer = 8 * nb.capacity_of(4096, 2, 8, 1.25) * 4096 * 2  # the notebook's formula
    assert all(op.result_bytes == buffer and op.group_size == 8 for op in a2a)
    assert buffer / MiB == table["all-to-all result (MiB)"]
    gathers = [op for op in ops.ops if op.kind == "all-gather" and op.in_loop and op.group_size == 4]
    assert len(gathers) == table["all-gathers per layer, over fsdp"]
    assert abs(step.seconds - table["estimated step (s)"]) < 0.005
    assert abs(step.compute - table["of which compute (s)"]) < 0.005
    assert abs(step.comm_exposed - table["of which exposed communication (s)"]) < 0.005
    roofline = estimate_step(program, mesh, use_cycles=False)  # the prose's "1.33 s by the matmuls' FLOPs at peak"
    assert abs(roofline.compute - 1.329) < 0.005 and step.compute > roofline.compute
    assert memory.footprint < 0.5 * 95.73 * GiB and round(n_params / 1e9, 1) == 46.7
