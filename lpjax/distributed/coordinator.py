"""The actor-learner loop of ActorQ: one learner, N actors, a rate limiter and a parameter server.

:class:`ActorLearner` drives a backend (in-process or Ray, :mod:`lpjax.distributed.backends`) and a learner
(anything with ``insert(transitions)``, ``update() -> metrics`` and ``policy_blob() -> bytes``):

1. it publishes the learner's packed policy (version 0) and gives every actor a job of ``chunk_steps``
   environment steps; actors pull the policy themselves every ``pull_every`` steps;
2. whenever an actor returns, its transitions go into the learner's replay buffer and it gets its next job, as
   long as the samples-per-insert limiter allows more inserts;
3. the learner updates whenever the limiter allows a sample, and re-publishes its policy every
   ``publish_every`` updates (the parameter quantizer: :func:`lpjax.distributed.broadcast.encode_policy`);
4. an actor that fails (a crashed process) is logged, restarted and given a new job; the learner keeps going.

It measures what the ActorQ papers report: actor steps/s per actor, learner updates/s, broadcast bytes, and each
actor's time split into env / inference / pull / deserialize / load.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from lpjax.distributed.actor import TIMING_KEYS, ActorResult
from lpjax.distributed.backends import ActorFailure
from lpjax.distributed.rate_limiter import SamplesPerInsertLimiter


class Learner(Protocol):
    """What :class:`ActorLearner` needs from a learner."""

    def insert(self, transitions: dict[str, np.ndarray]) -> None: ...

    def update(self) -> dict[str, Any]: ...

    def policy_blob(self) -> bytes: ...


@dataclasses.dataclass
class Counters:
    """The coordinator's progress, checkpointed with the learner."""

    env_steps: int = 0
    updates: int = 0
    inserts: int = 0
    samples: int = 0
    restarts: int = 0
    episodes: int = 0
    policy_version: int = 0
    wall_seconds: float = 0.0  # training wall-clock time, kept across resumes by the experiment loop


class ActorLearner:
    """See the module docstring.

    Args:
      backend: an :class:`~lpjax.distributed.backends.InProcessBackend` or ``RayBackend``.
      learner: the learner (see :class:`Learner`).
      limiter: the samples-per-insert limiter (its counters are part of :class:`Counters`).
      chunk_steps: environment steps per actor job.
      publish_every: learner updates between two publishes of the policy.
      log: called with a message for restarts and other events (default: print).
    """

    def __init__(
        self,
        backend: Any,
        learner: Learner,
        limiter: SamplesPerInsertLimiter,
        *,
        chunk_steps: int = 100,
        publish_every: int = 100,
        log: Callable[[str], None] = print,
    ):
        if chunk_steps < 1 or publish_every < 1:
            raise ValueError(f"chunk_steps and publish_every must be >= 1, got {chunk_steps}, {publish_every}.")
        num_actors = len(backend.specs)
        needed = (limiter.batch_size + limiter.samples_per_insert * chunk_steps) / 2
        if limiter.error_buffer < needed:
            raise ValueError(
                f"error_buffer {limiter.error_buffer} is too small for chunks of {chunk_steps} steps: "
                f"with less than (batch_size + samples_per_insert * chunk_steps) / 2 = {needed:g} "
                "neither an insert nor an update could fit the ratio."
            )
        self.backend, self.learner, self.limiter = backend, learner, limiter
        self.chunk_steps, self.publish_every, self.log = chunk_steps, publish_every, log
        self.counters = Counters()
        self.restart_log: list[dict[str, Any]] = []
        self.actor_stats = [
            {"env_steps": 0, "jobs": 0, "pulls": 0, **dict.fromkeys(TIMING_KEYS, 0.0)} for _ in range(num_actors)
        ]
        self.update_seconds = 0.0
        self.broadcast_bytes = 0
        self.episode_returns: list[tuple[int, float]] = []  # (env_steps when reported, return)
        self._idle = set(range(num_actors))
        self._started = False

    def restore(self, counters: Counters) -> None:
        """Continues from checkpointed counters (before :meth:`run`)."""
        self.counters = dataclasses.replace(counters)
        self.limiter.inserts, self.limiter.samples = counters.inserts, counters.samples

    def _publish(self) -> None:
        blob = self.learner.policy_blob()
        self.backend.publish(self.counters.updates, blob)
        self.counters.policy_version = self.counters.updates
        self.broadcast_bytes = len(blob)

    def _feed_idle(self) -> None:
        for index in sorted(self._idle):
            if not self.limiter.can_insert(self.chunk_steps):
                return
            self.backend.submit(index, self.chunk_steps)
            self._idle.discard(index)

    def _handle(self, index: int, outcome: ActorResult | ActorFailure) -> None:
        if isinstance(outcome, ActorFailure):
            self.counters.restarts += 1
            self.restart_log.append(
                {
                    "env_steps": self.counters.env_steps,
                    "actor": index,
                    "incarnation": outcome.incarnation,
                    "error": outcome.error,
                }
            )
            self.log(f"actor {index} (incarnation {outcome.incarnation}) failed: {outcome.error}; restarting it")
            self.backend.restart(index)
        else:
            if outcome.transitions is not None:
                self.learner.insert(outcome.transitions)
                self.limiter.record_insert(outcome.num_transitions)
            self.counters.env_steps += outcome.env_steps
            self.counters.episodes += len(outcome.episode_returns)
            self.episode_returns += [(self.counters.env_steps, r) for r in outcome.episode_returns]
            stats = self.actor_stats[index]
            stats["env_steps"] += outcome.env_steps
            stats["jobs"] += 1
            stats["pulls"] += outcome.pulls
            for key in TIMING_KEYS:
                stats[key] += outcome.timings[key]
        self._idle.add(index)

    def run(
        self,
        until_env_steps: int,
        on_update: Callable[[dict[str, Any]], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Counters:
        """Runs until ``until_env_steps`` environment steps were inserted (or ``stop()`` is true); returns the
        counters. ``on_update`` gets each update's metrics (with ``updates`` and ``env_steps`` added)."""
        if not self._started:
            self._publish()
            self._started = True
        while self.counters.env_steps < until_env_steps and not (stop and stop()):
            self._feed_idle()
            updated = False
            if self.limiter.can_update():
                start = time.perf_counter()
                metrics = self.learner.update()
                self.update_seconds += time.perf_counter() - start
                self.limiter.record_update()
                self.counters.updates += 1
                updated = True
                if self.counters.updates % self.publish_every == 0:
                    self._publish()
                if on_update is not None:
                    on_update(dict(metrics, updates=self.counters.updates, env_steps=self.counters.env_steps))
            if not self.backend.pending and not updated:
                raise RuntimeError(
                    "actor-learner stalled: no actor job in flight and no update allowed "
                    f"(limiter credit {self.limiter.credit:g})."
                )
            for index, outcome in self.backend.wait(timeout=0 if updated else None):
                self._handle(index, outcome)
            self.counters.inserts, self.counters.samples = self.limiter.inserts, self.limiter.samples
        return self.counters

    def drain(self) -> None:
        """Collects the jobs still in flight (their data goes into the replay buffer), so nothing is left behind."""
        while self.backend.pending:
            for index, outcome in self.backend.wait(timeout=None):
                self._handle(index, outcome)
        self.counters.inserts, self.counters.samples = self.limiter.inserts, self.limiter.samples

    def throughput(self, wall_seconds: float) -> dict[str, Any]:
        """Actor steps/s (each actor's steps over its own busy time), learner updates/s, the time split."""
        per_actor = []
        for stats in self.actor_stats:
            busy = sum(stats[k] for k in TIMING_KEYS)
            per_actor.append(
                {
                    "env_steps": stats["env_steps"],
                    "pulls": stats["pulls"],
                    "steps_per_s": stats["env_steps"] / busy if busy else 0.0,
                    "time_split": {k: stats[k] for k in TIMING_KEYS},
                }
            )
        return {
            "actors": per_actor,
            "learner_updates_per_s": self.counters.updates / self.update_seconds if self.update_seconds else 0.0,
            "updates_per_wall_s": self.counters.updates / wall_seconds if wall_seconds else 0.0,
            "env_steps_per_wall_s": self.counters.env_steps / wall_seconds if wall_seconds else 0.0,
            "broadcast_bytes": self.broadcast_bytes,
            "server": self.backend.server_stats(),
            "restarts": self.counters.restarts,
        }
