"""compound_loss_scaling against torch.amp.GradScaler itself: same scale trajectory, same skipped steps.

torch drives a float32 parameter through ``scaler.scale(loss).backward()``, ``scaler.step(optimizer)`` and
``scaler.update()``; lpjax gets the same scaled float32 gradients. The stream injects infs and nans in runs, so
both back-offs and growths (and growth right after a back-off) happen.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

pytestmark = pytest.mark.torch  # torch is imported in the tests: it exists only in the oldest tier's venv

from lpjax import optim

STEPS = 120
BAD_STEPS = {3, 4, 10, 17, 18, 19, 40, 41, 77, 100}


def _gradient_stream(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    grads = rng.normal(0.0, 1e-2, (STEPS, 8)).astype(np.float32)
    for i in sorted(BAD_STEPS):
        grads[i, i % 8] = (np.inf, -np.inf, np.nan)[i % 3]
    return grads


def _torch_trajectory(grads: np.ndarray, **kwargs) -> tuple[list[float], list[bool]]:
    import torch

    param = torch.nn.Parameter(torch.zeros(grads.shape[1], dtype=torch.float32))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    scales, skipped = [], []
    for g in grads:
        optimizer.zero_grad()
        before = param.detach().clone()
        loss = (param * torch.from_numpy(g)).sum()  # d loss / d param = g, so param.grad = scale * g
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        skipped.append(bool(torch.equal(before, param.detach())))
        scales.append(float(scaler.get_scale()))
    return scales, skipped


def _lpjax_trajectory(
    grads: np.ndarray, inner: optax.GradientTransformation, **kwargs
) -> tuple[list[float], list[bool]]:
    tx = optim.compound_loss_scaling(inner, min_scale=2.0**-100, **kwargs)
    params = jnp.zeros(grads.shape[1], jnp.float32)
    state = tx.init(params)
    update = jax.jit(tx.update)
    scales, skipped = [], []
    for g in grads:
        scaled = jnp.asarray(g) * optim.loss_scale(state)  # the scaled float32 gradient torch's backward gives
        before = int(state.skipped_steps)
        updates, state = update(scaled, state, params)
        params = optax.apply_updates(params, updates)
        skipped.append(int(state.skipped_steps) > before)
        scales.append(float(optim.loss_scale(state)))
    return scales, skipped


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=3),
        dict(init_scale=1e4, growth_factor=2.0, backoff_factor=0.5, growth_interval=7),
        dict(init_scale=2.0**10, growth_factor=4.0, backoff_factor=0.25, growth_interval=5),
    ],
    ids=["amp_defaults_interval_3", "paper_init_interval_7", "factors_4_and_quarter"],
)
@pytest.mark.parametrize("inner", ["hadam", "sgd"])
def test_scale_trajectory_and_skipped_steps_equal_torch_grad_scaler(kwargs, inner):
    grads = _gradient_stream(0)
    torch_scales, torch_skipped = _torch_trajectory(grads, **kwargs)
    make = {"hadam": lambda: optim.hadam(1e-3), "sgd": lambda: optax.sgd(1e-3)}[inner]
    scales, skipped = _lpjax_trajectory(grads, make(), **kwargs)
    assert skipped == torch_skipped
    assert [i for i, s in enumerate(skipped) if s] == sorted(BAD_STEPS)
    assert scales == torch_scales
    assert len(set(scales)) >= 4  # the stream exercised growth and back-off
