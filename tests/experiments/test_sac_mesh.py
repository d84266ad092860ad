"""SAC's dm_control learner on a mesh of 4 forced CPU devices and on 2 processes (experiments.sac_loop +
lpjax.sharding): the same result as one device, a global loss-scaler skip, checkpoints across mesh shapes.

Each test runs its code in a subprocess (tests.multidevice): the forced device count is read when JAX starts.
"""

import pytest

from tests.multidevice import run_on_devices, run_processes

PRELUDE = """
import json, pathlib, shutil, tempfile
import jax, numpy as np
from jax.sharding import PartitionSpec as P
from experiments import sac_loop
from experiments.configs.sac import fp16, fp32
from tests.sac_configs import tiny_cartpole

TMP = pathlib.Path(tempfile.mkdtemp())

def config(base, mesh, total=300, fused=None, **overrides):
    # 4 replay strata whatever the mesh; 100 updates after 200 random steps; a checkpoint at the episode end (250)
    settings = dict(total_steps=total, replay_shards=4, checkpoint_every=200, eval_every=250)
    c = tiny_cartpole(base, **{**settings, **overrides})
    c.mesh.data, c.mesh.fsdp = mesh
    c.agent.fused_optimizer = mesh[1] == 1 if fused is None else fused  # FSDP shards the state leaf by leaf
    return c

def trained(run_dir):
    _, loop, step = sac_loop.load_run(run_dir)
    agent = loop.agent
    leaves = jax.tree.leaves((agent.actor.params, agent.critic.params, agent.target_critic, agent.temperature))
    return step, [np.asarray(x, np.float64) for x in leaves]

def relative_difference(a, b):
    return max(float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30)) for x, y in zip(a, b, strict=True))
"""


def test_data_parallel_and_fsdp_sac_match_one_device():
    result = run_on_devices(
        PRELUDE
        + """
returns, params = {}, {}
for name, mesh, strata in [("one", (1, 1), 4), ("data", (4, 1), 4), ("fsdp", (2, 2), 4), ("unstratified", (1, 1), 1)]:
    summary = sac_loop.train(config(fp32, mesh, replay_shards=strata), TMP / name, progress=False)
    returns[name] = summary["final_eval"]["return"]
    params[name] = trained(TMP / name)[1]
print(json.dumps({
    "returns": returns,
    **{name: relative_difference(params["one"], params[name]) for name in ("data", "fsdp", "unstratified")},
}))
""",
        devices=4,
        timeout=900,
    )
    # 100 float32 updates on the same batches: only the order of the all-reduced sums differs (float32 rounding)
    assert result["data"] < 1e-5 and result["fsdp"] < 1e-5, result
    # ... while other batches (one stratum) give another agent: the comparison sees a difference in the batches
    assert result["unstratified"] > 1e-3, result
    returns = result["returns"]
    assert returns["data"] == pytest.approx(returns["one"], rel=1e-4)
    assert returns["fsdp"] == pytest.approx(returns["one"], rel=1e-4)


def test_fp16_state_is_sharded_like_its_parameters_and_the_replay_split_over_devices():
    result = run_on_devices(
        PRELUDE
        + """
from experiments.devices import learner_mesh
from lpjax.sharding import fsdp_spec
c = config(fp16, (2, 2))
learner = sac_loop.HostLearner(c, sac_loop.validate(c), learner_mesh(c))
agent, replay = learner.loop.agent, learner.loop.replay
specs = {}
for tree_name in ("actor", "critic"):
    trainable = getattr(agent, tree_name)
    param_specs = {leaf.shape: leaf.sharding.spec for leaf in jax.tree.leaves(trainable.params) if leaf.ndim == 2}
    states = [leaf for leaf in jax.tree.leaves(trainable.opt_state) if getattr(leaf, "shape", None) in param_specs]
    specs[tree_name] = {
        "sharded_params": sum(spec != P() for spec in param_specs.values()),
        "state_leaves": len(states),
        "state_like_params": all(leaf.sharding.spec == param_specs[leaf.shape] for leaf in states),
    }
compensation = [leaf for leaf in jax.tree.leaves(agent.target_compensation) if leaf.ndim == 2]
print(json.dumps({
    "specs": specs,
    "target_compensation_like_target": all(
        leaf.sharding.spec == fsdp_spec(leaf.shape, 2) for leaf in compensation) and len(compensation) > 0,
    "replay_shard_rows": sorted(
        {shard.data.shape[0] for leaf in jax.tree.leaves(replay.data) for shard in leaf.addressable_shards}),
    "replay_devices": len(replay.data["obs"].addressable_shards),
    "key_replicated": agent.key.sharding.is_fully_replicated,
    "scale_replicated": all(
        leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(agent.critic.opt_state) if leaf.ndim == 0),
}))
""",
        devices=4,
    )
    for name in ("actor", "critic"):
        specs = result["specs"][name]
        # every 32x32 (and 32-row) weight is split over fsdp; Adam/hAdam moments and Kahan buffers follow it
        assert specs["sharded_params"] >= 2 and specs["state_leaves"] >= 2 * specs["sharded_params"], result
        assert specs["state_like_params"], result
    assert result["target_compensation_like_target"], result
    assert result["replay_shard_rows"] == [500 // 4] and result["replay_devices"] == 4, result
    assert result["key_replicated"] and result["scale_replicated"], result


def test_an_inf_in_one_devices_rows_skips_the_step_on_every_device():
    result = run_on_devices(
        PRELUDE
        + """
from lpjax.agents import sac
from lpjax.sharding import global_batch, make_mesh, put_global, state_shardings
agent_config = sac.SACConfig.from_mapping(config(fp16, (4, 1)).agent.to_dict())
mesh = make_mesh(4, 1)
rng = np.random.default_rng(0)
batch = {
    "obs": rng.normal(size=(32, 5)).astype(np.float32),
    "action": rng.uniform(-1, 1, size=(32, 1)).astype(np.float32),
    "reward": rng.uniform(size=32).astype(np.float32),
    "discount": np.ones(32, np.float32),
    "next_obs": rng.normal(size=(32, 5)).astype(np.float32),
}
batch["reward"][8:16] = np.inf  # rows 8..15: the second device's share
def fresh():
    state = sac.init(jax.random.key(0), np.zeros(5, np.float32), 1, agent_config)
    return put_global(state, state_shardings(state, mesh))
before = jax.device_get(fresh().critic)
state, metrics = sac.update(fresh(), global_batch(batch, mesh))
shards_unchanged = [
    all(np.array_equal(np.asarray(shard.data), np.asarray(old)) for shard in new.addressable_shards)
    for new, old in zip(jax.tree.leaves(state.critic.params), jax.tree.leaves(before.params), strict=True)
]
scale = [float(shard.data) for shard in metrics["critic_loss_scale"].addressable_shards]
clean = dict(batch, reward=np.zeros(32, np.float32))
stepped, _ = sac.update(fresh(), global_batch(clean, mesh))
moved = any(not np.array_equal(np.asarray(a), np.asarray(b))
            for a, b in zip(jax.tree.leaves(stepped.critic.params), jax.tree.leaves(before.params)))
print(json.dumps({
    "unchanged": all(shards_unchanged), "shards": len(jax.tree.leaves(state.critic.params)[0].addressable_shards),
    "scales": scale, "initial_scale": agent_config.methods.init_scale, "clean_step_moves": moved,
    "loss": float(metrics["critic_loss"]),
}))
""",
        devices=4,
    )
    assert result["shards"] == 4
    assert result["unchanged"], result  # the critic's step was skipped on all four devices
    assert result["scales"] == [result["initial_scale"] / 2] * 4, result  # backed off once, the same everywhere
    assert result["clean_step_moves"], result  # the same step without the inf changes the critic


@pytest.mark.slow
def test_a_checkpoint_restores_onto_other_mesh_shapes():
    result = run_on_devices(
        PRELUDE
        + """
# The optimizer's layout is part of the run: a run FSDP may resume keeps its state per leaf from the start.
whole = sac_loop.train(config(fp32, (1, 1), total=400, fused=False), TMP / "whole", progress=False)
sac_loop.train(config(fp32, (4, 1), total=250, fused=False), TMP / "first", progress=False)
out = {}
for name, mesh in [("fsdp", (2, 2)), ("one", (1, 1))]:
    shutil.copytree(TMP / "first", TMP / name)
    summary = sac_loop.train(config(fp32, mesh, total=400, fused=False), TMP / name, resume=True, progress=False)
    step, params = trained(TMP / name)
    out[name] = {"step": step, "difference": relative_difference(trained(TMP / "whole")[1], params),
                 "return": summary["final_eval"]["return"]}
out["whole_return"] = whole["final_eval"]["return"]
print(json.dumps(out))
""",
        devices=4,
        timeout=900,
    )
    for name in ("fsdp", "one"):
        # saved at 250 on 4 devices, resumed on (2, 2) and on one device: the uninterrupted run, to rounding
        assert result[name]["step"] == 400, result
        assert result[name]["difference"] < 1e-5, result
        assert result[name]["return"] == pytest.approx(result["whole_return"], rel=1e-4)


MULTIPROCESS = """
import json, os, pathlib, tempfile
import jax, numpy as np
from experiments import sac_loop
from experiments.configs.sac import fp32
from tests.sac_configs import tiny_cartpole

run_dir = pathlib.Path(os.environ["RUN_DIR"])  # one directory for every process (a shared filesystem)
c = tiny_cartpole(fp32, total_steps=250, replay_shards=4, checkpoint_every=200)
c.mesh.data = 4  # joins the processes named by JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID
first = sac_loop.train(c, run_dir, progress=False)
c.total_steps = 300
second = sac_loop.train(c, run_dir, resume=True, progress=False)
agent = sac_loop.load_run(run_dir)[1].agent
params = [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves((agent.actor.params, agent.critic.params))]
print(json.dumps({
    "processes": jax.process_count(), "devices": jax.device_count(), "local": jax.local_device_count(),
    "steps": [first["env_steps"], second["env_steps"]], "return": second["final_eval"]["return"],
    "sum": [float(p.sum()) for p in params], "first": [float(p.ravel()[0]) for p in params],
}))
"""


@pytest.mark.slow
def test_two_processes_of_two_devices_train_checkpoint_and_resume_like_one_process_of_four(tmp_path):
    one = run_on_devices(MULTIPROCESS, devices=4, timeout=600, env={"RUN_DIR": str(tmp_path / "one")})
    both = run_processes(MULTIPROCESS, 2, devices_per_process=2, timeout=600, env={"RUN_DIR": str(tmp_path / "two")})
    assert [(r["processes"], r["devices"], r["local"]) for r in both] == [(2, 4, 2), (2, 4, 2)]
    assert (one["processes"], one["devices"]) == (1, 4)
    for result in both:
        assert result["steps"] == one["steps"] == [250, 300]
        assert result["sum"] == pytest.approx(one["sum"], rel=1e-5, abs=1e-5)
        assert result["first"] == pytest.approx(one["first"], rel=1e-5, abs=1e-6)
        assert result["return"] == pytest.approx(one["return"], rel=1e-4)
    # the first process logs into the run directory, the second into its own; the checkpoints are shared
    assert (tmp_path / "two" / "metrics.csv").is_file() and (tmp_path / "two" / "process1" / "metrics.csv").is_file()
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == ["250", "300"]
