# %% [markdown]
# # 02 · PartitionSpec
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/02_partitionspec.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/02_partitionspec.ipynb)
#
# Each array on a mesh needs a rule that says which block of it each device holds. Left without one,
# a `(1024, 1024)` float32 array created on 8 devices takes its full 4 MiB on every device, where a
# split gives each 512 KiB.
#
# **You need:** notebooks 00 (a sharded array's type, shard table and picture) and 01 (the `(4, 2)`
# mesh with axes `data` and `model`, Auto and Explicit axes, `jax.set_mesh`), plus `jax.numpy` and
# `jax.jit`.
#
# A `PartitionSpec` is a short list with one entry per array dimension that names the mesh axes cutting
# that dimension. Every placement, every `jit` sharding and every constraint in the rest of the course is
# written with one, so this notebook checks each rule against the devices' real shards.
#
# **You will learn**
# - to read a spec dimension by dimension: `P('data', 'model')` on a `(4, 2)` mesh turns a `(128, 512)`
#   array into `(32, 256)` blocks, and an omitted dimension stays whole
# - that a mesh axis the spec does not name makes copies, and what they cost
# - how `P(('data', 'model'))` splits one dimension 8 ways, and why `P(('model', 'data'))` gives the same
#   block shapes to *other* devices
# - the errors for a repeated axis, an unknown axis and a spec longer than the array
# - to create an array already sharded with `out_sharding=`
# - what JAX and XLA do with a dimension that does not divide, on both JAX lines of this course
# - why `P('data', None) != P('data')`, and how to compare shardings with `is_equivalent_to`.

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
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (
    NOT_ANSWERED,
    assert_close,
    collectives,
    draw_mesh,
    draw_sharding,
    draw_shardings,
    memory_per_device,
    quiet,
    shard_table,
)

mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
print(mesh)
draw_mesh(mesh)

# %% [markdown]
# ## 1. One entry per dimension
#
# The mesh is the one from notebooks 00 and 01: 8 devices as a `(4, 2)` grid, `data` down and `model`
# across, with Explicit axes so that `jax.typeof` shows each layout. Read a spec left to right, one entry
# per dimension of a `(128, 512)` array:
#
# | spec | dimension 0 (128 rows) | dimension 1 (512 columns) | block per device |
# |---|---|---|---|
# | `P('data')` | split 4 ways over `data` | no entry: whole | `(32, 512)` |
# | `P(None, 'model')` | `None`: whole | split 2 ways over `model` | `(128, 256)` |
# | `P('data', 'model')` | split 4 ways | split 2 ways | `(32, 256)` |
# | `P()` | whole | whole | `(128, 512)` |
#
# The rule: a dimension's block length is its length divided by the product of the sizes of the mesh
# axes in its entry. Missing entries at the end mean `None`. `sharding.shard_shape(shape)` does that
# arithmetic, and `jax.device_put` puts real blocks on the devices. Check all four both ways:

# %%
x = jnp.arange(128 * 512, dtype=jnp.float32).reshape(128, 512)

placed = {}
for spec, expected in [(P("data"), (32, 512)), (P(None, "model"), (128, 256)),
                       (P("data", "model"), (32, 256)), (P(), (128, 512))]:
    sharding = NamedSharding(mesh, spec)
    placed[str(spec)] = xs = jax.device_put(x, sharding)
    print(f"{spec!s:<20} shard_shape {sharding.shard_shape(x.shape)!s:<11} type {jax.typeof(xs)}")
    assert sharding.shard_shape(x.shape) == expected
    assert all(s.data.shape == expected for s in xs.addressable_shards)

draw_shardings(placed, ncols=4)

# %% [markdown]
# ## 2. A mesh axis the spec does not name makes copies
#
# `P('data')` splits the rows over `data` and says nothing about `model`. The 2 devices in each row of the
# mesh (same `data` position, `model` = 0 and 1) therefore hold **the same** block: each of the 4 blocks
# exists twice. `replica_id` numbers the copies, and the devices together hold twice the array's bytes:

# %%
rows = placed["P('data',)"]
table = shard_table(rows)
print(table)

holders = {}
for s in rows.addressable_shards:
    holders.setdefault(s.index[0].start, []).append((s.device.id, s.replica_id))
print("first row -> (device, replica_id):", holders)
mesh_rows = {32 * i: [(d.id, j) for j, d in enumerate(mesh.devices[i])] for i in range(4)}  # copy j at model=j
assert {k: sorted(v) for k, v in holders.items()} == {k: sorted(v) for k, v in mesh_rows.items()}
assert table.total_bytes == 2 * x.nbytes
assert shard_table(placed["P()"]).total_bytes == 8 * x.nbytes  # P(): a full copy on every device

# %% [markdown]
# Copies are sometimes what you want (in data parallelism every device holds all the weights), but they
# cost memory: `P()` on this mesh keeps 8 copies. This section is about *which* devices hold the same
# block. Notebook 03 §5 counts what the copies cost, per device and on the whole mesh, for every layout
# of this array. In the picture, a block held by several devices names all of them.

# %%
draw_sharding(rows)

# %% [markdown]
# ## 3. One dimension over several mesh axes
#
# An entry can be a **tuple** of mesh axes: `P(('data', 'model'))` splits dimension 0 over `data` *and*
# `model`, 4 x 2 = 8 ways. The type shows both axes on the dimension.
#
# **The order inside the tuple matters.** A device's block number is its position along the tuple's axes
# read as a two-digit number, with the first axis as the high digit. For the device at mesh position
# `(i, j)` (`data = i`, `model = j`), `P(('data', 'model'))` gives it block `2*i + j`, and
# `P(('model', 'data'))` gives it block `4*j + i`. Same block shapes, different blocks. Ask the shards:

# %%
x_dm = jax.device_put(x, NamedSharding(mesh, P(("data", "model"))))
x_md = jax.device_put(x, NamedSharding(mesh, P(("model", "data"))))
print("types:", jax.typeof(x_dm), "|", jax.typeof(x_md))
assert str(jax.typeof(x_dm)) == "float32[128@(data,model),512]"
assert x_dm.sharding.shard_shape(x.shape) == x_md.sharding.shard_shape(x.shape) == (16, 512)

first_row_dm = {s.device.id: s.index[0].start for s in x_dm.addressable_shards}
first_row_md = {s.device.id: s.index[0].start for s in x_md.addressable_shards}
print("mesh (i, j)  device  rows under ('data','model')  rows under ('model','data')")
for (i, j), device in np.ndenumerate(mesh.devices):
    a, b = first_row_dm[device.id], first_row_md[device.id]
    print(f"  ({i}, {j})       {device.id}         {a:>3}:{a + 16:<3}                    {b:>3}:{b + 16:<3}")
    assert (a, b) == (16 * (2 * i + j), 16 * (4 * j + i))

np.testing.assert_array_equal(np.asarray(x_md), np.asarray(x))  # the same array, stored differently
draw_shardings({"P(('data', 'model'))": x_dm, "P(('model', 'data'))": x_md}, ncols=2, show_bytes=False)

# %% [markdown]
# When does it matter? When two arrays must meet on the same device. The device at mesh position `(0, 1)`
# holds rows 16:32 under one order and rows 64:80 under the other, so combining them row by row means
# moving data first. `is_equivalent_to` (section 7) tells the two layouts apart:

# %%
s_dm, s_md = x_dm.sharding, x_md.sharding
print("same layout?", s_dm.is_equivalent_to(s_md, 2))
assert not s_dm.is_equivalent_to(s_md, 2)

# %% [markdown]
# ## 4. The rules of a spec
#
# A spec alone is a plain Python object that knows no mesh, so the rules are checked only when it meets a
# mesh or an array:
#
# 1. **A mesh axis splits at most one dimension.** `P('data', 'data')` fails with `DuplicateSpecError`.
#    To use both axes on one dimension, write a tuple: `P(('data', 'model'))`.
# 2. **Every name must be an axis of the mesh.** A typo fails as soon as the spec meets the mesh.
# 3. **At most one entry per dimension.** A `NamedSharding` does not know the array, so
#    `P('data', 'model', None)` is accepted until it meets a 2-D array.

# %%
attempts = {
    "P('data', 'data')": lambda: NamedSharding(mesh, P("data", "data")),
    "P('batch', None)": lambda: NamedSharding(mesh, P("batch", None)),
    "P('data', 'model', None), 2-D array": lambda: jax.device_put(x, NamedSharding(mesh, P("data", "model", None))),
}
raised = {}
for text, attempt in attempts.items():
    try:
        attempt()
    except Exception as err:  # DuplicateSpecError is not exported by jax, so match it by name
        raised[text] = type(err).__name__
        print(f"{text}: {type(err).__name__}: {err}")
assert list(raised.values()) == ["DuplicateSpecError", "ValueError", "ValueError"]

# %% [markdown]
# ## 5. Creating an array already sharded
#
# `jax.device_put(x, sharding)` moves an existing array. To *create* one in its layout, the array
# constructors (`jnp.zeros`, `jnp.ones`, `jnp.arange`, `jax.random.normal`, ...) take `out_sharding=` on
# Explicit axes, and under `jax.set_mesh` a bare spec is enough. Left out, the array is a full copy on
# every device of the mesh. Compiling (not running) the creation of a 4 MiB array shows what each device
# writes:

# %%
with jax.set_mesh(mesh):
    z = jnp.zeros((16, 8), out_sharding=P("data", None))
    plain = jnp.zeros((16, 8))
    split = jax.jit(lambda: jnp.zeros((1024, 1024), out_sharding=P("data", "model"))).lower().compile()
    whole = jax.jit(lambda: jnp.zeros((1024, 1024))).lower().compile()
print("with out_sharding:   ", jax.typeof(z), "| (1024, 1024):", memory_per_device(split))
print("without out_sharding:", jax.typeof(plain), "   | (1024, 1024):", memory_per_device(whole))
assert str(jax.typeof(z)) == "float32[16@data,8]"
assert all(s.data.shape == (4, 8) for s in z.addressable_shards)
assert plain.sharding.is_fully_replicated
assert memory_per_device(split).output == 1024 * 1024 * 4 // 8  # one block of 512 KiB per device
assert memory_per_device(whole).output == 1024 * 1024 * 4  # 4 MiB on every device

# %% [markdown]
# Do this under `jax.set_mesh`. Outside it, even `out_sharding=NamedSharding(mesh, ...)` is unreliable:
# JAX 0.10.2 raises, and JAX 0.12 returns an array on a single device without a word.

# %%
try:
    outside = jnp.zeros((16, 8), out_sharding=NamedSharding(mesh, P("data", None)))
    outcome = f"returned {type(outside.sharding).__name__}"
except ValueError as err:
    outcome = "ValueError"
    print("ValueError:", str(err).split(". ")[0])
print(f"JAX {jax.__version__}, outside jax.set_mesh: {outcome}")
assert outcome == ("returned SingleDeviceSharding" if jax.__version_info__ >= (0, 12) else "ValueError")

# %% [markdown]
# ## 6. Uneven dimensions (optional on a first reading)
#
# This section uses `with_sharding_constraint` (notebook 05) and counts collectives in the compiled
# program (notebook 04), so it reads best after those. What if a dimension does not divide by its axes? Take 10 numbers and split them over `data` (4
# devices). This section uses an Auto mesh, because it needs `with_sharding_constraint`.
#
# **Where an array is placed or leaves `jit`, JAX refuses.** `jax.device_put`, `jit`'s `in_shardings`
# and `out_shardings`, and `shard_shape` raise `IndivisibleError` (a `ValueError`):

# %%
auto_mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
v = jnp.arange(10, dtype=jnp.float32)
uneven = NamedSharding(auto_mesh, P("data"))

attempts = {
    "device_put": lambda: jax.device_put(v, uneven),
    "in_shardings": lambda: jax.jit(lambda a: a * 2, in_shardings=uneven)(np.arange(10, dtype=np.float32)),
    "out_shardings": lambda: jax.jit(lambda a: a * 2, out_shardings=uneven)(v),
    "shard_shape": lambda: uneven.shard_shape(v.shape),
}
refused = []
for where, attempt in attempts.items():
    try:
        with quiet():  # jax 0.12 prints a stray source line before raising, so keep it out of the output
            attempt()
    except ValueError as err:
        refused.append(type(err).__name__)
        core = str(err)[str(err).index("implies"):].split(" (full shape")[0]  # the wording around it varies
        print(f"{where:<14} {type(err).__name__}: ...{core}")
assert refused == ["IndivisibleError"] * 4

# %% [markdown]
# **Inside `jit`, XLA pads.** A value that stays inside a compiled program may be split unevenly. XLA
# rounds the block up, `ceil(10 / 4) = 3`, pads the dimension to 4 x 3 = 12, and the last block holds 1
# real element and 2 of padding. `draw_sharding` draws that layout from a shape and a sharding, with the
# padding hatched:

# %%
draw_sharding((10,), uneven)

# %% [markdown]
# Check it in a compiled program: constrain an intermediate to the uneven layout and reduce it to one
# number. The per-device program works on `f32[3]` blocks of the input padded to `f32[12]`, and combines
# 4 partial sums with one all-reduce. Each padded zero would add `cos(0) = 1` to the sum, so a right
# answer means XLA masked the padding:

# %% tags=["save"]
def sum_of_cosines(a, layout):
    b = jax.lax.with_sharding_constraint(a * 2, layout)  # here: 10 elements split 4 ways, inside jit
    return jnp.cos(b).sum()

# %%
compiled = jax.jit(partial(sum_of_cosines, layout=uneven)).lower(v).compile()
hlo = compiled.as_text()
total = compiled(v)
print("padded to f32[12]:", "f32[12]" in hlo, "| blocks of f32[3]:", "f32[3]" in hlo)
print(f"sum = {float(total):.5f}")
assert "f32[12]" in hlo and "f32[3]" in hlo
assert collectives(compiled).count("all-reduce") == 1
assert_close(total, np.cos(2 * np.arange(10)).sum())  # the one-device sum, not this + 2

# %% [markdown]
# **Returning the uneven value is where the two JAX lines differ.** The docstring of
# `with_sharding_constraint`, on both lines, says such an output "will come out as fully replicated, no
# matter the sharding annotation given".
#
# - JAX 0.10.2 does what it says: the compiled program all-gathers the padded blocks, and every device
#   holds all 10 elements, with no error and no warning. Documented, yet silent:
#   [jax-ml/jax#26946](https://github.com/jax-ml/jax/issues/26946), open, reports it.
# - JAX 0.11.2 and 0.12 raise `IndivisibleError` for the same program, contrary to their own docstring: a
#   regression, since code that ran before now fails, with a message about an internal device grid
#   (`shape=[2, 4]`) instead of your 10 elements, the kind of message
#   [jax-ml/jax#27808](https://github.com/jax-ml/jax/issues/27808) reports.

# %%
doc = " ".join(jax.lax.with_sharding_constraint.__doc__.split())
assert "it will come out as fully replicated, no matter the sharding annotation given" in doc


def doubled(a):
    return jax.lax.with_sharding_constraint(a * 2, uneven)


try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = jax.jit(doubled)(v)
except ValueError as err:  # jax 0.11.2 and 0.12
    print(f"JAX {jax.__version__}: {type(err).__name__}: {err}")
    assert type(err).__name__ == "IndivisibleError" and "shape=[2, 4]" in str(err)  # the grid, not your 10
else:  # jax 0.10
    gathers = collectives(jax.jit(doubled).lower(v).compile()).count("all-gather")
    print(f"JAX {jax.__version__}: returned, spec {out.sharding.spec}, fully replicated: "
          f"{out.sharding.is_fully_replicated}, all-gathers: {gathers}, warnings: {len(caught)}")
    assert out.sharding.is_fully_replicated and gathers == 1 and caught == []
    np.testing.assert_array_equal(np.asarray(out), 2 * np.arange(10))

# %% [markdown]
# **The fixes**, on both lines: make the dimension divisible, or split it by something that divides it.
#
# - Pad the data to a multiple of the axis size yourself (here 12), and keep track of the real length
#   (slice the result, or mask the padding as XLA did above).
# - Split over an axis that divides the dimension: `model` has 2 devices, and 10 / 2 = 5.
# - For a multi-dimensional array, split a dimension that divides: a `(10, 512)` array can be split on
#   its 512 columns instead of its 10 rows.

# %%
padded = jax.device_put(jnp.pad(v, (0, 2)), uneven)  # 12 = 4 x 3: even now
by_model = jax.device_put(v, NamedSharding(auto_mesh, P("model")))
wide = jax.device_put(jnp.ones((10, 512), jnp.float32), NamedSharding(auto_mesh, P(None, "data")))
for name, arr in [("padded", padded), ("over 'model'", by_model), ("columns", wide)]:
    print(f"{name:<13}{arr.shape} -> blocks {arr.sharding.shard_shape(arr.shape)}")
assert padded.sharding.shard_shape(padded.shape) == (3,)
np.testing.assert_array_equal(np.asarray(padded)[:10], np.asarray(v))  # slice the padding off when done
assert by_model.sharding.shard_shape(v.shape) == (5,)
assert wide.sharding.shard_shape(wide.shape) == (10, 128)

# %% [markdown]
# ## 7. Comparing layouts
#
# A `PartitionSpec` compares entry by entry, as written, and is never equal to a plain tuple.

# %% [markdown]
# > **You will see this online:**
# > ```python
# > assert y.sharding.spec == P("data", None)
# > ```
# > A test that checks the layout of a `jit` result by comparing specs. The spec of a result is
# > *inferred*, and its written form need not match what you asked for. On the Auto mesh, a constraint
# > to `P('data', None)` comes back as `P('data',)`. On the Explicit mesh, an input placed with
# > `P('data')` comes out as `P('data', None)`. The layouts are exactly the ones requested, yet the
# > comparisons fail:

# %%
y_auto = jax.jit(lambda a: jax.lax.with_sharding_constraint(a * 2, NamedSharding(auto_mesh, P("data", None))))(x)
y_explicit = jax.jit(lambda a: a * 2)(placed["P('data',)"])
failed = []
for y, spec in [(y_auto, P("data", None)), (y_explicit, P("data"))]:
    try:
        assert y.sharding.spec == spec
    except AssertionError:
        failed.append(f"asked for {spec}, got {y.sharding.spec}")
print(failed)
print("P('data', None) == P('data'):", P("data", None) == P("data"),
      "| P('data', None) == ('data', None):", P("data", None) == ("data", None))
assert len(failed) == 2
assert (y_auto.sharding.spec, y_explicit.sharding.spec) == (P("data"), P("data", None))  # the same layouts, respelled
assert P("data", None) != P("data") and P("data", None) != ("data", None)  # never equal to a tuple since 0.10

# %% [markdown]
# The fix: compare **shardings**, not specs, with `sharding.is_equivalent_to(other, ndim)`. It asks
# whether both put the same block on the same device for an array of `ndim` dimensions, and it still
# tells genuinely different layouts apart:

# %%
right = [
    y_auto.sharding.is_equivalent_to(NamedSharding(auto_mesh, P("data", None)), 2),
    y_explicit.sharding.is_equivalent_to(NamedSharding(mesh, P("data")), 2),
]
print("is_equivalent_to:", right)
assert right == [True, True]
assert not y_auto.sharding.is_equivalent_to(NamedSharding(auto_mesh, P(None, "data")), 2)

# %% [markdown]
# **Try it yourself.** The explorer below redraws whenever you edit a box and press Enter: change the mesh,
# the shape, the dtype or the spec and watch the type string, the bytes per device and the picture follow.
# A spec that cannot work gets one line saying what to change.

# %%
from spmd_course.utils import explore

explore()

# %% [markdown]
# ## Takeaways
# - A spec has one entry per array dimension: `None` keeps the dimension whole, a mesh axis splits it by
#   the axis size, a tuple of axes splits it by the product. Missing trailing entries mean `None`.
#   `sharding.shard_shape(shape)` does the arithmetic.
# - A mesh axis the spec does not name copies the blocks across it (`P('data')` on `(4, 2)`: each block
#   on 2 devices, 2x the memory, and `P()` 8x).
# - In a tuple the first axis is the major one: `P(('data', 'model'))` and `P(('model', 'data'))` give the
#   same block shapes to different devices.
# - A repeated axis, an unknown axis and a spec longer than the array are errors.
# - Create arrays in their layout with `out_sharding=` under `jax.set_mesh`.
# - An uneven dimension is refused wherever an array is placed or returned, and padded by XLA only inside
#   `jit`. Returning it from `jit` differs by line: JAX 0.10.2 silently replicates it, as its docstring
#   says, and JAX 0.11-0.12 raise `IndivisibleError` against that docstring. Pad it yourself, or split a
#   dimension that divides.
# - Compare layouts with `sharding.is_equivalent_to(other, ndim)`, never with `spec ==`.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer. All three use the `(4, 2)` mesh above, and
# `draw_mesh(mesh)` shows which device sits where.
#
#
# **Exercise 1.** Write a spec that gives each of the 8 devices a different `(16, 512)` block of the
# `(128, 512)` array `x`.

# %%
from spmd_course.exercises import ex02_partitionspec as ex

answer_1 = NOT_ANSWERED  # a PartitionSpec, e.g. P(...)
ex.block_16x512.check(answer_1);

# %% [markdown]
# **Exercise 2.** Predict, without running it, the shard shape of a `(64, 96, 8)` array placed with
# `P(None, ('data', 'model'))` on the `(4, 2)` mesh.

# %%
answer_2 = NOT_ANSWERED  # a tuple of three numbers, e.g. (64, 96, 8)
ex.predict_shard_shape.check(answer_2);

# %% [markdown]
# **Exercise 3.** `x` is placed with `P(('model', 'data'))`. Which devices hold rows `32:64`? (Rows
# 32:64 span more than one block.)

# %%
answer_3 = NOT_ANSWERED  # a set of device ids, e.g. {0, 1}
ex.rows_32_64.check(answer_3);

# %% [markdown]
# **Next:** [03 · NamedSharding and placing data](03_namedsharding.ipynb)
