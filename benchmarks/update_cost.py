"""What one SAC update costs on this CPU, per precision, with the optimizer per leaf and fused: kernels and time.

For each precision (``fp32``, ``bf16``, naive ``fp16``, ``fp16`` with the paper's methods, ``fp16_sr``) and each
optimizer layout (``per_leaf``: every transform mapped over the parameters' leaves; ``fused``: the same chain over
one flat buffer per dtype, :func:`lpjax.optim.fused`, the learners' default) it records

* **kernels per update**: the work instructions of the compiled update's optimized HLO
  (:func:`benchmarks.hlo_traffic.kernel_count`), XLA:CPU's stand-in for the kernels a GPU launches;
* **CPU time per update**: the median over interleaved rounds (:func:`benchmarks.timing.interleaved`) of a jitted
  update on a fixed batch, the state donated as the learners do.

Everything is measured side by side in one process at one size (width and batch, default 256: the SAC
reproduction's scale). The goal of the fused layout is that fp16 with the paper's methods launches at most 1.1x
the kernels of fp32; the json compares it with fp32 as it ran before the fused layout (per leaf) and with fp32
fused. On XLA:CPU, float16 and bfloat16 are emulated (every dot's operands are converted to float32 by kernels of
their own, which a GPU does not have), so the CPU counts overstate the 16-bit precisions' kernels: ``fp16_naive``
(no method) shows that part. CPU time is not a low-precision speed-up measurement (there is none on a CPU).

``python -m benchmarks.update_cost [--width 256 --batch 256 --rounds 7 --updates 20] [--quick]``; writes
``benchmarks/results/update_cost.{json,png}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import command_line, random_transitions, run_environment, write_results
from benchmarks.hlo_traffic import kernel_count
from benchmarks.timing import interleaved
from lpjax.agents import sac
from lpjax.methods import PrecisionMethods

RESULT_NAME = "update_cost"
GOAL_RATIO = 1.1
OBS_DIM, ACTION_DIM = 17, 6  # cheetah-run's sizes
PRECISIONS = {
    "fp32": ("fp32", PrecisionMethods()),
    "bf16": ("bf16", PrecisionMethods()),
    "fp16_naive": ("fp16", PrecisionMethods()),
    "fp16": ("fp16", PrecisionMethods.paper()),
    "fp16_sr": ("fp16", PrecisionMethods.paper(kahan_gradients=False, kahan_momentum=False, stochastic_rounding=True)),
}
"""Each precision's policy and methods (``fp16``: the paper's six methods; ``fp16_sr``: stochastic rounding in
place of the two Kahan buffers, as ``experiments/configs/sac/fp16_sr.py``)."""
LAYOUTS = {"per_leaf": False, "fused": True}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.update_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=256, help="hidden width of actor and critic (2 layers)")
    parser.add_argument("--batch", type=int, default=256, help="batch size")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument("--updates", type=int, default=20, help="updates per variant and round")
    parser.add_argument(
        "--precisions",
        default=",".join(PRECISIONS),
        help=f"comma-separated subset of {', '.join(PRECISIONS)} (fp32 and fp16 are always measured)",
    )
    parser.add_argument("--quick", action="store_true", help="toy size, one round (a smoke test)")
    parser.add_argument("--out_dir", type=pathlib.Path, default=pathlib.Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.batch, args.rounds, args.updates = 16, 8, 1, 2
    if min(args.width, args.batch, args.rounds, args.updates) < 1:
        parser.error("--width, --batch, --rounds and --updates must be >= 1")
    chosen = {name.strip() for name in args.precisions.split(",") if name.strip()}
    unknown = sorted(chosen - set(PRECISIONS))
    if unknown:
        parser.error(f"unknown precisions {unknown}; valid: {', '.join(PRECISIONS)}")
    args.precisions = [name for name in PRECISIONS if name in chosen | {"fp32", "fp16"}]
    return args


def _config(precision: str, fused: bool, width: int, batch: int) -> sac.SACConfig:
    policy, methods = PRECISIONS[precision]
    return sac.SACConfig(
        policy=policy, methods=methods, hidden_dims=(width, width), batch_size=batch, fused_optimizer=fused
    )


def measure(args: argparse.Namespace) -> dict:
    batch = jax.tree.map(jnp.asarray, random_transitions(np.random.default_rng(0), args.batch, OBS_DIM, ACTION_DIM))
    kernels, states, steps = {}, {}, {}
    for precision in args.precisions:
        for layout, fused in LAYOUTS.items():
            name = f"{precision}/{layout}"
            config = _config(precision, fused, args.width, args.batch)
            state = sac.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, config)
            compiled = sac.update.lower(state, batch).compile()
            kernels[name] = kernel_count(compiled.as_text())
            states[name], steps[name] = state, compiled

    def variant(name):
        def run():
            out = None
            for _ in range(args.updates):
                states[name], out = steps[name](states[name], batch)
            return out

        return run

    timing = interleaved({name: variant(name) for name in states}, args.rounds)
    machine = timing.pop("machine")
    rows = {}
    for precision in args.precisions:
        rows[precision] = {
            layout: {
                "kernels": kernels[f"{precision}/{layout}"],
                "ms_per_update": 1e3 * timing[f"{precision}/{layout}"]["median_s"] / args.updates,
                "ms_per_update_min": 1e3 * timing[f"{precision}/{layout}"]["min_s"] / args.updates,
            }
            for layout in LAYOUTS
        }
    fp16, fp32 = rows["fp16"]["fused"]["kernels"], rows["fp32"]
    return {
        "benchmark": RESULT_NAME,
        "command": command_line(f"benchmarks.{RESULT_NAME}", args.argv),
        "environment": run_environment(),
        "backend": jax.default_backend(),
        "settings": {
            "width": args.width,
            "batch": args.batch,
            "obs_dim": OBS_DIM,
            "action_dim": ACTION_DIM,
            "rounds": args.rounds,
            "updates_per_round": args.updates,
        },
        "machine": machine,
        "precisions": {
            name: f"policy={policy}, methods={dataclasses.asdict(m)}" for name, (policy, m) in PRECISIONS.items()
        },
        "rows": rows,
        "goal": {
            "fp16_over_fp32_kernels_at_most": GOAL_RATIO,
            "fp16_fused_over_fp32_per_leaf": fp16 / fp32["per_leaf"]["kernels"],
            "fp16_fused_over_fp32_fused": fp16 / fp32["fused"]["kernels"],
            "fp16_per_leaf_over_fp32_per_leaf": rows["fp16"]["per_leaf"]["kernels"] / fp32["per_leaf"]["kernels"],
            "met_against_fp32_per_leaf": fp16 <= GOAL_RATIO * fp32["per_leaf"]["kernels"],
            "met_against_fp32_fused": fp16 <= GOAL_RATIO * fp32["fused"]["kernels"],
        },
        "notes": [
            "kernels: work instructions of the compiled update (benchmarks.hlo_traffic.kernel_count); a lax.cond "
            "counts as one, its branches not.",
            "XLA:CPU emulates float16/bfloat16 dots by converting their operands to float32 in kernels of their own; "
            "fp16_naive's excess over fp32 at the same layout is that emulation, absent on a GPU.",
            "ms_per_update: median over interleaved rounds of a jitted, donated update on a fixed batch; the machine's "
            "load is recorded beside it. Low precision is emulated on a CPU: no speed-up is expected or claimed.",
        ],
    }


def format_table(result: dict) -> str:
    lines = [
        f"SAC update, width {result['settings']['width']}, batch {result['settings']['batch']}, "
        f"{result['backend']} (load {result['machine']['load_before']})",
        f"{'precision':<12} {'kernels per leaf':>17} {'fused':>7} {'ms per leaf':>12} {'fused':>7}",
    ]
    for name, row in result["rows"].items():
        lines.append(
            f"{name:<12} {row['per_leaf']['kernels']:>17} {row['fused']['kernels']:>7} "
            f"{row['per_leaf']['ms_per_update']:>12.2f} {row['fused']['ms_per_update']:>7.2f}"
        )
    goal = result["goal"]
    lines.append(
        f"fp16 fused / fp32 per leaf: {goal['fp16_fused_over_fp32_per_leaf']:.2f}; / fp32 fused: "
        f"{goal['fp16_fused_over_fp32_fused']:.2f} (goal <= {goal['fp16_over_fp32_kernels_at_most']})"
    )
    return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["rows"])
    x = np.arange(len(names))
    fig, (kern, ms) = plt.subplots(1, 2, figsize=(11, 4))
    for offset, layout in ((-0.2, "per_leaf"), (0.2, "fused")):
        kern.bar(x + offset, [result["rows"][n][layout]["kernels"] for n in names], 0.4, label=layout)
        ms.bar(x + offset, [result["rows"][n][layout]["ms_per_update"] for n in names], 0.4, label=layout)
    fp32 = result["rows"]["fp32"]
    for layout, style in (("per_leaf", ":"), ("fused", "--")):
        kern.axhline(GOAL_RATIO * fp32[layout]["kernels"], color="k", ls=style, lw=1, label=f"1.1 x fp32 {layout}")
    kern.set_ylabel("kernels per update (XLA:CPU HLO)")
    ms.set_ylabel("ms per update (CPU, median)")
    for ax in (kern, ms):
        ax.set_xticks(x, names, rotation=20)
        ax.legend(fontsize=8)
    settings = result["settings"]
    fig.suptitle(f"One SAC update, width {settings['width']}, batch {settings['batch']}: per-leaf vs fused optimizer")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    args.argv = argv
    result = measure(args)
    write_results(result, format_table(result), args.out_dir, RESULT_NAME, plot)
    return result


if __name__ == "__main__":
    main()
