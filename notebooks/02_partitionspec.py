# %% [markdown]
# # 02 · PartitionSpec
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/02_partitionspec.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/02_partitionspec.ipynb)
#
# A `PartitionSpec` is a short list, one entry per array dimension, that names the mesh axes cutting
# that dimension. Every placement, every `jit` sharding and every constraint in the rest of the course is
# written with one. This notebook runs each spec of the guide that seeded the course, computes the block
# each device gets, checks it against the devices' real shards and draws it. Then it covers the rules a
# spec must follow (with the error JAX raises for each broken rule), one dimension split over two mesh
# axes, dimensions that do not divide evenly, and how to compare two specs without being fooled.
#
# **You will learn**
# - to read a spec dimension by dimension and compute each device's block: `P('data', 'model')` on a
#   `(4, 2)` mesh turns a `(128, 512)` array into `(32, 256)` blocks;
# - what a mesh axis that the spec does not name does (it makes copies), and what an omitted dimension
#   does (it stays whole);
# - how `P(('data', 'model'))` splits one dimension 8 ways, and why `P(('model', 'data'))` gives the
#   same block shapes to *other* devices;
# - the errors for a repeated axis, an unknown axis, a spec longer than the array, and a dimension that
#   does not divide, and what XLA does with uneven dimensions inside `jit`;
# - why `P('data', None) != P('data')`, and how to compare shardings with `is_equivalent_to`.

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
# ## 1. One entry per dimension
#
# The mesh for most of this notebook is the one from notebook 00: 8 devices as a `(4, 2)` grid, `data`
# down and `model` across. Its axes are *Explicit*, so `jax.typeof` prints the sharding as part of the
# type. Keep the picture of the device ids in mind: every figure below colours a block by the device
# that holds it, with these colours.

# %%
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import NOT_ANSWERED, collectives, draw_mesh, draw_sharding, draw_shardings, shard_table, tile_labels

mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
print(mesh)
assert dict(mesh.shape) == {"data": 4, "model": 2}
draw_mesh(mesh)

# %% [markdown]
# The seed guide lists four specs. Read each one left to right, one entry per dimension of the array:
#
# | spec | dimension 0 (128 rows) | dimension 1 (512 columns) | block per device |
# |---|---|---|---|
# | `P('data')` | split 4 ways over `data` | not mentioned: whole | `(32, 512)` |
# | `P(None, 'model')` | `None`: whole | split 2 ways over `model` | `(128, 256)` |
# | `P('data', 'model')` | split 4 ways | split 2 ways | `(32, 256)` |
# | `P()` | whole | whole | `(128, 512)` |
#
# The rule: a dimension's block size is its length divided by the product of the sizes of the mesh axes
# in its entry. `sharding.shard_shape(shape)` does that arithmetic; `jax.device_put` then puts real
# blocks on the devices. Check all four, against the computed shape and against every device's shard:

# %%
x = jnp.arange(128 * 512, dtype=jnp.float32).reshape(128, 512)

seed_specs = [
    (P("data"), (32, 512)),
    (P(None, "model"), (128, 256)),
    (P("data", "model"), (32, 256)),
    (P(), (128, 512)),
]
placed = {}
for spec, expected in seed_specs:
    sharding = NamedSharding(mesh, spec)
    xs = jax.device_put(x, sharding)
    placed[str(spec)] = xs
    copies = len(xs.addressable_shards) // len({str(s.index) for s in xs.addressable_shards})
    print(f"{spec!s:<20} shard_shape {sharding.shard_shape(x.shape)!s:<11} type {jax.typeof(xs)!s:<28}"
          f" each block on {copies} device(s)")
    assert sharding.shard_shape(x.shape) == expected
    assert all(s.data.shape == expected for s in xs.addressable_shards)

# %% [markdown]
# The same four layouts as pictures. A block held by several devices is striped with all their colours;
# the label gives the devices, the block's shape and its bytes. (`draw_shardings` takes a dict of
# name -> array, or name -> `(shape, sharding)`; the second form keeps the panels in the dict's order.)

# %%
fig = draw_shardings({name: (xs.shape, xs.sharding) for name, xs in placed.items()}, ncols=4)
labels = tile_labels(fig)
# P('data'): block i is held by both devices of mesh row i, in the order of the mesh picture.
assert labels[:4] == [f"dev {row[0].id},{row[1].id}\n(32, 512)\n64.0 KiB" for row in mesh.devices]
assert labels[-1] == "dev 0-7\n(128, 512)\n256.0 KiB"  # P(): one block, on every device
assert len(labels) == 4 + 2 + 8 + 1
fig

# %% [markdown]
# Two of the four specs leave a mesh axis out: `P('data')` never mentions `model`, `P(None, 'model')`
# never mentions `data`, and `P()` mentions neither. Section 4 shows what that costs.

# %% [markdown]
# ## 2. The seed's visual example: an `(8, 1)` mesh
#
# The seed continues with a "visual example" on a mesh it describes as "`(8, 1)` with axis `'data'`". A
# mesh of shape `(8, 1)` has **two** axes, so both need names. This notebook calls them `('data', 'model')`,
# as the PyTorch/XLA guide does for its own `(num_devices, 1)` mesh: `data` holds all 8 devices and
# `model` has size 1. An axis of size 1 cuts nothing, which the third line below checks.

# %%
mesh81 = jax.make_mesh((8, 1), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
print(mesh81)

visual = {}
for spec, expected in [(P("data", None), (16, 512)), (P(None, "data"), (128, 64)), (P("data", "model"), (16, 512))]:
    sharding = NamedSharding(mesh81, spec)
    visual[f"{spec} on (8, 1)"] = jax.device_put(x, sharding)
    print(f"{spec!s:<20} -> each of the 8 devices gets {sharding.shard_shape(x.shape)}")
    assert sharding.shard_shape(x.shape) == expected

# The seed's last line: P('data', 'model') "with mesh (4, 2)" gives (32, 256), as in section 1.
visual["P('data', 'model') on (4, 2)"] = placed["P('data', 'model')"]
assert NamedSharding(mesh, P("data", "model")).shard_shape(x.shape) == (32, 256)
assert NamedSharding(mesh81, P("data", "model")).is_equivalent_to(NamedSharding(mesh81, P("data", None)), 2)

# %% [markdown]
# The row splits, and the seed's `(4, 2)` example for comparison. On the `(8, 1)` mesh, `P('data', None)`
# and `P('data', 'model')` draw the same picture:

# %%
rows_first = {name: (xs.shape, xs.sharding) for name, xs in visual.items() if "P(None" not in name}
fig = draw_shardings(rows_first, ncols=3, show_bytes=False)
labels = tile_labels(fig)
assert labels[:8] == labels[8:16]  # the same 8 blocks on the same devices
assert sum("(16, 512)" in label for label in labels) == 16
assert sum("(32, 256)" in label for label in labels) == 8
fig

# %% [markdown]
# The column split, `P(None, 'data')`: eight `(128, 64)` blocks side by side.

# %%
fig = draw_sharding(visual["P(None, 'data') on (8, 1)"])
labels = tile_labels(fig)
assert len(labels) == 8 and all("(128, 64)\n32.0 KiB" in label for label in labels)
fig

# %% [markdown]
# All three claims of the seed hold: `(16, 512)`, `(128, 64)` and `(32, 256)`. On the `(8, 1)` mesh
# every spec gives each device a different block, because the only axis that is left out has size 1:
# nothing is copied.

# %% [markdown]
# ## 3. One dimension over several mesh axes
#
# An entry can be a **tuple** of mesh axes: `P(('data', 'model'))` splits dimension 0 over `data` *and*
# `model`, 4 x 2 = 8 ways. The PyTorch/XLA guide writes the same thing as
# `xs.mark_sharding(t, mesh, (('data', 'model'),))`. The type shows both axes on the dimension:

# %%
x_dm = jax.device_put(x, NamedSharding(mesh, P(("data", "model"))))
print("type:       ", jax.typeof(x_dm))
print("shard shape:", x_dm.sharding.shard_shape(x.shape))
assert x_dm.sharding.shard_shape(x.shape) == (16, 512)
assert str(jax.typeof(x_dm)) == "float32[128@(data,model),512]"
assert shard_table(x_dm).total_bytes == x.nbytes  # 8 different blocks: no copies

# %% [markdown]
# **The order inside the tuple matters.** A device's block number is its position along the tuple's axes
# read as a two-digit number, with the first axis in the tuple as the high digit. For the device at
# mesh position `(i, j)` (`data = i`, `model = j`):
#
# - `P(('data', 'model'))`: block `2*i + j`, so blocks run down the `data` axis in pairs;
# - `P(('model', 'data'))`: block `4*j + i`, so the first four blocks go to the `model = 0` column.
#
# Both give every device a `(16, 512)` block, but not the same block. Ask the shards:

# %%
x_md = jax.device_put(x, NamedSharding(mesh, P(("model", "data"))))
first_row_dm = {s.device.id: s.index[0].start for s in x_dm.addressable_shards}
first_row_md = {s.device.id: s.index[0].start for s in x_md.addressable_shards}

print("mesh (i, j)  device  rows under ('data','model')  rows under ('model','data')")
for (i, j), device in np.ndenumerate(mesh.devices):
    a, b = first_row_dm[device.id], first_row_md[device.id]
    print(f"  ({i}, {j})       {device.id}         {a:>3}:{a + 16:<3}                    {b:>3}:{b + 16:<3}")
    assert a == 16 * (2 * i + j)  # data is the high digit
    assert b == 16 * (4 * j + i)  # model is the high digit

assert x_md.sharding.shard_shape(x.shape) == x_dm.sharding.shard_shape(x.shape) == (16, 512)
assert first_row_dm != first_row_md
np.testing.assert_array_equal(np.asarray(x_md), np.asarray(x))  # the same array, stored differently

# %% [markdown]
# Side by side, the same 8 row blocks of 16 rows, in different colours:

# %%
pair = {"P(('data', 'model'))": (x.shape, x_dm.sharding), "P(('model', 'data'))": (x.shape, x_md.sharding)}
fig = draw_shardings(pair, ncols=2, show_bytes=False)
labels = tile_labels(fig)
holder_dm = {row: dev for dev, row in first_row_dm.items()}
holder_md = {row: dev for dev, row in first_row_md.items()}
assert [label.split("\n")[0] for label in labels] == (
    [f"dev {holder_dm[16 * k]}" for k in range(8)] + [f"dev {holder_md[16 * k]}" for k in range(8)]
)
fig

# %% [markdown]
# When does this matter? When two arrays must meet on the same device: if one is stored with
# `('data', 'model')` and the other with `('model', 'data')`, the device at mesh position `(0, 1)` holds
# rows 16:32 of the first but rows 64:80 of the second, and combining them row by row means moving data first. `is_equivalent_to`
# (section 6) tells them apart:

# %%
s_dm, s_md = NamedSharding(mesh, P(("data", "model"))), NamedSharding(mesh, P(("model", "data")))
print("same layout?", s_dm.is_equivalent_to(s_md, 2))
assert not s_dm.is_equivalent_to(s_md, 2)

# %% [markdown]
# ## 4. The rules of a spec
#
# ### Rule 1: a mesh axis shards at most one dimension
#
# A mesh axis is a set of devices; it can split one dimension, not two at once. `P('data', 'data')` is a
# valid Python object (a spec does not know any mesh), but pairing it with a mesh fails, with JAX's
# `DuplicateSpecError`:

# %%
raised = []
print("P('data', 'data') as an object:", P("data", "data"))
try:
    NamedSharding(mesh, P("data", "data"))
except Exception as err:  # DuplicateSpecError is not exported by jax, so match it by name
    raised.append(type(err).__name__)
    print(f"{type(err).__name__}: {err}")

# The fix: give each dimension its own axes, or put both axes on one dimension.
assert NamedSharding(mesh, P("data", "model")).shard_shape(x.shape) == (32, 256)
assert NamedSharding(mesh, P(("data", "model"), None)).shard_shape(x.shape) == (16, 512)
assert raised == ["DuplicateSpecError"]

# %% [markdown]
# ### Rule 2: omitted trailing dimensions are replicated
#
# A spec may be shorter than the array: the missing entries at the end mean `None`. `P('data')` on a 2-D
# array lays out the same blocks on the same devices as `P('data', None)`. The two objects are not equal
# (section 6), but the layouts are, and `is_equivalent_to(other, ndim)` compares layouts:

# %%
short = jax.device_put(x, NamedSharding(mesh, P("data")))
full = jax.device_put(x, NamedSharding(mesh, P("data", None)))
same_blocks = [(a.device.id, a.index) == (b.device.id, b.index) for a, b in
               zip(short.addressable_shards, full.addressable_shards, strict=True)]
print("spec objects equal?", P("data") == P("data", None), "| same block on every device?", all(same_blocks))
print("equivalent layouts?", short.sharding.is_equivalent_to(full.sharding, x.ndim))
assert all(same_blocks)
assert short.sharding.is_equivalent_to(full.sharding, x.ndim)
assert P("data") != P("data", None)

# %% [markdown]
# ### Rule 3: a mesh axis the spec does not name means copies over that axis
#
# `P('data', None)` splits the rows over `data` and says nothing about `model`. The 2 devices in each row
# of the mesh (same `data` position, `model` = 0 and 1) therefore hold **the same** block: each of the 4
# blocks exists twice. `replica_id` numbers
# the copies, and the total memory is twice the array:

# %%
table = shard_table(full)
print(table)

blocks = {}
for s in full.addressable_shards:
    blocks.setdefault(str(s.index), []).append(s.replica_id)
assert len(blocks) == 4 and all(sorted(ids) == [0, 1] for ids in blocks.values())
for (_, j), device in np.ndenumerate(mesh.devices):  # the replica id is the device's `model` position
    assert next(s.replica_id for s in full.addressable_shards if s.device == device) == j
assert table.total_bytes == 2 * x.nbytes

# %% [markdown]
# In the picture the copies are the stripes: each block carries the colours of both devices that hold it.

# %%
fig = draw_sharding(full)
assert tile_labels(fig) == [f"dev {row[0].id},{row[1].id}\n(32, 512)\n64.0 KiB" for row in mesh.devices]
fig

# %% [markdown]
# Copies are sometimes what you want (the weights in data parallelism are copied on every device), but
# they cost memory: `P()` on this mesh keeps 8 copies, 8x the array's bytes.

# %%
assert shard_table(placed["P()"]).total_bytes == 8 * x.nbytes

# %% [markdown]
# ### Rule 4: at most one entry per dimension
#
# A spec with more entries than the array has dimensions cannot describe it. The `NamedSharding` alone
# does not know the array, so it is created without complaint, and even `shard_shape` answers for the
# first two entries. The error comes when the sharding meets an actual 2-D array:

# %%
too_long = NamedSharding(mesh, P("data", "model", None))
print("shard_shape still answers:", too_long.shard_shape(x.shape))
assert too_long.shard_shape(x.shape) == (32, 256)
try:
    jax.device_put(x, too_long)
except ValueError as err:  # the wording differs between JAX versions; the type does not
    raised.append("too long")
    print(f"{type(err).__name__}: {err}")

# %% [markdown]
# ### Rule 5: every name must be an axis of the mesh
#
# A typo or a name from another mesh fails as soon as the spec meets the mesh:

# %%
try:
    NamedSharding(mesh, P("batch", None))
except ValueError as err:
    raised.append("unknown axis")
    print(f"{type(err).__name__}: {err}")
assert raised == ["DuplicateSpecError", "too long", "unknown axis"]

# %% [markdown]
# ## 5. Uneven dimensions
#
# What if a dimension does not divide by its axes? Take 10 numbers and split them over `data` (4
# devices). This section uses a mesh with *Auto* axes, because it also needs
# `jax.lax.with_sharding_constraint`, which only accepts Auto axes (notebook 01 explains the two kinds).
#
# **Where an array is placed or leaves `jit`, JAX refuses.** `jax.device_put`, `jit`'s `in_shardings` and
# `out_shardings`, and even `shard_shape` raise `IndivisibleError` (a `ValueError`). (JAX 0.12 also
# prints the source line of the failing call to stdout just before raising, a leftover `print` inside
# JAX; the cell catches that text so that the output stays the same from run to run.)

# %%
import contextlib
import io

auto_mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
v = jnp.arange(10, dtype=jnp.float32)
uneven = NamedSharding(auto_mesh, P("data"))

refused = []
attempts = {
    "device_put": lambda: jax.device_put(v, uneven),
    "in_shardings": lambda: jax.jit(lambda a: a * 2, in_shardings=uneven)(np.arange(10, dtype=np.float32)),
    "out_shardings": lambda: jax.jit(lambda a: a * 2, out_shardings=uneven)(v),
    "shard_shape": lambda: uneven.shard_shape(v.shape),
}
for where, attempt in attempts.items():
    stray = io.StringIO()
    try:
        with contextlib.redirect_stdout(stray):  # JAX 0.12 prints the failing call's source line first
            attempt()
    except ValueError as err:
        refused.append(type(err).__name__)
        core = str(err)[str(err).index("implies"):].split(" (full shape")[0]  # wording around it varies
        print(f"{where:<14} {type(err).__name__}: ...{core}")
assert refused == ["IndivisibleError"] * 4

# %% [markdown]
# **Inside `jit`, XLA pads.** A compiled program may use an uneven sharding for values that stay inside
# it. XLA rounds the block size up, `ceil(10 / 4) = 3`, pads the dimension to 4 x 3 = 12, and the last
# block holds 1 real element and 2 elements of padding. `draw_sharding` draws that layout for a shape and
# sharding, even though JAX would not build such an array; the padding is hatched:

# %%
fig = draw_sharding((10,), uneven)
labels = tile_labels(fig)
print(labels)
assert [label.split("\n")[1] for label in labels] == ["(3)", "(3)", "(3)", "(1)"]
assert sum("padded to (3)" in label for label in labels) == 1  # only the last block is short
fig


# %% [markdown]
# Check that in a compiled program: constrain an intermediate to the uneven layout and reduce it to a
# number. The per-device program works on `f32[3]` blocks cut from the input padded to `f32[12]` (with
# zeros), and combines the 4 partial sums with one all-reduce. The padding must be left out of the sum:
# each padded zero would add `cos(0) = 1`. The answer is right, so XLA masked it:

# %%
def sum_of_cosines(a):
    b = jax.lax.with_sharding_constraint(a * 2, uneven)  # 10 elements split 4 ways, inside jit
    return jnp.cos(b).sum()


compiled = jax.jit(sum_of_cosines).lower(v).compile()
hlo = compiled.as_text()
print("padded to f32[12]:", "f32[12]" in hlo, "| blocks of f32[3]:", "f32[3]" in hlo)
print(collectives(compiled))
total = jax.jit(sum_of_cosines)(v)
print(f"sum = {float(total):.5f}")

assert "f32[12]" in hlo and "f32[3]" in hlo
assert collectives(compiled).counts["all-reduce"] == 1
np.testing.assert_allclose(total, np.cos(2 * np.arange(10)).sum(), rtol=1e-5)  # not this + 2


# %% [markdown]
# **Returning the uneven value is where the two JAX lines of this course differ.** A `jax.Array` must
# have even blocks, so the constrained value cannot leave `jit` as it is:
#
# - JAX 0.10.2 silently gives you a *replicated* result: the compiled program gathers the padded blocks
#   with an all-gather and every device holds all 10 elements. No error, no warning; only the
#   output's sharding tells you.
# - JAX 0.12 raises `IndivisibleError`, with a message about the device grid (`shape=[2, 4]`), not
#   about your 10 elements: it fails while turning the compiled output's sharding back into a
#   `NamedSharding`.

# %%
def doubled(a):
    return jax.lax.with_sharding_constraint(a * 2, uneven)


# Version branch: returning an unevenly constrained value from jit behaves differently on the
# course's two lines (checked on 0.10.2 and 0.12.0.1; 0.11 was not checked).
if jax.__version_info__ >= (0, 12):
    try:
        jax.jit(doubled)(v)
        outcome = "returned"
    except ValueError as err:
        outcome = type(err).__name__
        print(f"JAX {jax.__version__}: {outcome}: {err}")
    assert outcome == "IndivisibleError"
else:
    out = jax.jit(doubled)(v)
    gathers = collectives(jax.jit(doubled).lower(v).compile()).counts["all-gather"]
    print(f"JAX {jax.__version__}: returned, spec {out.sharding.spec}, fully replicated: "
          f"{out.sharding.is_fully_replicated}, all-gathers: {gathers}")
    assert out.sharding.is_fully_replicated and gathers == 1
    np.testing.assert_array_equal(np.asarray(out), 2 * np.arange(10))

# %% [markdown]
# **The fixes.** Either make the dimension divisible, or split it by something that divides it.
#
# - Pad the data to a multiple of the axis size yourself (here 12), and keep track of the real length
#   (slice the result, or mask the padding as XLA did above).
# - Split over an axis that divides the dimension: `model` has 2 devices, and 10 / 2 = 5.
# - For a multi-dimensional array, split a dimension that divides: a `(10, 512)` array can be split on
#   its 512 columns instead of its 10 rows.

# %%
padded = jax.device_put(jnp.pad(v, (0, 2)), uneven)  # 12 = 4 x 3: even now
print("padded:       ", padded.shape, "->", padded.sharding.shard_shape(padded.shape))
assert padded.sharding.shard_shape(padded.shape) == (3,)
np.testing.assert_array_equal(np.asarray(padded)[:10], np.asarray(v))  # slice the padding off when done

by_model = jax.device_put(v, NamedSharding(auto_mesh, P("model")))
print("over 'model': ", by_model.shape, "->", by_model.sharding.shard_shape(v.shape))
assert by_model.sharding.shard_shape(v.shape) == (5,)

wide = jax.device_put(jnp.ones((10, 512), jnp.float32), NamedSharding(auto_mesh, P(None, "data")))
print("columns:      ", wide.shape, "->", wide.sharding.shard_shape(wide.shape))
assert wide.sharding.shard_shape(wide.shape) == (10, 128)

# %% [markdown]
# ## 6. Gotcha: comparing specs
#
# A `PartitionSpec` compares entry by entry, as written. Two specs for the same layout can be unequal,
# and since JAX 0.10 a spec is never equal to a plain tuple:

# %%
comparisons = {
    "P('data', None) == P('data')": P("data", None) == P("data"),
    "P('data', None) == ('data', None)": P("data", None) == ("data", None),
}
for text, result in comparisons.items():
    print(f"{text:<36} {result}")
assert list(comparisons.values()) == [False, False]

# %% [markdown]
# That bites when you check the sharding JAX chose for a result. The spec of a `jit` output is
# *inferred*, and its written form need not match what you asked for. On the Auto mesh, a constraint to
# `P('data', None)` comes back as `P('data',)` (the trailing `None` dropped); on the Explicit mesh, an
# input placed with `P('data')` comes out of `jit` as `P('data', None)`. A test that compares specs with
# `==` fails on both, though each layout is exactly the one requested:

# %%
rows = NamedSharding(auto_mesh, P("data", None))
y_auto = jax.jit(lambda a: jax.lax.with_sharding_constraint(a * 2, rows))(x)
y_explicit = jax.jit(lambda a: a * 2)(jax.device_put(x, NamedSharding(mesh, P("data"))))
print("Auto mesh, asked for P('data', None), got:", y_auto.sharding.spec)
print("Explicit mesh, put with P('data'), got:   ", y_explicit.sharding.spec)

naive = [y_auto.sharding.spec == P("data", None), y_explicit.sharding.spec == P("data")]
assert naive == [False, False]

# %% [markdown]
# The fix: compare **shardings**, not specs, with `sharding.is_equivalent_to(other, ndim)`. It asks
# whether both put the same block on the same device for an array of `ndim` dimensions, and it still
# tells genuinely different layouts apart:

# %%
right = [
    y_auto.sharding.is_equivalent_to(rows, y_auto.ndim),
    y_explicit.sharding.is_equivalent_to(NamedSharding(mesh, P("data")), y_explicit.ndim),
]
print("is_equivalent_to:", right)
assert right == [True, True]
assert not y_auto.sharding.is_equivalent_to(NamedSharding(auto_mesh, P(None, "data")), 2)

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer. All three use the `(4, 2)` mesh above; `draw_mesh(mesh)`
# shows which device sits where.
#
# **Exercise 1.** Write a spec that gives each of the 8 devices a different `(16, 512)` block of the
# `(128, 512)` array `x`.

# %%
from exercises import ex02_partitionspec as ex

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
# ## Takeaways
# - A spec has one entry per array dimension: `None` keeps the dimension whole, a mesh axis splits it by
#   the axis size, a tuple of axes splits it by the product. `sharding.shard_shape(shape)` does the sum.
# - A mesh axis the spec does not name copies the blocks across it (`P('data', None)` on `(4, 2)`: each
#   block on 2 devices, 2x the memory); omitted trailing entries mean `None`.
# - In a tuple the first axis is the major one: `P(('data', 'model'))` and `P(('model', 'data'))` give the
#   same block shapes to different devices.
# - A repeated axis, an unknown axis and a spec longer than the array are errors; an uneven dimension is
#   refused wherever an array is placed or returned, and padded by XLA only inside `jit`.
# - Compare layouts with `sharding.is_equivalent_to(other, ndim)`, never with `spec ==`.
#
# **Next:** [03 · NamedSharding and placing data](03_namedsharding.ipynb)
