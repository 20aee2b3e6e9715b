"""Keep the notebooks honest: valid, stripped, same start, same anatomy, ruff-clean.

Executing them is nbmake's job (``pytest`` collects ``notebooks/`` too); this
checks what execution cannot: how they are committed and built.
"""

import ast
import json
import re
import subprocess
import sys

import nbformat
import pytest

from spmd_course.course import BADGES_LINE, ROOT, badges_markdown, notebooks, setup_source

NOTEBOOKS = notebooks()
IDS = [p.name for p in NOTEBOOKS]


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _text(cell):
    return "".join(cell["source"])


def test_there_are_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_setup.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_valid_notebook_format(path):
    nbformat.validate(nbformat.read(path, as_version=4))  # raises ValidationError on a malformed notebook


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_title_with_badges_then_the_shared_setup_cell(path):
    cells = _cells(path)
    title = _text(cells[0])
    assert cells[0]["cell_type"] == "markdown"
    assert title.startswith(f"# {path.name[:2]} · "), "title must start with '# NN · '"
    assert badges_markdown(path.name) in title  # may be empty: a notebook that runs only locally has none
    assert "**You will learn**" in title
    setup = _text(cells[1])
    n = int(re.search(r"^SETUP = setup_devices\((\d+)\)$", setup, re.M).group(1))
    assert cells[1]["cell_type"] == "code" and setup == setup_source(n), "run `python tools/notebooks.py stamp`"
    assert cells[1]["metadata"] == HIDDEN, "the setup cell's source is out of sight in JupyterLab, Colab and the book"


# What spmd_course.course.HIDDEN_CELL writes into a notebook: JupyterLab, Colab and MyST-NB each hide the source.
HIDDEN = {"colab": {"cellView": "form"}, "jupyter": {"source_hidden": True}, "tags": ["hide-input"]}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_a_cell_is_hidden_exactly_when_it_opens_with_a_title(path):
    """A code cell that opens with '# @title' (Colab's form title) has its source hidden everywhere, and only
    such a cell: a reader always sees a title where code is out of sight."""
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] != "code":
            assert not {"jupyter", "colab"} & set(cell["metadata"]), f"{path.name} cell {i}"
            continue
        titled = _text(cell).startswith("# @title ")
        hidden = {k: cell["metadata"].get(k) for k in ("colab", "jupyter")}
        stamped = hidden == {k: HIDDEN[k] for k in hidden}
        assert stamped == titled, f"{path.name} cell {i}: run tools/notebooks.py stamp"
        assert ("hide-input" in cell["metadata"].get("tags", [])) == titled, f"{path.name} cell {i}"


SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!\bvs)[.!?](?=\s|$)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_opens_with_the_problem_then_what_you_need_then_the_promise(path):
    """Under the title: two sentences of the problem, with a number the notebook later measures; a line that
    starts '**You need:**' (the notebooks and JAX features it builds on); the promise; 'You will learn'."""
    title = _text(_cells(path)[0])
    paragraphs = [p.strip() for p in title.split("\n\n")[1:] if p.strip() and not BADGES_LINE.match(p.strip())]
    assert len(paragraphs) >= 4, f"{path.name}: problem, You need, promise, You will learn"
    problem, need, promise, learn = paragraphs[:4]
    assert len(SENTENCE_END.findall(problem)) == 2, f"{path.name}: the problem is two sentences: {problem!r}"
    assert re.search(r"\d", problem), f"{path.name}: the problem carries a number that the notebook measures"
    assert need.startswith("**You need:**") and len(need.split()) > 4, f"{path.name}: {need!r}"
    assert not promise.startswith("**") and learn.startswith("**You will learn**"), path.name


def _cpu_gated_asserts(source: str) -> int:
    """Asserts that run only on one kind of backend: inside an `if` whose test reads `CPU`."""
    gated = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and any(isinstance(n, ast.Name) and n.id == "CPU" for n in ast.walk(node.test)):
            gated += sum(isinstance(n, ast.Assert) for part in node.body + node.orelse for n in ast.walk(part))
    return gated


def test_cpu_gated_asserts_are_counted():
    assert _cpu_gated_asserts("if CPU:\n    assert a\nelse:\n    assert b\nassert c\n") == 2
    assert _cpu_gated_asserts("if x and not CPU:\n    for i in y:\n        assert i\n") == 1
    assert _cpu_gated_asserts("assert a == (1 if CPU else 2)\nif x:\n    assert a\n") == 0


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_backend_specific_figures_sit_in_one_hidden_cell_at_the_end_of_their_section(path):
    """A visible cell states each claim with asserts that hold on every backend; a backend's exact figures
    (asserts under `if CPU:`) go in a cell that opens with '# @title', hidden, still run, and last in its
    section: the next cell starts a new section (or the notebook ends), and a section has one such cell."""
    cells = _cells(path)
    hidden_in_section = 0
    for i, cell in enumerate(cells[2:], start=2):
        text = _text(cell)
        if cell["cell_type"] == "markdown":
            if text.startswith("## "):
                hidden_in_section = 0
            continue
        if not text.startswith("# @title "):
            assert _cpu_gated_asserts(text) == 0, f"{path.name} cell {i}: move the `if CPU:` asserts to the " \
                "section's hidden cell of exact figures"
            continue
        hidden_in_section += 1
        assert hidden_in_section == 1, f"{path.name} cell {i}: one hidden cell per section"
        following = cells[i + 1] if i + 1 < len(cells) else None
        assert following is None or (following["cell_type"] == "markdown" and _text(following).startswith("## ")), \
            f"{path.name} cell {i}: a hidden cell of exact figures ends its section"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_anatomy(path):
    """Sections, then the takeaways, then the exercises (so they work as review), then the link to the next one."""
    markdown = "\n".join(_text(c) for c in _cells(path) if c["cell_type"] == "markdown")
    heads = re.findall(r"^## (Takeaways|Exercises)\b", markdown, flags=re.M)
    assert heads == ["Takeaways", "Exercises"], f"{path.name}: takeaways, then exercises; found {heads}"
    link = re.search(r"\*\*Next:\*\* \[\d\d · .+\]\(\d\d_\w+\.ipynb\)", markdown)
    assert link, "link to the next notebook"
    assert link.start() > markdown.index("## Exercises"), f"{path.name}: the link to the next notebook comes last"
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


# The course teaches its subject; it never argues with the documents it grew from, which the learner never sees.
SOURCE_MENTIONS = re.compile(
    r"\bthe seed\b|\bseed(?:'s)? (?:guide|document|text|snippet|table|claim|rule|code)|seeded (?:this|the) course"
    r"|\bthe guide\b|\bthe guide's\b|facts §|jax-sharding-facts|teaching-anchors|\bshared/(?:seeds|reference)",
    re.IGNORECASE,
)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_notebook_names_its_source_documents(path):
    text = "\n".join(_text(c) for c in _cells(path))
    found = sorted({m.group(0) for m in SOURCE_MENTIONS.finditer(text)})
    assert not found, f"{path.name} mentions its source documents: {found}"


def test_the_source_pattern_catches_what_it_must_and_spares_random_seeds():
    for text in ("The seed claims", "the guide's table", "facts §8", "the guide that seeded this course"):
        assert SOURCE_MENTIONS.search(text), text
    for text in ("jax.random.key(seed)", "a fixed random seed", "the Flax guide to NNX"):
        assert not SOURCE_MENTIONS.search(text), text


KERNEL_METADATA = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_metadata_names_the_python_kernel_and_nothing_else(path):
    # The kernelspec lets JupyterLab, nbmake and the book (MyST-NB's lexer) pick Python; jupytext's pairing
    # lives in pyproject.toml, so a notebook converted without it carries only this.
    assert json.loads(path.read_text())["metadata"] == KERNEL_METADATA, "copy the metadata of another notebook"
