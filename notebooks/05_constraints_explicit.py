# %% [markdown]
# # 05 · Constraints and manual control
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/05_constraints_explicit.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/05_constraints_explicit.ipynb)
#
# Inside `jax.jit` on an Auto mesh the compiler decides the layout of every intermediate value. It
# usually decides well, and sometimes it does not. This notebook shows the two ways to take over: a
# **constraint** (`jax.lax.with_sharding_constraint`) pins the layout of one value and leaves the rest to
# the compiler; **`jax.shard_map`** hands you the per-device program, where you write every collective
# yourself. Each claim is measured in the compiled program: collectives, bytes moved, memory per device.
#
# **You will learn**
# - what `with_sharding_constraint` does, and three cases where it cuts the work or the bytes moved;
# - what is wrong with the seed guide's "Manual Sharding Constraints" snippet, and a corrected train step;
# - the Auto / Explicit / Manual modes: what you write and what the compiler does in each;
# - `jax.shard_map` with `psum`, `all_gather`, `psum_scatter` and `ppermute`, each checked against plain
#   `jnp` and counted in the HLO;
# - what the `check_vma` replication check catches, and the wrong number you get when you turn it off.

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

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import NOT_ANSWERED, collectives, draw_mesh, draw_shardings, memory_per_device, tile_labels, type_string

mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
print(mesh)
draw_mesh(mesh)

# %% [markdown]
# ## 1. `with_sharding_constraint`: pin one value's layout inside `jit`
#
# On an Auto mesh the compiler starts from the shardings it is given (the inputs' shardings, and any
# constraints) and propagates them through the program. Where it is given nothing, nothing gets sharded.
#
# A batch that arrives as a NumPy array carries no sharding. Hand it to `jit` as it is, and the compiler
# keeps it whole on every device: each of the 8 devices receives all 128 rows and does all the work.
# One constraint on the batch inside the function changes that. `jax.lax.with_sharding_constraint(x,
# sharding)` means "at this point of the program, `x` has this sharding": the compiler propagates it
# backwards to the input and forwards through the matmul.

# %%
rng = np.random.default_rng(0)
x_host = rng.normal(size=(128, 256)).astype(np.float32)  # a NumPy batch: no sharding at all
w = jax.device_put(rng.normal(size=(256, 16)).astype(np.float32) / 16, NamedSharding(mesh, P()))


def score(w, x):
    return jnp.mean(jnp.tanh(x @ w))


def score_constrained(w, x):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("data", None)))
    return jnp.mean(jnp.tanh(x @ w))


plain = jax.jit(score).lower(w, x_host).compile()
pinned = jax.jit(score_constrained).lower(w, x_host).compile()
for name, compiled in [("no constraint", plain), ("constraint on x", pinned)]:
    print(f"{name:16} x enters as {compiled.input_shardings[0][1].spec}; {memory_per_device(compiled)}")
    print(collectives(compiled), "\n")

assert plain.input_shardings[0][1].is_fully_replicated  # every device gets the whole batch
assert pinned.input_shardings[0][1].spec == P("data")  # now each device gets 32 rows
assert memory_per_device(plain).argument == (128 * 256 + 256 * 16) * 4  # 144 KiB per device
assert memory_per_device(pinned).argument == (32 * 256 + 256 * 16) * 4  # 48 KiB per device
assert collectives(plain).count() == 0
assert collectives(pinned).counts["all-reduce"] == 1  # the price: one scalar all-reduce for the mean
flops = plain.cost_analysis()["flops"], pinned.cost_analysis()["flops"]  # per device
print(f"work per device: {flops[0] / 1e6:.2f} MFLOP without, {flops[1] / 1e6:.2f} MFLOP with the constraint")
assert 3.9 < flops[0] / flops[1] < 4.1  # a quarter of the work
np.testing.assert_allclose(jax.jit(score_constrained)(w, x_host), np.mean(np.tanh(x_host @ np.asarray(w))), rtol=1e-5)

# %% [markdown]
# The constraint moved no data: the batch was never sharded, so each device just takes its 32 rows. It
# cost one all-reduce of a single float (adding up the four partial sums of the mean) and saved three
# quarters of the work and of the argument memory on every device. The values are the same: a constraint
# never changes *what* is computed, only *where*.

# %% [markdown]
# ## 2. When the compiler's choice is poor: a two-matmul chain
#
# Take `relu(x @ w1) @ w2` with the batch split over `data` and both weights stored split by **rows** over
# `model` (for example, as they came out of a checkpoint). The contracting dimension of both matmuls is
# split on the weight only, so the compiler has to move something. There are two candidates: move the
# weight `w1` into a layout that needs no reduction, or keep the weights where they are and add up partial
# results (an all-reduce of activations). Look at what it picks:

# %%
x = jax.device_put(rng.normal(size=(128, 512)).astype(np.float32), NamedSharding(mesh, P("data", None)))
w1 = jax.device_put(rng.normal(size=(512, 1024)).astype(np.float32) / 20, NamedSharding(mesh, P("model", None)))
w2 = jax.device_put(rng.normal(size=(1024, 512)).astype(np.float32) / 30, NamedSharding(mesh, P("model", None)))


def chain(x, w1, w2):
    h = jax.nn.relu(x @ w1)
    return h @ w2


chosen = jax.jit(chain).lower(x, w1, w2).compile()
print(collectives(chosen))
print(memory_per_device(chosen))


# %% [markdown]
# The compiler moves `w1` with an all-to-all: a buffer the size of a device's whole 1 MiB slice of `w1`,
# half of it sent away. The activations here are much smaller than that weight. Pin the intermediate `h`
# to `P('data', None)` (split by rows, whole columns) and the compiler has no reason to move the weight:

# %%
def chain_constrained(x, w1, w2):
    h = jax.nn.relu(x @ w1)
    h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P("data", None)))
    return h @ w2


pinned = jax.jit(chain_constrained).lower(x, w1, w2).compile()
print(collectives(pinned))
print(memory_per_device(pinned))

a2a = [op for op in collectives(chosen).ops if op.kind == "all-to-all"]
assert collectives(chosen).counts["all-to-all"] == 1 and collectives(chosen).counts["all-reduce"] == 1
assert w1.sharding.shard_shape(w1.shape) == (256, 1024)
assert a2a[0].result_bytes == 256 * 1024 * 4  # the size of w1's whole per-device slice: 1 MiB
assert collectives(pinned).counts["all-to-all"] == 0 and collectives(pinned).counts["all-reduce"] == 2
assert collectives(chosen).estimated_bytes == 576 * 1024 and collectives(pinned).estimated_bytes == 192 * 1024
assert memory_per_device(chosen).temp >= 2 * 1024**2 and memory_per_device(pinned).temp < 260 * 1024
np.testing.assert_allclose(jax.jit(chain_constrained)(x, w1, w2), jax.jit(chain)(x, w1, w2), rtol=1e-4, atol=1e-4)

# %% [markdown]
# One line, a third of the bytes moved (576 KiB → 192 KiB per device) and an eighth of the temporary
# memory (2 MiB → 256 KiB). With the constraint, each device multiplies its half of the columns of `x` by
# its half of the rows of `w1`, and an all-reduce over `model` adds the two halves of `h`; the second
# matmul does the same. The picture shows the layouts involved:

# %%
h_layout = jax.ShapeDtypeStruct((128, 1024), jnp.float32, sharding=NamedSharding(mesh, P("data", None)))
# draw_shardings orders the panels by name, hence the numbers.
fig = draw_shardings({"1: x": x, "2: w1": w1, "3: w2": w2, "4: h (constrained)": h_layout}, ncols=4)
assert "dev 0,1\n(32, 1024)\n128.0 KiB\n2 copies" in tile_labels(fig)  # h: each device holds 32 full rows
fig


# %% [markdown]
# A constraint is a hint with a price, not a free speed-up: pin `h` somewhere silly, e.g. `P(None, 'data')`,
# and the compiler obeys, gathering whole weights onto every device to get there (XLA also prints an
# "Involuntary full rematerialization" warning about `w1` on stderr). Measure before you keep one:

# %%
def chain_badly_pinned(x, w1, w2):
    h = jax.lax.with_sharding_constraint(jax.nn.relu(x @ w1), NamedSharding(mesh, P(None, "data")))
    return h @ w2


bad = jax.jit(chain_badly_pinned).lower(x, w1, w2).compile()
print(collectives(bad))
assert {"f32[512,1024]", "f32[1024,512]"} <= {op.result_type for op in collectives(bad).ops}  # all of w1, w2
assert collectives(bad).estimated_bytes > 4 * collectives(chosen).estimated_bytes


# %% [markdown]
# ## 3. A reshard the compiler does badly, and a waypoint that fixes it
#
# Going from `P('data', None)` to `P(None, 'model')` directly, the compiler falls back to its last resort:
# gather the **whole** array on every device, then cut out the new block. XLA says so on stderr, in C++
# (not a Python warning): `[SPMD] Involuntary full rematerialization`. A constraint to `P('data', 'model')`
# first is free (each device already holds the columns it keeps) and turns the rest into a gather of half
# the columns only:

# %%
def reshard_direct(x):
    return jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, P(None, "model")))


def reshard_waypoint(x):
    y = jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, P("data", "model")))  # a local slice
    return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P(None, "model")))


direct = jax.jit(reshard_direct).lower(x).compile()
waypoint = jax.jit(reshard_waypoint).lower(x).compile()
print("direct:  ", memory_per_device(direct), "\n", collectives(direct), sep="")
print("waypoint:", memory_per_device(waypoint), "\n", collectives(waypoint), sep="")

assert [op.result_type for op in collectives(direct).ops] == ["f32[128,512]"]  # the whole array on every device
assert [op.result_type for op in collectives(waypoint).ops] == ["f32[128,256]"]  # only the columns it keeps
assert collectives(waypoint).estimated_bytes * 2 == collectives(direct).estimated_bytes
assert memory_per_device(waypoint).temp * 8 <= memory_per_device(direct).temp
np.testing.assert_array_equal(jax.jit(reshard_waypoint)(x), jax.jit(reshard_direct)(x))

# %%
waypoint_layout = jax.ShapeDtypeStruct((128, 512), jnp.float32, sharding=NamedSharding(mesh, P("data", "model")))
fig = draw_shardings({"1: x": x, "2: waypoint": waypoint_layout, "3: target": jax.jit(reshard_waypoint)(x)})
assert "dev 0,2,4,6\n(128, 256)\n128.0 KiB\n4 copies" in tile_labels(fig)
fig

# %% [markdown]
# ## 4. Gotcha: the seed's "Manual Sharding Constraints"
#
# The guide that seeded this course offers this snippet to "force specific sharding at any point":
#
# ```python
# from jax.experimental.shard_map import shard_map
# @jax.jit
# def train_step(params, batch):
#     # Ensure batch is data-parallel
#     batch = jax.lax.with_sharding_constraint(batch, NamedSharding(mesh, P('data')))
#     logits = model(params, batch)
#     # Ensure logits are replicated before loss
#     logits = jax.lax.with_sharding_constraint(logits, NamedSharding(mesh, P()))
#     return compute_loss(logits, batch['label'])
# ```
#
# Three things are off. **First, the import.** It is never used in the snippet, and
# `jax.experimental.shard_map` is deprecated: importing from it warns. The API is `jax.shard_map`
# (section 6).

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from jax.experimental.shard_map import shard_map  # noqa: F401  (the seed's import, unused)
for w_ in caught:
    print(f"{w_.category.__name__}: {w_.message}")
assert [w_.category for w_ in caught] == [DeprecationWarning]
assert "jax.experimental.shard_map is deprecated" in str(caught[0].message)

# %% [markdown]
# **Second, `P('data')` on a dict.** `batch` is a dict, not an array. `with_sharding_constraint` takes a
# pytree of shardings, or one sharding that it applies to **every leaf**; on each leaf `P('data')` means
# "split the first dimension over `data`". With the usual `x` of shape `(128, 256)` and `label` of shape
# `(128,)` that happens to be right:

# %%
B, D, C = 128, 256, 16
batch = {"x": jnp.asarray(rng.normal(size=(B, D)), jnp.float32),
         "label": jnp.asarray(rng.integers(0, C, B), jnp.int32)}
params = {"w": rng.normal(size=(D, C)).astype(np.float32) / 16, "b": np.zeros(C, np.float32)}
params = jax.device_put(params, NamedSharding(mesh, P()))

constrain_all = jax.jit(lambda b: jax.lax.with_sharding_constraint(b, NamedSharding(mesh, P("data"))))
out = constrain_all(batch)
for name, leaf in out.items():
    print(f"{name:6} {type_string(leaf):22} block {leaf.sharding.shard_shape(leaf.shape)}")
assert out["x"].sharding.shard_shape((B, D)) == (32, D) and out["label"].sharding.shard_shape((B,)) == (32,)

# %% [markdown]
# It stops being right as soon as a leaf's first dimension is not the batch. A scalar in the batch (a loss
# weight, a step count) is an error; a time-major leaf of shape `(16, 128)` is worse: it is split along
# **time**, silently, because 16 happens to divide by 4.

# %%
raised = []
try:
    constrain_all({**batch, "weight": jnp.float32(1.0)})
except ValueError as err:
    raised.append(type(err).__name__)
    message = str(err)
    print("ValueError: ...", message[message.index("is only valid"):])
    assert "rank 0" in message

out = constrain_all({**batch, "mask_tb": jnp.ones((16, B))})  # time first, batch second
print("mask_tb", type_string(out["mask_tb"]), "block", out["mask_tb"].sharding.shard_shape((16, B)))
assert raised == ["ValueError"]
assert out["mask_tb"].sharding.shard_shape((16, B)) == (4, B)  # 4 time steps, all 128 examples: wrong axis

# The fix: one sharding per leaf, a pytree shaped like the batch. A scalar gets P() (replicated).
per_leaf = {"x": NamedSharding(mesh, P("data", None)), "label": NamedSharding(mesh, P("data")),
            "weight": NamedSharding(mesh, P())}
out = jax.jit(lambda b: jax.lax.with_sharding_constraint(b, per_leaf))({**batch, "weight": jnp.float32(1.0)})
assert out["weight"].sharding.is_fully_replicated and out["x"].sharding.shard_shape((B, D)) == (32, D)


# %% [markdown]
# The fix is to say where the batch dimension is in each leaf, with a dict of shardings shaped like the
# batch, as in the last lines above (exercise 2 asks for the time-major leaf).
#
# **Third, replicating the logits before the loss.** `P()` on the logits makes every device gather all
# 128 rows of logits, then compute the whole loss. Without it, each device computes the loss terms of its
# own 32 rows, and the mean over the batch needs only an all-reduce of one float. Measure both, on the
# loss alone:

# %%
def model(params, batch):
    return batch["x"] @ params["w"] + params["b"]


def compute_loss(logits, labels):
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def seed_loss(params, batch):  # the seed's function, minus the unused import
    batch = jax.lax.with_sharding_constraint(batch, NamedSharding(mesh, P("data")))
    logits = model(params, batch)
    logits = jax.lax.with_sharding_constraint(logits, NamedSharding(mesh, P()))
    return compute_loss(logits, batch["label"])


def sharded_loss(params, batch):
    batch = jax.lax.with_sharding_constraint(batch, NamedSharding(mesh, P("data")))
    return compute_loss(model(params, batch), batch["label"])


batch_dp = jax.device_put(batch, NamedSharding(mesh, P("data")))
seed_c = jax.jit(seed_loss).lower(params, batch_dp).compile()
fixed_c = jax.jit(sharded_loss).lower(params, batch_dp).compile()
print("logits replicated:\n", collectives(seed_c), "\n\nlogits left sharded:\n", collectives(fixed_c), sep="")

assert [(op.kind, op.result_type) for op in collectives(seed_c).ops] == [("all-gather", "f32[128,16]"),
                                                                         ("all-reduce", "f32[]")]
assert [(op.kind, op.result_type) for op in collectives(fixed_c).ops] == [("all-reduce", "f32[]")]
np.testing.assert_allclose(jax.jit(seed_loss)(params, batch_dp), jax.jit(sharded_loss)(params, batch_dp), rtol=1e-6)

# %% [markdown]
# On 8 KiB of logits the gather is cheap (6 KiB moved per device). In a train step it is not: the
# gradient flows back through the replicated logits, so the backward pass sees replicated gradients and
# gathers the **whole batch `x`** to compute the weight gradient. Differentiate both:

# %%
seed_grad = jax.jit(jax.value_and_grad(seed_loss)).lower(params, batch_dp).compile()
fixed_grad = jax.jit(jax.value_and_grad(sharded_loss)).lower(params, batch_dp).compile()
print("logits replicated:\n", collectives(seed_grad), "\n\nlogits left sharded:\n", collectives(fixed_grad), sep="")

assert "f32[128,256]" in [op.result_type for op in collectives(seed_grad).ops]  # the whole batch x, gathered
assert collectives(seed_grad).counts["all-gather"] == 3
assert collectives(fixed_grad).count() == collectives(fixed_grad).counts["all-reduce"] == 1
assert collectives(seed_grad).estimated_bytes > 4 * collectives(fixed_grad).estimated_bytes

# %% [markdown]
# Left sharded, the only collective is the one data parallelism needs: a single all-reduce that carries
# the loss and both gradients, `(f32[], f32[16], f32[16,256])`, summed over the `data` axis. Here is the
# corrected train-step-like function: no stray import, one sharding per leaf, no constraint on the logits,
# and an update so that it is a step.

# %%
batch_shardings = {"x": NamedSharding(mesh, P("data", None)), "label": NamedSharding(mesh, P("data"))}


@jax.jit
def train_step(params, batch):
    batch = jax.lax.with_sharding_constraint(batch, batch_shardings)  # one sharding per leaf

    def loss_fn(params):
        return compute_loss(model(params, batch), batch["label"])

    loss, grads = jax.value_and_grad(loss_fn)(params)
    params = jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)
    return params, loss


step_c = train_step.lower(params, batch).compile()
print(collectives(step_c))
new_params, loss = train_step(params, batch)

# The same step on one device, without any sharding, as the reference:
ref_loss, ref_grads = jax.jit(jax.value_and_grad(lambda p, b: compute_loss(model(p, b), b["label"])))(
    jax.tree.map(np.asarray, params), jax.tree.map(np.asarray, batch))
print(f"loss {float(loss):.4f} (reference {float(ref_loss):.4f})")
assert collectives(step_c).count() == collectives(step_c).counts["all-reduce"] == 1
assert step_c.input_shardings[0][1]["x"].is_equivalent_to(batch_shardings["x"], 2)  # split as it enters
np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
np.testing.assert_allclose(new_params["w"], np.asarray(params["w"]) - 0.5 * ref_grads["w"], rtol=1e-4, atol=1e-6)

# %% [markdown]
# ## 5. Three ways to say where data lives: Auto, Explicit, Manual
#
# | mode | what you write | what the compiler does | where you see the layout |
# |---|---|---|---|
# | **Auto** (`AxisType.Auto`) | shardings of the inputs; optional `with_sharding_constraint` hints inside `jit` | propagates shardings to every value, picks the rest, inserts the collectives | only in the compiled program (`jax.typeof` shows no sharding) |
# | **Explicit** (`AxisType.Explicit`) | shardings are part of the type; `jax.reshard` to change one; `out_sharding=` where a result is ambiguous | follows the types; raises an error where they do not say what to do | `jax.typeof(x)` at trace time: `float32[16@data,8]` |
# | **Manual** (`jax.shard_map`) | a function of one device's block; every collective (`psum`, `all_gather`, ...) by hand | compiles your per-device program as written; adds no collectives | the block shape inside; `{V:data}` marks values that differ across `data` |
#
# The same job in each mode, on a `(16, 8)` array: split it further over `model`, or sum its columns.
# **Auto**: a constraint; the traced type says nothing about sharding.

# %%
x16 = jax.device_put(jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8), NamedSharding(mesh, P("data", None)))
seen = {}


@jax.jit
def auto_mode(a):
    seen["auto in"] = str(jax.typeof(a))
    return jax.lax.with_sharding_constraint(a * 2, NamedSharding(mesh, P("data", "model")))


y = auto_mode(x16)
print(seen, "->", type_string(y))
assert seen["auto in"] == "float32[16,8]" and y.sharding.spec == P("data", "model")

# %% [markdown]
# **Explicit**: the same mesh with Explicit axes. The sharding is in the type, `jax.reshard` changes it,
# `with_sharding_constraint` is refused (it only speaks to Auto axes), and a matmul whose result layout
# the types leave open is an error until you say `out_sharding=`.

# %%
emesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
x16e = jax.device_put(np.asarray(x16), NamedSharding(emesh, P("data", None)))


@jax.jit
def explicit_mode(a):
    seen["explicit in"] = str(jax.typeof(a))
    b = jax.reshard(a * 2, NamedSharding(emesh, P("data", "model")))
    seen["explicit out"] = str(jax.typeof(b))
    return b


ye = explicit_mode(x16e)
print(seen["explicit in"], "->", seen["explicit out"])
assert seen["explicit in"] == "float32[16@data,8]" and seen["explicit out"] == "float32[16@data,8@model]"
np.testing.assert_array_equal(ye, y)

refused = []
try:
    jax.jit(lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(emesh, P("data", "model"))))(x16e)
except ValueError as err:
    refused.append("ValueError")
    print("ValueError:", str(err).split(". ")[0])
assert refused == ["ValueError"]

# Where the types do not say what to do, Explicit mode asks instead of guessing: both operands of this
# matmul are split on the contracting dimension, so the result's layout is ambiguous.
a = jax.device_put(np.ones((16, 8), np.float32), NamedSharding(emesh, P(None, "model")))
b = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(emesh, P("model", None)))
try:
    jax.jit(jnp.matmul)(a, b)
except Exception as err:  # jax._src.core.ShardingTypeError, not exported under jax.errors
    refused.append(type(err).__name__)
    print(f"{type(err).__name__}:", str(err).split(". ")[0])
ab = jax.jit(lambda a, b: jnp.matmul(a, b, out_sharding=NamedSharding(emesh, P("data", None))))(a, b)
print("with out_sharding:", jax.typeof(ab))
assert refused == ["ValueError", "ShardingTypeError"] and str(jax.typeof(ab)) == "float32[16@data,4]"
np.testing.assert_allclose(ab, np.full((16, 4), 8.0))


# %% [markdown]
# **Manual**: `jax.shard_map` runs your function once per device, on that device's block. Summing the
# columns is then your job: each device sums its 4 rows, and `jax.lax.psum` adds the four partial sums over
# `data`. `jax.typeof` inside shows `{V:data}` on values that still vary across `data`, and drops it after
# the `psum`.

# %%
def column_sums_block(b):
    seen["manual block"] = (b.shape, str(jax.typeof(b)))
    partial = b.sum(axis=0)
    total = jax.lax.psum(partial, "data")
    seen["manual partial"], seen["manual total"] = str(jax.typeof(partial)), str(jax.typeof(total))
    return total


ym = jax.shard_map(column_sums_block, mesh=mesh, in_specs=P("data", None), out_specs=P())(x16)
print(seen["manual block"], seen["manual partial"], "-> psum ->", seen["manual total"])
assert seen["manual block"] == ((4, 8), "float32[4,8]{V:data}")
assert seen["manual partial"] == "float32[8]{V:data}" and seen["manual total"] == "float32[8]"
np.testing.assert_allclose(ym, jnp.sum(x16, axis=0))

# %% [markdown]
# ## 6. `jax.shard_map`: the per-device program
#
# `jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)` is the API. The old
# `jax.experimental.shard_map.shard_map` (section 4 showed its warning) takes the mesh as a positional
# argument and calls the replication check `check_rep`; `jax.shard_map` takes `mesh=` as a keyword (or the
# mesh of `jax.set_mesh`) and calls it `check_vma`. Old and new spellings do not mix:

# %%
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from jax.experimental.shard_map import shard_map as old_shard_map
mixed = []
for call in (
    lambda: old_shard_map(column_sums_block, mesh, in_specs=P("data", None), out_specs=P(), check_vma=True),
    lambda: jax.shard_map(column_sums_block, mesh=mesh, in_specs=P("data", None), out_specs=P(), check_rep=True),
    lambda: jax.shard_map(column_sums_block, mesh, in_specs=P("data", None), out_specs=P()),
):
    try:
        call()
    except TypeError as err:
        mixed.append("TypeError")
        print("TypeError:", str(err).split(". ")[0])
assert mixed == ["TypeError"] * 3

# %% [markdown]
# `in_specs` says how the global array is cut into blocks; `out_specs` says how the blocks the function
# returns are put back together. With `P('data', 'model')` on the `(4, 2)` mesh, each device sees a
# `(4, 4)` block of the `(16, 8)` array. Inside the function shapes are **per device**:

# %%
x2d = jax.device_put(jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8), NamedSharding(mesh, P("data", "model")))
block_shapes = []


def column_sums_2d(b):
    block_shapes.append(b.shape)
    print("inside shard_map, b.shape =", b.shape)
    return jax.lax.psum(b.sum(axis=0, keepdims=True), "data")


sums = jax.shard_map(column_sums_2d, mesh=mesh, in_specs=P("data", "model"), out_specs=P(None, "model"))(x2d)
assert block_shapes == [(4, 4)]
np.testing.assert_allclose(sums, jnp.sum(x2d, axis=0, keepdims=True))

compiled = jax.jit(jax.shard_map(column_sums_2d, mesh=mesh, in_specs=P("data", "model"),
                                 out_specs=P(None, "model"))).lower(x2d).compile()
print(collectives(compiled))
assert collectives(compiled).count() == collectives(compiled).counts["all-reduce"] == 1
assert collectives(compiled).ops[0].group_size == 4  # among the 4 devices of the data axis

# %% [markdown]
# The `print` runs while JAX traces the function, not on the devices: once for the call, once more
# when the function is compiled to count its collectives, and each time it shows one block's shape.
#
# **`psum`** compiled to exactly one all-reduce, among the 4 devices of each `data` column. Before: a
# `(16, 8)` array in eight `(4, 4)` blocks. After: a `(1, 8)` row of sums, each half held by the 4 devices
# of one `model` column.

# %%
fig = draw_shardings({"1. before: x2d": x2d, "2. after: psum of block sums": sums}, ncols=2)
assert "dev 0,2,4,6\n(1, 4)\n16 B\n4 copies" in tile_labels(fig)
fig

# %% [markdown]
# ## 7. `all_gather`, `psum_scatter`, `ppermute`
#
# **`all_gather`** gives each device the blocks of all devices along an axis. With `tiled=True` they are
# concatenated along the dimension (without it they are stacked on a new leading axis). The gathered
# value is the same on every device of the `data` axis, but the replication check only knows that if you
# say so with `to='invarying'`; section 8 shows the error you get otherwise.

# %%
gathered_shapes = []


def gather_rows(b):
    g = jax.lax.all_gather(b, "data", tiled=True, to="invarying")
    gathered_shapes.append((b.shape, g.shape, jax.lax.all_gather(b, "data").shape))
    return g


gather = jax.shard_map(gather_rows, mesh=mesh, in_specs=P("data", "model"), out_specs=P(None, "model"))
xg = gather(x2d)
print("block, tiled gather, untiled gather:", gathered_shapes[0])
assert gathered_shapes[0] == ((4, 4), (16, 4), (4, 4, 4))
np.testing.assert_allclose(xg, x2d)  # the same values, now whole columns on every device
ag = collectives(jax.jit(gather).lower(x2d).compile())
print(ag)
assert [(op.kind, op.result_type, op.group_size) for op in ag.ops] == [("all-gather", "f32[16,4]", 4)]

fig = draw_shardings({"1. before: x2d": x2d, "2. after: all_gather over data": xg}, ncols=2)
assert "dev 0,2,4,6\n(16, 4)\n256 B\n4 copies" in tile_labels(fig)
fig

# %% [markdown]
# **`psum_scatter`** sums over an axis like `psum`, but each device keeps only its slice of the sum. Here
# the four `(4, 4)` row blocks of each column half are added up, and each device of the `data` axis keeps
# one row of the `(4, 8)` result. The plain-`jnp` version is `x.reshape(4, 4, 8).sum(0)`.

# %%
scatter = jax.shard_map(lambda b: jax.lax.psum_scatter(b, "data", scatter_dimension=0, tiled=True),
                        mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"))
full_sum = jax.shard_map(lambda b: jax.lax.psum(b, "data"),
                         mesh=mesh, in_specs=P("data", "model"), out_specs=P(None, "model"))
xs = scatter(x2d)
np.testing.assert_allclose(xs, x2d.reshape(4, 4, 8).sum(0))
np.testing.assert_allclose(full_sum(x2d), x2d.reshape(4, 4, 8).sum(0))

rs = collectives(jax.jit(scatter).lower(x2d).compile())
ar = collectives(jax.jit(full_sum).lower(x2d).compile())
print("psum_scatter:\n", rs, "\npsum:\n", ar, sep="")
assert [(op.kind, op.result_type) for op in rs.ops] == [("reduce-scatter", "f32[1,4]")]
assert [(op.kind, op.result_type) for op in ar.ops] == [("all-reduce", "f32[4,4]")]
assert rs.estimated_bytes * 2 == ar.estimated_bytes  # a reduce-scatter is half an all-reduce

fig = draw_shardings({"1. before: x2d": x2d, "2. after: psum_scatter over data": xs}, ncols=2)
assert "dev 0\n(1, 4)\n16 B" in tile_labels(fig)
fig


# %% [markdown]
# An all-reduce is a reduce-scatter followed by an all-gather. Write the two steps by hand and the bytes
# add up to the all-reduce's. So when the next step only needs a slice of the sum (a sharded optimizer
# update, the input of a row-sharded layer), `psum_scatter` alone does half the communication.

# %%
def scatter_then_gather(b):
    part = jax.lax.psum_scatter(b, "data", scatter_dimension=0, tiled=True)  # (1, 4): my slice of the sum
    return jax.lax.all_gather(part, "data", tiled=True, to="invarying")  # (4, 4): every slice


two_steps = jax.shard_map(scatter_then_gather, mesh=mesh, in_specs=P("data", "model"), out_specs=P(None, "model"))
rs_ag = collectives(jax.jit(two_steps).lower(x2d).compile())
print(rs_ag)
assert [op.kind for op in rs_ag.ops] == ["reduce-scatter", "all-gather"]
assert rs_ag.estimated_bytes == ar.estimated_bytes
np.testing.assert_allclose(two_steps(x2d), full_sum(x2d))

# %% [markdown]
# **`ppermute`** sends each device's block to another device, given as `(source, destination)` pairs of
# indices along one axis. A ring shift along `data`: index `i` sends to `i + 1`, and the last sends to the
# first. The layout does not change, the content does: the plain-`jnp` version is a roll by one block.
# (In the table, `group` is the size of one ring: 4 devices, one ring per `model` column, both rings
# running at once. Each device sends its one block once.)

# %%
ring = [(i, (i + 1) % 4) for i in range(4)]
shift = jax.shard_map(lambda b: jax.lax.ppermute(b, "data", ring),
                      mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"))
xp = shift(x2d)
np.testing.assert_allclose(xp, jnp.roll(x2d, 4, axis=0))

cp = collectives(jax.jit(shift).lower(x2d).compile())
print(cp)
assert cp.count() == cp.counts["collective-permute"] == 1
assert cp.ops[0].result_type == "f32[4,4]"  # one block per device, sent once
assert cp.ops[0].group_size == 4  # two rings of 4 devices, one per model column


def block_of(arr, device_id):
    return np.asarray(next(s.data for s in arr.addressable_shards if s.device.id == device_id))


for dev in (0, 2, 4, 6):  # the model-0 column of the mesh, top to bottom
    print(f"dev {dev}: first row before {block_of(x2d, dev)[0, 0]:5.0f}, after {block_of(xp, dev)[0, 0]:5.0f}")
np.testing.assert_array_equal(block_of(xp, 2), block_of(x2d, 0))  # dev 2 (data 1) got dev 0's block
np.testing.assert_array_equal(block_of(xp, 0), block_of(x2d, 6))  # and the ring wraps around

fig = draw_shardings({"1. before: x2d": x2d, "2. after: ppermute (same layout)": xp}, ncols=2)
assert tile_labels(fig)[:8] == tile_labels(fig)[8:]  # the picture of the layout is unchanged
fig


# %% [markdown]
# ## 8. The `check_vma` replication check
#
# `out_specs=P()` (or `P(None, None)`) is a **claim**: the function's output is the same on every device,
# so any device's copy can stand for the whole. `shard_map` tracks which values vary across which mesh
# axes (the `{V:data}` of section 5) and refuses a claim it cannot prove. Forget the `psum` in the column
# sums, and the output still varies across `data`:

# %%
def forgot_psum(b):
    return b.sum(axis=0)  # each device's partial sum, not the total


caught = []
try:
    jax.shard_map(forgot_psum, mesh=mesh, in_specs=P("data", None), out_specs=P())(x16)
except ValueError as err:
    caught.append("ValueError")
    lines = str(err).splitlines()
    print("ValueError:", lines[0], "\n...", next(line for line in lines if line.startswith("out_specs is")))
    assert "check_vma=False" in str(err)  # the message itself suggests switching the check off
assert caught == ["ValueError"]

# %% [markdown]
# The message suggests `check_vma=False`. That switches the check off, not the problem: `shard_map` then
# believes the claim and returns one device's partial sum as if it were the answer, with no error.

# %%
unchecked = jax.shard_map(forgot_psum, mesh=mesh, in_specs=P("data", None), out_specs=P(), check_vma=False)(x16)
right = jnp.sum(x16, axis=0)
print("check_vma=False:", np.asarray(unchecked))
print("right answer:   ", np.asarray(right))
np.testing.assert_allclose(unchecked, np.asarray(x16)[:4].sum(axis=0))  # device 0's 4 rows only
assert not np.allclose(unchecked, right)

# %% [markdown]
# The same check is why `all_gather` needed `to='invarying'` in section 7. Without it, the gathered value
# is typed as still varying across `data`, and the same claim of replication fails:

# %%
caught = []
try:
    jax.shard_map(lambda b: jax.lax.all_gather(b, "data", tiled=True), mesh=mesh,
                  in_specs=P("data", "model"), out_specs=P(None, "model"))(x2d)
except ValueError as err:
    caught.append("ValueError")
    print("ValueError: ...", next(line for line in str(err).splitlines() if line.startswith("out_specs is")))
assert caught == ["ValueError"]

# %% [markdown]
# Keep `check_vma=True` (the default). When it complains, add the collective you forgot, or say
# `to='invarying'` where a collective really did make the value identical.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. For the reference
# answer, run the exercise's `reveal()`, e.g. `ex.column_sums.reveal()`.
#
# **Exercise 1.** Write `column_sums(x)` with `jax.shard_map` on this notebook's `mesh`: `x` is a
# `(32, 8)` array sharded `P('data', None)`, and the result is `jnp.sum(x, axis=0)`, shape `(8,)`. The
# checker runs it against `jnp.sum`, and looks at the compiled program.

# %%
from exercises import ex05_constraints_explicit as ex


def column_sums(x):
    raise NotImplementedError  # return jax.shard_map(..., mesh=mesh, in_specs=..., out_specs=...)(x)


answer_1 = NOT_ANSWERED  # then: answer_1 = column_sums
ex.column_sums.check(answer_1);

# %% [markdown]
# **Exercise 2.** A batch holds `x` of shape `(128, 64)`, `label` of shape `(128,)` and a time-major mask
# `mask_tb` of shape `(16, 128)`. Write the `with_sharding_constraint` argument that splits the batch
# dimension (128) of every leaf over `data` and nothing else. The checker runs it under `jax.set_mesh`, so
# bare `P(...)` specs are fine.

# %%
answer_2 = NOT_ANSWERED  # e.g. {"x": P(...), "label": P(...), "mask_tb": P(...)}
ex.batch_constraint.check(answer_2);

# %% [markdown]
# **Exercise 3.** Predict, then check: which collective does `jax.lax.psum_scatter` compile to? Give the
# name as `collectives` prints it.

# %%
answer_3 = NOT_ANSWERED  # a string such as "all-gather"
ex.psum_scatter_collective.check(answer_3);

# %% [markdown]
# **Exercise 4.** With the ring shift of section 7 (`ring = [(i, (i + 1) % 4) for i in range(4)]` along
# `data`), which device's block does device 6 hold afterwards? Use the mesh picture at the top.

# %%
answer_4 = NOT_ANSWERED  # a device id, 0 to 7
ex.ring_source.check(answer_4);

# %% [markdown]
# ## Takeaways
# - `jax.lax.with_sharding_constraint` pins one value's layout inside `jit`; the compiler propagates from
#   it. Measure it: here it cut the bytes moved by 3× in a matmul chain and 2× in a reshard, and a badly
#   placed one made things 4× worse.
# - The seed's snippet is off three ways: an unused, deprecated import; one `P('data')` applied to every
#   leaf of a dict (an error on a scalar, the wrong axis on a time-major leaf); and replicated logits that
#   make the backward pass gather the whole batch. Constrain each leaf, and let the loss reduce.
# - Auto: you hint, the compiler decides. Explicit: the type says, `jax.reshard` changes it. Manual
#   (`jax.shard_map`): you write the per-device program and every collective in it.
# - In `jax.shard_map`, `psum` → all-reduce, `all_gather` → all-gather, `psum_scatter` → reduce-scatter
#   (half an all-reduce), `ppermute` → collective-permute. Use `jax.shard_map`, not the deprecated
#   `jax.experimental.shard_map`.
# - `check_vma` refuses an `out_specs` that claims replication it cannot prove; `check_vma=False` returns
#   one device's partial result instead of an error.
#
# **Next:** [07 · Data parallelism](07_data_parallel.ipynb)
