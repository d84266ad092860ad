"""ActorQ's actor-learner training of D4PG on dm_control: one learner, N actors with a quantized policy.

The learner (this process) holds the D4PG state and the replay buffer, and runs one jitted
``sample -> update`` per step allowed by the samples-per-insert limiter. Actors (Ray processes, or in-process
for tests) step their own environments with an int8 (or fp32) copy of the policy, pulled every ``pull_every``
steps from the parameter server, and hand n-step transitions back in chunks. See :mod:`lpjax.distributed`.

Evaluations run the learner's fp32 policy deterministically on seeded episodes. Checkpoints hold the whole
learner (D4PG state, replay buffer, PRNG key) and the coordinator's counters; ``--resume`` continues from the
latest. Actors are stateless between chunks, so a resumed run restarts them; the steps of jobs that were in
flight at the checkpoint are the only data lost. Actor-learner runs are not bit-reproducible (the order in which
actors report depends on timing), unlike the single-process SAC loop.

On a mesh (``config.mesh``, see :mod:`lpjax.sharding`) the learner is data parallel like SAC's: the D4PG state is
replicated (split over ``"fsdp"`` with ``mesh.fsdp > 1``), the replay buffer's ``config.replay_shards`` strata
(default: the device count) are spread over the devices, and each device samples and trains on its share of every
batch. The actors are unchanged: they pull the policy from the parameter server and hand their chunks to the
learner, which inserts them into the sharded buffer. The run stays in one process (several are refused): the
actors report to it in an order set by timing, which other processes could not follow.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import lpjax.envs
from experiments.devices import REPLAY_SHARDS_METADATA, check_state_layout, learner_mesh, replay_strata
from experiments.run import RunSpec, check_config, check_resumable, run
from lpjax.agents import d4pg
from lpjax.checkpoint import Checkpointer
from lpjax.distributed import (
    ActorLearner,
    ActorSpec,
    Counters,
    SamplesPerInsertLimiter,
    encode_policy,
    exploration_sigmas,
    make_backend,
)
from lpjax.distributed.backends import BACKENDS
from lpjax.inference import RUNTIMES
from lpjax.replay import ReplayBuffer, replay_add, replay_init
from lpjax.sharding import DispatchWindow, constrain, place, put_replicated, sample_replay


class LearnerState(NamedTuple):
    """What the learner carries, checkpointed whole (the coordinator's counters go in the metadata)."""

    agent: d4pg.D4PGState
    replay: ReplayBuffer | None
    key: jax.Array


def validate(config: ml_collections.ConfigDict) -> d4pg.D4PGConfig:
    """Checks the run config before any compute; returns the agent config. Raises ``ValueError``."""
    agent = d4pg.D4PGConfig.from_mapping(config.agent)
    if not config.env.startswith("dmc:"):
        raise ValueError(f"ActorQ actors run dm_control tasks: env must be 'dmc:<domain>-<task>', got {config.env!r}.")
    lpjax.envs.parse_task(config.env.removeprefix("dmc:"))
    checks = [
        (config.num_actors >= 1, f"num_actors must be >= 1, got {config.num_actors}"),
        (config.pull_every >= 1, f"pull_every must be >= 1 actor step, got {config.pull_every}"),
        (config.chunk_steps >= 1 and config.publish_every >= 1, "chunk_steps and publish_every must be >= 1"),
        (config.total_env_steps >= 1, f"total_env_steps must be >= 1, got {config.total_env_steps}"),
        (config.samples_per_insert > 0, f"samples_per_insert must be > 0, got {config.samples_per_insert}"),
        (
            config.min_replay_size >= agent.batch_size,
            f"min_replay_size ({config.min_replay_size}) must be >= batch_size ({agent.batch_size})",
        ),
        (
            config.replay_capacity >= config.min_replay_size,
            f"replay_capacity ({config.replay_capacity}) must be >= min_replay_size ({config.min_replay_size})",
        ),
        (config.actor_runtime in RUNTIMES, f"actor_runtime must be one of {RUNTIMES}, got {config.actor_runtime!r}"),
        (config.backend in BACKENDS, f"backend must be one of {sorted(BACKENDS)}, got {config.backend!r}"),
        (config.max_sigma >= 0.0, f"max_sigma must be >= 0, got {config.max_sigma}"),
        (config.eval_episodes >= 1 and config.log_every >= 1, "eval_episodes and log_every must be >= 1"),
    ]
    check_config("D4PG run", checks)
    check_state_layout(config, agent)
    return agent


@functools.partial(jax.jit, donate_argnums=(0,), static_argnames=("strata", "mesh"))
def _insert(replay: ReplayBuffer, transitions: dict, strata: int, mesh: jax.sharding.Mesh | None) -> ReplayBuffer:
    return constrain(replay_add(replay, transitions, strata), mesh)


@functools.partial(jax.jit, donate_argnums=(0,), static_argnames=("strata", "mesh"))
def _learn(state: LearnerState, strata: int, mesh: jax.sharding.Mesh | None) -> tuple[LearnerState, dict]:
    key, batch_key = jax.random.split(state.key)
    batch = sample_replay(state.replay, batch_key, state.agent.config.batch_size, strata, mesh)
    agent, metrics = d4pg.update(state.agent, batch)
    return constrain(LearnerState(agent, state.replay, key), mesh), metrics


class D4PGLearner:
    """The learner side of :class:`lpjax.distributed.ActorLearner` for D4PG, on one device (``mesh=None``) or
    data parallel on ``mesh`` with a replay buffer of ``strata`` strata (:func:`lpjax.sharding.sample_replay`).
    A state given on one device is placed on the mesh. The coordinator calls :meth:`update` without reading its
    metrics (except every ``log_every``), so on a mesh a :class:`lpjax.sharding.DispatchWindow` keeps the host
    at most 8 updates ahead of the devices."""

    def __init__(self, state: LearnerState, runtime: str, strata: int = 1, mesh: jax.sharding.Mesh | None = None):
        self.runtime, self.strata, self.mesh = runtime, strata, mesh
        self.state = place(state, mesh)
        self.window = DispatchWindow() if mesh is not None else None

    def insert(self, transitions: dict[str, np.ndarray]) -> None:
        transitions = put_replicated(transitions, self.mesh)
        self.state = self.state._replace(replay=_insert(self.state.replay, transitions, self.strata, self.mesh))

    def update(self) -> dict[str, Any]:
        self.state, metrics = _learn(self.state, self.strata, self.mesh)
        if self.window is not None:
            self.window.push(metrics)
        return metrics

    def policy_blob(self) -> bytes:
        return encode_policy(self.state.agent.actor.params, self.runtime)


def example_transition(obs: np.ndarray, action_dim: int) -> dict[str, np.ndarray]:
    """One transition as the off-policy learners store it (float32), shaped like ``obs`` and ``action_dim``."""
    obs = np.asarray(obs, np.float32)
    return {
        "obs": obs,
        "action": np.zeros(action_dim, np.float32),
        "reward": np.float32(0.0),
        "discount": np.float32(0.0),
        "next_obs": obs,
    }


def init_learner(config: ml_collections.ConfigDict, agent_config: d4pg.D4PGConfig, env) -> LearnerState:
    """A fresh learner: D4PG state for ``env``'s observation and action sizes, an empty replay buffer, a key."""
    obs = env.reset(seed=config.seed)
    key, init_key = jax.random.split(jax.random.key(config.seed))
    agent = d4pg.init(init_key, jnp.asarray(obs, jnp.float32), env.action_dim, agent_config)
    return LearnerState(agent, replay_init(example_transition(obs, env.action_dim), config.replay_capacity), key)


def restore_learner(run_dir: str | pathlib.Path) -> tuple[ml_collections.ConfigDict, LearnerState]:
    """The config and the latest checkpointed learner of a finished or interrupted run (for analysis)."""
    run_dir = pathlib.Path(run_dir)
    config = ml_collections.ConfigDict(json.loads((run_dir / "config.json").read_text()))
    with Checkpointer(run_dir / "checkpoints") as checkpointer:
        latest = checkpointer.latest_step()
        if latest is None:
            raise ValueError(f"{run_dir} holds no checkpoint.")
        env = lpjax.envs.make(config.env, seed=config.seed)
        target = init_learner(config, d4pg.D4PGConfig.from_mapping(config.agent), env)
        if not config.save_replay:
            target = target._replace(replay=None)
        state, _ = checkpointer.restore(latest, target=target)
    return config, state


def evaluate(agent: d4pg.D4PGState, env, episodes: int) -> dict[str, float]:
    """Return of the learner's deterministic fp32 policy over seeded episodes."""
    network = d4pg.actor_network(agent.config, agent.action_dim)
    apply = jax.jit(network.apply)
    params = agent.actor.params
    return lpjax.envs.evaluate_policy(lambda obs: apply(params, jnp.asarray(obs, jnp.float32)[None])[0], env, episodes)


def _error_buffer(config: ml_collections.ConfigDict, batch_size: int) -> float:
    """The limiter's tolerance: the configured one, or room for every actor's chunk in flight plus a batch."""
    if config.rate_error_buffer > 0:
        return float(config.rate_error_buffer)
    return float(batch_size + config.samples_per_insert * config.chunk_steps * config.num_actors)


class ActorLearnerRun:
    """ActorQ's D4PG for :func:`experiments.run.run`: ``advance`` lets the coordinator run actors and learner
    until ``limit`` environment steps; checkpoints hold the learner and the coordinator's counters."""

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        agent_config: d4pg.D4PGConfig,
        run_dir: pathlib.Path,
        mesh: jax.sharding.Mesh | None = None,
    ):
        self.config, self.agent_config, self.run_dir = config, agent_config, run_dir
        env = lpjax.envs.make(config.env, seed=config.seed)
        self.eval_env = lpjax.envs.make(config.env, seed=config.seed + lpjax.envs.EVAL_SEED_OFFSET)
        strata = replay_strata(config, mesh, agent_config.batch_size)
        self.learner = D4PGLearner(init_learner(config, agent_config, env), config.actor_runtime, strata, mesh)
        self.counters = Counters()
        self.backend = self.coordinator = None
        self.reported, self.started = 0, time.perf_counter()

    @property
    def live_counters(self) -> Counters:
        """The coordinator's counters once the actors run, the restored (or fresh) ones before."""
        return self.coordinator.counters if self.coordinator is not None else self.counters

    def position(self) -> int:
        return self.live_counters.env_steps

    def start(self, context) -> None:
        self._start_actors(context)

    def restore(self, checkpointer: Checkpointer, step: int) -> None:
        state, metadata = checkpointer.restore(step, target=self.learner.state)  # onto this run's mesh
        self.learner.state, self.counters = state, Counters(**metadata["counters"])
        self.learner.strata = replay_strata(
            self.config, self.learner.mesh, self.agent_config.batch_size, metadata.get(REPLAY_SHARDS_METADATA, 1)
        )

    def _start_actors(self, context) -> None:
        config, agent_config, counters = self.config, self.agent_config, self.counters
        specs = [
            ActorSpec(
                i,
                config.env,
                config.seed + 1000 * counters.restarts,
                sigma,
                agent_config.n_step,
                agent_config.gamma,
                config.pull_every,
                config.actor_runtime,
            )
            for i, sigma in enumerate(exploration_sigmas(config.num_actors, config.max_sigma))
        ]
        limiter = SamplesPerInsertLimiter(
            config.samples_per_insert,
            agent_config.batch_size,
            config.min_replay_size,
            _error_buffer(config, agent_config.batch_size),
        )
        self.backend = make_backend(config.backend, specs, address=config.ray_address or None)
        self.coordinator = ActorLearner(
            self.backend,
            self.learner,
            limiter,
            chunk_steps=config.chunk_steps,
            publish_every=config.publish_every,
            log=context.write,
        )
        self.coordinator.restore(counters)
        self.started = time.perf_counter()

    def advance(self, limit: int, context) -> None:
        if self.coordinator is None:  # resumed
            self._start_actors(context)
        config, coordinator = self.config, self.coordinator

        def on_update(metrics: dict[str, Any]) -> None:
            if metrics["updates"] % config.log_every == 0:
                values = {k: float(v) for k, v in metrics.items() if k not in ("updates", "env_steps")}
                elapsed = time.perf_counter() - self.started
                values.update(
                    updates=metrics["updates"],
                    updates_per_s=coordinator.counters.updates / elapsed,
                    restarts=coordinator.counters.restarts,
                )
                context.logger.log(metrics["env_steps"], values, prefix="train")

        coordinator.run(limit, on_update=on_update)
        for at, episode_return in coordinator.episode_returns[self.reported :]:
            context.logger.log(at, {"episode_return": episode_return}, prefix="train")
        self.reported = len(coordinator.episode_returns)
        context.bar.set_postfix(
            updates=coordinator.counters.updates, restarts=coordinator.counters.restarts, refresh=False
        )
        coordinator.counters.wall_seconds = self.counters.wall_seconds + time.perf_counter() - self.started

    def evaluate(self) -> dict[str, float]:
        result = evaluate(self.learner.state.agent, self.eval_env, self.config.eval_episodes)
        return dict(result, wall_s=self.live_counters.wall_seconds, updates=self.live_counters.updates)

    def can_checkpoint(self) -> bool:
        return True

    def checkpoint(self) -> tuple[LearnerState, dict]:
        state = self.learner.state if self.config.save_replay else self.learner.state._replace(replay=None)
        return state, {"counters": dataclasses.asdict(self.live_counters), REPLAY_SHARDS_METADATA: self.learner.strata}

    def summary(self) -> dict[str, Any]:
        """``updates``, ``restarts``; writes ``actor_learner.json`` (throughput, time split, restarts)."""
        coordinator = self.coordinator
        if coordinator is not None:
            throughput = coordinator.throughput(time.perf_counter() - self.started)  # before the backend shuts down
            throughput["restart_log"] = coordinator.restart_log
            (self.run_dir / "actor_learner.json").write_text(json.dumps(throughput, indent=2) + "\n")
        return {"updates": self.live_counters.updates, "restarts": self.live_counters.restarts}

    def close(self) -> None:
        if self.backend is not None:
            self.backend.shutdown()


def train(
    config: ml_collections.ConfigDict, run_dir: pathlib.Path, resume: bool = False, progress: bool = True
) -> dict[str, Any]:
    """Runs (or resumes) ActorQ D4PG; returns the run summary (:func:`experiments.run.run`) with the learner's
    ``updates`` and the actors' ``restarts``; writes ``actor_learner.json``.

    Raises:
      ValueError: bad config, an unreachable Ray address, or ``run_dir`` holding checkpoints without ``resume``.
    """
    agent_config = validate(config)
    check_resumable("D4PG run", config, resume)
    mesh = learner_mesh(config)
    check_config(
        "D4PG run",
        [
            (
                jax.process_count() == 1,
                "the actors feed one learner process; run the learner on that process's devices (a mesh of its local "
                "devices) rather than across processes",
            )
        ],
    )
    if not resume:  # a resumed run's strata come from its checkpoint
        strata = replay_strata(config, mesh, agent_config.batch_size)
        check_config("D4PG run", [(config.min_replay_size >= strata, "min_replay_size must be >= replay_shards")])
    spec = RunSpec.of(
        config,
        "total_env_steps",
        kind="D4PG run",
        unit="env_steps",
        title=f"D4PG ({config.actor_runtime} actors) on {config.env}",
        curve=("eval/return", "train/episode_return"),
        files=("actor_learner.json",),
    )
    return run(
        config,
        run_dir,
        spec,
        lambda: ActorLearnerRun(config, agent_config, pathlib.Path(run_dir), mesh),
        resume=resume,
        progress=progress,
    )
