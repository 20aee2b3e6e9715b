"""The sharding explorer: its pure reports (every path, every error kind) and its widget."""

from __future__ import annotations

import html
import sys

import jax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from matplotlib.figure import Figure

from utils import explorer
from utils.drawing import tile_labels
from utils.explorer import (
    DEFAULTS,
    ERROR_KINDS,
    LayoutReport,
    MatmulReport,
    explore,
    layout_report,
    matmul_report,
    parse_axis_names,
    parse_shape,
    parse_spec,
)

MESH = ((4, 2), ("data", "model"))


# ----------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, spec",
    [
        ("P('data', None)", P("data", None)),
        ("PartitionSpec('data')", P("data")),
        ("jax.sharding.PartitionSpec('data', 'model')", P("data", "model")),
        ("jax.P(None, 'model')", P(None, "model")),
        ("'data', None", P("data", None)),
        ("data, model", P("data", "model")),
        ("('data','model'), None", P(("data", "model"), None)),
        ("P(('data', 'model'))", P(("data", "model"))),
        ("('data', 'model')", P("data", "model")),  # outer parentheses group the entries, as P(...) would
        ("[data, None]", P("data", None)),
        ("data", P("data")),
        ("None", P(None)),
        ("", P()),
        ("  P()  ", P()),
    ],
)
def test_parse_spec_reads_what_a_learner_types(text: str, spec: P) -> None:
    assert parse_spec(text) == spec


def test_parse_spec_accepts_real_objects() -> None:
    spec = P("data", None)
    assert parse_spec(spec) is spec
    assert parse_spec(None) == P()
    assert parse_spec(("data", None)) == P("data", None)
    assert parse_spec([("data", "model")]) == P(("data", "model"))


@pytest.mark.parametrize(
    "bad, words",
    [
        ("P('data'", "cannot read"),
        ("__import__('os').system('true')", "cannot read"),
        ("print('x')", "cannot read"),
        ("P('data', unreduced={'model'})", "keyword"),
        ("P(4, None)", "not a mesh axis name"),
        ("P((('data',),))", "tuple entry"),
        ("P(())", "tuple entry"),
        ("'data' + 'model'", "not a mesh axis name"),
        (4, "P('data', None)"),
        ((4,), "not a mesh axis name"),
    ],
)
def test_parse_spec_refuses_anything_else_with_the_fix(bad: object, words: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_spec(bad)
    assert words in str(err.value)


def test_parse_spec_never_evaluates_text(tmp_path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(ValueError):
        parse_spec(f"open({str(marker)!r}, 'w')")
    assert not marker.exists()


@pytest.mark.parametrize(
    "text, shape",
    [("128, 512", (128, 512)), ("(128, 512)", (128, 512)), ("[8]", (8,)), ("128x512", (128, 512)),
     ("4 2", (4, 2)), ("2 x 4", (2, 4)), ("", ()), (16, (16,)), ((4, 2), (4, 2)), ([3, 5, 7], (3, 5, 7))],
)
def test_parse_shape(text: object, shape: tuple[int, ...]) -> None:
    assert parse_shape(text) == shape


@pytest.mark.parametrize("bad", ["128, abc", "4, x", "x4", "1.5, 2", "0, 4", "-4", (4, "2"), (True,), True, 4.0, None])
def test_parse_shape_refuses_with_an_example(bad: object) -> None:
    with pytest.raises(ValueError, match=r"whole number|below 1|write it like"):
        parse_shape(bad)


@pytest.mark.parametrize(
    "text, names",
    [("data, model", ("data", "model")), ("('data', 'model')", ("data", "model")), ("x", ("x",)),
     (("data", "model"), ("data", "model")), ("", ())],
)
def test_parse_axis_names(text: object, names: tuple[str, ...]) -> None:
    assert parse_axis_names(text) == names


@pytest.mark.parametrize("bad", ["data, 2d", "data-1", ("data", 3), 7])
def test_parse_axis_names_refuses(bad: object) -> None:
    with pytest.raises(ValueError, match="name"):
        parse_axis_names(bad)


# ----------------------------------------------------------------- one array


def test_default_layout_report() -> None:
    r = layout_report(*MESH, "128, 512", "P('data', 'model')")
    assert isinstance(r, LayoutReport) and r.ok and r.error_kind is None and r.jax_error is None
    assert r.type_string == "f32[128@data,512@model]"
    assert r.mesh_shape == (4, 2) and r.axis_names == ("data", "model")
    assert r.shape == (128, 512) and r.spec == P("data", "model") and r.dtype == "float32"
    assert isinstance(r.sharding, NamedSharding) and r.sharding.mesh.devices.shape == (4, 2)
    assert r.bytes_per_device == {d: 32 * 256 * 4 for d in range(8)}
    assert r.allocated_bytes_per_device == 32 * 256 * 4 and r.array_bytes == 128 * 512 * 4
    assert "each of the 8 devices holds 32.0 KiB" in r.bytes_line()
    assert isinstance(r.figure, Figure)
    assert sorted(tile_labels(r.figure))[0].startswith("dev 0\n(32, 256)")
    page = r.to_html()
    assert "f32[128@data,512@model]" in page and "data:image/png;base64," in page and "shard table" in page
    assert "f32[128@data,512@model]" in str(r) and r._repr_html_() == page


def test_replicated_axes_are_named_and_counted() -> None:
    r = layout_report("4, 2", "data, model", (128, 512), "data")
    assert r.ok and r.type_string == "f32[128@data,512]"
    assert set(r.bytes_per_device.values()) == {32 * 512 * 4}
    assert "not sharded over 'model': every block has 2 copies" in r.notes
    assert "2x the array" in r.bytes_line()
    full = layout_report(*MESH, (128, 512), "")
    assert full.type_string == "f32[128,512]" and "8 copies" in full.notes[0]


def test_dtype_multi_axis_dimension_and_smaller_mesh() -> None:
    r = layout_report((2, 2), "data, model", "128, 512", "('data','model'), None", dtype="bfloat16")
    assert r.ok and r.type_string == "bf16[128@(data,model),512]"
    assert r.bytes_per_device == {d: 32 * 512 * 2 for d in range(4)}
    assert "the mesh uses the first 4 of the 8 devices" in r.notes


def test_devices_argument_picks_the_devices() -> None:
    devs = jax.devices()[4:]
    r = layout_report((2, 2), "a, b", (8, 8), "a, b", devices=devs)
    assert r.ok and set(r.bytes_per_device) == {4, 5, 6, 7}


def test_three_dimensional_array_and_scalar() -> None:
    r = layout_report(*MESH, (8, 16, 32), P("data", None, "model"))
    assert r.ok and r.type_string == "f32[8@data,16,32@model]" and isinstance(r.figure, Figure)
    s = layout_report(*MESH, "", "")
    assert s.ok and s.type_string == "f32[]" and set(s.bytes_per_device.values()) == {4}


def test_draw_false_skips_the_picture() -> None:
    r = layout_report(*MESH, (128, 512), "data", draw=False)
    assert r.ok and r.figure is None and "<img" not in r.to_html()


def test_eight_panels_draw_and_a_refused_picture_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    many = layout_report((4, 2), "a, b", (4, 2, 3, 4, 4), "a, b")  # one panel per block of dims 0 and 1
    assert many.ok and len(many.figure.axes) == 8

    def refuses(*args: object, **kw: object) -> None:
        raise ValueError("this layout needs 32 panels")

    monkeypatch.setattr(explorer, "draw_sharding", refuses)
    r = layout_report(*MESH, (128, 512), "data")
    assert r.ok and r.figure is None and "no picture: this layout needs 32 panels" in r.notes


# ----------------------------------------------------------------- one array: errors


def _error(r: LayoutReport | MatmulReport, kind: str) -> str:
    assert not r.ok and r.error_kind == kind, (r.error_kind, r.error)
    assert kind in ERROR_KINDS
    page = r.to_html()
    assert "Traceback" not in page and "explorer-error" in page
    return r.error or ""


def test_unknown_axis_is_explained_and_jax_agrees() -> None:
    r = layout_report(*MESH, (128, 512), "P('foo', None)")
    text = _error(r, "unknown-axis")
    assert "'foo'" in text and "('data', 'model')" in text and "Fix:" in text
    assert r.jax_error.startswith("ValueError: Resource axis: foo") and "not found in mesh" in r.jax_error
    assert r.figure is None and r.type_string is None and r.mesh_shape == (4, 2)
    assert "JAX says:" in r.to_html() and "Not a valid layout" in r.to_html()


def test_axis_used_twice() -> None:
    r = layout_report(*MESH, (128, 512), "P('data', 'data')")
    text = _error(r, "axis-reused")
    assert "at most one dimension" in text
    assert r.jax_error.startswith("DuplicateSpecError:")


def test_more_entries_than_dimensions() -> None:
    r = layout_report(*MESH, (128, 512), "P('data', None, None)")
    text = _error(r, "too-many-entries")
    assert "3 entries but the array has 2" in text and "P(None, None)" in text
    assert "only valid for values of rank at least 3" in r.jax_error


def test_uneven_layout_is_refused_but_still_described() -> None:
    r = layout_report(*MESH, (6, 512), "P('data', None)")
    text = _error(r, "uneven")
    assert "size 6" in text and "4 equal blocks" in text and "(jax.device_put, jit arguments" in text
    assert "padding every block to 2" in text and "such as 4 or 8" in text
    assert r.jax_error.startswith("IndivisibleError:") and "partitioned 4 times" in r.jax_error
    assert "This error occurs" not in r.jax_error
    # utils.layout still describes it: XLA's padding, the blocks, the bytes
    assert r.type_string == "f32[6@data,512]" and isinstance(r.figure, Figure)
    assert any(p.get_gid() == "padding" for ax in r.figure.axes for p in ax.patches)
    assert sorted(set(r.bytes_per_device.values())) == [0, 2 * 512 * 4]
    assert r.allocated_bytes_per_device == 2 * 512 * 4
    assert "with padding" in r.bytes_line()
    assert "<img" in r.to_html()


def test_mesh_bigger_than_the_devices() -> None:
    r = layout_report((4, 4), "data, model", (128, 512), "data")
    text = _error(r, "too-few-devices")
    assert "Not a valid mesh:" in r.to_html()
    assert "16 devices" in text and "only 8" in text and "(4, 2)" in text and "setup_devices(16)" in text
    assert r.jax_error == "ValueError: Number of devices 8 must be >= the product of mesh_shape (4, 4)"
    few = layout_report(*MESH, (128, 512), "data", devices=jax.devices()[:4])
    assert few.error_kind == "too-few-devices" and "only 4" in few.error and "setup_devices" not in few.error
    assert "(2, 2)" in few.error


@pytest.mark.parametrize(
    "mesh_shape, names, words",
    [
        ((4, 2), "data", "2 axes but 1 axis name ('data',)"),
        ((8,), "a, b", "1 axis but 2 axis names"),
        ((4, 2), "data, data", "used twice"),
        ("", "data", "empty"),
    ],
)
def test_mesh_and_names_that_do_not_fit(mesh_shape: object, names: str, words: str) -> None:
    r = layout_report(mesh_shape, names, (128, 512), "")
    assert words in _error(r, "mesh")


@pytest.mark.parametrize(
    "args, kw, words",
    [
        (("4, x", "data, model", "128, 512", "data"), {}, "mesh shape"),
        (("4, 2", "data, 2", "128, 512", "data"), {}, "axis name"),
        (("4, 2", "data, model", "128; 512", "data"), {}, "array shape"),
        (("4, 2", "data, model", "128, 512", "P(data"), {}, "cannot read"),
        (("4, 2", "data, model", "128, 512", "data"), {"dtype": "float33"}, "element type"),
    ],
)
def test_unparsable_text(args: tuple, kw: dict, words: str) -> None:
    r = layout_report(*args, **kw)
    assert words in _error(r, "unparsable") and "Cannot read this:" in r.to_html()


# ----------------------------------------------------------------- matmul


@pytest.mark.parametrize(
    "lhs, rhs, kind, out_spec",
    [
        (P("data", "model"), P(None, "model"), "all-gather", P("data", "model")),
        (P("data", "model"), P("model", None), "all-reduce", P("data")),
        (P("data", None), P(None, "model"), None, P("data", "model")),
        (P(None, "data"), P("data", None), "all-reduce", P()),
    ],
)
def test_the_four_classic_matmuls(lhs: P, rhs: P, kind: str | None, out_spec: P) -> None:
    r = matmul_report(*MESH, (512, 1024), lhs, (1024, 1024), rhs)
    assert isinstance(r, MatmulReport) and r.ok, r.error
    assert r.collectives.count() == (0 if kind is None else 1)
    if kind:
        assert r.collectives.count(kind) == 1
    assert r.out_shape == (512, 1024) and r.out_sharding.spec == out_spec
    assert r.out_type == explorer.type_string((512, 1024), r.out_sharding)
    assert isinstance(r.figure, Figure) and len(r.figure.axes) == 3
    assert r.memory is not None and r.memory.argument > 0
    page = r.to_html()
    assert html.escape(r.type_strings) in page and "data:image/png;base64," in page
    assert ("no collectives" in page) if kind is None else (kind in page)


def test_matmul_type_strings_bytes_and_reading() -> None:
    r = matmul_report("4, 2", "data, model", "512, 1024", "P('data', 'model')", "1024, 1024", "P('model', None)")
    assert r.type_strings == "f32[512@data,1024@model] @ f32[1024@model,1024] -> f32[512@data,1024]"
    assert r.bytes_per_device == {"x": 128 * 512 * 4, "w": 512 * 1024 * 4, "x @ w": 128 * 1024 * 4}
    assert any("partial sum" in n for n in r.notes)
    assert any("chosen by the compiler" in n for n in r.notes)
    gather = matmul_report(*MESH, (512, 1024), "P('data', 'model')", (1024, 1024), "P(None, 'model')")
    assert any("split differently" in n for n in gather.notes)
    none = matmul_report(*MESH, (512, 1024), "data", (1024, 1024), "None, model")
    assert any(n.startswith("No collectives") for n in none.notes)


def test_matmul_with_a_requested_result_layout() -> None:
    r = matmul_report(*MESH, (512, 1024), "P('data', 'model')", (1024, 1024), "P('model', None)",
                      out_spec="P('data', 'model')")
    assert r.ok and r.out_spec == P("data", "model") and r.out_sharding.spec == P("data", "model")
    assert r.out_type == "f32[512@data,1024@model]"
    assert not any("chosen by the compiler" in n for n in r.notes)
    assert r.collectives.count() >= 1
    blank = matmul_report(*MESH, (512, 1024), "data", (1024, 1024), "", out_spec="  ")
    assert blank.ok and blank.out_spec is None


def test_matmul_dtype_and_batched_operands() -> None:
    r = matmul_report(*MESH, (8, 512, 1024), "data", (1024, 256), "None, model", dtype="bfloat16")
    assert r.ok and r.type_strings.startswith("bf16[8@data,512,1024] @ bf16[1024,256@model]")
    assert r.out_shape == (8, 512, 256) and r.bytes_per_device["x"] == 2 * 512 * 1024 * 2
    v = matmul_report(*MESH, (1024,), "", (1024, 256), "None, model")
    assert v.ok and v.out_shape == (256,)


def test_matmul_contracting_dimensions_must_match() -> None:
    r = matmul_report(*MESH, (512, 1024), "data", (512, 1024), "")
    text = _error(r, "matmul-shapes")
    assert "contracting" in text and "1024" in text and "(1024, 1024)" in text
    assert r.jax_error.startswith("TypeError: dot_general requires contracting dimensions to have the same shape")
    assert r.lhs_type == "f32[512@data,1024]" and "Cannot compile this matmul" in r.to_html()


def test_matmul_batch_and_scalar_operands() -> None:
    r = matmul_report(*MESH, (3, 4, 16), "", (2, 16, 16), "")
    assert "broadcast" in _error(r, "matmul-shapes") and "Incompatible types" in r.jax_error
    s = matmul_report(*MESH, "", "", (16, 16), "")
    assert "at least 1 dimension" in _error(s, "matmul-shapes") and "ndim at least 1" in s.jax_error


def test_matmul_uneven_operand_and_result() -> None:
    r = matmul_report(*MESH, (6, 1024), "data", (1024, 1024), "")
    text = _error(r, "uneven")
    assert text.startswith("x (left operand): dimension 0 has size 6") and "jit argument" in text
    assert r.jax_error.startswith("IndivisibleError:") and isinstance(r.figure, Figure)
    out = matmul_report(*MESH, (6, 16), "", (16, 16), "", out_spec="P('data')")
    assert _error(out, "uneven").startswith("result: ") and "jit result" in out.error
    assert out.jax_error.startswith("IndivisibleError:") and "This error occurs" not in out.jax_error
    assert len(out.figure.axes) == 3


@pytest.mark.parametrize(
    "lhs_spec, rhs_spec, out_spec, kind, prefix",
    [
        ("P('foo')", "", None, "unknown-axis", "x (left operand): "),
        ("", "P('model', 'model')", None, "axis-reused", "w (right operand): "),
        ("", "", "P('data', None, None)", "too-many-entries", "result: "),
        ("", "", "P(data", "unparsable", "result: "),
        ("P(3)", "", None, "unparsable", "x (left operand): "),
    ],
)
def test_matmul_spec_errors_name_the_operand(lhs_spec: str, rhs_spec: str, out_spec: str | None, kind: str,
                                             prefix: str) -> None:
    r = matmul_report(*MESH, (512, 1024), lhs_spec, (1024, 1024), rhs_spec, out_spec=out_spec)
    assert _error(r, kind).startswith(prefix)


def test_matmul_mesh_errors() -> None:
    r = matmul_report((16,), "x", (512, 1024), "", (1024, 1024), "")
    assert "16 devices" in _error(r, "too-few-devices") and r.lhs_type is None


def test_matmul_compile_failure_is_quoted(monkeypatch: pytest.MonkeyPatch) -> None:
    real_jit = jax.jit

    def failing_jit(*args: object, **kw: object) -> object:
        compiled = real_jit(*args, **kw)

        class Refuses:
            def lower(self, *a: object) -> object:
                raise RuntimeError("XLA says no")

        return Refuses() if args and args[0] is jax.numpy.matmul else compiled

    monkeypatch.setattr(jax, "jit", failing_jit)
    r = matmul_report(*MESH, (512, 1024), "data", (1024, 1024), "")
    _error(r, "compile")
    assert r.jax_error == "RuntimeError: XLA says no"


# ----------------------------------------------------------------- the widget


def _page(ex: object) -> str:
    outputs = ex.output.outputs
    assert len(outputs) == 1 and outputs[0]["output_type"] == "display_data"
    return outputs[0]["data"]["text/html"]


def test_widget_shows_the_default_layout() -> None:
    import ipywidgets

    ex = explore()
    assert isinstance(ex, ipywidgets.Widget)
    assert ex.values() == DEFAULTS
    page = _page(ex)
    assert "f32[128@data,512@model]" in page and "data:image/png;base64," in page and "32.0 KiB" in page
    assert ex.report.ok and ex.report.type_string == "f32[128@data,512@model]"
    assert ex.output in ex.children


def test_widget_rerenders_on_every_change() -> None:
    ex = explore()
    c = ex.controls
    c["spec"].value = "P('data', None)"
    assert "f32[128@data,512]" in _page(ex) and "2 copies" in _page(ex)
    c["shape"].value = "256, 64"
    assert "f32[256@data,64]" in _page(ex)
    c["dtype"].value = "bfloat16"
    assert "bf16[256@data,64]" in _page(ex)
    c["mesh_shape"].value = "2, 4"
    c["axis_names"].value = "data, model"
    assert ex.report.mesh_shape == (2, 4) and "bf16[256@data,64]" in _page(ex)


def test_widget_explains_invalid_values_instead_of_a_traceback() -> None:
    ex = explore()
    ex.controls["spec"].value = "P('foo', None)"
    page = _page(ex)
    assert "explorer-error" in page and "&#x27;foo&#x27;" in page and "JAX says" in page
    assert "Traceback" not in page
    ex.controls["spec"].value = "P(data"
    assert "cannot read" in _page(ex)
    ex.controls["mesh_shape"].value = "4, 4"
    assert "16 devices" in _page(ex)
    ex.controls["mesh_shape"].value = "4, 2"
    ex.controls["spec"].value = "data, model"
    assert ex.report.ok and "explorer-error" not in _page(ex)


def test_widget_matmul_mode_shows_collectives() -> None:
    ex = explore()
    assert ex._matmul_box.layout.display == "none"
    ex.controls["mode"].value = "matmul"
    assert ex._array_box.layout.display == "none" and ex._matmul_box.layout.display is None
    page = _page(ex)
    assert "all-gather" in page and 'class="collectives"' in page
    assert ex.report.collectives.count("all-gather") == 1
    ex.controls["rhs_spec"].value = "P('model', None)"
    assert ex.report.collectives.count("all-reduce") == 1 and "all-reduce" in _page(ex)
    ex.controls["out_spec"].value = "P('data', 'model')"
    assert ex.report.out_type == "f32[512@data,1024@model]"
    ex.controls["rhs_shape"].value = "512, 1024"
    assert "contracting" in _page(ex) and "Traceback" not in _page(ex)


def test_widget_uses_the_given_devices() -> None:
    ex = explore(devices=jax.devices()[:4])
    assert ex.report.error_kind == "too-few-devices"
    ex.controls["mesh_shape"].value = "2, 2"
    assert ex.report.ok and set(ex.report.bytes_per_device) == {0, 1, 2, 3}


def test_an_unexpected_failure_is_shown_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = explore()

    def broken(*args: object, **kw: object) -> None:
        raise KeyError("bug")

    monkeypatch.setattr(explorer, "layout_report", broken)
    ex.controls["spec"].value = "data"
    assert "unexpected problem" in _page(ex) and "KeyError" in _page(ex) and ex.report is None


def test_without_ipywidgets_explore_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    explorer._explorer_class.cache_clear()
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets -> ImportError
    try:
        shown = explore()
        page = shown._repr_html_()
        assert "needs ipywidgets" in page and "pip install ipywidgets" in page
        assert "f32[128@data,512@model]" in page and "needs ipywidgets" in repr(shown)
    finally:
        explorer._explorer_class.cache_clear()
