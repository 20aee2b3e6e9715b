"""Pictures of a step's estimated time (:func:`utils.timing.estimate_step`): a timeline, a roofline, its terms.

A timeline has a time axis: one lane for the chip's own work and one lane for each set of mesh axes a
collective runs over (then the host link, and the TPU's HBM-VMEM prefetches), each op a box from its
estimated start to its end. Colour means device everywhere in the course, and no device is meant here, so
these pictures use greys, hatching and words only:

- a matmul is mid-grey in the forward pass and dark grey in the backward pass (its ``op_name`` holds
  ``transpose(``), an op bound by HBM bytes is light grey;
- a transfer is a white box, hatched where it runs beside other work (hidden), filled black where the step
  waits for it (exposed), so the cost of communication is the black you see;
- a loop's body is drawn once, its first trip, in a dotted frame marked with its trip count (x32); the rest
  of its trips are one grey band, because drawing 32 identical layers teaches nothing more than one.

The roofline puts every op that reads HBM at its arithmetic intensity (FLOPs per HBM byte) and the FLOP/s it
attains, under the chip's two roofs (HBM bandwidth, peak FLOP/s): left of the ridge an op waits on memory.

The terms (:func:`draw_step_terms`) put several estimates side by side, one stacked bar each on one seconds
axis: matmul FLOPs, HBM beyond them, exposed transfers, in the timeline's greys, so strategies compare at a glance.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from .drawing import _bare, _finish
from .inspecting import format_bytes

__all__ = ["draw_plans", "draw_roofline", "draw_step_terms", "draw_timeline", "op_label"]

_FORWARD, _BACKWARD, _MEMORY = "0.55", "0.25", "0.85"
_HIDDEN_HATCH = "////"
_SHORT = {"all-gather": "AG", "all-reduce": "AR", "reduce-scatter": "RS", "all-to-all": "A2A",
          "collective-permute": "CP", "to host": "to host", "from host": "from host", "prefetch": "prefetch"}
_LANE_NAMES = {"compute": "chip: compute", "host": "host link (PCIe)", "hbm": "HBM \u2194 VMEM", "dcn": "DCN"}
# Parts of an op_name that say how JAX transformed the code, not where in the model it came from.
_NOISE = re.compile(r"^(jit|pjit|jvp|transpose|vmap|remat|checkpoint|rematted_computation|while|body|cond|scan|"
                    r"closed_call|core_call|custom_jvp_call|custom_vjp_call|shard_map|named)(\(.*\))?$")
_PRIMITIVE = re.compile(r"^[a-z_]+(\[.*\])?$")


def _unit(seconds: float) -> tuple[float, str]:
    """A scale and unit that keep the time axis in readable numbers."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "\u00b5s")):
        if seconds >= scale:
            return scale, unit
    return 1e-9, "ns"


def op_label(op_name: str) -> str:
    """A short name for an op, from its ``op_name`` metadata: the model's own name for it, and fwd or bwd.

    ``jit(step)/jvp(Block)/w1/dot_general`` -> ``w1 fwd``; ``jit(step)/transpose(jvp(Block))/w2/dot_general``
    -> ``w2 bwd`` (JAX writes the backward pass as the transpose of the forward one). Where the path names
    nothing but transformations and primitives, the primitive is the name (``dot_general fwd``).
    """
    if not isinstance(op_name, str):
        raise TypeError(f"op_name is the metadata string of an HLO op, such as 'jit(f)/w1/dot_general'; got "
                        f"{type(op_name).__name__}")
    parts = [p for p in op_name.split("/") if p]
    direction = "bwd" if "transpose(" in op_name else "fwd"
    named = [p for p in parts if not _NOISE.match(p) and not _PRIMITIVE.match(p)]
    inner = [re.sub(r"^\w+\((.*)\)$", r"\1", p) for p in parts if _NOISE.match(p)]
    inner = [p for p in inner if p and not _NOISE.match(p) and not _PRIMITIVE.match(p)]
    name = (named or inner or [parts[-1] if parts else "op"])[-1]
    return f"{name} {direction}"


def _lanes(ops: Sequence[Any]) -> list[str]:
    """The lanes in the order they are drawn: the chip's work first, then transfers as they first appear."""
    seen = dict.fromkeys(["compute"] + [op.lane for op in ops if op.lane != "compute"])
    return list(seen)


def _lane_title(lane: str) -> str:
    if lane in _LANE_NAMES:
        return _LANE_NAMES[lane]
    axes = lane.split("+")
    return "over " + " \u00d7 ".join(_LANE_NAMES.get(a, repr(a)) for a in axes)


def _loops(ops: Sequence[Any], total: float) -> list[tuple[int, float, float, float]]:
    """Each loop in the timeline: (trips, first trip's start, its end, the loop's end)."""
    found = []
    for name in dict.fromkeys(op.loop for op in ops if op.loop):
        inside = [k for k, op in enumerate(ops) if op.loop == name]
        outer = ops[inside[0]].trips or 1
        later = [op.start for op in ops[inside[-1] + 1:] if op.loop != name]
        start = min(ops[k].start for k in inside)
        end = max(ops[k].end for k in inside)
        found.append((int(outer), start, end, max(end, min(later, default=total))))
    return found


def draw_timeline(estimate: Any, *, title: str | None = None, window: tuple[float, float] | None = None,
                  label_min: float = 0.04) -> Figure:
    """Draw one step as :func:`utils.timing.estimate_step` times it: lanes against a time axis.

    ``window``: ``(start, end)`` in seconds to zoom on part of the step (by default all of it);
    ``label_min``: a box narrower than this share of the window gets no label (it would not fit). Raises a
    TypeError for anything but an estimate, and a ValueError for an empty or inverted window.
    """
    ops = getattr(estimate, "timeline", None)
    if not isinstance(ops, tuple | list) or not hasattr(estimate, "seconds"):
        raise TypeError("draw_timeline draws what utils.timing.estimate_step(compiled, mesh) returns; got "
                        f"{type(estimate).__name__}")
    total = float(estimate.seconds)
    if not ops or total <= 0:
        raise ValueError("the estimate has no timed op: was the program empty?")
    t0, t1 = window if window is not None else (0.0, total)
    if not t1 > t0 >= 0:
        raise ValueError(f"window is (start, end) in seconds with 0 <= start < end; got {window!r}")
    scale, unit = _unit(t1 - t0)
    lanes = _lanes(ops)
    row = {lane: k for k, lane in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.55 * len(lanes)))
    width = t1 - t0

    def box(x0: float, x1: float, y: float, h: float, **style: Any) -> Rectangle | None:
        a, b = max(x0, t0), min(x1, t1)
        if b <= a:
            return None
        style = {"linewidth": 0.6, "edgecolor": "black", **style}
        patch = Rectangle(((a - t0) / scale, y), (b - a) / scale, h, **style)
        ax.add_patch(patch)
        return patch

    for trips, start, end, stop in _loops(ops, total):
        box(start, end, -0.5, len(lanes), facecolor="none", linestyle=":", gid="loop-trip")
        box(end, stop, -0.5, len(lanes), facecolor="0.93", linewidth=0, gid="loop-rest")
        if min(stop, t1) > max(start, t0):
            ax.text((max(start, t0) - t0) / scale, -0.55, f"\u00d7{trips}", ha="left", va="bottom", fontsize=7,
                    gid="loop-label")
    for op in ops:
        y = row[op.lane] - 0.35
        if op.lane == "compute":
            backward = "transpose(" in op.op_name
            face = _MEMORY if op.kind == "memory" else _BACKWARD if backward else _FORWARD
            patch = box(op.start, op.end, y, 0.7, facecolor=face, gid=f"op-{op.kind}")
            text = op_label(op.op_name) if op.kind == "compute" and op.op_name else ""
            color = "white" if face == _BACKWARD else "black"
        else:
            hidden_end = op.end - op.exposed
            patch = box(op.start, hidden_end, y, 0.7, facecolor="white", hatch=_HIDDEN_HATCH, gid="transfer-hidden")
            exposed = box(hidden_end, op.end, y, 0.7, facecolor="black", gid="transfer-exposed")
            patch = patch or exposed
            text = f"{_SHORT.get(op.kind, op.kind)} {format_bytes(op.bytes)}"
            color = "black"
        if patch is not None and text and (min(op.end, t1) - max(op.start, t0)) >= label_min * width:
            ax.text((max(op.start, t0) + min(op.end, t1)) / 2 / scale - t0 / scale, row[op.lane], text,
                    ha="center", va="center", fontsize=7, color=color, clip_on=True, gid="op-label")
    ax.set_xlim(0, width / scale)
    ax.set_ylim(len(lanes) - 0.4, -0.9)
    ax.set_yticks(range(len(lanes)), [_lane_title(lane) for lane in lanes], fontsize=8)
    ax.set_xlabel(f"time in the step ({unit}{', from ' + format(t0 / scale, '.3g') if t0 else ''}), estimated at "
                  "the chip's published peak rates", fontsize=8)
    _bare(ax, ("top", "right"))
    keys = [("matmul, forward pass", _FORWARD, ""), ("matmul, backward pass", _BACKWARD, ""),
            ("bound by HBM bytes", _MEMORY, ""), ("transfer beside other work (hidden)", "white", _HIDDEN_HATCH),
            ("transfer the step waits for (exposed)", "black", "")]
    if any(op.loop for op in ops):
        keys += [("\u00d7N: a loop's first trip (dotted), then its other trips (grey band)", "0.93", "")]
    ax.legend(handles=[Patch(facecolor=c, edgecolor="black", hatch=h, label=t) for t, c, h in keys],
              loc="upper center", bbox_to_anchor=(0.5, -0.5 if len(lanes) < 3 else -0.32), ncol=3, fontsize=7,
              frameon=False)
    exposed = estimate.comm_exposed + getattr(estimate, "host_exposed", 0.0)
    fig.suptitle(title or f"one step on a {estimate.chip.name} chip, estimated {total / _unit(total)[0]:.3g} "
                 f"{_unit(total)[1]}: {estimate.compute / total:.0%} matmul FLOPs, {estimate.memory / total:.0%} "
                 f"waiting on HBM, {exposed / total:.0%} waiting on transfers", fontsize=9)
    return _finish(fig)


def draw_roofline(estimate: Any, *, title: str | None = None) -> Figure:
    """Draw the chip's roofline and every op of the step on it (log-log), the whole step as a star.

    x: arithmetic intensity, FLOPs per byte of HBM traffic; y: FLOP/s attained. An op is a dot whose area
    grows with the time it takes in the step (all its trips). The ridge, peak / HBM bandwidth, is marked:
    an op left of it is bound by HBM, right of it by the matmul units. The star is the whole step, its
    FLOPs over its HBM bytes at its FLOPs over its estimated seconds: below the roof by what the step
    loses to memory-bound ops and exposed transfers.
    """
    ops = getattr(estimate, "timeline", None)
    chip = getattr(estimate, "chip", None)
    if not isinstance(ops, tuple | list) or chip is None:
        raise TypeError("draw_roofline draws what utils.timing.estimate_step(compiled, mesh) returns; got "
                        f"{type(estimate).__name__}")
    points = [op for op in ops if op.lane == "compute" and op.flops > 0 and op.bytes > 0 and op.seconds > 0]
    if not points or estimate.hbm_bytes <= 0:
        raise ValueError("the step has no op with both FLOPs and HBM bytes: nothing to place on a roofline")
    ridge = chip.peak_flops / chip.hbm_bandwidth
    intensity = [op.flops / op.bytes for op in points]
    lo = min(min(intensity), ridge) / 4
    hi = max(max(intensity), ridge) * 4
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    xs = [lo, ridge, hi]
    ax.plot(xs, [min(chip.peak_flops, x * chip.hbm_bandwidth) for x in xs], color="black", linewidth=1.2,
            gid="roof")
    ax.axvline(ridge, color="0.5", linestyle=":", linewidth=0.8)
    ax.text(ridge, chip.peak_flops * 1.15, f"ridge {ridge:.0f} FLOPs/byte", ha="center", fontsize=7)
    weight = [op.seconds * max(op.trips, 1) for op in points]
    most = max(weight)
    for op, x, w in zip(points, intensity, weight, strict=True):
        face = _BACKWARD if "transpose(" in op.op_name else _FORWARD
        ax.scatter([x], [op.flops / op.seconds], s=12 + 160 * math.sqrt(w / most), facecolor=face,
                   edgecolor="black", linewidth=0.4, gid="op", zorder=3)
    step_x = estimate.flops / estimate.hbm_bytes
    ax.scatter([step_x], [estimate.flops / estimate.seconds], marker="*", s=180, facecolor="white",
               edgecolor="black", gid="step", zorder=4)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo * chip.hbm_bandwidth / 2, chip.peak_flops * 2))
    ax.set_xlabel("arithmetic intensity (FLOPs per byte of HBM traffic)", fontsize=8)
    ax.set_ylabel("FLOP/s attained (estimated)", fontsize=8)
    ax.legend(handles=[Patch(facecolor=_FORWARD, edgecolor="black", label="op, forward pass"),
                       Patch(facecolor=_BACKWARD, edgecolor="black", label="op, backward pass"),
                       plt.Line2D([], [], marker="*", color="white", markeredgecolor="black", markersize=10,
                                  label="the whole step")], fontsize=7, loc="lower right")
    fig.suptitle(title or f"roofline of a {chip.name} chip: {chip.peak_flops / 1e12:.0f} TFLOP/s, "
                 f"{chip.hbm_bandwidth / 1e9:.0f} GB/s of HBM", fontsize=9)
    return _finish(fig)


# The terms of StepEstimate.seconds, in the order they are stacked: (attribute, label, face, hatch).
_TERMS = (("compute", "matmul FLOPs / peak", _FORWARD, ""),
          ("memory", "bound by HBM bytes, beyond FLOPs", _MEMORY, ""),
          ("comm_exposed", "transfers the step waits for (exposed)", "black", ""),
          ("host_exposed", "host transfers, exposed", "white", "...."))


def draw_step_terms(estimates: Mapping[str, Any], *, scale: float = 1.0, title: str | None = None) -> Figure:
    """Draw one stacked bar per estimate on one seconds axis: the terms that add up to its step.

    ``estimates``: a label (a strategy's name) for each :func:`utils.timing.estimate_step` result, drawn top to
    bottom in the mapping's order. ``scale`` multiplies every term, for example by the layer count when each
    estimate times one layer. A bar's segments are ``compute``, ``memory``, ``comm_exposed`` and
    ``host_exposed``, whose sum is the estimate's ``seconds``, so a bar's length is the estimated step. Hidden
    transfers cost the step nothing, so they are drawn after the bar's end, hatched, where any estimate has
    some. Raises a TypeError for anything but a mapping of estimates and a ValueError for no estimate or a
    scale that is not positive.
    """
    if not isinstance(estimates, Mapping):
        raise TypeError("draw_step_terms takes {label: estimate_step(compiled, mesh)}, a dict; got "
                        f"{type(estimates).__name__}")
    if not estimates:
        raise ValueError("no estimate to draw: pass at least one {label: estimate_step(...)}")
    for label, e in estimates.items():
        if not all(hasattr(e, name) for name, *_ in _TERMS) or not hasattr(e, "comm_hidden"):
            raise TypeError(f"estimates[{label!r}] is a {type(e).__name__}, not what utils.timing.estimate_step "
                            "returns")
    if isinstance(scale, bool) or not (isinstance(scale, int | float) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale multiplies every term (the layer count, say): a positive number; got {scale!r}")
    longest = max((e.seconds + e.comm_hidden) * scale for e in estimates.values())
    unit_scale, unit = _unit(longest)
    legend_rows = 3  # at most five keys, two a row
    height = 1.1 + 0.45 * len(estimates) + 0.2 * legend_rows
    fig, ax = plt.subplots(figsize=(7.5, height))
    shown: dict[str, Patch] = {}
    for row, e in enumerate(estimates.values()):
        left = 0.0
        for name, text, face, hatch in _TERMS:
            width = getattr(e, name) * scale / unit_scale
            if width > 0:
                ax.barh(row, width, left=left, height=0.6, facecolor=face, hatch=hatch, edgecolor="black",
                        linewidth=0.6, gid=f"term-{name}")
                shown.setdefault(text, Patch(facecolor=face, hatch=hatch, edgecolor="black", label=text))
            left += width
        ax.text(left, row, f" {left:.3g} {unit}", va="center", ha="left", fontsize=7, gid="step-total")
        hidden = e.comm_hidden * scale / unit_scale
        if hidden > 0:
            ax.barh(row, hidden, left=left, height=0.3, facecolor="white", hatch=_HIDDEN_HATCH, edgecolor="0.4",
                    linewidth=0.6, gid="term-comm_hidden")
            text = "transfers beside other work (hidden: not in the step)"
            shown.setdefault(text, Patch(facecolor="white", hatch=_HIDDEN_HATCH, edgecolor="0.4", label=text))
    ax.set_yticks(range(len(estimates)), list(estimates), fontsize=8)
    ax.set_ylim(len(estimates) - 0.4, -0.6)
    ax.set_xlim(0, longest / unit_scale * 1.15)
    times = f", each estimate x {scale:g}" if scale != 1 else ""
    ax.set_xlabel(f"step time ({unit}{times}), estimated at the chip's published peak rates", fontsize=8)
    _bare(ax, ("top", "right"))
    fig.legend(handles=list(shown.values()), loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle(title or "what each estimated step is made of", fontsize=9)
    return _finish(fig, rect=(0, (0.2 * legend_rows + 0.05) / height, 1, 1))


# How each kind of plan is marked on draw_plans' picture: (marker, face, edge, what it means).
_PLAN_MARKS = {
    "fits": ("o", "0.35", "black", "fits: the compiler's HBM, the estimated step"),
    "refused by the compiler": ("X", "black", "black", "refused by the compiler: the HBM it asked for"),
    "refused by the formula": ("X", "white", "black", "refused by formula: parameters and moments alone"),
    "pruned": ("^", "white", "black", "pruned: the formula's HBM"),
    "not compiled": ("o", "white", "0.55", "not compiled, skipped or no layout: the formula"),
}


def _plan_kind(p: dict) -> str:
    if p["status"] == "refused":
        return "refused by the compiler" if p["compiled"] else "refused by the formula"
    return p["status"] if p["status"] in ("fits", "pruned") else "not compiled"


def draw_plans(ranking: Any, *, title: str | None = None) -> Figure:
    """Every candidate of a planner search at its HBM per chip against its step time, the chip's HBM a line.

    ``ranking``: a :class:`utils.planner.Ranking` or its :func:`utils.planner.record` (what ``data/plans``
    stores). A plan the compiler timed sits at its estimated step and the compiler's HBM (plus the
    accumulator); every other at the paper guess that ordered the compiles (:func:`utils.planner.guess_seconds`)
    and the formula's HBM, or for a compiler's refusal the HBM it asked for. Markers and greys say which
    (colour means device in the course); the winner is a star. Both axes are logarithmic: state that does not
    fit is many times the chip.
    """
    if not isinstance(ranking, dict):
        from .planner import Ranking, record

        if not isinstance(ranking, Ranking):
            raise TypeError("draw_plans draws a utils.planner.Ranking (plan(...)) or its record(); got "
                            f"{type(ranking).__name__}")
        ranking = record(ranking)
    plans = ranking.get("plans")
    if not plans:
        raise ValueError("the ranking holds no plan to draw")
    gib = 2**30
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    best = next((p for p in plans if p["status"] == "fits"), None)
    for kind, (marker, face, edge, label) in _PLAN_MARKS.items():
        mine = [p for p in plans if _plan_kind(p) == kind and p is not best]
        if not mine:
            continue
        xs = [p["step_seconds"] if kind == "fits" else p["formula_seconds"] for p in mine]
        ys = [((p["hbm_bytes"] or 0) + p["accumulator_bytes"] if p["compiled"] else p["formula_bytes"]) / gib
              for p in mine]
        ax.scatter(xs, ys, marker=marker, s=36, facecolor=face, edgecolor=edge, linewidth=0.8, gid=kind,
                   label=label, zorder=3)
    if best is not None:
        ax.scatter([best["step_seconds"]], [(best["hbm_bytes"] + best["accumulator_bytes"]) / gib], marker="*",
                   s=220, facecolor="white", edgecolor="black", linewidth=1.0, gid="best", zorder=4,
                   label=f"the top plan: {best['label']}")
    hbm = ranking["hbm_bytes"] / gib
    ax.axhline(hbm, color="black", linestyle="--", linewidth=1.0, gid="hbm")
    ax.text(0.99, hbm, f" {ranking['chip']} HBM {hbm:.2f} GiB", transform=ax.get_yaxis_transform(), ha="right",
            va="bottom", fontsize=7)
    ax.set(xscale="log", yscale="log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 2, 3, 4 s rather than 2 x 10^0
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    ax.set_xlabel(f"step time, seconds (timed: estimate_step at effort {ranking['effort']!r}; others: paper guess)",
                  fontsize=8)
    ax.set_ylabel("HBM per chip, GiB", fontsize=8)
    ax.legend(fontsize=7, loc="upper right", framealpha=0.9)
    n = ranking["params"]
    size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
    fig.suptitle(title or f"{len(plans)} plans for {size} parameters on {ranking['num_slices']} x "
                 f"{ranking['topology']}", fontsize=9)
    return _finish(fig)
