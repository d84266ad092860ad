"""python -m experiments.inspect: --help, errors, a real run on naive fp16 SAC, and --checkpoint of a trained run."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import inspect as cli
from experiments import sac_loop
from experiments.configs.sac import fp16, fp16_naive, fp32
from lpjax.agents import d4pg, sac
from lpjax.checkpoint import Checkpointer
from lpjax.methods import PrecisionMethods
from tests.sac_configs import run_cli, tiny_cartpole

TINY = ("--config.env=dmc:cartpole-swingup", "--config.agent.hidden_dims=32,32", "--batch_size=32")


def _cli(*args):
    return run_cli("experiments.inspect", *args)


def test_help_lists_the_flags_and_explains_the_phases():
    result = _cli("--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--config", "--algo", "--checkpoint", "--dtype", "--json", "--batch_size"):
        assert flag in result.stdout
    assert "critic" in result.stdout and "actor" in result.stdout


def test_unknown_algo_and_missing_config_fail_clearly():
    result = _cli("--algo=ppo", "--config=fp16_naive.py")
    assert result.returncode != 0 and "supports sac" in result.stderr
    result = _cli()
    assert result.returncode != 0 and "--config is required" in result.stderr


@pytest.mark.parametrize(
    "args, expected",
    [
        (("--config.agent.batch_size=0",), "batch_size must be >= 1"),
        (("--checkpoint={tmp}/missing",), "no config.json in"),
        (("--json={tmp}/a_file/report.json",), "is not a writable directory"),
    ],
)
def test_bad_inputs_fail_with_one_line_before_any_compute(tmp_path, args, expected):
    (tmp_path / "a_file").write_text("")
    result = _cli("--config=fp16.py", *TINY, *(a.format(tmp=tmp_path) for a in args))
    assert result.returncode != 0 and expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]


def test_naive_fp16_sac_report_from_the_command_line(tmp_path):
    out = tmp_path / "report.json"
    result = _cli("--config=fp16_naive.py", *TINY, f"--json={out}", "--limit=5")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "=== critic ===" in result.stdout and "=== actor ===" in result.stdout
    saved = json.loads(out.read_text())
    assert saved["config"]["agent"]["policy"] == "fp16" and set(saved["reports"]) == {"critic", "actor"}
    critic = saved["reports"]["critic"]["flagged"]
    assert any(row["zero_constant"] and "optimizer" in row["scope"] for row in critic)  # Adam's eps is 0 in fp16
    assert any(row["primitive"] == "integer_pow" and row["underflow_frac"] > 0 for row in critic)  # g^2


def test_dtype_choice_and_config_errors():
    assert cli.what_if_dtype("auto", jnp.float16) is None
    assert cli.what_if_dtype("auto", jnp.float32) == jnp.float16
    assert cli.what_if_dtype("bfloat16", jnp.float32) == jnp.bfloat16 and cli.what_if_dtype("none", "float32") is None
    config = fp16_naive.get_config()
    with pytest.raises(ValueError, match="no config.json"):
        cli.inspected_config(config, "/nonexistent/run")
    with pytest.raises(ValueError, match="batch_size"):
        cli.sac_reports(config, None, "auto", 0, 0)


def test_checkpoint_networks_are_cast_into_the_inspected_precision(tmp_path):
    config = tiny_cartpole(seed_steps=100, replay_capacity=400)
    run_dir = tmp_path / "run"
    assert sac_loop.train(config, run_dir, progress=False)["status"] == "finished"

    inspected = cli.inspected_config(fp16_naive.get_config(), str(run_dir))
    assert inspected.agent.policy == "fp16" and not inspected.agent.methods.hadam
    assert tuple(inspected.agent.hidden_dims) == (32, 32) and inspected.action_repeat == 4  # from the run

    env = sac_loop.make_envs(config)[0]
    fresh = sac.init(jax.random.key(5), jnp.zeros(env.observation_shape), env.action_dim, sac_loop.validate(inspected))
    restored = cli.restore_networks(str(run_dir), fresh)
    trained_loop = sac_loop.init_loop(config, sac_loop.validate(config), env)
    with Checkpointer(run_dir / "checkpoints") as checkpointer:
        trained, _ = checkpointer.restore(
            target=trained_loop if config.save_replay else trained_loop._replace(replay=None)
        )
    for got, want in zip(jax.tree.leaves(restored.actor.params), jax.tree.leaves(trained.agent.actor.params)):
        assert got.dtype == jnp.float16
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(jnp.float16)))
    np.testing.assert_array_equal(restored.temperature.params, trained.agent.temperature.params)
    assert jax.tree.structure(restored.actor.opt_state) == jax.tree.structure(fresh.actor.opt_state)


def test_d4pg_update_report_on_n_step_transitions():
    from experiments.configs.d4pg import fp16 as d4pg_fp16

    config = d4pg_fp16.get_config()
    config.unlock()
    config.env = "dmc:cartpole-balance"
    config.agent.update(actor_hidden=(16, 16), critic_hidden=(16, 16))
    config.agent.methods.update(hadam=False, loss_scaling=False, kahan_gradients=False, kahan_momentum=False)
    reports = cli.d4pg_reports(config, None, "auto", 16, 0)
    report = reports["update"]
    assert {row.scope.split("/")[0] for row in report.rows} >= {"critic", "actor", "target"}
    assert cli.paper_findings(reports)["Adam's eps rounds to 0"]  # plain optax.adam in float16
    with pytest.raises(ValueError, match="sac only"):
        cli.d4pg_reports(config, "/some/run", "auto", 16, 0)


def test_collect_batch_builds_n_step_transitions():
    env = sac_loop.make_envs(fp32.get_config())[0]
    zeros = np.zeros(env.action_dim, np.float32)
    one_step = cli.collect_batch(env, lambda obs, key: zeros, 8, seed=0)
    n_step = cli.collect_batch(env, lambda obs, key: zeros, 8, seed=0, n_step=3, gamma=0.5)
    assert one_step["obs"].shape == (8, *env.observation_shape) and one_step["action"].shape == (8, env.action_dim)
    np.testing.assert_array_equal(one_step["discount"], 1.0)  # no terminal in 8 steps
    np.testing.assert_allclose(n_step["discount"], 0.5**3)
    np.testing.assert_array_equal(n_step["next_obs"][0], one_step["next_obs"][2])  # s_3, three steps later
    np.testing.assert_allclose(
        n_step["reward"][0],
        one_step["reward"][0] + 0.5 * one_step["reward"][1] + 0.25 * one_step["reward"][2],
        rtol=1e-6,
    )


def test_precision_fields_are_the_learner_configs_numerics_with_the_whole_methods_subtree():
    for config_class in (sac.SACConfig, d4pg.D4PGConfig):
        fields = {field.name: field for field in dataclasses.fields(config_class)}
        assert set(cli.PRECISION_FIELDS) <= set(fields), config_class
        assert isinstance(config_class().methods, PrecisionMethods)


def test_checkpoint_config_takes_policy_matmul_and_every_method_from_the_config(tmp_path):
    """The run gives everything but the precision fields (policy, matmul implementation, methods)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stored = {
        "env": "dmc:cartpole-swingup",
        "action_repeat": 4,
        "agent": {"policy": "fp32", "hidden_dims": [32, 32], "methods": {"hadam": False, "normal_fix": False}},
    }
    (run_dir / "config.json").write_text(json.dumps(stored))
    config = fp16.get_config()
    inspected = cli.inspected_config(config, str(run_dir))
    assert inspected.agent.policy == "fp16" and inspected.agent.matmul_impl == config.agent.matmul_impl
    assert inspected.agent.methods.to_dict() == config.agent.methods.to_dict()
    assert inspected.agent.methods.hadam and inspected.agent.methods.normal_fix
    assert tuple(inspected.agent.hidden_dims) == (32, 32) and inspected.action_repeat == 4
    agent = sac_loop.validate(inspected)
    assert agent.methods == PrecisionMethods.from_mapping(config.agent.methods.to_dict())
