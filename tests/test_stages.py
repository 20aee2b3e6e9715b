"""spmd_course.utils.stages: a pipeline's step from one compiled stage (the planner's `stage` axis, an estimate).

Arithmetic checked against notebook 18's loop (M + P - 1 iterations, two sends each), bad input, and one O0
compile of a stage on v5e:2x2 (skipped without libtpu)."""

import dataclasses

import pytest

from spmd_course.utils.stages import PipelineEstimate, estimate_pipeline, stage_layers
from spmd_course.utils.timing import CHIPS
from spmd_course.utils.tpu import tpu_compiler_available

V5E = CHIPS["v5e"]
MIB = 2**20


def test_a_gpipe_step_is_its_iterations_with_their_sends():
    e = estimate_pipeline(1e-3, stages=8, micro_batches=8, activation_bytes=32 * MIB, chip=V5E)
    send = 32 * MIB / V5E.link_bandwidth  # a collective-permute: one link
    assert isinstance(e, PipelineEstimate) and e.iterations == 15
    assert e.iteration == pytest.approx(1e-3 + 2 * send)
    assert e.seconds == pytest.approx(15 * (1e-3 + 2 * send))
    assert e.bubble == 7 / 15 and e.bubble_seconds == pytest.approx(7 * (1e-3 + 2 * send))
    assert e.send_seconds == pytest.approx(15 * 2 * send)
    more = estimate_pipeline(1e-3, stages=8, micro_batches=56, activation_bytes=32 * MIB, chip=V5E)
    assert more.bubble == pytest.approx(7 / 63) and more.seconds > e.seconds  # more work, a smaller bubble


def test_one_stage_has_no_bubble_and_sends_nothing():
    e = estimate_pipeline(2e-3, stages=1, micro_batches=4, activation_bytes=MIB, chip=V5E)
    assert (e.bubble, e.send_seconds, e.seconds) == (0.0, 0.0, pytest.approx(8e-3))


def test_stage_layers_cuts_equal_stages():
    assert stage_layers(32, 8) == 4 and stage_layers(32, 1) == 32
    with pytest.raises(ValueError, match=r"32 layers do not cut into 3 equal stages: .*\(1, 2, 4, 8, 16, 32\)"):
        stage_layers(32, 3)
    with pytest.raises(ValueError, match="stages must be a positive integer"):
        stage_layers(32, 0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(micro_batches=0), "micro_batches must be a positive integer"),
    (dict(stages=2.0), "stages must be a positive integer"),
    (dict(stage_seconds=0.0), r"stage_seconds must be > 0 \(estimate_step"),
    (dict(activation_bytes=-1), "activation_bytes must be >= 0"),
    (dict(chip="v5e"), r"chip must be a utils.timing.Chip \(utils.timing.CHIPS\['v5e'\]"),
])
def test_bad_input_names_the_fix(kwargs, message):
    args = {"stage_seconds": 1e-3, "stages": 4, "micro_batches": 8, "activation_bytes": MIB, "chip": V5E, **kwargs}
    with pytest.raises(ValueError, match=message):
        estimate_pipeline(args.pop("stage_seconds"), **args)


def test_a_compiled_stage_gives_the_estimate():
    """One stage of an 8-layer model cut in 2, on the 4 chips of a v5e:2x2 (FSDP), compiled at O0 and timed by
    the roofline, then the pipeline of 2 such stages over 8 micro-batches."""
    ok, why = tpu_compiler_available()
    if not ok:
        pytest.skip(why)
    from spmd_course.utils.planner import _compile
    from spmd_course.utils.timing import estimate_step
    from spmd_course.utils.train_step import DecoderConfig, Parallelism, lower_train_step, make_mesh

    model = DecoderConfig(num_layers=8, d_model=256, num_heads=4, head_dim=64, d_ff=512, vocab_size=512, seq_len=128)
    stage = dataclasses.replace(model, num_layers=stage_layers(model.num_layers, 2))
    mesh = make_mesh("v5e:2x2", Parallelism(ici_fsdp=4))
    step = estimate_step(_compile(lower_train_step(stage, mesh, per_device_batch=1), "O0"), mesh, use_cycles=False)
    activation = 1 * model.seq_len * model.d_model * 2  # a chip's micro-batch at the cut, bf16
    e = estimate_pipeline(step.seconds, stages=2, micro_batches=8, activation_bytes=activation, chip=V5E)
    assert e.iterations == 9 and e.bubble == 1 / 9
    assert e.seconds == pytest.approx(9 * (step.seconds + 2 * activation / V5E.link_bandwidth))


def test_fewer_micro_batches_than_stages_names_the_fix():
    with pytest.raises(ValueError, match=r"GPipe over 4 stages needs at least 4 micro-batches, got 3: cut the batch "
                                         r"into more micro-batches .* or use fewer stages"):
        estimate_pipeline(1e-3, stages=4, micro_batches=3, activation_bytes=MIB, chip=V5E)
    assert estimate_pipeline(1e-3, stages=4, micro_batches=4, activation_bytes=MIB, chip=V5E).bubble == 3 / 7
