# %% [markdown]
# # 10 · FSDP: fully sharded data parallelism
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/10_fsdp.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/10_fsdp.ipynb)
#
# Data parallelism keeps the parameters and Adam's two moments, 12 bytes per float32 parameter, on every
# device. A model of 1 billion parameters then needs 12 GB per device before any gradient or activation.
#
# **You need:** notebooks 06 (`jax.shard_map` and its collectives), 07 (data parallelism, the course MLP
# and its train step) and 09 (group sizes name mesh axes); `jax.tree_util.tree_map_with_path`,
# `nnx.eval_shape`, `jax.lax.with_sharding_constraint` and `memory_analysis()`.
#
# FSDP splits the large parameters and their Adam moments across the data-parallel devices, and gathers
# each weight whole just before it is used.
#
# **You will learn**
# - how to write the FSDP rule as `(path, leaf) -> NamedSharding`, and plan a layout on abstract state
#   before any array exists;
# - how to create a model and its optimizer already sharded, so that no device ever holds the whole model;
# - what FSDP divides by the device count (the stored state) and what shrinks far more slowly (the
#   step's temporaries), on the CPU and in a TPU's HBM at a real size;
# - which collectives the FSDP step contains, and why FSDP saves memory, not communication;
# - hybrid sharding (HSDP): FSDP inside a group, data parallelism across groups;
# - that FSDP gives the same losses as data parallelism and as a single device.
# - (exercise 4) how to write the same step by hand in `jax.shard_map`: gather, compute, reduce-scatter.
#
# The strategy in the course's types (`{U:fsdp}`: partial sums still to be added over `fsdp`). Section 5
# reads each type from JAX and checks it:
#
# ```
# w1: f32[64@fsdp,256] → all-gather(fsdp) → f32[64,256];  x: f32[64@fsdp,64] · w1 → h: f32[64@fsdp,256]
# xᵀ·dh: f32[64,256]{U:fsdp} → reduce-scatter(fsdp) → f32[64@fsdp,256]
# ```

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
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding, reshard
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (CHIPS, NOT_ANSWERED, assert_close, collectives, compile_effort, draw_shardings, draw_timeline,
                   estimate_step, format_bytes, memory_per_device, quiet, schedule, shard_table, tpu_compiler_available,
                   type_string)

# %% [markdown]
# ## 1. The model, the data, and a single-device reference
#
# Notebook 07's MLP `64 -> 256 -> 10`, its batch of 64 examples, Adam `1e-2` and its `nnx.jit` train
# step (donating the model and optimizer), imported. The single-device run is the reference.

# %%
from spmd_course.models import MLP, train_step, x, y  # notebook 07's model, data and step


def create():
    model = MLP(nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


ref_model, ref_optimizer = create()
init_params = [np.asarray(p) for p in jax.tree.leaves(nnx.state(ref_model, nnx.Param))]  # copies
param_bytes = sum(p.nbytes for p in init_params)
ref_losses = [float(train_step(ref_model, ref_optimizer, x, y)) for _ in range(5)]
print("parameters:", param_bytes, "bytes =", format_bytes(param_bytes))
print("reference losses:", np.round(ref_losses, 4))
assert ref_losses[-1] < ref_losses[0] / 4

# %% [markdown]
# ## 2. The rule: decide where each array goes, move nothing
#
# FSDP runs on a 1-D mesh whose one axis, `fsdp`, splits both the batch and the large parameters.
#
# > **You will see this online:** an FSDP helper that moves every array as it decides:
# > ```python
# > def shard_fsdp(params):
# >     def shard_array(path, array):
# >         if array.size > 1024:  # large: split it
# >             return jax.device_put(array, NamedSharding(mesh, P('fsdp')))
# >         return jax.device_put(array, NamedSharding(mesh, P()))  # small: replicate
# >     return jax.tree_util.tree_map_with_path(shard_array, params)
# > ```
#
# `P('fsdp')` always splits **dimension 0**. Run it on a first layer with 10 input features (a
# `(10, 128)` kernel, 1,280 floats, "large"), and on the model's abstract state:

# %%
mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(AxisType.Auto,))


def shard_fsdp(params):
    def shard_array(path, array):
        if array.size > 1024:
            return jax.device_put(array, NamedSharding(mesh, P("fsdp")))
        return jax.device_put(array, NamedSharding(mesh, P()))

    return jax.tree_util.tree_map_with_path(shard_array, params)


narrow_params = nnx.state(nnx.Linear(10, 128, rngs=nnx.Rngs(0)))
abstract_model, abstract_optimizer = nnx.eval_shape(create)  # shapes and dtypes only: nothing allocated
errors = []
for name, state in (("(10, 128) kernel", narrow_params), ("abstract state", nnx.state(abstract_model))):
    try:
        with quiet():  # jax 0.12 prints a stray source line before raising; keep it out of the output
            shard_fsdp(state)
    except (ValueError, TypeError) as err:
        errors.append(type(err).__name__)
        detail = re.search(r"array axis \d+ .*?dimension size is \d+|Argument of type .*? JAX type", str(err))
        print(f"{name}: {type(err).__name__}: ... {detail.group(0)}")
assert errors == ["IndivisibleError", "InvalidInputException"]

# %% [markdown]
# Two problems: 10 rows do not split 8 ways, and a function that moves arrays cannot plan a layout for
# arrays that do not exist yet. The fix is a rule that only **decides**: `(path, leaf) -> NamedSharding`.
# `jax.tree_util.tree_map_with_path` maps it over a state into a pytree of shardings. This one keeps the
# 1,024-element threshold, splits the **first dimension that the `fsdp` axis divides**, and uses the path
# to name a large leaf that nothing divides.

# %%
def path_name(path):
    """'linear1/kernel' for the path of an NNX Variable's array."""
    return jax.tree_util.keystr(path, simple=True, separator="/").removesuffix("/value")


def fsdp_rule(path, leaf, *, mesh=mesh, min_size=1024):
    """Where one array of a state lives under FSDP (decides only; moves nothing)."""
    n = mesh.shape["fsdp"]
    if leaf.size > min_size:
        for dim, size in enumerate(leaf.shape):
            if size % n == 0:
                spec = [None] * leaf.ndim
                spec[dim] = "fsdp"  # split this dimension n ways, keep the others whole
                return NamedSharding(mesh, P(*spec))
        print(f"fsdp_rule: {path_name(path)} {leaf.shape} has no dimension divisible by {n}; replicated")
    return NamedSharding(mesh, P())  # small: a full copy on every device


def by_name(tree):
    """{'linear1/kernel': leaf, ...} for a state or a pytree of shardings."""
    return {path_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


narrow = by_name(jax.tree_util.tree_map_with_path(fsdp_rule, narrow_params))["kernel"]
print("(10, 128) kernel:", narrow.spec, "per device", narrow.shard_shape((10, 128)))
assert narrow.shard_shape((10, 128)) == (10, 16)  # dimension 1 instead

shardings = jax.tree_util.tree_map_with_path(fsdp_rule, nnx.state((abstract_model, abstract_optimizer)))
for name, sharding in by_name(shardings).items():
    print(f"{name:<32}{sharding.spec}")

# %% [markdown]
# The plan covers the model (`0/...`) and the optimizer (`1/...`). Adam's moments `mu` and `nu` have the
# shapes of the parameters, so the rule splits them the same way. The biases and the two step counters
# are too small to split, so they stay replicated.
#
# ## 3. Create it sharded: no device ever holds the whole model
#
# Building `MLP(...)` eagerly and then moving it would first put the whole model, and the whole Adam
# state, on one device: exactly what FSDP exists to avoid. Instead, compile the constructor. Inside
# `nnx.jit`, `jax.lax.with_sharding_constraint` pins the new state to the planned shardings, and the
# compiler partitions the initialisation itself: each device computes only its own blocks.

# %%
def create_sharded(shardings):
    @nnx.jit
    def build():
        model, optimizer = create()
        state = nnx.state((model, optimizer))
        nnx.update((model, optimizer), jax.lax.with_sharding_constraint(state, shardings))
        return model, optimizer

    return build


build_fsdp = create_sharded(shardings)
compiled_init = build_fsdp.lower().compile()
init = memory_per_device(compiled_init)
print("init program:", init, "| collectives:", collectives(compiled_init).count())
model, optimizer = build_fsdp()
print("linear1/kernel:", type_string(model.linear1.kernel[...]),
      " Adam mu:", type_string(optimizer.opt_state[0].mu["linear1"]["kernel"][...]))

assert init.argument == 0 and init.output + init.temp < param_bytes  # less than the parameters alone, per device
assert shard_table(model.linear1.kernel[...]).shard_shapes == {(8, 256)}
for made, initial in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), init_params, strict=True):
    np.testing.assert_array_equal(np.asarray(made), initial)  # the same numbers as the eager reference
draw_shardings(nnx.state(model), ncols=4)

# %% [markdown]
# The init program takes no arguments and allocates, per device, less than the parameters alone
# (75.0 KiB): no device ever held the whole model. Its random numbers are the reference's, bit for bit:
# with `jax_threefry_partitionable` (on by default) they do not depend on how the array is split.
#
# > **Three ways to create a sharded model.** Build it eagerly, then `jax.device_put` the state
# > (notebook 07): fine when one device holds the whole model. Run the constructor in `nnx.jit` with
# > sharding constraints (here, 08, 09): nothing whole anywhere. Or plan from `nnx.eval_shape` and
# > compile `jax.jit(init, out_shardings=plan)` (notebook 11, as MaxText does).
#
# ## 4. The memory: what FSDP divides, and what it does not
#
# For comparison, data parallelism on the same mesh: the same `create_sharded`, everything replicated.
# `shard_table` reads what each device really holds:

# %%
replicated = NamedSharding(mesh, P())
dp_model, dp_optimizer = create_sharded(replicated)()


def bytes_on_device_0(state):
    return sum(shard_table(leaf).bytes_per_device[0] for leaf in jax.tree.leaves(state))


print(f"{'':<15}{'params/device':>15}{'Adam/device':>14}")
for name, m, o in (("data parallel", dp_model, dp_optimizer), ("FSDP", model, optimizer)):
    print(f"{name:<15}{format_bytes(bytes_on_device_0(nnx.state(m))):>15}"
          f"{format_bytes(bytes_on_device_0(nnx.state(o))):>14}")

small_bytes = (256 + 10) * 4  # the two biases, replicated under both layouts
assert bytes_on_device_0(nnx.state(dp_model)) == param_bytes
assert bytes_on_device_0(nnx.state((dp_model, dp_optimizer))) == 12 * (param_bytes // 4) + 8  # 12 B per parameter
assert (bytes_on_device_0(nnx.state(model)) - small_bytes) * 8 == param_bytes - small_bytes  # 1/8 of the rest
for m, o in ((dp_model, dp_optimizer), (model, optimizer)):  # mu and nu laid out like the parameters, 2 counters
    assert bytes_on_device_0(nnx.state(o)) == 2 * bytes_on_device_0(nnx.state(m)) + 8

# %% [markdown]
# Data parallelism stores all 75.0 KiB of parameters and twice that in Adam moments on every device:
# 12 bytes per parameter. FSDP stores 1/8 of each kernel (9.25 KiB) plus the whole biases (1.0 KiB), and
# the moments follow the same split. What about the step itself? Compile the FSDP train step on 2, 4 and
# 8 devices, with the batch split on the same axis, and read `memory_analysis()`:

# %%
rows = {}
for n in (2, 4, 8):
    sub_mesh = mesh if n == 8 else jax.make_mesh((n,), ("fsdp",), axis_types=(AxisType.Auto,),
                                                 devices=jax.devices()[:n])  # 8: the model's own mesh and order
    if n == 8:
        m, o = model, optimizer
    else:
        plan = jax.tree_util.tree_map_with_path(partial(fsdp_rule, mesh=sub_mesh), nnx.state(nnx.eval_shape(create)))
        m, o = create_sharded(plan)()
    batch = NamedSharding(sub_mesh, P("fsdp"))
    rows[n] = train_step.lower(m, o, jax.device_put(x, batch), jax.device_put(y, batch)).compile()
x_fsdp, y_fsdp = jax.device_put(x, NamedSharding(mesh, P("fsdp"))), jax.device_put(y, NamedSharding(mesh, P("fsdp")))
compiled_fsdp = rows[8]
compiled_dp = train_step.lower(dp_model, dp_optimizer, x_fsdp, y_fsdp).compile()

mems = {n: memory_per_device(c) for n, c in rows.items()}
dp_mem = memory_per_device(compiled_dp)
print(f"{'':<19}{'arguments':>11}{'temporaries':>13}{'aliased':>10}{'allocated':>11}")
for name, mem in [(f"FSDP, {n} devices", m) for n, m in mems.items()] + [("data parallel, 8", dp_mem)]:
    print(f"{name:<19}{format_bytes(mem.argument):>11}{format_bytes(mem.temp):>13}{format_bytes(mem.alias):>10}"
          f"{format_bytes(mem.total):>11}")

assert mems[2].argument > mems[4].argument > mems[8].argument  # the stored state shrinks with n

# %% [markdown]
# The arguments are what a device stores between steps: its share of the state (donated, and so
# aliased) plus its examples. They shrink as devices are added. The temporaries are what the step
# allocates while it runs, and on the CPU compiler they do not shrink at all. They stay about twice the
# model on every mesh, as large as data parallelism's, because each device gathers every kernel whole
# (section 5) and receives the whole summed gradient. The hidden cell below holds the CPU compiler's
# figures.
#
# That is the CPU compiler's behaviour, not a law. A TPU compiler reduce-scatters the gradient, so it
# need not hold the whole sum, and its temporaries do shrink with the chip count, though far more slowly
# than the state: section 5 compiles the step for 2 and 8 TPU chips at a real size. To hold only one
# layer's gathered weights at a time, a deep model scans over its layers with rematerialisation
# (`jax.lax.scan`, `jax.checkpoint`). Notebook 12 measures one.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §4: the step's temporaries
print(f"This compiler's temporaries, in units of the parameters' bytes: FSDP on 2, 4 and 8 devices "
      f"{', '.join(f'{mems[n].temp / param_bytes:.2f}' for n in mems)}; data parallel on 8 {dp_mem.temp / param_bytes:.2f}.")
if CPU:  # the CPU compiler's temporaries
    assert min(mems[n].temp for n in mems) > param_bytes  # the step's working memory: more than the whole model ...
    assert max(mems[n].temp for n in mems) < 1.05 * min(mems[n].temp for n in mems)  # ... whatever n is
    assert 1.9 * param_bytes < mems[8].temp < 2.1 * param_bytes  # about twice the model
    assert abs(mems[8].temp - dp_mem.temp) < 0.05 * dp_mem.temp  # as large as data parallelism's

# %% [markdown]
# ## 5. The compiled step: all-gathers, and what happens to the gradient
#
# **Pop quiz.** Before you read the program: each device holds 1/8 of every kernel, and its 8 examples
# need whole kernels. Which collectives must an FSDP step run, and where?
#
# <details><summary>Answer</summary>
#
# An all-gather of each kernel before the matmul that uses it, because no device can multiply with an
# eighth of a kernel, and a reduce-scatter of each kernel's gradient after the backward pass, because
# each device must add up the 8 partial gradients of its own block only. The cell below asserts the
# gathers. The reduce-scatter depends on the compiler: the TPU program below has one, while the CPU
# compiler all-reduces and slices, as this section shows.
#
# </details>

# %%
comm, dp_comm = collectives(compiled_fsdp), collectives(compiled_dp)
print("FSDP:", comm, sep="\n")
print("\ndata parallel:", dp_comm, sep="\n")
assert "all-gather" in comm.kinds and dp_comm.kinds == {"all-reduce"}
h = jax.jit(lambda model, x: model.linear1(x))(model, x_fsdp)  # the opening's chain, from the real arrays
chain = [type_string(a) for a in (model.linear1.kernel[...], x_fsdp, h)]
print(" | ".join(chain))
assert chain == ["f32[64@fsdp,256]", "f32[64@fsdp,64]", "f32[64@fsdp,256]"]

# %% [markdown]
# The gradient line of the opening has a pending sum over `fsdp`, which an Auto mesh never shows as a
# type. An Explicit twin of the mesh does. The kernel's gradient is `xᵀ·dh`, where `dh` is the gradient
# at the first layer's output. Each device multiplies its own 8 examples, so
# `out_sharding=P(None, None, unreduced={'fsdp'})` keeps the 8 partial products apart, and `reshard` to
# the kernel's own layout, `P('fsdp', None)`, adds them up and keeps each device's block:

# %%
from spmd_course.models import first_layer_gradient  # notebook 07's

fresh = MLP(nnx.Rngs(0))  # the initial parameters, on one device
dh = first_layer_gradient(fresh, x, y)  # the gradient at the first layer's output
full_grads = nnx.grad(lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean())(fresh)
explicit = jax.make_mesh((8,), ("fsdp",), axis_types=(AxisType.Explicit,))
with jax.set_mesh(explicit):
    x_rows, dh_rows = (jax.device_put(a, NamedSharding(explicit, P("fsdp"))) for a in (x, dh))
    dw1_pending = jnp.einsum("bi,bh->ih", x_rows, dh_rows, out_sharding=P(None, None, unreduced={"fsdp"}))
    scatter = jax.jit(lambda g: reshard(g, P("fsdp", None)))
    dw1 = scatter(dw1_pending)
    scattered_by = collectives(scatter.lower(dw1_pending).compile())
gradient_chain = f"xᵀ·dh: {jax.typeof(dw1_pending).str_short(short_dtypes=True)} → {type_string(dw1)}"
print(gradient_chain, "| the compiler's collective:", [op.kind for op in scattered_by.ops])
assert gradient_chain == "xᵀ·dh: f32[64,256]{U:fsdp} → f32[64@fsdp,256]"
assert shard_table(dw1).shard_shapes == {(8, 256)}  # each device keeps its block of the sum
assert_close(dw1, full_grads["linear1"]["kernel"][...])  # the summed products are the full-batch gradient

# %% [markdown]
# The types are the opening's. How the compiler adds the sum depends on the backend: the CPU compiler
# all-reduces the whole `f32[64,256]` and slices it, and the TPU compiler reduce-scatters, as the
# compiled train step below shows.

# %% [markdown]
# The CPU compiler's FSDP table, from the top:
#
# - **All-gathers of the weights**: `f32[64,256]` and `f32[256,10]`, the two kernels whole, right
#   before the forward matmuls.
# - **For the backward pass**, an all-gather of the logits' gradient over the whole batch
#   (`f32[64,10]`), multiplied by the device's own `(32, 10)` kernel block, and an all-to-all that turns
#   the result from "split over hidden units" back into "split over examples".
# - **The gradient.** FSDP needs each device's block of the summed gradient: a **reduce-scatter**. The
#   CPU backend runs the whole data-parallel all-reduce (76,844 bytes), then `dynamic-slice` ops keep
#   each device's 1/8.

# %%
slices = sorted(set(re.findall(r"= (f32\[[0-9,]+\])\{[0-9,]+\} dynamic-slice\(", compiled_fsdp.as_text())))
print("dynamic-slice results in the FSDP step:", slices)

# %% [markdown]
# **The TPU program.** You need no TPU to see what the TPU compiler does with the same step: JAX
# compiles ahead of time for a TPU topology, here a v5e with 8 chips (`v5e:2x4`, notebook 19). The state
# becomes `jax.ShapeDtypeStruct`s placed by the same rule on a mesh of TPU chips,
# and a function that `nnx.merge`s them calls the same `train_step`. Nothing is allocated, nothing runs.
# This small program compiles quickly at the compiler's default effort, the one `jax.jit` uses when you
# run, so its figures are the ones you would see:

# %%
ok, why = tpu_compiler_available()
if not ok:
    print(why)  # no TPU compiler here (libtpu is not installed, or this is not Linux): the CPU view above stands
else:
    with quiet():  # libtpu's start-up warnings
        topo = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")
    tpu_mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(AxisType.Auto,), devices=topo.devices)
    graphdef, abstract_state = nnx.split(nnx.eval_shape(create))
    tpu_plan = jax.tree_util.tree_map_with_path(partial(fsdp_rule, mesh=tpu_mesh), abstract_state)
    tpu_batch = NamedSharding(tpu_mesh, P("fsdp"))

    def functional_step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss = train_step(model, optimizer, x, y)
        return nnx.state((model, optimizer)), loss

    def compile_for_tpu(plan):
        state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, plan)
        return jax.jit(functional_step, donate_argnums=0, out_shardings=(plan, NamedSharding(tpu_mesh, P()))).lower(
            state, *(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=tpu_batch) for a in (x, y))).compile()

    tpu_fsdp = compile_for_tpu(tpu_plan)
    tpu_comm = collectives(tpu_fsdp)
    tpu_dp_comm = collectives(compile_for_tpu(jax.tree.map(lambda _: NamedSharding(tpu_mesh, P()), abstract_state)))
    print(tpu_comm, "\n")
    print(f"{'':<16}{'CPU':>4}{'TPU':>5}")
    for kind in ("all-gather", "all-to-all", "all-reduce", "reduce-scatter"):
        print(f"{kind:<16}{comm.count(kind):>4}{tpu_comm.count(kind):>5}")
    print(f"\nTPU ring estimates: FSDP {format_bytes(tpu_comm.estimated_bytes)}, "
          f"data parallel {format_bytes(tpu_dp_comm.estimated_bytes)}")

    (scatter,) = [op for op in tpu_comm.ops if op.kind == "reduce-scatter"]
    assert (scatter.result_type, scatter.form) == ("f32[8,256]", "fused")  # linear1's gradient: this chip's 1/8
    (summed,) = [op for op in tpu_comm.ops if op.kind == "all-reduce"]
    assert "f32[256,10]" in summed.result_type  # linear2's narrow kernel: summed whole, as on CPU, then sliced
    assert all(op.result_type.startswith("bf16[") for op in tpu_comm.ops if op.kind == "all-gather")
    assert tpu_dp_comm.kinds == {"all-reduce"} and tpu_dp_comm.result_bytes == param_bytes + 4  # DP on the TPU
    assert tpu_comm.estimated_bytes < tpu_dp_comm.estimated_bytes  # bf16 gathers: fewer bytes than DP

# %% [markdown]
# The TPU program is the opening's chain for `linear1`: its gradient is a **reduce-scatter**, one fused
# op that leaves each chip only its `f32[8,256]` block of the sum. The narrow `(256, 10)` kernel's
# gradient is not: the compiler merged it with the biases and the loss into one all-reduce and slices
# it, as the CPU does. And the all-gathers move **bf16**, half the bytes: a float32 matmul on TPU
# multiplies in bf16 by default, so the operands are converted before gathering. This libtpu chooses
# array by array, and another version may choose otherwise.

# %% [markdown]
# **The memory on a TPU, at a real size.** A 75 KiB program lives mostly in a TPU's on-chip VMEM
# (128 MiB on a v5e), so its figures say little about HBM. So widen the two layers to
# `2048 -> 16384 -> 2048` (256 MiB of float32 weights, 768 MiB with Adam's moments), take a global
# batch of 16,384, and compile the FSDP step for 2 and 8 chips and the data-parallel step for 8.
#
# **Which compiler effort?** When you run a step, `jax.jit` compiles it at the compiler's default
# effort. At that effort each of these programs takes several times longer to compile than this whole
# notebook may take, so the cell asks for the least effort, `O0`, and every figure it prints is an O0
# figure. The two efforts report different memory: at O0 the TPU compiler puts nothing in the on-chip
# VMEM, and its programs can need more HBM than the default effort's. The table after the cell gives
# the default effort's figures, which are what you will see. `footprint` is each chip's HBM (jax 0.10.2
# does not report it, so there it is an estimate: arguments + outputs + temporaries - aliased):

# %%
class WideMLP(MLP):  # the same two layers, wider
    def __init__(self, rngs):
        self.linear1 = nnx.Linear(2048, 16384, rngs=rngs)
        self.linear2 = nnx.Linear(16384, 2048, rngs=rngs)


def create_wide():
    model = WideMLP(nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


WIDE_PARAM_BYTES = 4 * (2 * 2048 * 16384 + 16384 + 2048)


def compile_wide(strategy, chips, effort="O0"):
    """The wide train step compiled for `chips` (TPU devices of a topology), its state placed by `strategy`
    ('FSDP': this notebook's rule; 'data parallel': replicated) and the batch split; `effort` 'O0' is the
    compiler's least effort, None its default."""
    wide_mesh = jax.make_mesh((len(chips),), ("fsdp",), axis_types=(AxisType.Auto,), devices=chips)
    wide_graphdef, wide_state = nnx.split(nnx.eval_shape(create_wide))
    plan = (jax.tree_util.tree_map_with_path(partial(fsdp_rule, mesh=wide_mesh), wide_state) if strategy == "FSDP"
            else jax.tree.map(lambda _: NamedSharding(wide_mesh, P()), wide_state))

    def wide_step(state, x, y):
        model, optimizer = nnx.merge(wide_graphdef, state)
        loss = train_step(model, optimizer, x, y)
        return nnx.state((model, optimizer)), loss

    structs = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), wide_state, plan)
    batch = [jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(wide_mesh, P("fsdp")))
             for shape, dtype in (((16384, 2048), jnp.float32), ((16384,), jnp.int32))]
    lowered = jax.jit(wide_step, donate_argnums=0, out_shardings=(plan, NamedSharding(wide_mesh, P()))).lower(
        structs, *batch)
    with compile_effort(effort):  # None: the compiler's default
        return lowered.compile()


if ok:
    wide = {}
    for strategy, n in (("FSDP", 2), ("FSDP", 8), ("data parallel", 8)):
        program = compile_wide(strategy, topo.devices[:n])
        wide[strategy, n] = memory_per_device(program)
        if (strategy, n) == ("FSDP", 8):
            wide_comm = collectives(program)
        del program  # free each compiled program before the next
    print(f"TPU v5e, O0 effort{'':<9}{'state':>11}{'temporaries':>13}{'HBM':>11}")
    for (strategy, n), mem in wide.items():
        print(f"{strategy + f', {n} chips':<27}{format_bytes(mem.alias):>11}{format_bytes(mem.temp):>13}"
              f"{format_bytes(mem.footprint):>11}")
    fsdp_wide, dp_wide = wide["FSDP", 8], wide["data parallel", 8]
    assert 6 * fsdp_wide.alias < dp_wide.alias  # the stored state (donated): about 1/8
    assert fsdp_wide.temp > WIDE_PARAM_BYTES  # the working memory: more than the whole float32 model ...
    assert fsdp_wide.temp > dp_wide.temp  # ... and more than data parallelism's
    assert fsdp_wide.footprint < dp_wide.footprint  # in all, still less HBM
    state_ratio, temp_ratio = wide["FSDP", 2].alias / fsdp_wide.alias, wide["FSDP", 2].temp / fsdp_wide.temp
    print(f"from 2 to 8 chips: state / {state_ratio:.1f}, temporaries / {temp_ratio:.2f}")
    assert 3.9 < state_ratio < 4.1  # the state is divided by 4 ...
    assert 1 < temp_ratio < 2  # ... the temporaries shrink too, far more slowly

# %% [markdown]
# At O0, FSDP stores about 1/8 of data parallelism's state (the donated parameters and Adam moments).
# Its temporaries are larger than the whole float32 model and than data parallelism's, because each
# chip rebuilds every weight whole. In all FSDP still needs less HBM per chip, because data
# parallelism's copies of the state dominate. From 2 to 8 chips the state is divided by 4, but the
# temporaries shrink by far less: the gathered float32 weights (256 MiB) are the same on every mesh,
# while the activations of the fixed global batch are divided among more chips.
#
# At the default effort, the one your runs use, the same programs need (compiled by the course's
# tests, `tests/test_10_fsdp_default_effort.py`, which read this notebook's `compile_wide`):
#
# | TPU v5e, default effort (jax 0.12, libtpu 0.0.50.1) | state | temporaries | HBM |
# |---|---|---|---|
# | FSDP, 2 chips | 384.1 MiB | 1.3 GiB | 1.5 GiB |
# | FSDP, 8 chips | 96.0 MiB | 723.8 MiB | 634.0 MiB |
# | data parallel, 8 chips | 768.2 MiB | 256.9 MiB | 1.0 GiB |
#
# The comparisons hold at both efforts: FSDP stores an eighth, its temporaries are larger than data
# parallelism's, and its HBM is smaller. The default effort gives data parallelism much smaller
# temporaries than O0 does (257 against 416 MiB), and FSDP less HBM on 8 chips (634 against 673 MiB).
# Its FSDP temporaries shrink faster with the chip count, too, from 1.3 GiB on 2 chips to 724 MiB on 8.
#
# The wide program also shows something the toy one does not. Its collectives include
# collective-permutes inside loops: the TPU compiler has split a matmul into pieces that each overlap
# one transfer, the **collective matmul** that notebook 08 describes. And at this size the weights are
# gathered in float32, not bf16, so the toy program's bf16 gathers are a choice this libtpu makes for
# small arrays, not a rule:

# %%
if ok:
    print(wide_comm)
    assert any(op.kind == "collective-permute" and op.in_loop for op in wide_comm.ops)  # a collective matmul
    assert any(op.kind == "all-gather" and op.result_type.startswith("f32[") for op in wide_comm.ops)

# %% [markdown]
# A reduce-scatter delivers only each device's block of the sum. `jax.lax.psum_scatter` inside
# `jax.shard_map` writes one by hand, for 8 partial gradients shaped like the `(64, 256)` kernel. Next to
# it is the CPU compiler's form, `psum` and a slice:

# %%
partial_grads = jax.random.normal(jax.random.key(1), (8 * 64, 256))  # 8 stacked (64, 256) partial gradients


@partial(jax.shard_map, mesh=mesh, in_specs=P("fsdp"), out_specs=P("fsdp"))
def by_reduce_scatter(g):
    return jax.lax.psum_scatter(g, "fsdp", scatter_dimension=0, tiled=True)


@partial(jax.shard_map, mesh=mesh, in_specs=P("fsdp"), out_specs=P("fsdp"))
def by_all_reduce_and_slice(g):
    return jax.lax.dynamic_slice_in_dim(jax.lax.psum(g, "fsdp"), jax.lax.axis_index("fsdp") * 8, 8, axis=0)


rs = collectives(jax.jit(by_reduce_scatter).lower(partial_grads).compile())
ar = collectives(jax.jit(by_all_reduce_and_slice).lower(partial_grads).compile())
print(rs, "\n")
print(ar)
assert [(op.kind, op.shapes) for op in rs.ops] == [("reduce-scatter", ((8, 256),))]
assert [(op.kind, op.shapes) for op in ar.ops] == [("all-reduce", ((64, 256),))]
assert_close(jax.jit(by_reduce_scatter)(partial_grads), partial_grads.reshape(8, 64, 256).sum(0), rtol=1e-5)

# %% [markdown]
# The same numbers, but the reduce-scatter's result is an `(8, 256)` block where the all-reduce's is the
# whole `(64, 256)` sum, so the ring formula estimates half the bytes sent for it.
#
# Does FSDP then communicate less than data parallelism? No. A ring all-reduce *is* a reduce-scatter
# followed by an all-gather. Data parallelism does both on the gradients. FSDP reduce-scatters the
# gradients and all-gathers the weights, which is the same volume at best, and about 1.5 times as much
# when a large model gathers its weights again in the backward pass. On the CPU compiler, where the
# reduce-scatter stays a full all-reduce, FSDP's ring estimate is above data parallelism's (the hidden
# cell at the end of this section checks it with the CPU compiler's figures):

# %%
print(f"FSDP {format_bytes(comm.estimated_bytes)}, data parallel {format_bytes(dp_comm.estimated_bytes)}"
      " per device per step (ring estimates from the compiled programs)")

# %% [markdown]
# ### The cost line: what the chain costs in seconds (an estimate)
#
# Under the opening's chain, the cost line of notebooks 07 to 09, at a TPU v5e chip's published rates:
# `C` = 197 TFLOP/s, and `W` = 100 GB/s here, because on a v5e-8 (a 2x4 torus) the 8-chip `fsdp` axis
# spans both torus axes, so a ring sends over two links at once. With `t` examples per device, `n`
# devices, kernels of `K` weights (`W1 + W2`) gathered in `b` bytes per weight, per device:
#
# | part | formula | why |
# |---|---|---|
# | compute | `(4t·W1 + 6t·W2) / C`, about `6Nt / C` | notebook 07's matmuls: each device multiplies whole kernels with its own `t` examples |
# | gathers | `(n-1)/n · b·K / W` | each device receives the 7/8 of every kernel it does not hold |
# | reduce-scatter | `(n-1)/n · 4K / W` | each device receives 7/8 of the partial sums of its own block of each gradient |
#
# With `b` = 4 the two transfers add up to data parallelism's all-reduce, `2(n-1)/n · 4N`, so the rule
# is notebook 07's: they hide when `t > (4/3)(n-1)/n · C/W`, and the examples per device decide, not the
# model's size. The TPU program above departs from the textbook in two ways, so the cell checks the
# formulas on the parts it does by the book: it gathers both kernels in bf16 (`b` = 2), and it
# reduce-scatters `linear1`'s gradient but all-reduces the narrow `linear2` kernel's with the biases.
# The bytes are read from its collectives and the seconds from `estimate_step`, which times that
# program op by op on the v5e-8 it was compiled for:

# %%
if ok:
    V5E = CHIPS["v5e"]
    C, W = V5E.peak_flops, V5E.axis_bandwidth(2, 2) + V5E.axis_bandwidth(4, 4)  # 197e12; 2 x 50e9 B/s
    n, t, W1, W2 = tpu_mesh.shape["fsdp"], x_fsdp.sharding.shard_shape(x.shape)[0], 64 * 256, 256 * 10
    fsdp_flops = 4 * t * W1 + 6 * t * W2  # notebook 07's matmuls, for this device's 8 examples
    gather_sent = (n - 1) / n * 2 * (W1 + W2)  # both kernels, gathered in bf16
    scatter_sent = (n - 1) / n * 4 * W1  # linear1's gradient, reduce-scattered in float32
    tpu_time = estimate_step(tpu_fsdp, tpu_mesh)  # the TPU program, op by op
    first_matmul = next(k for k, op in enumerate(tpu_time.timeline) if op.flops)
    gathers = [op for op in tpu_time.timeline[:first_matmul] if op.kind == "all-gather"]  # the kernels, first
    (scattered,) = [op for op in tpu_time.timeline if op.kind == "reduce-scatter"]
    print(f"cost line (estimate, v5e rates): compute {fsdp_flops:,} FLOPs / C = {fsdp_flops / C * 1e9:.1f} ns; "
          f"gathers {gather_sent:,.0f} B / W = {gather_sent / W * 1e6:.2f} µs; "
          f"reduce-scatter {scatter_sent:,.0f} B / W = {scatter_sent / W * 1e6:.2f} µs")
    print(f"estimate_step: {tpu_time.flops:,.0f} FLOPs; gathers {sum(op.seconds for op in gathers) * 1e6:.2f} µs; "
          f"reduce-scatter {scattered.seconds * 1e6:.2f} µs")
    print(f"in float32 the transfers hide above t = (4/3)(n-1)/n · C/W = {4 / 3 * (n - 1) / n * C / W:,.0f} "
          f"examples per device; here t = {t}")
    assert tpu_time.flops == fsdp_flops  # every matmul of the TPU program, counted from its shapes
    assert len(gathers) == 2 and np.isclose(sum(op.bytes for op in gathers), 2 * (W1 + W2))  # both kernels, bf16
    assert np.isclose(sum(op.seconds for op in gathers), gather_sent / W)  # the formula's seconds
    assert np.isclose(scattered.bytes, 4 * W1 / n) and np.isclose(scattered.seconds, scatter_sent / W)
    assert gather_sent / W + scatter_sent / W > 100 * fsdp_flops / C  # 8 examples: all communication
else:
    print(why)

# %% [markdown]
# **FSDP saves memory, not communication.** Counted in values, it sends the same traffic as data
# parallelism or more. Counted in bytes it can send less on a TPU, because this libtpu gathers the small
# program's weights in bf16 (the TPU cell above asserts it), but the wide program above gathers float32.
# Whether those bytes cost time depends on the matmuls they can hide behind: notebook 14 turns them
# into seconds.
#
# **Hybrid sharding (HSDP).** Between slices or hosts the links are slower, and gathering every weight
# across all of them each step costs. HSDP splits the state over an `fsdp` axis inside a group and
# replicates it over a `replica` axis across groups, and the batch splits over both. On a `(2, 4)` mesh
# the same rule (it reads only the `fsdp` axis) gives:

# %%
hybrid_mesh = jax.make_mesh((2, 4), ("replica", "fsdp"), axis_types=(AxisType.Auto, AxisType.Auto))
hybrid_plan = jax.tree_util.tree_map_with_path(partial(fsdp_rule, mesh=hybrid_mesh), nnx.state(nnx.eval_shape(create)))
hybrid_batch = NamedSharding(hybrid_mesh, P(("replica", "fsdp")))  # 8 examples per device, as before
hybrid = collectives(train_step.lower(*create_sharded(hybrid_plan)(), jax.device_put(x, hybrid_batch),
                                      jax.device_put(y, hybrid_batch)).compile())
print(hybrid)
kernel_bytes = (64 * 256 + 256 * 10) * 4
assert {op.group_size for op in hybrid.ops if op.kind == "all-gather"} == {4}  # inside one replica group
assert sum(op.result_bytes for op in hybrid.ops if op.group_size == 2) == kernel_bytes // 4  # across groups
assert sum(op.result_bytes for op in hybrid.ops if op.group_size == 8) == (256 + 10 + 1) * 4  # biases, loss

# %% [markdown]
# Groups of 4 are the `fsdp` axis, groups of 2 the `replica` axis. The weights are gathered inside a
# group. The kernel gradients are summed inside it too, each device keeping its quarter, and only that
# quarter is all-reduced across the 2 groups. So a quarter of the kernel gradients crosses the slow
# links, where data parallelism sends all of them. (The small replicated biases and the loss are summed over
# all 8.) MaxText's `dcn_data_parallelism` with `ici_fsdp_parallelism` builds this mesh, and notebook 21
# builds multi-slice meshes.
#
# In order (the TPU program, at the default effort, where libtpu is here): the kernels gathered before
# the first matmul, the gradients reduced (scattered on TPU) after the last. In between sit the backward
# pass's own collectives, which the CPU list above explains: the logits' gradient gathered over the
# batch (the third all-gather) and the all-to-all that turns "split over hidden units" back into "split
# over examples".

# %%
fsdp_steps = schedule(*((tpu_fsdp, tpu_mesh) if ok else (compiled_fsdp, mesh)))
fsdp_kinds = [s.kind for s in fsdp_steps]
matmul_at = [i for i, kind in enumerate(fsdp_kinds) if kind == "matmul"]
sums_at = [i for i, s in enumerate(fsdp_steps)  # the gradients' sums (a scalar loss may be summed on its own)
           if s.kind in ("all-reduce", "reduce-scatter") and not re.fullmatch(r"\w+\[\]", s.result_type)]
assert set(fsdp_kinds[:matmul_at[0]]) == {"all-gather"}  # a weight is gathered before the first matmul
assert matmul_at[-1] < sums_at[0]  # and the gradients are reduced after the last one
fsdp_time = estimate_step(tpu_fsdp, tpu_mesh) if ok else estimate_step(compiled_fsdp, mesh, chip="v5e")
draw_timeline(fsdp_time, title=f"FSDP train step, {'compiled for' if ok else 'timed at the rates of'} a TPU v5e-8")

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU and TPU compilers' exact figures, §5: collectives and their order
cpu_kinds = [s.kind for s in schedule(compiled_fsdp, mesh)]
print(f"This compiler's FSDP step: {dict(comm.counts)}. Its gradient slices: {', '.join(slices)}.")
print("Its scheduled order:", " ".join("MM" if k == "matmul" else k for k in cpu_kinds))
if ok:
    print("The TPU compiler's order (default effort):", " ".join("MM" if k == "matmul" else k for k in fsdp_kinds))
if CPU:  # what the CPU compiler inserts
    assert comm.counts == {"all-reduce": 1, "all-gather": 3, "reduce-scatter": 0, "all-to-all": 1,
                           "collective-permute": 0}
    assert [op.shapes for op in comm.ops if op.kind == "all-gather"][:2] == [((64, 256),), ((256, 10),)]
    (all_reduce,) = [op for op in comm.ops if op.kind == "all-reduce"]
    assert all_reduce.result_bytes == dp_comm.result_bytes == param_bytes + 4  # the whole gradient, + the loss
    assert {"f32[256,8]", "f32[10,32]"} <= set(slices)  # 1/8 of each kernel gradient (in its transposed layout)
    assert comm.estimated_bytes > dp_comm.estimated_bytes  # FSDP's ring estimate above data parallelism's
    assert cpu_kinds[:2] == ["all-gather"] * 2  # both kernels, in two gathers, before the first matmul
    assert "matmul" not in cpu_kinds[cpu_kinds.index("all-reduce"):]  # the one sum, after the last matmul
    assert [op.kind for op in scattered_by.ops] == ["all-reduce"]  # the Explicit twin's sum: all-reduce and slice
    if ok:  # the TPU compiler gathers as often, and reduce-scatters where the CPU compiler does not
        assert comm.count("reduce-scatter") == 0 and tpu_comm.count("all-gather") == comm.count("all-gather")
if ok:  # the TPU program of this libtpu, at the default effort
    assert fsdp_kinds[:2] == ["all-gather"] * 2  # both kernels, in two gathers, before the first matmul
    assert "matmul" not in fsdp_kinds[fsdp_kinds.index("reduce-scatter"):]

# %% [markdown]
# ## 6. FSDP trains like data parallelism
#
# Train both 5 steps from the same initial parameters and compare them with each other and with the
# single-device reference:

# %%
dp_losses = [float(train_step(dp_model, dp_optimizer, x_fsdp, y_fsdp)) for _ in range(5)]
fsdp_losses = [float(train_step(model, optimizer, x_fsdp, y_fsdp)) for _ in range(5)]
print("reference:    ", np.round(ref_losses, 4))
print("data parallel:", np.round(dp_losses, 4))
print("FSDP:         ", np.round(fsdp_losses, 4))
assert_close(fsdp_losses, dp_losses)
assert_close(fsdp_losses, ref_losses)

# %% [markdown]
# The parameters stayed sharded, and they match the reference's. Compare shardings with
# `is_equivalent_to`, not by their specs: the compiler may write the trained kernel's spec as
# `P('fsdp',)`, without the rule's trailing `None`, and such specs compare unequal.

# %%
planned = by_name(shardings)["0/linear1/kernel"]
trained = model.linear1.kernel[...].sharding
print("planned:", planned.spec, "  after training:", trained.spec)
assert trained.is_equivalent_to(planned, 2)  # the same layout, however its spec is written
assert shard_table(model.linear1.kernel[...]).shard_shapes == {(8, 256)}
for trained_leaf, ref_leaf in zip(jax.tree.leaves(nnx.state(model, nnx.Param)),
                                  jax.tree.leaves(nnx.state(ref_model, nnx.Param)), strict=True):
    assert_close(trained_leaf, ref_leaf, atol=RTOL)  # gathered to the host

# %% [markdown]
# ## Takeaways
# - Data parallelism stores 12 bytes per parameter on every device. FSDP splits the large parameters and
#   their Adam moments across the same devices (`f32[64@fsdp,256]`), and the small biases stay replicated.
# - Write the rule as `(path, leaf) -> NamedSharding`, map it with `jax.tree_util.tree_map_with_path`,
#   plan on `nnx.eval_shape` state, and create the model sharded: no device holds it whole.
# - What a device stores is divided by the device count. The step's temporaries shrink far more slowly,
#   because each device gathers every weight whole. On the CPU compiler they do not shrink at all (about
#   twice the model). On a TPU at a real size they fall from 960 to 721 MiB between 2 and 8 chips at
#   `O0`, and from 1.3 GiB to 724 MiB at the default effort, while the state falls 4 times. They stay
#   larger than data parallelism's.
# - Say which compiler effort produced a TPU memory figure. At `O0` nothing goes to VMEM and HBM can be
#   larger; your runs use the default effort.
# - The step all-gathers the weights and reduce-scatters the gradients (the CPU compiler uses an
#   all-reduce and a slice instead). That is data parallelism's traffic or more, so FSDP saves memory,
#   not communication. HSDP sends only each group's shard of the gradients across groups.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** Write the FSDP rule as a function `fsdp_spec(path, leaf)` that returns a
# `PartitionSpec` (not a sharding, so it does not depend on a mesh): for a mesh axis `'fsdp'` of 8
# devices, a leaf with more than 1,024 elements gets one dimension split on `'fsdp'`, one that 8
# divides; every other leaf, and a large one with no such dimension, is replicated: `P()`. The checker
# calls it on every leaf of a test state, as `jax.tree_util.tree_map_with_path` would.

# %%
from spmd_course.exercises import ex10_fsdp as ex


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
# **Exercise 3.** Section 5 summed gradients shaped like a `(64, 256)` float32 kernel over 8 devices.
# Estimate with the ring formula how many bytes each device sends for the reduce-scatter, and how many for
# the all-reduce (followed by a slice) that the CPU compiler uses instead.

# %%
answer_3 = NOT_ANSWERED  # a pair (reduce-scatter bytes, all-reduce bytes)
ex.gradient_traffic.check(answer_3);

# %% [markdown]
# **Exercise 4: FSDP by hand.** Write this notebook's FSDP step yourself, in `jax.shard_map`, so that you
# choose every collective the compiler chose in section 5. The checker runs your per-device function
# `fsdp_loss_and_grads(params, x, y)` on the 8-device `fsdp` mesh, for the MLP `64 -> 256 -> 10`:
#
# | argument or result | what one device holds |
# |---|---|
# | `params` | `{'linear1': {'kernel', 'bias'}, 'linear2': {...}}`: its block of each kernel's rows, `(8, 256)` and `(32, 10)`, and both biases whole |
# | `x`, `y` | its 8 of the 64 examples and their labels |
# | `loss` (returned) | the mean cross-entropy over all 64 examples, the same on every device |
# | `grads` (returned) | shaped like `params`: its block of rows of each kernel's full-batch gradient, and the biases' gradients whole |
#
# A right answer takes about 15 lines: gather each kernel whole, compute the loss and its gradient, and
# sum each kernel's gradient over the devices so that each keeps only its own rows. The checker compares
# the loss and the gradients with the single-device ones, and reads the compiled program with
# `collectives()`: it wants the kernels gathered whole, as in section 5, and their gradients
# reduce-scattered, as the TPU compiles this step. Nothing compiles until you answer.

# %%
def fsdp_loss_and_grads(params, x, y):
    ...  # gather, compute, reduce-scatter; return (loss, grads)


answer_4 = NOT_ANSWERED  # set it to fsdp_loss_and_grads once you have written it
ex.fsdp_by_hand.check(answer_4);

# %% [markdown]
# **Next:** [11 · A sharded transformer, end to end](11_transformer.ipynb)
