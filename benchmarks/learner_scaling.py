"""Learners on a device mesh: bytes each device holds, and the cost of partitioning a step, per mesh.

The learners' mesh (:mod:`lpjax.sharding`) has two axes, ``("data", "fsdp")``: data parallelism replicates the
state and splits the batch; FSDP splits every state leaf of two or more axes along its largest axis that ``fsdp``
divides and keeps vectors, scalars, counters and keys replicated; the replay's capacity axis is split over every
device.

1. Bytes per device, counted from shapes in a worker with :data:`FORCED_DEVICES` forced host devices: one
   device's bytes of each of :data:`COMPONENTS` for each learner and mesh of :data:`MESHES`, and their ratios to
   (1, 1). ``sac_fp16`` is the paper's SAC (:data:`SAC_SIZES`), ``d4pg`` D4PG's default config, ``grpo_fp16`` GRPO
   with a larger transformer (:data:`GRPO_BYTES_MODEL`).
2. Step time on this CPU: SAC's fp32 update on the data-parallel meshes (n, 1) and GRPO's fp32 ``train_step`` on
   the FSDP meshes (1, n), one worker per device count with that many forced host devices, which share this
   machine's cores: the times measure the overhead of partitioning a step, not speed-ups. Every step is blocked on
   (XLA:CPU's collectives can time out under deep asynchronous dispatch); ``--rounds`` rounds run the device
   counts in turn and the median over rounds of each worker's median is reported.

``--quick`` times tiny networks without XLA's backend optimizations (a smoke run); the byte counts are cheap and
use the full sizes either way.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import math
import operator
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.common import REPO, command_line, figure, finish, format_table, machine_info, parser, random_transitions
from benchmarks.timing import CompileTimer, interleaved, machine_load

RESULT_NAME = "learner_scaling"
MODULE = "benchmarks.learner_scaling"
FORCED_DEVICES = 4
MESHES = ((1, 1), (2, 1), (4, 1), (1, 2), (1, 4), (2, 2))
"""The ``(data, fsdp)`` meshes of the byte counts."""
STEP_DEVICES = (1, 2, 4)
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
"""The paper's SAC from states: walker-walk's observation and action sizes."""
D4PG_ENV_SIZES = {"dmc:cartpole-balance": (5, 1)}
"""``(obs_dim, action_dim)`` of the D4PG config's environment."""
GRPO_BYTES_MODEL = dict(d_model=512, num_layers=8, d_ff=2048, num_heads=8)
STEP_SIZES = {
    "full": dict(sac=dict(hidden_dims=(256, 256), batch_size=256), grpo=dict(zip(GRPO_BYTES_MODEL, (256, 4, 1024, 8)))),
    "quick": dict(sac=dict(hidden_dims=(32, 32), batch_size=32), grpo=dict(zip(GRPO_BYTES_MODEL, (32, 1, 64, 4)))),
}
"""Networks of the step timings: SAC's hidden layers and batch, GRPO's transformer (batch: the config's)."""
STEP_OBS_DIM, STEP_ACTION_DIM = 24, 6
QUICK_XLA_FLAGS = "--xla_backend_optimization_level=0"
MAX_EXTRA_WARMUP = 5
"""Warm-up steps beyond ``--warmup`` while a step still compiles (a state whose shardings the step changed)."""
ROUND_STATS = dict(median_ms=statistics.median, min_ms=min, max_ms=max, compiles_while_timing=sum, last_step_finite=all)
"""How a step timing's figures combine over the rounds' workers (``round_median_ms`` keeps each round's median)."""

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


def worker_flags(devices: int, quick: bool) -> str:
    """This process's ``XLA_FLAGS`` with ``devices`` forced XLA:CPU devices (and, quick, :data:`QUICK_XLA_FLAGS`)."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", ""))
    return " ".join(f"{flags} --xla_force_host_platform_device_count={devices} {QUICK_XLA_FLAGS * quick}".split())


def run_workers(jobs: list[tuple[str, int]], args: argparse.Namespace) -> list[dict]:
    """Runs ``python -m benchmarks.learner_scaling --worker kind`` with ``devices`` forced host devices for each
    ``(kind, devices)``, at most ``args.jobs`` at a time, in order; returns the json each printed last."""

    def run(kind: str, devices: int) -> dict:
        print(f"worker {kind}, {devices} device(s)", flush=True)
        command = [sys.executable, "-m", MODULE, "--worker", kind, "--devices", str(devices)]
        command += [f"--reps={args.reps}", f"--warmup={args.warmup}"] + ["--quick"] * args.quick
        command += ["--no-grpo-step"] * (not args.grpo_step)
        env = dict(os.environ, XLA_FLAGS=worker_flags(devices, args.quick), JAX_PLATFORMS="cpu")
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"{kind} ({devices} devices) worker failed (exit {proc.returncode}):\n{tail}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    pool = concurrent.futures.ThreadPoolExecutor(args.jobs)
    try:
        return list(pool.map(run, *zip(*jobs)))
    finally:
        pool.shutdown(cancel_futures=True)  # after a failed worker, start no more


def grpo_setup(config_module: Any, sizes: dict, rng: np.random.Generator) -> tuple:
    """GRPO of ``config_module.get_config()`` with the transformer's ``sizes``: its env, agent config (generating
    the synthetic task's answer), model settings, training model and a ``train_step`` batch drawn by ``rng``."""
    from lpjax.agents.grpo import GRPOConfig, transformer_models
    from lpjax.tasks.synthetic import make_task

    run_config = config_module.get_config()
    task = make_task(run_config.env.split(":")[1], run_config.num_digits)
    config = GRPOConfig.from_mapping(dict(run_config.agent, max_new_tokens=task.seq_len - task.prompt_len))
    model = dict(run_config.model, **sizes, vocab_size=task.vocab_size, max_len=task.seq_len)
    mask = np.zeros((config.batch_size, task.seq_len), np.float32)
    mask[:, task.prompt_len :] = 1.0
    batch = dict(tokens=rng.integers(0, task.vocab_size, mask.shape).astype(np.int32), mask=mask)
    batch.update(logp_rollout=(-rng.uniform(0.5, 3.0, mask.shape) * mask).astype(np.float32))
    batch.update(advantages=rng.standard_normal(config.batch_size).astype(np.float32))
    return run_config.env, config, model, transformer_models(model, config)[0], batch


def bytes_per_device(tree: Any, shardings: Any) -> int:
    """The bytes one device holds of ``tree`` (arrays or ``jax.ShapeDtypeStruct``) under ``shardings``, from shapes
    only: each leaf's shard shape times its itemsize (a PRNG key's: its raw data's words)."""
    import jax

    nbytes = lambda leaf, sharding: math.prod(sharding.shard_shape(np.shape(leaf))) * leaf.dtype.itemsize
    return int(sum(jax.tree.leaves(jax.tree.map(nbytes, tree, shardings))))


def learner_bytes(state: Any, replay: Any, batch: Any, parts: dict[str, Callable], config: dict) -> dict:
    """One learner's ``bytes_per_device``: one device's bytes of each of :data:`COMPONENTS` on each mesh of
    :data:`MESHES` and their ratios to (1, 1); ``parts`` picks each state component from a state-shaped tree."""
    import jax

    from lpjax.sharding import batch_sharding, make_mesh, replay_shardings, state_shardings

    rows = []
    for data, fsdp in MESHES:
        mesh = make_mesh(data, fsdp, jax.devices()[: data * fsdp])
        shardings = state_shardings(state, mesh)
        components = {part: bytes_per_device(pick(state), pick(shardings)) for part, pick in parts.items()}
        whole_state = bytes_per_device(state, shardings)
        if sum(components.values()) != whole_state:  # the parts cover the state exactly once
            raise AssertionError(f"{config['source']}: components {components} do not add up to {whole_state}")
        components["replay"] = 0 if replay is None else bytes_per_device(replay, replay_shardings(replay, mesh))
        components["batch"] = bytes_per_device(batch, jax.tree.map(lambda _: batch_sharding(mesh), batch))
        row = dict(data=data, fsdp=fsdp, devices=data * fsdp, components=components, state=whole_state)
        rows.append(row | dict(total=sum(components.values())))
    base = dict(rows[0]["components"], state=rows[0]["state"], total=rows[0]["total"])
    for row in rows:
        ratios = {key: row["components"][key] / base[key] if base[key] else None for key in COMPONENTS}
        row["ratio_vs_1x1"] = ratios | {key: row[key] / base[key] for key in ("state", "total")}
    param_count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(parts["params"](state)))
    return dict(config=config, param_count=param_count, global_bytes=base, meshes=rows)


def bytes_worker() -> dict:
    """:func:`learner_bytes` of each of :data:`LEARNERS` (abstract states and replay buffers), and this machine."""
    import jax
    import jax.numpy as jnp

    from experiments.configs.d4pg import _base as d4pg_base
    from experiments.configs.grpo import fp16 as grpo_fp16
    from experiments.configs.sac import fp16 as sac_fp16
    from experiments.d4pg_loop import example_transition
    from lpjax.agents import d4pg, sac
    from lpjax.agents.grpo import init_state
    from lpjax.replay import replay_init

    key = jax.random.key(0)
    methods = lambda config: [m for m in config.methods.switches() if getattr(config.methods, m)]
    picks = lambda *parts: {c: operator.attrgetter(*p.split()) for c, p in zip(STATE_COMPONENTS, parts, strict=True)}

    def off_policy(init, config, nets, targets, obs_dim, action_dim, capacity, **summary):
        """``nets``: the trained networks (their params and optimizer states), ``targets``: the target fields."""
        trained = (" ".join(f"{net}.{field}" for net in nets) for field in ("params", "opt_state"))
        example = example_transition(np.zeros(obs_dim, np.float32), action_dim)
        state = jax.eval_shape(lambda k: init(k, jnp.zeros(obs_dim), action_dim, config), key)
        batch = {k: jax.ShapeDtypeStruct((config.batch_size, *np.shape(v)), v.dtype) for k, v in example.items()}
        summary |= dict(policy=config.policy, methods=methods(config), batch_size=config.batch_size)
        summary |= dict(replay_capacity=capacity, obs_dim=obs_dim, action_dim=action_dim)
        replay = jax.eval_shape(lambda: replay_init(example, capacity))
        return learner_bytes(state, replay, batch, picks(*trained, targets, "step key"), summary)

    # The optimizer per leaf: a run refuses FSDP with the fused optimizer, whose flat buffers FSDP would replicate.
    agent = sac_fp16.get_config().agent.to_dict() | {k: SAC_SIZES[k] for k in ("hidden_dims", "batch_size")}
    config = sac.SACConfig.from_mapping(agent | dict(fused_optimizer=False))
    sizes = [SAC_SIZES[k] for k in ("obs_dim", "action_dim", "replay_capacity")]
    summary = dict(source="experiments/configs/sac/fp16.py", hidden_dims=list(config.hidden_dims))
    nets, targets = ("actor", "critic", "temperature"), "target_critic target_compensation"
    learners = dict(sac_fp16=off_policy(sac.init, config, nets, targets, *sizes, **summary))
    run_config = d4pg_base.get_config()
    config = d4pg.D4PGConfig.from_mapping(dict(run_config.agent.to_dict(), fused_optimizer=False))  # as SAC's
    if run_config.env not in D4PG_ENV_SIZES:
        raise ValueError(f"D4PG's default env is now {run_config.env!r}: add its sizes to D4PG_ENV_SIZES.")
    summary = dict(source="experiments/configs/d4pg/_base.py", env=run_config.env)
    summary.update(actor_hidden=list(config.actor_hidden), critic_hidden=list(config.critic_hidden))
    nets, targets = ("actor", "critic"), "target_actor target_critic target_compensation"
    sizes = [*D4PG_ENV_SIZES[run_config.env], run_config.replay_capacity]
    learners["d4pg"] = off_policy(d4pg.init, config, nets, targets, *sizes, **summary, num_atoms=config.num_atoms)
    env, config, model, train_model, batch = grpo_setup(grpo_fp16, GRPO_BYTES_MODEL, np.random.default_rng(0))
    rows, length = batch["mask"].shape
    state = jax.eval_shape(lambda k: init_state(train_model.init(k, np.zeros((1, length), np.int32)), config), key)
    summary = dict(source="experiments/configs/grpo/fp16.py", env=env, policy=config.policy, methods=methods(config))
    summary.update(model=model, batch_size=rows, sequence_length=length)
    parts = picks("trainable.params", "trainable.opt_state", "ref_params", "step")
    learners["grpo_fp16"] = learner_bytes(state, None, batch, parts, summary)
    machine = dict(machine_info(), jax=jax.__version__, forced_host_devices=jax.device_count())
    return dict(machine=machine, bytes_per_device=learners)


def time_steps(step: Callable, state: Any, batch: Any, mesh: Any, warmup: int, reps: int, counter: CompileTimer):
    """Runs ``step(state, *batch) -> (state, metrics)`` on ``mesh`` (the state placed with ``lpjax.sharding.place``,
    the batch split by ``batch_sharding``; each call blocked on): one call, at least ``warmup`` more and more while
    a call compiled (at most :data:`MAX_EXTRA_WARMUP` extra), then ``reps`` timed calls. Returns the timing record,
    with the state leaves whose sharding after the steps is not ``state_shardings``'."""
    import jax

    from lpjax.sharding import batch_sharding, place, state_shardings

    batch, state = jax.device_put(batch, batch_sharding(mesh)), place(state, mesh)
    first, start = counter.count, time.perf_counter()
    state, metrics = jax.block_until_ready(step(state, *batch))
    first_call_s = time.perf_counter() - start
    first_metrics = {k: float(np.ravel(v)[0]) for k, v in metrics.items()}
    warmup_steps, compiled = 0, True
    while warmup_steps < warmup or (compiled and warmup_steps < warmup + MAX_EXTRA_WARMUP):
        before = counter.count
        state, metrics = jax.block_until_ready(step(state, *batch))
        warmup_steps, compiled = warmup_steps + 1, counter.count > before
    warm, held = counter.count, [state, metrics]

    def call():
        held[:] = step(held[0], *batch)
        return held

    timing = interleaved({"step": call}, reps, warmup=0, per_call=True)["step"]
    state, metrics = held
    record = {f"{stat}_ms": 1e3 * timing[f"{stat}_s"] for stat in ("median", "min", "max")}
    record.update(reps=reps, first_call_s=first_call_s, warmup_steps=warmup_steps)
    record.update(compiles_in_warmup=warm - first, compiles_while_timing=counter.count - warm, first_step=first_metrics)
    record.update(last_step_finite=bool(all(np.all(np.isfinite(np.asarray(v))) for v in metrics.values())))
    leaves, expected = jax.tree_util.tree_flatten_with_path(state)[0], jax.tree.leaves(state_shardings(state, mesh))
    drift = [
        f"{jax.tree_util.keystr(path)}: {want.spec} -> {leaf.sharding.spec}"
        for (path, leaf), want in zip(leaves, expected, strict=True)
        if not leaf.sharding.is_equivalent_to(want, leaf.ndim)
    ]
    return record | dict(data=mesh.shape["data"], fsdp=mesh.shape["fsdp"], devices=mesh.size, sharding_drift=drift)


def step_worker(args: argparse.Namespace) -> dict:
    """Step timings (:func:`time_steps`) on this process's ``args.devices`` forced host devices."""
    import jax
    import jax.numpy as jnp

    from experiments.configs.grpo import fp32 as grpo_fp32
    from experiments.configs.sac import fp32 as sac_fp32
    from lpjax.agents import sac
    from lpjax.agents.grpo import init_state, train_step
    from lpjax.sharding import make_mesh

    devices, sizes = args.devices, STEP_SIZES["quick" if args.quick else "full"]
    if jax.device_count() != devices:
        raise RuntimeError(f"expected {devices} devices, got {jax.device_count()}: XLA_FLAGS was not applied")
    timed = functools.partial(time_steps, warmup=args.warmup, reps=args.reps, counter=CompileTimer())
    load_before = machine_load()[0]
    config = sac.SACConfig.from_mapping(sac_fp32.get_config().agent.to_dict() | sizes["sac"])
    state = jax.jit(lambda k: sac.init(k, jnp.zeros(STEP_OBS_DIM), STEP_ACTION_DIM, config))(jax.random.key(0))
    batch = random_transitions(np.random.default_rng(0), config.batch_size, STEP_OBS_DIM, STEP_ACTION_DIM)
    result = {"sac_update": timed(sac.update, state, [batch], make_mesh(devices, 1))}
    if args.grpo_step:
        mesh = make_mesh(1, devices)
        _, config, _, model, batch = grpo_setup(grpo_fp32, sizes["grpo"], np.random.default_rng(0))
        params = jax.jit(model.init)(jax.random.key(0), jnp.zeros_like(batch["tokens"][:1]))
        step = functools.partial(train_step, model, config, mesh=mesh)
        result["grpo_train_step"] = timed(step, init_state(params, config), list(batch.values()), mesh)
    return result | dict(load_average_1min=[load_before, machine_load()[0]])


def summarize_steps(steps: list[dict], quick: bool) -> dict:
    """Per workload and device count: the first round's record with its figures combined over rounds
    (:data:`ROUND_STATS`), each round's median, and the ratio to 1 device."""
    sizes = STEP_SIZES["quick" if quick else "full"]
    sac_config = dict(policy="fp32", obs_dim=STEP_OBS_DIM, action_dim=STEP_ACTION_DIM)
    sac_config |= dict(hidden_dims=list(sizes["sac"]["hidden_dims"]), batch_size=sizes["sac"]["batch_size"])
    grpo_config = dict(policy="fp32", source="experiments/configs/grpo/fp32.py", model=dict(sizes["grpo"]))
    workloads = {
        "sac_update": ("lpjax.agents.sac.update, data-parallel meshes (n, 1)", sac_config),
        "grpo_train_step": ("lpjax.agents.grpo.train_step(..., mesh=mesh), FSDP meshes (1, n)", grpo_config),
    }
    summary = {}
    for workload, (what, config) in workloads.items():
        if workload not in steps[0]:
            continue
        runs = []
        for i in range(len(STEP_DEVICES)):  # steps: the device counts in turn, round after round
            records = [step[workload] for step in steps[i :: len(STEP_DEVICES)]]
            stats = {key: combine([record[key] for record in records]) for key, combine in ROUND_STATS.items()}
            runs.append(records[0] | stats | dict(round_median_ms=[record["median_ms"] for record in records]))
        for run in runs:
            run["ratio_vs_1_device"] = run["median_ms"] / runs[0]["median_ms"]
        summary[workload] = dict(what=what, config=config, runs=runs)
    return summary


def table(result: dict) -> str:
    lines = ["bytes per device (MB) by component; total and its ratio to (1, 1)"]
    header = ["mesh", "params", "opt", "target", "other", "replay", "batch", "total"]  # COMPONENTS' short names
    for name, learner in result["bytes_per_device"].items():
        lines.append(f"\n{name} ({learner['param_count']:,} parameters)")
        rows = [
            [f"{row['data']}x{row['fsdp']}", *(row["components"][c] / 1e6 for c in COMPONENTS)]
            + [row["total"] / 1e6, f"({row['ratio_vs_1x1']['total']:.3f}x)"]
            for row in learner["meshes"]
        ]
        lines += format_table(header, rows, [">6"] + [">9.3f"] * 7 + [""], indent="  ")
    lines.append("\nstep time on this CPU (ms, median; forced host devices share its cores: overhead, not speed-up)")
    for workload, entry in result["step_time"].items():
        cells = [f"{r['devices']} dev {r['median_ms']:8.2f} ({r['ratio_vs_1_device']:.2f}x)" for r in entry["runs"]]
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
            ax.set(title=f"{name}: MB per device", xlabel="mesh (data x fsdp)")
        axes[0].legend(fontsize=8)
        ax = axes[-1]
        for workload, entry in result["step_time"].items():
            devices = [run["devices"] for run in entry["runs"]]
            (line,) = ax.plot(devices, [run["median_ms"] for run in entry["runs"]], "o-", label=workload)
            for run in entry["runs"]:  # each round's median: the spread is the machine's noise
                rounds = run["round_median_ms"]
                ax.plot([run["devices"]] * len(rounds), rounds, "_", color=line.get_color(), markersize=10, alpha=0.6)
        ax.set(yscale="log", xticks=list(STEP_DEVICES), title=f"step time, {result['machine']['cpu_count']} CPU cores")
        ax.set(xlabel="forced host devices (sharing the CPU)", ylabel="ms per step (median; dashes: rounds)")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.legend(fontsize=8)
        fig.suptitle("lpjax learners on a (data, fsdp) mesh: bytes per device and partitioning overhead on a CPU")


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
    if args.worker:
        print(json.dumps(bytes_worker() if args.worker == "bytes" else step_worker(args)))
        return None
    jobs = [("bytes", FORCED_DEVICES)] + [("step", n) for _ in range(args.rounds) for n in STEP_DEVICES]
    start = time.perf_counter()
    counted, *steps = run_workers(jobs, args)
    machine = dict(counted["machine"], load_average_1min_per_worker=[s["load_average_1min"] for s in steps])
    flags = {n: worker_flags(n, args.quick) for n in sorted({FORCED_DEVICES, *STEP_DEVICES})}
    note = NOTE.format(cores=machine["cpu_count"])
    result = dict(benchmark=RESULT_NAME, command=command_line(MODULE, argv), note=note, notes=NOTES, quick=args.quick)
    result.update(machine=machine, meshes=[list(mesh) for mesh in MESHES], components=COMPONENTS)
    result.update(bytes_per_device=counted["bytes_per_device"], step_time=summarize_steps(steps, args.quick))
    settings = dict(rounds=args.rounds, reps=args.reps, warmup=args.warmup, jobs=args.jobs, worker_xla_flags=flags)
    result.update(settings=settings, wall_s=time.perf_counter() - start)
    return finish(args, result, table(result), plot)


if __name__ == "__main__":
    main()
