"""Where libtpu cannot be installed, the notebooks with TPU cells still pass and say so in one line.

libtpu has wheels for Linux only. ``tests/no_libtpu/sitecustomize.py`` hides it from the kernel (and
from what the kernel starts), so these runs take the path a learner on macOS takes: every notebook that
asks ``tpu_compiler_available()`` executes top to bottom, prints the one-line reason, and shows no
traceback and nothing from libtpu.
"""

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools.course import notebooks

HIDE = Path(__file__).parent / "no_libtpu"
REASON = "no TPU compiler here: libtpu is not installed"
WITH_TPU_CELLS = [p for p in notebooks() if "tpu_compiler_available()" in p.read_text()]
SET_BY_UTILS_TPU = ("ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_MIN_LOG_LEVEL")  # unset, as a fresh process starts


def _hiding_pythonpath() -> str:
    return os.pathsep.join([str(HIDE), *filter(None, [os.environ.get("PYTHONPATH")])])


def test_the_hiding_works_and_the_reason_is_one_line():
    code = ("import importlib.util, jax; from utils.tpu import tpu_compiler_available; "
            "print(importlib.util.find_spec('libtpu')); print(tpu_compiler_available()[1]); "
            "print(jax.default_backend())")
    env = {k: v for k, v in os.environ.items() if k not in SET_BY_UTILS_TPU} | {"PYTHONPATH": _hiding_pythonpath()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    spec, reason, backend = out.stdout.splitlines()
    assert spec == "None" and reason.startswith(REASON) and backend == "cpu"


def test_some_notebooks_have_tpu_cells():
    names = {p.name[:2] for p in WITH_TPU_CELLS}
    assert {"04", "15"} <= names, names


@pytest.mark.slow
@pytest.mark.parametrize("path", WITH_TPU_CELLS, ids=[p.name for p in WITH_TPU_CELLS])
def test_notebook_passes_without_libtpu(path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("PYTHONPATH", _hiding_pythonpath())  # the kernel inherits this process's environment
    for name in SET_BY_UTILS_TPU:
        monkeypatch.delenv(name, raising=False)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    printed = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if o.get("output_type") == "stream"]
    reasons = [line for text in printed for line in text.splitlines() if REASON in line]
    assert reasons, "no cell said why the TPU side was skipped"
    assert all(line.startswith(REASON) for line in reasons)
    everything = "\n".join(printed)
    assert "Traceback" not in everything and "libtpu.so" not in everything and "TPU_ACCELERATOR_TYPE" not in everything
