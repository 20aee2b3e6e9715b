"""spmd_course.utils.step_pictures: the timeline, the roofline and the terms of an estimated step.

Most tests draw a hand-made estimate, so each expected box and point is known; one draws a real program
compiled for 8 CPU devices.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from matplotlib.colors import to_rgba

from spmd_course.utils.step_pictures import draw_plans, draw_roofline, draw_step_terms, draw_timeline, op_label
from spmd_course.utils.timing import CHIPS, StepEstimate, TimedOp, estimate_step

V5E = CHIPS["v5e"]
MS = 1e-3


def _estimate(ops, seconds):
    compute = sum(op.flops for op in ops) / V5E.peak_flops
    exposed = sum(op.exposed for op in ops if op.lane != "compute")
    return StepEstimate(V5E, seconds, compute, seconds - compute - exposed, exposed, 0.0, 0.0, 0.0,
                        sum(op.flops for op in ops), sum(op.bytes for op in ops if op.lane == "compute"),
                        sum(op.bytes for op in ops if op.lane != "compute"), tuple(ops))


def _matmul(name, start, seconds, op_name, trips=1, loop=""):
    flops = seconds * V5E.peak_flops
    return TimedOp(name, "compute", "compute", start, start + seconds, seconds, seconds, flops, flops / 1000,
                   trips, loop, op_name)


# One forward matmul, an all-gather over fsdp hidden behind it, a backward matmul, then a synchronous
# all-reduce over data x model that the step waits for whole.
STEP = _estimate([
    TimedOp("ag", "all-gather", "fsdp", 0.0, 1 * MS, 1 * MS, 0.0, bytes=2**20),
    _matmul("f", 0.0, 2 * MS, "jit(step)/jvp(Block)/w1/dot_general"),
    _matmul("b", 2 * MS, 2 * MS, "jit(step)/transpose(jvp(Block))/w1/dot_general"),
    TimedOp("ar", "all-reduce", "data+model", 4 * MS, 5 * MS, 1 * MS, 1 * MS, bytes=2**21),
], 5 * MS)


def _patches(fig, gid):
    return [p for p in fig.axes[0].patches if p.get_gid() == gid]


def test_op_labels_name_the_layer_and_the_pass():
    assert op_label("jit(step)/jvp(Block)/w1/dot_general") == "w1 fwd"
    assert op_label("jit(step)/transpose(jvp(Block))/w2/dot_general") == "w2 bwd"
    assert op_label("jit(f)/dot_general") == "dot_general fwd"
    assert op_label("") == "op fwd"
    with pytest.raises(TypeError, match="metadata string"):
        op_label(None)


def test_timeline_has_a_time_axis_and_one_lane_per_set_of_axes():
    fig = draw_timeline(STEP)
    ax = fig.axes[0]
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    assert lanes == ["chip: compute", "over 'fsdp'", "over 'data' \u00d7 'model'"]
    assert "time in the step (ms" in ax.get_xlabel()
    assert ax.get_xlim() == pytest.approx((0, 5))  # the whole step, in ms
    f, b = _patches(fig, "op-compute")
    assert (f.get_x(), f.get_width(), b.get_x(), b.get_width()) == pytest.approx((0, 2, 2, 2))
    assert f.get_facecolor() != b.get_facecolor()  # forward and backward told apart


def test_hidden_and_exposed_transfers_look_different():
    fig = draw_timeline(STEP)
    (hidden,), (exposed,) = _patches(fig, "transfer-hidden"), _patches(fig, "transfer-exposed")
    assert (hidden.get_x(), hidden.get_width()) == pytest.approx((0, 1))
    assert (exposed.get_x(), exposed.get_width()) == pytest.approx((4, 1))
    assert hidden.get_hatch() and not exposed.get_hatch()
    assert to_rgba(exposed.get_facecolor()) == to_rgba("black") != to_rgba(hidden.get_facecolor())
    labels = [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "op-label"]
    assert {"w1 fwd", "w1 bwd", "AG 1.0 MiB", "AR 2.0 MiB"} <= set(labels)


def test_colour_means_device_so_the_timeline_uses_greys_only():
    for patch in draw_timeline(STEP).axes[0].patches:
        r, g, b, _ = to_rgba(patch.get_facecolor())
        assert r == g == b, patch.get_gid()


def test_a_loop_is_drawn_once_with_its_trip_count_and_the_rest_as_a_band():
    body = [_matmul("l", 1 * MS, 1 * MS, "jit(f)/while/body/dense/dot_general", trips=4, loop="while.3")]
    after = _matmul("z", 5 * MS, 1 * MS, "jit(f)/head/dot_general")
    fig = draw_timeline(_estimate([_matmul("a", 0.0, 1 * MS, "jit(f)/embed/dot_general"), *body, after], 6 * MS))
    (trip,), (rest,) = _patches(fig, "loop-trip"), _patches(fig, "loop-rest")
    assert (trip.get_x(), trip.get_width(), rest.get_x(), rest.get_width()) == pytest.approx((1, 1, 2, 3))
    assert [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "loop-label"] == ["\u00d74"]


def test_window_zooms_and_bad_input_is_refused():
    fig = draw_timeline(STEP, window=(2 * MS, 4 * MS))
    assert fig.axes[0].get_xlim() == pytest.approx((0, 2))
    assert len(_patches(fig, "op-compute")) == 1  # only the backward matmul lies in the window
    with pytest.raises(ValueError, match="0 <= start < end"):
        draw_timeline(STEP, window=(3 * MS, 1 * MS))
    with pytest.raises(TypeError, match="estimate_step"):
        draw_timeline([1, 2])
    with pytest.raises(ValueError, match="no timed op"):
        draw_timeline(_estimate([], 1.0))


def test_roofline_places_each_op_at_its_intensity_under_the_roofs():
    fig = draw_roofline(STEP)
    ax = fig.axes[0]
    ops = [c for c in ax.collections if c.get_gid() == "op"]
    assert len(ops) == 2
    for c in ops:
        x, y = c.get_offsets()[0]
        assert x == pytest.approx(1000) and y == pytest.approx(V5E.peak_flops)  # right of the 241 ridge: at peak
    (star,) = [c for c in ax.collections if c.get_gid() == "step"]
    assert star.get_offsets()[0][1] == pytest.approx(STEP.flops / STEP.seconds)
    assert STEP.flops / STEP.seconds < 0.9 * V5E.peak_flops  # the step loses a fifth to its exposed all-reduce
    (roof,) = [line for line in ax.lines if line.get_gid() == "roof"]
    assert roof.get_xydata()[1] == pytest.approx((V5E.peak_flops / V5E.hbm_bandwidth, V5E.peak_flops))
    with pytest.raises(ValueError, match="nothing to place"):
        draw_roofline(_estimate([TimedOp("c", "all-gather", "x", 0, 1, 1, 1, bytes=8)], 1.0))
    with pytest.raises(TypeError, match="estimate_step"):
        draw_roofline("step")


def test_a_real_program_is_drawn():
    mesh = jax.make_mesh((8,), ("data",))
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    w = jax.ShapeDtypeStruct((128, 128), jnp.float32, sharding=NamedSharding(mesh, P()))
    compiled = jax.jit(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w))), out_shardings=NamedSharding(mesh, P())
                       ).lower(w, x).compile()
    estimate = estimate_step(compiled, mesh, chip="v5e")
    fig = draw_timeline(estimate)
    lanes = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert lanes[0] == "chip: compute" and "over 'data'" in lanes  # the gradient's all-reduce over data
    assert np.isfinite(fig.axes[0].get_xlim()).all()


# --- draw_plans: every candidate of a planner search --------------------------------------------------------

def _plan(label, status, *, compiled, hbm=None, formula=2**30, seconds=None, guess=1.0, acc=0):
    return dict(label=label, status=status, compiled=compiled, hbm_bytes=hbm, formula_bytes=formula,
                step_seconds=seconds, formula_seconds=guess, accumulator_bytes=acc)


GiB = 2**30
RECORD = dict(chip="v5e", hbm_bytes=V5E.hbm_bytes, topology="v5e:16x16", num_slices=1, effort="O0",
              params=8_030_261_248, plans=[
                  _plan("1x256x1 full b4x1", "fits", compiled=True, hbm=10 * GiB, seconds=3.4, guess=3.0),
                  _plan("1x64x4 full b4x1", "fits", compiled=True, hbm=9 * GiB, seconds=4.0, guess=3.5),
                  _plan("1x256x1 none b4x1", "refused", compiled=True, hbm=40 * GiB, formula=14 * GiB, guess=2.5),
                  _plan("256x1x1 full b4x1", "refused", compiled=False, formula=120 * GiB, guess=9.0),
                  _plan("1x256x1 save_dots b4x1", "pruned", compiled=False, formula=30 * GiB, guess=2.8),
                  _plan("1x256x1 full b2x2", "skipped", compiled=False, formula=7 * GiB, guess=3.1, acc=GiB),
              ])


def _points(fig, gid):
    [collection] = [c for c in fig.axes[0].collections if c.get_gid() == gid]
    return [tuple(xy) for xy in collection.get_offsets()]


def test_plans_sit_at_their_step_and_hbm_with_the_chips_hbm_as_a_line():
    fig = draw_plans(RECORD)
    assert _points(fig, "best") == [(3.4, 10.0)]  # the winner, a star: not drawn twice
    assert _points(fig, "fits") == [(4.0, 9.0)]
    assert _points(fig, "refused by the compiler") == [(2.5, 40.0)]  # what the compiler asked for
    assert _points(fig, "refused by the formula") == [(9.0, 120.0)]  # never compiled: the formula, the guess
    assert _points(fig, "pruned") == [(2.8, 30.0)]
    assert _points(fig, "not compiled") == [(3.1, 7.0)]  # skipped: formula bytes already hold the accumulator
    [line] = [ln for ln in fig.axes[0].lines if ln.get_gid() == "hbm"]
    assert set(line.get_ydata()) == {V5E.hbm_bytes / GiB}
    assert fig.axes[0].get_xscale() == fig.axes[0].get_yscale() == "log"
    assert "effort 'O0'" in fig.axes[0].get_xlabel() and "8.0B parameters" in fig._suptitle.get_text()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "the top plan: 1x256x1 full b4x1" in legend and len(legend) == 6


def test_colour_means_device_so_the_plans_are_greys_and_markers():
    fig = draw_plans(RECORD)
    for collection in fig.axes[0].collections:
        for colour in [*collection.get_facecolors(), *collection.get_edgecolors()]:
            r, g, b, _ = to_rgba(colour)
            assert r == g == b, collection.get_gid()
    markers = {c.get_gid(): c.get_paths()[0].vertices.shape for c in fig.axes[0].collections}
    assert len(set(markers.values())) >= 3  # circle, cross, triangle, star: told apart without colour


def test_draw_plans_takes_a_ranking_and_refuses_anything_else():
    from spmd_course.utils.planner import plan
    from spmd_course.utils.train_step import DecoderConfig

    tiny = DecoderConfig(num_layers=1, d_model=256, num_heads=4, head_dim=64, d_ff=512, vocab_size=512, seq_len=128)
    ranking = plan(tiny, chip="v5e", topology="v5e:2x4", global_batch_tokens=8 * 128, remats=("full",),
                   meshes=[(1, 8, 1)], max_compiles=0)  # nothing compiled: drawn at the formula
    fig = draw_plans(ranking)
    assert len(_points(fig, "not compiled")) == 1 and "best" not in {c.get_gid() for c in fig.axes[0].collections}
    with pytest.raises(TypeError, match="Ranking"):
        draw_plans("plans")
    with pytest.raises(ValueError, match="no plan"):
        draw_plans({**RECORD, "plans": []})


def _terms(compute, memory, exposed, hidden=0.0, host=0.0):
    """A StepEstimate with only its terms set: seconds is their sum, as estimate_step makes it."""
    return StepEstimate(V5E, compute + memory + exposed + host, compute, memory, exposed, hidden, host, 0.0,
                        0.0, 0.0, 0.0, ())


def test_step_terms_stack_to_each_step_on_one_seconds_axis():
    fig = draw_step_terms({"DP": _terms(3 * MS, 1 * MS, 2 * MS), "FSDP": _terms(3 * MS, 0.0, 4 * MS, hidden=1 * MS)})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["DP", "FSDP"]
    assert "step time (ms)" in ax.get_xlabel()
    compute, exposed = _patches(fig, "term-compute"), _patches(fig, "term-comm_exposed")
    assert [p.get_width() for p in compute] == pytest.approx([3, 3])  # the same scale for every bar
    (memory,) = _patches(fig, "term-memory")  # a zero term draws nothing
    assert (memory.get_x(), memory.get_width()) == pytest.approx((3, 1))
    assert [v for p in exposed for v in (p.get_x(), p.get_width())] == pytest.approx([4, 2, 3, 4])
    (hidden,) = _patches(fig, "term-comm_hidden")
    assert hidden.get_x() == pytest.approx(7) and hidden.get_hatch()  # after the step's end: not part of it
    totals = [t.get_text().strip() for t in ax.texts if t.get_gid() == "step-total"]
    assert totals == ["6 ms", "7 ms"]
    assert to_rgba(exposed[0].get_facecolor()) == to_rgba("black")  # as the timeline draws exposed transfers


def test_step_terms_scale_and_greys_only():
    fig = draw_step_terms({"one layer": _terms(1 * MS, 0.5 * MS, 0.5 * MS, host=0.5 * MS)}, scale=32)
    assert [p.get_width() for p in _patches(fig, "term-compute")] == pytest.approx([32])
    assert "x 32" in fig.axes[0].get_xlabel()
    assert _patches(fig, "term-host_exposed")
    for patch in fig.axes[0].patches:  # colour means device in the course, so no colour here
        r, g, b, _ = to_rgba(patch.get_facecolor())
        assert r == g == b, patch.get_gid()


def test_step_terms_refuse_bad_input():
    with pytest.raises(TypeError, match="a dict"):
        draw_step_terms([_terms(1, 0, 0)])
    with pytest.raises(ValueError, match="no estimate"):
        draw_step_terms({})
    with pytest.raises(TypeError, match="estimate_step"):
        draw_step_terms({"DP": 0.5})
    for bad in (0, -1.0, float("nan"), True, "32"):
        with pytest.raises(ValueError, match="positive number"):
            draw_step_terms({"DP": _terms(1, 0, 0)}, scale=bad)
