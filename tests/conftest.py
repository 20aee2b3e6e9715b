"""Test setup: 8 simulated CPU devices before anything starts JAX (the course's package, spmd_course, is installed)."""

import matplotlib

matplotlib.use("Agg")

from spmd_course.utils.devices import setup_devices

setup_devices(8, quiet=True)


import pytest  # noqa: E402 - after the device setup above, which must run before anything starts JAX


@pytest.fixture(scope="session")
def tpu_devices():
    """The 8 chips of a TPU v5e:2x4 topology, to compile TPU programs ahead of time (no TPU needed).

    Skips with the reason where libtpu is missing (macOS, Windows) or cannot describe a topology.
    """
    from jax.experimental import topologies

    from spmd_course.utils.capture import quiet
    from spmd_course.utils.tpu import tpu_compiler_available

    ok, why = tpu_compiler_available()
    if not ok:
        pytest.skip(why)
    with quiet():
        return topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices


@pytest.fixture(scope="session")
def tpu_pod():
    """The 64 chips of a TPU v5e:8x8 slice (no TPU needed); skips with the reason where libtpu is missing."""
    from jax.experimental import topologies

    from spmd_course.utils.capture import quiet
    from spmd_course.utils.tpu import tpu_compiler_available

    ok, why = tpu_compiler_available()
    if not ok:
        pytest.skip(why)
    with quiet():
        return topologies.get_topology_desc(topology_name="v5e:8x8", platform="tpu").devices
