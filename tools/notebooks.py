#!/usr/bin/env python3
"""Build, stamp and strip the course's notebooks.

    python tools/notebooks.py build SRC.py notebooks/NN_name.ipynb   # percent-format script -> notebook
    python tools/notebooks.py sync                                   # re-stamp badges + setup cell in all
    python tools/notebooks.py strip [PATH ...]                       # remove outputs and execution counts
    python tools/notebooks.py export notebooks/NN_name.ipynb         # notebook -> percent script on stdout
    python tools/notebooks.py readme                                 # rewrite README's table of notebooks

A notebook source in percent format separates cells with ``# %%`` (code) and
``# %% [markdown]`` (markdown; each line starts with ``# ``). The line
``# %% setup`` (or ``# %% setup 64`` for another device count) stands for the
course's setup cell, and the title cell's line ``{{badges}}`` for the launch
badges, both taken from ``utils/course.py``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from utils.course import badges_markdown, notebooks, setup_source, title_and_promise  # noqa: E402

BADGE_LINE = re.compile(r"^\[!\[Open in Colab\].*$", re.M)


def setup_devices_count(source: str) -> int | None:
    """The N of ``SETUP = setup_devices(N)`` in a setup cell, else None."""
    m = re.search(r"^SETUP = setup_devices\((\d+)\)$", source, re.M)
    return int(m.group(1)) if m else None


def _cell(kind: str, source: str) -> dict:
    cell: dict = {"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def parse_percent(text: str, name: str) -> list[dict]:
    cells: list[dict] = []
    kind, lines = None, []

    def flush() -> None:
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
            body = body.replace("{{badges}}", badges_markdown(name))
        cells.append(_cell(kind, body))

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            tag = line[4:].strip()
            if tag.split()[:1] == ["setup"]:  # "# %% setup" or "# %% setup 64" (device count)
                n = int(tag.split()[1]) if len(tag.split()) > 1 else 8
                cells.append(_cell("code", setup_source(n)))
                kind, lines = None, []
                continue
            kind, lines = ("markdown" if tag.startswith("[markdown]") else "code"), []
        elif kind is not None:
            lines.append(line)
    flush()
    return cells


def write(nb_cells: list[dict], path: Path) -> None:
    nb = {
        "cells": nb_cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    for i, cell in enumerate(nb["cells"]):
        cell["id"] = f"c{i:03d}"
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def build(src: Path, dst: Path) -> None:
    write(parse_percent(src.read_text(), dst.name), dst)
    print(f"wrote {dst} from {src}")


def strip(paths: list[Path]) -> None:
    for path in paths:
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
            cell["metadata"] = {}
        nb["metadata"] = {k: v for k, v in nb["metadata"].items() if k in ("kernelspec", "language_info")}
        nb["metadata"]["language_info"] = {"name": "python"}
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def export(path: Path) -> str:
    """The inverse of build: a percent-format script to edit, then build again."""
    nb = json.loads(path.read_text())
    out = []
    for cell in nb["cells"]:
        body = "".join(cell["source"])
        n = setup_devices_count(body)
        if cell["cell_type"] == "code" and n is not None and body == setup_source(n):
            out.append("# %% setup" + ("" if n == 8 else f" {n}"))
        elif cell["cell_type"] == "code":
            out.append("# %%\n" + body)
        else:
            body = BADGE_LINE.sub("{{badges}}", body)
            out.append("# %% [markdown]\n" + "\n".join(("# " + line).rstrip() for line in body.splitlines()))
    return "\n\n".join(out) + "\n"


def readme_table() -> str:
    rows = ["| # | notebook | what you learn | run it |", "|---|---|---|---|"]
    for path in notebooks():
        title, promise = title_and_promise(path)
        badges = badges_markdown(path.name)
        rows.append(f"| {path.name[:2]} | [{title}](notebooks/{path.name}) | {promise} | {badges} |")
    return "\n".join(rows)


def readme() -> None:
    path = ROOT / "README.md"
    text = path.read_text()
    start, end = "<!-- notebooks:start -->", "<!-- notebooks:end -->"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{readme_table()}\n{end}{tail}")
    print(f"rewrote the table of {len(notebooks())} notebooks in README.md")


def sync() -> None:
    for path in notebooks():
        nb = json.loads(path.read_text())
        cells = nb["cells"]
        title = "".join(cells[0]["source"])
        badges = badges_markdown(path.name)
        cells[0]["source"] = BADGE_LINE.sub(lambda _, b=badges: b, title).splitlines(keepends=True)
        n = setup_devices_count("".join(cells[1]["source"])) or 8
        cells[1]["source"] = setup_source(n).splitlines(keepends=True)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        print(f"synced {path.name}")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:] or ["help"]
    if cmd == "build" and len(args) == 2:
        build(Path(args[0]), Path(args[1]))
    elif cmd == "sync":
        sync()
    elif cmd == "export" and len(args) == 1:
        sys.stdout.write(export(Path(args[0])))
    elif cmd == "readme":
        readme()
    elif cmd == "strip":
        strip([Path(a) for a in args] or notebooks())
    else:
        print(__doc__)
        sys.exit(2)
