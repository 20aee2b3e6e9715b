"""Give a notebook N devices for its meshes, before JAX starts.

JAX fixes its device list the first time any JAX operation runs. The course
needs 8 devices everywhere: real accelerators where at least 8 exist, otherwise
8 simulated CPU devices (``jax_num_cpu_devices``). That choice must be made
before the first operation, so every notebook calls :func:`setup_devices`
in its first code cell.
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil
import platform
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["DeviceCountError", "DeviceSetup", "setup_devices"]


class DeviceCountError(RuntimeError):
    """JAX already runs with another device count; only a kernel restart can change it."""


@dataclass(frozen=True)
class DeviceSetup:
    """What :func:`setup_devices` chose, and why."""

    count: int
    platform: str
    simulated: bool
    reason: str

    def __str__(self) -> str:
        kind = f"simulated {self.platform.upper()}" if self.simulated else self.platform.upper()
        import jax

        py = platform.python_version()
        return f"{self.count} {kind} devices ({self.reason}); jax {jax.__version__}, Python {py}"


_current: DeviceSetup | None = None


def _accelerator_plugins() -> list[str]:
    """Names of installed JAX accelerator plugins, found without starting JAX."""
    found = []
    if importlib.util.find_spec("libtpu") is not None:
        found.append("libtpu")
    try:
        import jax_plugins  # namespace package used by the CUDA and ROCm plugins

        found += [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
    except ImportError:
        pass
    return found


def _probe_accelerators(timeout: float = 180.0) -> tuple[str, int, str]:
    """Count accelerators in a child process, so this process can still choose.

    Returns (platform, count, note). Starting JAX here would freeze the CPU
    device count, so the question is asked in a throwaway interpreter.
    """
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


def setup_devices(n: int = 8, *, prefer: str = "auto", quiet: bool = False) -> DeviceSetup:
    """Make ``jax.devices()`` return ``n`` devices and print one line saying which.

    - ``n`` real accelerators (TPU/GPU) where at least ``n`` exist;
    - otherwise ``n`` simulated CPU devices, with the CPU made the only platform,
      so ``jax.make_mesh`` works unchanged even where one small accelerator exists
      (Colab's TPU v5e-1 shows one device).

    ``prefer="cpu"`` skips accelerators. Calling it again with the same ``n`` is
    harmless (re-running the cell); another ``n`` once JAX has started raises
    :class:`DeviceCountError`, which says to restart the kernel.
    """
    global _current
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"setup_devices(n) takes a whole number of devices, such as 8; got {n!r}")
    if n < 1:
        raise ValueError(f"setup_devices(n) needs at least 1 device; got n={n}")
    if prefer not in ("auto", "cpu"):
        raise ValueError(f"prefer must be 'auto' or 'cpu'; got {prefer!r}")

    if _current is not None:
        if _current.count != n:
            raise DeviceCountError(_restart_message(_current.count, n))
        if not quiet:
            print(f"setup_devices: {_current} (already set)")
        return _current

    import jax

    choice = _choose(n, prefer)
    if choice is None:  # n real accelerators: nothing to configure
        devices = jax.devices()
        setup = DeviceSetup(n, devices[0].platform, False, f"{len(devices)} found")
    else:
        reason = choice
        try:
            jax.config.update("jax_platforms", "cpu")
            jax.config.update("jax_num_cpu_devices", n)
        except RuntimeError as err:  # JAX raises this once backends are initialised
            raise DeviceCountError(_restart_message(jax.device_count(), n)) from err
        setup = DeviceSetup(n, "cpu", True, reason)

    have = jax.device_count()
    if setup.simulated and have != n:
        # Started earlier with the same config value (e.g. through XLA_FLAGS): nothing raised.
        raise DeviceCountError(_restart_message(have, n))
    _current = setup
    if not quiet:
        print(f"setup_devices: {setup}")
    return setup


def _choose(n: int, prefer: str) -> str | None:
    """None to use real accelerators, else the reason for simulated CPU devices."""
    if prefer == "cpu":
        return "asked for CPU"
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return "JAX_PLATFORMS=cpu"
    plugins = _accelerator_plugins()
    if not plugins:
        return "no accelerator found"
    backend, count, note = _probe_accelerators()
    if note:
        return note
    if backend == "cpu":
        return "no accelerator found"
    if count >= n:
        return None
    return f"{count} {backend.upper()} device{'s' if count != 1 else ''} found, fewer than {n}"
