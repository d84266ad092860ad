"""Training throughput in environment steps per second: lpjax's fully jitted SAC loop
(:mod:`experiments.sac_brax_loop`: environments, replay and updates in one compiled ``lax.scan`` chunk) against
``brax.training.agents.sac.train`` on the same ``brax:<env>`` or ``mjx:<domain>-<task>``, and, where a setting has
a ``host_env``, against lpjax's dm_control host loop (:mod:`experiments.sac_loop`) with the same agent.

The learners are matched (:data:`MATCHED`, :func:`agent_config`): parallel environments, episode length 1000,
updates per vectorized step, batch size, networks, replay capacity, learning rate, discount and tau, no random
steps before learning, no observation normalization, float32 (brax's only precision). What remains is the
algorithms' own: brax runs three policy forward passes per update and updates the target every update, lpjax
shares the actor's sample with the temperature update and updates the target every 2 updates. Playground envs are
wrapped as Playground's scripts do (MJX with ``impl="jax"``); brax's evaluations run on :func:`null_env`.

Interleaving: brax's ``train`` runs ``rounds + 1`` epochs and calls ``progress_fn`` after each; that callback runs
one round of every lpjax variant, their order alternating, so round ``k`` of every variant runs at nearly the same
time. A jitted round is one call of the compiled chunk (as brax times its epochs); a host round resumes the run for
``iterations`` more steps and reads its logged ``train/env_steps_per_s``. Round 0 (compilation) is excluded;
``ratio`` is the median over rounds of lpjax fp32 / brax (target >= 1). The update profile (``--no-profile`` skips
it) times one SAC update alone at the first setting's sizes against brax's update as ``sac.train`` assembles it.
Each setting records the run that measured it; a run keeps the json's settings it did not measure.
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
import types
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import lpjax.envs
from benchmarks import common, timing
from experiments import sac_brax_loop, sac_loop
from experiments.configs.sac import _base as sac_base
from lpjax.agents.sac import SACConfig
from lpjax.methods import PrecisionMethods
from lpjax.run_logging import read_metrics

TARGET_RATIO = 1.0
EPISODE_LENGTH, LEARNING_RATE, GAMMA, TAU = 1000, 1e-4, 0.99, 0.005
PACKAGES = ("jax", "jaxlib", "brax", "playground", "mujoco", "mujoco-mjx", "dm_control")
MATCHED = dict(episode_length=EPISODE_LENGTH, action_repeat=1, num_eval_envs=1, learning_rate=LEARNING_RATE)
MATCHED.update(discounting=GAMMA, normalize_observations=False, reward_scaling=1.0, tau=TAU, min_replay_size=0)
"""brax's ``sac.train`` arguments every setting shares."""
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
    """One matched configuration, timed for ``rounds`` rounds of ``iterations`` iterations; ``backend`` is brax's
    (``None`` for MJX), ``host_env`` (``dmc:<domain>-<task>``, one environment) adds the host loop."""

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


MJX = dict(env="mjx:cartpole-swingup", backend=None)
ONE_UPDATE = dict(batch_size=256, updates_per_step=1)
HOST = dict(host_env="dmc:cartpole-swingup", num_envs=1)
SETTINGS = {setting.name: setting for setting in (
    Setting("brax_colab", "sizes of brax's published SAC settings (128 envs, batch 512, 64 updates per vectorized "
            "step, 256x256): update-bound"),
    Setting("one_update", "128 envs, batch 256, 1 update per vectorized step: environment- and loop-bound",
            **ONE_UPDATE, iterations=20),
    Setting("mjx_cartpole", "the paper's protocol (1 env, 1 update per step) at 256x256, batch 256, on MJX "
            "cartpole-swingup; the dm_control host loop on dmc:cartpole-swingup",
            **MJX | HOST | ONE_UPDATE, replay_size=10_000, iterations=200, rounds=8),
    Setting("mjx_cartpole_128", "MJX cartpole-swingup, 128 envs, batch 256, 1 update per vectorized step",
            **MJX | ONE_UPDATE, iterations=20, rounds=8),
)}  # fmt: skip
QUICK = Setting("quick", "a smoke test, not a measurement", **MJX | HOST, batch_size=32, updates_per_step=2)
QUICK = dataclasses.replace(QUICK, hidden=(32, 32), replay_size=4096, iterations=8, rounds=2)
OVERRIDABLE = tuple(field.name for field in dataclasses.fields(Setting))[2:]
_TEXT = (lambda s: s or None), " ('' for none)"
_WIDTHS = (lambda s: tuple(int(w) for w in s.split(","))), " (widths, e.g. 256,256)"
_PARSE = dict(env=_TEXT, backend=_TEXT, host_env=_TEXT, hidden=_WIDTHS)


def _setting_error(setting: Setting) -> str | None:
    if not lpjax.envs.is_jitted(setting.env):
        return f"env must be 'brax:<env>' or 'mjx:<domain>-<task>', got {setting.env!r}"
    if setting.env.startswith("brax:") != (setting.backend is not None):
        return f"backend is for brax envs only (env {setting.env!r}, backend {setting.backend!r})"
    if setting.host_env is not None and not setting.host_env.startswith("dmc:"):
        return f"host_env must be 'dmc:<domain>-<task>', got {setting.host_env!r}"
    if setting.host_env is not None and setting.num_envs != 1:
        return f"the host loop steps one environment: host_env needs num_envs=1, got {setting.num_envs}"
    if setting.rounds < 1 or setting.iterations < 1:
        return "rounds and iterations must be >= 1"
    return None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    cli = common.parser("sac_throughput", __doc__, quick="one tiny setting: a smoke test, not the measurement")
    cli.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {list(SETTINGS)}")
    for name in OVERRIDABLE:
        kind, note = _PARSE.get(name, (int, ""))
        flag = "--" + name.replace("_", "-")
        cli.add_argument(flag, type=kind, default=argparse.SUPPRESS, help="for every setting" + note)
    cli.add_argument("--no-fp16", action="store_true", help="skip the lpjax fp16 variants")
    cli.add_argument("--no-profile", action="store_true", help="skip the isolated one-update comparison")
    cli.add_argument("--seed", type=int, default=0)
    args = cli.parse_args(argv)
    names = args.settings.split(",")
    if not args.quick and any(n not in SETTINGS for n in names):
        cli.error(f"unknown settings {[n for n in names if n not in SETTINGS]}; valid: {list(SETTINGS)}")
    overrides = {name: getattr(args, name) for name in OVERRIDABLE if hasattr(args, name)}
    chosen = [QUICK] if args.quick else [SETTINGS[n] for n in names]
    args.chosen = [dataclasses.replace(setting, **overrides) for setting in chosen]
    for setting in args.chosen:
        if error := _setting_error(setting):
            cli.error(f"setting {setting.name}: {error}")
    return args


def brax_jax_compat():
    """A context that provides ``jax.device_put_replicated`` (removed in jax 0.10, still called by brax 0.14.2)."""

    def device_put_replicated(x, devices):
        mesh = jax.sharding.Mesh(np.array(devices), ("devices",))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("devices"))
        return jax.tree.map(lambda a: jax.device_put(jnp.stack([jnp.asarray(a)] * len(devices)), sharding), x)

    return mock.patch.object(jax, "device_put_replicated", device_put_replicated, create=True)


def null_env(observation_size: int, action_size: int):
    """A brax ``Env`` of the given sizes that simulates nothing: brax's (untimed) evaluations cost nothing."""
    from brax.envs.base import Env, State

    class NullEnv(Env):
        observation_size = property(lambda self: observation_size)
        action_size = property(lambda self: action_size)
        backend = property(lambda self: "null")

        def reset(self, rng):
            zero = jnp.zeros(())
            return State(None, obs=jnp.zeros(observation_size), reward=zero, done=zero, metrics={}, info={})

        def step(self, state, action):
            return state.replace(reward=jnp.zeros(()), done=jnp.zeros(()))

    return NullEnv()


def brax_wrap(env, **kwargs):
    """brax's SAC's ``wrap_env_fn``: Playground's wrapper for a Playground env, brax's own for a brax env."""
    from brax import envs
    from mujoco_playground import wrapper

    if isinstance(env, envs.Env):
        return envs.training.wrap(env, **kwargs)
    return wrapper.wrap_for_brax_training(env, **kwargs)


def agent_config(setting: Setting, policy: str) -> SACConfig:
    methods = PrecisionMethods.paper() if policy == "fp16" else PrecisionMethods()
    rates = dict(actor_lr=LEARNING_RATE, critic_lr=LEARNING_RATE, gamma=GAMMA, tau=TAU)
    return SACConfig(policy=policy, hidden_dims=setting.hidden, batch_size=setting.batch_size, **rates, methods=methods)


def lpjax_settings(setting: Setting, policy: str) -> sac_brax_loop.LoopSettings:
    sizes = dict(num_envs=setting.num_envs, replay_capacity=setting.replay_size, seed_steps=0, action_repeat=1)
    env = dict(env=setting.env, backend=setting.backend, updates_per_step=setting.updates_per_step)
    return sac_brax_loop.LoopSettings(**env, **sizes, agent=agent_config(setting, policy))


def host_config(setting: Setting, policy: str, seed: int) -> ml_collections.ConfigDict:
    """The host loop's run config, logging once per round; evaluation and checkpoints only at a round's end."""
    config = sac_base.get_config()
    config.update(env=setting.host_env, seed=seed, seed_steps=0, updates_per_step=setting.updates_per_step)
    config.update(replay_capacity=setting.replay_size, log_every=setting.iterations, eval_episodes=1)
    config.update(eval_every=2**31 - 1, checkpoint_every=2**31 - 1, save_replay=True)
    config.agent = ml_collections.ConfigDict(dataclasses.asdict(agent_config(setting, policy)))
    return config


class LpjaxVariant:
    """The jitted loop with ``policy``'s agent; a round is one call of its compiled chunk."""

    def __init__(self, setting: Setting, policy: str, seed: int, timer: timing.CompileTimer):
        settings = lpjax_settings(setting, policy)
        self.name, self.agent, self.steps = f"lpjax_{policy}", settings.agent, setting.iterations * setting.num_envs
        self.sps = []
        with timer.section(self.name):
            started = time.perf_counter()
            self.loop = jax.block_until_ready(sac_brax_loop.init_loop(settings, seed))
            init_s, started = time.perf_counter() - started, time.perf_counter()
            self.chunk = sac_brax_loop.chunk_fn(settings, setting.iterations)
        compile_s = time.perf_counter() - started
        self.extras = {"last_critic_loss": float("nan"), "chunk_compile_s": compile_s, "init_s": init_s}
        print(f"{self.name}: init {init_s:.1f} s, chunk compile {compile_s:.1f} s", flush=True)

    def run_round(self) -> float:
        started = time.perf_counter()
        self.loop, out = self.chunk(self.loop)
        out = jax.device_get(out)  # blocks until the chunk is done
        self.sps.append(self.steps / (time.perf_counter() - started))
        if not out.actions_finite:
            raise RuntimeError(f"{self.name}: non-finite actions")
        self.extras["last_critic_loss"] = float(out.metrics["critic_loss"])
        return self.sps[-1]


class HostVariant:
    """The dm_control host loop; a round resumes its run for ``iterations`` more steps. Every timed round is a
    resume: the first segment runs (untimed) here, since the first resume compiles again."""

    def __init__(self, setting: Setting, policy: str, seed: int, timer: timing.CompileTimer, work_dir: Path):
        self.name, self.run_dir = f"lpjax_host_{policy}", work_dir / f"{setting.name}-host-{policy}"
        self.config, self.agent, self.timer = host_config(setting, policy, seed), agent_config(setting, policy), timer
        self.steps, self.sps = 0, []
        # round_wall_s: each round's restore, training, evaluation and checkpoint
        self.extras = {"last_critic_loss": float("nan"), "round_wall_s": []}
        self.run_round(timed=False)

    def run_round(self, timed: bool = True) -> float:
        started = time.perf_counter()
        self.steps += self.config.log_every
        config = ml_collections.ConfigDict(self.config.to_dict() | {"total_steps": self.steps})
        with self.timer.section(self.name), contextlib.redirect_stdout(io.StringIO()):
            summary = sac_loop.train(config, self.run_dir, resume=self.steps > config.log_every, progress=False)
        if summary["status"] != "finished":
            raise RuntimeError(f"{self.name}: {summary['status']}")
        metrics = read_metrics(self.run_dir)
        at_end = (metrics["step"] == self.steps) & np.isfinite(metrics["train/env_steps_per_s"])
        columns = ("train/env_steps_per_s", "train/critic_loss")
        sps, self.extras["last_critic_loss"] = (float(metrics[c][at_end][-1]) for c in columns)
        if timed:
            self.sps.append(sps)
            self.extras["round_wall_s"].append(time.perf_counter() - started)
        return sps


def run_setting(setting: Setting, policies: Sequence[str], seed: int, timer: timing.CompileTimer, work_dir: Path):
    """Times brax and the lpjax variants on one setting, interleaved round by round."""
    from brax import envs
    from brax.training.agents.sac import networks as sac_networks
    from brax.training.agents.sac import train as brax_sac

    print(f"\n{setting.name}: {setting.description}", flush=True)
    ours = [LpjaxVariant(setting, policy, seed, timer) for policy in policies]
    ours += [HostVariant(setting, policy, seed, timer, work_dir) for policy in policies if setting.host_env]
    epoch_steps, epochs = setting.iterations * setting.num_envs, setting.rounds + 1
    brax = types.SimpleNamespace(name="brax", sps=[], extras={})

    def progress(step: int, metrics: dict) -> None:
        if "training/sps" not in metrics:  # the initial evaluation, before any training
            return
        brax.sps.append(float(metrics["training/sps"]))
        brax.extras["last_critic_loss"] = float(metrics.get("training/critic_loss", float("nan")))
        round_ = len(brax.sps) - 1
        with timer.section(None):
            line = [f"round {round_}{' (warm-up)' if round_ == 0 else ''}: brax {brax.sps[-1]:,.0f}"]
            line += [f"{v.name} {v.run_round():,.0f}" for v in (ours if round_ % 2 == 0 else ours[::-1])]
        print(", ".join(line) + " env steps/s", flush=True)

    name = setting.env.partition(":")[2]  # MJX: the bare Playground env
    environment = (
        envs.get_environment(name, backend=setting.backend) if setting.backend else lpjax.envs.load_playground(name)
    )
    sizes = dict(num_envs=setting.num_envs, batch_size=setting.batch_size, max_replay_size=setting.replay_size)
    sizes.update(grad_updates_per_step=setting.updates_per_step, num_timesteps=epochs * epoch_steps)
    networks = functools.partial(sac_networks.make_sac_networks, hidden_layer_sizes=setting.hidden)
    null = null_env(environment.observation_size, environment.action_size)
    with brax_jax_compat(), timer.section("brax"):
        kwargs = dict(wrap_env_fn=brax_wrap, seed=seed, num_evals=epochs + 1, network_factory=networks)
        brax_sac.train(environment=environment, **MATCHED, **sizes, **kwargs, progress_fn=progress, eval_env=null)
    if len(brax.sps) != epochs:
        raise RuntimeError(f"brax ran {len(brax.sps)} epochs, expected {epochs}")
    seconds = [epoch_steps / sps for sps in brax.sps]
    brax.extras = {"first_epoch_overhead_s": seconds[0] - statistics.median(seconds[1:])} | brax.extras
    results = {}
    for v in [brax, *ours]:
        row = dict(sps=v.sps[1:], **timing.summary(v.sps[1:]), warmup_sps=v.sps[0])
        row.update(backend_compile_s=timer.seconds.pop(v.name, 0.0), **v.extras)
        results[v.name] = row
    ratios = {v.name: [o / b for o, b in zip(v.sps[1:], brax.sps[1:])] for v in ours}
    ratio = statistics.median(ratios["lpjax_fp32"])
    config = dict(dataclasses.asdict(setting), hidden=list(setting.hidden), env_steps_per_round=epoch_steps)
    config.update(episode_length=EPISODE_LENGTH, learning_rate=LEARNING_RATE, gamma=GAMMA, tau=TAU, seed=seed)
    config["lpjax_agents"] = {v.name: dataclasses.asdict(v.agent) for v in ours}
    summary = {"name": setting.name, "description": setting.description, "config": config, "results": results}
    medians = results["lpjax_fp32"]["median"] / results["brax"]["median"]
    summary.update(ratios_per_round=ratios, ratio=ratio, ratio_of_medians=medians, target_met=ratio >= TARGET_RATIO)
    if "lpjax_host_fp32" in results:
        jitted, host = results["lpjax_fp32"]["sps"], results["lpjax_host_fp32"]["sps"]
        summary["jitted_over_host"] = statistics.median(j / h for j, h in zip(jitted, host))
    return summary


def brax_sgd_step(observation_size: int, action_size: int, hidden: tuple[int, ...]):
    """``(state, sgd_step)``: brax's SAC update assembled from brax's modules as ``sac.train`` assembles it
    (temperature, critic and actor gradient steps, then the target update), without pmap;
    ``sgd_step(state, transitions) -> (state, {"critic_loss": loss})``."""
    import optax
    from brax.training import gradients
    from brax.training.acme import running_statistics, specs
    from brax.training.agents.sac import losses as sac_losses
    from brax.training.agents.sac import networks as sac_networks

    network = sac_networks.make_sac_networks(observation_size, action_size, hidden_layer_sizes=hidden)
    losses = sac_losses.make_losses(network, reward_scaling=1.0, discounting=GAMMA, action_size=action_size)
    txs = optax.adam(3e-4), optax.adam(LEARNING_RATE), optax.adam(LEARNING_RATE)
    alpha_update, critic_update, actor_update = (
        gradients.gradient_update_fn(loss, tx, pmap_axis_name=None) for loss, tx in zip(losses, txs)
    )
    normalizer = running_statistics.init_state(specs.Array((observation_size,), jnp.dtype("float32")))
    policy_key, q_key, key = jax.random.split(jax.random.PRNGKey(0), 3)
    policy, q = network.policy_network.init(policy_key), network.q_network.init(q_key)
    log_alpha = jnp.zeros([], jnp.float32)
    state = dict(policy=policy, policy_opt=txs[1].init(policy), q=q, q_opt=txs[2].init(q))
    state.update(target_q=jax.tree.map(jnp.copy, q), log_alpha=log_alpha, alpha_opt=txs[0].init(log_alpha), key=key)

    def sgd_step(state, transitions):
        s = dict(state)
        s["key"], alpha_key, critic_key, actor_key = jax.random.split(state["key"], 4)
        alpha_args = (state["log_alpha"], state["policy"], normalizer, transitions, alpha_key)
        _, s["log_alpha"], s["alpha_opt"] = alpha_update(*alpha_args, optimizer_state=state["alpha_opt"])
        alpha = jnp.exp(state["log_alpha"])
        critic_args = (state["q"], state["policy"], normalizer, state["target_q"], alpha, transitions, critic_key)
        loss, s["q"], s["q_opt"] = critic_update(*critic_args, optimizer_state=state["q_opt"])
        actor_args = (state["policy"], normalizer, state["q"], alpha, transitions, actor_key)
        _, s["policy"], s["policy_opt"] = actor_update(*actor_args, optimizer_state=state["policy_opt"])
        s["target_q"] = jax.tree.map(lambda x, y: x * (1 - TAU) + y * TAU, state["target_q"], s["q"])
        return s, {"critic_loss": loss}

    return state, sgd_step


def profile_updates(setting: Setting, updates: int, rounds: int) -> dict:
    """One SAC update alone, lpjax fp32 against brax, at the setting's sizes: XLA's flops and matmuls of one jitted
    update, and ms per update over interleaved rounds of a ``lax.scan`` of ``updates`` updates on random batches."""
    from brax.training import types as brax_types

    from lpjax.agents import sac

    env = sac_brax_loop.make_env(setting.env, setting.backend, 1)
    obs, act, batch = env.observation_size, env.action_dim, setting.batch_size
    data = common.random_transitions(np.random.default_rng(0), updates * batch, obs, act)
    data = {k: jnp.asarray(v.reshape(updates, batch, *v.shape[1:])) for k, v in data.items()}
    truncation = {"state_extras": {"truncation": jnp.zeros((updates, batch))}, "policy_extras": {}}
    transitions = brax_types.Transition(*data.values(), extras=truncation)  # the fields in random_transitions' order
    ours = sac_brax_loop.init_loop(lpjax_settings(setting, "fp32"), 0).agent
    theirs, sgd_step = brax_sgd_step(obs, act, setting.hidden)
    work, variants = {}, {}
    sides = {"lpjax_fp32": (sac.update, ours, data), "brax": (sgd_step, theirs, transitions)}
    for name, (update, state, batches) in sides.items():
        one = jax.jit(update).lower(state, jax.tree.map(lambda x: x[0], batches)).compile()
        work[name] = {"flops": float(one.cost_analysis()["flops"]), "matmuls": one.as_text().count(" dot(")}

        def scan(state, batches, update=update):
            state, metrics = jax.lax.scan(update, state, batches)
            return state, metrics["critic_loss"][-1]

        variants[name] = [jax.jit(scan, donate_argnums=0).lower(state, batches).compile(), state, batches]

    def run(name):
        compiled, state, batches = variants[name]
        variants[name][1], loss = compiled(state, batches)
        return loss

    timed = timing.interleaved({name: functools.partial(run, name) for name in variants}, rounds)
    times = {name: [1e3 * t / updates for t in timed[name]["rounds_s"]] for name in variants}
    profile = dict(setting=setting.name, batch_size=batch, hidden=list(setting.hidden), updates=updates, rounds=rounds)
    profile["results"] = {n: {**work[n], "ms_per_update": timing.summary(times[n]), "ms": times[n]} for n in variants}
    ratios = (b / o for o, b in zip(times["lpjax_fp32"], times["brax"]))
    return profile | {"brax_time_over_lpjax_time": statistics.median(ratios)}


def summarize(settings: list[dict], profile: dict | None) -> dict:
    """The json: the settings' results (each with its run) and the update profile, with medians and targets."""
    medians = {s["name"]: {name: row["median"] for name, row in s["results"].items()} for s in settings}
    result = dict(notes=NOTES, target_ratio=TARGET_RATIO, settings=settings, medians=medians)
    return result | dict(target_met={s["name"]: s["target_met"] for s in settings}, update_profile=profile)


def with_earlier_results(result: dict, earlier: dict) -> dict:
    """``result`` plus the settings (and profile) of the ``earlier`` json it did not measure, in SETTINGS order."""
    measured = {s["name"] for s in result["settings"]}
    settings = result["settings"] + [s for s in earlier["settings"] if s["name"] not in measured]
    settings.sort(key=lambda s: list(SETTINGS).index(s["name"]) if s["name"] in SETTINGS else len(SETTINGS))
    return summarize(settings, result["update_profile"] or earlier["update_profile"])


def format_table(result: dict) -> str:
    lines = []
    for setting in result["settings"]:
        cfg, run = setting["config"], setting["run"]
        env = cfg["env"] + (f" ({cfg['backend']})" if cfg["backend"] else "")
        host = f", host loop on {cfg['host_env']}" if cfg["host_env"] else ""
        lines.append(
            f"{setting['name']}: {env}{host}, {cfg['num_envs']} envs, batch {cfg['batch_size']}, "
            f"{cfg['updates_per_step']} updates per vectorized step, hidden {cfg['hidden']}; {cfg['rounds']} rounds "
            f"of {cfg['env_steps_per_round']} env steps [run {run['date']}, jax {run['versions']['jax']}, load "
            f"{run['machine']['load_average'][0]:.1f}]"
        )
        header = ["variant", "median", "min", "max", " (env steps/s)", "XLA compile (s)"]
        rows = [[n, r["median"], r["min"], r["max"], "", r["backend_compile_s"]] for n, r in setting["results"].items()]
        lines += common.format_table(header, rows, ["<16", ">9,.0f", ">9,.0f", ">9,.0f", "<15", ".1f"], indent="  ")
        lines.append(
            f"  lpjax fp32 / brax, median over rounds: {setting['ratio']:.3f} (target >= "
            f"{result['target_ratio']}: {'met' if setting['target_met'] else 'NOT met'})"
        )
        if "jitted_over_host" in setting:
            lines.append(f"  jitted / host loop (fp32), median over rounds: {setting['jitted_over_host']:.3f}")
    if profile := result.get("update_profile"):
        rows = ", ".join(
            f"{name} {row['ms_per_update']['median']:.2f} ms ({row['flops'] / 1e9:.3f} GFLOP, {row['matmuls']} matmuls)"
            for name, row in profile["results"].items()
        )
        lines.append(
            f"one SAC update alone ({profile['setting']} sizes: batch {profile['batch_size']}, hidden "
            f"{profile['hidden']}): {rows}; brax time / lpjax time {profile['brax_time_over_lpjax_time']:.3f}"
        )
    return "\n".join(lines)


COLORS = dict(brax="tab:gray", lpjax_fp32="tab:blue", lpjax_fp16="tab:orange", lpjax_host_fp32="tab:green")
COLORS["lpjax_host_fp16"] = "tab:olive"


def plot(result: dict, path: Path) -> None:
    settings = result["settings"]
    columns = min(len(settings), 2)
    rows = -(-len(settings) // columns)
    size = (5.6 * columns + 0.4, 4.4 * rows + 0.4)
    with common.figure(path, rows, columns, figsize=size, squeeze=False) as (fig, grid):
        for axes in grid.flat[len(settings) :]:
            axes.axis("off")
        for axes, setting in zip(grid.flat, settings):
            for i, (name, row) in enumerate(setting["results"].items()):
                axes.bar(i, row["median"], color=COLORS.get(name, "tab:purple"), alpha=0.8)
                axes.plot([i] * len(row["sps"]), row["sps"], "k.", markersize=4)
                axes.text(i, max(row["sps"]), f"{row['median']:,.0f}", ha="center", va="bottom", fontsize=8)
            labels = [n.replace("lpjax_", "lpjax\n").replace("host_", "host\n") for n in setting["results"]]
            axes.set_xticks(range(len(labels)), labels, fontsize=8)
            axes.set_ylabel("env steps / s (bar: median; dots: rounds)", fontsize=8)
            cfg, run = setting["config"], setting["run"]
            title = f"{setting['name']}: {cfg['env']}, {cfg['num_envs']} envs, batch {cfg['batch_size']}, "
            title += f"{cfg['updates_per_step']} upd/step\n(jax {run['versions']['jax']}, load "
            title += f"{run['machine']['load_average'][0]:.1f}) lpjax fp32 / brax = {setting['ratio']:.2f}"
            if "jitted_over_host" in setting:
                title += f"; jitted / host ({cfg['host_env']}) = {setting['jitted_over_host']:.2f}"
            axes.set_title(title, fontsize=8)
            axes.grid(True, axis="y", alpha=0.3)
        fig.suptitle("SAC training throughput, CPU (2 cores, XLA:CPU)", fontsize=10)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    timer = timing.CompileTimer()
    policies = ("fp32",) if args.no_fp16 else ("fp32", "fp16")
    with tempfile.TemporaryDirectory(prefix="sac_throughput-") as work_dir:
        settings = [run_setting(setting, policies, args.seed, timer, Path(work_dir)) for setting in args.chosen]
    sizes = dict(updates=4, rounds=2) if args.quick else dict(updates=32, rounds=12)
    profile = None if args.no_profile else profile_updates(args.chosen[0], **sizes)
    machine = dict(platform=platform.platform(), processor=platform.processor(), cpu_count=os.cpu_count())
    machine.update(devices=[str(d) for d in jax.devices()], load_average=timing.machine_load())
    run = dict(command=common.command_line("benchmarks.sac_throughput", argv))
    run["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    run.update(versions=common.package_versions(PACKAGES), machine=machine, quick=bool(args.quick))
    for measured in filter(None, [*settings, profile]):
        measured["run"] = run
    result = summarize(settings, profile)
    previous = args.out_dir / f"{args.name}.json"
    if not args.quick and previous.is_file():
        result = with_earlier_results(result, json.loads(previous.read_text()))
    return common.finish(args, result, format_table(result), plot)


if __name__ == "__main__":
    main(sys.argv[1:])
