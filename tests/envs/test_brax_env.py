"""lpjax.envs.brax_env: names and errors, jit/vmap/scan rollouts, truncation, auto-reset, action repeat."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import envs
from lpjax.envs import BraxEnv


def _rollout(env: BraxEnv, num_envs: int, num_steps: int, scale: float = 1.0, clipped_twins: bool = False):
    """Batched reset + ``lax.scan`` of random actions (times ``scale``) under one ``jit``; per-step records.

    With ``clipped_twins`` the batch is doubled: env ``num_envs + i`` starts like env ``i`` and gets its actions
    clipped to [-1, 1] beforehand.
    """

    @jax.jit
    def run(key):
        reset_key, action_key = jax.random.split(key)
        reset_keys = jax.random.split(reset_key, num_envs)
        if clipped_twins:
            reset_keys = jnp.concatenate([reset_keys, reset_keys])
        state = jax.vmap(env.reset)(reset_keys)

        def body(state, key):
            action = scale * jax.random.uniform(key, (num_envs, env.action_size), minval=-1.0, maxval=1.0)
            if clipped_twins:
                action = jnp.concatenate([action, jnp.clip(action, -1.0, 1.0)])
            state = jax.vmap(env.step)(state, action)
            record = {
                "obs": BraxEnv.obs(state),
                "final_obs": BraxEnv.final_obs(state),
                "reward": BraxEnv.reward(state),
                "done": BraxEnv.done(state),
                "truncation": BraxEnv.truncation(state),
                "terminated": BraxEnv.terminated(state),
                "steps": state.info["steps"],
            }
            return state, record

        _, records = jax.lax.scan(body, state, jax.random.split(action_key, num_steps))
        return BraxEnv.obs(state), records

    return jax.tree.map(np.asarray, run(jax.random.key(0)))


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("halfcheetah", {}, "prefix in \\['dmc', 'brax', 'mjx', 'playground'\\]"),
        ("brax:half_cheetah", {}, "valid names: .*'halfcheetah'"),
        ("brax:fast", {}, "valid names"),
        ("brax:halfcheetah", {"backend": "mujoco"}, r"valid backends: \['spring', 'positional', 'gen"),
        ("brax:halfcheetah", {"pixels": True}, "dm_control envs only"),
        ("brax:halfcheetah", {"episode_length": 0}, "episode_length"),
        ("brax:halfcheetah", {"action_repeat": 0}, "action_repeat"),
    ],
)
def test_bad_names_and_arguments(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        envs.make(name, seed=0, **kwargs)


def test_make_brax_validates_too():
    with pytest.raises(ValueError, match="valid names"):
        envs.make_brax("cheetah")
    with pytest.raises(ValueError, match="valid backends"):
        envs.make_brax("halfcheetah", backend="fast")


def test_registry_matches_brax():
    from brax import envs as brax_envs

    assert set(envs.BRAX_ENVS) == set(brax_envs._envs) - {"fast"}


@pytest.mark.slow
def test_halfcheetah_rollout_under_jit_vmap_scan():
    env = envs.make("brax:halfcheetah", seed=0, episode_length=3)
    assert env.backend == envs.DEFAULT_BRAX_BACKEND == "spring"
    assert env.observation_shape == (17,) and env.action_dim == 6
    first_obs, rec = _rollout(env, num_envs=4, num_steps=7)
    assert first_obs.shape == (4, 17) and rec["obs"].shape == (7, 4, 17)
    assert np.all(np.isfinite(rec["obs"])) and np.all(np.isfinite(rec["reward"]))
    assert np.any(rec["reward"] != 0.0)
    # The time limit: done and truncation at agent steps 3 and 6 of every env, never a termination.
    expected = np.array([0, 0, 1, 0, 0, 1, 0], np.float32)[:, None] * np.ones(4, np.float32)
    np.testing.assert_array_equal(rec["truncation"], expected)
    np.testing.assert_array_equal(rec["done"], expected)
    np.testing.assert_array_equal(rec["terminated"], np.zeros_like(expected))
    np.testing.assert_array_equal(rec["steps"], np.array([1, 2, 3, 1, 2, 3, 1])[:, None] * np.ones(4))
    # Auto-reset: at an episode end obs is the next episode's first one (brax resets to the first initial state);
    # final_obs keeps the ended episode's last observation, and equals obs on every other step.
    for t in (2, 5):
        np.testing.assert_array_equal(rec["obs"][t], first_obs)
        assert not np.allclose(rec["final_obs"][t], rec["obs"][t])
    for t in (0, 1, 3, 4, 6):
        np.testing.assert_array_equal(rec["final_obs"][t], rec["obs"][t])


def test_action_repeat_and_clipping():
    env = envs.make_brax("inverted_pendulum", episode_length=2, action_repeat=3)
    _, rec = _rollout(env, num_envs=2, num_steps=3, scale=10.0, clipped_twins=True)
    np.testing.assert_array_equal(rec["steps"][:, 0], [3, 6, 3])  # physics-env steps: 3 per agent step
    np.testing.assert_array_equal(rec["done"][:, 0], [0, 1, 0])
    np.testing.assert_array_equal(rec["truncation"][:, 0] + rec["terminated"][:, 0], rec["done"][:, 0])
    assert np.all(np.isfinite(rec["obs"]))
    # Actions up to +-10 act like their clipped versions (the twins in the second half of the batch).
    for key in ("obs", "final_obs", "reward"):
        np.testing.assert_array_equal(rec[key][:, :2], rec[key][:, 2:])


def test_env_built_inside_a_trace_holds_no_tracers():
    built = []

    @jax.jit
    def f(key):
        env = envs.make("brax:inverted_pendulum", seed=0)
        built.append(env)
        return env.obs(env.reset(key))

    f(jax.random.key(0))
    leaves = jax.tree.leaves(built[0].env.sys)
    assert leaves and not any(isinstance(x, jax.core.Tracer) for x in leaves)
