"""benchmarks/run_evidence.py: a run's loss scalers read from a real checkpoint, its last logged training values,
and where its losses stayed non-finite."""

import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import run_evidence
from lpjax.checkpoint import Checkpointer
from lpjax.optim import compound_loss_scaling


def _scaled_adam_state(num_nonfinite: int, num_finite: int):
    """A loss-scaled Adam state after ``num_nonfinite`` non-finite and ``num_finite`` finite gradients."""
    optimizer = compound_loss_scaling(optax.adam(1e-3), init_scale=1024.0)
    params = {"w": jnp.ones(3, jnp.float16)}
    state = optimizer.init(params)
    for grad in [np.inf] * num_nonfinite + [1.0] * num_finite:
        _, state = optimizer.update({"w": jnp.full(3, grad, jnp.float16)}, state, params)
    return state


def _save(run_dir, state, step=10):
    with Checkpointer(run_dir / "checkpoints", async_save=False) as checkpointer:
        checkpointer.save(step, state)


def test_loss_scalers_are_read_from_the_last_checkpoint_by_network(tmp_path):
    _save(tmp_path, {"agent": {"critic": {"opt_state": _scaled_adam_state(3, 2)}}}, step=10)
    state = {
        "agent": {
            "critic": {"opt_state": _scaled_adam_state(2, 1), "params": jnp.zeros(2)},
            "actor": {"opt_state": _scaled_adam_state(0, 4)},
            "temperature": {"opt_state": optax.adam(1e-3).init(jnp.zeros(1))},
        },
        "env_steps": jnp.int32(7),
    }
    _save(tmp_path, state, step=20)
    assert run_evidence.loss_scalers(tmp_path) == {
        "agent.critic": {"scale": 1024.0 / 4, "skipped_steps": 2},  # each skip halves the scale
        "agent.actor": {"scale": 1024.0, "skipped_steps": 0},
    }


def test_two_loss_scalers_of_one_network_are_named_by_their_whole_paths(tmp_path):
    _save(tmp_path, {"critic": {"opt_state": [_scaled_adam_state(1, 0), _scaled_adam_state(0, 1)]}})
    assert run_evidence.loss_scalers(tmp_path) == {
        "critic.opt_state.0": {"scale": 512.0, "skipped_steps": 1},
        "critic.opt_state.1": {"scale": 1024.0, "skipped_steps": 0},
    }


def test_a_run_without_checkpoints_or_loss_scalers(tmp_path):
    assert run_evidence.loss_scalers(tmp_path) is None
    (tmp_path / "checkpoints").mkdir()
    assert run_evidence.loss_scalers(tmp_path) is None
    _save(tmp_path, {"opt_state": optax.adam(1e-3).init(jnp.zeros(2))})
    assert run_evidence.loss_scalers(tmp_path) == {}


def test_last_logged_is_the_last_finite_value_of_each_column(tmp_path):
    (tmp_path / "metrics.csv").write_text(
        "step,train/entropy,train/alpha,train/critic_loss_scale,eval/return\n"
        "1000,-2.5,0.5,1024,\n"
        "2000,-5.5,0.01,nan,\n"
        "2000,,,,30.0\n"
        "3000,nan,0.02,,\n"
    )
    assert run_evidence.evidence(tmp_path) == {
        "loss_scalers": None,
        "last_logged": {"critic_loss_scale": 1024.0, "actor_loss_scale": None, "entropy": -5.5, "alpha": 0.02},
    }


def test_nonfinite_losses_since_finds_where_the_losses_stayed_nan(tmp_path):
    header = "step,train/critic_loss,eval/return\n"
    rows = [
        "1000,1.5,\n",
        "2000,nan,\n",
        "2000,,20.0\n",
        "3000,2.0,\n",
        "4000,nan,\n",
        "5000,inf,\n",
        "5000,,22.9\n",
        "6000,nan,\n",
    ]
    (tmp_path / "metrics.csv").write_text(header + "".join(rows))
    assert run_evidence.nonfinite_losses_since(tmp_path) == 4000  # the nan at 2000 recovered; from 4000 it did not
    assert run_evidence.logged(tmp_path, "eval/return") == ([2000, 5000], [20.0, 22.9])
    (tmp_path / "metrics.csv").write_text(header + "".join(rows[:4]))
    assert run_evidence.nonfinite_losses_since(tmp_path) is None  # the last logged loss is finite
    (tmp_path / "metrics.csv").write_text(header + "1000,nan,\n2000,nan,\n")
    assert run_evidence.nonfinite_losses_since(tmp_path) == 1000  # never finite
