"""The course's shared helpers: infrastructure only, never a wrapper around the
sharding APIs being taught (notebooks call ``jax.make_mesh``, ``NamedSharding``
and ``jax.device_put`` themselves).

- ``devices``: :func:`setup_devices`, the one call of every setup cell;
- ``layout``: the geometry of a sharding (blocks, devices, type strings);
- ``drawing``: matplotlib pictures of shardings and meshes;
- ``inspecting``: collectives and memory of compiled programs, shard tables;
- ``exercises``: self-checking exercises;
- ``course``: where the course lives and how its notebooks start.
"""

from .devices import DeviceCountError, DeviceSetup, setup_devices
from .drawing import device_color, draw_mesh, draw_sharding, draw_shardings, mesh_labels, tile_labels
from .exercises import NOT_ANSWERED, Exercise
from .inspecting import collectives, compile_with_log, format_bytes, memory_per_device, shard_table
from .layout import tiles, type_string

__all__ = [
    "NOT_ANSWERED",
    "DeviceCountError",
    "DeviceSetup",
    "Exercise",
    "collectives",
    "compile_with_log",
    "device_color",
    "draw_mesh",
    "draw_sharding",
    "draw_shardings",
    "format_bytes",
    "memory_per_device",
    "mesh_labels",
    "setup_devices",
    "shard_table",
    "tile_labels",
    "tiles",
    "type_string",
]
