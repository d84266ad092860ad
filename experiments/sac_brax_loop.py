"""SAC's jitted training loop (brax and MJX envs): environments, replay buffer and learner in one compiled function.

It runs every pure, jittable env of :mod:`lpjax.envs` (:class:`lpjax.envs.JittedEnv`: ``brax:<env>`` and
``mjx:<domain>-<task>``, alias ``playground:``); dm_control's ``dmc:`` envs run in the host loop,
:mod:`experiments.sac_loop`. The config fields ``brax_num_envs`` (parallel environments) and ``brax_backend``
(brax only) keep their names for both kinds.

Everything the loop carries is one pytree, :class:`LoopState`: the SAC state, the on-device replay buffer, the
batched environment state, the loop's PRNG key and its counters. One jitted function, :func:`chunk_fn`,
runs ``lax.scan`` over a chunk of iterations; each iteration

1. picks actions for the ``brax_num_envs`` environments: uniformly random while ``env_steps < seed_steps``,
   else a sample of the policy;
2. steps every environment once (``vmap`` of :meth:`lpjax.envs.JittedEnv.step`, with auto-reset);
3. adds the ``brax_num_envs`` transitions to the replay buffer, with ``next_obs`` the observation the step
   reached (:meth:`~lpjax.envs.JittedEnv.final_obs`, the true last one at an episode end) and
   ``discount = 1 - terminated``, so time-limit truncations bootstrap (as pytorch_sac and the dm_control loop).
   The buffer has ``replay_shards`` strata (default: the device count, 1 on one device); stratum ``s`` takes the
   transitions of the ``s``-th block of ``brax_num_envs / replay_shards`` environments
   (:func:`lpjax.replay.replay_add_blocks`; one stratum is the plain ring buffer);
4. once ``env_steps > seed_steps`` (counted after the step), runs ``updates_per_step`` SAC updates
   (:func:`lpjax.agents.sac.update`, nested in the chunk's jit) on batches sampled uniformly from the buffer,
   ``batch_size / replay_shards`` rows from each stratum (:func:`lpjax.replay.replay_sample`); the updates run in
   a ``fori_loop`` of 0 or ``updates_per_step`` trips, which (unlike ``lax.cond``) carries the agent in place.

**On many devices** (``config.mesh``, see :mod:`lpjax.sharding`), as brax's ``pmap`` trainers split their batch:
the environments are split over the mesh's devices (``brax_num_envs`` must be a multiple of ``mesh.data x
mesh.fsdp``), and so is the replay buffer, each device holding ``replay_shards / devices`` strata, those of its own
environments. Each device steps its environments, writes their transitions into its strata and samples its share of
every batch from them (:func:`lpjax.sharding.sharded_replay_add_blocks`, :func:`lpjax.sharding.sharded_replay_sample`):
no environment state or transition crosses devices. The SAC state is replicated (with ``mesh.fsdp > 1`` its
matrices are split over ``"fsdp"``, :func:`lpjax.sharding.state_shardings`), so each update is one SPMD program in
which the batch-mean gradient is an all-reduce of every device's partial sums, and the loss scaler's finite check
reads every device's gradient: the gradients are averaged over the data axis as in the dm_control loop. The whole
chunk stays one ``jit`` over arrays laid out by :func:`loop_shardings`. A run's result depends on
``replay_shards``, not on the mesh: the same config on 4 devices and on one draws the same random numbers (JAX's
partitionable threefry) and the same batches, and differs by the order of floating-point sums only
(``tests/experiments/test_sac_brax_mesh.py``). A checkpoint records its strata and restores onto any mesh whose
device count divides them.

``env_steps`` counts environment steps over all environments (one iteration = ``brax_num_envs`` steps), as
``total_steps``, ``seed_steps``, ``log_every``, ``eval_every`` and ``checkpoint_every`` do. ``updates_per_step``
is per iteration, i.e. per *vectorized* step, like brax's own ``grad_updates_per_step``.

The host calls the chunk function every ``log_every`` environment steps, with the loop state donated: the
replay buffer, agent and environments are updated in place, never copied (except by the chunk right after a
checkpoint, while orbax may still be writing those buffers: see :mod:`lpjax.checkpoint`). It then logs, shows the
progress bar (env steps/s and updates/s, over all devices), evaluates every ``eval_every`` steps with a jitted
deterministic rollout of ``eval_episodes`` episodes (the same seeded initial states every time; split over the
devices when they divide ``eval_episodes``), and checkpoints the whole
:class:`LoopState` (as :func:`storable`) every ``checkpoint_every`` steps (each at the first chunk boundary after a
multiple, and at the end). Chunks are deterministic functions of the loop state, and evaluation neither reads nor
advances the loop's key, so a resumed run is bit-identical to an uninterrupted one.

Compiled functions are cached per (environment, agent config, loop settings, mesh) in this process, so a second
run with the same settings (e.g. a resume) does not compile again. The run summary adds ``compile_s``,
``env_steps_per_s``, ``updates_per_s``, ``devices`` and ``replay_shards`` (:meth:`JittedLearner.summary`).
Benchmarks drive the loop through the same public functions: :func:`settings_of` (mesh and strata from the
config), :func:`init_loop`, :func:`chunk_fn`, :func:`evaluate_fn`.
"""

from __future__ import annotations

import functools
import math
import pathlib
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

import lpjax.envs
from experiments.devices import REPLAY_SHARDS_METADATA, check_state_layout, learner_mesh, mesh_devices, replay_strata
from experiments.run import Diverged, Learner, check_config, check_resumable, run
from experiments.sac_loop import run_spec
from lpjax.agents import sac
from lpjax.checkpoint import Checkpointer
from lpjax.replay import ReplayBuffer, replay_init
from lpjax.sharding import (
    add_replay_blocks,
    batch_sharding,
    put_replicated,
    replay_shardings,
    replicated,
    sample_replay,
    state_shardings,
)

EVAL_SEED_OFFSET = lpjax.envs.EVAL_SEED_OFFSET


class LoopState(NamedTuple):
    """What the jitted training loop carries, checkpointed whole.

    Attributes:
      agent: the :class:`lpjax.agents.sac.SACState`.
      replay: the :class:`lpjax.replay.ReplayBuffer` of transitions.
      env_state: the batched ``State`` (brax's or Playground's) of the ``brax_num_envs`` environments
        (leading axis).
      key: PRNG key of exploration (random seed-step actions, policy samples) and of replay sampling.
      env_steps: int32, environment steps taken over all environments.
      episodes: int32, episodes finished over all environments.
      episode_return: float32 ``(brax_num_envs,)``, return so far of each environment's current episode.
    """

    agent: sac.SACState
    replay: ReplayBuffer
    env_state: Any
    key: jax.Array
    env_steps: jax.Array
    episodes: jax.Array
    episode_return: jax.Array


class ChunkOutput(NamedTuple):
    """What one call of the chunk function reports (all scalars).

    Attributes:
      metrics: the metrics of the chunk's last SAC update (nan before the first update).
      learning_iterations: int32, iterations of the chunk that ran the SAC updates.
      returns_sum, episodes_finished: sum and number of the returns of the episodes finished in the chunk.
      actions_finite: whether every action of the chunk was finite.
    """

    metrics: dict
    learning_iterations: jax.Array
    returns_sum: jax.Array
    episodes_finished: jax.Array
    actions_finite: jax.Array


class LoopSettings(NamedTuple):
    """The static (hashable) settings a compiled chunk or evaluation depends on.

    ``env`` is the full name (``"brax:halfcheetah"``, ``"mjx:cartpole-swingup"``); ``backend`` the brax backend,
    ``None`` for MJX. ``mesh`` is the devices' mesh (``None``: one device, plain arrays) and ``strata`` the replay
    buffer's number of strata (``replay_shards``), a divisor of ``num_envs`` and a multiple of the mesh's devices.
    """

    env: str
    backend: str | None
    action_repeat: int
    agent: sac.SACConfig
    num_envs: int
    seed_steps: int
    updates_per_step: int
    replay_capacity: int
    mesh: Mesh | None = None
    strata: int = 1

    @property
    def devices(self) -> int:
        """The number of devices the loop runs on."""
        return 1 if self.mesh is None else int(self.mesh.devices.size)


def validate(config: ml_collections.ConfigDict) -> sac.SACConfig:
    """Checks the loop's settings and returns the agent's config; raises ``ValueError`` before any compute."""
    prefix, _, name = config.env.partition(":")
    if not lpjax.envs.is_jitted(config.env):
        raise ValueError(
            f"experiments.sac_brax_loop runs 'brax:<env>' and 'mjx:<domain>-<task>' environments, got {config.env!r}."
        )
    if prefix != "brax":
        lpjax.envs.playground_name(name)  # raises ValueError listing the valid tasks
    elif name not in lpjax.envs.BRAX_ENVS:
        raise ValueError(f"Unknown brax env {name!r}; valid names: {list(lpjax.envs.BRAX_ENVS)}.")
    elif config.brax_backend not in lpjax.envs.BRAX_BACKENDS:
        raise ValueError(
            f"Unknown brax backend {config.brax_backend!r}; valid backends: {list(lpjax.envs.BRAX_BACKENDS)}."
        )
    agent = sac.SACConfig.from_mapping(config.agent.to_dict())
    num_envs, devices = config.brax_num_envs, mesh_devices(config)
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"Bad SAC run config: brax_num_envs must be a positive integer, got {num_envs!r}.")
    checks = [
        (
            config.get("replay_dtype") is None,
            "replay_dtype is implemented by the dm_control loop only; leave it unset for brax and MJX envs",
        ),
        (
            not isinstance(devices, int) or devices < 1 or num_envs % devices == 0,  # else learner_mesh says why
            f"brax_num_envs ({num_envs}) must be a multiple of the mesh's {devices} devices (mesh.data x "
            "mesh.fsdp): each device steps its own block of environments",
        ),
        (
            not config.pixels and not agent.pixels,
            "brax and MJX envs are states only: set pixels=False and agent.pixels=False",
        ),
        (config.total_steps >= 1, "total_steps must be >= 1"),
        (
            0 <= config.seed_steps <= config.total_steps,
            f"seed_steps ({config.seed_steps}) must be in [0, total_steps ({config.total_steps})]",
        ),
        (
            config.replay_capacity >= num_envs,
            f"replay_capacity ({config.replay_capacity}) must hold one step of brax_num_envs ({num_envs}) envs",
        ),
        (
            agent.batch_size <= config.replay_capacity,
            f"batch_size ({agent.batch_size}) is larger than the replay buffer ({config.replay_capacity})",
        ),
        (config.updates_per_step >= 1, "updates_per_step must be >= 1"),
        (config.eval_episodes >= 1 and config.log_every >= 1, "eval_episodes and log_every must be >= 1"),
        (config.action_repeat >= 0, "action_repeat must be >= 0"),
    ]
    check_config("SAC run", checks)
    for field in ("total_steps", "log_every"):  # one iteration steps every env once
        if config[field] % num_envs:
            raise ValueError(
                f"Bad SAC run config: {field} ({config[field]}) must be a multiple of brax_num_envs "
                f"({num_envs}): one iteration steps every environment once."
            )
    check_state_layout(config, agent)
    return agent


def check_strata(num_envs: int, strata: int) -> None:
    """Raises ``ValueError`` (one line) unless ``strata`` divides ``num_envs``: the replay's stratum ``s`` takes the
    transitions of the ``s``-th block of ``num_envs / strata`` environments (:func:`lpjax.replay.replay_add_blocks`)."""
    if num_envs % strata:
        raise ValueError(
            f"Bad SAC run config: replay_shards ({strata}) must divide brax_num_envs ({num_envs}): each stratum of "
            "the replay buffer takes the transitions of its own block of environments."
        )


def settings_of(config: ml_collections.ConfigDict, agent: sac.SACConfig) -> LoopSettings:
    """The :class:`LoopSettings` of a validated config (``agent`` from :func:`validate`): its mesh
    (:func:`experiments.devices.learner_mesh`, joining a multi-process run) and replay strata
    (:func:`experiments.devices.replay_strata`: ``replay_shards``, by default the device count). Raises
    ``ValueError`` (one line) for a mesh the devices cannot form or strata that do not fit."""
    backend = config.brax_backend if config.env.startswith("brax:") else None
    mesh = learner_mesh(config)
    strata = replay_strata(config, mesh, agent.batch_size)
    check_strata(int(config.brax_num_envs), strata)
    return LoopSettings(
        env=config.env,
        backend=backend,
        action_repeat=max(int(config.action_repeat), 1),
        agent=agent,
        num_envs=int(config.brax_num_envs),
        seed_steps=int(config.seed_steps),
        updates_per_step=int(config.updates_per_step),
        replay_capacity=int(config.replay_capacity),
        mesh=mesh,
        strata=strata,
    )


@functools.lru_cache(maxsize=8)
def make_env(name: str, backend: str | None, action_repeat: int) -> lpjax.envs.JittedEnv:
    """The (pure, stateless) env ``name``, shared by training and evaluation; cached so compiled functions are too.

    Safe to call inside a trace: :class:`lpjax.envs.JittedEnv` builds the simulator's arrays eagerly.
    """
    return lpjax.envs.make(name, seed=0, backend=backend, action_repeat=action_repeat)


def _env_of(settings: LoopSettings) -> lpjax.envs.JittedEnv:
    return make_env(settings.env, settings.backend, settings.action_repeat)


def _example_transition(env) -> dict:
    obs = jnp.zeros(env.observation_shape, jnp.float32)
    return {
        "obs": obs,
        "action": jnp.zeros(env.action_dim, jnp.float32),
        "reward": jnp.zeros([], jnp.float32),
        "discount": jnp.zeros([], jnp.float32),
        "next_obs": obs,
    }


def _init(settings: LoopSettings, key: jax.Array) -> LoopState:
    env = _env_of(settings)
    agent_key, loop_key, env_key = jax.random.split(key, 3)
    return LoopState(
        agent=sac.init(agent_key, jnp.zeros(env.observation_shape, jnp.float32), env.action_dim, settings.agent),
        replay=replay_init(_example_transition(env), settings.replay_capacity),
        env_state=jax.vmap(env.reset)(jax.random.split(env_key, settings.num_envs)),
        key=loop_key,
        env_steps=jnp.zeros([], jnp.int32),
        episodes=jnp.zeros([], jnp.int32),
        episode_return=jnp.zeros(settings.num_envs, jnp.float32),
    )


def _state_settings(settings: LoopSettings) -> LoopSettings:
    """``settings`` without the fields the loop state's shapes and shardings do not depend on (a cache key)."""
    return settings._replace(seed_steps=0, updates_per_step=1, strata=1)


@functools.lru_cache(maxsize=8)
def _shapes(settings: LoopSettings) -> LoopState:
    return jax.eval_shape(functools.partial(_init, settings), jax.random.key(0))


def loop_shardings(settings: LoopSettings) -> LoopState | None:
    """The loop state's shardings on ``settings.mesh`` (``None`` without a mesh): the agent by
    :func:`lpjax.sharding.state_shardings` (replicated; split over ``"fsdp"`` with ``mesh.fsdp > 1``), the replay
    buffer by :func:`lpjax.sharding.replay_shardings` (its strata spread over the devices), the environments and
    their returns split over the devices (:func:`lpjax.sharding.batch_sharding`), the key and counters
    replicated."""
    mesh = settings.mesh
    if mesh is None:
        return None
    shapes = _shapes(_state_settings(settings))
    envs, everywhere = batch_sharding(mesh), replicated(mesh)
    return LoopState(
        agent=state_shardings(shapes.agent, mesh),
        replay=replay_shardings(shapes.replay, mesh),
        env_state=jax.tree.map(lambda _: envs, shapes.env_state),
        key=everywhere,
        env_steps=everywhere,
        episodes=everywhere,
        episode_return=envs,
    )


def _constrain(loop: LoopState, settings: LoopSettings) -> LoopState:
    """Inside a jitted function: ``loop`` kept in :func:`loop_shardings`' layout (unchanged without a mesh)."""
    shardings = loop_shardings(settings)
    return loop if shardings is None else jax.lax.with_sharding_constraint(loop, shardings)


@functools.lru_cache(maxsize=8)
def _init_fn(settings: LoopSettings):
    # Jitted: an eager sac.init dispatches hundreds of small ops, slower than compiling them. On a mesh every
    # device computes only its own shard (its environments and strata, its copy of the agent).
    shardings = loop_shardings(settings)
    options = {} if shardings is None else {"out_shardings": shardings}
    return jax.jit(functools.partial(_init, settings), **options)


def init_loop(settings: LoopSettings, seed: int) -> LoopState:
    """The initial loop state: fresh agent, empty buffer, ``num_envs`` environments reset from the seed's key; on
    a mesh, laid out by :func:`loop_shardings` (the same values as on one device)."""
    return _init_fn(_state_settings(settings))(jax.random.key(seed))


def abstract_loop(settings: LoopSettings) -> LoopState:
    """``jax.eval_shape`` of :func:`init_loop` (with each leaf's sharding on a mesh): a restore target and a
    lowering argument, without any compute."""
    shapes, shardings = _shapes(_state_settings(settings)), loop_shardings(settings)
    if shardings is None:
        return shapes
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings)


def storable(loop: LoopState) -> LoopState:
    """``loop`` as checkpointed: its zero-size arrays (MJX's ``Data`` has some) replaced by ``None``.

    Orbax cannot save zero-size arrays, and they hold no data: :func:`restore_loop` rebuilds them.
    """
    return jax.tree.map(lambda x: x if x.size else None, loop)


def restore_loop_and_metadata(checkpointer: Checkpointer, step: int, settings: LoopSettings) -> tuple[LoopState, dict]:
    """The loop state saved (as :func:`storable`) in checkpoint ``step``, zero-size arrays rebuilt, laid out on
    ``settings.mesh`` whatever mesh saved it; and the checkpoint's metadata."""
    abstract = abstract_loop(settings)
    if settings.mesh is None:  # onto this process's default device, not the devices that saved it
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract)
    stored, metadata = checkpointer.restore(step, target=storable(abstract))
    loop = jax.tree.map(
        lambda like, x: jnp.zeros(like.shape, like.dtype, device=like.sharding) if x is None else x, abstract, stored
    )
    return loop, metadata


def restore_loop(checkpointer: Checkpointer, step: int, settings: LoopSettings) -> LoopState:
    """The loop state of :func:`restore_loop_and_metadata`."""
    return restore_loop_and_metadata(checkpointer, step, settings)[0]


def _iteration(settings: LoopSettings, carry, _):
    """One vectorized environment step, its transitions into the buffer, then the SAC updates (if learning)."""
    env, cfg = _env_of(settings), settings.agent
    loop, out = carry
    key, action_key, update_key = jax.random.split(loop.key, 3)
    obs = env.obs(loop.env_state)
    random_actions = jax.random.uniform(action_key, (settings.num_envs, env.action_dim), jnp.float32, -1.0, 1.0)
    policy_actions = sac.act(loop.agent, obs, action_key)
    actions = jnp.where(loop.env_steps < settings.seed_steps, random_actions, policy_actions)
    env_state = jax.vmap(env.step)(loop.env_state, actions)
    reward = env.reward(env_state)
    replay = add_replay_blocks(
        loop.replay,
        {
            "obs": obs,
            "action": actions,
            "reward": reward,
            "discount": 1.0 - env.terminated(env_state),
            "next_obs": env.final_obs(env_state),
        },
        settings.strata,
        settings.mesh,
    )
    env_steps = loop.env_steps + settings.num_envs

    def update(i, carry):
        agent, _ = carry
        batch = sample_replay(replay, jax.random.fold_in(update_key, i), cfg.batch_size, settings.strata, settings.mesh)
        return sac.update(agent, batch)

    # A loop of 0 (seed steps) or updates_per_step updates: unlike lax.cond, it carries the agent in place.
    learning = env_steps > settings.seed_steps
    agent, metrics = jax.lax.fori_loop(
        0, jnp.where(learning, settings.updates_per_step, 0), update, (loop.agent, out.metrics)
    )

    done = env.done(env_state)
    returns = loop.episode_return + reward
    loop = LoopState(
        agent=agent,
        replay=replay,
        env_state=env_state,
        key=key,
        env_steps=env_steps,
        episodes=loop.episodes + jnp.sum(done).astype(jnp.int32),
        episode_return=returns * (1.0 - done),
    )
    loop = _constrain(loop, settings)
    out = ChunkOutput(
        metrics=metrics,
        learning_iterations=out.learning_iterations + learning.astype(jnp.int32),
        returns_sum=out.returns_sum + jnp.sum(returns * done),
        episodes_finished=out.episodes_finished + jnp.sum(done).astype(jnp.int32),
        actions_finite=out.actions_finite & jnp.all(jnp.isfinite(actions)),
    )
    return (loop, out), None


def _chunk(settings: LoopSettings, iterations: int, loop: LoopState) -> tuple[LoopState, ChunkOutput]:
    env = _env_of(settings)
    batch = jax.tree.map(lambda x: jnp.zeros((settings.agent.batch_size,) + x.shape, x.dtype), _example_transition(env))
    metric_shapes = jax.eval_shape(sac.update, loop.agent, batch)[1]
    out = ChunkOutput(
        metrics=jax.tree.map(lambda m: jnp.full(m.shape, jnp.nan, m.dtype), metric_shapes),
        learning_iterations=jnp.zeros([], jnp.int32),
        returns_sum=jnp.zeros([], jnp.float32),
        episodes_finished=jnp.zeros([], jnp.int32),
        actions_finite=jnp.ones([], bool),
    )
    (loop, out), _ = jax.lax.scan(functools.partial(_iteration, settings), (loop, out), length=iterations)
    return loop, out


@functools.lru_cache(maxsize=8)
def chunk_fn(settings: LoopSettings, iterations: int):
    """``compiled(loop) -> (loop, ChunkOutput)``, running ``iterations`` iterations.

    Compiled ahead of time (``jax.jit(...).lower(...).compile()``) with the loop state donated, so XLA updates
    the replay buffer, the agent and the environments in place. On a mesh it takes and returns the loop state
    in :func:`loop_shardings`' layout, and its (scalar) outputs replicated.
    """
    mesh = settings.mesh
    options = {} if mesh is None else {"out_shardings": (loop_shardings(settings), replicated(mesh))}
    return (
        jax.jit(functools.partial(_chunk, settings, iterations), donate_argnums=0, **options)
        .lower(abstract_loop(settings))
        .compile()
    )


def _evaluate(settings: LoopSettings, episodes: int, agent: sac.SACState, key: jax.Array):
    env = _env_of(settings)
    state = jax.vmap(env.reset)(jax.random.split(key, episodes))
    if settings.mesh is not None and episodes % settings.devices == 0:  # each device plays its share
        state = jax.lax.with_sharding_constraint(state, batch_sharding(settings.mesh))

    def step(carry, _):
        state, total, alive, finite = carry
        actions = sac.act(agent, env.obs(state), key, deterministic=True)
        state = jax.vmap(env.step)(state, actions)
        total = total + alive * env.reward(state)
        return (state, total, alive * (1.0 - env.done(state)), finite & jnp.all(jnp.isfinite(actions))), None

    init = (state, jnp.zeros(episodes, jnp.float32), jnp.ones(episodes, jnp.float32), jnp.ones([], bool))
    (_, total, _, finite), _ = jax.lax.scan(step, init, length=env.episode_length)
    return total, finite


@functools.lru_cache(maxsize=8)
def evaluate_fn(settings: LoopSettings, episodes: int):
    """``compiled(agent, key) -> (returns (episodes,), actions_finite)``.

    A deterministic (``tanh(mean)``) rollout of ``episodes`` environments, reset from ``key``, for one episode
    length; rewards after an environment's first episode end are not counted. On a mesh the episodes are split
    over the devices when their number divides them, and ``key`` and the results are replicated.
    """
    key, options = jax.eval_shape(lambda: jax.random.key(0)), {}
    if settings.mesh is not None:
        everywhere = replicated(settings.mesh)
        key, options = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=everywhere), {"out_shardings": everywhere}
    return (
        jax.jit(functools.partial(_evaluate, settings, episodes), **options)
        .lower(abstract_loop(settings).agent, key)
        .compile()
    )


def evaluate(loop: LoopState, settings: LoopSettings, episodes: int, seed: int) -> dict[str, float]:
    """Mean and standard deviation of the deterministic policy's return over ``episodes`` seeded episodes."""
    key = put_replicated(jax.random.key(seed + EVAL_SEED_OFFSET), settings.mesh)
    returns, finite = evaluate_fn(settings, episodes)(loop.agent, key)
    if not bool(finite):
        raise Diverged("the deterministic policy produced non-finite actions during evaluation")
    returns = np.asarray(returns, np.float64)
    return {"return": float(np.mean(returns)), "return_std": float(np.std(returns))}


class JittedLearner(Learner):
    """SAC in the jitted loop, for :func:`experiments.run.run`: ``advance`` runs one compiled chunk of
    ``log_every`` environment steps (fewer at the run's end), whatever the limit, and logs its metrics."""

    def __init__(self, config: ml_collections.ConfigDict, settings: LoopSettings):
        self.config, self.settings = config, settings
        self.compile_s = self.compute_s = 0.0
        self.updates_done, self.start_steps = 0, 0
        self.loop = None

    def _timed(self, function, *args):
        """What ``function`` returns; the seconds it took count as compile time."""
        started = time.perf_counter()
        result = function(*args)
        self.compile_s += time.perf_counter() - started
        return result

    def position(self) -> int:
        return int(self.loop.env_steps)

    def start(self, context) -> None:
        del context
        self.loop = self._timed(lambda: jax.block_until_ready(init_loop(self.settings, self.config.seed)))
        self._timed(chunk_fn, self.settings, self.config.log_every // self.settings.num_envs)

    def restore(self, checkpointer: Checkpointer, step: int) -> None:
        self.loop, metadata = restore_loop_and_metadata(checkpointer, step, self.settings)  # onto this run's mesh
        # The strata the buffer was laid out in (a checkpoint from before meshes: 1).
        settings = self.settings
        strata = replay_strata(
            self.config, settings.mesh, settings.agent.batch_size, metadata.get(REPLAY_SHARDS_METADATA, 1)
        )
        check_strata(settings.num_envs, strata)
        self.settings = settings._replace(strata=strata)
        self.start_steps = int(self.loop.env_steps)
        self._timed(chunk_fn, self.settings, self.config.log_every // self.settings.num_envs)

    def advance(self, limit: int, context) -> None:
        del limit  # chunks have a fixed, compiled size
        config, settings = self.config, self.settings
        before = int(self.loop.env_steps)
        steps = min(config.log_every, config.total_steps - before)
        compiled = self._timed(chunk_fn, settings, steps // settings.num_envs)
        started = time.perf_counter()
        self.loop, out = compiled(self.loop)
        out = jax.device_get(out)
        elapsed = time.perf_counter() - started
        step = int(self.loop.env_steps)
        updates = int(out.learning_iterations) * settings.updates_per_step
        self.compute_s, self.updates_done = self.compute_s + elapsed, self.updates_done + updates
        values = {
            "env_steps_per_s": steps / elapsed,
            "updates_per_s": updates / elapsed,
            "episodes": int(self.loop.episodes),
        }
        if out.episodes_finished:
            values["episode_return"] = float(out.returns_sum) / int(out.episodes_finished)
        if out.learning_iterations:
            values.update({k: float(v) for k, v in out.metrics.items()})
        context.logger.log(step, values, prefix="train")  # on divergence too: the metrics of the update that broke it
        if not out.actions_finite:
            raise Diverged(f"the policy produced non-finite actions between steps {before} and {step}")
        postfix = dict(env_sps=f"{values['env_steps_per_s']:.0f}", upd_s=f"{values['updates_per_s']:.0f}")
        if out.learning_iterations:
            postfix["scale"] = f"{values['critic_loss_scale']:.0f}"
            postfix["skips"] = f"{values['critic_skipped_steps']:.0f}"
            if not math.isfinite(values["critic_loss"]):
                context.write(f"warning: non-finite critic loss at step {step}")
        context.bar.set_postfix(postfix, refresh=False)

    def evaluate(self) -> dict[str, float]:
        self._timed(evaluate_fn, self.settings, self.config.eval_episodes)
        return evaluate(self.loop, self.settings, self.config.eval_episodes, self.config.seed)

    def can_checkpoint(self) -> bool:
        return True

    def checkpoint(self) -> tuple[LoopState, dict]:
        loop = self.loop if self.config.save_replay else self.loop._replace(replay=None)
        return storable(loop), {REPLAY_SHARDS_METADATA: self.settings.strata}

    def summary(self) -> dict[str, Any]:
        """``compile_s`` (seconds compiling the chunk and evaluation functions and the jitted initialization; 0 for
        what this process had already compiled), ``env_steps_per_s`` and ``updates_per_s`` over the chunks run
        (compile excluded), ``devices`` (the mesh's device count, 1 without a mesh) and ``replay_shards`` (the
        replay buffer's strata)."""
        steps_run = int(self.loop.env_steps) - self.start_steps
        return {
            "compile_s": self.compile_s,
            "env_steps_per_s": steps_run / self.compute_s if self.compute_s else None,
            "updates_per_s": self.updates_done / self.compute_s if self.compute_s else None,
            "devices": self.settings.devices,
            "replay_shards": self.settings.strata,
        }


def train(
    config: ml_collections.ConfigDict, run_dir: pathlib.Path, resume: bool = False, progress: bool = True
) -> dict[str, Any]:
    """Runs (or resumes) SAC on a brax or MJX env; returns the run summary (:func:`experiments.run.run`) with
    :meth:`JittedLearner.summary`'s throughput.

    Raises:
      ValueError: bad config, or ``run_dir`` holds checkpoints and ``resume`` is False (nothing is overwritten).
    """
    agent_config = validate(config)
    check_resumable("SAC run", config, resume)
    settings = settings_of(config, agent_config)
    return run(
        config, run_dir, run_spec(config), lambda: JittedLearner(config, settings), resume=resume, progress=progress
    )
