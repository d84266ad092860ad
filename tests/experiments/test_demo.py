"""``python -m experiments.demo`` (``make demo``): three runs in parallel, one chart, one verdict line."""

from __future__ import annotations

import json
import subprocess
import sys

from experiments import demo
from experiments.cli import REPO_ROOT

TINY = [
    "--config.total_steps=240",
    "--config.seed_steps=100",
    "--config.eval_every=120",
    "--config.eval_episodes=1",
    "--config.replay_capacity=240",
    "--config.agent.hidden_dims=32,32",
    "--config.agent.batch_size=32",
    "--config.log_every=60",
    "--config.checkpoint_every=1000",
]


def test_verdict_states_the_ratio_and_the_divergence_step():
    results = {
        "fp16": {"steps": [10, 20], "returns": [5.0, 90.0]},
        "fp32": {"steps": [10, 20], "returns": [6.0, 100.0]},
        "fp16_naive": {"diverged_at_step": 11, "status": "diverged: ..."},
    }
    assert demo.verdict(results) == (
        "verdict: fp16 with lpjax's methods reached 0.90x fp32's return (90.0 vs 100.0 "
        "at step 20); naive fp16 diverged at step 11."
    )
    results["fp16_naive"] = {"diverged_at_step": None, "status": "finished"}
    results["fp32"]["returns"] = []
    assert demo.verdict(results) == (
        "verdict: fp16 or fp32 has no evaluation to compare (see their logs); naive fp16 did not diverge (finished)."
    )


def test_demo_runs_three_precisions_and_writes_chart_summary_and_verdict(tmp_path):
    run_dir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.demo", f"--run_dir={run_dir}", "--progress=false", *TINY],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("verdict: fp16 with lpjax's methods reached ") and "naive fp16 diverged at step" in last

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["verdict"] == last
    runs = summary["runs"]
    for name in ("fp16", "fp32"):
        assert runs[name]["status"] == "finished" and runs[name]["steps"] == [120, 240], runs[name]
    # Naive fp16's first update (after the seed steps) makes its policy non-finite.
    assert runs["fp16_naive"]["status"].startswith("diverged") and runs["fp16_naive"]["diverged_at_step"] == 101
    stored = {name: json.loads((run_dir / name / "config.json").read_text()) for name in demo.RUNS}
    assert [stored[n]["agent"]["policy"] for n in demo.RUNS] == ["fp16", "fp32", "fp16"]
    methods = {name: stored[name]["agent"]["methods"] for name in demo.RUNS}
    assert all(methods["fp16"][m] for m in ("hadam", "loss_scaling", "kahan_gradients", "softplus_fix"))
    assert not any(methods[name][m] for name in ("fp32", "fp16_naive") for m in demo.METHODS)
    assert all(stored[n]["total_steps"] == 240 for n in demo.RUNS)
    png = (run_dir / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
