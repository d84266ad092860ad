"""Training throughput of lpjax's fully jitted SAC loop against ``brax.training.agents.sac.train`` and, on MJX
cartpole-swingup, against lpjax's dm_control host loop.

Three learners, in environment steps per second, with matched hyper-parameters:

* ``lpjax_fp32`` / ``lpjax_fp16``: the jitted loop, :mod:`experiments.sac_brax_loop` (environments, replay buffer
  and SAC updates in one compiled ``lax.scan`` chunk), on ``brax:<env>`` or ``mjx:<domain>-<task>``;
* ``brax``: brax's own SAC on the same environment: the brax env, or the Playground env wrapped by
  ``mujoco_playground.wrapper.wrap_for_brax_training`` (as Playground's brax training scripts do), with
  ``impl="jax"`` (:data:`lpjax.envs.MJX_IMPL`);
* ``lpjax_host_fp32`` / ``lpjax_host_fp16`` (settings with a ``host_env``): the dm_control host loop,
  :mod:`experiments.sac_loop` (one host-side ``dmc:`` environment, one jitted action and one jitted
  record-and-update call per step), on the same task with the same agent.

================================  ==============================  ==========================================
setting                           lpjax (loop config / SACConfig) brax (``sac.train`` argument)
================================  ==============================  ==========================================
environment                       ``env`` (jitted loop),          ``environment`` (brax env, or Playground
                                  ``host_env`` (host loop)        env and ``wrap_env_fn``)
parallel environments             ``brax_num_envs`` (host: 1)     ``num_envs``
episode length                    1000 (lpjax.envs default)       ``episode_length=1000``
SAC updates per vectorized step   ``updates_per_step``            ``grad_updates_per_step``
batch size                        ``agent.batch_size``            ``batch_size``
networks (actor, 2 critics)       ``agent.hidden_dims``           ``network_factory=make_sac_networks(
                                                                  hidden_layer_sizes=...)``
replay capacity                   ``replay_capacity``             ``max_replay_size``
learning rate, discount, tau      ``agent.{actor,critic}_lr``,    ``learning_rate``, ``discounting``,
                                  ``agent.gamma``, ``agent.tau``  ``tau``
random steps before learning      ``seed_steps = 0``              ``min_replay_size = 0`` (no prefill)
observation normalization         none                            ``normalize_observations=False``
precision                         ``agent.policy = "fp32"``       float32 (brax's only precision)
================================  ==============================  ==========================================

Settings (``SETTINGS``; ``--settings`` picks, ``--num-envs`` etc. override), each with the target check
``lpjax_fp32 / brax >= 1``:

* ``brax_colab``: the sizes of brax's published SAC settings (its training colab's hopper SAC: 128 envs, batch
  512, 64 updates per vectorized step; ``make_sac_networks``' default 256x256 networks), on brax halfcheetah.
  The SAC updates take most of the time: it compares the learners' update steps.
* ``one_update``: brax halfcheetah, 128 envs, batch 256, one update per vectorized step. The environments take
  most of the time: it compares the loops around the update.
* ``mjx_cartpole``: the paper's protocol (one environment, one update per step) on MJX cartpole-swingup, at the
  CPU-affordable scale of ``benchmarks/sac_reproduction.py`` (256x256, batch 256), with the dm_control host loop
  on ``dmc:cartpole-swingup`` (the paper's task, the same SAC config) beside the jitted loop and brax.
* ``mjx_cartpole_128``: MJX cartpole-swingup with 128 environments and one update per vectorized step: what a
  jitted loop offers that a host loop cannot (dm_control's host loop steps one environment).

All learn from the first iteration on (one iteration: a policy step of every environment, the transitions into
the replay buffer, then the SAC updates), so every timed iteration does the same work on all sides. Remaining
differences are the algorithms' own: brax updates the temperature, critic and actor with three policy forward
passes and the target network every update; lpjax's SAC (``lpjax.agents.sac``) shares the actor's sample with
the temperature update and updates the target every ``target_update_period = 2`` updates.

**Interleaving.** Everything runs in one process. brax's ``train`` runs ``rounds + 1`` training epochs of
``iterations`` iterations each and calls its ``progress_fn`` after every epoch; that callback runs one round of
each lpjax variant, alternating their order. So round ``k`` of every variant runs at nearly the same time, and
machine noise hits them alike. A jitted round is one call of the compiled chunk
(``experiments.sac_brax_loop.chunk_fn``, the function the training loop calls), timed with
``block_until_ready``, as brax times its epochs (``training/sps``). A host round is
``experiments.sac_loop.train`` resumed from the previous round's checkpoint for ``iterations`` more steps; its
rate is the loop's own logged ``train/env_steps_per_s`` over those steps, which excludes the restore, the
evaluation and the checkpoint at the round's end. The first round of every variant (warm-up: compilation) is
excluded: reported per variant are the median, min and max over the ``rounds`` timed rounds, and ``ratio`` =
median over rounds of (lpjax fp32 / brax) in that round; with a host loop also ``jitted_over_host`` = median
over rounds of (lpjax fp32 / lpjax host fp32).

**No evaluation while timed.** brax evaluates after every epoch, outside its timed epochs; the evaluation env is
a stand-in (``NullEnv``: same observation and action sizes, nothing simulated) with one environment, so the
untimed evaluations cost neither compile time nor run time. The jitted lpjax variants do not evaluate here.

**Compile time** is measured separately: for the jitted lpjax variants, the wall time of ``chunk_fn``
(ahead-of-time ``jit(...).lower(...).compile()``); for all, the XLA backend-compile seconds reported by
``jax.monitoring`` (``/jax/core/compile/backend_compile_duration``) while each side compiles, and for brax the
first epoch's overhead (its wall time minus the median timed epoch's).

**Update profile** (``update_profile`` in the json; ``--no-profile`` skips it): one SAC update alone at the first
setting's sizes, lpjax fp32 (``lpjax.agents.sac.update``) against brax's update (``brax_sgd_step``: assembled
from brax's modules exactly as ``sac.train`` assembles its ``sgd_step``): XLA's flop count and number of matmuls
of one jitted update, and the time per update over interleaved rounds of a ``lax.scan`` of updates on fixed
random batches. It says whether a difference comes from the update or from the loop around it.

The fp16 variants use all of the paper's methods (``experiments/configs/sac/fp16.py``). On XLA:CPU float16 is
emulated (converted to float32 around the arithmetic), so fp16 is not expected to be faster here.

Compatibility: brax 0.14.2's ``sac.train`` calls ``jax.device_put_replicated``, removed in jax 0.10; while brax
trains, this benchmark provides it (stacked copies on the local devices).

The machine is shared, so single rounds vary by tens of percent, and a loaded machine slows every variant alike;
each setting records the run that measured it (``run``: command, date, package versions, machine with the load
average at the run's end), and the json has ``notes`` on what CPU timings do and do not say.

Run ``python -m benchmarks.sac_throughput`` (writes ``benchmarks/results/sac_throughput.{json,png}``, tens of
minutes on 2 cores); ``--settings`` runs some settings only, and the json keeps the other settings' earlier
results (and the earlier update profile with ``--no-profile``). ``--quick`` is one tiny setting, a smoke run,
not the measurement: it writes its own results only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import lpjax.envs
from benchmarks.common import command_line, write_results
from experiments import sac_brax_loop, sac_loop
from experiments.configs.sac import _base as sac_base
from lpjax.agents.sac import SACConfig
from lpjax.methods import PrecisionMethods
from lpjax.run_logging import read_metrics

RESULT_NAME = "sac_throughput"
TARGET_RATIO = 1.0
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
EPISODE_LENGTH = 1000  # lpjax.envs' default; passed to brax explicitly
LEARNING_RATE = 1e-4
GAMMA = 0.99
TAU = 0.005
PACKAGES = ("jax", "jaxlib", "brax", "playground", "mujoco", "mujoco-mjx", "dm_control")
NOTES = [
    "CPU only: 2 shared cores and XLA:CPU. Other jobs share the cores: each setting's run.machine.load_average "
    "(at the run's end) says how loaded the machine was; rounds are interleaved, so ratios within a setting are "
    "robust to the load while absolute rates are not.",
    "MJX and brax are built for accelerators; these figures say nothing about GPU throughput. With one "
    "environment (mjx_cartpole) an iteration is one environment step and one SAC update: the jitted loop runs "
    "both inside one compiled scan, while the host loop pays per step for a dm_control step from Python and two "
    "jitted calls with their host-device transfers. With 128 environments (mjx_cartpole_128) the jitted loop "
    "also vectorizes the environments, which the host loop cannot.",
    "Playground's default MJX implementation ('warp') needs an NVIDIA GPU; MJX runs with impl='jax' here.",
    "float16 is emulated on XLA:CPU (converted to float32 around the arithmetic): the fp16 variants are not "
    "expected to be faster here.",
]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One matched configuration of the learners, timed for ``rounds`` rounds of ``iterations`` iterations.

    ``env`` is the jitted loop's and brax's environment (``brax:<env>`` or ``mjx:<domain>-<task>``), ``backend``
    its brax backend (``None`` for MJX); ``host_env`` (``dmc:<domain>-<task>``, one environment only) adds the
    dm_control host loop on that task.
    """

    name: str
    description: str
    env: str = "brax:halfcheetah"
    backend: str | None = "spring"
    host_env: str | None = None
    num_envs: int = 128
    batch_size: int = 512
    updates_per_step: int = 64
    hidden: tuple[int, ...] = (256, 256)
    replay_size: int = 1_000_000
    iterations: int = 4
    rounds: int = 12

    @property
    def env_steps_per_round(self) -> int:
        return self.iterations * self.num_envs


SETTINGS = {
    setting.name: setting
    for setting in (
        Setting(
            "brax_colab",
            "sizes of brax's published SAC settings (128 envs, batch 512, 64 updates per "
            "vectorized step, 256x256): update-bound",
        ),
        Setting(
            "one_update",
            "128 envs, batch 256, 1 update per vectorized step: environment- and loop-bound",
            batch_size=256,
            updates_per_step=1,
            iterations=20,
        ),
        Setting(
            "mjx_cartpole",
            "the paper's protocol (1 env, 1 update per step) at 256x256, batch 256, on MJX "
            "cartpole-swingup; the dm_control host loop on dmc:cartpole-swingup",
            env="mjx:cartpole-swingup",
            backend=None,
            host_env="dmc:cartpole-swingup",
            num_envs=1,
            batch_size=256,
            updates_per_step=1,
            replay_size=10_000,
            iterations=200,
            rounds=8,
        ),
        Setting(
            "mjx_cartpole_128",
            "MJX cartpole-swingup, 128 envs, batch 256, 1 update per vectorized step",
            env="mjx:cartpole-swingup",
            backend=None,
            batch_size=256,
            updates_per_step=1,
            iterations=20,
            rounds=8,
        ),
    )
}
QUICK = Setting(
    "quick",
    "a smoke test, not a measurement",
    env="mjx:cartpole-swingup",
    backend=None,
    host_env="dmc:cartpole-swingup",
    num_envs=1,
    batch_size=32,
    updates_per_step=2,
    hidden=(32, 32),
    replay_size=4096,
    iterations=8,
    rounds=2,
)
OVERRIDABLE = (
    "env",
    "backend",
    "host_env",
    "num_envs",
    "batch_size",
    "updates_per_step",
    "hidden",
    "replay_size",
    "iterations",
    "rounds",
)
_TEXT_FIELDS = ("env", "backend", "host_env")


def _setting_error(setting: Setting) -> str | None:
    """Why ``setting`` cannot run, or ``None``."""
    prefix = setting.env.partition(":")[0]
    if not lpjax.envs.is_jitted(setting.env):
        return f"env must be 'brax:<env>' or 'mjx:<domain>-<task>', got {setting.env!r}"
    if (prefix == "brax") != (setting.backend is not None):
        return f"backend is for brax envs only (env {setting.env!r}, backend {setting.backend!r})"
    if setting.host_env is not None and not setting.host_env.startswith("dmc:"):
        return f"host_env must be 'dmc:<domain>-<task>', got {setting.host_env!r}"
    if setting.host_env is not None and setting.num_envs != 1:
        return f"the host loop steps one environment: host_env needs num_envs=1, got {setting.num_envs}"
    if setting.rounds < 1 or setting.iterations < 1:
        return "rounds and iterations must be >= 1"
    return None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one tiny setting: a smoke test, not the measurement")
    parser.add_argument(
        "--settings",
        default=",".join(SETTINGS),
        help=f"comma-separated settings to run, from {list(SETTINGS)} (default: all)",
    )
    for name in OVERRIDABLE:
        kind = (
            (lambda s: tuple(int(w) for w in s.split(",")))
            if name == "hidden"
            else ((lambda s: s or None) if name in _TEXT_FIELDS else int)
        )
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            default=argparse.SUPPRESS,
            help="override for every setting"
            + (" (widths, e.g. 256,256)" if name == "hidden" else " ('' for none)" if name in _TEXT_FIELDS else ""),
        )
    parser.add_argument("--no-fp16", action="store_true", help="skip the lpjax fp16 variants")
    parser.add_argument("--no-profile", action="store_true", help="skip the isolated one-update comparison")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        chosen = [QUICK]
    else:
        unknown = [n for n in args.settings.split(",") if n not in SETTINGS]
        if unknown:
            parser.error(f"unknown settings {unknown}; valid: {list(SETTINGS)}")
        chosen = [SETTINGS[n] for n in args.settings.split(",")]
    overrides = {name: getattr(args, name) for name in OVERRIDABLE if hasattr(args, name)}
    args.chosen = [dataclasses.replace(setting, **overrides) for setting in chosen]
    for setting in args.chosen:
        error = _setting_error(setting)
        if error:
            parser.error(f"setting {setting.name}: {error}")
    return args


class CompileTimer:
    """Sums ``jax.monitoring`` backend-compile durations into the currently open ``section``."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._current: str | None = None
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration: float, **_: Any) -> None:
        if event == BACKEND_COMPILE_EVENT and self._current is not None:
            self.seconds[self._current] = self.seconds.get(self._current, 0.0) + duration

    @contextlib.contextmanager
    def section(self, name: str | None):
        previous, self._current = self._current, name
        try:
            yield
        finally:
            self._current = previous


@contextlib.contextmanager
def brax_jax_compat():
    """Provides ``jax.device_put_replicated`` (removed in jax 0.10, still called by brax 0.14.2) while brax runs."""
    if hasattr(jax, "device_put_replicated"):
        try:
            jax.device_put_replicated  # noqa: B018  (jax 0.10 raises AttributeError on access)
            yield
            return
        except AttributeError:
            pass

    def device_put_replicated(x, devices):
        mesh = jax.sharding.Mesh(np.array(devices), ("devices",))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("devices"))
        return jax.tree.map(lambda a: jax.device_put(jnp.stack([jnp.asarray(a)] * len(devices)), sharding), x)

    jax.device_put_replicated = device_put_replicated
    try:
        yield
    finally:
        del jax.device_put_replicated


def null_env(observation_size: int, action_size: int):
    """A brax ``Env`` with the given sizes that simulates nothing: brax's (untimed) evaluations cost nothing."""
    from brax.envs.base import Env, State

    class NullEnv(Env):
        def reset(self, rng):
            del rng
            return State(
                pipeline_state=None,
                obs=jnp.zeros(observation_size),
                reward=jnp.zeros(()),
                done=jnp.zeros(()),
                metrics={},
                info={},
            )

        def step(self, state, action):
            del action
            return state.replace(reward=jnp.zeros(()), done=jnp.zeros(()))

        @property
        def observation_size(self):
            return observation_size

        @property
        def action_size(self):
            return action_size

        @property
        def backend(self):
            return "null"

    return NullEnv()


def brax_environment(env: str, backend: str | None):
    """brax's SAC's ``environment`` for ``env``: the brax env, or the bare Playground env (MJX)."""
    prefix, _, name = env.partition(":")
    if prefix == "brax":
        from brax import envs

        return envs.get_environment(name, backend=backend)
    return lpjax.envs.load_playground(name)


def brax_wrap(env, **kwargs):
    """brax's SAC's ``wrap_env_fn``: Playground's wrapper for a Playground env (as Playground's brax training
    scripts use), brax's own for a brax env (as ``sac.train`` does without one)."""
    from brax import envs
    from mujoco_playground import wrapper

    if isinstance(env, envs.Env):
        return envs.training.wrap(env, **kwargs)
    return wrapper.wrap_for_brax_training(env, **kwargs)


def agent_config(setting: Setting, policy: str) -> SACConfig:
    """The SAC config of ``setting``: fp32 without methods, or fp16 with all the paper's methods."""
    methods = PrecisionMethods.paper() if policy == "fp16" else PrecisionMethods()
    return SACConfig(
        policy=policy,
        hidden_dims=setting.hidden,
        batch_size=setting.batch_size,
        actor_lr=LEARNING_RATE,
        critic_lr=LEARNING_RATE,
        gamma=GAMMA,
        tau=TAU,
        methods=methods,
    )


def lpjax_settings(setting: Setting, policy: str) -> sac_brax_loop.LoopSettings:
    """The jitted loop's settings matching ``setting``."""
    return sac_brax_loop.LoopSettings(
        env=setting.env,
        backend=setting.backend,
        action_repeat=1,
        agent=agent_config(setting, policy),
        num_envs=setting.num_envs,
        seed_steps=0,
        updates_per_step=setting.updates_per_step,
        replay_capacity=setting.replay_size,
    )


def host_config(setting: Setting, policy: str, seed: int) -> ml_collections.ConfigDict:
    """The host loop's run config matching ``setting``, one round long: ``total_steps`` is set per round.

    Logs once per round (its rate over the round), evaluates one episode and checkpoints only at a round's end.
    """
    config = sac_base.get_config()
    config.update(
        env=setting.host_env,
        seed=seed,
        seed_steps=0,
        updates_per_step=setting.updates_per_step,
        replay_capacity=setting.replay_size,
        log_every=setting.iterations,
        eval_every=2**31 - 1,
        eval_episodes=1,
        checkpoint_every=2**31 - 1,
        save_replay=True,
    )
    config.agent = ml_collections.ConfigDict(dataclasses.asdict(agent_config(setting, policy)))
    return config


class LpjaxVariant:
    """The jitted loop in one configuration: its loop state and compiled chunk; a round is one chunk."""

    def __init__(
        self, name: str, settings: sac_brax_loop.LoopSettings, iterations: int, seed: int, timer: CompileTimer
    ):
        self.name, self.settings, self.iterations = name, settings, iterations
        with timer.section(name):
            started = time.perf_counter()
            self.loop = jax.block_until_ready(sac_brax_loop.init_loop(settings, seed))
            self.init_s = time.perf_counter() - started
            started = time.perf_counter()
            self.chunk = sac_brax_loop.chunk_fn(settings, iterations)
            self.compile_s = time.perf_counter() - started
        self.sps: list[float] = []
        self.critic_loss: float = float("nan")

    def run_round(self) -> float:
        started = time.perf_counter()
        self.loop, out = self.chunk(self.loop)
        out = jax.device_get(out)  # blocks until the chunk is done
        elapsed = time.perf_counter() - started
        if not out.actions_finite:
            raise RuntimeError(f"{self.name}: non-finite actions")
        self.critic_loss = float(out.metrics["critic_loss"])
        sps = self.iterations * self.settings.num_envs / elapsed
        self.sps.append(sps)
        return sps

    @property
    def agent(self) -> SACConfig:
        return self.settings.agent

    def extras(self) -> dict[str, Any]:
        return {"chunk_compile_s": self.compile_s, "init_s": self.init_s}


class HostVariant:
    """The dm_control host loop in one configuration; a round resumes its run for ``iterations`` more steps.

    Every round is a resume: the run's first segment runs (untimed) when the variant is built, since the first
    resume compiles again (restored arrays are not weakly typed).
    """

    def __init__(self, name: str, config: ml_collections.ConfigDict, run_dir: Path, timer: CompileTimer):
        self.name, self.config, self.run_dir, self.timer = name, config, run_dir, timer
        self.steps = 0
        self.sps: list[float] = []
        self.critic_loss: float = float("nan")
        self.round_s: list[float] = []
        self._train()

    def _train(self) -> float:
        """Runs (or resumes) the host loop for ``log_every`` more steps; returns its logged env steps/s."""
        self.steps += self.config.log_every
        config = ml_collections.ConfigDict(self.config.to_dict())
        config.total_steps = self.steps
        with self.timer.section(self.name), contextlib.redirect_stdout(io.StringIO()):
            summary = sac_loop.train(config, self.run_dir, resume=self.steps > config.log_every, progress=False)
        if summary["status"] != "finished":
            raise RuntimeError(f"{self.name}: {summary['status']}")
        metrics = read_metrics(self.run_dir)
        at_end = (metrics["step"] == self.steps) & np.isfinite(metrics["train/env_steps_per_s"])
        sps, self.critic_loss = (
            float(metrics[column][at_end][-1]) for column in ("train/env_steps_per_s", "train/critic_loss")
        )
        return sps

    def run_round(self) -> float:
        started = time.perf_counter()
        sps = self._train()
        self.round_s.append(time.perf_counter() - started)
        self.sps.append(sps)
        return sps

    @property
    def agent(self) -> SACConfig:
        return SACConfig.from_mapping(self.config.agent.to_dict())

    def extras(self) -> dict[str, Any]:
        return {"round_wall_s": self.round_s}  # restore, round, evaluation and checkpoint


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_setting(
    setting: Setting, policies: Sequence[str], seed: int, timer: CompileTimer, work_dir: Path
) -> dict[str, Any]:
    """Times brax and the lpjax variants on one setting, interleaved round by round (module docstring)."""
    from brax.training.agents.sac import networks as sac_networks
    from brax.training.agents.sac import train as brax_sac

    print(f"\n{setting.name}: {setting.description}", flush=True)
    ours: list[LpjaxVariant | HostVariant] = []
    for policy in policies:
        variant = LpjaxVariant(f"lpjax_{policy}", lpjax_settings(setting, policy), setting.iterations, seed, timer)
        print(f"{variant.name}: init {variant.init_s:.1f} s, chunk compile {variant.compile_s:.1f} s", flush=True)
        ours.append(variant)
    if setting.host_env is not None:
        ours += [
            HostVariant(
                f"lpjax_host_{policy}",
                host_config(setting, policy, seed),
                work_dir / f"{setting.name}-host-{policy}",
                timer,
            )
            for policy in policies
        ]

    epoch_steps = setting.env_steps_per_round
    brax_epochs: list[dict[str, float]] = []

    def progress(step: int, metrics: dict) -> None:
        if "training/sps" not in metrics:  # the initial evaluation, before any training
            return
        sps = float(metrics["training/sps"])
        brax_epochs.append(
            {
                "sps": sps,
                "seconds": epoch_steps / sps,
                "critic_loss": float(metrics.get("training/critic_loss", float("nan"))),
            }
        )
        round_ = len(brax_epochs) - 1
        order = ours if round_ % 2 == 0 else ours[::-1]
        with timer.section(None):
            line = [f"round {round_}{' (warm-up)' if round_ == 0 else ''}: brax {sps:,.0f}"]
            for variant in order:
                line.append(f"{variant.name} {variant.run_round():,.0f}")
        print(", ".join(line) + " env steps/s", flush=True)

    environment = brax_environment(setting.env, setting.backend)
    eval_env = null_env(environment.observation_size, environment.action_size)
    network_factory = functools.partial(sac_networks.make_sac_networks, hidden_layer_sizes=setting.hidden)
    epochs = setting.rounds + 1
    with brax_jax_compat(), timer.section(f"brax/{setting.name}"):
        brax_sac.train(
            environment=environment,
            num_timesteps=epochs * epoch_steps,
            episode_length=EPISODE_LENGTH,
            wrap_env_fn=brax_wrap,
            action_repeat=1,
            num_envs=setting.num_envs,
            num_eval_envs=1,
            learning_rate=LEARNING_RATE,
            discounting=GAMMA,
            seed=seed,
            batch_size=setting.batch_size,
            num_evals=epochs + 1,
            normalize_observations=False,
            reward_scaling=1.0,
            tau=TAU,
            min_replay_size=0,
            max_replay_size=setting.replay_size,
            grad_updates_per_step=setting.updates_per_step,
            network_factory=network_factory,
            progress_fn=progress,
            eval_env=eval_env,
        )
    if len(brax_epochs) != epochs:
        raise RuntimeError(f"brax ran {len(brax_epochs)} epochs, expected {epochs}")

    timed = slice(1, None)  # round 0 is the warm-up
    brax_sps = [e["sps"] for e in brax_epochs][timed]
    brax_epoch_s = statistics.median(e["seconds"] for e in brax_epochs[timed])
    results = {
        "brax": {
            "sps": brax_sps,
            **_stats(brax_sps),
            "warmup_sps": brax_epochs[0]["sps"],
            "backend_compile_s": timer.seconds.get(f"brax/{setting.name}", 0.0),
            "first_epoch_overhead_s": brax_epochs[0]["seconds"] - brax_epoch_s,
            "last_critic_loss": brax_epochs[-1]["critic_loss"],
        }
    }
    for variant in ours:
        sps = variant.sps[timed]
        results[variant.name] = {
            "sps": sps,
            **_stats(sps),
            "warmup_sps": variant.sps[0],
            "backend_compile_s": timer.seconds.pop(variant.name, 0.0),
            "last_critic_loss": variant.critic_loss,
            **variant.extras(),
        }
    ratios = {variant.name: [o / b for o, b in zip(variant.sps[timed], brax_sps)] for variant in ours}
    ratio = statistics.median(ratios["lpjax_fp32"])
    config = {
        **dataclasses.asdict(setting),
        "hidden": list(setting.hidden),
        "env_steps_per_round": epoch_steps,
        "episode_length": EPISODE_LENGTH,
        "learning_rate": LEARNING_RATE,
        "gamma": GAMMA,
        "tau": TAU,
        "seed": seed,
        "lpjax_agents": {v.name: dataclasses.asdict(v.agent) for v in ours},
    }
    summary = {
        "name": setting.name,
        "description": setting.description,
        "config": config,
        "results": results,
        "ratios_per_round": ratios,
        "ratio": ratio,
        "ratio_of_medians": results["lpjax_fp32"]["median"] / results["brax"]["median"],
        "target_met": ratio >= TARGET_RATIO,
    }
    if "lpjax_host_fp32" in results:
        summary["jitted_over_host"] = statistics.median(
            j / h for j, h in zip(results["lpjax_fp32"]["sps"], results["lpjax_host_fp32"]["sps"])
        )
    return summary


def brax_sgd_step(observation_size: int, action_size: int, hidden: tuple[int, ...]):
    """``(state, sgd_step)``: brax's SAC update, assembled from brax's modules as ``sac.train`` assembles its
    ``sgd_step`` (temperature, critic and actor gradient steps, then the target update), without pmap.

    ``sgd_step(state, transitions) -> (state, critic_loss)`` on a ``brax.training.types.Transition`` batch.
    """
    import optax
    from brax.training import gradients
    from brax.training.acme import running_statistics, specs
    from brax.training.agents.sac import losses as sac_losses
    from brax.training.agents.sac import networks as sac_networks

    network = sac_networks.make_sac_networks(observation_size, action_size, hidden_layer_sizes=hidden)
    alpha_loss, critic_loss, actor_loss = sac_losses.make_losses(
        network, reward_scaling=1.0, discounting=GAMMA, action_size=action_size
    )
    alpha_tx, policy_tx, q_tx = optax.adam(3e-4), optax.adam(LEARNING_RATE), optax.adam(LEARNING_RATE)
    alpha_update = gradients.gradient_update_fn(alpha_loss, alpha_tx, pmap_axis_name=None)
    critic_update = gradients.gradient_update_fn(critic_loss, q_tx, pmap_axis_name=None)
    actor_update = gradients.gradient_update_fn(actor_loss, policy_tx, pmap_axis_name=None)
    normalizer = running_statistics.init_state(specs.Array((observation_size,), jnp.dtype("float32")))
    policy_key, q_key, key = jax.random.split(jax.random.PRNGKey(0), 3)
    policy, q = network.policy_network.init(policy_key), network.q_network.init(q_key)
    log_alpha = jnp.zeros([], jnp.float32)
    state = dict(
        policy=policy,
        policy_opt=policy_tx.init(policy),
        q=q,
        q_opt=q_tx.init(q),
        target_q=jax.tree.map(jnp.copy, q),
        log_alpha=log_alpha,
        alpha_opt=alpha_tx.init(log_alpha),
        key=key,
    )

    def sgd_step(state, transitions):
        key, alpha_key, critic_key, actor_key = jax.random.split(state["key"], 4)
        _, log_alpha, alpha_opt = alpha_update(
            state["log_alpha"], state["policy"], normalizer, transitions, alpha_key, optimizer_state=state["alpha_opt"]
        )
        alpha = jnp.exp(state["log_alpha"])
        loss, q, q_opt = critic_update(
            state["q"],
            state["policy"],
            normalizer,
            state["target_q"],
            alpha,
            transitions,
            critic_key,
            optimizer_state=state["q_opt"],
        )
        _, policy, policy_opt = actor_update(
            state["policy"], normalizer, state["q"], alpha, transitions, actor_key, optimizer_state=state["policy_opt"]
        )
        target_q = jax.tree.map(lambda x, y: x * (1 - TAU) + y * TAU, state["target_q"], q)
        return dict(
            policy=policy,
            policy_opt=policy_opt,
            q=q,
            q_opt=q_opt,
            target_q=target_q,
            log_alpha=log_alpha,
            alpha_opt=alpha_opt,
            key=key,
        ), loss

    return state, sgd_step


def profile_updates(setting: Setting, updates: int, rounds: int) -> dict[str, Any]:
    """One SAC update alone, lpjax fp32 against brax, at the setting's sizes: the work (XLA's flop count and
    number of matmuls of one jitted update) and the time per update (``rounds`` interleaved rounds of a
    ``lax.scan`` over ``updates`` updates on fixed random batches; round 0 excluded)."""
    from brax.training import types as brax_types

    from lpjax.agents import sac

    env = sac_brax_loop.make_env(setting.env, setting.backend, 1)
    obs, act, batch = env.observation_size, env.action_dim, setting.batch_size
    rng = np.random.default_rng(0)
    data = {
        "obs": rng.normal(size=(updates, batch, obs)),
        "action": rng.uniform(-1, 1, (updates, batch, act)),
        "reward": rng.normal(size=(updates, batch)),
        "discount": np.ones((updates, batch)),
        "next_obs": rng.normal(size=(updates, batch, obs)),
    }
    data = {k: jnp.asarray(v, jnp.float32) for k, v in data.items()}
    transitions = brax_types.Transition(
        observation=data["obs"],
        action=data["action"],
        reward=data["reward"],
        discount=data["discount"],
        next_observation=data["next_obs"],
        extras={"state_extras": {"truncation": jnp.zeros((updates, batch))}, "policy_extras": {}},
    )
    agent_settings = lpjax_settings(setting, "fp32")
    ours = sac_brax_loop.init_loop(agent_settings, 0).agent
    theirs, sgd_step = brax_sgd_step(obs, act, setting.hidden)

    def scan_ours(state, data):
        state, metrics = jax.lax.scan(sac.update, state, data)
        return state, metrics["critic_loss"][-1]

    def scan_theirs(state, transitions):
        state, losses = jax.lax.scan(sgd_step, state, transitions)
        return state, losses[-1]

    variants = {
        "lpjax_fp32": [jax.jit(scan_ours, donate_argnums=0).lower(ours, data).compile(), ours, data],
        "brax": [jax.jit(scan_theirs, donate_argnums=0).lower(theirs, transitions).compile(), theirs, transitions],
    }
    work = {}
    for name, (update, state, batches) in (
        ("lpjax_fp32", (sac.update, ours, data)),
        ("brax", (sgd_step, theirs, transitions)),
    ):
        one = jax.jit(update).lower(state, jax.tree.map(lambda x: x[0], batches)).compile()
        cost = one.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        work[name] = {"flops": float(cost["flops"]), "matmuls": one.as_text().count(" dot(")}
    times = {name: [] for name in variants}
    for round_ in range(rounds + 1):
        for name in list(variants) if round_ % 2 == 0 else list(variants)[::-1]:
            compiled, state, batches = variants[name]
            started = time.perf_counter()
            state, loss = compiled(state, batches)
            jax.block_until_ready(loss)
            times[name].append((time.perf_counter() - started) / updates * 1e3)
            variants[name][1] = state
    result = {
        name: {**work[name], "ms_per_update": _stats(times[name][1:]), "ms": times[name][1:]} for name in variants
    }
    ratios = [b / o for o, b in zip(times["lpjax_fp32"][1:], times["brax"][1:])]
    return {
        "setting": setting.name,
        "batch_size": batch,
        "hidden": list(setting.hidden),
        "updates": updates,
        "rounds": rounds,
        "results": result,
        "brax_time_over_lpjax_time": statistics.median(ratios),
    }


def run_benchmark(args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    """Runs the chosen settings (and the update profile); each records this run's :func:`run_metadata`."""
    timer = CompileTimer()
    policies = ("fp32",) if args.no_fp16 else ("fp32", "fp16")
    with tempfile.TemporaryDirectory(prefix="sac_throughput-") as work_dir:
        settings = [run_setting(setting, policies, args.seed, timer, Path(work_dir)) for setting in args.chosen]
    profile = None
    if not args.no_profile:
        first = args.chosen[0]
        profile = profile_updates(first, updates=4 if args.quick else 32, rounds=2 if args.quick else 12)
        print(
            f"\none SAC update ({first.name} sizes): lpjax fp32 "
            f"{profile['results']['lpjax_fp32']['ms_per_update']['median']:.2f} ms, brax "
            f"{profile['results']['brax']['ms_per_update']['median']:.2f} ms (median); flops "
            f"{profile['results']['lpjax_fp32']['flops']:.4g} vs {profile['results']['brax']['flops']:.4g}",
            flush=True,
        )
    run = run_metadata(args, argv)
    for measured in [*settings, profile]:
        if measured is not None:
            measured["run"] = run
    return summarize(settings, profile)


def run_metadata(args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    """What a run was: command, date, package versions, machine (load average at its end), quick or not."""
    from importlib.metadata import version

    return {
        "command": command_line("benchmarks.sac_throughput", argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": {package: version(package) for package in PACKAGES},
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "devices": [str(d) for d in jax.devices()],
            "load_average": list(os.getloadavg()),
        },
        "quick": bool(args.quick),
    }


def summarize(settings: list[dict], profile: dict | None) -> dict[str, Any]:
    """The json: the settings' results (each with its run) and the update profile, with medians and targets."""
    return {
        "notes": NOTES,
        "target_ratio": TARGET_RATIO,
        "settings": settings,
        "medians": {s["name"]: {name: row["median"] for name, row in s["results"].items()} for s in settings},
        "target_met": {s["name"]: s["target_met"] for s in settings},
        "update_profile": profile,
    }


def with_earlier_results(result: dict, earlier: dict) -> dict:
    """``result`` plus the settings (and the update profile) of the ``earlier`` json that this run did not
    measure, each with the run that measured it; settings in ``SETTINGS`` order."""
    measured = {s["name"] for s in result["settings"]}
    settings = result["settings"] + [s for s in earlier["settings"] if s["name"] not in measured]
    order = list(SETTINGS)
    settings.sort(key=lambda s: order.index(s["name"]) if s["name"] in order else len(order))
    return summarize(settings, result["update_profile"] or earlier["update_profile"])


def _describe(setting: dict) -> str:
    cfg = setting["config"]
    env = cfg["env"] + (f" ({cfg['backend']})" if cfg["backend"] else "")
    host = f", host loop on {cfg['host_env']}" if cfg["host_env"] else ""
    return (
        f"{env}{host}, {cfg['num_envs']} envs, batch {cfg['batch_size']}, {cfg['updates_per_step']} updates per "
        f"vectorized step, hidden {cfg['hidden']}"
    )


def format_table(result: dict) -> str:
    lines = []
    for setting in result["settings"]:
        cfg = setting["config"]
        run = setting["run"]
        lines += [
            f"{setting['name']}: {_describe(setting)}; {cfg['rounds']} rounds of {cfg['env_steps_per_round']} "
            f"env steps [run {run['date']}, jax {run['versions']['jax']}, load "
            f"{run['machine']['load_average'][0]:.1f}]",
            f"  {'variant':<16} {'median':>9} {'min':>9} {'max':>9}  (env steps/s)  XLA compile (s)",
        ]
        for name, row in setting["results"].items():
            lines.append(
                f"  {name:<16} {row['median']:>9,.0f} {row['min']:>9,.0f} {row['max']:>9,.0f}  "
                f"{'':13}  {row['backend_compile_s']:.1f}"
            )
        lines.append(
            f"  lpjax fp32 / brax, median over rounds: {setting['ratio']:.3f} (target >= "
            f"{result['target_ratio']}: {'met' if setting['target_met'] else 'NOT met'})"
        )
        if "jitted_over_host" in setting:
            lines.append(f"  jitted / host loop (fp32), median over rounds: {setting['jitted_over_host']:.3f}")
    profile = result.get("update_profile")
    if profile:
        rows = profile["results"]
        lines.append(
            f"one SAC update alone ({profile['setting']} sizes: batch {profile['batch_size']}, hidden "
            f"{profile['hidden']}): "
            + ", ".join(
                f"{name} {row['ms_per_update']['median']:.2f} ms ({row['flops'] / 1e9:.3f} GFLOP, "
                f"{row['matmuls']} matmuls)"
                for name, row in rows.items()
            )
            + f"; brax time / lpjax time {profile['brax_time_over_lpjax_time']:.3f}"
        )
    return "\n".join(lines)


COLORS = {
    "brax": "tab:gray",
    "lpjax_fp32": "tab:blue",
    "lpjax_fp16": "tab:orange",
    "lpjax_host_fp32": "tab:green",
    "lpjax_host_fp16": "tab:olive",
}


def plot(result: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    settings = result["settings"]
    columns = min(len(settings), 2)
    rows = -(-len(settings) // columns)
    figure = Figure(figsize=(5.6 * columns + 0.4, 4.4 * rows + 0.4), dpi=120)
    FigureCanvasAgg(figure)
    for k, setting in enumerate(settings):
        axes = figure.add_subplot(rows, columns, k + 1)
        names = list(setting["results"])
        for i, name in enumerate(names):
            row = setting["results"][name]
            axes.bar(i, row["median"], color=COLORS.get(name, "tab:purple"), alpha=0.8)
            axes.plot([i] * len(row["sps"]), row["sps"], "k.", markersize=4)
            axes.text(i, max(row["sps"]), f"{row['median']:,.0f}", ha="center", va="bottom", fontsize=8)
        axes.set_xticks(
            range(len(names)), [n.replace("lpjax_", "lpjax\n").replace("host_", "host\n") for n in names], fontsize=8
        )
        axes.set_ylabel("env steps / s (bar: median; dots: rounds)", fontsize=8)
        cfg = setting["config"]
        run = setting["run"]
        title = (
            f"{setting['name']}: {cfg['env']}, {cfg['num_envs']} envs, batch {cfg['batch_size']}, "
            f"{cfg['updates_per_step']} upd/step\n(jax {run['versions']['jax']}, load "
            f"{run['machine']['load_average'][0]:.1f}) lpjax fp32 / brax = {setting['ratio']:.2f}"
        )
        if "jitted_over_host" in setting:
            title += f"; jitted / host ({cfg['host_env']}) = {setting['jitted_over_host']:.2f}"
        axes.set_title(title, fontsize=8)
        axes.grid(True, axis="y", alpha=0.3)
    figure.suptitle("SAC training throughput, CPU (2 cores, XLA:CPU)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run_benchmark(args, argv)
    previous = args.out_dir / f"{RESULT_NAME}.json"
    if not args.quick and previous.is_file():
        result = with_earlier_results(result, json.loads(previous.read_text()))
    write_results(result, format_table(result), args.out_dir, RESULT_NAME, None if args.no_plot else plot)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
