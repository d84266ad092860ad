"""python -m experiments.grpo: --help, config errors before compute, a short fp8+TIS run that logs, evaluates,
checkpoints, plots and resumes to the same result as an uninterrupted run."""

import subprocess
import sys

import numpy as np
import pytest

from experiments import grpo_loop
from experiments.cli import REPO_ROOT
from experiments.configs.grpo import fp8_tis
from lpjax.run_logging import read_metrics


def _tiny(**overrides):
    config = fp8_tis.get_config()
    config.update(iterations=20, warm_start_steps=100, eval_every=10, log_every=5, checkpoint_every=10,
                  eval_prompts=64)
    config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=2)
    config.update(overrides)
    return config


def test_help_lists_the_flags():
    result = subprocess.run([sys.executable, "-m", "experiments.grpo", "--help"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and "--config" in result.stdout and "--resume" in result.stdout


@pytest.mark.parametrize("overrides, message", [
    (dict(env="task:multiply"), "task:<name>"), (dict(iterations=0), "iterations"),
    (dict(agent={"group_size": 1}), "group_size"), (dict(agent={"ppo_epochs": 2}), "one update per rollout"),
])
def test_bad_configs_fail_before_compute(overrides, message, tmp_path):
    config = _tiny()
    agent = overrides.pop("agent", None)
    config.update(overrides)
    if agent:
        config.agent.update(agent)
    with pytest.raises(ValueError, match=message):
        grpo_loop.train(config, tmp_path, progress=False)


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
