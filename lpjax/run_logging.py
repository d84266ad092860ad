"""Run logging: a run directory with the resolved config, a metrics CSV and TensorBoard events.

A run directory written by :class:`RunLogger` holds::

    run_dir/config.json                         the resolved config (ml_collections ConfigDict or dict)
    run_dir/metrics.csv                         one row per log() call: step, wall_time, then metric columns
    run_dir/events.out.tfevents.*               TensorBoard scalars (tensorboardX), one file per writer

The config is converted with :func:`lpjax.jsonable.to_jsonable`; :mod:`lpjax.plots` draws learning curves from
the CSV.

**One wide CSV.** Columns are ``step``, ``wall_time`` (Unix seconds) and one column per metric, named
``prefix/key`` (e.g. ``train/critic_loss``, ``eval/return``) in order of first appearance. Each ``log`` call
appends one row; columns it does not log are left empty (so train and eval rows at the same step are two rows).
When a call brings a new metric, the file is rewritten once with the wider header (through a temporary file
and ``os.replace``, so a crash leaves either the old or the new file, never a mix); afterwards rows are
appended and flushed. :func:`read_metrics` reads the file back.

**Values.** Metrics may be Python numbers, numpy scalars or size-1 jax/numpy arrays; they are converted to
float. Non-finite values (nan, +-inf) are written as ``nan`` (not dropped, so a divergence shows in the log) and
counted in :attr:`RunLogger.nonfinite_counts`.

**TensorBoard** events need tensorboardX (the ``runs`` extra, ``pip install 'lpjax[runs]'``), imported when a
``RunLogger`` with ``tensorboard=True`` is created; the CSV needs nothing beyond numpy.

**Resume.** Opening a ``RunLogger`` on an existing run directory appends to its ``metrics.csv`` (a partial last
line left by a crash is dropped) and adds a new event file next to the old ones. After restoring a checkpoint of
step ``s``, call ``truncate_after(s)``: it removes CSV rows with ``step > s`` and makes TensorBoard discard the
old events with ``step > s`` (a ``purge_step``), so resumed steps are not logged twice.

**Damaged files are refused before anything is written.** :func:`check_metrics` reads a whole ``metrics.csv``
and :func:`read_config` a ``config.json``; a problem raises ``ValueError`` with one line naming the file, the line
and the problem (``metrics.csv, line 7: step 'abc' is not an integer``). A ``RunLogger`` checks the CSV before it
replaces ``config.json``, and :func:`experiments.run.run` checks both before it writes anything.

**A full disk** never leaves half a record. CSV rows and TensorBoard records are appended with ``os.write``
(:func:`lpjax.disk.write_all`); when a write fails, the file is cut back to its size before the write, and the
error is raised as :class:`lpjax.disk.DiskFull` (one line: the file, what was written, the space left). Files
that are replaced (``config.json``, the CSV with a wider header) are written to a temporary file first, which is
removed when the write fails, so the old file stays whole.

**TensorBoard events** are written by this module in the calling thread (tensorboardX's protobufs and record
format, not its ``SummaryWriter``, whose writer thread would die on a full disk with a traceback and leave
``log`` blocked on its queue). Records are buffered and reach the file every 10 seconds, at :meth:`RunLogger.flush`
and at :meth:`RunLogger.close`.

This module is named ``run_logging`` rather than ``logging``: ``from lpjax import logging`` would shadow the
standard library's ``logging`` in user code, and a ``logging.py`` on ``sys.path`` breaks every library that
logs (absl, orbax, jax).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import pathlib
import socket
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from lpjax._optional import require
from lpjax.disk import disk_full, is_out_of_space, write_all
from lpjax.jsonable import to_jsonable

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.csv"
INDEX_COLUMNS = ("step", "wall_time")


def _to_float(name: str, value: Any) -> float:
    """A metric value as a float: Python/numpy/jax scalars and size-1 arrays."""
    if isinstance(value, (str, bytes)) or value is None:
        raise ValueError(f"metric {name!r} must be a number or a size-1 array, got {value!r}.")
    array = np.asarray(value)
    real = array.dtype.kind in "biuf" or array.dtype.type.__module__ == "ml_dtypes"  # bfloat16, float8, int4
    if array.size != 1 or not real:
        raise ValueError(
            f"metric {name!r} must be a number or a size-1 array, got {array.dtype.name} of shape "
            f"{list(array.shape)}; log a reduction (mean, max, ...) instead."
        )
    return float(array.reshape(()).astype(np.float64))


def _format(value: float) -> str:
    return repr(value) if math.isfinite(value) else "nan"


def _atomic_write(path: pathlib.Path, text: str, what: str | None = None) -> None:
    """Replaces ``path`` with ``text`` through a temporary file and ``os.replace``: a crash or a full disk leaves
    the old file whole (the temporary file is removed). Raises :class:`lpjax.disk.DiskFull` when out of space."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if is_out_of_space(error):
            raise disk_full(error, what or path.name, path) from None
        raise


def _append(fd: int, data: bytes, what: str, path: pathlib.Path) -> None:
    """Appends ``data`` to ``fd`` (opened with ``O_APPEND``) whole or not at all: if the write fails (a full disk)
    or is interrupted (a signal), the file is cut back to its size before it. Raises :class:`DiskFull` when out
    of space."""
    size = os.fstat(fd).st_size
    try:
        write_all(fd, data)
    except BaseException as error:
        os.ftruncate(fd, size)
        if is_out_of_space(error):
            raise disk_full(error, what, path) from None
        raise


def _csv_text(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def _read_rows(path: pathlib.Path) -> tuple[list[str], list[list[str]], bool]:
    """Header and complete rows of a metrics CSV; also whether a partial last line (a crash mid-write) was seen."""
    text = path.read_text()
    partial = bool(text) and not text.endswith("\n")
    if partial:
        text = text[: text.rfind("\n") + 1]
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return [], [], partial
    return rows[0], rows[1:], partial


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _metrics_problem(header: list[str], row: list[str]) -> str | None:
    """What is wrong with one complete row of a metrics CSV (``None``: nothing)."""
    if not row:
        return "an empty line"
    if len(row) != len(header):
        return f"{len(row)} cells, but the header has {len(header)} columns"
    try:
        int(row[0])
    except ValueError:
        return f"step {row[0]!r} is not an integer"
    for name, cell in zip(header[1:], row[1:]):
        if cell != "" and not _is_number(cell):
            return f"column {name!r} holds {cell!r}, which is not a number"
    if row[1] == "":
        return "no wall_time"
    return None


def check_metrics(path: str | os.PathLike) -> tuple[list[str], list[list[str]], bool]:
    """Reads a whole metrics CSV written by :class:`RunLogger` and checks every line; returns what
    ``_read_rows`` returns (header, complete rows, whether a partial last line was seen).

    A partial last line (a process killed while appending it) is allowed: :class:`RunLogger` drops it. A missing
    or empty file reads as no header and no rows.

    Raises:
      ValueError: one line naming the file, the line and the problem: text that is not UTF-8, a header that does
        not start with ``step,wall_time`` or repeats a column, a row with a different number of cells, a step
        that is not an integer, a value that is not a number.
    """
    path = pathlib.Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], [], False
    try:
        text = data.decode()
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(f"{path}, line {line}: not UTF-8 text (byte {error.start} of the file).") from None
    lines = text.split("\n")
    partial = lines[-1] != ""
    complete = lines[:-1]
    if not complete:
        return [], [], partial
    header = next(csv.reader([complete[0]]), [])
    if tuple(header[:2]) != INDEX_COLUMNS:
        raise ValueError(
            f"{path}, line 1: not a RunLogger metrics file: its header starts with {header[:2]}, "
            f"expected {list(INDEX_COLUMNS)}."
        )
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise ValueError(f"{path}, line 1: the header repeats the columns {repeated}.")
    rows = []
    for number, line in enumerate(complete[1:], start=2):
        row = next(csv.reader([line]), [])
        problem = _metrics_problem(header, row)
        if problem:
            raise ValueError(f"{path}, line {number}: {problem}.")
        rows.append(row)
    return header, rows, partial


def read_config(path: str | os.PathLike) -> dict:
    """The JSON object in a run's ``config.json``.

    Raises:
      FileNotFoundError: there is no such file.
      ValueError: one line naming the file, the line and the problem: not UTF-8, not valid JSON (with JSON's own
        message and column), or valid JSON that is not an object.
    """
    path = pathlib.Path(path)
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(f"{path}, line {line}: not UTF-8 text (byte {error.start} of the file).") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}, line {error.lineno} column {error.colno}: not valid JSON: {error.msg}.") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}, line 1: not a config: a JSON {type(value).__name__}, not an object.")
    return value


def json_line(text: str, key: str) -> int:
    """The line of ``text`` (a JSON document) where ``"key":`` first appears (1 if it does not)."""
    index = text.find(json.dumps(key) + ":")
    if index < 0:
        index = text.find(json.dumps(key))
    return text.count("\n", 0, max(index, 0)) + 1


class _EventFile:
    """One TensorBoard event file, written in the calling thread (see the module docstring).

    Records are TFRecords (length, masked CRC-32C of the length, an ``Event`` protobuf, its masked CRC-32C), as
    tensorboardX writes them; the file is named as tensorboardX names it
    (``events.out.tfevents.<unix time>.<host><suffix>``). Records wait in a buffer and are appended whole (see
    :func:`_append`) every ``flush_secs`` seconds, at :meth:`flush` and at :meth:`close`.
    """

    def __init__(self, directory: pathlib.Path, purge_step: int | None, suffix: str, flush_secs: float = 10.0):
        from tensorboardX.proto import event_pb2, summary_pb2
        from tensorboardX.record_writer import masked_crc32c

        self._event_pb2, self._summary_pb2, self._crc = event_pb2, summary_pb2, masked_crc32c
        self.path = directory / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}{suffix}"
        self._flush_secs = flush_secs
        self._buffer = bytearray()
        self._written = time.monotonic()
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as error:
            if is_out_of_space(error):
                raise disk_full(error, "a TensorBoard event file", self.path) from None
            raise
        self._add(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:  # TensorBoard hides the earlier events with step >= purge_step
            self._add(event_pb2.Event(step=purge_step, file_version="brain.Event:2"))
            start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
            self._add(event_pb2.Event(step=purge_step, session_log=start))
        try:
            self.write()
        except BaseException:
            os.close(self._fd)
            raise

    def _add(self, event) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        self._buffer += header + struct.pack("<I", self._crc(header)) + data + struct.pack("<I", self._crc(data))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        summary = self._summary_pb2.Summary(value=[self._summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        self._add(self._event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def maybe_write(self) -> None:
        """Writes the buffered records if ``flush_secs`` have passed since the last write."""
        if time.monotonic() - self._written >= self._flush_secs:
            self.write()

    def write(self) -> None:
        """Appends the buffered records to the file, whole or not at all (a failed write drops them)."""
        if self._buffer:
            data, self._buffer = bytes(self._buffer), bytearray()
            _append(self._fd, data, "TensorBoard events", self.path)
        self._written = time.monotonic()

    def close(self) -> None:
        try:
            self.write()
        finally:
            os.close(self._fd)


class RunLogger:
    """Logs a run's config and metrics to ``run_dir`` (CSV and TensorBoard); see the module docstring.

    Args:
      run_dir: the run directory, created if missing. An existing one is resumed: rows are appended.
      config: the resolved config (``ml_collections.ConfigDict``, ``FrozenConfigDict``, dict, dataclass), written
        to ``run_dir/config.json`` (replacing any previous one). ``None`` writes nothing.
      tensorboard: also write TensorBoard event files (needs tensorboardX: without it, ``ModuleNotFoundError``
        naming the ``runs`` extra).

    Attributes:
      run_dir: the run directory, a ``pathlib.Path``.
      nonfinite_counts: number of non-finite values logged per column, since this logger was created.

    Usable as a context manager (closes on exit). Not thread-safe; one writer process per run directory.
    """

    def __init__(self, run_dir: str | os.PathLike, config: Any = None, tensorboard: bool = True):
        self.run_dir = pathlib.Path(run_dir)
        self.nonfinite_counts: dict[str, int] = {}
        self._tensorboard = tensorboard
        if tensorboard:
            require("tensorboardX", "runs")
        self._writer: _EventFile | None = None
        self._purge_step: int | None = None
        self._csv_fd: int | None = None
        self._columns: list[str] = list(INDEX_COLUMNS)
        path = self.csv_path
        header, rows, partial = check_metrics(path)  # a damaged file is refused before anything is written
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if config is not None:
            text = json.dumps(to_jsonable(config), indent=2, sort_keys=True) + "\n"
            _atomic_write(self.run_dir / CONFIG_FILE, text, "the config")
        if header:
            self._columns = header
        if partial or not header:
            _atomic_write(path, _csv_text(self._columns, rows), "the metrics")

    @property
    def csv_path(self) -> pathlib.Path:
        """Path of ``metrics.csv``."""
        return self.run_dir / METRICS_FILE

    @property
    def columns(self) -> list[str]:
        """Current CSV columns: ``step``, ``wall_time``, then metric columns in order of first appearance."""
        return list(self._columns)

    @property
    def total_nonfinite(self) -> int:
        """Total number of non-finite values logged since this logger was created."""
        return sum(self.nonfinite_counts.values())

    def _tb(self) -> _EventFile:
        if self._writer is None:
            # Event files are named by the second: a nanosecond-and-pid suffix keeps a second writer in the same
            # second (after truncate_after) from overwriting the first, and the names in time order.
            suffix = f".{time.time_ns()}.{os.getpid()}"
            self._writer = _EventFile(self.run_dir, self._purge_step, suffix)
        return self._writer

    def log(self, step: int, metrics: Mapping[str, Any], prefix: str | None = None) -> None:
        """Appends one row of ``metrics`` at ``step`` to the CSV and to TensorBoard.

        Args:
          step: the global step (an integer, e.g. environment or update steps).
          metrics: ``{key: value}``; values are converted to float, non-finite ones logged as nan and counted.
          prefix: prepended as ``prefix/key`` (e.g. ``"train"``, ``"eval"``); ``None`` or ``""`` for none.

        Raises:
          ValueError: on a non-integer step, a non-scalar value or a key named like an index column.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            step_array = np.asarray(step)
            if step_array.size != 1 or not np.issubdtype(step_array.dtype, np.integer):
                raise ValueError(f"step must be an integer, got {step!r}.")
            step = step_array.reshape(())
        step = int(step)
        row: dict[str, float] = {}
        for key, value in metrics.items():
            name = f"{prefix}/{key}" if prefix else str(key)
            if name in INDEX_COLUMNS:
                raise ValueError(f"metric name {name!r} is reserved for the CSV's index columns {INDEX_COLUMNS}.")
            value = _to_float(name, value)
            if not math.isfinite(value):
                self.nonfinite_counts[name] = self.nonfinite_counts.get(name, 0) + 1
                value = math.nan
            row[name] = value
        new = [name for name in row if name not in self._columns]
        if new:
            self._widen(new)
        values = {"step": str(step), "wall_time": f"{time.time():.3f}"}
        values.update((name, _format(value)) for name, value in row.items())
        line = _csv_text(self._columns, [[values.get(column, "") for column in self._columns]])
        _append(self._csv(), line[line.index("\n") + 1 :].encode(), f"a metrics row at step {step}", self.csv_path)
        if self._tensorboard:
            writer = self._tb()
            for name, value in row.items():
                writer.add_scalar(name, value, step)
            writer.maybe_write()

    def _csv(self) -> int:
        if self._csv_fd is None:
            self._csv_fd = os.open(self.csv_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        return self._csv_fd

    def _close_csv(self) -> None:
        if self._csv_fd is not None:
            os.close(self._csv_fd)
            self._csv_fd = None

    def _widen(self, new: list[str]) -> None:
        """Rewrites the CSV with ``new`` columns appended to the header (old rows padded with empty cells)."""
        self._close_csv()
        header, rows, _ = _read_rows(self.csv_path)
        columns = (header or list(INDEX_COLUMNS)) + new
        padded = [row + [""] * (len(columns) - len(row)) for row in rows]
        _atomic_write(self.csv_path, _csv_text(columns, padded), f"the metrics with the new columns {new}")
        self._columns = columns

    def truncate_after(self, step: int) -> int:
        """Forgets everything logged after ``step``; call it when resuming from a checkpoint of ``step``.

        Removes CSV rows with ``step > step`` (atomic rewrite) and restarts the TensorBoard writer with
        ``purge_step = step + 1``, which tells TensorBoard to hide earlier events with a larger or equal step.

        Returns:
          The number of CSV rows removed.
        """
        step = int(step)
        self._close_csv()
        header, rows, _ = _read_rows(self.csv_path)
        kept = [row for row in rows if row and int(row[0]) <= step]
        _atomic_write(self.csv_path, _csv_text(header or self._columns, kept), f"the metrics up to step {step}")
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._purge_step = step + 1
        return len(rows) - len(kept)

    def flush(self) -> None:
        """Writes the buffered TensorBoard records (CSV rows are written as they are logged)."""
        if self._writer is not None:
            self._writer.write()

    def close(self) -> None:
        """Writes what is buffered and closes the files (also after a failed write). Logging again reopens them."""
        self._close_csv()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def metrics_path(csv_path_or_run_dir: str | os.PathLike) -> pathlib.Path:
    """The metrics CSV of a run directory (``run_dir/metrics.csv``), or the given path if it is not a directory."""
    path = pathlib.Path(csv_path_or_run_dir)
    return path / METRICS_FILE if path.is_dir() else path


def read_metrics(csv_path_or_run_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """Reads a metrics CSV written by :class:`RunLogger` into ``{column: float64 array}``, one entry per row.

    Empty cells (a column not logged in that row) and logged non-finite values both read as nan.
    """
    path = metrics_path(csv_path_or_run_dir)
    if not path.exists():
        raise ValueError(f"no metrics file at {path}.")
    header, rows, _ = _read_rows(path)
    columns = {name: np.full(len(rows), np.nan) for name in header}
    for i, row in enumerate(rows):
        for name, cell in zip(header, row):
            if cell != "":
                columns[name][i] = float(cell)
    return columns


def logged_rows(csv_path_or_run_dir: str | os.PathLike, column: str) -> np.ndarray:
    """Which rows of a metrics CSV have a value in ``column`` (finite or not), as a boolean array: what
    :func:`read_metrics`, which reads empty cells and non-finite values both as nan, cannot tell apart."""
    header, rows, _ = _read_rows(metrics_path(csv_path_or_run_dir))
    if column not in header:
        raise ValueError(f"{metrics_path(csv_path_or_run_dir)} has no column {column!r}; it has {sorted(header)}.")
    j = header.index(column)
    return np.array([len(row) > j and row[j] != "" for row in rows], bool)


__all__ = [
    "CONFIG_FILE",
    "INDEX_COLUMNS",
    "METRICS_FILE",
    "RunLogger",
    "check_metrics",
    "json_line",
    "logged_rows",
    "metrics_path",
    "read_config",
    "read_metrics",
]
