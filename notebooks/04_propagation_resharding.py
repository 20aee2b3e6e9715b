# %% [markdown]
# # 04 · Propagation and resharding
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/04_propagation_resharding.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/04_propagation_resharding.ipynb)
#
# You shard only the inputs, yet inside `jax.jit` every value gets a sharding, and wherever two disagree
# the compiler moves data you never asked to move. Add two arrays cut two ways and it may copy both whole
# onto every device: 5 times the bytes of a plan that one line of yours selects.
#
# **You need:** notebooks 01 to 03 (device meshes, `PartitionSpec`, `NamedSharding` and
# `jax.device_put`) and `jax.jit`.
#
# You will predict each layout's collectives, compile, find them in the compiled program and draw which
# blocks move. Then you compile the same programs for a TPU v5e-8 that you do not have.
#
# **You will learn**
# - why computation follows data: elementwise ops keep their input's sharding, and a matmul's output
#   sharding follows from its operands';
# - the four matmul cases that predict which collective `C = A @ B` needs, and a picture of each;
# - how to read a collective in the compiled HLO, replica groups such as `[4,2]<=[8]` included, and
#   what `compiled.memory_analysis()` reports per device;
# - why one program has an all-reduce on the CPU backend and a reduce-scatter on a TPU;
# - what the compiler does when two inputs disagree, and what that resharding costs.

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

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.matmul_pictures import draw_matmul, matmul_traffic
from spmd_course.utils import (
    NOT_ANSWERED,
    assert_close,
    collectives,
    draw_shardings,
    format_bytes,
    memory_per_device,
    quiet,
    tpu_compiler_available,
    type_string,
)

# %% [markdown]
# ## 1. Computation follows data
#
# Every mesh in this notebook has **Auto** axes: you shard the inputs, and the compiler does the rest in
# two steps. **Shardy propagates shardings**: starting from the inputs', it gives every intermediate value
# and output a sharding. Then **XLA's SPMD partitioner** rewrites the program into the one each device runs
# on its own blocks, and inserts a collective wherever a device needs data that another device holds.
#
# An elementwise function treats each element on its own, so each device computes its block of the output
# from its block of the input: the output keeps the input's sharding, and nothing moves. Compare shardings
# with `is_equivalent_to(other, ndim)`, not `spec ==`: the compiler may write `P('data', None)` as
# `P('data',)`, the same layout but an unequal `PartitionSpec`.

# %%
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
rng = np.random.default_rng(0)
X = rng.standard_normal((128, 512)).astype(np.float32)


def elementwise(x):
    return jnp.tanh(x) * 2.0 + 1.0


for spec in [P("data", None), P(None, "model"), P("data", "model")]:
    x = jax.device_put(X, NamedSharding(mesh, spec))
    compiled = jax.jit(elementwise).lower(x).compile()
    y = compiled(x)
    print(f"input {type_string(x):<22} -> output {type_string(y):<22} collectives: {collectives(compiled).count()}")
    assert y.sharding.is_equivalent_to(x.sharding, x.ndim)
    assert collectives(compiled).count() == 0
    assert_close(y, np.tanh(X) * 2.0 + 1.0)

y_eager = jnp.tanh(x) * 2.0 + 1.0  # outside jit too: each eager op runs where its input's blocks are
assert y_eager.sharding.is_equivalent_to(x.sharding, x.ndim)

# %% [markdown]
# ## 2. The four matmul cases: predict, compile, check, draw
#
# For `C = A @ B` with `A: [I, J]` and `B: [J, K]`, what must move depends on where each operand is cut:
# along the **contracting dimension** `J`, which the sum runs over, and along `I` and `K`, which become
# `C`'s dimensions. The four cases, and sorting matmuls by them, are the taxonomy of
# [How to Scale Your Model](https://jax-ml.github.io/scaling-book/) (part 3, on sharded matrices).
#
# | case | layout | what must happen | what each device sends in this section's example (an estimate) |
# |---|---|---|---|
# | 1 | `J` whole in both operands | each device multiplies its own blocks: **nothing moves** | 0 |
# | 2 | `J` cut in one operand only | **all-gather** that operand along `J` first | `(M-1)/M · 4·(I/D)·J` = 16 KiB |
# | 3 | `J` cut in both, by the same mesh axis | local partial sums `{U:axis}`, then an **all-reduce** (a **reduce-scatter** if `C` stays cut over that axis) | `2(M-1)/M · 4·I·K` = 256 KiB (3' below, a reduce-scatter: `(M-1)/M · 4·(I/D)·K` = 32 KiB) |
# | 4 | one mesh axis cuts both `I` and `K` | `C` cannot be cut twice by one axis: **all-gather one operand** | `(D-1)/D · 4·I·J` = 96 KiB |
#
# The last column counts bytes sent by the textbook ring algorithm (the formulas are in the summary below),
# for the layouts this section compiles: `I, J, K = 128, 256, 512`, `f32` elements of 4 bytes, `D = 4`
# devices along `data` and `M = 2` along `model`. It is an **estimate**, because the compiler may pick
# another algorithm or another layout. The summary asserts it against what `collectives()` finds in each
# compiled program. The cost grows with the array that moves, so case 3 is dear: it all-reduces the whole
# `(I, K)` product, where case 2 gathers only a slice of `A`.
#
# For each case: predict, compile, check the collectives (kind, per-device shape, group size), and draw
# what device 0 holds (solid outline), fetches (dashed, hatched) and computes (dotted outline). The fill
# colours are the devices', as in every picture of the course.

# %%
I, J, K = 128, 256, 512  # noqa: E741  C[I, K] = A[I, J] @ B[J, K]; J is the contracting dimension
A = rng.standard_normal((I, J)).astype(np.float32)
B = rng.standard_normal((J, K)).astype(np.float32)
C_ref = A @ B
cases = {}  # name -> (a, b, c, compiled), for the summary and the TPU section


def matmul(a, b):
    return a @ b


def run_case(name, spec_a, spec_b, out=None):
    a = jax.device_put(A, NamedSharding(mesh, spec_a))
    b = jax.device_put(B, NamedSharding(mesh, spec_b))
    fixed = {} if out is None else {"out_shardings": NamedSharding(mesh, out)}
    compiled = jax.jit(matmul, **fixed).lower(a, b).compile()
    c = compiled(a, b)
    assert_close(c, C_ref)
    print(type_string(a), "@", type_string(b), "->", type_string(c))
    print(collectives(compiled))
    cases[name] = (a, b, c, compiled)
    return a, b, c, collectives(compiled)


def found(col):
    """(kind, per-device result shape, group size) of each collective, in program order."""
    return [(op.kind, op.shapes[0], op.group_size) for op in col.ops]

# %% [markdown]
# **Case 1: `J` whole on both sides.** `A` at `P('data', None)` is cut into row blocks, `B` at
# `P(None, 'model')` into column blocks. Device `(d, m)` holds row block `d` of `A` and column block `m` of
# `B`: all it needs for block `(d, m)` of `C`. Predict `C` at `P('data', 'model')` and no collectives.

# %%
a, b, c, col = run_case("1", P("data", None), P(None, "model"))
assert found(col) == []
assert c.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2)
draw_matmul(a, b, c)

# %% [markdown]
# **Case 2: `J` cut on one side.** `A` at `P('data', 'model')` cuts its `J` columns over `model`, while
# `B` at `P(None, 'model')` keeps `J` whole. Each device holds only half of the `J` columns of its row
# block, so it all-gathers the other half from its `model` neighbour (a group of 2). That gives it a whole
# `(32, 256)` row block, which it multiplies locally, so `C` comes out at `P('data', 'model')`. There is no
# all-reduce, because `B`'s `J` is whole and so no device computes a partial sum.

# %%
a, b, c, col = run_case("2", P("data", "model"), P(None, "model"))
assert found(col) == [("all-gather", (32, 256), 2)]
assert c.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2)
draw_matmul(a, b, c)

# %% [markdown]
# **Case 3: `J` cut on both sides by the same axis.** `A` at `P(None, 'model')`, `B` at `P('model', None)`:
# the second layer of a tensor-parallel MLP. Each device holds matching halves of `J` and computes a full
# `(128, 512)` product of its halves: a **pending sum**, partial sums still to be added over `model`. The
# course writes it `f32[128,512]{U:model}`, which is how `jax.typeof` prints it: on an Explicit mesh
# (notebook 05) you can ask the matmul for its pending sum with `unreduced=`, as the cell checks. Predict
# one all-reduce over `model` (a group of 2) and `C` replicated.

# %%
a, b, c, col = run_case("3", P(None, "model"), P("model", None))
assert found(col) == [("all-reduce", (128, 512), 2)]
assert c.sharding.is_fully_replicated
picture = draw_matmul(a, b, c)
explicit = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
with jax.set_mesh(explicit):  # the same operands on an Explicit mesh, and the pending sum asked for
    pending = jax.jit(lambda a, b: jnp.matmul(a, b, out_sharding=P(None, None, unreduced={"model"})))(
        jax.device_put(A, P(None, "model")), jax.device_put(B, P("model", None)))
print("jax.typeof of the pending sum:", jax.typeof(pending))
assert str(jax.typeof(pending)) == "float32[128,512]{U:model}"  # JAX's print of the course's notation
assert f"{type_string(pending)} → f32[128,512]" in picture.axes[2].get_title()  # ... and the picture's title
picture

# %% [markdown]
# **Case 3 with `C` cut.** Add `data` to `A`'s rows and fix `C` at `P('data', 'model')` with
# `jax.jit(matmul, out_shardings=...)` (notebook 05 covers the ways to ask for a layout). Each device's
# pending sum is `f32[128@data,512]{U:model}`, but it keeps only a `(32, 256)` block of the sum: a
# reduce-scatter's job. The CPU compiler writes it as an **all-reduce** and a local `dynamic-slice` (see
# the CPU compiler's exact figures, in the hidden cell at the end of this section). The TPU compiler fuses the pair into one reduce-scatter
# (section 4).

# %%
a, b, c, col = run_case("3'", P("data", "model"), P("model", None), out=P("data", "model"))
assert c.sharding.shard_shape(c.shape) == (32, 256)  # each device keeps half of the (32, 512) it summed
(op,) = col.ops  # one sum over model: a reduce-scatter, or an all-reduce and a slice (the CPU's form)
assert op.kind in ("reduce-scatter", "all-reduce") and op.group_size == 2
picture = draw_matmul(a, b, c)
assert "f32[128@data,512]{U:model} → f32[128@data,512@model]" in picture.axes[2].get_title()
picture

# %% [markdown]
# **Case 4: one axis cuts `I` and `K`.** `A` at `P('data', None)`, `B` at `P(None, 'data')`. The natural
# output, `P('data', 'data')`, is illegal: a mesh axis can cut only one dimension. So one operand is
# gathered along `data` (a group of 4). Gathering `A` (128 KiB) is cheaper than gathering `B` (512 KiB):
# predict an all-gather of the whole of `A`, and `C` at `P(None, 'data')`, like `B`.

# %%
a, b, c, col = run_case("4", P("data", None), P(None, "data"))
assert found(col) == [("all-gather", (I, J), 4)]  # the whole of A on every device
assert c.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "data")), 2)
draw_matmul(a, b, c)

# %% [markdown]
# The summary. The "plan" column is the textbook plan that the pictures show, computed by
# `matmul_traffic`. The "compiled" column is what the programs contain. The last two columns are
# **estimates** of the bytes each device sends: the cost column of the table above, and the ring formulas
# applied to the compiled program's collectives, for a group of `N` devices:
#
# | collective | bytes each device sends, by the ring estimate |
# |---|---|
# | all-gather | `(N-1)/N` × its result |
# | all-reduce | `2(N-1)/N` × its result |
# | reduce-scatter | `(N-1)/N` × its input |
#
# The two estimates agree wherever the compiler followed the plan, and the cell asserts it. Case 3' on
# the CPU is the exception, because the CPU compiler all-reduces the `(32, 512)` partial sums and then
# slices, which sends twice what the reduce-scatter of the plan would (section 4 shows the TPU's
# reduce-scatter).
#
# Bytes are not yet time. Dividing a ring estimate by the bandwidth of the links that carry it gives an
# estimated time in seconds, and notebook 15 does exactly that for whole training steps on a TPU v5e.

# %%
D, M, f32 = mesh.shape["data"], mesh.shape["model"], 4  # the mesh's axis sizes, and bytes per element
table_estimate = {"1": 0, "2": (M - 1) / M * f32 * (I // D) * J, "3": 2 * (M - 1) / M * f32 * I * K,
                  "3'": (M - 1) / M * f32 * (I // D) * K, "4": (D - 1) / D * f32 * I * J}  # the table's column
print(f"{'case':<5}{'A':<20}{'B':<20}{'C':<20}{'plan':<16}{'compiled':<26}{'table':>11}{'ring estimate':>15}")
for name, (a, b, c, compiled) in cases.items():
    col = collectives(compiled)
    plan = matmul_traffic(A.shape, a.sharding, B.shape, b.sharding, c.sharding).collectives
    shown = ", ".join(f"{op.kind} {op.result_type}" for op in col.ops) or "none"
    print(f"{name:<5}{a.sharding.spec!s:<20}{b.sharding.spec!s:<20}{c.sharding.spec!s:<20}"
          f"{', '.join(plan) or 'none':<16}{shown:<26}{format_bytes(table_estimate[name]):>11}"
          f"{format_bytes(col.estimated_bytes):>15}")
    kinds = tuple(op.kind for op in col.ops)
    assert kinds == plan or (plan, kinds) == (("reduce-scatter",), ("all-reduce",))  # CPU: all-reduce + slice
    # the table's estimate; the CPU's all-reduce of the (32, 512) partial sums sends twice the reduce-scatter's
    assert col.estimated_bytes == table_estimate[name] * (2 if kinds != plan else 1)

# %% [markdown]
# **The same cases in the scaling book's notation.** *How to Scale Your Model* writes a sharded array by
# its dimensions' letters, with the mesh axis that cuts a dimension as a subscript: `A[I_X, J]` is `A`
# with its rows `I` cut over mesh axis `X`, and `{U_Y}` marks partial sums still to be added over `Y`.
# The course writes the same layout as a `PartitionSpec`, or as a type with the axis after `@`. Reading
# `X` as `data` and `Y` as `model`, the cases of this section translate as follows, and the cell below
# asserts the course's types from the arrays JAX computed:
#
# | case | `PartitionSpec`s of `A`, `B` | the course's types, `A @ B → C` | the scaling book's notation |
# |---|---|---|---|
# | 1 | `P('data', None)`, `P(None, 'model')` | `f32[128@data,256] @ f32[256,512@model] → f32[128@data,512@model]` | `A[I_X, J] · B[J, K_Y] → C[I_X, K_Y]` |
# | 2 | `P('data', 'model')`, `P(None, 'model')` | `f32[128@data,256@model] @ f32[256,512@model] → f32[128@data,512@model]` | `A[I_X, J_Y] · B[J, K_Y] → C[I_X, K_Y]` |
# | 3 | `P(None, 'model')`, `P('model', None)` | `f32[128,256@model] @ f32[256@model,512] → f32[128,512]` | `A[I, J_Y] · B[J_Y, K] → C[I, K] {U_Y}`, then all-reduce to `C[I, K]` |
# | 3' | `P('data', 'model')`, `P('model', None)` | `f32[128@data,256@model] @ f32[256@model,512] → f32[128@data,512@model]` | `A[I_X, J_Y] · B[J_Y, K] → C[I_X, K] {U_Y}`, then reduce-scatter to `C[I_X, K_Y]` |
# | 4 | `P('data', None)`, `P(None, 'data')` | `f32[128@data,256] @ f32[256,512@data] → f32[128,512@data]` | `A[I_X, J] · B[J, K_X]`: gather `A` to `A[I, J]`, then `C[I, K_X]` |

# %%
book_types = {  # case -> the course's types of A, B and C, as the table above writes them
    "1": "f32[128@data,256] @ f32[256,512@model] → f32[128@data,512@model]",
    "2": "f32[128@data,256@model] @ f32[256,512@model] → f32[128@data,512@model]",
    "3": "f32[128,256@model] @ f32[256@model,512] → f32[128,512]",
    "3'": "f32[128@data,256@model] @ f32[256@model,512] → f32[128@data,512@model]",
    "4": "f32[128@data,256] @ f32[256,512@data] → f32[128,512@data]",
}
for name, (a, b, c, _) in cases.items():
    typed = f"{type_string(a)} @ {type_string(b)} → {type_string(c)}"
    print(f"case {name:<3} {typed}")
    assert typed == book_types[name]

# %% [markdown]
# **The table says what must move, but the compiler picks how.** For example, `A` at `P('data', None)`
# with `B` at `P('model', None)` looks like case 2, because only `B` cuts `J`. The textbook plan gathers
# `B`, a ring estimate of 256 KiB per device. But every device holds `A`'s `J` whole, so it can slice out,
# for free, the half that matches its rows of `B`, and that turns the layout into case 3. The compiler
# does exactly that and all-reduces a `(32, 512)` partial product, a ring estimate of 64 KiB. So compile
# and count rather than guess.

# %%
a, b, c, col = run_case("2 or 3?", P("data", None), P("model", None))
del cases["2 or 3?"]
assert found(col) == [("all-reduce", (32, 512), 2)]
assert c.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None)), 2)

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §2: case 3' as an all-reduce and a slice
compiled = cases["3'"][3]
text, here = compiled.as_text(), found(collectives(compiled))
print(f"On {jax.default_backend()}, case 3' compiles to {', '.join(f'{k} of {s} in groups of {g}' for k, s, g in here)}, "
      f"{'followed by' if 'dynamic-slice' in text else 'without'} a dynamic-slice. Section 4 shows the TPU's form.")
if CPU:  # an all-reduce of the (32, 512) partial sums ...
    assert here == [("all-reduce", (32, 512), 2)]
    assert "dynamic-slice" in text  # ... and each device cuts its half out locally

# %% [markdown]
# ## 3. Reading the compiled program
#
# `collectives()` reads `compiled.as_text()`, the per-device HLO after partitioning. Here is the line of
# case 3's all-reduce, up to its metadata. Case 3 is a good one to read because it is a plain all-reduce on
# every backend (case 3' is not: the TPU compiler fuses it into a reduce-scatter, section 4).

# %%
def hlo_line(compiled, op):
    """The line of compiled.as_text() that defines collective `op`, without its metadata."""
    line = next(s.strip() for s in compiled.as_text().splitlines() if f"%{op.name} = " in s)
    return re.sub(r", (frontend_attributes|metadata|backend_config)=.*", "", line)


compiled = cases["3"][3]
op = collectives(compiled).ops[0]
line = hlo_line(compiled, op)
print(line)
assert op.kind == "all-reduce" and op.group_size == mesh.shape["model"]  # groups of 2: a sum over model
assert "replica_groups=" in line and "to_apply=" in line

# %% [markdown]
# Read it left to right. `f32[128,512]` is each device's result: the sum of the partial products.
# `to_apply=` names the little computation that combines two values, here an addition, so the reduction is a
# sum. `replica_groups` says which devices add their values together. The numbers in it are not device ids
# but **positions**: the program numbers its devices 0 to 7 in mesh order (`mesh.devices.flat`). XLA writes
# the groups in one of several spellings, and a compiler may pick any of them:
#
# | spelling | example | how to read it |
# |---|---|---|
# | mesh axes | `mesh['axis_0'=4,'axis_1'=2] {'axis_1'}` | the compiler's own mesh (here `axis_0` is `data` and `axis_1` is `model`). Devices that differ only along the axes in braces form a group |
# | mesh axes, reordered | `mesh['axis_0'=1,'axis_1'=2,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_1'}` | the same, but the compiler's mesh lists the devices in the order of the iota after `device_ids` |
# | iota | `[4,2]<=[8]` | number 0 to 7, lay them out as `[4,2]`; each row is a group |
# | iota, transposed | `[2,4]<=[4,2]T(1,0)` | lay out 0 to 7 as `[4,2]`, transpose, then read the 2 rows of 4 |
# | explicit | `{{0,1},{2,3},{4,5},{6,7}}` | the groups, listed |
#
# The decoder below reads all of them. Case 3 sums over `model`, so its groups are the mesh's rows, for
# example positions {0,1} and {2,3}. Case 4 gathers over `data`, so its groups are the mesh's columns:
# {0,2,4,6} and {1,3,5,7}.

# %%
def read_groups(line, n=8):
    """The replica groups of one HLO line, as lists of positions in mesh order, from any of XLA's spellings."""
    named = r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))?\s*\{([^}]*)\}"
    if m := re.search(named, line):  # named axes, perhaps with the devices in another order
        axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
        ids = np.arange(n)
        if m.group(2):  # device_ids=([4,2]T(1,0)): the devices' order, written as an iota
            ids = ids.reshape([int(d) for d in m.group(2).split(",")])
            ids = ids.transpose([int(p) for p in m.group(3).split(",")]) if m.group(3) else ids
        kept = [i for i, (name, _) in enumerate(axes) if f"'{name}'" in m.group(4)]
        others = [i for i in range(len(axes)) if i not in kept]
        grid = ids.reshape([int(size) for _, size in axes]).transpose(others + kept)
        return grid.reshape(-1, int(np.prod([int(axes[i][1]) for i in kept]))).tolist()
    if m := re.search(r"replica_groups=(\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)", line):  # iota
        return iota_groups(m.group(1))
    if m := re.search(r"replica_groups=\{((?:\{[\d,]*\},?)+)\}", line):  # listed
        return [[int(v) for v in g.split(",")] for g in re.findall(r"\{([\d,]+)\}", m.group(1))]
    raise ValueError(f"no replica groups in: {line}")


def iota_groups(text):
    """XLA's iota replica groups, '[4,2]<=[8]' or '[2,4]<=[4,2]T(1,0)', as a list of groups."""
    shape, dims, perm = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text).groups()
    numbers = np.arange(8).reshape([int(d) for d in dims.split(",")])
    if perm:
        numbers = numbers.transpose([int(p) for p in perm.split(",")])
    return numbers.reshape([int(s) for s in shape.split(",")]).tolist()


positions = np.arange(8).reshape(mesh.devices.shape)  # the program's device numbers, laid out as the mesh
over_model = read_groups(line)
over_data = read_groups(hlo_line(cases["4"][3], collectives(cases["4"][3]).ops[0]))
print("mesh positions:", positions.tolist(), "| case 3 groups:", over_model, "| case 4 groups:", over_data)
assert over_model == positions.tolist()  # the mesh's rows: a sum over model
assert over_data == positions.T.tolist()  # the mesh's columns: a gather over data
assert iota_groups("[4,2]<=[8]") == over_model and iota_groups("[2,4]<=[4,2]T(1,0)") == over_data

# %% [markdown]
# The compiled program also knows each device's memory. `compiled.memory_analysis()` returns the
# compiler's figures in bytes, per device. For case 4: the arguments are the device's blocks of `A` and
# `B`, the output its block of `C`. The temporaries are compiler-specific: the CPU compiler keeps the
# gathered `A` there (see the CPU compiler's exact figures, in the hidden cell at the end of this section).

# %%
compiled = cases["4"][3]
stats = compiled.memory_analysis()
print(f"{type(stats).__name__}: argument_size_in_bytes={stats.argument_size_in_bytes:,}, "
      f"output_size_in_bytes={stats.output_size_in_bytes:,}, temp_size_in_bytes={stats.temp_size_in_bytes:,}")
assert stats.argument_size_in_bytes == (32 * 256 + 256 * 128) * 4  # A's (32, 256) block + B's (256, 128)
assert stats.output_size_in_bytes == 128 * 128 * 4  # C's (128, 128) block
print(memory_per_device(compiled))  # the same fields, read by the course's helper from here on

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §3: case 3' and case 4's temporaries
line_3p = hlo_line(cases["3'"][3], collectives(cases["3'"][3]).ops[0])
groups_3p = re.search(r"replica_groups=(\S+?), ", line_3p)
print(f"On {jax.default_backend()}, case 3' is: {line_3p}")
print(f"Case 4 keeps {format_bytes(stats.temp_size_in_bytes)} of temporaries per device (all of A is "
      f"{format_bytes(A.nbytes)}).")
if CPU:  # an all-reduce with iota groups over model, and the gathered A kept in a temporary buffer
    assert " all-reduce(" in line_3p and "to_apply=%add" in line_3p
    assert groups_3p and iota_groups(groups_3p.group(1)) == positions.tolist()
    assert stats.temp_size_in_bytes == A.nbytes

# %% [markdown]
# ## 4. The same programs for a TPU v5e-8, compiled without one
#
# JAX compiles ahead of time for a TPU it does not have: `jax.experimental.topologies` describes a v5e-8
# (`v5e:2x4`), you build the same mesh from its devices, describe the inputs as
# `jax.ShapeDtypeStruct(shape, dtype, sharding=...)`, and compile. Nothing runs, but the program can be
# read. This needs libtpu, the TPU compiler, which runs on Linux only. Notebook 21 does more with it. Every TPU
# program in this notebook is compiled at the compiler's **default effort**, the one `jax.jit` uses when
# you run on a TPU, so its memory figures are the ones you would see there.

# %%
ok, why = tpu_compiler_available()
print(why)
tpu, tpu_args = {}, {}  # case -> the TPU program, and its inputs described for the TPU mesh
if ok:
    with quiet():  # libtpu writes start-up warnings to stderr
        topo = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")
    tpu_mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=topo.devices)
    for name, (a, b, c, _) in cases.items():
        tpu_args[name] = [jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(tpu_mesh, v.sharding.spec))
                          for v in (a, b)]
        fixed = {"out_shardings": NamedSharding(tpu_mesh, c.sharding.spec)} if name == "3'" else {}
        with quiet():
            tpu[name] = jax.jit(matmul, **fixed).lower(*tpu_args[name]).compile()
    print(topo.devices[0].device_kind, "x", len(topo.devices), "| compiled:", list(tpu))

# %% [markdown]
# Case 3', side by side. On the TPU the pending sums are **reduce-scattered**, so each chip receives only
# its `(32, 256)` block of the sum. The TPU compiler writes this as a fusion that calls
# `all-reduce-scatter`, which `collectives()` counts as one reduce-scatter. This is also why section 3
# read its groups from case 3: this line has no `replica_groups` of its own. By the ring formulas the
# reduce-scatter sends half the all-reduce's bytes, `(N-1)/N` against `2(N-1)/N` times the partial
# products. That is 32 KiB per chip, the estimate in the cost column of section 2's table, as the cell
# asserts.

# %%
if ok:
    here, there = collectives(cases["3'"][3]), collectives(tpu["3'"])
    print(f"{jax.default_backend()}, {jax.device_count()} devices:\n{here}\n\nTPU v5e-8:\n{there}\n")
    fusion = hlo_line(tpu["3'"], there.ops[0])
    print(fusion)
    print("TPU v5e-8, default effort:", memory_per_device(tpu["3'"]))
    assert found(there) == [("reduce-scatter", (32, 256), 2)]
    assert "calls=%all-reduce-scatter" in fusion
    assert there.estimated_bytes == table_estimate["3'"]  # the cost column of §2's table, for the reduce-scatter

# %% [markdown]
# The four cases on both backends:

# %%
tpu_expected = {"1": [], "2": [("all-gather", (32, 256), 2)], "3": [("all-reduce", (128, 512), 2)],
                "3'": [("reduce-scatter", (32, 256), 2)], "4": [("all-gather", (128, 256), 4)]}
if ok:
    print(f"{'case':<6}{jax.default_backend():<32}{'TPU v5e-8':<32}")
    for name, (*_, compiled) in cases.items():
        here, there = collectives(compiled), collectives(tpu[name])
        print(f"{name:<6}" + "".join(f"{', '.join(f'{op.kind} {op.result_type}' for op in c.ops) or 'none':<32}"
                                      for c in (here, there)))
        assert found(there) == tpu_expected[name]
        if name in ("2", "4"):  # the gathered operand, converted before it moves
            assert all(op.result_type.startswith("bf16[") for op in there.ops)
    exact = jax.jit(lambda a, b: jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST))
    with quiet():
        gathered = collectives(exact.lower(*tpu_args["2"]).compile()).ops
    print("case 2 with precision=HIGHEST:", [op.result_type for op in gathered])
    assert [op.result_type for op in gathered] == ["f32[32,256]"]  # asked for full precision: f32 moves

# %% [markdown]
# The same collectives, shapes and groups, except case 3' (the CPU compiler's exact figures, hidden at the
# end of this section, list the matching cases). The TPU gathers `bf16`, though: it converts
# `f32` matmul operands to `bfloat16` before gathering them, half the bytes. That is its default matmul
# precision at work: with `precision=jax.lax.Precision.HIGHEST` the same gather stays `f32`.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §4: which cases match the TPU program
if ok:
    same = [name for name, (*_, c) in cases.items() if found(collectives(c)) == found(collectives(tpu[name]))]
    print(f"The {jax.default_backend()} and TPU v5e-8 programs have the same collectives (kind, shape, group) "
          f"in cases {', '.join(same)}.")
    if CPU:  # all but 3', which the CPU compiler writes as an all-reduce and a slice
        assert found(collectives(cases["3'"][3])) == [("all-reduce", (32, 512), 2)]
        assert same == [name for name in cases if name != "3'"]

# %% [markdown]
# ## 5. When two inputs disagree, the compiler reshards
#
# When you combine arrays that are sharded differently, propagation picks one sharding for the result,
# and the partitioner then moves whatever does not fit it. For example, add `x` at `P('data', None)` to
# `y` in five layouts.
#
# **Pop quiz.** Before you run the cell: `y` at `P(None, 'data')` cuts its columns over `data`, where
# `x` cuts its rows. Does anything move, and if so, which collective?
#
# <details><summary>Answer</summary>
#
# One all-to-all over `data`, in groups of 4. Each device holds a column block of `y` but needs a row
# block, and both are cut over the same axis, so the 4 devices of each `data` group swap pieces: each
# sends 3 quarters of its block and receives 3 quarters of its new one. No device needs a whole copy,
# so an all-gather would move more than necessary. The cell asserts the all-to-all and its group.
#
# </details>

# %%
x = jax.device_put(X, NamedSharding(mesh, P("data", None)))


def add(x, y):
    return x + y


results = {}
print(f"{'y':<20}{'x + y':<20}{'collectives (result, group)':<52}{'ring estimate':>13}")
for spec in [P("data", "model"), P(), P(None, "model"), P(None, "data"), P("model", None)]:
    y = jax.device_put(X, NamedSharding(mesh, spec))
    compiled = jax.jit(add).lower(x, y).compile()
    s = compiled(x, y)
    col = collectives(compiled)
    results[str(spec)] = (y, s, col)
    shown = ", ".join(f"{op.kind} {op.result_type}/{op.group_size}" for op in col.ops) or "none"
    print(f"{spec!s:<20}{s.sharding.spec!s:<20}{shown:<52}{format_bytes(col.estimated_bytes):>13}")
    assert_close(s, 2 * X)

for spec, out in [("P('data', 'model')", P("data", "model")), ("P()", P("data", None)),
                  ("P(None, 'model')", P("data", "model"))]:
    y, s, col = results[spec]
    assert col.count() == 0 and s.sharding.is_equivalent_to(NamedSharding(mesh, out), 2)  # free: a local slice
assert results["P('model', None)"][1].sharding.is_fully_replicated
assert [(op.kind, op.group_size) for op in results["P(None, 'data')"][2].ops] == [("all-to-all", 4)]
assert results["P('model', None)"][2].kinds == {"all-gather"}  # full copies of both
assert max(results, key=lambda spec: results[spec][2].estimated_bytes) == "P('model', None)"

# %% [markdown]
# | `y` at | what happens | why |
# |---|---|---|
# | `P('data', 'model')`, `P()`, `P(None, 'model')` | nothing moves | every device already holds its block of `y`, or more, so it slices it locally. With `P(None, 'model')` the result takes both cuts, `P('data', 'model')` (the picture below shows why) |
# | `P(None, 'data')` | one all-to-all | `y` cuts columns where `x` cuts rows, over the same axis, so the 4 devices of each `data` group swap pieces until each holds its row block of `y` |
# | `P('model', None)` | two all-gathers, to full copies | both cut rows, but over different axes. Propagation picks neither for the result's rows, so the result is replicated and both inputs are gathered whole: the costliest of the five by the ring estimate |

# %%
y, s, _ = results["P(None, 'model')"]
draw_shardings({"x": x, "y": y, "x + y": s})

# %% [markdown]
# **A constraint beats propagation's tie-break.** That program copies far more than it needs: each device
# holds 32 rows of `x` and 64 of `y`, and on half the mesh those 64 contain the device's 32. The shards say
# which devices:

# %%
y = results["P('model', None)"][0]


def rows(v):
    """Device -> the range of rows its block of v covers."""
    return {sh.device: range(v.shape[0])[sh.index[0]] for sh in v.addressable_shards}


rows_x, rows_y = rows(x), rows(y)
matching = [d for d in mesh.devices.flat if set(rows_x[d]) <= set(rows_y[d])]
print("devices whose rows of y already cover their rows of x:", [d.id for d in matching])
assert len(matching) == mesh.size // 2

# %% [markdown]
# Ask for the result at `P('data', None)`, by `out_shardings` or by `with_sharding_constraint` on `y`, and
# the tie is gone. The program becomes one **collective-permute**, in which each device receives at most
# one `(32, 512)` block. Its group size is 3 because the blocks travel around rings of 3 devices. The ring
# estimate is 64 KiB against 320 KiB, 5 times less. Notebook 05 builds on that.

# %%
def programs(m):
    """The sum on mesh m as propagation leaves it, and with the result's layout asked for in two ways."""
    by_rows = NamedSharding(m, P("data", None))
    return {"propagation": jax.jit(add), "out_shardings": jax.jit(add, out_shardings=by_rows),
            "constraint": jax.jit(lambda x, y: x + jax.lax.with_sharding_constraint(y, by_rows))}


cols = {}
for name, f in programs(mesh).items():
    compiled = f.lower(x, y).compile()
    s = compiled(x, y)
    cols[name] = collectives(compiled)
    print(f"{name}: x + y at {s.sharding.spec}\n{cols[name]}\n")
    assert_close(s, 2 * X)
    assert s.sharding.is_equivalent_to(NamedSharding(mesh, P() if name == "propagation" else P("data", None)), 2)
gathers = [("all-gather", (128, 512), 4), ("all-gather", (128, 512), 2)]  # x over data, y over model
permute = [("collective-permute", (32, 512), 3)]
assert cols["propagation"].estimated_bytes == 5 * cols["constraint"].estimated_bytes
if ok:  # the TPU compiler makes the same choices
    args = [jax.ShapeDtypeStruct(X.shape, X.dtype, sharding=NamedSharding(tpu_mesh, spec))
            for spec in (P("data", None), P("model", None))]
    with quiet():
        on_tpu = [found(collectives(f.lower(*args).compile())) for f in programs(tpu_mesh).values()]
    assert on_tpu == [gathers, permute, permute]

# %% [markdown]
# **A committed input must match `in_shardings`.** `jax.jit(f, in_shardings=...)` fixes the layout an
# argument must have. An array you placed with `device_put` is *committed* to its sharding, and `jit` will not
# reshard it for you: it raises `ValueError`. A NumPy array is placed as asked.

# %%
double_by_columns = jax.jit(lambda v: v * 2, in_shardings=NamedSharding(mesh, P(None, "model")))
raised = []
try:
    double_by_columns(x)  # x is committed to P('data', None)
except ValueError as err:
    raised.append(type(err).__name__)
    print("ValueError:", str(err).split(". Got")[0])
assert raised == ["ValueError"]
assert double_by_columns(X).sharding.is_equivalent_to(NamedSharding(mesh, P(None, "model")), 2)  # NumPy: placed
x_cols = jax.device_put(x, NamedSharding(mesh, P(None, "model")))  # the fix: move it first, outside jit
assert double_by_columns(x_cols).sharding.is_equivalent_to(x_cols.sharding, 2)

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §5: the routes it takes
swap = found(results["P(None, 'data')"][2])  # y at P(None, 'data'): the all-to-all
print(f"On {jax.default_backend()}, y at P(None, 'data') is reached by "
      f"{', '.join(f'an {k} of per-device shape {s} in groups of {g}' for k, s, g in swap)}.")
if CPU:
    assert swap == [("all-to-all", (1, 32, 128), 4)]
    assert found(results["P('model', None)"][2]) == gathers  # x over data, y over model
    assert [found(c) for c in cols.values()] == [gathers, permute, permute]

# %% [markdown]
# ## Takeaways
# - Shardy propagates shardings from the inputs to every value, and then XLA's SPMD partitioner writes
#   each device's program and inserts the collectives. Computation follows data: elementwise ops keep
#   their input's sharding, and `P('data', None) @ P(None, 'model')` gives `P('data', 'model')` with
#   nothing moved.
# - Where the operands of `A @ B` are cut predicts the collective:
#
#   | the contracting dimension `J` is | collective |
#   |---|---|
#   | whole in both | none |
#   | cut in one operand | an all-gather of that operand |
#   | cut in both, by the same axis | a pending sum `{U:axis}`, then an all-reduce (or a reduce-scatter) |
#   | whole, but one axis cuts both `I` and `K` | an all-gather of one operand |
#
#   The compiler still picks the route, so compile and count.
# - The HLO line states the kind, the per-device shape and the replica groups. The groups list mesh
#   positions, in one of several spellings: `[4,2]<=[8]` and `mesh[...] {'axis_1'}` both mean the mesh's
#   rows, a group over `model`. `compiled.memory_analysis()` gives bytes per device. Byte counts from the
#   ring formulas are estimates.
# - The CPU backend writes a reduce-scatter as an all-reduce and a slice; the TPU v5e-8 program has a
#   reduce-scatter, and gathers `f32` matmul operands as `bf16`.
# - When inputs disagree, the compiler reshards: free when each device holds its block, else an all-to-all
#   or full copies. Asking for the result's layout can turn full copies into one collective-permute. A
#   committed input that does not match `in_shardings` raises.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer. The checkers compile on a `(4, 2)` Auto mesh like this one.
#
# **Exercise 1 (predict the collective).** An FSDP layout: activations `x: f32[128, 256]` and weights
# `w: f32[256, 512]`, both at `P(('data', 'model'), None)`, so both cut their first dimension over all 8
# devices. Which collectives does `jax.jit(lambda x, w: x @ w)` insert? Answer with a dict of kind to
# count, e.g. `{'all-reduce': 2}`; leave out kinds that do not occur.

# %%
from spmd_course.exercises import ex04_propagation_resharding as ex

answer_1 = NOT_ANSWERED  # e.g. {"all-gather": 1}
ex.predict_collective.check(answer_1);

# %% [markdown]
# **Exercise 2 (estimate the bytes).** In the program of exercise 1, how many bytes does each device send,
# by the ring-formula estimate? Work it out from the shapes.

# %%
answer_2 = NOT_ANSWERED  # a number of bytes, e.g. 3 / 4 * 65536
ex.predict_bytes.check(answer_2);

# %% [markdown]
# **Exercise 3 (read the replica groups).** A program compiled on the `(4, 2)` mesh contains
# `%all-gather = f32[64,256] all-gather(%wrapped_copy), replica_groups=[2,4]<=[4,2]T(1,0), dimensions={1}`.
# Which devices gather together? Answer with a list of groups of **mesh positions** (0 to 7, in
# `mesh.devices.flat` order, as the program numbers them), e.g. `[{0, 1}, {2, 3}]`.

# %%
answer_3 = NOT_ANSWERED  # a list of sets of mesh positions
ex.read_groups.check(answer_3);

# %% [markdown]
# Propagation decides every layout you leave open. To ask for one yourself inside `jit`, go on to 05.
#
# **Next:** [05 · Asking for a layout: constraints, Auto and Explicit axes](05_constraints_explicit.ipynb)
