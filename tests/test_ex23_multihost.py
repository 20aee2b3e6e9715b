"""Exercises of notebook 23: valid answers of other forms are accepted, and the facts they state hold."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.exercises import ex23_multihost as ex
from spmd_course.utils.exercises import Verdict


@pytest.mark.parametrize("answer", [
    [(56, 64), (96, 120)],
    [(56, 64), (96, 104), (104, 112), (112, 120)],  # the four blocks, as addressable_devices_indices_map gives them
    [[56, 64], [96, 120]],
    ((56, 64), (96, 120)),
    [(np.int64(56), np.int64(64)), (96, 120)],  # numbers from numpy
    [slice(56, 64), slice(96, 104), slice(104, 112), slice(112, 120)],  # what an index map holds
    [slice(np.int64(56), np.int64(64)), slice(96, 120)],
    np.array([[56, 64], [96, 120]]),  # ranges computed with numpy
    [np.array([56, 64]), np.array([96, 120])],
    jax.numpy.array([[56, 64], [96, 120]]),
    [(56.0, 64.0), (96, 120)],  # whole floats, as 8 * 7.0 gives
    [(np.float64(56), np.int32(64)), (np.int64(96), np.int64(120))],
    [range(56, 64), range(96, 120)],
])
def test_rows_of_host_accepts_every_form_of_the_right_rows(answer):
    assert ex.rows_of_host.verdict(answer) is Verdict.CORRECT


@pytest.mark.parametrize("answer", [[slice(56, 64, 2), (96, 120)], [slice(None, 64), (96, 120)],
                                    [range(56, 64, 2), (96, 120)], [(56.5, 64), (96, 120)], [(True, 64), (96, 120)],
                                    np.array([[64, 96]]), np.array([56, 64, 96, 120]), np.array([[56, 64, 96, 120]]),
                                    [(np.int64(56), np.int64(64)), (np.int64(96), np.int64(112))]])
def test_rows_of_host_rejects_other_ranges_and_forms_in_numpy_types_too(answer):
    assert ex.rows_of_host.verdict(answer) is Verdict.WRONG


@pytest.mark.parametrize("answer", [256, np.int64(256), 256.0, np.float32(256), np.array(256), jax.numpy.int32(256)])
def test_rows_per_process_accepts_numbers_from_numpy(answer):
    assert ex.rows_per_process.verdict(answer) is Verdict.CORRECT


@pytest.mark.parametrize("answer", [256.5, True, "256"])
def test_rows_per_process_rejects_what_is_not_a_whole_number(answer):
    assert ex.rows_per_process.verdict(answer) is Verdict.WRONG


@pytest.mark.parametrize("answer", [{"b", "d", "e"}, {"B", "D", "E"}, {"(b)", "(d)", "(e)"}, frozenset("edb"),
                                    ["b", "d", "e"], ("e", "d", "b"), np.array(["b", "d", "e"])])
def test_which_hang_accepts_letters_in_any_form(answer):
    assert ex.which_hang.verdict(answer) is Verdict.CORRECT


@pytest.mark.parametrize("answer", ["bde", ["b", "d"], ("b", "d", "e", "a"), {"b": 1, "d": 1, "e": 1}, [1, 2]])
def test_which_hang_rejects_wrong_letters_and_other_forms(answer):
    assert ex.which_hang.verdict(answer) is Verdict.WRONG


def test_the_exercise_rows_agree_with_a_sharding_of_the_same_layout():
    """host_rows, on an 8-device CPU mesh whose positions are given hosts, is what devices_indices_map says."""
    hosts = (0, 1, 1, 0, 2, 2, 3, 3)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    index_map = NamedSharding(mesh, P("data")).devices_indices_map((64, 4))
    position = {d: i for i, d in enumerate(mesh.devices.flat)}
    for host in range(4):
        rows = sorted(index[0].indices(64)[:2] for d, index in index_map.items() if hosts[position[d]] == host)
        assert ex.host_rows(hosts, host, 64) == rows


def test_the_v5e_16_hosts_of_the_exercise_are_what_jax_make_mesh_builds():
    from jax.experimental import topologies

    from spmd_course.utils.capture import quiet
    from spmd_course.utils.tpu import tpu_compiler_available

    ok, why = tpu_compiler_available()
    if not ok:
        pytest.skip(why)
    with quiet():
        devices = topologies.get_topology_desc(topology_name="v5e:4x4", platform="tpu").devices
    mesh = jax.make_mesh((16,), ("data",), axis_types=(AxisType.Auto,), devices=devices)
    assert tuple(np.vectorize(lambda d: d.process_index)(mesh.devices).tolist()) == ex.V5E_16_HOSTS
