# %% [markdown]
# # 12 · Training memory: donation, remat, scan, mixed precision and ZeRO
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/12_training_memory.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/12_training_memory.ipynb)
#
# This notebook teaches how to measure and cut the per-device memory of a sharded train step: what it
# stores between steps, and what it allocates while it runs. You compile the steps of a stack of residual
# blocks on 8 devices, read their memory and collectives, and apply the tools practitioners combine:
# donation, a scan over layers with rematerialization, the three ZeRO stages, and mixed precision. Every
# variant trains to the losses of a single-device reference.
#
# **You will learn**
# - what a step without `donate_argnums` holds: two copies of the state;
# - why FSDP's working memory grows by a whole layer per layer when the layers are unrolled, how `nnx.scan`
#   over layers stops that, and what `nnx.remat` with a policy saves on top;
# - ZeRO-1, 2 and 3 as three sharding rules for parameters, gradients and optimizer state, with the memory
#   and collectives of each compiled step, and the reduce-scatter a TPU compiles;
# - what mixed precision with float32 master weights stores per parameter (no less than float32), and how
#   closely it trains.

# %%
# Setup (the same cell opens every notebook; notebook 00 explains it).
import subprocess
import sys
from pathlib import Path

course = next((p for p in (Path.cwd().parent, Path("spmd-course")) if (p / "utils" / "launch.py").is_file()), None)
if course is None and "google.colab" in sys.modules:  # a notebook alone on Colab: fetch the course, whole or not at all
    url, tmp = "https://github.com/spmd-course/spmd-sharding-course", "spmd-course.tmp"
    subprocess.run(["rm", "-rf", "spmd-course", tmp], check=True)
    git = subprocess.run(["git", "clone", "-q", "--depth", "1", url, tmp], capture_output=True, text=True)
    assert git.returncode == 0, f"could not fetch the course (is the network on?): {git.stderr}"
    course = Path(tmp).rename("spmd-course")
sys.path[:0] = [str(course.resolve())] if course else []
from utils import launch, setup_devices

launch.prepare_runtime()  # Colab: installs what is missing. Binder: shows memory in use. Any: flags untested versions.
SETUP = setup_devices(8)

# %%
import io
import re
from contextlib import redirect_stdout
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import (NOT_ANSWERED, collectives, draw_shardings, format_bytes, memory_per_device, quiet, shard_table,
                   tpu_compiler_available, type_string)

assert jax.device_count() == 8
CPU = jax.default_backend() == "cpu"  # some compiler facts below are the CPU compiler's; those asserts say so
# On CPU float32 matmuls are exact float32, so sharded and single-device runs agree to 1e-5. GPUs (TF32) and
# TPUs (bf16 passes) multiply float32 at lower precision by default: 1e-2 there.
RTOL = 1e-5 if CPU else 1e-2


# %% [markdown]
# ## 1. A stack of identical blocks, created sharded
#
# The model is `L` residual blocks, `x + relu(x @ up) @ down`, of width 128 and hidden size 512.
# `nnx.vmap` creates the `L` blocks at once, so each weight is **stacked** on a leading layer axis: `up`
# is one `(L, 128, 512)` array. `nnx.scan` runs the blocks in a loop over that axis; `scan=False` unrolls
# the loop (`unroll=True`) into `L` copies of the block in the program; `policy` wraps the block in
# `nnx.remat` (section 3). The loss is the mean squared error to a fixed random linear map; Adam, learning
# rate 1e-3.

# %%
D, H = 128, 512  # width, hidden size


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.up = nnx.Linear(D, H, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(H, D, use_bias=False, kernel_init=nnx.initializers.normal(0.02), rngs=rngs)

    def __call__(self, x):
        return x + self.down(jax.nn.relu(self.up(x)))


class Stack(nnx.Module):
    def __init__(self, layers: int, *, scan=True, policy=jax.checkpoint_policies.nothing_saveable, rngs: nnx.Rngs):
        @nnx.split_rngs(splits=layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return Block(rngs)

        self.blocks = make(rngs)  # every weight gets a leading layer axis
        self.scan, self.policy = scan, policy

    def __call__(self, x):
        def body(x, block):
            return block(x)

        if self.policy is not None:
            body = nnx.remat(body, policy=self.policy)
        loop = nnx.scan(body, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry, unroll=1 if self.scan else True)
        return loop(x, self.blocks)


def create(layers=2, **options):
    model = Stack(layers, rngs=nnx.Rngs(0), **options)
    return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)


def loss_fn(model, x, y):
    return jnp.mean((model(x).astype(jnp.float32) - y) ** 2)


def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return loss


rng = np.random.default_rng(0)  # the data, made on the host
x = rng.standard_normal((512, D), dtype=np.float32)
y = x @ rng.standard_normal((D, D), dtype=np.float32) / np.float32(D**0.5)

# %% [markdown]
# Where each array lives is a rule, as in notebook 10; it needs no path here, since the stacked kernels
# are the only 3-D leaves. A stacked kernel is either split on its rows over the mesh axis `data`,
# `P(None, 'data')`, or whole; the step counters are whole. Splitting the rows, not the layer axis, gives
# every device a slice of every layer, so each layer can be gathered when the loop reaches it. The three
# ZeRO stages (section 4) are three choices of what to split; ZeRO-3 splits parameters, gradients and
# optimizer state alike, which is FSDP. `make_step` pins the gradients and the new state to their
# stage's layout with `with_sharding_constraint`, and donates the state.

# %%
ZERO = {  # what each stage splits over 'data': (parameters, gradients, optimizer state)
    "ZeRO-1": (False, False, True),
    "ZeRO-2": (False, True, True),
    "ZeRO-3": (True, True, True),
}


def layout(split, mesh, tree):
    """Shardings for every leaf of `tree`: a stacked kernel (layers, rows, cols) split on its rows, or whole."""
    def where(leaf):
        return NamedSharding(mesh, P(None, "data") if split and leaf.ndim == 3 else P())

    return jax.tree.map(where, tree)


def pin(obj, split, mesh):
    """Inside jit: constrain an NNX object's state to its layout."""
    state = nnx.state(obj)
    nnx.update(obj, jax.lax.with_sharding_constraint(state, layout(split, mesh, state)))


def make_step(stage, mesh, donate=True):
    split_params, split_grads, split_opt = ZERO[stage]

    def step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        grads = jax.lax.with_sharding_constraint(grads, layout(split_grads, mesh, grads))
        optimizer.update(model, grads)
        pin(model, split_params, mesh)
        pin(optimizer, split_opt, mesh)
        return loss

    return nnx.jit(step, donate_argnums=(0, 1) if donate else ())


def create_sharded(stage, mesh, make=create):
    """A compiled constructor: `make(*args)`, its state pinned to the stage's layout."""
    split_params, _, split_opt = ZERO[stage]

    @nnx.jit
    def build(*args):
        model, optimizer = make(*args)
        pin(model, split_params, mesh)
        pin(optimizer, split_opt, mesh)
        return model, optimizer

    return build


def abstract(stage, mesh, make=create, **options):
    """The model and optimizer as shapes with shardings, to compile a step for: nothing is allocated."""
    split_params, _, split_opt = ZERO[stage]
    model, optimizer = nnx.eval_shape(lambda: make(**options))
    for obj, split in ((model, split_params), (optimizer, split_opt)):
        state = nnx.state(obj)
        nnx.update(obj, jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
                                     state, layout(split, mesh, state)))
    return model, optimizer


# %% [markdown]
# Create the FSDP (ZeRO-3) state on 8 devices with the compiled constructor of notebook 10, and, as the
# reference, a copy of the same initial state on one device, trained 5 steps with the plain step:

# %%
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
batch = NamedSharding(mesh, P("data"))
x_d, y_d = jax.device_put(x, batch), jax.device_put(y, batch)

build = create_sharded("ZeRO-3", mesh)
init = memory_per_device(build.lower().compile())
model, optimizer = build()
graphdef, state = nnx.split((model, optimizer))
# A copy on one device. device_put alone would hand back device 0's buffer of each replicated array (the step
# counters), and donating it to the reference step would delete the FSDP state's counter too.
ref_model, ref_optimizer = nnx.merge(graphdef, jax.tree.map(lambda a: jnp.copy(jax.device_put(a, jax.devices()[0])),
                                                            state))

n_params = sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
state_bytes = sum(shard_table(leaf).bytes_per_device[0] for leaf in jax.tree.leaves(state))
print("parameters:", n_params, "| init program,", init)
print("up kernel:", type_string(model.blocks.up.kernel[...]), " Adam mu:",
      type_string(optimizer.opt_state[0].mu["blocks"]["up"]["kernel"][...]))
assert init.output + init.temp < 3 * 4 * n_params / 4  # no device ever held it all
assert state_bytes == 3 * 4 * n_params // 8 + 8  # parameters, mu, nu (4 bytes each), split 8 ways; 2 counters

ref_step = nnx.jit(train_step, donate_argnums=(0, 1))
ref_losses = [float(ref_step(ref_model, ref_optimizer, x, y)) for _ in range(5)]
print("reference losses:", np.round(ref_losses, 5))
assert ref_losses[-1] < 0.8 * ref_losses[0]

# %% [markdown]
# ## 2. Donation: the step holds one copy of the state, not two
#
# Every step in this notebook donates the model and optimizer (`donate_argnums=(0, 1)`, notebook 07): the
# new state is written into the old state's buffers. Compile the FSDP step once without it, to see what
# that saves. `memory_analysis()` counts, per device, the arguments, the outputs, the temporaries, and the
# output bytes that alias (reuse) an argument; what is live at the peak is at most arguments + outputs +
# temporaries − aliased.

# %%
steps = {stage: make_step(stage, mesh) for stage in ZERO}
compiled = {"ZeRO-3": steps["ZeRO-3"].lower(model, optimizer, x_d, y_d).compile()}
donated = memory_per_device(compiled["ZeRO-3"])
plain = memory_per_device(make_step("ZeRO-3", mesh, donate=False).lower(model, optimizer, x_d, y_d).compile())

print(f"{'':<13}{'arguments':>11}{'outputs':>11}{'aliased':>11}{'temporaries':>13}{'live':>10}")
for name, m in (("donated", donated), ("not donated", plain)):
    print(f"{name:<13}{format_bytes(m.argument):>11}{format_bytes(m.output):>11}{format_bytes(m.alias):>11}"
          f"{format_bytes(m.temp):>13}{format_bytes(m.total):>10}")
assert plain.alias == 0 and plain.argument + plain.output >= 2 * state_bytes  # two copies of the state
if CPU:  # exact byte counts of the CPU compiler
    assert donated.alias == state_bytes  # the whole state is updated in place
    assert 0 < plain.total - donated.total < state_bytes and plain.temp < donated.temp

# %% [markdown]
# Without donation the old state (an argument, 384 KiB of it) and the new state (an output) are both
# live: two copies of everything a device stores. With it, the whole 384 KiB aliases. On the CPU backend
# the compiler spends part of the saving on temporaries, so the total (last column) falls by less
# than the 384 KiB here, where the temporaries dominate; in a large model the state is most of the memory.
#
# ## 3. Scan and remat: what FSDP's gathered weights cost per layer
#
# Notebook 10 found that FSDP's temporaries are not divided by the device count: each device gathers
# every weight whole. How much of that stays live depends on what the backward pass needs. First, what
# one block saves for it under three remat policies, from `jax.ad_checkpoint.print_saved_residuals`
# (tracing only, no compilation; 64 examples, one device's share of the batch):

# %%
def block_loss(x, up, down):
    return jnp.sum(x + jax.nn.relu(x @ up) @ down)


saved = {}
for name, policy in (("no remat", None), ("dots_saveable", jax.checkpoint_policies.dots_saveable),
                     ("nothing_saveable", jax.checkpoint_policies.nothing_saveable)):
    f = block_loss if policy is None else jax.checkpoint(block_loss, policy=policy)
    text = io.StringIO()
    with redirect_stdout(text):
        print_saved_residuals(f, x[:64], ref_model.blocks.up.kernel[0], ref_model.blocks.down.kernel[0])
    saved[name] = [re.sub(r" from .*| output of .*", "", line) + (" (input)" if " argument " in line else "")
                   for line in text.getvalue().splitlines()]
    print(f"{name:<17}", ", ".join(saved[name]))
assert saved["nothing_saveable"] == ["f32[64,128] (input)", "f32[128,512] (input)", "f32[512,128] (input)"]
assert saved["dots_saveable"] == saved["nothing_saveable"] + ["f32[64,512]"]  # x @ up, before the relu
assert len(saved["no remat"]) == 6  # relu's output, its mask, and a broadcast, each [64, 512]
assert saved["no remat"][:3] == saved["nothing_saveable"] and all("[64,512]" in s for s in saved["no remat"][3:])

# %% [markdown]
# Every policy saves the block's inputs, weights included. Inside a scan, a weight input is the layer's
# weight as it is stored, split 8 ways: each device saves its **slice**, not the gathered weight. Without remat
# the block also keeps three `[64, 512]` activations; `dots_saveable` keeps one, the matmul's output, and
# recomputes the relu; `nothing_saveable` keeps none and recomputes the whole block in the backward pass.
#
# Now compile the FSDP step for 2 and 4 layers: unrolled, scanned, and scanned with `nothing_saveable`
# remat (the `Stack` default), from abstract state (`jax.ShapeDtypeStruct` with shardings: nothing is
# allocated). The table shows the **working memory**: what the step allocates beyond its arguments
# (`footprint − argument`, from `memory_per_device`).

# %%
layer_bytes = 2 * D * H * 4  # one block's two kernels, whole, float32
variants = {"unrolled": dict(scan=False, policy=None), "scan": dict(policy=None), "scan + remat": {}}
working = {}
for name, options in variants.items():
    for layers in (2, 4):
        if name == "scan + remat" and layers == 2:
            c = compiled["ZeRO-3"]  # the step compiled above
        else:
            c = steps["ZeRO-3"].lower(*abstract("ZeRO-3", mesh, layers=layers, **options), x_d, y_d).compile()
        compiled[name, layers] = c
        m = memory_per_device(c)
        working[name, layers] = m.footprint - m.argument

print(f"one layer's kernels: {format_bytes(layer_bytes)} whole, {format_bytes(layer_bytes / 8)} per device")
print(f"{'':<14}{'L = 2':>11}{'L = 4':>11}{'per layer':>11}")
growth = {}
for name in variants:
    growth[name] = (working[name, 4] - working[name, 2]) / 2
    print(f"{name:<14}{format_bytes(working[name, 2]):>11}{format_bytes(working[name, 4]):>11}"
          f"{format_bytes(growth[name]):>11}")
assert growth["unrolled"] >= layer_bytes  # each layer adds at least its whole weights
assert growth["scan + remat"] < growth["scan"] < growth["unrolled"]
assert growth["scan + remat"] < layer_bytes / 2  # what still grows is per-device: slices, saved inputs
unrolled_comm = collectives(compiled["unrolled", 2])
if CPU:
    assert growth["unrolled"] == 2 * layer_bytes + 16  # gathered weights + the whole gradient
    assert abs(growth["scan"] - 256 * 2**10) < 2**10 and abs(growth["scan + remat"] - 160 * 2**10) < 2**10
    (whole_gradient,) = [op for op in unrolled_comm.ops if op.kind == "all-reduce"]
    assert whole_gradient.result_bytes == 2 * layer_bytes + 4  # both layers' gradients (and the loss) at once

# %% [markdown]
# Unrolled, every layer adds 1.0 MiB per device: its two kernels gathered whole (512 KiB) and, on the CPU
# backend, their whole gradient, which one all-reduce sums for all layers at once. Scanned, a layer adds
# 256 KiB on the CPU backend; with remat, 160 KiB: less than half a layer's whole kernels. What still grows with depth is
# per-device data, such as each layer's 64 KiB of weight slices, their gradients, and the activations
# saved for the device's 64 examples. The collectives of the scanned step:

# %%
scan_comm = collectives(compiled["scan + remat", 2])
print(scan_comm)
gathers = [op for op in scan_comm.ops if op.kind == "all-gather"]
assert len(gathers) == 4 and all(op.in_loop for op in gathers)  # up and down, in the forward and backward loops
gradient_sums = [op for op in scan_comm.ops if op.kind in ("all-reduce", "reduce-scatter") and op.result_bytes > 4]
assert len(gradient_sums) == 1 and gradient_sums[0].in_loop  # the gradient, summed one layer at a time
assert not any(op.in_loop for op in unrolled_comm.ops) and unrolled_comm.count("all-gather") >= 4  # no loop
if CPU:
    assert sum(op.result_bytes for op in gathers) == 2 * layer_bytes  # each layer's kernels whole, twice

# %% [markdown]
# `(in loop)` marks a collective in a `while` loop's body: it runs once per layer. The forward loop gathers
# `up` and `down`; the backward loop gathers them again, because the scan saved only the slices; the
# gradient's sum (an all-reduce on CPU) is in the backward loop too, one layer at a time. So the scan
# bounds the gathered weights to one layer, and remat bounds the activations saved per layer: with both,
# what grows with depth is divided by the device count.
#
# ## 4. ZeRO-1, 2 and 3: three rules
#
# ZeRO (Zero Redundancy Optimizer) names three steps from data parallelism, where every device stores
# everything, to FSDP:
#
# | stage | parameters | gradients | optimizer state | the step's collectives |
# |---|---|---|---|---|
# | ZeRO-1 | whole | whole | split | all-reduce gradients, all-gather the new parameters |
# | ZeRO-2 | whole | split | split | reduce-scatter gradients, all-gather the new parameters |
# | ZeRO-3 (FSDP) | split | split | split | all-gather each layer's weights, reduce-scatter gradients |
#
# Each stage is a row of `ZERO`; for the `up` kernel:

# %%
up_shape = (2, D, H)
panels = {}
for stage, splits in ZERO.items():
    for what, split in zip(("parameters", "gradients", "Adam mu, nu"), splits, strict=True):
        panels[f"{stage} {what}"] = (up_shape, layout(split, mesh, jax.ShapeDtypeStruct(up_shape, jnp.float32)))
assert panels["ZeRO-3 parameters"][1].shard_shape(up_shape) == (2, 16, 512)  # 1/8 of every layer's rows
draw_shardings(panels, ncols=3)

# %% [markdown]
# Build each stage's state from the same initial state (ZeRO-1 and 2 gather the parameters whole),
# compile its step, read what it stores and allocates, and train it 5 steps:

# %%
states = {"ZeRO-3": (model, optimizer)}
for stage in ("ZeRO-1", "ZeRO-2"):
    m, o = build()
    nnx.update(m, jax.device_put(nnx.state(m), NamedSharding(mesh, P())))
    states[stage] = (m, o)
    compiled[stage] = steps[stage].lower(m, o, x_d, y_d).compile()


def summary(comm):
    """'1 all-reduce in loop, 2 all-gather': how many of each kind, in the layer loop or not (the loss aside)."""
    ops = [(op.kind, op.in_loop) for op in comm.ops if op.result_bytes > 4]
    return ", ".join(f"{ops.count(k)} {k[0]}{' in loop' if k[1] else ''}" for k in dict.fromkeys(ops))


print(f"{'':<8}{'stored':>11}{'working':>10}   collectives")
stored, work, comms = {}, {}, {}
for stage in ZERO:
    mem, comms[stage] = memory_per_device(compiled[stage]), collectives(compiled[stage])
    stored[stage] = sum(shard_table(leaf).bytes_per_device[0] for leaf in jax.tree.leaves(nnx.state(states[stage])))
    work[stage] = mem.footprint - mem.argument
    print(f"{stage:<8}{format_bytes(stored[stage]):>11}{format_bytes(work[stage]):>10}   {summary(comms[stage])}")

params_bytes = 4 * n_params
assert stored["ZeRO-1"] == stored["ZeRO-2"] == params_bytes + 2 * params_bytes // 8 + 8
assert stored["ZeRO-3"] == state_bytes
assert work["ZeRO-1"] > work["ZeRO-2"] > work["ZeRO-3"]
for stage in ("ZeRO-1", "ZeRO-2"):  # the updated parameters, gathered whole once per step, after the loop
    assert sorted(op.shapes for op in comms[stage].ops if op.kind == "all-gather") == [((2, 128, 512),),
                                                                                      ((2, 512, 128),)]
    assert not any(op.in_loop for op in comms[stage].ops if op.kind == "all-gather")
assert all(op.in_loop for op in comms["ZeRO-3"].ops if op.kind == "all-gather")
if CPU:  # the CPU compiler writes every gradient sum as an all-reduce
    assert [(op.kind, op.result_type) for op in comms["ZeRO-1"].ops] == [
        (op.kind, op.result_type) for op in comms["ZeRO-2"].ops]
    assert all(op.kind != "reduce-scatter" for stage in ZERO for op in comms[stage].ops)
    saving = work["ZeRO-1"] - work["ZeRO-2"]
    print("ZeRO-2 allocates", format_bytes(saving), "less than ZeRO-1")
    assert abs(saving - (params_bytes - params_bytes // 8)) < 128  # the whole gradient, less ZeRO-2's slice

losses = {stage: [float(steps[stage](*states[stage], x_d, y_d)) for _ in range(5)] for stage in ZERO}
for stage in ZERO:
    print(f"{stage} losses:", np.round(losses[stage], 5))
    np.testing.assert_allclose(losses[stage], ref_losses, rtol=RTOL)

# %% [markdown]
# All three train to the reference's losses. ZeRO-1 and 2 store the whole parameters (1.0 MiB) and 1/8
# of Adam's moments; ZeRO-3 stores 1/8 of everything. ZeRO-1 and 2 all-gather the updated parameters once
# per step, after the loop; ZeRO-3 gathers each layer's weights inside it instead. The working memory falls
# at each stage. ZeRO-2 differs from ZeRO-1 only in the gradient's layout, yet on the CPU backend it
# allocates 895.9 KiB less: the whole gradient (1.0 MiB) less the slice ZeRO-2 keeps. ZeRO-1 holds the
# gradient whole until Adam has read its slice.
#
# The two CPU programs have the same collectives, though: on the CPU backend the partitioner's
# reduce-scatter is an all-reduce followed by a `dynamic-slice`. The TPU compiler fuses that pair. Compile
# the three steps for a TPU v5e of 8 chips (`v5e:2x4`), which needs the TPU compiler but no TPU:

# %%
ok, why = tpu_compiler_available()
print(why)
if ok:
    with quiet():  # libtpu's start-up warnings
        topo = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")
    tpu_mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,), devices=topo.devices)
    tpu_x = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(tpu_mesh, P("data")))
    tpu_steps = {stage: make_step(stage, tpu_mesh) for stage in ZERO}
    tpu, summed = {}, {}
    for stage in ZERO:
        with quiet():
            tpu[stage] = tpu_steps[stage].lower(*abstract(stage, tpu_mesh), tpu_x, tpu_x).compile()
        gradient = [op for op in collectives(tpu[stage]).ops if op.in_loop and op.kind != "all-gather"]
        print(f"{stage}: {memory_per_device(tpu[stage]).footprint / 2**20:.1f} MiB per chip; the gradient's sum: "
              f"{gradient[0].kind} {gradient[0].result_type} (ring estimate "
              f"{format_bytes(gradient[0].estimated_bytes)})")
        assert len(gradient) == 1 and gradient[0].kind == ("all-reduce" if stage == "ZeRO-1" else "reduce-scatter")
        summed[stage] = gradient[0]
    for stage in ("ZeRO-2", "ZeRO-3"):  # each chip's slices; half the ring estimate of ZeRO-1's all-reduce
        assert sorted(summed[stage].shapes) == [(16, 512), (64, 128)]
        assert 2 * summed[stage].estimated_bytes == summed["ZeRO-1"].estimated_bytes
    assert memory_per_device(tpu["ZeRO-1"]).footprint > memory_per_device(tpu["ZeRO-2"]).footprint > \
        memory_per_device(tpu["ZeRO-3"]).footprint

# %% [markdown]
# On the TPU, ZeRO-1 sums each layer's two kernel gradients with an all-reduce; ZeRO-2 and 3 with one
# fused **reduce-scatter** that hands each chip its `[64,128]` and `[16,512]` slices, for half the bytes
# sent by the ring estimate. The memory per chip falls from stage to stage, as on the CPU.
#
# ## 5. Mixed precision: bf16 parameters, float32 master weights
#
# The usual recipe computes the forward and backward passes with bf16 parameters (so activations and
# gradients are bf16), and keeps a **float32 master copy** of the parameters, with Adam's moments, for the
# update: in bf16, `1 + 0.001` is `1`, so small updates would vanish. The master copy is a few lines of
# Optax, a transformation that runs Adam on it:

# %%
assert jnp.bfloat16(1) + jnp.bfloat16(0.001) == 1  # 8 bits of mantissa: the update is lost


class MasterState(NamedTuple):
    master: Any  # float32 copy of the parameters
    inner: Any  # the wrapped optimizer's state, float32


def fp32_master(tx):
    """Run `tx` on float32 master weights; hand the low-precision parameters their rounded new value."""
    def init(params):
        master = jax.tree.map(lambda p: p.astype(jnp.float32), params)
        return MasterState(master, tx.init(master))

    def update(grads, state, params):
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        updates, inner = tx.update(grads, state.inner, state.master)
        master = optax.apply_updates(state.master, updates)
        step = jax.tree.map(lambda m, p: m - p.astype(jnp.float32), master, params)  # param + step = master
        return step, MasterState(master, inner)

    return optax.GradientTransformation(init, update)


def to_mixed(model):
    """bf16 parameters; the optimizer keeps their float32 values as master weights."""
    optimizer = nnx.Optimizer(model, fp32_master(optax.adam(1e-3)), wrt=nnx.Param)
    nnx.update(model, jax.tree.map(lambda p: p.astype(jnp.bfloat16), nnx.state(model, nnx.Param)))
    return model, optimizer


mixed_model, mixed_optimizer = create_sharded("ZeRO-3", mesh, to_mixed)(build()[0])  # a fresh float32 model
x_bf16 = x_d.astype(jnp.bfloat16)
grads_type = jax.eval_shape(nnx.grad(loss_fn), mixed_model, x_bf16, y_d)


def bytes_per_param(state):
    """Bytes per parameter, summed over all devices, of the parameter-shaped arrays of a state."""
    return sum(shard_table(leaf).total_bytes for leaf in jax.tree.leaves(state) if leaf.ndim == 3) / n_params


accounting = {
    "bf16 parameters": bytes_per_param(nnx.state(mixed_model)),
    "float32 master": bytes_per_param(mixed_optimizer.opt_state.master),
    "Adam mu + nu": bytes_per_param(mixed_optimizer.opt_state.inner),
    "bf16 gradient": sum(g.size * g.dtype.itemsize for g in jax.tree.leaves(grads_type)) / n_params,
}
for what, b in accounting.items():
    print(f"{what:<17}{b:>4.0f} bytes per parameter")
print(f"{'total':<17}{sum(accounting.values()):>4.0f}")
assert list(accounting.values()) == [2, 4, 8, 2]

# %% [markdown]
# 2 + 4 + 4 + 4 bytes stored, and a 2-byte gradient while the step runs: 16 bytes per parameter, the usual
# accounting, read from the arrays themselves (the gradient from the step's traced types).
#
# > **You will see this online:** "Mixed precision halves the memory of training."
#
# Count float32 training the same way: 4 bytes of parameters, 8 of Adam's moments, a 4-byte gradient.

# %%
fp32_grads = jax.eval_shape(nnx.grad(loss_fn), model, x_d, y_d)  # types only, as for the bf16 gradient
fp32 = {"parameters": bytes_per_param(nnx.state(model)), "Adam mu + nu": bytes_per_param(optimizer.opt_state),
        "gradient": sum(g.size * g.dtype.itemsize for g in jax.tree.leaves(fp32_grads)) / n_params}
print("float32:", sum(fp32.values()), "bytes per parameter; mixed precision:", sum(accounting.values()))
assert sum(fp32.values()) == sum(accounting.values()) == 16

# %% [markdown]
# The same 16 bytes: the master copy costs what the bf16 parameters and gradient save. What bf16 saves is
# in the step, in what it computes with and moves (below, the gradient's reduce-scatter on a TPU); what
# divides the 16 bytes is ZeRO, here ZeRO-3 on 8 devices: 2 bytes per parameter per device. Train the
# mixed-precision model 5 steps with the same ZeRO-3 step, from the same float32 initial weights:

# %%
compiled["mixed"] = steps["ZeRO-3"].lower(mixed_model, mixed_optimizer, x_bf16, y_d).compile()
mixed_losses = [float(steps["ZeRO-3"](mixed_model, mixed_optimizer, x_bf16, y_d)) for _ in range(5)]
difference = np.max(np.abs(np.array(mixed_losses) / np.array(ref_losses) - 1))
print("mixed precision:", np.round(mixed_losses, 4))
print("float32:        ", np.round(ref_losses, 4))
print(f"largest relative difference: {difference:.0e}")
np.testing.assert_allclose(mixed_losses, ref_losses, rtol=2e-2)  # bf16 keeps about 3 significant digits
assert mixed_model.blocks.up.kernel[...].dtype == jnp.bfloat16 and mixed_losses != ref_losses
if CPU:  # the CPU compiler sums the bf16 gradients in float32
    assert {op.result_type.split("[")[0] for op in collectives(compiled["mixed"]).ops} == {"f32"}

# %% [markdown]
# Within bf16's tolerance. On the CPU backend the compiler converts the bf16 gradients and weights to
# float32 before its collectives (the last assert). The TPU program
# moves the 2-byte gradient as it is: compile the mixed-precision ZeRO-3 step for `v5e:2x4` next to the
# float32 one.

# %%
if ok:
    with quiet():
        tpu["mixed"] = tpu_steps["ZeRO-3"].lower(
            *abstract("ZeRO-3", tpu_mesh, make=lambda: to_mixed(create()[0])),
            jax.ShapeDtypeStruct(x.shape, jnp.bfloat16, sharding=tpu_x.sharding), tpu_x).compile()
    scatter = {}
    for name in ("ZeRO-3", "mixed"):
        (scatter[name],) = [op for op in collectives(tpu[name]).ops if op.kind == "reduce-scatter"]
        print(f"{name:<7} gradient reduce-scatter: {scatter[name].result_type:<28}"
              f"{scatter[name].result_bytes:>7,} bytes per chip per layer")
    assert scatter["mixed"].result_type.startswith("bf16") and scatter["ZeRO-3"].result_type.startswith("f32")
    assert 2 * scatter["mixed"].result_bytes == scatter["ZeRO-3"].result_bytes

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** A model of 7 billion parameters is trained with section 5's mixed precision (2-byte
# parameters and gradients, 12 bytes of master weights and Adam moments per parameter) on 64 devices.
# How many bytes does each device hold for parameters, gradients and optimizer state together under
# ZeRO-1, ZeRO-2 and ZeRO-3?

# %%
from exercises import ex12_training_memory as ex

answer_1 = NOT_ANSWERED  # a tuple (ZeRO-1, ZeRO-2, ZeRO-3) of bytes per device
ex.zero_bytes.check(answer_1);

# %% [markdown]
# **Exercise 2.** Write `zero_specs(stage)` for a stacked kernel `(layers, rows, cols)` on the mesh axis
# `'data'`: given `1`, `2` or `3`, return the `PartitionSpec`s of the parameter, its gradient and its
# Adam moments, as a tuple of three.

# %%
def zero_specs(stage):
    ...  # return (parameter spec, gradient spec, optimizer-state spec)


answer_2 = NOT_ANSWERED  # set it to zero_specs once you have written it
ex.zero_specs.check(answer_2);

# %% [markdown]
# ## Takeaways
# - Donate the state in every train step: without `donate_argnums` the old and the new state are both live.
# - Unrolled, FSDP's working memory grows by more than a layer's whole weights per layer: the gathered
#   weights are not divided by the device count. A scan over stacked layers gathers one layer at a time,
#   in the forward and again in the backward loop (`in_loop` collectives).
# - Remat with a policy (`nothing_saveable`, `dots_saveable`) decides which activations the scan saves
#   per layer; with the scan, what grows with depth is divided by the device count.
# - ZeRO-1, 2, 3 split the optimizer state, then the gradients, then the parameters: three sharding rules,
#   the same losses. On the CPU backend a reduce-scatter is an all-reduce and a slice; a TPU fuses it.
# - Mixed precision with float32 master weights stores 2 + 4 + 4 + 4 bytes per parameter and a 2-byte
#   gradient: 16, like float32. It saves in the step (a bf16 gradient moves half the bytes); ZeRO divides
#   the 16 bytes.
#
# **Next:** [13 · Sequence parallelism, gradient accumulation, and what comes next](13_sequence_batch.ipynb)
