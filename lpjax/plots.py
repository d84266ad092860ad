"""Learning curves of run directories written by :class:`lpjax.run_logging.RunLogger`, as PNG files.

:func:`plot_learning_curve` draws one metric of one or several runs; :func:`plot_run_curve` writes a run's
``learning_curve.png`` from the first of several candidate metrics that was logged. matplotlib (the ``runs``
extra, ``pip install 'lpjax[runs]'``) is imported when a figure is drawn.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

import numpy as np

from lpjax._optional import require
from lpjax.run_logging import logged_rows, metrics_path, read_metrics


def plot_learning_curve(
    runs: str | os.PathLike | Sequence[str | os.PathLike],
    out_png: str | os.PathLike,
    x: str = "step",
    y: str = "eval/return",
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> pathlib.Path:
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
    FigureCanvasAgg = require("matplotlib.backends.backend_agg", "runs").FigureCanvasAgg
    Figure = require("matplotlib.figure", "runs").Figure

    runs = [runs] if isinstance(runs, (str, os.PathLike)) else list(runs)
    if not runs:
        raise ValueError("no runs to plot.")
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"got {len(labels)} labels for {len(runs)} runs.")
    figure = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for i, run in enumerate(runs):
        path = metrics_path(run)
        columns = read_metrics(path)
        for column in (x, y):
            if column not in columns:
                raise ValueError(f"{path} has no column {column!r}; it has {sorted(columns)}.")
        has_y = logged_rows(path, y)
        xs, ys = columns[x], columns[y]
        keep = has_y & np.isfinite(ys) & np.isfinite(xs)
        label = labels[i] if labels is not None else path.parent.name
        nonfinite = int((has_y & ~np.isfinite(ys)).sum())
        if nonfinite:
            label += f" ({nonfinite} non-finite omitted)"
        order = np.argsort(xs[keep], kind="stable")
        axes.plot(
            xs[keep][order],
            ys[keep][order],
            marker="o" if keep.sum() < 30 else None,
            markersize=3,
            linewidth=1.5,
            label=label,
        )
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


def plot_run_curve(
    run_dir: str | os.PathLike, title: str, candidates: Sequence[str], plot_nonfinite: Sequence[str] = ()
) -> str | None:
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


__all__ = ["plot_learning_curve", "plot_run_curve"]
