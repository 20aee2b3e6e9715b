"""Launch paths: the setup cell, Binder and a Colab-like runtime."""

import os
import shutil

from utils.course import (
    REPO,
    ROOT,
    setup_source,
)


def test_setup_source_is_short_and_asks_for_devices():
    src = setup_source()
    assert src.endswith("SETUP = setup_devices(8)") and setup_source(64).endswith("setup_devices(64)")
    assert f"https://github.com/{REPO}" in src
    assert len(src.splitlines()) <= 15


def test_binder_installs_the_course_requirements():
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.12"
    assert (ROOT / "binder" / "requirements.txt").read_text() == (ROOT / "requirements.txt").read_text()
    start = (ROOT / "binder" / "start").read_text()
    assert start.startswith("#!") and "JAX_NUM_CPU_DEVICES=8" in start and 'exec "$@"' in start


def test_setup_cell_bootstraps_a_lone_notebook_like_colab(tmp_path, monkeypatch):
    """Run the real setup cell in a kernel that looks like Colab, in a folder without the course.

    `google.colab` is faked, and `git` is a stand-in that copies this checkout instead of
    cloning from GitHub (no network here). The cell must fetch the course, install its
    requirements (already satisfied in this environment) and import utils from the copy.
    """
    import nbformat
    from nbclient import NotebookClient

    shim = tmp_path / "bin"
    shim.mkdir()
    real_git = shutil.which("git")
    (shim / "git").write_text(  # stand-in for `git clone -q --depth 1 URL DEST`: copy the tracked files
        f'#!/bin/sh\nfor last; do :; done\nmkdir -p "$last" && dest=$(cd "$last" && pwd)\n'
        f'(cd "{ROOT}" && "{real_git}" ls-files -z | xargs -0 cp --parents -t "$dest")\n'
        f'echo "$@" > "$last/.cloned-with"\n')
    (shim / "git").chmod(0o755)
    work = tmp_path / "content"
    work.mkdir()
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import sys, types\n"
                                  "colab = sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
                                  "colab.output = sys.modules['google.colab.output'] = types.ModuleType('output')"),
        nbformat.v4.new_code_cell(setup_source()),
        nbformat.v4.new_code_cell("import utils, jax\nprint(utils.__file__, jax.device_count())"),
    ])
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    out = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert f"{work}/spmd-course/utils/__init__.py 8" in out
    assert f"https://github.com/{REPO}" in (work / "spmd-course" / ".cloned-with").read_text()
