#!/usr/bin/env python3
"""Run every notebook once; print wall time and the kernel's peak memory against the budgets.

    python tools/bench.py [notebooks/NN_name.ipynb ...]   # default: every notebook

Budgets (DEVELOPERS.md): 30 s per notebook top to bottom, 1 GB of RAM. Where
the machine allows (root, util-linux ``unshare``, iproute2 ``ip``), each
notebook runs in a fresh network namespace with only loopback up, which proves
it needs no network. Where a cgroup-v1 memory controller is writable, each
notebook also runs inside its own 1 GB memory cgroup (page cache included), which
proves it fits: "peak MB" is then the cgroup's peak, and "limit hits" counts how
often it pressed against 1 GB (the kernel reclaimed cache rather than failing).
Elsewhere "peak MB" is the kernel's peak resident set, which also counts the
shared library pages of big packages. This is a benchmark, not a test: it never
fails on time, and exits non-zero only if a notebook raises.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIME_BUDGET_S = 30.0
MEMORY_BUDGET_MB = 1024.0


def run_one(path: Path) -> dict:
    """Execute one notebook in this process's child kernel; report time and the kernel's peak RSS."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    error = ""
    try:
        client = NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    except Exception as err:  # report, do not crash the table
        error = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200] if str(err).strip() else ''}"
    wall = time.perf_counter() - start
    # The kernel is a waited-for child: its peak resident set is in RUSAGE_CHILDREN (KiB on Linux).
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"notebook": path.name, "wall_s": wall, "peak_mb": peak_mb, "error": error}


def _offline_prefix() -> list[str]:
    """A command prefix that runs in a new network namespace with only loopback, if possible."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return []
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True)
    return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"'] if probe.returncode == 0 else []


CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def _memory_cgroup() -> Path | None:
    """A fresh 1 GB memory cgroup (v1) to run one notebook in, or None where that is not allowed."""
    group = CGROUP_V1 / f"spmd-bench-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "memory.limit_in_bytes").write_text(str(int(MEMORY_BUDGET_MB * 2**20)))
        for name in ("memory.max_usage_in_bytes", "memory.failcnt"):
            (group / name).write_text("0")
        return group
    except OSError:
        return None


def main(args: list[str]) -> int:
    if args[:1] == ["--one"]:
        print(json.dumps(run_one(Path(args[1]))))
        return 0
    sys.path.insert(0, str(ROOT))
    from utils.course import notebooks, runnable_here

    paths = [Path(a) for a in args if a.endswith(".ipynb")] or notebooks()
    for skipped in [p for p in paths if not runnable_here(p)]:
        print(f"{skipped.name}: skipped, needs torch_xla (`make bench-xla` runs it in .venv-xla)")
    paths = [p for p in paths if runnable_here(p)]
    offline = _offline_prefix()
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_NUM_CPU_DEVICES=os.environ.get("JAX_NUM_CPU_DEVICES", "8"))
    print(f"{len(paths)} notebook(s), {os.cpu_count()} CPU core(s), network: "
          f"{'none (own namespace, loopback only)' if offline else 'not isolated (needs root + unshare)'}")
    group = _memory_cgroup()
    print(f"memory: {'each notebook in its own 1 GB cgroup' if group else 'peak resident set (no cgroup here)'}")
    print(f"{'notebook':<36}{'wall s':>8}{'budget':>8}{'peak MB':>9}{'budget':>8}{'limit hits':>11}  status")
    failed = 0
    for path in paths:
        group = _memory_cgroup()
        enter = (lambda g=group: (g / "cgroup.procs").write_text(str(os.getpid()))) if group else None
        out = subprocess.run([*offline, sys.executable, __file__, "--one", str(path.resolve())],
                             capture_output=True, text=True, env=env, cwd=path.resolve().parent,
                             preexec_fn=enter)
        hits = "-"
        try:
            r = json.loads(out.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            r = {"notebook": path.name, "wall_s": float("nan"), "peak_mb": float("nan"),
                 "error": (out.stderr.strip().splitlines() or ["no output"])[-1][:200]}
        if group:
            r["peak_mb"] = int((group / "memory.max_usage_in_bytes").read_text()) / 2**20
            hits = (group / "memory.failcnt").read_text().strip()
            group.rmdir()
        over = [name for name, bad in (("time", r["wall_s"] > TIME_BUDGET_S),
                                       ("memory", r["peak_mb"] > MEMORY_BUDGET_MB)) if bad]
        status = ("ERROR " + r["error"]) if r["error"] else ("OVER " + "+".join(over) if over else "ok")
        failed += bool(r["error"])
        print(f"{r['notebook']:<36}{r['wall_s']:>8.1f}{TIME_BUDGET_S:>8.0f}{r['peak_mb']:>9.0f}"
              f"{MEMORY_BUDGET_MB:>8.0f}{hits:>11}  {status}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
