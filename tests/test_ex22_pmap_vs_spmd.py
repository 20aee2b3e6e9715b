"""Valid answers to notebook 22's exercises that a checker once rejected: each must stay accepted."""

import pytest
from jax.sharding import PartitionSpec as P

from spmd_course.exercises import ex22_pmap_vs_spmd as ex
from spmd_course.utils.exercises import Verdict


@pytest.mark.parametrize(
    "w_spec,batch_spec",
    [
        (P(), P("data", None)),  # was rejected: the checker placed the 1-D labels with this 2-D spec too
        (P(), P(("data",))),
        (P(None), P("data")),  # P(None) on a vector replicates it, like P()
    ],
    ids=["P('data', None)", "P(('data',))", "w P(None)"],
)
def test_ex22_migrate_to_jit_accepts_every_data_parallel_layout(w_spec, batch_spec):
    step = ex.migrate_to_jit.solution[0]
    outcome = ex.migrate_to_jit.outcome((step, w_spec, batch_spec))
    assert outcome.verdict is Verdict.CORRECT, outcome.error
