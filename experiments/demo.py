r"""``make demo``: fp16 SAC with lpjax's methods beside fp32 and naive fp16, on one chart.

Three runs of ``python -m experiments.sac`` share the task, seed and hyper-parameters of the ``demo`` config and
differ only in precision (``RUNS``):

* ``fp16``: float16 parameters, activations, gradients and Adam state, with lpjax's six methods (the config);
* ``fp32``: float32 and plain Adam, the reference;
* ``fp16_naive``: float16 and plain Adam.

They run as parallel processes, each single-threaded so that they share the cores evenly. Naive fp16 ends at
its first update, when its policy turns non-finite, so fp16 and fp32 have the machine to themselves for the
rest. Each run writes its own directory under ``--run_dir`` (``<run_dir>/<run>/``: ``config.json``,
``metrics.csv``, checkpoints) and its output to ``<run_dir>/<run>.log``. At the end the demo draws every
evaluation on one chart (``<run_dir>/demo.png``), writes ``<run_dir>/summary.json`` and prints a verdict: the
ratio of fp16's final evaluation return to fp32's, and the step at which naive fp16 diverged.

``--config.*`` overrides apply to all three runs, e.g. ``--config.total_steps=4000`` for a quick look;
``--resume`` continues all three from their checkpoints.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from absl import app, flags
from ml_collections import config_flags

from experiments.cli import REPO_ROOT
from lpjax.methods import PrecisionMethods

CONFIG_FILE = REPO_ROOT / "experiments" / "configs" / "sac" / "demo.py"
METHODS = PrecisionMethods.switches()  # fp32 and naive fp16 turn every method off
RUNS = {
    "fp16": {"label": "fp16 + lpjax methods", "color": "tab:blue", "overrides": {}},
    "fp32": {
        "label": "fp32",
        "color": "black",
        "overrides": {"agent.policy": "fp32", **{f"agent.methods.{m}": False for m in METHODS}},
    },
    "fp16_naive": {
        "label": "naive fp16",
        "color": "tab:red",
        "overrides": {f"agent.methods.{m}": False for m in METHODS},
    },
}
POLL_SECONDS = 2.0


def define_flags() -> dict:
    """The command line's flags (defined when run as a program, so that importing this module defines none)."""
    return {
        "config": config_flags.DEFINE_config_file(
            "config", str(CONFIG_FILE), "The shared SAC config of the three runs.", lock_config=True
        ),
        "run_dir": flags.DEFINE_string(
            "run_dir", "runs/demo", "Directory of the three runs (relative: to the working directory)."
        ),
        "resume": flags.DEFINE_bool("resume", False, "Continue the three runs in --run_dir from their checkpoints."),
        "progress": flags.DEFINE_bool("progress", True, "Show a progress bar per run."),
    }


def run_command(name: str, run_dir: pathlib.Path, user_overrides: list[str], resume: bool) -> list[str]:
    """The ``experiments.sac`` command line of one run: the demo config, the user's overrides, then the run's."""
    own = [f"--config.{key}={value}" for key, value in RUNS[name]["overrides"].items()]
    return [
        sys.executable,
        "-m",
        "experiments.sac",
        f"--config={flags.FLAGS['config'].config_filename}",
        *user_overrides,
        *own,
        f"--run_dir={run_dir / name}",
        "--progress=false",
        *(["--resume"] if resume else []),
    ]


def resumable(run_dir: pathlib.Path) -> bool:
    """Whether a run directory holds a complete checkpoint (a run killed before its first one starts over)."""
    return any(p.name.isdigit() and p.is_dir() for p in (run_dir / "checkpoints").glob("*"))


def last_step(run_dir: pathlib.Path) -> int:
    """The last step logged in a run's ``metrics.csv`` (0 before the first row)."""
    from lpjax.run_logging import read_metrics

    try:
        steps = read_metrics(run_dir)["step"]
    except (ValueError, KeyError, IndexError):  # not written yet, or a row being appended
        return 0
    return int(steps[-1]) if len(steps) else 0


def read_summary(log: pathlib.Path) -> dict | None:
    """The run summary ``experiments.sac`` prints last (a JSON object), or ``None`` if the run did not finish."""
    lines = log.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line == "{"]
    if not starts:
        return None
    try:
        return json.loads("\n".join(lines[starts[-1] :]))
    except json.JSONDecodeError:
        return None


def evaluations(run_dir: pathlib.Path) -> tuple[list[int], list[float], list[float]]:
    """``(steps, mean returns, return standard deviations)`` of a run's evaluations."""
    import numpy as np

    from lpjax.run_logging import read_metrics

    try:
        columns = read_metrics(run_dir)
    except ValueError:
        return [], [], []
    if "eval/return" not in columns:
        return [], [], []
    rows = np.isfinite(columns["eval/return"])
    return (
        [int(s) for s in columns["step"][rows]],
        [float(r) for r in columns["eval/return"][rows]],
        [float(s) for s in columns["eval/return_std"][rows]],
    )


def verdict(results: dict) -> str:
    """One line: fp16's final evaluation return over fp32's, and where naive fp16 diverged."""
    parts = []
    fp16, fp32 = results["fp16"]["returns"], results["fp32"]["returns"]
    if fp16 and fp32 and fp32[-1] != 0:
        parts.append(
            f"fp16 with lpjax's methods reached {fp16[-1] / fp32[-1]:.2f}x fp32's return "
            f"({fp16[-1]:.1f} vs {fp32[-1]:.1f} at step {results['fp32']['steps'][-1]})"
        )
    else:
        parts.append("fp16 or fp32 has no evaluation to compare (see their logs)")
    naive = results["fp16_naive"]
    if naive["diverged_at_step"] is not None:
        parts.append(f"naive fp16 diverged at step {naive['diverged_at_step']}")
    else:
        parts.append(f"naive fp16 did not diverge ({naive['status']})")
    return "verdict: " + "; ".join(parts) + "."


def plot(results: dict, config, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, spec in RUNS.items():
        result = results[name]
        if result["steps"]:
            steps, mean, std = (np.asarray(result[k]) for k in ("steps", "returns", "return_stds"))
            ax.plot(steps, mean, marker="o", color=spec["color"], label=spec["label"])
            ax.fill_between(steps, mean - std, mean + std, color=spec["color"], alpha=0.15)
        if result["diverged_at_step"] is not None:
            ax.plot(
                [result["diverged_at_step"]],
                [0],
                marker="X",
                markersize=12,
                linestyle="none",
                color=spec["color"],
                label=f"{spec['label']}: diverged at step {result['diverged_at_step']}",
            )
    ax.set_xlim(0, config.total_steps * 1.02)
    ax.set_xlabel("agent steps")
    ax.set_ylabel(f"evaluation return (mean ± std, {config.eval_episodes} episodes)")
    ax.set_title(f"SAC on {config.env.partition(':')[2]}, seed {config.seed}")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv, defined: dict):
    del argv
    import tqdm

    config = defined["config"].value
    run_dir = pathlib.Path(defined["run_dir"].value).absolute()  # the runs start in the checkout's root
    resume = defined["resume"].value
    run_dir.mkdir(parents=True, exist_ok=True)
    user_overrides = [arg for arg in sys.argv[1:] if arg.startswith("--config.")]
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip())
    env.setdefault("MUJOCO_GL", "egl")
    procs, logs = {}, {}
    for name in RUNS:
        logs[name] = run_dir / f"{name}.log"
        if not resumable(run_dir / name):  # nothing to continue: start that run over
            shutil.rmtree(run_dir / name, ignore_errors=True)
        with open(logs[name], "a" if resume else "w") as log:
            procs[name] = subprocess.Popen(
                run_command(name, run_dir, user_overrides, resume and resumable(run_dir / name)),
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    bars = {
        name: tqdm.tqdm(
            total=config.total_steps,
            desc=f"{name:>10s}",
            position=i,
            unit="step",
            disable=not defined["progress"].value,
            dynamic_ncols=True,
        )
        for i, name in enumerate(RUNS)
    }
    started = time.perf_counter()
    try:
        while any(proc.poll() is None for proc in procs.values()):
            time.sleep(POLL_SECONDS)
            for name, bar in bars.items():
                bar.update(max(0, last_step(run_dir / name) - bar.n))
                if procs[name].poll() is not None and bar.total != bar.n:  # ended early: naive fp16's divergence
                    bar.total = bar.n
                    bar.set_postfix_str("stopped", refresh=True)
    except KeyboardInterrupt:
        for proc in procs.values():
            proc.terminate()
        raise
    finally:
        for bar in bars.values():
            bar.close()

    results = {}
    for name in RUNS:
        summary = read_summary(logs[name]) or {}
        status = summary.get("status", f"failed (exit {procs[name].returncode}), see {logs[name]}")
        steps, returns, stds = evaluations(run_dir / name)
        results[name] = {
            "status": status,
            "exit_code": procs[name].returncode,
            "steps": steps,
            "returns": returns,
            "return_stds": stds,
            "diverged_at_step": summary.get("env_steps") if status.startswith("diverged") else None,
        }
    line = verdict(results)
    plot(results, config, run_dir / "demo.png")
    record = {
        "config": config.to_dict(),
        "wall_seconds": time.perf_counter() - started,
        "runs": results,
        "verdict": line,
    }
    (run_dir / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {run_dir / 'demo.png'} and {run_dir / 'summary.json'} ({record['wall_seconds'] / 60:.1f} min)")
    print(line)
    failed = [name for name in ("fp16", "fp32") if procs[name].returncode != 0]
    if failed:
        raise SystemExit(f"the {' and '.join(failed)} run failed; see {', '.join(str(logs[n]) for n in failed)}")


if __name__ == "__main__":
    defined_flags = define_flags()
    app.run(lambda argv: main(argv, defined_flags))
