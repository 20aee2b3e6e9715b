# %% [markdown]
# # 13 · Training memory: donation, remat, scan, mixed precision and ZeRO
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/13_training_memory.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/13_training_memory.ipynb)
#
# Adam training stores 16 bytes per parameter on every device, and mixed precision with float32 master
# weights stores no fewer. Whether a model fits then depends on a second copy of the state, on which
# activations each layer keeps, and on which of the 16 bytes are split across devices.
#
# **You need:** notebooks 07 (a train step with Flax NNX and Optax, donation) and 10 (FSDP: weights split
# over `data`, gathered per layer); `donate_argnums`, `NamedSharding`, `jax.lax.with_sharding_constraint`.
#
# You train a stack of residual blocks on 8 devices, every variant to one device's losses, and compile a
# wide copy of its step for this backend and for a TPU v5e.
#
# **You will learn**
# - what a step without `donate_argnums` holds: two copies of the state;
# - what `nnx.remat` saves per layer at a realistic size, what offloading to host memory saves, and why
#   layers are scanned, not unrolled;
# - ZeRO-1, 2 and 3 as three sharding rules, with the memory and collectives of each compiled step;
# - what mixed precision with float32 master weights stores per parameter (no less than float32);
# - why every TPU memory figure must name the compiler effort that produced it.

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
import io
import json
import re
import time
from contextlib import redirect_stdout
from types import SimpleNamespace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals
from jax.experimental import topologies
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import (NOT_ANSWERED, assert_close, collectives, compile_effort, draw_memory, format_bytes, memory_per_device,
                   quiet, shard_table, tpu_compiler_available, type_string)

# %% [markdown]
# ## 1. A stack of identical blocks, created sharded
#
# The model is `L` residual blocks, `x + relu(x @ up) @ down`. `nnx.vmap` creates the `L` blocks at once,
# so each weight is **stacked** on a leading layer axis: `up` is one `(L, width, hidden)` array. The
# model's options choose how the blocks run:
#
# | option | what it does | section |
# |---|---|---|
# | default | `nnx.scan` runs the blocks as a loop over the layer axis | 3 |
# | `scan=False` | unrolls that loop into `L` copies of the block | 3 |
# | `policy` | wraps the block in `nnx.remat` with that checkpoint policy (`None`: no remat) | 3 |
#
# The loss is the mean squared error to a fixed random linear map, trained with Adam at a learning rate
# of 1e-3. The gradient is `jax.value_and_grad` of the parameters split off the model, for a reason
# section 3 shows: `nnx.value_and_grad` would copy weights inside the loop.
#
# The model comes in two sizes. Width 128 and hidden size 512 train on 8 CPU devices, so every variant
# can be checked against a reference. A **wide** model (width 1024, hidden 8192, so one layer's kernels
# are 64 MiB) is only compiled, never allocated, so that memory is measured at a size that matters.

# %%
D, H = 128, 512  # width, hidden size of the model that trains
WIDE = dict(width=1024, hidden=8192)  # compiled only, never allocated
TOKENS = 8 * 1024  # the wide model's batch: 1,024 tokens per device


class Block(nnx.Module):
    def __init__(self, width: int, hidden: int, rngs: nnx.Rngs):
        self.up = nnx.Linear(width, hidden, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(hidden, width, use_bias=False, kernel_init=nnx.initializers.normal(0.02), rngs=rngs)

    def __call__(self, x):
        return x + self.down(jax.nn.relu(self.up(x)))


class Stack(nnx.Module):
    def __init__(self, layers: int, *, width=D, hidden=H, scan=True, policy=jax.checkpoint_policies.nothing_saveable,
                 rngs: nnx.Rngs):
        @nnx.split_rngs(splits=layers)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return Block(width, hidden, rngs)

        self.blocks = make(rngs)  # every weight gets a leading layer axis
        self.scan, self.policy = scan, policy

    def __call__(self, x):
        def body(x, block):
            return block(x)

        if self.policy is not None:
            body = nnx.remat(body, policy=self.policy)
        loop = nnx.scan(body, in_axes=(nnx.Carry, 0), out_axes=nnx.Carry, unroll=1 if self.scan else True)
        return loop(x, self.blocks)


def create(layers=2, **options):
    model = Stack(layers, rngs=nnx.Rngs(0), **options)
    return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)


def loss_fn(model, x, y):
    return jnp.mean((model(x).astype(jnp.float32) - y) ** 2)


def param_grad(model, x, y):
    """The loss and its gradient with respect to the model's parameters (an nnx.State, as the optimizer wants)."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return jax.value_and_grad(lambda p: loss_fn(nnx.merge(graphdef, p, rest), x, y))(params)


def train_step(model, optimizer, x, y):
    loss, grads = param_grad(model, x, y)
    optimizer.update(model, grads)
    return loss


rng = np.random.default_rng(0)  # the data, made on the host
x = rng.standard_normal((512, D), dtype=np.float32)
y = x @ rng.standard_normal((D, D), dtype=np.float32) / np.float32(D**0.5)

# %% [markdown]
# Where each array lives is a rule, as in notebook 10. A stacked kernel (the only 3-D leaves) is either
# split on its rows over the mesh axis `data`, `P(None, 'data')`, or kept whole, and the step counters
# are whole. Splitting the rows rather than the layer axis gives every device a slice of every layer, so
# each layer can be gathered when the loop reaches it.
#
# The three ZeRO stages (section 4) are three choices of what to split, and ZeRO-3 splits everything,
# which is FSDP. The axis is called `data` here, not `fsdp` as in notebooks 10 and 12, because ZeRO
# splits the state over the same devices that split the batch: one axis has both roles, and from here
# on (notebooks 13 to 17 and 21) `data` names it. `make_step` pins the gradients and the new state to their
# stage's layout with `with_sharding_constraint`, and donates the state.

# %%
ZERO = {  # what each stage splits over 'data': (parameters, gradients, optimizer state)
    "ZeRO-1": (False, False, True),
    "ZeRO-2": (False, True, True),
    "ZeRO-3": (True, True, True),
}


def layout(split, mesh, tree):
    """Shardings for every leaf of `tree`: a stacked kernel (layers, rows, cols) split on its rows, or whole."""
    def where(leaf):
        return NamedSharding(mesh, P(None, "data") if split and leaf.ndim == 3 else P())

    return jax.tree.map(where, tree)


def pin(obj, split, mesh):
    """Inside jit: constrain an NNX object's state to its layout."""
    state = nnx.state(obj)
    nnx.update(obj, jax.lax.with_sharding_constraint(state, layout(split, mesh, state)))


def make_step(stage, mesh, donate=True, grad=param_grad):
    split_params, split_grads, split_opt = ZERO[stage]

    def step(model, optimizer, x, y):
        loss, grads = grad(model, x, y)
        grads = jax.lax.with_sharding_constraint(grads, layout(split_grads, mesh, grads))
        optimizer.update(model, grads)
        pin(model, split_params, mesh)
        pin(optimizer, split_opt, mesh)
        return loss

    return nnx.jit(step, donate_argnums=(0, 1) if donate else ())


def create_sharded(stage, mesh, make=create):
    """A compiled constructor: `make(*args)`, its state pinned to the stage's layout."""
    split_params, _, split_opt = ZERO[stage]

    @nnx.jit
    def build(*args):
        model, optimizer = make(*args)
        pin(model, split_params, mesh)
        pin(optimizer, split_opt, mesh)
        return model, optimizer

    return build


def abstract(stage, mesh, make=create, **options):
    """The model and optimizer as shapes with shardings, to compile a step for: nothing is allocated."""
    split_params, _, split_opt = ZERO[stage]
    model, optimizer = nnx.eval_shape(lambda: make(**options))
    for obj, split in ((model, split_params), (optimizer, split_opt)):
        state = nnx.state(obj)
        nnx.update(obj, jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
                                     state, layout(split, mesh, state)))
    return model, optimizer

# %% [markdown]
# The wide model is compiled for this backend's 8 devices and for a TPU v5e of 8 chips (`v5e:2x4`).
# That needs only the TPU compiler, libtpu. A mesh of the topology's chips replaces `jax.devices()`, and
# a step lowered from `jax.ShapeDtypeStruct`s compiles to a TPU program that can be read but not run
# (notebook 21 shows more).
#
# **Which effort the TPU figures come from.** The TPU compiler has effort levels. Its default, the one a
# training run gets, takes 10 to 15 s of CPU time per program here, and this notebook reads a dozen TPU
# programs. So the wide TPU programs below use the least effort, `O0`, and every TPU figure is labelled
# "O0". This changes the figures, not only the compile time, because at O0 the compiler puts nothing in
# VMEM, the chip's 128 MiB of fast on-chip memory. Every buffer then counts against HBM, so O0 figures are
# upper bounds on what the default effort needs. How far above depends on the program:
#
# | section 4's step | HBM at O0 | HBM at the default effort | O0 / default |
# |---|---|---|---|
# | ZeRO-1 | 440.1 MiB | 412.8 MiB (110 MiB more in VMEM) | 1.07 |
# | ZeRO-2 | 328.1 MiB | 248.6 MiB (106 MiB more in VMEM) | 1.32 |
# | ZeRO-3 | 224.1 MiB | 80.7 MiB (112 MiB more in VMEM) | 2.78 |
#
# (The default-effort column is compiled and asserted by `tests/test_13_effort.py`, which reads this
# notebook's own steps: too slow to repeat here.) The comparisons this notebook draws (which variant
# needs more) hold at both efforts; the sizes do not carry over. On a TPU, `footprint` is the chip's HBM:
# the bytes the compiler allocated (jax 0.12), or on jax 0.10 an estimate from arguments, outputs and
# temporaries, which runs up to 32% high for these steps. The TPU figures below are jax 0.12's.
#
# **The TPU figures are stored.** Even at O0, the eleven wide TPU programs below take about 12 s to
# compile here, nearly what this whole notebook may take. So the course compiled them once, with this
# notebook's own code (`TPU_PROGRAMS`, `compile_wide` and `figures` below), and stored what the notebook
# reads from each: its memory per device, its host memory, its matrix products and its collectives
# (`data/training_memory/tpu_o0.json`). The notebook asserts its lessons on those figures. A slow test,
# `tests/test_13_training_memory.py`, compiles the same programs again on every JAX line, asserts the
# same lessons on the fresh programs, and checks that the stored figures match them to the byte on the
# line that stored them (jax 0.12, whose libtpu reports the HBM it allocates). The CPU programs are
# compiled here, live, and section 5's small TPU programs too.

# %%
ok, why = tpu_compiler_available()
print(why)
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
targets = {jax.default_backend().upper(): mesh}
if ok:
    with quiet():  # libtpu's start-up warnings
        topo = topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu")
    targets["TPU v5e"] = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,), devices=topo.devices)


def lower_wide(stage, target, layers=2, donate=True, grad=param_grad, make=create, dtype=jnp.float32, **options):
    """The stage's step for the wide model, lowered for a target from abstract state (nothing allocated)."""
    where = targets[target]
    data = NamedSharding(where, P("data"))
    x_wide, y_wide = (jax.ShapeDtypeStruct((TOKENS, WIDE["width"]), t, sharding=data) for t in (dtype, jnp.float32))
    return make_step(stage, where, donate, grad).lower(
        *abstract(stage, where, make, layers=layers, **WIDE, **options), x_wide, y_wide)


def at_effort(target):
    """The compiler effort used for a target: O0 on a TPU (see above), the default elsewhere."""
    return "O0" if target.startswith("TPU") else "UNKNOWN"


def compile_wide(stage, target, *args, **options):
    """`lower_wide(...)` compiled at the target's effort; also its compile seconds."""
    lowered = lower_wide(stage, target, *args, **options)
    start = time.perf_counter()
    with compile_effort(at_effort(target)), quiet():
        return lowered.compile(), time.perf_counter() - start


def named(target):
    """A target's name with the effort its figures come from."""
    return f"{target} O0" if at_effort(target) == "O0" else target


def hbm_of(target, variant, layers=2):
    """Memory per device (HBM on a TPU) of a wide program compiled below (for the TPU: its stored figure)."""
    return wide[target, variant, layers]["footprint"]


def stored(tree):
    """Bytes per device of the arrays (or abstract arrays) in `tree`, from their shardings."""
    return sum(np.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


MATMUL = re.compile(r" (?:dot|convolution)\(|custom_call_target=\"[^\"]*gemm")  # CPU and TPU; GPU libraries
HOST_BUFFER = re.compile(r"f32\[2,1024,8192\]\{[^}]*S\(5\)\}")  # an `x @ up` residual in host memory (space 5)
OP_FIELDS = ("kind", "result_type", "result_bytes", "shapes", "in_loop", "trips")


def figures(compiled):
    """What sections 2-4 read from a wide program: memory per device, host memory, matmuls and collectives."""
    m, text = memory_per_device(compiled), compiled.as_text()
    return dict(argument=m.argument, output=m.output, alias=m.alias, temp=m.temp, footprint=m.footprint,
                allocated=m.allocated is not None, host=compiled.memory_analysis().host_temp_size_in_bytes,
                matmuls=len(MATMUL.findall(text)), host_buffers=sorted(set(HOST_BUFFER.findall(text))),
                collectives=[{f: getattr(op, f) for f in OP_FIELDS} for op in collectives(compiled).ops])


def ops_of(target, variant, layers=2):
    """The collectives of a wide program, from its figures: kind, result type and bytes, shapes, loop, trips."""
    return [SimpleNamespace(**{**op, "shapes": tuple(map(tuple, op["shapes"]))})
            for op in wide[target, variant, layers]["collectives"]]


VARIANTS = {"unrolled": dict(scan=False, policy=None), "scan": dict(policy=None), "scan + remat": {}}  # section 3
OFFLOAD = jax.checkpoint_policies.offload_dot_with_no_batch_dims(offload_src="device", offload_dst="pinned_host")
TPU_PROGRAMS = {  # (variant, layers) -> (stage, options): the wide TPU programs whose figures are stored
    ("ZeRO-3", 2): ("ZeRO-3", {}),  # donated, scanned, `nothing_saveable` remat: the default step
    ("not donated", 2): ("ZeRO-3", dict(donate=False)),
    **{(name, layers): ("ZeRO-3", options) for name, options in VARIANTS.items() for layers in (2, 4)
       if (name, layers) != ("scan + remat", 2)},
    ("dots_saveable", 2): ("ZeRO-3", dict(policy=jax.checkpoint_policies.dots_saveable)),
    ("offloaded dots", 2): ("ZeRO-3", dict(policy=OFFLOAD)),
    ("ZeRO-1", 2): ("ZeRO-1", {}),
    ("ZeRO-2", 2): ("ZeRO-2", {}),
}
TPU_STORED = json.loads((launch.ROOT / "data" / "training_memory" / "tpu_o0.json").read_text())
assert (TPU_STORED["tokens"], TPU_STORED["wide"], TPU_STORED["effort"]) == (TOKENS, WIDE, "O0")
assert {(v, n) for v, n, _ in TPU_STORED["programs"]} == set(TPU_PROGRAMS)  # one stored entry per program
live = jax.default_backend().upper()
TARGETS = (live, "TPU v5e")
print(f"TPU v5e figures: stored, {TPU_STORED['topology']} at O0 (jax {TPU_STORED['jax']}, "
      f"libtpu {TPU_STORED['libtpu']}); {live} programs: compiled here")

# %% [markdown]
# Create the FSDP (ZeRO-3) state on 8 devices with the compiled constructor of notebook 10, and, as the
# reference, a copy of the same initial state on one device, trained 5 steps with the plain step:

# %%
batch = NamedSharding(mesh, P("data"))
x_d, y_d = jax.device_put(x, batch), jax.device_put(y, batch)

build = create_sharded("ZeRO-3", mesh)
init = memory_per_device(build.lower().compile())
model, optimizer = build()
graphdef, state = nnx.split((model, optimizer))
# A copy on one device. device_put alone would hand back device 0's buffer of each replicated array (the step
# counters), and donating it to the reference step would delete the FSDP state's counter too.
ref_model, ref_optimizer = nnx.merge(graphdef, jax.tree.map(lambda a: jnp.copy(jax.device_put(a, jax.devices()[0])),
                                                            state))

n_params = sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
print("parameters:", n_params, "| init program,", init)
print("up kernel:", type_string(model.blocks.up.kernel[...]), " Adam mu:",
      type_string(optimizer.opt_state[0].mu["blocks"]["up"]["kernel"][...]))
assert init.output + init.temp < 3 * 4 * n_params / 4  # no device ever held it all
assert stored(state) == 3 * 4 * n_params // 8 + 8  # parameters, mu, nu (4 bytes each), split 8 ways; 2 counters

ref_step = nnx.jit(train_step, donate_argnums=(0, 1))
ref_losses = [float(ref_step(ref_model, ref_optimizer, x, y)) for _ in range(5)]
print("reference losses:", np.round(ref_losses, 5))
assert ref_losses[-1] < 0.8 * ref_losses[0]

# %% [markdown]
# ## 2. Donation: the step holds one copy of the state, not two
#
# Every step in this notebook donates the model and optimizer (`donate_argnums=(0, 1)`, notebook 07): the
# new state is written into the old state's buffers. Compile the wide 2-layer FSDP step with and without
# it (the TPU's figures come from the stored file, section 1). `memory_per_device` reads, per device, the
# arguments, outputs, temporaries, and the output bytes that alias (reuse) an argument.

# %%
wide = {("TPU v5e", v, n): entry for v, n, entry in TPU_STORED["programs"]}  # (target, variant, layers) -> figures
seconds = {("TPU v5e", v, n): s for v, n, s in TPU_STORED["compile_seconds"]}  # CPU seconds to compile each
programs = {}  # (variant, layers) -> this backend's compiled program, for what sections 3 and 4 read from its text


def compile_live(variant, stage="ZeRO-3", layers=2, **options):
    """Compile a wide program for this backend, keep it, and record its figures and compile seconds."""
    programs[variant, layers], seconds[live, variant, layers] = compile_wide(stage, live, layers, **options)
    wide[live, variant, layers] = figures(programs[variant, layers])


compile_live("ZeRO-3")
compile_live("not donated", donate=False)
wide_state = stored(abstract("ZeRO-3", mesh, layers=2, **WIDE))

print(f"state: {format_bytes(wide_state)} per device")
print(f"{'':<24}{'arguments':>11}{'outputs':>11}{'aliased':>11}{'temporaries':>13}{'footprint':>11}")
saved_by_donation = {}
for target in TARGETS:
    donated, plain = (SimpleNamespace(**wide[target, v, 2]) for v in ("ZeRO-3", "not donated"))
    for name, m in (("donated", donated), ("not donated", plain)):
        print(f"{named(target) + ' ' + name:<24}{format_bytes(m.argument):>11}{format_bytes(m.output):>11}"
              f"{format_bytes(m.alias):>11}{format_bytes(m.temp):>13}{format_bytes(m.footprint):>11}")
    assert abs(donated.alias - wide_state) < 2**12  # the whole state updated in place (TPU pads scalars)
    assert plain.alias == 0  # no output reuses an argument: the new state in buffers of its own
    saved_by_donation[target] = plain.footprint - donated.footprint
print("donation saves:", {named(t): format_bytes(b) for t, b in saved_by_donation.items()})

# %% [markdown]
# `footprint` is the memory the program needs per device: on the CPU backend arguments + outputs +
# temporaries - aliased, an upper bound, and on the TPU the HBM the compiler allocated (at O0).
#
# Donated, the outputs alias the whole 48 MiB state, because the new state is written over the old.
# Without donation nothing aliases: the new state gets buffers of its own while the caller keeps the
# old one, so two copies exist at the step's end. What donation saves in total depends on how the
# compiler spends the freed space on temporaries, so each compiler's exact saving is in the hidden cell
# below ("The CPU and TPU compilers' exact figures, §2").

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU and TPU compilers' exact figures, §2: what donation saves
if CPU:  # the CPU compiler spends part of the saving on temporaries
    assert 0 < saved_by_donation["CPU"] < wide_state / 2
assert wide["TPU v5e", "ZeRO-3", 2]["allocated"]  # the stored figures are the HBM the compiler allocated
# jax 0.12's TPU compiler (libtpu 0.0.50) saves a whole copy of the state in HBM. jax 0.10's (libtpu 0.0.42)
# spends most of the freed copy on temporaries, as the CPU compiler does (tests/test_13_training_memory.py)
assert abs(saved_by_donation["TPU v5e"] - wide_state) < 2**12
note = {"CPU": "the CPU compiler spends the rest on temporaries", "TPU v5e": "a whole copy"}
print("\n".join(f"{named(t)}: donation saves {format_bytes(b)} of the {format_bytes(wide_state)} state "
                f"({note.get(t, '')})" for t, b in saved_by_donation.items()))

# %% [markdown]
# ## 3. Scan and remat: what each layer adds
#
# Notebook 10 found that FSDP gathers every weight whole on each device. How much of that, and of the
# activations, stays live depends on what the backward pass needs. First, what one block saves for it,
# with and without `jax.checkpoint` (remat) and its policies (`print_saved_residuals` lists the saved
# arrays):

# %%
def block_loss(x, up, down):
    return jnp.sum(x + jax.nn.relu(x @ up) @ down)


saved = {}
for name, policy in (("no remat", None), ("dots_saveable", jax.checkpoint_policies.dots_saveable),
                     ("nothing_saveable", jax.checkpoint_policies.nothing_saveable)):
    f = block_loss if policy is None else jax.checkpoint(block_loss, policy=policy)
    text = io.StringIO()
    with redirect_stdout(text):
        print_saved_residuals(f, x[:64], ref_model.blocks.up.kernel[0], ref_model.blocks.down.kernel[0])
    saved[name] = [re.sub(r" from .*| output of .*", "", line) + (" (input)" if " argument " in line else "")
                   for line in text.getvalue().splitlines()]
    print(f"{name:<17}", ", ".join(saved[name]))
assert saved["nothing_saveable"] == ["f32[64,128] (input)", "f32[128,512] (input)", "f32[512,128] (input)"]
assert saved["dots_saveable"] == saved["nothing_saveable"] + ["f32[64,512]"]  # x @ up, before the relu
assert len(saved["no remat"]) == 6  # relu's output, its mask, and a broadcast, each [64, 512]
assert saved["no remat"][:3] == saved["nothing_saveable"] and all("[64,512]" in s for s in saved["no remat"][3:])

# %% [markdown]
# Every policy saves the block's inputs; inside a scan the weights saved are the stored slices. Without
# remat the block also keeps three `[tokens, hidden]` activations; `dots_saveable` keeps one, the
# matmul's output, and recomputes the relu; `nothing_saveable` keeps none and recomputes the whole block
# in the backward pass.
#
# Now compile the wide FSDP step for 2 and 4 layers: unrolled, scanned, and scanned with
# `nothing_saveable` remat (the `Stack` default). The table gives each program's memory per device, what
# each layer adds, its matrix products and its compile time (for the TPU, the stored figures and the
# seconds measured when they were stored).

# %%
layer_bytes = 2 * WIDE["width"] * WIDE["hidden"] * 4  # one block's two kernels, whole, float32
activation = TOKENS // 8 * WIDE["hidden"] * 4  # one [tokens, hidden] float32 activation per device
for name, options in VARIANTS.items():  # the TPU's figures for these are stored (see section 1)
    for layers in (2, 4):
        if (name, layers) != ("scan + remat", 2):
            compile_live(name, "ZeRO-3", layers, **options)
for target in TARGETS:
    wide[target, "scan + remat", 2], seconds[target, "scan + remat", 2] = wide[target, "ZeRO-3", 2], seconds[
        target, "ZeRO-3", 2]
programs["scan + remat", 2] = programs["ZeRO-3", 2]

print(f"one layer's kernels: {format_bytes(layer_bytes)} whole, {format_bytes(layer_bytes / 8)} per device")
growth, matmuls = {}, {}
for target in TARGETS:
    print(f"{named(target):<14}{'L = 2':>11}{'L = 4':>11}{'per layer':>11}{'matmuls':>10}{'compile s':>12}")
    for name in VARIANTS:
        hbm = [wide[target, name, layers]["footprint"] for layers in (2, 4)]
        s2, s4 = (seconds[target, name, layers] for layers in (2, 4))
        growth[target, name] = (hbm[1] - hbm[0]) / 2
        matmuls[target, name] = [wide[target, name, layers]["matmuls"] for layers in (2, 4)]
        print(f"{name:<14}{format_bytes(hbm[0]):>11}{format_bytes(hbm[1]):>11}{format_bytes(growth[target, name]):>11}"
              f"{'{} → {}'.format(*matmuls[target, name]):>10}{s2:>6.1f} {s4:>5.1f}")
    assert growth[target, "scan + remat"] + activation / 2 <= growth[target, "scan"] <= growth[target, "unrolled"]
    assert matmuls[target, "scan"][0] == matmuls[target, "scan"][1]  # one loop body for every depth
    assert matmuls[target, "unrolled"][1] >= matmuls[target, "unrolled"][0] + 2 * 4  # 2 forward, 2+ backward
print("(the TPU's compile seconds are those measured when its figures were stored)")

# %% [markdown]
# Remat pays at this size. With `nothing_saveable`, each layer needs tens of MiB less per device on both
# targets (at least half a `[1024, 8192]` activation), and the price is one more forward pass, because
# the backward pass recomputes what was not saved. What each layer still adds is its share of the
# parameters and Adam's moments, its gradient slice, and its saved input.
#
# Unrolling costs memory on the CPU backend: a whole layer's gathered kernels (64 MiB) per layer more
# than the scan, as the hidden cell at the end of this section shows. The TPU compiler frees them sooner,
# so on a TPU the case for scanning is the program rather than memory. A scan has one loop body for every
# depth, whereas the unrolled program repeats the block's matmuls once per layer, so it grows (and takes
# longer to compile) with depth.
#
# **Host offload.** A TPU host has memory of its own. A remat policy can copy what it saves there
# (`offload_dst="pinned_host"`) and fetch it back for the backward pass: `offload_dot_with_no_batch_dims`
# offloads what `dots_saveable` keeps; `save_and_offload_only_these_names` offloads arrays named with
# `checkpoint_name` (MaxText's remat policies). The wide step for the TPU, with three policies (the
# `offload` policy is `TPU_PROGRAMS`' `OFFLOAD`; the figures are stored):

# %%
wide["TPU v5e", "nothing_saveable", 2] = wide["TPU v5e", "ZeRO-3", 2]
on_host = {}
for name in ("nothing_saveable", "dots_saveable", "offloaded dots"):
    on_host[name] = wide["TPU v5e", name, 2]["host"]
    print(f"{name:<17} HBM at O0 {format_bytes(hbm_of('TPU v5e', name)):>10}, host {format_bytes(on_host[name]):>9}")
host_buffers = wide["TPU v5e", "offloaded dots", 2]["host_buffers"]  # HOST_BUFFER: f32[2,1024,8192] in space 5
print("saved on the host:", host_buffers)
assert host_buffers and on_host["offloaded dots"] == 2 * activation  # x @ up of both layers, in space 5
assert on_host["dots_saveable"] == on_host["nothing_saveable"] == 0
assert hbm_of("TPU v5e", "dots_saveable") - hbm_of("TPU v5e", "offloaded dots") > 0.9 * on_host["offloaded dots"]
assert hbm_of("TPU v5e", "offloaded dots") < hbm_of("TPU v5e", "nothing_saveable")
assert wide["TPU v5e", "offloaded dots", 2]["matmuls"] == matmuls["TPU v5e", "scan"][0]  # none recomputed

# %% [markdown]
# The offloading step keeps `dots_saveable`'s residuals, each layer's `x @ up`, in host memory (the
# layout `S(5)`), 64 MiB in all. So its HBM at O0 is that much below `dots_saveable`'s, and even below
# `nothing_saveable`'s, while no matmul is recomputed. The price is 64 MiB over the host link each way,
# every step.
#
# > **Gotcha.** Differentiate the split parameter state, not the model. `nnx.value_and_grad` over a model
# > whose scan wraps `nnx.remat` makes the forward loop carry out a copy of every layer's weight slices.

# %%
def nnx_grad(model, x, y):
    return nnx.value_and_grad(loss_fn)(model, x, y)


UP_SLICES = "f32[2,128,8192]"  # a device's slices of the wide `up` kernel, both layers


def forward_loop(compiled):
    """The forward layer loop's `while` line in the compiled program text."""
    (line,) = [line for line in compiled.as_text().splitlines() if " while(" in line and "jvp()/while" in line
               and UP_SLICES in line]
    return line


compile_live("nnx grad", grad=nnx_grad)
for name in ("nnx grad", "ZeRO-3"):
    loop = forward_loop(programs[name, 2])
    print(f"{name:<9}", re.sub(r"\{[^}]*\}", "", loop.split(" while(")[0]).strip())
    assert loop.count(UP_SLICES) == (2 if name == "nnx grad" else 1)
copy_cost = hbm_of(live, "nnx grad") - hbm_of(live, "ZeRO-3")
print("the copy costs", format_bytes(copy_cost))

# %% [markdown]
# `f32[2,128,8192]` is the device's slices of `up` for both layers, `f32[2,1024,1024]` those of `down`
# and the saved layer inputs. With `nnx.value_and_grad` each slice appears twice in the loop state, which
# costs the CPU backend one more slice of every layer's kernels. `param_grad` avoids it.
#
# The collectives of the wide scanned step and of its unrolled twin:

# %%
scan_comm, unrolled_comm = collectives(programs["scan + remat", 2]), collectives(programs["unrolled", 2])
print(scan_comm)
gathers = [op for op in scan_comm.ops if op.kind == "all-gather"]
# up and down, in the forward and in the backward loop (a compiler may combine several arrays in one op)
assert sum(len(op.shapes) for op in gathers) == 4 and all(op.in_loop and op.trips == 2 for op in gathers)
gradient_sums = [op for op in scan_comm.ops if op.kind in ("all-reduce", "reduce-scatter") and op.result_bytes > 4]
assert len(gradient_sums) == 1 and gradient_sums[0].in_loop  # the gradient, summed one layer at a time
unrolled_gathers = [op for op in unrolled_comm.ops if op.kind == "all-gather"]
assert not any(op.in_loop for op in unrolled_comm.ops) and sum(len(op.shapes) for op in unrolled_gathers) >= 4

# %% [markdown]
# `(in loop, x2)` marks a collective in a `while` loop's body, so it runs once per layer, 2 times here, and
# the totals count every run:
#
# | where | collective | why |
# |---|---|---|
# | forward loop | all-gather `up` and `down` | each layer needs its weights whole |
# | backward loop | all-gather them again | the scan saved only each device's slices |
# | backward loop | the gradient's sum (an all-reduce on CPU) | one layer's gradient at a time |

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU and TPU compilers' exact figures, §3: what each keeps live
print("unrolled minus scanned, per layer: " + "; ".join(
    f"{named(t)} {format_bytes(growth[t, 'unrolled'] - growth[t, 'scan'])}" for t in TARGETS)
    + f" (one layer's gathered kernels: {format_bytes(layer_bytes)})")
if CPU:  # the CPU compiler keeps each layer's gathered kernels
    assert growth["CPU", "unrolled"] - growth["CPU", "scan"] >= layer_bytes
    assert copy_cost == 2 * layer_bytes // 8  # nnx.value_and_grad: one more slice of every layer's kernels
    assert sum(op.result_bytes for op in gathers) == 2 * layer_bytes  # each layer's kernels whole, twice
assert growth["TPU v5e", "unrolled"] - growth["TPU v5e", "scan"] < layer_bytes  # the TPU compiler does not

# %% [markdown]
# ## 4. ZeRO-1, 2 and 3: three rules
#
# ZeRO (Zero Redundancy Optimizer) names three steps from data parallelism, where every device stores
# everything, to FSDP:
#
# | stage | parameters | gradients | optimizer state | the step's collectives |
# |---|---|---|---|---|
# | ZeRO-1 | whole | whole | split | all-reduce gradients, all-gather the new parameters |
# | ZeRO-2 | whole | split | split | reduce-scatter gradients, all-gather the new parameters |
# | ZeRO-3 (FSDP) | split | split | split | all-gather each layer's weights, reduce-scatter gradients |
#
# Each stage is a row of `ZERO`; what one device holds of the `up` kernel `(2, 128, 512)`:

# %%
up = jax.ShapeDtypeStruct((2, D, H), jnp.float32)
print(f"{'':<8}{'parameters':>15}{'gradients':>15}{'Adam mu, nu':>15}")
for stage, splits in ZERO.items():
    shards = [layout(split, mesh, up).shard_shape(up.shape) for split in splits]
    print(f"{stage:<8}" + "".join(f"{s!s:>15}" for s in shards))
assert layout(True, mesh, up).shard_shape(up.shape) == (2, 16, 512)  # 1/8 of every layer's rows

# %% [markdown]
# Build each stage's state from the same initial state (ZeRO-1 and 2 gather the parameters whole), and
# train it 5 steps:

# %%
states = {"ZeRO-3": (model, optimizer)}
for stage in ("ZeRO-1", "ZeRO-2"):
    m, o = build()
    nnx.update(m, jax.device_put(nnx.state(m), NamedSharding(mesh, P())))
    states[stage] = (m, o)
steps = {stage: make_step(stage, mesh) for stage in ZERO}
losses = {stage: [float(steps[stage](*states[stage], x_d, y_d)) for _ in range(5)] for stage in ZERO}
for stage in ZERO:
    print(f"{stage} losses:", np.round(losses[stage], 5))
    assert_close(losses[stage], ref_losses)

# %% [markdown]
# All three train to the reference's losses. Compile the three wide steps for this backend (the TPU's
# figures are stored), and read what each stores, its memory per device, and its collectives:

# %%
for stage in ("ZeRO-1", "ZeRO-2"):  # the TPU's are stored
    compile_live(stage, stage)
stored_wide = {stage: stored(abstract(stage, mesh, layers=2, **WIDE)) for stage in ZERO}
hbm = {(t, s): hbm_of(t, s) for t in TARGETS for s in ZERO}
print(f"{'':<8}{'stored':>11}" + "".join(f"{named(t):>12}" for t in TARGETS))
for stage in ZERO:
    print(f"{stage:<8}{format_bytes(stored_wide[stage]):>11}" + "".join(f"{format_bytes(hbm[t, stage]):>12}"
                                                                       for t in TARGETS))
for target in TARGETS:
    comms = {stage: ops_of(target, stage) for stage in ZERO}
    for stage in ZERO:
        sums = [op for op in comms[stage] if op.in_loop and op.kind != "all-gather"]
        print(f"{target} {stage}: the gradient's sum in the loop:", ", ".join(f"{op.kind} {op.result_type}"
                                                                            for op in sums))
        if target == "TPU v5e":  # fused into a reduce-scatter where the gradient is split
            assert {op.kind for op in sums} == {"all-reduce" if stage == "ZeRO-1" else "reduce-scatter"}
            assert stage == "ZeRO-1" or sorted(s for op in sums for s in op.shapes) == [(128, 8192), (1024, 1024)]
    for stage in ("ZeRO-1", "ZeRO-2"):  # the updated parameters, gathered whole once per step, after the loop
        gathered = [op for op in comms[stage] if op.kind == "all-gather"]
        assert sorted(s for op in gathered for s in op.shapes) == [(2, 1024, 8192), (2, 8192, 1024)]
        assert not any(op.in_loop for op in gathered)
    assert all(op.in_loop for op in comms["ZeRO-3"] if op.kind == "all-gather")
params_bytes = 4 * WIDE["width"] * WIDE["hidden"] * 2 * 2
assert stored_wide["ZeRO-1"] == stored_wide["ZeRO-2"] == params_bytes + 2 * params_bytes // 8 + 8
for t in TARGETS:  # memory falls from stage to stage
    assert hbm[t, "ZeRO-1"] > hbm[t, "ZeRO-2"] > hbm[t, "ZeRO-3"]

# %% [markdown]
# What each stage stores follows from its rule:
#
# | stage | parameters stored | Adam's moments stored | gradient while the step runs |
# |---|---|---|---|
# | ZeRO-1 | whole, 128 MiB | 1/8, 32 MiB | whole, 128 MiB |
# | ZeRO-2 | whole, 128 MiB | 1/8, 32 MiB | 1/8, 16 MiB |
# | ZeRO-3 | 1/8, 16 MiB | 1/8, 32 MiB | 1/8, 16 MiB |
#
# So memory falls at each stage, on both targets. ZeRO-2 saves over ZeRO-1 because ZeRO-1 holds the
# whole gradient until Adam has read its slice. The hidden cell below ("The CPU and TPU compilers' exact
# figures, §4") checks that the CPU backend's saving is exactly the whole gradient less its slice, 112 MiB.
#
# The collectives differ too. ZeRO-1 and 2 all-gather the updated parameters once per step, after the
# loop, whereas ZeRO-3 gathers each layer's weights inside it. On the CPU backend every gradient sum is an
# all-reduce followed by a `dynamic-slice`. The TPU compiler fuses that pair into one **reduce-scatter**
# wherever the gradient is split, so it never holds the whole sum.
#
# The picture splits each step's memory per device into what the rules above store, the gradient, and
# the rest: activations saved for the backward pass, gathered weights and other temporaries. It adds two
# ZeRO-3 variants from sections 2 and 3, without donation and without remat. For the TPU these are O0
# figures, so the rest is an upper bound: at the default effort much of it moves to VMEM, as the table
# in section 1 shows (ZeRO-3's 224.1 MiB of HBM becomes 80.7 MiB).

# %%
shown = "TPU v5e"
REST = "the rest: activations, gathered weights, temporaries"
variants_shown = {"ZeRO-1": "ZeRO-1", "ZeRO-2": "ZeRO-2", "ZeRO-3": "ZeRO-3", "ZeRO-3, not donated": "not donated",
                  "ZeRO-3, no remat": "scan"}
bars = {}
for label, variant in variants_shown.items():
    stage = label.split(",")[0]
    model_shapes, optimizer_shapes = abstract(stage, mesh, layers=2, **WIDE)
    parts = {"parameters": stored(model_shapes), "Adam mu, nu": stored(optimizer_shapes),
             "gradient": params_bytes // 8 if ZERO[stage][1] else params_bytes}
    parts[REST] = hbm_of(shown, variant) - sum(parts.values())
    bars[label] = parts
    assert parts[REST] > 0  # the compiler's figure covers what the rules store
assert bars["ZeRO-3, no remat"][REST] > bars["ZeRO-3"][REST]  # the activations remat would recompute
assert wide[shown, "ZeRO-3", 2]["allocated"]  # the HBM the compiler allocated, not an estimate
draw_memory(bars, title=f"memory per device, wide model, 2 layers: {named(shown)} (HBM; O0 keeps nothing in VMEM)")

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU and TPU compilers' exact figures, §4: ZeRO-1 against ZeRO-2
print("ZeRO-1 minus ZeRO-2: " + "; ".join(f"{named(t)} {format_bytes(hbm[t, 'ZeRO-1'] - hbm[t, 'ZeRO-2'])}"
                                         for t in TARGETS)
      + f" (the whole gradient less its slice: {format_bytes(params_bytes - params_bytes // 8)})")
if CPU:  # ZeRO-2 allocates the whole gradient less its slice
    assert abs(hbm["CPU", "ZeRO-1"] - hbm["CPU", "ZeRO-2"] - (params_bytes - params_bytes // 8)) < 2**10
    # the CPU compiler writes every gradient sum as an all-reduce
    assert all(op.kind != "reduce-scatter" for stage in ZERO for op in ops_of("CPU", stage))

# %% [markdown]
# ## 5. Mixed precision: bf16 parameters, float32 master weights
#
# A common recipe computes with bf16 parameters (so activations and gradients are bf16), and keeps a
# **float32 master copy** of the parameters, with Adam's moments, for the update: in bf16, `1 + 0.001` is
# `1`, so small updates would vanish. The master copy is a few lines of Optax:

# %%
assert jnp.bfloat16(1) + jnp.bfloat16(0.001) == 1  # 8 bits of mantissa: the update is lost


class MasterState(NamedTuple):
    master: Any  # float32 copy of the parameters
    inner: Any  # the wrapped optimizer's state, float32


def fp32_master(tx):
    """Run `tx` on float32 master weights; hand the low-precision parameters their rounded new value."""
    def init(params):
        master = jax.tree.map(lambda p: p.astype(jnp.float32), params)
        return MasterState(master, tx.init(master))

    def update(grads, state, params):
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        updates, inner = tx.update(grads, state.inner, state.master)
        master = optax.apply_updates(state.master, updates)
        step = jax.tree.map(lambda m, p: m - p.astype(jnp.float32), master, params)  # param + step = master
        return step, MasterState(master, inner)

    return optax.GradientTransformation(init, update)


def to_mixed(model):
    """bf16 parameters; the optimizer keeps their float32 values as master weights."""
    optimizer = nnx.Optimizer(model, fp32_master(optax.adam(1e-3)), wrt=nnx.Param)
    nnx.update(model, jax.tree.map(lambda p: p.astype(jnp.bfloat16), nnx.state(model, nnx.Param)))
    return model, optimizer


mixed_model, mixed_optimizer = create_sharded("ZeRO-3", mesh, to_mixed)(build()[0])  # a fresh float32 model
x_bf16 = x_d.astype(jnp.bfloat16)
grads_type = jax.eval_shape(nnx.grad(loss_fn), mixed_model, x_bf16, y_d)


def bytes_per_param(state):
    """Bytes per parameter, summed over all devices, of the parameter-shaped arrays of a state."""
    return sum(shard_table(leaf).total_bytes for leaf in jax.tree.leaves(state) if leaf.ndim == 3) / n_params


accounting = {
    "bf16 parameters": bytes_per_param(nnx.state(mixed_model)),
    "float32 master": bytes_per_param(mixed_optimizer.opt_state.master),
    "Adam mu + nu": bytes_per_param(mixed_optimizer.opt_state.inner),
    "bf16 gradient": sum(g.size * g.dtype.itemsize for g in jax.tree.leaves(grads_type)) / n_params,
}
for what, b in accounting.items():
    print(f"{what:<17}{b:>4.0f} bytes per parameter")
print(f"{'total':<17}{sum(accounting.values()):>4.0f}")
assert list(accounting.values()) == [2, 4, 8, 2]

# %% [markdown]
# The step stores 2 + 4 + 4 + 4 bytes per parameter and holds a 2-byte gradient while it runs, so 16
# bytes per parameter in all. That is the usual accounting, here read from the arrays themselves (the
# gradient from the step's traced types).
#
# > **You will see this online:** "Mixed precision halves the memory of training."
#
# Count float32 training the same way: 4 bytes of parameters, 8 of Adam's moments, a 4-byte gradient.

# %%
fp32_grads = jax.eval_shape(nnx.grad(loss_fn), model, x_d, y_d)  # types only, as for the bf16 gradient
fp32 = {"parameters": bytes_per_param(nnx.state(model)), "Adam mu + nu": bytes_per_param(optimizer.opt_state),
        "gradient": sum(g.size * g.dtype.itemsize for g in jax.tree.leaves(fp32_grads)) / n_params}
print("float32:", sum(fp32.values()), "bytes per parameter; mixed precision:", sum(accounting.values()))
assert sum(fp32.values()) == sum(accounting.values()) == 16

# Flax's own idiom: float32 parameters, bf16 computation (dtype); the layer casts its kernel for the matmul
layer = nnx.Linear(D, H, param_dtype=jnp.float32, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
assert layer.kernel[...].dtype == jnp.float32 and layer(x_bf16[:8]).dtype == jnp.bfloat16

# %% [markdown]
# The same 16 bytes, because the master copy costs exactly what the bf16 parameters and gradient save.
# The usual JAX way is the last two lines: `param_dtype=float32, dtype=bfloat16` in every Flax layer
# (MaxText calls them `weight_dtype` and `dtype`). That gives float32 parameters and gradients with bf16
# matmuls, again 16 bytes. So bf16 saves nothing in what the step stores. It saves in what the step
# computes with and moves. Train the master-weight model 5 steps with the ZeRO-3 step:

# %%
compiled = {"mixed": steps["ZeRO-3"].lower(mixed_model, mixed_optimizer, x_bf16, y_d).compile()}
mixed_losses = [float(steps["ZeRO-3"](mixed_model, mixed_optimizer, x_bf16, y_d)) for _ in range(5)]
difference = np.max(np.abs(np.array(mixed_losses) / np.array(ref_losses) - 1))
print("mixed precision:", np.round(mixed_losses, 4))
print("float32:        ", np.round(ref_losses, 4))
print(f"largest relative difference: {difference:.0e}")
np.testing.assert_allclose(mixed_losses, ref_losses, rtol=2e-2)  # bf16 keeps about 3 significant digits
assert mixed_model.blocks.up.kernel[...].dtype == jnp.bfloat16 and mixed_losses != ref_losses

# %% [markdown]
# The losses agree within bf16's tolerance. On the CPU backend the compiler converts the bf16 gradients
# and weights to float32 before its collectives (the hidden cell at the end of this section shows it).
# Compile this mixed-precision step for the TPU next to the float32 one. These are small programs, so
# they use the compiler's default effort, and only their collectives are read, not their memory:

# %%
if ok:
    tpu = targets["TPU v5e"]
    tpu_x = jax.ShapeDtypeStruct(x.shape, jnp.float32, sharding=NamedSharding(tpu, P("data")))
    tpu_bf16 = jax.ShapeDtypeStruct(x.shape, jnp.bfloat16, sharding=tpu_x.sharding)
    with quiet():
        compiled["TPU ZeRO-3"] = make_step("ZeRO-3", tpu).lower(*abstract("ZeRO-3", tpu), tpu_x, tpu_x).compile()
        compiled["TPU mixed"] = make_step("ZeRO-3", tpu).lower(
            *abstract("ZeRO-3", tpu, make=lambda: to_mixed(create()[0])), tpu_bf16, tpu_x).compile()
    scatter = {}
    for name in ("ZeRO-3", "mixed"):
        ops = collectives(compiled["TPU " + name]).ops
        (scatter[name],) = [op for op in ops if op.kind == "reduce-scatter"]
        gather_types = {op.result_type.split("[")[0] for op in ops if op.kind == "all-gather"}
        print(f"{name:<7} all-gathers {gather_types}, gradient reduce-scatter {scatter[name].result_type}: "
              f"{format_bytes(scatter[name].result_bytes)} per chip per layer")
        assert gather_types == {"bf16"}  # the float32 step too gathers its weights in bf16
    assert scatter["mixed"].result_type.startswith("bf16") and scatter["ZeRO-3"].result_type.startswith("f32")
    assert 2 * scatter["mixed"].result_bytes == scatter["ZeRO-3"].result_bytes

# %% [markdown]
# The float32 step already gathers its weights in bf16. The TPU multiplies float32 at bf16 precision by
# default, so its compiler converts the weights before sending them. On the TPU, then, bf16 parameters
# save only on the gradient's reduce-scatter, which moves half the bytes. That saving has a price: a bf16
# sum rounds at every addition, and a ring adds one device's share at a time, so the error grows with the
# number of devices. For that reason many setups reduce gradients in float32:

# %%
def ring_sum(values, dtype):
    """The values added one at a time in `dtype`, as a ring reduction adds the devices' shares."""
    total = dtype(0)
    for value in values:
        total = dtype(total + dtype(value))
    return float(total)


shares = np.full(64, 0.01, dtype=jnp.bfloat16)  # one gradient entry, as each of 64 devices computed it
exact = 64 * float(shares[0])
print(f"summed in bf16: {ring_sum(shares, jnp.bfloat16)}, in float32: {ring_sum(shares, np.float32)}, exact: {exact}")
assert ring_sum(shares, np.float32) == exact and abs(ring_sum(shares, jnp.bfloat16) / exact - 1) > 0.01

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §5: the types it sums the bf16 step in
sum_types = {op.result_type.split("[")[0] for op in collectives(compiled["mixed"]).ops}
print(f"{jax.default_backend().upper()} compiler: the mixed-precision step's collectives in {sorted(sum_types)}")
if CPU:  # the CPU compiler sums the bf16 gradients in float32
    assert sum_types == {"f32"}

# %% [markdown]
# ## Takeaways
# - Donate the state in every train step: without `donate_argnums` the old and the new state are both live.
# - A scan over stacked layers is one program for every depth; it gathers one layer at a time, forward and
#   backward. What unrolling costs in memory depends on the compiler: a whole layer per layer on the CPU.
# - A remat policy decides which activations each layer saves: tens of MiB per layer at realistic token
#   counts. On a TPU an offload policy keeps them in host memory instead of HBM. Differentiate the split
#   parameters with `jax.value_and_grad`, or check the loop for copies.
# - Measure a TPU's memory in HBM (`footprint`), and name the compiler effort with every figure. O0, fast
#   to compile, places nothing in VMEM, so its figures are upper bounds: 1.07 to 2.78 times the default
#   effort's HBM for the ZeRO steps here. Compare variants at one effort; the orderings held at both.
# - ZeRO-1, 2, 3 split the optimizer state, then the gradients, then the parameters: the same losses, less
#   memory at each stage. A TPU fuses the gradient's all-reduce and slice into a reduce-scatter.
# - Mixed precision with float32 master weights stores 16 bytes per parameter, like float32 and Flax's
#   `param_dtype`/`dtype` idiom. On a TPU, which gathers weights in bf16 anyway, bf16 parameters save only
#   on the gradient's reduce-scatter, at some precision. ZeRO divides the 16.

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** A model of 7 billion parameters is trained with section 5's mixed precision (2-byte
# parameters and gradients, 12 bytes of master weights and Adam moments per parameter) on 64 devices.
# How many bytes does each device hold for parameters, gradients and optimizer state together under
# ZeRO-1, ZeRO-2 and ZeRO-3?

# %%
from spmd_course.exercises import ex13_training_memory as ex

answer_1 = NOT_ANSWERED  # a tuple (ZeRO-1, ZeRO-2, ZeRO-3) of bytes per device
ex.zero_bytes.check(answer_1);

# %% [markdown]
# **Exercise 2.** Write `zero_specs(stage)` for a stacked kernel `(layers, rows, cols)` on the mesh axis
# `'data'`: given `1`, `2` or `3`, return the `PartitionSpec`s of the parameter, its gradient and its
# Adam moments, as a tuple of three.

# %%
def zero_specs(stage):
    ...  # return (parameter spec, gradient spec, optimizer-state spec)


answer_2 = NOT_ANSWERED  # set it to zero_specs once you have written it
ex.zero_specs.check(answer_2);

# %% [markdown]
# **Next:** [14 · Sequence parallelism, gradient accumulation, and what comes next](14_sequence_batch.ipynb)
