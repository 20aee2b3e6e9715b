#!/usr/bin/env python3
"""Build the readable edition: execute every notebook and write static HTML with an index.

    python tools/build_html.py [--out site] [notebooks/NN_name.ipynb ...]

Writes ``site/index.html`` (title and one-line promise of each notebook, in
course order) and ``site/NN_name.html`` for each notebook, with previous / next /
index links at the top and bottom. Pictures are embedded, so the folder reads
offline in any browser. A notebook that raises stops the build.

Only notebooks this environment can run are executed (notebook 14 needs
torch_xla: ``make html`` runs this script again in .venv-xla for it); the index
and the links always cover the whole course.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from utils.course import notebooks, runnable_here, title_and_promise  # noqa: E402

NAV_STYLE = """
nav.course { display: flex; justify-content: space-between; margin: 1rem 0; padding: .6rem 1rem;
             background: #f3f4f6; border-radius: .4rem; font-family: system-ui, sans-serif; }
nav.course a { text-decoration: none; }
"""
STYLE = NAV_STYLE + """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
ol.toc li { margin: .7rem 0; } ol.toc .promise { color: #555; display: block; }
"""


def _nav(items: list[Path], i: int) -> str:
    prev = (f'<a href="{items[i - 1].stem}.html">&larr; {html.escape(items[i - 1].stem)}</a>'
            if i > 0 else "<span></span>")
    nxt = (f'<a href="{items[i + 1].stem}.html">{html.escape(items[i + 1].stem)} &rarr;</a>'
           if i + 1 < len(items) else "<span></span>")
    return f'<nav class="course">{prev}<a href="index.html">Contents</a>{nxt}</nav>'


def build(paths: list[Path], out: Path, course: list[Path]) -> None:
    """Execute and write ``paths``; the index and the links cover ``course``."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    out.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(template_name="lab")
    for path in paths:
        i = course.index(path)
        nb = nbformat.read(path, as_version=4)
        print(f"executing {path.name} ...", flush=True)
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        body, _ = exporter.from_notebook_node(nb)
        # The course uses no math and no widgets: drop the two CDN scripts so pages load offline cleanly.
        body = re.sub(r'<script[^>]*src="https://cdnjs[^"]*"[^>]*>\s*</script>', "", body)
        nav = _nav(course, i)
        body = body.replace("</head>", f"<style>{NAV_STYLE}</style></head>", 1)
        body = body.replace("</main>", f"{nav}</main>", 1) if "</main>" in body else body
        body = body.replace("<main>", f"<main>{nav}", 1) if "<main>" in body else body.replace(
            "<body>", f"<body>{nav}", 1)
        (out / f"{path.stem}.html").write_text(body)
    toc = []
    for path in course:
        title, promise = title_and_promise(path)
        toc.append(f'<li><a href="{path.stem}.html">{html.escape(path.stem[:2])} · {html.escape(title)}</a>'
                   f'<span class="promise">{html.escape(promise.replace("**", ""))}</span></li>')
    index = (f"<!doctype html><html><head><meta charset='utf-8'><title>SPMD sharding in JAX</title>"
             f"<style>{STYLE}</style></head><body><h1>SPMD automatic sharding in JAX</h1>"
             f"<p>Executed notebooks, in course order. Every claim is asserted by the code shown.</p>"
             f"<ol class='toc'>{''.join(toc)}</ol></body></html>")
    (out / "index.html").write_text(index)
    print(f"wrote {out / 'index.html'} ({len(course)} notebooks) and {len(paths)} notebook page(s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "site"))
    parser.add_argument("notebooks", nargs="*")
    args = parser.parse_args()
    given = [Path(p).resolve() for p in args.notebooks]
    # The index and the links cover every notebook of the folder; only the given ones (default: all) are run.
    course = sorted(given[0].parent.glob("[0-9][0-9]_*.ipynb")) if given else notebooks()
    paths = [p for p in (given or course) if runnable_here(p)]
    for skipped in sorted(set(given or course) - set(paths)):
        print(f"{skipped.name}: not executed here, needs torch_xla (make html runs it in .venv-xla)")
    build(paths, Path(args.out), course)


if __name__ == "__main__":
    main()
