"""Standard output and error that fail with one clear error instead of a traceback.

A command's output may go to a full disk (``> /dev/full``), to a pipe whose reader has gone
(``| head``), or to a closed descriptor. While :func:`guarded` is active, a failed write or
flush on ``sys.stdout`` or ``sys.stderr`` raises :class:`StreamError`, which ``main`` turns
into one line and exit status 3; :func:`silence` then points the broken descriptor at
``/dev/null`` so that the interpreter's own flush at exit does not print a traceback either.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class StreamError(Exception):
    """A write to standard output or standard error failed."""

    def __init__(self, name: str, stream: TextIO, exc: OSError) -> None:
        self.name = name
        self.stream = stream
        self.reason = ("the reader closed the pipe" if exc.errno == errno.EPIPE
                       else "no space left on the device" if exc.errno == errno.ENOSPC
                       else (exc.strerror or str(exc)).lower())
        super().__init__(f"cannot write to {name}: {self.reason}")


class _Guarded:
    """A text stream whose write and flush failures raise :class:`StreamError`."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream = stream
        self._name = name

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError) as exc:  # ValueError: the stream was closed
            raise StreamError(self._name, self._stream, _as_os_error(exc)) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            raise StreamError(self._name, self._stream, _as_os_error(exc)) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _as_os_error(exc: BaseException) -> OSError:
    if isinstance(exc, OSError):
        return exc
    return OSError(errno.EBADF, "the stream is closed")


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Guard ``sys.stdout`` and ``sys.stderr`` for the duration of the block."""
    out, err = sys.stdout, sys.stderr
    sys.stdout = _Guarded(out, "standard output")
    sys.stderr = _Guarded(err, "standard error")
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def silence(stream: TextIO) -> None:
    """Send what is left in a broken standard stream of this process to ``/dev/null``, so
    the flush at exit cannot fail again. Streams other than the process's own (a test's
    capture, say) are left alone."""
    if stream is not sys.__stdout__ and stream is not sys.__stderr__:
        return
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, stream.fileno())
        os.close(fd)
