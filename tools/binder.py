#!/usr/bin/env python3
"""Write ``binder/requirements.txt`` from pyproject.toml: ``python tools/binder.py`` (``make requirements`` runs it).

Binder builds its image from that file. It holds pyproject's ``[project] dependencies`` and the runtime
groups (``utils.launch.RUNTIME_GROUPS``: libtpu) with their markers, so whichever Python reads it gets its
own line, and none of the kernel's or server's packages: on Binder the kernel runs in the server's own
environment, and installing them would replace the server Binder built. tests/test_launch.py checks that
the file is up to date.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from utils.launch import KERNEL_PACKAGES, RUNTIME_GROUPS, canonicalize_name, requirements  # noqa: E402

LINES = ("3.11", "3.12", "3.13")  # the supported Pythons (pyproject's requires-python)
MACHINE = {  # the machine Binder builds for (binder/runtime.txt gives the Python)
    "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
    "implementation_name": "cpython", "platform_python_implementation": "CPython",
}


def binder_requirements(pyproject: Path | str | None = None, runtime: Path | str | None = None) -> str:
    """The text of ``binder/requirements.txt``: each line that applies to Binder's Linux x86_64 machine on a
    supported Python, markers kept, Binder's own Python (``binder/runtime.txt``) first and named in the header."""
    runtime_path = Path(runtime) if runtime is not None else ROOT / "binder" / "runtime.txt"
    match = re.fullmatch(r"python-(\d+)\.(\d+)", runtime_path.read_text().strip())
    if not match:
        raise ValueError(f"{runtime_path} must hold one line like 'python-3.12'")
    python = f"{match[1]}.{match[2]}"
    lines: dict[str, None] = {}
    for version in dict.fromkeys((python, *LINES)):
        markers = {**MACHINE, "python_version": version, "python_full_version": f"{version}.0"}
        for req in requirements(pyproject, markers, groups=RUNTIME_GROUPS):
            if canonicalize_name(req.name) not in KERNEL_PACKAGES:
                lines[str(req)] = None
    header = (f"# For Binder's Python {python} (binder/runtime.txt): pyproject.toml's [project] dependencies and its\n"
              f"# {' and '.join(RUNTIME_GROUPS)} group, markers kept (so any Python 3.11-3.13 gets its own line), "
              "written by\n# `python tools/binder.py` (tests/test_launch.py checks that they agree). Compute "
              "packages only:\n# Binder's Jupyter server and kernel stay as Binder built them.\n")
    return header + "".join(f"{line}\n" for line in lines)


if __name__ == "__main__":
    (ROOT / "binder" / "requirements.txt").write_text(binder_requirements())
    print(f"wrote {ROOT / 'binder' / 'requirements.txt'}")
