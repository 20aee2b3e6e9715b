# %% [markdown]
# # 19 · Expert parallelism: a mixture of experts on an `expert` axis
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/19_experts.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/19_experts.ipynb)
#
# Mixtral 8x7B holds 46.7 billion parameters, 45.1 billion of them in its 8 experts per layer, yet each
# token runs through only 2 experts, 12.9 billion parameters. Put each expert on its own devices and
# memory divides by the `expert` axis, but every token must travel to its experts' devices and back.
#
# **You need:** notebooks 06 (`jax.shard_map`), 10 (FSDP), 12 (a transformer block) and 15 (the time
# model, `estimate_step`); `jax.lax.all_to_all`, `jax.lax.top_k`, `jax.lax.with_sharding_constraint`.
#
# You will build a mixture-of-experts layer, check it against a loop over tokens, spread its experts
# over devices, and size a Mixtral-shaped training step for a TPU slice.
#
# **You will learn**
# - how a mixture-of-experts layer routes: a top-k router, a capacity per expert, the tokens it drops,
#   and the load-balancing loss that keeps the experts evenly used;
# - how expert parallelism moves tokens with two all-to-alls, written by hand in `jax.shard_map` or
#   left to the compiler with sharding annotations, and equal to a reference that loops over tokens;
# - how many bytes each all-to-all moves, from the compiled program and from a formula;
# - how experts combine with FSDP on a 2-D mesh, and what a Mixtral-shaped training step needs on a
#   TPU v5p slice: its collectives, its HBM and its estimated time.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title Setup: 8 devices (the same cell opens every notebook; notebook 00 explains it)
import subprocess
import sys
from pathlib import Path

course = next((p for p in (Path.cwd().parent, Path("spmd-course")) if (p / "src" / "spmd_course").is_dir()), None)
if course is None and "google.colab" in sys.modules:  # a notebook alone on Colab: fetch the course, whole or not at all
    url, tmp = "https://github.com/spmd-course/spmd-sharding-course", "spmd-course.tmp"
    subprocess.run(["rm", "-rf", "spmd-course", tmp], check=True)
    git = subprocess.run(["git", "clone", "-q", "--depth", "1", url, tmp], capture_output=True, text=True)
    assert git.returncode == 0, f"could not fetch the course (is the network on?): {git.stderr}"
    course = Path(tmp).rename("spmd-course")
sys.path[:0] = [str(course.resolve() / "src")] if course else []  # the clone's package, spmd_course
from spmd_course.utils import launch, setup_devices

launch.prepare_runtime()  # Colab: installs what is missing. Binder: shows memory in use. Any: flags untested versions.
SETUP = setup_devices(8)
CPU, RTOL = SETUP.cpu, SETUP.rtol  # compiler facts marked CPU are the CPU compiler's; RTOL: float32 tolerance

# %%
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import NOT_ANSWERED, assert_close, collectives, draw_routing, format_bytes, quiet, tpu_compiler_available

# %% [markdown]
# ## 1. The layer: a router, a capacity, and a reference that loops over tokens
#
# A mixture-of-experts (MoE) layer replaces a transformer's feed-forward network with `E` of them, the
# experts, and a **router**: a `D x E` matrix whose softmax gives each token a probability per expert. Each
# token goes to its `k` most probable experts, and their outputs are summed, weighted by those
# probabilities renormalised over the `k` (Mixtral's rule). Because a token uses `k` of the `E` experts,
# the layer holds `E` times a dense layer's weights for `k` times its compute.
#
# Arrays need fixed shapes, so each expert takes at most `C` tokens, its **capacity**:
# `C = ceil(capacity_factor x k x tokens / E)`, the even share times a margin. Tokens queue for an expert in
# order; a token that finds its expert full is **dropped** by that expert (its residual connection still
# carries it forward). The count is per group of tokens: here a group is the tokens one device holds, as
# in GShard, so the count never needs the other devices. An unbalanced router drops many tokens, so
# training adds a **load-balancing loss** (Switch Transformer): `E x sum_e f_e x p_e`, with `f_e` the
# fraction of the choices that went to expert `e` and `p_e` its mean router probability. It is 1 when the
# experts are evenly used and grows as they are not.
#
# The reference states all of this one token at a time: a `jax.lax.scan` over each group's tokens,
# carrying how full each expert is. Each expert is a gated feed-forward network (SwiGLU, as in Mixtral).
# The programs that run on the CPU here are compiled with `FAST_COMPILE`, which skips optimising their
# machine code (notebook 12): their partitioning and collectives, which is what we read, are decided
# before that stage, and at these sizes they run in milliseconds anyway.

# %%
E, K, D, F = 8, 2, 32, 64  # experts, experts per token, model width, expert hidden width
TOKENS, GROUPS = 256, 8  # 8 groups of 32 tokens: one group per device in sections 2 to 4
FAST_COMPILE = {"xla_backend_optimization_level": 0}  # CPU programs: skip optimising machine code
rng = np.random.default_rng(0)  # numpy's generator: fixed numbers, nothing to compile
params = {"router": 3 * rng.standard_normal((D, E), np.float32) / np.sqrt(D),  # x3: a confident, unbalanced router
          "w_gate": rng.standard_normal((E, D, F), np.float32) / np.sqrt(D),
          "w_up": rng.standard_normal((E, D, F), np.float32) / np.sqrt(D),
          "w_down": rng.standard_normal((E, F, D), np.float32) / np.sqrt(F)}
tokens = rng.standard_normal((TOKENS, D), np.float32)


def capacity_of(group_tokens, k, experts, factor):
    """Each expert's capacity, in tokens of one group."""
    return math.ceil(factor * k * group_tokens / experts)


def reference(params, x, *, k, capacity, groups):
    """The MoE layer one token at a time: returns (output, load-balancing loss, dropped choices)."""
    experts = params["router"].shape[1]

    def one_token(taken, xt):  # taken[e]: how many of this group's tokens expert e has accepted so far
        probs = jax.nn.softmax(xt @ params["router"])
        top_p, top_e = jax.lax.top_k(probs, k)
        gates = top_p / top_p.sum()  # renormalised over the k chosen experts
        out, dropped = jnp.zeros_like(xt), 0
        for j in range(k):
            e = top_e[j]
            fits = taken[e] < capacity
            hidden = jax.nn.silu(xt @ params["w_gate"][e]) * (xt @ params["w_up"][e])
            out = out + jnp.where(fits, gates[j], 0.0) * (hidden @ params["w_down"][e])
            dropped, taken = dropped + (~fits), taken.at[e].add(1)
        return taken, (out, dropped, probs, top_e)

    def one_group(xg):  # each group counts its own tokens from zero
        return jax.lax.scan(one_token, jnp.zeros(experts, jnp.int32), xg)[1]

    out, dropped, probs, top_e = jax.vmap(one_group)(x.reshape(groups, -1, x.shape[-1]))
    f = jax.nn.one_hot(top_e, experts).reshape(-1, experts).mean(0)  # fraction of the choices per expert
    return out.reshape(x.shape), experts * jnp.sum(f * probs.reshape(-1, experts).mean(0)), dropped.sum()


def loss_of(outputs):
    """A training loss stand-in: the output against fixed weights, plus 0.1 x the load-balancing loss."""
    y, balance, _ = outputs
    return jnp.sum(y * jnp.cos(jnp.arange(y.size, dtype=y.dtype)).reshape(y.shape)) + 0.1 * balance


def loss_and_grads(layer):
    """A jitted function (params, x) -> ((loss, (output, balance loss, dropped)), gradients w.r.t. params and x)."""
    def run(params, x):
        outputs = layer(params, x)
        return loss_of(outputs), outputs
    return jax.jit(jax.value_and_grad(run, argnums=(0, 1), has_aux=True), compiler_options=FAST_COMPILE)


CAPACITY = capacity_of(TOKENS // GROUPS, K, E, factor=1.0)
(ref_loss, (ref_y, ref_balance, ref_dropped)), ref_grads = loss_and_grads(
    partial(reference, k=K, capacity=CAPACITY, groups=GROUPS))(params, tokens)
print(f"capacity {CAPACITY} tokens per expert per group; dropped {int(ref_dropped)} of {TOKENS * K} choices; "
      f"load-balancing loss {float(ref_balance):.3f}")
assert 0 < int(ref_dropped) < TOKENS * K and float(ref_balance) > 1

# %% [markdown]
# With a capacity factor of 1 each expert takes 8 of a group's 32 tokens x 2 choices, and this router,
# whose weights are 3 times larger than usual so that its choices are uneven, drops about one choice in
# seven. The load-balancing loss is above 1 for the same reason.
#
# The reference is clear and slow: one token at a time. The layer that runs builds two tensors per group
# instead. `dispatch[t, e, c]` is 1 where token `t` takes slot `c` of expert `e`, and `combine` is the
# same with the gate weights. Then `einsum('tec,td->ecd')` gathers each expert's `C` tokens into an
# `(E, C, D)` buffer, the experts run as one batched matmul, and `einsum('tec,ecd->td')` puts the results
# back. A token's slot is its rank in the queue: a running count (`cumsum`) of the choices before it.

# %%
def route(router, x, *, k, capacity):
    """One group's routing: dispatch and combine tensors (T, E, C) and the statistics of its choices."""
    experts = router.shape[1]
    probs = jax.nn.softmax(x @ router, axis=-1)
    top_p, top_e = jax.lax.top_k(probs, k)
    gates = top_p / top_p.sum(-1, keepdims=True)
    choice = jax.nn.one_hot(top_e, experts, dtype=x.dtype)  # (T, k, E)
    queue = jax.nn.one_hot(top_e.reshape(-1), experts, dtype=jnp.int32)  # the choices in token order, then by rank
    # place in its expert's queue, counted in integers (bfloat16 counts exactly only up to 256)
    slot = ((jnp.cumsum(queue, axis=0) - 1) * queue).sum(-1).reshape(top_e.shape)
    fits = slot < capacity
    in_slot = jax.nn.one_hot(jnp.where(fits, slot, capacity), capacity, dtype=x.dtype)  # all zeros when dropped
    dispatch = jnp.einsum("tke,tkc->tec", choice, in_slot)
    combine = jnp.einsum("tke,tkc,tk->tec", choice, in_slot, gates.astype(x.dtype))
    stats = {"dropped": jnp.sum(~fits), "f": queue.mean(0, dtype=jnp.float32), "p": probs.mean(0), "expert": top_e,
             "slot": slot}
    return dispatch, combine, stats


def experts_ffn(w, x):
    """Every expert's SwiGLU on its own tokens: x (E, ..., D) -> (E, ..., D)."""
    hidden = jax.nn.silu(jnp.einsum("e...d,edf->e...f", x, w["w_gate"])) * jnp.einsum("e...d,edf->e...f", x, w["w_up"])
    return jnp.einsum("e...f,efd->e...d", hidden, w["w_down"])


def moe(params, x, *, k, capacity, expert_axis=None, fsdp_axis=None, token_axes=()):
    """The MoE layer on one group of tokens x (T, D); inside jax.shard_map, on one device's group.

    expert_axis: the mesh axis the experts are split over: the all-to-alls send each expert its tokens and
    the results back. fsdp_axis: the axis the experts' weights are also split over (FSDP), gathered here.
    token_axes: every axis the tokens are split over, to average the statistics over all groups.
    """
    dispatch, combine, stats = route(params["router"], x, k=k, capacity=capacity)
    w = {name: params[name] for name in ("w_gate", "w_up", "w_down")}
    if fsdp_axis:  # gather the model dimension of this device's experts (w_down holds it last)
        w = {n: jax.lax.all_gather(v, fsdp_axis, axis=v.ndim - 1 if n == "w_down" else 1, tiled=True)
             for n, v in w.items()}
    sent = jnp.einsum("tec,td->ecd", dispatch, x)  # (E, C, D): this group's tokens, by expert
    if expert_axis:  # expert e's block goes to the device holding expert e: (E / N, N x C, D)
        sent = jax.lax.all_to_all(sent, expert_axis, split_axis=0, concat_axis=1, tiled=True)
    done = experts_ffn(w, sent)
    if expert_axis:  # and the results come back to the group they came from: (E, C, D)
        done = jax.lax.all_to_all(done, expert_axis, split_axis=1, concat_axis=0, tiled=True)
    y = jnp.einsum("tec,ecd->td", combine, done)
    f, p, dropped = stats["f"], stats["p"], stats["dropped"]
    if token_axes:  # every group holds as many tokens: the mean of the means is the mean
        f, p, dropped = jax.lax.pmean(f, token_axes), jax.lax.pmean(p, token_axes), jax.lax.psum(dropped, token_axes)
    return y, f.shape[0] * jnp.sum(f * p), dropped


# %% [markdown]
# How many choices each capacity factor drops: a choice is dropped when its place in its expert's queue,
# `slot`, is past the capacity, so one routing of every group (`jax.vmap` of `route`) answers for all:

# %%
stats = jax.jit(jax.vmap(partial(route, k=K, capacity=CAPACITY), in_axes=(None, 0)), compiler_options=FAST_COMPILE)(
    params["router"], tokens.reshape(GROUPS, -1, D))[2]
slots = np.asarray(stats["slot"])
drops = {factor: (c, int((slots >= c).sum())) for factor in (1.0, 1.25, 1.5, 2.0)
         if (c := capacity_of(TOKENS // GROUPS, K, E, factor))}
print("capacity factor   capacity   dropped choices")
for factor, (capacity, dropped) in drops.items():
    print(f"{factor:>15}   {capacity:>8}   {dropped:>4} of {TOKENS * K} ({dropped / (TOKENS * K):.0%})")
assert drops[1.0] == (CAPACITY, int(ref_dropped)) == (CAPACITY, int(stats["dropped"].sum()))  # as the reference
assert all(a[1] > b[1] for a, b in zip(list(drops.values()), list(drops.values())[1:], strict=False))

# %% [markdown]
# More capacity, fewer drops, and larger buffers: every expert's `(C, D)` block is sent and computed
# whether its slots are filled or not, so a factor of 2 doubles the all-to-all's bytes and the experts'
# FLOPs. Capacity factors of 1 to 1.25 are common, with the load-balancing loss to even the experts out.
# "Dropless" layers drop nothing: they sort the tokens by expert and give up the fixed-size buffers.

# %% [markdown]
# ## 2. Expert parallelism: two all-to-alls
#
# Split the experts over an `expert` axis of 8 devices, one expert each, and the tokens too: each device
# holds one group of 32 tokens. Each device routes its own tokens and builds its `(E, C, D)` buffer, one
# block per expert. Block `e` must reach the device that holds expert `e`: that is an **all-to-all**, in
# which every device sends a different block to every other device (`jax.lax.all_to_all` with
# `split_axis=0`, the experts, and `concat_axis=1`, the slots). Each device then holds its expert's tokens
# from all 8 groups, `(1, 8 x C, D)`, runs its expert, and a second all-to-all, the reverse, returns each
# result to the group it came from. `moe` above does exactly this when given `expert_axis`; under
# `jax.shard_map` each device runs it on its own group:

# %%
mesh = jax.make_mesh((8,), ("expert",), axis_types=(AxisType.Auto,))
expert_specs = {"router": P(), "w_gate": P("expert"), "w_up": P("expert"), "w_down": P("expert")}
expert_parallel = jax.shard_map(
    partial(moe, k=K, capacity=CAPACITY, expert_axis="expert", token_axes=("expert",)), mesh=mesh,
    in_specs=(expert_specs, P("expert")), out_specs=(P("expert"), P(), P()))
placed = jax.device_put(params, {n: NamedSharding(mesh, s) for n, s in expert_specs.items()})
x_placed = jax.device_put(tokens, NamedSharding(mesh, P("expert")))
ep_step = loss_and_grads(expert_parallel).lower(placed, x_placed).compile()
(ep_loss, (ep_y, ep_balance, ep_dropped)), ep_grads = ep_step(placed, x_placed)

assert int(ep_dropped) == int(ref_dropped)  # the same tokens dropped
assert_close(ep_y, ref_y)
assert_close(ep_balance, ref_balance)
for name in params:  # the gradient of every weight, router included
    assert_close(ep_grads[0][name], ref_grads[0][name])
assert_close(ep_grads[1], ref_grads[1])  # and of the tokens
print("w_gate:", jax.typeof(placed["w_gate"]), "| its gradient:", ep_grads[0]["w_gate"].sharding.spec)
ep_ops = collectives(ep_step)
print(ep_ops)

# %% [markdown]
# The output, the load-balancing loss, the dropped count and every gradient equal the reference's. Each
# device holds one expert, `f32[8@expert,32,64]`, and its gradient stays there.
#
# The training step has **four all-to-alls**: two forward, and two in the backward pass, because the
# transpose of an all-to-all is the reverse all-to-all. Besides them, two small all-reduces: the router's
# gradient, since every device routed its own tokens with the same router, and the load-balancing
# statistics. Each all-to-all's result is the `(E, C, D)` buffer, so the formula for one is
#
# | per device | formula | here |
# |---|---|---|
# | buffer (the all-to-all's result) | `E x C x D x bytes` | 8 x 8 x 32 x 4 B = 8 KiB |
# | sent to other devices | `(N - 1) / N x buffer`: block `e` stays on its device only for `e = d` | 7 KiB |
# | per layer, forward and backward | `4 x (N - 1) / N x buffer` | 28 KiB |
#
# The buffer is `capacity_factor x k x tokens x D x bytes`: the layer sends `k` times the tokens' bytes
# each way (with the capacity's margin), however many devices it spans.

# %%
buffer = E * CAPACITY * D * 4
a2a = [op for op in ep_ops.ops if op.kind == "all-to-all"]
print(f"formula: buffer {format_bytes(buffer)}, sent {format_bytes(7 / 8 * buffer)}; compiled: "
      + ", ".join(f"{op.result_type} ({format_bytes(op.result_bytes)})" for op in a2a))
assert ep_ops.count("all-to-all") == 4 and all(op.group_size == 8 for op in a2a)
assert all(op.result_bytes == buffer for op in a2a)
assert sum(op.estimated_bytes for op in a2a) == 4 * 7 / 8 * buffer
assert buffer == capacity_of(TOKENS // GROUPS, K, E, 1.0) * E * D * 4 == 1.0 * K * (TOKENS // GROUPS) * D * 4
assert ep_ops.kinds == {"all-to-all", "all-reduce"}

# %% [markdown]
# The picture: each device's tokens, two cells per token, in the colour of the device that holds the
# chosen expert. A cell in the row's own colour stays on its device; every other colour crosses the
# all-to-all; hatched cells are choices the expert had no room for.

# %%
expert_device = mesh.devices.ravel()  # expert e lives on the device at position e of the `expert` axis
destinations = np.where(slots < CAPACITY, np.vectorize(lambda e: expert_device[e].id)(
    np.asarray(stats["expert"])), -1).reshape(GROUPS, -1)
draw_routing(destinations[:, :32], [d.id for d in expert_device], title="the first 16 tokens of each device, "
             "2 choices each: where the dispatch all-to-all sends them")

# %% [markdown]
# ## 3. Or let the compiler write the all-to-all
#
# `jax.shard_map` states every collective. The other way states only layouts: compute every group's
# buffer at once, `(E, G, C, D)` with the groups `G` split over `expert` as the tokens are, and then ask
# for it split over the experts instead. Moving a split from one dimension to another is an all-to-all,
# and the partitioner inserts it. The layer is the same code on every group (`jax.vmap` of `route`), with
# two `with_sharding_constraint`s:

# %%
def annotated(params, x, *, k, capacity, mesh):
    """The MoE layer in plain jit: the groups (one per device) become experts' blocks by two layout changes."""
    def pin(a, spec):
        return jax.lax.with_sharding_constraint(a, NamedSharding(mesh, spec))

    groups = pin(x.reshape(mesh.shape["expert"], -1, x.shape[-1]), P("expert"))  # (G, T, D)
    dispatch, combine, stats = jax.vmap(partial(route, k=k, capacity=capacity), in_axes=(None, 0))(
        params["router"], groups)
    sent = pin(jnp.einsum("gtec,gtd->egcd", dispatch, groups), P("expert"))  # by expert now: an all-to-all
    done = pin(experts_ffn(params, sent), P("expert"))  # computed where the experts are
    done = pin(done, P(None, "expert"))  # back to the groups: another all-to-all
    y = jnp.einsum("gtec,egcd->gtd", combine, done).reshape(x.shape)
    f, p = stats["f"].mean(0), stats["p"].mean(0)
    return y, f.shape[0] * jnp.sum(f * p), stats["dropped"].sum()


auto_layer = jax.jit(partial(annotated, k=K, capacity=CAPACITY, mesh=mesh), compiler_options=FAST_COMPILE)
auto_layer = auto_layer.lower(placed, x_placed).compile()
auto_y, auto_balance, auto_dropped = auto_layer(placed, x_placed)
assert_close(auto_y, ref_y)
assert_close(auto_balance, ref_balance)
assert int(auto_dropped) == int(ref_dropped)
auto_ops = collectives(auto_layer)
print("shard_map:  ", ep_ops.counts)
print("annotations:", auto_ops.counts)
a2a_auto = [op for op in auto_ops.ops if op.kind == "all-to-all"]
assert len(a2a_auto) == 2 and all(op.result_bytes == buffer and op.group_size == 8 for op in a2a_auto)

# %% [markdown]
# The same numbers, and the compiled program contains the same four all-to-alls of 8 KiB: the two
# constraints became the dispatch and the combine, and their transposes the backward pass's. Which to
# use? The annotations keep the model readable and let the compiler choose how. `shard_map` states the
# collectives, so the program cannot silently change when a shape or a sharding rule does, and it is
# where hand-written kernels go (a grouped matmul over tokens sorted by expert, for example). Either way,
# read the compiled program, as here, before trusting what you meant.

# %% [markdown]
# > **You will see this online:** the capacity computed from the whole batch,
# > ```python
# > capacity = int(capacity_factor * k * batch_tokens / num_experts)
# > ```
# > inside the per-device code. Under `shard_map` each device holds only its group, `batch_tokens / N` of
# > them, so every expert's slots are `N` times too many: nothing is ever dropped, and every buffer, every
# > all-to-all and the experts' FLOPs are `N` times larger, mostly zeros. The capacity is per group:

# %%
whole_batch = capacity_of(TOKENS, K, E, 1.0)  # 64 slots per expert, for a group of 32 tokens
print(f"capacity {whole_batch} instead of {CAPACITY}: each all-to-all's result {format_bytes(E * whole_batch * D * 4)} "
      f"instead of {format_bytes(buffer)} (section 2's formula), dropped {int((slots >= whole_batch).sum())} "
      f"instead of {int(ref_dropped)}")
assert whole_batch == 8 * CAPACITY and int((slots >= whole_batch).sum()) == 0

# %% [markdown]
# ## 4. Experts and FSDP on a 2-D mesh
#
# Eight devices need not mean eight experts. On a `(2, 4)` mesh, `('fsdp', 'expert')`, each expert
# group of 4 devices holds all 8 experts, 2 per device, and the tokens are split over all 8 devices.
# The experts' weights are further split over `fsdp` (notebook 10): each device stores half of its two
# experts' model dimension and gathers the other half when the layer runs. The same `moe` takes both
# axes: the all-to-alls now run within each group of 4, the gathers between pairs.

# %%
mesh2 = jax.make_mesh((2, 4), ("fsdp", "expert"), axis_types=(AxisType.Auto,) * 2)
BOTH = ("fsdp", "expert")
fsdp_specs = {"router": P(), "w_gate": P("expert", "fsdp"), "w_up": P("expert", "fsdp"),
              "w_down": P("expert", None, "fsdp")}
two_d = jax.shard_map(partial(moe, k=K, capacity=CAPACITY, expert_axis="expert", fsdp_axis="fsdp", token_axes=BOTH),
                      mesh=mesh2, in_specs=(fsdp_specs, P(BOTH)), out_specs=(P(BOTH), P(), P()))
placed2 = jax.device_put(params, {n: NamedSharding(mesh2, s) for n, s in fsdp_specs.items()})
x_placed2 = jax.device_put(tokens, NamedSharding(mesh2, P(BOTH)))
step2 = loss_and_grads(two_d).lower(placed2, x_placed2).compile()
(_, (y2, balance2, dropped2)), grads2 = step2(placed2, x_placed2)
assert_close(y2, ref_y)
assert_close(balance2, ref_balance)
assert int(dropped2) == int(ref_dropped)
for name in params:
    assert_close(grads2[0][name], ref_grads[0][name])
ops2 = collectives(step2)
print("w_gate:", jax.typeof(placed2["w_gate"]))
print(ops2)
by_kind = {(op.kind, op.group_size) for op in ops2.ops}
assert {("all-to-all", 4), ("all-gather", 2)} <= by_kind
assert all(op.result_bytes == buffer for op in ops2.ops if op.kind == "all-to-all")
assert ops2.count("all-to-all") == 4 and ops2.count("all-gather") == ops2.count("reduce-scatter") == 3

# %% [markdown]
# Equal again, in output, loss, drops and gradients. The program holds four all-to-alls over groups of
# 4 devices, of the same 8 KiB: the buffer still has `E x C` slots, since a group of 32 tokens fills the
# same capacity. Each device's block for the 2 experts of a device is twice as large and goes to 3 devices
# instead of 7, so it sends 3/4 of its buffer instead of 7/8. The three all-gathers over pairs are FSDP's,
# one per weight, and their transposes, three reduce-scatters, return each device its half of the
# weights' gradients.

# %% [markdown]
# ## 5. A Mixtral-shaped step on a TPU v5p slice
#
# At Mixtral's sizes: 32 layers (scanned, so that the program holds one), width 4,096, 8 experts of
# hidden width 14,336 with 2 per token, grouped-query attention with 32 query and 8 key/value heads of
# 128, a vocabulary of 32,000, sequences of 4,096 tokens. The slice is a v5p with 32 chips (`v5p:2x4x4`),
# the mesh `('fsdp', 'expert')` of `(4, 8)`: the experts over 8 chips, their weights and every other
# weight split 4 more ways (FSDP), one sequence per chip. Float32 weights with Adam's two moments,
# bfloat16 compute, each layer rematerialised. Nothing is allocated: every array is a
# `jax.ShapeDtypeStruct` carrying its sharding, and the MoE layer is `moe` of section 2, unchanged.

# %%
def rms_norm(x, scale):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6) * scale).astype(x.dtype)


def mixtral_step(mesh, *, layers=32, width=4096, hidden=14336, experts=8, k=2, heads=32, kv_heads=8, head_dim=128,
                 vocab=32000, seq=4096, capacity_factor=1.25):
    """A Mixtral-shaped training step lowered for `mesh` ('fsdp', 'expert'), one sequence per device.

    Returns (lowered program, parameter count). Attention and embeddings are FSDP over both axes; the
    experts are split over 'expert' and FSDP over 'fsdp' by section 4's `moe`.
    """
    both = ("fsdp", "expert")
    shapes = {  # name: (shape, spec)
        "embed": ((vocab, width), P(None, both)), "unembed": ((width, vocab), P(both)), "final_norm": ((width,), P()),
        "norm_attn": ((layers, width), P()), "norm_moe": ((layers, width), P()),
        "wq": ((layers, width, heads, head_dim), P(None, both)),
        "wk": ((layers, width, kv_heads, head_dim), P(None, both)),
        "wv": ((layers, width, kv_heads, head_dim), P(None, both)),
        "wo": ((layers, heads, head_dim, width), P(None, None, None, both)),
        "router": ((layers, width, experts), P()),
        "w_gate": ((layers, experts, width, hidden), P(None, "expert", "fsdp")),
        "w_up": ((layers, experts, width, hidden), P(None, "expert", "fsdp")),
        "w_down": ((layers, experts, hidden, width), P(None, "expert", None, "fsdp")),
    }
    expert_layer = jax.shard_map(
        partial(moe, k=k, capacity=capacity_of(seq, k, experts, capacity_factor), expert_axis="expert",
                fsdp_axis="fsdp", token_axes=both), mesh=mesh,
        in_specs=({n: P(*shapes[n][1][1:]) for n in ("router", "w_gate", "w_up", "w_down")}, P(both)),
        out_specs=(P(both), P(), P()))

    def layer(x, w):
        w = {n: v.astype(jnp.bfloat16) for n, v in w.items()}
        b, s, d = x.shape
        h = rms_norm(x, w["norm_attn"])
        q = jnp.einsum("bsd,dhk->bshk", h, w["wq"]).reshape(b, s, kv_heads, heads // kv_heads, head_dim)
        key, value = jnp.einsum("bsd,dhk->bshk", h, w["wk"]), jnp.einsum("bsd,dhk->bshk", h, w["wv"])
        scores = jnp.einsum("bqngk,bsnk->bngqs", q, key).astype(jnp.float32) / np.sqrt(head_dim)
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)  # causal
        o = jnp.einsum("bngqs,bsnk->bqngk", jax.nn.softmax(scores).astype(x.dtype), value).reshape(b, s, heads, -1)
        x = x + jnp.einsum("bshk,hkd->bsd", o, w["wo"])
        moe_weights = {n: w[n] for n in ("router", "w_gate", "w_up", "w_down")}
        y, balance, dropped = expert_layer(moe_weights, rms_norm(x, w["norm_moe"]).reshape(b * s, d))
        return x + y.reshape(b, s, d), (balance, dropped)

    def loss_fn(params, batch):
        x = params["embed"].astype(jnp.bfloat16)[batch]
        stack = {n: params[n] for n in shapes if params[n].ndim and n not in ("embed", "unembed", "final_norm")}
        x, (balance, dropped) = jax.lax.scan(jax.checkpoint(layer), x, stack)
        logits = jnp.einsum("bsd,dv->bsv", rms_norm(x, params["final_norm"]), params["unembed"].astype(x.dtype))
        targets = jax.nn.one_hot(jnp.roll(batch, -1, axis=1), vocab)
        loss = -jnp.mean(jnp.sum(jax.nn.log_softmax(logits.astype(jnp.float32)) * targets, axis=-1))
        return loss + 0.01 * balance.mean(), dropped.sum()

    tx = optax.adam(1e-4)

    def train_step(params, opt_state, batch):
        (loss, dropped), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss, dropped

    params = {n: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
              for n, (shape, spec) in shapes.items()}
    moments = jax.tree.map(lambda p: p, params)  # Adam's mu and nu: shaped and split like the parameters
    opt_state = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, P())),
                             jax.eval_shape(tx.init, params))
    opt_state = (opt_state[0]._replace(mu=moments, nu=moments), *opt_state[1:])
    batch = jax.ShapeDtypeStruct((mesh.size, seq), jnp.int32, sharding=NamedSharding(mesh, P(both)))
    lowered = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, opt_state, batch)
    return lowered, sum(math.prod(shape) for shape, _ in shapes.values())

# %%
TPU_OK, why = tpu_compiler_available()
print(why)
if TPU_OK:
    with quiet():  # libtpu's start-up warnings stay out of the notebook
        v5p = topologies.get_topology_desc(topology_name="v5p:2x4x4", platform="tpu").devices
    tpu_mesh = jax.make_mesh((4, 8), ("fsdp", "expert"), axis_types=(AxisType.Auto,) * 2, devices=v5p)
    mixtral, n_params = mixtral_step(tpu_mesh)
    experts_share = 32 * 8 * 3 * 4096 * 14336
    print(f"{n_params / 1e9:.1f} billion parameters, {experts_share / n_params:.1%} of them in the experts; "
          f"{n_params * 12 / 32 / 2**30:.1f} GiB of weights and Adam moments per chip")
    assert round(n_params / 1e9, 1) == 46.7 and round((n_params - experts_share * 6 / 8) / 1e9, 1) == 12.9

# %% [markdown]
# Compiling this step at the compiler's default effort takes minutes of CPU, far beyond this notebook's
# budget, so the notebook stops at the lowered program and `tests/test_19_experts_tpu.py` (`make
# test-slow`) compiles this very `mixtral_step` and checks every figure below. Before compiling, the
# formula says what each all-to-all carries: a chip's sequence of 4,096 tokens, 2 choices each, a capacity
# factor of 1.25, in bfloat16.

# %%
seq, width = 4096, 4096
slots = capacity_of(seq, 2, 8, 1.25)
a2a_bytes = 8 * slots * width * 2  # E x C x D x bytes: the buffer every all-to-all moves, per chip
print(f"capacity {slots} tokens per expert; each all-to-all's result {format_bytes(a2a_bytes)} per chip, "
      f"{format_bytes(7 / 8 * a2a_bytes)} sent over the 8 chips of `expert`")
assert a2a_bytes == 1.25 * 2 * seq * width * 2  # k x tokens x width x bytes, with the capacity's margin

# %% [markdown]
# The TPU compiler's exact figures are in the hidden cell below. Each chip stores 1/32 of the weights
# and Adam's moments, 16.3 GiB, and needs 30.1 GiB of HBM in all at the default effort, a third of a v5p
# chip's 95.7 GiB: this slice has room for longer sequences or fewer chips. Each layer runs six all-to-alls over the 8 chips of `expert`, each of
# the 80 MiB the formula gives: the dispatch and combine forward, again in the rematerialised forward,
# and their transposes backward. FSDP adds its gathers over the 4 chips of `fsdp`, two per expert weight
# (forward and rematerialised forward), and a reduce-scatter per weight for the gradients.
#
# `estimate_step` (notebook 15) times the program at 2.9 s per step, 2.64 s of it compute: 1.33 s
# by the matmuls' FLOPs at the chip's peak, the rest what the compiler's cycle counts add for its fused
# one-hot and attention matmuls. By `6 x active parameters x tokens / chips / peak`, the estimate for the
# useful work is 6 x 12.9e9 x 4,096 / 459e12 = 0.69 s per chip: the rest of the FLOPs is the rematerialised forward, the 25% of empty
# slots the capacity factor pays for, attention's scores, and the one-hot dispatch and combine einsums,
# which cost a fifth of the experts' FLOPs at this width. Sorting tokens by expert instead (a grouped
# matmul) removes that last part.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The TPU compiler's exact figures, §5: the Mixtral-shaped step on v5p:2x4x4 (default effort)
MIXTRAL_V5P = {  # compiled by tests/test_19_experts_tpu.py, which checks each figure (jax 0.12.0.1, libtpu 0.0.50.1)
    "HBM per chip (GiB)": 30.1,
    "all-to-alls per layer": 6,
    "all-to-all result (MiB)": 80,
    "all-gathers per layer, over fsdp": 6,
    "estimated step (s)": 2.887,
    "of which compute (s)": 2.64,
    "of which exposed communication (s)": 0.235,
}
for what, figure in MIXTRAL_V5P.items():
    print(f"{what:<40}{figure}")

# %% [markdown]
# ## 6. Planning it: the expert axis in the planner
#
# The course's planner (`utils.planner`, which notebook 25 runs) takes a mixture of
# experts as a model shape, `num_experts`, `experts_per_token` and `capacity_factor`, and searches an
# `expert` axis beside data, FSDP and tensor parallelism when asked (`axes=(*AXES, "expert")`). Its
# builder routes tokens as `annotated` does in §3, so each compiled candidate carries the all-to-alls, and
# `estimate_step` times them. Listing the candidates and their state needs no compiler:

# %%
from spmd_course.utils.planner import candidates, state_bytes
from spmd_course.utils.train_step import AXES, DecoderConfig

mixtral = DecoderConfig(num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8, head_dim=128, d_ff=14336,
                        vocab_size=32000, seq_len=4096, num_experts=8, experts_per_token=2, capacity_factor=1.25)
found = candidates(mixtral, chips_per_slice=32, sequences=32, remats=("full",), axes=(*AXES, "expert"))
by_expert = {e: sum(c.expert == e for c in found) for e in sorted({c.expert for c in found})}
state = state_bytes(mixtral, data=1, fsdp=4, tensor=1, context=1, expert=8)  # this section's mesh
print(f"{mixtral.num_params() / 1e9:.1f}B parameters, capacity {mixtral.capacity} slots; candidates by size of "
      f"the expert axis: {by_expert}; weights and moments per chip on (fsdp 4, expert 8): {state / 2**30:.1f} GiB")
assert round(mixtral.num_params() / 1e9, 1) == 46.7 and mixtral.capacity == slots
assert list(by_expert) == [1, 2, 4, 8]  # the axes that divide the 8 experts
assert state == state_bytes(mixtral, data=1, fsdp=32, tensor=1)  # the same state as FSDP over all 32 chips

# %% [markdown]
# The planner counts the same 46.7 billion parameters and the same capacity. Splitting the experts over
# `expert` stores no less than FSDP over all 32 chips: what it changes is the traffic, an all-to-all of
# the routed tokens instead of gathering every expert's weights, which is why the planner compiles the
# candidates and times them rather than comparing their memory.

# %% [markdown]
# ## Takeaways
# - A mixture-of-experts layer routes each token to its top `k` of `E` experts. A capacity of
#   `ceil(factor x k x tokens / E)` slots per expert and per group fixes the shapes; choices past it are
#   dropped, and the load-balancing loss `E x sum f_e p_e` (1 when balanced, `E` when collapsed) keeps
#   the drops rare.
# - Expert parallelism splits the experts over an `expert` axis. Two all-to-alls per layer move the
#   tokens to their experts and back (four per training step), each carrying `factor x k x tokens x D`
#   values per device, of which `(N - 1) / N` leave it. The same layer equals a loop over tokens in
#   outputs, drops and gradients.
# - Write the all-to-alls in `jax.shard_map` (`all_to_all(split_axis=0, concat_axis=1)`, then the
#   reverse), or ask for the buffer split by expert with `with_sharding_constraint` and let the
#   partitioner insert them; read the compiled program either way.
# - The capacity is per device's group: computed from the global batch, it makes every buffer and
#   all-to-all `N` times larger and drops nothing.
# - Experts combine with FSDP on a 2-D mesh: all-to-alls within each `expert` group, gathers and
#   reduce-scatters of the expert weights over `fsdp`.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** A layer with 256 experts, 8 per token, width 7,168 in bfloat16, runs with a capacity
# factor of 1 on an `expert` axis of 64 devices, each holding 4,096 tokens. How many bytes is each
# all-to-all's result on a device, and how many of them does the device send to other devices?

# %%
from spmd_course.exercises import ex19_experts as ex

answer_1 = NOT_ANSWERED  # a pair (bytes of the result, bytes sent)
ex.a2a_bytes.check(answer_1);

# %% [markdown]
# **Exercise 2.** Inside `jax.shard_map` over an `expert` axis of 8 devices, each device holds its
# buffer `sent` of shape `(E, C, D)`, with `E` a multiple of 8. Write `to_experts(sent)`, the dispatch:
# it returns `(E / 8, 8 x C, D)`, this device's experts with their slots from every device, in the order
# of the sending device. The checker runs it for 8 and 16 experts.

# %%
def to_experts(sent):
    ...  # one collective


answer_2 = NOT_ANSWERED  # set it to to_experts once you have written it
ex.to_experts.check(answer_2);

# %% [markdown]
# **Exercise 3.** A router has collapsed: every choice of every token goes to expert 0, with
# probability 1. What is its load-balancing loss, `E x sum_e f_e x p_e`, with 8 experts?

# %%
answer_3 = NOT_ANSWERED  # a number
ex.collapsed_balance.check(answer_3);

# %% [markdown]
# **Next:** [20 · Context parallelism](20_context.ipynb)
