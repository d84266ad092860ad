"""n-step transitions, built on the host (numpy) from one environment's steps, as Acme's n-step adder.

Feed :meth:`NStepAccumulator.add` the steps ``(s_t, a_t, r_t, d_t, s_{t+1})`` of one environment in order, where
``d_t`` is the environment's discount (1 while the episode goes on, 0 at a terminal state). The transition that
starts at step ``t`` and spans ``m`` steps is

    obs      = s_t
    action   = a_t
    reward   = sum_{k=0}^{m-1} gamma^k (prod_{j<k} d_{t+j}) r_{t+k}
    discount = gamma^m prod_{k=0}^{m-1} d_{t+k}                     (the bootstrap multiplier)
    next_obs = s_{t+m}

so that ``reward + discount * V(next_obs)`` is the n-step target (the learner adds no ``gamma`` of its own).
``m = n`` inside an episode. When the episode ends after step ``T`` (``episode_end=True``), the steps still
pending (the last ``n - 1`` or fewer, ``t > T - n``) are flushed with their shorter horizon ``m = T + 1 - t``,
``next_obs = s_{T+1}``:

* at a terminal (``d_T = 0``) their ``discount`` is 0: no bootstrap;
* at a time-limit truncation (``d_T = 1``, the episode is merely cut) their ``discount`` is ``gamma^m``: they
  bootstrap from the last observation, as pytorch_sac does (the time limit is not part of the state).

Transitions are emitted as soon as they are complete, oldest first; none spans two episodes. Every emitted
transition is a dict of float32 numpy arrays: ``obs``, ``action``, ``next_obs`` (copies of what was fed) and
scalar ``reward``, ``discount``. Sums are accumulated in float64.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np


@dataclasses.dataclass
class _Pending:
    """A transition still collecting rewards: ``reward`` so far and the ``multiplier`` of the next reward."""

    obs: np.ndarray
    action: np.ndarray
    reward: float
    multiplier: float


class NStepAccumulator:
    """Turns one environment's steps into n-step transitions (see the module docstring for the exact sums).

    Example, ``n = 2``, ``gamma = 0.9``, an episode of three steps cut by a time limit::

        acc = NStepAccumulator(n=2, gamma=0.9)
        acc.add(s0, a0, 1.0, 1.0, s1)                    # []: waits for a second reward
        acc.add(s1, a1, 2.0, 1.0, s2)                    # [s0 -> s2: reward 1 + 0.9 * 2, discount 0.81]
        acc.add(s2, a2, 3.0, 1.0, s3, episode_end=True)  # [s1 -> s3: 2 + 0.9 * 3, 0.81; s2 -> s3: 3, 0.9]

    Args:
      n: the horizon, ``>= 1`` (``n = 1``: one-step transitions ``(s, a, r, gamma d, s')``).
      gamma: the discount factor, in ``[0, 1]``.
    """

    def __init__(self, n: int, gamma: float):
        if int(n) != n or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n}.")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}.")
        self.n, self.gamma = int(n), float(gamma)
        self._pending: collections.deque[_Pending] = collections.deque()

    def __len__(self) -> int:
        """Number of steps fed whose transitions are not emitted yet (at most ``n - 1`` between calls)."""
        return len(self._pending)

    def add(self, obs, action, reward, discount, next_obs, episode_end: bool = False) -> list[dict[str, np.ndarray]]:
        """Feeds one environment step; returns the transitions it completes (possibly none), oldest first.

        Args:
          obs: the observation ``s_t`` the action was taken in.
          action: ``a_t``.
          reward: ``r_t``.
          discount: the environment's discount ``d_t``: 1 (or any value in (0, 1]) while the episode continues,
            0 if ``next_obs`` is a terminal state.
          next_obs: ``s_{t+1}``.
          episode_end: the episode ends with this step (terminal or truncated by a time limit): every pending
            transition is emitted, and the next call starts a new episode. A terminal step should set it too;
            if it does not, the pending transitions still get ``discount`` 0, just later.

        Raises:
          ValueError: for a discount outside ``[0, 1]``.
        """
        reward, discount = float(reward), float(discount)
        if not 0.0 <= discount <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got {discount}.")
        for pending in self._pending:
            pending.reward += pending.multiplier * reward
            pending.multiplier *= self.gamma * discount
        self._pending.append(
            _Pending(np.array(obs, np.float32), np.array(action, np.float32), reward, self.gamma * discount)
        )
        done = [self._pending.popleft()] if len(self._pending) == self.n else []
        if episode_end:
            done += self._pending
            self._pending.clear()
        next_obs = np.asarray(next_obs, np.float32)
        return [
            {
                "obs": p.obs,
                "action": p.action,
                "reward": np.asarray(p.reward, np.float32),
                "discount": np.asarray(p.multiplier, np.float32),
                "next_obs": next_obs.copy(),
            }
            for p in done
        ]

    def reset(self) -> None:
        """Drops the pending steps without emitting them (e.g. when an episode is abandoned mid-way)."""
        self._pending.clear()
