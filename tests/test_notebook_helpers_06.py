"""Helper behaviour that notebook 06 relies on, tested here so the notebook asserts only its lessons.

06 section 5 draws its ring shift along 'data' with ``draw_permute`` before running it. The arrows must
join mesh positions, and name the devices that sit there: in id order (the CPU) and in the order a TPU
v5e-8 host's ``jax.make_mesh`` gives, where the same positions hold other ids.
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
