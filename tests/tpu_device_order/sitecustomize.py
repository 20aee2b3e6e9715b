"""Make the simulated CPU devices come out of ``jax.make_mesh`` in an 8-chip TPU host's order.

On a TPU v5e-8 or v6e-8 host, ``jax.make_mesh`` and ``mesh_utils.create_device_mesh`` lay the 8 chips
out as a ring: the flat device list is ``[0, 1, 2, 3, 7, 6, 5, 4]`` for every mesh shape ((8,), (4, 2),
(2, 4), (2, 2, 2), ...); on a v3-8 (Kaggle's free TPU) it is ``[0, 1, 2, 3, 6, 7, 4, 5]``. On CPU both
keep id order, so code that types device ids passes on a laptop and fails on those hosts.

Put this folder first on ``PYTHONPATH`` and set ``SPMD_COURSE_DEVICE_ORDER`` to ``v5e`` or ``v3``:
Python imports ``sitecustomize`` at start-up, and from then on, in that process and in every Python
process it starts with the same environment, ``create_device_mesh`` (which ``jax.make_mesh`` calls)
permutes any 8-CPU-device result the way that host does, whatever the mesh shape. Meshes of TPU
devices (topology descriptions) and of other sizes are left alone. Used by ``tests/test_device_order.py``.
"""

import functools
import os
import sys

ORDERS = {"v5e": (0, 1, 2, 3, 7, 6, 5, 4), "v3": (0, 1, 2, 3, 6, 7, 4, 5)}
ORDER = ORDERS[os.environ.get("SPMD_COURSE_DEVICE_ORDER", "v5e")]
PATCHED = "jax._src.mesh_utils"  # jax.make_mesh looks create_device_mesh up there at each call


def _permuted(create_device_mesh):
    @functools.wraps(create_device_mesh)
    def wrapper(*args, **kwargs):
        grid = create_device_mesh(*args, **kwargs)
        if grid.size == len(ORDER) and all(d.platform == "cpu" for d in grid.flat):
            grid = grid.reshape(-1)[list(ORDER)].reshape(grid.shape)
        return grid

    wrapper.device_order = ORDER  # lets a test see that the hook is in place
    return wrapper


class _PatchAfterLoad:
    """A finder that lets the others find ``jax._src.mesh_utils`` and wraps its loader to patch it."""

    def find_spec(self, name, path=None, target=None):
        if name != PATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader.exec_module = _then_patch(spec.loader.exec_module)
                return spec
        return None


def _then_patch(exec_module):
    def exec_and_patch(module):
        exec_module(module)
        module.create_device_mesh = _permuted(module.create_device_mesh)

    return exec_and_patch


sys.meta_path.insert(0, _PatchAfterLoad())
