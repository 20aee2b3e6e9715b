"""The course's own facts: its address, its notebooks in order, the README and the interpreters it finds."""

import json
import re
import subprocess

import pytest

from utils.course import (
    BRANCH,
    REPO,
    ROOT,
    badges_markdown,
    binder_url,
    colab_url,
    notebooks,
    title_and_promise,
)


def test_urls_use_the_one_repository_constant():
    assert colab_url("00_setup.ipynb") == (
        f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/notebooks/00_setup.ipynb")
    assert binder_url("00_setup.ipynb") == (
        f"https://mybinder.org/v2/gh/{REPO}/{BRANCH}?urlpath=lab/tree/notebooks/00_setup.ipynb")
    badges = badges_markdown("00_setup.ipynb")
    assert colab_url("00_setup.ipynb") in badges and binder_url("00_setup.ipynb") in badges


def test_repository_address_is_written_nowhere_else():
    """Every launch badge and clone of the course, in README and notebooks, is derived from REPO."""
    hosts = r'colab\.research\.google\.com/github|mybinder\.org/v2/gh|"https://github\.com'
    pattern = rf"(?:{hosts})/([\w.-]+/[\w.-]+)"
    for path in [ROOT / "README.md", *notebooks()]:
        found = re.findall(pattern, path.read_text())
        assert found, f"{path.name} has no launch badge"
        for owner_repo in found:
            assert owner_repo == REPO, f"{path.name} names {owner_repo}, not utils.course.REPO"


def test_notebooks_are_in_course_order():
    names = [p.name for p in notebooks()]
    assert names[0] == "00_setup.ipynb"
    assert names == sorted(names)
    assert len({n[:2] for n in names}) == len(names), "two notebooks share a number"


def test_readme_lists_every_notebook_with_its_badges():
    readme = (ROOT / "README.md").read_text()
    for nb in notebooks():
        assert f"notebooks/{nb.name}" in readme, f"README has no row for {nb.name}"
        assert badges_markdown(nb.name) in readme
    assert "make lab" in readme and "make test" in readme


@pytest.mark.parametrize("line,expected", [("python3.11", "3.11"), ("python3", None)])
def test_find_python_resolves_interpreters(line, expected):
    r = subprocess.run([str(ROOT / "tools" / "find-python"), line], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    version = subprocess.run([r.stdout.strip(), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    assert expected is None or version == expected


def test_find_python_says_what_to_do_when_nothing_runs():
    r = subprocess.run([str(ROOT / "tools" / "find-python"), "python2.5"], capture_output=True, text=True)
    assert r.returncode == 1 and "PYTHON=/path/to/python" in r.stderr


def _tiny_notebook(path, title, promise, code):
    head = f"# {title}\n\n[![Open in Colab](x)](y)\n\n{promise}"
    cells = [{"cell_type": "markdown", "metadata": {}, "source": [head]},
             {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": [code]}]
    path.write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "P",
                                                                           "language": "python"}},
                                "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_title_and_promise(tmp_path):
    nb = _tiny_notebook(tmp_path / "07_x.ipynb", "07 · Tensor parallelism", "Split the kernels. Then more.", "1")
    assert title_and_promise(nb) == ("Tensor parallelism", "Split the kernels.")
