"""benchmarks/port_cnn.py: flax's MNIST CNN (nnx, BatchNorm, Dropout) made fp16 by at most six changed lines; a
one-epoch run of the three main variants (the full 3-seed run is the benchmark command)."""

import numpy as np
import pytest

pytest.importorskip("sklearn")

from benchmarks import port_cnn as bench
from experiments import ports
from tests.test_ports import quick_run


def test_the_lpjax_variant_changes_what_the_readme_says():
    text = ports.diff(bench.MODULE, bench.VARIANTS["fp16_lpjax"])
    for new in (
        "+import lpjax",
        '+    model = lpjax.precision.set_policy(CNN(rngs=nnx.Rngs(seed)), "fp16")',
        "+    grad_fn = lpjax.optim.scaled_value_and_grad(loss_fn, has_aux=True)",
        "+    (loss, logits), grads = grad_fn(optimizer, model, batch, rngs)",
    ):
        assert new in text.splitlines(), new


def test_quick_run_trains_every_variant_without_a_warning(tmp_path):
    saved = quick_run(bench, tmp_path)
    assert set(saved["results"]) == set(bench.MAIN_VARIANTS)
    for name, (run,) in saved["results"].items():
        assert np.isfinite(run["train_loss"]), name
        assert run["test_accuracy"] > 0.2 and run["test_accuracy_batch_statistics"] > 0.2, (name, run)  # chance: 0.1
    lpjax_run = saved["results"]["fp16_lpjax"][0]
    assert lpjax_run["final_loss_scale"] == 1e4 and lpjax_run["skipped_steps"] == 0
