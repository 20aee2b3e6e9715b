# %% [markdown]
# # 22 · pmap vs SPMD
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/22_pmap_vs_spmd.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/22_pmap_vs_spmd.ipynb)
#
# `jax.pmap` is now `jax.jit` wrapped around `jax.shard_map`, and the obvious port of a pmap training
# step into `shard_map` runs without a warning while every gradient comes out 8 times too large. Splitting
# the parameters 8 ways, four specs with `jit`, is a page of hand-written collectives with `pmap`.
#
# **You need:** notebooks 06 (`jax.shard_map`, `check_vma`) and 07 (data parallelism with `jax.jit`),
# and 08 (tensor parallelism) for section 7.
#
# If you are migrating from `pmap`, start here after notebook 07. Sections 1-6 are the port. Section 7
# shows why you will not want to go back, and it can wait until you have read 08. An optional appendix
# after the exercises writes FSDP (notebook 10) with `pmap` by hand.
#
# **You will learn**
# - how the same step written with `pmap`, `jit` and `shard_map` relate;
# - that a `pmap` output is an ordinary `jax.Array` with a `NamedSharding`, and why nested `pmap` fails;
# - the migration recipe: `pmap`'s arguments as specs, blocks that keep their rank, `jax.device_put`,
#   and why `pmean` of gradients inside `shard_map` must go;
# - what needs `jit` or `shard_map`: a second mesh axis, and (in the appendix) sharded parameters.

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

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (NOT_ANSWERED, assert_close, collectives, draw_sharding, draw_shardings, quiet, shard_table,
                   tpu_compiler_available, type_string)



def assert_same(a, b, *, exact=False):
    """Equal pytrees of arrays: bit for bit if `exact` and on the CPU backend, else within RTOL."""
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if exact and CPU:
            np.testing.assert_array_equal(u, v)
        else:
            assert_close(u, v, atol=RTOL / 10)

# %% [markdown]
# ## 1. The model, the data, and a single-device reference
#
# pmap code is usually pure functions of a parameter pytree, so here the MLP of notebooks 07 to 10 is
# pure JAX: 64 examples of 64 features labelled by a random teacher, a
# `64 -> 256 -> 10` MLP whose parameters are a dict of four arrays, and plain SGD. `step` is written for
# **one** device, and its run is the reference that every parallel version must match.

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
param_bytes = sum(a.nbytes for a in params.values())
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
# `pmap` runs a function once per device. Every argument gets a **leading axis** of size 8: device `i`
# gets slice `i`, without that axis, and talks to the others through collectives named by `axis_name`.
# Here `jax.lax.pmean` averages the gradients. So the inputs are stacked: 8 copies of every parameter,
# and the batch reshaped to `(8, 8, 64)`, placed with `P('data')` on the leading axis of a 1-D mesh (the
# layout `pmap` itself uses, section 5). `pmap` takes devices in id order, `jax.make_mesh` by position on
# a TPU board (notebook 01): pass `devices=` the mesh's, so both agree on which device gets slice `i`.

# %%
def pmap_body(p, x, y):  # runs on each device: x (8, 64), y (8,), p one full copy of the parameters
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)  # the mean over this device's 8 examples
    grads = jax.lax.pmean(grads, axis_name="data")  # average over the 8 devices
    return sgd(p, grads), jax.lax.pmean(loss, axis_name="data")


mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
on_mesh = mesh.devices.tolist()  # for pmap: the mesh's devices, in the mesh's order
pmap_step = jax.pmap(pmap_body, axis_name="data", devices=on_mesh)
split_data = NamedSharding(mesh, P("data"))  # slice i of the leading axis on the mesh's device i
params_stacked = jax.device_put({k: np.stack([a] * 8) for k, a in params.items()}, split_data)
x_stacked = jax.device_put(x.reshape(8, 8, 64), split_data)  # the i-th device gets examples 8i .. 8i+7
y_stacked = jax.device_put(y.reshape(8, 8), split_data)

pmap_params, pmap_losses = train(pmap_step, params_stacked, x_stacked, y_stacked)
pmap_losses = np.array([np.asarray(loss) for loss in pmap_losses])  # (5 steps, 8 devices)
print("w1 comes back as", pmap_params["w1"].shape, "(one copy per device)")
print("pmap losses:", np.round(pmap_losses[:, 0], 4))

pmap_copy = jax.tree.map(lambda a: np.asarray(a)[0], pmap_params)  # the first device's copy
by_default = jax.pmap(lambda a: a)(np.zeros(8, np.float32)).sharding.mesh.device_ids.tolist()
print("pmap's devices by default:", by_default, "| given the mesh's:",
      pmap_params["w1"].sharding.mesh.device_ids.tolist())
assert by_default == sorted(by_default) and pmap_params["w1"].sharding.mesh.devices.tolist() == on_mesh
for a in jax.tree.leaves(pmap_params):  # the 8 copies stayed identical
    assert_same(np.asarray(a), np.broadcast_to(np.asarray(a)[0], a.shape), exact=True)
assert_same(pmap_losses[:, 0], ref_losses)
assert_same(pmap_copy, ref_params)

# %% [markdown]
# The mean of 8 per-device means of 8 examples is the mean over all 64, so the step matches one device's.
#
# ## 3. Way 2: `jax.jit` with `NamedSharding`
#
# With `jax.jit` there is no per-device program: keep the single-device `step` and say where the data
# lives: parameters replicated (`P()`), batch split over `data` (`P('data')`). The compiler sees
# a mean over a split batch and inserts the sum over devices itself (notebook 07).

# %%
replicated = NamedSharding(mesh, P())
params_repl = jax.device_put(params, replicated)
x_dp, y_dp = jax.device_put(x, split_data), jax.device_put(y, split_data)
print("x:", type_string(x_dp), " w1:", type_string(params_repl["w1"]))

jit_step = jax.jit(step)  # the single-device step, unchanged
jit_params, jit_losses = train(jit_step, params_repl, x_dp, y_dp)

assert jit_params["w1"].sharding.is_fully_replicated  # parameters stay replicated
assert_same(np.array(jit_losses), pmap_losses[:, 0], exact=True)
assert_same(jit_params, pmap_copy, exact=True)

# %% [markdown]
# Both hold the same bytes on the same devices. The only difference is that pmap's version has a leading
# device axis of size 1 in each block:

# %%
assert shard_table(x_stacked).bytes_per_device == shard_table(x_dp).bytes_per_device  # 2 KiB each
draw_sharding(x_stacked, dims=(0, 1))  # pmap's stacked batch: dims 0 and 1 drawn, each block holds all 64 features

# %%
draw_sharding(x_dp)  # jit's global batch

# %% [markdown]
# ## 4. Way 3: `jax.shard_map`
#
# `jax.shard_map` (notebook 06) is the current way to write a per-device program: each device gets a
# **block** of a global array, cut by a `PartitionSpec` on a mesh. This step differentiates the loss
# averaged over devices (`pmean` of the loss, not of the gradients), for a reason section 6.3 shows.

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
assert_same(np.array(shmap_losses), pmap_losses[:, 0], exact=True)
assert_same(shmap_params, pmap_copy, exact=True)

# %% [markdown]
# On the CPU backend the three agree to the last bit after 5 steps. On an accelerator they agree to
# rounding, because its compiler may order the sums differently in each version.
#
# > **You will see this online:** "use `pmap` when you only need simple data parallelism; `jit` with
# > shardings is for bigger models."
#
# Count the sums over devices (`psum`) in each version's jaxpr and the all-reduces in its compiled
# program:

# %%
versions = {
    "pmap": (pmap_step, (params_stacked, x_stacked, y_stacked)),
    "jit": (jit_step, (params_repl, x_dp, y_dp)),
    "shard_map": (shmap_step, (params_repl, x_dp, y_dp)),
}
written, compiled = {}, {}
for name, (fn, args) in versions.items():
    written[name] = jax.make_jaxpr(fn)(*args).pretty_print(use_color=False).count("psum")
    compiled[name] = collectives(fn.lower(*args).compile())
    print(f"{name:<10} jaxpr: {written[name]} psums   compiled: {compiled[name].counts['all-reduce']} all-reduce "
          f"of {compiled[name].result_bytes:,} bytes")

assert written["jit"] == 0 and written["pmap"] > 0 and written["shard_map"] > 0
for comm in compiled.values():  # one sum over devices of every gradient, and the loss: 76,840 + 4 bytes
    assert comm.kinds == {"all-reduce"} and comm.result_bytes == param_bytes + 4

# %% [markdown]
# The `jit` version is the *shorter* one: the single-device step plus two shardings, and the same
# compiled all-reduce. Use `jit` for data parallelism (notebook 07), `shard_map` where you need
# per-device code.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §4: how many all-reduces each version compiles to
all_reduces = {name: comm.count() for name, comm in compiled.items()}
print("all-reduce ops in each compiled version (this backend's compiler):", all_reduces)
if CPU:  # the CPU compiler combines the sums of all gradients and the loss into one op
    assert all_reduces == {"pmap": 1, "jit": 1, "shard_map": 1}

# %% [markdown]
# ## 5. Under the hood: `pmap` is `jit` around `shard_map`
#
# Since JAX 0.8.0, `jax.pmap` is built from the other two, and the option that brought back the old one,
# `jax_pmap_shmap_merge`, is gone. Its jaxpr shows a `jit` wrapping a `shard_map` over a 1-D mesh named
# after `axis_name`, with the replication check off (`check_vma=False`), and a `squeeze` that removes the
# leading axis of size 1 from each block:

# %%
pmap_jaxpr = jax.make_jaxpr(jax.pmap(lambda a: a * 2, axis_name="data"))(jnp.ones((8, 3)))
pmap_jaxpr = pmap_jaxpr.pretty_print(use_color=False)
print(pmap_jaxpr)
for piece in ("jit[", "shard_map[", "check_vma=False", "in_specs=(P('data',),)", "squeeze"):
    assert piece in pmap_jaxpr, piece
try:
    jax.config.update("jax_pmap_shmap_merge", False)  # the old opt-out
    opt_out = "accepted"
except AttributeError as err:
    opt_out = "gone"
    print("AttributeError:", err)
assert opt_out == "gone"

# %% [markdown]
# So a pmap output is an ordinary `jax.Array` with a `NamedSharding` that splits its leading axis over
# the 8 devices in blocks of size 1:

# %%
out = pmap_params["w1"]
print(type_string(out), out.sharding)
assert isinstance(out.sharding, NamedSharding) and out.sharding.spec == P("data")
assert shard_table(out).shard_shapes == {(1, 64, 256)}

# %% [markdown]
# Its docstring calls it the old way and points to `jax.shard_map` or `jax.smap` (a `shard_map` over one
# mesh axis at a time), yet calling it raises no warning: `pmap` is in maintenance mode, not deprecated.

# %%
print(jax.pmap.__doc__.strip().splitlines()[0])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    jax.block_until_ready(pmap_step(params_stacked, x_stacked, y_stacked))
print("warnings when calling pmap:", len(caught))
assert jax.pmap.__doc__.strip().startswith("Old way of doing parallel map. Use :py:func:`jax.shard_map` instead.")
assert "``jax.smap``" in jax.pmap.__doc__ and callable(jax.smap)
assert caught == []

# %% [markdown]
# ## 6. Migrating pmap code
#
# pmap code moves one of two ways: to `jit` with shardings (section 3), which deletes the per-device
# code, or to `shard_map` (section 4), which keeps it. `pmap`'s arguments become specs:
#
# | `pmap` | `jit` and `shard_map` |
# |---|---|
# | `in_axes=0`: stacked, slice `i` on device `i` | `P('data')` on the global array |
# | `in_axes=None`: one value for all | `P()` |
# | `out_axes=None`: an output equal everywhere | `out_specs=P()` |
# | `static_broadcasted_argnums` | `jax.jit(..., static_argnums=...)` |
# | one key per device, stacked | one key at `P()`, then `jax.random.fold_in(key, jax.lax.axis_index('data'))` |
#
# One function, both ways, with the same random numbers on each device:

# %%
def noisy_sum(w, rows, scale, key):  # w, key: the same everywhere; scale: a Python number
    noise = jax.random.normal(jax.random.fold_in(key, jax.lax.axis_index("data")), rows.shape)
    return jax.lax.psum(rows @ w, "data") * scale, rows + noise


w3, rows8, key = jnp.arange(3.0), jnp.arange(24.0).reshape(8, 3), jax.random.key(0)
old = jax.pmap(noisy_sum, axis_name="data", in_axes=(None, 0, None, None), out_axes=(None, 0),
               static_broadcasted_argnums=2, devices=on_mesh)
new = jax.jit(lambda w, rows, scale, key: jax.shard_map(
    lambda w, rows, key: noisy_sum(w, rows, scale, key), mesh=mesh,
    in_specs=(P(), P("data"), P()), out_specs=(P(), P("data")))(w, rows, key), static_argnums=2)
(old_sum, old_rows), (new_sum, new_rows) = old(w3, rows8, 2.0, key), new(w3, rows8, 2.0, key)
print("pmap:", type_string(old_sum), float(old_sum), "| shard_map:", type_string(new_sum), float(new_sum[0]))
assert float(old_sum) == float(new_sum[0]) and old_sum.sharding.is_fully_replicated  # blocks keep rank: (1,)
np.testing.assert_array_equal(old_rows, new_rows)  # the same noise on each device
assert len({tuple(r) for r in np.asarray(new_rows - rows8)}) == 8  # and different noise on each

# %% [markdown]
# Three more things change on the way.
#
# ### 6.1 The per-device view keeps its rank
#
# `pmap` removes the mapped axis: with an `(8, 3)` input, the function sees shape `(3,)`. `shard_map`
# hands each device a block with every dimension: `(1, 3)`. Code that indexes `x[0]` or reshapes by
# rank has to change.

# %%
seen = {}


def record(name):
    def f(block):
        seen[name] = block.shape  # runs at trace time
        return block

    return f


a = jnp.arange(24.0).reshape(8, 3)
jax.pmap(record("pmap"))(a)
jax.shard_map(record("shard_map"), mesh=mesh, in_specs=P("data"), out_specs=P("data"))(a)
print(seen)
assert seen == {"pmap": (3,), "shard_map": (1, 3)}

# %% [markdown]
# ### 6.2 Placing the inputs
#
# > **You will see this online:**
# > ```python
# > params = jax.device_put_replicated(params, jax.devices())
# > batch = jax.device_put_sharded(list(batch.reshape(8, 8, 64)), jax.devices())
# > ```

# %%
online = {
    "device_put_replicated": lambda: jax.device_put_replicated(params, jax.devices()),
    "device_put_sharded": lambda: jax.device_put_sharded(list(x.reshape(8, 8, 64)), jax.devices()),
}
raised = []
for name, snippet in online.items():
    try:
        snippet()
    except AttributeError as err:
        raised.append(name)
        print(f"AttributeError: {err}\n")
assert raised == ["device_put_replicated", "device_put_sharded"]

# %% [markdown]
# > **You will see this online:** Flax's `jax_utils.replicate(state)`, `jax_utils.unreplicate(state)` and
# > `training.common_utils.shard(batch)`. Flax 0.12 keeps them, without a warning:
# >
# > | helper | what it does |
# > |---|---|
# > | `replicate(state)` | stacks a copy per device (pmap's layout) |
# > | `unreplicate(state)` | takes copy 0 back |
# > | `shard(batch)` | reshapes a NumPy batch to `(devices, rows per device, ...)` |

# %%
from flax import jax_utils
from flax.training import common_utils

n = jax.local_device_count()
with warnings.catch_warnings(record=True) as caught_flax:
    warnings.simplefilter("always")
    stacked, batch = jax_utils.replicate(params), common_utils.shard(x)
    back = jax_utils.unreplicate(stacked)
print("replicate:", type_string(stacked["w1"]), "| unreplicate:", back["w1"].shape, "| shard:",
      type(batch).__name__, batch.shape)
assert caught_flax == [] and stacked["w1"].shape == (n, 64, 256) and back["w1"].shape == (64, 256)
assert isinstance(batch, np.ndarray) and batch.shape == (n, 64 // n, 64)

# %% [markdown]
# For placement, `jax.device_put` with a `NamedSharding` of the **global** array, no device axis, replaces
# them all: `P()` replicates, `P('data')` splits (section 3). To keep a pmap
# function for a while, give it the stacked array at `P('data')` (section 2); its output has that very
# layout. Given no `axis_name`, `pmap` names its mesh axis `_internal_pmap_axis_name`, as the type shows.
# So compare the layouts with `is_equivalent_to`, which looks at blocks and devices, not at names:

# %%
b2_repl = jax.device_put(params["b2"], NamedSharding(mesh, P()))  # was: device_put_replicated
b2_stacked = jax.device_put(np.stack([params["b2"]] * 8), NamedSharding(mesh, P("data")))  # for pmap
b2_out = jax.pmap(lambda b: b + 1, devices=on_mesh)(b2_stacked)
for name, arr in (("replicated", b2_repl), ("for pmap", b2_stacked), ("from pmap", b2_out)):
    print(f"{name:<11}{type_string(arr):<16} per device {shard_table(arr).shard_shapes}")
assert b2_repl.sharding.is_fully_replicated and shard_table(b2_stacked).shard_shapes == {(1, 10)}
assert b2_out.sharding.mesh.axis_names != b2_stacked.sharding.mesh.axis_names  # another name ...
assert b2_out.sharding.is_equivalent_to(b2_stacked.sharding, 2)  # ... the same layout

# %% [markdown]
# ### 6.3 Gotcha: `pmean` of the gradients inside `shard_map`
#
# The obvious port keeps the pmap body, `pmean` of the gradients included, and wraps it in
# `jax.shard_map`. It runs without an error or a warning. Compare its gradient with the true gradient
# of the mean loss over all 64 examples:

# %%
def grads_with_pmean(p, x, y):  # the pmap body's gradient line, unchanged
    return jax.lax.pmean(jax.grad(loss_fn)(p, x, y), axis_name="data")


ported = jax.jit(jax.shard_map(grads_with_pmean, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P()))
with warnings.catch_warnings(record=True) as caught_port:
    warnings.simplefilter("always")
    g_ported = ported(params_repl, x_dp, y_dp)
g_true = jax.jit(jax.grad(loss_fn))(params, x, y)  # the gradient of the mean loss over all 64 examples
for name in g_true:
    print(f"{name}: |ported| / |true| = {np.linalg.norm(g_ported[name]) / np.linalg.norm(g_true[name]):.3f}")
assert caught_port == []  # no error, no warning
assert_same(g_ported, jax.tree.map(lambda g: 8 * g, g_true))

# %% [markdown]
# Every gradient is **8 times** too large. Trained with it, each step is SGD at 8 times the learning
# rate, and the loss goes *up* after the first step:

# %%
ported_step = jax.jit(jax.shard_map(pmap_body, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P())))
_, ported_losses = train(ported_step, params_repl, x_dp, y_dp)
ported_losses = np.array(ported_losses)
print("correct losses:", np.round(pmap_losses[:, 0], 2))
print("ported losses: ", np.round(ported_losses, 2))
assert ported_losses[1] > ported_losses[0] > pmap_losses[1, 0]  # up, where it should go down

# %% [markdown]
# A loss curve is still a poor detector. For SGD a constant factor on every gradient is the same as a larger
# learning rate, so a model that tolerates the larger rate trains on and hides the bug. After a port,
# compare **gradients**, as the cell above does.
#
# **Why.** With `check_vma=True` (the default) `shard_map` tracks which values vary across devices.
# Combining the replicated parameters with the varying batch block inserts an implicit cast to "varying"
# (`pvary`), whose transpose in the backward pass is a **sum over devices** (`psum_invariant`). So `jax.grad` inside `shard_map` already returns the sum of the 8 per-device
# gradients, and `pmean` of a value equal everywhere changes nothing: 8 means summed, 8 times the mean.
# The bare gradient's jaxpr shows both halves:

# %%
def grads_only(p, x, y):
    return jax.grad(loss_fn)(p, x, y)


grads_shmap = jax.shard_map(grads_only, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P())
lines = [line.strip() for line in jax.make_jaxpr(grads_shmap)(params_repl, x_dp, y_dp).pretty_print(
    use_color=False).splitlines()]
casts = [line for line in lines if "pvary" in line and "f32[64,256]" in line]  # w1 cast to varying
sums = [line for line in lines if "psum_invariant" in line]
print("forward, w1 cast to varying:\n  " + "\n  ".join(casts))
print("backward, sums over devices:\n  " + "\n  ".join(sums))
assert len(casts) == 1 and len(sums) == 4  # one sum over devices per parameter
assert_same(jax.jit(grads_shmap)(params_repl, x_dp, y_dp), g_ported)  # summed already; pmean kept the sum

# %% [markdown]
# `pmap` never showed this because it runs `shard_map` with the check off (`check_vma=False`,
# section 5): no implicit cast, the per-device gradient, and a `pmean` that is needed. Two fixes:
#
# - **Fix A:** keep the pmap body and pass `check_vma=False`, as `pmap` does. Quick, but you lose the
#   check that catches wrong `out_specs` (notebook 06).
# - **Fix B (the `shard_map` way):** keep the check, differentiate the loss averaged over devices, and
#   drop the `pmean` of the gradients: `shard_map_body` in section 4.

# %%
fix_a = jax.jit(jax.shard_map(pmap_body, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()),
                              check_vma=False))
fix_a_params, fix_a_losses = train(fix_a, params_repl, x_dp, y_dp)
print("fix A losses:", np.round(np.array(fix_a_losses), 4))
print("fix B losses:", np.round(np.array(shmap_losses), 4))
for fixed in (fix_a_params, shmap_params):  # fix B is section 4's step
    assert_same(fixed, pmap_copy, exact=True)

# %% [markdown]
# The factor is the size of the mesh axes the loss varies over, not the device count (exercise 2).
#
# ## 7. What `pmap` cannot express
#
# ### 7.1 One leading axis, at most one slice per device
#
# `pmap` maps the leading axis, one slice per device. A batch of 16 rows on 8 devices, which `jit`
# splits into blocks of 2, fails at the `squeeze` of section 5, because each device would get 2 slices. A
# batch of 4 runs on 4 devices and leaves the other 4 idle:

# %%
rows16 = jnp.ones((16, 3))
try:
    jax.pmap(lambda r: r * 2)(rows16)
    squeeze_failed = False
except ValueError as err:
    squeeze_failed = True
    print("ValueError:", err)

doubled = jax.jit(lambda r: r * 2)(jax.device_put(rows16, split_data))
four = jax.pmap(lambda r: r * 2)(jnp.ones((4, 3)))
print("jit:", type_string(doubled), "blocks", shard_table(doubled).shard_shapes)
print("pmap over 4 rows: devices used", len(four.sharding.device_set))
assert squeeze_failed and shard_table(doubled).shard_shapes == {(2, 3)}
assert len(four.sharding.device_set) == 4

# %% [markdown]
# ### 7.2 A second mesh axis
#
# With `jit`, splitting the hidden layer over a `model` axis while the batch stays split over `data`
# is a choice of specs on a `(4, 2)` mesh (notebooks 08 and 09): `w1` by columns, `w2` by rows, the
# same `step`.

# %%
mesh_2d = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
tp_specs = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}
tp_shardings = jax.tree.map(lambda spec: NamedSharding(mesh_2d, spec), tp_specs)
params_tp = jax.device_put(params, tp_shardings)
x_2d, y_2d = (jax.device_put(a, NamedSharding(mesh_2d, P("data"))) for a in (x, y))

tp_step = jax.jit(step, out_shardings=(tp_shardings, NamedSharding(mesh_2d, P())))
tp_params, tp_losses = train(tp_step, params_tp, x_2d, y_2d)
tp_comm = collectives(tp_step.lower(params_tp, x_2d, y_2d).compile())
print(tp_comm)

tp_bytes = sum(shard_table(a).bytes_per_device[0] for a in jax.tree.leaves(tp_params))
print(f"parameter bytes on device 0: {tp_bytes:,} of {param_bytes:,}")
assert tp_bytes == (64 * 128 + 128 + 128 * 10 + 10) * 4  # half of w1, b1, w2; all of b2
assert {op.group_size for op in tp_comm.ops if op.kind == "all-reduce"} >= {2, 4}  # sums over 'model' (2), 'data' (4)
assert_same(np.array(tp_losses), ref_losses)
draw_shardings(tp_params, ncols=4)

# %% [markdown]
# The compiler inserted two kinds of sum:
#
# | over | group size | what it sums |
# |---|---|---|
# | `model` | 2 | the halves of the second layer's product |
# | `data` | 4 | the gradients of each device's half of the parameters |
#
# `pmap` has one axis. A second used to be a `pmap` inside a `pmap`, and `pmap`'s docstring still
# documents nesting. Today it fails, because the inner `pmap` builds its own 1-D mesh inside the outer
# one's:

# %%
doc = " ".join(jax.pmap.__doc__.split())
nesting = ("For nested :py:func:`pmap` calls, the product of the mapped axis sizes must be less than or equal "
           "to the number of XLA devices.")
print("docstring:", nesting)
try:
    jax.pmap(jax.pmap(lambda a: jax.lax.psum(a, "model"), axis_name="model"), axis_name="data")(jnp.ones((4, 2, 3)))
    nested_failed = False
except ValueError as err:
    nested_failed = True
    print("ValueError:", str(err).splitlines()[0][:300])
assert nesting in doc and nested_failed

# %% [markdown]
# A regression of the move onto `shard_map` in JAX 0.8.0 (the
# [migration guide](https://docs.jax.dev/en/latest/migrate_pmap.html) calls the new `pmap` "not a
# perfect replacement"): use a 2-D mesh with `jit`, or a `shard_map` over both axes.

# %% [markdown]
# ## Takeaways
# - One data-parallel step can be `pmap` + `pmean`, `jit` + `NamedSharding`, or `shard_map` + `pmean` of
#   the loss. All three give the same parameters and the same all-reduce, and `jit` is the shortest.
# - `pmap` is `jit` around `shard_map(check_vma=False)` on a 1-D mesh, and returns ordinary `jax.Array`s
#   with `(1, ...)` blocks. Nesting it fails, though its docstring documents it.
# - Migrating: `in_axes` become specs, blocks keep their rank, and placement is `jax.device_put` with
#   `P()` or `P('data')`. **Never keep `pmean` of gradients inside `shard_map`**: the gradient of a
#   replicated input is already summed there, so it comes out N times too large. Differentiate the
#   `pmean`-ed loss instead.
# - A second mesh axis is a choice of specs with `jit` and impossible with today's `pmap`, because
#   nesting fails. Sharded parameters (FSDP, the appendix) are specs with `jit` and a page of
#   hand-written collectives with `pmap`. `jit`'s collectives depend on the compiler: read them.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1: migrate a pmap step to `jax.jit`.** This linear-regression step ran as
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
# **global** batch `x (64, 16)`, `y (64,)`. The checker places `w` by `w_spec`, `x` by `batch_spec` and
# `y` by its first entry on a 1-D mesh `('data',)`, runs `jax.jit(new_step)`, and checks the new weight
# against pmap's and the collectives.

# %%
from spmd_course.exercises import ex22_pmap_vs_spmd as ex

answer_1 = NOT_ANSWERED  # e.g. (my_step, P(...), P(...)), with def my_step(w, x, y): ...
ex.migrate_to_jit.check(answer_1);

# %% [markdown]
# **Exercise 2: predict the factor.** On the mesh `jax.make_mesh((2, 4), ('data', 'model'),
# axis_types=(AxisType.Auto,) * 2)`, you port a pmap step into `jax.shard_map` with the default
# `check_vma=True`, `in_specs=(P(), P('data'), P('data'))` (parameters replicated, batch split over
# `data` only, so the 4 devices of a `model` group see the same examples), and keep
# `jax.lax.pmean(grads, 'data')`. By what factor is the gradient wrong? The checker measures it.

# %%
answer_2 = NOT_ANSWERED  # a number: ported gradient / true gradient
ex.pmean_factor.check(answer_2);

# %% [markdown]
# **Next:** [23 · Multi-host SPMD: two processes, one mesh](23_multihost.ipynb), or first the optional
# appendix below.

# %% [markdown]
# ## Appendix (optional): FSDP with `pmap`, by hand
#
# Skip this on a first reading. Notebook 10 teaches FSDP and reads its compiled step. This appendix only
# shows what the same strategy costs you in `pmap`'s terms, because `pmap` has no way to declare that a
# parameter is split.
#
# FSDP splits the parameters themselves, so each device stores about 1/8 of them. The axis that splits
# them is the one that splits the batch. Notebook 10 names it `fsdp`, and here it keeps the name `data`,
# because it is the mesh of sections 2 to 6. With `jit` the layout is four specs (`b2`, 10 numbers, stays
# whole):

# %%
fsdp_specs = {"w1": P("data", None), "b1": P("data"), "w2": P("data", None), "b2": P()}
fsdp_shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), fsdp_specs)
params_fsdp = jax.device_put(params, fsdp_shardings)

fsdp_step = jax.jit(step, out_shardings=(fsdp_shardings, replicated))
fsdp_params, fsdp_losses = train(fsdp_step, params_fsdp, x_dp, y_dp)
fsdp_comm = collectives(fsdp_step.lower(params_fsdp, x_dp, y_dp).compile())

fsdp_bytes = sum(shard_table(a).bytes_per_device[0] for a in jax.tree.leaves(fsdp_params))
print(f"parameter bytes on device 0: {fsdp_bytes:,} of {param_bytes:,}")
assert fsdp_bytes == (param_bytes - 40) // 8 + 40  # 1/8 of everything but b2
assert_same(np.array(fsdp_losses), ref_losses)

# %% [markdown]
# `pmap` has no parameter layout to declare: an argument is mapped or not. To store 1/8 of `w1` per
# device you stack the slices yourself, gather each weight inside the step with `all_gather`, and
# handle the backward pass: the transpose of an all-gather is a **reduce-scatter**, a *sum* of the
# per-device gradients, which you rescale into a mean (and `b2` still needs its `pmean`):

# %%
def pmap_fsdp_body(shards, x, y):  # shards: this device's 1/8 of w1, b1, w2, and all of b2
    def local_loss(shards):
        full = {name: jax.lax.all_gather(shards[name], "data", tiled=True) for name in ("w1", "b1", "w2")}
        return loss_fn({**full, "b2": shards["b2"]}, x, y)

    loss, grads = jax.value_and_grad(local_loss)(shards)
    grads = {name: jax.lax.pmean(g, "data") if name == "b2" else g / 8 for name, g in grads.items()}
    return sgd(shards, grads), jax.lax.pmean(loss, "data")


shards_stacked = jax.device_put({  # split by hand: the i-th device holds rows 8i..8i+7 of w1, and so on
    "w1": params["w1"].reshape(8, 8, 256),
    "b1": params["b1"].reshape(8, 32),
    "w2": params["w2"].reshape(8, 32, 10),
    "b2": np.stack([params["b2"]] * 8),
}, split_data)
pmap_fsdp = jax.pmap(pmap_fsdp_body, axis_name="data", devices=on_mesh)
_, pmap_fsdp_losses = train(pmap_fsdp, shards_stacked, x_stacked, y_stacked)
pmap_fsdp_comm = collectives(pmap_fsdp.lower(shards_stacked, x_stacked, y_stacked).compile())

assert_same(np.array([np.asarray(loss)[0] for loss in pmap_fsdp_losses]), ref_losses)
assert {"all-gather", "reduce-scatter"} <= pmap_fsdp_comm.kinds  # what you wrote, and its transpose

# %% [markdown]
# That is a page of code where `jit` needed four specs, with a rescaling that is easy to get wrong. The
# tables below compare three programs: `jit`'s FSDP step compiled here, the hand-written one, and `jit`'s
# compiled ahead of time for a TPU v5e-8 (`v5e:2x4`, with libtpu and no TPU). Their byte totals are
# ring-formula estimates, not measurements.

# %%
print(f"jit, {jax.default_backend()}:", fsdp_comm, sep="\n")
print(f"\npmap by hand, {jax.default_backend()}:", pmap_fsdp_comm, sep="\n")

ok, why = tpu_compiler_available()
if not ok:
    print(f"\n{why}")
else:
    with quiet():
        topo = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")
        tpu_mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,), devices=topo.devices)

        def on_tpu(spec, a):
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(tpu_mesh, spec))

        tpu_fsdp = jax.jit(step, out_shardings=(jax.tree.map(lambda s: NamedSharding(tpu_mesh, s), fsdp_specs),
                                                NamedSharding(tpu_mesh, P())))
        tpu_comm = collectives(tpu_fsdp.lower(jax.tree.map(on_tpu, fsdp_specs, params), on_tpu(P("data"), x),
                                              on_tpu(P("data"), y)).compile())
    print("\njit, TPU v5e:2x4 (compiled ahead of time):", tpu_comm, sep="\n")
    reduce_scatters = [op.result_type for op in tpu_comm.ops if op.kind == "reduce-scatter"]
    assert reduce_scatters == ["f32[8,256]"]  # only w1's gradient: device i keeps rows 8i..8i+7 of the sum
    assert any((256, 10) in op.shapes for op in tpu_comm.ops if op.kind == "all-reduce")  # w2's: all of it
    assert all(op.result_type.startswith("bf16") for op in tpu_comm.ops if op.kind == "all-gather")

# %% [markdown]
# Reading the three tables:
#
# - **By hand:** 3 all-gathers of the weights, 3 reduce-scatters of their gradients: textbook FSDP.
# - **`jit`, CPU backend:** the weights gathered too, plus an all-gather of the logits' size and an
#   all-to-all where propagation re-cuts values. Every gradient is summed by one all-reduce (76,844 bytes)
#   and then sliced, so its estimate exceeds the hand-written one's.
# - **`jit`, TPU:** only `w1`'s gradient is reduce-scattered (`f32[8,256]`), and the others are all-reduced.
#   The all-gathers are bf16 (the TPU's default matmul precision): half the bytes.
#
# How good `jit`'s collectives are depends on the compiler: read the program compiled for your machine
# (notebook 21: TPU pods).

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, appendix: its FSDP programs, by jit and by hand
if CPU:
    (all_reduce,) = [op for op in fsdp_comm.ops if op.kind == "all-reduce"]
    assert {kind: k for kind, k in fsdp_comm.counts.items() if k} == {"all-gather": 4, "all-to-all": 1, "all-reduce": 1}
    assert all_reduce.result_bytes == param_bytes + 4  # every gradient, and the loss
    assert pmap_fsdp_comm.counts["all-gather"] == 3 and pmap_fsdp_comm.counts["reduce-scatter"] == 3
    assert fsdp_comm.estimated_bytes > pmap_fsdp_comm.estimated_bytes
    print(f"CPU compiler, ring estimates: jit {fsdp_comm.estimated_bytes:,.0f} B, by hand "
          f"{pmap_fsdp_comm.estimated_bytes:,.0f} B")
