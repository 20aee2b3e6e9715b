# %% [markdown]
# # 16 · pmap vs SPMD
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/16_pmap_vs_spmd.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/16_pmap_vs_spmd.ipynb)
#
# The same data-parallel step as `jax.pmap`, `jax.jit` and `jax.shard_map` gives the same numbers and
# the same collective, and `pmap` is now built from the other two. A lot of JAX code that trains on
# several devices was written with `jax.pmap`, and the guide this course
# started from ends with a table that puts `pmap` next to "SPMD" (`jax.jit` with shardings). In this notebook
# you write that step three ways and look inside `pmap` to see how it is built. Then you port pmap code the way you would
# in a real codebase, including the one change that silently multiplies your gradients by 8, and re-examine
# the guide's table row by row with evidence.
#
# **You will learn**
# - how a `pmap` + `pmean` step, a `jit` + `NamedSharding` step and a `shard_map` step relate, and that
#   all three give the same parameters and one all-reduce in the compiled program;
# - that `pmap` today is `jit` around `shard_map`: its output is an ordinary `jax.Array` with a
#   `NamedSharding` on a 1-D mesh;
# - the migration recipe: the per-device view keeps its rank, `device_put_replicated` is gone, and
#   `pmean` of gradients inside `shard_map` gives gradients N times too large, with the reason and two fixes;
# - what `pmap` cannot express (a second mesh axis, sharded parameters without hand-written collectives),
#   and which rows of the guide's comparison table still hold.

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
import statistics
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import NOT_ANSWERED, collectives, draw_sharding, draw_shardings, shard_table, tile_labels, type_string

assert jax.device_count() == 8

# %% [markdown]
# ## 1. The model, the data, and a single-device reference
#
# `pmap` predates Flax NNX, and most pmap code you will meet is written as pure functions of a parameter
# pytree. So this notebook uses a pure-JAX version of the model of notebooks 07 to 10: a batch of 64
# examples with 64 features and labels in `[0, 10)` from a fixed random teacher, a `64 -> 256 -> 10` MLP
# whose parameters are a dict of four arrays, softmax cross-entropy, and plain SGD so that no optimizer
# state gets in the way. (The numbers come from NumPy's generator with a fixed seed; they are not the
# same numbers as in 07 to 10.) `step` is written for **one** device; it is the reference for everything
# below.

# %%
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 64), dtype=np.float32)
y = np.argmax(x @ rng.standard_normal((64, 10), dtype=np.float32), axis=-1).astype(np.int32)
params = {
    "w1": rng.standard_normal((64, 256), dtype=np.float32) / 8,
    "b1": np.zeros(256, np.float32),
    "w2": rng.standard_normal((256, 10), dtype=np.float32) / 16,
    "b2": np.zeros(10, np.float32),
}
LR = 0.3


def mlp(p, x):
    return jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def loss_fn(p, x, y):
    log_probs = jax.nn.log_softmax(mlp(p, x))
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))  # mean over the examples given


def sgd(p, grads):
    return jax.tree.map(lambda a, g: a - LR * g, p, grads)


def step(p, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    return sgd(p, grads), loss


def train(step_fn, p, x, y, n_steps=5):
    losses = []
    for _ in range(n_steps):
        p, loss = step_fn(p, x, y)
        losses.append(loss)
    return p, losses


ref_params, ref_losses = train(jax.jit(step), params, x, y)
ref_losses = np.array(ref_losses)
print("reference losses:", np.round(ref_losses, 4))
assert ref_losses[-1] < ref_losses[0] / 2  # it learns


# %% [markdown]
# ## 2. Way 1: `jax.pmap` with `pmean`
#
# `pmap` runs a function once per device. Every argument gets an extra **leading axis** whose size is the
# number of devices: slice `i` goes to device `i`. The function sees one slice, without that axis, and
# talks to the other devices through collectives named by `axis_name`. A classic data-parallel step
# computes the gradient of its own 8 examples and averages it over the devices with `jax.lax.pmean`.
#
# The inputs need that leading device axis: 8 stacked copies of every parameter, and the batch reshaped
# to `(8, 8, 64)`. pmap code used to place them with
# `jax.device_put_replicated(params, jax.devices())` and `jax.device_put_sharded(...)`; both are gone
# (section 7.2). Today you say the same thing with a `NamedSharding` that splits the leading axis over a
# 1-D mesh of the 8 devices, which is exactly the layout `pmap` uses (section 5).

# %%
def pmap_body(p, x, y):  # runs on each device: x (8, 64), y (8,), p one full copy of the parameters
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)  # the mean over this device's 8 examples
    grads = jax.lax.pmean(grads, axis_name="data")  # average over the 8 devices
    loss = jax.lax.pmean(loss, axis_name="data")
    return sgd(p, grads), loss


pmap_step = jax.pmap(pmap_body, axis_name="data")

mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
per_device = NamedSharding(mesh, P("data"))  # slice i of the leading axis on device i
params_stacked = jax.device_put({k: np.stack([a] * 8) for k, a in params.items()}, per_device)  # (8, 64, 256)...
x_stacked = jax.device_put(x.reshape(8, 8, 64), per_device)  # device i gets examples 8i .. 8i+7
y_stacked = jax.device_put(y.reshape(8, 8), per_device)

pmap_params, pmap_losses = train(pmap_step, params_stacked, x_stacked, y_stacked)
print("loss per device after step 1:", np.round(np.asarray(pmap_losses[0]), 4))
print("w1 comes back as", pmap_params["w1"].shape, "(one copy per device)")

pmap_np = jax.tree.map(np.asarray, pmap_params)  # to NumPy once, for the comparisons below
assert pmap_losses[0].shape == (8,) and pmap_np["w1"].shape == (8, 64, 256)
for leaf in jax.tree.leaves(pmap_np):  # the 8 copies stayed identical
    assert (leaf == leaf[0]).all()
pmap_loss_values = np.array([np.asarray(loss)[0] for loss in pmap_losses])
np.testing.assert_allclose(pmap_loss_values, ref_losses, rtol=1e-6)
for a, b in zip(jax.tree.leaves(pmap_np), jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_allclose(a[0], b, rtol=1e-5, atol=1e-6)

# %% [markdown]
# The mean of 8 per-device means of 8 examples each is the mean over all 64 examples, so the pmap step
# matches the single-device step up to float rounding (the sums are done in another order).

# %% [markdown]
# ## 3. Way 2: `jax.jit` with `NamedSharding`
#
# With `jax.jit` you do not write a per-device program at all. You keep the single-device `step`
# unchanged, and you say where the data lives: parameters replicated (`P()`), batch split over the
# `data` axis of the same 1-D mesh (`P('data')`). The compiler works out that the gradient needs a sum over
# devices and inserts it. There is no device axis to add and no `pmean` to write.

# %%
replicated = NamedSharding(mesh, P())
batch_sharding = NamedSharding(mesh, P("data"))

params_repl = jax.device_put(params, replicated)
x_dp, y_dp = jax.device_put(x, batch_sharding), jax.device_put(y, batch_sharding)
print("x:", type_string(x_dp), "per device", x_dp.sharding.shard_shape(x_dp.shape))
print("w1:", type_string(params_repl["w1"]), "per device", params_repl["w1"].sharding.shard_shape((64, 256)))

jit_step = jax.jit(step)  # the single-device step, as it is
jit_params, jit_losses = train(jit_step, params_repl, x_dp, y_dp)
jit_loss_values = np.array([np.asarray(loss) for loss in jit_losses])
print("jit losses: ", np.round(jit_loss_values, 4))

assert x_dp.sharding.shard_shape(x_dp.shape) == (8, 64)
assert jit_params["w1"].sharding.is_fully_replicated  # parameters stay replicated
# pmap and jit agree to the last bit, here, on both JAX versions of the course:
np.testing.assert_array_equal(jit_loss_values, pmap_loss_values)
for a, b in zip(jax.tree.leaves(jit_params), jax.tree.leaves(pmap_np), strict=True):
    np.testing.assert_array_equal(a, b[0])

# %% [markdown]
# The two versions hold the same bytes on the same devices; pmap just adds a leading device axis. In
# pmap's stacked batch, device 3 holds slice 3 of the leading axis (one slice of 8 rows); with `jit`,
# device 3 holds rows 24 to 31 of the global batch:

# %%
fig = draw_sharding(x_stacked, dims=(0, 1))  # dims 0 and 1 drawn; every block holds all 64 features
labels_pmap = tile_labels(fig)
assert len(labels_pmap) == 8 and labels_pmap[3] == "dev 3\n(1, 8, 64)\n2.0 KiB"
fig

# %%
fig = draw_sharding(x_dp)
assert "dev 3\n(8, 64)\n2.0 KiB" in tile_labels(fig)
assert shard_table(x_dp).bytes_per_device == shard_table(x_stacked).bytes_per_device  # 2 KiB each
fig

# %% [markdown]
# Now compile both and count collectives. In the pmap step you wrote two `pmean`s (five arrays in all:
# four gradients and the loss); in the `jit` step you wrote none. The jaxprs, the programs *before*
# partitioning, show the difference: `pmean` appears as a `psum` in pmap's, and there is no collective
# at all in jit's. The compiled programs, *after* partitioning, are another story:

# %%
pmap_compiled = pmap_step.lower(params_stacked, x_stacked, y_stacked).compile()
jit_compiled = jit_step.lower(params_repl, x_dp, y_dp).compile()
print("pmap:\n", collectives(pmap_compiled), sep="")
print("jit:\n", collectives(jit_compiled), sep="")

pmap_step_jaxpr = jax.make_jaxpr(pmap_step)(params_stacked, x_stacked, y_stacked).pretty_print(use_color=False)
jit_step_jaxpr = jax.make_jaxpr(jit_step)(params_repl, x_dp, y_dp).pretty_print(use_color=False)
assert "psum" in pmap_step_jaxpr and "psum" not in jit_step_jaxpr  # jit: no collective written by hand
for compiled in (pmap_compiled, jit_compiled):
    assert collectives(compiled).counts["all-reduce"] == 1 and collectives(compiled).count() == 1
param_bytes = sum(a.nbytes for a in jax.tree.leaves(params))
assert collectives(jit_compiled).result_bytes == collectives(pmap_compiled).result_bytes == param_bytes + 4


# %% [markdown]
# The same program: **one** all-reduce of all the gradients plus the loss (76,840 + 4 bytes), in both.
# Your two `pmean` calls over five arrays became a single all-reduce; in the `jit` step the compiler
# inserted that all-reduce itself, because the gradient of a mean over a batch split 8 ways is a sum of
# 8 partial gradients.

# %% [markdown]
# ## 4. Way 3: `jax.shard_map`
#
# `jax.shard_map` is the modern way to write a per-device program: like `pmap`, you write what one
# device does and the collectives it needs; unlike `pmap`, it takes a mesh and a `PartitionSpec` per
# argument, and each device sees a **block** of the global array, not a slice with an axis removed. The
# step below differentiates the loss averaged over devices (`pmean` of the loss, not of the
# gradients); section 7 explains why this is the form to use.

# %%
def shard_map_body(p, x, y):  # runs on each device: x block (8, 64), y block (8,), p the full parameters
    def global_loss(p):
        return jax.lax.pmean(loss_fn(p, x, y), axis_name="data")

    loss, grads = jax.value_and_grad(global_loss)(p)
    return sgd(p, grads), loss


shmap_step = jax.jit(
    jax.shard_map(shard_map_body, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()))
)
shmap_params, shmap_losses = train(shmap_step, params_repl, x_dp, y_dp)
shmap_compiled = shmap_step.lower(params_repl, x_dp, y_dp).compile()
print(collectives(shmap_compiled))

assert collectives(shmap_compiled).counts["all-reduce"] == 1 and collectives(shmap_compiled).count() == 1
np.testing.assert_array_equal(np.array(shmap_losses), pmap_loss_values)
for a, b in zip(jax.tree.leaves(shmap_params), jax.tree.leaves(pmap_np), strict=True):
    np.testing.assert_array_equal(a, b[0])

# %% [markdown]
# Three ways to write it, one compiled program: the same single all-reduce, and the same parameters to
# the last bit after 5 steps. (Bit-identical is what this model gives on both JAX versions of the course;
# in general expect agreement up to float rounding, as with the single-device reference.)

# %% [markdown]
# ## 5. Under the hood: `pmap` is `jit` around `shard_map`
#
# Since JAX 0.8.0, `jax.pmap` is implemented with the other two. Its jaxpr shows a `jit` wrapping a
# `shard_map` over a 1-D mesh named after `axis_name`, with the replication check off
# (`check_vma=False`), and a `squeeze` that removes the leading axis of size 1 from each block before
# your function sees it:

# %%
pmap_jaxpr = jax.make_jaxpr(jax.pmap(lambda a: a * 2, axis_name="data"))(jnp.ones((8, 3)))
pmap_jaxpr = pmap_jaxpr.pretty_print(use_color=False)
print(pmap_jaxpr)
for piece in ("jit[", "shard_map[", "check_vma=False", "in_specs=(P('data',),)", "squeeze"):
    assert piece in pmap_jaxpr, piece

# %% [markdown]
# So a pmap output is not a special "pmap array" any more (`jax.sharding.PmapSharding` is gone). It is an
# ordinary `jax.Array`, with a `NamedSharding` that splits its leading axis over a 1-D mesh of the 8
# devices; each device holds a shard whose leading axis has size 1:

# %%
out = pmap_params["w1"]
print("a jax.Array:", isinstance(out, jax.Array), "with", out.sharding)
print("shard on device 0:", out.addressable_shards[0].data.shape)

assert isinstance(out, jax.Array) and isinstance(out.sharding, NamedSharding)
assert out.sharding.spec == P("data") and dict(out.sharding.mesh.shape) == {"data": 8}
assert shard_table(out).shard_shapes == {(1, 64, 256)}
assert not hasattr(jax.sharding, "PmapSharding")

# %% [markdown]
# Its docstring says what the JAX team thinks of it, yet calling it raises no warning: `pmap` is in
# maintenance mode, not formally deprecated.

# %%
print(jax.pmap.__doc__.strip().splitlines()[0])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    jax.block_until_ready(pmap_step(params_stacked, x_stacked, y_stacked))
print("warnings when calling pmap:", len(caught))

assert jax.pmap.__doc__.strip().startswith("Old way of doing parallel map. Use :py:func:`jax.shard_map` instead.")
assert caught == []

# %% [markdown]
# ## 6. Step time, three ways
#
# The guide's table says SPMD performs "better". Time the three steps on the same devices: warm up, then
# run the three in turn, 25 rounds, so that whatever else the machine is doing hits all three alike, and
# compare medians.
#
# **Read this with care.** The 8 devices here are simulated: 8 XLA CPU devices sharing this machine's
# cores (2 on the course's CI), with no interconnect, so an all-reduce is a memory copy. A step of this
# tiny model is mostly dispatch and synchronisation, not arithmetic. The ratios can only hint at
# per-call overhead; they say nothing about a GPU or TPU. They are machine-dependent, so the notebook
# prints them as a coarse statement, never as numbers, and asserts nothing about them.

# %%
versions = {
    "pmap": (pmap_step, (params_stacked, x_stacked, y_stacked)),
    "jit": (jit_step, (params_repl, x_dp, y_dp)),
    "shard_map": (shmap_step, (params_repl, x_dp, y_dp)),
}
for fn, args in versions.values():  # warm-up: compiled already, but the first calls are slower
    for _ in range(3):
        jax.block_until_ready(fn(*args))

timings = {name: [] for name in versions}
for _ in range(25):
    for name, (fn, args) in versions.items():
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        timings[name].append(time.perf_counter() - start)
median = {name: statistics.median(ts) for name, ts in timings.items()}


def compared_with_jit(ratio):  # a coarse bucket: the exact ratio changes from run to run
    if 1 / 3 <= ratio <= 3:
        return "within 3x of jit"
    return "more than 3x " + ("slower" if ratio > 1 else "faster") + " than jit"


print("machine-dependent, simulated CPU devices:")
for name in ("pmap", "shard_map"):
    print(f"  {name:9} step time: {compared_with_jit(median[name] / median['jit'])}")

# %% [markdown]
# Two lines that say "within 3x" are what the compiled programs predict: the three are the same
# program with the same one all-reduce, launched through slightly different Python paths. Where the
# APIs really differ is in what each *can express*, the subject of section 8.

# %% [markdown]
# ## 7. Migrating pmap code to `shard_map` or `jit`
#
# Most pmap code can move in one of two directions: to `jit` with shardings (section 3), which deletes
# the per-device code, or to `shard_map` (section 4), which keeps it. Three things change on the way.
#
# ### 7.1 The per-device view keeps its rank
#
# `pmap` removes the mapped axis: with an `(8, 3)` input, the function sees `x.shape == (3,)`. `shard_map`
# hands each device a **block** of the global array, with the same number of dimensions: `(1, 3)`.
# Code that indexes `x[0]` or reshapes by rank has to change.

# %%
seen = {}


def record(name):
    def f(block):
        seen[name] = block.shape  # runs at trace time, once per compilation
        return block

    return f


a = jnp.arange(24.0).reshape(8, 3)
jax.pmap(record("pmap"))(a)
jax.shard_map(record("shard_map"), mesh=mesh, in_specs=P("data"), out_specs=P("data"))(a)
print(seen)
assert seen == {"pmap": (3,), "shard_map": (1, 3)}

# %% [markdown]
# ### 7.2 `device_put_replicated` and `device_put_sharded` are gone
#
# pmap code placed its inputs with these two helpers. Both now raise `AttributeError`, with a pointer to
# the migration guide:

# %%
raised = []
for name in ("device_put_replicated", "device_put_sharded"):
    try:
        getattr(jax, name)(params["b2"], jax.devices())
    except AttributeError as err:
        raised.append(name)
        print(f"AttributeError: {err}\n")
assert raised == ["device_put_replicated", "device_put_sharded"]

# %% [markdown]
# The replacement is `jax.device_put` with a `NamedSharding`. For `jit` and `shard_map` you place the
# **global** array, with no device axis: `P()` replicates it, `P('data')` splits it. If you keep a pmap
# function for a while, `P('data')` on the stacked array places its pmap-shaped input (as in section 2),
# and pmap hands back outputs with that very layout.

# %%
b2_repl = jax.device_put(params["b2"], NamedSharding(mesh, P()))  # was: device_put_replicated
x_split = jax.device_put(x, NamedSharding(mesh, P("data")))  # was: device_put_sharded(list of 8 slices)
b2_stacked = jax.device_put(np.stack([params["b2"]] * 8), NamedSharding(mesh, P("data")))  # pmap-shaped

print("replicated:", type_string(b2_repl), shard_table(b2_repl).shard_shapes)
print("split:     ", type_string(x_split), shard_table(x_split).shard_shapes)
print("for pmap:  ", type_string(b2_stacked), shard_table(b2_stacked).shard_shapes)
assert b2_repl.sharding.is_fully_replicated and shard_table(b2_repl).shard_shapes == {(10,)}
assert shard_table(x_split).shard_shapes == {(8, 64)}
assert shard_table(b2_stacked).shard_shapes == {(1, 10)}
# pmap takes the pmap-shaped array and gives back an array with the very same sharding:
assert jax.pmap(lambda b: b + 1)(b2_stacked).sharding.is_equivalent_to(b2_stacked.sharding, 2)


# %% [markdown]
# ### 7.3 Gotcha: `pmean` of the gradients inside `shard_map`
#
# The obvious port of the pmap step is to keep its body, `pmean` of the gradients included, and wrap it
# in `jax.shard_map` instead of `jax.pmap`. It runs without an error or a warning, and trains badly. Look at
# the gradient alone and compare it with the true gradient of the mean loss over all 64 examples:

# %%
def grads_with_pmean(p, x, y):  # the pmap body's gradient line, unchanged
    return jax.lax.pmean(jax.grad(loss_fn)(p, x, y), axis_name="data")


ported = jax.jit(jax.shard_map(grads_with_pmean, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P()))
with warnings.catch_warnings(record=True) as caught_port:
    warnings.simplefilter("always")
    g_ported = ported(params_repl, x_dp, y_dp)
assert caught_port == []  # no error, no warning
g_true = jax.jit(jax.grad(loss_fn))(params, x, y)  # the gradient of the mean loss over all 64 examples
for name in g_true:
    print(f"{name}: |ported| / |true| = {np.linalg.norm(g_ported[name]) / np.linalg.norm(g_true[name]):.3f}")
for name in g_true:
    np.testing.assert_allclose(g_ported[name], 8 * g_true[name], rtol=1e-5, atol=1e-7)

# %% [markdown]
# Every gradient is **8 times** too large, exactly the number of devices. Trained with it, each step is
# an SGD step with 8 times the learning rate: the first update overshoots and the loss goes up.

# %%
ported_step = jax.jit(jax.shard_map(pmap_body, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P())))
_, ported_losses = train(ported_step, params_repl, x_dp, y_dp)
ported_loss_values = np.array(ported_losses)
print("correct losses:", np.round(pmap_loss_values, 2))
print("ported losses: ", np.round(ported_loss_values, 2))
assert ported_loss_values[0] == pmap_loss_values[0]  # the first loss is computed before any update
assert ported_loss_values[1] > ported_loss_values[0] > pmap_loss_values[1]  # up, where it should go down


# %% [markdown]
# For plain SGD a constant factor on the gradient is just another learning rate, so a few steps later
# the ported run can even show a lower loss than the correct one: a loss curve is a poor detector of
# this bug. After a port, compare the **gradients** with the old code's, as above.

# %% [markdown]
# **Why.** `shard_map` checks, by default (`check_vma=True`), which values vary across devices and which
# are the same everywhere: the parameters come in with `P()`, so they are the same on every device; the
# batch block varies. Using a replicated value in a computation with a varying one inserts an implicit
# cast to "varying" (`pvary`), and the transpose of that cast, in the backward pass, is a **sum over
# devices** (`psum_invariant`). So `jax.grad` inside `shard_map` already returns the *sum* of the 8
# per-device gradients, replicated on every device. `pmean` of a value that is already the same
# everywhere leaves it unchanged, so you get the sum of 8 per-device means: 8 times the mean. The jaxpr
# of the bare gradient shows both halves of that, and `out_specs=P()` (which demands a value that is the
# same on all devices) is accepted without any collective written by hand:

# %%
def grads_only(p, x, y):
    return jax.grad(loss_fn)(p, x, y)


grads_shmap = jax.shard_map(grads_only, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P())
grad_jaxpr = jax.make_jaxpr(grads_shmap)(params_repl, x_dp, y_dp).pretty_print(use_color=False)
lines = [line.strip() for line in grad_jaxpr.splitlines()]
casts = [line for line in lines if "pvary" in line and "f32[64,256]" in line]  # w1 cast to varying
sums = [line for line in lines if "psum_invariant" in line]
print("forward pass, w1 cast to varying:\n  " + "\n  ".join(casts))
print("backward pass, sums over devices:\n  " + "\n  ".join(sums))
assert len(casts) == 1 and len(sums) == 4  # the cast of w1, and one sum over devices per parameter
g_sum = jax.jit(grads_shmap)(params_repl, x_dp, y_dp)
np.testing.assert_allclose(g_sum["w1"], 8 * g_true["w1"], rtol=1e-5, atol=1e-7)  # already summed
np.testing.assert_allclose(g_ported["w1"], g_sum["w1"], rtol=1e-6)  # and pmean left the sum as it was

# %% [markdown]
# `pmap` never showed this because it runs `shard_map` with the check turned off (`check_vma=False`,
# section 5): without the check there is no implicit cast, the gradient is the per-device one, and the
# `pmean` is needed. Hence the two fixes:
#
# - **Fix A:** keep the pmap body and pass `check_vma=False`, exactly as `pmap` does. Quick, but you lose
#   the check that catches wrong `out_specs` (notebook 06).
# - **Fix B (the `shard_map` way):** keep the check, differentiate the loss averaged over devices, and
#   drop the `pmean` of the gradients: that is `shard_map_body` in section 4.

# %%
fix_a = jax.jit(jax.shard_map(pmap_body, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()),
                              check_vma=False))
fix_a_params, fix_a_losses = train(fix_a, params_repl, x_dp, y_dp)
print("fix A losses:", np.round(np.array(fix_a_losses), 4))
print("fix B losses:", np.round(np.array(shmap_losses), 4))

np.testing.assert_array_equal(np.array(fix_a_losses), pmap_loss_values)
for fixed in (fix_a_params, shmap_params):  # fix B is section 4's step
    for a, b in zip(jax.tree.leaves(fixed), jax.tree.leaves(pmap_np), strict=True):
        np.testing.assert_array_equal(a, b[0])

# %% [markdown]
# The factor is the size of the mesh axes the loss varies over, not the number of devices (exercise 2
# asks you to predict it on a 2-D mesh).

# %% [markdown]
# ## 8. What `pmap` cannot express
#
# ### 8.1 One leading axis, at most one slice per device
#
# `pmap` maps exactly one axis, the leading one, one slice per device. Give it a batch of 16 rows on 8
# devices, which `jit` or `shard_map` would split into blocks of 2, and it fails with a message about
# squeezing (the `squeeze` of section 5, applied to a block of 2 rows):

# %%
rows16 = jnp.ones((16, 3))
errors = []
try:
    jax.pmap(lambda r: r * 2)(rows16)
except ValueError as err:
    errors.append(type(err).__name__)
    print("ValueError:", err)

doubled = jax.jit(lambda r: r * 2)(jax.device_put(rows16, batch_sharding))
print("jit:", type_string(doubled), "blocks", shard_table(doubled).shard_shapes)
assert errors == ["ValueError"] and shard_table(doubled).shard_shapes == {(2, 3)}

# %% [markdown]
# The leading axis need not *equal* the device count, though: a leading axis of 4 runs on the first 4
# devices only, and the other 4 sit idle.

# %%
four = jax.pmap(lambda r: r * 2)(jnp.ones((4, 3)))
print("devices used:", sorted(d.id for d in four.sharding.device_set))
assert sorted(d.id for d in four.sharding.device_set) == [0, 1, 2, 3]

# %% [markdown]
# ### 8.2 A second mesh axis: tensor parallelism and mixed strategies
#
# With `jit`, splitting the MLP's hidden layer over a `model` axis while the batch stays split over
# `data` is a choice of specs on a `(4, 2)` mesh (notebooks 08 and 09): `w1` split by columns
# (`P(None, 'model')`), `w2` by rows (`P('model', None)`), and the same `step` function, unchanged.

# %%
mesh_2d = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
tp_specs = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}
tp_shardings = jax.tree.map(lambda spec: NamedSharding(mesh_2d, spec), tp_specs)
params_tp = jax.device_put(params, tp_shardings)
x_2d, y_2d = (jax.device_put(a, NamedSharding(mesh_2d, P("data"))) for a in (x, y))

tp_step = jax.jit(step, out_shardings=(tp_shardings, NamedSharding(mesh_2d, P())))
tp_params, tp_losses = train(tp_step, params_tp, x_2d, y_2d)
tp_compiled = tp_step.lower(params_tp, x_2d, y_2d).compile()
print(collectives(tp_compiled))

tp_bytes = sum(shard_table(a).bytes_per_device[0] for a in jax.tree.leaves(tp_params))
print(f"parameter bytes on device 0: {tp_bytes:,} of {param_bytes:,}")
assert tp_params["w1"].sharding.shard_shape((64, 256)) == (64, 128)
assert tp_bytes == (64 * 128 + 128 + 128 * 10 + 10) * 4  # half of the weights, all of b2
tp_ops = {(op.result_type, op.group_size) for op in collectives(tp_compiled).ops}
assert collectives(tp_compiled).kinds == {"all-reduce"}
assert ("f32[16,10]", 2) in tp_ops  # logits of a 16-example block, summed over the 2 'model' devices
assert sum(op.result_bytes for op in collectives(tp_compiled).ops if op.group_size == 4) == tp_bytes + 4
np.testing.assert_allclose(np.array(tp_losses), ref_losses, rtol=1e-5)
for a, b in zip(jax.tree.leaves(tp_params), jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)

# %% [markdown]
# Two all-reduces, both inserted by the compiler: one over `model` (2 devices) adds the two halves of
# the second layer's product for each 16-example block, and one over `data` (4 devices) sums the
# gradients, now of each device's half of the parameters. Each device stores half of `w1` and `w2`:

# %%
fig = draw_shardings(params_tp, ncols=4)
assert "dev 0,2,4,6\n(64, 128)\n32.0 KiB\n4 copies" in tile_labels(fig)
fig

# %% [markdown]
# `pmap` has a single axis. The old answer for two was `pmap` inside `pmap`; today that fails, because
# the inner `pmap` builds its own 1-D mesh inside the outer one's:

# %%
try:
    jax.pmap(jax.pmap(lambda a: jax.lax.psum(a, "model"), axis_name="model"), axis_name="data")(jnp.ones((4, 2, 3)))
except ValueError as err:
    errors.append("nested")
    print("ValueError:", str(err).splitlines()[0][:300])
assert errors == ["ValueError", "nested"]


# %% [markdown]
# With `pmap` alone, tensor parallelism means spending its one axis on the hidden units instead of the
# batch: split `w1` and `w2` into 8 stacked slices by hand, give every device the **whole** batch
# (`in_axes=None`: no data parallelism left), and write the `psum` of the second layer's partial
# products yourself. The forward pass alone:

# %%
def pmap_tp_logits(w1_cols, b1_cols, w2_rows, b2, x):  # device i: hidden units 32i .. 32i+31
    partial = jax.nn.relu(x @ w1_cols + b1_cols) @ w2_rows  # this device's share of the logits
    return jax.lax.psum(partial, "model") + b2


tp_by_hand = jax.pmap(pmap_tp_logits, axis_name="model", in_axes=(0, 0, 0, None, None))
tp_args = (
    params["w1"].reshape(64, 8, 32).transpose(1, 0, 2),  # (8, 64, 32): column block i for device i
    params["b1"].reshape(8, 32),
    params["w2"].reshape(8, 32, 10),  # row block i for device i
    params["b2"],
    x,  # all 64 examples on every device
)
logits_by_hand = tp_by_hand(*tp_args)
tp_by_hand_comm = collectives(tp_by_hand.lower(*tp_args).compile())
print(tp_by_hand_comm)
np.testing.assert_allclose(np.asarray(logits_by_hand)[5], jax.jit(mlp)(params, x), rtol=1e-5, atol=1e-5)
assert [op.result_type for op in tp_by_hand_comm.ops] == ["f32[64,10]"]  # the psum you wrote

# %% [markdown]
# ### 8.3 FSDP: sharded parameters
#
# FSDP (notebook 10) splits the parameters themselves over the `data` axis, so each device stores about
# 1/8 of them. With `jit` it is again a choice of specs (`b2`, 10 numbers, stays whole):

# %%
fsdp_specs = {"w1": P("data", None), "b1": P("data"), "w2": P("data", None), "b2": P()}
fsdp_shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), fsdp_specs)
params_fsdp = jax.device_put(params, fsdp_shardings)

fsdp_step = jax.jit(step, out_shardings=(fsdp_shardings, replicated))
fsdp_params, fsdp_losses = train(fsdp_step, params_fsdp, x_dp, y_dp)
fsdp_comm = collectives(fsdp_step.lower(params_fsdp, x_dp, y_dp).compile())
print(fsdp_comm)

fsdp_bytes = sum(shard_table(a).bytes_per_device[0] for a in jax.tree.leaves(fsdp_params))
print(f"parameter bytes on device 0: {fsdp_bytes:,} of {param_bytes:,}")
assert fsdp_bytes == (param_bytes - 40) // 8 + 40  # 1/8 of everything but b2
np.testing.assert_allclose(np.array(fsdp_losses), ref_losses, rtol=1e-5)
for a, b in zip(jax.tree.leaves(fsdp_params), jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)

# %%
fig = draw_shardings(fsdp_params, ncols=4)
assert "dev 3\n(8, 256)\n8.0 KiB" in tile_labels(fig)  # device 3 holds rows 24..31 of w1
fig


# %% [markdown]
# `pmap` has no parameter layout to declare: an argument is either mapped (one slice per device) or not.
# To store 1/8 of `w1` per device you stack the slices yourself, gather the full weight inside the step
# with `all_gather`, and deal with the backward pass: the transpose of an all-gather is a
# **reduce-scatter**, a sum over devices of the per-device gradients, so you rescale it into a mean
# yourself (and still `pmean` the replicated `b2`):

# %%
def pmap_fsdp_body(shards, x, y):  # shards: this device's 1/8 of w1, b1, w2, and all of b2
    def local_loss(shards):
        full = {name: jax.lax.all_gather(shards[name], "data", tiled=True) for name in ("w1", "b1", "w2")}
        return loss_fn({**full, "b2": shards["b2"]}, x, y)

    loss, grads = jax.value_and_grad(local_loss)(shards)
    grads = {  # the reduce-scatter gave a sum of 8 per-device gradients: divide by 8
        name: jax.lax.pmean(g, "data") if name == "b2" else g / 8 for name, g in grads.items()
    }
    return sgd(shards, grads), jax.lax.pmean(loss, "data")


shards_stacked = jax.device_put({  # split by hand: device i holds rows 8i..8i+7 of w1, and so on
    "w1": params["w1"].reshape(8, 8, 256),
    "b1": params["b1"].reshape(8, 32),
    "w2": params["w2"].reshape(8, 32, 10),
    "b2": np.stack([params["b2"]] * 8),
}, per_device)
pmap_fsdp = jax.pmap(pmap_fsdp_body, axis_name="data")
pmap_fsdp_shards, pmap_fsdp_losses = train(pmap_fsdp, shards_stacked, x_stacked, y_stacked)
pmap_fsdp_comm = collectives(pmap_fsdp.lower(shards_stacked, x_stacked, y_stacked).compile())
print(pmap_fsdp_comm)

np.testing.assert_allclose([np.asarray(loss)[0] for loss in pmap_fsdp_losses], ref_losses, rtol=1e-5)
w1_rebuilt = np.asarray(pmap_fsdp_shards["w1"]).reshape(64, 256)
np.testing.assert_allclose(w1_rebuilt, ref_params["w1"], rtol=1e-4, atol=1e-6)
assert pmap_fsdp_comm.counts["all-gather"] == 3 and pmap_fsdp_comm.counts["reduce-scatter"] == 3
assert fsdp_comm.counts["all-gather"] >= 3 and fsdp_comm.counts["reduce-scatter"] == 0
assert fsdp_comm.estimated_bytes > pmap_fsdp_comm.estimated_bytes

# %% [markdown]
# It works, and it is a page of code where `jit` needed four specs, with a rescaling that is easy to get
# wrong. Two things to notice in the counts:
#
# - the hand-written version has 3 all-gathers and 3 reduce-scatters, the textbook FSDP pattern;
# - the `jit` version, on this CPU backend, gathers the weights too but sums the gradient with a full
#   all-reduce (plus an all-to-all), so it moves **more** bytes than the hand-written one. The CPU
#   compiler lacks the pass that turns "all-reduce, then keep my slice" into a reduce-scatter; notebook
#   09 takes this apart. So "the compiler generates optimal collectives" is a claim to measure, not to
#   assume.

# %% [markdown]
# ## 9. The guide's table, row by row
#
# The guide compares `pmap` with "SPMD (`jax.jit` + sharding)" in eight rows. Each verdict below rests on
# what this notebook asserted above, and names the sections with the evidence.

# %%
evidence = {
    "same_results": np.array_equal(jit_loss_values, pmap_loss_values),  # sections 2-4
    "same_collectives": collectives(pmap_compiled).counts == collectives(jit_compiled).counts,
    "jit_writes_no_collective": "psum" not in jit_step_jaxpr,
    "pmap_is_jit_shard_map": "shard_map[" in pmap_jaxpr,
    "pmap_one_axis": errors == ["ValueError", "nested"],
    "tp_by_spec": tp_params["w1"].sharding.shard_shape((64, 256)) == (64, 128),
    "fsdp_by_spec": fsdp_bytes < param_bytes / 7,
    "cpu_fsdp_moves_more": fsdp_comm.estimated_bytes > pmap_fsdp_comm.estimated_bytes,
    "no_warning": caught == [],
}
assert all(evidence.values()), evidence

rows = [
    ("Ease of use", "Simple", "Moderate",
     "does not hold for data parallelism: jit runs the single-device step unchanged, no pmean, no device axis", "3"),
    ("Flexibility", "Limited", "Very flexible",
     "holds: pmap maps one leading axis, one slice per device; jit takes any spec on any mesh", "8.1, 8.2"),
    ("Performance", "Good", "Better (optimized collectives)",
     "does not hold as stated: pmap is jit + shard_map; same program, same one all-reduce", "3, 5, 6, 8.3"),
    ("Data parallelism", "Native", "Via P('data')", "holds for both: identical parameters after 5 steps", "2, 3, 4"),
    ("Model parallelism", "Manual", "Via P('model')",
     "holds: with jit it is a spec; with pmap, hand-split weights and psum, and no batch axis left", "8.2"),
    ("FSDP-style", "Hard", "Easy",
     "holds: with pmap, all_gather plus a rescaled reduce-scatter by hand; with jit, specs (check the collectives)",
     "8.3"),
    ("Mixed strategies", "No", "Yes", "holds: nested pmap fails; jit uses a (4, 2) mesh", "8.2"),
    ("Modern JAX", "Legacy", "Recommended",
     "holds: 'Old way of doing parallel map'; no warning yet; for per-device code use shard_map", "5, 7"),
]
for feature, pmap_says, spmd_says, verdict, where in rows:
    print(f"{feature:<18} guide: pmap {pmap_says!r}, SPMD {spmd_says!r}")
    print(f"{'':<18} today: {verdict} [section {where}]")
assert len(rows) == 8

# %% [markdown]
# What the table leaves out matters as much as what it says:
#
# - It has no column for **`shard_map`**, the modern form of pmap's per-device programming. The real
#   choice today is between `jit` (say where the data lives, the compiler writes the collectives) and
#   `shard_map` (write them yourself), and the two compose (notebooks 05 and 06).
# - Its "use pmap when you only need simple data parallelism" advice is outdated: the `jit` version of
#   data parallelism is the *shorter* one, and `pmap` runs `jit` and `shard_map` underneath anyway.
# - "Better performance" is not a property of an API. For data parallelism the three compile to the same
#   program; where they differ (FSDP here), measure the collectives on your backend.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.reveal()` for the reference answer.
#
# **Exercise 1: migrate a pmap step to `jax.jit`.** This linear-regression step was run with
# `jax.pmap(old_step, axis_name='data')` on a weight stacked 8 times, `(8, 16)`, and a batch reshaped
# to `(8, 8, 16)` and `(8, 8)`:
#
# ```python
# def old_step(w, x, y):
#     g = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
#     return w - 0.1 * jax.lax.pmean(g, "data")
# ```
#
# Give a triple `(new_step, w_spec, batch_spec)`: `new_step(w, x, y)` takes the weight `(16,)` and the
# **global** batch `x (64, 16)`, `y (64,)`; the checker places `w` with `NamedSharding(mesh, w_spec)` and
# `x`, `y` with `batch_spec` on a 1-D mesh of the 8 devices with axis `'data'`, runs `jax.jit(new_step)`,
# compares the new weight with the pmap result, and counts the collectives.

# %%
from exercises import ex16_pmap_vs_spmd as ex

answer_1 = NOT_ANSWERED  # e.g. (my_step, P(...), P(...)), with def my_step(w, x, y): ...
ex.migrate_to_jit.check(answer_1);

# %% [markdown]
# **Exercise 2: predict the factor.** On the `(2, 4)` mesh `jax.make_mesh((2, 4), ('data', 'model'),
# axis_types=(AxisType.Auto,) * 2)`, you port a pmap step into `jax.shard_map` with the default
# `check_vma=True`, `in_specs=(P(), P('data'), P('data'))` (parameters replicated, batch split over
# `data` only, so the 4 devices of a `model` group see the same examples) and keep
# `jax.lax.pmean(grads, 'data')`. By what factor is the gradient wrong? The checker measures it.

# %%
answer_2 = NOT_ANSWERED  # a number: ported gradient / true gradient
ex.pmean_factor.check(answer_2);

# %% [markdown]
# **Exercise 3: the per-device view.** An array of shape `(8, 16, 4)` goes through `jax.pmap(f)` on the 8
# devices, and through `jax.shard_map(f, mesh=mesh, in_specs=P('data'), out_specs=P('data'))` on the 1-D
# mesh of section 3. What shape does `f` see in each? Give a pair `(pmap_shape, shard_map_shape)`.

# %%
answer_3 = NOT_ANSWERED  # a pair of shape tuples, e.g. ((...), (...))
ex.per_device_shapes.check(answer_3);

# %% [markdown]
# ## Takeaways
# - One data-parallel step, three ways: `pmap` + `pmean`, `jit` + `NamedSharding` (no collective
#   written), `shard_map` + `pmean` of the loss. Same parameters to the last bit here, and the same single
#   all-reduce in the compiled program.
# - `pmap` is now `jit` around `shard_map(check_vma=False)` on a 1-D mesh; its outputs are ordinary
#   `jax.Array`s with a `NamedSharding` and `(1, ...)` shards. It is "the old way", not yet deprecated.
# - Migrating: blocks keep their rank, `device_put_replicated`/`device_put_sharded` become `jax.device_put`
#   with `P()`/`P('data')`, and **never keep `pmean` of gradients inside `shard_map`**: with the default
#   `check_vma=True` the gradient of a replicated input is already summed, so it comes out N times too
#   large. Differentiate the `pmean`-ed loss instead.
# - The guide's table holds on expressiveness (one axis, tensor parallelism, FSDP, mixed strategies need
#   `jit` or `shard_map`), not on ease of use or performance for data parallelism.
#
# **Next:** [17 · Multi-host SPMD: two processes, one mesh](17_multihost.ipynb)
