# %% [markdown]
# # 11 · A sharded transformer, end to end
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/11_transformer.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/11_transformer.ipynb)
#
# The guide that seeded this course shards a `MyTransformer(d_model=512, num_layers=6)` that it never
# writes down. This notebook writes it: a small decoder-only transformer in Flax NNX whose parameters
# carry **logical** axis names (`'vocab'`, `'embed'`, `'heads'`, `'mlp'`), written once, in the model.
# Data parallel, tensor parallel, 2-D and FSDP then differ only in a small table of rules that maps
# those names to mesh axes. You train the model on a sequence task under all four strategies and
# check that they compute the same losses, compare what each costs in memory and communication, save
# a checkpoint under one layout and restore it under another, and find the collectives in a
# profiler trace.
#
# **You will learn**
# - how to annotate an NNX model once with `nnx.with_partitioning` and logical names, and choose the
#   strategy with `nnx.logical_axis_rules`;
# - why annotating the parameters is not enough, and how one activation constraint fixes FSDP;
# - that the rules are read while tracing, and what that means for `jax.jit`'s cache;
# - how the four strategies compare on bytes per device and bytes moved per step, measured;
# - how to save a sharded state with Orbax and restore it with another mesh and layout;
# - how to find the compiled program's collectives in a `jax.profiler` trace.

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
import functools
import gzip
import json
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from flax.linen import logical_to_mesh_axes, with_logical_constraint
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import NOT_ANSWERED, collectives, draw_shardings, format_bytes, memory_per_device, shard_table, tile_labels
from utils import type_string

# %% [markdown]
# ## 1. The model, annotated once
#
# A decoder-only transformer: token and position embeddings, `num_layers` blocks of (layer norm,
# causal self-attention, layer norm, MLP) with residual connections, a final layer norm, and a linear
# head that predicts the next token. Each parameter's initializer is wrapped in
# `nnx.with_partitioning(init, names)`, which gives every dimension a **logical** name:
#
# | logical name | dimension | size here |
# |---|---|---|
# | `'vocab'` | token ids (embedding rows, head outputs) | 32 |
# | `'embed'` | the model width `d_model`, the residual stream | 64 |
# | `'heads'` | query/key/value outputs: 8 heads of 8, stored head after head | 64 |
# | `'mlp'` | the MLP's hidden width `d_ff` | 256 |
# | `'batch'` | examples in a batch (activations only) | 32 |
#
# A name says *what* a dimension is, not how to shard it; that comes later, from rules. Two more
# choices matter for sharding. The linear layers have no biases, as in many current transformers (fewer
# small arrays). And the residual stream `x` is constrained to `('batch', None, None)` with
# `with_logical_constraint` (from `flax.linen`: NNX has no activation counterpart, and it reads the
# same rules); section 3 shows why that line is needed.

# %%
dense_init = nnx.initializers.lecun_normal()
embed_init = nnx.initializers.normal(0.02)
part = nnx.with_partitioning  # part(init, names): an initializer whose arrays carry logical names
RESIDUAL = ("batch", None, None)  # the residual stream [batch, seq, embed]: split the batch only


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
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)  # causal: no peeking ahead
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

    def __call__(self, tokens):  # int32[batch, seq] -> logits f32[batch, seq, vocab]
        x = self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[1]))
        x = with_logical_constraint(x, RESIDUAL)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# %% [markdown]
# Build it **once**, with its Adam optimizer, and with one block: every block adds the same parameters
# and the same collectives (notebook 14 uses two), and one keeps this notebook's four compilations and
# four training runs quick. There is no mesh yet, so eager sharding (on by default in Flax NNX, facts
# §8) is switched off: the logical names are kept as metadata and nothing is placed.
#
# Two steps: `nnx.eval_shape` runs `build` on shapes alone and gives the structure (`graphdef`);
# `jax.jit` runs it for real as one compiled program and returns every array (`state`: parameters and
# optimizer state, one pytree). All four strategies start from these very arrays. Every program in
# this notebook is small and runs on CPU threads, so each `jax.jit` gets `FAST_COMPILE`:
# optimisation level 0 tells XLA not to optimise the machine code it generates, which roughly halves
# compile time here; partitioning, collectives and buffer sizes are decided before that stage and
# come out the same.
#
# With no rules in force, `nnx.get_partition_spec` returns the logical names themselves:

# %%
D_MODEL, NUM_LAYERS, NUM_HEADS, D_FF, VOCAB, SEQ, BATCH = 64, 1, 8, 256, 32, 16, 32
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def build():
    with nnx.use_eager_sharding(False):
        model = MyTransformer(D_MODEL, NUM_LAYERS, NUM_HEADS, D_FF, VOCAB, SEQ, rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


graphdef, _ = nnx.split(nnx.eval_shape(build))
state = jax.jit(lambda: nnx.state(build()), compiler_options=FAST_COMPILE)()
model, optimizer = nnx.merge(graphdef, state)

params = nnx.to_flat_state(nnx.state(model, nnx.Param))
names = nnx.to_flat_state(nnx.get_partition_spec(nnx.state(model, nnx.Param)))
print(f"{'parameter':<28}{'shape':<11}logical names")
for (path, var), (_, spec) in zip(params, names, strict=True):
    print(f"{'/'.join(map(str, path)):<28}{var[...].shape!s:<11}{spec.get_value()}")

n_params = sum(var[...].size for _, var in params)
n_split = NUM_LAYERS * (4 * D_MODEL**2 + 2 * D_MODEL * D_FF) + 2 * VOCAB * D_MODEL  # has 'heads'/'mlp'/'vocab'
n_embed_only = (2 * NUM_LAYERS + 1) * 2 * D_MODEL + SEQ * D_MODEL  # layer norms and position table
print(f"\n{n_params:,} parameters = {n_split:,} in matrices with a 'heads', 'mlp' or 'vocab' dimension"
      f" + {n_embed_only:,} with only 'embed'")
assert n_params == n_split + n_embed_only == 54_656
assert dict(names)[("blocks", 0, "mlp", "up", "kernel")].get_value() == P("embed", "mlp")
assert all("embed" in tuple(spec.get_value()) for _, spec in names)  # every parameter has an 'embed' dimension

# %% [markdown]
# Every parameter has an `'embed'` dimension; that will matter for FSDP.
#
# ## 2. Four strategies are four rule tables
#
# `nnx.logical_axis_rules(rules)` makes `nnx.get_partition_spec` (and `nnx.get_named_sharding`, and
# eager sharding) translate each logical name through `rules`, a sequence of
# `(logical name, mesh axis or None)` pairs. One mesh and one rule table per strategy:

# %%
STRATEGIES = {
    "data": (jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,)),
             (("batch", "data"), ("vocab", None), ("embed", None), ("heads", None), ("mlp", None))),
    "tensor": (jax.make_mesh((8,), ("model",), axis_types=(AxisType.Auto,)),
               (("batch", None), ("vocab", "model"), ("embed", None), ("heads", "model"), ("mlp", "model"))),
    "2-D": (jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2),
            (("batch", "data"), ("vocab", "model"), ("embed", None), ("heads", "model"), ("mlp", "model"))),
    "FSDP": (jax.make_mesh((8,), ("fsdp",), axis_types=(AxisType.Auto,)),
             (("batch", "fsdp"), ("vocab", None), ("embed", "fsdp"), ("heads", None), ("mlp", None))),
}

print(f"{'strategy':<9}{'mesh':<25}" + "".join(f"{n:<8}" for n, _ in STRATEGIES["data"][1]))
for name, (mesh, rules) in STRATEGIES.items():
    print(f"{name:<9}{dict(mesh.shape)!s:<25}" + "".join(f"{axis or '-':<8}" for _, axis in rules))

# %% [markdown]
# Place the one `state` four ways. `nnx.get_named_sharding(state, mesh)` gives a `NamedSharding` for
# every array (the Adam moments inherit their parameter's names); `jax.device_put` sends each device
# its blocks, here from a NumPy copy of the state on the host.

# %%
host_state = jax.tree.map(np.asarray, state)
shardings, placed = {}, {}
for name, (mesh, rules) in STRATEGIES.items():
    with nnx.logical_axis_rules(rules):
        shardings[name] = nnx.get_named_sharding(state, mesh)
    placed[name] = jax.device_put(host_state, shardings[name])


def param(tree, path):
    """One parameter array of a (model, optimizer) state, e.g. param(state, 'blocks/0/mlp/up/kernel')."""
    node = tree[0]  # the model half
    for key in path.split("/"):
        node = node[int(key) if key.isdigit() else key]
    return node[...]


SHOWN = ["tokens/embedding", "blocks/0/attn/query/kernel", "blocks/0/mlp/down/kernel", "blocks/0/norm1/scale"]
print(f"{'parameter':<28}" + "".join(f"{name:<18}" for name in STRATEGIES))
for path in SHOWN:
    print(f"{path:<28}" + "".join(f"{type_string(param(placed[name], path)):<18}" for name in STRATEGIES))

assert type_string(param(placed["data"], "blocks/0/mlp/down/kernel")) == "f32[256,64]"
assert type_string(param(placed["tensor"], "blocks/0/attn/query/kernel")) == "f32[64,64@model]"
assert type_string(param(placed["2-D"], "tokens/embedding")) == "f32[32@model,64]"
assert type_string(param(placed["FSDP"], "blocks/0/mlp/down/kernel")) == "f32[256,64@fsdp]"
assert type_string(param(placed["FSDP"], "blocks/0/norm1/scale")) == "f32[64@fsdp]"
for name in STRATEGIES:  # same numbers everywhere: only the placement differs
    np.testing.assert_array_equal(param(placed[name], "blocks/0/mlp/up/kernel"),
                                  param(state, "blocks/0/mlp/up/kernel"))

# %% [markdown]
# Two of those matrices under each strategy, one row per strategy. Tensor parallel gives each device
# one head of the query projection (8 columns of 64: heads are stored head after head, and 8 heads
# split 8 ways); FSDP splits every matrix along `'embed'`, whichever side that is.

# %%
fig = draw_shardings({f"{name}: {path.split('/', 2)[-1]}": param(placed[name], path)
                      for name in STRATEGIES for path in SHOWN[1:3]}, ncols=2)
labels = tile_labels(fig)
assert labels[:2] == ["dev 0-7\n(64, 64)\n16.0 KiB\n8 copies", "dev 0-7\n(256, 64)\n64.0 KiB\n8 copies"]  # data: whole copies
assert sum(label.endswith("\n(64, 8)\n2.0 KiB") for label in labels) == 8  # tensor: a head per device
assert "dev 0,2,4,6\n(64, 32)\n8.0 KiB\n4 copies" in labels  # 2-D: four heads per device, repeated over 'data'
assert sum(label.endswith("\n(256, 8)\n8.0 KiB") for label in labels) == 8  # FSDP: down kernel by columns
fig

# %% [markdown]
# ### Gotcha: a logical name with no rule is not "replicated"
#
# In `nnx.logical_axis_rules`, a name that has no rule is passed through **unchanged**, so it reaches
# the mesh as an axis name the mesh does not have. Forget `'vocab'` in the data-parallel table:

# %%
mesh, rules = STRATEGIES["data"]
forgot_vocab = tuple(rule for rule in rules if rule[0] != "vocab")
raised = []
try:
    with nnx.logical_axis_rules(forgot_vocab):
        nnx.get_named_sharding(state, mesh)
except ValueError as err:
    raised.append(type(err))
    print("ValueError:", err)
with nnx.logical_axis_rules(forgot_vocab):
    built = nnx.get_partition_spec(state)[0]["tokens"]["embedding"].get_value()
print("nnx built:", built, "  flax.linen.logical_to_mesh_axes builds:",
      logical_to_mesh_axes(("vocab", "embed"), forgot_vocab))
assert raised == [ValueError] and built == P("vocab", None)
assert logical_to_mesh_axes(("vocab", "embed"), forgot_vocab) == P(None, None)

# %% [markdown]
# The fix is to give every logical name a rule, with `None` for "do not split" (as the four tables
# above do). Flax's older `flax.linen.logical_to_mesh_axes` (used below for the batch) treats a
# missing name as unsplit instead, so the two disagree; a complete table works with both.
#
# ## 3. One train step, compiled once per strategy
#
# The task: sequences of 17 tokens that count up from a random start with a random stride of 1, 2 or
# 3, modulo 32 (`15, 18, 21, 24, ...`). The model reads 16 tokens and predicts each next one. The
# first prediction is a guess (one token does not reveal the stride); from the second on, the rule is
# fully determined, so a model that learned it predicts every later token. The data is made once on
# the host with a seeded NumPy generator: a fresh batch of 32 for each step, and one spare.

# %%
STEPS = 25


def make_batches(rng, steps):
    """int32[steps, BATCH, SEQ + 1]: x[t] = (start + stride * t) mod VOCAB, stride in {1, 2, 3}."""
    start = rng.integers(0, VOCAB, (steps, BATCH, 1))
    stride = rng.integers(1, 4, (steps, BATCH, 1))
    return ((start + stride * np.arange(SEQ + 1)) % VOCAB).astype(np.int32)


data = make_batches(np.random.default_rng(0), STEPS + 1)
print(data[0, :3])
assert data.shape == (STEPS + 1, BATCH, SEQ + 1) and data.max() < VOCAB


# %% [markdown]
# The train step takes the `state` pytree and returns the new one. This is the functional form of the
# `nnx.jit` step of notebooks 07–10 (facts §9): `nnx.merge` rebuilds the model and optimizer from the
# state inside the function, and `nnx.state` collects them again. With a plain function of arrays you
# can `lower`, `compile`, read the compiled program, and then run **that** executable: one
# compilation per strategy, and the program you inspect is the program you train with.
#
# The rules are entered *inside* the traced function, `with nnx.logical_axis_rules(rules)`, so that
# each strategy's step is its own function; the Gotcha after this section shows why.

# %%
def train_step(state, tokens):
    model, optimizer = nnx.merge(graphdef, state)

    def loss_fn(model):
        logits = model(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean(), logits

    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    accuracy = jnp.mean(logits.argmax(-1)[:, 1:] == tokens[:, 2:])  # from position 1 on: stride known
    return nnx.state((model, optimizer)), loss, accuracy


def with_rules(rules, fn):
    """fn, traced with `rules` in force (so its activation constraints resolve through them)."""
    @functools.wraps(fn)  # keeps fn's name: the compiled program is called jit_<name>
    def traced(*args):
        with nnx.logical_axis_rules(rules):
            return fn(*args)
    return traced


compiled, batch_sharding = {}, {}
for name, (mesh, rules) in STRATEGIES.items():
    with nnx.logical_axis_rules(rules):
        batch_sharding[name] = NamedSharding(mesh, logical_to_mesh_axes(("batch", None)))
    replicated = NamedSharding(mesh, P())
    step = jax.jit(with_rules(rules, train_step), out_shardings=(shardings[name], replicated, replicated),
                   compiler_options=FAST_COMPILE)
    with jax.set_mesh(mesh):  # with_logical_constraint needs a mesh in context, or it does nothing
        compiled[name] = step.lower(placed[name], jax.device_put(data[0], batch_sharding[name])).compile()

print(f"{'strategy':<9}{'batch':<21}" + "".join(f"{k:>20}" for k in ("all-reduce", "all-gather", "all-to-all",
                                                                     "bytes moved")))
for name in STRATEGIES:
    c = collectives(compiled[name])
    print(f"{name:<9}{batch_sharding[name].spec!s:<21}" + "".join(f"{c.count(k):>20}" for k in (
        "all-reduce", "all-gather", "all-to-all")) + f"{format_bytes(c.estimated_bytes):>20}")

# %% [markdown]
# Now read each program against the seed's "Communication Overhead" comments. The result type of a
# collective says what it carries: `[32,16,...]` (batch, sequence) is an **activation**; a parameter's
# shape is a **gradient or a weight**. `op.shapes` lists the shapes of the arrays a collective produces.

# %%
param_shapes = {var[...].shape for _, var in params}
param_bytes = 4 * n_params
is_activation = lambda shape, rows: shape[:2] == (rows, SEQ)  # [batch rows, seq, ...]

# %% [markdown]
# > `# Data parallelism: O(parameters) all-reduce per step`
#
# One all-reduce, and it carries every gradient once (plus the loss and accuracy scalars):

# %%
c = collectives(compiled["data"])
(op,) = c.ops
print(f"{op.kind} over {op.group_size} devices of {len(op.shapes)} arrays: {format_bytes(op.result_bytes)} "
      f"(the gradients are {format_bytes(param_bytes)}), {format_bytes(op.estimated_bytes)} sent per device")
assert c.kinds == {"all-reduce"}
assert param_bytes <= c.result_bytes <= param_bytes + 16  # the gradients + 2 scalars, nothing else

# %% [markdown]
# > `# Tensor parallelism: O(activations) all-reduce per layer`
#
# Every collective carries activations `[32, 16, ...]` (the full batch: tensor parallel does not split
# it), and no gradient crosses devices at all: each device owns its slice of every split matrix, and
# the small replicated parameters get identical gradients on every device. The residual stream
# `[32,16,64]` is summed wherever a split matrix hands its partial result back to the replicated
# stream: after the attention output and MLP down projections on the way forward, at the inputs of the
# query/key/value and MLP up projections on the way back. The `[32,16]` all-reduces are the softmax
# over the vocabulary split 8 ways, and the two all-gathers are the accuracy's `argmax` over it (each
# device's best value and index).

# %%
c = collectives(compiled["tensor"])
print(c)
assert c.kinds <= {"all-reduce", "all-gather"}
assert all(is_activation(s, BATCH) for op in c.ops for s in op.shapes)  # nothing but activations
assert sum(s == (BATCH, SEQ, D_MODEL) for op in c.ops for s in op.shapes) >= 2 * NUM_LAYERS  # >= 2 per layer

# %% [markdown]
# > `# 2D parallelism: Reduced communication on both axes`
#
# Both patterns at once, each on its own mesh axis: activations over `model` (groups of 2), now with
# 32/4 = 8 rows of the batch each; gradients over `data` (groups of 4), half the size of data
# parallel's because the split matrices are halved over `model`.

# %%
c = collectives(compiled["2-D"])
over_model = [op for op in c.ops if op.group_size == 2]
over_data = [op for op in c.ops if op.group_size == 4]
assert len(over_model) + len(over_data) == len(c.ops)
assert all(is_activation(s, BATCH // 4) for op in over_model for s in op.shapes)
assert {op.kind for op in over_data} == {"all-reduce"}
grad_bytes_2d = 4 * (n_split // 2 + n_embed_only)
assert grad_bytes_2d <= sum(op.result_bytes for op in over_data) <= grad_bytes_2d + 16
print(f"over model (groups of 2): {len(over_model)} collectives on activations, "
      f"{format_bytes(sum(op.estimated_bytes for op in over_model))} sent per device")
print(f"over data  (groups of 4): {len(over_data)} all-reduce of gradients, "
      f"{format_bytes(sum(op.estimated_bytes for op in over_data))} sent per device")

# %% [markdown]
# > `# FSDP: All-gather before each layer, reduce-scatter after`
#
# Half right on this backend. Every all-gather rebuilds a whole parameter from its 8 slices before it
# is used (the backward pass reuses them; a few layer norm vectors are gathered twice). But the
# gradients are summed with an **all-reduce** of their full size, after which each device keeps its
# slice. The CPU compiler emits no reduce-scatter here; XLA's GPU and TPU pipelines rewrite such an
# all-reduce-then-slice into one, which sends half the bytes and hands each device only its 1/8.

# %%
c = collectives(compiled["FSDP"])
gathers = [op for op in c.ops if op.kind == "all-gather"]
reduces = [op for op in c.ops if op.kind == "all-reduce"]
print(f"{len(gathers)} all-gathers, e.g. {', '.join(op.result_type for op in gathers[:4])}, ...")
print(f"{len(reduces)} all-reduce of {format_bytes(sum(op.result_bytes for op in reduces))}")
assert c.kinds == {"all-gather", "all-reduce"} and c.count("reduce-scatter") == 0
assert all(s in param_shapes for op in gathers for s in op.shapes)  # only weights are gathered
assert {s for op in gathers for s in op.shapes} == param_shapes  # ... and every one of them
assert param_bytes <= sum(op.result_bytes for op in reduces) <= param_bytes + 16  # full-size gradients


# %% [markdown]
# ### Gotcha: annotating the parameters is not enough (FSDP without the activation constraint)
#
# Drop the three `with_logical_constraint` lines and FSDP stops being FSDP. The parameters say "split
# `embed` over `fsdp`", the batch says "split `batch` over `fsdp`", and nothing says what the
# activations should be; the compiler follows the weights and splits activations along `embed`, so it
# moves whole activations instead of weights. Compile just the loss (no gradient: cheaper), once
# with the rules in force inside the trace and once without (then `with_logical_constraint` does
# nothing):

# %%
def loss_only(state, tokens):
    model, _ = nnx.merge(graphdef, state)
    return optax.softmax_cross_entropy_with_integer_labels(model(tokens[:, :-1]), tokens[:, 1:]).mean()


mesh, rules = STRATEGIES["FSDP"]
batch = jax.device_put(data[0], batch_sharding["FSDP"])
with jax.set_mesh(mesh):
    loose = jax.jit(loss_only, compiler_options=FAST_COMPILE).lower(placed["FSDP"], batch).compile()
    pinned = jax.jit(with_rules(rules, loss_only), compiler_options=FAST_COMPILE).lower(placed["FSDP"], batch).compile()
loose, pinned = collectives(loose), collectives(pinned)
for label, c in (("no activation constraint", loose), ("residual = ('batch', None, None)", pinned)):
    moved_acts = sum(op.estimated_bytes for op in c.ops if any(is_activation(s, BATCH) for s in op.shapes))
    print(f"{label:<34} {c.counts['all-gather']:>3} all-gather {c.counts['all-reduce']:>3} all-reduce "
          f"{c.counts['all-to-all']:>3} all-to-all  {format_bytes(c.estimated_bytes):>10} moved, "
          f"{format_bytes(moved_acts)} of it full-batch activations")
assert loose.estimated_bytes > 3 * pinned.estimated_bytes
assert any(is_activation(s, BATCH) for op in loose.ops for s in op.shapes)
assert not any(is_activation(s, BATCH) for op in pinned.ops for s in op.shapes)


# %% [markdown]
# ### Gotcha: the rules are read while tracing, and `jax.jit` does not know about them
#
# `with_logical_constraint` turns logical names into a spec when the function is **traced**, using
# whatever rules are in force then. `jax.jit` caches traces by function and argument types, not by
# Flax's rules, so lowering the *same* function again under other rules silently reuses the old trace.
# And with no mesh in context the constraint is silently skipped. A tiny function shows all three:

# %%
def double(x):
    return with_logical_constraint(2 * x, ("batch", None))


mesh, rules = STRATEGIES["data"]
x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P()))
constrained = lambda lowered: "sharding_constraint" in lowered.as_text()
with nnx.logical_axis_rules(rules):
    no_mesh = constrained(jax.jit(double).lower(x))  # rules, but no mesh in context
with jax.set_mesh(mesh):
    first = constrained(jax.jit(double).lower(x))  # mesh, no rules: traced and cached
    with nnx.logical_axis_rules(rules):
        again = constrained(jax.jit(double).lower(x))  # rules now, but the cached trace is reused
    fixed = constrained(jax.jit(with_rules(rules, double)).lower(x))  # rules inside: a new function
print(f"rules, no mesh: {no_mesh}   mesh only: {first}   then rules around it: {again}   rules inside: {fixed}")
assert [no_mesh, first, again, fixed] == [False, False, False, True]

# %% [markdown]
# Hence `with_rules(rules, fn)` above: entering the rules inside the traced function makes each
# strategy's step a different function, so no cached trace can be reused for the wrong strategy.
#
# ## 4. Train it, four times
#
# Each strategy runs its compiled step 25 times on the same 25 batches, from the same initial arrays.
# Each batch is put where that strategy wants it (`batch_sharding`) as it is fed.

# %%
history, trained, seconds = {}, {}, {}
for name in STRATEGIES:
    s, losses, accuracies = placed[name], [], []
    start = time.perf_counter()
    for i in range(STEPS):
        s, loss, accuracy = compiled[name](s, jax.device_put(data[i], batch_sharding[name]))
        losses.append(loss)
        accuracies.append(accuracy)
    jax.block_until_ready(s)
    seconds[name] = (time.perf_counter() - start) / STEPS
    history[name] = (np.array(losses), np.array(accuracies))
    trained[name] = s

losses, accuracies = history["data"]
print("loss    ", np.round(losses[::5], 2), "->", round(float(losses[-1]), 3))
print("accuracy", np.round(accuracies[::5], 2), "->", round(float(accuracies[-1]), 3))
assert losses[-1] < 0.1 * losses[0]  # from about ln(32) + noise to a small fraction of it
assert accuracies[-5:].mean() > 0.9  # predicts the next token of unseen sequences
for name in STRATEGIES:  # four layouts, one computation
    np.testing.assert_allclose(history[name][0], losses, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(history[name][1], accuracies, atol=1.5 / (BATCH * (SEQ - 1)))  # <= 1 token apart
print(f"all four strategies: the same {STEPS} losses to within 2e-4 relative")

# %%
fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.4))
for (name, (loss_curve, acc_curve)), style in zip(history.items(), ("-", "--", ":", "-."), strict=True):
    ax_loss.plot(loss_curve, style, label=name, linewidth=2)
    ax_acc.plot(acc_curve, style, label=name, linewidth=2)
ax_loss.set(xlabel="step", ylabel="training loss", yscale="log", title="loss: the four curves coincide")
ax_acc.set(xlabel="step", ylabel="next-token accuracy (positions 1-15)", ylim=(0, 1.02),
           title="accuracy on each fresh batch")
ax_loss.legend()
fig.tight_layout()
plt.close(fig)
fig


# %% [markdown]
# The curves lie on top of each other: the strategies differ by float rounding only (sums are added
# in another order when they are split across devices).
#
# ## 5. What each strategy costs
#
# One table, measured: parameter + Adam state held by each device (from the arrays themselves, with
# `shard_table`), the compiled step's per-device buffers (`memory_per_device`), collectives per step,
# and bytes each device sends per step under the ring model of `collectives`. The last column is wall
# time per step on *this* machine, where the "devices" are CPU threads of one processor: it says
# nothing about real accelerators, changes from run to run, and is only rounded and printed, never
# asserted.

# %%
def state_bytes_per_device(tree):
    return sum(max(shard_table(x).bytes_per_device.values()) for x in jax.tree.leaves(tree))


SCALARS = 8  # the optimizer's step (uint32) and Adam's count (int32): replicated
expected = {  # parameters, Adam's two moments: 3 x 4 bytes per parameter
    "data": 12 * (n_split + n_embed_only) + SCALARS,
    "tensor": 12 * (n_split // 8 + n_embed_only) + SCALARS,
    "2-D": 12 * (n_split // 2 + n_embed_only) + SCALARS,
    "FSDP": 12 * (n_split + n_embed_only) // 8 + SCALARS,
}
print(f"{'strategy':<9}{'state/device':>13}{'args':>11}{'temps':>11}   {'collectives per step':<27}"
      f"{'moved/device':>13}{f'loss@{STEPS}':>9}{'step time*':>12}")
for name in STRATEGIES:
    held = state_bytes_per_device(placed[name])
    memory = memory_per_device(compiled[name])
    c = collectives(compiled[name])
    kinds = ", ".join(f"{n} {k}" for k, n in c.counts.items() if n)
    print(f"{name:<9}{format_bytes(held):>13}{format_bytes(memory.argument):>11}{memory.temp / 2**20:>7.1f} MiB"
          f"   {kinds:<27}{format_bytes(c.estimated_bytes):>13}{history[name][0][-1]:>9.3f}"
          f"{f'~{5 * round(200 * seconds[name])} ms':>12}")
    assert held == expected[name], (name, held, expected[name])
    batch_bytes = max(shard_table(jax.device_put(data[0], batch_sharding[name])).bytes_per_device.values())
    assert memory.argument == held + batch_bytes  # the step's inputs: the state slices and the batch slice
print("* wall time per step of simulated CPU devices, rounded to 5 ms: machine-dependent, not a result")
temp = {name: memory_per_device(compiled[name]).temp for name in STRATEGIES}
moved = {name: collectives(compiled[name]).estimated_bytes for name in STRATEGIES}
assert expected["FSDP"] - SCALARS == (expected["data"] - SCALARS) // 8  # FSDP: exactly 1/8 of everything
assert expected["data"] > expected["2-D"] > expected["tensor"] > expected["FSDP"]
assert temp["tensor"] > temp["data"] and temp["FSDP"] > temp["data"]  # full batch / full weights at times
assert moved["tensor"] > moved["2-D"] > moved["data"]  # activations cost more than gradients, at this size

# %% [markdown]
# Reading the table:
# - **Memory.** Data parallel keeps everything on every device; FSDP keeps exactly 1/8 (every
#   parameter has an `'embed'` dimension to split); tensor parallel splits only the matrices with a
#   `'heads'`, `'mlp'` or `'vocab'` dimension; 2-D splits those only 2 ways.
# - **Temporaries** (activations, gathered weights, gradients before the update) do not follow the
#   same order: tensor parallel and FSDP work on the full batch or full weights at times.
# - **Communication.** Data parallel moves the gradients once per step, whatever the batch. Tensor
#   parallel moves activations, several times per layer, in proportion to batch x sequence x
#   `d_model`: with a model this small that is already more than the gradients. 2-D trades between
#   them. FSDP moves each weight once (gathers) plus the full gradients (the all-reduce).
#
# Notebook 14 pushes the same comparison to 64 devices and five mesh shapes.
#
# ## 6. Save under FSDP, restore as tensor parallel
#
# A checkpoint should not pin the layout. Orbax's `StandardCheckpointer` writes each array's shards
# from the devices that hold them; to restore, you give it a target pytree of
# `jax.ShapeDtypeStruct`s **with the shardings you want now**, here the tensor-parallel ones on the
# `model` mesh, and each device reads just its slice.

# %%
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / f"fsdp_step{STEPS}"
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, trained["FSDP"])
    checkpointer.wait_until_finished()
    print("written:", sorted(p.name for p in path.iterdir()))
    target = jax.tree.map(lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                          state, shardings["tensor"])
    restored = checkpointer.restore(path, target)

kernel = "blocks/0/mlp/up/kernel"
print(f"{kernel}: saved as {type_string(param(trained['FSDP'], kernel))}, "
      f"restored as {type_string(param(restored, kernel))}")
for new, old, want in zip(jax.tree.leaves(restored), jax.tree.leaves(trained["FSDP"]),
                          jax.tree.leaves(shardings["tensor"]), strict=True):
    assert new.sharding.is_equivalent_to(want, new.ndim)  # the new layout
    np.testing.assert_array_equal(np.asarray(new), np.asarray(old))  # the same numbers

# %% [markdown]
# The restored state is a working tensor-parallel state: one more step with the tensor-parallel
# executable gives the loss FSDP gives for the same step.

# %%
_, loss_fsdp, _ = compiled["FSDP"](trained["FSDP"], jax.device_put(data[STEPS], batch_sharding["FSDP"]))
_, loss_tensor, _ = compiled["tensor"](restored, jax.device_put(data[STEPS], batch_sharding["tensor"]))
print(f"step {STEPS + 1}: FSDP {float(loss_fsdp):.4f}, "
      f"tensor parallel from the FSDP checkpoint {float(loss_tensor):.4f}")
np.testing.assert_allclose(float(loss_tensor), float(loss_fsdp), rtol=1e-4)

# %% [markdown]
# ## 7. What the profiler sees
#
# The seed's last advice is to profile and look for the collectives. `jax.profiler.trace` works on
# CPU too; with `create_perfetto_trace=True` it also writes `perfetto_trace.json.gz`, a gzip-compressed
# JSON trace (open it at ui.perfetto.dev). Trace three 2-D steps and find the collectives in it: each
# event of the compiled program names its HLO instruction (`args.hlo_op`, such as `all-reduce.12`, the
# same name as in `compiled.as_text()`), its device (`args.device_ordinal`) and its run
# (`args.run_id`). The seed's list of names to look for ("CollectivePermute (all-to-all)", "AllReduce",
# ...) uses another spelling, and mixes two collectives up: a collective-permute sends each device's
# block to one other device, an all-to-all sends a piece to every device.

# %%
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
s = jax.block_until_ready(trained["2-D"])  # nothing of earlier steps may still be running
batch = jax.device_put(data[0], batch_sharding["2-D"])
with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
        for _ in range(3):
            s, loss, _ = compiled["2-D"](s, batch)
        jax.block_until_ready(s)
    (trace_file,) = Path(tmp).rglob("perfetto_trace.json.gz")
    with gzip.open(trace_file) as f:
        events = json.load(f)["traceEvents"]

found = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("hlo_module") == "jit_train_step"
         and e["name"].startswith(KINDS)]
runs = {e["args"]["run_id"] for e in found}
by_op = {}
for e in found:
    by_op.setdefault(e["args"]["hlo_op"], set()).add((e["args"]["device_ordinal"], e["args"]["run_id"]))
print(f"{len(by_op)} collectives x {len(runs)} runs x 8 devices = {sum(map(len, by_op.values()))} events, e.g. "
      f"{sorted(by_op)[:3]}")
hlo = collectives(compiled["2-D"])
print("kinds in the trace:", sorted({op.split(".")[0] for op in by_op}), " kinds in the HLO:", sorted(hlo.kinds))
assert set(by_op) == {op.name for op in hlo.ops}  # every collective of the HLO, and nothing else
assert all(len(seen) == 3 * 8 for seen in by_op.values())  # each one ran on all 8 devices in all 3 steps
assert len(runs) == 3

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1 (write the rules).** A fifth strategy, FSDP x tensor on the `(4, 2)` mesh
# `('data', 'model')`: split the batch **and** every parameter's `'embed'` dimension over `data`, and
# `'heads'`, `'mlp'` and `'vocab'` over `model`. Write its rule table (a tuple of
# `(logical name, mesh axis or None)` pairs covering all five names).

# %%
from exercises import ex11_transformer as ex

answer_1 = NOT_ANSWERED  # e.g. (("batch", ...), ("vocab", ...), ("embed", ...), ("heads", ...), ("mlp", ...))
ex.fsdp_tensor_rules.check(answer_1);

# %% [markdown]
# **Exercise 2 (predict the bytes).** Under the FSDP rules, how many bytes of parameters and Adam
# state does each device hold if `D_FF` were 512 instead of 256 (everything else as here, including
# the 8 bytes of replicated step counters)? Work it out from the parameter count; section 5's
# `expected` shows the form.

# %%
answer_2 = NOT_ANSWERED  # a whole number of bytes
ex.fsdp_bytes.check(answer_2);

# %% [markdown]
# **Exercise 3 (predict the collective).** Keep the 2-D rules but use the mesh `(2, 4)` (`data` = 2,
# `model` = 4). The residual-stream all-reduces of the tensor-parallel part: how many devices are in
# each group, and how many bytes does one such all-reduce (one `f32[rows, 16, 64]` array) produce on
# each device? Answer a pair `(group_size, bytes)`.

# %%
answer_3 = NOT_ANSWERED  # (group_size, bytes)
ex.residual_allreduce.check(answer_3);

# %% [markdown]
# ## Takeaways
# - Annotate once, in the model, with logical names (`nnx.with_partitioning(init, ('embed', 'mlp'))`);
#   choose the strategy with a rule table in `nnx.logical_axis_rules`. Data, tensor, 2-D and FSDP are
#   four tables here, and all four train to the same losses.
# - Give every logical name a rule (`None` for "do not split"): NNX passes an unknown name through to
#   the mesh. Constrain the activations too (one `('batch', None, None)` on the residual stream):
#   without it FSDP moved whole activations instead of weights.
# - Rules are read while tracing: enter them inside the function you `jit`, and keep a mesh in
#   context, or the constraints silently change or vanish.
# - Measured on 8 devices: data parallel holds everything and moves gradients once per step; tensor
#   parallel moves activations several times per layer; FSDP holds 1/8 and gathers weights; on CPU
#   FSDP's gradient sync is an all-reduce, not the seed's reduce-scatter.
# - Checkpoints are layout-free: save under one mesh with Orbax, restore under another by passing
#   `ShapeDtypeStruct`s with the new shardings. The profiler trace shows every collective of the HLO
#   on every device.
#
# **Next:** [14 · Choosing a mesh shape](14_mesh_shape.ipynb)
