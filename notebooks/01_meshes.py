# %% [markdown]
# # 01 · Device meshes
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/01_meshes.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/01_meshes.ipynb)
#
# A sharding must say which device gets which block without naming device numbers. The same 8 devices
# can form a row of 8, a `(4, 2)` grid that gives a `(128, 512)` array `(32, 256)` blocks, or a
# `(2, 2, 2)` cube that keeps 2 copies of each block.
#
# **You need:** notebook 00 (a sharded array read as its type, shard table and picture), plus `jax.numpy`
# and `jax.jit` on one device.
#
# The answer is the **mesh**: the devices arranged as a grid with named axes such as `data` and `model`.
# Every sharding in JAX is written against one, by axis names, never by device numbers.
#
# **You will learn**
# - how a mesh names the devices: `mesh.shape`, `mesh.axis_names`, `mesh.devices`, each device's
#   coordinates, and which devices take part in a collective over an axis
# - the Auto, Explicit and Manual axis types, and that `jax.make_mesh` defaults to Explicit while
#   `Mesh(...)` defaults to Auto
# - what the order of devices in a mesh changes (which links a collective uses) and what it does not
#   (the results), and which board layout JAX's TPU order assumes
# - `jax.set_mesh`, as a context manager and as a global setting, and what replaced `with mesh:`
# - which mesh shapes 8 devices allow.

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
import inspect
import warnings
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils, topologies
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import NOT_ANSWERED, collectives, draw_mesh, draw_shardings, quiet, tpu_compiler_available, type_string

# %% [markdown]
# ## 1. A mesh is a grid of devices with named axes
#
# A mesh moves no data. It says how to see the devices: as a grid, each axis with a name. Shardings refer
# to those names (`P('data')`: "split over the `data` axis"), never to device numbers.
# `jax.make_mesh(shape, names, axis_types=...)` builds one, and section 2 explains `axis_types`.
#
# Eight devices in a row on one axis, `data`, is the layout of pure data parallelism. The same devices
# as a `(4, 2)` grid give two axes: `data` runs down (4 positions), `model` across (2 positions).
# `mesh.devices` is a numpy array of devices of that shape, so a device's coordinates are its index in
# it: `mesh.devices[1, 0]` is the device at `data=1, model=0`. On 8 devices every shape takes them in one
# sequence and fills the grid row by row. On CPU the sequence is id order, but on a TPU board it is not
# (section 3), so the checks below read the ids off the mesh.

# %%
mesh_1d = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
mesh_2d = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
for m in (mesh_1d, mesh_2d):
    print(m, "\n  shape:", dict(m.shape), " devices.shape:", m.devices.shape, " ids:", m.device_ids.tolist())
print("device at data=1, model=0:", mesh_2d.devices[1, 0])

order = mesh_1d.devices.ravel().tolist()  # the order make_mesh chose on this machine (section 3)
assert sorted(d.id for d in order) == sorted(d.id for d in jax.devices()[:8])  # 8 devices, each once
assert mesh_2d.devices.ravel().tolist() == order  # the same sequence, filled row by row
assert mesh_2d.devices[1, 0] == order[2]  # row 1, column 0: the third device
draw_mesh(mesh_2d)

# %% [markdown]
# Each axis groups the devices. The devices that share a `data` coordinate and differ only in `model`
# form a **row**. An operation "over `model`" (a sum across the `model` shards, an all-gather of a
# `model`-split weight) happens inside each row, the four rows at once. A collective over `data`
# happens inside each **column**. Read the groups off `device_ids`:

# %%
model_groups = mesh_2d.device_ids.tolist()    # rows: same data coordinate, model varies
data_groups = mesh_2d.device_ids.T.tolist()   # columns: same model coordinate, data varies
print("groups over 'model':", model_groups)
print("groups over 'data': ", data_groups)
ids = [d.id for d in order]
assert model_groups == [ids[0:2], ids[2:4], ids[4:6], ids[6:8]]  # consecutive pairs
assert data_groups == [ids[0::2], ids[1::2]]  # every second device

# %% [markdown]
# **Three axes.** `(2, 2, 2)` adds a `pipeline` axis. The picture has one panel per `data` position,
# and inside each, `model` runs down and `pipeline` across.

# %%
mesh_3d = jax.make_mesh((2, 2, 2), ("data", "model", "pipeline"), axis_types=(AxisType.Explicit,) * 3)
print(mesh_3d)
print("device at data=1, model=0, pipeline=1:", mesh_3d.devices[1, 0, 1])
assert mesh_3d.devices.ravel().tolist() == order and mesh_3d.devices[1, 0, 1] == order[5]  # 1*4 + 0*2 + 1
draw_mesh(mesh_3d)

# %% [markdown]
# ## 2. Auto, Explicit and Manual axes
#
# Every mesh axis has a **type**. It decides who lays out the values *inside* `jax.jit`:
#
# | axis type | who decides the layout of values inside `jit` | taught in |
# |---|---|---|
# | `Auto` | the compiler, propagating from the inputs and your hints | notebooks 04 and 05 |
# | `Explicit` | JAX while tracing: the layout is part of the value's **type** | notebook 05 |
# | `Manual` | you: inside `jax.shard_map` your function sees one device's block | notebook 06 |
#
# You choose Auto or Explicit when you build a mesh, while `jax.shard_map` makes axes Manual inside it.
# Notebook 05 compares Auto and Explicit and says when to use which.

# %% [markdown]
# > **You will see this online:**
# > ```python
# > mesh = Mesh(mesh_utils.create_device_mesh((4, 2)), axis_names=("data", "model"))
# > mesh = jax.make_mesh((4, 2), ("data", "model"))   # "the same, shorter"
# > ```
# > They are not the same: `Mesh(...)` makes Auto axes, `jax.make_mesh` makes Explicit axes unless
# > told otherwise.

# %%
classic = Mesh(mesh_utils.create_device_mesh((4, 2)), axis_names=("data", "model"))
shorter = jax.make_mesh((4, 2), ("data", "model"))  # axis_types left out on purpose
print("Mesh(create_device_mesh(...)):", classic)
print("jax.make_mesh(...):           ", shorter)
assert classic.device_ids.tolist() == shorter.device_ids.tolist()  # same devices, same order, same names
assert classic.axis_types == (AxisType.Auto, AxisType.Auto)
assert shorter.axis_types == (AxisType.Explicit, AxisType.Explicit)
assert classic != shorter

# %% [markdown]
# The fix: always say which you want, with `axis_types`. The same `(16, 8)` array, rows split over
# `data`, on each mesh: the blocks are the same, but only on Explicit axes does the type carry the layout
# (`type_string`, from the course's `utils`, writes the course's notation for both).

# %%
amesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
emesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
x = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
xa = jax.device_put(x, NamedSharding(amesh, P("data", None)))
xe = jax.device_put(x, NamedSharding(emesh, P("data", None)))
print("Auto:     jax.typeof =", jax.typeof(xa), "  type_string =", type_string(xa))
print("Explicit: jax.typeof =", jax.typeof(xe), "  type_string =", type_string(xe))
assert xa.sharding.shard_shape(x.shape) == xe.sharding.shard_shape(x.shape) == (4, 8)
assert (str(jax.typeof(xa)), str(jax.typeof(xe))) == ("float32[16,8]", "float32[16@data,8]")

# %% [markdown]
# This course uses both, on purpose. Notebooks 00 to 03 place and read layouts on **Explicit** meshes,
# where the type shows them. From notebook 04 on, the compute notebooks mostly use **Auto** meshes,
# because they are about what the compiler decides. Notebooks 05, 06 and 14 use Explicit ones too. Every mesh
# passes `axis_types`.
#
# ## 3. Device order: which device sits where (optional on a first reading)
#
# On CPU, `jax.make_mesh` fills the grid in id order, last axis fastest. On a real machine
# some devices are linked directly (chips on one board, GPUs in one NVLink domain) and others only through
# more hops. A collective over an axis runs among the devices along it, so the axis should line up
# devices that are physically close. On TPU slices `jax.make_mesh` (through `create_device_mesh`) reads
# each chip's position on the board and chooses the order for you.
#
# You can watch that without a TPU: `create_device_mesh` reads only a few attributes of each device, so
# eight stand-ins with a TPU v5e's name and board coordinates are enough. To judge an order, count the links
# between neighbours along a 1-D axis (the last wraps to the first, as in a ring all-reduce), taking a
# link to join chips next to each other on the grid. That count is a model of the wiring, not a
# measurement.
#
# JAX's rule for eight v5e chips is a fixed ring order, `[0, 1, 2, 3, 7, 6, 5, 4]` in the chips' sorted
# order. It is written for a tray of 4 × 2 chips numbered row by row, `id = x + 4y`, so the first cell
# builds that tray:

# %%
@dataclass(frozen=True)
class StandInTpu:
    """What create_device_mesh reads from a TPU device: id, platform, kind and position on the board."""

    id: int
    coords: tuple[int, int, int]
    core_on_chip: int = 0
    platform: str = "tpu"
    device_kind: str = "TPU v5 lite"  # how JAX names a TPU v5e chip


def links(order, position):
    """Grid links crossed between each device and the next along the axis (the last wraps to the first)."""
    return [abs(position[a][0] - position[b][0]) + abs(position[a][1] - position[b][1])
            for a, b in zip(order, order[1:] + order[:1], strict=True)]


tray = [StandInTpu(id=x + 4 * y, coords=(x, y, 0)) for y in range(2) for x in range(4)]
tray_position = {d.id: d.coords[:2] for d in tray}
tpu_order = [d.id for d in mesh_utils.create_device_mesh((8,), devices=tray)]
print("4 × 2 tray, id order: ", list(range(8)), "links per step:", links(list(range(8)), tray_position))
print("4 × 2 tray, JAX order:", tpu_order, "links per step:", links(tpu_order, tray_position))
assert tpu_order == [0, 1, 2, 3, 7, 6, 5, 4]
assert links(list(range(8)), tray_position) == [1, 1, 1, 4, 1, 1, 1, 4]  # crosses the tray twice
assert links(tpu_order, tray_position) == [1] * 8  # one link per step: a ring around the tray

# %% [markdown]
# On that tray, id order crosses the whole board twice (4 links, twice), and JAX's order is one link per
# step. But the order is JAX's **assumption** about the board, not a reading of it. libtpu's own
# description of a v5e-8 (`v5e:2x4`, the one notebook 04 compiles for) places the chips differently: on a
# 2 × 4 grid, numbered `id = x + 2y`. The next cell reads those coordinates where libtpu is installed and
# counts again. JAX gives the real description the same order, but on that grid the order alternates 1 and 2
# links, and id order has one 4-link jump instead of two. JAX's order is still the better ring there
# (a total of 12 links against 14), just not a perfect one. Which grid the physical wiring follows, the
# coordinates alone do not say.

# %%
ok, why = tpu_compiler_available()
if ok:  # libtpu describes a real v5e-8 (notebook 04)
    with quiet():
        real = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices
    real_position = {d.id: tuple(d.coords[:2]) for d in real}
    real_order = [d.id for d in jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,), devices=real).devices]
    print("libtpu coordinates (x, y):", real_position)
    print("libtpu grid, id order: ", list(range(8)), "links per step:", links(list(range(8)), real_position))
    print("libtpu grid, JAX order:", real_order, "links per step:", links(real_order, real_position))
    assert real_order == tpu_order  # the same fixed order ...
    assert real_position == {i: (i % 2, i // 2) for i in range(8)}  # ... on a 2 × 4 grid, id = x + 2y
    assert links(real_order, real_position) == [1, 2] * 4  # not one link per step
    assert links(list(range(8)), real_position) == [1, 2, 1, 2, 1, 2, 1, 4]
    assert sum(links(real_order, real_position)) < sum(links(list(range(8)), real_position))
else:
    print(why)

# %% [markdown]
# Either way the order changes which device holds which block, and only that. `Mesh` takes any device
# array, so build both orders from this machine's devices and place the same `(128, 512)` array, rows
# split over `data`, on both meshes. Rows 64:80 now live on device 7 instead of device 4:

# %%
by_id = {d.id: d for d in jax.devices()}
id_mesh = Mesh(np.array([by_id[i] for i in range(8)]), ("data",), axis_types=(AxisType.Auto,))
tpu_mesh = Mesh(np.array([by_id[i] for i in tpu_order]), ("data",), axis_types=(AxisType.Auto,))
big = jnp.arange(128 * 512, dtype=jnp.float32).reshape(128, 512)
b_id = jax.device_put(big, NamedSharding(id_mesh, P("data")))
b_tpu = jax.device_put(big, NamedSharding(tpu_mesh, P("data")))


def holder_of_rows(arr):
    """First row of each block -> id of the device that holds it."""
    return {s.index[0].start: s.device.id for s in sorted(arr.addressable_shards, key=lambda s: s.index[0].start)}


print("rows start -> device, id order: ", holder_of_rows(b_id))
print("rows start -> device, TPU order:", holder_of_rows(b_tpu))
assert holder_of_rows(b_id)[64] == 4 and holder_of_rows(b_tpu)[64] == 7
assert list(holder_of_rows(b_tpu).values()) == tpu_order
draw_shardings({"id_mesh": b_id, "tpu_mesh": b_tpu}, ncols=2, show_bytes=False)

# %% [markdown]
# The computation does not change. Sum the columns on both meshes. This is a sum over the split
# dimension, so the compiler inserts an all-reduce over `data`. The two compiled programs are the same
# text, and the results are equal: only which device runs which position of the program differs.

# %%
col_sum = jax.jit(lambda a: jnp.sum(a, axis=0))
compiled_id = col_sum.lower(b_id).compile()
compiled_tpu = col_sum.lower(b_tpu).compile()
print(collectives(compiled_id))
found = collectives(compiled_id)
assert found.count("all-reduce") == found.count() == 1 and found.ops[0].group_size == 8
assert compiled_id.as_text() == compiled_tpu.as_text()  # the very same per-device program
np.testing.assert_array_equal(compiled_id(b_id), compiled_tpu(b_tpu))
np.testing.assert_array_equal(compiled_id(b_id), np.asarray(big).sum(axis=0))

# %% [markdown]
# ## 4. The current mesh: `jax.set_mesh`
#
# A `NamedSharding` names its mesh, but a bare `P('data')` does not, so JAX needs to know which mesh you
# mean. `jax.set_mesh(mesh)` sets the current mesh, in two forms:
#
# | form | holds for | ends when |
# |---|---|---|
# | `with jax.set_mesh(mesh):` | a block | the block ends (the previous mesh is back) |
# | `jax.set_mesh(mesh)` alone | the rest of the program (a script's or notebook's top) | `jax.set_mesh(None)` clears it |
#
# Under a current mesh a bare spec works wherever a sharding is expected (`jax.device_put`,
# `with_sharding_constraint`, `jax.reshard`, `jit`'s shardings). Without one, JAX refuses:

# %%
steps = []
try:
    jax.device_put(x, P("data"))
except ValueError as err:
    steps.append("no mesh: ValueError")
    print("no mesh:", err)

with jax.set_mesh(emesh):
    in_block = jax.device_put(x, P("data"))
steps.append("block over" if jax.sharding.get_abstract_mesh().empty else "still set")

jax.set_mesh(emesh)  # global: stays until cleared
global_y = jax.device_put(x, P("data"))
steps.append("global set" if not jax.sharding.get_abstract_mesh().empty else "not set")
jax.set_mesh(None)
steps.append("cleared" if jax.sharding.get_abstract_mesh().empty else "still set")

print("in the block:", jax.typeof(in_block), "| with the global mesh:", jax.typeof(global_y))
print(steps)
assert steps == ["no mesh: ValueError", "block over", "global set", "cleared"]
assert in_block.sharding.is_equivalent_to(NamedSharding(emesh, P("data", None)), 2)
assert global_y.sharding.is_equivalent_to(in_block.sharding, 2)

# %% [markdown]
# > **You will see this online:**
# > ```python
# > with mesh:                          # older code
# >     ...
# > with jax.sharding.use_mesh(mesh):   # code from early 2025
# >     ...
# > ```
# > `jax.sharding.use_mesh` is gone. `with mesh:` still runs, but warns, and does not set the
# > current mesh that `jax.device_put` looks for when you give it a bare `P`:

# %%
outcomes = []
try:
    jax.sharding.use_mesh(emesh)
except AttributeError as err:
    outcomes.append("use_mesh removed")
    print("AttributeError:", err)

still_there = hasattr(emesh, "__enter__")  # deprecated: a later JAX may drop `with mesh:` altogether
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if still_there:
        with emesh:
            try:
                jax.device_put(x, P("data"))
            except ValueError as err:
                outcomes.append("with mesh: no current mesh")
                print("under `with mesh:`, device_put(x, P('data')) -> ValueError:", err)
for w in caught:
    print(f"{w.category.__name__}: {w.message}")
assert outcomes == ["use_mesh removed"] + ["with mesh: no current mesh"] * still_there
assert [w.category for w in caught] == [DeprecationWarning] * still_there

# %% [markdown]
# The fix for both: `with jax.set_mesh(mesh):`, as above.
#
# ## 5. Mesh shapes for 8 devices
#
# Any shape whose sizes multiply to 8 uses every device once. The shape decides how finely each axis can
# split an array: place a `(128, 512)` array on each with `P('data', 'model')`. On `(2, 2, 2)` the spec
# does not name `pipeline`, so each block sits on the 2 devices that differ only in `pipeline`: 2 copies.

# %%
shapes = {(8, 1): ("data", "model"), (4, 2): ("data", "model"), (2, 4): ("data", "model"),
          (2, 2, 2): ("data", "model", "pipeline")}
expected = {(8, 1): ((16, 512), 1), (4, 2): ((32, 256), 1), (2, 4): ((64, 128), 1), (2, 2, 2): ((64, 256), 2)}

print(f"{'mesh shape':<12}{'block of (128, 512)':<22}{'copies':>6}")
for shape, names in shapes.items():
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
    sharding = NamedSharding(mesh, P("data", "model"))
    block = sharding.shard_shape((128, 512))
    placed = jax.device_put(np.zeros((128, 512), np.float32), sharding)
    copies = 1 + max(s.replica_id for s in placed.addressable_shards)  # JAX numbers each block's copies 0, 1, ...
    print(f"{shape!s:<12}{block!s:<22}{copies:>6}")
    assert (block, copies) == expected[shape]

# %% [markdown]
# **A shape that does not fit.** With `n` devices, `(n, 2)` needs `2n`, and `jax.make_mesh` refuses. A
# shape that needs *fewer* devices is accepted without a word: `(3, 2)` takes the first 6, and the others
# hold nothing of any array sharded on it. `create_device_mesh` is stricter and wants all the devices.

# %%
raised = []
try:
    jax.make_mesh((jax.device_count(), 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
except ValueError as err:
    raised.append("(n, 2)")
    print(f"jax.make_mesh(({jax.device_count()}, 2), ...) -> ValueError:", err)

small = jax.make_mesh((3, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
print("jax.make_mesh((3, 2), ...) ->", small, "on devices", small.device_ids.ravel().tolist())
assert NamedSharding(small, P("data", "model")).device_set == set(jax.devices()[:6])

try:
    mesh_utils.create_device_mesh((3, 2))
except ValueError as err:
    raised.append("(3, 2)")
    print("create_device_mesh((3, 2)) -> ValueError:", err)
assert raised == ["(n, 2)", "(3, 2)"]

# %% [markdown]
# > **You will see this online: `axis_shapes`.** Every mesh above passes its shape positionally, and
# > here is why. Older snippets name it:
# > ```python
# > mesh = jax.make_mesh(axis_shapes=(4, 2), axis_names=("data", "model"))
# > ```
# > The first parameter of `jax.make_mesh` was renamed from `axis_shapes` to `axis_sizes` between JAX
# > 0.10 and 0.12, so each keyword fails on the other line. Both spellings, on this line:

# %%
spellings = {}
for keyword in ("axis_shapes", "axis_sizes"):
    try:
        jax.make_mesh(**{keyword: (4, 2)}, axis_names=("data", "model"), axis_types=(AxisType.Explicit,) * 2)
        spellings[keyword] = "works"
    except TypeError as err:
        spellings[keyword] = f"TypeError: {err}"
    print(f"jax {jax.__version__}, {keyword}=(4, 2): {spellings[keyword]}")

first_parameter = next(iter(inspect.signature(jax.make_mesh).parameters))
assert spellings[first_parameter] == "works"
assert sum(outcome == "works" for outcome in spellings.values()) == 1  # the other keyword is a TypeError

# %% [markdown]
# So the course passes the shape **positionally**, as every cell above does:
# `jax.make_mesh((4, 2), ("data", "model"), axis_types=...)` works on every version, because it names no
# keyword.

# %% [markdown]
# ## Takeaways
# - A mesh is the devices as a named grid: `mesh.shape`, `mesh.axis_names`, and `mesh.devices`, whose
#   index is each device's coordinates. Shardings name axes, never devices. Pass the shape positionally.
# - A collective over an axis runs among the devices along it, so device order decides which links it
#   uses. On 8 TPU v5e chips `jax.make_mesh` uses a fixed ring order that assumes a 4 × 2 tray (one link
#   per step there, but 1 and 2 links in turn on libtpu's 2 × 4 description). Reordering moves blocks,
#   never results.
# - `jax.make_mesh` gives **Explicit** axes by default, `Mesh(...)` gives **Auto**: always pass
#   `axis_types`. On Explicit axes the layout is in the type (`float32[16@data,8]`). Notebook 05 says when
#   to use which, and notebook 06 covers the Manual axes of `jax.shard_map`.
# - `jax.set_mesh(mesh)` (a block, or global until `jax.set_mesh(None)`) makes bare `P(...)` work.
#   `with mesh:` is deprecated and `jax.sharding.use_mesh` removed.
# - A mesh may not need more devices than exist, and `jax.make_mesh` silently uses only the first devices
#   of a smaller shape.


# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** Which device sits at `data=2, model=1` of the `(4, 2)` mesh
# `jax.make_mesh((4, 2), ('data', 'model'), ...)` on this machine? Work it out from the picture in
# section 1 before you look at `mesh_2d.devices`.

# %%
from spmd_course.exercises import ex01_meshes as ex

answer_1 = NOT_ANSWERED  # a device id (a whole number), or the device itself
ex.device_at.check(answer_1);

# %% [markdown]
# **Exercise 2.** Build a `(2, 4)` mesh of all 8 devices with axes `('data', 'model')` whose axis types
# are Auto. The checker inspects the mesh you pass.

# %%
answer_2 = NOT_ANSWERED  # a Mesh, e.g. jax.make_mesh(...)
ex.auto_mesh.check(answer_2);

# %% [markdown]
# **Exercise 3.** On `jax.make_mesh((2, 4), ('data', 'model'), ...)` on this machine, which devices take
# part, with device 5, in a collective over `model` (for example an all-gather of a weight split over
# `model`)? Give all of them, device 5 included.

# %%
answer_3 = NOT_ANSWERED  # a set of device ids, e.g. {0, 1}
ex.model_group.check(answer_3);

# %% [markdown]
# **Next:** [02 · PartitionSpec](02_partitionspec.ipynb)
