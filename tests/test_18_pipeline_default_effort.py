"""The pipeline notebook's full-size TPU programs at the compiler's default effort.

The notebook compiles its full-size GPipe and circular steps for a TPU v5e at the least effort, O0, to stay
within its time budget, and states in a table what the default effort gives (the effort ``jax.jit`` uses).
This test compiles the notebook's own ``compile_tpu`` (read from its source) at the default effort and checks
that table and the prose around it, and the O0 comparison the notebook leaves to it (it compiles only GPipe live).
About 45 s of compiling: marked slow (``make test-slow``)."""

from __future__ import annotations

import pytest

from spmd_course.utils.tpu import tpu_compiler_available

TPU_OK, TPU_WHY = tpu_compiler_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not TPU_OK, reason=TPU_WHY)]

GiB = 2**30


@pytest.fixture(scope="module")
def default_effort():
    from course_support import from_notebook
    from spmd_course.utils import collectives, estimate_step, memory_per_device

    nb = from_notebook("18", "layer", "stack", "pipeline_loss", "pipelined", "BIG", "compile_tpu")
    found = {}
    for micro, repeats in ((8, 1), (16, 1), (8, 2)):
        program, mesh = nb.compile_tpu(micro, repeats, effort=None)
        found[micro, repeats] = (memory_per_device(program), estimate_step(program, mesh), collectives(program))
    return found


def test_the_circular_schedule_needs_least_at_o0_too():
    """The notebook's "the circular schedule needs the least, at both efforts": at O0, roofline-timed as it is."""
    from course_support import from_notebook
    from spmd_course.utils import estimate_step, memory_per_device

    nb = from_notebook("18", "layer", "stack", "pipeline_loss", "pipelined", "BIG", "compile_tpu")
    (gpipe, mesh), (circular, _) = nb.compile_tpu(8, 1), nb.compile_tpu(8, 2)
    assert memory_per_device(circular).temp < memory_per_device(gpipe).temp
    assert (estimate_step(circular, mesh, use_cycles=False).seconds
            < estimate_step(gpipe, mesh, use_cycles=False).seconds)


def test_the_default_effort_keeps_the_notebooks_comparisons(default_effort):
    (m8, e8, c8), (m16, _, _), (mc, ec, _) = default_effort.values()
    activation = 4096 * 4096 * 2
    assert m16.footprint - m8.footprint >= 8 * 4 * activation  # 8 more micro-batches: four activations each
    assert mc.footprint < m8.footprint and mc.temp < m8.temp and ec.seconds < e8.seconds  # circular: least
    assert [(op.result_type, op.trips) for op in c8.ops if op.kind == "collective-permute"] == [
        ("bf16[4096,4096]", 15)] * 2


def test_the_default_effort_figures_in_the_notebooks_table(default_effort):
    if any(mem.allocated is None for mem, _, _ in default_effort.values()):  # jax 0.10.2: footprint is the sum
        pytest.skip("the table holds the figures of jax 0.12 with libtpu 0.0.50.1, which reports the HBM allocated")
    table = {(8, 1): (6.8, 7.3, 2.14), (16, 1): (7.8, 8.3, 3.28), (8, 2): (6.6, 6.7, 1.915)}  # GiB, GiB, s
    for key, (temp, hbm, seconds) in table.items():
        mem, est, _ = default_effort[key]
        assert abs(mem.temp / GiB - temp) < 0.05, key
        assert abs(mem.footprint / GiB - hbm) < 0.05, key
        assert abs(est.seconds - seconds) < 0.005, key
    m8, m16 = default_effort[8, 1][0], default_effort[16, 1][0]
    assert abs((m16.footprint - m8.footprint) / 8 / 2**20 - 128) < 1  # "128 MiB each"
