"""What several test files share (a module, not a test file, so no test module imports another):

- ways of reading a figure from ``utils.drawing`` back, so a test asserts what a reader sees;
- ``from_notebook``: a notebook's own top-level definitions, read from its source, for the tests of its code
  (``notebook_11``, ``notebook_12``: those of 11 and 12 that several files compile, read once);
- ``find_uv``: the course's bootstrapped uv, for the tests of the lock and of Colab's install;
- ``tool``: one of the maintainer's scripts in ``tools/`` (a folder of scripts, not a package), loaded by file;
- ``V5E_ORDER``: the device order ``jax.make_mesh`` gives on a TPU v5e-8 host, for meshes not in id order.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

REPO = Path(__file__).resolve().parents[1]


def tool(name: str) -> ModuleType:
    """``tools/<name>.py`` as a module (kept in ``sys.modules`` as ``<name>_tool``): tools/ is a folder of scripts
    that import the installed ``spmd_course``, so loading one by file needs no path edit."""
    key = f"{name}_tool"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO / "tools" / f"{name}.py")
        module = sys.modules[key] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]
V5E_ORDER = (0, 1, 2, 3, 7, 6, 5, 4)  # what create_device_mesh picks for a ring on a 4 x 2 TPU v5e board


def v5e_ordered_mesh():
    """A 1-D mesh ('data') of the 8 CPU devices in ``V5E_ORDER``: positions that do not follow the ids."""
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    return Mesh(np.array(jax.devices())[list(V5E_ORDER)], ("data",), axis_types=(AxisType.Auto,))


# --- a figure, read back ---------------------------------------------------------------------------------------------


def tile_labels(fig: Figure) -> list[str]:
    """The label of every block drawn in ``fig``, panel by panel: what a reader sees (lines as
    ``utils.drawing._tile_lines`` orders them)."""
    if not isinstance(fig, Figure):
        raise TypeError(f"tile_labels reads a Figure returned by draw_sharding(s); got {type(fig).__name__}")
    return [t.get_label() for ax in fig.axes for t in ax.texts if t.get_gid() == "tile-label"]


def mesh_labels(fig: Figure) -> list[list[list[int]]]:
    """The device ids a ``draw_mesh`` figure shows: one grid (rows of ids) per panel.

    ``mesh_labels(draw_mesh(mesh))[0]`` equals ``mesh.device_ids.tolist()``
    for a 2-D mesh, so a test can assert what the picture shows.
    """
    if not isinstance(fig, Figure):
        raise TypeError(f"mesh_labels reads a Figure returned by draw_mesh; got {type(fig).__name__}")
    cells = [sorted((t.get_position()[::-1], int(t.get_text())) for t in ax.texts if t.get_gid() == "device-label")
             for ax in fig.axes]
    grids = [[[dev for _, dev in row] for _, row in itertools.groupby(c, key=lambda cell: cell[0][0])]
             for c in cells if c]
    if not grids:
        raise ValueError("this figure has no devices drawn: pass a Figure from draw_mesh")
    return grids


def patches(fig: Figure, gid: str) -> list:
    """Every patch of ``fig`` with the given gid (the renderer tags what it draws)."""
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def label_boxes(fig: Figure) -> list:
    """(text, Bbox in pixels) of every block label, measured on a rendered copy of ``fig``."""
    canvas = FigureCanvasAgg(fig)  # the returned figure is closed: give it a canvas to measure text on
    canvas.draw()
    renderer = canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for ax in fig.axes for t in ax.texts
            if t.get_gid() == "tile-label"]


def extents(fig: Figure) -> list:
    """The drawn outline of each panel's array, in pixels of the rendered figure: one Bbox per panel."""
    FigureCanvasAgg(fig).draw()
    return [p.get_window_extent() for ax in fig.axes for p in ax.patches if p.get_gid() == "array"]


# --- a notebook's own code -------------------------------------------------------------------------------------------


def _bound(node):
    """The names a top-level statement binds (def, class, assignment, import: a program a notebook imports from
    src/spmd_course/models.py is the one it runs)."""
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {alias.asname or alias.name.split(".")[0] for alias in node.names}
    return set()


def from_notebook(number, *names, given=None):
    """Notebook ``number``'s top-level definitions of ``names``, executed after the notebook's imports, in the
    notebook's order: its own code, not a copy. ``given`` adds names the definitions read (a model imported
    from src/spmd_course/models.py). Fails, naming the notebook, when a name is no longer bound exactly once."""
    (path,) = (REPO / "notebooks").glob(f"{number}_*.py")
    tree = ast.parse(path.read_text(), path.name)
    chosen = {id(node): node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)}
    for name in names:
        found = [node for node in tree.body if name in _bound(node)]
        if len(found) != 1:
            raise LookupError(f"{path.name} binds {name!r} at the top level {len(found)} times, not once: "
                              "the tests read that definition from it, update the name there")
        chosen[id(found[0])] = found[0]
    namespace = {"__name__": f"notebook_{number}", **(given or {})}
    for node in sorted(chosen.values(), key=lambda node: node.lineno):  # line numbers stay the notebook's
        exec(compile(ast.Module([node], type_ignores=[]), str(path), "exec"), namespace)
    return SimpleNamespace(**namespace)


@functools.cache
def notebook_11():
    """Notebook 12's sizes, abstract state, rule tables and steps (its model from src/spmd_course/models.py)."""
    from spmd_course.models import MyTransformer

    return from_notebook("12", "D_MODEL", "FAST_COMPILE", "build", "abstract_model", "graphdef", "n_split",
                         "n_embed_only", "STRATEGIES", "train_step", "with_rules", "is_activation", "loss_only",
                         "double", given={"MyTransformer": MyTransformer})


@functools.cache
def notebook_12():
    """Notebook 13's wide model, its layouts and steps: the notebook's own definitions (``from_notebook``)."""
    return from_notebook("13", "D", "WIDE", "TOKENS", "Block", "Stack", "create", "loss_fn", "param_grad", "ZERO",
                         "layout", "pin", "make_step", "create_sharded", "abstract")


# --- the course's uv -------------------------------------------------------------------------------------------------


def find_uv() -> Path | None:
    """The course's bootstrapped uv (make puts it in <repo>/.uv), here or in the main checkout of a worktree."""
    roots = [REPO]
    common = subprocess.run(["git", "rev-parse", "--git-common-dir"], cwd=REPO, capture_output=True, text=True)
    if common.returncode == 0:
        roots.append((REPO / common.stdout.strip()).resolve().parent)
    return next((r / ".uv" / "bin" / "uv" for r in roots if (r / ".uv" / "bin" / "uv").is_file()), None)
