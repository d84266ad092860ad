"""D4PG's learner (experiments.d4pg_loop) data parallel on a mesh of 4 forced CPU devices: the same updates as one
device, and a real actor-learner run (in-process actors) that checkpoints on 4 devices and resumes on one.

Each test runs its code in a subprocess (tests.multidevice): the forced device count is read when JAX starts.
"""

import math

import pytest

from tests.multidevice import run_on_devices, run_processes

PRELUDE = """
import json
import jax, numpy as np
import lpjax.envs
from experiments import d4pg_loop
from experiments.configs.d4pg import fp32
from experiments.devices import learner_mesh

def learner(mesh, strata):
    config = fp32.get_config()
    config.update(env="dmc:cartpole-balance", replay_capacity=256, min_replay_size=32)
    config.agent.update(actor_hidden=(32, 32), critic_hidden=(32, 32), batch_size=32, num_atoms=11)
    config.mesh.data, config.mesh.fsdp = mesh
    config.agent.fused_optimizer = mesh[1] == 1  # FSDP shards the optimizer state leaf by leaf
    mesh = learner_mesh(config)  # joins the processes (if any) before JAX computes anything
    agent = d4pg_loop.validate(config)
    env = lpjax.envs.make(config.env, seed=0)
    state = d4pg_loop.init_learner(config, agent, env)
    return d4pg_loop.D4PGLearner(state, "fp32", strata, mesh), env

rng = np.random.default_rng(0)
chunks = []
for _ in range(6):
    obs = rng.normal(size=(16, 5)).astype(np.float32)
    chunks.append({"obs": obs, "action": rng.uniform(-1, 1, (16, 1)).astype(np.float32),
                   "reward": rng.uniform(size=16).astype(np.float32), "discount": np.full(16, 0.99, np.float32),
                   "next_obs": obs + 0.1})

def trained(mesh, strata):
    l, _ = learner(mesh, strata)
    for chunk in chunks:  # 30 updates, never read (the learner's dispatch window bounds them)
        l.insert(chunk)
        for _ in range(5):
            l.update()
    return l
"""

LEARNER = (
    PRELUDE
    + """
params = {}
for name, mesh, strata in [("one", (1, 1), 4), ("data", (4, 1), 4), ("fsdp", (2, 2), 4), ("unstratified", (1, 1), 1)]:
    l = trained(mesh, strata)
    agent = l.state.agent
    params[name] = [np.asarray(x, np.float64) for x in jax.tree.leaves((agent.actor.params, agent.critic.params))]
    if name == "fsdp":
        specs = [leaf.sharding.spec for leaf in jax.tree.leaves(agent.critic.params)]
        sharded = sum(spec != jax.sharding.PartitionSpec() for spec in specs)
        replay_rows = {s.data.shape[0] for s in l.state.replay.data["obs"].addressable_shards}

def difference(a, b):
    return max(float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30)) for x, y in zip(a, b))

print(json.dumps({name: difference(params["one"], params[name]) for name in ("data", "fsdp", "unstratified")}
                 | {"sharded": sharded, "replay_rows": sorted(replay_rows)}))
"""
)

ON_FOUR_DEVICES = (
    PRELUDE
    + """
from experiments.configs.d4pg import demo
agent = trained((4, 1), 4).state.agent  # one process of 4 devices, or 2 processes of 2
params = [np.asarray(x, np.float64) for x in jax.tree.leaves((agent.actor.params, agent.critic.params))]
refusal = None
if jax.process_count() > 1:
    c = demo.get_config()
    c.mesh.data = 4
    try:
        d4pg_loop.train(c, "/nonexistent/run", progress=False)
    except ValueError as error:
        refusal = str(error)
print(json.dumps({"processes": jax.process_count(), "sum": [float(p.sum()) for p in params], "refusal": refusal}))
"""
)


def test_the_data_parallel_learner_makes_the_updates_of_one_device():
    result = run_on_devices(LEARNER, devices=4)
    assert result["data"] < 1e-5 and result["fsdp"] < 1e-5, result  # 30 updates: float32 all-reduce rounding
    assert result["unstratified"] > 1e-3, result  # other batches: another learner
    assert result["sharded"] >= 2 and result["replay_rows"] == [256 // 4], result


def test_an_actor_learner_run_on_four_devices_resumes_on_one():
    result = run_on_devices(
        """
import json, pathlib, shutil, tempfile
from experiments import d4pg_loop
from experiments.configs.d4pg import demo

def config(mesh, total):
    c = demo.get_config()
    c.update(total_env_steps=total, min_replay_size=200, eval_every=600, eval_episodes=1, checkpoint_every=600,
             backend="inprocess")
    c.agent.update(actor_hidden=(32, 32), critic_hidden=(32, 32), batch_size=32, num_atoms=11)
    c.mesh.data, c.mesh.fsdp = mesh
    c.agent.fused_optimizer = mesh[1] == 1  # FSDP shards the optimizer state leaf by leaf
    return c

tmp = pathlib.Path(tempfile.mkdtemp())
first = d4pg_loop.train(config((4, 1), 600), tmp / "run", progress=False)
second = d4pg_loop.train(config((1, 1), 1200), tmp / "run", resume=True, progress=False)
print(json.dumps({"first": [first["status"], first["env_steps"], first["updates"]],
                  "second": [second["status"], second["env_steps"], second["updates"]],
                  "return": second["final_eval"]["return"]}))
""",
        devices=4,
        timeout=600,
    )
    assert result["first"][:2] == ["finished", 600] and result["first"][2] > 0, result
    assert result["second"][:2] == ["finished", 1200] and result["second"][2] > result["first"][2], result
    assert math.isfinite(result["return"]), result  # an evaluation after the resume


def test_two_processes_of_two_devices_learn_like_one_of_four_and_the_actor_learner_run_stays_in_one():
    one = run_on_devices(ON_FOUR_DEVICES, devices=4)
    both = run_processes(ON_FOUR_DEVICES, 2, devices_per_process=2)
    assert one["processes"] == 1
    for result in both:
        assert result["processes"] == 2
        assert result["sum"] == pytest.approx(one["sum"], rel=1e-5, abs=1e-5)
        # the actors feed one process: the actor-learner run refuses several, before any compute
        assert "the actors feed one learner process" in result["refusal"], result
