"""Checkpointing whole training states: bit-exact round trips, typed keys, retention, errors and crash safety."""

import os
import pathlib
import subprocess
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from lpjax.checkpoint import Checkpointer
from lpjax.replay import replay_add, replay_init

REPO = pathlib.Path(__file__).resolve().parents[1]


class Nets(NamedTuple):
    actor: dict
    critic: dict


class TrainState(NamedTuple):
    params: Nets
    target: dict
    opt_state: optax.OptState
    key: jax.Array
    keys: jax.Array
    step: jax.Array
    pixels: jax.Array
    done: jax.Array


def _special_fp16():
    """float16 values whose bits must survive: signed zeros, subnormals, the max, infinities, a nan payload."""
    bits = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0x7C00, 0xFC00, 0x7E01, 0x3C00], np.uint16)
    return jnp.asarray(bits.view(np.float16))


def make_state(seed: int, size: int = 16) -> TrainState:
    """A SAC-like state with every dtype a low-precision learner keeps; ``size`` scales the arrays."""
    rng = np.random.default_rng(seed)
    actor = {"w": jnp.asarray(rng.normal(size=(size, 4)), jnp.float16), "special": _special_fp16()}
    critic = {
        "w": jnp.asarray(rng.normal(size=(4, size)), jnp.bfloat16),
        "b": jnp.asarray(rng.normal(size=size), jnp.float32),
    }
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    opt_state = tx.init(Nets(actor, critic))
    opt_state = jax.tree.map(lambda x: x + jnp.asarray(seed, x.dtype), opt_state)  # non-trivial moments
    return TrainState(
        params=Nets(actor, critic),
        target={"critic": jax.tree.map(lambda x: x * 2, critic)},
        opt_state=opt_state,
        key=jax.random.key(seed),
        keys=jax.random.split(jax.random.key(seed + 1, impl="rbg"), 3),
        step=jnp.asarray(seed, jnp.int32),
        pixels=jnp.asarray(rng.integers(0, 256, (2, 8, 8, 3)), jnp.uint8),
        done=jnp.asarray(rng.random(5) > 0.5),
    )


def _bits(x):
    x = jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
    x = np.asarray(x)
    return x.view(f"u{x.dtype.itemsize}") if x.dtype.kind == "f" or x.dtype.name == "bfloat16" else x


def assert_bit_identical(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
        name = jax.tree_util.keystr(path)
        assert g.dtype == w.dtype and g.shape == w.shape, name
        if jax.dtypes.issubdtype(w.dtype, jax.dtypes.prng_key):
            assert jax.random.key_impl(g) == jax.random.key_impl(w), name
        np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=name)


def test_round_trip_is_bit_exact_and_restores_types_dtypes_and_typed_keys(tmp_path):
    state = make_state(3)
    config = ml_collections.ConfigDict({"lr": 1e-4, "dtype": jnp.float16, "seeds": (1, 2)})
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(10, state, metadata={"config": config, "env_steps": np.int64(20)})
        ckpt.wait()
        assert ckpt.latest_step() == 10  # listed once finalized
        for target in (make_state(0), jax.eval_shape(lambda: make_state(0))):  # concrete or abstract targets
            restored, metadata = ckpt.restore(target=target)
            assert isinstance(restored, TrainState) and isinstance(restored.params, Nets)
            assert_bit_identical(restored, state)
        assert metadata == {"step": 10, "env_steps": 20, "config": {"lr": 1e-4, "dtype": "float16", "seeds": [1, 2]}}
    # The restored keys are usable keys of the right implementation.
    assert jax.random.key_impl(restored.keys) == jax.random.key_impl(state.keys)
    np.testing.assert_array_equal(jax.random.uniform(restored.key, (3,)), jax.random.uniform(state.key, (3,)))


def test_restore_without_target_returns_the_stored_tree(tmp_path):
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, make_state(1))
        raw, metadata = ckpt.restore()
    assert metadata == {"step": 1}
    assert isinstance(raw, dict) and set(raw) == set(TrainState._fields)
    assert raw["params"]["actor"]["w"].dtype == jnp.float16 and raw["pixels"].dtype == jnp.uint8


def test_replay_buffer_round_trips(tmp_path):
    example = {"obs": jnp.zeros((4, 4, 3), jnp.uint8), "reward": jnp.zeros([], jnp.float32)}
    buffer = replay_init(example, 8)
    buffer = replay_add(buffer, {"obs": jnp.full((5, 4, 4, 3), 7, jnp.uint8), "reward": jnp.arange(5.0)})
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(0, buffer)
        restored, _ = ckpt.restore(target=replay_init(example, 8))
    assert_bit_identical(restored, buffer)
    assert int(restored.size) == 5 and int(restored.insert_pos) == 5


def test_async_save_survives_donating_the_state_right_after(tmp_path):
    state = {"w": jnp.arange(1_000_000, dtype=jnp.float32), "key": jax.random.key(0)}
    expected = jax.tree.map(lambda x: x.copy(), state)
    step = jax.jit(lambda s: {"w": s["w"] + 1, "key": jax.random.split(s["key"])[0]}, donate_argnums=0)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state)
        state = step(state)  # training goes on while the checkpoint is written
        restored, _ = ckpt.restore(target=expected)
    assert_bit_identical(restored, expected)


def test_max_to_keep_keeps_the_newest(tmp_path):
    state = {"x": jnp.zeros(3, jnp.float16)}
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        for step in (1, 2, 5, 7, 9):
            ckpt.save(step, {"x": state["x"] + step})
        ckpt.wait()
        assert ckpt.all_steps() == [7, 9]
        restored, metadata = ckpt.restore(7, target=state)
    assert metadata["step"] == 7 and np.asarray(restored["x"]).tolist() == [7, 7, 7]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["7", "9"]


def test_restore_errors_name_what_is_missing_or_different(tmp_path):
    state = make_state(0)
    with Checkpointer(tmp_path) as ckpt:
        with pytest.raises(FileNotFoundError, match="no complete checkpoint in"):
            ckpt.restore(target=state)
        ckpt.save(4, state)
        with pytest.raises(FileNotFoundError, match=r"step 3 .*available steps: \[4\]"):
            ckpt.restore(3, target=state)
        bad_shape = state._replace(pixels=jnp.zeros((2, 8, 8, 4), jnp.uint8))
        with pytest.raises(
            ValueError,
            match=r"state\.pixels: checkpoint has uint8\[2, 8, 8, 3\], target has "
            r"uint8\[2, 8, 8, 4\]",
        ):
            ckpt.restore(target=bad_shape)
        bad_dtype = state._replace(
            params=state.params._replace(actor={**state.params.actor, "w": state.params.actor["w"].astype(jnp.float32)})
        )
        with pytest.raises(
            ValueError,
            match=r"state\.params\.actor\['w'\]: checkpoint has float16\[16, 4\], target "
            r"has float32\[16, 4\]",
        ):
            ckpt.restore(target=bad_dtype)
        extra = state._replace(target={**state.target, "actor": state.params.actor})
        missing = r"target leaves not in the checkpoint: state\.target\['actor'\]\['special'\]"
        with pytest.raises(ValueError, match=missing):
            ckpt.restore(target=extra)
        with pytest.raises(ValueError, match=r"checkpoint leaves not in the target: target\.critic\.b"):
            ckpt.restore(target=state._replace(target={"critic": {"w": state.target["critic"]["w"]}}))
        wrong_key = state._replace(key=jax.random.key(0, impl="rbg"))  # rbg key data is uint32[4], not [2]
        with pytest.raises(ValueError, match=r"state\.key: checkpoint has uint32\[2\], target has uint32\[4\]"):
            ckpt.restore(target=wrong_key)


def test_steps_must_increase_and_delete_after_allows_resuming_from_an_older_step(tmp_path):
    state = {"x": jnp.zeros(2)}
    with Checkpointer(tmp_path, max_to_keep=None) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, state)
        with pytest.raises(ValueError, match="checkpoint step 3 exists and steps must increase"):
            ckpt.save(3, state)
        with pytest.raises(ValueError, match="non-negative integer"):
            ckpt.save(-1, state)
        with pytest.raises(ValueError, match="metadata must be a dict"):
            ckpt.save(4, state, metadata=[1])
        assert ckpt.delete_after(1) == [2, 3]
        ckpt.save(2, {"x": jnp.ones(2)})
        ckpt.wait()
        assert ckpt.all_steps() == [1, 2]
        assert np.asarray(ckpt.restore(target=state)[0]["x"]).tolist() == [1, 1]
    with pytest.raises(ValueError, match="max_to_keep"):
        Checkpointer(tmp_path, max_to_keep=0)


# Saves steps 1..K, starts an (asynchronous) save of step K+1 and SIGKILLs itself before it can complete.
_CRASH_CHILD = """
import os, signal, sys
import jax.numpy as jnp
from lpjax.checkpoint import Checkpointer
from tests.test_checkpoint import make_state
directory, last = sys.argv[1], int(sys.argv[2])
ckpt = Checkpointer(directory, max_to_keep=2)
for step in range(1, last + 2):
    state = make_state(step)
    if step == last + 1:  # big enough that its write cannot finish between save() returning and the kill
        state = state._replace(target={"critic": state.target["critic"], "big": jnp.ones((16_000_000,))})
    ckpt.save(step, state, metadata={"step": step, "complete": step <= last})
    if step == last + 1:
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_process_killed_mid_save_leaves_the_last_complete_checkpoint(tmp_path):
    directory, last = tmp_path / "ckpt", 3
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", _CRASH_CHILD, str(directory), str(last)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == -9, result.stderr[-2000:]  # SIGKILL
    leftovers = [p.name for p in directory.iterdir() if "tmp" in p.name]
    assert leftovers, "the killed save should have left its temporary directory"
    with Checkpointer(directory, max_to_keep=2) as ckpt:
        assert ckpt.all_steps() == [last - 1, last] and ckpt.latest_step() == last
        state, metadata = ckpt.restore(target=make_state(0))
        assert metadata == {"step": last, "complete": True}
        assert_bit_identical(state, make_state(last))
        # Resuming overwrites nothing complete and clears the debris of the killed save.
        ckpt.save(last + 1, make_state(last + 1))
        ckpt.wait()
        assert ckpt.all_steps() == [last, last + 1]
        assert_bit_identical(ckpt.restore(target=make_state(0))[0], make_state(last + 1))
    assert not [p.name for p in directory.iterdir() if "tmp" in p.name]
