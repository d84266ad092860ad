"""What a finished run's logs and last checkpoint say about its numerics: the evidence behind a low return.

A run can finish with finite actions and still train badly. Whether precision is to blame shows in three places:

* **Loss scalers** (from the last checkpoint). Every :class:`lpjax.optim.CompoundLossScalingState` in the saved
  state, by the path of the network it trains (``agent.critic``, ``agent.actor``): its final ``scale`` and
  ``skipped_steps``, the number of updates it skipped for non-finite gradients over the whole run. The counter
  lives in the optimizer state, so it is exact across resumes; the logs sample only every ``log_every`` steps.
* **The last logged training values** (from ``metrics.csv``): the loss scales, the policy's entropy and the
  temperature ``alpha``. An entropy near SAC's target (``-action_dim``) with a small ``alpha`` is a policy that
  trained, not one that froze or collapsed.
* **Non-finite losses**: the first logged step from which the critic loss stayed non-finite (the scaler then
  skips every update, and the run ends with a frozen policy's return).

:func:`evidence` returns the first two; :func:`nonfinite_losses_since` the third. A run with no loss scaler (fp32,
the fp8 GEMM agent) has empty ``loss_scalers``.
"""

from __future__ import annotations

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
    """Steps and values of the rows of ``metrics.csv`` that logged ``column`` (``None`` for a non-finite value).

    Read from the file directly: a row logged the column when its cell is not empty
    (``lpjax.run_logging.read_metrics`` reads empty and non-finite cells both as nan)."""
    path = run_dir / "metrics.csv"
    if not path.exists():
        return [], []
    text = path.read_text()
    if not text.endswith("\n"):  # a partial last line left by a crash
        text = text[: text.rfind("\n") + 1]
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or column not in rows[0]:
        return [], []
    step_col, value_col = rows[0].index("step"), rows[0].index(column)
    steps, values = [], []
    for row in rows[1:]:
        if len(row) > value_col and row[value_col] != "":
            value = float(row[value_col])
            steps.append(int(float(row[step_col])))
            values.append(value if math.isfinite(value) else None)
    return steps, values


def nonfinite_losses_since(run_dir: pathlib.Path) -> int | None:
    """The first logged step from which every logged critic loss is non-finite (``None``: the last is finite).

    The loss scaler skips every such step, so the networks stop learning while actions stay finite: such a run
    finishes, with the return of a frozen policy."""
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


def _scalers(tree: Any) -> dict[str, dict]:
    """Every loss scaler's final scale and skipped steps, named by the path of the network it trains (the path
    up to ``opt_state``), or by its whole path where two share that name."""
    states = list(_scaler_states(tree))
    owners = [".".join(path[: path.index("opt_state")] if "opt_state" in path else path) for path, _ in states]
    return {
        owner if owners.count(owner) == 1 else ".".join(path): {
            "scale": float(state["scale"]),
            "skipped_steps": int(state["skipped_steps"]),
        }
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
    try:
        if checkpointer.latest_step() is None:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state, _ = checkpointer.restore()
    except CorruptCheckpoint:
        return None
    finally:
        checkpointer.close()
    return state


def loss_scalers(run_dir: pathlib.Path) -> dict[str, dict] | None:
    """The loss scalers of the run's last checkpoint, by network (``None``: no readable checkpoint)."""
    state = last_checkpoint(run_dir)
    return None if state is None else _scalers(state)


def last_logged(run_dir: pathlib.Path, columns=LOGGED) -> dict[str, float | None]:
    """The last finite logged value of each column (``None``: never logged, or never finite)."""
    out = {}
    for column in columns:
        _, values = logged(run_dir, column)
        finite = [v for v in values if v is not None]  # logged() reads non-finite values as None
        out[column.removeprefix("train/")] = finite[-1] if finite else None
    return out


def evidence(run_dir: pathlib.Path) -> dict:
    """The loss scalers and the last logged training values of one run directory (module docstring)."""
    return {"loss_scalers": loss_scalers(run_dir), "last_logged": last_logged(run_dir)}
