# %% [markdown]
# # 04 · Propagation and resharding
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/04_propagation_resharding.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/04_propagation_resharding.ipynb)
#
# Inside `jax.jit` every intermediate and output gets a sharding, though you only sharded the inputs,
# and wherever two shardings disagree the compiler moves data. This notebook predicts those decisions,
# compiles, and checks the prediction against the collectives in the compiled program and the bytes they
# move. Then it shows how to ask for a different layout inside `jit`: the way the seed guide suggests
# silently does nothing on an Auto mesh, and you will see what works instead.
#
# **You will learn**
# - why "computation follows data": elementwise ops keep their input's sharding, and a matmul's output
#   sharding follows from its operands';
# - the four matmul cases that predict which collective `C = A @ B` needs (none, all-gather, all-reduce or
#   reduce-scatter, all-gather of one side), and the bytes each one moves per device;
# - what the compiler inserts when two inputs disagree, and the error you get when a committed input does
#   not match `in_shardings`;
# - why `jax.device_put` inside `jit` does not reshard on an Auto mesh, and what does:
#   `jax.lax.with_sharding_constraint` on Auto axes, `jax.reshard` on Explicit axes;
# - how Explicit axes put the sharding in the type (`float32[128@data,512]`) and turn an ambiguous
#   matmul into a `ShardingTypeError` that `out_sharding=` resolves.

# %%
# Setup (the same cell opens every notebook; notebook 00 explains it).
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

launch.prepare_runtime()  # Colab: installs what is missing. Binder: shows the memory in use. Elsewhere: nothing.
SETUP = setup_devices(8)

# %% [markdown]
# ## 1. Computation follows data
#
# Until section 6, every mesh here has **Auto** axes: the compiler (Shardy, the partitioner behind
# `jax.jit`) decides every sharding you did not fix. Build the `(4, 2)` mesh of this course with its axis
# types spelled out:

# %%
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import NOT_ANSWERED, collectives, draw_shardings, format_bytes, tile_labels, type_string

mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
print(mesh)
assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)

# %% [markdown]
# An elementwise function touches each element on its own, so every device can compute its block of the
# output from its block of the input. The compiler therefore gives the output the input's sharding and
# inserts no communication. Check it for three layouts of a `(128, 512)` array. Compare shardings with
# `is_equivalent_to(other, ndim)`, not `spec ==`: the compiler may report `P('data', None)` as
# `P('data',)`, which is the same layout but not an equal `PartitionSpec`.

# %%
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
    np.testing.assert_allclose(np.asarray(y), np.tanh(X) * 2.0 + 1.0, rtol=1e-5, atol=1e-6)

# %% [markdown]
# Outside `jit` the same holds: eager operations run on the devices that hold the data, block by block.

# %%
y_eager = jnp.tanh(x) * 2.0 + 1.0
print(type_string(x), "->", type_string(y_eager))
assert y_eager.sharding.is_equivalent_to(x.sharding, x.ndim)

# %% [markdown]
# ## 2. A matmul's output sharding follows from its operands
#
# The seed guide's "Constraint Propagation" example says:
#
# > If `x: P('data', None)` and `w: P(None, 'model')`, then output: `P('data', 'model')`. No need to specify
# > output sharding!
#
# Reason it out before you run it. `x` is cut into row blocks over `data`, `w` into column blocks over
# `model`. Device `(d, m)` holds rows block `d` of `x` in full and columns block `m` of `w` in full, which is
# everything it needs for block `(d, m)` of the product. So the output should be `P('data', 'model')`, and
# no device needs anything from another: **no collectives**.

# %%
I, J, K = 128, 256, 512  # noqa: E741  C[I, K] = A[I, J] @ B[J, K]; J is the contracting dimension
A = rng.standard_normal((I, J)).astype(np.float32)
B = rng.standard_normal((J, K)).astype(np.float32)
C_ref = A @ B


def matmul(a, b):
    return a @ b


a = jax.device_put(A, NamedSharding(mesh, P("data", None)))
b = jax.device_put(B, NamedSharding(mesh, P(None, "model")))
compiled = jax.jit(matmul).lower(a, b).compile()
c = compiled(a, b)

print(type_string(a), "@", type_string(b), "->", type_string(c))
print(collectives(compiled))
assert c.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2)
assert collectives(compiled).count() == 0
np.testing.assert_allclose(np.asarray(c), C_ref, rtol=1e-4, atol=1e-4)

# %% [markdown]
# The seed's claim holds. In pictures: the row blocks of `A` and the column blocks of `B` meet in the
# `(32, 256)` blocks of `C`, one per device.

# %%
fig = draw_shardings({"A": a, "B": b, "C = A @ B": c})
labels = tile_labels(fig)  # panel by panel: A's 4 blocks, B's 2, then C's
assert len(labels) == 4 + 2 + 8
assert all("(32, 256)" in label for label in labels[-8:])  # C: 8 distinct (32, 256) blocks, one per device
fig

# %% [markdown]
# ## 3. The four matmul cases: predict, compile, check
#
# For `C = A @ B` with `A: [I, J]`, `B: [J, K]`, what the compiler must move depends only on where the
# **contracting dimension** `J` is cut:
#
# | case | layout | what must happen |
# |---|---|---|
# | 1 | no operand is sharded along `J` | each device multiplies its own blocks: **no communication** |
# | 2 | one operand is sharded along `J`, the other is not | **all-gather** that operand along `J` first |
# | 3 | both are sharded along `J` by the same mesh axis | local partial products, then **all-reduce** them (a **reduce-scatter** if the output must stay sharded) |
# | 4 | both are sharded by the same mesh axis on their *non*-contracting dims (`I` and `K`) | the output cannot be sharded twice by one axis, so **all-gather one operand** |
#
# The textbook cost per device (ring algorithms, group of `N` devices): an all-gather sends
# `(N-1)/N x` the bytes it produces, an all-reduce `2(N-1)/N x` its bytes, a reduce-scatter `(N-1)/N x`
# its input. `collectives(compiled)` reads each collective's per-device result size (`result_bytes`),
# group size and `estimated_bytes` from the compiled program; each cell below checks them against the formula
# worked out by hand. Section 2 was case 1; record it for the summary table:

# %%
cases = []  # one row per case, for the summary table at the end of this section
cases.append(("1", P("data", None), P(None, "model"), c, collectives(compiled), 0))

# %% [markdown]
# **Case 2: one side sharded on `J`.** The seed guide's "2D parallelism" section puts activations at
# `P('data', 'model')` and weights at `P(None, 'model')` and says: "Compiler inserts all-reduce along
# 'model' axis". Predict with the table instead. `A`'s `J` is cut over `model`, `B`'s `J` is whole: case 2.
# Each device must first gather `A`'s two `J`-halves along `model` (a group of `N = 2`), giving a
# `(32, 256)` block: 32 KiB produced, `(2-1)/2 x 32 KiB = 16 KiB` sent. Then it multiplies locally, and the
# output is `P('data', 'model')`.

# %%
a = jax.device_put(A, NamedSharding(mesh, P("data", "model")))
b = jax.device_put(B, NamedSharding(mesh, P(None, "model")))
compiled = jax.jit(matmul).lower(a, b).compile()
c = compiled(a, b)
col = collectives(compiled)
print(type_string(a), "@", type_string(b), "->", type_string(c))
print(col)

N = 2
assert col.counts["all-gather"] == 1 and col.count() == 1  # an all-gather, and no all-reduce
(op,) = col.ops
assert (op.group_size, op.result_bytes) == (N, 32 * 256 * 4)
assert op.estimated_bytes == (N - 1) / N * (32 * 256 * 4) == 16 * 1024
assert c.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2)
np.testing.assert_allclose(np.asarray(c), C_ref, rtol=1e-4, atol=1e-4)
cases.append(("2", P("data", "model"), P(None, "model"), c, col, (N - 1) / N * (32 * 256 * 4)))

# %% [markdown]
# The seed gets the output sharding right and the collective wrong: the compiled program gathers the
# activations and all-reduces nothing. An all-reduce is what case 3 needs.
#
# **Case 3: both sides sharded on `J` by the same axis.** This is the second layer of a tensor-parallel
# MLP: `A` at `P(None, 'model')`, `B` at `P('model', None)`. Each device holds matching halves of `J`, so it
# can compute a partial product of the full `(128, 512)` shape; the true `C` is the sum of the two partial
# products. Prediction: one all-reduce over `model` (`N = 2`) of `128 x 512 x 4 = 256 KiB`, sending
# `2(2-1)/2 x 256 KiB = 256 KiB`, and a replicated output.

# %%
a = jax.device_put(A, NamedSharding(mesh, P(None, "model")))
b = jax.device_put(B, NamedSharding(mesh, P("model", None)))
compiled = jax.jit(matmul).lower(a, b).compile()
c = compiled(a, b)
col = collectives(compiled)
print(type_string(a), "@", type_string(b), "->", type_string(c))
print(col)

N = 2
assert col.counts["all-reduce"] == 1 and col.count() == 1
(op,) = col.ops
assert (op.group_size, op.result_bytes) == (N, I * K * 4)
assert op.estimated_bytes == 2 * (N - 1) / N * (I * K * 4) == 256 * 1024
assert c.sharding.is_fully_replicated
np.testing.assert_allclose(np.asarray(c), C_ref, rtol=1e-4, atol=1e-4)
cases.append(("3", P(None, "model"), P("model", None), c, col, 2 * (N - 1) / N * (I * K * 4)))

# %% [markdown]
# **Case 3 with a sharded output.** Now add `data` to `A`'s rows and ask for `C` at `P('data', 'model')`
# with `jax.lax.with_sharding_constraint` (section 5 says more about it). Each device's partial product is
# `(32, 512)`, but it keeps only a `(32, 256)` block of the sum: a reduce-scatter's job, which sends
# `(N-1)/N x` its input, half of what an all-reduce sends.
#
# The CPU backend shows you the two steps the partitioner wrote: an **all-reduce** of the `(32, 512)`
# partial products, then a local `dynamic-slice` that keeps each device's half. GPU and TPU compilers run a
# pass that fuses that pair into one `reduce-scatter`; the CPU compiler does not, so on CPU the cost is the
# all-reduce's.

# %%
a = jax.device_put(A, NamedSharding(mesh, P("data", "model")))
b = jax.device_put(B, NamedSharding(mesh, P("model", None)))


def matmul_to_data_model(a, b):
    return jax.lax.with_sharding_constraint(a @ b, NamedSharding(mesh, P("data", "model")))


compiled = jax.jit(matmul_to_data_model).lower(a, b).compile()
c = compiled(a, b)
col = collectives(compiled)
print(type_string(a), "@", type_string(b), "->", type_string(c))
print(col)

N = 2
(op,) = col.ops
assert op.kind == "all-reduce" and (op.group_size, op.result_bytes) == (N, 32 * 512 * 4)
assert c.sharding.shard_shape(c.shape) == (32, 256)  # each device keeps half of what was reduced
assert "dynamic-slice" in compiled.as_text()  # ... cut out locally after the all-reduce
reduce_scatter_bytes = (N - 1) / N * (32 * 512 * 4)  # what a fused reduce-scatter would send
assert op.estimated_bytes == 2 * (N - 1) / N * (32 * 512 * 4) == 2 * reduce_scatter_bytes
print(f"all-reduce + slice sends {format_bytes(op.estimated_bytes)}; a reduce-scatter would send "
      f"{format_bytes(reduce_scatter_bytes)}")
np.testing.assert_allclose(np.asarray(c), C_ref, rtol=1e-4, atol=1e-4)
cases.append(("3'", P("data", "model"), P("model", None), c, col, 2 * (N - 1) / N * (32 * 512 * 4)))

# %% [markdown]
# **Case 4: both sides sharded by the same axis, on non-contracting dims.** `A` at `P('data', None)` cuts
# `I` over `data`; `B` at `P(None, 'data')` cuts `K` over `data`. The output would be `P('data', 'data')`,
# which is illegal: a mesh axis can cut only one dimension. So one operand must be gathered along `data`
# (`N = 4`). Gathering `A` (128 KiB) costs less than gathering `B` (512 KiB); predict that the compiler
# gathers `A`, sends `(4-1)/4 x 128 KiB = 96 KiB`, and keeps `B`'s layout for the output: `P(None, 'data')`.

# %%
a = jax.device_put(A, NamedSharding(mesh, P("data", None)))
b = jax.device_put(B, NamedSharding(mesh, P(None, "data")))
compiled = jax.jit(matmul).lower(a, b).compile()
c = compiled(a, b)
col = collectives(compiled)
print(type_string(a), "@", type_string(b), "->", type_string(c))
print(col)

N = 4
(op,) = col.ops
assert op.kind == "all-gather" and op.group_size == N
assert op.result_bytes == A.nbytes  # the whole of A lands on every device
assert op.estimated_bytes == (N - 1) / N * A.nbytes == 96 * 1024
assert c.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "data")), 2)
np.testing.assert_allclose(np.asarray(c), C_ref, rtol=1e-4, atol=1e-4)
cases.append(("4", P("data", None), P(None, "data"), c, col, (N - 1) / N * A.nbytes))

# %% [markdown]
# The summary, printed from the measurements above. The last column is the formula you worked out by
# hand; the one before it is what the compiled programs send.

# %%
print(f"{'case':<5}{'A':<20}{'B':<20}{'C':<25}{'collectives':<14}{'moved':>10}{'formula':>10}")
for name, spec_a, spec_b, out, col, formula in cases:
    kinds = ", ".join(f"{n} {k}" for k, n in col.counts.items() if n) or "none"
    print(f"{name:<5}{spec_a!s:<20}{spec_b!s:<20}{type_string(out):<25}{kinds:<14}"
          f"{format_bytes(col.estimated_bytes):>10}{format_bytes(formula):>10}")
    assert col.estimated_bytes == formula
assert [sorted(col.kinds) for *_, col, _ in cases] == [[], ["all-gather"], ["all-reduce"], ["all-reduce"],
                                                       ["all-gather"]]

# %% [markdown]
# **Rules of thumb, not laws.** The table says what *must* move; the compiler picks *how*, and you only
# know by compiling. Two layouts where it did something you might not predict:
#
# - `A: P('data', None) @ B: P('model', None)` looks like case 2 (only `B` is cut along `J`), which
#   suggests gathering `B`. But `A`'s `J` is whole on every device, so each device can take the `J`-half
#   that matches its `B` half for free, which turns it into case 3. The compiler does that and all-reduces
#   a `(32, 512)` partial product (64 KiB sent) instead of gathering `B` (256 KiB sent).
# - `A: P('model', None) @ B: P(None, 'model')` is case 4 on the `model` axis. Gathering `A` along `model`
#   would send 64 KiB. The compiled program first moves 32-row pieces of `A` with a `collective-permute`,
#   then all-gathers along `data` (4 devices): 128 KiB in all.

# %%
a = jax.device_put(A, NamedSharding(mesh, P("data", None)))
b = jax.device_put(B, NamedSharding(mesh, P("model", None)))
col = collectives(jax.jit(matmul).lower(a, b).compile())
print(f"{type_string(a)} @ {type_string(b)}\n{col}\n")
assert col.kinds == {"all-reduce"} and col.ops[0].result_bytes == 32 * 512 * 4
assert col.estimated_bytes < (2 - 1) / 2 * B.nbytes  # cheaper than all-gathering B along model

a = jax.device_put(A, NamedSharding(mesh, P("model", None)))
b = jax.device_put(B, NamedSharding(mesh, P(None, "model")))
col = collectives(jax.jit(matmul).lower(a, b).compile())
print(f"{type_string(a)} @ {type_string(b)}\n{col}")
assert col.kinds == {"collective-permute", "all-gather"}
assert col.estimated_bytes == 128 * 1024 > (2 - 1) / 2 * A.nbytes  # more than one all-gather along model

# %% [markdown]
# ## 4. When two inputs disagree, the compiler reshards
#
# Inside `jit`, nothing stops you from combining arrays with different shardings: the compiler picks a
# layout for the result and moves whatever does not fit. Sometimes that is free. `x` at `P('data', None)`
# plus `y` at `P(None, 'model')`: device `(d, m)` holds row block `d` of `x` and column block `m` of `y`,
# both contain block `(d, m)`, so each device cuts that block out of what it has. Predict: output
# `P('data', 'model')`, no collectives.

# %%
x = jax.device_put(X, NamedSharding(mesh, P("data", None)))
y = jax.device_put(X, NamedSharding(mesh, P(None, "model")))


def add(x, y):
    return x + y


compiled = jax.jit(add).lower(x, y).compile()
s = compiled(x, y)
print(type_string(x), "+", type_string(y), "->", type_string(s))
assert s.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2)
assert collectives(compiled).count() == 0
np.testing.assert_allclose(np.asarray(s), 2 * X, rtol=1e-6)
fig = draw_shardings({"x": x, "y": y, "z = x + y": s})  # panels come in the names' sorted order
assert all("(32, 256)" in label for label in tile_labels(fig)[-8:])  # z: one (32, 256) block per device
fig

# %% [markdown]
# Change `y` to `P('model', None)`: now both operands cut the rows, over different axes, and no device
# holds matching blocks. The compiler gathers **both** to full copies and adds replicated arrays: an
# all-gather over `data` (`3/4 x 256 KiB`) plus one over `model` (`1/2 x 256 KiB`), 320 KiB sent per device.

# %%
z = jax.device_put(X, NamedSharding(mesh, P("model", None)))
compiled = jax.jit(add).lower(x, z).compile()
s = compiled(x, z)
col = collectives(compiled)
print(type_string(x), "+", type_string(z), "->", type_string(s))
print(col)
assert col.counts["all-gather"] == 2 and col.count() == 2
assert sorted(op.group_size for op in col.ops) == [2, 4]
assert col.estimated_bytes == 3 / 4 * X.nbytes + 1 / 2 * X.nbytes == 320 * 1024
assert s.sharding.is_fully_replicated

# %% [markdown]
# **Pinned input shardings.** `in_shardings=` tells `jit` the layout an argument must have. An array you
# placed yourself with `device_put` is *committed* to its sharding, and `jit` refuses to move it for you:
# `ValueError: Sharding passed to jit does not match the sharding on the respective arg`. A NumPy array
# (or any uncommitted input) is simply transferred with the requested layout.

# %%
double_by_columns = jax.jit(lambda v: v * 2, in_shardings=NamedSharding(mesh, P(None, "model")))
raised = []
try:
    double_by_columns(x)  # x is committed to P('data', None)
except ValueError as err:
    raised.append(type(err).__name__)
    print("ValueError:", str(err).split(". Got")[0])
assert raised == ["ValueError"]

from_numpy = double_by_columns(X)  # uncommitted: placed as P(None, 'model') on the way in
assert from_numpy.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "model")), 2)

# The fix: move the committed array first (an eager device_put outside jit does reshard), then call.
x_cols = jax.device_put(x, NamedSharding(mesh, P(None, "model")))
assert double_by_columns(x_cols).sharding.is_equivalent_to(x_cols.sharding, 2)
print("after device_put:", type_string(x_cols))

# %% [markdown]
# ## 5. Asking for a layout inside `jit`
#
# ### Gotcha: `device_put` inside `jit` does not reshard
#
# The seed guide's "Resharding Arrays" section claims "JAX automatically reshard arrays when needed" with
# this function, and that "JAX inserts collective operations to reshard". On the course's mesh `P('model')`
# means: rows cut over `model`. Run it as written:

# %%
x_data = jax.device_put(X, NamedSharding(mesh, P("data")))


@jax.jit
def process(x):
    # Automatic reshard! (the seed's comment)
    y = jax.device_put(x, NamedSharding(mesh, P("model")))
    return y * 2


result = process(x_data)
print("asked for:", type_string(X.shape, NamedSharding(mesh, P("model"))))
print("got:      ", type_string(result))
lowered_text = process.lower(x_data).as_text()
assert result.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None)), 2)  # still P('data', None)
assert not result.sharding.is_equivalent_to(NamedSharding(mesh, P("model", None)), 2)
assert "sharding_constraint" not in lowered_text  # nothing in the program asks for P('model')
assert collectives(process.lower(x_data).compile()).count() == 0  # nothing moved
np.testing.assert_allclose(np.asarray(result), 2 * X, rtol=1e-6)  # the values are right, only the layout is not


# %% [markdown]
# The values are right, but the layout never changed. On an Auto mesh, `jax.device_put` inside a traced
# function lowers to nothing (the lowered program above holds no sharding op), so the compiler never hears
# about `P('model')`. Outside `jit`, `device_put` moves data (section 4 used that); inside, use one of the
# tools below.
#
# ### Fix on Auto axes: `jax.lax.with_sharding_constraint`
#
# A sharding constraint pins the layout of one intermediate value; propagation and resharding work around
# it. Going from row blocks over `data` (32 rows) to row blocks over `model` (64 rows), each device gets
# its 64 rows from two devices: the compiled program moves 32-row pieces with a `collective-permute`,
# then all-gathers pairs along `model`.

# %%
@jax.jit
def process_fixed(x):
    y = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("model")))
    return y * 2


lowered = process_fixed.lower(x_data)
assert "sharding_constraint" in lowered.as_text()  # this time the program carries the request
compiled = lowered.compile()
result = compiled(x_data)
col = collectives(compiled)
print("got:", type_string(result))
print(col)
assert result.sharding.is_equivalent_to(NamedSharding(mesh, P("model", None)), 2)
assert result.sharding.shard_shape(result.shape) == (64, 512)
assert col.kinds == {"collective-permute", "all-gather"}
np.testing.assert_allclose(np.asarray(result), 2 * X, rtol=1e-6)
fig = draw_shardings({"in: x_data": x_data, "out: process_fixed(x_data)": result})
assert tile_labels(fig)[-2:] == ["dev 0,2,4,6\n(64, 512)\n128.0 KiB\n4 copies", "dev 1,3,5,7\n(64, 512)\n128.0 KiB\n4 copies"]
fig

# %% [markdown]
# **What a reshard costs depends on the pair of layouts.** Constrain the same `P('data', None)` array to
# five targets and measure each program:
#
# - `P('data', 'model')` only narrows each block: every device slices locally, nothing is sent;
# - `P(None, 'data')` swaps which dimension `data` cuts: one **all-to-all** among the 4 devices of each
#   `data` group, each sending 3 of its 4 pieces;
# - `P(None, 'model')` moves the cut to the other dimension *and* axis: the partitioner finds no direct
#   route, gathers the **whole array** on every device and slices it. XLA's C++ code says so on the
#   process's stderr: `[SPMD] Involuntary full rematerialization. The compiler cannot go from sharding ...
#   to ... efficiently`. That warning is the one to look for in real programs: it means a full copy of a
#   tensor on every device. Jupyter shows it in the cell or only in the terminal that runs the server,
#   depending on the setup, so the cell below catches it from file descriptor 2 to check it;
# - `P()` replicates: one all-gather of the whole array, asked for, so no warning.

# %%
import re

from utils import compile_with_log  # lowered.compile(), plus what XLA's C++ code wrote to stderr meanwhile

targets = {
    "P('data', 'model')": (P("data", "model"), set(), 0),
    "P(None, 'data')": (P(None, "data"), {"all-to-all"}, 3 / 4 * (X.nbytes // 4)),
    "P('model', None)": (P("model", None), {"collective-permute", "all-gather"}, 128 * 1024),
    "P(None, 'model')": (P(None, "model"), {"all-gather"}, 3 / 4 * X.nbytes),
    "P()": (P(), {"all-gather"}, 3 / 4 * X.nbytes),
}
warned = []
print(f"{'P(data, None) ->':<20}{'collectives':<36}{'moved':>10}")
for name, (spec, kinds, moved) in targets.items():
    reshard_to = lambda v, spec=spec: jax.lax.with_sharding_constraint(v, NamedSharding(mesh, spec))
    compiled, log = compile_with_log(jax.jit(reshard_to).lower(x))
    col = collectives(compiled)
    print(f"{name:<20}{', '.join(sorted(col.kinds)) or 'none':<36}{format_bytes(col.estimated_bytes):>10}")
    assert col.kinds == kinds and col.estimated_bytes == moved
    assert compiled(x).sharding.is_equivalent_to(NamedSharding(mesh, spec), 2)
    if "Involuntary full rematerialization" in log:
        warned.append(name)
        full_copy, warning = col.ops[0], log
assert warned == ["P(None, 'model')"]
assert full_copy.result_bytes == X.nbytes  # the full rematerialization: all 256 KiB on every device
print("\nstderr while compiling the P(None, 'model') reshard (the key sentences):")
print(" ", re.search(r"\[SPMD\] Involuntary full rematerialization\.", warning).group())
print(" ", re.search(r"As the last resort.*?inefficient\.", warning).group())

# %% [markdown]
# ### On Explicit axes: `jax.reshard`
#
# On a mesh whose axes are **Explicit**, a sharding is part of the array's type (section 6), and the tool
# that changes it is `jax.reshard`, inside or outside `jit`. It is rejected on Auto axes, with an error that
# says why.

# %%
emesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
xe = jax.device_put(X, NamedSharding(emesh, P("data", None)))

resharded = jax.jit(lambda v: jax.reshard(v, NamedSharding(emesh, P("model", None))))(xe)
print("Explicit:", jax.typeof(xe), "->", jax.typeof(resharded))
assert str(jax.typeof(resharded)) == "float32[128@model,512]"
np.testing.assert_array_equal(np.asarray(resharded), X)

errors = []
try:
    jax.jit(lambda v: jax.reshard(v, NamedSharding(mesh, P("model", None))))(x)
except ValueError as err:
    errors.append("reshard on Auto")
    print("Auto: ValueError:", str(err).split(". This error")[0].split(". Got")[0])
try:
    jax.jit(lambda v: jax.lax.with_sharding_constraint(v, NamedSharding(emesh, P("model", None))))(xe)
except ValueError as err:
    errors.append("constraint on Explicit")
    print("Explicit: ValueError:", str(err).split(". Got")[0])
assert errors == ["reshard on Auto", "constraint on Explicit"]

# %% [markdown]
# | inside `jit`, to change a layout | Auto axes | Explicit axes |
# |---|---|---|
# | `jax.device_put(x, sharding)` | **silently ignored** | reshards |
# | `jax.lax.with_sharding_constraint(x, sharding)` | reshards | `ValueError` |
# | `jax.reshard(x, sharding)` | `ValueError` | reshards |
#
# (`device_put` inside `jit` does reshard on Explicit axes, because there the sharding is part of the type;
# checked in the next cell.)

# %%
moved_by_put = jax.jit(lambda v: jax.device_put(v, NamedSharding(emesh, P("model", None))))(xe)
print(jax.typeof(moved_by_put))
assert str(jax.typeof(moved_by_put)) == "float32[128@model,512]"

# %% [markdown]
# ## 6. Explicit mode: the sharding is in the type
#
# On Explicit axes, `jax.typeof` prints the sharding as part of the type, in the notation this course
# uses (`type_string` writes the same for any mesh; on an Auto mesh `jax.typeof` shows only
# `float32[128,512]`).

# %%
print("Explicit:", jax.typeof(xe), "  type_string:", type_string(xe))
print("Auto:    ", jax.typeof(x), "       type_string:", type_string(x))
assert str(jax.typeof(xe)) == "float32[128@data,512]"
assert str(jax.typeof(x)) == "float32[128,512]"

# %% [markdown]
# Because the sharding is in the type, JAX computes it for every intermediate **while tracing**, before
# the compiler sees anything. Print the types from inside a jitted function: the print runs once, at trace
# time. The `(128, 512) @ (512, 256)` product follows case 1; the sum over rows then crosses the `data` cut,
# so it needs an all-reduce over `data`, and the result keeps only `model`.

# %%
W = rng.standard_normal((512, 256)).astype(np.float32)
we = jax.device_put(W, NamedSharding(emesh, P(None, "model")))
trace_types = []


@jax.jit
def layer_sum(x, w):
    h = x @ w
    total = h.sum(axis=0)
    for name, value in [("x", x), ("w", w), ("h = x @ w", h), ("h.sum(axis=0)", total)]:
        print(f"{name:<14}{jax.typeof(value)}")
        trace_types.append(str(jax.typeof(value)))
    return total


compiled = layer_sum.lower(xe, we).compile()
col = collectives(compiled)
print(col)
assert trace_types == ["float32[128@data,512]", "float32[512,256@model]", "float32[128@data,256@model]",
                       "float32[256@model]"]
assert col.kinds == {"all-reduce"} and col.ops[0].group_size == 4
np.testing.assert_allclose(np.asarray(compiled(xe, we)), (X @ W).sum(axis=0), rtol=1e-4, atol=1e-3)

# %% [markdown]
# ### Ambiguous matmuls are type errors
#
# Case 3 needs a decision the operands cannot make: after the partial products, should the sum be
# replicated, or cut, and how? On Auto axes the compiler picks (section 3 got a replicated output). On
# Explicit axes JAX refuses to guess and raises `ShardingTypeError` at trace time. Case 4's
# `P('model', None) @ P(None, 'model')`, whose output would be cut twice by `model`, is a type error too.
# `ShardingTypeError` is not exported by a public module (it lives in `jax._src.core`), so catch it by
# class name.

# %%
ae = jax.device_put(A, NamedSharding(emesh, P(None, "model")))
be = jax.device_put(B, NamedSharding(emesh, P("model", None)))
type_errors = []
for left, right in [(ae, be),
                    (jax.device_put(A, NamedSharding(emesh, P("model", None))),
                     jax.device_put(B, NamedSharding(emesh, P(None, "model"))))]:
    try:
        jax.jit(matmul)(left, right)
    except Exception as err:  # jax._src.core.ShardingTypeError
        assert type(err).__name__ == "ShardingTypeError", err
        type_errors.append(str(jax.typeof(left)) + " @ " + str(jax.typeof(right)))
        print(f"{type_errors[-1]}\n  ShardingTypeError: {str(err).split('. Please')[0]}\n")
assert len(type_errors) == 2


# %% [markdown]
# The fix is to say where the result goes, with `out_sharding=` on the matmul. For `P('data', None)` each
# device only needs rows block `d` of the sum, so it multiplies just those rows (free: `A`'s rows are whole
# on every device) and all-reduces a `(32, 512)` partial product over `model`.

# %%
def matmul_rows(a, b):
    return jnp.matmul(a, b, out_sharding=NamedSharding(emesh, P("data", None)))


compiled = jax.jit(matmul_rows).lower(ae, be).compile()
ce = compiled(ae, be)
col = collectives(compiled)
print(jax.typeof(ae), "@", jax.typeof(be), "->", jax.typeof(ce))
print(col)
assert str(jax.typeof(ce)) == "float32[128@data,512]"
(op,) = col.ops
assert op.kind == "all-reduce" and (op.group_size, op.result_bytes) == (2, 32 * 512 * 4)
np.testing.assert_allclose(np.asarray(ce), C_ref, rtol=1e-4, atol=1e-4)

# %% [markdown]
# Under `jax.set_mesh(emesh)` a bare `PartitionSpec` works too, and `jnp.dot` takes the same argument:

# %%
with jax.set_mesh(emesh):
    ce_dot = jax.jit(lambda a, b: jnp.dot(a, b, out_sharding=P("data", None)))(ae, be)
print(jax.typeof(ce_dot))
assert str(jax.typeof(ce_dot)) == "float32[128@data,512]"

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.reveal()` for the reference answer. The checkers compile on the `(4, 2)` Auto mesh of this notebook.
#
# **Exercise 1 (predict the collective).** FSDP-style layout: activations `x: f32[128, 256]` at
# `P(('data', 'model'), None)` and weights `w: f32[256, 512]` at `P(('data', 'model'), None)`, so both cut
# their first dimension over all 8 devices. Which collectives does `jax.jit(lambda x, w: x @ w)` insert?
# Answer with a dict of kind to count, e.g. `{'all-reduce': 2}`; leave out kinds that do not occur.

# %%
from exercises import ex04_propagation_resharding as ex

answer_1 = NOT_ANSWERED  # e.g. {"all-gather": 1}
ex.predict_collective.check(answer_1);

# %% [markdown]
# **Exercise 2 (predict the bytes).** In the program of exercise 1, how many bytes does each device send,
# by the textbook ring formula? Work it out from the shapes.

# %%
answer_2 = NOT_ANSWERED  # a number of bytes, e.g. 3 / 4 * 65536
ex.predict_bytes.check(answer_2);

# %% [markdown]
# **Exercise 3 (write the constraint).** With `x` at `P('data', None)` and `w` at `P(None, 'model')`,
# `x @ w` comes out `P('data', 'model')` (section 2). Write a function `constrain(y)` such that
# `jax.jit(lambda x, w: constrain(x @ w))` returns `P(None, 'model')`. The checker runs it under
# `jax.set_mesh` of the Auto mesh, so a bare `P(...)` works as well as `NamedSharding(mesh, ...)`.

# %%
answer_3 = NOT_ANSWERED  # a function, e.g. lambda y: ...
ex.write_constraint.check(answer_3);

# %% [markdown]
# ## Takeaways
# - Computation follows data: elementwise ops keep their input's sharding, and a matmul's output sharding
#   follows from its operands'. `P('data', None) @ P(None, 'model')` gives `P('data', 'model')` with no
#   communication.
# - Where the contracting dimension is cut predicts the collective: nowhere, none; on one side, an
#   all-gather; on both sides, an all-reduce (a reduce-scatter, fused on GPU/TPU, for a sharded output);
#   one axis on both non-contracting dims, an all-gather of one operand. Compile and count to confirm: the
#   compiler picks the route, and it can surprise you.
# - Mismatched layouts inside `jit` are resharded for you, from free (a local slice) to a full copy on every
#   device ("Involuntary full rematerialization" on stderr). Committed inputs that do not match
#   `in_shardings` raise a `ValueError` instead.
# - Inside `jit`, `jax.device_put` does not reshard on Auto axes. Use `jax.lax.with_sharding_constraint`
#   on Auto axes and `jax.reshard` on Explicit axes.
# - On Explicit axes the sharding is in the type (`float32[128@data,512]`), and a matmul whose output
#   layout is ambiguous is a `ShardingTypeError` until you pass `out_sharding=`.
#
# **Next:** [05 · Constraints and manual control](05_constraints_explicit.ipynb)
