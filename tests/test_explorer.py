"""The layout explorer: what it reads from its text boxes, what it says, the fix it names, and its widget."""

from __future__ import annotations

import sys

import IPython.display
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P
from matplotlib.figure import Figure

from course_support import tile_labels
from spmd_course.utils.explorer import DEFAULTS, describe, explore, layout, parse_axis_names, parse_shape, parse_spec


@pytest.mark.parametrize("text, spec", [
    ("'data', None", P("data", None)),
    ("('data', 'model')", P(("data", "model"))),  # what goes inside P(...): one dimension over two axes
    ("('data', 'model'), None", P(("data", "model"), None)),
    ("data, model", P("data", "model")),
    ("P('data', None)", P("data", None)),
    ("PartitionSpec(None, 'model')", P(None, "model")),
    ("", P()),
    ("P()", P()),
])
def test_parse_spec_reads_the_inside_of_p(text: str, spec: P) -> None:
    assert parse_spec(text) == spec


@pytest.mark.parametrize("text, words", [
    ("('data', 'data')", "names a mesh axis twice"),
    ("4, 2", "is not an entry of P(...)"),
    ("None, ('data', None)", "is not an entry of P(...)"),
    ("()", "is not an entry of P(...)"),
    ("axis='data'", "cannot read"),
    ("*names", "cannot read"),
    ("P('data'", "cannot read"),
])
def test_parse_spec_refuses_with_the_fix(text: str, words: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_spec(text)
    assert words in str(err.value) and ("write" in str(err.value) or "list each axis once" in str(err.value))


def test_parse_spec_never_evaluates_text(tmp_path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(ValueError):
        parse_spec(f"open({str(marker)!r}, 'w')")
    assert not marker.exists()


@pytest.mark.parametrize("text, shape", [("128, 512", (128, 512)), ("(8,)", (8,)), ("", ()), ("0, 5", (0, 5))])
def test_parse_shape(text: str, shape: tuple[int, ...]) -> None:
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text, words", [("128x512", "whole numbers"), ("1.5", "whole numbers"), ("-1", "negative")])
def test_parse_shape_refuses(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_shape(text)


def test_parse_axis_names() -> None:
    assert parse_axis_names("data, model") == parse_axis_names("('data', 'model')") == ("data", "model")
    with pytest.raises(ValueError, match="not a plain name"):
        parse_axis_names("data-parallel")


def test_layout_is_a_struct_on_an_auto_mesh_of_the_first_devices() -> None:
    x = layout("2, 2", "data, model", "128, 512", "'data', 'model'", "bfloat16")
    assert isinstance(x, jax.ShapeDtypeStruct) and x.shape == (128, 512) and x.dtype == jnp.bfloat16
    assert x.sharding.spec == P("data", "model") and dict(x.sharding.mesh.shape) == {"data": 2, "model": 2}
    assert list(x.sharding.mesh.devices.flat) == jax.devices()[:4]
    picked = jax.devices()[::-1][:2]
    assert list(layout("2", "data", "8", "data", devices=picked).sharding.mesh.devices.flat) == picked


@pytest.mark.parametrize("args, words", [
    (("4, 2", "data", "8", ""), "give one name per size"),
    (("4, 2", "data, data", "8", ""), "repeat a name"),
    (("4, 0", "data, model", "8", ""), "at least 1"),
    (("16, 2", "data, model", "8", ""), "at most 8, such as 8, 1"),
    (("4, 2", "data, model", "8", "'expert'"), "does not have"),
    (("4, 2", "data, model", "8, 8", "'data', 'data'"), "at most one dimension"),
    (("4, 2", "data, model", "8", "'data', 'model'"), "at most one entry per dimension"),
    (("4, 2", "data, model", "8", "'data'", "object"), "numeric element type"),
    (("4, 2", "data, model", "8", "'data'", "str"), "numeric element type"),
    (("4, 2", "data, model", "8", "'data'", "float33"), "numeric element type"),
    (("4, 2", "data, model", "8", "'data'", ""), "numeric element type"),
    (("4, 2", "data, model", "8", "'data'", None), "numeric element type"),  # jnp.dtype(None) would be float64
    (("4, 2", "data, model", "8", "'data'", "i4"), "int4 in JAX's type strings but int32 to numpy: write int4"),
    (("4, 2", "data, model", "8", "'data'", "u8"), "uint8 in JAX's type strings but uint64 to numpy"),
    (("4, 2", "data, model", "8, 8", "('data', 'data')"), "names a mesh axis twice: list each axis once"),
])
def test_layout_refuses_what_does_not_fit_and_names_the_fix(args: tuple[str, ...], words: str) -> None:
    if jax.device_count() != 8 and "such as 8" in words:
        pytest.skip("the suggestion depends on the device count")
    with pytest.raises(ValueError, match=words):
        layout(*args)


def test_layout_without_devices_says_how_to_get_them() -> None:
    for none in ([], ()):  # not "at most 0 devices, such as (1, 1)"
        with pytest.raises(ValueError, match=r"no devices were given: leave devices out to use jax\.devices"):
            layout("1", "data", "8", "", devices=none)


def test_an_axis_named_twice_is_named_in_the_message_not_as_dimensions_0_and_0() -> None:
    with pytest.raises(ValueError) as err:
        layout("4, 2", "data, model", "8", "P(('data', 'data'))")
    assert "('data', 'data') names a mesh axis twice" in str(err.value) and "dimensions" not in str(err.value)


@pytest.mark.parametrize("dtype", ["bfloat16", " bfloat16 ", "bf16", "jnp.bfloat16", jnp.bfloat16,
                                   jnp.dtype("bfloat16")])
def test_layout_reads_a_dtype_as_numpy_or_the_type_string_names_it(dtype: object) -> None:
    assert layout("4, 2", "data, model", "8", "'data'", dtype).dtype == jnp.bfloat16  # type: ignore[arg-type]


def test_a_64_bit_type_is_what_jax_makes_of_it() -> None:
    with pytest.warns(UserWarning, match="float64"):  # JAX warns as it narrows the type
        made = jnp.zeros(8, "float64").dtype
    x = layout("4, 2", "data, model", "8", "'data'", "float64")
    assert made == x.dtype == jnp.float32 and describe(x).startswith("f32[8@data]\n")
    with jax.enable_x64(True):
        assert layout("4, 2", "data, model", "8", "'data'", "float64").dtype == jnp.float64


def test_a_zero_size_dimension_is_laid_out_as_jax_lays_it_out() -> None:
    x = layout("4, 2", "data, model", "0, 5", "'data'")
    placed = jax.device_put(jnp.zeros((0, 5)), x.sharding)  # JAX allows it, so the explorer does too
    assert placed.sharding.shard_shape(placed.shape) == x.sharding.shard_shape(x.shape) == (0, 5)
    assert describe(x) == "f32[0@data,5]\neach of the 8 devices holds 0 B: 0x the 0 B array in all"


def test_describe_gives_the_type_string_and_bytes_per_device() -> None:
    assert describe(layout(**{k: DEFAULTS[k] for k in ("mesh_shape", "axis_names", "shape", "spec")})) == (
        "f32[128@data,512@model]\neach of the 8 devices holds 32.0 KiB: 1x the 256.0 KiB array in all")
    replicated = describe(layout("4, 2", "data, model", "128, 512", "'data'"))
    assert replicated.endswith("holds 64.0 KiB: 2x the 256.0 KiB array in all")
    assert describe(layout("4, 2", "data, model", "0, 5", "'data'")).startswith("f32[0@data,5]\n")


def test_describe_prices_int4_at_half_a_byte_and_names_an_uneven_dimension() -> None:
    x = layout("4", "data", "6, 4", "'data'", "int4")
    ids = [d.id for d in x.sharding.mesh.devices.flat]  # block i sits on the mesh's i-th device
    text = describe(x).splitlines()
    assert text[0] == "i4[6@data,4]"  # as jax.typeof(...).str_short(short_dtypes=True) writes int4
    assert text[1] == (f"devices {sorted(ids[:3])} hold 4 B each; devices [{ids[3]}] hold 0 B each: 1x the 12 B "
                       "array in all (4 bits an element, packed; a block rounds up to whole bytes)")
    assert text[2].startswith("dimension 0 (6) does not split into 4 equal blocks")
    assert text[2].endswith("XLA pads every block to 2")


@pytest.mark.parametrize("mesh, shape, spec, per_device, total", [
    ("4", "4, 3", "'data'", "each of the 4 devices holds 2 B", "1.33x the 6 B array"),  # 3 int4 = 1.5 B -> 2 B
    ("1", "7", "", "each of the 1 devices holds 4 B", "1x the 4 B array"),  # 7 int4 = 3.5 B -> 4 B
])
def test_int4_blocks_round_up_to_whole_bytes_as_compiled(mesh: str, shape: str, spec: str, per_device: str,
                                                         total: str) -> None:
    x = layout(mesh, "data", shape, spec, "int4")
    assert describe(x).splitlines()[1].startswith(f"{per_device}: {total} in all")
    held = int(per_device.split()[-2])
    made = jax.jit(lambda: jnp.zeros(x.shape, x.dtype), out_shardings=x.sharding).lower().compile()
    assert made.memory_analysis().output_size_in_bytes == held  # what XLA's program holds on each device
    assert jnp.zeros(x.shape, x.dtype).nbytes == x.size  # while jax.Array.nbytes counts 1 B per int4


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """What the explorer displays (its figures); what it prints goes to capsys."""
    displayed: list[object] = []
    monkeypatch.setattr(IPython.display, "display", displayed.append)
    return displayed


def test_widget_shows_the_default_layout_and_follows_every_edit(shown: list[object], capsys) -> None:
    ui = explore()
    boxes = {box.description: box for box in ui.kwargs_widgets if hasattr(box, "continuous_update")}
    assert list(boxes) == ["mesh shape", "axis names", "array shape", "dtype", "P( ... )"]
    assert not any(box.continuous_update for box in boxes.values())  # read on Enter, not on every key
    assert "f32[128@data,512@model]" in capsys.readouterr().out
    assert isinstance(shown[-1], Figure) and len(tile_labels(shown[-1])) == 8
    boxes["P( ... )"].value = "('data', 'model')"
    assert "f32[128@(data,model),512]" in capsys.readouterr().out and len(tile_labels(shown[-1])) == 8
    boxes["P( ... )"].value = "'data', 'data'"
    out = capsys.readouterr().out.split("\r")[-1]  # after clear_output's terminal codes
    assert out.startswith("Cannot show this layout: ") and len(out.strip().splitlines()) == 1 and len(shown) == 2


def test_widget_says_when_a_64_bit_type_becomes_32_bit(shown: list[object], capsys) -> None:
    ui = explore()
    capsys.readouterr()
    next(box for box in ui.kwargs_widgets if getattr(box, "description", "") == "dtype").value = "float64"
    out = capsys.readouterr().out
    assert "f32[128@data,512@model]" in out and "float64 becomes float32 because jax_enable_x64 is off" in out


def test_widget_uses_the_given_devices(shown: list[object], capsys) -> None:
    explore(devices=jax.devices()[:2])
    assert "needs 8 devices but 2 are here" in capsys.readouterr().out and not shown


def test_without_ipywidgets_explore_says_how_and_shows_the_default(shown, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets -> ImportError
    assert explore() is None
    out = capsys.readouterr().out
    assert "pip install ipywidgets" in out and "f32[128@data,512@model]" in out and isinstance(shown[0], Figure)
