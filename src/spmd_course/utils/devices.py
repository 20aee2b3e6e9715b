"""Give a notebook N devices for its meshes, before JAX starts.

JAX fixes its device list at its first operation, so every notebook's first code cell calls
:func:`setup_devices`: real accelerators where enough exist, else simulated CPU devices. Counting
accelerators starts a plugin in a child process (seconds, and libtpu warnings), so that runs only where a
plugin is installed *and* the machine shows hardware for it: the device files, PCI ids or TPU VM variables JAX checks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pkgutil
import platform
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DeviceCountError", "DeviceSetup", "assert_close", "setup_devices"]


class DeviceCountError(RuntimeError):
    """JAX already runs with another device count; only a kernel restart can change it."""


@dataclass(frozen=True)
class DeviceSetup:
    """What :func:`setup_devices` chose, and why."""

    count: int
    platform: str
    simulated: bool
    reason: str

    @property
    def cpu(self) -> bool:
        """Whether the notebook runs on CPU devices: some compiler facts are the CPU compiler's only."""
        return self.platform == "cpu"

    @property
    def rtol(self) -> float:
        """How closely a sharded float32 result matches a single-device one on this backend.

        Sharded and single-device runs sum in different orders. CPU float32 matmuls are exact float32
        (1e-5); GPUs (TF32) and TPUs (bf16 passes) multiply float32 at lower precision by default (1e-2).
        """
        return 1e-5 if self.cpu else 1e-2

    def __str__(self) -> str:
        kind = f"simulated {self.platform.upper()}" if self.simulated else self.platform.upper()
        import jax

        py = platform.python_version()
        return f"{self.count} {kind} devices ({self.reason}); jax {jax.__version__}, Python {py}"


_current: DeviceSetup | None = None


# What JAX itself looks at (jax/_src/hardware_utils.py): Google's PCI vendor id with a TPU device id,
# the NVIDIA device files, and AMD's KFD driver. Device ids as of jax 0.12 (v3 ... TPU8t).
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICE_IDS = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076", "0x0083",
                                 "0x007c"})
# Set on TPU VMs and GKE TPU nodes (libtpu reads them); JAX_FORCE_TPU_INIT makes JAX try libtpu regardless.
_TPU_ENV_VARS = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID", "JAX_FORCE_TPU_INIT")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _hardware_evidence(plugins: list[str], root: Path = Path("/"), environ: Mapping[str, str] | None = None
                       ) -> list[str]:
    """Cheap signs (device files, PCI ids, TPU VM variables) that an installed plugin has hardware to drive.

    Reads a few files under ``root`` and never starts JAX or a plugin: an installed libtpu (the course
    installs it to compile TPU programs ahead of time) is no reason to spend seconds starting it on a
    laptop. An unknown plugin counts as evidence of itself, so it is probed.
    """
    environ = os.environ if environ is None else environ
    dev = root / "dev"
    found: list[str] = []
    for plugin in plugins:
        name = plugin.lower()
        if "tpu" in name:
            found += [f"{var} is set" for var in _TPU_ENV_VARS if environ.get(var)]
            found += [str(p) for p in sorted(dev.glob("accel[0-9]*"))]  # TPU v2-v4 chips
            found += [str(p) for p in sorted((dev / "vfio").glob("[0-9]*"))]  # TPU v5e and later (VFIO groups)
            found += [f"TPU chip on PCI {d.name}" for d in sorted((root / "sys" / "bus" / "pci" / "devices").glob("*"))
                      if _read(d / "vendor") == _GOOGLE_PCI_VENDOR and _read(d / "device") in _TPU_PCI_DEVICE_IDS]
        elif "cuda" in name:
            found += [str(p) for p in [*sorted(dev.glob("nvidia[0-9]*")), dev / "nvidiactl", dev / "dxg"] if p.exists()]
        elif "rocm" in name:
            found += [str(p) for p in (dev / "kfd", dev / "dxg") if p.exists()]
        else:
            found.append(f"plugin {plugin} (its hardware cannot be checked cheaply)")
    return list(dict.fromkeys(found))


def _accelerator_plugins() -> list[str]:
    """Names of installed JAX accelerator plugins, found without starting JAX."""
    found = []
    if importlib.util.find_spec("libtpu") is not None:
        found.append("libtpu")
    with contextlib.suppress(ImportError):
        import jax_plugins  # namespace package used by the CUDA and ROCm plugins

        found += [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
    return found


def _probe_accelerators(timeout: float = 180.0) -> tuple[str, int, str]:
    """(platform, count, note) from a throwaway interpreter: starting JAX here would fix the CPU device count."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("JAX_PLATFORMS", None)
    code = "import jax; print(jax.default_backend(), jax.device_count())"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
        )
        backend, count = out.stdout.split()[-2:]
        return backend, int(count), ""
    except (subprocess.SubprocessError, ValueError, OSError) as err:
        return "cpu", 0, f"accelerator probe failed: {type(err).__name__}"


def _restart_message(have: int | None, want: int) -> str:
    have_text = f"{have} devices" if have is not None else "another device count"
    return (
        f"JAX has already started in this kernel with {have_text}, and the count can only be "
        f"chosen before the first JAX operation. To get {want} devices: restart the kernel "
        f"(Kernel > Restart Kernel) and run the setup cell first, with setup_devices({want})."
    )


def setup_devices(n: int = 8, *, quiet: bool = False) -> DeviceSetup:
    """Make ``jax.devices()`` return ``n`` devices and print one line saying which.

    ``n`` real accelerators (TPU/GPU) where at least ``n`` exist, otherwise ``n`` simulated CPU devices with
    the CPU the only platform, so ``jax.make_mesh`` works even beside one small accelerator (Colab's TPU
    v5e-1). Again with the same ``n`` is harmless; another ``n`` once JAX has started raises
    :class:`DeviceCountError`, which says to restart the kernel.

    On simulated CPU devices it also sets ``jax_disable_most_optimizations``: XLA's CPU backend then skips most
    LLVM optimisation of the machine code, a third to a half of the course's compile time. What the lessons
    read is made before that step: the optimised HLO, the buffer sizes and every ahead-of-time TPU compile.
    Only the last bits of a CPU result can differ.
    """
    global _current
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"setup_devices(n) takes a whole number of devices, such as 8; got {n!r}")
    if n < 1:
        raise ValueError(f"setup_devices(n) needs at least 1 device; got n={n}")

    if _current is not None:
        if _current.count != n:
            raise DeviceCountError(_restart_message(_current.count, n))
        if not quiet:
            print(f"setup_devices: {_current} (already set)")
        return _current

    import jax

    choice = _choose(n)
    if choice is None:  # n real accelerators: nothing to configure
        devices = jax.devices()
        setup = DeviceSetup(n, devices[0].platform, False, f"{len(devices)} found")
    else:
        try:
            jax.config.update("jax_platforms", "cpu")
            jax.config.update("jax_num_cpu_devices", n)
            jax.config.update("jax_disable_most_optimizations", True)  # CPU machine code only: see the docstring
        except RuntimeError as err:  # JAX raises this once backends are initialised
            raise DeviceCountError(_restart_message(jax.device_count(), n)) from err
        setup = DeviceSetup(n, "cpu", True, choice)

    have = jax.device_count()
    if setup.simulated and have != n:
        # Started earlier with the same config value (e.g. through XLA_FLAGS): nothing raised.
        raise DeviceCountError(_restart_message(have, n))
    _current = setup
    if not quiet:
        print(f"setup_devices: {setup}")
    return setup


def assert_close(actual: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None) -> None:
    """Assert that a sharded result equals its single-device reference, up to the backend's precision.

    ``rtol`` defaults to the tolerance of the devices :func:`setup_devices` chose (:attr:`DeviceSetup.rtol`).
    ``atol`` defaults to ``rtol`` times the reference's largest magnitude: summing in another order changes
    a result by rounding in proportion to the terms summed, not to the result, so an element that cancels
    to near zero would fail a purely relative test.
    """
    import numpy as np

    if rtol is None:
        if _current is None:
            raise RuntimeError("assert_close needs the devices' tolerance: run the setup cell "
                               "(setup_devices) first, or pass rtol=")
        rtol = _current.rtol
    expected = np.asarray(expected)
    if atol is None:
        atol = rtol * float(np.abs(expected).max()) if expected.size else 0.0
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=rtol, atol=atol)


def _choose(n: int) -> str | None:
    """None to use real accelerators, else the reason for simulated CPU devices."""
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return "JAX_PLATFORMS=cpu"
    plugins = _accelerator_plugins()
    if not plugins or not _hardware_evidence(plugins):
        return "no accelerator found"
    backend, count, note = _probe_accelerators()
    if note:
        return note
    if backend == "cpu":
        return "no accelerator found"
    if count >= n:
        return None
    return f"{count} {backend.upper()} device{'s' if count != 1 else ''} found, fewer than {n}"
