"""Run logging: a run directory with the resolved config, a metrics CSV, TensorBoard events and learning curves.

A run directory written by :class:`RunLogger` holds::

    run_dir/config.json                         the resolved config (ml_collections ConfigDict or dict)
    run_dir/metrics.csv                         one row per log() call: step, wall_time, then metric columns
    run_dir/events.out.tfevents.*               TensorBoard scalars (tensorboardX), one file per writer

**One wide CSV.** Columns are ``step``, ``wall_time`` (Unix seconds) and one column per metric, named
``prefix/key`` (e.g. ``train/critic_loss``, ``eval/return``) in order of first appearance. Each ``log`` call
appends one row; columns it does not log are left empty (so train and eval rows at the same step are two rows).
When a call brings a new metric, the file is rewritten once with the wider header (through a temporary file
and ``os.replace``, so a crash leaves either the old or the new file, never a mix); afterwards rows are
appended and flushed. :func:`read_metrics` reads the file back.

**Values.** Metrics may be Python numbers, numpy scalars or size-1 jax/numpy arrays; they are converted to
float. Non-finite values (nan, +-inf) are written as ``nan`` (not dropped, so a divergence shows in the log) and
counted in :attr:`RunLogger.nonfinite_counts`.

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
import dataclasses
import enum
import io
import json
import math
import os
import pathlib
import struct
import time
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.csv"
INDEX_COLUMNS = ("step", "wall_time")


def to_jsonable(obj: Any) -> Any:
    """Converts a config or metadata object to plain JSON types (dict, list, str, int, float, bool, None).

    ml_collections ``ConfigDict``/``FrozenConfigDict`` become dicts (field references resolved), mappings become
    dicts with string keys, tuples and sets become lists, numpy/jax scalars become Python numbers and arrays
    nested lists, dtypes (and dtype classes such as ``jnp.float16``) their name, paths and enums strings,
    dataclasses dicts. Anything else becomes ``str(obj)``. Non-finite floats stay ``nan``/``inf`` (written as
    ``NaN``/``Infinity`` by ``json``, which Python reads back).
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "to_dict") and callable(obj.to_dict):  # ml_collections.ConfigDict
        return to_jsonable(obj.to_dict())
    if hasattr(obj, "as_configdict") and callable(obj.as_configdict):  # ml_collections.FrozenConfigDict
        return to_jsonable(obj.as_configdict().to_dict())
    if isinstance(obj, Mapping):
        return {str(key): to_jsonable(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return [to_jsonable(item) for item in items]
    if isinstance(obj, np.dtype):
        return obj.name
    if isinstance(obj, type):
        try:
            return np.dtype(obj).name  # jnp.float16, np.uint8, float, ...
        except TypeError:
            return f"{obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, (np.generic, np.ndarray)) or (hasattr(obj, "__array__") and hasattr(obj, "dtype")):
        return np.asarray(obj).tolist()  # numpy and jax scalars and arrays
    if isinstance(obj, enum.Enum):
        return str(obj.name)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    return str(obj)


def _to_float(name: str, value: Any) -> float:
    """A metric value as a float: Python/numpy/jax scalars and size-1 arrays."""
    if isinstance(value, (str, bytes)) or value is None:
        raise ValueError(f"metric {name!r} must be a number or a size-1 array, got {value!r}.")
    array = np.asarray(value)
    real = array.dtype.kind in "biuf" or array.dtype.type.__module__ == "ml_dtypes"  # bfloat16, float8, int4
    if array.size != 1 or not real:
        raise ValueError(f"metric {name!r} must be a number or a size-1 array, got {array.dtype.name} of shape "
                         f"{list(array.shape)}; log a reduction (mean, max, ...) instead.")
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
      tensorboard: also write TensorBoard event files.

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
                    raise ValueError(f"{path} is not a RunLogger metrics file: its header starts with {header[:2]}, "
                                     f"expected {list(INDEX_COLUMNS)}.")
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
            from tensorboardX import SummaryWriter
            # tensorboardX names event files by the second and opens them with "wb": a second writer in the same
            # second would overwrite the first. A nanosecond-and-pid suffix keeps names unique and in time order.
            suffix = f".{time.time_ns()}.{os.getpid()}"
            self._writer = SummaryWriter(logdir=str(self.run_dir), purge_step=self._purge_step,
                                         filename_suffix=suffix, flush_secs=10)
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
        self._csv().write(line[line.index("\n") + 1:])
        self._csv_file.flush()
        if self._tensorboard:
            writer = self._tb()
            for name, value in row.items():
                writer.add_scalar(name, value, global_step=step)

    def _csv(self):
        if self._csv_file is None:
            self._csv_file = open(self.csv_path, "a", newline="")
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

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _csv_of(path: str | os.PathLike) -> pathlib.Path:
    path = pathlib.Path(path)
    return path / METRICS_FILE if path.is_dir() else path


def read_metrics(csv_path_or_run_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """Reads a metrics CSV written by :class:`RunLogger` into ``{column: float64 array}``, one entry per row.

    Empty cells (a column not logged in that row) and logged non-finite values both read as nan.
    """
    path = _csv_of(csv_path_or_run_dir)
    if not path.exists():
        raise ValueError(f"no metrics file at {path}.")
    header, rows, _ = _read_rows(path)
    columns = {name: np.full(len(rows), np.nan) for name in header}
    for i, row in enumerate(rows):
        for name, cell in zip(header, row):
            if cell != "":
                columns[name][i] = float(cell)
    return columns


def plot_learning_curve(runs: str | os.PathLike | Sequence[str | os.PathLike], out_png: str | os.PathLike,
                        x: str = "step", y: str = "eval/return", labels: Sequence[str] | None = None,
                        title: str | None = None) -> pathlib.Path:
    """Plots ``y`` against ``x`` for one run or several overlaid runs, and saves a PNG.

    Only rows where ``y`` is a finite number are drawn (rows of other prefixes leave ``y`` empty); the legend
    says how many non-finite values of ``y`` a run had. Uses matplotlib's Agg canvas directly (no pyplot, no
    global backend switch), so it works headless and leaves a notebook's backend alone.

    Args:
      runs: a run directory or a ``metrics.csv`` path, or a sequence of them to overlay.
      out_png: where to write the PNG (parent directories are created).
      x: the x column, e.g. ``"step"`` or ``"wall_time"``.
      y: the y column, ``prefix/key`` as logged.
      labels: legend labels, one per run; default: each run directory's name.
      title: figure title; default: ``y`` vs ``x``.

    Returns:
      The path of the PNG.

    Raises:
      ValueError: if a run has no metrics file or lacks the ``x`` or ``y`` column.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = [runs] if isinstance(runs, (str, os.PathLike)) else list(runs)
    if not runs:
        raise ValueError("no runs to plot.")
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"got {len(labels)} labels for {len(runs)} runs.")
    figure = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for i, run in enumerate(runs):
        path = _csv_of(run)
        columns = read_metrics(path)
        for column in (x, y):
            if column not in columns:
                raise ValueError(f"{path} has no column {column!r}; it has {sorted(columns)}.")
        has_y = _logged_cells(path, y)
        xs, ys = columns[x], columns[y]
        keep = has_y & np.isfinite(ys) & np.isfinite(xs)
        label = labels[i] if labels is not None else path.parent.name
        nonfinite = int((has_y & ~np.isfinite(ys)).sum())
        if nonfinite:
            label += f" ({nonfinite} non-finite omitted)"
        order = np.argsort(xs[keep], kind="stable")
        axes.plot(xs[keep][order], ys[keep][order], marker="o" if keep.sum() < 30 else None, markersize=3,
                  linewidth=1.5, label=label)
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    axes.set_title(title if title is not None else f"{y} vs {x}")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    out_png = pathlib.Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png)
    return out_png


def _logged_cells(path: pathlib.Path, column: str) -> np.ndarray:
    """Which rows have a non-empty cell in ``column``."""
    header, rows, _ = _read_rows(path)
    j = header.index(column)
    return np.array([len(row) > j and row[j] != "" for row in rows], bool)


def _records(data: bytes) -> Iterable[bytes]:
    """Payloads of a TFRecord file (length, crc, payload, crc); stops at a truncated or corrupt record."""
    from tensorboardX.record_writer import masked_crc32c

    offset = 0
    while offset + 12 <= len(data):
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        end = offset + 12 + length + 4
        if header_crc != masked_crc32c(header) or end > len(data):
            return
        payload = data[offset + 12:offset + 12 + length]
        if struct.unpack("<I", data[end - 4:end])[0] != masked_crc32c(payload):
            return
        yield payload
        offset = end


def read_tensorboard_scalars(run_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Reads the scalars of every TensorBoard event file in ``run_dir`` into ``{tag: [(step, value), ...]}``.

    No TensorFlow or TensorBoard needed: event files are parsed with tensorboardX's protobufs. Files are read in
    the order they were started (their first event's wall time) and a purge (a ``SessionLog.START`` event at step
    ``s``, written after :meth:`RunLogger.truncate_after`) drops earlier scalars with ``step >= s``, as
    TensorBoard does.
    """
    from tensorboardX.proto import event_pb2

    files = []
    for path in pathlib.Path(run_dir).glob("events.out.tfevents.*"):
        events = []
        for payload in _records(path.read_bytes()):
            event = event_pb2.Event()
            event.ParseFromString(payload)
            events.append(event)
        if events:
            files.append((events[0].wall_time, path.name, events))
    scalars: dict[str, list[tuple[int, float]]] = {}
    for _, _, events in sorted(files, key=lambda f: (f[0], f[1])):
        for event in events:
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                scalars = {tag: [(s, v) for s, v in points if s < event.step] for tag, points in scalars.items()}
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
    return scalars


def plot_run_curve(run_dir: str | os.PathLike, title: str, candidates: Sequence[str],
                   plot_nonfinite: Sequence[str] = ()) -> str | None:
    """Writes ``run_dir/learning_curve.png`` of the first of ``candidates`` that was logged with a finite value
    (or at all, for columns in ``plot_nonfinite``, e.g. a loss that went nan); returns its path, or ``None`` if
    nothing was logged yet."""
    run_dir = pathlib.Path(run_dir)
    curve = run_dir / "learning_curve.png"
    try:
        columns = read_metrics(run_dir)
    except ValueError:  # no metrics file yet
        return None
    for y in candidates:
        if y in columns and (np.isfinite(columns[y]).any() or y in plot_nonfinite):
            plot_learning_curve(run_dir, curve, y=y, title=title)
            return str(curve)
    return None
