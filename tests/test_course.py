"""The course's own facts: its address, its notebooks in order, the README and the interpreters it finds."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from spmd_course.course import (
    REPO,
    ROOT,
    badges_markdown,
    binder_url,
    colab_url,
    notebooks,
    title_and_promise,
)


def test_urls_use_the_one_repository_constant(monkeypatch):
    import spmd_course.course

    # The addresses' format as Colab and Binder answer it, for any repository and branch: the course's own
    # address is written once, in spmd_course.course.REPO, and not again here.
    monkeypatch.setattr(spmd_course.course, "REPO", "owner/name")
    monkeypatch.setattr(spmd_course.course, "BRANCH", "branch")
    assert colab_url("00_setup.ipynb") == (
        "https://colab.research.google.com/github/owner/name/blob/branch/notebooks/00_setup.ipynb")
    assert binder_url("00_setup.ipynb") == (
        "https://mybinder.org/v2/gh/owner/name/branch?urlpath=lab/tree/notebooks/00_setup.ipynb")
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
            assert owner_repo == REPO, f"{path.name} names {owner_repo}, not spmd_course.course.REPO"


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


FIND_PYTHON = str(ROOT / "tools" / "find-python")
SUPPORTED = {"3.11", "3.12", "3.13"}


def _version(python: str) -> str:
    return subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True).stdout.strip()


def _pyenv_has(version: str) -> bool:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    return shutil.which("pyenv") is not None and any((root / "versions").glob(f"{version}*/bin/python{version}"))


@pytest.mark.skipif(not (shutil.which("python3.11") or _pyenv_has("3.11")),
                    reason="no python3.11 on PATH or under pyenv here")
def test_find_python_resolves_python3_11():
    r = subprocess.run([FIND_PYTHON, "python3.11"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _version(r.stdout.strip()) == "3.11"


def test_find_python_default_is_a_tested_version():
    r = subprocess.run([FIND_PYTHON], capture_output=True, text=True)
    if r.returncode != 0:
        assert r.returncode == 1 and "PYTHON=/path/to/python" in r.stderr
        pytest.skip(f"no Python 3.11-3.13 here: {r.stderr.strip()}")
    assert _version(r.stdout.strip()) in SUPPORTED


def test_find_python_says_what_to_do_when_nothing_runs():
    r = subprocess.run([FIND_PYTHON, "python2.5"], capture_output=True, text=True)
    assert r.returncode == 1 and "PYTHON=/path/to/python" in r.stderr


def _fake_python(bindir: Path, name: str, version: str) -> Path:
    """An interpreter script that answers find-python's three questions as Python `version` would."""
    major, minor = (int(v) for v in version.split(".")[:2])
    code = 0 if (3, 11) <= (major, minor) <= (3, 13) else 3
    path = bindir / name
    path.write_text(f"""#!/bin/sh
case "$1" in
  -V) echo "Python {version}" ;;
  -c) case "$2" in *sys.exit*) exit {code} ;; *) echo "$0" ;; esac ;;
esac
""")
    path.chmod(0o755)
    return path


def _find_python_with(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "PYENV_ROOT": str(tmp_path / "no-pyenv"),
           "HOME": str(tmp_path)}
    return subprocess.run([FIND_PYTHON, *args], capture_output=True, text=True, env=env)


def test_find_python_skips_an_unsupported_python_with_a_note(tmp_path):
    (tmp_path / "bin").mkdir()
    _fake_python(tmp_path / "bin", "python3", "3.14.0")
    r = _find_python_with(tmp_path, "python3")
    assert r.returncode == 1 and r.stdout == ""
    assert "skipping" in r.stderr and "(Python 3.14.0)" in r.stderr and "3.11 to 3.13" in r.stderr
    assert "PYTHON=/path/to/python" in r.stderr

    good = _fake_python(tmp_path / "bin", "python3.12", "3.12.4")
    r = _find_python_with(tmp_path, "python3", "python3.12")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(good) and "(Python 3.14.0)" in r.stderr


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
    problem = "Kernels are 2 GB. One device is too small.\n\n**You need:** 07.\n\nSplit the kernels. Then more."
    nb = _tiny_notebook(tmp_path / "08_x.ipynb", "08 · Tensor parallelism", problem, "1")
    assert title_and_promise(nb) == ("Tensor parallelism", "Split the kernels."), "the promise comes after You need"
