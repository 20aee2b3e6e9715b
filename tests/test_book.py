"""The readable edition of the course."""

import json
import subprocess
import sys

from utils.course import (
    ROOT,
)


def _tiny_notebook(path, title, promise, code):
    head = f"# {title}\n\n[![Open in Colab](x)](y)\n\n{promise}"
    cells = [{"cell_type": "markdown", "metadata": {}, "source": [head]},
             {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": [code]}]
    path.write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "P",
                                                                           "language": "python"}},
                                "nbformat": 4, "nbformat_minor": 5}))
    return path


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
