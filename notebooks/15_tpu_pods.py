# %% [markdown]
# # 15 · Compiling for TPU pods you don't have
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/15_tpu_pods.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/15_tpu_pods.ipynb)
#
# This notebook teaches you to compile programs for TPU slices you do not have, and to read what the TPU
# compiler made of them. Every collective, byte count and memory figure in notebooks 04 to 14 came from
# the CPU compiler, but you will train on TPUs, and the two compilers differ exactly where strategies
# differ. JAX compiles ahead of time for any TPU topology with no TPU present: the result is the real TPU
# program, whose HLO and memory analysis you can read but not run. You will put the TPU program beside the
# CPU program for the same code, and ask the TPU compiler whether a 2.7-billion-parameter model fits a
# 64-chip slice, without allocating any of it.
#
# **You will learn**
# - how to describe a TPU slice with `topologies.get_topology_desc`, what its devices tell you, and how
#   much memory (HBM) each chip generation has;
# - why a mesh should come from `jax.make_mesh` (through `mesh_utils.create_device_mesh`) rather than a
#   reshape of the device list;
# - where the TPU and CPU programs agree (which collectives, over which axes) and where they differ
#   (bf16 gathers, fused reduce-scatters, asynchronous collectives, tiled memory), for the four matmul
#   cases and for DP, FSDP, TP and 2-D train steps;
# - how to ask the TPU compiler whether a model fits, under several mesh shapes and strategies.

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
import itertools
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from flax.linen import with_logical_constraint
from jax.experimental import mesh_utils, topologies
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import NOT_ANSWERED, collectives, draw_mesh, format_bytes, memory_per_device, quiet, tpu_compiler_available

assert jax.device_count() == 8
CPU = jax.default_backend() == "cpu"  # the CPU program's side of each comparison is asserted under `if CPU:`
GiB = 2**30

# %% [markdown]
# ## 1. A TPU compiler without a TPU
#
# The TPU compiler ships in `libtpu`, which `pip install 'jax[tpu]'` installs (Linux only). It compiles
# for any slice you describe by name, `generation:shape`: `v5e:2x4` is 8 v5e chips on a 2 x 4 board,
# `v5e:8x8` is 64. Describing one starts no backend and allocates nothing; `quiet()` keeps libtpu's
# start-up warnings (it looks for a TPU and finds none) out of the output.

# %%
ok, why = tpu_compiler_available()
print(why)
NAMES = ["v5e:2x4", "v5e:8x8", "v5e:16x16", "v6e:2x4", "v5p:2x2x2"]
if ok:
    with quiet():
        topos = {name: topologies.get_topology_desc(topology_name=name, platform="tpu") for name in NAMES}
    print(f"{'topology':<11}{'chips':>6}  {'device_kind':<13}{'cores per chip':>15}  board (x, y, z)")
    for name, topo in topos.items():
        chip = topo.devices[0]
        board = tuple(max(d.coords[i] for d in topo.devices) + 1 for i in range(3))
        print(f"{name:<11}{len(topo.devices):>6}  {chip.device_kind:<13}{chip.num_cores:>15}  {board}")
    assert [len(t.devices) for t in topos.values()] == [8, 64, 256, 8, 8]
    assert {t.devices[0].device_kind for t in topos.values()} == {"TPU v5 lite", "TPU v6 lite", "TPU v5"}
    assert topos["v5p:2x2x2"].devices[0].num_cores == 2  # a v5p chip: two TensorCores driven as one device

# %% [markdown]
# Each device is one chip and knows its generation (`device_kind`: a v5e is `'TPU v5 lite'`) and its
# place on the board (`coords`). What it does not know is its memory: `memory_stats()` works only on
# real chips. That figure comes from Google's pages for each generation:
#
# | generation | `device_kind` | HBM per chip | source |
# |---|---|---|---|
# | v5e | `TPU v5 lite` | 16 GiB | [cloud.google.com/tpu/docs/v5e](https://cloud.google.com/tpu/docs/v5e) |
# | v6e (Trillium) | `TPU v6 lite` | 32 GiB | [cloud.google.com/tpu/docs/v6e](https://cloud.google.com/tpu/docs/v6e) |
# | v5p | `TPU v5` | 95 GiB | [cloud.google.com/tpu/docs/v5p](https://cloud.google.com/tpu/docs/v5p) |
#
# Google's pages write GB; the compiler counts GiB (2^30 bytes), the unit of this table. Section 6 finds
# how much of a v5e's 16 GiB a program may use, from the compiler itself.

# %%
HBM = {"v5e": ("TPU v5 lite", "16 GiB"), "v6e": ("TPU v6 lite", "32 GiB"), "v5p": ("TPU v5", "95 GiB")}  # the table above

# %% [markdown]
# ## 2. A mesh from the chips: order matters
#
# A mesh is an array of devices, and a slice's devices are a list. The 64-chip slice lists its chips
# host by host (16 hosts, each driving a 2 x 2 block of the board), so reshaping the list puts one host's
# chips side by side, not the board's neighbours. `mesh_utils.create_device_mesh`, which `jax.make_mesh`
# calls, reads the `coords` instead. Compare the first row and column of an (8, 8) mesh built both ways:
# the board position of each chip, and the links crossed between neighbours.

# %%
def links(chips):
    """Board links between consecutive chips of a row (grid steps, x plus y)."""
    return [sum(abs(a - b) for a, b in zip(p.coords, q.coords, strict=True)) for p, q in itertools.pairwise(chips)]


if not ok:
    print(why)
else:
    pod = topos["v5e:8x8"]
    host_blocks: dict[int, set] = {}
    for d in pod.devices:
        host_blocks.setdefault(d.process_index, set()).add(tuple(d.coords[:2]))
    assert len(host_blocks) == 16 and all(  # 16 hosts, each driving a 2 x 2 block of the board
        len(b) == 4 and len({x for x, _ in b}) == len({y for _, y in b}) == 2 for b in host_blocks.values())
    naive = np.array(pod.devices).reshape(8, 8)
    physical = mesh_utils.create_device_mesh((8, 8), pod.devices)
    for name, grid in (("reshape", naive), ("create_device_mesh", physical)):
        print(f"{name:<19} row 0 at {[tuple(d.coords[:2]) for d in grid[0]]}")
        print(f"{'':<19} links {links(grid[0])}, down column 0: {links(grid[:, 0])}")
    assert max(links(naive[0])) > 1 and max(links(naive[:, 0])) > 1  # neighbours in the mesh, not on the board
    assert {d.coords[1] for d in naive[0]} == {0, 1} and links(naive[:, 0])[0] == 4  # two board rows; 4 links down
    assert all(max(links(row)) == 1 for grid in (physical, physical.T) for row in grid)  # one link, every step

    pod_mesh = jax.make_mesh((8, 8), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=pod.devices)
    assert (pod_mesh.devices == physical).all()  # jax.make_mesh orders chips the same way
    assert (pod_mesh.device_ids == np.arange(64).reshape(8, 8)).all()  # chip ids count along the board
    reshaped = Mesh(naive, ("data", "model"), axis_types=(AxisType.Auto,) * 2)
fig = draw_mesh(reshaped, title="np.array(topo.devices).reshape(8, 8): chip ids") if ok else None
fig

# %% [markdown]
# Chip ids count along the board (`id = x + 8y`), so `jax.make_mesh`'s mesh holds them in order, 0 to
# 63, and every step along either axis is one link: a collective along `data` or `model` talks to direct
# neighbours. The reshaped mesh, drawn above, zigzags: its row 0 covers two board rows, and its next row
# starts 4 links away. The order never changes the program: the per-chip programs compiled for the two
# meshes are the same text; only which chip runs which part differs.

# %%
if not ok:
    print(why)
else:
    matmul_on = {name: jax.jit(lambda a, b: a @ b).lower(
        jax.ShapeDtypeStruct((512, 1024), jnp.float32, sharding=NamedSharding(m, P("data", "model"))),
        jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(m, P("model", None)))).compile()
        for name, m in (("reshape", reshaped), ("make_mesh", pod_mesh))}
    assert matmul_on["reshape"].as_text() == matmul_on["make_mesh"].as_text()
    print(collectives(matmul_on["make_mesh"]))

# %% [markdown]
# ## 3. The four matmul cases, on both compilers
#
# Notebook 04 predicted the collective of each matmul case and checked it on the CPU. Compile the same
# `(512, 1024) @ (1024, 1024)` float32 matmuls for 8 CPU devices and for the 8 chips of a v5e-8, on a
# `(4, 2)` mesh each:

# %%
CASES = {
    "P('data','model') @ P(None,'model')": (P("data", "model"), P(None, "model")),
    "P('data','model') @ P('model',None)": (P("data", "model"), P("model", None)),
    "P('data',None) @ P(None,'model')": (P("data", None), P(None, "model")),
    "P(None,'data') @ P('data',None)": (P(None, "data"), P("data", None)),
}
# "CPU": this machine's 8 devices (simulated CPUs, unless it has 8 accelerators); "TPU": the v5e-8, ahead of time
meshes = {"CPU": jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)}
if ok:
    meshes["TPU"] = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2,
                                  devices=topos["v5e:2x4"].devices)


def struct(mesh, shape, spec, dtype=jnp.float32):
    """An abstract array: shape, dtype and where it would live. Nothing is allocated."""
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def summary(found):
    return ", ".join(f"{op.kind} {op.result_type} over {op.group_size}" for op in found.ops) or "none"


matmuls = {}
for case, (x_spec, w_spec) in CASES.items():
    matmuls[case] = {backend: collectives(jax.jit(lambda a, b: a @ b).lower(
        struct(m, (512, 1024), x_spec), struct(m, (1024, 1024), w_spec)).compile()) for backend, m in meshes.items()}
    print(case)
    for backend, found in matmuls[case].items():
        print(f"   {backend}: {summary(found)}")
if not ok:
    print(why)
else:
    gather = {b: f.ops[0] for b, f in matmuls["P('data','model') @ P(None,'model')"].items()}
    assert gather["TPU"].result_type == "bf16[128,1024]" and gather["TPU"].result_bytes == 128 * 1024 * 2
    sums = [op for found in matmuls.values() for op in found["TPU"].ops if op.kind == "all-reduce"]
    assert sums and all(op.result_type.startswith("f32[") for op in sums)  # the summed results stay float32
    if CPU:
        for case, found in matmuls.items():
            kinds = {b: [(op.kind, op.group_size) for op in f.ops] for b, f in found.items()}
            assert kinds["TPU"] == kinds["CPU"], case  # the same collectives, over the same axes
        assert gather["CPU"].result_type == "f32[128,1024]" and gather["CPU"].result_bytes == 128 * 1024 * 4

# %% [markdown]
# Where both compilers agree: which collective each case needs and over which mesh axis: the partitioner
# that decides it is the same code. Where they differ: the all-gather of case 1 gathers
# `bf16[128,1024]` on TPU against `f32[128,1024]` on CPU, half the bytes. A float32 matmul on a TPU
# multiplies in bf16 by default (the reason notebooks use `RTOL = 1e-2` off the CPU), so the TPU compiler
# converts the operand before gathering it. The all-reduces sum the matmuls' float32 results, and stay
# float32.
#
# ## 4. DP, FSDP, TP and 2-D train steps, on both compilers
#
# One train step (a two-layer MLP `512 -> 2048 -> 512`, mean squared error, SGD, a batch of 256) under
# the four strategies of notebooks 07 to 10, compiled for 8 CPU devices and for the v5e-8:

# %%
def loss_fn(params, x, y):
    return jnp.mean((jax.nn.relu(x @ params["w1"]) @ params["w2"] - y) ** 2)


def sgd_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


STRATEGIES = {  # mesh shape, axis names, weight specs, batch spec
    "DP": ((8,), ("data",), (P(), P()), P("data")),
    "FSDP": ((8,), ("data",), (P("data", None), P("data", None)), P("data")),
    "TP": ((8,), ("model",), (P(None, "model"), P("model", None)), P()),
    "2-D": ((4, 2), ("data", "model"), (P(None, "model"), P("model", None)), P("data")),
}
devices = {"CPU": jax.devices(), **({"TPU": topos["v5e:2x4"].devices} if ok else {})}
steps = {}
for name, (shape, axes, (w1_spec, w2_spec), batch_spec) in STRATEGIES.items():
    for backend, devs in devices.items():
        mesh = jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(shape), devices=devs)
        params = {"w1": struct(mesh, (512, 2048), w1_spec), "w2": struct(mesh, (2048, 512), w2_spec)}
        batch = struct(mesh, (256, 512), batch_spec)
        step = jax.jit(sgd_step, out_shardings=({k: v.sharding for k, v in params.items()}, NamedSharding(mesh, P())))
        steps[name, backend] = step.lower(params, batch, batch).compile()

print(f"{'':<6}{'':<5}{'all-gather':>11}{'all-to-all':>11}{'all-reduce':>11}{'reduce-scatter':>15}  forms")
for (name, backend), compiled in steps.items():
    found = collectives(compiled)
    forms = sorted({op.form for op in found.ops})
    print(f"{name:<6}{backend:<5}" + "".join(f"{found.count(k):>{len(k) + 1}}" for k in
                                             ("all-gather", "all-to-all", "all-reduce", "reduce-scatter"))
          + f"  {', '.join(forms)}")

# %% [markdown]
# DP, TP and 2-D compile to the same collectives on both: one all-reduce of every gradient over `data`
# (DP), one all-reduce of the activations over `model` (TP), and both for 2-D. FSDP is where they part.
# Its gradients must end sharded like the weights: a reduce-scatter. The CPU program sums the whole
# gradients (all-reduce) and then slices; the TPU program has one fused reduce-scatter for both
# gradients, and only the loss is all-reduced. Its all-gathers move bf16, and some are asynchronous
# (`form` `'async'`): started early and finished later, overlapping with compute.

# %%
if not ok:
    print(why)
else:
    for name, kinds in (("DP", ["all-reduce"]), ("TP", ["all-reduce"]), ("2-D", ["all-reduce"] * 2)):
        assert [op.kind for op in collectives(steps[name, "TPU"]).ops] == kinds  # the same on both compilers
    tpu_fsdp = collectives(steps["FSDP", "TPU"])
    (scatter,) = [op for op in tpu_fsdp.ops if op.kind == "reduce-scatter"]
    print("TPU, FSDP:", scatter.kind, scatter.result_type, f"({scatter.form})",
          "| all-reduce:", [op.result_type for op in tpu_fsdp.ops if op.kind == "all-reduce"])
    assert scatter.result_type == "f32[64,2048] + f32[256,512]" and scatter.form == "fused"  # 1/8 of each
    assert [op.result_type for op in tpu_fsdp.ops if op.kind == "all-reduce"] == ["f32[]"]  # only the loss
    assert {op.result_type[:4] for op in tpu_fsdp.ops if op.kind == "all-gather"} == {"bf16"}
    assert "async" in {op.form for op in tpu_fsdp.ops}
    if CPU:
        for name in ("DP", "TP", "2-D"):
            kinds = {b: [(op.kind, op.group_size) for op in collectives(steps[name, b]).ops] for b in devices}
            assert kinds["TPU"] == kinds["CPU"], name
        cpu_fsdp = collectives(steps["FSDP", "CPU"])
        (summed,) = [op for op in cpu_fsdp.ops if op.kind == "all-reduce"]
        assert cpu_fsdp.count("reduce-scatter") == 0 and "f32[512,2048]" in summed.result_type  # whole gradients
        print(f"ring estimates per chip per step: TPU {format_bytes(tpu_fsdp.estimated_bytes)}, "
              f"CPU {format_bytes(cpu_fsdp.estimated_bytes)}")
        assert tpu_fsdp.estimated_bytes < 0.6 * cpu_fsdp.estimated_bytes

# %% [markdown]
# So on the TPU, FSDP's gradient traffic is a reduce-scatter and its gathers are half as large: by the
# ring formula, less than 60% of the CPU program's bytes. For this step, notebook 10's CPU estimates
# overstate the TPU's.
#
# ## 5. Memory per chip
#
# `memory_per_device` reads `memory_analysis()` on both. Two things change on TPU (the `Memory` class
# explains both): arrays are stored in tiles of 8 x 128 elements, so a dimension is padded up to them;
# and `temporaries` leave out buffers the compiler places in the chip's other memory, so read
# `footprint`, the larger of `peak` and arguments + outputs + temporaries. For these steps it is `peak`.

# %%
print(f"{'':<6}{'CPU arguments':>14}{'TPU arguments':>15}{'CPU footprint':>15}{'TPU footprint':>15}")
for name in STRATEGIES:
    mems = {b: memory_per_device(steps[name, b]) for b in devices}
    tpu = mems.get("TPU")
    print(f"{name:<6}{format_bytes(mems['CPU'].argument):>14}{format_bytes(tpu.argument) if tpu else '-':>15}"
          f"{format_bytes(mems['CPU'].footprint):>15}{format_bytes(tpu.footprint) if tpu else '-':>15}")
    if tpu:
        assert tpu.footprint == tpu.peak
    if tpu and CPU:
        assert tpu.argument == mems["CPU"].argument  # the same shards: all shapes here are multiples of 8 x 128

if not ok:
    print(why)
else:
    small = {b: memory_per_device(jax.jit(lambda a: a * 2).lower(struct(m, (100, 100), P())).compile())
             for b, m in meshes.items()}
    print("f32[100,100] argument: CPU", small["CPU"].argument, "bytes, TPU", small["TPU"].argument, "bytes")
    assert small["TPU"].argument == 104 * 128 * 4  # stored as [104, 128]: padded up to 8 x 128 tiles
    if CPU:
        assert small["CPU"].argument == 100 * 100 * 4

# %% [markdown]
# The shards are the same bytes on both. A `(100, 100)` array shows the tiling: 40,000 bytes of data take
# 53,248 bytes of HBM. Choose dimensions that are multiples of 128 (and of 8 in the second-to-last) and
# nothing is wasted.
#
# ## 6. Will it fit? A 2.7-billion-parameter model on 64 chips
#
# Now the question you would ask before renting a slice. The model is notebook 11's decoder-only
# transformer at a real size, written compactly: `d_model` 2560, 32 layers of 20 heads, an MLP of 10240,
# a vocabulary of 32768, sequences of 2048 tokens, a global batch of 64 sequences. Weights and Adam's two
# moments are bf16 (6 bytes per parameter). The 32 layers' weights are stacked on a leading `layers` axis
# and run by `jax.lax.scan`, so the compiler compiles one layer, not 32. `jax.checkpoint`
# (rematerialisation, notebook 12) around the layer can keep only each layer's input for the backward
# pass and recompute the rest.

# %%
D_MODEL, NUM_LAYERS, NUM_HEADS, D_FF, VOCAB, SEQ, BATCH = 2560, 32, 20, 10240, 32768, 2048, 64
RESIDUAL = ("batch", None, None)  # the residual stream: split the batch only
part = nnx.with_partitioning  # an initializer whose arrays carry logical axis names
DENSE = nnx.initializers.lecun_normal()


def rms_norm(x, scale):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32**2, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype) * scale


class Layers(nnx.Module):
    """`num_layers` transformer blocks, their weights stacked on a leading 'layers' axis, run by scan."""

    def __init__(self, num_layers, d_model, num_heads, d_ff, *, rngs, remat=True):
        self.num_heads, self.remat = num_heads, remat

        def weight(names, shape, init=DENSE):
            return nnx.Param(part(init, ("layers", *names))(rngs.params(), (num_layers, *shape), jnp.bfloat16))

        self.norm1, self.norm2 = (weight(("embed",), (d_model,), nnx.initializers.ones_init()) for _ in range(2))
        self.query, self.key, self.value = (weight(("embed", "heads"), (d_model, d_model)) for _ in range(3))
        self.out = weight(("heads", "embed"), (d_model, d_model))
        self.up, self.down = weight(("embed", "mlp"), (d_model, d_ff)), weight(("mlp", "embed"), (d_ff, d_model))

    def __call__(self, x):
        def block(x, w):
            b, s, d = x.shape
            h = rms_norm(x, w["norm1"])
            q, k, v = (jnp.einsum("bsd,dk->bsk", h, w[n]).reshape(b, s, self.num_heads, -1)
                       for n in ("query", "key", "value"))
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(d // self.num_heads)
            scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)  # causal
            y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1).astype(x.dtype), v)
            x = with_logical_constraint(x + y.reshape(b, s, d) @ w["out"], RESIDUAL)
            x = x + jax.nn.gelu(rms_norm(x, w["norm2"]) @ w["up"]) @ w["down"]
            return with_logical_constraint(x, RESIDUAL), None

        names = ("norm1", "query", "key", "value", "out", "norm2", "up", "down")
        weights = {n: getattr(self, n)[...] for n in names}
        return jax.lax.scan(jax.checkpoint(block) if self.remat else block, x, weights)[0]


class Transformer(nnx.Module):
    def __init__(self, *, rngs, remat=True):
        self.tokens = nnx.Embed(VOCAB, D_MODEL, embedding_init=part(nnx.initializers.normal(0.02), ("vocab", "embed")),
                                param_dtype=jnp.bfloat16, dtype=jnp.bfloat16, rngs=rngs)
        self.layers = Layers(NUM_LAYERS, D_MODEL, NUM_HEADS, D_FF, rngs=rngs, remat=remat)
        self.norm = nnx.Param(part(nnx.initializers.ones_init(), ("embed",))(rngs.params(), (D_MODEL,), jnp.bfloat16))
        self.head = nnx.Linear(D_MODEL, VOCAB, use_bias=False, kernel_init=part(DENSE, ("embed", "vocab")),
                               param_dtype=jnp.bfloat16, dtype=jnp.bfloat16, rngs=rngs)

    def __call__(self, tokens):  # int32[batch, seq] -> logits bf16[batch, seq, vocab]
        x = self.layers(with_logical_constraint(self.tokens(tokens), RESIDUAL))
        return self.head(rms_norm(x, self.norm[...]))


def build(remat=True):
    with nnx.use_eager_sharding(False):
        model = Transformer(rngs=nnx.Rngs(0), remat=remat)
        return model, nnx.Optimizer(model, optax.adam(1e-4), wrt=nnx.Param)


_, abstract = nnx.split(nnx.eval_shape(build))  # shapes and dtypes only
n_params = sum(x.size for x in jax.tree.leaves(nnx.state(abstract[0], nnx.Param)))
state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract))
print(f"{n_params:,} parameters; parameters and Adam state: {format_bytes(state_bytes)}, "
      f"as {type(jax.tree.leaves(abstract)[0]).__name__}s")
n_matrices = NUM_LAYERS * (4 * D_MODEL**2 + 2 * D_MODEL * D_FF) + 2 * VOCAB * D_MODEL  # embedding, head included
n_scales = (2 * NUM_LAYERS + 1) * D_MODEL  # two norms per layer and a final one
assert n_params == n_matrices + n_scales == 2_684_520_960
assert state_bytes == 6 * n_params + 8  # 6 bytes per parameter, and two 4-byte step counters
assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract))  # nothing allocated

# %% [markdown]
# 15 GiB of state alone: data parallelism would put all of it on every chip, against 16 GiB of HBM. Each
# strategy is a table of rules from logical names to mesh axes (notebook 11). FSDP splits the `embed`
# dimension, which every weight has, over `data`; tensor parallelism splits `heads`, `mlp` and `vocab`
# over `model`.
#
# Asking the compiler takes one compile per row. A program that does not fit fails within seconds, with
# the compiler's own count of what it needs. One that fits is compiled to the end, and at its default
# effort the TPU compiler spends most of that time tuning machine code for speed, which a memory
# question does not need. So these compiles ask for the least effort, `jax_optimization_level` `'O0'`
# ([XLA's effort levels](https://openxla.org/xla/effort_levels)). Its memory figures can differ from a
# full-effort compile's by a few percent: trust a verdict with a wide margin, not the last digit.

# %%
RULES = {
    "DP": {"batch": "data"},
    "FSDP x TP": {"batch": "data", "embed": "data", "heads": "model", "mlp": "model", "vocab": "model"},
}
ROWS = [  # (strategy, mesh shape, rematerialise the layers?)
    ("DP", (64, 1), True),
    ("FSDP x TP", (16, 4), False),
    ("FSDP x TP", (16, 4), True),
]
OUT_OF_MEMORY = re.compile(r"required for HLO temporaries \(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)")


def train_step(state, tokens, rules, graphdef):
    with nnx.logical_axis_rules(rules):  # read while tracing
        model, optimizer = nnx.merge(graphdef, state)

        def loss_of(model):
            logits = model(tokens[:, :-1]).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = nnx.value_and_grad(loss_of)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss


def will_it_fit(strategy, shape, remat):
    """Compile one train step for the v5e:8x8 slice: (Memory, None) if it fits, else (None, GiB it needs)."""
    rules = tuple({"layers": None, "vocab": None, "embed": None, "heads": None, "mlp": None,
                   **RULES[strategy]}.items())
    gdef, state = nnx.split(nnx.eval_shape(lambda: build(remat)))
    mesh = jax.make_mesh(shape, ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=pod.devices)
    with nnx.logical_axis_rules(rules):
        shardings = nnx.get_named_sharding(state, mesh)
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings)
    tokens = struct(mesh, (BATCH, SEQ + 1), P("data", None), jnp.int32)
    step = jax.jit(partial(train_step, rules=rules, graphdef=gdef), donate_argnums=0,
                   out_shardings=(shardings, NamedSharding(mesh, P())))
    with jax.set_mesh(mesh):
        lowered = step.lower(state, tokens)
    try:
        with quiet():
            return memory_per_device(lowered.compile()), None
    except jax.errors.JaxRuntimeError as err:
        out_of_memory = OUT_OF_MEMORY.search(str(err))
        if out_of_memory is None:
            raise  # some other failure: show it
        needed, available = map(float, out_of_memory.groups())
        assert "RESOURCE_EXHAUSTED" in str(err) and available == 15.75  # what a v5e chip allows one program
        return None, needed


if not ok:
    print(why)
else:
    jax.config.update("jax_optimization_level", "O0")
    try:
        fits = {row: will_it_fit(*row) for row in ROWS}
    finally:
        jax.config.update("jax_optimization_level", "UNKNOWN")  # back to the default for anything later
    assert pod.devices[0].device_kind == HBM["v5e"][0]
    print(f"{'strategy':<11}{'mesh':<9}{'remat':<7}verdict (a v5e program may use 15.75 GiB per chip)")
    for (strategy, shape, remat), (mem, needed) in fits.items():
        verdict = f"fits: {format_bytes(mem.footprint)} per chip" if mem else f"does not fit: needs {needed:.2f} GiB"
        print(f"{strategy:<11}{shape!s:<9}{remat!s:<7}{verdict}")

# %% [markdown]
# The compiler's verdicts, asserted:
#
# - **DP** does not fit: every chip would hold the whole 15 GiB of state and the whole gradients. The
#   compiler's limit for one program on a v5e chip is 15.75 GiB of its 16 GiB.
# - **FSDP x TP** on `(16, 4)` splits every weight matrix 16 ways over `data` and 4 over `model`, 64 in
#   all, and fits with more than half the chip to spare (`footprint`, as the `Memory` class advises for
#   TPU).
#   **Without rematerialisation** the same layout does not fit: each layer's attention scores and MLP
#   activations, kept for the backward pass, for 32 layers, are more than the chip holds.

# %%
if ok:
    (dp, dp_needs), (no_remat, _), (fsdp_tp, _) = fits.values()
    assert dp is None and dp_needs > state_bytes / GiB  # more than the whole state on every chip
    assert no_remat is None and fsdp_tp is not None  # rematerialisation decides it on (16, 4)
    assert fsdp_tp.footprint < 15.75 * GiB / 2  # fits with room: a verdict no few-percent margin changes
    assert state_bytes / 64 < fsdp_tp.argument < state_bytes / 63  # each chip stores about 1/64 of the state
    for generation, (_, hbm) in HBM.items():
        print(f"{generation}: {hbm:>6} per chip; data parallel's {dp_needs:.1f} GiB",
              "would fit" if dp_needs < float(hbm.split()[0]) else "does not fit")

# %% [markdown]
# By the compiler's count, data parallelism would need a v6e or a v5p; on v5e, split the weights. Those
# last lines compare the v5e program's need with each generation's HBM, an estimate; to be sure, compile
# for that topology (`v6e:8x8`, `v5p:4x4x4`).
#
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** Case 1 of section 3 gathers each device's `(128, 1024)` block of `x` (float32) from the
# other devices. How many bytes is the gathered result per device, on the CPU and on the TPU?

# %%
from exercises import ex15_tpu_pods as ex

answer_1 = NOT_ANSWERED  # a pair (CPU bytes, TPU bytes)
ex.gather_bytes.check(answer_1);

# %% [markdown]
# **Exercise 2.** Under the `FSDP x TP` rules on the `(16, 4)` mesh, every weight matrix of section 6's
# model is split 64 ways and every norm scale (it has only an `embed` dimension) 16 ways. How many bytes of
# parameters and Adam moments (bf16, 2 bytes each) does each chip store? Leave out the two step counters.
# The model has 2,684,354,560 parameters in weight matrices (embedding and head included) and 166,400 in
# norm scales.

# %%
answer_2 = NOT_ANSWERED  # a whole number of bytes
ex.state_per_chip.check(answer_2);

# %% [markdown]
# **Exercise 3.** A model needs 40 GiB per chip under data parallelism, by the compiler's count on a v5e.
# Which of the three generations in section 1 have chips that could hold it? Answer with a set of names
# from `{'v5e', 'v6e', 'v5p'}`.

# %%
answer_3 = NOT_ANSWERED  # a set of generation names
ex.which_generations.check(answer_3);

# %% [markdown]
# ## Takeaways
# - `topologies.get_topology_desc(topology_name="v5e:8x8", platform="tpu")` describes a slice; its
#   devices give a `Mesh`, and `jax.ShapeDtypeStruct`s with shardings on it compile to the real TPU
#   program: `.as_text()`, `collectives`, `memory_per_device`. Nothing runs, nothing is allocated.
# - Build the mesh with `jax.make_mesh(..., devices=topo.devices)`: it lays mesh axes along board links;
#   a reshape of the device list does not.
# - The TPU and CPU compilers insert the same collectives over the same axes. On TPU, f32 matmul
#   operands are gathered in bf16 (half the bytes), the partitioner's all-reduce + slice becomes a fused
#   reduce-scatter, collectives may run asynchronously, and arrays are padded to 8 x 128 tiles.
# - HBM per chip is a published fact (16 GiB v5e, 32 GiB v6e, 95 GiB v5p); whether a program fits is the
#   compiler's verdict, which it gives in a second when the answer is no.
# - A 2.7B-parameter model does not fit 64 v5e chips under data parallelism; split over `(16, 4)` with
#   FSDP and TP it fits, if the layers are rematerialised.
#
# **Next:** [16 · Step time: compute, memory and communication](16_step_time.ipynb)
