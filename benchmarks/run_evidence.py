"""What a finished run's logs and last checkpoint say about its numerics: the evidence behind a low return.

A run can finish with finite actions and still train badly. Whether precision is to blame shows in the loss
scalers of its last checkpoint (:func:`loss_scalers`: each scaler's final scale and the updates it skipped over the
whole run, exact across resumes), its last logged training values (:func:`last_logged`: an entropy near SAC's target
with a small ``alpha`` is a policy that trained, not one that froze) and the step from which its critic loss stayed
non-finite (:func:`nonfinite_losses_since`). A run with no loss scaler (fp32, the fp8 GEMM agent) has none.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import pathlib
import warnings
from typing import Any

LOGGED = ("train/critic_loss_scale", "train/actor_loss_scale", "train/entropy", "train/alpha")
"""The training columns whose last finite value the evidence records."""
SCALER_FIELDS = ("scale", "skipped_steps", "good_steps", "inner_scale")
"""The fields that mark a saved subtree as a loss scaler's state (checkpoints store NamedTuples as dicts)."""


def logged(run_dir: pathlib.Path, column: str) -> tuple[list[int], list[float | None]]:
    """Steps and values of the rows of ``metrics.csv`` whose ``column`` cell is not empty (``None`` for a non-finite
    value); ``lpjax.run_logging.read_metrics`` would read empty and non-finite cells both as nan."""
    path = run_dir / "metrics.csv"
    text = path.read_text() if path.exists() else ""
    steps, values = [], []
    for row in csv.DictReader(io.StringIO(text[: text.rfind("\n") + 1])):  # without a partial last line (a crash)
        if row.get(column):  # not empty, nor None (a short row, or no such column)
            value = float(row[column])
            steps.append(int(float(row["step"])))
            values.append(value if math.isfinite(value) else None)
    return steps, values


def nonfinite_losses_since(run_dir: pathlib.Path) -> int | None:
    """The first logged step from which every logged critic loss is non-finite (``None``: the last is finite): the
    loss scaler skips every such step, and the run finishes with a frozen policy's return."""
    steps, losses = logged(run_dir, "train/critic_loss")
    if not losses or losses[-1] is not None:
        return None
    finite = [i for i, loss in enumerate(losses) if loss is not None]
    return steps[finite[-1] + 1 if finite else 0]


def _scaler_states(tree: Any, path: tuple[str, ...] = ()):
    """Yields ``(path, state)`` for every loss-scaler state in a raw checkpoint tree."""
    if isinstance(tree, dict) and all(field in tree for field in SCALER_FIELDS):
        yield path, tree
    children = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, child in children:
        yield from _scaler_states(child, (*path, str(key)))


def loss_scalers(run_dir: pathlib.Path) -> dict[str, dict] | None:
    """The final scale and skipped steps of each loss scaler of the run's last checkpoint (``None``: no readable
    checkpoint), named by the path of the network it trains (up to ``opt_state``), or its whole path where two share
    that name."""
    tree = last_checkpoint(run_dir)
    if tree is None:
        return None
    states = list(_scaler_states(tree))
    owners = [".".join(path[: path.index("opt_state")] if "opt_state" in path else path) for path, _ in states]
    record = lambda state: {"scale": float(state["scale"]), "skipped_steps": int(state["skipped_steps"])}
    return {
        owner if owners.count(owner) == 1 else ".".join(path): record(state)
        for owner, (path, state) in zip(owners, states)
    }


def last_checkpoint(run_dir: pathlib.Path) -> Any | None:
    """The raw state tree of the run's last checkpoint (NamedTuples as dicts), or ``None`` when the run has no
    readable one. A missing ``checkpoints`` directory is not created."""
    from lpjax.checkpoint import Checkpointer, CorruptCheckpoint

    directory = pathlib.Path(run_dir) / "checkpoints"
    if not directory.is_dir():  # checked first: a Checkpointer would create it
        return None
    checkpointer = Checkpointer(directory, max_to_keep=None, async_save=False)
    with checkpointer, contextlib.suppress(CorruptCheckpoint):
        if checkpointer.latest_step() is None:
            return None
        with warnings.catch_warnings(action="ignore"):
            return checkpointer.restore()[0]
    return None  # a corrupt checkpoint


def last_logged(run_dir: pathlib.Path, columns=LOGGED) -> dict[str, float | None]:
    """The last finite logged value of each column (``None``: never logged, or never finite)."""
    last = lambda values: next((v for v in reversed(values) if v is not None), None)  # None: non-finite
    return {column.removeprefix("train/"): last(logged(run_dir, column)[1]) for column in columns}


def evidence(run_dir: pathlib.Path) -> dict:
    """The loss scalers and the last logged training values of one run directory."""
    return {"loss_scalers": loss_scalers(run_dir), "last_logged": last_logged(run_dir)}
