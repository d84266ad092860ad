"""The jitted brax/MJX SAC loop (experiments.sac_brax_loop) on a mesh of 4 forced CPU devices: the same run as one
device to float32 rounding, environments and transitions that stay on their device, and a checkpoint that resumes
bit-identically on the mesh and onto one device.

Each test runs its code in a subprocess (tests.multidevice): the forced device count is read when JAX starts.
"""

import pytest

from tests.multidevice import run_on_devices

PRELUDE = """
import json, pathlib, shutil, tempfile
import jax, numpy as np
from experiments import sac_brax_loop
from experiments.configs.sac import fp32
from lpjax.checkpoint import Checkpointer

TMP = pathlib.Path(tempfile.mkdtemp())

def config(mesh, env="brax:inverted_pendulum", total=480, **overrides):
    # 8 environments in 4 blocks (one replay stratum each, whatever the mesh); 8 random iterations, then one update
    # per iteration: 52 updates in 480 env steps; chunks of 160 steps, one evaluation and checkpoint at the end
    c = fp32.get_config()
    c.update(env=env, brax_num_envs=8, total_steps=total, seed_steps=64, replay_capacity=1024, replay_shards=4,
             eval_every=480, eval_episodes=4, log_every=160, checkpoint_every=480, **overrides)
    c.agent.update(hidden_dims=(32, 32), batch_size=32)
    c.mesh.data, c.mesh.fsdp = mesh
    c.agent.fused_optimizer = mesh[1] == 1  # FSDP shards the optimizer state leaf by leaf
    return c

def settings(c):
    return sac_brax_loop.settings_of(c, sac_brax_loop.validate(c))

def final(name, c, step=480):
    with Checkpointer(TMP / name / "checkpoints") as checkpointer:
        return sac_brax_loop.restore_loop(checkpointer, step, settings(c))

def networks(loop):
    agent = loop.agent
    leaves = jax.tree.leaves((agent.actor.params, agent.critic.params, agent.target_critic, agent.temperature))
    return [np.asarray(x, np.float64) for x in leaves]

def relative_difference(a, b):
    # the largest difference of a leaf over its largest magnitude: float32 rounding is ~2^-23 = 1.2e-7 of it
    return max(float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30)) for x, y in zip(a, b, strict=True))

def words(loop):
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree.leaves(loop)]

def seed_rows(loop):
    # the random-action iterations' transitions: the first 8 iterations x 2 envs of each of the 4 strata
    return [np.asarray(x).reshape((4, 256) + x.shape[1:])[:, :16] for x in jax.tree.leaves(loop.replay.data)]
"""


@pytest.mark.slow
def test_four_devices_match_one_and_a_checkpoint_resumes_bit_identically_on_the_mesh():
    result = run_on_devices(
        PRELUDE
        + """
summaries, loops = {}, {}
for name, mesh in [("one", (1, 1)), ("four", (4, 1))]:
    summaries[name] = sac_brax_loop.train(config(mesh), TMP / name, progress=False)
    loops[name] = final(name, config(mesh))
one, four = loops["one"], loops["four"]
initial = sac_brax_loop.init_loop(settings(config((1, 1))), 0)

# the scale of float32 rounding in this run: one device again, every initial actor parameter one ulp up
actor = initial.agent.actor
nudged = actor._replace(params=jax.tree.map(lambda x: np.nextafter(x, np.inf), jax.device_get(actor.params)))
loop = sac_brax_loop.init_loop(settings(config((1, 1))), 0)
loop = loop._replace(agent=loop.agent.replace(actor=nudged))
chunk = sac_brax_loop.chunk_fn(settings(config((1, 1))), 20)  # compiled by the run above
for _ in range(3):
    loop, _ = chunk(loop)

# the 4-device run saved at 320, resumed on the same mesh and on one device
sac_brax_loop.train(config((4, 1), total=320), TMP / "first", progress=False)
for name, mesh in [("resumed_four", (4, 1)), ("resumed_one", (1, 1))]:
    shutil.copytree(TMP / "first", TMP / name)
    summaries[name] = sac_brax_loop.train(config(mesh), TMP / name, resume=True, progress=False)
    loops[name] = final(name, config(mesh))

chunk = sac_brax_loop.chunk_fn(settings(config((4, 1))), 20).as_text()
env_leaves = jax.tree.leaves(four.env_state) + [four.episode_return]
print(json.dumps({
    "summaries": {name: {k: s[k] for k in ("status", "env_steps", "final_eval", "devices", "replay_shards")}
                  for name, s in summaries.items()},
    "difference": relative_difference(networks(one), networks(four)),
    "one_ulp": relative_difference(networks(one), networks(loop)),
    "moved": relative_difference(networks(one), networks(initial)),
    "seed_rows_equal": all(np.array_equal(a, b) for a, b in zip(seed_rows(one), seed_rows(four), strict=True)),
    "replay_difference": relative_difference(*[[np.asarray(x) for x in jax.tree.leaves(loop.replay.data)]
                                               for loop in (one, four)]),
    "replay_shard_rows": sorted({s.data.shape[0] for x in jax.tree.leaves(four.replay.data)
                                 for s in x.addressable_shards}),
    "env_shard_rows": sorted({s.data.shape[0] for x in env_leaves for s in x.addressable_shards}),
    "agent_replicated": all(x.sharding.is_fully_replicated for x in jax.tree.leaves(four.agent)),
    "collectives": {op: chunk.count(f" {op}(") + chunk.count(f" {op}-start(")
                    for op in ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")},
    "resumed_four_identical": all(
        np.array_equal(a, b) for a, b in zip(words(four), words(loops["resumed_four"]), strict=True)),
    "resumed_one_difference": relative_difference(networks(one), networks(loops["resumed_one"])),
}))
""",
        devices=4,
        timeout=900,
    )
    summaries = result["summaries"]
    for name, devices in [("one", 1), ("four", 4), ("resumed_four", 4), ("resumed_one", 1)]:
        summary = summaries[name]
        assert summary["status"] == "finished" and summary["env_steps"] == 480, result
        assert (summary["devices"], summary["replay_shards"]) == (devices, 4), result
    # Acting randomly, both runs store the same transitions bit for bit, in the same slots: the environments'
    # physics is per environment, and each block of environments fills its own stratum on any mesh.
    assert result["seed_rows_equal"], result
    # After that the runs differ only by the order of floating-point sums: the 4 devices all-reduce partial sums
    # of the gradient over their 8 batch rows each, where one device sums 32 rows, a difference of an ulp or so
    # (2^-23 = 1.2e-7 of the largest entry) per update, carried into the actions and the transitions. The yardstick
    # is the same run on one device with its initial actor moved by one ulp: the 4 devices must differ from one
    # by no more than twice that (measured: 2.7e-7 against 7.2e-7 after the 52 updates). 2e-6 bounds both (16
    # ulps); different batches (one stratum instead of four, in test_sac_mesh) differ by more than 1e-3, and
    # training moved the networks by ~1.
    assert result["difference"] <= 2 * result["one_ulp"] and result["one_ulp"] < 2e-6, result
    assert result["replay_difference"] < 2e-6, result
    assert result["moved"] > 0.1, result
    returns = {name: summaries[name]["final_eval"]["return"] for name in summaries}
    assert returns["four"] == pytest.approx(returns["one"], rel=1e-4), result
    # Data parallel: the agent is replicated, each device holds its 2 environments and its stratum of 256 slots,
    # and the compiled chunk moves neither between devices: its only collectives are all-reduces (the gradient
    # means, the episode counts).
    assert result["agent_replicated"], result
    assert result["env_shard_rows"] == [2] and result["replay_shard_rows"] == [256], result
    collectives = result["collectives"]
    assert collectives["all-reduce"] >= 1 and sum(collectives.values()) == collectives["all-reduce"], result
    # Saved at 320 on 4 devices: resumed there, bit-identical to the uninterrupted run; resumed on one device, the
    # one-device run to rounding (the last 160 steps sum on one device).
    assert result["resumed_four_identical"], result
    assert result["resumed_one_difference"] < 2e-6, result
    assert summaries["resumed_four"]["final_eval"] == summaries["four"]["final_eval"], result


@pytest.mark.slow
def test_fsdp_and_mjx_on_the_mesh_match_one_device():
    # fsdp splits the agent's matrices over 2 devices as well (batch and environments over all 4); MJX's cartpole
    # carries zero-size arrays in its state, left out of checkpoints and rebuilt on the mesh
    result = run_on_devices(
        PRELUDE
        + """
out = {}
for env, mesh in [("brax:inverted_pendulum", (2, 2)), ("mjx:cartpole-swingup", (4, 1))]:
    runs = {}
    for name, shape in [("one", (1, 1)), ("mesh", mesh)]:
        run_dir = TMP / f"{env}-{name}".replace(":", "-")
        summary = sac_brax_loop.train(config(shape, env=env), run_dir, progress=False)
        runs[name] = (summary, networks(final(run_dir.name, config(shape, env=env))))
    out[env] = {
        "difference": relative_difference(runs["one"][1], runs["mesh"][1]),
        "returns": [runs[name][0]["final_eval"]["return"] for name in ("one", "mesh")],
        "devices": runs["mesh"][0]["devices"],
    }
print(json.dumps(out))
""",
        devices=4,
        timeout=1800,
    )
    for env in ("brax:inverted_pendulum", "mjx:cartpole-swingup"):
        assert result[env]["devices"] == 4, result
        assert result[env]["difference"] < 2e-6, result  # as in the data-parallel test above
        assert result[env]["returns"][1] == pytest.approx(result[env]["returns"][0], rel=1e-4), result
