"""fp32 against fp16 SAC on MJX cartpole-swingup for the same wall-clock budget each: which one reaches a return
of 800 first (``make bench-gpu-train``, at most 6 minutes on an H100).

Both run the fully jitted loop (:mod:`experiments.sac_brax_loop`) with the experiment configs and :data:`LOOP` /
:data:`AGENT` (learning rates 3e-4, not the paper's 1e-4, so that 800 is within reach of a 100-second budget),
compiled first, outside the budget. The learners alternate chunks of :data:`CHUNK_ITERATIONS` iterations, the one
with less training time next, until each has trained ``--budget_s`` (shrunk equally to fit ``--deadline_s``),
evaluated every ``--eval_every_s`` of its own training time. Needs MuJoCo Playground; without it the json records
why.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from benchmarks.common import command_line, figure, finish, format_table, parser, run_environment
from benchmarks.steady_state import CACHE_DIR, enable_compilation_cache, error_record

ENV = "mjx:cartpole-swingup"
TARGET_RETURN = 800.0
CONFIGS = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
"""The experiment config (``experiments/configs/sac/<name>.py``) of each precision."""

LOOP = {"brax_num_envs": 64, "updates_per_step": 8, "seed_steps": 5120, "replay_capacity": 1_000_000}
AGENT = {"actor_lr": 3e-4, "critic_lr": 3e-4}
CHUNK_ITERATIONS = 250
"""Iterations per compiled chunk: 16,000 env steps and 2,000 updates with :data:`LOOP`."""

DEADLINE_S = 340.0
"""The run's limit by default: 6 minutes less the interpreter's start and the final plot."""

QUICK_LOOP = {"brax_num_envs": 4, "updates_per_step": 1, "seed_steps": 8, "replay_capacity": 4096}
QUICK_AGENT = {"hidden_dims": (32, 32), "batch_size": 32}
QUICK_CHUNK_ITERATIONS = 4


def settings(quick: bool) -> dict[str, Any]:
    """The environment, loop and agent settings (the json records them; :mod:`benchmarks.gpu_suite` too)."""
    return {"env": ENV, "loop": QUICK_LOOP if quick else LOOP, "agent": QUICK_AGENT if quick else AGENT}


def chunk_iterations(quick: bool) -> int:
    return QUICK_CHUNK_ITERATIONS if quick else CHUNK_ITERATIONS


def loop_settings(precision: str, quick: bool = False, devices: int = 1) -> Any:
    """The loop's :class:`experiments.sac_brax_loop.LoopSettings` (validated) of the experiment config of
    ``precision`` (:data:`CONFIGS`) with :func:`settings`, on a ``devices`` x 1 mesh."""
    from experiments import sac_brax_loop

    if precision not in CONFIGS:
        raise ValueError(f"precision must be one of {tuple(CONFIGS)}, got {precision!r}.")
    config = importlib.import_module(f"experiments.configs.sac.{CONFIGS[precision]}").get_config()
    config.env = ENV
    config.update(QUICK_LOOP if quick else LOOP)
    config.agent.update(QUICK_AGENT if quick else AGENT)
    config.replay_dtype = None  # fp16_sr-style float16 replay is the dm_control loop's
    config.total_steps = config.brax_num_envs * 10**7
    config.log_every = config.brax_num_envs * chunk_iterations(quick)
    config.mesh.data = devices
    return sac_brax_loop.settings_of(config, sac_brax_loop.validate(config))


class Learner:
    """One precision's loop (seed 0): compiled functions, state, training time and evaluation curve."""

    def __init__(self, precision: str, quick: bool, episodes: int):
        from experiments import sac_brax_loop

        self.loop_module, self.precision, self.episodes = sac_brax_loop, precision, episodes
        started = time.perf_counter()
        self.settings = loop_settings(precision, quick)
        self.chunk = sac_brax_loop.chunk_fn(self.settings, chunk_iterations(quick))
        sac_brax_loop.evaluate_fn(self.settings, episodes)
        self.loop = jax.block_until_ready(sac_brax_loop.init_loop(self.settings, 0))
        self.compile_s = time.perf_counter() - started
        self.train_s, self.eval_s, self.updates, self.curve = 0.0, 0.0, 0, []
        self.error: str | None = None

    def advance(self) -> None:
        """One chunk, timed to its completion."""
        started = time.perf_counter()
        self.loop, out = self.chunk(self.loop)
        out = jax.device_get(out)
        self.train_s += time.perf_counter() - started
        self.updates += int(out.learning_iterations) * self.settings.updates_per_step
        if not out.actions_finite:
            raise FloatingPointError(f"non-finite actions before env step {int(self.loop.env_steps)}")

    def evaluate(self) -> None:
        started = time.perf_counter()
        scores = self.loop_module.evaluate(self.loop, self.settings, self.episodes, 0)
        self.eval_s += time.perf_counter() - started
        point = {"train_s": self.train_s, "env_steps": int(self.loop.env_steps), "updates": self.updates}
        self.curve.append(point | scores)

    def summary(self) -> dict[str, Any]:
        """The run's record; :func:`race` evaluated it at 0 s, so ``curve`` has a point."""
        reached = next((p["train_s"] for p in self.curve if p["return"] >= TARGET_RETURN), None)
        last = self.curve[-1]
        per_s = lambda key: last[key] / self.train_s if self.train_s else None
        return {
            "config": f"experiments/configs/sac/{CONFIGS[self.precision]}.py",
            "compile_s": self.compile_s,
            "train_s": self.train_s,
            "eval_s": self.eval_s,
            "env_steps_per_s": per_s("env_steps"),
            "updates_per_s": per_s("updates"),
            "final_return": last["return"],
            "best_return": max(p["return"] for p in self.curve),
            "time_to_target_s": reached,
            "time_to_target_with_compile_s": None if reached is None else reached + self.compile_s,
            "curve": self.curve,
            **({"error": self.error} if self.error else {}),
        }


def affordable_budget(budget_s: float, left_s: float, learners: int, eval_s: float, eval_every_s: float) -> float:
    """The training budget each of ``learners`` gets when ``left_s`` seconds remain: ``budget_s`` if it fits, else
    what does once each learner's evaluations (``eval_s`` every ``eval_every_s`` of training) and one chunk's
    overshoot (2 s) are paid for."""
    fits = (left_s / max(learners, 1) - 2.0) / (1.0 + eval_s / eval_every_s)
    return max(0.0, min(budget_s, fits))


def race(
    precisions: Sequence[str], budget_s: float, eval_every_s: float, episodes: int, quick: bool, deadline: float
) -> tuple[dict, float]:
    """Trains every precision for the same wall-clock budget, alternating chunks (module docstring): ``budget_s``,
    or less if that would end after ``deadline`` (a ``time.perf_counter()`` value). Returns the runs and the
    budget used."""
    learners, failed = [], {}
    for precision in precisions:
        try:
            learners.append(Learner(precision, quick, episodes))
        except Exception as error:  # recorded, the other learner still trains
            failed[precision] = {"error": _error(error)}
    for learner in learners:
        learner.evaluate()  # the untrained policy, at 0 s
    eval_s = max((learner.eval_s for learner in learners), default=0.0)
    budget_s = affordable_budget(budget_s, deadline - time.perf_counter(), len(learners), eval_s, eval_every_s)
    next_eval = {learner.precision: eval_every_s for learner in learners}
    active = list(learners)
    while active:
        learner = min(active, key=lambda item: item.train_s)
        try:
            learner.advance()
            if learner.train_s >= min(next_eval[learner.precision], budget_s):
                learner.evaluate()
                next_eval[learner.precision] += eval_every_s
        except Exception as error:  # a diverged or failing learner stops; the other goes on
            learner.error = _error(error)
        if learner.error or learner.train_s >= budget_s:
            active.remove(learner)
    return {**{learner.precision: learner.summary() for learner in learners}, **failed}, budget_s


def _error(error: BaseException) -> str:
    return "\n".join(error_record(error, frames=3).values())


def goal(runs: dict) -> dict:
    """The issue's goal: fp16 reaches the target in less training wall-clock than fp32."""
    fp32, fp16 = (runs.get(p, {}).get("time_to_target_s") for p in ("fp32", "fp16"))
    met = None if fp16 is None and fp32 is None else (fp16 is not None and (fp32 is None or fp16 < fp32))
    text = f"fp16 SAC reaches {TARGET_RETURN:.0f} on {ENV} in less wall-clock than fp32"
    return {"goal": text, "fp32_s": fp32, "fp16_s": fp16, "met": met}


def plot(result: dict, path: Path) -> None:
    """Evaluation return against training wall-clock, one line per precision, the target dashed."""
    with figure(path, figsize=(6.5, 4.2)) as (_, ax):
        for precision, run in result["runs"].items():
            if curve := run.get("curve"):
                ax.plot([p["train_s"] for p in curve], [p["return"] for p in curve], marker="o", ms=3, label=precision)
        ax.axhline(TARGET_RETURN, color="k", ls="--", lw=1)
        ax.set(xlabel="training wall-clock (s), compilation and evaluation excluded", ylabel="evaluation return")
        ax.set_title(f"SAC on {ENV}, {result.get('device') or 'device unknown'}", fontsize=9)
        ax.legend()


def main(argv: Sequence[str] | None = None) -> dict:
    cli = parser("gpu_train", __doc__, quick="tiny sizes, seconds of budget: a smoke run; writes gpu_train_quick")
    cli.add_argument("--budget_s", type=float, default=100.0, help="training wall-clock per precision")
    cli.add_argument("--deadline_s", type=float, default=DEADLINE_S, help="the run's limit: the budget shrinks to fit")
    cli.add_argument("--compilation_cache", default=CACHE_DIR, help="persistent compilation cache ('': none)")
    cli.add_argument("--eval_every_s", type=float, default=5.0, help="training seconds between evaluations")
    cli.add_argument("--eval_episodes", type=int, default=10)
    cli.add_argument("--precisions", default="fp32,fp16", help=f"comma-separated, of {tuple(CONFIGS)}")
    args = cli.parse_args(argv)
    args.name = "gpu_train_quick" if args.quick and args.name == "gpu_train" else args.name
    precisions = [p for p in args.precisions.split(",") if p]
    if unknown := [p for p in precisions if p not in CONFIGS]:
        cli.error(f"--precisions: {unknown[0]!r} is not one of {tuple(CONFIGS)}")
    started = time.perf_counter()
    result = dict(command=command_line("benchmarks.gpu_train", argv), environment=run_environment(), quick=args.quick)
    result["settings"] = settings(args.quick) | {"chunk_iterations": chunk_iterations(args.quick)}
    result["settings"] |= {k: getattr(args, k) for k in ("budget_s", "eval_every_s", "eval_episodes")}
    result["settings"]["target_return"] = TARGET_RETURN
    enable_compilation_cache("" if args.quick else args.compilation_cache)
    try:
        result["device"] = jax.devices()[0].device_kind
        result["runs"], result["settings"]["budget_s"] = race(
            precisions, args.budget_s, args.eval_every_s, args.eval_episodes, args.quick, started + args.deadline_s
        )
    except Exception as error:  # e.g. no MuJoCo Playground: the json says so
        result.update(device=result.get("device"), runs={}, error=_error(error))
    result["goal"] = goal(result["runs"])
    result["seconds"] = time.perf_counter() - started
    keys = ("compile_s", "final_return", "best_return", "time_to_target_s", "env_steps_per_s", "updates_per_s")
    rows = []
    for p, r in result["runs"].items():  # a learner that failed to compile has only its error
        cells = ("-" if r[k] is None else r[k] for k in keys) if "curve" in r else ()
        rows.append([p, *cells, r.get("error", "").split("\n")[0]])
    header = ["", "compile s", "final", "best", f"s to {TARGET_RETURN:.0f}", "env steps/s", "updates/s", "stopped"]
    lines = [f"{result['device']}: SAC on {ENV}, {result['settings']['budget_s']:.0f} s of training each"]
    lines += format_table(header, rows, ["<6", "9.1f", "7.1f", "7.1f", "8.1f", "11.0f", "9.0f", ""])
    if "error" in result:
        lines.append(f"failed: {result['error'].splitlines()[0]}")
    lines.append(f"goal met: {result['goal']['met']}  ({result['seconds']:.0f} s in all)")
    return finish(args, result, "\n".join(lines), plot)


if __name__ == "__main__":
    main()
