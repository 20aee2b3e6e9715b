"""Facts about the course itself: where it lives, its notebooks, and what every notebook starts with
(launch badges, the setup cell). ``tools/notebooks.py stamp`` writes them into the notebooks, the book
(docs/conf.py) and the README table read them, and the tests keep every notebook consistent with them.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

__all__ = [
    "BADGES_LINE",
    "BRANCH",
    "HIDDEN_CELL",
    "REPO",
    "ROOT",
    "XLA_NOTEBOOKS",
    "badges_markdown",
    "binder_url",
    "colab_url",
    "launchable",
    "needs_torch_xla",
    "notebooks",
    "runnable_here",
    "setup_source",
    "title_and_promise",
]

REPO = "spmd-course/spmd-sharding-course"
"""GitHub owner/name of the course: the one place the address is written."""
BRANCH = "main"
ROOT = Path(__file__).resolve().parents[2]  # the clone: src/spmd_course/course.py


def notebooks(root: Path = ROOT) -> list[Path]:
    """The course's notebooks, in course order (their names start with the number), in the clone at ``root``."""
    return sorted(p for p in (Path(root) / "notebooks").glob("[0-9][0-9]_*.ipynb"))


XLA_NOTEBOOKS = frozenset({"24_pytorch_xla.ipynb"})
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


BADGES_LINE = re.compile(r"^(?:\[!\[Open in Colab\]|\*Runs locally only:\*).*$", re.MULTILINE)
"""Matches the line :func:`badges_markdown` writes under a title, whichever kind it is (to re-stamp it)."""


def launchable(name: str) -> bool:
    """Whether a notebook runs on Colab and Binder (those that need torch_xla run only locally)."""
    return not needs_torch_xla(name)


def badges_markdown(name: str) -> str:
    """The launch line a notebook (and its README row) carries under its title.

    The Colab and Binder badges, or for a notebook that needs torch_xla (its own 4 GB environment,
    which neither Colab nor Binder can hold next to JAX) a line that says how to run it locally.
    """
    if not launchable(name):
        return "*Runs locally only:* `make lab-xla` (PyTorch/XLA needs its own environment, about 4 GB)."
    return (
        f"[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(name)}) "
        f"[![Launch Binder](https://mybinder.org/badge_logo.svg)]({binder_url(name)})"
    )


HIDDEN_CELL = '# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]'
"""The percent-format header of a code cell whose source is out of sight and whose output stays: the setup
cell, and the cell of compiler figures that ends a section. JupyterLab hides the source
(``jupyter.source_hidden``), Colab shows the cell's ``# @title`` line as a form (``cellView``), and the book
(MyST-NB) puts the source behind a toggle (``hide-input``). Each such cell's first line is ``# @title ...``.
"""


def setup_source(n_devices: int = 8) -> str:
    """The setup cell: identical in every notebook (notebook 00 explains it). Plain Python, no magics.

    - It finds the course beside the notebook (``notebooks/..``) or in ``spmd-course/``. On Colab,
      where a notebook arrives alone, it clones the course into ``spmd-course.tmp`` and renames it
      once complete, so ``spmd-course/`` is never half there (an incomplete one is cloned again).
    - It puts that clone's package (``src/spmd_course``) first on ``sys.path``: the course's one path edit,
      for Colab and Binder, where nothing installs the package. Where ``make env`` (or pip) installed it,
      editable, that is the same folder, so the notebook always imports the clone it belongs to.
    - :func:`spmd_course.utils.launch.prepare_runtime` then installs on Colab what is missing (by versions; it
      says when the session must restart), prints the memory in use on Binder, and everywhere prints
      one line if jax, jaxlib or flax are not the tested versions. ``utils`` loads lazily, so nothing
      imports numpy or JAX before that.
    - :func:`spmd_course.utils.setup_devices` asks for the devices before JAX starts. ``CPU`` and ``RTOL`` name what
      the lessons ask of the backend it chose: whether compiler facts are the CPU compiler's, and how
      closely sharded float32 results match a single device (:class:`spmd_course.utils.devices.DeviceSetup`).
    """
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise ValueError(f"setup_source(n_devices) takes a whole number of devices, such as 8; got {n_devices!r}")
    return f"""\
# @title Setup: {n_devices} devices (the same cell opens every notebook; notebook 00 explains it)
import subprocess
import sys
from pathlib import Path

course = next((p for p in (Path.cwd().parent, Path("spmd-course")) if (p / "src" / "spmd_course").is_dir()), None)
if course is None and "google.colab" in sys.modules:  # a notebook alone on Colab: fetch the course, whole or not at all
    url, tmp = "https://github.com/{REPO}", "spmd-course.tmp"
    subprocess.run(["rm", "-rf", "spmd-course", tmp], check=True)
    git = subprocess.run(["git", "clone", "-q", "--depth", "1", url, tmp], capture_output=True, text=True)
    assert git.returncode == 0, f"could not fetch the course (is the network on?): {{git.stderr}}"
    course = Path(tmp).rename("spmd-course")
sys.path[:0] = [str(course.resolve() / "src")] if course else []  # the clone's package, spmd_course
from spmd_course.utils import launch, setup_devices

launch.prepare_runtime()  # Colab: installs what is missing. Binder: shows memory in use. Any: flags untested versions.
SETUP = setup_devices({n_devices})
CPU, RTOL = SETUP.cpu, SETUP.rtol  # compiler facts marked CPU are the CPU compiler's; RTOL: float32 tolerance"""


def title_and_promise(path: Path) -> tuple[str, str]:
    """A notebook's title (without its number) and the first sentence of its promise paragraph.

    A notebook opens with the problem, then a paragraph that starts "**You need:**", then the promise. The
    README's table and the book's landing page are built from these.
    """
    text = "".join(json.loads(Path(path).read_text())["cells"][0]["source"])
    title = text.splitlines()[0].lstrip("# ").split(" · ", 1)[-1].strip()
    paragraphs = [p for p in text.split("\n\n")[1:] if p.strip() and not BADGES_LINE.match(p.strip())]
    need = next((i for i, p in enumerate(paragraphs) if p.strip().startswith("**You need:**")), None)
    paragraphs = paragraphs if need is None else paragraphs[need + 1 :]
    promise = " ".join(paragraphs[0].split()) if paragraphs else ""
    return title, re.split(r"(?<=[.!?])\s", promise, maxsplit=1)[0]
