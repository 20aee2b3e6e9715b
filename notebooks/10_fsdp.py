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
# each weight whole just before it is used. This notebook is about the first half, the memory: where each
# array goes, how to create it there, and what a device then stores. Notebook 11 reads the step's
# collectives and what they cost.
#
# **You will learn**
# - how to write the FSDP rule as `(path, leaf) -> NamedSharding`, and plan a layout on abstract state
#   before any array exists;
# - how to create a model and its optimizer already sharded, so that no device ever holds the whole model;
# - what FSDP divides by the device count (the stored state) and what shrinks far more slowly (the
#   step's temporaries), on the CPU and in a TPU's HBM at a real size;
# - that FSDP gives the same losses as data parallelism and as a single device.
#
# What each device stores, in the course's types: every kernel and its two Adam moments split on their
# first dimension over `fsdp`, the biases whole. Section 3 reads these types from JAX and checks them:
#
# ```
# w1, mu(w1), nu(w1): f32[64@fsdp,256];  w2: f32[256@fsdp,10];  b1: f32[256];  b2: f32[10]
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
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (NOT_ANSWERED, assert_close, collectives, compile_effort, draw_shardings, format_bytes, memory_per_device, quiet, shard_table, tpu_compiler_available,
                   type_string)

# %% [markdown]
# ## 1. The model, the data, and a single-device reference
#
# Notebook 07's MLP `64 -> 256 -> 10`, its batch of 64 examples, Adam `1e-2` and its `nnx.jit` train
# step (donating the model and optimizer), imported. The single-device run is the reference.
#
# The cells that define this notebook's model, rule and constructor are tagged `save`, so notebook 11
# imports them from `src/spmd_course/models.py` instead of typing them again.

# %%
from spmd_course.models import MLP, train_step, x, y  # notebook 07's model, data and step

# %% tags=["save"]
def mlp_and_adam():
    """Notebook 07's MLP with its Adam optimizer, built from the same seed every time."""
    model = MLP(nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


# %%
ref_model, ref_optimizer = mlp_and_adam()
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
abstract_model, abstract_optimizer = nnx.eval_shape(mlp_and_adam)  # shapes and dtypes only: nothing allocated
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
# to name a large leaf that nothing divides. It takes the mesh as an argument, so the same rule plans any
# mesh that has an `fsdp` axis (`functools.partial` fixes it before mapping).

# %% tags=["save"]
def path_name(path):
    """'linear1/kernel' for the path of an NNX Variable's array."""
    return jax.tree_util.keystr(path, simple=True, separator="/").removesuffix("/value")


def fsdp_rule(path, leaf, *, mesh, min_size=1024):
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


# %%
narrow = by_name(jax.tree_util.tree_map_with_path(partial(fsdp_rule, mesh=mesh), narrow_params))["kernel"]
print("(10, 128) kernel:", narrow.spec, "per device", narrow.shard_shape((10, 128)))
assert narrow.shard_shape((10, 128)) == (10, 16)  # dimension 1 instead

shardings = jax.tree_util.tree_map_with_path(partial(fsdp_rule, mesh=mesh), nnx.state((abstract_model, abstract_optimizer)))
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

# %% tags=["save"]
def create_sharded(shardings):
    """A jitted constructor of `mlp_and_adam()` whose state comes out laid out as `shardings` says."""

    @nnx.jit
    def build():
        model, optimizer = mlp_and_adam()
        state = nnx.state((model, optimizer))
        nnx.update((model, optimizer), jax.lax.with_sharding_constraint(state, shardings))
        return model, optimizer

    return build


# %%
build_fsdp = create_sharded(shardings)
compiled_init = build_fsdp.lower().compile()
init = memory_per_device(compiled_init)
print("init program:", init, "| collectives:", collectives(compiled_init).count())
model, optimizer = build_fsdp()
stored = {"w1": model.linear1.kernel[...], "mu(w1)": optimizer.opt_state[0].mu["linear1"]["kernel"][...],
          "nu(w1)": optimizer.opt_state[0].nu["linear1"]["kernel"][...], "w2": model.linear2.kernel[...],
          "b1": model.linear1.bias[...], "b2": model.linear2.bias[...]}
print(";  ".join(f"{name}: {type_string(a)}" for name, a in stored.items()))

assert init.argument == 0 and init.output + init.temp < param_bytes  # less than the parameters alone, per device
assert [type_string(a) for a in stored.values()] == ["f32[64@fsdp,256]"] * 3 + ["f32[256@fsdp,10]", "f32[256]", "f32[10]"]
assert shard_table(model.linear1.kernel[...]).shard_shapes == {(8, 256)}
for made, initial in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), init_params, strict=True):
    np.testing.assert_array_equal(np.asarray(made), initial)  # the same numbers as the eager reference
draw_shardings(nnx.state(model), ncols=4, same_scale=True)

# %% [markdown]
# The init program takes no arguments and allocates, per device, less than the parameters alone
# (75.0 KiB): no device ever held the whole model. Its random numbers are the reference's, bit for bit:
# with `jax_threefry_partitionable` (on by default) they do not depend on how the array is split.
# The picture draws the parameters on the one scale 07 and 08 use, so the same `(64, 256)` kernel has the
# same size in all three: here it is cut into 8 row blocks, in 08 into 8 column blocks.
#
# > **Three ways to create a sharded model.** Build it eagerly, then `jax.device_put` the state
# > (notebook 07): fine when one device holds the whole model. Run the constructor in `nnx.jit` with
# > sharding constraints (here, 08, 09): nothing whole anywhere. Or plan from `nnx.eval_shape` and
# > compile `jax.jit(init, out_shardings=plan)` (notebook 12, as MaxText does).
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
        plan = jax.tree_util.tree_map_with_path(partial(fsdp_rule, mesh=sub_mesh), nnx.state(nnx.eval_shape(mlp_and_adam)))
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
# and receives the whole summed gradient (notebook 11 reads these collectives in the program). The hidden cell below holds the CPU compiler's
# figures.
#
# That is the CPU compiler's behaviour, not a law. A TPU compiler reduce-scatters the gradient, so it
# need not hold the whole sum, and its temporaries do shrink with the chip count, though far more slowly
# than the state, as section 5's TPU programs show at a real size. To hold only one
# layer's gathered weights at a time, a deep model scans over its layers with rematerialisation
# (`jax.lax.scan`, `jax.checkpoint`). Notebook 13 measures one.

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
# ## 5. The memory on a TPU, at a real size
#
# You need no TPU to see what the TPU compiler does: JAX
# compiles ahead of time for a TPU topology, here a v5e with 8 chips (`v5e:2x4`, notebook 21), from
# `jax.ShapeDtypeStruct`s placed by the same rule. Nothing is allocated and nothing runs. A 75 KiB
# program would live mostly in a TPU's on-chip VMEM (128 MiB on a v5e), so its figures would say little
# about HBM. So widen the two layers to `2048 -> 16384 -> 2048` (256 MiB of float32 weights, 768 MiB
# with Adam's moments), take a global batch of 16,384, and compile the FSDP step for 2 and 8 chips and
# the data-parallel step for 8.
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


ok, why = tpu_compiler_available()
if ok:
    with quiet():  # libtpu's start-up warnings
        topo = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")
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
else:
    print(why)  # no TPU compiler here (libtpu is not installed, or this is not Linux): the CPU figures stand

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
# The wide program's collectives (notebook 11 reads a step's collectives one by one) show two things a
# small program does not. They include collective-permutes inside loops, because the TPU compiler has
# split a matmul into pieces that each overlap one transfer: the **collective matmul** that notebook 08
# describes. And at this size the weights are gathered in float32, whereas notebook 11's small program
# gathers them in bf16, so that is a choice this libtpu makes for small arrays, not a rule:

# %%
if ok:
    print(wide_comm)
    assert any(op.kind == "collective-permute" and op.in_loop for op in wide_comm.ops)  # a collective matmul
    assert any(op.kind == "all-gather" and op.result_type.startswith("f32[") for op in wide_comm.ops)

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
# - FSDP changes where the state lives, not what the step computes: it trains to the same losses and
#   parameters as data parallelism and as one device.

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
# **Next:** [11 · The FSDP step: its collectives, their cost, and HSDP](11_fsdp_step.ipynb)
