"""One writer per run directory: an ``fcntl.flock`` on ``<run_dir>/run.lock``, held for the run's life.

A second process that opens the same directory, to start a run or to resume one, finds the lock held and
refuses with one line naming the holder, before it writes anything::

    lock = DirectoryLock(run_dir).acquire()     # DirectoryBusy: "... in use by pid 4242 on host node1, started ..."
    try:
        ...                                     # validate the run's files; on a refusal: lock.release(restore=True)
    finally:
        lock.release()

**Why flock.** The operating system releases the lock when its holder dies, however it dies (SIGKILL
included): a killed run leaves the file, with its stale holder line, but never a held lock, so the next
process takes it. ``flock`` locks belong to an open file description: two ``DirectoryLock`` objects conflict
even within one process, and a child process does not inherit the lock (the file is opened close-on-exec).

**The holder line** (``pid <pid> on host <host>, started <UTC time>``) is written into the file once the lock is
taken, and read by the process that is refused. It is informational: a process that finds the file empty (its
holder is between taking the lock and writing the line) says the holder is unknown.

**Leaving no trace.** A clean release deletes the file (still holding the lock, so that a process that opened it
meanwhile sees, once it holds the lock, that the path no longer names its file, and opens the new one: see
:meth:`DirectoryLock.acquire`). A release after a refusal (``restore=True``) puts the directory back as it was:
the file is deleted if this process created it, or given back its previous bytes (a stale holder line), and a
directory created for the lock is removed.

**Other locks.** ``experiments/run_farm.py`` keeps its own ``.lock`` in each run directory for the farm's
bookkeeping (deciding whether to start or resume, recording sessions); the training it starts, in the same
process or in a subprocess, takes this lock on ``run.lock``. The two files never conflict.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import pathlib
import socket

from lpjax.disk import disk_full, is_out_of_space, write_all

LOCK_FILE = "run.lock"


class DirectoryBusy(ValueError):
    """Another process holds the run directory's lock; the message is one line naming it (pid, host, start)."""

    def __init__(self, message: str, holder: str | None):
        super().__init__(message)
        self.holder = holder


def holder_line() -> str:
    """What this process writes into a lock it holds: ``pid <pid> on host <host>, started <UTC time>``."""
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"pid {os.getpid()} on host {socket.gethostname()}, started {started}"


def _read(fd: int) -> bytes:
    chunks = []
    while chunk := os.pread(fd, 65536, sum(len(c) for c in chunks)):
        chunks.append(chunk)
    return b"".join(chunks)


def _rewrite(fd: int, data: bytes) -> None:
    """Replaces the contents of the file open as ``fd`` with ``data``."""
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    write_all(fd, data)


def lock_holder(directory: str | os.PathLike) -> str | None:
    """The holder line of ``directory``'s lock if another open file holds it (``"unknown"`` when its line is not
    written yet), ``None`` if nobody does. Writes nothing and creates nothing."""
    path = pathlib.Path(directory) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read(fd).decode(errors="replace").strip() or "unknown"
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class DirectoryLock:
    """The lock of one run directory (see the module docstring).

    Args:
      directory: the run directory; created by :meth:`acquire` if missing.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = pathlib.Path(directory)
        self.path = self.directory / LOCK_FILE
        self._fd: int | None = None
        self._created_file = False
        self._created_dirs: list[pathlib.Path] = []
        self._previous = b""

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> DirectoryLock:
        """Takes the lock without waiting and writes this process's holder line into it; returns ``self``.

        Raises:
          DirectoryBusy: another open file holds it; nothing was created or written.
          DiskFull: the holder line could not be written (nothing is left behind either).
        """
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this object.")
        missing = [p for p in (self.directory, *self.directory.parents) if not p.exists()]
        self.directory.mkdir(parents=True, exist_ok=True)
        self._created_dirs = missing  # innermost first
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                created = True
            except FileExistsError:
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
                except FileNotFoundError:  # deleted by its holder's release in between: try again
                    continue
                created = False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd).decode(errors="replace").strip() or None
                os.close(fd)
                self._remove_created_dirs()
                raise DirectoryBusy(
                    f"{self.directory} is in use by another process ({holder or 'holder unknown'}; lock file "
                    f"{self.path}): wait for it to end, or stop it, or choose another --run_dir.",
                    holder,
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # its holder deleted the file before releasing it: lock the file the path names now
        self._fd, self._created_file = fd, created
        self._previous = b"" if created else _read(fd)
        try:
            _rewrite(fd, (holder_line() + "\n").encode())
        except OSError as error:
            self.release(restore=True)
            if is_out_of_space(error):
                raise disk_full(error, "the lock file", self.path) from None
            raise
        return self

    def release(self, restore: bool = False) -> None:
        """Releases the lock and deletes its file; with ``restore``, puts the directory back as it was before
        :meth:`acquire` (the file's previous bytes, or no file and no directory created for it). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if restore and not self._created_file:
                _rewrite(fd, self._previous)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        except OSError as error:  # restoring a stale holder line on a full disk: leave it empty
            if not is_out_of_space(error):
                raise
        finally:
            os.close(fd)  # releases the flock
        if restore:
            self._remove_created_dirs()

    def _remove_created_dirs(self) -> None:
        for directory in self._created_dirs:
            try:
                directory.rmdir()
            except OSError:
                break
        self._created_dirs = []

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


__all__ = ["LOCK_FILE", "DirectoryBusy", "DirectoryLock", "holder_line", "lock_holder"]
