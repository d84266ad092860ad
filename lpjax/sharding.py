"""Learners on many devices: the device mesh, the shardings of a learner's state, batch and replay buffer.

A learner's mesh has two axes, :data:`MESH_AXES` = ``("data", "fsdp")``, of sizes ``config.mesh.data`` and
``config.mesh.fsdp`` (:func:`make_mesh`); ``data * fsdp`` is every device of every process. The learner's step is
one ``jax.jit`` over arrays carrying these shardings, and XLA's SPMD partitioner inserts the collectives:

* **batch** (:func:`batch_sharding`): the leading axis is split over both axes, so each of the ``data * fsdp``
  devices computes the loss on ``batch / (data * fsdp)`` rows, and the gradient (a mean over the batch) is an
  all-reduce.
* **state** (:func:`state_shardings`): data parallel (``fsdp = 1``) replicates every leaf. With ``fsdp > 1`` a
  leaf with two or more axes is split over ``"fsdp"`` along its largest axis that ``fsdp`` divides
  (:func:`fsdp_spec`); vectors, scalars, counters and PRNG keys stay replicated. The rule reads a leaf's shape
  only, so an optimizer state shaped like its parameter (Adam's and hAdam's moments, the Kahan compensation
  buffers) is sharded exactly like the parameter, and stochastic rounding's key is replicated: each element's
  random word is a function of the key and the element's index (:func:`lpjax.optim._rounding.element_bits`),
  which a sharded leaf computes for its own elements, so the roundings do not depend on the mesh.
* **replay** (:func:`replay_shardings`): the capacity axis is split over both axes. The buffer is stratified
  (:func:`lpjax.replay.replay_sample`): its ``strata`` (a multiple of the device count) are spread evenly over
  the devices, and each device samples its batch rows from its own strata (:func:`sharded_replay_sample`),
  without moving transitions between devices. A learner whose transitions come split over the devices (the
  jitted SAC loop's environments) adds them block by block, each device into its own strata
  (:func:`sharded_replay_add_blocks`).

**Global decisions.** A reduction inside the jitted step runs over the global array: the loss scaler's
``all(isfinite(grads))`` (:func:`lpjax.optim.compound_loss_scaling`) reads every shard of the gradient, which is
itself a sum over every device's batch rows. One non-finite value on one device therefore skips the step, and
backs the scale off, on all of them, and the skip decision, the scale and the parameters stay one replicated
value.

**Matching one device.** A learner's result depends on its config, not on its mesh: the replay's strata are set by
``config.replay_shards`` (default: the device count), and a 1-device run with the same ``replay_shards`` draws the
same batches. Only the order of floating-point sums differs (the all-reduce adds per-device partial sums).

**Dispatch.** A loop of sharded steps that never reads a result must bound how far it runs ahead of the devices
(:class:`DispatchWindow`): on XLA:CPU with several devices (jaxlib 0.10), more than 32 launches in flight per
device deadlock a collective, and the process aborts with "Termination timeout for all reduce".

**Multi-process.** :func:`initialize_distributed` joins the processes (``jax.distributed.initialize``); every
process then runs the same program on the global arrays. :func:`put_global` and :func:`global_batch` build global
arrays from values every process holds in full.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lpjax.replay import ReplayBuffer, replay_add_blocks, replay_sample, sample_strata, stratum_sizes

MESH_AXES = ("data", "fsdp")
"""The learner mesh's axes: ``"data"`` splits the batch, ``"fsdp"`` splits the batch and the state."""

DISTRIBUTED_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
"""Environment variables :func:`initialize_distributed` reads where the config leaves a field unset."""


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"mesh.{name} must be a positive integer, got {value!r}.")
    return int(value)


def make_mesh(data: int = 1, fsdp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``(data, fsdp)`` mesh over ``devices`` (default: every device of every process, ``jax.devices()``).

    A 1 x 1 mesh of a single process uses its first device. Raises ``ValueError`` (one line) when ``data *
    fsdp`` is not the number of devices, e.g. ``--config.mesh.data=4`` without 4 devices (on a CPU, force them
    with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``).
    """
    data, fsdp = _positive_int(data, "data"), _positive_int(fsdp, "fsdp")
    devices = list(jax.devices() if devices is None else devices)
    if data * fsdp == 1 and jax.process_count() == 1:
        devices = devices[:1]
    if data * fsdp != len(devices):
        raise ValueError(
            f"mesh data x fsdp = {data} x {fsdp} = {data * fsdp} devices, but there are {len(devices)} "
            f"({jax.process_count()} process(es), platform {devices[0].platform}); on a CPU, force devices with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N."
        )
    return Mesh(np.asarray(devices, dtype=object).reshape(data, fsdp), MESH_AXES)


def mesh_from_config(mesh_config: Mapping[str, Any] | None) -> Mesh:
    """:func:`make_mesh` of a config's ``mesh`` field (``{"data": ..., "fsdp": ...}``; ``None``: 1 x 1)."""
    values = dict(mesh_config or {})
    unknown = sorted(set(values) - {"data", "fsdp"})
    if unknown:
        raise ValueError(f"Unknown mesh config keys {unknown}; valid keys: data, fsdp.")
    return make_mesh(values.get("data", 1), values.get("fsdp", 1))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The leading (batch) axis split over every device of the mesh."""
    return NamedSharding(mesh, PartitionSpec(MESH_AXES))


def fsdp_spec(shape: Sequence[int], fsdp: int) -> PartitionSpec:
    """The spec of a state leaf of ``shape`` when the state is split ``fsdp`` ways: the largest axis that ``fsdp``
    divides is split over ``"fsdp"`` (the first, on a tie) if the leaf has two or more axes; otherwise (and
    with ``fsdp == 1``) the leaf is replicated."""
    if fsdp == 1 or len(shape) < 2:
        return PartitionSpec()
    divisible = [axis for axis, size in enumerate(shape) if size % fsdp == 0]
    if not divisible:
        return PartitionSpec()
    axis = max(divisible, key=lambda a: (shape[a], -a))
    return PartitionSpec(*([None] * axis), "fsdp")


def _is_key(leaf: Any) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def state_shardings(tree: Any, mesh: Mesh) -> Any:
    """One ``NamedSharding`` per array leaf of ``tree`` (a learner's state, or its ``jax.eval_shape``):
    :func:`fsdp_spec` of the leaf's shape, replicated for PRNG keys."""
    fsdp = mesh.shape["fsdp"]

    def sharding(leaf):
        spec = PartitionSpec() if _is_key(leaf) else fsdp_spec(np.shape(leaf), fsdp)
        return NamedSharding(mesh, spec)

    return jax.tree.map(sharding, tree)


def replay_shardings(buffer: ReplayBuffer, mesh: Mesh) -> ReplayBuffer:
    """The shardings of a stratified replay buffer: ``data``'s capacity axis split over every device of the mesh,
    the counters replicated."""
    return ReplayBuffer(
        data=jax.tree.map(lambda _: batch_sharding(mesh), buffer.data),
        insert_pos=replicated(mesh),
        size=replicated(mesh),
    )


def learner_shardings(tree: Any, mesh: Mesh) -> Any:
    """The shardings of everything a learner carries: :func:`replay_shardings` for each
    :class:`lpjax.replay.ReplayBuffer` in ``tree``, :func:`state_shardings` for the rest (networks, optimizer
    states, keys, counters)."""

    def sharding(node):
        return replay_shardings(node, mesh) if isinstance(node, ReplayBuffer) else state_shardings(node, mesh)

    return jax.tree.map(sharding, tree, is_leaf=lambda node: isinstance(node, ReplayBuffer))


def constrain(tree: Any, mesh: Mesh | None) -> Any:
    """Inside a jitted step: ``tree`` constrained to :func:`learner_shardings`, so a learner's state leaves the
    step with the layout it came in with (``mesh=None``: unchanged)."""
    return tree if mesh is None else jax.lax.with_sharding_constraint(tree, learner_shardings(tree, mesh))


def check_replay_layout(capacity: int, batch_size: int, strata: int, mesh: Mesh | None) -> None:
    """Raises ``ValueError`` (one line) unless ``strata`` divides both ``capacity`` and ``batch_size`` and is a
    multiple of the mesh's device count: each device then holds ``strata / devices`` whole strata."""
    devices = 1 if mesh is None else mesh.devices.size
    if strata % devices or capacity % strata or batch_size % strata:
        raise ValueError(
            f"replay_shards ({strata}) must be a multiple of the mesh's {devices} device(s) and divide the replay "
            f"capacity ({capacity}) and the batch size ({batch_size})."
        )


def sharded_replay_sample(buffer: ReplayBuffer, key: jax.Array, batch_size: int, strata: int, mesh: Mesh) -> Any:
    """:func:`lpjax.replay.replay_sample` of a buffer laid out by :func:`replay_shardings`, computed where the
    transitions are: each device draws the batch rows of its own strata (``jax.shard_map``) and the batch comes
    out split like :func:`batch_sharding`. The batch equals ``replay_sample(buffer, key, batch_size, strata)``
    on one device, bit for bit. Call it inside the learner's ``jit``."""
    check_replay_layout(buffer.capacity, batch_size, strata, mesh)
    local_strata = strata // mesh.devices.size
    spec = PartitionSpec(MESH_AXES)

    def local(data, size, key):
        first = jax.lax.axis_index(MESH_AXES) * local_strata
        sizes = stratum_sizes(size, buffer.capacity, strata, first, local_strata)
        return sample_strata(data, key, batch_size // strata, strata, sizes, first)

    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(jax.tree.map(lambda _: spec, buffer.data), PartitionSpec(), PartitionSpec()),
        out_specs=jax.tree.map(lambda _: spec, buffer.data),
        check_vma=False,
    )(buffer.data, buffer.size, key)


def sharded_replay_add_blocks(buffer: ReplayBuffer, transitions: Any, strata: int, mesh: Mesh) -> ReplayBuffer:
    """:func:`lpjax.replay.replay_add_blocks` of a buffer laid out by :func:`replay_shardings` and transitions split
    like :func:`batch_sharding`, computed where they are: device ``d`` holds blocks (and strata) ``d S / D .. (d + 1)
    S / D - 1`` of ``D`` devices, so each device writes its own rows into its own strata (``jax.shard_map``) and no
    transition crosses devices. The buffer equals ``replay_add_blocks(buffer, transitions, strata)`` on one device,
    bit for bit. Call it inside the learner's ``jit``."""
    devices = mesh.devices.size
    if strata % devices:
        raise ValueError(f"replay_shards ({strata}) must be a multiple of the mesh's {devices} device(s).")
    n = int(jax.tree.leaves(transitions)[0].shape[0])
    spec = PartitionSpec(MESH_AXES)

    def local(data, new, insert_pos):
        # Each device's strata are consecutive and insert_pos is a multiple of strata: the local buffer's insert
        # position insert_pos / devices is at the same slot of every stratum.
        local_buffer = ReplayBuffer(data, insert_pos // devices, jnp.zeros_like(insert_pos))  # size: not read
        return replay_add_blocks(local_buffer, new, strata // devices).data

    data = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(
            jax.tree.map(lambda _: spec, buffer.data),
            jax.tree.map(lambda _: spec, transitions),
            PartitionSpec(),
        ),
        out_specs=jax.tree.map(lambda _: spec, buffer.data),
        check_vma=False,
    )(buffer.data, transitions, buffer.insert_pos)
    return ReplayBuffer(
        data=data,
        insert_pos=(buffer.insert_pos + n) % buffer.capacity,
        size=jnp.minimum(buffer.size + n, buffer.capacity).astype(jnp.int32),
    )


def add_replay_blocks(buffer: ReplayBuffer, transitions: Any, strata: int, mesh: Mesh | None) -> ReplayBuffer:
    """:func:`sharded_replay_add_blocks` on a mesh, :func:`lpjax.replay.replay_add_blocks` without one (both store
    the same transitions in the same slots)."""
    if mesh is None:
        return replay_add_blocks(buffer, transitions, strata)
    return sharded_replay_add_blocks(buffer, transitions, strata, mesh)


def put_global(tree: Any, shardings: Any) -> Any:
    """``tree`` (values every process holds in full, e.g. a freshly initialized state) as global arrays with
    ``shardings``: each process places the slices its own devices hold (``jax.make_array_from_callback``), so it
    works across processes where ``jax.device_put`` of host data does not. PRNG keys keep their type."""

    def put(leaf, sharding):
        if _is_key(leaf):
            data = put(jax.random.key_data(leaf), sharding)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
        value = np.asarray(leaf)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    return jax.tree.map(put, tree, shardings)


def place(tree: Any, mesh: Mesh | None) -> Any:
    """A learner's state (values every process holds in full, e.g. freshly initialized) as global arrays laid out
    by :func:`learner_shardings` on ``mesh`` (``mesh=None``: unchanged)."""
    return tree if mesh is None else put_global(tree, learner_shardings(tree, mesh))


def put_replicated(tree: Any, mesh: Mesh | None) -> Any:
    """:func:`put_global` with every leaf replicated: a value every process holds (a transition, a chunk of them)
    as one global array (``mesh=None``: unchanged)."""
    return tree if mesh is None else put_global(tree, jax.tree.map(lambda _: replicated(mesh), tree))


def sample_replay(buffer: ReplayBuffer, key: jax.Array, batch_size: int, strata: int, mesh: Mesh | None) -> Any:
    """A learner's batch: :func:`sharded_replay_sample` on a mesh, :func:`lpjax.replay.replay_sample` without
    one (both draw the same transitions)."""
    if mesh is None:
        return replay_sample(buffer, key, batch_size, strata)
    return sharded_replay_sample(buffer, key, batch_size, strata, mesh)


def global_batch(batch: Any, mesh: Mesh) -> Any:
    """A batch whose rows are split like :func:`batch_sharding` from each process's rows (in process order):
    ``jax.make_array_from_process_local_data``. With one process it is ``jax.device_put`` onto the mesh."""
    return jax.tree.map(lambda rows: jax.make_array_from_process_local_data(batch_sharding(mesh), rows), batch)


class DispatchWindow:
    """Keeps at most ``steps`` jitted steps in flight: :meth:`push` each step's (small) outputs, and once more than
    ``steps`` are pending it blocks on the oldest. Never push a donated state (its buffers are reused).

    Why: JAX dispatches asynchronously, so a loop that does not read its results runs ahead of the devices. In
    jaxlib 0.10's XLA:CPU client, the launch of a multi-device program runs on the client's thread pool
    (``max(cores, devices)`` threads) and waits there for a per-device limit of 32 executions in flight. Once the
    host is more than 32 launches ahead, waiting launches hold the threads that the running program's collective
    needs for all its participants: it never completes, and XLA aborts after
    ``--xla_cpu_collective_call_terminate_timeout_seconds`` (raising it turns the abort into a hang, and
    ``jax_cpu_enable_async_dispatch=False`` applies to single-device programs only). The default of 8 steps leaves
    room for 4 multi-device programs per step. See ``docs/multi_device.md``.
    """

    def __init__(self, steps: int = 8):
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"DispatchWindow: steps must be a positive integer, got {steps!r}.")
        self.steps = steps
        self._pending: collections.deque = collections.deque()

    def push(self, outputs: Any) -> None:
        """Records a step's outputs; blocks on the oldest pending step's when more than ``steps`` are pending."""
        self._pending.append(outputs)
        if len(self._pending) > self.steps:
            jax.block_until_ready(self._pending.popleft())

    def drain(self) -> None:
        """Blocks until every pending step is done."""
        while self._pending:
            jax.block_until_ready(self._pending.popleft())


def initialize_distributed(
    coordinator_address: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> bool:
    """Joins this process to a multi-process JAX run (``jax.distributed.initialize``) when one is configured;
    returns whether it did.

    Each argument left ``None`` is read from :data:`DISTRIBUTED_ENV` (``JAX_COORDINATOR_ADDRESS``, e.g.
    ``10.0.0.1:1234``; ``JAX_NUM_PROCESSES``; ``JAX_PROCESS_ID``). Nothing set: a single-process run, nothing is
    done. A coordinator address without the process count and id is passed on as it is, and JAX detects the rest
    from the cluster (SLURM, Open MPI, Kubernetes, Cloud TPU). Call it before anything touches a device.
    """
    env = dict(zip(("coordinator_address", "num_processes", "process_id"), DISTRIBUTED_ENV, strict=True))
    values = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
    for name, variable in env.items():
        if values[name] is None and os.environ.get(variable):
            raw = os.environ[variable]
            values[name] = raw if name == "coordinator_address" else int(raw)
    if values["coordinator_address"] is None:
        if values["num_processes"] is not None or values["process_id"] is not None:
            raise ValueError("distributed: num_processes and process_id need a coordinator_address.")
        return False
    jax.distributed.initialize(**{k: v for k, v in values.items() if v is not None})
    return True
