"""benchmarks/gpu_train.py, and gpu_suite's jitted_loop part, which times the same loop: the configs, the goal,
and a quick run of both on MJX on this CPU (one process, so the loop compiles once)."""

import json

import pytest

from benchmarks import gpu_suite, gpu_train

pytest.importorskip("ml_collections")


@pytest.mark.parametrize("precision", list(gpu_train.CONFIGS))
def test_loop_settings_are_the_experiment_config_with_the_loop_fields(precision):
    settings = gpu_train.loop_settings(precision)
    assert settings.env == "mjx:cartpole-swingup" and settings.num_envs == gpu_train.LOOP["brax_num_envs"]
    assert settings.updates_per_step == gpu_train.LOOP["updates_per_step"]
    agent = settings.agent
    assert agent.hidden_dims == (1024, 1024) and agent.batch_size == 1024  # the paper's networks
    assert agent.actor_lr == agent.critic_lr == gpu_train.AGENT["actor_lr"]
    expected = gpu_suite.sac_config(gpu_train.CONFIGS[precision], 1024, 1024)
    assert (agent.policy, agent.methods) == (expected.policy, expected.methods)
    quick = gpu_train.loop_settings(precision, quick=True)
    assert quick.num_envs == gpu_train.QUICK_LOOP["brax_num_envs"] and quick.agent.hidden_dims == (32, 32)
    with pytest.raises(ValueError, match="precision must be one of"):
        gpu_train.loop_settings("fp64")


def test_goal_is_fp16_reaching_the_target_first():
    def runs(fp32, fp16):
        return {"fp32": {"time_to_target_s": fp32}, "fp16": {"time_to_target_s": fp16}}

    assert gpu_train.goal(runs(60.0, 45.0))["met"] is True
    assert gpu_train.goal(runs(45.0, 60.0))["met"] is False
    assert gpu_train.goal(runs(None, 80.0))["met"] is True  # fp32 never got there
    assert gpu_train.goal(runs(50.0, None))["met"] is False
    assert gpu_train.goal(runs(None, None))["met"] is None  # neither: unmeasured, not missed


def test_the_budget_shrinks_equally_to_fit_the_deadline():
    assert gpu_train.affordable_budget(100.0, 400.0, 2, 0.5, 5.0) == 100.0  # fits
    fits = gpu_train.affordable_budget(100.0, 180.0, 2, 0.5, 5.0)
    assert fits == pytest.approx((90.0 - 2.0) / 1.1)  # both learners, with their evaluations, in 180 s
    assert gpu_train.affordable_budget(100.0, -5.0, 2, 0.5, 5.0) == 0.0


@pytest.mark.slow
def test_quick_race_and_jitted_loop_part_on_mjx(tmp_path):
    pytest.importorskip("mujoco_playground")
    gpu_suite.main(["--quick", "--in_process", "--parts", "b", "--out_dir", str(tmp_path)])
    part = json.loads((tmp_path / "gpu_suite_quick.json").read_text())["parts"]["jitted_loop"]
    entry = part["devices"]["1"]["fp16"]
    assert "error" not in entry, entry.get("error")
    assert entry["env_steps_per_s"] > 0 and entry["updates_per_s"] > 0 and entry["actions_finite"]
    assert entry["updates_per_s"] / entry["env_steps_per_s"] == pytest.approx(
        gpu_train.QUICK_LOOP["updates_per_step"] / gpu_train.QUICK_LOOP["brax_num_envs"]
    )
    result = gpu_train.main(
        ["--quick", "--precisions", "fp16", "--budget_s", "0.5", "--eval_every_s", "0.2", "--eval_episodes", "2"]
        + ["--out_dir", str(tmp_path)]
    )
    assert (tmp_path / "gpu_train_quick.png").stat().st_size > 0
    run = json.loads((tmp_path / "gpu_train_quick.json").read_text())["runs"]["fp16"]
    assert "error" not in run, run.get("error")
    assert run["train_s"] >= 0.5 and run["compile_s"] > 0
    curve = run["curve"]
    assert curve[0]["train_s"] == 0 and curve[0]["updates"] == 0 and len(curve) >= 2
    assert curve[-1]["env_steps"] > 0 and curve[-1]["updates"] > 0
    assert result["goal"]["met"] is None or run["time_to_target_s"] is not None
