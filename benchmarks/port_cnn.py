"""flax's MNIST CNN made fp16 with lpjax (experiments/ports/flax_mnist.py: nnx, BatchNorm, Dropout, SGD with
momentum) on scikit-learn's digits: fp32, naive fp16 and lpjax fp16 side by side, with an ablation.

    python -m benchmarks.port_cnn                # 30 epochs (330 steps), seeds 0-2
    python -m benchmarks.port_cnn --quick        # a smoke run: 1 epoch, seed 0, the three main variants

The variants are the fp32 program with a few lines replaced (:mod:`experiments.ports`); their diffs are in the
json. The metric is flax's test accuracy (``NOTES``); the same model evaluated with the test batch's own
statistics says whether a gap is in the trained weights or in BatchNorm's running averages. Needs scikit-learn
(the ``examples`` extra).
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

import lpjax
from benchmarks import common
from benchmarks.common import figure, port_finish, port_parser
from experiments import ports

RESULT_NAME = "port_cnn"
MODULE = "experiments.ports.flax_mnist"

_IMPORT = ("from flax import nnx", "from flax import nnx\nimport lpjax")
_MODEL = "model = CNN(rngs=nnx.Rngs(seed))"
_LPJAX_EDITS = (
    (
        "optimizer = nnx.Optimizer(model, optax.sgd(config.learning_rate, config.momentum), wrt=nnx.Param)",
        "tx = lpjax.optim.compound_loss_scaling(optax.sgd(config.learning_rate, config.momentum))\n"
        "optimizer = nnx.Optimizer(model, optax.chain(tx, lpjax.optim.kahan_summation()), wrt=nnx.Param)",
    ),
    (
        "grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)",
        "grad_fn = lpjax.optim.scaled_value_and_grad(loss_fn, has_aux=True)",
    ),
    (
        "(loss, logits), grads = grad_fn(model, batch, rngs)",
        "(loss, logits), grads = grad_fn(optimizer, model, batch, rngs)",
    ),
)


def _model(policy_args: str) -> tuple[str, str]:
    """The edit that puts flax's CNN under ``set_policy(..., policy_args)``."""
    return _MODEL, f"model = lpjax.precision.set_policy(CNN(rngs=nnx.Rngs(seed)), {policy_args})"


VARIANTS = {
    "fp32": ports.Variant("fp32", description="flax's program as written"),
    "fp16_naive": ports.Variant(
        "fp16_naive",
        (_IMPORT, _model('"fp16", keep_float32=()')),
        "everything in float16, BatchNorm included (its running statistics stay float32, as flax computes them), "
        "flax's SGD and nnx.value_and_grad",
    ),
    "fp16_lpjax": ports.Variant(
        "fp16_lpjax",
        (_IMPORT, _model('"fp16"'), *_LPJAX_EDITS),
        "set_policy (BatchNorm in float32), SGD inside compound_loss_scaling, Kahan-summed "
        "updates, gradients of the scaled loss",
    ),
    "fp16_lpjax_norms16": ports.Variant(
        "fp16_lpjax_norms16",
        (_IMPORT, _model('"fp16", keep_float32=()'), *_LPJAX_EDITS),
        "ablation: fp16_lpjax with BatchNorm in float16 too (as in fp16_naive)",
    ),
}
MAIN_VARIANTS = ("fp32", "fp16_naive", "fp16_lpjax")
NOTES = [
    "test_accuracy: flax's eval (model.eval(): dropout off, BatchNorm normalizing by its running averages) "
    "on the 360 held-out digits after the last epoch; test_accuracy_batch_statistics: the same weights "
    "with BatchNorm normalizing by the test batch's own mean and variance. over_baseline divides by fp32's "
    "accuracy on the same seed.",
    "Seed k: the model's initialization, dropout and the order of the batches (the train/test split is "
    "fixed). The images are digits' 8x8 resized to 28x28, the input size of flax's CNN.",
]


def batch_statistics_accuracy(model, images: np.ndarray, labels: np.ndarray) -> float:
    """Test accuracy with every BatchNorm normalizing by the test batch's own statistics (dropout off); the model is
    left in eval mode with its running averages moved by the test batch."""
    model.eval()
    model.set_attributes(nnx.BatchNorm, use_running_average=False)
    logits = model(jnp.asarray(images), None)
    model.set_attributes(nnx.BatchNorm, use_running_average=True)
    return float(jnp.mean(jnp.argmax(logits, axis=-1) == jnp.asarray(labels)))


def run(variant: str, seed: int, epochs: int) -> dict:
    """Trains ``variant`` for ``epochs`` from ``seed``; returns its record."""
    module = ports.load(MODULE, VARIANTS[variant])
    config = module.get_config()
    config.num_epochs = epochs
    start = time.perf_counter()
    history, model, optimizer = module.train_and_evaluate(config, seed)
    seconds = time.perf_counter() - start
    _, test = module.load_digits()
    return {
        "test_accuracy": history["test_accuracy"][-1],
        "test_accuracy_batch_statistics": batch_statistics_accuracy(model, test["image"], test["label"]),
        "train_loss": history["train_loss"][-1],
        "skipped_steps": int(lpjax.optim.skipped_steps(optimizer)),
        "final_loss_scale": float(lpjax.optim.loss_scale_or_one(optimizer)),
        "history": {name: [round(v, 4) for v in values] for name, values in history.items()},
        "seconds_with_compilation": round(seconds, 1),
    }


def plot(result: dict, path: pathlib.Path) -> None:
    names = list(result["results"])
    with figure(path, 1, 2, dpi=110, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]}) as (_, (curves, bars)):
        for name in names:
            accuracy = np.asarray([run["history"]["test_accuracy"] for run in result["results"][name]])
            epochs = np.arange(1, accuracy.shape[1] + 1)
            (line,) = curves.plot(epochs, accuracy.mean(axis=0), label=name)
            curves.fill_between(epochs, accuracy.min(axis=0), accuracy.max(axis=0), color=line.get_color(), alpha=0.15)
        curves.set_title(f"flax MNIST CNN on digits: test accuracy ({len(result['config']['seeds'])} seeds)")
        curves.set(xlabel="epoch", ylabel="test accuracy (BatchNorm running averages)", ylim=(0.0, 1.0))
        curves.legend(loc="lower right")
        x = np.arange(len(names))
        for offset, key, label in (
            (-0.2, "test_accuracy", "running averages (flax's eval)"),
            (0.2, "test_accuracy_batch_statistics", "the test batch's statistics"),
        ):
            values = [[run[key] for run in result["results"][name]] for name in names]
            bars.bar(x + offset, [np.mean(v) for v in values], width=0.4, label=label, alpha=0.8)
            for i, v in enumerate(values):
                bars.plot([x[i] + offset] * len(v), v, "k.", markersize=4)
        bars.set_xticks(x, names, rotation=20, fontsize=8)
        bars.set(ylim=(0.8, 1.0), title="final test accuracy by BatchNorm statistics")
        bars.legend(loc="lower right", fontsize=8)


def format_table(result: dict) -> str:
    rows = []
    for name, row in result["summary"]["test_accuracy"].items():
        runs = result["results"][name]
        rows.append([name, ", ".join(f"{v:.3f}" for v in row["per_seed"]), row["mean"], row["over_baseline_of_means"]])
        rows[-1] += [np.mean([run["test_accuracy_batch_statistics"] for run in runs])]
        rows[-1] += [sum(run["skipped_steps"] for run in runs)]
    header = ["variant", "test acc per seed", "mean", "over fp32", "batch-stat acc", "skip"]
    return "\n".join(common.format_table(header, rows, ["<19", "<24", ">6.3f", ">9.3f", ">15.3f", ">5d"]))


def main(argv: Sequence[str] | None = None) -> dict:
    cli = port_parser(RESULT_NAME, __doc__, VARIANTS, quick="1 epoch, seed 0, fp32/fp16_naive/fp16_lpjax")
    cli.add_argument("--epochs", type=int, default=30, help="epochs of 11 batches of 128 (flax's config: 10)")
    args = ports.parse_args(cli, argv)
    if args.quick:
        args.variants, args.seeds, args.epochs = list(MAIN_VARIANTS), [0], 1
    results = {name: [run(name, seed, args.epochs) for seed in args.seeds] for name in args.variants}
    config = {"seeds": args.seeds, "epochs": args.epochs, "quick": args.quick}
    summary = {
        key: ports.over_baseline({name: [run[key] for run in runs] for name, runs in results.items()})
        for key in ("test_accuracy", "test_accuracy_batch_statistics")
    }
    return port_finish(args, argv, MODULE, VARIANTS, config, results, summary, NOTES, format_table, plot)


if __name__ == "__main__":
    main()
