"""Store the planner's rankings that notebooks 25 and 26 show but cannot afford to compute: ``make plans``.

Every plan the planner times is a full-size ahead-of-time TPU compile (about 50 s of CPU each at the least
effort, O0, for an 8B model on 256 chips), so notebook 25 compiles one lesson live and reads the other tables
from ``data/plans/plans.json``, which this script writes (never by hand). Two kinds of entry:

- ``course``: an 8B-class and a 70B-class Llama-style model, each on a v5e-256 and a v5p-256 slice
  (:data:`COURSE`), searched over every mesh the model divides, at most 10 compiles for the first, 8 for
  the 70B on the v5p and 4 for the others (the compiles are ordered by the planner's paper estimate);
  MaxText's own plan for the 8B model on the v5e-256 compiled alone, and the 70B's remat ``full`` in one
  micro-step on the v5p compiled alone (plans the searches' paper estimate leaves uncompiled);
- ``published``: each of MaxText's published rows (:data:`utils.published_rows.ROWS`): the planner is given
  the row's model, slice and global batch only, and searches two meshes (the published one and one other:
  pure FSDP where the row used tensor parallelism, FSDP x 4-way tensor otherwise) and two remat policies
  (the published one and full or minimal), at most ``PUBLISHED_COMPILES`` compiles. The entry says where the
  published plan lands, the planner's MFU for its own top plan under the row's own FLOP formula (the one its
  published MFU used) beside the published MFU, and why the planner prefers its top plan.

Usage::

    python tools/plans.py                     # everything (about 20 minutes of CPU), written as it goes
    python tools/plans.py --only 8b-v5e       # one entry (a course key or a published row's name)
    python tools/plans.py --check             # recompute, compare with the stored entries, write nothing
    python tools/plans.py --store b.json --only 'v5e 16B 1x v5e-256'   # a second process, its own file
    python tools/plans.py --dry-run --merge b.json                      # then take its entries

Each entry records the command, jax and libtpu versions and the CPU seconds it took. Rows that could not be
run are listed under ``not_run`` with the reason (``--not-run NAME=REASON``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from pathlib import Path

from spmd_course.utils.planner import find, plan, record, versus
from spmd_course.utils.published_rows import ROWS, PublishedRow, maxtext_flops_per_device
from spmd_course.utils.stored_plans import LLAMA2_70B, LLAMA3_8B, STORE
from spmd_course.utils.train_step import REMAT_POLICIES

EFFORT = "O0"  # the least effort: 4-10x cheaper compiles; HBM reads high (nothing in VMEM), times are the roofline
PUBLISHED_COMPILES = 4

COURSE = {  # key -> (model, chip, topology, global batch in tokens, at most this many compiles[, meshes, remats])
    "8b-v5e": (LLAMA3_8B, "v5e", "v5e:16x16", 2**21, 10),  # the notebook's walk-through: the widest search
    # MaxText's plan for this model (pure FSDP, full remat, every sequence of a chip at once), which the search
    # above leaves uncompiled: its paper estimate charges full remat's recomputation, so offload comes first
    "8b-v5e-fsdp": (LLAMA3_8B, "v5e", "v5e:16x16", 2**21, 1, [(1, 256, 1)], ["full"]),
    "70b-v5e": (LLAMA2_70B, "v5e", "v5e:16x16", 2**21, 4),
    "8b-v5p": (LLAMA3_8B, "v5p", "v5p:4x4x8", 2**21, 4),
    # eight compiles: the paper estimate puts the tensor-parallel meshes first, because it counts too little for
    # them on a v5p (0.75-0.93 of the compiled estimate), so the pure-FSDP plans come after them
    "70b-v5p": (LLAMA2_70B, "v5p", "v5p:4x4x8", 2**21, 8),
    # the 70B with MaxText's usual remat, full, and all four sequences of a chip in one micro-step, which the
    # search above leaves uncompiled: what the search's minimal remat in four micro-steps is held against
    "70b-v5p-full": (LLAMA2_70B, "v5p", "v5p:4x4x8", 2**21, 1, [(2, 64, 1)], ["full"]),
}


def versions() -> dict[str, str]:
    import jax

    return {"jax": jax.__version__, "libtpu": importlib.metadata.version("libtpu"), "effort": EFFORT}


def course_entry(key: str) -> dict:
    model, chip, topology, tokens, compiles, *search = COURSE[key]
    meshes, remats = search if search else (None, REMAT_POLICIES)
    ranking = plan(model, chip=chip, topology=topology, global_batch_tokens=tokens, max_compiles=compiles,
                   meshes=meshes, remats=remats, effort=EFFORT)
    return {"max_compiles": compiles, **record(ranking)}


def published_search(row: PublishedRow) -> tuple[list[tuple[int, int, int]], list[str]]:
    """The two meshes and two remats the planner searches for a published row (see the module's text)."""
    (_, fsdp, tensor), _ = row.parallelism.resolve(row.chips // row.num_slices, row.num_slices)
    chips = fsdp * tensor
    other = (1, chips, 1) if tensor > 1 else (1, chips // 4, 4)
    remat = "minimal" if row.remat == "full" else "full"
    return [(1, fsdp, tensor), other], [row.remat, remat]


def published_entry(row: PublishedRow) -> dict:
    meshes, remats = published_search(row)
    tokens = row.per_device_batch * row.model.seq_len * row.chips
    ranking = plan(row.model, chip=row.chip, topology=row.topology, num_slices=row.num_slices,
                   global_batch_tokens=tokens, meshes=meshes, remats=remats, attention=row.attention,
                   max_compiles=PUBLISHED_COMPILES, effort=EFFORT)
    (_, fsdp, tensor) = meshes[0]
    place, published = find(ranking, data=1, fsdp=fsdp, tensor=tensor, remat=row.remat,
                            per_device_batch=row.per_device_batch)
    fitting = [p for p in ranking.plans if p.fits]
    top = fitting[0] if fitting else None
    per_chip = tokens / row.model.seq_len / row.chips
    row_flops = maxtext_flops_per_device(row.model, per_device_batch=per_chip, formula=row.formula,
                                         num_params=row.num_params)
    return {
        "row": row.name, "source": f"{row.source.commit[:7]} ({row.source.date})", "formula": row.formula,
        "published_mesh": [1, fsdp, tensor], "published_remat": row.remat,
        "published_per_device_batch": row.per_device_batch, "published_mfu": row.published_mfu,
        "attention": row.attention, "searched_meshes": meshes, "searched_remats": remats,
        "max_compiles": PUBLISHED_COMPILES,
        "published_place": place, "published_status": published.status,
        "published_fitting_place": next((i for i, p in enumerate(fitting, 1) if p is published), None),
        "top": top.candidate.label() if top else None,
        "top_mfu_row_formula": row_flops / top.step_seconds / (row.peak_tflops * 1e12) if top else None,
        "top_mfu_planner": top.mfu if top else None,
        "reason": versus(ranking, published),
        **record(ranking),
    }


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-6 * max(abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def compare(stored: dict, fresh: dict) -> list[str]:
    """What differs between a stored entry and a recomputed one (its plans, place and top), ignoring the
    provenance fields (command, CPU seconds)."""
    skip = {"command", "cpu_seconds", "versions"}
    fresh = json.loads(json.dumps(fresh))  # as it would be stored: tuples become lists
    return [k for k in sorted(set(stored) | set(fresh)) if k not in skip and not _close(stored.get(k), fresh.get(k))]


def _write(path: Path, store: dict) -> None:
    """Replace the store in one step (a file written as entries finish is never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="a course key or a published row's name")
    parser.add_argument("--check", action="store_true", help="recompute and compare; write nothing")
    parser.add_argument("--not-run", action="append", default=[], metavar="NAME=REASON",
                        help="list a published row as not run, with the reason")
    parser.add_argument("--dry-run", action="store_true", help="compute nothing: only record --not-run reasons")
    parser.add_argument("--merge", type=Path, action="append", default=[],
                        help="take the entries of another store (one written by a second process with --store)")
    parser.add_argument("--store", type=Path, default=STORE)
    args = parser.parse_args(argv)
    names = {row.name: row for row in ROWS}
    rows = [r.name for r in sorted(ROWS, key=lambda r: r.num_slices)]  # v5e 16B 1x first
    wanted = args.only or [*list(COURSE)[:2], rows[0], *list(COURSE)[2:], *rows[1:]]
    unknown = [w for w in wanted if w not in COURSE and w not in names]
    if unknown:
        parser.error(f"unknown entries {unknown}: choose from {list(COURSE)} or {list(names)}")
    empty = {"course": {}, "published": {}, "not_run": {}}
    store = json.loads(args.store.read_text()) if args.store.exists() else empty
    for other in args.merge:
        taken = json.loads(other.read_text())
        for kind in ("course", "published"):
            store[kind].update(taken[kind])
            for name in taken[kind]:
                store["not_run"].pop(name, None)
    for item in args.not_run:
        name, _, reason = item.partition("=")
        if name not in names or not reason:
            parser.error(f"--not-run takes a published row's name and a reason, NAME=REASON; got {item!r}")
        store["not_run"][name] = reason
    failures = []
    for name in [] if args.dry_run else wanted:
        kind = "course" if name in COURSE else "published"
        start = time.process_time()
        entry = course_entry(name) if kind == "course" else published_entry(names[name])
        entry |= {"command": f"python tools/plans.py --only '{name}'", "versions": versions(),
                  "cpu_seconds": round(time.process_time() - start)}
        print(f"== {name} ({entry['cpu_seconds']} s of CPU)\n{entry['table']}\n{entry['why']}", flush=True)
        if args.check:
            if name not in store[kind]:
                failures.append(f"{name}: not stored")
            elif differ := compare(store[kind][name], entry):
                failures.append(f"{name}: {differ} differ")
            continue
        store[kind][name] = entry
        store["not_run"].pop(name, None)
        _write(args.store, store)
    for name in store["published"]:  # a row stored is run, whatever was said of it
        store["not_run"].pop(name, None)
    if (args.dry_run or args.merge) and not args.check:
        _write(args.store, store)
    for f in failures:
        print("DIFFERS:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
