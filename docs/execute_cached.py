"""Execute notebooks into the book's execution cache, with the Python that runs this script.

    .venv-xla/bin/python docs/execute_cached.py [notebooks/NN_name.ipynb ...]

The book (``make book``: Sphinx + MyST-NB) executes the notebooks in the main environment and keeps
their outputs in a jupyter-cache under ``build/book/``. Notebook 24 needs torch_xla, which only
``.venv-xla`` has, so ``make book`` first runs this script there: the book then finds that notebook's
outputs in the cache, exactly as if it had executed it itself. Without arguments it runs the notebooks
listed in ``spmd_course.course.XLA_NOTEBOOKS``. A notebook already cached with the same code is not run again;
a notebook that raises stops the script with the error.

``docs/conf.py`` imports the helpers below, so the book and this script share one cache, one timeout and
one set of environment variables.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "book" / "jupyter_cache"
"""The book's execution cache (MyST-NB's ``nb_execution_cache_path``)."""
TIMEOUT = 120
"""Seconds a cell may take: the notebooks' budget is 30 s each, this allows for a loaded machine."""


def set_course_environment() -> None:
    """Give every kernel started from this process what ``make`` gives the notebooks.

    8 simulated CPU devices before JAX starts and a fixed hash seed. Values the caller already set (the
    Makefile exports them) are kept. The course's package, ``spmd_course``, is installed in the environment.
    """
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
    os.environ.setdefault("PYTHONHASHSEED", "0")


def is_cached(path: Path, cache: Path = CACHE) -> bool:
    """Whether ``cache`` holds outputs for the notebook's current code (what MyST-NB would reuse)."""
    if not (cache / "global.db").exists():
        return False
    import nbformat
    from jupyter_cache import get_cache

    try:
        get_cache(str(cache)).match_cache_notebook(nbformat.read(path, as_version=4))
    except KeyError:
        return False
    return True


def execute_into_cache(path: Path, cache: Path = CACHE) -> float:
    """Run the notebook in its own folder and store its outputs in ``cache``; returns the seconds taken.

    The same steps as MyST-NB's cache mode, so the book matches the record by the notebook's code.
    """
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from jupyter_cache.executors.utils import single_nb_execution

    nb = nbformat.read(path, as_version=4)
    result = single_nb_execution(nb, cwd=str(path.parent), timeout=TIMEOUT, allow_errors=False)
    if result.err is not None:
        raise SystemExit(f"{path.name} raised, so the book shows it without outputs:\n{result.exc_string}")
    get_cache(str(cache)).cache_notebook_bundle(
        CacheBundleIn(nb, str(path), data={"execution_seconds": result.time}), check_validity=False, overwrite=True
    )
    return result.time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: the notebooks that need torch_xla")
    parser.add_argument("--check", action="store_true",
                        help="execute nothing; fail unless the cache holds every notebook's outputs for its current "
                             "code (every notebook but those needing torch_xla where --skip-xla): after `make book`, "
                             "proof that the book executed them all without an error")
    parser.add_argument("--skip-xla", action="store_true", help="with --check: leave the torch_xla notebooks out")
    args = parser.parse_args()
    from spmd_course.course import XLA_NOTEBOOKS, notebooks

    if args.check:
        wanted = [p for p in notebooks(ROOT) if not (args.skip_xla and p.name in XLA_NOTEBOOKS)]
        missing = [p.name for p in wanted if not is_cached(p)]
        if missing:
            raise SystemExit(f"the book holds no executed outputs for {', '.join(missing)}: not executed, or raised")
        left_out = " (not those needing torch_xla)" if args.skip_xla else ""
        print(f"the book executed all {len(wanted)} notebooks{left_out}")
        return

    paths = [p.resolve() for p in args.notebooks] or [p for p in notebooks(ROOT) if p.name in XLA_NOTEBOOKS]
    set_course_environment()
    for path in paths:
        if is_cached(path):
            print(f"{path.name}: outputs already cached for this code")
        else:
            print(f"{path.name}: executing into {CACHE.relative_to(ROOT)} ...", flush=True)
            print(f"{path.name}: executed in {execute_into_cache(path):.1f} s")


if __name__ == "__main__":
    main()
