"""Trains many independent runs, each in its own directory, and continues where an earlier session stopped.

A run is a :class:`Job`: a name, a directory, and how one training session trains it, in this process
(``train(resume, progress) -> summary``, e.g. ``experiments.sac_loop.train``) or as a subprocess
(``command(resume) -> argv``, a program printing its summary as a json object last on stdout). A summary holds
``status`` (``"finished"`` or ``"diverged: <reason>"``) and the run's position under ``Job.unit``.

The farm's files in a run directory, beside the training's (``config.json``, ``metrics.csv``, ``checkpoints/``):
``sessions.jsonl`` (one line per session: ``time``, ``start_step``, ``status``, ``seconds``, ``end_step``);
``done.json`` (the run is final: ``status`` finished or diverged, ``detail``, the position, ``time``, ``summary``);
``error.json`` (the last session raised; removed when the run ends); ``.lock`` (the farm's ``flock``, held for a
whole session, so two farms never run one run at once); ``worker.log`` (subprocess sessions' output). The
training itself holds ``run.lock`` (:mod:`lpjax.run_lock`) while it writes; the two are distinct files, so the
farm's lock never blocks the training it starts, and a session leaves a run alone (``locked``) when another
process holds either.

A session (:func:`run_session` here, :func:`run_jobs` with ``workers > 1`` in subprocesses) skips a final run
(and one whose directory holds another config: ``Job.mismatch``), starts a run without a finalized checkpoint
from an empty directory, resumes one with checkpoints, and records itself. A run becomes final when a session's
summary is diverged (resuming would diverge again) or its position reached ``Job.steps`` (any summary when
``steps`` is None). A session that raises is recorded in ``error.json`` and retried by the next one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from lpjax.run_lock import LOCK_FILE as RUN_LOCK_FILE
from lpjax.run_lock import DirectoryBusy, DirectoryLock, lock_holder

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
"""Working directory of subprocess sessions (``python -m experiments.<name>`` resolves from there)."""

DONE_FILE, ERROR_FILE, SESSIONS_FILE, LOCK_FILE, WORKER_LOG = (
    "done.json",
    "error.json",
    "sessions.jsonl",
    ".lock",
    "worker.log",
)

STATUSES = ("missing", "started", "partial", "error", "running", "finished", "diverged")
"""What :func:`run_state` reports: no directory; a directory without a finalized checkpoint; checkpoints but not
final; the last session raised (retried next time); another process holds the lock; final (``done.json``)."""


@dataclasses.dataclass(frozen=True)
class Job:
    """One run of a farm.

    Attributes:
      name: how the run is reported, e.g. ``"fp16/walker-walk/seed0"``.
      run_dir: the run's directory.
      steps: the position at which the run is finished (``None``: when a session returns a summary).
      unit: the summary key (and ``done.json`` key) holding the run's position.
      train: ``train(resume, progress) -> summary``: one session in this process.
      command: ``command(resume) -> argv``: one session as a subprocess (run from :data:`REPO_ROOT`) that prints
        its summary as a json object last on stdout.
      mismatch: ``mismatch() -> reasons``: why the directory's run is not this job's (e.g. its ``config.json``
        differs); a non-empty answer leaves the run alone.
    """

    name: str
    run_dir: pathlib.Path
    steps: int | None = None
    unit: str = "env_steps"
    train: Callable[[bool, bool], dict] | None = None
    command: Callable[[bool], Sequence[str]] | None = None
    mismatch: Callable[[], Sequence[str]] | None = None


def now() -> str:
    """The UTC time, to the second, in ISO format."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def read_json(path: pathlib.Path) -> dict | None:
    """The json object in ``path``; ``None`` when the file is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def checkpoint_steps(run_dir: pathlib.Path) -> list[int]:
    """Finalized checkpoint steps, ascending (orbax renames ``<step>.orbax-checkpoint-tmp`` to ``<step>`` when
    complete)."""
    directory = pathlib.Path(run_dir) / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def read_sessions(run_dir: pathlib.Path) -> list[dict]:
    """The lines of ``sessions.jsonl`` (a malformed line, e.g. cut by a crash, is left out)."""
    path = pathlib.Path(run_dir) / SESSIONS_FILE
    if not path.exists():
        return []
    sessions = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            sessions.append(json.loads(line))
    return sessions


def session_totals(run_dir: pathlib.Path) -> dict[str, Any]:
    """``train_seconds`` and ``sessions`` over all sessions, and ``steps_per_s`` (``None`` before any step)."""
    sessions = read_sessions(run_dir)
    seconds = sum(s.get("seconds", 0.0) for s in sessions)
    trained = sum(max(0, s.get("end_step", 0) - s.get("start_step", 0)) for s in sessions)
    return {
        "train_seconds": round(seconds, 1),
        "sessions": len(sessions),
        "steps_per_s": round(trained / seconds, 2) if seconds > 0 and trained else None,
    }


class RunLock:
    """The run directory's ``flock``, taken without waiting."""

    def __init__(self, run_dir: pathlib.Path):
        self.run_dir = pathlib.Path(run_dir)
        self._handle = None

    def acquire(self) -> bool:
        """Takes the lock (creating the directory); False, holding nothing, if another process has it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(self.run_dir / LOCK_FILE, "a")  # noqa: SIM115 (held until release)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._handle = handle
        return True

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


@contextlib.contextmanager
def locked(run_dir: pathlib.Path) -> Iterator[bool]:
    """Holds the run's lock (yields True), or yields False if another process holds it."""
    lock = RunLock(run_dir)
    ok = lock.acquire()
    try:
        yield ok
    finally:
        lock.release()


def held_elsewhere(run_dir: pathlib.Path) -> bool:
    """Whether another process holds the run's lock, or trains it (holds ``run.lock``)."""
    if lock_holder(run_dir) is not None:
        return True
    if not (pathlib.Path(run_dir) / LOCK_FILE).exists():
        return False
    with locked(run_dir) as ok:
        return not ok


def run_state(
    run_dir: pathlib.Path, steps: int | None = None, unit: str = "env_steps", check_lock: bool = True
) -> dict[str, Any]:
    """``status`` (one of :data:`STATUSES`), ``final`` and ``step`` (the latest finalized checkpoint, or the final
    position) of the run in ``run_dir``, plus ``detail`` (the summary's status) for a final run.

    A run whose latest checkpoint is at ``steps`` is finished even without ``done.json`` (a session stopped
    between its last checkpoint and writing the file). ``check_lock=False`` skips the lock probe (the caller
    holds the lock).
    """
    run_dir = pathlib.Path(run_dir)
    state: dict[str, Any] = {"status": "missing", "final": False, "step": 0}
    if not run_dir.is_dir():
        return state
    checkpoints = checkpoint_steps(run_dir)
    state["step"] = checkpoints[-1] if checkpoints else 0
    done = read_json(run_dir / DONE_FILE)
    if done is not None:
        state.update(status=done["status"], final=True, step=done.get(unit, state["step"]), detail=done.get("detail"))
    elif steps is not None and checkpoints and checkpoints[-1] >= steps:
        state.update(status="finished", final=True)
    elif check_lock and held_elsewhere(run_dir):
        state["status"] = "running"
    else:
        state["status"] = "error" if read_json(run_dir / ERROR_FILE) else "partial" if checkpoints else "started"
    return state


def describe(record: dict) -> str:
    """One line on a session's outcome (a record of :func:`run_session` or :func:`run_jobs`)."""
    status = record["status"]
    if record.get("action") == "error":
        return f"ERROR {record['error']}"
    if status == "finished":
        final = record.get("final_return")
        return "finished" + (f", final eval return {final:.1f}" if final is not None else "")
    if status == "diverged":
        return f"DIVERGED at step {record['step']} ({record.get('detail')})"
    if status == "config_mismatch":
        return "config mismatch, left alone: " + "; ".join(record["config_differences"][:3])
    return f"{status} at step {record['step']}"


# ---------------------------------------------------------------------------------------------- one session


def _clear(run_dir: pathlib.Path) -> None:
    """Removes a run directory's contents (kept: the locks and the worker log) before a start from scratch."""
    for path in run_dir.iterdir():
        if path.name in (LOCK_FILE, RUN_LOCK_FILE, WORKER_LOG):  # a worker's log may be open in the parent
            continue
        shutil.rmtree(path) if path.is_dir() else path.unlink()


class _Session:
    """One session of a job, between taking its lock and releasing it: what it starts from, what it leaves."""

    def __init__(self, job: Job):
        self.job = job
        self.lock = RunLock(job.run_dir)
        self.start_step = 0
        self.resume = False
        self.started = 0.0
        self.record: dict[str, Any] = {"time": now(), "start_step": 0, "status": "interrupted"}

    def begin(self) -> dict | None:
        """Takes the lock and prepares the directory; ``None`` if the session should train, else the outcome
        (``locked`` or ``skipped``; the lock is then released)."""
        job = self.job
        if not self.lock.acquire():
            return {**run_state(job.run_dir, job.steps, job.unit), "action": "locked"}
        try:
            writer = DirectoryLock(job.run_dir).acquire()  # held by a run started by hand: leave it alone
        except DirectoryBusy:
            self.lock.release()
            return {
                **run_state(job.run_dir, job.steps, job.unit, check_lock=False),
                "status": "running",
                "action": "locked",
            }
        try:
            state = run_state(job.run_dir, job.steps, job.unit, check_lock=False)
            differences = [] if state["final"] or job.mismatch is None else list(job.mismatch())
            if state["final"] or differences:
                self.lock.release()
                if differences:
                    state.update(status="config_mismatch", config_differences=differences)
                return {**state, "action": "skipped"}
            checkpoints = checkpoint_steps(job.run_dir)
            if not checkpoints:
                _clear(job.run_dir)
        finally:
            writer.release()  # the training takes it again
        self.start_step = checkpoints[-1] if checkpoints else 0
        self.resume = bool(checkpoints)
        self.record = {"time": now(), "start_step": self.start_step, "status": "interrupted"}
        self.started = time.perf_counter()
        return None

    def end(self, summary: dict | None = None, error: str | None = None) -> dict:
        """Records the session (``summary``: it returned; ``error``: it raised; neither: it was interrupted),
        marks the run final when the summary ends it, releases the lock; returns the outcome."""
        job, run_dir = self.job, self.job.run_dir
        seconds = round(time.perf_counter() - self.started, 2)
        try:
            self.record["seconds"] = seconds
            if summary is not None:
                self.record.update(
                    end_step=summary.get(job.unit, self.start_step), status=summary.get("status", "finished")
                )
            else:  # what persists is the latest checkpoint
                self.record["end_step"] = max([self.start_step, *checkpoint_steps(run_dir)])
                if error is not None:
                    self.record["status"] = "error"
            with open(run_dir / SESSIONS_FILE, "a") as f:
                f.write(json.dumps(self.record) + "\n")
            if error is not None:
                (run_dir / ERROR_FILE).write_text(
                    json.dumps({"error": error, "time": now(), "start_step": self.start_step}, indent=2) + "\n"
                )
            elif summary is not None:
                detail = str(summary.get("status", "finished"))
                diverged = detail.startswith("diverged")
                position = summary.get(job.unit)
                if diverged or job.steps is None or (position is not None and position >= job.steps):
                    (run_dir / DONE_FILE).write_text(
                        json.dumps(
                            {
                                "status": "diverged" if diverged else "finished",
                                "detail": detail,
                                job.unit: position,
                                "time": now(),
                                "summary": summary,
                            },
                            indent=2,
                            default=str,
                        )
                        + "\n"
                    )
                    with contextlib.suppress(FileNotFoundError):
                        (run_dir / ERROR_FILE).unlink()
        finally:
            self.lock.release()
        outcome = {**run_state(run_dir, job.steps, job.unit), "session_seconds": seconds}
        if error is not None:
            outcome.update(action="error", error=error)
        else:
            outcome["action"] = "trained" if summary is not None else "interrupted"
        return outcome


def run_session(job: Job, progress: bool = False, reraise: bool = False) -> dict:
    """Trains (or resumes) ``job`` in this process unless it is final, locked elsewhere or mismatched.

    Returns :func:`run_state`'s record plus ``action`` (``skipped``, ``locked``, ``trained`` or ``error``),
    ``session_seconds`` and, after an error, ``error``. An exception of ``job.train`` is recorded in
    ``error.json``, then re-raised if ``reraise`` (else reported as the ``error`` action); a KeyboardInterrupt
    is recorded as an interrupted session and propagates.
    """
    if job.train is None:
        raise ValueError(f"job {job.name!r} has no train function")
    session = _Session(job)
    outcome = session.begin()
    if outcome is not None:
        return outcome
    try:
        summary = job.train(session.resume, progress)
    except Exception as error:  # recorded; the caller goes on with the next run, or re-raises
        outcome = session.end(error=f"{type(error).__name__}: {error}")
        if reraise:
            raise
        return outcome
    except BaseException:
        session.end()
        raise
    return session.end(summary=summary)


def train_to_end(job: Job, progress: bool = False) -> dict:
    """Trains ``job`` in this process until it is final (nothing if it already is); an exception of the training
    propagates (after being recorded), and a session that returns without ending the run raises RuntimeError."""
    outcome = run_session(job, progress, reraise=True)
    if outcome["action"] == "locked":
        raise RuntimeError(f"{job.name}: another process is training {job.run_dir}")
    if not outcome["final"]:
        raise RuntimeError(f"{job.name}: the session ended at step {outcome['step']}, not final ({outcome})")
    return outcome


# ---------------------------------------------------------------------------------------- many sessions


def summary_from_log(path: pathlib.Path, offset: int = 0) -> dict | None:
    """The last json object printed from the start of a line in ``path`` after byte ``offset``; ``None`` if none.

    What follows the object (a warning printed at exit) is ignored.
    """
    try:
        text = pathlib.Path(path).read_bytes()[offset:].decode(errors="replace")
    except OSError:
        return None
    decoder = json.JSONDecoder()
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith("{"):
            with contextlib.suppress(ValueError):
                value, _ = decoder.raw_decode(text[starts[index] :])
                if isinstance(value, dict):
                    return value
    return None


class _Worker:
    """A subprocess session of a job."""

    def __init__(self, job: Job, session: _Session):
        if job.command is None:
            raise ValueError(f"job {job.name!r} has no command")
        self.job, self.session = job, session
        self.log_path = job.run_dir / WORKER_LOG
        self.log = open(self.log_path, "ab")  # noqa: SIM115 (the worker writes it until it exits)
        self.offset = self.log.tell()
        try:
            self.process = subprocess.Popen(
                list(job.command(session.resume)), cwd=REPO_ROOT, stdout=self.log, stderr=subprocess.STDOUT
            )
        except BaseException:
            self.log.close()
            raise

    def finish(self) -> dict:
        """Records the ended subprocess' session."""
        self.log.close()
        code = self.process.returncode
        summary = summary_from_log(self.log_path, self.offset) if code == 0 else None
        if summary is not None:
            return self.session.end(summary=summary)
        tail = _last_line(self.log_path, self.offset)
        reason = f"worker exited with status {code}" if code else "worker printed no summary"
        return self.session.end(error=f"{reason} (see its {WORKER_LOG})" + (f": {tail}" if tail else ""))

    def stop(self) -> None:
        """Terminates the subprocess (an interrupted session)."""
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=60)
        self.log.close()
        self.session.end()


def _last_line(path: pathlib.Path, offset: int) -> str:
    with contextlib.suppress(OSError):
        lines = [line.strip() for line in path.read_bytes()[offset:].decode(errors="replace").splitlines()]
        lines = [line for line in lines if line]
        return lines[-1][:300] if lines else ""
    return ""


def run_jobs(
    jobs: Sequence[Job],
    workers: int = 1,
    progress: bool = False,
    report: Callable[[Job], dict] | None = None,
    poll_s: float = 0.5,
) -> list[dict]:
    """Trains ``jobs`` in order: in this process one after the other (``workers == 1``, ``Job.train``), or in up
    to ``workers`` parallel subprocesses (``Job.command``). Prints a line when each starts and ends.

    Returns one outcome per job: ``report(job)`` (default: :func:`run_state`) taken after its session, with
    ``run`` (the job's name), ``action`` and, where they apply, ``error`` and ``session_seconds``. On an
    interruption (Ctrl-C) the workers started here are terminated, their sessions recorded as interrupted.
    """
    report = report or (lambda job: run_state(job.run_dir, job.steps, job.unit))
    total = len(jobs)

    def outcome_of(job: Job, session_outcome: dict) -> dict:
        extra = {k: session_outcome[k] for k in ("action", "error", "session_seconds") if k in session_outcome}
        return {**report(job), "run": job.name, **extra}

    def announce(i: int, job: Job, outcome: dict) -> None:
        took = f" in {outcome['session_seconds']:.0f} s" if "session_seconds" in outcome else ""
        print(f"[{i}/{total}] {job.name}: {describe(outcome)}{took}", flush=True)

    outcomes = []
    if workers <= 1:
        for i, job in enumerate(jobs, 1):
            state = run_state(job.run_dir, job.steps, job.unit)
            how = f"resuming from step {state['step']}" if state["status"] == "partial" else "starting"
            print(f"[{i}/{total}] {job.name}: {how}", flush=True)
            outcome = outcome_of(job, run_session(job, progress))
            announce(i, job, outcome)
            outcomes.append(outcome)
        return outcomes
    missing = [job.name for job in jobs if job.command is None]
    if missing:
        raise ValueError(f"workers > 1 runs subprocesses, and these jobs have no command: {', '.join(missing)}")
    queue = list(enumerate(jobs, 1))
    active: dict[_Worker, int] = {}
    try:
        while queue or active:
            while queue and len(active) < workers:
                i, job = queue.pop(0)
                session = _Session(job)
                early = session.begin()
                if early is not None:
                    outcome = outcome_of(job, early)
                    announce(i, job, outcome)
                    outcomes.append(outcome)
                    continue
                try:
                    worker = _Worker(job, session)
                except BaseException:
                    session.end(error="could not start the worker")
                    raise
                active[worker] = i
                print(
                    f"[{i}/{total}] {job.name}: started in worker pid {worker.process.pid} (log: {worker.log_path})",
                    flush=True,
                )
            if active:
                time.sleep(poll_s)
            for worker in [w for w in active if w.process.poll() is not None]:
                i = active.pop(worker)
                outcome = outcome_of(worker.job, worker.finish())
                announce(i, worker.job, outcome)
                outcomes.append(outcome)
    finally:
        for worker in active:  # only on an interruption: stop the workers started here
            worker.stop()
    return outcomes


def python_module(module: str, *args: str) -> list[str]:
    """``[python, -m, module, *args]`` with this interpreter."""
    return [sys.executable, "-m", module, *args]
