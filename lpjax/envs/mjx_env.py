"""DeepMind Control Suite tasks in MJX (MuJoCo Playground) as pure, jittable ``reset``/``step`` functions.

``make_mjx("cartpole-swingup")`` (or ``lpjax.envs.make("mjx:cartpole-swingup", seed=0)``; ``"playground:"`` is an
alias of ``"mjx:"``) returns an :class:`MjxEnv`, used exactly like :class:`lpjax.envs.BraxEnv`::

    env = make_mjx("cartpole-swingup")
    state = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(0), 64))
    state = jax.jit(jax.vmap(env.step))(state, actions)   # actions (64, env.action_dim) in [-1, 1]
    MjxEnv.obs(state), MjxEnv.reward(state), MjxEnv.final_obs(state), MjxEnv.terminated(state)

Episode limit, action repeat, auto-reset and the accessors are :class:`lpjax.envs.jitted.JittedEnv`'s.

* **Names.** The dm_control names of :mod:`lpjax.envs.dmc` (``"<domain>-<task>"``), mapped to Playground's
  ``mujoco_playground.dm_control_suite`` names by ``MJX_TASKS`` (every suite task Playground implements;
  ``tests/envs/test_mjx_env.py`` checks the table against both registries).
* **Time: the conventions of** :mod:`lpjax.envs.dmc`. One step of a Playground suite env is one control step
  of ``ctrl_dt``, which for every task in ``MJX_TASKS`` equals dm_control's control timestep, and Playground's
  ``episode_length`` (1000) counts control steps, as dm_control's time limit does (1000 control steps). lpjax
  applies the action repeat and the episode limit itself, so ``action_repeat`` (default 1: states) is the
  number of control steps per agent step, rewards summed, and ``episode_length`` counts agent steps, default
  Playground's ``episode_length // action_repeat`` = dm_control's ``1000 // action_repeat``. The
  ``action_repeat`` and ``episode_length`` entries of Playground's env config are read only by Playground's own
  training scripts (``wrap_for_brax_training``), never here. ``mjx:`` and ``dmc:`` with the same
  ``action_repeat`` are therefore the same episodes in simulated time and in agent steps.
* **Physics.** The same models and rewards, simulated by MJX's JAX implementation (``impl="jax"``, runs on CPU
  and GPU; Playground's default ``"warp"`` needs an NVIDIA GPU) in float32, with Playground's integrator and
  simulation timestep (some differ from dm_control's: e.g. cartpole uses Euler instead of RK4, finger a 5 ms
  instead of 10 ms physics step), so trajectories are not bit-identical to dm_control's; observation and action
  sizes are the same, and random-policy returns agree (``tests/envs/test_mjx_env.py``).
* **Episode end.** Playground's suite tasks set ``done`` only when the physics state becomes NaN, a
  termination; otherwise episodes end by the time limit (truncation), as in dm_control.
* **States only**: Playground's pixel observations need its batch renderer; ``pixels=True`` is a dm_control
  option.

Compatibility: Playground 0.2.0's reacher compares mujoco version strings as text and then calls
``mujoco.MjSpec.find_body``, which mujoco >= 3.3 calls ``MjSpec.body``; while a Playground env is built, the old
name is provided if it is missing.
"""

from __future__ import annotations

import contextlib
from typing import Any

from lpjax._optional import require
from lpjax.envs.jitted import JittedEnv, check_positive_int

__all__ = ["MJX_IMPL", "MJX_TASKS", "MjxEnv", "load_playground", "make_mjx", "playground_name"]

# dm_control name -> mujoco_playground.dm_control_suite name (playground 0.2.0); tests/envs/test_mjx_env.py checks
# it against both registries.
MJX_TASKS: dict[str, str] = {
    "acrobot-swingup": "AcrobotSwingup",
    "acrobot-swingup_sparse": "AcrobotSwingupSparse",
    "ball_in_cup-catch": "BallInCup",
    "cartpole-balance": "CartpoleBalance",
    "cartpole-balance_sparse": "CartpoleBalanceSparse",
    "cartpole-swingup": "CartpoleSwingup",
    "cartpole-swingup_sparse": "CartpoleSwingupSparse",
    "cheetah-run": "CheetahRun",
    "finger-spin": "FingerSpin",
    "finger-turn_easy": "FingerTurnEasy",
    "finger-turn_hard": "FingerTurnHard",
    "fish-swim": "FishSwim",
    "hopper-hop": "HopperHop",
    "hopper-stand": "HopperStand",
    "humanoid-run": "HumanoidRun",
    "humanoid-stand": "HumanoidStand",
    "humanoid-walk": "HumanoidWalk",
    "pendulum-swingup": "PendulumSwingup",
    "point_mass-easy": "PointMass",
    "reacher-easy": "ReacherEasy",
    "reacher-hard": "ReacherHard",
    "swimmer-swimmer6": "SwimmerSwimmer6",
    "walker-run": "WalkerRun",
    "walker-stand": "WalkerStand",
    "walker-walk": "WalkerWalk",
}
MJX_IMPL = "jax"  # MJX's JAX implementation (CPU and GPU); see the module docstring


def playground_name(task_name: str) -> str:
    """Playground's name of the dm_control task ``task_name``; ``ValueError`` listing the valid names if none."""
    if task_name not in MJX_TASKS:
        raise ValueError(f"Unknown MJX task {task_name!r}; valid names: {list(MJX_TASKS)}.")
    return MJX_TASKS[task_name]


@contextlib.contextmanager
def _mjspec_find_body():
    """Provides ``mujoco.MjSpec.find_body`` (see the module docstring) while the block runs, if it is missing."""
    mujoco = require("mujoco", "mjx")

    if hasattr(mujoco.MjSpec, "find_body"):
        yield
        return
    mujoco.MjSpec.find_body = mujoco.MjSpec.body
    try:
        yield
    finally:
        del mujoco.MjSpec.find_body


def load_playground(task_name: str):
    """The bare Playground env of ``task_name`` (a ``mujoco_playground.MjxEnv``), simulated with ``MJX_IMPL``."""
    name = playground_name(task_name)
    dm_control_suite = require("mujoco_playground", "mjx").dm_control_suite  # optional and slow to import

    with _mjspec_find_body():
        return dm_control_suite.load(name, config_overrides={"impl": MJX_IMPL})


class MjxEnv(JittedEnv):
    """A Playground DM Control Suite task with episode limit, action repeat and auto-reset, as pure functions.

    Attributes (besides :class:`~lpjax.envs.jitted.JittedEnv`'s):
      playground_name: Playground's name of the task (e.g. ``"CartpoleSwingup"``).
    """

    def __init__(
        self, name: str, *, episode_length: int | None = None, action_repeat: int | None = None, seed: int = 0
    ):
        self.playground_name = playground_name(name)
        action_repeat = check_positive_int("action_repeat", 1 if action_repeat is None else action_repeat)
        if episode_length is None:
            dm_control_suite = require("mujoco_playground", "mjx").dm_control_suite

            control_steps = dm_control_suite.get_default_config(self.playground_name).episode_length
            episode_length = max(1, control_steps // action_repeat)
        super().__init__(
            name,
            lambda: load_playground(name),
            physics_field="data",
            episode_length=episode_length,
            action_repeat=action_repeat,
            seed=seed,
        )


def make_mjx(task_name: str, **options: Any) -> MjxEnv:
    """Builds an :class:`MjxEnv` for ``task_name = "<domain>-<task>"``; ``options`` are its keyword arguments."""
    return MjxEnv(task_name, **options)
