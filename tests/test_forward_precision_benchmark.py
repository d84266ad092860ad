"""benchmarks/forward_precision.py: the same SAC parameters under float32, bf16-activation and fp8-GEMM forward
passes, on a fresh agent and on a short real run."""

import json

import jax
import jax.numpy as jnp
import pytest

from benchmarks import forward_precision as bench
from experiments import sac_loop
from experiments.configs.sac import fp8 as fp8_config
from lpjax.agents import sac


def test_each_lower_precision_forward_pass_moves_q_and_its_action_gradient_further():
    agent = sac.init(jax.random.key(0), jnp.zeros(5), 2, sac.SACConfig(policy="fp8", hidden_dims=(64, 64)))
    keys = jax.random.split(jax.random.key(1))
    obs = jax.random.normal(keys[0], (256, 5)) * 3.0
    action = jax.random.uniform(keys[1], (256, 2), minval=-1.0, maxval=1.0)
    rows = bench.compare(agent, obs, action)
    assert list(rows) == ["fp32", "mixed_bf16", "fp8"]
    # The reference against itself: exactly nothing moves.
    assert rows["fp32"]["q_rms_error"] == 0.0 and rows["fp32"]["action_l2"] == 0.0
    assert rows["fp32"]["action_grad_cosine"] == pytest.approx(1.0, abs=1e-6)
    bf16, fp8 = rows["mixed_bf16"], rows["fp8"]
    # bf16 keeps 8 significant bits, e4m3 4: the fp8 GEMM's error is the larger, and both are errors, not noise
    # of the measurement.
    assert 0.0 < bf16["q_rms_error"] < fp8["q_rms_error"] < rows["fp32"]["q_spread"]
    assert 0.0 < bf16["action_l2"] < fp8["action_l2"]
    assert 0.5 < fp8["action_grad_cosine"] < bf16["action_grad_cosine"] < 1.0
    assert fp8["q_error_over_spread"] == pytest.approx(fp8["q_rms_error"] / fp8["q_spread"])


@pytest.mark.slow
def test_a_short_fp8_run_is_measured_on_its_own_replay(tmp_path):
    config = fp8_config.get_config()
    config.env = "dmc:cartpole-swingup"
    config.agent.hidden_dims = (32, 32)
    config.agent.batch_size = 32
    config.total_steps, config.seed_steps, config.log_every = 300, 200, 100
    config.eval_every, config.eval_episodes, config.action_repeat = 300, 1, 8
    run_dir = tmp_path / "run"
    sac_loop.train(config, run_dir, progress=False)
    result = bench.main(["--runs", str(run_dir), "--samples", "64", "--results_dir", str(tmp_path / "results")])
    recorded = json.loads((tmp_path / "results" / "forward_precision.json").read_text())
    assert recorded["runs"] == json.loads(json.dumps(result["runs"]))
    assert (tmp_path / "results" / "forward_precision.png").stat().st_size > 0
    (run,) = recorded["runs"]
    assert (run["trained_policy"], run["step"], run["samples"]) == ("fp8", 300, 64)
    fp8 = run["policies"]["fp8"]
    assert run["td_error_rms"] > 0 and fp8["q_rms_error"] > 0
    assert fp8["q_error_over_td_error"] == pytest.approx(fp8["q_rms_error"] / run["td_error_rms"])


def test_a_directory_without_checkpoints_is_an_error_and_stays_untouched(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="has no checkpoints"):
        bench.main(["--runs", str(tmp_path / "typo"), "--results_dir", str(tmp_path)])
    assert not (tmp_path / "typo").exists()
    with pytest.raises(SystemExit):
        bench.main(["--runs", "x", "--samples", "1"])
    assert "--samples must be >= 2" in capsys.readouterr().err
