"""python -m experiments.d4pg: --help, config errors before any compute, a short in-process ActorQ run with
evaluation, throughput record and plot, --resume continuing it (also after Ctrl-C), a run directory in use or
damaged."""

import json
import os
import re
import signal

import pytest

from experiments import d4pg_loop
from experiments.configs.d4pg import demo
from experiments.run import Interrupted
from lpjax.run_logging import read_metrics
from tests.run_refusals import assert_refusals
from tests.sac_configs import assert_usage_error, run_cli


def _cli(*args):
    return run_cli("experiments.d4pg", *args)


def _tiny(**overrides):
    config = demo.get_config()
    config.total_env_steps = 1200
    config.min_replay_size = 200
    config.eval_every = 600
    config.eval_episodes = 1
    config.checkpoint_every = 600
    config.agent.update(actor_hidden=(32, 32), critic_hidden=(32, 32), batch_size=32, num_atoms=11)
    config.update(overrides)
    return config


def test_help_lists_the_flags():
    result = _cli("--help")
    assert result.returncode == 0
    for flag in ("--config", "--run_dir", "--resume", "--[no]progress"):
        assert flag in result.stdout


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_actors=0), "num_actors"),
        (dict(pull_every=0), "pull_every"),
        (dict(env="brax:ant"), "dm_control"),
        (dict(env="dmc:cartpole-fly"), "cartpole"),
        (dict(actor_runtime="int4"), "actor_runtime"),
        (dict(backend="mpi"), "backend"),
        (dict(min_replay_size=8), "min_replay_size"),
    ],
)
def test_bad_run_configs_fail_before_any_compute(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        d4pg_loop.train(_tiny(**overrides), tmp_path, progress=False)


def test_unreachable_ray_address_is_a_usage_error(tmp_path):
    result = _cli(
        "--config=demo.py",
        "--config.backend=ray",
        "--config.ray_address=127.0.0.1:9",
        f"--run_dir={tmp_path}",
        "--noprogress",
    )
    assert_usage_error(result, "Cannot reach the Ray cluster")


def test_short_in_process_run_evaluates_records_and_resumes(tmp_path, monkeypatch):
    summary = d4pg_loop.train(_tiny(), tmp_path, progress=False)
    assert summary["env_steps"] >= 1200 and summary["updates"] > 0 and summary["restarts"] == 0
    metrics = read_metrics(tmp_path)
    assert (metrics["eval/return"] >= 0).sum() == 2
    assert (tmp_path / "learning_curve.png").stat().st_size > 0
    record = json.loads((tmp_path / "actor_learner.json").read_text())
    assert len(record["actors"]) == 2 and record["broadcast_bytes"] > 0
    assert set(record["actors"][0]["time_split"]) == {"env", "inference", "pull", "deserialize", "load"}
    with pytest.raises(ValueError, match="--resume"):
        d4pg_loop.train(_tiny(), tmp_path, progress=False)

    # A resumed run stopped by Ctrl-C after 3 chunks: one line, the learner and the actors closed, and resumed again.
    insert, inserts = d4pg_loop.D4PGLearner.insert, []

    def insert_then_interrupt(self, transitions):
        insert(self, transitions)
        inserts.append(len(inserts))
        if len(inserts) == 3:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(d4pg_loop.D4PGLearner, "insert", insert_then_interrupt)
    with pytest.raises(Interrupted) as raised:
        d4pg_loop.train(_tiny(total_env_steps=1800), tmp_path, resume=True, progress=False)
    assert re.fullmatch(
        rf"interrupted at step \d+; the last checkpoint is step {summary['env_steps']}; continue with --resume "
        rf"--run_dir={re.escape(str(tmp_path))}",
        str(raised.value),
    ), raised.value
    monkeypatch.undo()
    resumed = d4pg_loop.train(_tiny(total_env_steps=1800), tmp_path, resume=True, progress=False)
    assert resumed["env_steps"] >= 1800 and resumed["updates"] > summary["updates"]


def test_a_run_directory_in_use_or_damaged_is_refused_before_anything_is_written(tmp_path):
    assert_refusals(d4pg_loop.train, _tiny(), tmp_path, lambda config: _tiny(total_env_steps=2400))


@pytest.mark.xdist_group("ray")
def test_short_ray_run_records_both_actors(tmp_path, ray_cluster):
    """The same run with 2 Ray actor processes: the throughput record is written before Ray shuts down.

    Only what the design guarantees is asserted. Both actors get a job at the start, but the run stops as soon as
    800 steps have come back and a job still in flight is not counted, so how the steps split between the actors
    depends on when each Ray process starts: one may report every chunk before the other reports any. What holds
    is that both actors are in the record, their steps are whole chunks that add up to the run's, and the
    parameter server was pulled at least twice (once per actor that stepped, or every ``pull_every`` = 250 steps
    by one actor that took all 800).
    """
    config = _tiny(backend="ray", total_env_steps=800, eval_every=800)
    summary = d4pg_loop.train(config, tmp_path, progress=False)
    record = json.loads((tmp_path / "actor_learner.json").read_text())
    assert summary["env_steps"] >= 800 and summary["restarts"] == 0
    assert len(record["actors"]) == 2
    assert all(actor["env_steps"] % config.chunk_steps == 0 for actor in record["actors"])
    assert sum(actor["env_steps"] for actor in record["actors"]) == summary["env_steps"]
    assert record["server"]["pulls"] >= 2
