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

import spmd_course.utils.tpu
from spmd_course.utils.tpu import tpu_compiler_available

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
SET_HERE = ("ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_MIN_LOG_LEVEL", "TPU_LOG_DIR")  # a fresh process starts without them


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
    assert os.environ["TPU_MIN_LOG_LEVEL"] == "3"  # and no log files


COMPILE_AFTER_ASKING = textwrap.dedent("""
    import os
    import jax, numpy as np
    from jax.experimental import topologies
    from spmd_course.utils.capture import quiet
    from spmd_course.utils.tpu import tpu_compiler_available

    ok = tpu_compiler_available()[0]
    with quiet():
        chip = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices[0]
        struct = jax.ShapeDtypeStruct((8, 128), np.float32, sharding=jax.sharding.SingleDeviceSharding(chip))
        jax.jit(lambda a: a * 2).lower(struct).compile()
    print(os.getpid(), ok, os.environ["TPU_MIN_LOG_LEVEL"])
""")


def _libtpu_logs() -> set[str]:
    """Every libtpu log file under /tmp: ``tpu_driver.<host>.<user>.log.<LEVEL>.<date>.<pid>``, in any folder."""
    return {os.path.join(folder, name) for folder, _, names in os.walk("/tmp") for name in names
            if name.startswith("tpu_driver")}


def _new_logs_of_a_fresh_compile(cwd: Path, **env_vars: str) -> tuple[set[str], str, str]:
    """Run COMPILE_AFTER_ASKING in a fresh process; the log files that appeared meanwhile with its process id."""
    env = {k: v for k, v in os.environ.items() if k not in SET_HERE} | env_vars
    before = _libtpu_logs()  # process ids are reused: a file an older process left counts as before
    out = subprocess.run([sys.executable, "-c", COMPILE_AFTER_ASKING], env=env, cwd=cwd, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    pid, ok, level = out.stdout.split()
    return {p for p in _libtpu_logs() - before if p.endswith(f".{pid}")}, ok, level


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed here")
def test_a_process_that_asks_first_leaves_no_libtpu_log_files(tmp_path):
    new, ok, level = _new_logs_of_a_fresh_compile(tmp_path)
    assert (ok, level) == ("True", "3") and not new
    assert not list(tmp_path.iterdir())  # nothing in its working folder either
    # the same search finds the files of a process that asks libtpu to log (set before asking, so it is kept)
    new, ok, level = _new_logs_of_a_fresh_compile(tmp_path, TPU_MIN_LOG_LEVEL="0", TPU_LOG_DIR=str(tmp_path / "logs"))
    assert (ok, level) == ("True", "0") and new and all(p.startswith(str(tmp_path / "logs")) for p in new)


@pytest.mark.parametrize(("given", "expected"), [
    ({}, "3"),  # nothing below FATAL: no log files
    ({"TPU_MIN_LOG_LEVEL": "0"}, "0"),  # a level already set is kept
    ({"TPU_STDERR_LOG_LEVEL": "1"}, "1"),  # warnings asked for on stderr are logged (log files come back)
    ({"TPU_MIN_LOG_LEVEL": "3", "TPU_STDERR_LOG_LEVEL": "1"}, "1"),  # ... even where an inherited 3 is set
    ({"TPU_MIN_LOG_LEVEL": "0", "TPU_STDERR_LOG_LEVEL": "2"}, "0"),  # never raised
])
def test_log_level_set_before_libtpu_loads(monkeypatch, given, expected):
    for name in ("TPU_MIN_LOG_LEVEL", "TPU_STDERR_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    spmd_course.utils.tpu._set_log_level()
    assert os.environ["TPU_MIN_LOG_LEVEL"] == expected


def test_reason_when_libtpu_is_missing(fresh_answer, monkeypatch):
    monkeypatch.setattr(spmd_course.utils.tpu.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(spmd_course.utils.tpu.sys, "platform", "linux")
    assert tpu_compiler_available() == (False, "no TPU compiler here: libtpu is not installed (pip install "
                                               "'jax[tpu]' installs the libtpu that matches this jax)")


def test_reason_on_macos(fresh_answer, monkeypatch):
    monkeypatch.setattr(spmd_course.utils.tpu.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(spmd_course.utils.tpu.sys, "platform", "darwin")
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
    from spmd_course.utils.capture import quiet
    from spmd_course.utils.inspecting import collectives

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
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    assert run.stderr == ""
    (line,) = run.stdout.splitlines()  # the one line the script printed itself, nothing else
    result = json.loads(line)
    assert "TPU_ACCELERATOR_TYPE" in result["caught"]  # the warnings were there, and caught
    assert result["counts"]["all-reduce"] == 1
