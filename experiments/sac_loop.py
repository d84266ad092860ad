"""SAC's training loop on dm_control: host-side environment, one jitted call per environment step.

Everything the loop carries besides the environments is one pytree, :class:`LoopState`: the SAC state, the
replay buffer, the loop's PRNG key and its counters. It is checkpointed whole at episode ends, and episode
``i`` of a run resets its environment with seed ``seed * 1_000_003 + i``. Together these make a resumed run
bit-identical to an uninterrupted one: after a crash nothing is lost beyond the last checkpoint.

Per agent step: pick an action (uniformly random during ``seed_steps``, else a policy sample), step the
environment, then one jitted call adds the transition to the replay buffer and, after the seed steps, samples
batches and runs ``updates_per_step`` SAC updates. ``discount`` is 0 only at a true termination; time limits
bootstrap, as in pytorch_sac.
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
import tqdm

import lpjax.envs
from lpjax.agents import sac
from experiments.configs.sac import _base
from lpjax.checkpoint import Checkpointer, open_run_checkpoints, save_if_due
from lpjax.replay import ReplayBuffer, replay_add, replay_init, replay_sample
from lpjax.run_logging import CONFIG_FILE, RunLogger, plot_run_curve

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


class Diverged(RuntimeError):
    """The policy produced non-finite actions: the run cannot continue (typically naive fp16)."""


def validate(config: ml_collections.ConfigDict) -> sac.SACConfig:
    """Checks the loop's settings and returns the agent's config; raises ``ValueError`` before any compute."""
    if lpjax.envs.is_jitted(config.env):
        raise ValueError(f"{config.env!r} runs in the jitted loop (experiments.sac_brax_loop), not the host loop.")
    prefix, _, task = config.env.partition(":")
    if prefix != "dmc":
        raise ValueError("Environment names look like 'dmc:<domain>-<task>', 'mjx:<domain>-<task>' or 'brax:<env>', "
                         f"got {config.env!r}.")
    lpjax.envs.parse_task(task)  # raises ValueError listing the valid tasks
    agent = sac.SACConfig.from_mapping(config.agent.to_dict())
    checks = [
        (config.total_steps >= 1, "total_steps must be >= 1"),
        (0 <= config.seed_steps <= config.total_steps,
         f"seed_steps ({config.seed_steps}) must be in [0, total_steps ({config.total_steps})]"),
        (config.replay_capacity >= 1, "replay_capacity must be >= 1"),
        (agent.batch_size <= config.replay_capacity,
         f"batch_size ({agent.batch_size}) is larger than the replay buffer ({config.replay_capacity})"),
        (config.updates_per_step >= 1, "updates_per_step must be >= 1"),
        (config.eval_every >= 1 and config.eval_episodes >= 1, "eval_every and eval_episodes must be >= 1"),
        (config.log_every >= 1 and config.checkpoint_every >= 1, "log_every and checkpoint_every must be >= 1"),
        (config.pixels == agent.pixels, "config.pixels and config.agent.pixels must agree"),
        (config.action_repeat >= 0 and config.frame_stack >= 1, "action_repeat >= 0 and frame_stack >= 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(f"Bad SAC run config: {message}.")
    return agent


def make_envs(config: ml_collections.ConfigDict):
    """The training and evaluation environments (evaluation episodes are seeded independently)."""
    options = dict(pixels=config.pixels, action_repeat=config.action_repeat or None)
    if config.pixels:
        options["frame_stack"] = config.frame_stack
    return (lpjax.envs.make(config.env, seed=config.seed, **options),
            lpjax.envs.make(config.env, seed=config.seed + lpjax.envs.EVAL_SEED_OFFSET, **options))


def init_loop(config: ml_collections.ConfigDict, agent_config: sac.SACConfig, env) -> LoopState:
    key = jax.random.key(config.seed)
    agent_key, loop_key = jax.random.split(key)
    observation = jnp.zeros(env.observation_shape, env.observation_dtype)
    agent = sac.init(agent_key, observation, env.action_dim, agent_config)
    example = {"obs": observation, "action": jnp.zeros(env.action_dim, jnp.float32),
               "reward": jnp.zeros([], jnp.float32), "discount": jnp.zeros([], jnp.float32), "next_obs": observation}
    return LoopState(agent=agent, replay=replay_init(example, config.replay_capacity), key=loop_key,
                     env_steps=jnp.zeros([], jnp.int32), episodes=jnp.zeros([], jnp.int32))


@functools.partial(jax.jit, static_argnames=("seed_steps", "action_dim"))
def choose_action(agent: sac.SACState, key: jax.Array, env_steps: jax.Array, obs: jax.Array, seed_steps: int,
                  action_dim: int) -> tuple[jax.Array, jax.Array]:
    """``(next_key, action)``: uniformly random during the seed steps, else a sample of the policy."""
    key, sample_key = jax.random.split(key)
    random_action = jax.random.uniform(sample_key, (action_dim,), jnp.float32, -1.0, 1.0)
    policy_action = sac.act(agent, obs[None], sample_key)[0]
    return key, jnp.where(env_steps < seed_steps, random_action, policy_action)


@functools.partial(jax.jit, static_argnames=("learn", "updates"), donate_argnums=0)
def record_and_learn(loop: LoopState, transition: dict, learn: bool, updates: int) -> tuple[LoopState, dict]:
    """Adds one transition; if ``learn``, runs ``updates`` SAC updates on uniformly sampled batches."""
    replay = replay_add(loop.replay, jax.tree.map(lambda x: x[None], transition))
    agent, metrics = loop.agent, {}
    key = loop.key
    for _ in range(updates if learn else 0):
        key, batch_key = jax.random.split(key)
        agent, metrics = sac.update(agent, replay_sample(replay, batch_key, agent.config.batch_size))
    return LoopState(agent, replay, key, loop.env_steps + 1, loop.episodes), metrics


def evaluate(loop: LoopState, env, episodes: int) -> dict[str, float]:
    """Mean and standard deviation of the deterministic policy's return over seeded episodes."""

    def policy(obs):
        return sac.act(loop.agent, jnp.asarray(obs)[None], loop.key, deterministic=True)[0]

    try:
        return lpjax.envs.evaluate_policy(policy, env, episodes)
    except lpjax.envs.NonFiniteAction as error:
        raise Diverged(str(error)) from error


def train(config: ml_collections.ConfigDict, run_dir: pathlib.Path, resume: bool = False,
          progress: bool = True) -> dict[str, Any]:
    """Runs (or resumes) SAC on a dm_control task; returns a summary (final evaluation, status, paths).

    Raises:
      ValueError: bad config, or ``run_dir`` holds checkpoints and ``resume`` is False (nothing is overwritten).
    """
    agent_config = validate(config)
    run_dir = pathlib.Path(run_dir)
    checkpointer, latest = open_run_checkpoints(run_dir, resume, config.save_replay)
    env, eval_env = make_envs(config)
    loop = init_loop(config, agent_config, env)
    logger = RunLogger(run_dir, config=config)
    if resume and latest is not None:
        loop, _ = checkpointer.restore(latest, target=loop)
        logger.truncate_after(int(loop.env_steps))
        print(f"resumed {run_dir} at step {int(loop.env_steps)} (episode {int(loop.episodes)})")

    status, last_metrics = "finished", {}
    # Host mirror of loop.env_steps (record_and_learn adds exactly 1): no device read per step.
    step = start_steps = int(loop.env_steps)
    started = time.perf_counter()
    updates_done = 0
    bar = tqdm.tqdm(total=config.total_steps, initial=start_steps, disable=not progress, unit="step",
                    dynamic_ncols=True)
    try:
        while step < config.total_steps:
            obs = env.reset(seed=config.seed * EPISODE_SEED_STRIDE + int(loop.episodes))
            episode_return, done = 0.0, False
            while not done and step < config.total_steps:
                key, action = choose_action(loop.agent, loop.key, loop.env_steps, jnp.asarray(obs),
                                            config.seed_steps, env.action_dim)
                loop, action = loop._replace(key=key), np.asarray(action)
                if not np.all(np.isfinite(action)):
                    raise Diverged(f"the policy produced non-finite actions at step {step}")
                next_obs, reward, terminated, truncated = env.step(action)
                transition = {"obs": obs, "action": action, "reward": np.float32(reward),
                              "discount": np.float32(0.0 if terminated else 1.0), "next_obs": next_obs}
                learn = step + 1 > config.seed_steps
                loop, metrics = record_and_learn(loop, transition, learn, config.updates_per_step)
                updates_done += config.updates_per_step if learn else 0
                obs, episode_return, done = next_obs, episode_return + reward, terminated or truncated
                step += 1
                bar.update(1)
                if metrics:
                    last_metrics = metrics
                if step % config.log_every == 0 and last_metrics:
                    values = {k: float(v) for k, v in last_metrics.items()}
                    elapsed = time.perf_counter() - started
                    values.update(env_steps_per_s=(step - start_steps) / elapsed, updates_per_s=updates_done / elapsed)
                    logger.log(step, values, prefix="train")
                    bar.set_postfix(env_sps=f"{values['env_steps_per_s']:.0f}", upd_s=f"{values['updates_per_s']:.0f}",
                                    scale=f"{values['critic_loss_scale']:.0f}", refresh=False)
                    if not math.isfinite(values["critic_loss"]):
                        tqdm.tqdm.write(f"warning: non-finite critic loss at step {step}")
                if step % config.eval_every == 0 or step == config.total_steps:
                    result = evaluate(loop, eval_env, config.eval_episodes)
                    logger.log(step, result, prefix="eval")
                    tqdm.tqdm.write(f"step {step}: eval return {result['return']:.1f} ± {result['return_std']:.1f}")
            loop = loop._replace(episodes=loop.episodes + 1)
            logger.log(step, {"episode_return": episode_return, "episode": int(loop.episodes)},
                       prefix="train")
            latest = save_if_due(checkpointer, step, latest, config.checkpoint_every, step >= config.total_steps,
                                 loop, config.save_replay, metadata={"config": config.to_dict()})
    except Diverged as error:
        status = f"diverged: {error}"
        tqdm.tqdm.write(f"stopping: {status}")
        if last_metrics:  # the metrics of the update that produced the non-finite policy
            logger.log(step, {k: float(v) for k, v in last_metrics.items()}, prefix="train")
    finally:
        bar.close()
        checkpointer.wait()
        logger.close()
    return {"status": status, "env_steps": int(loop.env_steps), "run_dir": str(run_dir),
            "curve": plot_returns(run_dir, f"SAC {config.agent.policy} on {config.env}")}


def plot_returns(run_dir: pathlib.Path, title: str) -> str | None:
    """Writes ``learning_curve.png``: evaluation returns; for a run that ended (e.g. diverged) before its first
    evaluation, training episode returns or else the critic loss; ``None`` if nothing was logged."""
    return plot_run_curve(run_dir, title, ("eval/return", "train/episode_return", "train/critic_loss"),
                          plot_nonfinite=("train/critic_loss",))


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
        raise FileNotFoundError(f"no config.json in {run_dir}: expected a run directory of `python -m "
                                "experiments.sac` (config.json + checkpoints/).")
    stored = json.loads(config_path.read_text())
    if lpjax.envs.is_jitted(str(stored.get("env", ""))):
        raise ValueError(f"{run_dir} is a {stored['env']} run of the jitted loop; this loads dm_control runs "
                         "(experiments.sac_loop).")
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
