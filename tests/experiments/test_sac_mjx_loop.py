"""SAC on MJX (MuJoCo Playground) in the jitted loop: config errors before compute, the CLI's dispatch of
``--config=mjx``, checkpoints of MJX's state (zero-size arrays left out and rebuilt) and, in the slow tier, a tiny
run through the CLI resumed bit-identically in another process."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import sac_brax_loop
from experiments.cli import REPO_ROOT
from experiments.configs.sac import mjx
from lpjax.checkpoint import Checkpointer
from lpjax.run_logging import read_metrics

# The tiny run: fp16 with all methods on cartpole-swingup, tiny networks, 4 environments.
TINY = dict(
    brax_num_envs=4,
    total_steps=256,
    seed_steps=64,
    replay_capacity=512,
    log_every=128,
    eval_every=128,
    eval_episodes=2,
    checkpoint_every=128,
)
TINY_AGENT = dict(hidden_dims=(32, 32), batch_size=32)


def _tiny(**overrides):
    config = mjx.get_config()
    config.update(TINY)
    config.agent.update(TINY_AGENT)
    config.update(overrides)
    return config


def _run_cli(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "experiments.sac", "--config=mjx", "--noprogress", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, MUJOCO_GL="egl"),
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(env="mjx:cartpole-swing"), r"Unknown MJX task 'cartpole-swing'; valid names: \[.*'cartpole-swingup'"),
        (dict(env="playground:dog-run"), "Unknown MJX task 'dog-run'"),
        (dict(env="gym:cartpole"), r"runs 'brax:<env>' and 'mjx:<domain>-<task>' environments, got 'gym:cartpole'"),
        (dict(pixels=True), "states only"),
        (dict(total_steps=258), r"total_steps \(258\) must be a multiple of brax_num_envs \(4\)"),
    ],
)
def test_bad_mjx_run_configs_fail_before_any_compute(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        sac_brax_loop.train(_tiny(**overrides), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_config_and_the_playground_alias():
    config = mjx.get_config()
    assert config.env == "mjx:cartpole-swingup" and config.brax_num_envs == 1 and config.updates_per_step == 1
    assert config.agent.policy == "fp16" and config.agent.methods.hadam and config.agent.methods.loss_scaling
    config.env = "playground:cartpole-swingup"
    settings = sac_brax_loop.settings_of(config, sac_brax_loop.validate(config))
    assert settings.env == "playground:cartpole-swingup" and settings.backend is None
    assert (
        sac_brax_loop.make_env(settings.env, settings.backend, settings.action_repeat).playground_name
        == "CartpoleSwingup"
    )


def test_cli_rejects_an_unknown_task_in_one_line(tmp_path):
    result = _run_cli("--config.env=mjx:cartpole-up", f"--run_dir={tmp_path / 'run'}", timeout=300)
    assert result.returncode != 0 and "Unknown MJX task 'cartpole-up'; valid names: [" in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "Unknown MJX task" in line]
    assert len(error_lines) == 1 and "'walker-walk'" in error_lines[0]  # the valid names on the same line
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def _filled(leaves):
    """Arrays like the abstract ``leaves``, each with its own values (PRNG keys too)."""
    rng = np.random.default_rng(0)
    filled = []
    for leaf in leaves:
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data_shape = jax.random.key_data(jax.random.key(0)).shape
            filled.append(jax.random.wrap_key_data(rng.integers(0, 2**32, leaf.shape + data_shape, np.uint32)))
        else:
            filled.append(jnp.asarray(rng.integers(0, 100, leaf.shape).astype(leaf.dtype)))
    return filled


def test_checkpoints_leave_out_zero_size_arrays_and_the_restore_rebuilds_them(tmp_path):
    config = _tiny()
    settings = sac_brax_loop.settings_of(config, sac_brax_loop.validate(config))
    abstract = sac_brax_loop.abstract_loop(settings)  # shapes only: nothing is compiled
    leaves, treedef = jax.tree.flatten(abstract)
    assert any(leaf.size == 0 for leaf in leaves)  # MJX's Data: e.g. no contacts, tendons or sensors in cartpole
    loop = jax.tree.unflatten(treedef, _filled(leaves))
    stored = sac_brax_loop.storable(loop)
    assert len(jax.tree.leaves(stored)) == sum(leaf.size > 0 for leaf in leaves)
    with Checkpointer(tmp_path) as checkpointer:
        checkpointer.save(128, stored)
        restored = sac_brax_loop.restore_loop(checkpointer, 128, settings)
    assert jax.tree.structure(restored) == treedef
    for original, back in zip(leaves, jax.tree.leaves(restored)):
        assert (back.shape, back.dtype) == (original.shape, original.dtype)
    for original, back in zip(jax.tree.leaves(loop), jax.tree.leaves(restored)):
        if jax.dtypes.issubdtype(original.dtype, jax.dtypes.prng_key):
            original, back = jax.random.key_data(original), jax.random.key_data(back)
        np.testing.assert_array_equal(np.asarray(back), np.asarray(original))


def _leaves(state):
    return [
        np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
        for x in jax.tree.leaves(state)
    ]


@pytest.mark.slow
def test_tiny_cli_run_learns_and_a_resumed_run_matches_it_bit_for_bit(tmp_path):
    cli_dir = tmp_path / "cli"
    overrides = [f"--config.{k}={v}" for k, v in TINY.items()] + [
        f"--config.agent.{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in TINY_AGENT.items()
    ]
    result = _run_cli(*overrides, f"--run_dir={cli_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["status"] == "finished" and summary["env_steps"] == 256
    assert summary["env_steps_per_s"] > 0 and summary["updates_per_s"] > 0
    # Cartpole rewards lie in [0, 1] per control step, so a 1000-step evaluation episode returns in [0, 1000].
    metrics = read_metrics(cli_dir)
    evals = metrics["eval/return"][np.isfinite(metrics["eval/return"])]
    assert len(evals) == 2 and np.all((evals >= 0) & (evals <= 1000)) and summary["final_eval"]["return"] == evals[-1]
    losses = metrics["train/critic_loss"][np.isfinite(metrics["train/critic_loss"])]
    assert len(losses) == 2 and np.all(np.isfinite(losses))  # both chunks learned (after the 64 seed steps)
    assert (cli_dir / "learning_curve.png").stat().st_size > 0

    # The same run in this process, in two parts: 128 steps, then resumed to 256.
    parts = tmp_path / "parts"
    assert sac_brax_loop.train(_tiny(total_steps=128), parts, progress=False)["env_steps"] == 128
    assert sac_brax_loop.train(_tiny(), parts, resume=True, progress=False)["env_steps"] == 256
    settings = sac_brax_loop.settings_of(_tiny(), sac_brax_loop.validate(_tiny()))
    final = []
    for run in (cli_dir, parts):
        with Checkpointer(run / "checkpoints") as checkpointer:
            assert checkpointer.all_steps() == [128, 256]
            final.append(_leaves(sac_brax_loop.restore_loop(checkpointer, 256, settings)))
    assert len(final[0]) == len(final[1]) > 100
    for a, b in zip(*final):
        np.testing.assert_array_equal(a, b)


def test_the_host_loop_refuses_mjx_configs():
    from experiments import sac_loop

    with pytest.raises(ValueError, match="runs in the jitted loop"):
        sac_loop.validate(_tiny())
