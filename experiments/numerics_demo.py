r"""Pure-fp16 training with and without lpjax's numerics, on a small regression problem.

A 2-layer tanh MLP (8 -> 64 -> 1) is fitted to a random 2-layer tanh "teacher" network with minibatch MSE.
In the fp16 variants *everything* is float16: data, parameters, activations, loss, gradients and optimizer
state. Four optimizers are compared at Adam's usual settings (lr 1e-4, b1 0.9, b2 0.999, eps 1e-8):

* ``adam_fp16``  naive ``optax.adam`` on float16 parameters. Its second moment ``v <- 0.999 v + 0.001 g^2`` is 0
  for every ``|g| < 5.5e-3`` (``0.001 g^2`` is below half of float16's smallest subnormal, 6e-8) and
  ``eps = 1e-8`` is 0 in float16 too, so the first update is ``m / 0 = inf`` and the parameters become inf/nan
  at step 1.
* ``hadam_fp16`` ``lpjax.optim.hadam`` alone: no ``g^2``, so the second moment is fine, but each update (about
  ``lr = 1e-4``) is at or below half an ulp of a weight of magnitude >= 0.25 (float16 keeps 11 significant bits),
  so many updates are rounded away and training is slower.
* ``lpjax_fp16`` the full lpjax chain, ``compound_loss_scaling(hadam(lr))`` then ``kahan_summation()``, with the
  gradients from ``lpjax.optim.scaled_value_and_grad``: loss scaling keeps small gradients (and the moments)
  representable, Kahan summation loses no update.
* ``adam_fp32`` the float32 ``optax.adam`` reference.

The loss curve of each run is the float32 MSE of its parameters on the whole training set after every step.

    python -m experiments.numerics_demo                 # 5000 steps, ~15 s on 2 CPU cores
    python -m experiments.numerics_demo --steps=1000 --output_dir=/tmp/demo

writes ``learning_curves.png`` and ``final_losses.json`` to ``--output_dir`` (default ``runs/numerics_demo/``).

The functions here (:func:`train`, :func:`run`, :func:`run_all`, :func:`plot_curves`) are imported by
``colab/01_numerics.ipynb`` and by ``tests/test_notebooks.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lpjax
from lpjax.methods import PrecisionMethods

OPTIMIZERS: dict[str, str] = {
    "adam_fp16": "naive fp16 Adam (optax.adam)",
    "hadam_fp16": "fp16 hAdam",
    "lpjax_fp16": "fp16 hAdam + loss scaling + Kahan (lpjax)",
    "adam_fp32": "fp32 Adam (reference)",
}
"""Variant name -> label. The suffix gives the dtype of the parameters, gradients and optimizer state."""

METHODS: dict[str, PrecisionMethods] = {
    "adam_fp16": PrecisionMethods(),
    "hadam_fp16": PrecisionMethods(hadam=True),
    "lpjax_fp16": PrecisionMethods(hadam=True, loss_scaling=True, kahan_gradients=True),
    "adam_fp32": PrecisionMethods(),
}
"""Variant name -> its methods, for :func:`lpjax.methods.method_optimizer` (all off: ``optax.adam``)."""

DEFAULT_STEPS = 5000
DEFAULT_LR = 1e-4  # The paper's Adam learning rate (Table 4).

IN_DIM, HIDDEN, TEACHER_HIDDEN = 8, 64, 32


class Problem(NamedTuple):
    """The regression data set, float32: inputs ``x`` of shape ``(n, IN_DIM)`` and targets ``y`` of shape ``(n, 1)``."""

    x: jax.Array
    y: jax.Array


class TrainResult(NamedTuple):
    """Outcome of :func:`run`.

    Attributes:
      losses: float64 array ``(steps,)``, float32 full-data MSE after each step (nan once the run diverged).
      params: final parameters (in the variant's dtype).
      opt_state: final optimizer state.
      seconds: wall time of the run, compilation included.
    """

    losses: np.ndarray
    params: Any
    opt_state: Any
    seconds: float


def make_problem(seed: int, n: int = 2048, target_scale: float = 1.0) -> Problem:
    """Samples ``x ~ N(0, I)`` and ``y = target_scale * teacher(x)`` for a random 2-layer tanh teacher MLP."""
    kx, k1, k2 = jax.random.split(jax.random.PRNGKey(10_000 + seed), 3)
    x = jax.random.normal(kx, (n, IN_DIM), jnp.float32)
    w1 = jax.random.normal(k1, (IN_DIM, TEACHER_HIDDEN)) / math.sqrt(IN_DIM)
    w2 = jax.random.normal(k2, (TEACHER_HIDDEN, 1)) / math.sqrt(TEACHER_HIDDEN)
    return Problem(x, target_scale * (jnp.tanh(x @ w1) @ w2))


def init_params(key: jax.Array, dtype: Any, hidden: int = HIDDEN) -> dict[str, jax.Array]:
    """LeCun-normal weights and zero biases of the student MLP, cast to ``dtype``."""
    k1, k2 = jax.random.split(key)
    params = {
        "w1": jax.random.normal(k1, (IN_DIM, hidden)) / math.sqrt(IN_DIM),
        "b1": jnp.zeros((hidden,)),
        "w2": jax.random.normal(k2, (hidden, 1)) / math.sqrt(hidden),
        "b2": jnp.zeros((1,)),
    }
    return jax.tree.map(lambda p: p.astype(dtype), params)


def mlp(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """The student: ``tanh(x W1 + b1) W2 + b2``, computed in the dtype of the parameters."""
    x = x.astype(params["w1"].dtype)
    return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def mse(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error, in the dtype of the parameters."""
    return jnp.mean(jnp.square(mlp(params, x) - y.astype(params["w1"].dtype)))


def param_dtype(name: str) -> Any:
    """float32 for the ``*_fp32`` variants, float16 otherwise."""
    return jnp.float32 if name.endswith("_fp32") else jnp.float16


def make_optimizer(name: str, learning_rate: float = DEFAULT_LR) -> optax.GradientTransformation:
    """Builds the optimizer of variant ``name`` (a key of :data:`OPTIMIZERS`): the learners' factory,
    :func:`lpjax.methods.method_optimizer`, with the variant's :data:`METHODS` and Adam's b1 0.9, b2 0.999, eps 1e-8."""
    if name not in METHODS:
        raise ValueError(f"Unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}.")
    return lpjax.methods.method_optimizer(learning_rate, METHODS[name], b1=0.9, b2=0.999, eps=1e-8)


def _uses_loss_scaling(opt_state) -> bool:
    nodes = jax.tree.leaves(opt_state, is_leaf=lambda n: isinstance(n, lpjax.optim.CompoundLossScalingState))
    return any(isinstance(n, lpjax.optim.CompoundLossScalingState) for n in nodes)


def run(
    name: str,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    learning_rate: float = DEFAULT_LR,
    batch_size: int = 256,
    target_scale: float = 1.0,
    chunk: int = 500,
    progress: Callable[[int], Any] | None = None,
) -> TrainResult:
    """Trains variant ``name`` for ``steps`` minibatch steps; the data, init and batches depend only on ``seed``.

    The steps run in jitted ``lax.scan`` chunks of ``chunk`` steps; ``progress(n)`` is called after each chunk
    with its number of steps (e.g. ``tqdm.update``).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    dtype = param_dtype(name)
    problem = make_problem(seed, target_scale=target_scale)
    init_key, data_key = jax.random.split(jax.random.PRNGKey(seed))
    params = init_params(init_key, dtype)
    optimizer = make_optimizer(name, learning_rate)
    opt_state = optimizer.init(params)

    def step(carry, key):
        params, opt_state = carry
        idx = jax.random.randint(key, (batch_size,), 0, problem.x.shape[0])
        # The float16 loss times the loss scale (1 without a scaler), multiplied in float32.
        _, grads = lpjax.optim.scaled_value_and_grad(mse)(opt_state, params, problem.x[idx], problem.y[idx])
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        full_loss = mse(jax.tree.map(lambda p: p.astype(jnp.float32), params), problem.x, problem.y)
        return (params, opt_state), full_loss

    @jax.jit
    def run_chunk(carry, keys):
        return jax.lax.scan(step, carry, keys)

    start = time.perf_counter()
    keys = jax.random.split(data_key, steps)
    carry, losses = (params, opt_state), []
    for begin in range(0, steps, chunk):
        carry, chunk_losses = run_chunk(carry, keys[begin : begin + chunk])
        losses.append(np.asarray(chunk_losses, np.float64))
        if progress is not None:
            progress(len(chunk_losses))
    params, opt_state = carry
    return TrainResult(np.concatenate(losses), params, opt_state, time.perf_counter() - start)


def train(optimizer_name: str, steps: int = DEFAULT_STEPS, seed: int = 0, **kwargs) -> np.ndarray:
    """Trains one variant and returns its learning curve (see :func:`run` for the keyword arguments)."""
    return run(optimizer_name, steps, seed, **kwargs).losses


def first_nonfinite(losses: np.ndarray) -> int | None:
    """1-based index of the first step after which the loss is nan or inf, or None."""
    bad = np.flatnonzero(~np.isfinite(losses))
    return int(bad[0]) + 1 if bad.size else None


def run_all(
    names: Sequence[str] = tuple(OPTIMIZERS),
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    show_progress: bool = True,
    **kwargs,
) -> dict[str, TrainResult]:
    """Runs every variant in ``names`` with the same data, init and batches; shows a tqdm bar over all steps."""
    from tqdm import tqdm

    results = {}
    with tqdm(total=steps * len(names), unit="step", disable=not show_progress, dynamic_ncols=True) as bar:
        for name in names:
            bar.set_description(name)
            results[name] = run(name, steps, seed, progress=bar.update, **kwargs)
    return results


def summary(results: dict[str, TrainResult]) -> dict[str, Any]:
    """JSON-ready summary: final and best loss, first non-finite step, ratio to fp32, loss-scaler state."""
    reference = results["adam_fp32"].losses[-1] if "adam_fp32" in results else None
    out = {}
    for name, result in results.items():
        final = float(result.losses[-1])
        finite = result.losses[np.isfinite(result.losses)]
        entry = {
            "label": OPTIMIZERS.get(name, name),
            "final_loss": final if math.isfinite(final) else None,
            "min_loss": float(finite.min()) if finite.size else None,
            "first_nonfinite_step": first_nonfinite(result.losses),
            "ratio_to_fp32": (
                final / reference if reference and math.isfinite(final) and name != "adam_fp32" else None
            ),
            "seconds": round(result.seconds, 2),
        }
        if _uses_loss_scaling(result.opt_state):
            scaler = next(
                n
                for n in jax.tree.leaves(
                    result.opt_state, is_leaf=lambda n: isinstance(n, lpjax.optim.CompoundLossScalingState)
                )
                if isinstance(n, lpjax.optim.CompoundLossScalingState)
            )
            entry["final_loss_scale"] = float(scaler.scale)
            entry["skipped_steps"] = int(scaler.skipped_steps)
        out[name] = entry
    return out


def format_table(summary_: dict[str, Any]) -> str:
    """The final-loss table printed by :func:`main`."""
    rows = [("variant", "final loss", "best loss", "x fp32", "first nan/inf step")]
    for name, entry in summary_.items():
        fmt = lambda v: "nan" if v is None else f"{v:.3e}"
        ratio = entry["ratio_to_fp32"]
        rows.append(
            (
                name,
                fmt(entry["final_loss"]),
                fmt(entry["min_loss"]),
                "-" if ratio is None else f"{ratio:.2f}",
                "-" if entry["first_nonfinite_step"] is None else str(entry["first_nonfinite_step"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def plot_curves(results: dict[str, TrainResult], ax=None, title: str | None = None):
    """Draws the learning curves (log scale) on ``ax`` (a new figure if None) and returns the axes.

    A run that diverged is marked with a cross at the step where its loss became non-finite.
    """
    if ax is None:
        from matplotlib.figure import Figure

        ax = Figure(figsize=(7, 4.2), layout="constrained").subplots()
    styles = {
        "adam_fp16": ("tab:red", "-"),
        "hadam_fp16": ("tab:orange", "-"),
        "lpjax_fp16": ("tab:green", "-"),
        "adam_fp32": ("black", "--"),
    }
    top = max(
        (np.nanmax(r.losses[np.isfinite(r.losses)]) for r in results.values() if np.isfinite(r.losses).any()),
        default=1.0,
    )
    diverged = 0
    for name, result in results.items():
        color, style = styles.get(name, (None, "-"))
        steps = np.arange(1, len(result.losses) + 1)
        losses = np.where(np.isfinite(result.losses), result.losses, np.nan)
        label = OPTIMIZERS.get(name, name)
        bad = first_nonfinite(result.losses)
        if bad is not None:
            label += f" (nan/inf at step {bad})"
            y = top * 0.7**diverged  # Staggered, so that runs diverging at the same step stay visible.
            ax.plot([bad], [y], marker="x", markersize=9, mew=2.5, color=color, linestyle="none")
            ax.annotate(
                f"{name}: nan at step {bad}",
                (bad, y),
                xytext=(8, -3),
                textcoords="offset points",
                color=color,
                fontsize=8,
            )
            diverged += 1
        ax.plot(steps, losses, style, color=color, label=label, lw=1.4)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("full-data MSE (float32 eval)")
    ax.set_title(title or "2-layer MLP regression, params/grads/optimizer state in float16")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.numerics_demo",
        description="Train a 2-layer MLP regression entirely in float16 with naive optax.adam, lpjax hAdam, and "
        "the full lpjax chain (compound loss scaling + hAdam + Kahan summation), against a float32 "
        "Adam reference. Prints a table of final losses and writes learning_curves.png and "
        "final_losses.json to --output_dir.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training steps per variant")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data, the init and the minibatches")
    parser.add_argument("--learning_rate", "--lr", type=float, default=DEFAULT_LR, help="Adam/hAdam learning rate")
    parser.add_argument("--batch_size", type=int, default=256, help="minibatch size")
    parser.add_argument(
        "--target_scale",
        type=float,
        default=1.0,
        help="multiplier of the regression targets (small values make gradients underflow)",
    )
    parser.add_argument(
        "--optimizers", default=",".join(OPTIMIZERS), help=f"comma-separated variants, from: {', '.join(OPTIMIZERS)}"
    )
    parser.add_argument(
        "--output_dir",
        default=os.path.join("runs", "numerics_demo"),
        help="where learning_curves.png and final_losses.json are written",
    )
    parser.add_argument("--no_progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)
    args.optimizers = [n.strip() for n in args.optimizers.split(",") if n.strip()]
    unknown = [n for n in args.optimizers if n not in OPTIMIZERS]
    if unknown or not args.optimizers:
        parser.error(f"unknown --optimizers {unknown}; choose from {', '.join(OPTIMIZERS)}")
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point; returns the summary written to ``final_losses.json``."""
    args = _parse_args(argv)
    print(
        f"jax {jax.__version__} on {jax.default_backend()}; {args.steps} steps, lr {args.learning_rate:g}, "
        f"seed {args.seed}",
        flush=True,
    )
    results = run_all(
        args.optimizers,
        steps=args.steps,
        seed=args.seed,
        learning_rate=args.learning_rate,
        batch_size=args.batch_size,
        target_scale=args.target_scale,
        show_progress=not args.no_progress,
    )
    table = summary(results)
    print(format_table(table))

    os.makedirs(args.output_dir, exist_ok=True)
    png = os.path.join(args.output_dir, "learning_curves.png")
    ax = plot_curves(results, title=f"float16 MLP regression, lr {args.learning_rate:g}, seed {args.seed}")
    ax.figure.savefig(png, dpi=120)
    config = {k: v for k, v in vars(args).items() if k not in ("output_dir", "no_progress")}
    record = {"config": config, "jax_version": jax.__version__, "results": table}
    path = os.path.join(args.output_dir, "final_losses.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    print(f"wrote {png} and {path}")
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
