r"""One SPMD program that every process of a multi-host JAX job runs, unchanged (notebook 23).

Every host starts this same file; only what JAX learns at `jax.distributed.initialize` differs.
Two processes of 4 CPU devices on one machine (a shared directory for the checkpoint):

    export JAX_PLATFORMS=cpu JAX_NUM_CPU_DEVICES=4
    python spmd_worker.py --coordinator 127.0.0.1:8476 --num-processes 2 --process-id 0 --shared-dir /tmp/run &
    python spmd_worker.py --coordinator 127.0.0.1:8476 --num-processes 2 --process-id 1 --shared-dir /tmp/run

Every worker of a TPU slice (jax.distributed.initialize() reads the TPU VM's metadata; the shared
directory is, for example, a bucket mounted on every worker):

    gcloud compute tpus tpu-vm scp spmd_worker.py NAME: --worker=all --zone=ZONE
    gcloud compute tpus tpu-vm ssh NAME --worker=all --zone=ZONE \
        --command="python3 spmd_worker.py --shared-dir /mnt/shared/run"

Slurm, one task per GPU (jax.distributed.initialize() reads the SLURM_* variables and gives each
task the GPU numbered SLURM_LOCALID):

    srun --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 python spmd_worker.py --shared-dir /shared/run

Each result is printed as one line, "RESULT {json}", which the notebook reads. A process that raises,
or calls sys.exit, says why and exits at once, with status 1 or sys.exit's number (see `exit_on_error`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils, multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

ROWS, D_IN, D_HIDDEN, STEPS, LR = 64, 16, 32, 5, 0.1  # main() checks that the job's devices divide them


def sizes_fit(devices: int, processes: int) -> bool:
    """Whether every mesh of main() splits ROWS and D_HIDDEN evenly: up to 64 devices and 32 per process."""
    per_process = devices // processes
    return ROWS % devices == 0 and D_HIDDEN % per_process == 0 and D_HIDDEN % processes == 0


# --- the model and the data: plain functions, the same as on one host ------------------------------


def load_rows(start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows start..stop-1 of the dataset (inputs, targets); row i is the same wherever it is read."""
    x = np.stack([np.random.default_rng(i).standard_normal(D_IN) for i in range(start, stop)]).astype(np.float32)
    return x, (np.sin(2 * x[:, :1]) + 0.5 * x[:, 1:2]).astype(np.float32)


def init_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"w1": (rng.standard_normal((D_IN, D_HIDDEN)) / np.sqrt(D_IN)).astype(np.float32),
            "b1": np.zeros(D_HIDDEN, np.float32),
            "w2": (rng.standard_normal((D_HIDDEN, 1)) / np.sqrt(D_HIDDEN)).astype(np.float32),
            "b2": np.zeros(1, np.float32)}


def loss_fn(params, x, y):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss


# Tensor parallelism on a 2-D mesh: hidden units split on 'model', batch on 'data'.
PARAM_SPECS = {"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}


def report(topic: str, **values) -> None:
    print("RESULT " + json.dumps({"process": jax.process_index(), "topic": topic, **values}), flush=True)


# --- each process loads only the rows its own devices hold -------------------------------------------


def rows_to_load(sharding: NamedSharding) -> list[tuple[int, int]]:
    """Row ranges of the global batch held by this process's devices: in order, each once."""
    index_map = sharding.addressable_devices_indices_map((ROWS, D_IN))  # {local device: its block}
    return sorted({index[0].indices(ROWS)[:2] for index in index_map.values()})


def global_batch(mesh: Mesh) -> tuple[jax.Array, jax.Array, list[tuple[int, int]]]:
    sharding = NamedSharding(mesh, P("data"))
    ranges = rows_to_load(sharding)
    parts = [load_rows(start, stop) for start, stop in ranges]
    x_local, y_local = (np.concatenate(columns) for columns in zip(*parts, strict=True))
    x = jax.make_array_from_process_local_data(sharding, x_local, (ROWS, D_IN))
    y = jax.make_array_from_process_local_data(sharding, y_local, (ROWS, 1))
    return x, y, ranges


def train(mesh: Mesh, specs: dict[str, P]) -> tuple[dict[str, jax.Array], list[float], list[tuple[int, int]]]:
    x, y, ranges = global_batch(mesh)
    shardings = {name: NamedSharding(mesh, spec) for name, spec in specs.items()}
    params = jax.device_put(init_params(), shardings)  # every process passes the same values
    step = jax.jit(train_step, out_shardings=(shardings, NamedSharding(mesh, P())))
    losses = []
    for _ in range(STEPS):
        params, loss = step(params, x, y)
        losses.append(float(loss))  # the loss is replicated: every process holds all of it
    return params, losses, ranges


def process_grid(mesh: Mesh) -> list:
    return np.vectorize(lambda d: d.process_index)(mesh.devices).tolist()


# --- getting results back to the host ------------------------------------------------------------------


def results_back(mesh: Mesh) -> None:
    x, _, _ = global_batch(mesh)
    try:
        np.asarray(x)  # half of x lives in the other process
        fetch_error = ""
    except RuntimeError as err:
        fetch_error = str(err)
    try:
        multihost_utils.process_allgather(x)
        gather_error = ""
    except ValueError as err:
        gather_error = str(err)
    gathered = multihost_utils.process_allgather(x, tiled=True)  # the whole array, in every process
    column_sums = jax.jit(lambda a: a.sum(axis=0), out_shardings=NamedSharding(mesh, P()))(x)  # replicated
    report("results", printed=str(x), fetch_error=fetch_error, gather_error=gather_error,
           gathered_shape=list(gathered.shape), gathered_sum=float(gathered.sum()),
           column_sums=np.asarray(column_sums).tolist())


# --- a sharded checkpoint: every process saves and restores its own shards --------------------------


def checkpoint(params: dict[str, jax.Array], other_mesh: Mesh, directory: Path) -> None:
    import orbax.checkpoint as ocp

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(directory, params)  # every process calls it, each writes the shards it holds
    checkpointer.wait_until_finished()
    target = {name: jax.ShapeDtypeStruct(value.shape, value.dtype,
                                         sharding=NamedSharding(other_mesh, PARAM_SPECS[name]))
              for name, value in params.items()}
    restored = checkpointer.restore(directory, target)  # every process reads the shards it needs
    checkpointer.close()
    x, y, _ = global_batch(other_mesh)
    same = all(np.array_equal(multihost_utils.process_allgather(restored[k], tiled=True),
                              multihost_utils.process_allgather(params[k], tiled=True)) for k in params)
    if jax.process_index() == 0:  # a side effect (here, listing files) on one process only
        report("checkpoint_files", entries=sorted(p.name for p in directory.iterdir()))
    report("checkpoint", identical=same, restored_mesh=dict(other_mesh.shape),
           restored_spec=str(restored["w1"].sharding.spec), loss=float(jax.jit(loss_fn)(restored, x, y)))


# --- every process runs the same collectives in the same order ------------------------------------


def collectives_wait(late: float) -> None:
    """A collective returns only once every process has called it: here a barrier, process 1 `late` s late."""
    multihost_utils.sync_global_devices("warm-up")  # both processes in step
    if jax.process_index() == 1:
        time.sleep(late)  # process 1 reaches the barrier `late` seconds after process 0
    entered = time.time()
    multihost_utils.sync_global_devices("after the sleep")  # every process must pass the same name
    report("wait", late=late, entered=entered, returned=time.time())


def device_put_compares(mesh: Mesh) -> None:
    """`jax.device_put` of host data onto devices of every process all-gathers the data to compare it."""
    mine = np.full(4, jax.process_index(), np.float32)  # a different value in each process
    try:
        jax.device_put(mine, NamedSharding(mesh, P()))
        error = ""
    except AssertionError as err:
        error = str(err)
    report("device_put", error=error)


# --- small agreements between processes: one value for all, a barrier, a check -------------------------


def agree_across_processes(losses: list[float]) -> None:
    """Host values, not arrays: take process 0's, check they are equal. Each call is an all-gather."""
    mine = {"seed": np.int32(100 + jax.process_index()), "lr": np.float32(LR)}  # the seed differs per process
    agreed = multihost_utils.broadcast_one_to_all(mine)  # process 0's values, in every process
    multihost_utils.assert_equal(np.array(losses), "the processes trained differently")  # passes: they agree
    try:
        multihost_utils.assert_equal(mine["seed"], "the seeds differ")
        differ = ""
    except AssertionError as err:
        differ = str(err)
    report("agree", mine=int(mine["seed"]), agreed={k: v.item() for k, v in agreed.items()}, differ=differ)


def batch_from_callback(mesh: Mesh) -> None:
    """`jax.make_array_from_callback` asks for each local device's block by its index into the global shape."""
    asked = []

    def block(index: tuple[slice, ...]) -> np.ndarray:
        start, stop, _ = index[0].indices(ROWS)
        asked.append((start, stop))
        return load_rows(start, stop)[0]

    x = jax.make_array_from_callback((ROWS, D_IN), NamedSharding(mesh, P("data")), block)
    x_ref, _, _ = global_batch(mesh)
    report("callback", asked=sorted(asked), same=all(
        np.array_equal(a.data, b.data) for a, b in zip(x.addressable_shards, x_ref.addressable_shards, strict=True)))


# --- preemption: SIGTERM is the notice; every process saves at the same step ----------------------------


def preemption(mesh: Mesh, notice_at: int = 2, max_steps: int = 500) -> None:
    """Train until every process agrees that a preemption notice came; that step is where all save.

    The preemption service starts in `jax.distributed.initialize` (config `jax_enable_preemption_service`,
    on by default) and from then on catches SIGTERM; in a process that never joined a job,
    `reached_preemption_sync_point` returns False.
    """
    x, y, _ = global_batch(mesh)
    replicated = NamedSharding(mesh, P())
    params = jax.device_put(init_params(), replicated)
    step = jax.jit(train_step, out_shardings=(replicated, replicated))
    save_at = None
    for i in range(max_steps):
        params, _ = step(params, x, y)
        if i == notice_at and jax.process_index() == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler sends one host before evicting it
        if multihost_utils.reached_preemption_sync_point(i):
            save_at = i  # here every process would save a checkpoint (section 6) and exit
            break
        time.sleep(0.01)  # a training step takes time
    report("preemption", notice_at=notice_at, save_at=save_at)


# --- porting multi-host pmap code: per-process arrays -> global arrays --------------------------------


def pmap_to_jit(mesh: Mesh) -> None:
    n = jax.local_device_count()
    x, y, ranges = global_batch(mesh)
    x_local, y_local = (np.concatenate(c) for c in zip(*[load_rows(a, b) for a, b in ranges], strict=True))
    per_device = jax.pmap(lambda p, xb, yb: jax.lax.pmean(loss_fn(p, xb, yb), "data"), axis_name="data",
                          in_axes=(None, 0, 0))
    pmap_loss = per_device(init_params(), x_local.reshape(n, -1, D_IN), y_local.reshape(n, -1, 1))
    x_global = multihost_utils.host_local_array_to_global_array(x_local, mesh, P("data"))  # for jit
    jit_loss = jax.jit(loss_fn)(jax.device_put(init_params(), NamedSharding(mesh, P())), x_global, y)
    x_back = multihost_utils.global_array_to_host_local_array(x_global, mesh, P("data"))  # for pmap-era code
    report("pmap", pmap_shape=list(pmap_loss.shape), pmap_loss=np.asarray(pmap_loss).tolist(),
           global_shape=list(x_global.shape), jit_loss=float(jit_loss), local_shape=list(x_back.shape),
           same_as_make_array=all(np.array_equal(a.data, b.data)
                                  for a, b in zip(x_global.addressable_shards, x.addressable_shards, strict=True)),
           round_trip=bool(np.array_equal(np.asarray(x_back), x_local)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--coordinator", help="host:port of process 0; leave out where JAX detects the cluster")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--init-timeout", type=int, default=60, help="seconds to wait for every process to join")
    parser.add_argument("--shared-dir", type=Path, required=True, help="a directory every process can read and write")
    args = parser.parse_args()
    args.shared_dir.mkdir(parents=True, exist_ok=True)

    # 1. Join the job, before any other JAX call. Bind the coordinator to the address the others dial.
    if args.coordinator:
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id, initialization_timeout=args.init_timeout,
                                   coordinator_bind_address=args.coordinator)
    else:  # TPU VM, Slurm, Open MPI, Kubernetes: JAX reads the cluster's environment
        jax.distributed.initialize(initialization_timeout=args.init_timeout)
    report("topology", process_count=jax.process_count(), device_count=jax.device_count(),
           local_device_ids=[d.id for d in jax.local_devices()], backend=jax.default_backend(),
           cpu_collectives=jax.config.jax_cpu_collectives_implementation)  # across processes, on CPU

    if not sizes_fit(jax.device_count(), jax.process_count()):
        raise SystemExit(f"raise ROWS and D_HIDDEN: {jax.device_count()} devices in {jax.process_count()} processes "
                         f"cannot split {ROWS} rows and {D_HIDDEN} hidden units evenly")

    # 2. Three meshes over the same global devices.
    mesh_1d = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    model_within = Mesh(mesh_utils.create_hybrid_device_mesh(  # 'data' across processes, 'model' inside one
        (1, jax.local_device_count()), (jax.process_count(), 1), process_is_granule=True),
        ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    by_process = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    model_across = Mesh(np.array(by_process).reshape(jax.process_count(), -1).T,  # 'model' spans the processes
                        ("data", "model"), axis_types=(AxisType.Auto,) * 2)

    _, losses, ranges = train(mesh_1d, {name: P() for name in PARAM_SPECS})
    report("data_parallel", rows=ranges, losses=losses, processes=process_grid(mesh_1d))
    _, losses, ranges = train(model_within, PARAM_SPECS)
    report("model_within", rows=ranges, losses=losses, processes=process_grid(model_within))
    params, losses, ranges = train(model_across, PARAM_SPECS)
    report("model_across", rows=ranges, losses=losses, processes=process_grid(model_across))

    results_back(mesh_1d)
    batch_from_callback(mesh_1d)
    checkpoint(params, model_within, args.shared_dir / "checkpoint")
    collectives_wait(late=1.0)
    device_put_compares(mesh_1d)
    agree_across_processes(losses)
    preemption(mesh_1d)
    pmap_to_jit(mesh_1d)
    jax.distributed.shutdown()


def exit_on_error(entry: Callable[[], None]) -> None:
    """Run ``entry``; if it raises, even ``SystemExit``, say why and end this process at once.

    After `jax.distributed.initialize` an uncaught exception does not end the process: JAX's exit hook
    calls `jax.distributed.shutdown()`, which waits for every other process at a barrier (up to
    `shutdown_timeout_seconds`, 300 s by default) and then aborts. Meanwhile the others wait for this
    one in their next collective. `sys.exit(3)` takes the same path, because it raises `SystemExit`.
    `os._exit` skips the exit hooks, so a launcher sees the failure now. The exit status is the one
    Python would give (see `exit_status`), after the traceback, which says where the process stopped.
    """
    try:
        entry()
    except BaseException as err:  # SystemExit and KeyboardInterrupt too: each must end the process
        traceback.print_exc()  # for SystemExit too, so that the report says where the script stopped
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_status(err))


def exit_status(err: BaseException) -> int:
    """The status Python exits with after ``err``: sys.exit's number (0 for none), else 1 (a message, an error)."""
    if isinstance(err, SystemExit) and (err.code is None or isinstance(err.code, int)):
        return err.code or 0
    return 1


if __name__ == "__main__":
    exit_on_error(main)
