"""Start several copies of a program, watch them together, and stop them all at the first failure.

The processes of a multi-process JAX job wait for each other: at ``jax.distributed.initialize``,
at every collective, at shutdown. When one of them dies, the others do not fail, they wait, for
minutes or for ever. A launcher that waits on one process at a time, or only for a fixed time,
then reports a bare timeout and hides why the first one died.

:func:`run_workers` starts every command at once and watches all of them together. When one exits
with a non-zero status it kills the others at once and raises :class:`WorkersFailed`, whose first
line names that worker and its first error line (the Python exception, or the first error the C++
runtime logged); when the time limit passes it kills every worker and names those still running,
with the last line each printed. The message then quotes the last lines of every worker's stderr,
without C++ stack frames and without what a worker logged once the stop had begun. When all exit with
status 0 it returns what each printed.

A worker that raises must also *exit*: after ``jax.distributed.initialize``, JAX's exit hook waits at
a shutdown barrier for the other processes (300 s by default), so an uncaught exception leaves the
process running. The course's worker script ends itself with ``os._exit`` after printing its traceback.

Nothing outlives :func:`run_workers`:

- each worker starts in a session of its own (``start_new_session=True``), so its process group
  holds it and anything it starts; stopping kills the whole group;
- stopping uses SIGKILL: a process that has joined a JAX distributed job takes SIGTERM as a
  preemption notice and keeps running;
- on Linux each worker asks the kernel (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, from a small stub that
  then execs the command) to be killed when the thread that started it ends, so a notebook kernel that
  is killed (a kernel restart) takes its workers with it; everywhere an ``atexit`` hook kills the
  workers of a parent that exits normally;
- output goes to temporary files, not pipes, so a worker that prints a lot can never block.

:func:`free_loopback_port` picks a port for a coordinator on 127.0.0.1, and :func:`still_running`
says which workers' process groups still hold a process (the tests assert it is none).
This module knows nothing of JAX: the commands it runs do all the JAX work themselves.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["WorkerOutput", "WorkersFailed", "free_loopback_port", "run_workers", "still_running"]

_live: dict[int, subprocess.Popen[bytes]] = {}  # pid -> worker started by this process and not yet reaped


@dataclass(frozen=True)
class WorkerOutput:
    """What one worker did: its exit status and everything it printed.

    ``returncode`` is the exit status; a negative value -N means the worker was ended by signal N
    (-9: SIGKILL). ``stopped`` is True when :func:`run_workers` killed it because another worker
    failed or the time ran out.
    """

    index: int
    pid: int
    returncode: int
    stdout: str
    stderr: str
    stopped: bool = False

    def status(self) -> str:
        """'exit status 0', 'exit status 1', 'stopped (SIGKILL)' (by run_workers), 'killed by SIGSEGV'."""
        return "stopped (SIGKILL)" if self.stopped else _status(self.returncode)


class WorkersFailed(RuntimeError):
    """A worker failed, or the time ran out; every worker was stopped. ``outputs``: what each one printed."""

    def __init__(self, message: str, outputs: Sequence[WorkerOutput]) -> None:
        super().__init__(message)
        self.outputs = tuple(outputs)

    def _render_traceback_(self) -> list[str]:
        """How IPython shows it, uncaught in a notebook: the report alone, which names the worker and its error.

        The frames inside run_workers add nothing to it, and a notebook reader would take them for the fault.
        """
        return [f"{type(self).__name__}: {self}"]


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that no process listens on right now.

    Check and use the same address: a coordinator told to bind 127.0.0.1 conflicts only with what
    holds 127.0.0.1 (or every interface). Another process can still take the port before the
    coordinator binds it; the coordinator then fails at once and :func:`run_workers` says so.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def still_running(pids: Iterable[int]) -> list[int]:
    """The pids among ``pids`` whose process group still holds a process (a worker or its children).

    Each worker of :func:`run_workers` leads its own process group, whose id is its pid; after a run
    this should be ``[]``.
    """
    alive = []
    for pid in pids:
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ValueError(f"still_running takes process ids (whole numbers > 0); got {pid!r}")
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:  # exists, but belongs to someone else
            pass
        alive.append(pid)
    return alive


# On Linux every worker starts through this stub: it asks the kernel to SIGKILL it when the thread that
# started it ends (prctl(PR_SET_PDEATHSIG), which survives exec), checks that its parent is still there,
# and then becomes the worker with exec (same pid). A stub instead of subprocess's preexec_fn keeps
# Popen on its fast spawn path: no Python code runs in a forked copy of a multithreaded parent (JAX warns
# that a fork of its process may deadlock).
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(1)  # the parent died before the request took effect
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as err:
    print(f"cannot run {sys.argv[2]!r}: {err}", file=sys.stderr)
    os._exit(127)
"""


def _with_parent_death(command: list[str]) -> list[str]:
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *command]


def _kill_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGKILL the worker's process group, reap the worker, and wait (up to ``grace`` s) for the group to empty.

    What the worker started is reaped by init (or a subreaper), a moment after the SIGKILL.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # where the group is gone but the leader is not yet reaped
    proc.wait()
    _live.pop(proc.pid, None)
    deadline = time.monotonic() + grace
    while still_running([proc.pid]) and time.monotonic() < deadline:
        time.sleep(0.02)


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_live.values()):
        _kill_group(proc)


# A line of C++ logging (absl): severity, date, time, thread, file:line], then the message.
_LOG_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]]+\] ?(.*)$")
# What is not a message: C++ stack frames ("    @     0x7f... absl::..."), the banners around them, and the
# lines of ^ and ~ under a traceback's code.
_NOISE = re.compile(r"^\s*(@\s+0x[0-9a-f]+|\*\*\* (Check failure stack trace|SIG\w+ received)|PC: @ |[~^]+\s*$)")


def _meaningful(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not _NOISE.match(line)]


def _cause(stderr: str) -> str:
    """The first error line of a worker: its Python exception and the first error C++ logged; "" if none.

    The exception is the line that ends the first traceback; chained exceptions start with the cause.
    """
    lines = _meaningful(stderr)
    logged = next((m.group(2) for line in lines if (m := _LOG_LINE.match(line)) and m.group(1) in "EF"), "")
    raised = ""
    if "Traceback (most recent call last):" in lines:
        after = lines[lines.index("Traceback (most recent call last):") + 1:]
        raised = next((line for line in after if not line.startswith(" ")), "")
    if raised and logged:
        return f"{raised} (first error it logged: {logged})"
    return raised or logged


def _tail(text: str, lines: int) -> str:
    kept = _meaningful(text)[-lines:]
    return "\n".join(f"    {line}" for line in kept) if kept else "    (nothing)"


def _last_printed(out: typing.IO[bytes], err: typing.IO[bytes]) -> str:
    """The last line a worker wrote to stdout or stderr, whichever of the two it wrote to last.

    File times are coarse (a few ms): where both changed in the same tick, stderr counts as the later.
    """
    written = [(os.fstat(f.fileno()).st_mtime_ns, rank, f) for rank, f in enumerate((out, err))
               if os.fstat(f.fileno()).st_size]
    if not written:
        return "nothing"
    latest = max(written, key=lambda w: w[:2])[2]
    latest.seek(0)
    lines = _meaningful(latest.read().decode(errors="replace"))
    return repr(lines[-1].strip()[:300]) if lines else "nothing"


def _report(headline: str, outputs: Sequence[WorkerOutput], tail_lines: int, before_stop: Sequence[int]) -> str:
    """The headline, then the last lines each worker wrote to stderr before the stop (``before_stop``: bytes)."""
    parts = [headline]
    for out, size in zip(outputs, before_stop, strict=False):
        written = out.stderr.encode(errors="replace")[:size].decode(errors="replace")
        parts.append(f"--- worker {out.index} (pid {out.pid}): {out.status()}; last lines of its stderr:")
        parts.append(_tail(written, tail_lines))
    return "\n".join(parts)


def _check_commands(commands: Sequence[Sequence[str]]) -> list[list[str]]:
    if isinstance(commands, str) or not isinstance(commands, Sequence) or not commands:
        raise ValueError("run_workers takes a list of commands, one per worker, each a list of strings, such as "
                         f"[[sys.executable, 'worker.py', '0'], [sys.executable, 'worker.py', '1']]; got {commands!r}")
    checked = []
    for i, command in enumerate(commands):
        if isinstance(command, str) or not isinstance(command, Sequence) or not command or not all(
            isinstance(part, str | os.PathLike) for part in command
        ):
            raise ValueError(f"command {i} must be a non-empty list of strings (the program, then its arguments), "
                             f"such as [sys.executable, 'worker.py', '--process-id', '{i}']; got {command!r}")
        checked.append([os.fspath(part) for part in command])
    return checked


def run_workers(
    commands: Sequence[Sequence[str]],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    cwd: str | os.PathLike[str] | None = None,
    tail_lines: int = 12,
) -> list[WorkerOutput]:
    """Run one process per command, all at once; return what each printed when every one exits with 0.

    ``env`` is the whole environment of every worker (default: this process's). At the first worker
    that exits with a non-zero status the others are killed and :class:`WorkersFailed` is raised,
    naming that worker and its first error line. Once ``timeout`` seconds have passed every worker is
    killed and :class:`WorkersFailed` names those still running, with the last line each printed, and
    those that had already exited. The message then quotes the last ``tail_lines`` lines of every
    worker's stderr (C++ stack frames left out); its ``outputs`` hold all they printed. An interrupt
    (Ctrl-C, a notebook's stop button) stops every worker too.
    """
    checked = _check_commands(commands)
    search = (os.environ if env is None else env).get("PATH", os.defpath)
    for i, command in enumerate(checked):
        if shutil.which(command[0], path=search) is None:
            raise ValueError(f"command {i}: {command[0]!r} is not an executable file, nor a program on PATH; "
                             "give its full path (for Python: sys.executable)")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"timeout is in seconds and must be > 0, such as timeout=120; got {timeout!r}")
    if isinstance(tail_lines, bool) or not isinstance(tail_lines, int) or tail_lines < 1:
        raise ValueError(f"tail_lines must be a whole number >= 1, such as 12; got {tail_lines!r}")

    procs: list[subprocess.Popen[bytes]] = []
    stopped: set[int] = set()
    headline = ""
    with contextlib.ExitStack() as files:
        logs = [(files.enter_context(tempfile.TemporaryFile()), files.enter_context(tempfile.TemporaryFile()))
                for _ in checked]
        start = time.monotonic()
        try:
            for i, (command, (out, err)) in enumerate(zip(checked, logs, strict=True)):
                try:
                    proc = subprocess.Popen(_with_parent_death(command), stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=err, env=None if env is None else dict(env), cwd=cwd,
                                            start_new_session=True)
                except OSError as e:
                    headline = f"could not start worker {i} ({command[0]}): {e}; the others were stopped."
                    break
                procs.append(proc)
                _live[proc.pid] = proc
            exited: dict[int, float] = {}  # worker -> seconds after the start at which it was seen to exit
            while not headline:
                now = time.monotonic() - start
                codes = [p.poll() for p in procs]
                exited.update({i: now for i, code in enumerate(codes) if code is not None and i not in exited})
                failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
                if failed:
                    first = min(failed, key=exited.__getitem__)
                    err = logs[first][1]
                    err.seek(0)
                    cause = _cause(err.read().decode(errors="replace")) or f"last printed {_last_printed(*logs[first])}"
                    headline = (f"worker {first} of {len(checked)} failed ({_status(codes[first])}) after "
                                f"{exited[first]:.1f} s: {cause}\nThe others were stopped.")
                elif all(code == 0 for code in codes):
                    break
                elif now > timeout:
                    headline = _timed_out(timeout, codes, exited, logs)
                else:
                    time.sleep(0.05)
        finally:  # after a failure, a timeout, an interrupt or success: nothing is left running
            # What each had written before the stop: a worker that outlives another by a moment logs that the
            # other died ("another task died"), which would bury its own last lines in the report.
            before_stop = [os.fstat(err.fileno()).st_size for _, err in logs]
            for proc in procs:  # all groups first, so that none sees another die before its own SIGKILL
                if proc.poll() is None:
                    stopped.add(proc.pid)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
            for proc in procs:
                _kill_group(proc)
        outputs = []
        for i, (proc, (out, err)) in enumerate(zip(procs, logs, strict=False)):
            out.seek(0)
            err.seek(0)
            outputs.append(WorkerOutput(i, proc.pid, int(proc.returncode), out.read().decode(errors="replace"),
                                        err.read().decode(errors="replace"), stopped=proc.pid in stopped))
    if headline:
        raise WorkersFailed(_report(headline, outputs, tail_lines, before_stop), outputs)
    return outputs


def _timed_out(timeout: float, codes: Sequence[int | None], exited: Mapping[int, float],
               logs: Sequence[tuple[typing.IO[bytes], typing.IO[bytes]]]) -> str:
    running = [i for i, code in enumerate(codes) if code is None]
    lines = [f"timed out after {timeout:g} s with worker(s) {', '.join(map(str, running))} of {len(codes)} still "
             "running; every worker was stopped."]
    done = [i for i in range(len(codes)) if i not in running]
    if done:  # the ones still running were waiting for these, at a collective or at shutdown
        lines.append(f"Still running, waiting for worker(s) {', '.join(map(str, done))}, which had exited ("
                     + ", ".join(f"worker {i}: {_status(codes[i])} after {exited[i]:.1f} s" for i in done) + "):")
    else:
        lines.append("Still running, each waiting for another, or hung:")
    for i in running:
        err = logs[i][1]
        err.seek(0)
        stderr = err.read().decode(errors="replace")
        lines.append(f"  worker {i}, last printed: {_last_printed(*logs[i])}")
        if "Traceback (most recent call last):" in stderr:  # a JAX process that raised waits at its exit barrier
            lines.append(f"    it raised, but did not exit: {_cause(stderr)}")
    return "\n".join(lines)


def _status(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
