"""Reproduction of the paper's SAC-from-states results at a CPU-affordable scale: fp32 vs fp16 vs naive fp16,
and the Figure 7 ablation (fp16 with one of the six methods removed), resumable across sessions.

**What runs.** Every run is one ``experiments.sac_loop.train`` call of a config built from
``experiments/configs/sac/`` with the scale flags applied (``--width``, ``--batch``, ``--steps``, ...):

* main comparison, on ``--tasks`` (default cartpole-swingup, reacher-easy, walker-walk) x seeds:
  ``fp32`` (fp32.py), ``fp16`` (fp16.py: all six methods), ``fp16_naive`` (fp16_naive.py: none);
* ablation (paper appendix E, Figure 7), on ``--ablation_task`` (default walker-walk) x seeds:
  ``fp16_no_<method>`` = fp16.py with ``config.agent.<method> = False`` for each of ``_base.ALL_METHODS``
  (hadam, loss_scaling, kahan_gradients, kahan_momentum, softplus_fix, normal_fix); the ``fp16`` runs of the
  main comparison on that task are the "all methods" reference.

**Scale.** The paper trains 1024x1024 networks on batches of 1024 for 500k-1M steps; on this 2-core CPU one such
update takes ~320 ms (DESIGN.md), i.e. ~2 days per run. The default here is width 256 / batch 256 (an update
takes ~6.5 ms) for 100k agent steps with the paper's other hyper-parameters (Table 4/5: lr 1e-4, 5000 seed
steps, tau 0.005, loss scale 1e4, ...), evaluated every 10k steps on 10 episodes. The returns are therefore
*not* the paper's (pytorch_sac reaches its reference returns after 500k-1M steps at width 1024); what is
compared is fp16 against fp32 at the same scale (target: fp16 mean final return >= 0.95 x fp32 on every task)
and whether naive fp16 fails. The json states the scale and the per-run cost measured here.

**Cost here.** Measured on this machine (jax 0.10.2) while other jobs kept the 2 cores' load at ~7: at width
256 / batch 256 a learning step (environment step + one SAC update) took 14.5 ms in fp32 and 19 ms in fp16
(walker-walk and cartpole-swingup alike), an evaluation step ~1.7 ms, compilation ~15 s. One default run is then
~26 min (fp32) or ~33 min (fp16): 95k learning steps + 10 evaluations of 10 episodes. The 45 planned runs take
~19 h with one worker (naive fp16 diverges in its first updates and costs seconds); about half that on idle
cores. The json's ``progress`` re-estimates the remaining hours from the runs done.

**Why walker-walk for the ablation.** At a fixed width and batch the cost of a step is dominated by the SAC
update, which is the same for every task (the environment step is a small part), so no task is much cheaper.
walker-walk is the most informative of the three: the largest action space (6-d: six tanh-squashed Gaussian
log-prob terms per sample, where softplus-fix and normal-fix act), a dense reward that is still rising at 100k
steps (so a missing method shows as a lower return instead of being hidden under cartpole-swingup's ceiling),
and less seed noise than reacher-easy's sparse reward.

**Resumable.** Each (config, task, seed) run has its own directory,
``<runs_dir>/<scale tag>/<config>/<task>/seed<k>/`` (``run_dir/config.json``, ``metrics.csv``, ``checkpoints/``,
``learning_curve.png`` as written by ``sac_loop``, plus ``sessions.jsonl``: one line per training session with its
steps and seconds; ``done.json`` once the run is final; ``error.json`` if a session raised). A run whose directory
holds checkpoints is resumed from the latest one (bit-identically, see ``sac_loop``); one with ``done.json``, or
whose latest checkpoint is at ``--steps``, is final and skipped; one without a checkpoint starts over. A
diverged run (``sac_loop`` reports ``status: diverged: ...`` when the policy outputs non-finite actions) is
final too: resuming would diverge again. A lock file (``flock``) keeps two sessions off the same run. The
directory's ``config.json`` must match the config the flags build (``checkpoint_every`` aside), else the run is
reported as ``config_mismatch`` and left alone.

**A session** trains the selected runs that are not final, resumed (partial) runs first, then in plan order
seed by seed (all cells get seed 0 before any gets seed 1), at most ``--max_runs`` of them, ``--workers`` at a
time (``--workers 2`` runs two subprocesses; this machine has 2 cores and XLA already uses both, so expect
less than 2x), then aggregates. Ctrl-C stops cleanly: rerun the same command to continue.

**Aggregate** (``--aggregate_only``: no training) reads every run of the scale that exists, planned or not, and
writes ``<results_dir>/sac_reproduction.json`` and ``.png``. Only final runs count: ``final_return_per_seed``
holds finished runs' last evaluation (at ``--steps``), ``null`` for diverged seeds; partial runs are listed
apart with their step and last evaluation and marked ``incomplete``. Per cell: mean and (population) std over
finished seeds, ``seeds_final`` / ``seeds_planned``, ``seeds_diverged``, status ``complete`` / ``diverged`` /
``incomplete`` / ``missing``. Per task: ``ratio`` = fp16 mean / fp32 mean against ``TARGET_RATIO`` (0.95),
``final`` only when both cells are complete; ``naive_failed`` when a naive seed diverged or returned non-finite
values, or its mean is below ``NAIVE_FAR_LOWER`` (0.5) x fp32's. Ablation table: each variant's mean and its
ratio to fp16 with all methods. The PNG: learning curves (mean +- std over finished seeds; diverged seeds as thin
lines ending in x, partial seeds dotted) per task, and the ablation bar chart (hatched bars: incomplete).

Run ``python -m benchmarks.sac_reproduction --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import fcntl
import fnmatch
import importlib
import io
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any, Iterator, Sequence

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402

from benchmarks.common import command_line, write_results  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_RUNS_DIR = REPO_ROOT / "runs" / "sac_reproduction"
DEFAULT_RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
RESULT_NAME = "sac_reproduction"

MAIN_CONFIGS = ("fp32", "fp16", "fp16_naive")
METHODS = ("hadam", "loss_scaling", "kahan_gradients", "kahan_momentum", "softplus_fix", "normal_fix")
ABLATION_PREFIX = "fp16_no_"
ABLATION_CONFIGS = tuple(ABLATION_PREFIX + method for method in METHODS)
ALL_CONFIGS = MAIN_CONFIGS + ABLATION_CONFIGS
CONFIG_GROUPS = {"main": MAIN_CONFIGS, "ablation": ABLATION_CONFIGS}
DEFAULT_TASKS = ("cartpole-swingup", "reacher-easy", "walker-walk")
DEFAULT_ABLATION_TASK = "walker-walk"
DEFAULT_NUM_SEEDS = 3
TARGET_RATIO = 0.95  # fp16 mean final return / fp32's (paper Table 7: within ~3%)
NAIVE_FAR_LOWER = 0.5  # naive fp16 "failed" if its mean is below this fraction of fp32's
REFERENCE_RETURNS = {  # pytorch_sac, fp32, width 1024 / batch 1024, mean over seeds at 500k / 1M steps (DESIGN.md)
    "cartpole-swingup": [880, 881], "reacher-easy": [948, 987], "cheetah-run": [686, 802],
    "finger-spin": [880, 951], "ball_in_cup-catch": [976, 980], "walker-walk": [897, 905]}
# Fields of config.json that may differ on resume (they do not change what is computed).
CONFIG_FIELDS_IGNORED = ("checkpoint_every",)
CONFIG_FIELDS_ADDED = {"agent.matmul_impl": "xla"}
"""Config fields added after runs started, with the value that reproduces the old behaviour bit for bit: a stored
config without the field matches a flags config that has it at this value."""

DONE_FILE, ERROR_FILE, SESSIONS_FILE, LOCK_FILE, WORKER_LOG = (
    "done.json", "error.json", "sessions.jsonl", ".lock", "worker.log")


# --------------------------------------------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True)
class Scale:
    """The flags that set what a run computes; ``tag`` names the directory holding all runs of this scale."""

    width: int = 256
    batch: int = 256
    steps: int = 100_000
    seed_steps: int = 5000
    eval_every: int = 10_000
    eval_episodes: int = 10
    action_repeat: int = 0  # 0: the task's default (1 from states)
    checkpoint_every: int = 10_000

    @property
    def tag(self) -> str:
        tag = (f"w{self.width}_b{self.batch}_steps{self.steps}_seed{self.seed_steps}"
               f"_eval{self.eval_every}x{self.eval_episodes}")
        return tag + (f"_ar{self.action_repeat}" if self.action_repeat else "")

    def describe(self) -> dict:
        return {**dataclasses.asdict(self), "hidden_layers": 2, "replay_capacity": replay_capacity(self.steps),
                "tag": self.tag}


@dataclasses.dataclass(frozen=True, order=True)
class RunSpec:
    config: str
    task: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.config}/{self.task}/seed{self.seed}"

    @classmethod
    def parse(cls, name: str) -> "RunSpec":
        try:
            config, task, seed = name.split("/")
            if not seed.startswith("seed"):
                raise ValueError
            return cls(config, task, int(seed[4:]))
        except ValueError:
            raise ValueError(f"run names look like 'fp16/walker-walk/seed0', got {name!r}") from None


def removed_method(config: str) -> str | None:
    """``"fp16_no_hadam" -> "hadam"``; ``None`` for the main configs."""
    return config[len(ABLATION_PREFIX):] if config.startswith(ABLATION_PREFIX) else None


def replay_capacity(steps: int) -> int:
    """The whole run fits (as the paper's 1M buffer does); smaller checkpoints than a 1M buffer."""
    return min(1_000_000, steps)


def make_config(spec: RunSpec, scale: Scale):
    """The ``ml_collections`` config of one run: the config file's, with the scale applied."""
    method = removed_method(spec.config)
    if spec.config not in ALL_CONFIGS:
        raise ValueError(f"unknown config {spec.config!r}; valid: {', '.join(ALL_CONFIGS)}")
    module = importlib.import_module(f"experiments.configs.sac.{'fp16' if method else spec.config}")
    config = module.get_config()
    if method is not None:
        if not config.agent[method]:
            raise ValueError(f"fp16.py does not enable {method!r}; cannot ablate it")
        config.agent[method] = False
    config.env = f"dmc:{spec.task}"
    config.seed = spec.seed
    config.total_steps = scale.steps
    config.seed_steps = scale.seed_steps
    config.replay_capacity = replay_capacity(scale.steps)
    config.eval_every = scale.eval_every
    config.eval_episodes = scale.eval_episodes
    config.log_every = min(1000, scale.eval_every)
    config.checkpoint_every = scale.checkpoint_every
    config.action_repeat = scale.action_repeat
    config.agent.hidden_dims = (scale.width, scale.width)
    config.agent.batch_size = scale.batch
    return config


def build_plan(tasks: Sequence[str], seeds: Sequence[int], ablation_tasks: Sequence[str]) -> list[RunSpec]:
    """All runs, in the order a session takes them: seed by seed, task by task, main configs then ablations."""
    plan = []
    for seed in seeds:
        for task in dict.fromkeys([*tasks, *ablation_tasks]):
            configs = (MAIN_CONFIGS if task in tasks else ()) + (ABLATION_CONFIGS if task in ablation_tasks else ())
            if task in ablation_tasks and task not in tasks:
                configs = ("fp16",) + configs  # the ablation's reference
            plan.extend(RunSpec(config, task, seed) for config in configs)
    return plan


def run_dir_of(runs_dir: pathlib.Path, scale: Scale, spec: RunSpec) -> pathlib.Path:
    return pathlib.Path(runs_dir) / scale.tag / spec.config / spec.task / f"seed{spec.seed}"


def discover_runs(runs_dir: pathlib.Path, scale: Scale) -> list[RunSpec]:
    """Runs of this scale that have a directory (planned or not)."""
    root = pathlib.Path(runs_dir) / scale.tag
    found = []
    for path in sorted(root.glob("*/*/seed*")):
        if path.is_dir() and path.name[4:].isdigit() and path.parent.parent.name in ALL_CONFIGS:
            found.append(RunSpec(path.parent.parent.name, path.parent.name, int(path.name[4:])))
    return found


# ------------------------------------------------------------------------------------------ one run's state


def _jsonable_config(config) -> dict:
    from lpjax.run_logging import to_jsonable

    return json.loads(json.dumps(to_jsonable(config)))


def _config_differences(stored: dict, expected: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(stored) | set(expected))
    diffs = []
    for key in keys:
        if not prefix and key in CONFIG_FIELDS_IGNORED:
            continue
        a, b = stored.get(key, "<absent>"), expected.get(key, "<absent>")
        if a == "<absent>" and CONFIG_FIELDS_ADDED.get(f"{prefix}{key}", "<absent>") == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.extend(_config_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            diffs.append(f"{prefix}{key}: run has {a!r}, flags give {b!r}")
    return diffs


def _checkpoint_steps(run_dir: pathlib.Path) -> list[int]:
    """Finalized checkpoint steps (orbax renames ``<step>.orbax-checkpoint-tmp`` to ``<step>`` when complete)."""
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())


def _logged(run_dir: pathlib.Path, column: str) -> tuple[list[int], list[float | None]]:
    """Steps and values of the rows of ``metrics.csv`` that logged ``column`` (``None`` for a non-finite value).

    Read from the file directly: a row logged the column when its cell is not empty
    (``lpjax.run_logging.read_metrics`` reads empty and non-finite cells both as nan)."""
    path = run_dir / "metrics.csv"
    if not path.exists():
        return [], []
    text = path.read_text()
    if not text.endswith("\n"):  # a partial last line left by a crash
        text = text[: text.rfind("\n") + 1]
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or column not in rows[0]:
        return [], []
    step_col, value_col = rows[0].index("step"), rows[0].index(column)
    steps, values = [], []
    for row in rows[1:]:
        if len(row) > value_col and row[value_col] != "":
            value = float(row[value_col])
            steps.append(int(float(row[step_col])))
            values.append(value if math.isfinite(value) else None)
    return steps, values


def _eval_curve(run_dir: pathlib.Path) -> tuple[list[int], list[float | None]]:
    """Steps and returns of the logged evaluations (``None`` for a non-finite return)."""
    return _logged(run_dir, "eval/return")


def _nonfinite_losses_since(run_dir: pathlib.Path) -> int | None:
    """The first logged step from which every logged critic loss is non-finite (``None``: the last is finite).

    The loss scaler skips every such step, so the networks stop learning while actions stay finite: such a run
    finishes, with the return of a frozen policy."""
    steps, losses = _logged(run_dir, "train/critic_loss")
    if not losses or losses[-1] is not None:
        return None
    finite = [i for i, loss in enumerate(losses) if loss is not None]
    return steps[finite[-1] + 1 if finite else 0]


@contextlib.contextmanager
def _locked(run_dir: pathlib.Path) -> Iterator[bool]:
    """Holds the run's ``flock`` (yields True), or yields False if another process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_FILE, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _held_elsewhere(run_dir: pathlib.Path) -> bool:
    if not (run_dir / LOCK_FILE).exists():
        return False
    with _locked(run_dir) as ok:
        return not ok


def _read_json(path: pathlib.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _sessions(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / SESSIONS_FILE
    if not path.exists():
        return []
    sessions = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            sessions.append(json.loads(line))
    return sessions


def inspect_run(run_dir: pathlib.Path, scale: Scale, expected_config=None, check_lock: bool = True) -> dict:
    """What is on disk for one run. ``status``: missing, started (no checkpoint yet), partial, error (the last
    session raised; retried next time), running (locked by another process), finished, diverged, nonfinite
    (finished with a non-finite final return), config_mismatch. ``final`` says whether
    the run is done (finished, diverged or nonfinite): only final runs are reported as results."""
    record: dict[str, Any] = {"run_dir": str(run_dir), "status": "missing", "final": False, "step": 0,
                              "final_return": None, "last_eval_return": None, "last_eval_step": None}
    if not run_dir.is_dir():
        return record
    steps, returns = _eval_curve(run_dir)
    record["eval_steps"], record["eval_returns"] = steps, returns
    if steps:
        record["last_eval_step"], record["last_eval_return"] = steps[-1], returns[-1]
    sessions = _sessions(run_dir)
    seconds = sum(s.get("seconds", 0.0) for s in sessions)
    trained = sum(max(0, s.get("end_step", 0) - s.get("start_step", 0)) for s in sessions)
    record.update(train_seconds=round(seconds, 1), sessions=len(sessions),
                  steps_per_s=round(trained / seconds, 2) if seconds > 0 and trained else None)
    error = _read_json(run_dir / ERROR_FILE)
    if error:
        record["last_error"] = error.get("error")
    if expected_config is not None and (run_dir / "config.json").exists():
        stored = _read_json(run_dir / "config.json")
        diffs = _config_differences(stored or {}, _jsonable_config(expected_config))
        if diffs:
            record.update(status="config_mismatch", config_differences=diffs)
            return record
    checkpoints = _checkpoint_steps(run_dir)
    record["step"] = checkpoints[-1] if checkpoints else 0
    done = _read_json(run_dir / DONE_FILE)
    if done is not None:
        record.update(status=done["status"], final=True, step=done.get("env_steps", record["step"]),
                      detail=done.get("detail"))
    elif checkpoints and checkpoints[-1] >= scale.steps:  # finished, but done.json was not written
        record.update(status="finished", final=True)
    elif check_lock and _held_elsewhere(run_dir):
        record["status"] = "running"
    else:
        record["status"] = "error" if error else "partial" if checkpoints else "started"
    if record["status"] == "finished":
        record["nonfinite_losses_since"] = _nonfinite_losses_since(run_dir)
        if steps and steps[-1] == scale.steps and returns[-1] is not None:
            record["final_return"] = returns[-1]
        elif steps and steps[-1] == scale.steps:
            record["status"] = "nonfinite"
        else:  # the last evaluation is missing: not a result
            record.update(status="partial", final=False)
    return record


# ------------------------------------------------------------------------------------------------- training


def _clear(run_dir: pathlib.Path) -> None:
    """Removes a run directory's contents (kept: the lock and the worker log) before a start from scratch."""
    for path in run_dir.iterdir():
        if path.name in (LOCK_FILE, WORKER_LOG):  # the worker's log is open in the parent
            continue
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_one(spec: RunSpec, scale: Scale, runs_dir: pathlib.Path, progress: bool = False) -> dict:
    """Trains (or resumes) one run to ``scale.steps`` unless it is final; returns ``inspect_run``'s record plus
    ``action``: skipped, locked, trained, or error."""
    from absl import logging as absl_logging

    from experiments import sac_loop

    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every checkpoint at INFO
    config = make_config(spec, scale)
    run_dir = run_dir_of(runs_dir, scale, spec)
    with _locked(run_dir) as ok:
        if not ok:
            return {**inspect_run(run_dir, scale, config), "action": "locked"}
        state = inspect_run(run_dir, scale, config, check_lock=False)
        if state["final"] or state["status"] == "config_mismatch":
            return {**state, "action": "skipped"}
        checkpoints = _checkpoint_steps(run_dir)
        if not checkpoints:
            _clear(run_dir)
        start_step = checkpoints[-1] if checkpoints else 0
        started, summary = time.perf_counter(), None
        session = {"time": _now(), "start_step": start_step, "status": "interrupted"}
        try:
            summary = sac_loop.train(config, run_dir, resume=bool(checkpoints), progress=progress)
        except Exception as error:  # noqa: BLE001 (recorded; the session goes on with the next run)
            message = f"{type(error).__name__}: {error}"
            session["status"] = "error"
            (run_dir / ERROR_FILE).write_text(json.dumps(
                {"error": message, "time": _now(), "start_step": start_step}, indent=2) + "\n")
            return {**inspect_run(run_dir, scale, config, check_lock=False), "action": "error", "error": message}
        finally:  # also on an error or Ctrl-C: the time spent counts in the run's cost
            session["seconds"] = round(time.perf_counter() - started, 2)
            if summary is not None:
                session.update(end_step=summary["env_steps"], status=summary["status"])
            else:  # what persists is the latest checkpoint
                session["end_step"] = max([start_step, *_checkpoint_steps(run_dir)])
            with open(run_dir / SESSIONS_FILE, "a") as f:
                f.write(json.dumps(session) + "\n")
        diverged = summary["status"].startswith("diverged")
        if diverged or summary["env_steps"] >= scale.steps:
            (run_dir / DONE_FILE).write_text(json.dumps(
                {"status": "diverged" if diverged else "finished", "detail": summary["status"],
                 "env_steps": summary["env_steps"], "time": _now()}, indent=2) + "\n")
            with contextlib.suppress(FileNotFoundError):
                (run_dir / ERROR_FILE).unlink()
        return {**inspect_run(run_dir, scale, config, check_lock=False), "action": "trained",
                "session_seconds": session["seconds"]}


def _describe_outcome(record: dict) -> str:
    status = record["status"]
    if record.get("action") == "error":
        return f"ERROR {record['error']}"
    if status == "finished":
        return f"finished, final eval return {record['final_return']:.1f}"
    if status == "diverged":
        return f"DIVERGED at step {record['step']} ({record.get('detail')})"
    if status == "config_mismatch":
        return "config mismatch, left alone: " + "; ".join(record["config_differences"][:3])
    return f"{status} at step {record['step']}"


def _scale_args(scale: Scale, runs_dir: pathlib.Path) -> list[str]:
    return ["--runs_dir", str(runs_dir), "--width", str(scale.width), "--batch", str(scale.batch),
            "--steps", str(scale.steps), "--seed_steps", str(scale.seed_steps), "--eval_every", str(scale.eval_every),
            "--eval_episodes", str(scale.eval_episodes), "--action_repeat", str(scale.action_repeat),
            "--checkpoint_every", str(scale.checkpoint_every)]


def train_runs(specs: Sequence[RunSpec], scale: Scale, runs_dir: pathlib.Path, workers: int,
               progress: bool) -> list[dict]:
    """Trains ``specs`` (in-process if ``workers == 1``, else in ``workers`` parallel subprocesses)."""
    outcomes = []
    total = len(specs)
    if workers <= 1:
        for i, spec in enumerate(specs, 1):
            state = inspect_run(run_dir_of(runs_dir, scale, spec), scale)
            how = f"resuming from step {state['step']}" if state["status"] == "partial" else "starting"
            print(f"[{i}/{total}] {spec.name}: {how}", flush=True)
            record = {**run_one(spec, scale, runs_dir, progress=progress), "run": spec.name}
            took = f" in {record['session_seconds']:.0f} s" if "session_seconds" in record else ""
            print(f"[{i}/{total}] {spec.name}: {_describe_outcome(record)}{took}", flush=True)
            outcomes.append(record)
        return outcomes
    queue = list(enumerate(specs, 1))
    active: dict[subprocess.Popen, tuple[int, RunSpec, float, Any]] = {}
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    try:
        while queue or active:
            while queue and len(active) < workers:
                i, spec = queue.pop(0)
                run_dir = run_dir_of(runs_dir, scale, spec)
                run_dir.mkdir(parents=True, exist_ok=True)
                log = open(run_dir / WORKER_LOG, "a")
                command = [sys.executable, "-m", "benchmarks.sac_reproduction", "--run_one", spec.name,
                           *_scale_args(scale, runs_dir)]
                process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
                active[process] = (i, spec, time.perf_counter(), log)
                print(f"[{i}/{total}] {spec.name}: started in worker pid {process.pid} (log: {run_dir / WORKER_LOG})",
                      flush=True)
            time.sleep(0.5)
            for process in [p for p in active if p.poll() is not None]:
                i, spec, started, log = active.pop(process)
                log.close()
                record = {**inspect_run(run_dir_of(runs_dir, scale, spec), scale), "run": spec.name,
                          "action": "trained" if process.returncode == 0 else "error",
                          "session_seconds": round(time.perf_counter() - started, 1)}
                if process.returncode != 0:
                    record["error"] = f"worker exited with status {process.returncode} (see its worker.log)"
                print(f"[{i}/{total}] {spec.name}: {_describe_outcome(record)} in {record['session_seconds']:.0f} s",
                      flush=True)
                outcomes.append(record)
    finally:
        for process, (_, _, _, log) in active.items():  # only on an interruption: stop the workers we started
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=60)
            log.close()
    return outcomes


# ------------------------------------------------------------------------------------------------ aggregate


def _mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return float(np.mean(values)), float(np.std(values))


def _cell(task: str, config: str, seeds: Sequence[int], planned_seeds: Sequence[int], runs: dict) -> dict:
    records = {seed: runs[(config, task, seed)] for seed in seeds if (config, task, seed) in runs}
    final = {s: r for s, r in records.items() if r["final"]}
    finished = {s: r["final_return"] for s, r in final.items() if r["status"] == "finished"}
    diverged = sorted(s for s, r in final.items() if r["status"] == "diverged")
    nonfinite = sorted(s for s, r in final.items() if r["status"] == "nonfinite")
    mean, std = _mean_std(list(finished.values()))
    missing_planned = [s for s in planned_seeds if s not in final]
    if not records or all(r["status"] == "missing" for r in records.values()):
        status = "missing"
    elif missing_planned or len(final) < len(records):
        status = "incomplete"
    elif diverged or nonfinite:
        status = "diverged"
    else:
        status = "complete"
    partial = {str(s): {"status": r["status"], "step": r["step"], "last_eval_step": r["last_eval_step"],
                        "last_eval_return": r["last_eval_return"]}
               for s, r in records.items() if not r["final"] and r["status"] != "missing"}
    return {
        "status": status,
        "final_return_per_seed": {str(s): finished.get(s) for s in sorted(final)},
        "mean": mean, "std": std,
        "seeds_final": len(final), "seeds_finished": len(finished), "seeds_planned": len(planned_seeds),
        "seeds_diverged": diverged, "seeds_nonfinite": nonfinite,
        "incomplete_seeds": partial,
        "seed_status": {str(s): r["status"] for s, r in sorted(records.items())},
        "diverged_at_step": {str(s): records[s]["step"] for s in diverged},
        "nonfinite_losses_since": {str(s): r["nonfinite_losses_since"] for s, r in sorted(final.items())
                                   if r.get("nonfinite_losses_since") is not None},
    }


def _curves(task: str, config: str, seeds: Sequence[int], runs: dict) -> dict:
    """Mean +- std over finished seeds (on the evaluation steps they share), and the other seeds' own curves."""
    records = {s: runs[(config, task, s)] for s in seeds if (config, task, s) in runs}
    finished = [r for r in records.values() if r["status"] == "finished"]
    out: dict[str, Any] = {"finished": None, "diverged": {}, "partial": {}}
    if finished:
        common = sorted(set.intersection(*(set(r["eval_steps"]) for r in finished)))
        table = []
        for r in finished:
            by_step = dict(zip(r["eval_steps"], r["eval_returns"]))
            table.append([by_step[s] if by_step[s] is not None else np.nan for s in common])
        table = np.asarray(table, float).reshape(len(finished), len(common))
        out["finished"] = {"steps": common, "mean": np.nanmean(table, 0).tolist() if common else [],
                           "std": np.nanstd(table, 0).tolist() if common else [], "n": len(finished)}
    for s, r in records.items():
        if r["status"] in ("finished", "missing") or not r.get("eval_steps"):
            continue
        kind = "diverged" if r["status"] in ("diverged", "nonfinite") else "partial"
        out[kind][str(s)] = {"steps": r["eval_steps"], "returns": r["eval_returns"]}
    return out


def _done(cell: dict) -> bool:
    """Every planned seed of the cell is final (finished or diverged)."""
    return cell["status"] in ("complete", "diverged")


def _same_seeds_reference(cell: dict, reference: dict | None) -> dict:
    """fp16 (all methods) on the seeds ``cell`` finished, and ``cell``'s mean over them relative to it.

    Seed noise is large at this scale, so an ablation row with fewer seeds than fp16 is compared on its own
    seeds: ``fp16_same_seeds_mean`` and ``ratio_to_fp16_same_seeds`` (``None`` without a shared finished seed).
    """
    ours = {s: r for s, r in cell["final_return_per_seed"].items() if r is not None}
    theirs = {} if reference is None else reference["final_return_per_seed"]
    shared = sorted(s for s in ours if theirs.get(s) is not None)
    if not shared:
        return {"fp16_same_seeds": [], "fp16_same_seeds_mean": None, "ratio_to_fp16_same_seeds": None}
    ref = float(np.mean([theirs[s] for s in shared]))
    mean = float(np.mean([ours[s] for s in shared]))
    return {"fp16_same_seeds": [int(s) for s in shared], "fp16_same_seeds_mean": ref,
            "ratio_to_fp16_same_seeds": mean / ref if ref else None}


def _ratio(num: dict, den: dict) -> float | None:
    if num["mean"] is None or den["mean"] is None or den["mean"] == 0:
        return None
    return num["mean"] / den["mean"]


def _clean(obj: Any) -> Any:
    """Strict JSON: non-finite floats become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def aggregate(runs_dir: pathlib.Path, scale: Scale, plan: Sequence[RunSpec], argv: Sequence[str] | None) -> dict:
    """Reads every run of ``scale`` on disk and builds the result (see the module docstring)."""
    import jax

    specs = sorted(set(plan) | set(discover_runs(runs_dir, scale)),
                   key=lambda s: (s.task, ALL_CONFIGS.index(s.config), s.seed))
    runs = {}
    for spec in specs:
        runs[(spec.config, spec.task, spec.seed)] = inspect_run(run_dir_of(runs_dir, scale, spec), scale,
                                                                make_config(spec, scale))
    planned = {}
    for spec in plan:
        planned.setdefault((spec.config, spec.task), []).append(spec.seed)
    tasks = list(dict.fromkeys(s.task for s in [*plan, *specs]))
    seeds = sorted({s.seed for s in specs})
    results, curves, comparison, ablation = {}, {}, {}, {}
    for task in tasks:
        configs = [c for c in ALL_CONFIGS if (c, task) in planned or any(
            (c, task, s) in runs and runs[(c, task, s)]["status"] != "missing" for s in seeds)]
        results[task] = {c: _cell(task, c, seeds, planned.get((c, task), []), runs) for c in configs}
        curves[task] = {c: _curves(task, c, seeds, runs) for c in configs}
        cells = results[task]
        if "fp32" in cells and "fp16" in cells:
            fp16 = cells["fp16"]
            final = _done(cells["fp32"]) and _done(fp16)
            ratio = _ratio(fp16, cells["fp32"])
            meets = (ratio is not None and ratio >= TARGET_RATIO and not fp16["seeds_diverged"]
                     and not fp16["seeds_nonfinite"] and not fp16["nonfinite_losses_since"])
            entry = {"fp32_mean": cells["fp32"]["mean"], "fp16_mean": fp16["mean"], "ratio": ratio,
                     "target_ratio": TARGET_RATIO, "final": final, "meets_target": meets if final else None}
            if not final:
                entry["note"] = "provisional: fp32 or fp16 is not complete (ratio of the seeds final so far)"
            if "fp16_naive" in cells:
                naive = cells["fp16_naive"]
                reasons = []
                if naive["seeds_diverged"]:
                    reasons.append(f"diverged on seeds {naive['seeds_diverged']}")
                if naive["seeds_nonfinite"]:
                    reasons.append(f"non-finite final return on seeds {naive['seeds_nonfinite']}")
                naive_ratio = _ratio(naive, cells["fp32"])
                if naive_ratio is not None and naive_ratio < NAIVE_FAR_LOWER:
                    reasons.append(f"mean return {naive_ratio:.2f} x fp32's (< {NAIVE_FAR_LOWER})")
                conclusive = bool(reasons) or (_done(naive) and final)
                entry.update(naive_mean=naive["mean"], naive_ratio=naive_ratio, naive_status=naive["status"],
                             naive_failed=bool(reasons) if conclusive else None, naive_failure=reasons)
            comparison[task] = entry
        if any(c in cells for c in ABLATION_CONFIGS):
            reference = cells.get("fp16")
            rows = []
            for config in ("fp16", *ABLATION_CONFIGS, "fp16_naive", "fp32"):
                if config not in cells:
                    continue
                cell = cells[config]
                rows.append({"variant": config, "removed": removed_method(config) or (
                    "all" if config == "fp16_naive" else None), "mean": cell["mean"], "std": cell["std"],
                    "seeds_final": cell["seeds_final"], "seeds_planned": cell["seeds_planned"],
                    "seeds_diverged": cell["seeds_diverged"], "status": cell["status"],
                    "nonfinite_losses_since": cell["nonfinite_losses_since"],
                    "ratio_to_fp16_all_methods": _ratio(cell, reference) if reference else None,
                    **_same_seeds_reference(cell, reference)})
            ablation[task] = rows
    statuses = [r["status"] for r in runs.values()]
    final_runs = [r for r in runs.values() if r["final"]]
    planned_records = [runs[(s.config, s.task, s.seed)] for s in plan]
    remaining = [r for r in planned_records if not r["final"]]
    rates = [r["steps_per_s"] for r in runs.values() if r.get("steps_per_s")]
    steps_per_s = float(np.median(rates)) if rates else None
    remaining_steps = sum(scale.steps - r["step"] for r in remaining)
    result = {
        "benchmark": RESULT_NAME,
        "command": command_line("benchmarks.sac_reproduction", argv),
        "generated": _now(),
        "jax_version": jax.__version__,
        "complete": not remaining,
        "scale": {**scale.describe(), "why": (
            "Paper: width 1024, batch 1024, 500k-1M steps (~320 ms per update on this 2-core CPU, ~2 days per "
            "run). Here: the paper's hyper-parameters at a scale that fits this CPU; returns are not comparable "
            "to the paper's, fp16 vs fp32 at the same scale is.")},
        "plan": {"tasks": [t for t in tasks if any(s.task == t and s.config in MAIN_CONFIGS for s in plan)],
                 "ablation_tasks": sorted({s.task for s in plan if removed_method(s.config)}),
                 "seeds": sorted({s.seed for s in plan}), "configs": list(ALL_CONFIGS), "runs_planned": len(plan),
                 "runs_dir": str(pathlib.Path(runs_dir) / scale.tag)},
        "progress": {"runs_on_disk": sum(s != "missing" for s in statuses), "runs_final": len(final_runs),
                     "runs_planned_remaining": len(remaining),
                     "by_status": {s: statuses.count(s) for s in sorted(set(statuses))},
                     "median_steps_per_s": steps_per_s,
                     "estimated_hours_remaining_one_worker": (round(remaining_steps / steps_per_s / 3600, 2)
                                                              if steps_per_s else None)},
        "target_ratio": TARGET_RATIO,
        "naive_far_lower_threshold": NAIVE_FAR_LOWER,
        "results": results,
        "comparison": comparison,
        "ablation": ablation,
        "curves": curves,
        "runs": [{"run": f"{c}/{t}/seed{s}", **{k: v for k, v in r.items() if k not in ("eval_steps", "eval_returns")}}
                 for (c, t, s), r in runs.items()],
        "reference_returns_pytorch_sac_500k_1m": {t: REFERENCE_RETURNS[t] for t in tasks if t in REFERENCE_RETURNS},
        "notes": [
            "Only final runs are results: finished (final evaluation at `scale.steps`), diverged (non-finite "
            "actions; final_return null), nonfinite. Runs still partial are in `incomplete_seeds`, never in "
            "`final_return_per_seed` or the means.",
            "mean/std: over finished seeds (population std); diverged seeds are counted in `seeds_diverged`.",
            "comparison.meets_target is null until every planned seed of fp32 and fp16 is final on the task; a "
            "diverged fp16 seed fails the target, and so does one whose losses stayed non-finite.",
            "nonfinite_losses_since (per seed): a finished run whose logged critic losses are non-finite from that "
            "step to the end; the loss scaler skipped every update, so its final return is a frozen policy's.",
            "Ablation: paper appendix E, Figure 7 (one method removed from the all-methods fp16 agent); here on "
            "one task at reduced scale. ratio_to_fp16_same_seeds compares a row with fp16 on its own seeds.",
        ],
    }
    return _clean(result)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(result: dict) -> str:
    lines = [f"SAC reproduction at {result['scale']['tag']} ({'complete' if result['complete'] else 'INCOMPLETE'}: "
             f"{result['progress']['runs_final']} runs final, {result['progress']['runs_planned_remaining']} "
             "planned runs remaining)"]
    lines.append(f"{'task':<18} {'config':<26} {'mean':>8} {'std':>7} {'seeds':>6}  status")
    for task, cells in result["results"].items():
        for config, cell in cells.items():
            seeds = f"{cell['seeds_final']}/{cell['seeds_planned']}"
            extra = f" (diverged: seeds {cell['seeds_diverged']})" if cell["seeds_diverged"] else ""
            if cell["incomplete_seeds"]:
                extra += " not final: " + ", ".join(f"seed{s} {v['status']} at step {v['step']}"
                                                    for s, v in cell["incomplete_seeds"].items())
            lines.append(f"{task:<18} {config:<26} {_fmt(cell['mean']):>8} {_fmt(cell['std']):>7} {seeds:>6}  "
                         f"{cell['status']}{extra}")
    for task, c in result["comparison"].items():
        verdict = {True: "meets", False: "MISSES", None: "provisional, vs"}[c["meets_target"]]
        naive = {True: "failed", False: "did not fail", None: "undecided"}[c.get("naive_failed")]
        lines.append(f"{task}: fp16/fp32 = {_fmt(c['ratio'], 3)} ({verdict} target {c['target_ratio']}); naive fp16 "
                     f"{naive}" + (f" ({'; '.join(c['naive_failure'])})" if c.get("naive_failure") else ""))
    return "\n".join(lines)


COLORS = {"fp32": "tab:blue", "fp16": "tab:green", "fp16_naive": "tab:red"}


def plot(result: dict, out_png: pathlib.Path) -> None:
    """Learning curves per task (top) and the ablation bar chart per ablation task (bottom)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tasks = list(result["curves"])
    ablations = [t for t, rows in result["ablation"].items() if rows]
    ncols = max(1, len(tasks))
    nrows = 2 if ablations else 1
    figure = Figure(figsize=(5 * ncols, 4.2 * nrows), dpi=110)
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(nrows, max(ncols, len(ablations) or 1))
    palette = iter(["tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan"])
    colors = dict(COLORS, **{c: next(palette) for c in ABLATION_CONFIGS})
    for col, task in enumerate(tasks):
        axes = figure.add_subplot(grid[0, col])
        for config, curve in result["curves"][task].items():
            cell = result["results"][task][config]
            color = colors[config]
            label = f"{config} ({cell['seeds_final']}/{cell['seeds_planned']} final"
            if cell["seeds_diverged"]:
                steps_at = ", ".join(str(v) for v in cell["diverged_at_step"].values())
                label += f", {len(cell['seeds_diverged'])} diverged at step {steps_at}"
            label += ", INCOMPLETE)" if cell["status"] in ("incomplete", "missing") else ")"
            ablated = config in ABLATION_CONFIGS  # thinner, no band: the bar chart is their summary
            drawn = False
            if curve["finished"] and curve["finished"]["steps"]:
                steps = np.asarray(curve["finished"]["steps"])
                mean = np.asarray(curve["finished"]["mean"], float)
                std = np.asarray(curve["finished"]["std"], float)
                axes.plot(steps, mean, color=color, linewidth=1.0 if ablated else 1.8, label=label)
                if not ablated:
                    axes.fill_between(steps, mean - std, mean + std, color=color, alpha=0.2)
                drawn = True
            for kind, style in (("diverged", "-"), ("partial", ":")):
                for seed, c in curve[kind].items():
                    pts = [(s, r) for s, r in zip(c["steps"], c["returns"]) if r is not None]
                    if not pts:
                        continue
                    xs, ys = zip(*pts)
                    axes.plot(xs, ys, style, color=color, linewidth=1.0, alpha=0.8,
                              label=None if drawn else label)
                    drawn = True
                    if kind == "diverged":
                        axes.plot(xs[-1], ys[-1], "x", color=color, markersize=8)
            if not drawn and cell["status"] != "missing":  # e.g. diverged before its first evaluation
                axes.plot([], [], "x", color=color, label=label)
        if not axes.get_legend_handles_labels()[0]:
            axes.text(0.5, 0.5, "no evaluations yet", ha="center", va="center", transform=axes.transAxes)
        axes.set_title(task)
        axes.set_xlabel("agent steps")
        axes.set_ylabel("eval return")
        axes.grid(True, alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="x-small", loc="best")
    for col, task in enumerate(ablations):
        axes = figure.add_subplot(grid[1, :] if len(ablations) == 1 else grid[1, col])
        rows = result["ablation"][task]
        xs = np.arange(len(rows))
        for x, row in zip(xs, rows):
            done = _done(row)
            height = row["mean"] if row["mean"] is not None else 0.0
            axes.bar(x, height, yerr=row["std"] or 0.0, color=colors.get(row["variant"], "tab:gray"),
                     alpha=0.9 if done else 0.35, hatch=None if done else "//", edgecolor="black", capsize=3)
            text = f"{row['seeds_final']}/{row['seeds_planned']}"
            if row["seeds_diverged"]:
                text += f"\n{len(row['seeds_diverged'])} div."
            if row["nonfinite_losses_since"]:
                text += f"\n{len(row['nonfinite_losses_since'])} nan loss"
            if not done:
                text += f"\n{row['status']}"
            axes.text(x, height, text, ha="center", va="bottom", fontsize="x-small")
            if row["variant"] != "fp16" and row["fp16_same_seeds_mean"] is not None:
                axes.plot([x - 0.4, x + 0.4], [row["fp16_same_seeds_mean"]] * 2, color="tab:green", linewidth=2)
        axes.set_xticks(xs, [r["variant"].replace(ABLATION_PREFIX, "no ") for r in rows], rotation=20,
                        fontsize="small")
        axes.set_ylabel("final eval return (mean ± std over finished seeds)")
        axes.set_title(f"Ablation on {task}: fp16 with one method removed (paper Fig. 7); hatched = incomplete; "
                       "green line: fp16 with all methods on the bar's seeds")
        axes.grid(True, axis="y", alpha=0.3)
    figure.suptitle(f"SAC fp32 vs fp16 at {result['scale']['tag']}"
                    + ("" if result["complete"] else "  [INCOMPLETE: see the json]"))
    figure.tight_layout()
    figure.savefig(out_png)


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
                    "<results_dir>/sac_reproduction.{json,png}.")
    plan = parser.add_argument_group("what to run (the plan is default tasks + --tasks, seeds 0..num_seeds-1)")
    plan.add_argument("--tasks", type=_csv(str), default=None,
                      help=f"comma-separated dm_control tasks to train (default: {','.join(DEFAULT_TASKS)}); "
                           "tasks outside the default are added to the plan")
    plan.add_argument("--ablation_task", type=_csv(str), default=[DEFAULT_ABLATION_TASK],
                      help=f"task(s) of the one-method-removed ablation (default: {DEFAULT_ABLATION_TASK}; "
                           "why: see the module docstring)")
    plan.add_argument("--num_seeds", type=int, default=DEFAULT_NUM_SEEDS,
                      help=f"seeds 0..N-1 make the plan (default: {DEFAULT_NUM_SEEDS})")
    plan.add_argument("--seeds", type=_csv(int), default=None, help="only these seeds (comma-separated ids)")
    plan.add_argument("--configs", type=_csv(str), default=None,
                      help=f"only these configs (comma-separated; groups: main, ablation). Valid: "
                           f"{', '.join(ALL_CONFIGS)}")
    plan.add_argument("--only", type=_csv(str), default=None,
                      help="only runs whose name config/task/seedN matches one of these fnmatch patterns, "
                           "e.g. 'fp16*/walker-walk/*'")
    plan.add_argument("--max_runs", type=int, default=None, help="train at most N runs this session")
    plan.add_argument("--workers", type=int, default=1,
                      help="parallel runs in subprocesses (default 1; the machine has 2 cores and XLA already "
                           "uses both)")
    plan.add_argument("--aggregate_only", action="store_true", help="no training: aggregate what exists")
    plan.add_argument("--list", action="store_true", help="print the plan with each run's status and exit")
    plan.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="per-step progress bar (default: when stderr is a terminal and --workers 1)")
    scale = parser.add_argument_group("scale (part of the run directory name; paper: width 1024, batch 1024, 1M)")
    defaults = Scale()
    scale.add_argument("--width", type=int, default=defaults.width, help="hidden width (2 layers, actor and critic)")
    scale.add_argument("--batch", type=int, default=defaults.batch, help="batch size")
    scale.add_argument("--steps", type=int, default=defaults.steps, help="agent steps per run")
    scale.add_argument("--seed_steps", type=int, default=defaults.seed_steps, help="random-action steps first")
    scale.add_argument("--eval_every", type=int, default=defaults.eval_every, help="evaluate every N steps")
    scale.add_argument("--eval_episodes", type=int, default=defaults.eval_episodes, help="episodes per evaluation")
    scale.add_argument("--action_repeat", type=int, default=defaults.action_repeat,
                       help="0: the task's default (1 from states)")
    scale.add_argument("--checkpoint_every", type=int, default=defaults.checkpoint_every,
                       help="checkpoint at the first episode end after each multiple (not part of the scale)")
    paths = parser.add_argument_group("paths")
    paths.add_argument("--runs_dir", type=pathlib.Path, default=DEFAULT_RUNS_DIR, help="where run directories go")
    paths.add_argument("--results_dir", type=pathlib.Path, default=DEFAULT_RESULTS_DIR,
                       help="where sac_reproduction.{json,png} go")
    parser.add_argument("--run_one", default=None, help=argparse.SUPPRESS)  # a --workers subprocess
    args = parser.parse_args(argv)

    import lpjax.envs

    def check(ok: bool, message: str) -> None:
        if not ok:
            parser.error(message)

    for task in [*(args.tasks or []), *args.ablation_task]:
        try:
            lpjax.envs.parse_task(task)
        except ValueError as error:
            parser.error(f"bad task {task!r}: {error}")
    configs = []
    for name in args.configs or []:
        check(name in ALL_CONFIGS or name in CONFIG_GROUPS,
              f"unknown config {name!r}; valid: {', '.join(ALL_CONFIGS)} (or main, ablation)")
        configs.extend(CONFIG_GROUPS.get(name, (name,)))
    args.configs = configs or None
    check(args.num_seeds >= 1, "--num_seeds must be >= 1")
    check(min(args.width, args.batch, args.steps, args.eval_every, args.eval_episodes, args.checkpoint_every) >= 1,
          "--width, --batch, --steps, --eval_every, --eval_episodes, --checkpoint_every must be >= 1")
    check(0 <= args.seed_steps <= args.steps, f"--seed_steps must be in [0, --steps={args.steps}]")
    check(args.batch <= replay_capacity(args.steps), "--batch must be <= --steps (the replay buffer holds the run)")
    check(args.action_repeat >= 0, "--action_repeat must be >= 0")
    check(args.workers >= 1, "--workers must be >= 1")
    check(args.max_runs is None or args.max_runs >= 0, "--max_runs must be >= 0")
    return args


def _scale(args: argparse.Namespace) -> Scale:
    return Scale(width=args.width, batch=args.batch, steps=args.steps, seed_steps=args.seed_steps,
                 eval_every=args.eval_every, eval_episodes=args.eval_episodes, action_repeat=args.action_repeat,
                 checkpoint_every=args.checkpoint_every)


def _plan(args: argparse.Namespace, runs_dir: pathlib.Path, scale: Scale) -> list[RunSpec]:
    tasks = list(dict.fromkeys([*DEFAULT_TASKS, *(args.tasks or [])]))
    return build_plan(tasks, range(args.num_seeds), args.ablation_task)


def select(plan: Sequence[RunSpec], args: argparse.Namespace) -> list[RunSpec]:
    chosen = [s for s in plan
              if (args.tasks is None or s.task in args.tasks)
              and (args.seeds is None or s.seed in args.seeds)
              and (args.configs is None or s.config in args.configs)
              and (args.only is None or any(fnmatch.fnmatchcase(s.name, p) for p in args.only))]
    return chosen


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    scale = _scale(args)
    runs_dir = args.runs_dir.absolute()
    if args.run_one is not None:  # inside a --workers subprocess
        record = run_one(RunSpec.parse(args.run_one), scale, runs_dir, progress=False)
        print(json.dumps({k: v for k, v in record.items() if k not in ("eval_steps", "eval_returns")}), flush=True)
        if record.get("action") == "error":
            sys.exit(1)
        return record
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
            todo = todo[:args.max_runs]
        print(f"{len(plan)} runs planned at {scale.tag}; selected {len(selected)}: {len(skipped)} final (skipped), "
              f"{sum(states[s]['status'] == 'running' for s in selected)} running elsewhere, "
              f"training {len(todo)} now", flush=True)
        progress = args.progress if args.progress is not None else (sys.stderr.isatty() and args.workers == 1)
        try:
            trained = train_runs(todo, scale, runs_dir, args.workers, progress)
        except KeyboardInterrupt:
            print("\ninterrupted: rerun the same command to continue from the last checkpoints", flush=True)
    result = aggregate(runs_dir, scale, plan, argv)
    write_results(result, format_table(result), args.results_dir, RESULT_NAME, plot)
    return {"result": result, "trained": trained, "skipped": [s.name for s in skipped],
            "selected": [s.name for s in selected]}


if __name__ == "__main__":
    main()
