# %% [markdown]
# # 06 · shard_map: writing the per-device program
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/06_shard_map.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/06_shard_map.ipynb)
#
# The compiler picks every collective of a `jax.jit` program, so to get a particular one, say a
# reduce-scatter that leaves each of 4 devices a quarter of a sum, you write the program each device runs. Written by
# hand it is easy to get wrong: a forgotten `psum` can return a partial sum as the answer, and the pmap
# habit of averaging gradients makes them 8 times too large.
#
# **You need:** notebooks 02 (`PartitionSpec`), 04 (the collectives the compiler inserts) and 05 (Explicit
# meshes, `jax.typeof`); `jax.jit`, `jax.grad` and `jax.lax.scan`.
#
# `jax.shard_map` lets you write that per-device program, with the same collectives the compiler inserted
# in notebooks 04 and 05, and every one of them is checked against NumPy and the compiled program.
#
# **You will learn**
# - what `in_specs` and `out_specs` mean, and that inside `shard_map` the mesh axes are **Manual**;
# - `psum`, `all_gather`, `psum_scatter`, `all_to_all`, `ppermute` and `axis_index`: what each computes
#   and what each compiles to;
# - each collective as a change of type, and the ring that all-gather and reduce-scatter are modelled on;
# - how to go manual over one axis only (`axis_names=`) and leave the other to the compiler;
# - why `in_specs` reshards on an Auto mesh but only checks on an Explicit one;
# - what the `check_vma` replication check catches, and the wrong answer you get without it;
# - gradients through `shard_map`: why they depend on `check_vma`, `psum` and `pmean` over several axes,
#   and `jax.lax.pcast` to mix invariant and varying values.
#
# **On a first reading you may skip two parts**, marked *optional* in their headings:
#
# | part | why you can skip it now | come back when |
# |---|---|---|
# | §6, the ring | later notebooks use only its result, the ring estimate that every `collectives` table prints: each device sends `(N-1)/N` of an all-gather's result. The ring shows where that formula comes from | you want to know what the estimate assumes, or pass blocks around a ring with `ppermute` yourself (notebook 14's ring attention does) |
# | §10, gradients through `shard_map` | notebooks 07 to 17 call `jax.grad` outside any `shard_map`, so the compiler places the gradients' collectives for you | you differentiate inside a per-device program: porting `pmap` code (notebook 22) or writing a training step by hand (notebook 11, exercise 2) |

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
import warnings

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
    draw_permute,
    draw_sharding,
    draw_shardings,
    type_string,
)
from spmd_course.utils.drawing import draw_rings


mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
X = np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
x = jax.device_put(X, NamedSharding(mesh, P("data", "model")))


def program(f, *args):
    """The compiled per-device program of f on args, to read its collectives."""
    return jax.jit(f).lower(*args).compile()


print(mesh, "\nx:", type_string(x))
draw_mesh(mesh)

# %% [markdown]
# ## 1. The per-device program
#
# `jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)` runs `f` once on every device, on that device's
# block:
#
# | argument | what it says |
# |---|---|
# | `in_specs` | how each argument is cut into blocks, one `PartitionSpec` per argument (notebook 02) |
# | `out_specs` | how the blocks that `f` returns are put back together into one array |
#
# Inside `f` shapes are per device, and the mesh axes are of a third type, **Manual**, which means that
# the compiler adds no communication over them. `jax.lax.axis_index(name)` tells a device its position along an axis.

# %%
seen = {}


def per_device(b):
    seen["block"], seen["type"] = b.shape, str(jax.typeof(b))
    seen["axis types"] = jax.sharding.get_abstract_mesh().axis_types
    position = jax.lax.axis_index("data") * 2 + jax.lax.axis_index("model")  # this device's place in the mesh
    return 2 * b, jnp.full((1, 1), position)


blocks = jax.shard_map(per_device, mesh=mesh, in_specs=P("data", "model"),
                       out_specs=(P("data", "model"), P("data", "model")))
compiled = program(blocks, x)
doubled, positions = compiled(x)
print(seen)
print("positions:\n", np.asarray(positions))
assert seen["block"] == (4, 4) and seen["axis types"] == (AxisType.Manual, AxisType.Manual)
assert seen["type"] == "float32[4,4]{V:(data,model)}"  # V: the value varies across these axes
np.testing.assert_array_equal(doubled, 2 * X)
np.testing.assert_array_equal(positions, np.arange(8).reshape(4, 2))  # each device computed its own place
assert collectives(compiled).count() == 0  # no device talked to another

# %% [markdown]
# In plain NumPy, `shard_map` means three steps: split the array into blocks as `in_specs` says, run `f`
# on each block, and put the results back together as `out_specs` says. For the doubling above:

# %%
def shard_map_by_hand(f, array, rows, cols):
    """What shard_map computes, on one machine: split into rows x cols blocks, map f, reassemble."""
    blocks = [np.hsplit(row, cols) for row in np.vsplit(array, rows)]
    return np.block([[f(block) for block in row] for row in blocks])


np.testing.assert_array_equal(shard_map_by_hand(lambda b: 2 * b, X, 4, 2), doubled)  # P('data', 'model')

# %% [markdown]
# `f` is traced once, with the shapes of one block, so `seen` holds one block's view: `(4, 4)` of the
# `(16, 8)` array. In its type, `{V:(data,model)}` says the value **varies** across both axes: each device
# holds a different block. Both outputs are reassembled as `out_specs` says. In `positions`, for example,
# each device's `(1, 1)` block holds the position it computed:

# %%
draw_sharding(positions, show_bytes=False, contents=lambda b: f"position {b[0, 0]}")

# %% [markdown]
# ## 2. `psum`: add up across devices
#
# Column sums of `X` with rows split over `data`: each device sums its own 4 rows, and `jax.lax.psum` adds
# the four partial sums over `data`. The partial sum varies across `data`, but the total does not, so
# `out_specs=P()` (every device holds the whole result) is true.

# %%
x_rows = jax.device_put(X, NamedSharding(mesh, P("data", None)))


def column_sums(b):  # b: this device's (4, 8) rows
    partial = b.sum(axis=0)
    total = jax.lax.psum(partial, "data")
    seen["partial"], seen["total"] = str(jax.typeof(partial)), str(jax.typeof(total))
    return total


sum_columns = jax.shard_map(column_sums, mesh=mesh, in_specs=P("data", None), out_specs=P())
compiled = program(sum_columns, x_rows)
sums, ops = compiled(x_rows), collectives(compiled)
print(seen["partial"], "-> psum ->", seen["total"])
print(ops)
assert (seen["partial"], seen["total"]) == ("float32[8]{V:data}", "float32[8]")
assert [(op.kind, op.result_type, op.group_size) for op in ops.ops] == [("all-reduce", "f32[8]", 4)]
assert_close(sums, X.sum(axis=0))

# %% [markdown]
# One `psum`, one all-reduce of 8 floats among the 4 devices of each `data` column: exactly what the
# function says, nothing added.
#
# ## 3. `all_gather` and `psum_scatter`
#
# **`all_gather`** gives every device the blocks of all devices along an axis. With `tiled=True` they are
# concatenated, and without it they are stacked on a new axis. `to='invarying'` states that the result is the same on
# every device of the axis (section 9 shows why that matters). **`psum_scatter`** sums like `psum`, but
# each device keeps only its slice of the sum: here the four `(4, 4)` row blocks of each column half are
# added up, and each device keeps one row of the `(4, 8)` result, `X.reshape(4, 4, 8).sum(0)` in NumPy.
# The picture at the end of the next cell draws `x` and both results on one scale, so the `(4, 8)` sum
# is a quarter of the `(16, 8)` input, as it holds a quarter of the numbers.

# %%
gather = jax.shard_map(lambda b: jax.lax.all_gather(b, "data", tiled=True, to="invarying"),
                       mesh=mesh, in_specs=P("data", "model"), out_specs=P(None, "model"))
scatter = jax.shard_map(lambda b: jax.lax.psum_scatter(b, "data", scatter_dimension=0, tiled=True),
                        mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"))
gather_c, scatter_c = program(gather, x), program(scatter, x)
gathered, scattered = gather_c(x), scatter_c(x)
ag, rs = collectives(gather_c), collectives(scatter_c)
print("all_gather:\n", ag, "\n\npsum_scatter:\n", rs, sep="")
(ag_op,), (rs_op,) = ag.ops, rs.ops  # one collective each, among the 4 devices of a data column
assert (ag_op.kind, ag_op.group_size, np.prod(ag_op.shapes[0])) == ("all-gather", 4, 16 * 4)  # whole columns
assert rs_op.group_size == 4 and "stablehlo.reduce_scatter" in jax.jit(scatter).lower(x).as_text()
np.testing.assert_array_equal(gathered, X)  # the same values, whole columns on every device
assert_close(scattered, X.reshape(4, 4, 8).sum(axis=0))

stacked_shape = {}


def stack_blocks(b):  # without tiled=True the 4 blocks are stacked on a new first axis, not concatenated
    stacked = jax.lax.all_gather(b, "data", to="invarying")
    stacked_shape["in the body"] = stacked.shape
    return stacked


stacked = jax.shard_map(stack_blocks, mesh=mesh, in_specs=P("data", "model"), out_specs=P(None, None, "model"))(x)
print("all_gather without tiled: each device's", stacked_shape["in the body"], "| assembled", stacked.shape)
assert stacked_shape["in the body"] == (4, 4, 4)  # 4 blocks of (4, 4), one per device along data
np.testing.assert_array_equal(stacked, X.reshape(4, 4, 8))  # block d at index d: the rows of device d

draw_shardings({"1: x": x, "2: all_gather over data": gathered, "3: psum_scatter over data": scattered},
               same_scale=True)

# %% [markdown]
# `psum_scatter` hands every backend's compiler a reduce-scatter (`lower(x).as_text()` shows it), and the
# CPU compiler keeps it. Ask the compiler for the same sum instead, `a.sum(0)` with `out_shardings=P('data',
# 'model')`, and on the CPU backend it writes an all-reduce of the whole `(4, 4)` sum, of which each
# device then keeps one row with a `dynamic-slice` (see the CPU compiler's exact figures, in the hidden
# cell at the end of this section). In `shard_map` you choose the collective:

# %%
x3 = jax.device_put(X.reshape(4, 4, 8), NamedSharding(mesh, P("data", None, "model")))
by_compiler = jax.jit(lambda a: a.sum(axis=0), out_shardings=NamedSharding(mesh, P("data", "model")))
by_compiler_c = by_compiler.lower(x3).compile()
print(collectives(by_compiler_c))
assert_close(by_compiler_c(x3), scattered)

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §3: the collectives' types
(jit_op,) = collectives(by_compiler_c).ops
print(f"On {jax.default_backend()}: all_gather compiles to {ag_op.kind} {ag_op.result_type}, psum_scatter to "
      f"{rs_op.kind} {rs_op.result_type}, and jit's own sum to {jit_op.kind} {jit_op.result_type}.")
if CPU:  # a TPU v5e writes an all-gather of f32[4,4,4], and this small reduce-scatter as an all-reduce
    assert (ag_op.result_type, rs_op.kind, rs_op.result_type) == ("f32[16,4]", "reduce-scatter", "f32[1,4]")
    (op,) = collectives(by_compiler_c).ops
    assert (op.kind, op.result_type) == ("all-reduce", "f32[4,4]")  # the compiler's sum: all of it everywhere
    assert re.search(r"f32\[1,4\]\S* dynamic-slice\(", by_compiler_c.as_text())  # then each keeps its row

# %% [markdown]
# ## 4. `all_to_all`: switch which dimension is split
#
# `all_to_all` cuts each block into pieces along one dimension, sends piece `j` to device `j` of the axis,
# and concatenates what arrives along another. From rows split over `data` to columns split over `data`:
# the collective the compiler used in notebook 04 to move a mismatched operand.

# %%
transpose_split = jax.shard_map(lambda b: jax.lax.all_to_all(b, "data", split_axis=1, concat_axis=0, tiled=True),
                                mesh=mesh, in_specs=P("data", None), out_specs=P(None, "data"))
compiled = program(transpose_split, x_rows)
by_columns, a2a = compiled(x_rows), collectives(compiled)
print(type_string(x_rows), "->", type_string(by_columns))
print(a2a)
assert [(op.kind, op.group_size) for op in a2a.ops] == [("all-to-all", 4)]
assert a2a.ops[0].result_bytes == 4 * 8 * 4  # each device's whole (4, 8) block, in 4 pieces of (4, 2)
assert by_columns.sharding.shard_shape(X.shape) == (16, 2)
np.testing.assert_array_equal(by_columns, X)  # the same array, cut the other way
draw_shardings({"1: before": x_rows, "2: after all_to_all": by_columns}, ncols=2)

# %% [markdown]
# ## 5. `ppermute`: send blocks to other devices
#
# `ppermute` sends each device's block to another device, given as `(source, destination)` pairs of
# positions along one axis. A ring shift along `data`: position `i` sends to `i + 1`, the last to the first.
# Both `model` columns run the same ring at once:

# %%
ring = [(i, (i + 1) % 4) for i in range(4)]
draw_permute(mesh, "data", ring)

# %% [markdown]
# The layout does not change, the contents do. Give each device a block holding its own id, shift it, and
# label each block with what it holds:

# %%
ids = jax.device_put(mesh.device_ids.astype(np.float32), NamedSharding(mesh, P("data", "model")))
shift = jax.shard_map(lambda b: jax.lax.ppermute(b, "data", ring),
                      mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"))
compiled = program(shift, ids)
shifted, cp = compiled(ids), collectives(compiled)
print(cp)
assert [(op.kind, op.result_type, op.group_size) for op in cp.ops] == [("collective-permute", "f32[1,1]", 4)]
np.testing.assert_array_equal(shifted, np.roll(mesh.device_ids, 1, axis=0))  # NumPy: a roll by one row

draw_shardings({"1: before": ids, "2: after ppermute": shifted}, ncols=2, show_bytes=False,
               contents=lambda b: f"data of dev {b[0, 0]:.0f}")

# %% [markdown]
# The device at `data=1` now holds the data of the one at `data=0`, and the one at `data=0` holds the
# data of the one at `data=3`: the ring wraps around. One collective-permute of one block per device did
# it.

# %% [markdown]
# ## 6. Collectives as changes of type, and the ring
#
# Each collective rewrites a type, written in the notation of notebook 00 (`f32[16@data,8]`) with the
# pending-sum marker of notebooks 04 and 05 (`{U:data}`):
#
# | collective | type in → type out |
# |---|---|
# | `all_gather` | `f32[16@data,8] → f32[16,8]` |
# | `psum` | `f32[16,8]{U:data} → f32[16,8]` |
# | `psum_scatter` | `f32[16,8]{U:data} → f32[16@data,8]` |
# | `all_to_all` | `f32[16@data,8] → f32[16,8@data]` |
# | `ppermute` | `f32[16@data,8] → f32[16@data,8]`: the type stays, the blocks move |
#
# Two markers can follow a type, and they mean different things:
#
# | marker | where JAX prints it | what it says about the value |
# |---|---|---|
# | `{V:data}`, varying | inside `shard_map`, on a block | each device along `data` holds *different* data (its own rows, say). Nothing is owed: the value is complete as it is |
# | `{U:data}`, unreduced | on a whole array (Explicit mesh), or on an input declared `unreduced` | each device holds a *partial sum*: the value is the sum over `data` of what the devices hold, and that sum is still owed |
#
# So in §2, `psum` turned a varying block, `float32[8]{V:data}`, into one value that is the same on every
# device. Here it pays a debt: it turns an unreduced value into the value it stands for. JAX types a
# pending sum only on an Explicit mesh, so the two sums below run there. The partials `X`, `2X`, `3X`, `4X`
# come from a matmul whose contracting dimension is cut over `data` (notebook 05's `unreduced=`), and they
# enter `shard_map` declared as unreduced. The cell records the types JAX prints inside the body too.

# %%
rewrites = {  # collective: (per-device program, input, out_specs), on the Auto mesh
    "all_gather": (lambda b: jax.lax.all_gather(b, "data", tiled=True, to="invarying"), x_rows, P()),
    "all_to_all": (lambda b: jax.lax.all_to_all(b, "data", 1, 0, tiled=True), x_rows, P(None, "data")),
    "ppermute": (lambda b: jax.lax.ppermute(b, "data", ring), x_rows, P("data", None)),
}
types, out, inside = {}, {}, {}
for name, (f, a, out_specs) in rewrites.items():
    out[name] = jax.shard_map(f, mesh=mesh, in_specs=P("data", None), out_specs=out_specs)(a)
    types[name] = f"{type_string(a)} → {type_string(out[name])}"

paying = {"psum": (lambda b: jax.lax.psum(b, "data"), P()),  # on the Explicit mesh: a typed pending sum
          "psum_scatter": (lambda b: jax.lax.psum_scatter(b, "data", tiled=True), P("data", None))}
pending_mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
with jax.set_mesh(pending_mesh):
    stack = jax.device_put(np.stack([X] * 4), P("data", None, None))  # device d holds a copy of X ...
    weights = jax.device_put(np.arange(1.0, 5.0, dtype=np.float32), P("data"))  # ... and the weight d + 1
    partials = jax.jit(lambda w, s: jnp.einsum("d,dij->ij", w, s, out_sharding=P(None, None, unreduced={"data"})))(
        weights, stack)  # device d's partial is (d + 1) X; the sum over data is 10 X
    for name, (f, out_specs) in paying.items():
        def body(block, f=f, name=name):
            result = f(block)
            inside[name] = f"{jax.typeof(block)} → {jax.typeof(result)}"  # what JAX prints in the body
            return result
        out[name] = jax.shard_map(body, in_specs=P(None, None, unreduced={"data"}), out_specs=out_specs)(partials)
        types[name] = f"{type_string(partials)} → {type_string(out[name])}"
for name in [*rewrites, *paying]:
    print(f"{name:<13} {types[name]:<40} {inside.get(name, '')}")
assert str(jax.typeof(partials)) == "float32[16,8]{U:data}"  # JAX's own print of the pending sum
assert types == {"all_gather": "f32[16@data,8] → f32[16,8]", "psum": "f32[16,8]{U:data} → f32[16,8]",
                 "psum_scatter": "f32[16,8]{U:data} → f32[16@data,8]", "all_to_all": "f32[16@data,8] → f32[16,8@data]",
                 "ppermute": "f32[16@data,8] → f32[16@data,8]"}
assert inside == {"psum": "float32[16,8]{U:data} → float32[16,8]",  # the debt paid, the same on every device
                  "psum_scatter": "float32[16,8]{U:data} → float32[4,8]{V:data}"}  # paid, each keeps its rows
for name in ("all_gather", "all_to_all"):
    np.testing.assert_array_equal(out[name], X)
for name in ("psum", "psum_scatter"):
    assert_close(out[name], 10 * X)
np.testing.assert_array_equal(out["ppermute"], np.roll(X, 4, axis=0))  # each 4-row block one place on

# %% [markdown]
# ### The ring (optional on a first reading)
#
# You can skip to §7 and keep one fact, because it is all that later notebooks use: in an all-gather or a
# reduce-scatter over `N` devices, each device sends `(N-1)/N` of the result, the **ring estimate**. What
# follows shows where that estimate comes from.
#
# The textbook model of an all-gather or a reduce-scatter is a **ring**. In each of `N - 1` steps every
# device sends one block to the next device, which is one `ppermute`:
#
# | ring | what each device sends at each step | what the receiver does with it |
# |---|---|---|
# | all-gather | the block it received last (its own at the first step) | keeps it |
# | reduce-scatter | a running sum of one block | adds its own partial of that block, then passes it on |
#
# Both rings below run along `data` and keep every buffer after each step, so that the picture can show
# them. The partials are chosen so that a sum tells its own story. Device `d`'s partial of block `j` is
# `[2**d, (j+1)·2**d]`. For example, a first entry of `1 + 4 = 5` (binary `101`) says that devices 0 and 2
# contributed, and because the second entry is always `j + 1` times the first, their ratio names the block.

# %%
N = 4  # devices along data


def ring_all_gather(block):  # block: this device's (1, 2) piece
    i = jax.lax.axis_index("data")
    buf = jax.lax.dynamic_update_slice_in_dim(jnp.full((N, 2), jnp.nan), block, i, 0)  # NaN: not arrived
    frames, passing = [buf], block
    for step in range(N - 1):
        passing = jax.lax.ppermute(passing, "data", ring)  # what the previous device received last
        buf = jax.lax.dynamic_update_slice_in_dim(buf, passing, (i - step - 1) % N, 0)
        frames.append(buf)
    return buf[None], jnp.stack(frames)[None]


def ring_reduce_scatter(part):  # part: this device's (N, 2) partials, one row per block
    i = jax.lax.axis_index("data")
    running = jax.lax.dynamic_slice_in_dim(part, (i - 1) % N, 1, 0)  # block i - 1 starts here
    frames = [running]
    for step in range(N - 1):
        own = jax.lax.dynamic_slice_in_dim(part, (i - step - 2) % N, 1, 0)
        running = jax.lax.ppermute(running, "data", ring) + own
        frames.append(running)
    return running, jnp.stack(frames)[None]  # after N - 1 steps: the whole sum of block i


A = np.arange(1, 2 * N + 1, dtype=np.float32).reshape(N, 2)  # block j: row j
PARTS = np.array([[[2.0**d, (j + 1) * 2.0**d] for j in range(N)] for d in range(N)], np.float32)  # [d, j]
a_rows, parts = (jax.device_put(v.reshape(-1, 2), NamedSharding(mesh, P("data", None))) for v in (A, PARTS))
rings, sent = {}, {}
for name, ring_fn, arg, out_specs in (("all-gather", ring_all_gather, a_rows, P("data")),
                                      ("reduce-scatter", ring_reduce_scatter, parts, P("data"))):
    compiled = program(jax.shard_map(ring_fn, mesh=mesh, in_specs=P("data", None), out_specs=(out_specs, P("data"))),
                       arg)
    result, frames = compiled(arg)
    rings[name] = np.asarray(frames)  # [device along data, step, ...]
    sent[name] = sum(op.result_bytes for op in collectives(compiled).ops)  # bytes each device sends
    assert collectives(compiled).counts["collective-permute"] == N - 1 == len(collectives(compiled).ops)
    out[name] = result
gather_ref = jax.shard_map(lambda b: jax.lax.all_gather(b, "data", tiled=True, to="invarying"), mesh=mesh,
                           in_specs=P("data", None), out_specs=P())
scatter_ref = jax.shard_map(lambda b: jax.lax.psum_scatter(b, "data", tiled=True), mesh=mesh,
                            in_specs=P("data", None), out_specs=P("data", None))
np.testing.assert_array_equal(out["all-gather"], np.stack([gather_ref(a_rows)] * N))  # every device: all of A
np.testing.assert_array_equal(out["all-gather"], np.stack([A] * N))
np.testing.assert_array_equal(out["reduce-scatter"], scatter_ref(parts))
np.testing.assert_array_equal(out["reduce-scatter"], PARTS.sum(axis=0))  # device i: block i, summed
(ag_ring,) = collectives(program(gather_ref, a_rows)).ops
print(f"bytes each device sends: ring all-gather {sent['all-gather']}, ring reduce-scatter "
      f"{sent['reduce-scatter']}; ring estimate of the compiled all_gather {ag_ring.estimated_bytes:.0f}")
assert sent["all-gather"] == ag_ring.estimated_bytes == (N - 1) / N * A.nbytes  # (N-1)/N of the result
assert sent["reduce-scatter"] == (N - 1) / N * PARTS[0].nbytes  # (N-1)/N of each device's partials


# %% [markdown]
# The picture shows the first `model` column after each step, drawn by `draw_rings` from `utils.drawing`.
# A block takes the colours of the devices whose data it holds, and the outlined block is the one sent
# next, along the arrow. In the reduce-scatter, each device also holds its own partials of all 4 blocks
# from the start, so they are drawn as a faint column beside its blocks. The dashed outline marks the
# partial that the device added in that frame: for example, after step 1 the sum that a device received
# gains a stripe in its own colour, at the height of the outlined partial.

# %%
ids = mesh.device_ids[:, 0].tolist()  # the devices along data, model=0


def contributors(bits):
    return tuple(ids[p] for p in range(N) if int(bits) >> p & 1)


frames = {"ring all-gather: whose block each is": [
    [{j: (ids[j],) for j in range(N) if not np.isnan(buf[j, 0])} for buf in rings["all-gather"][:, step]]
    for step in range(N)],
    "ring reduce-scatter: whose partials each sum adds": [
    [{int(s[1] / s[0]) - 1: contributors(s[0])} for s in rings["reduce-scatter"][:, step, 0]] for step in range(N)]}
draw_rings(frames, ids, own_partials=["ring reduce-scatter: whose partials each sum adds"])

# %% [markdown]
# Each device sent 3 blocks of 8 bytes: 24 bytes, `(N-1)/N` of the all-gather's 32-byte result, the
# **ring estimate** of every `collectives` table. It is a model, not a measurement: the compiler picks
# its own algorithm per backend and topology, not necessarily this ring.
#
# ## 7. Manual over one axis only: `axis_names=`
#
# `axis_names={'data'}` makes only `data` Manual. `model` stays Auto, and the compiler handles it as in
# notebook 04. For example, compute the column sums of `x @ w` with `w` split by columns over `model`,
# writing only the sum over `data`:
#
# | `shard_map` over | what `in_specs=P()` means for `w` | what the compiler does |
# |---|---|---|
# | both axes (fully manual) | the whole `w` on every device | gathers `w` first |
# | `data` only (partly manual) | `w` as the Auto axis `model` leaves it | keeps `w` split, each device to its columns |

# %%
W = np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 100
w = jax.device_put(W, NamedSharding(mesh, P(None, "model")))

# %% tags=["save"]
def sums_of_product(xb, wb):
    """One device's rows of x times w, summed over the rows, then added up over `data`."""
    return jax.lax.psum((xb @ wb).sum(axis=0), "data")

# %%
inside = {}


def watched(xb, wb):  # sums_of_product, noting what the body sees: the axis types and w's block
    inside["axis types"], inside["w"] = jax.sharding.get_abstract_mesh().axis_types, wb.shape
    return sums_of_product(xb, wb)


specs = dict(mesh=mesh, in_specs=(P("data", None), P()), out_specs=P())
full = jax.shard_map(watched, **specs)
full_c = program(full, x_rows, w)
partial = jax.shard_map(watched, **specs, axis_names={"data"})
partial_c = program(partial, x_rows, w)
print("all axes manual:\n", collectives(full_c), "\n\nonly data manual:", inside, "\n", collectives(partial_c), sep="")
assert inside == {"axis types": (AxisType.Manual, AxisType.Auto), "w": (8, 16)}
assert "all-gather" in collectives(full_c).kinds  # the whole w, gathered for in_specs=P()
assert_close(partial_c(x_rows, w), (X @ W).sum(axis=0))
assert_close(full_c(x_rows, w), (X @ W).sum(axis=0))

# %% [markdown]
# Inside, the axis types are `(Manual, Auto)`, and `w` looks whole, `(8, 16)`: over an Auto axis your code
# sees the global view. The compiled program keeps `w` split. With the CPU compiler its only collective is
# your `psum`, of 8 floats, half the columns (see the CPU compiler's exact figures, in the hidden cell at the end of this section).

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §7: the partly manual program
partial_ops = [(op.kind, op.result_type) for op in collectives(partial_c).ops]
print(f"On {jax.default_backend()}, the partly manual program's collectives are {partial_ops}.")
if CPU:  # one all-reduce of the 8 column sums; w stays split
    assert partial_ops == [("all-reduce", "f32[8]")]

# %% [markdown]
# ## 8. On an Explicit mesh, `in_specs` is a check
#
# On an Auto mesh, `in_specs` that differ from the input's sharding are a reshard the compiler inserts
# (the gather of `w` above). On an Explicit mesh the sharding is in the input's type (notebook 05), and
# `in_specs` must match it: a mismatch is an error, and moving data is a `jax.reshard` you write. Leave
# `in_specs` out and it is read from the types. Under `jax.set_mesh`, `mesh=` can be left out too.

# %%
emesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))


def double(b):
    return 2 * b


with jax.set_mesh(emesh):
    xe = jax.device_put(X, P("data", None))
    sums_e = jax.shard_map(column_sums, out_specs=P())(xe)  # in_specs read from the type
    print(jax.typeof(xe), "-> column sums ->", jax.typeof(sums_e))
    refused = []
    try:
        jax.shard_map(double, in_specs=P(), out_specs=P())(xe)
    except ValueError as err:
        refused.append("ValueError")
        print("in_specs=P(): ValueError:", str(err).split(". `in_specs`")[0])
assert refused == ["ValueError"]
assert_close(sums_e, X.sum(axis=0))

on_auto = collectives(program(jax.shard_map(double, mesh=mesh, in_specs=P(), out_specs=P()), x_rows))
print("the same in_specs=P() on the Auto mesh:\n", on_auto, sep="")
(op,) = on_auto.ops
assert op.kind == "all-gather" and np.prod(op.shapes[0]) == X.size  # the whole array

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §8: the gather's type
print(f"On {jax.default_backend()}, the gather is {op.kind} {op.result_type}.")
if CPU:  # a TPU v5e writes it f32[4,4,8]
    assert op.result_type == "f32[16,8]"


# %% [markdown]
# ## 9. The `check_vma` replication check
#
# `out_specs=P()` is a **claim**: the output is the same on every device, so any copy stands for the
# whole. `shard_map` tracks which values vary across which axes (the `{V:data}` of section 2) and refuses a
# claim it cannot prove. Forget the `psum`, and the output still varies across `data`:

# %%
def forgot_psum(b):
    return b.sum(axis=0)  # each device's partial sum, not the total


caught = []
try:
    jax.shard_map(forgot_psum, mesh=mesh, in_specs=P("data", None), out_specs=P())(x_rows)
except ValueError as err:
    caught.append("ValueError")
    lines = [line for line in str(err).splitlines() if line]
    print("ValueError: ...", next(line for line in lines if line.startswith("out_specs is")), "\n...", lines[-1])
    assert "check_vma=False" in str(err)  # the message suggests switching the check off
assert caught == ["ValueError"]

# %% [markdown]
# The message suggests `check_vma=False`. That switches off the check, not the problem: `shard_map` then
# believes the claim and returns one device's partial sum as the answer, without an error.

# %%
unchecked = jax.shard_map(forgot_psum, mesh=mesh, in_specs=P("data", None), out_specs=P(), check_vma=False)(x_rows)
print("check_vma=False:", np.asarray(unchecked))
print("right answer:   ", X.sum(axis=0))
np.testing.assert_array_equal(unchecked, X[:4].sum(axis=0))  # the first 4 rows only
assert not np.allclose(unchecked, X.sum(axis=0))

# %% [markdown]
# The same check is why `all_gather` in section 3 said `to='invarying'`. Without it the gathered value is
# typed as varying across `data`, and the same claim fails:

# %%
try:
    jax.shard_map(lambda b: jax.lax.all_gather(b, "data", tiled=True), mesh=mesh,
                  in_specs=P("data", "model"), out_specs=P(None, "model"))(x)
except ValueError as err:
    caught.append("ValueError")
    print("ValueError: ...", next(line for line in str(err).splitlines() if line.startswith("out_specs is")))
assert caught == ["ValueError", "ValueError"]

# %% [markdown]
# Keep `check_vma=True`, the default. When it complains, add the collective you forgot, or say
# `to='invarying'` where a collective really made the value the same everywhere.
#
# > **You will see this online:**
# > ```python
# > from jax.experimental.shard_map import shard_map
# > f = shard_map(column_sums, mesh, in_specs=P("data", None), out_specs=P(), check_rep=True)
# > ```
# > `jax.experimental.shard_map` is deprecated. It still works, and its import warns:

# %%
with warnings.catch_warnings(record=True) as warned:
    warnings.simplefilter("always")
    from jax.experimental.shard_map import shard_map
    old = shard_map(column_sums, mesh, in_specs=P("data", None), out_specs=P(), check_rep=True)(x_rows)
for w_ in warned:
    print(f"{w_.category.__name__}: {w_.message}")
assert [w_.category for w_ in warned] == [DeprecationWarning]
assert "jax.experimental.shard_map is deprecated" in str(warned[0].message)
np.testing.assert_array_equal(old, sums)

# %% [markdown]
# The fix, as used throughout: `jax.shard_map(f, mesh=mesh, in_specs=..., out_specs=...)`, the mesh a
# keyword (or from `jax.set_mesh`), and `check_vma` for `check_rep`.

# %% [markdown]
# ## 10. Gradients through `shard_map` (optional on a first reading)
#
# Skip this section until you differentiate inside a per-device program, because notebooks 07 to 17 call
# `jax.grad` outside `shard_map` and let the compiler place the gradients' collectives. You will need it to
# port `pmap` code (notebook 22) or to write a training step by hand (notebook 11, exercise 2).
#
# A loss written per device: the 16 rows are split over **both** axes, 2 per device (`P(('data', 'model'),
# None)`), and `pmean` over both axes averages the eight local losses (`psum` and `pmean` take a tuple of
# axes). `w` and `b` are whole on every device (`P()`): invariant. Where `xb @ w + b` mixes them with
# varying values, `shard_map` casts them to varying, and the transpose of that cast is a `psum`: the
# gradient of an invariant input comes back summed over the devices. Differentiate inside the per-device
# program in two ways, with and without the check, and compare with `jax.grad` of the plain loss:

# %%
rng = np.random.default_rng(0)
Xg, Wg, bg = (rng.normal(size=s).astype(np.float32) for s in ((16, 8), (8, 4), (4,)))
both = ("data", "model")
xg = jax.device_put(Xg, NamedSharding(mesh, P(both, None)))


def loss(w, b, x):  # the plain loss
    return jnp.mean(jnp.tanh(x @ w + b) ** 2)


def grad_of_mean(w, b, xb):  # differentiate the mean over all devices
    return jax.grad(lambda w, b: jax.lax.pmean(loss(w, b, xb), both), argnums=(0, 1))(w, b)


def mean_of_grads(w, b, xb):  # the pmap habit: each device's gradient, then their mean
    return [jax.lax.pmean(g, both) for g in jax.grad(loss, argnums=(0, 1))(w, b, xb)]


def equal(grads, ref, scale=1):
    return all(np.allclose(g, scale * r, rtol=RTOL, atol=RTOL) for g, r in zip(grads, ref, strict=True))


first_rows = Xg[xg.sharding.devices_indices_map(Xg.shape)[mesh.devices.flat[0]]]  # the first device's 2 rows
want, want_first = (jax.jit(jax.grad(loss, argnums=(0, 1)))(Wg, bg, rows) for rows in (Xg, first_rows))
verdicts = {}
for f in (grad_of_mean, mean_of_grads):
    for check in (True, False):
        got = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(), P(), P(both, None)), out_specs=P(),
                                    check_vma=check))(Wg, bg, xg)
        verdicts[f.__name__, check] = ("right" if equal(got, want) else "8x too large" if equal(got, want, 8) else
                                       "the first device's rows only" if equal(got, want_first) else "other")
        print(f"{f.__name__:<14} check_vma={check!s:<6} {verdicts[f.__name__, check]}")
assert verdicts == {("grad_of_mean", True): "right", ("grad_of_mean", False): "the first device's rows only",
                    ("mean_of_grads", True): "8x too large", ("mean_of_grads", False): "right"}

# %% [markdown]
# With the check on, the gradient of `w` arrives already summed over the 8 devices, so differentiating
# the mean is right, and averaging the gradients again (as `pmap` code does) keeps that sum: 8 times too
# large. With `check_vma=False` nothing is cast or summed: `out_specs=P()` hands back the first device's
# gradient, as if its 2 rows were the batch. `pmap` runs without the check, which is why its habit of
# averaging gradients is right there. Keep the check on and differentiate the loss your program computes.
#
# **Casting by hand: `jax.lax.pcast`.** A `scan` carry must keep its type from step to step, so a carry
# that starts invariant (`jnp.zeros`) and takes in varying rows is refused. Cast it to varying over the
# axes with `jax.lax.pcast(..., to='varying')` (which replaced `jax.lax.pvary`):

# %%
def running_sum(xb, cast):
    start = jnp.zeros(xb.shape[1:])
    start = jax.lax.pcast(start, both, to="varying") if cast else start
    total, _ = jax.lax.scan(lambda acc, row: (acc + row, None), start, xb)
    return jax.lax.psum(total, both)  # one psum over both axes: all 8 devices


def summed(cast):
    return jax.shard_map(lambda xb: running_sum(xb, cast), mesh=mesh, in_specs=P(both, None), out_specs=P())


try:
    summed(cast=False)(xg)
except TypeError as err:
    caught.append("TypeError")
    print("TypeError: ...", next(line for line in str(err).splitlines() if "manual axis types" in line))
    assert "pcast" in str(err)  # the message names the fix
compiled = program(summed(cast=True), xg)
print(collectives(compiled))
assert caught[-1] == "TypeError"
assert [(op.kind, op.group_size) for op in collectives(compiled).ops] == [("all-reduce", 8)]
assert_close(compiled(xg), Xg.sum(axis=0), atol=1e-5)
assert not hasattr(jax.lax, "pvary")  # the older spelling, seen online, is gone: use pcast

# %% [markdown]
# ## Takeaways
# - `jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)` runs `f` on each device's block; inside, the
#   axes are Manual and `{V:data}` marks values that differ across `data`.
# - Each collective is one line and one op in the compiled program: `psum` → all-reduce, `all_gather` →
#   all-gather, `psum_scatter` → reduce-scatter, `all_to_all` → all-to-all, `ppermute` →
#   collective-permute; `axis_index` needs none. Each rewrites the type; ppermute only moves blocks.
# - `N - 1` `ppermute` steps around a ring make an all-gather or a reduce-scatter: each device sends
#   `(N-1)/N` of the result, the ring estimate.
# - `axis_names={'data'}` goes manual over `data` only and leaves `model` to the compiler.
# - On an Auto mesh `in_specs` reshards the input; on an Explicit mesh it must match the input's type.
# - Keep `check_vma=True`: it refuses an `out_specs` that claims replication it cannot prove, where
#   `check_vma=False` returns one device's partial result. Use `jax.shard_map`, not
#   `jax.experimental.shard_map`.
# - With the check on, the gradient of an invariant input arrives summed over the devices: differentiate
#   the loss the program computes (`pmean` inside), do not average gradients again as `pmap` code does.
#   `jax.lax.pcast(..., to='varying')` casts an invariant value, such as a `scan` carry, by hand.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** Write `my_column_sums(x)` with `jax.shard_map` on this notebook's `mesh`: `x` is a `(32, 8)`
# array at `P('data', None)`, and the result is `jnp.sum(x, axis=0)`, shape `(8,)`. The checker compares
# with `jnp.sum` and reads the compiled program.

# %%
from spmd_course.exercises import ex06_shard_map as ex


def my_column_sums(x):
    raise NotImplementedError  # return jax.shard_map(..., mesh=mesh, in_specs=..., out_specs=...)(x)


answer_1 = NOT_ANSWERED  # then: answer_1 = my_column_sums
ex.column_sums.check(answer_1);

# %% [markdown]
# **Exercise 2.** Reverse the ring of section 5: `ppermute` along `data` with the pairs
# `[(i, (i - 1) % 4) for i in range(4)]`. Whose data does device 6 hold afterwards? Use the mesh picture.

# %%
answer_2 = NOT_ANSWERED  # a device id, 0 to 7
ex.ring_source.check(answer_2);

# %% [markdown]
# **Exercise 3.** `lambda b: jax.lax.all_to_all(b, 'data', split_axis=0, concat_axis=1, tiled=True)` runs
# on a `(16, 8)` array with `in_specs=P(None, 'data')`. Which `out_specs` puts the blocks back together
# into the same `(16, 8)` array? The checker runs `shard_map` with your answer.

# %%
answer_3 = NOT_ANSWERED  # a PartitionSpec, e.g. P(...)
ex.all_to_all_out_specs.check(answer_3);

# %% [markdown]
# **Next:** [07 · Data parallelism](07_data_parallel.ipynb)
