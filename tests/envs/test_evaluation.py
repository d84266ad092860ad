"""lpjax.envs.evaluate_policy: seeded episodes, mean/std of returns, non-finite actions refused."""

import numpy as np
import pytest

from lpjax.envs import NonFiniteAction, evaluate_policy


class CountingEnv:
    """Episode of ``length`` steps; the reward is the action's first entry plus the reset seed."""

    def __init__(self, length=3):
        self.length, self.seeds = length, []

    def reset(self, seed=None):
        self.seeds.append(seed)
        self.t, self.seed = 0, seed
        return np.zeros(2, np.float32)

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), float(action[0]) + self.seed, False, self.t >= self.length


def test_returns_mean_and_std_over_seeded_episodes():
    env = CountingEnv()
    result = evaluate_policy(lambda obs: np.array([0.5]), env, episodes=2, seed_offset=10)
    assert env.seeds == [10, 11]
    returns = [3 * (0.5 + 10), 3 * (0.5 + 11)]
    assert result == pytest.approx({"return": np.mean(returns), "return_std": np.std(returns)})


def test_non_finite_actions_raise():
    with pytest.raises(NonFiniteAction):
        evaluate_policy(lambda obs: np.array([np.nan]), CountingEnv(), episodes=1)
    with pytest.raises(ValueError, match="episodes"):
        evaluate_policy(lambda obs: np.array([0.0]), CountingEnv(), episodes=0)
