"""flax's MNIST example, as its authors wrote it, on data that needs no download: the fp32 program of a port.

Port of ``examples/mnist/train.py`` and ``configs/default.py`` of google/flax (commit 0ef9abb, flax 0.12;
Copyright 2024 The Flax Authors, Apache License 2.0): an nnx CNN with ``BatchNorm`` and ``Dropout``, trained with
SGD and momentum through ``nnx.value_and_grad``, ``nnx.Optimizer`` and ``nnx.MultiMetric``. The model, the loss,
the train and eval steps, the optimizer and the hyper-parameters are flax's. What the port changed:

* the data: scikit-learn's bundled 8x8 digits (1,797 images, no download) resized to MNIST's 28x28, a fixed
  1,437/360 train/test split, instead of tensorflow_datasets' MNIST; the test set is evaluated in one batch;
* no TensorBoard writer and no SavedModel export; :func:`train_and_evaluate` takes a seed (flax's uses 0) and
  returns the per-epoch metrics, the model and the optimizer instead of logging the metrics.

flax's configuration trains 10 epochs of 468 MNIST batches; digits has 11 batches an epoch, and BatchNorm's running
averages (momentum 0.99: 1% of a batch's statistics per step) still hold a third of their initial values after
110 steps, so the benchmark (``benchmarks.port_cnn``) trains longer.

:mod:`experiments.ports` derives the fp16 programs from this file's text by replacing a few lines
(``experiments.ports.FLAX_MNIST``): that diff is all a user changes.
"""

from functools import partial

import jax
import ml_collections
import numpy as np
import optax
from flax import nnx


class CNN(nnx.Module):
    """A simple CNN model."""

    def __init__(self, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm1 = nnx.BatchNorm(32, rngs=rngs)
        self.dropout1 = nnx.Dropout(rate=0.025)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm2 = nnx.BatchNorm(64, rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
        self.dropout2 = nnx.Dropout(rate=0.025)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x, rngs: nnx.Rngs):
        x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x), rngs=rngs))))
        x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
        x = x.reshape(x.shape[0], -1)  # flatten
        x = nnx.relu(self.dropout2(self.linear1(x), rngs=rngs))
        x = self.linear2(x)
        return x


def loss_fn(model: CNN, batch, rngs):
    logits = model(batch["image"], rngs)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean()
    return loss, logits


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch, rngs):
    """Train for a single step."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, batch, rngs)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.
    optimizer.update(model, grads)  # In-place updates.


@nnx.jit
def eval_step(model: CNN, metrics: nnx.MultiMetric, batch):
    loss, logits = loss_fn(model, batch, None)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])  # In-place updates.


def load_digits(size: int = 28, test_size: int = 360) -> tuple[dict, dict]:
    """scikit-learn's 8x8 digits as MNIST-like ``size`` x ``size`` images in [0, 1] (bilinear), split once."""
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    images = np.asarray(
        jax.image.resize(digits.images[..., None] / 16.0, (len(digits.images), size, size, 1), "linear"), np.float32
    )
    order = np.random.default_rng(0).permutation(len(images))
    train, test = order[test_size:], order[:test_size]
    labels = digits.target.astype(np.int32)
    return {"image": images[train], "label": labels[train]}, {"image": images[test], "label": labels[test]}


def get_datasets(config: ml_collections.ConfigDict, seed: int) -> tuple[list[list[dict]], list[dict]]:
    """Shuffled train batches for every epoch (incomplete batches skipped) and the test set as one batch."""
    train, test = load_digits()
    rng = np.random.default_rng(seed)
    steps = len(train["label"]) // config.batch_size
    epochs = []
    for _ in range(config.num_epochs):
        order = rng.permutation(len(train["label"]))[: steps * config.batch_size].reshape(steps, config.batch_size)
        epochs.append([{k: v[idx] for k, v in train.items()} for idx in order])
    return epochs, [test]


def train_and_evaluate(config: ml_collections.ConfigDict, seed: int = 0) -> tuple[dict, CNN, nnx.Optimizer]:
    """Execute model training and evaluation loop; returns the metrics of every epoch, the model and optimizer."""
    train_ds, test_ds = get_datasets(config, seed)

    # Instantiate the model.
    model = CNN(rngs=nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, optax.sgd(config.learning_rate, config.momentum), wrt=nnx.Param)
    metrics = nnx.MultiMetric(
        accuracy=nnx.metrics.Accuracy(),
        loss=nnx.metrics.Average("loss"),
    )
    rngs = nnx.Rngs(seed)

    history: dict[str, list[float]] = {"train_loss": [], "train_accuracy": [], "test_loss": [], "test_accuracy": []}
    for epoch in range(config.num_epochs):
        model.train()  # Switch to train mode
        for batch in train_ds[epoch]:
            train_step(model, optimizer, metrics, batch, rngs)
        for name, value in metrics.compute().items():  # Compute the training metrics.
            history[f"train_{name}"].append(float(value))
        metrics.reset()  # Reset the metrics for the test set.

        model.eval()  # Switch to eval mode
        for batch in test_ds:
            eval_step(model, metrics, batch)
        for name, value in metrics.compute().items():
            history[f"test_{name}"].append(float(value))
        metrics.reset()  # Reset the metrics for the next training epoch.
    return history, model, optimizer


def get_config() -> ml_collections.ConfigDict:
    """Get the default hyperparameter configuration."""
    config = ml_collections.ConfigDict()
    config.learning_rate = 0.1
    config.momentum = 0.9
    config.batch_size = 128
    config.num_epochs = 10
    return config
