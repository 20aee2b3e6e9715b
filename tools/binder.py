#!/usr/bin/env python3
"""Write ``binder/requirements.txt`` from the lock: ``python tools/binder.py`` (``make requirements`` runs it).

Binder builds its image from that file. It holds every package the course's compute needs, pinned as uv.lock
pins it: pyproject's ``[project] dependencies`` and the runtime groups (``utils.launch.RUNTIME_GROUPS``:
libtpu), and everything they depend on (read from uv.lock), each with the line and markers of
``requirements.txt`` (uv's export of the lock), so whichever Python reads it gets its own pins and an image
built next year installs what the course was tested with. It leaves out the kernel's and server's packages
(and what only they need): on Binder the kernel runs in the server's own environment, and installing them
would replace the server Binder built. tests/test_launch.py checks that the file is up to date.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from spmd_course.course import ROOT
from spmd_course.utils.launch import KERNEL_PACKAGES, RUNTIME_GROUPS, canonicalize_name, requirements

LINES = ("3.11", "3.12", "3.13")  # the supported Pythons (pyproject's requires-python)
MACHINE = {  # the machine Binder builds for (binder/runtime.txt gives the Python)
    "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
    "implementation_name": "cpython", "platform_python_implementation": "CPython",
}


def _closure(roots: set[str], lock: Path) -> set[str]:
    """The canonical names of ``roots`` and of everything they depend on in ``lock`` (uv.lock), whatever the
    markers, without going through the kernel's and server's packages."""
    graph: dict[str, set[str]] = {}
    for package in tomllib.loads(lock.read_text())["package"]:
        deps = graph.setdefault(canonicalize_name(package["name"]), set())
        deps.update(canonicalize_name(dep["name"]) for dep in package.get("dependencies", []))
    missing = sorted(roots - graph.keys())
    if missing:
        raise ValueError(f"{lock} has no {', '.join(missing)}: run `make lock` after changing pyproject.toml")
    found: set[str] = set()
    todo = [name for name in roots if name not in KERNEL_PACKAGES]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo.extend(dep for dep in graph[name] if dep not in KERNEL_PACKAGES)
    return found


def binder_requirements(pyproject: Path | str | None = None, runtime: Path | str | None = None,
                        lock: Path | str | None = None, export: Path | str | None = None) -> str:
    """The text of ``binder/requirements.txt``: the lines of ``export`` (requirements.txt, uv's export of
    ``lock``) for the packages the course's compute needs on Binder's Linux x86_64 machine on a supported Python
    (``pyproject``'s dependencies and runtime groups, and their dependencies in ``lock``), markers kept, less the
    kernel's and server's packages; Binder's own Python (``binder/runtime.txt``) is named in the header."""
    runtime_path = Path(runtime) if runtime is not None else ROOT / "binder" / "runtime.txt"
    match = re.fullmatch(r"python-(\d+)\.(\d+)", runtime_path.read_text().strip())
    if not match:
        raise ValueError(f"{runtime_path} must hold one line like 'python-3.12'")
    python = f"{match[1]}.{match[2]}"
    roots: set[str] = set()
    for version in dict.fromkeys((python, *LINES)):
        markers = {**MACHINE, "python_version": version, "python_full_version": f"{version}.0"}
        roots.update(canonicalize_name(req.name) for req in requirements(pyproject, markers, groups=RUNTIME_GROUPS))
    needed = _closure(roots, Path(lock) if lock is not None else ROOT / "uv.lock")
    export_path = Path(export) if export is not None else ROOT / "requirements.txt"
    pins = [line for line in export_path.read_text().splitlines()
            if line and not line[0].isspace() and not line.startswith("#")
            and canonicalize_name(re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0]) in needed]
    pinned = {canonicalize_name(re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0]) for line in pins}
    if needed - pinned:
        raise ValueError(f"{export_path} lacks {', '.join(sorted(needed - pinned))}: run `make requirements`")
    header = (f"# For Binder's Python {python} (binder/runtime.txt): the course's compute packages, pyproject.toml's\n"
              f"# [project] dependencies and {' and '.join(RUNTIME_GROUPS)} group with everything they depend on, "
              "pinned as\n# uv.lock pins them (the lines of requirements.txt, markers kept, so Python 3.11-3.13 "
              "each get\n# their own pins). Written by `python tools/binder.py` (tests/test_launch.py checks that "
              "they\n# agree). Binder's Jupyter server and kernel stay as Binder built them.\n")
    return header + "".join(f"{line}\n" for line in pins)


if __name__ == "__main__":
    (ROOT / "binder" / "requirements.txt").write_text(binder_requirements())
    print(f"wrote {ROOT / 'binder' / 'requirements.txt'}")
