"""Notebook 04's matmul pictures: the plan one device follows for C = A @ B, checked against the compiler,
and the picture of it (roles in the labels, one scale for A, B and C, bad input that says what to fix)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from course_support import extents, label_boxes, patches, tile_labels  # the same ways of measuring a picture
from spmd_course.matmul_pictures import draw_matmul, matmul_traffic
from spmd_course.utils.inspecting import collectives

MESH = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
MESH3 = jax.make_mesh((2, 2, 2), ("pod", "data", "model"), axis_types=(AxisType.Auto,) * 3)
MESH3_PIPELINE = jax.make_mesh((2, 2, 2), ("data", "model", "pipeline"), axis_types=(AxisType.Auto,) * 3)


# --- the plan: C = A @ B with A (512, 1024), B (1024, 1024) on the (4, 2) mesh ---------------------------------------

A, B = (512, 1024), (1024, 1024)


def _traffic(a, b, c, device=0):
    return matmul_traffic(A, NamedSharding(MESH, a), B, NamedSharding(MESH, b), NamedSharding(MESH, c), device)


def test_matmul_traffic_gather_case():
    t = _traffic(P("data", "model"), P(None, "model"), P("data", "model"))
    assert t.lhs.held.start == (0, 0) and t.lhs.held.stop == (128, 512)
    assert (t.lhs.needed_start, t.lhs.needed_stop) == ((0, 0), (128, 1024))  # all of its rows of A
    (missing,) = t.lhs.missing
    assert missing.index_string() == "[0:128, 512:1024]" and missing.source == 1 and missing.axes == ("model",)
    assert missing.holders == (1,) and not missing.held and t.lhs.fetched_elements == 128 * 512
    assert t.lhs.gather_axes == ("model",) and t.rhs.missing == () and t.rhs.needed_shape == (1024, 512)
    assert t.partial_axes == () and t.reduction is None and t.collectives == ("all-gather",)
    assert t.out.devices == (0,) and t.computed_shape == t.out.shape == (128, 512)
    assert t.summary() == "dev 0 fetches 1 block of A over 'model' (all-gather)"
    assert _traffic(P("data", "model"), P(None, "model"), P("data", "model"), device=7).lhs.missing[0].source == 6


def test_matmul_traffic_partial_sum_cases():
    t = _traffic(P("data", "model"), P("model", None), P("data", None))
    assert t.partial_axes == ("model",) and t.contracting == (0, 512) and t.reduction == "all-reduce"
    assert t.lhs.missing == () == t.rhs.missing and t.computed_shape == (128, 1024)
    assert t.summary(("x", "w", "y")) == (
        "dev 0 holds a pending sum {U:model} of its y block: adds over 'model' (all-reduce)")
    dev1 = _traffic(P("data", "model"), P("model", None), P("data", None), device=1)
    assert dev1.contracting == (512, 1024)  # its own half of the contracting dimension
    t = _traffic(P(None, "data"), P("data", None), P())
    assert t.partial_axes == ("data",) and t.computed_shape == (512, 1024) and t.collectives == ("all-reduce",)
    scatter = _traffic(P(None, "data"), P("data", None), P("data", None))
    assert scatter.reduction == "reduce-scatter" and scatter.out.shape == (128, 1024)
    assert scatter.computed_shape == (512, 1024)  # partial sums for all of C, then each keeps its block


def test_matmul_traffic_nothing_moves_and_nearest_holder():
    t = _traffic(P("data", None), P(None, "model"), P("data", "model"))
    assert t.collectives == () and t.summary() == "dev 0 holds everything its C block needs: nothing moves"
    # B's rows split over data while A is not: dev 0 fetches B's other row blocks from its own model column
    t = _traffic(P("data", None), P("data", None), P("data", None))
    assert [(p.index_string(), p.holders, p.source, p.axes) for p in t.rhs.missing] == [
        ("[256:512, 0:1024]", (2, 3), 2, ("data",)),
        ("[512:768, 0:1024]", (4, 5), 4, ("data",)),
        ("[768:1024, 0:1024]", (6, 7), 6, ("data",)),
    ]
    assert t.summary() == "dev 0 fetches 3 blocks of B over 'data' (all-gather)"


def test_matmul_traffic_takes_a_device_a_spec_and_uneven_sizes():
    t = matmul_traffic(A, NamedSharding(MESH, P("data", "model")), B, NamedSharding(MESH, P(None, "model")),
                       P("data", "model"), jax.devices()[5])
    assert t.device == 5 and t.lhs.missing[0].source == 4
    odd = matmul_traffic((10, 6), NamedSharding(MESH, P("data", None)), (6, 4), NamedSharding(MESH, P()),
                         P("data", None), 6)
    assert odd.out.shape == (1, 4) and odd.lhs.needed_shape == (1, 6) and odd.collectives == ()


@pytest.mark.parametrize(
    "args,exc,message",
    [
        (((512,), NamedSharding(MESH, P()), B, NamedSharding(MESH, P()), P()), ValueError, "2-D shape"),
        ((A, NamedSharding(MESH, P()), (1023, 4), NamedSharding(MESH, P()), P()), ValueError, "must equal B's rows"),
        ((A, P("data"), B, NamedSharding(MESH, P()), P()), ValueError, "needs a mesh"),
        ((A, jax.sharding.SingleDeviceSharding(jax.devices()[0]), B, NamedSharding(MESH, P()), P()), TypeError,
         "needs a NamedSharding"),
        ((A, NamedSharding(MESH, P()), B, NamedSharding(MESH3_PIPELINE, P()), P()), ValueError, "another mesh"),
        ((A, NamedSharding(MESH, P()), B, NamedSharding(MESH, P()), P("rows")), ValueError, "does not have"),
        ((A, NamedSharding(MESH, P()), B, NamedSharding(MESH, P()), P(), 99), ValueError, "not on this mesh"),
        ((A, NamedSharding(MESH, P()), B, NamedSharding(MESH, P()), P(), True), ValueError, "not on this mesh"),
        ((A, NamedSharding(MESH, P()), B, NamedSharding(MESH, P()), P(), "dev 0"), ValueError, "not on this mesh"),
    ],
)
def test_matmul_traffic_bad_input(args, exc, message):
    with pytest.raises(exc, match=message):
        matmul_traffic(*args)


# --- draw_matmul -----------------------------------------------------------------------------------------------------

CASES = {  # the four classic cases: A's spec, B's spec, C's spec as XLA chooses it
    "gather": (P("data", "model"), P(None, "model"), P("data", "model")),
    "all-reduce": (P("data", "model"), P("model", None), P("data", None)),
    "nothing": (P("data", None), P(None, "model"), P("data", "model")),
    "all-reduce-data": (P(None, "data"), P("data", None), P()),
}


def _ns(spec):
    return NamedSharding(MESH, spec)


def _roles(fig):
    return [label.split("\n")[-1] for label in tile_labels(fig) if "dev 0" in label.split("\n")[-1]]


def test_draw_matmul_the_four_cases():
    figs = {name: draw_matmul((A, _ns(a)), (B, _ns(b)), _ns(c)) for name, (a, b, c) in CASES.items()}
    assert _roles(figs["gather"]) == ["held by dev 0", "held by dev 0", "dev 0's block: complete"]
    assert "fetched from dev 1" in tile_labels(figs["gather"])[1]
    assert "fetches 1 block of A over 'model' (all-gather)" in figs["gather"]._suptitle.get_text()
    assert _roles(figs["all-reduce"])[-1] == "dev 0's block: pending sum {U:model}"
    assert figs["all-reduce"].axes[2].get_title().split("\n")[1] == (
        "f32[512@data,1024]{U:model} → f32[512@data,1024]   P('data', None)")  # the pending sum, then C
    assert "{U:" not in figs["gather"].axes[2].get_title()  # no partial sums, no marker
    assert "(all-reduce)" in figs["all-reduce"]._suptitle.get_text()
    assert _roles(figs["nothing"]) == ["held by dev 0", "held by dev 0", "dev 0's block: complete"]
    assert "nothing moves" in figs["nothing"]._suptitle.get_text()
    assert not patches(figs["nothing"], "fetched") and not patches(figs["nothing"], "partial")
    assert _roles(figs["all-reduce-data"])[-1] == "dev 0's block: pending sum {U:data}"
    (fetched,) = patches(figs["gather"], "fetched")  # the one piece dev 0 fetches: A[0:128, 512:1024]
    assert (round(fetched.get_x(), 6), round(fetched.get_y(), 6), round(fetched.get_width(), 6)) == (0.5, 0.0, 0.5)
    legend = [t.get_text() for t in figs["gather"].legends[0].get_texts()]
    assert legend[:2] == ["held by dev 0", "needed by dev 0, held elsewhere: fetched (all-gather)"]


def test_draw_matmul_accepts_arrays_structs_pairs_and_shardings():
    a = jax.device_put(jnp.ones((16, 32)), _ns(P("data", "model")))
    b = jax.ShapeDtypeStruct((32, 8), jnp.float32, sharding=_ns(P(None, "model")))
    c = jax.jit(lambda a, b: a @ b).lower(a, b).compile().output_shardings
    for out in (c, c.spec, ((16, 8), c), jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=c)):
        fig = draw_matmul(a, b, out, device=3, title="case 1", names=("x", "w", "y"))
        assert fig._suptitle.get_text().startswith("case 1\ndev 3 fetches 1 block of x over 'model'")
        assert "held by dev 3" in "".join(tile_labels(fig)) and "fetched from dev 2" in "".join(tile_labels(fig))
    assert [ax.get_title().split("\n")[0] for ax in fig.axes] == ["x", "w", "y = x @ w"]


def test_draw_matmul_reduce_scatter_marks_the_partial_sums_it_sends():
    fig = draw_matmul((A, _ns(P(None, "data"))), (B, _ns(P("data", None))), _ns(P("data", None)))
    assert "(reduce-scatter)" in fig._suptitle.get_text()
    assert sum("gets a partial sum from dev 0" in label for label in tile_labels(fig)) == 3
    (partial,) = patches(fig, "partial")
    assert round(partial.get_height(), 6) == 1.0  # dev 0 computes partial sums for all of C


@pytest.mark.parametrize(
    "call,exc,message",
    [
        (lambda: draw_matmul(((4, 8, 8), _ns(P())), (B, _ns(P())), P()), ValueError, "2-D shape"),
        (lambda: draw_matmul((A, _ns(P())), ((512, 8), _ns(P())), P()), ValueError, r"A's columns \(1024\) must equal"),
        (lambda: draw_matmul((A, _ns(P())), (B, _ns(P())), ((512, 8), _ns(P()))), ValueError, r"has shape \(512, 8\)"),
        (lambda: draw_matmul((A, _ns(P())), (B, _ns(P())), P(), device=8), ValueError, "not on this mesh"),
        (lambda: draw_matmul("A", (B, _ns(P())), P()), TypeError, r"\(shape, NamedSharding\) pair"),
        (lambda: draw_matmul(A, (B, _ns(P())), P()), ValueError, "needs a layout"),
        (lambda: draw_matmul((A, _ns(P())), (B, jax.sharding.SingleDeviceSharding(jax.devices()[0])), P()), TypeError,
         "needs a NamedSharding"),
        (lambda: draw_matmul((A, _ns(P())), (B, NamedSharding(MESH3, P())), P()), ValueError, "another mesh"),
    ],
)
def test_draw_matmul_bad_input(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


# the geometry against the compiler: the four classic cases, then others where XLA follows the same plan
AGREE = [
    *CASES.values(),
    (P("data", "model"), P(None, None), P("data", None)),
    (P(None, "data"), P("model", None), P()),  # both gathered: A over data, B over model
    (P("model", "data"), P("data", "model"), P(None, "model")),  # A gathered over model, then partial over data
    (P(("data", "model"), None), P(("data", "model"), None), P(("data", "model"), None)),  # FSDP: gather B
    (P(None, "data"), P("data", None), P("data", None)),  # reduce-scatter: on CPU an all-reduce + dynamic-slice
    (P("data", "model"), P("model", None), P("data", "model")),
]


@pytest.mark.parametrize("a,b,c", AGREE, ids=lambda s: str(s))
def test_matmul_traffic_agrees_with_the_compiled_collectives(a, b, c):
    lhs = jax.ShapeDtypeStruct(A, jnp.float32, sharding=_ns(a))
    rhs = jax.ShapeDtypeStruct(B, jnp.float32, sharding=_ns(b))
    compiled = jax.jit(lambda x, y: x @ y, out_shardings=_ns(c)).lower(lhs, rhs).compile()
    found = collectives(compiled)
    traffic = matmul_traffic(A, _ns(a), B, _ns(b), _ns(c), device=0)
    cpu = sorted("all-reduce" if k == "reduce-scatter" else k for k in traffic.collectives)  # CPU has no reduce-scatter
    assert cpu == sorted(op.kind for op in found.ops)
    sizes = dict(MESH.shape)
    expected = sorted(
        [("all-gather", op.needed_shape, int(np.prod([sizes[x] for x in op.gather_axes])))
         for op in (traffic.lhs, traffic.rhs) if op.missing]
        + ([("all-reduce", traffic.computed_shape, int(np.prod([sizes[x] for x in traffic.partial_axes])))]
           if traffic.partial_axes else [])
    )
    assert expected == sorted((op.kind, op.shapes[0], op.group_size) for op in found.ops)


# --- one scale for A, B and C ----------------------------------------------------------------------------------------


MATMUL_CASES = {  # notebook 04's shapes, C[I, K] = A[I, J] @ B[J, K] with I, J, K = 128, 256, 512
    "1": (P("data", None), P(None, "model"), P("data", "model")),
    "2": (P("data", "model"), P(None, "model"), P("data", "model")),
    "3": (P(None, "model"), P("model", None), P()),
    "3'": (P("data", "model"), P("model", None), P("data", "model")),
    "4": (P("data", None), P(None, "data"), P(None, "data")),
}


@pytest.mark.parametrize("case", MATMUL_CASES)
@pytest.mark.parametrize("sizes", [(128, 256, 512), (512, 1024, 1024), (8, 2048, 64)], ids=str)
def test_draw_matmul_draws_a_b_and_c_on_one_scale(case, sizes):
    i, j, k = sizes
    a, b, c = MATMUL_CASES[case]
    fig = draw_matmul(((i, j), _ns(a)), ((j, k), _ns(b)), _ns(c))
    box_a, box_b, box_c = extents(fig)
    assert abs(box_a.y0 - box_c.y0) < 1 and abs(box_a.y1 - box_c.y1) < 1  # A's rows are C's rows
    assert abs(box_b.x0 - box_c.x0) < 1 and abs(box_b.x1 - box_c.x1) < 1  # B's columns are C's columns
    assert box_a.x1 < box_c.x0 and box_b.y0 > box_c.y1  # A to the left of C, B above it
    assert abs(box_a.width - box_b.height) < 1  # J is one length in A and in B
    longest = max(sizes)
    if min(sizes) * 4 >= longest:  # to scale: the same pixels per element everywhere
        assert abs(box_c.width / box_c.height - k / i) < 0.02 * k / i
        assert abs(box_a.width / box_a.height - j / i) < 0.02 * j / i
        assert not any("not to scale" in ax.get_xlabel() for ax in fig.axes)
    else:  # lengths compressed (the shortest drawn at a quarter of the longest), and the panels say so
        assert any("not to scale" in ax.get_xlabel() for ax in fig.axes)
    sizes_pt = [t.get_fontsize() for ax in fig.axes for t in ax.texts if t.get_gid() == "tile-label"]
    assert min(sizes_pt) >= 6.5
    boxes = label_boxes(fig)
    assert not [(p, q) for n, (p, a) in enumerate(boxes) for q, b in boxes[n + 1:] if a.overlaps(b)]
