# %% [markdown]
# # 11 · The FSDP step: its collectives, their cost, and HSDP
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/11_fsdp_step.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/11_fsdp_step.ipynb)
#
# Under FSDP each device stores an eighth of every kernel (notebook 10), but its examples need whole
# kernels, so every step must gather each weight and then hand each device only its block of the
# gradient sum. For notebook 10's MLP with 8 examples per device, those transfers are estimated to take
# over 100 times as long as the matmuls on a TPU v5e-8.
#
# **You need:** notebooks 06 (`jax.shard_map` and its collectives), 07 (data parallelism, its train step
# and its cost line), 09 (group sizes name mesh axes) and 10 (the FSDP rule and the sharded model);
# `jax.typeof`, `jax.sharding.reshard` and the course's `collectives()`.
#
# You will read the program that notebook 10's FSDP step compiles to, on the CPU and for a TPU, write
# its gradient sum by hand, price its transfers, and split it over two kinds of links.
#
# **You will learn**
# - which collectives the FSDP step contains and where, and how the CPU and TPU compilers differ on the
#   gradient (an all-reduce and a slice, or a reduce-scatter);
# - the gradient's pending sum as a type, `{U:fsdp}`, read from an Explicit mesh;
# - why FSDP saves memory, not communication, and when its transfers hide behind the matmuls;
# - hybrid sharding (HSDP): FSDP inside a group, data parallelism across groups;
# - (exercise 2) how to write the same step by hand in `jax.shard_map`: gather, compute, reduce-scatter.
#
# The strategy in the course's types (`{U:fsdp}`: partial sums still to be added over `fsdp`). Section 2
# reads each type from JAX and checks it:
#
# ```
# w1: f32[64@fsdp,256] → all-gather(fsdp) → f32[64,256];  x: f32[64@fsdp,64] · w1 → h: f32[64@fsdp,256]
# xᵀ·dh: f32[64,256]{U:fsdp} → reduce-scatter(fsdp) → f32[64@fsdp,256]
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
import itertools
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding, reshard
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (CHIPS, NOT_ANSWERED, assert_close, collectives, draw_timeline,
                   estimate_step, format_bytes, quiet, schedule, shard_table, tpu_compiler_available,
                   type_string)

# %% [markdown]
# ## 1. Notebook 10's model, laid out by its rule
#
# The MLP `64 -> 256 -> 10`, its Adam optimizer, the FSDP rule and the sharded constructor come from
# notebook 10 through `src/spmd_course/models.py` (its cells tagged `save`). Each device stores its block of
# every kernel and a whole copy of each bias. Data parallelism on the same mesh, everything replicated,
# is the comparison. Both train steps are compiled with the batch split over `fsdp`, 8 examples per device:

# %%
from spmd_course.models import MLP, create_sharded, fsdp_rule, mlp_and_adam, train_step, x, y  # notebooks 07 and 10

mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(AxisType.Auto,))
shardings = jax.tree_util.tree_map_with_path(partial(fsdp_rule, mesh=mesh), nnx.state(nnx.eval_shape(mlp_and_adam)))
model, optimizer = create_sharded(shardings)()
dp_model, dp_optimizer = create_sharded(NamedSharding(mesh, P()))()
x_fsdp, y_fsdp = (jax.device_put(a, NamedSharding(mesh, P("fsdp"))) for a in (x, y))
compiled_fsdp = train_step.lower(model, optimizer, x_fsdp, y_fsdp).compile()
compiled_dp = train_step.lower(dp_model, dp_optimizer, x_fsdp, y_fsdp).compile()
param_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
print(f"parameters: {format_bytes(param_bytes)};  w1: {type_string(model.linear1.kernel[...])}, "
      f"w2: {type_string(model.linear2.kernel[...])}, b1: {type_string(model.linear1.bias[...])}")
assert type_string(model.linear1.kernel[...]) == "f32[64@fsdp,256]"
assert type_string(model.linear1.bias[...]) == "f32[256]"

# %% [markdown]
# ## 2. The compiled step: all-gathers, and what happens to the gradient
#
# **Pop quiz.** Before you read the program: each device holds 1/8 of every kernel, and its 8 examples
# need whole kernels. Which collectives must an FSDP step run, and where?
#
# <details><summary>Answer</summary>
#
# An all-gather of each kernel before the matmul that uses it, because no device can multiply with an
# eighth of a kernel, and a reduce-scatter of each kernel's gradient after the backward pass, because
# each device must add up the 8 partial gradients of its own block only. The cell below asserts the
# gathers. The reduce-scatter depends on the compiler: the TPU program below has one, while the CPU
# compiler all-reduces and slices, as this section shows.
#
# </details>

# %%
comm, dp_comm = collectives(compiled_fsdp), collectives(compiled_dp)
print("FSDP:", comm, sep="\n")
print("\ndata parallel:", dp_comm, sep="\n")
assert "all-gather" in comm.kinds and dp_comm.kinds == {"all-reduce"}
h = jax.jit(lambda model, x: model.linear1(x))(model, x_fsdp)  # the opening's chain, from the real arrays
chain = [type_string(a) for a in (model.linear1.kernel[...], x_fsdp, h)]
print(" | ".join(chain))
assert chain == ["f32[64@fsdp,256]", "f32[64@fsdp,64]", "f32[64@fsdp,256]"]

# %% [markdown]
# The gradient line of the opening has a pending sum over `fsdp`, which an Auto mesh never shows as a
# type. An Explicit twin of the mesh does. The kernel's gradient is `xᵀ·dh`, where `dh` is the gradient
# at the first layer's output. Each device multiplies its own 8 examples, so
# `out_sharding=P(None, None, unreduced={'fsdp'})` keeps the 8 partial products apart, and `reshard` to
# the kernel's own layout, `P('fsdp', None)`, adds them up and keeps each device's block:

# %%
from spmd_course.models import first_layer_gradient  # notebook 07's

fresh = MLP(nnx.Rngs(0))  # the initial parameters, on one device
dh = first_layer_gradient(fresh, x, y)  # the gradient at the first layer's output
full_grads = nnx.grad(lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean())(fresh)
explicit = jax.make_mesh((8,), ("fsdp",), axis_types=(AxisType.Explicit,))
with jax.set_mesh(explicit):
    x_rows, dh_rows = (jax.device_put(a, NamedSharding(explicit, P("fsdp"))) for a in (x, dh))
    dw1_pending = jnp.einsum("bi,bh->ih", x_rows, dh_rows, out_sharding=P(None, None, unreduced={"fsdp"}))
    scatter = jax.jit(lambda g: reshard(g, P("fsdp", None)))
    dw1 = scatter(dw1_pending)
    scattered_by = collectives(scatter.lower(dw1_pending).compile())
gradient_chain = f"xᵀ·dh: {jax.typeof(dw1_pending).str_short(short_dtypes=True)} → {type_string(dw1)}"
print(gradient_chain, "| the compiler's collective:", [op.kind for op in scattered_by.ops])
assert gradient_chain == "xᵀ·dh: f32[64,256]{U:fsdp} → f32[64@fsdp,256]"
assert shard_table(dw1).shard_shapes == {(8, 256)}  # each device keeps its block of the sum
assert_close(dw1, full_grads["linear1"]["kernel"][...])  # the summed products are the full-batch gradient

# %% [markdown]
# The types are the opening's. How the compiler adds the sum depends on the backend: the CPU compiler
# all-reduces the whole `f32[64,256]` and slices it, and the TPU compiler reduce-scatters, as the
# compiled train step below shows.

# %% [markdown]
# The CPU compiler's FSDP table, from the top:
#
# - **All-gathers of the weights**: `f32[64,256]` and `f32[256,10]`, the two kernels whole, right
#   before the forward matmuls.
# - **For the backward pass**, an all-gather of the logits' gradient over the whole batch
#   (`f32[64,10]`), multiplied by the device's own `(32, 10)` kernel block, and an all-to-all that turns
#   the result from "split over hidden units" back into "split over examples".
# - **The gradient.** FSDP needs each device's block of the summed gradient: a **reduce-scatter**. The
#   CPU backend runs the whole data-parallel all-reduce (76,844 bytes), then `dynamic-slice` ops keep
#   each device's 1/8.

# %%
slices = sorted(set(re.findall(r"= (f32\[[0-9,]+\])\{[0-9,]+\} dynamic-slice\(", compiled_fsdp.as_text())))
print("dynamic-slice results in the FSDP step:", slices)

# %% [markdown]
# **The TPU program.** You need no TPU to see what the TPU compiler does with the same step: JAX
# compiles ahead of time for a TPU topology, here a v5e with 8 chips (`v5e:2x4`, notebook 21). The state
# becomes `jax.ShapeDtypeStruct`s placed by the same rule on a mesh of TPU chips,
# and a function that `nnx.merge`s them calls the same `train_step`. Nothing is allocated, nothing runs.
# This small program compiles quickly at the compiler's default effort, the one `jax.jit` uses when you
# run, so its figures are the ones you would see:

# %%
ok, why = tpu_compiler_available()
if not ok:
    print(why)  # no TPU compiler here (libtpu is not installed, or this is not Linux): the CPU view above stands
else:
    with quiet():  # libtpu's start-up warnings
        topo = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")
    tpu_mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(AxisType.Auto,), devices=topo.devices)
    graphdef, abstract_state = nnx.split(nnx.eval_shape(mlp_and_adam))
    tpu_plan = jax.tree_util.tree_map_with_path(partial(fsdp_rule, mesh=tpu_mesh), abstract_state)
    tpu_batch = NamedSharding(tpu_mesh, P("fsdp"))

    def functional_step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss = train_step(model, optimizer, x, y)
        return nnx.state((model, optimizer)), loss

    def compile_for_tpu(plan):
        state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, plan)
        return jax.jit(functional_step, donate_argnums=0, out_shardings=(plan, NamedSharding(tpu_mesh, P()))).lower(
            state, *(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=tpu_batch) for a in (x, y))).compile()

    tpu_fsdp = compile_for_tpu(tpu_plan)
    tpu_comm = collectives(tpu_fsdp)
    tpu_dp_comm = collectives(compile_for_tpu(jax.tree.map(lambda _: NamedSharding(tpu_mesh, P()), abstract_state)))
    print(tpu_comm, "\n")
    print(f"{'':<16}{'CPU':>4}{'TPU':>5}")
    for kind in ("all-gather", "all-to-all", "all-reduce", "reduce-scatter"):
        print(f"{kind:<16}{comm.count(kind):>4}{tpu_comm.count(kind):>5}")
    print(f"\nTPU ring estimates: FSDP {format_bytes(tpu_comm.estimated_bytes)}, "
          f"data parallel {format_bytes(tpu_dp_comm.estimated_bytes)}")

    (scatter,) = [op for op in tpu_comm.ops if op.kind == "reduce-scatter"]
    assert (scatter.result_type, scatter.form) == ("f32[8,256]", "fused")  # linear1's gradient: this chip's 1/8
    (summed,) = [op for op in tpu_comm.ops if op.kind == "all-reduce"]
    assert "f32[256,10]" in summed.result_type  # linear2's narrow kernel: summed whole, as on CPU, then sliced
    assert all(op.result_type.startswith("bf16[") for op in tpu_comm.ops if op.kind == "all-gather")
    assert tpu_dp_comm.kinds == {"all-reduce"} and tpu_dp_comm.result_bytes == param_bytes + 4  # DP on the TPU
    assert tpu_comm.estimated_bytes < tpu_dp_comm.estimated_bytes  # bf16 gathers: fewer bytes than DP

# %% [markdown]
# The TPU program is the opening's chain for `linear1`: its gradient is a **reduce-scatter**, one fused
# op that leaves each chip only its `f32[8,256]` block of the sum. The narrow `(256, 10)` kernel's
# gradient is not: the compiler merged it with the biases and the loss into one all-reduce and slices
# it, as the CPU does. And the all-gathers move **bf16**, half the bytes: a float32 matmul on TPU
# multiplies in bf16 by default, so the operands are converted before gathering. This libtpu chooses
# array by array, and another version may choose otherwise: notebook 10's wide program, at a real size,
# gathers float32.

# %% [markdown]
# ## 3. Reduce-scatter against all-reduce, and what the transfers cost
#
# A reduce-scatter delivers only each device's block of the sum. `jax.lax.psum_scatter` inside
# `jax.shard_map` writes one by hand, for 8 partial gradients shaped like the `(64, 256)` kernel. Next to
# it is the CPU compiler's form, `psum` and a slice:

# %%
partial_grads = jax.random.normal(jax.random.key(1), (8 * 64, 256))  # 8 stacked (64, 256) partial gradients


@partial(jax.shard_map, mesh=mesh, in_specs=P("fsdp"), out_specs=P("fsdp"))
def by_reduce_scatter(g):
    return jax.lax.psum_scatter(g, "fsdp", scatter_dimension=0, tiled=True)


@partial(jax.shard_map, mesh=mesh, in_specs=P("fsdp"), out_specs=P("fsdp"))
def by_all_reduce_and_slice(g):
    return jax.lax.dynamic_slice_in_dim(jax.lax.psum(g, "fsdp"), jax.lax.axis_index("fsdp") * 8, 8, axis=0)


rs = collectives(jax.jit(by_reduce_scatter).lower(partial_grads).compile())
ar = collectives(jax.jit(by_all_reduce_and_slice).lower(partial_grads).compile())
print(rs, "\n")
print(ar)
assert [(op.kind, op.shapes) for op in rs.ops] == [("reduce-scatter", ((8, 256),))]
assert [(op.kind, op.shapes) for op in ar.ops] == [("all-reduce", ((64, 256),))]
assert_close(jax.jit(by_reduce_scatter)(partial_grads), partial_grads.reshape(8, 64, 256).sum(0), rtol=1e-5)

# %% [markdown]
# The same numbers, but the reduce-scatter's result is an `(8, 256)` block where the all-reduce's is the
# whole `(64, 256)` sum, so the ring formula estimates half the bytes sent for it.
#
# Does FSDP then communicate less than data parallelism? No. A ring all-reduce *is* a reduce-scatter
# followed by an all-gather. Data parallelism does both on the gradients. FSDP reduce-scatters the
# gradients and all-gathers the weights, which is the same volume at best, and about 1.5 times as much
# when a large model gathers its weights again in the backward pass. On the CPU compiler, where the
# reduce-scatter stays a full all-reduce, FSDP's ring estimate is above data parallelism's (the hidden
# cell at the end of this section checks it with the CPU compiler's figures):

# %%
print(f"FSDP {format_bytes(comm.estimated_bytes)}, data parallel {format_bytes(dp_comm.estimated_bytes)}"
      " per device per step (ring estimates from the compiled programs)")

# %% [markdown]
# ### The cost line: what the chain costs in seconds (an estimate)
#
# Under the opening's chain, the cost line of notebooks 07 to 09, at a TPU v5e chip's published rates:
# `C` = 197 TFLOP/s, and `W` = 100 GB/s here, because on a v5e-8 (a 2x4 torus) the 8-chip `fsdp` axis
# spans both torus axes, so a ring sends over two links at once. With `t` examples per device, `n`
# devices, kernels of `K` weights (`W1 + W2`) gathered in `b` bytes per weight, per device:
#
# | part | formula | why |
# |---|---|---|
# | compute | `(4t·W1 + 6t·W2) / C`, about `6Nt / C` | notebook 07's matmuls: each device multiplies whole kernels with its own `t` examples |
# | gathers | `(n-1)/n · b·K / W` | each device receives the 7/8 of every kernel it does not hold |
# | reduce-scatter | `(n-1)/n · 4K / W` | each device receives 7/8 of the partial sums of its own block of each gradient |
#
# With `b` = 4 the two transfers add up to data parallelism's all-reduce, `2(n-1)/n · 4N`, so the rule
# is notebook 07's: they hide when `t > (4/3)(n-1)/n · C/W`, and the examples per device decide, not the
# model's size. The TPU program above departs from the textbook in two ways, so the cell checks the
# formulas on the parts it does by the book: it gathers both kernels in bf16 (`b` = 2), and it
# reduce-scatters `linear1`'s gradient but all-reduces the narrow `linear2` kernel's with the biases.
# The bytes are read from its collectives and the seconds from `estimate_step`, which times that
# program op by op on the v5e-8 it was compiled for:

# %%
if ok:
    V5E = CHIPS["v5e"]
    C, W = V5E.peak_flops, V5E.axis_bandwidth(2, 2) + V5E.axis_bandwidth(4, 4)  # 197e12; 2 x 50e9 B/s
    n, t, W1, W2 = tpu_mesh.shape["fsdp"], x_fsdp.sharding.shard_shape(x.shape)[0], 64 * 256, 256 * 10
    fsdp_flops = 4 * t * W1 + 6 * t * W2  # notebook 07's matmuls, for this device's 8 examples
    gather_sent = (n - 1) / n * 2 * (W1 + W2)  # both kernels, gathered in bf16
    scatter_sent = (n - 1) / n * 4 * W1  # linear1's gradient, reduce-scattered in float32
    tpu_time = estimate_step(tpu_fsdp, tpu_mesh)  # the TPU program, op by op
    first_matmul = next(k for k, op in enumerate(tpu_time.timeline) if op.flops)
    gathers = [op for op in tpu_time.timeline[:first_matmul] if op.kind == "all-gather"]  # the kernels, first
    (scattered,) = [op for op in tpu_time.timeline if op.kind == "reduce-scatter"]
    print(f"cost line (estimate, v5e rates): compute {fsdp_flops:,} FLOPs / C = {fsdp_flops / C * 1e9:.1f} ns; "
          f"gathers {gather_sent:,.0f} B / W = {gather_sent / W * 1e6:.2f} µs; "
          f"reduce-scatter {scatter_sent:,.0f} B / W = {scatter_sent / W * 1e6:.2f} µs")
    print(f"estimate_step: {tpu_time.flops:,.0f} FLOPs; gathers {sum(op.seconds for op in gathers) * 1e6:.2f} µs; "
          f"reduce-scatter {scattered.seconds * 1e6:.2f} µs")
    print(f"in float32 the transfers hide above t = (4/3)(n-1)/n · C/W = {4 / 3 * (n - 1) / n * C / W:,.0f} "
          f"examples per device; here t = {t}")
    assert tpu_time.flops == fsdp_flops  # every matmul of the TPU program, counted from its shapes
    assert len(gathers) == 2 and np.isclose(sum(op.bytes for op in gathers), 2 * (W1 + W2))  # both kernels, bf16
    assert np.isclose(sum(op.seconds for op in gathers), gather_sent / W)  # the formula's seconds
    assert np.isclose(scattered.bytes, 4 * W1 / n) and np.isclose(scattered.seconds, scatter_sent / W)
    assert gather_sent / W + scatter_sent / W > 100 * fsdp_flops / C  # 8 examples: all communication
else:
    print(why)

# %% [markdown]
# **FSDP saves memory, not communication.** Counted in values, it sends the same traffic as data
# parallelism or more. Counted in bytes it can send less on a TPU, because this libtpu gathers the small
# program's weights in bf16 (the TPU cell of section 2 asserts it), but notebook 10's wide program gathers float32.
# Whether those bytes cost time depends on the matmuls they can hide behind: notebook 15 turns them
# into seconds.
#
# ## 4. Hybrid sharding (HSDP)
#
# Between slices or hosts the links are slower, and gathering every weight
# across all of them each step costs. HSDP splits the state over an `fsdp` axis inside a group and
# replicates it over a `replica` axis across groups, and the batch splits over both. On a `(2, 4)` mesh
# the same rule (it reads only the `fsdp` axis) gives:

# %%
hybrid_mesh = jax.make_mesh((2, 4), ("replica", "fsdp"), axis_types=(AxisType.Auto, AxisType.Auto))
hybrid_plan = jax.tree_util.tree_map_with_path(partial(fsdp_rule, mesh=hybrid_mesh), nnx.state(nnx.eval_shape(mlp_and_adam)))
hybrid_batch = NamedSharding(hybrid_mesh, P(("replica", "fsdp")))  # 8 examples per device, as before
hybrid = collectives(train_step.lower(*create_sharded(hybrid_plan)(), jax.device_put(x, hybrid_batch),
                                      jax.device_put(y, hybrid_batch)).compile())
print(hybrid)
kernel_bytes = (64 * 256 + 256 * 10) * 4
assert {op.group_size for op in hybrid.ops if op.kind == "all-gather"} == {4}  # inside one replica group
assert sum(op.result_bytes for op in hybrid.ops if op.group_size == 2) == kernel_bytes // 4  # across groups
assert sum(op.result_bytes for op in hybrid.ops if op.group_size == 8) == (256 + 10 + 1) * 4  # biases, loss

# %% [markdown]
# Groups of 4 are the `fsdp` axis, groups of 2 the `replica` axis. The weights are gathered inside a
# group. The kernel gradients are summed inside it too, each device keeping its quarter, and only that
# quarter is all-reduced across the 2 groups. So a quarter of the kernel gradients crosses the slow
# links, where data parallelism sends all of them. (The small replicated biases and the loss are summed over
# all 8.) MaxText's `dcn_data_parallelism` with `ici_fsdp_parallelism` builds this mesh, and notebook 23
# builds multi-slice meshes.
#
# ## 5. The step in order
#
# In order (the TPU program, at the default effort, where libtpu is here): the kernels gathered before
# the first matmul, the gradients reduced (scattered on TPU) after the last. In between sit the backward
# pass's own collectives, which section 2's CPU list explains: the logits' gradient gathered over the
# batch (the third all-gather) and the all-to-all that turns "split over hidden units" back into "split
# over examples".

# %%
fsdp_steps = schedule(*((tpu_fsdp, tpu_mesh) if ok else (compiled_fsdp, mesh)))
fsdp_kinds = [s.kind for s in fsdp_steps]
matmul_at = [i for i, kind in enumerate(fsdp_kinds) if kind == "matmul"]
sums_at = [i for i, s in enumerate(fsdp_steps)  # the gradients' sums (a scalar loss may be summed on its own)
           if s.kind in ("all-reduce", "reduce-scatter") and not re.fullmatch(r"\w+\[\]", s.result_type)]
assert set(fsdp_kinds[:matmul_at[0]]) == {"all-gather"}  # a weight is gathered before the first matmul
assert matmul_at[-1] < sums_at[0]  # and the gradients are reduced after the last one
fsdp_time = estimate_step(tpu_fsdp, tpu_mesh) if ok else estimate_step(compiled_fsdp, mesh, chip="v5e")
draw_timeline(fsdp_time, title=f"FSDP train step, {'compiled for' if ok else 'timed at the rates of'} a TPU v5e-8")

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU and TPU compilers' exact figures, §5: collectives and their order
cpu_kinds = [s.kind for s in schedule(compiled_fsdp, mesh)]


def in_words(kinds):
    """A scheduled order as a sentence: runs of the same op counted, e.g. '2 all-gathers, then 1 matmul'."""
    runs = [(kind, len(list(run))) for kind, run in itertools.groupby(kinds)]
    return ", then ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in runs)


made = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in comm.counts.items() if n)
print(f"On {jax.default_backend()}, the FSDP step has {made}. Its dynamic-slices cut out blocks of "
      f"{' and '.join(slices)}.")
print(f"In the order this compiler schedules them, the step runs {in_words(cpu_kinds)}.")
if ok:
    print(f"The TPU compiler (default effort) schedules {in_words(fsdp_kinds)}.")
if CPU:  # what the CPU compiler inserts
    assert comm.counts == {"all-reduce": 1, "all-gather": 3, "reduce-scatter": 0, "all-to-all": 1,
                           "collective-permute": 0}
    assert [op.shapes for op in comm.ops if op.kind == "all-gather"][:2] == [((64, 256),), ((256, 10),)]
    (all_reduce,) = [op for op in comm.ops if op.kind == "all-reduce"]
    assert all_reduce.result_bytes == dp_comm.result_bytes == param_bytes + 4  # the whole gradient, + the loss
    assert {"f32[256,8]", "f32[10,32]"} <= set(slices)  # 1/8 of each kernel gradient (in its transposed layout)
    assert comm.estimated_bytes > dp_comm.estimated_bytes  # FSDP's ring estimate above data parallelism's
    assert cpu_kinds[:2] == ["all-gather"] * 2  # both kernels, in two gathers, before the first matmul
    assert "matmul" not in cpu_kinds[cpu_kinds.index("all-reduce"):]  # the one sum, after the last matmul
    assert [op.kind for op in scattered_by.ops] == ["all-reduce"]  # the Explicit twin's sum: all-reduce and slice
    if ok:  # the TPU compiler gathers as often, and reduce-scatters where the CPU compiler does not
        assert comm.count("reduce-scatter") == 0 and tpu_comm.count("all-gather") == comm.count("all-gather")
if ok:  # the TPU program of this libtpu, at the default effort
    assert fsdp_kinds[:2] == ["all-gather"] * 2  # both kernels, in two gathers, before the first matmul
    assert "matmul" not in fsdp_kinds[fsdp_kinds.index("reduce-scatter"):]

# %% [markdown]
# ## Takeaways
# - The FSDP step gathers each kernel whole right before the matmul that uses it, and sums each kernel's
#   gradient so that every device keeps only its own block: a reduce-scatter on the TPU, an all-reduce
#   and a slice on the CPU compiler.
# - The pending sum is a type: `xᵀ·dh` is `f32[64,256]{U:fsdp}` on an Explicit mesh, and `reshard` to the
#   kernel's layout adds it up into `f32[64@fsdp,256]`.
# - A gather and a reduce-scatter are an all-reduce's two halves, so FSDP sends data parallelism's
#   traffic or more: it saves memory, not communication. Its transfers hide behind the matmuls only
#   above about `(4/3)(n-1)/n · C/W` examples per device; at 8 they take over 100 times as long.
# - HSDP gathers inside a group and sends only each group's share of the gradients across groups.
# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.

# %%
from spmd_course.exercises import ex11_fsdp_step as ex

# %% [markdown]
# **Exercise 1.** Section 3 summed gradients shaped like a `(64, 256)` float32 kernel over 8 devices.
# Estimate with the ring formula how many bytes each device sends for the reduce-scatter, and how many for
# the all-reduce (followed by a slice) that the CPU compiler uses instead.

# %%
answer_1 = NOT_ANSWERED  # a pair (reduce-scatter bytes, all-reduce bytes)
ex.gradient_traffic.check(answer_1);

# %% [markdown]
# **Exercise 2: FSDP by hand.** Write notebook 10's FSDP step yourself, in `jax.shard_map`, so that you
# choose every collective the compiler chose in section 2. The checker runs your per-device function
# `fsdp_loss_and_grads(params, x, y)` on the 8-device `fsdp` mesh, for the MLP `64 -> 256 -> 10`:
#
# | argument or result | what one device holds |
# |---|---|
# | `params` | `{'linear1': {'kernel', 'bias'}, 'linear2': {...}}`: its block of each kernel's rows, `(8, 256)` and `(32, 10)`, and both biases whole |
# | `x`, `y` | its 8 of the 64 examples and their labels |
# | `loss` (returned) | the mean cross-entropy over all 64 examples, the same on every device |
# | `grads` (returned) | shaped like `params`: its block of rows of each kernel's full-batch gradient, and the biases' gradients whole |
#
# A right answer takes about 15 lines: gather each kernel whole, compute the loss and its gradient, and
# sum each kernel's gradient over the devices so that each keeps only its own rows. The checker compares
# the loss and the gradients with the single-device ones, and reads the compiled program with
# `collectives()`: it wants the kernels gathered whole, as in section 2, and their gradients
# reduce-scattered, as the TPU compiles this step. Nothing compiles until you answer.

# %%
def fsdp_loss_and_grads(params, x, y):
    ...  # gather, compute, reduce-scatter; return (loss, grads)


answer_2 = NOT_ANSWERED  # set it to fsdp_loss_and_grads once you have written it
ex.fsdp_by_hand.check(answer_2);

# %% [markdown]
# **Next:** [12 · A sharded transformer, end to end](12_transformer.ipynb)
