# %% [markdown]
# # 17 · Multi-host SPMD: two processes, one mesh
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/17_multihost.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/17_multihost.ipynb)
#
# On a TPU pod or a multi-node GPU cluster, one Python process runs per host and each sees only its own
# devices, yet all of them must run *one* SPMD program over *one* mesh. This notebook builds exactly that
# on this machine: two processes with 4 simulated CPU devices each, joined by `jax.distributed.initialize`
# into an 8-device mesh, each loading only its half of the batch, training data-parallel, and getting the
# same losses as the single-process 8-device run.
#
# **You will learn**
# - the multi-host vocabulary: process, local vs global devices, `process_index`, addressable shards;
# - how each process builds its part of a global array with `jax.make_array_from_process_local_data`;
# - that the training code is the same as on one host: the mesh is global, the compiler inserts the
#   cross-process all-reduce;
# - why fetching a sharded global array to one process fails, and what to do instead;
# - how the same script maps to TPU pods and multi-node GPU clusters.

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
import inspect
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from utils import NOT_ANSWERED, collectives, draw_sharding, tile_labels

# %% [markdown]
# ## 1. One program, several processes
#
# The slides this course started from ("SPMD + Data Parallel + multi host") draw the batch sharded across
# the devices of *all* hosts and the parameters replicated on every device. In JAX terms:
#
# | term | on one host | with 2 processes of 4 devices |
# |---|---|---|
# | `jax.process_count()` | 1 | 2 |
# | `jax.process_index()` | 0 | 0 or 1: which process am I |
# | `jax.devices()` | 8 devices | the same 8 **global** devices, in every process |
# | `jax.local_devices()` | 8 devices | the 4 devices this process drives |
# | `x.addressable_shards` | all 8 shards | the 4 shards on local devices |
#
# Every process runs the same script. They meet once, at `jax.distributed.initialize`, which tells each
# process the coordinator's address, how many processes there are and which one it is. From then on,
# `jax.devices()` lists all devices of all processes, and a mesh over them is a global mesh.
#
# Here is the layout we will build: a global batch of 64 rows sharded over the 8 devices on `data`.
# Process 0 drives the devices that hold rows 0:32, process 1 those that hold rows 32:64.

# %%
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
fig = draw_sharding((64, 16), NamedSharding(mesh, P("data")),
                    title="x: f32[64@data,16]; process 0 drives devices 0-3, process 1 devices 4-7")
assert [label.split("\n")[1] for label in tile_labels(fig)] == ["(8, 16)"] * 8
fig

# %% [markdown]
# ## 2. The program every process runs
#
# A small data-parallel regression: an MLP `16 -> 32 -> 1` trained with plain SGD on a mean squared error.
# The batch is made of 8 blocks of 8 rows; block `b` is generated from its own seed, so a process can
# produce **only its own blocks**, the way a real input pipeline reads only its own files.

# %%
ROWS_PER_BLOCK, N_BLOCKS, D_IN, D_HIDDEN = 8, 8, 16, 32


def load_blocks(first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of blocks first .. first+count-1 of the global batch (inputs and targets)."""
    xs, ys = [], []
    for b in range(first, first + count):
        rng = np.random.default_rng(1000 + b)
        x = rng.standard_normal((ROWS_PER_BLOCK, D_IN)).astype(np.float32)
        xs.append(x)
        ys.append(np.sin(x[:, :1] * 2.0) + 0.5 * x[:, 1:2])
    return np.concatenate(xs), np.concatenate(ys).astype(np.float32)


def init_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w1": (rng.standard_normal((D_IN, D_HIDDEN)) / np.sqrt(D_IN)).astype(np.float32),
        "b1": np.zeros(D_HIDDEN, np.float32),
        "w2": (rng.standard_normal((D_HIDDEN, 1)) / np.sqrt(D_HIDDEN)).astype(np.float32),
        "b2": np.zeros(1, np.float32),
    }


def loss_fn(params, x, y):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


# %% [markdown]
# ## 3. The reference: one process, 8 devices
#
# The familiar single-host data parallelism of notebook 07: batch on `data`, parameters replicated, no
# collective written by hand. The compiler inserts the all-reduce that sums the gradients across devices.

# %%
STEPS = 5
batch_sharding, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
x_all, y_all = load_blocks(0, N_BLOCKS)
x = jax.device_put(x_all, batch_sharding)
y = jax.device_put(y_all, batch_sharding)
params = jax.device_put(init_params(), replicated)

step = jax.jit(train_step, out_shardings=(replicated, replicated))
found = collectives(step.lower(params, x, y).compile())
print(found)
assert found.count("all-reduce") >= 1 and found.kinds == {"all-reduce"}

reference_losses = []
for _ in range(STEPS):
    params, loss = step(params, x, y)
    reference_losses.append(float(loss))
print("single process, 8 devices:", np.round(reference_losses, 5))
assert reference_losses[-1] < reference_losses[0]


# %% [markdown]
# ## 4. The same step on two processes
#
# The worker below is what each process runs. Only four lines are about several processes:
# - `jax_num_cpu_devices = 4` (each host has its own devices) and `gloo` for CPU collectives across
#   processes (GPUs use NCCL and TPUs their interconnect, with no such line);
# - `jax.distributed.initialize(...)`, before any other JAX operation;
# - `jax.make_array_from_process_local_data(sharding, local_rows)`: each process hands over only its rows,
#   and JAX assembles one global `(64, 16)` array whose shards live in two processes.
#
# The mesh, the shardings and `jax.jit(train_step)` are unchanged.

# %%
def worker(process_id: int, num_processes: int, port: int) -> None:
    jax.config.update("jax_num_cpu_devices", 4)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=num_processes, process_id=process_id)

    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    batch_sharding, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    blocks_per_process = N_BLOCKS // num_processes
    x_local, y_local = load_blocks(process_id * blocks_per_process, blocks_per_process)
    x = jax.make_array_from_process_local_data(batch_sharding, x_local)
    y = jax.make_array_from_process_local_data(batch_sharding, y_local)
    params = jax.device_put(init_params(), replicated)  # every process passes the same values

    try:  # a sharded global array is not entirely in this process
        np.asarray(x)
        fetch_error = ""
    except RuntimeError as err:
        fetch_error = str(err)

    step = jax.jit(train_step, out_shardings=(replicated, replicated))
    losses = []
    for _ in range(STEPS):
        params, loss = step(params, x, y)
        losses.append(float(loss))  # fine: the loss is replicated, so every process holds all of it
    report = {
        "process_index": jax.process_index(), "process_count": jax.process_count(),
        "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
        "local_device_ids": [d.id for d in jax.local_devices()], "global_shape": list(x.shape),
        "local_rows": [list(s.index[0].indices(x.shape[0])[:2]) for s in x.addressable_shards],
        "losses": losses, "fetch_error": fetch_error,
    }
    print("REPORT " + json.dumps(report), flush=True)
    jax.distributed.shutdown()


# %% [markdown]
# The launcher writes the cells above into one script, picks a free port on loopback, starts two
# processes, waits at most 120 s, and always cleans up, even if a process fails.

# %%
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(num_processes: int = 2, timeout: float = 120.0) -> list[dict]:
    header = textwrap.dedent("""\
        import json, sys
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import AxisType, NamedSharding
        from jax.sharding import PartitionSpec as P
        """)
    constants = "".join(f"{name} = {globals()[name]!r}\n"
                        for name in ("ROWS_PER_BLOCK", "N_BLOCKS", "D_IN", "D_HIDDEN", "STEPS"))
    functions = [load_blocks, init_params, loss_fn, train_step, worker]
    body = "\n\n".join(inspect.getsource(f) for f in functions)
    main = "\nworker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))\n"
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "worker.py"
        script.write_text(header + constants + body + main)
        procs = [subprocess.Popen([sys.executable, str(script), str(i), str(num_processes), str(port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for i in range(num_processes)]
        try:
            outputs = [p.communicate(timeout=timeout) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    reports = []
    for p, (out, err) in zip(procs, outputs, strict=True):
        if p.returncode != 0:
            raise RuntimeError(f"a worker failed (exit {p.returncode}):\n{err[-2000:]}")
        reports.append(json.loads(next(line[7:] for line in out.splitlines() if line.startswith("REPORT "))))
    return reports


reports = launch()
for r in reports:
    print(f"process {r['process_index']} of {r['process_count']}: {r['local_device_count']} local of "
          f"{r['device_count']} devices {r['local_device_ids']}, global x {tuple(r['global_shape'])}, "
          f"local rows {r['local_rows']}")
    print("  losses:", np.round(r["losses"], 5))

# %% [markdown]
# Each process saw the whole mesh but held only its rows, and both computed the same losses as the
# single-process run: the gradient all-reduce now crosses the process boundary (over gloo here), and
# nothing else changed.

# %%
assert [r["process_index"] for r in reports] == [0, 1]
for r in reports:
    assert (r["process_count"], r["device_count"], r["local_device_count"]) == (2, 8, 4)
    assert r["global_shape"] == [64, 16]
    np.testing.assert_allclose(r["losses"], reference_losses, rtol=1e-5)
assert [r["local_rows"] for r in reports] == [[[0, 8], [8, 16], [16, 24], [24, 32]],
                                               [[32, 40], [40, 48], [48, 56], [56, 64]]]
assert not set(reports[0]["local_device_ids"]) & set(reports[1]["local_device_ids"])

# %% [markdown]
# ## 5. Gotcha: a global array cannot be fetched by one process
#
# `np.asarray(x)`, `print(x)` or `float(x)` on one host ask for data that partly lives on another host.
# Each worker tried it on the sharded batch:

# %%
print(textwrap.fill(reports[0]["fetch_error"][:300], 100))
assert all("non-addressable" in r["fetch_error"] for r in reports)

# %% [markdown]
# What to do instead:
# - compute what you need *inside* the jitted step and return it **replicated** (`out_shardings=P()`), as
#   the loss above: every process then holds the whole value, and `float(loss)` works everywhere;
# - read only the local part: `x.addressable_shards` (each process sees its own four);
# - gather explicitly when you really need everything on every host:
#   `jax.experimental.multihost_utils.process_allgather(x)` (costly: the whole array crosses the network).
#
# ## 6. From this notebook to a real cluster
#
# | here | TPU pod slice | multi-node GPUs |
# |---|---|---|
# | 2 processes started by the notebook | one process per TPU host, started by your launcher (e.g. `gcloud ... ssh --worker=all`) | one process per node (or per GPU), started by SLURM, `torchrun`-like launchers or Kubernetes |
# | `jax.distributed.initialize("127.0.0.1:port", 2, i)` | `jax.distributed.initialize()` with no arguments: the TPU environment tells it everything | `jax.distributed.initialize()` detects SLURM / Open MPI; otherwise pass `coordinator_address`, `num_processes`, `process_id` |
# | gloo over loopback | the inter-chip interconnect (ICI) within a slice, the data-centre network across slices | NCCL over NVLink within a node, InfiniBand or Ethernet across nodes |
# | `load_blocks(process_index * k, k)` | each host reads its own shard of the dataset files | the same |
#
# On real hardware, put the axis with the most traffic (e.g. `model` for tensor parallelism) *within* a host
# and the data-parallel axis *across* hosts: the gradient all-reduce happens once per step, activation
# collectives happen in every layer. `jax.make_mesh` orders devices with that topology in mind.
#
# ## Exercises
#
# **Exercise 1.** With 4 processes of 2 devices each and the same 64-row batch on `P('data')`, which rows
# does process 2 load? Answer with a `(start, stop)` tuple.

# %%
from exercises import ex17_multihost as ex

answer_1 = NOT_ANSWERED  # (start, stop)
ex.rows_of_process.check(answer_1);

# %% [markdown]
# **Exercise 2.** A run on 16 hosts with 4 devices each uses a global batch of 2048 rows sharded on a 1-D
# `data` mesh over all devices. How many rows does each process pass to
# `jax.make_array_from_process_local_data`?

# %%
answer_2 = NOT_ANSWERED  # a whole number
ex.local_batch.check(answer_2);

# %% [markdown]
# ## Takeaways
# - Multi-host SPMD is the same program on every host over one global mesh; `jax.distributed.initialize`
#   is the only new step, and it comes first.
# - Each process builds its part of a global array from local data with
#   `jax.make_array_from_process_local_data`; the compiler moves the gradient all-reduce across processes.
# - The two-process run reproduced the single-process losses exactly (to float tolerance).
# - A sharded global array cannot be fetched by one process: return replicated results, read
#   `addressable_shards`, or gather on purpose.
#
# **Next:** [18 · PyTorch/XLA side by side](18_pytorch_xla.ipynb)
