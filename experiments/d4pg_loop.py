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
import tqdm

import lpjax.envs
from lpjax.agents import d4pg
from lpjax.checkpoint import open_run_checkpoints
from lpjax.distributed import (ActorLearner, ActorSpec, Counters, SamplesPerInsertLimiter, encode_policy,
                               exploration_sigmas, make_backend)
from lpjax.distributed.backends import BACKENDS
from lpjax.inference import RUNTIMES
from lpjax.replay import ReplayBuffer, replay_add, replay_init, replay_sample
from lpjax.run_logging import RunLogger, plot_run_curve



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
        (config.min_replay_size >= agent.batch_size,
         f"min_replay_size ({config.min_replay_size}) must be >= batch_size ({agent.batch_size})"),
        (config.replay_capacity >= config.min_replay_size,
         f"replay_capacity ({config.replay_capacity}) must be >= min_replay_size ({config.min_replay_size})"),
        (config.actor_runtime in RUNTIMES, f"actor_runtime must be one of {RUNTIMES}, got {config.actor_runtime!r}"),
        (config.backend in BACKENDS, f"backend must be one of {sorted(BACKENDS)}, got {config.backend!r}"),
        (0.0 <= config.max_sigma, f"max_sigma must be >= 0, got {config.max_sigma}"),
        (config.eval_every >= 1 and config.eval_episodes >= 1 and config.checkpoint_every >= 1,
         "eval_every, eval_episodes and checkpoint_every must be >= 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(f"D4PG run config: {message}.")
    return agent


@functools.partial(jax.jit, donate_argnums=(0,))
def _insert(replay: ReplayBuffer, transitions: dict) -> ReplayBuffer:
    return replay_add(replay, transitions)


@functools.partial(jax.jit, donate_argnums=(0,))
def _learn(state: LearnerState) -> tuple[LearnerState, dict]:
    key, batch_key = jax.random.split(state.key)
    batch = replay_sample(state.replay, batch_key, state.agent.config.batch_size)
    agent, metrics = d4pg.update(state.agent, batch)
    return LearnerState(agent, state.replay, key), metrics


class D4PGLearner:
    """The learner side of :class:`lpjax.distributed.ActorLearner` for D4PG."""

    def __init__(self, state: LearnerState, runtime: str):
        self.state, self.runtime = state, runtime

    def insert(self, transitions: dict[str, np.ndarray]) -> None:
        self.state = self.state._replace(replay=_insert(self.state.replay, transitions))

    def update(self) -> dict[str, Any]:
        self.state, metrics = _learn(self.state)
        return metrics

    def policy_blob(self) -> bytes:
        return encode_policy(self.state.agent.actor.params, self.runtime)


def _example_transition(obs: np.ndarray, action_dim: int) -> dict[str, np.ndarray]:
    obs = np.asarray(obs, np.float32)
    return {"obs": obs, "action": np.zeros(action_dim, np.float32), "reward": np.float32(0.0),
            "discount": np.float32(0.0), "next_obs": obs}


def init_learner(config: ml_collections.ConfigDict, agent_config: d4pg.D4PGConfig, env) -> LearnerState:
    """A fresh learner: D4PG state for ``env``'s observation and action sizes, an empty replay buffer, a key."""
    obs = env.reset(seed=config.seed)
    key, init_key = jax.random.split(jax.random.key(config.seed))
    agent = d4pg.init(init_key, jnp.asarray(obs, jnp.float32), env.action_dim, agent_config)
    return LearnerState(agent, replay_init(_example_transition(obs, env.action_dim), config.replay_capacity), key)


def restore_learner(run_dir: str | pathlib.Path) -> tuple[ml_collections.ConfigDict, LearnerState]:
    """The config and the latest checkpointed learner of a finished or interrupted run (for analysis)."""
    run_dir = pathlib.Path(run_dir)
    config = ml_collections.ConfigDict(json.loads((run_dir / "config.json").read_text()))
    checkpointer, latest = open_run_checkpoints(run_dir, resume=True, save_replay=config.save_replay)
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
    return lpjax.envs.evaluate_policy(lambda obs: apply(params, jnp.asarray(obs, jnp.float32)[None])[0], env,
                                      episodes)


def _error_buffer(config: ml_collections.ConfigDict, batch_size: int) -> float:
    """The limiter's tolerance: the configured one, or room for every actor's chunk in flight plus a batch."""
    if config.rate_error_buffer > 0:
        return float(config.rate_error_buffer)
    return float(batch_size + config.samples_per_insert * config.chunk_steps * config.num_actors)


def train(config: ml_collections.ConfigDict, run_dir: pathlib.Path, resume: bool = False,
          progress: bool = True) -> dict[str, Any]:
    """Runs (or resumes) ActorQ D4PG; returns a summary (final evaluation, throughput, paths).

    Raises:
      ValueError: bad config, an unreachable Ray address, or ``run_dir`` holding checkpoints without ``resume``.
    """
    agent_config = validate(config)
    run_dir = pathlib.Path(run_dir)
    checkpointer, latest = open_run_checkpoints(run_dir, resume, config.save_replay)
    env = lpjax.envs.make(config.env, seed=config.seed)
    eval_env = lpjax.envs.make(config.env, seed=config.seed + lpjax.envs.EVAL_SEED_OFFSET)
    state = init_learner(config, agent_config, env)
    counters = Counters()
    logger = RunLogger(run_dir, config=config)
    if resume and latest is not None:
        state, metadata = checkpointer.restore(latest, target=state)
        counters = Counters(**metadata["counters"])
        logger.truncate_after(counters.env_steps)
        print(f"resumed {run_dir} at {counters.env_steps} env steps ({counters.updates} updates)")

    specs = [ActorSpec(i, config.env, config.seed + 1000 * counters.restarts, sigma, agent_config.n_step,
                       agent_config.gamma, config.pull_every, config.actor_runtime)
             for i, sigma in enumerate(exploration_sigmas(config.num_actors, config.max_sigma))]
    limiter = SamplesPerInsertLimiter(config.samples_per_insert, agent_config.batch_size, config.min_replay_size,
                                      _error_buffer(config, agent_config.batch_size))
    learner = D4PGLearner(state, config.actor_runtime)
    bar = tqdm.tqdm(total=config.total_env_steps, initial=counters.env_steps, disable=not progress, unit="step",
                    dynamic_ncols=True)
    backend = make_backend(config.backend, specs, address=config.ray_address or None)
    coordinator = ActorLearner(backend, learner, limiter, chunk_steps=config.chunk_steps,
                               publish_every=config.publish_every, log=tqdm.tqdm.write)
    coordinator.restore(counters)
    started, last_step, reported = time.perf_counter(), counters.env_steps, 0
    final: dict[str, float] = {}

    def on_update(metrics: dict[str, Any]) -> None:
        if metrics["updates"] % config.log_every == 0:
            values = {k: float(v) for k, v in metrics.items() if k not in ("updates", "env_steps")}
            elapsed = time.perf_counter() - started
            values.update(updates=metrics["updates"], updates_per_s=coordinator.counters.updates / elapsed,
                          restarts=coordinator.counters.restarts)
            logger.log(metrics["env_steps"], values, prefix="train")

    next_eval = (counters.env_steps // config.eval_every + 1) * config.eval_every
    next_checkpoint = (counters.env_steps // config.checkpoint_every + 1) * config.checkpoint_every
    try:
        while coordinator.counters.env_steps < config.total_env_steps:
            coordinator.run(min(config.total_env_steps, next_eval, next_checkpoint), on_update=on_update)
            step = coordinator.counters.env_steps
            for at, episode_return in coordinator.episode_returns[reported:]:
                logger.log(at, {"episode_return": episode_return}, prefix="train")
            reported = len(coordinator.episode_returns)
            bar.update(step - last_step)
            last_step = step
            bar.set_postfix(updates=coordinator.counters.updates, restarts=coordinator.counters.restarts,
                            refresh=False)
            done = step >= config.total_env_steps
            coordinator.counters.wall_seconds = counters.wall_seconds + time.perf_counter() - started
            if done or step >= next_eval:
                final = evaluate(learner.state.agent, eval_env, config.eval_episodes)
                logger.log(step, dict(final, wall_s=coordinator.counters.wall_seconds,
                                      updates=coordinator.counters.updates), prefix="eval")
                tqdm.tqdm.write(f"step {step}: eval return {final['return']:.1f} ± {final['return_std']:.1f} "
                                f"({coordinator.counters.updates} updates)")
                next_eval = (step // config.eval_every + 1) * config.eval_every
            if done or step >= next_checkpoint:
                saved = learner.state if config.save_replay else learner.state._replace(replay=None)
                checkpointer.save(step, saved, metadata={"config": config.to_dict(),
                                                         "counters": dataclasses.asdict(coordinator.counters)})
                next_checkpoint = (step // config.checkpoint_every + 1) * config.checkpoint_every
        throughput = coordinator.throughput(time.perf_counter() - started)  # before the backend shuts down
        throughput["restart_log"] = coordinator.restart_log
        (run_dir / "actor_learner.json").write_text(json.dumps(throughput, indent=2) + "\n")
    finally:
        bar.close()
        backend.shutdown()
        checkpointer.wait()
        logger.close()
    return {"status": "finished", "env_steps": coordinator.counters.env_steps,
            "updates": coordinator.counters.updates, "final_eval": final, "restarts": coordinator.counters.restarts,
            "run_dir": str(run_dir),
            "curve": plot_run_curve(run_dir, f"D4PG ({config.actor_runtime} actors) on {config.env}",
                                    ("eval/return", "train/episode_return"))}
