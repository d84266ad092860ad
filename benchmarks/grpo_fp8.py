"""FP8 rollouts for GRPO on this machine: fp32 vs fp8 with TIS vs fp8 without TIS, 3 seeds, plus the bytes of
the weights and the KV cache per precision.

Each run is one ``experiments.grpo_loop.train`` of ``experiments/configs/grpo/{fp32,fp8_tis,fp8_no_tis}.py``
(2-digit addition, a 2-layer d_model-64 transformer warm-started to 30% accuracy, 8 prompts x 8 samples per
iteration, ``--iterations`` iterations). Recorded per run: the reward and mismatch-KL curves and the final
greedy accuracy; per config: the mean final reward (mean of the last 50 iterations) over seeds and its ratio to
fp32's (target: fp8_tis >= 0.95). Bytes: the linear layers' weights in fp32 / bf16 / fp8 (codes + 128x128 block
scales) and a full KV cache (fp32 / bf16 / fp8 codes + per-layer-and-head scales) at the benchmark's model and
at a 4096-token, 32-layer, 32-head x 128 LLM shape (target: fp8 KV >= 2x smaller than bf16, scales included).

Runs live in ``runs/grpo_fp8/<config>/seed<k>/`` and finished runs are not rerun. Writes
``benchmarks/results/grpo_fp8.{json,png}``.
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks import run_farm
from benchmarks.common import command_line, write_results

CONFIGS = ("fp32", "fp8_tis", "fp8_no_tis")
TARGET_RATIO = 0.95
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def kv_cache_bytes(layers: int, heads: int, head_dim: int, tokens: int, batch: int = 1) -> dict[str, int]:
    """Bytes of a K and V cache: fp32, bf16, and fp8 codes plus one float32 scale per layer, head and K/V."""
    elements = 2 * layers * batch * tokens * heads * head_dim
    return {"fp32": 4 * elements, "bf16": 2 * elements, "fp8": elements + 2 * layers * heads * 4}


def weight_bytes(shapes: Sequence[tuple[int, int]]) -> dict[str, int]:
    """Bytes of linear-layer weights: fp32, bf16, and fp8 codes plus a float32 scale per 128x128 block."""
    blocks = sum(-(-k // 128) * -(-n // 128) for k, n in shapes)
    elements = sum(k * n for k, n in shapes)
    return {"fp32": 4 * elements, "bf16": 2 * elements, "fp8": elements + 4 * blocks}


def model_bytes(config) -> dict[str, Any]:
    """Weights of the benchmark's transformer blocks and its KV cache for one sequence, per precision."""
    d, f, layers, heads = config.model.d_model, config.model.d_ff, config.model.num_layers, config.model.num_heads
    shapes = [(d, d)] * 4 * layers + [(d, f), (f, d)] * layers
    return {"weights": weight_bytes(shapes), "kv_cache": kv_cache_bytes(layers, heads, d // heads, 16)}


def train_run(name: str, seed: int, args: argparse.Namespace) -> pathlib.Path:
    from experiments import grpo_loop

    module = __import__(f"experiments.configs.grpo.{name}", fromlist=["get_config"])
    config = module.get_config()
    config.update(seed=seed, iterations=args.iterations, eval_every=max(args.iterations // 4, 1))
    run_dir = args.runs_dir / name / f"seed{seed}"
    job = run_farm.Job(
        f"{name}/seed{seed}",
        run_dir,
        unit="iterations",
        train=lambda resume, progress: grpo_loop.train(config, run_dir, resume=resume, progress=progress),
    )
    run_farm.train_to_end(job)
    return run_dir


def read_run(run_dir: pathlib.Path) -> dict[str, Any]:
    from lpjax.run_logging import read_metrics

    m = read_metrics(run_dir)
    rows = np.isfinite(m["train/reward"])
    evals = np.isfinite(m["eval/accuracy"])
    return {
        "iterations": m["step"][rows].tolist(),
        "reward": m["train/reward"][rows].tolist(),
        "mismatch_kl": m["train/mismatch_kl"][rows].tolist(),
        "tis_weight_mean": m["train/tis_weight_mean"][rows].tolist(),
        "eval_accuracy": m["eval/accuracy"][evals].tolist(),
    }


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for color, name in zip(("C0", "C1", "C3"), CONFIGS):
        for seed, run in result["runs"][name].items():
            label = name if seed == min(result["runs"][name]) else None
            axes[0].plot(run["iterations"], run["reward"], color=color, alpha=0.7, label=label)
            axes[1].plot(run["iterations"], run["mismatch_kl"], color=color, alpha=0.7, label=label)
    axes[0].set(xlabel="GRPO iteration", ylabel="mean reward (logged iterations)", title="GRPO on 2-digit addition")
    axes[1].set(
        xlabel="GRPO iteration",
        ylabel="mismatch KL(rollout || train) per token",
        yscale="symlog",
        title="rollout/training mismatch",
    )
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpo_fp8", description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=800)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--runs_dir", type=pathlib.Path, default=REPO_ROOT / "runs" / "grpo_fp8")
    parser.add_argument("--out_dir", type=pathlib.Path, default=pathlib.Path(__file__).parent / "results")
    parser.add_argument("--name", default="grpo_fp8")
    args = parser.parse_args(argv)
    from experiments.configs.grpo import fp32

    started = time.perf_counter()
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.configs.split(",")
    runs = {name: {seed: read_run(train_run(name, seed, args)) for seed in seeds} for name in names}
    final = {
        name: float(np.mean([np.mean(r["reward"][-5:]) for r in by_seed.values()])) for name, by_seed in runs.items()
    }
    reference = final.get("fp32")
    ratios = {name: value / reference if reference else None for name, value in final.items()}
    llm = {
        "weights_4096x4096_x7_per_layer_x32": weight_bytes([(4096, 4096)] * 7 * 32),
        "kv_cache_32l_32h_128d_4096tok": kv_cache_bytes(32, 32, 128, 4096),
    }
    bytes_ = {"benchmark_model": model_bytes(fp32.get_config()), "llm_shape": llm}
    kv = llm["kv_cache_32l_32h_128d_4096tok"]
    result = {
        "command": command_line("benchmarks.grpo_fp8", argv),
        "iterations": args.iterations,
        "seeds": seeds,
        "final_reward_mean_last_logged": final,
        "ratio_to_fp32": ratios,
        "target_ratio": TARGET_RATIO,
        "fp8_tis_meets_target": (ratios.get("fp8_tis") or 0) >= TARGET_RATIO if reference else None,
        "bytes": bytes_,
        "fp8_kv_smaller_than_bf16": kv["bf16"] / kv["fp8"],
        "runs": runs,
        "session_seconds": time.perf_counter() - started,
    }
    lines = [f"GRPO 2-digit addition, {args.iterations} iterations, seeds {seeds}"]
    lines += [f"{name:12s} final reward {final[name]:.3f}  ratio to fp32 {ratios[name]}" for name in names]
    lines.append(f"KV cache at the LLM shape: bf16 {kv['bf16']} B, fp8 {kv['fp8']} B ({kv['bf16'] / kv['fp8']:.3f}x)")
    write_results(result, "\n".join(lines), args.out_dir, args.name, plot)
    return result


if __name__ == "__main__":
    main()
