# %% [markdown]
# # 08 · Tensor parallelism
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/08_tensor_parallel.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/08_tensor_parallel.ipynb)
#
# Data parallelism keeps a whole copy of the model on every device, so a model larger than one device's
# memory cannot train that way at all. Split every weight matrix over 8 devices instead and each keeps an
# eighth, 128 KiB of a 1 MiB kernel, but the devices then have to add up partial results in every pass.
#
# **You need:** notebook 07 (data parallelism, the course's MLP and train step), 04 (the four matmul cases,
# collectives in a compiled program) and 05 (Auto and Explicit axes, `out_sharding=`); `jax.jit`,
# `jax.grad`, `nnx.jit` and `nnx.Optimizer`.
#
# Tensor parallelism does exactly that, on a mesh axis called `model`, while every device keeps the
# whole batch: the opposite of data parallelism.
#
# **You will learn**
# - what `P(None, 'model')` does to a weight matrix;
# - the column-parallel then row-parallel pairing, `P(None, 'model')` then `P('model', None)`, and the
#   one all-reduce per block it needs in the forward pass;
# - why "shard every kernel on its output dimension" fails, and what it costs where it runs;
# - how attention heads fall onto the `model` axis, one head per device;
# - what a block sends forward and backward, and when data parallelism sends less.

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
import matplotlib.pyplot as plt
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding, reshard
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (CHIPS, NOT_ANSWERED, assert_close, collectives, draw_sharding, draw_shardings, draw_timeline,
                   estimate_step, memory_per_device, quiet, schedule, shard_table, type_string)

# %% [markdown]
# ## 1. A `model` axis: every device holds a slice of every kernel
#
# Tensor parallelism needs one mesh axis. Put all 8 devices on it and call it `model`. The axis is
# *Auto*: you place the weights, the compiler works out the rest (notebook 05 compares Auto with
# Explicit axes). Take the query projection of an attention layer of width 512, a `(512, 512)` kernel
# (1 MiB of float32), and split its output columns with `P(None, 'model')`:

# %%
mesh = jax.make_mesh((8,), ("model",), axis_types=(AxisType.Auto,))
query = nnx.Linear(512, 512, use_bias=False, rngs=nnx.Rngs(0))
q_kernel = jax.device_put(query.kernel[...], NamedSharding(mesh, P(None, "model")))

table = shard_table(q_kernel)
print(type_string(q_kernel))
print(table)
assert table.shard_shapes == {(512, 64)}  # all 512 input rows, 64 of the 512 output columns
assert table.total_bytes == q_kernel.nbytes == 1024 * 1024  # nothing replicated: 1 MiB in total
assert set(table.bytes_per_device.values()) == {128 * 1024}  # an eighth on each device
draw_sharding(q_kernel)

# %% [markdown]
# Each device keeps 128 KiB, one eighth. With 8 attention heads of width 64, those 64 columns are exactly
# one head (section 4).
#
# ## 2. Column-parallel, then row-parallel
#
# The model, data and train step are notebook 07's, imported from `src/spmd_course/models.py`: an MLP
# `64 -> 256 -> 10`, a batch of 64 examples labelled by a fixed random "teacher", cross-entropy and
# Adam, with the model and optimizer donated to the step.

# %%
from spmd_course.models import MLP, train_step, x, y  # notebook 07's model, data and step

reference = MLP(nnx.Rngs(0))  # stays on one device: the answer every sharded run must reproduce

# %% [markdown]
# The layout tensor parallelism is built on (Megatron-LM's) pairs the two layers:
#
# | parameter | spec | type | per device |
# |---|---|---|---|
# | `linear1/kernel` (64, 256) | `P(None, 'model')`: **column-parallel** | `f32[64,256@model]` | (64, 32) |
# | `linear1/bias` (256,) | `P('model')`, the same 32 columns | `f32[256@model]` | (32,) |
# | `linear2/kernel` (256, 10) | `P('model', None)`: **row-parallel** | `f32[256@model,10]` | (32, 10) |
# | `linear2/bias` (10,) | `P()` | `f32[10]` | (10,) |
#
# Device *k* computes hidden units `32k ... 32k+31` for the whole batch (layer 1 needs nothing from the
# others), applies ReLU to them, and multiplies them by the 32 rows of `linear2/kernel` that belong to
# the same hidden units. That gives a `(64, 10)` *partial* result: the sum over its 32 hidden units
# only. One **all-reduce** adds up the 8 partial results. In the course's types, with `{U:model}` for a
# sum still pending over `model`:
#
# ```
# x: f32[64,64] · w1: f32[64,256@model] → h: f32[64,256@model] · w2: f32[256@model,10]
#    → f32[64,10]{U:model} → all-reduce(model) → f32[64,10]
# ```
#
# `create` builds a model already in its layout: the constructor runs inside `nnx.jit`, and
# `with_sharding_constraint` pins each new parameter where the layout says, so each device computes only
# its own blocks and none ever holds the whole model (notebook 10 measures what that saves). Notebook 09
# imports it. The picture after it draws the four parameters on one scale (07 §2 draws them the same way,
# replicated), so the split `(64, 256)` kernel is as wide as 07's whole one, cut into 8 column blocks.

# %%
megatron = {
    "linear1/kernel": P(None, "model"),
    "linear1/bias": P("model"),
    "linear2/kernel": P("model", None),
    "linear2/bias": P(),
}

# %% tags=["save"]
def param_name(path):  # (DictKey('linear1'), DictKey('kernel'), GetAttrKey('value')) -> 'linear1/kernel'
    return "/".join(str(k.key) for k in path if hasattr(k, "key"))


def create(make, layout, mesh):
    """The module `make()` builds, created on `mesh` with each parameter where `layout` (name -> spec) says."""

    @nnx.jit
    def build():
        module = make()
        state = nnx.state(module)
        specs = jax.tree_util.tree_map_with_path(lambda path, _: NamedSharding(mesh, layout[param_name(path)]), state)
        nnx.update(module, jax.lax.with_sharding_constraint(state, specs))
        return module

    return build()

# %%
model_tp = create(lambda: MLP(nnx.Rngs(0)), megatron, mesh)
for name, leaf in nnx.to_flat_state(nnx.state(model_tp)):
    print(f"{'/'.join(name):<16}{type_string(leaf[...]):<22}{leaf[...].sharding.shard_shape(leaf.shape)}")
draw_shardings(nnx.state(model_tp), ncols=4, same_scale=True)

# %% [markdown]
# The batch is replicated: every device gets all 64 examples. Compile the forward pass and list the
# collectives the compiler inserted:

# %%
x_repl = jax.device_put(x, NamedSharding(mesh, P()))
forward = jax.jit(lambda model, x: model(x))
ops = collectives(forward.lower(model_tp, x_repl).compile())
print(ops)
assert [(op.kind, op.shapes, op.group_size) for op in ops.ops] == [("all-reduce", ((64, 10),), 8)]
logits = forward(model_tp, x_repl)
assert_close(logits, reference(x))

hidden = jax.jit(lambda model, x: jax.nn.relu(model.linear1(x)))(model_tp, x_repl)
assert shard_table(hidden).shard_shapes == {(64, 32)}  # never gathered: each device keeps its 32 units

explicit = jax.make_mesh((8,), ("model",), axis_types=(AxisType.Explicit,))  # the same devices, Explicit
with jax.set_mesh(explicit):  # the type of layer 2's product, before the all-reduce adds it up
    h_e, w2_e = (jax.device_put(a, NamedSharding(explicit, a.sharding.spec)) for a in (hidden, model_tp.linear2.kernel[...]))
    pending = jnp.matmul(h_e, w2_e, out_sharding=P(None, None, unreduced={"model"}))
chain = (f"x: {type_string(x_repl)} · w1: {type_string(model_tp.linear1.kernel[...])} → h: {type_string(hidden)} · "
         f"w2: {type_string(model_tp.linear2.kernel[...])} → {jax.typeof(pending).str_short(short_dtypes=True)}"
         f" → all-reduce(model) → {type_string(logits)}")
print(chain.replace(" → f32[64,10]{", "\n   → f32[64,10]{"))  # on two lines, as above
assert chain == ("x: f32[64,64] · w1: f32[64,256@model] → h: f32[64,256@model] · w2: f32[256@model,10] → "
                 "f32[64,10]{U:model} → all-reduce(model) → f32[64,10]")

# %% [markdown]
# One all-reduce of the `(64, 10)` logits over all 8 devices, and the logits equal the single-device
# model's. The hidden activation never travels. In the vocabulary of the four matmul cases (notebook 04):
# - layer 1, `f32[64,64] @ f32[64,256@model]`: no operand is sharded on the contracting dimension (64),
#   so no communication; the result is `f32[64,256@model]`;
# - layer 2, `f32[64,256@model] @ f32[256@model,10]`: *both* operands are sharded on the contracting
#   dimension (256) over the same axis, so each device computes a partial sum and an all-reduce adds them.

# %% [markdown]
# ## 3. Shard every kernel on its output dimension?
#
# > **You will see this online:** a tensor-parallel rule that gives every 2-D kernel `P(None, 'model')`:
# > ```python
# > if 'kernel' in str(path) and len(array.shape) >= 2:
# >     return jax.device_put(array, NamedSharding(mesh, P(None, 'model')))
# > ```
#
# Apply it to the MLP:

# %%
def online_rule(path, array):
    if "kernel" in str(path) and len(array.shape) >= 2:
        return NamedSharding(mesh, P(None, "model"))
    return NamedSharding(mesh, P())


state = nnx.state(MLP(nnx.Rngs(0)))
raised = []
try:
    with quiet():  # jax 0.12 prints a stray source line before raising; keep it out of the output
        jax.device_put(state, jax.tree_util.tree_map_with_path(online_rule, state))
except ValueError as err:
    raised.append(type(err).__name__)
    print(f"{type(err).__name__}: ...", re.search(r"array axis 1 .*?\(full shape: \(256, 10\)", str(err)).group(0))
assert raised == ["IndivisibleError"]

# %% [markdown]
# `linear2/kernel` is `(256, 10)`, and 10 columns do not split into 8 equal blocks. Where all
# dimensions divide, as in the feed-forward block of a transformer, `64 -> 256 -> 64`, the rule runs.
# Compare it there with the column/row pairing, with the block's output replicated as the next layer
# needs it:

# %%
class FeedForward(nnx.Module):
    def __init__(self, rngs):
        self.linear1 = nnx.Linear(64, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 64, rngs=rngs)

    def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))


ff_online = FeedForward(nnx.Rngs(0))
state = nnx.state(ff_online)
nnx.update(ff_online, jax.device_put(state, jax.tree_util.tree_map_with_path(online_rule, state)))
ff_tp = create(lambda: FeedForward(nnx.Rngs(0)), megatron, mesh)

forward_repl = jax.jit(lambda model, x: model(x), out_shardings=NamedSharding(mesh, P()))
ff_ops_online = collectives(forward_repl.lower(ff_online, x_repl).compile())
ff_ops_tp = collectives(forward_repl.lower(ff_tp, x_repl).compile())
print("every kernel P(None, 'model'):", ff_ops_online, sep="\n")
print("\ncolumn then row:", ff_ops_tp, sep="\n")

assert "all-reduce" not in ff_ops_online.kinds and "all-gather" in ff_ops_online.kinds
gathered = {s for op in ff_ops_online.ops if op.kind == "all-gather" for s in op.shapes}
assert {(64, 256), (64, 64)} <= gathered  # the hidden activation, then the output columns out_shardings=P() asks for
assert [(op.kind, op.shapes) for op in ff_ops_tp.ops] == [("all-reduce", ((64, 64),))]
assert_close(forward_repl(ff_online, x_repl), forward_repl(ff_tp, x_repl))

# %% [markdown]
# The same numbers, two ways. With both kernels column-parallel, layer 2 gets a hidden activation
# sharded on its contracting dimension and a kernel that is not (case 2 of the four): the compiler
# **all-gathers the whole `(64, 256)` hidden activation** on every device, and then the output columns
# too, which `out_shardings=P()` asks for. The pairing all-reduces only the `(64, 64)` output. The ring
# estimates in the last column count what each device sends: (N-1)/N of an all-gather's result and
# 2(N-1)/N of an all-reduce's. On the CPU compiler they are 70 KiB against 28 KiB (the hidden cell below
# holds the CPU compiler's figures), and the gap grows with the width of the hidden layer, because the
# gathered activation is as wide as that layer. The fix is the layout of section 2: column-parallel,
# then row-parallel.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §3: what it gathers, and the ring estimates
print(f"{'CPU' if CPU else 'this'} compiler: every kernel P(None, 'model') gathers "
      f"{[op.shapes for op in ff_ops_online.ops]}; ring estimates {ff_ops_online.estimated_bytes / 1024:.0f} KiB "
      f"against {ff_ops_tp.estimated_bytes / 1024:.0f} KiB for column then row")
if CPU:
    assert [op.shapes for op in ff_ops_online.ops] == [((64, 256),), ((64, 64),)]
    assert (ff_ops_online.estimated_bytes, ff_ops_tp.estimated_bytes) == (70 * 1024, 28 * 1024)  # ring estimates

# %% [markdown]
# ## 4. Attention heads on the `model` axis
#
# Multi-head attention is tensor-parallel by construction: the heads are independent until the output
# projection adds them up. Make the query, key and value projections column-parallel, so each device's
# columns are whole heads, and the output projection row-parallel. Width 64 and 8 heads of width 8 put
# one head on each device:

# %%
class Attention(nnx.Module):
    def __init__(self, width, heads, rngs):
        self.heads = heads
        self.query = nnx.Linear(width, width, use_bias=False, rngs=rngs)
        self.key = nnx.Linear(width, width, use_bias=False, rngs=rngs)
        self.value = nnx.Linear(width, width, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(width, width, use_bias=False, rngs=rngs)

    def weights(self, x):  # (batch, heads, query position, key position)
        b, t, width = x.shape
        q = self.query(x).reshape(b, t, self.heads, width // self.heads)
        k = self.key(x).reshape(b, t, self.heads, width // self.heads)
        return jax.nn.softmax(jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(width // self.heads), axis=-1)

    def __call__(self, x):
        b, t, width = x.shape
        v = self.value(x).reshape(b, t, self.heads, width // self.heads)
        heads_out = jnp.einsum("bhts,bshd->bthd", self.weights(x), v)
        return self.out(heads_out.reshape(b, t, width))


heads_layout = {"query/kernel": P(None, "model"), "key/kernel": P(None, "model"),
                "value/kernel": P(None, "model"), "out/kernel": P("model", None)}
attn_ref = Attention(64, 8, rngs=nnx.Rngs(1))
attn_tp = create(lambda: Attention(64, 8, rngs=nnx.Rngs(1)), heads_layout, mesh)

tokens = x.reshape(4, 16, 64)  # the course batch read as (batch, sequence, width): 4 sequences of 16 tokens
tokens_repl = jax.device_put(tokens, NamedSharding(mesh, P()))
weights = jax.jit(lambda attn, x: attn.weights(x))(attn_tp, tokens_repl)
print("attention weights:", type_string(weights))
assert shard_table(weights).shard_shapes == {(4, 1, 16, 16)}  # one head per device

forward_attn = jax.jit(lambda attn, x: attn(x), out_shardings=NamedSharding(mesh, P()))
attn_ops = collectives(forward_attn.lower(attn_tp, tokens_repl).compile())
print(attn_ops)
assert [(op.kind, op.shapes, op.group_size) for op in attn_ops.ops] == [("all-reduce", ((4, 16, 64),), 8)]
assert_close(forward_attn(attn_tp, tokens_repl), jax.jit(attn_ref)(tokens))

# %% [markdown]
# The attention weights come out as `f32[4,8@model,16,16]`: each device computed its own head with no
# communication, and only the output projection adds the heads up, with one all-reduce of the
# `(4, 16, 64)` output.
#
# ## 5. Forward and backward: when data parallelism sends less
#
# In a deep network the input of a block comes from the layer below, so the backward pass needs its
# gradient too. With the pairing, that gradient is a partial sum on each device as well: a second
# all-reduce. Compile the forward and backward pass of the feed-forward block as it sits in a deep
# network (a `tanh` and a fixed cotangent `dy` stand in for the layers above) at two token counts,
# tensor-parallel (tokens replicated) and data-parallel (tokens split on an 8-device `data` mesh,
# parameters replicated):

# %%
@nnx.jit
def block_grads(block, x, dy):
    """Gradients of the block's parameters and of its input: its share of a deep network's backward pass."""
    return nnx.grad(lambda block, x: jnp.sum(jnp.tanh(block(x)) * dy), argnums=(0, 1))(block, x)


dp_mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
ff_dp = FeedForward(nnx.Rngs(0))
nnx.update(ff_dp, jax.device_put(nnx.state(ff_dp), NamedSharding(dp_mesh, P())))
ff_param_bytes = (64 * 256 + 256 + 256 * 64 + 64) * 4

traffic = {}
for tokens_per_step in (64, 512):
    zeros = np.zeros((tokens_per_step, 64), np.float32)  # only shapes matter to the compiler
    on_tp = jax.device_put(zeros, NamedSharding(mesh, P()))
    on_dp = jax.device_put(zeros, NamedSharding(dp_mesh, P("data")))
    traffic[tokens_per_step] = (collectives(block_grads.lower(ff_tp, on_tp, on_tp).compile()),
                                collectives(block_grads.lower(ff_dp, on_dp, on_dp).compile()))
    print(f"{tokens_per_step} tokens, tensor parallel:", traffic[tokens_per_step][0], sep="\n")
    print(f"{tokens_per_step} tokens, data parallel:", traffic[tokens_per_step][1], "", sep="\n")

for tokens_per_step, (tp, dp) in traffic.items():
    assert tp.kinds == {"all-reduce"} and [op.shapes for op in tp.ops] == [((tokens_per_step, 64),)] * 2
    assert dp.kinds == {"all-reduce"} and dp.result_bytes == ff_param_bytes  # the gradients, whatever the tokens

# %% [markdown]
# The second all-reduce in the course's types. The input's gradient is `dx = dh · w1ᵀ`, where `dh` is
# the gradient at the hidden layer, split over `model` like `h`. The contracting dimension, the 256
# hidden units, is split in both operands, so each device holds a partial sum: case 3 of the four,
# read here from an Explicit twin of the mesh.

# %%
dh = jax.random.normal(jax.random.key(2), (64, 256))  # a gradient at the hidden layer
with jax.set_mesh(explicit):
    dh_e, w1_e = (jax.device_put(a, NamedSharding(explicit, P(None, "model"))) for a in (dh, ff_tp.linear1.kernel[...]))
    dx_pending = jnp.einsum("th,ih->ti", dh_e, w1_e, out_sharding=P(None, None, unreduced={"model"}))
    sum_over_model = jax.jit(lambda g: reshard(g, P()))
    dx = sum_over_model(dx_pending)
    (dx_sum,) = collectives(sum_over_model.lower(dx_pending).compile()).ops
backward_chain = (f"dx = dh · w1ᵀ: {type_string(dh_e)} · {type_string(w1_e)}ᵀ → "
                  f"{jax.typeof(dx_pending).str_short(short_dtypes=True)} → {dx_sum.kind}(model) → {type_string(dx)}")
print(backward_chain)
assert backward_chain == ("dx = dh · w1ᵀ: f32[64,256@model] · f32[64,256@model]ᵀ → f32[64,64]{U:model} → "
                          "all-reduce(model) → f32[64,64]")
assert_close(dx, dh @ ff_tp.linear1.kernel[...].T)

# %% [markdown]
# Tensor parallelism all-reduces two `(tokens, 64)` arrays per block, the output in the forward pass
# and the input's gradient in the backward pass, so its traffic grows with the tokens per step. Data
# parallelism all-reduces the block's gradients, 33,088 floats, whatever the tokens. Both run over 8
# devices, so the ring factor is the same and the crossover is where the all-reduced bytes are equal.
#
# **Pop quiz.** Work it out before the cell does: at how many tokens per step do the two send the same
# bytes?
#
# <details><summary>Answer</summary>
#
# About 258. Tensor parallelism all-reduces `2 x 64` floats per token, and data parallelism all-reduces
# the block's 33,088 parameters once, so the two meet at 33,088 / 128 = 258.5 tokens. The cell reads
# both from the compiled programs and asserts it.
#
# </details>
#
# Compiled again at the token counts just below and above it, tensor parallelism sends less, then more:

# %%
tp64, dp64 = traffic[64]
per_token = tp64.result_bytes / 64  # 2 x 64 floats per token
crossover = dp64.result_bytes / per_token
print(f"crossover (estimate): {crossover:.1f} tokens per step; 4 x the width = {4 * 64}")
assert crossover == 33_088 / (2 * 64)  # the block's parameters over the floats summed per token

sent = {}  # ring estimates (tensor parallel, data parallel) at the token counts 8 devices can split around it
for t in (8 * int(crossover // 8), 8 * int(crossover // 8) + 8):
    zeros = np.zeros((t, 64), np.float32)
    sent[t] = [collectives(block_grads.lower(block, *[jax.device_put(zeros, NamedSharding(m, spec))] * 2).compile())
               .estimated_bytes for block, m, spec in ((ff_tp, mesh, P()), (ff_dp, dp_mesh, P("data")))]
    print(f"{t} tokens: tensor parallel {sent[t][0]:,.0f} B, data parallel {sent[t][1]:,.0f} B")
below, above = sent
assert sent[below][0] < sent[below][1] and sent[above][0] > sent[above][1]  # the programs cross in between

steps = np.array([0, 1024])
ring = 2 * 7 / 8 / 1024  # ring estimate of an all-reduce over 8 devices, in KiB per byte reduced
fig, ax = plt.subplots(figsize=(6, 3.4))
ax.plot(steps, steps * per_token * ring, label="tensor parallel: 2 activation all-reduces")
ax.plot(steps, [dp64.result_bytes * ring] * 2, label="data parallel: gradient all-reduce")
for t, (tp, dp) in traffic.items():
    ax.scatter([t, t], [tp.estimated_bytes / 1024, dp.estimated_bytes / 1024], color=["C0", "C1"], zorder=3)
ax.axvline(crossover, color="grey", linestyle=":")
ax.annotate(f"~{crossover:.0f} tokens", (crossover, 40), xytext=(6, 0), textcoords="offset points", fontsize=9)
ax.set_xlabel("tokens per step")
ax.set_ylabel("KiB sent per device (ring estimate)")
ax.set_title("feed-forward block 64 -> 256 -> 64, 8 devices; dots: estimates from compiled programs", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
plt.close(fig)
fig

# %% [markdown]
# For a feed-forward block of width *d* (8*d*² weights) the crossover is about **4*d* tokens per step**.
# For a whole transformer layer the same arithmetic gives about 3*d*, because attention adds 4*d*²
# weights and two more `(tokens, d)` all-reduces.
#
# Which tokens count? The comparison is between two ways of using the *same 8 devices*, so the tokens
# are those that one group of 8 processes in a step. On a single 8-device machine that is the whole
# batch. A large run is different: it splits its global batch over many groups, for example 1,024
# chips in 128 groups of 8, and each group sees only its share. Estimated for two real widths:

# %%
print(f"{'width d':>8}{'tokens per step':>17}{'chips':>7}{'tokens per group of 8':>23}{'x crossover 3d':>16}")
ratio = {}
for d in (4096, 8192):  # the width of a 7-billion- and of a 70-billion-parameter transformer
    for batch_tokens, chips in ((10**6, 8), (10**6, 64), (10**6, 1024)):
        group_tokens = batch_tokens / (chips // 8)  # the global batch, shared out among chips / 8 groups
        ratio[d, chips] = group_tokens / (3 * d)
        print(f"{d:>8}{batch_tokens:>17,}{chips:>7}{group_tokens:>23,.0f}{ratio[d, chips]:>16.2f}")
assert ratio[4096, 8] > 80 and ratio[8192, 64] > 5  # a few groups: tensor parallelism sends more bytes
assert 0.3 < ratio[8192, 1024] < 0.35  # 7,800 tokens per group, below 3d = 24,576: it sends fewer

# %% [markdown]
# So the answer depends on the run. On one machine, or a few, each group holds many times the
# crossover and tensor parallelism sends more bytes than data parallelism. On a large cluster each
# group's share can fall below the crossover: at 1,024 chips a 70-billion-parameter model's groups see
# about 0.3 times it, so tensor parallelism over 8 chips sends *fewer* bytes per group than the
# gradient all-reduce it replaces. That is part of why a tensor-parallel axis of 8 inside a node is
# cheap at scale. Bytes are not the whole reason for the choice, either. Tensor parallelism divides
# the weights, so a model too large for one device fits, and it lets more devices share a batch than
# there are sequences to split it into (notebook 17). Two caveats make the crossover a rough estimate:
#
# - These are byte **estimates** from the ring formula, applied to the compiled programs' result sizes;
#   real links, topologies and algorithms differ.
# - Data parallelism's gradient all-reduce of one layer can run while the backward pass of the layers
#   below is still computing, so much of it hides behind compute. Tensor parallelism's all-reduces sit
#   between matmuls that need their result: only splitting the matmul into pieces that overlap the
#   transfer (collective matmul) hides them, so tensor parallelism stays on the fastest links.
#
# Notebook 15 turns these bytes into seconds: it sets each collective's time against the matmuls it can
# hide behind, which is the comparison that decides a real run.
#
# The course MLP's first layer reads `x`, which is data: no gradient flows into it, so its train step
# below has only the forward all-reduce.
#
# The block's step in scheduled order. Both all-reduces run over `model`, and each one's operand is the
# result of a matmul scheduled before it: the matmul that made its partial sums. The HLO line of an
# all-reduce names that operand, so the cell below follows it back. The backward matmuls then wait for
# the first all-reduce, because they need its sum. (On the CPU compiler each sum also comes *right*
# after its matmul: the hidden cell below, with the CPU compiler's figures, checks that.) The picture puts
# this program on a time axis, each op as long as it would take on a TPU v5e chip at its published rates
# (`estimate_step(..., chip='v5e')`, which notebook 15 explains): the matmuls in one lane, the sums over
# `model` in another, black where the chip waits for them. Here every sum is black: none can hide.

# %%
tp_compiled = block_grads.lower(ff_tp, *[jax.device_put(np.zeros((64, 64), np.float32), NamedSharding(mesh, P()))] * 2
                                ).compile()
tp_steps = schedule(tp_compiled, mesh)
matmul_names = [s.name for s in tp_steps if s.kind == "matmul"]
producers = {}  # each all-reduce -> the matmul whose result it sums
for k, s in enumerate(tp_steps):
    if s.kind != "matmul":
        operands = re.search(rf"%?{re.escape(s.name)} = [^\n]*?all-reduce[^(]*\(([^)]*)\)", tp_compiled.as_text())
        (producers[s.name],) = [n for n in re.findall(r"%?([\w.-]+)", operands.group(1)) if n in matmul_names]
        assert producers[s.name] in [t.name for t in tp_steps[:k]]  # a matmul scheduled before the sum
for i, mm in enumerate(producers.values(), start=1):
    print(f"All-reduce {i} of {len(producers)} sums the result of matmul {matmul_names.index(mm) + 1} of "
          f"{len(matmul_names)} (the HLO calls it {mm}).")
assert {s.axes for s in tp_steps if s.kind != "matmul"} == {("model",)}  # every collective sums over model
assert len(producers) == 2  # the output, forward, and the input's gradient, backward
tp_time = estimate_step(tp_compiled, mesh, chip="v5e")  # this program, timed at a v5e chip's rates
assert tp_time.comm_hidden == 0 and tp_time.comm_exposed > 0  # the chip waits for every sum
draw_timeline(tp_time, title="feed-forward block, forward and backward, tensor parallel over 8 devices "
              "(this program at a TPU v5e's rates)")

# %% [markdown]
# ### The cost line: what the two chains cost in seconds (an estimate)
#
# Under the forward chain of section 2 and the `dx` chain above, the cost line of notebook 07, at a TPU
# v5e chip's published rates: `C` = 197 TFLOP/s, and `W` = 50 GB/s along an axis of 8 chips (a line
# on a v5e). For a block of width `d` and hidden width `d_ff` on `M` devices along `model`, with `t`
# tokens that every device sees whole, per device:
#
# | part | formula | why |
# |---|---|---|
# | compute | `6 · 2t·d·d_ff / M / C` | six matmuls (two forward, and for each its weight's and its input's gradient), each over `1/M` of the hidden units |
# | communication | `2 · 2(M-1)/M · 4td / W` | two ring all-reduces of a `[t, d]` float32 array: the output forward and `dx` backward |
#
# Both grow with `t`, so `t` cancels from their ratio: the sums can hide behind the matmuls only when
# `d_ff / M > (4/3)(M-1)/M · C/W`, about 4,600 in float32 and 2,300 in bfloat16, whatever the batch.
# That pools the whole step, as if the forward sum could hide behind backward work. Pass by pass the
# forward rule is 1.5 times stricter, because the forward pass has one sum against a third of the
# FLOPs (notebook 15 §3 checks both on a real block). So a tensor-parallel axis must stay small
# enough that each device keeps thousands of hidden units. This block keeps 32, so its step is all
# communication, as the black boxes above showed. The bytes are checked against the compiled
# program's collectives here, and the FLOPs and seconds against `estimate_step` in the hidden cell below.

# %%
V5E = CHIPS["v5e"]
C, W = V5E.peak_flops, V5E.axis_bandwidth(8, 8)  # 197e12 FLOP/s; 50e9 B/s along a line of 8 chips
d, d_ff, M, t = 64, 256, mesh.shape["model"], 64
tp_flops = 6 * 2 * t * d * d_ff // M  # six matmuls, each over 1/M of the hidden units
tp_sent = 2 * 2 * (M - 1) / M * 4 * t * d  # two ring all-reduces of [t, d] in float32
print(f"cost line (estimate, v5e rates): compute {tp_flops:,} FLOPs / C = {tp_flops / C * 1e9:.1f} ns; "
      f"2 all-reduces(model) {tp_sent:,.0f} B / W = {tp_sent / W * 1e6:.2f} µs")
print(f"the sums hide when d_ff / M > (4/3)(M-1)/M · C/W = {4 / 3 * (M - 1) / M * C / W:,.0f}; here d_ff / M = {d_ff // M}")
assert np.isclose(collectives(tp_compiled).estimated_bytes, tp_sent)  # the compiled block sends what the formula says
assert d_ff / M < 4 / 3 * (M - 1) / M * C / W / 100  # far below the rule: the chip waits for every sum

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §5: the scheduled order and the cost line
print(f"On {jax.default_backend()}, the block's step runs its matmuls and sums in this order:\n")
print(f"{'step':>4}  {'op':<24}what it does")
first_sum = next(k for k, s in enumerate(tp_steps, start=1) if s.kind != "matmul")
for k, s in enumerate(tp_steps, start=1):
    if s.kind == "matmul":  # the matmuls before the first sum are the forward pass's, as the text says
        print(f"{k:>4}  {f'matmul {matmul_names.index(s.name) + 1}':<24}"
              f"a {'forward' if k < first_sum else 'backward'} matmul of this device's blocks")
    else:
        made_by = [t.name for t in tp_steps].index(producers[s.name]) + 1
        print(f"{k:>4}  {s.kind + ' over ' + ', '.join(s.axes):<24}adds up the partial sums of step {made_by}")
print()
tp_model_seconds = sum(op.seconds * op.trips for op in tp_time.timeline if op.lane == "model")
print(f"estimate_step reads {tp_time.flops:,.0f} matmul FLOPs (formula: {tp_flops:,}) and {tp_model_seconds * 1e6:.2f} µs "
      f"over model (formula: {tp_sent / W * 1e6:.2f} µs) from this compiler's program.")
if CPU:  # each sum is scheduled right after the matmul that made its partial sums
    assert all(tp_steps[k - 1].name == producers[s.name] for k, s in enumerate(tp_steps) if s.kind != "matmul")
    # the cost line, op by op: a GPU's matmuls are library calls that carry no FLOP count, so CPU only
    assert tp_time.flops == tp_flops  # the six matmuls of the compiled block, counted from their shapes
    assert np.isclose(tp_model_seconds, tp_sent / W)  # both sums at the v5e's rate for an 8-chip line

# %% [markdown]
# ## 6. Training the tensor-parallel MLP
#
# Five steps on the single-device reference and on the tensor-parallel model, from the same parameters
# (both built from `nnx.Rngs(0)`). The optimizer is created under `jax.set_mesh`, so that Adam's step
# counters live on the mesh like everything else:

# %%
opt_ref = nnx.Optimizer(reference, optax.adam(1e-2), wrt=nnx.Param)
with jax.set_mesh(mesh):
    opt_tp = nnx.Optimizer(model_tp, optax.adam(1e-2), wrt=nnx.Param)
y_repl = jax.device_put(y, NamedSharding(mesh, P()))
compiled_tp = train_step.lower(model_tp, opt_tp, x_repl, y_repl).compile()
step_ops = collectives(compiled_tp)
print(step_ops)
assert [(op.kind, op.shapes) for op in step_ops.ops] == [("all-reduce", ((64, 10),))]

losses_ref = [float(train_step(reference, opt_ref, x, y)) for _ in range(5)]
losses_tp = [float(train_step(model_tp, opt_tp, x_repl, y_repl)) for _ in range(5)]
print("single device:  ", np.round(losses_ref, 4))
print("tensor parallel:", np.round(losses_tp, 4))
assert_close(losses_tp, losses_ref)
assert losses_tp[-1] < losses_tp[0] / 5  # it learns
for trained, ref in zip(jax.tree.leaves(nnx.state(model_tp, nnx.Param)),
                        jax.tree.leaves(nnx.state(reference, nnx.Param)), strict=True):
    assert_close(trained, ref)  # gathered to the host

# %% [markdown]
# The same losses and the same trained parameters, with one all-reduce of the `(64, 10)` logits per
# step. After training, every parameter and both Adam moments still have the layout they started
# with, and each device stores one eighth of every kernel:

# %%
for name, leaf in nnx.to_flat_state(nnx.state(model_tp)):
    assert leaf[...].sharding.is_equivalent_to(NamedSharding(mesh, megatron["/".join(name)]), leaf.ndim), name
for moment in (opt_tp.opt_state[0].mu, opt_tp.opt_state[0].nu):  # Adam's first and second moments
    for name, leaf in nnx.to_flat_state(moment):
        assert leaf[...].sharding.is_equivalent_to(NamedSharding(mesh, megatron["/".join(name)]), leaf.ndim), name

params_per_device = sum(shard_table(leaf[...]).bytes_per_device[0]
                        for _, leaf in nnx.to_flat_state(nnx.state(model_tp)))
memory = memory_per_device(compiled_tp)
print(f"parameters per device: {params_per_device} B of {(64 * 256 + 256 + 256 * 10 + 10) * 4} B")
print(memory)
assert params_per_device == (64 * 32 + 32 + 32 * 10 + 10) * 4

# %% [markdown]
# The step's arguments are three copies of the per-device parameters (weights and the two Adam
# moments), two counters and the whole replicated batch. The donated state is aliased: it is updated in
# place. The hidden cell below checks these bytes one by one with the CPU compiler's figures, because an
# accelerator pads small arrays and its counts differ.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §6: the step's arguments and aliased bytes
print(f"{'CPU' if CPU else 'this'} compiler: arguments {memory.argument:,} B, aliased {memory.alias:,} B; "
      f"3 x {params_per_device:,} B of parameters and moments + 8 B of counters + {x.nbytes + y.nbytes:,} B of batch")
if CPU:  # exact sizes of the CPU compiler (accelerators pad small arrays)
    # parameters and Adam's two moments, two 4-byte counters, the whole replicated batch; all but x, y donated
    assert memory.argument == 3 * params_per_device + 8 + x.nbytes + y.nbytes
    assert memory.alias == 3 * params_per_device + 8

# %% [markdown]
# ## Takeaways
# - Tensor parallelism shards weights on a `model` axis and keeps the batch whole: `P(None, 'model')`
#   gives each of 8 devices a `(512, 64)` block of a `(512, 512)` kernel, one eighth of the memory.
# - Pair the layers: column-parallel `P(None, 'model')`, then row-parallel `P('model', None)`. The forward
#   pass needs one all-reduce per block, of the block's *output*; two column-parallel layers instead
#   all-gather the wide hidden activation. A spec must also divide the dimension it shards.
# - Attention heads fall naturally on the `model` axis: query, key and value column-parallel, output
#   projection row-parallel, one all-reduce per attention block.
# - Per block, tensor parallelism all-reduces the output forward and the input's gradient backward, both
#   growing with the tokens. Data parallelism all-reduces the gradients once. The estimated crossover is
#   about 4*d* tokens per group of 8 devices for a feed-forward block and 3*d* for a transformer layer.
# - Count the tokens of one group, not the global batch. One machine sits far above the crossover, so
#   tensor parallelism sends more bytes there. A large cluster's groups can sit below it (0.3 times at
#   1,024 chips for *d* = 8192). Data parallelism's all-reduce also overlaps the backward pass easily,
#   while tensor parallelism's needs collective matmul to hide, which is why its axis stays on the
#   fastest links. Notebook 15 turns these bytes into seconds.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** Which `PartitionSpec` makes `linear2/kernel` (shape `(256, 10)`) row-parallel on the
# 8-device `model` mesh, so that it pairs with the column-parallel `linear1/kernel`?

# %%
from spmd_course.exercises import ex08_tensor_parallel as ex

answer_1 = NOT_ANSWERED  # e.g. P(...)
ex.row_parallel_spec.check(answer_1);

# %% [markdown]
# **Exercise 2.** Predict, then check: the hidden activation is `f32[64,256@model]` and the second kernel
# is `f32[256,64@model]` (both column-parallel, as in section 3). Which collective does the compiler
# insert for `h @ w2`? Answer with its name as the HLO spells it (`'all-reduce'`, `'all-gather'`,
# `'reduce-scatter'`, `'all-to-all'`, `'collective-permute'`) or `'none'`.

# %%
answer_2 = NOT_ANSWERED  # a string such as 'all-reduce'
ex.column_column_collective.check(answer_2);

# %% [markdown]
# **Exercise 3.** In the tensor-parallel train step of section 6, how many bytes does the all-reduce
# *produce* on each device (`op.result_bytes`) at a global batch of 1024 examples?

# %%
answer_3 = NOT_ANSWERED  # a whole number of bytes
ex.tp_allreduce_bytes.check(answer_3);

# %% [markdown]
# **Next:** [09 · 2-D parallelism](09_2d_parallel.ipynb)
