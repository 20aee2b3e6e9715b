"""Keep the notebooks honest: valid, stripped, same start, same anatomy, ruff-clean.

Executing them is nbmake's job (``pytest`` collects ``notebooks/`` too); this
checks what execution cannot: how they are committed and built.
"""

import json
import re
import subprocess
import sys

import pytest

from utils.course import ROOT, badges_markdown, notebooks, setup_source

NOTEBOOKS = notebooks()
IDS = [p.name for p in NOTEBOOKS]


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _text(cell):
    return "".join(cell["source"])


def test_there_are_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_setup.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_valid_json_and_outputs_stripped(path):
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name}: strip outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_title_with_badges_then_the_shared_setup_cell(path):
    cells = _cells(path)
    title = _text(cells[0])
    assert cells[0]["cell_type"] == "markdown"
    assert title.startswith(f"# {path.name[:2]} · "), "title must start with '# NN · '"
    assert badges_markdown(path.name) in title
    assert "**You will learn**" in title
    setup = _text(cells[1])
    n = int(re.search(r"setup_devices\((\d+)\)$", setup).group(1))
    assert cells[1]["cell_type"] == "code" and setup == setup_source(n), "run tools/notebooks.py sync"
    code_before = [c for c in cells[:1] if c["cell_type"] == "code"]
    assert not code_before, "no code may run before the setup cell"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_anatomy(path):
    markdown = "\n".join(_text(c) for c in _cells(path) if c["cell_type"] == "markdown")
    assert "## Exercises" in markdown
    assert "## Takeaways" in markdown
    assert re.search(r"\*\*Next:\*\* \[\d\d · .+\]\(\d\d_\w+\.ipynb\)", markdown), "link to the next notebook"
    code = "\n".join(_text(c) for c in _cells(path) if c["cell_type"] == "code")
    assert "assert " in code, "claims must be asserted"
    assert ".check(" in code, "exercises must check themselves"


@pytest.mark.parametrize("path", NOTEBOOKS[:-1], ids=IDS[:-1])
def test_next_link_points_at_the_next_notebook(path):
    following = NOTEBOOKS[NOTEBOOKS.index(path) + 1].name
    markdown = "\n".join(_text(c) for c in _cells(path) if c["cell_type"] == "markdown")
    assert f"]({following})" in markdown


def test_ruff_is_clean_on_notebooks_and_code():
    ruff = [sys.executable, "-m", "ruff"]
    r = subprocess.run([*ruff, "check", "--output-format=concise", str(ROOT)], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
