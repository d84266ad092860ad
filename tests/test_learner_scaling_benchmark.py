"""benchmarks/learner_scaling.py: a --quick run into a temporary directory (workers with forced host devices), its
byte counts checked against hand counts and the sharding rule's consequences, and the committed results' shape."""

import json
import math
import os

import jax
import pytest

from benchmarks import learner_scaling as bench
from benchmarks.common import RESULTS

COMMITTED = RESULTS / f"{bench.RESULT_NAME}.json"
OBS, ACT, WIDTH = 24, 6, 1024  # the paper's SAC sizes the benchmark counts (bench.SAC_SIZES)
TRANSITION_FLOATS = OBS + ACT + 1 + 1 + OBS  # obs, action, reward, discount, next_obs
REPLAY_COUNTERS = 2 * 4  # insert_pos and size, int32, replicated


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("learner_scaling")
    result = bench.main(["--quick", "--jobs", "4", "--out-dir", str(out)])
    assert (out / "learner_scaling.png").stat().st_size > 0
    data = json.loads((out / "learner_scaling.json").read_text())
    assert data == json.loads(json.dumps(result))
    return data


def _rows(recorded, learner):
    return {(row["data"], row["fsdp"]): row for row in recorded["bytes_per_device"][learner]["meshes"]}


def _sac_param_bytes(fsdp: int) -> int:
    """SAC fp16's parameters on one device, by hand: float16 kernels split ``fsdp`` ways along their largest axis
    (here always divisible), float16 biases replicated, float32 log-temperature."""
    actor = [(OBS, WIDTH), (WIDTH, WIDTH), (WIDTH, 2 * ACT)]  # mean and log-std heads
    q = [(OBS + ACT, WIDTH), (WIDTH, WIDTH), (WIDTH, 1)]
    kernels = sum(i * o for i, o in actor + 2 * q)
    biases = sum(o for _, o in actor + 2 * q)
    return (kernels // fsdp + biases) * 2 + 4


def test_note_and_machine(recorded):
    note = recorded["note"]
    assert f"share this machine's {os.cpu_count()} CPU cores" in note
    assert "partitioning" in note and "not speed-ups" in note
    machine = recorded["machine"]
    assert machine["cpu_count"] == os.cpu_count() and machine["platform"]
    assert machine["jax"] == jax.__version__ and machine["jax_backend"] == "cpu"
    assert machine["forced_host_devices"] == bench.FORCED_DEVICES == len(machine["devices"])
    assert recorded["quick"] is True and recorded["meshes"] == [list(m) for m in bench.MESHES]
    assert "--xla_force_host_platform_device_count=2" in recorded["settings"]["worker_xla_flags"]["2"]


def test_sac_bytes_match_hand_counts(recorded):
    rows = _rows(recorded, "sac_fp16")
    replay = bench.SAC_SIZES["replay_capacity"] * TRANSITION_FLOATS * 4
    for (data, fsdp), row in rows.items():
        c = row["components"]
        assert c["params"] == _sac_param_bytes(fsdp)
        assert c["replay"] == replay // (data * fsdp) + REPLAY_COUNTERS
        assert c["batch"] == bench.SAC_SIZES["batch_size"] * TRANSITION_FLOATS * 4 // (data * fsdp)
        # fp16 with the paper's methods: hAdam's two moments and the Kahan-gradient buffer per network
        # parameter, plus small scalars (loss scaler, counts, the temperature's float32 Adam).
        kernels_and_biases = _sac_param_bytes(fsdp) - 4
        assert 3 * kernels_and_biases <= c["optimizer"] <= 3 * kernels_and_biases + 200
        assert row["total"] == sum(c.values()) and row["state"] == sum(c[k] for k in bench.STATE_COMPONENTS)


@pytest.mark.parametrize("learner", bench.LEARNERS)
def test_data_parallel_replicates_the_state_and_splits_replay_and_batch(recorded, learner):
    rows = _rows(recorded, learner)
    base = rows[(1, 1)]["components"]
    for devices in (2, 4):
        c = rows[(devices, 1)]["components"]
        for part in bench.STATE_COMPONENTS:
            assert c[part] == base[part], (part, devices)
        if base["replay"]:
            assert c["replay"] - REPLAY_COUNTERS == pytest.approx((base["replay"] - REPLAY_COUNTERS) / devices)
            assert rows[(devices, 1)]["ratio_vs_1x1"]["replay"] == pytest.approx(1 / devices, rel=1e-6)
        assert c["batch"] == pytest.approx(base["batch"] / devices)


@pytest.mark.parametrize("learner", bench.LEARNERS)
def test_fsdp_splits_the_state(recorded, learner):
    rows = _rows(recorded, learner)
    for fsdp, bound in ((2, 0.55), (4, 0.3)):
        ratio = rows[(1, fsdp)]["ratio_vs_1x1"]
        for part in ("params", "optimizer"):
            # Matrices split fsdp ways, vectors and scalars replicated: a little above 1 / fsdp.
            assert 1 / fsdp <= ratio[part] <= bound, (part, fsdp, ratio[part])
        assert ratio["state"] <= bound
    # The data axis replicates the state: 2 x 2 holds what 1 x 2 does, and the replay of 4 devices.
    assert rows[(2, 2)]["state"] == rows[(1, 2)]["state"]
    assert rows[(2, 2)]["components"]["replay"] == rows[(4, 1)]["components"]["replay"]


def test_big_grpo_model_halves_with_fsdp(recorded):
    learner = recorded["bytes_per_device"]["grpo_fp16"]
    assert learner["config"]["model"]["d_model"] == 512 and learner["config"]["model"]["num_layers"] == 8
    assert learner["param_count"] > 20_000_000
    rows = _rows(recorded, "grpo_fp16")
    assert rows[(1, 2)]["components"]["params"] <= 0.55 * rows[(1, 1)]["components"]["params"]
    assert rows[(1, 2)]["total"] <= 0.55 * rows[(1, 1)]["total"]
    assert rows[(1, 1)]["components"]["replay"] == 0 and rows[(1, 1)]["components"]["targets"] == 0


@pytest.mark.parametrize(
    ("workload", "mesh"), [("sac_update", lambda n: (n, 1)), ("grpo_train_step", lambda n: (1, n))]
)
def test_step_times(recorded, workload, mesh):
    runs = recorded["step_time"][workload]["runs"]
    assert [run["devices"] for run in runs] == list(bench.STEP_DEVICES)
    for run in runs:
        assert (run["data"], run["fsdp"]) == mesh(run["devices"])
        assert math.isfinite(run["median_ms"]) and 0 < run["min_ms"] <= run["median_ms"] <= run["max_ms"]
        assert run["compiles_in_warmup"] >= 1 and run["compiles_while_timing"] == 0
        assert run["last_step_finite"] and run["first_call_s"] > 0
        assert run["ratio_vs_1_device"] == pytest.approx(run["median_ms"] / runs[0]["median_ms"])
        # Same initial state and batch on every mesh: the first step's losses differ by the order of sums only.
        for name, value in runs[0]["first_step"].items():
            if math.isfinite(value):
                assert run["first_step"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
        # The state leaves the step with the layout state_shardings gave it (SAC: replicated; GRPO: constrained).
        assert run["sharding_drift"] == []


def test_committed_results_have_the_expected_structure():
    data = json.loads(COMMITTED.read_text())
    assert COMMITTED.with_suffix(".png").stat().st_size > 0
    assert data["benchmark"] == bench.RESULT_NAME and data["quick"] is False
    assert "forced host devices" in data["note"] and "not speed-ups" in data["note"]
    for key in ("cpu_count", "platform", "jax", "devices"):
        assert data["machine"][key], key
    assert data["meshes"] == [list(m) for m in bench.MESHES]
    assert set(data["components"]) == set(bench.COMPONENTS)
    assert set(data["bytes_per_device"]) == set(bench.LEARNERS)
    for learner in data["bytes_per_device"].values():
        assert [(r["data"], r["fsdp"]) for r in learner["meshes"]] == list(bench.MESHES)
        for row in learner["meshes"]:
            assert set(row["components"]) == set(bench.COMPONENTS)
            assert row["total"] == sum(row["components"].values())
    assert data["bytes_per_device"]["grpo_fp16"]["config"]["model"]["d_model"] == 512
    assert set(data["step_time"]) == {"sac_update", "grpo_train_step"}
    for entry in data["step_time"].values():
        assert [run["devices"] for run in entry["runs"]] == list(bench.STEP_DEVICES)
        assert all(run["median_ms"] > 0 and run["compiles_while_timing"] == 0 for run in entry["runs"])


def test_bytes_per_device_reads_shapes_only_and_counts_keys_as_their_words():
    import jax.numpy as jnp

    from lpjax import sharding

    state = {"w": jnp.ones((8, 6), jnp.float16), "b": jnp.ones(6), "key": jax.random.key(0)}
    shardings = sharding.state_shardings(state, sharding.make_mesh())
    expected = 8 * 6 * 2 + 6 * 4 + 2 * 4
    assert bench.bytes_per_device(state, shardings) == expected
    assert bench.bytes_per_device(jax.eval_shape(lambda: state), shardings) == expected


def test_bytes_per_device_counts_one_device_share_of_an_fsdp_mesh():
    from tests.multidevice import run_on_devices

    result = run_on_devices(
        """
import json
import jax, jax.numpy as jnp
from benchmarks.learner_scaling import bytes_per_device
from lpjax import sharding
mesh = sharding.make_mesh(1, 4)
state = {"w": jnp.ones((8, 16)), "m": jnp.ones((8, 16)), "b": jnp.ones(16), "key": jax.random.key(0)}
placed = sharding.put_global(state, sharding.state_shardings(state, mesh))
print(json.dumps({"bytes": bytes_per_device(placed, sharding.state_shardings(placed, mesh))}))
""",
        devices=4,
    )
    assert result["bytes"] == (2 * 8 * 4 + 16) * 4 + 8  # w and m split 4 ways, b and the key replicated
