"""experiments/run_farm.py with fake training: sessions in this process and in subprocesses, resuming, skipping
final runs, errors, divergence, locks, mismatched runs, and an interrupted farm."""

import json
import os
import sys
import textwrap

import pytest

from experiments import run_farm

# A fake ``python -m experiments.<name>`` session: reaches step argv[3] (a checkpoint directory), prints some
# log lines and then its summary as indented json (or exits with status argv[4] first, or sleeps argv[5] s).
FAKE_SESSION = textwrap.dedent("""
    import json, pathlib, sys, time
    run_dir, resume, step, code, sleep = pathlib.Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), \\
        int(sys.argv[4]), float(sys.argv[5])
    time.sleep(sleep)
    print("training", run_dir, "resume" if resume else "fresh", flush=True)
    if code:
        print("ValueError: something broke", file=sys.stderr)
        sys.exit(code)
    (run_dir / "checkpoints" / str(step)).mkdir(parents=True, exist_ok=True)
    status = "diverged: non-finite actions" if step < 0 else "finished"
    print(json.dumps({"status": status, "env_steps": abs(step), "resumed": resume, "nested": {"a": 1}}, indent=2))
    print("WARNING: something at exit", file=sys.stderr)
""")


def fake_command(run_dir, step=10, code=0, sleep=0.0):
    return lambda resume: [
        sys.executable,
        "-c",
        FAKE_SESSION,
        str(run_dir),
        "1" if resume else "0",
        str(step),
        str(code),
        str(sleep),
    ]


def sessions(run_dir):
    return run_farm.read_sessions(run_dir)


class FakeTraining:
    """In-process training that reaches the given steps, one per session, recording the resume flags."""

    def __init__(self, run_dir, steps, fail_at=None):
        self.run_dir, self.steps, self.fail_at, self.calls = run_dir, list(steps), fail_at, []

    def __call__(self, resume, progress):
        self.calls.append(resume)
        step = self.steps[len(self.calls) - 1]
        if step == self.fail_at:
            raise ValueError("bad config")
        (self.run_dir / "checkpoints" / str(step)).mkdir(parents=True, exist_ok=True)
        return {"status": "finished", "env_steps": step}


def test_in_process_session_resumes_until_final_then_skips(tmp_path):
    run_dir = tmp_path / "run"
    train = FakeTraining(run_dir, [5, 10])
    job = run_farm.Job("a/seed0", run_dir, steps=10, train=train)
    assert run_farm.run_state(run_dir, 10)["status"] == "missing"
    first = run_farm.run_session(job)
    assert first["action"] == "trained" and first["status"] == "partial" and first["step"] == 5
    assert not first["final"] and not (run_dir / run_farm.DONE_FILE).exists()
    second = run_farm.run_session(job)
    assert second["action"] == "trained" and second["status"] == "finished" and second["final"]
    assert train.calls == [False, True]  # the second session resumed from the checkpoint at 5
    done = json.loads((run_dir / run_farm.DONE_FILE).read_text())
    assert (done["status"], done["detail"], done["env_steps"]) == ("finished", "finished", 10)
    assert [(s["start_step"], s["end_step"], s["status"]) for s in sessions(run_dir)] == [
        (0, 5, "finished"),
        (5, 10, "finished"),
    ]
    third = run_farm.run_session(job)
    assert third["action"] == "skipped" and train.calls == [False, True] and len(sessions(run_dir)) == 2
    totals = run_farm.session_totals(run_dir)
    assert totals["sessions"] == 2 and totals["train_seconds"] >= 0


def test_a_fresh_start_clears_what_an_earlier_session_left_without_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("step\n1\n")
    outcome = run_farm.run_session(run_farm.Job("a", run_dir, steps=3, train=FakeTraining(run_dir, [3])))
    assert outcome["status"] == "finished" and not (run_dir / "metrics.csv").exists()


def test_an_error_is_recorded_retried_and_cleared(tmp_path):
    run_dir = tmp_path / "run"
    train = FakeTraining(run_dir, [4, 8], fail_at=4)
    job = run_farm.Job("a", run_dir, steps=8, train=train)
    failed = run_farm.run_session(job)
    assert failed["action"] == "error" and failed["error"] == "ValueError: bad config"
    assert failed["status"] == "error" and not failed["final"]
    assert json.loads((run_dir / run_farm.ERROR_FILE).read_text())["error"] == "ValueError: bad config"
    assert sessions(run_dir)[-1]["status"] == "error"
    retried = run_farm.run_session(job)
    assert retried["status"] == "finished" and not (run_dir / run_farm.ERROR_FILE).exists()


def test_train_to_end_raises_the_training_error_and_finishes_otherwise(tmp_path):
    run_dir = tmp_path / "run"
    job = run_farm.Job("a", run_dir, train=FakeTraining(run_dir, [4], fail_at=4))
    with pytest.raises(ValueError, match="bad config"):
        run_farm.train_to_end(job)
    assert (run_dir / run_farm.ERROR_FILE).exists()
    job = run_farm.Job("a", run_dir, train=FakeTraining(run_dir, [7]))  # steps=None: a returned session ends it
    assert run_farm.train_to_end(job)["status"] == "finished"
    assert run_farm.train_to_end(job)["action"] == "skipped"


def test_a_diverged_run_is_final(tmp_path):
    run_dir = tmp_path / "run"

    def train(resume, progress):
        return {"status": "diverged: the policy produced non-finite actions at step 3", "env_steps": 3}

    outcome = run_farm.run_session(run_farm.Job("a", run_dir, steps=100, train=train))
    assert outcome["status"] == "diverged" and outcome["final"] and outcome["step"] == 3
    assert outcome["detail"].startswith("diverged: the policy")
    assert run_farm.run_session(run_farm.Job("a", run_dir, steps=100, train=train))["action"] == "skipped"


def test_a_checkpoint_at_the_last_step_is_final_without_done_json(tmp_path):
    (tmp_path / "checkpoints" / "50").mkdir(parents=True)
    (tmp_path / "checkpoints" / "60.orbax-checkpoint-tmp").mkdir()  # not finalized: ignored
    assert run_farm.checkpoint_steps(tmp_path) == [50]
    assert run_farm.run_state(tmp_path, 50) == {"status": "finished", "final": True, "step": 50}
    assert run_farm.run_state(tmp_path, 60) == {"status": "partial", "final": False, "step": 50}


def test_a_locked_or_mismatched_run_is_left_alone(tmp_path):
    run_dir = tmp_path / "run"
    train = FakeTraining(run_dir, [1])
    lock = run_farm.RunLock(run_dir)
    assert lock.acquire()
    try:
        assert run_farm.run_state(run_dir, 1)["status"] == "running"
        assert run_farm.run_session(run_farm.Job("a", run_dir, steps=1, train=train))["action"] == "locked"
    finally:
        lock.release()
    assert not run_farm.held_elsewhere(run_dir)
    job = run_farm.Job("a", run_dir, steps=1, train=train, mismatch=lambda: ["seed: run has 0, flags give 1"])
    outcome = run_farm.run_session(job)
    assert outcome["action"] == "skipped" and outcome["status"] == "config_mismatch"
    assert outcome["config_differences"] == ["seed: run has 0, flags give 1"] and train.calls == []


def test_a_run_trained_by_hand_is_left_alone_and_the_farms_training_takes_the_run_lock(tmp_path):
    """The farm's ``.lock`` and the training's ``run.lock`` are distinct: a run directory a process started by hand
    writes (``run.lock`` held) is ``running`` and left alone, and the training a session starts in this process
    takes ``run.lock`` while the farm holds its ``.lock``."""
    from lpjax.run_lock import LOCK_FILE, DirectoryLock

    run_dir = tmp_path / "run"
    seen = []

    def train(resume, progress):
        with DirectoryLock(run_dir):  # what experiments.run.run does
            seen.append((run_dir / LOCK_FILE).read_text().split(" on host")[0])
        (run_dir / "checkpoints" / "1").mkdir(parents=True)
        return {"status": "finished", "env_steps": 1}

    job = run_farm.Job("a", run_dir, steps=1, train=train)
    with DirectoryLock(run_dir):
        assert run_farm.held_elsewhere(run_dir) and run_farm.run_state(run_dir, 1)["status"] == "running"
        outcome = run_farm.run_session(job)
        assert outcome["action"] == "locked" and outcome["status"] == "running" and seen == []
        assert not (run_dir / run_farm.SESSIONS_FILE).exists()
    assert run_farm.run_session(job)["action"] == "trained" and seen == [f"pid {os.getpid()}"]
    assert not run_farm.held_elsewhere(run_dir)


def test_summary_from_log_reads_the_last_top_level_object(tmp_path):
    log = tmp_path / "worker.log"
    log.write_text(
        '{"old": 1}\nnoise {"x": 2}\n'
        + json.dumps({"status": "finished", "n": {"a": 1}}, indent=2)
        + "\nW0101 a warning at exit\n"
    )
    assert run_farm.summary_from_log(log) == {"status": "finished", "n": {"a": 1}}
    offset = len(log.read_bytes())
    with open(log, "a") as f:
        f.write("a later session printed nothing\n")
    assert run_farm.summary_from_log(log, offset) is None
    assert run_farm.summary_from_log(tmp_path / "absent.log") is None


def test_subprocess_workers_train_report_failures_and_resume(tmp_path, capsys):
    dirs = {name: tmp_path / name for name in ("good", "bad", "silent", "diverges")}
    jobs = [
        run_farm.Job("good", dirs["good"], steps=10, command=fake_command(dirs["good"], step=10)),
        run_farm.Job("bad", dirs["bad"], steps=10, command=fake_command(dirs["bad"], code=3)),
        run_farm.Job(
            "silent", dirs["silent"], steps=10, command=lambda resume: [sys.executable, "-c", "print('no summary')"]
        ),
        run_farm.Job("diverges", dirs["diverges"], steps=10, command=fake_command(dirs["diverges"], step=-2)),
    ]
    outcomes = {o["run"]: o for o in run_farm.run_jobs(jobs, workers=2, poll_s=0.05)}
    assert outcomes["good"]["action"] == "trained" and outcomes["good"]["status"] == "finished"
    assert outcomes["diverges"]["status"] == "diverged" and outcomes["diverges"]["step"] == 2
    bad = outcomes["bad"]
    assert bad["action"] == "error" and bad["status"] == "error"
    assert bad["error"].startswith("worker exited with status 3") and "ValueError: something broke" in bad["error"]
    assert json.loads((dirs["bad"] / run_farm.ERROR_FILE).read_text())["error"] == bad["error"]
    assert outcomes["silent"]["action"] == "error" and "printed no summary" in outcomes["silent"]["error"]
    done = json.loads((dirs["good"] / run_farm.DONE_FILE).read_text())
    assert done["summary"] == {"status": "finished", "env_steps": 10, "resumed": False, "nested": {"a": 1}}
    assert "training" in (dirs["good"] / run_farm.WORKER_LOG).read_text()
    printed = capsys.readouterr().out
    assert "started in worker pid" in printed and "[2/4] bad: ERROR worker exited with status 3" in printed
    # The next farm skips the final runs and retries the failed one, which now resumes from its checkpoint.
    (dirs["bad"] / "checkpoints" / "4").mkdir(parents=True)
    jobs[1] = run_farm.Job("bad", dirs["bad"], steps=10, command=fake_command(dirs["bad"], step=10))
    again = {o["run"]: o for o in run_farm.run_jobs(jobs, workers=2, poll_s=0.05)}
    assert again["good"]["action"] == again["diverges"]["action"] == "skipped"
    assert again["bad"]["action"] == "trained" and again["bad"]["status"] == "finished"
    assert json.loads((dirs["bad"] / run_farm.DONE_FILE).read_text())["summary"]["resumed"] is True
    assert [(s["start_step"], s["end_step"]) for s in sessions(dirs["bad"])] == [(0, 0), (4, 10)]
    assert len(sessions(dirs["good"])) == 1


def test_an_interrupted_farm_stops_its_workers_and_records_their_sessions(tmp_path):
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    jobs = [
        run_farm.Job("fast", fast, steps=1, command=fake_command(fast, step=1)),
        run_farm.Job("slow", slow, steps=1, command=fake_command(slow, step=1, sleep=60)),
    ]

    def report(job):
        if job.name == "fast":
            raise KeyboardInterrupt  # as if Ctrl-C arrived while the slow run trains
        return run_farm.run_state(job.run_dir, job.steps)

    with pytest.raises(KeyboardInterrupt):
        run_farm.run_jobs(jobs, workers=2, report=report, poll_s=0.05)
    assert [s["status"] for s in sessions(slow)] == ["interrupted"]
    assert not run_farm.held_elsewhere(slow) and not (slow / run_farm.DONE_FILE).exists()
    assert run_farm.run_state(fast, 1)["status"] == "finished"


def test_workers_need_commands(tmp_path):
    job = run_farm.Job("a", tmp_path, train=lambda resume, progress: {})
    with pytest.raises(ValueError, match="no command"):
        run_farm.run_jobs([job], workers=2)
