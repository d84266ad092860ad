"""The run loop every learner shares: run directory, checkpoints, logging, progress, resume, divergence, cleanup.

A training entry point (:mod:`experiments.sac_loop`, :mod:`experiments.sac_brax_loop`,
:mod:`experiments.d4pg_loop`, :mod:`experiments.grpo_loop`) validates its config, describes the run with a
:class:`RunSpec`, and passes :func:`run` a factory of its :class:`Learner`, the object that holds what differs: how
to take the next steps, evaluate, save and restore. :func:`run` owns the rest::

    lock run_dir; check its files                             # refuses a directory in use, damaged, or a run
    checkpoints, latest = open_checkpoints(run_dir, resume)   # ... to overwrite (nothing written before here)
    learner = make_learner(); resume and learner.restore(checkpoints, latest)
    logger = RunLogger(run_dir, config); resume or learner.start(context)
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

**Before anything is written**, in this order:

1. the run directory's lock is taken (:class:`lpjax.run_lock.DirectoryLock`, ``run.lock``, held until the run
   ends): a directory another process writes is refused with one line naming it (pid, host, start time);
2. every run file is checked (:func:`check_run_files`): with ``resume``, the checkpoints exist, ``config.json`` is
   a JSON object whose fields match the config (:func:`check_resume_config`) and every line of ``metrics.csv``
   parses (:func:`lpjax.run_logging.check_metrics`); a problem is one line naming the file, the line and the
   problem; without ``resume``, a directory with checkpoints is refused;
3. the checkpoints are restored (a corrupt newest one falls back to the previous one).

A refusal leaves the directory exactly as it was (the lock file included). A new run in a directory that holds
the files of a run that stopped before its first checkpoint (nothing to resume) moves them aside, into
``previous-<UTC time>/``, and says so in one line; it never appends to them.

**Signals.** SIGINT (Ctrl-C) and SIGTERM stop a run the same way: :class:`Interrupted` (a ``KeyboardInterrupt``)
is raised where the run is, the checkpointer waits for a save in progress, everything is closed, and the
interruption propagates with one line, ``interrupted at step N; the last checkpoint is step M; continue with
--resume ...``. Further signals during that cleanup are ignored. The checkpointer's save call and the appending
of a metrics row are never cut in half: a signal during a save is delivered when it returns, and a row being
written when a signal arrives is removed again. A signal is never lost nor reported as another error when the
``Interrupted`` lands in code that does not let it through: a library that drops it makes the run raise it again
at the next step it reports (:meth:`RunContext.progress`), before it evaluates or saves anything more, and one that
turns it into another error (``jax.jit`` raises a ``ValueError`` when it arrives in a pytree's metadata comparison)
has that error reported as the interruption.

**A full disk** raises :class:`lpjax.disk.DiskFull`, one line (what could not be written, where, the space left,
the last checkpoint and how to continue); the complete checkpoints and the metrics rows written before stay
whole, so ``--resume`` continues exactly once there is space again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import pathlib
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import jax
import tqdm

from lpjax.checkpoint import Checkpointer, CorruptCheckpoint
from lpjax.disk import DiskFull, disk_full, is_out_of_space
from lpjax.jsonable import to_jsonable
from lpjax.plots import plot_run_curve
from lpjax.run_lock import DirectoryLock
from lpjax.run_logging import CONFIG_FILE, METRICS_FILE, RunLogger, check_metrics, json_line, read_config


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
    changes."""
    old, new = _flatten(stored), _flatten(to_jsonable(config))
    return [
        f"{key}: {old[key]!r} -> {new[key]!r}"
        for key in sorted(old.keys() & new.keys())
        if old[key] != new[key] and key not in SAFE_RESUME_CHANGES
    ]


def check_config_content(path: pathlib.Path, stored: dict, config: Any) -> None:
    """Raises ``ValueError`` (one line: the file, the line, the problem) when ``stored``, the JSON object read from
    ``path``, is not a config of this kind of run: it shares no field with ``config``, or it holds a value where
    ``config`` has a section of fields (or the reverse)."""
    new = to_jsonable(config)
    if not isinstance(new, dict) or not new:
        return
    text = path.read_text()
    if not stored.keys() & new.keys():
        raise ValueError(
            f"{path}, line 1: not a config of this run: none of its fields ({', '.join(sorted(stored)[:5]) or 'none'}) "
            f"is a field of the config ({', '.join(sorted(new)[:5])}, ...)."
        )
    for key in sorted(stored.keys() & new.keys()):
        if isinstance(stored[key], dict) != isinstance(new[key], dict):
            held = "a section of fields" if isinstance(stored[key], dict) else repr(stored[key])
            wanted = "a section of fields" if isinstance(new[key], dict) else "a value"
            raise ValueError(f"{path}, line {json_line(text, key)}: {key!r} is {held}, where the config has {wanted}.")


def check_resume_config(run_dir: pathlib.Path, config: Any) -> None:
    """Raises ``ValueError`` (one line) when the run's ``config.json`` is missing or damaged (naming the file, the
    line and the problem) or when ``config`` changes more than :data:`SAFE_RESUME_CHANGES` of it (naming the
    differing fields). Reads only."""
    path = pathlib.Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"--resume: {run_dir} has no {CONFIG_FILE}, so its config cannot be checked.")
    stored = read_config(path)
    check_config_content(path, stored, config)
    changes = config_changes(stored, config)
    if changes:
        raise ValueError(
            f"--resume with a config that differs from {path}: {'; '.join(changes)}. Only "
            f"{', '.join(sorted(SAFE_RESUME_CHANGES))} may change; start a new run for the rest."
        )


def require_run(run_dir: str | pathlib.Path) -> None:
    """Raises ``ValueError`` (one line) when ``run_dir`` holds no run to resume (no ``checkpoints/``)."""
    if not (pathlib.Path(run_dir) / "checkpoints").is_dir():
        raise ValueError(f"--resume: {run_dir} holds no run to continue (no checkpoints/).")


def checkpoint_steps(run_dir: str | pathlib.Path) -> list[int]:
    """The steps of the complete checkpoints in ``run_dir/checkpoints``, ascending, listed without opening orbax
    (see :meth:`lpjax.checkpoint.Checkpointer.all_steps`)."""
    directory = pathlib.Path(run_dir) / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def check_checkpoints(run_dir: str | pathlib.Path, resume: bool) -> list[int]:
    """The steps of the run's complete checkpoints (:func:`checkpoint_steps`); raises ``ValueError`` (one line)
    when ``run_dir`` holds checkpoints and ``resume`` is False (nothing of a run is overwritten), or when
    ``resume`` is True and it holds no complete checkpoint to continue from. Reads only."""
    if resume:
        require_run(run_dir)
    steps = checkpoint_steps(run_dir)
    if steps and not resume:
        raise ValueError(
            f"{run_dir} already holds checkpoints (latest step {steps[-1]}); pass --resume to continue it or "
            "choose another --run_dir."
        )
    if not steps and resume:
        raise ValueError(
            f"--resume: {run_dir} holds no complete checkpoint to continue from; run the same command without "
            "--resume to start it over."
        )
    return steps


def open_checkpoints(
    run_dir: str | pathlib.Path, resume: bool, max_to_keep: int = 2
) -> tuple[Checkpointer, int | None]:
    """The checkpointer of a run in ``run_dir/checkpoints`` and its latest step (``None``: none yet).

    Raises ``ValueError`` as :func:`check_checkpoints` does, before any compute and before anything is created.
    """
    steps = check_checkpoints(run_dir, resume)
    return Checkpointer(pathlib.Path(run_dir) / "checkpoints", max_to_keep=max_to_keep), steps[-1] if steps else None


def restore_latest_good(learner: Learner, checkpointer: Checkpointer, context: RunContext) -> int:
    """Restores the learner from the newest checkpoint that reads back whole
    (:meth:`lpjax.checkpoint.Checkpointer.restore_latest_good`); returns its step.

    A corrupt checkpoint (:class:`lpjax.checkpoint.CorruptCheckpoint`: a truncated or missing data file, unreadable
    metadata) is reported with a warning naming its step and file, and the previous one is tried. The corrupt
    newer ones are then deleted, so the run saves again from the step it resumed at. Raises ``ValueError`` with one
    line when no checkpoint is good.
    """
    steps = checkpointer.all_steps()
    try:
        step, _, _ = checkpointer.restore_latest_good(
            on_corrupt=lambda step, error: context.warn(f"{error}; falling back to the previous checkpoint"),
            restore=lambda step: (learner.restore(checkpointer, step), {}),
        )
    except CorruptCheckpoint:
        raise ValueError(
            f"--resume: every checkpoint in {checkpointer.directory} is corrupt (steps {steps})."
        ) from None
    return step


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
      files: names (or glob patterns) of the files the learner writes in the run directory besides those of
        :data:`RUN_FILE_PATTERNS` (moved aside with them, see :func:`run`).
    """

    kind: str
    unit: str
    total: int
    eval_every: int
    checkpoint_every: int
    title: str
    curve: tuple[str, ...]
    plot_nonfinite: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    @classmethod
    def of(cls, config: Any, total_field: str, **fields: Any) -> RunSpec:
        """The spec of a run whose ``config`` holds its length (``config[total_field]``), ``eval_every`` and
        ``checkpoint_every``; ``fields`` give the rest."""
        return cls(
            total=config[total_field],
            eval_every=config.eval_every,
            checkpoint_every=config.checkpoint_every,
            **fields,
        )

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
        """Moves the progress bar to ``position`` (learners that advance in long calls report as they go); raises
        :class:`Interrupted` for a stop signal whose first ``Interrupted`` was swallowed on its way up."""
        _raise_if_stopped()
        self.bar.update(position - self.bar.n)


class Learner(Protocol):
    """The learner-specific parts of a run (see the module docstring). A learner that holds nothing to release
    subclasses it for the no-op :meth:`close`."""

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
        """Releases what the learner holds (environments, actors); called however the run ends. Nothing by
        default."""


def process_log_dir(run_dir: pathlib.Path) -> pathlib.Path:
    """Where this process logs: ``run_dir`` for the first process of a run (the only one of a single-process
    run), ``run_dir/process<i>`` for the others. Every process of a multi-process run saves the checkpoints
    together (orbax writes each array's shards from the processes that hold them) into ``run_dir/checkpoints``,
    which must be one directory that all of them see (a shared filesystem)."""
    index = jax.process_index()
    return run_dir if index == 0 else run_dir / f"process{index}"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a run cleanly (Ctrl-C and what ``kill``, job schedulers and the run farm send)."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM (see the module docstring); ``str()`` is the one line to print.

    A ``KeyboardInterrupt``, so that code which stops on Ctrl-C (``except KeyboardInterrupt``) stops on it too,
    and ``except Exception`` does not swallow it.

    Attributes:
      signum: the signal.
      exit_code: ``128 + signum``, the exit status of a process that a signal ended.
    """

    def __init__(self, signum: int, message: str | None = None):
        self.signum = signum
        self.exit_code = 128 + signum
        self.message = message or f"interrupted by {signal.Signals(signum).name}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


@dataclasses.dataclass
class _SignalState:
    fired: int | None = None  # the signal that raised Interrupted; later ones are ignored
    deferred: int = 0  # depth of deferred_signals blocks
    pending: int | None = None  # a signal that arrived in such a block
    active: bool = False  # inside stop_on_signals on the main thread: fired belongs to the run going on


_signals = _SignalState()


def _stop(signum: int, frame: Any) -> None:
    del frame
    if _signals.fired is not None:
        return  # a second Ctrl-C while the run cleans up: the first one is being handled
    if _signals.deferred:
        _signals.pending = _signals.pending or signum
        return
    _signals.fired = signum
    raise Interrupted(signum)


def _raise_if_stopped() -> None:
    """Raises :class:`Interrupted` again if a stop signal fired outside a deferred block while the run goes on."""
    signum = _stopped_by()
    if signum is not None and not _signals.deferred:
        raise Interrupted(signum)


def _stopped_by() -> int | None:
    """The stop signal that fired during the run going on, if any."""
    return _signals.fired if _signals.active else None


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def handle_stop_signals() -> None:
    """Makes SIGINT and SIGTERM raise :class:`Interrupted` (once) for the rest of the process: the entry points
    call it first, so that a signal that arrives after :func:`run` returned, while the process reports and exits,
    is ignored too rather than printing a traceback."""
    if _main_thread():
        _signals.fired = _signals.pending = None
        for signum in STOP_SIGNALS:
            signal.signal(signum, _stop)


def ignore_stop_signals() -> None:
    """Ignores SIGINT and SIGTERM for the rest of the process (an entry point whose run is over)."""
    if _main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`Interrupted` once; later ones are ignored. The previous
    handlers are put back at the end. Off the main thread (where Python cannot handle signals) it does nothing."""
    if not _main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    _signals.fired = _signals.pending = None
    _signals.deferred, _signals.active = 0, True
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stop)
    try:
        yield
    finally:
        _signals.active = False
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Holds back SIGINT and SIGTERM until the block ends (a call that must not be cut in half, such as the
    start of a checkpoint save); :class:`Interrupted` is then raised, unless the block raised."""
    _signals.deferred += 1
    try:
        yield
    finally:
        _signals.deferred -= 1
    if not _signals.deferred and _signals.pending is not None and _signals.fired is None:
        _signals.fired, _signals.pending = _signals.pending, None
        raise Interrupted(_signals.fired)


CURVE_FILE = "learning_curve.png"
RUN_FILE_PATTERNS = (CONFIG_FILE, METRICS_FILE, "events.out.tfevents.*", CURVE_FILE)
"""The files :func:`run` writes in a run directory besides ``checkpoints/`` (a learner adds its own:
``RunSpec.files``)."""


def run_files(log_dir: pathlib.Path, spec: RunSpec) -> list[pathlib.Path]:
    """The run files present in ``log_dir``: :data:`RUN_FILE_PATTERNS` and ``spec.files``."""
    found = {path for pattern in (*RUN_FILE_PATTERNS, *spec.files) for path in log_dir.glob(pattern)}
    return sorted(path for path in found if path.is_file())


def check_run_files(run_dir: pathlib.Path, log_dir: pathlib.Path, config: Any, resume: bool) -> None:
    """Checks every file a run would write to or read before it writes any (see the module docstring); raises
    ``ValueError`` with one line. Reads only."""
    check_checkpoints(run_dir, resume)
    if resume:
        check_resume_config(run_dir, config)
        if log_dir != run_dir and (log_dir / CONFIG_FILE).exists():
            read_config(log_dir / CONFIG_FILE)
        check_metrics(log_dir / METRICS_FILE)


def move_aside(log_dir: pathlib.Path, files: list[pathlib.Path]) -> pathlib.Path:
    """Moves ``files`` (in ``log_dir``) into a new ``log_dir/previous-<UTC time>/``; returns it."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    target, n = log_dir / f"previous-{stamp}", 1
    while target.exists():
        n += 1
        target = log_dir / f"previous-{stamp}-{n}"
    target.mkdir()
    for path in files:
        os.replace(path, target / path.name)
    return target


def _describe_files(files: list[pathlib.Path]) -> str:
    events = [p for p in files if p.name.startswith("events.out.tfevents.")]
    names = [p.name for p in files if p not in events]
    if events:
        names.append(f"{len(events)} event file{'s' if len(events) > 1 else ''}")
    return ", ".join(names)


def _close_all(*resources: Any) -> list[BaseException]:
    """Closes each resource that is not ``None``, whatever the others raise; returns what they raised."""
    errors = []
    for resource in resources:
        if resource is None:
            continue
        try:
            resource.close()
        except BaseException as error:  # a signal or a full disk during cleanup: reported after
            errors.append(error)
    return errors


def _explain(error: BaseException, run_dir: pathlib.Path, position: int, last: int | None) -> BaseException:
    """``error`` as the run reports it: an interruption or a full disk with the one line saying where the run
    stands and how to continue; any other error unchanged."""
    continue_with = f"continue with --resume --run_dir={run_dir}"
    if isinstance(error, Interrupted):
        where = (
            f"the last checkpoint is step {last}; {continue_with}"
            if last is not None
            else "there is no checkpoint yet; run the same command again to start over"
        )
        return Interrupted(error.signum, f"interrupted at step {position}; {where}")
    if is_out_of_space(error):
        full = (
            error
            if isinstance(error, DiskFull)
            else disk_full(error, "a run file", getattr(error, "filename", None) or run_dir)
        )
        where = (
            f"the last checkpoint is step {last}; free some space, then {continue_with}"
            if last is not None
            else "there is no checkpoint yet; free some space, then run the same command again"
        )
        return full.with_advice(where)
    return error


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
      ValueError: the run directory is refused (another process writes it, it holds checkpoints and ``resume``
        is False, a damaged or different ``config.json``, a damaged ``metrics.csv``, no checkpoint to resume),
        before anything is written; one line.
      Interrupted: SIGINT or SIGTERM stopped the run.
      lpjax.disk.DiskFull: the disk is full.
    """
    run_dir = pathlib.Path(run_dir)
    log_dir = process_log_dir(run_dir)
    if resume:
        require_run(run_dir)
    with stop_on_signals():
        lock = None
        try:
            lock = DirectoryLock(log_dir).acquire()
            check_run_files(run_dir, log_dir, config, resume)
        except BaseException as error:
            if lock is not None:
                lock.release(restore=True)  # a refusal leaves the directory as it was
            if isinstance(error, Interrupted):
                raise Interrupted(error.signum, "interrupted before the run started; nothing was written") from None
            if isinstance(error, DiskFull):
                raise error.with_advice("free some space, then run the same command again") from None
            raise
        try:
            return _run_locked(config, run_dir, log_dir, spec, make_learner, resume, progress, lock)
        finally:
            lock.release()


def _run_locked(
    config: Any,
    run_dir: pathlib.Path,
    log_dir: pathlib.Path,
    spec: RunSpec,
    make_learner: Callable[[], Learner],
    resume: bool,
    progress: bool,
    lock: DirectoryLock,
) -> dict[str, Any]:
    """:func:`run` once the directory is locked and its files are checked."""
    checkpointer = learner = logger = bar = None
    last_saved, started, written = None, False, False
    status, final_eval, extras, failure = "finished", None, {}, None
    context = RunContext(None, None)
    try:
        if not resume:
            leftovers = run_files(log_dir, spec)
            if leftovers:
                written = True
                target = move_aside(log_dir, leftovers)
                print(
                    f"{log_dir} held the files of a run that stopped before its first checkpoint "
                    f"({_describe_files(leftovers)}): moved them to {target} and started over"
                )
        checkpointer, last_saved = open_checkpoints(run_dir, resume)
        learner = make_learner()
        bar = tqdm.tqdm(
            total=spec.total,
            disable=not progress or jax.process_index() > 0,
            unit=spec.unit.removesuffix("s").replace("_", " "),
            dynamic_ncols=True,
        )
        context.bar = bar
        if last_saved is not None:  # restored before anything is written: no good checkpoint is a refusal
            last_saved = restore_latest_good(learner, checkpointer, context)
            started = True
        written = True
        logger = context.logger = RunLogger(log_dir, config=config)
        if last_saved is not None:
            logger.truncate_after(learner.position())
            print(f"resumed {run_dir} at {spec.unit} {learner.position()}")
        else:
            learner.start(context)
            started = True
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
                    with deferred_signals():
                        checkpointer.save(position, state, metadata={"config": config, **metadata})
                        logger.flush()  # what was logged before a checkpoint survives a crash after it
                    last_saved = position
        except Diverged as error:
            status = f"diverged: {error}"
            context.write(f"stopping: {status}")
        extras = learner.summary()
    except BaseException as error:  # re-raised below, after the cleanup
        signum = _stopped_by()
        failure = error if signum is None else Interrupted(signum)  # whatever the signal's raise became
    if bar is not None:
        bar.close()
    errors = _close_all(learner, checkpointer, logger)
    if failure is None and errors:
        failure = errors[0]  # e.g. the last checkpoint's save found the disk full
    curve = None
    if failure is None:
        try:
            curve = plot_run_curve(log_dir, spec.title, spec.curve, plot_nonfinite=spec.plot_nonfinite)
        except BaseException as error:
            failure = error
    if failure is not None:
        if not written and isinstance(failure, ValueError):
            lock.release(restore=True)  # refused while restoring (no good checkpoint): nothing was written
        position = learner.position() if started else (last_saved or 0)
        last = checkpointer.latest_step() if checkpointer is not None else None
        explained = _explain(failure, run_dir, position, last)
        if explained is failure:
            raise failure
        raise explained from None
    return {
        "status": status,
        spec.unit: learner.position(),
        "run_dir": str(run_dir),
        "curve": curve,
        "final_eval": final_eval,
        **extras,
    }
