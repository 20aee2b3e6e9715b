# %% [markdown]
# # 24 · PyTorch/XLA side by side
#
# *Runs locally only:* `make lab-xla` (PyTorch/XLA needs its own environment, about 4 GB).
#
# PyTorch/XLA shards PyTorch programs with XLA, the compiler behind JAX, but in SPMD mode PyTorch sees its
# 8 devices as one, `xla:0`, and every sharding call is spelled differently. A port between the two is right
# only if both put the same block on each device and train to the same losses, which no API reading shows.
#
# **You need:** notebooks 03 (`NamedSharding`), 05 (sharding constraints), 07, 08 and 10 (DP, TP, FSDP)
# and 23 (multi-host); `jax.jit`, `jax.device_put`; and PyTorch on one device
# (`nn.Module`, `loss.backward()`, `torch.optim`).
#
# If you come from PyTorch/XLA, read notebooks 00, 03 and 07 first and then this one, where each construct
# you know runs next to its JAX twin. Section 11's table is the quick reference.
#
# **You will learn**
# - `xr.use_spmd()`, `Mesh` and `xs.mark_sharding`, each beside its JAX twin, and torch_xla's sharding string;
# - that data-parallel, tensor-parallel and FSDPv2 MLPs give the same losses in both;
# - the multi-host twins, manual sharding and Dynamo; and that `mark_sharding` switches JAX to GSPMD.

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
import importlib.util
import inspect
import logging
import os
import re
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.utils import NOT_ANSWERED, assert_close, collectives, draw_mesh, draw_sharding, quiet, type_string

if importlib.util.find_spec("torch_xla") is None:
    raise ModuleNotFoundError(
        "This notebook needs PyTorch/XLA (torch 2.9.0 and torch-xla 2.9.0), which is not installed in this "
        "kernel's environment. The course keeps it in its own environment, .venv-xla: from the course's "
        "folder, run `make lab-xla` to open this notebook there, or `make test-xla` to test it. Elsewhere: "
        "`pip install -r requirements-xla.txt` (Python 3.10 to 3.13), then restart the kernel."
    )

# torch_xla runs on the CPU below. Where JAX has 8 accelerators instead, its programs are another compiler's:
# the asserts that compare compiled programs across the two frameworks run only when JAX is on the CPU too
# (`CPU`, set by the setup cell).
logging.getLogger("absl").setLevel(logging.ERROR)  # hides "Tensorflow library not found" from torch_xla's JAX bridge

# %% [markdown]
# ## 1. Two runtimes in one process
#
# In `.venv-xla` (Python 3.11, hence JAX 0.10.2), torch_xla has its own runtime and copy of XLA, which
# read `PJRT_DEVICE=CPU` and `CPU_NUM_DEVICES=8` when it starts: set them before the import. Its XLA writes
# every program it compiles to the folder `--xla_dump_to` in `XLA_FLAGS` names (JAX read `XLA_FLAGS` at
# startup, so its programs do not go there).
#
# XLA warns that GSPMD, torch_xla's partitioner (section 6), is deprecated, once per program it
# partitions. `TF_CPP_MIN_LOG_LEVEL=2`, read when torch_xla loads, hides such C++ warnings but not errors.

# %%
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "8")
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"  # importing JAX set 1; 2 hides "GSPMD ... is going to be deprecated"
DUMP_DIR = tempfile.TemporaryDirectory(prefix="torch-xla-hlo-")  # deleted when the kernel exits
DUMP = Path(DUMP_DIR.name)
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={DUMP} --xla_dump_hlo_as_text".strip()

import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch_xla.distributed.spmd import Mesh
from torch_xla.distributed.spmd.debugging import visualize_tensor_sharding

print("torch", torch.__version__, "| torch_xla", torch_xla.__version__, "| jax", jax.__version__)
print("torch_xla:", xr.global_runtime_device_count(), xr.device_type(), "devices")
print("jax:      ", jax.device_count(), jax.default_backend(), "devices")
assert xr.global_runtime_device_count() == 8 and xr.device_type() == "CPU"

_seen = set()


def torch_xla_programs():
    """HLO text of every program torch_xla compiled since the last call, after partitioning."""
    new = sorted(set(DUMP.glob("*after_optimizations.txt")) - _seen)
    _seen.update(new)
    return [path.read_text() for path in new]

# %% [markdown]
# `collectives` reads the HLO text `torch_xla_programs()` returns as it reads JAX's programs.
#
# ## 2. SPMD mode: one logical device
#
# JAX has no mode. PyTorch/XLA has three:
#
# | mode | what a process drives |
# |---|---|
# | plain | one device, `xla:0` |
# | multi-process (`torchrun`, `xmp.spawn`) | one device per process |
# | SPMD, after `xr.use_spmd()` | every device, seen as one `xla:0` |
#
# `xr.use_spmd()` must come before any tensor reaches the device, because the mode decides where tensors
# live: on one real device, or on the virtual `xla:0` that stands for all 8. torch_xla 2.9 does not move a
# process from one to the other cleanly, so each wrong order spoils the process it runs in and this
# notebook cannot show one. `tests/test_24_pytorch_xla_use_spmd.py` (run by `make test-xla`) runs each order
# in a fresh Python process with 8 CPU devices and asserts how it ends:
#
# | order | what happens |
# |---|---|
# | `mark_sharding` with no `use_spmd()` | `RuntimeError: ... Please enable SPMD via torch_xla.runtime.use_spmd()`, even for a tensor still on the host |
# | `use_spmd()` after that error | it warns "Replicating tensors already initialized ...", then `torch_xla.device()` raises |
# | a tensor on the device, then `use_spmd()` | the same warning, then the next program kills the process (a segmentation fault) |
# | `use_spmd()` first, then tensors and `mark_sharding` | works, with no warning (the cell below) |
#
# So call `use_spmd()` at the top of a script, before the model is built, and restart the kernel if a cell
# got the order wrong.

# %%
spmd_before = xr.is_spmd()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    xr.use_spmd()
device = torch_xla.device()  # today's name for xm.xla_device(), which is deprecated
print("SPMD before:", spmd_before, "| after:", xr.is_spmd(), "| torch device:", device)
print("jax devices:", jax.devices())
assert spmd_before is False and xr.is_spmd() is True
assert str(device) == "xla:0"
assert not [w for w in caught if "Replicating" in str(w.message)]  # no tensor reached a device before it

# %% [markdown]
# In SPMD mode PyTorch code sees **one** device, `xla:0`, that stands for all 8: you write the program for
# one big device, and `mark_sharding` says how its tensors are cut. `jax.devices()` lists all 8.
#
# ## 3. The mesh
#
# `Mesh(device_ids, mesh_shape, axis_names)` arranges device ids, in the order given, in a named grid:
# `jax.sharding.Mesh(devices.reshape(mesh_shape), axis_names)`. `jax.make_mesh` picks the order itself (on
# a TPU board a ring, notebook 01). A `(num_devices, 1)` mesh puts every device on `data`:

# %%
AUTO = (AxisType.Auto, AxisType.Auto)
num_devices = xr.global_runtime_device_count()
mesh = Mesh(np.array(range(num_devices)), (num_devices, 1), ("data", "model"))
jmesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(8, 1), ("data", "model"), axis_types=AUTO)
print("torch_xla:", mesh.shape())
print("jax:      ", jmesh.shape)
assert dict(mesh.shape()) == dict(jmesh.shape) == {"data": 8, "model": 1}
jax_ids = np.vectorize(lambda d: d.id)(jmesh.devices)
np.testing.assert_array_equal(mesh.get_logical_mesh(), jax_ids)  # the same device at every position
made = jax.make_mesh((8, 1), ("data", "model"), axis_types=AUTO)
assert sorted(made.device_ids.flat) == sorted(jax_ids.flat)  # the same devices, in an order of its choosing

# %% [markdown]
# `mesh.shape()` is an ordered mapping from axis name to size, like JAX's `mesh.shape`. In
# torch_xla a mesh is plain data passed to each `mark_sharding`, while in JAX it lives in each
# `NamedSharding`.
# Below, a `(4, 2)` mesh in both, where both axes split something:

# %%
xmesh = Mesh(np.arange(8), (4, 2), ("data", "model"))  # x for torch_xla
jmesh42 = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"), axis_types=AUTO)  # j for JAX
print(xmesh.get_logical_mesh())
np.testing.assert_array_equal(xmesh.get_logical_mesh(), np.vectorize(lambda d: d.id)(jmesh42.devices))
draw_mesh(jmesh42)

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §3: `jax.make_mesh`'s order on CPU devices
if CPU:  # CPU devices have no board: jax.make_mesh keeps the order jax.devices() lists
    assert made.devices.tolist() == jmesh.devices.tolist()
    print("jax.make_mesh((8, 1)) on CPU devices: ids", made.device_ids.ravel().tolist(), "as jax.devices() lists them")

# %% [markdown]
# ## 4. Partition specs: `mark_sharding` and `device_put`
#
# A PyTorch/XLA partition spec is a plain tuple with **one entry per tensor dimension**: a mesh axis name, a
# tuple of names, or `None`. `xs.mark_sharding(t, mesh, spec)` annotates `t` in place (and returns it wrapped
# as an `XLAShardedTensor`). `jax.device_put(x, NamedSharding(mesh, P(...)))` instead returns a new array.
#
# Three helpers give each device's block as `(start, stop)` per dimension, from torch_xla's sharding
# string, from its `local_shards` and from JAX's `addressable_shards`.

# %%
def spec_of(t):
    """torch_xla's sharding string of a tensor, such as '{devices=[4,2]0,1,2,3,4,5,6,7}'."""
    return torch_xla._XLAC._get_xla_sharding_spec(t)


def blocks_from_spec(spec, shape):
    """Device -> block, read from a sharding string."""
    if spec == "{replicated}":
        return {d: tuple((0, n) for n in shape) for d in range(8)}
    m = re.fullmatch(r"\{devices=\[([\d,]+)\]([\d,]+)( last_tile_dim_replicate)?\}", spec)
    counts = [int(v) for v in m.group(1).split(",")]  # blocks per dimension (+ copies per block, if replicated)
    grid = np.array([int(v) for v in m.group(2).split(",")]).reshape(counts)
    # zip stops at the tensor's rank: a trailing count of copies is not a dimension
    return {int(grid[pos]): tuple((i * n // k, (i + 1) * n // k) for i, n, k in zip(pos, shape, counts, strict=False))
            for pos in np.ndindex(*counts)}


def blocks_from_local_shards(sharded):
    """Device -> block, from the data torch_xla holds on each device."""
    return {int(s.shard_device.split(":")[1]):
            tuple(sl.indices(n)[:2] for sl, n in zip(s.indices, sharded.shape, strict=True))
            for s in sharded.local_shards}


def blocks_of_jax(x):
    """Device -> block, from the data JAX holds on each device."""
    return {s.device.id: tuple(sl.indices(n)[:2] for sl, n in zip(s.index, x.shape, strict=True))
            for s in x.addressable_shards}

# %% [markdown]
# Four tensors: an `(8, 4)` one on the `(8, 1)` mesh, one row per device. Then, on the `(4, 2)` mesh, a 3-D
# tensor with its first dimension whole, and a 1-D tensor split over `data` only, then over both axes.

# %%
examples = [  # name, mesh (torch_xla, JAX), shape, spec
    ("t0", mesh, jmesh, (8, 4), ("data", "model")),
    ("t1", xmesh, jmesh42, (8, 8, 16), (None, "data", "model")),
    ("t2", xmesh, jmesh42, (8,), ("data",)),
    ("t3", xmesh, jmesh42, (8,), (("data", "model"),)),
]
xla_tensors, jax_arrays = {}, {}
for name, xm_, jm, shape, spec in examples:
    values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    t = torch.from_numpy(values).to(device)
    st = xs.mark_sharding(t, xm_, spec)
    x = jax.device_put(values, NamedSharding(jm, P(*spec)))
    xla_tensors[name], jax_arrays[name] = t, x
    print(f"{name} {spec!s:<25} torch_xla {spec_of(t):<52} jax {type_string(x)}")
    assert blocks_from_spec(spec_of(t), shape) == blocks_from_local_shards(st) == blocks_of_jax(x)
    for s_xla in st.local_shards:  # and the same numbers in each block
        s_jax = next(s for s in x.addressable_shards if s.device.id == int(s_xla.shard_device.split(":")[1]))
        np.testing.assert_array_equal(s_xla.data.numpy(), np.asarray(s_jax.data))

assert spec_of(xla_tensors["t1"]) == "{devices=[1,4,2]0,1,2,3,4,5,6,7}"
assert spec_of(xla_tensors["t2"]) == "{devices=[4,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
assert spec_of(xla_tensors["t3"]) == "{devices=[8]0,1,2,3,4,5,6,7}"
assert {s.data.shape for s in jax_arrays["t1"].addressable_shards} == {(8, 2, 8)}

# %% [markdown]
# Every device holds the same block, with the same numbers, in both frameworks. In the string, `[...]` lists
# the blocks per dimension and, with `last_tile_dim_replicate`, the copies of each block. The device ids
# follow. `t2` has 4 blocks of 2 with 2 copies each, because the mesh axis a spec leaves out replicates. `t3` splits one dimension over both axes, `data` major, like `P(('data', 'model'))`.
#
# The string is XLA's `HloSharding`, and JAX builds the same object. A private method returns it (its device
# list `<=[8]` means ids 0 to 7 in order):

# %%
for name, *_, shape, _ in examples:
    hlo = jax_arrays[name].sharding._to_xla_hlo_sharding(len(shape))  # private: may change without notice
    counts, ids = re.fullmatch(r"\{devices=\[([\d,]+)\]([\d,]+).*", spec_of(xla_tensors[name])).groups()
    print(f"{name}  jax {hlo!s:<48} torch_xla {spec_of(xla_tensors[name])}")
    assert hlo.tile_assignment_dimensions() == [int(v) for v in counts.split(",")]
    assert hlo.tile_assignment_devices() == [int(v) for v in ids.split(",")]

# %% [markdown]
# > **You will see this online:** one tensor sharded twice, to show two specs:
# > ```python
# > xs.mark_sharding(t2, mesh, ('data',))
# > xs.mark_sharding(t2, mesh, (('data', 'model'),))
# > ```

# %%
t2 = torch.randn(8).to(device)
xs.mark_sharding(t2, xmesh, ("data",))
try:
    xs.mark_sharding(t2, xmesh, (("data", "model"),))
    second = "accepted"
except RuntimeError as err:
    second = str(err).split(": goo.gle")[0]  # the rest is a link and a dump of the old annotation
print("RuntimeError:", second)

xs.clear_sharding(t2)  # the fix: clear the annotation first (or shard a fresh tensor)
xs.mark_sharding(t2, xmesh, (("data", "model"),))
print("after clear_sharding:", spec_of(t2))
assert "Existing annotation must be cleared first" in second
assert spec_of(t2) == "{devices=[8]0,1,2,3,4,5,6,7}"

# %% [markdown]
# A torch_xla tensor keeps one annotation until `clear_sharding`, because the annotation is part of the
# tensor. JAX's `device_put` never changes the array it is given. And JAX reads `P('data')` on a 2-D array
# as `P('data', None)`, while torch_xla wants every dimension:

# %%
try:
    xs.mark_sharding(torch.zeros(8, 16).to(device), xmesh, ("data",))
    short = "accepted"
except AssertionError as err:
    short = str(err)
x = jax.device_put(np.zeros((8, 16), np.float32), NamedSharding(jmesh42, P("data")))
print("torch_xla ('data',):", short, "\njax P('data'):", type_string(x))
assert short.startswith("Partition spec length (1) should be equal to the input rank (2)")
assert x.sharding.shard_shape(x.shape) == (2, 16)

# %% [markdown]
# ## 5. Pictures: `visualize_tensor_sharding` and `draw_sharding`
#
# torch_xla's picture, `visualize_tensor_sharding(t)`, is a `rich` table of devices. It shows the first two
# dimensions only, so `t1`'s split of its third over `model` is missing, and a 1-D tensor split 8 ways raises:

# %%
table = visualize_tensor_sharding(xla_tensors["t1"], use_color=False)
assert table.row_count == 1 and len(table.columns) == 4  # dims 0 and 1: 1 x 4 blocks (there are 8)
try:
    visualize_tensor_sharding(xla_tensors["t3"], use_color=False)
    one_d = "a table"
except ValueError as err:
    one_d = "".join(err.args)
print(one_d)
assert one_d == "sharding {devices=[8]0,1,2,3,4,5,6,7} is not organized as expected"

# %% [markdown]
# The course's `draw_sharding` draws any rank: the last two dimensions, one panel per block of the others.
# Each block is labelled with its devices and shape:

# %%
draw_sharding(jax_arrays["t1"])

# %% [markdown]
# ## 6. One MLP in both frameworks
#
# 32 inputs, 64 hidden units, 8 classes, as a `torch.nn.Module` and as a JAX function. `mark_sharding`
# inside `forward` is the twin of `jax.lax.with_sharding_constraint`. `nn.Linear(32, 64).weight` is
# `(64, 32)`, **(out, in)**, and the JAX kernel is `(32, 64)`, **(in, out)**. So one layout has transposed
# specs in the two frameworks.

# %%
class MLP(torch.nn.Module):
    def __init__(self, hidden_spec=None, mesh=None):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)
        self.hidden_spec, self.mesh = hidden_spec, mesh

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if self.hidden_spec is not None:
            xs.mark_sharding(h, self.mesh, self.hidden_spec)  # an annotation on an activation
        return self.fc2(h)


def mlp(params, x, hidden=None):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    if hidden is not None:
        h = jax.lax.with_sharding_constraint(h, hidden)  # the same annotation in JAX
    return h @ params["w2"] + params["b2"]


def loss_fn(params, x, y):  # cross-entropy, as torch's F.cross_entropy computes it
    logp = jax.nn.log_softmax(mlp(params, x))
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


torch.manual_seed(0)
init = {k: v.clone() for k, v in MLP().state_dict().items()}  # the starting weights of every run below
params0 = {"w1": init["fc1.weight"].numpy().T, "b1": init["fc1.bias"].numpy(),  # (out, in) -> (in, out)
           "w2": init["fc2.weight"].numpy().T, "b2": init["fc2.bias"].numpy()}

rng = np.random.default_rng(0)
X = rng.standard_normal((32, 32), dtype=np.float32)  # a batch of 32 examples
Y = np.argmax(X @ rng.standard_normal((32, 8), dtype=np.float32), axis=1)  # labels from a random "teacher"
print({k: tuple(v.shape) for k, v in init.items()})
print({k: v.shape for k, v in params0.items()})

# %% [markdown]
# ### `mark_sharding` switches JAX to GSPMD
#
# XLA has two partitioners: GSPMD, and its successor Shardy, JAX's default (flag
# `jax_use_shardy_partitioner`). torch_xla 2.9 uses GSPMD. Where JAX is installed, **every**
# `xs.mark_sharding` loads torch_xla's bridge to JAX (`torchax`) and sets that process-wide flag to `False`:

# %%
switched = []
for _ in range(2):
    jax.config.update("jax_use_shardy_partitioner", True)
    xs.mark_sharding(torch.zeros(8, 8).to(device), xmesh, ("data", None))
    switched.append(jax.config.jax_use_shardy_partitioner)
lowered = jax.jit(lambda a: a * 2).lower(jax_arrays["t0"])
print("Shardy after each mark_sharding:", switched, "| JAX's next program has Shardy annotations:",
      "sdy.sharding" in lowered.as_text())
assert switched == [False, False] and "sdy.sharding" not in lowered.as_text()


def use_shardy():
    """Give JAX its default partitioner back (until the next mark_sharding)."""
    jax.config.update("jax_use_shardy_partitioner", True)

# %% [markdown]
# Every JAX program compiled after a `mark_sharding` goes through GSPMD, silently. So each JAX compile
# below calls `use_shardy()` first and checks for Shardy's `sdy.sharding` annotations.
#
# ## 7. Sharding an activation
#
# Put the MLP in tensor-parallel layout on a `(1, 8)` mesh: the first layer column-parallel, the second
# row-parallel (notebook 08). In torch terms `fc1.weight` `(64, 32)` is split on its rows, `('model', None)`.
# In JAX terms `w1` `(32, 64)` is split on its columns, `P(None, 'model')`. The batch is replicated.

# %%
xmesh_tp = Mesh(np.arange(8), (1, 8), ("data", "model"))
jmesh_tp = jax.sharding.Mesh(np.array(jax.devices()).reshape(1, 8), ("data", "model"), axis_types=AUTO)
tp_specs_torch = {"fc1.weight": ("model", None), "fc1.bias": ("model",),  # (out, in): column-parallel
                  "fc2.weight": (None, "model"), "fc2.bias": (None,)}  # row-parallel
tp_specs_jax = {"w1": P(None, "model"), "b1": P("model"),  # (in, out): column-parallel
                "w2": P("model", None), "b2": P(None)}  # row-parallel


def torch_model(specs, mesh, hidden_spec=None):
    """The MLP with the starting weights, on the XLA device, each parameter marked with its spec."""
    model = MLP(hidden_spec, mesh)
    model.load_state_dict(init)
    model = model.to(device)
    for name, param in model.named_parameters():
        if name in specs:  # an unmarked tensor is replicated
            xs.mark_sharding(param, mesh, specs[name])
    return model


def jax_params(specs, mesh):
    return {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in params0.items()}


def ops(compiled):
    return [(o.kind, o.result_type, o.group_size) for o in collectives(compiled).ops]

# %% [markdown]
# The forward pass with no annotation on the hidden activation `h`, with `h` split on `model` (its layout
# anyway), and with `h` replicated. torch_xla compiles at `torch_xla.sync()`, JAX at `.compile()`:

# %%
x_xla = torch.from_numpy(X).to(device)
x_jax = jax.device_put(X, NamedSharding(jmesh_tp, P()))
reference = np.asarray(mlp(params0, X))  # unsharded, on one device

forward_ops = {}
for label, hidden in [("no annotation", None), ("h on model", (None, "model")), ("h replicated", (None, None))]:
    torch_xla_programs()  # forget programs compiled so far
    logits = torch_model(tp_specs_torch, xmesh_tp, hidden)(x_xla)
    torch_xla.sync()
    (program,) = torch_xla_programs()  # exactly one new program: this forward pass

    use_shardy()
    constraint = None if hidden is None else NamedSharding(jmesh_tp, P(*hidden))
    params = jax_params(tp_specs_jax, jmesh_tp)
    lowered = jax.jit(lambda params, x, c=constraint: mlp(params, x, c)).lower(params, x_jax)
    assert "sdy.sharding" in lowered.as_text()
    compiled = lowered.compile()

    forward_ops[label] = ops(program), ops(compiled)
    print(f"{label}:\n torch_xla {forward_ops[label][0]}\n jax       {forward_ops[label][1]}")
    assert_close(logits.detach().cpu().numpy(), reference, atol=RTOL)
    assert_close(np.asarray(compiled(params, x_jax)), reference, atol=RTOL)

assert forward_ops["no annotation"][0] == forward_ops["h on model"][0] == [("all-reduce", "f32[32,8]", 8)]
assert forward_ops["h replicated"][0] == [("all-gather", "f32[32,64]", 8), ("all-reduce", "f32[32,8]", 8)]
assert not any("jit_" in p.name for p in DUMP.glob("*.txt"))  # JAX's programs never went to the dump folder

# %% [markdown]
# The same collectives in both, and the unsharded model's logits every time. Without an annotation, or
# with the one the compiler would choose, one all-reduce sums the `(32, 8)` partial logits. A replicated
# `h` is obeyed though it helps nothing: an all-gather of `h` comes first. An annotation is an
# instruction, not a hint, in both.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §7: JAX's forward programs beside torch_xla's
if CPU:  # torch_xla runs on the CPU: JAX's programs are comparable where JAX does too
    for label, (torch_ops, jax_ops) in forward_ops.items():
        assert torch_ops == jax_ops, label
    print("JAX on the CPU: the same collectives as torch_xla for", ", ".join(forward_ops))

# %% [markdown]
# ## 8. Training: data parallel and tensor parallel
#
# Three SGD steps (learning rate 0.1) from the same weights on the same batch: data parallel on the
# `(8, 1)` mesh (parameters unmarked, so replicated) and tensor parallel on the `(1, 8)` mesh, in both
# frameworks. The torch_xla loop is ordinary PyTorch, run at `torch_xla.sync()`.

# %%
def fit(model, x, y, steps=3):
    """Plain PyTorch SGD steps, each run by XLA at torch_xla.sync(); the losses and the programs compiled."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch_xla_programs()  # forget programs compiled so far
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        losses.append(loss.item())
    return losses, torch_xla_programs()


def train_torch(specs, mesh, batch_spec, steps=3):
    model = torch_model(specs, mesh)
    x, y = torch.from_numpy(X).to(device), torch.from_numpy(Y).to(device)
    if batch_spec is not None:
        xs.mark_sharding(x, mesh, batch_spec)
        xs.mark_sharding(y, mesh, batch_spec[:1])
    return *fit(model, x, y, steps), model


def sgd_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def jax_args(specs, mesh, batch_spec):
    return (jax_params(specs, mesh), jax.device_put(X, NamedSharding(mesh, P(*batch_spec or ()))),
            jax.device_put(Y.astype(np.int32), NamedSharding(mesh, P(*(batch_spec or ())[:1]))))


def train_jax(specs, mesh, batch_spec, steps=3):
    use_shardy()
    params, x, y = jax_args(specs, mesh, batch_spec)
    lowered = jax.jit(sgd_step).lower(params, x, y)
    assert "sdy.sharding" in lowered.as_text()
    compiled = lowered.compile()
    losses = []
    for _ in range(steps):
        params, loss = compiled(params, x, y)
        losses.append(float(loss))
    return losses, compiled, params


dp_specs_jax = dict.fromkeys(params0, P())
dp_losses_xla, dp_programs, _ = train_torch({}, mesh, ("data", None))
dp_losses_jax, dp_compiled, _ = train_jax(dp_specs_jax, jmesh, ("data", None))
tp_losses_xla, tp_programs, model_tp = train_torch(tp_specs_torch, xmesh_tp, None)
tp_losses_jax, tp_compiled, params_tp = train_jax(tp_specs_jax, jmesh_tp, None)

print("data parallel   torch_xla", np.round(dp_losses_xla, 4), " jax", np.round(dp_losses_jax, 4))
print("tensor parallel torch_xla", np.round(tp_losses_xla, 4), " jax", np.round(tp_losses_jax, 4))
np.testing.assert_allclose(dp_losses_xla, dp_losses_jax, rtol=RTOL)
np.testing.assert_allclose(tp_losses_xla, tp_losses_jax, rtol=RTOL)
np.testing.assert_allclose(dp_losses_xla, tp_losses_xla, rtol=1e-5)
assert dp_losses_xla[-1] < dp_losses_xla[0]  # it learns
np.testing.assert_allclose(model_tp.fc1.weight.detach().cpu().numpy().T, np.asarray(params_tp["w1"]), rtol=RTOL,
                           atol=1e-6)
assert spec_of(model_tp.fc1.weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"  # the layout survived the updates
assert params_tp["w1"].sharding.is_equivalent_to(NamedSharding(jmesh_tp, P(None, "model")), 2)

# %% [markdown]
# The same losses in all four runs, the same trained weights, and the tensor-parallel layout kept. torch_xla
# traces the loop at every step but compiles only graphs it has not seen: one or two programs per run here.

# %%
print("programs compiled by torch_xla: data parallel", len(dp_programs), "| tensor parallel", len(tp_programs))
print("data parallel, torch_xla (last program):", collectives(dp_programs[-1]), sep="\n")
print("data parallel, jax:", collectives(dp_compiled), sep="\n")
print("tensor parallel, torch_xla:", collectives(tp_programs[-1]), sep="\n")
n_params = sum(v.size for v in params0.values())
assert 1 <= len(dp_programs) <= 2 and 1 <= len(tp_programs) <= 2
for program in dp_programs:
    found = collectives(program)
    assert found.kinds == {"all-reduce"} and {op.group_size for op in found.ops} == {8}
    gradients = [op for op in found.ops if op.result_type != "f32[]"]
    assert len(gradients) == 4 and sum(op.result_bytes for op in gradients) == 4 * n_params  # one per gradient
    assert len(found.ops) - len(gradients) == 3  # and three scalars
for program in tp_programs:
    assert ops(program) == [("all-reduce", "f32[32,8]", 8)]
assert collectives(dp_compiled).result_bytes == 4 * (n_params + 1)  # JAX: the same gradient bytes, and the loss

# %% [markdown]
# **Tensor parallel**: identical, one all-reduce of the `(32, 8)` partial logits; the weight gradients stay
# where their weights are.
#
# **Data parallel**: the same gradient bytes all-reduced over the 8 devices, packed differently. On the CPU
# backend JAX sums the four gradients and the loss in **one** all-reduce of a tuple, while torch_xla has
# one all-reduce per gradient, plus three scalar ones.
#
# Last, JAX's data-parallel step compiled with GSPMD, as `mark_sharding` leaves it, and with Shardy:

# %%
found = {}
for use in (False, True):
    jax.config.update("jax_use_shardy_partitioner", use)
    lowered = jax.jit(sgd_step).lower(*jax_args(dp_specs_jax, jmesh, ("data", None)))
    assert ("sdy.sharding" in lowered.as_text()) == use  # the partitioner really changed
    with quiet():  # JAX's XLA read the log level before this notebook set it: hide GSPMD's notice
        found["Shardy" if use else "GSPMD"] = ops(lowered.compile())
print(f"GSPMD  {found['GSPMD']}\nShardy {found['Shardy']}")
assert found["GSPMD"] == found["Shardy"]

# %% [markdown]
# Here the partitioners agree: a check, not a guarantee for every program.

# %% colab={"cellView": "form"} jupyter={"source_hidden": true} tags=["hide-input"]
# @title The CPU compiler's exact figures, §8: JAX's train steps on the CPU beside torch_xla's
if CPU:  # torch_xla runs on the CPU: JAX's programs are comparable where JAX does too
    assert ops(tp_compiled) == ops(tp_programs[-1])
    assert collectives(dp_compiled).count() == 1  # one all-reduce of a tuple: four gradients and the loss
    print("JAX on the CPU: tensor parallel", ops(tp_compiled), "| data parallel: one all-reduce of",
          collectives(dp_compiled).ops[0].result_type)

# %% [markdown]
# ## 9. Several hosts: the same program on every process
#
# Both frameworks name the process and count its devices (here, one process):

# %%
print(f"torch_xla: process {xr.process_index()} of {xr.process_count()},"
      f" {xr.addressable_runtime_device_count()} of {xr.global_runtime_device_count()} devices here")
print(f"jax:       process {jax.process_index()} of {jax.process_count()},"
      f" {jax.local_device_count()} of {jax.device_count()} devices here")
assert xr.process_index() == jax.process_index() == 0 and xr.process_count() == jax.process_count() == 1
assert xr.addressable_runtime_device_count() == jax.local_device_count() == 8
assert xr.addressable_device_count() == 1  # in SPMD mode: the one logical device, xla:0

# %% [markdown]
# Mind the word *runtime*: in SPMD mode `xr.addressable_device_count()` counts the one logical device.
#
# **Loading data.** `MpDeviceLoader` wraps a `DataLoader` and sends each batch to the devices sharded by
# `input_sharding` (a `ShardingSpec`, or a dict of them). `minibatch=True` says each process loaded only
# its part of the global batch, as with `jax.make_array_from_process_local_data` (notebook 23).

# %%
import torch_xla.distributed.parallel_loader as pl

xmesh_dp = Mesh(np.arange(8), (8,), ("data",))  # 1-D: in torch_xla 2.9.0 a 1-D ShardingSpec on a 2-D mesh raises IndexError
jmesh_dp = jax.sharding.Mesh(np.array(jax.devices()), ("data",), axis_types=(AxisType.Auto,))


class Examples(torch.utils.data.Dataset):
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return {"x": torch.from_numpy(X[i]), "y": torch.tensor(Y[i])}


loader = pl.MpDeviceLoader(torch.utils.data.DataLoader(Examples(), batch_size=16), device, input_sharding={
    "x": xs.ShardingSpec(xmesh_dp, ("data", None), minibatch=True),
    "y": xs.ShardingSpec(xmesh_dp, ("data",), minibatch=True)})
batch, _ = list(loader)  # two batches of 16
local_x, local_y = X[:16], Y[:16]  # what this process loaded for its first batch
jx = jax.make_array_from_process_local_data(NamedSharding(jmesh_dp, P("data")), local_x)
jy = jax.make_array_from_process_local_data(NamedSharding(jmesh_dp, P("data")), local_y)
for key, j in (("x", jx), ("y", jy)):
    print(f"{key}: torch_xla {spec_of(batch[key]):<34} jax {type_string(j)}")
    assert blocks_from_spec(spec_of(batch[key]), tuple(batch[key].shape)) == blocks_of_jax(j)
    np.testing.assert_array_equal(batch[key].cpu().numpy(), np.asarray(j))

# %% [markdown]
# Each device got 2 of the 16 examples, the same 2 in both.
#
# **Checkpoints.** `torch.distributed.checkpoint` with torch_xla's `SPMDSavePlanner` and `SPMDLoadPlanner`
# writes the blocks of a sharded `state_dict` and reads them into another layout, as Orbax does in JAX.
#
# > **You will see this online:** the save call of PyTorch/XLA's checkpoint examples:
# > ```python
# > dist_cp.save(state_dict=state_dict, storage_writer=dist_cp.FileSystemWriter(CHECKPOINT_DIR),
# >              planner=xc.SPMDSavePlanner())
# > ```
# > After a `mark_sharding` it fails: the writer asks PyTorch's `jax` device (torch_xla's bridge to JAX)
# > for a CUDA-style stream.

# %%
import torch.distributed.checkpoint as dist_cp
import torch_xla.experimental.distributed_checkpoint as xc

state = model_tp.state_dict()  # the trained tensor-parallel model
ckpt = tempfile.TemporaryDirectory(prefix="torch-xla-ckpt-")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch 2.9's own deprecation warnings from inside the checkpointer
    try:
        dist_cp.save(state_dict=state, storage_writer=dist_cp.FileSystemWriter(ckpt.name),
                     planner=xc.SPMDSavePlanner())
        online = "saved"
    except dist_cp.CheckpointException as err:
        online = str(err).strip().splitlines()[-1]
    print(online)
    assert online.endswith("has no attribute 'current_stream'")

    # The fix: per_thread_copy_ahead=0 skips the stream. Then restore into the data-parallel layout.
    dist_cp.save(state_dict=state, storage_writer=dist_cp.FileSystemWriter(ckpt.name, per_thread_copy_ahead=0),
                 planner=xc.SPMDSavePlanner())
    restored = torch_model({}, mesh)  # the starting weights, every parameter replicated
    target = restored.state_dict()
    dist_cp.load(state_dict=target, storage_reader=dist_cp.FileSystemReader(ckpt.name), planner=xc.SPMDLoadPlanner())
    restored.load_state_dict(target)

blocks = dist_cp.FileSystemReader(ckpt.name).read_metadata().state_dict_metadata["fc1.weight"].chunks
print("fc1.weight in the checkpoint:", len(blocks), "blocks of", tuple(blocks[0].sizes),
      "| restored:", spec_of(restored.fc1.weight) or "replicated")
assert len(blocks) == 8 and {tuple(b.sizes) for b in blocks} == {(8, 32)}  # one block per device
for name, param in restored.named_parameters():
    np.testing.assert_array_equal(param.detach().cpu().numpy(), state[name].cpu().numpy())

# %% [markdown]
# The checkpoint holds `fc1.weight` as the 8 blocks the devices held, and the replicated model reads it
# whole: the planners translate between layouts, as Orbax does in notebook 23.
#
# ## 10. More twins: global mesh, manual sharding, FSDPv2, `torch.compile`
#
# Five more JAX ideas have a twin in torch_xla. Each gets a short subsection below, with its code and its
# asserts. The table is the summary, so you can come back to it when you need one of them:
#
# | § | twin | JAX's | when to use it | what it compiles to (asserted below) |
# |---|---|---|---|---|
# | 10.1 | `xs.set_global_mesh(mesh)` | `jax.set_mesh`, narrower | to call manual sharding or FSDPv2 without naming the mesh | nothing: it only stores the mesh |
# | 10.2 | `xs.enable_manual_sharding(t, spec)` | `jax.shard_map` | for per-device code the partitioner must leave alone, such as a hand-written collective | a manual region, with each device's block; a sum in it is an all-reduce over global device ids |
# | 10.3 | `SpmdFullyShardedDataParallel` (FSDPv2) | FSDP as parameter specs (notebook 10) | to shard a whole module's parameters without writing a spec for each | an all-gather of each weight before use, and a sum of the gradients |
# | 10.4 | `torch.compile(model, backend="openxla")` | `jax.jit` | to trace once and rerun the compiled program | the program without Dynamo, annotations kept: its collectives are the same |
# | 10.5 | `use_spmd(auto=True)`, `xs.HybridMesh`, one process per host | none, `jax.make_mesh`, notebook 23 | on TPUs or several hosts | not run here (the table in 10.5 says why) |
#
# ### 10.1 A default mesh
#
# `xs.set_global_mesh(mesh)` stores a mesh for the few calls that accept none: `enable_manual_sharding`
# and `disable_manual_sharding` (10.2), and FSDPv2 built without `mesh=` (10.3). `mark_sharding`, the call
# you write most, still takes its mesh every time. So the twin is narrower than `jax.set_mesh`, which also
# serves a bare `P(...)` in `jax.device_put`, `jax.sharding.reshard` and `with_sharding_constraint`, and
# `jax.shard_map` without `mesh=`.

# %%
xs.set_global_mesh(xmesh_dp)
mesh_param = inspect.signature(xs.mark_sharding).parameters["mesh"]
print("global mesh stored:", xs.get_global_mesh() is xmesh_dp, "| mark_sharding's mesh has a default:",
      mesh_param.default is not inspect.Parameter.empty)
assert xs.get_global_mesh() is xmesh_dp
assert mesh_param.default is inspect.Parameter.empty  # mark_sharding has no default mesh

# %% [markdown]
# ### 10.2 Manual sharding
#
# `xs.enable_manual_sharding(t, spec)` hands each device its own block, as `jax.shard_map` does, until
# `xs.disable_manual_sharding` puts the blocks back together. Both use the global mesh of 10.1, and the
# JAX twin uses the mesh of `jax.set_mesh`, so neither call names one:

# %%
values = np.arange(16, dtype=np.float32).reshape(8, 2)
t = xs.mark_sharding(torch.from_numpy(values).to(device), xmesh_dp, ("data", None)).global_tensor
block = xs.enable_manual_sharding(t, ("data", None)).global_tensor  # the mesh: the global one
block_shape = tuple(block.shape)
doubled = xs.disable_manual_sharding(block * 2, ("data", None), t.shape).global_tensor
torch_xla.sync()

use_shardy()
seen = []
with jax.set_mesh(jmesh_dp):
    body = lambda b: (seen.append(b.shape), b * 2)[1]  # records the per-device shape it traces
    jdoubled = jax.shard_map(body, in_specs=P("data"), out_specs=P("data"))(values)  # no mesh=: the global one
print(f"per device: torch_xla {block_shape}, jax {seen[0]} | whole: {tuple(doubled.shape)}, {jdoubled.shape}")
assert block_shape == seen[0] == (1, 2)
np.testing.assert_array_equal(doubled.cpu().numpy(), np.asarray(jdoubled))

# %% [markdown]
# Inside the manual region a sum over devices is yours to write, as `jax.lax.psum` is inside `shard_map`.
# torch_xla 2.9 has no public call for it. `xm.all_reduce`, the collective of its multi-process mode,
# returns its input unchanged here, because an SPMD program runs as one process (world size 1) and the call
# skips the sum when it is alone. torch_xla's own tests use a private binding instead,
# `torch_xla._XLAC._xla_spmd_all_reduce`, which writes an all-reduce over global device ids into the
# region. Being private, it may change without notice:

# %%
import torch_xla.core.xla_model as xm

block = xs.enable_manual_sharding(t, ("data", None)).global_tensor
skipped = xm.all_reduce(xm.REDUCE_SUM, block)  # the multi-process call: alone in its "world", it sums nothing
summed = torch_xla._XLAC._xla_spmd_all_reduce(xm.REDUCE_SUM, block, 1.0, [list(range(8))])
region_hlo = torch_xla._XLAC._get_xla_tensors_hlo([summed])
skipped = xs.disable_manual_sharding(skipped, ("data", None), t.shape).global_tensor
summed = xs.disable_manual_sharding(summed, ("data", None), t.shape).global_tensor
torch_xla.sync()

use_shardy()
with jax.set_mesh(jmesh_dp):
    jsummed = jax.shard_map(lambda b: jax.lax.psum(b, "data"), in_specs=P("data"), out_specs=P("data"))(values)
print("each device's block after the sum: torch_xla", summed[0].tolist(), "| jax", np.asarray(jsummed)[0].tolist())
(reduce_line,) = [line for line in region_hlo.splitlines() if " all-reduce(" in line]
print(reduce_line.split("=", 1)[1].split(", to_apply")[0].strip())
np.testing.assert_array_equal(skipped.cpu().numpy(), values)  # xm.all_reduce: no sum at all
np.testing.assert_array_equal(summed.cpu().numpy(), np.asarray(jsummed))  # every block holds the column sums
assert "replica_groups={{0,1,2,3,4,5,6,7}}" in reduce_line and "use_global_device_ids=true" in reduce_line

# %% [markdown]
# ### 10.3 FSDPv2
#
# `SpmdFullyShardedDataParallel(module, mesh=...)` shards every parameter on its largest
# dimension over the mesh axis `fsdp`, and the output on the batch. It is FSDP written as annotations, like
# notebooks 10 and 11, so the partitioner adds the same collectives: an all-gather of each weight before it is used,
# and a sum of the gradients. Trained as in section 8, it gives the same losses:

# %%
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

xmesh_fsdp = Mesh(np.arange(8), (8,), ("fsdp",))
fsdp = FSDPv2(torch_model({}, xmesh_fsdp), mesh=xmesh_fsdp)
print({name.removeprefix("_orig_module."): spec_of(p) for name, p in fsdp.named_parameters()})
x, y = torch.from_numpy(X).to(device), torch.from_numpy(Y).to(device)
xs.mark_sharding(x, xmesh_fsdp, ("fsdp", None))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch: "Full backward hook is firing..." from FSDPv2's gradient barrier
    fsdp_losses, fsdp_programs = fit(fsdp, x, y)
print("FSDPv2 losses", np.round(fsdp_losses, 4), "| collectives:", collectives(fsdp_programs[-1]).kinds)
assert spec_of(fsdp.module.fc1.weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"  # (64, 32): rows over 'fsdp'
fsdp_kinds = collectives(fsdp_programs[-1]).kinds
assert "all-gather" in fsdp_kinds  # the weights, gathered before use
assert fsdp_kinds & {"reduce-scatter", "all-reduce"}  # the gradients, summed over the devices
np.testing.assert_allclose(fsdp_losses, dp_losses_xla, rtol=1e-5)

# %% [markdown]
# ### 10.4 `torch.compile`
#
# `torch.compile(model, backend="openxla")` (Dynamo) traces once and reruns XLA's program without
# tracing, as `jax.jit` does, and it keeps the annotations. So use it where tracing every step costs time.
# The test is the tensor-parallel forward of section 7, called twice: the second call compiles nothing.

# %%
torch_xla_programs()
compiled_model = torch.compile(torch_model(tp_specs_torch, xmesh_tp), backend="openxla")
logits = compiled_model(x_xla)
assert_close(logits.detach().cpu().numpy(), reference, atol=RTOL)
dynamo_ops = [op for program in torch_xla_programs() for op in ops(program)]
print("collectives:", dynamo_ops)
assert ("all-reduce", "f32[32,8]", 8) in dynamo_ops  # the row-parallel sum, as without Dynamo
again = compiled_model(x_xla)
assert_close(again.detach().cpu().numpy(), reference, atol=RTOL)
assert torch_xla_programs() == []  # no new program: the second call reran the first one

# %% [markdown]
# ### 10.5 Three twins that need TPUs or several hosts
#
# These cannot run in this notebook:
#
# | twin | what it does | why not here |
# |---|---|---|
# | `xr.use_spmd(auto=True)` | XLA's auto-sharding chooses the layouts | experimental, and torch_xla 2.9 supports it on XLA:TPU on a single TPU VM host only |
# | `xs.HybridMesh` | orders devices by TPU chip coordinates, like `jax.make_mesh`; with `dcn_mesh_shape`, like `mesh_utils.create_hybrid_device_mesh` | it asserts that it runs on TPU (below) |
# | one process per host | the multi-host launch (notebook 23 for JAX) | one machine |
#
# JAX's `jit` has no automatic mode: you state shardings and the compiler propagates them. `HybridMesh`
# multiplies the slow (DCN) shape into each axis, `ici_mesh_shape[i] * dcn_mesh_shape[i]`, so the links
# between slices can fall on any axis, or on several, as in JAX's function.

# %%
try:
    xs.HybridMesh(ici_mesh_shape=(4, 2), axis_names=("data", "model"))
    hybrid = "built"
except AssertionError:
    hybrid = "AssertionError"
print("HybridMesh on CPU:", hybrid)
assert hybrid == "AssertionError"

# %% [markdown]
# **Several hosts.** Start the script once per host. On a TPU slice that is `gcloud compute tpus tpu-vm ssh
# NAME --worker=all --command="PJRT_DEVICE=TPU python train.py"`, as for JAX in notebook 23. There is no GPU
# line for 2.9, because PyTorch/XLA 2.9 dropped CUDA (deprecated since 2.8): its runtime creates CPU, TPU,
# XPU and Neuron clients only. With 2.8 or earlier a GPU job started one process per host with
# `PJRT_DEVICE=CUDA torchrun --nnodes=2 --node_rank=R --nproc_per_node=1 --rdzv_endpoint=HOST0:PORT train.py`.
#
# Both runtimes share this process only because both run on CPU devices. On TPUs give each framework a
# process of its own, since each loads the TPU runtime (libtpu), which takes the chips for its process.
#
# ## 11. Translation table
#
# | | JAX | PyTorch/XLA 2.9 |
# |---|---|---|
# | SPMD | always | `xr.use_spmd()` first |
# | devices | `jax.devices()`: 8 | `torch_xla.device()`: `xla:0` |
# | mesh | `Mesh(devices.reshape(4, 2), ('data', 'model'))` | `Mesh(np.arange(8), (4, 2), ('data', 'model'))` |
# | mesh in chip order | `jax.make_mesh` | `xs.HybridMesh` (TPU) |
# | a mesh for calls that name none | `jax.set_mesh(mesh)`: bare `P` in `device_put`, `reshard`, constraints; `shard_map` | `xs.set_global_mesh(mesh)`: manual sharding, FSDPv2 |
# | spec | `P(None, 'data')` | `(None, 'data')`, every dimension |
# | place | `jax.device_put(x, NamedSharding(mesh, spec))` | `xs.mark_sharding(t, mesh, spec)` |
# | re-place | `jax.device_put` again | `xs.clear_sharding`, then `mark_sharding` |
# | activation | `jax.lax.with_sharding_constraint` | `xs.mark_sharding` in `forward` |
# | per-device code | `jax.shard_map` | `xs.enable_manual_sharding` |
# | a sum inside it | `jax.lax.psum(x, 'data')` | none public: `torch_xla._XLAC._xla_spmd_all_reduce` (private) |
# | inspect | `x.sharding` | `torch_xla._XLAC._get_xla_sharding_spec(t)` |
# | compiled program | `.compile().as_text()` | `XLA_FLAGS=--xla_dump_to=DIR` |
# | compile once | `jax.jit` | `torch.compile(model, backend="openxla")` |
# | partitioner | Shardy | GSPMD |
# | FSDP | parameter specs (notebook 10) | `SpmdFullyShardedDataParallel` |
# | process, its devices | `jax.process_index()`, `jax.local_device_count()` | `xr.process_index()`, `xr.addressable_runtime_device_count()` |
# | per-host data | `jax.make_array_from_process_local_data` | `MpDeviceLoader(..., input_sharding=...)` |
# | multi-slice mesh | `mesh_utils.create_hybrid_device_mesh` | `xs.HybridMesh(..., dcn_mesh_shape=...)` (TPU) |
# | checkpoint | Orbax | `torch.distributed.checkpoint`, SPMD planners |
# | DTensor-style placement | (none) | `xs.xla_distribute_tensor`, `xs.xla_distribute_module` |

# %% [markdown]
# ## Takeaways
# - `xs.mark_sharding(t, mesh, (None, 'data'))` and `jax.device_put(x, NamedSharding(mesh, P(None, 'data')))`
#   put the same block on the same device: torch_xla's spec string is the `HloSharding` JAX builds too.
# - torch_xla's rules: `xr.use_spmd()` comes first, there is one logical device `xla:0`, a spec has one
#   entry per dimension, and a tensor keeps one annotation until `clear_sharding`.
# - `mark_sharding` inside `forward` is `with_sharding_constraint`: an instruction, even where it costs an
#   all-gather.
# - The same MLP trains to the same losses in both, also under FSDPv2. Tensor parallelism gets the same
#   collectives, and data parallelism the same gradient bytes, packed differently.
# - Multi-host calls, manual sharding and compiling once translate one to one. The global mesh serves
#   fewer calls than `jax.set_mesh`.
# - In one process, every `mark_sharding` turns JAX's Shardy off, so switch it back before JAX compiles.

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** The tensor-parallel model marks `fc2.weight` of `nn.Linear(64, 8)` with
# `xs.mark_sharding(model.fc2.weight, xmesh_tp, (None, 'model'))`. Which `PartitionSpec` gives the JAX
# kernel `w2`, shape `(64, 8)`, the same layout?

# %%
from spmd_course.exercises import ex24_pytorch_xla as ex

answer_1 = NOT_ANSWERED  # e.g. P(...)
ex.linear_weight_spec.check(answer_1);

# %% [markdown]
# **Exercise 2.** On the `(4, 2)` mesh `xmesh`, torch_xla prints
# `{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}` for an `(8, 16)` tensor. Which partition-spec
# tuple was it marked with?

# %%
answer_2 = NOT_ANSWERED  # a tuple such as ('data', None)
ex.spec_from_string.check(answer_2);

# %% [markdown]
# **Exercise 3.** Predict the string `spec_of(u)` prints after `xs.mark_sharding(u, xmesh, (None, 'model'))`
# for an `(8, 16)` tensor `u`. Then check it with torch_xla if you like.

# %%
answer_3 = NOT_ANSWERED  # a string such as '{devices=[...]...}'
ex.string_from_spec.check(answer_3);

# %% [markdown]
# **Next:** [25 · Plan a run](25_plan_a_run.ipynb)
