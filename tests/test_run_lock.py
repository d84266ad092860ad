"""lpjax.run_lock: one writer per run directory. A second lock is refused naming the holder, a killed holder's
lock is free, a release after a refusal leaves the directory as it was."""

import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

from lpjax.run_lock import LOCK_FILE, DirectoryBusy, DirectoryLock, lock_holder

REPO = pathlib.Path(__file__).resolve().parents[1]

# Takes the lock of argv[1], says so on stdout, and sleeps until killed.
HOLDER = """
import sys, time
from lpjax.run_lock import DirectoryLock
lock = DirectoryLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def _tree(directory: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"<dir>" for p in directory.rglob("*")}


def test_a_second_lock_is_refused_with_the_holder_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    with DirectoryLock(run_dir) as lock:
        held = (run_dir / LOCK_FILE).read_text()
        assert held.startswith(f"pid {os.getpid()} on host {socket.gethostname()}, started 20") and held.endswith(
            " UTC\n"
        )
        before = _tree(run_dir)
        with pytest.raises(DirectoryBusy) as refused:  # flock: two open files conflict even in one process
            DirectoryLock(run_dir).acquire()
        message = str(refused.value)
        assert "\n" not in message and message.startswith(f"{run_dir} is in use by another process (pid {os.getpid()}")
        assert refused.value.holder == held.strip() and isinstance(refused.value, ValueError)
        assert _tree(run_dir) == before
        assert lock_holder(run_dir) == held.strip() and lock.held
    assert not (run_dir / LOCK_FILE).exists() and lock_holder(run_dir) is None  # a clean release leaves no file


def test_a_killed_holder_leaves_a_stale_file_that_does_not_block(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(DirectoryBusy, match=rf"in use by another process \(pid {holder.pid} on host "):
            DirectoryLock(run_dir).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    stale = (run_dir / LOCK_FILE).read_text()
    assert stale.startswith(f"pid {holder.pid} ")  # the file stays, the lock went with the process
    assert lock_holder(run_dir) is None
    with DirectoryLock(run_dir):
        assert (run_dir / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} ")


def test_a_release_after_a_refusal_puts_the_directory_back(tmp_path):
    fresh = tmp_path / "a" / "b"
    DirectoryLock(fresh).acquire().release(restore=True)
    assert not (tmp_path / "a").exists()  # the directories created for the lock are gone too
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / LOCK_FILE).write_bytes(b"pid 1 on host gone, started 2020-01-01 00:00:00 UTC\n")
    before = _tree(stale)
    lock = DirectoryLock(stale).acquire()
    assert (stale / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} ")
    lock.release(restore=True)
    lock.release()  # idempotent
    assert _tree(stale) == before


def test_a_lock_whose_file_was_replaced_is_not_taken_on_the_old_file(tmp_path):
    """The holder deletes the file before it releases: a process that opened the old file locks the new one."""
    first = DirectoryLock(tmp_path).acquire()
    old = os.open(tmp_path / LOCK_FILE, os.O_RDWR)  # a second process opened the file, then the holder released
    first.release()
    try:
        with DirectoryLock(tmp_path) as second:
            assert os.fstat(old).st_ino != os.stat(second.path).st_ino
            with pytest.raises(DirectoryBusy):
                DirectoryLock(tmp_path).acquire()
    finally:
        os.close(old)
