"""Notebook 17 ranks its five layouts by the estimated step of TPU programs it does not compile: the train step
at a real width (``TPU_WIDTH`` in the notebook), compiled for a ``v5e:8x8`` slice at the compiler's default
effort, the one a run gets. Each such compile takes about a minute of CPU or more, beyond the notebook's
budget, so the course stores the programs' text (``data/mesh_shape/<layout>.hlo.gz``).

The slow test compiles them again with the notebook's own code (``build``, ``LAYOUTS``, ``compile_for``, read
from its source at ``TPU_WIDTH``) and checks each stored program gives the same ``estimate_step`` and
collectives. ``MESH_SHAPE_UPDATE=1`` stores the new programs instead. The programs come from jax 0.12; on
another jax the libtpu differs, so the comparison is made on the line that stored them.

Section 5 reads one more stored program, the FSDP x TP step at the notebook's own toy width for the same
slice (``toy_FSDP_x_TP.hlo.gz``, its memory figures in ``toy_FSDP_x_TP.json``): about 4 s of CPU to compile,
which the notebook's budget cannot spare. Its slow test compiles the five layouts at that width and checks the
stored program and memory against the fresh FSDP x TP one, and, on every line, the TPU's order of HBM per
chip that section 3 reads from the CPU compiler (data parallelism needs the most, FSDP less than 1/8 of it)."""

import gzip
import importlib.metadata
import json
import os
import time
from pathlib import Path

import jax
import pytest

from course_support import from_notebook
from spmd_course.utils import collectives, estimate_step, memory_per_device, quiet

STORED = Path(__file__).resolve().parent.parent / "data" / "mesh_shape"
INDEX = STORED / "index.json"
SIZE_NAMES = ("D_MODEL", "NUM_LAYERS", "NUM_HEADS", "D_FF", "VOCAB", "SEQ", "BATCH")
TOY, TOY_PROGRAM = STORED / "toy_FSDP_x_TP.json", STORED / "toy_FSDP_x_TP.hlo.gz"


def _figures(program, mesh):
    step = estimate_step(program, mesh)
    return dict(seconds=step.seconds, exposed=step.comm_exposed, flops=step.flops, counts=collectives(program).counts)


def _stored(name):
    return gzip.decompress((STORED / f"{name.replace(' ', '_')}.hlo.gz").read_bytes()).decode()


def test_every_layout_is_stored_with_its_width_and_effort():
    width = from_notebook("17", "TPU_WIDTH").TPU_WIDTH
    layouts = from_notebook("17", "TWO_D", "FSDP_TP", "LAYOUTS").LAYOUTS
    index = json.loads(INDEX.read_text())
    assert set(index) == set(layouts)
    for name, entry in index.items():
        assert entry["width"] == width and entry["compiler_effort"] == "default" and entry["topology"] == "v5e:8x8"
        assert "num_partitions=64" in _stored(name)


@pytest.mark.slow
def test_the_stored_programs_are_what_the_notebooks_code_compiles(tpu_pod):
    from spmd_course.models import MyTransformer

    width = from_notebook("17", "TPU_WIDTH").TPU_WIDTH
    nb = from_notebook("17", "build", "graphdef", "TWO_D", "FSDP_TP", "LAYOUTS", "FAST_COMPILE", "make_step",
                       "compile_for", given={"MyTransformer": MyTransformer, **width})
    update = os.environ.get("MESH_SHAPE_UPDATE")
    index = {} if update else json.loads(INDEX.read_text())
    if not update and {entry["jax"] for entry in index.values()} != {jax.__version__}:  # before minutes of compiles
        pytest.skip(f"the stored programs come from jax {sorted({e['jax'] for e in index.values()})}; "
                    f"this is jax {jax.__version__}")
    for name, (shape, rules) in nb.LAYOUTS.items():
        start = time.process_time()
        with quiet():
            compiled, _ = nb.compile_for(shape, rules, devices=tpu_pod)
        seconds = time.process_time() - start
        mesh = jax.make_mesh(shape, ("data", "model"), devices=tpu_pod)
        if update:
            STORED.mkdir(parents=True, exist_ok=True)
            with (open(STORED / f"{name.replace(' ', '_')}.hlo.gz", "wb") as raw,
                  gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f):
                f.write(compiled.as_text().encode())
            index[name] = dict(width=width, topology="v5e:8x8", compiler_effort="default",
                               compile_cpu_seconds=round(seconds), jax=jax.__version__,
                               libtpu=importlib.metadata.version("libtpu"))
            INDEX.write_text(json.dumps(index, indent=1) + "\n")
        assert _figures(_stored(name), mesh) == _figures(compiled, mesh), name


def _toy_figures(program, matrix_gathers):
    sent = collectives(program)
    return dict(counts=sent.counts, sent=sent.estimated_bytes, gathered=matrix_gathers(sent),
                groups=sorted((op.kind, op.group_size, op.shapes) for op in sent.ops))


def test_section_5s_program_is_stored_at_the_notebooks_width_and_effort():
    nb = from_notebook("17", "D_MODEL")
    toy = json.loads(TOY.read_text())
    assert toy["width"] == {name: getattr(nb, name) for name in SIZE_NAMES}
    assert toy["compiler_effort"] == "default" and toy["topology"] == "v5e:8x8"
    assert set(toy["memory"]) == {"argument", "footprint"}
    assert "num_partitions=64" in gzip.decompress(TOY_PROGRAM.read_bytes()).decode()


@pytest.mark.slow
def test_the_five_layouts_at_the_notebooks_width_on_tpu_and_section_5s_stored_program(tpu_pod):
    """One compile of each layout at the notebook's toy width (default effort, as section 5): the TPU's HBM
    order, on every line, and section 5's stored FSDP x TP program and memory, on the line that stored them."""
    from spmd_course.models import MyTransformer

    nb = from_notebook("17", "D_MODEL", "build", "graphdef", "TWO_D", "FSDP_TP", "LAYOUTS", "FAST_COMPILE",
                       "make_step", "compile_for", "state_bytes", "matrix_gathers",
                       given={"MyTransformer": MyTransformer})
    hbm, state = {}, {}
    for name, (shape, rules) in nb.LAYOUTS.items():
        start = time.process_time()
        with quiet():
            program, structs = nb.compile_for(shape, rules, devices=tpu_pod)
        seconds = time.process_time() - start
        memory = memory_per_device(program)
        hbm[name], state[name] = memory.footprint, nb.state_bytes(structs)
        if name == "FSDP x TP":
            toy_memory = dict(argument=memory.argument, footprint=memory.footprint)
            toy_figures = _toy_figures(program, nb.matrix_gathers)
            if os.environ.get("MESH_SHAPE_UPDATE"):
                with open(TOY_PROGRAM, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
                    f.write(program.as_text().encode())
                TOY.write_text(json.dumps(dict(
                    width={n: getattr(nb, n) for n in SIZE_NAMES}, topology="v5e:8x8", compiler_effort="default",
                    memory=toy_memory, compile_cpu_seconds=round(seconds), jax=jax.__version__,
                    libtpu=importlib.metadata.version("libtpu")), indent=1) + "\n")
        del program
    # section 3's order, in TPU HBM at this toy size (between the model-parallel layouts it says little: much
    # of them sits in VMEM; test_tpu_side compiles those at a real width)
    assert max(hbm, key=hbm.get) == "data" and min(state, key=state.get) == "FSDP"
    assert 8 * hbm["FSDP"] < hbm["data"]
    toy = json.loads(TOY.read_text())
    if jax.__version__ != toy["jax"]:
        pytest.skip(f"section 5's program comes from jax {toy['jax']}; this is jax {jax.__version__}")
    stored = gzip.decompress(TOY_PROGRAM.read_bytes()).decode()
    assert (toy["memory"], _toy_figures(stored, nb.matrix_gathers)) == (toy_memory, toy_figures)
