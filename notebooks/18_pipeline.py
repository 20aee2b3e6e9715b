# %% [markdown]
# # 18 · Pipeline parallelism: stages, micro-batches and the bubble
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/18_pipeline.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/18_pipeline.ipynb)
#
# A model cut into 8 stages of consecutive layers, one stage per device, sends only the activations at
# the 7 cuts between devices. But each stage waits for the one before it: with 8 micro-batches,
# every device idles for 7 of the 15 steps of its loop.
#
# **You need:** notebooks 06 (`jax.shard_map`, `ppermute`), 07 (data parallelism), 13
# (rematerialization), 14 (micro-batches) and 15 (`estimate_step`); `jax.lax.fori_loop`.
#
# A pipeline is the strategy for a model too deep for one device's memory that must not gather weights
# at every layer, as FSDP does.
#
# **You will learn**
# - how to split a stack of layers into stages on a `stage` mesh axis with `jax.shard_map` and
#   `jax.lax.ppermute`, and check its loss and gradients against one device;
# - the GPipe and circular schedules, and why every device of an SPMD pipeline runs `M + P - 1`
#   iterations, of which `P - 1` are the bubble;
# - how to read the bubble from the compiled program: its loops' trip counts, its FLOPs, and its time
#   in `estimate_step`, against `(P - 1) / (M + P - 1)`;
# - what each schedule costs in traffic and memory per stage, and how a pipeline combines with data
#   parallelism on a 2-D mesh;
# - what the TPU compiler makes of a 4.3-billion-parameter pipeline on a v5e slice.


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
import pkgutil
from functools import partial

import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (NOT_ANSWERED, assert_close, collectives, compile_effort, draw_pipeline, estimate_step, format_bytes,
                   memory_per_device, quiet, tpu_compiler_available)

# %% [markdown]
# ## 1. Stages on a `stage` axis
#
# Does JAX ship a pipeline? The installed releases (jax 0.10.2 and 0.12.0.1) have no pipeline-parallel
# API: no module of `jax.experimental` and no function of `jax` or `jax.lax` is about it. (Pallas's
# `emit_pipeline` overlaps a kernel's memory copies with its compute, a different thing.) Production
# trainers such as MaxText write their own pipeline layer from the same parts used here: `jax.shard_map`
# (notebook 06) and `jax.lax.ppermute`.

# %%
names = [m.name for m in pkgutil.iter_modules(jax.experimental.__path__)] + dir(jax) + dir(jax.lax)
print("jax", jax.__version__, "- names with 'pipeline' in jax, jax.lax, jax.experimental:",
      [n for n in names if "pipeline" in n.lower()])
assert not [n for n in names if "pipeline" in n.lower()]

# %% [markdown]
# The model: a stack of `L = 32` residual feed-forward layers, `x + gelu(x @ up) @ down`, width 64,
# stacked on a leading layer axis and run with `jax.lax.scan` (so a stack of any depth compiles like
# one layer). `jax.checkpoint` keeps only the stack's input for the backward pass and recomputes the
# rest (notebook 13's rematerialization); the pipeline needs it at full size, and the reference uses
# it too so that both do the same arithmetic. The batch: `M = 8` micro-batches of 32 rows (notebook 14, §2).
# Every program this notebook runs on the CPU is compiled with `FAST_COMPILE`, which skips optimising
# the machine code (notebook 12): the partitioning, the collectives and the loops, which are what we
# read, are decided before that stage, and at this size the programs run in milliseconds anyway.

# %%
L, D, F = 32, 64, 128
M, MB = 8, 32  # micro-batches, rows in each
FAST_COMPILE = {"xla_backend_optimization_level": 0}  # CPU programs: skip optimising machine code
rng = np.random.default_rng(0)  # numpy's generator: fixed numbers, nothing to compile
params = {"up": rng.standard_normal((L, D, F), np.float32) / np.sqrt(D),
          "down": rng.standard_normal((L, F, D), np.float32) / (4 * np.sqrt(F))}
x = rng.standard_normal((M, MB, D), np.float32)  # micro-batch m is x[m]
y = rng.standard_normal((M, MB, D), np.float32)  # targets


def layer(h, w):
    return h + jax.nn.gelu(h @ w["up"]) @ w["down"]


def stack(ws, h):
    """Run the layers stacked in ws (leading axis) one after another."""
    return jax.lax.scan(lambda h, w: (layer(h, w), None), h, ws)[0]


def loss_fn(params, x, y):
    return jnp.mean((jax.checkpoint(stack)(params, x) - y) ** 2)


rows_x, rows_y = x.reshape(-1, D), y.reshape(-1, D)  # one device, the whole batch at once
reference = jax.jit(jax.value_and_grad(loss_fn)).lower(params, rows_x, rows_y).compile(FAST_COMPILE)
ref_loss, ref_grads = reference(params, rows_x, rows_y)
print(f"reference loss {float(ref_loss):.6f}")

# %% [markdown]
# **The schedule.** Cut the 32 layers into `P` stages of consecutive layers, one stage per device of a
# `stage` axis. Every device runs the *same* loop (SPMD: one program). At iteration `t`, stage `s`
# works on micro-batch `t - s`: stage 0 takes a fresh micro-batch, the others take what their
# neighbour sent at the end of the last iteration, and after its layers each stage sends its output to
# the next with one `ppermute` (a collective-permute). Micro-batch `m` leaves the last stage at
# iteration `m + P - 1`, so the loop runs `M + P - 1` times. Where `t - s` is not a micro-batch, the
# stage computes on zeros and throws the result away: that idle time is the **bubble**.
#
# The same loop gives the **circular** schedule (MaxText's): with `repeats = V`, the layers are cut into
# `P x V` chunks and device `s` holds chunks `s, s + P, s + 2P, ...`, so each micro-batch goes round
# the ring of devices `V` times, and the last device sends its output back to the first. Stage 0 keeps
# what comes back in a buffer until that micro-batch's next pass. Work item `k = t - s` is micro-batch
# `k % M` on its pass `k // M`, and the loop runs `V M + P - 1` times. GPipe is `repeats = 1`.
#
# The loss is summed on the last stage and `psum`med over the axes, so every device returns it; the
# gradient is JAX's own: `jax.grad` differentiates the loop (the backward pass is a second loop that
# runs the iterations in reverse, each `ppermute` sending gradients back the other way). The function
# also returns its work log, which micro-batch each stage worked on at each iteration.

# %%
def to_stages(params, stages, repeats=1):
    """Stack (L, ...) -> (stages, repeats, L // (stages * repeats), ...): stage s holds chunks s, s + stages, ..."""
    return jax.tree.map(lambda a: a.reshape(repeats, stages, -1, *a.shape[1:]).swapaxes(0, 1), params)


def from_stages(params):
    """The inverse of to_stages: back to one stack of layers in order."""
    return jax.tree.map(lambda a: a.swapaxes(0, 1).reshape(-1, *a.shape[3:]), params)


def pipeline_loss(params, x, y, *, repeats=1, batch_axes=()):
    """The loss over micro-batches x[m] (targets y[m]), pipelined over the mesh axis 'stage'; runs inside
    jax.shard_map. params: this stage's chunks, (1, repeats, layers per chunk, ...). batch_axes: the mesh
    axes that split each micro-batch's rows (data parallelism). Returns (loss, work log of this stage)."""
    stages, s = jax.lax.axis_size("stage"), jax.lax.axis_index("stage")
    params = jax.tree.map(lambda a: a[0], params)
    if batch_axes:  # say that each device uses its copy: the gradients are then summed once, after the loop (§5)
        params = jax.lax.pcast(params, batch_axes, to="varying")
    micro = x.shape[0]
    items = repeats * micro  # work items: each micro-batch once per pass
    steps = items + stages - 1
    # GPipe: a line of stages; circular: a ring, the last stage sends back to the first
    perm = [(i, (i + 1) % stages) for i in range(stages if repeats > 1 else stages - 1)]

    @jax.checkpoint  # keep each iteration's input, recompute the chunk's layers in the backward pass
    def chunk(params, v, h):
        return stack(jax.tree.map(lambda a: a[v], params), h)

    def step(t, carry):
        state, back, total, log = carry
        k = t - s  # this stage's work item
        busy = (k >= 0) & (k < items)
        k = jnp.clip(k, 0, items - 1)
        m, v = k % micro, k // micro  # micro-batch, pass
        fresh = x[m] if repeats == 1 else jnp.where(v == 0, x[m], back[m])
        out = chunk(params, v, jnp.where(s == 0, fresh, state))
        last = busy & (s == stages - 1) & (v == repeats - 1)
        total = total + jnp.where(last, jnp.sum((out - y[m]) ** 2), 0.0)
        log = log.at[t].set(jnp.where(busy, k, -1))
        state = jax.lax.ppermute(out, "stage", perm)  # to the next stage
        if repeats > 1:  # stage 0 keeps what came back round until its micro-batch's next pass
            came = t - (stages - 1)
            back = jnp.where((s == 0) & (came >= 0), back.at[jnp.maximum(came, 0) % micro].set(state), back)
        return state, back, total, log

    start = (jnp.zeros_like(x[0]), jnp.zeros_like(x if repeats > 1 else x[:0]), jnp.zeros_like(x[0, 0, 0]),
             jnp.zeros(steps, jnp.int32))  # zeros like x's: split over batch_axes as x is
    start = jax.lax.pcast(start, "stage", to="varying")  # the carry differs from stage to stage
    _, _, total, log = jax.lax.fori_loop(0, steps, step, start)
    count = y.size * np.prod([jax.lax.axis_size(a) for a in batch_axes], dtype=int)
    return jax.lax.psum(total, ("stage", *batch_axes)) / count, log[None]


def pipelined(mesh, repeats=1, batch_axes=()):
    """The jitted loss-and-gradient step of the pipeline on mesh."""
    rows = P(None, batch_axes or None)  # (micro-batch, rows, features): rows split over batch_axes
    loss = jax.shard_map(partial(pipeline_loss, repeats=repeats, batch_axes=batch_axes), mesh=mesh,
                         in_specs=(P("stage"), rows, rows), out_specs=(P(), P("stage")))
    return jax.jit(jax.value_and_grad(loss, has_aux=True))

# %% [markdown]
# ## 2. GPipe on 8 stages: the reference's loss and gradients
#
# Eight devices on the `stage` axis, four layers each, eight micro-batches:

# %%
mesh = jax.make_mesh((8,), ("stage",), axis_types=(AxisType.Auto,))
STAGES = mesh.shape["stage"]
on_stages = jax.device_put(to_stages(params, STAGES), NamedSharding(mesh, P("stage")))
print("up on each device:", on_stages["up"].sharding.shard_shape(on_stages["up"].shape), "of", on_stages["up"].shape)

gpipe = pipelined(mesh)
gpipe_program = gpipe.lower(on_stages, x, y).compile(FAST_COMPILE)
(loss, gpipe_log), grads = gpipe_program(on_stages, x, y)
assert_close(loss, ref_loss)
jax.tree.map(assert_close, from_stages(grads), ref_grads)
print(f"GPipe loss {float(loss):.6f}, gradients equal to the reference's")
print(collectives(gpipe_program))

# %% [markdown]
# Each device holds 4 of the 32 layers, `(1, 1, 4, 64, 128)` of `up`, and the loss and every gradient
# equal the single-device reference. The program's only traffic is the collective-permute of a
# micro-batch's activations, `f32[32,64]`, stated once in each of two loops (forward and backward), and
# the all-reduce of the loss. The work log is the schedule the devices followed: forward, then the
# backward loop in reverse order.

# %%
stage_devices = [d.id for d in mesh.devices.flat]
forward = np.asarray(gpipe_log)
draw_pipeline(np.concatenate([forward, forward[:, ::-1]], axis=1), stage_devices,
              backward=np.broadcast_to(np.arange(2 * forward.shape[1]) >= forward.shape[1], (STAGES, 2 * forward.shape[1])),
              title=f"GPipe: {STAGES} stages, {M} micro-batches (F: forward, B: backward)")

# %%
steps = M + STAGES - 1
permutes = [op for op in collectives(gpipe_program).ops if op.kind == "collective-permute"]
assert forward.shape == (STAGES, steps)
assert all((forward[s] >= 0).sum() == M for s in range(STAGES))  # every stage works on every micro-batch once
assert [np.flatnonzero(forward[s] >= 0)[0] for s in range(STAGES)] == list(range(STAGES))  # stage s starts at s
assert len({op.loop for op in permutes}) == 2 and {op.trips for op in permutes} == {steps}  # two loops of M+P-1

# %% [markdown]
# Each row is one device, in its colour; white is the bubble. Stage `s` waits `s` iterations for its
# first micro-batch and, after its last, `P - 1 - s` more for the others to finish: `P - 1` idle
# iterations of `M + P - 1` on every device, in the forward loop and again in the backward loop.
#
# ## 3. The bubble, read from the compiled program
#
# Every stage runs the loop's `M + P - 1` iterations, and only `M` of them do useful work, so the
# bubble is `(P - 1) / (M + P - 1)`: 7/15, 47%, here. The compiled program says the same two ways: the
# loops' trip count, and the matmul FLOPs `estimate_step` (notebook 15) counts with every loop body
# multiplied by its trips. The reference does the useful work once on one device; the pipeline's 8
# devices together do `M + P - 1` iterations' worth:

# %%
one_device = jax.make_mesh((1,), ("one",), axis_types=(AxisType.Auto,), devices=jax.devices()[:1])
ref_flops = estimate_step(reference, one_device, chip="v5e").flops
gpipe_flops = estimate_step(gpipe_program, mesh, chip="v5e").flops  # per device; chip: FLOPs do not depend on it
trips = permutes[0].trips
bubble = {"from the trip count": (trips - M) / trips,
          "from the FLOPs": 1 - ref_flops / (STAGES * gpipe_flops),
          "formula (P-1)/(M+P-1)": (STAGES - 1) / (M + STAGES - 1)}
for how, value in bubble.items():
    print(f"bubble {how:<24}{value:.4f}")
print(f"FLOPs: reference {ref_flops:.4g} on one device; pipeline {gpipe_flops:.4g} on each of {STAGES}")
assert trips == M + STAGES - 1
assert_close(list(bubble.values()), [bubble["formula (P-1)/(M+P-1)"]] * 3)

# %% [markdown]
# The three agree: 8 devices do 15/8 of the reference's matmuls, and 7/15 of each device's work is
# thrown away. (FLOPs, not time: the CPU backend has no published rates. Section 6 times the TPU
# program.) More micro-batches shrink the bubble, `M = 56` brings it to 11%, but each micro-batch is then
# smaller, and a small matmul uses a chip badly (notebook 15's roofline).
#
# ## 4. A circular schedule: a smaller bubble, more traffic
#
# With `repeats = 2` each device holds two chunks of two layers, `s` and `s + 8`, and each micro-batch
# goes round the ring twice. An iteration does half the work, and the loop runs `2 M + P - 1 = 23`
# times: 23 half-iterations are 11.5 GPipe iterations, against 15.

# %%
REPEATS = 2
on_ring = jax.device_put(to_stages(params, STAGES, REPEATS), NamedSharding(mesh, P("stage")))
circular = pipelined(mesh, repeats=REPEATS)
circular_program = circular.lower(on_ring, x, y).compile(FAST_COMPILE)
(loss, circular_log), grads = circular_program(on_ring, x, y)
assert_close(loss, ref_loss)
jax.tree.map(assert_close, from_stages(grads), ref_grads)
ring_ops = [op for op in collectives(circular_program).ops if op.kind == "collective-permute"]
circular_steps = REPEATS * M + STAGES - 1
circular_bubble = 1 - ref_flops / (STAGES * estimate_step(circular_program, mesh, chip="v5e").flops)
print(f"circular: loss {float(loss):.6f}, loops of {ring_ops[0].trips} iterations, bubble {circular_bubble:.4f} "
      f"(formula (P-1)/(VM+P-1) = {(STAGES - 1) / circular_steps:.4f})")
sent = {name: sum(op.result_bytes * op.runs for op in ops) for name, ops in (("GPipe", permutes),
                                                                             ("circular", ring_ops))}
print("collective-permute bytes per device:", {k: format_bytes(v) for k, v in sent.items()})
assert {op.trips for op in ring_ops} == {circular_steps}
assert_close(circular_bubble, (STAGES - 1) / circular_steps)
assert sent["circular"] > sent["GPipe"]  # more hops: every chunk boundary is a send
assert "{7,0}" in circular_program.as_text().replace(" ", "")  # the ring closes: the last stage sends to the first
log = np.asarray(circular_log)
draw_pipeline(np.where(log >= 0, log % M, -1), stage_devices,
              title=f"circular: {STAGES} stages x {REPEATS} passes, {M} micro-batches (forward loop)")

# %% [markdown]
# The same loss and gradients, and the bubble is `7/23 = 30%`. The price is traffic: a micro-batch
# crosses `P V` chunk boundaries instead of `P`, so each device sends 23 activations per loop instead
# of 15, and the last device now sends to the first (the pair `{7,0}` in the program). Each
# micro-batch appears twice in a row of the picture, once per pass.
#
# > **You will see this online:** "GPipe's bubble is `(P - 1) / M`." That is the idle time *relative
# > to the useful time* (7/8 here, as if the bubble were 88%), not the fraction of the step: the
# > fraction of each device's iterations that idle is `(P - 1) / (M + P - 1)`, 47%. Check which one a
# > figure means before you plan with it.
#
# ## 5. Pipeline and data parallelism on a 2-D mesh
#
# Eight devices as 4 stages x 2: each stage is two devices, and each splits every micro-batch's rows
# over `data`. The pipeline function is the same; its loss adds the `data` axis to the `psum`.

# %%
mesh_2d = jax.make_mesh((4, 2), ("stage", "data"), axis_types=(AxisType.Auto,) * 2)
stages_2d = mesh_2d.shape["stage"]
on_2d = jax.device_put(to_stages(params, stages_2d), NamedSharding(mesh_2d, P("stage")))
both = pipelined(mesh_2d, batch_axes=("data",))
both_program = both.lower(on_2d, x, y).compile(FAST_COMPILE)
(loss, _), grads = both_program(on_2d, x, y)
assert_close(loss, ref_loss)
jax.tree.map(assert_close, from_stages(grads), ref_grads)
ops_2d = collectives(both_program)
print(ops_2d)
gradient_sums = [op for op in ops_2d.ops if op.kind == "all-reduce" and op.group_size == 2]
assert {op.trips for op in ops_2d.ops if op.kind == "collective-permute"} == {M + stages_2d - 1}
assert gradient_sums and not any(op.in_loop for op in gradient_sums)  # summed over data once, after the loops
print(f"bubble with {stages_2d} stages: {(stages_2d - 1) / (M + stages_2d - 1):.0%}")

# %% [markdown]
# Equal to the reference again. The collective-permutes run `M + 4 - 1 = 11` times each, and the
# gradients are all-reduced over the 2 devices of `data` once, after the loops, as in data parallelism
# (notebook 07). The bubble falls to 3/11 = 27% because there are fewer stages, and each device holds
# twice the layers. That is the trade-off on a fixed number of chips: more stages cut the memory each
# one needs for weights, fewer stages cut the bubble.
#
# > **You will see this online:** the parameters passed in with `P('stage')` and used as they are
# > inside the loop, letting autodiff sum their gradients over `data`.
#
# That gives the same numbers, but the sum happens where each copy is used: inside the backward loop,
# once per iteration and per layer. The CPU compiler's program then holds an all-reduce of every
# layer's gradients run 88 times (11 iterations x 8 layers) instead of once (the course's tests,
# `tests/test_18_pipeline.py`, compile that version and check it). One line, `jax.lax.pcast(params,
# batch_axes, to='varying')` before the loop, says that each device uses its own copy, so the sum runs
# once, where that cast is transposed.

# %% [markdown]
# ## 6. The TPU program: collective-permutes, HBM and the bubble in time
#
# Now at full size, compiled ahead of time for the 8 chips of a TPU v5e (`v5e:2x4`), nothing allocated:
# 32 layers of width 4,096 and hidden size 16,384 in bf16 (4.3 billion parameters, 1 GiB of them per
# stage), 8 micro-batches of 4,096 tokens, on 8 stages. The inputs are replicated on every chip to keep
# the code short (a real loader would feed stage 0 only).
#
# **Which compiler effort?** At the compiler's default effort, the one `jax.jit` uses, the program
# takes longer to compile than this whole notebook may take, so the cell compiles GPipe at the least
# effort, `O0`, and every figure it prints is an O0 figure. The default effort's figures, which are
# what you will see, follow in a table, with the circular schedule and a larger `M`.

# %%
TPU_OK, why = tpu_compiler_available()
print(why)
BIG = {"layers": 32, "width": 4096, "hidden": 16384, "tokens": 4096}


def compile_tpu(micro, repeats=1, effort="O0"):
    """The full-size pipeline's loss-and-gradient step for the 8 chips of a TPU v5e, on a 'stage' axis, and the
    mesh; `micro` micro-batches, `repeats` passes (1: GPipe); effort 'O0' (least) or None (the default)."""
    with quiet():
        chips = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices
    tpu_mesh = jax.make_mesh((len(chips),), ("stage",), axis_types=(AxisType.Auto,), devices=chips)
    stages, (layers, width, hidden, tokens) = len(chips), BIG.values()
    chunk, split = layers // (stages * repeats), NamedSharding(tpu_mesh, P("stage"))
    weights = {"up": jax.ShapeDtypeStruct((stages, repeats, chunk, width, hidden), jnp.bfloat16, sharding=split),
               "down": jax.ShapeDtypeStruct((stages, repeats, chunk, hidden, width), jnp.bfloat16, sharding=split)}
    batch = jax.ShapeDtypeStruct((micro, tokens, width), jnp.bfloat16, sharding=NamedSharding(tpu_mesh, P()))
    with compile_effort(effort), quiet():  # None: the compiler's default
        return pipelined(tpu_mesh, repeats).lower(weights, batch, batch).compile(), tpu_mesh


def loop_share(estimate):
    """The fraction of an estimated step spent inside loops (every op's time counted once per run)."""
    return sum(op.exposed * op.trips for op in estimate.timeline if op.trips > 1) / estimate.seconds


if TPU_OK:
    tpu_program, tpu_mesh = compile_tpu(M)
    tpu_permutes = [op for op in collectives(tpu_program).ops if op.kind == "collective-permute"]
    tpu_memory = memory_per_device(tpu_program)
    tpu_step = estimate_step(tpu_program, tpu_mesh, use_cycles=False)  # O0: timed by the roofline alone
    print(f"TPU v5e, O0 effort, GPipe, M = {M}: loops of {tpu_permutes[0].trips} iterations, "
          f"{len(tpu_permutes)} collective-permutes of {tpu_permutes[0].result_type}; temporaries "
          f"{format_bytes(tpu_memory.temp)}, HBM {format_bytes(tpu_memory.footprint)}; step (estimate) "
          f"{tpu_step.seconds * 1e3:.0f} ms, {loop_share(tpu_step):.1%} of it in loops")

# %% [markdown]
# The program holds two collective-permutes of one micro-batch's activations, `bf16[4096,4096]`
# (32 MiB), one in the forward loop and one in the backward loop, each run once per iteration: 15 times.
#
# **The bubble in time.** The time model (notebook 15) sums the ops of the step, each counted once per
# run, and nearly all of GPipe's estimated step is inside the two loops. Every iteration costs the
# same, since every stage runs the same program, and 7 of the 15 are bubble. So the bubble in time is
# the loops' share of the step times 7/15:

# %%
if TPU_OK:
    time_bubble = loop_share(tpu_step) * (tpu_permutes[0].trips - M) / tpu_permutes[0].trips
    print(f"GPipe: bubble in time {time_bubble:.3f}, formula {(STAGES - 1) / (M + STAGES - 1):.3f}")
    assert [op.result_type for op in tpu_permutes] == ["bf16[4096,4096]"] * 2
    assert [op.trips for op in tpu_permutes] == [M + STAGES - 1] * 2
    assert_close(sum(op.exposed * op.trips for op in tpu_step.timeline), tpu_step.seconds)  # the ops make the step
    assert abs(time_bubble - (STAGES - 1) / (M + STAGES - 1)) < 0.01

# %% [markdown]
# The time model's bubble is the formula's 47%.
#
# **Memory per stage, by schedule.** `jax.grad` of the loop keeps, for the backward pass, what each
# iteration needs: here, thanks to `jax.checkpoint`, the stage's input and a few arrays around it.
# All forward iterations run before the first backward one (that is what GPipe *is*), so every
# iteration's share is alive at once, and memory grows with `M`: the table below adds GPipe with 16
# micro-batches. The circular program keeps more iterations (23) yet needs less memory: the backward
# pass recomputes one chunk at a time, and its chunks are half as deep, which is consistent with these
# figures. Its step is shorter, though not by the full 11.5/15: each of its iterations does half the
# matmuls but sends a whole micro-batch.
#
# **1F1B** (one forward, one backward) bounds that growth. Once a stage has `P` micro-batches in
# flight it alternates a backward and a forward step, so at most `P` micro-batches' activations are
# alive whatever `M` is, with the same bubble. It needs a loop whose iterations run a forward step and
# a backward step by hand (`jax.vjp` per stage), since `jax.grad` of the whole loop always gives
# GPipe's order.
#
# At the default effort (compiled by the course's tests, `tests/test_18_pipeline_default_effort.py`,
# which read this notebook's `compile_tpu` and check every figure, and that the circular schedule needs
# the least memory and time at O0 too), the programs need:
#
# | TPU v5e, default effort (jax 0.12.0.1, libtpu 0.0.50.1) | temporaries | HBM | step (estimate) |
# |---|---|---|---|
# | GPipe, M = 8 | 6.8 GiB | 7.3 GiB | 2.14 s |
# | GPipe, M = 16 | 7.8 GiB | 8.3 GiB | 3.28 s |
# | circular, 2 passes, M = 8 | 6.6 GiB | 6.7 GiB | 1.92 s |
#
# Eight more micro-batches cost GPipe 1 GiB more HBM, 128 MiB each (four of its 32 MiB activations),
# and the circular schedule needs the least, at both efforts. So the bubble cannot be shrunk by adding
# micro-batches for free: each one costs GPipe memory on every stage, which is what 1F1B's bound saves.
#
# **Planning it.** The course's planner (`utils.planner`, which notebook 25 runs) searches data, FSDP,
# tensor, context and expert axes, and a `stage` axis when you ask for it (`axes=(*AXES, "stage")`). Its
# builder writes no pipeline, so the planner cannot compile a whole one. Instead it builds a pipeline plan
# from parts, as this section reasons, and labels every figure of it an estimate:
#
# | part | where it comes from |
# |---|---|
# | one stage's program | compiled: `num_layers / P` layers on the `chips / P` chips of the first stage, one micro-batch |
# | HBM | the compiler's for that program, plus the float32 gradient accumulator, plus the saved activations of the other `M - 1` micro-batches GPipe keeps in flight (a formula) |
# | step | `utils.stages.estimate_pipeline`: `M + P - 1` iterations of the stage's timed step plus two activation sends over one link |
# | bubble | `(P - 1) / (M + P - 1)` of the step, named in the table |
#
# The schedule is GPipe, because it is the one whose memory the planner can state simply: all `M`
# micro-batches wait for their backward pass. 1F1B would hold at most `P` of them, and the planner does not
# search it. The cell below plans a 2-layer model cut into 2 stages on a v5e-8, at the least effort, with
# one compile.

# %%
from spmd_course.utils.planner import plan
from spmd_course.utils.train_step import AXES, DecoderConfig

if TPU_OK:
    TWO_LAYERS = DecoderConfig(num_layers=2, d_model=256, num_heads=4, head_dim=64, d_ff=512, vocab_size=512,
                               seq_len=128)
    piped = plan(TWO_LAYERS, chip="v5e", topology="v5e:2x4", global_batch_tokens=16 * 128, remats=("full",),
                 meshes=[(1, 4, 1, 1, 1, 2)], axes=(*AXES, "stage"), max_compiles=1, effort="O0")
    print(piped)
    top = piped.best
    micro = top.candidate.accumulation
    print(f"{top.candidate.label()}: {top.pipeline.iterations} iterations, bubble (estimate) "
          f"{top.pipeline.bubble:.0%}; HBM {format_bytes(top.hbm_bytes)} compiled for one micro-batch, "
          f"{format_bytes(top.total_hbm_bytes)} with the accumulator and the other {micro - 1} of {micro} "
          "micro-batches in flight")
    assert top.pipeline.iterations == micro + 2 - 1 and top.pipeline.bubble == (2 - 1) / (micro + 2 - 1)
    assert top.in_flight_bytes > 0 and top.total_hbm_bytes > top.hbm_bytes  # GPipe holds every micro-batch
    assert "estimate" in str(piped).splitlines()[0] and "GPipe bubble" in str(piped)
    assert (top.candidate.per_device_batch, micro) == (2, 2) and [p.status for p in piped] == ["fits", "not compiled"]

# %% [markdown]
# The planner compiled the candidate its paper estimate preferred, two micro-batches of two sequences, and
# left the other (four of one) uncompiled, because `max_compiles=1`. Its bubble is the formula's, since the
# step is built from it. For a plain mesh the planner skips a smaller micro-batch once a larger one fits,
# because more micro-steps of the same program only cost time. It never skips a pipeline's, because more
# micro-batches shrink the bubble: a search with more compiles times both and ranks them.

# %% [markdown]
# ## Takeaways
# - JAX (0.10.2 and 0.12) has no pipeline API: a pipeline is a `jax.shard_map` over a `stage` axis,
#   a `fori_loop` of `M + P - 1` iterations, and a `ppermute` that hands each stage's output to the
#   next. `jax.grad` of that loop is GPipe's backward pass, and it equals the one-device gradients.
# - Every device runs every iteration, so the bubble is the idle iterations, `(P - 1) / (M + P - 1)`,
#   readable in the compiled program as the loops' trip count, in its FLOPs, and in `estimate_step`'s
#   time. `(P - 1) / M` is the same bubble relative to the useful work, not a fraction of the step.
# - The circular schedule (`V` passes round a ring) shrinks the bubble to `(P - 1) / (V M + P - 1)`
#   for `V` times the sends, and here less memory.
# - GPipe's memory grows with `M`; 1F1B bounds it by `P` micro-batches, with a hand-written backward.
# - With data parallelism on a 2-D mesh, cast the parameters to varying over `data` before the loop
#   (`jax.lax.pcast`), or their gradients are all-reduced inside it, once per iteration and layer.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** A GPipe pipeline has 4 stages and 12 micro-batches. What fraction of each device's
# loop iterations is idle (a number between 0 and 1)?

# %%
from spmd_course.exercises import ex18_pipeline as ex

answer_1 = NOT_ANSWERED  # a fraction, e.g. 0.5
ex.bubble_fraction.check(answer_1);

# %% [markdown]
# **Exercise 2.** With 8 stages, how many micro-batches does GPipe need, at least, for a bubble of at
# most 10%? And the circular schedule with 4 passes?

# %%
answer_2 = NOT_ANSWERED  # a pair (GPipe, circular with 4 passes) of whole numbers
ex.micro_batches_needed.check(answer_2);

# %% [markdown]
# **Exercise 3.** Write `layers_of(stage, stages, repeats, layers)`: the layer numbers (0 to
# `layers - 1`, in the order the stage runs them) that `to_stages` gives to stage `stage` when a stack of
# `layers` layers is cut for `stages` stages and `repeats` passes. The checker compares your answer
# with the placement `to_stages` makes, for several shapes.

# %%
def layers_of(stage, stages, repeats, layers):
    ...  # your list of layer numbers


answer_3 = NOT_ANSWERED  # set it to layers_of once you have written it
ex.stage_layers.check(answer_3);

# %% [markdown]
# **Next:** [19 · Expert parallelism](19_experts.ipynb)
