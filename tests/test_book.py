"""The readable edition: the course as a Sphinx book (docs/, built by ``make book``).

One build of the real book with execution off checks its structure: every notebook in course order,
search, launch buttons, nothing fetched from the web. One executed build of two tiny notebooks, laid out
like the repository, checks that outputs and figures come out (as images, even under MPLBACKEND=Agg).
"""

import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spmd_course.course import ROOT, XLA_NOTEBOOKS, binder_url, colab_url, notebooks, title_and_promise

REMOTE_RESOURCE = re.compile(r"<(?:script|img)\b[^>]*\bsrc=\"https?:|<link\b[^>]*\bhref=\"https?:", re.I)


def run_sphinx(srcdir: Path, out: Path, *options: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Build HTML as ``make book`` does (-W: any warning fails)."""
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
           "-w", str(out / "warnings.txt"), *options, "-d", str(out / "doctrees"), str(srcdir), str(out / "html")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def sphinx_build(srcdir: Path, out: Path, *options: str, env: dict | None = None) -> Path:
    """Build HTML as ``make book`` does and return the HTML folder; fails on any warning."""
    html_dir, warnings = out / "html", out / "warnings.txt"
    result = run_sphinx(srcdir, out, *options, env=env)
    # Sphinx's warnings only: the kernels' own stderr (ipykernel, libtpu) goes to result.stderr too.
    assert result.returncode == 0 and not warnings.read_text(), warnings.read_text() or result.stderr[-5000:]
    return html_dir


def visible_text(page: str) -> str:
    """The page's text, with Sphinx's typographic apostrophes (don’t) written back as typed (don't)."""
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))).replace("\u2019", "'")


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Path:
    return sphinx_build(ROOT / "docs", tmp_path_factory.mktemp("book"), "-D", "nb_execution_mode=off")


def test_book_has_a_page_for_each_notebook_and_nothing_else(book):
    assert (book / "index.html").is_file()
    pages = sorted(p.stem for p in (book / "notebooks").glob("*.html"))
    assert pages == [p.stem for p in notebooks()], "the .py twins and conftest.py are not pages"


def test_index_lists_every_notebook_in_course_order_with_its_title(book):
    index = (book / "index.html").read_text()
    linked = re.findall(r'href="notebooks/([0-9]{2}_\w+)\.html"', index)
    in_order = list(dict.fromkeys(linked))
    assert in_order == [p.stem for p in notebooks()]
    text = visible_text(index)
    for path in notebooks():
        title = title_and_promise(path)[0].replace("`", "")
        assert f"{path.stem[:2]} · {title}" in text, title


def test_book_has_search(book):
    assert (book / "search.html").is_file() and (book / "searchindex.js").is_file()
    assert 'action="' in (book / "index.html").read_text() and "search.html" in (book / "index.html").read_text()


def test_notebook_pages_launch_that_notebook_on_colab_and_binder(book):
    for path in notebooks():
        page = (book / "notebooks" / f"{path.stem}.html").read_text()
        launch = [f'href="{colab_url(path.name)}"', f'href="{binder_url(path.name)}"']
        if path.name in XLA_NOTEBOOKS:
            assert not any(link in page for link in launch), f"{path.name} runs on neither Colab nor Binder"
            assert "no launch buttons" in visible_text(page) and "make lab-xla" in visible_text(page)
        else:
            assert all(link in page for link in launch), path.name


FOLDED_SETUP = re.compile(r'<div class="cell tag_hide-input[^"]*">\s*<details class="[^"]*\bhide above-input">'
                          r'(?:(?!</details>).)*# @title Setup: ', re.S)


def test_every_page_folds_the_setup_cells_source(book):
    """MyST-NB's hide-input tag: the setup cell's code behind a 'Show code cell source' toggle, its output shown."""
    for path in notebooks():
        page = (book / "notebooks" / f"{path.stem}.html").read_text()
        assert FOLDED_SETUP.search(page), f"{path.name}: the setup cell's source is not folded"


def test_book_fetches_nothing_from_the_web(book):
    for page in book.rglob("*.html"):
        found = REMOTE_RESOURCE.findall(page.read_text())
        assert not found, f"{page.relative_to(book)} loads {found} from the web: the book must read offline"


def test_links_between_notebooks_point_at_their_pages(book):
    first, second = notebooks()[:2]
    page = (book / "notebooks" / f"{first.stem}.html").read_text()
    assert f'href="{second.stem}.html"' in page


def _tiny_notebook(path: Path, title: str, markdown: str, code: str) -> None:
    badge = f"[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(path.name)})"
    cells = [
        {"cell_type": "markdown", "id": "title", "metadata": {}, "source": f"# {title}\n\n{badge}\n\n{markdown}"},
        {"cell_type": "code", "id": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": code},
    ]
    kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": kernelspec},
                                "nbformat": 4, "nbformat_minor": 5}))


def _miniature(tmp_path: Path) -> Path:
    """A repository in miniature: the book's docs/ (notebooks/ linked as in the repository) and an empty
    notebooks/; the course's package is the installed one."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", repo / "docs", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "notebooks").mkdir()
    return repo


@pytest.mark.slow
def test_a_cell_error_fails_the_book_and_the_check_names_the_notebook(tmp_path):
    """CI's notebook check on one line is the book (``make book``): a raising cell must fail the build, and
    ``execute_cached.py --check`` must then name the notebooks the book holds no outputs for."""
    repo = _miniature(tmp_path)
    _tiny_notebook(repo / "notebooks" / "00_a.ipynb", "00 · Fine", "Runs.", "print(6 * 7)")
    _tiny_notebook(repo / "notebooks" / "01_b.ipynb", "01 · Fine too", "Runs.", "print(7 * 6)")
    _tiny_notebook(repo / "notebooks" / "02_c.ipynb", "02 · Broken", "Raises.", "raise ValueError('cell error here')")
    result = run_sphinx(repo / "docs", tmp_path / "out")
    assert result.returncode != 0 and "02_c" in result.stdout + result.stderr, result.stderr[-3000:]
    check = subprocess.run([sys.executable, str(repo / "docs" / "execute_cached.py"), "--check"], capture_output=True,
                           text=True, timeout=120)
    assert check.returncode != 0 and "02_c.ipynb" in check.stderr and "00_a.ipynb" not in check.stderr, check.stderr


@pytest.mark.slow
def test_executed_book_shows_outputs_and_figures_as_images(tmp_path, monkeypatch):
    # Two notebooks that start like the course's, with its setup line.
    repo = _miniature(tmp_path)
    widget = "import ipywidgets\nfrom IPython.display import display\ndisplay(ipywidgets.IntSlider(3))\n"
    figure = ("import jax\nfrom spmd_course.utils import draw_mesh\n"
              "print(6 * 7)\ndraw_mesh(jax.make_mesh((1,), ('data',)))")
    figure = widget + figure
    _tiny_notebook(repo / "notebooks" / "00_a.ipynb", "00 · First", "Alpha promise, with $x^2$ in it.", figure)
    second_code = "import os\nprint('b ran', os.environ['BOOK_PROBE'])"
    _tiny_notebook(repo / "notebooks" / "01_b.ipynb", "01 · Second", "Back to [00](00_a.ipynb).", second_code)

    # As `make book` does for notebook 24 in .venv-xla: run a notebook into the cache beforehand; the book
    # must then show those outputs instead of running it again (BOOK_PROBE tells the two runs apart).
    spec = importlib.util.spec_from_file_location("execute_cached", ROOT / "docs" / "execute_cached.py")
    execute_cached = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(execute_cached)
    execute_into_cache, is_cached = execute_cached.execute_into_cache, execute_cached.is_cached

    cache, first_nb, second_nb = repo / "build" / "book" / "jupyter_cache", *sorted((repo / "notebooks").glob("*"))
    monkeypatch.setenv("BOOK_PROBE", "beforehand")
    execute_into_cache(second_nb, cache)
    assert is_cached(second_nb, cache) and not is_cached(first_nb, cache)

    env = {**os.environ, "BOOK_PROBE": "by the book",
           "MPLBACKEND": "Agg"}  # as some CI systems set it: figures must still be drawn
    out = sphinx_build(repo / "docs", tmp_path / "out", env=env)

    index = (out / "index.html").read_text()
    assert index.index('href="notebooks/00_a.html"') < index.index('href="notebooks/01_b.html"')
    assert "Alpha promise" in index
    first, second = (out / "notebooks" / "00_a.html").read_text(), (out / "notebooks" / "01_b.html").read_text()
    assert "42" in first, "pages are executed"
    images = re.findall(r'<img[^>]*src="(\.\./_images/[^"]+\.png)"', first)
    assert images and (out / "notebooks" / images[0]).is_file(), "figures are drawn as pictures"
    assert "Figure size" not in first, "a figure is an image, not its text representation"
    assert "<math" in first and "colab-badge" not in first
    assert "IntSlider(value=3)" in first and not REMOTE_RESOURCE.search(first), "a widget: its text, no CDN script"
    assert 'href="00_a.html"' in second
    assert "b ran beforehand" in second, "a notebook executed into the cache beforehand is not run again"
    assert is_cached(first_nb, cache), "the book keeps the outputs it computed in the cache"
