"""SAC's training loop on dm_control: host-side environment, one jitted call per environment step.

Everything the loop carries besides the environments is one pytree, :class:`LoopState`: the SAC state, the
replay buffer, the loop's PRNG key and its counters. It is checkpointed whole at episode ends, and episode
``i`` of a run resets its environment with seed ``seed * 1_000_003 + i``. Together these make a resumed run
bit-identical to an uninterrupted one: after a crash nothing is lost beyond the last checkpoint.

Per agent step: pick an action (uniformly random during ``seed_steps``, else a policy sample), step the
environment, then one jitted call adds the transition to the replay buffer and, after the seed steps, samples
batches and runs ``updates_per_step`` SAC updates. ``discount`` is 0 only at a true termination; time limits
bootstrap, as in pytorch_sac.

On a mesh (``config.mesh``, see :mod:`lpjax.sharding`) the learner is data parallel: the SAC state is replicated
(split over ``"fsdp"`` with ``mesh.fsdp > 1``), the replay buffer's strata (``config.replay_shards``, default the
device count) are spread over the devices, and each device samples and trains on its share of every batch. Every
process of a multi-process run steps the same environment and feeds the same transitions, so the learner is one
SPMD program; the result depends on ``replay_shards``, not on the mesh (to floating-point rounding).
"""

from __future__ import annotations

import functools
import json
import math
import pathlib
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import lpjax.envs
from experiments.configs.sac import _base
from experiments.devices import REPLAY_SHARDS_METADATA, check_state_layout, learner_mesh, replay_strata
from experiments.run import Diverged, Learner, RunSpec, check_config, check_resumable, run
from lpjax.agents import sac
from lpjax.checkpoint import Checkpointer
from lpjax.precision import dtype_of
from lpjax.replay import ReplayBuffer, replay_add, replay_cast, replay_init, with_float_dtype
from lpjax.run_logging import CONFIG_FILE
from lpjax.sharding import constrain, place, put_replicated, sample_replay

EPISODE_SEED_STRIDE = 1_000_003


class LoopState(NamedTuple):
    """What the training loop carries, checkpointed whole.

    Attributes:
      agent: the :class:`lpjax.agents.sac.SACState`.
      replay: the :class:`lpjax.replay.ReplayBuffer` of transitions.
      key: PRNG key of exploration (random seed-step actions and policy samples).
      env_steps: int32, agent steps taken.
      episodes: int32, episodes finished.
    """

    agent: sac.SACState
    replay: ReplayBuffer
    key: jax.Array
    env_steps: jax.Array
    episodes: jax.Array


def validate(config: ml_collections.ConfigDict) -> sac.SACConfig:
    """Checks the loop's settings and returns the agent's config; raises ``ValueError`` before any compute."""
    if lpjax.envs.is_jitted(config.env):
        raise ValueError(f"{config.env!r} runs in the jitted loop (experiments.sac_brax_loop), not the host loop.")
    prefix, _, task = config.env.partition(":")
    if prefix != "dmc":
        raise ValueError(
            "Environment names look like 'dmc:<domain>-<task>', 'mjx:<domain>-<task>' or 'brax:<env>', "
            f"got {config.env!r}."
        )
    lpjax.envs.parse_task(task)  # raises ValueError listing the valid tasks
    agent = sac.SACConfig.from_mapping(config.agent.to_dict())
    if config.get("replay_dtype") is not None:
        replay_dtype = dtype_of(config.replay_dtype)  # raises ValueError listing the valid names
        if not jnp.issubdtype(replay_dtype, jnp.floating) or replay_dtype.itemsize < 2:
            raise ValueError(f"SAC run: replay_dtype must be a 16- or 32-bit float, got {config.replay_dtype!r}.")
    checks = [
        (config.total_steps >= 1, "total_steps must be >= 1"),
        (
            0 <= config.seed_steps <= config.total_steps,
            f"seed_steps ({config.seed_steps}) must be in [0, total_steps ({config.total_steps})]",
        ),
        (config.replay_capacity >= 1, "replay_capacity must be >= 1"),
        (
            agent.batch_size <= config.replay_capacity,
            f"batch_size ({agent.batch_size}) is larger than the replay buffer ({config.replay_capacity})",
        ),
        (config.updates_per_step >= 1, "updates_per_step must be >= 1"),
        (config.eval_episodes >= 1 and config.log_every >= 1, "eval_episodes and log_every must be >= 1"),
        (config.pixels == agent.pixels, "config.pixels and config.agent.pixels must agree"),
        (config.action_repeat >= 0 and config.frame_stack >= 1, "action_repeat >= 0 and frame_stack >= 1"),
    ]
    check_config("SAC run", checks)
    check_state_layout(config, agent)
    return agent


def make_envs(config: ml_collections.ConfigDict):
    """The training and evaluation environments (evaluation episodes are seeded independently)."""
    options = dict(pixels=config.pixels, action_repeat=config.action_repeat or None)
    if config.pixels:
        options["frame_stack"] = config.frame_stack
    return (
        lpjax.envs.make(config.env, seed=config.seed, **options),
        lpjax.envs.make(config.env, seed=config.seed + lpjax.envs.EVAL_SEED_OFFSET, **options),
    )


def init_loop(config: ml_collections.ConfigDict, agent_config: sac.SACConfig, env) -> LoopState:
    key = jax.random.key(config.seed)
    agent_key, loop_key = jax.random.split(key)
    observation = jnp.zeros(env.observation_shape, env.observation_dtype)
    agent = sac.init(agent_key, observation, env.action_dim, agent_config)
    example = {
        "obs": observation,
        "action": jnp.zeros(env.action_dim, jnp.float32),
        "reward": jnp.zeros([], jnp.float32),
        "discount": jnp.zeros([], jnp.float32),
        "next_obs": observation,
    }
    if config.get("replay_dtype"):
        example = with_float_dtype(example, dtype_of(config.replay_dtype))
    return LoopState(
        agent=agent,
        replay=replay_init(example, config.replay_capacity),
        key=loop_key,
        env_steps=jnp.zeros([], jnp.int32),
        episodes=jnp.zeros([], jnp.int32),
    )


@functools.partial(jax.jit, static_argnames=("seed_steps", "action_dim"))
def choose_action(
    agent: sac.SACState, key: jax.Array, env_steps: jax.Array, obs: jax.Array, seed_steps: int, action_dim: int
) -> tuple[jax.Array, jax.Array]:
    """``(next_key, action)``: uniformly random during the seed steps, else a sample of the policy."""
    key, sample_key = jax.random.split(key)
    random_action = jax.random.uniform(sample_key, (action_dim,), jnp.float32, -1.0, 1.0)
    policy_action = sac.act(agent, obs[None], sample_key)[0]
    return key, jnp.where(env_steps < seed_steps, random_action, policy_action)


@functools.partial(jax.jit, static_argnames=("learn", "updates", "strata", "mesh"), donate_argnums=0)
def record_and_learn(
    loop: LoopState, transition: dict, learn: bool, updates: int, strata: int = 1, mesh: jax.sharding.Mesh | None = None
) -> tuple[LoopState, dict]:
    """Adds one transition; if ``learn``, runs ``updates`` SAC updates on uniformly sampled batches (stratified
    in ``strata``, each device sampling its own on a ``mesh``: :func:`lpjax.sharding.sample_replay`)."""
    transition = jax.tree.map(lambda x: x[None], transition)
    replay = replay_add(loop.replay, replay_cast(loop.replay, transition), strata)
    agent, metrics = loop.agent, {}
    key = loop.key
    for _ in range(updates if learn else 0):
        key, batch_key = jax.random.split(key)
        agent, metrics = sac.update(agent, sample_replay(replay, batch_key, agent.config.batch_size, strata, mesh))
    return constrain(LoopState(agent, replay, key, loop.env_steps + 1, loop.episodes), mesh), metrics


def evaluate(loop: LoopState, env, episodes: int) -> dict[str, float]:
    """Mean and standard deviation of the deterministic policy's return over seeded episodes."""

    def policy(obs):
        return sac.act(loop.agent, jnp.asarray(obs)[None], loop.key, deterministic=True)[0]

    try:
        return lpjax.envs.evaluate_policy(policy, env, episodes)
    except lpjax.envs.NonFiniteAction as error:
        raise Diverged(str(error)) from error


def run_spec(config: ml_collections.ConfigDict) -> RunSpec:
    """The run's :class:`experiments.run.RunSpec` (shared by the host and the jitted loop)."""
    return RunSpec.of(
        config,
        "total_steps",
        kind="SAC run",
        unit="env_steps",
        title=f"SAC {config.agent.policy} on {config.env}",
        curve=("eval/return", "train/episode_return", "train/critic_loss"),
        plot_nonfinite=("train/critic_loss",),
    )


class HostLearner(Learner):
    """SAC on a host-side dm_control environment, for :func:`experiments.run.run`.

    ``advance`` plays until the episode ends or the limit is reached (an episode may span several calls);
    checkpoints are taken between episodes, where :class:`LoopState` is everything the run carries.
    """

    def __init__(
        self, config: ml_collections.ConfigDict, agent_config: sac.SACConfig, mesh: jax.sharding.Mesh | None = None
    ):
        self.config, self.mesh = config, mesh
        self.strata = replay_strata(config, mesh, agent_config.batch_size)
        self.env, self.eval_env = make_envs(config)
        self.loop = place(init_loop(config, agent_config, self.env), mesh)
        self.step = 0  # host mirror of loop.env_steps (record_and_learn adds exactly 1): no device read per step
        self.obs = None  # the observation of the episode in progress (None between episodes)
        self.episode_return = 0.0
        self.last_metrics: dict = {}
        self.started, self.start_step, self.updates_done = time.perf_counter(), 0, 0

    def position(self) -> int:
        return self.step

    def start(self, context) -> None:
        del context

    def restore(self, checkpointer: Checkpointer, step: int) -> None:
        self.loop, metadata = checkpointer.restore(step, target=self.loop)  # onto this run's mesh
        self.strata = replay_strata(
            self.config, self.mesh, self.loop.agent.config.batch_size, metadata.get(REPLAY_SHARDS_METADATA, 1)
        )
        self.step = self.start_step = int(self.loop.env_steps)

    def _diverged(self, context, reason: str) -> Diverged:
        if self.last_metrics:  # the metrics of the update that produced the non-finite policy
            context.logger.log(self.step, {k: float(v) for k, v in self.last_metrics.items()}, prefix="train")
        return Diverged(reason)

    def advance(self, limit: int, context) -> None:
        config, loop = self.config, self.loop
        if self.obs is None:
            self.obs = self.env.reset(seed=config.seed * EPISODE_SEED_STRIDE + int(loop.episodes))
            self.episode_return = 0.0
        done = False
        while not done and self.step < limit:
            key, action = choose_action(
                loop.agent, loop.key, loop.env_steps, jnp.asarray(self.obs), config.seed_steps, self.env.action_dim
            )
            loop, action = loop._replace(key=key), np.asarray(action)
            if not np.all(np.isfinite(action)):
                self.loop = loop
                raise self._diverged(context, f"the policy produced non-finite actions at step {self.step}")
            next_obs, reward, terminated, truncated = self.env.step(action)
            transition = {
                "obs": self.obs,
                "action": action,
                "reward": np.float32(reward),
                "discount": np.float32(0.0 if terminated else 1.0),
                "next_obs": next_obs,
            }
            learn = self.step + 1 > config.seed_steps
            transition = put_replicated(transition, self.mesh)  # on a mesh: one global transition, fed by every process
            loop, metrics = record_and_learn(loop, transition, learn, config.updates_per_step, self.strata, self.mesh)
            self.updates_done += config.updates_per_step if learn else 0
            self.obs, self.episode_return = next_obs, self.episode_return + reward
            done = terminated or truncated
            self.step += 1
            context.progress(self.step)
            if metrics:
                self.last_metrics = metrics
            if self.step % config.log_every == 0 and self.last_metrics:
                self._log_training(context)
        if done or self.step >= config.total_steps:  # the episode ends (the run's end cuts it short)
            loop = loop._replace(episodes=loop.episodes + 1)
            context.logger.log(
                self.step, {"episode_return": self.episode_return, "episode": int(loop.episodes)}, prefix="train"
            )
            self.obs = None
        self.loop = loop

    def _log_training(self, context) -> None:
        values = {k: float(v) for k, v in self.last_metrics.items()}
        elapsed = time.perf_counter() - self.started
        values.update(
            env_steps_per_s=(self.step - self.start_step) / elapsed, updates_per_s=self.updates_done / elapsed
        )
        context.logger.log(self.step, values, prefix="train")
        context.bar.set_postfix(
            env_sps=f"{values['env_steps_per_s']:.0f}",
            upd_s=f"{values['updates_per_s']:.0f}",
            scale=f"{values['critic_loss_scale']:.0f}",
            skips=f"{values['critic_skipped_steps']:.0f}",
            refresh=False,
        )
        if not math.isfinite(values["critic_loss"]):
            context.write(f"warning: non-finite critic loss at step {self.step}")

    def evaluate(self) -> dict[str, float]:
        return evaluate(self.loop, self.eval_env, self.config.eval_episodes)

    def can_checkpoint(self) -> bool:
        return self.obs is None

    def checkpoint(self) -> tuple[LoopState, dict]:
        state = self.loop if self.config.save_replay else self.loop._replace(replay=None)
        return state, {REPLAY_SHARDS_METADATA: self.strata}

    def summary(self) -> dict[str, Any]:
        return {}


def train(
    config: ml_collections.ConfigDict, run_dir: pathlib.Path, resume: bool = False, progress: bool = True
) -> dict[str, Any]:
    """Runs (or resumes) SAC on a dm_control task; returns the run summary (:func:`experiments.run.run`).

    Raises:
      ValueError: bad config, or ``run_dir`` holds checkpoints and ``resume`` is False (nothing is overwritten).
    """
    agent_config = validate(config)
    check_resumable("SAC run", config, resume)
    mesh = learner_mesh(config)
    if not resume:  # a resumed run's strata come from its checkpoint
        strata = replay_strata(config, mesh, agent_config.batch_size)
        check_config(
            "SAC run",
            [
                (
                    config.seed_steps >= strata - 1,
                    f"seed_steps must be >= replay_shards - 1 ({strata - 1}), so that every stratum of the replay "
                    "buffer holds a transition at the first update",
                )
            ],
        )
    return run(
        config,
        run_dir,
        run_spec(config),
        lambda: HostLearner(config, agent_config, mesh),
        resume=resume,
        progress=progress,
    )


def _merge(base: dict, stored: dict) -> dict:
    for key, value in stored.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def load_run_config(run_dir: str | pathlib.Path) -> ml_collections.ConfigDict:
    """A finished run's config: its ``config.json`` over today's defaults, so fields added since the run keep
    their defaults. Raises ``FileNotFoundError`` without a ``config.json``, ``ValueError`` for a brax run."""
    config_path = pathlib.Path(run_dir) / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(
            f"no config.json in {run_dir}: expected a run directory of `python -m "
            "experiments.sac` (config.json + checkpoints/)."
        )
    stored = json.loads(config_path.read_text())
    if lpjax.envs.is_jitted(str(stored.get("env", ""))):
        raise ValueError(
            f"{run_dir} is a {stored['env']} run of the jitted loop; this loads dm_control runs (experiments.sac_loop)."
        )
    return ml_collections.ConfigDict(_merge(_base.get_config().to_dict(), stored))


def load_run(run_dir: str | pathlib.Path) -> tuple[ml_collections.ConfigDict, LoopState, int]:
    """``(config, loop, step)``: :func:`load_run_config` and the run's latest checkpoint restored into a
    :class:`LoopState` (``replay`` is ``None`` unless the run saved it). Raises ``FileNotFoundError`` without
    a checkpoint."""
    run_dir = pathlib.Path(run_dir)
    config = load_run_config(run_dir)
    target = init_loop(config, validate(config), make_envs(config)[0])
    if not config.save_replay:  # the loop saves the replay buffer only with save_replay
        target = target._replace(replay=None)
    with Checkpointer(run_dir / "checkpoints") as checkpointer:
        step = checkpointer.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {run_dir / 'checkpoints'}.")
        loop, _ = checkpointer.restore(step, target=target)
    return config, loop, step
