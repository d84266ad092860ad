"""python -m experiments.sac: --help, config resolution and errors, a short real run, SIGKILL + --resume."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from experiments import sac_loop
from experiments.cli import REPO_ROOT, resolve_config_argument
from experiments.configs.sac import fp16
from lpjax.checkpoint import Checkpointer
from lpjax.run_logging import read_metrics
from tests.sac_configs import tiny_cartpole

CONFIG_DIR = REPO_ROOT / "experiments" / "configs" / "sac"


def _tiny(**overrides):
    """fp16 with all methods, tiny networks, cartpole with 250-step episodes (action repeat 4), 1000 agent steps,
    an evaluation every 500 and a checkpoint every 250."""
    sizes = dict(total_steps=1000, replay_capacity=2000, eval_every=500, checkpoint_every=250)
    return tiny_cartpole(fp16, **{**sizes, **overrides})


def _cli(*args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "experiments.sac", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, MUJOCO_GL="egl"),
        **kwargs,
    )


def test_help_lists_the_flags():
    result = _cli("--help")
    assert result.returncode == 0
    for flag in ("--config", "--run_dir", "--resume", "--[no]progress"):
        assert flag in result.stdout


def test_bare_config_names_resolve_and_unknown_ones_list_the_choices():
    argv = resolve_config_argument(["prog", "--config=fp16.py", "--config.seed=3"], CONFIG_DIR)
    assert argv[1] == f"--config={CONFIG_DIR / 'fp16.py'}"
    assert resolve_config_argument(["prog", "--config", "fp32"], CONFIG_DIR)[2] == str(CONFIG_DIR / "fp32.py")
    with pytest.raises(SystemExit, match="Available: bf16.py, demo.py, fp16.py"):
        resolve_config_argument(["prog", "--config=fp17.py"], CONFIG_DIR)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(env="dmc:cheetah-fly"), "cheetah"),
        (dict(env="gym:Ant"), "dmc:<domain>-<task>"),
        (dict(seed_steps=5000), "seed_steps"),
        (dict(replay_capacity=16), "larger than the replay buffer"),
        (dict(total_steps=0), "total_steps"),
        (dict(replay_dtype="fp17"), "Unknown dtype name 'fp17'"),
        (dict(replay_dtype="fp8"), "replay_dtype must be a 16- or 32-bit float"),
        (dict(mesh=dict(data=4, fsdp=1)), r"4 devices, but there are 1 .*xla_force_host_platform_device_count"),
        (dict(replay_shards=3), r"replay_shards \(3\) must be a multiple"),
        (dict(replay_shards=4, seed_steps=2), r"seed_steps must be >= replay_shards - 1 \(3\)"),
    ],
)
def test_bad_run_configs_fail_before_any_compute(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        sac_loop.train(_tiny(**overrides), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_cli_reports_config_errors_without_a_traceback(tmp_path):
    result = _cli(
        "--config=fp16.py",
        "--config.agent.batch_size=4096",
        "--config.replay_capacity=100",
        f"--run_dir={tmp_path / 'run'}",
        "--noprogress",
    )
    assert result.returncode != 0 and "larger than the replay buffer" in result.stderr
    assert "Traceback" not in result.stderr


def test_short_run_logs_evaluates_checkpoints_and_plots(tmp_path):
    summary = sac_loop.train(_tiny(), tmp_path, progress=False)
    assert summary["status"] == "finished" and summary["env_steps"] == 1000
    metrics = read_metrics(tmp_path)
    evals = metrics["eval/return"][np.isfinite(metrics["eval/return"])]
    assert len(evals) == 2 and np.all(evals >= 0)
    losses = metrics["train/critic_loss"][np.isfinite(metrics["train/critic_loss"])]
    assert len(losses) >= 7 and np.all(np.isfinite(losses))
    assert set(metrics["train/critic_loss_scale"][np.isfinite(metrics["train/critic_loss_scale"])]) == {1e4}
    assert (tmp_path / "learning_curve.png").stat().st_size > 5000
    assert (tmp_path / "config.json").is_file()
    assert Checkpointer(tmp_path / "checkpoints").latest_step() == 1000
    with pytest.raises(ValueError, match="already holds checkpoints"):
        sac_loop.train(_tiny(), tmp_path, progress=False)


def test_sigkilled_run_resumes_bit_identically(tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    sac_loop.train(_tiny(), reference, progress=False)

    overrides = [
        "--config.env=dmc:cartpole-swingup",
        "--config.action_repeat=4",
        "--config.total_steps=1000",
        "--config.seed_steps=200",
        "--config.replay_capacity=2000",
        "--config.eval_every=500",
        "--config.eval_episodes=1",
        "--config.log_every=100",
        "--config.checkpoint_every=250",
        "--config.agent.hidden_dims=32,32",
        "--config.agent.batch_size=32",
    ]
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "experiments.sac",
            "--config=fp16.py",
            *overrides,
            f"--run_dir={killed}",
            "--noprogress",
        ],
        cwd=REPO_ROOT,
        env=dict(os.environ, MUJOCO_GL="egl"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while not (killed / "checkpoints" / "250").is_dir() and time.time() < deadline and child.poll() is None:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    interrupted_at = Checkpointer(killed / "checkpoints").latest_step()
    assert interrupted_at is not None and interrupted_at < 1000

    sac_loop.train(_tiny(), killed, resume=True, progress=False)
    target = sac_loop.init_loop(_tiny(), sac_loop.validate(_tiny()), sac_loop.make_envs(_tiny())[0])
    final = [Checkpointer(run / "checkpoints").restore(1000, target=target)[0] for run in (reference, killed)]
    leaves = [
        jax.tree.leaves(
            jax.tree.map(
                lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x, state
            )
        )
        for state in final
    ]
    assert len(leaves[0]) == len(leaves[1]) > 20
    for a, b in zip(*leaves):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ref_metrics, resumed_metrics = read_metrics(reference), read_metrics(killed)
    np.testing.assert_array_equal(ref_metrics["eval/return"], resumed_metrics["eval/return"])


def test_short_pixels_run_renders_trains_and_evaluates(tmp_path):
    from experiments.configs.sac import pixels

    config = pixels.get_config()
    config.unlock()
    config.update(
        env="dmc:cartpole-swingup",
        total_steps=150,
        seed_steps=50,
        replay_capacity=300,
        eval_every=150,
        eval_episodes=1,
        log_every=50,
        checkpoint_every=150,
    )
    config.agent.update(hidden_dims=(32,), batch_size=8, encoder_features=16)
    summary = sac_loop.train(config, tmp_path, progress=False)
    assert summary["status"] == "finished"
    metrics = read_metrics(tmp_path)
    assert np.isfinite(metrics["eval/return"]).sum() == 1
    losses = metrics["train/critic_loss"][np.isfinite(metrics["train/critic_loss"])]
    assert len(losses) >= 2
    loop, _ = Checkpointer(tmp_path / "checkpoints").restore(
        150, target=sac_loop.init_loop(config, sac_loop.validate(config), sac_loop.make_envs(config)[0])
    )
    assert loop.replay.data["obs"].dtype == np.uint8 and loop.replay.data["obs"].shape[1:] == (84, 84, 9)


def test_naive_fp16_diverges_cleanly_and_still_plots(tmp_path):
    from experiments.configs.sac import fp16_naive

    config = fp16_naive.get_config()
    config.unlock()
    config.update(
        env="dmc:cartpole-swingup",
        action_repeat=8,
        total_steps=400,
        seed_steps=50,
        replay_capacity=500,
        eval_every=400,
        eval_episodes=1,
        log_every=10,
        checkpoint_every=400,
    )
    config.agent.update(hidden_dims=(32, 32), batch_size=32)
    summary = sac_loop.train(config, tmp_path, progress=False)
    assert summary["status"].startswith("diverged") and summary["env_steps"] < 400
    assert summary["curve"] is not None and pathlib.Path(summary["curve"]).is_file()
    last = {k: v[-1] for k, v in read_metrics(tmp_path).items() if k.startswith("train/")}
    # The first update already breaks the actor and the temperature (the critic is still finite).
    assert np.isnan(last["train/actor_loss"]) and np.isnan(last["train/alpha"])


def test_a_float16_replay_trains_the_fp16_learner_identically(tmp_path):
    """The fp16 networks cast their inputs to float16 first: storing the transitions in float16 changes the
    replay's bytes, not one loss of the run."""
    from experiments.configs.sac import fp16_sr

    def run(replay_dtype, name):
        config = tiny_cartpole(fp16_sr, replay_dtype=replay_dtype)
        sac_loop.train(config, tmp_path / name, progress=False)
        metrics = read_metrics(tmp_path / name)
        return {k: v for k, v in metrics.items() if k.startswith(("train/critic", "train/actor", "train/q", "eval/"))}

    half, full = run("fp16", "half"), run("float32", "full")
    assert set(half) == set(full) and np.isfinite(half["train/critic_loss"]).sum() >= 1
    for key in half:
        np.testing.assert_array_equal(half[key], full[key])
