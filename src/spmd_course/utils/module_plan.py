"""Plan a training run for your own Flax NNX module: the module and a TPU slice in, ranked sharding plans out.

Why: :func:`utils.planner.plan` takes a Llama-style :class:`utils.train_step.DecoderConfig`, but a learner's
model is often their own code. :func:`plan_module` takes that code instead. It builds the module abstractly
(``nnx.eval_shape``: every parameter is a ``jax.ShapeDtypeStruct``, nothing is allocated), reads how each
parameter may be sharded from the logical axis names the module gave it, and then searches, compiles and
ranks like the config path, returning the same :class:`utils.planner.Ranking`.

Call::

    from flax import nnx
    from spmd_course.utils.module_plan import plan_module

    ranking = plan_module(lambda: MyModel(rngs=nnx.Rngs(0)), seq_len=2048, vocab_size=32_000,
                          chip="v5e", topology="v5e:2x4", global_batch_tokens=16 * 2048)
    print(ranking, ranking.why)

**What the module must satisfy** (a ValueError names the fix where it does not):

- ``make()`` builds it (a function of no arguments; the planner calls it under ``nnx.eval_shape`` with eager
  sharding off, so no mesh is needed while it is built).
- ``module(tokens)``, with ``tokens`` int32 of shape ``(batch, seq_len)``, returns the logits, shape
  ``(batch, seq_len, vocab_size)``.
- Each ``nnx.Param`` it wants sharded carries logical axis names, one per dimension (``None`` for a
  dimension never split): ``kernel_init=nnx.with_partitioning(init, ("embed", "mlp"))``, which Flax stores as
  the parameter's ``out_sharding``. A parameter without names is replicated on every chip.
- Every name is a key of ``rules``. :data:`LOGICAL_RULES` maps them onto the planner's mesh the way MaxText's
  logical axis rules do: ``embed`` on ``fsdp``; ``mlp``, ``heads``, ``kv_heads`` and ``vocab`` on ``tensor``;
  ``layers``, ``head_dim`` and ``norm`` nowhere. Each candidate mesh gives the same names other sizes.

**The step** is the course's: ``tokens -> logits`` by the module, mean cross-entropy against the targets
(float32), gradients of every ``nnx.Param``, and :func:`utils.train_step.optimizer` (clipping + AdamW), with
parameters and moments donated. The batch is split over ``data x fsdp`` (and the slices over DCN). Other
variables (batch statistics, RNG counters) are inputs replicated on every chip, not updated.

**Candidates**: every ``(data, fsdp, tensor)`` factorisation of the slice whose sizes divide every dimension
the rules split, and every per-device micro-batch that divides the sequences each chip gets, the rest made
up by gradient accumulation (time x accumulation, HBM plus a float32 accumulator, as in the config path).
**Remat is not searched**: the planner cannot wrap a module's layers in ``jax.checkpoint`` without knowing
where they are, and wrapping the whole forward pass would not be any remat a run uses. The module is
compiled as written (its own ``nnx.remat``, if any); its rows are labelled ``as written``.

**Formula**: the parameters, AdamW's two moments and the gradients per chip are exact from each parameter's
sharding (a candidate whose parameters and moments alone exceed HBM is refused without compiling). The
activations depend on code the planner does not read, so nothing is pruned on them: the compiler decides.
The compile order is a paper guess (:func:`guess_module_seconds`). MFU counts 6 x parameters x tokens
(every parameter as a matmul's; no attention term: an estimate).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .planner import (
    EFFORTS,
    Candidate,
    GiB,
    Plan,
    Ranking,
    _chip,
    _compiled_hbm,
    _describe,
    _factorisations,
    _gpu_make_mesh,
    _gpu_ready,
    _is_gpu,
    _mesh,
    _slice_chips,
)
from .timing import Chip

__all__ = ["AS_WRITTEN", "LOGICAL_RULES", "ModuleModel", "abstract_module", "guess_module_seconds", "module_specs",
           "plan_module"]

AS_WRITTEN = "as written"
"""The remat of every module candidate: the module's own (the planner applies none)."""
LOGICAL_RULES: dict[str, str | None] = {"embed": "fsdp", "mlp": "tensor", "heads": "tensor", "kv_heads": "tensor",
                                         "vocab": "tensor", "layers": None, "head_dim": None, "norm": None}
"""Logical axis name -> mesh axis (``None``: never split), MaxText's rules on the planner's three axes."""
MESH_AXES = ("data", "fsdp", "tensor")


@dataclass(frozen=True)
class ModuleModel:
    """What a :class:`utils.planner.Ranking` of a module says of its model: its class, size and token shape."""

    name: str
    params: int
    seq_len: int
    vocab_size: int

    def num_params(self) -> int:
        return self.params


def abstract_module(make: Callable[[], Any]) -> tuple[Any, Any, Any]:
    """``make()`` built abstractly: ``(graphdef, params, rest)`` of ``nnx.split(module, nnx.Param, ...)``, every
    value a ``jax.ShapeDtypeStruct`` (nothing allocated). ValueError naming the fix for anything else."""
    from flax import nnx

    if isinstance(make, nnx.Module) or not callable(make):
        raise ValueError("pass a function that builds the module, like lambda: MyModel(rngs=nnx.Rngs(0)); the "
                         "planner builds it abstractly itself (nnx.eval_shape), so no parameter is allocated")
    with nnx.use_eager_sharding(False):
        module = nnx.eval_shape(make)
    if not isinstance(module, nnx.Module):
        raise ValueError(f"make() must return an nnx.Module, got {type(module).__name__}")
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    if not nnx.to_flat_state(params):
        raise ValueError(f"{type(module).__name__} has no nnx.Param: the planner trains Params")
    return graphdef, params, rest


def module_specs(params: Any, sizes: Mapping[str, int], rules: Mapping[str, str | None] = LOGICAL_RULES) -> Any:
    """Each parameter's ``PartitionSpec`` on a mesh of ``sizes`` (``{"data": d, "fsdp": f, "tensor": t}``), as
    a state of the same tree: its logical names (``out_sharding``) through ``rules``. A ValueError names the
    fix for a name without a rule, names that do not match the dimensions, or a dimension the axis does not
    divide (the last one is what :func:`plan_module` uses to skip a mesh)."""
    from flax import nnx
    from jax.sharding import PartitionSpec as P

    def one(path: tuple, var: Any) -> Any:
        shape, names = var.get_value().shape, var.get_metadata().get("out_sharding")
        where = "/".join(str(p) for p in path)
        if names is None:
            return var.replace(P())
        if len(names) != len(shape):
            raise ValueError(f"parameter {where} {tuple(shape)} has {len(names)} logical names {tuple(names)}: give "
                             "nnx.with_partitioning one name (or None) per dimension")
        axes = []
        for dim, name in zip(shape, names, strict=True):
            if name is not None and name not in rules:
                raise ValueError(f"parameter {where}: no rule for the logical name {name!r}; pass rules= with it "
                                 f"(for example {{**LOGICAL_RULES, {name!r}: 'tensor'}}), or use one of "
                                 f"{sorted(rules)}")
            axis = None if name is None else rules[name]
            if axis is not None and axis not in MESH_AXES:
                raise ValueError(f"rule {name!r} -> {axis!r}: the planner's mesh axes are {MESH_AXES} (or None)")
            if axis is not None and axis in axes:
                axis = None  # one mesh axis splits one dimension at most (jax's rule); later ones replicate
            if axis is not None and dim % sizes[axis]:
                raise ValueError(f"parameter {where} {tuple(shape)}: its {name!r} dimension of {dim} does not divide "
                                 f"over {axis}={sizes[axis]}; choose a mesh whose {axis} divides it")
            axes.append(axis)
        return var.replace(P(*axes))

    flat = [(path, one(path, var)) for path, var in nnx.to_flat_state(params)]
    return nnx.from_flat_state(flat)


def _state_bytes(params: Any, specs: Any, sizes: Mapping[str, int]) -> tuple[int, int]:
    """Per chip: the parameters (in their dtype) and the parameter count, each divided by its split."""
    from flax import nnx

    total = count = 0
    spec_of = dict(nnx.to_flat_state(specs))
    for path, var in nnx.to_flat_state(params):
        value, spec = var.get_value(), spec_of[path].get_value()
        n = math.prod(value.shape) // math.prod(sizes[a] for a in spec if a is not None)
        total += n * value.dtype.itemsize
        count += math.prod(value.shape)
    return total, count


def guess_module_seconds(c: Candidate, chip: Chip, *, params: int, param_bytes: int, tokens: int,
                         embed: int) -> float:
    """A paper estimate of a module candidate's step, only to order its compiles: 6 x ``params`` x ``tokens``
    FLOPs (a chip's, per step) at peak; hidden behind them FSDP's weight gathers (twice) and gradient
    reduce-scatter over ``fsdp`` once a micro-step; exposed, tensor parallelism's all-reduce of a micro-batch's
    activations (``embed`` wide, bf16) twice forward and twice backward, and the gradient all-reduce over
    ``data`` and DCN. ``param_bytes``: all the parameters' bytes (unsharded)."""
    k, ring = c.accumulation, 2 * chip.link_bandwidth
    compute = 6 * params * tokens / chip.peak_flops
    fsdp = k * (c.fsdp - 1) / c.fsdp * param_bytes / c.tensor * 3 / ring
    tensor = 4 * tokens * embed * 2 * 2 * (c.tensor - 1) / c.tensor / ring * c.tensor
    grads = param_bytes / (c.fsdp * c.tensor)
    data = 2 * (c.data - 1) / c.data * grads / ring
    dcn = 2 * (c.slices - 1) / c.slices * grads / c.data / chip.dcn_bandwidth
    return max(compute, fsdp) + tensor + data + dcn


def _lower(graphdef: Any, params: Any, rest: Any, specs: Any, mesh: Any, batch: int, seq_len: int,
           vocab_size: int) -> Any:
    """The module's training step lowered on ``mesh`` with every input abstract and sharded."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from .train_step import optimizer

    tx = optimizer()

    def loss_fn(p, r, tokens, targets):
        logits = nnx.merge(graphdef, p, r)(tokens)
        if logits.shape != (*tokens.shape, vocab_size):
            raise ValueError(f"the module returned {logits.shape} for tokens {tokens.shape}: it must return logits "
                             f"(batch, seq_len, vocab_size) = {(*tokens.shape, vocab_size)}; check vocab_size")
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()

    def step(p, opt_state, r, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(p, r, tokens, targets)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    def sharded(value: Any, spec: Any) -> Any:
        return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=NamedSharding(mesh, spec))

    spec_of = dict(nnx.to_flat_state(specs))
    p_state = nnx.from_flat_state([(path, var.replace(sharded(var.get_value(), spec_of[path].get_value())))
                                   for path, var in nnx.to_flat_state(params)])
    target = jax.tree.structure(p_state)

    def moments(node: Any) -> Any:  # AdamW's mu and nu are shaped like the parameters: give them their shardings
        if isinstance(node, nnx.State) and jax.tree.structure(node) == target:
            return jax.tree.map(lambda v, ref: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=ref.sharding),
                                node, p_state)
        return jax.tree.map(lambda v: sharded(v, P()), node)  # step counts: replicated

    opt_state = jax.tree.map(moments, jax.eval_shape(tx.init, p_state),
                             is_leaf=lambda n: isinstance(n, (nnx.State, jax.ShapeDtypeStruct)))
    r = jax.tree.map(lambda v: sharded(v, P()), rest)
    tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32, sharding=NamedSharding(mesh, P(("data", "fsdp"))))
    return jax.jit(step, donate_argnums=(0, 1)).lower(p_state, opt_state, r, tokens, tokens)


def plan_module(make: Callable[[], Any], *, seq_len: int, vocab_size: int, chip: str | Chip, topology: str,
                num_slices: int = 1, global_batch_tokens: int, rules: Mapping[str, str | None] = LOGICAL_RULES,
                meshes: Sequence[tuple[int, int, int]] | None = None, max_compiles: int = 8,
                effort: str = "default") -> Ranking:
    """Rank the sharding plans for training the module ``make()`` builds (see the module's text for what it
    must satisfy, the step, the candidates and what is an estimate).

    ``seq_len`` and ``vocab_size``: the token shape the module reads and the logits' last dimension;
    ``rules``: logical axis name -> ``"data"``, ``"fsdp"``, ``"tensor"`` or None (:data:`LOGICAL_RULES`);
    ``meshes``: restrict the ``(data, fsdp, tensor)`` meshes. The rest as :func:`utils.planner.plan`
    (``chip="H100"``, ``topology="H100:1x1x8"`` needs a visible GPU and stops at once without one). Returns a
    :class:`utils.planner.Ranking` whose rows' remat is ``"as written"``. Needs libtpu for the compiles; bad
    input raises a ValueError naming the fix.
    """
    from flax import nnx

    from .train_step import make_mesh

    hw = _chip(chip, topology)
    per_slice = _slice_chips(topology)
    for name, value in (("seq_len", seq_len), ("vocab_size", vocab_size), ("num_slices", num_slices),
                        ("global_batch_tokens", global_batch_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if global_batch_tokens % seq_len:
        raise ValueError(f"global_batch_tokens={global_batch_tokens:,} is not a whole number of sequences of "
                         f"seq_len={seq_len}: use a multiple of {seq_len}")
    if effort not in EFFORTS:
        raise ValueError(f"effort must be one of {EFFORTS}, got {effort!r}")
    if not isinstance(max_compiles, int) or max_compiles < 0:
        raise ValueError(f"max_compiles must be a whole number >= 0, got {max_compiles!r}")
    gpu = _is_gpu(hw)
    if gpu:  # at once: the CUDA compiler needs a visible GPU (utils.planner.plan's rule)
        _gpu_ready(topology, num_slices, "dot")
    graphdef, params, rest = abstract_module(make)
    name = graphdef.nodes[0].type.__name__  # the module's class (the graph's root node)
    sequences, chips = global_batch_tokens // seq_len, per_slice * num_slices
    if sequences % chips:
        raise ValueError(f"{sequences} sequences a step do not split over {chips} chips: make the global batch a "
                         f"multiple of {chips} x seq_len = {chips * seq_len:,} tokens")
    per_chip = sequences // chips
    shapes = _factorisations(per_slice) if meshes is None else [tuple(int(x) for x in m) for m in meshes]
    layouts = {}
    for s in shapes:
        if len(s) != 3 or min(s) < 1 or math.prod(s) != per_slice:
            raise ValueError(f"mesh {s}: (data, fsdp, tensor) must be positive and multiply to the {per_slice} "
                             f"chips of a slice, for example (1, {per_slice}, 1)")
        sizes = dict(zip(MESH_AXES, s, strict=True))
        try:
            layouts[s] = module_specs(params, sizes, rules)
        except ValueError as err:
            if meshes is not None or "does not divide" not in str(err):
                raise
    one = dict.fromkeys(MESH_AXES, 1)
    full_bytes, count = _state_bytes(params, module_specs(params, one, rules), one)
    embed = max((v.get_value().shape[i] for _, v in nnx.to_flat_state(params)  # the model's width, for the guess
                 for i, n in enumerate(v.get_metadata().get("out_sharding") or ()) if n == "embed"), default=1)
    model = ModuleModel(name, count, seq_len, vocab_size)
    model_flops = 6 * count * per_chip * seq_len
    hbm, plans, plausible = hw.hbm_bytes, {}, []
    for s, specs in layouts.items():
        sizes = dict(zip(MESH_AXES, s, strict=True))
        weights, _ = _state_bytes(params, specs, sizes)
        state = 3 * weights
        for b in sorted((b for b in range(1, per_chip + 1) if per_chip % b == 0), reverse=True):
            c = Candidate(*s, num_slices, AS_WRITTEN, b, per_chip // b)
            accumulator = weights if c.accumulation > 1 else 0  # float32 master weights: the same bytes
            formula = state + weights + accumulator
            guess = guess_module_seconds(c, hw, params=count, param_bytes=full_bytes, tokens=per_chip * seq_len,
                                         embed=embed)
            if state > hbm:
                plans[c] = Plan(c, "refused", formula, guess,
                                note=f"parameters and moments alone {state / GiB:.2f} GiB")
            else:
                plausible.append((c, formula, accumulator, guess, specs))
    if gpu:
        make_mesh = _gpu_make_mesh
    elif max_compiles and plausible:
        _describe(topology, num_slices)
    compiles, fitted = 0, set()
    for c, formula, accumulator, guess, specs in sorted(plausible, key=lambda x: (x[3], x[0].accumulation,
                                                                                   x[0].label())):
        key = (c.data, c.fsdp, c.tensor)
        if key in fitted:
            plans[c] = Plan(c, "skipped", formula, guess, accumulator_bytes=accumulator,
                            note="a larger micro-batch of this mesh fits")
            continue
        if compiles >= max_compiles:
            plans[c] = Plan(c, "not compiled", formula, guess, accumulator_bytes=accumulator,
                            note=f"past max_compiles={max_compiles}")
            continue
        mesh, split = _mesh(make_mesh, topology, c.parallelism, num_slices)
        if mesh is None:
            plans[c] = Plan(c, "no layout", formula, guess, accumulator_bytes=accumulator,
                            note=f"mesh_utils cannot lay {c.data} x {c.fsdp} x {c.tensor} out on {topology}")
            continue
        compiles += 1
        lowered = _lower(graphdef, params, rest, specs, mesh, c.per_device_batch * chips, seq_len, vocab_size)
        compiled, used = _compiled_hbm(lowered, effort)  # the HBM the compiler allocates
        if compiled is None:
            plans[c] = Plan(c, "refused", formula, guess, compiled=True, hbm_bytes=used, accumulator_bytes=accumulator,
                            note=f"the compiler needs {used / GiB:.2f} GiB")
            continue
        from .timing import estimate_step

        if used + accumulator > hbm:
            plans[c] = Plan(c, "refused", formula, guess, compiled=True, hbm_bytes=used, accumulator_bytes=accumulator,
                            note=f"the compiler's program needs {(used + accumulator) / GiB:.2f} GiB")
            continue
        estimate = estimate_step(compiled, mesh, chip=hw, use_cycles=effort == "default" and not gpu)
        seconds = estimate.seconds * c.accumulation
        fitted.add(key)
        plans[c] = Plan(c, "fits", formula, guess, compiled=True, hbm_bytes=used, accumulator_bytes=accumulator,
                        step_seconds=seconds, tokens_per_second_per_chip=global_batch_tokens / seconds / chips,
                        mfu=model_flops / seconds / hw.peak_flops, estimate=estimate,
                        note="a mesh axis splits a torus axis: allow_split_physical_axes" if split else "")
    rank = {"fits": 0, "refused": 1, "pruned": 2, "no layout": 3, "skipped": 4, "not compiled": 5}
    ordered = sorted(plans.values(), key=lambda p: (rank[p.status], p.step_seconds or 0.0,
                                                    p.total_hbm_bytes or p.formula_bytes, p.candidate.label()))
    return Ranking(tuple(ordered), model, hw, topology, num_slices, global_batch_tokens, effort)

