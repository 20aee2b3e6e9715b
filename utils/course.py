"""Facts about the course itself: where it lives, its notebooks, and the cells
every notebook starts with. Tests use these to keep every notebook consistent,
and ``tools/sync_notebooks.py`` writes them into the notebooks.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

__all__ = [
    "BRANCH",
    "REPO",
    "ROOT",
    "XLA_NOTEBOOKS",
    "badges_markdown",
    "binder_url",
    "colab_url",
    "needs_torch_xla",
    "notebooks",
    "runnable_here",
    "setup_source",
    "title_and_promise",
]

REPO = "spmd-course/spmd-sharding-course"
"""GitHub owner/name of the course: the one place the address is written."""
BRANCH = "main"
ROOT = Path(__file__).resolve().parent.parent


def notebooks() -> list[Path]:
    """The course's notebooks, in course order (their names start with the number)."""
    return sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


XLA_NOTEBOOKS = frozenset({"14_pytorch_xla.ipynb"})
"""Notebooks that need torch_xla, installed only in their own environment (.venv-xla: ``make test-xla``)."""


def needs_torch_xla(path: Path | str) -> bool:
    """True for a notebook that runs only where torch_xla is installed."""
    return Path(path).name in XLA_NOTEBOOKS


def runnable_here(path: Path | str) -> bool:
    """Whether this Python environment can execute the notebook (torch_xla present where it must be)."""
    return not needs_torch_xla(path) or importlib.util.find_spec("torch_xla") is not None


def colab_url(name: str) -> str:
    """'Open in Colab' address of a notebook, e.g. colab_url('00_setup.ipynb')."""
    return f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/notebooks/{name}"


def binder_url(name: str) -> str:
    """'Launch Binder' address that opens a notebook in JupyterLab."""
    return f"https://mybinder.org/v2/gh/{REPO}/{BRANCH}?urlpath=lab/tree/notebooks/{name}"


def badges_markdown(name: str) -> str:
    """The two launch badges a notebook (and its README row) carries."""
    return (
        f"[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(name)}) "
        f"[![Launch Binder](https://mybinder.org/badge_logo.svg)]({binder_url(name)})"
    )


def setup_source(n_devices: int = 8) -> str:
    """The setup cell: identical in every notebook (notebook 00 explains each line).

    On Colab, where the notebook arrives alone, it first fetches the course
    and installs its pinned requirements; everywhere it makes the course's
    utils importable and asks for the devices before JAX starts.
    """
    return f"""\
# Setup (the same cell opens every notebook; notebook 00 explains it).
import sys
from pathlib import Path

if "google.colab" in sys.modules and not Path("spmd-course").exists():
    !git clone -q --depth 1 https://github.com/{REPO} spmd-course
    %pip install -q -r spmd-course/requirements.txt
sys.path[:0] = [str(p) for p in (Path.cwd().parent, Path("spmd-course")) if (p / "utils").is_dir()]

from utils import setup_devices

SETUP = setup_devices({n_devices})"""


def title_and_promise(path: Path) -> tuple[str, str]:
    """A notebook's title (without its number) and the first sentence of its promise paragraph.

    The README's table and the HTML edition's index are built from these.
    """
    text = "".join(json.loads(Path(path).read_text())["cells"][0]["source"])
    title = text.splitlines()[0].lstrip("# ").split(" · ", 1)[-1].strip()
    paragraphs = [p for p in text.split("\n\n")[1:] if p.strip() and not p.strip().startswith("[![")]
    promise = " ".join(paragraphs[0].split()) if paragraphs else ""
    return title, re.split(r"(?<=[.!?])\s", promise, maxsplit=1)[0]
