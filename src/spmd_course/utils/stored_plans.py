"""The planner's stored rankings (``data/plans/plans.json``, written by ``make plans``), read and tabled.

Why: each plan the planner times is a full-size ahead-of-time TPU compile, tens of seconds of CPU, so a
notebook compiles one lesson live and reads the rest from this file. ``tools/plans.py`` writes it (never by
hand); each entry names the command, the jax and libtpu versions and the compiler effort that made it, so a
stored figure is always labelled as stored. :func:`published_table` is the table of MaxText's published
plans held against the planner's ranking that ``make test-slow`` prints and notebook 26 shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .train_step import DecoderConfig

__all__ = ["LLAMA2_70B", "LLAMA3_8B", "STORE", "load", "provenance", "published_table"]

STORE = Path(__file__).resolve().parents[3] / "data" / "plans" / "plans.json"  # the clone's data/

LLAMA3_8B = DecoderConfig(num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8, head_dim=128, d_ff=14336,
                          vocab_size=128_256, seq_len=2048)
"""Llama 3 8B's shape (8,030,261,248 parameters) with 2,048-token sequences: the 8B-class model planned."""
LLAMA2_70B = DecoderConfig(num_layers=80, d_model=8192, num_heads=64, num_kv_heads=8, head_dim=128, d_ff=28672,
                           vocab_size=32_000, seq_len=4096)
"""Llama 2 70B's shape with 4,096-token sequences: the 70B-class model planned."""


def load(path: Path = STORE) -> dict[str, Any]:
    """The stored rankings: ``{"course": {key: record}, "published": {row name: entry}, "not_run": {...}}``;
    a FileNotFoundError naming ``make plans`` if the file is missing."""
    if not Path(path).exists():
        raise FileNotFoundError(f"no stored plans at {path}: run `make plans` (full-size TPU compiles, about "
                                "20 minutes of CPU)")
    data = json.loads(Path(path).read_text())
    missing = {"course", "published", "not_run"} - set(data)
    if missing:
        raise ValueError(f"{path} lacks {sorted(missing)}: it was not written by tools/plans.py; run `make plans`")
    return data


def provenance(entry: dict[str, Any]) -> str:
    """One line saying where a stored entry came from: its command, versions, effort and CPU time."""
    v = entry["versions"]
    return (f"stored: `{entry['command']}`, jax {v['jax']}, libtpu {v['libtpu']}, compiler effort {v['effort']!r}, "
            f"{entry['cpu_seconds']} s of CPU")


def published_table(data: dict[str, Any]) -> str:
    """Each published MaxText row against the planner given only its model, slice and global batch: the
    published plan's place in the ranking (among plans that fit, and among all), the planner's top plan, its
    MFU under the row's own FLOP formula beside the published MFU, and the planner's reason. Rows not run
    are listed with the reason."""
    head = (f"{'row':<21} {'published plan':<20} {'place':>8}  {'planner top plan':<28} {'MFU top':>8} "
            f"{'published':>9}")
    lines = [head]
    for name, e in data["published"].items():
        _, f, t = e["published_mesh"]
        mine = f"1x{f}x{t} {e['published_remat']} b{e['published_per_device_batch']}"
        fits = sum(p["status"] == "fits" for p in e["plans"])
        place = f"{e['published_fitting_place']} of {fits}" if e["published_fitting_place"] else e["published_status"]
        mfu = "" if e["top_mfu_row_formula"] is None else f"{e['top_mfu_row_formula']:.1%}"
        lines.append(f"{name:<21} {mine:<20} {place:>8}  {e['top'] or 'none fits':<28} {mfu:>8} "
                     f"{e['published_mfu']:>9.1%}")
        lines.append(f"{'':<21} {e['reason']}")
    for name, why in data["not_run"].items():
        lines.append(f"{name:<21} not run: {why}")
    return "\n".join(lines)
