"""The notebook tooling: pairing, stripping, the README table."""

import json
import subprocess
import sys

from utils.course import (
    ROOT,
    badges_markdown,
    setup_source,
)

TOOLS = ROOT / "tools" / "notebooks.py"


def test_build_and_export_round_trip(tmp_path):
    src = tmp_path / "src.py"
    src.write_text("# %% [markdown]\n# # 99 · Demo\n#\n# {{badges}}\n\n# %% setup 64\n\n# %%\nx = 1\n")
    out = tmp_path / "99_demo.ipynb"
    subprocess.run([sys.executable, str(TOOLS), "build", str(src), str(out)], check=True, capture_output=True)
    nb = json.loads(out.read_text())
    assert [c["cell_type"] for c in nb["cells"]] == ["markdown", "code", "code"]
    assert badges_markdown("99_demo.ipynb") in "".join(nb["cells"][0]["source"])
    assert "".join(nb["cells"][1]["source"]) == setup_source(64)
    back = subprocess.run([sys.executable, str(TOOLS), "export", str(out)], check=True, capture_output=True,
                          text=True).stdout
    assert "# %% setup 64" in back and "{{badges}}" in back and "x = 1" in back


def test_strip_removes_outputs(tmp_path):
    nb = tmp_path / "01_x.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {"tags": []}, "source": ["1"],
                                         "execution_count": 3, "outputs": [{"output_type": "stream"}]}],
                              "metadata": {"kernelspec": {"name": "python3"}, "widgets": {}},
                              "nbformat": 4, "nbformat_minor": 5}))
    subprocess.run([sys.executable, str(TOOLS), "strip", str(nb)], check=True, capture_output=True)
    cell = json.loads(nb.read_text())["cells"][0]
    assert cell["outputs"] == [] and cell["execution_count"] is None


def test_tool_usage_errors_exit_nonzero():
    r = subprocess.run([sys.executable, str(TOOLS), "bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "build" in r.stdout
