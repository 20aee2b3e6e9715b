# %% [markdown]
# # 14 · Sequence parallelism, gradient accumulation, and what comes next
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/14_sequence_batch.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/14_sequence_batch.ipynb)
#
# Under tensor parallelism each of the 8 devices of the `model` axis holds the whole activation between
# the parallel regions, 128 KiB here where 16 KiB would do. A batch too large for memory needs the same
# care: split into micro-batches the wrong way, it stops being data parallel.
#
# **You need:** notebooks 05 (Explicit axes), 08 (column- and row-parallel layers), 09 (a `data` x `model`
# mesh) and 10 (FSDP), and the functions `jax.lax.with_sharding_constraint`, `jax.lax.scan` and `jax.typeof`.
#
# Three techniques join the strategies of notebooks 07 to 12, and a map shows the ones beyond them.
#
# **You will learn**
# - how `P(None, 'model', None)` on the activations between tensor-parallel regions divides their
#   memory by the `model` axis, and turns the all-reduce into a reduce-scatter and an all-gather
# - how to accumulate gradients with `jax.lax.scan` inside one jitted step, and split the batch into
#   micro-batches without undoing data parallelism
# - how a data x tensor parallel model trains on an Explicit mesh: `jax.typeof` through the model, the
#   row-parallel layer's `ShardingTypeError`, and `out_sharding=`
# - what pipeline, expert and context parallelism add: a `stage`, `expert` or `context` axis, and a
#   collective-permute or all-to-all.

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
import json
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (NOT_ANSWERED, assert_close, collectives, draw_permute, draw_shardings, format_bytes,
                   memory_per_device, quiet, shard_table, tpu_compiler_available, type_string)
from spmd_course.utils.published_rows import PROGRAMS

ATOL = 1e-5 if CPU else 1e-2  # for values near zero, where a relative tolerance means nothing

# %% [markdown]
# ## 1. Sequence parallelism: split what tensor parallelism replicates
#
# Tensor parallelism splits the work *inside* its regions (the column-parallel then row-parallel pair of
# notebook 08), but between them, where the layer norm, the residual add and dropout run, every device
# of the `model` axis holds the same full activation. Sequence parallelism, in the Megatron style of
# Korthikanti et al. (2022), splits those activations along the sequence dimension instead. Attention
# itself stays split by heads, and only context parallelism (section 4) splits its sequence too.
# DeepSpeed-Ulysses, also called sequence parallelism, is another scheme: it keeps the sequence split
# everywhere and switches attention to a split by heads with all-to-alls.
#
# The block: a pre-norm feed-forward layer, `x + down(gelu(up(norm(x))))`, on an 8-device `model` axis,
# for 4 sequences of 128 tokens of width 64. `between` is the layout of the activations outside the
# tensor-parallel region. The hidden activation inside the region is always split on its features,
# `P(None, None, 'model')`, as the column-parallel layer makes it.

# %%
mesh = jax.make_mesh((8,), ("model",), axis_types=(AxisType.Auto,))
B, S, D, F = 4, 128, 64, 256
rng = np.random.default_rng(1)  # numpy's generator: fixed numbers, nothing to compile
tokens = rng.standard_normal((B, S, D), np.float32)
params = {"scale": np.ones(D, np.float32), "up": rng.standard_normal((D, F), np.float32) / np.sqrt(D),
          "down": rng.standard_normal((F, D), np.float32) / np.sqrt(F)}
param_specs = {"scale": P(), "up": P(None, "model"), "down": P("model", None)}  # column-, then row-parallel


def block(params, x, *, between=None, mesh=None):
    """Pre-norm feed-forward block; returns the output and the layer norm's output."""
    def pin(a, spec):
        return a if mesh is None else jax.lax.with_sharding_constraint(a, NamedSharding(mesh, spec))

    x = pin(x, between)
    normed = pin(jax.nn.standardize(x, axis=-1) * params["scale"], between)  # layer norm
    hidden = pin(jax.nn.gelu(normed @ params["up"]), P(None, None, "model"))  # column-parallel
    return pin(x + hidden @ params["down"], between), normed  # row-parallel, then the residual add


TP, SP = P(), P(None, "model", None)  # between the regions: replicated, or split over the sequence
ref_out, ref_normed = jax.jit(block)(params, tokens)  # one device: the reference
placed = jax.device_put(params, {k: NamedSharding(mesh, s) for k, s in param_specs.items()})
runs = {}
for name, between in (("tensor parallel", TP), ("sequence parallel", SP)):
    step = jax.jit(partial(block, between=between, mesh=mesh))
    x_in = jax.device_put(tokens, NamedSharding(mesh, between))
    compiled = step.lower(placed, x_in).compile()
    out, normed = step(placed, x_in)
    runs[name] = (compiled, normed)
    assert_close(out, ref_out, atol=ATOL)
    assert_close(normed, ref_normed, atol=ATOL)
    assert shard_table(out).bytes_per_device == shard_table(normed).bytes_per_device  # the residual stream too
    print(f"{name}: normed is {type_string(normed)}, "
          f"{format_bytes(shard_table(normed).bytes_per_device[0])} per device")
    print(collectives(compiled), "\n")

(tp_program, tp_normed), (sp_program, sp_normed) = runs.values()
tp_ops, sp_ops = collectives(tp_program), collectives(sp_program)
assert shard_table(tp_normed).bytes_per_device[0] == B * S * D * 4  # every device: the whole activation
assert shard_table(sp_normed).bytes_per_device[0] == B * S * D * 4 // 8  # one eighth: 16 of the 128 tokens
assert [(op.kind, op.shapes) for op in tp_ops.ops] == [("all-reduce", ((B, S, D),))]
assert (sp_ops.ops[0].kind, sp_ops.ops[0].shapes) == ("all-gather", ((B, S, D),))
draw_shardings({"tensor parallel: normed": tp_normed, "sequence parallel: normed": sp_normed}, ncols=2)

# %% [markdown]
# Both layouts give the reference's numbers. Under tensor parallelism the layer norm's output (and the
# residual stream) is `f32[4,128,64]` on every device, 128 KiB each. Under sequence parallelism it is
# `f32[4,128@model,64]`, 16 KiB each. (The picture shows tokens down, features across.)
#
# The communication moves. The row-parallel layer still produces partial sums, but each device now
# needs only its own 16 tokens of the total: a **reduce-scatter** over the sequence. The next
# column-parallel layer needs every token: an **all-gather**. An all-reduce *is* a reduce-scatter
# followed by an all-gather (notebook 11), so sequence parallelism simply puts the layer norm and the
# residual add between its two halves. On the CPU backend the reduce-scatter is spelled as the whole all-reduce
# followed by a `dynamic-slice` of each device's 16 tokens:

# %%
slices = sorted(set(re.findall(r"= (f32\[[0-9,]+\])\{[0-9,]+\} dynamic-slice\(", sp_program.as_text())))
print("dynamic-slice results:", slices)

# %% [markdown]
# The TPU compiler writes it as one. Compile both blocks ahead of time for a TPU v5e with 8 chips, as
# notebook 13 did (only the TPU compiler, libtpu, is needed). These small programs use the compiler's
# default effort:

# %%
TPU_OK, why = tpu_compiler_available()
print(why)
if TPU_OK:
    with quiet():  # libtpu's start-up warnings stay out of the notebook
        topology = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")


def on_tpu(f, axis, args, specs, **jit_options):
    """Compile f(mesh) for the 8 TPU chips on one mesh axis, for inputs shaped like args and laid out by specs."""
    tpu_mesh = jax.make_mesh((len(topology.devices),), (axis,), axis_types=(AxisType.Auto,), devices=topology.devices)
    structs = jax.tree.map(lambda s, a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(tpu_mesh, s)),
                           specs, args, is_leaf=lambda s: isinstance(s, P))
    with quiet():
        return jax.jit(f(tpu_mesh), **jit_options).lower(*structs).compile()


if TPU_OK:
    tpu = {name: collectives(on_tpu(lambda m, b=between: partial(block, between=b, mesh=m), "model",
                                    (params, tokens), (param_specs, between)))
           for name, between in (("tensor parallel", TP), ("sequence parallel", SP))}
    print(f"{'':<27}{'ring estimate':>13}   collectives")
    for name, cpu_ops in (("tensor parallel", tp_ops), ("sequence parallel", sp_ops)):
        for backend, ops in (("CPU", cpu_ops), ("TPU v5e", tpu[name])):
            print(f"{name:<19}{backend:<8}{format_bytes(ops.estimated_bytes):>13}   "
                  + ", ".join(f"{op.kind} {op.result_type}" for op in ops.ops))
    assert [op.kind for op in tpu["tensor parallel"].ops] == ["all-reduce"]
    assert [(op.kind, op.shapes) for op in tpu["sequence parallel"].ops] == [
        ("all-gather", ((B, S, D),)), ("reduce-scatter", ((B, S // 8, D),))]
    assert tpu["sequence parallel"].ops[0].result_type.startswith("bf16")  # gathered in bf16
    assert tpu["sequence parallel"].estimated_bytes < tpu["tensor parallel"].estimated_bytes

# %% [markdown]
# On the TPU the sequence-parallel block has an all-gather and a reduce-scatter whose result is each
# chip's `f32[4,16,64]`, and no all-reduce. By the ring estimates it sends less than the
# tensor-parallel all-reduce. In float32 the two halves would add up to the all-reduce, and
# here they send less because the TPU gathers in bf16. Sequence parallelism costs the same traffic or
# less, for one eighth of the memory between the regions, so there is little reason to run tensor
# parallelism without it.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §1: its reduce-scatter
print(f"{jax.default_backend().upper()} compiler, sequence parallel:", ", ".join(op.kind for op in sp_ops.ops),
      "and a dynamic-slice to", slices)
if CPU:  # the CPU compiler's spelling of the reduce-scatter
    assert [op.kind for op in sp_ops.ops] == ["all-gather", "all-reduce"]
    assert f"f32[{B},{S // 8},{D}]" in slices

# %% [markdown]
# ## 2. Gradient accumulation: a global batch that does not fit
#
# When the activations of the global batch do not fit, split it into micro-batches, sum their
# gradients, and apply one update, the whole batch's. With `jax.lax.scan` the loop runs inside one
# jitted, sharded step.
#
# The model is the MLP `64 -> 256 -> 10` of notebooks 07 to 10, on an 8-device `data` mesh, with a
# global batch of 8,192 examples in 8 micro-batches of 1,024. The step is functional (`nnx.split` once,
# `nnx.merge` inside) so that the scan carries plain arrays. The optimizer is plain SGD, so comparing
# updates compares gradients, and the labels are one-hot (section 3 says why).

# %%
class MLP(nnx.Module):
    def __init__(self, rngs, sizes=(64, 256, 10)):  # sizes: for a wider copy at the end of this section
        self.linear1 = nnx.Linear(sizes[0], sizes[1], rngs=rngs)
        self.linear2 = nnx.Linear(sizes[1], sizes[2], rngs=rngs)

    def __call__(self, x, out_sharding=None):  # out_sharding: for section 3
        return self.linear2(jax.nn.relu(self.linear1(x)), out_sharding=out_sharding)


def cross_entropy(logits, labels):
    return optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, logits.shape[-1])).mean()


N, MICRO = 8192, 8
x_big = rng.standard_normal((N, 64), np.float32)
y_big = np.argmax(x_big @ rng.standard_normal((64, 10), np.float32), axis=-1).astype(np.int32)  # a random teacher
graphdef, params0 = nnx.split(nnx.jit(lambda: MLP(nnx.Rngs(0)))())
tx = optax.sgd(0.1)  # plain SGD: the update is the gradient times -0.1, so comparing updates compares gradients


def fresh_model():
    """A new MLP holding a copy of the initial parameters."""
    return nnx.merge(graphdef, jax.tree.map(jnp.copy, params0))


def make_steps(graphdef):
    """The whole-batch step and the accumulating step, for a model split into graphdef and params."""
    def loss_fn(params, x, y):
        return cross_entropy(nnx.merge(graphdef, params)(x), y)

    def big_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    def accumulating_step(params, opt_state, x, y, *, split):
        def one(total, batch):  # one micro-batch: add its gradient to the running total
            loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
            return jax.tree.map(jnp.add, total, grads), loss

        zeros = jax.tree.map(jnp.zeros_like, params)
        total, losses = jax.lax.scan(one, zeros, (split(x), split(y)))  # split: (N, ...) -> (MICRO, N // MICRO, ...)
        updates, opt_state = tx.update(jax.tree.map(lambda g: g / MICRO, total), opt_state)
        return optax.apply_updates(params, updates), opt_state, losses.mean()

    return big_step, accumulating_step


big_step, accumulating_step = make_steps(graphdef)
dp_mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
state0 = jax.device_put((params0, tx.init(params0)), NamedSharding(dp_mesh, P()))  # replicated
x_dp, y_dp = jax.device_put((x_big, y_big), NamedSharding(dp_mesh, P("data")))

# %% [markdown]
# How to split the batch into micro-batches?
#
# > **You will see this online:** micro-batches as consecutive rows:
# > ```python
# > micro_batches = x.reshape(num_micro, -1, *x.shape[1:])
# > ```
#
# The batch is `f32[8192@data,64]`: device *k* holds rows `1024k ... 1024k+1023`, so micro-batch *k*
# is exactly device *k*'s rows. The types say it:

# %%
def consecutive(a):
    return a.reshape(MICRO, -1, *a.shape[1:])


def strided(a):  # micro-batch m: rows m, m + 8, m + 16, ...: every device holds 1/8 of every micro-batch
    return a.reshape(-1, MICRO, *a.shape[1:]).swapaxes(0, 1)


for split in (consecutive, strided):
    print(f"{split.__name__:<12}", type_string(jax.jit(split)(x_dp)))
assert shard_table(jax.jit(consecutive)(x_dp)).shard_shapes == {(1, N // MICRO, 64)}
assert shard_table(jax.jit(strided)(x_dp)).shard_shapes == {(MICRO, N // MICRO // 8, 64)}

# %% [markdown]
# With consecutive rows, the micro-batch dimension carries `@data`: one micro-batch per device. The scan
# then needs every micro-batch whole in turn. Compile the three steps (whole batch, two splits) and
# compare what each device holds and sends:

# %%
donated = {"donate_argnums": (0, 1)}  # every step updates its parameters (and optimizer state) in place
programs = {"whole batch": jax.jit(big_step, **donated),
            "consecutive": jax.jit(partial(accumulating_step, split=consecutive), **donated),
            "strided": jax.jit(partial(accumulating_step, split=strided), **donated)}
compiled_steps = {name: step.lower(*state0, x_dp, y_dp).compile() for name, step in programs.items()}
print(f"{'':<13}{'footprint':>10}   collectives")
for name, compiled in compiled_steps.items():
    ops = collectives(compiled)
    print(f"{name:<13}{format_bytes(memory_per_device(compiled).footprint):>10}   "
          + ", ".join(f"{op.kind}{' (in loop)' if op.in_loop else ''} {op.result_type}" for op in ops.ops))

footprint = {name: memory_per_device(c).footprint for name, c in compiled_steps.items()}

# %% [markdown]
# With consecutive rows the compiler gathers the examples onto every device, so every device computes
# every micro-batch and no gradient all-reduce is left. Data parallelism is gone, and on the CPU backend
# the step even needs more memory than the whole batch. (The hidden cell at the end of this section,
# "The CPU compiler's exact figures, §2", asserts the CPU figures of this paragraph.)
#
# The fix is the strided split. Micro-batch *m* takes rows *m*, *m* + 8, ..., so each device gives 128
# of its rows to each micro-batch, the types read `f32[8,1024@data,64]`, and nothing moves. Its CPU
# footprint is the smallest, because only one micro-batch's activations are alive at a time.
#
# Does it give the whole batch's update? Run both from the same state:

# %%
whole_params, _, whole_loss = programs["whole batch"](*jax.tree.map(jnp.copy, state0), x_dp, y_dp)  # donated:
acc_params, _, acc_loss = programs["strided"](*jax.tree.map(jnp.copy, state0), x_dp, y_dp)  # each a fresh copy
print(f"loss: whole batch {float(whole_loss):.6f}, accumulated {float(acc_loss):.6f}")
assert_close(acc_loss, whole_loss)
for whole, acc in zip(jax.tree.leaves(whole_params), jax.tree.leaves(acc_params), strict=True):
    assert_close(acc, whole, atol=ATOL)

# %% [markdown]
# The same loss and the same parameters after the update.
#
# The memory figures above are the CPU compiler's, at a toy size. On a TPU a program this small lives
# mostly in on-chip VMEM (128 MiB on a v5e), so the TPU's memory needs a size that matters:
#
# | what | TPU figures' size |
# |---|---|
# | MLP | `2048 -> 16384 -> 2048`, 256 MiB of weights |
# | examples | 32,768, a 256 MiB hidden activation per chip |
# | target | a TPU v5e with 8 chips, compiled ahead of time, nothing allocated |
# | compiler effort | default, the one a training run gets |
#
# The effort matters because what the compiler does with the loop is the lesson. At O0 or O1 the TPU
# compiler keeps the gradient sum inside the loop, and the strided step then needs *more* HBM than the
# whole batch. At this size each of those compiles takes about 8 s of CPU, more than this page's
# budget. So the course compiled the three steps once and keeps their HBM per chip in
# `data/sequence_batch`, and `tests/test_14_sequence_batch.py` compiles them again with this notebook's
# code and checks the figures. Where the collectives sit in the loop does not depend on the size, so the
# cell compiles the toy steps above for the TPU, at the default effort, live.

# %%
acc_ops = collectives(compiled_steps["strided"])
print(f"{jax.default_backend().upper()}:", acc_ops, sep="\n")
WIDE, N_WIDE = (2048, 16384, 2048), 32768  # the TPU figures' MLP and examples
hidden = N_WIDE // 8 * WIDE[1] * 4  # one chip's hidden activation for its whole share of the batch
stored = json.loads((PROGRAMS.parent / "sequence_batch" / "tpu_hbm.json").read_text())  # data/sequence_batch
assert (tuple(stored["mlp"]), stored["examples"], stored["compiler_effort"]) == (WIDE, N_WIDE, "default")
tpu_hbm = stored["hbm"]
print(f"\nTPU {stored['topology']}, MLP {WIDE}, {N_WIDE:,} examples, default effort (stored; jax {stored['jax']}, "
      f"libtpu {stored['libtpu']}): hidden activation {format_bytes(hidden)} per chip")
for name, hbm in tpu_hbm.items():
    print(f"{name:<13} HBM {format_bytes(hbm):>10}")
assert tpu_hbm["strided"] < tpu_hbm["whole batch"] - hidden // 4  # one micro-batch's activations at a time
assert tpu_hbm["consecutive"] > tpu_hbm["whole batch"]  # the gathered batch, on every chip
if TPU_OK:
    state_specs = jax.tree.map(lambda _: P(), state0)
    tpu_ops = {name: collectives(on_tpu(lambda m, step=programs[name]: step, "data", (*state0, x_big, y_big),
                                        (*state_specs, P("data"), P("data"))))
               for name in ("strided", "consecutive")}  # the toy steps above, for 8 TPU chips, default effort
    print("strided, TPU:", tpu_ops["strided"], sep="\n")
    grads_ops = [op for op in tpu_ops["strided"].ops if op.result_bytes > 4]
    assert grads_ops and all((op.kind, op.in_loop) == ("all-reduce", False) for op in grads_ops)  # after the loop
    assert all(op.result_bytes <= 4 for op in tpu_ops["strided"].ops if op.in_loop)  # per micro-batch: the loss
    assert tpu_ops["consecutive"].kinds == {"all-gather"}  # consecutive micro-batches: gathered on TPU too

# %% [markdown]
# The strided step needs less HBM than the whole batch, because it keeps one micro-batch's activations
# and pays only for an accumulator the size of the weights. On the CPU the gradient all-reduce sits in
# the loop body and runs once per micro-batch. The TPU compiler moves it after the loop, so it runs once
# per step. Consecutive micro-batches are gathered on the TPU too, and need more HBM than the whole
# batch.
#
# Under FSDP (notebook 10) the weights are sharded, and each micro-batch needs them whole. Shard the
# MLP's kernels over `data` and compile the strided step for both backends:

# %%
def loop_state(compiled):
    """The types of what the accumulation loop carries, from the `while` line of the compiled program."""
    (line,) = [line for line in compiled.as_text().splitlines() if " while(" in line]
    return set(re.findall(r"\w+\[[\d,]*\]", line.split(" while(")[0]))


fsdp_specs = jax.tree.map(lambda a: P("data") if a.ndim == 2 else P(), state0)  # kernels split, biases whole
fsdp_state = jax.device_put(state0, jax.tree.map(lambda s: NamedSharding(dp_mesh, s), fsdp_specs))
fsdp_program = programs["strided"].lower(*fsdp_state, x_dp, y_dp).compile()
fsdp_ops = collectives(fsdp_program)
print(fsdp_ops)
weight_gathers = [op for op in fsdp_ops.ops if op.kind == "all-gather"]
# each kernel, whole, whether gathered alone or in one combined gather (as a GPU compiler writes it)
assert {s for op in weight_gathers for s in op.shapes} == {(64, 256), (256, 10)}
ACCUMULATOR = {"f32[8,256]", "f32[32,10]"}  # the kernels' gradient sums, split like the kernels, float32
if TPU_OK:
    tpu_fsdp = on_tpu(lambda m: programs["strided"], "data", (*state0, x_big, y_big),
                      (*fsdp_specs, P("data"), P("data")))
    print("TPU v5e:", collectives(tpu_fsdp), sep="\n")
    tpu_gathers = [op for op in collectives(tpu_fsdp).ops if op.kind == "all-gather"]
    assert sorted(int(np.prod(s)) for op in tpu_gathers for s in op.shapes) == [256 * 10, 64 * 256]  # whole kernels
    assert all(op.in_loop for op in tpu_gathers)  # once per micro-batch
    assert ACCUMULATOR.issubset(loop_state(tpu_fsdp))

# %% [markdown]
# The CPU compiler gathers each kernel once, before the loop, and holds it whole through all 8
# micro-batches. The TPU compiler saves that memory: it gathers the kernels (in bf16) inside the loop,
# once per micro-batch, 8 times the traffic. Both carry the accumulator split like the kernels, in
# float32. Keep it so with bf16 gradients too, because a long bf16 sum loses its low bits.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §2: the accumulation step at this toy size
print(f"{jax.default_backend().upper()} compiler: footprint "
      + ", ".join(f"{n} {format_bytes(b)}" for n, b in footprint.items())
      + f"; gradient sum {'inside' if any(op.in_loop for op in acc_ops.ops) else 'after'} the loop"
      + f"; FSDP weights gathered {'inside' if any(op.in_loop for op in weight_gathers) else 'before'} it")
if CPU:  # the CPU compiler's program at this toy size (the TPU's, at a real size, in the section)
    assert collectives(compiled_steps["consecutive"]).kinds == {"all-gather"}  # no gradient all-reduce
    assert footprint["consecutive"] > footprint["whole batch"] > footprint["strided"]
    # the CPU compiler sums the gradients across devices inside the loop: once per micro-batch
    gradient_bytes = sum(p.nbytes for p in jax.tree.leaves(params0)) + 4  # and the loss
    assert [(op.kind, op.in_loop, op.result_bytes) for op in acc_ops.ops] == [("all-reduce", True, gradient_bytes)]
    assert [(op.kind, op.in_loop, op.result_bytes) for op in collectives(compiled_steps["whole batch"]).ops] == [
        ("all-reduce", False, gradient_bytes)]  # the same sum, once per step
    assert not any(op.in_loop for op in weight_gathers)  # FSDP: each kernel gathered once, before the loop
    assert ACCUMULATOR.issubset(loop_state(fsdp_program))

# %% [markdown]
# ## 3. One strategy on an Explicit mesh
#
# `jax.make_mesh` without `axis_types` gives **Explicit** axes: each array's sharding is part of its
# type, JAX propagates it while tracing, and an operation whose result layout the types leave open is
# an error. Every strategy notebook so far asked for Auto axes. Here is the data x tensor parallel MLP
# of notebook 09 on the default mesh:

# %%
emesh = jax.make_mesh((4, 2), ("data", "model"))  # no axis_types: the default
print(emesh.axis_types)
assert emesh.axis_types == (AxisType.Explicit, AxisType.Explicit)

layout = {"linear1/kernel": P(None, "model"), "linear1/bias": P("model"),  # column-parallel
          "linear2/kernel": P("model", None), "linear2/bias": P()}  # row-parallel
x, y = x_big[:64], y_big[:64]  # a batch of 64, as in notebooks 07 to 10


def place(model, mesh):
    """Put each parameter where `layout` says, on `mesh`."""
    def sharding(path, _):
        return NamedSharding(mesh, layout["/".join(str(k.key) for k in path if hasattr(k, "key"))])

    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, jax.tree_util.tree_map_with_path(sharding, state)))
    return model


model = place(fresh_model(), emesh)
x_e, y_e = jax.device_put(x, NamedSharding(emesh, P("data", None))), jax.device_put(y, NamedSharding(emesh, P("data")))
types = {}


@nnx.jit(static_argnames="out_sharding")
def forward(model, x, out_sharding=None):
    h = jax.nn.relu(model.linear1(x))
    types.update(x=jax.typeof(x), kernel1=jax.typeof(model.linear1.kernel[...]), h=jax.typeof(h),
                 kernel2=jax.typeof(model.linear2.kernel[...]))
    logits = model.linear2(h, out_sharding=out_sharding)
    types["logits"] = jax.typeof(logits)
    return logits


raised = []
try:
    forward(model, x_e)
except Exception as err:  # jax._src.core.ShardingTypeError, not exported under jax.errors
    raised.append(type(err).__name__)
    print(f"{type(err).__name__}: {str(err).split('. ')[0]}.")
for name, t in types.items():
    print(f"{name:<8}{t}")
assert raised == ["ShardingTypeError"] and str(types["h"]) == "float32[64@data,256@model]"

# %% [markdown]
# The types follow the layers: `x` is `float32[64@data,64]` (`f32[64@data,64]` in the course's
# notation), the column-parallel layer gives `h: float32[64@data,256@model]` with no communication, and then the
# row-parallel layer stops the trace. `h @ kernel2` contracts the 256 hidden units, split over `model`
# on *both* operands: each device can compute only a partial sum, and the result could be all-reduced
# to `P('data', None)` or reduce-scattered to `P('data', 'model')`. Auto axes let the compiler choose
# between the two, but Explicit axes ask you. Say what the loss needs, whole rows of logits for each
# device's examples:

# %%
logits = forward(model, x_e, out_sharding=NamedSharding(emesh, P("data", None)))
print("logits:", types["logits"])
assert str(types["logits"]) == "float32[64@data,10]"
assert_close(logits, fresh_model()(x), atol=ATOL)

# %% [markdown]
# > **You will see this online:** the loss with integer labels,
# > `optax.softmax_cross_entropy_with_integer_labels(logits, labels)`.
#
# On Explicit axes with jax 0.12, its gradient raises a `ShardingTypeError` of its own: it picks each
# example's logit with an indexing whose transpose is a scatter, and the scatter's output sharding is
# ambiguous. (jax 0.10 accepts it.) The one-hot form is a multiply, and works on both:

# %%
logits_type = jax.ShapeDtypeStruct((64, 10), jnp.float32, sharding=NamedSharding(emesh, P("data", None)))
outcomes = {}
for name, loss in (("integer labels", lambda z: optax.softmax_cross_entropy_with_integer_labels(z, y_e).mean()),
                   ("one-hot labels", lambda z: cross_entropy(z, y_e))):
    try:
        outcomes[name] = jax.eval_shape(jax.grad(loss), logits_type).sharding.spec  # the gradient's layout
    except Exception as err:  # ShardingTypeError
        outcomes[name] = f"{type(err).__name__}: {str(err).split(' as ')[0]}"
    print(f"{name}: {outcomes[name]}")
assert outcomes["one-hot labels"] == P("data", None)
assert str(outcomes["integer labels"]).startswith("ShardingTypeError") == (jax.__version_info__ >= (0, 12))

# %% [markdown]
# Train five steps with Adam against one device. The optimizer is created under `jax.set_mesh`, so its
# step counter lives on the Explicit mesh too:

# %%
@nnx.jit(donate_argnums=(0, 1), static_argnames="out_sharding")
def train_step(model, optimizer, x, y, out_sharding=None):
    def loss_fn(model):
        return cross_entropy(model(x, out_sharding), y)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


reference = fresh_model()
ref_optimizer = nnx.Optimizer(reference, optax.adam(1e-2), wrt=nnx.Param)
with jax.set_mesh(emesh):
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
assert optimizer.step[...].sharding.mesh.axis_types == (AxisType.Explicit,) * 2  # the counter too
row_out = NamedSharding(emesh, P("data", None))
explicit_ops = collectives(train_step.lower(model, optimizer, x_e, y_e, out_sharding=row_out).compile())
ref_losses = [float(train_step(reference, ref_optimizer, x, y)) for _ in range(5)]
explicit_losses = [float(train_step(model, optimizer, x_e, y_e, out_sharding=row_out)) for _ in range(5)]
print("one device:", np.round(ref_losses, 4))
print("Explicit:  ", np.round(explicit_losses, 4))
print(explicit_ops)
assert_close(explicit_losses, ref_losses)
assert [(op.kind, op.shapes) for op in explicit_ops.ops if op.group_size == 2] == [("all-reduce", ((16, 10),))]
assert {op.kind for op in explicit_ops.ops if op.group_size == 4} == {"all-reduce"}  # the gradients, over data
kernel2, mu1 = model.linear2.kernel[...], optimizer.opt_state[0].mu["linear1"]["kernel"][...]  # Adam's first moment
print("after training: linear2/kernel", jax.typeof(kernel2), " Adam mu of linear1/kernel", jax.typeof(mu1))
assert (str(jax.typeof(kernel2)), str(jax.typeof(mu1))) == ("float32[256@model,10]", "float32[64,256@model]")

# %% [markdown]
# The same losses as one device, and the program of notebook 09's Auto mesh: an all-reduce of each
# device's `(16, 10)` partial logits over the 2 devices of `model`, and the gradients summed over the
# 4 devices of `data`. The parameters and Adam's moments keep their types through training. On an
# Explicit mesh the types show every layout as you write the model, and the one ambiguous layout
# became a line of code.

# %% [markdown]
# ## 4. What comes next: pipeline, expert and context parallelism
#
# Three more strategies, each with a mesh axis and a collective of its own:
#
# | strategy | what it splits | the axis it adds | its collective | trained and proven in |
# |---|---|---|---|---|
# | **pipeline** | the layers, into consecutive stages; micro-batches (section 2) flow through them | `stage` | collective-permute: each stage sends its activations to the next (and gradients back) | [18 · Pipeline parallelism](18_pipeline.ipynb) |
# | **expert** | the experts of a mixture-of-experts layer, whole experts per device | `expert` | all-to-all: every device sends each token to its expert's device, and the results back | [19 · Expert parallelism](19_experts.ipynb) |
# | **context** | the sequence, *inside* attention too | `context` (or `sequence`) | ring attention: collective-permutes pass key/value blocks around a ring; or an all-gather of keys and values (Llama 3), simpler, holding them whole | [20 · Context parallelism](20_context.ipynb) |
#
# Notebooks 15 and 17 come first, because they give you the tool those three use to compare plans: an
# estimate of the step's time read from the compiled program.
#
# Both collectives are cheap to show with `jax.shard_map` (notebook 06). First an expert-style
# dispatch: each of 8 devices holds 8 blocks of tokens, block *e* for expert *e* on device *e*. One
# `all_to_all` delivers them:

# %%
expert_mesh = jax.make_mesh((8,), ("expert",), axis_types=(AxisType.Auto,))
# routed[d, e]: the tokens that device d sends to expert e (8 tokens of width 4, stamped 10 * d + e)
routed = jnp.broadcast_to((10 * jnp.arange(8)[:, None] + jnp.arange(8))[:, :, None, None], (8, 8, 8, 4))


@partial(jax.shard_map, mesh=expert_mesh, in_specs=P("expert"), out_specs=P("expert"))
def dispatch(blocks):  # blocks: (1, 8, 8, 4), this device's tokens for each of the 8 experts
    return jax.lax.all_to_all(blocks, "expert", split_axis=1, concat_axis=1, tiled=True)


arrived = dispatch(routed)
print("expert 3 received tokens from devices:", np.asarray(arrived[3, :, 0, 0]))
np.testing.assert_array_equal(arrived, routed.swapaxes(0, 1))  # expert e now holds block e of every device
dispatch_ops = collectives(jax.jit(dispatch).lower(routed).compile())
assert [(op.kind, op.group_size) for op in dispatch_ops.ops] == [("all-to-all", 8)]

# %% [markdown]
# Expert 3 received 3, 13, 23, ...: the block meant for it from every device, in one all-to-all.
#
# Ring attention splits the sequence over a `context` axis. Each device keeps its queries and passes
# its block of keys and values to the next device, 7 times, so that every query block meets every key
# block. Here the "attention" is a running sum, enough to check that every block visits every device:

# %%
ring_mesh = jax.make_mesh((8,), ("context",), axis_types=(AxisType.Auto,))
ring = [(i, (i + 1) % 8) for i in range(8)]
kv_blocks = jnp.arange(8.0 * 16).reshape(8, 16)  # 8 key/value blocks, one per device


@partial(jax.shard_map, mesh=ring_mesh, in_specs=P("context"), out_specs=P("context"))
def ring_pass(kv):
    def step(_, carry):
        kv, seen = carry
        kv = jax.lax.ppermute(kv, "context", perm=ring)  # send my block on, receive my neighbour's
        return kv, seen + kv

    return jax.lax.fori_loop(0, 7, step, (kv, kv))[1]


seen = ring_pass(kv_blocks)
ring_ops = collectives(jax.jit(ring_pass).lower(kv_blocks).compile())
print(ring_ops)
np.testing.assert_allclose(seen, jnp.broadcast_to(kv_blocks.sum(0), (8, 16)))  # every device saw all 8 blocks
assert [(op.kind, op.in_loop) for op in ring_ops.ops] == [("collective-permute", True)]

stage_mesh = jax.make_mesh((8,), ("stage",), axis_types=(AxisType.Auto,))
pipeline = [(s, s + 1) for s in range(7)]  # stage s hands its activations to stage s + 1, and nothing wraps around
next_stage = jax.shard_map(lambda a: jax.lax.ppermute(a, "stage", perm=pipeline), mesh=stage_mesh,
                           in_specs=P("stage"), out_specs=P("stage"))
handed = next_stage(kv_blocks)
stage_ops = collectives(jax.jit(next_stage).lower(kv_blocks).compile())
np.testing.assert_allclose(handed[1:], kv_blocks[:-1])  # stage s + 1 got stage s's block ...
np.testing.assert_array_equal(handed[0], 0)  # ... and stage 0, which no stage sends to, got zeros
assert [op.kind for op in stage_ops.ops] == ["collective-permute"]
draw_permute(ring_mesh, "context", ring, title="one step of the ring: every device sends its key/value block on")

# %% [markdown]
# A pipeline hands activations from stage to stage with the same collective-permute, without the
# wrap-around. Notebooks 18 to 20 build each strategy in full, check it against one device and compile it
# for a TPU slice. To read further:
#
# | read | for |
# |---|---|
# | JAX's [distributed arrays and automatic parallelization](https://docs.jax.dev/en/latest/parallel.html) and [manual parallelism with `shard_map`](https://docs.jax.dev/en/latest/notebooks/shard_map.html) | the APIs this course uses |
# | [How to Scale Your Model](https://jax-ml.github.io/scaling-book/), its [training chapter](https://jax-ml.github.io/scaling-book/training/) | the cost of each strategy worked out, pipelining included |
# | [MaxText's sharding guide](https://github.com/AI-Hypercomputer/maxtext/blob/main/docs/explanations/sharding.md) | a production JAX trainer whose mesh combines `data`, `fsdp`, `tensor`, `stage`, `expert` and `context` axes |

# %% [markdown]
# ## Takeaways
# - Sequence parallelism (Megatron-style) pins the activations between tensor-parallel regions to
#   `P(None, 'model', None)`: 1/8 of the bytes here, and the all-reduce becomes an all-gather and a
#   reduce-scatter, no more traffic by the ring estimate.
# - Gradient accumulation is a `jax.lax.scan` over micro-batches inside the jitted step: the whole
#   batch's update, one micro-batch's activations at a time. Split it strided
#   (`reshape(-1, n, ...).swapaxes(0, 1)`), because consecutive rows gather the batch and undo data
#   parallelism. Under FSDP the TPU gathers the weights once per micro-batch. Keep the accumulator
#   sharded and float32.
# - On an Explicit mesh, `jax.make_mesh`'s default, `jax.typeof` shows every layout while tracing. The
#   row-parallel layer needs `out_sharding=P('data', None)`, and with it the model trains to one
#   device's losses.
# - Each further strategy adds an axis and a collective. Pipeline parallelism adds a `stage` axis and
#   collective-permutes, and expert parallelism an `expert` axis and all-to-alls. Context parallelism
#   adds a `context` axis and a ring of collective-permutes, or an all-gather of the keys and values.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** A transformer's residual stream is `bf16[8, 2048, 4096]` (batch, sequence, width)
# on a `model` axis of 8 devices. How many bytes of it does each device hold between the
# tensor-parallel regions under tensor parallelism, and under sequence parallelism?

# %%
from spmd_course.exercises import ex14_sequence_batch as ex

answer_1 = NOT_ANSWERED  # a pair (tensor parallel, sequence parallel), in bytes
ex.activation_bytes.check(answer_1);

# %% [markdown]
# **Exercise 2.** The strided split interleaves each device's rows. Write another split,
# `micro_batches(x, n)`, for a batch `x` whose rows are split over 8 devices, `P('data')`: it returns
# shape `(n, rows // n, ...)` for `jax.lax.scan`, every device gives every micro-batch the same number
# of rows, and each device's share is a *contiguous* run of its rows (micro-batch 0 gets each device's
# first rows, and so on). The checker calls it on numpy arrays.

# %%
def micro_batches(x, n):
    ...  # your split


answer_2 = NOT_ANSWERED  # set it to micro_batches once you have written it
ex.micro_batches.check(answer_2);

# %% [markdown]
# **Exercise 3.** On the Explicit `(4, 2)` mesh of section 3, which `PartitionSpec` do you give the
# row-parallel layer's `out_sharding=` so that the loss gets, on each device, whole rows of logits for
# that device's examples?

# %%
answer_3 = NOT_ANSWERED  # a PartitionSpec, e.g. P(...)
ex.row_parallel_out.check(answer_3);

# %% [markdown]
# **Next:** [15 · Step time: compute, memory and communication](15_step_time.ipynb)
