"""Pictures of shardings and meshes, drawn with matplotlib.

The course's replacement for ``jax.debug.visualize_array_sharding``, which
stops at 2-D arrays, needs ``rich`` and returns nothing a test can check.
Here every function returns a ``matplotlib.figure.Figure``:

- each block of the array is one rectangle whose ``gid`` is ``"tile"``,
  sized in proportion to the data it holds, striped with the colours of
  every device that holds a copy, and labelled with those devices and the
  block's shape (and bytes);
- padding that XLA adds to an uneven dimension is hatched, outside the array;
- a device has the same colour in every figure (:func:`device_color`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .inspecting import format_bytes
from .layout import Tile, as_layout, tiles, type_string


def _show_figures_inline() -> None:
    """In a Jupyter kernel, make a returned Figure display as a picture.

    A kernel started with MPLBACKEND=Agg (common in CI and some launchers) would
    otherwise print '<Figure size ...>' instead of drawing the course's figures.
    """
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - the course always has IPython
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "kernel") and "inline" not in matplotlib.get_backend():
        shell.run_line_magic("matplotlib", "inline")


_show_figures_inline()

__all__ = [
    "device_color",
    "device_label",
    "draw_mesh",
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


def _panel_inches(shape: tuple[int, ...], panel_tiles: list[Tile], r: int | None, c: int | None) -> tuple[float, float]:
    """Panel size: true proportions where labels fit, stretched where blocks would be too thin."""
    n_rows = len({(t.start[r], t.stop[r]) for t in panel_tiles}) if r is not None else 1
    n_cols = len({(t.start[c], t.stop[c]) for t in panel_tiles}) if c is not None else 1
    width = min(max(1.15 * n_cols, 3.6), 9.0)
    if r is None:
        return width, 0.9
    true_height = width * shape[r] / max(shape[c] if c is not None else 1, 1)
    return width, min(max(true_height, 0.62 * n_rows, 0.9), 7.0)


def _draw_tiles(
    ax: Axes,
    shape: tuple[int, ...],
    panel_tiles: list[Tile],
    r: int | None,
    c: int | None,
    itemsize: int,
    show_bytes: bool,
    fontsize: float,
) -> None:
    """Draw one 2-D view: the array spans [0, 1] x [0, 1], row 0 at the top."""
    nr = shape[r] if r is not None else 1
    nc = shape[c] if c is not None else 1
    width, height = 1.0, 1.0

    def span(t: Tile, d: int | None, n: int, extent: float) -> tuple[float, float, float]:
        if d is None:
            return 0.0, extent, 0.0
        a, b, p = t.start[d], t.stop[d], t.padded[d]
        unit = extent / max(n, 1)
        return a * unit, (b - a) * unit, max(p - (b - a), 0) * unit

    pad_right = pad_down = 0.0
    for t in panel_tiles:
        x0, w, xpad = span(t, c, nc, width)
        y0, h, ypad = span(t, r, nr, height)
        k = len(t.devices)
        for i, dev in enumerate(t.devices):  # stripes: one per device holding a copy
            ax.add_patch(Rectangle((x0 + i * w / k, y0), w / k, h, facecolor=device_color(dev),
                                   alpha=0.8, linewidth=0))
        if xpad or ypad:  # padding XLA allocates beyond the real data
            if xpad:
                ax.add_patch(Rectangle((x0 + w, y0), xpad, h + ypad, fill=False, hatch="///",
                                       edgecolor="0.45", linewidth=0.5, gid="padding"))
            if ypad:
                ax.add_patch(Rectangle((x0, y0 + h), w, ypad, fill=False, hatch="///",
                                       edgecolor="0.45", linewidth=0.5, gid="padding"))
            pad_right, pad_down = max(pad_right, x0 + w + xpad - width), max(pad_down, y0 + h + ypad - height)
        ax.add_patch(Rectangle((x0, y0), w, h, fill=False, edgecolor="black", linewidth=1.0, gid="tile"))
        lines = [device_label(t.devices), str(t.shape).replace(",)", ")")]
        if show_bytes:
            lines.append(format_bytes(math.prod(t.shape) * itemsize))
        if t.is_uneven:
            lines.append("padded to " + str(t.padded).replace(",)", ")"))
        cx, cy = x0 + (w + xpad) / 2, y0 + (h + ypad) / 2  # uneven blocks: centred over data + padding
        ax.text(cx, cy, "\n".join(lines), ha="center", va="center", fontsize=fontsize, gid="tile-label",
                bbox=dict(boxstyle="round,pad=0.15", facecolor="white", alpha=0.75, linewidth=0))
    ax.add_patch(Rectangle((0, 0), width, height, fill=False, edgecolor="black", linewidth=2.0, gid="array"))
    ax.set_xlim(-0.01, width + pad_right + 0.01)
    ax.set_ylim(height + pad_down + 0.01, -0.01)
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    if c is not None:
        ax.set_xlabel(f"dim {c} ({nc})", fontsize=fontsize + 1)
    if r is not None:
        ax.set_ylabel(f"dim {r} ({nr})", fontsize=fontsize + 1)


def _fontsize(n_tiles: int) -> float:
    return 9.0 if n_tiles <= 4 else 8.0 if n_tiles <= 8 else 6.5 if n_tiles <= 16 else 5.0


def draw_sharding(
    x: Any,
    sharding: Any = None,
    *,
    mesh: Any = None,
    dims: Sequence[int] | None = None,
    title: str | None = None,
    show_bytes: bool = True,
    max_panels: int = 16,
) -> Figure:
    """Draw where every block of an array lives.

    ``x`` is a sharded ``jax.Array``, a ``jax.ShapeDtypeStruct``, or a shape
    such as ``(128, 512)`` together with ``sharding`` (a ``NamedSharding``, or
    a ``PartitionSpec`` with ``mesh=``). 1-D arrays are drawn as a row, 2-D as
    a grid; for N-D arrays ``dims`` picks the two dimensions drawn (default:
    the last two) and the blocks of the other dimensions become a grid of
    panels. The title gives the course's type notation and the spec.
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
    ncols = min(len(panels), 4)
    nrows = math.ceil(len(panels) / ncols)
    pw, ph = _panel_inches(shape, panels[0][1], r, c)
    if ncols > 1:
        pw, ph = pw * 0.75, ph * 0.75
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(max(pw * ncols, 5.0), ph * nrows + 0.5 * nrows + 0.8), squeeze=False
    )
    itemsize = np.dtype(dtype).itemsize
    for ax, (label, panel_tiles) in zip(axes.flat, panels, strict=False):
        _draw_tiles(ax, shape, panel_tiles, r, c, itemsize, show_bytes, _fontsize(len(panel_tiles)))
        if label:
            ax.set_title(label, fontsize=9)
    for ax in list(axes.flat)[len(panels) :]:
        ax.remove()
    head = title if title is not None else type_string(shape, sharding, dtype=dtype)
    fig.suptitle(f"{head}\n{_spec_text(sharding)} on {_mesh_text(sharding)}", fontsize=10)
    fig.tight_layout()
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


def draw_shardings(arrays: Any, *, ncols: int = 3, title: str | None = None, show_bytes: bool = True) -> Figure:
    """Draw several arrays side by side, one panel each, named and typed.

    ``arrays`` is a dict of name -> array (or name -> (shape, sharding)), or
    any pytree of arrays such as ``nnx.state(model)``: the panel titles are the
    pytree paths, e.g. ``linear1/kernel``. N-D arrays show their last two
    dimensions (use :func:`draw_sharding` for the full picture).
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
        views.append((name, shape, dtype, sh, r, c, _panels(shape, tiles(shape, sh), r, c)[0]))
    sizes = [_panel_inches(shape, panel[1], r, c) for _, shape, _, _, r, c, panel in views]
    aspects = [min(max(h / w, 0.22), 1.0) for w, h in sizes]
    cell_w = max(3.8, *(w * 0.8 for w, _ in sizes))
    cell_h = cell_w * max(aspects) + 1.0
    fig, axes = plt.subplots(nrows, ncols, figsize=(cell_w * ncols, cell_h * nrows + 0.4), squeeze=False)
    for ax, aspect, (name, shape, dtype, sh, r, c, (panel_label, panel_tiles)) in zip(
        axes.flat, aspects, views, strict=False
    ):
        ax.set_box_aspect(aspect)  # each panel keeps its own proportions (a bias stays a thin strip)
        _draw_tiles(ax, shape, panel_tiles, r, c, np.dtype(dtype).itemsize, show_bytes,
                    _fontsize(len(panel_tiles)))
        extra = f"\n(first block of {panel_label.split(' = ')[0]})" if panel_label else ""
        ax.set_title(f"{name}\n{type_string(shape, sh, dtype=dtype)}{extra}", fontsize=9)
    for ax in list(axes.flat)[len(items) :]:
        ax.remove()
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    plt.close(fig)
    return fig


def tile_labels(fig: Figure) -> list[str]:
    """The label of every block drawn in ``fig``, panel by panel: what a reader sees.

    Each label reads like ``'dev 0,1\n(32, 512)\n64.0 KiB'``; notebooks and
    tests use this to assert what a picture shows.
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
