# %% [markdown]
# # 07 · Tensor parallelism
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/07_tensor_parallel.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/07_tensor_parallel.ipynb)
#
# Tensor parallelism gives every device a slice of every large weight matrix, on a mesh axis called
# `model`, and the whole batch: the opposite of data parallelism (notebook 06), which gives every device
# the whole model and a slice of the batch. That divides parameter memory by the number of devices,
# but the layers now have to talk to each other in the middle of the forward pass. This notebook
# places the course's MLP on an 8-device `model` axis, counts exactly what the compiler makes the
# devices send, and finds the batch size above which that costs more than data parallelism.
#
# **You will learn**
# - what `P(None, 'model')` does to a weight matrix, checked on the guide's `(512, 512)` query projection;
# - why the guide's rule "shard every kernel on its output dimension" fails on the course MLP, and what
#   it costs where it does run: all-gathers of activations;
# - the column-parallel then row-parallel pairing: `P(None, 'model')` then `P('model', None)`, one
#   all-reduce per block, read from the compiled program;
# - how attention heads fall onto the `model` axis, one head per device;
# - when tensor parallelism pays: activation traffic grows with the batch, gradient traffic does not.

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

# %%
import contextlib
import io
import re

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import NOT_ANSWERED, collectives, draw_sharding, draw_shardings, memory_per_device, shard_table, type_string

# %% [markdown]
# ## 1. A `model` axis, and the guide's query projection
#
# Tensor parallelism needs only one mesh axis. Put all 8 devices on it and call it `model`. The axis is
# *Auto*: you place the weights, the compiler works out everything else (notebook 01 compares Auto with
# Explicit axes).

# %%
mesh = jax.make_mesh((8,), ("model",), axis_types=(AxisType.Auto,))
print(mesh)

# %% [markdown]
# The guide that seeded this course says:
#
# > Query projection: (d_model, d_model). Without sharding: each device has (512, 512).
# > With `P(None, 'model')` and 8 devices: each device has (512, 64).
#
# Build a real `(512, 512)` query projection (1 MiB of float32) and put its kernel there:

# %%
query = nnx.Linear(512, 512, use_bias=False, rngs=nnx.Rngs(0))
q_kernel = jax.device_put(query.kernel[...], NamedSharding(mesh, P(None, "model")))

table = shard_table(q_kernel)
print(type_string(q_kernel))
print(table)
assert table.shard_shapes == {(512, 64)}
assert set(table.bytes_per_device.values()) == {512 * 64 * 4}  # 128 KiB on every device
assert table.total_bytes == q_kernel.nbytes == 1024 * 1024  # nothing replicated: 1 MiB in total
np.testing.assert_array_equal(np.asarray(q_kernel), np.asarray(query.kernel[...]))  # same values, only placed

# %% [markdown]
# The claim holds: each device keeps all 512 input rows and 64 of the 512 output columns, one eighth of
# the memory. With 8 attention heads of width 64, those 64 columns are exactly one head (section 5).

# %%
fig = draw_sharding(q_kernel)
fig


# %% [markdown]
# ## 2. The course MLP, and the guide's rule applied to it
#
# The model, data and train step are the same in notebooks 06 to 09, so the strategies can be compared:
# an MLP `64 -> 256 -> 10`, a batch of 64 examples labelled by a fixed random "teacher", cross-entropy
# loss and Adam.

# %%
class MLP(nnx.Module):
    def __init__(self, rngs):
        self.linear1 = nnx.Linear(64, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))


key_x, key_teacher = jax.random.split(jax.random.key(0))
x = jax.random.normal(key_x, (64, 64))
y = jnp.argmax(x @ jax.random.normal(key_teacher, (64, 10)), axis=-1).astype(jnp.int32)


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


reference = MLP(nnx.Rngs(0))  # stays on one device: the answer every sharded run must reproduce
print({name: leaf.shape for name, leaf in nnx.to_flat_state(nnx.state(reference))})


# %% [markdown]
# The guide's tensor-parallel recipe walks the parameter tree and shards every 2-D `kernel` on its
# second (output) dimension, replicating everything else:
#
# ```python
# if 'kernel' in str(path) and len(array.shape) >= 2:
#     return jax.device_put(array, NamedSharding(mesh, P(None, 'model')))
# ```
#
# ### Gotcha: the rule cannot place a 10-wide output on 8 devices
#
# Apply it, as written, to the MLP's state:

# %%
def seed_rule(path, array):
    if "kernel" in str(path) and len(array.shape) >= 2:
        return NamedSharding(mesh, P(None, "model"))
    return NamedSharding(mesh, P())


model = MLP(nnx.Rngs(0))
state = nnx.state(model)
raised = []
try:
    # jax 0.12.0.1 also prints the failing source line to stdout (a stray debug print): keep it out
    with contextlib.redirect_stdout(io.StringIO()):
        jax.device_put(state, jax.tree_util.tree_map_with_path(seed_rule, state))
except ValueError as err:
    raised.append(type(err).__name__)
    print(f"{type(err).__name__}: ...", re.search(r"array axis 1 .*?\(full shape: \(256, 10\)", str(err)).group(0))
assert raised == ["IndivisibleError"]


# %% [markdown]
# `linear2/kernel` is `(256, 10)`: its output dimension has 10 columns, and 10 does not split into 8 equal
# blocks. `jax.device_put` only builds even layouts. The rule needs a
# divisibility test. The smallest repair shards a kernel only when its output dimension divides by the
# axis size, so `linear2/kernel` stays replicated:

# %%
def seed_rule_fixed(path, array):
    if "kernel" in str(path) and len(array.shape) >= 2 and array.shape[1] % mesh.shape["model"] == 0:
        return NamedSharding(mesh, P(None, "model"))
    return NamedSharding(mesh, P())


model_seed = MLP(nnx.Rngs(0))
state = nnx.state(model_seed)
nnx.update(model_seed, jax.device_put(state, jax.tree_util.tree_map_with_path(seed_rule_fixed, state)))

assert model_seed.linear1.kernel[...].sharding.spec == P(None, "model")
assert model_seed.linear2.kernel[...].sharding.is_fully_replicated
fig = draw_shardings(nnx.state(model_seed), ncols=4)
fig


# %% [markdown]
# ## 3. Column-parallel, then row-parallel
#
# The layout that tensor parallelism is built on (Megatron-LM's) pairs the two layers:
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
# the same hidden units. That gives a `(64, 10)` *partial* result: the sum over its 32 hidden units only.
# The 8 partial results are added up by one **all-reduce**. Place the parameters:

# %%
def param_name(path):  # (DictKey('linear1'), DictKey('kernel'), GetAttrKey('value')) -> 'linear1/kernel'
    return "/".join(str(k.key) for k in path if hasattr(k, "key"))


megatron = {
    "linear1/kernel": P(None, "model"),
    "linear1/bias": P("model"),
    "linear2/kernel": P("model", None),
    "linear2/bias": P(),
}
model_tp = MLP(nnx.Rngs(0))
state = nnx.state(model_tp)
shardings = jax.tree_util.tree_map_with_path(lambda path, _: NamedSharding(mesh, megatron[param_name(path)]), state)
nnx.update(model_tp, jax.device_put(state, shardings))

for name, leaf in nnx.to_flat_state(nnx.state(model_tp)):
    print(f"{'/'.join(name):<16}{type_string(leaf[...]):<22}{leaf[...].sharding.shard_shape(leaf.shape)}")
assert model_tp.linear1.kernel[...].sharding.shard_shape((64, 256)) == (64, 32)
assert model_tp.linear2.kernel[...].sharding.shard_shape((256, 10)) == (32, 10)
fig = draw_shardings(nnx.state(model_tp), ncols=4)
fig

# %% [markdown]
# The batch is replicated: every device gets all 64 examples. Compile the forward pass and list the
# collectives the compiler inserted:

# %%
x_repl = jax.device_put(x, NamedSharding(mesh, P()))
forward = jax.jit(lambda model, x: model(x))
compiled = forward.lower(model_tp, x_repl).compile()
ops = collectives(compiled)
print(ops)

assert ops.counts["all-reduce"] == 1 and ops.count() == 1  # one all-reduce for the whole block, nothing else
assert ops.ops[0].result_type == "f32[64,10]" and ops.ops[0].group_size == 8
np.testing.assert_allclose(forward(model_tp, x_repl), reference(x), rtol=1e-5, atol=1e-6)

hidden = jax.jit(lambda model, x: jax.nn.relu(model.linear1(x)))(model_tp, x_repl)
print("hidden activation:", type_string(hidden), "->", shard_table(hidden).bytes_per_device[0], "B per device")
assert hidden.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "model")), 2)
assert shard_table(hidden).shard_shapes == {(64, 32)}

# %% [markdown]
# One all-reduce of the `(64, 10)` logits over all 8 devices, and the logits equal the single-device
# model's. The hidden activation never travels: each device keeps its `(64, 32)` block. In the vocabulary of the four matmul cases (notebook 04):
# - layer 1, `f32[64,64] @ f32[64,256@model]`: no operand is sharded on the contracting dimension (64),
#   so no communication; the result is `f32[64,256@model]`;
# - layer 2, `f32[64,256@model] @ f32[256@model,10]`: *both* operands are sharded on the contracting
#   dimension (256) over the same axis, so each device computes a partial sum and an all-reduce adds them.
#
# The repaired guide rule of section 2 left `linear2/kernel` replicated. What does the compiler do with
# that?

# %%
compiled_seed = forward.lower(model_seed, x_repl).compile()
ops_seed = collectives(compiled_seed)
print(ops_seed)
assert ops_seed.counts == ops.counts and ops_seed.estimated_bytes == ops.estimated_bytes

w2_seed = shard_table(model_seed.linear2.kernel[...])
w2_tp = shard_table(model_tp.linear2.kernel[...])
print(f"linear2/kernel per device: replicated {w2_seed.bytes_per_device[0]} B, "
      f"row-parallel {w2_tp.bytes_per_device[0]} B")
assert w2_seed.bytes_per_device[0] == 8 * w2_tp.bytes_per_device[0] == 256 * 10 * 4


# %% [markdown]
# The same single all-reduce. Slicing a replicated array costs nothing, so the compiler cut the 32 rows it
# needed out of the replicated `linear2/kernel` on each device and made the layer row-parallel by itself.
# The communication is the same; the memory is not: each device stores all of `linear2/kernel`, 8 times
# what the row-parallel layout stores. (Section 7 shows that after one training step the compiler hands
# the updated kernel back row-parallel anyway.)

# %% [markdown]
# ## 4. Both kernels column-parallel: what the guide's rule costs where it runs
#
# The guide's rule can run unchanged on a block whose dimensions all divide by 8, such as the
# feed-forward half of a transformer layer, `64 -> 256 -> 64`. There it makes *both* kernels
# column-parallel. Compare it with the column/row pairing, with the block's output replicated as the
# next layer (and the residual connection) needs it:

# %%
class FeedForward(nnx.Module):
    def __init__(self, rngs):
        self.linear1 = nnx.Linear(64, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 64, rngs=rngs)

    def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))


ff_seed = FeedForward(nnx.Rngs(0))
state = nnx.state(ff_seed)
nnx.update(ff_seed, jax.device_put(state, jax.tree_util.tree_map_with_path(seed_rule, state)))

ff_tp = FeedForward(nnx.Rngs(0))
state = nnx.state(ff_tp)
shardings = jax.tree_util.tree_map_with_path(lambda path, _: NamedSharding(mesh, megatron[param_name(path)]), state)
nnx.update(ff_tp, jax.device_put(state, shardings))

forward_repl = jax.jit(lambda model, x: model(x), out_shardings=NamedSharding(mesh, P()))
ff_ops_seed = collectives(forward_repl.lower(ff_seed, x_repl).compile())
ff_ops_tp = collectives(forward_repl.lower(ff_tp, x_repl).compile())
print("guide's rule, both kernels P(None, 'model'):", ff_ops_seed, sep="\n")
print("\ncolumn then row:", ff_ops_tp, sep="\n")

assert [(op.kind, op.result_type) for op in ff_ops_seed.ops] == [("all-gather", "f32[64,256]"),
                                                                 ("all-gather", "f32[64,64]")]
assert [(op.kind, op.result_type) for op in ff_ops_tp.ops] == [("all-reduce", "f32[64,64]")]
assert ff_ops_seed.estimated_bytes == 2.5 * ff_ops_tp.estimated_bytes
np.testing.assert_allclose(forward_repl(ff_seed, x_repl), forward_repl(ff_tp, x_repl), rtol=1e-5, atol=1e-6)


# %% [markdown]
# Same numbers, 2.5 times the traffic. With both kernels column-parallel, layer 2 gets a hidden activation
# `f32[64,256@model]` sharded on its contracting dimension and a kernel that is not: the compiler has to
# **all-gather the whole `(64, 256)` hidden activation** on every device, then all-gather the output
# columns too. The pairing instead all-reduces only the `(64, 64)` output. Under the ring algorithm an
# all-gather of an array costs each device (N-1)/N of its size and an all-reduce 2(N-1)/N, so:
#
# - both column-parallel: (256 + 64) x 64 x 4 B x 7/8 = 70 KiB;
# - column then row: 2 x 64 x 64 x 4 B x 7/8 = 28 KiB.
#
# The wider the hidden layer (transformers use 4 x the model width), the bigger the gap.

# %% [markdown]
# ## 5. Attention heads on the `model` axis
#
# Multi-head attention is tensor-parallel by construction: the heads are independent until the output
# projection adds them up. Shard the query, key and value projections column-parallel, so each device's
# columns are whole heads, and the output projection row-parallel. A small block with width 64 and
# 8 heads of width 8 puts one head on each device:

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
attn_tp = Attention(64, 8, rngs=nnx.Rngs(1))
state = nnx.state(attn_tp)
shardings = jax.tree_util.tree_map_with_path(lambda path, _: NamedSharding(mesh, heads_layout[param_name(path)]), state)
nnx.update(attn_tp, jax.device_put(state, shardings))

tokens = x.reshape(4, 16, 64)  # the course batch read as (batch, sequence, width): 4 sequences of 16 tokens
tokens_repl = jax.device_put(tokens, NamedSharding(mesh, P()))
assert attn_tp.query.kernel[...].sharding.shard_shape((64, 64)) == (64, 8)  # one head's 8 columns
assert attn_tp.out.kernel[...].sharding.shard_shape((64, 64)) == (8, 64)  # that head's 8 rows

weights = jax.jit(lambda attn, x: attn.weights(x))(attn_tp, tokens_repl)
print("attention weights:", type_string(weights))
assert weights.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "model")), 4)  # heads split over devices
fig = draw_shardings(nnx.state(attn_tp), ncols=4)
fig

# %% [markdown]
# The attention weights come out as `f32[4,8@model,16,16]`: each device computed its own head, with no
# communication. Only the output projection adds the heads up:

# %%
forward_attn = jax.jit(lambda attn, x: attn(x), out_shardings=NamedSharding(mesh, P()))
attn_ops = collectives(forward_attn.lower(attn_tp, tokens_repl).compile())
print(attn_ops)
assert [(op.kind, op.result_type, op.group_size) for op in attn_ops.ops] == [("all-reduce", "f32[4,16,64]", 8)]
np.testing.assert_allclose(forward_attn(attn_tp, tokens_repl), jax.jit(attn_ref)(tokens), rtol=1e-5, atol=1e-5)

# %% [markdown]
# What would the guide's rule do here? All four kernels are `(64, 64)`, so it makes all four
# column-parallel, the output projection included:

# %%
attn_seed = Attention(64, 8, rngs=nnx.Rngs(1))
state = nnx.state(attn_seed)
nnx.update(attn_seed, jax.device_put(state, jax.tree_util.tree_map_with_path(seed_rule, state)))
attn_ops_seed = collectives(forward_attn.lower(attn_seed, tokens_repl).compile())
print(attn_ops_seed)
assert attn_ops_seed.counts["all-gather"] == 2 and attn_ops_seed.count() == 2
assert attn_ops_seed.estimated_bytes == attn_ops.estimated_bytes  # a tie

# %% [markdown]
# Two all-gathers of `(4, 16, 64)` (the heads' output, then the projected columns) against one all-reduce of
# the same size: a tie in bytes, because an all-reduce moves exactly twice what an all-gather of the same
# array moves. The column/row pairing wins when the activation it avoids gathering is *wider* than the one
# it reduces, as in the feed-forward block of section 4; for square projections it still saves one
# collective.

# %% [markdown]
# ## 6. When tensor parallelism pays: activations against gradients
#
# The guide's table says:
#
# > Data parallelism: O(parameters) all-reduce per step. Good for small models, large batches.
# > Tensor parallelism: O(activations) all-reduce per layer. Good for large models, but more communication.
#
# Measure both on the full train step at two batch sizes: tensor parallelism with `model_tp` on the
# 8-device `model` mesh (batch replicated), data parallelism on an 8-device `data` mesh (parameters
# replicated, batch split). The optimizers are created under `jax.set_mesh`, so that Adam's step
# counters live on the mesh like everything else.

# %%
with jax.set_mesh(mesh):
    opt_tp = nnx.Optimizer(model_tp, optax.adam(1e-2), wrt=nnx.Param)

dp_mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
model_dp = MLP(nnx.Rngs(0))
nnx.update(model_dp, jax.device_put(nnx.state(model_dp), NamedSharding(dp_mesh, P())))
with jax.set_mesh(dp_mesh):
    opt_dp = nnx.Optimizer(model_dp, optax.adam(1e-2), wrt=nnx.Param)

traffic, compiled_tp = {}, {}
for batch in (64, 512):
    xb, yb = np.zeros((batch, 64), np.float32), np.zeros((batch,), np.int32)  # only shapes matter here
    step_tp = train_step.lower(model_tp, opt_tp, jax.device_put(xb, NamedSharding(mesh, P())),
                               jax.device_put(yb, NamedSharding(mesh, P()))).compile()
    step_dp = train_step.lower(model_dp, opt_dp, jax.device_put(xb, NamedSharding(dp_mesh, P("data"))),
                               jax.device_put(yb, NamedSharding(dp_mesh, P("data")))).compile()
    compiled_tp[batch] = step_tp
    traffic[batch] = {"tensor": collectives(step_tp), "data": collectives(step_dp)}
    print(f"batch {batch}, tensor parallel:", traffic[batch]["tensor"], sep="\n")
    print(f"batch {batch}, data parallel:", traffic[batch]["data"], "", sep="\n")

# %% [markdown]
# Per step, tensor parallelism all-reduces the `(batch, 10)` logits: the forward pass's partial sums. (The
# backward pass needs nothing here because the input `x` is data, not a parameter: no gradient flows into
# it.) Data parallelism all-reduces every gradient, fused into one tuple, plus the loss: its size is the
# parameter count, whatever the batch.

# %%
n_params = 64 * 256 + 256 + 256 * 10 + 10
tp64, tp512 = traffic[64]["tensor"], traffic[512]["tensor"]
dp64, dp512 = traffic[64]["data"], traffic[512]["data"]
assert tp64.kinds == tp512.kinds == {"all-reduce"} and tp64.count() == 1
assert tp512.estimated_bytes == 8 * tp64.estimated_bytes  # 8 x the batch -> 8 x the traffic
assert dp512.estimated_bytes == dp64.estimated_bytes  # independent of the batch
assert dp64.result_bytes == (n_params + 1) * 4  # every gradient, plus the loss scalar

per_example = tp64.estimated_bytes / 64
crossover = dp64.estimated_bytes / per_example
print(f"tensor parallel: {per_example:.0f} B per example per device; data parallel: {dp64.estimated_bytes:.0f} B per step")
print(f"crossover batch size: {crossover:.0f} examples")
assert 1900 < crossover < 1950
print(f"at batch 64, data parallelism moves {dp64.estimated_bytes / tp64.estimated_bytes:.0f} x what tensor parallelism moves")
assert round(dp64.estimated_bytes / tp64.estimated_bytes) == 30

# %%
batches = np.array([0, 4096])
fig, ax = plt.subplots(figsize=(6, 3.4))
ax.plot(batches, batches * per_example / 1024, label="tensor parallel: all-reduce of activations")
ax.plot(batches, [dp64.estimated_bytes / 1024] * 2, label="data parallel: all-reduce of gradients")
ax.scatter([64, 512], [tp64.estimated_bytes / 1024, tp512.estimated_bytes / 1024], color="C0", zorder=3, label="measured")
ax.scatter([64, 512], [dp64.estimated_bytes / 1024, dp512.estimated_bytes / 1024], color="C1", zorder=3)
ax.axvline(crossover, color="grey", linestyle=":")
ax.annotate(f"crossover ~{crossover:.0f}", (crossover, 20), xytext=(6, 0), textcoords="offset points", fontsize=9)
ax.set_xlabel("global batch size (examples)")
ax.set_ylabel("KiB sent per device per step")
ax.set_title("MLP 64 -> 256 -> 10 on 8 devices", fontsize=10)
ax.legend(fontsize=8)
fig.tight_layout()
plt.close(fig)
fig

# %% [markdown]
# Two corrections to the guide's table. "Per layer": the forward pass needs one all-reduce per *pair* of
# layers, not per layer. "More communication": for this MLP tensor parallelism moves **30 times less**
# than data parallelism at batch 64, and only overtakes it beyond about 1,900 examples, where the
# `(batch, 10)` activations outweigh the 19,210 gradients. In general, per block, tensor parallelism
# all-reduces *batch x output width* numbers and data parallelism all-reduces the block's *parameter
# count*, so the crossover batch is parameters / output width: 19,210 / 10 here, and 8 x the model width
# for a transformer's feed-forward block (8 d² parameters, output width d; count tokens, not sequences,
# as the batch). Tensor parallelism is also the one of the two that divides parameter memory (section 7).
# Its traffic sits in the middle of the forward pass, though, which is why it is usually kept on the
# fastest links, within one machine.
#
# In a stack of layers the input of each block *is* differentiated, and its gradient is a partial sum too.
# Differentiate the MLP with respect to its input to see the second all-reduce that a deep network pays
# per block, in the backward pass:

# %%
input_grad = jax.jit(jax.grad(lambda x, model: model(x).sum()))
grad_ops = collectives(input_grad.lower(x_repl, model_tp).compile())
print(grad_ops)
assert [(op.kind, op.result_type) for op in grad_ops.ops] == [("all-reduce", "f32[64,64]")]

# %% [markdown]
# ## 7. Training the tensor-parallel MLP
#
# Five steps of the same train step, on the single-device reference and on the tensor-parallel model
# with the optimizer of section 6, starting from the same parameters (both built from `nnx.Rngs(0)`; the
# sharded copy is only placed differently):

# %%
for (name, leaf_tp), (_, leaf_ref) in zip(nnx.to_flat_state(nnx.state(model_tp)),
                                          nnx.to_flat_state(nnx.state(reference)), strict=True):
    np.testing.assert_array_equal(np.asarray(leaf_tp[...]), np.asarray(leaf_ref[...]), err_msg=str(name))

opt_ref = nnx.Optimizer(reference, optax.adam(1e-2), wrt=nnx.Param)
losses_ref = [float(train_step(reference, opt_ref, x, y)) for _ in range(5)]

y_repl = jax.device_put(y, NamedSharding(mesh, P()))
assert opt_tp.step[...].sharding.is_equivalent_to(NamedSharding(mesh, P()), 0)  # created on the mesh (section 6)
losses_tp = [float(train_step(model_tp, opt_tp, x_repl, y_repl)) for _ in range(5)]

print("single device:  ", np.round(losses_ref, 4))
print("tensor parallel:", np.round(losses_tp, 4))
np.testing.assert_allclose(losses_tp, losses_ref, rtol=1e-5)
assert losses_tp[-1] < losses_tp[0] / 5  # it learns

# %% [markdown]
# The same losses. After training, every parameter and both Adam moments still have the layout they
# started with, and each device holds one eighth of every kernel:

# %%
for name, leaf in nnx.to_flat_state(nnx.state(model_tp)):
    spec = megatron["/".join(name)]
    assert leaf[...].sharding.is_equivalent_to(NamedSharding(mesh, spec), leaf.ndim), name
for moment in (opt_tp.opt_state[0].mu, opt_tp.opt_state[0].nu):  # Adam's first and second moments
    for name, leaf in nnx.to_flat_state(moment):
        assert leaf[...].sharding.is_equivalent_to(NamedSharding(mesh, megatron["/".join(name)]), leaf.ndim), name

params_per_device = sum(shard_table(leaf[...]).bytes_per_device[0]
                        for _, leaf in nnx.to_flat_state(nnx.state(model_tp)))
print(f"parameters per device: {params_per_device} B of {n_params * 4} B")
assert params_per_device == (64 * 32 + 32 + 32 * 10 + 10) * 4

memory = memory_per_device(compiled_tp[64])  # the train step compiled in section 6 for this layout and batch
print(memory)
# arguments = parameters + Adam's two moments (each one eighth of a kernel) + Adam's step counters + x + y
assert memory.argument == 3 * params_per_device + 4 + 4 + x.nbytes + y.nbytes

# %% [markdown]
# The arguments of the compiled step are exactly the arithmetic: three copies of the per-device
# parameters (weights and the two Adam moments), two 4-byte counters, and the whole replicated batch.
#
# ### Gotcha: on an Auto mesh, the compiler chooses the parameters' new layout
#
# `nnx.jit` returns the updated parameters with whatever sharding the compiler found best. With the
# column/row pairing that is the layout you gave. With the repaired guide rule (`linear2/kernel`
# replicated), it is not:

# %%
before = {"/".join(name): leaf[...].sharding.spec for name, leaf in nnx.to_flat_state(nnx.state(model_seed))}
with jax.set_mesh(mesh):
    opt_seed = nnx.Optimizer(model_seed, optax.adam(1e-2), wrt=nnx.Param)
loss_seed = float(train_step(model_seed, opt_seed, x_repl, y_repl))  # one step
after = {"/".join(name): leaf[...].sharding.spec for name, leaf in nnx.to_flat_state(nnx.state(model_seed))}
for name in before:
    print(f"{name:<16}before {before[name]!s:<20}after {after[name]}")

np.testing.assert_allclose(loss_seed, losses_ref[0], rtol=1e-5)
assert before["linear2/kernel"] == P() and before["linear1/bias"] == P()
assert model_seed.linear2.kernel[...].sharding.is_equivalent_to(NamedSharding(mesh, P("model", None)), 2)
assert model_seed.linear1.bias[...].sharding.is_equivalent_to(NamedSharding(mesh, P("model")), 1)

# %% [markdown]
# The loss is right, but the layout moved: after one step `linear2/kernel` came back row-parallel,
# `P('model',)` (inferred specs drop trailing `None`s), and `linear1/bias` sharded like the hidden
# units. The compiler converged on the column/row pairing by itself. Convenient here, but the layout you
# chose is no longer the layout you have, and a checkpoint written now would store the compiler's layout,
# not yours. The fix is the layout above: give the column/row pairing from the start, and check the
# layouts after a step, as the cell before the gotcha did.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** Which `PartitionSpec` makes `linear2/kernel` (shape `(256, 10)`) row-parallel on the
# 8-device `model` mesh, so that it pairs with the column-parallel `linear1/kernel`?

# %%
from exercises import ex07_tensor_parallel as ex

answer_1 = NOT_ANSWERED  # e.g. P(...)
ex.row_parallel_spec.check(answer_1);

# %% [markdown]
# **Exercise 2.** Predict, then check: the hidden activation is `f32[64,256@model]` and the second kernel
# is `f32[256,64@model]` (both column-parallel, as in section 4). Which collective does the compiler
# insert for `h @ w2`? Answer with its name as the HLO spells it (`'all-reduce'`, `'all-gather'`,
# `'reduce-scatter'`, `'all-to-all'`, `'collective-permute'`) or `'none'`.

# %%
answer_2 = NOT_ANSWERED  # a string such as 'all-reduce'
ex.column_column_collective.check(answer_2);

# %% [markdown]
# **Exercise 3.** In the tensor-parallel train step with the column/row pairing, how many bytes does the
# all-reduce *produce* on each device (`op.result_bytes`) at a global batch of 1024 examples?

# %%
answer_3 = NOT_ANSWERED  # a whole number of bytes
ex.tp_allreduce_bytes.check(answer_3);

# %% [markdown]
# ## Takeaways
# - Tensor parallelism shards weights on a `model` axis and keeps the batch whole: `P(None, 'model')`
#   gives each of 8 devices a `(512, 64)` block of a `(512, 512)` kernel, one eighth of the memory.
# - A spec must divide the dimension it shards: the guide's blanket "kernels on `P(None, 'model')`" rule
#   raises `IndivisibleError` on a 10-wide output layer.
# - Pair the layers: column-parallel `P(None, 'model')`, then row-parallel `P('model', None)`. The forward
#   pass then needs one all-reduce per block, of the block's *output*; two column-parallel layers instead
#   all-gather the wide hidden activation (2.5 times the bytes for a 4x-wide hidden layer).
# - Attention heads fall naturally on the `model` axis: query, key and value column-parallel, output
#   projection row-parallel, one all-reduce per attention block.
# - Tensor-parallel traffic grows with the batch, data-parallel traffic with the parameter count: for the
#   course MLP the crossover is about 1,900 examples per step. On an Auto mesh, check that the parameter
#   layouts after a step are the ones you asked for.
#
# **Next:** [08 · 2-D parallelism](08_2d_parallel.ipynb)
