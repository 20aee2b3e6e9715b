"""The notebooks pass on a TPU host's device order, and where libtpu cannot be installed.

**Device order.** On a TPU v5e-8 or v6e-8 host ``jax.make_mesh`` lays the chips out as a ring,
``[0, 1, 2, 3, 7, 6, 5, 4]`` for every mesh shape, where the CPU keeps id order.
``tests/tpu_device_order/sitecustomize.py`` gives the 8 simulated CPU devices that order (in the process it
starts in and in every process, notebook kernel included, started with the same environment). An expectation
that types device ids instead of reading them off the mesh fails under it. The exercise checkers meet the same
order in ``tests/test_exercises.py`` (``test_checkers_follow_the_mesh_not_the_device_ids``).

**Without libtpu.** libtpu has wheels for Linux only. ``tests/no_libtpu/sitecustomize.py`` hides it from the
kernel (and from what the kernel starts), so a notebook takes the path a learner on macOS takes: every
notebook that asks ``tpu_compiler_available()`` runs top to bottom, prints the one-line reason, and shows no
traceback and nothing from libtpu.

**One pass for both** (``make test-slow``): each notebook runs once with both hooks
(``tests/tpu_host_without_libtpu``). The hook permutes CPU devices only, and with libtpu hidden the TPU cells
skip, so the two checks do not mask each other: the TPU cells themselves run with libtpu in ``make test``.
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

from spmd_course.course import needs_torch_xla, notebooks

ROOT = Path(__file__).parent.parent
HOOK = Path(__file__).parent / "tpu_device_order"
HIDE = Path(__file__).parent / "no_libtpu"
BOTH = Path(__file__).parent / "tpu_host_without_libtpu"
V5E = [0, 1, 2, 3, 7, 6, 5, 4]  # jax.make_mesh on a TPU v5e-8 (and v6e-8) host, flat, whatever the shape
SHAPES = {(8,): ("a",), (4, 2): ("a", "b"), (2, 4): ("a", "b"), (2, 2, 2): ("a", "b", "c")}
WITH_MESHES = [p for p in notebooks() if "make_mesh(" in p.read_text() and not needs_torch_xla(p)]
WITH_TPU_CELLS = [p for p in notebooks() if "tpu_compiler_available()" in p.read_text()]
REASON = "no TPU compiler here: libtpu is not installed"
SET_BY_UTILS_TPU = ("ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_MIN_LOG_LEVEL")  # unset, as a fresh process starts


def _env(hooks: Path = HOOK, order: str = "v5e") -> dict[str, str]:
    """This process's environment with ``hooks`` first on PYTHONPATH (and libtpu's variables unset)."""
    path = os.pathsep.join([str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])])
    kept = {k: v for k, v in os.environ.items() if k not in SET_BY_UTILS_TPU}
    return {**kept, "PYTHONPATH": path, "SPMD_COURSE_DEVICE_ORDER": order}


def _run(code: str, env: dict[str, str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


def _mesh_orders(order: str) -> dict[str, list[int]]:
    """Flat device ids of jax.make_mesh (and create_device_mesh) per shape, in a process with the hook."""
    code = ("import json, jax; from spmd_course.utils.devices import setup_devices; "
            "from jax.experimental import mesh_utils; "
            "setup_devices(8, quiet=True); ids = lambda grid: [d.id for d in grid.flat]; "
            f"got = {{str(s): ids(jax.make_mesh(s, n).devices) for s, n in {SHAPES!r}.items()}}; "
            "got['create_device_mesh (4, 2)'] = ids(mesh_utils.create_device_mesh((4, 2))); "
            "got['(2, 2): 4 devices, left alone'] = ids(jax.make_mesh((2, 2), ('a', 'b')).devices); "
            "print(json.dumps(got))")
    return json.loads(_run(code, _env(order=order))[-1])


def test_the_hook_gives_every_8_device_mesh_the_v5e_order():
    got = _mesh_orders("v5e")
    assert got == {**{str(s): V5E for s in SHAPES}, "create_device_mesh (4, 2)": V5E,
                   "(2, 2): 4 devices, left alone": [0, 1, 2, 3]}
    assert _mesh_orders("v3")["(8,)"] == [0, 1, 2, 3, 6, 7, 4, 5]  # Kaggle's TPU v3-8


def test_the_v5e_order_is_what_libtpu_gives(tpu_devices):
    for shape, names in SHAPES.items():
        real = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=tpu_devices)
        assert [d.id for d in real.devices.flat] == V5E, shape


@pytest.mark.parametrize("hooks", [HIDE, BOTH], ids=["no_libtpu", "both"])
def test_the_hiding_works_and_the_reason_is_one_line(hooks):
    code = ("import importlib.util, jax; from spmd_course.utils.tpu import tpu_compiler_available; "
            "print(importlib.util.find_spec('libtpu')); print(tpu_compiler_available()[1]); "
            "print(jax.default_backend()); from spmd_course.utils.devices import setup_devices; "
            "setup_devices(8, quiet=True); "
            "print([d.id for d in jax.make_mesh((8,), ('a',)).devices.flat])")
    spec, reason, backend, order = _run(code, _env(hooks))[-4:]
    assert spec == "None" and reason.startswith(REASON) and backend == "cpu"
    assert order == str(V5E if hooks == BOTH else list(range(8)))  # both hooks in place, or only the hiding


def test_the_notebooks_with_meshes_and_tpu_cells_are_found():
    assert {"01", "02", "14"} <= {p.name[:2] for p in WITH_MESHES}
    assert {"04", "19"} <= {p.name[:2] for p in WITH_TPU_CELLS}


PASS = sorted(set(WITH_MESHES) | set(WITH_TPU_CELLS))


def _client(nb: nbformat.NotebookNode, path: Path):
    """The notebook client of the pass below: it only ever reads from the kernel's shell socket while it waits.

    nbclient's stand-in for an ``Output`` widget (notebook 02's explorer draws into one) sends a ``comm_msg``
    on the shell socket from inside the coroutine that reads IOPub, while another coroutine awaits the
    cell's reply on that socket (``socket.poll(timeout)``). The send can swallow ZMQ's edge-triggered
    wake-up of that poll; the reply then sits unread until the cell's timeout fires, when pyzmq's last
    ``poll(0)`` finds it and the cell "succeeds": 02's pass took 303-309 s in CI, with every assert green
    (jupyter/nbclient#312). Without the stand-in, the widget's output reaches the cell's own outputs,
    where the asserts below read it too. ``coalesce_streams`` joins a cell's stream messages, which the
    kernel splits where its flush timer falls (18's probe line once came back as two).
    """
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=300, startup_timeout=180,  # a kernel starts slowly on a loaded 2-core machine
                            coalesce_streams=True, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.widget_registry = {}  # no Output-widget stand-in: nothing but requests goes out on the shell socket
    return client


def test_the_notebook_client_sends_nothing_on_the_shell_socket_while_it_waits():
    client = _client(nbformat.v4.new_notebook(), ROOT / "notebooks" / "02_partitionspec.ipynb")
    opened = client.on_comm_open_jupyter_widget({"content": {"comm_id": "c", "data": {"state": {
        "_model_module": "@jupyter-widgets/output", "_model_name": "OutputModel", "outputs": [], "msg_id": ""}}}})
    assert opened is None, "an Output-widget stand-in would write comm messages on the shell socket"
    assert client.coalesce_streams and client.timeout == 300


@pytest.mark.slow
@pytest.mark.parametrize("path", PASS, ids=[p.name for p in PASS])
def test_notebook_passes_on_a_tpu_hosts_device_order_without_libtpu(path, monkeypatch):
    for name in SET_BY_UTILS_TPU:
        monkeypatch.delenv(name, raising=False)
    for name, value in _env(BOTH).items():
        monkeypatch.setenv(name, value)  # the kernel inherits this process's environment
    nb = nbformat.read(path, as_version=4)
    probe = "import jax\nprint('probe', [d.id for d in jax.make_mesh((8,), ('d',)).devices.flat])"
    nb.cells.append(nbformat.v4.new_code_cell(probe))  # proves the kernel ran with the v5e order
    _client(nb, path).execute()
    printed = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if o.get("output_type") == "stream"]
    assert printed[-1].strip() == f"probe {V5E}"
    reasons = [line for text in printed for line in text.splitlines() if REASON in line]
    if path in WITH_TPU_CELLS:
        assert reasons, "no cell said why the TPU side was skipped"
    assert all(line.startswith(REASON) for line in reasons)
    everything = "\n".join(printed)
    assert "Traceback" not in everything and "libtpu.so" not in everything and "TPU_ACCELERATOR_TYPE" not in everything
