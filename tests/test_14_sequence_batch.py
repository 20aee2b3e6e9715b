"""Notebook 14, section 2, reads the HBM per chip of three train steps it does not compile: its MLP made
``2048 -> 16384 -> 2048`` (``WIDE``) on 32,768 examples (``N_WIDE``), compiled for a TPU v5e-8 at the compiler's
default effort, the one a run gets (at O0 or O1 the gradient sum stays in the loop, and the lesson with it).
Each compile takes about 8 s of CPU, beyond the notebook's budget, so the course stores the three figures
(``data/sequence_batch/tpu_hbm.json``); the notebook asserts its lessons on them, and compiles the toy steps
for the TPU live to show where the collectives sit.

The slow test compiles the three steps again with the notebook's own code (``MLP``, ``make_steps``, the two
splits and ``on_tpu``, read from its source) and checks, on every jax line, what the notebook asserts on the
stored figures (strided needs less HBM than the whole batch by more than a quarter of the hidden activation;
consecutive needs more) and that the wide strided step sums its gradients after the loop, as the toy one does.
On the line that stored the figures (jax 0.12: its libtpu assigns the buffers) it also checks they are the
same to the byte. ``SEQUENCE_BATCH_UPDATE=1`` stores the new figures instead. HBM is the compiler's own
memory-usage report (space ``default``), which is ``memory_per_device(...).footprint`` on jax 0.12 (checked
here) and is not on jax 0.10, whose ``footprint`` is an estimate."""

import importlib.metadata
import json
import os
import re
import tempfile
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from course_support import from_notebook
from spmd_course.utils import collectives, memory_per_device

STORED = Path(__file__).resolve().parent.parent / "data" / "sequence_batch" / "tpu_hbm.json"
STEPS = ("whole batch", "strided", "consecutive")


def test_the_stored_figures_are_for_the_notebooks_sizes_and_effort():
    nb = from_notebook("14", "WIDE")
    entry = json.loads(STORED.read_text())
    assert (tuple(entry["mlp"]), entry["examples"]) == (nb.WIDE, nb.N_WIDE)
    assert entry["compiler_effort"] == "default" and entry["topology"] == "v5e:2x4"
    assert tuple(entry["hbm"]) == STEPS and all(isinstance(b, int) and b > 0 for b in entry["hbm"].values())


def _hbm(folder):
    """The compiler's device-memory total (HBM on a TPU) from the memory-usage report it wrote into folder."""
    (report,) = Path(folder).glob("*memory-usage-report.txt")
    return int(re.search(r"^Memory Space: default \(color=\d+\)\s*\nTotal bytes: (\d+)", report.read_text(),
                         re.MULTILINE).group(1))


@pytest.mark.slow
def test_the_stored_hbm_is_what_the_notebooks_steps_compile_to(tpu_devices):
    nb = from_notebook("14", "MLP", "cross_entropy", "N", "tx", "make_steps", "consecutive", "strided", "on_tpu",
                       "donated", "WIDE", given={"topology": SimpleNamespace(devices=list(tpu_devices))})
    graphdef, params = nnx.split(nnx.eval_shape(lambda: nb.MLP(nnx.Rngs(0), nb.WIDE)))
    big_step, accumulating_step = nb.make_steps(graphdef)
    args = (params, jax.eval_shape(nb.tx.init, params), jax.ShapeDtypeStruct((nb.N_WIDE, nb.WIDE[0]), jnp.float32),
            jax.ShapeDtypeStruct((nb.N_WIDE,), jnp.int32))
    specs = (*jax.tree.map(lambda _: P(), args[:2]), P("data"), P("data"))  # the notebook's wide_specs
    steps = {"whole batch": big_step, "strided": partial(accumulating_step, split=nb.strided),
             "consecutive": partial(accumulating_step, split=nb.consecutive)}
    hbm, start = {}, time.process_time()
    for name, step in steps.items():
        with tempfile.TemporaryDirectory(prefix="memory-report-") as folder:
            program = nb.on_tpu(lambda m, f=step: f, "data", args, specs, **nb.donated,
                                compiler_options={"xla_dump_to": folder})
            hbm[name] = _hbm(folder)
        if jax.__version_info__ >= (0, 12):
            assert memory_per_device(program).footprint == hbm[name], name  # what the notebook stored
        if name == "strided":
            ops = collectives(program).ops
            grads = [op for op in ops if op.result_bytes > 4]
            assert grads and all((op.kind, op.in_loop) == ("all-reduce", False) for op in grads)  # after the loop
            assert all(op.result_bytes <= 4 for op in ops if op.in_loop)  # per micro-batch: only the loss
        del program
    hidden = nb.N_WIDE // 8 * nb.WIDE[1] * 4  # the notebook's `hidden`
    assert hbm["strided"] < hbm["whole batch"] - hidden // 4  # the notebook's asserts, on a fresh compile
    assert hbm["consecutive"] > hbm["whole batch"] > hidden
    if os.environ.get("SEQUENCE_BATCH_UPDATE"):
        STORED.parent.mkdir(parents=True, exist_ok=True)
        STORED.write_text(json.dumps(dict(
            mlp=list(nb.WIDE), examples=nb.N_WIDE, topology="v5e:2x4", compiler_effort="default", hbm=hbm,
            compile_cpu_seconds=round(time.process_time() - start), jax=jax.__version__,
            libtpu=importlib.metadata.version("libtpu")), indent=1) + "\n")
    entry = json.loads(STORED.read_text())
    if jax.__version__ != entry["jax"]:
        pytest.skip(f"the stored figures come from jax {entry['jax']}, whose libtpu assigns the buffers; this is "
                    f"jax {jax.__version__} (the lessons above were checked on its own compile)")
    assert entry["hbm"] == hbm
