"""Running out of disk space: one error, :class:`DiskFull`, whose message is one line.

A run writes three kinds of files: small text files it replaces atomically (``config.json``, a widened
``metrics.csv``), rows appended to ``metrics.csv`` and records appended to a TensorBoard event file, and orbax
checkpoints written by background threads. Each fails differently when the disk fills up: ``OSError(ENOSPC)``
from ``os.write``, a short write followed by one, and a tensorstore ``ValueError`` such as ``RESOURCE_EXHAUSTED:
Error writing ... No space left on device [os_error_code='28']`` re-raised by orbax's next wait. This module
tells them apart from other errors (:func:`is_out_of_space`) and turns them into a :class:`DiskFull` naming what
was written, where, and how much space is left.

Out of space means ``ENOSPC`` (the file system is full), ``EDQUOT`` (the user's quota is) or ``EFBIG`` (the file
would exceed the largest size the process may write, ``RLIMIT_FSIZE``: tests use it to fill a "disk" without
mounting one).

:func:`write_all` is the one ``os.write`` loop of the run files: it writes everything or raises, and callers that
must not leave a partial record cut the file back to its previous size (see :mod:`lpjax.run_logging`).
"""

from __future__ import annotations

import errno
import os
import pathlib
import re

OUT_OF_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""``errno`` values that mean a write found no space: a full file system, an exhausted quota, a file size limit."""

_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")  # tensorstore's errors carry the errno this way
_STRERRORS = {os.strerror(code): code for code in OUT_OF_SPACE_ERRNOS}


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes an unprivileged process may still write on the file system holding ``path`` (or its nearest
    existing parent): ``statvfs``'s ``f_bavail * f_frsize``."""
    path = pathlib.Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def format_bytes(count: int) -> str:
    """``count`` bytes for people: ``0 B``, ``512 B``, ``12.5 KiB``, ``3.0 GiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def out_of_space_errno(error: BaseException | None) -> int | None:
    """The ``errno`` of :data:`OUT_OF_SPACE_ERRNOS` that ``error`` (or an exception it was raised from) reports,
    or ``None``: an ``OSError``'s own errno, or tensorstore's ``os_error_code`` or strerror in the message of the
    ``ValueError`` it raises through orbax."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in OUT_OF_SPACE_ERRNOS:
            return error.errno
        message = str(error)
        for code in _OS_ERROR_CODE.findall(message):
            if int(code) in OUT_OF_SPACE_ERRNOS:
                return int(code)
        for text, code in _STRERRORS.items():
            if text in message:
                return code
        error = error.__cause__ or error.__context__
    return None


def is_out_of_space(error: BaseException | None) -> bool:
    """Whether ``error`` means that a write found no space (see :func:`out_of_space_errno`)."""
    return out_of_space_errno(error) is not None


class DiskFull(OSError):
    """A write found no space. ``str()`` is one line: what, where, why, and the space left there.

    Attributes:
      what: what was being written (``"checkpoint 500"``, ``"a metrics row at step 120"``).
      path: the file or directory written to.
      free: bytes left on its file system when the error was raised.
      advice: what to do next (set by the caller that knows, e.g. the run loop: ``"continue with --resume"``).
    """

    def __init__(
        self,
        what: str,
        path: str | os.PathLike,
        error_number: int = errno.ENOSPC,
        detail: str | None = None,
        advice: str | None = None,
    ):
        self.what, self.path, self.advice = what, pathlib.Path(path), advice
        self.free = free_bytes(self.path)
        self.detail = detail or os.strerror(error_number)
        super().__init__(error_number, self.detail, str(self.path))

    def with_advice(self, advice: str) -> DiskFull:
        """The same error with ``advice`` appended to its message."""
        return DiskFull(self.what, self.path, self.errno, self.detail, advice)

    def __str__(self) -> str:
        message = f"cannot write {self.what} to {self.path}: {self.detail} ({format_bytes(self.free)} free there)"
        return f"{message}; {self.advice}" if self.advice else message


def disk_full(error: BaseException, what: str, path: str | os.PathLike) -> DiskFull:
    """``error`` (out of space, see :func:`is_out_of_space`) as a :class:`DiskFull` about ``what`` at ``path``."""
    if isinstance(error, DiskFull):
        return error
    return DiskFull(what, path, out_of_space_errno(error) or errno.ENOSPC)


def write_all(fd: int, data: bytes) -> None:
    """Writes all of ``data`` to file descriptor ``fd`` (``os.write`` may write less than asked: a full disk
    writes what fits, then fails). Raises ``OSError`` (e.g. ``ENOSPC``) after writing any part of it."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


__all__ = [
    "OUT_OF_SPACE_ERRNOS",
    "DiskFull",
    "disk_full",
    "format_bytes",
    "free_bytes",
    "is_out_of_space",
    "out_of_space_errno",
    "write_all",
]
