"""Notebook 24 (PyTorch/XLA side by side) runs only where torch_xla is installed.

torch-xla 2.9.0 needs torch 2.9.0, whose PyPI build is about 4 GB, so it lives in its own
environment, .venv-xla (`make test-xla`, `make lab-xla`). Elsewhere pytest does not collect
that notebook; naming it on the command line still runs it, and its first cell then says
how to run it. The header line of the test run says what was left out.
"""

from spmd_course.course import notebooks, runnable_here

collect_ignore = [p.name for p in notebooks() if not runnable_here(p)]


def pytest_report_header(config):
    if collect_ignore:
        names = ", ".join(f"notebooks/{n}" for n in collect_ignore)
        return f"{names}: not collected, torch_xla is not installed here (`make test-xla` runs it)"
    return None

