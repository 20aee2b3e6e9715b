"""Capture what C++ libraries and stray prints write while a block of code runs.

XLA, libtpu and absl write straight to file descriptors 1 and 2, past ``sys.stdout`` and ``warnings``, so
``contextlib.redirect_stdout`` cannot catch them. :func:`quiet` is the course's one redirection of them.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Captured", "quiet"]


@dataclass
class Captured:
    """What a :func:`quiet` block printed (descriptors 1 and 2, Python's streams) in order; set when it ends."""

    text: str = ""


def _fd_writer(fd: int) -> io.TextIOWrapper:
    """A text stream that writes straight to a file descriptor, unbuffered, so it keeps its order with C++ output."""
    return io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False), encoding="utf-8", errors="replace",
                            write_through=True)


def _flush_c_stdio() -> None:
    """Flush C's stdio buffers (printf, std::cout) so their text lands where the descriptor points now."""
    with contextlib.suppress(OSError, AttributeError, TypeError):  # no C library to call (Windows): nothing to push
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def quiet() -> Iterator[Captured]:
    """Run a block with everything it prints caught instead of shown: ``with quiet() as out:``, then ``out.text``.

    Catches file descriptors 1 and 2 (XLA, libtpu, absl) and ``sys.stdout``/``sys.stderr``. Exceptions
    propagate, the text before them still in ``out``. Blocks nest (the inner one gets the text). Not
    thread-safe: other threads' output is caught too.
    """
    captured = Captured()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    _flush_c_stdio()
    log = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115 - closed in the finally below, after the yield
    saved_fds = (os.dup(1), os.dup(2))
    saved_streams = (sys.stdout, sys.stderr)
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout, sys.stderr = _fd_writer(1), _fd_writer(2)
        yield captured
    finally:
        _flush_c_stdio()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        os.close(saved_fds[0])
        os.close(saved_fds[1])
        log.seek(0)
        captured.text = log.read().decode("utf-8", errors="replace")
        log.close()
