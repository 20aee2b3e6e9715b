"""draw_routing: a cell per routed choice in its destination's colour, dropped choices hatched, bad input named."""

import numpy as np
import pytest
from matplotlib.colors import to_rgba

from spmd_course.utils.drawing import device_color, draw_routing


def _cells(fig, gid):
    return [p for p in fig.axes[0].patches if p.get_gid() == gid]


def test_each_choice_is_a_cell_in_its_destination_colour_and_drops_are_hatched():
    dest = np.array([[3, 5, -1, 3], [5, 5, 3, -1]])
    fig = draw_routing(dest, sources=[3, 5], title="two devices")
    routed, dropped = _cells(fig, "routed"), _cells(fig, "dropped")
    assert len(routed) == 6 and len(dropped) == 2
    assert sorted(p.get_label() for p in dropped) == ["dev 3 -> dropped", "dev 5 -> dropped"]
    by_label = {}
    for p in routed:
        by_label.setdefault(p.get_label(), []).append(p.get_facecolor())
    assert sorted((k, len(v)) for k, v in by_label.items()) == [
        ("dev 3 -> dev 3", 2), ("dev 3 -> dev 5", 1), ("dev 5 -> dev 3", 1), ("dev 5 -> dev 5", 2)]
    for label, colours in by_label.items():
        target = int(label.rsplit(" ", 1)[1])
        assert all(np.allclose(c, to_rgba(device_color(target))) for c in colours)
    assert all(p.get_hatch() == "////" for p in dropped)
    notes = [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "row-note"]
    assert notes == ["keeps 2, sends 1, drops 1", "keeps 2, sends 1, drops 1"]
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["dev 3", "dev 5"]
    assert fig._suptitle.get_text() == "two devices"


@pytest.mark.parametrize(
    "dest,sources,message",
    [
        (np.array([1, 2]), [0], "2-D array"),
        (np.array([[0.5, 1.0]]), [0], "whole numbers"),
        (np.zeros((0, 3), int), [], "2-D array"),
        (np.array([[0, -2]]), [0], "found -2"),
        (np.array([[0, 1]]), [0, 1], "each of the 1 rows"),
        (np.array([[0, 1]]), "0", "each of the 1 rows"),
        (np.array([[0, 1]]), [-1], "each of the 1 rows"),
    ],
)
def test_bad_input_is_named(dest, sources, message):
    with pytest.raises(ValueError, match=message):
        draw_routing(dest, sources)
