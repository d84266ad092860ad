"""An ActorQ actor: a dm_control environment, a (quantized) copy of the policy, Gaussian exploration, n-step
transitions, and a pull of the latest policy every ``pull_every`` environment steps.

An actor is plain Python (numpy on the host). A backend runs it in-process or as a Ray actor process; the
backend gives it ``fetch``, the function that pulls ``(version, blob)`` from the parameter server. Each call of
:meth:`ActorWorker.collect` runs ``num_steps`` environment steps and returns their n-step transitions, the
returns of the episodes that ended, and where the time went, split as in the ActorQ papers:

* ``env``: environment steps; ``inference``: the policy's forward pass and the exploration noise;
* ``pull``: fetching the blob from the parameter server (over Ray: transfer and Ray's own deserialization);
* ``deserialize``: unpacking the blob into int8 codes and scales (or floats);
* ``load``: building the inference runtime from them (e.g. ONNX Runtime's prepacked int8 weights).

Episodes are seeded ``seed * 1_000_003 + 7919 * index + 104_729 * incarnation + episode``, so a restarted actor
(``incarnation + 1``) does not replay the episodes of the actor it replaces.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import numpy as np

import lpjax.envs
from lpjax.distributed.broadcast import build_policy, decode_policy
from lpjax.inference import check_runtime
from lpjax.nstep import NStepAccumulator

TIMING_KEYS = ("env", "inference", "pull", "deserialize", "load")


@dataclasses.dataclass(frozen=True)
class ActorSpec:
    """Everything an actor process needs to start (picklable, so Ray can ship it).

    Attributes:
      index: actor id in ``[0, num_actors)``.
      env: a ``dmc:<domain>-<task>`` name for :func:`lpjax.envs.make`.
      seed: the run's seed.
      sigma: standard deviation of the Gaussian exploration noise (ActorQ: spread over [0, 0.2] by index).
      n_step, gamma: n-step return horizon and discount.
      pull_every: environment steps between two pulls of the policy (``K``; ActorQ: 1000).
      runtime: the policy runtime (:func:`lpjax.inference.check_runtime`): ``"int8"`` (lpjax's int8 weights on ONNX
        Runtime's int8 GEMMs) or ``"fp32"`` (JAX); must match the broadcast scheme. Checked when the spec is made:
        an unknown name raises ``ValueError``, a runtime whose package is not installed a one-line ``ImportError``
        with the install command.
    """

    index: int
    env: str
    seed: int
    sigma: float
    n_step: int = 5
    gamma: float = 0.99
    pull_every: int = 1000
    runtime: str = "int8"

    def __post_init__(self):
        if self.pull_every < 1:
            raise ValueError(f"pull_every must be >= 1 environment step, got {self.pull_every}.")
        if self.sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma}.")
        check_runtime(self.runtime)


def exploration_sigmas(num_actors: int, max_sigma: float = 0.2) -> list[float]:
    """ActorQ's per-actor exploration: sigmas spread uniformly over ``[0, max_sigma]`` (the midpoint for one)."""
    if num_actors < 1:
        raise ValueError(f"num_actors must be >= 1, got {num_actors}.")
    if num_actors == 1:
        return [max_sigma / 2]
    return [float(s) for s in np.linspace(0.0, max_sigma, num_actors)]


@dataclasses.dataclass
class ActorResult:
    """What one :meth:`ActorWorker.collect` call returns to the learner."""

    index: int
    incarnation: int
    transitions: dict[str, np.ndarray] | None
    episode_returns: list[float]
    env_steps: int
    timings: dict[str, float]
    pulls: int
    policy_version: int

    @property
    def num_transitions(self) -> int:
        return 0 if self.transitions is None else len(self.transitions["reward"])


class ActorWorker:
    """Runs one environment with the latest pulled policy; see the module docstring."""

    def __init__(self, spec: ActorSpec, fetch: Callable[[], tuple[int, bytes]], incarnation: int = 0):
        self.spec, self.incarnation, self._fetch = spec, incarnation, fetch
        self._env = lpjax.envs.make(spec.env, seed=spec.seed + spec.index)
        self._rng = np.random.default_rng([spec.seed, spec.index, incarnation])
        self._nstep = NStepAccumulator(spec.n_step, spec.gamma)
        self._episode = 0
        self._obs: np.ndarray | None = None
        self._episode_return = 0.0
        self._steps_since_pull = 0
        self._version, self._policy = -1, None
        self.total_steps = 0

    @property
    def policy(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """The loaded policy runtime (the spec's ``runtime``), ``None`` before the first pull."""
        return self._policy

    def pid(self) -> int:
        """Process id of this actor (Ray tests kill it)."""
        return os.getpid()

    def _pull(self, timings: dict[str, float]) -> int:
        start = time.perf_counter()
        version, blob = self._fetch()
        pulled = time.perf_counter()
        timings["pull"] += pulled - start
        if version == self._version:
            return 0
        if version < 0:
            raise RuntimeError("the parameter server has no policy yet; publish one before starting actors.")
        decoded = decode_policy(blob)
        decoded_at = time.perf_counter()
        self._policy = build_policy(decoded, self.spec.runtime)
        timings["deserialize"] += decoded_at - pulled
        timings["load"] += time.perf_counter() - decoded_at
        self._version = version
        return 1

    def _reset(self) -> None:
        seed = self.spec.seed * 1_000_003 + 7919 * self.spec.index + 104_729 * self.incarnation + self._episode
        self._obs, self._episode_return = self._env.reset(seed=seed), 0.0

    def collect(self, num_steps: int) -> ActorResult:
        """Runs ``num_steps`` environment steps; pulls the policy first if none is loaded or K steps passed."""
        timings = dict.fromkeys(TIMING_KEYS, 0.0)
        pulls, transitions, returns = 0, [], []
        for _ in range(num_steps):
            if self._policy is None or self._steps_since_pull >= self.spec.pull_every:
                pulls += self._pull(timings)
                self._steps_since_pull = 0
            if self._obs is None:
                self._reset()
            start = time.perf_counter()
            action = np.asarray(self._policy(self._obs), np.float32).reshape(-1)
            action = np.clip(action + self.spec.sigma * self._rng.standard_normal(action.shape), -1.0, 1.0)
            stepped = time.perf_counter()
            next_obs, reward, terminated, truncated = self._env.step(action.astype(np.float32))
            timings["inference"] += stepped - start
            timings["env"] += time.perf_counter() - stepped
            transitions += self._nstep.add(
                self._obs, action, reward, 0.0 if terminated else 1.0, next_obs, episode_end=terminated or truncated
            )
            self._episode_return += float(reward)
            self._obs = next_obs
            if terminated or truncated:
                returns.append(self._episode_return)
                self._episode += 1
                self._obs = None
            self._steps_since_pull += 1
            self.total_steps += 1
        stacked = None if not transitions else {k: np.stack([t[k] for t in transitions]) for k in transitions[0]}
        return ActorResult(
            self.spec.index, self.incarnation, stacked, returns, num_steps, timings, pulls, self._version
        )
