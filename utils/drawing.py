"""Pictures of shardings and meshes, drawn with matplotlib.

The course's replacement for ``jax.debug.visualize_array_sharding``, which
stops at 2-D arrays, needs ``rich`` and returns nothing a test can check.
Here every function returns a ``matplotlib.figure.Figure``:

- each block of the array is one rectangle whose ``gid`` is ``"tile"``,
  sized in proportion to the data it holds and labelled (see
  :func:`tile_labels` for the label format);
- inside it, every device holding a copy is one card in that device's colour
  (``gid`` ``"copy"``): one card fills the block; k copies are a stack of k
  offset cards, like a deck, never side-by-side stripes (stripes would read as
  a further split of the block);
- padding that XLA adds to an uneven dimension is hatched, outside the array;
- a device has the same colour in every figure (:func:`device_color`).

:func:`draw_matmul` draws ``C = A @ B`` for one device: the blocks it holds,
the blocks it must fetch, and whether its output block is only a partial sum.
:func:`draw_permute` draws a ``ppermute`` as arrows on the mesh.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from .inspecting import format_bytes
from .layout import MatmulTraffic, Tile, as_layout, matmul_traffic, tiles, type_string


def _show_figures_inline(shell: Any = None, backend: str | None = None) -> bool:
    """In a Jupyter kernel whose backend is Agg, switch to inline display; return whether it switched.

    A kernel started with MPLBACKEND=Agg (common in CI and some launchers) prints
    '<Figure size ...>' instead of drawing the course's figures. Any other
    backend is the user's choice (``%matplotlib widget``, inline, ...) and is
    left alone; so is a plain Python or terminal IPython session (no kernel).
    """
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:  # pragma: no cover - the course always has IPython
            return False
        shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return False
    if backend is None:
        backend = matplotlib.get_backend()
    if str(backend).lower() != "agg":
        return False
    shell.run_line_magic("matplotlib", "inline")
    return True


_show_figures_inline()

__all__ = [
    "device_color",
    "device_label",
    "draw_matmul",
    "draw_mesh",
    "draw_permute",
    "draw_sharding",
    "draw_shardings",
    "mesh_labels",
    "tile_labels",
]

_BASE = [matplotlib.colormaps["tab10"](i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]
_MORE = [matplotlib.colormaps["tab20b"](i) for i in range(20)] + [
    matplotlib.colormaps["tab20c"](i) for i in range(16)
]


def device_color(device_id: int) -> tuple[float, float, float, float]:
    """The colour of device ``device_id``: the same in every figure of the course."""
    if isinstance(device_id, bool) or not isinstance(device_id, int | np.integer) or device_id < 0:
        raise ValueError(f"device_color takes a device id (a whole number >= 0); got {device_id!r}")
    palette = _BASE[:8] + _MORE
    return palette[int(device_id) % len(palette)]


def device_label(ids: Sequence[int]) -> str:
    """'dev 0', 'dev 0,1', 'dev 0-7', 'dev 0,8,...,56' (runs and long strides are shortened).

    Runs of 3+ consecutive ids become 'a-b'; 5+ ids with a constant stride
    become 'a,b,...,z', so labels stay short on 64-device meshes.
    """
    ids = sorted(int(i) for i in ids)
    steps = {b - a for a, b in itertools.pairwise(ids)}
    if len(ids) >= 5 and len(steps) == 1 and steps != {1}:
        return f"dev {ids[0]},{ids[1]},...,{ids[-1]}"
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(f"{ids[i]}-{ids[j]}" if j - i >= 2 else ",".join(map(str, ids[i : j + 1])))
        i = j + 1
    return "dev " + ",".join(parts)


def _spec_text(sharding: Any) -> str:
    spec = getattr(sharding, "spec", None)
    return "" if spec is None else str(spec)


def _mesh_text(sharding: Any) -> str:
    mesh = getattr(sharding, "mesh", None)
    if mesh is None:
        return type(sharding).__name__
    return "mesh(" + ", ".join(f"{k}={v}" for k, v in dict(mesh.shape).items()) + ")"


def _panel_dims(ndim: int, dims: Sequence[int] | None) -> tuple[int | None, int | None]:
    """(row dim, column dim) to draw; None where the picture has no such axis."""
    if dims is None:
        if ndim == 0:
            return None, None
        if ndim == 1:
            return None, 0
        return ndim - 2, ndim - 1
    dims = tuple(dims)
    if len(dims) != 2 or len(set(dims)) != 2 or not all(isinstance(d, int) for d in dims):
        raise ValueError(f"dims picks two different dimensions to draw, such as dims=(0, 2); got {dims}")
    bad = [d for d in dims if not -ndim <= d < ndim]
    if bad:
        raise ValueError(f"dims={dims} names dimension {bad[0]}, but the array has {ndim} dimension(s)")
    r, c = (d % ndim for d in dims)
    return r, c


def _panels(
    shape: tuple[int, ...], all_tiles: list[Tile], r: int | None, c: int | None
) -> list[tuple[str, list[Tile]]]:
    """Group tiles by their block on the dimensions not drawn: one panel each."""
    others = [d for d in range(len(shape)) if d not in (r, c)]
    groups: dict[tuple[tuple[int, int], ...], list[Tile]] = {}
    for t in all_tiles:
        key = tuple((t.start[d], t.stop[d]) for d in others)
        groups.setdefault(key, []).append(t)
    out = []
    for key in sorted(groups):
        if all(a == 0 and b == shape[d] for d, (a, b) in zip(others, key, strict=True)):
            label = ""
        else:
            label = ", ".join(
                f"dim {d} = {a}:{b}" for d, (a, b) in zip(others, key, strict=True) if (a, b) != (0, shape[d])
            )
        out.append((label, groups[key]))
    return out


def _label_lines(panel_tiles: list[Tile], show_bytes: bool, extra: Mapping[int, Sequence[str]] | None = None) -> int:
    """The most lines any block label of this panel has (see :func:`tile_labels`)."""
    return max(
        (2 + show_bytes + t.is_uneven + (len(t.devices) > 1) + len((extra or {}).get(i, ()))
         for i, t in enumerate(panel_tiles)),
        default=3,
    )


def _panel_inches(
    shape: tuple[int, ...], panel_tiles: list[Tile], r: int | None, c: int | None, lines: int = 3
) -> tuple[float, float]:
    """Panel size: true proportions where labels fit, stretched where blocks would be too thin.

    Each row of blocks gets at least the height of its labels' ``lines``.
    """
    n_rows = len({(t.start[r], t.stop[r]) for t in panel_tiles}) if r is not None else 1
    n_cols = len({(t.start[c], t.stop[c]) for t in panel_tiles}) if c is not None else 1
    per_row, wrapped_rows = _wrap(panel_tiles, r, c)
    if per_row:
        n_cols = _WRAP
    width = min(max(1.15 * n_cols, 3.6), 9.0)
    if r is None:
        return width, max(0.9, (0.2 + 0.14 * lines) * wrapped_rows)
    true_height = width * shape[r] / max(shape[c] if c is not None else 1, 1)
    return width, min(max(true_height, (0.2 + 0.14 * lines) * n_rows, 0.9), 7.0)


_WRAP = 16  # a 1-D view of more blocks than this is wrapped onto rows of this many blocks


def _wrap(panel_tiles: list[Tile], r: int | None, c: int | None) -> tuple[int, int]:
    """(elements per row, rows) for a 1-D view of many blocks, wrapped like text; (0, 1) when it fits on one row.

    Rows hold ``_WRAP`` blocks each, so row breaks fall between blocks and labels stay legible on big meshes.
    """
    if r is not None or c is None or len(panel_tiles) <= _WRAP:
        return 0, 1
    block = max(t.padded[c] for t in panel_tiles)
    if block == 0:
        return 0, 1
    per_row = _WRAP * block
    end = max(t.start[c] + t.padded[c] for t in panel_tiles)
    return per_row, math.ceil(end / per_row)


_LABEL_BOX = dict(boxstyle="round,pad=0.15", facecolor="white", alpha=0.8, linewidth=0)
_DECK_STEP_PT = 4.0  # offset between two cards of a deck, in points
_DECK_SHARE = 0.35  # a deck's offsets take at most this share of the block's smaller side
_CARD_MIN_STEP_PT = 1.5  # below this, cards are indistinguishable: show fewer (the label says how many)


def _points_per_unit(ax: Axes) -> tuple[float, float]:
    """Points per data unit along x and y, from the axes' final size on the figure."""
    ax.apply_aspect()
    box = ax.get_position()
    fig_w, fig_h = ax.figure.get_size_inches()
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    return 72 * box.width * fig_w / max(abs(x1 - x0), 1e-9), 72 * box.height * fig_h / max(abs(y1 - y0), 1e-9)


def _finish_blocks(fig: Figure) -> None:
    """Draw the cards every ``_draw_tiles`` call queued on ``fig``: call after ``tight_layout``.

    Card offsets are in points, so they need the axes' final size; patches
    inside the axes do not change the layout, so drawing them last is safe.
    """
    for ax in fig.axes:
        queued = ax.__dict__.pop("_course_decks", [])
        labels = ax.__dict__.pop("_course_labels", [])
        if queued or labels:
            ppu = _points_per_unit(ax)
            for x0, y0, w, h, devices, alpha in queued:
                _draw_deck(ax, x0, y0, w, h, devices, ppu, alpha)
            _fit_labels(labels, ppu)


_MIN_FONT = 4.5


def _fit_labels(labels: Sequence[tuple[Any, float, float]], ppu: tuple[float, float]) -> None:
    """One font size for every label of a panel: the largest (up to each label's own size) that fits every block."""
    sizes = []
    for text, w, h in labels:
        lines = text.get_text().split("\n")
        w_pt, h_pt = w * ppu[0], h * ppu[1]
        if w_pt <= 0 or h_pt <= 0:
            continue
        fit = min(0.85 * h_pt / (1.3 * len(lines) + 0.4), 0.92 * w_pt / (0.6 * max(len(line) for line in lines) + 1))
        sizes.append(min(text.get_fontsize(), fit))
    if sizes:
        size = max(min(sizes), _MIN_FONT)
        for text, _, _ in labels:
            text.set_fontsize(size)


def _draw_deck(
    ax: Axes, x0: float, y0: float, w: float, h: float, devices: Sequence[int], ppu: tuple[float, float], alpha: float
) -> None:
    """One card per device holding the block: one card fills it; k cards stack like a deck, offset down-right.

    The first device's card is on top; the others peek out behind it, each in
    its device's colour. When the block is too small to show every card at
    least 1.5 points apart, fewer are shown (the label still says 'k copies').
    """
    k = len(devices)
    if w <= 0 or h <= 0:
        return
    if k == 1:
        ax.add_patch(Rectangle((x0, y0), w, h, facecolor=device_color(devices[0]), alpha=alpha, linewidth=0,
                               gid="copy", zorder=1.0))
        return
    w_pt, h_pt = w * ppu[0], h * ppu[1]
    room = _DECK_SHARE * min(w_pt, h_pt)
    shown = min(k, max(2, int(room / _CARD_MIN_STEP_PT) + 1))
    step = min(_DECK_STEP_PT, room / (shown - 1))
    margin = min(1.5, 0.1 * min(w_pt, h_pt))
    sx, sy, mx, my = step / ppu[0], step / ppu[1], margin / ppu[0], margin / ppu[1]
    cw, ch = w - 2 * mx - (shown - 1) * sx, h - 2 * my - (shown - 1) * sy
    for i, dev in enumerate(devices[:shown]):  # first device on top; the others peek out behind it
        ax.add_patch(Rectangle((x0 + mx + i * sx, y0 + my + i * sy), cw, ch, facecolor=device_color(dev), alpha=alpha,
                               edgecolor="white", linewidth=0.8, gid="copy", zorder=1.0 - i / (2 * k)))


def _draw_tiles(
    ax: Axes,
    shape: tuple[int, ...],
    panel_tiles: list[Tile],
    r: int | None,
    c: int | None,
    itemsize: int,
    show_bytes: bool,
    fontsize: float,
    extra: Mapping[int, Sequence[str]] | None = None,
    alpha: float = 0.85,
) -> list[tuple[Tile, Any]]:
    """Draw one 2-D view: the array spans [0, 1] x [0, 1], row 0 at the top.

    ``extra`` maps a tile's position in ``panel_tiles`` to label lines added at
    the end (contents, a matmul role). Returns (tile, label text) pairs.
    """
    nr = shape[r] if r is not None else 1
    nc = shape[c] if c is not None else 1
    width, height = 1.0, 1.0
    per_row, wrapped_rows = _wrap(panel_tiles, r, c)

    def span(t: Tile, d: int | None, n: int, extent: float) -> tuple[float, float, float]:
        if d is None:
            return 0.0, extent, 0.0
        a, b, p = t.start[d], t.stop[d], t.padded[d]
        unit = extent / max(n, 1)
        return a * unit, (b - a) * unit, max(p - (b - a), 0) * unit

    def place(t: Tile) -> tuple[float, float, float, float, float, float]:
        """x0, w, xpad, y0, h, ypad of a tile; a wrapped 1-D view puts row k of blocks at height k."""
        if not per_row:
            return (*span(t, c, nc, width), *span(t, r, nr, height))
        assert c is not None
        row = t.start[c] // per_row
        a, b, p = t.start[c] - row * per_row, t.stop[c] - row * per_row, t.padded[c]
        return a / per_row, (b - a) / per_row, max(p - (b - a), 0) / per_row, (row + 0.08) / wrapped_rows, \
            0.84 / wrapped_rows, 0.0

    pad_right = pad_down = 0.0
    for t in panel_tiles:
        x0, w, xpad, y0, h, ypad = place(t)
        pad_right, pad_down = max(pad_right, x0 + w + xpad - width), max(pad_down, y0 + h + ypad - height)
    xlim = (-0.01, width + pad_right + 0.01)
    ylim = (height + pad_down + 0.01, -0.01)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    decks = ax.__dict__.setdefault("_course_decks", [])  # drawn by _finish_blocks once the layout is final

    drawn = []
    for i, t in enumerate(panel_tiles):
        x0, w, xpad, y0, h, ypad = place(t)
        decks.append((x0, y0, w, h, t.devices, alpha))
        if xpad:  # padding XLA allocates beyond the real data
            ax.add_patch(Rectangle((x0 + w, y0), xpad, h + ypad, fill=False, hatch="///",
                                   edgecolor="0.45", linewidth=0.5, gid="padding"))
        if ypad:
            ax.add_patch(Rectangle((x0, y0 + h), w, ypad, fill=False, hatch="///",
                                   edgecolor="0.45", linewidth=0.5, gid="padding"))
        ax.add_patch(Rectangle((x0, y0), w, h, fill=False, edgecolor="black", linewidth=1.0, gid="tile", zorder=1.5))
        lines = [device_label(t.devices), str(t.shape).replace(",)", ")")]
        if show_bytes:
            lines.append(format_bytes(math.prod(t.shape) * itemsize))
        if t.is_uneven:
            lines.append("padded to " + str(t.padded).replace(",)", ")"))
        if len(t.devices) > 1:
            lines.append(f"{len(t.devices)} copies")
        lines.extend((extra or {}).get(i, ()))
        cx, cy = x0 + (w + xpad) / 2, y0 + (h + ypad) / 2  # uneven blocks: centred over data + padding
        text = ax.text(cx, cy, "\n".join(lines), ha="center", va="center", fontsize=fontsize, gid="tile-label",
                       bbox=dict(_LABEL_BOX), zorder=3)
        ax.__dict__.setdefault("_course_labels", []).append((text, w + xpad, h + ypad))  # sized by _finish_blocks
        drawn.append((t, text))
    if per_row:  # the array's outline, row by row
        for row in range(wrapped_rows):
            length = min(nc - row * per_row, per_row) / per_row
            ax.add_patch(Rectangle((0, (row + 0.08) / wrapped_rows), length, 0.84 / wrapped_rows, fill=False,
                                   edgecolor="black", linewidth=2.0, gid="array", zorder=1.6))
    else:
        ax.add_patch(Rectangle((0, 0), width, height, fill=False, edgecolor="black", linewidth=2.0, gid="array",
                               zorder=1.6))
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    if per_row:
        ax.set_xlabel(f"dim {c} ({nc}), wrapped: {per_row} per row", fontsize=fontsize + 1)
        ax.set_yticks([(row + 0.5) / wrapped_rows for row in range(wrapped_rows)],
                      [f"{row * per_row}:" for row in range(wrapped_rows)], fontsize=fontsize)
        ax.tick_params(length=0)
    elif c is not None:
        ax.set_xlabel(f"dim {c} ({nc})", fontsize=fontsize + 1)
    if r is not None:
        ax.set_ylabel(f"dim {r} ({nr})", fontsize=fontsize + 1)
    return drawn


def _contents_lines(
    x: Any, panel_tiles: list[Tile], contents: Callable[[np.ndarray], str] | None, name: str = "this array"
) -> dict[int, list[str]]:
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


def _fontsize(n_tiles: int) -> float:
    """The largest label font for a panel of ``n_tiles`` blocks; labels shrink further if their block is small."""
    return 9.0 if n_tiles <= 4 else 8.0 if n_tiles <= 16 else 7.0


def draw_sharding(
    x: Any,
    sharding: Any = None,
    *,
    mesh: Any = None,
    dims: Sequence[int] | None = None,
    title: str | None = None,
    show_bytes: bool = True,
    max_panels: int = 16,
    contents: Callable[[np.ndarray], str] | None = None,
) -> Figure:
    """Draw where every block of an array lives.

    ``x`` is a sharded ``jax.Array``, a ``jax.ShapeDtypeStruct``, or a shape
    such as ``(128, 512)`` together with ``sharding`` (a ``NamedSharding``, or
    a ``PartitionSpec`` with ``mesh=``). 1-D arrays are drawn as a row, 2-D as
    a grid; for N-D arrays ``dims`` picks the two dimensions drawn (default:
    the last two) and the blocks of the other dimensions become a grid of
    panels. The title gives the course's type notation and the spec.

    ``contents`` (for a real ``jax.Array`` only) labels each block with what it
    holds: it is called on each device's shard data (a numpy array) and its
    string becomes the label's last line, e.g. ``contents=lambda b: f"{b[0, 0]:.0f}"``.
    A layout picture shows where blocks live, not what they hold: a collective
    that moves data but keeps the layout (``ppermute``) changes only these lines.
    Copies that read the same give one line; copies that differ give one line
    per device (``'dev 2: 5'``).
    """
    shape, dtype, sharding = as_layout(x, sharding, mesh)
    r, c = _panel_dims(len(shape), dims)
    all_tiles = tiles(shape, sharding)
    panels = _panels(shape, all_tiles, r, c)
    if len(panels) > max_panels:
        raise ValueError(
            f"this layout needs {len(panels)} panels (more than max_panels={max_panels}): "
            f"pick the sharded dimensions with dims=(i, j), or raise max_panels"
        )
    extras = [_contents_lines(x, panel_tiles, contents) for _, panel_tiles in panels]
    lines = max(_label_lines(p, show_bytes, e) for (_, p), e in zip(panels, extras, strict=True))
    ncols = min(len(panels), 4)
    nrows = math.ceil(len(panels) / ncols)
    pw, ph = _panel_inches(shape, panels[0][1], r, c, lines)
    if ncols > 1:
        pw, ph = pw * 0.75, ph * 0.75
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(max(pw * ncols, 5.0), ph * nrows + 0.5 * nrows + 0.8), squeeze=False
    )
    itemsize = np.dtype(dtype).itemsize
    for ax, (label, panel_tiles), extra in zip(axes.flat, panels, extras, strict=False):
        _draw_tiles(ax, shape, panel_tiles, r, c, itemsize, show_bytes, _fontsize(len(panel_tiles)), extra)
        if label:
            ax.set_title(label, fontsize=9)
    for ax in list(axes.flat)[len(panels) :]:
        ax.remove()
    head = title if title is not None else type_string(shape, sharding, dtype=dtype)
    fig.suptitle(f"{head}\n{_spec_text(sharding)} on {_mesh_text(sharding)}", fontsize=10)
    fig.tight_layout()
    _finish_blocks(fig)
    plt.close(fig)  # the notebook shows the returned figure once, not twice
    return fig


def draw_mesh(mesh: Any, *, title: str | None = None) -> Figure:
    """Draw a device mesh: one cell per device, laid out on the named axes.

    1-D meshes are a row; 2-D meshes put the first axis down and the second
    across; axes beyond the last two become a row of panels.
    """
    from jax.sharding import Mesh

    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"draw_mesh needs a jax.sharding.Mesh with devices, such as jax.make_mesh((4, 2), ('data', 'model')); "
            f"got {type(mesh).__name__}"
        )
    names = list(mesh.axis_names)
    ids = np.vectorize(lambda d: d.id, otypes=[int])(mesh.devices)
    if ids.ndim == 1:
        ids = ids[None, :]
        names2 = [None, names[0]]
        lead: list[str] = []
    else:
        names2 = names[-2:]
        lead = names[:-2]
    lead_shape = ids.shape[:-2]
    panels = list(np.ndindex(*lead_shape)) or [()]
    ncols = min(len(panels), 4)
    nrows = math.ceil(len(panels) / ncols)
    rows, cols = ids.shape[-2:]
    cell = 0.9 if max(rows, cols) <= 8 else 0.45
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(max(cols * cell + 0.9, 2.2) * ncols, (rows * cell + 0.9) * nrows + 0.5), squeeze=False
    )
    fontsize = 9 if max(rows, cols) <= 8 else 6
    for ax, idx in zip(axes.flat, panels, strict=False):
        grid = ids[idx]
        for i in range(rows):
            for j in range(cols):
                dev = int(grid[i, j])
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=device_color(dev), alpha=0.8,
                                       edgecolor="white", linewidth=2, gid="device"))
                ax.text(j + 0.5, i + 0.5, str(dev), ha="center", va="center", fontsize=fontsize, gid="device-label")
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        ax.set_aspect("equal")
        ax.set_xticks(np.arange(cols) + 0.5, [str(j) for j in range(cols)] if cols <= 16 else [""] * cols)
        ax.set_yticks(np.arange(rows) + 0.5, [str(i) for i in range(rows)] if rows <= 16 else [""] * rows)
        ax.tick_params(length=0, labelsize=fontsize)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.set_xlabel(f"{names2[1]} ({cols}) \u2192", fontsize=9)
        if names2[0] is not None:
            ax.set_ylabel(f"{names2[0]} ({rows}) \u2193", fontsize=9)
        if idx:
            ax.set_title(", ".join(f"{n}={k}" for n, k in zip(lead, idx, strict=True)), fontsize=9)
    for ax in list(axes.flat)[len(panels) :]:
        ax.remove()
    shape_text = ", ".join(f"{k}={v}" for k, v in dict(mesh.shape).items())
    fig.suptitle(title if title is not None else f"Mesh({shape_text}): device ids", fontsize=10)
    fig.tight_layout()
    _finish_blocks(fig)
    plt.close(fig)
    return fig


def _is_shape_and_sharding(v: Any) -> bool:
    from jax.sharding import Sharding

    return isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], tuple | list) and isinstance(v[1], Sharding)


def _named_leaves(arrays: Any) -> list[tuple[str, Any, Any]]:
    """(name, array or shape, sharding) for every array in a mapping or pytree.

    A mapping keeps its own order (a dict is drawn in the order it was written);
    inside each value, pytree order applies.
    """
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


def draw_shardings(
    arrays: Any,
    *,
    ncols: int = 3,
    title: str | None = None,
    show_bytes: bool = True,
    contents: Callable[[np.ndarray], str] | None = None,
) -> Figure:
    """Draw several arrays side by side, one panel each, named and typed.

    ``arrays`` is a dict of name -> array (or name -> (shape, sharding)), or
    any pytree of arrays such as ``nnx.state(model)``: the panel titles are the
    pytree paths, e.g. ``linear1/kernel``. N-D arrays show their last two
    dimensions (use :func:`draw_sharding` for the full picture). ``contents``
    labels each block with what it holds, as in :func:`draw_sharding`; every
    array must then be a real ``jax.Array``.
    """
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols must be a whole number >= 1; got {ncols!r}")
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
        panel = _panels(shape, tiles(shape, sh), r, c)[0]
        views.append((name, shape, dtype, sh, r, c, panel, _contents_lines(x, panel[1], contents, repr(name))))
    sizes = [_panel_inches(shape, panel[1], r, c, _label_lines(panel[1], show_bytes, extra))
             for _, shape, _, _, r, c, panel, extra in views]
    aspects = [min(max(h / w, 0.22), 1.0) for w, h in sizes]
    cell_w = max(3.8, *(w * 0.8 for w, _ in sizes))
    cell_h = cell_w * max(aspects) + 1.0
    fig, axes = plt.subplots(nrows, ncols, figsize=(cell_w * ncols, cell_h * nrows + 0.4), squeeze=False)
    for ax, aspect, (name, shape, dtype, sh, r, c, (panel_label, panel_tiles), lines) in zip(
        axes.flat, aspects, views, strict=False
    ):
        ax.set_box_aspect(aspect)  # each panel keeps its own proportions (a bias stays a thin strip)
        _draw_tiles(ax, shape, panel_tiles, r, c, np.dtype(dtype).itemsize, show_bytes,
                    _fontsize(len(panel_tiles)), lines)
        extra = f"\n(first block of {panel_label.split(' = ')[0]})" if panel_label else ""
        ax.set_title(f"{name}\n{type_string(shape, sh, dtype=dtype)}{extra}", fontsize=9)
    for ax in list(axes.flat)[len(items) :]:
        ax.remove()
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _finish_blocks(fig)
    plt.close(fig)
    return fig


_HELD, _FETCH, _OUT = "#1a7f37", "#cf222e", "#6639ba"  # green, red, purple: the roles in draw_matmul


def _matmul_operand(name: str, x: Any, mesh: Any = None) -> tuple[tuple[int, ...], Any, Any]:
    """(shape, dtype, sharding) of a matmul operand: an array, a ShapeDtypeStruct, or a (shape, sharding) pair."""
    from jax.sharding import PartitionSpec, Sharding

    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], Sharding | PartitionSpec):
        x, sharding = x
    else:
        sharding = None
    try:
        return as_layout(x, sharding, mesh)
    except (TypeError, ValueError) as err:
        raise type(err)(
            f"{name}: {err}. Each operand is a sharded jax.Array, a ShapeDtypeStruct with a sharding, "
            f"or a (shape, NamedSharding) pair"
        ) from None


def _faded(ax: Axes, text: Any) -> None:
    text.set_alpha(0.45)
    text.get_bbox_patch().set_alpha(0.35)


def _outline(ax: Axes, start: Sequence[int], stop: Sequence[int], shape: Sequence[int], gid: str, **style: Any) -> None:
    """An outline (or hatched overlay) over rows start[0]:stop[0], columns start[1]:stop[1] of a 2-D panel."""
    y0, x0 = start[0] / shape[0], start[1] / shape[1]
    h, w = (stop[0] - start[0]) / shape[0], (stop[1] - start[1]) / shape[1]
    ax.add_patch(Rectangle((x0, y0), w, h, gid=gid, zorder=2.0, **style))


def draw_matmul(
    lhs: Any,
    rhs: Any,
    out: Any,
    *,
    device: Any = 0,
    title: str | None = None,
    names: tuple[str, str, str] = ("A", "B", "C"),
    show_bytes: bool = False,
) -> Figure:
    """Draw ``C = A @ B`` as one device sees it: what it holds, fetches, and adds up.

    ``lhs`` (A, shape (M, K)), ``rhs`` (B, (K, N)) and ``out`` (C, (M, N)) are
    each a sharded ``jax.Array``, a ``jax.ShapeDtypeStruct`` with a sharding,
    or a ``(shape, NamedSharding)`` pair; ``out`` may also be just C's
    ``NamedSharding`` or ``PartitionSpec`` (its shape follows from A and B),
    e.g. ``compiled.output_shardings``. The three panels sit side by side. For
    ``device``: its blocks of A and B are outlined in green ("held by dev 0");
    the pieces it needs for its block of C but does not hold are hatched red
    ("fetched from dev 1": an all-gather); its block of C is outlined in
    purple, with "partial sum over 'model'" when A and B split the contracting
    dimension (an all-reduce, or a reduce-scatter when C is split over that
    axis too). Blocks it does not use are faded. The title says what moves.

    The geometry is :func:`utils.layout.matmul_traffic`, the textbook plan;
    assert against it, and against the compiled program's collectives.
    """
    a_shape, a_dtype, a_sh = _matmul_operand(names[0], lhs)
    mesh = getattr(a_sh, "mesh", None)
    b_shape, b_dtype, b_sh = _matmul_operand(names[1], rhs, mesh)
    from jax.sharding import PartitionSpec, Sharding

    if isinstance(out, PartitionSpec | Sharding):
        c_sh = out
        c_dtype = np.result_type(a_dtype, b_dtype)
    else:
        c_shape, c_dtype, c_sh = _matmul_operand(names[2], out, mesh)
        if len(a_shape) == 2 and len(b_shape) == 2 and c_shape != (a_shape[0], b_shape[1]):
            raise ValueError(
                f"{names[2]} has shape {c_shape}, but {names[0]} {a_shape} @ {names[1]} {b_shape} has shape "
                f"{(a_shape[0], b_shape[1])}: pass the matmul's output (or just its sharding)"
            )
    traffic = matmul_traffic(a_shape, a_sh, b_shape, b_sh, c_sh, device)
    c_shape = (a_shape[0], b_shape[1])
    c_sh = c_sh if isinstance(c_sh, Sharding) else as_layout(c_shape, c_sh, mesh)[2]
    d = traffic.device

    panels = [(names[0], a_shape, a_dtype, a_sh, traffic.lhs), (names[1], b_shape, b_dtype, b_sh, traffic.rhs),
              (f"{names[2]} = {names[0]} @ {names[1]}", c_shape, c_dtype, c_sh, None)]
    views = []
    for _, shape, _, sh, op in panels:
        panel_tiles = tiles(shape, sh)
        views.append((panel_tiles, _matmul_roles(traffic, op, panel_tiles)))
    top = max(a_shape[1], b_shape[1])
    sizes = []
    for (_, shape, _, _, _), (panel_tiles, roles) in zip(panels, views, strict=True):
        n_rows = len({(t.start[0], t.stop[0]) for t in panel_tiles})
        n_cols = len({(t.start[1], t.stop[1]) for t in panel_tiles})
        w = min(max(4.2 * shape[1] / top, 1.1 * n_cols, 1.6), 7.0)
        lines = _label_lines(panel_tiles, show_bytes, roles)
        h = min(max(w * min(max(shape[0] / shape[1], 0.25), 1.6), (0.2 + 0.14 * lines) * n_rows, 0.9), 7.0)
        sizes.append((w, h))
    legend_in = 0.6
    fig_h = max(h for _, h in sizes) + 1.4 + legend_in
    fig, axes = plt.subplots(1, 3, figsize=(sum(w for w, _ in sizes) + 2.4, fig_h),
                             gridspec_kw={"width_ratios": [w for w, _ in sizes]})
    for ax, (w, h), (name, shape, dtype, sh, op), (panel_tiles, roles) in zip(axes, sizes, panels, views, strict=True):
        ax.set_box_aspect(h / w)
        fontsize = _fontsize(len(panel_tiles)) - 0.5
        drawn = _draw_tiles(ax, shape, panel_tiles, 0, 1, np.dtype(dtype).itemsize, show_bytes, fontsize, roles)
        for i, (t, text) in enumerate(drawn):
            if i not in roles:
                _faded(ax, text)
                _outline(ax, t.start, t.stop, shape, "faded", facecolor="white", alpha=0.6, linewidth=0)
        if op is not None:
            _outline(ax, op.held.start, op.held.stop, shape, "held", fill=False, edgecolor=_HELD, linewidth=3)
            for p in op.missing:
                _outline(ax, p.start, p.stop, shape, "fetched", fill=False, hatch="xx", edgecolor=_FETCH,
                         linewidth=2.5, linestyle="--")
            for i, (t, text) in enumerate(drawn):
                if i in roles:
                    text.get_bbox_patch().set(edgecolor=_HELD if d in t.devices else _FETCH, linewidth=1.5, alpha=0.9)
        else:
            if traffic.partial_axes:
                _outline(ax, traffic.computed_start, traffic.computed_stop, shape, "partial", fill=False,
                         edgecolor=_OUT, linewidth=0, hatch="//")
            _outline(ax, traffic.out.start, traffic.out.stop, shape, "out", fill=False, edgecolor=_OUT, linewidth=3)
            for i, (_, text) in enumerate(drawn):
                if i in roles:
                    text.get_bbox_patch().set(edgecolor=_OUT, linewidth=1.5, alpha=0.9)
        ax.set_title(f"{name}\n{type_string(shape, sh, dtype=dtype)}   {_spec_text(sh)}", fontsize=9)
    handles = [
        Patch(facecolor="none", edgecolor=_HELD, linewidth=2.5, label=f"held by dev {d}"),
        Patch(facecolor="none", edgecolor=_FETCH, hatch="xx", linewidth=2, linestyle="--",
              label=f"needed by dev {d}, held elsewhere: fetched (all-gather)"),
        Patch(facecolor="none", edgecolor=_OUT, linewidth=2.5, label=f"dev {d}'s block of {names[2]}"),
        Patch(facecolor="0.93", edgecolor="0.8", label=f"not used by dev {d}"),
    ]
    if traffic.partial_axes:
        handles.insert(3, Patch(facecolor="none", edgecolor=_OUT, hatch="//", linewidth=0,
                                label=f"partial sums dev {d} computes: added up over "
                                      f"{_axes_words(traffic.partial_axes)} ({traffic.reduction})"))
    fig.legend(handles=handles, loc="lower center", ncol=3 if len(handles) > 4 else 2, fontsize=8, frameon=False)
    summary = traffic.summary((names[0], names[1], names[2]))
    fig.suptitle(f"{title}\n{summary}" if title else summary, fontsize=10)
    head_in = 0.2 * (fig._suptitle.get_text().count("\n") + 1)  # type: ignore[union-attr]
    fig.tight_layout(rect=(0, legend_in / fig_h, 1, 1 - head_in / fig_h))
    _finish_blocks(fig)
    plt.close(fig)
    return fig


def _matmul_roles(traffic: MatmulTraffic, op: Any, panel_tiles: list[Tile]) -> dict[int, list[str]]:
    """The role line of each block that matters to the device (see :func:`tile_labels`, line 7)."""
    d = traffic.device
    roles: dict[int, list[str]] = {}
    for i, t in enumerate(panel_tiles):
        if op is not None:  # an input: held, fetched, or not used
            pieces = [p for p in op.pieces if p.holders == t.devices and _inside(p, t)]
            if d in t.devices:
                roles[i] = [f"held by dev {d}" if pieces else f"held by dev {d} (not needed)"]
            elif pieces:
                (p,) = pieces
                part = "" if p.shape == t.shape else f"{p.index_string()} "
                roles[i] = [f"{part}fetched from dev {p.source}"]
        elif d in t.devices:  # the output: the device's own block
            if traffic.partial_axes:
                roles[i] = [f"dev {d}'s block: partial sum over {_axes_words(traffic.partial_axes)}"]
            else:
                roles[i] = [f"dev {d}'s block: complete"]
        elif traffic.reduction == "reduce-scatter" and _overlaps(t, traffic.computed_start, traffic.computed_stop):
            roles[i] = [f"gets a partial sum from dev {d}"]
    return roles


def _overlaps(t: Tile, start: Sequence[int], stop: Sequence[int]) -> bool:
    return all(max(a, x) < min(b, y) for a, b, x, y in zip(t.start, t.stop, start, stop, strict=True))


def _inside(p: Any, t: Tile) -> bool:
    return all(a <= x and y <= b for a, b, x, y in zip(t.start, t.stop, p.start, p.stop, strict=True))


def _axes_words(axes: Sequence[str]) -> str:
    return " and ".join(repr(a) for a in axes)


def draw_permute(mesh: Any, axis_name: str, perm: Sequence[tuple[int, int]], *, title: str | None = None) -> Figure:
    """Draw ``jax.lax.ppermute(x, axis_name, perm)`` as arrows between devices on the mesh.

    ``perm`` is what ``ppermute`` takes: ``(source, destination)`` pairs of
    indices along ``axis_name``. The same pairs run in every group of devices
    along the other mesh axes, so each group gets its own arrows, each in the
    colour of the device that sends. A device no pair sends to receives zeros
    from ``ppermute``: its cell is hatched and says so. Pairs a device sends to
    itself are drawn as "keeps its block". Arrows carry the label
    ``'dev S -> dev D'`` (``[a.get_label() for a in fig.axes[0].patches if a.get_gid() == 'permute-arrow']``).
    """
    from jax.sharding import Mesh

    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"draw_permute needs a jax.sharding.Mesh with devices, such as jax.make_mesh((4, 2), ('data', 'model')); "
            f"got {type(mesh).__name__}"
        )
    names = list(mesh.axis_names)
    if axis_name not in names:
        raise ValueError(f"mesh has no axis {axis_name!r}; its axes are {tuple(names)}")
    size = dict(mesh.shape)[axis_name]
    pairs = _check_perm(perm, axis_name, size)
    ids = np.vectorize(lambda dv: dv.id, otypes=[int])(mesh.devices)
    axis = names.index(axis_name)
    if ids.ndim == 1:
        grid_ids, row_axis, col_axis = ids[None, :], None, 0
    elif ids.ndim == 2:
        grid_ids, row_axis, col_axis = ids, 0, 1
    else:
        if axis < ids.ndim - 2:
            raise ValueError(
                f"draw_permute draws the last two mesh axes; {axis_name!r} is not one of them: "
                f"build the mesh with {axis_name!r} among its last two axes to draw it"
            )
        lead = ids.shape[:-2]
        grid_ids = ids.reshape(-1, *ids.shape[-2:])[0]  # the first panel: every other panel is the same picture
        row_axis, col_axis = ids.ndim - 2, ids.ndim - 1
        title = title or f"first {', '.join(f'{n}=0' for n in names[: len(lead)])} slice shown; others alike"
    rows, cols = grid_ids.shape
    cell = 1.1
    fig, ax = plt.subplots(figsize=(max(cols * cell + 2.0, 3.5), rows * cell + 1.4))
    targets = {dst for _, dst in pairs}
    for i in range(rows):
        for j in range(cols):
            dev = int(grid_ids[i, j])
            index = (i if axis == row_axis else j) if ids.ndim > 1 else j
            receives = index in targets
            ax.add_patch(Rectangle((j + 0.06, i + 0.06), 0.88, 0.88, facecolor=device_color(dev),
                                   alpha=0.8 if receives else 0.3, edgecolor="0.3" if not receives else "white",
                                   hatch=None if receives else "..", linewidth=1.5, gid="device"))
            ax.text(j + 0.5, i + 0.5, str(dev), ha="center", va="center", fontsize=10, gid="device-label")
            if not receives:
                ax.text(j + 0.5, i + 0.78, "receives zeros", ha="center", va="center", fontsize=6.5, gid="zeros-note",
                        bbox=dict(_LABEL_BOX))
    along_rows = ids.ndim > 1 and axis == row_axis  # the permuted axis runs down the picture
    pair_set = set(pairs)
    for src, dst in pairs:
        for g in range(cols if along_rows else rows):  # one group of devices per position on the other axis
            a, b = ((src, g), (dst, g)) if along_rows else ((g, src), (g, dst))
            s_dev, d_dev = int(grid_ids[a]), int(grid_ids[b])
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
                color=_darker(device_color(s_dev)), gid="permute-arrow", zorder=3,
            )
            arrow.set_label(f"dev {s_dev} -> dev {d_dev}")
            ax.add_patch(arrow)
    margin = 0.9 if any(abs(t - f) > 1 for f, t in pairs) else 0.2  # room for the arcs of long jumps
    ax.set_xlim(-margin if along_rows else -0.2, cols + (margin if along_rows else 0.2))
    ax.set_ylim(rows + (0.2 if along_rows else margin), -0.2 if along_rows else -margin)
    ax.set_aspect("equal")
    ax.set_xticks(np.arange(cols) + 0.5, [str(j) for j in range(cols)])
    ax.set_yticks(np.arange(rows) + 0.5, [str(i) for i in range(rows)] if ids.ndim > 1 else [""])
    ax.tick_params(length=0, labelsize=8)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    row_name = names[row_axis] if row_axis is not None else None
    ax.set_xlabel(f"{names[col_axis]} ({cols}) \u2192", fontsize=9)
    if row_name is not None:
        ax.set_ylabel(f"{row_name} ({rows}) \u2193", fontsize=9)
    head = f"ppermute over {axis_name!r}: " + ", ".join(f"{s}\u2192{t}" for s, t in pairs)
    fig.suptitle(f"{title}\n{head}" if title else head, fontsize=10)
    fig.tight_layout()
    _finish_blocks(fig)
    plt.close(fig)
    return fig


def _darker(color: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
    return (color[0] * 0.7, color[1] * 0.7, color[2] * 0.7, 1.0)


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
        raise ValueError(
            f"pair {bad[0]} leaves axis {axis_name!r}, whose indices are 0..{size - 1}: "
            f"ppermute pairs are positions along the axis, not device ids"
        )
    for k, what in ((0, "source"), (1, "destination")):
        seen = [p[k] for p in pairs]
        dup = next((v for v in seen if seen.count(v) > 1), None)
        if dup is not None:
            raise ValueError(f"index {dup} is a {what} twice in perm: ppermute needs each {what} at most once")
    return pairs


def tile_labels(fig: Figure) -> list[str]:
    """The label of every block drawn in ``fig``, panel by panel: what a reader sees.

    A label is lines joined by ``'\\n'``, always in this order:

    1. the devices holding the block: ``'dev 3'``, ``'dev 0,2,4,6'``, ``'dev 0-7'``;
    2. the block's shape: ``'(32, 256)'``;
    3. its bytes, unless drawn with ``show_bytes=False``: ``'32.0 KiB'``;
    4. only for a block of an uneven layout: ``'padded to (3)'``;
    5. only for a replicated block (held by k > 1 devices): ``'k copies'``, e.g. ``'4 copies'``;
    6. only with ``contents=``: what the block holds (one line, or ``'dev i: ...'`` per copy when copies differ);
    7. only in :func:`draw_matmul`: the block's role for the chosen device
       (``'held by dev 0'``, ``'fetched from dev 1'``, ``"dev 0's block: partial sum over 'model'"``).

    So ``'dev 0,1\\n(32, 512)\\n64.0 KiB\\n2 copies'`` is a (32, 512) block with a copy
    on devices 0 and 1, and ``label.split('\\n')[0]`` is always the devices.
    """
    if not isinstance(fig, Figure):
        raise TypeError(f"tile_labels reads a Figure returned by draw_sharding(s); got {type(fig).__name__}")
    return [t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid() == "tile-label"]


def mesh_labels(fig: Figure) -> list[list[list[int]]]:
    """The device ids a ``draw_mesh`` figure shows: one grid (rows of ids) per panel.

    ``mesh_labels(draw_mesh(mesh))[0]`` equals ``mesh.device_ids.tolist()``
    for a 2-D mesh, so a notebook can assert what its picture shows.
    """
    if not isinstance(fig, Figure):
        raise TypeError(f"mesh_labels reads a Figure returned by draw_mesh; got {type(fig).__name__}")
    grids = []
    for ax in fig.axes:
        cells = [(t.get_position(), int(t.get_text())) for t in ax.texts if t.get_gid() == "device-label"]
        if not cells:
            continue
        rows: dict[float, list[tuple[float, int]]] = {}
        for (x, y), dev in cells:
            rows.setdefault(y, []).append((x, dev))
        grids.append([[dev for _, dev in sorted(row)] for _, row in sorted(rows.items())])
    if not grids:
        raise ValueError("this figure has no devices drawn: pass a Figure from draw_mesh")
    return grids
