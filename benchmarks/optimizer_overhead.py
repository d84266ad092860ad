"""Cost of one optimizer step: lpjax's pure-fp16 optimizer against ``optax.adam``, in float32 and float16.

The target: the learners' optimizer, ``chain(compound_loss_scaling(hadam(1e-4)), kahan_summation())``
(:func:`lpjax.methods.method_optimizer` of :data:`FULL_METHODS`), costs at most ``TARGET_RATIO`` times
``optax.adam(1e-4)`` in the same dtype on a ~3.2M-parameter MLP. A step is ``tx.update`` and
``optax.apply_updates`` under one ``jax.jit``, parameters and state donated, on the same runtime random gradients
for every variant of a dtype (:func:`random_grads`). Timed in interleaved rounds of ``--steps`` steps; recorded
beside the times: the optimizer state's bytes, XLA's scratch memory, minor page faults per step, and the memory
traffic of the compiled step by pass (:mod:`benchmarks.hlo_traffic`), which with ``--ablations`` (the chain's parts
timed too) says which pass costs what. XLA:CPU emulates float16: only ratios within a dtype matter.
"""

from __future__ import annotations

import dataclasses
import functools
import resource
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lpjax
from benchmarks import common, hlo_traffic
from benchmarks.timing import interleaved, summary
from lpjax.methods import PrecisionMethods
from lpjax.optim import UnscaledLossWarning

TARGET_RATIO = 1.5
LEARNING_RATE = 1e-4
GRAD_MAGNITUDE = 1e-3
LOSS_SCALE = 1e4  # compound_loss_scaling's default init_scale (paper, Table 5).
GRAD_SCALED = GRAD_MAGNITUDE * LOSS_SCALE  # magnitude of the gradients every variant receives (module docstring)
BASELINE = "optax.adam"
FULL_CHAIN = "lpjax.chain"
DTYPES = ("float32", "float16")
RESULT_NAME = "optimizer_overhead"
GRAD_NOTE = (
    "every variant gets the same gradients, +-1e-3 * loss_scale * 10**U(-1, 1) (loss-scaled "
    "magnitude; at 1e-3 unscaled, float16 optax.adam is not finite: (1-b2) g^2 rounds to 0)"
)
TIMING_NOTE = (
    "median/min over rounds of (wall time of `steps` jitted steps incl. dispatch, "
    "block_until_ready at the end) / steps; params and opt state donated"
)
BYTES_BOUND = 10 / 7
"""The chain's bytes over Adam's with one pass per tree (multi-output fusion): Adam reads g, m, v, p and writes m,
v, p (7 trees); the chain also reads g once more for the finite check and reads and writes the Kahan buffer (10)."""
# what each output of a step is, by its key path in the state; the traffic panel's stacking order
_STATE_KINDS = ((".mu", "first moment"), (".nu", "second moment"), (".compensation", "Kahan compensation"))
_TRAFFIC_KINDS = ("parameters", "first moment", "second moment", "Kahan compensation", "temporary", "reduction", "copy")


class Variant(NamedTuple):
    name: str
    description: str
    make: Callable[[], optax.GradientTransformation]


FULL_METHODS = PrecisionMethods(hadam=True, loss_scaling=True, kahan_gradients=True, init_scale=LOSS_SCALE)


def _chain(**off: bool) -> Callable[[], optax.GradientTransformation]:
    """The full chain less the switches ``off``."""
    return functools.partial(lpjax.methods.method_optimizer, LEARNING_RATE, dataclasses.replace(FULL_METHODS, **off))


_HADAM = functools.partial(lpjax.optim.hadam, LEARNING_RATE)
VARIANTS = (
    Variant(BASELINE, "optax.adam(1e-4)", functools.partial(optax.adam, LEARNING_RATE)),
    Variant("lpjax.hadam", "lpjax.optim.hadam(1e-4)", _HADAM),
    Variant(FULL_CHAIN, "chain(compound_loss_scaling(hadam(1e-4)), kahan_summation())", _chain()),
)
_NO_KAHAN, _NO_SCALING = _chain(kahan_gradients=False), _chain(loss_scaling=False)
ABLATIONS = (  # where the full chain's overhead comes from: the chain less one method
    Variant("ablation.cls(hadam)", "compound_loss_scaling(hadam(1e-4)) alone (no Kahan)", _NO_KAHAN),
    Variant("ablation.hadam+kahan", "chain(hadam(1e-4), kahan_summation()) (no loss scaling)", _NO_SCALING),
    Variant(
        "ablation.apply_if_finite(hadam)",
        "optax.apply_if_finite(hadam(1e-4)): optax's own skip-on-non-finite",
        lambda: optax.apply_if_finite(_HADAM(), max_consecutive_errors=10**9),
    ),
)


class Sizes(NamedTuple):
    in_dim: int
    width: int
    hidden_layers: int  # width x width layers
    out_dim: int


FULL_SIZES = Sizes(in_dim=64, width=1024, hidden_layers=3, out_dim=16)
QUICK_SIZES = Sizes(in_dim=8, width=32, hidden_layers=1, out_dim=4)


def mlp_params(key: jax.Array, sizes: Sizes, dtype: Any) -> dict:
    """Dense kernels and biases of an MLP ``in -> width -> (hidden_layers x width x width) -> out``."""
    dims = [sizes.in_dim] + [sizes.width] * (sizes.hidden_layers + 1) + [sizes.out_dim]
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])):
        key, k_w, k_b = jax.random.split(key, 3)
        kernel = jax.random.normal(k_w, (fan_in, fan_out), jnp.float32) / np.sqrt(fan_in)
        bias = 0.01 * jax.random.normal(k_b, (fan_out,), jnp.float32)
        params[f"dense_{i}"] = {"kernel": kernel.astype(dtype), "bias": bias.astype(dtype)}
    return params


def random_grads(key: jax.Array, params: dict) -> dict:
    """Runtime random gradients ``+-GRAD_SCALED * 10**U(-1, 1)``: gradients of ~1e-3 times the loss scale 1e4, as
    the chain receives them. Finite in float16, so the chain takes its finite-step path; unscaled (``|g| < ~5e-3``)
    float16 ``optax.adam``'s ``(1 - b2) g^2`` and ``eps`` round to 0 and its steps would not be finite."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, 2 * len(leaves))
    grads = []
    for k_sign, k_mag, p in zip(keys[::2], keys[1::2], leaves):
        sign = jnp.where(jax.random.bernoulli(k_sign, 0.5, p.shape), 1.0, -1.0)
        exponent = jax.random.uniform(k_mag, p.shape, jnp.float32, -1.0, 1.0)
        grads.append((GRAD_SCALED * sign * 10.0**exponent).astype(p.dtype))
    return jax.tree.unflatten(treedef, grads)


def tree_nbytes(tree: Any) -> int:
    return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


def make_step(tx: optax.GradientTransformation) -> Callable:
    """Jitted ``(params, opt_state, grads) -> (params, opt_state)``; params and state are donated. The gradients
    stand for already-scaled ones (:func:`random_grads`), so the loss scaler's unscaled-loss warning is silenced."""

    def step(params, opt_state, grads):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnscaledLossWarning)
            updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(step, donate_argnums=(0, 1))


def _output_labels(params: dict, opt_state: Any) -> list[str]:
    """What each output of a step ``(params, opt_state) -> (params, opt_state)`` is, in flattening order."""
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path((params, opt_state))[0]]
    kind = lambda path: next((name for key, name in _STATE_KINDS if key in path), "scalars")
    return ["parameters" if path.startswith("[0]") else kind(path) for path in paths]


class _Case:
    """One (variant, dtype) pair: its jitted step and its live (donated, replaced each step) buffers."""

    def __init__(self, variant: Variant, dtype: str, params: dict, grads: dict):
        self.variant, self.dtype = variant, dtype
        tx = variant.make()
        self.params = jax.tree.map(jnp.copy, params)  # own copies: donation invalidates the buffers passed in
        self.state, self.grads, self.step = tx.init(self.params), grads, make_step(tx)
        self.state_bytes, self.param_bytes = tree_nbytes(self.state), tree_nbytes(self.params)
        compiled = self.step.lower(self.params, self.state, self.grads).compile()  # jit's cache serves the calls
        memory = compiled.memory_analysis()
        self.temp_bytes = None if memory is None else int(memory.temp_size_in_bytes)
        self.traffic = hlo_traffic.summary(compiled.as_text(), self.param_bytes)
        by_output = hlo_traffic.by_output(compiled.as_text(), _output_labels(self.params, self.state), self.param_bytes)
        self.traffic["by_output"] = {k: v for k, v in by_output.items() if v["read_trees"] + v["written_trees"] >= 0.01}
        self.faults_per_step: list[float] = []

    def run(self, steps: int) -> None:
        """Runs ``steps`` steps (blocked on), recording the minor page faults per step."""
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(steps):
            self.params, self.state = self.step(self.params, self.state, self.grads)
        jax.block_until_ready((self.params, self.state))
        self.faults_per_step.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps)

    def row(self, times_ms: list[float]) -> dict:
        """The json row, given each round's ms per step; ``params_finite`` and ``skipped_steps`` check the path."""
        row = dict(variant=self.variant.name, description=self.variant.description, dtype=self.dtype)
        row.update({f"{stat}_ms": value for stat, value in summary(times_ms).items()}, repeats_ms=times_ms)
        row.update(opt_state_bytes=self.state_bytes, param_bytes=self.param_bytes)
        row.update(opt_state_over_param_bytes=self.state_bytes / self.param_bytes, xla_temp_bytes=self.temp_bytes)
        row.update(minor_page_faults_per_step=summary(self.faults_per_step)["median"])
        row.update(xla_temp_trees=(self.temp_bytes or 0) / self.param_bytes, traffic=self.traffic)
        row["params_finite"] = all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(self.params))
        is_scaler = lambda n: isinstance(n, lpjax.optim.CompoundLossScalingState)
        scalers = [n for n in jax.tree.leaves(self.state, is_leaf=is_scaler) if is_scaler(n)]
        if scalers:
            row.update(skipped_steps=int(scalers[0].skipped_steps), final_loss_scale=float(scalers[0].scale))
        return row


def run_benchmark(
    sizes: Sizes, steps: int, repeats: int, warmup: int, variants: Sequence[Variant], seed: int = 0, log=print
) -> dict:
    """Times every (variant, dtype) pair, interleaved; returns the results as a json-able dict."""
    k_params, k_grads = jax.random.split(jax.random.PRNGKey(seed))
    params_by_dtype = {dtype: mlp_params(k_params, sizes, dtype) for dtype in DTYPES}
    leaves = jax.tree.leaves(params_by_dtype[DTYPES[0]])
    param_count = int(sum(x.size for x in leaves))
    param_bytes = {dtype: tree_nbytes(params) for dtype, params in params_by_dtype.items()}
    in_mib = ", ".join(f"{d}: {b / 2**20:.2f} MiB" for d, b in param_bytes.items())
    log(f"parameters: {param_count:,} in {len(leaves)} arrays ({in_mib}); compiling ...")
    grads = {dtype: random_grads(k_grads, params) for dtype, params in params_by_dtype.items()}
    cases = [_Case(variant, d, params, grads[d]) for d, params in params_by_dtype.items() for variant in variants]
    for case in cases:
        case.run(warmup)
        case.faults_per_step.clear()
    log(f"timing: {repeats} rounds x {steps} steps per (variant, dtype), order rotated every round")
    timing = interleaved({(c.variant.name, c.dtype): functools.partial(c.run, steps) for c in cases}, repeats, warmup=0)
    rows = [c.row([1e3 * t / steps for t in timing[(c.variant.name, c.dtype)]["rounds_s"]]) for c in cases]
    ratios: dict[str, dict[str, dict[str, float]]] = {dtype: {} for dtype in DTYPES}
    by_key = _by_key(rows)
    for row in rows:
        base = by_key[(BASELINE, row["dtype"])]
        ratio = dict(median=row["median_ms"] / base["median_ms"], min=row["min_ms"] / base["min_ms"])
        ratio["traffic"] = row["traffic"]["traffic_trees"] / base["traffic"]["traffic_trees"]
        row.update(zip(("ratio_to_adam_median", "ratio_to_adam_min", "traffic_ratio_to_adam"), ratio.values()))
        ratios[row["dtype"]][row["variant"]] = ratio
    target_met = {dtype: bool(r[FULL_CHAIN]["median"] <= TARGET_RATIO) for dtype, r in ratios.items()}
    load = {f"loadavg_1_5_15_{when}": timing["machine"][f"load_{when}"] for when in ("before", "after")}
    config = dict(sizes=sizes._asdict(), steps=steps, repeats=repeats, warmup_steps=warmup, seed=seed)
    config.update(learning_rate=LEARNING_RATE, grad_magnitude=GRAD_SCALED, grad_note=GRAD_NOTE, loss_scale=LOSS_SCALE)
    config["timing"] = TIMING_NOTE
    result = dict(benchmark=RESULT_NAME, timestamp_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    result.update(jax_version=jax.__version__, jaxlib_version=getattr(jax.lib, "__version__", None))
    result.update(optax_version=optax.__version__, lpjax_version=lpjax.__version__)
    result.update(machine=common.machine_info() | load, config=config, param_count=param_count)
    result.update(param_bytes=param_bytes, baseline=BASELINE, full_chain=FULL_CHAIN, target_ratio=TARGET_RATIO)
    result.update(target_met=target_met, ratios_to_adam=ratios, results=rows)
    result["analysis"] = analysis(result)
    return result


def _by_key(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(row["variant"], row["dtype"]): row for row in rows}


def _trees(row: dict, kind: str) -> float:
    """Parameter-sized trees read and written per step by the passes writing ``kind``."""
    entry = row["traffic"]["by_output"].get(kind, {})
    return entry.get("read_trees", 0.0) + entry.get("written_trees", 0.0)


def analysis(result: dict) -> dict:
    """Where the full chain's cost over optax.adam comes from, per dtype: time ablations and traffic by pass."""
    out = {"bytes_bound_with_multi_output_fusion": BYTES_BOUND}
    rows = _by_key(result["results"])
    for dtype in result["param_bytes"]:
        adam, chain = rows[(BASELINE, dtype)], rows[(FULL_CHAIN, dtype)]
        kinds = sorted(set(adam["traffic"]["by_output"]) | set(chain["traffic"]["by_output"]))
        extra = {kind: _trees(chain, kind) - _trees(adam, kind) for kind in kinds}
        entry = dict(time_ratio=chain["ratio_to_adam_median"], traffic_ratio=chain["traffic_ratio_to_adam"])
        for name, row in (("adam", adam), ("chain", chain)):
            entry[f"traffic_trees_{name}"] = row["traffic"]["traffic_trees"]
        entry["extra_traffic_trees_by_pass"] = {kind: trees for kind, trees in extra.items() if abs(trees) >= 0.01}
        entry["xla_temp_trees"] = chain["xla_temp_trees"]
        for variant, part in (("ablation.cls(hadam)", "loss_scaling"), ("ablation.hadam+kahan", "kahan")):
            if (variant, dtype) in rows:
                entry[f"time_ratio_{part}_alone"] = rows[(variant, dtype)]["ratio_to_adam_median"]
        out[dtype] = entry
    out["explanation"] = (
        "XLA:CPU compiles one loop per output (no multi-output fusion), so each output re-reads what it needs. "
        "optax.adam: the two moments (2 reads, 1 write each) and the parameters (3 reads, 1 write). hAdam does the "
        "same: its direction reads the moments back from the state it writes. Loss scaling adds the finite check, "
        "one sum over the gradients (in float16 XLA:CPU first converts them to float32 in a separate pass and "
        "keeps that as a temporary). Kahan summation adds the compensation buffer: its two in-place outputs (c' "
        "and p + d) both need the old p and y = u + c, so y is one temporary tree (written once, read twice), "
        "c' reads y, p and c (c to leave it unchanged on a zero update), and the parameters' loop reads c' as "
        "well. With multi-output fusion (GPU, TPU) the same program is one pass per tree: about "
        f"{BYTES_BOUND:.2f}x Adam's bytes."
    )
    return out


def format_table(result: dict) -> str:
    header = ["variant", "dtype", "median ms", "min ms", "x adam", "state/params", "XLA temp MiB", "faults/step"]
    cells = ["variant", "dtype", "median_ms", "min_ms", "ratio_to_adam_median", "opt_state_over_param_bytes"]
    rows = [
        [row[c] for c in cells]
        + [(row["xla_temp_bytes"] or 0) / 2**20, row["minor_page_faults_per_step"]]
        + [row["traffic"]["traffic_trees"], row["traffic"]["copies"]]
        for row in result["results"]
    ]
    formats = ["<34", "<8", ">10.3f", ">9.3f", ">7.2f", ">12.3f", ">12.2f", ">11.0f", ">15.2f", ">6d"]
    lines = common.format_table(header + ["traffic (trees)", "copies"], rows, formats, rule=True) + [""]
    for dtype, met in result["target_met"].items():
        ratio = result["ratios_to_adam"][dtype][FULL_CHAIN]["median"]
        verdict = f"{ratio:.2f}x -> {'MET' if met else 'MISSED'}"
        lines.append(f"target {FULL_CHAIN} <= {result['target_ratio']}x {BASELINE} in {dtype}: {verdict}")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    dtypes = list(result["param_bytes"])
    variants = list(dict.fromkeys(row["variant"] for row in result["results"]))
    by_key = _by_key(result["results"])
    width, x = 0.8 / len(variants), np.arange(len(dtypes))
    with common.figure(path, 1, 2, figsize=(16.0, 5.5), width_ratios=[1.1, 1.0]) as (_, (ax, traffic_ax)):
        for i, variant in enumerate(variants):
            rows = [by_key[(variant, d)] for d in dtypes]
            med, lo, hi = (np.array([r[f"{stat}_ms"] for r in rows]) for stat in ("median", "min", "max"))
            bars = ax.bar(x - 0.4 + width * (i + 0.5), med, width, yerr=[med - lo, hi - med], capsize=3, label=variant)
            for bar, row in zip(bars, rows):  # ratio to optax.adam above the error bar
                top = (bar.get_x() + bar.get_width() / 2, row["max_ms"])
                label = f"{row['ratio_to_adam_median']:.2f}x"
                ax.annotate(label, top, xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=7)
        target = TARGET_RATIO * np.array([by_key[(BASELINE, dtype)]["median_ms"] for dtype in dtypes])
        label = f"target: {TARGET_RATIO}x {BASELINE}"
        ax.hlines(target, x - 0.42, x + 0.42, colors="k", linestyles="dashed", linewidth=1, label=label)
        ax.set_xticks(x, dtypes)
        ax.set_ylabel("ms per optimizer step (median; bars: min..max)")
        title = f"One optimizer step (update + apply_updates), {result['param_count'] / 1e6:.2f}M params, jax "
        title += f"{result['jax_version']}, {result['machine']['cpu_count']} CPU cores\nlabels: median ratio to "
        ax.set_title(title + f"{BASELINE} in the same dtype", fontsize=9)
        ax.legend(fontsize=8, loc="upper right")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
        _plot_traffic(traffic_ax, [(variant, dtype) for dtype in dtypes for variant in variants], by_key)


def _plot_traffic(ax, keys: list[tuple[str, str]], by_key: dict) -> None:
    """Stacked bars: bytes read and written per step, by what the pass writes, in parameter-sized trees."""
    positions, bottoms = np.arange(len(keys)), np.zeros(len(keys))
    for kind in _TRAFFIC_KINDS:
        heights = np.array([_trees(by_key[key], kind) for key in keys])
        if heights.any():
            ax.bar(positions, heights, 0.7, bottom=bottoms, label=kind)
            bottoms += heights
    ax.set_xticks(positions, [f"{variant}\n{dtype}" for variant, dtype in keys], rotation=60, ha="right", fontsize=7)
    ax.set(ylabel="trees read + written per step (one tree = the parameters' bytes)", ylim=(0, ax.get_ylim()[1] * 1.3))
    title = "Memory traffic of the compiled step, by what each pass writes (from the optimized HLO;\n"
    ax.set_title(title + "bodies of conditionals not counted)", fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper left")


def main(argv: Sequence[str] | None = None) -> dict:
    cli = common.parser(RESULT_NAME, __doc__, quick="tiny MLP and few steps: a smoke test, not a measurement")
    cli.add_argument("--steps", type=int, default=20, help="steps per timed round (default 20; quick: 2)")
    cli.add_argument("--repeats", type=int, default=21, help="timed rounds per variant (default 21; quick: 2)")
    cli.add_argument("--warmup", type=int, default=3, help="warm-up steps after compiling (default 3; quick: 1)")
    cli.add_argument("--ablations", action="store_true", help="also time the chain's parts")
    cli.add_argument("--seed", type=int, default=0)
    if cli.parse_args(argv).quick:
        cli.set_defaults(steps=2, repeats=2, warmup=1)
    args = cli.parse_args(argv)
    if min(args.steps, args.repeats, args.warmup) < 1:
        cli.error("--steps, --repeats and --warmup must be >= 1")
    variants = VARIANTS + (ABLATIONS if args.ablations else ())
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    result = run_benchmark(sizes, args.steps, args.repeats, args.warmup, variants, seed=args.seed)
    result["config"].update(quick=bool(args.quick), ablations=bool(args.ablations))
    result["command"] = common.command_line("benchmarks.optimizer_overhead", argv)
    return common.finish(args, result, format_table(result), plot)


if __name__ == "__main__":
    main(sys.argv[1:])
