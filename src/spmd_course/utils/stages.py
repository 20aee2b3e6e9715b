"""A pipeline's step estimated from one compiled stage: the planner's `stage` axis, as an estimate.

Why: the planner (:mod:`utils.planner`) compiles whole training steps, but a pipeline's step is not one
program the course's builder writes: every stage runs the same loop of ``M + P - 1`` iterations (notebook
16), ``P - 1`` of them idle (the bubble), and sends its activations to the next stage each iteration. So
its time is estimated from parts: a compiled program of one stage's layers on one micro-batch (forward and
backward: :func:`utils.train_step.lower_train_step` with ``num_layers / P`` layers, timed by
:func:`utils.timing.estimate_step`), times the iterations, plus each iteration's two sends of a
micro-batch's activations over one link (forward, and their gradient back), timed as a collective-permute
(:func:`utils.timing.collective_seconds`). Every figure it returns is an estimate: the first and last
stages' embedding and loss, and any overlap of the sends with compute, are left out. The planner's opt-in
``stage`` axis (``plan(..., axes=(*AXES, "stage"))``) times its pipeline candidates with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .timing import Chip, collective_seconds

__all__ = ["PipelineEstimate", "estimate_pipeline", "stage_layers"]


def stage_layers(num_layers: int, stages: int) -> int:
    """Layers per stage when ``num_layers`` are cut into ``stages`` equal stages; a ValueError names the fix."""
    for name, value in (("num_layers", num_layers), ("stages", stages)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if num_layers % stages:
        divisors = [s for s in range(1, num_layers + 1) if num_layers % s == 0]
        raise ValueError(f"{num_layers} layers do not cut into {stages} equal stages: choose a stage axis that "
                         f"divides them ({', '.join(map(str, divisors))})")
    return num_layers // stages


@dataclass(frozen=True)
class PipelineEstimate:
    """A GPipe step over ``stages`` stages and ``micro_batches`` micro-batches (:func:`estimate_pipeline`).

    ``seconds``: the step; ``iteration``: one iteration (a stage's forward and backward of one micro-batch,
    plus its two sends); ``iterations``: ``M + P - 1``; ``bubble``: ``(P - 1) / (M + P - 1)``, the share of
    the step every stage idles; ``bubble_seconds``: that share of ``seconds``; ``send_seconds``: the sends'
    part of the step. All estimates.
    """

    seconds: float
    iteration: float
    iterations: int
    bubble: float
    bubble_seconds: float
    send_seconds: float


def estimate_pipeline(stage_seconds: float, *, stages: int, micro_batches: int, activation_bytes: float,
                      chip: Chip) -> PipelineEstimate:
    """Estimate a GPipe step from one stage's compiled micro-step.

    ``stage_seconds``: :func:`utils.timing.estimate_step`'s seconds for one stage's layers on one
    micro-batch, forward and backward; ``activation_bytes``: one micro-batch's activations at a cut (what a
    stage sends on, per chip); ``chip``: the :class:`utils.timing.Chip` whose link carries the sends. Each of
    the ``M + P - 1`` iterations costs the stage's time plus two sends over one link (notebook 18's loop);
    the bubble is ``(P - 1) / (M + P - 1)`` of them. ``micro_batches`` must be at least ``stages`` (fewer
    leave every stage idle most of the step; a ValueError names the fix).
    """
    for name, value in (("stages", stages), ("micro_batches", micro_batches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if micro_batches < stages:
        raise ValueError(f"GPipe over {stages} stages needs at least {stages} micro-batches, got {micro_batches}: cut "
                         f"the batch into more micro-batches (smaller ones, or a larger global batch) or use fewer "
                         "stages")
    if not stage_seconds > 0:
        raise ValueError(f"stage_seconds must be > 0 (estimate_step(...).seconds of one stage), got {stage_seconds!r}")
    if activation_bytes < 0:
        raise ValueError(f"activation_bytes must be >= 0, got {activation_bytes!r}")
    if not isinstance(chip, Chip):
        raise ValueError(f"chip must be a utils.timing.Chip (utils.timing.CHIPS['v5e'], ...), got {chip!r}")
    sends = 2 * collective_seconds("collective-permute", activation_bytes, [(stages, stages)], chip) if stages > 1 \
        else 0.0
    iterations = micro_batches + stages - 1
    iteration = stage_seconds + sends
    seconds = iterations * iteration
    bubble = (stages - 1) / iterations
    return PipelineEstimate(seconds=seconds, iteration=iteration, iterations=iterations, bubble=bubble,
                            bubble_seconds=bubble * seconds, send_seconds=iterations * sends)
