"""Brax environments as pure, jittable ``reset``/``step`` functions (one environment; ``vmap`` for batches).

``make_brax("halfcheetah")`` (or ``lpjax.envs.make("brax:halfcheetah", seed=0)``) returns a :class:`BraxEnv`::

    env = make_brax("halfcheetah", episode_length=1000)
    reset = jax.jit(jax.vmap(env.reset))                 # keys (B,) -> batched State
    step = jax.jit(jax.vmap(env.step))                   # (State, actions (B, action_size)) -> State
    state = reset(jax.random.split(jax.random.key(0), 64))
    state = step(state, actions)
    BraxEnv.obs(state), BraxEnv.reward(state), BraxEnv.done(state), BraxEnv.truncation(state)

The wrapped env is ``brax.envs.get_environment(name, backend=...)`` inside brax's ``EpisodeWrapper`` (step
counting, action repeat with summed rewards, ``state.info['truncation']``) and an auto-reset wrapper, so
``step`` can run inside ``lax.scan`` across episode boundaries. Conventions:

* ``episode_length`` counts *agent* steps (after action repeat), as in :mod:`lpjax.envs.dmc`; brax's own
  ``brax.envs.create`` counts physics-env steps instead (identical for ``action_repeat=1``).
* Actions are clipped to ``[-1, 1]`` (every brax env's range). Inside ``jit`` a NaN action cannot raise: it
  gives NaN observations.
* ``done`` is 1.0 at a termination or at the time limit; ``truncation`` is 1.0 only at the time limit of a
  not-terminated episode; ``terminated = done * (1 - truncation)`` (all float32). SAC bootstraps through a
  truncation.
* Auto-reset: the state returned by the step that ends an episode already holds the *next* episode's first
  observation in ``state.obs`` (brax's behaviour; brax resets to the env's first initial state, not a fresh
  random one). The true last observation of the ended episode, needed to bootstrap on truncation, is kept in
  ``state.info['final_obs']`` (:meth:`BraxEnv.final_obs`; equal to ``obs`` on every other step). Brax's own SAC
  instead drops truncated transitions from the critic loss.

Backends, measured on this 2-core CPU (jax 0.10.2, brax 0.14.2; halfcheetah, 64 envs, ``jit(vmap(step))``
inside a ``lax.scan`` of 100 steps; best of 3 after compilation; a shared machine, so the runs spread as shown):

==============  ==================  =====================================
backend         env steps/s         first reset + first scan (compile)
==============  ==================  =====================================
spring          13,300 - 17,500     4-8 s + 6-10 s
positional      4,400 - 5,200       ~4 s + 11-13 s
generalized     4,200 - 4,500       ~6 s + ~10 s
mjx             ~1,470              ~8 s + 14-19 s
==============  ==================  =====================================

so the default backend is ``spring``. The backends are different physics: ``spring`` and ``positional``
halfcheetah use a smaller timestep (16 substeps) and different gears than ``generalized``/``mjx``, so
returns are not comparable across backends.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["BRAX_BACKENDS", "BRAX_ENVS", "DEFAULT_BRAX_BACKEND", "BraxEnv", "make_brax"]

# brax.envs registry (brax 0.14.2) without its 'fast' test env; tests/envs/test_brax_env.py checks it.
BRAX_ENVS: tuple[str, ...] = (
    "ant",
    "halfcheetah",
    "hopper",
    "humanoid",
    "humanoidstandup",
    "inverted_double_pendulum",
    "inverted_pendulum",
    "pusher",
    "reacher",
    "swimmer",
    "walker2d",
)
BRAX_BACKENDS: tuple[str, ...] = ("spring", "positional", "generalized", "mjx")
DEFAULT_BRAX_BACKEND = "spring"  # fastest on CPU: see the module docstring


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return value


def _auto_reset_wrapper():
    """An auto-reset wrapper class like brax's ``AutoResetWrapper`` that also keeps ``info['final_obs']``."""
    from brax.envs.base import Wrapper  # noqa: PLC0415  (brax is optional and slow to import)

    class AutoResetKeepFinalObs(Wrapper):
        """Resets a done env to its first state, keeping the last observation in ``info['final_obs']``."""

        def reset(self, rng):
            state = self.env.reset(rng)
            state.info["first_pipeline_state"] = state.pipeline_state
            state.info["first_obs"] = state.obs
            state.info["final_obs"] = state.obs
            return state

        def step(self, state, action):
            if "steps" in state.info:
                state.info.update(steps=jnp.where(state.done, jnp.zeros_like(state.info["steps"]), state.info["steps"]))
            state = state.replace(done=jnp.zeros_like(state.done))
            state = self.env.step(state, action)
            done = state.done

            def where_done(first, current):
                return jnp.where(jnp.reshape(done, done.shape + (1,) * (current.ndim - done.ndim)), first, current)

            state.info["final_obs"] = state.obs
            pipeline_state = jax.tree.map(where_done, state.info["first_pipeline_state"], state.pipeline_state)
            obs = jax.tree.map(where_done, state.info["first_obs"], state.obs)
            return state.replace(pipeline_state=pipeline_state, obs=obs)

    return AutoResetKeepFinalObs


class BraxEnv:
    """A brax env with episode limit, action repeat and auto-reset, as pure functions of one environment.

    Attributes:
      name: brax env name (e.g. ``"halfcheetah"``).
      backend: physics backend (one of ``BRAX_BACKENDS``).
      episode_length: agent steps per episode (truncation after that many ``step`` calls).
      action_repeat: physics-env steps per agent step (rewards are summed).
      seed: the seed given to ``lpjax.envs.make`` (``reset`` itself takes a key, e.g.
        ``jax.random.key(env.seed)``).
      observation_size, action_size: vector sizes; ``observation_shape = (observation_size,)``,
        ``action_dim = action_size``.
      action_low, action_high: ``-1.0`` and ``1.0``.
      env: the wrapped brax env (``brax.envs.Env``).
    """

    action_low = -1.0
    action_high = 1.0

    def __init__(
        self,
        name: str,
        *,
        backend: str = DEFAULT_BRAX_BACKEND,
        episode_length: int = 1000,
        action_repeat: int = 1,
        seed: int = 0,
    ):
        if name not in BRAX_ENVS:
            raise ValueError(f"Unknown brax env {name!r}; valid names: {list(BRAX_ENVS)}.")
        if backend not in BRAX_BACKENDS:
            raise ValueError(f"Unknown brax backend {backend!r}; valid backends: {list(BRAX_BACKENDS)}.")
        self.name = name
        self.backend = backend
        self.episode_length = _check_positive_int("episode_length", episode_length)
        self.action_repeat = _check_positive_int("action_repeat", action_repeat)
        self.seed = seed

        from brax import envs  # noqa: PLC0415
        from brax.envs.wrappers import training  # noqa: PLC0415

        # Eagerly even inside a trace: brax builds the system's arrays with jax ops, which under jit would be
        # tracers cached in the env and leaked into later traces.
        with jax.ensure_compile_time_eval():
            base = envs.get_environment(name, backend=backend)
            episode = training.EpisodeWrapper(base, self.episode_length * self.action_repeat, self.action_repeat)
            self.env = _auto_reset_wrapper()(episode)
        self.observation_size = int(base.observation_size)
        self.action_size = int(base.action_size)
        self.observation_shape = (self.observation_size,)
        self.action_dim = self.action_size

    def reset(self, key: jax.Array):
        """The first ``brax.envs.State`` of an episode, from a single PRNG key (``vmap`` for a batch)."""
        return self.env.reset(key)

    def step(self, state, action: jax.Array):
        """One agent step: ``action`` (``(action_size,)``, clipped to [-1, 1]) repeated ``action_repeat`` times."""
        return self.env.step(state, jnp.clip(action, -1.0, 1.0))

    # Accessors: work on single or batched states.
    @staticmethod
    def obs(state) -> jax.Array:
        """Observation to act on (after an episode end: the next episode's first one)."""
        return state.obs

    @staticmethod
    def final_obs(state) -> jax.Array:
        """The observation the step reached: ``obs`` except at an episode end, where it is the ended episode's last."""
        return state.info["final_obs"]

    @staticmethod
    def reward(state) -> jax.Array:
        """Reward of the last step, summed over the action repeat."""
        return state.reward

    @staticmethod
    def done(state) -> jax.Array:
        """1.0 if the last step ended the episode (termination or time limit)."""
        return state.done

    @staticmethod
    def truncation(state) -> jax.Array:
        """1.0 if the last step hit the time limit without terminating (``state.info['truncation']``)."""
        return state.info["truncation"]

    @staticmethod
    def terminated(state) -> jax.Array:
        """1.0 if the last step terminated the episode (a true end: do not bootstrap)."""
        return state.done * (1.0 - state.info["truncation"])

    def __repr__(self) -> str:
        return (
            f"BraxEnv({self.name!r}, backend={self.backend!r}, observation_size={self.observation_size}, "
            f"action_size={self.action_size}, episode_length={self.episode_length}, action_repeat={self.action_repeat})"
        )


def make_brax(
    name: str,
    *,
    backend: str | None = None,
    episode_length: int = 1000,
    action_repeat: int = 1,
    seed: int = 0,
) -> BraxEnv:
    """Builds a :class:`BraxEnv`; ``backend=None`` means ``DEFAULT_BRAX_BACKEND`` (``"spring"``)."""
    return BraxEnv(
        name,
        backend=DEFAULT_BRAX_BACKEND if backend is None else backend,
        episode_length=episode_length,
        action_repeat=action_repeat,
        seed=seed,
    )
