"""benchmarks/rounding_noise.py: round-to-nearest, Kahan summation and stochastic rounding landing the same float16
updates, against float64, at a small size; and the target lag read from a real SAC checkpoint."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import rounding_noise as bench
from lpjax.agents import sac
from lpjax.checkpoint import Checkpointer
from lpjax.methods import PrecisionMethods

STEPS = 4000


@pytest.fixture(scope="module")
def simulated():
    return bench.simulate(size=4096, steps=STEPS, log_every=1000, lr=3e-5, tau=0.005, period=2, drift=0.5, seed=0)


def test_each_method_errs_as_its_rounding_predicts(simulated):
    final = bench.summarize(simulated)["final"]
    theory = bench.theory(0.005, STEPS)
    nearest, kahan, stochastic = (final[m] for m in bench.METHODS)
    # Kahan carries every residual: below an ulp on both updates.
    assert kahan["param"] < 1.0 and kahan["target"] < 1.0
    # Stochastic rounding is unbiased noise within its bound, far above Kahan's error.
    assert 10 * kahan["param"] < stochastic["param"] <= theory["stochastic_parameter_median_ulp_bound"]
    assert 0.3 * theory["stochastic_target_median_ulp_bound"] < stochastic["target"]
    assert stochastic["target"] <= theory["stochastic_target_median_ulp_bound"]
    assert abs(stochastic["param_bias"]) < 0.2 * stochastic["param"]
    assert abs(stochastic["target_bias"]) < 0.2 * stochastic["target"]
    # Round-to-nearest loses the target's sub-half-ulp steps: it lags behind (bias against the drift), by more than
    # stochastic rounding's noise.
    assert nearest["target_bias"] < -1.0 and nearest["target"] > 3 * stochastic["target"]


def test_the_errors_are_logged_every_log_every_updates_and_stochastic_noise_grows_on_the_parameters(simulated):
    assert simulated["steps"] == [1000, 2000, 3000, 4000]
    curve = simulated["curves"]["stochastic"]["param"]
    assert curve[-1] > curve[0]  # a random walk: sqrt(k) growth, 2x from 1000 to 4000 updates
    assert set(simulated["curves"]) == {*bench.METHODS, "signal"}


def test_real_lags_reads_the_critic_and_its_target_from_a_sac_checkpoint(tmp_path):
    config = sac.SACConfig(policy="fp16", hidden_dims=(32, 32), methods=PrecisionMethods.paper())
    state = sac.init(jax.random.key(0), jnp.zeros(5), 2, config)
    online = state.critic.params
    up = jnp.asarray(jnp.inf, jnp.float16)
    # The target three ulps above the online critic, everywhere.
    target = jax.tree.map(lambda p: jnp.nextafter(jnp.nextafter(jnp.nextafter(p, up), up), up), online)
    state = state.replace(target_critic=target)
    with Checkpointer(tmp_path / "checkpoints", async_save=False) as checkpointer:
        checkpointer.save(10, {"agent": state})
    lags = bench.real_lags([tmp_path])[str(tmp_path)]
    assert len(lags) == 4  # two Q networks x two hidden-layer matrices (the 32x1 outputs are left out)
    for name, lag in lags.items():
        assert lag == pytest.approx(3.0, abs=0.01), name
    with Checkpointer(tmp_path / "empty" / "checkpoints", async_save=False) as checkpointer:
        checkpointer.save(1, {"agent": {"w": np.zeros((3, 3))}})
    with pytest.raises(ValueError, match="no critic and target_critic matrices"):
        bench.real_lags([tmp_path / "empty"])
    with pytest.raises(ValueError, match="no checkpoints directory"):
        bench.real_lags([tmp_path / "typo"])
    assert not (tmp_path / "typo").exists()  # nothing created where a run was mistyped


def test_quick_run_writes_the_json_and_the_plot(tmp_path):
    result = bench.main(["--quick", "--results_dir", str(tmp_path)])
    recorded = json.loads((tmp_path / "rounding_noise.json").read_text())
    assert (tmp_path / "rounding_noise.png").stat().st_size > 0
    assert recorded["config"]["size"] == 4096 and recorded["steps"][-1] == 2000
    assert recorded["summary"] == json.loads(json.dumps(result["summary"]))
    assert recorded["real_target_lags"] == {} and set(recorded["theory"]) >= {"stochastic_target_median_ulp_bound"}


def test_bad_flags_are_one_line_errors(capsys):
    for argv, message in [
        (["--steps", "1000", "--log_every", "300"], "multiple of --log_every"),
        (["--tau", "0"], "--tau must be in (0, 1]"),
        (["--target_period", "0"], "must be >= 1"),
    ]:
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert message in capsys.readouterr().err
