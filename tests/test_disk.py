"""lpjax.disk: which errors mean "no space", the one-line DiskFull, and write_all's loop over short writes."""

import errno
import os

import pytest

from lpjax import disk

TENSORSTORE_ENOSPC = (
    'RESOURCE_EXHAUSTED: Error writing "a/0" in OCDBT database at local file "/r/checkpoints/2.orbax-checkpoint-tmp/'
    'state.orbax-checkpoint-tmp/ocdbt.process_0/": Failed writing: "/r/d/a305": Failed to write 90936 bytes to file '
    "4: No space left on device [os_error_code='28']"
)
TENSORSTORE_EFBIG = (
    "OUT_OF_RANGE: Error writing ... Failed to write 14206 bytes to file 4: File too large [os_error_code='27']"
)


def test_out_of_space_errors_are_told_apart_from_others():
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        assert disk.out_of_space_errno(OSError(code, os.strerror(code))) == code
    assert disk.out_of_space_errno(ValueError(TENSORSTORE_ENOSPC)) == errno.ENOSPC
    assert disk.out_of_space_errno(ValueError(TENSORSTORE_EFBIG)) == errno.EFBIG
    try:  # orbax re-raises the tensorstore error from another one
        try:
            raise ValueError(TENSORSTORE_ENOSPC)
        except ValueError as inner:
            raise RuntimeError("Save Finalize thread failed") from inner
    except RuntimeError as outer:
        assert disk.is_out_of_space(outer)
    for other in (
        OSError(errno.EACCES, "Permission denied"),
        ValueError("NOT_FOUND: Error reading local file"),
        FileNotFoundError(2, "No such file or directory"),
        None,
    ):
        assert not disk.is_out_of_space(other)


def test_disk_full_is_one_line_naming_what_where_and_the_space_left(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "free_bytes", lambda path: 1536)
    error = disk.disk_full(OSError(errno.ENOSPC, "No space left on device"), "a metrics row", tmp_path / "m.csv")
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC and error.free == 1536
    assert (
        str(error)
        == f"cannot write a metrics row to {tmp_path / 'm.csv'}: No space left on device (1.5 KiB free there)"
    )
    advised = error.with_advice("continue with --resume")
    assert str(advised) == str(error) + "; continue with --resume" and "\n" not in str(advised)
    assert disk.disk_full(advised, "something else", tmp_path) is advised  # already explained
    efbig = disk.disk_full(ValueError(TENSORSTORE_EFBIG), "checkpoint 2", tmp_path)
    assert efbig.errno == errno.EFBIG and "File too large" in str(efbig)


def test_free_bytes_and_format_bytes(tmp_path):
    stat = os.statvfs(tmp_path)
    assert abs(disk.free_bytes(tmp_path / "not" / "yet") - stat.f_bavail * stat.f_frsize) < 1 << 30
    assert [disk.format_bytes(n) for n in (0, 1023, 1024, 5 << 20, 3 << 40)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "5.0 MiB",
        "3.0 TiB",
    ]


def test_write_all_finishes_short_writes_and_raises_after_a_partial_one(tmp_path, monkeypatch):
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    real_write, calls, budget = os.write, [], [10]

    def short_write(fd, data):  # the kernel writes at most 3 bytes at a time, and the disk is full after 10
        calls.append(len(data))
        if budget[0] == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(3, len(data), budget[0])
        budget[0] -= n
        return real_write(fd, bytes(data[:n]))

    monkeypatch.setattr(os, "write", short_write)
    disk.write_all(fd, b"abcdefg")
    assert path.read_bytes() == b"abcdefg" and calls == [7, 4, 1]
    with pytest.raises(OSError) as raised:
        disk.write_all(fd, b"hijkl")
    os.close(fd)
    assert raised.value.errno == errno.ENOSPC and calls[3:] == [5, 2]
    assert path.read_bytes() == b"abcdefghij"  # what was written before the error stays: callers cut it back
