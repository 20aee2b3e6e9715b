"""Hide libtpu from a Python process, as on a machine where it cannot be installed (macOS, Windows).

Put this folder first on ``PYTHONPATH``: Python imports ``sitecustomize`` at start-up, and from then on
``importlib.util.find_spec("libtpu")`` is ``None`` and ``import libtpu`` fails, in that process and in
every Python process it starts with the same environment. Used by ``tests/test_device_order.py``
(through ``tests/tpu_host_without_libtpu``).
"""

import sys


class _HideLibtpu:
    """Wraps one finder of ``sys.meta_path``; it finds everything the wrapped finder finds, but libtpu."""

    def __init__(self, finder):
        self._finder = finder

    def find_spec(self, name, path=None, target=None):
        if name == "libtpu" or name.startswith("libtpu."):
            return None
        return self._finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self._finder, attr)


sys.meta_path[:] = [_HideLibtpu(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
