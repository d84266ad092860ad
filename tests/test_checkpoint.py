"""Checkpointing whole training states: bit-exact round trips, typed keys, retention, errors, crash safety and
corrupt checkpoints."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from lpjax.checkpoint import Checkpointer, CorruptCheckpoint
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


def test_old_steps_are_deleted_through_the_trash_and_a_killed_process_s_trash_is_emptied(tmp_path):
    """Orbax deletes a step by renaming it into deleted/ (one atomic step: a process killed while deleting never
    leaves a step directory without its metadata, which every later CheckpointManager would warn about)."""
    (tmp_path / "deleted" / "7" / "state").mkdir(parents=True)  # what a process killed while emptying it left
    (tmp_path / "deleted" / "7" / "state" / "d").write_bytes(b"x" * 100)
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        assert ckpt.all_steps() == []
        for step in (1, 2, 3):
            ckpt.save(step, {"x": jnp.full(4, step)})
            ckpt.wait()
            assert not (tmp_path / "deleted").exists()
        assert ckpt.all_steps() == [2, 3] and ckpt.delete_after(2) == [3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2"]


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
from lpjax.checkpoint import Checkpointer, CorruptCheckpoint
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


# A full disk: saves step 1 (small), then step 2 (a 400 kB array) with the size of every file the process writes
# limited to 150 kB (RLIMIT_FSIZE: the kernel fails the write with EFBIG, as a full disk fails it with ENOSPC, inside
# tensorstore's writer threads), and prints what each call raised.
_FULL_DISK_CHILD = """
import resource, sys
import jax.numpy as jnp
from lpjax.checkpoint import Checkpointer
ckpt = Checkpointer(sys.argv[1], max_to_keep=2)
ckpt.save(1, {"x": jnp.arange(1000.0)}, metadata={"n": 1})
ckpt.wait()
resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, resource.RLIM_INFINITY))
ckpt.save(2, {"x": jnp.sin(jnp.arange(100_000.0))}, metadata={"n": 2})  # random-looking: compresses badly
for call in (ckpt.wait, ckpt.close):
    try:
        call()
        print(call.__name__, "ok")
    except OSError as error:
        print(call.__name__, type(error).__name__, error.errno, error)
"""


def test_a_full_disk_during_an_async_save_is_one_error_and_keeps_the_last_checkpoint(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_CHILD, str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    wait, close = result.stdout.splitlines()
    where = re.escape(str(tmp_path))
    assert re.fullmatch(
        rf"wait DiskFull 27 cannot write checkpoint 2 to {where}: File too large \(\S+ \S+ free there\)", wait
    )
    assert close == "close ok"
    assert result.stderr == ""  # no orbax error logs, no "Event loop is closed", nothing at exit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]  # the failed save's temporary directory is gone
    with Checkpointer(tmp_path) as ckpt:
        state, metadata = ckpt.restore(target={"x": jnp.zeros(1000)})
    assert metadata == {"step": 1, "n": 1} and np.asarray(state["x"]).tolist() == list(range(1000))


def test_a_save_that_would_not_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from lpjax import disk

    state = {"x": jnp.zeros(1000, jnp.float32), "key": jax.random.key(0)}
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        ckpt.save(1, state)
        ckpt.wait()
        monkeypatch.setattr(disk, "free_bytes", lambda path: 4000)  # the arrays alone are 4008 bytes
        with pytest.raises(disk.DiskFull) as raised:
            ckpt.save(2, state)
        assert str(raised.value).startswith(f"cannot write checkpoint 2 to {tmp_path}: it needs up to 3.9 KiB (3.9 KiB")
        assert ckpt.all_steps() == [1] and sorted(p.name for p in tmp_path.iterdir()) == ["1"]
        monkeypatch.setattr(disk, "free_bytes", lambda path: 1 << 30)
        ckpt.save(2, state)
    assert Checkpointer(tmp_path).all_steps() == [1, 2]


# Corrupt checkpoints. The states are big enough (512-wide float16/bfloat16 matrices) that OCDBT keeps their chunks
# in data files under state/ocdbt.process_*/d/ rather than inline in its b-tree nodes (under state/d/).
_SIZE = 512


def _truncate(path: pathlib.Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _data_files(step_dir: pathlib.Path) -> list[pathlib.Path]:
    """OCDBT's files under ``state/``, largest first: chunk data (``ocdbt.process_*/d/``) and b-tree nodes (``d/``)."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    return sorted(files, key=lambda p: -p.stat().st_size)


def _truncate_largest_data_file(step_dir):
    path = _data_files(step_dir)[0]
    _truncate(path)
    return rf"state/\S+ in {path.relative_to(step_dir)}: OUT_OF_RANGE: Requested byte range"


def _delete_largest_data_file(step_dir):
    _data_files(step_dir)[0].unlink()
    return r"state/\S+: DATA_LOSS: value reads as empty \(its data file is missing\)"


def _flip_a_btree_node_byte(step_dir):
    (path,) = (step_dir / "state" / "d").iterdir()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return rf"{path.relative_to(step_dir)}: DATA_LOSS: .*CRC-32C checksum verification failed"


def _break_the_chunk_frames(step_dir):
    """Garbles the zstd magic number of every chunk in the largest data file: only decoding them can tell."""
    path = _data_files(step_dir)[0]
    path.write_bytes(path.read_bytes().replace(b"\x28\xb5\x2f\xfd", b"\xd7\xb5\x2f\xfd"))
    return r"FAILED_PRECONDITION: Error reading \"\S+\" in OCDBT database .*ZSTD_decompressStream\(\) failed"


def _empty_metadata_json(step_dir):
    (path,) = [p for p in (step_dir / "metadata").iterdir() if p.name != "commit_success.txt"]
    path.write_text("")
    return rf"{path.relative_to(step_dir)}: empty file"


def _truncate_orbax_metadata(step_dir):
    _truncate(step_dir / "state" / "_METADATA")
    return r"state/_METADATA: not valid JSON \("


def _truncate_checkpoint_metadata(step_dir):
    _truncate(step_dir / "_CHECKPOINT_METADATA")
    return r"_CHECKPOINT_METADATA: not valid JSON \(Unterminated string"


CORRUPTIONS = [
    _truncate_largest_data_file,
    _delete_largest_data_file,
    _flip_a_btree_node_byte,
    _break_the_chunk_frames,
    _empty_metadata_json,
    _truncate_orbax_metadata,
    _truncate_checkpoint_metadata,
]


def _save_steps(ckpt, steps):
    for step in steps:
        ckpt.save(step, make_state(step, _SIZE), metadata={"env_steps": 10 * step})
    ckpt.wait()


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__.strip("_"))
def test_a_corrupt_latest_checkpoint_raises_one_line_and_restore_latest_good_falls_back(
    tmp_path, capfd, monkeypatch, corrupt
):
    # Unraisable exceptions print to stderr as in a plain Python process (pytest would turn them into warnings).
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    target = make_state(0, _SIZE)
    with Checkpointer(tmp_path, max_to_keep=None) as ckpt:
        _save_steps(ckpt, (1, 2, 3))
        expected = corrupt(tmp_path / "3")
        for step in (3, None):  # explicitly, and as the latest
            with pytest.raises(CorruptCheckpoint) as raised:
                ckpt.restore(step, target=target)
            message = str(raised.value)
            assert "\n" not in message and raised.value.step == 3
            assert re.match(rf"checkpoint 3 in {re.escape(str(tmp_path))} is corrupt: {expected}", message), message
        with pytest.raises(CorruptCheckpoint, match=r"^checkpoint 3 in .* is corrupt: "):
            ckpt.restore(3)  # without a target too

        with pytest.warns(RuntimeWarning, match=r"^checkpoint 3 in .* is corrupt: .*falling back") as record:
            step, state, metadata = ckpt.restore_latest_good(target)
        assert len(record) == 1
        assert step == 2 and metadata == {"step": 2, "env_steps": 20}
        assert_bit_identical(state, make_state(2, _SIZE))
        assert ckpt.all_steps() == [1, 2]  # the corrupt step is gone, so training can save from step 3 on

        ckpt.save(3, make_state(33, _SIZE))
        ckpt.wait()
        assert_bit_identical(ckpt.restore(target=target)[0], make_state(33, _SIZE))
    stderr = capfd.readouterr().err
    assert "Event loop is closed" not in stderr and "Traceback" not in stderr, stderr[-3000:]


def test_restore_latest_good_skips_every_corrupt_step_and_fails_when_none_is_readable(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    target = make_state(0, _SIZE)
    with Checkpointer(tmp_path, max_to_keep=None) as ckpt:
        with pytest.raises(FileNotFoundError, match="no complete checkpoint in"):
            ckpt.restore_latest_good(target)
        _save_steps(ckpt, (1, 2, 3))
        _truncate_largest_data_file(tmp_path / "3")
        _empty_metadata_json(tmp_path / "2")
        reported = []
        step, state, _ = ckpt.restore_latest_good(target, on_corrupt=lambda s, e: reported.append((s, e)))
        assert step == 1 and [s for s, _ in reported] == [3, 2] and ckpt.all_steps() == [1]
        assert all(isinstance(e, CorruptCheckpoint) and e.step == s for s, e in reported)
        assert_bit_identical(state, make_state(1, _SIZE))

        _save_steps(ckpt, (2, 3))
        for step in (1, 2, 3):
            _truncate_orbax_metadata(tmp_path / str(step))

        def stop(step, error):
            raise error

        with pytest.raises(CorruptCheckpoint, match="checkpoint 3 .* is corrupt"):
            ckpt.restore_latest_good(target, on_corrupt=stop)  # an on_corrupt that raises stops the fallback
        with pytest.warns(RuntimeWarning) as record, pytest.raises(CorruptCheckpoint) as raised:
            ckpt.restore_latest_good(target)
        assert [str(w.message).split(" in ")[0] for w in record] == [f"checkpoint {s}" for s in (3, 2, 1)]
        message = str(raised.value)
        assert "\n" not in message and raised.value.step is None
        assert message.startswith(f"no readable checkpoint in {tmp_path}: steps [3, 2, 1] are all corrupt")
        assert ckpt.all_steps() == [1, 2, 3]  # nothing is deleted when nothing restores

        def restore(step):  # a caller's own restore (a learner's): its damage falls back the same way
            tried.append(step)
            if step == 3:
                raise CorruptCheckpoint(f"checkpoint {step} is corrupt: by the caller", step=step)
            return f"state {step}", {"step": step}

        tried = []
        assert ckpt.restore_latest_good(on_corrupt=lambda s, e: None, restore=restore) == (2, "state 2", {"step": 2})
        assert tried == [3, 2] and ckpt.all_steps() == [1, 2]
    assert "Traceback" not in capfd.readouterr().err


def test_a_target_mismatch_is_not_corruption(tmp_path):
    state = make_state(0, _SIZE)
    bad_shape = state._replace(pixels=jnp.zeros((2, 8, 8, 4), jnp.uint8))
    with Checkpointer(tmp_path, max_to_keep=None) as ckpt:
        _save_steps(ckpt, (1, 2))
        for restore in (lambda: ckpt.restore(target=bad_shape), lambda: ckpt.restore_latest_good(bad_shape)):
            with pytest.raises(ValueError, match=r"state\.pixels: checkpoint has uint8\[2, 8, 8, 3\]") as raised:
                restore()
            assert type(raised.value) is ValueError
        assert ckpt.all_steps() == [1, 2]  # no fallback on a mismatch: the older steps would not match either


def test_a_missing_item_directory_is_corruption_not_a_missing_step(tmp_path):
    with Checkpointer(tmp_path) as ckpt:
        _save_steps(ckpt, (1,))
        shutil.rmtree(tmp_path / "1" / "metadata")
        with pytest.raises(CorruptCheckpoint, match=r"^checkpoint 1 in .* is corrupt: metadata/metadata: missing$"):
            ckpt.restore(1, target=make_state(0, _SIZE))
