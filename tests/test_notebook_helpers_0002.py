"""Helper behaviour that notebooks 00-02 rely on, tested here so the notebooks assert only their lessons.

- layouts on meshes whose devices are not in id order, or that have an axis of size 1;
- draw_mesh on every mesh shape the notebooks use, and draw_sharding naming the device that holds a block.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from test_drawing import mesh_labels, tile_labels

from exercises import ex00_setup, ex01_meshes, ex02_partitionspec
from utils.drawing import device_label, draw_mesh, draw_sharding
from utils.layout import tiles, type_string

TPU_ORDER = [0, 1, 2, 3, 7, 6, 5, 4]  # what create_device_mesh picks for a ring on a 4 x 2 TPU v5e board

def test_ex00_rejects_a_spec_longer_than_the_array():
    with pytest.raises(AssertionError, match="3 entries"):
        ex00_setup.columns_spec.checker(P(None, "data", None))


def test_exercises_accept_numpy_integers():
    assert ex00_setup.bytes_per_device.check(np.int64(16384))
    assert ex02_partitionspec.predict_shard_shape.check(tuple(np.array([64, 12, 8])))
    assert ex01_meshes.model_group.check(jax.make_mesh((2, 4), ("d", "m"), axis_types=(AxisType.Auto,) * 2)
                                         .device_ids[1])


def _tpu_ordered_mesh() -> Mesh:
    return Mesh(np.array(jax.devices())[TPU_ORDER], ("data",), axis_types=(AxisType.Auto,))


def test_tiles_follow_the_mesh_device_order():
    sharding = NamedSharding(_tpu_ordered_mesh(), P("data"))
    got = {t.start[0]: t.devices for t in tiles((128, 512), sharding)}
    assert got == {16 * k: (device,) for k, device in enumerate(TPU_ORDER)}
    runtime = {i[0].start or 0: (d.id,) for d, i in sharding.devices_indices_map((128, 512)).items()}
    assert got == runtime


def test_draw_sharding_names_the_holder_on_a_reordered_mesh():
    labels = tile_labels(draw_sharding((128, 512), NamedSharding(_tpu_ordered_mesh(), P("data"))))
    assert len(labels) == 8
    assert all(device_label([d]) in label.split("\n") for label, d in zip(labels, TPU_ORDER, strict=True))


def test_an_axis_of_size_one_splits_nothing():
    mesh81 = jax.make_mesh((8, 1), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    both = tiles((128, 512), NamedSharding(mesh81, P("data", "model")))
    rows = tiles((128, 512), NamedSharding(mesh81, P("data", None)))
    assert both == rows and len(both) == 8


@pytest.mark.parametrize("shape", [(8,), (8, 1), (4, 2), (2, 4), (2, 2, 2)], ids=str)
def test_draw_mesh_shows_every_device_once(shape):
    names = ("data", "model", "pipeline")[: len(shape)]
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
    assert sorted(np.ravel(mesh_labels(draw_mesh(mesh))).tolist()) == list(range(8))


def test_draw_mesh_shows_a_reordered_mesh_in_its_order():
    assert mesh_labels(draw_mesh(_tpu_ordered_mesh())) == [[TPU_ORDER]]


def test_type_string_writes_the_same_notation_on_auto_and_explicit_meshes():
    x = jnp.zeros((16, 8))
    for types in (AxisType.Auto, AxisType.Explicit):
        mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(types,) * 2)
        assert type_string(jax.device_put(x, NamedSharding(mesh, P("data", None)))) == "f32[16@data,8]"
