#!/usr/bin/env python3
"""Run notebooks once; print each one's wall time, CPU time and memory against the course's budgets.

    python tools/bench.py [--memory auto|cgroup|sampled] [notebooks/NN_name.ipynb ...]   # default: all

Budgets: 15 s per notebook top to bottom on 2 idle cores, 8 s for the median notebook, and 1 GB of RAM for
all of a notebook's processes together (its kernel and any worker process the notebook starts). The table
is Markdown (README quotes it) and ends with the total and the median. This is a benchmark, not a test: it
reports budgets and never fails on them; it exits non-zero only if a notebook raises.

Time: "wall s" is the notebook's run, top to bottom, in its kernel; "CPU s" is the user + system time of the
kernel and every process it started (``RUSAGE_CHILDREN`` of the driver, once the kernel has exited). On a
loaded machine wall time grows with the load and CPU time hardly does: there, compare CPU time with the
budget (an idle 2-core machine runs a notebook in about its CPU time, or less where it uses both cores).

Network: where the machine allows (root, util-linux ``unshare``, iproute2 ``ip``), each notebook runs
in a fresh network namespace with only loopback up, which shows it needs no network.

Memory (``--memory auto`` takes the first that this machine allows; the report labels which):

- **cgroup v2**: each notebook's kernel, and every process it starts, runs in its own child cgroup with
  ``memory.max`` = 1 GiB (and ``memory.swap.max`` = 0 where swap is accounted), made under this
  process's own cgroup. cgroup v2 lets a cgroup hand the memory controller to children only while it
  holds no process itself, so where ``memory`` is missing from the parent's ``cgroup.subtree_control``
  this process first moves into a leaf beside them, enables it, and undoes both at the end. "peak" is
  ``memory.peak`` (Linux 5.19+), else ``memory.current`` sampled every 50 ms; "limit hits" counts the
  ``max`` events of ``memory.events`` (the kernel reclaimed at the limit), with any ``oom_kill``.
- **cgroup v1**: the same with ``memory.limit_in_bytes``, ``memory.max_usage_in_bytes`` and
  ``memory.failcnt``.
- **sampled**: where no memory cgroup is writable, the resident set of every process in the kernel's
  process tree, summed, sampled every 50 ms from /proc. Pages shared between processes count once
  per process (an upper bound; the report adds the summed proportional set size, PSS, which divides
  shared pages among their users), and a peak shorter than a sample can be missed.

Page cache is charged to a cgroup, so cgroup figures include the files a notebook reads; the cgroup is
joined after the driver (nbclient) has loaded, so it holds the kernel's memory, not the driver's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIME_BUDGET_S = 15.0
MEDIAN_BUDGET_S = 8.0
MEMORY_BUDGET_MB = 1024.0
LIMIT_BYTES = int(MEMORY_BUDGET_MB * 2**20)
SAMPLE_S = 0.05
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


# --- one notebook, in a child process --------------------------------------------------------------


def run_one(path: Path, join: Path | None = None) -> dict:
    """Execute one notebook in a kernel started by this process; report its wall and CPU time.

    ``join``: a cgroup's ``cgroup.procs`` file, joined after the driver's imports and before the
    kernel starts, so the cgroup holds the kernel (and what it starts) rather than nbclient.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    if join is not None:
        join.write_text(str(os.getpid()))
    start, before = time.perf_counter(), _children_cpu_s()
    error = ""
    try:
        client.execute()  # starts the kernel, runs every cell, shuts the kernel down and waits for it
    except Exception as err:  # report, do not crash the table
        lines = str(err).strip().splitlines()
        error = f"{type(err).__name__}: {lines[-1][:200] if lines else ''}"
    return {"notebook": path.name, "wall_s": time.perf_counter() - start, "cpu_s": _children_cpu_s() - before,
            "error": error}


def _children_cpu_s() -> float:
    """User + system seconds of this process's children that have exited (and theirs, once waited for)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --- memory of a process tree, from /proc ---------------------------------------------------------


def _children(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Direct children of ``pid`` (from /proc/PID/task/*/children, else by scanning every /proc/*/stat)."""
    kids: list[int] = []
    try:
        for task in (proc / str(pid) / "task").iterdir():
            kids += [int(k) for k in (task / "children").read_text().split()]
        return kids
    except FileNotFoundError:  # the process has exited, or the kernel has no children files
        pass
    except OSError:
        return []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            after_name = stat.read_text().rsplit(")", 1)[1].split()
            if int(after_name[1]) == pid:
                kids.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return kids


def _rss_bytes(pid: int, proc: Path = Path("/proc")) -> int:
    try:
        return int((proc / str(pid) / "statm").read_text().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0  # exited between listing and reading


def _pss_bytes(pid: int, proc: Path = Path("/proc")) -> int | None:
    """Proportional set size (shared pages divided among their users); 0 once the process has gone (or is a
    zombie), None where /proc does not say (no smaps_rollup before Linux 4.14, or no permission)."""
    try:
        text = (proc / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return 0 if not (proc / str(pid)).exists() else None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            try:
                return int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                return None
    return 0


def _tree(pid: int, include_root: bool, proc: Path) -> list[int]:
    found, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        if p != pid or include_root:
            found.append(p)
        todo += _children(p, proc)
    return found


def tree_rss_bytes(pid: int, *, include_root: bool = True, proc: Path = Path("/proc")) -> int:
    """Summed resident set of ``pid`` and all its descendants (without ``pid`` itself if not include_root)."""
    return sum(_rss_bytes(p, proc) for p in _tree(pid, include_root, proc))


def tree_pss_bytes(pid: int, *, include_root: bool = True, proc: Path = Path("/proc")) -> int | None:
    """Summed proportional set size of the same tree, or None where a process's smaps_rollup is unreadable."""
    sizes = [_pss_bytes(p, proc) for p in _tree(pid, include_root, proc)]
    return None if None in sizes else sum(sizes)


# --- memory cgroups ---------------------------------------------------------------------------------


def _mounts(mountinfo: str) -> list[tuple[str, Path, str, list[str]]]:
    """(root inside the hierarchy, mount point, fs type, super options) of each line of /proc/self/mountinfo."""
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and len(tail) >= 3:
            found.append((fields[3], Path(fields[4].replace("\\040", " ")), tail[0], tail[2].split(",")))
    return found


def _inside(mount_root: str, own: str) -> str:
    """``own`` (a path from /proc/self/cgroup) relative to a mount whose root is ``mount_root``."""
    if mount_root != "/" and (own == mount_root or own.startswith(mount_root + "/")):
        own = own[len(mount_root):]
    return own.lstrip("/")


def find_memory_cgroup(proc_cgroup: str, mountinfo: str) -> tuple[int, Path] | None:
    """(version, directory) of this process's own cgroup where a memory controller can be had, else None.

    cgroup v2 (the unified hierarchy, line ``0::/path``) counts where ``memory`` is in the directory's
    ``cgroup.controllers``; else cgroup v1's memory hierarchy (a line naming ``memory``).
    """
    own = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            own["v2" if parts[0] == "0" and parts[1] == "" else parts[1]] = parts[2]
    mounts = _mounts(mountinfo)
    if "v2" in own:
        for root, point, fstype, _ in mounts:
            if fstype == "cgroup2":
                directory = point / _inside(root, own["v2"])
                try:
                    if "memory" in (directory / "cgroup.controllers").read_text().split():
                        return 2, directory
                except OSError:
                    pass
    v1 = next((path for names, path in own.items() if "memory" in names.split(",")), None)
    if v1 is not None:
        for root, point, fstype, options in mounts:
            if fstype == "cgroup" and "memory" in options:
                directory = point / _inside(root, v1)
                if (directory / "memory.limit_in_bytes").exists():
                    return 1, directory
    return None


@dataclass
class MemoryCgroup:
    """Child cgroups with a 1 GiB limit, made under this process's own cgroup ``parent``."""

    version: int
    parent: Path
    _leaf: Path | None = field(default=None, repr=False)
    _enabled: bool = field(default=False, repr=False)

    @property
    def label(self) -> str:
        return f"cgroup v{self.version}"

    def prepare(self) -> None:
        """cgroup v2: make the memory controller available to children of ``parent`` (raises OSError)."""
        if self.version != 2:
            return
        control = self.parent / "cgroup.subtree_control"
        if "memory" in control.read_text().split():
            return
        try:
            control.write_text("+memory")  # allowed where the parent holds no process (the root cgroup)
            self._enabled = True
            return
        except OSError:
            pass
        leaf = self.parent / f"spmd-bench-self-{os.getpid()}"
        leaf.mkdir(exist_ok=True)
        self._leaf = leaf
        try:
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
            control.write_text("+memory")
            self._enabled = True
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        """Undo :meth:`prepare`: disable what it enabled, move this process back, remove its leaf."""
        if self._enabled:
            with contextlib.suppress(OSError):
                (self.parent / "cgroup.subtree_control").write_text("-memory")
            self._enabled = False
        if self._leaf is not None:
            try:
                (self.parent / "cgroup.procs").write_text(str(os.getpid()))
                self._leaf.rmdir()
            except OSError as err:
                print(f"bench: could not remove {self._leaf}: {err}", file=sys.stderr)
            self._leaf = None

    def new_group(self, name: str) -> Path:
        """A fresh child cgroup limited to 1 GiB (raises OSError where that is not allowed)."""
        group = self.parent / name
        group.mkdir()
        try:
            if self.version == 2:
                (group / "memory.max").write_text(str(LIMIT_BYTES))
                swap = group / "memory.swap.max"
            else:
                (group / "memory.limit_in_bytes").write_text(str(LIMIT_BYTES))
                for counter in ("memory.max_usage_in_bytes", "memory.failcnt"):
                    (group / counter).write_text("0")
                swap = group / "memory.memsw.limit_in_bytes"
            if swap.exists():  # where swap is not accounted the limit still holds for resident memory
                with contextlib.suppress(OSError):
                    swap.write_text("0" if self.version == 2 else str(LIMIT_BYTES))
        except OSError:
            group.rmdir()
            raise
        return group

    def has_peak(self, group: Path) -> bool:
        return self.version == 1 or (group / "memory.peak").exists()

    def current(self, group: Path) -> int:
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        try:
            return int((group / name).read_text())
        except (OSError, ValueError):
            return 0

    def read(self, group: Path) -> tuple[int | None, str]:
        """(peak bytes, or None where the kernel keeps no peak; limit hits as text)."""
        if self.version == 1:
            peak = int((group / "memory.max_usage_in_bytes").read_text())
            hits = (group / "memory.failcnt").read_text().strip()
            oom = _keyed(group / "memory.oom_control").get("oom_kill", 0)
        else:
            peak = int((group / "memory.peak").read_text()) if self.has_peak(group) else None
            events = _keyed(group / "memory.events")
            hits, oom = str(events.get("max", 0)), events.get("oom_kill", events.get("oom", 0))
        return peak, hits + (f" oom {oom}" if oom else "")

    def remove(self, group: Path) -> None:
        for _ in range(40):  # processes may take a moment to leave after the kernel shuts down
            try:
                group.rmdir()
                return
            except OSError:
                time.sleep(0.05)
        print(f"bench: {group} still holds processes; remove it by hand once they exit", file=sys.stderr)


def _keyed(path: Path) -> dict[str, int]:
    """'name value' lines (memory.events, memory.oom_control) as a dict; {} where the file is missing."""
    try:
        pairs = (line.split() for line in path.read_text().splitlines())
        return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}
    except OSError:
        return {}


def memory_cgroup() -> MemoryCgroup | None:
    """This machine's memory cgroup, ready for children, or None where none is writable."""
    try:
        found = find_memory_cgroup(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    except OSError:
        return None
    if found is None:
        return None
    cgroup = MemoryCgroup(*found)
    try:
        cgroup.prepare()
        probe = cgroup.new_group(f"spmd-bench-{os.getpid()}-probe")
        cgroup.remove(probe)
    except OSError:
        cgroup.close()
        return None
    return cgroup


# --- the table ----------------------------------------------------------------------------------------


def _offline_prefix() -> list[str]:
    """A command prefix that runs in a new network namespace with only loopback, if possible."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return []
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True)
    return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"'] if probe.returncode == 0 else []


def measure(path: Path, *, cgroup: MemoryCgroup | None, offline: list[str], env: dict, index: int = 0) -> dict:
    """Run one notebook in a child process; its wall time, peak memory and what that peak measured."""
    group = None
    if cgroup is not None:
        try:
            group = cgroup.new_group(f"spmd-bench-{os.getpid()}-{index}")
        except OSError:
            group = None
    cmd = [*offline, sys.executable, str(Path(__file__).resolve()), "--one", str(path.resolve())]
    if group is not None:
        cmd += ["--join", str(group / "cgroup.procs")]
    sample_current = group is not None and not cgroup.has_peak(group)
    tree_peak = current_peak = 0
    pss_peak = 0
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=path.resolve().parent)
        while True:
            try:
                child.wait(timeout=SAMPLE_S)
                break
            except subprocess.TimeoutExpired:
                pass
            # The child is the driver; its descendants are the kernel and whatever the notebook starts.
            tree_peak = max(tree_peak, tree_rss_bytes(child.pid, include_root=False))
            if group is None:
                pss = tree_pss_bytes(child.pid, include_root=False)
                pss_peak = max(pss_peak, pss or 0)
            if sample_current:
                current_peak = max(current_peak, cgroup.current(group))
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    try:
        r = json.loads(stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        r = {"notebook": path.name, "wall_s": float("nan"), "cpu_s": float("nan"),
             "error": (stderr.strip().splitlines() or [f"exit status {child.returncode}, no output"])[-1][:200]}
    r["hits"] = "-"
    if group is not None:
        peak, r["hits"] = cgroup.read(group)
        cgroup.remove(group)
        r["peak_mb"] = (peak if peak is not None else current_peak) / 2**20
        r["measured"] = f"{cgroup.label} peak" if peak is not None else f"{cgroup.label} current, sampled"
    else:
        r["peak_mb"] = tree_peak / 2**20
        r["measured"] = "tree RSS, sampled"
        if pss_peak:
            r["pss_mb"] = pss_peak / 2**20
            r["measured"] += f" (PSS {r['pss_mb']:.0f})"
    r["tree_mb"] = tree_peak / 2**20
    return r


def status(row: dict) -> str:
    """'ok', 'over budget: time+memory' (wall time over 15 s, peak over 1 GB), or the notebook's error."""
    over = [name for name, bad in (("time", row["wall_s"] > TIME_BUDGET_S),
                                   ("memory", row["peak_mb"] > MEMORY_BUDGET_MB)) if bad]
    return ("ERROR " + row["error"]) if row["error"] else ("over budget: " + "+".join(over) if over else "ok")


def summary(rows: list[dict]) -> str:
    """The total and the median against their budgets, and the notebooks over budget."""
    if not rows:
        return "no notebook run"
    walls, cpus = [r["wall_s"] for r in rows], [r["cpu_s"] for r in rows]
    median, cpu_median = statistics.median(walls), statistics.median(cpus)
    over = [r["notebook"] for r in rows if status(r) != "ok"]
    return "\n".join([
        f"total: {len(rows)} notebook(s), {sum(walls):.1f} s wall, {sum(cpus):.1f} s CPU, "
        f"peak {max(r['peak_mb'] for r in rows):.0f} MB",
        f"median: {median:.1f} s wall, {cpu_median:.1f} s CPU (budget {MEDIAN_BUDGET_S:.0f} s: "
        f"{'ok' if median <= MEDIAN_BUDGET_S else 'over'}); each notebook: {TIME_BUDGET_S:.0f} s, "
        f"{MEMORY_BUDGET_MB:.0f} MB",
        f"over budget or failing: {', '.join(over) if over else 'none'}",
    ])


def bench(paths: list[Path], memory: str = "auto") -> list[dict]:
    """Run each notebook, print the table, and return its rows."""
    from spmd_course.course import runnable_here

    for skipped in [p for p in paths if not runnable_here(p)]:
        print(f"{skipped.name}: skipped, needs torch_xla (`make bench-xla` runs it in .venv-xla)")
    paths = [p for p in paths if runnable_here(p)]
    offline = _offline_prefix()
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=os.environ.get("JAX_NUM_CPU_DEVICES", "8"))
    cgroup = memory_cgroup() if memory in ("auto", "cgroup") else None
    if memory == "cgroup" and cgroup is None:
        raise SystemExit("bench: --memory cgroup, but no memory cgroup (v1 or v2) is writable here")
    print(f"{len(paths)} notebook(s), {os.cpu_count()} CPU core(s), network: "
          f"{'none (own namespace, loopback only)' if offline else 'not isolated (needs root + unshare)'}")
    if cgroup is not None:
        print(f"memory: each notebook's kernel and its processes in its own {cgroup.label} child of {cgroup.parent} "
              f"limited to {MEMORY_BUDGET_MB:.0f} MiB; 'peak MB' is the cgroup's peak (page cache included), "
              "'limit hits' how often it reached the limit")
    else:
        print(f"memory: no memory cgroup{' used' if memory == 'sampled' else ' writable here'}; 'peak MB' is the "
              f"summed resident set of the kernel's process tree (kernel and its workers), sampled every "
              f"{SAMPLE_S * 1000:.0f} ms; pages shared between them count once per process, so it is an upper "
              "bound; '(PSS n)' is the summed proportional set size, which divides shared pages among their users")
    print(f"| {'notebook':<32} | {'wall s':>6} | {'CPU s':>6} | {'peak MB':>7} | {'limit hits':>10} | "
          f"{'measured':<30} | status |")
    print(f"|{'-' * 34}|{'-' * 7}:|{'-' * 7}:|{'-' * 8}:|{'-' * 11}:|{'-' * 32}|--------|")
    rows = []
    try:
        for index, path in enumerate(paths):
            r = measure(path, cgroup=cgroup, offline=offline, env=env, index=index)
            print(f"| {r['notebook']:<32} | {r['wall_s']:>6.1f} | {r['cpu_s']:>6.1f} | {r['peak_mb']:>7.0f} | "
                  f"{r['hits']:>10} | {r['measured']:<30} | {status(r)} |", flush=True)
            rows.append(r)
        print(summary(rows))
    finally:
        if cgroup is not None:
            cgroup.close()
    return rows


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: every notebook)")
    parser.add_argument("--memory", choices=("auto", "cgroup", "sampled"), default="auto",
                        help="how to measure memory: a cgroup where writable (auto), a cgroup or fail, "
                             "or the sampled resident set of the kernel's process tree")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--join", type=Path, help=argparse.SUPPRESS)
    ns = parser.parse_args(args)
    if ns.one is not None:
        print(json.dumps(run_one(ns.one, ns.join)))
        return 0
    from spmd_course.course import notebooks

    rows = bench([p for p in ns.notebooks if p.suffix == ".ipynb"] or notebooks(), ns.memory)
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
