"""GRPO on a device mesh (4 forced CPU devices in a subprocess, see :mod:`tests.multidevice`): meshes (2, 2) and
(1, 4) give one device's rewards, losses and parameters to float32 rounding, with the state really split over
"fsdp"; an fp16 step whose gradient is non-finite from one device's rows only is skipped on every device and backs
the loss scale off once; a checkpoint saved on (1, 4) restores bit for bit onto (2, 2) and onto one device, and the
resumed runs continue; two processes of two devices each compute what one process of four does (slow tier).

Every child shares one persistent compilation cache (a temporary directory per test module), so the programs the
first test compiles (the same config on the same meshes) are reused by the later ones.
"""

import textwrap

import numpy as np
import pytest

from tests.multidevice import run_on_devices, run_processes

pytestmark = pytest.mark.xdist_group("grpo_mesh")  # one worker: the tests share the compilation cache

ITERATIONS = 3
LEARNING_RATE = 3e-4  # fp8_kv's (the GRPO base config's)
GRADIENT_STEPS = ITERATIONS * 2 * 2  # ppo_epochs x num_minibatches per iteration

PRELUDE = r"""
import json, pathlib, re, shutil, tempfile, types
import jax
jax.config.update("jax_compilation_cache_dir", {cache!r})
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
import numpy as np
from experiments import grpo_loop
from experiments.configs.grpo import fp8_kv
from experiments.devices import learner_mesh
from lpjax.sharding import state_shardings

def config(data=1, fsdp=1, iterations={iterations}):
    c = fp8_kv.get_config()  # fp32 training, rollouts with an fp8 KV cache (KV scales in the checkpoints)
    c.update(env="task:copy", iterations=iterations, warm_start_steps=25, eval_prompts=32, log_every=1,
             eval_every=100, checkpoint_every=100)
    c.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=2)
    c.agent.update(num_prompts=4, group_size=4, ppo_epochs=2, num_minibatches=2)
    c.mesh.update(data=data, fsdp=fsdp)
    return c

class Logger:
    def __init__(self):
        self.rows = []
    def log(self, step, metrics, prefix=""):
        self.rows.append(dict(metrics, step=step, prefix=prefix))

def learner(c):
    agent, task = grpo_loop.validate(c)
    return grpo_loop.GRPOLearner(c, agent, task, learner_mesh(c))

def train(c):
    l, logger = learner(c), Logger()
    context = types.SimpleNamespace(logger=logger, bar=types.SimpleNamespace(set_postfix=lambda **_: None))
    l.start(context)
    for _ in range(c.iterations):
        l.advance(c.iterations, context)
    train_rows = [row for row in logger.rows if row["prefix"] == "train"]
    return l, dict(reward=[r["reward"] for r in train_rows], loss=[r["loss"] for r in train_rows],
                   mismatch_kl=[r["mismatch_kl"] for r in train_rows], accuracy=l.evaluate()["accuracy"])

def leaves(tree):  # {{"learner/trainable/params/...": value}}: the same names for NamedTuples and restored dicts
    return {{"/".join(re.findall(r"\w+", jax.tree_util.keystr(p))): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(tree)}}

def adam_state(state):
    return [n for n in jax.tree.leaves(state.trainable.opt_state, is_leaf=lambda n: hasattr(n, "mu"))
            if hasattr(n, "mu")][0]

def laid_out(state, mesh):
    expected = jax.tree.leaves(state_shardings(state, mesh))
    return all(x.sharding.is_equivalent_to(s, x.ndim) for x, s in zip(jax.tree.leaves(state), expected, strict=True))
"""


@pytest.fixture(scope="module")
def prelude(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("jax_cache"))
    return textwrap.dedent(PRELUDE).format(cache=cache, iterations=ITERATIONS)


def _assert_params_close(diffs: dict[str, float], what: str) -> None:
    """Parameters agree to float32 rounding, except the attention keys' bias: its gradient is 0 in exact
    arithmetic (softmax ignores a shift shared by every key), so it holds rounding noise, which Adam turns into
    steps of up to ``LEARNING_RATE`` whatever the noise's size."""
    for path, diff in diffs.items():
        tolerance = GRADIENT_STEPS * LEARNING_RATE if "key/bias" in path else 2e-6
        assert diff <= tolerance, f"{what}: {path} differs by {diff}"


@pytest.fixture(scope="module")
def mesh_runs(prelude, tmp_path_factory):
    """The same GRPO run (warm start, 3 iterations) on one device and on meshes (2, 2) and (1, 4), in one child:
    its metrics, the parameters' largest differences from one device's, the layouts; (2, 2)'s parameters are
    saved in ``<dir>/state0.npz``."""
    out_dir = tmp_path_factory.mktemp("mesh_runs")
    result = run_on_devices(
        prelude
        + f"""
OUT_DIR = {str(out_dir)!r}
"""
        + """
out = {}
reference = None
for mesh in [(1, 1), (2, 2), (1, 4)]:
    l, metrics = train(config(*mesh))
    state = leaves(l.state.params)
    if reference is None:
        reference = state
    if mesh == (2, 2):
        np.savez(f"{OUT_DIR}/state0.npz", **state)
    fc1 = l.state.params["params"]["block_0"]["fc1"]["kernel"]
    adam = adam_state(l.state)
    metrics.update(
        diffs={k: float(np.max(np.abs(v - reference[k]), initial=0.0)) for k, v in state.items()},
        specs=[list(x.sharding.spec) if l.mesh else None for x in (fc1, adam.mu["params"]["block_0"]["fc1"]["kernel"],
                                                                   adam.nu["params"]["block_0"]["fc1"]["kernel"])],
        shard_shapes=sorted({s.data.shape for s in fc1.addressable_shards}),
        devices=len(fc1.sharding.device_set),
        laid_out=laid_out(l.state, l.mesh) if l.mesh else None,
        kv_spec=list(l.engine.kv_scales.k.sharding.spec) if l.mesh else None,
    )
    out[str(mesh)] = metrics
print(json.dumps(out))
""",
        devices=4,
    )
    return result, out_dir


def test_meshes_match_one_device_and_shard_the_state(mesh_runs):
    result, _ = mesh_runs
    one = result["(1, 1)"]
    assert one["devices"] == 1 and one["shard_shapes"] == [[32, 64]]
    assert len(one["reward"]) == ITERATIONS and 0 < np.mean(one["reward"]) < 1  # a learning signal
    for mesh, fsdp in (("(2, 2)", 2), ("(1, 4)", 4)):
        got = result[mesh]
        assert got["reward"] == one["reward"], mesh  # the same prompts, random draws and completions
        # The loss is a mean of O(1) terms whose group-centred advantages make it nearly cancel (|loss| ~ 1e-3): the
        # parameters' float32 differences (above) move it by an absolute amount, not a relative one.
        np.testing.assert_allclose(got["loss"], one["loss"], rtol=1e-4, atol=1e-5, err_msg=mesh)
        # mismatch_kl ~ delta^2 / 2 for a per-token log-prob gap delta ~ 3e-3: a trainer log-prob moved by the
        # parameters' differences moves it relatively by 2 (that move) / delta. Compared as rms delta, in nats.
        np.testing.assert_allclose(
            np.sqrt(2 * np.asarray(got["mismatch_kl"])),
            np.sqrt(2 * np.asarray(one["mismatch_kl"])),
            atol=3e-5,
            err_msg=mesh,
        )
        assert got["accuracy"] == one["accuracy"], mesh
        _assert_params_close(got["diffs"], mesh)
        # fc1's kernel (32, 64) and its Adam moments are split over "fsdp" along their 64 columns
        assert got["specs"] == [[None, "fsdp"]] * 3, mesh
        assert got["devices"] == 4 and got["shard_shapes"] == [[32, 64 // fsdp]], mesh
        assert got["laid_out"] and got["kv_spec"] == [], mesh  # no leaf drifted to another layout


def test_fp16_step_with_an_inf_on_one_device_is_skipped_on_all(prelude):
    """An inf advantage on the rows of one device makes the gradient non-finite from that device only; the
    loss scaler's finiteness check reads the global gradient, so every device skips the step."""
    result = run_on_devices(
        prelude
        + """
from experiments.configs.grpo import fp16
from lpjax.agents.grpo import train_step
from lpjax.optim.loss_scaling import CompoundLossScalingState
from lpjax.sharding import batch_sharding, put_global, replicated

c = fp16.get_config()  # fp16 training with hAdam, loss scaling and Kahan-compensated updates; fp16 rollouts
c.update(env="task:copy", eval_prompts=32)
c.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=2)
c.agent.update(num_prompts=4, group_size=4)
c.mesh.update(data=2, fsdp=2)
l = learner(c)
is_scaler = lambda n: isinstance(n, CompoundLossScalingState)
scaler = lambda state: [n for n in jax.tree.leaves(state.trainable.opt_state, is_leaf=is_scaler) if is_scaler(n)][0]
# the optimizer state but the scaler's own scale and counters: hAdam's moments, the Kahan buffers, ...
moments = lambda state: jax.tree.leaves(jax.tree.map(lambda n: n.inner_state if is_scaler(n) else n,
                                                     state.trainable.opt_state, is_leaf=is_scaler))
rng = np.random.default_rng(0)
batch, width = 16, l.task.seq_len
tokens = rng.integers(3, l.task.vocab_size, (batch, width)).astype(np.int32)
mask = np.zeros((batch, width), np.float32)
mask[:, l.task.prompt_len:] = 1
logp_rollout = np.full((batch, width), -2.0, np.float32)
advantages = rng.standard_normal(batch).astype(np.float32)
rows = batch_sharding(l.mesh)
key = put_global(jax.random.key(1), replicated(l.mesh))

def step(state, advantages):
    args = [put_global(x, rows) for x in (tokens, mask, logp_rollout, advantages)]
    new, _ = train_step(l.train_model, l.agent, state, *args, key, mesh=l.mesh)
    return jax.block_until_ready(new), args[-1]

state, _ = step(l.state, advantages)  # a clean step: the moments and Kahan buffers hold values
poisoned = advantages.copy()
poisoned[12:] = np.inf  # the last device's rows
after, placed = step(state, poisoned)
shards_with_inf = sum(not np.all(np.isfinite(s.data)) for s in placed.addressable_shards)

def same_shards(a, b):
    return all(np.asarray(x.data).tobytes() == np.asarray(y.data).tobytes()
               for x, y in zip(a.addressable_shards, b.addressable_shards, strict=True))

before_scaler, after_scaler = scaler(state), scaler(after)
print(json.dumps(dict(
    shards_with_inf=shards_with_inf,
    params_kept=all(same_shards(a, b) for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(after.params))),
    moments_kept=all(same_shards(a, b) for a, b in zip(moments(state), moments(after), strict=True)),
    moment_leaves=len(moments(state)),
    sharded_params=sum(len(x.sharding.device_set) == 4 and not x.sharding.is_fully_replicated
                       for x in jax.tree.leaves(state.params)),
    scale_before=float(before_scaler.scale),
    scale_shards=[float(s.data) for s in after_scaler.scale.addressable_shards],
    skipped=[int(before_scaler.skipped_steps), int(after_scaler.skipped_steps)],
    clean_step_moves=not all(same_shards(a, b) for a, b in zip(jax.tree.leaves(after.params),
                                                                jax.tree.leaves(step(after, advantages)[0].params))),
)))
""",
        devices=4,
    )
    assert result["shards_with_inf"] == 1  # the inf is on one device's rows
    assert result["sharded_params"] > 0  # the parameters (and moments, Kahan buffers) are split over "fsdp"
    assert result["params_kept"] and result["moments_kept"] and result["moment_leaves"] > 0  # every shard, bit for bit
    assert result["scale_shards"] == [result["scale_before"] / 2] * 4  # backed off once, the same on every device
    assert result["skipped"][1] == result["skipped"][0] + 1
    assert result["clean_step_moves"]


@pytest.mark.slow
def test_checkpoint_from_one_mesh_restores_onto_others(prelude):
    """Saved on (1, 4) after 2 iterations, restored onto (2, 2) and onto one device: every leaf (the GRPO state and
    the fp8 KV scales) bit-identical, laid out for the new mesh; both resumed runs then run iteration 3 alike. (First,
    a batch or minibatch that 4 devices cannot share is refused with one line.)"""
    result = run_on_devices(
        prelude
        + """
from lpjax.checkpoint import Checkpointer
from lpjax.run_logging import read_metrics

root = pathlib.Path(tempfile.mkdtemp())
refused = []
for changes in (dict(num_prompts=3, group_size=2), dict(num_prompts=4, group_size=2, num_minibatches=4)):
    bad = config(1, 4)
    bad.agent.update(changes)  # a batch of 6, minibatches of 2 sequences: not divisible by 4 devices
    try:
        grpo_loop.train(bad, root / "refused", progress=False)
    except ValueError as error:
        refused.append(str(error))
refused.append((root / "refused").exists())
grpo_loop.train(config(1, 4, iterations=2), root / "saved", progress=False)
saved, _ = Checkpointer(root / "saved" / "checkpoints").restore(2)
saved = {k: np.asarray(v) for k, v in leaves(saved).items()}
out = {"saved_leaves": len(saved), "refused": refused}
for mesh in [(2, 2), (1, 1)]:
    l = learner(config(*mesh))
    l.restore(Checkpointer(root / "saved" / "checkpoints"), 2)
    restored = leaves({"learner": l.state, "kv_scales": l.engine.kv_scales})
    run_dir = root / str(mesh)
    shutil.copytree(root / "saved", run_dir)
    summary = grpo_loop.train(config(*mesh), run_dir, resume=True, progress=False)
    metrics = read_metrics(run_dir)
    rows = np.isfinite(metrics["train/reward"])
    out[str(mesh)] = dict(
        identical=sorted(restored) == sorted(saved) and all(
            restored[k].dtype == saved[k].dtype and restored[k].tobytes() == saved[k].tobytes() for k in saved),
        laid_out=laid_out(l.state, l.mesh) if l.mesh else all(
            len(x.sharding.device_set) == 1 for x in jax.tree.leaves(l.state)),
        kv_replicated=all(x.sharding.is_fully_replicated for x in jax.tree.leaves(l.engine.kv_scales)),
        position=l.position(),
        iterations=summary["iterations"],
        reward=metrics["train/reward"][rows].tolist(),
        loss=metrics["train/loss"][rows].tolist(),
        final={k: v for k, v in leaves(Checkpointer(run_dir / "checkpoints").restore(3)[0]).items()
               if "/params/" in k},
    )
final = [out[m].pop("final") for m in ("(2, 2)", "(1, 1)")]
out["final_diffs"] = {k: float(np.max(np.abs(final[0][k] - final[1][k]), initial=0.0)) for k in final[0]}
print(json.dumps(out))
""",
        devices=4,
    )
    *messages, created = result["refused"]
    assert len(messages) == 2 and not created  # refused before the run directory is made
    for message in messages:
        assert "must be divisible by the device count" in message and "\n" not in message, message
    assert result["saved_leaves"] > 10
    for mesh in ("(2, 2)", "(1, 1)"):
        got = result[mesh]
        assert got["identical"] and got["laid_out"] and got["kv_replicated"], mesh
        assert got["position"] == 2 and got["iterations"] == 3, mesh
        assert len(got["reward"]) == 3 and np.all(np.isfinite(got["loss"])), mesh  # 2 saved rows + the resumed one
    sharded, single = result["(2, 2)"], result["(1, 1)"]
    assert sharded["reward"] == single["reward"]
    np.testing.assert_allclose(sharded["loss"], single["loss"], rtol=1e-4, atol=1e-7)
    assert len(result["final_diffs"]) > 10
    _assert_params_close(result["final_diffs"], "resumed on (2, 2) vs on one device")


@pytest.mark.slow  # two processes compile everything again (nothing is shared with the 1-process cache)
def test_two_processes_match_one(prelude, mesh_runs, tmp_path):
    """Two processes of two devices each (jax.distributed on localhost, gloo collectives, mesh (2, 2) across them)
    run the same iterations as one process of four devices (:func:`mesh_runs`' (2, 2) run). A process that hangs
    fails the test after the timeout."""
    runs, one_dir = mesh_runs
    one = runs["(2, 2)"]
    code = (
        prelude
        + f"""
OUT_DIR = {str(tmp_path)!r}
"""
        + """
from jax.experimental import multihost_utils
l, metrics = train(config(2, 2))
state = multihost_utils.process_allgather(l.state.params, tiled=True)
np.savez(f"{OUT_DIR}/state{jax.process_index()}.npz", **leaves(state))
print(json.dumps(dict(metrics, processes=jax.process_count(), local=len(jax.local_devices()))))
"""
    )
    both = run_processes(code, processes=2, devices_per_process=2, timeout=420)
    reference = np.load(one_dir / "state0.npz")
    for index, got in enumerate(both):
        assert got["processes"] == 2 and got["local"] == 2
        assert got["reward"] == one["reward"] and got["accuracy"] == one["accuracy"]
        np.testing.assert_allclose(got["loss"], one["loss"], rtol=1e-4, atol=1e-7)
        state = np.load(tmp_path / f"state{index}.npz")
        assert sorted(state.files) == sorted(reference.files)
        _assert_params_close(
            {k: float(np.max(np.abs(state[k] - reference[k]), initial=0.0)) for k in state.files}, "2x2"
        )
    assert both[0] == both[1]  # every process logs the same metrics
