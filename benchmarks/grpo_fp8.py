"""GRPO's rollout mismatch on this machine: fp32 rollouts vs fp8 rollouts without correction and with each
correction (token-level TIS, sequence-level masked IS, geometric-mean rejection), vs bf16 and fp16 rollouts, over
3 seeds, plus the bytes of the weights and the KV cache per precision.

Each run is one ``experiments.grpo_loop.train`` of ``experiments/configs/grpo/<config>.py`` with the setting's
overrides; runs live in ``runs/grpo_fp8/<setting>/<config>/seed<k>/`` and finished runs are not rerun. Per config:
the final reward (mean of the last 5 logged iterations) over seeds and its ratio to fp32's, the mean mismatch KL
(``KL(rollout || train)`` per token) and rejected fraction; ``degradation``: whether fp8 without a correction ends
below ``TARGET_RATIO`` x fp32 and which corrections recover it.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.common import REPO, command_line, figure, finish, format_table, parser
from experiments import run_farm

CONFIGS = ("fp32", "fp8_no_tis", "fp8_tis", "fp8_mis", "fp8_geo", "bf16", "fp16")
FP8_CORRECTED = ("fp8_tis", "fp8_mis", "fp8_geo")
TARGET_RATIO = 0.95
DEFAULT_SETTING = {"task": "addition", "num_digits": 6, "temperature": 2.0, "iterations": 300}
"""The study's setting: of the settings tried (``--explore``), the one with the largest fp8 mismatch KL where fp32
still learns."""
DEFAULT_EXPLORE = "addition:2:1.0,addition:6:2.0,sort:9:1.5,sort:9:2.5"


def kv_cache_bytes(layers: int, heads: int, head_dim: int, tokens: int) -> dict[str, int]:
    """Bytes of one sequence's K and V cache: fp32, bf16, and fp8 codes plus a float32 scale per layer, head, K/V."""
    elements = 2 * layers * tokens * heads * head_dim
    return {"fp32": 4 * elements, "bf16": 2 * elements, "fp8": elements + 2 * layers * heads * 4}


def weight_bytes(shapes: Sequence[tuple[int, int]]) -> dict[str, int]:
    """Bytes of linear-layer weights: fp32, bf16, and fp8 codes plus a float32 scale per 128x128 block."""
    blocks = sum(-(-k // 128) * -(-n // 128) for k, n in shapes)
    elements = sum(k * n for k, n in shapes)
    return {"fp32": 4 * elements, "bf16": 2 * elements, "fp8": elements + 4 * blocks}


def make_config(name: str, seed: int, args: argparse.Namespace):
    """The config file's config with the setting and the run's size applied."""
    config = __import__(f"experiments.configs.grpo.{name}", fromlist=["get_config"]).get_config()
    config.update(seed=seed, env=f"task:{args.task}", num_digits=args.num_digits, iterations=args.iterations)
    config.eval_every = max(args.iterations // 4, 1)
    config.agent.temperature = args.temperature
    return config


def run(name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The logged curves of config ``name``'s run at ``seed`` in ``args``'s setting, trained first unless finished."""
    from experiments import grpo_loop
    from lpjax.run_logging import read_metrics

    setting = f"{args.task}{args.num_digits}_t{args.temperature:g}"  # e.g. sort9_t1.5
    run_dir = args.runs_dir / setting / name / f"seed{seed}"
    train = functools.partial(grpo_loop.train, make_config(name, seed, args), run_dir)  # train(resume, progress)
    run_farm.train_to_end(run_farm.Job(f"{name}/seed{seed}", run_dir, unit="iterations", train=train))
    m = read_metrics(run_dir)
    rows, evals = np.isfinite(m["train/reward"]), np.isfinite(m["eval/accuracy"])
    keys = ("reward", "mismatch_kl", "correction/rejected_fraction", "correction/weight_mean")
    out = {"iterations": m["step"][rows].tolist()} | {k.split("/")[-1]: m[f"train/{k}"][rows].tolist() for k in keys}
    return out | {"eval_accuracy": m["eval/accuracy"][evals].tolist()}


def explore(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    """fp32 and fp8 without a correction, seed 0, at ``setting`` (``task:digits:temperature``)."""
    task, digits, temperature = setting.split(":")
    chosen = {"task": task, "num_digits": int(digits), "temperature": float(temperature)}
    trial = argparse.Namespace(**vars(args) | chosen)
    runs = {name: {0: run(name, 0, trial)} for name in ("fp32", "fp8_no_tis")}
    summary = summarize(runs, list(runs))
    fp32, fp8 = summary["fp32"], summary["fp8_no_tis"]
    return chosen | {
        "iterations": args.iterations,
        "fp32_final_reward": fp32["final_reward_mean"],
        "fp8_no_correction_final_reward": fp8["final_reward_mean"],
        "ratio": fp8["ratio_to_fp32"],
        "fp8_mismatch_kl_mean": fp8["mismatch_kl_mean"],
        "fp32_final_eval_accuracy": fp32["final_eval_accuracy_mean"],
    }


def summarize(runs: dict[str, dict[int, dict]], names: Sequence[str]) -> dict[str, dict]:
    """Per config: final reward (mean of the last 5 logged iterations) per seed, its mean and std, the ratio to
    fp32's mean, the mean mismatch KL and rejected fraction over the run, and the final greedy accuracy."""
    out = {}
    for name in names:
        by_seed = runs[name]
        finals = [float(np.mean(r["reward"][-5:])) for r in by_seed.values()]
        out[name] = {
            "final_reward_per_seed": finals,
            "final_reward_mean": float(np.mean(finals)),
            "final_reward_std": float(np.std(finals)),
            "mismatch_kl_mean": float(np.mean([np.mean(r["mismatch_kl"]) for r in by_seed.values()])),
            "rejected_fraction_mean": float(np.mean([np.mean(r["rejected_fraction"]) for r in by_seed.values()])),
            "final_eval_accuracy_mean": float(np.mean([r["eval_accuracy"][-1] for r in by_seed.values()])),
        }
    reference = out.get("fp32", {}).get("final_reward_mean")
    for entry in out.values():
        entry["ratio_to_fp32"] = entry["final_reward_mean"] / reference if reference else None
    return out


def degradation(summary: dict[str, dict]) -> dict[str, Any]:
    """Whether fp8 rollouts without a correction end below ``TARGET_RATIO`` x fp32, and which corrections reach it."""
    if "fp32" not in summary or "fp8_no_tis" not in summary:
        return {}
    ratio = summary["fp8_no_tis"]["ratio_to_fp32"]
    degrades = bool(ratio is not None and ratio < TARGET_RATIO)
    recovered = [n for n in FP8_CORRECTED if n in summary and (summary[n]["ratio_to_fp32"] or 0) >= TARGET_RATIO]
    return {
        "fp8_no_correction_ratio": ratio,
        "fp8_no_correction_degrades": degrades,
        "recovered_by": recovered if degrades else None,  # None: nothing to recover
        "target_ratio": TARGET_RATIO,
    }


def describe(setting: dict) -> str:
    return f"{setting['task']} {setting['num_digits']} digits, temperature {setting['temperature']:g}"


COLORS = dict(fp32="C0", fp8_no_tis="C3", fp8_tis="C1", fp8_mis="C4", fp8_geo="C5", bf16="C2", fp16="C7")


def plot(result: dict, path: pathlib.Path) -> None:
    """Smoothed reward and mismatch KL per iteration (mean over seeds), and each config's final reward."""
    with figure(path, 1, 3, figsize=(16, 4.3)) as (fig, axes):
        summary = result["summary"]
        for name, by_seed in result["runs"].items():
            curves = [r["reward"] for r in by_seed.values()]
            length = min(len(c) for c in curves)
            iterations = np.asarray(next(iter(by_seed.values()))["iterations"][:length])
            window = min(5, length)  # a moving average
            mean = np.convolve(np.mean([c[:length] for c in curves], axis=0), np.ones(window) / window, mode="valid")
            axes[0].plot(iterations[len(iterations) - len(mean) :], mean, color=COLORS.get(name), label=name)
            kls = [r["mismatch_kl"][:length] for r in by_seed.values()]
            axes[1].plot(iterations, np.mean(kls, axis=0), color=COLORS.get(name), label=name)
        names = list(summary)
        means, stds = ([summary[n][f"final_reward_{k}"] for n in names] for k in ("mean", "std"))
        axes[2].bar(range(len(names)), means, yerr=stds, color=[COLORS.get(n) for n in names])
        for i, seeds in enumerate(summary[n]["final_reward_per_seed"] for n in names):
            axes[2].scatter([i] * len(seeds), seeds, color="k", s=8)
        axes[2].set_xticks(range(len(names)), names, rotation=30, fontsize=8)
        title = describe(result["setting"])
        axes[0].set(xlabel="GRPO iteration", ylabel="mean reward (5-point moving average)", title=title)
        axes[1].set(xlabel="GRPO iteration", ylabel="KL(rollout || train) per token", yscale="log", title="mismatch")
        axes[2].set(ylabel="final reward (last 5 logged), mean +- std over seeds", title="final reward per config")
        axes[0].legend(fontsize=7)


def table(result: dict) -> str:
    lines = [f"GRPO {describe(result['setting'])}, {result['iterations']} iterations, seeds {result['seeds']}"]
    keys = ("final_reward_mean", "final_reward_std", "ratio_to_fp32", "mismatch_kl_mean", "rejected_fraction_mean")
    rows = [
        [n, *("-" if e[k] is None else e[k] for k in keys), e["final_eval_accuracy_mean"]]
        for n, e in result["summary"].items()
    ]
    header = ["config", "final reward", "+-", "ratio", "mismatch KL", "rejected", "accuracy"]
    lines += format_table(header, rows, ["<12", "12.3f", "<5.3f", "6.3f", "12.2e", "9.4f", "9.3f"])
    if d := result["degradation"]:
        lines.append(
            f"fp8 without correction: {d['fp8_no_correction_ratio']:.3f} x fp32 "
            f"({'degrades' if d['fp8_no_correction_degrades'] else 'does not degrade'} below {d['target_ratio']})"
            + (f"; recovered by: {', '.join(d['recovered_by']) or 'none'}" if d["fp8_no_correction_degrades"] else "")
        )
    for t in result.get("settings_tried", []):
        ratio = "-" if t["ratio"] is None else f"{t['ratio']:.3f}"  # None: fp32's final reward is 0
        lines.append(
            f"tried {describe(t)}: fp8 without correction "
            f"{ratio} x fp32 (rewards {t['fp8_no_correction_final_reward']:.3f} / {t['fp32_final_reward']:.3f}, "
            f"mismatch KL {t['fp8_mismatch_kl_mean']:.2e}; fp32 accuracy {t['fp32_final_eval_accuracy']:.3f})"
        )
    kv = result["bytes"]["llm_shape"]["kv_cache_32l_32h_128d_4096tok"]
    lines.append(f"KV cache at the LLM shape: bf16 {kv['bf16']} B, fp8 {kv['fp8']} B ({kv['bf16'] / kv['fp8']:.3f}x)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    cli = parser("grpo_fp8", __doc__)
    cli.add_argument("--iterations", type=int, default=DEFAULT_SETTING["iterations"])
    cli.add_argument("--seeds", default="0,1,2")
    cli.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    cli.add_argument("--task", default=DEFAULT_SETTING["task"], choices=("addition", "copy", "sort"))
    cli.add_argument("--num_digits", type=int, default=DEFAULT_SETTING["num_digits"])
    cli.add_argument("--temperature", type=float, default=DEFAULT_SETTING["temperature"])
    explore_help = "settings task:digits:temperature tried first (fp32, fp8 uncorrected, seed 0); '' to skip"
    cli.add_argument("--explore", default=DEFAULT_EXPLORE, help=explore_help)
    cli.add_argument("--runs_dir", type=pathlib.Path, default=REPO / "runs" / "grpo_fp8")
    args = cli.parse_args(argv)
    names = args.configs.split(",")
    if unknown := sorted(set(names) - set(CONFIGS)):
        cli.error(f"unknown configs {unknown}; valid: {', '.join(CONFIGS)}")
    if not 1 <= args.num_digits <= 9 or args.temperature <= 0 or args.iterations < 1:
        cli.error("--num_digits must be in [1, 9], --temperature > 0 and --iterations >= 1")
    started = time.perf_counter()
    seeds = [int(s) for s in args.seeds.split(",")]
    settings_tried = [explore(setting, args) for setting in args.explore.split(",") if setting]
    runs = {name: {seed: run(name, seed, args) for seed in seeds} for name in names}
    summary = summarize(runs, names)
    kv = kv_cache_bytes(32, 32, 128, 4096)
    llm = {"weights_4096x4096_x7_per_layer_x32": weight_bytes([(4096, 4096)] * 7 * 32)}
    llm["kv_cache_32l_32h_128d_4096tok"] = kv
    model = make_config("fp32", 0, args).model  # the benchmark's transformer blocks, its KV cache for one sequence
    d, f, layers, heads = model.d_model, model.d_ff, model.num_layers, model.num_heads
    shapes = [(d, d)] * 4 * layers + [(d, f), (f, d)] * layers
    benchmark_model = {"weights": weight_bytes(shapes), "kv_cache": kv_cache_bytes(layers, heads, d // heads, 16)}
    result = {
        "command": command_line("benchmarks.grpo_fp8", argv),
        "setting": {"task": args.task, "num_digits": args.num_digits, "temperature": args.temperature},
        "iterations": args.iterations,
        "seeds": seeds,
        "corrections": {name: make_config(name, 0, args).agent.rollout_correction for name in names},
        "summary": summary,
        "degradation": degradation(summary),
        "settings_tried": settings_tried,
        "bytes": {"benchmark_model": benchmark_model, "llm_shape": llm},
        "fp8_kv_smaller_than_bf16": kv["bf16"] / kv["fp8"],
        "runs": runs,
        "session_seconds": time.perf_counter() - started,
    }
    return finish(args, result, table(result), plot)


if __name__ == "__main__":
    main()
