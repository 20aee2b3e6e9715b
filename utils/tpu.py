"""Can this machine compile programs for a TPU it does not have?

JAX compiles ahead of time for a TPU topology with no TPU present
(``jax.experimental.topologies.get_topology_desc(topology_name="v5e:2x4",
platform="tpu")``, then ``jax.jit(f).lower(*structs).compile()``): the result
is a real TPU executable whose HLO and ``memory_analysis()`` can be read, but
not run. That needs libtpu, the TPU compiler, which is published for Linux
only. :func:`tpu_compiler_available` says in one line whether it works here,
so a notebook cell can skip with the reason.

Loading libtpu without a TPU prints warnings on the C++ stderr (about
``TPU_ACCELERATOR_TYPE``, worker hostnames, an ``E0000`` line); wrap the
topology call in :func:`utils.capture.quiet` to keep them out of the notebook.

By default only one process on a machine may load libtpu: it holds
``/tmp/libtpu_lockfile`` until it exits, and every other process fails with
``ABORTED: Internal error when accessing libtpu multi-process lockfile`` (a
second notebook kernel, or the notebooks that ``pytest`` starts after its own
tests compiled for a topology). :func:`tpu_compiler_available` therefore sets
``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` (unless already set) before libtpu loads: a
process that sets it neither takes nor checks the lock. Call it before the
first ``get_topology_desc``.

libtpu also writes log files (``tpu_driver.<host>.<user>.log.INFO.<date>.<pid>``,
about 6 KB, plus WARNING and ERROR files; an ERROR file with a stack trace, here
up to 31 KB, when the process is stopped with SIGTERM, as a kernel can be) for every process
that loads it, into ``/tmp/tpu_logs`` unless ``TPU_LOG_DIR`` names another
folder. ``TPU_LOG_DIR=disabled`` does not stop them: the files then land in
``/tmp`` itself. ``TPU_MIN_LOG_LEVEL=3`` (log nothing below FATAL) does: with
it, a process that describes a topology and compiles for it, or is then
stopped with SIGTERM, leaves no file, on libtpu 0.0.50.1 and 0.0.42.1
(``TPU_MIN_LOG_LEVEL=2`` still writes files on SIGTERM, on 0.0.50.1; ``TPU_STDERR_LOG_LEVEL``
changes nothing on disk). :func:`tpu_compiler_available` sets it (unless set).
The level also silences libtpu's messages on stderr (the compiler's
"Involuntary full rematerialization" warning, which ``TPU_STDERR_LOG_LEVEL=1``
shows), so where ``TPU_STDERR_LOG_LEVEL`` asks for them, the minimum is
lowered to that level, and the log files come back with them. The start-up
warnings on stderr are printed before libtpu's logging starts, so they
appear whatever the level; ``quiet`` catches them.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import platform
import sys

from .capture import quiet

__all__ = ["tpu_compiler_available"]

_SYSTEMS = {"darwin": "macOS", "win32": "Windows"}


def _libtpu_version() -> str:
    for name in ("libtpu", "libtpu-nightly"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "(version unknown)"


def _set_log_level() -> None:
    """``TPU_MIN_LOG_LEVEL=3`` (FATAL only: no log files) unless set; lowered to ``TPU_STDERR_LOG_LEVEL`` if set."""
    level = os.environ.setdefault("TPU_MIN_LOG_LEVEL", "3")  # read when libtpu loads
    shown = os.environ.get("TPU_STDERR_LOG_LEVEL", "")
    if shown.isdigit() and level.isdigit() and int(shown) < int(level):
        os.environ["TPU_MIN_LOG_LEVEL"] = shown  # messages asked for on stderr are logged at all


@functools.cache
def tpu_compiler_available() -> tuple[bool, str]:
    """``(True, what)`` where TPU programs can be compiled here, else ``(False, why)``, each in one line.

    Checks that libtpu is installed and that a TPU topology can be described
    (``v5e:2x4``, with the start-up warnings caught by ``quiet``). The answer
    is computed once per process. Describing a topology does not start a JAX
    backend, so calling this before or after ``setup_devices`` is harmless.
    Sets ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` in this process's environment unless
    it is set already, so that other processes can compile for TPU
    topologies too, and ``TPU_MIN_LOG_LEVEL=3``, so that libtpu writes no
    log files (lower where ``TPU_STDERR_LOG_LEVEL`` asks for messages; see the
    module docstring).

    Example::

        ok, why = tpu_compiler_available()
        print(why)
        if ok:
            with quiet():
                topo = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")
    """
    if importlib.util.find_spec("libtpu") is None:
        if sys.platform != "linux":
            system = _SYSTEMS.get(sys.platform, platform.system() or sys.platform)
            return False, f"no TPU compiler here: libtpu is published for Linux only, and this is {system}"
        return False, (
            "no TPU compiler here: libtpu is not installed (pip install 'jax[tpu]' installs the libtpu "
            "that matches this jax)"
        )
    version = _libtpu_version()
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # read when libtpu loads: do not take its lock
    _set_log_level()
    try:
        from jax.experimental import topologies

        with quiet():
            topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")
    except Exception as err:  # any failure means: no TPU compiles here; say why in one line
        detail = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        if "lockfile" in detail:
            detail += (" (another process has loaded libtpu: set ALLOW_MULTIPLE_LIBTPU_LOAD=1 before anything "
                       "in this process loads libtpu, or restart the kernel)")
        return False, f"libtpu {version} is installed but cannot describe a TPU topology here: {detail}"
    return True, f"libtpu {version} compiles for TPU topologies here (ahead of time: programs compile, nothing runs)"
