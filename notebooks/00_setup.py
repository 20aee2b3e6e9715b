# %% [markdown]
# # 00 · How this course runs: eight devices anywhere, and a first sharded array
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/00_setup.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/00_setup.ipynb)
#
# Every notebook of this course shards arrays over **8 devices**, and runs the same on a laptop, in CI,
# on Binder, on Colab and on a real 8-accelerator machine. This notebook shows how that works, why the
# device count has to be chosen before JAX does anything, and then takes a first sharded array apart
# three ways: its spec, its per-device shard table, and a picture.
#
# **You will learn**
# - what the setup cell at the top of every notebook does, and why it must run first;
# - how to check which devices you got (real or simulated);
# - how `P('data', 'model')` on a `(4, 2)` mesh cuts a `(128, 512)` array into `(32, 256)` blocks,
#   read three ways: the type `f32[128@data,512@model]`, the shard table, and the picture;
# - what happens when you ask for another device count too late, and how to recover.

# %%
# Setup (the same cell opens every notebook; notebook 00 explains it).
import sys
from pathlib import Path

if "google.colab" in sys.modules and not Path("spmd-course").exists():
    # !git clone -q --depth 1 https://github.com/spmd-course/spmd-sharding-course spmd-course
    # %pip install -q -r spmd-course/requirements.txt
sys.path[:0] = [str(p) for p in (Path.cwd().parent, Path("spmd-course")) if (p / "utils").is_dir()]

from utils import setup_devices

SETUP = setup_devices(8)

# %% [markdown]
# ## 1. What the setup cell did
#
# JAX creates its devices **once**, at the first JAX operation (`jnp.ones`, `jax.devices()`, a
# `jit` call, ...). Where a machine has no 8 accelerators, JAX can still pretend: the CPU backend
# can be split into N *simulated* devices, with `jax.config.update("jax_num_cpu_devices", N)`. Each
# simulated device is a separate XLA device with its own buffers; collectives between them are real
# memory copies. Only speed is missing, which is fine: this course is about **layouts**, not FLOPs.
#
# `setup_devices(8)` from the course's `utils` makes that choice for you, before any JAX operation:
#
# | where you run | what you get |
# |---|---|
# | laptop, CI, Binder (no accelerator) | 8 simulated CPU devices |
# | Colab TPU (a v5e-1: **one** TPU device), a 1-GPU machine | 8 simulated CPU devices; the CPU is made the only platform, so `jax.make_mesh` works unchanged |
# | 8 or more GPUs/TPUs (a TPU v5e-8, an 8-GPU server) | the 8 real accelerators |
#
# On Colab the same cell first clones the course and installs its pinned requirements, because a
# notebook opened from GitHub arrives without the rest of the repository. Binder's `start` script
# sets the device count for every kernel too.
#
# The cell returned a record of its choice. Check what you got:

# %%
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import NOT_ANSWERED, DeviceCountError, draw_mesh, draw_sharding, shard_table, tile_labels, type_string

print("devices:        ", jax.devices())
print("device_count:   ", jax.device_count())
print("default backend:", jax.default_backend())
print("simulated:      ", SETUP.simulated, "-", SETUP.reason)

assert jax.device_count() == 8 == SETUP.count
assert len({d.id for d in jax.devices()}) == 8  # eight distinct devices, not one device eight times

# %% [markdown]
# ## 2. A first sharded array
#
# Arrange the 8 devices as a `(4, 2)` grid with named axes, a **mesh**: `data` runs down (4 devices),
# `model` runs across (2 devices). Notebook 01 is all about meshes; for now, here it is:

# %%
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
print(mesh)
draw_mesh(mesh)

# %% [markdown]
# A `PartitionSpec` says, dimension by dimension, which mesh axis splits it. The JAX guide that
# seeded this course claims:
#
# > `P('data', 'model')` with mesh `(4, 2)`: `(128, 512)` → each device gets `(32, 256)`.
#
# Dimension 0 (128 rows) is split over `data` (4 devices) → 32 rows; dimension 1 (512 columns) over
# `model` (2 devices) → 256 columns. Put an array there with `jax.device_put` and check the claim:

# %%
x = jax.device_put(jnp.arange(128 * 512, dtype=jnp.float32).reshape(128, 512),
                   NamedSharding(mesh, P("data", "model")))

print("global shape:", x.shape)
print("spec:        ", x.sharding.spec)
print("shard shape: ", x.sharding.shard_shape(x.shape))
assert x.sharding.shard_shape(x.shape) == (32, 256)
assert all(s.data.shape == (32, 256) for s in x.addressable_shards)

# %% [markdown]
# ## 3. The same layout, three ways
#
# **The type.** The course writes a sharded array's type as `f32[128@data,512@model]`: each dimension's
# size, and after `@` the mesh axis that splits it. On a mesh whose axes are *Explicit* (as here),
# `jax.typeof` prints the same thing, because the sharding is part of the type (notebook 01 explains
# Explicit vs Auto axes). `utils.type_string` writes it for any sharded array.

# %%
print("jax.typeof: ", jax.typeof(x))
print("type_string:", type_string(x))
assert str(jax.typeof(x)) == "float32[128@data,512@model]"
assert type_string(x) == "f32[128@data,512@model]"

# %% [markdown]
# **The shard table.** One row per device: which slice of the global array it holds, whether it is a
# replica, the block's shape and bytes. This is `x.addressable_shards`, tabulated:

# %%
table = shard_table(x)
print(table)

assert table.shard_shapes == {(32, 256)}
assert set(table.bytes_per_device.values()) == {32 * 256 * 4}  # 32 KiB on every device
assert table.total_bytes == x.nbytes  # no replication: the 8 blocks add up to the array
# Device 3 holds rows 32:64 and columns 256:512, and its block is exactly that slice of x:
shard3 = next(s for s in x.addressable_shards if s.device.id == 3)
np.testing.assert_array_equal(np.asarray(shard3.data), np.asarray(x)[32:64, 256:512])

# %% [markdown]
# **The picture.** `draw_sharding` draws each block where it sits in the array, coloured by the device
# that holds it (device colours are the same in every figure of the course and match `draw_mesh`).
# It returns a matplotlib `Figure`, so the notebook can check what the picture says:

# %%
fig = draw_sharding(x)
labels = tile_labels(fig)
assert len(labels) == 8 and all("(32, 256)" in label for label in labels)
assert "dev 3\n(32, 256)\n32.0 KiB" in labels
fig

# %% [markdown]
# ## 4. Gotcha: the device count is fixed once JAX has started
#
# JAX's backend now exists with 8 devices. Asking for another count cannot work any more. The raw
# JAX error says so in backend vocabulary:

# %%
raised = []
try:
    jax.config.update("jax_num_cpu_devices", 4)
except RuntimeError as err:
    raised.append("jax")
    print("RuntimeError from JAX:\n ", err)

# %% [markdown]
# Re-running the setup cell is harmless (it asks for the same 8). Asking `setup_devices` for another
# count raises `DeviceCountError`, which says what to do: restart the kernel, then run the setup cell
# first. (Setting `XLA_FLAGS` after JAX has started is worse: it is ignored *silently*.)

# %%
assert setup_devices(8) is SETUP  # the same choice again: fine
try:
    setup_devices(4)
except DeviceCountError as err:
    raised.append("utils")
    print("DeviceCountError:\n ", err)
assert raised == ["jax", "utils"]
assert jax.device_count() == 8  # nothing changed

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. For the
# reference answer, run the exercise's `reveal()`, e.g. `ex.columns_spec.reveal()`.
#
# **Exercise 1.** On a 1-D mesh of the 8 devices with axis `data`, which `PartitionSpec` gives each
# device a `(128, 64)` block of a `(128, 512)` array?

# %%
from exercises import ex00_setup as ex

answer_1 = NOT_ANSWERED  # e.g. P(...)
ex.columns_spec.check(answer_1);

# %% [markdown]
# **Exercise 2.** How many bytes does each device hold for an array of type `f32[256@data,128@model]`
# on the `(4, 2)` mesh above? Work it out, then check it with `shard_table` if you like.

# %%
answer_2 = NOT_ANSWERED  # a whole number of bytes
ex.bytes_per_device.check(answer_2);

# %% [markdown]
# ## Takeaways
# - The device count is decided at JAX's first operation; the setup cell decides it first, the same way
#   in every notebook: 8 real accelerators where they exist, else 8 simulated CPU devices.
# - A sharded array can be read three ways that must agree: its type (`f32[128@data,512@model]`), its
#   shard table (who holds which slice, how many bytes) and its picture.
# - `P('data', 'model')` on a `(4, 2)` mesh gives each device a `(32, 256)` block of a `(128, 512)`
#   array: 32 KiB each, 256 KiB in total, nothing replicated.
# - Asking for another device count after JAX started is an error; restart the kernel.
#
# **Next:** [01 · Device meshes](01_meshes.ipynb): the grid of devices, its axis names and types.
