"""spmd_course.scripts.launcher: workers run together, the first failure stops them all, and nothing is left behind.

The failures are provoked for real: a worker that exits with an error, one killed by a signal, one that
ignores SIGTERM, one that starts a child of its own, a run that never ends, a parent killed with
SIGKILL (a notebook kernel restart), an interrupted parent. Then the course's multi-host script itself,
two JAX processes, meets each fault of a real job: the coordinator's port taken, a crash before
initialize, an exception or a kill -9 after it, a hang before or after it, and Ctrl-C of the launcher.
Every test checks the message, how long the error took, and that no process is left.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spmd_course.course import ROOT
from spmd_course.scripts import spmd_worker
from spmd_course.scripts.launcher import WorkerOutput, WorkersFailed, free_loopback_port, run_workers, still_running

PY = sys.executable
LINUX = sys.platform.startswith("linux")


def py(code: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(code)]


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for a parent that never reaps it counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:
        return False


def children() -> list[int]:
    """The live processes whose parent is this test process (from /proc; empty where there is none)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


def nothing_left(outputs) -> bool:
    """No worker, nothing a worker started, and no other child of this test process is still running."""
    pids = [o.pid for o in outputs]
    return all(gone(pid) for pid in pids) and still_running(pids) == [] and children() == []


def wait_until(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# --- success ----------------------------------------------------------------------------------------------


def test_every_worker_succeeds_and_their_output_comes_back():
    outputs = run_workers([py(f"import sys; print('out {i}'); print('err {i}', file=sys.stderr)") for i in range(3)],
                          timeout=60)
    assert [o.index for o in outputs] == [0, 1, 2]
    assert [(o.returncode, o.stdout, o.stderr, o.stopped) for o in outputs] == [
        (0, f"out {i}\n", f"err {i}\n", False) for i in range(3)]
    assert all(o.status() == "exit status 0" for o in outputs)
    assert still_running([o.pid for o in outputs]) == []


def test_workers_run_at_the_same_time(tmp_path):
    """Two workers that each wait for the other's file finish only if both run at once."""
    wait_for = ("import pathlib, sys, time\npathlib.Path(sys.argv[1]).touch()\n"
                "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.02)")
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    outputs = run_workers([[PY, "-c", wait_for, a, b], [PY, "-c", wait_for, b, a]], timeout=60)
    assert [o.returncode for o in outputs] == [0, 0]


def test_env_and_cwd_reach_the_workers(tmp_path):
    outputs = run_workers([py("import os; print(os.environ['SPMD_TEST'], os.getcwd())")],
                          env=dict(os.environ, SPMD_TEST="seen"), cwd=tmp_path, timeout=60)
    assert outputs[0].stdout.split() == ["seen", str(tmp_path.resolve())]


def test_a_worker_that_prints_megabytes_never_blocks():
    outputs = run_workers([py("import sys; sys.stdout.write('x' * 3_000_000)")], timeout=60)
    assert len(outputs[0].stdout) == 3_000_000


# --- failures -----------------------------------------------------------------------------------------------


def test_a_worker_that_dies_stops_the_others_and_every_stderr_is_shown():
    start = time.monotonic()
    with pytest.raises(WorkersFailed) as caught:
        run_workers([py("import sys, time; time.sleep(0.5); print('bad input on line 3', file=sys.stderr); exit(3)"),
                     py("import sys, time; print('waiting for worker 0', file=sys.stderr, flush=1); time.sleep(60)")],
                    timeout=120)
    assert time.monotonic() - start < 60  # not the timeout: the failure stopped the run
    message = str(caught.value)
    assert message.startswith("worker 0 of 2 failed (exit status 3) after ")
    assert message.splitlines()[0].endswith(" s: last printed 'bad input on line 3'")  # no traceback, no C++ error
    assert "The others were stopped" in message
    assert "bad input on line 3" in message and "waiting for worker 0" in message
    dead, stopped = caught.value.outputs
    assert (dead.returncode, dead.stopped, dead.status()) == (3, False, "exit status 3")
    assert stopped.stopped and stopped.returncode == -signal.SIGKILL and stopped.status() == "stopped (SIGKILL)"
    assert f"--- worker 1 (pid {stopped.pid}): stopped (SIGKILL)" in message
    assert still_running([dead.pid, stopped.pid]) == []


def test_a_worker_killed_by_a_signal_is_named():
    with pytest.raises(WorkersFailed, match=r"worker 1 of 2 failed \(killed by SIGSEGV\)") as caught:
        run_workers([py("import time; time.sleep(120)"), py("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")],
                    timeout=120)
    assert caught.value.outputs[1].status() == "killed by SIGSEGV"
    assert still_running([o.pid for o in caught.value.outputs]) == []


def test_a_jax_process_in_a_distributed_job_survives_sigterm():
    """Why run_workers stops workers with SIGKILL: JAX's preemption notifier catches SIGTERM."""
    script = textwrap.dedent("""
        import sys, time
        import jax
        port = sys.argv[1]
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1, process_id=0,
                                   coordinator_bind_address=f"127.0.0.1:{port}")
        print("joined", flush=True)
        time.sleep(120)
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([PY, "-c", script, str(free_loopback_port())], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline() == "joined\n", proc.stderr.read() if proc.poll() is not None else ""
        proc.terminate()
        time.sleep(2)
        assert proc.poll() is None  # still running after SIGTERM
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert "SIGTERM caught" in err


def test_a_worker_that_ignores_sigterm_is_still_stopped():
    """A JAX process joined to a distributed job takes SIGTERM as a preemption notice and keeps running."""
    stubborn = py("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('ignoring SIGTERM', file=sys.stderr, flush=True)
        time.sleep(120)
    """)
    with pytest.raises(WorkersFailed) as caught:
        run_workers([stubborn, py("import time, sys; time.sleep(1); sys.exit(1)")], timeout=120)
    assert caught.value.outputs[0].stopped
    assert still_running([o.pid for o in caught.value.outputs]) == []


def test_what_a_worker_starts_is_stopped_with_it(tmp_path):
    pid_file = tmp_path / "grandchild"
    parent_of_sleeper = py(f"""
        import pathlib, subprocess, time
        child = subprocess.Popen(['sleep', '120'])
        pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))
        time.sleep(120)
    """)
    failing = py(f"""
        import pathlib, sys, time
        while not pathlib.Path({str(pid_file)!r}).exists(): time.sleep(0.02)
        sys.exit(2)
    """)
    with pytest.raises(WorkersFailed, match="exit status 2") as caught:
        run_workers([parent_of_sleeper, failing], timeout=120)
    assert gone(int(pid_file.read_text()))
    assert still_running([o.pid for o in caught.value.outputs]) == []


def test_a_run_that_never_ends_times_out_loudly():
    start = time.monotonic()
    with pytest.raises(WorkersFailed) as caught:
        run_workers([py("print('started', flush=True); import time; time.sleep(120)")] * 2, timeout=1.5)
    assert time.monotonic() - start < 30
    lines = str(caught.value).splitlines()
    assert lines[0] == "timed out after 1.5 s with worker(s) 0, 1 of 2 still running; every worker was stopped."
    assert lines[1:4] == ["Still running, each waiting for another, or hung:",
                          "  worker 0, last printed: 'started'", "  worker 1, last printed: 'started'"]
    assert all(o.stopped for o in caught.value.outputs)
    assert still_running([o.pid for o in caught.value.outputs]) == []


def test_a_timeout_names_who_waited_for_whom_and_a_traceback_that_did_not_end_its_process():
    """Worker 1 exits; worker 0, like a JAX process at its shutdown barrier, raised and stays."""
    raised_and_stayed = py("""
        import sys, time, traceback
        try:
            raise ValueError('the other process went away')
        except ValueError:
            traceback.print_exc()
        print('waiting at the exit barrier', file=sys.stderr, flush=True)
        time.sleep(120)
    """)
    with pytest.raises(WorkersFailed) as caught:
        run_workers([raised_and_stayed, py("print('done')")], timeout=3)
    lines = str(caught.value).splitlines()
    assert lines[0] == "timed out after 3 s with worker(s) 0 of 2 still running; every worker was stopped."
    assert lines[1].startswith("Still running, waiting for worker(s) 1, which had exited (worker 1: exit status 0 "
                               "after ")
    assert lines[2:4] == ["  worker 0, last printed: 'waiting at the exit barrier'",
                          "    it raised, but did not exit: ValueError: the other process went away"]
    assert [o.stopped for o in caught.value.outputs] == [True, False]


def test_the_headline_gives_the_exception_and_the_first_logged_error_and_drops_cpp_frames():
    """What a JAX process prints when it fails: a C++ log line, a Python traceback, C++ stack frames."""
    failing = py("""
        import sys
        print('I1125 13:28:30.000001    9330 service.cc:10] starting', file=sys.stderr)
        print("E1125 13:28:33.045268    9330 add_port.cc:83] Failed to add port to server: "
              "(Error in bind: Address already in use)", file=sys.stderr)
        print('E1125 13:28:33.045300    9330 server.cc:9] a later error', file=sys.stderr)
        print('*** Check failure stack trace: ***', file=sys.stderr)
        for i in range(20):
            print(f'    @     0x7f0a{i:08x}  absl::log_internal::LogMessage::Die()', file=sys.stderr)
        try:
            try:
                raise OSError('the first cause')
            except OSError as err:
                raise RuntimeError('Failed to start RPC server') from err
        except RuntimeError:
            import traceback
            traceback.print_exc()
        sys.exit(1)
    """)
    with pytest.raises(WorkersFailed) as caught:
        run_workers([failing], timeout=60)
    message = str(caught.value)
    assert message.splitlines()[0].endswith(" s: OSError: the first cause (first error it logged: Failed to add "
                                            "port to server: (Error in bind: Address already in use))")
    assert "@     0x7f0a" not in message and "Check failure stack trace" not in message
    assert "RuntimeError: Failed to start RPC server" in message  # in the tail
    assert "@     0x7f0a" in caught.value.outputs[0].stderr  # outputs keep everything


def test_a_worker_that_prints_nothing_is_said_so():
    with pytest.raises(WorkersFailed, match=r"worker 0 of 1 failed \(exit status 4\) after [\d.]+ s: last printed "
                       "nothing"):
        run_workers([py("import sys; sys.exit(4)")], timeout=60)


def test_a_program_that_does_not_exist_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match=r"command 1: '/no/such/python' is not an executable file"):
        run_workers([py("pass"), ["/no/such/python", "-c", "pass"]], timeout=60)


# --- the parent goes away ----------------------------------------------------------------------------------


def _parent_running(commands: list[list[str]], pid_files: list[Path], *, interrupt: bool,
                    env: dict | None = None) -> tuple[subprocess.Popen, list[int]]:
    """A parent process (a stand-in for a notebook kernel) in the middle of run_workers; the workers' pids.

    Each worker writes its pid to its file in ``pid_files`` once it runs.
    """
    # Ctrl-C raises KeyboardInterrupt in a kernel; a process started from an xdist worker, which ignores
    # SIGINT, would inherit "ignore" across exec, so the parent restores Python's own handler first.
    script = textwrap.dedent(f"""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from spmd_course.scripts.launcher import run_workers
        run_workers({commands!r}, env={env!r}, timeout=600)
    """)
    parent = subprocess.Popen([PY, "-c", script], stderr=subprocess.PIPE, text=True,
                              start_new_session=not interrupt)
    assert wait_until(lambda: all(p.exists() and p.read_text() for p in pid_files), 90), parent.stderr
    return parent, [int(p.read_text()) for p in pid_files]


def _sleepers(tmp_path: Path) -> tuple[list[list[str]], list[Path]]:
    pid_files = [tmp_path / f"worker{i}" for i in range(2)]
    worker = "import os, pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(120)"
    return [[PY, "-c", worker, str(f)] for f in pid_files], pid_files


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_parent_killed_by_sigkill(tmp_path):
    """A kernel restart kills the kernel without letting it clean up: its workers must not be orphaned."""
    parent, workers = _parent_running(*_sleepers(tmp_path), interrupt=False)
    parent.kill()
    parent.wait()
    assert wait_until(lambda: all(gone(pid) for pid in workers), 10)
    assert wait_until(lambda: still_running(workers) == [], 10)  # and reaped, once init has collected them


def test_an_interrupted_parent_stops_its_workers(tmp_path):
    parent, workers = _parent_running(*_sleepers(tmp_path), interrupt=True)
    start = time.monotonic()
    parent.send_signal(signal.SIGINT)  # Ctrl-C, or a notebook's stop button
    _, err = parent.communicate(timeout=60)
    assert time.monotonic() - start < 10
    assert "KeyboardInterrupt" in err
    assert all(gone(pid) for pid in workers) and still_running(workers) == []


# --- the multi-host script itself, two JAX processes, and each fault of a real job ---------------------------

SCRIPT = Path(spmd_worker.__file__)
JAX_ENV = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2")
# Runs the course's script with one fault. It prints "FAULT <time>" at the moment of the fault, so that a
# test can time the launcher from there: starting JAX takes seconds, more on a loaded machine.
FAULTY = textwrap.dedent("""
    import functools, os, pathlib, signal, sys, threading, time
    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from spmd_course.scripts import spmd_worker as worker

    fault = sys.argv.pop(1)
    process = int(sys.argv[sys.argv.index("--process-id") + 1])
    shared = pathlib.Path(sys.argv[sys.argv.index("--shared-dir") + 1])

    def mark():
        print(f"FAULT {time.time()}", file=sys.stderr, flush=True)

    # Short limits, so that the tests can time what the defaults (minutes) would do.
    limits = {"lone": {"heartbeat_timeout_seconds": 3}, "shutdown": {"shutdown_timeout_seconds": 5}}
    jax.distributed.initialize = functools.partial(jax.distributed.initialize, **limits.get(fault, {}))

    def after_initialize(*args):  # replaces train(), the first thing main() does once the processes joined
        if fault == "wait":  # every process
            (shared / f"pid{process}").write_text(str(os.getpid()))
            time.sleep(600)
        if fault == "first" and process == 0:  # the first collective of the job, which process 1 never calls
            mark()
        if fault == "shutdown" and process == 0:  # alive, in no collective
            time.sleep(600)
        if process != 1 or fault in ("leave", "mismatch", "lone"):
            return worker.train.__wrapped__(*args)
        if fault in ("hang", "first", "shutdown"):
            print("worker 1 never calls the collectives of train()", flush=True)
            if fault != "shutdown":
                time.sleep(600)
        mark()
        if fault in ("raise", "shutdown"):
            raise RuntimeError("worker 1 raised after initialize")
        if fault == "exit":
            sys.exit(3)
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)

    def after_training(mesh):  # replaces results_back(), which main() calls once the three trainings are done
        if fault == "leave":  # process 1 leaves while process 0 is in a collective with it
            if process == 1:
                time.sleep(1)
                mark()
                os._exit(0)
            multihost_utils.process_allgather(np.ones(4))
        if fault == "mismatch":  # each process calls a different collective
            if process == 1:
                mark()
                multihost_utils.process_allgather(np.ones(1000))
            else:
                multihost_utils.sync_global_devices("a barrier that process 1 never calls")
        if fault == "lone":  # process 0 alone in a collective, process 1 alive and quiet
            if process == 1:
                time.sleep(600)
            mark()
            def give_up():
                time.sleep(12)
                print("still in the collective after 12 s", file=sys.stderr, flush=True)
                os._exit(7)
            threading.Thread(target=give_up, daemon=True).start()
            multihost_utils.process_allgather(np.ones(4))
        time.sleep(600)

    if fault == "port" and process == 0:
        mark()
    if fault == "crash" and process == 1:
        mark()
        raise RuntimeError("worker 1 crashed before initialize")
    if fault == "hang_at_start" and process == 1:
        mark()
        time.sleep(600)
    after_initialize.__wrapped__ = worker.train
    worker.train = after_initialize
    worker.results_back = after_training
    if fault == "shutdown":  # without exit_on_error: an exception leaves through JAX's exit hook
        worker.main()
    else:
        worker.exit_on_error(worker.main)
""")


def faulty(fault: str, port: int, shared: Path, init_timeout: int = 60) -> list[list[str]]:
    return [[PY, "-c", FAULTY, fault, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
             "--process-id", str(i), "--init-timeout", str(init_timeout), "--shared-dir", str(shared)]
            for i in range(2)]


def fails_soon(commands: list[list[str]], timeout: float = 120) -> tuple[WorkersFailed, float]:
    """Run the workers until they fail; the error, and the seconds from the fault to the error."""
    with pytest.raises(WorkersFailed) as caught:
        run_workers(commands, env=JAX_ENV, timeout=timeout)
    raised = time.time()
    marks = [float(line.split()[1]) for o in caught.value.outputs for line in o.stderr.splitlines()
             if line.startswith("FAULT ")]
    assert len(marks) == 1, str(caught.value)
    return caught.value, raised - marks[0]


def test_the_script_on_a_taken_port_fails_at_once_and_says_why(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        error, seconds = fails_soon(faulty("port", squatter.getsockname()[1], tmp_path))
    assert seconds < 10, str(error)
    headline = str(error).splitlines()[0]
    assert headline.startswith("worker 0 of 2 failed (")  # exit status 1, or now and then a SIGSEGV
    assert "Failed to add port to server" in headline  # the cause; jax 0.12 adds "Address already in use"
    assert error.outputs[1].stopped
    assert nothing_left(error.outputs)


@pytest.mark.parametrize("fault,cause", [("crash", "crashed before initialize"), ("raise", "raised after initialize")])
def test_an_exception_before_or_after_initialize_ends_the_run_at_once(fault, cause, tmp_path):
    """After initialize, without the script's exit_on_error, JAX's exit hook would hold worker 1 at the shutdown
    barrier for minutes; before it, the worker simply exits."""
    error, seconds = fails_soon(faulty(fault, free_loopback_port(), tmp_path))
    assert seconds < 10, str(error)
    assert str(error).startswith("worker 1 of 2 failed (exit status 1) after ")
    assert str(error).splitlines()[0].endswith(f" s: RuntimeError: worker 1 {cause}")
    assert error.outputs[0].stopped and nothing_left(error.outputs)


def test_sys_exit_after_initialize_ends_the_run_at_once_with_its_status(tmp_path):
    """sys.exit raises SystemExit, which would also leave through JAX's shutdown barrier: exit_on_error ends it."""
    error, seconds = fails_soon(faulty("exit", free_loopback_port(), tmp_path))
    assert seconds < 10, str(error)
    assert str(error).startswith("worker 1 of 2 failed (exit status 3) after ")  # its own status, not worker 0 blamed
    assert str(error).splitlines()[0].endswith(" s: SystemExit: 3")
    assert error.outputs[0].stopped and nothing_left(error.outputs)
    assert "another task died" not in str(error)  # nothing worker 0 logged once the stop began


@pytest.mark.parametrize(("err", "status"), [(SystemExit(3), 3), (SystemExit(0), 0), (SystemExit(None), 0),
                                             (SystemExit("raise ROWS"), 1), (RuntimeError("x"), 1),
                                             (KeyboardInterrupt(), 1)])
def test_exit_status_is_the_one_python_gives(err, status):
    assert spmd_worker.exit_status(err) == status


# --- how long a process waits for another (notebook 23, section 7), with short limits ----------------------


def test_a_peer_that_leaves_during_a_collective_is_noticed_within_a_second_or_two(tmp_path):
    """On CPU, gloo sees the connection close: no heartbeat is needed."""
    error, seconds = fails_soon(faulty("leave", free_loopback_port(), tmp_path))
    assert seconds < 5, str(error)
    headline = str(error).splitlines()[0]
    assert headline.startswith("worker 0 of 2 failed (exit status 1)") and "Connection closed by peer" in headline
    assert error.outputs[1].returncode == 0  # the one that left ended "well": no launcher counts that as a failure
    assert nothing_left(error.outputs)


def test_mismatched_collectives_abort_within_a_second_or_two(tmp_path):
    error, seconds = fails_soon(faulty("mismatch", free_loopback_port(), tmp_path))
    assert seconds < 5, str(error)
    assert "Is there a distributed collective mismatch in your code?" in str(error).splitlines()[0]
    assert nothing_left(error.outputs)


@pytest.mark.slow  # waits out a real timeout (12-30 s): make test-slow runs it on both lines
def test_a_lone_collective_waits_past_many_heartbeat_timeouts(tmp_path):
    """Process 1 is alive and sends heartbeats; process 0 sits in a collective it alone called, 4 timeouts long."""
    error, seconds = fails_soon(faulty("lone", free_loopback_port(), tmp_path))
    assert 12 <= seconds < 12 + 10, str(error)
    assert str(error).startswith("worker 0 of 2 failed (exit status 7) after ")  # its own give-up, nothing earlier
    assert str(error).splitlines()[0].endswith("last printed 'still in the collective after 12 s'")
    assert "Traceback" not in error.outputs[0].stderr  # the collective neither returned nor raised
    assert nothing_left(error.outputs)


@pytest.mark.slow  # waits out a real timeout (12-30 s): make test-slow runs it on both lines
def test_a_first_collective_that_a_peer_never_calls_fails_after_gloos_30_s(tmp_path):
    error, seconds = fails_soon(faulty("first", free_loopback_port(), tmp_path))
    assert 25 < seconds < 30 + 15, str(error)
    headline = str(error).splitlines()[0]
    assert headline.startswith("worker 0 of 2 failed (exit status 1)")
    assert "DEADLINE_EXCEEDED" in headline and "GetKeyValue() timed out" in headline
    assert nothing_left(error.outputs)


@pytest.mark.slow  # waits out a real timeout (12-30 s): make test-slow runs it on both lines
def test_an_exception_without_exit_on_error_waits_at_the_shutdown_barrier_then_aborts(tmp_path):
    """Worker 1 raises; JAX's exit hook holds it at the shutdown barrier for shutdown_timeout_seconds (5 here)."""
    error, seconds = fails_soon(faulty("shutdown", free_loopback_port(), tmp_path))
    assert 5 <= seconds < 5 + 15, str(error)
    assert "Barrier timed out" in str(error) and "Shutdown" in str(error)
    assert nothing_left(error.outputs)


def test_a_worker_killed_after_initialize_is_named_at_once(tmp_path):
    error, seconds = fails_soon(faulty("kill", free_loopback_port(), tmp_path))
    assert seconds < 10, str(error)
    assert str(error).startswith("worker 1 of 2 failed (killed by SIGKILL) after ")
    assert " s: last printed 'FAULT " in str(error).splitlines()[0]  # no error line: the last line it printed
    assert error.outputs[0].stopped and nothing_left(error.outputs)


def test_a_worker_that_never_joins_ends_at_the_init_timeout_with_the_cause(tmp_path):
    """Worker 1 hangs before initialize: worker 0 gives up after --init-timeout and says why, in one line."""
    error, seconds = fails_soon(faulty("hang_at_start", free_loopback_port(), tmp_path, init_timeout=5))
    assert seconds < 5 + 10, str(error)
    headline = str(error).splitlines()[0]
    assert headline.startswith("worker 0 of 2 failed (")
    assert "DEADLINE_EXCEEDED" in headline and "@ 0x" not in str(error)
    assert error.outputs[1].stopped and nothing_left(error.outputs)


def test_a_hang_after_initialize_is_reported_at_the_timeout_with_what_each_worker_did_last(tmp_path):
    start = time.monotonic()
    with pytest.raises(WorkersFailed) as caught:
        run_workers(faulty("hang", free_loopback_port(), tmp_path), env=JAX_ENV, timeout=15)
    assert time.monotonic() - start < 15 + 5
    lines = str(caught.value).splitlines()
    assert lines[0] == "timed out after 15 s with worker(s) 0, 1 of 2 still running; every worker was stopped."
    assert lines[1] == "Still running, each waiting for another, or hung:"
    assert lines[2].startswith("  worker 0, last printed: 'RESULT {\"process\": 0, \"topic\": \"topology\"")
    assert lines[3] == "  worker 1, last printed: 'worker 1 never calls the collectives of train()'"
    assert nothing_left(caught.value.outputs)


def test_ctrl_c_of_the_launcher_stops_joined_jax_workers_at_once(tmp_path):
    """Both workers have joined the job (and so ignore SIGTERM) when the launcher is interrupted."""
    commands = faulty("wait", free_loopback_port(), tmp_path)
    parent, workers = _parent_running(commands, [tmp_path / "pid0", tmp_path / "pid1"], interrupt=True, env=JAX_ENV)
    start = time.monotonic()
    parent.send_signal(signal.SIGINT)
    _, err = parent.communicate(timeout=60)
    assert time.monotonic() - start < 10
    assert "KeyboardInterrupt" in err
    assert all(gone(pid) for pid in workers) and still_running(workers) == [] and children() == []


# --- the small helpers and bad input -----------------------------------------------------------------------


def test_free_loopback_port_can_be_bound_on_loopback():
    port = free_loopback_port()
    assert isinstance(port, int) and 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_still_running_sees_a_live_group_and_not_a_finished_one():
    sleeper = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        assert still_running([sleeper.pid]) == [sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert still_running([sleeper.pid]) == []


@pytest.mark.parametrize("pids", [[0], [-3], ["12"], [True]])
def test_still_running_rejects_what_is_not_a_pid(pids):
    with pytest.raises(ValueError, match="process ids"):
        still_running(pids)


@pytest.mark.parametrize(("commands", "fix"), [
    ([], "a list of commands"),
    ("python worker.py", "a list of commands"),
    (["python", "worker.py"], "command 0 must be a non-empty list"),
    ([[]], "command 0 must be a non-empty list"),
    ([[PY, 3]], "command 0 must be a non-empty list"),
])
def test_bad_commands_are_refused_with_the_fix(commands, fix):
    with pytest.raises(ValueError, match=fix):
        run_workers(commands)


@pytest.mark.parametrize(("kwargs", "fix"), [
    ({"timeout": 0}, "timeout is in seconds and must be > 0"),
    ({"timeout": "60"}, "timeout is in seconds"),
    ({"tail_lines": 0}, "tail_lines must be a whole number >= 1"),
])
def test_bad_limits_are_refused_with_the_fix(kwargs, fix):
    with pytest.raises(ValueError, match=fix):
        run_workers([py("pass")], **kwargs)


def test_the_message_quotes_only_the_last_lines():
    noisy = py("import sys\nfor i in range(50): print(f'line {i}', file=sys.stderr)\nsys.exit(1)")
    with pytest.raises(WorkersFailed) as caught:
        run_workers([noisy], tail_lines=3, timeout=60)
    message = str(caught.value)
    assert "line 47" in message and "line 49" in message and "line 46" not in message
    assert caught.value.outputs[0].stderr.count("\n") == 50  # all of it is kept in outputs


def test_an_uncaught_workers_failed_shows_its_report_without_the_launchers_frames(capsys):
    """In a notebook an uncaught WorkersFailed shows the report alone (IPython's _render_traceback_ hook)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.user_ns.update(run_workers=run_workers,
                         command=py("import sys; print('bad input', file=sys.stderr); sys.exit(2)"))
    result = shell.run_cell("run_workers([command], timeout=60)")
    shown = capsys.readouterr().out.strip()
    assert isinstance(result.error_in_exec, WorkersFailed)
    assert shown.startswith("WorkersFailed: worker 0 of 1 failed (exit status 2) after "), shown
    assert "bad input" in shown and "Traceback" not in shown and "launcher.py" not in shown


def test_worker_output_names_its_status():
    assert WorkerOutput(0, 1, 0, "", "").status() == "exit status 0"
    assert WorkerOutput(0, 1, -9, "", "", stopped=True).status() == "stopped (SIGKILL)"
    assert WorkerOutput(0, 1, -11, "", "").status() == "killed by SIGSEGV"


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
def test_a_jupyter_kernel_restart_leaves_no_worker(tmp_path):
    """The case the launcher exists for: a notebook's kernel restarted while its workers run."""
    from jupyter_client.manager import start_new_kernel

    pids = [tmp_path / f"worker{i}" for i in range(2)]
    worker = "import os, pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); time.sleep(120)"
    cell = ("import sys\n"
            "from spmd_course.scripts.launcher import run_workers\n"
            f"run_workers([[sys.executable, '-c', {worker!r}, {str(pids[0])!r}], "
            f"[sys.executable, '-c', {worker!r}, {str(pids[1])!r}]], timeout=120)")
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        kc.execute(cell)
        assert wait_until(lambda: all(p.exists() and p.read_text() for p in pids), 60)
        workers = [int(p.read_text()) for p in pids]
        km.restart_kernel(now=True)  # what JupyterLab's "Restart kernel" does to a busy kernel
        assert wait_until(lambda: all(gone(pid) for pid in workers), 10)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert wait_until(lambda: still_running(workers) == [], 10)  # and reaped, once init has collected them


def test_the_tests_notebook_21_names_exist():
    """Notebook 23's section 7 points to the tests that time each case: each name it quotes is a test here."""
    import re

    text = (ROOT / "notebooks" / "23_multihost.py").read_text()
    quoted = [q.strip(".") for q in re.findall(r"`((?:test_|\.\.\._)[a-z0-9_.]+)`", text)]
    assert len(quoted) >= 5
    tests = [name for name in globals() if name.startswith("test_")]
    for fragment in quoted:
        assert any(fragment.strip("_") in name for name in tests), fragment
