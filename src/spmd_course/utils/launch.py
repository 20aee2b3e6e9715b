"""Ready a live notebook runtime (Colab, Binder) for the course without breaking it.

The setup cell calls :func:`prepare_runtime` before anything imports numpy, matplotlib or JAX, so this
module imports only the standard library and ``packaging``. Colab hands over a running kernel with older
packages, some imported: :func:`install_requirements` installs what is missing or off its specifier, never
the kernel's own packages, removes JAX plugins built for another jax, and asks for a restart when an
imported package changed. Binder's image is built from ``binder/requirements.txt``; at run time it gets
:func:`binder_memory_note`.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover - pip vendors packaging wherever pip is installed
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import InvalidVersion, Version

__all__ = [
    "BINDER_ENV", "KERNEL_PACKAGES", "RUNTIME_GROUPS", "Environment", "InstallError", "Installed", "RestartRequired",
    "binder_memory_note", "freeze_at_exit", "install_requirements", "mismatched_plugins", "plan_install",
    "prepare_runtime", "requirements", "version_note",
]

ROOT = Path(__file__).resolve().parents[3]  # the clone: src/spmd_course/utils/launch.py

KERNEL_PACKAGES = frozenset({
    # the running kernel and what it has loaded to talk to the frontend
    "ipykernel", "ipython", "traitlets", "comm", "debugpy", "matplotlib-inline",
    "jupyter-client", "jupyter-core", "pyzmq", "tornado",
    # the server and frontends a runtime brings (Colab's own package included)
    "jupyter-server", "jupyterlab", "notebook", "google-colab",
})
"""The runtime's kernel and server (canonical names): replaced under a live kernel they break it, so never installed."""

RUNTIME_GROUPS = ("tpu",)
"""``[dependency-groups]`` installed next to the dependencies on Colab and Binder: libtpu, for the TPU cells."""

_TESTED = ("jax", "jaxlib", "flax")  # pinned per Python line in pyproject; version_note names any that differ

BINDER_ENV = "SPMD_COURSE_RUNTIME"
"""Set to ``binder`` by ``binder/start``: how :func:`prepare_runtime` knows it runs on Binder."""

_PLUGIN = re.compile(r"^(?:jax-[a-z0-9]+-(?:plugin|pjrt)|libtpu|libtpu-nightly)$")
_RESTART = "restart the session (Runtime > Restart session) and run this cell again"
_restart_pending: str | None = None  # the message, once this kernel holds a package that has since changed
_freeze_registered = False  # freeze_at_exit has registered gc.freeze with atexit in this process


class _ShownPlainly(RuntimeError):
    """An error whose message is the whole story: IPython shows it without the traceback into this module."""

    def _render_traceback_(self) -> list[str]:  # IPython's hook for exceptions that draw themselves
        return [f"{type(self).__name__}: {self}"]


class InstallError(_ShownPlainly):
    """pip could not install or remove what the course needs; running the cell again retries."""


class RestartRequired(_ShownPlainly):
    """A package this kernel had imported has another version now; only a restart loads the new one."""


@dataclass(frozen=True)
class Installed:
    """What one :func:`install_requirements` call changed (all empty when everything was satisfied)."""

    installed: tuple[str, ...] = ()  # requirements handed to pip, e.g. ('jax==0.12.0.1', 'flax==0.12.12')
    removed: tuple[str, ...] = ()  # JAX plugins uninstalled because they belong to another jax
    kept: tuple[str, ...] = ()  # kernel packages a requirement asked to change, left as the runtime has them


class Environment:
    """The Python environment the installer inspects and changes: this interpreter's (tests pass a fake)."""

    def versions(self, names: Iterable[str] | None = None) -> dict[str, str]:
        """Installed distributions, canonical name -> version; the first on ``sys.path`` wins, as for import.

        ``names`` looks up only those, one by one: reading every distribution's metadata costs about 0.1 s of CPU.
        """
        found: dict[str, str] = {}
        if names is not None:
            for name in names:
                with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                    found[canonicalize_name(name)] = importlib.metadata.version(name)
            return found
        for dist in importlib.metadata.distributions():
            name = dist.metadata["Name"]
            if name:
                found.setdefault(canonicalize_name(name), dist.version)
        return found

    def requires(self, name: str) -> list[str]:
        """The installed distribution's requirement lines (extras included)."""
        try:
            return importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            return []

    def modules(self, name: str) -> set[str]:
        """Dotted names of the modules the installed distribution provides."""
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:
            return set()
        return _module_names(str(f) for f in files)

    def pip(self, args: list[str]) -> tuple[int, str]:
        """Run ``python -m pip ARGS`` for this interpreter; return its exit code and output."""
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
        try:
            run = subprocess.run([sys.executable, "-m", "pip", *args], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env)
        except OSError as err:
            return 1, f"could not start pip: {err}"
        return run.returncode, run.stdout


def requirements(pyproject: Path | str | None = None,
                 environment: Mapping[str, str] | None = None,
                 groups: Iterable[str] = ()) -> list[Requirement]:
    """The course's requirements that apply here: ``[project] dependencies`` with their markers evaluated.

    ``groups`` adds those ``[dependency-groups]`` (e.g. :data:`RUNTIME_GROUPS`) after the dependencies.
    ``environment`` overrides marker variables (``{"python_version": "3.12"}``) to ask about another Python.
    """
    path = Path(pyproject) if pyproject is not None else ROOT / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text())
        lines = list(data["project"]["dependencies"])
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist: pass the course's pyproject.toml") from None
    except (KeyError, TypeError):
        raise ValueError(f"{path} has no [project] dependencies list: it is not the course's pyproject.toml") from None
    for group in groups:
        entries = data.get("dependency-groups", {}).get(group)
        if not isinstance(entries, list):
            raise ValueError(f"{path} has no [dependency-groups] {group} list")
        lines += [entry for entry in entries if isinstance(entry, str)]  # (an include-group table is skipped)
    found = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement as err:
            raise ValueError(f"{path}: the dependency {line!r} is not a valid requirement ({err})") from None
        if req.marker is None or req.marker.evaluate(dict(environment) if environment else None):
            found.append(req)
    return found


def _satisfies(version: str | None, specifier: SpecifierSet) -> bool:
    if version is None:
        return False
    try:
        return specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _pip_argument(req: Requirement) -> str:
    """The requirement as pip takes it on the command line, without its (already evaluated) marker."""
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras} @ {req.url}" if req.url else f"{req.name}{extras}{req.specifier}"


def plan_install(reqs: Iterable[Requirement], installed: Mapping[str, str]) -> Installed:
    """Which requirements need pip (missing, or installed at a version outside their specifier).

    Kernel packages are never planned: they land in ``kept`` with the reason. Extras are taken on
    trust: a requirement with extras counts as satisfied when the base distribution is.
    """
    install, kept = [], []
    for req in reqs:
        name = canonicalize_name(req.name)
        have = installed.get(name)
        if _satisfies(have, req.specifier) and not req.url:
            continue
        if name in KERNEL_PACKAGES:
            kept.append(f"{name} {have or '(not installed)'}: the course asks {req.name}{req.specifier}")
        else:
            install.append(_pip_argument(req))
    return Installed(installed=tuple(install), kept=tuple(kept))


def mismatched_plugins(installed: Mapping[str, str], jax_requires: Iterable[str]) -> list[str]:
    """Installed JAX plugins that the installed jax does not declare as its own.

    A plugin (``jax-cuda12-plugin`` and its ``-pjrt`` half, ``jax-rocm*-*``, ``libtpu``) is built for one
    jaxlib, which pins it in its extras. JAX loads every plugin at start, even with ``jax_platforms="cpu"``,
    and one built for another jaxlib can abort the process. They are removed, not upgraded: on Colab's one
    accelerator the course runs on 8 simulated CPU devices anyway.
    """
    allowed: dict[str, list[SpecifierSet]] = {}
    for line in jax_requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        allowed.setdefault(canonicalize_name(req.name), []).append(req.specifier)
    mismatched = []
    for name, version in installed.items():
        if not _PLUGIN.match(name):
            continue
        specifiers = allowed.get(re.sub(r"-pjrt$", "-plugin", name), [])
        if not any(_satisfies(version, spec) for spec in specifiers):
            mismatched.append(name)
    return sorted(mismatched)


def _module_names(files: Iterable[str]) -> set[str]:
    """Dotted module names of a distribution's files (``numpy/linalg/__init__.py`` -> ``numpy.linalg``)."""
    names = set()
    for file in files:
        parts = file.replace("\\", "/").split("/")
        if parts[0] in ("..", "") or any(p.endswith((".dist-info", ".data")) or p == "__pycache__" for p in parts):
            continue
        last = parts[-1]
        if last.endswith(".py"):
            stem = last[:-3]
        elif last.endswith((".so", ".pyd")):
            stem = last.split(".", 1)[0]
        else:
            continue
        dotted = [*parts[:-1], stem] if stem != "__init__" else parts[:-1]
        if dotted and all(p.isidentifier() for p in dotted):
            names.add(".".join(dotted))
    return names


def _pip_failed(what: str, output: str) -> InstallError:
    """``what`` went wrong: run the cell again to retry; pip's last 12 lines."""
    last = "\n".join(output.strip().splitlines()[-12:])
    return InstallError(f"{what}; run this cell again to retry. pip's last lines:\n{last}")


def install_requirements(
    pyproject: Path | str | None = None,
    *,
    environment: Environment | None = None,
    imported: Collection[str] | None = None,
    quiet: bool = False,
) -> Installed:
    """Install what the course needs into this Python, as a live runtime (Colab) allows.

    Returns what changed. Raises :class:`InstallError` when pip fails (run again to retry) and
    :class:`RestartRequired` when a package this kernel had imported (``imported``, default
    ``sys.modules``) now has another version. ``environment`` stands in for this interpreter in tests.
    """
    global _restart_pending
    if _restart_pending:
        raise RestartRequired(_restart_pending)
    env = environment or Environment()
    loaded = set(imported if imported is not None else sys.modules)
    say = (lambda text: None) if quiet else (lambda text: print(text, flush=True))

    reqs = requirements(pyproject, groups=RUNTIME_GROUPS)
    before = env.versions()
    plan = plan_install(reqs, before)
    output = ""
    for note in plan.kept:
        say(f"launch: leaving {note} (it belongs to the runtime's kernel)")
    if plan.installed:
        say(f"launch: installing {' '.join(plan.installed)} (15 s to a minute)")
        with tempfile.TemporaryDirectory() as tmp:
            constraints = Path(tmp) / "kernel-packages.txt"
            constraints.write_text("".join(f"{k}=={before[k]}\n" for k in sorted(KERNEL_PACKAGES & before.keys())))
            code, output = env.pip(["install", "--upgrade-strategy", "only-if-needed",
                                    "--constraint", str(constraints), *plan.installed])
        importlib.invalidate_caches()  # let this kernel's imports see the new files
        if code != 0:
            raise _pip_failed(f"pip could not install {' '.join(plan.installed)} (exit {code})", output)
    after = env.versions() if plan.installed else before
    missing = plan_install(reqs, after).installed
    if missing:
        raise _pip_failed(f"pip finished, yet {' '.join(missing)} is still not installed as the course needs", output)

    removed_modules: dict[str, set[str]] = {}
    plugins = mismatched_plugins(after, env.requires("jax")) if "jax" in after else []
    if plugins:
        removed_modules = {name: env.modules(name) for name in plugins}
        say(f"launch: removing {' '.join(plugins)}: built for another jax; the course simulates 8 CPU devices")
        code, output = env.pip(["uninstall", "--yes", *plugins])
        if code != 0:
            raise _pip_failed(f"pip could not remove {' '.join(plugins)} (exit {code})", output)
        after = env.versions()

    changed = {name: (old, after.get(name)) for name, old in before.items() if after.get(name) != old}
    stale = sorted(name for name in changed
                   if not loaded.isdisjoint(removed_modules.get(name) or env.modules(name)))
    if stale:
        what = ", ".join(f"{name} {changed[name][0]} -> {changed[name][1] or 'removed'}" for name in stale)
        _restart_pending = f"This session had imported packages that have changed ({what}): {_RESTART}."
        raise RestartRequired(_restart_pending)
    return Installed(installed=plan.installed, removed=tuple(plugins), kept=plan.kept)


def binder_memory_note(proc: Path | str = "/proc") -> str:
    """One line on the notebook kernels alive in this session and the memory they hold, against Binder's limit.

    JupyterLab keeps each notebook's kernel alive (a few hundred MB once JAX runs), and Binder stops the whole
    session past ``MEM_LIMIT``, so the setup cell says what runs and what to close.
    """
    held, count = 0, 0
    for entry in Path(proc).glob("[0-9]*"):
        try:
            if b"ipykernel" in (entry / "cmdline").read_bytes():
                rss = re.search(r"^VmRSS:\s+(\d+)\s+kB", (entry / "status").read_text(), re.MULTILINE)
                held, count = held + (int(rss[1]) * 1024 if rss else 0), count + 1
        except OSError:  # the process ended while we looked
            continue
    limit = os.environ.get("MEM_LIMIT", "")
    of_limit = f" of this session's {int(limit) / 2**30:.1f} GiB" if limit.isdigit() else ""
    return (f"Binder: {count} notebook kernel{'s' if count != 1 else ''} running (this one included), holding "
            f"{held / 2**30:.1f} GiB{of_limit}; each open notebook keeps its kernel: finish one with File > Close "
            "and Shut Down Notebook before opening the next.")


def version_note(installed: Mapping[str, str] | None = None, pyproject: Path | str | None = None) -> str | None:
    """One line when jax, jaxlib or flax differ from pyproject's pins for this Python, else None.

    The course's figures were checked with those pins: another version may print others or fail an assert.
    ``installed`` (name -> version, default: this interpreter's) stands in for the environment in tests.
    """
    if installed is None:
        have = Environment().versions(_TESTED)
    else:
        have = {canonicalize_name(n): v for n, v in installed.items()}
    pins = {canonicalize_name(r.name): r.specifier for r in requirements(pyproject)}
    off = [f"{name} {have.get(name) or 'missing'} (tested: {str(pins[name]).removeprefix('==')})"
           for name in _TESTED if name in pins and not _satisfies(have.get(name), pins[name])]
    if not off:
        return None
    return (f"Untested versions for Python {platform.python_version()}: {', '.join(off)}. To get the tested ones, "
            "run `pip install -r requirements.txt` in the course's folder (or `make lab`), then restart the kernel.")


def freeze_at_exit() -> bool:
    """Make this interpreter skip the garbage collector's passes over live objects when it exits.

    A kernel that has imported jax, flax, optax and matplotlib tracks some 300,000 objects, and the full
    collections at shutdown take 0.4-0.9 s of CPU that a restart, a test and ``make bench`` wait for.
    ``gc.freeze``, registered as the *first* ``atexit`` handler (so it runs last, after JAX's clean-up), puts
    them out of the collector's reach; the other handlers still run, and Python never promised ``__del__``
    for objects alive at exit. Returns whether it registered the handler now (False if already registered).
    """
    global _freeze_registered
    if _freeze_registered:
        return False
    atexit.register(gc.freeze)
    _freeze_registered = True
    return True


def prepare_runtime() -> Installed | None:
    """The setup cell's first call: on Colab install what is missing, on Binder print the memory note.

    Elsewhere (``make lab``, CI, the book) it installs nothing: those environments are built from uv.lock.
    Everywhere it then prints :func:`version_note` if jax, jaxlib or flax are not the tested versions, and
    calls :func:`freeze_at_exit` (before JAX is imported, so that its handler runs after JAX's).
    """
    freeze_at_exit()
    done = None
    if "google.colab" in sys.modules:
        done = install_requirements()
    elif os.environ.get(BINDER_ENV) == "binder":
        print(binder_memory_note())
    note = version_note()
    if note:
        print(note)
    return done
