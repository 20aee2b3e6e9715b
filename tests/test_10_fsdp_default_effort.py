"""Notebook 10's wide TPU programs at the compiler's default effort.

The notebook compiles its wide FSDP and data-parallel steps for a TPU v5e at the least effort, O0, to stay
within its time budget, and states in a table what the default effort gives: the effort ``jax.jit`` uses when
a learner runs a step. This test compiles the notebook's own ``compile_wide`` (read from its source) at the
default effort and checks each statement of that table and the prose around it. About 40 s of compiling:
marked slow (``make test-slow``)."""

from __future__ import annotations

import pytest

from spmd_course.utils.tpu import tpu_compiler_available

TPU_OK, TPU_WHY = tpu_compiler_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not TPU_OK, reason=TPU_WHY)]

MiB = 2**20


@pytest.fixture(scope="module")
def default_effort():
    from jax.experimental import topologies

    from course_support import from_notebook
    from spmd_course.utils import memory_per_device, quiet

    nb = from_notebook("10", "mesh", "path_name", "fsdp_rule", "WideMLP", "create_wide", "WIDE_PARAM_BYTES",
                       "compile_wide")
    with quiet():
        chips = list(topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices)
        memory = {(strategy, n): memory_per_device(nb.compile_wide(strategy, chips[:n], effort=None))
                  for strategy, n in (("FSDP", 2), ("FSDP", 8), ("data parallel", 8))}
    return nb, memory


def test_the_default_effort_keeps_the_notebooks_comparisons(default_effort):
    nb, memory = default_effort
    fsdp, dp = memory["FSDP", 8], memory["data parallel", 8]
    assert 6 * fsdp.alias < dp.alias  # FSDP stores about an eighth
    assert fsdp.temp > nb.WIDE_PARAM_BYTES and fsdp.temp > dp.temp  # larger temporaries than the model and DP
    assert fsdp.footprint < dp.footprint  # less HBM in all


def test_the_default_effort_figures_in_the_notebooks_table(default_effort):
    _, memory = default_effort
    if any(mem.allocated is None for mem in memory.values()):  # jax 0.10.2: footprint is the estimated sum
        pytest.skip("the table holds the figures of jax 0.12 with libtpu 0.0.50.1, which reports the HBM allocated")
    table = {  # (state, temporaries, HBM) in MiB, as notebook 10's table prints them
        ("FSDP", 2): (384.1, 1.3 * 1024, 1.5 * 1024),
        ("FSDP", 8): (96.0, 723.8, 634.0),
        ("data parallel", 8): (768.2, 256.9, 1.0 * 1024),
    }
    for key, (state, temp, hbm) in table.items():
        mem = memory[key]
        assert abs(mem.alias / MiB - state) < 0.1, key
        tolerance = 0.1 if temp < 1000 else 0.05 * 1024  # the GiB figures are printed to one decimal
        assert abs(mem.temp / MiB - temp) < tolerance, key
        assert abs(mem.footprint / MiB - hbm) < (0.1 if hbm < 1000 else 0.05 * 1024), key


def test_the_default_effort_temporaries_shrink_with_the_chips_but_slower_than_the_state(default_effort):
    _, memory = default_effort
    two, eight = memory["FSDP", 2], memory["FSDP", 8]
    assert 3.9 < two.alias / eight.alias < 4.1
    assert 1 < two.temp / eight.temp < 2
