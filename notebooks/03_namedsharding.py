# %% [markdown]
# # 03 · NamedSharding and placing data
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/03_namedsharding.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/03_namedsharding.ipynb)
#
# A spec (notebook 02) says how an array is cut, but not on which devices, and a model is not one array:
# it is a tree of dozens of them, each with its own layout. How many bytes each layout leaves on each
# device decides whether the model fits: a `(128, 512)` float32 array of 256 KiB fills 2 MiB of an
# 8-device mesh when replicated, and 256 KiB when fully sharded.
#
# **You need:** notebooks 00 (shard table, `type_string`, `draw_sharding`), 01 (meshes and their axis
# types) and 02 (`PartitionSpec`), plus `jax.numpy` and pytrees (`jax.tree.map`).
#
# A `NamedSharding` pairs a mesh with a `PartitionSpec`, and it is what `jax.device_put` needs to place
# an array, or a whole pytree of them, on the devices.
#
# **You will learn**
# - what `NamedSharding(mesh, spec)` knows before any array exists: `shard_shape`, `device_set`,
#   `is_fully_replicated`
# - how `jax.device_put` places an array, what it leaves untouched, and where a NumPy source is
#   shared instead of copied
# - how to read `x.addressable_shards` (device, index, replica id, shape) next to the global view
# - where `jax.debug.visualize_array_sharding` stops (3-D arrays, bytes, testability) and how
#   `draw_sharding` carries on
# - how many bytes the whole mesh holds for a replicated, a partly replicated and a fully sharded array
# - how to shard a pytree with one sharding, a prefix tree, `jax.tree.map` or a `tree_map_with_path`
#   rule, and why a rule must test the dimension it splits.

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
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import NOT_ANSWERED, draw_sharding, draw_shardings, format_bytes, shard_table, type_string

# %% [markdown]
# ## 1. A sharding is a mesh plus a spec
#
# Take the `(4, 2)` mesh of notebook 00, with Explicit axes so that `jax.typeof` prints the sharding
# as part of the type. A `NamedSharding` is only a description: it knows which devices it spans and
# what block each one gets of an array of any shape, before any array exists.

# %%
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
rows = NamedSharding(mesh, P("data", None))

print("sharding:           ", rows)
print("mesh, spec:         ", dict(rows.mesh.shape), rows.spec)
print("block of (128, 512):", rows.shard_shape((128, 512)))
print("block of (64, 10):  ", rows.shard_shape((64, 10)))
print("fully replicated?   ", rows.is_fully_replicated)

assert rows.shard_shape((128, 512)) == (32, 512)  # 128 rows / 4 'data' devices, columns whole
assert rows.shard_shape((64, 10)) == (16, 10)
assert rows.num_devices == 8
assert not rows.is_fully_replicated  # 'model' is unused: pairs of devices share a block, but not all 8
assert NamedSharding(mesh, P()).is_fully_replicated

# %% [markdown]
# It checks the spec against the mesh as you build it: a spec can name only the mesh's axes. A layout
# that splits over `model` cannot exist on a 1-D mesh `('data',)`:

# %%
mesh_1d = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
errors = []
try:
    NamedSharding(mesh_1d, P(None, "model"))
except ValueError as err:
    errors.append(type(err))
    print("ValueError:", err)
assert errors == [ValueError]

# %% [markdown]
# **Gotcha: `device_set` is a set.** `sharding.device_set` is a Python `set` of device objects: it has no
# order, and its printed order can change from one run to the next. Sort it by device id before you print
# or compare it:

# %%
devices = rows.device_set
print(type(devices).__name__, "of", len(devices), "devices; ids:", sorted(d.id for d in devices))
assert isinstance(devices, set)
assert devices == set(mesh.devices.flat)  # the mesh's devices, every one of them

# %% [markdown]
# ## 2. `jax.device_put` places an array
#
# `jnp.arange` makes an array on one device. `jax.device_put(x, sharding)` returns a **new** array laid
# out as the sharding says. Inspect it:

# %%
x_single = jnp.arange(128 * 512, dtype=jnp.float32).reshape(128, 512)
x = jax.device_put(x_single, rows)

print(f"Shape: {x.shape}")
print(f"Sharding: {x.sharding}")
print(f"Devices: {sorted(d.id for d in x.sharding.device_set)}")
print(f"Shard shape: {x.sharding.shard_shape(x.shape)}, fully replicated: {x.sharding.is_fully_replicated}")

assert x.sharding.is_equivalent_to(rows, x.ndim) and x.sharding.shard_shape(x.shape) == (32, 512)
np.testing.assert_array_equal(np.asarray(x), np.asarray(x_single))  # same values, new layout

# %% [markdown]
# `device_put` copies: the source keeps its own layout and values. Asking for the sharding an array
# already has is free: you get the same object back, nothing is copied.

# %%
print("source after device_put:", x_single.sharding)
assert x is not x_single
assert x_single.sharding.device_set == {jax.devices()[0]}  # still on one device
np.testing.assert_array_equal(np.asarray(x_single), np.arange(128 * 512).reshape(128, 512))
assert jax.device_put(x, rows) is x  # already there: no copy
assert jax.device_put(x, NamedSharding(mesh, P())) is not x  # another layout: a new array

# %% [markdown]
# **Gotcha: a NumPy source may be shared, not copied.** On the CPU backend, `device_put` can use a NumPy
# array's memory directly when the buffer is suitably aligned (64 bytes) and each block is a contiguous
# run of rows. The JAX array then changes when you write into the NumPy array, although JAX arrays are
# immutable (reported as [jax-ml/jax#37830](https://github.com/jax-ml/jax/issues/37830)). Whether your
# buffer is aligned is luck, so the cell below builds an aligned one on purpose to make it repeatable:

# %%
raw = np.empty(128 * 512 * 4 + 64, dtype=np.uint8)
start = -raw.ctypes.data % 64  # first byte on a 64-byte boundary
h = raw[start : start + 128 * 512 * 4].view(np.float32).reshape(128, 512)
h[...] = np.arange(128 * 512, dtype=np.float32).reshape(128, 512)

shared = jax.device_put(h, rows)  # NumPy in, sharded by rows
asked = jax.device_put(h, rows, may_alias=False)  # the documented knob
safe = jax.device_put(jnp.array(h), rows)  # jnp.array copies h first
h[0, 0] = -1.0  # write into the NumPy array afterwards

for name, a in [("shared", shared), ("may_alias=False", asked), ("safe", safe)]:
    print(f"{name + '[0, 0]':<22} after the write: {np.asarray(a)[0, 0]}")
assert np.asarray(safe)[0, 0] == 0.0  # the fix: JAX owns a private copy
if jax.default_backend() == "cpu":  # on CPU the first two arrays share h's memory
    assert np.asarray(shared)[0, 0] == np.asarray(asked)[0, 0] == -1.0

# %% [markdown]
# The knob meant for this, `may_alias=False`, does not help today (a fix is proposed in
# [jax-ml/jax#38086](https://github.com/jax-ml/jax/pull/38086)). The fix is a rule of thumb: do not write
# into a NumPy array after you hand it to JAX, or hand JAX a copy (`jnp.array(h)` copies, and so does
# `h.copy()`).
#
# ## 3. The per-device view next to the global view
#
# `x.addressable_shards` holds one entry per device: the device, the `index` (a tuple of slices into the
# global array), the `replica_id` (0 for the first copy of a block, 1 for the next, ...) and the `data`,
# an ordinary one-device array.

# %%
for s in x.addressable_shards:
    print(f"{s.device}  index={s.index}  replica_id={s.replica_id}  shape={s.data.shape}")

by_device = {s.device: s for s in x.addressable_shards}
first, second = mesh.devices[0]  # the first row of the mesh: data=0, model=0 and 1
assert by_device[first].index == by_device[second].index == (slice(0, 32), slice(None))  # both: rows 0:32
assert (by_device[first].replica_id, by_device[second].replica_id) == (0, 1)  # two copies of the same block
assert by_device[mesh.devices[1, 0]].index == (slice(32, 64), slice(None))  # data=1: the next block
for s in x.addressable_shards:  # every shard is exactly its slice of the global array
    np.testing.assert_array_equal(np.asarray(s.data), np.asarray(x)[s.index])

# %% [markdown]
# Copies are numbered in **mesh order**, not by device id: the copy at the first position along the mesh
# axes the spec leaves out is replica 0. On a mesh built from the devices in reverse order, the mesh's first
# row is devices 7 and 6, so they hold replica 0 of the two column blocks of `P(None, 'model')`:

# %%
mesh_rev = Mesh(np.array(jax.devices()[:8])[::-1].reshape(4, 2), ("data", "model"),
                axis_types=(AxisType.Explicit,) * 2)
x_rev = jax.device_put(x_single, NamedSharding(mesh_rev, P(None, "model")))
first_copies = sorted(s.device.id for s in x_rev.addressable_shards if s.replica_id == 0)
print("mesh rows:", mesh_rev.device_ids.tolist(), "-> replica 0 on devices", first_copies)
assert first_copies == sorted(mesh_rev.device_ids[0].tolist()) == [6, 7]

# %% [markdown]
# The same facts, tabulated by `shard_table`, beside the global view: the array's shape, its type
# (`jax.typeof` on an Explicit mesh, `type_string` anywhere) and the picture. The type reads
# `f32[128@data,512]`: dimension 0 split over `data`, dimension 1 whole.

# %%
table = shard_table(x)
print("global shape:", x.shape, "| type:", type_string(x), "| jax.typeof:", jax.typeof(x))
print(table)

assert type_string(x) == "f32[128@data,512]" and str(jax.typeof(x)) == "float32[128@data,512]"
assert table.shard_shapes == {(32, 512)}
assert {r.device: r.replica for r in table.rows} == {d.id: j for (_, j), d in np.ndenumerate(mesh.devices)}
assert table.total_bytes == 2 * x.nbytes  # every block is held twice
draw_sharding(x)

# %% [markdown]
# The axis type (notebook 01) does not change where `device_put` puts the data. On a mesh with Auto axes
# the same spec gives the same blocks on the same devices. Only `jax.typeof` differs, because an Auto
# axis is not part of the type, so the sharding is left out of it:

# %%
mesh_auto = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
x_auto = jax.device_put(np.asarray(x_single), NamedSharding(mesh_auto, P("data", None)))
print("Auto mesh:", type_string(x_auto), "| jax.typeof:", jax.typeof(x_auto))
assert shard_table(x_auto).rows == table.rows
assert str(jax.typeof(x_auto)) == "float32[128,512]"

# %% [markdown]
# ## 4. `jax.debug.visualize_array_sharding`, and where it stops
#
# JAX's built-in picture prints coloured text (through the `rich` library) for a 1-D or 2-D array.
# It returns `None`, so to check what it shows, capture its output (IPython's `capture_output`) and
# read the text:

# %%
from IPython.utils.capture import capture_output

with capture_output() as shown:
    result = jax.debug.visualize_array_sharding(x)
shown.show()  # display what it printed
text = shown.stdout + "".join(out.data.get("text/plain", "") for out in shown.outputs)  # words + colour codes

holders = {}  # block (its index, as text) -> the ids of the devices that hold it
for s in x.addressable_shards:
    holders.setdefault(str(s.index), []).append(s.device.id)
kind = jax.devices()[0].platform.upper()  # 'CPU' here
assert result is None  # nothing to test directly
assert all(f"{kind} {','.join(map(str, sorted(ids)))}" in text for ids in holders.values())  # devices: yes
assert "512" not in text and "KiB" not in text  # shapes and bytes: no

# %% [markdown]
# It shows which devices hold which block, but no shapes and no bytes. Give it a
# 3-D array, such as a batch of activations `(batch, sequence, features)`, and it refuses:

# %%
acts = jax.device_put(np.zeros((2, 128, 512), np.float32), NamedSharding(mesh, P(None, "data", "model")))
errors = []
try:
    jax.debug.visualize_array_sharding(acts)
except ValueError as err:
    errors.append(type(err))
    print("ValueError:", err)
assert errors == [ValueError]

# %% [markdown]
# `draw_sharding` draws the last two dimensions and labels each block with its devices, its full 3-D
# shape and its bytes. Here the leading dimension is whole, so every device holds both sequences:

# %%
print(type_string(acts), "- blocks:", shard_table(acts).shard_shapes)
assert shard_table(acts).shard_shapes == {(2, 32, 256)}
draw_sharding(acts)

# %% [markdown]
# When a leading dimension is sharded too, its blocks become panels, one per slice: `P('model', 'data',
# None)` puts sequence 0 on the left `model` column of the mesh (devices 0, 2, 4, 6 on CPU) and sequence 1
# on the right one.

# %%
acts2 = jax.device_put(np.zeros((2, 128, 512), np.float32), NamedSharding(mesh, P("model", "data", None)))
sequence_0 = sorted(s.device.id for s in acts2.addressable_shards if s.index[0] == slice(0, 1))
print(type_string(acts2), "- sequence 0 on devices", sequence_0)
assert type_string(acts2) == "f32[2@model,128@data,512]"
assert sequence_0 == sorted(mesh.device_ids[:, 0].tolist())  # the left column of the mesh
draw_sharding(acts2)

# %% [markdown]
# ## 5. What replication costs: bytes per device and on the whole mesh
#
# Notebook 02 §2 showed *which* devices hold the copies of a block (`replica_id`). This section counts
# what the copies cost. Place the same `(128, 512)` float32 array (256 KiB) four ways and count each
# device's bytes twice: from the block it holds (`x.addressable_shards[i].data.nbytes`) and from the
# type, the block shape `x.sharding.shard_shape(x.shape)` times 4 bytes per float32. The whole mesh holds the array once
# per **copy** of each block, and the number of copies is the product of the sizes of the mesh axes the
# spec does **not** name.

# %%
layouts = {  # named by how many copies of each block the mesh holds (you will verify the counts)
    "1 copy": P("data", "model"),
    "2 copies": P("data", None),
    "4 copies": P(None, "model"),
    "8 copies": P(),
}
x_np = np.asarray(x_single)  # the same 256 KiB as a NumPy array (a cheap source: no program to compile)
placed = {name: jax.device_put(x_np, NamedSharding(mesh, spec)) for name, spec in layouts.items()}

print(f"{'layout':<10}{'spec':<20}{'type':<24}{'per device':>11}{'whole mesh':>12}{'vs array':>9}")
for name, a in placed.items():
    t = shard_table(a)
    per_device = {a.addressable_shards[i].data.nbytes for i in range(8)}
    from_type = int(np.prod(a.sharding.shard_shape(a.shape))) * a.dtype.itemsize
    assert per_device == {from_type}  # the same on every device, and what the type says
    named = {e for e in layouts[name] if e is not None}  # the mesh axes the spec uses
    copies = int(np.prod([size for axis, size in mesh.shape.items() if axis not in named]))
    assert t.total_bytes == copies * x_single.nbytes and name.startswith(f"{copies} cop")
    assert per_device == {x_single.nbytes * copies // 8}
    print(f"{name:<10}{layouts[name]!s:<20}{type_string(a):<24}{format_bytes(per_device.pop()):>11}"
          f"{format_bytes(t.total_bytes):>12}{t.total_bytes // x_single.nbytes:>8}x")

assert shard_table(placed["8 copies"]).total_bytes == 8 * x_single.nbytes == 2 * 1024**2  # replicated: 2 MiB
assert shard_table(placed["1 copy"]).total_bytes == x_single.nbytes  # fully sharded: the array once

# %% [markdown]
# At a larger scale, a 400 MB model replicated on 8 devices takes 3.2 GB of the mesh's memory, while fully
# sharded it takes 400 MB, 50 MB per device. In the pictures each block is a deck of cards, one card per
# copy: the replicated array is one block with 8.

# %%
draw_shardings(placed, ncols=4)

# %% [markdown]
# ## 6. Sharding a whole pytree in one call
#
# `jax.device_put` takes a pytree (nested dicts, lists, tuples) of arrays, and for the shardings either a
# tree of the same structure or a **prefix** of it: one sharding stands for everything below it. Here
# are the parameters of a two-layer MLP and a batch:

# %%
shardings = {
    "replicated": NamedSharding(mesh, P()),
    "data_parallel": NamedSharding(mesh, P("data", None)),
    "model_parallel": NamedSharding(mesh, P(None, "model")),
}
rng = np.random.default_rng(0)
params = {  # NumPy arrays on the host, as you might load them from a checkpoint
    "dense1": {"kernel": rng.normal(0, 0.02, (512, 1024)).astype(np.float32), "bias": np.zeros(1024, np.float32)},
    "dense2": {"kernel": rng.normal(0, 0.02, (1024, 512)).astype(np.float32), "bias": np.zeros(512, np.float32)},
}
batch = {"x": rng.normal(size=(64, 512)).astype(np.float32), "y": np.zeros((64, 1), np.float32)}
state = {"params": params, "batch": batch}

# One sharding for the whole tree: every leaf replicated.
everywhere = jax.device_put(state, shardings["replicated"])
# A prefix tree: one sharding for all params, one for all of the batch.
split_batch = jax.device_put(state, {"params": shardings["replicated"], "batch": shardings["data_parallel"]})

print(jax.tree.map(lambda a: a.sharding.spec, split_batch))
assert all(a.sharding.is_fully_replicated for a in jax.tree.leaves(everywhere))
assert split_batch["batch"]["x"].sharding.shard_shape((64, 512)) == (16, 512)
assert split_batch["params"]["dense1"]["kernel"].sharding.is_fully_replicated
jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), split_batch, state);

# %% [markdown]
# To choose per leaf, build a tree of shardings with `jax.tree.map` and a rule. This one splits the
# last dimension of every 2-D parameter over `model` and replicates the biases:

# %%
def by_rank(a):
    return shardings["model_parallel"] if a.ndim == 2 else shardings["replicated"]


params_tp = jax.device_put(params, jax.tree.map(by_rank, params))
print(jax.tree.map(type_string, params_tp))
assert type_string(params_tp["dense1"]["kernel"]) == "f32[512,1024@model]"
assert type_string(params_tp["dense2"]["bias"]) == "f32[512]"

# %% [markdown]
# A rule that needs the leaf's **name** gets it from `jax.tree_util.tree_map_with_path`: the path is a
# tuple of keys (`DictKey('dense1'), DictKey('kernel')`), and `jax.tree_util.keystr` prints it.
#
# > **You will see this online:** a rule that shards the large kernels as it walks the tree:
# > ```python
# > def shard_params(params):
# >     def shard_array(path, array):
# >         path_str = "/".join(str(p) for p in path)
# >         if "kernel" in path_str and array.shape[0] > 256:
# >             return jax.device_put(array, NamedSharding(mesh, P(None, "model")))
# >         return jax.device_put(array, NamedSharding(mesh, P()))
# >     return jax.tree_util.tree_map_with_path(shard_array, params)
# > ```
#
# It tests `shape[0]` but splits `shape[1]`. On the MLP it works. Add a regression head, a `(512, 1)`
# kernel, and it asks to split a dimension of size 1 over 2 devices:

# %%
def shard_params(params):
    def shard_array(path, array):
        path_str = "/".join(str(p) for p in path)
        if "kernel" in path_str and array.shape[0] > 256:
            return jax.device_put(array, NamedSharding(mesh, P(None, "model")))
        return jax.device_put(array, NamedSharding(mesh, P()))

    return jax.tree_util.tree_map_with_path(shard_array, params)


jax.tree_util.tree_map_with_path(lambda p, a: print(f"{jax.tree_util.keystr(p):<22} {a.shape}"), params)
mlp = shard_params(params)
assert mlp["dense2"]["kernel"].sharding.is_equivalent_to(shardings["model_parallel"], 2)

params_head = {**params, "head": {"kernel": np.zeros((512, 1), np.float32), "bias": np.zeros(1, np.float32)}}
head_errors = []
try:
    shard_params(params_head)
except ValueError as err:
    head_errors.append(type(err))
    print("ValueError:", str(err).split(". Got")[0])
assert head_errors == [ValueError]

# %% [markdown]
# The fix separates deciding from moving, and tests the dimension it splits. The rule returns a sharding:
# a leaf named `kernel` is split when it is big enough and its last dimension divides evenly over
# `model`, and everything else is replicated. Then one `device_put` moves the tree. Matching the last key
# (`path[-1].key == 'kernel'`) is also stricter than searching the joined path string.

# %%
def shard_array(path, array, min_size=2**16):
    n_model = mesh.shape["model"]
    is_kernel = getattr(path[-1], "key", None) == "kernel"
    if is_kernel and array.size >= min_size and array.shape[-1] % n_model == 0:
        return NamedSharding(mesh, P(*[None] * (array.ndim - 1), "model"))
    return shardings["replicated"]


params_sharded = jax.device_put(params_head, jax.tree_util.tree_map_with_path(shard_array, params_head))
print(jax.tree.map(type_string, params_sharded))
assert type_string(params_sharded["dense1"]["kernel"]) == "f32[512,1024@model]"
assert type_string(params_sharded["dense2"]["kernel"]) == "f32[1024,512@model]"
assert params_sharded["head"]["kernel"].sharding.is_fully_replicated  # (512, 1): cannot split, kept whole

# %% [markdown]
# `draw_shardings` takes the whole pytree and names each panel by its path. Per device, the sharded
# kernels cost half their size, because they are split over the 2 `model` positions, while the head and
# the biases are full copies.

# %%
per_device = sum(shard_table(a).bytes_per_device[0] for a in jax.tree.leaves(params_sharded))
replicated = sum(a.nbytes for a in jax.tree.leaves(params_sharded))
print("params per device:", format_bytes(per_device), "instead of", format_bytes(replicated))
assert per_device == (512 * 1024 + 1024 * 512) * 4 // 2 + (1024 + 512 + 512 * 1 + 1) * 4  # halves + copies
draw_shardings(params_sharded, ncols=3)

# %% [markdown]
# ## 7. A mesh in context: `jax.set_mesh` and a bare `P`
#
# Everything above passed a full `NamedSharding`, which carries its mesh. Where you would rather write
# only the spec, set the mesh first with `jax.set_mesh`. Without it, `device_put` does not know which mesh
# `P('data', None)` refers to:

# %%
context_errors = []
try:
    jax.device_put(x_single, P("data", None))
except ValueError as err:
    context_errors.append(type(err))
    print("ValueError:", err)

with jax.set_mesh(mesh):
    y = jax.device_put(x_single, P("data", None))
    tree = jax.device_put(state, {"params": P(), "batch": P("data", None)})  # prefix trees work too

print(y.sharding)
assert context_errors == [ValueError]
assert y.sharding.is_equivalent_to(rows, 2) and isinstance(y.sharding, NamedSharding)
assert tree["batch"]["x"].sharding.is_equivalent_to(shardings["data_parallel"], 2)
assert tree["params"]["dense1"]["kernel"].sharding.is_fully_replicated

# %% [markdown]
# ## Takeaways
# - `NamedSharding(mesh, spec)` is a description: it answers `shard_shape`, `device_set` (a set: sort it)
#   and `is_fully_replicated` before any array exists, and rejects a spec that names an axis the mesh
#   lacks.
# - `jax.device_put(x, sharding)` returns a new array and leaves `x` as it was, except onto the sharding
#   `x` already has, where it returns `x` itself. On CPU a NumPy source can be shared, so do not write into it
#   afterwards.
# - Read a layout from both ends: `addressable_shards` / `shard_table` per device (index, replica id,
#   shape, bytes) and the global shape, type and picture. Replica ids follow mesh order. `draw_sharding`
#   goes where `visualize_array_sharding` stops: 3-D and beyond, bytes, and asserts.
# - The mesh holds each block once per device along the mesh axes the spec leaves out: 8x the array
#   replicated, 1x fully sharded, in between when partly replicated.
# - `jax.device_put` shards a whole pytree with one sharding, a prefix tree, or a tree built by a rule.
#   Let the rule decide only, and test the dimension it splits.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` (e.g. `ex.mesh_bytes.reveal()`) for the reference answer.
#
# **Exercise 1.** A `bfloat16` array of shape `(512, 1024)` is placed with `NamedSharding(mesh, P(None,
# 'model'))` on the `(4, 2)` mesh. How many bytes do all 8 devices hold for it together?

# %%
from spmd_course.exercises import ex03_namedsharding as ex

answer_1 = NOT_ANSWERED  # a whole number of bytes
ex.mesh_bytes.check(answer_1);

# %% [markdown]
# **Exercise 2.** Place a `(128, 512)` array with `P('data', None)` on `mesh_rev` of section 3, whose rows
# are devices `[7, 6]`, `[5, 4]`, `[3, 2]`, `[1, 0]`. Which devices' shards have `replica_id == 0`?

# %%
answer_2 = NOT_ANSWERED  # a set of device ids, e.g. {0, 5}
ex.first_replicas.check(answer_2);

# %% [markdown]
# **Exercise 3.** Write `rule(path, leaf)` for `jax.tree_util.tree_map_with_path` that returns a
# `PartitionSpec`: every 2-D leaf whose name (last key) is `kernel` is split along its **last** dimension
# over `'model'`. Everything else (biases, norms, a 2-D `embedding` table) is replicated, `P()`. The
#
# checker applies your rule to its own pytree on a `(4, 2)` mesh and places it with `jax.device_put`.

# %%
def rule(path, leaf):
    # your code: return a PartitionSpec for this leaf
    return NOT_ANSWERED


ex.kernel_rule.check(rule);

# %% [markdown]
# **Next:** [04 · Propagation and resharding](04_propagation_resharding.ipynb)
