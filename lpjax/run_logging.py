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

This module is named ``run_logging`` rather than ``logging``: ``from lpjax import logging`` would shadow the
standard library's ``logging`` in user code, and a ``logging.py`` on ``sys.path`` breaks every library that
logs (absl, orbax, jax).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import pathlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from lpjax._optional import require
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


def _atomic_write(path: pathlib.Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.nonfinite_counts: dict[str, int] = {}
        self._tensorboard = tensorboard
        self._summary_writer = require("tensorboardX", "runs").SummaryWriter if tensorboard else None
        self._writer = None
        self._purge_step: int | None = None
        self._csv_file = None
        if config is not None:
            _atomic_write(self.run_dir / CONFIG_FILE, json.dumps(to_jsonable(config), indent=2, sort_keys=True) + "\n")
        self._columns: list[str] = list(INDEX_COLUMNS)
        path = self.csv_path
        if path.exists():
            header, rows, partial = _read_rows(path)
            if header:
                if tuple(header[:2]) != INDEX_COLUMNS:
                    raise ValueError(
                        f"{path} is not a RunLogger metrics file: its header starts with {header[:2]}, "
                        f"expected {list(INDEX_COLUMNS)}."
                    )
                self._columns = header
            if partial or not header:
                _atomic_write(path, _csv_text(self._columns, rows))
        else:
            _atomic_write(path, _csv_text(self._columns, []))

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

    def _tb(self):
        if self._writer is None:
            # tensorboardX names event files by the second and opens them with "wb": a second writer in the same
            # second would overwrite the first. A nanosecond-and-pid suffix keeps names unique and in time order.
            suffix = f".{time.time_ns()}.{os.getpid()}"
            self._writer = self._summary_writer(
                logdir=str(self.run_dir), purge_step=self._purge_step, filename_suffix=suffix, flush_secs=10
            )
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
        self._csv().write(line[line.index("\n") + 1 :])
        self._csv_file.flush()
        if self._tensorboard:
            writer = self._tb()
            for name, value in row.items():
                writer.add_scalar(name, value, global_step=step)

    def _csv(self):
        if self._csv_file is None:
            self._csv_file = open(self.csv_path, "a", newline="")  # noqa: SIM115  (open across log calls)
        return self._csv_file

    def _close_csv(self) -> None:
        if self._csv_file is not None:
            self._csv_file.close()
            self._csv_file = None

    def _widen(self, new: list[str]) -> None:
        """Rewrites the CSV with ``new`` columns appended to the header (old rows padded with empty cells)."""
        self._close_csv()
        header, rows, _ = _read_rows(self.csv_path)
        columns = (header or list(INDEX_COLUMNS)) + new
        padded = [row + [""] * (len(columns) - len(row)) for row in rows]
        _atomic_write(self.csv_path, _csv_text(columns, padded))
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
        _atomic_write(self.csv_path, _csv_text(header or self._columns, kept))
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._purge_step = step + 1
        return len(rows) - len(kept)

    def flush(self) -> None:
        """Flushes the CSV and the TensorBoard writer."""
        if self._csv_file is not None:
            self._csv_file.flush()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the files. Logging again reopens them."""
        self._close_csv()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

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


__all__ = ["CONFIG_FILE", "INDEX_COLUMNS", "METRICS_FILE", "RunLogger", "logged_rows", "metrics_path", "read_metrics"]
