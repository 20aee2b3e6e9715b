"""The renderer: tests read the returned Figure (tiles, labels, colours, panels)."""

import re

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from course_support import V5E_ORDER, extents, label_boxes, mesh_labels, patches, tile_labels, v5e_ordered_mesh
from spmd_course.utils import drawing
from spmd_course.utils.drawing import (
    device_color,
    device_label,
    draw_mesh,
    draw_permute,
    draw_sharding,
    draw_shardings,
)
from spmd_course.utils.layout import Tile

MESH = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def _ns(spec):
    return NamedSharding(MESH, spec)


def _card_colors(ax):
    return [to_rgba(p.get_facecolor(), 1.0) for p in ax.patches if p.get_gid() == "copy"]


def test_2d_blocks_with_devices_and_shapes():
    x = jax.device_put(jnp.ones((128, 512)), NamedSharding(MESH, P("data", "model")))
    fig = draw_sharding(x)
    assert isinstance(fig, Figure)
    assert len(patches(fig, "tile")) == 8
    labels = tile_labels(fig)
    assert sorted(labels)[0] == "dev 0\n(32, 256)\n32.0 KiB"
    assert {label.split("\n")[1] for label in labels} == {"(32, 256)"}
    assert "f32[128@data,512@model]" in fig._suptitle.get_text()
    assert "P('data', 'model')" in fig._suptitle.get_text()


def test_block_geometry_is_proportional():
    fig = draw_sharding((128, 512), NamedSharding(MESH, P(None, "model")))
    tiles = sorted(patches(fig, "tile"), key=lambda p: p.get_x())
    assert [round(p.get_x(), 6) for p in tiles] == [0.0, 0.5]
    assert all(round(p.get_width(), 6) == 0.5 and round(p.get_height(), 6) == 1.0 for p in tiles)


def test_3d_array_with_none_data_model():
    fig = draw_sharding((2, 128, 512), NamedSharding(MESH, P(None, "data", "model")))
    assert len(fig.axes) == 1  # dim 0 is not sharded: one panel holds every block
    labels = tile_labels(fig)
    assert len(labels) == 8
    assert all("(2, 32, 256)" in label for label in labels)
    assert sorted(label.split("\n")[0] for label in labels) == [f"dev {i}" for i in range(8)]
    assert fig.axes[0].get_xlabel() == "dim 2 (512) \u00f7 model (2)"
    assert fig.axes[0].get_ylabel() == "dim 1 (128) \u00f7 data (4)"


def test_3d_array_with_sharded_leading_dim_gives_panels():
    fig = draw_sharding((8, 16, 32), NamedSharding(MESH, P("data", None, "model")))
    assert [ax.get_title() for ax in fig.axes] == ["dim 0 = 0:2", "dim 0 = 2:4", "dim 0 = 4:6", "dim 0 = 6:8"]
    assert len(tile_labels(fig)) == 8


def test_dims_picks_the_drawn_dimensions():
    fig = draw_sharding((8, 16, 32), NamedSharding(MESH, P("data", None, "model")), dims=(0, 2))
    assert len(fig.axes) == 1 and len(tile_labels(fig)) == 8
    assert fig.axes[0].get_ylabel() == "dim 0 (8) \u00f7 data (4)"


def test_replicated_array_is_one_block_with_a_card_for_every_device():
    fig = draw_sharding(jax.device_put(jnp.ones((16, 16)), NamedSharding(MESH, P())))
    assert tile_labels(fig) == ["dev 0-7\n(16, 16)\n1.0 KiB\n8 copies"]
    assert _card_colors(fig.axes[0]) == [to_rgba(device_color(i), 1.0) for i in range(8)]


def test_partly_replicated_block_names_every_holder():
    fig = draw_sharding((16, 16), NamedSharding(MESH, P("data")))
    assert [label.split("\n")[0] for label in tile_labels(fig)] == ["dev 0,1", "dev 2,3", "dev 4,5", "dev 6,7"]


def test_uneven_shard_is_drawn_short_with_padding():
    fig = draw_sharding((10,), NamedSharding(MESH, P("data")))
    labels = tile_labels(fig)
    assert [label.split("\n")[1] for label in labels] == ["(3)", "(3)", "(3)", "(1)"]
    assert "padded to (3)" in labels[-1] and all("padded" not in label for label in labels[:3])
    widths = [round(p.get_width(), 6) for p in sorted(patches(fig, "tile"), key=lambda p: p.get_x())]
    assert widths == [0.3, 0.3, 0.3, 0.1]
    (pad,) = patches(fig, "padding")
    assert round(pad.get_x(), 6) == 1.0 and round(pad.get_width(), 6) == 0.2  # 2 padded elements beyond the array


def test_same_device_same_colour_across_figures():
    a = draw_sharding((8, 8), NamedSharding(MESH, P("data", "model")))
    b = draw_mesh(MESH)
    colours_a = {label.split("\n")[0]: None for label in tile_labels(a)}
    assert len(colours_a) == 8
    mesh_colours = {int(t.get_text()): None for t in b.axes[0].texts}
    for patch, text in zip(patches(b, "device"), b.axes[0].texts, strict=True):
        mesh_colours[int(text.get_text())] = to_rgba(patch.get_facecolor(), 1.0)
    assert all(mesh_colours[i] == to_rgba(device_color(i), 1.0) for i in range(8))
    assert device_color(3) == device_color(3) and device_color(3) != device_color(4)


def test_draw_mesh_layouts():
    fig = draw_mesh(MESH)
    assert len(patches(fig, "device")) == 8
    assert fig.axes[0].get_ylabel().startswith("data (4)") and fig.axes[0].get_xlabel().startswith("model (2)")
    one = draw_mesh(jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,)))
    assert len(one.axes) == 1 and one.axes[0].get_xlabel().startswith("data (8)")
    three = draw_mesh(jax.make_mesh((2, 2, 2), ("data", "model", "pipeline"), axis_types=(AxisType.Auto,) * 3))
    assert [ax.get_title() for ax in three.axes] == ["data=0", "data=1"]
    assert len(patches(three, "device")) == 8


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


# --- replicas: a deck of cards, never stripes --------------------------------------------------------------------


def _cards(ax):
    return [p for p in ax.patches if p.get_gid() == "copy"]


def test_replicated_block_is_a_deck_not_a_split():
    fig = draw_sharding((128, 512), NamedSharding(MESH, P(None, "model")))
    assert tile_labels(fig) == [f"dev {a},{a + 2},{a + 4},{a + 6}\n(128, 256)\n128.0 KiB\n4 copies" for a in (0, 1)]
    cards = _cards(fig.axes[0])
    assert len(cards) == 8  # one card per device
    left = [c for c in cards if c.get_x() < 0.5]
    assert [to_rgba(c.get_facecolor(), 1.0) for c in left] == [to_rgba(device_color(d), 1.0) for d in (0, 2, 4, 6)]
    # every card covers most of the block (a stripe would be a quarter of it), each one offset down-right
    assert all(c.get_width() * c.get_height() > 0.6 * 0.5 * 1.0 for c in left)
    assert all(c.get_width() > 0.8 * 0.5 and c.get_height() > 0.75 for c in left)
    assert [c.get_x() for c in left] == sorted(c.get_x() for c in left)
    assert [c.get_y() for c in left] == sorted(c.get_y() for c in left)
    assert [c.get_zorder() for c in left] == sorted((c.get_zorder() for c in left), reverse=True)  # dev 0 on top
    assert len({(round(c.get_width(), 9), round(c.get_height(), 9)) for c in left}) == 1  # same size: copies


def test_unreplicated_block_is_one_card_filling_it():
    fig = draw_sharding((128, 512), NamedSharding(MESH, P("data", "model")))
    cards = _cards(fig.axes[0])
    assert len(cards) == 8 and all(round(c.get_width(), 6) == 0.5 and round(c.get_height(), 6) == 0.25 for c in cards)
    assert not any("copies" in label for label in tile_labels(fig))


def test_label_lines_come_in_the_documented_order():
    (last,) = tile_labels(draw_sharding((10,), NamedSharding(MESH, P("data"))))[-1:]
    assert last == "dev 6,7\n(1)\n4 B\npadded to (3)\n2 copies"
    labels = tile_labels(draw_sharding((8, 8), NamedSharding(MESH, P(None, "model")), show_bytes=False))
    assert labels[0] == "dev 0,2,4,6\n(8, 4)\n4 copies"


def test_a_big_deck_shows_fewer_cards_when_the_block_is_small():
    fig, ax = plt.subplots()
    drawing._draw_deck(ax, 0, 0, 1, 1, [device_color(i) for i in range(64)], (10.0, 10.0))  # a 10 x 10 pt block
    cards = _cards(ax)
    assert 2 <= len(cards) < 64 and to_rgba(cards[0].get_facecolor(), 1.0) == to_rgba(device_color(0), 1.0)
    plt.close(fig)


@pytest.mark.parametrize("spec", [P(None, "model"), P("data", None), P(), P("data", "model"), P("model", "data")],
                         ids=str)
def test_labels_never_overlap(spec):
    pair = {"w": ((512, 1024), NamedSharding(MESH, spec)), "b": ((1024,), NamedSharding(MESH, P()))}
    for fig in (draw_sharding((512, 1024), NamedSharding(MESH, spec)), draw_shardings(pair)):
        boxes = label_boxes(fig)
        for i, (a_text, a) in enumerate(boxes):
            for b_text, b in boxes[i + 1 :]:
                assert not a.overlaps(b), (a_text, b_text)
        assert all(t.get_fontsize() >= drawing._MIN_FONT for ax in fig.axes for t in ax.texts)


def test_many_blocks_in_one_dimension_wrap_onto_rows():
    # 64 blocks of a 1-D array, as on a 64-device mesh (tests run with 8 devices, so the tiles are made by hand)
    tiles_64 = [Tile((16 * i,), (16 * (i + 1),), (i,), (16,)) for i in range(64)]
    fig, ax = plt.subplots(figsize=(9, 4))
    drawing._draw_tiles(ax, (1024,), None, [(t, drawing._tile_lines(t, 4, True)) for t in tiles_64], None, 0, 0.3)
    drawing._finish(fig)
    assert len(patches(fig, "array")) == 4  # 4 rows of 16 blocks
    ys = sorted({round(p.get_y(), 6) for p in patches(fig, "tile")})
    assert len(ys) == 4 and ax.get_xlabel() == "dim 0 (1024), wrapped: 256 per row"
    assert all(t.get_fontsize() >= 6 for t in ax.texts if t.get_gid() == "tile-label")  # legible, not squeezed
    plt.close(fig)


# --- contents: what each block holds --------------------------------------------------------------------------------


def _ring_shift(x):
    ring = [(i, (i + 1) % 4) for i in range(4)]
    return jax.shard_map(lambda b: jax.lax.ppermute(b, "data", ring), mesh=MESH, in_specs=P("data", "model"),
                         out_specs=P("data", "model"))(x)


def _first(b):
    return f"starts {b.flat[0]:.0f}"


def test_contents_tell_a_ppermute_before_from_after():
    x = jax.device_put(jnp.arange(16.0 * 8).reshape(16, 8), NamedSharding(MESH, P("data", "model")))
    xp = _ring_shift(x)
    before = tile_labels(draw_sharding(x, contents=_first, show_bytes=False))
    after = tile_labels(draw_sharding(xp, contents=_first, show_bytes=False))
    assert before[0] == "dev 0\n(4, 4)\nstarts 0"
    assert before != after
    assert [a.split("\n")[:2] for a in after] == [b.split("\n")[:2] for b in before]  # same layout
    by_dev = {label.split("\n")[0]: label.split("\n")[-1] for label in before}
    assert after[2].split("\n")[-1] == by_dev["dev 0"]  # dev 2 now holds what dev 0 held
    both = tile_labels(draw_shardings({"before": x, "after": xp}, ncols=2, contents=_first, show_bytes=False))
    assert both == before + after


def test_contents_of_copies_one_line_when_equal_else_per_device():
    same = jax.device_put(jnp.ones((4, 2)), NamedSharding(MESH, P("data")))
    assert tile_labels(draw_sharding(same, contents=_first))[0] == "dev 0,1\n(1, 2)\n8 B\n2 copies\nstarts 1"
    shards = [jax.device_put(np.full((1, 2), d.id, np.float32), d) for d in MESH.devices.flat]
    differ = jax.make_array_from_single_device_arrays((4, 2), NamedSharding(MESH, P("data")), shards)
    assert tile_labels(draw_sharding(differ, contents=_first))[0].endswith("2 copies\ndev 0: starts 0\ndev 1: starts 1")


@pytest.mark.parametrize(
    "call,exc,message",
    [
        (lambda: draw_sharding((8, 8), NamedSharding(MESH, P()), contents=_first), TypeError, "no data"),
        (lambda: draw_shardings({"w": ((8, 8), NamedSharding(MESH, P()))}, contents=_first), TypeError, "'w'"),
        (lambda: draw_sharding(jnp.ones(8), contents=lambda b: 3), TypeError, "must return a str"),
        (lambda: draw_sharding(jnp.ones(8), contents="first"), TypeError, "a function of one block"),
    ],
)
def test_contents_bad_input(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


# --- draw_permute ----------------------------------------------------------------------------------------------------


def _arrows(fig):
    return [p.get_label() for ax in fig.axes for p in ax.patches if p.get_gid() == "permute-arrow"]


def _notes(fig, gid):
    return [t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid() == gid]


def test_draw_permute_arrows_are_the_compiled_source_target_pairs():
    ring = [(i, (i + 1) % 4) for i in range(4)]
    fig = draw_permute(MESH, "data", ring)
    x = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(MESH, P("data", "model")))
    hlo = jax.jit(_ring_shift).lower(x).compile().as_text()
    pairs = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", hlo).group(1)
    compiled = {f"dev {a} -> dev {b}" for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs)}
    assert set(_arrows(fig)) == compiled and len(_arrows(fig)) == 8  # two rings of 4, one per model column
    assert _notes(fig, "zeros-note") == []
    assert "0\u21921, 1\u21922, 2\u21923, 3\u21920" in fig._suptitle.get_text()


def test_draw_permute_marks_devices_that_receive_zeros_or_keep_their_block():
    fig = draw_permute(MESH, "data", [(0, 2), (2, 0), (1, 1)])
    assert sorted(_arrows(fig)) == ["dev 0 -> dev 4", "dev 1 -> dev 5", "dev 4 -> dev 0", "dev 5 -> dev 1"]
    assert _notes(fig, "zeros-note") == ["receives zeros"] * 2  # data index 3: devices 6 and 7
    assert _notes(fig, "keeps-note") == ["keeps its block"] * 2
    mesh_1d = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,))
    one = draw_permute(mesh_1d, "x", [(i, (i + 1) % 8) for i in range(8)])
    assert len(_arrows(one)) == 8 and mesh_labels(one) == [[list(range(8))]]
    model = draw_permute(MESH, "model", [(0, 1), (1, 0)])
    assert sorted(_arrows(model))[:2] == ["dev 0 -> dev 1", "dev 1 -> dev 0"] and len(_arrows(model)) == 8


MESH3 = jax.make_mesh((2, 2, 2), ("pod", "data", "model"), axis_types=(AxisType.Auto,) * 3)


@pytest.mark.parametrize(
    "call,exc,message",
    [
        (lambda: draw_permute((4, 2), "data", [(0, 1)]), TypeError, "needs a jax.sharding.Mesh"),
        (lambda: draw_permute(MESH, "rows", [(0, 1)]), ValueError, r"no axis 'rows'; its axes are \('data', 'model'\)"),
        (lambda: draw_permute(MESH, "data", [(0, 4)]), ValueError, "not device ids"),
        (lambda: draw_permute(MESH, "data", [(0, 1), (0, 2)]), ValueError, "source twice"),
        (lambda: draw_permute(MESH, "data", [(0, 1), (2, 1)]), ValueError, "destination twice"),
        (lambda: draw_permute(MESH, "data", [0, 1]), ValueError, r"\(source, destination\) index pairs"),
        (lambda: draw_permute(MESH, "data", [(0.5, 1)]), ValueError, r"\(source, destination\) index pairs"),
        (lambda: draw_permute(MESH3, "pod", [(0, 1)]), ValueError, "among its last two axes"),
    ],
)
def test_draw_permute_bad_input(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_draw_permute_on_a_3d_mesh_draws_one_slice():
    fig = draw_permute(MESH3, "model", [(0, 1), (1, 0)])
    assert "first pod=0 slice shown" in fig._suptitle.get_text() and len(_arrows(fig)) == 4


# --- the inline switch -----------------------------------------------------------------------------------------------


class _FakeShell:
    def __init__(self, kernel=True):
        if kernel:
            self.kernel = object()
        self.magics = []

    def run_line_magic(self, name, line):
        self.magics.append((name, line))


@pytest.mark.parametrize("backend", ["agg", "Agg"])
def test_inline_switch_in_a_kernel_on_agg(backend):
    shell = _FakeShell()
    assert drawing._show_figures_inline(shell, backend) is True
    assert shell.magics == [("matplotlib", "inline")]


@pytest.mark.parametrize("backend", ["module://ipympl.backend_nbagg", "widget", "module://matplotlib_inline.backend_inline",
                                     "QtAgg", "TkAgg"])
def test_inline_switch_leaves_a_chosen_backend_alone(backend):
    shell = _FakeShell()
    assert drawing._show_figures_inline(shell, backend) is False
    assert shell.magics == []


def test_inline_switch_needs_a_kernel():
    shell = _FakeShell(kernel=False)  # terminal IPython: no kernel, nothing to display inline
    assert drawing._show_figures_inline(shell, "agg") is False and shell.magics == []
    assert drawing._show_figures_inline(None, "agg") is False  # plain Python (pytest): no shell at all


# --- one true aspect per array, one scale per matmul, axes that name the mesh axes ----------------------------------


def _ratio(box):
    return box.height / box.width


SPECS_128x512 = [P("data"), P(None, "model"), P("data", "model"), P()]


def test_every_layout_of_one_array_is_drawn_at_its_true_aspect_and_the_same_size():
    grid = draw_shardings({str(s): ((128, 512), _ns(s)) for s in SPECS_128x512}, ncols=4)
    boxes = extents(grid)
    assert len(boxes) == 4 and all(abs(_ratio(b) - 128 / 512) < 0.01 for b in boxes)
    assert max(b.width for b in boxes) - min(b.width for b in boxes) < 1  # pixels
    assert not any("not to scale" in ax.get_xlabel() for ax in grid.axes)
    mesh_1d = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    for fig in [draw_sharding((128, 512), NamedSharding(mesh_1d, P("data")))] + [
            draw_sharding((128, 512), _ns(s)) for s in SPECS_128x512]:
        (box,) = extents(fig)
        assert abs(_ratio(box) - 0.25) < 0.01  # wider than tall, as the array is
    tall = draw_sharding((512, 128), _ns(P("data", "model")))
    assert abs(_ratio(extents(tall)[0]) - 4) < 0.04
    panels = draw_sharding((2, 128, 512), _ns(P("model", "data", None)))
    assert [round(_ratio(b), 2) for b in extents(panels)] == [0.25, 0.25]


def test_an_extreme_aspect_is_clamped_and_says_so():
    fig = draw_sharding((8, 4096), _ns(P(None, "model")))
    (box,) = extents(fig)
    assert abs(_ratio(box) - 1 / 8) < 0.01
    assert "not to scale (true height:width 1:512)" in fig.axes[0].get_xlabel()


def test_thin_blocks_put_their_label_lines_side_by_side():
    mesh_1d = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    fig = draw_sharding((128, 512), NamedSharding(mesh_1d, P("data")))
    texts = [t for t in fig.axes[0].texts if t.get_gid() == "tile-label"]
    assert texts[0].get_text() == "dev 0 \u00b7 (16, 512) \u00b7 32.0 KiB"  # as drawn: one row
    assert tile_labels(fig)[0] == "dev 0\n(16, 512)\n32.0 KiB"  # as documented: one line each
    assert all(t.get_fontsize() >= 6.5 for t in texts)


def test_axis_labels_name_the_mesh_axes_that_cut_them():
    ax = draw_sharding((128, 512), _ns(P("data", "model"))).axes[0]
    assert (ax.get_ylabel(), ax.get_xlabel()) == ("dim 0 (128) \u00f7 data (4)", "dim 1 (512) \u00f7 model (2)")
    ax = draw_sharding((128, 512), _ns(P(None, ("data", "model")))).axes[0]
    assert (ax.get_ylabel(), ax.get_xlabel()) == ("dim 0 (128)", "dim 1 (512) \u00f7 data\u00d7model (8)")
    ax = draw_sharding((10,), _ns(P(("model", "data")))).axes[0]
    assert ax.get_xlabel() == "dim 0 (10) \u00f7 model\u00d7data (8)"


def test_replica_zero_is_the_top_card_of_each_deck():
    reversed_mesh = jax.sharding.Mesh(np.array(jax.devices())[::-1].reshape(4, 2), ("data", "model"),
                                      axis_types=(AxisType.Auto,) * 2)
    x = jax.device_put(jnp.ones((16, 8)), NamedSharding(reversed_mesh, P(None, "model")))
    first = {s.device.id for s in x.addressable_shards if s.replica_id == 0}
    cards = _cards(draw_sharding(x).axes[0])
    tops = {}
    for card in cards:  # the top card of each block: the highest zorder at its left edge's block
        block = int(card.get_x() >= 0.5)
        if block not in tops or card.get_zorder() > tops[block].get_zorder():
            tops[block] = card
    colours = {to_rgba(device_color(d), 1.0): d for d in range(8)}
    assert {colours[to_rgba(c.get_facecolor(), 1.0)] for c in tops.values()} == first == {7, 6}


def test_color_by_colours_the_cards_by_a_group_of_devices():
    hosts = {d.id: d.id // 4 for d in jax.devices()}  # as if devices 0-3 and 4-7 sat on two hosts
    fig = draw_sharding((16, 8), _ns(P(("data", "model"))), color_by=lambda d: hosts[d.id])
    cards = sorted(_cards(fig.axes[0]), key=lambda c: c.get_y())
    assert [to_rgba(c.get_facecolor(), 1.0) for c in cards] == [to_rgba(device_color(i // 4), 1.0) for i in range(8)]
    assert [label.split("\n")[0] for label in tile_labels(fig)] == [f"dev {i}" for i in range(8)]  # still by device


def test_show_slices_labels_each_block_with_its_part_of_the_array():
    fig = draw_sharding((16, 8), _ns(P("data", None)), show_slices=True, show_bytes=False)
    rows = [label.split("\n")[-1] for label in tile_labels(fig)]  # after "dev 0,1", "(4, 8)" and "2 copies"
    assert sorted(rows, key=lambda r: int(r[1:].split(":")[0])) == [f"[{4 * i}:{4 * i + 4}, :]" for i in range(4)]
    plain = draw_sharding((16, 8), _ns(P("data", None)), show_bytes=False)
    assert not any("[" in label for label in tile_labels(plain))  # off by default
    with pytest.raises(TypeError, match="show_slices is True or False"):
        draw_sharding((16, 8), _ns(P("data", None)), show_slices="rows")


# --- draw_memory: stacked bars of bytes per device ------------------------------------------------------------------


def test_draw_memory_stacks_each_variant_on_one_scale_with_hatching_not_colour():
    from spmd_course.utils.drawing import draw_memory

    bars = {"ZeRO-1": {"parameters": 128 * 2**20, "Adam": 32 * 2**20, "rest": 200 * 2**20},
            "ZeRO-3": {"parameters": 16 * 2**20, "Adam": 32 * 2**20, "rest": 40 * 2**20}}
    fig = draw_memory(bars, title="memory")
    ax = fig.axes[0]
    segments = [p for p in ax.patches if p.get_gid() == "memory-segment"]
    assert len(segments) == 6
    assert [round(p.get_width()) for p in segments[:3]] == [128 * 2**20, 32 * 2**20, 200 * 2**20]  # bytes, one scale
    assert segments[1].get_x() == 128 * 2**20  # stacked: each segment starts where the last ended
    assert {p.get_facecolor() for p in segments} == {(1.0, 1.0, 1.0, 1.0)}  # no colour: colour means device
    assert len({p.get_hatch() for p in segments[:3]}) == 3  # each category its own hatch
    totals = [t.get_text() for t in ax.texts if t.get_gid() == "memory-total"]
    assert totals == ["360.0 MiB", "88.0 MiB"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["ZeRO-1", "ZeRO-3"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["parameters", "Adam", "rest"]


def test_draw_memory_refuses_bad_input_with_the_fix():
    from spmd_course.utils.drawing import draw_memory

    with pytest.raises(TypeError, match="variant"):
        draw_memory([1, 2])
    with pytest.raises(ValueError, match="in that order"):
        draw_memory({"a": {"x": 1, "y": 2}, "b": {"y": 2, "x": 1}})
    with pytest.raises(ValueError, match="at least 0"):
        draw_memory({"a": {"x": -1}})
    with pytest.raises(ValueError, match="at most"):
        draw_memory({"a": {str(i): 1 for i in range(9)}})


def test_draw_pipeline_colours_each_stage_by_its_device_and_leaves_the_bubble_white():
    from spmd_course.utils.drawing import draw_pipeline

    work = np.array([[0, 1, -1], [-1, 0, 1]])  # 2 stages, 2 micro-batches, 3 iterations: GPipe's forward
    fig = draw_pipeline(work, [5, 2], backward=[[False, True, False], [False, False, True]], title="GPipe")
    ax = fig.axes[0]
    busy = [p for p in ax.patches if p.get_gid() == "busy"]
    idle = [p for p in ax.patches if p.get_gid() == "idle"]
    assert len(busy) == 4 and len(idle) == 2
    assert {p.get_facecolor() for p in busy if p.get_y() == 0} == {device_color(5)}  # stage 0 runs on device 5
    assert {p.get_facecolor() for p in busy if p.get_y() == 1} == {device_color(2)}
    assert {p.get_facecolor() for p in idle} == {to_rgba("white")}
    assert [(p.get_x(), p.get_y()) for p in idle] == [(2, 0), (0, 1)]  # column = iteration, row = stage
    labels = [t.get_text() for t in ax.texts if t.get_gid() == "cell-label"]
    assert labels == ["F0", "B1", "F0", "B1"]
    assert sum(bool(p.get_hatch()) for p in busy) == 2  # backward cells hatched
    assert "time" in ax.get_xlabel()  # a timeline has a time axis
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stage 0 (dev 5)", "stage 1 (dev 2)"]
    assert "2 of 6" in fig._suptitle.get_text() and "33%" in fig._suptitle.get_text()


def test_draw_pipeline_refuses_bad_input_with_the_fix():
    from spmd_course.utils.drawing import draw_pipeline

    with pytest.raises(TypeError, match="2-D array of whole numbers"):
        draw_pipeline([0, 1], [0])
    with pytest.raises(TypeError, match="whole numbers"):
        draw_pipeline(np.zeros((2, 2)), [0, 1])
    with pytest.raises(ValueError, match="-1 for an idle"):
        draw_pipeline(np.array([[0, -2]]), [0])
    with pytest.raises(ValueError, match="one id per row"):
        draw_pipeline(np.array([[0, 1]]), [0, 1])
    with pytest.raises(ValueError, match="shape of work"):
        draw_pipeline(np.array([[0, 1]]), [0], backward=[[True]])


# --- draw_ring_steps: which block each device holds at each step of a ring -------------------------------------------


def test_draw_ring_steps_colours_each_block_by_the_device_it_started_on():
    from spmd_course.utils.drawing import device_color, draw_ring_steps

    ids = [3, 1, 0, 2]  # ids in ring order, not sorted: colours must follow them
    holds = [[(d - s) % 4 for d in range(4)] for s in range(4)]
    work = [[1.0] * 4] + [[0.5, 0.0, 1.0, 0.5]] * 3
    labels = [[f"KV {h}" for h in row] for row in holds]
    fig = draw_ring_steps({"ring": {"holds": holds, "work": work, "labels": labels}}, ids)
    cells = [p for p in fig.axes[0].patches if p.get_gid() == "ring-cell"]
    assert len(cells) == 16
    cell = next(c for c in cells if c.get_label() == "dev 1, step 1: block of dev 3, work 0")
    assert cell.get_facecolor() == device_color(3) and cell.get_width() == 0.0
    assert next(c for c in cells if c.get_label().startswith("dev 0, step 2")).get_width() == 1.0
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "KV 2" in texts and "4" in texts and "2.5" in texts  # a label; the steps' length, 1 + 3 x 1; device 0


def test_draw_ring_steps_refuses_bad_input_with_the_fix():
    from spmd_course.utils.drawing import draw_ring_steps

    good = {"holds": [[0, 1], [1, 0]], "work": [[1, 1], [0.5, 0.5]], "labels": [["a", "b"], ["c", "d"]]}
    with pytest.raises(TypeError, match="panel title"):
        draw_ring_steps({}, [0, 1])
    with pytest.raises(ValueError, match="missing \\['work'\\]"):
        draw_ring_steps({"x": {"holds": good["holds"], "labels": good["labels"]}}, [0, 1])
    with pytest.raises(ValueError, match="one column per device"):
        draw_ring_steps({"x": good}, [0, 1, 2])
    with pytest.raises(ValueError, match="positions along the ring"):
        draw_ring_steps({"x": {**good, "holds": [[0, 2], [1, 0]]}}, [0, 1])
    with pytest.raises(ValueError, match="from 0 to 1"):
        draw_ring_steps({"x": {**good, "work": [[1, 2], [0, 0]]}}, [0, 1])
    with pytest.raises(ValueError, match="at least 2 devices"):
        draw_ring_steps({"x": good}, [0])


# --- meshes not in id order, every mesh shape the notebooks use (notebooks 00-02) ---------------------------------


def test_draw_sharding_names_the_holder_on_a_reordered_mesh():
    labels = tile_labels(draw_sharding((128, 512), NamedSharding(v5e_ordered_mesh(), P("data"))))
    assert len(labels) == 8
    assert all(device_label([d]) in label.split("\n") for label, d in zip(labels, V5E_ORDER, strict=True))


@pytest.mark.parametrize("shape", [(8,), (8, 1), (4, 2), (2, 4), (2, 2, 2)], ids=str)
def test_draw_mesh_shows_every_device_once(shape):
    names = ("data", "model", "pipeline")[: len(shape)]
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
    assert sorted(np.ravel(mesh_labels(draw_mesh(mesh))).tolist()) == list(range(8))


def test_draw_mesh_shows_a_reordered_mesh_in_its_order():
    assert mesh_labels(draw_mesh(v5e_ordered_mesh())) == [[list(V5E_ORDER)]]


# --- 3-D arrays: labels with bytes, panels that follow the mesh's columns (notebook 03) ---------------------------

MESH_EXPLICIT = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def test_3d_blocks_are_labelled_with_their_full_shape_and_bytes():
    labels = tile_labels(draw_sharding((2, 128, 512), NamedSharding(MESH_EXPLICIT, P(None, "data", "model"))))
    assert len(labels) == 8 and all("(2, 32, 256)\n64.0 KiB" in label for label in labels)
    assert labels[3].startswith("dev 3\n")


def test_a_sharded_leading_dimension_gives_one_panel_per_mesh_column():
    fig = draw_sharding((2, 128, 512), NamedSharding(MESH_EXPLICIT, P("model", "data", None)))
    assert [ax.get_title() for ax in fig.axes] == ["dim 0 = 0:1", "dim 0 = 1:2"]
    labels = tile_labels(fig)
    assert [label.split("\n")[0] for label in labels] == [f"dev {d}" for d in (0, 2, 4, 6, 1, 3, 5, 7)]
    assert all("(1, 32, 512)\n64.0 KiB" in label for label in labels)


def test_a_kernel_split_over_model_is_drawn_as_two_decks_of_four():
    labels = tile_labels(draw_sharding((512, 1024), NamedSharding(MESH_EXPLICIT, P(None, "model"))))
    assert "dev 0,2,4,6\n(512, 512)\n1.0 MiB\n4 copies" in labels


# --- the rings of notebook 06: draw_permute between mesh positions, draw_rings ------------------------------------
# 06 section 5 draws its ring shift along 'data' with ``draw_permute`` before running it. The arrows must join mesh
# positions, and name the devices that sit there: in id order (the CPU) and in the order a TPU v5e-8 host's
# ``jax.make_mesh`` gives, where the same positions hold other ids. Section 6 draws its recorded ring all-gather and
# reduce-scatter with ``utils.drawing.draw_rings``: each arrow must carry the block that the next device holds new in
# the next frame, and a sum must show the colours of its contributors.
RING = [(i, (i + 1) % 4) for i in range(4)]  # 06 section 5: position i along 'data' sends to i + 1


@pytest.mark.parametrize("order", [tuple(range(8)), V5E_ORDER], ids=["id order", "v5e order"])
def test_the_ring_of_06_is_drawn_between_mesh_positions(order):
    devices = jax.devices()
    mesh = Mesh(np.array([devices[i] for i in order]).reshape(4, 2), ("data", "model"),
                axis_types=(AxisType.Auto, AxisType.Auto))
    ids = mesh.device_ids
    want = sorted(f"dev {ids[a, j]} -> dev {ids[b, j]}" for a, b in RING for j in range(2))
    assert sorted(_arrows(draw_permute(mesh, "data", RING))) == want
    if order == V5E_ORDER:  # the wrap-around of the first column: data index 3 holds device 5 there, not 6
        assert "dev 5 -> dev 0" in want and "dev 6 -> dev 0" not in want


# 06 section 6 draws its two rings with ``utils.drawing.draw_rings``.
# Frames of a 4-device ring all-gather: after step f, the device at position i holds blocks i-f .. i.
def _gather_frames(ids):
    n = len(ids)
    return [[{(i - s) % n: (ids[(i - s) % n],) for s in range(f + 1)} for i in range(n)] for f in range(n)]


@pytest.fixture(scope="module")
def draw_rings():
    from spmd_course.utils.drawing import draw_rings

    return draw_rings


@pytest.mark.parametrize("ids", [[0, 2, 4, 6], [0, 2, 7, 5]], ids=["id order", "v5e order"])
def test_draw_rings_sends_the_block_the_next_device_gets_in_the_next_frame(draw_rings, ids):
    from matplotlib.colors import to_rgba

    from spmd_course.utils.drawing import device_color

    fig = draw_rings({"all-gather": _gather_frames(ids)}, ids)
    (ax,) = fig.axes
    arrows = [p.get_label() for p in ax.patches if p.get_gid() == "ring-arrow"]
    # at step f + 1 the device at position i passes on block i - f, the one it got last
    want = [f"dev {ids[i]} -> dev {ids[(i + 1) % 4]}: block {(i - f) % 4}" for f in range(3) for i in range(4)]
    assert arrows == want
    blocks = [p for p in ax.patches if p.get_gid() == "ring-block"]
    assert len(blocks) == sum(range(1, 5)) * 4  # 1, 2, 3, then 4 blocks on each of 4 devices
    assert {to_rgba(p.get_facecolor()) for p in blocks} == {to_rgba(device_color(d)) for d in ids}
    assert min(t.get_fontsize() for t in ax.texts) >= 6.5


def test_draw_rings_stripes_a_sum_in_the_colours_of_its_contributors(draw_rings):
    ids = [0, 2, 4, 6]
    frames = [[{i: (ids[i],)} for i in range(4)], [{(i + 1) % 4: (ids[i], ids[(i + 1) % 4])} for i in range(4)]]
    fig = draw_rings({"a sum": frames}, ids)
    (ax,) = fig.axes
    labels = sorted(t.get_text() for t in ax.texts if t.get_gid() == "ring-label")
    assert labels == sorted(["0", "2", "4", "6", "0+2", "2+4", "4+6", "6+0"])
    widths = {round(p.get_width(), 3) for p in ax.patches if p.get_gid() == "ring-block"}
    assert len(widths) == 2  # whole blocks, and halves for the sums of two


def test_draw_rings_refuses_frames_where_no_block_moved(draw_rings):
    ids = [0, 2, 4, 6]
    still = [{i: (ids[i],)} for i in range(4)]
    with pytest.raises(ValueError, match="exactly one new or updated block"):  # nothing arrived: no send to draw
        draw_rings({"stuck": [still, still]}, ids)


def test_draw_rings_refuses_a_frame_without_every_device_and_an_empty_ring(draw_rings):
    ids = [0, 2, 4, 6]
    with pytest.raises(ValueError, match="one entry per device"):
        draw_rings({"short": [[{0: (0,)}]]}, ids)
    with pytest.raises(ValueError, match="at least one ring"):
        draw_rings({}, ids)


def _reduce_scatter_frames(ids):
    """A ring reduce-scatter as 06 §6 records it: position i starts with block i - 1 and, at step f, receives the
    running sum of block i - f - 1, to which it adds its own partial."""
    n = len(ids)
    return [[{(i - 1 - f) % n: tuple(ids[(i - k) % n] for k in range(f, -1, -1))} for i in range(n)]
            for f in range(n)]


def test_draw_rings_shows_each_devices_own_partials_and_the_one_it_added():
    from matplotlib.colors import to_rgba

    from spmd_course.utils.drawing import device_color, draw_rings

    ids = [0, 2, 7, 5]  # ring order, not id order: the colours must follow the ids
    frames = _reduce_scatter_frames(ids)
    fig = draw_rings({"rs": frames, "plain": frames}, ids, own_partials=["rs"])
    rs, plain = fig.axes
    own = [p for p in rs.patches if p.get_gid() == "ring-own"]
    assert len(own) == 4 * 4 * 4  # every device, every block, every frame: it holds them all from the start
    assert all(p.get_alpha() < 0.5 for p in own)  # faint, under the running sums
    first = next(p for p in own if p.get_label() == "dev 7: own partial of block 1")
    assert to_rgba(first.get_facecolor(), 1) == to_rgba(device_color(7), 1)
    added = [p for p in rs.patches if p.get_gid() == "ring-own-added"]
    assert len(added) == 4 * 4  # one per device per frame: the start's block, then each received sum
    # the outlined partial sits at the height of the block that is new on that device in that frame
    # (each device holds one block per frame here; its first stripe starts 0.5 right of the own column)
    block_at = {(round(p.get_x(), 6), round(p.get_y(), 6)) for p in rs.patches if p.get_gid() == "ring-block"}
    assert {(round(p.get_x() + 0.5, 6), round(p.get_y(), 6)) for p in added} <= block_at
    assert not [p for p in plain.patches if p.get_gid() in ("ring-own", "ring-own-added")]  # only where asked


def test_draw_rings_refuses_own_partials_of_a_ring_it_does_not_draw():
    from spmd_course.utils.drawing import draw_rings

    ids = [0, 2, 4, 6]
    frames = _reduce_scatter_frames(ids)
    with pytest.raises(ValueError, match="list of ring titles"):
        draw_rings({"rs": frames}, ids, own_partials=["other"])
    with pytest.raises(ValueError, match="list of ring titles"):
        draw_rings({"rs": frames}, ids, own_partials="rs")  # a bare string is not a list of titles


def _inches_per_element(ax, shape):
    """(across, down) inches per element of the array outline drawn in ``ax`` (gid 'array')."""
    outline = next(p for p in ax.patches if p.get_gid() == "array")
    (x0, y0), (x1, y1) = ax.transData.transform([(outline.get_x(), outline.get_y()),
                                                 (outline.get_x() + outline.get_width(),
                                                  outline.get_y() + outline.get_height())])
    dpi = ax.figure.dpi
    return abs(x1 - x0) / dpi / shape[-1], abs(y1 - y0) / dpi / shape[-2] if len(shape) > 1 else None


def test_draw_shardings_same_scale_draws_every_array_at_one_scale():
    arrays = {"w1": ((64, 256), _ns(P(None, "model"))), "b1": ((256,), _ns(P("model"))),
              "w2": ((256, 10), _ns(P("model", None))), "x": ((16, 8), _ns(P("data", "model")))}
    fig = draw_shardings(arrays, ncols=4, same_scale=True)
    fig.canvas.draw()
    scales = [_inches_per_element(ax, shape) for ax, (shape, _) in zip(fig.axes, arrays.values(), strict=True)]
    across = [a for a, _ in scales]
    down = [d for _, d in scales if d is not None]
    assert max(across + down) / min(across + down) < 1.01  # one element, one size, in every panel and direction
    default = draw_shardings(arrays, ncols=4)
    default.canvas.draw()
    alone = [_inches_per_element(ax, shape)[0] for ax, (shape, _) in zip(default.axes, arrays.values(), strict=True)]
    assert max(alone) / min(alone) > 2  # the default sizes each panel alone: the check above can fail


def test_same_scale_puts_a_label_beside_a_block_too_narrow_for_it():
    fig = draw_shardings({"w1": ((64, 256), _ns(P())), "w2": ((256, 10), _ns(P("model")))}, ncols=2,
                         same_scale=True)
    wide, narrow = ([t for t in ax.texts if t.get_gid() == "tile-label"] for ax in fig.axes)
    assert all(t.get_position()[0] < 1 and t.get_horizontalalignment() == "center" for t in wide)
    assert all(t.get_position()[0] > 1 and t.get_horizontalalignment() == "left" for t in narrow)
    assert len(tile_labels(fig)) == 1 + 2  # every block keeps its label


def test_same_scale_rejects_a_non_bool():
    with pytest.raises(TypeError, match="same_scale is True or False"):
        draw_shardings({"w": ((8, 8), _ns(P()))}, same_scale="yes")


def test_same_scale_turns_the_labels_of_a_row_of_narrow_blocks():
    fig = draw_shardings({"w": ((16, 256), _ns(P())), "b": ((64,), _ns(P(("data", "model"))))}, ncols=2,
                         same_scale=True)
    strip = [t for t in fig.axes[1].texts if t.get_gid() == "tile-label"]
    assert len(strip) == 8 and all(t.get_rotation() == 90 for t in strip)  # side by side: turned, not beside
    assert all(t.get_position()[0] < 1 for t in strip)  # inside the array


def test_same_scale_thins_labels_beside_blocks_thinner_than_a_line():
    fig = draw_shardings({"w": ((16, 512), _ns(P())), "thin": ((16, 8), _ns(P(("data", "model"))))}, ncols=2,
                         same_scale=True)
    shown = [t for t in fig.axes[1].texts if t.get_gid() == "tile-label" and t.get_text()]
    assert 1 <= len(shown) < 8  # 8 blocks of 2 rows: fewer labels than blocks, none on top of another
    assert len(tile_labels(fig)) == 1 + 8  # every block still names its devices in its label
