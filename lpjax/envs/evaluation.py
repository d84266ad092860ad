"""Evaluation of a policy on a host-side environment: mean and spread of the return over seeded episodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

EVAL_SEED_OFFSET = 10_000_019
"""Evaluation episode ``i`` resets with seed ``EVAL_SEED_OFFSET + i`` (disjoint from training seeds)."""


class NonFiniteAction(RuntimeError):
    """The policy produced a non-finite action (typically a diverged low-precision run)."""


def evaluate_policy(
    policy: Callable[[np.ndarray], Any], env: Any, episodes: int, seed_offset: int = EVAL_SEED_OFFSET
) -> dict[str, float]:
    """Runs ``episodes`` episodes of ``policy(obs) -> action`` and returns ``{"return", "return_std"}``.

    Episode ``i`` resets ``env`` with seed ``seed_offset + i``, so every evaluation sees the same episodes.

    Raises:
      NonFiniteAction: when an action is not finite (the episode cannot be stepped).
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}.")
    returns = []
    for i in range(episodes):
        obs, total, done = env.reset(seed=seed_offset + i), 0.0, False
        while not done:
            action = np.asarray(policy(obs), np.float32).reshape(-1)
            if not np.all(np.isfinite(action)):
                raise NonFiniteAction("the policy produced non-finite actions during evaluation")
            obs, reward, terminated, truncated = env.step(action)
            total += reward
            done = terminated or truncated
        returns.append(total)
    return {"return": float(np.mean(returns)), "return_std": float(np.std(returns))}
