"""tpu_compiler_available(): whether TPU programs compile here, and why not in one line."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from jax.experimental import topologies

import utils.tpu
from utils.tpu import tpu_compiler_available

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


@pytest.fixture
def fresh_answer():
    """tpu_compiler_available() caches its answer: clear it around a test that fakes the machine."""
    tpu_compiler_available.cache_clear()
    yield
    tpu_compiler_available.cache_clear()


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed here")
def test_available_where_libtpu_is_installed():
    ok, why = tpu_compiler_available()
    assert ok and why.startswith("libtpu 0.0.") and "\n" not in why
    assert os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"  # set before libtpu loaded: no lock taken
    assert os.environ["TPU_LOG_DIR"] == "disabled"  # and no log files in /tmp/tpu_logs


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed here")
def test_a_process_that_asks_first_leaves_no_libtpu_log_files(tmp_path):
    # libtpu names its log files in /tmp/tpu_logs (a fixed folder) after the process: ...log.INFO.<date>.<pid>.
    # Process ids are reused, so only files that appear while this process runs count.
    logs = Path("/tmp/tpu_logs")
    before = set(logs.glob("tpu_driver.*"))
    code = ("import os; from utils.tpu import tpu_compiler_available; print(os.getpid()); "
            "print(tpu_compiler_available()[0]); print(os.environ['TPU_LOG_DIR'])")
    env = {k: v for k, v in os.environ.items() if k not in ("TPU_LOG_DIR", "ALLOW_MULTIPLE_LIBTPU_LOAD")}
    env["PYTHONPATH"] = str(Path(utils.tpu.__file__).resolve().parent.parent)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    pid, ok, log_dir = out.stdout.split()
    assert (ok, log_dir) == ("True", "disabled"), out.stderr[-2000:]
    assert not set(logs.glob(f"tpu_driver.*.{pid}")) - before


def test_reason_when_libtpu_is_missing(fresh_answer, monkeypatch):
    monkeypatch.setattr(utils.tpu.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(utils.tpu.sys, "platform", "linux")
    assert tpu_compiler_available() == (False, "no TPU compiler here: libtpu is not installed (pip install "
                                               "'jax[tpu]' installs the libtpu that matches this jax)")


def test_reason_on_macos(fresh_answer, monkeypatch):
    monkeypatch.setattr(utils.tpu.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(utils.tpu.sys, "platform", "darwin")
    assert tpu_compiler_available() == (
        False, "no TPU compiler here: libtpu is published for Linux only, and this is macOS")


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed here")
def test_reason_when_the_topology_cannot_be_described(fresh_answer, monkeypatch):
    def locked(**kwargs):
        raise RuntimeError('ABORTED: Internal error when accessing libtpu multi-process lockfile. Run "$ sudo '
                           'rm /tmp/libtpu_lockfile".\nsecond line')

    monkeypatch.setattr(topologies, "get_topology_desc", locked)
    ok, why = tpu_compiler_available()
    assert not ok and "\n" not in why and "second line" not in why
    assert "cannot describe a TPU topology here: ABORTED" in why and "ALLOW_MULTIPLE_LIBTPU_LOAD=1" in why


SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from jax.experimental import topologies
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
    from utils.capture import quiet
    from utils.inspecting import collectives

    def compile_for_topology():
        topo = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")
        mesh = Mesh(np.array(topo.devices).reshape(4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
        x = jax.ShapeDtypeStruct((512, 1024), np.float32, sharding=NamedSharding(mesh, P("data", "model")))
        w = jax.ShapeDtypeStruct((1024, 1024), np.float32, sharding=NamedSharding(mesh, P("model", None)))
        return jax.jit(lambda a, b: a @ b).lower(x, w).compile()

    with quiet() as out:
        compiled = compile_for_topology()
    print(json.dumps({"caught": out.text, "counts": collectives(compiled).counts}))
""")


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed here")
def test_compiling_for_a_topology_under_quiet_leaves_no_libtpu_warnings():
    """In a fresh process, where libtpu prints its start-up warnings (once per process)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1", PYTHONPATH=os.getcwd())
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    assert run.stderr == ""
    (line,) = run.stdout.splitlines()  # the one line the script printed itself, nothing else
    result = json.loads(line)
    assert "TPU_ACCELERATOR_TYPE" in result["caught"]  # the warnings were there, and caught
    assert result["counts"]["all-reduce"] == 1
