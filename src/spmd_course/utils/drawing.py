"""Pictures of shardings and meshes, drawn with matplotlib; every function returns a ``Figure`` a test can read.

(``jax.debug.visualize_array_sharding`` stops at 2-D, needs ``rich`` and returns nothing.) A block is a
rectangle (gid ``"tile"``) at its true proportions; each device holding a copy is a card in its colour
(``"copy"``), k copies a deck of k offset cards, never stripes (they would read as a further split). A device
has one colour in every figure (:func:`device_color`). ``_tile_lines``, ``_draw_tiles`` and ``_finish`` are
private but shared with notebook 04's matmul pictures (``src/spmd_course/matmul_pictures.py``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from jax.sharding import Mesh, NamedSharding, Sharding
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from .inspecting import format_bytes
from .layout import Tile, as_layout, spec_entries, tiles, type_string


def _show_figures_inline(shell: Any = None, backend: str | None = None) -> bool:
    """In a Jupyter kernel on Agg (MPLBACKEND=Agg, which prints '<Figure size ...>'), switch to inline.

    Returns whether it switched; any other backend, and a session without a kernel, is left alone.
    """
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:  # pragma: no cover - the course always has IPython
            return False
        shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel") or str(backend or matplotlib.get_backend()).lower() != "agg":
        return False
    shell.run_line_magic("matplotlib", "inline")
    return True


_show_figures_inline()

__all__ = ["device_color", "device_label", "draw_memory", "draw_mesh", "draw_permute", "draw_pipeline",
           "draw_ring_steps", "draw_rings", "draw_routing", "draw_sharding", "draw_shardings"]

_PALETTE = [matplotlib.colormaps[name](i) for name, ids in (("tab10", (0, 1, 2, 3, 4, 5, 6, 8)), ("tab20b", range(20)),
                                                            ("tab20c", range(16))) for i in ids]


def device_color(device_id: int) -> tuple[float, float, float, float]:
    """The colour of device ``device_id``: the same in every figure of the course."""
    if isinstance(device_id, bool) or not isinstance(device_id, int | np.integer) or device_id < 0:
        raise ValueError(f"device_color takes a device id (a whole number >= 0); got {device_id!r}")
    return _PALETTE[int(device_id) % len(_PALETTE)]


def device_label(ids: Sequence[int]) -> str:
    """'dev 0', 'dev 0,1', 'dev 0-7' (3+ consecutive ids), 'dev 0,8,...,56' (5+ ids at one stride)."""
    ids = sorted(int(i) for i in ids)
    steps = {b - a for a, b in itertools.pairwise(ids)}
    if len(ids) >= 5 and len(steps) == 1 and steps != {1}:
        return f"dev {ids[0]},{ids[1]},...,{ids[-1]}"
    runs = [[v for _, v in run] for _, run in itertools.groupby(enumerate(ids), lambda p: p[1] - p[0])]
    return "dev " + ",".join(f"{r[0]}-{r[-1]}" if len(r) >= 3 else ",".join(map(str, r)) for r in runs)


def _panel_dims(ndim: int, dims: Sequence[int] | None) -> tuple[int | None, int | None]:
    """(row dim, column dim) to draw; None where the picture has no such axis."""
    if dims is None:
        return (None, None) if ndim == 0 else (None, 0) if ndim == 1 else (ndim - 2, ndim - 1)
    dims = tuple(dims)
    if len(dims) != 2 or len(set(dims)) != 2 or not all(isinstance(d, int) for d in dims):
        raise ValueError(f"dims picks two different dimensions to draw, such as dims=(0, 2); got {dims}")
    bad = [d for d in dims if not -ndim <= d < ndim]
    if bad:
        raise ValueError(f"dims={dims} names dimension {bad[0]}, but the array has {ndim} dimension(s)")
    return dims[0] % ndim, dims[1] % ndim


def _panels(shape: tuple[int, ...], all_tiles: list[Tile], r: int | None, c: int | None) -> list[tuple[str, list]]:
    """Group tiles by their block on the dimensions not drawn: one panel each."""
    others = [d for d in range(len(shape)) if d not in (r, c)]
    groups: dict[tuple[tuple[int, int], ...], list[Tile]] = {}
    for t in all_tiles:
        key = tuple((t.start[d], t.stop[d]) for d in others)
        groups.setdefault(key, []).append(t)
    return [(", ".join(f"dim {d} = {a}:{b}" for d, (a, b) in zip(others, key, strict=True) if (a, b) != (0, shape[d])),
             groups[key]) for key in sorted(groups)]


_LABEL_BOX = dict(boxstyle="round,pad=0.15", facecolor="white", alpha=0.8, linewidth=0)
_SMALL_BOX = dict(_LABEL_BOX, boxstyle="round,pad=0.1")
_MIN_FONT, _GOOD_FONT, _MAX_FONT = 6.5, 8.0, 9.0  # label sizes in points: never below the first
_DECK_STEP_PT = 4.0  # offset between two cards of a deck, in points
_DECK_SHARE = 0.35  # a deck's offsets take at most this share of the block's smaller side
_CARD_ALPHA = 0.85  # the opacity of a device's card
_CARD_MIN_STEP_PT = 1.5  # below this, cards are indistinguishable: show fewer (the label says how many)
_WRAP = 16  # a 1-D view of more blocks than this is wrapped onto rows of this many blocks
_MOST_STRETCH = 8.0  # a 2-D array is drawn at its true aspect unless more than this many times wider than tall


def _tile_lines(t: Tile, itemsize: int, show_bytes: bool, extra: Sequence[str] = ()) -> list[str]:
    """A block's label lines: its devices (``'dev 0-7'``), shape (``'(32, 256)'``), bytes (unless not
    ``show_bytes``), ``'padded to (3)'`` (uneven layouts), ``'4 copies'`` (replicated), then ``extra``."""
    lines = [device_label(t.devices), str(t.shape).replace(",)", ")")]
    if show_bytes:
        lines.append(format_bytes(math.prod(t.shape) * itemsize))
    if t.is_uneven:
        lines.append("padded to " + str(t.padded).replace(",)", ")"))
    if len(t.devices) > 1:
        lines.append(f"{len(t.devices)} copies")
    return lines + list(extra)


def _layouts(lines: Sequence[str]) -> list[str]:
    """The label as k rows, k = len(lines) down to 1: a short, wide block takes its lines side by side."""
    n = len(lines)
    return ["\n".join(" \u00b7 ".join(lines[round(i * n / k): round((i + 1) * n / k)]) for i in range(k))
            for k in range(n, 0, -1)]


def _fit(text: str, w_pt: float, h_pt: float) -> float:
    """The largest font size (points) at which ``text`` fits a block of ``w_pt`` x ``h_pt`` points."""
    rows = text.split("\n")
    return min(0.85 * h_pt / (1.3 * len(rows) + 0.4), 0.92 * w_pt / (0.6 * max(map(len, rows)) + 1))


def _best_font(lines: Sequence[str], w_pt: float, h_pt: float) -> float:
    return max(_fit(text, w_pt, h_pt) for text in _layouts(lines)) if w_pt > 0 and h_pt > 0 else _MAX_FONT


def _placer(shape: tuple[int, ...], panel_tiles: list[Tile], r: int | None, c: int | None) -> tuple[Any, int, int]:
    """``place(tile) -> (x0, w, xpad, y0, h, ypad)`` in a unit square (row 0 at the top), and the wrapping.

    A 1-D view of more than ``_WRAP`` blocks is wrapped like text onto rows of ``_WRAP`` blocks:
    ``(place, elements per row, rows)``; ``(place, 0, 1)`` when not wrapped.
    """
    per_row, rows = 0, 1
    if r is None and c is not None and len(panel_tiles) > _WRAP and max(t.padded[c] for t in panel_tiles):
        per_row = _WRAP * max(t.padded[c] for t in panel_tiles)
        rows = math.ceil(max(t.start[c] + t.padded[c] for t in panel_tiles) / per_row)

    def span(t: Tile, d: int | None, offset: int = 0, n: int | None = None) -> tuple[float, float, float]:
        if d is None:
            return 0.0, 1.0, 0.0
        n = n or max(shape[d], 1)
        a, b = t.start[d] - offset, t.stop[d] - offset
        return a / n, (b - a) / n, max(t.padded[d] - (b - a), 0) / n

    def place(t: Tile) -> tuple[float, float, float, float, float, float]:
        if not per_row:
            return (*span(t, c), *span(t, r))
        row = t.start[c] // per_row
        return (*span(t, c, row * per_row, per_row), (row + 0.08) / rows, 0.84 / rows, 0.0)

    return place, per_row, rows


def _aspect(shape: tuple[int, ...], r: int | None, c: int | None) -> float | None:
    """Height:width of the drawn view; None for a 1-D view (a strip has no aspect)."""
    return None if r is None or c is None else max(shape[r], 1) / max(shape[c], 1)


def _size(shape: tuple[int, ...], labelled: list[tuple[Tile, list[str]]], r: int | None, c: int | None,
          most: tuple[float, float], least: float = 3.6) -> tuple[float, float, float]:
    """(width, height, drawn height:width) in inches for one picture of ``shape``, sized so its labels are legible.

    A 2-D array keeps its true aspect (clamped to ``_MOST_STRETCH``) unless its labels cannot reach
    ``_MIN_FONT`` within ``most`` (width, height) inches at that aspect; it is then drawn nearer square,
    and :func:`_draw_tiles` says "not to scale". A 1-D array has no aspect: its strip is as tall as its
    labels need.
    """
    place, _, _ = _placer(shape, [t for t, _ in labelled], r, c)
    boxes = [(place(t), lines) for t, lines in labelled]
    xspan = max(1.0, *(x0 + w + xp for (x0, w, xp, *_), _ in boxes))  # padding drawn beyond the array
    yspan = max(1.0, *(y0 + h + yp for (*_, y0, h, yp), _ in boxes))

    def font(w: float, h: float) -> float:
        return min(_best_font(lines, 72 * w * (bw + xp), 72 * h * (bh + yp)) for (_, bw, xp, _, bh, yp), lines in boxes)

    true = _aspect(shape, r, c)
    if true is None:
        ratios = [0.12, 0.18, 0.25, 0.35, 0.5, 0.7]
    else:
        start = min(max(true, 1 / _MOST_STRETCH), _MOST_STRETCH)
        ratios = [start ** (1 - i / 6) for i in range(7)]  # from the true aspect towards a square
    best = (-1.0, least, least * ratios[0], ratios[0])  # (font, width, height, ratio)
    for ratio in ratios:
        for w in np.geomspace(least, most[0], 8):
            w = min(w / xspan, most[1] / (ratio * yspan))  # the array's width, its padding aside
            f = font(w, w * ratio)
            if f > best[0] + 0.05:
                best = (f, w * xspan, w * ratio * yspan, ratio)
            if f >= _GOOD_FONT:
                return best[1:]
        if best[0] >= _MIN_FONT:
            break
    return best[1:]


def _dim_text(shape: tuple[int, ...], sharding: Any, d: int) -> str:
    """'dim 0 (128) ÷ data (4)': a dimension and the mesh axes that cut it."""
    axes = spec_entries(sharding.spec, len(shape))[d] if isinstance(sharding, NamedSharding) else ()
    if not axes:
        return f"dim {d} ({shape[d]})"
    size, names = math.prod(dict(sharding.mesh.shape)[a] for a in axes), "\u00d7".join(axes)
    return f"dim {d} ({shape[d]}) \u00f7 {names} ({size})"


def _bare(ax: Axes, sides: Sequence[str] = ("top", "right", "bottom", "left")) -> None:
    for side in sides:
        ax.spines[side].set_visible(False)


def _draw_tiles(ax: Axes, shape: tuple[int, ...], sharding: Any, labelled: list[tuple[Tile, list[str]]], r: int | None,
                c: int | None, ratio: float, tint: Callable[[int], Any] = device_color
                ) -> list[Any]:
    """Draw one 2-D view of labelled blocks: the array spans the unit square, drawn ``ratio`` times as tall as wide.

    Returns the label texts, in block order. Cards and label sizes wait for the layout (:func:`_finish`).
    """
    place, per_row, rows = _placer(shape, [t for t, _ in labelled], r, c)
    ends = [place(t) for t, _ in labelled]
    ax.set_xlim(-0.01, max(1.0, *(x0 + w + xp for x0, w, xp, *_ in ends)) + 0.01)
    ax.set_ylim(max(1.0, *(y0 + h + yp for *_, y0, h, yp in ends)) + 0.01, -0.01)
    ax.set_aspect(ratio)
    ax.set_anchor("N" if ax.get_anchor() == "C" else ax.get_anchor())  # spare room below, where display crops it
    decks = ax.__dict__.setdefault("_course_decks", [])  # drawn by _finish once the layout is final
    labels = ax.__dict__.setdefault("_course_labels", [])
    texts = []
    for (t, lines), (x0, w, xpad, y0, h, ypad) in zip(labelled, ends, strict=True):
        decks.append((x0, y0, w, h, [tint(d) for d in t.devices]))
        for pad in ((x0 + w, y0, xpad, h + ypad), (x0, y0 + h, w, ypad)):  # padding XLA allocates beyond the data
            if pad[2] and pad[3]:
                ax.add_patch(Rectangle(pad[:2], *pad[2:], fill=False, hatch="///", edgecolor="0.45", linewidth=0.5,
                                       gid="padding"))
        ax.add_patch(Rectangle((x0, y0), w, h, fill=False, edgecolor="black", linewidth=1.0, gid="tile", zorder=1.5))
        text = ax.text(x0 + (w + xpad) / 2, y0 + (h + ypad) / 2, "\n".join(lines), ha="center", va="center",
                       fontsize=_MAX_FONT, gid="tile-label", bbox=dict(_LABEL_BOX), zorder=3)
        text.set_label("\n".join(lines))  # the lines as written, however they are laid out
        labels.append((text, lines, w + xpad, h + ypad))
        texts.append(text)
    for row in range(rows):  # the array's outline (row by row when wrapped)
        length = min(shape[c] - row * per_row, per_row) / per_row if per_row else 1.0
        ax.add_patch(Rectangle((0, (row + 0.08) / rows if per_row else 0), length, 0.84 / rows if per_row else 1,
                               fill=False, edgecolor="black", linewidth=2.0, gid="array", zorder=1.6))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.tick_params(length=0)
    _bare(ax)
    xlabel = _dim_text(shape, sharding, c) if c is not None else ""
    if per_row:
        xlabel += f", wrapped: {per_row} per row"
        ax.set_yticks([(k + 0.5) / rows for k in range(rows)], [f"{k * per_row}:" for k in range(rows)], fontsize=7)
    true = _aspect(shape, r, c)
    if r is not None:
        ax.set_ylabel(_dim_text(shape, sharding, r), fontsize=8)
    if true is not None and abs(math.log(ratio / true)) > 0.01:
        xlabel += f"\nnot to scale (true height:width {f'1:{1 / true:.3g}' if true < 1 else f'{true:.3g}:1'})"
    ax.set_xlabel(xlabel, fontsize=8)
    return texts


def _points_per_unit(ax: Axes) -> tuple[float, float]:
    """Points per data unit along x and y, from the axes' final size on the figure."""
    ax.apply_aspect()
    box = ax.get_position()
    fig_w, fig_h = ax.figure.get_size_inches()
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    return 72 * box.width * fig_w / max(abs(x1 - x0), 1e-9), 72 * box.height * fig_h / max(abs(y1 - y0), 1e-9)


def _narrow_places(blocks: Sequence[tuple[float, float, float, float, Sequence[str]]]) -> list[str]:
    """Where each label goes on one scale, for blocks ``(y centre, height, width pt, height pt, lines)``
    (centre and height in data units): ``'inside'`` where its first line fits, else ``'beside'`` the array
    when the narrow blocks are stacked in a column (their labels cannot collide there), else ``'turned'``
    90 degrees inside the block (a row of narrow blocks, such as a 1-D strip): there a label may run past
    a short block's top and bottom, but not into its neighbours' labels.
    """
    narrow = [_best_font(lines[:1], w, h) < _MIN_FONT for _, _, w, h, lines in blocks]
    spans = sorted((yc - hh / 2, yc + hh / 2) for (yc, hh, *_), n in zip(blocks, narrow, strict=True) if n)
    stacked = all(b[0] >= a[1] - 1e-9 for a, b in itertools.pairwise(spans))
    return ["inside" if not n else "beside" if stacked else "turned" for n in narrow]


def _finish(fig: Figure, title: str | None = None, *, tight: bool = True, **layout: Any) -> Figure:
    """Title ``fig`` (unless None), lay it out, then draw the cards and size the labels ``_draw_tiles`` queued.

    One font size serves every label of a panel: the largest that fits every block (at least ``_MIN_FONT``);
    each label takes as many rows as fit at that size, and a block too small for it shows its first lines.
    ``tight=False`` keeps axes placed by hand where they are (one scale across panels). An axes that set
    ``_course_outside`` (an x in its data units) places the labels of blocks too narrow for even their first
    line as :func:`_narrow_places` says: beside the array at that x (where blocks are thinner than a line,
    only as many labels as fit without overlapping, the others blank), or turned 90 degrees inside the block.
    """
    if title is not None:
        fig.suptitle(title, fontsize=10)
    if tight:
        fig.tight_layout(**layout)
    for ax in fig.axes:
        queued = ax.__dict__.pop("_course_decks", [])
        labels = ax.__dict__.pop("_course_labels", [])
        outside_x = ax.__dict__.pop("_course_outside", None)
        if not (queued or labels):
            continue
        ppu = _points_per_unit(ax)
        for x0, y0, w, h, colours in queued:
            _draw_deck(ax, x0, y0, w, h, colours, ppu)
        sized = [(text, lines, w * ppu[0], h * ppu[1]) for text, lines, w, h in labels]
        if outside_x is not None:
            where = _narrow_places([(text.get_position()[1], h / ppu[1], w, h, lines) for text, lines, w, h in sized])
            beside = [item for item, at in zip(sized, where, strict=True) if at == "beside"]
            for text, lines, w, h in (item for item, at in zip(sized, where, strict=True) if at == "turned"):
                while len(lines) > 1 and _fit("\n".join(lines), h, w) < _MIN_FONT:
                    lines = lines[:-1]
                text.set_text("\n".join(lines))
                text.set_rotation(90)
                text.set_fontsize(_MIN_FONT)
            sized = [item for item, at in zip(sized, where, strict=True) if at == "inside"]
            room = (ax.get_xlim()[1] - outside_x) * ppu[0]
            free_from = -math.inf  # points down the axes below which the next label beside may start
            for text, lines, _, h in sorted(beside, key=lambda item: item[0].get_position()[1]):
                while len(lines) > 1 and _fit("\n".join(lines), room, max(h, 2.5 * _MIN_FONT)) < _MIN_FONT:
                    lines = lines[:-1]
                centre, half = text.get_position()[1] * ppu[1], 0.65 * _MIN_FONT * len(lines)
                if centre - half < free_from:  # blocks thinner than a line: label every few, not on top of another
                    lines = []
                else:
                    free_from = centre + half
                text.set_text("\n".join(lines))
                text.set_x(outside_x)
                text.set_horizontalalignment("left")
                text.set_fontsize(_MIN_FONT)
        size = max(min([min(_best_font(lines, w, h), _MAX_FONT) for _, lines, w, h in sized] or [_MAX_FONT]), _MIN_FONT)
        for text, lines, w, h in sized:
            while len(lines) > 1 and _best_font(lines, w, h) < size:  # too small a block: its first lines only
                lines = lines[:-1]
            text.set_text(next((t for t in _layouts(lines) if _fit(t, w, h) >= size), _layouts(lines)[-1]))
            text.set_fontsize(size)
    plt.close(fig)  # the notebook shows the returned figure once, not twice
    return fig


def _draw_deck(
    ax: Axes, x0: float, y0: float, w: float, h: float, colours: Sequence[Any], ppu: tuple[float, float]
) -> None:
    """One card per device holding the block, stacked like a deck offset down-right, replica 0 on top.

    Too small a block for every card 1.5 points apart shows fewer (its label says 'k copies').
    """
    k = len(colours)
    if w <= 0 or h <= 0:
        return
    if k == 1:
        ax.add_patch(Rectangle((x0, y0), w, h, facecolor=colours[0], alpha=_CARD_ALPHA, linewidth=0, gid="copy",
                               zorder=1.0))
        return
    w_pt, h_pt = w * ppu[0], h * ppu[1]
    room = _DECK_SHARE * min(w_pt, h_pt)
    shown = min(k, max(2, int(room / _CARD_MIN_STEP_PT) + 1))
    step = min(_DECK_STEP_PT, room / (shown - 1))
    margin = min(1.5, 0.1 * min(w_pt, h_pt))
    sx, sy, mx, my = step / ppu[0], step / ppu[1], margin / ppu[0], margin / ppu[1]
    cw, ch = w - 2 * mx - (shown - 1) * sx, h - 2 * my - (shown - 1) * sy
    for i, colour in enumerate(colours[:shown]):
        ax.add_patch(Rectangle((x0 + mx + i * sx, y0 + my + i * sy), cw, ch, facecolor=colour, alpha=_CARD_ALPHA,
                               edgecolor="white", linewidth=0.8, gid="copy", zorder=1.0 - i / (2 * k)))


def _contents_lines(x: Any, panel_tiles: list[Tile], contents: Callable[[np.ndarray], str] | None,
                    name: str = "this array") -> dict[int, list[str]]:
    """The contents line(s) of each tile: one line when every copy reads the same, else one per device."""
    if contents is None:
        return {}
    import jax

    if not isinstance(x, jax.Array):
        raise TypeError(
            f"contents= reads the data each device holds, but {name} is a "
            f"{type(x).__name__} with no data: pass a jax.Array placed with jax.device_put, or drop contents="
        )
    if not callable(contents):
        raise TypeError(f"contents must be a function of one block (a numpy array) returning a str; got {contents!r}")
    data = {s.device.id: s.data for s in x.addressable_shards}
    out: dict[int, list[str]] = {}
    for i, t in enumerate(panel_tiles):
        texts = []
        for dev in t.devices:
            if dev not in data:
                raise ValueError(f"device {dev} holds a block of {name} but is not addressable from this process")
            text = contents(np.asarray(data[dev]))
            if not isinstance(text, str):
                raise TypeError(f"contents must return a str (e.g. lambda b: f'{{b[0, 0]:.0f}}'); it returned "
                                f"{type(text).__name__}")
            texts.append(text)
        if len(set(texts)) == 1:
            out[i] = [texts[0]]
        else:  # copies that disagree: say so, device by device
            out[i] = [f"dev {dev}: {text}" for dev, text in zip(t.devices, texts, strict=True)]
    return out


def draw_sharding(x: Any, sharding: Any = None, *, mesh: Any = None, dims: Sequence[int] | None = None,
                  title: str | None = None, show_bytes: bool = True, max_panels: int = 16,
                  contents: Callable[[np.ndarray], str] | None = None, color_by: Callable[[Any], int] | None = None,
                  show_slices: bool = False) -> Figure:
    """Draw where every block of an array lives.

    ``x`` is a sharded ``jax.Array``, a ``jax.ShapeDtypeStruct``, or a shape such as ``(128, 512)`` with
    ``sharding`` (a ``NamedSharding``, or a ``PartitionSpec`` with ``mesh=``). 1-D arrays are a row, 2-D a grid
    at the true aspect; for N-D arrays ``dims`` picks the two dimensions drawn (default: the last two) and the
    blocks of the others become panels. Each axis names the mesh axes that cut it (``dim 0 (128) ÷ data (4)``).
    ``contents`` (a ``jax.Array`` only) labels each block with ``contents(shard)``, e.g.
    ``lambda b: f"{b[0, 0]:.0f}"``; copies that differ get a line per device (``'dev 2: 5'``). ``color_by``
    colours each card by a group of its ``jax.Device``, e.g. ``lambda d: d.process_index`` (hosts).
    ``show_slices=True`` adds the part of the array each block is, ``'[48:56, :]'``.
    """
    if not isinstance(show_slices, bool):
        raise TypeError(f"show_slices is True or False; got {show_slices!r}")
    shape, dtype, sharding = as_layout(x, sharding, mesh)
    r, c = _panel_dims(len(shape), dims)
    panels = _panels(shape, tiles(shape, sharding), r, c)
    if len(panels) > max_panels:
        raise ValueError(f"this layout needs {len(panels)} panels (more than max_panels={max_panels}): "
                         f"pick the sharded dimensions with dims=(i, j), or raise max_panels")
    itemsize = np.dtype(dtype).itemsize
    def slices(t: Tile) -> list[str]:
        return ["[" + ", ".join(":" if (a, b) == (0, n) else f"{a}:{b}" for a, b, n in zip(t.start, t.stop, shape,
                                                                                          strict=True)) + "]"]

    labelled = [[(t, _tile_lines(t, itemsize, show_bytes, (slices(t) if show_slices else []) + extra.get(i, [])))
                 for i, t in enumerate(panel_tiles)]
                for (_, panel_tiles), extra in ((p, _contents_lines(x, p[1], contents)) for p in panels)]
    by_id = {d.id: d for d in sharding.device_set}
    tint = device_color if color_by is None else (lambda dev: device_color(int(color_by(by_id[dev]))))
    ncols = min(len(panels), 4)
    nrows = math.ceil(len(panels) / ncols)
    w, h, ratio = _size(shape, [item for panel in labelled for item in panel], r, c,
                        (9.0, 6.5) if ncols == 1 else (3.6, 3.0), 3.6 if ncols == 1 else 2.6)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max((w + 0.6) * ncols, 4.5), (h + 0.9) * nrows + 0.5),
                             squeeze=False)
    for ax, (label, _), items in zip(axes.flat, panels, labelled, strict=False):
        _draw_tiles(ax, shape, sharding, items, r, c, ratio, tint=tint)
        if label:
            ax.set_title(label, fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.remove()
    head = title if title is not None else type_string(shape, sharding, dtype=dtype)
    mesh = getattr(sharding, "mesh", None)
    where = type(sharding).__name__ if mesh is None else f"mesh({', '.join(f'{k}={v}' for k, v in mesh.shape.items())})"
    return _finish(fig, f"{head}\n{getattr(sharding, 'spec', '')} on {where}")


def _need_mesh(mesh: Any, caller: str) -> None:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{caller} needs a jax.sharding.Mesh with devices, such as "
                        f"jax.make_mesh((4, 2), ('data', 'model')); got {type(mesh).__name__}")


def _mesh_grid(ax: Axes, grid: np.ndarray, row_name: str | None, col_name: str, fontsize: float,
               faded: frozenset = frozenset()) -> None:
    """One cell per device id of ``grid`` (row 0 on top), labelled with its id; ``faded`` (i, j) cells hatched."""
    rows, cols = grid.shape
    for (i, j), dev in np.ndenumerate(grid):
        dim = (i, j) in faded
        ax.add_patch(Rectangle((j + 0.04, i + 0.04), 0.92, 0.92, facecolor=device_color(int(dev)), linewidth=1.5,
                               alpha=0.3 if dim else 0.8, edgecolor="0.3" if dim else "white",
                               hatch=".." if dim else None, gid="device"))
        ax.text(j + 0.5, i + 0.5, str(dev), ha="center", va="center", fontsize=fontsize, gid="device-label")
    ax.set_aspect("equal")
    ax.set_xticks(np.arange(cols) + 0.5, [str(j) if cols <= 16 else "" for j in range(cols)])
    ax.set_yticks(np.arange(rows) + 0.5, [str(i) if rows <= 16 and row_name else "" for i in range(rows)])
    ax.tick_params(length=0, labelsize=min(fontsize, 8))
    _bare(ax)
    ax.set_xlabel(f"{col_name} ({cols}) \u2192", fontsize=9)
    if row_name is not None:
        ax.set_ylabel(f"{row_name} ({rows}) \u2193", fontsize=9)


def draw_mesh(mesh: Any, *, title: str | None = None) -> Figure:
    """Draw a device mesh, one cell per device: the last axis across, the one before down, earlier ones as panels."""
    _need_mesh(mesh, "draw_mesh")
    names, ids = list(mesh.axis_names), mesh.device_ids
    grids = ids.reshape(-1, *ids.shape[-2:]) if ids.ndim > 1 else ids[None, None, :]
    rows, cols = grids.shape[1:]
    ncols = min(len(grids), 4)
    nrows = math.ceil(len(grids) / ncols)
    cell = 0.9 if max(rows, cols) <= 8 else 0.45
    fig, axes = plt.subplots(nrows, ncols, squeeze=False,
                             figsize=(max(cols * cell + 0.9, 2.2) * ncols, (rows * cell + 0.9) * nrows + 0.5))
    for ax, grid, idx in zip(axes.flat, grids, np.ndindex(*ids.shape[:-2]), strict=False):
        _mesh_grid(ax, grid, names[-2] if ids.ndim > 1 else None, names[-1], 9 if max(rows, cols) <= 8 else 6)
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        if idx:
            ax.set_title(", ".join(f"{n}={k}" for n, k in zip(names, idx, strict=False)), fontsize=9)
    for ax in list(axes.flat)[len(grids):]:
        ax.remove()
    shape_text = ", ".join(f"{k}={v}" for k, v in mesh.shape.items())
    return _finish(fig, title if title is not None else f"Mesh({shape_text}): device ids")


def _is_shape_and_sharding(v: Any) -> bool:
    return isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], tuple | list) and isinstance(v[1], Sharding)


def _named_leaves(arrays: Any) -> list[tuple[str, Any, Any]]:
    """(name, array or shape, sharding) for every array: a mapping in its own order, then pytree order within."""
    import jax

    def flatten(prefix: list[str], tree: Any) -> list[tuple[str, Any, Any]]:
        leaves = jax.tree_util.tree_flatten_with_path(
            tree, is_leaf=lambda v: isinstance(v, jax.Array | jax.ShapeDtypeStruct) or _is_shape_and_sharding(v)
        )[0]
        out = []
        for path, leaf in leaves:
            parts = prefix + [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
            if len(parts) > 1 and parts[-1] == "value":  # an NNX Variable's payload: name it by its owner
                parts = parts[:-1]
            name = "/".join(parts) or "array"
            out.append((name, *leaf) if _is_shape_and_sharding(leaf) else (name, leaf, None))
        return out

    if isinstance(arrays, Mapping):
        items = [item for key, value in arrays.items() for item in flatten([str(key)], value)]
    else:
        items = flatten([], arrays)
    if not items:
        raise ValueError("draw_shardings found no arrays: pass a dict of name -> sharded array, or a pytree of them")
    return items


def draw_shardings(arrays: Any, *, ncols: int = 3, title: str | None = None, show_bytes: bool = True,
                   contents: Callable[[np.ndarray], str] | None = None, same_scale: bool = False) -> Figure:
    """Draw several arrays side by side, one panel each, named and typed.

    ``arrays`` is a dict of name -> array (or name -> (shape, sharding)), or a pytree of arrays such as
    ``nnx.state(model)`` (titles are the paths, e.g. ``linear1/kernel``). N-D arrays show their last two
    dimensions. Arrays of one shape are drawn alike whatever their layout. ``contents`` is as in
    :func:`draw_sharding`.

    By default each panel is sized so its own labels are legible. ``same_scale=True`` draws every array on
    one scale instead (one element is as wide and as tall in every panel, so a (4, 8) array is a quarter
    of a (16, 8) one) because comparing arrays needs one scale. A 1-D array is then a strip of fixed height,
    and a block too narrow for its label has the label beside the array.
    """
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols must be a whole number >= 1; got {ncols!r}")
    if not isinstance(same_scale, bool):
        raise TypeError(f"same_scale is True or False; got {same_scale!r}")
    items = _named_leaves(arrays)
    ncols = min(ncols, len(items))
    nrows = math.ceil(len(items) / ncols)
    views = []
    for name, x, sharding in items:
        try:
            shape, dtype, sh = as_layout(x, sharding)
        except (TypeError, ValueError) as err:
            raise type(err)(f"{name}: {err}") from None
        r, c = _panel_dims(len(shape), None)
        panel_label, panel_tiles = _panels(shape, tiles(shape, sh), r, c)[0]
        extra = _contents_lines(x, panel_tiles, contents, repr(name))
        itemsize = np.dtype(dtype).itemsize
        labelled = [(t, _tile_lines(t, itemsize, show_bytes, extra.get(i, ()))) for i, t in enumerate(panel_tiles)]
        if same_scale:
            views.append((name, shape, dtype, sh, r, c, panel_label, labelled))
            continue
        size = _size(shape, labelled, r, c, (9.0, 6.0) if ncols == 1 else (4.5, 4.0) if ncols == 2 else (3.6, 3.0), 2.6)
        key = tuple(shape[d] if d is not None else None for d in (r, c))
        views.append((key, name, shape, dtype, sh, r, c, panel_label, labelled, size))
    if same_scale:
        return _draw_on_one_scale(views, ncols, title)
    ratios: dict[tuple, float] = {}  # one drawn shape, one aspect: the furthest from true (in 1-D the tallest strip)
    for key, _, shape, _, _, r, c, *_, (_, _, ratio) in views:
        true = _aspect(shape, r, c) or 1e-9
        ratios[key] = max(ratios.get(key, true), ratio, key=lambda q, t=true: abs(math.log(q / t)))
    cell_w = max(w for *_, (w, _, _) in views) + 0.5
    cell_h = max(h for *_, (_, h, _) in views) + 1.1
    fig, axes = plt.subplots(nrows, ncols, figsize=(cell_w * ncols, cell_h * nrows + 0.4), squeeze=False)
    for ax, (key, name, shape, dtype, sh, r, c, panel_label, labelled, _) in zip(axes.flat, views, strict=False):
        _draw_tiles(ax, shape, sh, labelled, r, c, ratios[key])
        ax.set_title(_panel_title(name, shape, sh, dtype, panel_label), fontsize=9)
    for ax in list(axes.flat)[len(items):]:
        ax.remove()
    return _finish(fig, title or None)


_ONE_SCALE_MOST = (4.0, 3.2)  # inches: on one scale, the widest array is at most this wide, the tallest this tall
_STRIP_IN = 0.4  # inches: the height of a 1-D array's strip (and the side of a scalar) on one scale
_BESIDE_IN = 1.0  # inches: room right of an array whose narrowest block cannot hold its label
_TOP_IN, _BOTTOM_IN, _LEFT_IN, _GAP_IN = 0.8, 0.55, 0.45, 0.3  # inches around each panel: title, x label, y label


def _panel_title(name: str, shape: tuple[int, ...], sh: Any, dtype: Any, panel_label: str) -> str:
    """A panel's heading: the array's name, its type, and for an N-D array which block of its leading dims is shown."""
    extra = f"\n(first block of {panel_label.split(' = ')[0]})" if panel_label else ""
    return f"{name}\n{type_string(shape, sh, dtype=dtype)}{extra}"


def _draw_on_one_scale(views: list[tuple], ncols: int, title: str | None) -> Figure:
    """:func:`draw_shardings` with ``same_scale=True``: every panel at one number of inches per element.

    The scale fits the widest array in ``_ONE_SCALE_MOST[0]`` inches and the tallest in ``_ONE_SCALE_MOST[1]``.
    Axes are placed by hand, in inches, so no layout engine rescales one panel more than another.
    """
    spans = []
    for _, shape, _, _, r, c, _, labelled in views:
        place, per_row, rows = _placer(shape, [t for t, _ in labelled], r, c)
        ends = [place(t) for t, _ in labelled]
        xspan = max(1.0, *(x0 + w + xp for x0, w, xp, *_ in ends))
        yspan = max(1.0, *(y0 + h + yp for *_, y0, h, yp in ends))
        across = per_row or (shape[c] if c is not None else 0)
        spans.append((across, shape[r] if r is not None else None, rows, xspan, yspan, ends))
    widest = max(max(a, 1) for a, *_ in spans)
    tallest = max([d for _, d, *_ in spans if d] or [1])
    scale = min(_ONE_SCALE_MOST[0] / widest, _ONE_SCALE_MOST[1] / tallest)  # inches per element
    cells = []
    for (name, shape, dtype, sh, _, _, panel_label, labelled), (across, down, rows, xspan, yspan, ends) in zip(
            views, spans, strict=True):
        unit_w = across * scale if across else _STRIP_IN  # inches of the unit square, across and down
        unit_h = down * scale if down else _STRIP_IN * (rows if rows > 1 else 1)
        narrow = "beside" in _narrow_places([(y0 + (h + yp) / 2, h + yp, 72 * unit_w * (w + xp), 72 * unit_h * (h + yp),
                                              lines) for (_, lines), (_, w, xp, y0, h, yp) in zip(labelled, ends,
                                                                                                  strict=True)])
        heading = _panel_title(name, shape, sh, dtype, panel_label)
        text_w = 0.6 * 9 / 72 * max(map(len, heading.split("\n")))  # the title's width in inches, roughly
        box_w = unit_w * (xspan + 0.02) + (_BESIDE_IN if narrow else 0.0)
        cells.append((unit_w, unit_h, xspan, yspan, narrow, heading, box_w, max(box_w, text_w)))
    rows_of = [cells[i:i + ncols] for i in range(0, len(cells), ncols)]
    heights = [max(u_h * (ys + 0.02) for _, u_h, _, ys, *_ in row) + _TOP_IN + _BOTTOM_IN for row in rows_of]
    widths = [sum(_LEFT_IN + cell_w + _GAP_IN for *_, cell_w in row) for row in rows_of]
    fig_w, fig_h = max(max(widths), 4.5), sum(heights) + (0.5 if title else 0.1)
    fig = plt.figure(figsize=(fig_w, fig_h))
    top = 0.5 if title else 0.1
    for k, row in enumerate(rows_of):
        left = 0.0
        for i, (unit_w, unit_h, xspan, yspan, _, heading, box_w, cell_w) in enumerate(row):
            name, shape, dtype, sh, r, c, panel_label, labelled = views[k * ncols + i]
            box_h = unit_h * (yspan + 0.02)
            y = fig_h - top - sum(heights[:k]) - _TOP_IN - box_h
            ax = fig.add_axes((
                (left + _LEFT_IN) / fig_w, y / fig_h, box_w / fig_w, box_h / fig_h))
            _draw_tiles(ax, shape, sh, labelled, r, c, unit_h / unit_w)
            ax.set_aspect("auto")
            ax.set_xlim(-0.01, box_w / unit_w - 0.01)  # the array, then the room beside it
            ax.set_ylim(yspan + 0.01, -0.01)
            ax.__dict__["_course_outside"] = xspan + 0.06 / unit_w  # labels of narrow blocks: see _narrow_places
            ax.set_title(heading, fontsize=9, loc="left")
            left += _LEFT_IN + cell_w + _GAP_IN
    return _finish(fig, title or None, tight=False)


def draw_permute(mesh: Any, axis_name: str, perm: Sequence[tuple[int, int]], *, title: str | None = None) -> Figure:
    """Draw ``jax.lax.ppermute(x, axis_name, perm)`` as arrows between devices on the mesh.

    ``perm``: ``(source, destination)`` index pairs along ``axis_name``, as ``ppermute`` takes. Every group along
    the other axes gets its arrows, in the sender's colour, labelled ``'dev S -> dev D'`` (gid
    ``'permute-arrow'``). A device no pair sends to receives zeros: its cell is hatched and says so.
    """
    _need_mesh(mesh, "draw_permute")
    names, ids = list(mesh.axis_names), mesh.device_ids
    if axis_name not in names:
        raise ValueError(f"mesh has no axis {axis_name!r}; its axes are {tuple(names)}")
    pairs = _check_perm(perm, axis_name, mesh.shape[axis_name])
    if names.index(axis_name) < ids.ndim - 2:
        raise ValueError(f"draw_permute draws the last two mesh axes; {axis_name!r} is not one of them: "
                         f"build the mesh with {axis_name!r} among its last two axes to draw it")
    if ids.ndim > 2:  # the first panel: every other panel is the same picture
        title = title or f"first {', '.join(f'{n}=0' for n in names[:-2])} slice shown; others alike"
    grid = ids.reshape(-1, *ids.shape[-2:])[0] if ids.ndim > 1 else ids[None, :]
    along_rows = ids.ndim > 1 and names.index(axis_name) == ids.ndim - 2  # the permuted axis runs down the picture
    rows, cols = grid.shape
    fig, ax = plt.subplots(figsize=(max(cols * 1.1 + 2.0, 3.5), rows * 1.1 + 1.4))
    targets = {dst for _, dst in pairs}
    zeros = frozenset((i, j) for i in range(rows) for j in range(cols) if (i if along_rows else j) not in targets)
    _mesh_grid(ax, grid, names[-2] if ids.ndim > 1 else None, names[-1], 10, zeros)
    for i, j in sorted(zeros):
        ax.text(j + 0.5, i + 0.78, "receives zeros", ha="center", va="center", fontsize=6.5, gid="zeros-note",
                bbox=dict(_LABEL_BOX))
    pair_set = set(pairs)
    for src, dst in pairs:
        for g in range(cols if along_rows else rows):  # one group of devices per position on the other axis
            a, b = ((src, g), (dst, g)) if along_rows else ((g, src), (g, dst))
            s_dev, d_dev = int(grid[a]), int(grid[b])
            if src == dst:
                ax.text(a[1] + 0.5, a[0] + 0.22, "keeps its block", ha="center", va="center", fontsize=6.5,
                        gid="keeps-note")
                continue
            direction = 1 if dst > src else -1
            if abs(dst - src) > 1:  # a long jump (a ring's wrap) arcs outside its column or row, clear of the cells
                outward = 1 if g >= (cols if along_rows else rows) / 2 else -1
                size = 1.6 if direction > 0 else 1.1  # a pair and its reverse: nested arcs, not one on the other
                rad = size / abs(dst - src) * outward * direction * (-1 if along_rows else 1)
            else:  # neighbours: straight, or two bows when both directions are sent
                rad = 0.25 if (dst, src) in pair_set else 0.0
            arrow = FancyArrowPatch(
                (a[1] + 0.5, a[0] + 0.5), (b[1] + 0.5, b[0] + 0.5), arrowstyle="-|>", mutation_scale=14,
                connectionstyle=f"arc3,rad={rad}", shrinkA=14, shrinkB=14, linewidth=1.8,
                color=tuple(0.7 * v for v in device_color(s_dev)[:3]), gid="permute-arrow", zorder=3,
            )
            arrow.set_label(f"dev {s_dev} -> dev {d_dev}")
            ax.add_patch(arrow)
    margin = 0.9 if any(abs(t - f) > 1 for f, t in pairs) else 0.2  # room for the arcs of long jumps
    ax.set_xlim(-margin if along_rows else -0.2, cols + (margin if along_rows else 0.2))
    ax.set_ylim(rows + (0.2 if along_rows else margin), -0.2 if along_rows else -margin)
    head = f"ppermute over {axis_name!r}: " + ", ".join(f"{s}\u2192{t}" for s, t in pairs)
    return _finish(fig, f"{title}\n{head}" if title else head)


def _check_perm(perm: Any, axis_name: str, size: int) -> list[tuple[int, int]]:
    """The pairs of ``perm`` as ints, or an error that says what ppermute accepts."""
    example = f"[(i, (i + 1) % {size}) for i in range({size})]"
    try:
        pairs = [(int(s), int(t)) for s, t in perm]
        ok = all(float(s) == int(s) and float(t) == int(t) for s, t in perm)
    except (TypeError, ValueError):
        ok = False
    if not ok or isinstance(perm, str):
        raise ValueError(f"perm is a list of (source, destination) index pairs, such as {example}; got {perm!r}")
    bad = [p for p in pairs if not (0 <= p[0] < size and 0 <= p[1] < size)]
    if bad:
        raise ValueError(f"pair {bad[0]} leaves axis {axis_name!r}, whose indices are 0..{size - 1}: "
                         f"ppermute pairs are positions along the axis, not device ids")
    for k, what in ((0, "source"), (1, "destination")):
        seen = [p[k] for p in pairs]
        dup = next((v for v in seen if seen.count(v) > 1), None)
        if dup is not None:
            raise ValueError(f"index {dup} is a {what} twice in perm: ppermute needs each {what} at most once")
    return pairs


_MEMORY_LOOKS = ("", "///", "...", "xxx", "\\\\\\", "ooo", "---", "+++")  # one hatch per category, in order


def draw_memory(bars: Mapping[str, Mapping[str, float]], *, title: str | None = None) -> Figure:
    """Stacked bars of bytes per device on one scale: ``bars`` maps a variant to ``{category: bytes}``.

    Every variant lists the same categories in order. Colour means device in the course and a bar is one
    device, so categories differ by hatching and name, never colour. Bars end with their totals.
    """
    if not isinstance(bars, Mapping) or not bars or not all(isinstance(v, Mapping) and v for v in bars.values()):
        raise TypeError("draw_memory takes {variant: {category: bytes}}, e.g. {'ZeRO-1': {'parameters': 2**27}}")
    categories = list(next(iter(bars.values())))
    if len(categories) > len(_MEMORY_LOOKS):
        raise ValueError(f"draw_memory draws at most {len(_MEMORY_LOOKS)} categories; got {len(categories)}")
    for name, parts in bars.items():
        if list(parts) != categories:
            raise ValueError(f"every variant lists the categories {categories} in that order; {name!r} lists "
                             f"{list(parts)}")
        bad = {k: v for k, v in parts.items() if not isinstance(v, int | float | np.integer | np.floating) or v < 0}
        if bad:
            raise ValueError(f"{name!r}: bytes must be numbers of at least 0; got {bad}")
    widest = max(sum(float(v) for v in parts.values()) for parts in bars.values()) or 1.0
    fig, ax = plt.subplots(figsize=(8.0, 0.55 * len(bars) + 1.6))
    for row, parts in enumerate(bars.values()):
        start = 0.0
        for category, look in zip(categories, _MEMORY_LOOKS, strict=False):
            size = float(parts[category])
            ax.add_patch(Rectangle((start, row - 0.35), size, 0.7, facecolor="white", edgecolor="black",
                                   hatch=look, linewidth=0.8, gid="memory-segment", label=category))
            if size > 0.09 * widest:
                ax.text(start + size / 2, row, format_bytes(size), ha="center", va="center", fontsize=_GOOD_FONT,
                        bbox=dict(_LABEL_BOX, alpha=1.0), gid="memory-label")  # opaque: readable over hatching
            start += size
        ax.text(start + 0.01 * widest, row, format_bytes(start), ha="left", va="center", fontsize=_GOOD_FONT,
                gid="memory-total")
    ax.set(xlim=(0, 1.16 * widest), ylim=(len(bars) - 0.5, -0.5), yticks=range(len(bars)), yticklabels=list(bars))
    ax.set_xticks([])
    ax.set_xlabel("bytes per device (one scale for every bar)", fontsize=8)
    _bare(ax, ("top", "right", "bottom"))
    ax.legend(handles=[Patch(facecolor="white", edgecolor="black", hatch=look, label=c)
                       for c, look in zip(categories, _MEMORY_LOOKS, strict=False)],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=min(len(categories), 2), fontsize=8, frameon=False)
    return _finish(fig, title or None)


def _sent_block(before: Mapping[int, Any], after: Mapping[int, Any], dev: int, step: int) -> int:
    """The one block that changed on a device between two frames: what its ring neighbour sent it."""
    changed = [b for b, who in after.items() if before.get(b) != who]
    if len(changed) != 1:
        raise ValueError(f"draw_rings: after step {step + 1}, device {dev} should hold exactly one new or updated "
                         f"block (what its neighbour sent), but {len(changed)} changed: pass one frame per ring step")
    return changed[0]


def draw_rings(rings: Mapping[str, Sequence[Sequence[Mapping[int, Sequence[int]]]]], ids: Sequence[int], *,
               own_partials: Sequence[str] = ()) -> Figure:
    """Draw ring collectives frame by frame, one panel per ring, so each step's send can be followed.

    ``rings[title][f][i]`` maps each block device ``ids[i]`` holds after step ``f`` (0: the start) to the ids
    whose data it holds (several for a running sum), drawn as stripes in their colours. ``ids[i]`` sends to
    ``ids[i + 1]`` (the last to the first); an outlined block and an arrow (gid ``'ring-arrow'``, labelled
    ``'dev S -> dev D: block B'``) mark what each sends next: the block new on its neighbour in the next frame.
    A reduce-scatter's device adds its own partial of a block to each sum it receives: rings named in
    ``own_partials`` get a faint column of each device's partials (gid ``'ring-own'``), the one just added
    outlined (``'ring-own-added'``). A frame that does not follow from the one before by one block per device
    raises ValueError.
    """
    n, w, gap = len(ids), 1.5, 0.8  # blocks are w wide and 1 high
    if n < 2 or not rings:
        raise ValueError("draw_rings: give at least one ring and at least 2 devices along it")
    if isinstance(own_partials, str) or not set(own_partials) <= set(rings):
        raise ValueError(f"draw_rings: own_partials is a list of ring titles, from {sorted(rings)}; got "
                         f"{own_partials!r}")
    own_w = 0.4  # the own-partials column: narrow, in the gap left of each device's blocks
    band = n + 1.6  # height of one frame
    height = 0.3 * band * max(map(len, rings.values())) + 0.4
    fig, axes = plt.subplots(1, len(rings), figsize=(3.6 * len(rings), height))
    for ax, (title, frames) in zip(np.atleast_1d(axes), rings.items(), strict=True):
        if any(len(held) != n for held in frames):
            raise ValueError(f"draw_rings: every frame of {title!r} needs one entry per device ({n})")
        own = title in own_partials
        for f, held in enumerate(frames):
            y0 = f * band
            ax.text(-0.7 if own else -0.2, y0 + n / 2, "start" if f == 0 else f"after\nstep {f}", ha="right",
                    va="center", fontsize=7.5)
            for i, dev in enumerate(ids):
                x0 = i * (w + gap)
                ax.text(x0 + w / 2, y0 - 0.2, f"dev {dev}", ha="center", va="bottom", fontsize=7)
                if own:  # its partials of every block, faint; the one added into this frame's new block outlined
                    added = set(held[i]) if f == 0 else {_sent_block(frames[f - 1][i], held[i], dev, f - 1)}
                    for block in range(n):
                        ax.add_patch(Rectangle((x0 - 0.1 - own_w, y0 + block), own_w, 1, facecolor=device_color(dev),
                                               alpha=0.3, edgecolor="white", linewidth=0.6, gid="ring-own",
                                               label=f"dev {dev}: own partial of block {block}"))
                        if block in added:
                            ax.add_patch(Rectangle((x0 - 0.1 - own_w, y0 + block), own_w, 1, fill=False,
                                                   edgecolor="0.25", linewidth=0.9, linestyle="--",
                                                   gid="ring-own-added"))
                    if f == 0:
                        ax.text(x0 - 0.1 - own_w / 2, y0 - 0.2, "own", ha="center", va="bottom", fontsize=6.5,
                                color="0.35")
                for block in range(n):
                    who = tuple(held[i].get(block, ()))
                    ax.add_patch(Rectangle((x0, y0 + block), w, 1, fill=False, edgecolor="0.75", linewidth=0.6))
                    for k, d in enumerate(who):  # one stripe per contributing device
                        ax.add_patch(Rectangle((x0 + k * w / len(who), y0 + block), w / len(who), 1,
                                               facecolor=device_color(d), edgecolor="none", gid="ring-block"))
                    if who:
                        ax.text(x0 + w / 2, y0 + block + 0.5, "+".join(map(str, who)), ha="center", va="center",
                                fontsize=6.5, gid="ring-label",
                                bbox=dict(_SMALL_BOX))
                if f + 1 == len(frames):
                    continue
                nxt = (i + 1) % n
                block = _sent_block(frames[f][nxt], frames[f + 1][nxt], ids[nxt], f)
                ax.add_patch(Rectangle((x0, y0 + block), w, 1, fill=False, edgecolor="black", linewidth=1.5))
                x1 = nxt * (w + gap)
                if nxt:  # to the neighbour on the right, at the block's height
                    ends, style = ((x0 + w, y0 + block + 0.5), (x1, y0 + block + 0.5)), "arc3"
                else:  # the wrap: under the frame, back to the first device
                    ends, style = ((x0 + w / 2, y0 + n), (x1 + w / 2, y0 + n)), "bar,fraction=-0.06"
                ax.add_patch(FancyArrowPatch(*ends, arrowstyle="-|>", mutation_scale=9, linewidth=1.2, shrinkA=1,
                                             shrinkB=1, connectionstyle=style, gid="ring-arrow",
                                             color=[0.7 * v for v in device_color(dev)[:3]],
                                             label=f"dev {dev} -> dev {ids[nxt]}: block {block}"))
        ax.set(xlim=(-1.8 if own else -1.3, n * (w + gap) - gap + 0.1), ylim=(len(frames) * band - 0.7, -0.6),
               aspect="equal")
        ax.set_title(title, fontsize=8.5)
        ax.axis("off")
    return _finish(fig)


def draw_pipeline(work: Any, devices: Sequence[int], *, backward: Any = None, title: str | None = None) -> Figure:
    """A pipeline's timeline: one row per stage, one column per loop iteration, time going right.

    ``work[s, t]``: the micro-batch (or work item) stage ``s`` runs at iteration ``t``, in the colour of its
    device ``devices[s]`` (gid ``"busy"``), or ``-1`` where it idles (the bubble: white). ``backward`` (booleans,
    the same shape) marks backward cells, hatched and labelled ``B``, not ``F``. The title counts the idle cells.
    """
    grid = np.asarray(work)
    if grid.ndim != 2 or grid.size == 0 or not np.issubdtype(grid.dtype, np.integer):
        raise TypeError(f"work is a 2-D array of whole numbers (stages x iterations, -1 for idle); got "
                        f"{getattr(grid, 'dtype', type(work).__name__)} of shape {grid.shape}")
    if (grid < -1).any():
        raise ValueError(f"work holds micro-batch numbers >= 0, or -1 for an idle iteration; got {grid.min()}")
    ids = [int(d) for d in devices] if isinstance(devices, Sequence | np.ndarray) else []
    if len(ids) != grid.shape[0]:
        raise ValueError(f"devices names the device of each of the {grid.shape[0]} stages (one id per row of work); "
                         f"got {devices!r}")
    back = np.zeros(grid.shape, bool) if backward is None else np.asarray(backward, bool)
    if back.shape != grid.shape:
        raise ValueError(f"backward has the shape of work {grid.shape}; got {back.shape}")
    stages, steps = grid.shape
    fig, ax = plt.subplots(figsize=(min(max(steps * 0.42, 4.0), 11.0) + 1.2, stages * 0.42 + 1.3))
    font = 7 if steps <= 24 else 5.5
    for s in range(stages):
        for t in range(steps):
            busy = grid[s, t] >= 0
            ax.add_patch(Rectangle((t, s), 1, 1, facecolor=device_color(ids[s]) if busy else "white",
                                   edgecolor="0.3" if busy else "0.8", linewidth=0.6,
                                   hatch="///" if busy and back[s, t] else None, gid="busy" if busy else "idle"))
            if busy:
                ax.text(t + 0.5, s + 0.5, f"{'B' if back[s, t] else 'F'}{grid[s, t]}", ha="center", va="center",
                        fontsize=font, gid="cell-label", bbox=dict(_LABEL_BOX))
    ax.set(xlim=(0, steps), ylim=(stages, 0))
    ax.set_yticks([s + 0.5 for s in range(stages)], [f"stage {s} (dev {d})" for s, d in enumerate(ids)], fontsize=8)
    ax.set_xticks(range(0, steps + 1, max(1, steps // 12)))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel("time \u2192 (loop iterations; every stage runs every iteration)", fontsize=8)
    idle = int((grid < 0).sum())
    head = f"idle (white): {idle} of {grid.size} stage-iterations, {idle / grid.size:.0%}"
    return _finish(fig, f"{title}\n{head}" if title else head)


def draw_ring_steps(panels: Mapping[str, Mapping[str, Sequence[Sequence[Any]]]], ids: Sequence[int], *,
                    title: str | None = None) -> Figure:
    """Draw which block each device works on at each step of a ring, with the share of it that is computed.

    ``panels[name]`` holds three ``steps x devices`` tables: ``"holds"[s][i]``, the ring position of the device
    whose block ``ids[i]`` holds in step ``s`` (its colour, so a block keeps it as it travels); ``"work"[s][i]``,
    the fraction of that block's work done (0 is hatched, skipped); ``"labels"[s][i]``, the cell's text. Time
    runs down; every device waits for the ring, so each row's busiest device sets the step's length (right-hand
    column). The bottom row sums each device's work. Cells: gid ``'ring-cell'``, labelled with what they hold.
    """
    if not isinstance(panels, Mapping) or not panels:
        raise TypeError("draw_ring_steps takes {panel title: {'holds': ..., 'work': ..., 'labels': ...}}")
    ids = [int(i) for i in ids]
    n = len(ids)
    if n < 2:
        raise ValueError("draw_ring_steps: give the ids of at least 2 devices along the ring")
    tables = {}
    for name, parts in panels.items():
        missing = {"holds", "work", "labels"} - set(parts) if isinstance(parts, Mapping) else {"holds"}
        if missing:
            raise ValueError(f"draw_ring_steps: panel {name!r} needs the tables 'holds', 'work' and 'labels' "
                             f"(steps x devices); missing {sorted(missing)}")
        holds, work = np.asarray(parts["holds"]), np.asarray(parts["work"], dtype=float)
        labels = [list(row) for row in parts["labels"]]
        if holds.ndim != 2 or holds.shape[1] != n or work.shape != holds.shape or \
                [len(r) for r in labels] != [n] * holds.shape[0]:
            raise ValueError(f"draw_ring_steps: panel {name!r}: 'holds', 'work' and 'labels' must each be "
                             f"steps x {n} (one column per device); got {holds.shape}, {work.shape} and "
                             f"{[len(r) for r in labels]}")
        if holds.size and (holds.min() < 0 or holds.max() >= n):
            raise ValueError(f"draw_ring_steps: panel {name!r}: 'holds' gives positions along the ring, 0..{n - 1}")
        if np.any((work < 0) | (work > 1)):
            raise ValueError(f"draw_ring_steps: panel {name!r}: 'work' is a fraction of a block, from 0 to 1")
        tables[name] = (holds, work, labels)
    steps = max(h.shape[0] for h, _, _ in tables.values())
    fig, axes = plt.subplots(1, len(tables), figsize=(1.0 * (n + 1.6) * len(tables) + 0.4, 0.42 * (steps + 2) + 1.2),
                             squeeze=False)
    for ax, (name, (holds, work, labels)) in zip(axes[0], tables.items(), strict=True):
        for s in range(holds.shape[0]):
            for i in range(n):
                color, w = device_color(ids[holds[s, i]]), work[s, i]
                ax.add_patch(Rectangle((i, s), 1, 1, facecolor="white", edgecolor=color, linewidth=1.0,
                                       hatch="///" if w == 0 else None))
                cell = Rectangle((i, s), w, 1, facecolor=color, edgecolor="none", gid="ring-cell")
                cell.set_label(f"dev {ids[i]}, step {s}: block of dev {ids[holds[s, i]]}, work {w:g}")
                ax.add_patch(cell)
                ax.text(i + 0.5, s + 0.5, str(labels[s][i]), ha="center", va="center", fontsize=6.5,
                        bbox=dict(_SMALL_BOX))
            ax.text(n + 0.15, s + 0.5, f"{work[s].max():g}", ha="left", va="center", fontsize=7.5)
        for i in range(n):
            ax.text(i + 0.5, -0.15, f"dev {ids[i]}", ha="center", va="bottom", fontsize=7)
            ax.text(i + 0.5, holds.shape[0] + 0.5, f"{work[:, i].sum():g}", ha="center", va="center", fontsize=7.5)
        ax.text(n + 0.15, -0.15, "step's\nlength", ha="left", va="bottom", fontsize=7)
        ax.text(-0.1, holds.shape[0] + 0.5, "work", ha="right", va="center", fontsize=7.5)
        ax.text(n + 0.15, holds.shape[0] + 0.5, f"{work.max(axis=1).sum():g}", ha="left", va="center",
                fontsize=7.5, fontweight="bold")
        ax.set(xlim=(-0.9, n + 1.4), ylim=(steps + 1.1, -1.0), xticks=[], yticks=np.arange(holds.shape[0]) + 0.5,
               yticklabels=[str(s) for s in range(holds.shape[0])])
        ax.set_ylabel("ring step (time \u2193)", fontsize=8)
        ax.tick_params(axis="y", length=0, labelsize=7.5)
        _bare(ax)
        ax.set_title(name, fontsize=9)
    return _finish(fig, title or "colour: the device the block started on; filled: the share of it computed")


def draw_routing(destinations: Any, sources: Sequence[int], *, title: str | None = None) -> Figure:
    """Draw where a mixture-of-experts layer sends its tokens: a row per source device, a cell per routed choice.

    ``destinations[i, j]``: the device that choice ``j`` of row ``i`` goes to (cell in its colour, gid
    ``"routed"``, labelled ``'dev S -> dev D'``), or ``-1`` where the expert was full (white, hatched, gid
    ``"dropped"``). ``sources[i]``: the device holding row ``i``. Each row ends with what its device keeps,
    sends and drops, so the picture reads as the all-to-all's traffic too.
    """
    dest = np.asarray(destinations)
    if dest.ndim != 2 or dest.size == 0 or not np.issubdtype(dest.dtype, np.integer):
        raise ValueError("destinations is a 2-D array of whole numbers (one row per source device, one column per "
                         f"routed choice): device ids, or -1 for a dropped choice; got {dest.dtype} of shape "
                         f"{dest.shape}")
    if dest.min() < -1:
        raise ValueError(f"destinations holds device ids (>= 0) or -1 for a dropped choice; found {int(dest.min())}")
    srcs = [int(s) for s in sources] if not isinstance(sources, str) else []
    if len(srcs) != dest.shape[0] or any(s < 0 for s in srcs):
        raise ValueError(f"sources gives the device id (>= 0) of each of the {dest.shape[0]} rows of destinations; "
                         f"got {sources!r}")
    rows, cols = dest.shape
    fig, ax = plt.subplots(figsize=(min(0.16 * cols, 9.0) + 3.2, 0.32 * rows + 1.3))
    for (i, j), d in np.ndenumerate(dest):
        if d < 0:
            cell = Rectangle((j, i + 0.08), 0.92, 0.84, facecolor="white", edgecolor="0.4", hatch="////",
                             linewidth=0.5, gid="dropped", label=f"dev {srcs[i]} -> dropped")
        else:
            cell = Rectangle((j, i + 0.08), 0.92, 0.84, facecolor=device_color(int(d)), edgecolor="none",
                             gid="routed", label=f"dev {srcs[i]} -> dev {int(d)}")
        ax.add_patch(cell)
    for i, s in enumerate(srcs):
        row = dest[i]
        kept, dropped = int(np.sum(row == s)), int(np.sum(row < 0))
        ax.text(cols + 0.5, i + 0.5, f"keeps {kept}, sends {row.size - kept - dropped}, drops {dropped}",
                ha="left", va="center", fontsize=_MIN_FONT, gid="row-note")
    ax.set(xlim=(0, cols + 0.1), ylim=(rows, 0))
    ax.set_yticks(np.arange(rows) + 0.5, [f"dev {s}" for s in srcs])
    for label, s in zip(ax.get_yticklabels(), srcs, strict=True):
        label.set_color(tuple(0.7 * v for v in device_color(s)[:3]))
    ax.set_xticks([])
    ax.tick_params(length=0, labelsize=_MIN_FONT + 0.5)
    _bare(ax)
    ax.set_xlabel("each token's choices, in token order (colour: the device of the chosen expert)", fontsize=8)
    ax.legend(handles=[Patch(facecolor="white", edgecolor="0.4", hatch="////", label="dropped: its expert was full")],
              loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=8, frameon=False)
    return _finish(fig, title or None)
