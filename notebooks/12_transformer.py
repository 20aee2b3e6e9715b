# %% [markdown]
# # 12 · A sharded transformer, end to end
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/12_transformer.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/12_transformer.ipynb)
#
# Four strategies shard one small transformer four ways: per device, data parallelism holds all 655,880
# bytes of its parameters and Adam state, FSDP an eighth, tensor parallelism and 2-D amounts in between.
# Written as a `PartitionSpec` per array, each switch of strategy rewrites the layout of every parameter.
#
# **You need:** notebooks 07 to 10 (data, tensor, 2-D and FSDP parallelism on the course MLP); Flax NNX
# modules and `nnx.Optimizer`, `nnx.eval_shape`, `jax.ShapeDtypeStruct`, and `jax.jit` with
# `out_shardings=` and `donate_argnums=`.
#
# Annotated once with **logical** names for its dimensions instead, the model switches strategy with a
# small table of rules that maps those names to mesh axes.
#
# **You will learn**
# - how to annotate an NNX model with logical names and choose the strategy (data parallel, tensor
#   parallel, 2-D or FSDP) with `nnx.logical_axis_rules`;
# - how to create the model and optimizer already sharded, and what that saves over building on one
#   device and moving;
# - why annotating the parameters is not enough, and why the rules must be in force while tracing;
# - how the four strategies compare in memory per device and collectives per step;
# - how to save a sharded state with Orbax and restore it with another mesh and layout.

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
import functools
import tempfile
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

from spmd_course.utils import NOT_ANSWERED, assert_close, collectives, draw_shardings, format_bytes, memory_per_device, shard_table
from spmd_course.utils import type_string

# %% [markdown]
# ## 1. The model, annotated once
#
# Token and position embeddings, `num_layers` blocks of (layer norm, causal self-attention, layer
# norm, MLP) with residual connections, a final layer norm, and a linear head that predicts the next
# token. Each parameter's initializer is wrapped in `nnx.with_partitioning(init, names)`, which gives
# every dimension a **logical** name:
#
# | logical name | dimension | size here |
# |---|---|---|
# | `'vocab'` | token ids (embedding rows, head outputs) | 32 |
# | `'embed'` | the model width `d_model`, the residual stream | 64 |
# | `'heads'` | query/key/value outputs: 8 heads of 8, stored head after head | 64 |
# | `'mlp'` | the MLP's hidden width `d_ff` | 256 |
# | `'batch'` | examples in a batch (activations only) | 32 |
#
# A name says *what* a dimension is, not how to split it. The linear layers have no biases, and the
# residual stream `x` is constrained to `('batch', None, None)` with `with_logical_constraint` (from
# `flax.linen`, which reads the same rules). Section 4 shows why.

# %% tags=["save"]
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


class FeedForward(nnx.Module):
    def __init__(self, d_model, d_ff, *, rngs):
        self.up = nnx.Linear(d_model, d_ff, kernel_init=part(dense_init, ("embed", "mlp")), use_bias=False, rngs=rngs)
        self.down = nnx.Linear(d_ff, d_model, kernel_init=part(dense_init, ("mlp", "embed")), use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
    def __init__(self, d_model, num_heads, d_ff, *, rngs):
        self.norm1, self.attn = layer_norm(d_model, rngs), Attention(d_model, num_heads, rngs=rngs)
        self.norm2, self.mlp = layer_norm(d_model, rngs), FeedForward(d_model, d_ff, rngs=rngs)

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
# One block is enough: every block adds the same parameters and collectives. `nnx.eval_shape` runs
# the constructor on shapes alone: every array of the model and its Adam optimizer is a
# `jax.ShapeDtypeStruct`, with the logical names as metadata (section 3 places the arrays).
# `FAST_COMPILE` skips optimising machine code, which is safe here because partitioning and buffer
# sizes are decided before that stage.
# With no rules in force, `nnx.get_partition_spec` returns the names:

# %%
D_MODEL, NUM_LAYERS, NUM_HEADS, D_FF, VOCAB, SEQ, BATCH = 64, 1, 8, 256, 32, 16, 32
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def build():
    with nnx.use_eager_sharding(False):  # names as metadata only: nothing is placed while building
        model = MyTransformer(D_MODEL, NUM_LAYERS, NUM_HEADS, D_FF, VOCAB, SEQ, rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


abstract_model, abstract_optimizer = nnx.eval_shape(build)
graphdef, abstract = nnx.split((abstract_model, abstract_optimizer))  # structure + ShapeDtypeStructs

params = nnx.to_flat_state(nnx.state(abstract_model, nnx.Param))
names = nnx.to_flat_state(nnx.get_partition_spec(nnx.state(abstract_model, nnx.Param)))
print(f"{'parameter':<28}{'shape':<11}logical names")
for (path, var), (_, spec) in zip(params, names, strict=True):
    print(f"{'/'.join(map(str, path)):<28}{var.get_value().shape!s:<11}{spec.get_value()}")

n_params = sum(var.get_value().size for _, var in params)
n_split = NUM_LAYERS * (4 * D_MODEL**2 + 2 * D_MODEL * D_FF) + 2 * VOCAB * D_MODEL  # has 'heads'/'mlp'/'vocab'
n_embed_only = (2 * NUM_LAYERS + 1) * 2 * D_MODEL + SEQ * D_MODEL  # layer norms and position table
print(f"\n{n_params:,} parameters = {n_split:,} in matrices with a 'heads', 'mlp' or 'vocab' dimension"
      f" + {n_embed_only:,} with only 'embed'")
assert n_params == n_split + n_embed_only == 54_656
assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract))  # nothing allocated
assert dict(names)[("blocks", 0, "mlp", "up", "kernel")].get_value() == P("embed", "mlp")
assert all("embed" in tuple(spec.get_value()) for _, spec in names)  # every parameter has an 'embed' dimension

# %% [markdown]
# Every parameter has an `'embed'` dimension. A rule splits by name, whatever the size, so FSDP below
# splits even the 64-element layer-norm vectors that notebook 10's threshold keeps whole: each device
# holds 1/8 of the state.
#
# ## 2. Four strategies are four rule tables
#
# `nnx.logical_axis_rules(rules)` makes `nnx.get_partition_spec` and `nnx.get_named_sharding`
# translate each logical name through `rules`, a sequence of `(logical name, mesh axis or None)`
# pairs. One mesh and one table per strategy:

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
# Under a table, `nnx.get_named_sharding(abstract, mesh)` gives a `NamedSharding` for every array of
# the abstract state, and Adam's moments inherit their parameter's names. No array exists yet: this is
# the plan.

# %%
shardings = {}
for name, (mesh, rules) in STRATEGIES.items():
    with nnx.logical_axis_rules(rules):
        shardings[name] = nnx.get_named_sharding(abstract, mesh)


def leaf(tree, path):
    """One array (or sharding) of a (model, optimizer) pytree, e.g. leaf(state, 'blocks/0/mlp/up/kernel')."""
    node = tree[0]  # the model half
    for key in path.split("/"):
        node = node[int(key) if key.isdigit() else key]
    return node.get_value()


SHOWN = ["tokens/embedding", "blocks/0/attn/query/kernel", "blocks/0/mlp/down/kernel", "blocks/0/norm1/scale"]
planned = {(name, path): type_string(leaf(abstract, path), leaf(shardings[name], path))
           for name in STRATEGIES for path in SHOWN}
print(f"{'parameter':<28}" + "".join(f"{name:<18}" for name in STRATEGIES))
for path in SHOWN:
    print(f"{path:<28}" + "".join(f"{planned[name, path]:<18}" for name in STRATEGIES))

assert planned["data", "blocks/0/mlp/down/kernel"] == "f32[256,64]"
assert planned["tensor", "blocks/0/attn/query/kernel"] == "f32[64,64@model]"
assert planned["2-D", "tokens/embedding"] == "f32[32@model,64]"
assert planned["FSDP", "blocks/0/mlp/down/kernel"] == "f32[256,64@fsdp]"
assert planned["FSDP", "blocks/0/norm1/scale"] == "f32[64@fsdp]"

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
        nnx.get_named_sharding(abstract, mesh)
except ValueError as err:
    raised.append(type(err))
    print("ValueError:", err)
with nnx.logical_axis_rules(forgot_vocab):
    built = nnx.get_partition_spec(abstract)[0]["tokens"]["embedding"].get_value()
print("nnx built:", built, "  flax.linen.logical_to_mesh_axes builds:",
      logical_to_mesh_axes(("vocab", "embed"), forgot_vocab))
assert raised == [ValueError] and built == P("vocab", None)
assert logical_to_mesh_axes(("vocab", "embed"), forgot_vocab) == P(None, None)

embed_twice = (*rules, ("embed", "data"))  # a second rule for 'embed', appended
with nnx.logical_axis_rules(embed_twice):
    nnx_reads = nnx.get_partition_spec(abstract)[0]["norm"]["scale"].get_value()
assert nnx_reads == P("data") and logical_to_mesh_axes(("embed",), embed_twice) == P(None)  # last vs first

# %% [markdown]
# Give every name a rule, `None` for "do not split". Flax's older `logical_to_mesh_axes` (used below
# for the batch) treats a missing name as unsplit instead. Give each name one rule, too: for a repeated
# name NNX takes the last rule, `logical_to_mesh_axes` the first.
#
# ## 3. Create the state already sharded
#
# Building the model on one device and then moving it with `jax.device_put` puts the whole model and
# its Adam state on device 0 first: the memory FSDP exists to save. Instead, compile the constructor
# with `out_shardings=` the plan, and each device computes only its own blocks. The init programs'
# memory per device:

# %%
def init():
    return nnx.state(build())


on_one_device = jax.jit(init, compiler_options=FAST_COMPILE).lower().compile()
inits = {name: jax.jit(init, out_shardings=shardings[name], compiler_options=FAST_COMPILE).lower().compile()
         for name in STRATEGIES}

whole = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract))  # parameters + Adam state, bytes
print(f"whole state: {format_bytes(whole)}\n{'init program':<24}{'outputs':>11}{'temporaries':>13}{'footprint':>11}")
for label, c in [("one device, then move", on_one_device), *((f"sharded: {n}", c) for n, c in inits.items())]:
    m = memory_per_device(c)
    print(f"{label:<24}{format_bytes(m.output):>11}{format_bytes(m.temp):>13}{format_bytes(m.footprint):>11}")

one = memory_per_device(on_one_device)
assert one.argument == 0 and one.footprint >= whole  # device 0 holds everything before anything moves

# %% [markdown]
# `footprint` (arguments + outputs + temporaries; on TPU, HBM) is what a device needs while the program
# runs: the whole state for building on one device, and about an eighth of it for FSDP's init (the
# hidden cell at the end of this section checks that with the CPU compiler's figures). Every sharded state holds the numbers of the one-device state (section 5's reference): with
# `jax_threefry_partitionable` (on by default) each device generates only its block, the same values
# however the array is split.

# %%
ref_state = on_one_device()
placed = {name: c() for name, c in inits.items()}
for name in STRATEGIES:
    for got, want in zip(jax.tree.leaves(placed[name]), jax.tree.leaves(ref_state), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for got, want in zip(jax.tree.leaves(placed[name]), jax.tree.leaves(shardings[name]), strict=True):
        assert got.sharding.is_equivalent_to(want, got.ndim)  # created where the plan says
print("four sharded states, equal to the one-device state, each laid out as planned")

# %% [markdown]
# Two matrices (rows) under each strategy (columns). Tensor parallel gives each
# device one head of the query projection (8 columns of 64: heads are stored head after head); FSDP
# splits every matrix along `'embed'`, whichever side that is.

# %%
fig = draw_shardings({f"{name}: {path.split('/', 2)[-1]}": leaf(placed[name], path)
                      for path in SHOWN[1:3] for name in STRATEGIES}, ncols=4)
blocks = {name: shard_table(leaf(placed[name], SHOWN[1])).shard_shapes for name in STRATEGIES}
assert blocks == {"data": {(64, 64)}, "tensor": {(64, 8)}, "2-D": {(64, 32)}, "FSDP": {(8, 64)}}
fig

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §3: FSDP's init program
fsdp_init = memory_per_device(inits["FSDP"]).footprint
print(f"On this compiler FSDP's init needs {fsdp_init / one.footprint:.3f} of the one-device init's memory per "
      "device. On the CPU compiler that is under 1/7; accelerators pad small arrays, so theirs is larger.")
if CPU:  # the CPU compiler's buffer sizes (accelerators pad small arrays to their tiles)
    assert fsdp_init < one.footprint / 7  # FSDP's init: about 1/8 of it

# %% [markdown]
# ## 4. One train step, compiled once per strategy
#
# The task: sequences of 17 tokens that count up from a random start with a random stride of 1, 2 or
# 3, modulo 32 (`15, 18, 21, 24, ...`). The model reads 16 tokens and predicts each next one. The
# first prediction is a guess, but from the second on the stride is known. A seeded NumPy generator makes
# a fresh batch of 32 for each step, and one spare.

# %%
STEPS = 20


def make_batches(rng, steps):
    """int32[steps, BATCH, SEQ + 1]: x[t] = (start + stride * t) mod VOCAB, stride in {1, 2, 3}."""
    start = rng.integers(0, VOCAB, (steps, BATCH, 1))
    stride = rng.integers(1, 4, (steps, BATCH, 1))
    return ((start + stride * np.arange(SEQ + 1)) % VOCAB).astype(np.int32)


data = make_batches(np.random.default_rng(0), STEPS + 1)
print(data[0, :3])
assert data.shape == (STEPS + 1, BATCH, SEQ + 1) and data.max() < VOCAB

# %% [markdown]
# The train step maps the state pytree to the new one (`nnx.merge` inside, `nnx.state` out), so it
# can be compiled from `ShapeDtypeStruct`s that carry the plan, and the program you read is the one
# you train with. `donate_argnums=0` lets the new state overwrite the old one's buffers (notebook 07).
# The rules are entered *inside* the traced function (the second Gotcha shows why). The reference
# step has no mesh and no rules.

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


reference_step = jax.jit(train_step, donate_argnums=0, compiler_options=FAST_COMPILE)
compiled, batch_sharding, structs = {}, {}, {}
for name, (mesh, rules) in STRATEGIES.items():
    with nnx.logical_axis_rules(rules):
        batch_sharding[name] = NamedSharding(mesh, logical_to_mesh_axes(("batch", None)))
    structs[name] = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                 abstract, shardings[name])
    tokens = jax.ShapeDtypeStruct(data[0].shape, jnp.int32, sharding=batch_sharding[name])
    replicated = NamedSharding(mesh, P())
    step = jax.jit(with_rules(rules, train_step), donate_argnums=0,
                   out_shardings=(shardings[name], replicated, replicated), compiler_options=FAST_COMPILE)
    with jax.set_mesh(mesh):  # with_logical_constraint needs a mesh in context, or it does nothing
        compiled[name] = step.lower(structs[name], tokens).compile()

print(f"{'strategy':<9}{'batch':<21}" + "".join(f"{k:>16}" for k in ("all-reduce", "all-gather", "all-to-all")))
for name in STRATEGIES:
    c = collectives(compiled[name])
    print(f"{name:<9}{batch_sharding[name].spec!s:<21}" + "".join(f"{c.count(k):>16}" for k in (
        "all-reduce", "all-gather", "all-to-all")))

# %% [markdown]
# A collective's result shape says what it carries: `[32,16,...]` (batch, sequence) is an
# **activation**, and a parameter's shape is a **gradient or a weight** (`op.shapes` lists them). The
# GPU compiler flattens merged collectives into one 1-D array (`f32[8320]`), so the checks for every
# backend compare kinds, groups and bytes. Shapes are checked on the CPU compiler's program only, in
# the hidden cell at the end of this section.

# %%
param_shapes = {var.get_value().shape for _, var in params}
param_bytes = 4 * n_params
is_activation = lambda shape, rows: shape[:2] == (rows, SEQ)  # [batch rows, seq, ...]

# %% [markdown]
# **Data parallel: the gradients, summed.** The all-reduces carry each gradient once (plus the loss
# and accuracy scalars), whatever the batch. The CPU compiler merges them into one:

# %%
c = collectives(compiled["data"])
print(f"{c.count()} all-reduce over {c.ops[0].group_size} devices: {format_bytes(c.result_bytes)} "
      f"(the gradients are {format_bytes(param_bytes)})")
assert c.kinds == {"all-reduce"}
assert param_bytes <= c.result_bytes <= param_bytes + 16  # the gradients + 2 scalars, nothing else

# %% [markdown]
# **Tensor parallel: activations, several times per layer.** Wherever a split matrix hands back a
# partial residual stream, `f32[32,16,64]{U:model}` (the full batch), it is all-reduced. The loss and the
# accuracy need collectives too, because the vocabulary is split. In one step of this one-layer model:
#
# | collective | what it carries | pass |
# |---|---|---|
# | all-reduce | the token embedding's output: vocabulary-parallel, each device holds 4 of its 32 rows | forward |
# | all-reduce | the attention output projection's output | forward |
# | all-reduce | the MLP down projection's output | forward |
# | all-reduce | the loss's `[32,16]` maxima and totals over the split vocabulary | forward |
# | all-gather | the accuracy's argmax: each device's best score and its index, `[32,16,8]` | forward |
# | all-reduce | the input gradient of the head | backward |
# | all-reduce | the input gradient of the MLP up projection | backward |
# | all-reduce | the input gradients of the q, k and v projections | backward |
#
# No gradient of a parameter crosses devices, because each device owns its slice of every split
# matrix. The compilers differ in one row: the CPU compiler sums the q, k and v input gradients
# separately (8 residual sums in all), while the TPU compiler adds them up first (6). The hidden cell
# at the end of this section holds the CPU compiler's shapes.

# %%
c = collectives(compiled["tensor"])
print(c)
residual_bytes = 4 * BATCH * SEQ * D_MODEL  # one [32,16,64] residual stream
tensor_sums = sum(op.result_bytes for op in c.ops if op.kind == "all-reduce")
assert c.kinds <= {"all-reduce", "all-gather"} and {op.group_size for op in c.ops} == {8}
assert tensor_sums >= 4 * NUM_LAYERS * residual_bytes  # 2 forward, 2 back, merged or not

# %% [markdown]
# **2-D: both patterns, each on its own axis.** Activations over `model` (groups of 2), now with 32/4
# = 8 rows each, so their sums carry a quarter of tensor parallel's bytes. Gradients go over `data`
# (groups of 4), half of data parallel's, because the split matrices are halved over `model`.

# %%
c = collectives(compiled["2-D"])
over_model = [op for op in c.ops if op.group_size == 2]
over_data = [op for op in c.ops if op.group_size == 4]
print(f"over model (groups of 2): {len(over_model)} collectives on activations; "
      f"over data (groups of 4): {len(over_data)} all-reduce of gradients")
assert len(over_model) + len(over_data) == len(c.ops)
assert 4 * sum(op.result_bytes for op in over_model if op.kind == "all-reduce") == tensor_sums  # 8 rows, not 32
assert {op.kind for op in over_data} == {"all-reduce"}
grad_bytes_2d = 4 * (n_split // 2 + n_embed_only)
assert grad_bytes_2d <= sum(op.result_bytes for op in over_data) <= grad_bytes_2d + 16

# %% [markdown]
# **FSDP: weights gathered before use, gradients summed.** Every all-gather rebuilds a whole parameter
# from its 8 slices before it is used. Each device needs only its slice of the gradients, pending sums
# `{U:fsdp}`, so the natural collective is a reduce-scatter. The CPU compiler uses an **all-reduce** of
# their full size instead, after which each device keeps its slice (notebook 11).

# %%
c = collectives(compiled["FSDP"])
gathers = [op for op in c.ops if op.kind == "all-gather"]
print(f"{len(gathers)} all-gathers, e.g. {', '.join(op.result_type for op in gathers[:4])}, ...")
assert "all-gather" in c.kinds

# %% [markdown]
# ### Gotcha: annotating the parameters is not enough
#
# Drop the `with_logical_constraint` lines and FSDP stops being FSDP. The parameters say "split
# `embed`", the batch says "split `batch`", and nothing says what the activations should be. So the
# compiler follows the weights: it splits activations along `embed` and moves whole activations instead
# of weights. Compile just the loss, with the rules inside the trace and without them (then
# `with_logical_constraint` does nothing):

# %%
def loss_only(state, tokens):
    model, _ = nnx.merge(graphdef, state)
    return optax.softmax_cross_entropy_with_integer_labels(model(tokens[:, :-1]), tokens[:, 1:]).mean()


mesh, rules = STRATEGIES["FSDP"]
tokens = jax.ShapeDtypeStruct(data[0].shape, jnp.int32, sharding=batch_sharding["FSDP"])
with jax.set_mesh(mesh):
    loose = jax.jit(loss_only, compiler_options=FAST_COMPILE).lower(structs["FSDP"], tokens).compile()
    pinned = jax.jit(with_rules(rules, loss_only), compiler_options=FAST_COMPILE).lower(structs["FSDP"], tokens).compile()
loose, pinned = collectives(loose), collectives(pinned)
summed = {}
for label, c in (("no activation constraint", loose), ("residual = ('batch', None, None)", pinned)):
    summed[label] = sum(op.result_bytes for op in c.ops if op.kind == "all-reduce")
    print(f"{label:<34} {c.count():>3} collectives, {format_bytes(c.estimated_bytes):>10} sent per device "
          f"(ring estimate); all-reduces sum {format_bytes(summed[label])}")
loose_sums, pinned_sums = summed.values()
assert loose_sums >= residual_bytes  # whole activations summed across devices
assert 100 * pinned_sums < loose_sums and "all-gather" in pinned.kinds  # weights gathered instead

# %% [markdown]
# ### Gotcha: the rules are read while tracing, and `jax.jit` does not know about them
#
# `with_logical_constraint` turns names into a spec when the function is **traced**, with whatever
# rules are in force then. `jax.jit` caches traces by function and argument types, not by Flax's
# rules, so lowering the *same* function again under other rules silently reuses the old trace. And
# with no mesh in context the constraint is silently skipped. A tiny function shows all three:

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
# Hence `with_rules(rules, fn)`: each strategy's step is its own function, so no trace is reused for
# the wrong strategy. The reference step, with no mesh, skips the constraints.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §4: the collectives, shape by shape
ops_of = {name: collectives(compiled[name]) for name in STRATEGIES}
residual_sums = sum(s == (BATCH, SEQ, D_MODEL) for op in ops_of["tensor"].ops for s in op.shapes)
print(f"This compiler's tensor-parallel step sums the residual stream {residual_sums} times. The CPU compiler "
      "sums it 2 + 6 times per layer, the TPU compiler 2 + 4 (tests/test_tpu_side.py checks the TPU program).")
if CPU:  # the CPU compiler's program keeps every array's shape
    assert ops_of["data"].count() == 1  # all gradients merged into one all-reduce
    assert all(is_activation(s, BATCH) for op in ops_of["tensor"].ops for s in op.shapes)  # nothing but activations
    assert residual_sums == 2 + 6 * NUM_LAYERS  # TPU: 2 + 4 per layer (q, k, v input gradients added first)
    assert sorted(s for op in ops_of["tensor"].ops if op.kind == "all-gather" for s in op.shapes) == [
        (BATCH, SEQ, 8)] * 2
    assert all(is_activation(s, BATCH // 4) for op in over_model for s in op.shapes)
    fsdp_ops = ops_of["FSDP"]
    reduces = [op for op in fsdp_ops.ops if op.kind == "all-reduce"]
    assert fsdp_ops.kinds == {"all-gather", "all-reduce"} and fsdp_ops.count("reduce-scatter") == 0
    assert {s for op in fsdp_ops.ops if op.kind == "all-gather" for s in op.shapes} == param_shapes  # every weight
    assert param_bytes <= sum(op.result_bytes for op in reduces) <= param_bytes + 16  # full-size gradients
    assert any(is_activation(s, BATCH) for op in loose.ops for s in op.shapes)
    assert not any(is_activation(s, BATCH) for op in pinned.ops for s in op.shapes)
    assert loose.estimated_bytes > 3 * pinned.estimated_bytes

# %% [markdown]
# ## 5. Train it: one device, then the four strategies
#
# The single device takes 20 steps, enough to learn the task. Each strategy takes the first 8 of them,
# on the same batches from the same initial numbers, each batch placed as its strategy wants. A few steps
# are enough to compare, because a layout that changed the computation would change the first step's
# loss and gradients already, and they keep the notebook quick (on 8 simulated CPU devices a sharded step
# costs more than a one-device step). Every step donates its state, so the loop rebinds it to the step's
# output, and a copy keeps the single device's state after 8 steps.

# %%
COMPARED = 8  # steps each strategy takes: the first 8 of the single device's 20


def train(step, state, batches, place=lambda batch: batch):
    losses, accuracies = [], []
    for batch in batches:
        state, loss, accuracy = step(state, place(batch))
        losses.append(loss)
        accuracies.append(accuracy)
    return state, np.array(losses), np.array(accuracies)


history, trained = {}, {}
first_kernel = leaf(ref_state, "blocks/0/mlp/up/kernel")
state, *early = train(reference_step, ref_state, data[:COMPARED])
at_compared = jax.tree.map(jnp.copy, state)  # the single device after 8 steps (the next step donates state)
trained["one device"], *late = train(reference_step, state, data[COMPARED:STEPS])
history["one device"] = [np.concatenate(halves) for halves in zip(early, late, strict=True)]
for name in STRATEGIES:
    place = functools.partial(jax.device_put, device=batch_sharding[name])
    trained[name], *history[name] = train(compiled[name], placed[name], data[:COMPARED], place)

ref_losses, ref_accuracies = history["one device"]
print("loss    ", np.round(ref_losses[::5], 2), "->", round(float(ref_losses[-1]), 3))
print("accuracy", np.round(ref_accuracies[::5], 2), "->", round(float(ref_accuracies[-1]), 3))
assert first_kernel.is_deleted()  # donated: the first step wrote the new state into its buffers
assert ref_losses[-1] < 0.15 * ref_losses[0]  # from about ln(32) to a small fraction of it
assert ref_accuracies[-5:].mean() > 0.85  # predicts the next token of unseen sequences
for name in STRATEGIES:  # four layouts, one computation: the same losses and the same trained parameters
    assert len(history[name][0]) == COMPARED
    assert_close(history[name][0], ref_losses[:COMPARED])
    for got, want in zip(jax.tree.leaves(trained[name][0]), jax.tree.leaves(at_compared[0]), strict=True):
        assert_close(got, want, atol=RTOL)  # atol: near-zero weights
print(f"all four strategies: the single-device losses and parameters over {COMPARED} steps, to within {RTOL:g}")

# %%
fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.4))
for (name, (loss_curve, acc_curve)), style in zip(history.items(), ("-", "--", ":", "-.", (0, (1, 3))), strict=True):
    ax_loss.plot(loss_curve, linestyle=style, label=name, linewidth=2)
    ax_acc.plot(acc_curve, linestyle=style, label=name, linewidth=2)
ax_loss.set(xlabel="step", ylabel="training loss", yscale="log", title="loss: the sharded curves follow one device's")
ax_acc.set(xlabel="step", ylabel="next-token accuracy (positions 1-15)", ylim=(0, 1.02),
           title="accuracy on each fresh batch")
ax_loss.legend()
fig.tight_layout()
plt.close(fig)
fig

# %% [markdown]
# The strategies differ from one device by float rounding only (split sums are added in another order).
#
# ## 6. What each strategy costs
#
# Per device: the state it holds (`shard_table`), what the compiled step needs while it runs
# (`memory_per_device`; the donated state counted once), and the
# collectives per step, with a ring-formula estimate of the bytes each device sends.

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
print(f"{'strategy':<9}{'state held':>11}{'step needs':>12}{'of it aliased':>15}   {'collectives per step':<27}"
      f"{'ring estimate':>14}")
memory = {name: memory_per_device(compiled[name]) for name in STRATEGIES}
moved = {name: collectives(compiled[name]).estimated_bytes for name in STRATEGIES}
held_by = {name: state_bytes_per_device(trained[name]) for name in STRATEGIES}
for name in STRATEGIES:
    held, m = held_by[name], memory[name]
    kinds = ", ".join(f"{n} {k}" for k, n in collectives(compiled[name]).counts.items() if n)
    print(f"{name:<9}{format_bytes(held):>11}{format_bytes(m.footprint):>12}{format_bytes(m.alias):>15}   {kinds:<27}"
          f"{format_bytes(moved[name]):>14}")
    assert held == expected[name], (name, held, expected[name])
assert expected["data"] == 655_880  # parameters and Adam state, whole on every device

# %% [markdown]
# - **State.** Data parallel keeps everything on every device. FSDP keeps exactly 1/8, because every
#   parameter has an `'embed'` dimension. Tensor parallel splits only the matrices with a `'heads'`,
#   `'mlp'` or `'vocab'` dimension, and 2-D splits those 2 ways.
# - **What the step needs** follows another order. Tensor parallel and FSDP hold the full batch or full
#   weights at times, so on the CPU compiler their temporaries are larger than data parallel's (the
#   hidden cell below checks it with the CPU compiler's figures).
# - **Communication.** Data parallel sums the gradients once per step, whatever the batch. Tensor
#   parallel sums activations several times per layer, in proportion to batch x sequence x `d_model`,
#   which here is more than the gradients. FSDP gathers each weight. The CPU compiler then sums the full
#   gradients, where the TPU and GPU compilers reduce-scatter some or all of them.
#
# A TPU v5e-8 compiles the same four steps differently (the hidden cell's second table, at the default
# effort). The state each chip keeps falls in the same order, from 898 KiB for data parallelism to 142 KiB
# for FSDP, and tensor parallelism again sends the most, 3.7 times data parallelism's bytes. But every
# strategy needs 2.1 to 2.7 MiB of HBM per chip, more than twice the largest state, because at this toy size
# the padded tiles and temporaries outweigh the state, and FSDP needs the most. So compare strategies'
# memory at a real size: notebook 10 does it for FSDP, and notebook 17 scales this comparison to 64 devices.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU and TPU compilers' exact figures, §6: the bytes of each strategy's step
print("This compiler's temporaries per device:", ", ".join(f"{name} {format_bytes(memory[name].temp)}"
                                                             for name in STRATEGIES) + ".")
if CPU:  # exact byte counts of the CPU compiler (accelerators pad small arrays)
    for name in STRATEGIES:
        batch_bytes = max(shard_table(jax.device_put(data[0], batch_sharding[name])).bytes_per_device.values())
        assert memory[name].argument == held_by[name] + batch_bytes and memory[name].alias == held_by[name]
    assert memory["tensor"].temp > memory["data"].temp and memory["FSDP"].temp > memory["data"].temp
    assert moved["tensor"] > moved["2-D"] > moved["data"]  # activations cost more than gradients, at this size
# A TPU v5e-8 at the default effort, compiled ahead of time by tests/test_07_12_tpu_tables.py, which asserts
# this table (jax 0.12.0.1, libtpu 0.0.50.1): KiB per chip (HBM, state aliased), collectives, KiB sent (ring)
TPU_STRATEGIES = {"data": (2488.0, 898.0, {"all-reduce": 1}, 373.6),
                  "tensor": (2300.5, 190.0, {"all-reduce": 7, "all-gather": 2}, 1379.0),
                  "2-D": (2140.0, 466.0, {"all-reduce": 8, "all-gather": 2}, 358.3),
                  "FSDP": (2712.5, 142.0, {"all-reduce": 2, "all-gather": 12, "reduce-scatter": 1}, 383.3)}
print(f"A TPU v5e-8's figures at the default effort:\n{'strategy':<9}{'HBM':>12}{'state aliased':>15}   "
      f"{'collectives per step':<42}{'ring estimate':>14}")
for name, (hbm_kib, alias_kib, counts, sent_kib) in TPU_STRATEGIES.items():
    kinds = ", ".join(f"{n} {k}" for k, n in counts.items())
    print(f"{name:<9}{hbm_kib:>8.1f} KiB{alias_kib:>11.1f} KiB   {kinds:<42}{sent_kib:>10.1f} KiB")
tpu_hbm, tpu_state, _, tpu_sent = (dict(zip(TPU_STRATEGIES, column, strict=True))
                                   for column in zip(*TPU_STRATEGIES.values(), strict=True))
assert tpu_state["data"] > tpu_state["2-D"] > tpu_state["tensor"] > tpu_state["FSDP"]  # as on the CPU
assert tpu_sent["tensor"] > 3 * tpu_sent["data"]  # activations cost more than gradients here too
assert min(tpu_hbm.values()) > 2 * max(tpu_state.values()) and max(tpu_hbm, key=tpu_hbm.get) == "FSDP"

# %% [markdown]
# ## 7. Save under FSDP, restore as tensor parallel
#
# A checkpoint should not pin the layout. Orbax's `StandardCheckpointer` writes each array's shards
# from the devices that hold them. To restore, give it the target as `ShapeDtypeStruct`s **with the
# shardings you want now** (the tensor-parallel `structs`), and each device reads just its slice.

# %%
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / f"fsdp_step{COMPARED}"
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, trained["FSDP"])
    checkpointer.wait_until_finished()
    print("written:", sorted(p.name for p in path.iterdir()))
    restored = checkpointer.restore(path, structs["tensor"])

kernel = "blocks/0/mlp/up/kernel"
print(f"{kernel}: saved as {type_string(leaf(trained['FSDP'], kernel))}, "
      f"restored as {type_string(leaf(restored, kernel))}")
for new, old, want in zip(jax.tree.leaves(restored), jax.tree.leaves(trained["FSDP"]),
                          jax.tree.leaves(shardings["tensor"]), strict=True):
    assert new.sharding.is_equivalent_to(want, new.ndim)  # the new layout
    np.testing.assert_array_equal(np.asarray(new), np.asarray(old))  # the same numbers

# %% [markdown]
# The restored state is a working tensor-parallel state: one more step with the tensor-parallel
# executable gives the loss that FSDP and the single device (after its first 8 steps) give for the
# same step, on the spare batch.

# %%
_, loss_tensor, _ = compiled["tensor"](restored, jax.device_put(data[STEPS], batch_sharding["tensor"]))
_, loss_fsdp, _ = compiled["FSDP"](trained["FSDP"], jax.device_put(data[STEPS], batch_sharding["FSDP"]))
_, loss_one, _ = reference_step(at_compared, data[STEPS])
print(f"step {COMPARED + 1}: tensor parallel from the FSDP checkpoint {float(loss_tensor):.5f}, "
      f"FSDP {float(loss_fsdp):.5f}, one device {float(loss_one):.5f}")
assert_close([float(loss_tensor), float(loss_fsdp)], [float(loss_one)] * 2)

# %% [markdown]
# ## Takeaways
# - Annotate once with logical names (`nnx.with_partitioning(init, ('embed', 'mlp'))`); a strategy is a
#   rule table in `nnx.logical_axis_rules`. All four train to the single-device losses and weights.
# - Create the state sharded: plan with `nnx.eval_shape` and `nnx.get_named_sharding`, then
#   `jax.jit(init, out_shardings=plan)`; building on one device needs the whole state there first.
# - Give every logical name a rule, and constrain the activations too: without it FSDP moved whole
#   activations. Enter the rules inside the function you `jit`, with a mesh in context.
# - Data parallel holds everything and sums gradients once per step; tensor parallel sums activations
#   several times per layer; FSDP holds 1/8 and gathers weights.
# - Checkpoints are layout-free: restore with Orbax into `ShapeDtypeStruct`s with the new shardings.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1 (write the rules).** A fifth strategy, FSDP x tensor on the `(4, 2)` mesh
# `('data', 'model')`: split the batch **and** every parameter's `'embed'` dimension over `data`, and
# `'heads'`, `'mlp'` and `'vocab'` over `model`. Write its rule table (a tuple of
# `(logical name, mesh axis or None)` pairs, one pair for each of the five names).

# %%
from spmd_course.exercises import ex12_transformer as ex

answer_1 = NOT_ANSWERED  # e.g. (("batch", ...), ("vocab", ...), ("embed", ...), ("heads", ...), ("mlp", ...))
ex.fsdp_tensor_rules.check(answer_1);

# %% [markdown]
# **Exercise 2 (predict the bytes).** Under the FSDP rules, how many bytes of parameters and Adam
# state does each device hold if `D_FF` were 512 instead of 256 (everything else as here, including
# the 8 bytes of replicated step counters)? Section 6's `expected` shows the form.

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
# **Next:** [13 · Training memory](13_training_memory.ipynb)
