"""What one SAC update costs on this CPU, per precision, with the optimizer per leaf and fused: kernels and time.

For each of :data:`PRECISIONS`, with the optimizer ``per_leaf`` (every transform mapped over the leaves) and
``fused`` (one flat buffer per dtype, the learners' default): the work instructions of the compiled update
(:func:`benchmarks.hlo_traffic.kernel_count`, XLA:CPU's stand-in for the kernels a GPU launches) and the CPU time per
update (interleaved rounds, state donated). The goal of the fused layout: fp16 with the paper's methods launches at
most 1.1x fp32's kernels. XLA:CPU emulates float16/bfloat16 with conversions of its own (``fp16_naive`` shows that
part), and a CPU measures no low-precision speed-up.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import command_line, figure, finish, format_table, parser, random_transitions, run_environment
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


def parse_args(argv: Sequence[str] | None):
    cli = parser(RESULT_NAME, __doc__, quick="toy size, one round (a smoke test)")
    cli.add_argument("--width", type=int, default=256, help="hidden width of actor and critic (2 layers)")
    cli.add_argument("--batch", type=int, default=256, help="batch size")
    cli.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    cli.add_argument("--updates", type=int, default=20, help="updates per variant and round")
    cli.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated (fp32, fp16 always run)")
    args = cli.parse_args(argv)
    if args.quick:
        args.width, args.batch, args.rounds, args.updates = 16, 8, 1, 2
    if min(args.width, args.batch, args.rounds, args.updates) < 1:
        cli.error("--width, --batch, --rounds and --updates must be >= 1")
    chosen = {name.strip() for name in args.precisions.split(",") if name.strip()}
    if unknown := sorted(chosen - set(PRECISIONS)):
        cli.error(f"unknown precisions {unknown}; valid: {', '.join(PRECISIONS)}")
    args.precisions = [name for name in PRECISIONS if name in chosen | {"fp32", "fp16"}]
    return args


def kernels_scalars_not_donated(state: sac.SACState, batch: dict) -> int:
    """Kernels of the same update with the state's scalars (leaves of one element: loss scales, counters, keys,
    the log-temperature) not donated: the update inside a jit that donates only the state's other leaves."""
    leaves, tree = jax.tree.flatten(state)
    scalar = [np.size(leaf) <= 1 for leaf in leaves]

    def update(arrays, scalars, batch):
        parts = iter(arrays), iter(scalars)
        return sac.update(jax.tree.unflatten(tree, [next(parts[s]) for s in scalar]), batch)

    arrays = [leaf for leaf, s in zip(leaves, scalar) if not s]
    scalars = [leaf for leaf, s in zip(leaves, scalar) if s]
    return kernel_count(jax.jit(update, donate_argnums=0).lower(arrays, scalars, batch).compile().as_text())


def measure(args, argv: Sequence[str] | None) -> dict:
    batch = jax.tree.map(jnp.asarray, random_transitions(np.random.default_rng(0), args.batch, OBS_DIM, ACTION_DIM))
    kernels, states, steps, sizes = {}, {}, {}, dict(hidden_dims=(args.width,) * 2, batch_size=args.batch)
    for precision in args.precisions:
        for layout, fused in LAYOUTS.items():
            name, (policy, methods) = f"{precision}/{layout}", PRECISIONS[precision]
            config = sac.SACConfig(policy=policy, methods=methods, fused_optimizer=fused, **sizes)
            states[name] = sac.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, config)
            steps[name] = sac.update.lower(states[name], batch).compile()
            kernels[name] = kernel_count(steps[name].as_text())

    def update(name):
        states[name], metrics = steps[name](states[name], batch)
        return metrics

    timing = interleaved({name: functools.partial(update, name) for name in states}, args.rounds, args.updates)
    rows: dict[str, dict] = {precision: {} for precision in args.precisions}
    for name, count in kernels.items():
        precision, layout = name.split("/")
        ms = {"ms_per_update": 1e3 * timing[name]["median_s"], "ms_per_update_min": 1e3 * timing[name]["min_s"]}
        rows[precision][layout] = {"kernels": count, **ms}
    rows["fp16"]["fused"]["kernels_scalars_not_donated"] = kernels_scalars_not_donated(states["fp16/fused"], batch)
    fp16, fp32 = kernels["fp16/fused"], {layout: kernels[f"fp32/{layout}"] for layout in LAYOUTS}
    return {
        "benchmark": RESULT_NAME,
        "command": command_line(f"benchmarks.{RESULT_NAME}", argv),
        "environment": run_environment(),
        "backend": jax.default_backend(),
        "settings": {"width": args.width, "batch": args.batch, "obs_dim": OBS_DIM, "action_dim": ACTION_DIM}
        | {"rounds": args.rounds, "updates_per_round": args.updates},
        "machine": timing["machine"],
        "precisions": {name: f"policy={p}, methods={dataclasses.asdict(m)}" for name, (p, m) in PRECISIONS.items()},
        "rows": rows,
        "goal": {
            "fp16_over_fp32_kernels_at_most": GOAL_RATIO,
            "fp16_fused_over_fp32_per_leaf": fp16 / fp32["per_leaf"],
            "fp16_fused_over_fp32_fused": fp16 / fp32["fused"],
            "fp16_per_leaf_over_fp32_per_leaf": kernels["fp16/per_leaf"] / fp32["per_leaf"],
            **{f"met_against_fp32_{layout}": fp16 <= GOAL_RATIO * count for layout, count in fp32.items()},
        },
        "notes": [
            "kernels: work instructions of the compiled update; a lax.cond counts as one, its branches not.",
            "fp16 fused kernels_scalars_not_donated: the same update with the state's scalars not donated; the "
            "difference is XLA's copies of donated scalars the step reads before rewriting.",
            "fp16_naive's excess over fp32 at the same layout is XLA:CPU's float16 emulation, absent on a GPU.",
        ],
    }


def table(result: dict) -> str:
    settings, goal = result["settings"], result["goal"]
    head = f"SAC update, width {settings['width']}, batch {settings['batch']}, {result['backend']}"
    keys = [("per_leaf", "kernels"), ("fused", "kernels"), ("per_leaf", "ms_per_update"), ("fused", "ms_per_update")]
    rows = [[name, *(row[layout][k] for layout, k in keys)] for name, row in result["rows"].items()]
    header = ["precision", "kernels per leaf", "fused", "ms per leaf", "fused"]
    lines = [f"{head} (load {result['machine']['load_before']})"]
    lines += format_table(header, rows, ["<12", "17d", "7d", "12.2f", "7.2f"])
    lines.append(
        f"fp16 fused / fp32 per leaf: {goal['fp16_fused_over_fp32_per_leaf']:.2f}; / fp32 fused: "
        f"{goal['fp16_fused_over_fp32_fused']:.2f} (goal <= {goal['fp16_over_fp32_kernels_at_most']})"
    )
    return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
    """Kernels (left, with the goal over each fp32 layout) and CPU ms (right) per update, per precision and layout."""
    names, rows, settings = list(result["rows"]), result["rows"], result["settings"]
    panels = {"kernels": "kernels per update (XLA:CPU HLO)", "ms_per_update": "ms per update (CPU, median)"}
    with figure(path, 1, 2, figsize=(11, 4)) as (fig, axes):
        for layout, style in (("per_leaf", ":"), ("fused", "--")):
            goal = GOAL_RATIO * rows["fp32"][layout]["kernels"]
            axes[0].axhline(goal, color="k", ls=style, lw=1, label=f"1.1 x fp32 {layout}")
        for ax, (key, ylabel) in zip(axes, panels.items()):
            for offset, layout in ((-0.2, "per_leaf"), (0.2, "fused")):
                ax.bar(np.arange(len(names)) + offset, [rows[n][layout][key] for n in names], 0.4, label=layout)
            ax.set_xticks(np.arange(len(names)), names, rotation=20)
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=8)
        fig.suptitle(
            f"One SAC update, width {settings['width']}, batch {settings['batch']}: per-leaf vs fused optimizer"
        )


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    result = measure(args, argv)
    return finish(args, result, table(result), plot)


if __name__ == "__main__":
    main()
