# %% [markdown]
# # 06 · shard_map: writing the per-device program
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/06_shard_map.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/06_shard_map.ipynb)
#
# This notebook teaches `jax.shard_map`, which hands you the program each device runs: your function sees
# one block of each array, and every collective in it is one you wrote. You will write by hand the
# collectives the compiler inserted for you in notebooks 04 and 05, compare each result with plain NumPy,
# and find each collective in the compiled program with its kind, its per-device shape and its group of
# devices.
#
# **You will learn**
# - what `in_specs` and `out_specs` mean, and that inside `shard_map` the mesh axes are **Manual**;
# - `psum`, `all_gather`, `psum_scatter`, `all_to_all`, `ppermute` and `axis_index`: what each computes
#   and what each compiles to;
# - how to go manual over one axis only (`axis_names=`) and leave the other to the compiler;
# - why `in_specs` reshards on an Auto mesh but only checks on an Explicit one;
# - what the `check_vma` replication check catches, and the wrong answer you get without it;
# - gradients through `shard_map`: why they depend on `check_vma`, `psum` and `pmean` over several axes,
#   and `jax.lax.pcast` to mix invariant and varying values.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title Setup: 8 devices (the same cell opens every notebook; notebook 00 explains it)
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

from utils import (
    NOT_ANSWERED,
    collectives,
    draw_mesh,
    draw_permute,
    draw_sharding,
    draw_shardings,
    type_string,
)


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
# block. `in_specs` says how each argument is cut into blocks (a `PartitionSpec`, as in notebook 02);
# `out_specs` says how the blocks `f` returns are put back together into one array. Inside `f` shapes are
# per device, and the mesh axes are of a third type, **Manual**: the compiler adds no communication over
# them. `jax.lax.axis_index(name)` tells a device its position along an axis.

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
# `f` is traced once, with the shapes of one block, so `seen` holds one block's view: `(4, 4)` of the
# `(16, 8)` array. In its type, `{V:(data,model)}` says the value **varies** across both axes: each device
# holds a different block. Both outputs are reassembled as `out_specs` says; in `positions` each device's
# `(1, 1)` block holds the position it computed:

# %%
draw_sharding(positions, show_bytes=False, contents=lambda b: f"position {b[0, 0]}")

# %% [markdown]
# ## 2. `psum`: add up across devices
#
# Column sums of `X` with rows split over `data`: each device sums its own 4 rows, and `jax.lax.psum` adds
# the four partial sums over `data`. The partial sum varies across `data`; the total does not, so
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
np.testing.assert_allclose(sums, X.sum(axis=0), rtol=RTOL)

# %% [markdown]
# One `psum`, one all-reduce of 8 floats among the 4 devices of each `data` column: exactly what the
# function says, nothing added.
#
# ## 3. `all_gather` and `psum_scatter`
#
# **`all_gather`** gives every device the blocks of all devices along an axis; with `tiled=True` they are
# concatenated (without it, stacked on a new axis). `to='invarying'` states that the result is the same on
# every device of the axis (section 8 shows why that matters). **`psum_scatter`** sums like `psum`, but
# each device keeps only its slice of the sum: here the four `(4, 4)` row blocks of each column half are
# added up, and each device keeps one row of the `(4, 8)` result, `X.reshape(4, 4, 8).sum(0)` in NumPy.

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
if CPU:  # the CPU compiler's types (the TPU's: all-gather f32[4,4,4]; this small reduce-scatter, an all-reduce)
    assert (ag_op.result_type, rs_op.kind, rs_op.result_type) == ("f32[16,4]", "reduce-scatter", "f32[1,4]")
np.testing.assert_array_equal(gathered, X)  # the same values, whole columns on every device
np.testing.assert_allclose(scattered, X.reshape(4, 4, 8).sum(axis=0), rtol=RTOL)

draw_shardings({"1: x": x, "2: all_gather over data": gathered, "3: psum_scatter over data": scattered})

# %% [markdown]
# `psum_scatter` hands every backend's compiler a reduce-scatter (`lower(x).as_text()` shows it), and the
# CPU compiler keeps it. Ask the compiler for the same sum instead, `a.sum(0)` with `out_shardings=P('data',
# 'model')`, and on the CPU backend it writes an all-reduce of the whole `(4, 4)` sum, of which each
# device then keeps one row (a `dynamic-slice`). In `shard_map` you choose the collective:

# %%
x3 = jax.device_put(X.reshape(4, 4, 8), NamedSharding(mesh, P("data", None, "model")))
by_compiler = jax.jit(lambda a: a.sum(axis=0), out_shardings=NamedSharding(mesh, P("data", "model")))
compiled = by_compiler.lower(x3).compile()
print(collectives(compiled))
np.testing.assert_allclose(compiled(x3), scattered, rtol=RTOL)
if CPU:
    (op,) = collectives(compiled).ops
    assert (op.kind, op.result_type) == ("all-reduce", "f32[4,4]")  # the whole sum on every device
    assert re.search(r"f32\[1,4\]\S* dynamic-slice\(", compiled.as_text())  # then each keeps its row

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
#
# ## 6. Manual over one axis only: `axis_names=`
#
# `axis_names={'data'}` makes only `data` Manual; `model` stays Auto, and the compiler handles it as in
# notebook 04. Compute the column sums of `x @ w` with `w` split by columns over `model`, writing only the
# sum over `data`. Fully manual, `in_specs=P()` for `w` means "the whole `w` on every device", so the
# compiler first gathers it; partly manual, `w` stays split and the compiler keeps each device to its
# columns:

# %%
W = np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 100
w = jax.device_put(W, NamedSharding(mesh, P(None, "model")))


inside = {}


def sums_of_product(xb, wb):
    inside["axis types"], inside["w"] = jax.sharding.get_abstract_mesh().axis_types, wb.shape
    return jax.lax.psum((xb @ wb).sum(axis=0), "data")


specs = dict(mesh=mesh, in_specs=(P("data", None), P()), out_specs=P())
full = jax.shard_map(sums_of_product, **specs)
full_c = program(full, x_rows, w)
partial = jax.shard_map(sums_of_product, **specs, axis_names={"data"})
partial_c = program(partial, x_rows, w)
print("all axes manual:\n", collectives(full_c), "\n\nonly data manual:", inside, "\n", collectives(partial_c), sep="")
assert inside == {"axis types": (AxisType.Manual, AxisType.Auto), "w": (8, 16)}
assert "all-gather" in collectives(full_c).kinds  # the whole w, gathered for in_specs=P()
np.testing.assert_allclose(partial_c(x_rows, w), (X @ W).sum(axis=0), rtol=RTOL)
np.testing.assert_allclose(full_c(x_rows, w), (X @ W).sum(axis=0), rtol=RTOL)
if CPU:
    assert [(op.kind, op.result_type) for op in collectives(partial_c).ops] == [("all-reduce", "f32[8]")]

# %% [markdown]
# Inside, the axis types are `(Manual, Auto)`, and `w` looks whole, `(8, 16)`: over an Auto axis your code
# sees the global view. The compiled program keeps `w` split: on the CPU backend its only collective is
# your `psum`, of 8 floats, half the columns.
#
# ## 7. On an Explicit mesh, `in_specs` is a check
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
np.testing.assert_allclose(sums_e, X.sum(axis=0), rtol=RTOL)

on_auto = collectives(program(jax.shard_map(double, mesh=mesh, in_specs=P(), out_specs=P()), x_rows))
print("the same in_specs=P() on the Auto mesh:\n", on_auto, sep="")
(op,) = on_auto.ops
assert op.kind == "all-gather" and np.prod(op.shapes[0]) == X.size  # the whole array
if CPU:  # the CPU compiler's type (the TPU's: f32[4,4,8])
    assert op.result_type == "f32[16,8]"

# %% [markdown]
# ## 8. The `check_vma` replication check
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
# The fix is the spelling used throughout this notebook: `jax.shard_map(f, mesh=mesh, in_specs=...,
# out_specs=...)`, with the mesh as a keyword (or from `jax.set_mesh`), and `check_vma` where the old
# function said `check_rep`.

# %% [markdown]
# ## 9. Gradients through `shard_map`
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
# large. With `check_vma=False` nothing is cast, so nothing is summed: each device keeps its own
# gradient, `psum` transposes to another `psum`, and `out_specs=P()` hands back the first device's
# answer, as if its 2 rows were the batch. `pmap` runs without the check, which is why its habit of
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
np.testing.assert_allclose(compiled(xg), Xg.sum(axis=0), rtol=RTOL, atol=1e-5)
assert not hasattr(jax.lax, "pvary")  # the older spelling, seen online, is gone: use pcast

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
from exercises import ex06_shard_map as ex


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
# ## Takeaways
# - `jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)` runs `f` on each device's block; inside, the
#   axes are Manual and `{V:data}` marks values that differ across `data`.
# - Each collective is one line and one op in the compiled program: `psum` → all-reduce, `all_gather` →
#   all-gather, `psum_scatter` → reduce-scatter (kept by the CPU compiler, whose own reduce-scatter is
#   an all-reduce and a slice), `all_to_all` → all-to-all, `ppermute` →
#   collective-permute; `axis_index` needs none.
# - `axis_names={'data'}` goes manual over `data` only and leaves `model` to the compiler.
# - On an Auto mesh `in_specs` reshards the input; on an Explicit mesh it must match the input's type.
# - Keep `check_vma=True`: it refuses an `out_specs` that claims replication it cannot prove, where
#   `check_vma=False` returns one device's partial result. Use `jax.shard_map`, not
#   `jax.experimental.shard_map`.
# - With the check on, the gradient of an invariant input arrives summed over the devices: differentiate
#   the loss the program computes (`pmean` inside), do not average gradients again as `pmap` code does.
#   `jax.lax.pcast(..., to='varying')` casts an invariant value, such as a `scan` carry, by hand.
#
# **Next:** [07 · Data parallelism](07_data_parallel.ipynb)
