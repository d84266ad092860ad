"""experiments.sac_brax_loop: config errors before compute, the transitions it stores, in-place (donated) chunks,
a short real run (losses, evaluation, checkpoint, plot) and an interrupted run resumed bit-identically."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import sac_brax_loop
from experiments.cli import REPO_ROOT
from experiments.configs.sac import fp16
from lpjax.checkpoint import Checkpointer
from lpjax.run_logging import read_metrics
from tests.sac_configs import tiny_config

# Columns that depend on wall-clock time, not on the computation.
TIMING_COLUMNS = {"wall_time", "train/env_steps_per_s", "train/updates_per_s"}


def _tiny(**overrides):
    """fp16 with all methods, tiny networks, 8 inverted pendulums (random actions end episodes within ~20 steps)."""
    sizes = dict(total_steps=480, seed_steps=64, replay_capacity=1024, eval_every=240, eval_episodes=2)
    loop = dict(env="brax:inverted_pendulum", brax_num_envs=8, log_every=160, checkpoint_every=240)
    return tiny_config(fp16, **{**sizes, **loop, **overrides})


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(env="brax:cheetah"), "Unknown brax env 'cheetah'; valid names: .*'halfcheetah'"),
        (dict(brax_backend="physx"), "Unknown brax backend 'physx'; valid backends: .*'spring'"),
        (dict(env="dmc:cheetah-run"), "runs 'brax:<env>' and 'mjx:<domain>-<task>' environments"),
        (dict(total_steps=300), r"total_steps \(300\) must be a multiple of brax_num_envs \(8\)"),
        (dict(log_every=100), r"log_every \(100\) must be a multiple of brax_num_envs"),
        (dict(brax_num_envs=0), "brax_num_envs must be a positive integer"),
        (dict(pixels=True), "states only"),
        (dict(seed_steps=1000), "seed_steps"),
        (dict(replay_capacity=16), "larger than the replay buffer"),
        (dict(mesh=dict(data=3)), r"brax_num_envs \(8\) must be a multiple of the mesh's 3 devices"),
        (dict(mesh=dict(data=4)), r"4 devices, but there are 1 .*force devices"),  # this process has 1
        (dict(mesh=dict(data=2, fsdp=2)), r"fused_optimizer=True keeps the optimizer state in one flat buffer"),
        (dict(mesh=dict(data=0)), r"mesh.data must be a positive integer, got 0"),
        (dict(replay_shards=16), r"replay_shards \(16\) must divide brax_num_envs \(8\)"),
        (dict(replay_shards=3), r"replay_shards \(3\) must be a multiple of the mesh's 1 device"),
        (dict(replay_dtype="fp16"), "replay_dtype is implemented by the dm_control loop only"),
    ],
)
def test_bad_run_configs_fail_before_any_compute(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message) as error:
        sac_brax_loop.train(_tiny(**overrides), tmp_path / "run", progress=False)
    assert "\n" not in str(error.value)  # one line
    assert not (tmp_path / "run").exists()


def test_cli_dispatches_brax_envs_to_this_loop(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.sac",
            "--config=fp32.py",
            "--config.env=brax:halfcheetah",
            "--config.brax_backend=physx",
            f"--run_dir={tmp_path / 'run'}",
            "--noprogress",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, MUJOCO_GL="egl"),
    )
    assert result.returncode != 0 and "Unknown brax backend 'physx'" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def _leaves(state):
    return [
        np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
        for x in jax.tree.leaves(state)
    ]


class Interrupted(Exception):
    """Stands in for a crash in the middle of a run."""


def test_chunks_store_transitions_in_place_and_runs_resume_bit_identically(tmp_path, monkeypatch):
    # One test, so the compiled functions (cached per settings in the process) are compiled once.
    config = _tiny()
    settings = sac_brax_loop.settings_of(config, sac_brax_loop.validate(config))
    n, iterations = settings.num_envs, config.log_every // settings.num_envs

    # 1. A chunk updates the loop state in place (donated) and stores the right transitions.
    chunk = sac_brax_loop.chunk_fn(settings, iterations)
    loop = sac_brax_loop.init_loop(settings, config.seed)
    pointer = loop.replay.data["obs"].unsafe_buffer_pointer()
    loop, out = chunk(loop)
    assert loop.replay.data["obs"].unsafe_buffer_pointer() == pointer  # the buffer was not copied
    assert int(loop.env_steps) == config.log_every and int(loop.replay.size) == config.log_every
    assert int(out.learning_iterations) == iterations - config.seed_steps // n
    assert bool(out.actions_finite) and np.isfinite(float(out.metrics["critic_loss"]))
    data = jax.tree.map(
        lambda x: np.asarray(x)[: config.log_every].reshape((iterations, n) + x.shape[1:]), loop.replay.data
    )
    ended = data["discount"][:-1] == 0.0  # pendulums fall (terminate) and reset; no truncation in 20 steps
    assert ended.sum() >= 3 and int(loop.episodes) == (data["discount"] == 0.0).sum() > 0
    np.testing.assert_array_equal(data["next_obs"][:-1][~ended], data["obs"][1:][~ended])  # s' is the next s
    assert np.all(np.any(data["next_obs"][:-1][ended] != data["obs"][1:][ended], axis=-1))  # not the reset s
    np.testing.assert_array_equal(data["reward"], 1.0)
    assert np.all(np.abs(data["action"]) <= 1.0)

    # 2. A short run: losses, evaluations, checkpoint, plot; refuses to overwrite.
    reference = tmp_path / "reference"
    summary = sac_brax_loop.train(config, reference, progress=False)
    assert summary["status"] == "finished" and summary["env_steps"] == 480
    assert summary["env_steps_per_s"] > 0 and summary["updates_per_s"] > 0 and summary["compile_s"] > 0
    metrics = read_metrics(reference)
    evals = metrics["eval/return"][np.isfinite(metrics["eval/return"])]
    assert len(evals) == 2 and np.all(evals >= 1) and summary["final_eval"]["return"] == evals[-1]
    losses = metrics["train/critic_loss"][np.isfinite(metrics["train/critic_loss"])]
    assert len(losses) == 3 and np.all(np.isfinite(losses))
    assert set(metrics["train/critic_loss_scale"][np.isfinite(metrics["train/critic_loss_scale"])]) == {1e4}
    assert np.nanmin(metrics["train/episode_return"]) >= 1
    assert (reference / "learning_curve.png").stat().st_size > 5000 and (reference / "config.json").is_file()
    assert Checkpointer(reference / "checkpoints").all_steps() == [320, 480]
    with pytest.raises(ValueError, match="already holds checkpoints"):
        sac_brax_loop.train(config, reference, progress=False)

    # 3. A run interrupted at its second evaluation (step 480, after the checkpoint of step 320) and resumed.
    interrupted = tmp_path / "interrupted"
    evaluate, calls = sac_brax_loop.evaluate, []

    def crash_at_second_evaluation(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise Interrupted
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(sac_brax_loop, "evaluate", crash_at_second_evaluation)
    with pytest.raises(Interrupted):
        sac_brax_loop.train(config, interrupted, progress=False)
    monkeypatch.setattr(sac_brax_loop, "evaluate", evaluate)
    assert Checkpointer(interrupted / "checkpoints").latest_step() == 320
    assert read_metrics(interrupted)["step"].max() == 480  # logged past the checkpoint: truncated on resume

    resumed = sac_brax_loop.train(config, interrupted, resume=True, progress=False)
    assert resumed["status"] == "finished" and resumed["env_steps"] == 480
    target = sac_brax_loop.abstract_loop(settings)
    final = [Checkpointer(run / "checkpoints").restore(480, target=target)[0] for run in (reference, interrupted)]
    leaves = [_leaves(state) for state in final]
    assert len(leaves[0]) == len(leaves[1]) > 100
    for a, b in zip(*leaves):
        np.testing.assert_array_equal(a, b)
    ref_metrics, resumed_metrics = read_metrics(reference), read_metrics(interrupted)
    assert set(ref_metrics) == set(resumed_metrics)
    for column in set(ref_metrics) - TIMING_COLUMNS:
        np.testing.assert_array_equal(ref_metrics[column], resumed_metrics[column], err_msg=column)
