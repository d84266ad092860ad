"""The run loop every learner shares: run directory, checkpoints, logging, progress, resume, divergence, cleanup.

A training entry point (:mod:`experiments.sac_loop`, :mod:`experiments.sac_brax_loop`,
:mod:`experiments.d4pg_loop`, :mod:`experiments.grpo_loop`) validates its config, describes the run with a
:class:`RunSpec`, and passes :func:`run` a factory of its :class:`Learner`, the object that holds what differs: how
to take the next steps, evaluate, save and restore. :func:`run` owns the rest::

    checkpoints, latest = open_checkpoints(run_dir, resume)   # refuses to overwrite a run
    learner = make_learner(); logger = RunLogger(run_dir, config)
    resume ? learner.restore(checkpoints, latest) : learner.start(context)
    while position < total:
        learner.advance(limit, context)        # limit: the next multiple of eval_every or checkpoint_every
        evaluate if a multiple of eval_every was passed (or the run is done)
        checkpoint if a multiple of checkpoint_every was passed since the last save (or the run is done),
            at the first position where the learner can be checkpointed
    summary = {"status", <unit>, "run_dir", "curve", "final_eval", **learner.summary()}

Positions count the run's unit (``RunSpec.unit``: environment steps or iterations). A learner whose increments are
fixed (a compiled chunk) may pass ``limit``: evaluations and checkpoints then happen at the first position past
each multiple. A :class:`Diverged` raised by the learner ends the run with status ``"diverged: <reason>"``; any
other exception propagates after the checkpointer (waiting for a running save), the learner and the logger are
closed.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import jax
import tqdm

from lpjax.checkpoint import Checkpointer, CorruptCheckpoint
from lpjax.jsonable import to_jsonable
from lpjax.methods import nest_method_fields
from lpjax.plots import plot_run_curve
from lpjax.run_logging import CONFIG_FILE, RunLogger


class Diverged(RuntimeError):
    """The learner cannot continue (e.g. its policy produced non-finite actions, typically naive fp16)."""


def check_config(what: str, checks: Iterable[tuple[bool, str]]) -> None:
    """Raises ``ValueError("Bad <what> config: <message>.")`` for the first failed ``(ok, message)`` check."""
    for ok, message in checks:
        if not ok:
            raise ValueError(f"Bad {what} config: {message}.")


def check_resumable(what: str, config: Any, resume: bool) -> None:
    """A learner with a replay buffer resumes (bit-identically) only from checkpoints that hold it."""
    check_config(
        what,
        [(not resume or config.save_replay, "resuming needs the replay buffer in the checkpoints (save_replay=True)")],
    )


SAFE_RESUME_CHANGES = frozenset(
    {
        "total_steps",
        "total_env_steps",
        "iterations",
        "eval_every",
        "eval_episodes",
        "log_every",
        "checkpoint_every",
        "ray_address",
        "mesh.data",
        "mesh.fsdp",
        "distributed.coordinator_address",
        "distributed.num_processes",
        "distributed.process_id",
    }
)
"""Config fields a resumed run may change: its length, how often it evaluates, logs and checkpoints, where Ray runs,
and its devices (a checkpoint restores onto any mesh). Any other difference from the run's ``config.json`` is
refused: the checkpoint was trained with it."""


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _flatten(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def config_changes(stored: dict, config: Any) -> list[str]:
    """``["field: stored -> new", ...]`` for the fields both configs hold with different values, outside
    :data:`SAFE_RESUME_CHANGES`. Fields only one of them holds (added or removed since the run started) are not
    changes; method switches saved at the agent's top level (before they were nested in ``agent.methods``) are
    compared with their nested counterparts."""
    stored = dict(stored)
    if isinstance(stored.get("agent"), dict):
        stored["agent"] = nest_method_fields(stored["agent"])
    old, new = _flatten(stored), _flatten(to_jsonable(config))
    return [
        f"{key}: {old[key]!r} -> {new[key]!r}"
        for key in sorted(old.keys() & new.keys())
        if old[key] != new[key] and key not in SAFE_RESUME_CHANGES
    ]


def check_resume_config(run_dir: pathlib.Path, config: Any) -> None:
    """Raises ``ValueError`` naming the differing fields when ``config`` changes more than
    :data:`SAFE_RESUME_CHANGES` of the run in ``run_dir`` (checked before anything is written)."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"--resume: {run_dir} has no {CONFIG_FILE}, so its config cannot be checked.")
    changes = config_changes(json.loads(path.read_text()), config)
    if changes:
        raise ValueError(
            f"--resume with a different config: {'; '.join(changes)}. Only "
            f"{', '.join(sorted(SAFE_RESUME_CHANGES))} may change; start a new run for the rest."
        )


def require_run(run_dir: str | pathlib.Path) -> None:
    """Raises ``ValueError`` (one line) when ``run_dir`` holds no run to resume (no ``checkpoints/``)."""
    if not (pathlib.Path(run_dir) / "checkpoints").is_dir():
        raise ValueError(f"--resume: {run_dir} holds no run to continue (no checkpoints/).")


def open_checkpoints(
    run_dir: str | pathlib.Path, resume: bool, max_to_keep: int = 2
) -> tuple[Checkpointer, int | None]:
    """The checkpointer of a run in ``run_dir/checkpoints`` and its latest step (``None``: none yet).

    Raises ``ValueError`` before any compute when the directory holds checkpoints and ``resume`` is False (nothing
    of a run is overwritten), or when ``resume`` is True and it holds no complete checkpoint to continue from.
    """
    directory = pathlib.Path(run_dir) / "checkpoints"
    if resume:
        require_run(run_dir)
    checkpointer = Checkpointer(directory, max_to_keep=max_to_keep)
    latest = checkpointer.latest_step()
    error = None
    if latest is not None and not resume:
        error = (
            f"{run_dir} already holds checkpoints (latest step {latest}); pass --resume to continue it or "
            "choose another --run_dir."
        )
    elif latest is None and resume:
        error = f"--resume: {run_dir} holds no complete checkpoint to continue from."
    if error:
        checkpointer.close()
        raise ValueError(error)
    return checkpointer, latest


def restore_latest_good(learner: Learner, checkpointer: Checkpointer, context: RunContext) -> int:
    """Restores the learner from the newest checkpoint that reads back whole; returns its step.

    A corrupt checkpoint (:class:`lpjax.checkpoint.CorruptCheckpoint`: a truncated or missing data file, unreadable
    metadata) is reported with a warning naming its step and file, and the previous one is tried. The corrupt
    newer ones are then deleted, so the run saves again from the step it resumed at. Raises ``ValueError`` with one
    line when no checkpoint is good.
    """
    steps = checkpointer.all_steps()
    for step in reversed(steps):
        try:
            learner.restore(checkpointer, step)
        except CorruptCheckpoint as error:
            context.warn(f"{error}; falling back to the previous checkpoint")
            continue
        if step != steps[-1]:
            checkpointer.delete_after(step)
        return step
    raise ValueError(f"--resume: every checkpoint in {checkpointer.directory} is corrupt (steps {steps}).")


def passed_multiple(before: int | None, after: int, every: int) -> bool:
    """Whether a multiple of ``every`` lies in ``(before, after]`` (``before=None``: 0)."""
    return after // every > (before or 0) // every


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What :func:`run` needs to know of a run besides its learner.

    Attributes:
      kind: the learner's name in messages (``"SAC"``).
      unit: what positions count, also the summary's key for the final position (``"env_steps"``).
      total: the position at which the run is done.
      eval_every, checkpoint_every: in ``unit``.
      title: the learning curve's title.
      curve: the metrics columns the learning curve plots: the first one logged (see
        :func:`lpjax.plots.plot_run_curve`).
      plot_nonfinite: columns whose non-finite values are marked on the curve.
    """

    kind: str
    unit: str
    total: int
    eval_every: int
    checkpoint_every: int
    title: str
    curve: tuple[str, ...]
    plot_nonfinite: tuple[str, ...] = ()

    def __post_init__(self):
        check_config(
            self.kind,
            [
                (self.total >= 1, f"the run's length ({self.unit}) must be >= 1"),
                (self.eval_every >= 1, "eval_every must be >= 1"),
                (self.checkpoint_every >= 1, "checkpoint_every must be >= 1"),
            ],
        )


@dataclasses.dataclass
class RunContext:
    """What a learner gets to report through: the run's logger and progress bar."""

    logger: RunLogger
    bar: Any

    def write(self, message: str) -> None:
        """Prints a line without breaking the progress bar."""
        tqdm.tqdm.write(message)

    def warn(self, message: str) -> None:
        """Prints ``warning: <message>`` to stderr without breaking the progress bar."""
        tqdm.tqdm.write(f"warning: {message}", file=sys.stderr)

    def progress(self, position: int) -> None:
        """Moves the progress bar to ``position`` (learners that advance in long calls report as they go)."""
        self.bar.update(position - self.bar.n)


class Learner(Protocol):
    """The learner-specific parts of a run (see the module docstring)."""

    def position(self) -> int:
        """Progress so far, in the run's unit."""

    def start(self, context: RunContext) -> None:
        """Prepares a new run (e.g. a warm start); not called when resuming."""

    def restore(self, checkpointer: Checkpointer, step: int) -> None:
        """Continues from checkpoint ``step``."""

    def advance(self, limit: int, context: RunContext) -> None:
        """Takes the next steps, stopping at ``limit`` unless the learner's increments are fixed; logs training
        metrics through ``context``. Raises :class:`Diverged` when the run cannot continue."""

    def evaluate(self) -> dict[str, float]:
        """The evaluation logged under ``eval/`` (raises :class:`Diverged` like :meth:`advance`)."""

    def can_checkpoint(self) -> bool:
        """Whether the current position can be checkpointed (e.g. only between episodes)."""

    def checkpoint(self) -> tuple[Any, dict[str, Any]]:
        """``(state, metadata)`` to save; the run adds the config to the metadata."""

    def summary(self) -> dict[str, Any]:
        """The learner's entries of the run summary (throughput, counters)."""

    def close(self) -> None:
        """Releases what the learner holds (environments, actors); called however the run ends."""


def process_log_dir(run_dir: pathlib.Path) -> pathlib.Path:
    """Where this process logs: ``run_dir`` for the first process of a run (the only one of a single-process
    run), ``run_dir/process<i>`` for the others. Every process of a multi-process run saves the checkpoints
    together (orbax writes each array's shards from the processes that hold them) into ``run_dir/checkpoints``,
    which must be one directory that all of them see (a shared filesystem)."""
    index = jax.process_index()
    return run_dir if index == 0 else run_dir / f"process{index}"


def run(
    config: Any,
    run_dir: str | pathlib.Path,
    spec: RunSpec,
    make_learner: Callable[[], Learner],
    *,
    resume: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Runs (or resumes) a learner to ``spec.total``; returns the run summary (see the module docstring).

    Raises:
      ValueError: ``run_dir`` holds checkpoints and ``resume`` is False (before any compute).
    """
    run_dir = pathlib.Path(run_dir)
    log_dir = process_log_dir(run_dir)
    if resume and (run_dir / "checkpoints").is_dir():
        check_resume_config(run_dir, config)
    checkpointer, last_saved = open_checkpoints(run_dir, resume)
    learner = logger = bar = None
    status, final_eval, extras = "finished", None, {}
    try:
        learner = make_learner()
        logger = RunLogger(log_dir, config=config)
        bar = tqdm.tqdm(
            total=spec.total,
            disable=not progress or jax.process_index() > 0,
            unit=spec.unit.removesuffix("s").replace("_", " "),
            dynamic_ncols=True,
        )
        context = RunContext(logger, bar)
        if last_saved is not None:
            last_saved = restore_latest_good(learner, checkpointer, context)
            logger.truncate_after(learner.position())
            print(f"resumed {run_dir} at {spec.unit} {learner.position()}")
        else:
            learner.start(context)
        position = learner.position()
        context.progress(position)
        try:
            while position < spec.total:
                limit = min(
                    spec.total,
                    (position // spec.eval_every + 1) * spec.eval_every,
                    (position // spec.checkpoint_every + 1) * spec.checkpoint_every,
                )
                learner.advance(limit, context)
                before, position = position, learner.position()
                context.progress(position)
                done = position >= spec.total
                if done or passed_multiple(before, position, spec.eval_every):
                    final_eval = learner.evaluate()
                    logger.log(position, final_eval, prefix="eval")
                    context.write(
                        f"{spec.unit} {position}: "
                        + ", ".join(f"{k} {v:.4g}" for k, v in final_eval.items() if not k.endswith("_std"))
                    )
                if learner.can_checkpoint() and (done or passed_multiple(last_saved, position, spec.checkpoint_every)):
                    state, metadata = learner.checkpoint()
                    checkpointer.save(position, state, metadata={"config": config, **metadata})
                    logger.flush()  # what was logged before a checkpoint survives a crash after it
                    last_saved = position
        except Diverged as error:
            status = f"diverged: {error}"
            context.write(f"stopping: {status}")
        extras = learner.summary()
    finally:
        if bar is not None:
            bar.close()
        for resource in (learner, checkpointer, logger):
            if resource is not None:
                resource.close()
    curve = plot_run_curve(log_dir, spec.title, spec.curve, plot_nonfinite=spec.plot_nonfinite)
    return {
        "status": status,
        spec.unit: learner.position(),
        "run_dir": str(run_dir),
        "curve": curve,
        "final_eval": final_eval,
        **extras,
    }
