"""Exercises of notebook 01: reading and building device meshes."""

from __future__ import annotations

import jax
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from spmd_course.utils.exercises import Exercise, answer_errors, plain


def _mesh_4x2() -> Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def _check_device_at(answer: object) -> None:
    if callable(answer):  # the reference solution and the listed mistakes read this machine's mesh
        with answer_errors("your function"):
            answer = answer()
    device_id = plain(answer)  # a device becomes its id; np.int64(5) and 5.0 become 5
    assert isinstance(device_id, int) and not isinstance(device_id, bool), (
        f"give a device id (a whole number) or a device such as mesh.devices[i, j]; got {answer!r}"
    )
    mesh = _mesh_4x2()
    expected = int(mesh.devices[2, 1].id)
    if device_id == expected:
        return
    where = {int(d.id): (i, j) for (i, j), d in _enumerate_2d(mesh)}
    if device_id in where:
        i, j = where[device_id]
        raise AssertionError(
            f"device {device_id} sits at data={i}, model={j}; the grid is filled row by row "
            f"(the last axis, model, varies fastest) and counts from 0"
        )
    raise AssertionError(f"there is no device {device_id} on this (4, 2) mesh")


def _enumerate_2d(mesh: Mesh):
    for i in range(mesh.devices.shape[0]):
        for j in range(mesh.devices.shape[1]):
            yield (i, j), mesh.devices[i, j]


def _reference_device_at():
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
    return mesh.devices[2, 1]  # data=2, model=1; the id depends on the order make_mesh chose here


device_at = Exercise(
    title="Exercise 1: the device at data=2, model=1",
    checker=_check_device_at,
    solution=_reference_device_at,
    wrong=(
        lambda: _mesh_4x2().devices[1, 0],  # counted from 1
        lambda: _mesh_4x2().devices.ravel()[2 + 1 * 4],  # the grid filled column by column
        lambda: _mesh_4x2().devices[2, 0],  # the right row, the wrong column
        8,  # no such device on the mesh
    ),
    hint="mesh.devices[i, j] is the device at data=i, model=j; the grid fills row by row and counts from 0",
    explanation=(
        "Row data=2 holds the 5th and 6th devices of the mesh's sequence; model=1 is the second of them. "
        "On CPU the sequence is id order, so that is device 5; on a TPU v5e board it is device 6."
    ),
)


def _as_mesh(answer: object) -> Mesh:
    if callable(answer) and not isinstance(answer, Mesh):
        try:
            answer = answer()  # the reference solution is a function, so reveal() can show its code
        except Exception as err:
            raise AssertionError(f"building the mesh raised {type(err).__name__}: {err}") from None
    assert isinstance(answer, Mesh), (
        f"expected a jax.sharding.Mesh, such as jax.make_mesh((2, 4), ...); got {type(answer).__name__}"
    )
    return answer


def _check_auto_mesh(answer: object) -> None:
    mesh = _as_mesh(answer)
    assert mesh.axis_names == ("data", "model"), (
        f"the axes should be named ('data', 'model'), in that order; got {mesh.axis_names}"
    )
    assert dict(mesh.shape) == {"data": 2, "model": 4}, (
        f"the mesh should have data=2, model=4; got {dict(mesh.shape)}"
    )
    assert mesh.axis_types == (AxisType.Auto, AxisType.Auto), (
        f"the axis types are {mesh.axis_types}: jax.make_mesh makes Explicit axes unless you pass "
        "axis_types=(AxisType.Auto, AxisType.Auto)"
    )
    ids = sorted(int(d.id) for d in mesh.devices.flat)
    assert len(set(ids)) == len(ids), f"the mesh should use 8 different devices, each once; it uses {ids}"


def _reference_auto_mesh() -> Mesh:
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


auto_mesh = Exercise(
    title="Exercise 2: a (2, 4) mesh with Auto axes",
    checker=_check_auto_mesh,
    solution=_reference_auto_mesh,
    wrong=(
        lambda: jax.make_mesh((2, 4), ("data", "model")),  # default axis types: Explicit
        lambda: jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto)),
        lambda: Mesh(mesh_utils.create_device_mesh((2, 4)), axis_names=("model", "data")),
        lambda: jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Explicit)),
        lambda: jax.make_mesh((4, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto)),  # 16 > 8
        (2, 4),
    ),
    hint="jax.make_mesh(shape, names, axis_types=...) with AxisType.Auto for each axis",
    explanation=(
        "jax.make_mesh((2, 4), ('data', 'model'), axis_types=(AxisType.Auto, AxisType.Auto)); "
        "Mesh(mesh_utils.create_device_mesh((2, 4)), axis_names=('data', 'model')) is the same mesh."
    ),
)


def _check_model_group(answer: object) -> None:
    items = plain(answer)  # devices become their ids, numpy arrays and lists tuples, sets frozensets
    assert isinstance(items, frozenset | tuple), f"give the device ids as a set, such as {{0, 1}}; got {answer!r}"
    assert all(isinstance(i, int) and not isinstance(i, bool) for i in items), (
        f"give device ids (whole numbers) or devices, such as {{0, 1}}; got {answer!r}"
    )
    ids = set(items)
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
    row = next(r for r in mesh.device_ids.tolist() if 5 in r)
    column = next(c for c in mesh.device_ids.T.tolist() if 5 in c)
    if ids == set(column):
        raise AssertionError(
            f"{sorted(ids)} share device 5's model coordinate and differ in data: that is a group over 'data'"
        )
    assert 5 in ids, "the group includes device 5 itself"
    assert ids == set(row), (
        f"{sorted(ids)} is not it: a collective over 'model' runs among the devices that differ only in their "
        f"model coordinate, here {len(row)} devices (the size of the model axis)"
    )


model_group = Exercise(
    title="Exercise 3: device 5's group over 'model'",
    checker=_check_model_group,
    solution={4, 5, 6, 7},
    wrong=({1, 5}, {4, 5}, {5}, [5, 6], "4567", [[4, 5, 6, 7]], 5),
    hint="find device 5 on the (2, 4) grid; the devices of its group keep its data coordinate and differ in model",
    explanation="Row data=1 of the (2, 4) mesh is devices 4, 5, 6, 7: all four take part in every collective "
    "over 'model' that involves device 5.",
)
