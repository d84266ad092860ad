"""GRPO's training loop on a synthetic verifiable task: warm start, then rollout -> update -> sync iterations.

``config.agent`` is a :class:`lpjax.agents.grpo.GRPOConfig`: the training model is the
:class:`lpjax.nn.TransformerLM` of ``config.model`` in the precision ``agent.policy``, the rollout model the same
network in the precision ``agent.rollout`` (:class:`lpjax.agents.grpo.RolloutConfig`: matmul policy and KV-cache
dtype; :func:`lpjax.agents.grpo.transformer_models` builds both). The supervised warm start stands in for a
pretrained checkpoint: it trains in float32, and its parameters are then cast to the training model's dtypes.
Every iteration draws its prompts from ``np.random.default_rng([seed, iteration])`` and its key from
``fold_in(key(seed), iteration)``, so a resumed run continues exactly where the checkpoint left it. Evaluations
measure the training model's greedy accuracy on a fixed set of held-out prompts.

``config.mesh`` (``data`` x ``fsdp`` devices, :func:`experiments.devices.learner_mesh`) runs the learner on a
device mesh, across processes with ``config.distributed``: the training state is split over ``"fsdp"``
(:func:`lpjax.sharding.place`), the rollout engine runs those sharded parameters, and the rollouts, the
update and the evaluations are data parallel over all devices (see :mod:`lpjax.agents.grpo.learner`). The warm
start runs on each process's first device (every process computes the same parameters) and is then placed on the
mesh. Every process draws the same prompts and keys and runs the same program on the global arrays. A checkpoint
holds global arrays and restores onto the current mesh, whatever mesh it was saved from (or onto one device); a
1 x 1 mesh of one process is the plain single-device learner. On a CPU, force the devices first::

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m experiments.grpo --config=fp16.py \
        --config.mesh.data=2 --config.mesh.fsdp=2
"""

from __future__ import annotations

import functools
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from experiments.devices import check_state_layout, learner_mesh
from experiments.run import Learner, RunSpec, check_config, run
from lpjax.agents.grpo import (
    GRPOConfig,
    check_mesh,
    init_state,
    iteration,
    rows_sharding,
    sample_on_mesh,
    transformer_models,
)
from lpjax.checkpoint import Checkpointer
from lpjax.nn.causal_lm import transformer_causal_lm
from lpjax.rollout import RolloutEngine, SamplingSettings, sample
from lpjax.sharding import place, put_global, replicated
from lpjax.tasks.synthetic import TASKS, make_task, warm_start

EOS_ID = 2
EVAL_SEED = 2**31 - 1
CALIBRATION_PROMPTS = 64
"""The first held-out prompts calibrate the fp8 KV scales before the first rollout."""


def validate(config: ml_collections.ConfigDict) -> tuple[GRPOConfig, Any]:
    """Checks the run config before any compute; returns the agent config and the task. Raises ``ValueError``."""
    kind, _, name = config.env.partition(":")
    if kind != "task" or name not in TASKS:
        raise ValueError(f"env must be 'task:<name>' with name in {sorted(TASKS)}, got {config.env!r}.")
    task = make_task(name, config.num_digits)
    agent = GRPOConfig.from_mapping(dict(config.agent, max_new_tokens=task.seq_len - task.prompt_len))
    check_config(
        "GRPO run",
        [
            (config.log_every >= 1, "log_every must be >= 1"),
            (config.eval_prompts >= 1, "eval_prompts must be >= 1"),
            (config.warm_start_steps >= 0, "warm_start_steps must be >= 0"),
        ],
    )
    check_state_layout(config, agent)
    return agent, task


def _models(config: ml_collections.ConfigDict, agent: GRPOConfig, task: Any):
    """``(warm_model, train_model, rollout_model)``: the float32 model of the warm start, then those of GRPO."""
    lm = dict(config.model, vocab_size=task.vocab_size, max_len=task.seq_len)
    return (transformer_causal_lm(dict(lm, policy="fp32")), *transformer_models(lm, agent))


def _cast_like(params: Any, model: Any, tokens: jax.Array) -> Any:
    """``params`` in the dtypes of ``model``'s own parameters (identity for a float32 model)."""
    shapes = jax.eval_shape(model.init, jax.random.key(0), tokens)
    return jax.tree.map(lambda p, s: p.astype(s.dtype), params, shapes)


@functools.partial(jax.jit, static_argnames=("model", "task", "settings", "mesh"))
def _greedy_reward_on_mesh(model: Any, params: Any, task: Any, prompts: jax.Array, key, settings, mesh: Mesh):
    completions = sample_on_mesh(model, params, prompts, key, settings, None, mesh)["completions"]
    return jax.lax.with_sharding_constraint(jnp.mean(task.rewards(prompts, completions)), replicated(mesh))


def greedy_accuracy(model: Any, params: Any, task: Any, prompts: jax.Array, mesh: Mesh | None = None) -> float:
    """Exact-match reward of the greedy completions (top-p 1e-6 keeps only the most likely token).

    On a ``mesh`` the parameters and prompts are global arrays on it, and the completions and rewards are one
    data-parallel program (:func:`lpjax.agents.grpo.sample_on_mesh`)."""
    settings = SamplingSettings(task.seq_len - task.prompt_len, EOS_ID, top_p=1e-6)
    if mesh is not None:
        key = put_global(jax.random.key(0), replicated(mesh))
        return float(_greedy_reward_on_mesh(model, params, task, prompts, key, settings, mesh))
    completions = sample(model, params, prompts, jax.random.key(0), settings)["completions"]
    return float(jnp.mean(task.rewards(prompts, completions)))


class GRPOLearner(Learner):
    """GRPO for :func:`experiments.run.run`: ``advance`` runs one iteration (rollout, update, sync).

    A new run starts with the supervised warm start and calibrates the fp8 KV scales (if any) on held-out prompts.
    Checkpoints hold the :class:`lpjax.agents.grpo.GRPOState` and the rollout engine's KV scales, which the last
    iteration calibrated on its own rollout tokens: a resumed run samples with exactly the scales an uninterrupted
    one would have.

    With a ``mesh`` the state lives on it as :func:`lpjax.sharding.place` lays it out, the held-out
    prompts' rows are split over the devices (replicated when the device count does not divide them), and a
    checkpoint is restored onto this layout: the restore target is the current state, whose leaves carry the
    current mesh's shardings (the KV scales are replicated).
    """

    def __init__(self, config: ml_collections.ConfigDict, agent: GRPOConfig, task: Any, mesh: Mesh | None = None):
        self.config, self.agent, self.task, self.mesh = config, agent, task, mesh
        self.warm_model, self.train_model, rollout_model = _models(config, agent, task)
        self.init_tokens = jnp.zeros((1, task.seq_len), jnp.int32)
        self.params = self.warm_model.init(jax.random.key(config.seed), self.init_tokens)
        self.state = place(init_state(_cast_like(self.params, self.train_model, self.init_tokens), agent), mesh)
        prompts = task.sample_prompts(np.random.default_rng(EVAL_SEED), config.eval_prompts)
        self.eval_prompts = self._place_rows(prompts)
        self.calibration_tokens = self._place_rows(prompts[:CALIBRATION_PROMPTS])
        self.engine = RolloutEngine(
            rollout_model, SamplingSettings(agent.max_new_tokens, EOS_ID, agent.temperature, agent.top_p)
        )
        self.base_key = jax.random.key(config.seed)
        self.synced = False

    def _place_rows(self, rows: np.ndarray) -> jax.Array:
        """Host rows (the same on every process) as a device array: rows split over the mesh's devices."""
        if self.mesh is None:
            return jnp.asarray(rows)
        return put_global(rows, rows_sharding(self.mesh, len(rows)))

    def position(self) -> int:
        return int(self.state.step)

    def start(self, context) -> None:
        params, curve = warm_start(
            self.warm_model,
            self.params,
            self.task,
            steps=self.config.warm_start_steps,
            seed=self.config.seed,
            target_accuracy=self.config.warm_start_target,
        )
        self.state = place(init_state(_cast_like(params, self.train_model, self.init_tokens), self.agent), self.mesh)
        context.logger.log(
            0,
            {"accuracy": self._accuracy(), "warm_start_steps": float(curve.step[-1]) if len(curve.step) else 0.0},
            prefix="eval",
        )

    def restore(self, checkpointer: Checkpointer, step: int) -> None:
        # onto this run's devices, whatever mesh saved it: the state's own layout, the KV scales replicated (a target
        # without a sharding would restore the saved one)
        sharding = jax.tree.leaves(self.state)[0].sharding if self.mesh is None else replicated(self.mesh)
        kv_scales = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
            jax.eval_shape(self.engine.model.calibrate_kv, self.state.params, self.calibration_tokens),
        )
        saved, _ = checkpointer.restore(step, target={"learner": self.state, "kv_scales": kv_scales})
        self.state = saved["learner"]
        self.engine.restore(self.state.params, int(self.state.step), saved["kv_scales"])
        self.synced = True

    def _accuracy(self) -> float:
        return greedy_accuracy(self.train_model, self.state.params, self.task, self.eval_prompts, self.mesh)

    def advance(self, limit: int, context) -> None:
        del limit  # one iteration at a time
        if not self.synced:
            self.engine.sync(self.state.params, int(self.state.step), self.calibration_tokens)
            self.synced = True
        it = int(self.state.step)
        rng = np.random.default_rng([self.config.seed, it])
        key = jax.random.fold_in(self.base_key, it)
        self.state, metrics = iteration(
            self.train_model, self.engine, self.task, self.agent, self.state, rng, key, mesh=self.mesh
        )
        if (it + 1) % self.config.log_every == 0:
            context.logger.log(it + 1, metrics, prefix="train")
            context.bar.set_postfix(
                reward=f"{metrics['reward']:.2f}", kl=f"{metrics['mismatch_kl']:.4f}", refresh=False
            )

    def evaluate(self) -> dict[str, float]:
        return {"accuracy": self._accuracy()}

    def can_checkpoint(self) -> bool:
        return True

    def checkpoint(self) -> tuple[Any, dict]:
        return {"learner": self.state, "kv_scales": self.engine.kv_scales}, {}

    def summary(self) -> dict[str, Any]:
        rollout = self.agent.rollout
        return {
            "policy": self.agent.policy,
            "rollout_policy": rollout.policy,
            "kv_cache_dtype": rollout.kv_cache_dtype,
            "rollout_correction": self.agent.rollout_correction,
        }


def train(
    config: ml_collections.ConfigDict, run_dir: pathlib.Path, resume: bool = False, progress: bool = True
) -> dict[str, Any]:
    """Runs (or resumes) GRPO; returns the run summary (:func:`experiments.run.run`) with the precisions used.

    The learner runs on :func:`experiments.devices.learner_mesh`'s mesh (joining a multi-process run first); a
    batch the devices cannot share evenly is refused before any compute (:func:`lpjax.agents.grpo.check_mesh`)."""
    agent, task = validate(config)
    mesh = learner_mesh(config)
    check_mesh(agent, mesh)
    rollout = agent.rollout
    spec = RunSpec.of(
        config,
        "iterations",
        kind="GRPO run",
        unit="iterations",
        title=(
            f"GRPO ({agent.policy} training, {rollout.policy} rollouts with a {rollout.kv_cache_dtype} "
            f"KV cache, correction {agent.rollout_correction}) on {config.env}"
        ),
        curve=("eval/accuracy", "train/reward"),
    )
    return run(config, run_dir, spec, lambda: GRPOLearner(config, agent, task, mesh), resume=resume, progress=progress)
