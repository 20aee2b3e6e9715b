# %% [markdown]
# # 06 · Data parallelism
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/06_data_parallel.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/06_data_parallel.ipynb)
#
# Data parallelism is the first strategy almost everyone uses: every device holds the whole model and
# trains on its own slice of the batch. In this notebook you place a small Flax NNX model that way on
# 8 devices, find the one collective the compiler adds to the train step, measure its size, and train
# to the same losses as a single device. You also run the training loop of the guide this course
# started from, as written, and see why today it fails first loudly and then silently.
#
# **You will learn**
# - how `P('data')` on the batch and `P()` on the parameters give data parallelism, and how to read
#   the global batch versus the per-device batch from shard shapes;
# - why the gradient needs an **all-reduce**, where it sits in the compiled train step, and that its
#   size is the size of the parameters, whatever the batch or the device count;
# - how the global batch grows with the device count while the per-step communication stays the same;
# - why the seed's `jax.jit` train step over NNX objects trains nothing, and the `nnx.jit` form that works.

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

launch.prepare_runtime()  # Colab: installs what is missing. Binder: shows the memory in use. Elsewhere: nothing.
SETUP = setup_devices(8)

# %%
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import (
    NOT_ANSWERED,
    collectives,
    draw_mesh,
    draw_sharding,
    draw_shardings,
    format_bytes,
    memory_per_device,
    shard_table,
    tile_labels,
    type_string,
)

assert jax.device_count() == 8


# %% [markdown]
# ## 1. The model, the data, and a single-device reference
#
# Notebooks 06 to 09 train the same model on the same data with four strategies, so that their
# numbers can be compared:
#
# - a batch `x` of 64 examples with 64 features, and labels `y` in `[0, 10)` given by a fixed random
#   "teacher" matrix;
# - an MLP `64 -> 256 -> 10` made of two `nnx.Linear` layers with a ReLU between them;
# - softmax cross-entropy, Adam with learning rate `1e-2`, and a train step compiled with `nnx.jit`.
#
# First you run it on one device. That run is the **reference**: every sharded run below must give
# the same losses.

# %%
class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(64, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))


key_x, key_teacher = jax.random.split(jax.random.key(0))
x = jax.random.normal(key_x, (64, 64))
w_teacher = jax.random.normal(key_teacher, (64, 10))
y = jnp.argmax(x @ w_teacher, axis=-1).astype(jnp.int32)


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


ref_model = MLP(nnx.Rngs(0))
ref_optimizer = nnx.Optimizer(ref_model, optax.adam(1e-2), wrt=nnx.Param)
init_params = [np.asarray(p) for p in jax.tree.leaves(nnx.state(ref_model, nnx.Param))]  # before training
param_bytes = sum(p.nbytes for p in init_params)

ref_losses = [float(train_step(ref_model, ref_optimizer, x, y)) for _ in range(5)]
print("parameters:", sum(p.size for p in init_params), "floats =", param_bytes, "bytes =", format_bytes(param_bytes))
print("reference losses:", np.round(ref_losses, 4))
assert param_bytes == (64 * 256 + 256 + 256 * 10 + 10) * 4 == 76_840
assert ref_losses[-1] < ref_losses[0] / 4  # it learns

# %% [markdown]
# ## 2. The layout: batch split on `data`, parameters replicated
#
# The seed guide's "Strategy 1":
#
# > `data_sharding = NamedSharding(mesh, P('data'))` ... `param_sharding = NamedSharding(mesh, P())`
#
# On a 1-D mesh of the 8 devices, `P('data')` splits the batch dimension of `x` 8 ways; `P()` gives
# every device a full copy of a parameter. The **global batch** is 64 examples; the **per-device
# batch** is 64 / 8 = 8.

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
assert shard_table(x_dp).total_bytes == x.nbytes  # each example lives on exactly one device
draw_mesh(mesh)

# %% [markdown]
# Each device holds 8 rows of the batch (device 3 holds rows 24 to 31):

# %%
fig = draw_sharding(x_dp)
assert len(tile_labels(fig)) == 8 and "dev 3\n(8, 64)\n2.0 KiB" in tile_labels(fig)
assert shard_table(x_dp).rows[3].device == 3 and shard_table(x_dp).rows[3].index == "[24:32, 0:64]"
fig

# %% [markdown]
# Now the model. You build it from the same `nnx.Rngs(0)` as the reference, so its initial parameters
# are the same numbers; then you place its parameters, and the optimizer's Adam state, on the mesh,
# replicated. `nnx.state(...)` is a pytree of arrays, so one `jax.device_put` with the single sharding
# `replicated` places every leaf, and `nnx.update` puts the placed arrays back into the objects.

# %%
model = MLP(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
nnx.update(model, jax.device_put(nnx.state(model), replicated))
nnx.update(optimizer, jax.device_put(nnx.state(optimizer), replicated))

kernel1 = model.linear1.kernel[...]
print(type_string(kernel1), kernel1.sharding.spec)
print(shard_table(kernel1))
assert shard_table(kernel1).shard_shapes == {(64, 256)}  # the whole kernel on every device
assert shard_table(kernel1).total_bytes == 8 * kernel1.nbytes  # 8 copies
for placed, initial in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), init_params, strict=True):
    np.testing.assert_array_equal(np.asarray(placed), initial)  # same starting point as the reference

# %%
fig = draw_shardings(nnx.state(model), ncols=4)
labels = tile_labels(fig)
assert labels == ["dev 0-7\n(256)\n1.0 KiB", "dev 0-7\n(64, 256)\n64.0 KiB",
                  "dev 0-7\n(10)\n40 B", "dev 0-7\n(256, 10)\n10.0 KiB"]
fig

# %% [markdown]
# ## 3. Why the gradient needs an all-reduce
#
# The loss is the mean over the **global** batch: $L = \frac{1}{64}\sum_{i=1}^{64} \ell_i$. Split the
# sum by device, $L = \sum_{d=0}^{7} \frac{1}{64}\sum_{i \in \text{slice } d} \ell_i$, and take the
# gradient: it is linear, so the full gradient is the **sum over devices** of a gradient each device
# can compute from its own 8 examples. No device can finish alone; summing one array per device and
# giving every device the result is exactly what an **all-reduce** does.
#
# You can check the algebra without any sharding: compute the 8 per-slice gradients with `jax.vmap`,
# add them up, and compare with the gradient of the full-batch mean.

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
jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6), summed, full)
assert not np.allclose(k_one[0], k_full, atol=1e-3)  # one device's gradient alone is not the answer

# %% [markdown]
# ## 4. The compiled train step: one all-reduce, the size of the parameters
#
# The seed's "Communication Overhead" section says:
#
# > `# Data parallelism: O(parameters) all-reduce per step`
#
# Compile the train step for the placed model and batch and look. An `nnx.jit` function can be lowered
# like a `jax.jit` one: `train_step.lower(model, optimizer, x_dp, y_dp).compile()` is the per-device
# program, with the collectives the compiler inserted.

# %%
compiled = train_step.lower(model, optimizer, x_dp, y_dp).compile()
comm = collectives(compiled)
print(comm)

assert comm.counts == {"all-reduce": 1, "all-gather": 0, "reduce-scatter": 0, "all-to-all": 0,
                       "collective-permute": 0}
(all_reduce,) = comm.ops
assert all_reduce.group_size == 8
assert all_reduce.result_bytes == param_bytes + 4  # every gradient, plus the 4-byte loss

# %% [markdown]
# One all-reduce over the 8 devices, carrying `(f32[256], f32[256,64], f32[10], f32[10,256], f32[])`:
# the four gradients and the loss. XLA merged the five sums into a single op. The kernel gradients show
# up transposed (`f32[256,64]` for the `(64, 256)` kernel) because XLA picked the layout of the
# backward matmul that produces them; the element count, and so the bytes, are the same. What each
# result is for, from the HLO's own metadata (the `op_name` of each piece taken out of the all-reduce):

# %%
pieces = [line for line in compiled.as_text().splitlines()
          if f"get-tuple-element(%{all_reduce.name})" in line or f"get-tuple-element({all_reduce.name})" in line]
for line in pieces:
    shape = line.split("=", 1)[1].split("get-tuple-element")[0].strip().split("{")[0]
    op_name = line.split('op_name="', 1)[1].split('"', 1)[0]
    print(f"{shape:<14}{op_name}")
assert len(pieces) == 5
assert sum("transpose(jvp())" in line for line in pieces) == 4  # four pieces come from the backward pass

# %% [markdown]
# `transpose(jvp())` is JAX's name for the backward pass: the all-reduce takes what the backward
# matmuls (`dot_general`, the kernel gradients) and sums (`reduce_sum`, the bias gradients) produced on
# each device's 8 examples, and hands every device the total, on which each then runs the same Adam
# update (section 6 checks that the 8 copies stay identical). The fifth piece, `jvp()/reduce_sum`, is
# the forward loss: the mean over the global batch needs the same sum across devices.
#
# Per device, the program's arguments are the whole model, the whole Adam state (two moments per
# parameter, plus two 4-byte step counters), and one slice of the batch:

# %%
mem = memory_per_device(compiled)
print(mem)
batch_slice_bytes = 8 * 64 * 4 + 8 * 4  # x rows and y labels of one device
assert mem.argument == 3 * param_bytes + 2 * 4 + batch_slice_bytes

# %% [markdown]
# So the measured answer to the seed's line: **1 all-reduce of 76,844 bytes per step** (76,840 bytes of
# gradients, 4 of loss), and **every device stores 3 x 75.0 KiB** of parameters and Adam state.
# Section 7 shows that neither number changes when more devices share a larger global batch.

# %% [markdown]
# ## 5. Gotcha: the seed's training loop, run as written
#
# The seed's "Step 4" and "Step 5" build the train step with plain `jax.jit`, `in_shardings` and
# `out_shardings`, an optimizer made with `nnx.Optimizer(model, optimizer)`, and a loop under
# `with mesh:`. Here is that code, unchanged except for the model, the data (the seed's `batch` is a
# dict with `input_ids` and `label`) and Adam's learning rate (`1e-2`, as everywhere in this course),
# run step by step. Every failure is caught and recorded.

# %%
shardings = {  # the two entries of the seed's create_sharding_specs that the loop uses
    "data_parallel": NamedSharding(mesh, P("data", None)),
    "replicated": NamedSharding(mesh, P()),
}


def create_train_step(mesh, shardings):  # the seed's Step 4
    @partial(
        jax.jit,
        in_shardings=(shardings["replicated"], shardings["data_parallel"]),
        out_shardings=(shardings["replicated"], shardings["replicated"], shardings["replicated"]),
    )
    def train_step(state, batch):
        def loss_fn(model):
            logits = model(batch["input_ids"])
            labels_onehot = jax.nn.one_hot(batch["label"], num_classes=10)
            loss = optax.softmax_cross_entropy(logits, labels_onehot).mean()
            predictions = jnp.argmax(logits, axis=-1)
            accuracy = jnp.mean(predictions == batch["label"])
            return loss, {"accuracy": accuracy}

        grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
        (loss, metrics), grads = grad_fn(state.model)
        state.update(grads)
        return state, loss, metrics

    return train_step


batch = {"input_ids": x, "label": y}
failures = []

# Step 5, first line inside the loop: shard the batch with the seed's 'data_parallel' sharding.
try:
    jax.tree.map(lambda a: jax.device_put(a, shardings["data_parallel"]), batch)
except ValueError as err:
    failures.append("ValueError")
    message = str(err)
    print("1. ValueError: ... spec=P('data', None) ...", message[message.index("is only valid"):], "\n")

# Step 5: the optimizer.
seed_model = MLP(nnx.Rngs(0))
try:
    state = nnx.Optimizer(seed_model, optax.adam(learning_rate=1e-2))
except TypeError as err:
    failures.append("TypeError")
    print("2. TypeError:", err, "\n")

# %% [markdown]
# Two loud failures before training starts:
#
# 1. The seed's `data_parallel` sharding is `P('data', None)`, written for 2-D arrays; the labels are
#    1-D, and a spec may not have more entries than the array has dimensions. `P('data')` fits both
#    (trailing dimensions are replicated), as the seed's own Strategy 1 writes it.
# 2. Since Flax 0.11, `nnx.Optimizer` needs `wrt=` (which variables it trains).
#
# Fix both and go on. The seed's loop runs under `with mesh:`.

# %%
batch_sharded = jax.tree.map(lambda a: jax.device_put(a, batch_sharding), batch)
state = nnx.Optimizer(seed_model, optax.adam(learning_rate=1e-2), wrt=nnx.Param)
seed_train_step = create_train_step(mesh, shardings | {"data_parallel": batch_sharding})

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        with mesh:
            state, loss, metrics = seed_train_step(state, batch_sharded)
    except AttributeError as err:
        failures.append("AttributeError")
        print("3. AttributeError:", err, "\n")
deprecations = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
print("4. DeprecationWarning:", deprecations[0])
assert failures == ["ValueError", "TypeError", "AttributeError"]
assert any("with mesh:" in message for message in deprecations)


# %% [markdown]
# 3. The seed differentiates `state.model`: since Flax 0.11 the optimizer no longer holds the model
#    (the old behaviour lives on as `nnx.ModelAndOptimizer`). You pass the model yourself, and
#    `update` takes it too: `state.update(model, grads)`.
# 4. `with mesh:` is deprecated in favour of `with jax.set_mesh(mesh):`.
#
# Fix the API the way the error messages ask, keep everything else (plain `jax.jit`, the in-place
# `update`, returning `state`), and train three steps:

# %%
def create_train_step_api_fixed(mesh, shardings):
    @partial(
        jax.jit,
        in_shardings=(shardings["replicated"], shardings["replicated"], shardings["data_parallel"]),
        out_shardings=(shardings["replicated"], shardings["replicated"], shardings["replicated"]),
    )
    def train_step(model, state, batch):
        def loss_fn(model):
            logits = model(batch["input_ids"])
            labels_onehot = jax.nn.one_hot(batch["label"], num_classes=10)
            loss = optax.softmax_cross_entropy(logits, labels_onehot).mean()
            accuracy = jnp.mean(jnp.argmax(logits, axis=-1) == batch["label"])
            return loss, {"accuracy": accuracy}

        (loss, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        state.update(model, grads)  # the in-place update, as in the seed
        return state, loss, metrics

    return train_step


fixed_shardings = {"data_parallel": batch_sharding, "replicated": replicated}
api_fixed_step = create_train_step_api_fixed(mesh, fixed_shardings)
nnx.update(seed_model, jax.device_put(nnx.state(seed_model), replicated))
nnx.update(state, jax.device_put(nnx.state(state), replicated))

silent_losses = []
with warnings.catch_warnings(record=True) as caught, jax.set_mesh(mesh):
    warnings.simplefilter("always")
    for _ in range(3):
        state, loss, metrics = api_fixed_step(seed_model, state, batch_sharded)
        silent_losses.append(float(loss))

print("losses:          ", np.round(silent_losses, 5))
print("optimizer steps: ", int(state.step[...]))
assert caught == []  # not a single warning
assert silent_losses[0] == silent_losses[1] == silent_losses[2]  # the loss never moves
assert abs(silent_losses[0] - ref_losses[0]) < 1e-5  # it is the untrained model's loss
assert int(state.step[...]) == 3  # ... although the optimizer counted three updates
for now, initial in zip(jax.tree.leaves(nnx.state(seed_model, nnx.Param)), init_params, strict=True):
    np.testing.assert_array_equal(np.asarray(now), initial)  # the parameters never changed

# %% [markdown]
# No error, no warning, and nothing learned: the same loss three times, the parameters bit-for-bit
# their initial values, yet the optimizer reports 3 steps. Why:
#
# - NNX modules and optimizers are pytrees, so `jax.jit` accepts them: it flattens them into arrays,
#   and the traced function works on **new Python objects** rebuilt from those arrays.
# - `state.update(model, grads)` writes the new parameters into the traced copy of `model`, and the new
#   Adam moments and step count into the traced copy of `state`.
# - `jax.jit` returns only what the function returns. `state` is returned, so its moments and step
#   come back (that is the 3). `model` is not, so its new parameters are dropped and your `seed_model`
#   keeps its initial arrays. Every step starts from the same parameters: the same loss.
#
# The seed was written for the older API, in which the optimizer held the model (`state.model`); with
# today's API the model is a separate argument, and plain `jax.jit` drops what happens to it. The fix is
# **`nnx.jit`**: it keeps track of the NNX objects you pass in and writes every change made inside back
# into them. That is the train step of this course (section 1), and the next section runs it.

# %% [markdown]
# ## 6. The working form: `nnx.jit`, the same losses as one device
#
# The train step of section 1 is decorated with `nnx.jit` and updates `model` and `optimizer` in
# place. The placed `model`, `optimizer`, `x_dp` and `y_dp` go in; the shardings come from the
# arguments, so `in_shardings` is not needed. Five steps, compared with the single-device reference:

# %%
dp_losses = [float(train_step(model, optimizer, x_dp, y_dp)) for _ in range(5)]
print("data parallel:", np.round(dp_losses, 4))
print("reference:    ", np.round(ref_losses, 4))
np.testing.assert_allclose(dp_losses, ref_losses, rtol=1e-5)
assert int(optimizer.step[...]) == 5
assert model.linear1.kernel[...].sharding.is_equivalent_to(replicated, 2)  # still replicated after training

# %% [markdown]
# The data-parallel run and the single-device run agree to float32 rounding: the all-reduce makes
# every device apply the same global-batch gradient, so the 8 replicas stay identical. Check that they
# really are 8 identical copies:

# %%
shards = [np.asarray(s.data) for s in model.linear2.kernel[...].addressable_shards]
assert len(shards) == 8 and all(np.array_equal(s, shards[0]) for s in shards)
print("the 8 copies of linear2/kernel are bit-identical after 5 steps")

# %% [markdown]
# ## 7. Scaling the batch with the device count
#
# Data parallelism scales by keeping the **per-device** batch fixed and adding devices: the **global**
# batch grows with the device count. Build meshes of 2, 4 and 8 devices from the first devices, give
# each device 8 examples, and compile the same train step on each.

# %%
rows, batches = [], {}
for n in (2, 4, 8):
    if n == 8:  # the full mesh: compiled in section 4 already
        xb, compiled_n = x_dp, compiled
    else:
        sub_mesh = jax.make_mesh((n,), ("data",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])
        xb = jax.device_put(x[: 8 * n], NamedSharding(sub_mesh, P("data")))
        yb = jax.device_put(y[: 8 * n], NamedSharding(sub_mesh, P("data")))
        m = MLP(nnx.Rngs(0))
        o = nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)
        nnx.update(m, jax.device_put(nnx.state(m), NamedSharding(sub_mesh, P())))
        nnx.update(o, jax.device_put(nnx.state(o), NamedSharding(sub_mesh, P())))
        compiled_n = train_step.lower(m, o, xb, yb).compile()
    c, mem_n = collectives(compiled_n), memory_per_device(compiled_n)
    rows.append((n, xb.shape[0], xb.sharding.shard_shape(xb.shape)[0], c.count("all-reduce"),
                 c.result_bytes, c.estimated_bytes, mem_n.argument, mem_n.temp))
    batches[f"{n} devices"] = xb

print(f"{'devices':>7}{'global batch':>14}{'per device':>12}{'all-reduces':>13}{'reduced bytes':>15}"
      f"{'sent/device':>13}{'stored/device':>15}{'temp/device':>13}")
for n, global_batch, local_batch, count, reduced, moved, stored, temp in rows:
    print(f"{n:>7}{global_batch:>14}{local_batch:>12}{count:>13}{reduced:>15,}{format_bytes(moved):>13}"
          f"{format_bytes(stored):>15}{format_bytes(temp):>13}")

for n, global_batch, local_batch, count, reduced, moved, _, _ in rows:
    assert global_batch == 8 * n and local_batch == 8  # the global batch grows, the per-device batch does not
    assert count == 1 and reduced == param_bytes + 4  # the all-reduce is the size of the model every time
    assert moved == 2 * (n - 1) / n * reduced < 2 * param_bytes + 8  # ring all-reduce: bounded by 2 x model
assert len({row[6] for row in rows}) == 1 and len({row[7] for row in rows}) == 1  # same memory per device

# %% [markdown]
# The global batch went 16, 32, 64; the all-reduce carried the same 76,844 bytes each time. Under the
# textbook ring algorithm each device sends `2(N-1)/N` times that, which approaches twice the model size
# and never exceeds it. That is the seed's "O(parameters) all-reduce per step", measured: the cost
# follows the model, not the batch, which is why data parallelism suits "small models, large batches".
# The memory per device did not move either: what a device stores (model, Adam state, its 8 examples)
# and what the step allocates on the way (its 8 examples' activations, the gradients) depend on the
# model and the per-device batch, not on how many devices share the work.
# In the picture each panel is drawn at the same size, so read the labels: every device holds a
# `(8, 64)` block on every mesh; the number of blocks, and the global batch with it, grows:

# %%
fig = draw_shardings(batches, ncols=3, show_bytes=False)
labels = tile_labels(fig)
assert len(labels) == 2 + 4 + 8 and all("(8, 64)" in label for label in labels)
fig

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** Write the two specs of data parallelism on the 1-D mesh with axis `data`: one for the
# batch `x` of shape `(64, 64)` (examples first), one for a parameter such as the `(64, 256)` kernel.

# %%
from exercises import ex06_data_parallel as ex

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
# ## Takeaways
# - Data parallelism is two specs: `P('data')` on the batch, `P()` on parameters and optimizer state. The
#   global batch is split (`f32[64@data,64]`, `(8, 64)` per device); the model is copied whole.
# - The loss is a mean over the global batch, so its gradient is a sum over devices: the compiler inserts
#   **one all-reduce** in the train step, between the backward pass and the optimizer update, carrying
#   every gradient (76,840 bytes here) plus the loss.
# - Adding devices at a fixed per-device batch grows the global batch; the all-reduce stays the size of
#   the model. Each device still stores the whole model and the whole Adam state (3 x the parameters).
# - Plain `jax.jit` over NNX objects with an in-place `update` trains nothing: mutations of the traced
#   copies are dropped unless returned. Use `nnx.jit` (or return and rebind every object).
#
# **Next:** [07 · Tensor parallelism](07_tensor_parallel.ipynb)
