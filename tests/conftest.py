"""Test setup: 8 simulated CPU devices before anything starts JAX (pyproject puts the repo on sys.path)."""

import matplotlib

matplotlib.use("Agg")

from utils.devices import setup_devices

setup_devices(8, quiet=True)
