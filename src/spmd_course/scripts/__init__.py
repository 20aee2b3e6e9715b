"""Notebook 21's multi-host job: ``spmd_worker.py``, the one script every process runs (it imports nothing from the
course, so it can be copied to any host), and ``launcher.py``, which starts the processes and watches them."""
