"""ActorQ on this machine: D4PG with fp32 vs int8 actors, side by side, time to 95% of fp32's return.

Each run is one ``experiments.d4pg_loop.train`` of ``experiments/configs/d4pg/fp32.py`` or ``int8.py`` at a
CPU-affordable scale (the flags: 2 Ray actors, actor 3x1024, batch 64, samples-per-insert 32, 25k steps; ActorQ's
own scale gives too few updates here for D4PG to learn). The two runs of a seed differ only in what the actors
run and receive: fp32 weights with a JAX forward, or int8 weights (4x smaller broadcasts) on ONNX Runtime
(:class:`lpjax.inference.Int8MLP`). Recorded per run: the evaluation curve against steps and training wall-clock,
actor steps/s, learner updates/s, broadcast bytes and the actors' time split; per seed: fp32's final return ``R``
(mean of its last two evaluations) and each runtime's first time and step at ``0.95 R``, and their ratio.

Runs live in ``runs/actorq_speedup/<task>/<runtime>/seed<k>/`` (:mod:`experiments.run_farm`: finished runs are
not rerun, interrupted ones resume).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.common import REPO, command_line, figure, finish, parser
from experiments import run_farm

RUNTIMES = ("fp32", "int8")
TARGET_FRACTION = 0.95
OVERRIDES = dict(env="env", seed=None, total_env_steps="steps", num_actors="actors", backend="backend")
OVERRIDES.update(eval_every="eval_every", eval_episodes="eval_episodes", checkpoint_every="steps")
OVERRIDES.update(min_replay_size="min_replay", samples_per_insert="samples_per_insert")
"""The run config's fields the flags set (config field: flag)."""


def run_config(runtime: str, args: argparse.Namespace, seed: int):
    """The D4PG config of one run (configs/d4pg/<runtime>.py with the benchmark's overrides)."""
    from experiments.configs.d4pg import fp32, int8

    config = {"fp32": fp32, "int8": int8}[runtime].get_config()
    config.update({field: getattr(args, flag) if flag else seed for field, flag in OVERRIDES.items()}, log_every=50)
    config.agent.update(
        actor_hidden=(args.width,) * 3, critic_hidden=(min(args.width, 512),) * 3, batch_size=args.batch
    )
    return config


def train_run(runtime: str, args: argparse.Namespace, seed: int) -> pathlib.Path:
    """Trains (or resumes, or finds finished) one run; returns its directory."""
    from experiments import d4pg_loop

    run_dir = args.runs_dir / args.env.replace(":", "_") / runtime / f"seed{seed}"
    train = lambda resume, progress: d4pg_loop.train(run_config(runtime, args, seed), run_dir, resume, progress)
    outcome = run_farm.train_to_end(run_farm.Job(f"{runtime}/seed{seed}", run_dir, train=train), args.progress)
    if outcome["action"] == "skipped":
        print(f"{runtime} seed {seed}: finished earlier ({run_dir})")
    return run_dir


def read_run(run_dir: pathlib.Path) -> dict[str, Any]:
    """Evaluation curve (steps, wall seconds, returns) and the actor-learner record of one run."""
    from lpjax.run_logging import read_metrics

    columns = read_metrics(run_dir)
    rows = np.isfinite(columns["eval/return"])
    return {
        "steps": columns["step"][rows].tolist(),
        "wall_s": columns["eval/wall_s"][rows].tolist(),
        "returns": columns["eval/return"][rows].tolist(),
        "actor_learner": json.loads((run_dir / "actor_learner.json").read_text()),
    }


def time_to_target(run: dict[str, Any], target: float) -> dict[str, float | None]:
    """First evaluation at or above ``target``: its wall-clock seconds and environment step (None if never)."""
    reached = ({"wall_s": w, "step": s} for s, w, r in zip(run["steps"], run["wall_s"], run["returns"]) if r >= target)
    return next(reached, {"wall_s": None, "step": None})


def aggregate(runs: dict[int, dict[str, dict]]) -> dict[str, Any]:
    """Per seed: fp32's final return, the target, each runtime's time to it and the speed-up."""
    per_seed = {}
    for seed, by_runtime in runs.items():
        each = lambda fn: {rt: fn(run, run["actor_learner"]) for rt, run in by_runtime.items()}
        final = each(lambda run, _: float(np.mean(run["returns"][-2:])))
        target = TARGET_FRACTION * final["fp32"]
        reached = each(lambda run, _: time_to_target(run, target))
        fp32_t, int8_t = reached["fp32"]["wall_s"], reached["int8"]["wall_s"]
        per_seed[seed] = {"fp32_final_return": final["fp32"], "target_return": target, "time_to_target": reached}
        per_seed[seed].update(
            final_return=final,
            wall_clock_speedup=fp32_t / int8_t if fp32_t and int8_t else None,
            actor_steps_per_s=each(lambda _, al: [a["steps_per_s"] for a in al["actors"]]),
            actor_inference_s_per_step=each(
                lambda _, al: [a["time_split"]["inference"] / max(a["env_steps"], 1) for a in al["actors"]]
            ),
            learner_updates_per_s=each(lambda _, al: al["learner_updates_per_s"]),
            broadcast_bytes=each(lambda _, al: al["broadcast_bytes"]),
        )
    return per_seed


def plot(result: dict, path: pathlib.Path) -> None:
    with figure(path, 1, 2, figsize=(11, 4)) as (_, axes):
        for seed, by_runtime in result["runs"].items():
            for ax, x in zip(axes, ("steps", "wall_s")):
                for color, (runtime, run) in zip(("C0", "C1"), sorted(by_runtime.items())):
                    label = f"{runtime} actors (seed {seed})"
                    ax.plot(run[x], run["returns"], color=color, marker="o", ms=3, label=label)
                ax.axhline(result["per_seed"][seed]["target_return"], color="k", ls=":", lw=1)
        axes[0].set(
            xlabel="environment steps",
            ylabel="evaluation return (learner's fp32 policy)",
            title=f"D4PG on {result['settings']['env']}: fp32 vs int8 actors",
        )
        axes[1].set(xlabel="training wall-clock seconds", title="same runs vs time (dotted: 95% of fp32's final)")
        axes[0].legend(fontsize=8)


def main(argv: Sequence[str] | None = None) -> dict:
    cli = parser("actorq_speedup", __doc__)
    cli.add_argument("--env", default="dmc:cartpole-balance")
    cli.add_argument("--steps", type=int, default=25_000, help="environment steps per run")
    cli.add_argument("--seeds", default="0", help="comma-separated seeds")
    cli.add_argument("--actors", type=int, default=2)
    cli.add_argument("--backend", default="ray", choices=("ray", "inprocess"))
    cli.add_argument("--width", type=int, default=1024, help="actor width (ActorQ: 2048); critic min(w, 512)")
    cli.add_argument("--batch", type=int, default=64, help="learner batch size (ActorQ: 256)")
    cli.add_argument("--samples_per_insert", type=float, default=32.0, help="ActorQ's D4PG default: 16")
    cli.add_argument("--eval_every", type=int, default=2500)
    cli.add_argument("--eval_episodes", type=int, default=5)
    cli.add_argument("--min_replay", type=int, default=1000)
    cli.add_argument("--runs_dir", type=pathlib.Path, default=REPO / "runs" / "actorq_speedup")
    cli.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False)
    args = cli.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.perf_counter()
    runs = {seed: {runtime: read_run(train_run(runtime, args, seed)) for runtime in RUNTIMES} for seed in seeds}
    per_seed = aggregate(runs)
    settings = {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(args).items() if k != "no_plot"}
    result = {
        "command": command_line("benchmarks.actorq_speedup", argv),
        "settings": settings,
        "target_fraction": TARGET_FRACTION,
        "per_seed": per_seed,
        "runs": runs,
        "session_seconds": time.perf_counter() - started,
    }
    lines = [f"D4PG on {args.env}, {args.actors} {args.backend} actors, {args.steps} steps"]
    for seed, row in per_seed.items():
        times, rate, inference = row["time_to_target"], row["actor_steps_per_s"], row["actor_inference_s_per_step"]
        lines.append(
            f"seed {seed}: fp32 final {row['fp32_final_return']:.1f}, int8 final {row['final_return']['int8']:.1f}; "
            f"time to {TARGET_FRACTION:.0%}: fp32 {times['fp32']['wall_s']} s, int8 {times['int8']['wall_s']} s; "
            f"speed-up {row['wall_clock_speedup']}\n  actor steps/s fp32 {rate['fp32']}, int8 {rate['int8']}; "
            f"inference s/step fp32 {inference['fp32']}, int8 {inference['int8']}; "
            f"broadcast bytes {row['broadcast_bytes']}"
        )
    return finish(args, result, "\n".join(lines), plot)


if __name__ == "__main__":
    main()
