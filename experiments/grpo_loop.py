"""GRPO's training loop on a synthetic verifiable task: warm start, then rollout -> update -> sync iterations.

The training model is float32; the rollout model is the same :class:`lpjax.nn.TransformerLM` built with the
rollout precision (``agent.rollout_precision``: fp32, bf16 = bf16 activations, fp8 = blockwise W8A8 E4M3 GEMMs,
fp8_kv = fp32 GEMMs) and KV-cache dtype (``agent.kv_cache_dtype``). Every iteration draws its prompts from
``np.random.default_rng([seed, iteration])`` and its sampling key from ``fold_in(key(seed), iteration)``, so a
resumed run continues exactly where the checkpoint left it. Evaluations measure the training model's greedy
accuracy on a fixed set of held-out prompts.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm

from lpjax.agents.grpo import GRPOConfig, init_state, iteration
from lpjax.checkpoint import open_run_checkpoints
from lpjax.nn.causal_lm import transformer_causal_lm
from lpjax.rollout import RolloutEngine, SamplingSettings, sample
from lpjax.run_logging import RunLogger, plot_run_curve
from lpjax.tasks.synthetic import TASKS, make_task, warm_start

ROLLOUT_POLICIES = {"fp32": "fp32", "bf16": "mixed_bf16", "fp8": "fp8", "fp8_kv": "fp32"}
KV_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp8": "float8_e4m3fn"}
EOS_ID = 2
EVAL_SEED = 2**31 - 1


def validate(config: ml_collections.ConfigDict) -> tuple[GRPOConfig, Any]:
    """Checks the run config before any compute; returns the agent config and the task. Raises ``ValueError``."""
    kind, _, name = config.env.partition(":")
    if kind != "task" or name not in TASKS:
        raise ValueError(f"env must be 'task:<name>' with name in {sorted(TASKS)}, got {config.env!r}.")
    task = make_task(name, config.num_digits)
    agent = GRPOConfig.from_mapping(dict(config.agent, max_new_tokens=task.seq_len - task.prompt_len))
    for ok, message in [(config.iterations >= 1, "iterations must be >= 1"),
                        (min(config.eval_every, config.log_every, config.checkpoint_every) >= 1,
                         "eval_every, log_every and checkpoint_every must be >= 1"),
                        (config.eval_prompts >= 1, "eval_prompts must be >= 1"),
                        (config.warm_start_steps >= 0, "warm_start_steps must be >= 0"),
                        (agent.ppo_epochs == 1 and agent.num_minibatches == 1,
                         "this loop takes one update per rollout batch: ppo_epochs and num_minibatches must be 1")]:
        if not ok:
            raise ValueError(f"GRPO run config: {message}.")
    return agent, task


def _models(config: ml_collections.ConfigDict, agent: GRPOConfig, task: Any):
    lm = dict(config.model, vocab_size=task.vocab_size, max_len=task.seq_len)
    rollout = transformer_causal_lm(dict(lm, policy=ROLLOUT_POLICIES[agent.rollout_precision]),
                                    kv_dtype=KV_DTYPES[agent.effective_kv_cache_dtype])
    return transformer_causal_lm(lm), rollout


def greedy_accuracy(model: Any, params: Any, task: Any, prompts: jax.Array) -> float:
    """Exact-match reward of the greedy completions (top-p 1e-6 keeps only the most likely token)."""
    settings = SamplingSettings(task.seq_len - task.prompt_len, EOS_ID, top_p=1e-6)
    completions = sample(model, params, prompts, jax.random.key(0), settings)["completions"]
    return float(jnp.mean(task.rewards(prompts, completions)))


def train(config: ml_collections.ConfigDict, run_dir: pathlib.Path, resume: bool = False,
          progress: bool = True) -> dict[str, Any]:
    """Runs (or resumes) GRPO; returns a summary (warm-start and final accuracy, paths)."""
    agent, task = validate(config)
    run_dir = pathlib.Path(run_dir)
    checkpointer, latest = open_run_checkpoints(run_dir, resume, save_replay=True)
    train_model, rollout_model = _models(config, agent, task)
    params = train_model.init(jax.random.key(config.seed), jnp.zeros((1, task.seq_len), jnp.int32))
    state = init_state(params, agent)
    logger = RunLogger(run_dir, config=config)
    eval_prompts = jnp.asarray(task.sample_prompts(np.random.default_rng(EVAL_SEED), config.eval_prompts))
    if resume and latest is not None:
        state, _ = checkpointer.restore(latest, target=state)
        logger.truncate_after(latest)
        print(f"resumed {run_dir} at iteration {latest}")
    else:
        params, curve = warm_start(train_model, params, task, steps=config.warm_start_steps, seed=config.seed,
                                   target_accuracy=config.warm_start_target)
        state = init_state(params, agent)
        logger.log(0, {"accuracy": greedy_accuracy(train_model, state.params, task, eval_prompts),
                       "warm_start_steps": float(curve.step[-1]) if len(curve.step) else 0.0}, prefix="eval")
    settings = SamplingSettings(agent.max_new_tokens, EOS_ID, agent.temperature, agent.top_p)
    engine = RolloutEngine(rollout_model, settings)
    engine.sync(state.params, int(state.step), eval_prompts[:64])
    start = int(state.step)
    base_key = jax.random.key(config.seed)
    bar = tqdm.tqdm(total=config.iterations, initial=start, disable=not progress, unit="it", dynamic_ncols=True)
    final = {}
    try:
        for it in range(start, config.iterations):
            rng = np.random.default_rng([config.seed, it])
            state, metrics = iteration(train_model, engine, task, agent, state, rng, jax.random.fold_in(base_key, it))
            done = it + 1
            bar.update(1)
            if done % config.log_every == 0:
                logger.log(done, metrics, prefix="train")
                bar.set_postfix(reward=f"{metrics['reward']:.2f}", kl=f"{metrics['mismatch_kl']:.4f}", refresh=False)
            if done % config.eval_every == 0 or done == config.iterations:
                final = {"accuracy": greedy_accuracy(train_model, state.params, task, eval_prompts)}
                logger.log(done, final, prefix="eval")
            if done % config.checkpoint_every == 0 or done == config.iterations:
                checkpointer.save(done, state, metadata={"config": config.to_dict()})
    finally:
        bar.close()
        checkpointer.wait()
        logger.close()
    title = f"GRPO ({agent.rollout_precision} rollouts, TIS {'on' if agent.tis else 'off'}) on {config.env}"
    return {"status": "finished", "iterations": int(state.step), "final_eval": final, "run_dir": str(run_dir),
            "curve": plot_run_curve(run_dir, title, ("eval/accuracy", "train/reward")),
            "rollout_precision": agent.rollout_precision, "tis": agent.tis}
