"""NStepAccumulator: hand-computed n-step sums and bootstrap multipliers at terminals and time-limit truncations."""

import numpy as np
import pytest

from lpjax.nstep import NStepAccumulator

GAMMA = 0.9


def _obs(t):
    return np.full(3, t, np.float64)


def _run(n, rewards, discounts, episode_end_at=None):
    acc = NStepAccumulator(n, GAMMA)
    out = []
    for t, (r, d) in enumerate(zip(rewards, discounts)):
        out.append(acc.add(_obs(t), [t, -t], r, d, _obs(t + 1), episode_end=t == episode_end_at))
    return acc, out


def _check(transition, obs_t, next_t, reward, discount):
    np.testing.assert_array_equal(transition["obs"], _obs(obs_t))
    np.testing.assert_array_equal(transition["action"], [obs_t, -obs_t])
    np.testing.assert_array_equal(transition["next_obs"], _obs(next_t))
    np.testing.assert_allclose(transition["reward"], reward, rtol=1e-6)
    np.testing.assert_allclose(transition["discount"], discount, rtol=1e-6)


def test_three_steps_with_n2_inside_an_episode():
    acc, out = _run(2, [1.0, 2.0, 3.0], [1.0, 1.0, 1.0])
    assert [len(o) for o in out] == [0, 1, 1] and len(acc) == 1
    _check(out[1][0], 0, 2, 1 + 0.9 * 2, 0.81)
    _check(out[2][0], 1, 3, 2 + 0.9 * 3, 0.81)
    for transition in out[1] + out[2]:
        assert set(transition) == {"obs", "action", "reward", "discount", "next_obs"}
        assert all(v.dtype == np.float32 for v in transition.values())
        assert transition["reward"].shape == () and transition["discount"].shape == ()


def test_truncation_flushes_shorter_horizons_that_bootstrap():
    acc, out = _run(2, [1.0, 2.0, 3.0], [1.0, 1.0, 1.0], episode_end_at=2)
    assert [len(o) for o in out] == [0, 1, 2] and len(acc) == 0
    _check(out[2][0], 1, 3, 2 + 0.9 * 3, 0.81)
    _check(out[2][1], 2, 3, 3.0, 0.9)  # one step left: discount gamma, bootstrap from s3


def test_terminal_flushes_with_zero_discount():
    acc, out = _run(3, [1.0, 2.0, 3.0], [1.0, 1.0, 0.0], episode_end_at=2)
    assert [len(o) for o in out] == [0, 0, 3] and len(acc) == 0
    _check(out[2][0], 0, 3, 1 + 0.9 * 2 + 0.81 * 3, 0.0)
    _check(out[2][1], 1, 3, 2 + 0.9 * 3, 0.0)
    _check(out[2][2], 2, 3, 3.0, 0.0)


def test_a_new_episode_starts_clean_and_n1_is_the_one_step_transition():
    acc = NStepAccumulator(2, GAMMA)
    acc.add(_obs(0), [0, 0], 1.0, 1.0, _obs(1), episode_end=True)
    first = acc.add(_obs(10), [10, -10], 5.0, 1.0, _obs(11))
    assert first == []  # nothing of the previous episode is mixed in
    (second,) = acc.add(_obs(11), [11, -11], 7.0, 1.0, _obs(12))
    _check(second, 10, 12, 5 + 0.9 * 7, 0.81)
    one = NStepAccumulator(1, GAMMA)
    (t,) = one.add(_obs(0), [0, 0], 2.0, 1.0, _obs(1))
    _check(t, 0, 1, 2.0, 0.9)


def test_terminal_without_episode_end_still_cuts_the_bootstrap_and_later_rewards():
    acc = NStepAccumulator(3, GAMMA)
    acc.add(_obs(0), [0, 0], 1.0, 0.0, _obs(1))  # terminal, not flagged
    acc.add(_obs(1), [1, -1], 100.0, 1.0, _obs(2))
    (t,) = acc.add(_obs(2), [2, -2], 100.0, 1.0, _obs(3))
    _check(t, 0, 3, 1.0, 0.0)


def test_fed_arrays_are_copied_and_reset_drops_pending():
    acc = NStepAccumulator(2, GAMMA)
    obs = np.zeros(3)
    acc.add(obs, [0, 0], 1.0, 1.0, np.ones(3))
    obs += 5  # an environment reusing its buffer must not change what was recorded
    (t,) = acc.add(np.ones(3), [0, 0], 1.0, 1.0, np.ones(3))
    np.testing.assert_array_equal(t["obs"], np.zeros(3))
    acc.add(np.ones(3), [0, 0], 1.0, 1.0, np.ones(3))
    acc.reset()
    assert len(acc) == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n=0, gamma=0.9), "n must be"),
        (dict(n=2.5, gamma=0.9), "n must be"),
        (dict(n=2, gamma=1.5), "gamma"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NStepAccumulator(**kwargs)
    with pytest.raises(ValueError, match="discount must be in"):
        NStepAccumulator(2, 0.9).add(np.zeros(1), [0], 0.0, 2.0, np.zeros(1))
