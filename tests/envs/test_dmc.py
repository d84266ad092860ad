"""lpjax.envs.dmc: names and errors, observations (states and pixels), action repeat, episode ends, seeding."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lpjax import envs
from lpjax.envs import dmc

PAPER_TASKS = ["cartpole-swingup", "reacher-easy", "cheetah-run", "finger-spin", "ball_in_cup-catch", "walker-walk"]


def _raw_env(domain, task, seed):
    suite = dmc._import_suite()
    return suite.load(domain, task, task_kwargs={"random": seed})


def _flat(observation):
    return np.concatenate([np.asarray(v, np.float32).ravel() for v in observation.values()])


# -- names and arguments: errors come before dm_control is touched ---------------------------------------------


@pytest.fixture
def no_dm_control(monkeypatch):
    def fail():
        raise AssertionError("dm_control was imported before the arguments were validated")

    monkeypatch.setattr(dmc, "_import_suite", fail)


def test_parse_task():
    assert dmc.parse_task("cheetah-run") == ("cheetah", "run")
    assert dmc.parse_task("ball_in_cup-catch") == ("ball_in_cup", "catch")
    assert dmc.parse_task("humanoid-run_pure_state") == ("humanoid", "run_pure_state")


@pytest.mark.parametrize(
    "name, match",
    [
        ("cheetah-run", "prefix in \\['dmc', 'brax', 'mjx', 'playground'\\]"),  # no prefix
        ("gym:cheetah-run", "prefix in \\['dmc', 'brax', 'mjx', 'playground'\\]"),
        ("dmc:cheetah_run", "'<domain>-<task>'"),
        ("dmc:cheetah-", "'<domain>-<task>'"),
        ("dmc:ballincup-catch", "valid domains: .*'ball_in_cup'"),
        ("dmc:lqr-lqr_2_1", "valid domains"),  # unbounded actions: not offered
        ("dmc:cheetah-walk", "valid tasks: \\['run'\\]"),
        ("dmc:walker-jump", "valid tasks: \\['stand', 'walk', 'run'\\]"),
    ],
)
def test_bad_names_list_valid_choices(no_dm_control, name, match):
    with pytest.raises(ValueError, match=match):
        envs.make(name, seed=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"seed": 0, "action_repeat": 0}, "action_repeat"),
        ({"seed": 0, "episode_length": 0}, "episode_length"),
        ({"seed": 0, "pixels": True, "frame_stack": 0}, "frame_stack"),
        ({"seed": 0, "pixels": True, "image_size": 0}, "image_size"),
        ({"seed": 0, "backend": "spring"}, "brax envs only"),
    ],
)
def test_bad_arguments(no_dm_control, kwargs, match):
    with pytest.raises(ValueError, match=match):
        envs.make("dmc:cheetah-run", **kwargs)


def test_default_action_repeat_is_table_8_for_pixels():
    assert [envs.default_action_repeat(t, pixels=True) for t in PAPER_TASKS] == [8, 4, 4, 2, 4, 2]
    assert envs.default_action_repeat("hopper-hop", pixels=True) == 2
    assert all(envs.default_action_repeat(t, pixels=False) == 1 for t in PAPER_TASKS)


def test_default_gl_backend():
    assert dmc.default_gl_backend(lambda lib: f"lib{lib}.so") == "egl"
    assert dmc.default_gl_backend(lambda lib: "libOSMesa.so" if lib == "OSMesa" else None) == "osmesa"
    assert dmc.default_gl_backend(lambda lib: None) is None


def test_task_table_matches_dm_control():
    suite = dmc._import_suite()

    installed = {(d, t) for d, t in suite.ALL_TASKS if d != "lqr"}
    assert {(d, t) for d, tasks in envs.DMC_TASKS.items() for t in tasks} == installed


# -- states -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", PAPER_TASKS)
def test_state_observations(task):
    env = envs.make(f"dmc:{task}", seed=0)
    assert env.observation_dtype == np.float32 and len(env.observation_shape) == 1
    assert env.action_repeat == 1 and env.episode_length == 1000
    np.testing.assert_array_equal(env.action_low, -np.ones(env.action_dim, np.float32))
    np.testing.assert_array_equal(env.action_high, np.ones(env.action_dim, np.float32))
    obs = env.reset()
    assert obs.shape == env.observation_shape and obs.dtype == np.float32
    obs, reward, terminated, truncated = env.step(np.zeros(env.action_dim, np.float32))
    assert obs.shape == env.observation_shape and obs.dtype == np.float32 and np.all(np.isfinite(obs))
    assert type(reward) is float and type(terminated) is bool and type(truncated) is bool
    assert not terminated and not truncated


def test_action_repeat_sums_rewards_like_a_manual_loop():
    env = envs.make("dmc:walker-walk", seed=3, action_repeat=3)
    raw = _raw_env("walker", "walk", 3)
    np.testing.assert_array_equal(env.reset(), _flat(raw.reset().observation))
    rng = np.random.default_rng(0)
    for _ in range(5):
        action = rng.uniform(-1, 1, env.action_dim)
        obs, reward, _, _ = env.step(action)
        expected = 0.0
        for _ in range(3):
            time_step = raw.step(action)
            expected += time_step.reward
        assert expected > 0.0
        assert reward == pytest.approx(expected, rel=1e-12)
        np.testing.assert_array_equal(obs, _flat(time_step.observation))
    assert env.episode_length == 1000 // 3


def test_truncation_at_episode_end_and_reset_required():
    env = envs.make("dmc:cheetah-run", seed=0, action_repeat=2, episode_length=5)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(env.action_dim))
    for _ in range(2):  # two episodes
        env.reset()
        flags = [env.step(np.zeros(env.action_dim))[2:] for _ in range(5)]
        assert flags == [(False, False)] * 4 + [(False, True)]
        with pytest.raises(RuntimeError, match="reset"):
            env.step(np.zeros(env.action_dim))


def test_episodes_may_outlast_dm_controls_time_limit():
    env = envs.make("dmc:cartpole-swingup", seed=0, episode_length=1001)
    env.reset()
    truncated = [env.step(np.zeros(1))[3] for _ in range(1001)]
    assert not any(truncated[:-1]) and truncated[-1]


def test_same_seed_same_observations_and_different_seeds_differ():
    rng = np.random.default_rng(1)
    actions = rng.uniform(-1, 1, (20, 6))
    runs = []
    for seed in (5, 5, 6):
        env = envs.make("dmc:cheetah-run", seed=seed, episode_length=10)
        trajectory = []
        for _ in range(2):  # successive episodes draw new initial states from the seeded random state
            trajectory.append(env.reset())
            for action in actions[:10]:
                obs, reward, _, _ = env.step(action)
                trajectory += [obs, np.float32(reward)]
        runs.append(np.concatenate([np.ravel(x) for x in trajectory]))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])


def test_action_validation_and_clipping():
    env, twin = (envs.make("dmc:cheetah-run", seed=0) for _ in range(2))
    env.reset()
    twin.reset()
    for bad, match in [
        (np.zeros(5), "shape \\(6,\\)"),
        (np.zeros((1, 6)), "shape \\(6,\\)"),
        (np.full(6, np.nan), "non-finite"),
        (np.array([0, 0, np.inf, 0, 0, 0]), "non-finite"),
        (["a"] * 6, "float array"),
    ]:
        with pytest.raises(ValueError, match=match):
            env.step(bad)
    big = np.array([5.0, -5.0, 0.5, 2.0, -1.5, 0.0])
    np.testing.assert_array_equal(env.step(big)[0], twin.step(np.clip(big, -1, 1))[0])


def test_non_unit_action_bounds_are_rescaled():
    env = envs.make("dmc:quadruped-walk", seed=0)
    spec = env.unwrapped.action_spec()
    raw_low, raw_high = np.asarray(spec.minimum), np.asarray(spec.maximum)
    assert not (np.all(raw_low == -1) and np.all(raw_high == 1))  # quadruped: [-1, 1.1] and [-0.8, 0.8]
    env.reset()
    middle = (raw_low + raw_high) / 2
    for action, expected in [(-np.ones(12), raw_low), (np.ones(12), raw_high), (np.zeros(12), middle)]:
        env.step(action)
        np.testing.assert_allclose(env.unwrapped.physics.data.ctrl, expected, atol=1e-12)


# -- pixels -----------------------------------------------------------------------------------------------------


def test_pixels_shapes_defaults_and_frame_stack_order():
    env = envs.make("dmc:cartpole-swingup", seed=0, pixels=True)
    assert env.observation_shape == (84, 84, 9) and env.observation_dtype == np.uint8
    assert env.action_repeat == 8 and env.episode_length == 125 and env.camera_id == 0
    obs0 = env.reset()
    assert obs0.shape == (84, 84, 9) and obs0.dtype == np.uint8
    np.testing.assert_array_equal(obs0[..., 0:3], obs0[..., 6:9])  # the stack starts as copies of frame 0
    np.testing.assert_array_equal(obs0[..., 6:9], env.render())
    obs1, *_ = env.step(np.ones(1))
    obs2, *_ = env.step(-np.ones(1))
    np.testing.assert_array_equal(obs2[..., 6:9], env.render())  # newest frame last
    np.testing.assert_array_equal(obs2[..., 0:6], obs1[..., 3:9])  # older frames shift towards the front
    np.testing.assert_array_equal(obs1[..., 0:6], obs0[..., 3:9])
    assert not np.array_equal(obs1[..., 6:9], obs0[..., 6:9])  # the cart moved


def test_pixels_options_and_determinism():
    first, second = (envs.make("dmc:reacher-easy", seed=2, pixels=True, frame_stack=2, image_size=32) for _ in range(2))
    assert first.observation_shape == (32, 32, 6) and first.action_repeat == 4
    action = np.array([0.3, -0.7])
    np.testing.assert_array_equal(first.reset(), second.reset())
    for _ in range(2):
        obs, reward, _, _ = first.step(action)
        obs_twin, reward_twin, _, _ = second.step(action)
        assert obs.shape == (32, 32, 6)
        np.testing.assert_array_equal(obs, obs_twin)
        assert reward == reward_twin


def test_egl_failure_falls_back_and_states_still_work():
    # A missing EGL device makes dm_control's EGL import fail; states must still work and pixels give a clear error.
    script = textwrap.dedent(
        """
        import warnings
        import numpy as np
        from lpjax import envs
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env = envs.make("dmc:cheetah-run", seed=0)
        assert any("MUJOCO_GL='egl'" in str(w.message) for w in caught), [str(w.message) for w in caught]
        assert env.reset().shape == (17,)
        try:
            envs.make("dmc:cheetah-run", seed=0, pixels=True)
        except RuntimeError as err:
            assert "libosmesa6" in str(err), err
        print("ok")
        """
    )
    env = dict(os.environ, MUJOCO_GL="egl", MUJOCO_EGL_DEVICE_ID="99", JAX_PLATFORMS="cpu")
    env.pop("PYOPENGL_PLATFORM", None)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_reset_with_a_seed_makes_the_episode_depend_on_that_seed_alone():
    a = envs.make("dmc:cartpole-swingup", seed=1)
    b = envs.make("dmc:cartpole-swingup", seed=2)
    b.reset()
    b.step(np.ones(b.action_dim))  # b's history differs from a's
    np.testing.assert_array_equal(a.reset(seed=7), b.reset(seed=7))
    assert not np.array_equal(a.reset(seed=7), a.reset(seed=8))
