"""The renderer: tests read the returned Figure (tiles, labels, colours, panels)."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from utils.drawing import (
    device_color,
    device_label,
    draw_mesh,
    draw_sharding,
    draw_shardings,
    mesh_labels,
    tile_labels,
)

MESH = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def _patches(fig, gid):
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def _stripe_colors(ax):
    return [to_rgba(p.get_facecolor(), 1.0) for p in ax.patches if p.get_gid() is None]


def test_2d_blocks_with_devices_and_shapes():
    x = jax.device_put(jnp.ones((128, 512)), NamedSharding(MESH, P("data", "model")))
    fig = draw_sharding(x)
    assert isinstance(fig, Figure)
    assert len(_patches(fig, "tile")) == 8
    labels = tile_labels(fig)
    assert sorted(labels)[0] == "dev 0\n(32, 256)\n32.0 KiB"
    assert {label.split("\n")[1] for label in labels} == {"(32, 256)"}
    assert "f32[128@data,512@model]" in fig._suptitle.get_text()
    assert "P('data', 'model')" in fig._suptitle.get_text()


def test_block_geometry_is_proportional():
    fig = draw_sharding((128, 512), NamedSharding(MESH, P(None, "model")))
    tiles = sorted(_patches(fig, "tile"), key=lambda p: p.get_x())
    assert [round(p.get_x(), 6) for p in tiles] == [0.0, 0.5]
    assert all(round(p.get_width(), 6) == 0.5 and round(p.get_height(), 6) == 1.0 for p in tiles)


def test_3d_array_with_none_data_model():
    fig = draw_sharding((2, 128, 512), NamedSharding(MESH, P(None, "data", "model")))
    assert len(fig.axes) == 1  # dim 0 is not sharded: one panel holds every block
    labels = tile_labels(fig)
    assert len(labels) == 8
    assert all("(2, 32, 256)" in label for label in labels)
    assert sorted(label.split("\n")[0] for label in labels) == [f"dev {i}" for i in range(8)]
    assert fig.axes[0].get_xlabel() == "dim 2 (512)" and fig.axes[0].get_ylabel() == "dim 1 (128)"


def test_3d_array_with_sharded_leading_dim_gives_panels():
    fig = draw_sharding((8, 16, 32), NamedSharding(MESH, P("data", None, "model")))
    assert [ax.get_title() for ax in fig.axes] == ["dim 0 = 0:2", "dim 0 = 2:4", "dim 0 = 4:6", "dim 0 = 6:8"]
    assert len(tile_labels(fig)) == 8


def test_dims_picks_the_drawn_dimensions():
    fig = draw_sharding((8, 16, 32), NamedSharding(MESH, P("data", None, "model")), dims=(0, 2))
    assert len(fig.axes) == 1 and len(tile_labels(fig)) == 8
    assert fig.axes[0].get_ylabel() == "dim 0 (8)"


def test_replicated_array_is_one_block_striped_with_every_device():
    fig = draw_sharding(jax.device_put(jnp.ones((16, 16)), NamedSharding(MESH, P())))
    assert tile_labels(fig) == ["dev 0-7\n(16, 16)\n1.0 KiB"]
    assert _stripe_colors(fig.axes[0]) == [to_rgba(device_color(i), 1.0) for i in range(8)]


def test_partly_replicated_block_names_every_holder():
    fig = draw_sharding((16, 16), NamedSharding(MESH, P("data")))
    assert [label.split("\n")[0] for label in tile_labels(fig)] == ["dev 0,1", "dev 2,3", "dev 4,5", "dev 6,7"]


def test_uneven_shard_is_drawn_short_with_padding():
    fig = draw_sharding((10,), NamedSharding(MESH, P("data")))
    labels = tile_labels(fig)
    assert [label.split("\n")[1] for label in labels] == ["(3)", "(3)", "(3)", "(1)"]
    assert "padded to (3)" in labels[-1] and all("padded" not in label for label in labels[:3])
    widths = [round(p.get_width(), 6) for p in sorted(_patches(fig, "tile"), key=lambda p: p.get_x())]
    assert widths == [0.3, 0.3, 0.3, 0.1]
    (pad,) = _patches(fig, "padding")
    assert round(pad.get_x(), 6) == 1.0 and round(pad.get_width(), 6) == 0.2  # 2 padded elements beyond the array


def test_same_device_same_colour_across_figures():
    a = draw_sharding((8, 8), NamedSharding(MESH, P("data", "model")))
    b = draw_mesh(MESH)
    colours_a = {label.split("\n")[0]: None for label in tile_labels(a)}
    assert len(colours_a) == 8
    mesh_colours = {int(t.get_text()): None for t in b.axes[0].texts}
    for patch, text in zip(_patches(b, "device"), b.axes[0].texts, strict=True):
        mesh_colours[int(text.get_text())] = to_rgba(patch.get_facecolor(), 1.0)
    assert all(mesh_colours[i] == to_rgba(device_color(i), 1.0) for i in range(8))
    assert device_color(3) == device_color(3) and device_color(3) != device_color(4)


def test_draw_mesh_layouts():
    fig = draw_mesh(MESH)
    assert len(_patches(fig, "device")) == 8
    assert fig.axes[0].get_ylabel().startswith("data (4)") and fig.axes[0].get_xlabel().startswith("model (2)")
    one = draw_mesh(jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,)))
    assert len(one.axes) == 1 and one.axes[0].get_xlabel().startswith("data (8)")
    three = draw_mesh(jax.make_mesh((2, 2, 2), ("data", "model", "pipeline"), axis_types=(AxisType.Auto,) * 3))
    assert [ax.get_title() for ax in three.axes] == ["data=0", "data=1"]
    assert len(_patches(three, "device")) == 8


def test_draw_mesh_rejects_non_meshes():
    with pytest.raises(TypeError, match=r"needs a jax\.sharding\.Mesh"):
        draw_mesh((4, 2))
    with pytest.raises(TypeError, match=r"needs a jax\.sharding\.Mesh"):
        draw_mesh(MESH.abstract_mesh)


def test_draw_shardings_names_and_types_every_array():
    params = {
        "dense": {"kernel": jax.device_put(jnp.ones((32, 64)), NamedSharding(MESH, P(None, "model"))),
                  "bias": jax.device_put(jnp.ones((64,)), NamedSharding(MESH, P("model")))},
    }
    fig = draw_shardings(params)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["dense/bias\nf32[64@model]", "dense/kernel\nf32[32,64@model]"]
    assert len(tile_labels(fig)) == 4


def test_draw_shardings_accepts_shapes_with_shardings():
    fig = draw_shardings({"w": ((8, 16, 32), NamedSharding(MESH, P("data", None, "model")))}, ncols=1)
    assert "(first block of dim 0)" in fig.axes[0].get_title()


@pytest.mark.parametrize(
    "call,exc,message",
    [
        (lambda: draw_sharding([1, 2.5]), TypeError, "shape tuple"),
        (lambda: draw_sharding((8, 8)), ValueError, "needs a layout"),
        (lambda: draw_sharding((8, 8), NamedSharding(MESH, P("data")), dims=(0, 0)), ValueError, "two different"),
        (lambda: draw_sharding((8, 8), NamedSharding(MESH, P("data")), dims=(0, 5)), ValueError, "has 2 dimension"),
        (lambda: draw_sharding((8, 8), P("data", "data"), mesh=MESH), ValueError, "at most one dimension"),
        (lambda: draw_sharding((8, 8), P("rows"), mesh=MESH), ValueError, "does not have"),
        (lambda: draw_sharding((64, 4, 4), NamedSharding(MESH, P(("data", "model"))), max_panels=4), ValueError,
         "needs 8 panels"),
        (lambda: draw_shardings({}), ValueError, "found no arrays"),
        (lambda: draw_shardings({"a": jnp.ones(3)}, ncols=0), ValueError, "ncols"),
        (lambda: tile_labels("figure"), TypeError, "reads a Figure"),
        (lambda: mesh_labels(None), TypeError, "reads a Figure"),
        (lambda: mesh_labels(draw_sharding((8,), NamedSharding(MESH, P()))), ValueError, "no devices drawn"),
        (lambda: device_color(-1), ValueError, "device id"),
    ],
)
def test_bad_input_gets_a_clear_error(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_device_label_shortens_runs():
    assert device_label([0]) == "dev 0"
    assert device_label([1, 0]) == "dev 0,1"
    assert device_label(range(8)) == "dev 0-7"
    assert device_label([0, 2, 4, 6]) == "dev 0,2,4,6"
    assert device_label([0, 1, 2, 5, 6]) == "dev 0-2,5,6"
    assert device_label(range(0, 64, 2)) == "dev 0,2,...,62"
    assert device_label(range(3, 64, 8)) == "dev 3,11,...,59"


def test_mesh_labels_read_back_the_device_grid():
    assert mesh_labels(draw_mesh(MESH)) == [MESH.device_ids.tolist()]
    mesh3 = jax.make_mesh((2, 2, 2), ("data", "model", "pipeline"), axis_types=(AxisType.Auto,) * 3)
    assert mesh_labels(draw_mesh(mesh3)) == mesh3.device_ids.tolist()
    one = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    assert mesh_labels(draw_mesh(one)) == [[list(range(8))]]


def test_draw_shardings_keeps_the_order_of_a_dict():
    arrays = {"zeta": ((8, 8), NamedSharding(MESH, P())), "alpha": jax.device_put(jnp.ones(8)),
              "mid": {"b": ((8,), NamedSharding(MESH, P("data"))), "a": ((8,), NamedSharding(MESH, P()))}}
    titles = [ax.get_title().split("\n")[0] for ax in draw_shardings(arrays).axes]
    assert titles == ["zeta", "alpha", "mid/a", "mid/b"]  # dict order outside, pytree order inside


def test_draw_shardings_grows_panels_for_many_blocks():
    small = draw_shardings({"w": ((8, 8), NamedSharding(MESH, P()))})
    many = draw_shardings({"w": ((128, 512), NamedSharding(MESH, P(None, ("data", "model"))))})
    assert many.get_size_inches()[0] > small.get_size_inches()[0]


def test_uneven_label_sits_over_block_and_padding():
    fig = draw_sharding((10,), NamedSharding(MESH, P("data")))
    last = [t for t in fig.axes[0].texts if t.get_gid() == "tile-label"][-1]
    assert round(last.get_position()[0], 6) == 0.9 + 0.3 / 2  # block 0.9..1.0 plus padding 1.0..1.2


def test_draw_shardings_mixes_arrays_structs_and_shape_pairs():
    arrays = {"array": jax.device_put(jnp.ones((8, 8)), NamedSharding(MESH, P("data"))),
              "struct": jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(MESH, P(None, "model"))),
              "pair": ((8, 8), NamedSharding(MESH, P()))}
    fig = draw_shardings(arrays)
    assert [ax.get_title().split("\n")[0] for ax in fig.axes] == ["array", "struct", "pair"]
    assert len(tile_labels(fig)) == 4 + 2 + 1
