# %% [markdown]
# # 00 · A first sharded array, on eight devices anywhere
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/00_setup.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/00_setup.ipynb)
#
# When a model's weights outgrow one device's memory, cut into blocks, one per device, they fit, but
# then you must know which device holds which block and what each costs. Cut 8 ways, a `(128, 512)` float32 array
# of 256 KiB leaves a 32 KiB block on each device, and the 8 blocks add up to the array with nothing copied.
#
# **You need:** JAX on one device: `jax.numpy` arrays and `jax.jit`. Nothing from the course yet.
#
# This notebook works on any machine, because the hidden setup cell below gives it 8 devices, simulated
# on a laptop's CPU where no accelerators exist.
#
# **You will learn**
# - how `P('data', 'model')` on a `(4, 2)` mesh cuts a `(128, 512)` array into `(32, 256)` blocks,
#   read as the type `f32[128@data,512@model]`, as a shard table, and as a picture
# - how many bytes each device holds, and how to check that nothing is copied
# - that a jitted elementwise function on a sharded array keeps its layout and moves no data
# - what the setup cell at the top of every notebook does, and how the course starts on Colab, on
#   Binder and on your own machine
# - what happens when you ask for another device count too late, and how to recover.

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

# %% [markdown]
# ## 1. A first sharded array
#
# The setup cell above gave this notebook 8 devices. Arrange them as a `(4, 2)` grid with named axes, a
# **mesh**: `data` runs down (4 devices), `model` runs across (2 devices). Then cut a `(128, 512)` array
# into one block per device with `P('data', 'model')` and draw where each block went:

# %%
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import collectives, draw_mesh, draw_sharding, shard_table, type_string

# Explicit axes only so that jax.typeof prints the layout in section 2 (notebook 01 explains axis types).
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
x = jax.device_put(jnp.arange(128 * 512, dtype=jnp.float32).reshape(128, 512),
                   NamedSharding(mesh, P("data", "model")))
draw_sharding(x)

# %% [markdown]
# A `PartitionSpec` says, dimension by dimension, which mesh axis splits it. `P('data', 'model')` splits
# dimension 0 (128 rows) over `data` (4 devices), so 32 rows each, and dimension 1 (512 columns) over
# `model` (2 devices), so 256 columns each: every device holds a `(32, 256)` block. First the check:

# %%
print("global shape:", x.shape)
print("spec:        ", x.sharding.spec)
print("shard shape: ", x.sharding.shard_shape(x.shape))
assert x.sharding.shard_shape(x.shape) == (32, 256)
assert all(s.data.shape == (32, 256) for s in x.addressable_shards)

# %% [markdown]
# Then the mesh itself (notebook 01 is all about meshes). Each cell is a device, in its own colour, at its
# `data` and `model` position. The blocks in the picture above wear the same colours, so you can
# match each block to its device:

# %%
print(mesh)
draw_mesh(mesh)

# %% [markdown]
# **A first computation.** Run a function on the sharded array with `jax.jit`. `jnp.sin(x) * 2` works on
# each element on its own, so each device can compute its block of the result from its own block of `x`.
# Because no device needs another's data, the compiled program has no **collectives** (the operations
# that move data between devices), and the result keeps `x`'s layout: its type is `x`'s type. Notebook 04
# builds on this ("computation follows data") and shows programs that do move data.

# %%
scaled_sin = jax.jit(lambda a: jnp.sin(a) * 2)
compiled = scaled_sin.lower(x).compile()
y = compiled(x)
print("x:", jax.typeof(x), "| y = jnp.sin(x) * 2:", jax.typeof(y), "| collectives:", collectives(compiled).count())
assert jax.typeof(y) == jax.typeof(x)  # the same shape and the same layout
assert collectives(compiled).count() == 0  # nothing moved between devices
np.testing.assert_allclose(np.asarray(y), np.sin(np.asarray(x)) * 2, rtol=1e-6)

# %% [markdown]
# ## 2. The same layout, three ways
#
# **The type.** The course writes a sharded array's type as `f32[128@data,512@model]`: each dimension's
# size and, after `@`, the mesh axis that splits it. On a mesh whose axes are *Explicit* (as here),
# `jax.typeof` prints the long form, `float32[128@data,512@model]`, because the sharding is part of the
# type (notebooks 01 and 05 explain Explicit and Auto axes). `type_string` from the course's `utils`
# writes the short form for an array on any mesh.

# %%
print("jax.typeof: ", jax.typeof(x))
print("type_string:", type_string(x))
assert str(jax.typeof(x)) == "float32[128@data,512@model]"
assert type_string(x) == "f32[128@data,512@model]"

# %% [markdown]
# **The shard table.** One row per device: which slice of the global array it holds, whether it is a
# copy (replica), the block's shape and bytes. It is `x.addressable_shards`, tabulated:

# %%
table = shard_table(x)
print(table)

assert x.nbytes == 256 * 1024  # 128 x 512 float32 values: 256 KiB
assert set(table.bytes_per_device.values()) == {32 * 256 * 4}  # 32 KiB on every device
assert table.total_bytes == x.nbytes  # no copies: the 8 blocks add up to the array
# The device at data=1, model=1 holds rows 32:64 and columns 256:512, and its block is exactly that slice:
shard = next(s for s in x.addressable_shards if s.device == mesh.devices[1, 1])
np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(x)[32:64, 256:512])

# %% [markdown]
# **The picture** is the figure at the top of section 1: `draw_sharding` draws each block where it sits,
# labelled with its devices and bytes, in the colour of the device that holds it (the same colour in
# every figure of the course). Type, table and picture must agree.
#
# ## 3. Running the course elsewhere: what the setup cell did
#
# This section is for those who want to run the course somewhere else, or to know what the hidden
# setup cell does. JAX creates its devices **once**, at the first JAX operation (`jnp.ones`,
# `jax.devices()`, a `jit` call, ...). Where a machine has no 8 accelerators, JAX can split the CPU into
# N *simulated* devices, if told before that first operation. Each is a separate XLA device with its own
# buffers, and collectives between them really copy memory. Only speed is missing, and that is no loss
# here because this course is about **layouts**.
#
# `setup_devices(8)` makes that choice:
#
# | where you run | what you get |
# |---|---|
# | laptop, CI, Binder (no accelerator) | 8 simulated CPU devices |
# | Colab TPU (a v5e-1: **one** TPU device), a 1-GPU machine | 8 simulated CPU devices; the CPU is made the only platform, so `jax.make_mesh` works unchanged |
# | 8 or more GPUs/TPUs (a TPU v5e-8, an 8-GPU server) | the 8 real accelerators |
#
# For simulated devices it runs two lines of JAX configuration, which you can use in your own scripts
# right after `import jax`:
#
# ```python
# jax.config.update("jax_platforms", "cpu")      # only the CPU, even where one GPU/TPU exists
# jax.config.update("jax_num_cpu_devices", 8)    # split it into 8 devices
# ```
#
# The cell returned a record of its choice. Check what you got:

# %%
print("devices:           ", jax.devices())
print("default backend:   ", jax.default_backend())
print("simulated:         ", SETUP.simulated, "-", SETUP.reason)
print("jax_num_cpu_devices:", jax.config.jax_num_cpu_devices)

assert SETUP.count == 8 and jax.device_count() >= 8  # a machine with more accelerators keeps them all
assert len({d.id for d in jax.devices()}) == jax.device_count()  # distinct devices, not one device 8 times
if SETUP.simulated:
    assert jax.default_backend() == "cpu" and jax.config.jax_num_cpu_devices == 8

# %% [markdown]
# **Where the course runs.**
#
# - **Colab.** A notebook opened from GitHub arrives alone, so the setup cell first clones the course
#   next to it and installs only the packages that are missing or at another version, never Colab's
#   own Jupyter packages. If a package that the runtime had already imported had to change version, the
#   cell stops with one line asking you to restart the session (Runtime > Restart session) and run the
#   cell again.
# - **Binder** gives 1 to 2 GB of memory, and each open notebook keeps its kernel alive. Shut a
#   notebook's kernel down (Kernel > Shut Down Kernel) before you open the next one.
# - **Your machine**: `make lab` opens JupyterLab with everything installed. Notebook 24 (PyTorch/XLA
#   side by side) runs only there, in its own environment: `make lab-xla`.
#
# %% [markdown]
# ## 4. Gotcha: the device count is fixed once JAX has started
#
# JAX's backend now exists with 8 devices. Asking for another count cannot work any more, and JAX says
# so in backend vocabulary:

# %%
import os
import warnings

from spmd_course.utils import DeviceCountError

count = jax.device_count()
raised = []
try:
    jax.config.update("jax_num_cpu_devices", 4)
except RuntimeError as err:
    raised.append("jax")
    print("RuntimeError from JAX:\n ", err)

# %% [markdown]
# Re-running the setup cell is harmless: it asks for the same 8. Asking `setup_devices` for another
# count raises `DeviceCountError`, which says what to do: restart the kernel, then run the setup cell
# first.

# %%
assert setup_devices(8) is SETUP  # the same choice again: fine
try:
    setup_devices(4)
except DeviceCountError as err:
    raised.append("utils")
    print("DeviceCountError:\n ", err)
assert raised == ["jax", "utils"]
assert jax.device_count() == count  # nothing changed

# %% [markdown]
# > **You will see this online:**
# > ```python
# > os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
# > ```
# > It works only when set before JAX starts (before `import jax` is safest). Set later, it is ignored
# > without a word. Here it asks for 4 devices, after JAX started:

# %%
old_flags = os.environ.get("XLA_FLAGS")
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    seen = jax.device_count()
print("XLA_FLAGS asks for 4; jax.device_count() =", seen, "| warnings:", len(caught))
assert seen == count and caught == []  # no error, no warning, no effect
if old_flags is None:
    del os.environ["XLA_FLAGS"]
else:
    os.environ["XLA_FLAGS"] = old_flags

# %% [markdown]
# The fix: `jax.config.update("jax_num_cpu_devices", N)` right after `import jax` (or the course's
# `setup_devices(N)`). Too late, it raises the error above instead of doing nothing.

# %% [markdown]
# ## Takeaways
# - `P('data', 'model')` on a `(4, 2)` mesh gives each device a `(32, 256)` block of a `(128, 512)`
#   array: 32 KiB each, 256 KiB in total, nothing copied.
# - A sharded array reads three ways that must agree: its type (`f32[128@data,512@model]`), its shard
#   table (who holds which slice, how many bytes) and its picture.
# - The device count is decided at JAX's first operation. The setup cell decides it first, the same way
#   in every notebook: 8 real accelerators where they exist, else 8 simulated CPU devices through
#   `jax.config.update("jax_num_cpu_devices", 8)`.
# - Asking for another device count after JAX started raises an error (`XLA_FLAGS` set too late is
#   silently ignored), so restart the kernel.


# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. For the
# reference answer, run the exercise's `reveal()`, e.g. `ex.columns_spec.reveal()`.
#
# **Exercise 1.** On a 1-D mesh of the 8 devices with axis `data`, which `PartitionSpec` gives each
# device a `(128, 64)` block of a `(128, 512)` array?

# %%
from spmd_course.exercises import ex00_setup as ex
from spmd_course.utils import NOT_ANSWERED

answer_1 = NOT_ANSWERED  # e.g. P(...)
ex.columns_spec.check(answer_1);

# %% [markdown]
# **Exercise 2.** How many bytes does each device hold for an array of type `f32[256@data,128@model]`
# on the `(4, 2)` mesh above? Work it out, then check it with `shard_table` if you like.

# %%
answer_2 = NOT_ANSWERED  # a whole number of bytes
ex.bytes_per_device.check(answer_2);

# %% [markdown]
# **Next:** [01 · Device meshes](01_meshes.ipynb): the grid of devices, its axis names and types.
