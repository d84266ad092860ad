"""Brax environments as pure, jittable ``reset``/``step`` functions (one environment; ``vmap`` for batches).

``make_brax("halfcheetah")`` (or ``lpjax.envs.make("brax:halfcheetah", seed=0)``) returns a :class:`BraxEnv`::

    env = make_brax("halfcheetah", episode_length=1000)
    reset = jax.jit(jax.vmap(env.reset))                 # keys (B,) -> batched State
    step = jax.jit(jax.vmap(env.step))                   # (State, actions (B, action_size)) -> State
    state = reset(jax.random.split(jax.random.key(0), 64))
    state = step(state, actions)
    BraxEnv.obs(state), BraxEnv.reward(state), BraxEnv.done(state), BraxEnv.truncation(state)

The wrapped env is ``brax.envs.get_environment(name, backend=...)``; episode limit, action repeat, auto-reset and
the accessors are :class:`lpjax.envs.jitted.JittedEnv`'s (see its module for the conventions). brax's own
``brax.envs.create`` counts ``episode_length`` in physics-env steps instead of agent steps (identical for
``action_repeat=1``), and brax's own SAC drops truncated transitions from the critic loss instead of
bootstrapping through them.

The default backend is ``spring``, the fastest on CPU (docs/guide.md, "Training SAC in low precision"). The
backends are different physics: ``spring`` and ``positional`` halfcheetah use a smaller timestep (16 substeps)
and different gears than ``generalized``/``mjx``, so returns are not comparable across backends.
"""

from __future__ import annotations

from lpjax._optional import require
from lpjax.envs.jitted import JittedEnv

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


class BraxEnv(JittedEnv):
    """A brax env with episode limit, action repeat and auto-reset, as pure functions of one environment.

    Attributes (besides :class:`~lpjax.envs.jitted.JittedEnv`'s):
      backend: physics backend (one of ``BRAX_BACKENDS``).
      env: the wrapped ``brax.envs.Env``.
    """

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
        self.backend = backend

        def build():
            envs = require("brax.envs", "brax")  # optional and slow to import: on first use

            return envs.get_environment(name, backend=backend)

        super().__init__(
            name,
            build,
            physics_field="pipeline_state",
            episode_length=episode_length,
            action_repeat=action_repeat,
            seed=seed,
        )

    def _describe(self) -> str:
        return f"backend={self.backend!r}, "


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
