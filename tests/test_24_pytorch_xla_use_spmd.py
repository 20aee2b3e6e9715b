"""Notebook 24 §2: `xr.use_spmd()` must come first, shown in fresh processes (`make test-xla`).

The notebook cannot show a wrong order, because each one spoils the process it runs in: after a failed
`mark_sharding`, SPMD mode can no longer be turned on, and after a late `use_spmd()` the next program crashes. So
each order runs here in its own Python process, started the way notebook 24 starts torch_xla (8 CPU devices), and
the test reads what it printed and how it ended. Skipped where torch_xla is not installed (every environment but
.venv-xla).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is None, reason="needs torch_xla, which only .venv-xla has: make test-xla"
)

# What every process does first: torch_xla on 8 CPU devices, not yet in SPMD mode, and an (8, 1) mesh.
START = """
import resource
import warnings

resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the crash of the second test leaves no core dump behind

import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

assert not xr.is_spmd()
mesh = xs.Mesh(np.arange(8), (8, 1), ("data", "model"))
"""


def run_fresh(body: str, tmp_path) -> subprocess.CompletedProcess:
    """Runs START then `body` in a new Python process with torch_xla on 8 CPU devices; returns how it ended."""
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [sys.executable, "-c", START + textwrap.dedent(body)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )


def test_mark_sharding_before_use_spmd_raises_a_runtime_error_that_names_use_spmd(tmp_path):
    run = run_fresh("""
        t = torch.zeros(8, 4, device=torch_xla.device())
        print("marking", flush=True)
        xs.mark_sharding(t, mesh, ("data", None))
        print("marked", flush=True)
    """, tmp_path)
    assert "marking" in run.stdout and "marked" not in run.stdout, run.stdout + run.stderr
    assert run.returncode == 1, run.stderr  # an ordinary Python exception, not a crash
    error = run.stderr.strip().splitlines()[-1]
    assert error.startswith("RuntimeError:"), run.stderr
    assert "Please enable SPMD via `torch_xla.runtime.use_spmd()`" in error, error


def test_a_failed_mark_sharding_leaves_the_process_unfit_for_spmd_mode(tmp_path):
    """Why the notebook cannot show even the first wrong order: a later use_spmd() no longer works."""
    run = run_fresh("""
        t = torch.zeros(8, 4)  # still on the host: no tensor has reached an XLA device
        try:
            xs.mark_sharding(t, mesh, ("data", None))
        except RuntimeError as err:
            print("mark_sharding:", err, flush=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            xr.use_spmd()
        for w in caught:
            print("warning:", w.category.__name__, w.message, flush=True)
        try:
            print("device:", torch_xla.device(), flush=True)
        except RuntimeError as err:
            print("device failed:", err, flush=True)
    """, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mark_sharding: Check failed: UseVirtualDevice(): Please enable SPMD" in run.stdout, run.stdout
    warned = re.findall(r"^warning: (\w+) (.*)$", run.stdout, flags=re.M)
    assert [category for category, _ in warned] == ["UserWarning"], run.stdout
    assert warned[0][1].startswith("Replicating tensors already initialized"), warned
    assert "device failed:" in run.stdout and "device: xla" not in run.stdout, run.stdout


def test_use_spmd_after_a_tensor_warns_replicating_and_the_next_program_kills_the_process(tmp_path):
    run = run_fresh("""
        t = torch.ones(8, 4, device=torch_xla.device())  # a tensor on the device before SPMD mode
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            xr.use_spmd()
        for w in caught:
            print("warning:", w.category.__name__, w.message, flush=True)
        print("spmd:", xr.is_spmd(), flush=True)
        s = torch.ones(8, 4, device=torch_xla.device())  # even a new tensor: the next program is what fails
        print("sum:", (s * 2).sum().item(), flush=True)
    """, tmp_path)
    warned = re.findall(r"^warning: (\w+) (.*)$", run.stdout, flags=re.M)
    assert [category for category, _ in warned] == ["UserWarning"], run.stdout + run.stderr
    assert warned[0][1].startswith("Replicating tensors already initialized"), warned
    assert "spmd: True" in run.stdout, run.stdout  # SPMD mode is on ...
    assert "sum:" not in run.stdout, run.stdout  # ... but the first program after it never returns
    assert run.returncode == -signal.SIGSEGV, (run.returncode, run.stderr[-2000:])  # killed, no Python error


def test_use_spmd_first_then_tensors_and_mark_sharding_works_without_a_warning(tmp_path):
    run = run_fresh("""
        warnings.simplefilter("error", UserWarning)  # a "Replicating ..." warning would fail this run
        xr.use_spmd()
        t = torch.ones(8, 4, device=torch_xla.device())
        xs.mark_sharding(t, mesh, ("data", None))
        print("spec:", torch_xla._XLAC._get_xla_sharding_spec(t), flush=True)
        print("sum:", (t * 2).sum().item(), flush=True)
    """, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "spec: {devices=[8,1]0,1,2,3,4,5,6,7}" in run.stdout, run.stdout  # 8 row blocks, one a device
    assert "sum: 64.0" in run.stdout, run.stdout  # 8 x 4 ones, doubled
    assert "Replicating" not in run.stderr, run.stderr
