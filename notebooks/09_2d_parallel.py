# %% [markdown]
# # 09 · 2-D parallelism: data x model
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/09_2d_parallel.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/09_2d_parallel.ipynb)
#
# Tensor parallelism and data parallelism each put all 8 devices on one axis, so every collective runs
# among all 8. For the course MLP that means an all-reduce of the whole batch's `f32[64,10]` logits
# every step (tensor parallelism), or of all 76,844 bytes of gradients (data parallelism), over links
# that at scale cross the slowest part of the machine.
#
# **You need:** notebooks 04 (the four matmul cases), 07 (data parallelism, the course MLP and its train
# step) and 08 (column- and row-parallel layers); `jax.make_mesh`, `NamedSharding`, `jax.jit`,
# `jax.lax.with_sharding_constraint`, and `collectives` to read a compiled program.
#
# A 2-D mesh keeps each kind of traffic on its own, smaller axis: 8 devices as a `(4, 2)` grid, the
# batch split 4 ways on `data` and every weight matrix 2 ways on `model`.
#
# **You will learn**
# - how to combine `P('data', None)` for the batch with the column/row weight pairing of notebook 08;
# - how to pin the hidden activation to `P('data', 'model')` with `jax.lax.with_sharding_constraint`;
# - how to tell from a compiled program which mesh axis a collective runs over (its group size);
# - what the compiler inserts for `P('data', 'model') @ P(None, 'model')`, and why;
# - how the row-parallel matmul is written on Explicit axes, with `out_sharding=`;
# - that the 2-D train step gives the same losses as one device and as data parallelism.
#
# The strategy in the course's types, forward, then a weight's gradient (`{U:axis}`: partial sums still
# to be added over that axis). Section 4 reads each type from JAX and checks it:
#
# ```
# x: f32[64@data,64] · w1: f32[64,256@model] → h: f32[64@data,256@model] · w2: f32[256@model,10]
#    → f32[64@data,10]{U:model} → all-reduce(model) → f32[64@data,10]
# xᵀ·dh: f32[64,256@model]{U:data} → all-reduce(data) → f32[64,256@model]
# ```

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
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding, reshard
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (
    CHIPS,
    NOT_ANSWERED,
    assert_close,
    collectives,
    draw_mesh,
    draw_sharding,
    draw_shardings,
    estimate_step,
    format_bytes,
    memory_per_device,
    shard_table,
    type_string,
)

# %% [markdown]
# ## 1. A `(4, 2)` mesh, the batch on `data`, the weights on `model`
#
# `jax.make_mesh` arranges the 8 devices as 4 rows of 2. Pass the axis types deliberately, Auto, so the
# compiler propagates shardings (notebook 05 explains the choice).

# %%
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
print(mesh)
draw_mesh(mesh)

# %% [markdown]
# Down a column (`data`, 4 devices) the devices will hold different examples, and across a row (`model`,
# 2 devices) they will hold different halves of each weight matrix. The 2 devices of the first row share
# examples 0 to 15, and the 4 devices of a column (0, 2, 4, 6 on CPU) share the same half of every kernel.
#
# The model, data and train step are notebook 07's, imported from `src/spmd_course/models.py`: an MLP
# `64 -> 256 -> 10` from `nnx.Rngs(0)`, a batch of 64 labelled by a fixed random teacher, cross-entropy
# and Adam, with the model and optimizer donated to the step.

# %%
from spmd_course.models import MLP, train_step, x, y  # notebook 07's model, data and step

# %% [markdown]
# One thing changes inside the MLP: the hidden activation is pinned to `P('data', 'model')`, rows
# (examples) on `data`, hidden units on `model`. `jax.lax.with_sharding_constraint` with a bare `P`
# reads the mesh from `jax.set_mesh`. Everything else is inherited from `MLP`, so both build identical
# parameters from `nnx.Rngs(0)`.

# %%
class MLP2D(MLP):
    def hidden(self, x):
        return jax.lax.with_sharding_constraint(jax.nn.relu(self.linear1(x)), P("data", "model"))

    def __call__(self, x):
        return self.linear2(self.hidden(x))

# %% [markdown]
# The parameters get the column/row pairing of notebook 08, now on a 2-device `model` axis, and the batch is
# split on `data`. Neither spec mentions the other axis, so the weights are replicated down `data` and
# the batch is replicated across `model`:

# %%
layout = {
    "linear1/kernel": P(None, "model"),  # column-parallel
    "linear1/bias": P("model"),
    "linear2/kernel": P("model", None),  # row-parallel
    "linear2/bias": P(),
}

from spmd_course.models import create  # notebook 08's: a model built in its layout, never whole on a device

model_2d = create(lambda: MLP2D(nnx.Rngs(0)), layout, mesh)
x_2d = jax.device_put(x, NamedSharding(mesh, P("data", None)))
y_2d = jax.device_put(y, NamedSharding(mesh, P("data")))

for name, leaf in nnx.to_flat_state(nnx.state(model_2d)):
    print(f"{'/'.join(name):<16}{type_string(leaf[...]):<22}{leaf[...].sharding.shard_shape(leaf.shape)}")
print(f"{'x':<16}{type_string(x_2d):<22}{x_2d.sharding.shard_shape(x.shape)}")
assert model_2d.linear1.kernel[...].sharding.shard_shape((64, 256)) == (64, 128)
assert x_2d.sharding.shard_shape((64, 64)) == (16, 64)
# the same half of linear1/kernel on every device of a mesh column: replicated down `data`
half_on = {r.device: r.index for r in shard_table(model_2d.linear1.kernel[...]).rows}
left, right = mesh.device_ids[:, 0], mesh.device_ids[:, 1]
assert len({half_on[d] for d in left}) == 1 and half_on[left[0]] != half_on[right[0]]

draw_shardings({**{"/".join(n): leaf[...] for n, leaf in nnx.to_flat_state(nnx.state(model_2d))},
                "x": x_2d, "y": y_2d}, ncols=3)

# %% [markdown]
# Each kernel block is drawn with the colours of the 4 devices that hold a copy of it (one column of the
# mesh), and each batch block with the 2 devices of one row.
#
# ## 2. The hidden activation on both axes
#
# Compute just the hidden layer, under `jax.set_mesh` so the constraint's bare `P` finds the mesh:

# %%
with jax.set_mesh(mesh):
    h = jax.jit(lambda model, x: model.hidden(x))(model_2d, x_2d)

print(type_string(h))
assert shard_table(h).shard_shapes == {(16, 128)}  # a different block on every device, nothing replicated
draw_sharding(h)

# %% [markdown]
# `f32[64@data,256@model]`: every device holds a `(16, 128)` block. Is the constraint doing anything?
# Compile the plain `MLP` with the same parameters and compare what it infers:

# %%
model_plain = MLP(nnx.Rngs(0))
nnx.update(model_plain, nnx.state(model_2d))
h_plain = jax.jit(lambda model, x: jax.nn.relu(model.linear1(x)))(model_plain, x_2d)
print("inferred without a constraint:", h_plain.sharding.spec)
assert h_plain.sharding.is_equivalent_to(h.sharding, 2)

# %% [markdown]
# Here the compiler infers the same layout on its own: `x` brings `data` on the rows and the
# column-parallel kernel brings `model` on the columns (no communication). The constraint turns that
# inference into a guarantee, which matters once a model grows and the compiler has several plausible
# choices. Without a mesh in context the bare `P` is an error:

# %%
raised = []
try:
    jax.jit(lambda model, x: model.hidden(x))(model_2d, x_2d)
except RuntimeError as err:
    raised.append(type(err).__name__)
    print(str(err)[:105], "...")
assert raised == ["RuntimeError"]

# %% [markdown]
# ## 3. Which collective does a 2-D matmul need?
#
# > **You will see this online:** a description of the matmul `(batch, d_model) @ (d_model, d_ff)` on
# > this mesh:
# > - Input: `P('data', 'model')`, sharded on both dimensions
# > - Weight: `P(None, 'model')`, sharded along the output
# > - Output: `P('data', 'model')`
# > - "The compiler inserts an all-reduce along the `model` axis for correctness."
#
# Compile exactly that, with `(64, 64) @ (64, 256)`, and list what the compiler inserts:

# %%
w = jax.random.normal(jax.random.key(1), (64, 256))
a_in = jax.device_put(x, NamedSharding(mesh, P("data", "model")))
w_col = jax.device_put(w, NamedSharding(mesh, P(None, "model")))
matmul = jax.jit(lambda a, b: a @ b, out_shardings=NamedSharding(mesh, P("data", "model")))

case2_ops = collectives(matmul.lower(a_in, w_col).compile())
print(case2_ops)
(gather,) = case2_ops.ops
assert gather.kind == "all-gather" and gather.group_size == 2 and np.prod(gather.shapes[0]) == 16 * 64
assert_close(matmul(a_in, w_col), x @ w)

# %% [markdown]
# **No all-reduce: one all-gather** of a `(16, 64)` block, in groups of 2 devices, that is, along
# `model` (the TPU compiler gathers the same 1,024 numbers in bfloat16, its default matmul precision:
# notebook 21). The four matmul cases (notebook 04) predict it. For `A[i, k] @ B[k, j]`, look at the
# contracting dimension `k`:
#
# | case | `k` sharded in | what the compiler does |
# |---|---|---|
# | 1 | neither operand | nothing: every device multiplies its own blocks |
# | 2 | one operand only | **all-gather** that operand's `k` dimension first |
# | 3 | both operands, on the same axis | local partial sums, then **all-reduce** (or reduce-scatter) |
# | 4 | neither, but `i` and `j` on the same axis | all-gather one operand: no output is sharded twice on one axis |
#
# The input `f32[64@data,64@model]` is sharded on `k` over `model`, but the weight `f32[64,256@model]` is not
# (its `model` axis is on the output dimension `j`). That is **case 2**. Each device holds only 32 of the
# 64 input features of its 16 examples, and the other 32 sit on its neighbour in the same mesh row, so the
# 2 devices of each row exchange their halves. After that it is case 1, and the output comes out
# `P('data', 'model')` with no further communication.
#
# An all-reduce appears in **case 3**, when *both* operands are sharded on `k`, for instance with a
# row-parallel weight `P('model', None)`. Leave the output sharding to the compiler this time:

# %%
w_row = jax.device_put(w, NamedSharding(mesh, P("model", None)))
matmul_free = jax.jit(lambda a, b: a @ b)
case3_ops = collectives(matmul_free.lower(a_in, w_row).compile())
out_case3 = matmul_free(a_in, w_row)
print(case3_ops)
print("output:", type_string(out_case3))
assert [(op.kind, op.shapes, op.group_size) for op in case3_ops.ops] == [("all-reduce", ((16, 256),), 2)]
assert_close(out_case3, x @ w)

# %% [markdown]
# Each device multiplies its 32 input features by the matching 32 weight rows, a partial `(16, 256)`
# sum, and the 2 devices of each row add theirs up: an all-reduce along `model`, after which both hold
# `f32[64@data,256]`. The description above is case 3, not its own layout. Its layout is cheaper than it
# claims but not free: an input sharded on its features must be gathered before a column-parallel
# layer. That is why section 1 keeps the *input* replicated across `model` (`P('data', None)`) and
# lets the hidden activation carry `P('data', 'model')`.
#
# **The same matmul on Explicit axes.** There every value's sharding is part of its type, and JAX will
# not guess the layout of a sum split over `model` (all-reduced to whole rows, or reduce-scattered
# over columns?): without `out_sharding=` tracing raises `ShardingTypeError` (notebook 05). Say
# which, and the program is the Auto one's:

# %%
explicit_mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Explicit))
a_explicit = jax.device_put(x, NamedSharding(explicit_mesh, P("data", "model")))
w_explicit = jax.device_put(w, NamedSharding(explicit_mesh, P("model", None)))
row_parallel = jax.jit(lambda a, b: jnp.matmul(a, b, out_sharding=NamedSharding(explicit_mesh, P("data", None))))
explicit_ops = collectives(row_parallel.lower(a_explicit, w_explicit).compile())
print(explicit_ops)
print("output type:", jax.typeof(row_parallel(a_explicit, w_explicit)))
assert [(op.kind, op.shapes, op.group_size) for op in explicit_ops.ops] == [
    (op.kind, op.shapes, op.group_size) for op in case3_ops.ops]  # the same all-reduce along `model`
assert_close(row_parallel(a_explicit, w_explicit), x @ w)

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §3: the gathered block's type
print(f"This compiler gathers {gather.result_type}. The CPU compiler gathers f32[16,64]; the TPU v5e compiler "
      "gathers bf16[2,32,16] (tests/test_tpu_side.py checks the TPU program).")
if CPU:  # the CPU compiler gathers the f32 block as it is; the TPU compiler gathers it as bf16[2,32,16]
    assert gather.result_type == "f32[16,64]"

# %% [markdown]
# ## 4. The compiled train step: which collective runs on which axis
#
# Compile the whole train step, forward, backward and Adam update, for the 2-D layout, and for
# comparison the two 1-D strategies that use all 8 devices for one axis: data parallelism (notebook 07)
# and tensor parallelism (notebook 08).

# %%
with jax.set_mesh(mesh):
    optimizer_2d = nnx.Optimizer(model_2d, optax.adam(1e-2), wrt=nnx.Param)
    compiled_2d = train_step.lower(model_2d, optimizer_2d, x_2d, y_2d).compile()

dp_mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
model_dp = create(lambda: MLP(nnx.Rngs(0)), dict.fromkeys(layout, P()), dp_mesh)
with jax.set_mesh(dp_mesh):
    opt_dp = nnx.Optimizer(model_dp, optax.adam(1e-2), wrt=nnx.Param)
x_dp = jax.device_put(x, NamedSharding(dp_mesh, P("data", None)))
y_dp = jax.device_put(y, NamedSharding(dp_mesh, P("data")))
dp_ops = collectives(train_step.lower(model_dp, opt_dp, x_dp, y_dp).compile())

tp_mesh = jax.make_mesh((8,), ("model",), axis_types=(AxisType.Auto,))
model_tp = create(lambda: MLP(nnx.Rngs(0)), layout, tp_mesh)
with jax.set_mesh(tp_mesh):
    opt_tp = nnx.Optimizer(model_tp, optax.adam(1e-2), wrt=nnx.Param)
everything_on_tp = NamedSharding(tp_mesh, P())
tp_ops = collectives(train_step.lower(model_tp, opt_tp, jax.device_put(x, everything_on_tp),
                                      jax.device_put(y, everything_on_tp)).compile())

step_ops = collectives(compiled_2d)
print(f"{'strategy':<12}{'collective':<12}{'group':>6}{'result bytes':>14}{'ring estimate':>15}")
for strategy, c in (("2-D", step_ops), ("data", dp_ops), ("tensor", tp_ops)):
    for op in c.ops:
        print(f"{strategy:<12}{op.kind:<12}{op.group_size:>6}{op.result_bytes:>14,}"
              f"{format_bytes(op.estimated_bytes):>15}")

# %% [markdown]
# In the 2-D step the collectives are told apart by their group size: a group of 2 devices is a row
# (the `model` axis), a group of 4 a column (the `data` axis).

# %%
along_model = [op for op in step_ops.ops if op.group_size == 2]
along_data = [op for op in step_ops.ops if op.group_size == 4]
assert len(along_model) + len(along_data) == step_ops.count()  # nothing runs over all 8 devices
n_params = 64 * 256 + 256 + 256 * 10 + 10
half_params = 64 * 128 + 128 + 128 * 10 + 10  # what one device holds: half of each kernel and of linear1/bias

# model: the row-parallel layer's partial logits, for this device's 16 examples only
assert [(op.kind, op.shapes) for op in along_model] == [("all-reduce", ((16, 10),))]
assert [(op.kind, op.shapes) for op in tp_ops.ops] == [("all-reduce", ((64, 10),))]  # all 64 examples in 1-D
# data: the gradients of the parameters this device holds, plus the loss
assert {op.kind for op in along_data} == {"all-reduce"}
assert sum(op.result_bytes for op in along_data) == (half_params + 1) * 4
assert dp_ops.result_bytes == (n_params + 1) * 4 == 76_844  # every gradient, in 1-D data parallelism

with jax.set_mesh(mesh):  # the typed chain of the opening, read from the real arrays
    logits = jax.jit(lambda model, x: model(x))(model_2d, x_2d)
chain = [type_string(a) for a in (x_2d, model_2d.linear1.kernel[...], h, model_2d.linear2.kernel[...], logits)]
print(" · ".join(chain))
assert chain == ["f32[64@data,64]", "f32[64,256@model]", "f32[64@data,256@model]", "f32[256@model,10]",
                 "f32[64@data,10]"]  # {U:model}: the all-reduce along model just above

# %% [markdown]
# The gradient line of the opening has a pending sum over `data`, which an Auto mesh never shows as a
# type. An Explicit twin of the mesh does. The kernel's gradient is `xᵀ·dh`, where `dh` is the gradient
# at the hidden layer (`f32[64@data,256@model]`, like `h`). Each device multiplies its 16 examples, so
# `out_sharding=P(None, 'model', unreduced={'data'})` keeps the 4 partial products of each mesh column
# apart, and `reshard` adds them up:

# %%
from spmd_course.models import first_layer_gradient  # notebook 07's

fresh = MLP(nnx.Rngs(0))  # the initial parameters, on one device
dh = first_layer_gradient(fresh, x, y)  # the gradient at the first layer's output
full_dw1 = nnx.jit(nnx.grad(lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()))(fresh)
with jax.set_mesh(explicit_mesh):
    x_rows = jax.device_put(x, NamedSharding(explicit_mesh, P("data", None)))
    dh_blocks = jax.device_put(dh, NamedSharding(explicit_mesh, P("data", "model")))
    dw1_pending = jnp.einsum("bi,bh->ih", x_rows, dh_blocks, out_sharding=P(None, "model", unreduced={"data"}))
    sum_over_data = jax.jit(lambda g: reshard(g, P(None, "model")))
    dw1 = sum_over_data(dw1_pending)
    summed_by = collectives(sum_over_data.lower(dw1_pending).compile())
gradient_chain = (f"xᵀ·dh: {jax.typeof(dw1_pending).str_short(short_dtypes=True)} → "
                  f"{summed_by.ops[0].kind}(data) → {type_string(dw1)}")
print(gradient_chain)
assert gradient_chain == "xᵀ·dh: f32[64,256@model]{U:data} → all-reduce(data) → f32[64,256@model]"
assert [op.group_size for op in summed_by.ops] == [4]  # a mesh column: the data axis
assert_close(dw1, full_dw1["linear1"]["kernel"][...])  # the summed products are the full-batch gradient

# %% [markdown]
# - **Along `model` (groups of 2):** the all-reduce of notebook 08's pairing, but only for this device's
#   16 examples: `f32[16,10]` instead of `f32[64,10]`, among 2 devices instead of 8.
# - **Along `data` (groups of 4):** data parallelism's gradient all-reduce, but only for the half of
#   the parameters this device holds, among 4 devices instead of 8.
#
# Each axis carries less than the 1-D strategy it comes from. In this small example the total of their
# results lands between the two. The real gain is on big machines, whose mesh is laid out so that the
# chatty `model` axis stays inside a node, on the fastest links, and only the once-per-step gradient
# traffic crosses nodes. Simulated devices have no nodes to show this, and notebook 23 builds such a
# mesh.
#
# ### The cost line, one per axis (an estimate)
#
# Under the chain of the opening, notebook 07's cost line, with one communication line per axis. At a
# TPU v5e chip's published rates, `C` = 197 TFLOP/s and `W` = 50 GB/s along each axis (axes of 4 and 2
# chips are lines on a v5e). With `N` parameters, `D` devices on `data`, `M` on `model` and `t`
# examples per row of the mesh (64 / `D` = 16), per device:
#
# | part | formula | why |
# |---|---|---|
# | compute | `(4t·W1 + 6t·W2) / M / C` | notebook 07's matmuls for this row's `t` examples, over `1/M` of the hidden units |
# | over `model` | `2(M-1)/M · 4·10t / W` | the all-reduce of the row's `[t, 10]` partial logits (notebook 08's pairing) |
# | over `data` | `2(D-1)/D · 4(N/M + 1) / W` | the all-reduce of the gradients this device holds, about half of them, and the loss |
#
# Each axis obeys the rule of the 1-D strategy it comes from, with its own size: the gradient sum over
# `data` hides when `t > (4/3)(D-1)/D · C/W` (notebook 07's rule, `D` for `n`), and the sums over
# `model` follow notebook 08's rule with `M`. So a 2-D mesh lets you pick each axis's size against its
# own rule. The bytes are checked against the compiled step's collectives here, and the FLOPs and each
# axis's seconds against `estimate_step` in the hidden cell at the end of this section.

# %%
V5E = CHIPS["v5e"]
C = V5E.peak_flops  # 197e12 FLOP/s
D, M = mesh.shape["data"], mesh.shape["model"]
W = {"data": V5E.axis_bandwidth(D, D), "model": V5E.axis_bandwidth(M, M)}  # 50e9 B/s each: lines
t, W1, W2 = 64 // D, 64 * 256, 256 * 10
flops_2d = (4 * t * W1 + 6 * t * W2) // M
sent_2d = {"model": 2 * (M - 1) / M * 4 * 10 * t, "data": 2 * (D - 1) / D * 4 * (half_params + 1)}
print(f"cost line (estimate, v5e rates): compute {flops_2d:,} FLOPs / C = {flops_2d / C * 1e9:.1f} ns; "
      + "; ".join(f"over {axis} {b:,.0f} B / W = {b / W[axis] * 1e6:.3f} µs" for axis, b in sent_2d.items()))
assert np.isclose(sum(op.estimated_bytes for op in along_model), sent_2d["model"])  # the compiled step's
assert np.isclose(sum(op.estimated_bytes for op in along_data), sent_2d["data"])  # ring estimates, per axis
assert round(sent_2d["data"] / sent_2d["model"]) == 90  # here the gradient sum over data dominates

# %% [markdown]
# Here the gradient sum over `data` costs about 90 times the logits' sum over `model`, because this
# MLP's output is only 10 wide, while a transformer's `model` sums carry `[t, d]` activations in every
# layer. Both dwarf the 3.3 ns of compute, for the reason notebook 07 gave: 16 examples per row are far
# below the thousands the rule asks for.
#
# Per device, the step's arguments are the parameters, Adam's two moments (laid out like the
# parameters), two 4-byte counters and this device's quarter of the batch:

# %%
params_per_device = sum(shard_table(leaf[...]).bytes_per_device[0]
                        for _, leaf in nnx.to_flat_state(nnx.state(model_2d)))
memory = memory_per_device(compiled_2d)
print(f"parameters per device: {params_per_device} B of {n_params * 4} B")
print(memory)
assert params_per_device == half_params * 4
assert memory.alias >= 3 * params_per_device  # model and Adam state donated, updated in place

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §4: the step's arguments, byte for byte, and the cost line
time_2d = estimate_step(compiled_2d, mesh, chip="v5e")  # this program, timed op by op at a v5e chip's rates
seconds_2d = {axis: sum(op.seconds * op.trips for op in time_2d.timeline if op.lane == axis) for axis in sent_2d}
print(f"estimate_step reads {time_2d.flops:,.0f} matmul FLOPs (formula: {flops_2d:,}) and "
      + ", ".join(f"{seconds_2d[axis] * 1e6:.3f} µs over {axis} (formula: {b / W[axis] * 1e6:.3f})"
                  for axis, b in sent_2d.items()) + " from this compiler's program.")
print(f"This compiler's step takes {memory.argument:,} B of arguments and aliases {memory.alias:,} B of them. "
      "On the CPU compiler these are exact sums; accelerators pad small arrays.")
if CPU:  # exact sizes of the CPU compiler (accelerators pad small arrays)
    assert memory.argument == 3 * params_per_device + 8 + 16 * 64 * 4 + 16 * 4
    assert memory.alias == 3 * params_per_device + 8  # model and Adam state donated, updated in place
    # the cost line, op by op: a GPU's matmuls are library calls that carry no FLOP count, so CPU only
    assert time_2d.flops == flops_2d  # every matmul of the compiled step, counted from its shapes
    for axis, b in sent_2d.items():
        assert np.isclose(seconds_2d[axis], b / W[axis]), axis  # each axis's sums at the v5e's rate

# %% [markdown]
# ## 5. Training: one device, data parallel, 2-D
#
# Five steps each, from the same initial parameters: the single-device reference, data parallelism on
# the 1-D `data` mesh, and the 2-D layout.

# %%
reference = MLP(nnx.Rngs(0))
opt_ref = nnx.Optimizer(reference, optax.adam(1e-2), wrt=nnx.Param)
losses_ref = [float(train_step(reference, opt_ref, x, y)) for _ in range(5)]
losses_dp = [float(train_step(model_dp, opt_dp, x_dp, y_dp)) for _ in range(5)]
with jax.set_mesh(mesh):
    losses_2d = [float(train_step(model_2d, optimizer_2d, x_2d, y_2d)) for _ in range(5)]

print("single device:", np.round(losses_ref, 4))
print("data parallel:", np.round(losses_dp, 4))
print("2-D:          ", np.round(losses_2d, 4))
assert_close(losses_dp, losses_ref)
assert_close(losses_2d, losses_ref)
assert losses_2d[-1] < losses_2d[0] / 5
for trained in (model_dp, model_2d):  # the trained parameters too, gathered to the host
    for leaf, ref in zip(jax.tree.leaves(nnx.state(trained, nnx.Param)),
                         jax.tree.leaves(nnx.state(reference, nnx.Param)), strict=True):
        assert_close(leaf, ref, atol=RTOL)

# %% [markdown]
# Three layouts, one result: the same losses and the same trained parameters. And the 2-D parameters
# kept their layout through training:

# %%
for name, leaf in nnx.to_flat_state(nnx.state(model_2d)):
    assert leaf[...].sharding.is_equivalent_to(NamedSharding(mesh, layout["/".join(name)]), leaf.ndim), name
print("every parameter still has its 2-D layout")

# %% [markdown]
# ## Takeaways
# - A 2-D mesh combines the strategies by axis: the batch on `data` (`P('data', None)`), the weights on
#   `model` with the column/row pairing. Each device holds a quarter of the batch and half of each kernel.
# - `jax.lax.with_sharding_constraint(h, P('data', 'model'))` pins an activation to both axes, and under
#   `jax.set_mesh` a bare `P` is enough.
# - In the compiled step each collective runs along one axis, visible as its group size: the activation
#   all-reduce in groups of 2 (`model`), the gradient all-reduce in groups of 4 (`data`), each carrying
#   less than in the 1-D strategy it comes from.
# - `P('data', 'model') @ P(None, 'model')` needs an **all-gather** of the input (case 2), not an
#   all-reduce. An all-reduce appears when both operands are sharded on the contracting dimension (case 3).
# - Sharding changes where numbers live, not what they are: one device, data parallel and 2-D give the
#   same losses.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** On a `(4, 2)` `data` x `model` mesh with this layout, how many devices take part in
# each group of the *gradient* all-reduce?

# %%
from spmd_course.exercises import ex09_2d_parallel as ex

answer_1 = NOT_ANSWERED  # a whole number
ex.gradient_group_size.check(answer_1);

# %% [markdown]
# **Exercise 2.** Write the spec you would pass to `jax.lax.with_sharding_constraint` so that the hidden
# activation `(64, 256)` has its examples split on `data` and its hidden units split on `model`.

# %%
answer_2 = NOT_ANSWERED  # e.g. P(...)
ex.activation_spec.check(answer_2);

# %% [markdown]
# **Exercise 3.** Predict, then check: on the `(4, 2)` Auto mesh, `x` is `P('data', None)` (`(64, 64)`)
# and `w` is `P('model', None)` (`(64, 256)`). Which collective does the compiler insert for `x @ w`?
# Answer `'all-reduce'`, `'all-gather'`, `'reduce-scatter'`, `'all-to-all'`, `'collective-permute'` or
# `'none'`.

# %%
answer_3 = NOT_ANSWERED  # a string such as 'all-gather'
ex.replicated_input_collective.check(answer_3);

# %% [markdown]
# **Next:** [10 · FSDP](10_fsdp.ipynb)
