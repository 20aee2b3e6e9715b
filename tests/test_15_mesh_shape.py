"""Notebook 15 ranks its five layouts by the estimated step of TPU programs it does not compile: the train step
at a real width (``TPU_WIDTH`` in the notebook), compiled for a ``v5e:8x8`` slice at the compiler's default
effort, the one a run gets. Each such compile takes about a minute of CPU or more, beyond the notebook's
budget, so the course stores the programs' text (``data/mesh_shape/<layout>.hlo.gz``).

The slow test compiles them again with the notebook's own code (``build``, ``LAYOUTS``, ``compile_for``, read
from its source at ``TPU_WIDTH``) and checks each stored program gives the same ``estimate_step`` and
collectives. ``MESH_SHAPE_UPDATE=1`` stores the new programs instead. The programs come from jax 0.12; on
another jax the libtpu differs, so the comparison is made on the line that stored them."""

import gzip
import importlib.metadata
import json
import os
import time
from pathlib import Path

import jax
import pytest

from course_support import from_notebook
from utils import collectives, estimate_step, quiet

STORED = Path(__file__).resolve().parent.parent / "data" / "mesh_shape"
INDEX = STORED / "index.json"
SIZE_NAMES = ("D_MODEL", "NUM_LAYERS", "NUM_HEADS", "D_FF", "VOCAB", "SEQ", "BATCH")


def _figures(program, mesh):
    step = estimate_step(program, mesh)
    return dict(seconds=step.seconds, exposed=step.comm_exposed, flops=step.flops, counts=collectives(program).counts)


def _stored(name):
    return gzip.decompress((STORED / f"{name.replace(' ', '_')}.hlo.gz").read_bytes()).decode()


def test_every_layout_is_stored_with_its_width_and_effort():
    width = from_notebook("15", "TPU_WIDTH").TPU_WIDTH
    layouts = from_notebook("15", "TWO_D", "FSDP_TP", "LAYOUTS").LAYOUTS
    index = json.loads(INDEX.read_text())
    assert set(index) == set(layouts)
    for name, entry in index.items():
        assert entry["width"] == width and entry["compiler_effort"] == "default" and entry["topology"] == "v5e:8x8"
        assert "num_partitions=64" in _stored(name)


@pytest.mark.slow
def test_the_stored_programs_are_what_the_notebooks_code_compiles(tpu_pod):
    from notebooks.models import MyTransformer

    width = from_notebook("15", "TPU_WIDTH").TPU_WIDTH
    nb = from_notebook("15", "build", "graphdef", "TWO_D", "FSDP_TP", "LAYOUTS", "FAST_COMPILE", "make_step",
                       "compile_for", given={"MyTransformer": MyTransformer, **width})
    update = os.environ.get("MESH_SHAPE_UPDATE")
    index = {} if update else json.loads(INDEX.read_text())
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
        elif jax.__version__ != index[name]["jax"]:
            pytest.skip(f"the stored programs come from jax {index[name]['jax']}; this is jax {jax.__version__}")
        assert _figures(_stored(name), mesh) == _figures(compiled, mesh), name
