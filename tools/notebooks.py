#!/usr/bin/env python3
"""The two jobs jupytext and nbstripout do not do for this course.

    python tools/notebooks.py stamp     # write src/spmd_course/course.py's badges and setup cell into every notebook,
                                        # and hide the source of every code cell that opens with "# @title"
    python tools/notebooks.py readme    # rewrite README's table of notebooks
    python tools/notebooks.py save      # write the cells tagged "save" to src/spmd_course/models.py

Each notebook ``notebooks/NN_name.ipynb`` is paired with ``notebooks/NN_name.py`` (percent format) by
jupytext (``[tool.jupytext]`` in pyproject.toml); ``make sync`` pairs and strips them, and the
pre-commit hooks do the same on every commit. ``stamp`` edits the ``.py`` sources (the launch badges
under each title, the shared setup cell as the second cell) and then lets jupytext bring each
``.ipynb`` up to date, so both stay paired. Run it after changing ``src/spmd_course/course.py``.

``save`` keeps one copy of a program that several notebooks and tests use. A cell that defines it is
tagged in its notebook (``# %% tags=["save"]`` in the ``.py`` source); ``save`` writes every tagged cell,
in course order, to the module ``src/spmd_course/models.py``, with the imports those cells need (taken from the
notebook's own imports), and the others import it (``from spmd_course.models import ...``). Run it after
editing a tagged cell; ``tests/test_saved_code.py`` fails while the module is out of date.
"""

from __future__ import annotations

import ast
import builtins
import re
import subprocess
import sys
from pathlib import Path

from spmd_course.course import HIDDEN_CELL, ROOT, badges_markdown, notebooks, setup_source, title_and_promise

CELL = re.compile(r"^# %%.*$", re.M)
SETUP_N = re.compile(r"^SETUP = setup_devices\((\d+)\)$", re.M)
TITLED_CELL = re.compile(r"^# %%(?! \[markdown\]).*\n# @title", re.M)
"""A code cell that starts with a ``# @title`` line: the header :data:`HIDDEN_CELL` hides its source."""
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
    setup = HIDDEN_CELL + "\n" + setup_source(int(m.group(1))) + "\n\n"
    rest = TITLED_CELL.sub(lambda m: HIDDEN_CELL + "\n# @title", text[starts[2] :])
    return text[: starts[0]] + title + setup + rest


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


SAVED = ROOT / "src" / "spmd_course" / "models.py"
SAVE_TAG = "save"
SAVED_MODULE = "spmd_course.models"  # what a notebook imports the saved cells as


def _imports(tree: ast.Module) -> dict[str, tuple[str | None, str, str | None]]:
    """Bound name -> (module of a ``from`` import or None, imported name, alias) of each top-level import."""
    bound = {}
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = (module, alias.name, alias.asname)
    return bound


def _free_names(tree: ast.Module) -> set[str]:
    """Names the code reads but never binds anywhere in it (assignment, def, class, argument, import)."""
    loaded, bound = set(), set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add(node.asname or node.name.split(".")[0])
    return loaded - bound


def _top_level_names(tree: ast.Module) -> set[str]:
    """The names the module's own statements bind: def, class, assignment targets."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def saved_cells(source: str, name: str) -> tuple[list[str], list[str]]:
    """(the import lines the saved cells need, the sources of the cells tagged "save") of one notebook.

    ``source`` is the notebook's percent-format text. Raises ValueError when a saved cell reads a name that
    neither another saved cell nor one of the notebook's top-level imports binds: the module would not run.
    """
    import jupytext

    cells = jupytext.reads(source, fmt="py:percent").cells
    code = [c for c in cells if c.cell_type == "code"]
    saved = [c.source.strip() for c in code if SAVE_TAG in c.metadata.get("tags", [])]
    if not saved:
        return [], []
    imports = {}
    for cell in code:
        try:
            imports.update(_imports(ast.parse(cell.source)))
        except SyntaxError:  # a cell of IPython syntax binds nothing a saved cell can use
            continue
    wanted = sorted(_free_names(ast.parse("\n\n".join(saved))))
    missing = [n for n in wanted if n not in imports]
    if missing:
        raise ValueError(f"{name}: the cells tagged {SAVE_TAG!r} use {missing}, which no import of the notebook "
                         "and no saved cell defines; tag the cell that defines them too")
    plain, froms = set(), {}
    for n in wanted:
        module, imported, alias = imports[n]
        spelled = imported + (f" as {alias}" if alias else "")
        if module is None:
            plain.add(f"import {spelled}")
        else:
            froms.setdefault(module, set()).add(spelled)
    lines = sorted(plain) + [f"from {m} import {', '.join(sorted(froms[m]))}" for m in sorted(froms)]
    return lines, saved


def saved_module(sources: dict[str, str]) -> str:
    """The text of src/spmd_course/models.py for {notebook source name: its percent-format text}, in that order."""
    imports, parts, origins, owner = [], [], [], {}
    for name, text in sources.items():
        lines, cells = saved_cells(text, name)
        for defined in sorted(_top_level_names(ast.parse("\n\n".join(cells)))):  # one module: a second would shadow
            if owner.setdefault(defined, name) != name:
                raise ValueError(f"{name} and {owner[defined]} both save a top-level {defined!r}; rename one")
        if cells:
            origins.append(name)
            own = f"from {SAVED_MODULE} import "  # a name an earlier notebook saved is already in the module
            lines = [line for line in lines if not (line.startswith(own) and all(
                owner.get(n.split(" as ")[0].strip(), name) != name for n in line[len(own):].split(",")))]
            for line in lines:  # one line per module: two notebooks importing from it share the line
                module, _, names = line.removeprefix("from ").partition(" import ")
                if line.startswith("from ") and any(i.startswith(f"from {module} import ") for i in imports):
                    k = next(k for k, i in enumerate(imports) if i.startswith(f"from {module} import "))
                    merged = set(imports[k].split(" import ", 1)[1].split(", ")) | set(names.split(", "))
                    imports[k] = f"from {module} import {', '.join(sorted(merged))}"
                elif line not in imports:
                    imports.append(line)
            parts += [f"# --- from {name}\n{cell}" for cell in cells]
    if not parts:
        raise ValueError(f"no notebook has a cell tagged {SAVE_TAG!r}")
    header = (f'"""Code saved from the notebooks: {", ".join(origins)}. GENERATED, do not edit.\n\n'
              f"Each part is a notebook cell tagged {SAVE_TAG!r}. Edit the cell in its notebook, then run\n"
              "`python tools/notebooks.py save`; tests/test_saved_code.py fails while this file is out of date.\n"
              '"""\n')
    return header + "\n".join(imports) + "\n\n\n" + "\n\n\n".join(parts) + "\n"


def save() -> None:
    sources = {f"notebooks/{source_of(p).name}": source_of(p).read_text() for p in notebooks()}
    text = saved_module(sources)
    if not SAVED.is_file() or SAVED.read_text() != text:
        SAVED.write_text(text)
        print(f"wrote {SAVED.relative_to(ROOT)}")


if __name__ == "__main__":
    cmd = sys.argv[1:] or ["help"]
    if cmd == ["stamp"]:
        stamp()
    elif cmd == ["readme"]:
        readme()
    elif cmd == ["save"]:
        save()
    else:
        print(__doc__)
        sys.exit(2)
