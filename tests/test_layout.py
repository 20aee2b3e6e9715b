"""Layout geometry: blocks agree with JAX, uneven blocks pad like XLA, bad input says what to fix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from course_support import V5E_ORDER, v5e_ordered_mesh
from spmd_course.utils.layout import (
    as_layout,
    check_spec,
    pending_marker,
    short_dtype,
    spec_entries,
    tiles,
    type_string,
)

MESH = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
MESH3 = jax.make_mesh((2, 2, 2), ("data", "model", "pipeline"), axis_types=(AxisType.Auto,) * 3)

SPECS_2D = [P(), P("data"), P(None, "model"), P("data", "model"), P("model", "data"), P(("data", "model")),
            P(("model", "data"), None), P(None, ("data", "model"))]


def _jax_blocks(shape, sharding):
    groups = {}
    for dev, idx in sharding.devices_indices_map(shape).items():
        key = tuple((s.start or 0, s.stop if s.stop is not None else n) for s, n in zip(idx, shape, strict=True))
        groups.setdefault(key, set()).add(dev.id)
    return groups


@pytest.mark.parametrize("spec", SPECS_2D, ids=str)
def test_tiles_match_jax_on_even_layouts(spec):
    shape = (16, 32)
    sharding = NamedSharding(MESH, spec)
    ours = {tuple(zip(t.start, t.stop, strict=True)): set(t.devices) for t in tiles(shape, sharding)}
    assert ours == _jax_blocks(shape, sharding)


@pytest.mark.parametrize("spec", [P(None, "data", "model"), P("pipeline", ("data", "model")), P("model")], ids=str)
def test_tiles_match_jax_in_3d(spec):
    shape = (4, 8, 16)
    sharding = NamedSharding(MESH3, spec)
    ours = {tuple(zip(t.start, t.stop, strict=True)): set(t.devices) for t in tiles(shape, sharding)}
    assert ours == _jax_blocks(shape, sharding)


def test_non_named_sharding_uses_jax_map():
    single = jax.sharding.SingleDeviceSharding(jax.devices()[3])
    (t,) = tiles((4, 4), single)
    assert t.devices == (3,) and t.shape == (4, 4) and not t.is_uneven


def test_uneven_dimension_pads_like_xla():
    got = tiles((10,), NamedSharding(MESH, P("data")))
    assert [t.shape for t in got] == [(3,), (3,), (3,), (1,)]
    assert all(t.padded == (3,) for t in got)
    assert [t.is_uneven for t in got] == [False, False, False, True]
    assert got[-1].devices == (6, 7) and got[-1].index_string() == "[9:10]"


def test_block_can_be_empty_when_very_uneven():
    got = tiles((5,), NamedSharding(jax.make_mesh((8,), ("x",), axis_types=(AxisType.Auto,)), P("x")))
    assert [t.shape[0] for t in got] == [1, 1, 1, 1, 1, 0, 0, 0]


def test_spec_entries_fill_trailing_dims():
    assert spec_entries(P("data"), 3) == [("data",), (), ()]
    assert spec_entries(P(("data", "model"), None), 2) == [("data", "model"), ()]
    with pytest.raises(ValueError, match="not a mesh axis name"):
        spec_entries(P(3), 1)


def test_check_spec_errors_name_the_fix():
    axes = dict(MESH.shape)
    missing = r"mesh axis 'batch', which this mesh does not have; its axes are \('data', 'model'\)"
    with pytest.raises(ValueError, match=missing):
        check_spec(P("batch"), axes, 2)
    with pytest.raises(ValueError, match=r"uses mesh axis 'data' for dimensions 0 and 1.*at most one dimension"):
        check_spec(P("data", "data"), axes, 2)
    with pytest.raises(ValueError, match=r"has 3 entries but the array has 2 dimension\(s\).*P\(None, None\)"):
        check_spec(P("data", None, None), axes, 2)
    with pytest.raises(TypeError, match="expected a PartitionSpec"):
        check_spec(("data", None), axes, 2)


def test_as_layout_accepts_arrays_structs_and_shapes():
    x = jax.device_put(jnp.ones((8, 4), jnp.bfloat16), NamedSharding(MESH, P("data")))
    assert as_layout(x)[:2] == ((8, 4), jnp.bfloat16)
    s = jax.ShapeDtypeStruct((8, 4), jnp.int32, sharding=NamedSharding(MESH, P("data")))
    assert as_layout(s)[0] == (8, 4)
    shape, _, sh = as_layout((8, 4), P("data"), mesh=MESH)
    assert shape == (8, 4) and sh.spec == P("data")
    with jax.set_mesh(MESH):
        assert as_layout((8, 4), P(None, "model"))[2].mesh.shape == MESH.shape


@pytest.mark.parametrize(
    "args,exc,message",
    [
        (([1.0, 2.0],), TypeError, "Convert with jnp.asarray"),
        ((np.ones(3),), TypeError, "got ndarray"),
        (("x",), TypeError, "shape tuple"),
        (((8, 4),), ValueError, r"pass sharding=NamedSharding\(mesh, P\(...\)\)"),
        (((8, -1), NamedSharding(MESH, P())), ValueError, "negative dimension"),
        (((8, 4), P("data")), ValueError, r"needs a mesh: pass mesh=..."),
        (((8, 4), "data"), TypeError, "expected a jax.sharding.Sharding"),
        (((8, 4), NamedSharding(MESH, P("data", None, None))), ValueError, "has 3 entries"),
        ((jax.ShapeDtypeStruct((4,), jnp.float32),), ValueError, "has no sharding"),
    ],
)
def test_as_layout_bad_input(args, exc, message):
    with pytest.raises(exc, match=message):
        as_layout(*args)


def test_type_string_matches_the_course_notation():
    x = jax.device_put(jnp.ones((128, 512)), NamedSharding(MESH, P("data", "model")))
    assert type_string(x) == "f32[128@data,512@model]"
    assert type_string((16, 8), NamedSharding(MESH, P(("data", "model")))) == "f32[16@(data,model),8]"
    assert type_string((16, 8), NamedSharding(MESH, P()), dtype=jnp.bfloat16) == "bf16[16,8]"
    assert type_string((3,), jax.sharding.SingleDeviceSharding(jax.devices()[0]), dtype=np.int32) == "i32[3]"


def test_type_string_agrees_with_typeof_on_explicit_meshes():
    emesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    for spec in [P("data"), P(None, "model"), P(("model", "data"))]:
        x = jax.device_put(jnp.ones((16, 8)), NamedSharding(emesh, spec))
        assert type_string(x) == str(jax.typeof(x)).replace("float32", "f32")


def test_pending_sums_are_written_as_jax_typeof_prints_them():
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    cases = [(P("data", "model"), P("model", None), P("data", None, unreduced={"model"})),
             (P(None, ("data", "model")), P(("data", "model"), None), P(None, None, unreduced={"model", "data"}))]
    seen = []

    def f(a, b, out):
        c = jnp.matmul(a, b, out_sharding=out)
        seen.append((str(jax.typeof(c)), type_string(c.shape, NamedSharding(mesh, jax.typeof(c).sharding.spec))))
        return a

    with jax.set_mesh(mesh):
        for sa, sb, out in cases:
            a = jax.ShapeDtypeStruct((16, 32), jnp.float32, sharding=NamedSharding(mesh, sa))
            b = jax.ShapeDtypeStruct((32, 8), jnp.float32, sharding=NamedSharding(mesh, sb))
            jax.jit(f, static_argnums=2).lower(a, b, out)
    assert [typeof for typeof, _ in seen] == ["float32[16@data,8]{U:model}", "float32[16,8]{U:(data,model)}"]
    assert [ours for _, ours in seen] == ["f32[16@data,8]{U:model}", "f32[16,8]{U:(data,model)}"]
    assert pending_marker(("model",)) == "{U:model}" and pending_marker(()) == ""
    with pytest.raises(ValueError, match="mesh axis names"):
        pending_marker([0])


def test_short_dtype():
    assert [short_dtype(d) for d in (jnp.float32, jnp.bfloat16, np.int8, bool)] == ["f32", "bf16", "i8", "bool"]
    dtypes = (jnp.int4, jnp.uint4, jnp.float8_e4m3fn, jnp.float16, jnp.complex64, np.uint32, jnp.bool_, jnp.bfloat16)
    named = [short_dtype(d) for d in dtypes]
    assert named == ["i4", "u4", "f8_e4m3fn", "f16", "c64", "u32", "bool", "bf16"]
    assert named == [jax.typeof(jnp.zeros(2, d)).str_short(short_dtypes=True).removesuffix("[2]") for d in dtypes]


# --- meshes not in id order, axes of size 1, Auto and Explicit meshes (notebooks 00-02) ---------------------------


def test_tiles_follow_the_mesh_device_order():
    sharding = NamedSharding(v5e_ordered_mesh(), P("data"))
    got = {t.start[0]: t.devices for t in tiles((128, 512), sharding)}
    assert got == {16 * k: (device,) for k, device in enumerate(V5E_ORDER)}
    runtime = {i[0].start or 0: (d.id,) for d, i in sharding.devices_indices_map((128, 512)).items()}
    assert got == runtime


def test_an_axis_of_size_one_splits_nothing():
    mesh81 = jax.make_mesh((8, 1), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    both = tiles((128, 512), NamedSharding(mesh81, P("data", "model")))
    rows = tiles((128, 512), NamedSharding(mesh81, P("data", None)))
    assert both == rows and len(both) == 8


def test_type_string_writes_the_same_notation_on_auto_and_explicit_meshes():
    x = jnp.zeros((16, 8))
    for types in (AxisType.Auto, AxisType.Explicit):
        mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(types,) * 2)
        assert type_string(jax.device_put(x, NamedSharding(mesh, P("data", None)))) == "f32[16@data,8]"
