"""The course's own facts, its notebook tooling, and the README and binder that point at them."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from utils.course import (
    BRANCH,
    REPO,
    ROOT,
    badges_markdown,
    binder_url,
    colab_url,
    notebooks,
    setup_source,
    title_and_promise,
)

TOOLS = ROOT / "tools" / "notebooks.py"


def test_urls_use_the_one_repository_constant():
    assert colab_url("00_setup.ipynb") == (
        f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/notebooks/00_setup.ipynb")
    assert binder_url("00_setup.ipynb") == (
        f"https://mybinder.org/v2/gh/{REPO}/{BRANCH}?urlpath=lab/tree/notebooks/00_setup.ipynb")
    badges = badges_markdown("00_setup.ipynb")
    assert colab_url("00_setup.ipynb") in badges and binder_url("00_setup.ipynb") in badges


def test_repository_address_is_written_nowhere_else():
    """Every launch badge and clone of the course, in README and notebooks, is derived from REPO."""
    hosts = r"colab\.research\.google\.com/github|mybinder\.org/v2/gh|git clone [^\n]*github\.com"
    pattern = rf"(?:{hosts})/([\w.-]+/[\w.-]+)"
    for path in [ROOT / "README.md", *notebooks()]:
        found = re.findall(pattern, path.read_text())
        assert found, f"{path.name} has no launch badge"
        for owner_repo in found:
            assert owner_repo == REPO, f"{path.name} names {owner_repo}, not utils.course.REPO"


def test_setup_source_is_short_and_asks_for_devices():
    src = setup_source()
    assert src.endswith("SETUP = setup_devices(8)") and setup_source(64).endswith("setup_devices(64)")
    assert f"https://github.com/{REPO}" in src
    assert len(src.splitlines()) <= 15


def test_notebooks_are_in_course_order():
    names = [p.name for p in notebooks()]
    assert names[0] == "00_setup.ipynb"
    assert names == sorted(names)
    assert len({n[:2] for n in names}) == len(names), "two notebooks share a number"


def test_build_and_export_round_trip(tmp_path):
    src = tmp_path / "src.py"
    src.write_text("# %% [markdown]\n# # 99 · Demo\n#\n# {{badges}}\n\n# %% setup 64\n\n# %%\nx = 1\n")
    out = tmp_path / "99_demo.ipynb"
    subprocess.run([sys.executable, str(TOOLS), "build", str(src), str(out)], check=True, capture_output=True)
    nb = json.loads(out.read_text())
    assert [c["cell_type"] for c in nb["cells"]] == ["markdown", "code", "code"]
    assert badges_markdown("99_demo.ipynb") in "".join(nb["cells"][0]["source"])
    assert "".join(nb["cells"][1]["source"]) == setup_source(64)
    back = subprocess.run([sys.executable, str(TOOLS), "export", str(out)], check=True, capture_output=True,
                          text=True).stdout
    assert "# %% setup 64" in back and "{{badges}}" in back and "x = 1" in back


def test_strip_removes_outputs(tmp_path):
    nb = tmp_path / "01_x.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {"tags": []}, "source": ["1"],
                                         "execution_count": 3, "outputs": [{"output_type": "stream"}]}],
                              "metadata": {"kernelspec": {"name": "python3"}, "widgets": {}},
                              "nbformat": 4, "nbformat_minor": 5}))
    subprocess.run([sys.executable, str(TOOLS), "strip", str(nb)], check=True, capture_output=True)
    cell = json.loads(nb.read_text())["cells"][0]
    assert cell["outputs"] == [] and cell["execution_count"] is None


def test_tool_usage_errors_exit_nonzero():
    r = subprocess.run([sys.executable, str(TOOLS), "bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "build" in r.stdout


def test_binder_installs_the_course_requirements():
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.12"
    assert (ROOT / "binder" / "requirements.txt").read_text() == (ROOT / "requirements.txt").read_text()
    start = (ROOT / "binder" / "start").read_text()
    assert start.startswith("#!") and "JAX_NUM_CPU_DEVICES=8" in start and 'exec "$@"' in start


def test_readme_lists_every_notebook_with_its_badges():
    readme = (ROOT / "README.md").read_text()
    for nb in notebooks():
        assert f"notebooks/{nb.name}" in readme, f"README has no row for {nb.name}"
        assert colab_url(nb.name) in readme and binder_url(nb.name) in readme
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


def test_html_edition_has_an_index_and_links_every_page(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")  # as some CI systems set it: figures must still be drawn
    figure = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport jax\nfrom utils import draw_mesh\n"
              "print(6 * 7)\ndraw_mesh(jax.make_mesh((1,), ('data',)))")
    a = _tiny_notebook(tmp_path / "00_a.ipynb", "00 · First", "Alpha promise.", figure)
    b = _tiny_notebook(tmp_path / "01_b.ipynb", "01 · Second", "Beta promise.", "print('b')")
    out = tmp_path / "site"
    subprocess.run([sys.executable, str(ROOT / "tools" / "build_html.py"), "--out", str(out), str(a), str(b)],
                   check=True, capture_output=True, timeout=300)
    index = (out / "index.html").read_text()
    assert index.index('href="00_a.html"') < index.index('href="01_b.html"')
    assert "Alpha promise." in index and "01 · Second" in index
    first, second = (out / "00_a.html").read_text(), (out / "01_b.html").read_text()
    assert "42" in first, "pages are executed"
    assert "jp-RenderedImage" in first and "Figure size" not in first, "figures are drawn as pictures, not text"
    assert 'href="01_b.html"' in first and 'href="00_a.html"' in second and 'href="index.html"' in second
    assert 'src="https://cdnjs' not in first


def test_setup_cell_bootstraps_a_lone_notebook_like_colab(tmp_path, monkeypatch):
    """Run the real setup cell in a kernel that looks like Colab, in a folder without the course.

    `google.colab` is faked, and `git` is a stand-in that copies this checkout instead of
    cloning from GitHub (no network here). The cell must fetch the course, install its
    requirements (already satisfied in this environment) and import utils from the copy.
    """
    import nbformat
    from nbclient import NotebookClient

    shim = tmp_path / "bin"
    shim.mkdir()
    real_git = shutil.which("git")
    (shim / "git").write_text(  # stand-in for `git clone -q --depth 1 URL DEST`: copy the tracked files
        f'#!/bin/sh\nfor last; do :; done\nmkdir -p "$last" && dest=$(cd "$last" && pwd)\n'
        f'(cd "{ROOT}" && "{real_git}" ls-files -z | xargs -0 cp --parents -t "$dest")\n'
        f'echo "$@" > "$last/.cloned-with"\n')
    (shim / "git").chmod(0o755)
    work = tmp_path / "content"
    work.mkdir()
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import sys, types\n"
                                  "colab = sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
                                  "colab.output = sys.modules['google.colab.output'] = types.ModuleType('output')"),
        nbformat.v4.new_code_cell(setup_source()),
        nbformat.v4.new_code_cell("import utils, jax\nprint(utils.__file__, jax.device_count())"),
    ])
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    out = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert f"{work}/spmd-course/utils/__init__.py 8" in out
    assert f"https://github.com/{REPO}" in (work / "spmd-course" / ".cloned-with").read_text()
