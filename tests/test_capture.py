"""quiet(): C++ output on file descriptors 1 and 2 and Python prints, caught and handed back."""

import ctypes
import os
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils.capture import Captured, quiet

MESH = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def test_quiet_catches_descriptors_and_python_streams_in_order(capfd):
    with quiet() as out:
        print("python stdout")
        os.write(2, b"C++ stderr\n")
        print("python stderr", file=sys.stderr)
        os.write(1, b"C++ stdout\n")
    assert out.text == "python stdout\nC++ stderr\npython stderr\nC++ stdout\n"
    assert capfd.readouterr() == ("", "")
    print("after")  # the streams are back
    assert capfd.readouterr().out == "after\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="calls the C library's puts")
def test_quiet_flushes_buffered_c_stdio(capfd):
    with quiet() as out:
        ctypes.CDLL(None).puts(b"from printf's buffer")
    assert out.text == "from printf's buffer\n" and capfd.readouterr() == ("", "")


def test_quiet_keeps_the_text_when_the_block_raises(capfd):
    with pytest.raises(RuntimeError, match="boom"), quiet() as out:
        os.write(2, b"said before failing\n")
        raise RuntimeError("boom")
    assert out.text == "said before failing\n" and capfd.readouterr() == ("", "")


def test_quiet_nests():
    with quiet() as outer:
        print("outer")
        with quiet() as inner:
            os.write(1, b"inner\n")
        print("outer again")
    assert inner.text == "inner\n" and outer.text == "outer\nouter again\n"


def test_captured_starts_empty():
    assert Captured().text == ""


def test_quiet_hides_the_location_jax_prints_before_an_indivisible_error(capfd):
    """jax 0.12.0.1 prints a bare source location (from jax/_src/pjit.py line 859) on stdout, then raises."""
    uneven = NamedSharding(MESH, P("data"))  # 6 rows over 4 devices
    printed_by_jax = jax.__version__ == "0.12.0.1"
    with pytest.raises(ValueError, match="partitioned 4 times"):
        jax.device_put(jnp.ones((6, 8)), uneven)
    leaked = capfd.readouterr().out
    assert (os.path.basename(__file__) in leaked) == printed_by_jax  # the stray line, without quiet()
    with pytest.raises(ValueError, match="partitioned 4 times"), quiet() as out:
        jax.device_put(jnp.ones((6, 8)), uneven)
    assert capfd.readouterr() == ("", "")  # hidden from the notebook...
    assert (os.path.basename(__file__) in out.text) == printed_by_jax  # ...and kept in out
