# %% [markdown]
# # 01 · Device meshes
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/01_meshes.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/01_meshes.ipynb)
#
# Every sharding in JAX is written against a **mesh**: the devices arranged as a grid whose axes have
# names such as `data` and `model`. This notebook builds meshes of 1, 2 and 3 axes, shows the two ways
# to build one and why they behave differently (Auto or Explicit axes), looks at which device sits
# where and why that matters on real hardware, and runs the guide that seeded this course against
# today's JAX, fixing what no longer works.
#
# **You will learn**
# - how a mesh names the devices: `mesh.shape`, `mesh.axis_names`, `mesh.devices`, and the coordinates
#   of each device;
# - the difference between `jax.make_mesh` (Explicit axes by default) and `Mesh(create_device_mesh(...))`
#   (Auto axes), and what each axis type changes: the type `f32[16@data,8]`, `with_sharding_constraint`;
# - what the order of devices in a mesh means: which devices talk in a collective, and how a TPU's
#   layout changes that order while your results stay the same;
# - how to make a mesh the current one with `jax.set_mesh`, and what the old `with mesh:` no longer does;
# - which mesh shapes 8 devices allow, and what happens when a shape does not fit.

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

# %%
import warnings
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import (
    NOT_ANSWERED,
    collectives,
    device_color,
    draw_mesh,
    draw_shardings,
    mesh_labels,
    tile_labels,
    tiles,
    type_string,
)

# %% [markdown]
# ## 1. A mesh is a grid of devices with named axes
#
# A mesh does not move any data. It only says how to think of the devices: as a grid of some shape,
# each axis with a name. Shardings later refer to those names (`P('data')` means "split over the
# `data` axis"), never to device numbers.
#
# **One axis.** All 8 devices in a row, on an axis called `data`: the layout of pure data parallelism.
# (`axis_types` is always passed on purpose in this course; section 2 says why.)

# %%
mesh_1d = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
print(mesh_1d)
print("mesh.shape:        ", dict(mesh_1d.shape))
print("mesh.axis_names:   ", mesh_1d.axis_names)
print("mesh.devices.shape:", mesh_1d.devices.shape)
print("device ids:        ", mesh_1d.device_ids.tolist())

assert dict(mesh_1d.shape) == {"data": 8}
assert mesh_1d.axis_names == ("data",)
assert mesh_1d.devices.shape == (8,)
assert mesh_1d.device_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
fig = draw_mesh(mesh_1d)
assert mesh_labels(fig) == [[list(range(8))]]  # what the picture shows: one row of ids
fig

# %% [markdown]
# **Two axes.** The same 8 devices as a `(4, 2)` grid: `data` runs down (4 positions), `model` runs
# across (2 positions). `mesh.devices` is a numpy array of devices of that shape, so a device's
# coordinates are its index in it: `mesh.devices[1, 0]` is the device at `data=1, model=0`.

# %%
mesh_2d = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
print(mesh_2d)
print("mesh.shape:        ", dict(mesh_2d.shape))
print("mesh.devices.shape:", mesh_2d.devices.shape)
print("device ids:\n", mesh_2d.device_ids)
print("device at data=1, model=0:", mesh_2d.devices[1, 0])

assert dict(mesh_2d.shape) == {"data": 4, "model": 2}
assert mesh_2d.axis_names == ("data", "model")
assert mesh_2d.devices.shape == (4, 2) and mesh_2d.size == 8
assert mesh_2d.device_ids.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
assert mesh_2d.devices[1, 0].id == 2
fig = draw_mesh(mesh_2d)
assert mesh_labels(fig) == [mesh_2d.device_ids.tolist()]  # the picture is mesh.devices, cell by cell
fig

# %% [markdown]
# Each axis groups the devices. The devices that share a `data` coordinate and differ only in `model`
# form a **row**; an operation "over `model`" (a sum across the `model` shards, an all-gather of a
# `model`-split weight) happens inside each row, the four rows at the same time. Likewise, a
# collective over `data` happens inside each **column**. Read the groups straight off `device_ids`:

# %%
model_groups = mesh_2d.device_ids.tolist()    # rows: same data coordinate, model varies
data_groups = mesh_2d.device_ids.T.tolist()   # columns: same model coordinate, data varies
print("groups over 'model':", model_groups)
print("groups over 'data': ", data_groups)
assert model_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
assert data_groups == [[0, 2, 4, 6], [1, 3, 5, 7]]

# %% [markdown]
# **Three axes.** `(2, 2, 2)` with a third axis, `pipeline`. The picture shows one panel per `data`
# position; inside each, `model` runs down and `pipeline` across.

# %%
mesh_3d = jax.make_mesh((2, 2, 2), ("data", "model", "pipeline"), axis_types=(AxisType.Explicit,) * 3)
print(mesh_3d)
print("device ids:\n", mesh_3d.device_ids)
print("device at data=1, model=0, pipeline=1:", mesh_3d.devices[1, 0, 1])

assert dict(mesh_3d.shape) == {"data": 2, "model": 2, "pipeline": 2}
assert mesh_3d.axis_names == ("data", "model", "pipeline")
assert mesh_3d.devices.shape == (2, 2, 2)
assert mesh_3d.device_ids.tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
assert mesh_3d.devices[1, 0, 1].id == 5
fig = draw_mesh(mesh_3d)
assert mesh_labels(fig) == mesh_3d.device_ids.tolist()  # one grid per data position
fig

# %% [markdown]
# ### Gotcha: the seed's three meshes share one device array
#
# The guide that seeded this course writes its 1-D, 2-D and 3-D meshes as
# `Mesh(devices, axis_names=('data',))`, `Mesh(devices, axis_names=('data', 'model'))` and
# `Mesh(devices, axis_names=('data', 'model', 'pipeline'))`, with shapes `(8,)`, `(4, 2)` and `(2, 2, 2)`
# in the comments, after building `devices` once as a `(4, 2)` array. `Mesh` takes its shape from the
# device array, and it needs one name per dimension of that array, so two of the three fail:

# %%
devices = mesh_utils.create_device_mesh((4, 2))  # the seed's device array
raised = []
for names in [("data",), ("data", "model"), ("data", "model", "pipeline")]:
    try:
        m = Mesh(devices, axis_names=names)
        print(f"{names}: {m}")
    except ValueError as err:
        raised.append(len(names))
        print(f"{names}: ValueError: {err}")
assert raised == [1, 3]

# %% [markdown]
# The fix: build the device array in the shape you want (`create_device_mesh((8,))`,
# `create_device_mesh((2, 2, 2))`), or let `jax.make_mesh` build both at once, as above.

# %%
fixed = [Mesh(mesh_utils.create_device_mesh((8,)), axis_names=("data",)),
         Mesh(mesh_utils.create_device_mesh((2, 2, 2)), axis_names=("data", "model", "pipeline"))]
for m in fixed:
    print(m)
assert [m.devices.shape for m in fixed] == [(8,), (2, 2, 2)]

# %% [markdown]
# ## 2. Two ways to build a mesh, and the axis types they give
#
# The seed builds its `(4, 2)` mesh in two steps: `mesh_utils.create_device_mesh` picks an order for the
# devices, and `Mesh(devices, axis_names=...)` names the axes. Today's one-step call is `jax.make_mesh`.
# Build both, leaving out `axis_types` in `jax.make_mesh` just this once, to see its default:

# %%
seed_devices = mesh_utils.create_device_mesh((4, 2))
seed_mesh = Mesh(seed_devices, axis_names=("data", "model"))
default_mesh = jax.make_mesh((4, 2), ("data", "model"))  # axis_types left out on purpose

print("Mesh(create_device_mesh(...)):", seed_mesh)
print("jax.make_mesh(...):           ", default_mesh)
assert seed_mesh.device_ids.tolist() == default_mesh.device_ids.tolist()  # same devices, same order
assert seed_mesh.axis_types == (AxisType.Auto, AxisType.Auto)
assert default_mesh.axis_types == (AxisType.Explicit, AxisType.Explicit)

# %% [markdown]
# Same devices, same order, same names; only the **axis types** differ. They decide who is in charge
# of shardings inside `jax.jit`:
#
# | axis type | who decides the sharding of intermediate values | where you see it |
# |---|---|---|
# | `Auto` | the compiler: it propagates shardings from inputs (and your hints) through the program | only in the compiled program |
# | `Explicit` | the program: every value's sharding is part of its **type**, computed while tracing | `jax.typeof(x)`, at trace time |
#
# Code written for one often fails on the other, so this course always passes `axis_types`. Here are
# the two meshes with their types written out; they equal the two above:

# %%
amesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
emesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
assert amesh == seed_mesh and emesh == default_mesh
assert amesh != emesh  # same devices and names, different types: different meshes

# %% [markdown]
# **Shardings in types.** Put the same `(16, 8)` array on both meshes, rows split over `data`. The
# layouts are identical (each device holds a `(4, 8)` block), but only on the Explicit mesh does the
# array's type carry it: `jax.typeof` prints `float32[16@data,8]` there and plain `float32[16,8]` on the
# Auto mesh. The course's `type_string` writes the layout in the same notation for both.

# %%
x = jnp.arange(16 * 8, dtype=jnp.float32).reshape(16, 8)
xa = jax.device_put(x, NamedSharding(amesh, P("data", None)))
xe = jax.device_put(x, NamedSharding(emesh, P("data", None)))

print("Auto mesh:     jax.typeof =", jax.typeof(xa), "   type_string =", type_string(xa))
print("Explicit mesh: jax.typeof =", jax.typeof(xe), "   type_string =", type_string(xe))
assert xa.sharding.shard_shape(x.shape) == xe.sharding.shard_shape(x.shape) == (4, 8)
assert str(jax.typeof(xa)) == "float32[16,8]"
assert str(jax.typeof(xe)) == "float32[16@data,8]"
assert type_string(xa) == type_string(xe) == "f32[16@data,8]"

# %% [markdown]
# The difference shows inside `jax.jit` too. While JAX traces a function, the Explicit value's type
# already says how it is split; the Auto value's type does not, because the compiler will decide later:

# %%
traced = []


def double(a):
    traced.append(str(jax.typeof(a)))  # runs while jit traces, once per input type
    return 2 * a


ya = jax.jit(double)(xa)
ye = jax.jit(double)(xe)
print("types seen while tracing:", traced)
assert traced == ["float32[16,8]", "float32[16@data,8]"]
np.testing.assert_array_equal(ya, 2 * x)
np.testing.assert_array_equal(ye, 2 * x)

# %% [markdown]
# **One consequence: `with_sharding_constraint`.** On Auto axes, `jax.lax.with_sharding_constraint`
# is how you tell the compiler "this value should be split like this". On Explicit axes there is nothing
# to hint: the sharding is the type, and JAX rejects the constraint and names the API that changes a type,
# `jax.reshard`. Ask for the `(16, 8)` array to be split over `model` as well, both ways:

# %%
outcomes = []
za = jax.jit(lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(amesh, P("data", "model"))))(xa)
outcomes.append("Auto: constraint applied")
print("Auto mesh, with_sharding_constraint ->", type_string(za), "blocks", za.sharding.shard_shape(za.shape))

try:
    jax.jit(lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(emesh, P("data", "model"))))(xe)
except ValueError as err:
    outcomes.append("Explicit: constraint rejected")
    print("Explicit mesh, with_sharding_constraint -> ValueError:\n ", err)

ze = jax.jit(lambda a: jax.reshard(a, NamedSharding(emesh, P("data", "model"))))(xe)
outcomes.append("Explicit: reshard applied")
print("Explicit mesh, jax.reshard ->", jax.typeof(ze))

assert outcomes == ["Auto: constraint applied", "Explicit: constraint rejected", "Explicit: reshard applied"]
assert za.sharding.shard_shape(za.shape) == ze.sharding.shard_shape(ze.shape) == (4, 4)
assert str(jax.typeof(ze)) == "float32[16@data,8@model]"
np.testing.assert_array_equal(za, x)
np.testing.assert_array_equal(ze, x)

# %% [markdown]
# So the seed's `Mesh(...)` and a bare `jax.make_mesh(...)` look alike and are not interchangeable: code
# that hints shardings (the seed's `with_sharding_constraint` calls) needs Auto axes, and code that
# relies on sharded types needs Explicit ones. Decide which you want, and say so in `axis_types`.
#
# ## 3. Device order: which device sits where
#
# On CPU, both `jax.make_mesh` and `create_device_mesh` fill the grid with the devices in id order,
# last axis fastest:

# %%
print("jax.make_mesh((4, 2)):         ", amesh.device_ids.tolist())
print("create_device_mesh((4, 2)) ids:", [[d.id for d in row] for row in seed_devices])
assert amesh.device_ids.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
assert [[d.id for d in row] for row in seed_devices] == [[0, 1], [2, 3], [4, 5], [6, 7]]


# %% [markdown]
# **Why order matters on real hardware.** Section 1 showed that a collective over an axis runs among
# the devices along that axis. On a real machine some devices are linked directly (chips on one board,
# GPUs on one NVLink domain) and others only through more hops or a slower network. The axis that
# carries the heavy collectives (the weight gathers and reductions of `model`, for instance) should
# therefore line up devices that are physically close. On TPU slices `create_device_mesh`, and so
# `jax.make_mesh`, read each chip's position on the board and choose the order for you; elsewhere they
# keep the id order seen above.
#
# You can watch the TPU logic without a TPU. `create_device_mesh` reads only a few attributes of each
# device (its id, platform, kind, coordinates on the board, core number), so eight stand-in objects
# shaped like a TPU v5e board of 4 × 2 chips are enough:

# %%
@dataclass(frozen=True)
class StandInTpu:
    """What create_device_mesh reads from a TPU device: id, platform, kind and position on the board."""

    id: int
    coords: tuple[int, int, int]
    core_on_chip: int = 0
    platform: str = "tpu"
    device_kind: str = "TPU v5 lite"  # how JAX names a TPU v5e chip


board = [StandInTpu(id=x + 4 * y, coords=(x, y, 0)) for y in range(2) for x in range(4)]
tpu_order = [d.id for d in mesh_utils.create_device_mesh((8,), devices=board)]
print("create_device_mesh((8,)) on the v5e board:", tpu_order)
assert tpu_order == [0, 1, 2, 3, 7, 6, 5, 4]

# %% [markdown]
# The order is not 0 to 7. Count the links between neighbours along the axis (the last device wraps to
# the first, as in a ring all-reduce, which passes data from each device to the next): in id order two
# steps cross the whole board, four links each; in the chosen order every step is one link.

# %%
position = {d.id: d.coords[:2] for d in board}


def hops(order):
    """Links crossed between each device and the next along the axis (the last one wraps to the first)."""
    return [abs(position[a][0] - position[b][0]) + abs(position[a][1] - position[b][1])
            for a, b in zip(order, order[1:] + order[:1], strict=True)]


print("id order:  ", list(range(8)), "links per step:", hops(list(range(8))))
print("TPU order: ", tpu_order, "links per step:", hops(tpu_order))
assert hops(list(range(8))) == [1, 1, 1, 4, 1, 1, 1, 4]
assert hops(tpu_order) == [1] * 8

fig, axes = plt.subplots(1, 2, figsize=(8, 2.4))
for ax, (name, order) in zip(axes, [("id order", list(range(8))), ("create_device_mesh order", tpu_order)],
                             strict=True):
    for dev, (px, py) in position.items():
        ax.add_patch(plt.Rectangle((px - 0.3, py - 0.3), 0.6, 0.6, color=device_color(dev), alpha=0.8))
        ax.text(px, py, str(dev), ha="center", va="center", fontsize=10)
    for (a, b), n in zip(zip(order, order[1:] + order[:1], strict=True), hops(order), strict=True):
        style = dict(arrowstyle="->", shrinkA=11, shrinkB=11, lw=1.2, color="black" if n == 1 else "crimson",
                     connectionstyle=f"arc3,rad={0 if n == 1 else 0.15}")
        ax.annotate("", xy=position[b], xytext=position[a], arrowprops=style)
    ax.set_xlim(-0.5, 3.5)
    ax.set_ylim(1.5, -0.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"{name}: {sum(hops(order))} links per lap", fontsize=9)
fig.suptitle("A ring over a 1-D mesh of 8 chips on a 4 x 2 TPU board (red: steps of several links)", fontsize=10)
fig.tight_layout()
plt.close(fig)
fig

# %% [markdown]
# **Same program, other devices.** Nothing stops you from building a mesh in any order yourself:
# `Mesh` takes whatever device array you give it. Use the TPU order on the 8 CPU devices and put the
# same `(128, 512)` array, rows split over `data`, on both meshes. Block 4 of the rows (rows 64:80) now
# lives on device 7 instead of device 4:

# %%
cpu_devices = np.array(jax.devices())
id_mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
tpu_mesh = Mesh(cpu_devices[tpu_order], ("data",), axis_types=(AxisType.Auto,))
print("id order: ", id_mesh.device_ids.tolist())
print("TPU order:", tpu_mesh.device_ids.tolist())

big = jnp.arange(128 * 512, dtype=jnp.float32).reshape(128, 512)
b_id = jax.device_put(big, NamedSharding(id_mesh, P("data")))
b_tpu = jax.device_put(big, NamedSharding(tpu_mesh, P("data")))


def holder_of_rows(arr):
    """First row of each block -> id of the device that holds it, from arr.addressable_shards."""
    return {s.index[0].start: s.device.id for s in sorted(arr.addressable_shards, key=lambda s: s.index[0].start)}


print("rows start -> device, id order: ", holder_of_rows(b_id))
print("rows start -> device, TPU order:", holder_of_rows(b_tpu))
assert holder_of_rows(b_id)[64] == 4 and holder_of_rows(b_tpu)[64] == 7
assert list(holder_of_rows(b_tpu).values()) == tpu_order
fig = draw_shardings({"id_mesh": b_id, "tpu_mesh": b_tpu}, ncols=2, show_bytes=False)
labels = tile_labels(fig)  # panel by panel, top to bottom
assert labels[4] == "dev 4\n(16, 512)" and labels[8 + 4] == "dev 7\n(16, 512)"
fig

# %% [markdown]
# The computation does not change. Sum the columns (a sum over the split dimension, so the compiler
# inserts an all-reduce over `data`) on both meshes: the two compiled programs are the same text, with
# the same all-reduce, and the results are equal. What differs is only which device runs which position
# of the program, and that is the mesh's device order, carried along with the compiled program's input
# shardings.

# %%
col_sum = jax.jit(lambda a: jnp.sum(a, axis=0))
compiled_id = col_sum.lower(b_id).compile()
compiled_tpu = col_sum.lower(b_tpu).compile()
print(collectives(compiled_id))
print("devices by position, id order: ", compiled_id.input_shardings[0][0].mesh.device_ids.tolist())
print("devices by position, TPU order:", compiled_tpu.input_shardings[0][0].mesh.device_ids.tolist())
assert collectives(compiled_id).counts["all-reduce"] == 1 and collectives(compiled_id).ops[0].group_size == 8
assert compiled_id.as_text() == compiled_tpu.as_text()  # the very same per-device program
assert compiled_tpu.input_shardings[0][0].mesh.device_ids.tolist() == tpu_order
np.testing.assert_array_equal(compiled_id(b_id), compiled_tpu(b_tpu))
np.testing.assert_array_equal(compiled_id(b_id), np.asarray(big).sum(axis=0))

# %% [markdown]
# ## 4. The current mesh: `jax.set_mesh`
#
# A `NamedSharding` names its mesh. A bare `P('data')` does not, so JAX needs to know which mesh you
# mean. Without one it refuses:

# %%
raised = []
try:
    jax.device_put(x, P("data"))
except ValueError as err:
    raised.append("no mesh")
    print("ValueError:", err)
assert raised == ["no mesh"]

# %% [markdown]
# `with jax.set_mesh(mesh):` makes `mesh` the current mesh for the block: inside it a bare
# `PartitionSpec` is enough, and `jax.device_put(x, P('data'))` places `x` on that mesh. When the block
# ends, the previous (here: no) mesh is back.

# %%
with jax.set_mesh(amesh):
    current = jax.sharding.get_abstract_mesh()
    y = jax.device_put(x, P("data"))
print("inside the block, current mesh:", current)
print("y:", type_string(y), " sharding:", y.sharding)

assert current == amesh.abstract_mesh
assert y.sharding.mesh == amesh
assert y.sharding.is_equivalent_to(NamedSharding(amesh, P("data", None)), y.ndim)
assert jax.sharding.get_abstract_mesh().empty  # the block is over

# %% [markdown]
# ### Gotcha: the seed's `with mesh:`
#
# The seed enters its mesh with `with mesh:`. That still runs, but it warns, and it no longer sets the
# mesh that a bare `P` in `jax.device_put` looks for:

# %%
outcomes = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with amesh:
        current = jax.sharding.get_abstract_mesh()
        try:
            jax.device_put(x, P("data"))
        except ValueError as err:
            outcomes.append("device_put(x, P) fails")
            print("device_put under `with mesh:` -> ValueError:", err)
        # What it still does: a bare P inside jit, in with_sharding_constraint
        c = jax.jit(lambda a: jax.lax.with_sharding_constraint(a, P("data", "model")))(xa)
        outcomes.append("constraint with a bare P works")

print("current mesh under `with mesh:`:", current)
for w in caught:
    print(f"{w.category.__name__}: {w.message}")

assert current.empty
assert [w.category for w in caught] == [DeprecationWarning]
assert "jax.set_mesh" in str(caught[0].message)
assert outcomes == ["device_put(x, P) fails", "constraint with a bare P works"]
assert c.sharding.shard_shape(c.shape) == (4, 4)

# %% [markdown]
# `with mesh:` is the older mesh context: it still serves bare specs to `with_sharding_constraint`
# inside `jit`, but it leaves the *abstract* mesh (`jax.sharding.get_abstract_mesh()`, printed empty
# above) unset, and that is what `jax.device_put` reads for a bare `P`. `jax.set_mesh` sets both. The fix
# is a one-word change:

# %%
with jax.set_mesh(amesh):
    fixed_y = jax.device_put(x, P("data"))
    fixed_c = jax.jit(lambda a: jax.lax.with_sharding_constraint(a, P("data", "model")))(xa)
assert fixed_y.sharding.shard_shape(x.shape) == (4, 8)
assert fixed_c.sharding.shard_shape(x.shape) == (4, 4)

# %% [markdown]
# ## 5. Mesh shapes for 8 devices
#
# Any shape whose sizes multiply to 8 uses every device once. The shape decides how finely each axis
# can split an array: put a `(128, 512)` array on each mesh with `P('data', 'model')` and compare the
# blocks. On `(2, 2, 2)` the spec does not mention `pipeline`, so each block sits on the 2 devices that
# differ only in `pipeline` (two copies).

# %%
shapes = {(8, 1): ("data", "model"), (4, 2): ("data", "model"), (2, 4): ("data", "model"),
          (2, 2, 2): ("data", "model", "pipeline")}
expected = {(8, 1): ((16, 512), 1), (4, 2): ((32, 256), 1), (2, 4): ((64, 128), 1), (2, 2, 2): ((64, 256), 2)}

meshes = {}
print(f"{'mesh shape':<12}{'block of (128, 512)':<22}{'copies':>6}")
for shape, names in shapes.items():
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
    meshes[shape] = mesh
    sharding = NamedSharding(mesh, P("data", "model"))
    block = sharding.shard_shape((128, 512))
    copies = mesh.size // len(tiles((128, 512), sharding))  # devices per distinct block
    print(f"{shape!s:<12}{block!s:<22}{copies:>6}")
    assert mesh.devices.shape == shape and mesh.size == 8
    assert (block, copies) == expected[shape]

for shape, mesh in meshes.items():
    fig = draw_mesh(mesh, title=f"{shape}: " + ", ".join(f"{k}={v}" for k, v in dict(mesh.shape).items()))
    assert sorted(np.ravel(mesh_labels(fig)).tolist()) == list(range(8))
    display(fig)

# %% [markdown]
# **A shape that does not fit.** A `(4, 4)` mesh has 16 positions and there are 8 devices.
# `jax.make_mesh` refuses, and the message gives the rule: the product of the shape must not exceed the
# number of devices.

# %%
raised = []
try:
    jax.make_mesh((4, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
except ValueError as err:
    raised.append("(4, 4)")
    print("jax.make_mesh((4, 4), ...) -> ValueError:", err)
assert raised == ["(4, 4)"]

# %% [markdown]
# "Must not exceed", not "must equal": a shape that needs *fewer* devices is accepted without a word, and
# the mesh takes the first devices. `(3, 2)` gives a 6-device mesh, and devices 6 and 7 hold nothing of
# any array sharded on it. `create_device_mesh` is stricter and wants exactly all the devices:

# %%
small = jax.make_mesh((3, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
print("jax.make_mesh((3, 2), ...) ->", small, "on devices", small.device_ids.ravel().tolist())
assert small.size == 6 and small.device_ids.ravel().tolist() == [0, 1, 2, 3, 4, 5]
assert {d.id for d in NamedSharding(small, P("data", "model")).device_set} == {0, 1, 2, 3, 4, 5}

try:
    mesh_utils.create_device_mesh((3, 2))
except ValueError as err:
    raised.append("(3, 2)")
    print("create_device_mesh((3, 2)) -> ValueError:", err)
assert raised == ["(4, 4)", "(3, 2)"]

# %% [markdown]
# ## 6. The seed's Step 1, then and now
#
# The seed's "Step 1: Create Device Mesh", run as written:

# %%
# --- the seed's code, unchanged ---
num_devices = jax.local_device_count()
print(f"Devices: {num_devices}")

# Strategy 1: Pure data parallelism (like pmap)
devices = mesh_utils.create_device_mesh((num_devices,))
mesh = Mesh(devices, axis_names=('data',))

# Strategy 2: Hybrid (4 data, 2 model)
# Requires 8 devices
if num_devices == 8:
    devices = mesh_utils.create_device_mesh((4, 2))
    mesh = Mesh(devices, axis_names=('data', 'model'))

# Strategy 3: FSDP-style (all devices in one axis)
devices = mesh_utils.create_device_mesh((num_devices,))
mesh = Mesh(devices, axis_names=('fsdp',))
# --- end of the seed's code ---

print(mesh)
assert dict(mesh.shape) == {"fsdp": 8} and mesh.axis_types == (AxisType.Auto,)

# %% [markdown]
# It runs and gives Auto meshes (each strategy overwrites `mesh`; the last one wins). One line is
# fragile beyond a single machine: `jax.local_device_count()` counts this process's devices, while
# `create_device_mesh` uses *all* devices (`jax.devices()`) unless told otherwise. On two hosts with 4
# devices each, the seed would ask for a `(4,)` mesh of 8 devices. The same mismatch on this machine:

# %%
try:
    mesh_utils.create_device_mesh((4,))  # what the seed asks for when local_device_count() is 4 of 8
except ValueError as err:
    raised.append("(4,)")
    print("ValueError:", err)
assert raised[-1] == "(4,)"

# %% [markdown]
# The modern equivalent: `jax.make_mesh` with the *global* device count and deliberate axis types (Auto,
# to keep the seed's behaviour), one name per strategy:

# %%
n = jax.device_count()
dp_mesh = jax.make_mesh((n,), ("data",), axis_types=(AxisType.Auto,))
hybrid_mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
fsdp_mesh = jax.make_mesh((n,), ("fsdp",), axis_types=(AxisType.Auto,))

seed_strategy_3 = mesh
assert fsdp_mesh == seed_strategy_3
assert hybrid_mesh == Mesh(mesh_utils.create_device_mesh((4, 2)), axis_names=("data", "model"))
assert dp_mesh.device_ids.tolist() == list(range(8))

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.reveal()` for the reference answer.
#
# **Exercise 1.** Which device sits at `data=2, model=1` of the `(4, 2)` mesh
# `jax.make_mesh((4, 2), ('data', 'model'), ...)` on this machine? Work it out from the picture in
# section 1 before you look at `mesh_2d.devices`.

# %%
from exercises import ex01_meshes as ex

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
# ## Takeaways
# - A mesh is the devices arranged as a named grid: `mesh.shape`, `mesh.axis_names`, and `mesh.devices`
#   (an array whose index is each device's coordinates). Shardings name mesh axes, never devices.
# - `jax.make_mesh` gives **Explicit** axes by default, `Mesh(create_device_mesh(...))` gives **Auto**:
#   Auto lets the compiler propagate shardings (and accepts `with_sharding_constraint`), Explicit puts
#   them in the type (`float32[16@data,8]`) and changes them with `jax.reshard`. Always pass `axis_types`.
# - A collective over an axis runs among the devices along that axis, so the mesh's device order decides
#   which physical links it uses. `jax.make_mesh` orders for the TPU board; on CPU it is plain id order.
#   Reordering moves blocks to other devices and leaves results unchanged.
# - `with jax.set_mesh(mesh):` makes bare `P(...)` specs work; the seed's `with mesh:` warns and no longer
#   does that for `jax.device_put`.
# - A mesh shape must not need more devices than exist (`(4, 4)` on 8 fails); `jax.make_mesh` silently
#   uses only the first devices of a smaller shape.
#
# **Next:** [02 · PartitionSpec](02_partitionspec.ipynb)
