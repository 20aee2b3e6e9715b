"""Plan a training run: a model and a TPU slice in, the sharding plans ranked by estimated step time out.

Why: "which mesh, which remat, which per-device batch, will it fit, what MFU should I expect?" is the
question a learner brings to the course. :func:`plan` answers it with the compiler itself rather than on
paper: it lists every candidate, throws out by formula the ones that cannot fit, compiles the plausible
ones ahead of time for the real topology (:func:`utils.train_step.lower_train_step`, nothing allocated),
reads their HBM from the compiler and times them with :func:`utils.timing.estimate_step`.

Call::

    from spmd_course.utils.planner import plan
    from spmd_course.utils.train_step import DecoderConfig

    model = DecoderConfig(num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                          d_ff=14336, vocab_size=128_256, seq_len=8192)
    ranking = plan(model, chip="v5e", topology="v5e:16x16", global_batch_tokens=2**21)
    print(ranking)          # the table, best first
    print(ranking.why)      # which term bounds the winner, and what the runner-up loses to
    best = ranking.best     # a Plan: mesh, remat, per-device batch, HBM, step seconds, MFU

A learner's own Flax NNX module, rather than a ``DecoderConfig``, goes to :func:`utils.module_plan.plan_module`
(its weights split by their logical axis names; the same ranking comes back). An H100 node
(``chip="H100", topology="H100:1x1x8"``) compiles with the CUDA compiler and so needs a visible GPU.

The search, in four steps:

1. **Candidates.** Every factorisation of a slice's chips over ``(data, fsdp, tensor)`` whose sizes the
   model's dimensions divide (heads, key/value heads, ``d_ff`` and the vocabulary by ``tensor``;
   ``d_model`` by ``fsdp``), with data parallelism over DCN across ``num_slices`` slices; each remat
   policy of ``remats``; each per-device micro-batch that divides the sequences each chip gets per step,
   the rest made up by gradient accumulation.
2. **Formula.** Parameters and AdamW moments per chip (12 bytes a float32 parameter, exact from each
   weight's sharding) plus float32 gradients (4 more) plus the activations the remat policy saves
   (:func:`activation_bytes`). A candidate whose parameters and moments alone exceed the chip's HBM is
   ``refused`` without compiling; one whose formula total exceeds it is ``pruned`` (an estimate: the
   compiler is not asked). The formula runs 0.57-1.23 of the compiler's HBM on the plans compiled so far,
   mostly below, so it prunes little that the compiler would fit; it over-counts only the 8B model's plans
   with remat ``full`` or tensor parallelism (1.18-1.23), where the compiler does not hold the float32 logits
   over a 128k vocabulary and their gradient whole at once (:func:`activation_bytes` says where).
3. **Compile.** The plausible candidates, in the order of a paper estimate of their step
   (:func:`guess_seconds`), up to ``max_compiles``: the
   compiler's HBM decides ``fits``: on TPU the bytes it allocates (``memory_per_device(compiled).footprint``,
   ``total_allocation_bytes`` on jax 0.12; ``memory_analysis()``'s arguments + outputs - aliased + temporaries
   over-states it there), elsewhere that sum; a compile the compiler
   refuses (``RESOURCE_EXHAUSTED``) is ``refused`` with the GiB it asked for. For a mesh and remat whose
   larger micro-batch already fits, smaller ones are ``skipped`` (more micro-steps of the same program
   are never faster here). Candidates past the budget are ``not compiled``.
4. **Time and rank.** :func:`utils.timing.estimate_step` on the compiled program gives one micro-step's
   seconds. Below the default effort it times by the roofline alone (``use_cycles=False``, a floor): the
   compiler's per-matmul ``estimated_cycles`` at O0 are not the run's (MaxText's 16B row on ``v5e:16x16``
   at O0: 96.5 s with them, 9.1 s without, against the 10.6 s its published MFU implies; libtpu 0.0.50.1).
   The builder has no gradient accumulation, so accumulation over ``k`` micro-steps is
   estimated as the whole step run ``k`` times: time x k (the optimizer update and the gradient
   reduction are then counted k times, an overestimate), HBM of one micro-step plus a float32 gradient
   accumulator (the accumulator is the formula's, not the compiler's). MFU is the current MaxText count
   of model FLOPs (:func:`utils.published_rows.maxtext_flops_per_device`, ``per_matrix_causal``: 6 x
   matmul parameters x tokens plus causal attention) over the step and the chip's peak.

**Context parallelism** (opt-in: ``axes=("data", "fsdp", "tensor", "context")``): step 1 also splits the
chips over a ``context`` axis that divides ``seq_len`` (each sequence's tokens split over it, the weights'
``embed`` over fsdp and context together, keys and values all-gathered for the attention:
:mod:`utils.train_step`). The compiled program carries those all-gathers, so their HBM and time are the
compiler's and the time model's; the formula's activations per chip do not change with it (a chip holds
``per_device_batch x seq_len`` tokens either way), and the paper guess adds the gathers of keys and values.
**Expert parallelism** (opt-in: ``"expert"`` in ``axes``, for a model with ``num_experts``): an ``expert``
axis that divides the experts splits them (and the batch, and the dense weights' ``embed``), and the
compiled program carries the all-to-alls that send each expert its tokens and bring them back. The
formula's activations leave out the routing's dispatch and combine tensors (the compiler's HBM has them).
**Pipeline parallelism** (opt-in: ``"stage"`` in ``axes``, for example ``(*AXES, "stage")``): a ``stage``
axis of ``P`` chips' groups that divides the layers cuts the model into ``P`` stages of ``num_layers / P``
layers (:func:`utils.stages.stage_layers`), run on a GPipe schedule over ``M`` micro-batches (``M >= P``; the
candidate's ``accumulation`` is ``M``). The builder writes no pipeline, so a stage candidate is an
**estimate** built from one compiled stage: ONE stage's training step (its layers, with the embedding and
the loss) is compiled on the ``chips / P`` of the rest of its mesh (the stage axis's first group of chips,
in every slice), on one micro-batch; its HBM is the compiler's for that program, plus the float32 gradient
accumulator and the saved activations of the other ``M - 1`` micro-batches GPipe keeps in flight until
their backward pass (the formula's :func:`activation_bytes` of the stage's layers, in ``in_flight_bytes``;
1F1B would keep at most ``P``, it is not searched); its step is
:func:`utils.stages.estimate_pipeline`: ``(M + P - 1)`` x (the stage's timed micro-step + two sends of a
micro-batch's activations over one link), of which ``(P - 1) / (M + P - 1)`` is the bubble (the table names
it). The stage's optimizer update is counted in every iteration (an overestimate). Smaller micro-batches
shrink the bubble, so none of a stage mesh's micro-batches is ``skipped``.

Fitting plans are ranked by step time (the global batch is fixed, so also by tokens/s), then the refused,
pruned, unmappable (``"no layout"``), skipped and not compiled ones. Compile effort: the compiler's default
unless ``effort="O0"`` (least effort: 4-10x faster to compile, but nothing is placed in VMEM, so HBM reads
higher than a run at the default effort; the table names the effort).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .inspecting import memory_per_device
from .stages import PipelineEstimate
from .timing import CHIPS, Chip, StepEstimate
from .train_step import AXES, REMAT_POLICIES, DecoderConfig, Parallelism, _param_specs

__all__ = ["AXES_CHOICES", "MFU_FORMULA", "Candidate", "Plan", "Ranking", "activation_bytes", "candidates", "find",
           "guess_seconds", "plan", "record", "state_bytes", "versus"]

GiB = 2**30
MFU_FORMULA = "per_matrix_causal"
"""MaxText's current model-FLOP count (:data:`utils.published_rows.FORMULAS`), used for every plan's MFU."""
EFFORTS = ("default", "O0", "O1", "O2", "O3")
_WITHOUT_STAGE = (AXES, (*AXES, "context"), (*AXES, "expert"), (*AXES, "context", "expert"))
AXES_CHOICES = _WITHOUT_STAGE + tuple((*a, "stage") for a in _WITHOUT_STAGE)
"""The ``axes`` that :func:`plan` and :func:`candidates` search: MaxText's three, with a context axis, an expert
axis, or both; each of those with a pipeline's ``stage`` axis last (an estimate: see the module's text)."""
_OOM = re.compile(r"memory required for [^(]*\(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)")
_LOGITS_BYTES = 8  # a token's float32 logits and their gradient, per vocabulary entry (activation_bytes)
_UNIT = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# The share of a step's model FLOPs each remat policy adds by recomputing in the backward pass, for ordering
# compiles only: full recomputes the forward (2 of 6 on paper; the compiled programs in data/plans count 1.20-1.28
# of the model FLOPs against 1.035 without remat, so 0.22); minimal and offload the attention dots (1.01-1.08).
_RECOMPUTE = {"none": 0.0, "save_dots": 0.0, "minimal": 0.05, "offload": 0.05, "full": 0.22}
# How many times dot-product attention's scores (S a head a token, in the activation dtype) pass through HBM in a
# micro-step beyond what the saved activations count, for ordering compiles only. Fitted to the compiled plans in
# data/plans (effort O0, which keeps nothing in VMEM, so the softmax's fused steps and their gradients each read
# and write the scores in HBM): 16 with full remat, which runs the forward twice, and 6 with minimal or offload,
# where the mean error of the paper estimate over the 67 compiled plans is least. none and save_dots are given
# minimal's 6, an inference: none of their plans fit in the stored searches to check it.
_SCORE_PASSES = {"none": 6, "save_dots": 6, "minimal": 6, "offload": 6, "full": 16}


@dataclass(frozen=True)
class Candidate:
    """One plan to try: the mesh inside a slice, DCN data parallelism, remat, micro-batch and accumulation.

    ``per_device_batch`` is sequences per chip per micro-step (``lower_train_step``'s argument; per group of
    ``context`` chips with a context axis); ``accumulation`` micro-steps make one step, so sequences per step
    = per_device_batch x accumulation x chips / context in all. ``context``: the size of the context axis
    (1: none), which splits each sequence over that many chips; ``expert``: the size of the expert axis
    (1: none), which splits a mixture of experts' experts (``data x fsdp x tensor x context x expert`` is the
    slice's chips). ``stage``: the size of a pipeline's stage axis (1: none); with ``stage > 1`` the other five
    split one stage's ``chips / stage`` chips, ``per_device_batch`` is one micro-batch and ``accumulation`` is
    GPipe's ``M`` micro-batches (at least ``stage``).
    """

    data: int
    fsdp: int
    tensor: int
    slices: int
    remat: str
    per_device_batch: int
    accumulation: int
    context: int = 1
    expert: int = 1
    stage: int = 1

    @property
    def parallelism(self) -> Parallelism:
        """The whole slice's layout; a stage axis takes data's place, stage-major (``ici_data = data x stage``),
        and :func:`plan` keeps the first stage's chips of it."""
        return Parallelism(ici_data=self.data * self.stage, ici_fsdp=self.fsdp, ici_tensor=self.tensor,
                           dcn_data=self.slices, ici_context=self.context, ici_expert=self.expert)

    def label(self) -> str:
        mesh = f"{self.data}x{self.fsdp}x{self.tensor}" + (f" context {self.context}" if self.context > 1 else "")
        mesh += f" expert {self.expert}" if self.expert > 1 else ""
        mesh += f" stage {self.stage}" if self.stage > 1 else ""
        mesh += f" x{self.slices} DCN" if self.slices > 1 else ""
        return f"{mesh} {self.remat} b{self.per_device_batch}x{self.accumulation}"


@dataclass(frozen=True)
class Plan:
    """A candidate and what the planner found about it.

    ``status``: ``"fits"`` (compiled, within HBM), ``"refused"`` (by the compiler, or by the formula when the
    parameters and moments alone exceed HBM: ``compiled`` says which), ``"pruned"`` (the formula's total
    exceeds HBM; not compiled), ``"no layout"`` (``jax.experimental.mesh_utils`` cannot map the mesh onto the
    slice's torus even splitting its axes; not compiled; a mesh laid out only by splitting one says so in
    ``note``), ``"skipped"`` (a larger micro-batch of the same mesh and remat fits), ``"not compiled"``
    (past ``max_compiles``). ``formula_bytes``: the estimate of step 2 per chip;
    ``formula_seconds``: :func:`guess_seconds`, the order in which plausible candidates were compiled;
    ``hbm_bytes``: the compiler's figure for one micro-step (None if not compiled), or for a refusal the
    bytes it asked for; ``accumulator_bytes``: the float32 gradient accumulator added when
    ``accumulation > 1`` (a formula); ``step_seconds``: the estimated step (micro-step x accumulation);
    ``estimate``: the micro-step's :class:`utils.timing.StepEstimate`. For a stage axis (an estimate):
    ``hbm_bytes`` and ``estimate`` are one stage's program on one micro-batch, ``in_flight_bytes`` the saved
    activations of GPipe's other ``M - 1`` micro-batches (a formula), ``pipeline`` the
    :class:`utils.stages.PipelineEstimate` whose ``seconds`` is ``step_seconds``.
    """

    candidate: Candidate
    status: str
    formula_bytes: int
    formula_seconds: float = 0.0
    compiled: bool = False
    hbm_bytes: int | None = None
    accumulator_bytes: int = 0
    step_seconds: float | None = None
    tokens_per_second_per_chip: float | None = None
    mfu: float | None = None
    estimate: StepEstimate | None = field(default=None, repr=False)
    note: str = ""
    in_flight_bytes: int = 0
    pipeline: PipelineEstimate | None = field(default=None, repr=False)

    @property
    def fits(self) -> bool:
        return self.status == "fits"

    @property
    def total_hbm_bytes(self) -> int | None:
        """The compiler's HBM for a micro-step plus the accumulator (and, for a stage axis, GPipe's other
        micro-batches in flight): what the step needs per chip."""
        return None if self.hbm_bytes is None else self.hbm_bytes + self.accumulator_bytes + self.in_flight_bytes

    def parts(self) -> dict[str, float]:
        """The step's seconds by term (each micro-step's part x accumulation): compute, memory, the exposed
        communication and host transfers; empty where not timed. A stage axis adds the pipeline's bubble (its
        ``P - 1`` idle iterations, their sends included) and the sends of its ``M`` working iterations (an
        estimate: :func:`utils.stages.estimate_pipeline`)."""
        if self.estimate is None:
            return {}
        k, e = self.candidate.accumulation, self.estimate
        parts = {"compute": k * e.compute, "memory": k * e.memory, "exposed communication": k * e.comm_exposed,
                 "host transfers": k * e.host_exposed}
        if self.pipeline is not None:  # the P - 1 idle iterations, sends included; the M working ones' sends
            parts["pipeline bubble"] = self.pipeline.bubble_seconds
            parts["pipeline sends"] = self.pipeline.send_seconds * k / self.pipeline.iterations
        return parts

    @property
    def bound(self) -> str | None:
        """The term that takes the largest share of the step (None where not timed)."""
        parts = self.parts()
        return max(parts, key=parts.__getitem__) if parts else None


@dataclass(frozen=True)
class Ranking:
    """Every plan, best first (:func:`plan`); iterate it, index it, print it as a table, read ``why``.
    ``model``: the :class:`utils.train_step.DecoderConfig` planned, or for a module
    (:func:`utils.module_plan.plan_module`) a :class:`utils.module_plan.ModuleModel`."""

    plans: tuple[Plan, ...]
    model: DecoderConfig | Any
    chip: Chip
    topology: str
    num_slices: int
    global_batch_tokens: int
    effort: str

    def __iter__(self) -> Iterator[Plan]:
        return iter(self.plans)

    def __len__(self) -> int:
        return len(self.plans)

    def __getitem__(self, i: int) -> Plan:
        return self.plans[i]

    @property
    def fitting(self) -> tuple[Plan, ...]:
        return tuple(p for p in self.plans if p.fits)

    @property
    def best(self) -> Plan:
        """The fastest plan that fits; a ValueError saying what to change if none does."""
        if not self.fitting:
            raise ValueError(f"no plan fits {self.chip.name}'s {self.chip.hbm_bytes / GiB:.2f} GiB per chip: "
                             "use more chips (a bigger topology or more slices), a smaller global batch "
                             "(more accumulation), or allow remat 'full'; or raise max_compiles if candidates "
                             "were left 'not compiled'")
        return self.fitting[0]

    @property
    def why(self) -> str:
        """Why the winner wins: the term that bounds its step, and the term the runner-up loses most on."""
        if not self.fitting:
            return "No candidate fits, so there is no winner: use more chips, a smaller global batch or remat 'full'."
        best = self.best
        parts = best.parts()
        share = parts[best.bound] / best.step_seconds
        text = (f"The winner, {best.candidate.label()}, is bound by {best.bound}: {share:.0%} of its estimated "
                f"{_ms(best.step_seconds)} step ({', '.join(f'{k} {_ms(v)}' for k, v in parts.items())}).")
        if best.pipeline is not None:
            text += " " + _bubble_sentence(best)
        if len(self.fitting) < 2:
            return text + " No other candidate fits, so there is no runner-up."
        second = self.fitting[1]
        extra = _extra(second.parts(), parts)
        lost = max(extra, key=extra.__getitem__)
        text += (f" The runner-up, {second.candidate.label()}, takes {_ms(second.step_seconds)} "
                 f"({second.step_seconds / best.step_seconds - 1:+.1%}): it loses most on {lost}, "
                 f"+{_ms(extra[lost])}")
        if second.candidate.accumulation != best.candidate.accumulation:
            unit = "micro-batches" if best.pipeline is not None or second.pipeline is not None else "micro-steps"
            text += (f", with {second.candidate.accumulation} {unit} against "
                     f"{best.candidate.accumulation}")
        text += "."
        if second.pipeline is not None and best.pipeline is None:
            text += " " + _bubble_sentence(second)
        return text

    def __str__(self) -> str:
        n = self.model.num_params()
        size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"
        head = (f"plans for {size} parameters on {self.num_slices} x {self.topology} "
                f"({self.chip.name}, {self.chip.hbm_bytes / GiB:.2f} GiB HBM), {self.global_batch_tokens:,} "
                f"tokens a step; HBM from the compiler at effort {self.effort!r}, times estimated (utils.timing"
                + ("" if self.effort == "default" else ", roofline only") + ")")
        if any(p.candidate.stage > 1 for p in self.plans):
            head += ("; a stage axis (ppP) is a GPipe pipeline estimated from one compiled stage (utils.stages): "
                     "its HBM adds the micro-batches in flight, its step the bubble and the sends")
        cols = f"{'#':>3} {'data x fsdp x tensor':<22}{'remat':<10}{'batch x acc':>12}{'formula':>10}{'HBM':>10}" \
               f"{'step':>11}{'tok/s/chip':>12}{'MFU':>7}  {'bound / status':<s}"
        lines = [head, cols]
        for i, p in enumerate(self.plans, 1):
            c = p.candidate
            mesh = f"{c.data} x {c.fsdp} x {c.tensor}" + (f" cp{c.context}" if c.context > 1 else "") \
                + (f" ep{c.expert}" if c.expert > 1 else "") + (f" pp{c.stage}" if c.stage > 1 else "") \
                + (f" (x{c.slices})" if c.slices > 1 else "")
            hbm = "" if p.total_hbm_bytes is None else f"{p.total_hbm_bytes / GiB:.2f}G"
            step = "" if p.step_seconds is None else _ms(p.step_seconds)
            tok = "" if p.tokens_per_second_per_chip is None else f"{p.tokens_per_second_per_chip:,.0f}"
            mfu = "" if p.mfu is None else f"{p.mfu:.1%}"
            status = (p.bound + (f" ({p.note})" if p.note else "")) if p.fits else \
                p.status + (f": {p.note}" if p.note else "")
            if p.pipeline is not None:
                status += f"; GPipe bubble {p.pipeline.bubble:.0%} (estimate)"
            lines.append(f"{i:>3} {mesh:<22}{c.remat:<10}{f'{c.per_device_batch} x {c.accumulation}':>12}"
                         f"{p.formula_bytes / GiB:>9.2f}G{hbm:>10}{step:>11}{tok:>12}{mfu:>7}  {status}")
        return "\n".join(lines)


def _extra(other: dict[str, float], best: dict[str, float]) -> dict[str, float]:
    """Each term's seconds in ``other`` over ``best`` (a term one plan lacks, like a pipeline's bubble, is 0 there)."""
    return {k: other.get(k, 0.0) - best.get(k, 0.0) for k in [*other, *(k for k in best if k not in other)]}


def _bubble_sentence(p: Plan) -> str:
    c, e = p.candidate, p.pipeline
    return (f"Its pipeline of {c.stage} stages over {c.accumulation} micro-batches (GPipe, an estimate from one "
            f"compiled stage) idles (P - 1) / (M + P - 1) = {e.bubble:.0%} of the step, the bubble "
            f"({_ms(e.bubble_seconds)}).")


def _stage_model(model: DecoderConfig, stage: int) -> DecoderConfig:
    """One of ``stage`` equal stages of ``model`` (``num_layers / stage`` layers; the model itself for 1)."""
    from dataclasses import replace

    from .stages import stage_layers

    return model if stage == 1 else replace(model, num_layers=stage_layers(model.num_layers, stage))


def _layer_activation_bytes(model: DecoderConfig, remat: str, per_device_batch: int, *, attention: str,
                            context: int) -> int:
    """:func:`activation_bytes` without the logits: what a layer stack keeps for its backward pass."""
    logits = per_device_batch * model.seq_len // context * _LOGITS_BYTES * model.vocab_size
    return activation_bytes(model, remat, per_device_batch, attention=attention, context=context) - logits


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _bytes(dtype: str) -> int:
    return {"bfloat16": 2, "float32": 4}[dtype]


def state_bytes(model: DecoderConfig, data: int, fsdp: int, tensor: int, context: int = 1, expert: int = 1) -> int:
    """Parameters and AdamW's two moments per chip, in the master dtype: 12 bytes a float32 parameter,
    each weight divided by the axes it is sharded over (:func:`utils.train_step.lower_train_step`'s rules;
    ``data`` and DCN replicate it; a ``context`` axis splits ``embed`` with fsdp; an ``expert`` axis splits the
    experts, and the other weights' ``embed`` with fsdp). Exact for the builder's
    weights; gradients not included."""
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor, "context": context, "expert": expert}
    per_chip = 0
    for shape, spec in _param_specs(model, context > 1, expert > 1).values():
        n = 1
        for dim, axes in zip(shape, spec, strict=True):
            ways = math.prod(sizes[a] for a in ((axes,) if isinstance(axes, str) else axes or ()))
            n *= -(-dim // ways)
        per_chip += n
    return 3 * _bytes(model.weight_dtype) * per_chip


def activation_bytes(model: DecoderConfig, remat: str, per_device_batch: int, *, attention: str = "dot",
                     context: int = 1) -> int:
    """The activations one micro-step keeps for the backward pass per chip, by remat policy (an estimate).

    Per token and layer, in the activation dtype, what the policy saves (the batch is split over
    data x fsdp and the features over tensor, so a chip holds ``per_device_batch`` sequences' worth, or
    ``1 / context`` of that with a context axis, its queries still scoring every key):
    ``full`` and ``offload`` (on the device) the layer's input; ``minimal`` also the projections' outputs
    that are not ``d_model`` wide (q, k, v and the feed-forward's hidden matrices); ``save_dots`` also the
    attention scores and their product with v; ``none`` also the softmax (float32 and the activation dtype),
    norms and activation function outputs. The scores are S per head per token with ``attention="dot"`` and
    none with ``"flash"``. Plus the loss's two float32 arrays of vocabulary width a token: the logits and, in the
    backward pass, their gradient (8 bytes x vocabulary per token).

    The two ``d_model``-wide outputs (attention's output projection and the feed-forward's last matrix) are
    not counted beside the layer's input, because the compiler keeps one ``d_model``-wide array a layer, not
    three: the feed-forward's output only feeds the residual add, whose gradient needs no values, and the
    next layer saves that sum as its input. The stored program of MaxText's v5p 32B row (minimal remat,
    ``data/published_rows``) holds exactly that: ``bf16[32, 32, 2048, 2560]`` once (the layer input, d_model
    split 4 ways) beside q, k, v and the hidden ``bf16[32, 32, 2048, 8192]``; counting them had put that row
    at 99.6 GiB where the compiler allocates 90.0 GiB, and pruned it and the v5p 64B row.

    The logits were counted three times until 2026-11-28 (logits, log-softmax, one-hot targets: 12 bytes).
    The compiler never holds that much: on the 8B model's 128,256-token vocabulary, four sequences a chip, the
    plans compiled in ``data/plans`` needed 0.55-0.73 of that formula, and it pruned the ``8 x 32 x 1`` plans
    at 17.5 GiB. Counted as two arrays, ``8 x 32 x 1`` with remat ``offload`` is 13.6 GiB by the formula and
    12.9 GiB by the compiler, and it fits.

    How far off (the planner's formula, :func:`state_bytes` + gradients + this, against the compiler's HBM):
    0.70-0.93 of the allocation on MaxText's 14 published rows at the default effort, and 0.57-1.23 on the 76
    plans compiled at O0 in ``data/plans``. Above 1 only on the 8B's plans with remat ``full`` or tensor
    parallelism (1.18-1.23), so there the compiler does not hold both arrays whole at once. Elsewhere it is a
    lower estimate (no working space of the recomputed layer, no compiler copies), and a plan it lets through
    may still be refused by the compiler, which :func:`plan` then records: the 8B's remat ``minimal`` in two
    micro-steps on the v5e-256 is 14.0 GiB by the formula and 16.8 GiB by the compiler.
    """
    m, t = model, per_device_batch * model.seq_len // context
    a = _bytes(m.dtype)
    scores = 0 if attention == "flash" else m.num_heads * m.seq_len
    layer_input = m.d_model
    projections = (m.num_heads + 2 * m.kv_heads) * m.head_dim + (2 if m.gated else 1) * m.d_ff  # no d_model-wide output
    dots = scores + m.num_heads * m.head_dim
    rest = scores * (1 + 4 // a) + 2 * m.d_model + m.d_ff
    per_token = {"full": layer_input, "offload": layer_input, "minimal": layer_input + projections,
                 "save_dots": layer_input + projections + dots,
                 "none": layer_input + projections + dots + rest}[remat]
    return t * (m.num_layers * per_token * a + _LOGITS_BYTES * m.vocab_size)


def guess_seconds(model: DecoderConfig, c: Candidate, chip: Chip, *, model_flops: float,
                  attention: str = "dot") -> float:
    """A paper estimate of a candidate's step, only to decide which candidates to compile first.

    A sum of terms, each counted per micro-step and multiplied by the ``k`` micro-steps of gradient
    accumulation where the builder repeats it (every micro-step is a whole training step: :func:`plan`):

    - **compute**: the model FLOPs plus the remat's recomputation (``_RECOMPUTE``: full 0.22, minimal and
      offload 0.05, the share the compiled programs in ``data/plans`` add to the model FLOPs: 1.20-1.28 and
      1.01-1.08 against 1.035 without remat) at the chip's peak;
    - **hidden behind compute**: FSDP's two bf16 weight gathers a micro-step (forward, backward) over
      fsdp x context x expert ways on one torus axis's two links, and with remat ``offload`` the saved
      projections' trip to host memory and back (the larger of the three counts);
    - **exposed**: FSDP's float32 gradient reduce-scatter at each micro-step's end (the compiled programs
      leave it exposed: about half of the FSDP traffic the time model finds exposed, on every pure-FSDP plan
      stored); tensor parallelism's activation all-reduces, six a layer a micro-step when the forward is
      recomputed (``full``, ``minimal``, ``offload``: minimal saves the matmuls' outputs, not their reduced
      sums) and four otherwise, over the tensor group's links (two on a ring that wraps, one on a line:
      :meth:`utils.timing.Chip.axis_bandwidth`); the context axis's all-gathers of keys and values (forward,
      recomputed with remat ``full``) and the reduce-scatters of their gradients; the expert axis's four
      all-to-alls a layer (six with remat ``full``) of the routed tokens; the gradient all-reduce over
      ``data`` (ICI) and the slices (DCN), once a step;
    - **memory** at the chip's HBM bandwidth (:data:`utils.timing.CHIPS`), a micro-step's reads and writes:
      the chip's bf16 weights read three times (forward, backward for the inputs' and the weights' gradients)
      and once more with remat ``full``; the saved activations (:func:`activation_bytes`) written and read
      back; with dot-product attention, the scores' other passes through HBM (S a head a token, ``_SCORE_PASSES``
      times: 16 with remat ``full``, which computes them twice before the backward pass, 6 otherwise; flash
      attention never writes them); 12 ``d_model``-wide and 3 ``d_ff``-wide elementwise passes a token a layer
      (norms, residual adds, the gate); AdamW's four float32 arrays read and written.

    ``model_flops``: per chip per step. Calibrated against the compiled estimates stored in ``data/plans``
    (:func:`utils.timing.estimate_step`, O0, roofline). On the 67 plans compiled before the scores were counted
    (2026-11-28) the mean error is 6.1%, and two plans of one search are ordered as their compiled estimates
    are in 81% of the pairs; it was 8.4% and 71% before, and 23% before the memory term, the exposed
    reduce-scatter and the per-micro-step all-reduces were counted. Without the scores it under-counted remat
    ``full`` on long dot-product attention (the 70B at 4,096 tokens on the v5p: 0.80 of the compiled estimate,
    against 0.99 for ``minimal``), so the 70B's search compiled ``full`` first and missed ``minimal`` in four
    micro-steps, 10% faster; now it is 0.96 and 1.05, and the search finds ``minimal``. On the 68 plans it then
    chose to compile (``make plans`` again) the mean error is 6.8%. Its largest misses are tensor parallelism
    on a v5p, which it counts too fast (the 70B's ``1 x 32 x 4``: 0.75; the published v5p rows' ``tensor=4``
    and ``8``: 0.85-0.93), and on a v5e's ``1 x 64 x 4`` too slow (1.04-1.19), so a search can spend compiles
    on tensor plans that then rank low. It is still far cruder than :func:`utils.timing.estimate_step`, which
    ranks the compiled plans; it never decreases with more micro-steps, so a mesh and remat's largest
    micro-batch is compiled first. ``attention``: the plan's, ``"dot"`` or ``"flash"`` (:func:`plan`'s). A
    stage axis of ``P``: one stage's guess on one micro-batch (its ``1 / M`` of the FLOPs) plus two sends of its
    activations over one link, times GPipe's ``M + P - 1`` iterations (so there more micro-batches can be
    faster).
    """
    if c.stage > 1:
        one = Candidate(c.data, c.fsdp, c.tensor, c.slices, c.remat, c.per_device_batch, 1, c.context, c.expert)
        stage = guess_seconds(_stage_model(model, c.stage), one, chip, model_flops=model_flops / c.accumulation,
                              attention=attention)
        return (c.accumulation + c.stage - 1) * (stage + 2 * _cut_bytes(model, c) / chip.link_bandwidth)
    k, params = c.accumulation, model.matmul_params()
    a = _bytes(model.dtype)
    compute = model_flops * (1 + _RECOMPUTE[c.remat]) / chip.peak_flops
    ring = 2 * chip.link_bandwidth
    ways = c.fsdp * c.context * c.expert  # the (dense) weights' embed dimension is split over all three
    one_pass = k * (ways - 1) / ways * params / c.tensor / ring  # a byte a parameter over fsdp, every micro-step
    gathers = (2 + 2) * one_pass  # the bf16 weights gathered for the forward and again for the backward: hidden
    reduce_scatter = 4 * one_pass  # the float32 gradients reduce-scattered at each micro-step's end: exposed
    host = 0.0
    if c.remat == "offload":
        saved = (activation_bytes(model, "minimal", c.per_device_batch, context=c.context)
                 - activation_bytes(model, "full", c.per_device_batch, context=c.context))
        host = 2 * k * saved / chip.host_bandwidth
    activations = c.per_device_batch * c.tensor * model.seq_len // c.context * model.d_model * a
    passes = 4 if c.remat in ("none", "save_dots") else 6  # the forward's all-reduces run again when recomputed
    tensor = k * 2 * (c.tensor - 1) / c.tensor * activations * passes * model.num_layers / chip.axis_bandwidth(
        c.tensor, c.tensor)
    kv_passes = 4 if c.remat == "full" else 2
    local_kv = c.per_device_batch * model.seq_len // c.context * 2 * model.kv_heads * model.head_dim  # a chip's k, v
    context = k * (c.context - 1) * local_kv * a * kv_passes * model.num_layers / ring
    grads = 4 * params / (c.fsdp * c.tensor)
    data = 2 * (c.data - 1) / c.data * grads / ring
    dcn = 2 * (c.slices - 1) / c.slices * grads / c.data / chip.dcn_bandwidth
    routed = c.per_device_batch * model.seq_len / c.context * model.experts_per_token * model.capacity_factor
    routed *= model.d_model  # the tokens' share of the experts' buffer a chip sends, in elements
    experts = k * (kv_passes + 2) * (c.expert - 1) / 4 * routed * a * model.num_layers / ring
    tokens = c.per_device_batch * model.seq_len // c.context
    weights = (3 + (c.remat == "full")) * params / c.tensor * a  # forward, backward twice, recompute once
    kept = 2 * activation_bytes(model, c.remat, c.per_device_batch, context=c.context, attention=attention)
    # a chip scores its tensor group's tensor x per_device_batch sequences over num_heads / tensor heads
    scores = 0 if attention == "flash" else tokens * model.num_heads * model.seq_len * model.num_layers * a
    scores *= _SCORE_PASSES[c.remat]  # the softmax's passes over the S x S scores through HBM at O0
    elementwise = tokens * model.num_layers * (12 * model.d_model + 3 * model.d_ff) * a  # norms, adds, gates
    optimizer = 2 * 16 * params / (c.fsdp * c.tensor)  # AdamW reads and writes 4 float32 arrays, every micro-step
    memory = k * (weights + kept + scores + elementwise + optimizer) / chip.hbm_bandwidth
    return max(compute, gathers, host) + memory + reduce_scatter + tensor + context + experts + data + dcn


def _cut_bytes(model: DecoderConfig, c: Candidate) -> int:
    """One micro-batch's activations at a cut between stages, per chip (what a stage sends on)."""
    return c.per_device_batch * model.seq_len // c.context * model.d_model * _bytes(model.dtype)


def _chip(chip: str | Chip, topology: str) -> Chip:
    if isinstance(chip, Chip):
        found = chip
    elif chip in CHIPS or chip.upper() in CHIPS:
        found = CHIPS[chip] if chip in CHIPS else CHIPS[chip.upper()]
    else:
        raise ValueError(f"unknown chip {chip!r}; known chips: {', '.join(CHIPS)} (or pass a utils.timing.Chip)")
    if not isinstance(topology, str) or ":" not in topology:
        raise ValueError(f"topology must name a TPU slice like 'v5e:16x16' or 'v5p:4x4x8' (or 'H100:1x1x8' for one "
                         f"node of 8 H100s), got {topology!r}")
    if topology.split(":")[0].lower() != found.name.lower():
        raise ValueError(f"topology {topology!r} is not a {found.name} slice; name a '{found.name}:...' topology "
                         f"or chip={topology.split(':')[0]!r}")
    return found


def _slice_chips(topology: str) -> int:
    dims = topology.split(":", 1)[1].split("x")
    if not all(d.isdigit() and int(d) > 0 for d in dims):
        raise ValueError(f"topology {topology!r}: the part after ':' must be chip counts joined by 'x', "
                         "like 'v5e:16x16'")
    return math.prod(int(d) for d in dims)


def _divides(model: DecoderConfig, data: int, fsdp: int, tensor: int, context: int = 1, expert: int = 1,
             stage: int = 1) -> str:
    """'' if every sharded dimension of the model divides this mesh, else what does not (and the fix)."""
    if model.num_layers % stage:
        divisors = ", ".join(str(s) for s in range(1, model.num_layers + 1) if model.num_layers % s == 0)
        return (f"num_layers={model.num_layers} is not a multiple of stage={stage}: choose a stage axis that "
                f"divides the layers ({divisors})")
    if expert > 1 and not model.num_experts:
        return f"expert={expert} needs a mixture of experts: set num_experts, or keep the expert axis at 1"
    if model.num_experts % expert:
        return (f"num_experts={model.num_experts} is not a multiple of expert={expert}: choose an expert axis that "
                "divides the experts")
    if model.num_heads % tensor or model.kv_heads % tensor:
        return (f"num_heads={model.num_heads} and num_kv_heads={model.kv_heads} must be multiples of "
                f"tensor={tensor}")
    embed = " x ".join(["fsdp"] + [a for a, n in (("context", context), ("expert", expert)) if n > 1])
    for dim, name, ways, axis in ((model.d_ff, "d_ff", tensor, "tensor"), (model.vocab_size, "vocab_size", tensor,
                                  "tensor"), (model.d_model, "d_model", fsdp * context * expert, embed),
                                  (model.seq_len, "seq_len", context, "context")):
        if dim % ways:
            return f"{name}={dim} is not a multiple of {axis}={ways}"
    return ""


def _factorisations(n: int) -> list[tuple[int, int, int]]:
    return [(d, f, n // (d * f)) for d in range(1, n + 1) if n % d == 0
            for f in range(1, n // d + 1) if (n // d) % f == 0]


def _meshes(n: int, axes: Sequence[str]) -> list[tuple[int, int, int, int, int, int]]:
    """Every (data, fsdp, tensor, context, expert, stage) of n chips; context, expert and stage stay 1 unless in
    ``axes``. The 3-axis meshes come first, in :func:`_factorisations`' order."""
    sizes = [c for c in range(1, n + 1) if n % c == 0]
    contexts = sizes if "context" in axes else [1]
    experts = sizes if "expert" in axes else [1]
    stages = sizes if "stage" in axes else [1]
    extra = sorted(((c, e, s) for c in contexts for e in experts for s in stages if n % (c * e * s) == 0),
                   key=lambda p: (p != (1, 1, 1), p))
    return [(*m, c, e, s) for c, e, s in extra for m in _factorisations(n // (c * e * s))]


def candidates(model: DecoderConfig, *, chips_per_slice: int, num_slices: int = 1, sequences: int,
               remats: Sequence[str] = REMAT_POLICIES, meshes: Sequence[tuple[int, ...]] | None = None,
               axes: Sequence[str] = AXES) -> list[Candidate]:
    """Every candidate of step 1 (see the module's text): meshes ``(data, fsdp, tensor)`` of one slice that
    the model divides (``meshes`` to choose them yourself: each must multiply to ``chips_per_slice`` and
    divide the model; a fourth number is the context axis, a fifth the expert axis, a sixth the stage axis),
    each remat of ``remats``, each micro-batch dividing ``sequences / chips``. ``axes`` with ``"context"``
    (:data:`AXES_CHOICES`) adds every mesh with a context axis that divides ``seq_len``; with ``"expert"``,
    every expert axis that divides ``num_experts``; with ``"stage"``, every stage axis that divides the slice's
    chips and ``num_layers``, with the micro-batches that give GPipe at least as many micro-batches as stages.
    ValueErrors name the fix."""
    if tuple(axes) not in AXES_CHOICES:
        raise ValueError(f"axes must be one of {AXES_CHOICES} (the planner's axes; 'context' and 'expert' are "
                         "opt-in, and so is 'stage', last), "
                         f"got {tuple(axes)!r}")
    for r in remats:
        if r not in REMAT_POLICIES:
            raise ValueError(f"unknown remat {r!r}; choose from {REMAT_POLICIES}")
    chips = chips_per_slice * num_slices
    if meshes is None:
        shapes = [s for s in _meshes(chips_per_slice, axes) if not _divides(model, *s)]  # (n, 1, 1, 1, 1) always
    else:
        shapes = []
        for s in meshes:
            s = tuple(int(x) for x in s)
            if len(s) not in (3, 4, 5, 6) or min(s) < 1 or math.prod(s) != chips_per_slice:
                raise ValueError(f"mesh {s}: (data, fsdp, tensor) must be positive and multiply to the "
                                 f"{chips_per_slice} chips of a slice (for example (1, {chips_per_slice}, 1)); a "
                                 "fourth number, the context axis, a fifth, the expert axis, and a sixth, the stage "
                                 "axis, multiply with them")
            if len(s) == 6 and "stage" not in axes and s[5] > 1:
                raise ValueError(f"mesh {s} has a stage axis of {s[5]}: pass axes=(*AXES, 'stage') to plan a "
                                 "pipeline (an estimate from one compiled stage)")
            if why := _divides(model, *s):
                raise ValueError(f"mesh {s} does not divide the model: {why}; choose another split or change the model")
            shapes.append((*s, 1, 1, 1)[:6])
    found = []
    for d, f, t, c, e, p in shapes:  # a context axis of c chips shares each sequence: chips / c groups take them
        groups = chips // (c * p)  # a stage axis of p: each stage's chips / c groups take every sequence
        if sequences % groups:
            continue
        per_group = sequences // groups
        batches = sorted((b for b in range(1, per_group + 1) if per_group % b == 0 and per_group // b >= p),
                         reverse=True)  # GPipe: at least as many micro-batches as stages
        if meshes is not None and p > 1 and not batches:
            raise ValueError(f"mesh {(d, f, t, c, e, p)}: {per_group} sequences per group of a stage's chips make "
                             f"fewer micro-batches than its {p} stages: make the global batch at least {p} x "
                             f"{groups} x seq_len = {p * groups * model.seq_len:,} tokens, or use fewer stages")
        found += [Candidate(d, f, t, num_slices, r, b, per_group // b, c, e, p) for r in remats for b in batches]
    if not found:
        raise ValueError(f"{sequences} sequences a step do not split over {chips} chips: make the global batch a "
                         f"multiple of {chips} x seq_len = {chips * model.seq_len:,} tokens (the builder gives every "
                         "chip the same whole number of sequences)"
                         + ("" if "context" in axes else ", or add the context axis (axes=(*AXES, 'context'))"))
    return found


def _is_gpu(chip: Chip) -> bool:
    """A GPU target (its interconnect is a switch, ``torus == 0``): compiled by the CUDA compiler, not libtpu."""
    return chip.torus == 0


def _gpu_ready(topology: str, num_slices: int, attention: str) -> None:
    """Check at once that a GPU target can be compiled here; a RuntimeError (no GPU) or ValueError names the fix.

    The CUDA compiler runs only where jax sees an NVIDIA GPU (``jax[cuda12]`` and a driver), unlike libtpu,
    which compiles for any TPU slice with no TPU; so a GPU plan needs a GPU machine and the course never does."""
    import jax

    if num_slices != 1:
        raise ValueError(f"num_slices={num_slices}: a GPU target is one node here ({topology!r}); use num_slices=1")
    if attention != "dot":
        raise ValueError("attention='flash' is the TPU Pallas kernel; use attention='dot' for a GPU target")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as err:
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise RuntimeError(f"planning for {topology!r} compiles with the CUDA compiler, which needs a visible NVIDIA "
                           f"GPU, and jax sees none here ({why}). Plan on a TPU slice instead, which compiles "
                           "with no TPU (chip='v5p', topology='v5p:2x2x2'), or run this on a machine with a GPU "
                           "and jax[cuda12]") from None
    if not gpus:  # pragma: no cover (jax raises above where there is none)
        raise RuntimeError(f"planning for {topology!r} needs a visible NVIDIA GPU; jax sees none")


def _gpu_make_mesh(topology: str, parallelism: Parallelism, *, num_slices: int = 1,
                   allow_split_physical_axes: bool = False) -> Any:
    """The ``(data, fsdp, tensor)`` mesh over a GPU node's compile-only devices
    (``topologies.get_topology_desc(name, "cuda", topology="1x1x8")``), in device order (an NVSwitch node: every
    pair of GPUs is one hop, so the order does not change the time model)."""
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh

    from .capture import quiet

    name, shape = topology.split(":", 1)
    with quiet():
        devices = topologies.get_topology_desc(name.lower(), "cuda", topology=shape).devices
    (ici, _) = parallelism.resolve(len(devices), num_slices)
    return Mesh(np.asarray(devices).reshape(ici), AXES)


def _describe(topology: str, num_slices: int) -> None:
    """Check that libtpu knows the slice (before any compile); a ValueError naming the fix if not."""
    from jax.experimental import topologies

    from .capture import quiet
    from .tpu import tpu_compiler_available

    ok, why = tpu_compiler_available()
    if not ok:
        raise RuntimeError(f"planning needs the TPU compiler to compile candidates ({why}); max_compiles=0 "
                           "ranks nothing but still lists, refuses and prunes by formula")
    try:
        with quiet():
            topologies.get_topology_desc(topology, "tpu", **({"num_slices": num_slices} if num_slices > 1 else {}))
    except Exception as err:  # libtpu's own message, in one line
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ValueError(f"libtpu cannot describe the slice {topology!r}: {first}. Name a shape the chip is sold "
                         "in, like 'v5e:2x4', 'v5e:16x16' or 'v5p:4x4x8'") from None


def _mesh(make_mesh: Any, topology: str, parallelism: Parallelism, num_slices: int) -> tuple[Any, bool]:
    """The candidate's mesh and whether a mesh axis had to split a torus axis ((None, True): no layout at all)."""
    try:
        return make_mesh(topology, parallelism, num_slices=num_slices), False
    except NotImplementedError:  # mesh_utils maps each mesh axis onto whole torus axes unless told otherwise
        pass
    try:
        return make_mesh(topology, parallelism, num_slices=num_slices, allow_split_physical_axes=True), True
    except NotImplementedError:
        return None, True


def _first_stage(mesh: Any, c: Candidate, num_slices: int) -> Any:
    """The first stage's chips of a slice-wide mesh laid out stage-major in ``data`` (:attr:`Candidate.parallelism`),
    in every slice: the mesh its one compiled stage runs on, ``chips / stage`` chips with the same axes."""
    from jax.sharding import Mesh

    grid = mesh.devices
    rest = grid.shape[1:]
    first = grid.reshape(num_slices, c.stage, c.data, *rest)[:, 0].reshape(num_slices * c.data, *rest)
    return Mesh(first, mesh.axis_names)


def _compile(lowered: Any, effort: str) -> Any:
    """``lowered.compile()`` at ``effort`` (``jax_optimization_level``), putting the previous level back."""
    from .capture import quiet
    from .effort import compile_effort

    with compile_effort(effort), quiet():
        return lowered.compile()


def _refusal(err: Exception) -> int | None:
    """The bytes an out-of-HBM compile asked for (None if ``err`` is not one)."""
    m = _OOM.search(str(err))
    return int(float(m.group(1)) * _UNIT[m.group(2)]) if m and "RESOURCE_EXHAUSTED" in str(err) else None

def _compiled_hbm(lowered: Any, effort: str) -> tuple[Any, int]:
    """Compile ``lowered`` at ``effort``: the program and the HBM it needs on one chip. On TPU that is the HBM
    the compiler allocates (``memory_per_device(compiled).footprint``), not ``memory_analysis()``'s larger
    sum. A compile the compiler refuses for HBM gives ``(None, bytes asked)``; any other error is raised."""
    try:
        compiled = _compile(lowered, effort)
    except Exception as err:  # the compiler's refusal is a result; anything else is a real error
        asked = _refusal(err)
        if asked is None:
            raise
        return None, asked
    return compiled, memory_per_device(compiled).footprint


def plan(model: DecoderConfig, *, chip: str | Chip, topology: str, num_slices: int = 1, global_batch_tokens: int,
         remats: Sequence[str] = REMAT_POLICIES, meshes: Sequence[tuple[int, ...]] | None = None,
         attention: str = "dot", max_compiles: int = 8, effort: str = "default",
         axes: Sequence[str] = AXES) -> Ranking:
    """Rank the sharding plans for training ``model`` on ``num_slices`` slices of ``topology``.

    ``model``: a :class:`utils.train_step.DecoderConfig`; ``chip``: a name of :data:`utils.timing.CHIPS`
    (``"v5e"``, ``"v5p"``, ``"v6e"``, ``"H100"``) or a :class:`utils.timing.Chip`; ``topology``: the slice
    (``"v5e:16x16"``), or for ``"H100"`` one node (``"H100:1x1x8"``: the CUDA compiler's
    ``get_topology_desc("h100", "cuda", topology="1x1x8")``, which needs a visible NVIDIA GPU: without one
    :func:`plan` stops at once with a RuntimeError saying to plan on a TPU slice instead; one node, the three
    axes, ``attention="dot"``); ``global_batch_tokens``: tokens per optimizer step, all slices together (a multiple of
    chips x ``seq_len``); ``remats``: the remat policies to try; ``meshes``: restrict the ICI meshes
    ``(data, fsdp, tensor)`` (default: every one the model divides); ``attention``: ``"dot"`` or ``"flash"``
    (:func:`utils.train_step.lower_train_step`); ``max_compiles``: at most this many ahead-of-time compiles
    (each takes seconds to minutes of CPU); ``effort``: ``"default"`` (what a training run gets) or
    ``"O0"``... (``jax_optimization_level``); ``axes``: :data:`AXES_CHOICES`, ``(*AXES, "context")`` to
    search context parallelism too, ``"expert"`` for expert parallelism (a 4-number mesh in ``meshes`` names its
    context size, a 5-number one also its expert size), ``"stage"`` (last) for a GPipe pipeline, an estimate
    from one compiled stage (a 6-number mesh names its stage size). Returns a
    :class:`Ranking` (see the module's text for the
    search). Needs libtpu for the compiles (a RuntimeError says so); bad input raises a ValueError naming
    the fix.
    """
    from .train_step import lower_train_step, make_mesh

    hw = _chip(chip, topology)
    per_slice = _slice_chips(topology)
    if not isinstance(num_slices, int) or num_slices < 1:
        raise ValueError(f"num_slices must be a positive integer, got {num_slices!r}")
    if not isinstance(global_batch_tokens, int) or global_batch_tokens < 1:
        raise ValueError(f"global_batch_tokens must be a positive integer, got {global_batch_tokens!r}")
    if global_batch_tokens % model.seq_len:
        raise ValueError(f"global_batch_tokens={global_batch_tokens:,} is not a whole number of sequences of "
                         f"seq_len={model.seq_len}: use a multiple of {model.seq_len}")
    if effort not in EFFORTS:
        raise ValueError(f"effort must be one of {EFFORTS}, got {effort!r}")
    if not isinstance(max_compiles, int) or max_compiles < 0:
        raise ValueError(f"max_compiles must be a whole number >= 0, got {max_compiles!r}")
    if attention not in ("dot", "flash"):
        raise ValueError(f"attention must be 'dot' or 'flash', got {attention!r}")
    gpu = _is_gpu(hw)
    if gpu:  # at once, before any formula: the CUDA compiler needs a visible GPU
        _gpu_ready(topology, num_slices, attention)
        if tuple(axes) != AXES:
            raise ValueError(f"axes={tuple(axes)}: a GPU target searches {AXES} only; drop the opt-in axes")
    sequences = global_batch_tokens // model.seq_len
    chips = per_slice * num_slices
    found = candidates(model, chips_per_slice=per_slice, num_slices=num_slices, sequences=sequences,
                       remats=remats, meshes=meshes, axes=axes)

    from .published_rows import maxtext_flops_per_device
    from .stages import estimate_pipeline
    from .timing import estimate_step

    model_flops = maxtext_flops_per_device(model, per_device_batch=sequences / chips, formula=MFU_FORMULA)
    hbm = hw.hbm_bytes
    plans: dict[Candidate, Plan] = {}
    plausible = []
    in_flight: dict[Candidate, int] = {}  # a stage axis: GPipe's other M - 1 micro-batches' saved activations
    for c in found:
        m = _stage_model(model, c.stage)
        state = state_bytes(m, c.data, c.fsdp, c.tensor, c.context, c.expert)
        grads = state // 3
        accumulator = grads if c.accumulation > 1 else 0
        in_flight[c] = 0 if c.stage == 1 else (c.accumulation - 1) * _layer_activation_bytes(
            m, c.remat, c.per_device_batch, attention=attention, context=c.context)
        formula = state + grads + accumulator + in_flight[c] + activation_bytes(
            m, c.remat, c.per_device_batch, context=c.context, attention=attention)
        guess = guess_seconds(model, c, hw, model_flops=model_flops, attention=attention)
        if state > hbm:
            plans[c] = Plan(c, "refused", formula, guess, note=f"parameters and moments alone {state / GiB:.2f} GiB")
        elif formula > hbm:
            plans[c] = Plan(c, "pruned", formula, guess, note=f"formula {formula / GiB:.2f} GiB")
        else:
            plausible.append((c, formula, accumulator, guess))
    if gpu:
        make_mesh = _gpu_make_mesh
    elif max_compiles and plausible:
        _describe(topology, num_slices)
    # the paper guess first; a mesh and remat's fewer micro-steps come first (the guess grows with them)
    order = sorted(plausible, key=lambda x: (x[3], x[0].accumulation, x[0].label()))
    compiles, meshes_made, fitted = 0, {}, set()
    for c, formula, accumulator, guess in order:
        key = (c.data, c.fsdp, c.tensor, c.context, c.expert, c.stage, c.remat)
        if key in fitted and c.stage == 1:  # a pipeline's smaller micro-batches shrink its bubble: never skipped
            plans[c] = Plan(c, "skipped", formula, guess, accumulator_bytes=accumulator,
                            note="a larger micro-batch of this mesh and remat fits")
            continue
        if compiles >= max_compiles:
            plans[c] = Plan(c, "not compiled", formula, guess, accumulator_bytes=accumulator,
                            note=f"past max_compiles={max_compiles}")
            continue
        shape = (c.data, c.fsdp, c.tensor, c.context, c.expert, c.stage)
        if shape not in meshes_made:
            meshes_made[shape] = _mesh(make_mesh, topology, c.parallelism, num_slices)
            if c.stage > 1 and meshes_made[shape][0] is not None:
                meshes_made[shape] = (_first_stage(meshes_made[shape][0], c, num_slices), meshes_made[shape][1])
        mesh, split = meshes_made[shape]
        if mesh is None:
            plans[c] = Plan(c, "no layout", formula, guess, accumulator_bytes=accumulator,
                            note=f"mesh_utils cannot lay {c.data} x {c.fsdp} x {c.tensor}"
                                 + (f" x context {c.context}" if c.context > 1 else "")
                                 + (f" x expert {c.expert}" if c.expert > 1 else "")
                                 + (f" x stage {c.stage}" if c.stage > 1 else "") + f" out on {topology}")
            continue
        split_note = "a mesh axis splits a torus axis: allow_split_physical_axes" if split else ""
        compiles += 1
        lowered = lower_train_step(_stage_model(model, c.stage), mesh, per_device_batch=c.per_device_batch,
                                   remat=c.remat, attention=attention)
        compiled, used = _compiled_hbm(lowered, effort)
        if compiled is None:
            plans[c] = Plan(c, "refused", formula, guess, compiled=True, hbm_bytes=used, accumulator_bytes=accumulator,
                            note=f"the compiler needs {used / GiB:.2f} GiB")
            continue
        flight = in_flight[c]
        if used + accumulator + flight > hbm:
            plans[c] = Plan(c, "refused", formula, guess, compiled=True, hbm_bytes=used, accumulator_bytes=accumulator,
                            in_flight_bytes=flight,
                            note=f"the compiler's program needs {used / GiB:.2f} GiB"
                                 + (f", {(used + accumulator) / GiB:.2f} with the accumulator" if accumulator else "")
                                 + (f", {(used + accumulator + flight) / GiB:.2f} with GPipe's micro-batches in "
                                    "flight" if flight else ""))
            continue
        estimate = estimate_step(compiled, mesh, chip=hw, use_cycles=effort == "default" and not gpu)
        pipe = None
        if c.stage > 1:
            pipe = estimate_pipeline(estimate.seconds, stages=c.stage, micro_batches=c.accumulation,
                                     activation_bytes=_cut_bytes(model, c), chip=hw)
            seconds = pipe.seconds
        else:
            seconds = estimate.seconds * c.accumulation
        fitted.add(key)
        plans[c] = Plan(c, "fits", formula, guess, compiled=True, hbm_bytes=used, accumulator_bytes=accumulator,
                        step_seconds=seconds, tokens_per_second_per_chip=global_batch_tokens / seconds / chips,
                        mfu=model_flops / seconds / hw.peak_flops, estimate=estimate, note=split_note,
                        in_flight_bytes=flight, pipeline=pipe)
    rank = {"fits": 0, "refused": 1, "pruned": 2, "no layout": 3, "skipped": 4, "not compiled": 5}
    ordered = sorted(plans.values(), key=lambda p: (rank[p.status], p.step_seconds or 0.0,
                                                    p.total_hbm_bytes or p.formula_bytes, p.candidate.label()))
    return Ranking(tuple(ordered), model, hw, topology, num_slices, global_batch_tokens, effort)


# --- a ranking read back: one plan's place, why the winner beats it, and the ranking as plain data ----------

def find(ranking: Ranking, *, data: int, fsdp: int, tensor: int, remat: str, per_device_batch: int,
         stage: int = 1) -> tuple[int, Plan]:
    """The 1-based place of one plan in ``ranking`` and its :class:`Plan` (for example a published plan's).

    The plan is named by its mesh inside a slice, remat and micro-batch (the slices and the accumulation
    follow from the ranking; ``stage`` names a pipeline's). A ValueError names the fix when the ranking does not
    hold it: pass ``meshes`` and ``remats`` to :func:`plan` that include it, and a global batch that is a
    multiple of its micro-batch.
    """
    for i, p in enumerate(ranking.plans, 1):
        c = p.candidate
        if (c.data, c.fsdp, c.tensor, c.remat, c.per_device_batch, c.stage) == (data, fsdp, tensor, remat,
                                                                                  per_device_batch, stage):
            return i, p
    raise ValueError(f"the ranking holds no plan {data}x{fsdp}x{tensor} {remat} with micro-batch {per_device_batch}: "
                     "call plan() with meshes and remats that include it, and a global batch that is a whole "
                     "number of its micro-batches on every chip")


def versus(ranking: Ranking, other: Plan) -> str:
    """Why the ranking's best plan is preferred to ``other``, in one sentence: the term it loses most on (the
    largest difference of :meth:`Plan.parts`), or why it was not timed (refused, pruned, not compiled)."""
    if not any(p is other for p in ranking.plans):
        raise ValueError("versus() compares a plan of the same ranking: take it from find() or iterate the ranking")
    if not ranking.fitting:
        return "No plan fits, so none is preferred."
    best = ranking.best
    if other == best:
        return f"{other.candidate.label()} is the planner's top plan."
    if not other.fits:
        return (f"{other.candidate.label()} is {other.status}" + (f" ({other.note})" if other.note else "")
                + f", so the planner prefers {best.candidate.label()}.")
    extra = _extra(other.parts(), best.parts())
    lost = max(extra, key=extra.__getitem__)
    return (f"{other.candidate.label()} takes {_ms(other.step_seconds)} against {_ms(best.step_seconds)} for "
            f"{best.candidate.label()} ({other.step_seconds / best.step_seconds - 1:+.1%}): it loses most on "
            f"{lost}, +{_ms(extra[lost])}.")


def record(ranking: Ranking) -> dict[str, Any]:
    """The ranking as plain data (JSON): the search's input, the table and ``why`` as printed, and every plan
    with its status, bytes, seconds and the step's terms. What ``make plans`` stores in ``data/plans``, and
    what :func:`utils.step_pictures.draw_plans` draws."""
    from dataclasses import asdict

    def one(p: Plan) -> dict[str, Any]:
        c = p.candidate
        row = dict(label=c.label(), data=c.data, fsdp=c.fsdp, tensor=c.tensor, slices=c.slices, remat=c.remat,
                    per_device_batch=c.per_device_batch, accumulation=c.accumulation, status=p.status,
                    compiled=p.compiled, formula_bytes=p.formula_bytes, formula_seconds=p.formula_seconds,
                    hbm_bytes=p.hbm_bytes, accumulator_bytes=p.accumulator_bytes, step_seconds=p.step_seconds,
                    tokens_per_second_per_chip=p.tokens_per_second_per_chip, mfu=p.mfu, parts=p.parts(),
                    bound=p.bound, note=p.note)
        if c.stage > 1:  # only a pipeline's plans carry these (stored rankings without one are unchanged)
            row.update(stage=c.stage, micro_batches=c.accumulation, in_flight_bytes=p.in_flight_bytes,
                       bubble=None if p.pipeline is None else p.pipeline.bubble, schedule="GPipe (estimate)")
        return row

    return dict(model=asdict(ranking.model), params=ranking.model.num_params(), chip=ranking.chip.name,
                hbm_bytes=ranking.chip.hbm_bytes, topology=ranking.topology, num_slices=ranking.num_slices,
                global_batch_tokens=ranking.global_batch_tokens, effort=ranking.effort, table=str(ranking),
                why=ranking.why, plans=[one(p) for p in ranking.plans])
