"""setup_devices: the right count, a clear error when asked too late, and the accelerator decision."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from spmd_course.utils import devices
from spmd_course.utils.devices import DeviceCountError, DeviceSetup, assert_close, setup_devices

ROOT = Path(__file__).resolve().parent.parent

# Whether this machine shows hardware for an installed plugin: then setup_devices may pick real devices,
# and the tests that expect simulated CPU devices in a fresh process do not apply.
ACCELERATOR_HERE = devices._hardware_evidence(devices._accelerator_plugins())
needs_no_accelerator = pytest.mark.skipif(
    bool(ACCELERATOR_HERE), reason=f"this machine shows accelerator hardware: {ACCELERATOR_HERE}")


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (JAX not started yet); the course's package is installed."""
    clean = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "JAX_PLATFORMS")}
    clean.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=clean, timeout=120)


def test_this_process_has_eight_devices():
    assert jax.device_count() == 8
    again = setup_devices(8, quiet=True)
    assert isinstance(again, DeviceSetup) and again.count == 8
    assert again.platform == jax.devices()[0].platform
    assert again.simulated == (again.platform == "cpu")


@pytest.mark.parametrize("platform,cpu,rtol", [("cpu", True, 1e-5), ("tpu", False, 1e-2), ("gpu", False, 1e-2)])
def test_what_the_setup_says_about_its_backend(platform, cpu, rtol):
    setup = DeviceSetup(8, platform, platform == "cpu", "test")
    assert setup.cpu is cpu and setup.rtol == rtol


def test_assert_close_uses_the_backends_tolerance_and_the_references_scale():
    assert setup_devices(8, quiet=True).rtol == 1e-5
    ref = np.array([100.0, -100.0, 1e-3])
    assert_close(ref * (1 + 5e-6), ref)  # within 1e-5, relative
    assert_close(ref + np.array([0, 0, 5e-4]), ref)  # a near-zero element: within 1e-5 x 100
    with pytest.raises(AssertionError):
        assert_close(ref * (1 + 5e-5), ref)
    with pytest.raises(AssertionError):
        assert_close(ref + np.array([0, 0, 5e-3]), ref)
    assert_close(ref * 1.005, ref, rtol=1e-2)  # an accelerator's tolerance, asked for
    with pytest.raises(AssertionError):
        assert_close(ref + np.array([0, 0, 5e-4]), ref, atol=0.0)


def test_assert_close_before_the_setup_says_what_to_do(monkeypatch):
    monkeypatch.setattr(devices, "_current", None)
    with pytest.raises(RuntimeError, match="setup cell"):
        assert_close(np.ones(2), np.ones(2))
    assert_close(np.ones(2), np.ones(2), rtol=1e-5)


def test_rerun_with_same_count_prints_one_line(capsys):
    setup_devices(8)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("setup_devices: 8 ") and out[0].endswith("(already set)")


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


@needs_no_accelerator
def test_fresh_process_gets_the_count_asked_for():
    r = _run("""
        from spmd_course.utils import setup_devices
        import jax
        s = setup_devices(4)
        print(jax.device_count(), s.simulated, s.platform, jax.config.read("jax_disable_most_optimizations"))
    """)
    assert r.returncode == 0, r.stderr
    first, last = r.stdout.strip().splitlines()
    assert first.startswith("setup_devices: 4 simulated CPU devices (no accelerator found)")
    assert last == "4 True cpu True"  # simulated CPU devices: the CPU backend's machine code unoptimised


def test_skipping_the_cpu_machine_code_optimisation_leaves_the_program_and_its_buffers_alone():
    """What setup_devices' jax_disable_most_optimizations may change: rounding, never the HLO or the bytes."""
    r = _run("""
        import hashlib
        from spmd_course.utils import setup_devices
        import jax, jax.numpy as jnp
        from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
        setup_devices(8, quiet=True)
        mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
        def step(w1, w2, x):
            loss = lambda w1, w2: jnp.mean((jax.nn.relu(x @ w1) @ w2) ** 2)
            g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
            return w1 - 0.1 * g1, w2 - 0.1 * g2
        args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p))
                for s, p in (((64, 256), P(None, "model")), ((256, 10), P("model")), ((64, 64), P("data")))]
        for flag in (True, False):
            jax.config.update("jax_disable_most_optimizations", flag)
            c = jax.jit(lambda *a: step(*a)).lower(*args).compile()  # a new function: no cached program
            m = c.memory_analysis()
            print(hashlib.md5(c.as_text().encode()).hexdigest(), m.temp_size_in_bytes, m.output_size_in_bytes)
    """)
    assert r.returncode == 0, r.stderr
    unoptimised, optimised = r.stdout.strip().splitlines()
    assert unoptimised == optimised


@needs_no_accelerator
def test_jax_started_first_gives_the_clear_error():
    r = _run("""
        import jax.numpy as jnp
        jnp.ones(3)  # starts JAX with its default single CPU device
        from spmd_course.utils import setup_devices, DeviceCountError
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
    r = _run("from spmd_course.utils import setup_devices; setup_devices(2)", JAX_PLATFORMS="cpu")
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
def test_choice_with_a_plugin_and_its_hardware(monkeypatch, probe, expected):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(devices, "_accelerator_plugins", lambda: ["libtpu"])
    monkeypatch.setattr(devices, "_hardware_evidence", lambda plugins: ["/dev/accel0"])
    monkeypatch.setattr(devices, "_probe_accelerators", lambda: probe)
    assert devices._choose(8) == expected


def _no_probe():
    raise AssertionError("the probe must not run")


@pytest.mark.parametrize("plugins", [[], ["libtpu"], ["libtpu", "xla_cuda12"]])
def test_choice_without_hardware_never_starts_a_probe(monkeypatch, plugins):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(devices, "_accelerator_plugins", lambda: plugins)
    monkeypatch.setattr(devices, "_hardware_evidence", lambda found: [])
    monkeypatch.setattr(devices, "_probe_accelerators", _no_probe)
    assert devices._choose(8) == "no accelerator found"


def test_jax_platforms_cpu_skips_the_probe(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setattr(devices, "_accelerator_plugins", lambda: ["libtpu"])
    monkeypatch.setattr(devices, "_hardware_evidence", lambda found: ["/dev/accel0"])
    monkeypatch.setattr(devices, "_probe_accelerators", _no_probe)
    assert devices._choose(8) == "JAX_PLATFORMS=cpu"


# Evidence, from a fake file tree: what each plugin needs to see before the probe runs.

def _touch(root: Path, *paths: str, text: str = "") -> None:
    for rel in paths:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _pci(root: Path, address: str, vendor: str, device: str) -> None:
    _touch(root, f"sys/bus/pci/devices/{address}/vendor", text=vendor + "\n")
    _touch(root, f"sys/bus/pci/devices/{address}/device", text=device + "\n")


def test_an_empty_machine_shows_nothing(tmp_path):
    (tmp_path / "dev" / "vfio").mkdir(parents=True)
    _touch(tmp_path, "dev/vfio/vfio", "dev/null")  # the VFIO control file exists on many plain hosts
    _pci(tmp_path, "0000:00:04.0", "0x1ae0", "0x0042")  # Google's gVNIC network card: not a TPU
    _pci(tmp_path, "0000:00:05.0", "0x8086", "0x1237")
    plugins = ["libtpu", "xla_cuda12", "xla_rocm7"]
    assert devices._hardware_evidence(plugins, root=tmp_path, environ={}) == []


@pytest.mark.parametrize(
    "files,environ,expected",
    [
        (["dev/accel0", "dev/accel1"], {}, ["dev/accel0", "dev/accel1"]),  # TPU v2-v4
        (["dev/vfio/0", "dev/vfio/vfio"], {}, ["dev/vfio/0"]),  # TPU v5e and later
        ([], {"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, ["TPU_ACCELERATOR_TYPE is set"]),
        ([], {"TPU_WORKER_HOSTNAMES": "localhost"}, ["TPU_WORKER_HOSTNAMES is set"]),
        ([], {"TPU_ACCELERATOR_TYPE": ""}, []),  # set but empty: no sign
    ],
)
def test_tpu_evidence(tmp_path, files, environ, expected):
    _touch(tmp_path, *files)
    found = devices._hardware_evidence(["libtpu"], root=tmp_path, environ=environ)
    assert [f.replace(str(tmp_path) + "/", "") for f in found] == expected
    # The same signs mean nothing to a CUDA plugin.
    assert devices._hardware_evidence(["xla_cuda12"], root=tmp_path, environ=environ) == []


def test_tpu_evidence_from_pci(tmp_path):
    _pci(tmp_path, "0000:00:05.0", "0x1ae0", "0x0063")  # a TPU v5e chip, as JAX's hardware_utils lists it
    assert devices._hardware_evidence(["libtpu"], root=tmp_path, environ={}) == ["TPU chip on PCI 0000:00:05.0"]


@pytest.mark.parametrize("files", [["dev/nvidia0"], ["dev/nvidiactl"], ["dev/dxg"]])
def test_cuda_evidence(tmp_path, files):
    _touch(tmp_path, *files)
    assert devices._hardware_evidence(["xla_cuda12"], root=tmp_path, environ={}) == [str(tmp_path / files[0])]
    assert devices._hardware_evidence(["libtpu"], root=tmp_path, environ={}) == []


def test_rocm_evidence(tmp_path):
    _touch(tmp_path, "dev/kfd")
    assert devices._hardware_evidence(["xla_rocm7"], root=tmp_path, environ={}) == [str(tmp_path / "dev/kfd")]
    assert devices._hardware_evidence(["xla_cuda12"], root=tmp_path, environ={}) == []


def test_an_unknown_plugin_is_probed(tmp_path):
    assert devices._hardware_evidence(["xla_newchip"], root=tmp_path, environ={}) == [
        "plugin xla_newchip (its hardware cannot be checked cheaply)"]


def test_plugins_are_found_without_starting_jax(monkeypatch):
    """libtpu is found by its module spec, CUDA/ROCm plugins in the jax_plugins namespace package."""
    real_find_spec = devices.importlib.util.find_spec
    monkeypatch.setattr(devices.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "libtpu" else real_find_spec(name, *a))
    assert "libtpu" in devices._accelerator_plugins()
    monkeypatch.setattr(devices.importlib.util, "find_spec", lambda name, *a: None)
    assert "libtpu" not in devices._accelerator_plugins()


@needs_no_accelerator
def test_installed_libtpu_costs_no_probe_and_prints_nothing():
    """In a fresh interpreter: one line on stdout, nothing on stderr, no child process started."""
    r = _run("""
        import subprocess
        def no_child(*args, **kwargs):
            raise AssertionError(f"setup_devices started a child process: {args[0]}")
        subprocess.run = no_child
        from spmd_course.utils import setup_devices
        import jax.numpy as jnp
        setup_devices(8)
        jnp.ones(8).block_until_ready()
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines() == [r.stdout.strip()]
    assert r.stdout.startswith("setup_devices: 8 simulated CPU devices (no accelerator found)")
    for noise in ("libtpu", "TPU_WORKER_HOSTNAMES", "InitGoogle", "WARNING", "E0000"):
        assert noise not in r.stderr, r.stderr
    assert r.stderr == ""
