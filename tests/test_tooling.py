"""The notebook toolchain: jupytext pairing, stripping, cell ids, pre-commit, the README table, requirements.txt."""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib

import jupytext
import nbformat
import pytest
from jupytext.formats import guess_format

from course_support import find_uv
from course_support import tool as load_tool
from spmd_course.course import HIDDEN_CELL, ROOT, notebooks, setup_source

TOOLS = ROOT / "tools" / "notebooks.py"
tool = load_tool("notebooks")

NOTEBOOKS = notebooks()
IDS = [p.name for p in NOTEBOOKS]


def _inputs(nb):
    return [(c.cell_type, c.source) for c in nb.cells]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_and_its_percent_source_agree(path):
    """The .py twin is what reviewers read: it must hold exactly the notebook's cells."""
    src = path.with_suffix(".py")
    assert src.exists(), f"{src.name} missing: run `make sync`"
    assert guess_format(src.read_text(), ".py")[0] == "percent", (
        f"jupytext reads {src.name} as another format (IPython magics in a cell?), so pairing breaks")
    assert _inputs(jupytext.read(src)) == _inputs(nbformat.read(path, as_version=4)), (
        f"{path.name} and {src.name} differ: run `make sync`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_cell_ids_are_unique(path):
    ids = [c["id"] for c in json.loads(path.read_text())["cells"]]
    assert all(ids) and len(set(ids)) == len(ids)


def test_editing_a_source_keeps_every_other_cell_id(tmp_path):
    """Inserting a cell in the .py and syncing gives the new cell an id and renumbers nothing."""
    path = NOTEBOOKS[0]
    for suffix in (".ipynb", ".py"):
        shutil.copy(path.with_suffix(suffix), tmp_path / (path.stem + suffix))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")  # the pairing configuration
    nb_path, src = tmp_path / path.name, tmp_path / (path.stem + ".py")
    before = [c["id"] for c in json.loads(nb_path.read_text())["cells"]]
    text = src.read_text()
    second = [m.start() for m in re.finditer(r"^# %%", text, re.M)][2]
    src.write_text(text[:second] + "# %%\nx_new = 1\n\n" + text[second:])
    subprocess.run([sys.executable, "-m", "jupytext", "--sync", "--quiet", str(nb_path)], check=True, cwd=tmp_path)
    after = [c["id"] for c in json.loads(nb_path.read_text())["cells"]]
    assert len(after) == len(before) + 1
    assert after[:2] + after[3:] == before and after[2] not in before


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_outputs_are_stripped(path):
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name}: run `make strip`"


def test_stamp_replaces_badges_and_setup_cell():
    text = ("# %% [markdown]\n# # 99 · Demo\n#\n# [![Open in Colab](old)](old)\n#\n# Promise.\n\n"
            "# %%\n# an old setup cell\nSETUP = setup_devices(64)\n\n# %%\nx = 1\n")
    out = tool.stamp_source(text, "99_demo.ipynb")
    assert setup_source(64) in out and "an old setup cell" not in out and "(old)" not in out
    assert out.endswith("# %%\nx = 1\n") and "# Promise." in out
    assert tool.stamp_source(out, "99_demo.ipynb") == out, "stamping twice changes nothing"
    assert out.count(HIDDEN_CELL) == 1, "the setup cell's source is hidden"


def test_stamp_hides_the_source_of_titled_code_cells_only():
    text = ("# %% [markdown]\n# # 99 · Demo\n#\n# [![Open in Colab](a)](b)\n\n"
            "# %%\nSETUP = setup_devices(8)\n\n# %%\n# @title Compiler figures\nx = 1\n\n"
            "# %% tags=[\"save\"]\ny = 2\n\n# %% [markdown]\n# @title prose\n")
    out = tool.stamp_source(text, "99_demo.ipynb")
    assert out.count(HIDDEN_CELL) == 2 and f"{HIDDEN_CELL}\n# @title Compiler figures\nx = 1" in out
    assert '# %% tags=["save"]\ny = 2' in out and "# %% [markdown]\n# @title prose" in out
    assert tool.stamp_source(out, "99_demo.ipynb") == out


@pytest.mark.parametrize("text,complaint", [
    ("# %% [markdown]\n# # 99 · Demo\n\n# %%\nSETUP = setup_devices(8)\n\n# %%\nx = 1\n", "launch-badge"),
    ("# %% [markdown]\n# [![Open in Colab](a)](b)\n\n# %%\nimport jax\n\n# %%\nx = 1\n", "not the setup cell"),
    ("# %%\nx = 1\n", "title cell"),
])
def test_stamp_says_what_is_wrong(text, complaint):
    with pytest.raises(ValueError, match=complaint):
        tool.stamp_source(text, "99_demo.ipynb")


def test_every_source_is_stamped():
    for path in NOTEBOOKS:
        text = path.with_suffix(".py").read_text()
        assert tool.stamp_source(text, path.name) == text, f"{path.name}: run `python tools/notebooks.py stamp`"


def test_readme_table_is_current():
    readme = (ROOT / "README.md").read_text()
    assert tool.readme_table() in readme, "run `python tools/notebooks.py readme`"


def test_tool_usage_errors_exit_nonzero():
    r = subprocess.run([sys.executable, str(TOOLS), "bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "stamp" in r.stdout


def test_precommit_hooks_pair_strip_and_lint_at_the_locked_versions():
    config = (ROOT / ".pre-commit-config.yaml").read_text()
    locked = {p["name"]: p["version"] for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    pins = dict(re.findall(r'"([\w-]+)==([\w.]+)"', config))
    assert set(pins) == {"jupytext", "nbstripout", "ruff"}
    for name, version in pins.items():
        assert locked[name] == version, f"pre-commit pins {name}=={version}, uv.lock has {locked[name]}"
    r = subprocess.run([sys.executable, "-m", "pre_commit", "validate-config", ".pre-commit-config.yaml"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


# --- requirements.txt: pip's view of uv.lock ----------------------------------------------------------------------

MAKEFILE = (ROOT / "Makefile").read_text()


def _make_variable(name: str) -> str:
    """A `NAME := value` line of the Makefile, continuation lines joined."""
    match = re.search(rf"^{name} :?= ((?:.*\\\n)*.*)$", MAKEFILE, re.M)
    assert match, f"the Makefile defines no {name}"
    return " ".join(match[1].replace("\\\n", " ").split())


def test_requirements_txt_is_the_export_of_uv_lock(tmp_path):
    """requirements.txt is exactly what `make requirements` writes from uv.lock (uv's export under the
    recipe's line saying Windows is not supported); offline, no resolution.

    The export runs in a copy of pyproject.toml and uv.lock, with the Makefile's own arguments, so the
    header it writes (the command, ``-o requirements.txt`` included) must match too.
    """
    uv = find_uv()
    if uv is None:
        pytest.skip("no bootstrapped uv in <repo>/.uv: `make test` creates it (any make target that needs uv does)")
    pinned = _make_variable("UV_VERSION")
    version = subprocess.run([str(uv), "--version"], capture_output=True, text=True).stdout.split()[1]
    if version != pinned:
        pytest.skip(f"the uv found is {version}, the Makefile pins {pinned}: another uv may format the export "
                    "differently (`make clean` then `make test` bootstraps the pinned one)")
    args = _make_variable("REQUIREMENTS_EXPORT").split()
    assert args[:3] == ["export", "--frozen", "--offline"] and args[-2:] == ["-o", "requirements.txt"]
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copy(ROOT / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "VIRTUAL_ENV"))}
    r = subprocess.run([str(uv), *args], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    note = f"# {_make_variable('REQUIREMENTS_NOTE')}\n"  # the line the recipe puts above uv's own header
    assert "Windows" in note and (ROOT / "requirements.txt").read_text() == note + (
        tmp_path / "requirements.txt").read_text(), "requirements.txt is stale: run `make requirements`"


def _pins(python: str, platform: str = "linux") -> dict[str, str]:
    """requirements.txt's pins that apply to one Python on one platform, as pip would read them."""
    from packaging.requirements import Requirement

    env = {"python_version": python, "python_full_version": f"{python}.7", "sys_platform": platform,
           "implementation_name": "cpython"}
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line and not line.startswith((" ", "#", "-e ")):  # -e .: the course's own package, not a pin
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env):
                assert req.name not in pins, f"two lines for {req.name} on Python {python}"
                pins[req.name] = str(req.specifier).removeprefix("==")
    return pins


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
def test_requirements_txt_holds_each_line_and_what_make_lab_and_make_test_need(python):
    from spmd_course.utils.launch import requirements

    pins = _pins(python)
    line = {str(r.name): str(r.specifier).removeprefix("==")
            for r in requirements(environment={"python_version": python})}
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint"):
        assert pins[name] == line[name], f"Python {python}: requirements.txt pins {name} {pins[name]}"
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    for group in ("test", "lab", "tpu"):
        for entry in groups[group]:
            from packaging.requirements import Requirement

            req = Requirement(entry)
            if req.marker is None or req.marker.evaluate({"python_version": python, "sys_platform": "linux"}):
                assert pins[req.name] == str(req.specifier).removeprefix("=="), f"{group}: {entry}"
    assert "libtpu" not in _pins(python, "darwin"), "libtpu has Linux wheels only"
    assert not {"torch", "torch-xla", "sphinx", "myst-nb"} & pins.keys(), "notebook 24's and the book's stay out"
    assert "-e ." in (ROOT / "requirements.txt").read_text().splitlines(), "pip installs the course's package too"


def _make(*args):
    """make in the repository, free of the variables a calling make (`make test`) passes down."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"}}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=60)


def test_make_help_lists_every_target():
    makefile = (ROOT / "Makefile").read_text()
    targets = {t for line in re.findall(r"^\.PHONY:(.*)$", makefile, re.MULTILINE) for t in line.split()}
    shown = _make("help").stdout
    assert {"test", "test-slow", "clean", "lint", "test-xla"} <= targets
    missing = sorted(t for t in targets if not re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", shown))
    assert not missing, f"make help does not name {missing}"


def test_make_lock_rewrites_the_requirements_too():
    """What `make lock` runs (a dry run): the lock, then both requirements files."""
    dry = _make("-n", "lock")
    assert dry.returncode == 0, dry.stderr
    commands = dry.stdout.splitlines()
    exports = [c for c in commands if " export " in c and "-o requirements.txt" in c]
    assert any(c.endswith("uv lock") for c in commands) and exports and "tools/binder.py" in dry.stdout, dry.stdout
    assert commands.index(next(c for c in commands if c.endswith("uv lock"))) < commands.index(exports[0])


def test_help_and_clean_need_no_python_and_other_targets_say_so():
    no_python = "PYTHON=no-such-python"
    assert _make("help", no_python).returncode == 0
    dry = _make("-n", "clean", no_python)
    assert dry.returncode == 0 and ".ruff_cache" in dry.stdout and "__pycache__" in dry.stdout
    refused = _make("-n", "env", no_python)
    assert refused.returncode != 0 and "no supported Python" in refused.stderr
