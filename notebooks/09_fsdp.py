# %% [markdown]
# # 09 · FSDP: fully sharded data parallelism
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/09_fsdp.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/09_fsdp.ipynb)
#
# FSDP splits the large parameters, and with them their Adam moments, across the data-parallel devices,
# and gathers each layer's weights just before they are used. In data parallelism (notebook 06) every
# device stores the whole model and the whole optimizer state; FSDP keeps the batch split the same way.
# In this notebook you write the sharding rule properly, measure the memory it saves, find the
# all-gathers in the compiled train step, look hard at what happens to the gradient on this backend,
# and check that FSDP trains to exactly the losses of data parallelism.
#
# **You will learn**
# - what the seed guide's `shard_fsdp` produces for the course's MLP, where it breaks, and how to write
#   the rule as a function that **returns shardings** (via `jax.tree_util.tree_map_with_path`) and
#   splits a dimension that divides;
# - the seed's "400 MB x 8 = 3.2 GB; with FSDP 50 MB per device" arithmetic, measured at small scale
#   for parameters and Adam state;
# - which collectives the compiler puts in the FSDP train step: all-gathers of the weights, and for the
#   gradient, on CPU, an all-reduce plus a slice where the textbook says reduce-scatter;
# - that FSDP gives the same losses as data parallelism and as a single device.

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
import contextlib
import io
import re
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
# The same model, data and train step as notebooks 06 to 08: an MLP `64 -> 256 -> 10` from two
# `nnx.Linear` layers, a batch of 64 examples labelled by a fixed random teacher, Adam `1e-2`, and the
# `nnx.jit` train step (notebook 06, section 5, shows why plain `jax.jit` with an in-place update
# would train nothing). The single-device run is the reference.

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
init_params = [np.asarray(p) for p in jax.tree.leaves(nnx.state(ref_model, nnx.Param))]
param_bytes = sum(p.nbytes for p in init_params)
ref_losses = [float(train_step(ref_model, ref_optimizer, x, y)) for _ in range(5)]
print("parameters:", param_bytes, "bytes =", format_bytes(param_bytes))
print("reference losses:", np.round(ref_losses, 4))
assert param_bytes == 76_840 and ref_losses[-1] < ref_losses[0] / 4

# %% [markdown]
# ## 2. The seed's `shard_fsdp`, run on the MLP
#
# The seed's "Strategy 4" builds a 1-D mesh with one axis, `fsdp`, and this function:

# %%
mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(AxisType.Auto,))

# The seed's code, unchanged:
fsdp_sharding = NamedSharding(mesh, P("fsdp"))


def shard_fsdp(params):
    """Shard parameters FSDP-style."""

    def shard_array(path, array):
        # Shard large parameters
        if array.size > 1024:
            return jax.device_put(array, fsdp_sharding)
        else:
            # Replicate small (biases, layer norms)
            return jax.device_put(array, NamedSharding(mesh, P()))

    return jax.tree_util.tree_map_with_path(shard_array, params)


graphdef, params = nnx.split(MLP(nnx.Rngs(0)))
seed_params = shard_fsdp(params)
fig = draw_shardings(seed_params, ncols=4, show_bytes=False)
labels = tile_labels(fig)
assert "dev 0\n(8, 256)" in labels and "dev 7\n(32, 10)" in labels  # kernels: split on dimension 0
assert "dev 0-7\n(256)" in labels and "dev 0-7\n(10)" in labels  # biases: replicated
fig

# %% [markdown]
# For this MLP it does what FSDP should: the two kernels (16,384 and 2,560 floats) are split 8 ways
# along their first dimension, `(64, 256) -> (8, 256)` and `(256, 10) -> (32, 10)`; the two biases
# (256 and 10 floats) stay whole on every device. Three things are wrong with it all the same:
#
# 1. `P('fsdp')` always splits **dimension 0**. That works here only because 64 and 256 are multiples
#    of 8.
# 2. It moves data inside the mapping and returns **arrays**, not a layout. You cannot hand its result
#    to `jax.jit(..., out_shardings=...)`, use it to lay out the optimizer state before it exists, or
#    ask it "where would this go?" without paying for the transfer.
# 3. It is mapped *with paths* and ignores them, so when it does something unexpected it cannot say
#    which parameter it was.
#
# Point 1 in action: a first layer that takes 10 input features has a `(10, 128)` kernel, 1,280
# floats, "large", and 10 rows do not split 8 ways.

# %%
_, narrow_params = nnx.split(nnx.Linear(10, 128, rngs=nnx.Rngs(0)))
seed_errors = []
# JAX 0.12 also prints the failing line's location to stdout (a stray print in jax/_src/pjit.py); it names
# a temporary file that changes on every run, so it is captured here rather than shown.
with contextlib.redirect_stdout(io.StringIO()):
    try:
        shard_fsdp(narrow_params)
    except ValueError as err:  # jax raises IndivisibleError, a ValueError
        seed_errors.append(type(err).__name__)
        message = str(err)
print(seed_errors[0] + ":", message[message.index("implies that"):message.index("(full shape")])
assert seed_errors == ["IndivisibleError"]


# %% [markdown]
# ## 3. The rule, written to return shardings
#
# A better rule is a function from `(path, leaf)` to a `NamedSharding`: it decides, and does not move
# anything. `jax.tree_util.tree_map_with_path` applies it to every leaf and gives back a pytree of
# shardings with the same structure as the state, which `jax.device_put` then applies in one go. It
# keeps the seed's size threshold (more than 1,024 elements is "large"), splits the **first dimension
# that the `fsdp` axis divides**, and uses the path to name a large leaf that nothing divides.

# %%
def path_name(path):
    """'linear1/kernel' for the path of an NNX Variable's array."""
    return jax.tree_util.keystr(path, simple=True, separator="/").removesuffix("/value")


def fsdp_rule(path, leaf, *, min_size=1024):
    """Where one array of a state lives under FSDP (decides only; moves nothing)."""
    n = mesh.shape["fsdp"]
    if leaf.size > min_size:
        for dim, size in enumerate(leaf.shape):
            if size % n == 0:
                spec = [None] * leaf.ndim
                spec[dim] = "fsdp"  # split this dimension 8 ways, keep the others whole
                return NamedSharding(mesh, P(*spec))
        print(f"fsdp_rule: {path_name(path)} {leaf.shape} has no dimension divisible by {n}; replicated")
    return NamedSharding(mesh, P())  # small: a full copy on every device


def by_name(tree):
    """{'linear1/kernel': leaf, ...} for a state or a pytree of shardings."""
    return {path_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def show_layout(shardings, state):
    for (path, sharding), leaf in zip(jax.tree_util.tree_flatten_with_path(shardings)[0], jax.tree.leaves(state),
                                      strict=True):
        print(f"{path_name(path):<31}{leaf.shape!s:<11}{sharding.spec!s:<20}per device "
              f"{sharding.shard_shape(leaf.shape)}")


narrow_shardings = jax.tree_util.tree_map_with_path(fsdp_rule, narrow_params)
show_layout(narrow_shardings, narrow_params)
assert by_name(narrow_shardings)["kernel"].shard_shape((10, 128)) == (10, 16)  # dimension 1 instead

odd = {"odd": jax.ShapeDtypeStruct((10, 250), jnp.float32)}
assert jax.tree_util.tree_map_with_path(fsdp_rule, odd)["odd"].is_fully_replicated

# %% [markdown]
# Because the rule only decides, it also works on **abstract** state: `nnx.eval_shape` builds the model
# as shapes and dtypes without allocating a parameter, and you can plan, and price, the layout before
# any array exists. Here is the plan for the MLP and for its Adam state:

# %%
abstract_model = nnx.eval_shape(lambda: MLP(nnx.Rngs(0)))
abstract_optimizer = nnx.eval_shape(lambda: nnx.Optimizer(MLP(nnx.Rngs(0)), optax.adam(1e-2), wrt=nnx.Param))
param_shardings = jax.tree_util.tree_map_with_path(fsdp_rule, nnx.state(abstract_model))
opt_shardings = jax.tree_util.tree_map_with_path(fsdp_rule, nnx.state(abstract_optimizer))
show_layout(param_shardings, nnx.state(abstract_model))
print()
show_layout(opt_shardings, nnx.state(abstract_optimizer))
assert isinstance(jax.tree.leaves(nnx.state(abstract_model))[0], jax.ShapeDtypeStruct)  # nothing allocated

try:  # the seed's shard_fsdp cannot plan: it needs the arrays, because it moves them
    shard_fsdp(nnx.state(abstract_model))
except TypeError as err:
    seed_errors.append(type(err).__name__)
    print("\nshard_fsdp on the abstract model:", type(err).__name__ + ":", err)
assert seed_errors == ["IndivisibleError", "InvalidInputException"]

# %% [markdown]
# The Adam moments `mu` and `nu` have the shapes of the parameters, so the same rule splits them the
# same way; the two step counters (`count`, `step`) are scalars and stay replicated. Now build the real
# model and optimizer from `nnx.Rngs(0)` (the same initial values as the reference), and place both
# states with the planned shardings:

# %%
model = MLP(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
nnx.update(model, jax.device_put(nnx.state(model), param_shardings))
nnx.update(optimizer, jax.device_put(nnx.state(optimizer), opt_shardings))

batch_sharding = NamedSharding(mesh, P("fsdp"))  # FSDP is data parallel too: the batch is split the same way
x_fsdp = jax.device_put(x, batch_sharding)
y_fsdp = jax.device_put(y, batch_sharding)

kernel1 = model.linear1.kernel[...]
mu1 = by_name(nnx.state(optimizer))["opt_state/0/mu/linear1/kernel"]
print("linear1/kernel:", type_string(kernel1), " Adam mu:", type_string(mu1), " x:", type_string(x_fsdp))
assert type_string(kernel1) == type_string(mu1) == "f32[64@fsdp,256]"
assert shard_table(kernel1).total_bytes == kernel1.nbytes  # no copies: the 8 blocks add up to the kernel
for placed, initial in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), init_params, strict=True):
    np.testing.assert_array_equal(np.asarray(placed), initial)  # same starting point as the reference
fig = draw_shardings(nnx.state(model), ncols=4, show_bytes=False)
assert tile_labels(fig) == labels  # the same layout as the seed's function, for this MLP
fig

# %% [markdown]
# ## 4. The memory: the seed's 400 MB arithmetic, measured
#
# The seed says:
#
# > `# Without FSDP: 400MB model × 8 devices = 3.2GB total`
# > `# With FSDP: 400MB / 8 per device = 50MB per device, 400MB total`
#
# Measure it on the MLP with `shard_table`, which reads what each device really holds. For comparison,
# a data-parallel copy of the same model and optimizer on the same mesh: everything replicated.

# %%
dp_model = MLP(nnx.Rngs(0))
dp_optimizer = nnx.Optimizer(dp_model, optax.adam(1e-2), wrt=nnx.Param)
replicated = NamedSharding(mesh, P())
nnx.update(dp_model, jax.device_put(nnx.state(dp_model), replicated))
nnx.update(dp_optimizer, jax.device_put(nnx.state(dp_optimizer), replicated))


def bytes_on(device, state):
    return sum(shard_table(leaf).bytes_per_device[device] for leaf in jax.tree.leaves(state))


def bytes_everywhere(state):
    return sum(shard_table(leaf).total_bytes for leaf in jax.tree.leaves(state))


small_bytes = (256 + 10) * 4  # the two biases, replicated under both layouts
rows = {}
for name, m, o in (("data parallel", dp_model, dp_optimizer), ("FSDP", model, optimizer)):
    per_device = [bytes_on(d, nnx.state(m)) for d in range(8)]
    adam = [bytes_on(d, nnx.state(o)) for d in range(8)]
    assert len(set(per_device)) == 1 and len(set(adam)) == 1  # every device holds the same amount
    rows[name] = (per_device[0], adam[0], bytes_everywhere(nnx.state(m)))

print(f"{'':<15}{'params/device':>15}{'Adam/device':>14}{'params, all 8 devices':>24}")
for name, (p, a, total) in rows.items():
    print(f"{name:<15}{format_bytes(p):>15}{format_bytes(a):>14}{format_bytes(total):>24}")

dp_params, dp_adam, dp_total = rows["data parallel"]
fsdp_params, fsdp_adam, fsdp_total = rows["FSDP"]
assert dp_params == param_bytes and dp_total == 8 * param_bytes  # "400MB x 8 devices = 3.2GB total"
assert (fsdp_params - small_bytes) * 8 == param_bytes - small_bytes  # "400MB / 8 per device" ...
assert fsdp_total == param_bytes + 7 * small_bytes  # ... "400MB total", plus 7 extra copies of the biases
assert dp_adam == 2 * param_bytes + 8 and (fsdp_adam - 8 - 2 * small_bytes) * 8 == 2 * (param_bytes - small_bytes)

# %% [markdown]
# The seed's arithmetic holds, at 75 KiB instead of 400 MB: replicated, the model costs 75.0 KiB on each
# device and 600.3 KiB over 8; under FSDP each device holds 1/8 of the kernels (9.25 KiB) plus the full
# biases (1.0 KiB), 10.3 KiB, and the 8 devices together hold the model once plus 7 extra copies of the
# biases. Two things the seed's line leaves out:
#
# - **Adam triples it.** Its two moments are parameter-shaped, so under data parallelism each device
#   stores 3 x 75 KiB; FSDP divides all three parts by 8 (up to the small replicated leaves).
# - **The step itself needs more.** During the step each kernel is gathered whole, used, and dropped.
#
# The compiled program's memory analysis shows both. Its arguments are what each device stores between
# steps; its temporaries are what the step allocates while it runs:

# %%
compiled_dp = train_step.lower(dp_model, dp_optimizer, x_fsdp, y_fsdp).compile()
compiled_fsdp = train_step.lower(model, optimizer, x_fsdp, y_fsdp).compile()
mem_dp, mem_fsdp = memory_per_device(compiled_dp), memory_per_device(compiled_fsdp)
print("data parallel:", mem_dp)
print("FSDP:         ", mem_fsdp)
batch_slice_bytes = 8 * 64 * 4 + 8 * 4
assert mem_dp.argument == dp_params + dp_adam + batch_slice_bytes
assert mem_fsdp.argument == fsdp_params + fsdp_adam + batch_slice_bytes
gathered_kernels = (64 * 256 + 256 * 10) * 4  # both kernels, whole
print("FSDP temporaries - data-parallel temporaries:", mem_fsdp.temp - mem_dp.temp, "bytes;",
      "the two kernels, whole:", gathered_kernels, "bytes")
assert 0 <= (mem_fsdp.temp - mem_dp.temp) - gathered_kernels < 1024
assert mem_fsdp.temp > mem_fsdp.argument  # at this size the step's temporaries dominate

# %% [markdown]
# Between steps FSDP stores 32.9 KiB per device where data parallelism stores 227.2 KiB. While the step
# runs, though, FSDP's temporaries are *larger* (148.3 KiB against 74.2 KiB), by almost exactly the two
# kernels it gathers whole. For a model this small the temporaries dominate. In a large model the
# compiler can gather one layer at a time, so the temporaries hold roughly one layer's weights while
# the stored parameters and Adam state, the part FSDP divides by 8, hold all of them.

# %% [markdown]
# ## 5. The compiled FSDP train step: all-gathers, and what happens to the gradient
#
# The seed's "Communication Overhead" section says:
#
# > `# FSDP: All-gather before each layer, reduce-scatter after`
#
# Count what the compiler actually inserted:

# %%
comm = collectives(compiled_fsdp)
print(comm)
assert comm.counts == {"all-reduce": 1, "all-gather": 3, "reduce-scatter": 0, "all-to-all": 1,
                       "collective-permute": 0}
gathers = [op for op in comm.ops if op.kind == "all-gather"]
assert [op.result_type for op in gathers] == ["f32[64,256]", "f32[256,10]", "f32[64,10]"]
assert gathers[0].result_bytes == kernel1.nbytes and gathers[1].result_bytes == model.linear2.kernel[...].nbytes
(all_reduce,) = [op for op in comm.ops if op.kind == "all-reduce"]
(all_to_all,) = [op for op in comm.ops if op.kind == "all-to-all"]
assert all_to_all.result_bytes == 64 * 32 * 4  # the (64 examples, 32 hidden units) block of the backward pass
assert all_reduce.result_bytes == param_bytes + 4  # the same all-reduce as data parallelism (notebook 06)
assert collectives(compiled_dp).counts["all-reduce"] == 1
assert collectives(compiled_dp).result_bytes == all_reduce.result_bytes

# %% [markdown]
# Reading the table from the top:
#
# - **All-gather before use: yes.** `f32[64,256]` and `f32[256,10]` are the two kernels, whole: each
#   device gathers the blocks of the other 7 right before the forward matmul. The biases are replicated
#   already, so they need none.
# - **A third all-gather and an all-to-all** that the seed does not mention. For the backward pass the
#   compiler gathers the logits' gradient over the whole batch (`f32[64,10]`, 2.5 KiB, smaller than
#   gathering the `(256, 10)` kernel again), multiplies it by the device's own `(32, 10)` block of the
#   kernel, and an all-to-all turns the result from "split over hidden units" back into "split over
#   examples".
# - **Reduce-scatter after: no.** There is one all-reduce, and it is exactly data parallelism's: the
#   whole gradient, 76,844 bytes, summed onto every device. Each device then keeps only its block,
#   with `dynamic-slice` ops on the summed gradient, before Adam updates its blocks:

# %%
slices = sorted(set(re.findall(r"= (f32\[[0-9,]+\])\{[0-9,]+\} dynamic-slice\(", compiled_fsdp.as_text())))
print("dynamic-slice results in the FSDP step:", slices)
assert {"f32[256,8]", "f32[10,32]"} <= set(slices)  # 1/8 of each kernel gradient (in its transposed layout)
assert "dynamic-slice(" not in compiled_dp.as_text()  # data parallelism keeps the whole gradient

# %% [markdown]
# An all-reduce followed by "keep your 1/8" computes the same numbers as a reduce-scatter, but each
# device receives the whole sum where a reduce-scatter would deliver only its block. Why here? Dumping
# the compiler's passes for this step (`XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_pass_re=.*"`, run
# when this course was written) shows that the SPMD partitioner itself writes the gradient as five
# all-reduces, each followed by a `dynamic-slice`; a later CPU pass merges the five all-reduces into
# the one above. Turning "all-reduce, then slice" into a reduce-scatter is the job of a separate XLA
# pass, `ReduceScatterCreator`, which XLA's GPU compiler runs among its collective optimizations; the
# CPU compiler in jaxlib does not include it, so on CPU you see the unfused pair. This notebook runs on
# CPU and does not show what a GPU or TPU compile produces.
#
# The CPU backend can run a reduce-scatter, though. Write the gradient sum both ways by hand with
# `jax.shard_map`, for gradients shaped like the `(64, 256)` kernel: one partial gradient per device,
# summed, each device keeping rows `8i` to `8i + 8`.

# %%
partial_grads = jax.random.normal(jax.random.key(1), (8 * 64, 256))  # 8 stacked (64, 256) partial gradients


@partial(jax.shard_map, mesh=mesh, in_specs=P("fsdp"), out_specs=P("fsdp"))
def by_reduce_scatter(g):
    return jax.lax.psum_scatter(g, "fsdp", scatter_dimension=0, tiled=True)


@partial(jax.shard_map, mesh=mesh, in_specs=P("fsdp"), out_specs=P("fsdp"))
def by_all_reduce_and_slice(g):
    total = jax.lax.psum(g, "fsdp")
    return jax.lax.dynamic_slice_in_dim(total, jax.lax.axis_index("fsdp") * 8, 8, axis=0)


compiled_rs = jax.jit(by_reduce_scatter).lower(partial_grads).compile()
compiled_ar = jax.jit(by_all_reduce_and_slice).lower(partial_grads).compile()
rs, ar = collectives(compiled_rs), collectives(compiled_ar)
print(rs, "\n")
print(ar)
scattered = compiled_rs(partial_grads)
np.testing.assert_allclose(scattered, compiled_ar(partial_grads), rtol=1e-6, atol=1e-6)
np.testing.assert_allclose(scattered, partial_grads.reshape(8, 64, 256).sum(0), rtol=1e-5, atol=1e-5)
assert rs.counts["reduce-scatter"] == 1 and rs.ops[0].result_type == "f32[8,256]"
assert ar.counts["all-reduce"] == 1 and ar.ops[0].result_type == "f32[64,256]"
assert ar.estimated_bytes == 2 * rs.estimated_bytes  # the textbook ring: the all-reduce sends twice as much

# %% [markdown]
# Same result, but the reduce-scatter delivers an `(8, 256)` block where the all-reduce delivers the whole
# `(64, 256)` sum, and under the ring algorithm sends half the bytes (56 KiB against 112 KiB per
# device). That factor of 2 on the gradient is the communication you would expect FSDP to save
# against data parallelism; on this CPU backend the compiled train step does not save it.

# %% [markdown]
# ## 6. FSDP trains like data parallelism
#
# The layout changes where numbers live, not what is computed. Train both 5 steps from the same initial
# parameters (both steps were compiled in section 4) and compare them with each other and with the
# single-device reference:

# %%
dp_losses = [float(train_step(dp_model, dp_optimizer, x_fsdp, y_fsdp)) for _ in range(5)]
fsdp_losses = [float(train_step(model, optimizer, x_fsdp, y_fsdp)) for _ in range(5)]
print("reference:    ", np.round(ref_losses, 4))
print("data parallel:", np.round(dp_losses, 4))
print("FSDP:         ", np.round(fsdp_losses, 4))
np.testing.assert_allclose(fsdp_losses, dp_losses, rtol=1e-5)
np.testing.assert_allclose(fsdp_losses, ref_losses, rtol=1e-5)
for trained, ref in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(nnx.state(ref_model, nnx.Param)),
                        strict=True):
    np.testing.assert_allclose(np.asarray(trained), np.asarray(ref), rtol=1e-4, atol=1e-6)

# %% [markdown]
# The parameters stayed sharded through training. Compare shardings with `is_equivalent_to`, not by
# their specs: the compiler writes the trained kernel's spec as `P('fsdp',)`, without the trailing `None`
# the rule wrote, and the two `PartitionSpec`s compare unequal although they describe the same layout.

# %%
trained_spec = model.linear1.kernel[...].sharding.spec
planned = by_name(param_shardings)["linear1/kernel"]
print("planned:", planned.spec, "  after training:", trained_spec)
assert planned.spec == P("fsdp", None) and trained_spec != planned.spec  # different specs ...
assert model.linear1.kernel[...].sharding.is_equivalent_to(planned, 2)  # ... the same layout
assert model.linear2.kernel[...].sharding.is_equivalent_to(by_name(param_shardings)["linear2/kernel"], 2)
assert shard_table(model.linear1.kernel[...]).shard_shapes == {(8, 256)}

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** Write the FSDP rule as a function `fsdp_spec(path, leaf)` that returns a
# `PartitionSpec` (not a sharding, so it does not depend on a mesh): for a mesh axis `'fsdp'` of 8
# devices, a leaf with more than 1,024 elements gets one dimension split on `'fsdp'`, one that 8
# divides; every other leaf, and a large one with no such dimension, is replicated: `P()`. The checker maps it over a test state with
# `jax.tree_util.tree_map_with_path`.

# %%
from exercises import ex09_fsdp as ex


def fsdp_spec(path, leaf):
    ...  # your rule: return a PartitionSpec


answer_1 = NOT_ANSWERED  # set it to fsdp_spec once you have written the rule
ex.fsdp_rule.check(answer_1);

# %% [markdown]
# **Exercise 2.** The MLP becomes `64 -> 512 -> 10` (two `nnx.Linear` layers with biases, float32),
# trained with Adam under this notebook's FSDP rule on 8 devices. How many bytes of Adam moments (`mu`
# and `nu` together, without the 4-byte counter) does each device store?

# %%
answer_2 = NOT_ANSWERED  # a whole number of bytes
ex.adam_bytes_per_device.check(answer_2);

# %% [markdown]
# **Exercise 3.** Section 5 summed gradients shaped like a `(64, 256)` float32 kernel over 8 devices. Under
# the ring algorithm, how many bytes does each device send for the reduce-scatter, and how many for the
# all-reduce (followed by a slice) that the CPU compiler used in the train step?

# %%
answer_3 = NOT_ANSWERED  # a pair (reduce-scatter bytes, all-reduce bytes)
ex.gradient_traffic.check(answer_3);

# %% [markdown]
# ## Takeaways
# - FSDP is data parallelism with the large parameters, and their Adam moments, split across the same
#   devices: here `f32[64@fsdp,256]` for a kernel and for its `mu` and `nu`, while biases stay replicated.
# - Write the rule as `(path, leaf) -> NamedSharding` and map it with `jax.tree_util.tree_map_with_path`:
#   it plans layouts (even on `nnx.eval_shape` state) without moving data, splits a dimension that
#   divides, and can name the leaf it could not split. The seed's `shard_fsdp` always splits dimension 0.
# - Per device, parameters and Adam state shrink to 1/8, up to the replicated small leaves (10.3 KiB
#   instead of 75.0 KiB of parameters), as the seed's arithmetic says; the step's temporaries do not.
# - The compiled step all-gathers each kernel before use. The gradient, on this CPU backend, is the
#   data-parallel all-reduce followed by a `dynamic-slice`, not a reduce-scatter; a hand-written
#   `psum_scatter` shows the reduce-scatter that would send half as much.
# - The losses equal data parallelism's and the single device's.
#
# **Next:** [10 · A sharded transformer, end to end](10_transformer.ipynb)
