"""Smoke test of benchmarks/sac_reproduction.py at a micro scale, into a temporary directory: two real runs
(fp32, fp16) on one task, the aggregate json/png, a second invocation that skips the final runs, and a
deliberately partial run that the aggregate marks incomplete and the next session resumes. Also: the plan's
configs and the ``python -m experiments.sac`` command lines of its workers (sac_reproduction_plan.py), and the
aggregation's reading of runs (sac_reproduction_aggregate.py)."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

from benchmarks import sac_reproduction as bench
from benchmarks import sac_reproduction_aggregate as agg
from benchmarks import sac_reproduction_plan as plan
from experiments import run_farm, sac_loop
from lpjax.jsonable import to_jsonable
from lpjax.methods import PrecisionMethods

TASK = "cartpole-swingup"
MICRO = [
    "--steps",
    "400",
    "--width",
    "32",
    "--batch",
    "32",
    "--seed_steps",
    "100",
    "--eval_every",
    "200",
    "--eval_episodes",
    "1",
    "--action_repeat",
    "8",
]  # 125-step episodes: short evaluations


def _args(tmp_path, *extra):
    return [
        *MICRO,
        "--tasks",
        TASK,
        "--configs",
        "fp32,fp16",
        "--runs_dir",
        str(tmp_path / "runs"),
        "--results_dir",
        str(tmp_path / "results"),
        "--no-progress",
        *extra,
    ]


def _sessions(run_dir):
    return [json.loads(line) for line in (run_dir / run_farm.SESSIONS_FILE).read_text().splitlines()]


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sac_reproduction")
    return tmp_path, bench.main(_args(tmp_path, "--num_seeds", "1"))


def test_help_is_fast_and_lists_the_flags():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.sac_reproduction", "--help"],
        capture_output=True,
        text=True,
        cwd=plan.REPO_ROOT,
        timeout=60,
    )
    assert result.returncode == 0
    for flag in (
        "--only",
        "--tasks",
        "--rounding_task",
        "--seeds",
        "--configs",
        "--max_runs",
        "--workers",
        "--aggregate_only",
        "--runs_dir",
        "--steps",
        "--width",
        "--batch",
    ):
        assert flag in result.stdout


def test_plan_and_ablation_configs():
    runs = plan.build_plan(plan.DEFAULT_TASKS, range(3), [plan.DEFAULT_ABLATION_TASK])
    per_task = len(plan.MAIN_CONFIGS + plan.BEYOND_CONFIGS)
    assert len(runs) == 3 * (3 * per_task + 6) and len(set(runs)) == len(runs)  # (main + beyond) x tasks + ablation
    assert [s.seed for s in runs] == sorted(s.seed for s in runs)  # seed 0 of every cell first
    # The ablation rows are the methods the paper's agent turns on; a switch it leaves off has no row.
    paper = PrecisionMethods.paper()
    assert tuple(m for m in PrecisionMethods.switches() if getattr(paper, m)) == plan.METHODS
    assert len(plan.METHODS) == 6 and "stochastic_rounding" not in plan.METHODS
    scale = plan.Scale()
    for method in plan.METHODS:
        agent = plan.make_config(plan.RunSpec(f"fp16_no_{method}", "walker-walk", 0), scale).agent
        assert agent.policy == "fp16"
        assert agent.methods.to_dict() == dataclasses.asdict(dataclasses.replace(paper, **{method: False}))
    sr = plan.make_config(plan.RunSpec("fp16_sr_8bit", "walker-walk", 1), scale)
    assert sr.agent.methods.stochastic_rounding and not sr.agent.methods.kahan_gradients
    assert not sr.agent.methods.kahan_momentum and sr.agent.methods.moment_dtype == "fp8"
    assert sr.replay_dtype == "fp16" and sr.agent.policy == "fp16"
    assert plan.make_config(plan.RunSpec("fp8", "walker-walk", 1), scale).agent.policy == "fp8"
    config = plan.make_config(plan.RunSpec("fp16_naive", "reacher-easy", 2), scale)
    assert not any(config.agent.methods[m] for m in plan.METHODS) and config.seed == 2
    assert tuple(config.agent.hidden_dims) == (256, 256) and config.agent.batch_size == 256
    assert config.total_steps == 100_000 and config.env == "dmc:reacher-easy"


def test_rounding_study_is_planned_only_on_its_tasks_and_rounds_one_update_each():
    default = plan.build_plan(plan.DEFAULT_TASKS, range(3), [plan.DEFAULT_ABLATION_TASK])
    study_only = [c for c in plan.ROUNDING_CONFIGS if c not in plan.BEYOND_CONFIGS]  # fp16_sr_params is both
    assert study_only == ["fp16_sr_target"] and not any(s.config in study_only for s in default)
    runs = plan.build_plan(plan.DEFAULT_TASKS, range(3), [plan.DEFAULT_ABLATION_TASK], ["walker-walk"])
    added = [s for s in runs if s not in default]
    assert sorted(added) == sorted(plan.RunSpec(c, "walker-walk", k) for c in study_only for k in range(3))
    assert len(runs) == len(set(runs))  # a config in the study and beyond the paper is planned once per seed
    # On a task outside the main ones, the study brings its references, fp16 and fp16_sr, once each.
    alone = plan.build_plan([], [0], [], ["hopper-stand"])
    assert [s.config for s in alone] == ["fp16", "fp16_sr", *plan.ROUNDING_CONFIGS]
    scale = plan.Scale()
    for config, (parameter_update, target_update) in plan.ROUNDING_ROWS.items():
        methods = plan.make_config(plan.RunSpec(config, "walker-walk", 0), scale).agent.methods
        # Each update is compensated by its Kahan buffer or else rounded stochastically: never both, never neither.
        assert methods.kahan_gradients == (parameter_update == "kahan")
        assert methods.kahan_momentum == (target_update == "kahan")
        assert methods.stochastic_rounding == ("stochastic" in (parameter_update, target_update))
        assert {m: methods[m] for m in plan.METHODS if "kahan" not in m} == dict.fromkeys(
            [m for m in plan.METHODS if "kahan" not in m], True
        )
    assert set(plan.ROUNDING_CONFIGS) < set(plan.ROUNDING_ROWS) and plan.CONFIG_GROUPS["rounding"]


def test_rounding_rows_compare_each_mix_with_fp32_and_with_fp16_on_its_seeds():
    def cell(*returns):
        values = {str(k): r for k, r in enumerate(returns)}
        return {
            "final_return_per_seed": values,
            "mean": float(np.mean(returns)),
            "std": 0.0,
            "seeds_final": len(returns),
            "status": "complete",
        }

    cells = {
        "fp32": cell(300.0, 300.0, 300.0),
        "fp16": cell(400.0, 200.0, 300.0),
        "fp16_sr": cell(150.0, 150.0, 150.0),
        "fp16_sr_params": cell(150.0, 100.0),
    }
    rows = agg._rounding_rows(cells)
    assert [r["variant"] for r in rows] == ["fp16", "fp16_sr_params", "fp16_sr"]  # fp16_sr_target: no runs
    params = rows[1]
    assert (params["parameter_update"], params["target_update"]) == ("stochastic", "kahan")
    assert params["ratio_to_fp32"] == pytest.approx(125.0 / 300.0)
    assert params["fp16_same_seeds"] == [0, 1] and params["ratio_to_fp16_same_seeds"] == pytest.approx(250 / 600)
    assert rows[0]["ratio_to_fp16_same_seeds"] == 1.0 and rows[2]["ratio_to_fp32"] == 0.5


def test_time_remaining_runs_each_config_at_its_own_speed():
    scale = plan.Scale(steps=100_000)
    runs = {
        ("fp16", TASK, 0): {"step": 100_000, "final": True, "steps_per_s": 100.0},
        ("fp16", TASK, 1): {"step": 100_000, "final": True, "steps_per_s": 300.0},
        ("fp16_naive", TASK, 0): {"step": 10, "final": True, "steps_per_s": 5000.0},  # diverged at once
        ("fp8", TASK, 0): {"step": 100_000, "final": True, "steps_per_s": 20.0},
        ("fp8", TASK, 1): {"step": 28_000, "final": False, "steps_per_s": None},  # partial, never timed
        ("fp16", TASK, 2): {"step": 0, "final": False},
    }
    remaining = [plan.RunSpec("fp8", TASK, 1), plan.RunSpec("fp16", TASK, 2)]
    out = agg._time_remaining(runs, remaining, scale)
    assert out["median_steps_per_s"] == {"fp16": 200.0, "fp16_naive": 5000.0, "fp8": 20.0}
    assert out["estimated_hours_remaining_one_worker"] == 1.14  # (72,000 / 20 + 100,000 / 200) seconds
    # a remaining run of a config that was never timed leaves the estimate open
    unknown = agg._time_remaining(runs, [*remaining, plan.RunSpec("fp16_sr", TASK, 0)], scale)
    assert unknown["estimated_hours_remaining_one_worker"] is None


@pytest.mark.parametrize("name", ["fp32", "fp16_naive", "fp16_no_hadam", "fp16_no_normal_fix", "fp16_sr_params"])
def test_worker_command_builds_the_same_config(name):
    """A --workers subprocess runs ``python -m experiments.sac`` with overrides: its flags give make_config's."""
    spec = plan.RunSpec(name, "walker-walk", 1)
    scale = plan.Scale(width=32, batch=32, steps=400, seed_steps=100, eval_every=200, eval_episodes=1, action_repeat=8)
    argv = plan.command(spec, scale, "/tmp/run", resume=True)
    assert argv[:3] == [sys.executable, "-m", "experiments.sac"]
    if name.startswith("fp16_no_"):
        assert f"--config.agent.methods.{name[8:]}=False" in argv
    argv = ["prog", *argv[3:]]
    parsed = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=parsed, lock_config=True, sys_argv=argv)
    flags.DEFINE_string("run_dir", None, "", flag_values=parsed)
    flags.DEFINE_bool("resume", False, "", flag_values=parsed)
    flags.DEFINE_bool("progress", True, "", flag_values=parsed)
    parsed(argv)
    assert to_jsonable(parsed.config) == to_jsonable(plan.make_config(spec, scale))
    assert (parsed.run_dir, parsed.resume, parsed.progress) == ("/tmp/run", True, False)


def test_first_session_trains_and_aggregates(first):
    tmp_path, out = first
    assert [r["action"] for r in out["trained"]] == ["trained", "trained"]
    assert (tmp_path / "results" / "sac_reproduction.png").stat().st_size > 0
    data = json.loads((tmp_path / "results" / "sac_reproduction.json").read_text())
    assert data["scale"]["width"] == 32 and data["scale"]["steps"] == 400 and "why" in data["scale"]
    for config in ("fp32", "fp16"):
        cell = data["results"][TASK][config]
        assert cell["status"] == "complete" and cell["seeds_final"] == cell["seeds_planned"] == 1
        (value,) = cell["final_return_per_seed"].values()
        assert np.isfinite(value) and cell["mean"] == pytest.approx(value) and cell["std"] == 0.0
        assert data["curves"][TASK][config]["finished"]["steps"] == [200, 400]
    # Each final seed's numerical evidence: fp16's two loss scalers, read from its last checkpoint; fp32 has none
    # (and logs a loss scale of 1).
    (fp16_evidence,) = data["results"][TASK]["fp16"]["evidence"].values()
    assert set(fp16_evidence["loss_scalers"]) == {"agent.critic", "agent.actor"}
    for scaler in fp16_evidence["loss_scalers"].values():
        assert scaler["scale"] > 0 and 0 <= scaler["skipped_steps"] <= 300  # 400 steps, 100 of them seed steps
    (fp32_evidence,) = data["results"][TASK]["fp32"]["evidence"].values()
    assert fp32_evidence["loss_scalers"] == {} and fp32_evidence["last_logged"]["critic_loss_scale"] == 1.0
    assert np.isfinite(fp16_evidence["last_logged"]["entropy"]) and fp16_evidence["last_logged"]["alpha"] > 0
    comparison = data["comparison"][TASK]
    assert comparison["final"] and comparison["target_ratio"] == 0.95
    assert comparison["ratio"] == pytest.approx(comparison["fp16_mean"] / comparison["fp32_mean"])
    assert comparison["meets_target"] == (comparison["ratio"] >= 0.95)
    assert comparison["naive_failed"] is None  # naive not run: undecided, not "did not fail"
    # Everything not run is reported as missing, never as a result.
    assert data["results"]["walker-walk"]["fp16_no_hadam"]["status"] == "missing"
    assert {row["variant"] for row in data["ablation"]["walker-walk"]} >= set(plan.ABLATION_CONFIGS)
    assert not data["complete"] and data["progress"]["runs_final"] == 2


def test_second_session_skips_final_runs(first):
    tmp_path, _ = first
    out = bench.main(_args(tmp_path, "--num_seeds", "1"))
    assert out["trained"] == [] and sorted(out["skipped"]) == [f"fp16/{TASK}/seed0", f"fp32/{TASK}/seed0"]
    scale = plan.Scale(width=32, batch=32, steps=400, seed_steps=100, eval_every=200, eval_episodes=1, action_repeat=8)
    for config in ("fp32", "fp16"):
        assert len(_sessions(plan.run_dir_of(tmp_path / "runs", scale, plan.RunSpec(config, TASK, 0)))) == 1


def test_partial_run_is_incomplete_then_resumed(first):
    tmp_path, _ = first
    scale = plan.Scale(width=32, batch=32, steps=400, seed_steps=100, eval_every=200, eval_episodes=1, action_repeat=8)
    spec = plan.RunSpec("fp16", TASK, 1)
    run_dir = plan.run_dir_of(tmp_path / "runs", scale, spec)
    # A run of the benchmark's config stopped at step 200 (as if interrupted after its checkpoint at 200).
    config = plan.make_config(spec, scale)
    config.total_steps = 200
    sac_loop.train(config, run_dir, progress=False)
    (run_dir / "config.json").write_text(json.dumps(to_jsonable(plan.make_config(spec, scale))))
    out = bench.main(_args(tmp_path, "--num_seeds", "2", "--aggregate_only"))
    assert out["trained"] == []
    data = json.loads((tmp_path / "results" / "sac_reproduction.json").read_text())
    cell = data["results"][TASK]["fp16"]
    assert cell["status"] == "incomplete" and cell["seeds_final"] == 1 and cell["seeds_planned"] == 2
    assert list(cell["final_return_per_seed"]) == ["0"]  # the partial seed is not a result
    assert cell["incomplete_seeds"]["1"]["status"] == "partial" and cell["incomplete_seeds"]["1"]["step"] == 200
    assert data["comparison"][TASK]["final"] is False and data["comparison"][TASK]["meets_target"] is None
    assert data["results"][TASK]["fp32"]["status"] == "incomplete"  # seed 1 missing
    assert "1" in data["curves"][TASK]["fp16"]["partial"]
    # The next session resumes it from its checkpoint (and trains nothing else: --max_runs 1).
    out = bench.main(_args(tmp_path, "--num_seeds", "2", "--seeds", "1", "--max_runs", "1"))
    assert [r["run"] for r in out["trained"]] == [spec.name]
    assert out["trained"][0]["status"] == "finished"
    session = _sessions(run_dir)[-1]
    assert (session["start_step"], session["end_step"]) == (200, 400)
    data = json.loads((tmp_path / "results" / "sac_reproduction.json").read_text())
    assert data["results"][TASK]["fp16"]["status"] == "complete"
    assert data["results"][TASK]["fp32"]["status"] == "incomplete"


def test_fields_added_since_a_run_started_match_at_their_old_behaviour():
    """A run started before ``agent.matmul_impl`` existed still matches configs with the default "xla"."""
    stored = {"agent": {"policy": "fp16"}, "seed": 0}
    assert agg._config_differences(stored, {"agent": {"policy": "fp16", "matmul_impl": "xla"}, "seed": 0}) == []
    diffs = agg._config_differences(stored, {"agent": {"policy": "fp16", "matmul_impl": "pallas"}, "seed": 0})
    assert diffs == ["agent.matmul_impl: run has '<absent>', flags give 'pallas'"]


def test_ablation_rows_are_compared_with_fp16_on_their_own_seeds():
    fp16 = {"final_return_per_seed": {"0": 400.0, "1": 300.0, "2": 200.0}}
    one_seed = {"final_return_per_seed": {"0": 200.0}}
    ref = agg._same_seeds_reference(one_seed, fp16)
    assert ref == {"fp16_same_seeds": [0], "fp16_same_seeds_mean": 400.0, "ratio_to_fp16_same_seeds": 0.5}
    # A diverged seed (None) is not a shared finished seed; the mean over seeds 1 and 2 is 250.
    two = {"final_return_per_seed": {"0": None, "1": 150.0, "2": 100.0}}
    assert agg._same_seeds_reference(two, fp16) == {
        "fp16_same_seeds": [1, 2],
        "fp16_same_seeds_mean": 250.0,
        "ratio_to_fp16_same_seeds": 0.5,
    }
    assert agg._same_seeds_reference(one_seed, None)["ratio_to_fp16_same_seeds"] is None
    assert agg._same_seeds_reference({"final_return_per_seed": {"0": None}}, fp16)["fp16_same_seeds"] == []


def test_a_beyond_config_is_recommended_only_when_final_and_on_target_on_every_task():
    def row(ratio, final=True):
        return {"ratio": ratio, "meets_target": (ratio >= agg.TARGET_RATIO) if final else None}

    tasks = ("a", "b", "c")
    config, other, *_ = plan.BEYOND_CONFIGS
    comparisons = {
        "a": {"beyond": {config: row(1.0), other: row(1.2)}},
        "b": {"beyond": {config: row(0.96), other: row(0.2, final=False)}},
        "c": {"beyond": {config: row(1.1), other: row(0.94)}},
    }
    verdicts = agg.recommendation(comparisons, tasks)
    assert verdicts[config] == {"status": "recommended", "ratio_by_task": {"a": 1.0, "b": 0.96, "c": 1.1}}
    assert verdicts[other]["status"] == "withdrawn"  # c misses, though b is not final
    del comparisons["c"]["beyond"][other]
    assert agg.recommendation(comparisons, tasks)[other]["status"] == "undecided"  # b not final, c unmeasured
    comparisons["b"]["beyond"][other] = row(0.99)
    assert agg.recommendation(comparisons, tasks)[other]["status"] == "undecided"  # c still unmeasured
    assert agg.recommendation(comparisons, tasks)[plan.BEYOND_CONFIGS[2]]["ratio_by_task"] == dict.fromkeys(tasks)


def test_aggregation_keeps_recorded_runs_whose_directories_are_gone(tmp_path):
    """The committed result, aggregated over an empty runs folder with itself as the earlier result, gives back
    every cell, curve, comparison and ablation row it holds."""
    recorded = json.loads((plan.REPO_ROOT / "benchmarks" / "results" / "sac_reproduction.json").read_text())
    scale = plan.Scale()
    assert recorded["scale"]["tag"] == scale.tag
    runs = plan.build_plan(
        plan.DEFAULT_TASKS, range(3), [plan.DEFAULT_ABLATION_TASK], recorded["plan"]["rounding_tasks"]
    )
    again = agg.aggregate(tmp_path, scale, runs, [], recorded)
    for task, cells in recorded["results"].items():
        for config, cell in cells.items():
            # a run still in progress when the result was written lives in its directory only: without it, its
            # seed is missing again
            unfinished = set(cell["incomplete_seeds"])
            status = {s: "missing" if s in unfinished else v for s, v in cell["seed_status"].items()}
            # and a cell whose only runs were in progress is missing as a whole
            cell_status = "missing" if set(status.values()) == {"missing"} else cell["status"]
            if config not in again["results"][task]:  # unplanned (the rounding study) with no final run left
                assert cell_status == "missing" and all((s.config, s.task) != (config, task) for s in runs)
                continue
            expected = dict(cell, incomplete_seeds={}, seed_status=status, status=cell_status)
            assert again["results"][task][config] == expected, (task, config)
            curves = recorded["curves"][task][config]
            partial = {s: c for s, c in curves["partial"].items() if s not in unfinished}
            assert again["curves"][task][config] == dict(curves, partial=partial), (task, config)
    assert again["ablation"] == recorded["ablation"]
    for task, entry in recorded["comparison"].items():
        assert again["comparison"][task]["ratio"] == entry["ratio"]
    assert not agg.aggregate(tmp_path, scale, runs, [], None)["results"]["walker-walk"]["fp32"]["mean"]


def test_a_pooled_curve_counts_each_seed_once_whether_it_is_recorded_or_back_on_disk():
    blind = {"status": "finished", "recorded": True}
    on_disk = {"status": "finished", "eval_steps": [10, 20], "eval_returns": [4.0, 8.0]}
    runs = {("fp16", "t", 0): blind, ("fp16", "t", 1): blind, ("fp16", "t", 2): on_disk}
    earlier = {"finished": {"steps": [10, 20], "mean": [1.0, 2.0], "std": [0.0, 0.0], "n": 2}}
    # seed 2 finished since the earlier result (which pooled seeds 0 and 1): it joins the pool
    pooled = agg._curves("t", "fp16", [0, 1, 2], runs, earlier, previous_seeds={0, 1})["finished"]
    assert pooled["n"] == 3 and pooled["mean"] == pytest.approx([2.0, 4.0])
    # the earlier result already pooled seed 2 (its directory is back, or it is recorded with its curve): kept as is
    again = {"finished": pooled}
    assert agg._curves("t", "fp16", [0, 1, 2], runs, again, previous_seeds={0, 1, 2})["finished"] == pooled
