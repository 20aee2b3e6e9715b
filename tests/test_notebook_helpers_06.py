"""Helper behaviour that notebook 06 relies on, tested here so the notebook asserts only its lessons.

06 section 5 draws its ring shift along 'data' with ``draw_permute`` before running it. The arrows must
join mesh positions, and name the devices that sit there: in id order (the CPU) and in the order a TPU
v5e-8 host's ``jax.make_mesh`` gives, where the same positions hold other ids. Section 6 draws its recorded
ring all-gather and reduce-scatter with ``utils.drawing.draw_rings``: each arrow must carry the block
that the next device holds new in the next frame, and a sum must show the colours of its contributors.
"""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh

from utils.drawing import draw_permute

RING = [(i, (i + 1) % 4) for i in range(4)]  # 06 section 5: position i along 'data' sends to i + 1
V5E = (0, 1, 2, 3, 7, 6, 5, 4)  # jax.make_mesh's order on a TPU v5e-8 host


def _arrows(fig):
    return [p.get_label() for p in fig.axes[0].patches if p.get_gid() == "permute-arrow"]


@pytest.mark.parametrize("order", [tuple(range(8)), V5E], ids=["id order", "v5e order"])
def test_the_ring_of_06_is_drawn_between_mesh_positions(order):
    devices = jax.devices()
    mesh = Mesh(np.array([devices[i] for i in order]).reshape(4, 2), ("data", "model"),
                axis_types=(AxisType.Auto, AxisType.Auto))
    ids = mesh.device_ids
    want = sorted(f"dev {ids[a, j]} -> dev {ids[b, j]}" for a, b in RING for j in range(2))
    assert sorted(_arrows(draw_permute(mesh, "data", RING))) == want
    if order == V5E:  # the wrap-around of the first column: data index 3 holds device 5 there, not 6
        assert "dev 5 -> dev 0" in want and "dev 6 -> dev 0" not in want


# 06 section 6 draws its two rings with ``utils.drawing.draw_rings``.
# Frames of a 4-device ring all-gather: after step f, the device at position i holds blocks i-f .. i.
def _gather_frames(ids):
    n = len(ids)
    return [[{(i - s) % n: (ids[(i - s) % n],) for s in range(f + 1)} for i in range(n)] for f in range(n)]


@pytest.fixture(scope="module")
def draw_rings():
    from utils.drawing import draw_rings

    return draw_rings


@pytest.mark.parametrize("ids", [[0, 2, 4, 6], [0, 2, 7, 5]], ids=["id order", "v5e order"])
def test_draw_rings_sends_the_block_the_next_device_gets_in_the_next_frame(draw_rings, ids):
    from matplotlib.colors import to_rgba

    from utils.drawing import device_color

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
