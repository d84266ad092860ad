"""The on-device ring replay buffer: wraparound, uniform sampling, dtypes, jit/scan and argument errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.replay import (
    ReplayBuffer,
    replay_add,
    replay_add_blocks,
    replay_can_sample,
    replay_init,
    replay_nbytes,
    replay_sample,
    sample_strata,
    stratum_sizes,
)


def _example(obs_shape=(3,)):
    return {
        "obs": jnp.zeros(obs_shape, jnp.uint8),
        "action": jnp.zeros((2,), jnp.float16),
        "reward": jnp.zeros([], jnp.float32),
        "discount": jnp.ones([], jnp.float32),
        "next_obs": jnp.zeros(obs_shape, jnp.uint8),
        "id": jnp.zeros([], jnp.int32),
    }


def _batch(ids, obs_shape=(3,)):
    """Transitions whose every field encodes its id, so slots can be traced back to what was added."""
    ids = np.asarray(ids, np.int32)
    obs = (ids.reshape((-1,) + (1,) * len(obs_shape)) + np.zeros(obs_shape, np.int32)).astype(np.uint8)
    return {
        "obs": jnp.asarray(obs),
        "action": jnp.asarray(np.stack([ids, -ids], 1), jnp.float16),
        "reward": jnp.asarray(ids, jnp.float32),
        "discount": jnp.ones(len(ids), jnp.float32),
        "next_obs": jnp.asarray(obs + 1),
        "id": jnp.asarray(ids),
    }


def _ids(buffer):
    return np.asarray(buffer.data["id"]).tolist()


def test_init_allocates_zero_slots_and_keeps_dtypes():
    buffer = replay_init(_example((4, 4, 3)), capacity=7)
    assert isinstance(buffer, ReplayBuffer) and buffer.capacity == 7
    assert int(buffer.insert_pos) == 0 and int(buffer.size) == 0
    assert buffer.insert_pos.dtype == jnp.int32 and buffer.size.dtype == jnp.int32
    expected = {
        "obs": (jnp.uint8, (7, 4, 4, 3)),
        "action": (jnp.float16, (7, 2)),
        "reward": (jnp.float32, (7,)),
        "discount": (jnp.float32, (7,)),
        "next_obs": (jnp.uint8, (7, 4, 4, 3)),
        "id": (jnp.int32, (7,)),
    }
    for name, (dtype, shape) in expected.items():
        assert buffer.data[name].dtype == dtype and buffer.data[name].shape == shape, name
        assert not np.asarray(buffer.data[name]).any()


def test_add_wraps_around_in_insertion_order():
    buffer = replay_init(_example(), capacity=5)
    buffer = replay_add(buffer, _batch([0, 1, 2]))
    assert _ids(buffer)[:3] == [0, 1, 2] and (int(buffer.insert_pos), int(buffer.size)) == (3, 3)
    buffer = replay_add(buffer, _batch([3, 4, 5, 6]))  # more than the 2 free slots: 5, 6 overwrite 0, 1
    assert _ids(buffer) == [5, 6, 2, 3, 4] and (int(buffer.insert_pos), int(buffer.size)) == (2, 5)
    buffer = replay_add(buffer, _batch([7, 8, 9, 10, 11]))  # exactly capacity: every slot, oldest first
    assert _ids(buffer) == [10, 11, 7, 8, 9] and (int(buffer.insert_pos), int(buffer.size)) == (2, 5)
    # Every field of a slot comes from the same transition.
    data = jax.tree.map(np.asarray, buffer.data)
    np.testing.assert_array_equal(data["obs"][:, 0], data["id"])
    np.testing.assert_array_equal(data["next_obs"][:, 0], data["id"] + 1)
    np.testing.assert_array_equal(data["action"][:, 1], -data["id"])
    np.testing.assert_array_equal(data["reward"], data["id"])


def test_add_of_an_empty_batch_is_a_no_op():
    buffer = replay_add(replay_init(_example(), capacity=4), _batch([1]))
    same = replay_add(buffer, _batch([]))
    assert _ids(same) == _ids(buffer) and int(same.size) == 1 and int(same.insert_pos) == 1


def test_sampling_is_uniform_over_the_filled_slots_only():
    capacity, filled, batches, batch_size = 128, 100, 1000, 100
    buffer = replay_add(replay_init(_example(), capacity), _batch(np.arange(filled)))
    keys = jax.random.split(jax.random.key(0), batches)
    ids = np.asarray(jax.jit(jax.vmap(lambda k: replay_sample(buffer, k, batch_size)))(keys)["id"]).ravel()
    draws = batches * batch_size
    assert ids.min() >= 0 and ids.max() < filled  # never the unfilled (zero) slots beyond size
    counts = np.bincount(ids, minlength=filled)
    expected = draws / filled
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # Upper 0.1% point of chi-square with df = filled - 1 (Wilson-Hilferty), about 148 for df = 99.
    df, z = filled - 1, 3.09
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert chi2 < critical, (chi2, critical)
    # And not suspiciously uniform either (a degenerate sampler, e.g. round-robin): lower 0.1% point.
    assert chi2 > df * (1 - 2 / (9 * df) - z * math.sqrt(2 / (9 * df))) ** 3


def test_sampling_after_wraparound_covers_the_newest_transitions():
    buffer = replay_init(_example(), capacity=4)
    buffer = replay_add(replay_add(buffer, _batch([0, 1, 2, 3])), _batch([4, 5]))
    ids = np.asarray(replay_sample(buffer, jax.random.key(1), 4)["id"])
    assert set(ids.tolist()) <= {2, 3, 4, 5}


def test_sampled_batches_keep_dtypes_and_consistent_fields():
    buffer = replay_add(replay_init(_example((2, 2)), 16), _batch(np.arange(10), (2, 2)))
    batch = replay_sample(buffer, jax.random.PRNGKey(3), 8)  # raw uint32 keys work too
    for name, leaf in batch.items():
        assert leaf.dtype == buffer.data[name].dtype and leaf.shape == (8,) + buffer.data[name].shape[1:]
    np.testing.assert_array_equal(np.asarray(batch["obs"])[:, 0, 0], np.asarray(batch["id"]))
    np.testing.assert_array_equal(np.asarray(batch["reward"]), np.asarray(batch["id"]))


def test_empty_buffer_samples_the_zero_transitions_and_can_sample_says_no():
    buffer = replay_init(_example(), 8)
    assert not replay_can_sample(buffer, 1)
    batch = jax.jit(replay_sample, static_argnums=2)(buffer, jax.random.key(0), 4)
    assert all(not np.asarray(leaf).any() for leaf in jax.tree.leaves(batch))
    buffer = replay_add(buffer, _batch([1, 2, 3]))
    assert replay_can_sample(buffer, 3) and not replay_can_sample(buffer, 4)
    # It also works under jit, as a traced boolean.
    assert bool(jax.jit(replay_can_sample, static_argnums=1)(buffer, 3))


def test_jit_and_scan_match_eager_adds():
    capacity, steps = 6, 15
    example = _example()
    per_step = jax.tree.map(lambda x: x[:, None], _batch(np.arange(steps)))  # (steps, 1, ...): one per step

    def body(buffer, transition):
        buffer = replay_add(buffer, transition)
        return buffer, replay_sample(buffer, jax.random.key(0), 2)["id"]

    scanned, samples = jax.jit(lambda b, t: jax.lax.scan(body, b, t))(replay_init(example, capacity), per_step)
    eager = replay_init(example, capacity)
    for i in range(steps):
        eager = replay_add(eager, jax.tree.map(lambda x: x[i], per_step))
    for got, want in zip(jax.tree.leaves(scanned), jax.tree.leaves(eager)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert _ids(scanned) == [12, 13, 14, 9, 10, 11]
    # Samples at step i only come from the transitions added so far (the last `capacity` of them).
    samples = np.asarray(samples)
    for i in range(steps):
        assert ((samples[i] <= i) & (samples[i] > i - capacity)).all()


def test_jitted_add_with_donation_and_batch_larger_than_free_space():
    add = jax.jit(replay_add, donate_argnums=0)
    buffer = replay_init(_example(), 4)
    buffer = add(buffer, _batch([0, 1, 2]))
    buffer = add(buffer, _batch([3, 4, 5]))
    assert _ids(buffer) == [4, 5, 2, 3] and int(buffer.insert_pos) == 2 and int(buffer.size) == 4


def test_numpy_float64_transitions_are_accepted_as_float32_when_x64_is_off():
    example = {"obs": np.zeros(3, np.float32), "reward": 0.0}
    buffer = replay_init(example, 4)
    assert buffer.data["reward"].dtype == jnp.float32
    buffer = replay_add(buffer, {"obs": np.ones((2, 3)), "reward": np.array([1.0, 2.0])})  # float64 numpy
    assert buffer.data["obs"].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(buffer.data["reward"]), [1, 2, 0, 0])


def test_nbytes_counts_every_leaf_and_works_on_abstract_buffers():
    example = _example((84, 84, 9))
    per_slot = 2 * 84 * 84 * 9 + 2 * 2 + 4 + 4 + 4
    assert replay_nbytes(replay_init(example, 10)) == 10 * per_slot + 8
    abstract = jax.eval_shape(lambda: replay_init(example, 1_000_000))
    assert replay_nbytes(abstract) == 1_000_000 * per_slot + 8


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True, 2**31])
def test_bad_capacity_raises(capacity):
    with pytest.raises(ValueError, match="capacity"):
        replay_init(_example(), capacity)


def test_empty_example_raises():
    with pytest.raises(ValueError, match="no leaves"):
        replay_init({}, 4)


def test_add_errors_name_the_offending_leaf():
    buffer = replay_init(_example(), 4)
    good = _batch([0, 1])
    with pytest.raises(ValueError, match="structure"):
        replay_add(buffer, {k: v for k, v in good.items() if k != "reward"})
    with pytest.raises(ValueError, match=r"\['obs'\].*dtype float32.*uint8"):
        replay_add(buffer, {**good, "obs": good["obs"].astype(jnp.float32)})
    with pytest.raises(ValueError, match=r"\['action'\].*shape \[2, 3\]"):
        replay_add(buffer, {**good, "action": jnp.zeros((2, 3), jnp.float16)})
    with pytest.raises(ValueError, match=r"\['reward'\].*shape \[\]"):  # missing batch axis
        replay_add(buffer, {**good, "reward": jnp.float32(1.0)})
    with pytest.raises(ValueError, match="same leading batch size"):
        replay_add(buffer, {**good, "id": jnp.zeros(3, jnp.int32)})
    with pytest.raises(ValueError, match="cannot add 5 transitions at once to a buffer of capacity 4"):
        replay_add(buffer, _batch(np.arange(5)))
    with pytest.raises(ValueError, match="capacity 4"):  # also at jit trace time
        jax.jit(replay_add)(buffer, _batch(np.arange(5)))


@pytest.mark.parametrize("batch_size", [0, 5, 2.0])
def test_bad_batch_size_raises(batch_size):
    buffer = replay_init(_example(), 4)
    with pytest.raises(ValueError, match=r"batch_size must be an integer in \[1, capacity=4\]"):
        replay_sample(buffer, jax.random.key(0), batch_size)


def test_a_float16_buffer_stores_float_leaves_in_float16_and_keeps_uint8():
    from lpjax.replay import replay_cast, with_float_dtype

    example = {"obs": jnp.zeros((3,), jnp.float32), "pixels": jnp.zeros((2, 2), jnp.uint8), "reward": 0.0}
    buffer = replay_init(with_float_dtype(example, jnp.float16), 8)
    assert buffer.data["obs"].dtype == jnp.float16 and buffer.data["reward"].dtype == jnp.float16
    assert buffer.data["pixels"].dtype == jnp.uint8
    transition = {
        "obs": jnp.asarray([[1.0, 1e-4, 70000.0]], jnp.float32),
        "pixels": jnp.ones((1, 2, 2), jnp.uint8),
        "reward": jnp.asarray([0.1], jnp.float32),
    }
    with pytest.raises(ValueError, match="Cast it explicitly"):
        replay_add(buffer, transition)
    buffer = replay_add(buffer, replay_cast(buffer, transition))
    np.testing.assert_array_equal(
        np.asarray(buffer.data["obs"][0]), np.asarray(transition["obs"][0]).astype(np.float16)
    )
    assert replay_nbytes(buffer) < replay_nbytes(replay_init(example, 8))


def _numbered(capacity, added, strata):
    buffer = replay_init({"x": jnp.zeros([], jnp.int32)}, capacity)
    for i in range(added):
        buffer = replay_add(buffer, {"x": jnp.asarray([i], jnp.int32)}, strata)
    return buffer


def test_strata_take_the_transitions_in_turn_and_wrap_within_themselves():
    buffer = _numbered(capacity=8, added=11, strata=2)
    # stratum 0 (slots 0-3) holds the even transitions, stratum 1 (slots 4-7) the odd ones; 8, 9 and 10 overwrote
    # the oldest of their stratum
    np.testing.assert_array_equal(buffer.data["x"], [8, 10, 4, 6, 9, 3, 5, 7])
    assert int(buffer.size) == 8 and int(buffer.insert_pos) == 3


def test_one_stratum_is_the_plain_ring_buffer():
    plain, stratified = _numbered(8, 11, 1), replay_init({"x": jnp.zeros([], jnp.int32)}, 8)
    for i in range(11):
        stratified = replay_add(stratified, {"x": jnp.asarray([i], jnp.int32)})
    np.testing.assert_array_equal(plain.data["x"], stratified.data["x"])
    key = jax.random.key(5)
    np.testing.assert_array_equal(replay_sample(plain, key, 6, strata=1)["x"], replay_sample(plain, key, 6)["x"])


def test_each_stratum_fills_its_batch_rows_from_its_own_filled_slots():
    buffer = _numbered(capacity=40, added=7, strata=4)  # strata hold 2, 2, 2 and 1 transitions
    np.testing.assert_array_equal(stratum_sizes(buffer.size, 40, 4), [2, 2, 2, 1])
    for seed in range(20):
        rows = np.asarray(replay_sample(buffer, jax.random.key(seed), 8, strata=4)["x"]).reshape(4, 2)
        for stratum in range(4):
            assert set(rows[stratum]) <= {i for i in range(7) if i % 4 == stratum}


def test_a_stratum_draws_the_same_rows_alone_as_with_the_others():
    buffer = _numbered(capacity=40, added=33, strata=4)
    key = jax.random.key(1)
    whole = np.asarray(replay_sample(buffer, key, 12, strata=4)["x"])
    sizes = stratum_sizes(buffer.size, 40, 4, first=2, count=2)
    part = sample_strata({"x": buffer.data["x"][20:]}, key, 3, 4, sizes, first=2)
    np.testing.assert_array_equal(part["x"], whole[6:])


@pytest.mark.parametrize(("capacity", "batch", "strata"), [(10, 4, 3), (12, 4, 3), (12, 6, 0)])
def test_strata_must_divide_the_capacity_and_the_batch(capacity, batch, strata):
    buffer = replay_init({"x": jnp.zeros([])}, capacity)
    with pytest.raises(ValueError, match="strata|multiple"):
        replay_sample(buffer, jax.random.key(0), batch, strata=strata)


def test_blocks_go_to_their_own_stratum_and_equal_replay_add_of_the_reordered_batch():
    # 3 adds of 8 transitions (ids 8k .. 8k + 7) in 4 blocks of 2 into 4 strata of 4 slots: the third wraps
    blocks, reordered = (replay_init({"x": jnp.zeros([], jnp.int32)}, 16) for _ in range(2))
    for k in range(3):
        ids = np.arange(8 * k, 8 * k + 8, dtype=np.int32)
        blocks = replay_add_blocks(blocks, {"x": jnp.asarray(ids)}, 4)
        # position j (stratum j mod 4) takes row j // 4 of block j mod 4
        order = [(j % 4) * 2 + j // 4 for j in range(8)]
        reordered = replay_add(reordered, {"x": jnp.asarray(ids[order])}, 4)
        np.testing.assert_array_equal(blocks.data["x"], reordered.data["x"])
        assert int(blocks.insert_pos) == int(reordered.insert_pos) and int(blocks.size) == int(reordered.size)
    # stratum s holds the ids of block s (ids 8k + 2s, 8k + 2s + 1), the newest overwriting the oldest
    block_of_slot = np.asarray(blocks.data["x"]).reshape(4, 4) % 8 // 2
    np.testing.assert_array_equal(block_of_slot, np.repeat(np.arange(4), 4).reshape(4, 4))
    np.testing.assert_array_equal(blocks.data["x"][:4], [16, 17, 8, 9])
    np.testing.assert_array_equal(stratum_sizes(blocks.size, 16, 4), [4, 4, 4, 4])
    # a batch's rows [s B/S, (s+1) B/S) come from block s
    rows = np.asarray(replay_sample(blocks, jax.random.key(0), 8, strata=4)["x"]).reshape(4, 2)
    np.testing.assert_array_equal(rows % 8 // 2, np.repeat(np.arange(4), 2).reshape(4, 2))


def test_blocks_with_one_stratum_are_replay_add_and_bad_blocks_raise():
    plain, blocks = (replay_init({"x": jnp.zeros([], jnp.int32)}, 8) for _ in range(2))
    for k in range(3):
        batch = {"x": jnp.arange(3 * k, 3 * k + 3, dtype=jnp.int32)}
        plain, blocks = replay_add(plain, batch), replay_add_blocks(blocks, batch, 1)
    np.testing.assert_array_equal(plain.data["x"], blocks.data["x"])
    with pytest.raises(ValueError, match="multiple of the strata"):
        replay_add_blocks(blocks, {"x": jnp.arange(3, dtype=jnp.int32)}, 2)
    with pytest.raises(ValueError, match="strata must be a positive divisor"):
        replay_add_blocks(blocks, {"x": jnp.arange(6, dtype=jnp.int32)}, 3)
