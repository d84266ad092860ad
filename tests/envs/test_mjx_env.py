"""lpjax.envs.mjx_env: names and errors, the task table against dm_control and Playground, dm_control's time
conventions, and cartpole-swingup in MJX against dm_control (sizes, time limit, auto-reset, random-policy returns).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from lpjax import envs
from lpjax.envs import MjxEnv, dmc

RANDOM_EPISODES_MJX = 256  # one vmapped rollout: cheap once compiled
RANDOM_EPISODES_DMC = 16  # host-side, one Python call per step: most of the test's cost


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("mjx:cartpole-swing", {}, r"Unknown MJX task 'cartpole-swing'; valid names: \[.*'cartpole-swingup'"),
        ("playground:dog-run", {}, "Unknown MJX task 'dog-run'"),  # in dm_control, not in Playground
        ("mjx:CartpoleSwingup", {}, "Unknown MJX task"),  # Playground's own names are not accepted
        ("mjx:cartpole-swingup", {"backend": "spring"}, "applies to brax envs only"),
        ("mjx:cartpole-swingup", {"pixels": True}, "dm_control envs only"),
        ("mjx:cartpole-swingup", {"action_repeat": 0}, "action_repeat must be a positive integer"),
        ("mjx:cartpole-swingup", {"episode_length": 0}, "episode_length must be a positive integer"),
    ],
)
def test_bad_names_and_arguments(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        envs.make(name, seed=0, **kwargs)


def test_task_table_matches_dm_control_and_playground():
    """Every Playground suite task, under its dm_control name, with dm_control's control step and time limit."""
    from mujoco_playground import dm_control_suite

    assert sorted(envs.MJX_TASKS.values()) == sorted(dm_control_suite.ALL_ENVS)
    suite = dmc._import_suite()
    for task_name, playground_name in envs.MJX_TASKS.items():
        domain, task = envs.parse_task(task_name)  # a dm_control name lpjax accepts
        config = dm_control_suite.get_default_config(playground_name)
        control_timestep = suite.load(domain, task).control_timestep()
        assert config.ctrl_dt == pytest.approx(control_timestep), task_name
        assert config.episode_length == 1000, task_name  # dm_control: 1000 control steps per episode


def test_episode_length_follows_dm_control():
    for repeat, expected in ((None, 1000), (8, 125), (3, 333)):
        mjx_env = envs.make("mjx:cartpole-swingup", seed=0, action_repeat=repeat)
        dmc_env = envs.make("dmc:cartpole-swingup", seed=0, action_repeat=repeat or 1)
        assert mjx_env.episode_length == dmc_env.episode_length == expected
        assert mjx_env.action_repeat == dmc_env.action_repeat == (repeat or 1)
    assert envs.make("playground:cartpole-swingup", seed=3, episode_length=7).episode_length == 7


@pytest.mark.parametrize("task", ["cartpole-swingup", "reacher-easy"])  # reacher: mujoco>=3.3's MjSpec API
def test_sizes_match_dm_control(task):
    mjx_env, dmc_env = envs.make(f"mjx:{task}", seed=0), envs.make(f"dmc:{task}", seed=0)
    assert isinstance(mjx_env, MjxEnv) and mjx_env.playground_name == envs.MJX_TASKS[task]
    assert mjx_env.observation_shape == dmc_env.observation_shape
    assert mjx_env.action_dim == dmc_env.action_dim
    assert (mjx_env.action_low, mjx_env.action_high) == (-1.0, 1.0)


@pytest.fixture(scope="module")
def cartpole_rollout():
    """Uniformly random actions in ``RANDOM_EPISODES_MJX`` MJX cartpole-swingups, one ``jit``: reset, then two
    steps past the 1000-step time limit. Per-step records, time first."""
    env = envs.make("mjx:cartpole-swingup", seed=0)

    @jax.jit
    def run(key):
        reset_key, action_key = jax.random.split(key)
        state = jax.vmap(env.reset)(jax.random.split(reset_key, RANDOM_EPISODES_MJX))

        def body(state, key):
            actions = jax.random.uniform(key, (RANDOM_EPISODES_MJX, env.action_dim), minval=-1.0, maxval=1.0)
            state = jax.vmap(env.step)(state, actions)
            return state, {
                "obs": env.obs(state),
                "final_obs": env.final_obs(state),
                "reward": env.reward(state),
                "done": env.done(state),
                "truncation": env.truncation(state),
                "terminated": env.terminated(state),
                "steps": state.info["steps"],
            }

        steps = jax.random.split(action_key, env.episode_length + 2)
        return env.obs(state), jax.lax.scan(body, state, steps)[1]

    first_obs, records = jax.tree.map(np.asarray, run(jax.random.key(0)))
    return env, first_obs, records


def test_time_limit_truncates_and_auto_resets(cartpole_rollout):
    env, first_obs, rec = cartpole_rollout
    n, t_end = RANDOM_EPISODES_MJX, env.episode_length - 1  # index of the 1000th step
    assert rec["obs"].shape == (env.episode_length + 2, n, 5) and np.all(np.isfinite(rec["obs"]))
    expected_done = np.zeros((env.episode_length + 2, n), np.float32)
    expected_done[t_end] = 1.0
    np.testing.assert_array_equal(rec["done"], expected_done)  # the time limit only: no NaN physics
    np.testing.assert_array_equal(rec["truncation"], expected_done)
    np.testing.assert_array_equal(rec["terminated"], 0.0)
    np.testing.assert_array_equal(
        rec["steps"][[0, t_end, t_end + 1, t_end + 2]], np.broadcast_to(np.array([[1], [1000], [1], [2]]), (4, n))
    )
    # The 1000th step reports the ended episode's last observation in final_obs and the next episode's first one
    # (the env's first initial state) in obs; on every other step the two are equal.
    np.testing.assert_array_equal(rec["obs"][t_end], first_obs)
    assert np.all(np.any(rec["final_obs"][t_end] != first_obs, axis=-1))
    others = np.arange(env.episode_length + 2) != t_end
    np.testing.assert_array_equal(rec["final_obs"][others], rec["obs"][others])
    assert np.all((rec["reward"] >= 0.0) & (rec["reward"] <= 1.0))  # dm_control's tolerance rewards


def _dmc_random_returns(episodes: int) -> np.ndarray:
    returns = []
    rng = np.random.default_rng(0)
    for seed in range(episodes):
        env = envs.make("dmc:cartpole-swingup", seed=seed)
        env.reset()
        total, truncated = 0.0, False
        for action in rng.uniform(-1.0, 1.0, (env.episode_length, env.action_dim)).astype(np.float32):
            _, reward, terminated, truncated = env.step(action)
            assert not terminated
            total += reward
        assert truncated
        returns.append(total)
    return np.array(returns)


@pytest.mark.filterwarnings("ignore::DeprecationWarning:dm_control.mujoco.index")  # one per dm_control step
@pytest.mark.parametrize("dmc_episodes", [RANDOM_EPISODES_DMC, pytest.param(128, marks=pytest.mark.slow)])
def test_random_policy_returns_match_dm_control(cartpole_rollout, dmc_episodes):
    """Mean returns of uniformly random actions agree within 4 standard errors of their difference.

    The physics differ in detail (MJX's Euler step against dm_control's RK4, see :mod:`lpjax.envs.mjx_env`), so
    single trajectories do not match; the return distributions do. The bound is computed from the samples' own
    spread, and every random draw is seeded, so the test is deterministic. The default tier's few dm_control
    episodes catch gross errors (a reward or time scale off by 2x); the slow tier's 128 tighten the bound ~3-fold.
    """
    env, _, rec = cartpole_rollout
    mjx_returns = rec["reward"][: env.episode_length].sum(axis=0, dtype=np.float64)
    dmc_returns = _dmc_random_returns(dmc_episodes)
    standard_error = np.sqrt(mjx_returns.var(ddof=1) / mjx_returns.size + dmc_returns.var(ddof=1) / dmc_returns.size)
    assert abs(mjx_returns.mean() - dmc_returns.mean()) <= 4.0 * standard_error, (
        mjx_returns.mean(),
        dmc_returns.mean(),
        standard_error,
    )
    # Both sample the same kind of episode: the pole mostly hangs or swings (returns far below the 1000 maximum).
    for returns in (mjx_returns, dmc_returns):
        assert returns.min() > 0.0 and returns.max() < 250.0


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(envs.MJX_TASKS))
def test_every_task_builds_with_dm_control_sizes(task):
    mjx_env, dmc_env = envs.make(f"mjx:{task}", seed=0), envs.make(f"dmc:{task}", seed=0)
    assert mjx_env.observation_shape == dmc_env.observation_shape, task
    assert mjx_env.action_dim == dmc_env.action_dim, task
