"""Test setup: 8 simulated CPU devices before anything starts JAX, and the repo on sys.path."""

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from utils.devices import setup_devices  # noqa: E402

setup_devices(8, quiet=True)
