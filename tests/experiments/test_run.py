"""The shared run loop (experiments/run.py) with a scripted learner: when it evaluates and checkpoints, resume,
refusing to overwrite a run, divergence, cleanup on errors, and the summary's shape."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.run import Diverged, RunSpec, config_changes, open_checkpoints, passed_multiple, run
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


def test_method_switches_of_an_old_config_compare_with_their_nested_fields():
    old = {"agent": {"policy": "fp16", "hadam": True, "methods": {"hadam": False}}}
    assert config_changes(old, {"agent": {"policy": "fp16", "methods": {"hadam": True}}}) == []
    assert config_changes(old, {"agent": {"policy": "fp16", "methods": {"hadam": False}}}) == [
        "agent.methods.hadam: True -> False"
    ]


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
