"""An on-device replay buffer: a ring buffer stored as a pytree, usable inside ``jit`` and ``lax.scan``.

A :class:`ReplayBuffer` holds one array per leaf of an example transition, each with a leading ``capacity``
axis, plus an insert position and a size. :func:`replay_add` writes a batch of ``n`` transitions at positions

    (insert_pos + i) mod capacity,   i = 0 .. n-1

so the oldest transitions are overwritten first, and updates

    insert_pos <- (insert_pos + n) mod capacity,    size <- min(size + n, capacity).

:func:`replay_sample` draws ``batch_size`` indices uniformly from ``{0, .., size-1}`` with replacement. Every
slot below ``size`` holds a valid transition whatever ``insert_pos`` is (slots fill in order and are never
emptied), so uniform over the filled part is uniform over slots ``[0, size)``.

Everything is a pure function of a pytree: the learner's step can add and sample inside one ``jit`` or a
``lax.scan`` over environment steps. All shapes are static, so every argument check below runs when the
function is traced (eagerly or at ``jit`` trace time) and raises a ``ValueError``. Values are not checked under
``jit``: sampling an empty buffer cannot raise there (see :func:`replay_sample`); test on the host with
:func:`replay_can_sample` first. Donate the buffer to the jitted step (``jax.jit(step, donate_argnums=...)``) so
XLA updates it in place instead of copying it on every add.

Example::

    example = {"obs": jnp.zeros(obs_shape, jnp.uint8), "action": jnp.zeros(act_dim), "reward": 0.0,
               "discount": 1.0, "next_obs": jnp.zeros(obs_shape, jnp.uint8)}
    buffer = replay_init(example, capacity=100_000)
    buffer = replay_add(buffer, transitions)          # every leaf has a leading batch axis n
    if replay_can_sample(buffer, 256):
        batch = replay_sample(buffer, key, 256)       # every leaf has a leading axis 256
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# insert_pos + n < 2 * capacity must fit in int32.
MAX_CAPACITY = 2**30


class ReplayBuffer(NamedTuple):
    """State of a ring replay buffer (a pytree: pass it through ``jit``, ``lax.scan`` and checkpoints).

    Attributes:
      data: pytree of arrays with the structure of the example transition given to :func:`replay_init`; each
        leaf has shape ``(capacity,) + example_leaf.shape`` and the example leaf's dtype.
      insert_pos: int32 scalar, the slot the next transition is written to, in ``[0, capacity)``.
      size: int32 scalar, the number of filled slots (``min(transitions added, capacity)``); slots
        ``[0, size)`` hold valid transitions.
    """

    data: Any
    insert_pos: jax.Array
    size: jax.Array

    @property
    def capacity(self) -> int:
        """The number of slots (static: the leading dimension of every leaf of ``data``)."""
        return int(jax.tree.leaves(self.data)[0].shape[0])


def _canonical_dtype(leaf) -> np.dtype:
    """The dtype JAX gives ``leaf`` (numpy float64 is float32 unless x64 is enabled)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(leaf.dtype))


def replay_init(example_transition: Any, capacity: int) -> ReplayBuffer:
    """Creates an empty buffer of ``capacity`` zero transitions shaped like ``example_transition``.

    Args:
      example_transition: one transition, any pytree of arrays (or scalars) without a batch axis, e.g. a dict
        with ``obs``, ``action``, ``reward``, ``discount``, ``next_obs``. Only shapes and dtypes are used, and
        dtypes are kept (uint8 pixels stay uint8; Python floats become the default float dtype).
      capacity: number of slots, ``1 <= capacity <= 2**30``.

    Returns:
      A :class:`ReplayBuffer` with zero ``data``, ``insert_pos = 0`` and ``size = 0``.

    Raises:
      ValueError: if ``capacity`` is not a positive integer, or the example has no array leaves.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or not 0 < capacity <= MAX_CAPACITY:
        raise ValueError(f"capacity must be an integer in [1, {MAX_CAPACITY}], got {capacity!r}.")
    leaves = jax.tree.leaves(example_transition)
    if not leaves:
        raise ValueError(
            "example_transition has no leaves: give a pytree of arrays (e.g. a dict of obs, action, reward, ...)."
        )
    capacity = int(capacity)

    def slots(leaf):
        leaf = leaf if hasattr(leaf, "dtype") and hasattr(leaf, "shape") else jnp.asarray(leaf)
        return jnp.zeros((capacity,) + tuple(leaf.shape), _canonical_dtype(leaf))

    return ReplayBuffer(
        data=jax.tree.map(slots, example_transition), insert_pos=jnp.zeros([], jnp.int32), size=jnp.zeros([], jnp.int32)
    )


def with_float_dtype(example_transition: Any, dtype: Any) -> Any:
    """``example_transition`` with its floating-point leaves in ``dtype`` (others, e.g. uint8 pixels, kept): the
    example of a buffer that stores floats in ``dtype`` (a float16 learner's replay takes half the memory).

    Transitions are then cast to the buffer's dtypes explicitly, with :func:`replay_cast`."""

    def cast(leaf):
        leaf = jnp.asarray(leaf)
        return leaf.astype(dtype) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf

    return jax.tree.map(cast, example_transition)


def replay_cast(buffer: ReplayBuffer, transitions: Any) -> Any:
    """``transitions`` with each leaf cast to the dtype ``buffer`` stores it in: the explicit conversion
    :func:`replay_add` asks for (it refuses a dtype mismatch). Structures must match."""
    return jax.tree.map(lambda leaf, slot: jnp.asarray(leaf).astype(slot.dtype), transitions, buffer.data)


def _check_batch(buffer: ReplayBuffer, transitions: Any) -> int:
    """Checks ``transitions`` against the buffer's layout; returns the batch size ``n``."""
    expected, got = jax.tree.structure(buffer.data), jax.tree.structure(transitions)
    if expected != got:
        raise ValueError(
            f"transitions do not have the structure of the buffer's example transition.\n"
            f"  expected: {expected}\n  got:      {got}"
        )
    sizes = set()
    for (path, slot), leaf in zip(jax.tree_util.tree_flatten_with_path(buffer.data)[0], jax.tree.leaves(transitions)):
        name = jax.tree_util.keystr(path) or "<root>"
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            raise ValueError(
                f"transitions{name} must be an array with a leading batch axis, got {type(leaf).__name__}."
            )
        if tuple(leaf.shape[1:]) != tuple(slot.shape[1:]) or leaf.ndim != slot.ndim:
            raise ValueError(
                f"transitions{name} has shape {list(leaf.shape)}; expected [n] + "
                f"{list(slot.shape[1:])} (a leading batch axis, then the example's shape)."
            )
        if _canonical_dtype(leaf) != slot.dtype:
            raise ValueError(
                f"transitions{name} has dtype {np.dtype(leaf.dtype).name}; the buffer stores "
                f"{np.dtype(slot.dtype).name}. Cast it explicitly (no silent conversion, e.g. of "
                "float pixels into uint8)."
            )
        sizes.add(int(leaf.shape[0]))
    if len(sizes) != 1:
        raise ValueError(f"all leaves of transitions must have the same leading batch size, got {sorted(sizes)}.")
    return sizes.pop()


def replay_add(buffer: ReplayBuffer, transitions: Any, strata: int = 1) -> ReplayBuffer:
    """Adds a batch of ``n`` transitions, overwriting the oldest ones once the buffer is full.

    Transition ``i`` goes to position ``p = (insert_pos + i) mod capacity``, so a batch that does not fit in the
    space left wraps around to the start. Position ``p`` is slot ``p`` of a buffer with one stratum; with
    ``strata`` S it is slot ``(p mod S) * capacity / S + p // S``: the strata (blocks of ``capacity / S``
    consecutive slots) take the transitions in turn (see :func:`replay_sample`). Jittable; ``n`` and ``strata`` are
    static.

    Args:
      buffer: the buffer.
      transitions: pytree with the structure of the example transition; every leaf has shape
        ``(n,) + example_leaf.shape`` and the buffer's dtype for that leaf. ``0 <= n <= capacity``.
      strata: the number of strata, a divisor of ``capacity``; a buffer is always added to and sampled with the
        same number.

    Returns:
      The buffer with the transitions written, ``insert_pos`` advanced by ``n`` (mod capacity) and ``size``
      increased by ``n`` up to ``capacity``.

    Raises:
      ValueError: (when traced) on a structure, shape or dtype mismatch, or if ``n > capacity`` (the batch would
        overwrite itself).
    """
    n, capacity = _check_batch(buffer, transitions), buffer.capacity
    if n > capacity:
        raise ValueError(
            f"cannot add {n} transitions at once to a buffer of capacity {capacity}: split the batch "
            "or raise the capacity."
        )
    per_stratum = capacity // _check_strata(strata, capacity)
    if n == 0:
        return buffer
    # n <= capacity, so the n positions (and their slots) are distinct.
    positions = (buffer.insert_pos + jnp.arange(n, dtype=jnp.int32)) % capacity
    return _write(buffer, transitions, positions % strata * per_stratum + positions // strata, n)


def _write(buffer: ReplayBuffer, transitions: Any, slots: jax.Array, n: int) -> ReplayBuffer:
    """``transitions`` written at the (distinct) ``slots``; ``insert_pos`` and ``size`` advanced by ``n``."""
    data = jax.tree.map(
        lambda stored, new: stored.at[slots].set(
            new.astype(stored.dtype), unique_indices=True, mode="promise_in_bounds"
        ),
        buffer.data,
        transitions,
    )
    return ReplayBuffer(
        data=data,
        insert_pos=(buffer.insert_pos + n) % buffer.capacity,
        size=jnp.minimum(buffer.size + n, buffer.capacity).astype(jnp.int32),
    )


def replay_add_blocks(buffer: ReplayBuffer, transitions: Any, strata: int) -> ReplayBuffer:
    """Adds ``n`` transitions made of ``strata`` consecutive blocks of ``n / strata``: block ``s`` goes to stratum
    ``s``, e.g. the transitions of ``n`` parallel environments, each block of environments feeding its own stratum.

    It is :func:`replay_add` of the transitions reordered so that position ``insert_pos + j`` (stratum ``j mod S``)
    takes block ``j mod S``'s row ``j // S``: row ``r`` of block ``s`` lands in stratum ``s`` at its slot
    ``(insert_pos / S + r) mod (capacity / S)``. That holds while ``insert_pos`` is a multiple of ``S``, which every
    add of a multiple of ``S`` transitions keeps (``S`` divides the capacity); do not mix it with :func:`replay_add`
    of other sizes on one buffer. The strata then fill evenly, :func:`stratum_sizes` stays exact, and
    :func:`replay_sample` with ``strata`` S draws ``batch_size / S`` rows from every block: each transition is
    drawn with the same probability, stratified by block. Where the blocks lie on the devices that hold their
    strata, the add moves no transition between devices (:func:`lpjax.sharding.sharded_replay_add_blocks`).
    With one stratum it is :func:`replay_add`. Jittable; ``n`` and ``strata`` are static.

    Raises:
      ValueError: (when traced) as :func:`replay_add`, or if ``strata`` does not divide both ``n`` and the capacity.
    """
    n, capacity = _check_batch(buffer, transitions), buffer.capacity
    per_stratum = capacity // _check_strata(strata, capacity)
    if n > capacity or n % strata:
        raise ValueError(
            f"cannot add {n} transitions in {strata} blocks to a buffer of capacity {capacity}: the batch must be a "
            "multiple of the strata and fit in the buffer."
        )
    if n == 0:
        return buffer
    rows = jnp.arange(n, dtype=jnp.int32)
    block = n // strata
    slots = rows // block * per_stratum + (buffer.insert_pos // strata + rows % block) % per_stratum
    return _write(buffer, transitions, slots, n)


def _check_strata(strata: int, capacity: int) -> int:
    if isinstance(strata, bool) or not isinstance(strata, (int, np.integer)) or strata < 1 or capacity % strata:
        raise ValueError(f"strata must be a positive divisor of the capacity ({capacity}), got {strata!r}.")
    return int(strata)


def stratum_sizes(size: jax.Array, capacity: int, strata: int, first: Any = 0, count: int | None = None) -> jax.Array:
    """The filled slots of strata ``first .. first + count - 1`` (default: all ``strata``) of a buffer holding
    ``size`` transitions: stratum ``s`` has taken every ``strata``-th transition from the ``s``-th, so it holds
    ``min(ceil((size - s) / strata), capacity / strata)`` (a buffer that has wrapped is full)."""
    count = strata if count is None else count
    s = first + jnp.arange(count, dtype=jnp.int32)
    return jnp.clip((size - s + strata - 1) // strata, 0, capacity // strata).astype(jnp.int32)


def sample_strata(
    data: Any, key: jax.Array, rows_per_stratum: int, strata: int, sizes: jax.Array, first: Any = 0
) -> Any:
    """``rows_per_stratum`` transitions from each stratum held in ``data`` (the slots of ``len(sizes)``
    consecutive strata, the first being stratum ``first`` of ``strata``), stratum by stratum.

    Stratum ``s`` draws its indices with ``jax.random.randint`` from ``{0, .., sizes[s] - 1}`` with its own key,
    ``fold_in(key, s)`` (``key`` itself when ``strata == 1``), so what it draws depends on ``key`` and ``s`` only:
    the whole buffer and a device holding some of its strata (:func:`lpjax.sharding.sharded_replay_sample`) draw
    the same transitions. This is the body of :func:`replay_sample`."""
    count = int(sizes.shape[0])
    per_stratum = jax.tree.leaves(data)[0].shape[0] // count

    def draw(stratum_key, size):
        return jax.random.randint(stratum_key, (rows_per_stratum,), 0, jnp.maximum(size, 1), dtype=jnp.int32)

    if strata == 1:
        indices = draw(key, sizes[0])
    else:
        keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, first + jnp.arange(count, dtype=jnp.int32))
        offsets = jnp.arange(count, dtype=jnp.int32)[:, None] * per_stratum
        indices = (jax.vmap(draw)(keys, sizes) + offsets).reshape(-1)
    return jax.tree.map(lambda stored: stored.at[indices].get(mode="promise_in_bounds"), data)


def replay_sample(buffer: ReplayBuffer, key: jax.Array, batch_size: int, strata: int = 1) -> Any:
    """Samples ``batch_size`` transitions uniformly from the filled slots, with replacement.

    With one stratum each index is drawn independently from ``{0, .., size-1}`` with ``jax.random.randint``.
    With ``strata`` S (the number the buffer is added to with, see :func:`replay_add`) the sample is stratified:
    rows ``[s B / S, (s + 1) B / S)`` of the batch come from stratum ``s`` (:func:`sample_strata`). The strata
    hold every S-th transition, so their sizes differ by at most one and each is a uniform sample of the buffer's
    contents; a data-parallel learner keeps the strata on different devices, and each device samples the batch
    rows it trains on from its own (:func:`lpjax.sharding.sharded_replay_sample`), whatever the number of devices.
    Jittable; ``batch_size`` and ``strata`` are static.

    An empty buffer (``size == 0``) cannot raise under ``jit``: it returns ``batch_size`` copies of slot 0, i.e.
    the all-zero transitions written by :func:`replay_init` (an empty stratum likewise returns its first slot).
    Guard on the host with :func:`replay_can_sample` (or under ``jit`` with ``lax.cond`` on it).

    Args:
      buffer: the buffer.
      key: a PRNG key (typed ``jax.random.key`` or raw ``jax.random.PRNGKey``).
      batch_size: number of transitions, ``1 <= batch_size <= capacity``, a multiple of ``strata``.
      strata: the number of strata.

    Returns:
      A pytree with the structure of the example transition whose leaves have a leading axis ``batch_size``.

    Raises:
      ValueError: (when traced) if ``batch_size`` is not an integer in ``[1, capacity]``, or ``strata`` does not
        divide both the capacity and ``batch_size``.
    """
    capacity = buffer.capacity
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or not 0 < batch_size <= capacity:
        raise ValueError(f"batch_size must be an integer in [1, capacity={capacity}], got {batch_size!r}.")
    strata = _check_strata(strata, capacity)
    if batch_size % strata:
        raise ValueError(f"batch_size ({batch_size}) must be a multiple of the replay's strata ({strata}).")
    sizes = stratum_sizes(buffer.size, capacity, strata)
    return sample_strata(buffer.data, key, int(batch_size) // strata, strata, sizes)


def replay_can_sample(buffer: ReplayBuffer, batch_size: int) -> jax.Array:
    """Whether the buffer holds at least ``batch_size`` transitions (``size >= batch_size``).

    Returns a boolean scalar array: use it in a host-side ``if`` (which reads the size from the device) before
    calling a jitted step that samples, or under ``jit`` in ``lax.cond``/``jnp.where``. Sampling itself only needs
    ``size >= 1`` (it draws with replacement); requiring ``batch_size`` avoids batches made of a handful of
    repeated transitions.
    """
    return jnp.asarray(buffer.size) >= batch_size


def replay_nbytes(buffer: ReplayBuffer) -> int:
    """Bytes held by the buffer (``data`` plus the two int32 counters).

    Computed from shapes and dtypes only, so it also works on an abstract buffer, to size one before allocating
    it: ``replay_nbytes(jax.eval_shape(lambda: replay_init(example, capacity)))``.
    """
    leaves = jax.tree.leaves(buffer)
    return int(sum(int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize for leaf in leaves))
