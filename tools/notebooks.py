#!/usr/bin/env python3
"""The two jobs jupytext and nbstripout do not do for this course.

    python tools/notebooks.py stamp     # write tools/course.py's badges and setup cell into every notebook
    python tools/notebooks.py readme    # rewrite README's table of notebooks

Each notebook ``notebooks/NN_name.ipynb`` is paired with ``notebooks/NN_name.py`` (percent format) by
jupytext (``[tool.jupytext]`` in pyproject.toml); ``make sync`` pairs and strips them, and the
pre-commit hooks do the same on every commit. ``stamp`` edits the ``.py`` sources (the launch badges
under each title, the shared setup cell as the second cell) and then lets jupytext bring each
``.ipynb`` up to date, so both stay paired. Run it after changing ``tools/course.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.course import badges_markdown, notebooks, setup_source, title_and_promise  # noqa: E402

CELL = re.compile(r"^# %%.*$", re.M)
SETUP_N = re.compile(r"^SETUP = setup_devices\((\d+)\)$", re.M)
BADGES = re.compile(r"^# (?:\[!\[Open in Colab\]|\*Runs locally only).*$", re.M)


def source_of(notebook: Path) -> Path:
    """The percent-format twin of a notebook."""
    return notebook.with_suffix(".py")


def stamp_source(text: str, name: str) -> str:
    """``text`` (a percent-format source) with the course's current badges and setup cell."""
    starts = [m.start() for m in CELL.finditer(text)] + [len(text)]
    if len(starts) < 3:
        raise ValueError(f"{name}: expected a title cell and the setup cell first")
    title, setup = text[starts[0] : starts[1]], text[starts[1] : starts[2]]
    badges = badges_markdown(name)
    if not BADGES.search(title):
        raise ValueError(f"{name}: the title cell has no launch-badge line to stamp")
    title = BADGES.sub(lambda _: "# " + badges if badges else "#", title, count=1)
    m = SETUP_N.search(setup)
    if not m:
        raise ValueError(f"{name}: the second cell is not the setup cell (SETUP = setup_devices(N))")
    setup = "# %%\n" + setup_source(int(m.group(1))) + "\n\n"
    return text[: starts[0]] + title + setup + text[starts[2] :]


def stamp() -> None:
    for path in notebooks():
        src = source_of(path)
        old = src.read_text()
        new = stamp_source(old, path.name)
        if new != old:
            src.write_text(new)
            print(f"stamped {src.relative_to(ROOT)}")
    paths = [str(p) for p in notebooks()]
    subprocess.run([sys.executable, "-m", "jupytext", "--sync", "--quiet", *paths], check=True)
    subprocess.run([sys.executable, "-m", "nbstripout", *paths], check=True)


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


if __name__ == "__main__":
    cmd = sys.argv[1:] or ["help"]
    if cmd == ["stamp"]:
        stamp()
    elif cmd == ["readme"]:
        readme()
    else:
        print(__doc__)
        sys.exit(2)
