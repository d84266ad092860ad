"""Reproduction of the paper's SAC-from-states results at a CPU-affordable scale: fp32 vs fp16 vs naive fp16,
and the Figure 7 ablation (fp16 with one of its methods removed), resumable across sessions.

**What runs.** Every run is one ``experiments.sac_loop.train`` of a config from ``experiments/configs/sac/`` with
the scale flags applied (``--width``, ``--batch``, ``--steps``, ...; :mod:`benchmarks.sac_reproduction_plan`):

* main comparison, on ``--tasks`` (default cartpole-swingup, reacher-easy, walker-walk) x seeds:
  ``fp32`` (fp32.py), ``fp16`` (fp16.py: the paper's methods), ``fp16_naive`` (fp16_naive.py: none);
* ablation (paper appendix E, Figure 7), on ``--ablation_task`` (default walker-walk) x seeds:
  ``fp16_no_<method>`` = fp16.py with ``agent.methods.<method> = False`` for each method
  :meth:`lpjax.methods.PrecisionMethods.paper` turns on (hadam, loss_scaling, kahan_gradients, kahan_momentum,
  softplus_fix, normal_fix); the ``fp16`` runs of the main comparison on that task are the "all methods"
  reference.

**Scale.** The paper trains 1024x1024 networks on batches of 1024 for 500k-1M steps, days per run on a CPU (the
json's ``scale.why``). The default here is width 256 / batch 256 for 100k agent steps with the paper's other
hyper-parameters (Table 4/5: lr 1e-4, 5000 seed steps, tau 0.005, loss scale 1e4, ...; ``docs/design.md``,
"Reference hyper-parameters"), evaluated every 10k steps on 10 episodes. The returns are therefore *not* the
paper's; what is compared is fp16 against fp32 at the same scale (target: fp16 mean final return >= 0.95 x fp32 on
every task) and whether naive fp16 fails. The json states the scale and each run's cost (``train_seconds``,
``steps_per_s``); its ``progress`` estimates the remaining hours from them.

**Why walker-walk for the ablation.** At a fixed width and batch the cost of a step is dominated by the SAC
update, which is the same for every task, so no task is much cheaper. walker-walk is the most informative of the
three: the largest action space (6-d: six tanh-squashed Gaussian log-prob terms per sample, where softplus-fix
and normal-fix act), a dense reward that keeps rising through 100k steps at this scale (so a missing method shows
as a lower return instead of being hidden under cartpole-swingup's ceiling), and less seed noise than
reacher-easy's sparse reward.

**Resumable.** Each (config, task, seed) run has its own directory,
``<runs_dir>/<scale tag>/<config>/<task>/seed<k>/``, kept by :mod:`benchmarks.run_farm`: ``sac_loop``'s files
(``config.json``, ``metrics.csv``, ``checkpoints/``, ``learning_curve.png``) and the farm's (``sessions.jsonl``,
``done.json`` once the run is final, ``error.json`` if a session raised, a lock). A run with checkpoints is resumed
from the latest one (bit-identically, see ``sac_loop``); one with ``done.json``, or whose latest checkpoint is at
``--steps``, is final and skipped; one without a checkpoint starts over. A diverged run (``sac_loop`` reports
``status: diverged: ...`` when the policy outputs non-finite actions) is final too: resuming would diverge again.
The directory's ``config.json`` must match the config the flags build (``checkpoint_every`` aside), else the run is
reported as ``config_mismatch`` and left alone.

**A session** trains the selected runs that are not final, resumed (partial) runs first, then in plan order
seed by seed (all cells get seed 0 before any gets seed 1), at most ``--max_runs`` of them, ``--workers`` at a
time (``--workers 2``: two ``python -m experiments.sac`` subprocesses, logging to each run's ``worker.log``;
XLA already uses every core, so expect less than 2x), then aggregates. Ctrl-C stops cleanly: rerun the same
command to continue.

**The rounding study** (``--rounding_task walker-walk``; not in the default plan) separates the two updates
that ``fp16_sr`` rounds stochastically: ``fp16_sr_params`` rounds only the parameter updates (Kahan for the
target), ``fp16_sr_target`` only the target updates (Kahan for the parameters). With ``fp16`` (Kahan for both)
and ``fp16_sr`` (stochastic rounding for both) they are the json's ``rounding`` rows.

**Aggregate** (``--aggregate_only``: no training) reads every run of the scale that exists, planned or not, and
writes ``<results_dir>/sac_reproduction.json`` (:mod:`benchmarks.sac_reproduction_aggregate`: only final runs
count) and ``.png`` (:mod:`benchmarks.sac_reproduction_plot`).

Run ``python -m benchmarks.sac_reproduction --help``.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import os
import pathlib
import sys
from collections.abc import Sequence

os.environ.setdefault("MUJOCO_GL", "egl")

from benchmarks import run_farm
from benchmarks.common import write_results
from benchmarks.sac_reproduction_aggregate import RESULT_NAME, aggregate, config_differences, format_table, inspect_run
from benchmarks.sac_reproduction_plan import (
    ALL_CONFIGS,
    CONFIG_GROUPS,
    DEFAULT_ABLATION_TASK,
    DEFAULT_NUM_SEEDS,
    DEFAULT_TASKS,
    REPO_ROOT,
    RunSpec,
    Scale,
    build_plan,
    command,
    make_config,
    replay_capacity,
    run_dir_of,
)
from benchmarks.sac_reproduction_plot import plot

DEFAULT_RUNS_DIR = REPO_ROOT / "runs" / "sac_reproduction"
DEFAULT_RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


# ------------------------------------------------------------------------------------------------------ CLI


def _csv(kind):
    def parse(text: str) -> list:
        try:
            return [kind(item.strip()) for item in text.split(",") if item.strip()]
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.sac_reproduction",
        description="fp32 vs fp16 (all methods) vs naive fp16 SAC on dm_control, plus the one-method-removed "
        "ablation; resumable: each (config, task, seed) run has its own directory and an interrupted "
        "benchmark continues where it stopped. Ends by aggregating every run on disk into "
        "<results_dir>/sac_reproduction.{json,png}.",
    )
    plan = parser.add_argument_group("what to run (the plan is default tasks + --tasks, seeds 0..num_seeds-1)")
    plan.add_argument(
        "--tasks",
        type=_csv(str),
        default=None,
        help=f"comma-separated dm_control tasks to train (default: {','.join(DEFAULT_TASKS)}); "
        "tasks outside the default are added to the plan",
    )
    plan.add_argument(
        "--ablation_task",
        type=_csv(str),
        default=[DEFAULT_ABLATION_TASK],
        help=f"task(s) of the one-method-removed ablation (default: {DEFAULT_ABLATION_TASK}; "
        "why: see the module docstring)",
    )
    plan.add_argument(
        "--rounding_task",
        type=_csv(str),
        default=[],
        help="task(s) of the rounding study (default: none; e.g. walker-walk): fp16 with stochastic rounding for "
        "the parameter updates only (fp16_sr_params) and for the target updates only (fp16_sr_target), beside fp16 "
        "and fp16_sr",
    )
    plan.add_argument(
        "--num_seeds",
        type=int,
        default=DEFAULT_NUM_SEEDS,
        help=f"seeds 0..N-1 make the plan (default: {DEFAULT_NUM_SEEDS})",
    )
    plan.add_argument("--seeds", type=_csv(int), default=None, help="only these seeds (comma-separated ids)")
    plan.add_argument(
        "--configs",
        type=_csv(str),
        default=None,
        help=f"only these configs (comma-separated; groups: {', '.join(CONFIG_GROUPS)}). "
        f"Valid: {', '.join(ALL_CONFIGS)}",
    )
    plan.add_argument(
        "--only",
        type=_csv(str),
        default=None,
        help="only runs whose name config/task/seedN matches one of these fnmatch patterns, e.g. 'fp16*/walker-walk/*'",
    )
    plan.add_argument("--max_runs", type=int, default=None, help="train at most N runs this session")
    plan.add_argument(
        "--workers",
        type=int,
        default=1,
        help="parallel runs, each a `python -m experiments.sac` subprocess (default 1: in this "
        "process; XLA already uses every core, so N workers give less than N x)",
    )
    plan.add_argument("--aggregate_only", action="store_true", help="no training: aggregate what exists")
    plan.add_argument("--list", action="store_true", help="print the plan with each run's status and exit")
    plan.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="per-step progress bar (default: when stderr is a terminal and --workers 1)",
    )
    scale = parser.add_argument_group("scale (part of the run directory name; paper: width 1024, batch 1024, 1M)")
    defaults = Scale()
    scale.add_argument("--width", type=int, default=defaults.width, help="hidden width (2 layers, actor and critic)")
    scale.add_argument("--batch", type=int, default=defaults.batch, help="batch size")
    scale.add_argument("--steps", type=int, default=defaults.steps, help="agent steps per run")
    scale.add_argument("--seed_steps", type=int, default=defaults.seed_steps, help="random-action steps first")
    scale.add_argument("--eval_every", type=int, default=defaults.eval_every, help="evaluate every N steps")
    scale.add_argument("--eval_episodes", type=int, default=defaults.eval_episodes, help="episodes per evaluation")
    scale.add_argument(
        "--action_repeat", type=int, default=defaults.action_repeat, help="0: the task's default (1 from states)"
    )
    scale.add_argument(
        "--checkpoint_every",
        type=int,
        default=defaults.checkpoint_every,
        help="checkpoint at the first episode end after each multiple (not part of the scale)",
    )
    paths = parser.add_argument_group("paths")
    paths.add_argument("--runs_dir", type=pathlib.Path, default=DEFAULT_RUNS_DIR, help="where run directories go")
    paths.add_argument(
        "--results_dir", type=pathlib.Path, default=DEFAULT_RESULTS_DIR, help="where sac_reproduction.{json,png} go"
    )
    args = parser.parse_args(argv)

    import lpjax.envs

    def check(ok: bool, message: str) -> None:
        if not ok:
            parser.error(message)

    for task in [*(args.tasks or []), *args.ablation_task, *args.rounding_task]:
        try:
            lpjax.envs.parse_task(task)
        except ValueError as error:
            parser.error(f"bad task {task!r}: {error}")
    configs = []
    for name in args.configs or []:
        check(
            name in ALL_CONFIGS or name in CONFIG_GROUPS,
            f"unknown config {name!r}; valid: {', '.join(ALL_CONFIGS)} (or {', '.join(CONFIG_GROUPS)})",
        )
        configs.extend(CONFIG_GROUPS.get(name, (name,)))
    args.configs = configs or None
    check(args.num_seeds >= 1, "--num_seeds must be >= 1")
    check(
        min(args.width, args.batch, args.steps, args.eval_every, args.eval_episodes, args.checkpoint_every) >= 1,
        "--width, --batch, --steps, --eval_every, --eval_episodes, --checkpoint_every must be >= 1",
    )
    check(0 <= args.seed_steps <= args.steps, f"--seed_steps must be in [0, --steps={args.steps}]")
    check(args.batch <= replay_capacity(args.steps), "--batch must be <= --steps (the replay buffer holds the run)")
    check(args.action_repeat >= 0, "--action_repeat must be >= 0")
    check(args.workers >= 1, "--workers must be >= 1")
    check(args.max_runs is None or args.max_runs >= 0, "--max_runs must be >= 0")
    return args


def _scale(args: argparse.Namespace) -> Scale:
    return Scale(
        width=args.width,
        batch=args.batch,
        steps=args.steps,
        seed_steps=args.seed_steps,
        eval_every=args.eval_every,
        eval_episodes=args.eval_episodes,
        action_repeat=args.action_repeat,
        checkpoint_every=args.checkpoint_every,
    )


def _plan(args: argparse.Namespace, runs_dir: pathlib.Path, scale: Scale) -> list[RunSpec]:
    tasks = list(dict.fromkeys([*DEFAULT_TASKS, *(args.tasks or [])]))
    return build_plan(tasks, range(args.num_seeds), args.ablation_task, args.rounding_task)


def select(plan: Sequence[RunSpec], args: argparse.Namespace) -> list[RunSpec]:
    chosen = [
        s
        for s in plan
        if (args.tasks is None or s.task in args.tasks)
        and (args.seeds is None or s.seed in args.seeds)
        and (args.configs is None or s.config in args.configs)
        and (args.only is None or any(fnmatch.fnmatchcase(s.name, p) for p in args.only))
    ]
    return chosen


def jobs(specs: Sequence[RunSpec], scale: Scale, runs_dir: pathlib.Path) -> list[run_farm.Job]:
    """The run farm's jobs of ``specs``: trained by ``experiments.sac_loop.train`` in this process, or by
    ``python -m experiments.sac`` (:func:`benchmarks.sac_reproduction_plan.command`) in a worker; a run whose
    ``config.json`` differs from the flags' config is left alone."""
    out = []
    for spec in specs:
        run_dir = run_dir_of(runs_dir, scale, spec)
        config = make_config(spec, scale)

        def train(resume: bool, progress: bool, config=config, run_dir=run_dir) -> dict:
            from absl import logging as absl_logging

            from experiments import sac_loop

            absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every checkpoint at INFO
            return sac_loop.train(config, run_dir, resume=resume, progress=progress)

        out.append(
            run_farm.Job(
                spec.name,
                run_dir,
                steps=scale.steps,
                train=train,
                command=functools.partial(command, spec, scale, run_dir),
                mismatch=functools.partial(config_differences, run_dir, config),
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    scale = _scale(args)
    runs_dir = args.runs_dir.absolute()
    plan = _plan(args, runs_dir, scale)
    selected = select(plan, args)
    states = {s: inspect_run(run_dir_of(runs_dir, scale, s), scale) for s in selected}
    if args.list:
        print(f"plan at {scale.tag} ('-': not selected by --tasks/--seeds/--configs/--only)")
        for spec in plan:
            state = states.get(spec) or inspect_run(run_dir_of(runs_dir, scale, spec), scale)
            mark = " " if spec in states else "-"
            print(f"{mark} {spec.name:<48} {state['status']:<15} step {state['step']}")
        return {"plan": plan, "selected": selected}
    trained, skipped = [], [s for s in selected if states[s]["final"]]
    if not args.aggregate_only:
        todo = [s for s in selected if not states[s]["final"] and states[s]["status"] != "running"]
        todo.sort(key=lambda s: states[s]["status"] != "partial")  # stable: resume partial runs first
        if args.max_runs is not None:
            todo = todo[: args.max_runs]
        print(
            f"{len(plan)} runs planned at {scale.tag}; selected {len(selected)}: {len(skipped)} final (skipped), "
            f"{sum(states[s]['status'] == 'running' for s in selected)} running elsewhere, "
            f"training {len(todo)} now",
            flush=True,
        )
        progress = args.progress if args.progress is not None else (sys.stderr.isatty() and args.workers == 1)
        specs = {spec.name: spec for spec in todo}

        def report(job: run_farm.Job) -> dict:
            return inspect_run(job.run_dir, scale, make_config(specs[job.name], scale))

        try:
            trained = run_farm.run_jobs(jobs(todo, scale, runs_dir), args.workers, progress, report)
        except KeyboardInterrupt:
            print("\ninterrupted: rerun the same command to continue from the last checkpoints", flush=True)
    previous = run_farm.read_json(args.results_dir / f"{RESULT_NAME}.json")
    result = aggregate(runs_dir, scale, plan, argv, previous)
    write_results(result, format_table(result), args.results_dir, RESULT_NAME, plot)
    return {
        "result": result,
        "trained": trained,
        "skipped": [s.name for s in skipped],
        "selected": [s.name for s in selected],
    }


if __name__ == "__main__":
    main()
