# %% [markdown]
# # 05 · Asking for a layout: constraints, Auto and Explicit axes
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/05_constraints_explicit.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/05_constraints_explicit.ipynb)
#
# Left to itself, the compiler may run `relu(x @ w1) @ w2` by moving a weight between devices, over 2
# times the bytes of a plan that moves only activations. Getting the better plan takes a request inside
# `jax.jit`, where `jax.device_put`, the tool that works outside, does nothing on Auto axes.
#
# **You need:** notebooks 01 to 04 (meshes and axis types, `PartitionSpec`, `NamedSharding`, propagation
# and the four matmul cases), `jax.jit` and `jax.typeof`.
#
# You will ask for layouts inside `jax.jit`, and choose who lays out its values: the compiler (**Auto**
# axes) or your program's types (**Explicit** axes). Every request is checked in the compiled program.
#
# **You will learn**
# - why `jax.device_put` inside `jit` does not reshard on Auto axes, and what does:
#   `jax.lax.with_sharding_constraint` and `jax.jit(..., out_shardings=...)`;
# - how to see the layout of a value inside `jit` (`jax.debug.inspect_array_sharding`, the lowered
#   program's `sdy` annotations), and how to pin only some dimensions (`P.UNCONSTRAINED`);
# - how one constraint fixes a poor plan of the compiler, and how a waypoint avoids a full copy of an
#   array on every device;
# - Explicit axes: the sharding in the type (`f32[128@data,512]`), `jax.reshard`, and `out_sharding=` for
#   ambiguous matmuls and new arrays;
# - which tool works on which axis type, and how to mix the two with `auto_axes` and `explicit_axes`;
# - which axis type to choose, and when.

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
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (
    NOT_ANSWERED,
    assert_close,
    collectives,
    compile_with_log,
    draw_mesh,
    draw_shardings,
    memory_per_device,
    type_string,
)


mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
X = np.arange(128 * 512, dtype=np.float32).reshape(128, 512) / 1024
x = jax.device_put(X, NamedSharding(mesh, P("data", None)))
print(mesh, "\nx:", type_string(x))
draw_mesh(mesh)

# %% [markdown]
# ## 1. `device_put` inside `jit` does not reshard
#
# > **You will see this online:** `jax.device_put` inside a jitted function, to move an array to another
# > layout on the way:
# > ```python
# > @jax.jit
# > def process(x):
# >     y = jax.device_put(x, NamedSharding(mesh, P("model")))  # reshard: rows over model
# >     return y * 2
# > ```
# > On an Auto mesh it does nothing. Run it on `x`, whose rows are split over `data`:

# %%
@jax.jit
def process(x):
    y = jax.device_put(x, NamedSharding(mesh, P("model")))
    return y * 2


lowered = process.lower(x)
compiled = lowered.compile()
result = compiled(x)
print("asked for:", type_string(X.shape, NamedSharding(mesh, P("model"))))
print("got:      ", type_string(result))
assert result.sharding.is_equivalent_to(x.sharding, 2)  # still rows over data
assert "sharding_constraint" not in lowered.as_text()  # the request never reached the compiler
assert collectives(compiled).count() == 0  # nothing moved
np.testing.assert_array_equal(result, 2 * X)  # the values are right; only the layout is not

# %% [markdown]
# On Auto axes, `device_put` inside a traced function lowers to nothing: the program handed to the
# compiler (`lowered.as_text()`) holds no request for `P('model')`. Outside `jit`, `device_put` does move
# data (notebook 03). Inside, ask with a constraint.
#
# ## 2. `with_sharding_constraint`: pin one value
#
# `jax.lax.with_sharding_constraint(y, sharding)` says: at this point of the program, `y` has this
# sharding. The compiler inserts the collectives that get it there, and propagates from it to the values
# around it.

# %%
@jax.jit
def process_fixed(x):
    y = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("model")))
    return y * 2


lowered = process_fixed.lower(x)
compiled = lowered.compile()
fixed = compiled(x)
print("got:", type_string(fixed))
print(collectives(compiled))
assert "sharding_constraint" in lowered.as_text()  # this time the program carries the request
assert fixed.sharding.is_equivalent_to(NamedSharding(mesh, P("model", None)), 2)
assert collectives(compiled).count() > 0  # and data moves
np.testing.assert_array_equal(fixed, 2 * X)
draw_shardings({"1: x": x, "2: process_fixed(x)": fixed})

# %% [markdown]
# **Reading the two programs.** In the lowered program, before partitioning, the argument carries its
# layout as `sdy.sharding`, and the request is an `sdy.sharding_constraint`. There `{}` stands for a
# dimension left whole. The compiled program moves `x` with a collective-permute, then an all-gather. The permute's
# `source_target_pairs` say who sends its block to whom, numbering devices by their place in the mesh
# (`mesh.devices.flat`), not by id:

# %%
requests = [line.strip() for line in lowered.as_text().splitlines() if "sdy.sharding" in line]
print(*requests, sep="\n")
assert any('sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>' in line for line in requests)  # x as it arrives
assert any("sdy.sharding_constraint" in line and '[{"model"}, {}]' in line for line in requests)  # the request

(permute,) = [op for op in collectives(compiled).ops if op.kind == "collective-permute"]
pairs_text = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", compiled.as_text()).group(1)
send = {int(s): int(t) for s, t in re.findall(r"\{(\d+),(\d+)\}", pairs_text)}
place = mesh.devices.flat  # place k in the program is the device mesh.devices.flat[k]
cycles, left = [], set(send)
while left:  # follow each block until it comes back to where it started
    cycle = [min(left)]
    while send[cycle[-1]] != cycle[0]:
        cycle.append(send[cycle[-1]])
    cycles.append(cycle)
    left -= set(cycle)
for cycle in cycles:
    print(" -> ".join(f"dev {place[k].id}" for k in cycle + cycle[:1]) if len(cycle) > 1 else
          f"dev {place[cycle[0]].id} keeps its block")
keepers = [place[c[0]] for c in cycles if len(c) == 1]
assert sorted(send) == sorted(send.values()) == list(range(mesh.size))  # each device sends one block, gets one
assert max(len(c) for c in cycles) == permute.group_size  # "group 3": the longest cycle


def rows_of(a, device):  # the rows of X that this device holds of a
    return set(range(128)[a.sharding.devices_indices_map(X.shape)[device][0]])


assert keepers and all(rows_of(x, d) <= rows_of(fixed, d) for d in keepers)  # what a keeper has, it keeps
sent = sum(permute.result_bytes for s, t in send.items() if s != t) / len(send)  # per device, on average
print(f"ring estimate {permute.estimated_bytes / 1024:.0f} KiB per device; sent on average {sent / 1024:.0f} KiB")
assert sent < permute.estimated_bytes

# %% [markdown]
# The blocks travel in cycles: "group 3" in the table is the longest one. A device that sends to itself
# keeps its block: its rows are among those its new layout keeps. The ring estimate charges every device a
# whole block, so here it overestimates.

# %% [markdown]
# **A constraint also reaches backwards.** A batch that arrives as a NumPy array has no sharding, and
# `jit` gives every device all of it. Constrain it where it enters the function:

# %%
rng = np.random.default_rng(0)
batch = rng.normal(size=(128, 256)).astype(np.float32)
w = jax.device_put(rng.normal(size=(256, 16)).astype(np.float32) / 16, NamedSharding(mesh, P()))

# %% tags=["save"]
def score(w, b, pin=None):
    """The mean of tanh(b @ w). `pin`: a sharding the batch is constrained to where it enters, or None."""
    if pin is not None:
        b = jax.lax.with_sharding_constraint(b, pin)
    return jnp.mean(jnp.tanh(b @ w))

# %%
score_pinned = partial(score, pin=NamedSharding(mesh, P("data", None)))

plain, pinned = (jax.jit(f).lower(w, batch).compile() for f in (score, score_pinned))
for name, c in (("no constraint", plain), ("constrained", pinned)):
    print(f"{name:<14} batch enters as {c.input_shardings[0][1].spec}; {memory_per_device(c)}")
assert plain.input_shardings[0][1].is_fully_replicated  # every device gets all 128 rows
assert pinned.input_shardings[0][1].is_equivalent_to(NamedSharding(mesh, P("data", None)), 2)  # 32 each
assert "all-reduce" in collectives(pinned).kinds  # the mean adds up four partial sums
assert memory_per_device(pinned).argument < memory_per_device(plain).argument  # a quarter of the batch each
assert_close(pinned(w, batch), np.mean(np.tanh(batch @ np.asarray(w))))

# %% [markdown]
# Nothing moved: the batch had no layout yet, so it enters split, and each device holds a quarter of it
# and does a quarter of the work. A constraint never changes *what* is computed, only *where*.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §2: arguments and FLOPs per device
flops = plain.cost_analysis()["flops"] / pinned.cost_analysis()["flops"]
print(f"On {jax.default_backend()}, each device's arguments take {memory_per_device(plain).argument:,} B "
      f"unconstrained and {memory_per_device(pinned).argument:,} B constrained (accelerators pad small arrays), "
      f"and the unconstrained program counts {flops:.2f} times the FLOPs.")
if CPU:  # exact byte counts of the CPU compiler, and its own count of operations
    assert memory_per_device(plain).argument == (128 * 256 + 256 * 16) * 4
    assert memory_per_device(pinned).argument == (32 * 256 + 256 * 16) * 4
    assert 3.9 < plain.cost_analysis()["flops"] / pinned.cost_analysis()["flops"] < 4.1  # per device

# %% [markdown]
# ## 3. `out_shardings=`: the result in the layout you ask for
#
# `x @ w` with `x` at `P('data', None)` and `w` at `P(None, 'model')` comes out `P('data', 'model')`
# with no communication (notebook 04). If the next step wants each row whole on its devices, ask for that
# layout as the result, with `jax.jit(f, out_shardings=...)`. The compiler adds what it takes to deliver it:

# %%
W = rng.normal(size=(512, 256)).astype(np.float32) / 16
w_cols = jax.device_put(W, NamedSharding(mesh, P(None, "model")))
rows_whole = NamedSharding(mesh, P("data", None))

free = jax.jit(jnp.matmul).lower(x, w_cols).compile()
asked = jax.jit(jnp.matmul, out_shardings=rows_whole).lower(x, w_cols).compile()
y = asked(x, w_cols)
print("left to propagation:", type_string(X.shape[:1] + W.shape[1:], free.output_shardings))
print("out_shardings=     :", type_string(y))
print(collectives(asked))
assert free.output_shardings.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2)
assert collectives(free).count() == 0
assert y.sharding.is_equivalent_to(rows_whole, 2)  # delivered as asked
assert [(op.kind, op.group_size) for op in collectives(asked).ops] == [("all-gather", 2)]  # with its partner
assert_close(y, X @ W)

# %% [markdown]
# Each device's `(32, 128)` block is gathered with its `model` partner into whole rows.
#
# **`out_shardings` reaches backwards too.** Give the same request to a function whose inputs have no
# layout yet (NumPy arrays): the compiler splits the whole computation by rows, as a constraint on the
# result does, and each device computes only its own rows:

# %%
COUNTS_FLOPS = jax.default_backend() != "gpu"  # cost_analysis() counts no FLOPs on GPU


def tanh_product(a, b):
    return jnp.tanh(a) @ b


A, B = rng.normal(size=(128, 512)).astype(np.float32), rng.normal(size=(512, 256)).astype(np.float32)
neither = jax.jit(tanh_product).lower(A, B).compile()
by_result = jax.jit(tanh_product, out_shardings=rows_whole).lower(A, B).compile()
by_constraint = jax.jit(lambda a, b: jax.lax.with_sharding_constraint(tanh_product(a, b), rows_whole)).lower(A, B).compile()
for name, c in (("no annotation", neither), ("out_shardings", by_result), ("constraint", by_constraint)):
    print(f"{name:<14} FLOPs per device:", f"{c.cost_analysis()['flops'] / 1e6:.1f} M" if COUNTS_FLOPS else "not counted")
assert collectives(by_result).count() == collectives(by_constraint).count() == 0  # no device needs another's rows
if COUNTS_FLOPS:
    for c in (by_result, by_constraint):
        assert 3.9 < neither.cost_analysis()["flops"] / c.cost_analysis()["flops"] < 4.1  # a quarter of the rows
assert_close(by_result(A, B), np.tanh(A) @ B)

# %% [markdown]
# Why, then, did `asked` above gather the product instead of computing whole rows? Because the operands
# already fix the product's layout at `P('data', 'model')`, and a result sharding does not win against
# them, so the result is moved after the matmul. A constraint, by contrast, pins the value itself: the
# matmul must then produce whole rows, and for that it needs all of `w` on every device. To see which
# layout the compiler gave a value inside `jit`, use `jax.debug.inspect_array_sharding`, because on Auto
# axes `jax.typeof` does not say. Its callback runs while compiling:

# %%
product_layout = {}


def product(a, b, pin=False):
    h = a @ b
    jax.debug.inspect_array_sharding(h, callback=lambda s: product_layout.update({pin: s}))
    return jax.lax.with_sharding_constraint(h, rows_whole) if pin else h


asked = jax.jit(product, out_shardings=rows_whole).lower(x, w_cols).compile()
inside = jax.jit(lambda a, b: product(a, b, pin=True)).lower(x, w_cols).compile()
for name, c in (("out_shardings", asked), ("constraint", inside)):
    print(f"{name}: the product is made at {product_layout[c is inside].spec}\n{collectives(c)}\n")
assert product_layout[False].is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2)  # the operands' choice
assert product_layout[True].is_equivalent_to(rows_whole, 2)  # pinned
assert inside.output_shardings.is_equivalent_to(rows_whole, 2)  # the same layout delivered
(gather_product,), (gather_w,) = collectives(asked).ops, collectives(inside).ops
assert np.prod(gather_product.shapes[0]) == 32 * 256 and np.prod(gather_w.shapes[0]) == W.size  # rows; all of w
if COUNTS_FLOPS:  # whole rows are twice the work of half-rows
    assert 1.9 < inside.cost_analysis()["flops"] / asked.cost_analysis()["flops"] < 2.1
assert_close(inside(x, w_cols), X @ W)

# %% [markdown]
# The result and its layout are the same, but the constraint moves all of `w` and doubles each device's
# work. So use `out_shardings` for what the caller gets and a constraint for a value inside, and check
# the program either way.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §3: the gather of the first request
first = jax.jit(jnp.matmul, out_shardings=rows_whole).lower(x, w_cols).compile()  # the section's first request
(op,) = collectives(first).ops
print(f"On {jax.default_backend()}, the first request compiles to one {op.kind} of {op.result_type} in groups of "
      f"{op.group_size}.")
if CPU:
    assert (op.kind, op.result_type, op.group_size) == ("all-gather", "f32[32,256]", 2)  # a row block, whole

# %% [markdown]
# ## 4. When the compiler plans poorly
#
# Take `relu(x @ w1) @ w2` with the batch split over `data` and both weights stored split by **rows**
# over `model` (as a checkpoint might hold them). Something must move: the weight `w1`, into a layout that
# needs no reduction, or partial sums of the activations. See what the compiler picks, then pin the
# activation `h` to `P('data', None)`:

# %%
w1 = jax.device_put(rng.normal(size=(512, 1024)).astype(np.float32) / 20, NamedSharding(mesh, P("model", None)))
w2 = jax.device_put(rng.normal(size=(1024, 512)).astype(np.float32) / 30, NamedSharding(mesh, P("model", None)))

# %% tags=["save"]
def chain(x, w1, w2, pin=None):
    """Two layers, relu(x @ w1) @ w2. `pin`: a sharding the hidden activation is constrained to, or None to
    let the compiler choose."""
    h = jax.nn.relu(x @ w1)
    if pin is not None:
        h = jax.lax.with_sharding_constraint(h, pin)
    return h @ w2

# %%
chain_pinned = partial(chain, pin=NamedSharding(mesh, P("data", None)))

chosen, pinned = (jax.jit(f).lower(x, w1, w2).compile() for f in (chain, chain_pinned))
for name, c in (("the compiler's plan", chosen), ("h pinned", pinned)):
    print(f"{name}: {memory_per_device(c)}\n{collectives(c)}\n")
assert "all-to-all" in collectives(chosen).kinds and "all-to-all" not in collectives(pinned).kinds
assert collectives(pinned).estimated_bytes < collectives(chosen).estimated_bytes / 2
np.testing.assert_allclose(pinned(x, w1, w2), chosen(x, w1, w2), rtol=RTOL, atol=1e-3)
chain_plans = chosen, pinned  # their exact figures close this section

# %% [markdown]
# The compiler moves a weight: its all-to-all carries a device's whole slice of `w1`. Pinned, `h` is built
# from pending sums `{U:model}` added over `model`: activations only, under half the bytes by the
# ring-formula estimate (and, with the CPU compiler, an eighth of the temporaries: see
# the CPU compiler's exact figures, in the hidden cell at the end of this section). A constraint is a request,
# not a speed-up: measure before you keep one.
#
# **A reshard with no good route.** From `P('data', None)` to `P(None, 'model')` the cut moves to the other
# dimension *and* the other axis. The partitioner falls back to gathering the **whole array** on every
# device, and on the CPU backend says so on stderr, from C++ (not a Python warning): `[SPMD] Involuntary
# full rematerialization`. In a real program that line means a full copy of a
# tensor on every device. A **waypoint** fixes it: first `P('data', 'model')`, a local slice, then
# `P(None, 'model')`, which gathers only the columns each device keeps. `compile_with_log` catches what the
# compiler prints.

# %% tags=["save"]
def reshard_via(v, *layouts):
    """v constrained to each sharding of `layouts` in turn: the last is where it ends, any before it a waypoint."""
    for layout in layouts:
        v = jax.lax.with_sharding_constraint(v, layout)
    return v

# %%
target = NamedSharding(mesh, P(None, "model"))


def direct(v):
    return reshard_via(v, target)


def waypoint(v):
    return reshard_via(v, NamedSharding(mesh, P("data", "model")), target)  # a local slice first, then target

(direct_c, direct_log), (waypoint_c, waypoint_log) = (compile_with_log(jax.jit(f).lower(x)) for f in (direct, waypoint))
print("direct:\n", collectives(direct_c), "\n\nwaypoint:\n", collectives(waypoint_c), sep="")
print("\nfull rematerialization reported: direct", "Involuntary full rematerialization" in direct_log,
      "| waypoint", "Involuntary full rematerialization" in waypoint_log)
assert "Involuntary" not in waypoint_log
assert [op.result_type for op in collectives(direct_c).ops] == ["f32[128,512]"]  # all of x, on every device
assert [op.result_type for op in collectives(waypoint_c).ops] == ["f32[128,256]"]  # only the kept columns
out = waypoint_c(x)
assert out.sharding.is_equivalent_to(target, 2)
np.testing.assert_array_equal(out, X)

# %% [markdown]
# A constraint can pin some dimensions only: `P.UNCONSTRAINED` leaves a dimension to propagation. Ask
# only for columns over `model`, and the rows keep the split they arrive with: that is the waypoint,
# reached with no data moved. The lowered program writes the free dimension as `{?}`:

# %%
columns_only = jax.jit(lambda v: jax.lax.with_sharding_constraint(v, NamedSharding(mesh, P(P.UNCONSTRAINED, "model"))))
lowered = columns_only.lower(x)
compiled = lowered.compile()
print(next(line.strip() for line in lowered.as_text().splitlines() if "sdy.sharding_constraint" in line))
print("result:", type_string(X.shape, compiled.output_shardings))
assert '[{?}, {"model"}]' in lowered.as_text()
assert compiled.output_shardings.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2)  # rows kept on data
assert collectives(compiled).count() == 0

# %%
waypoint_layout = jax.ShapeDtypeStruct(X.shape, X.dtype, sharding=NamedSharding(mesh, P("data", "model")))
draw_shardings({"1: x": x, "2: waypoint": waypoint_layout, "3: target": out})

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §4: the all-to-all, the temporaries and the warning
a2a = next(op for op in collectives(chain_plans[0]).ops if op.kind == "all-to-all")
temps = [memory_per_device(c).temp for c in chain_plans]
warned = "Involuntary full rematerialization" in direct_log
print(f"On {jax.default_backend()}, the all-to-all carries {a2a.result_bytes:,} B per device. Temporaries take "
      f"{temps[0]:,} B per device in the compiler's plan and {temps[1]:,} B pinned. The direct reshard "
      f"{'printed' if warned else 'did not print'} XLA's 'Involuntary full rematerialization' warning.")
if CPU:
    assert a2a.result_bytes == w1.sharding.shard_shape(w1.shape)[0] * 1024 * 4  # w1's whole slice: 1 MiB
    assert collectives(chain_plans[1]).kinds == {"all-reduce"}
    assert temps[0] > 7.9 * temps[1]  # 2 MiB against 256 KiB
    assert "Involuntary full rematerialization" in direct_log  # the CPU compiler's warning (libtpu's stays off stderr)

# %% [markdown]
# ## 5. Explicit axes: the sharding is in the type
#
# On an **Explicit** axis a value's sharding is part of its type: JAX works it out for every value while
# tracing, before the compiler sees the program, and `jax.typeof` prints it. Build the same mesh with
# Explicit axes and make it the current mesh for the rest of the notebook with `jax.set_mesh` (notebook
# 01), so that bare specs work. Creating an array in its layout takes `out_sharding=` (notebook 02).

# %%
emesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
jax.set_mesh(emesh)  # global: the current mesh until jax.set_mesh(None)

xe = jax.device_put(X, P("data", None))
we = jax.device_put(W, P(None, "model"))
zeros = jnp.zeros((128, 512), out_sharding=P("data", "model"))
print("Explicit:", jax.typeof(xe), jax.typeof(we), jax.typeof(zeros))
print("Auto:    ", jax.typeof(x), " type_string:", type_string(x))
assert str(jax.typeof(xe)) == "float32[128@data,512]" and str(jax.typeof(zeros)) == "float32[128@data,512@model]"
assert str(jax.typeof(x)) == "float32[128,512]"  # on Auto axes the type says nothing about the layout

# %% [markdown]
# Inside `jit` the types flow through every operation. Print them while tracing: `x @ w` needs nothing
# (case 1 of notebook 04), and the sum over rows crosses the `data` cut, so the type of the result keeps
# only `model` and the program needs an all-reduce over `data`:

# %%
trace_types = []


@jax.jit
def layer_sum(x, w):
    h = x @ w
    total = h.sum(axis=0)
    for name, value in (("x", x), ("w", w), ("h = x @ w", h), ("h.sum(0)", total)):
        print(f"{name:<10}{jax.typeof(value)}")
        trace_types.append(str(jax.typeof(value)))
    return total


compiled = layer_sum.lower(xe, we).compile()
print(collectives(compiled))
assert trace_types == ["float32[128@data,512]", "float32[512,256@model]", "float32[128@data,256@model]",
                       "float32[256@model]"]
assert collectives(compiled).kinds == {"all-reduce"} and collectives(compiled).ops[0].group_size == 4
assert_close(compiled(xe, we), (X @ W).sum(axis=0))

# %% [markdown]
# ## 6. What Explicit axes refuse
#
# **An ambiguous matmul.** With both operands split on the contracting dimension (case 3 of notebook 04)
# each device holds partial sums, and the result could be laid out many ways. On Auto axes the compiler
# picks. On Explicit axes JAX raises `ShardingTypeError` while tracing, until `out_sharding=` says which.

# %%
A = rng.normal(size=(128, 256)).astype(np.float32)
B = rng.normal(size=(256, 512)).astype(np.float32)
ae, be = jax.device_put(A, P(None, "model")), jax.device_put(B, P("model", None))
refused = {}
try:
    jax.jit(jnp.matmul)(ae, be)
except Exception as err:  # jax._src.core.ShardingTypeError: not exported under jax.errors
    refused["matmul"] = type(err).__name__
    print(f"{jax.typeof(ae)} @ {jax.typeof(be)}\n  {type(err).__name__}: {str(err).split('. Please')[0]}")

by_rows = jax.jit(lambda a, b: jnp.matmul(a, b, out_sharding=P("data", None))).lower(ae, be).compile()
ce = by_rows(ae, be)
print("with out_sharding=P('data', None):", jax.typeof(ce))
print(collectives(by_rows))
assert refused == {"matmul": "ShardingTypeError"} and str(jax.typeof(ce)) == "float32[128@data,512]"
(op,) = collectives(by_rows).ops
assert op.kind == "all-reduce" and op.group_size == 2  # the partial sums, added up within each model pair
assert_close(ce, A @ B)

# %% [markdown]
# **A pending sum has a type.** Ask for `out_sharding=P('data', None, unreduced={'model'})` and the matmul
# stops before adding: `jax.typeof` marks the partial sums still owed over `model` as `{U:model}`, the
# notation of notebook 04. `jax.reshard` to a spec without it adds them: one all-reduce over `model`.

# %%
owed = []


def add_later(a, b):
    partial = jnp.matmul(a, b, out_sharding=P("data", None, unreduced={"model"}))
    summed = jax.reshard(partial, P("data", None))
    owed.extend(str(jax.typeof(v)) for v in (partial, summed))
    return summed


later = jax.jit(add_later).lower(ae, be).compile()
print(" -> reshard -> ".join(owed), "\n", collectives(later), sep="")
assert owed == ["float32[128@data,512]{U:model}", "float32[128@data,512]"]
assert [(op.kind, op.group_size) for op in collectives(later).ops] == [("all-reduce", 2)]
assert_close(later(ae, be), A @ B)

# %% [markdown]
# **Mismatched operands.** Add an array at `P('data', None)` to one at `P(None, 'data')`. On Auto axes the
# compiler moves one of them, silently. On Explicit axes it is a type error, and the move, if you want it,
# is a `jax.reshard` you write, so the cost is in the code you read. (Auto arrays are used under their own
# mesh: `with jax.set_mesh(mesh)`, on top of the global one.)

# %%
ones = np.ones((128, 512), np.float32)
with jax.set_mesh(mesh):
    ua, va = jax.device_put(ones, P("data", None)), jax.device_put(ones, P(None, "data"))
    silent = jax.jit(jnp.add).lower(ua, va).compile()
print("Auto:\n", collectives(silent), sep="")

ue, ve = jax.device_put(ones, P("data", None)), jax.device_put(ones, P(None, "data"))
try:
    jax.jit(jnp.add)(ue, ve)
except Exception as err:  # ShardingTypeError
    refused["add"] = type(err).__name__
    print(f"\nExplicit: {type(err).__name__}: {err}")
moved = jax.jit(lambda a, b: a + jax.reshard(b, P("data", None)))(ue, ve)
print("with jax.reshard:", jax.typeof(moved))
assert collectives(silent).count() > 0 and refused["add"] == "ShardingTypeError"
assert str(jax.typeof(moved)) == "float32[128@data,512]"
np.testing.assert_array_equal(moved, 2 * ones)

# %% [markdown]
# ## 7. Which tool, on which axis type
#
# Ask each of the three tools, inside `jit`, to move rows from `data` to `model`, on each kind of axis:

# %%
tools = {"device_put": jax.device_put, "with_sharding_constraint": jax.lax.with_sharding_constraint,
         "reshard": jax.reshard}
outcome = {}
for kind, arr, m in (("Auto", x, mesh), ("Explicit", xe, emesh)):
    with jax.set_mesh(m):
        for name, tool in tools.items():
            try:
                out = jax.jit(lambda v, tool=tool: tool(v, P("model", None)))(arr)
                ok = out.sharding.is_equivalent_to(NamedSharding(m, P("model", None)), 2)
                outcome[kind, name] = "reshards" if ok else "ignored: the layout is unchanged"
            except (ValueError, AssertionError) as err:
                outcome[kind, name] = f"{type(err).__name__}: {str(err).split('. ')[0]}"
            print(f"{kind:<9}{name:<26}{outcome[kind, name]}")

assert outcome["Auto", "device_put"].startswith("ignored")
assert outcome["Auto", "with_sharding_constraint"] == outcome["Explicit", "reshard"] == "reshards"
assert outcome["Explicit", "device_put"] == "reshards"  # there the sharding is part of the type
assert outcome["Auto", "reshard"].startswith("ValueError")
assert outcome["Explicit", "with_sharding_constraint"].startswith("AssertionError")
checked = jax.jit(lambda v: jax.lax.with_sharding_constraint(v, P("data", None)))(xe)  # what the type says
assert str(jax.typeof(checked)) == "float32[128@data,512]"

# %% [markdown]
# | inside `jit`, to change a layout | Auto axes | Explicit axes |
# |---|---|---|
# | `jax.device_put(x, s)` | **silently ignored** | reshards |
# | `jax.lax.with_sharding_constraint(x, s)` | reshards | an assert: passes only if the type already says `s` |
# | `jax.reshard(x, s)` | `ValueError` | reshards |
#
# ## 8. Mixing the two: `auto_axes` and `explicit_axes`
#
# One program can use both. `jax.sharding.auto_axes(f, out_sharding=...)` runs `f` with the mesh's axes
# turned Auto, so code written for the compiler to lay out (a layer that hints with a constraint, say)
# runs inside an Explicit program, and `out_sharding` gives its result a type again.
# `jax.sharding.explicit_axes(f, in_sharding=...)` is the reverse: typed code inside an Auto program.

# %%
seen = {}


def auto_layer(a, w):  # written for Auto axes: it hints with a constraint
    seen["in auto_axes"] = (jax.sharding.get_abstract_mesh().axis_types, str(jax.typeof(a)))
    return jax.lax.with_sharding_constraint(jax.nn.relu(a @ w), P("data", None))


@jax.jit
def explicit_program(a, w):
    return 2 * jax.sharding.auto_axes(auto_layer, out_sharding=P("data", None))(a, w)


def typed_layer(a):
    seen["in explicit_axes"] = (jax.sharding.get_abstract_mesh().axis_types, str(jax.typeof(a)))
    return 2 * a


ye = explicit_program(xe, we)
with jax.set_mesh(mesh):
    ya = jax.jit(lambda a: jax.sharding.explicit_axes(typed_layer, in_sharding=P("data", None))(a))(x)
for where, (types, typ) in seen.items():
    print(f"{where:<17} axis types {types}, argument {typ}")
print("explicit_program returns", jax.typeof(ye))
assert seen["in auto_axes"] == ((AxisType.Auto, AxisType.Auto), "float32[128,512]")
assert seen["in explicit_axes"] == ((AxisType.Explicit, AxisType.Explicit), "float32[128@data,512]")
assert str(jax.typeof(ye)) == "float32[128@data,256]"
assert_close(ye, 2 * np.maximum(X @ W, 0))
np.testing.assert_array_equal(ya, 2 * X)

# %% [markdown]
# ## 9. Which to choose
#
# Always pass `axis_types`: `jax.make_mesh` defaults to Explicit and `Mesh(...)` to Auto (notebook 01),
# and the same code behaves differently on each.
#
# | | Auto | Explicit |
# |---|---|---|
# | layouts inside `jit` come from | the compiler's propagation | the types, while tracing |
# | mismatched operands (section 6) | moved silently | `ShardingTypeError` |
# | ambiguous matmul | the compiler picks | `ShardingTypeError` until `out_sharding=` |
# | change a layout | `with_sharding_constraint` | `jax.reshard` |
# | see the plan | in the compiled program | in `jax.typeof`; collectives in the compiled program |
#
# - **Auto when you shard a model by annotating its parameters and its batch**, and want the compiler to
#   lay out everything else: the model code stays single-device code. Check the plan in the compiled
#   program (`collectives`, `memory_per_device`), and pin a value where it plans poorly (sections 2 to 4).
#   Notebooks 07 to 12 shard Flax NNX models this way, on Auto meshes, because what the compiler decides
#   is their subject.
# - **Explicit when the layouts are part of the design** and an unplanned move is a bug: every silent move
#   of section 6 becomes an error while tracing, and every move you keep is a `jax.reshard` in the code.
#   The price is an `out_sharding=` on each ambiguous operation. Notebook 14 trains a strategy this way.
# - **Mix at function boundaries**: `auto_axes` to call Auto code from an Explicit program,
#   `explicit_axes` for the reverse (section 8).
#
# Inside `jax.shard_map` the axes are of a third type, **Manual**: you write the per-device program and its
# collectives yourself. That is notebook 06.

# %% [markdown]
# ## Takeaways
# - Inside `jit` on Auto axes, `jax.device_put` does not reshard. `jax.lax.with_sharding_constraint` pins a
#   value, and `jax.jit(..., out_shardings=...)` delivers the result in the layout you ask for. Both
#   propagate backwards, but where the operands already fix a value's layout, only a constraint overrides
#   them.
# - A constraint changes where things are computed, never what: one constraint cut the ring-estimated bytes of a
#   matmul chain by more than half, and a waypoint turned a full copy on every device into half of one.
#   Check each in the compiled program.
# - On Explicit axes the sharding is in the type (`float32[128@data,512]`), ambiguous and mismatched
#   operations are errors while tracing, `out_sharding=` and `jax.reshard` resolve them, and
#   `with_sharding_constraint` is only an assert.
# - Auto for models sharded by annotations and checked in the compiled program; Explicit where the layouts
#   are the design; `auto_axes` and `explicit_axes` to mix them. Always pass `axis_types`.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** On the Auto `mesh`, `x` is at `P('data', None)`. Write `to_columns(v)`, used as
# `jax.jit(to_columns)(x)`, that returns `v` at `P(None, 'model')` without ever gathering the whole array
# on a device. The checker compiles it and reads the collectives; it runs under `jax.set_mesh(mesh)`, so a
# bare `P(...)` works.

# %%
from spmd_course.exercises import ex05_constraints_explicit as ex

answer_1 = NOT_ANSWERED  # a function, e.g. def to_columns(v): ...
ex.to_columns.check(answer_1);

# %% [markdown]
# **Exercise 2.** On the Explicit mesh, `a: f32[128,256@model]` times `b: f32[256@model,64]` is ambiguous.
# Write `f(a, b)` that returns the product split by rows over `data` (type `float32[128@data,64]`), with
# `out_sharding=`. The checker runs it under `jax.set_mesh` of an Explicit mesh, so a bare `P(...)` works.

# %%
answer_2 = NOT_ANSWERED  # a function f(a, b)
ex.rows_matmul.check(answer_2);

# %% [markdown]
# **Next:** [06 · shard_map: writing the per-device program](06_shard_map.ipynb)
