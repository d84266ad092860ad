"""Reads the SAC reproduction's runs and aggregates them into the result (``sac_reproduction.json``).

Only final runs count: ``final_return_per_seed`` holds finished runs' last evaluation (at ``--steps``), ``null``
for diverged seeds; partial runs are listed apart with their step and last evaluation and marked ``incomplete``.
Per cell (task, config): mean and (population) std over finished seeds, ``seeds_final`` / ``seeds_planned``,
``seeds_diverged``, status ``complete`` / ``diverged`` / ``incomplete`` / ``missing``, and each final seed's
numerical ``evidence`` (:mod:`benchmarks.run_evidence`). Per task: ``ratio`` = fp16 mean / fp32 mean against
:data:`TARGET_RATIO`, ``final`` only when both cells are complete; ``naive_failed`` when a naive seed diverged or
returned non-finite values, or its mean is below :data:`NAIVE_FAR_LOWER` x fp32's.
Ablation table: each variant's mean and its ratio to fp16 with all methods (also on the variant's own seeds)."""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from benchmarks import common, run_evidence
from benchmarks import sac_reproduction_plan as plan
from experiments import run_farm

TARGET_RATIO = 0.95  # fp16 mean final return / fp32's (paper Table 7: within ~3%)
NAIVE_FAR_LOWER = 0.5  # naive fp16 "failed" if its mean is below this fraction of fp32's
REFERENCE_RETURNS = {  # pytorch_sac fp32 at 500k / 1M steps: docs/design.md ("Reference returns and targets")
    "cartpole-swingup": [880, 881],
    "reacher-easy": [948, 987],
    "cheetah-run": [686, 802],
    "finger-spin": [880, 951],
    "ball_in_cup-catch": [976, 980],
    "walker-walk": [897, 905],
}
# Fields of config.json that may differ on resume (they do not change what is computed).
CONFIG_FIELDS_IGNORED = ("checkpoint_every",)
CONFIG_FIELDS_ADDED = {
    "agent.matmul_impl": "xla",
    "agent.high_precision_ends": False,
    "agent.methods.moment_dtype": None,
    "agent.methods.stochastic_rounding": False,
    "agent.methods.moment_block_size": 256,  # read only with 8-bit moments
    "agent.fused_optimizer": True,  # gives the per-leaf update's bits (docs/design.md, tests/optim/test_flat.py)
    "agent.rematerialize": False,
    "replay_dtype": None,
    "replay_shards": None,  # one stratum on one device
    "mesh": {"data": 1, "fsdp": 1},
    "distributed": {"coordinator_address": None, "num_processes": None, "process_id": None},
}
"""Config fields added after runs started, with the value that reproduces the old behaviour bit for bit: a stored
config without the field matches a flags config that has it at this value."""


# ------------------------------------------------------------------------------------------ one run's state


def config_differences(run_dir: pathlib.Path, expected_config) -> list[str]:
    """How the run's ``config.json`` differs from ``expected_config`` (none without one), aside from
    :data:`CONFIG_FIELDS_IGNORED` and :data:`CONFIG_FIELDS_ADDED` missing from it at their old value."""
    from lpjax.jsonable import to_jsonable

    path = pathlib.Path(run_dir) / "config.json"
    if not path.exists():
        return []
    return _config_differences(run_farm.read_json(path) or {}, json.loads(json.dumps(to_jsonable(expected_config))))


def _config_differences(stored: dict, expected: dict, prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(stored) | set(expected)):
        path, a, b = f"{prefix}{key}", stored.get(key, "<absent>"), expected.get(key, "<absent>")
        if path in CONFIG_FIELDS_IGNORED or (a == "<absent>" and CONFIG_FIELDS_ADDED.get(path, "<absent>") == b):
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.extend(_config_differences(a, b, f"{path}."))
        elif a != b:
            diffs.append(f"{path}: run has {a!r}, flags give {b!r}")
    return diffs


def inspect_run(run_dir: pathlib.Path, scale: plan.Scale, expected_config=None) -> dict:
    """What is on disk for one run. ``status``: :data:`experiments.run_farm.STATUSES`, ``nonfinite`` (finished
    with a non-finite final return) or ``config_mismatch`` (its ``config.json`` is not ``expected_config``'s).
    ``final`` says whether the run is done (finished, diverged or nonfinite): only final runs are results."""
    record: dict[str, Any] = {"run_dir": str(run_dir), "status": "missing", "final": False, "step": 0}
    record.update(dict.fromkeys(("final_return", "last_eval_return", "last_eval_step")))
    if not run_dir.is_dir():
        return record
    steps, returns = run_evidence.logged(run_dir, "eval/return")  # None for a non-finite return
    record["eval_steps"], record["eval_returns"] = steps, returns
    if steps:
        record["last_eval_step"], record["last_eval_return"] = steps[-1], returns[-1]
    record.update(run_farm.session_totals(run_dir))
    if error := run_farm.read_json(run_dir / run_farm.ERROR_FILE):
        record["last_error"] = error.get("error")
    if expected_config is not None and (diffs := config_differences(run_dir, expected_config)):
        return record | dict(status="config_mismatch", config_differences=diffs)
    record.update(run_farm.run_state(run_dir, scale.steps))
    if record["final"]:
        record["evidence"] = run_evidence.evidence(run_dir)
    if record["status"] == "finished":
        record["nonfinite_losses_since"] = run_evidence.nonfinite_losses_since(run_dir)
        if not steps or steps[-1] != scale.steps:  # the last evaluation is missing: not a result
            record.update(status="partial", final=False)
        elif returns[-1] is None:
            record["status"] = "nonfinite"
        else:
            record["final_return"] = returns[-1]
    return record


# ------------------------------------------------------------------------------------------------ aggregate


def _cell(task: str, config: str, seeds: Sequence[int], planned_seeds: Sequence[int], runs: dict) -> dict:
    records = {seed: runs[(config, task, seed)] for seed in sorted(seeds) if (config, task, seed) in runs}
    final = {s: r for s, r in records.items() if r["final"]}
    finished = {s: r["final_return"] for s, r in final.items() if r["status"] == "finished"}
    diverged, nonfinite = ([s for s, r in final.items() if r["status"] == kind] for kind in ("diverged", "nonfinite"))
    returns = list(finished.values())
    mean, std = (float(np.mean(returns)), float(np.std(returns))) if returns else (None, None)
    if all(r["status"] == "missing" for r in records.values()):
        status = "missing"
    elif len(final) < len(records) or any(s not in final for s in planned_seeds):
        status = "incomplete"
    else:
        status = "diverged" if diverged or nonfinite else "complete"
    cell = dict(status=status, final_return_per_seed={str(s): finished.get(s) for s in final}, mean=mean, std=std)
    cell.update(seeds_final=len(final), seeds_finished=len(finished), seeds_planned=len(planned_seeds))
    cell.update(seeds_diverged=diverged, seeds_nonfinite=nonfinite)
    partial = [(str(s), r) for s, r in records.items() if not r["final"] and r["status"] != "missing"]
    cell["incomplete_seeds"] = {s: _fields(r, "status step last_eval_step last_eval_return") for s, r in partial}
    cell["seed_status"] = {str(s): r["status"] for s, r in records.items()}
    cell["diverged_at_step"] = {str(s): records[s]["step"] for s in diverged}
    since = {str(s): r.get("nonfinite_losses_since") for s, r in final.items()}
    cell["nonfinite_losses_since"] = {s: step for s, step in since.items() if step is not None}
    cell["evidence"] = {str(s): r["evidence"] for s, r in final.items() if r.get("evidence")}
    return cell


def _pooled(recorded: dict, n: int, table: np.ndarray, steps: list) -> dict:
    """Mean and population std over ``n`` earlier seeds (``recorded``: their mean/std per step) and the rows of
    ``table``, from the pooled first and second moments: ``sum = n mean``, ``sum of squares = n (std^2 + mean^2)``."""
    index = {step: i for i, step in enumerate(recorded["steps"])}
    shared = [step for step in steps if step in index]
    mean, std = (np.array([recorded[key][index[s]] for s in shared], float) for key in ("mean", "std"))
    rows = table[:, [steps.index(s) for s in shared]]
    total = n + len(rows)
    first = (n * mean + rows.sum(0)) / total
    second = (n * (std**2 + mean**2) + (rows**2).sum(0)) / total
    std = np.sqrt(np.maximum(second - first**2, 0))
    return {"steps": shared, "mean": first.tolist(), "std": std.tolist(), "n": total}


def _returns_table(records: Sequence[dict]) -> tuple[np.ndarray, list]:
    """The runs' evaluation returns (NaN where non-finite) on the steps they all evaluated at, and those steps."""
    common = sorted(set.intersection(*(set(r["eval_steps"]) for r in records)))
    by_step = [dict(zip(r["eval_steps"], r["eval_returns"])) for r in records]
    table = [[np.nan if returns[s] is None else returns[s] for s in common] for returns in by_step]
    return np.asarray(table, float).reshape(len(records), len(common)), common


def _curves(
    task: str, config: str, seeds: list[int], runs: dict, previous: dict | None = None, previous_seeds: Collection = ()
) -> dict:
    """Mean +- std over finished seeds (on the evaluation steps they share), and the other seeds' own curves.

    Finished seeds recorded without their curve (:func:`recorded_runs`) count through ``previous``, the earlier
    aggregation's curves of the cell, when it pooled exactly the finished seeds of ``previous_seeds`` (those it
    recorded as final); the seeds finished since are pooled into it."""
    previous = previous or {}
    records = {seed: runs[(config, task, seed)] for seed in sorted(seeds) if (config, task, seed) in runs}
    finished = {s: r for s, r in records.items() if r["status"] == "finished"}
    blind = [r for r in finished.values() if "eval_steps" not in r]
    earlier = previous.get("finished")
    out: dict[str, Any] = {"finished": None, "diverged": {}, "partial": {}}
    if blind and earlier and earlier.get("n") == sum(s in previous_seeds for s in finished):
        since = [r for s, r in finished.items() if s not in previous_seeds]
        out["finished"] = _pooled(earlier, len(blind), *_returns_table(since)) if since else earlier
    elif with_curves := [r for r in finished.values() if "eval_steps" in r]:
        table, steps = _returns_table(with_curves)
        moments = dict(mean=np.nanmean(table, 0).tolist(), std=np.nanstd(table, 0).tolist())
        out["finished"] = {"steps": steps, **moments, "n": len(with_curves)}
    for s, r in records.items():
        for kind in ("diverged", "partial"):  # an earlier aggregation's curve of a seed recorded without it
            if r.get("recorded") and "eval_steps" not in r and str(s) in (previous.get(kind) or {}):
                out[kind][str(s)] = previous[kind][str(s)]
        if r["status"] not in ("finished", "missing") and r.get("eval_steps"):
            kind = "diverged" if r["status"] in ("diverged", "nonfinite") else "partial"
            out[kind][str(s)] = {"steps": r["eval_steps"], "returns": r["eval_returns"]}
    return out


def cell_done(cell: dict) -> bool:
    """Every planned seed of the cell is final (finished or diverged)."""
    return cell["status"] in ("complete", "diverged")


def _same_seeds_reference(cell: dict, reference: dict | None) -> dict:
    """fp16 (all methods) on the seeds ``cell`` finished, and ``cell``'s mean over them relative to it (``None``
    without a shared finished seed): seed noise is large, so a row with fewer seeds is compared on its own."""
    ours = {s: r for s, r in cell["final_return_per_seed"].items() if r is not None}
    theirs = reference["final_return_per_seed"] if reference else {}
    shared = sorted(s for s in ours if theirs.get(s) is not None)
    ref, mean = (float(np.mean([returns[s] for s in shared])) if shared else None for returns in (theirs, ours))
    out = {"fp16_same_seeds": [int(s) for s in shared], "fp16_same_seeds_mean": ref}
    return out | {"ratio_to_fp16_same_seeds": mean / ref if ref else None}


def _time_remaining(runs: dict, remaining: Sequence[plan.RunSpec], scale: plan.Scale) -> dict:
    """The median training speed (steps per second of training sessions) of each config's runs, and the hours the
    ``remaining`` runs' steps take at their config's speed, one run at a time (``None`` while one is untimed)."""
    timed = [(config, r["steps_per_s"]) for (config, _, _), r in runs.items() if r.get("steps_per_s")]
    medians = {c: float(np.median([rate for k, rate in timed if k == c])) for c in sorted({c for c, _ in timed})}
    steps_left = lambda s: scale.steps - runs[(s.config, s.task, s.seed)]["step"]
    known = all(s.config in medians for s in remaining)
    hours = round(sum(steps_left(s) / medians[s.config] for s in remaining) / 3600, 2) if known else None
    return {"median_steps_per_s": medians, "estimated_hours_remaining_one_worker": hours}


def _fields(record: dict, names: str) -> dict:
    return {name: record[name] for name in names.split()}


def _ratio(num: dict, den: dict | None) -> float | None:
    return None if den is None or num["mean"] is None or not den["mean"] else num["mean"] / den["mean"]


def _variant_rows(cells: dict, configs, head, fields: str, key: str, reference: str) -> list[dict]:
    """One row per config of ``configs`` on the task: ``head(config)``, the cell's ``fields``, ``key``: its mean over
    the ``reference`` config's, and its mean against fp16 (all methods) on its own seeds."""
    return [
        {"variant": c, **head(c), **_fields(cells[c], fields), key: _ratio(cells[c], cells.get(reference))}
        | _same_seeds_reference(cells[c], cells.get("fp16"))
        for c in configs
        if c in cells
    ]


def _rounding_rows(cells: dict) -> list[dict]:
    """The rounding study's rows on one task: how each config updates the parameters and the target, and its
    return against fp32 and against fp16 (Kahan for both) on its own seeds."""
    updates = lambda config: dict(zip(("parameter_update", "target_update"), plan.ROUNDING_ROWS[config]))
    fields = "final_return_per_seed mean std seeds_final status"
    return _variant_rows(cells, plan.ROUNDING_ROWS, updates, fields, "ratio_to_fp32", "fp32")


def ablation_rows(cells: dict) -> list[dict]:
    """The Figure 7 ablation on one task: each variant against fp16 with all methods (also on its own seeds)."""
    configs = ("fp16", *plan.ABLATION_CONFIGS, "fp16_naive", "fp32")
    removed = lambda config: {"removed": plan.removed_method(config) or ("all" if config == "fp16_naive" else None)}
    fields = "mean std seeds_final seeds_planned seeds_diverged status nonfinite_losses_since"
    return _variant_rows(cells, configs, removed, fields, "ratio_to_fp16_all_methods", "fp16")


def _clean(obj: Any) -> Any:
    """Strict JSON: non-finite floats become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def recorded_runs(previous: dict | None, scale: plan.Scale) -> dict[plan.RunSpec, dict]:
    """The final runs of an earlier result of the same scale (its ``runs``), by spec, marked ``recorded``: they stay
    results when their directories are gone (``runs/`` is not committed). A record holds its evaluation curve
    (``eval_steps``/``eval_returns``) when that aggregation kept it; else :func:`_curves` uses the cell's curve."""
    if not previous or previous.get("scale", {}).get("tag") != scale.tag:
        return {}
    out = {}
    for record in previous.get("runs", []):
        try:
            spec = plan.RunSpec.parse(record["run"])
        except (KeyError, ValueError):
            continue
        if record.get("final") and spec.config in plan.ALL_CONFIGS:
            out[spec] = {k: v for k, v in record.items() if k != "run"} | {"recorded": True}
    return out


NOTES = [
    "Only final runs are results: finished (final evaluation at `scale.steps`), diverged (non-finite actions; "
    "final_return null), nonfinite. Runs still partial are in `incomplete_seeds`, never in `final_return_per_seed` or "
    "the means.",
    "mean/std: over finished seeds (population std); diverged seeds are counted in `seeds_diverged`.",
    "comparison.meets_target is null until every planned seed of fp32 and fp16 is final on the task; a diverged fp16 "
    "seed fails the target, and so does one whose losses stayed non-finite.",
    "nonfinite_losses_since (per seed): a finished run whose logged critic losses are non-finite from that step to "
    "the end; the loss scaler skipped every update, so its final return is a frozen policy's.",
    "evidence (per seed, runs on disk at aggregation): each loss scaler's final scale and skipped steps over the "
    "whole run, read from the last checkpoint, and the last logged loss scales, entropy (SAC's target: -action_dim) "
    "and alpha; a config that misses its target is read against it.",
    "rounding (the rounding study, --rounding_task): each of the parameter and target updates either "
    "Kahan-compensated or stochastically rounded; ratio_to_fp32 and, on the row's own seeds, ratio_to_fp16_same_seeds "
    "(fp16: Kahan for both).",
    "recommended (per config beyond the paper): 'recommended' only when final and at least target_ratio of fp32 on "
    "every main task; 'withdrawn' once a final task misses it; 'undecided' while a task is not final.",
    "Ablation: paper appendix E, Figure 7 (one method removed from the all-methods fp16 agent); here on one task at "
    "reduced scale. ratio_to_fp16_same_seeds compares a row with fp16 on its own seeds.",
]
"""The result's ``notes``."""
SCALE_WHY = (
    "Paper: width 1024, batch 1024, 500k-1M steps (~320 ms per update on this 2-core CPU, ~2 days per "
    "run). Here: the paper's hyper-parameters at a scale that fits this CPU; returns are not comparable "
    "to the paper's, fp16 vs fp32 at the same scale is."
)


def read_runs(runs_dir: pathlib.Path, scale: plan.Scale, specs: Sequence[plan.RunSpec], recorded: dict) -> dict:
    """Every run of ``scale`` planned (``specs``), on disk or ``recorded`` (an earlier result's final runs, used
    where their directory is gone), by ``(config, task, seed)``, in task, config and seed order."""
    found = set(specs) | set(plan.discover_runs(runs_dir, scale)) | set(recorded)
    runs = {}
    for spec in sorted(found, key=lambda s: (s.task, plan.ALL_CONFIGS.index(s.config), s.seed)):
        record = inspect_run(plan.run_dir_of(runs_dir, scale, spec), scale, plan.make_config(spec, scale))
        if record["status"] == "missing" and spec in recorded:
            record = recorded[spec]
        runs[(spec.config, spec.task, spec.seed)] = record
    return runs


def naive_verdict(naive: dict, fp32: dict, final: bool) -> dict:
    """Whether naive fp16 failed on a task: a seed diverged or ended non-finite, or its mean is below
    :data:`NAIVE_FAR_LOWER` x fp32's (``None`` while undecided), and the reasons."""
    failures = dict(seeds_diverged="diverged", seeds_nonfinite="non-finite final return")
    reasons = [f"{what} on seeds {naive[key]}" for key, what in failures.items() if naive[key]]
    naive_ratio = _ratio(naive, fp32)
    if naive_ratio is not None and naive_ratio < NAIVE_FAR_LOWER:
        reasons.append(f"mean return {naive_ratio:.2f} x fp32's (< {NAIVE_FAR_LOWER})")
    conclusive = bool(reasons) or (cell_done(naive) and final)
    verdict = dict(naive_mean=naive["mean"], naive_ratio=naive_ratio, naive_status=naive["status"])
    return verdict | dict(naive_failed=bool(reasons) if conclusive else None, naive_failure=reasons)


def _against_fp32(cell: dict, fp32: dict, failures: str) -> tuple[float | None, bool, bool | None]:
    """``cell``'s mean over ``fp32``'s, whether both are final, and (``None`` until then) whether it reaches
    :data:`TARGET_RATIO` with none of the seeds that the cell's fields ``failures`` list."""
    final = cell_done(cell) and cell_done(fp32)
    ratio = _ratio(cell, fp32)
    meets = ratio is not None and ratio >= TARGET_RATIO and not any(cell[field] for field in failures.split())
    return ratio, final, meets if final else None


def comparison(cells: dict) -> dict:
    """fp16 (all methods) against fp32 on one task, with naive fp16's verdict and the configs beyond the paper."""
    fp16, fp32 = cells["fp16"], cells["fp32"]
    ratio, final, meets = _against_fp32(fp16, fp32, "seeds_diverged seeds_nonfinite nonfinite_losses_since")
    entry = dict(fp32_mean=fp32["mean"], fp16_mean=fp16["mean"], ratio=ratio, target_ratio=TARGET_RATIO)
    entry.update(final=final, meets_target=meets)
    if not final:
        entry["note"] = "provisional: fp32 or fp16 is not complete (ratio of the seeds final so far)"
    if "fp16_naive" in cells:
        entry.update(naive_verdict(cells["fp16_naive"], fp32, final))
    beyond = {}
    for config in (c for c in plan.BEYOND_CONFIGS if c in cells):
        cell = cells[config]
        ratio, done, meets = _against_fp32(cell, fp32, "seeds_diverged")
        row = dict(mean=cell["mean"], ratio=ratio, seeds_final=cell["seeds_final"], seeds_planned=cell["seeds_planned"])
        beyond[config] = row | dict(final=done, meets_target=meets)
    return entry | ({"beyond": beyond} if beyond else {})


def recommendation(comparisons: dict, tasks: Sequence[str]) -> dict:
    """Each config beyond the paper: ``recommended`` only when it is final and meets :data:`TARGET_RATIO` on every
    task of ``tasks``; ``withdrawn`` when a final task misses it; ``undecided`` otherwise."""
    verdicts = {}
    for config in plan.BEYOND_CONFIGS:
        rows = {task: comparisons.get(task, {}).get("beyond", {}).get(config) for task in tasks}
        meets = [None if row is None else row["meets_target"] for row in rows.values()]
        status = "withdrawn" if False in meets else "recommended" if all(meets) else "undecided"
        ratios = {task: None if row is None else row["ratio"] for task, row in rows.items()}
        verdicts[config] = {"status": status, "ratio_by_task": ratios}
    return verdicts


def aggregate(
    runs_dir: pathlib.Path,
    scale: plan.Scale,
    specs: Sequence[plan.RunSpec],
    argv: Sequence[str] | None,
    previous: dict | None = None,
) -> dict:
    """The result (see the module docstring) of the planned runs ``specs``: every run of ``scale`` on disk, and the
    final runs of ``previous`` (an earlier result of the same scale) whose directories are gone."""
    import jax

    recorded = recorded_runs(previous, scale)
    runs = read_runs(runs_dir, scale, specs, recorded)
    previous_curves = (previous or {}).get("curves", {}) if recorded else {}
    planned = {}
    for spec in specs:
        planned.setdefault((spec.config, spec.task), []).append(spec.seed)
    on_disk = {(config, task) for (config, task, _), r in runs.items() if r["status"] != "missing"}
    tasks = list(dict.fromkeys([*(s.task for s in specs), *(task for _, task, _ in runs)]))
    seeds = sorted({seed for _, _, seed in runs})
    results, curves, comparisons, ablation, rounding = {}, {}, {}, {}, {}
    for task in tasks:
        configs = [c for c in plan.ALL_CONFIGS if (c, task) in planned or (c, task) in on_disk]
        results[task] = cells = {c: _cell(task, c, seeds, planned.get((c, task), []), runs) for c in configs}
        before = previous_curves.get(task, {})
        earlier = lambda c: {spec.seed for spec in recorded if (spec.config, spec.task) == (c, task)}
        curves[task] = {c: _curves(task, c, seeds, runs, before.get(c), earlier(c)) for c in configs}
        if "fp32" in cells and "fp16" in cells:
            comparisons[task] = comparison(cells)
        if any(c in cells for c in plan.ABLATION_CONFIGS):
            ablation[task] = ablation_rows(cells)
        if any(c in cells for c in plan.ROUNDING_CONFIGS):
            rounding[task] = _rounding_rows(cells)
    statuses = [r["status"] for r in runs.values()]
    remaining = [s for s in specs if not runs[(s.config, s.task, s.seed)]["final"]]
    main_tasks = [t for t in tasks if any(s.task == t and s.config in plan.MAIN_CONFIGS for s in specs)]
    tasks_of = lambda configs: sorted({s.task for s in specs if s.config in configs})
    plan_record = dict(tasks=main_tasks, ablation_tasks=tasks_of(plan.ABLATION_CONFIGS))
    plan_record.update(rounding_tasks=tasks_of(plan.ROUNDING_CONFIGS), seeds=sorted({s.seed for s in specs}))
    plan_record.update(configs=list(plan.ALL_CONFIGS), runs_planned=len(specs))
    plan_record["runs_dir"] = str(pathlib.Path(runs_dir) / scale.tag)
    final = sum(r["final"] for r in runs.values())
    progress = dict(
        runs_on_disk=sum(s != "missing" for s in statuses), runs_final=final, runs_planned_remaining=len(remaining)
    )
    progress["by_status"] = {s: statuses.count(s) for s in sorted(set(statuses))}
    result = dict(benchmark="sac_reproduction", command=common.command_line("benchmarks.sac_reproduction", argv))
    result.update(generated=run_farm.now(), jax_version=jax.__version__, complete=not remaining)
    result.update(scale={**scale.describe(), "why": SCALE_WHY}, plan=plan_record)
    result["progress"] = progress | _time_remaining(runs, remaining, scale)
    result.update(target_ratio=TARGET_RATIO, naive_far_lower_threshold=NAIVE_FAR_LOWER, results=results)
    result.update(comparison=comparisons, recommended=recommendation(comparisons, main_tasks), ablation=ablation)
    result.update(rounding=rounding, curves=curves)
    result["runs"] = [{"run": f"{c}/{t}/seed{s}", **r} for (c, t, s), r in runs.items()]
    result["reference_returns_pytorch_sac_500k_1m"] = {t: REFERENCE_RETURNS[t] for t in tasks if t in REFERENCE_RETURNS}
    return _clean(result | {"notes": NOTES})


def format_table(result: dict) -> str:
    fmt = lambda value, digits=1: "-" if value is None else f"{value:.{digits}f}"
    progress = result["progress"]
    lines = [
        f"SAC reproduction at {result['scale']['tag']} ({'complete' if result['complete'] else 'INCOMPLETE'}: "
        f"{progress['runs_final']} runs final, {progress['runs_planned_remaining']} planned runs remaining)"
    ]
    rows = []
    for task, cells in result["results"].items():
        for config, cell in cells.items():
            status = cell["status"] + (f" (diverged: seeds {cell['seeds_diverged']})" if cell["seeds_diverged"] else "")
            todo = ", ".join(f"seed{s} {v['status']} at step {v['step']}" for s, v in cell["incomplete_seeds"].items())
            status += f" not final: {todo}" if todo else ""
            seeds = f"{cell['seeds_final']}/{cell['seeds_planned']}"
            rows.append([task, config, fmt(cell["mean"]), fmt(cell["std"]), seeds, "", status])
    header = ["task", "config", "mean", "std", "seeds", "", "status"]
    lines += common.format_table(header, rows, ["<18", "<26", ">8", ">7", ">6", "", ""])
    for task, c in result["comparison"].items():
        verdict = {True: "meets", False: "MISSES", None: "provisional, vs"}[c["meets_target"]]
        naive = {True: "failed", False: "did not fail", None: "undecided"}[c.get("naive_failed")]
        failure = f" ({'; '.join(c['naive_failure'])})" if c.get("naive_failure") else ""
        ratio = f"fp16/fp32 = {fmt(c['ratio'], 3)} ({verdict} target {c['target_ratio']})"
        lines.append(f"{task}: {ratio}; naive fp16 {naive}{failure}")
    for config, verdict in result["recommended"].items():
        ratios = ", ".join(f"{task} {fmt(r, 3)}" for task, r in verdict["ratio_by_task"].items())
        lines.append(f"{config}: {verdict['status']} ({ratios})")
    return "\n".join(lines)
