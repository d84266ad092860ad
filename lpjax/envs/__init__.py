"""Environments for the lpjax learners: dm_control (host-side), brax and MJX (pure, jittable).

``make(name, *, seed, ...)`` dispatches on the name's prefix:

* ``"dmc:<domain>-<task>"`` (e.g. ``"dmc:cheetah-run"``, ``"dmc:ball_in_cup-catch"``) -> :class:`DMCEnv`, a
  host-side env for an SAC host loop: ``reset() -> obs``, ``step(action) -> (obs, reward, terminated,
  truncated)``, ``observation_shape``, ``observation_dtype``, ``action_dim``, ``action_low``/``action_high``
  (always -1/1), ``episode_length`` (agent steps), ``action_repeat``. See :mod:`lpjax.envs.dmc`.
* ``"brax:<env>"`` (e.g. ``"brax:halfcheetah"``) -> :class:`BraxEnv`, and ``"mjx:<domain>-<task>"`` (e.g.
  ``"mjx:cartpole-swingup"``; ``"playground:"`` is an alias) -> :class:`MjxEnv`, the DeepMind Control Suite
  tasks of MuJoCo Playground with dm_control's names and time conventions. Both are :class:`JittedEnv`: pure
  ``reset(key) -> State`` and ``step(State, action) -> State`` for ``jit``/``vmap``/``lax.scan``, and accessors
  ``obs``, ``final_obs``, ``reward``, ``done``, ``truncation``, ``terminated``. See :mod:`lpjax.envs.jitted`,
  :mod:`lpjax.envs.brax_env` and :mod:`lpjax.envs.mjx_env`.

Name, argument and backend errors raise ``ValueError`` with the valid choices before dm_control, brax or
Playground is imported. They are optional dependencies (extras ``[dmc]``, ``[brax]`` and ``[mjx]``), imported on
first use; this package imports nothing else from lpjax.
"""

from __future__ import annotations

from typing import Any

from lpjax.envs.brax_env import BRAX_BACKENDS, BRAX_ENVS, DEFAULT_BRAX_BACKEND, BraxEnv, make_brax
from lpjax.envs.dmc import DMC_TASKS, PIXEL_ACTION_REPEAT, DMCEnv, default_action_repeat, make_dmc, parse_task
from lpjax.envs.evaluation import EVAL_SEED_OFFSET, NonFiniteAction, evaluate_policy
from lpjax.envs.jitted import JittedEnv
from lpjax.envs.mjx_env import MJX_TASKS, MjxEnv, load_playground, make_mjx, playground_name

__all__ = [
    "BRAX_BACKENDS",
    "BRAX_ENVS",
    "DEFAULT_BRAX_BACKEND",
    "DMC_TASKS",
    "EVAL_SEED_OFFSET",
    "JITTED_PREFIXES",
    "MJX_TASKS",
    "PIXEL_ACTION_REPEAT",
    "PREFIXES",
    "BraxEnv",
    "DMCEnv",
    "JittedEnv",
    "MjxEnv",
    "NonFiniteAction",
    "default_action_repeat",
    "evaluate_policy",
    "is_jitted",
    "load_playground",
    "make",
    "make_brax",
    "make_dmc",
    "make_mjx",
    "parse_task",
    "playground_name",
]

PREFIXES = ("dmc", "brax", "mjx", "playground")
JITTED_PREFIXES = ("brax", "mjx", "playground")
_JITTED_OPTIONS = ("episode_length", "action_repeat")


def is_jitted(name: str) -> bool:
    """Whether ``name`` is a pure, jittable env (``brax:``, ``mjx:``, ``playground:``), not a host-side one."""
    return name.partition(":")[0] in JITTED_PREFIXES


def make(name: str, *, seed: int, backend: str | None = None, **options: Any) -> DMCEnv | BraxEnv | MjxEnv:
    """Builds the environment ``name = "<prefix>:<env>"`` with ``prefix`` in ``PREFIXES``.

    Args:
      name: ``"dmc:<domain>-<task>"``, ``"brax:<env>"`` or ``"mjx:<domain>-<task>"`` (alias
        ``"playground:<domain>-<task>"``).
      seed: dm_control: seeds the task's random state (same seed + same actions -> same observations).
        brax, MJX: stored as ``env.seed``; ``reset`` takes its own key.
    Keyword options (``pixels``, ``action_repeat``, ``frame_stack``, ``image_size``, ``episode_length``,
    ``camera_id``) are those of :class:`DMCEnv`; brax and MJX take ``episode_length`` and ``action_repeat`` only.

      pixels: dm_control only: stacked uint8 RGB frames ``(image_size, image_size, 3 * frame_stack)`` instead of
        flat float32 states.
      action_repeat: control steps per agent step, rewards summed. ``None``: dm_control from pixels, the paper's
        Table 8 (2 for unlisted tasks); otherwise 1.
      frame_stack, image_size, camera_id: dm_control pixel settings (camera ``None``: 0, quadruped 2).
      episode_length: agent steps per episode (after action repeat). ``None``: dm_control and MJX
        ``1000 // action_repeat``; brax 1000.
      backend: brax physics backend (``BRAX_BACKENDS``); ``None`` means ``DEFAULT_BRAX_BACKEND``.

    Raises:
      ValueError: unknown prefix, env, task or backend (listing the valid ones), or an option that does not apply.
    """
    prefix, sep, rest = name.partition(":")
    if not sep or prefix not in PREFIXES:
        raise ValueError(f"Environment names look like '<prefix>:<env>' with prefix in {list(PREFIXES)}, got {name!r}.")
    if prefix != "brax" and backend is not None:
        raise ValueError(f"backend={backend!r} applies to brax envs only, not {name!r}.")
    if prefix == "dmc":
        return make_dmc(rest, seed=seed, **options)
    for option, value in options.items():
        if option not in _JITTED_OPTIONS:
            raise ValueError(f"{option}={value!r} is supported for dm_control envs only, not {name!r}.")
    jitted_options = {option: value for option, value in options.items() if value is not None}
    if prefix == "brax":
        return make_brax(rest, backend=backend, seed=seed, **jitted_options)
    return make_mjx(rest, seed=seed, **jitted_options)
