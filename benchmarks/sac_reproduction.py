"""Reproduction of the paper's SAC-from-states results at a CPU-affordable scale: fp32 vs fp16 vs naive fp16,
and the Figure 7 ablation (fp16 with one of its methods removed), resumable across sessions.

**What runs.** Every run is one ``experiments.sac_loop.train`` of a config from ``experiments/configs/sac/`` with
the scale flags applied (:mod:`benchmarks.sac_reproduction_plan`): ``fp32``, ``fp16`` (the paper's methods) and
``fp16_naive`` (none), and the configs beyond the paper, on ``--tasks`` x seeds; the ablation ``fp16_no_<method>``
(``fp16`` with one method of :meth:`lpjax.methods.PrecisionMethods.paper` off) on ``--ablation_task``, against the
``fp16`` runs there; with ``--rounding_task``, the rounding study (``fp16_sr_params`` / ``fp16_sr_target``: fp16
with stochastic rounding for the parameter or the target updates only, beside ``fp16`` and ``fp16_sr``).

**Scale.** The paper trains 1024x1024 networks on batches of 1024 for 500k-1M steps, days per run on a CPU. The
default is width 256, batch 256, 100k agent steps with the paper's other hyper-parameters (``docs/design.md``),
evaluated every 10k steps on 10 episodes: the returns are not the paper's; fp16 is compared with fp32 at the same
scale (target: fp16's mean final return >= 0.95 x fp32's on every task) and naive fp16 is expected to fail.
walker-walk holds the ablation: the largest action space of the three (where softplus-fix and normal-fix act), a
dense reward still rising at 100k steps, and less seed noise than reacher-easy.

**Resumable.** Each (config, task, seed) run has its own directory, ``<runs_dir>/<scale tag>/<config>/<task>/
seed<k>/``, kept by :mod:`experiments.run_farm`: a run with checkpoints resumes from the latest (bit-identically);
one with ``done.json``, or a checkpoint at ``--steps``, or diverged, is final and skipped; a directory whose
``config.json`` differs from the flags' config (``checkpoint_every`` aside) is ``config_mismatch`` and left
alone. A session trains the selected runs that are not final, partial runs first, then seed by seed, at most
``--max_runs``, ``--workers`` at a time (subprocesses logging to ``worker.log``), then aggregates; Ctrl-C stops
cleanly. ``--aggregate_only`` reads every run of the scale on disk and writes ``sac_reproduction.json``
(:mod:`benchmarks.sac_reproduction_aggregate`: only final runs count) and ``.png``
(:mod:`benchmarks.sac_reproduction_plot`).
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import functools
import os
import pathlib
import sys
from collections.abc import Sequence

os.environ.setdefault("MUJOCO_GL", "egl")

from benchmarks import common
from benchmarks.sac_reproduction_aggregate import aggregate, config_differences, format_table, inspect_run
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
from experiments import run_farm

DEFAULT_RUNS_DIR = REPO_ROOT / "runs" / "sac_reproduction"


# ------------------------------------------------------------------------------------------------------ CLI


def _csv(kind):
    def parse(text: str) -> list:
        try:
            return [kind(item.strip()) for item in text.split(",") if item.strip()]
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = common.parser("sac_reproduction", __doc__, out=("--results_dir",))
    plan = parser.add_argument_group("what to run (the plan is default tasks + --tasks, seeds 0..num_seeds-1)")
    tasks, ablation, seeds = ",".join(DEFAULT_TASKS), DEFAULT_ABLATION_TASK, DEFAULT_NUM_SEEDS
    plan.add_argument("--tasks", type=_csv(str), default=None, help=f"dm_control tasks, added to {tasks}")
    plan.add_argument("--ablation_task", type=_csv(str), default=[ablation], help=f"the ablation's tasks ({ablation})")
    plan.add_argument("--rounding_task", type=_csv(str), default=[], help="the rounding study's tasks (none)")
    plan.add_argument("--num_seeds", type=int, default=seeds, help=f"seeds 0..N-1 make the plan ({seeds})")
    plan.add_argument("--seeds", type=_csv(int), default=None, help="only these seeds (comma-separated ids)")
    groups = ", ".join(CONFIG_GROUPS)
    plan.add_argument("--configs", type=_csv(str), default=None, help=f"only these configs or groups ({groups})")
    plan.add_argument("--only", type=_csv(str), default=None, help="only runs whose config/task/seedN matches these")
    plan.add_argument("--max_runs", type=int, default=None, help="train at most N runs this session")
    plan.add_argument("--workers", type=int, default=1, help="parallel `python -m experiments.sac` subprocesses")
    plan.add_argument("--aggregate_only", action="store_true", help="no training: aggregate what exists")
    plan.add_argument("--list", action="store_true", help="print the plan with each run's status and exit")
    plan.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="per-step progress bar")
    scale = parser.add_argument_group("scale (part of the run directory name; paper: width 1024, batch 1024, 1M)")
    helps = dict(width="hidden width (2 layers)", steps="agent steps per run", seed_steps="random-action steps first")
    helps.update(action_repeat="0: the task's default", checkpoint_every="not part of the scale")
    for field in dataclasses.fields(Scale):
        scale.add_argument(f"--{field.name}", type=int, default=field.default, help=helps.get(field.name))
    parser.add_argument("--runs_dir", type=pathlib.Path, default=DEFAULT_RUNS_DIR, help="where run directories go")
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
    configs, valid = [], f"valid: {', '.join(ALL_CONFIGS)} (or {', '.join(CONFIG_GROUPS)})"
    for name in args.configs or []:
        check(name in ALL_CONFIGS or name in CONFIG_GROUPS, f"unknown config {name!r}; {valid}")
        configs.extend(CONFIG_GROUPS.get(name, (name,)))
    args.configs = configs or None
    for name in ("num_seeds", "width", "batch", "steps", "eval_every", "eval_episodes", "checkpoint_every", "workers"):
        check(getattr(args, name) >= 1, f"--{name} must be >= 1")
    check(0 <= args.seed_steps <= args.steps, f"--seed_steps must be in [0, --steps={args.steps}]")
    check(args.batch <= replay_capacity(args.steps), "--batch must be <= --steps (the replay buffer holds the run)")
    check(args.action_repeat >= 0, "--action_repeat must be >= 0")
    check(args.max_runs is None or args.max_runs >= 0, "--max_runs must be >= 0")
    return args


def _scale(args: argparse.Namespace) -> Scale:
    return Scale(**{field.name: getattr(args, field.name) for field in dataclasses.fields(Scale)})


def select(plan: Sequence[RunSpec], args: argparse.Namespace) -> list[RunSpec]:
    return [
        s
        for s in plan
        if (args.tasks is None or s.task in args.tasks)
        and (args.seeds is None or s.seed in args.seeds)
        and (args.configs is None or s.config in args.configs)
        and (args.only is None or any(fnmatch.fnmatchcase(s.name, p) for p in args.only))
    ]


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

        farm = dict(command=functools.partial(command, spec, scale, run_dir))
        farm.update(mismatch=functools.partial(config_differences, run_dir, config))
        out.append(run_farm.Job(spec.name, run_dir, steps=scale.steps, train=train, **farm))
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    scale = _scale(args)
    runs_dir = args.runs_dir.absolute()
    tasks = list(dict.fromkeys([*DEFAULT_TASKS, *(args.tasks or [])]))
    plan = build_plan(tasks, range(args.num_seeds), args.ablation_task, args.rounding_task)
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
    previous = run_farm.read_json(args.out_dir / f"{args.name}.json")
    result = aggregate(runs_dir, scale, plan, argv, previous)
    common.finish(args, result, format_table(result), plot)
    names = lambda specs: [s.name for s in specs]
    return {"result": result, "trained": trained, "skipped": names(skipped), "selected": names(selected)}


if __name__ == "__main__":
    main()
