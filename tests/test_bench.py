"""tools/bench.py: memory counts every process of a notebook, cgroups are found and driven correctly.

The bench reports budgets; it never asserts them. These tests check its measuring, on tiny notebooks
and on fake cgroup and /proc trees, never on the course's notebooks.
"""

import errno
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench", ROOT / "tools" / "bench.py")
bench = sys.modules["bench"] = importlib.util.module_from_spec(_spec)  # tools/ is not a package
_spec.loader.exec_module(bench)

MB = 2**20
BLOCK_MB = 200


def _notebook(path: Path, *cells: str) -> Path:
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                   "source": textwrap.dedent(c).strip()} for c in cells],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }))
    return path


def _env() -> dict:
    return dict(os.environ)


# A kernel that holds BLOCK_MB and starts a worker that holds BLOCK_MB too, both alive for a second.
HOLD_IN_KERNEL = f"kernel_block = b'\\x01' * ({BLOCK_MB} * 2**20)"
WORKER = f"""
import subprocess, sys, time
code = "import sys, time; b = b'\\\\x01' * ({BLOCK_MB} * 2**20); print('ready', flush=True); sys.stdin.read()"
worker = subprocess.Popen([sys.executable, '-c', code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert worker.stdout.readline().strip() == 'ready'
time.sleep(1.0)
worker.stdin.close()
worker.wait()
"""


def test_sampled_memory_counts_the_kernel_and_its_worker(tmp_path, capsys):
    nb = _notebook(tmp_path / "99_hold.ipynb", HOLD_IN_KERNEL, WORKER)
    [row] = bench.bench([nb], memory="sampled")
    out = capsys.readouterr().out
    assert row["error"] == "", row
    assert row["measured"] == f"tree RSS, sampled (PSS {row['pss_mb']:.0f})"
    # Either process alone holds one block plus an interpreter (under 2 blocks); both together hold 2 blocks,
    # in their resident sets and in their proportional sets (the blocks are private pages).
    assert row["peak_mb"] >= 2 * BLOCK_MB and row["pss_mb"] >= 2 * BLOCK_MB, row
    assert row["pss_mb"] <= row["peak_mb"] + 1
    assert "summed resident set of the kernel's process tree" in out
    assert "| 99_hold.ipynb" in out and "tree RSS, sampled (PSS" in out
    # CPU time: the kernel's and its worker's (each builds a 200 MB block), not the driver's waiting
    assert 0 < row["cpu_s"] < row["wall_s"] + 5, row
    assert f"total: 1 notebook(s), {row['wall_s']:.1f} s wall, {row['cpu_s']:.1f} s CPU" in out


def test_summary_gives_the_median_against_its_budget_and_names_what_is_over():
    def row(name, wall, peak=100.0, error=""):
        return {"notebook": name, "wall_s": wall, "cpu_s": wall / 2, "peak_mb": peak, "error": error}

    rows = [row("a", 2.0), row("b", 9.0), row("c", 16.0), row("d", 7.0, peak=2048.0), row("e", 1.0, error="Boom")]
    text = bench.summary(rows)
    assert "total: 5 notebook(s), 35.0 s wall, 17.5 s CPU, peak 2048 MB" in text
    assert "median: 7.0 s wall, 3.5 s CPU (budget 8 s: ok)" in text
    assert "over budget or failing: c, d, e" in text
    assert [bench.status(r) for r in rows[2:]] == ["over budget: time", "over budget: memory", "ERROR Boom"]
    assert "(budget 8 s: over)" in bench.summary(rows[1:3])


class _FakeCgroup(bench.MemoryCgroup):
    """A v2 cgroup in a plain directory: the peak file is written in advance, removal deletes the files."""

    def new_group(self, name):
        group = super().new_group(name)
        (group / "memory.peak").write_text(str(300 * MB))
        (group / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 0\noom_kill 0\n")
        return group

    def remove(self, group):
        self.joined = (group / "cgroup.procs").read_text()
        for f in group.iterdir():
            f.unlink()
        group.rmdir()


def test_a_cgroup_run_joins_the_group_and_reports_its_peak(tmp_path):
    nb = _notebook(tmp_path / "98_tiny.ipynb", "1 + 1")
    cgroup = _FakeCgroup(2, tmp_path / "cg")
    cgroup.parent.mkdir()
    row = bench.measure(nb, cgroup=cgroup, offline=[], env=_env())
    assert row["error"] == "", row
    assert row["measured"] == "cgroup v2 peak" and row["peak_mb"] == 300 and row["hits"] == "4"
    assert cgroup.joined.strip().isdigit()  # the driver wrote its pid before starting the kernel
    assert list(cgroup.parent.iterdir()) == []


# --- /proc ----------------------------------------------------------------------------------------------


def test_tree_rss_adds_up_descendants():
    code = "import sys; b = b'\\x01' * (64 * 2**20); print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        mine = bench.tree_rss_bytes(os.getpid())
        without_me = bench.tree_rss_bytes(os.getpid(), include_root=False)
        assert without_me >= 64 * MB
        assert mine >= without_me + bench._rss_bytes(os.getpid()) * 0.9
    finally:
        child.stdin.close()
        child.wait()


def test_tree_rss_without_children_files(tmp_path):
    """Where /proc/PID/task/*/children is missing, parents are read from every /proc/PID/stat."""
    for pid, ppid, name, pages in [(100, 1, "python", 10), (101, 100, "a (b) c", 20), (102, 101, "w", 30),
                                   (200, 1, "other", 1000)]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1\n")
        (tmp_path / str(pid) / "statm").write_text(f"{pages * 2} {pages} 0 0 0 0 0\n")
    assert bench._children(100, proc=tmp_path) == [101]
    assert bench.tree_rss_bytes(100, proc=tmp_path) == 60 * bench.PAGE_SIZE
    assert bench.tree_rss_bytes(100, include_root=False, proc=tmp_path) == 50 * bench.PAGE_SIZE
    assert bench.tree_rss_bytes(999, proc=tmp_path) == 0  # gone already
    assert bench.tree_pss_bytes(100, proc=tmp_path) is None  # no smaps_rollup: no PSS figure
    for pid, kib in [(100, 8), (101, 16), (102, 24)]:
        (tmp_path / str(pid) / "smaps_rollup").write_text(f"00400000-7fff [rollup]\nRss: 99 kB\nPss: {kib} kB\n")
    assert bench.tree_pss_bytes(100, proc=tmp_path) == 48 * 1024


# --- finding a memory cgroup ----------------------------------------------------------------------------


def _mountinfo(*mounts: tuple[str, Path, str, str]) -> str:
    return "\n".join(f"{30 + i} 23 0:{27 + i} {root} {point} rw,nosuid - {fstype} {fstype} {opts}"
                     for i, (root, point, fstype, opts) in enumerate(mounts))


def _controllers(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup.controllers").write_text(text + "\n")
    (directory / "cgroup.subtree_control").write_text("\n")
    return directory


def test_finds_cgroup_v2_with_a_memory_controller(tmp_path):
    own = _controllers(tmp_path / "cg2" / "user.slice" / "session-1.scope", "cpu io memory pids")
    found = bench.find_memory_cgroup("0::/user.slice/session-1.scope\n",
                                     _mountinfo(("/", tmp_path / "cg2", "cgroup2", "rw,nsdelegate")))
    assert found == (2, own)


def test_cgroup_v2_without_memory_falls_back_to_v1(tmp_path):
    """The hybrid layout of many container hosts: an empty unified hierarchy beside v1 controllers."""
    _controllers(tmp_path / "unified", "")
    v1 = tmp_path / "memory" / "sandbox" / "abc"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    proc_cgroup = "5:cpu,cpuacct:/\n4:memory:/sandbox/abc\n0::/\n"
    mounts = _mountinfo(("/", tmp_path / "unified", "cgroup2", "rw"),
                        ("/", tmp_path / "memory", "cgroup", "rw,memory"))
    assert bench.find_memory_cgroup(proc_cgroup, mounts) == (1, v1)


def test_a_container_mount_root_is_stripped(tmp_path):
    """In a container the v1 hierarchy is mounted from the container's own cgroup, /docker/abc."""
    point = tmp_path / "memory"
    point.mkdir()
    (point / "memory.limit_in_bytes").write_text("1073741824\n")
    mounts = _mountinfo(("/docker/abc", point, "cgroup", "rw,memory"))
    assert bench.find_memory_cgroup("4:memory:/docker/abc\n", mounts) == (1, point)


def test_no_memory_cgroup(tmp_path):
    _controllers(tmp_path / "cg2", "cpu pids")
    assert bench.find_memory_cgroup("0::/\n", _mountinfo(("/", tmp_path / "cg2", "cgroup2", "rw"))) is None
    assert bench.find_memory_cgroup("", "") is None


# --- driving a cgroup (plain files stand in for cgroupfs) ------------------------------------------------


def test_v2_enables_memory_by_moving_into_a_leaf(tmp_path, monkeypatch):
    """cgroup v2 refuses +memory while the parent holds a process: bench moves itself into a leaf first."""
    parent = _controllers(tmp_path / "cg", "memory")
    procs = parent / "cgroup.procs"
    procs.write_text(f"{os.getpid()}\n")
    real_write = Path.write_text

    def cgroupfs(self, text, *args, **kwargs):
        """The two kernel rules that matter here, on plain files."""
        if self == parent / "cgroup.subtree_control" and procs.read_text().strip():
            raise OSError(errno.EBUSY, "Device or resource busy")  # no internal processes
        if self.name == "cgroup.procs" and self.parent != parent:
            real_write(procs, "")  # a process written into a child leaves the parent
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", cgroupfs)
    cgroup = bench.MemoryCgroup(2, parent)
    leaf = parent / f"spmd-bench-self-{os.getpid()}"
    cgroup.prepare()
    assert (leaf / "cgroup.procs").read_text() == str(os.getpid()) and procs.read_text() == ""
    assert (parent / "cgroup.subtree_control").read_text() == "+memory"

    group = cgroup.new_group("nb")
    assert (group / "memory.max").read_text() == str(1024 * MB)
    assert not cgroup.has_peak(group)  # no memory.peak (Linux < 5.19): memory.current is sampled instead
    (group / "memory.current").write_text("12345\n")
    assert cgroup.current(group) == 12345
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n")
    assert cgroup.read(group) == (None, "2 oom 1")

    for directory in (group, leaf):  # cgroupfs control files do not stop rmdir; plain files do
        for f in directory.iterdir():
            f.unlink()
    cgroup.remove(group)
    cgroup.close()
    assert (parent / "cgroup.subtree_control").read_text() == "-memory"
    assert procs.read_text() == str(os.getpid())
    assert not leaf.exists() and not group.exists()


def test_v2_where_the_controller_cannot_be_enabled(tmp_path, monkeypatch):
    """Other processes share the parent: enabling fails even from the leaf, and everything is undone."""
    parent = _controllers(tmp_path / "cg", "memory")
    (parent / "cgroup.procs").write_text("1\n")
    real_write = Path.write_text

    def busy(self, text, *args, **kwargs):
        if self.name == "cgroup.subtree_control":
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", busy)
    leaf = parent / f"spmd-bench-self-{os.getpid()}"
    real_rmdir = Path.rmdir
    monkeypatch.setattr(Path, "rmdir", lambda self: ([f.unlink() for f in self.iterdir()], real_rmdir(self)))
    with pytest.raises(OSError):
        bench.MemoryCgroup(2, parent).prepare()
    assert not leaf.exists()
    assert (parent / "cgroup.procs").read_text() == str(os.getpid())  # moved back


def test_v1_group_limit_and_counters(tmp_path):
    cgroup = bench.MemoryCgroup(1, tmp_path)
    cgroup.prepare()  # nothing to do on v1
    group = cgroup.new_group("nb")
    assert (group / "memory.limit_in_bytes").read_text() == str(1024 * MB)
    assert (group / "memory.failcnt").read_text() == "0"
    (group / "memory.max_usage_in_bytes").write_text(f"{700 * MB}\n")
    (group / "memory.failcnt").write_text("3\n")
    (group / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert cgroup.has_peak(group) and cgroup.read(group) == (700 * MB, "3")
    assert cgroup.label == "cgroup v1"


@pytest.mark.parametrize("bad", ["--memory=gpu", "--memory"])
def test_memory_option_is_checked(bad, capsys):
    with pytest.raises(SystemExit):
        bench.main([bad])
    assert "--memory" in capsys.readouterr().err
