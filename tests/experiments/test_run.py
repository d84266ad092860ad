"""The shared run loop (experiments/run.py) with a scripted learner: when it evaluates and checkpoints, resume,
refusing to overwrite a run, divergence, cleanup on errors, and the summary's shape; one writer per directory,
damaged files refused before anything is written, SIGINT/SIGTERM, a full disk, and reruns without a checkpoint."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.run import Diverged, Interrupted, RunSpec, open_checkpoints, passed_multiple, run
from lpjax.checkpoint import Checkpointer


class ScriptedLearner:
    """Advances by fixed increments (like episodes); can be checkpointed only at the positions in ``boundaries``."""

    def __init__(self, increments, boundaries=None, diverge_at=None, fail_at=None, fixed=False):
        self.increments, self.boundaries = list(increments), boundaries
        self.diverge_at, self.fail_at, self.fixed = diverge_at, fail_at, fixed
        self.pos, self.events, self.closed, self.started = 0, [], False, False

    def position(self):
        return self.pos

    def start(self, context):
        self.started = True

    def restore(self, checkpointer, step):
        state, metadata = checkpointer.restore(step, target={"pos": jnp.zeros([], jnp.int32)})
        self.pos = int(state["pos"])
        self.events.append(("restore", step, metadata["note"]))

    def advance(self, limit, context):
        step = self.increments.pop(0) if self.increments else 1
        self.pos = self.pos + step if self.fixed else min(self.pos + step, limit)
        if self.fail_at is not None and self.pos >= self.fail_at:
            raise RuntimeError("boom")
        if self.diverge_at is not None and self.pos >= self.diverge_at:
            raise Diverged(f"nan at {self.pos}")
        context.logger.log(self.pos, {"x": float(self.pos)}, prefix="train")

    def evaluate(self):
        self.events.append(("eval", self.pos))
        return {"return": float(self.pos)}

    def can_checkpoint(self):
        return self.boundaries is None or self.pos in self.boundaries

    def checkpoint(self):
        self.events.append(("save", self.pos))
        return {"pos": jnp.asarray(self.pos, jnp.int32)}, {"note": "hello"}

    def summary(self):
        return {"extra": 1}

    def close(self):
        self.closed = True


def _spec(total=21, eval_every=10, checkpoint_every=10):
    return RunSpec(
        kind="test run",
        unit="env_steps",
        total=total,
        eval_every=eval_every,
        checkpoint_every=checkpoint_every,
        title="t",
        curve=("eval/return", "train/x"),
    )


def _events(learner, kind):
    return [e[1] for e in learner.events if e[0] == kind]


def test_passed_multiple():
    assert passed_multiple(None, 10, 10) and passed_multiple(9, 10, 10) and passed_multiple(3, 25, 10)
    assert not passed_multiple(10, 19, 10) and not passed_multiple(None, 9, 10)


def test_evaluates_at_each_multiple_and_checkpoints_at_the_first_boundary_past_it(tmp_path):
    # Increments stop at the limit (the next multiple): evaluations land exactly on 10 and 20, and at the end.
    # Checkpoints wait for a boundary: 12 (first past 10), 20, and the end (21).
    learner = ScriptedLearner([3, 4, 9, 2, 2, 5, 5, 1], boundaries={3, 7, 12, 14, 20, 21})
    summary = run({"name": "cfg"}, tmp_path, _spec(), lambda: learner, progress=False)
    assert learner.started and learner.closed
    assert _events(learner, "eval") == [10, 20, 21]
    assert _events(learner, "save") == [12, 20, 21]
    assert summary == {
        "status": "finished",
        "env_steps": 21,
        "run_dir": str(tmp_path),
        "curve": str(tmp_path / "learning_curve.png"),
        "final_eval": {"return": 21.0},
        "extra": 1,
    }
    assert json.loads((tmp_path / "config.json").read_text()) == {"name": "cfg"}
    with Checkpointer(tmp_path / "checkpoints") as checkpointer:
        assert checkpointer.all_steps() == [20, 21]
        _, metadata = checkpointer.restore(21)
        assert metadata["config"] == {"name": "cfg"} and metadata["note"] == "hello"


def test_fixed_increments_evaluate_and_checkpoint_at_the_first_position_past_each_multiple(tmp_path):
    learner = ScriptedLearner([8] * 4, fixed=True)
    run({}, tmp_path, _spec(total=32), lambda: learner, progress=False)
    assert _events(learner, "eval") == [16, 24, 32] and _events(learner, "save") == [16, 24, 32]


def test_refuses_to_overwrite_a_run_and_resumes_from_its_latest_checkpoint(tmp_path):
    run({}, tmp_path, _spec(total=10), lambda: ScriptedLearner([5, 5]), progress=False)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        run({}, tmp_path, _spec(total=30), lambda: ScriptedLearner([5]), progress=False)
    resumed = ScriptedLearner([5, 5, 5, 5])
    summary = run({}, tmp_path, _spec(total=30), lambda: resumed, resume=True, progress=False)
    assert not resumed.started and resumed.events[0] == ("restore", 10, "hello")
    assert summary["env_steps"] == 30 and _events(resumed, "save") == [20, 30]
    # The metrics rows of a resumed run continue those of the checkpoint.
    rows = (tmp_path / "metrics.csv").read_text().splitlines()[1:]
    steps = [int(float(row.split(",")[0])) for row in rows]
    assert steps == sorted(steps)


def test_a_diverged_learner_ends_the_run_with_its_reason_and_is_closed(tmp_path):
    learner = ScriptedLearner([4] * 10, diverge_at=12)
    summary = run({}, tmp_path, _spec(total=40), lambda: learner, progress=False)
    assert summary["status"] == "diverged: nan at 14" and summary["env_steps"] == 14
    assert summary["final_eval"] == {"return": 10.0} and learner.closed


def test_an_error_propagates_after_closing_the_learner_and_the_checkpointer(tmp_path):
    learner = ScriptedLearner([4] * 10, fail_at=14)
    with pytest.raises(RuntimeError, match="boom"):
        run({}, tmp_path, _spec(total=40), lambda: learner, progress=False)
    assert learner.closed
    checkpointer, latest = open_checkpoints(tmp_path, resume=True)  # the save of step 10 is complete
    checkpointer.close()
    assert latest == 10


def test_what_was_logged_before_a_checkpoint_is_on_disk_when_it_is_taken(tmp_path):
    """TensorBoard's writer buffers events (flushing every 10 s): the run flushes it at each checkpoint, so a crash
    after a checkpoint loses no point logged before it (the CSV is flushed at every row)."""
    from tests.tensorboard_events import read_tensorboard_scalars

    class Recording(ScriptedLearner):
        def checkpoint(self):
            self.at_save = self.pos
            return super().checkpoint()

        def advance(self, limit, context):
            if getattr(self, "at_save", None) is not None:  # the first advance after a checkpoint
                on_disk = [step for step, _ in read_tensorboard_scalars(tmp_path).get("train/x", [])]
                self.seen.append((self.at_save, on_disk))
                self.at_save = None
            super().advance(limit, context)

    learner = Recording([5] * 8)
    learner.seen = []
    run({}, tmp_path, _spec(total=40), lambda: learner, progress=False)
    assert [saved for saved, _ in learner.seen] == [10, 20, 30]
    for saved, on_disk in learner.seen:
        assert on_disk == list(range(5, saved + 1, 5)), (saved, on_disk)


def test_a_resume_that_changes_the_config_is_refused_before_anything_is_written(tmp_path):
    config = {"env": "dmc:cartpole-swingup", "seed": 0, "total_steps": 10, "agent": {"actor_lr": 1e-4}}
    run(config, tmp_path, _spec(total=10), lambda: ScriptedLearner([5, 5]), progress=False)
    written = (tmp_path / "config.json").read_text()
    changed = {**config, "seed": 1, "agent": {"actor_lr": 3e-4}}
    with pytest.raises(ValueError, match=r"agent.actor_lr: 0.0001 -> 0.0003; seed: 0 -> 1\. Only checkpoint_every"):
        run(changed, tmp_path, _spec(total=20), lambda: ScriptedLearner([5, 5]), resume=True, progress=False)
    assert (tmp_path / "config.json").read_text() == written
    longer = {**config, "total_steps": 20, "eval_every": 5}  # safe changes, and a field the run did not have
    summary = run(longer, tmp_path, _spec(total=20), lambda: ScriptedLearner([5, 5]), resume=True, progress=False)
    assert summary["env_steps"] == 20 and json.loads((tmp_path / "config.json").read_text())["total_steps"] == 20


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one_with_a_warning(tmp_path, capsys):
    run({}, tmp_path, _spec(total=20, checkpoint_every=10), lambda: ScriptedLearner([5] * 4), progress=False)
    with Checkpointer(tmp_path / "checkpoints") as checkpointer:
        assert checkpointer.all_steps() == [10, 20]
    (tmp_path / "checkpoints" / "20" / "metadata" / "metadata").write_text("")  # an empty metadata file
    resumed = ScriptedLearner([5] * 4)
    summary = run({}, tmp_path, _spec(total=30), lambda: resumed, resume=True, progress=False)
    assert resumed.events[0] == ("restore", 10, "hello") and summary["env_steps"] == 30
    assert "warning: checkpoint 20 in" in capsys.readouterr().err
    for step in (20, 30):  # the corrupt checkpoint made way for the resumed run's own
        (tmp_path / "checkpoints" / str(step) / "metadata" / "metadata").write_text("")
    with pytest.raises(ValueError, match=r"every checkpoint in .* is corrupt \(steps \[20, 30\]\)"):
        run({}, tmp_path, _spec(total=40), lambda: ScriptedLearner([5]), resume=True, progress=False)


def test_the_spec_refuses_bad_run_lengths():
    for bad in (dict(total=0), dict(eval_every=0), dict(checkpoint_every=-1)):
        with pytest.raises(ValueError, match="Bad test run config"):
            _spec(**bad)
    assert np.isfinite(_spec().total)


# Reliability: one writer per run directory, damaged files refused before anything is written, signals, a full disk
# and reruns of a run that left no checkpoint.


def _tree(directory):
    """Every file under ``directory`` with its bytes (directories as ``<dir>``): what a refusal must not change."""
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"<dir>" for p in directory.rglob("*")}


def _steps(run_dir):
    return [int(row.split(",")[0]) for row in (run_dir / "metrics.csv").read_text().splitlines()[1:]]


def _finished_run(tmp_path, config=None, total=20):
    run(config or {}, tmp_path, _spec(total=total), lambda: ScriptedLearner([5] * 8), progress=False)
    return _tree(tmp_path)


def test_a_run_directory_in_use_is_refused_naming_its_holder_before_anything_is_written(tmp_path):
    from lpjax.run_lock import DirectoryLock

    _finished_run(tmp_path, total=10)
    with DirectoryLock(tmp_path):  # another process's run (flock: another open file conflicts even in this one)
        before = _tree(tmp_path)
        for resume in (False, True):
            with pytest.raises(ValueError) as refused:
                run({}, tmp_path, _spec(total=20), lambda: ScriptedLearner([5] * 4), resume=resume, progress=False)
            message = str(refused.value)
            assert "\n" not in message
            assert re.match(
                rf"{re.escape(str(tmp_path))} is in use by another process \(pid {os.getpid()} on host "
                rf"{re.escape(socket.gethostname())}, started \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC; lock file ",
                message,
            ), message
            assert _tree(tmp_path) == before
    fresh = tmp_path / "fresh"
    with DirectoryLock(fresh), pytest.raises(ValueError, match="is in use by another process"):
        run({}, fresh, _spec(), lambda: ScriptedLearner([5]), progress=False)
    assert sorted(p.name for p in fresh.iterdir()) == []


def test_a_second_run_started_on_a_live_run_is_refused_and_the_live_run_loses_nothing(tmp_path):
    """Two new runs, or a --resume, started while a run writes the directory: refused, the live run's rows intact."""
    refusals = []

    class Live(ScriptedLearner):
        def advance(self, limit, context):
            super().advance(limit, context)
            if self.pos == 15:  # after its checkpoint at 10
                for resume in (False, True):
                    try:
                        run({}, tmp_path, _spec(total=40), lambda: ScriptedLearner([5]), resume=resume, progress=False)
                    except ValueError as error:
                        refusals.append(str(error))

    summary = run({}, tmp_path, _spec(total=30), lambda: Live([5] * 6), progress=False)
    assert summary["env_steps"] == 30 and len(refusals) == 2
    assert all(f"is in use by another process (pid {os.getpid()} on host" in r for r in refusals)
    assert _steps(tmp_path) == [5, 10, 10, 15, 20, 20, 25, 30, 30]  # train rows and the evaluations, once each
    assert not (tmp_path / "run.lock").exists()


def test_a_stale_lock_left_by_a_killed_run_does_not_block(tmp_path):
    (tmp_path / "run.lock").write_text("pid 999999 on host gone, started 2020-01-01 00:00:00 UTC\n")
    summary = run({}, tmp_path, _spec(total=10), lambda: ScriptedLearner([5, 5]), progress=False)
    assert summary["env_steps"] == 10 and not (tmp_path / "run.lock").exists()


CONFIG = {"env": "dmc:cartpole-swingup", "total_steps": 20, "agent": {"actor_lr": 1e-4}}


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '{\n  "agent": {\n    actor_lr: 3\n  }\n}\n',
            r"line 3 column 5: not valid JSON: Expecting property name enclosed",
        ),
        ("", r"line 1 column 1: not valid JSON: Expecting value\."),
        ('["env", "total_steps"]\n', r"line 1: not a config: a JSON list, not an object\."),
        (
            '{\n  "env": "dmc:cartpole-swingup",\n  "agent": 5\n}\n',
            r"line 3: 'agent' is 5, where the config has a sect",
        ),
        ('{\n  "learner": {}\n}\n', r"line 1: not a config of this run: none of its fields \(learner\) is a field"),
    ],
)
def test_a_damaged_config_json_is_refused_naming_the_file_and_line_and_nothing_changes(tmp_path, text, message):
    _finished_run(tmp_path, CONFIG)
    (tmp_path / "config.json").write_text(text)
    before = _tree(tmp_path)
    with pytest.raises(ValueError) as refused:
        run(CONFIG, tmp_path, _spec(total=30), lambda: ScriptedLearner([5] * 4), resume=True, progress=False)
    assert re.match(rf"{re.escape(str(tmp_path / 'config.json'))}, {message}", str(refused.value)), refused.value
    assert "\n" not in str(refused.value) and _tree(tmp_path) == before


def test_a_garbage_metrics_row_is_refused_before_the_config_is_rewritten(tmp_path):
    _finished_run(tmp_path, CONFIG)
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    lines[3] = "abc" + lines[3][lines[3].index(",") :]
    (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
    before = _tree(tmp_path)
    longer = {**CONFIG, "total_steps": 40}  # a change --resume allows: config.json would be rewritten
    with pytest.raises(ValueError) as refused:
        run(longer, tmp_path, _spec(total=40), lambda: ScriptedLearner([5] * 4), resume=True, progress=False)
    assert str(refused.value) == f"{tmp_path / 'metrics.csv'}, line 4: step 'abc' is not an integer."
    assert _tree(tmp_path) == before


def test_no_good_checkpoint_is_a_refusal_that_changes_nothing(tmp_path):
    """The checkpoints are restored before config.json is rewritten (here with a longer run) and the log truncated."""
    _finished_run(tmp_path, CONFIG)
    for step in (10, 20):
        (tmp_path / "checkpoints" / str(step) / "metadata" / "metadata").write_text("")
    before = _tree(tmp_path)
    longer = {**CONFIG, "total_steps": 40}
    with pytest.raises(ValueError, match=r"every checkpoint in .* is corrupt \(steps \[10, 20\]\)"):
        run(longer, tmp_path, _spec(total=40), lambda: ScriptedLearner([5]), resume=True, progress=False)
    assert _tree(tmp_path) == before


class Signalling(ScriptedLearner):
    """Sends itself ``signum`` once it reaches ``at``, and another one while the run cleans up (in ``close``)."""

    def __init__(self, increments, at, signum, again=True):
        super().__init__(increments)
        self.at, self.signum, self.again = at, signum, again

    def advance(self, limit, context):
        super().advance(limit, context)
        if self.pos == self.at:
            os.kill(os.getpid(), self.signum)

    def close(self):
        if self.again and self.pos >= self.at:
            os.kill(os.getpid(), self.signum)  # a second Ctrl-C while the run stops: ignored
        super().close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sigint_and_sigterm_stop_with_one_line_and_resume_continues_exactly(tmp_path, signum):
    reference = tmp_path / "reference"
    run({}, reference, _spec(total=30), lambda: ScriptedLearner([5] * 6), progress=False)
    stopped = tmp_path / "stopped"
    learner = Signalling([5] * 6, at=15, signum=signum)
    with pytest.raises(Interrupted) as raised:
        run({}, stopped, _spec(total=30), lambda: learner, progress=False)
    assert isinstance(raised.value, KeyboardInterrupt) and raised.value.exit_code == 128 + signum
    assert str(raised.value) == (
        f"interrupted at step 15; the last checkpoint is step 10; continue with --resume --run_dir={stopped}"
    )
    assert learner.closed and signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers put back
    assert not (stopped / "run.lock").exists()
    resumed = ScriptedLearner([5] * 6)
    run({}, stopped, _spec(total=30), lambda: resumed, resume=True, progress=False)
    assert resumed.events[0] == ("restore", 10, "hello")
    assert _steps(stopped) == _steps(reference) == [5, 10, 10, 15, 20, 20, 25, 30, 30]
    with Checkpointer(stopped / "checkpoints") as checkpointer:
        assert checkpointer.all_steps() == [20, 30]


class _InterruptedMetadata:
    """Pytree metadata whose equality check receives Ctrl-C: jit compares it in C++ while it looks up its cache."""

    armed = False

    def __eq__(self, other):
        if _InterruptedMetadata.armed:
            _InterruptedMetadata.armed = False
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises here
        return isinstance(other, _InterruptedMetadata)

    def __hash__(self):
        return 0


@jax.tree_util.register_pytree_node_class
class _Node:
    def __init__(self, x, metadata):
        self.x, self.metadata = x, metadata

    def tree_flatten(self):
        return (self.x,), self.metadata

    @classmethod
    def tree_unflatten(cls, metadata, children):
        return cls(children[0], metadata)


_increment = jax.jit(lambda node: node.x + 1)


class SignalledInsideALibrary(ScriptedLearner):
    """Receives SIGINT at ``at`` inside code that does not let the ``KeyboardInterrupt`` through: code that drops
    it, or jit, which turns it into a ``ValueError`` when it arrives in a pytree's metadata comparison."""

    def __init__(self, increments, at, library):
        super().__init__(increments)
        self.at, self.library = at, library

    def advance(self, limit, context):
        super().advance(limit, context)
        _increment(_Node(jnp.zeros(()), _InterruptedMetadata()))  # compiled: the next call looks up the cache
        if self.pos != self.at:
            return
        if self.library == "drops it":
            with contextlib.suppress(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler raises here
            self.pos += 1  # the learner goes on and reports its next step
        else:
            _InterruptedMetadata.armed = True
            _increment(_Node(jnp.zeros(()), _InterruptedMetadata()))


@pytest.mark.parametrize("library, position", [("drops it", 16), ("jit turns it into a ValueError", 15)])
def test_a_signal_caught_by_a_library_still_stops_the_run_before_anything_more_is_saved(tmp_path, library, position):
    with pytest.raises(Interrupted) as raised:
        run({}, tmp_path, _spec(total=30), lambda: SignalledInsideALibrary([5] * 6, 15, library), progress=False)
    assert str(raised.value) == (
        f"interrupted at step {position}; the last checkpoint is step 10; continue with --resume --run_dir={tmp_path}"
    )
    assert raised.value.exit_code == 128 + signal.SIGINT


def test_a_signal_during_a_checkpoint_save_lets_the_save_finish(tmp_path, monkeypatch):
    save = Checkpointer.save

    def interrupted_save(self, step, state, metadata=None):
        if step == 20:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives inside the save: delivered when it returns
        save(self, step, state, metadata)

    monkeypatch.setattr(Checkpointer, "save", interrupted_save)
    with pytest.raises(Interrupted, match=r"^interrupted at step 20; the last checkpoint is step 20; continue with"):
        run({}, tmp_path, _spec(total=30), lambda: ScriptedLearner([5] * 6), progress=False)


def test_a_rerun_of_a_run_stopped_before_its_first_checkpoint_moves_its_files_aside(tmp_path, capsys):
    with pytest.raises(Interrupted) as raised:
        run({}, tmp_path, _spec(total=30), lambda: Signalling([5] * 6, at=5, signum=signal.SIGTERM), progress=False)
    assert str(raised.value) == (
        "interrupted at step 5; there is no checkpoint yet; run the same command again to start over"
    )
    with pytest.raises(ValueError, match="holds no complete checkpoint to continue from; run the same command without"):
        run({}, tmp_path, _spec(total=30), lambda: ScriptedLearner([5] * 6), resume=True, progress=False)
    old = {name: (tmp_path / name).read_bytes() for name in ("config.json", "metrics.csv")}
    capsys.readouterr()
    run({}, tmp_path, _spec(total=30), lambda: ScriptedLearner([5] * 6), progress=False)
    (moved,) = tmp_path.glob("previous-*")
    assert re.fullmatch(r"previous-\d{8}-\d{6}", moved.name)
    names = sorted(p.name for p in moved.iterdir())
    assert len(names) == 3 and names[0] == "config.json" and names[2] == "metrics.csv"
    assert names[1].startswith("events.out.tfevents.")
    assert {name: (moved / name).read_bytes() for name in old} == old
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"{tmp_path} held the files of a run that stopped before its first checkpoint (config.json, metrics.csv, "
        f"1 event file): moved them to {moved} and started over"
    )
    assert _steps(tmp_path) == [5, 10, 10, 15, 20, 20, 25, 30, 30]  # nothing appended to the old rows


def test_a_full_disk_at_a_checkpoint_stops_with_one_line_and_resume_continues_exactly(tmp_path, monkeypatch):
    from lpjax import disk

    free = [1 << 40]
    monkeypatch.setattr(disk, "free_bytes", lambda path: free[0])

    class FillsTheDisk(ScriptedLearner):
        def advance(self, limit, context):
            super().advance(limit, context)
            if self.pos == 15:
                free[0] = 0

    with pytest.raises(disk.DiskFull) as raised:
        run({}, tmp_path, _spec(total=30), lambda: FillsTheDisk([5] * 6), progress=False)
    assert re.fullmatch(
        rf"cannot write checkpoint 20 to {re.escape(str(tmp_path / 'checkpoints'))}: it needs up to \d+ B \(0 B free "
        rf"there\); the last checkpoint is step 10; free some space, then continue with --resume "
        rf"--run_dir={re.escape(str(tmp_path))}",
        str(raised.value),
    ), raised.value
    assert _steps(tmp_path) == [5, 10, 10, 15, 20, 20]  # every row whole
    free[0] = 1 << 40
    run({}, tmp_path, _spec(total=30), lambda: ScriptedLearner([5] * 6), resume=True, progress=False)
    assert _steps(tmp_path) == [5, 10, 10, 15, 20, 20, 25, 30, 30]


def _full_disk_under(monkeypatch, directory, after_bytes=0):
    """``os.write`` to any file under ``directory`` writes ``after_bytes`` more bytes in all, then fails: ENOSPC."""
    real_write, left = os.write, [after_bytes]

    def write(fd, data):
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory)):
            return real_write(fd, data)
        if left[0] == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(len(data), left[0])
        left[0] -= n
        return real_write(fd, bytes(data[:n]))

    monkeypatch.setattr(os, "write", write)


def test_a_full_disk_mid_row_or_at_the_start_is_one_line_and_leaves_every_file_whole(tmp_path, monkeypatch):
    from lpjax.disk import DiskFull

    class FillsTheDisk(ScriptedLearner):
        def advance(self, limit, context):
            if self.pos == 15:
                _full_disk_under(monkeypatch, tmp_path, after_bytes=6)  # the next row is cut after 6 bytes
            super().advance(limit, context)

    with pytest.raises(DiskFull) as raised:
        run({}, tmp_path, _spec(total=30), lambda: FillsTheDisk([5] * 6), progress=False)
    assert str(raised.value).startswith(f"cannot write a metrics row at step 20 to {tmp_path / 'metrics.csv'}: No")
    assert str(raised.value).endswith(
        f"the last checkpoint is step 10; free some space, then continue with --resume --run_dir={tmp_path}"
    )
    assert (tmp_path / "metrics.csv").read_text().endswith("\n") and _steps(tmp_path) == [5, 10, 10, 15]
    with pytest.raises(DiskFull) as raised:  # the disk is still full: a new run writes nothing
        run({}, tmp_path / "new", _spec(), lambda: ScriptedLearner([5]), progress=False)
    assert str(raised.value).startswith(f"cannot write the lock file to {tmp_path / 'new' / 'run.lock'}: No space")
    assert str(raised.value).endswith("; free some space, then run the same command again")
    assert not (tmp_path / "new").exists()
    monkeypatch.undo()
    run({}, tmp_path, _spec(total=30), lambda: ScriptedLearner([5] * 6), resume=True, progress=False)
    assert _steps(tmp_path) == [5, 10, 10, 15, 20, 20, 25, 30, 30]
