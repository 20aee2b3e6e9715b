"""Exercises of notebook 25: a plan's state per chip by hand, and a plan for a model of the learner's own.

Both checkers hold the answer against the planner (utils.planner) without compiling: the first against its
exact count of state per chip, the second against its formula (does the plan exist, does it fit) and its
paper estimate of the step (is it near the best the formula lets through). Compiling is left to the learner,
with the call the notebook shows, because a full-size compile takes tens of seconds.
"""

from __future__ import annotations

import math
from typing import Any

from spmd_course.utils.exercises import Exercise, near, plain, positive_number
from spmd_course.utils.planner import find, plan, state_bytes
from spmd_course.utils.stored_plans import LLAMA3_8B
from spmd_course.utils.timing import CHIPS
from spmd_course.utils.train_step import REMAT_POLICIES, DecoderConfig

# Exercise 1: Llama 3 8B, pure FSDP over the 256 chips of a v5e-256 (1 x 256 x 1)
_N = LLAMA3_8B.num_params()  # 8,030,261,248
_STATE = state_bytes(LLAMA3_8B, 1, 256, 1) * 4 // 3  # parameters and two moments (12 bytes) + gradients (4)


def _check_state_per_chip(answer: object) -> None:
    b = positive_number(answer, "the bytes per chip")
    assert not near(b, 12 * _N / 256), (
        "that is the parameters and AdamW's two moments (12 bytes a parameter); the float32 gradients take 4 more"
    )
    assert not near(b, 16 * _N), "that is the whole model's state on one chip: FSDP splits it over the 256 chips"
    assert not near(b, 16 * _N / 64), "64 is the FSDP axis of (1, 64, 4); this plan is (1, 256, 1): 256 ways"
    assert not near(b, 2 * _N / 256), "bf16 weights alone: the master copy is float32, with two moments and a gradient"
    assert not near(b, 16 * _N / 256 / 2**30, 0.05) and not near(b, 16 * _N / 256 / 1e9, 0.05), (
        "give bytes, not GiB or GB"
    )
    assert near(b, _STATE), f"{b:,.0f} is not it: 16 bytes a parameter (4 + 4 + 4 + 4), split 256 ways"


state_per_chip = Exercise(
    title="Exercise 1: state per chip, by hand",
    checker=_check_state_per_chip,
    solution=_STATE,
    wrong=(12 * _N / 256, 16 * _N, 16 * _N / 64, 2 * _N / 256, 16 * _N / 256 / 2**30, 1e9),
    hint="float32 parameters, two float32 AdamW moments and float32 gradients: 16 bytes a parameter, over 256 chips",
    explanation=(
        "About 0.47 GiB (502 million bytes): 16 x 8.03e9 / 256. The planner counts it weight by weight "
        "(planner.state_bytes, x 4/3 for the gradients), and on this plan the two agree to the byte but for "
        "rounding. It is a small part of the 15.75 GiB: what decides the plan is the activations and the logits."
    ),
)


# Exercise 2: a plan for a model of the learner's own
_KEYS = ("model", "chip", "topology", "global_batch_tokens", "mesh", "remat", "per_device_batch")
_TOLERANCE = 1.25  # within 25% of the best paper estimate among the plans the formula lets through
MY_13B = DecoderConfig(num_layers=40, d_model=5120, num_heads=40, head_dim=128, d_ff=13824, vocab_size=32_000,
                       seq_len=4096)
_SOLUTION = dict(model=MY_13B, chip="v5e", topology="v5e:16x16", global_batch_tokens=2**22, mesh=(1, 256, 1),
                 remat="offload", per_device_batch=4)


def _read(answer: object) -> dict[str, Any]:
    assert isinstance(answer, dict), (
        f"give a dict with the keys {', '.join(_KEYS)}; got {type(answer).__name__}"
    )
    missing = [k for k in _KEYS if k not in answer]
    assert not missing, f"the dict lacks {missing}: it needs {', '.join(_KEYS)}"
    a = dict(answer)
    assert isinstance(a["model"], DecoderConfig), (
        f"'model' is a utils.train_step.DecoderConfig (layers, widths, heads...); got {type(a['model']).__name__}"
    )
    assert a["model"].num_params() >= 1e9, (
        f"your model has {a['model'].num_params() / 1e6:,.0f}M parameters: plan one of at least a billion, which "
        "needs more than one chip"
    )
    assert a["chip"] in CHIPS and isinstance(a["topology"], str), (
        f"'chip' is one of {sorted(CHIPS)} and 'topology' a slice such as 'v5e:16x16'; got {a['chip']!r}, "
        f"{a['topology']!r}"
    )
    mesh = plain(a["mesh"])
    assert isinstance(mesh, tuple) and len(mesh) == 3 and all(isinstance(x, int) and x > 0 for x in mesh), (
        f"'mesh' is (data, fsdp, tensor), three positive whole numbers; got {a['mesh']!r}"
    )
    assert a["remat"] in REMAT_POLICIES, f"'remat' is one of {REMAT_POLICIES}; got {a['remat']!r}"
    for key in ("global_batch_tokens", "per_device_batch"):
        value = plain(a[key])
        assert isinstance(value, int) and not isinstance(value, bool) and value > 0, (
            f"{key!r} is a positive whole number; got {a[key]!r}"
        )
        a[key] = value
    a["mesh"] = mesh
    return a


def _check_my_plan(answer: object) -> None:
    a = _read(answer)
    try:
        ranking = plan(a["model"], chip=a["chip"], topology=a["topology"], global_batch_tokens=a["global_batch_tokens"],
                       max_compiles=0)  # the formula's steps only: no compile
    except ValueError as err:
        raise AssertionError(f"the planner refuses the target: {err}") from None
    data, fsdp, tensor = a["mesh"]
    try:
        _, mine = find(ranking, data=data, fsdp=fsdp, tensor=tensor, remat=a["remat"],
                       per_device_batch=a["per_device_batch"])
    except ValueError:
        chips = math.prod(int(d) for d in a["topology"].split(":")[1].split("x"))
        raise AssertionError(
            f"the planner has no plan {data}x{fsdp}x{tensor} {a['remat']} with micro-batch {a['per_device_batch']}: "
            f"the mesh must multiply to the slice's {chips} chips and divide the model (heads, kv heads, d_ff and "
            "vocabulary by tensor, d_model by fsdp), and the micro-batch must divide the sequences each chip gets"
        ) from None
    assert mine.status not in ("refused", "pruned"), (
        f"{mine.candidate.label()} does not fit: {mine.note}, against {CHIPS[a['chip']].hbm_bytes / 2**30:.2f} GiB; "
        "split the state further (more fsdp), save less (remat 'full') or take a smaller micro-batch"
    )
    plausible = [p for p in ranking if p.status not in ("refused", "pruned")]
    best = min(plausible, key=lambda p: p.formula_seconds)
    assert mine.formula_seconds <= _TOLERANCE * best.formula_seconds, (
        f"{mine.candidate.label()} fits, but the planner's paper estimate gives it {mine.formula_seconds:.3g} s "
        f"against {best.formula_seconds:.3g} s for {best.candidate.label()}: "
        "tensor parallelism sends activations every layer, data parallelism replicates the state, more "
        "micro-steps repeat FSDP's gathers; choose a plan nearer the best"
    )


my_plan = Exercise(
    title="Exercise 2: plan a model of your own",
    checker=_check_my_plan,
    solution=_SOLUTION,
    wrong=(
        {**_SOLUTION, "mesh": (256, 1, 1)},  # data parallelism: the whole state on every chip
        {**_SOLUTION, "remat": "none"},  # every activation kept: pruned by the formula
        {**_SOLUTION, "mesh": (1, 32, 8)},  # tensor parallelism over 8 chips: fits, but slow on paper
        {**_SOLUTION, "remat": "full"},  # fits, but recomputes 4,096-token attention scores: a third slower on paper
        {**_SOLUTION, "mesh": (1, 85, 3)},  # does not multiply to 256 chips
        {**_SOLUTION, "per_device_batch": 3},  # 4 sequences a chip do not split into micro-batches of 3
        {**_SOLUTION, "topology": "v5e-256"},  # not a slice name the planner reads
        {**_SOLUTION, "model": DecoderConfig(num_layers=2, d_model=256, num_heads=4, head_dim=64, d_ff=512,
                                             vocab_size=512, seq_len=128)},  # too small to need a plan
        {k: v for k, v in _SOLUTION.items() if k != "remat"},
    ),
    hint=("call planner.plan(model, chip=..., topology=..., global_batch_tokens=..., max_compiles=0): it lists every "
          "plan with its formula HBM and paper estimate; start from pure FSDP over every chip, a remat that keeps the "
          "matmul outputs for the backward pass ('offload' keeps them in host memory) and the largest micro-batch "
          "that fits"),
    explanation=(
        "One answer: a 13B model (Llama 2 13B's shape, 4,096 tokens a sequence) on a v5e-256 with a 4M-token batch, "
        "planned as (1, 256, 1), remat 'offload', 4 sequences a chip in one micro-step: 10.9 GiB by the formula. "
        "Remat 'full' fits too, but recomputing the forward pass recomputes 4,096 x 4,096 attention scores, so "
        "on paper it is a third slower. Then compile it for the real verdict: plan(model, chip='v5e', "
        "topology='v5e:16x16', global_batch_tokens=2**22, meshes=[(1, 256, 1)], remats=['offload', 'full'], "
        "max_compiles=3, effort='O0')."
    ),
)
