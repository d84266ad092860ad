"""dm_control suite tasks behind a tiny host-side API for an SAC host loop.

``make_dmc("cheetah-run", seed=0)`` (or ``lpjax.envs.make("dmc:cheetah-run", seed=0)``) returns a
:class:`DMCEnv`::

    env = make_dmc("walker-walk", seed=0, pixels=True)   # action repeat 2 (Table 8), 500 agent steps
    obs = env.reset()                                     # uint8 (84, 84, 9): 3 RGB frames, newest last
    obs, reward, terminated, truncated = env.step(action) # action: float, shape (env.action_dim,), in [-1, 1]

* **Observations.** States: the task's observation dict flattened in its own order, ``float32``, shape
  ``(n,)``. Pixels: ``uint8`` HWC renders of ``camera_id`` (0; 2 for quadruped, as is standard) of size
  ``image_size``; the last ``frame_stack`` frames are concatenated on the channel axis, oldest first, so
  ``obs[..., -3:]`` is the newest frame. ``reset`` fills the stack with copies of the first frame.
* **Actions.** The agent always sees ``[-1, 1]^action_dim``. Actions are validated (shape ``(action_dim,)``,
  finite: NaN/inf raise ``ValueError``), clipped to ``[-1, 1]`` and mapped affinely onto the task's bounds. All
  suite tasks have bounds ``[-1, 1]`` (the map is then the identity) except quadruped (``[-1, 1.1]`` and
  ``[-0.8, 0.8]`` per joint); tasks with unbounded actions (``lqr``) are not offered.
* **Action repeat.** One agent step applies the action ``action_repeat`` times and returns the *sum* of the
  rewards. Default: 1 from states; from pixels the paper's Table 8 (after Hafner et al. 2019): cartpole-swingup 8,
  reacher-easy 4, cheetah-run 4, finger-spin 2, ball_in_cup-catch 4, walker-walk 2, and 2 for other tasks.
  Pixels are rendered once per agent step, after the repeats.
* **Episode end.** Suite tasks end only by their time limit (1000 control steps), so ``episode_length``
  defaults to ``1000 // action_repeat`` agent steps; the last step returns ``terminated=False,
  truncated=True``: the learner should bootstrap through it (as ``pytorch_sac`` does). dm_control's own time
  limit is switched off and the episode is counted here, so ``episode_length`` may also exceed the default. A
  task termination (a final discount of 0 from dm_control) would return ``terminated=True``. Calling ``step``
  after the end (or before the first ``reset``) raises ``RuntimeError``.
* **Seeding.** ``seed`` seeds the task's ``RandomState`` (initial states of successive episodes); two envs with
  the same seed and the same actions give identical observations and rewards, pixels included.

Rendering needs an OpenGL backend; headless this is EGL or OSMesa. If ``MUJOCO_GL`` is unset it is set before
dm_control is imported: ``egl`` if ``libEGL`` is found, else ``osmesa`` if ``libOSMesa`` is found. If the chosen
backend then fails to load (for example no EGL device), the import is retried with the other headless backend
if its library is found, and failing that with rendering disabled, so state-based tasks still work;
``pixels=True`` then raises ``RuntimeError`` with what to install. On Debian/Ubuntu EGL comes from ``libegl1
libegl-mesa0 libgl1-mesa-dri`` (software llvmpipe without a GPU) and OSMesa from ``libosmesa6``; the Python side
(``PyOpenGL``) comes with dm_control.

Cost: a software render (llvmpipe) of an 84x84 frame costs far more than a physics step, so pixel envs are
render-bound; docs/guide.md ("Training SAC in low precision") gives the step rates.
"""

from __future__ import annotations

import collections
import ctypes.util
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from lpjax._optional import check

__all__ = [
    "DMC_TASKS",
    "PIXEL_ACTION_REPEAT",
    "DMCEnv",
    "default_action_repeat",
    "make_dmc",
    "parse_task",
]

# (domain, task) pairs of dm_control.suite.ALL_TASKS (dm_control 1.0.50), without the unbounded-action,
# infinite-horizon lqr domain. tests/envs/test_dmc.py checks this table against the installed dm_control.
DMC_TASKS: dict[str, tuple[str, ...]] = {
    "acrobot": ("swingup", "swingup_sparse"),
    "ball_in_cup": ("catch",),
    "cartpole": ("balance", "balance_sparse", "swingup", "swingup_sparse", "two_poles", "three_poles"),
    "cheetah": ("run",),
    "dog": ("stand", "walk", "trot", "run", "fetch"),
    "finger": ("spin", "turn_easy", "turn_hard"),
    "fish": ("upright", "swim"),
    "hopper": ("stand", "hop"),
    "humanoid": ("stand", "walk", "run", "run_pure_state"),
    "humanoid_CMU": ("stand", "walk", "run"),
    "manipulator": ("bring_ball", "bring_peg", "insert_ball", "insert_peg"),
    "pendulum": ("swingup",),
    "point_mass": ("easy", "hard"),
    "quadruped": ("walk", "run", "escape", "fetch"),
    "reacher": ("easy", "hard"),
    "stacker": ("stack_2", "stack_4"),
    "swimmer": ("swimmer6", "swimmer15"),
    "walker": ("stand", "walk", "run"),
}

# Paper Table 8 (from Hafner et al., 2019): action repeat for SAC from pixels.
PIXEL_ACTION_REPEAT: dict[str, int] = {
    "cartpole-swingup": 8,
    "reacher-easy": 4,
    "cheetah-run": 4,
    "finger-spin": 2,
    "ball_in_cup-catch": 4,
    "walker-walk": 2,
}
_DEFAULT_PIXEL_ACTION_REPEAT = 2
_CONTROL_STEPS_PER_EPISODE = 1000  # every task in DMC_TASKS: time_limit / control_timestep == 1000
_CAMERA_ID = {"quadruped": 2}


def parse_task(task_name: str) -> tuple[str, str]:
    """Splits ``"<domain>-<task>"`` (e.g. ``"ball_in_cup-catch"``) into ``(domain, task)``.

    Raises:
      ValueError: malformed name or unknown domain/task, listing the valid choices.
    """
    domain, sep, task = task_name.partition("-")
    if not sep or not domain or not task:
        raise ValueError(f"dm_control task names look like 'cheetah-run' ('<domain>-<task>'), got {task_name!r}.")
    if domain not in DMC_TASKS:
        raise ValueError(f"Unknown dm_control domain {domain!r}; valid domains: {sorted(DMC_TASKS)}.")
    if task not in DMC_TASKS[domain]:
        valid = list(DMC_TASKS[domain])
        raise ValueError(f"Unknown task {task!r} for dm_control domain {domain!r}; valid tasks: {valid}.")
    return domain, task


def default_action_repeat(task_name: str, pixels: bool) -> int:
    """The action repeat used when none is given: Table 8 (else 2) from pixels, 1 from states."""
    if not pixels:
        return 1
    return PIXEL_ACTION_REPEAT.get(task_name, _DEFAULT_PIXEL_ACTION_REPEAT)


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {bounds}, got {value}.")
    return value


# --------------------------------------------------------------------------------------------------------------
# Importing dm_control with a working (headless) OpenGL backend.


_GL_LIBRARIES = {"egl": "EGL", "osmesa": "OSMesa"}  # headless MUJOCO_GL backends, in order of preference


def default_gl_backend(find_library: Callable[[str], str | None] = ctypes.util.find_library) -> str | None:
    """``MUJOCO_GL`` to use when it is unset: ``egl``, else ``osmesa``, else ``None`` (dm_control picks)."""
    return next((gl for gl, lib in _GL_LIBRARIES.items() if find_library(lib)), None)


def _purge_modules(*prefixes: str) -> None:
    for name in list(sys.modules):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            del sys.modules[name]


def _import_suite():
    """Imports ``dm_control.suite``, choosing and if needed falling back the OpenGL backend (see module doc)."""
    for name in ("dm_control", "mujoco"):  # installed? (imported below, under the OpenGL fallback)
        check(name, "dmc")
    if "dm_control.suite" in sys.modules:
        return sys.modules["dm_control.suite"]
    if "MUJOCO_GL" not in os.environ:
        backend = default_gl_backend()
        if backend is not None:
            os.environ["MUJOCO_GL"] = backend
    pyopengl_platform = os.environ.get("PYOPENGL_PLATFORM")
    tried: list[str] = []
    while True:
        try:
            from dm_control import suite

            return suite
        except Exception as err:
            current = os.environ.get("MUJOCO_GL", "")
            if current not in _GL_LIBRARIES:
                raise
            tried.append(current)
            untried = [gl for gl, lib in _GL_LIBRARIES.items() if gl not in tried and ctypes.util.find_library(lib)]
            fallback = untried[0] if untried else "disable"
            warnings.warn(
                f"dm_control could not load the MUJOCO_GL={current!r} rendering backend ({err}); retrying with "
                f"MUJOCO_GL={fallback!r}."
                + (" Rendering (pixels=True) is unavailable." if fallback == "disable" else ""),
                RuntimeWarning,
                stacklevel=3,
            )
            os.environ["MUJOCO_GL"] = fallback
            # The failed backend import set PYOPENGL_PLATFORM and imported PyOpenGL for it: undo both.
            if pyopengl_platform is None:
                os.environ.pop("PYOPENGL_PLATFORM", None)
            else:
                os.environ["PYOPENGL_PLATFORM"] = pyopengl_platform
            _purge_modules("dm_control", "OpenGL")


_RENDER_HELP = (
    "Rendering dm_control pixels needs a headless OpenGL backend: set MUJOCO_GL=egl (Debian/Ubuntu packages "
    "libegl1 libegl-mesa0 libgl1-mesa-dri, or an NVIDIA driver) or MUJOCO_GL=osmesa (package libosmesa6) before "
    "dm_control is imported."
)


# --------------------------------------------------------------------------------------------------------------


class DMCEnv:
    """A dm_control suite task with action repeat, [-1, 1] actions, flat or pixel observations.

    Attributes:
      name: ``"<domain>-<task>"``.
      seed: seed of the task's random state.
      pixels: whether observations are stacked RGB frames (else flat float32 states).
      action_repeat: control steps per agent step (rewards are summed).
      episode_length: agent steps per episode (the last one returns ``truncated=True``).
      frame_stack, image_size, camera_id: pixel settings (unused from states).
      observation_shape: ``(n,)`` from states, ``(image_size, image_size, 3 * frame_stack)`` from pixels.
      observation_dtype: ``float32`` from states, ``uint8`` from pixels.
      action_dim: size of the action vector.
      action_low, action_high: ``float32`` arrays of ``-1`` and ``1``, shape ``(action_dim,)``.
    """

    def __init__(
        self,
        task_name: str,
        *,
        seed: int,
        pixels: bool = False,
        action_repeat: int | None = None,
        frame_stack: int = 3,
        image_size: int = 84,
        episode_length: int | None = None,
        camera_id: int | None = None,
    ):
        domain, task = parse_task(task_name)
        self.name = task_name
        self.domain, self.task = domain, task
        self.seed = _check_int("seed", seed, 0, 2**32 - 1)
        self.pixels = bool(pixels)
        if action_repeat is None:
            action_repeat = default_action_repeat(task_name, self.pixels)
        self.action_repeat = _check_int("action_repeat", action_repeat, 1)
        if episode_length is None:
            episode_length = max(1, _CONTROL_STEPS_PER_EPISODE // self.action_repeat)
        self.episode_length = _check_int("episode_length", episode_length, 1)
        self.frame_stack = _check_int("frame_stack", frame_stack, 1)
        self.image_size = _check_int("image_size", image_size, 1)
        self.camera_id = _check_int("camera_id", _CAMERA_ID.get(domain, 0) if camera_id is None else camera_id, 0)

        suite = _import_suite()
        # dm_control's time limit is disabled: episodes are counted in agent steps here.
        self._env = suite.load(domain, task, task_kwargs={"random": self.seed, "time_limit": float("inf")})

        spec = self._env.action_spec()
        low = np.broadcast_to(np.asarray(spec.minimum, np.float64), spec.shape)
        high = np.broadcast_to(np.asarray(spec.maximum, np.float64), spec.shape)
        if len(spec.shape) != 1 or not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low < high)):
            raise ValueError(f"{task_name}: unsupported action spec {spec} (need finite bounds, low < high, 1-D).")
        self.action_dim = int(spec.shape[0])
        self._raw_low, self._raw_high = low.copy(), high.copy()
        self._unit_bounds = bool(np.all(low == -1.0) and np.all(high == 1.0))
        self.action_low = -np.ones(self.action_dim, np.float32)
        self.action_high = np.ones(self.action_dim, np.float32)

        if self.pixels:
            self.observation_shape = (self.image_size, self.image_size, 3 * self.frame_stack)
            self.observation_dtype = np.dtype(np.uint8)
            try:
                self._render()
            except Exception as err:
                message = f"{task_name}: rendering failed ({type(err).__name__}: {err}). {_RENDER_HELP}"
                raise RuntimeError(message) from err
        else:
            size = sum(int(np.prod(s.shape)) for s in self._env.observation_spec().values())
            self.observation_shape = (size,)
            self.observation_dtype = np.dtype(np.float32)
        self._frames: collections.deque[np.ndarray] = collections.deque(maxlen=self.frame_stack)
        self._steps = 0
        self._needs_reset = True

    # -- public API ---------------------------------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Starts a new episode and returns its first observation.

        ``seed`` re-seeds the task's random state first, so the episode's initial state depends on ``seed``
        alone (a training loop that seeds every episode can resume mid-run without saving the env's RNG).
        """
        if seed is not None:
            self._env.task.random.seed(seed)
        time_step = self._env.reset()
        self._steps = 0
        self._needs_reset = False
        if not self.pixels:
            return self._flatten(time_step.observation)
        frame = self._render()
        for _ in range(self.frame_stack):
            self._frames.append(frame)
        return self._stacked()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool]:
        """Applies ``action`` ``action_repeat`` times; returns ``(obs, reward_sum, terminated, truncated)``.

        Raises:
          ValueError: ``action`` has the wrong shape or a non-finite entry.
          RuntimeError: the episode is over (or never started): call ``reset()``.
        """
        if self._needs_reset:
            raise RuntimeError(f"{self.name}: call reset() before step() (at the start and after an episode ends).")
        raw_action = self._to_raw_action(action)
        reward = 0.0
        terminated = False
        for _ in range(self.action_repeat):
            time_step = self._env.step(raw_action)
            reward += float(time_step.reward or 0.0)
            if time_step.last():  # a task termination: dm_control's own time limit is off
                terminated = time_step.discount == 0.0
                break
        self._steps += 1
        truncated = not terminated and (time_step.last() or self._steps >= self.episode_length)
        self._needs_reset = terminated or truncated
        if self.pixels:
            self._frames.append(self._render())
            obs = self._stacked()
        else:
            obs = self._flatten(time_step.observation)
        return obs, reward, bool(terminated), bool(truncated)

    def render(self, size: int | None = None) -> np.ndarray:
        """An RGB frame ``uint8 (size, size, 3)`` of the current state (e.g. for videos), default ``image_size``."""
        return self._render(size)

    @property
    def unwrapped(self):
        """The underlying ``dm_control.rl.control.Environment`` (time limit disabled)."""
        return self._env

    def close(self) -> None:
        self._env.close()

    def __repr__(self) -> str:
        kind = f"pixels {self.observation_shape}" if self.pixels else f"states {self.observation_shape}"
        return (
            f"DMCEnv({self.name!r}, seed={self.seed}, {kind}, action_dim={self.action_dim}, "
            f"action_repeat={self.action_repeat}, episode_length={self.episode_length})"
        )

    # -- helpers -----------------------------------------------------------------------------------------------

    def _to_raw_action(self, action: Any) -> np.ndarray:
        try:
            action = np.asarray(action, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{self.name}: action must be a float array of shape ({self.action_dim},): {err}") from err
        if action.shape != (self.action_dim,):
            raise ValueError(f"{self.name}: action must have shape ({self.action_dim},), got {action.shape}.")
        if not np.all(np.isfinite(action)):
            raise ValueError(f"{self.name}: action has non-finite entries (NaN or inf): {action}.")
        action = np.clip(action, -1.0, 1.0)
        if self._unit_bounds:
            return action
        return self._raw_low + (action + 1.0) * 0.5 * (self._raw_high - self._raw_low)

    @staticmethod
    def _flatten(observation: dict[str, Any]) -> np.ndarray:
        return np.concatenate([np.asarray(v, np.float32).ravel() for v in observation.values()])

    def _render(self, size: int | None = None) -> np.ndarray:
        size = self.image_size if size is None else size
        return self._env.physics.render(height=size, width=size, camera_id=self.camera_id)

    def _stacked(self) -> np.ndarray:
        return np.concatenate(list(self._frames), axis=-1)


def make_dmc(task_name: str, **options: Any) -> DMCEnv:
    """Builds a :class:`DMCEnv` for ``task_name = "<domain>-<task>"``; ``options`` are its keyword arguments."""
    return DMCEnv(task_name, **options)
