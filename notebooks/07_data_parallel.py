# %% [markdown]
# # 07 · Data parallelism
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/07_data_parallel.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/07_data_parallel.ipynb)
#
# Split a batch of 64 examples over 8 devices and each device computes its gradient from only 8 of them,
# which is not the model's gradient. Adding the 8 gradients up takes an all-reduce in every step, and it
# carries the size of the model, 76,840 bytes of gradients here, whatever the batch or the device count.
#
# **You need:** notebooks 01 to 03 (meshes, `PartitionSpec`, `NamedSharding`, `jax.device_put`), 04
# (collectives in a compiled program) and 05 (Auto and Explicit axes); `jax.jit`, `jax.grad`, `jax.vmap`,
# Flax `nnx.Module` and Optax.
#
# Data parallelism gives every device the whole model and its own slice of the batch.
#
# **You will learn**
# - how `P('data')` on the batch and `P()` on the parameters give data parallelism, and how to read
#   the global batch versus the per-device batch from shard shapes;
# - why the gradient needs an **all-reduce**, and that its size is the size of the parameters, whatever
#   the batch or the device count;
# - what `donate_argnums` does to the memory of a train step;
# - why a plain `jax.jit` train step over NNX objects trains nothing, and the `nnx.jit` form that trains
#   to the same losses as a single device.

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
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding, reshard
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (
    CHIPS,
    NOT_ANSWERED,
    assert_close,
    collectives,
    draw_mesh,
    draw_sharding,
    draw_shardings,
    estimate_step,
    format_bytes,
    memory_per_device,
    shard_table,
    type_string,
)

# %% [markdown]
# ## 1. The model, the data, and a single-device reference
#
# Notebooks 07 to 10 train the same model on the same data with four strategies, so that their
# numbers can be compared:
#
# - a batch `x` of 64 examples with 64 features, and labels `y` in `[0, 10)` given by a fixed random
#   "teacher" matrix;
# - an MLP `64 -> 256 -> 10` made of two `nnx.Linear` layers with a ReLU between them;
# - softmax cross-entropy, Adam with learning rate `1e-2`, and a train step compiled with `nnx.jit`.
#
# The four strategies differ in what they split, and so in what must move between devices at every
# step. A device that holds part of the batch computes a part of each gradient, so the parts are summed
# over the axis that splits the batch. A device that holds part of a kernel computes a part of the layer's
# output, so those parts are summed over the axis that splits the kernel. The last column names the
# collective that the compiled step runs for that reason, and the notebook whose asserts find it in the
# program. The picture places the batch `x` and the first kernel `w1` as each strategy does, on the same
# 8 devices, one row per strategy:
#
# | strategy | notebook | the batch `x` | the kernel `w1` | what moves per step (collective, axis) |
# |---|---|---|---|---|
# | data parallelism (DP) | this one | split 8 ways | whole on every device | all-reduce of every gradient over `data` (§4) |
# | tensor parallelism (TP) | 08 | whole on every device | split 8 ways | all-reduce of the `f32[64,10]` outputs over `model` (08 §2) |
# | 2-D parallelism | 09 | split 4 ways | split 2 ways | all-reduce of outputs over `model`, and of gradients over `data` (09 §4) |
# | fully sharded data parallelism (FSDP) | 10 | split 8 ways | split 8 ways, gathered whole before use | all-gather of each kernel over `fsdp`, then the gradients summed over `fsdp`, each device keeping its block (11 §2) |

# %%
strategies = {  # name (notebook): mesh shape and axes, spec of x, spec of w1
    "DP (07)": ((8,), ("data",), P("data"), P()),
    "TP (08)": ((8,), ("model",), P(), P(None, "model")),
    "2-D (09)": ((4, 2), ("data", "model"), P("data"), P(None, "model")),
    "FSDP (10)": ((8,), ("fsdp",), P("fsdp"), P("fsdp")),
}
layouts = {}  # "DP (07): x" -> (shape, sharding): layouts only, nothing allocated
for name, (shape, axes, x_spec, w1_spec) in strategies.items():
    strategy_mesh = jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(shape))
    layouts[f"{name}: x"] = ((64, 64), NamedSharding(strategy_mesh, x_spec))
    layouts[f"{name}: w1"] = ((64, 256), NamedSharding(strategy_mesh, w1_spec))

share = {}  # the fraction of the whole array each device holds
for name, (shape, sharding) in layouts.items():
    (per_device,) = set(shard_table(shape, sharding).bytes_per_device.values())  # the same on every device
    share[name] = per_device / (np.prod(shape) * 4)
assert share == {"DP (07): x": 1 / 8, "DP (07): w1": 1,  # the batch split, the kernel whole everywhere
                 "TP (08): x": 1, "TP (08): w1": 1 / 8,  # the batch whole, the kernel split
                 "2-D (09): x": 1 / 4, "2-D (09): w1": 1 / 2,  # 4 ways on data, 2 ways on model
                 "FSDP (10): x": 1 / 8, "FSDP (10): w1": 1 / 8}  # both split
draw_shardings(layouts, ncols=2, title="what each strategy splits: the batch x and the first kernel w1 on 8 devices")

# %% [markdown]
# The cell that defines them is tagged `save`: `tools/notebooks.py save` copies it into
# `src/spmd_course/models.py`, and notebooks 08 to 10 import it from there instead of typing it again.
#
# The step replaces every parameter and every Adam moment with a new array of the same shape.
# `donate_argnums=(0, 1)` tells the compiler it may write those new arrays into the buffers of the old
# ones (the `model` and `optimizer` arguments): the old arrays are deleted when the step runs, and
# `nnx.jit` puts the new ones back into your objects. Section 4 shows what that saves.
#
# The single-device run is the **reference**: every sharded run below must give the same losses.

# %% tags=["save"]
class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(64, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))


@jax.jit  # one compiled program, rather than one per operation (jax.random, @, argmax), each compiled on first use
def teacher_data(key):
    """64 examples of 64 features, labelled by a fixed random "teacher" matrix."""
    key_x, key_teacher = jax.random.split(key)
    x = jax.random.normal(key_x, (64, 64))
    w_teacher = jax.random.normal(key_teacher, (64, 10))
    return x, jnp.argmax(x @ w_teacher, axis=-1).astype(jnp.int32)


x, y = teacher_data(jax.random.key(0))


def step(model, optimizer, x, y):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


train_step = nnx.jit(step, donate_argnums=(0, 1))  # model and optimizer are updated in place

# %%
ref_model = MLP(nnx.Rngs(0))
ref_optimizer = nnx.Optimizer(ref_model, optax.adam(1e-2), wrt=nnx.Param)
init_params = [np.asarray(p) for p in jax.tree.leaves(nnx.state(ref_model, nnx.Param))]  # copies, before training
param_bytes = sum(p.nbytes for p in init_params)

ref_losses = [float(train_step(ref_model, ref_optimizer, x, y)) for _ in range(5)]
print("parameters:", sum(p.size for p in init_params), "floats =", param_bytes, "bytes =", format_bytes(param_bytes))
print("reference losses:", np.round(ref_losses, 4))
assert ref_losses[-1] < ref_losses[0] / 4  # it learns
assert param_bytes == 76_840  # 19,210 float32 parameters

# %% [markdown]
# ## 2. The layout: batch split on `data`, parameters replicated
#
# On a 1-D mesh of the 8 devices, `P('data')` splits the batch dimension of `x` 8 ways, and `P()` gives
# every device a full copy of a parameter. The **global batch** is 64 examples, so the **per-device
# batch** is 64 / 8 = 8. In the course's types, the forward pass and the first kernel's gradient read
# as follows, where `{U:data}` marks a sum still pending over `data` (section 3 shows why):
#
# ```
# x: f32[64@data,64] · w1: f32[64,256] → h: f32[64@data,256] · w2: f32[256,10] → f32[64@data,10]
# dw1 = xᵀ·dh: f32[64,256]{U:data} → all-reduce(data) → f32[64,256]
# ```

# %%
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
batch_sharding = NamedSharding(mesh, P("data"))
replicated = NamedSharding(mesh, P())

x_dp = jax.device_put(x, batch_sharding)
y_dp = jax.device_put(y, batch_sharding)

print("x:", type_string(x_dp), " global", x_dp.shape, " per device", x_dp.sharding.shard_shape(x_dp.shape))
print("y:", type_string(y_dp), "     global", y_dp.shape, "    per device", y_dp.sharding.shard_shape(y_dp.shape))
assert type_string(x_dp) == "f32[64@data,64]" and type_string(y_dp) == "i32[64@data]"
assert shard_table(x_dp).shard_shapes == {(8, 64)} and shard_table(y_dp).shard_shapes == {(8,)}
draw_mesh(mesh)

# %% [markdown]
# Each device holds 8 rows of the batch (device 3 holds rows 24 to 31). Here one process puts the
# whole batch in place with `jax.device_put`. On several hosts each process loads only the rows of its
# own devices and assembles the global array with `jax.make_array_from_process_local_data` (notebook 23).

# %%
fig = draw_sharding(x_dp)
assert shard_table(x_dp).rows[3].index == "[24:32, 0:64]"
fig

# %% [markdown]
# Now the model. You build it from the same `nnx.Rngs(0)` as the reference, so its initial parameters
# are the same numbers, and place its parameters and the optimizer's Adam state on the mesh,
# replicated. `nnx.state(...)` is a pytree of arrays, so one `jax.device_put` with the single sharding
# `replicated` places every leaf, and `nnx.update` puts the placed arrays back into the objects.
# The picture draws the four parameters on one scale, so their sizes compare: `linear1/kernel`
# `(64, 256)` is wide, `linear2/kernel` `(256, 10)` a thin column, and each bias a strip.

# %%
model = MLP(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
nnx.update(model, jax.device_put(nnx.state(model), replicated))
nnx.update(optimizer, jax.device_put(nnx.state(optimizer), replicated))

kernel1 = model.linear1.kernel[...]
h_dp = jax.jit(lambda model, x: model.linear1(x))(model, x_dp)
logits_dp = jax.jit(lambda model, x: model(x))(model, x_dp)
chain = (f"x: {type_string(x_dp)} · w1: {type_string(kernel1)} → h: {type_string(h_dp)} · "
         f"w2: {type_string(model.linear2.kernel[...])} → {type_string(logits_dp)}")
print(chain)
assert chain == "x: f32[64@data,64] · w1: f32[64,256] → h: f32[64@data,256] · w2: f32[256,10] → f32[64@data,10]"
assert shard_table(kernel1).shard_shapes == {(64, 256)}  # the whole kernel on every device
assert shard_table(kernel1).total_bytes == 8 * kernel1.nbytes  # 8 copies
for placed, initial in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), init_params, strict=True):
    np.testing.assert_array_equal(np.asarray(placed), initial)  # same starting point as the reference
draw_shardings(nnx.state(model), ncols=4, same_scale=True)

# %% [markdown]
# ## 3. Why the gradient needs an all-reduce
#
# The loss is the mean over the **global** batch: $L = \frac{1}{64}\sum_{i=1}^{64} \ell_i$. Split the
# sum by device, $L = \sum_{d=0}^{7} \frac{1}{64}\sum_{i \in \text{slice } d} \ell_i$, and take the
# gradient: it is linear, so the full gradient is the **sum over devices** of a gradient each device
# can compute from its own 8 examples. So no device can finish alone. Summing one array per device and
# giving every device the result is what an **all-reduce** does.
#
# Check the algebra without any sharding: compute the 8 per-slice gradients with `jax.vmap`, add them
# up, and compare with the gradient of the full-batch mean.

# %%
graphdef, params = nnx.split(MLP(nnx.Rngs(0)))


def slice_loss(params, xb, yb):
    """One device's share of the global mean: its examples' losses summed, divided by the GLOBAL batch."""
    logits = nnx.merge(graphdef, params)(xb)
    return optax.softmax_cross_entropy_with_integer_labels(logits, yb).sum() / x.shape[0]


def global_loss(params):
    return optax.softmax_cross_entropy_with_integer_labels(nnx.merge(graphdef, params)(x), y).mean()


per_slice_grad = jax.jit(jax.vmap(jax.grad(slice_loss), in_axes=(None, 0, 0)))  # 8 slices of 8 examples
per_device_grads = per_slice_grad(params, x.reshape(8, 8, 64), y.reshape(8, 8))
summed = jax.tree.map(lambda g: g.sum(axis=0), per_device_grads)
full = jax.jit(jax.grad(global_loss))(params)

k_full, k_summed, k_one = (t["linear1"]["kernel"][...] for t in (full, summed, per_device_grads))
print("max |sum of 8 slice gradients - full gradient|:", f"{float(jnp.max(jnp.abs(k_summed - k_full))):.1e}")
print("max |device 0's gradient alone - full gradient|:", f"{float(jnp.max(jnp.abs(k_one[0] - k_full))):.3f}")
jax.tree.map(assert_close, summed, full)
assert not np.allclose(k_one[0], k_full, atol=1e-3)  # one device's gradient alone is not the answer

# %% [markdown]
# The same sum in the course's types. The first kernel's gradient is `xᵀ·dh`, where `dh` is the gradient
# at the first layer's output. With `x` and `dh` split on `data`, each device multiplies its own 8 rows:
# on an Explicit mesh, `out_sharding=P(None, None, unreduced={'data'})` keeps the 8 products apart as a
# pending sum, and `reshard` to `P()` adds them, the all-reduce that section 4 finds in the compiled step:

# %% tags=["save"]
@nnx.jit  # compiled whole, rather than one small program per operation of the gradient
def first_layer_gradient(model, x, y):
    """dh: the gradient of the course's loss at the MLP's first layer output (before the ReLU), on one device.
    Notebooks 09 and 10 read their pending-sum types from it too."""

    def loss_after_w1(h):  # the rest of the network: ReLU, linear2 and the loss
        return optax.softmax_cross_entropy_with_integer_labels(model.linear2(jax.nn.relu(h)), y).mean()

    return jax.grad(loss_after_w1)(model.linear1(x))

# %%
dh = first_layer_gradient(nnx.merge(graphdef, params), x, y)  # the gradient at the first layer's output

explicit = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
with jax.set_mesh(explicit):
    x_rows, dh_rows = (jax.device_put(a, NamedSharding(explicit, P("data"))) for a in (x, dh))
    dw1_pending = jnp.einsum("bi,bh->ih", x_rows, dh_rows, out_sharding=P(None, None, unreduced={"data"}))
    dw1 = reshard(dw1_pending, P())
pending_type = jax.typeof(dw1_pending).str_short(short_dtypes=True)  # JAX's own type, {U:data} included
chain = f"dw1 = xᵀ·dh: {pending_type} → all-reduce(data) → {type_string(dw1)}"
print(chain)
assert chain == "dw1 = xᵀ·dh: f32[64,256]{U:data} → all-reduce(data) → f32[64,256]"
assert_close(dw1, k_full)  # the summed products are the full-batch gradient

# %% [markdown]
# ## 4. The compiled train step: one all-reduce, the size of the parameters
#
# Compile the train step for the placed model and batch and look. An `nnx.jit` function can be lowered
# like a `jax.jit` one: `train_step.lower(model, optimizer, x_dp, y_dp).compile()` is the per-device
# program, with the collectives the compiler inserted. `collectives` lists them with their result size
# and group size. Its last column is an **estimate** of the bytes each device sends, from the textbook
# ring algorithm applied to those two numbers, not a measurement.

# %%
compiled = train_step.lower(model, optimizer, x_dp, y_dp).compile()
comm = collectives(compiled)
print(comm)

assert comm.kinds == {"all-reduce"} and all(op.group_size == 8 for op in comm.ops)
assert comm.result_bytes == param_bytes + 4  # every gradient, plus the 4-byte loss

# %% [markdown]
# On the CPU backend the all-reduce runs over all 8 devices and carries `(f32[256], f32[256,64],
# f32[10], f32[10,256], f32[])`: the four gradients and the loss, merged into one op as a tuple. The
# kernel gradients show up transposed (`f32[256,64]` for the `(64, 256)` kernel) because XLA picked the
# layout of the backward matmul that produces them, and the bytes are the same. Other compilers combine
# differently (a GPU's packs the sums into one flat buffer, with no pieces to list), so the listing
# below is the CPU program's. The HLO's own metadata says what each piece is for:

# %%
all_reduce = max(comm.ops, key=lambda op: op.result_bytes)
pieces = [line for line in compiled.as_text().splitlines()
          if f"get-tuple-element(%{all_reduce.name})" in line or f"get-tuple-element({all_reduce.name})" in line]
for line in pieces:
    shape = line.split("=", 1)[1].split("get-tuple-element")[0].strip().split("{")[0]
    op_name = line.split('op_name="', 1)[1].split('"', 1)[0]
    print(f"{shape:<14}{op_name}")

# %% [markdown]
# `transpose(jvp())` is JAX's name for the backward pass: the all-reduce takes what the backward
# matmuls (`dot_general`, the kernel gradients) and sums (`reduce_sum`, the bias gradients) produced from
# each device's 8 examples and hands every device the total, on which each runs the same Adam update.
# The fifth piece, `jvp()/reduce_sum`, is the forward loss: the mean over the global batch needs the
# same sum across devices.
#
# ### The cost line: what the chain costs in seconds (an estimate)
#
# The typed chain says what moves. A cost line under it says how long that takes, so that you can tell
# whether the all-reduce matters. Take a TPU v5e chip's published rates (notebook 15 explains them):
# `C` = 197 TFLOP/s of matmul, and `W` = 50 GB/s, what one chip sends along an axis of 8 chips (on a
# v5e such an axis is a line, because its wraparound link needs 16 chips). With `N` parameters of 4
# bytes, `t` examples per device and `n` devices on `data`, per device and per step:
#
# | part | formula | why |
# |---|---|---|
# | compute | `(4t·W1 + 6t·W2) / C`, about `6Nt / C` | the forward pass multiplies by both kernels (`2t` FLOPs per weight), the backward pass makes both kernels' gradients (`2t` each) and `h`'s gradient (`2t·W2`); no gradient flows into the data `x` |
# | communication | `2(n-1)/n · 4(N+1) / W` | a ring all-reduce over `data` of every gradient and the loss |
#
# The all-reduce does not grow with `t`, and the matmuls do. So the transfer can hide behind the
# compute only when `6Nt / C > 2(n-1)/n · 4N / W`, that is when `t > (4/3)(n-1)/n · C/W`: about 4,600
# examples (tokens, in a language model) per device for float32 gradients, half that for bfloat16.
# The cell computes both lines from the formulas and checks the bytes against the compiled program's
# collectives; the hidden cell at the end of this section checks the FLOPs and the seconds against
# `estimate_step`, which times that program op by op (notebook 15).

# %%
V5E = CHIPS["v5e"]
C, W = V5E.peak_flops, V5E.axis_bandwidth(8, 8)  # 197e12 FLOP/s; 50e9 B/s along a line of 8 chips
N, t, n = param_bytes // 4, x_dp.sharding.shard_shape(x_dp.shape)[0], mesh.shape["data"]
W1, W2 = 64 * 256, 256 * 10  # the two kernels' sizes
dp_flops = 2 * t * (W1 + W2) + 2 * t * (W1 + W2) + 2 * t * W2  # forward, kernels' gradients, h's gradient
dp_sent = 2 * (n - 1) / n * 4 * (N + 1)  # ring all-reduce of every gradient and the loss
print(f"cost line (estimate, v5e rates): compute {dp_flops:,} FLOPs / C = {dp_flops / C * 1e9:.1f} ns; "
      f"all-reduce(data) {dp_sent:,.0f} B / W = {dp_sent / W * 1e6:.2f} µs")
print(f"the all-reduce hides above t = (4/3)(n-1)/n · C/W = {4 / 3 * (n - 1) / n * C / W:,.0f} examples per device; "
      f"here t = {t}")
assert np.isclose(comm.estimated_bytes, dp_sent)  # the compiled program sends what the formula says
assert dp_sent / W > 100 * dp_flops / C  # this step is all communication ...
assert round(4 / 3 * (n - 1) / n * C / W / t) == 575  # ... because t is 575 times below the rule

# %% [markdown]
# This MLP's step is all communication, because its 8 examples per device are about 575 times too few
# to hide the sum. A real model on a v5e does the same arithmetic with its own `N` and `t`: `N` drops
# out of the rule, so the tokens per device decide. Notebook 15 refines it pass by pass.
#
# ### What donation saves
#
# Per device, the step's arguments are the whole model, the whole Adam state (two moments per parameter
# and two 4-byte step counters) and one slice of the batch. Compile the same step without donation and
# compare what `memory_analysis()` reports. "Allocated" is arguments + outputs + temporaries − aliased:
# with donation the new model and Adam state are written into the argument buffers, so the outputs
# that alias them are not counted twice.

# %%
plain = memory_per_device(nnx.jit(step).lower(model, optimizer, x_dp, y_dp).compile())
donated = memory_per_device(compiled)
state_bytes = 3 * param_bytes + 2 * 4  # parameters, Adam's mu and nu, two step counters
print(f"{'':<16}{'arguments':>11}{'outputs':>11}{'temporaries':>13}{'aliased':>11}{'allocated':>11}")
for name, m in (("no donation", plain), ("donate_argnums", donated)):
    print(f"{name:<16}{format_bytes(m.argument):>11}{format_bytes(m.output):>11}{format_bytes(m.temp):>13}"
          f"{format_bytes(m.alias):>11}{format_bytes(m.total):>11}")
assert plain.alias == 0 and donated.alias > 0

# %% [markdown]
# On the CPU compiler donation aliases the whole 225.1 KiB of model and Adam state, because the outputs
# land in the arguments' buffers (the hidden cell below holds the CPU compiler's figures, and a TPU
# v5e-8's). The compiler spends some of the saving on larger temporaries, so the step's total allocation
# (last column) falls by less than the state it no longer copies. The TPU compiler does the same: at the
# default effort, the one `jax.jit` uses, donation takes a v5e-8's HBM per chip from 877.5 to 760.0 KiB,
# while its temporaries grow from 756 to 1,008 KiB. Its state is 245.5 KiB rather than 225.1 KiB because a
# TPU stores small arrays padded to its tiles. Without donation a device holds the old and the new model
# and optimizer state side by side, which for a large model is a second copy of everything it stores.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU and TPU compilers' exact figures, §4: the all-reduce, the cost line and the step's bytes
dp_time = estimate_step(compiled, mesh, chip="v5e")  # this program, timed op by op at a v5e chip's rates
dp_data_seconds = sum(op.seconds * op.trips for op in dp_time.timeline if op.lane == "data")
print(f"estimate_step reads {dp_time.flops:,.0f} matmul FLOPs (formula: {dp_flops:,}) and "
      f"{dp_data_seconds * 1e6:.2f} µs over data (formula: {dp_sent / W * 1e6:.2f} µs) from this compiler's program.")
print(f"This compiler merges the step's sums into {comm.count()} all-reduce(s). Donation aliases "
      f"{format_bytes(donated.alias)} of the {format_bytes(state_bytes)} state and saves "
      f"{format_bytes(plain.total - donated.total)} of allocation.")
if CPU:
    assert comm.count() == 1  # the CPU compiler merges the five sums into one all-reduce
    assert sorted(comm.ops[0].shapes) == [(), (10,), (10, 256), (256,), (256, 64)]  # four gradients and the loss
    assert sum("transpose(jvp())" in line for line in pieces) == 4  # four pieces come from the backward pass
    # exact byte counts of the CPU compiler (accelerators pad small arrays)
    assert donated.argument == state_bytes + 8 * 64 * 4 + 8 * 4  # + this device's 8 rows of x and 8 labels
    assert donated.alias == state_bytes  # the whole model and Adam state are updated in place
    assert 0 < plain.total - donated.total < state_bytes  # a saving, smaller than the state: larger temporaries
    # the cost line, op by op: a GPU's matmuls are library calls that carry no FLOP count, so CPU only
    assert dp_time.flops == dp_flops  # every matmul of the compiled step, counted from its shapes
    assert np.isclose(dp_data_seconds, dp_sent / W)  # the all-reduce at the v5e's rate for an 8-chip line
# A TPU v5e-8 at the default effort, compiled ahead of time by tests/test_07_12_tpu_tables.py, which asserts
# this table (jax 0.12.0.1, libtpu 0.0.50.1): KiB per chip (arguments, outputs, temporaries, aliased, HBM)
TPU_DONATION = {"no donation": (250.0, 246.5, 756.0, 0.0, 877.5),
                "donate_argnums": (250.0, 246.5, 1008.0, 245.5, 760.0)}
print(f"A TPU v5e-8's figures, KiB per chip at the default effort:\n{'':<16}{'arguments':>11}{'outputs':>11}"
      f"{'temporaries':>13}{'aliased':>11}{'HBM':>11}")
for name, figures in TPU_DONATION.items():
    print(f"{name:<16}" + "".join(f"{v:>{w}.1f}" for v, w in zip(figures, (11, 11, 13, 11, 11), strict=True)))
tpu_plain, tpu_donated = TPU_DONATION.values()
assert tpu_donated[3] > 0 and tpu_donated[2] > tpu_plain[2]  # the state aliased, larger temporaries
assert 0 < tpu_plain[4] - tpu_donated[4] < tpu_donated[3]  # so HBM falls, by less than the state

# %% [markdown]
# ## 5. Train steps you will see online
#
# > **You will see this online:**
# > ```python
# > optimizer = nnx.Optimizer(model, optax.adam(1e-2))
# > ...
# > optimizer.update(grads)
# > ```
#
# This is the Flax API before version 0.11. Today both lines raise:

# %%
online_model = MLP(nnx.Rngs(0))
raised = []
try:
    nnx.Optimizer(online_model, optax.adam(1e-2))
except TypeError as err:
    raised.append("wrt")
    print("TypeError:", err)
try:
    nnx.Optimizer(online_model, optax.adam(1e-2), wrt=nnx.Param).update(nnx.state(online_model, nnx.Param))
except TypeError as err:
    raised.append("grads")
    print("TypeError:", err)
assert raised == ["wrt", "grads"]

# %% [markdown]
# The fix is in section 1: `nnx.Optimizer(model, tx, wrt=nnx.Param)` says which variables it trains, and
# `optimizer.update(model, grads)` takes the model it updates.
#
# > **You will see this online:** the same step compiled with plain `jax.jit` and shardings:
# > ```python
# > @partial(jax.jit, in_shardings=(replicated, replicated, batch_sharding, batch_sharding))
# > def train_step(model, optimizer, x, y):
# >     loss, grads = nnx.value_and_grad(loss_fn)(model)
# >     optimizer.update(model, grads)
# >     return loss
# > ```
#
# It runs without an error or a warning. Run it three times:

# %%
online_step = partial(jax.jit, in_shardings=(replicated, replicated, batch_sharding, batch_sharding))(step)
online_optimizer = nnx.Optimizer(online_model, optax.adam(1e-2), wrt=nnx.Param)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    online_losses = [float(online_step(online_model, online_optimizer, x_dp, y_dp)) for _ in range(3)]
print("losses:", np.round(online_losses, 5), " optimizer steps:", int(online_optimizer.step[...]),
      " warnings:", len(caught))
assert caught == []  # not a single warning
assert online_losses[0] == online_losses[1] == online_losses[2]  # the loss never moves
assert int(online_optimizer.step[...]) == 0
for now, initial in zip(jax.tree.leaves(nnx.state(online_model, nnx.Param)), init_params, strict=True):
    np.testing.assert_array_equal(np.asarray(now), initial)  # the parameters never changed

# %% [markdown]
# Nothing learned. NNX modules and optimizers are pytrees, so `jax.jit` accepts them: it flattens them
# to arrays and the traced function works on **new Python objects** rebuilt from those arrays.
# `optimizer.update` changes those copies, and `jax.jit` returns only what the function returns: the
# loss. Your objects keep their old arrays, and every call starts from the same parameters.
#
# The fix is **`nnx.jit`**: it tracks the NNX objects you pass in and writes every change made inside
# back into them. (With plain `jax.jit` you would have to return the model and optimizer and rebind
# them.) The shardings come from the arguments, so `in_shardings` is not needed.

# %% [markdown]
# ## 6. The working step: the same losses as one device
#
# Five steps of `train_step` on the placed `model`, `optimizer`, `x_dp` and `y_dp`, compared with the
# reference: the losses, and the trained parameters gathered to the host:

# %%
dp_losses = [float(train_step(model, optimizer, x_dp, y_dp)) for _ in range(5)]
print("data parallel:", np.round(dp_losses, 4))
print("reference:    ", np.round(ref_losses, 4))
assert_close(dp_losses, ref_losses)
for trained, ref in zip(jax.tree.leaves(nnx.state(model, nnx.Param)),
                        jax.tree.leaves(nnx.state(ref_model, nnx.Param)), strict=True):
    assert_close(trained, ref)  # gathered to the host
assert kernel1.is_deleted()  # donated: the step wrote the new kernel into this buffer
assert model.linear1.kernel[...].sharding.is_equivalent_to(replicated, 2)  # still replicated after training

# %% [markdown]
# The all-reduce makes every device apply the same global-batch gradient, so the 8 replicas stay
# identical:

# %%
shards = [np.asarray(s.data) for s in model.linear2.kernel[...].addressable_shards]
assert len(shards) == 8 and all(np.array_equal(s, shards[0]) for s in shards)
print("the 8 copies of linear2/kernel are bit-identical after 5 steps")

# %% [markdown]
# ## 7. Scaling the batch with the device count
#
# Data parallelism scales by keeping the **per-device** batch fixed and adding devices: the **global**
# batch grows with the device count. Build meshes of 2, 4 and 8 devices, give each device 8 examples,
# and compile the same train step on each (on 8 devices it is section 4's program, already compiled).
#
# **Pop quiz.** Before you run it: from 2 to 8 devices the global batch grows 4 times. What happens to
# the bytes the all-reduce carries, and to the ring estimate of what each device sends?
#
# <details><summary>Answer</summary>
#
# The all-reduce carries the same 76,844 bytes on every mesh, because it sums the gradients, which are
# the size of the model, not of the batch. The ring estimate, `2(n-1)/n` times those bytes, grows only
# from 1 to 1.75 times them. The cell asserts the first, and the table after it shows the second.
#
# </details>

# %%
rows, batches = [], {}
x_host, y_host = np.asarray(x), np.asarray(y)  # sliced on the host: nothing to compile
for n in (2, 4, 8):
    sub_mesh = jax.make_mesh((n,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])
    xb = jax.device_put(x_host[: 8 * n], NamedSharding(sub_mesh, P("data")))
    yb = jax.device_put(y_host[: 8 * n], NamedSharding(sub_mesh, P("data")))
    m = MLP(nnx.Rngs(0))
    o = nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)
    nnx.update(m, jax.device_put(nnx.state(m), NamedSharding(sub_mesh, P())))
    nnx.update(o, jax.device_put(nnx.state(o), NamedSharding(sub_mesh, P())))
    # 8 devices: section 4's mesh, shardings and step, so its program; 2 and 4: compiled here
    compiled_n = compiled if n == 8 else train_step.lower(m, o, xb, yb).compile()
    rows.append((n, xb.shape[0], xb.sharding.shard_shape(xb.shape)[0], collectives(compiled_n),
                 memory_per_device(compiled_n)))
    batches[f"{n} devices"] = xb

print(f"{'devices':>7}{'global batch':>14}{'per device':>12}{'all-reduced bytes':>19}{'ring estimate':>15}"
      f"{'arguments':>11}")
for n, global_batch, local_batch, c, mem in rows:
    print(f"{n:>7}{global_batch:>14}{local_batch:>12}{c.result_bytes:>19,}{format_bytes(c.estimated_bytes):>15}"
          f"{format_bytes(mem.argument):>11}")

for n, global_batch, local_batch, c, _ in rows:
    assert global_batch == 8 * n and local_batch == 8  # the global batch grows, the per-device batch does not
    assert c.kinds == {"all-reduce"} and c.result_bytes == param_bytes + 4  # the size of the model every time
assert len({mem.argument for *_, mem in rows}) == 1  # what a device stores does not depend on n

# %% [markdown]
# The global batch went 16, 32, 64, but the all-reduce carried the same 76,844 bytes each time, and each
# device stored the same model, Adam state and 8 examples. The ring estimate creeps up with the
# device count, as `2(N-1)/N` of the reduced bytes, towards twice the model size. The cost follows the
# model, not the batch, so data parallelism suits small models and large batches. In the picture each
# panel is drawn at the same scale, because every device holds a `(8, 64)` block on every mesh:

# %%
draw_shardings(batches, ncols=3, show_bytes=False)

# %% [markdown]
# ## Takeaways
# - Data parallelism is two specs: `P('data')` on the batch, `P()` on parameters and optimizer state. The
#   global batch is split (`f32[64@data,64]`, `(8, 64)` per device), and the model is copied whole.
# - The loss is a mean over the global batch, so its gradient is a sum over devices: the compiler inserts
#   an **all-reduce** between the backward pass and the optimizer update, carrying every gradient
#   (76,840 bytes here) plus the loss, whatever the batch or the device count.
# - `nnx.jit(step, donate_argnums=(0, 1))` lets the step write the new model and Adam state into the
#   old buffers, which `memory_analysis()` reports as aliased.
# - Plain `jax.jit` over NNX objects with an in-place `update` trains nothing: use `nnx.jit`. Today's
#   optimizer is `nnx.Optimizer(model, tx, wrt=nnx.Param)` with `update(model, grads)`.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** Write the two specs of data parallelism on the 1-D mesh with axis `data`: one for the
# batch `x` of shape `(64, 64)` (examples first), one for a parameter such as the `(64, 256)` kernel.

# %%
from spmd_course.exercises import ex07_data_parallel as ex

answer_1 = NOT_ANSWERED  # a pair (batch spec, parameter spec), e.g. (P(...), P(...))
ex.dp_specs.check(answer_1);

# %% [markdown]
# **Exercise 2.** You widen the hidden layer: the MLP becomes `64 -> 512 -> 10` (two `nnx.Linear`
# layers with biases, float32). Trained data-parallel on the same 8-device mesh, how many bytes of
# **gradient** does the all-reduce of each step carry (leave out the 4-byte loss)?

# %%
answer_2 = NOT_ANSWERED  # a whole number of bytes
ex.wider_allreduce_bytes.check(answer_2);

# %% [markdown]
# **Exercise 3.** Same model as this notebook (`64 -> 256 -> 10`), same per-device batch of 8, but on
# 16 devices. Predict the global batch, and the bytes of the step's all-reduce (gradients and loss, as
# `collectives(...).result_bytes` reports them).

# %%
answer_3 = NOT_ANSWERED  # a pair (global batch, all-reduce bytes)
ex.sixteen_devices.check(answer_3);

# %% [markdown]
# **Next:** [08 · Tensor parallelism](08_tensor_parallel.ipynb)
