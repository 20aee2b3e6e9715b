# %% [markdown]
# # 18 · PyTorch/XLA side by side
#
# *Runs locally only:* `make lab-xla` (PyTorch/XLA needs its own environment, about 4 GB).
#
# PyTorch/XLA shards a PyTorch program with the same compiler that shards a JAX program: XLA. Its SPMD
# guide teaches five constructs: SPMD mode, a mesh, partition specs, `mark_sharding` and sharding
# annotations on activations. This notebook runs every one of them next to its JAX twin, in one
# Python process, and checks that the two frameworks put the same block on the same device, train
# the same MLP to the same losses, and make the compiler insert the same collectives. It ends with a
# translation table.
#
# This notebook needs its own environment. PyPI's newest torch-xla (2.9.0) pairs with torch 2.9.0, and
# on x86_64 PyPI serves only the CUDA build of that torch: about 4 GB to download, although no GPU is
# used here. So the course keeps it out of the main environment: `make lab-xla` opens this notebook in
# `.venv-xla` (Python 3.11, hence JAX 0.10.2 on the JAX side), and `make test-xla` tests it.
#
# **You will learn**
# - the PyTorch/XLA way to shard: `xr.use_spmd()`, `Mesh(device_ids, mesh_shape, axis_names)`,
#   `xs.mark_sharding(t, mesh, ('data', None))`, and the JAX call that does the same;
# - how to read torch_xla's sharding string, `{devices=[4,2]0,1,2,3,4,5,6,7}`, and why JAX builds the
#   very same HLO sharding;
# - where the PyTorch/XLA guide is wrong or out of date today, each case run and explained;
# - that a data-parallel and a tensor-parallel MLP give the same losses and the same collectives in both;
# - what changes when both frameworks share one process (torch_xla switches JAX's partitioner).

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
import importlib.util
import os
import re
import tempfile
from collections import OrderedDict
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import NOT_ANSWERED, collectives, draw_mesh, draw_sharding, tile_labels, type_string

if importlib.util.find_spec("torch_xla") is None:
    raise ModuleNotFoundError(
        "This notebook needs PyTorch/XLA (torch 2.9.0 and torch-xla 2.9.0), which is not installed in this "
        "kernel's environment. The course keeps it in its own environment, .venv-xla: from the course's "
        "folder, run `make lab-xla` to open this notebook there, or `make test-xla` to test it. Elsewhere: "
        "`pip install -r requirements-xla.txt` (Python 3.10 to 3.13), then restart the kernel."
    )

# %% [markdown]
# ## 1. Eight devices for torch_xla, and its compiler's output
#
# The setup cell gave JAX 8 simulated CPU devices. torch_xla has its own runtime (its own copy of XLA) and
# its own way to ask for devices: the environment variables `PJRT_DEVICE=CPU` and `CPU_NUM_DEVICES=8`,
# read once, when its runtime starts. (`XLA_FLAGS=--xla_force_host_platform_device_count=8`, which older
# JAX tutorials use, is ignored by torch_xla: you would get 1 device.) So set them before the import.
#
# JAX hands you the partitioned program (`jax.jit(f).lower(...).compile().as_text()`); torch_xla has no
# Python call for it. Its XLA can write every program it compiles to a folder instead: `XLA_FLAGS` with
# `--xla_dump_to`, also set before torch_xla starts. JAX read `XLA_FLAGS` when the setup cell started it,
# so JAX is not affected.

# %%
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "8")
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
assert jax.device_count() == 8

# %% [markdown]
# Both runtimes have 8 CPU devices, side by side in one process. One helper reads torch_xla's compiled
# programs back from the dump folder. It returns the partitioned HLO text, which `collectives` reads just
# as it reads JAX's compiled programs:

# %%
_seen = set()


def torch_xla_programs():
    """HLO text of every program torch_xla compiled since the last call, after partitioning."""
    new = sorted(set(DUMP.glob("*after_optimizations.txt")) - _seen)
    _seen.update(new)
    return [path.read_text() for path in new]


# %% [markdown]
# ## 2. SPMD mode: one logical device
#
# JAX has no mode: any `jax.Array` can be sharded over `jax.devices()`. PyTorch/XLA starts in a mode where
# each process drives one device; `xr.use_spmd()` switches it to SPMD, and the guide says to call it first.
# It understates the danger. With torch_xla 2.9.0:
#
# - `xs.mark_sharding` before `xr.use_spmd()` raises `RuntimeError: Check failed: UseVirtualDevice(): Please
#   enable SPMD via torch_xla.runtime.use_spmd()`;
# - calling `xr.use_spmd()` after that, or after anything that touched the XLA device (even a bare
#   `torch_xla.device()` call, or the guide's `xm.xla_device()`), warns "Replicating tensors already
#   initialized on non-virtual XLA device" and leaves the runtime broken: the next time torch_xla runs a
#   program, the Python process dies with a segmentation fault.
#
# So this notebook does not replay that mistake: it would take the kernel down. Asking for the device count,
# as section 1 did, is safe. Switch SPMD on before any tensor goes to the device:

# %%
spmd_before = xr.is_spmd()
xr.use_spmd()
device = torch_xla.device()
print("SPMD before:", spmd_before, "| after:", xr.is_spmd())
print("torch_xla device:", device, "| real devices behind it:", xr.global_runtime_device_count())
print("jax devices:", jax.devices())
assert spmd_before is False and xr.is_spmd() is True
assert str(device) == "xla:0"
assert len(jax.devices()) == 8

# %% [markdown]
# In SPMD mode PyTorch code sees **one** device, `xla:0`, that stands for all 8: you write the program for
# one big device, and `mark_sharding` says how its tensors are cut. (`torch_xla.device()` is today's name
# for the guide's `xm.xla_device()`, which warns that it is deprecated.) In JAX, `jax.devices()` always
# lists all 8.

# %% [markdown]
# ## 3. The mesh
#
# `Mesh(device_ids, mesh_shape, axis_names)` arranges device ids in a grid with named axes; its JAX twin is
# `jax.make_mesh(mesh_shape, axis_names, axis_types=...)`, which picks the device order itself. Build the
# guide's `(num_devices, 1)` mesh; the guide says `mesh.shape()` then prints
# `OrderedDict([('data', 4), ('model', 1)])`:

# %%
num_devices = xr.global_runtime_device_count()
mesh_shape = (num_devices, 1)
device_ids = np.array(range(num_devices))
mesh = Mesh(device_ids, mesh_shape, ("data", "model"))  # the guide's code
print("torch_xla:", mesh.shape())
jmesh = jax.make_mesh((8, 1), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
print("jax:      ", jmesh.shape)

guide_says = OrderedDict([("data", 4), ("model", 1)])
assert mesh.shape() == OrderedDict([("data", 8), ("model", 1)]) != guide_says
assert dict(jmesh.shape) == dict(mesh.shape())
jax_ids = np.vectorize(lambda d: d.id)(jmesh.devices)
np.testing.assert_array_equal(mesh.get_logical_mesh(), jax_ids)  # the same device at every mesh position

# %% [markdown]
# With `(num_devices, 1)` the `data` axis always has every device, here 8. The guide's `('data', 4)` is what
# its code prints only on a machine with 4 devices, where "each device holds 1/8-th" (its next comment)
# would be wrong instead. The two meshes agree:
# same axis sizes, same device at each position. In torch_xla the mesh is ordinary Python data, passed
# to each `mark_sharding` call. In JAX it lives inside each `NamedSharding`, or applies to a whole block of
# code under `jax.set_mesh`.
#
# The guide's mesh leaves `model` with size 1, so `model` splits nothing. For the rest of the notebook
# use a `(4, 2)` mesh in both frameworks, where both axes matter:

# %%
xmesh = Mesh(np.arange(8), (4, 2), ("data", "model"))  # x for torch_xla
jmesh42 = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))  # j for JAX
print(xmesh.get_logical_mesh())
np.testing.assert_array_equal(xmesh.get_logical_mesh(), np.vectorize(lambda d: d.id)(jmesh42.devices))
draw_mesh(jmesh42)


# %% [markdown]
# ## 4. Partition specs: `mark_sharding` and `device_put`
#
# A PyTorch/XLA partition spec is a plain tuple with **exactly one entry per tensor dimension**: a mesh
# axis name, a tuple of names, or `None` (not split). `xs.mark_sharding(t, mesh, spec)` annotates the
# tensor in place (and returns it wrapped as an `XLAShardedTensor`). The JAX twin is
# `jax.device_put(x, NamedSharding(mesh, P(...)))`, which returns a new, placed array.
#
# Four helpers check where the blocks went. torch_xla answers in two ways: its sharding string (the
# `HloSharding` that XLA itself uses) and `local_shards`, one piece of data per device. JAX answers with
# `addressable_shards`. Each helper maps a device id to the block it holds, as `(start, stop)` per dimension:

# %%
def spec_of(t):
    """torch_xla's sharding string of a tensor, such as '{devices=[4,2]0,1,2,3,4,5,6,7}'."""
    return torch_xla._XLAC._get_xla_sharding_spec(t)


def blocks_from_spec(spec, shape):
    """Device -> block, read from a sharding string (what XLA was told)."""
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
# First the guide's first example, on its `(8, 1)` mesh: "each device holds 1/8-th of the input".

# %%
data = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
t = torch.from_numpy(data).to(device)
st = xs.mark_sharding(t, mesh, ("data", "model"))
x = jax.device_put(data, NamedSharding(jmesh, P("data", "model")))

print("torch_xla:", spec_of(t), "| blocks", {tuple(s.data.shape) for s in st.local_shards})
print("jax:      ", type_string(x), "| blocks", {s.data.shape for s in x.addressable_shards})
print("jax's x.sharding:", x.sharding)
assert blocks_from_spec(spec_of(t), t.shape) == blocks_from_local_shards(st) == blocks_of_jax(x)
assert {s.data.shape for s in x.addressable_shards} == {(1, 4)}

# %% [markdown]
# One row of 4 per device, the same row on the same device in both frameworks. (The first `mark_sharding`
# prints a warning about TensorFlow on stderr: torch_xla loaded its bridge to JAX, which imports Flax, which
# looks for TensorFlow. Section 6 shows what else that bridge does.) Now the guide's other
# examples, on the `(4, 2)` mesh: a `(8, 8, 16)` tensor with its first dimension whole, and a 1-D tensor
# split over `data` only, then over both axes. The spec strings follow a fixed pattern: `devices=[...]`
# lists how many blocks each dimension is cut into, and then, with `last_tile_dim_replicate`, how many
# copies each block has; the device ids follow, block after block.

# %%
examples = [
    ("t1", (8, 8, 16), (None, "data", "model")),
    ("t2", (8,), ("data",)),
    ("t3", (8,), (("data", "model"),)),
]
xla_tensors, jax_arrays = {}, {}
for name, shape, spec in examples:
    values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    t = torch.from_numpy(values).to(device)
    st = xs.mark_sharding(t, xmesh, spec)
    x = jax.device_put(values, NamedSharding(jmesh42, P(*spec)))
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
# Every device holds the same block in both frameworks, with the same numbers in it:
# - `t1`: `(None, 'data', 'model')` gives `(8, 2, 8)` blocks, `[1,4,2]` blocks per dimension, no copies;
# - `t2`: `('data',)` cuts 8 elements into 4 blocks of 2, and `[4,2] ... last_tile_dim_replicate` says each
#   block has 2 copies: the guide's "model dimension is used for replication when omitted";
# - `t3`: `(('data', 'model'),)` cuts one dimension over both axes, 8 blocks of 1, `data` the major axis
#   (the same as `P(('data', 'model'))` in JAX).
#
# The sharding string is XLA's own `HloSharding`, and JAX builds the same object. JAX does not show it in
# its public API (`x.sharding` prints a `NamedSharding`), but a private method returns it. JAX writes the
# device list in a compressed form, `<=[8]`, which means the ids 0 to 7 in order:

# %%
for name, shape, _ in examples:
    hlo = jax_arrays[name].sharding._to_xla_hlo_sharding(len(shape))  # private: may change without notice
    counts, ids = re.fullmatch(r"\{devices=\[([\d,]+)\]([\d,]+).*", spec_of(xla_tensors[name])).groups()
    print(f"{name}  jax {hlo!s:<48} torch_xla {spec_of(xla_tensors[name])}")
    assert hlo.tile_assignment_dimensions() == [int(v) for v in counts.split(",")]
    assert hlo.tile_assignment_devices() == [int(v) for v in ids.split(",")]

# %% [markdown]
# ### Gotcha: the guide shards `t2` twice, and the second call fails
#
# The guide's code calls `mark_sharding` on the same `t2` with `('data',)` and then with
# `(('data', 'model'),)`. Run it as written:

# %%
raised = []
t2 = torch.randn(8).to(device)
xs.mark_sharding(t2, xmesh, ("data",))
try:
    xs.mark_sharding(t2, xmesh, (("data", "model"),))
except RuntimeError as err:
    raised.append("second mark_sharding")
    print("RuntimeError:", str(err).split(": goo.gle")[0])  # the rest is a link and a dump of the old annotation

xs.clear_sharding(t2)  # the fix: clear the annotation first (or shard a fresh tensor)
xs.mark_sharding(t2, xmesh, (("data", "model"),))
print("after clear_sharding:", spec_of(t2))
assert raised == ["second mark_sharding"]
assert spec_of(t2) == "{devices=[8]0,1,2,3,4,5,6,7}"

# %% [markdown]
# A torch_xla tensor carries one annotation; a second `mark_sharding` is refused until `clear_sharding`
# removes the first. In JAX the question does not arise: `jax.device_put` returns a new array and never
# changes the old one.
#
# ### Gotcha: a spec shorter than the tensor
#
# JAX lets you leave out trailing dimensions: `P('data')` on a 2-D array means `P('data', None)`.
# torch_xla does not:

# %%
t = torch.zeros(8, 16).to(device)
try:
    xs.mark_sharding(t, xmesh, ("data",))
except AssertionError as err:
    raised.append("short spec")
    print("AssertionError:", err)
x = jax.device_put(np.zeros((8, 16), np.float32), NamedSharding(jmesh42, P("data")))
print("jax accepts P('data'):", type_string(x))
assert raised[-1] == "short spec" and x.sharding.shard_shape(x.shape) == (2, 16)

# %% [markdown]
# When translating from JAX, pad the tuple with `None`s to the tensor's rank: `('data', None)`.

# %% [markdown]
# ## 5. Pictures: `visualize_tensor_sharding` and `draw_sharding`
#
# The guide's picture tool is `visualize_tensor_sharding(t)`. It prints the spec string and a `rich` table
# of devices, and returns the table. It draws 2-D tensors correctly:

# %%
t = torch.zeros(8, 16).to(device)
xs.mark_sharding(t, xmesh, ("data", "model"))
table = visualize_tensor_sharding(t, use_color=False)
assert table.row_count == 4 and len(table.columns) == 2  # 4 x 2 blocks: right

# %% [markdown]
# ### Gotcha: `visualize_tensor_sharding` is only right in 2-D
#
# It reads only the first two block counts of the spec string. Feed it the guide's 3-D and 1-D tensors:

# %%
outcome = {}
for name in ("t1", "t3"):
    try:
        table = visualize_tensor_sharding(xla_tensors[name], use_color=False)
        outcome[name] = f"a table of {table.row_count * len(table.columns)} cells"
    except ValueError as err:
        outcome[name] = f"ValueError: {err.args[0]}{err.args[1]}{err.args[2]}"
print(outcome)
assert outcome == {"t1": "a table of 4 cells",
                   "t3": "ValueError: sharding {devices=[8]0,1,2,3,4,5,6,7} is not organized as expected"}

# %% [markdown]
# For `t1` it draws devices 0 to 3 and nothing else: the split of the last dimension over `model` is
# missing, so the picture shows 4 blocks where there are 8, and devices 4 to 7 vanish. For the 1-D `t3` it
# raises. The course's `draw_sharding` draws arrays of any rank: the last two dimensions, with one panel per
# block of the others (here dimension 0 is whole: one panel). It labels each block with its devices and
# shape, and returns a figure the notebook can check:

# %%
fig = draw_sharding(jax_arrays["t1"])
labels = tile_labels(fig)
assert len(labels) == 8 and all("(8, 2, 8)" in label for label in labels)
assert {label.split("\n")[0] for label in labels} == {f"dev {d}" for d in range(8)}
fig


# %% [markdown]
# ## 6. One MLP in both frameworks
#
# The rest of the notebook compares programs, not just layouts. The model is a small MLP, 32 inputs, 64
# hidden units, 8 classes, written once as a `torch.nn.Module` and once as a JAX function. The module
# optionally annotates its hidden activation with `mark_sharding` inside `forward`: the guide's
# "sharding annotations on activations", the twin of `jax.lax.with_sharding_constraint`.
#
# One difference matters for every spec below: `nn.Linear(32, 64).weight` has shape `(64, 32)`,
# **(out, in)**, and computes `x @ weight.T`; the JAX kernel is `(32, 64)`, **(in, out)**. The same layout
# therefore has transposed specs in the two frameworks.

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
# ### Gotcha: `mark_sharding` switches JAX to GSPMD
#
# XLA has two partitioners: GSPMD, the original, and Shardy, its successor and JAX's default today (flag
# `jax_use_shardy_partitioner`). torch_xla 2.9 still uses GSPMD. Each `xs.mark_sharding` call also looks
# for an installed JAX (torch_xla can hand work to it) and, in passing, sets that JAX flag to `False`, for
# the whole process. Watch it happen:

# %%
jax.config.update("jax_use_shardy_partitioner", True)
before = jax.config.jax_use_shardy_partitioner
xs.mark_sharding(torch.zeros(8, 8).to(device), xmesh, ("data", None))
after = jax.config.jax_use_shardy_partitioner
print("jax_use_shardy_partitioner before mark_sharding:", before, "| after:", after)
assert before is True and after is False

# %% [markdown]
# From then on, every JAX program this process compiles goes through GSPMD too, silently (with the XLA
# warning "GSPMD sharding propagation is going to be deprecated" on stderr, unless `TF_CPP_MIN_LOG_LEVEL=2`
# was set before the kernel started; `make lab-xla` and `make test-xla` set it). For the small programs of
# this notebook both partitioners produce the same collectives, and section 8 checks that. Still, JAX should
# run as it does everywhere else in the course. The fix is one line, `jax.config.update(
# "jax_use_shardy_partitioner", True)`, but it holds only until the next `mark_sharding`: every JAX compile
# from here on comes right after it, and checks that the lowered program carries Shardy's `sdy.sharding`
# annotations.

# %% [markdown]
# ## 7. Sharding an activation
#
# Put the MLP in tensor-parallel layout on a `(1, 8)` mesh (all 8 devices on `model`): the first layer
# column-parallel, the second row-parallel, as in notebook 08. In torch terms, `fc1.weight` `(64, 32)` is
# split on its rows, `('model', None)`; in JAX terms, `w1` `(32, 64)` on its columns, `P(None, 'model')`.
# The batch is replicated.

# %%
xmesh_tp = Mesh(np.arange(8), (1, 8), ("data", "model"))
jmesh_tp = jax.make_mesh((1, 8), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
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


# %% [markdown]
# Now the forward pass three ways: with no annotation on the hidden activation `h` (the compiler chooses),
# with `h` annotated as split on `model` (the layout it has anyway), and with `h` annotated as replicated.
# torch_xla compiles when a result is needed (`torch_xla.sync()` here); JAX compiles at `.compile()`:

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

    jax.config.update("jax_use_shardy_partitioner", True)  # mark_sharding just switched it off (section 6)
    constraint = None if hidden is None else NamedSharding(jmesh_tp, P(*hidden))
    forward = jax.jit(lambda params, x, constraint=constraint: mlp(params, x, constraint))
    params = jax_params(tp_specs_jax, jmesh_tp)
    lowered = forward.lower(params, x_jax)
    assert "sdy.sharding" in lowered.as_text()  # Shardy's annotations: JAX compiles as it does elsewhere
    compiled = lowered.compile()

    ops_xla, ops_jax = collectives(program), collectives(compiled)
    forward_ops[label] = ops_xla, ops_jax
    print(f"{label}:\n torch_xla {[(o.kind, o.result_type) for o in ops_xla.ops]}\n"
          f" jax       {[(o.kind, o.result_type) for o in ops_jax.ops]}")
    assert [(o.kind, o.result_type, o.group_size) for o in ops_xla.ops] == \
           [(o.kind, o.result_type, o.group_size) for o in ops_jax.ops]
    np.testing.assert_allclose(logits.detach().cpu().numpy(), reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(compiled(params, x_jax)), reference, rtol=1e-5, atol=1e-5)

assert forward_ops["no annotation"][0].counts == forward_ops["h on model"][0].counts
assert forward_ops["h on model"][0].kinds == {"all-reduce"}
assert forward_ops["h replicated"][0].kinds == {"all-gather", "all-reduce"}
# JAX compiled three programs above, but none went to the dump folder: JAX had read XLA_FLAGS before
dumped = [p.name for p in DUMP.glob("*after_optimizations.txt")]
assert dumped and not any("jit_" in name for name in dumped), dumped


# %% [markdown]
# In both frameworks, with the same result types on all 8 devices:
# - without an annotation, or with the one the compiler would choose anyway, the forward pass needs one
#   all-reduce: the `(32, 8)` partial logits of the row-parallel layer are summed (notebook 08);
# - annotating `h` as replicated is obeyed even though it helps nothing: the compiler all-gathers the
#   `(32, 64)` activation, then uses only its own 8 columns of it and still all-reduces the logits.
#
# An annotation on an activation is an instruction, not a hint, in both frameworks. The logits are the
# unsharded model's every time.

# %% [markdown]
# ## 8. Training: data parallel and tensor parallel
#
# The same MLP trained for three steps of plain SGD (learning rate 0.1) from the same starting weights, on
# the same batch, in four ways: data parallel on the guide's `(8, 1)` mesh (batch split over `data`,
# parameters replicated, which is what an unmarked parameter is in SPMD mode) and tensor parallel on the
# `(1, 8)` mesh, each in torch_xla and in JAX. For torch_xla the loop is ordinary PyTorch; the program is
# compiled and run at `torch_xla.sync()`.

# %%
def train_torch(specs, mesh, batch_spec, steps=3):
    model = torch_model(specs, mesh)
    x, y = torch.from_numpy(X).to(device), torch.from_numpy(Y).to(device)
    if batch_spec is not None:
        xs.mark_sharding(x, mesh, batch_spec)
        xs.mark_sharding(y, mesh, batch_spec[:1])
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
    return losses, torch_xla_programs(), model


def sgd_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


train_step = jax.jit(sgd_step)


def train_jax(specs, mesh, batch_spec, steps=3):
    jax.config.update("jax_use_shardy_partitioner", True)  # undo torch_xla's switch (section 6)
    params = jax_params(specs, mesh)
    x = jax.device_put(X, NamedSharding(mesh, P(*batch_spec) if batch_spec else P()))
    y = jax.device_put(Y.astype(np.int32), NamedSharding(mesh, P(batch_spec[0]) if batch_spec else P()))
    lowered = train_step.lower(params, x, y)
    assert "sdy.sharding" in lowered.as_text()  # compiled by Shardy
    compiled = lowered.compile()
    losses = []
    for _ in range(steps):
        params, loss = compiled(params, x, y)
        losses.append(float(loss))
    return losses, compiled, params


dp_losses_xla, dp_programs, _ = train_torch({}, mesh, ("data", None))  # no parameter marked: all replicated
dp_losses_jax, dp_compiled, _ = train_jax(dict.fromkeys(params0, P()), jmesh, ("data", None))
tp_losses_xla, tp_programs, model_tp = train_torch(tp_specs_torch, xmesh_tp, None)
tp_losses_jax, tp_compiled, params_tp = train_jax(tp_specs_jax, jmesh_tp, None)

print("data parallel   torch_xla", np.round(dp_losses_xla, 4), " jax", np.round(dp_losses_jax, 4))
print("tensor parallel torch_xla", np.round(tp_losses_xla, 4), " jax", np.round(tp_losses_jax, 4))
np.testing.assert_allclose(dp_losses_xla, dp_losses_jax, rtol=1e-5)
np.testing.assert_allclose(tp_losses_xla, tp_losses_jax, rtol=1e-5)
np.testing.assert_allclose(dp_losses_xla, tp_losses_xla, rtol=1e-5)
assert dp_losses_xla[-1] < dp_losses_xla[0]  # it learns

# %% [markdown]
# The same losses in all four runs, to within 1e-5 (relative). The trained weights agree too, and
# each framework kept the tensor-parallel layout through the updates:

# %%
np.testing.assert_allclose(model_tp.fc1.weight.detach().cpu().numpy().T, np.asarray(params_tp["w1"]), rtol=1e-5,
                           atol=1e-6)
np.testing.assert_allclose(model_tp.fc2.weight.detach().cpu().numpy().T, np.asarray(params_tp["w2"]), rtol=1e-5,
                           atol=1e-6)
print("fc1.weight", spec_of(model_tp.fc1.weight), "| w1", params_tp["w1"].sharding.spec)
print("fc2.weight", spec_of(model_tp.fc2.weight), "| w2", params_tp["w2"].sharding.spec)
assert spec_of(model_tp.fc1.weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
assert params_tp["w1"].sharding.is_equivalent_to(NamedSharding(jmesh_tp, P(None, "model")), 2)

# %% [markdown]
# Now the collectives. torch_xla traces the Python loop again at every step, but compiles only when the
# traced graph is new: here two programs for data parallel (its first step's graph differs slightly from
# the later ones, which are all the same) and one for tensor parallel. The asserts below check every one of
# them. JAX compiled its step once, explicitly:

# %%
print("programs compiled by torch_xla: data parallel", len(dp_programs), "| tensor parallel", len(tp_programs))
assert 1 <= len(dp_programs) <= 2 and 1 <= len(tp_programs) <= 2
print("data parallel, torch_xla (last program):", collectives(dp_programs[-1]), sep="\n")
print("data parallel, jax:", collectives(dp_compiled), sep="\n")
print("tensor parallel, torch_xla (last program):", collectives(tp_programs[-1]), sep="\n")
print("tensor parallel, jax:", collectives(tp_compiled), sep="\n")

# %% [markdown]
# **Tensor parallel**: identical. One all-reduce of the `(32, 8)` partial logits over the 8 devices of
# `model`, and nothing else; the weight gradients stay where their weights are.
#
# **Data parallel**: the same kind, all-reduce over the 8 devices of `data`, and the same bytes, but not the
# same number of ops. JAX's XLA combined all the gradients and the loss into **one** all-reduce of a tuple;
# torch_xla's own (older) copy of XLA leaves one all-reduce per gradient, plus three scalars where JAX has
# one: PyTorch's cross-entropy divides a sum of losses by the number of labels that are not `ignore_index`,
# and the partitioned program all-reduces the sum once and that count twice. The gradient bytes are the
# same, because they are the same gradients:

# %%
n_params = sum(v.size for v in params0.values())
# the unmarked fc1.weight entered torch_xla's data-parallel program replicated:
assert re.search(r"f32\[64,32\]\{1,0\} parameter\(\d+\), sharding=\{replicated\}", dp_programs[0])
for program in dp_programs:
    ops = collectives(program)
    assert ops.kinds == collectives(dp_compiled).kinds == {"all-reduce"}
    assert {op.group_size for op in ops.ops} == {8}
    assert sum(op.result_bytes for op in ops.ops if op.result_type != "f32[]") == 4 * n_params
    assert [op.result_type for op in ops.ops].count("f32[]") == 3  # the loss's sum, and its count twice
assert collectives(dp_compiled).count() == 1 and collectives(dp_compiled).result_bytes == 4 * (n_params + 1)
tp_ops_jax = [(o.kind, o.result_type, o.group_size) for o in collectives(tp_compiled).ops]
assert tp_ops_jax == [("all-reduce", "f32[32,8]", 8)]
for program in tp_programs:
    assert [(o.kind, o.result_type, o.group_size) for o in collectives(program).ops] == tp_ops_jax
print(f"gradient bytes all-reduced per step: {4 * n_params} ({n_params} parameters) in both")

# %% [markdown]
# Finally the check promised in section 6: JAX compiled with GSPMD, as torch_xla had silently switched it,
# inserts the same collectives as with Shardy for both train steps:

# %%
for label, specs, jm, batch_spec in [("data parallel", dict.fromkeys(params0, P()), jmesh, ("data", None)),
                                     ("tensor parallel", tp_specs_jax, jmesh_tp, None)]:
    args = (jax_params(specs, jm), jax.device_put(X, NamedSharding(jm, P(*batch_spec) if batch_spec else P())),
            jax.device_put(Y.astype(np.int32), NamedSharding(jm, P(batch_spec[0]) if batch_spec else P())))
    found = {}
    for partitioner, use_shardy in [("GSPMD", False), ("Shardy", True)]:
        jax.config.update("jax_use_shardy_partitioner", use_shardy)
        lowered = jax.jit(sgd_step).lower(*args)
        assert ("sdy.sharding" in lowered.as_text()) == use_shardy  # the partitioner really changed
        found[partitioner] = [(o.kind, o.result_type, o.group_size) for o in collectives(lowered.compile()).ops]
    print(f"{label:<16} GSPMD {found['GSPMD']}\n{'':<16} Shardy {found['Shardy']}")
    assert found["GSPMD"] == found["Shardy"]

# %% [markdown]
# ## 9. Translation table
#
# | | JAX | PyTorch/XLA 2.9 |
# |---|---|---|
# | 8 CPU devices | `jax.config.update("jax_num_cpu_devices", 8)` before the first JAX operation (the setup cell) | `PJRT_DEVICE=CPU`, `CPU_NUM_DEVICES=8` before the import |
# | SPMD on | always | `xr.use_spmd()`, before any tensor reaches the device |
# | devices your code sees | `jax.devices()`: all 8 | `torch_xla.device()`: one, `xla:0`; `xr.global_runtime_device_count()` is 8 |
# | mesh | `jax.make_mesh((4, 2), ('data', 'model'), axis_types=...)` | `Mesh(np.arange(8), (4, 2), ('data', 'model'))` |
# | mesh sizes | `mesh.shape` | `mesh.shape()` |
# | spec | `P(None, 'data')`; trailing `None`s may be left out | `(None, 'data')`: one entry per dimension, always |
# | place an array | `jax.device_put(x, NamedSharding(mesh, P(...)))` returns a new array | `xs.mark_sharding(t, mesh, spec)` annotates `t` in place |
# | change a layout | `jax.device_put` again (or `jax.reshard` on Explicit axes) | `xs.clear_sharding(t)`, then `mark_sharding` |
# | annotate an activation | `jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(...)))` | `xs.mark_sharding(h, mesh, spec)` inside `forward` |
# | inspect | `x.sharding`, `x.addressable_shards`, `type_string(x)` | `torch_xla._XLAC._get_xla_sharding_spec(t)`, `xs.mark_sharding(...).local_shards` |
# | picture | `draw_sharding(x)` (course utils, any rank) | `visualize_tensor_sharding(t)` (2-D only) |
# | when it compiles | at `jax.jit(f)(...)` or `.lower(...).compile()` | lazily, at `torch_xla.sync()` or when a value is read (`.item()`) |
# | partitioned program | `jax.jit(f).lower(*args).compile().as_text()` | `XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text"` before the import, then `DIR/*after_optimizations.txt` |
# | partitioner | Shardy (GSPMD before) | GSPMD |
# | dense layer | kernel `(in, out)`: column-parallel is `P(None, 'model')` | `nn.Linear.weight` `(out, in)`: column-parallel is `('model', None)` |

# %% [markdown]
# ## Exercises
#
# Each exercise checks itself: replace `NOT_ANSWERED`, run the cell, read the verdict. Run
# `ex.<name>.reveal()` for the reference answer.
#
# **Exercise 1.** The tensor-parallel model marks `fc2.weight` of `nn.Linear(64, 8)` with
# `xs.mark_sharding(model.fc2.weight, xmesh_tp, (None, 'model'))`. Which `PartitionSpec` gives the JAX
# kernel `w2`, shape `(64, 8)`, the same layout?

# %%
from exercises import ex18_pytorch_xla as ex

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
# The checkers work without torch_xla, so they compute spec strings themselves. This cell holds them to
# what torch_xla really prints, for the exercises' answers and for every spec of section 4:

# %%
u = torch.zeros(8, 16).to(device)
xs.mark_sharding(u, xmesh, ex.spec_from_string.solution)
assert ex.spec_from_string.checker(ex.spec_from_string.solution) is None
assert spec_of(u) == ex.spec_string(ex.spec_from_string.solution, (8, 16))
u = torch.zeros(8, 16).to(device)
xs.mark_sharding(u, xmesh, (None, "model"))
assert spec_of(u) == ex.string_from_spec.solution
for name, shape, spec in examples:
    assert ex.spec_string(spec, shape) == spec_of(xla_tensors[name])

# %% [markdown]
# ## Takeaways
# - PyTorch/XLA and JAX hand the same information to the same compiler: a mesh of named axes and, per
#   tensor, which axis splits which dimension. `xs.mark_sharding(t, mesh, (None, 'data', 'model'))` and
#   `jax.device_put(x, NamedSharding(mesh, P(None, 'data', 'model')))` put the same block on the same
#   device; torch_xla's spec string is the `HloSharding` that JAX builds too.
# - torch_xla's rules: `xr.use_spmd()` first; one logical device `xla:0`; one spec entry per dimension;
#   one annotation per tensor (`clear_sharding` to change it); the guide's `mesh.shape()` output and its
#   double `mark_sharding` of `t2` are wrong today.
# - `mark_sharding` on an activation inside `forward` is `with_sharding_constraint`: an instruction the
#   compiler obeys, even where it costs an all-gather.
# - The same MLP trains to the same losses in both. Tensor parallel: one all-reduce of the logits in both.
#   Data parallel: the same gradient bytes all-reduced, in one combined op in JAX and one op per gradient
#   in torch_xla.
# - In one process, torch_xla's `mark_sharding` turns JAX's Shardy partitioner off; switch it back before
#   JAX compiles.
#
# **Next:** [00 · How this course runs](00_setup.ipynb) (back to the start), or the readable edition
# (`make html`).
