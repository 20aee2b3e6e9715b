# %% [markdown]
# # 17 · Choosing a mesh shape
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/17_mesh_shape.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/17_mesh_shape.ipynb)
#
# Sixty-four devices can train one model as a `(64, 1)`, `(8, 8)` or `(1, 64)` mesh, and the choice
# decides whether each device holds the whole 42 MiB train state or 1/64 of it. It also decides what each
# device sends per step, and the layout that holds the least is not the one that sends the least.
#
# **You need:** notebooks 09 (a `data` x `model` mesh), 10 (FSDP), 12 (logical axis names and rule
# tables, and the transformer reused here), 13 (memory per device) and 15 (a step's estimated time), and
# the APIs `jax.ShapeDtypeStruct` and `jax.jit(...).lower(...).compile()`.
#
# You compile notebook 12's transformer for 64 devices under five layouts, read the tables, and rank the
# layouts by estimated step time.
#
# **You will learn**
# - how to compile a train step for 64 devices without allocating anything, and read its memory per
#   device and its collectives
# - how state, gradients and activations scale with the `data` and `model` axes, with and without FSDP
# - when the gradient sum can overlap the backward pass, and what a byte count leaves out
# - how to rank layouts by a step's estimated time, and what a small width hides
# - where the TPU compiler's program agrees with the CPU compiler's, and where it differs
# - what happens when an axis is wider than a dimension it splits.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title Setup: 64 devices (the same cell opens every notebook; notebook 00 explains it)
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
SETUP = setup_devices(64)
CPU, RTOL = SETUP.cpu, SETUP.rtol  # compiler facts marked CPU are the CPU compiler's; RTOL: float32 tolerance

# %%
import gzip
import json
import re

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from flax import nnx
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (NOT_ANSWERED, collectives, compile_with_log, draw_shardings, draw_timeline, estimate_step, format_bytes,
                   memory_per_device, quiet, schedule, shard_table, tpu_compiler_available, type_string)
from spmd_course.utils.drawing import device_color
from spmd_course.utils.published_rows import PROGRAMS

assert jax.device_count() == 64 == SETUP.count
MiB = 2**20

# %% [markdown]
# ## 1. The model
#
# The model is notebook 12's, imported rather than typed again: `src/spmd_course/models.py` is generated from
# the cells notebook 12 tags `save`. A decoder-only transformer whose parameters carry logical names
# (`'vocab'`, `'embed'`, `'heads'`, `'mlp'`) and whose residual stream is constrained to
# `('batch', None, None)`.

# %%
from spmd_course.models import MyTransformer

# %% [markdown]
# Now at a realistic width: `d_model = 512` with 8 heads of 64, `d_ff = 2048`, a vocabulary of 512,
# sequences of 32 and a global batch of 64, with one block (each block adds the same collectives).
# Every dimension a mesh axis splits is divisible by 64. `nnx.eval_shape` builds the model and its
# Adam state **abstractly**, as `jax.ShapeDtypeStruct`s: nothing here is allocated.

# %%
D_MODEL, NUM_LAYERS, NUM_HEADS, D_FF, VOCAB, SEQ, BATCH = 512, 1, 8, 2048, 512, 32, 64


def build():
    with nnx.use_eager_sharding(False):
        model = MyTransformer(D_MODEL, NUM_LAYERS, NUM_HEADS, D_FF, VOCAB, SEQ, rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)


graphdef, abstract = nnx.split(nnx.eval_shape(build))
leaves = jax.tree.leaves(abstract)
n_params = sum(x.size for x in jax.tree.leaves(abstract[0]))
n_split = NUM_LAYERS * (4 * D_MODEL**2 + 2 * D_MODEL * D_FF) + 2 * VOCAB * D_MODEL  # 'heads', 'mlp', 'vocab'
n_embed_only = (2 * NUM_LAYERS + 1) * 2 * D_MODEL + SEQ * D_MODEL  # layer norms, position table
print(f"{n_params:,} parameters ({format_bytes(4 * n_params)}); with Adam's two moments "
      f"{format_bytes(sum(x.size * x.dtype.itemsize for x in leaves))} of state, as {type(leaves[0]).__name__}s")
assert n_params == n_split + n_embed_only == 3_689_472
assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)  # nothing allocated

# %% [markdown]
# ## 2. Five layouts, two rule tables, compiled for 64 devices
#
# The layouts use two of notebook 12's rule tables:
#
# | rule table | `batch` | `heads`, `mlp`, `vocab` | `embed` |
# |---|---|---|---|
# | **2-D** | over `data` | over `model` | whole |
# | **FSDP x TP** | over `data` | over `model` | over `data` |
#
# FSDP x TP is the 2-D table plus `embed` over `data`, so every parameter is also split over the data
# axis. Here FSDP shares the batch's axis, `data`, as in notebook 13. (Notebooks 10 and 12 gave FSDP an
# axis of its own, `fsdp`.) Each layout is one rule table on one mesh shape:
#
# | layout | mesh `(data, model)` | rule table | what it is |
# |---|---|---|---|
# | data | `(64, 1)` | 2-D | pure data parallelism |
# | 2-D | `(8, 8)` | 2-D | data x tensor parallelism |
# | tensor | `(1, 64)` | 2-D | pure tensor parallelism |
# | FSDP | `(64, 1)` | FSDP x TP | pure FSDP |
# | FSDP x TP | `(8, 8)` | FSDP x TP | FSDP and tensor parallelism |
#
# For each layout the cell gives the abstract state its `NamedSharding`s and compiles the train step,
# which donates its state.

# %%
TWO_D = (("batch", "data"), ("vocab", "model"), ("embed", None), ("heads", "model"), ("mlp", "model"))
FSDP_TP = (("batch", "data"), ("vocab", "model"), ("embed", "data"), ("heads", "model"), ("mlp", "model"))
LAYOUTS = {  # name: (mesh shape (data, model), rule table)
    "data": ((64, 1), TWO_D),
    "2-D": ((8, 8), TWO_D),
    "tensor": ((1, 64), TWO_D),
    "FSDP": ((64, 1), FSDP_TP),
    "FSDP x TP": ((8, 8), FSDP_TP),
}
FAST_COMPILE = {"xla_backend_optimization_level": 0}  # never run: skip optimising machine code (notebook 12)


def make_step(rules):
    def train_step(state, tokens):
        with nnx.logical_axis_rules(rules):  # read while tracing (notebook 12)
            model, optimizer = nnx.merge(graphdef, state)

            def loss_fn(model):
                logits = model(tokens[:, :-1])
                return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

            loss, grads = nnx.value_and_grad(loss_fn)(model)
            optimizer.update(model, grads)
            return nnx.state((model, optimizer)), loss

    return train_step


def compile_for(shape, rules, devices=None, batch=BATCH):
    """The train step for one layout, compiled from ShapeDtypeStructs: (compiled, state structs)."""
    # devices=None: this machine's devices, otherwise the chips of a TPU topology, laid along its links (notebook 21)
    mesh = jax.make_mesh(shape, ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=devices)
    with nnx.logical_axis_rules(rules):
        shardings = nnx.get_named_sharding(abstract, mesh)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)
    tokens = jax.ShapeDtypeStruct((batch, SEQ + 1), jnp.int32, sharding=NamedSharding(mesh, P("data", None)))
    step = jax.jit(make_step(rules), donate_argnums=0, out_shardings=(shardings, NamedSharding(mesh, P())),
                   compiler_options=FAST_COMPILE)
    with jax.set_mesh(mesh):
        compiled, _ = compile_with_log(step.lower(state, tokens))  # keeps XLA's performance warnings out
    return compiled, state


compiled, states = {}, {}
for name, (shape, rules) in LAYOUTS.items():
    compiled[name], states[name] = compile_for(shape, rules)
print("compiled:", ", ".join(f"{name} {shape}" for name, (shape, _) in LAYOUTS.items()))

# %% [markdown]
# The MLP's first matrix (`f32[512, 2048]`, names `('embed', 'mlp')`) under each layout. On the
# `(8, 8)` mesh the 2-D table cuts it along `model` only, so each of its 8 blocks sits on the 8
# devices of a mesh column. FSDP x TP also cuts it along `data`, into 64 blocks, one per device.
# The two panels sit one above the other, so each block is wide enough for its label. The course's
# palette has 44 colours, so past 44 devices colours repeat: device 44 has device 0's colour, and
# the block's label, not its colour, names its device.

# %%
kernel = {name: states[name][0]["blocks"][0]["mlp"]["up"]["kernel"].get_value() for name in LAYOUTS}
fig = draw_shardings({name: kernel[name] for name in ("2-D", "FSDP x TP")}, ncols=1)
colours = [device_color(d) for d in range(64)]
assert len(set(colours)) == 44 and colours[44] == colours[0]  # 44 colours: devices 44-63 reuse those of 0-19
blocks = {}
for name in LAYOUTS:
    table = shard_table(kernel[name])
    n_blocks = len({row.index for row in table.rows})
    blocks[name] = (n_blocks, *table.shard_shapes)
    print(f"{name:<10} {type_string(kernel[name]):<26} {n_blocks:>2} blocks of {blocks[name][1]!s:<12} "
          f"{64 // n_blocks:>2} copies each")
assert blocks == {"data": (1, (512, 2048)), "2-D": (8, (512, 256)), "tensor": (64, (512, 32)),
                  "FSDP": (64, (8, 2048)), "FSDP x TP": (64, (64, 256))}
fig

# %% [markdown]
# ## 3. Memory per device
#
# Three quantities, each read from the compiled step or its shardings:
#
# | quantity | what it holds | read from |
# |---|---|---|
# | **state** | held between steps: parameters and Adam's two moments, 12 bytes per parameter | the shardings |
# | **temporaries** | needed only while the step runs: gradients, activations, and under FSDP the gathered weights | `memory_per_device(...).temp` |
# | **footprint** | live at once: arguments + outputs + temporaries, with the donated state counted once, because the new state overwrites it | `memory_per_device(...).footprint` |

# %%
def state_bytes(state):
    """Bytes of parameters and Adam state one device holds under a layout (from the shardings)."""
    return sum(max(shard_table(x).bytes_per_device.values()) for x in jax.tree.leaves(state))


memory = {name: memory_per_device(compiled[name]) for name in LAYOUTS}
held = {name: state_bytes(states[name]) for name in LAYOUTS}
footprint = {name: m.footprint for name, m in memory.items()}
print(f"{'layout':<11}{'mesh':<9}{'state':>11}{'temporaries':>13}{'footprint':>11}")
for name, (shape, _) in LAYOUTS.items():
    print(f"{name:<11}{shape!s:<9}{format_bytes(held[name]):>11}{format_bytes(memory[name].temp):>13}"
          f"{format_bytes(footprint[name]):>11}")

for name in ("data", "2-D", "tensor"):  # the 2-D table: only `model` splits the state
    assert held[name] == 12 * (n_split // LAYOUTS[name][0][1] + n_embed_only) + 8  # + two step counters
assert held["FSDP"] == 12 * n_params // 64 + 8  # every parameter has 'embed': 64 devices share all of it
assert held["FSDP x TP"] == 12 * (n_split // 64 + n_embed_only // 8) + 8

# %% [markdown]
# - Under the 2-D table only `model` divides the state: `data` repeats it. With FSDP the `data` axis
#   divides it too, so pure FSDP holds 1/64 of everything, the least of all.
# - On the CPU backend, FSDP's temporaries hold whole weights, gathered before use, and the whole
#   summed gradient: more than the whole parameters. Adding `model` (FSDP x TP) divides those as well:
#   the smallest CPU footprint here.
# - Pure tensor parallelism holds little state, but every device computes on all 64 sequences. On the
#   CPU backend those activations cost more than the state it saved.
#
# The temporaries and footprints are the CPU compiler's, at a toy size: section 5 shows that the TPU
# compiler assigns its buffers differently. Only the state column is the same on every backend.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §3: its buffers
print(f"{jax.default_backend().upper()} compiler: smallest footprint {min(footprint, key=footprint.get)}, largest "
      f"{max(footprint, key=footprint.get)}; FSDP temporaries {format_bytes(memory['FSDP'].temp)}, whole parameters "
      f"{format_bytes(4 * n_params)}")
if CPU:  # the CPU compiler's exact buffer sizes
    for name, (shape, _) in LAYOUTS.items():
        batch_bytes = (BATCH // shape[0]) * (SEQ + 1) * 4
        assert memory[name].argument == held[name] + batch_bytes and memory[name].alias == held[name]
    assert min(footprint, key=footprint.get) == "FSDP x TP"
    assert footprint["tensor"] > footprint["2-D"] and footprint["data"] == max(footprint.values())
    assert memory["FSDP"].temp > 4 * n_params  # whole gathered weights or whole gradients at some point

# %% [markdown]
# ## 4. Communication per step
#
# The chart's bars are grey and hatched, not coloured, because colour means a device in this course and
# these bars are layouts. The memory axis is logarithmic because the layouts' state spans more than
# ten times (pure FSDP holds a 64th of the whole), so small bars would vanish on a linear axis. The communication axis is linear because
# its bars span less than that, so their heights compare directly.

# %%
comm = {name: collectives(compiled[name]) for name in LAYOUTS}
print(f"{'layout':<11}{'collectives per step':<69}{'ring estimate':>14}")
for name in LAYOUTS:
    kinds = ", ".join(f"{n} {k}" for k, n in comm[name].counts.items() if n)
    print(f"{name:<11}{comm[name].count():>3}: {kinds:<64}{format_bytes(comm[name].estimated_bytes):>14}")
activations = {name: [op for op in comm[name].ops if op.shapes[0][:2] == (BATCH // shape[0], SEQ)]
               for name, (shape, _) in LAYOUTS.items()}  # [rows this device holds, seq, ...]

fig, (ax_mem, ax_comm) = plt.subplots(1, 2, figsize=(11, 3.2))
x = np.arange(len(LAYOUTS))
sent = {n: comm[n].estimated_bytes for n in LAYOUTS}
assert max(held.values()) / min(held.values()) > 10  # the state alone spans over 10x: a log axis
print(f"ring estimates span {max(sent.values()) / min(sent.values()):.1f}x, state {max(held.values()) / min(held.values()):.1f}x")
assert max(sent.values()) / min(sent.values()) < 10  # communication spans less: a linear axis
ax_mem.bar(x - 0.2, [held[n] / MiB for n in LAYOUTS], 0.4, label="state", color="0.35")
ax_mem.bar(x + 0.2, [footprint[n] / MiB for n in LAYOUTS], 0.4, label=f"footprint ({jax.default_backend()} compiler)",
           color="white", edgecolor="0.2", hatch="//")
ax_comm.bar(x, [sent[n] / MiB for n in LAYOUTS], 0.6, color="0.6", edgecolor="0.2")
ax_mem.set(ylabel="MiB per device (log scale: spans >10x)", title="memory per device", yscale="log")
ax_comm.set(ylabel="MiB sent per device per step (linear)", title="communication (ring estimate)")
for ax in (ax_mem, ax_comm):
    ax.set_xticks(x, list(LAYOUTS))
ax_mem.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=2, fontsize=8)  # below: off the bars
fig.tight_layout()
plt.close(fig)
fig

# %% [markdown]
# Three kinds of traffic:
#
# | traffic | collective | how much |
# |---|---|---|
# | **gradients** | summed over `data` | here one combined all-reduce per step, of every gradient the device holds |
# | **activations** | summed over `model`, several times per layer | in proportion to the rows each device holds, so pure tensor parallelism, which sums all 64 sequences, has the largest ring estimate |
# | **weights** | gathered over `data` under FSDP, before each use | FSDP's ring estimate is larger than data parallelism's, not smaller (notebook 11) |
#
# The bytes are ring-formula estimates, not measurements, and they leave out time. A gradient
# all-reduce needs only gradients already computed, so a program that sums each layer's gradients
# separately can overlap that with the rest of the backward pass. A tensor-parallel all-reduce sits
# between two matmuls, and the second waits for it, unless the compiler splits the matmul and sends one
# piece while it computes the next (collective matmul, which XLA can do on TPU). This program sums all
# gradients in **one** combined all-reduce, and in the CPU compiler's schedule it comes after the
# step's last matmul:

# %%
def axes_of(name):
    """The mesh axes and sizes of a layout, which `schedule` reads collectives' groups with."""
    return dict(zip(("data", "model"), LAYOUTS[name][0], strict=True))


steps = schedule(compiled["data"], axes_of("data"))  # matmuls and collectives, in the order the program runs
at = [i for i, s in enumerate(steps) if s.kind == "all-reduce"]
matmuls = [i for i, s in enumerate(steps) if s.kind == "matmul"]
print(f"{len(steps)} steps: {len(matmuls)} matmuls, the last at {max(matmuls)}; the all-reduce at {at}")

# %% [markdown]
# So this data-parallel step cannot overlap its gradient sum with the backward pass: the gradients
# computed last (the embeddings') are in the same all-reduce as all the others. For one that can, see
# notebook 13, section 3: a `scan` over layers sums each layer's gradient inside the backward loop.
#
# In the 2-D layout's program, activations are summed over `model` between the matmuls and the gradients
# over `data`:

# %%
steps_2d = schedule(compiled["2-D"], axes_of("2-D"))
matmuls_2d = [i for i, s in enumerate(steps_2d) if s.kind == "matmul"]
assert any(s.axes == ("model",) for s in steps_2d[matmuls_2d[0]:matmuls_2d[-1]])  # sums between matmuls
assert any("data" in s.axes for s in steps_2d if s.kind != "matmul")  # and the gradients' over data

# %% [markdown]
# Bytes are not seconds, so rank the five layouts by estimated step time. A ranking is worth only the
# program it times, and the programs above are poor ones to time for two reasons. They are the CPU
# compiler's, which a TPU does not run (section 5 shows how they differ). And at this toy width a matmul
# lasts a few microseconds, too short to hide any transfer.
#
# So the ranking reads TPU programs: this notebook's train step at a real width, `TPU_WIDTH` below
# (`d_model` 2048, 16 heads, `d_ff` 8192, a vocabulary of 32,768, 64 sequences of 512), compiled with its
# `compile_for` for a `v5e:8x8` slice at the compiler's **default effort**, the one a run gets. Each of
# those compiles takes one to two minutes of CPU, more than this page's budget. So the course compiled
# them once and keeps their text, `compiled.as_text()`, in `data/mesh_shape`, and
# `tests/test_17_mesh_shape.py` compiles them again and checks they are the same programs.
# `estimate_step` (notebook 15) reads that text as it reads a compiled program:
#
# | part of the program | how `estimate_step` times it |
# |---|---|
# | each op | at a v5e chip's published rates |
# | a matmul | by its FLOPs, or by the compiler's cycle count where that is longer |
# | a collective | over the links of its axis, and hidden only where the schedule runs it beside other work |

# %%
TPU_WIDTH = dict(D_MODEL=2048, NUM_LAYERS=1, NUM_HEADS=16, D_FF=8192, VOCAB=32768, SEQ=512, BATCH=64)
STORED = PROGRAMS.parent / "mesh_shape"  # data/mesh_shape: <layout>.hlo.gz

ok, why = tpu_compiler_available()
if ok:
    with quiet():  # libtpu's start-up lines
        topo = topologies.get_topology_desc(topology_name="v5e:8x8", platform="tpu")

    def program_of(name):
        """The stored text of a layout's TPU program (compiled at TPU_WIDTH, default effort)."""
        return gzip.decompress((STORED / f"{name.replace(' ', '_')}.hlo.gz").read_bytes()).decode()

    def mesh_of(name):
        """The mesh the layout's TPU program was compiled for: compile_for's, on the slice's 64 chips."""
        return jax.make_mesh(LAYOUTS[name][0], ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=topo.devices)

    step_time = {name: estimate_step(program_of(name), mesh_of(name)) for name in LAYOUTS}  # the chip: a v5e
    ranked = sorted(LAYOUTS, key=lambda n: step_time[n].seconds)
    print(f"TPU v5e:8x8, default effort, d_model {TPU_WIDTH['D_MODEL']}: estimated step per layout")
    print(f"{'layout':<11}{'step':>10}{'compute':>10}{'memory':>10}{'comm exposed':>14}{'comm hidden':>13}")
    for name in ranked:
        e = step_time[name]
        print(f"{name:<11}{e.seconds * 1e3:>8.2f}ms{e.compute * 1e3:>8.2f}ms{e.memory * 1e3:>8.2f}ms"
              f"{e.comm_exposed * 1e3:>12.2f}ms{e.comm_hidden * 1e3:>11.2f}ms")
    roofline = {name: estimate_step(program_of(name), mesh_of(name), use_cycles=False) for name in LAYOUTS}
    computes = [roofline[n].compute for n in LAYOUTS]
    assert max(computes) < 1.01 * min(computes)  # at peak rates every layout's matmuls take the same time
    assert ranked[0] == "2-D" and set(ranked[1:3]) == {"FSDP", "FSDP x TP"} and ranked[3:] == ["data", "tensor"]
    by_roofline = sorted(LAYOUTS, key=lambda n: roofline[n].seconds)  # each matmul at peak, not at its cycles
    assert by_roofline[0] == "2-D" and by_roofline[3:] == ["data", "tensor"]  # the same order without cycles
    assert all(step_time[n].comm_exposed > step_time[n].compute for n in LAYOUTS)  # every layout waits on transfers
    timeline = draw_timeline(step_time["2-D"], title="2-D layout, (8, 8) mesh, d_model 2048: one train step "
                             "on a TPU v5e-64, estimated op by op")
else:
    print(why)
    timeline = None
timeline

# %% [markdown]
# At this width every layout runs the same matmuls, divided by 64 (1.9 ms a step at the chip's peak),
# and every layout waits longer on its transfers than it computes: 512 tokens per chip is far below the
# C/W of about 2,000 that notebook 15 found FSDP needs to hide its gathers. So the ranking is the order of what each layout sends and over which links:
#
# | layout | what it waits on |
# |---|---|
# | 2-D, first | sums inside groups of 8 chips: activations over `model`, gradients over `data`, each along one torus axis |
# | FSDP and FSDP x TP, close behind | weights gathered and gradients reduce-scattered, part of it hidden behind the matmuls the compiler runs beside them |
# | data | every gradient all-reduced over all 64 chips, none of it hidden |
# | tensor, last | every sequence's activations summed over all 64 chips, several times per layer, between matmuls that wait for them |
#
# The first and the last two keep their places with each matmul timed at the roofline instead of the
# compiler's cycle counts, so they do not rest on the cost model's details. FSDP and FSDP x TP are within
# 10% of each other, too close to call. Change the width, the batch or the slice and the balance moves
# (more tokens per chip let FSDP hide its gathers), so rank your own run from a TPU compile at its sizes.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §4: its collectives
last = "after" if len(at) == 1 and max(matmuls) < at[0] else "not after"
print(f"{jax.default_backend().upper()} compiler: data parallel has {comm['data'].count()} collective(s), its "
      f"all-reduce {last} the last matmul; the largest ring estimate: {max(comm, key=lambda n: comm[n].estimated_bytes)}")
if CPU:
    assert comm["data"].counts["all-reduce"] == comm["data"].count() == 1  # every gradient in one sum
    assert not activations["data"]  # pure data parallelism moves no activations
    assert {op.kind for op in activations["2-D"]} == {"all-reduce"} and len(activations["tensor"]) >= 6
    assert comm["FSDP"].count("all-gather") >= 9 and comm["FSDP"].estimated_bytes > comm["data"].estimated_bytes
    assert max(comm, key=lambda name: comm[name].estimated_bytes) == "tensor"
    assert len(at) == 1 and max(matmuls) < at[0]  # it starts after the backward pass has computed everything
    sums = [(s.kind, s.axes) for s in steps_2d if s.kind != "matmul"]
    assert set(sums[:-1]) == {("all-reduce", ("model",))} and sums[-1] == ("all-reduce", ("data",)) == (
        steps_2d[-1].kind, steps_2d[-1].axes)  # 2-D: activations over model throughout, the gradients over data last

# %% [markdown]
# ## 5. The same step, compiled for a TPU v5e with 64 chips
#
# Everything above is the CPU compiler's program. JAX can compile for a TPU topology without a TPU, as
# notebook 13 showed (notebook 21 goes further). Here is the FSDP x TP step for a `v5e:8x8` slice beside
# the CPU's. The TPU program is this notebook's `compile_for` at its toy width, for the slice's 64 chips,
# at the compiler's default effort, with only its machine-code optimisation off (`FAST_COMPILE`). That
# compile takes about 4 s of CPU, so, like section 4's programs, the course compiled it once and keeps its
# text and its memory figures in `data/mesh_shape` (`tests/test_17_mesh_shape.py` compiles it again and
# checks both). The cell reads them, so it needs no libtpu. On TPU, `footprint` is each chip's HBM.
# What the compiler placed in on-chip VMEM (128 MiB on a v5e) is not in it, and at this toy size much of
# the program fits there.

# %%
def matrix_gathers(c):
    """(dtype, sorted shape) of every float matrix the all-gathers produce: the weights FSDP rebuilds.

    Each array of a combined gather is read with its own dtype; the sorted shape ignores a transposed layout."""
    return {(dtype, tuple(sorted(int(d) for d in dims.split(","))))
            for op in c.ops if op.kind == "all-gather"
            for dtype, dims in re.findall(r"(\w+)\[(\d+,\d+)\]", op.result_type) if dtype.startswith(("f", "bf"))}


TOY = json.loads((STORED / "toy_FSDP_x_TP.json").read_text())  # the TPU program's compile, and its memory
assert TOY["width"] == dict(D_MODEL=D_MODEL, NUM_LAYERS=NUM_LAYERS, NUM_HEADS=NUM_HEADS, D_FF=D_FF, VOCAB=VOCAB,
                            SEQ=SEQ, BATCH=BATCH) and TOY["compiler_effort"] == "default"  # this notebook's width
print(f"TPU v5e:8x8 program: stored, compiled by jax {TOY['jax']} with libtpu {TOY['libtpu']}")
cpu_memory = memory_per_device(compiled["FSDP x TP"])
tpu_text = gzip.decompress((STORED / "toy_FSDP_x_TP.hlo.gz").read_bytes()).decode()  # the program, as_text()
sides = {"CPU": compiled["FSDP x TP"], "TPU v5e:8x8": tpu_text}
mem = {"CPU": dict(argument=cpu_memory.argument, footprint=cpu_memory.footprint), "TPU v5e:8x8": TOY["memory"]}
col = {side: collectives(c) for side, c in sides.items()}
gathered = {side: matrix_gathers(col[side]) for side in sides}
kinds = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
print(f"{'FSDP x TP (8, 8)':<17}{'arguments':>11}{'footprint':>11}" + "".join(f"{k:>19}" for k in kinds)
      + "   matrices gathered as")
for side in sides:
    print(f"{side:<17}{format_bytes(mem[side]['argument']):>11}{format_bytes(mem[side]['footprint']):>11}"
          + "".join(f"{col[side].count(k):>19}" for k in kinds)
          + f"   {sorted({dtype for dtype, _ in gathered[side]})}")
for side in sides:  # where they agree: the residual stream, summed over `model`
    residual = [op for op in col[side].ops if op.kind == "all-reduce" and (8, SEQ, D_MODEL) in op.shapes]
    assert residual and {op.group_size for op in residual} == {8}
# where they differ
assert {d for d, _ in gathered["CPU"]} == {"f32"} and {d for d, _ in gathered["TPU v5e:8x8"]} == {"bf16"}
assert {s for _, s in gathered["TPU v5e:8x8"]} <= {s for _, s in gathered["CPU"]}  # the same weights
assert mem["TPU v5e:8x8"]["argument"] > mem["CPU"]["argument"]  # TPU tiles pad small shards
assert mem["TPU v5e:8x8"]["footprint"] < mem["CPU"]["footprint"]  # at this toy size: some buffers sit in VMEM

# %% [markdown]
# Both programs sum the residual stream over groups of 8 (the `model` axis) and gather the weight
# matrices over `data`. They differ in how they write it:
#
# | | CPU compiler | TPU compiler | why |
# |---|---|---|---|
# | **weight gathers** | f32 | bf16, half the bytes | TPU multiplies float32 matrices with bf16 operands by default, so its compiler converts each weight to bf16 *before* gathering it |
# | **argument bytes** | the shards' bytes | more, for the same layout | TPU stores an array in tiles of 8 x 128 over its last two dimensions, so a shard 64 wide, such as each chip's `(64, 64)` block of the attention matrices, takes the memory of 128 columns |
# | **gradient slices** | a full all-reduce and a slice (notebook 11) | can fuse such a pair into one reduce-scatter | each device needs only its slice of the summed gradients, and how many pairs the TPU compiler fuses depends on its version (its column above) |
# | **footprint** | the larger | the smaller, in HBM | a program this small keeps buffers in on-chip VMEM, and each compiler assigns its own temporaries |
#
# So plan a TPU job's memory from the TPU program at its real size (notebook 21).

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU and TPU compilers' exact figures, §5: reduce-scatters
print("reduce-scatters:", {side: col[side].count("reduce-scatter") for side in sides})
if CPU:
    assert col["CPU"].count("reduce-scatter") == 0  # the CPU compiler keeps all-reduce + slice

# %% [markdown]
# ## 6. A rule of thumb, from the table
#
# > **You will see this online:** "More data parallelism → better batch throughput; more model
# > parallelism → larger models fit."
#
# Half of that is a memory claim. The state is the same on every backend, but the footprints below
# are the CPU compiler's, at this toy size:

# %%
print(f"2-D table, model axis 1 -> 8 -> 64: footprint {format_bytes(footprint['data'])} -> "
      f"{format_bytes(footprint['2-D'])} -> {format_bytes(footprint['tensor'])}")
print(f"FSDP, data axis 64: state {format_bytes(held['FSDP'])} per device, "
      f"1/{round(held['data'] / held['FSDP'])} of data parallelism's {format_bytes(held['data'])}")
# more data parallelism, less memory, once parameters are sharded over it: the state from the shardings
# (layout arithmetic, the same on every backend; section 3 matched it to the compiled arguments on CPU)
assert 60 * held["FSDP"] < held["data"]

# %% [markdown]
# A data axis that also shards the parameters divides the state by 64, on any backend. On the CPU
# compiler, past the middle, more model parallelism needed *more* memory, not less, because every device
# of a wide `model` axis computes on the whole batch (the hidden cell below, "The CPU compiler's exact
# figures, §6", holds the numbers). The same order holds on a TPU at a real width, `d_model` 4096 on a
# `v5e:8x8` at O0 (`tests/test_tpu_side.py` compiles this notebook's step at that width and checks the
# order):
#
# | layout | HBM per chip |
# |---|---|
# | tensor | 3190 MiB |
# | 2-D | 1257 MiB |
# | FSDP x TP | 956 MiB |
#
# For your own model, read the order from a TPU compile at your sizes. Throughput cannot be measured on
# simulated devices, but it can be estimated from the compiled program, as section 4 did. There, on the
# TPU compiler's programs at `d_model` 2048, the layouts that sum inside groups of 8 came first and pure
# tensor parallelism last.
#
# What the tables support:
#
# 1. **Shard the state over the data axis first (FSDP).** It divides parameters and Adam state by every
#    device and keeps the batch split. It pays for that with weight gathers on top of the gradient sum.
# 2. **Add a `model` axis when FSDP alone stops helping**: when its temporaries (whole gathered
#    weights, whole gradients) dominate, or when the batch per device reaches its floor. Pure FSDP on 64
#    devices has one sequence per device and cannot run a smaller global batch at all (section 7). FSDP x
#    TP on `(8, 8)` has 8 sequences per device and the smallest CPU footprint here.
# 3. **Keep `model` small**, at most the number of heads: its all-reduces carry activations several
#    times per layer, between matmuls that wait for them unless a collective matmul hides them. Pure tensor
#    parallelism has the largest ring estimate.
# 4. **Among layouts that fit, prefer fewer collectives and fewer bytes.** Pure data parallelism has one
#    collective per step, but only fits when the whole state and a gradient fit on one device.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §6: more model parallelism, more memory
print(f"{jax.default_backend().upper()} compiler: footprint 2-D {format_bytes(footprint['2-D'])}, "
      f"tensor {format_bytes(footprint['tensor'])}")
if CPU:
    assert footprint["tensor"] > footprint["2-D"]  # more model parallelism, more memory

# %% [markdown]
# ## 7. When an axis is wider than what it splits
#
# **The batch.** A `(64, 1)` mesh needs at least 64 sequences per step, one per device. With a batch
# of 32 the step does not even lower: 32 rows cannot be cut into 64 equal blocks.

# %%
raised = []
try:
    with quiet():  # jax 0.12 prints a stray source line before raising
        compile_for(*LAYOUTS["FSDP"], batch=32)
except ValueError as err:  # jax's IndivisibleError is a ValueError
    raised.append(type(err).__name__)
    print(type(err).__name__ + ":", re.search(r"implies that array axis 0 is partitioned 64 times, but the "
                                              r"dimension size is 32", str(err)).group(0))
assert raised == ["IndivisibleError"]

# %% [markdown]
# **The heads.** With 8 heads, `model = 64` splits the 512 query/key/value columns 64 ways: each head
# is spread over 8 devices. Nothing fails (512 is divisible by 64), but attention scores sum over a
# head's 64 dimensions, so the compiler adds all-reduces of partial scores `[64, 1, 32, 32]` (64
# sequences, 1 head, 32 x 32 positions) over groups of 8. With `model <= 8` every device holds whole
# heads and none appear.

# %%
for name in ("2-D", "tensor"):
    d, m = LAYOUTS[name][0]
    scores = [op for op in comm[name].ops if op.shapes[0] == (BATCH // d, max(NUM_HEADS // m, 1), SEQ, SEQ)]
    print(f"{name:<7} {(d, m)!s:<8} heads per device: {NUM_HEADS / m:<6g} score all-reduces: {len(scores)}"
          + (f" over groups of {scores[0].group_size}" if scores else ""))
    assert bool(scores) == (m > NUM_HEADS)
    if scores:
        assert {op.group_size for op in scores} == {m // NUM_HEADS}

# %% [markdown]
# ## Takeaways
# - Compile for many devices without allocating: `nnx.eval_shape` for the state,
#   `jax.ShapeDtypeStruct(..., sharding=...)` for the inputs, `lower(...).compile()`, then read
#   `memory_per_device` and `collectives`.
# - Without FSDP only the `model` axis divides the state. With FSDP the `data` axis divides it too, by
#   every device. Activations shrink with `data` and grow back when `model` takes over the whole batch.
# - Footprints other than the state are the compiler's choices: the CPU's here, at a toy size. Shard
#   the state over `data` first, add `model` when gathered weights or the batch per device
#   become the limit, and keep `model` at most the number of heads.
# - Byte counts are ring estimates and leave out overlap. Here all gradients are summed in one
#   all-reduce after the last matmul. Tensor-parallel all-reduces sit between matmuls, so only a
#   compiler that splits the matmul (collective matmul, on TPU) can overlap them.
# - The TPU program has the same residual all-reduces, but gathers bf16 weights, pads arrays to its
#   tiles and may fuse reduce-scatters: read a TPU plan from a TPU compile.
# - An axis wider than what it splits fails loudly for the batch (`IndivisibleError`) and silently
#   costs extra collectives for attention heads.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1 (predict the state).** On a `(4, 16)` mesh, how many bytes of state (parameters and
# Adam's moments, plus the 8 bytes of step counters) does each device hold under the 2-D table, and
# under the FSDP x TP table? Use `n_split` and `n_embed_only` from section 1, and answer with a pair.

# %%
from spmd_course.exercises import ex17_mesh_shape as ex

answer_1 = NOT_ANSWERED  # (bytes under 2-D, bytes under FSDP x TP)
ex.state_bytes.check(answer_1);

# %% [markdown]
# **Exercise 2 (pick a layout).** Write the choice of section 6 as a function: `choose(table, budget)`
# gets a dict `{layout name: (footprint in bytes, collectives per step)}` and a budget in bytes per
# device, and returns the name of the layout that fits the budget (footprint at most `budget`) with the
# fewest collectives, the smaller footprint breaking a tie. It returns `None` when nothing fits. The
# checker tries it on tables of its own. Then try it on this notebook's, for example
# `choose({n: (footprint[n], comm[n].count()) for n in LAYOUTS}, 16 * MiB)`.

# %%
def choose(table, budget):
    ...  # your rule


answer_2 = NOT_ANSWERED  # set it to choose once you have written it
ex.choose_layout.check(answer_2);

# %% [markdown]
# **Exercise 3 (divisibility).** You change the model to 16 heads and the global batch to 96. Which of
# the 2-D mesh shapes `(64, 1)`, `(32, 2)`, `(16, 4)`, `(8, 8)`, `(1, 64)` still lower without an
# error, and which of those keep whole heads on every device? Answer with two lists of shapes:
# `(lowers, whole_heads)`.

# %%
answer_3 = NOT_ANSWERED  # ([shapes that lower], [shapes with whole heads per device])
ex.divisibility.check(answer_3);

# %% [markdown]
# **Next:** [18 · Pipeline parallelism: stages, micro-batches and the bubble](18_pipeline.ipynb)
