"""Can this machine compile programs for a TPU it does not have?

JAX compiles ahead of time for a TPU topology with no TPU present (``topologies.get_topology_desc``, then
``jax.jit(f).lower(*structs).compile()``): a TPU executable whose HLO and memory can be read, not run. That
needs libtpu (Linux only). Before libtpu loads, :func:`tpu_compiler_available` sets, unless set:

- ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``: otherwise the first process to load libtpu holds its lockfile and every
  other one (a second kernel, pytest's notebooks) fails;
- ``TPU_MIN_LOG_LEVEL=3``: otherwise libtpu writes log files into ``/tmp/tpu_logs`` for every process; at
  level 3 it leaves none (libtpu 0.0.50.1 and 0.0.42.1). A lower ``TPU_STDERR_LOG_LEVEL`` lowers it.
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

    Checks that libtpu is installed and describes a ``v5e:2x4`` topology (its start-up warnings caught by
    ``quiet``, as a caller's topology call should be too), once per process. That starts no JAX backend, so
    it is harmless before or after ``setup_devices``.
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
