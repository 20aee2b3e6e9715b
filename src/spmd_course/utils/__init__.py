"""The course's shared helpers: infrastructure only, never a wrapper around the sharding APIs being taught.

- ``devices``: :func:`setup_devices`, the one call of every setup cell;
- ``launch``: readying Colab (and Binder's memory note) before the setup cell starts JAX;
- ``layout``, ``drawing``, ``inspecting``: the geometry, pictures, collectives and memory of a sharding;
- ``timing``: a step's estimated time, op by op, from the compiled program and a chip's published figures;
- ``step_pictures``: that estimate drawn as a timeline (a time axis, a lane per mesh axis), a roofline, and
  stacked bars of its terms;
- ``capture``: C++ output kept out of a cell; ``tpu``: whether TPU programs compile here;
- ``effort``: :func:`compile_effort`, the compiler's effort for the compiles inside a ``with`` block;
- ``exercises``: self-checking exercises; ``explorer``: text boxes to try layouts in.

Names load lazily (PEP 562): ``from spmd_course.utils import setup_devices`` imports ``utils.devices`` alone, so
the setup cell can install packages before numpy or JAX load. The names are written once, as the ``TYPE_CHECKING``
imports.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the one list of exported names: type checkers and editors read it, the loader below parses it
    from .capture import quiet as quiet
    from .devices import DeviceCountError as DeviceCountError
    from .devices import assert_close as assert_close
    from .devices import setup_devices as setup_devices
    from .drawing import draw_memory as draw_memory
    from .drawing import draw_mesh as draw_mesh
    from .drawing import draw_permute as draw_permute
    from .drawing import draw_pipeline as draw_pipeline
    from .drawing import draw_ring_steps as draw_ring_steps
    from .drawing import draw_routing as draw_routing
    from .drawing import draw_sharding as draw_sharding
    from .drawing import draw_shardings as draw_shardings
    from .effort import compile_effort as compile_effort
    from .exercises import NOT_ANSWERED as NOT_ANSWERED
    from .exercises import Exercise as Exercise
    from .exercises import answer_errors as answer_errors
    from .explorer import explore as explore
    from .inspecting import collectives as collectives
    from .inspecting import compile_with_log as compile_with_log
    from .inspecting import format_bytes as format_bytes
    from .inspecting import memory_per_device as memory_per_device
    from .inspecting import memory_spaces as memory_spaces
    from .inspecting import schedule as schedule
    from .inspecting import shard_table as shard_table
    from .layout import tiles as tiles
    from .layout import type_string as type_string
    from .step_pictures import draw_roofline as draw_roofline
    from .step_pictures import draw_step_terms as draw_step_terms
    from .step_pictures import draw_timeline as draw_timeline
    from .timing import CHIPS as CHIPS
    from .timing import Chip as Chip
    from .timing import StepEstimate as StepEstimate
    from .timing import TimedOp as TimedOp
    from .timing import chip_of as chip_of
    from .timing import collective_seconds as collective_seconds
    from .timing import estimate_step as estimate_step
    from .tpu import tpu_compiler_available as tpu_compiler_available


def _exported() -> dict[str, str]:
    """Each exported name and its submodule, parsed from the ``TYPE_CHECKING`` imports (as ``lazy_loader``'s stubs)."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return {alias.asname or alias.name: str(node.module) for node in block.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}


_MODULE_OF = _exported()
_SUBMODULES = frozenset({*_MODULE_OF.values(), "launch"})
__all__ = sorted(_MODULE_OF)  # every name the lazy loader serves


def __getattr__(name: str) -> Any:
    """Load an exported name (or a submodule) the first time it is asked for."""
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})
