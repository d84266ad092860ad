"""The precision inspector on SAC: what it finds in naive fp16 and with the paper's methods, what a report costs,
and that it costs nothing when not called.

For each of ``--configs``, the reports of ``python -m experiments.inspect`` (the critic and actor phases of one
update on a batch collected in ``--env``) from a fresh initialisation and from ``--checkpoint``'s trained networks
cast to the config's precision: flagged rows by severity, harmless rows, the rows of the paper's four fp16
problems, and the time of a first (cold: XLA compiles every primitive) and a second (warm) report. Zero cost when
off: the lowered ``sac.update`` before any report and after all of them, and its update steps/s. The plot: exponent
histograms of the critic's weight gradients per layer, naive fp16 against fp16 with the methods.
"""

from __future__ import annotations

import collections
import importlib
import os
import pathlib
from collections.abc import Sequence

os.environ.setdefault("MUJOCO_GL", "egl")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import REPRODUCTION_RUNS, command_line, figure, finish, format_table, parser
from benchmarks.timing import interleaved

DEFAULT_CHECKPOINT = REPRODUCTION_RUNS / "fp32" / "walker-walk" / "seed0"


def load_config(name: str, env: str, width: int):
    """The SAC config ``experiments/configs/sac/<name>.py`` on ``env`` with ``width`` x ``width`` networks."""
    config = importlib.import_module(f"experiments.configs.sac.{name.removesuffix('.py')}").get_config()
    config.unlock()
    config.env = env
    config.agent.hidden_dims = (width, width)
    return config


def summarize(report, warm) -> dict:
    """``report``'s seconds and rows, its flagged rows by severity (the harmless ones apart), ``warm``'s seconds."""
    flagged = report.flagged()
    counts = collections.Counter(row.severity for row in flagged if row.harmless is None)
    stats = dict(seconds=report.seconds, equations=report.equations, rows=len(report.rows), errors=counts["error"])
    harmless = sum(row.harmless is not None for row in flagged)
    return stats | dict(warnings=counts["warning"], harmless=harmless, warm_seconds=warm.seconds)


FINDING_FIELDS = ("source", "scope", "primitive", "severity", "overflow_frac", "underflow_frac", "flushed_frac")
FINDING_FIELDS += ("nonfinite",)


def gradient_histograms(report) -> dict[str, dict[str, int]]:
    """``{layer scope: {exponent: count}}`` of the critic's backward ``dot_general`` rows (weight gradients)."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in report.rows:
        if row.primitive == "dot_general" and row.backward and "Dense" in row.scope:
            out[row.scope.split("SACCritic/")[-1]].update(row.exponents)
    return {scope: {str(k): v for k, v in sorted(counts.items())} for scope, counts in sorted(out.items())}


def overhead(config, batch_size: int, rounds: int, seconds: float) -> tuple[str, list[float]]:
    """The lowered text of ``config``'s jitted ``sac.update`` on a random batch, and its steps per second in
    ``rounds`` interleaved rounds of about ``seconds`` each."""
    from experiments import sac_loop
    from lpjax.agents import sac

    agent = sac_loop.validate(config)
    env = sac_loop.make_envs(config)[0]
    state = sac.init(jax.random.key(0), jnp.zeros(env.observation_shape), env.action_dim, agent)
    keys = jax.random.split(jax.random.key(1), 3)
    obs = jax.random.normal(keys[0], (batch_size, *env.observation_shape))
    batch = dict(obs=obs, action=jax.random.uniform(keys[1], (batch_size, env.action_dim), minval=-1, maxval=1))
    batch.update(reward=jax.random.uniform(keys[2], (batch_size,)), discount=jnp.ones(batch_size), next_obs=obs[::-1])
    lowered = sac.update.lower(state, batch).as_text()
    held = [state]

    def step():
        held[0], metrics = sac.update(held[0], batch)
        return metrics

    one_call = interleaved({"update": step}, 1)["update"]["median_s"]  # after a call that compiles
    timed = interleaved({"update": step}, rounds, calls=max(1, round(seconds / one_call)), warmup=0)["update"]
    return lowered, [1 / t for t in timed["rounds_s"]]


def run(args, checkpoint: str | None) -> dict:
    """The reports of each of ``args.configs`` per scenario, and the update's lowering and rate around them."""
    from experiments import inspect as cli

    scenarios = [("fresh", None)] + ([("checkpoint", checkpoint)] if checkpoint else [])
    configs = args.configs.split(",")
    overhead_config = load_config(configs[0], args.env, args.width)
    lowered_before, rate_before = overhead(overhead_config, args.batch, args.rounds, args.seconds)
    results, histograms = {}, {}
    for name in configs:
        for scenario, source in scenarios:
            config = cli.inspected_config(load_config(name, args.env, args.width), source)
            reports = cli.sac_reports(config, source, "auto", args.batch, seed=0)
            warm = cli.sac_reports(config, source, "auto", args.batch, seed=0)
            results[f"{name}/{scenario}"] = {
                "env": config.env,
                "hidden_dims": list(config.agent.hidden_dims),
                "phases": {phase: summarize(reports[phase], warm[phase]) for phase in reports},
                "paper_findings": {
                    finding: [{f: getattr(row, f) for f in FINDING_FIELDS} for row in rows]
                    for finding, rows in cli.paper_findings(reports).items()
                },
            }
            if scenario == "fresh":
                histograms[name] = gradient_histograms(reports["critic"])
    lowered_after, rate_after = overhead(overhead_config, args.batch, args.rounds, args.seconds)
    off = dict(lowering_identical=lowered_before == lowered_after, update_steps_per_s_before=rate_before)
    off["update_steps_per_s_after"] = rate_after
    return dict(results=results, gradient_exponents=histograms, zero_cost_when_off=off)


def table(result: dict) -> str:
    rows, columns = [], ("seconds", "warm_seconds", "equations", "errors", "warnings", "harmless")
    for key, entry in result["results"].items():
        rows += [[key, phase, *(stats[c] for c in columns)] for phase, stats in entry["phases"].items()]
        found = [name for name, hits in entry["paper_findings"].items() if hits]
        rows.append(f"{'':28} paper's problems found: {', '.join(found) or 'none'}")
    header = ["config/scenario", "phase", "cold s", "warm s", "eqns", "err", "warn", "harmless"]
    lines = format_table(header, rows, ["<28", "<7", ">7.1f", ">7.1f", ">5d", ">4d", ">5d", ">8d"])
    off = result["zero_cost_when_off"]
    lines.append(
        f"inspector off: lowering identical {off['lowering_identical']}; sac.update steps/s before "
        f"{np.median(off['update_steps_per_s_before']):.1f}, after {np.median(off['update_steps_per_s_after']):.1f}"
    )
    return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
    histograms = result["gradient_exponents"]
    layers = sorted({layer for per_config in histograms.values() for layer in per_config})
    size = (3.2 * len(layers), 3.2)
    with figure(path, 1, len(layers), figsize=size, sharey=True, squeeze=False, rect=(0, 0, 1, 0.9)) as (fig, axes):
        for ax, layer in zip(axes[0], layers):
            for color, (name, per_config) in enumerate(histograms.items()):
                counts = per_config.get(layer, {})  # empty where every gradient was nan/inf
                exponents = [int(k) for k in counts]
                ax.bar(exponents, list(counts.values()), width=1.0, alpha=0.5, color=f"C{color}", label=name)
            for x, style, label in (
                (-24, ":", "fp16 smallest subnormal 2^-24"),
                (-14, "--", "fp16 smallest normal 2^-14"),
                (16, "-", "fp16 max 65504 < 2^16"),
            ):
                ax.axvline(x, color="k", linestyle=style, linewidth=0.8, label=label)
            ax.set_title(layer, fontsize=8)
            ax.set_xlabel("floor(log2 |gradient|)")
        axes[0][0].set_ylabel("count")
        labelled = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels())}
        fig.legend(labelled.values(), labelled.keys(), fontsize=7, loc="upper right")
        fig.suptitle("critic weight-gradient exponents, first update (fresh initialisation)", x=0.3)


def main(argv: Sequence[str] | None = None) -> dict:
    cli = parser("inspector", __doc__)
    cli.add_argument("--configs", default="fp16_naive,fp16", help="SAC configs (names in experiments/configs/sac)")
    cli.add_argument("--env", default="dmc:walker-walk")
    cli.add_argument("--width", type=int, default=256)
    cli.add_argument("--batch", type=int, default=256)
    note = "trained run directory whose networks are inspected too ('none' to skip)"
    cli.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT), help=note)
    cli.add_argument("--rounds", type=int, default=3, help="rounds of the update-rate measurement")
    cli.add_argument("--seconds", type=float, default=2.0, help="seconds per update-rate measurement")
    args = cli.parse_args(argv)
    checkpoint = None if args.checkpoint == "none" else args.checkpoint
    if checkpoint and not (pathlib.Path(checkpoint) / "config.json").is_file():
        cli.error(
            f"--checkpoint={checkpoint} is not a training run directory (no config.json); pass "
            "--checkpoint=none or train one with python -m benchmarks.sac_reproduction"
        )
    result = dict(command=command_line("benchmarks.inspector", argv), env=args.env, width=args.width, batch=args.batch)
    result.update(checkpoint=checkpoint, jax=jax.__version__)
    result |= run(args, checkpoint)
    return finish(args, result, table(result), plot)


if __name__ == "__main__":
    main()
