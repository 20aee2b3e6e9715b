"""Notebook 15 reads one program it does not compile: FSDP's block step at the compiler's default effort on a
v5e-8 (``data/step_time/fsdp_block_v5e-2x4.hlo.gz``), whose schedule, timeline and roofline its section 3 draws.
That compile takes 10-15 s of CPU, beyond the notebook's budget, so the course stores the program's text
(``compiled.as_text()``). The notebook compiles the same block at O0 itself; the O0 and default programs have
the same FLOPs, collectives and bytes (checked here), only their schedules differ.

The slow test compiles the block again at the default effort with the notebook's own code (read from its
source, not copied) and checks that the stored program is that program: the same collectives and the same
``estimate_step`` figures. ``STEP_TIME_UPDATE=1`` rewrites the stored program instead. The stored program
comes from jax 0.12; on jax 0.10.2 (Python 3.11) libtpu schedules differently, so the comparison is made
on the line that stored it."""

import gzip
import importlib.metadata
import json
import os
import time
from pathlib import Path

import jax
import pytest

from course_support import from_notebook
from spmd_course.exercises.ex15_step_time import loop_permutes
from spmd_course.utils import collectives, estimate_step, schedule

STORED = Path(__file__).resolve().parent.parent / "data" / "step_time"
PROGRAM = STORED / "fsdp_block_v5e-2x4.hlo.gz"
INDEX = STORED / "index.json"


def _notebook():
    return from_notebook("15", "BATCH", "ff_block", "block_step", "specs", "STRATEGIES", "compile_block")


def _figures(program, mesh):
    step = estimate_step(program, mesh, use_cycles=False)
    sent = collectives(program)
    return dict(seconds=step.seconds, hidden=step.comm_hidden, exposed=step.comm_exposed, flops=step.flops,
                hbm=step.hbm_bytes, counts=sent.counts, sent=sent.estimated_bytes)


def test_the_stored_program_is_a_default_effort_tpu_program_with_overlapped_transfers():
    text = gzip.decompress(PROGRAM.read_bytes()).decode()
    entry = json.loads(INDEX.read_text())["fsdp_block_v5e-2x4"]
    assert entry["compiler_effort"] == "default" and entry["topology"] == "v5e:2x4"
    assert "num_partitions=8" in text and ":T(" in text  # eight partitions, TPU tiled layouts
    sent = collectives(text)
    assert sent.count("all-gather") == 3 and sent.count("collective-permute") == 27
    permutes = [op for op in sent.ops if op.kind == "collective-permute"]
    assert sum(op.trips for op in permutes) == loop_permutes.solution > len(permutes)  # exercise 3's answer
    steps = schedule(text, {"data": 8})
    assert all(s.overlaps > 0 for s in steps if s.kind == "collective-permute")  # the default effort's schedule


@pytest.mark.slow
def test_the_stored_program_is_what_the_notebooks_code_compiles(tpu_devices):
    nb = _notebook()
    start = time.process_time()
    compiled, mesh = nb.compile_block(list(tpu_devices), *nb.STRATEGIES["FSDP"], effort=None)
    seconds = time.process_time() - start
    if os.environ.get("STEP_TIME_UPDATE"):
        STORED.mkdir(parents=True, exist_ok=True)
        with open(PROGRAM, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(compiled.as_text().encode())
        INDEX.write_text(json.dumps({"fsdp_block_v5e-2x4": dict(
            topology="v5e:2x4", compiler_effort="default", compile_cpu_seconds=round(seconds),
            jax=jax.__version__, libtpu=importlib.metadata.version("libtpu"))}, indent=1) + "\n")
    entry = json.loads(INDEX.read_text())["fsdp_block_v5e-2x4"]
    if jax.__version__ != entry["jax"]:
        pytest.skip(f"the stored program comes from jax {entry['jax']}, whose libtpu schedules it; this is "
                    f"jax {jax.__version__}")
    stored = gzip.decompress(PROGRAM.read_bytes()).decode()
    assert _figures(stored, mesh) == _figures(compiled, mesh)


@pytest.mark.slow
def test_o0_and_the_default_effort_count_the_same_work(tpu_devices):
    """Section 2 compiles FSDP at O0 and section 3 reads the default-effort program: what they count is equal."""
    nb = _notebook()
    low, mesh = nb.compile_block(list(tpu_devices), *nb.STRATEGIES["FSDP"])
    stored = gzip.decompress(PROGRAM.read_bytes()).decode()
    a, b = _figures(low, mesh), _figures(stored, mesh)
    assert (a["flops"], a["counts"], a["sent"]) == (b["flops"], b["counts"], b["sent"])
    assert a["hidden"] < 1e-9 < b["hidden"]  # O0 runs every transfer synchronously; the default overlaps them
