"""The notebook toolchain: jupytext pairing, stripping, stable cell ids, pre-commit, the README table."""

import json
import re
import shutil
import subprocess
import sys
import tomllib

import jupytext
import nbformat
import pytest
from jupytext.formats import guess_format

from utils.course import ROOT, notebooks, setup_source

TOOLS = ROOT / "tools" / "notebooks.py"
sys.path.insert(0, str(ROOT / "tools"))
import notebooks as tool  # noqa: E402

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
