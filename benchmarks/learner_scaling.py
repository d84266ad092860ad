"""Learners on a device mesh: bytes each device holds, and the cost of partitioning a step, per mesh.

The learners' mesh (:mod:`lpjax.sharding`) has two axes, ``("data", "fsdp")``: data parallelism replicates the
state and splits the batch; FSDP splits every state leaf of two or more axes along its largest axis that ``fsdp``
divides and keeps vectors, scalars, counters and keys replicated; the replay's capacity axis is split over every
device.

**1. Bytes per device**, counted from shapes (nothing allocated, the same on every platform): for each of
:data:`LEARNERS` and each mesh of :data:`MESHES`, one device's bytes of each of :data:`COMPONENTS`
(:func:`bytes_per_device` of the ``jax.eval_shape``-d state under ``state_shardings``, the replay under
``replay_shardings``, a batch under ``batch_sharding``) and their ratios to (1, 1). Activations, gradients and
XLA's temporaries are not counted. ``sac_fp16``: ``experiments/configs/sac/fp16.py`` at the paper's sizes
(:data:`SAC_SIZES`); ``d4pg``: D4PG's default config on cartpole-balance; ``grpo_fp16``:
``experiments/configs/grpo/fp16.py`` with a larger transformer (:data:`GRPO_BYTES_MODEL`). A worker process with
:data:`FORCED_DEVICES` forced host devices counts them.

**2. Step time on this CPU**: SAC's fp32 update at :data:`STEP_SIZES` on the data-parallel meshes (n, 1) and
GRPO's fp32 ``train_step(..., mesh=mesh)`` on the FSDP meshes (1, n), n in :data:`STEP_DEVICES`, one worker per
device count with that many forced host devices, the state placed with ``lpjax.sharding.place``. Every step is
blocked on (XLA:CPU's collectives can time out under deep asynchronous dispatch); after ``--warmup`` steps (more
while a step still compiles) ``--reps`` steps are timed one by one; ``--rounds`` rounds run the device counts in
turn, and the median over rounds of each worker's median is reported, with the first call's seconds, the
compilations during warm-up and timing (the latter must be 0), the first step's losses and the leaves whose
sharding after the steps is not ``state_shardings``' (:func:`sharding_drift`). Forced host devices share this
machine's cores: the times measure the overhead of partitioning a step, not speed-ups.

``--quick`` times tiny networks for few steps without XLA's backend optimizations (a smoke run); the byte counts
are cheap and use the full sizes either way.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.common import REPO, RESULTS, command_line, figure, finish, machine_info, parser, random_transitions
from benchmarks.timing import interleaved

DEFAULT_OUT_DIR = RESULTS
RESULT_NAME = "learner_scaling"
MODULE = "benchmarks.learner_scaling"

FORCED_DEVICES = 4
"""Forced host devices of the bytes worker: enough for every mesh of :data:`MESHES`."""
MESHES = ((1, 1), (2, 1), (4, 1), (1, 2), (1, 4), (2, 2))
"""The ``(data, fsdp)`` meshes of the byte counts."""
STEP_DEVICES = (1, 2, 4)
"""Device counts of the step timings: SAC on ``(n, 1)`` (data parallel), GRPO on ``(1, n)`` (FSDP)."""
LEARNERS = ("sac_fp16", "d4pg", "grpo_fp16")
COMPONENTS = {
    "params": "parameters of the trained networks (and SAC's log-temperature)",
    "optimizer": "optimizer states: Adam/hAdam moments and counts, the loss scaler's state, Kahan-gradient buffers",
    "targets": "target networks and their Kahan-momentum compensation (GRPO: the KL reference, none at beta 0)",
    "other": "step counters and PRNG keys",
    "replay": "the replay buffer (its capacity axis split over every device)",
    "batch": "one training batch (its leading axis split over every device)",
}
STATE_COMPONENTS = ("params", "optimizer", "targets", "other")

SAC_SIZES = dict(obs_dim=24, action_dim=6, hidden_dims=(1024, 1024), batch_size=1024, replay_capacity=1_000_000)
"""The paper's SAC from states: walker-walk's observation and action sizes (dm_control)."""
D4PG_ENV_SIZES = {"dmc:cartpole-balance": (5, 1)}
"""``(obs_dim, action_dim)`` of the D4PG config's environment, by name (dm_control's cartpole)."""
GRPO_BYTES_MODEL = dict(d_model=512, num_layers=8, d_ff=2048, num_heads=8)
"""The transformer of the ``grpo_fp16`` byte counts: larger than the config's default (d_model 64, 2 layers)."""
STEP_SIZES = {
    "full": dict(
        sac=dict(hidden_dims=(256, 256), batch_size=256),
        grpo=dict(d_model=256, num_layers=4, d_ff=1024, num_heads=8),
    ),
    "quick": dict(
        sac=dict(hidden_dims=(32, 32), batch_size=32),
        grpo=dict(d_model=32, num_layers=1, d_ff=64, num_heads=4),
    ),
}
"""Networks of the step timings: SAC's hidden layers and batch, GRPO's transformer (batch: the config's)."""
STEP_OBS_DIM, STEP_ACTION_DIM = 24, 6
QUICK_XLA_FLAGS = "--xla_backend_optimization_level=0"
"""``--quick`` workers compile without XLA's backend optimizations: about half the compile time, and step times
that say nothing (a smoke run)."""
MAX_EXTRA_WARMUP = 5
"""Warm-up steps beyond ``--warmup`` while a step still compiles (a state whose shardings the step changed)."""

NOTE = (
    "The step times ran on forced host devices (XLA_FLAGS=--xla_force_host_platform_device_count=N): N XLA:CPU "
    "devices that share this machine's {cores} CPU cores. They measure the overhead of partitioning the step "
    "(collectives, per-device dispatch, smaller matrix products), not speed-ups: on accelerators each device "
    "brings its own compute. The bytes per device are counted from shapes and hold on any platform."
)
NOTES = [
    "bytes_per_device: one device's share of each component, from benchmarks.learner_scaling.bytes_per_device of "
    "jax.eval_shape-d states (state_shardings), replay buffers (replay_shardings) and batches (batch_sharding); "
    "activations, gradients and XLA temporaries are not counted.",
    "FSDP splits leaves with >= 2 axes; vectors, scalars, counters and keys stay replicated, so FSDP's ratio "
    "is a little above 1/fsdp. Data parallelism replicates the state: only the replay and the batch shrink.",
    "step_time: fp32 (XLA:CPU emulates float16). Each figure is the median over rounds of one worker's median "
    "over its timed steps; every step is blocked on. compiles_while_timing must be 0.",
    "Other jobs may share the machine: machine.load_average_1min_per_worker holds the 1-min load average before "
    "and after each worker, and round_median_ms each round's figure; differences within their spread are noise.",
    "sharding_drift lists state leaves whose sharding after the timed steps differs from state_shardings': "
    "XLA chose another output sharding, so the step's second call compiled again (compiles_in_warmup).",
]


# ---------------------------------------------------------------------------------------------- subprocesses


def worker_flags(devices: int, quick: bool) -> str:
    """``XLA_FLAGS`` of a worker: this process's, with ``devices`` forced XLA:CPU devices (replacing any device
    count already there) and, for ``--quick``, :data:`QUICK_XLA_FLAGS`."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", ""))
    flags = f"{flags} --xla_force_host_platform_device_count={devices} {QUICK_XLA_FLAGS if quick else ''}"
    return " ".join(flags.split())


def worker_env(devices: int, quick: bool) -> dict[str, str]:
    """This process's environment with :func:`worker_flags` on the CPU platform."""
    return dict(os.environ, XLA_FLAGS=worker_flags(devices, quick), JAX_PLATFORMS="cpu")


def worker_command(kind: str, devices: int, args: argparse.Namespace) -> list[str]:
    command = [sys.executable, "-m", MODULE, "--worker", kind, "--devices", str(devices)]
    command += [f"--reps={args.reps}", f"--warmup={args.warmup}"]
    return command + (["--quick"] if args.quick else []) + ([] if args.grpo_step else ["--no-grpo-step"])


def start_worker(kind: str, devices: int, args: argparse.Namespace) -> subprocess.Popen:
    """A worker process (``--worker kind``) with ``devices`` forced host devices; it prints its result as the
    last line of its stdout."""
    return subprocess.Popen(
        worker_command(kind, devices, args),
        cwd=REPO,
        env=worker_env(devices, args.quick),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_worker(proc: subprocess.Popen, what: str) -> dict:
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{what} worker failed (exit {proc.returncode}):\n{tail}")
    return json.loads(stdout.strip().splitlines()[-1])


def run_workers(jobs: list[tuple[str, int]], args: argparse.Namespace, parallel: int) -> list[dict]:
    """Runs ``(kind, devices)`` workers, at most ``parallel`` at a time, in order; returns their results."""
    results: list[dict | None] = [None] * len(jobs)
    running: list[tuple[int, subprocess.Popen]] = []
    for index, (kind, devices) in enumerate(jobs):
        print(f"worker {kind}, {devices} device(s)", flush=True)
        running.append((index, start_worker(kind, devices, args)))
        if len(running) >= parallel:
            done, proc = running.pop(0)
            results[done] = finish_worker(proc, f"{jobs[done][0]} ({jobs[done][1]} devices)")
    for done, proc in running:
        results[done] = finish_worker(proc, f"{jobs[done][0]} ({jobs[done][1]} devices)")
    return [r for r in results if r is not None]


# ---------------------------------------------------------------------------------------- learners (workers)


def sac_fp16_config():
    """``experiments/configs/sac/fp16.py``'s agent at the paper's sizes (:data:`SAC_SIZES`), its optimizer per leaf
    (a run refuses FSDP with the fused optimizer, whose flat buffers FSDP would replicate whole)."""
    from experiments.configs.sac import fp16
    from lpjax.agents import sac

    agent = fp16.get_config().agent.to_dict()
    agent.update(hidden_dims=SAC_SIZES["hidden_dims"], batch_size=SAC_SIZES["batch_size"], fused_optimizer=False)
    return sac.SACConfig.from_mapping(agent)


def _batch_of(example: dict[str, np.ndarray], batch_size: int) -> dict:
    import jax

    return {k: jax.ShapeDtypeStruct((batch_size,) + np.shape(v), np.asarray(v).dtype) for k, v in example.items()}


def abstract_learners() -> dict[str, dict]:
    """Per learner: its abstract state, replay buffer (or ``None``) and batch (``jax.eval_shape``: nothing is
    allocated), how to pick each state component from a state-shaped tree, and a summary of its config."""
    import jax
    import jax.numpy as jnp

    from experiments.configs.d4pg import _base as d4pg_base
    from experiments.configs.grpo import fp16 as grpo_fp16
    from lpjax.agents import d4pg, sac
    from lpjax.agents.grpo import GRPOConfig, init_state, transformer_models
    from lpjax.replay import replay_init
    from lpjax.tasks.synthetic import make_task

    key = jax.random.key(0)
    learners = {}

    # SAC, the paper's fp16 agent.
    config = sac_fp16_config()
    obs_dim, action_dim = SAC_SIZES["obs_dim"], SAC_SIZES["action_dim"]
    from experiments.d4pg_loop import example_transition

    example = example_transition(np.zeros(obs_dim, np.float32), action_dim)
    learners["sac_fp16"] = dict(
        state=jax.eval_shape(lambda k: sac.init(k, jnp.zeros(obs_dim), action_dim, config), key),
        replay=jax.eval_shape(lambda: replay_init(example, SAC_SIZES["replay_capacity"])),
        batch=_batch_of(example, config.batch_size),
        parts=dict(
            params=lambda s: (s.actor.params, s.critic.params, s.temperature.params),
            optimizer=lambda s: (s.actor.opt_state, s.critic.opt_state, s.temperature.opt_state),
            targets=lambda s: (s.target_critic, s.target_compensation),
            other=lambda s: (s.step, s.key),
        ),
        config=dict(
            source="experiments/configs/sac/fp16.py",
            policy=config.policy,
            methods=[m for m in config.methods.switches() if getattr(config.methods, m)],
            hidden_dims=list(config.hidden_dims),
            batch_size=config.batch_size,
            replay_capacity=SAC_SIZES["replay_capacity"],
            obs_dim=obs_dim,
            action_dim=action_dim,
        ),
    )

    # D4PG, the default config on its environment.
    run_config = d4pg_base.get_config()
    config = d4pg.D4PGConfig.from_mapping(dict(run_config.agent.to_dict(), fused_optimizer=False))  # as SAC's
    if run_config.env not in D4PG_ENV_SIZES:
        raise ValueError(f"D4PG's default env is now {run_config.env!r}: add its sizes to D4PG_ENV_SIZES.")
    obs_dim, action_dim = D4PG_ENV_SIZES[run_config.env]
    from experiments.d4pg_loop import example_transition

    example = example_transition(np.zeros(obs_dim, np.float32), action_dim)
    learners["d4pg"] = dict(
        state=jax.eval_shape(lambda k: d4pg.init(k, jnp.zeros(obs_dim), action_dim, config), key),
        replay=jax.eval_shape(lambda: replay_init(example, run_config.replay_capacity)),
        batch=_batch_of(example, config.batch_size),
        parts=dict(
            params=lambda s: (s.actor.params, s.critic.params),
            optimizer=lambda s: (s.actor.opt_state, s.critic.opt_state),
            targets=lambda s: (s.target_actor, s.target_critic, s.target_compensation),
            other=lambda s: (s.step, s.key),
        ),
        config=dict(
            source="experiments/configs/d4pg/_base.py",
            env=run_config.env,
            policy=config.policy,
            methods=[m for m in config.methods.switches() if getattr(config.methods, m)],
            actor_hidden=list(config.actor_hidden),
            critic_hidden=list(config.critic_hidden),
            num_atoms=config.num_atoms,
            batch_size=config.batch_size,
            replay_capacity=run_config.replay_capacity,
            obs_dim=obs_dim,
            action_dim=action_dim,
        ),
    )

    # GRPO, fp16, a transformer larger than the default.
    run_config = grpo_fp16.get_config()
    model_config = dict(run_config.model, **GRPO_BYTES_MODEL)
    task = make_task(run_config.env.split(":")[1], run_config.num_digits)
    config = GRPOConfig.from_mapping(dict(run_config.agent, max_new_tokens=task.seq_len - task.prompt_len))
    train_model, _ = transformer_models(dict(model_config, vocab_size=task.vocab_size, max_len=task.seq_len), config)
    tokens = jnp.zeros((1, task.seq_len), jnp.int32)
    rows, length = config.batch_size, task.seq_len
    learners["grpo_fp16"] = dict(
        state=jax.eval_shape(lambda k: init_state(train_model.init(k, tokens), config), key),
        replay=None,
        batch=dict(
            tokens=jax.ShapeDtypeStruct((rows, length), jnp.int32),
            mask=jax.ShapeDtypeStruct((rows, length), jnp.float32),
            logp_rollout=jax.ShapeDtypeStruct((rows, length), jnp.float32),
            advantages=jax.ShapeDtypeStruct((rows,), jnp.float32),
        ),
        parts=dict(
            params=lambda s: s.trainable.params,
            optimizer=lambda s: s.trainable.opt_state,
            targets=lambda s: s.ref_params,
            other=lambda s: s.step,
        ),
        config=dict(
            source="experiments/configs/grpo/fp16.py",
            env=run_config.env,
            policy=config.policy,
            methods=[m for m in config.methods.switches() if getattr(config.methods, m)],
            model=dict(model_config, vocab_size=task.vocab_size, max_len=task.seq_len),
            batch_size=rows,
            sequence_length=length,
        ),
    )
    return learners


def bytes_per_device(tree: Any, shardings: Any) -> int:
    """The bytes one device holds of ``tree`` (arrays or ``jax.ShapeDtypeStruct``) under ``shardings``: each
    leaf's shard shape (``sharding.shard_shape``) times its itemsize, from shapes only; a PRNG key counts as its
    raw data's trailing axis of words."""
    import jax
    import jax.numpy as jnp

    def nbytes(leaf, sharding):
        shard = sharding.shard_shape(tuple(np.shape(leaf)))
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = jax.eval_shape(jax.random.key_data, leaf)
            return int(np.prod(shard + data.shape[len(shard) :], dtype=np.int64)) * jnp.dtype(data.dtype).itemsize
        return int(np.prod(shard, dtype=np.int64)) * jnp.dtype(leaf.dtype).itemsize

    return int(sum(jax.tree.leaves(jax.tree.map(nbytes, tree, shardings))))


def bytes_worker() -> dict:
    """Bytes per device of every learner's components on every mesh of :data:`MESHES` (needs
    :data:`FORCED_DEVICES` devices), and this machine's description."""
    import jax

    from lpjax.sharding import batch_sharding, make_mesh, replay_shardings, state_shardings

    devices = jax.devices()
    result: dict[str, Any] = {
        "machine": dict(machine_info(), jax=jax.__version__, forced_host_devices=len(devices)),
        "bytes_per_device": {},
    }
    for name, learner in abstract_learners().items():
        state, replay, batch, parts = learner["state"], learner["replay"], learner["batch"], learner["parts"]
        params = parts["params"](state)
        rows = []
        for data, fsdp in MESHES:
            mesh = make_mesh(data, fsdp, devices[: data * fsdp])
            shardings = state_shardings(state, mesh)
            components = {part: bytes_per_device(pick(state), pick(shardings)) for part, pick in parts.items()}
            whole_state = bytes_per_device(state, shardings)
            if sum(components.values()) != whole_state:  # the parts cover the state exactly once
                raise AssertionError(f"{name}: components {components} do not add up to the state ({whole_state})")
            components["replay"] = 0 if replay is None else bytes_per_device(replay, replay_shardings(replay, mesh))
            components["batch"] = bytes_per_device(batch, jax.tree.map(lambda _: batch_sharding(mesh), batch))
            rows.append(
                dict(
                    data=data,
                    fsdp=fsdp,
                    devices=data * fsdp,
                    components=components,
                    state=whole_state,
                    total=sum(components.values()),
                )
            )
        base = rows[0]
        for row in rows:
            row["ratio_vs_1x1"] = {
                key: (row["components"][key] / base["components"][key] if base["components"][key] else None)
                for key in COMPONENTS
            }
            row["ratio_vs_1x1"]["state"] = row["state"] / base["state"]
            row["ratio_vs_1x1"]["total"] = row["total"] / base["total"]
        result["bytes_per_device"][name] = dict(
            config=learner["config"],
            param_count=int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(params))),
            global_bytes=dict(base["components"], state=base["state"], total=base["total"]),
            meshes=rows,
        )
    return result


# ------------------------------------------------------------------------------------------ step timings (workers)


class CompileCounter:
    """Counts XLA backend compilations (``jax.monitoring``'s backend-compile duration events)."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.count = 0

    def __call__(self, event: str, duration_secs: float, **_: Any) -> None:
        if event == self.EVENT:
            self.count += 1


def time_steps(step: Callable[[Any], tuple[Any, Any]], state: Any, warmup: int, reps: int, counter: CompileCounter):
    """Runs ``step(state) -> (state, metrics)`` (each call blocked on): one call, then at least ``warmup`` more
    and more while a call compiled (at most :data:`MAX_EXTRA_WARMUP` extra), then ``reps`` timed calls. Returns
    the final state and the timing record."""
    import jax

    start_compiles = counter.count
    start = time.perf_counter()
    state, metrics = jax.block_until_ready(step(state))
    first_call_s = time.perf_counter() - start
    first_metrics = {k: float(np.ravel(v)[0]) for k, v in metrics.items()}
    warmup_steps, compiled = 0, True
    while warmup_steps < warmup or (compiled and warmup_steps < warmup + MAX_EXTRA_WARMUP):
        before = counter.count
        state, metrics = jax.block_until_ready(step(state))
        warmup_steps, compiled = warmup_steps + 1, counter.count > before
    warm_compiles = counter.count
    held = [state, metrics]

    def call():
        held[:] = step(held[0])
        return held

    timing = interleaved({"step": call}, reps, warmup=0, per_call=True)["step"]
    state, metrics = held
    return state, dict(
        median_ms=1e3 * timing["median_s"],
        min_ms=1e3 * timing["min_s"],
        max_ms=1e3 * timing["max_s"],
        reps=reps,
        first_call_s=first_call_s,
        warmup_steps=warmup_steps,
        compiles_in_warmup=warm_compiles - start_compiles,
        compiles_while_timing=counter.count - warm_compiles,
        first_step=first_metrics,
        last_step_finite=bool(all(np.all(np.isfinite(np.asarray(v))) for v in metrics.values())),
    )


def sharding_drift(state: Any, mesh: Any) -> list[str]:
    """The leaves of ``state`` whose sharding is not :func:`lpjax.sharding.state_shardings`' (as
    ``path: expected -> actual`` partition specs)."""
    import jax

    from lpjax.sharding import state_shardings

    drift = []
    for (path, leaf), expected in zip(
        jax.tree_util.tree_flatten_with_path(state)[0], jax.tree.leaves(state_shardings(state, mesh)), strict=True
    ):
        if not leaf.sharding.is_equivalent_to(expected, leaf.ndim):
            drift.append(f"{jax.tree_util.keystr(path)}: {expected.spec} -> {leaf.sharding.spec}")
    return drift


def _sac_step(devices: int, sizes: dict, warmup: int, reps: int, counter: CompileCounter) -> dict:
    import jax
    import jax.numpy as jnp

    from experiments.configs.sac import fp32
    from lpjax.agents import sac
    from lpjax.sharding import batch_sharding, make_mesh, place

    mesh = make_mesh(devices, 1)
    agent = fp32.get_config().agent.to_dict()
    agent.update(hidden_dims=sizes["hidden_dims"], batch_size=sizes["batch_size"])
    config = sac.SACConfig.from_mapping(agent)
    state = jax.jit(sac.init, static_argnums=(2, 3))(
        jax.random.key(0), jnp.zeros(STEP_OBS_DIM), STEP_ACTION_DIM, config
    )
    state = place(state, mesh)
    rng, rows = np.random.default_rng(0), config.batch_size
    batch = random_transitions(rng, rows, STEP_OBS_DIM, STEP_ACTION_DIM)
    batch = jax.device_put(batch, batch_sharding(mesh))
    state, timing = time_steps(lambda s: sac.update(s, batch), state, warmup, reps, counter)
    return dict(timing, data=devices, fsdp=1, devices=devices, sharding_drift=sharding_drift(state, mesh))


def _grpo_step(devices: int, sizes: dict, warmup: int, reps: int, counter: CompileCounter) -> dict:
    import jax
    import jax.numpy as jnp

    from experiments.configs.grpo import fp32
    from lpjax.agents.grpo import GRPOConfig, init_state, train_step, transformer_models
    from lpjax.sharding import batch_sharding, make_mesh, place
    from lpjax.tasks.synthetic import make_task

    mesh = make_mesh(1, devices)
    run_config = fp32.get_config()
    task = make_task(run_config.env.split(":")[1], run_config.num_digits)
    config = GRPOConfig.from_mapping(dict(run_config.agent, max_new_tokens=task.seq_len - task.prompt_len))
    lm = dict(run_config.model, **sizes, vocab_size=task.vocab_size, max_len=task.seq_len)
    model, _ = transformer_models(lm, config)
    params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, task.seq_len), jnp.int32))
    state = init_state(params, config)
    state = place(state, mesh)
    rng, rows, length = np.random.default_rng(0), config.batch_size, task.seq_len
    mask = np.zeros((rows, length), np.float32)
    mask[:, task.prompt_len :] = 1.0
    batch = (
        rng.integers(0, task.vocab_size, (rows, length)).astype(np.int32),
        mask,
        (-rng.uniform(0.5, 3.0, (rows, length)) * mask).astype(np.float32),
        rng.standard_normal(rows).astype(np.float32),
    )
    batch = jax.device_put(batch, batch_sharding(mesh))
    step = functools.partial(train_step, model, config, mesh=mesh)
    state, timing = time_steps(lambda s: step(s, *batch), state, warmup, reps, counter)
    return dict(timing, data=1, fsdp=devices, devices=devices, sharding_drift=sharding_drift(state, mesh))


def step_worker(devices: int, quick: bool, warmup: int, reps: int, grpo: bool) -> dict:
    """Step timings of this process's ``devices`` forced host devices."""
    import jax

    if jax.device_count() != devices:
        raise RuntimeError(f"expected {devices} devices, got {jax.device_count()}: XLA_FLAGS was not applied")
    sizes = STEP_SIZES["quick" if quick else "full"]
    counter = CompileCounter()
    jax.monitoring.register_event_duration_secs_listener(counter)
    load_before = os.getloadavg()[0]
    result = {"sac_update": _sac_step(devices, sizes["sac"], warmup, reps, counter)}
    if grpo:
        result["grpo_train_step"] = _grpo_step(devices, sizes["grpo"], warmup, reps, counter)
    result["load_average_1min"] = [load_before, os.getloadavg()[0]]
    return result


# -------------------------------------------------------------------------------------------------- summary


def summarize_steps(rounds: list[dict[int, dict]], quick: bool) -> dict:
    """Per workload and device count: the median over rounds of each worker's median, the per-round figures and
    the worker's diagnostics (first round's), and the ratio to 1 device."""
    sizes = STEP_SIZES["quick" if quick else "full"]
    workloads = {
        "sac_update": dict(
            what="lpjax.agents.sac.update, data-parallel meshes (n, 1)",
            config=dict(
                policy="fp32",
                obs_dim=STEP_OBS_DIM,
                action_dim=STEP_ACTION_DIM,
                hidden_dims=list(sizes["sac"]["hidden_dims"]),
                batch_size=sizes["sac"]["batch_size"],
            ),
        ),
        "grpo_train_step": dict(
            what="lpjax.agents.grpo.train_step(..., mesh=mesh), FSDP meshes (1, n)",
            config=dict(policy="fp32", source="experiments/configs/grpo/fp32.py", model=dict(sizes["grpo"])),
        ),
    }
    summary = {}
    for workload, meta in workloads.items():
        if workload not in rounds[0][STEP_DEVICES[0]]:
            continue
        runs = []
        for devices in STEP_DEVICES:
            records = [r[devices][workload] for r in rounds]
            run = dict(records[0])
            run.update(
                median_ms=float(np.median([r["median_ms"] for r in records])),
                min_ms=float(min(r["min_ms"] for r in records)),
                max_ms=float(max(r["max_ms"] for r in records)),
                round_median_ms=[r["median_ms"] for r in records],
                compiles_while_timing=int(sum(r["compiles_while_timing"] for r in records)),
                last_step_finite=all(r["last_step_finite"] for r in records),
            )
            runs.append(run)
        for run in runs:
            run["ratio_vs_1_device"] = run["median_ms"] / runs[0]["median_ms"]
        summary[workload] = dict(meta, runs=runs)
    return summary


def table(result: dict) -> str:
    lines = ["bytes per device (MB) by component; total and its ratio to (1, 1)"]
    short = {"params": "params", "optimizer": "opt", "targets": "target", "other": "other", "replay": "replay"}
    for name, learner in result["bytes_per_device"].items():
        lines.append(f"\n{name} ({learner['param_count']:,} parameters)")
        lines.append(
            f"  {'mesh':>6s} " + " ".join(f"{v:>9s}" for v in short.values()) + f" {'batch':>9s} {'total':>9s}"
        )
        for row in learner["meshes"]:
            mesh = f"{row['data']}x{row['fsdp']}"
            cells = [row["components"][c] / 1e6 for c in (*short, "batch")]
            ratio = row["ratio_vs_1x1"]["total"]
            lines.append(
                f"  {mesh:>6s} " + " ".join(f"{c:9.3f}" for c in cells) + f" {row['total'] / 1e6:9.3f} ({ratio:.3f}x)"
            )
    lines.append("\nstep time on this CPU (ms, median; forced host devices share its cores: overhead, not speed-up)")
    for workload, entry in result["step_time"].items():
        cells = [
            f"{run['devices']} dev {run['median_ms']:8.2f} ({run['ratio_vs_1_device']:.2f}x)" for run in entry["runs"]
        ]
        lines.append(f"  {workload:16s} " + "  ".join(cells))
    return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib.ticker

    learners = result["bytes_per_device"]
    with figure(path, 1, len(learners) + 1, figsize=(4.6 * (len(learners) + 1), 4.4), dpi=100) as (fig, axes):
        colors = dict(zip(COMPONENTS, ("tab:blue", "tab:orange", "tab:green", "tab:gray", "tab:purple", "tab:olive")))
        for ax, (name, learner) in zip(axes, learners.items()):
            labels = [f"{row['data']}x{row['fsdp']}" for row in learner["meshes"]]
            bottom = np.zeros(len(labels))
            for component in COMPONENTS:
                values = np.array([row["components"][component] / 1e6 for row in learner["meshes"]])
                if values.any():
                    ax.bar(labels, values, bottom=bottom, color=colors[component], label=component)
                    bottom += values
            ax.set_title(f"{name}: MB per device")
            ax.set_xlabel("mesh (data x fsdp)")
        axes[0].legend(fontsize=8)
        ax = axes[-1]
        for workload, entry in result["step_time"].items():
            devices = [run["devices"] for run in entry["runs"]]
            (line,) = ax.plot(devices, [run["median_ms"] for run in entry["runs"]], "o-", label=workload)
            for run in entry["runs"]:  # each round's median: the spread is the machine's noise
                rounds = run["round_median_ms"]
                ax.plot([run["devices"]] * len(rounds), rounds, "_", color=line.get_color(), markersize=10, alpha=0.6)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(list(STEP_DEVICES))
        ax.set_xlabel("forced host devices (sharing the CPU)")
        ax.set_ylabel("ms per step (median; dashes: rounds)")
        ax.set_title(f"step time, {result['machine']['cpu_count']} CPU cores")
        ax.legend(fontsize=8)
        fig.suptitle("lpjax learners on a (data, fsdp) mesh: bytes per device and partitioning overhead on a CPU")


# -------------------------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    cli = parser(RESULT_NAME, __doc__, quick="tiny networks, few steps, XLA backend optimizations off: a smoke run")
    cli.add_argument("--rounds", type=int, default=None, help="rounds over the device counts (default 3; quick 1)")
    cli.add_argument("--reps", type=int, default=None, help="timed steps per worker (default 30; quick 3)")
    cli.add_argument("--warmup", type=int, default=None, help="untimed steps after the first (default 3; quick 1)")
    cli.add_argument("--jobs", type=int, default=1, help="workers at once (more only for smoke runs: they skew times)")
    cli.add_argument("--no-grpo-step", dest="grpo_step", action="store_false", help="time SAC's update only")
    cli.add_argument("--worker", choices=("bytes", "step"), help=argparse.SUPPRESS)
    cli.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    args = cli.parse_args(argv)
    for name, quick, full in (("rounds", 1, 3), ("reps", 3, 30), ("warmup", 1, 3)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if min(args.rounds, args.reps, args.jobs) < 1 or args.warmup < 0:
        cli.error("--rounds, --reps and --jobs must be >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.worker == "bytes":
        print(json.dumps(bytes_worker()))
        return None
    if args.worker == "step":
        print(json.dumps(step_worker(args.devices, args.quick, args.warmup, args.reps, args.grpo_step)))
        return None

    jobs = [("bytes", FORCED_DEVICES)] + [("step", n) for _ in range(args.rounds) for n in STEP_DEVICES]
    start = time.perf_counter()
    outputs = run_workers(jobs, args, args.jobs)
    counted, steps = outputs[0], outputs[1:]
    rounds = [
        dict(zip(STEP_DEVICES, steps[i : i + len(STEP_DEVICES)])) for i in range(0, len(steps), len(STEP_DEVICES))
    ]
    machine = dict(counted["machine"])
    machine["load_average_1min_per_worker"] = [s["load_average_1min"] for s in steps]
    result = {
        "benchmark": RESULT_NAME,
        "command": command_line(MODULE, argv),
        "note": NOTE.format(cores=machine["cpu_count"]),
        "notes": NOTES,
        "quick": args.quick,
        "machine": machine,
        "meshes": [list(mesh) for mesh in MESHES],
        "components": COMPONENTS,
        "bytes_per_device": counted["bytes_per_device"],
        "step_time": summarize_steps(rounds, args.quick),
        "settings": dict(
            rounds=args.rounds,
            reps=args.reps,
            warmup=args.warmup,
            jobs=args.jobs,
            worker_xla_flags={n: worker_flags(n, args.quick) for n in sorted({FORCED_DEVICES, *STEP_DEVICES})},
        ),
        "wall_s": time.perf_counter() - start,
    }
    return finish(args, result, table(result), plot)


if __name__ == "__main__":
    main()
