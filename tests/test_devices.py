"""setup_devices: the right count, a clear error when asked too late, and the accelerator decision."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest

from utils import devices
from utils.devices import DeviceCountError, DeviceSetup, setup_devices

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (JAX not started yet) with the repo importable."""
    clean = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "JAX_PLATFORMS")}
    clean.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=clean, timeout=120)


def test_this_process_has_eight_devices():
    assert jax.device_count() == 8
    again = setup_devices(8, quiet=True)
    assert isinstance(again, DeviceSetup) and again.count == 8 and again.simulated


def test_rerun_with_same_count_prints_one_line(capsys):
    setup_devices(8)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("setup_devices: 8 simulated CPU devices")


def test_other_count_after_start_says_restart():
    with pytest.raises(DeviceCountError, match=r"restart the kernel.*setup_devices\(4\)"):
        setup_devices(4)
    assert jax.device_count() == 8


@pytest.mark.parametrize("bad", ["8", 8.0, None, True])
def test_count_must_be_an_int(bad):
    with pytest.raises(TypeError, match="whole number of devices"):
        setup_devices(bad)


def test_count_must_be_positive():
    with pytest.raises(ValueError, match="at least 1 device"):
        setup_devices(0)


def test_prefer_is_checked():
    with pytest.raises(ValueError, match="'auto' or 'cpu'"):
        setup_devices(8, prefer="gpu")


def test_fresh_process_gets_the_count_asked_for():
    r = _run("""
        from utils import setup_devices
        import jax
        s = setup_devices(4)
        print(jax.device_count(), s.simulated, s.platform)
    """)
    assert r.returncode == 0, r.stderr
    first, last = r.stdout.strip().splitlines()
    assert first.startswith("setup_devices: 4 simulated CPU devices (no accelerator found)")
    assert last == "4 True cpu"


def test_jax_started_first_gives_the_clear_error():
    r = _run("""
        import jax.numpy as jnp
        jnp.ones(3)  # starts JAX with its default single CPU device
        from utils import setup_devices, DeviceCountError
        try:
            setup_devices(8)
        except DeviceCountError as e:
            print("CAUGHT", e)
    """)
    assert r.returncode == 0, r.stderr
    assert "CAUGHT JAX has already started in this kernel with 1 devices" in r.stdout
    assert "Restart Kernel" in r.stdout
    assert "Traceback" not in r.stdout


def test_jax_platforms_cpu_is_respected():
    r = _run("from utils import setup_devices; setup_devices(2)", JAX_PLATFORMS="cpu")
    assert r.returncode == 0, r.stderr
    assert "(JAX_PLATFORMS=cpu)" in r.stdout


@pytest.mark.parametrize(
    "probe,expected",
    [
        (("tpu", 1, ""), "1 TPU device found, fewer than 8"),
        (("gpu", 4, ""), "4 GPU devices found, fewer than 8"),
        (("gpu", 8, ""), None),
        (("tpu", 16, ""), None),
        (("cpu", 1, ""), "no accelerator found"),
        (("cpu", 0, "accelerator probe failed: TimeoutExpired"), "accelerator probe failed: TimeoutExpired"),
    ],
)
def test_choice_with_an_accelerator_plugin(monkeypatch, probe, expected):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(devices, "_accelerator_plugins", lambda: ["libtpu"])
    monkeypatch.setattr(devices, "_probe_accelerators", lambda: probe)
    assert devices._choose(8, "auto") == expected


def test_choice_without_plugins_never_starts_a_probe(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(devices, "_accelerator_plugins", lambda: [])

    def boom():
        raise AssertionError("probe must not run")

    monkeypatch.setattr(devices, "_probe_accelerators", boom)
    assert devices._choose(8, "auto") == "no accelerator found"
    assert devices._choose(8, "cpu") == "asked for CPU"


def test_no_plugin_installed_here():
    assert devices._accelerator_plugins() == []
