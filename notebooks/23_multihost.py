# %% [markdown]
# # 23 · Multi-host SPMD: one script on every host
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/spmd-course/spmd-sharding-course/blob/main/notebooks/23_multihost.ipynb) [![Launch Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/spmd-course/spmd-sharding-course/main?urlpath=lab/tree/notebooks/23_multihost.ipynb)
#
# On a TPU pod each host runs its own Python process and feeds only its own chips: on a v5e-16, host 0
# drives 4 chips and must load rows 0:16, 48:56 and 120:128 of a 128-row batch. A process that loads
# other rows trains on the wrong data, and one that skips a collective the others call hangs the job.
#
# **You need:** notebooks 07 and 08 (data and tensor parallelism) and 21 (compiling for a TPU slice you
# don't have); `jax.jit` with `out_shardings`, `jax.make_mesh`, `NamedSharding` and `jax.device_put`.
#
# You will run one script as a pod runs it: two processes of 4 CPU devices each, one global mesh.
#
# **You will learn**
# - the multi-host vocabulary and the one call that joins the processes, `jax.distributed.initialize`;
# - how each process finds its rows with `sharding.addressable_devices_indices_map` and builds one
#   global batch, and why the hosts of one `model` group load identical rows;
# - how to get values back, and save and restore a sharded Orbax checkpoint from every process;
# - the rule that prevents hangs (the same collectives in the same order), agreeing on host values, and
#   saving at the same step when a host is preempted;
# - how to port multi-host `pmap` code, build multi-slice meshes, and launch the script.

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
import inspect
import json
import os
import socket
import tempfile
import time

import jax
import numpy as np
from IPython.display import Code, display
from jax.experimental import mesh_utils, multihost_utils, topologies
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spmd_course.scripts import spmd_worker as worker  # the script is also a module: this kernel reuses its model
from spmd_course.scripts.launcher import WorkersFailed, free_loopback_port, run_workers
from spmd_course.utils import (NOT_ANSWERED, assert_close, collectives, draw_sharding, draw_shardings, quiet, tiles,
                   tpu_compiler_available)


SCRIPT = Path(worker.__file__)


def show(function) -> Code:
    """A function of the script, as its file has it."""
    return Code(inspect.getsource(function), language="python")

# %% [markdown]
# ## 1. One script, several processes
#
# One process per host runs the same script. The processes meet at `jax.distributed.initialize`, which
# tells each one where the coordinator (process 0) listens, how many processes there are and which one it
# is. From then on the processes share one view of the devices, and each drives only its own:
#
# | | one process | 2 processes of 4 devices |
# |---|---|---|
# | `jax.process_count()` | 1 | 2 |
# | `jax.process_index()` | 0 | 0 or 1: which one am I |
# | `jax.devices()` | 8 devices | the same 8 **global** devices in every process |
# | `jax.local_devices()` | 8 devices | the 4 devices this process drives |
# | `x.addressable_shards` | all 8 shards | the 4 shards on local devices |
#
# The script is `src/spmd_course/scripts/spmd_worker.py`, and its docstring gives the commands that start it
# locally, on a TPU slice and under Slurm. Here is its `main`. Each later section shows the function whose
# results it reads, beside those results. To try a change, edit the file and rerun from section 3.

# %%
main_body = inspect.getsource(worker.main)
assert main_body.index("jax.distributed.initialize(") < main_body.index("jax.make_mesh(")  # joining comes first
show(worker.main)

# %% [markdown]
# ## 2. The reference: one process, 8 devices
#
# This kernel imports the script's functions and trains data-parallel on its own 8 devices, as in
# notebook 07. The compiler adds the all-reduce of the gradients.

# %%
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
replicated = NamedSharding(mesh, P())
x_all, y_all = worker.load_rows(0, worker.ROWS)
x = jax.device_put(x_all, NamedSharding(mesh, P("data")))
y = jax.device_put(y_all, NamedSharding(mesh, P("data")))
params = jax.device_put(worker.init_params(), replicated)
step = jax.jit(worker.train_step, out_shardings=(replicated, replicated))
found = collectives(step.lower(params, x, y).compile())
print(found)
assert found.kinds == {"all-reduce"}

reference = []
for _ in range(worker.STEPS):
    params, loss = step(params, x, y)
    reference.append(float(loss))
reference_final = float(jax.jit(worker.loss_fn)(params, x, y))
print("one process:", np.round(reference, 5), " loss after training:", round(reference_final, 5))
assert reference[-1] < reference[0]

# %% [markdown]
# ## 3. Two processes, one mesh
#
# The cell below starts the script twice with `run_workers`, the course's launcher (section 12). Each
# process gets `JAX_PLATFORMS=cpu` and 4 CPU devices, even where this kernel has a GPU or TPU, and a free
# port on `127.0.0.1` for the coordinator. A temporary directory plays the shared disk. Each process
# prints its results as `RESULT {json}` lines.

# %%
ENV = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="4")


def commands(port: int | str, shared: str) -> list[list[str]]:
    return [[sys.executable, str(SCRIPT), "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
             "--process-id", str(i), "--init-timeout", "30", "--shared-dir", shared] for i in range(2)]


with tempfile.TemporaryDirectory() as shared:
    outputs = run_workers(commands(free_loopback_port(), shared), env=ENV, timeout=240)
print("process 1 ran: python", SCRIPT.name, " ".join(commands("PORT", "SHARED_DIR")[1][2:]))

results: dict[str, dict[int, dict]] = {}
for out in outputs:
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line.removeprefix("RESULT "))
            results.setdefault(r.pop("topic"), {})[r.pop("process")] = r
for i, r in results["topology"].items():
    print(f"process {i} of {r['process_count']}: {r['device_count']} global devices, local ids {r['local_device_ids']}")
assert all(r["device_count"] == 8 and r["process_count"] == 2 for r in results["topology"].values())
assert all(r["backend"] == "cpu" for r in results["topology"].values())  # JAX_PLATFORMS=cpu, whatever this kernel uses
ids = [i for r in results["topology"].values() for i in r["local_device_ids"]]
assert len(set(ids)) == 8 and sorted(ids) != list(range(8))  # 8 distinct ids, but not the positions 0-7

# %% [markdown]
# Process 1's devices are numbered from 2048 on the CPU backend, not 4 to 7: a device id says nothing
# about where a device sits in a mesh.
#
# > **You will see this online:** `jax.config.update("jax_cpu_collectives_implementation", "gloo")` before
# > `jax.distributed.initialize`, as if CPU processes needed it to talk to each other.

# %%
print({i: r["cpu_collectives"] for i, r in results["topology"].items()})
assert all(r["cpu_collectives"] == "gloo" for r in results["topology"].values())  # the script never set it

# %% [markdown]
# Gloo is already the default, so the script sets nothing.
#
# ## 4. Each process loads only its rows
#
# The script trains the same model on three meshes over the 8 devices: batch on `data`, and on the 2-D
# meshes hidden units on `model` (notebook 08). Each process asks the batch's sharding which blocks its
# devices hold, `addressable_devices_indices_map(global_shape)`, loads those rows, and passes them to
# `jax.make_array_from_process_local_data`, which assembles the global `(64, 16)` batch.

# %%
display(show(worker.rows_to_load), show(worker.global_batch))

# %%
for name in ("data_parallel", "model_within", "model_across"):
    print(f"{name}: process of each mesh position {results[name][0]['processes']}")
    for i, r in results[name].items():
        print(f"    process {i} loads rows {[tuple(a) for a in r['rows']]}")
    for r in results[name].values():
        assert_close(r["losses"], reference)  # the same training as one process
assert results["data_parallel"][0]["rows"] == [[0, 8], [8, 16], [16, 24], [24, 32]]
assert results["model_within"][0]["rows"] == [[0, 32]] and results["model_within"][1]["rows"] == [[32, 64]]
assert results["model_across"][0]["rows"] == results["model_across"][1]["rows"] == [[0, 16], [16, 32], [32, 48],
                                                                                   [48, 64]]

# %% [markdown]
# The same three layouts of the batch, drawn on this kernel's 8 devices: 0-3 stand for process 0, 4-7 for
# process 1 (the script's order):

# %%
stand_in = np.array(jax.devices())  # [process 0's four devices, process 1's four devices]
auto2 = (AxisType.Auto,) * 2
layouts = {
    "data_parallel": NamedSharding(mesh, P("data")),
    "model_within": NamedSharding(Mesh(stand_in.reshape(2, 4), ("data", "model"), axis_types=auto2), P("data")),
    "model_across": NamedSharding(Mesh(stand_in.reshape(2, 4).T, ("data", "model"), axis_types=auto2), P("data")),
}
blocks = {name: tiles((64, 16), sharding) for name, sharding in layouts.items()}
assert all(len(t.devices) == 4 and len({d // 4 for d in t.devices}) == 1 for t in blocks["model_within"])  # one process
assert all({d // 4 for d in t.devices} == {0, 1} for t in blocks["model_across"])  # a block: both processes
draw_shardings({name: ((64, 16), sharding) for name, sharding in layouts.items()}, ncols=3)

# %% [markdown]
# All three reproduce the single-process losses. When `model` stays inside a process, each process loads
# half the batch. When `model` spans both processes, every block of rows sits on a device of each, so
# **both load all 64 rows, identical**. The two halves of the model must see the same examples, because
# together they compute one forward pass. Loading other rows would feed them different examples, and
# nothing would raise.
#
# > **You will see this online:** each host loads the slice `process_index * rows_per_host` onward (or
# > the files `process_index::process_count`):
# > ```python
# > x_local = dataset[jax.process_index() * per_host : (jax.process_index() + 1) * per_host]
# > ```

# %%
per_host = 32  # 64 rows / 2 hosts
for i, r in results["model_across"].items():
    assumed = (i * per_host, (i + 1) * per_host)
    print(f"process {i}: the snippet loads rows {assumed}; its devices hold rows {r['rows'][0][0]}:{r['rows'][-1][1]}")
assert results["model_across"][1]["rows"][0][0] != 1 * per_host  # the assumption is wrong for process 1

# %% [markdown]
# The shapes fit, so nothing raises. Ask the sharding instead, as `rows_to_load` does, or let JAX ask:
# `jax.make_array_from_callback(shape, sharding, block)` calls `block(index)` once per local device with
# that device's slice of the global shape.

# %%
display(show(worker.batch_from_callback))
for i, r in results["callback"].items():
    print(f"process {i} was asked for rows {[tuple(a) for a in r['asked']]}")
    assert r["asked"] == results["data_parallel"][i]["rows"] and r["same"]  # the same blocks, the same array

# %% [markdown]
# On real pods even
# a 1-D mesh does not give each host a contiguous run of rows: `jax.make_mesh` orders a TPU slice's chips
# along the interconnect. Here is a TPU v5e-16 (4 hosts of 4 chips) compiled for without a TPU
# (notebook 21), with this kernel playing host 0.

# %%
ok, why = tpu_compiler_available()
if not ok:
    print(why)
else:
    with quiet():
        topo = topologies.get_topology_desc(topology_name="v5e:4x4", platform="tpu")
    pod_1d = jax.make_mesh((16,), ("data",), axis_types=(AxisType.Auto,), devices=topo.devices)
    pod_2d = jax.make_mesh((4, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=topo.devices)
    print("1-D mesh, host of each position:", worker.process_grid(pod_1d))
    print("2-D mesh, host of each position:", worker.process_grid(pod_2d))
    batch_1d = NamedSharding(pod_1d, P("data"))
    host_0 = sorted(index[0].indices(128)[:2] for index in batch_1d.addressable_devices_indices_map((128, 16)).values())
    print("host 0 loads rows", host_0)
    rows_2d: dict[int, set] = {}
    for device, index in NamedSharding(pod_2d, P("data")).devices_indices_map((128, 16)).items():
        rows_2d.setdefault(device.process_index, set()).add(index[0].indices(128)[:2])
    assert host_0 == [(0, 8), (8, 16), (48, 56), (120, 128)]  # not a contiguous run
    assert rows_2d[0] == rows_2d[1] != rows_2d[2] == rows_2d[3]  # hosts 0 and 1 share the model axis
    picture = draw_sharding((128, 16), batch_1d, color_by=lambda d: d.process_index, show_slices=True,
                            title="v5e-16, coloured by host: 0 blue, 1 orange, 2 green, 3 red")
    shown = [t.get_label().split("\n")[-1] for ax in picture.axes for t in ax.texts if t.get_gid() == "tile-label"]
    assert {f"[{a}:{b}, :]" for a, b in host_0} <= set(shown)  # host 0's rows, as the blocks are labelled

# %% [markdown]
# Each block is labelled with its rows. Host 0 (blue) holds rows 0:16, 48:56 and 120:128, so its loader
# must read three separate runs. On the 2-D mesh
# hosts 0 and 1 hold the same rows, as our two processes did when `model` spanned them.
#
# ## 5. Getting results back
#
# A value that lives on another host's devices cannot be read here. The script tried on the global batch:

# %%
display(show(worker.results_back))
r = results["results"][0]
print("print(x) shows:  ", r["printed"])
print("np.asarray(x):   ", r["fetch_error"])
assert r["printed"] == "Array(shape=(64, 16), dtype=float32)"  # no values, and no error
assert "spans non-addressable (non process local) devices" in r["fetch_error"]
assert "process_allgather" in r["fetch_error"]  # JAX's own advice

# %% [markdown]
# > **You will see this online**, and in JAX's own error above: "use `multihost_utils.process_allgather(x)`".

# %%
print("process_allgather(x):", r["gather_error"])
assert r["gather_error"] == "Gathering global non-fully-addressable arrays only supports tiled=True"

# %% [markdown]
# As the error advises, it needs `tiled=True` on an array that spans processes. Then it sends every block to
# every process (costly for a large array). Better, compute what you need inside `jit` and ask for a
# **replicated** output (`out_shardings=NamedSharding(mesh, P())`): every process holds all of it.

# %%
for i, r in results["results"].items():
    print(f"process {i}: gathered {tuple(r['gathered_shape'])}, replicated column sums {np.round(r['column_sums'][:3], 3)}...")
    assert r["gathered_shape"] == [64, 16]
    assert_close(r["gathered_sum"], x_all.sum(), rtol=1e-5, atol=0)  # one number: relative error only
    assert_close(r["column_sums"], x_all.sum(axis=0), rtol=1e-5, atol=1e-5)

# %% [markdown]
# ## 6. A sharded checkpoint, saved and restored by every process
#
# The script saves the parameters trained with `model` spanning the processes (each holds half of `w1`
# and `w2`) with Orbax's `StandardCheckpointer`. **Every process calls `save`** and writes its own shards.
# Then every process calls `restore` with `jax.ShapeDtypeStruct`s sharded on the *other* 2-D mesh, and
# reads the blocks it needs there, so a checkpoint can change layout on the way back. Only process 0
# listed the directory:

# %%
display(show(worker.checkpoint))
files = results["checkpoint_files"]
print("checkpoint entries:", files[0]["entries"])
for i, r in results["checkpoint"].items():
    print(f"process {i}: restored on {r['restored_mesh']} with w1 {r['restored_spec']}, identical: {r['identical']},"
          f" loss {r['loss']:.5f}")
    assert r["identical"] and r["restored_mesh"] == {"data": 2, "model": 4}
    assert_close(r["loss"], reference_final)  # the trained model, restored
assert list(files) == [0] and {"ocdbt.process_0", "ocdbt.process_1"} <= set(files[0]["entries"])

# %% [markdown]
# `ocdbt.process_0` and `ocdbt.process_1` hold what each process wrote. On a cluster the directory is shared
# storage (a bucket, a network file system).
#
# ## 7. The rule: same collectives, same order
#
# A collective returns only once every process has called it. `multihost_utils.sync_global_devices(name)`
# is a barrier built from one: every process passes the same name, and it returns when all have. Process 1
# slept before it:

# %%
display(show(worker.collectives_wait))
wait = results["wait"]
for i, r in wait.items():
    print(f"process {i}: entered the barrier at {r['entered'] - wait[0]['entered']:.2f} s, "
          f"left at {r['returned'] - wait[0]['entered']:.2f} s")
assert wait[0]["returned"] >= wait[1]["entered"]  # process 0 left only after process 1 had come (one host clock)

# %% [markdown]
# Now put a collective under `if jax.process_index() == 0:`. Process 1 never calls it, so process 0 waits.
# How long it waits depends on what process 1 does instead. At the default limits some cases take
# minutes, so the course's tests (`tests/test_processes.py`) run the script with one fault each and short
# limits, and time process 0 from the fault. On two CPU processes:
#
# | process 1, meanwhile | what happens to process 0 | how soon | the test |
# |---|---|---|---|
# | exits or dies while process 0 is in a collective with it | raises: gloo sees the connection close ("Connection closed by peer") | under a second (the test allows 5 s) | `..._leaves_during_a_collective_...` |
# | calls a different collective | both abort: "Is there a distributed collective mismatch in your code?" | under a second | `test_mismatched_collectives_...` |
# | lives on, after the two ran a collective together | waits for ever: heartbeats flow, so no limit applies | still waiting after 4 heartbeat timeouts (3 s each in the test) | `test_a_lone_collective_...` |
# | lives on, and this is their first collective | raises when gloo gives up connecting: `DEADLINE_EXCEEDED: GetKeyValue() timed out` | 30 s, gloo's own limit | `test_a_first_collective_...` |
# | raised without `exit_on_error` (section 12), so JAX's exit hook holds it at the shutdown barrier | both abort: "Barrier timed out. Id: Shutdown::…" | `shutdown_timeout_seconds` (5 s in the test) | `..._waits_at_the_shutdown_barrier_...` |
#
# So the heartbeat does not end a hung collective. It is how the coordinator notices a process that
# stopped sending heartbeats, for example one that died while the others were not exchanging data with it.
# The quick detection and the 30 s are gloo's, the CPU transport's: a GPU (NCCL) or TPU job has other
# transports and other limits, not measured here. The defaults of the three limits JAX sets:

# %%
defaults = inspect.signature(jax.distributed.initialize).parameters
print({name: defaults[name].default
       for name in ("initialization_timeout", "shutdown_timeout_seconds", "heartbeat_timeout_seconds")})
assert defaults["initialization_timeout"].default == defaults["shutdown_timeout_seconds"].default == 300  # seconds
assert defaults["heartbeat_timeout_seconds"].default == 100  # how long a process without heartbeats goes unnoticed

# %% [markdown]
# These limits are arguments of `jax.distributed.initialize`, so a test of a multi-process program can set
# them low, as the course's tests do (3 s heartbeats, a 5 s shutdown barrier), and a fault then costs
# seconds instead of minutes. In no row above does the job go on without the failed process, because JAX
# does not let it by default. A job that should carry on without a failed host needs JAX's experimental
# fault-tolerance path: the flag `jax_enable_recoverability` (off by default; `initialize` reads it), and the
# context manager `multihost_utils.live_devices(devices)`, which yields the devices still alive so that the
# code inside runs on those alone. Its docstring calls it under active development and not stable, so this
# course only names it.

# %%
assert callable(multihost_utils.live_devices) and "jax_enable_recoverability" in jax.config.values
assert jax.config.values["jax_enable_recoverability"] is False  # off by default: a lost process ends the job

# %% [markdown]
# Collectives hide in `jit` calls on global arrays (the train step's all-reduce), in `process_allgather`,
# in Orbax's `save` and `restore`, and in **`jax.device_put` of host data** onto devices of every
# process: JAX first checks that every process passed the same value, with `multihost_utils.assert_equal`,
# an all-gather of the whole value from every process. The script passed a different value in each
# process:

# %%
display(show(worker.device_put_compares))
print(results["device_put"][0]["error"])
for i, r in results["device_put"].items():  # both processes raise AssertionError, each with what it passed
    assert "passed to device_put is not the same on each process" in r["error"]
    assert r["error"].endswith(f"Expected: [0. 0. 0. 0. 1. 1. 1. 1.]; got: [{i}. {i}. {i}. {i}.].")

# %% [markdown]
# "Expected" is what the all-gather brought back from both processes. So `device_put` under
# `if jax.process_index() == 0:` hangs, and a large host array put this way is first gathered whole into
# every process. Only side effects go under `if jax.process_index() == 0:` (printing, logging, listing
# files).
#
# ## 8. Agreeing on host values
#
# Values each process computes for itself (a seed, a configuration, a step count) can drift apart, for
# example when a seed comes from the clock. Two calls deal with that:
#
# | call | what it does | use it |
# |---|---|---|
# | `multihost_utils.broadcast_one_to_all(tree)` | gives every process process 0's values | to make values agree |
# | `multihost_utils.assert_equal(tree, message)` | raises in every process if their values differ | as the first check when hosts diverge |
#
# Both are all-gathers, so every process must call them.

# %%
display(show(worker.agree_across_processes))
for i, r in results["agree"].items():
    print(f"process {i}: its seed {r['mine']}, after the broadcast {r['agreed']['seed']}")
    assert r["agreed"]["seed"] == results["agree"][0]["mine"] != results["agree"][1]["mine"]
    assert r["differ"].startswith("the seeds differ. Expected: [100 101]")  # every process raises
print(results["agree"][1]["differ"])

# %% [markdown]
# The losses passed `assert_equal`: both processes trained the same model.
#
# ## 9. Preemption
#
# Before a cloud scheduler evicts a host it sends the process SIGTERM. A JAX process that has joined a
# job does not stop: it tells the coordinator, which tells every process. Each keeps training and asks
# `multihost_utils.reached_preemption_sync_point(step)` every step. It returns True at the same step in
# all of them, and that is the step at which to save a checkpoint and exit: since every process saves at
# that step, the checkpoint holds one consistent model. (Orbax's `CheckpointManager` asks it for you.)
# Process 1 sent itself SIGTERM after step 2:

# %%
display(show(worker.preemption))
pre = results["preemption"]
print({i: f"notice after step {r['notice_at']}, save at step {r['save_at']}" for i, r in pre.items()})
assert pre[0]["save_at"] is not None  # the sync point came
assert pre[0]["save_at"] == pre[1]["save_at"] > pre[0]["notice_at"]  # one step for all, after the notice
assert "SIGTERM caught" in outputs[1].stderr and "SIGTERM" not in outputs[0].stderr  # only process 1 got it

# %% [markdown]
# Process 0 never received a signal, yet it stopped at the same step. Process 1 did not die at its
# SIGTERM: it trained on until the agreed step.
#
# ## 10. Porting multi-host `pmap` code
#
# Multi-host `pmap` code (notebook 22) hands each process's **own** arrays to `pmap`, with a leading axis of
# `jax.local_device_count()`, and gets per-process arrays back. `jit` takes **global** arrays.
# `multihost_utils.host_local_array_to_global_array(x_local, mesh, P('data'))` makes the global array from
# what pmap code already has, and `global_array_to_host_local_array` goes back, so a port can proceed one
# function at a time.

# %%
display(show(worker.pmap_to_jit))
for i, r in results["pmap"].items():
    print(f"process {i}: pmap gave a per-process {tuple(r['pmap_shape'])} array {np.round(r['pmap_loss'], 5)}, "
          f"jit a global loss {r['jit_loss']:.5f}")
    assert r["pmap_shape"] == [4] and r["global_shape"] == [64, 16] and r["local_shape"] == [32, 16]
    assert r["same_as_make_array"] and r["round_trip"]
    np.testing.assert_allclose(r["pmap_loss"], [r["jit_loss"]] * 4, rtol=1e-6)
    assert_close(r["jit_loss"], reference[0])

# %% [markdown]
# ## 11. Multi-slice meshes
#
# Several TPU slices join over the data-centre network (DCN), slower than the interconnect inside a
# slice. `jax.make_mesh` refuses them. `mesh_utils.create_hybrid_device_mesh(ici_shape, dcn_shape)` builds
# a mesh whose DCN axes cross slices and whose other axes stay inside one, so the traffic of those axes
# stays on the fast links. The script's `model_within` mesh was built the same way, with `process_is_granule=True`: each process
# counts as a slice, as the hosts of a GPU cluster do. Two v5e-4 slices, compiled for without a TPU:

# %%
if ok:
    with quiet():
        slices = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu", num_slices=2).devices
    refused = False
    try:
        jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=slices)
    except ValueError as err:
        print("jax.make_mesh:", err)
        refused = "does not support multi-slice" in str(err)
    hybrid = mesh_utils.create_hybrid_device_mesh((1, 4), (2, 1), devices=slices)  # ICI (1, 4) x DCN (2, 1)
    slice_grid = np.vectorize(lambda d: d.slice_index)(hybrid).tolist()
    print("slice of each position:", slice_grid)
    assert refused and slice_grid == [[0] * 4, [1] * 4]

# %% [markdown]
# Each row is one slice: `model` stays on the fast interconnect, and only `data`, whose gradient all-reduce
# happens once a step, crosses the DCN.
#
# ## 12. A launcher that fails loudly
#
# When a worker dies, the others wait for it (section 7). A worker that raises does not even die, because
# JAX's exit hook calls `jax.distributed.shutdown()`. That waits at a barrier for every other process, up
# to `shutdown_timeout_seconds` (300 s), and then aborts. `sys.exit(3)`, the usual way for a script to stop
# on a bad configuration, takes the same path, since it raises `SystemExit`. So the script runs `main`
# through `exit_on_error`. It catches every exception, `SystemExit` included, prints the traceback, and
# leaves with `os._exit`, which skips the exit hooks. The exit status stays the one Python would give
# (3 for `sys.exit(3)`, 1 for an error), so a launcher sees both the failure and its code at once:

# %%
display(show(worker.exit_on_error), show(worker.exit_status))
assert worker.exit_status(SystemExit(3)) == 3 and worker.exit_status(SystemExit("bad flag")) == 1
assert worker.exit_status(SystemExit()) == 0 and worker.exit_status(ValueError()) == 1

# %% [markdown]
# In your own script, copy the two functions (they need only `os`, `sys` and `traceback`) and end it with
# `if __name__ == "__main__": exit_on_error(main)`. `tests/test_processes.py` checks that a worker which
# raises or calls `sys.exit(3)` after `initialize` is reported within seconds, with its own status.
#
# One early exit still goes unnoticed: a worker that ends with status 0, by `return` or `sys.exit(0)`,
# is no failure to any launcher. The others then wait in their next collective, as in the table of
# section 7: under a second if they are in one with it, 30 s if it is their first, and otherwise until
# the launcher's time limit.
#
# `run_workers` watches all workers together. At the first error it kills the rest with SIGKILL (SIGTERM
# is a preemption notice, section 9) and raises, naming that worker and its first error line. At its time
# limit it names the workers still running. Here is a deliberate fault: this kernel holds the
# coordinator's port, so process 0 cannot start. The launcher's report:

# %%
failure = None
with tempfile.TemporaryDirectory() as shared, socket.socket() as squatter:
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    start = time.perf_counter()
    try:
        run_workers(commands(taken, shared), env=ENV, timeout=240)
    except WorkersFailed as err:
        failure = err
    seconds = time.perf_counter() - start
assert isinstance(failure, WorkersFailed)
headline = str(failure).splitlines()[0]
print("the launcher's report (a deliberate fault):", headline.replace(str(taken), "PORT"))
worker_0, worker_1 = failure.outputs
print("worker 1:", worker_1.status())
assert headline.startswith("worker 0 of 2 failed") and "Failed to add port to server" in headline
assert worker_1.stopped
print(f"the error came after {seconds:.1f} s")
assert seconds < 30  # sooner than process 1's own 30 s wait for the coordinator

# %% [markdown]
# The launcher stopped process 1, which would have waited 30 s for the dead coordinator, and said which
# worker failed and why (jax 0.12 adds "Address already in use"), then the last lines of each stderr.

# %% [markdown]
# ## Takeaways
# - One script runs in every process over one global mesh, and `jax.distributed.initialize` comes first.
# - Each process asks the sharding which rows to load. Hosts of one `model` group load identical rows,
#   and a host's rows need not be contiguous.
# - Get values back as replicated outputs or with `process_allgather(x, tiled=True)`. Every process calls
#   Orbax's `save` and `restore`.
# - Every process runs the same collectives (`device_put` of host data, `assert_equal` and
#   `sync_global_devices` too) in the same order. Only side effects go under `process_index() == 0`.
# - SIGTERM is a preemption notice, and `reached_preemption_sync_point` names one step for all to save at.
# - A worker that raises or calls `sys.exit` must exit at once, past JAX's shutdown barrier, and a launcher
#   stops all at the first failure and says why. A worker that ends early with status 0 is no failure to a
#   launcher: the others wait for it.

# %% [markdown]
# ## Exercises
#
# **Exercise 1.** On the TPU v5e-16 of section 4, the 1-D mesh puts its 16 positions on hosts
# `[0, 0, 1, 1, 1, 1, 0, 2, 3, 3, 3, 3, 2, 2, 2, 0]`. A 128-row batch is sharded `P('data')`. Which rows
# does host 2 load, in the order `make_array_from_process_local_data` wants them? Answer with a list of
# `(start, stop)` ranges.

# %%
from spmd_course.exercises import ex23_multihost as ex

answer_1 = NOT_ANSWERED  # e.g. [(0, 8), (40, 48)]
ex.rows_of_host.check(answer_1);

# %% [markdown]
# **Exercise 2.** 16 hosts with 4 devices each, a global batch of 2048 rows on `P('data')`, and a mesh
# `(32, 2)` on `('data', 'model')` whose `model` pairs always join two different hosts. How many rows does
# each process pass to `jax.make_array_from_process_local_data`?

# %%
answer_2 = NOT_ANSWERED  # a whole number
ex.rows_per_process.check(answer_2);

# %% [markdown]
# **Exercise 3.** Which of these lines, run in a multi-host job, hang? Answer with a set of letters.
#
# - (a) `if jax.process_index() == 0: print(float(loss))`, with `loss` a replicated output of a jitted step
# - (b) `if jax.process_index() == 0: checkpointer.save(path, params)`
# - (c) `if jax.process_index() == 0: wandb.log({"loss": float(loss)})`
# - (d) `if jax.process_index() == 0: print(process_allgather(x, tiled=True).mean())`
# - (e) `if jax.process_index() == 0: params = jax.device_put(init_params(), shardings)`, the shardings on the
#   global mesh

# %%
answer_3 = NOT_ANSWERED  # e.g. {"a"}
ex.which_hang.check(answer_3);

# %% [markdown]
# **Next:** [24 · PyTorch/XLA side by side](24_pytorch_xla.ipynb)
