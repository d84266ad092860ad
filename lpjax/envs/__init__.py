"""Environments for the lpjax learners: dm_control (host-side) and brax (pure, jittable).

``make(name, *, seed, ...)`` dispatches on the name's prefix:

* ``"dmc:<domain>-<task>"`` (e.g. ``"dmc:cheetah-run"``, ``"dmc:ball_in_cup-catch"``) -> :class:`DMCEnv`, a
  host-side env for an SAC host loop: ``reset() -> obs``, ``step(action) -> (obs, reward, terminated,
  truncated)``, ``observation_shape``, ``observation_dtype``, ``action_dim``, ``action_low``/``action_high``
  (always -1/1), ``episode_length`` (agent steps), ``action_repeat``. See :mod:`lpjax.envs.dmc`.
* ``"brax:<env>"`` (e.g. ``"brax:halfcheetah"``) -> :class:`BraxEnv` with pure ``reset(key) -> State`` and
  ``step(State, action) -> State`` for ``jit``/``vmap``/``lax.scan``, and accessors ``obs``, ``final_obs``,
  ``reward``, ``done``, ``truncation``, ``terminated``. See :mod:`lpjax.envs.brax_env`.

Name, argument and backend errors raise ``ValueError`` with the valid choices before dm_control or brax is
imported. dm_control and brax are optional dependencies (extras ``[dmc]`` and ``[brax]``), imported on first
use; this package imports nothing else from lpjax.
"""

from __future__ import annotations

from typing import Any

from lpjax.envs.brax_env import BRAX_BACKENDS, BRAX_ENVS, DEFAULT_BRAX_BACKEND, BraxEnv, make_brax
from lpjax.envs.evaluation import EVAL_SEED_OFFSET, NonFiniteAction, evaluate_policy
from lpjax.envs.dmc import DMC_TASKS, PIXEL_ACTION_REPEAT, DMCEnv, default_action_repeat, make_dmc, parse_task

__all__ = [
    "BRAX_BACKENDS",
    "BRAX_ENVS",
    "DEFAULT_BRAX_BACKEND",
    "DMC_TASKS",
    "EVAL_SEED_OFFSET",
    "PIXEL_ACTION_REPEAT",
    "PREFIXES",
    "BraxEnv",
    "DMCEnv",
    "NonFiniteAction",
    "default_action_repeat",
    "evaluate_policy",
    "make",
    "make_brax",
    "make_dmc",
    "parse_task",
]

PREFIXES = ("dmc", "brax")


def make(name: str, *, seed: int, backend: str | None = None, **options: Any) -> DMCEnv | BraxEnv:
    """Builds the environment ``name = "<prefix>:<env>"`` with ``prefix`` in ``PREFIXES``.

    Args:
      name: ``"dmc:<domain>-<task>"`` or ``"brax:<env>"``.
      seed: dm_control: seeds the task's random state (same seed + same actions -> same observations).
        brax: stored as ``env.seed``; ``reset`` takes its own key.
    Keyword options (``pixels``, ``action_repeat``, ``frame_stack``, ``image_size``, ``episode_length``,
    ``camera_id``) are those of :class:`DMCEnv`; brax takes ``episode_length`` and ``action_repeat`` only.

      pixels: dm_control only: stacked uint8 RGB frames ``(image_size, image_size, 3 * frame_stack)`` instead of
        flat float32 states.
      action_repeat: control steps per agent step, rewards summed. ``None``: dm_control from pixels, the paper's
        Table 8 (2 for unlisted tasks); otherwise 1.
      frame_stack, image_size, camera_id: dm_control pixel settings (camera ``None``: 0, quadruped 2).
      episode_length: agent steps per episode (after action repeat). ``None``: dm_control
        ``1000 // action_repeat``; brax 1000.
      backend: brax physics backend (``BRAX_BACKENDS``); ``None`` means ``DEFAULT_BRAX_BACKEND``.

    Raises:
      ValueError: unknown prefix, env, task or backend (listing the valid ones), or an option that does not apply.
    """
    prefix, sep, rest = name.partition(":")
    if not sep or prefix not in PREFIXES:
        raise ValueError(f"Environment names look like '<prefix>:<env>' with prefix in {list(PREFIXES)}, got {name!r}.")
    if prefix == "dmc":
        if backend is not None:
            raise ValueError(f"backend={backend!r} applies to brax envs only, not {name!r}.")
        return make_dmc(rest, seed=seed, **options)
    brax_options = {"episode_length": 1000, "action_repeat": 1}
    for option, value in options.items():
        if option not in brax_options:
            raise ValueError(f"{option}={value!r} is supported for dm_control envs only, not {name!r}.")
        if value is not None:
            brax_options[option] = value
    return make_brax(rest, backend=backend, seed=seed, **brax_options)
