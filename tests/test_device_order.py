"""The notebooks and exercise checkers pass when ``jax.make_mesh`` orders devices as an 8-chip TPU host does.

On a TPU v5e-8 or v6e-8 host ``jax.make_mesh`` lays the chips out as a ring, ``[0, 1, 2, 3, 7, 6, 5, 4]``
for every mesh shape, where the CPU keeps id order. ``tests/tpu_device_order/sitecustomize.py`` gives the
8 simulated CPU devices that order (in the process it starts in and in every process, notebook kernel
included, started with the same environment). Every notebook then runs top to bottom under it and must
pass: an expectation that types device ids instead of reading them off the mesh fails here. The exercise
checkers meet the same order in ``tests/test_exercises.py`` (``test_checkers_follow_the_mesh_not_the_device_ids``).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import nbformat
import pytest
from jax.sharding import AxisType

from tools.course import needs_torch_xla, notebooks

ROOT = Path(__file__).parent.parent
HOOK = Path(__file__).parent / "tpu_device_order"
V5E = [0, 1, 2, 3, 7, 6, 5, 4]  # jax.make_mesh on a TPU v5e-8 (and v6e-8) host, flat, whatever the shape
SHAPES = {(8,): ("a",), (4, 2): ("a", "b"), (2, 4): ("a", "b"), (2, 2, 2): ("a", "b", "c")}
WITH_MESHES = [p for p in notebooks() if "make_mesh(" in p.read_text() and not needs_torch_xla(p)]



def _env(order: str = "v5e") -> dict[str, str]:
    path = os.pathsep.join([str(HOOK), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "SPMD_COURSE_DEVICE_ORDER": order}


def _mesh_orders(order: str) -> dict[str, list[int]]:
    """Flat device ids of jax.make_mesh (and create_device_mesh) per shape, in a process with the hook."""
    code = ("import json, jax; from utils.devices import setup_devices; from jax.experimental import mesh_utils; "
            "setup_devices(8, quiet=True); ids = lambda grid: [d.id for d in grid.flat]; "
            f"got = {{str(s): ids(jax.make_mesh(s, n).devices) for s, n in {SHAPES!r}.items()}}; "
            "got['create_device_mesh (4, 2)'] = ids(mesh_utils.create_device_mesh((4, 2))); "
            "got['(2, 2): 4 devices, left alone'] = ids(jax.make_mesh((2, 2), ('a', 'b')).devices); "
            "print(json.dumps(got))")
    out = subprocess.run([sys.executable, "-c", code], env=_env(order), capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_the_hook_gives_every_8_device_mesh_the_v5e_order():
    got = _mesh_orders("v5e")
    assert got == {**{str(s): V5E for s in SHAPES}, "create_device_mesh (4, 2)": V5E,
                   "(2, 2): 4 devices, left alone": [0, 1, 2, 3]}
    assert _mesh_orders("v3")["(8,)"] == [0, 1, 2, 3, 6, 7, 4, 5]  # Kaggle's TPU v3-8


def test_the_v5e_order_is_what_libtpu_gives(tpu_devices):
    for shape, names in SHAPES.items():
        real = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=tpu_devices)
        assert [d.id for d in real.devices.flat] == V5E, shape


def test_the_notebooks_with_meshes_are_found():
    assert {"01", "02", "16"} <= {p.name[:2] for p in WITH_MESHES}


@pytest.mark.slow
@pytest.mark.parametrize("path", WITH_MESHES, ids=[p.name for p in WITH_MESHES])
def test_notebook_passes_with_the_v5e_device_order(path, monkeypatch):
    from nbclient import NotebookClient

    for name, value in _env().items():
        monkeypatch.setenv(name, value)  # the kernel inherits this process's environment
    nb = nbformat.read(path, as_version=4)
    probe = "import jax\nprint('probe', [d.id for d in jax.make_mesh((8,), ('d',)).devices.flat])"
    nb.cells.append(nbformat.v4.new_code_cell(probe))  # proves the kernel ran with the v5e order
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    printed = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    assert printed.strip() == f"probe {V5E}"
