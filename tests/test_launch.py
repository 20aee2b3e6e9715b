"""Launch paths: the setup cell, the Colab installer (utils.launch), Binder, and a Colab-like runtime.

The fast tests check the installer's decisions against made-up environments (no network, no pip).
The slow one builds a Colab-like runtime for real with uv and runs the real setup cell in it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name as canonicalize

from course_support import find_uv, tool
from spmd_course.course import (
    BADGES_LINE,
    REPO,
    ROOT,
    XLA_NOTEBOOKS,
    badges_markdown,
    binder_url,
    colab_url,
    launchable,
    setup_source,
)
from spmd_course.utils import launch
from spmd_course.utils.launch import (
    KERNEL_PACKAGES,
    Environment,
    Installed,
    InstallError,
    RestartRequired,
    binder_memory_note,
    install_requirements,
    mismatched_plugins,
    plan_install,
    prepare_runtime,
    requirements,
    version_note,
)

binder_requirements = tool("binder").binder_requirements

# jax 0.12.0.1's own requirement lines for its plugins (importlib.metadata.requires('jax'), abridged)
JAX_REQUIRES = [
    "jaxlib<=0.12.0.1,>=0.11.2",
    "numpy>=2.2",
    'libtpu==0.0.50.*; extra == "tpu"',
    'jax-cuda12-plugin[with-cuda]<=0.12.0.1,>=0.12.0.1; extra == "cuda12"',
    'jax-cuda13-plugin[with-cuda]<=0.12.0.1,>=0.12.0.1; extra == "cuda13"',
]


@pytest.fixture(autouse=True)
def _no_restart_pending(monkeypatch):
    """Each test starts in a 'fresh kernel' as far as utils.launch is concerned."""
    monkeypatch.setattr(launch, "_restart_pending", None)


# --- the setup cell and the badges ----------------------------------------------------------------------------------


def test_setup_source_is_short_plain_python_and_asks_for_devices():
    src = setup_source()
    lines = src.splitlines()
    assert lines[0] == "# @title Setup: 8 devices (the same cell opens every notebook; notebook 00 explains it)"
    assert setup_source(64).splitlines()[0].startswith("# @title Setup: 64 devices")  # Colab's form title
    assert lines[-2] == "SETUP = setup_devices(8)" and "SETUP = setup_devices(64)\n" in setup_source(64)
    assert lines[-1].startswith("CPU, RTOL = SETUP.cpu, SETUP.rtol  #")  # what the lessons ask of the backend
    assert f'"https://github.com/{REPO}"' in src
    assert len(lines) <= 18 and max(map(len, lines)) <= 120
    assert not [line for line in lines if line.lstrip().startswith(("!", "%"))], "no IPython magics"
    compile(src, "<setup cell>", "exec")  # plain Python
    for bad in (0, -1, 2.0, True, "8"):
        with pytest.raises(ValueError, match="whole number of devices"):
            setup_source(bad)


def test_setup_cell_pairs_as_percent_format_not_hydrogen(tmp_path):
    """Magics in the setup cell made jupytext read the paired .py as 'hydrogen'; plain Python keeps 'percent'."""
    jupytext = pytest.importorskip("jupytext")
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 99 · Demo"),
                                         nbformat.v4.new_code_cell(setup_source())])
    text = jupytext.writes(nb, fmt="py:percent")
    assert jupytext.formats.guess_format(text, ".py")[0] == "percent"
    back = jupytext.reads(text, fmt="py")
    assert back.cells[1].source == setup_source()


def test_badges_for_launchable_and_local_only_notebooks():
    assert launchable("00_setup.ipynb") and not launchable("24_pytorch_xla.ipynb")
    badges = badges_markdown("00_setup.ipynb")
    assert colab_url("00_setup.ipynb") in badges and binder_url("00_setup.ipynb") in badges
    for name in XLA_NOTEBOOKS:
        line = badges_markdown(name)
        assert "make lab-xla" in line and "colab" not in line.lower() and "binder" not in line.lower()
    for name in ["00_setup.ipynb", *XLA_NOTEBOOKS]:  # a re-stamp finds either kind of line
        title = f"# 00 · Title\n\n{badges_markdown(name)}\n\nPromise."
        assert BADGES_LINE.findall(title) == [badges_markdown(name)]


# --- reading pyproject and deciding what to install ---------------------------------------------------------------


def test_requirements_follow_pyproject_and_its_markers():
    on_311 = {str(r.name): str(r.specifier) for r in requirements(environment={"python_version": "3.11"})}
    on_312 = {str(r.name): str(r.specifier) for r in requirements(environment={"python_version": "3.12"})}
    assert on_311["jax"] == "==0.10.2" and on_312["jax"] == "==0.12.0.1"
    assert on_311["numpy"] == ">=2.0" and on_312["numpy"] == ">=2.2", "each line's floor is its jax's"
    assert not {"ipykernel", "jupyterlab"} & on_312.keys(), "pyproject's dependencies are compute only"
    with_tpu = requirements(environment={"python_version": "3.11", "sys_platform": "linux"}, groups=["tpu"])
    assert [str(r.specifier) for r in with_tpu if r.name == "libtpu"] == ["==0.0.42.1"]
    assert not [r for r in requirements(environment={"sys_platform": "darwin"}, groups=["tpu"]) if r.name == "libtpu"]
    assert launch.RUNTIME_GROUPS == ("tpu",)


def test_requirements_name_the_fix_for_a_bad_pyproject(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        requirements(tmp_path / "missing.toml")
    (tmp_path / "a.toml").write_text("[tool.x]\ny = 1\n")
    with pytest.raises(ValueError, match=r"no \[project\] dependencies"):
        requirements(tmp_path / "a.toml")
    (tmp_path / "b.toml").write_text('[project]\ndependencies = ["jax >> 1"]\n')
    with pytest.raises(ValueError, match="not a valid requirement"):
        requirements(tmp_path / "b.toml")
    (tmp_path / "c.toml").write_text('[project]\ndependencies = []\n[dependency-groups]\ntpu = "libtpu"\n')
    with pytest.raises(ValueError, match=r"no \[dependency-groups\] tpu list"):
        requirements(tmp_path / "c.toml", groups=["tpu"])
    with pytest.raises(ValueError, match=r"no \[dependency-groups\] lab list"):
        requirements(tmp_path / "c.toml", groups=["lab"])


def _reqs(*lines):
    from packaging.requirements import Requirement

    return [Requirement(line) for line in lines]


def test_plan_installs_only_what_is_missing_or_outside_its_specifier():
    installed = {"jax": "0.7.2", "numpy": "2.0.2", "matplotlib": "3.10.0", "rich": "13.9.4", "flax": "0.12.12"}
    reqs = _reqs("jax==0.12.0.1", "numpy>=2.0", "matplotlib>=3.8", "rich>=13", "flax==0.12.12", "optax==0.2.8",
                 "orbax-checkpoint==0.12.8", "jax-extras[cpu]>=1")
    plan = plan_install(reqs, installed)
    assert plan.installed == ("jax==0.12.0.1", "optax==0.2.8", "orbax-checkpoint==0.12.8", "jax-extras[cpu]>=1")
    assert plan_install(reqs[1:5], installed) == Installed()
    assert plan_install(_reqs("numpy>=2.0"), {"numpy": "not-a-version"}).installed == ("numpy>=2.0",)
    assert plan_install(_reqs("Orbax_Checkpoint==1.0"), {"orbax-checkpoint": "1.0"}) == Installed(), "names normalise"


def test_plan_never_installs_the_kernels_own_packages():
    plan = plan_install(_reqs("ipykernel==7.4.0", "IPython>=9", "tornado>=6", "jax==0.12.0.1"),
                        {"ipykernel": "6.17.1", "ipython": "7.34.0", "tornado": "6.4.2"})
    assert plan.installed == ("jax==0.12.0.1",)
    assert len(plan.kept) == 2 and "ipykernel 6.17.1" in plan.kept[0] and "ipython 7.34.0" in plan.kept[1]
    assert {"ipykernel", "ipython", "jupyter-client", "tornado", "pyzmq", "jupyter-server", "notebook",
            "google-colab"} <= KERNEL_PACKAGES


def test_plugins_that_belong_to_another_jax_are_found():
    installed = {"jax": "0.12.0.1", "jax-cuda12-plugin": "0.7.2", "jax-cuda12-pjrt": "0.7.2", "libtpu": "0.0.17",
                 "jax-rocm60-plugin": "0.12.0.1", "numpy": "2.0.2"}
    assert mismatched_plugins(installed, JAX_REQUIRES) == [
        "jax-cuda12-pjrt", "jax-cuda12-plugin", "jax-rocm60-plugin", "libtpu"]
    matching = {"jax-cuda12-plugin": "0.12.0.1", "jax-cuda12-pjrt": "0.12.0.1", "libtpu": "0.0.50.1"}
    assert mismatched_plugins(matching, JAX_REQUIRES) == []
    assert mismatched_plugins({"libtpu-nightly": "0.1.dev1"}, ["not a requirement ::"]) == ["libtpu-nightly"]


def test_module_names_of_a_distribution():
    files = ["numpy/__init__.py", "numpy/linalg/_umath_linalg.cpython-312-x86_64-linux-gnu.so", "numpy/py.typed",
             "numpy-2.0.2.dist-info/RECORD", "../../bin/f2py", "numpy/__pycache__/x.cpython-312.pyc",
             "jax_plugins/xla_cuda12/__init__.py", "weird-name/x.py"]
    assert launch._module_names(files) == {"numpy", "numpy.linalg._umath_linalg", "jax_plugins.xla_cuda12"}


class FakeEnvironment(Environment):
    """Made-up installed versions; pip 'installs' from a catalogue and records every call."""

    def __init__(self, installed, catalogue=None, modules=None, requires=None, fail=0):
        self.installed = dict(installed)
        self.catalogue = catalogue or {}  # name -> version pip would install (also for dependencies)
        self.module_map = modules or {}
        self.jax_requires = requires if requires is not None else JAX_REQUIRES
        self.fail = fail  # pip calls that fail before one succeeds
        self.calls: list[list[str]] = []
        self.constraints: list[str] = []

    def versions(self):
        return dict(self.installed)

    def requires(self, name):
        return self.jax_requires if name == "jax" else []

    def modules(self, name):
        return set(self.module_map.get(name, {name.replace("-", "_")}))

    def pip(self, args):
        self.calls.append(args)
        if "--constraint" in args:
            self.constraints = Path(args[args.index("--constraint") + 1]).read_text().splitlines()
        if self.fail:
            self.fail -= 1
            return 1, "Collecting jax==0.12.0.1\n" + "\n".join(f"line {i}" for i in range(30)) + "\nERROR: no network"
        if args[0] == "install":
            self.installed.update(self.catalogue)
        else:
            for name in args[2:]:
                self.installed.pop(name)
        return 0, "done"


def _colab(tpu=False, **overrides):
    """Colab's GPU runtime (or with ``tpu``, its TPU runtime) as backend-info lists it, and what pip would bring."""
    installed = {"jax": "0.7.2", "jaxlib": "0.7.2", "numpy": "2.1.3", "matplotlib": "3.10.0", "rich": "13.9.4",
                 "ipywidgets": "7.7.1", "ipykernel": "6.17.1", "ipython": "7.34.0", "tornado": "6.5.7",
                 "scipy": "1.16.3", "flax": "0.11.2", "optax": "0.2.8", "orbax-checkpoint": "0.12.4",
                 **({"libtpu": "0.0.21.1"} if tpu else {"jax-cuda12-plugin": "0.7.2", "jax-cuda12-pjrt": "0.7.2"})}
    catalogue = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "flax": "0.12.12", "optax": "0.2.8",
                 "orbax-checkpoint": "0.12.8", "numpy": "2.5.5", "libtpu": "0.0.50.1"}
    return FakeEnvironment(installed, {**catalogue, **overrides})


PYPROJECT = """[project]
dependencies = [
    "jax==0.12.0.1", "jax==0.4.0; python_version < '3.0'", "jaxlib==0.12.0.1", "flax==0.12.12", "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "numpy>=2.0", "matplotlib>=3.8", "rich>=13", "ipywidgets>=7.7", "ipykernel==7.4.0",
]
[dependency-groups]
tpu = ["libtpu==0.0.50.1", "libtpu==0.0.1; python_version < '3.0'", {include-group = "other"}]
other = ["ruff"]
"""


@pytest.fixture
def pyproject(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text(PYPROJECT)
    return path


def test_install_runs_pip_once_for_what_is_needed_and_pins_the_kernel(pyproject, capsys):
    env = _colab()
    done = install_requirements(pyproject, environment=env, imported={"sys", "os"})
    assert done.installed == ("jax==0.12.0.1", "jaxlib==0.12.0.1", "flax==0.12.12", "orbax-checkpoint==0.12.8",
                              "libtpu==0.0.50.1"), "Colab's optax, numpy, ipywidgets 7.7.1 satisfy the course"
    assert done.removed == ("jax-cuda12-pjrt", "jax-cuda12-plugin")
    assert len(done.kept) == 1 and done.kept[0].startswith("ipykernel 6.17.1")
    assert env.installed["libtpu"] == "0.0.50.1" and env.installed["ipywidgets"] == "7.7.1"
    install, uninstall = env.calls
    assert install[:3] == ["install", "--upgrade-strategy", "only-if-needed"] and install[5:] == list(done.installed)
    assert env.constraints == ["ipykernel==6.17.1", "ipython==7.34.0", "tornado==6.5.7"]
    assert uninstall == ["uninstall", "--yes", "jax-cuda12-pjrt", "jax-cuda12-plugin"]
    out = capsys.readouterr().out
    assert "launch: installing jax==0.12.0.1" in out and "launch: removing jax-cuda12-pjrt" in out
    # the same call again (a re-run, or the next notebook): everything is satisfied, no pip at all
    assert install_requirements(pyproject, environment=env, imported={"numpy"}) == Installed(kept=done.kept)
    assert len(env.calls) == 2


def test_a_tpu_runtime_gets_the_libtpu_of_the_course_s_jax_instead_of_its_own(pyproject):
    """Colab's TPU runtime brings libtpu 0.0.21.1 for its jax 0.7.2: the installer replaces it by the pinned one."""
    env = _colab(tpu=True)
    done = install_requirements(pyproject, environment=env, imported=set(), quiet=True)
    assert done.installed[-1] == "libtpu==0.0.50.1" and done.removed == ()
    assert env.installed["libtpu"] == "0.0.50.1" and len(env.calls) == 1, "upgraded by pip, nothing uninstalled"


def test_an_imported_package_that_changed_asks_for_a_restart_in_one_line(pyproject):
    env = _colab()
    with pytest.raises(RestartRequired) as caught:
        install_requirements(pyproject, environment=env, imported={"numpy", "numpy.linalg", "sys"})
    message = str(caught.value)
    assert "\n" not in message and "numpy 2.1.3 -> 2.5.5" in message
    assert "restart the session (Runtime > Restart session) and run this cell again" in message
    assert caught.value._render_traceback_() == [f"RestartRequired: {message}"], "Jupyter shows just the message"
    calls = len(env.calls)
    with pytest.raises(RestartRequired, match="Runtime > Restart session"):  # re-run without restarting
        install_requirements(pyproject, environment=env, imported={"numpy"})
    assert len(env.calls) == calls, "nothing to install again: only the restart is missing"
    launch._restart_pending = None  # the restart: a new kernel, where numpy is not yet imported
    assert install_requirements(pyproject, environment=env, imported=set()).installed == ()
    assert len(env.calls) == calls


def test_a_removed_plugin_that_was_imported_also_asks_for_a_restart(pyproject):
    env = _colab(**{"jax-cuda12-plugin": "0.7.2"})  # pip leaves the plugin; the installer removes it
    env.module_map = {"jax-cuda12-pjrt": {"jax_plugins.xla_cuda12"}, "jax-cuda12-plugin": {"jax_cuda12_plugin"}}
    with pytest.raises(RestartRequired, match=r"jax-cuda12-pjrt 0\.7\.2 -> removed"):
        install_requirements(pyproject, environment=env, imported={"jax_plugins", "jax_plugins.xla_cuda12"})


def test_a_failed_pip_run_raises_its_last_lines_and_the_next_run_retries(pyproject):
    env = _colab()
    env.fail = 1
    with pytest.raises(InstallError) as caught:
        install_requirements(pyproject, environment=env, imported=set(), quiet=True)
    message = str(caught.value)
    assert "run this cell again to retry" in message and message.endswith("ERROR: no network")
    assert "line 0" not in message, "only pip's last lines"
    done = install_requirements(pyproject, environment=env, imported=set(), quiet=True)
    assert done.installed and env.installed["jax"] == "0.12.0.1" and len(env.calls) == 3


def test_pip_that_succeeds_without_installing_is_an_error(pyproject):
    env = _colab(jax="0.7.2")  # pip's "success" left jax where it was (say, a constraint won)
    with pytest.raises(InstallError, match=r"jax==0\.12\.0\.1 is still not installed"):
        install_requirements(pyproject, environment=env, imported=set(), quiet=True)


def test_the_real_environment_is_read_without_pip():
    env = Environment()
    versions = env.versions()
    assert versions["pytest"] and "packaging" in versions
    assert env.versions(["pytest", "Jax", "no-such-dist"]) == {"pytest": versions["pytest"], "jax": versions["jax"]}
    assert "numpy" in env.modules("numpy") and env.modules("no-such-dist") == set()
    assert env.requires("no-such-dist") == []
    assert any(line.startswith("jaxlib") for line in env.requires("jax"))


def test_prepare_runtime_does_nothing_locally_and_routes_colab_and_binder(monkeypatch, capsys):
    monkeypatch.delenv(launch.BINDER_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    assert version_note() is None, "this environment holds the tested versions"
    assert prepare_runtime() is None and capsys.readouterr().out == ""
    monkeypatch.setenv(launch.BINDER_ENV, "binder")
    assert prepare_runtime() is None and capsys.readouterr().out.startswith("Binder: ")
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    monkeypatch.setattr(launch, "install_requirements", lambda: Installed(installed=("x==1",)))
    assert prepare_runtime() == Installed(installed=("x==1",))


def test_version_note_names_what_differs_from_the_tested_versions(pyproject):
    tested = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "flax": "0.12.12", "numpy": "1.0"}
    assert version_note(tested, pyproject) is None, "only jax, jaxlib and flax are checked"
    note = version_note({**tested, "JAX": "0.12.1", "flax": "0.11.2"}, pyproject)
    python = ".".join(map(str, sys.version_info[:3]))
    assert note == (f"Untested versions for Python {python}: jax 0.12.1 (tested: 0.12.0.1), flax 0.11.2 (tested: "
                    "0.12.12). To get the tested ones, run `pip install -r requirements.txt` in the course's folder "
                    "(or `make lab`), then restart the kernel.")
    assert "jaxlib missing (tested: 0.12.0.1)" in version_note({"jax": "0.12.0.1", "flax": "0.12.12"}, pyproject)
    assert "jax not-a-version (tested" in version_note({**tested, "jax": "not-a-version"}, pyproject)
    with pytest.raises(FileNotFoundError):
        version_note(tested, pyproject.parent / "missing.toml")


def test_prepare_runtime_prints_the_version_note_once(monkeypatch, capsys):
    monkeypatch.delenv(launch.BINDER_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr(Environment, "versions",
                        lambda self, names=None: {"jax": "0.7.2", "jaxlib": "0.7.2", "flax": "0.11.2"})
    assert prepare_runtime() is None
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("Untested versions for Python") and "jax 0.7.2 (tested: " in out[0]


# --- Binder -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("python,line", [("3.12", "0.12.0.1"), ("3.11", "0.10.2"), ("3.13", "0.12.0.1")])
def test_binder_installs_what_pyproject_says_and_nothing_of_its_server(python, line):
    """Binder's file gives each Python exactly one pin per package: its own line's, libtpu included."""
    from packaging.requirements import Requirement

    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    assert re.fullmatch(r"python-3\.1[123]", runtime), f"Binder's {runtime} is not a Python the course is tested on"
    text = (ROOT / "binder" / "requirements.txt").read_text()
    assert text == binder_requirements(), "binder/requirements.txt is stale: run python tools/binder.py"
    reqs = [Requirement(x) for x in text.splitlines() if x and not x.startswith("#")]
    markers = {"python_version": python, "python_full_version": f"{python}.1", "sys_platform": "linux"}
    here = [r for r in reqs if r.marker is None or r.marker.evaluate(markers)]
    pins = {r.name: str(r.specifier) for r in here}
    assert len(pins) == len(here), "one line per package for each Python"
    assert pins["jax"] == pins["jaxlib"] == f"=={line}"
    assert all(pin.startswith("==") for pin in pins.values()), "every package pinned, as uv.lock pins it"
    assert {"numpy", "ml-dtypes", "scipy", "matplotlib", "pillow", "optax", "orbax-checkpoint"} <= set(pins)
    assert pins["libtpu"] == str(next(r.specifier for r in requirements(environment=markers, groups=["tpu"])
                                      if r.name == "libtpu"))
    names = {canonicalize(r.name) for r in reqs}
    assert not names & KERNEL_PACKAGES and not names & {"jupyterlab", "ipykernel", "notebook"}


def test_binder_requirements_pin_the_locked_closure_less_the_kernel_and_check_their_inputs(tmp_path):
    (tmp_path / "runtime.txt").write_text("python-3.11\n")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["jax==0.12.0.1", "ipywidgets>=7.7", "ipykernel==7.4.0"]\n'
        '[dependency-groups]\ntpu = ["libtpu==0.0.50.1; sys_platform == \'linux\'"]\ntest = ["ruff"]\n')
    graph = {"jax": ["ml-dtypes", "numpy"], "ml-dtypes": ["numpy"], "numpy": [], "libtpu": [], "ruff": [],
             "ipywidgets": ["ipython", "widgetsnbextension"], "ipython": ["jedi"], "jedi": [],
             "widgetsnbextension": [], "ipykernel": ["tornado"], "tornado": []}
    (tmp_path / "uv.lock").write_text("".join(
        f'[[package]]\nname = "{name}"\ndependencies = [{", ".join(f"{{ name = {dep!r} }}" for dep in deps)}]\n'
        for name, deps in graph.items()).replace("'", '"'))
    export = "# exported\n" + "".join(f"{name}==1.{i} ; sys_platform == 'linux'\n    # via someone\n"
                                         for i, name in enumerate(graph))
    (tmp_path / "requirements.txt").write_text(export)
    paths = {"pyproject": tmp_path / "pyproject.toml", "runtime": tmp_path / "runtime.txt",
             "lock": tmp_path / "uv.lock", "export": tmp_path / "requirements.txt"}
    text = binder_requirements(**paths)
    pins = [line.split("==")[0] for line in text.splitlines() if not line.startswith("#")]
    assert pins == ["jax", "ml-dtypes", "numpy", "libtpu", "ipywidgets", "widgetsnbextension"]  # export's order
    assert "Python 3.11" in text and "jax==1.0 ; sys_platform == 'linux'" in text.splitlines()  # the export's line
    (tmp_path / "requirements.txt").write_text(export.replace("numpy==1.2", "numpyx==1.2"))
    with pytest.raises(ValueError, match="lacks numpy: run `make requirements`"):
        binder_requirements(**paths)
    (tmp_path / "uv.lock").write_text('[[package]]\nname = "jax"\n')
    with pytest.raises(ValueError, match="run `make lock`"):
        binder_requirements(**paths)
    (tmp_path / "runtime.txt").write_text("3.12\n")
    with pytest.raises(ValueError, match=r"python-3\.12"):
        binder_requirements(**paths)


def test_binder_start_sets_devices_path_and_keeps_memory_small():
    start = (ROOT / "binder" / "start").read_text()
    assert start.startswith("#!") and start.rstrip().endswith('exec "$@"')
    assert os.access(ROOT / "binder" / "start", os.X_OK)
    assert "export JAX_NUM_CPU_DEVICES=8" in start and "PYTHONPATH" not in start  # the setup cell finds the course
    assert f"export {launch.BINDER_ENV}=binder" in start and "JUPYTER_CONFIG_PATH" in start
    tracker = json.loads((ROOT / "binder" / "jupyter" / "tracker.jupyterlab-settings").read_text())
    assert tracker == {"kernelShutdown": True}


def test_jupyter_reads_the_binder_settings(tmp_path):
    """The settings are real: Jupyter's server loads the culling config, and JupyterLab knows the setting."""
    jupyterlab = pytest.importorskip("jupyterlab")
    schema = Path(jupyterlab.__file__).parent / "schemas" / "@jupyterlab" / "notebook-extension" / "tracker.json"
    assert json.loads(schema.read_text())["properties"]["kernelShutdown"]["type"] == "boolean"
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(ROOT / "binder" / "jupyter"), JUPYTER_CONFIG_DIR=str(tmp_path))
    shown = subprocess.run([sys.executable, "-m", "jupyter_server", "--show-config"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert "cull_connected = True" in shown.stdout and "cull_idle_timeout = 1200" in shown.stdout, shown.stderr


def test_binder_memory_note_counts_kernels_and_their_memory(tmp_path, monkeypatch):
    proc = tmp_path / "proc"
    for pid, cmd, rss_kb in [(10, "python -m ipykernel_launcher -f k1.json", 400 * 1024),
                             (11, "python -m ipykernel_launcher -f k2.json", 224 * 1024),
                             (12, "jupyter-lab --port 8888", 150 * 1024)]:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(cmd.replace(" ", "\0").encode())
        (proc / str(pid) / "status").write_text(f"Name:\tpython\nVmRSS:\t  {rss_kb} kB\n")
    (proc / "13").mkdir()  # a process that ended while we looked: no files
    monkeypatch.setenv("MEM_LIMIT", str(2 * 2**30))
    note = binder_memory_note(proc)
    assert note.startswith("Binder: 2 notebook kernels running (this one included), holding 0.6 GiB of this "
                           "session's 2.0 GiB") and "Close and Shut Down Notebook" in note
    monkeypatch.delenv("MEM_LIMIT")
    assert "session's" not in binder_memory_note(proc)
    assert binder_memory_note(tmp_path / "empty").startswith("Binder: 0 notebook kernels running")


# --- utils stays light until asked ------------------------------------------------------------------------------------


def test_utils_loads_lazily_and_launch_imports_nothing_heavy():
    code = ("import sys\nimport spmd_course.utils.launch\nfrom spmd_course import utils\n"
            "from spmd_course.utils import launch, setup_devices\n"
            "heavy = sorted({'jax', 'numpy', 'matplotlib'} & set(sys.modules))\n"
            "assert not heavy, heavy\n"
            "assert all(getattr(utils, n) is not None for n in utils.__all__)\n"
            "assert set(utils.__all__) <= set(dir(utils)) and 'launch' in dir(utils)\n"
            "from spmd_course.utils.devices import setup_devices as direct\nassert setup_devices is direct\n"
            "try:\n    utils.no_such_name\nexcept AttributeError as e:\n    print('ok', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    assert "ok module 'spmd_course.utils' has no attribute 'no_such_name'" in r.stdout


def test_utils_exports_what_type_checkers_read():
    """``utils.__all__`` and the lazy loader come from the ``TYPE_CHECKING`` imports; run those imports for real and
    each name must be the object the loader serves, taken from the submodule that defines it."""
    import ast
    import importlib

    from spmd_course import utils
    source = Path(utils.__file__).read_text(encoding="utf-8")
    block = next(node for node in ast.parse(source).body
                 if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    seen: dict = {}
    exec(compile(ast.Module(block.body, type_ignores=[]), utils.__file__, "exec"),
         {"__package__": "spmd_course.utils"}, seen)
    assert {"setup_devices", "draw_sharding", "collectives", "estimate_step"} <= set(seen)
    assert utils.__all__ == sorted(seen)
    for name, value in seen.items():
        module = importlib.import_module(f"spmd_course.utils.{utils._MODULE_OF[name]}")
        assert getattr(utils, name) is value is getattr(module, name), name


# --- the setup cell, run for real ----------------------------------------------------------------------------------


def _git_stand_in(tmp_path: Path) -> Path:
    """A `git` that copies this checkout (tracked and new files) to the clone's folder instead of using GitHub."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "git").write_text(
        f"#!{sys.executable}\n"
        "import shutil, subprocess, sys\nfrom pathlib import Path\n"
        "assert sys.argv[1] == 'clone', sys.argv\n"
        "dest = Path(sys.argv[-1]).resolve()\n"
        f"root = Path({str(ROOT)!r})\n"
        f"git = {shutil.which('git')!r}\n"
        "files = subprocess.run([git, 'ls-files', '-z', '--cached', '--others', '--exclude-standard'], cwd=root,\n"
        "                       capture_output=True, check=True).stdout.decode().split('\\0')\n"
        "for name in filter(None, files):\n"
        "    if (root / name).is_file():\n"
        "        (dest / name).parent.mkdir(parents=True, exist_ok=True)\n"
        "        shutil.copy2(root / name, dest / name)\n"
        "(dest / '.cloned-with').write_text(' '.join(sys.argv[1:]))\n")
    (shim / "git").chmod(0o755)
    return shim


def _cell_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")


FAKE_COLAB = ("import sys, types\n"  # google.colab and the google.colab.output that jax's debugger imports there
              "colab = sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
              "colab.output = sys.modules['google.colab.output'] = types.ModuleType('google.colab.output')\n"
              "import numpy\nprint('numpy', numpy.__version__)")


def test_setup_cell_fetches_the_course_whole_into_a_lone_folder(tmp_path, monkeypatch):
    """The real setup cell in a kernel that looks like Colab, in a folder without the course.

    This environment already has everything, so the installer must call no pip (pip is pointed at
    no index, so a mistake would fail instead of changing the environment). A half-cloned folder
    from an earlier, interrupted run is replaced by a whole clone.
    """
    import nbformat
    from nbclient import NotebookClient

    env = Environment()
    if plan_install(requirements(), env.versions()).installed or mismatched_plugins(env.versions(),
                                                                                    env.requires("jax")):
        pytest.skip("this environment lacks course requirements: the installer would change it")
    work = tmp_path / "content"
    (work / "spmd-course" / "src").mkdir(parents=True)  # what an interrupted earlier clone left
    (work / "spmd-course.tmp").mkdir()
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    monkeypatch.setenv("PATH", f"{_git_stand_in(tmp_path)}:{os.environ['PATH']}")
    monkeypatch.setenv("PIP_LOG", str(tmp_path / "pip.log"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(FAKE_COLAB),
        nbformat.v4.new_code_cell(setup_source()),
        nbformat.v4.new_code_cell("import jax\nfrom spmd_course import utils\n"
                                  "print(utils.__file__, jax.device_count())"),
    ])
    NotebookClient(nb, timeout=300, startup_timeout=180,  # a kernel starts slowly on a loaded 2-core machine
                   kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    assert f"{work}/spmd-course/src/spmd_course/utils/__init__.py 8" in _cell_text(nb.cells[2])
    assert "launch:" not in _cell_text(nb.cells[1]) and not (tmp_path / "pip.log").exists(), "no pip call"
    assert f"https://github.com/{REPO} spmd-course.tmp" in (work / "spmd-course" / ".cloned-with").read_text()
    assert not (work / "spmd-course.tmp").exists() and (work / "spmd-course" / "pyproject.toml").is_file()


# --- a Colab-like runtime, built for real --------------------------------------------------------------------------

# Colab's GPU runtime as googlecolab/backend-info lists it at commit a724079 (2026-08-19, "Upgrade to Python 3.13"):
# pip-freeze.gpu.txt for the packages, os-info-gpu.txt for Python 3.13 (3.13.15 there; the patch level here is
# whatever tools/find-python finds). What these pins leave open is resolved as of that day (COLAB_DATE), so the
# runtime is the same on every run; what the setup cell's pip installs is capped at uv.lock (_lock_constraints).
COLAB_PYTHON = "3.13"
COLAB_DATE = "2026-08-20T00:00:00Z"
COLAB_PACKAGES = [
    "pip==24.1.2", "packaging==26.3",
    "numpy==2.1.3", "scipy==1.16.3", "jax==0.7.2", "jaxlib==0.7.2", "jax-cuda12-plugin==0.7.2",
    "jax-cuda12-pjrt==0.7.2", "flax==0.11.2", "optax==0.2.8", "orbax-checkpoint==0.12.4", "matplotlib==3.10.0",
    "rich==13.9.4", "ipywidgets==7.7.1", "widgetsnbextension==3.6.10", "jupyterlab-widgets==3.0.16",
    "ipython-genutils==0.2.0", "notebook==6.5.7", "jupyter-server==2.20.0", "ipykernel==6.17.1", "ipython==7.34.0",
    "jupyter-client==7.4.9", "jupyter-core==5.9.1", "tornado==6.5.7", "pyzmq==26.2.1", "traitlets==5.7.1",
    "debugpy==1.8.15", "matplotlib-inline==0.2.2", "nest-asyncio==1.6.0",
]
KERNEL_SIDE = ["ipykernel", "ipython", "jupyter-client", "tornado", "pyzmq", "traitlets",
               "ipywidgets", "widgetsnbextension", "jupyterlab-widgets"]
PLUGIN_CHECK = '''
import os, sys
VERSION = "0.7.2"
def initialize():
    import jax
    if jax.__version__ != VERSION:  # like a PJRT plugin built for another jaxlib: the process dies
        sys.stderr.write(f"jax-cuda12-pjrt {VERSION} cannot run under jax {jax.__version__}\\n")
        sys.stderr.flush()
        os.abort()
'''


def _wheel(folder: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    """A minimal, valid pure-Python wheel (uv and pip install and uninstall it like any other)."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    files = {**files,
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
                 name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for arcname, text in files.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arcname},sha256={digest},{len(data)}")
            whl.writestr(arcname, data)
        whl.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def _fake_cuda_plugin(folder: Path) -> list[Path]:
    """jax-cuda12-plugin and jax-cuda12-pjrt 0.7.2 that abort under another jax, as a real pair can on a GPU.

    The real pair (installed from PyPI in the Colab-like runtime) gives up early where CUDA is absent,
    so on a CPU-only machine it shows nothing. This stand-in keeps the contract that matters: JAX imports
    ``jax_plugins.xla_cuda12`` and calls ``initialize()`` whenever a backend starts (even on CPU), and
    a plugin built for another jaxlib takes the process down there.
    """
    folder.mkdir(exist_ok=True)
    return [_wheel(folder, "jax-cuda12-pjrt", "0.7.2", {"jax_plugins/xla_cuda12/__init__.py": PLUGIN_CHECK}),
            _wheel(folder, "jax-cuda12-plugin", "0.7.2", {"jax_cuda12_plugin/__init__.py": ""},
                   requires=("jax-cuda12-pjrt==0.7.2",))]


def _find_python(version: str) -> str | None:
    r = subprocess.run([str(ROOT / "tools" / "find-python"), f"python{version}"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def _lock_constraints(path: Path, python: str, installed: dict[str, str]) -> Path:
    """A pip constraints file that caps every package at its version in requirements.txt (uv.lock) for one
    Python on Linux: whatever the setup cell's pip installs or upgrades then comes from the lock, never a newer
    release, while a package the runtime already holds at a satisfying version stays as it is. Packages the
    runtime holds at a newer version than the lock, and the runtime's kernel packages, are left out."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux"}
    lines = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line and not line.startswith((" ", "#", "-")):  # "-e ." (the course itself) is an option, not a package
            req = Requirement(line)
            name, locked = canonicalize(req.name), str(req.specifier).removeprefix("==")
            if not (req.marker is None or req.marker.evaluate(env)) or name in KERNEL_PACKAGES:
                continue
            if name not in installed or Version(installed[name]) <= Version(locked):
                lines.append(f"{name}<={locked}\n")
    path.write_text("".join(lines))
    return path


def _versions(python: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, re\n"
            "print(json.dumps({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(): d.version "
            "for d in m.distributions()}))")
    return json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout)


@pytest.mark.slow
def test_setup_cell_in_a_colab_like_runtime(tmp_path, monkeypatch, request):
    """Colab, for real: Colab's Python and packages (COLAB_PACKAGES, with its CUDA plugins), a live kernel.

    Needs the package registry (pypi.org): it downloads about 1.5 GB into a throwaway runtime, and skips
    when PyPI does not answer. Both sides are pinned (COLAB_PACKAGES and COLAB_DATE for the runtime,
    uv.lock as the cap for what the cell installs), so a new release on PyPI cannot change its outcome.

    1. The first kernel has imported numpy 2.1.3; jax 0.12 needs numpy >= 2.2, so the cell installs
       what is needed (libtpu included), removes the CUDA plugins built for jax 0.7.2, leaves Colab's
       kernel and widget packages alone, and stops with the one-line restart message.
    2. The "restarted" kernel runs the same cell: no pip call, 8 devices, the TPU compiler works,
       and the explorer is a widget on Colab's ipywidgets 7.7.1.
    3. An older optax and a plugin that aborts under another jax (the contract of a real one on a
       GPU), nothing imported that changes: the cell installs optax alone, removes the plugin, and runs
       through to 8 devices without a restart.
    """
    import nbformat
    from nbclient import NotebookClient

    uv, python = find_uv(), _find_python(COLAB_PYTHON)
    if uv is None:
        pytest.skip("no bootstrapped uv in <repo>/.uv (make env creates it)")
    if python is None:
        pytest.skip(f"no Python {COLAB_PYTHON} (Colab's) found by tools/find-python")
    try:
        urllib.request.urlopen("https://pypi.org/simple/jax/", timeout=15).close()
    except OSError as err:
        pytest.skip(f"this test needs the package registry, and PyPI is unreachable ({err})")

    venv = tmp_path / "colab"
    vpy = venv / "bin" / "python"
    request.addfinalizer(lambda: shutil.rmtree(venv, ignore_errors=True))  # the runtime weighs about 1.5 GB
    uv_env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    subprocess.run([str(uv), "venv", "--quiet", "--python", python, str(venv)], check=True, env=uv_env)
    subprocess.run([str(uv), "pip", "install", "--quiet", "--python", str(vpy), "--exclude-newer", COLAB_DATE,
                    *COLAB_PACKAGES], check=True, env=uv_env)
    before = _versions(vpy)
    assert {n: before[n] for n in ("pip", "numpy", "jax", "jax-cuda12-pjrt", "ipywidgets", "flax")} == {
        "pip": "24.1.2", "numpy": "2.1.3", "jax": "0.7.2", "jax-cuda12-pjrt": "0.7.2", "ipywidgets": "7.7.1",
        "flax": "0.11.2"}
    monkeypatch.setenv("PIP_CONSTRAINT", str(_lock_constraints(tmp_path / "lock.txt", COLAB_PYTHON, before)))

    kernels = tmp_path / "share" / "jupyter" / "kernels" / "colab"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(vpy), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab-like", "language": "python"}))
    for name in ("PYTHONPATH", "JAX_NUM_CPU_DEVICES", "JAX_PLATFORMS", "VIRTUAL_ENV"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    monkeypatch.setenv("PATH", f"{_git_stand_in(tmp_path)}:{os.environ['PATH']}")
    pip_log = tmp_path / "pip.log"
    monkeypatch.setenv("PIP_LOG", str(pip_log))
    monkeypatch.setenv("PIP_NO_COMPILE", "1")  # faster; the installed files are the same
    work = tmp_path / "content"
    work.mkdir()
    check = ("import jax\nfrom spmd_course import utils\n"
             "print('jax', jax.__version__, 'devices', jax.device_count(), utils.__file__)")

    def run(*cells):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        NotebookClient(nb, timeout=600, startup_timeout=180, kernel_name="colab", allow_errors=True,
                       resources={"metadata": {"path": str(work)}}).execute()
        return nb.cells

    # 1. the first kernel: numpy 2.1.3 is imported, and jax 0.12 needs a newer one
    cells = run(FAKE_COLAB, setup_source())  # (importing jax next to the old numpy in memory is not safe)
    assert "numpy 2.1.3" in _cell_text(cells[0])
    printed = _cell_text(cells[1])
    installed = re.search(r"launch: installing (.*) \(", printed)[1].split()
    assert installed == ["jax==0.12.0.1", "jaxlib==0.12.0.1", "flax==0.12.12", "orbax-checkpoint==0.12.8",
                         "numpy>=2.2", "libtpu==0.0.50.1"], printed  # Colab's numpy 2.1.3 is below jax 0.12's floor
    assert "launch: removing jax-cuda12-pjrt jax-cuda12-plugin" in printed
    error = next(o for o in cells[1].outputs if o["output_type"] == "error")
    assert error["ename"] == "RestartRequired" and "\n" not in error["evalue"], error
    assert error["traceback"] == [f"RestartRequired: {error['evalue']}"], "shown as one line, no traceback"
    assert "numpy 2.1.3 -> 2.5.5" in error["evalue"] and "Runtime > Restart session" in error["evalue"]
    after = _versions(vpy)
    for name, version in [("jax", "0.12.0.1"), ("jaxlib", "0.12.0.1"), ("flax", "0.12.12"), ("optax", "0.2.8"),
                          ("orbax-checkpoint", "0.12.8"), ("libtpu", "0.0.50.1"), ("numpy", "2.5.5")]:
        assert after[name] == version
    assert {n: after[n] for n in KERNEL_SIDE} == {n: before[n] for n in KERNEL_SIDE}, "the kernel's own packages"
    assert after["matplotlib"] == before["matplotlib"] and after["rich"] == before["rich"], "satisfied: untouched"
    assert "jax-cuda12-pjrt" not in after and "jax-cuda12-plugin" not in after
    assert f"https://github.com/{REPO}" in (work / "spmd-course" / ".cloned-with").read_text()

    # 2. after the restart: a new kernel runs the same cell, everything is satisfied, pip is not called
    log_size = pip_log.stat().st_size
    tpu_and_widgets = ("from spmd_course.utils.tpu import tpu_compiler_available\nprint(tpu_compiler_available())\n"
                       "from spmd_course.utils.explorer import explore\nexplore()")
    cells = run(FAKE_COLAB, setup_source(), check, tpu_and_widgets)
    assert not [o for c in cells for o in c.outputs if o["output_type"] == "error"], cells
    assert "launch:" not in _cell_text(cells[1]) and pip_log.stat().st_size == log_size, "no pip call"
    assert "Untested versions" not in _cell_text(cells[1])
    assert f"jax 0.12.0.1 devices 8 {work}/spmd-course/src/spmd_course/utils/__init__.py" in _cell_text(cells[2])
    assert "(True, 'libtpu 0.0.50.1 compiles for TPU topologies" in _cell_text(cells[3])
    views = [o for o in cells[3].outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) == 1 and views[0]["data"]["application/vnd.jupyter.widget-view+json"]["version_major"] == 2

    # 3. an older optax and the plugin again (its crash is real), nothing imported that changes: runs through
    plugins = _fake_cuda_plugin(tmp_path / "wheels")
    subprocess.run([str(uv), "pip", "install", "--quiet", "--python", str(vpy), "--no-deps", "optax==0.2.5",
                    *map(str, plugins)], check=True, env=uv_env)
    crash = subprocess.run([str(vpy), "-c", "import jax; jax.config.update('jax_platforms', 'cpu'); jax.devices()"],
                           capture_output=True, text=True, timeout=300)
    assert crash.returncode != 0 and "cannot run under jax 0.12.0.1" in crash.stderr
    before = _versions(vpy)
    cells = run(FAKE_COLAB, setup_source(), check)
    assert not [o for c in cells for o in c.outputs if o["output_type"] == "error"], cells
    printed = _cell_text(cells[1])
    assert "launch: installing optax==0.2.8 (" in printed and "launch: removing jax-cuda12-pjrt" in printed
    assert "setup_devices: 8 simulated CPU devices" in printed
    assert "jax 0.12.0.1 devices 8" in _cell_text(cells[2])
    after = _versions(vpy)
    changed = {n for n in before.keys() | after.keys() if before.get(n) != after.get(n)}
    assert changed == {"optax", "jax-cuda12-pjrt", "jax-cuda12-plugin"}, changed


def test_freeze_at_exit_registers_once_and_freezes_the_collector_when_the_process_exits():
    """The exit handler runs after every handler registered later (JAX's among them) and freezes the collector."""
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))  # runs after freeze_at_exit's\n"
        "from spmd_course.utils import launch\n"
        "first, again = launch.freeze_at_exit(), launch.freeze_at_exit()\n"
        "atexit.register(lambda: print('frozen before it:', gc.get_freeze_count() > 0))\n"
        "print('registered:', first, again, gc.get_freeze_count())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["registered: True False 0", "frozen before it: False", "frozen at exit: True"]
