# %% [markdown]
# # 14 · Choosing a mesh shape
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/14_mesh_shape.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/14_mesh_shape.ipynb)
#
# With 64 devices and a `data` x `model` mesh, the seed lists five shapes, from `(64, 1)` (pure data
# parallel) to `(1, 64)` (pure model parallel), with a rule of thumb: "More data parallelism → better
# batch throughput; more model parallelism → larger models fit". This notebook compiles the
# transformer's train step of notebook 11 for each of the five shapes, without running it, and reads
# off what each device would hold and send per step. The numbers support a sharper rule, and show
# where the seed's is right and where it is not.
#
# **You will learn**
# - how to compile a train step for 64 devices without allocating anything (`nnx.eval_shape`,
#   `jax.ShapeDtypeStruct`), and read its per-device memory and collectives;
# - how parameters, gradients and activations each scale with the `data` and `model` axes;
# - why the pure data-parallel and pure model-parallel corners both cost the most memory here, and
#   which traffic each axis causes;
# - what happens when an axis is wider than a dimension it splits: an error for the batch, silent
#   extra communication for attention heads.

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
SETUP = setup_devices(64)

# %%
import re

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from flax import nnx
from flax.linen import with_logical_constraint
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import NOT_ANSWERED, collectives, draw_mesh, format_bytes, memory_per_device, mesh_labels, shard_table
from utils import type_string

assert jax.device_count() == 64 == SETUP.count

# %% [markdown]
# ## 1. The model, at the seed's width
#
# The model code below is **the same as in notebook 11**, repeated so that this notebook runs on its
# own: a decoder-only transformer whose parameters carry logical names (`'vocab'`, `'embed'`,
# `'heads'`, `'mlp'`) and whose residual stream is constrained to `('batch', None, None)`.

# %%
dense_init = nnx.initializers.lecun_normal()
embed_init = nnx.initializers.normal(0.02)
part = nnx.with_partitioning
RESIDUAL = ("batch", None, None)


def layer_norm(d_model, rngs):
    return nnx.LayerNorm(d_model, scale_init=part(nnx.initializers.ones_init(), ("embed",)),
                         bias_init=part(nnx.initializers.zeros_init(), ("embed",)), rngs=rngs)


class Attention(nnx.Module):
    def __init__(self, d_model, num_heads, *, rngs):
        self.num_heads = num_heads
        qkv = dict(kernel_init=part(dense_init, ("embed", "heads")), use_bias=False, rngs=rngs)
        self.query = nnx.Linear(d_model, d_model, **qkv)
        self.key = nnx.Linear(d_model, d_model, **qkv)
        self.value = nnx.Linear(d_model, d_model, **qkv)
        self.out = nnx.Linear(d_model, d_model, kernel_init=part(dense_init, ("heads", "embed")),
                              use_bias=False, rngs=rngs)

    def __call__(self, x):
        b, s, d = x.shape
        h = self.num_heads
        q, k, v = (f(x).reshape(b, s, h, d // h) for f in (self.query, self.key, self.value))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(d // h))
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        return self.out(y.reshape(b, s, d))


class MLP(nnx.Module):
    def __init__(self, d_model, d_ff, *, rngs):
        self.up = nnx.Linear(d_model, d_ff, kernel_init=part(dense_init, ("embed", "mlp")), use_bias=False, rngs=rngs)
        self.down = nnx.Linear(d_ff, d_model, kernel_init=part(dense_init, ("mlp", "embed")), use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
    def __init__(self, d_model, num_heads, d_ff, *, rngs):
        self.norm1, self.attn = layer_norm(d_model, rngs), Attention(d_model, num_heads, rngs=rngs)
        self.norm2, self.mlp = layer_norm(d_model, rngs), MLP(d_model, d_ff, rngs=rngs)

    def __call__(self, x):
        x = with_logical_constraint(x + self.attn(self.norm1(x)), RESIDUAL)
        return with_logical_constraint(x + self.mlp(self.norm2(x)), RESIDUAL)


class MyTransformer(nnx.Module):
    def __init__(self, d_model=64, num_layers=2, num_heads=8, d_ff=256, vocab_size=32, max_len=16, *, rngs):
        self.tokens = nnx.Embed(vocab_size, d_model, embedding_init=part(embed_init, ("vocab", "embed")), rngs=rngs)
        self.positions = nnx.Embed(max_len, d_model, embedding_init=part(embed_init, (None, "embed")), rngs=rngs)
        self.blocks = nnx.List([Block(d_model, num_heads, d_ff, rngs=rngs) for _ in range(num_layers)])
        self.norm = layer_norm(d_model, rngs)
        self.head = nnx.Linear(d_model, vocab_size, kernel_init=part(dense_init, ("embed", "vocab")),
                               use_bias=False, rngs=rngs)

    def __call__(self, tokens):
        x = self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[1]))
        x = with_logical_constraint(x, RESIDUAL)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# %% [markdown]
# The sizes: the seed's `d_model=512` with 8 heads of 64 and `d_ff = 4 x 512`, a vocabulary of 512,
# sequences of 32, a global batch of 64 sequences. Every dimension that a mesh axis splits is
# divisible by 64: the batch (over `data`) and 512, 2048, 512 (over `model`). Two layers instead of
# the seed's six keep compilation short; each layer adds the same collectives, so the per-layer
# pattern is all you need.
#
# `nnx.eval_shape` builds the model and its Adam optimizer **abstractly**: every array is a
# `jax.ShapeDtypeStruct` (shape and dtype, no data). Nothing is allocated, which matters here:
# under pure data parallelism each of the 64 devices would hold the whole 78 MiB state.

# %%
D_MODEL, NUM_LAYERS, NUM_HEADS, D_FF, VOCAB, SEQ, BATCH = 512, 2, 8, 2048, 512, 32, 64


def build():
    with nnx.use_eager_sharding(False):
        model = MyTransformer(D_MODEL, NUM_LAYERS, NUM_HEADS, D_FF, VOCAB, SEQ, rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)


graphdef, abstract = nnx.split(nnx.eval_shape(build))
leaves = jax.tree.leaves(abstract)
n_params = sum(x.size for x in jax.tree.leaves(nnx.state(abstract[0], nnx.Param)))
n_split = NUM_LAYERS * (4 * D_MODEL**2 + 2 * D_MODEL * D_FF) + 2 * VOCAB * D_MODEL  # 'heads', 'mlp', 'vocab'
n_embed_only = (2 * NUM_LAYERS + 1) * 2 * D_MODEL + SEQ * D_MODEL  # layer norms, position table
print(f"{n_params:,} parameters ({format_bytes(4 * n_params)}); with Adam's two moments "
      f"{format_bytes(sum(x.size * x.dtype.itemsize for x in leaves))} of state, as {type(leaves[0]).__name__}s")
assert n_params == n_split + n_embed_only == 6_837_248
assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)  # nothing allocated

# %% [markdown]
# ## 2. Five meshes, one rule table, five compilations
#
# Every shape uses notebook 11's 2-D rules: `batch` over `data`; `heads`, `mlp` and `vocab` over
# `model`; `embed` whole. For each shape the cell builds the mesh, turns the abstract state into
# `ShapeDtypeStruct`s that carry their `NamedSharding`, and lowers and compiles the train step.
# Nothing runs. The step donates its input state (`donate_argnums=0`), as a real training loop
# would, so the new state reuses the old state's buffers and a device's footprint is its arguments
# plus its temporaries.

# %%
SHAPES = [(64, 1), (32, 2), (16, 4), (8, 8), (1, 64)]
RULES = (("batch", "data"), ("vocab", "model"), ("embed", None), ("heads", "model"), ("mlp", "model"))
FAST_COMPILE = {"xla_backend_optimization_level": 0}  # never run: skip optimising the machine code (notebook 11)


def train_step(state, tokens):
    with nnx.logical_axis_rules(RULES):  # read while tracing (notebook 11, section 3)
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model):
            logits = model(tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss


def compile_for(shape, batch=BATCH):
    mesh = jax.make_mesh(shape, ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
    with nnx.logical_axis_rules(RULES):
        shardings = nnx.get_named_sharding(abstract, mesh)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)
    tokens = jax.ShapeDtypeStruct((batch, SEQ + 1), jnp.int32, sharding=NamedSharding(mesh, P("data", None)))
    step = jax.jit(train_step, donate_argnums=0, out_shardings=(shardings, NamedSharding(mesh, P())),
                   compiler_options=FAST_COMPILE)
    with jax.set_mesh(mesh):
        return step.lower(state, tokens).compile(), state


compiled, states = {}, {}
for shape in SHAPES:
    compiled[shape], states[shape] = compile_for(shape)
    print(shape, memory_per_device(compiled[shape]))

# %% [markdown]
# Here is the `(8, 8)` mesh: `data` runs down, `model` across. Under the 2-D rules a parameter is cut
# along `model` only, so each column of this grid holds one block, and the 8 devices of a column hold
# the same block. For the MLP's first matrix (`f32[512, 2048]`, names `('embed', 'mlp')`), under
# each shape:

# %%
mesh_8x8 = jax.make_mesh((8, 8), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
fig = draw_mesh(mesh_8x8)
assert mesh_labels(fig)[0] == mesh_8x8.device_ids.tolist()

for d, m in SHAPES:
    kernel = states[(d, m)][0]["blocks"][0]["mlp"]["up"]["kernel"].get_value()
    table = shard_table(kernel)
    (block,) = table.shard_shapes
    copies = len(table.rows) // len({row.index for row in table.rows})
    print(f"{(d, m)!s:<9} {type_string(kernel):<22} block {block!s:<12} "
          f"{format_bytes(max(table.bytes_per_device.values())):>10} per device, {copies:>2} copies of each block")
    assert block == (512, 2048 // m) and copies == d
fig

# %% [markdown]
# ## 3. Memory per device
#
# Three things live on a device during a step, and they scale differently:
# - the **state** (parameters, Adam's two moments: 12 bytes per parameter) shrinks with the `model`
#   axis, for the 6.8 M parameters in split matrices; the 21 K in layer norms and the position table
#   stay whole; the `data` axis does not help at all;
# - the **gradients** (4 bytes per parameter, in the temporaries) shrink the same way;
# - the **activations** (also temporaries) shrink with the `data` axis, which splits the batch; the
#   `model` axis splits only the heads/MLP activations, not the residual stream.

# %%
print(f"{'mesh':<10}{'state':>11}{'temporaries':>13}{'footprint':>11}   batch rows per device")
memory = {}
for d, m in SHAPES:
    mem = memory_per_device(compiled[(d, m)])
    batch_bytes = (BATCH // d) * (SEQ + 1) * 4
    state_bytes = mem.argument - batch_bytes
    footprint = mem.argument + mem.temp
    memory[(d, m)] = (state_bytes, mem.temp, footprint)
    print(f"{(d, m)!s:<10}{format_bytes(state_bytes):>11}{format_bytes(mem.temp):>13}"
          f"{format_bytes(footprint):>11}   {BATCH // d}")
    assert state_bytes == 12 * (n_split // m + n_embed_only) + 8  # + Adam's count and the step counter
    assert mem.temp >= 4 * (n_split // m + n_embed_only)  # at least one gradient for every parameter
    assert mem.alias == state_bytes  # the new state is written into the donated state's buffers

state_b, temp_b, total_b = (np.array([memory[s][i] for s in SHAPES]) for i in range(3))
assert np.all(np.diff(state_b) < 0)  # more model parallelism: less state per device, every step of the way
assert temp_b[-1] > 50 * state_b[-1]  # (1, 64): the whole batch's activations dwarf the state
best_memory = SHAPES[int(np.argmin(total_b))]
print("smallest footprint:", best_memory)
assert total_b[0] == total_b.max() and total_b[-1] > total_b[2]  # both corners cost more than the middle

# %% [markdown]
# Pure data parallel `(64, 1)` holds everything 64 times over; pure model parallel `(1, 64)` holds
# 1/64 of the state but every device works on all 64 sequences, and those activations (about 91 MiB)
# are far larger than the state it saved. The smallest footprint is in between, where the two
# shrink together.
#
# ## 4. Communication per step
#
# Two kinds of traffic, one per axis. Over `data`: the **gradients**, summed once per step, each device
# summing only the slice of them it owns. Over `model`: the **activations**, summed several times per
# layer (notebook 11, section 3). A collective's result type tells them apart: activations start with
# the batch rows a device holds, `[64/d, ...]`. (When `d = m`, as in `(8, 8)`, the group size alone
# cannot.)

# %%
MiB = 2**20
traffic = {}
print(f"{'mesh':<10}{'collectives':>12}{'gradients (over data)':>30}{'activations (over model)':>34}")
for d, m in SHAPES:
    ops = collectives(compiled[(d, m)]).ops
    acts = [op for op in ops if op.shapes[0][:1] == (BATCH // d,) and len(op.shapes[0]) > 1]
    grads = [op for op in ops if op not in acts]
    assert {op.kind for op in ops} == {"all-reduce"}
    assert all(op.group_size == d for op in grads) and len(grads) == (d > 1)  # one all-reduce, over data
    assert all(op.group_size in (m, m // NUM_HEADS) for op in acts)  # over model (or part of it, section 6)
    traffic[(d, m)] = (sum(op.estimated_bytes for op in grads), sum(op.estimated_bytes for op in acts), len(ops))
    print(f"{(d, m)!s:<10}{len(ops):>12}{len(grads):>8} all-reduce {format_bytes(traffic[(d, m)][0]):>11}"
          f"{len(acts):>10} all-reduce {format_bytes(traffic[(d, m)][1]):>13}")

# %% [markdown]
# Both columns follow simple arithmetic, which the cell below checks against the compiled programs:
# - gradients: one all-reduce of the state's parameter part, `4 x (n_split/m + n_embed_only)` bytes
#   (plus the loss), over groups of `d`: under the ring model each device sends `2 (d-1)/d` times that;
# - activations: proportional to the rows per device `64/d` and to `2 (m-1)/m`, with the same
#   constant for every shape (the same layers, the same arrays, only their sizes change).

# %%
for d, m in SHAPES:
    grad_bytes = 4 * (n_split // m + n_embed_only) + 4  # gradients + the loss
    assert np.isclose(traffic[(d, m)][0], 2 * (d - 1) / d * grad_bytes)
per_row = {(d, m): traffic[(d, m)][1] / ((BATCH // d) * 2 * (m - 1) / m) for d, m in SHAPES if m > 1}
print({shape: format_bytes(v) for shape, v in per_row.items()}, "per batch row, per 2(m-1)/m")
assert np.allclose([per_row[s] for s in SHAPES[1:4]], per_row[(32, 2)])  # one constant for all of them
assert per_row[(1, 64)] > per_row[(32, 2)]  # ... except (1, 64): section 6
total = {shape: g + a for shape, (g, a, _) in traffic.items()}
best_traffic = min(total, key=total.get)
print("fewest bytes per step:", best_traffic, format_bytes(total[best_traffic]))

# %% [markdown]
# `(1, 64)` does not fit the constant: it moves a little more than the arithmetic says. Section 6
# finds out why. Here are both tables as pictures:

# %%
x = np.arange(len(SHAPES))
labels = [str(s) for s in SHAPES]
fig, (ax_mem, ax_net) = plt.subplots(1, 2, figsize=(11, 3.8))
ax_mem.bar(x, state_b / MiB, label="state (params + Adam)", color="tab:blue")
ax_mem.bar(x, temp_b / MiB, bottom=state_b / MiB, label="temporaries (grads + activations)", color="tab:orange")
ax_mem.set(xticks=x, xticklabels=labels, xlabel="mesh (data, model)", ylabel="MiB per device",
           title="memory per device")
grad_t = np.array([traffic[s][0] for s in SHAPES]) / MiB
act_t = np.array([traffic[s][1] for s in SHAPES]) / MiB
ax_net.bar(x, grad_t, label="gradients, over data", color="tab:green")
ax_net.bar(x, act_t, bottom=grad_t, label="activations, over model", color="tab:red")
ax_net.set(xticks=x, xticklabels=labels, xlabel="mesh (data, model)", ylabel="MiB sent per device per step",
           title="communication per training step")
for ax in (ax_mem, ax_net):
    ax.legend(fontsize=8)
fig.tight_layout()
plt.close(fig)
fig

# %% [markdown]
# ## 5. The seed's rule, checked
#
# > `(64, 1), # Pure data parallel - fastest for small models`
# >
# > `(1, 64), # Pure model parallel - for huge layers`
# >
# > `More data parallelism → better batch throughput; more model parallelism → larger models fit`
#
# What the numbers support:
# - **"More model parallelism → larger models fit" holds for the state**, strictly at every step from
#   `(64, 1)` to `(1, 64)`, and for the gradients. It **fails for activations**: the footprint is
#   smallest in the middle, and pure model parallel needs more memory than `(16, 4)`, because every
#   device then works on the whole batch. A model fits when state, gradients *and* activations fit.
# - **Pure data parallel is not the cheapest in bytes**, even for this small model: it sums every
#   gradient across all 64 devices, while `(16, 4)` sums a quarter of them over 16. What data
#   parallel does have is **one** collective per step (XLA combined all the gradients into a single
#   all-reduce), which on accelerators can run while the backward pass computes; every shape with a
#   `model` axis adds 12 more all-reduces per step here, each one between two matrix multiplications
#   that wait for it. Throughput depends on those and on how fast each axis's links are, which CPU
#   simulation cannot measure.
# - **Pure model parallel is the worst corner here**: the most bytes moved (all of them activations,
#   in proportion to the batch) and more memory than the balanced shapes.

# %%
counts = {shape: n for shape, (_, _, n) in traffic.items()}
print("collectives per step:", counts)
assert counts[(64, 1)] == 1 and all(counts[s] == 13 for s in SHAPES[1:4])
assert total[(64, 1)] > total[(16, 4)] and total[(64, 1)] > total[(8, 8)]  # data parallel moves more bytes
assert total[(1, 64)] == max(total.values())  # pure model parallel moves the most
assert best_memory in SHAPES[1:4] and best_traffic in SHAPES[1:4]  # both optima are mixed shapes


# %% [markdown]
# Where the byte-optimal shape sits depends on the model and the batch, and the two formulas checked in
# section 4 say how: gradient traffic grows with the parameters (here through `d_ff`) and not with the
# batch; activation traffic grows with the batch and not with `d_ff` (the all-reduced arrays are all
# residual-stream sized, `[rows, 32, 512]`). Predict the five totals for other batches and widths
# (for `(1, 64)` without its extra score traffic, so a lower bound):

# %%
def predicted_traffic(d, m, batch=BATCH, d_ff=D_FF):
    split = NUM_LAYERS * (4 * D_MODEL**2 + 2 * D_MODEL * d_ff) + 2 * VOCAB * D_MODEL
    gradients = 2 * (d - 1) / d * (4 * (split // m + n_embed_only) + 4)
    activations = (batch // d) * 2 * (m - 1) / m * per_row[(32, 2)]
    return gradients + activations


best = {}
print(f"{'batch':>6}{'d_ff':>6}   " + "".join(f"{s!s:>10}" for s in SHAPES) + "   fewest bytes")
for batch, d_ff in [(64, 2048), (256, 2048), (1024, 2048), (64, 512), (64, 8192)]:
    predicted = {s: predicted_traffic(*s, batch=batch, d_ff=d_ff) for s in SHAPES}
    best[(batch, d_ff)] = min(predicted, key=predicted.get)
    print(f"{batch:>6}{d_ff:>6}   " + "".join(f"{predicted[s] / MiB:>10.1f}" for s in SHAPES)
          + f"   {best[(batch, d_ff)]}")
assert best[(64, 2048)] == best_traffic  # the formulas pick what the compiler's programs showed
assert best[(1024, 2048)] == (64, 1)  # many tokens per step, few parameters: pure data parallel
assert best[(64, 8192)] == (8, 8)  # more parameters, same tokens: more model parallelism

# %% [markdown]
# One prediction checked by compiling it: `(32, 2)` with a batch of 1024.

# %%
big_batch, _ = compile_for((32, 2), batch=1024)
measured = collectives(big_batch).estimated_bytes
print(f"(32, 2), batch 1024: predicted {predicted_traffic(32, 2, batch=1024) / MiB:.1f} MiB, "
      f"compiled {measured / MiB:.1f} MiB")
assert np.isclose(measured, predicted_traffic(32, 2, batch=1024))

# %% [markdown]
# So the seed's "(64, 1) fastest for small models" is right in this sense: *small compared with the
# tokens per step*. The rule of thumb these numbers give: **use the `data` axis as far as memory
# allows; add `model` parallelism until state + gradients + activations fit, and push it further only
# while summing gradients (which grows with the parameters) costs more than summing activations (which
# grows with batch x sequence x width)**; the prediction table shows where that tips.
#
# ## 6. When an axis is wider than what it splits
#
# **The batch.** `(64, 1)` needs at least 64 sequences per step, one per device. With a batch of 32 the
# compiler refuses to lower the step: 32 rows cannot be cut into 64 equal blocks.

# %%
raised = []
try:
    compile_for((64, 1), batch=32)
except ValueError as err:  # jax's IndivisibleError is a ValueError
    raised.append(type(err).__name__)
    print(type(err).__name__ + ":", re.search(r"implies that array axis 0 is partitioned 64 times, but the "
                                              r"dimension size is 32", str(err)).group(0))
assert raised == ["IndivisibleError"]

# %% [markdown]
# The fix is a global batch divisible by the `data` axis (here 64, 128, ...), or a smaller `data` axis.
#
# **The heads.** The model has 8 heads, and `model = 64` splits the 512 query/key/value columns 64
# ways: 8 columns per device, so each head is spread over 8 devices. Nothing fails, because 512 is
# divisible by 64. But attention scores need a sum over a head's 64 dimensions, and now each device
# holds 8 of them: the compiler adds all-reduces of partial scores `[64, 1, 32, 32]` (64 sequences, 1
# head, 32 x 32 positions) over groups of 8. That is the extra traffic of `(1, 64)` in section 4; with
# `model <= 8` every device holds whole heads and none of it appears.

# %%
for d, m in SHAPES:
    ops = collectives(compiled[(d, m)]).ops
    scores = [op for op in ops if op.shapes[0] == (BATCH // d, max(NUM_HEADS // m, 1), SEQ, SEQ)]
    print(f"{(d, m)!s:<9} heads per device: {NUM_HEADS / m:<6g} score all-reduces: {len(scores)}"
          + (f" over groups of {scores[0].group_size}, {format_bytes(sum(op.estimated_bytes for op in scores))}"
             if scores else ""))
    assert bool(scores) == (m > NUM_HEADS)
    if scores:
        assert {op.group_size for op in scores} == {m // NUM_HEADS}

# %% [markdown]
# So a second rule: keep the `model` axis at or below the number of heads (and dividing it), or pay
# for it in extra collectives that no annotation asked for.
#
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1 (predict the state).** On a `(4, 16)` mesh with the same rules, how many bytes of state
# (parameters and Adam's moments, plus the 8 bytes of step counters) does each device hold? Use
# `n_split` and `n_embed_only` from section 1.

# %%
from exercises import ex14_mesh_shape as ex

answer_1 = NOT_ANSWERED  # a whole number of bytes
ex.state_bytes.check(answer_1);

# %% [markdown]
# **Exercise 2 (pick a shape).** Each device can give the step 24 MiB (arguments + temporaries, the
# `footprint` column of section 3). Which of the five shapes fit, and among those, which sends the
# fewest bytes per step (section 4)? Answer with that one shape, a tuple such as `(64, 1)`.

# %%
answer_2 = NOT_ANSWERED  # a mesh shape (data, model)
ex.pick_shape.check(answer_2);

# %% [markdown]
# **Exercise 3 (divisibility).** You change the model to 16 heads and the global batch to 96. Which of
# the five shapes still lower without an error, and which of those keep whole heads on every device?
# Answer with two lists of shapes: `(lowers, whole_heads)`.

# %%
answer_3 = NOT_ANSWERED  # ([shapes that lower], [shapes with whole heads per device])
ex.divisibility.check(answer_3);

# %% [markdown]
# ## Takeaways
# - Compile for many devices without allocating: `nnx.eval_shape` for the state,
#   `jax.ShapeDtypeStruct(..., sharding=...)` for the inputs, `lower(...).compile()`, then read
#   `memory_per_device` and `collectives`.
# - The `model` axis divides the state and the gradients; the `data` axis divides the activations.
#   The smallest footprint here is a mixed shape; both corners cost more.
# - Gradient traffic (over `data`) scales with parameters; activation traffic (over `model`) with
#   batch x sequence x width, several times per layer. Data parallel alone has one collective per step.
# - Rule of thumb: as much `data` as memory allows, as much `model` as needed to fit, and a `model`
#   axis no wider than the number of heads.
# - An axis wider than a dimension it splits fails loudly for arguments (the batch:
#   `IndivisibleError`) and silently costs extra collectives inside the model (heads split across
#   devices).
#
# **Next:** [16 · pmap vs SPMD](16_pmap_vs_spmd.ipynb)
