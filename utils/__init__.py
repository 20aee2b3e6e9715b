"""The course's shared helpers: infrastructure only, never a wrapper around the
sharding APIs being taught (notebooks call ``jax.make_mesh``, ``NamedSharding``
and ``jax.device_put`` themselves).

- ``devices``: :func:`setup_devices`, the one call of every setup cell;
- ``launch``: readying Colab (and Binder's memory note) before the setup cell starts JAX;
- ``layout``, ``drawing``, ``inspecting``: the geometry, pictures, collectives and memory of a sharding;
- ``timing``: a step's estimated time, op by op, from the compiled program and a chip's published figures;
- ``step_pictures``: that estimate drawn as a timeline (a time axis, a lane per mesh axis) and a roofline;
- ``capture``: C++ output kept out of a cell; ``tpu``: whether TPU programs compile here;
- ``effort``: :func:`compile_effort`, the compiler's effort for the compiles inside a ``with`` block;
- ``exercises``: self-checking exercises; ``explorer``: text boxes to try layouts in.

Names load lazily (PEP 562): ``from utils import setup_devices`` imports
``utils.devices`` and nothing else, so the setup cell can install packages
(``utils.launch``) before numpy, matplotlib or JAX are imported in the kernel.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy loader below returns, for type checkers and editors
    from .capture import quiet
    from .devices import DeviceCountError, assert_close, setup_devices
    from .drawing import (
        draw_memory,
        draw_mesh,
        draw_permute,
        draw_pipeline,
        draw_ring_steps,
        draw_routing,
        draw_schedule,
        draw_sharding,
        draw_shardings,
    )
    from .effort import compile_effort
    from .exercises import NOT_ANSWERED, Exercise, answer_errors
    from .explorer import explore
    from .inspecting import collectives, compile_with_log, format_bytes, memory_per_device, memory_spaces, shard_table
    from .inspecting import schedule as schedule
    from .layout import tiles, type_string
    from .step_pictures import draw_roofline, draw_timeline
    from .timing import CHIPS, Chip, StepEstimate, TimedOp, chip_of, collective_seconds, estimate_step
    from .tpu import tpu_compiler_available

_SOURCES = {
    "devices": ("DeviceCountError", "assert_close", "setup_devices"),
    "drawing": ("draw_memory", "draw_mesh", "draw_permute", "draw_pipeline", "draw_ring_steps", "draw_routing",
                "draw_schedule", "draw_sharding",
                "draw_shardings"),
    "capture": ("quiet",),
    "effort": ("compile_effort",),
    "exercises": ("NOT_ANSWERED", "Exercise", "answer_errors"),
    "tpu": ("tpu_compiler_available",),
    "explorer": ("explore",),
    "inspecting": (
        "collectives", "compile_with_log", "format_bytes", "memory_per_device", "memory_spaces", "schedule",
        "shard_table",
    ),
    "layout": ("tiles", "type_string"),
    "step_pictures": ("draw_roofline", "draw_timeline"),
    "timing": ("CHIPS", "Chip", "StepEstimate", "TimedOp", "chip_of", "collective_seconds", "estimate_step"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}
_SUBMODULES = frozenset({*_SOURCES, "launch"})

__all__ = [  # every name the lazy loader serves
    "CHIPS", "NOT_ANSWERED", "Chip", "DeviceCountError", "Exercise", "StepEstimate", "TimedOp", "answer_errors",
    "assert_close", "chip_of", "collective_seconds", "collectives", "compile_effort", "compile_with_log",
    "draw_memory", "draw_mesh", "draw_permute", "draw_pipeline", "draw_ring_steps", "draw_roofline", "draw_routing",
    "draw_schedule", "draw_sharding", "draw_shardings", "draw_timeline", "estimate_step", "explore", "format_bytes",
    "memory_per_device", "memory_spaces", "quiet", "schedule", "setup_devices", "shard_table", "tiles",
    "tpu_compiler_available", "type_string"
]


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
