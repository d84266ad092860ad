"""The SAC reproduction's figure: learning curves per task (mean +- std over finished seeds; diverged seeds as thin
lines ending in x, partial seeds dotted) and the ablation bar chart (hatched bars: incomplete)."""

from __future__ import annotations

import pathlib

import numpy as np

from benchmarks.sac_reproduction_aggregate import cell_done
from benchmarks.sac_reproduction_plan import ABLATION_CONFIGS, ABLATION_PREFIX, ROUNDING_CONFIGS

COLORS = dict(fp32="tab:blue", fp16="tab:green", fp16_naive="tab:red", fp8="black", fp8_bf16_ends="dimgray")
COLORS.update(fp16_sr="darkgoldenrod", fp16_sr_8bit="darkviolet", fp16_sr_params="teal", fp16_sr_target="sandybrown")
ABLATION_COLORS = ["tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan"]
COLORS.update(zip(ABLATION_CONFIGS, ABLATION_COLORS))


def plot(result: dict, out_png: pathlib.Path) -> None:
    """Learning curves per task (top) and the ablation bar chart per ablation task (bottom)."""
    from matplotlib.figure import Figure

    tasks = list(result["curves"])
    ablations = [t for t, rows in result["ablation"].items() if rows]
    ncols = max(1, len(tasks))
    nrows = 2 if ablations else 1
    figure = Figure(figsize=(5 * ncols, 4.2 * nrows), dpi=110)
    grid = figure.add_gridspec(nrows, max(ncols, len(ablations) or 1))
    for col, task in enumerate(tasks):
        axes = figure.add_subplot(grid[0, col])
        for config, curve in result["curves"][task].items():
            cell, color = result["results"][task][config], COLORS[config]
            label = f"{config} ({cell['seeds_final']}/{cell['seeds_planned']} final"
            steps_at = ", ".join(str(v) for v in cell["diverged_at_step"].values())
            label += f", {len(cell['seeds_diverged'])} diverged at step {steps_at}" if cell["seeds_diverged"] else ""
            label += ", INCOMPLETE)" if cell["status"] in ("incomplete", "missing") else ")"
            # thinner, no band: the ablation's bar chart and the json's rounding rows are their summaries
            ablated = config in ABLATION_CONFIGS + ROUNDING_CONFIGS
            drawn = bool(curve["finished"] and curve["finished"]["steps"])
            if drawn:
                steps, mean, std = (np.asarray(curve["finished"][key], float) for key in ("steps", "mean", "std"))
                axes.plot(steps, mean, color=color, linewidth=1.0 if ablated else 1.8, label=label)
                if not ablated:
                    axes.fill_between(steps, mean - std, mean + std, color=color, alpha=0.2)
            for kind, style in (("diverged", "-"), ("partial", ":")):
                for c in curve[kind].values():
                    if pts := [(s, r) for s, r in zip(c["steps"], c["returns"]) if r is not None]:
                        xs, ys = zip(*pts)
                        axes.plot(xs, ys, style, color=color, linewidth=1.0, alpha=0.8, label=None if drawn else label)
                        drawn = True
                        if kind == "diverged":
                            axes.plot(xs[-1], ys[-1], "x", color=color, markersize=8)
            if not drawn and cell["status"] != "missing":  # e.g. diverged before its first evaluation
                axes.plot([], [], "x", color=color, label=label)
        axes.set(title=task, xlabel="agent steps", ylabel="eval return")
        axes.grid(True, alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="x-small", loc="best")
        else:
            axes.text(0.5, 0.5, "no evaluations yet", ha="center", va="center", transform=axes.transAxes)
    for col, task in enumerate(ablations):
        axes = figure.add_subplot(grid[1, :] if len(ablations) == 1 else grid[1, col])
        rows = result["ablation"][task]
        xs = np.arange(len(rows))
        for x, row in zip(xs, rows):
            done = cell_done(row)
            height = row["mean"] or 0.0
            style = dict(alpha=0.9, hatch=None) if done else dict(alpha=0.35, hatch="//")
            color = COLORS.get(row["variant"], "tab:gray")
            axes.bar(x, height, yerr=row["std"] or 0.0, color=color, edgecolor="black", capsize=3, **style)
            text = f"{row['seeds_final']}/{row['seeds_planned']}"
            for key, what in (("seeds_diverged", "div."), ("nonfinite_losses_since", "nan loss")):
                text += f"\n{len(row[key])} {what}" if row[key] else ""
            text += "" if done else f"\n{row['status']}"
            axes.text(x, height, text, ha="center", va="bottom", fontsize="x-small")
            if row["variant"] != "fp16" and row["fp16_same_seeds_mean"] is not None:
                axes.plot([x - 0.4, x + 0.4], [row["fp16_same_seeds_mean"]] * 2, color="tab:green", linewidth=2)
        axes.set_xticks(xs, [r["variant"].replace(ABLATION_PREFIX, "no ") for r in rows], rotation=20, fontsize="small")
        axes.set_ylabel("final eval return (mean ± std over finished seeds)")
        axes.set_title(
            f"Ablation on {task}: fp16 with one method removed (paper Fig. 7); hatched = incomplete; "
            "green line: fp16 with all methods on the bar's seeds"
        )
        axes.grid(True, axis="y", alpha=0.3)
    incomplete = "" if result["complete"] else "  [INCOMPLETE: see the json]"
    figure.suptitle(f"SAC fp32 vs fp16 at {result['scale']['tag']}{incomplete}")
    figure.tight_layout()
    figure.savefig(out_png)
