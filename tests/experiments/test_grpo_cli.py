"""python -m experiments.grpo: --help, config errors before compute, the configs and an old run's flat agent config
load, a short fp16 run with PPO epochs stays finite, a short fp8+TIS run that logs, evaluates, checkpoints, plots
and resumes to the same result as an uninterrupted run (also after SIGTERM), a run directory in use or damaged."""

import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import grpo_loop
from experiments.cli import REPO_ROOT
from experiments.configs.grpo import fp8_tis, fp16
from experiments.run import Interrupted
from lpjax.agents.grpo import RolloutConfig
from lpjax.checkpoint import Checkpointer
from lpjax.run_logging import read_metrics
from tests.run_refusals import assert_refusals


def _tiny(**overrides):
    config = fp8_tis.get_config()
    config.update(iterations=20, warm_start_steps=100, eval_every=10, log_every=5, checkpoint_every=10, eval_prompts=64)
    config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=2)
    config.update(overrides)
    return config


def test_help_lists_the_flags():
    result = subprocess.run(
        [sys.executable, "-m", "experiments.grpo", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "--config" in result.stdout and "--resume" in result.stdout


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c.update(env="task:multiply"), "task:<name>"),
        (lambda c: c.update(iterations=0), "iterations"),
        (lambda c: c.agent.update(group_size=1), "group_size"),
        (lambda c: c.agent.update(num_minibatches=3), "num_minibatches"),
        (lambda c: c.agent.rollout.update(policy="fp7"), "RolloutConfig: Unknown precision policy"),
        (lambda c: c.agent.rollout.update(kv_cache_dtype="int8"), "RolloutConfig: Unknown KV-cache dtype"),
        (lambda c: c.agent.methods.update(init_scale=0.5), "init_scale must be >= 1"),
    ],
)
def test_bad_configs_fail_before_compute(change, message, tmp_path):
    config = _tiny()
    change(config)
    with pytest.raises(ValueError, match=message):
        grpo_loop.train(config, tmp_path, progress=False)


def test_configs_load():
    """Every config validates, with its training and rollout precisions."""
    for name in ("fp32", "bf16", "fp8_tis", "fp8_no_tis", "fp8_kv", "fp16"):
        module = __import__(f"experiments.configs.grpo.{name}", fromlist=["get_config"])
        agent, _ = grpo_loop.validate(module.get_config())
        assert agent.rollout.policy in ("fp32", "mixed_bf16", "fp8", "fp16"), name
    agent, _ = grpo_loop.validate(fp16.get_config())
    assert agent.policy == "fp16" and agent.rollout == RolloutConfig("fp16", "fp16")
    assert agent.methods.hadam and agent.methods.loss_scaling and agent.methods.kahan_gradients
    assert grpo_loop.validate(fp8_tis.get_config())[0].rollout == RolloutConfig("fp8", "fp8")


@pytest.mark.slow
def test_short_fp16_run_with_ppo_epochs_stays_finite(tmp_path):
    config = fp16.get_config()
    config.update(iterations=10, warm_start_steps=100, eval_every=10, log_every=5, checkpoint_every=10, eval_prompts=64)
    config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=2)
    config.agent.update(num_prompts=4, group_size=4, ppo_epochs=2, num_minibatches=2)
    summary = grpo_loop.train(config, tmp_path, progress=False)
    assert summary["iterations"] == 10 and summary["policy"] == "fp16" and summary["rollout_policy"] == "fp16"
    metrics = read_metrics(tmp_path)
    rows = np.isfinite(metrics["train/reward"])
    assert rows.sum() == 2
    for name in ("train/loss", "train/pg_loss", "train/ppo_clip_frac", "train/ppo_clip_frac_last", "train/mismatch_kl"):
        assert np.all(np.isfinite(metrics[name][rows])), name
    assert np.all(metrics["train/loss_scale"][rows] >= 1)


@pytest.mark.parametrize(
    "name", [pytest.param("fp8_tis", marks=pytest.mark.slow), pytest.param("fp8_kv", marks=pytest.mark.slow), "bf16"]
)
def test_a_resumed_run_ends_bit_identical_to_an_uninterrupted_one(name, tmp_path, monkeypatch):
    """Interrupted after a checkpoint (by its length, or by SIGTERM for bf16) and resumed, the run logs the same
    metrics and ends in the same state, fp8 KV scales included (they were calibrated on the last iteration's rollout
    tokens, not on the eval prompts)."""
    module = __import__(f"experiments.configs.grpo.{name}", fromlist=["get_config"])

    def config(iterations=6):
        c = module.get_config()
        c.update(
            iterations=iterations, warm_start_steps=60, eval_every=3, log_every=1, checkpoint_every=3, eval_prompts=32
        )
        c.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=2)
        c.agent.update(num_prompts=4, group_size=4)
        return c

    grpo_loop.train(config(), tmp_path / "full", progress=False)
    if name == "bf16":  # stopped by SIGTERM after iteration 4 (its checkpoint at 3) rather than by its length
        iteration = grpo_loop.iteration

        def iteration_then_sigterm(*args, **kwargs):
            state, metrics = iteration(*args, **kwargs)
            if int(state.step) == 4:
                os.kill(os.getpid(), signal.SIGTERM)
            return state, metrics

        monkeypatch.setattr(grpo_loop, "iteration", iteration_then_sigterm)
        with pytest.raises(Interrupted, match=r"^interrupted at step [34]; the last checkpoint is step 3; continue"):
            grpo_loop.train(config(), tmp_path / "split", progress=False)
        monkeypatch.undo()
    else:
        grpo_loop.train(config(iterations=3), tmp_path / "split", progress=False)
    grpo_loop.train(config(), tmp_path / "split", resume=True, progress=False)
    full, split = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "split")
    for column in ("train/reward", "train/loss", "train/mismatch_kl", "eval/accuracy"):
        np.testing.assert_array_equal(split[column], full[column], err_msg=column)
    saved = [Checkpointer(run / "checkpoints").restore(6)[0] for run in (tmp_path / "full", tmp_path / "split")]
    for a, b in zip(jax.tree.leaves(saved[0]), jax.tree.leaves(saved[1]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if name != "bf16":
        assert saved[0]["kv_scales"] is not None


def test_a_run_directory_in_use_or_damaged_is_refused_before_anything_is_written(tmp_path):
    assert_refusals(grpo_loop.train, _tiny(), tmp_path, lambda config: _tiny(iterations=40))


@pytest.mark.slow
def test_short_fp8_tis_run_resumes_to_the_same_result(tmp_path):
    full = grpo_loop.train(_tiny(), tmp_path / "full", progress=False)
    metrics = read_metrics(tmp_path / "full")
    assert full["iterations"] == 20 and (tmp_path / "full" / "learning_curve.png").stat().st_size > 0
    rows = np.isfinite(metrics["train/reward"])
    assert rows.sum() == 4 and np.all(metrics["train/mismatch_kl"][rows] >= 0)
    assert np.isfinite(metrics["eval/accuracy"]).sum() == 3  # after the warm start, at 10 and 20
    grpo_loop.train(_tiny(iterations=10), tmp_path / "split", progress=False)
    with pytest.raises(ValueError, match="--resume"):
        grpo_loop.train(_tiny(), tmp_path / "split", progress=False)
    resumed = grpo_loop.train(_tiny(), tmp_path / "split", resume=True, progress=False)
    assert resumed["final_eval"] == full["final_eval"]
    split = read_metrics(tmp_path / "split")
    np.testing.assert_allclose(split["train/reward"][np.isfinite(split["train/reward"])], metrics["train/reward"][rows])
