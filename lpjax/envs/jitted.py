"""What lpjax's jittable environments (brax and MJX) share: pure ``reset``/``step`` of one environment.

:class:`JittedEnv` wraps a brax-API environment (``reset(key) -> State``, ``step(State, action) -> State``, a
``State`` dataclass with ``obs``, ``reward``, ``done``, ``metrics``, ``info`` and a physics field) in brax's
``EpisodeWrapper`` (step counting, action repeat with summed rewards, ``state.info['truncation']``) and an
auto-reset wrapper, so ``step`` can run inside ``jit``/``vmap``/``lax.scan`` across episode boundaries.
:class:`lpjax.envs.BraxEnv` (brax's ``State.pipeline_state``) and :class:`lpjax.envs.MjxEnv` (MuJoCo
Playground's ``State.data``) are its two kinds; they differ only in how the wrapped environment is built.

Conventions, the same for both:

* ``episode_length`` counts *agent* steps (after action repeat), as in :mod:`lpjax.envs.dmc`; brax's
  ``EpisodeWrapper`` itself counts steps of the wrapped env, so it is given ``episode_length * action_repeat``.
* Actions are clipped to ``[-1, 1]`` (the action range of every env offered). Inside ``jit`` a NaN action cannot
  raise: it gives NaN observations.
* ``done`` is 1.0 at a termination or at the time limit; ``truncation`` is 1.0 only at the time limit of a
  not-terminated episode; ``terminated = done * (1 - truncation)`` (all float32). SAC bootstraps through a
  truncation.
* Auto-reset: the state returned by the step that ends an episode already holds the *next* episode's first
  observation in ``state.obs`` (brax's and Playground's behaviour: a reset to the env's first initial state, not
  a fresh random one). The true last observation of the ended episode, needed to bootstrap on truncation, is
  kept in ``state.info['final_obs']`` (:meth:`JittedEnv.final_obs`; equal to ``obs`` on every other step).
* The wrapped env is built eagerly even inside a trace (``jax.ensure_compile_time_eval``): brax and MJX build
  their model arrays with jax ops, which under ``jit`` would be tracers cached in the env and leaked into later
  traces.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from lpjax._optional import require

__all__ = ["JittedEnv", "check_positive_int"]


def check_positive_int(name: str, value: Any) -> int:
    """``value`` if it is a positive ``int`` (not a ``bool``); else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return value


def _auto_reset_wrapper(physics_field: str):
    """A wrapper class like brax's ``AutoResetWrapper`` that also keeps ``info['final_obs']``.

    ``physics_field`` names the ``State`` field holding the simulator state (``"pipeline_state"`` in brax,
    ``"data"`` in Playground); the first one is kept in ``info['first_<physics_field>']``.
    """
    Wrapper = require("brax.envs.base", "brax").Wrapper  # optional and slow to import: on first use

    first_physics = f"first_{physics_field}"

    class AutoResetKeepFinalObs(Wrapper):
        """Resets a done env to its first state, keeping the last observation in ``info['final_obs']``."""

        def reset(self, rng):
            state = self.env.reset(rng)
            state.info[first_physics] = getattr(state, physics_field)
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
            physics = jax.tree.map(where_done, state.info[first_physics], getattr(state, physics_field))
            obs = jax.tree.map(where_done, state.info["first_obs"], state.obs)
            return state.replace(obs=obs, **{physics_field: physics})

    return AutoResetKeepFinalObs


class JittedEnv:
    """An env with episode limit, action repeat and auto-reset, as pure functions of one environment.

    Attributes:
      name: the env's name after the prefix (e.g. ``"halfcheetah"``, ``"cartpole-swingup"``).
      episode_length: agent steps per episode (truncation after that many ``step`` calls).
      action_repeat: steps of the wrapped env per agent step (rewards are summed).
      seed: the seed given to ``lpjax.envs.make`` (``reset`` itself takes a key, e.g.
        ``jax.random.key(env.seed)``).
      observation_size, action_size: vector sizes; ``observation_shape = (observation_size,)``,
        ``action_dim = action_size``.
      action_low, action_high: ``-1.0`` and ``1.0``.
      env: the wrapped env (episode and auto-reset wrappers around the simulator's env).
    """

    action_low = -1.0
    action_high = 1.0

    def __init__(
        self,
        name: str,
        build: Callable[[], Any],
        *,
        physics_field: str,
        episode_length: int,
        action_repeat: int,
        seed: int,
    ):
        """Wraps the env that ``build()`` returns; ``physics_field`` is its ``State``'s simulator-state field."""
        self.name = name
        self.episode_length = check_positive_int("episode_length", episode_length)
        self.action_repeat = check_positive_int("action_repeat", action_repeat)
        self.seed = seed

        training = require("brax.envs.wrappers.training", "brax")

        with jax.ensure_compile_time_eval():  # see the module docstring
            base = build()
            episode = training.EpisodeWrapper(base, self.episode_length * self.action_repeat, self.action_repeat)
            self.env = _auto_reset_wrapper(physics_field)(episode)
        self.observation_size = int(base.observation_size)
        self.action_size = int(base.action_size)
        self.observation_shape = (self.observation_size,)
        self.action_dim = self.action_size

    def reset(self, key: jax.Array):
        """The first ``State`` of an episode, from a single PRNG key (``vmap`` for a batch)."""
        return self.env.reset(key)

    def step(self, state, action: jax.Array):
        """One agent step: ``action`` (``(action_size,)``, clipped to [-1, 1]) repeated ``action_repeat`` times."""
        return self.env.step(state, jnp.clip(action, -1.0, 1.0))

    # Accessors, on single or batched states: ``obs`` is the observation to act on (after an episode end, the next
    # episode's first), ``reward`` the last step's summed over the action repeat, ``done`` 1.0 if the last step ended
    # the episode (termination or time limit).
    obs = staticmethod(operator.attrgetter("obs"))
    reward = staticmethod(operator.attrgetter("reward"))
    done = staticmethod(operator.attrgetter("done"))

    @staticmethod
    def final_obs(state) -> jax.Array:
        """The observation the step reached: ``obs`` except at an episode end, where it is the ended episode's last."""
        return state.info["final_obs"]

    @staticmethod
    def truncation(state) -> jax.Array:
        """1.0 if the last step hit the time limit without terminating (``state.info['truncation']``)."""
        return state.info["truncation"]

    @staticmethod
    def terminated(state) -> jax.Array:
        """1.0 if the last step terminated the episode (a true end: do not bootstrap)."""
        return state.done * (1.0 - state.info["truncation"])

    def _describe(self) -> str:
        """Settings particular to the kind of env, for ``repr`` (e.g. the brax backend)."""
        return ""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, {self._describe()}observation_size={self.observation_size}, "
            f"action_size={self.action_size}, episode_length={self.episode_length}, action_repeat={self.action_repeat})"
        )
