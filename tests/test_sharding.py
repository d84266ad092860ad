"""lpjax.sharding: meshes, the FSDP rule, replay layout, joining processes.

The tests that need several devices run in a subprocess with forced CPU devices (tests.multidevice).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from lpjax import sharding
from tests.multidevice import run_on_devices


@pytest.mark.parametrize(
    ("shape", "fsdp", "spec"),
    [
        ((64, 32), 1, P()),  # data parallel: everything replicated
        ((64, 32), 2, P("fsdp")),  # the largest divisible axis
        ((32, 64), 4, P(None, "fsdp")),
        ((6, 8), 4, P(None, "fsdp")),  # 6 is not divisible by 4
        ((6, 10), 4, P()),  # no axis divisible
        ((64,), 2, P()),  # vectors (biases, norms) stay replicated
        ((), 2, P()),  # scalars: counters, the loss scale
        ((16, 16), 2, P("fsdp")),  # a tie: the first axis
    ],
)
def test_fsdp_spec_splits_the_largest_divisible_axis_of_matrices(shape, fsdp, spec):
    assert sharding.fsdp_spec(shape, fsdp) == spec


def test_a_one_by_one_mesh_uses_the_first_device_and_bad_meshes_say_why():
    mesh = sharding.make_mesh()
    assert mesh.devices.shape == (1, 1) and mesh.axis_names == sharding.MESH_AXES
    with pytest.raises(ValueError, match="force devices"):
        sharding.make_mesh(data=4)
    with pytest.raises(ValueError, match="positive integer"):
        sharding.make_mesh(data=0)
    with pytest.raises(ValueError, match="Unknown mesh config keys"):
        sharding.mesh_from_config({"model": 2})


def test_replay_layout_needs_strata_that_fit_the_devices_the_capacity_and_the_batch():
    sharding.check_replay_layout(capacity=100, batch_size=8, strata=4, mesh=None)
    with pytest.raises(ValueError, match=r"replay_shards \(3\)"):
        sharding.check_replay_layout(capacity=100, batch_size=8, strata=3, mesh=None)


def test_initialize_distributed_reads_the_environment_and_does_nothing_without_a_coordinator(monkeypatch):
    for name in sharding.DISTRIBUTED_ENV:
        monkeypatch.delenv(name, raising=False)
    assert sharding.initialize_distributed() is False
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    with pytest.raises(ValueError, match="coordinator_address"):
        sharding.initialize_distributed()
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    assert sharding.initialize_distributed(num_processes=4) is True
    assert calls == [{"coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 1}]


def test_on_four_devices_the_replay_is_sampled_where_it_lies_and_equals_one_device():
    result = run_on_devices(
        """
import json
import jax, jax.numpy as jnp, numpy as np
from lpjax import sharding
from lpjax.replay import replay_add, replay_init, replay_sample

buffer = replay_init({"x": jnp.zeros([], jnp.int32), "v": jnp.zeros(3)}, 64)
for i in range(45):
    buffer = replay_add(buffer, {"x": jnp.asarray([i], jnp.int32), "v": jnp.full((1, 3), i, jnp.float32)}, 8)
key = jax.random.key(3)
expected = replay_sample(buffer, key, 16, strata=8)
out = {}
for data, fsdp in [(4, 1), (2, 2)]:
    mesh = sharding.make_mesh(data, fsdp)
    placed = sharding.put_global(buffer, sharding.learner_shardings({"replay": buffer}, mesh)["replay"])
    sample = jax.jit(lambda b, k: sharding.sharded_replay_sample(b, k, 16, 8, mesh))
    batch = sample(placed, key)
    hlo = sample.lower(placed, key).compile().as_text()
    device_rows = [sorted(int(v) % 8 for v in np.asarray(s.data)) for s in batch["x"].addressable_shards]
    out[f"{data}x{fsdp}"] = {
        "equal": all(np.array_equal(batch[k], expected[k]) for k in expected),
        "strata_per_device": [sorted(set(rows)) for rows in device_rows],
        "moves_transitions": any(op in hlo for op in ("all-gather", "all-to-all", "collective-permute")),
    }
print(json.dumps(out))
""",
        devices=4,
    )
    for mesh in ("4x1", "2x2"):
        assert result[mesh]["equal"], result  # bit-identical to sampling the whole buffer on one device
        # device d trains on the rows of strata 2d and 2d + 1 (transition i lies in stratum i mod 8) ...
        assert result[mesh]["strata_per_device"] == [[0, 1], [2, 3], [4, 5], [6, 7]], result
        # ... which it holds: no transition crosses devices
        assert not result[mesh]["moves_transitions"], result


def test_on_four_devices_blocks_of_transitions_are_added_where_they_lie_and_equal_one_device():
    result = run_on_devices(
        """
import json
import jax, jax.numpy as jnp, numpy as np
from lpjax import sharding
from lpjax.replay import replay_add_blocks, replay_init

example = {"x": jnp.zeros([], jnp.int32), "v": jnp.zeros(3)}
batches = [{"x": jnp.arange(16 * k, 16 * k + 16, dtype=jnp.int32), "v": jnp.full((16, 3), k, jnp.float32)}
           for k in range(5)]  # 80 transitions into 64 slots: the last add wraps
expected = replay_init(example, 64)
for batch in batches:
    expected = replay_add_blocks(expected, batch, 8)
out = {}
for data, fsdp in [(4, 1), (2, 2)]:
    mesh = sharding.make_mesh(data, fsdp)
    buffer = replay_init(example, 64)
    buffer = sharding.put_global(buffer, sharding.learner_shardings({"replay": buffer}, mesh)["replay"])
    add = jax.jit(lambda b, t: sharding.add_replay_blocks(b, t, 8, mesh), donate_argnums=0)
    for batch in batches:
        buffer = add(buffer, sharding.global_batch(batch, mesh))
    hlo = add.lower(buffer, sharding.global_batch(batches[0], mesh)).compile().as_text()
    out[f"{data}x{fsdp}"] = {
        "equal": all(np.array_equal(buffer.data[k], expected.data[k]) for k in example),
        "counters": [int(buffer.insert_pos), int(buffer.size)] == [int(expected.insert_pos), int(expected.size)],
        "device_blocks": [
            sorted({int(v) % 16 // 2 for v in np.asarray(s.data)}) for s in buffer.data["x"].addressable_shards
        ],
        "collectives": any(op in hlo for op in ("all-gather", "all-to-all", "collective-permute", "all-reduce")),
    }
print(json.dumps(out))
""",
        devices=4,
    )
    for mesh in ("4x1", "2x2"):
        assert result[mesh]["equal"] and result[mesh]["counters"], result  # the one-device buffer, bit for bit
        # device d holds blocks (and strata) 2d and 2d + 1, the transitions of its own rows of each batch ...
        assert result[mesh]["device_blocks"] == [[0, 1], [2, 3], [4, 5], [6, 7]], result
        assert not result[mesh]["collectives"], result  # ... written there: nothing crosses devices


def test_state_shardings_replicate_keys_and_follow_shapes():
    result = run_on_devices(
        """
import json
import jax, jax.numpy as jnp
from lpjax import sharding
mesh = sharding.make_mesh(1, 4)
state = {"w": jnp.ones((8, 16)), "m": jnp.ones((8, 16)), "b": jnp.ones(16), "key": jax.random.key(0)}
placed = sharding.put_global(state, sharding.state_shardings(state, mesh))
print(json.dumps({
    name: [list(leaf.sharding.spec), [list(s.data.shape) for s in leaf.addressable_shards][:1]]
    for name, leaf in placed.items() if name != "key"
} | {"key": placed["key"].sharding.is_fully_replicated}))
""",
        devices=4,
    )
    assert result["w"] == result["m"] == [[None, "fsdp"], [[8, 4]]]
    assert result["b"] == [[], [[16]]]
    assert result["key"] is True


def test_global_batch_splits_rows_over_every_device():
    batch = {"x": np.arange(8, dtype=np.float32)}
    placed = sharding.global_batch(batch, sharding.make_mesh())
    np.testing.assert_array_equal(placed["x"], batch["x"])
    assert placed["x"].sharding.spec == P(sharding.MESH_AXES)


def test_fsdp_sharded_optimizer_states_and_roundings_equal_one_device():
    # fp16 parameters updated by hAdam with 8-bit moments (stochastic codes), compound loss scaling and stochastic
    # rounding, 3 steps on a (1, 4) mesh and on one device: every random draw (the roundings, the moment codes)
    # must be the same, whatever slice of a leaf a device holds
    result = run_on_devices(
        """
import json
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import NamedSharding, PartitionSpec
from experiments.configs.sac import fp16_sr_8bit
from lpjax.methods import PrecisionMethods, method_optimizer
from lpjax import sharding

methods = PrecisionMethods.from_mapping(fp16_sr_8bit.get_config().agent.methods.to_dict())
tx = method_optimizer(1e-3, methods, rounding_seed=1)
rng = np.random.default_rng(0)
params = {"w": jnp.asarray(rng.normal(size=(64, 48)), jnp.float16), "b": jnp.zeros(48, jnp.float16)}
grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=(3,) + p.shape) * 100, jnp.float16), params)

@jax.jit
def train(params, state, grads):
    def step(carry, g):
        params, state = carry
        updates, state = tx.update(g, state, params)
        return (optax.apply_updates(params, updates), state), None
    return jax.lax.scan(step, (params, state), grads)[0]

one = train(params, tx.init(params), grads)
mesh = sharding.make_mesh(1, 4)
placed = sharding.put_global(params, sharding.state_shardings(params, mesh))
state = tx.init(placed)
state = sharding.put_global(state, sharding.state_shardings(state, mesh))
steps = jax.tree.map(lambda g: NamedSharding(mesh, PartitionSpec(None, *sharding.fsdp_spec(g.shape[1:], 4))), grads)
four = train(placed, state, sharding.put_global(grads, steps))
leaves = []
for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(four), strict=True):
    a, b = np.asarray(a), np.asarray(b)
    exact = a.dtype != np.float32  # parameters, 8-bit codes, keys, counters
    close = bool(np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-6, atol=0))
    leaves.append({"dtype": str(a.dtype), "equal": bool(np.array_equal(a, b)), "close": close, "exact": exact})
moved = not np.array_equal(np.asarray(one[0]["w"]), np.asarray(params["w"]))
print(json.dumps({"leaves": leaves, "moved": moved, "spec": list(four[0]["w"].sharding.spec)}))
""",
        devices=4,
    )
    assert result["spec"] == ["fsdp"] and result["moved"], result
    dtypes = {leaf["dtype"] for leaf in result["leaves"]}
    assert {"float16", "float8_e4m3fn", "uint32"} <= dtypes, dtypes
    for leaf in result["leaves"]:
        # the float16 parameters, the 8-bit codes and the keys bit for bit; the float32 block scales and loss scale
        # to float32 rounding (XLA fuses the two programs' moment updates differently)
        assert leaf["equal"] if leaf["exact"] else leaf["close"], result


DISPATCH_LOOP = """
import json
import jax, jax.numpy as jnp
from lpjax.sharding import DispatchWindow, batch_sharding, make_mesh, replicated

mesh = make_mesh(data=4)
w = jax.device_put(jnp.zeros((64, 64)), replicated(mesh))
x = jax.device_put(jnp.ones((256, 64)), batch_sharding(mesh))

def step(w, x):  # the gradient is an all-reduce over the 4 devices; isfinite is a global decision
    value, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - 1.0) ** 2))(w)
    return jnp.where(jnp.all(jnp.isfinite(grad)), w - 1e-2 * grad, w), value

step = jax.jit(step, donate_argnums=0)
window = DispatchWindow()
for _ in range(300):  # never read: without the window the host runs 300 steps ahead
    w, value = step(w, x)
    window.push(value)
window.drain()
print(json.dumps({"loss": float(value), "pending": len(window._pending)}))
"""


def test_a_dispatch_window_keeps_an_unread_sharded_loop_from_deadlocking_its_collectives():
    # on jaxlib 0.10.2 (make test-oldest) the same loop without the window aborts with "Termination timeout for
    # all reduce" after 33 steps; short collective timeouts make a deadlock fail in seconds instead of minutes
    timeouts = {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4 "
        "--xla_cpu_collective_call_warn_stuck_timeout_seconds=5 "
        "--xla_cpu_collective_call_terminate_timeout_seconds=15"
    }
    result = run_on_devices(DISPATCH_LOOP, devices=4, timeout=120, env=timeouts)
    assert np.isfinite(result["loss"]) and result["pending"] == 0


def test_a_dispatch_window_blocks_on_the_oldest_step_only_past_its_size():
    window = sharding.DispatchWindow(steps=2)
    for i in range(5):
        window.push(jnp.asarray(i))
        assert len(window._pending) == min(i + 1, 2)
    window.drain()
    assert not window._pending
    with pytest.raises(ValueError, match="positive integer"):
        sharding.DispatchWindow(steps=0)


def test_without_a_mesh_placing_and_replicating_leave_values_as_they_are():
    tree = {"w": np.ones((2, 3), np.float32)}
    assert sharding.place(tree, None) is tree
    assert sharding.put_replicated(tree, None) is tree
    placed = sharding.place(tree, sharding.make_mesh())
    np.testing.assert_array_equal(placed["w"], tree["w"])
    assert placed["w"].sharding.spec == P()
