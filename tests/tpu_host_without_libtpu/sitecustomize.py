"""Both hooks at once: an 8-chip TPU host's device order (``tests/tpu_device_order``) and libtpu hidden
(``tests/no_libtpu``), in this process and in every Python process it starts with the same environment.

Python imports only the first ``sitecustomize`` on its path, so this one runs the other two. Used by
``tests/test_device_order.py``, whose notebook pass checks both in one run of each notebook.
"""

import runpy
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
for _folder in ("no_libtpu", "tpu_device_order"):  # libtpu hidden first; the order hook then finds jax through it
    runpy.run_path(str(TESTS / _folder / "sitecustomize.py"), run_name=f"sitecustomize_{_folder}")
