"""The GRPO learner: a short run (fp32 rollouts, then fp8 rollouts with TIS) raises the reward of a warm-started
policy on 2-digit addition; one update per batch is the on-policy formula; PPO epochs of shuffled minibatches
start on-policy and then exercise the clip; an fp16 learner with loss scaling stays finite and reports its scale."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lpjax.agents.grpo import (
    GRPOConfig,
    RolloutConfig,
    grpo_loss,
    init_state,
    iteration,
    minibatch_indices,
    sequence_logprobs,
    train_step,
    transformer_models,
)
from lpjax.methods import PrecisionMethods
from lpjax.rollout import RolloutEngine, SamplingSettings
from lpjax.tasks.synthetic import make_task, warm_start

TASK = make_task("addition", 2)
LM = dict(vocab_size=TASK.vocab_size, num_layers=2, num_heads=4, d_model=64, d_ff=256, max_len=16)
NEW = TASK.seq_len - TASK.prompt_len


@pytest.fixture(scope="module")
def warm_params():
    """Float32 parameters warm-started to 30% accuracy."""
    model, _ = transformer_models(LM, GRPOConfig())
    params = model.init(jax.random.key(0), jnp.zeros((1, TASK.seq_len), jnp.int32))
    return warm_start(model, params, TASK, steps=1000, target_accuracy=0.3)[0]


def _engine(rollout_model, params):
    engine = RolloutEngine(rollout_model, SamplingSettings(NEW, eos_id=2))
    engine.sync(params, 0, jnp.asarray(TASK.sample_prompts(np.random.default_rng(1), 8)))
    return engine


@pytest.mark.parametrize("rollout", [RolloutConfig.preset("fp32"), RolloutConfig("fp8", "fp8")])
def test_short_grpo_run_improves_reward(rollout, warm_params):
    config = GRPOConfig(group_size=8, num_prompts=8, max_new_tokens=NEW, learning_rate=3e-4, rollout=rollout)
    train_model, rollout_model = transformer_models(LM, config)
    engine = _engine(rollout_model, warm_params)
    state, rng, key = init_state(warm_params, config), np.random.default_rng(0), jax.random.key(1)
    rewards, kls = [], []
    for _ in range(400):
        key, step_key = jax.random.split(key)
        state, metrics = iteration(train_model, engine, TASK, config, state, rng, step_key)
        rewards.append(metrics["reward"])
        kls.append(metrics["mismatch_kl"])
    assert all(np.isfinite(rewards)) and int(state.step) == 400
    assert "loss_scale" not in metrics and "skipped_steps" not in metrics
    assert np.mean(rewards[-50:]) > np.mean(rewards[:50]) + 0.05
    if rollout.policy == "fp32":
        assert max(kls) < 1e-5  # same maths in both engines: no mismatch
    else:
        assert 0 < np.mean(kls) < 0.1


def test_kl_penalty_uses_the_frozen_warm_start_as_reference(warm_params):
    config = GRPOConfig(group_size=8, num_prompts=8, max_new_tokens=NEW, learning_rate=1e-3, beta=0.1, rollout="fp32")
    train_model, _ = transformer_models(LM, config)
    engine = _engine(train_model, warm_params)
    state, rng, key = init_state(warm_params, config), np.random.default_rng(0), jax.random.key(1)
    kls = []
    for i in range(5):
        state, metrics = iteration(train_model, engine, TASK, config, state, rng, jax.random.fold_in(key, i))
        kls.append(metrics["ref_kl"])
    # At the first iteration the policy is the reference: the two log-prob computations (compiled separately)
    # agree to float32 rounding, |d| <~ 1e-6, and k3 = expm1(d) - d is d^2 / 2 plus float32 rounding of d (~1e-13):
    # not exactly 0 on every jax version. Then the policy moves away from the reference.
    assert kls[0] < 1e-12 and kls[-1] > 1e-9, kls
    assert np.array_equal(np.asarray(jax.tree.leaves(state.ref_params)[0]), np.asarray(jax.tree.leaves(warm_params)[0]))


def _batch(model, params, batch_size=16, seed=0):
    """A batch as a rollout gives it: prompt + completion tokens, a response mask ending at random lengths, the
    rollout's log-probs (the training model's, perturbed as by another engine) and random advantages."""
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(3, TASK.vocab_size, (batch_size, TASK.seq_len)), jnp.int32)
    lengths = rng.integers(1, NEW + 1, batch_size)
    mask = (np.arange(TASK.seq_len)[None] >= TASK.prompt_len) & (
        np.arange(TASK.seq_len)[None] < TASK.prompt_len + lengths[:, None]
    )
    mask = jnp.asarray(mask, jnp.float32)
    logp = sequence_logprobs(model.logits(params, tokens), tokens)
    logp_rollout = jnp.where(mask > 0, logp + 0.05 * rng.standard_normal(logp.shape), 0.0).astype(jnp.float32)
    advantages = jnp.asarray(rng.standard_normal(batch_size), jnp.float32)
    return tokens, mask, logp_rollout, advantages


@jax.jit
def _old_update(params, tokens, mask, logp_rollout, advantages):
    """The single on-policy update of the learner before PPO epochs: its own AdamW after global-norm clipping,
    ``logp_old = logp_new`` (stopped inside grpo_loss)."""
    model, _ = transformer_models(LM, GRPOConfig())
    config = GRPOConfig(num_prompts=4, group_size=4, learning_rate=1e-3)
    tx = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(config.learning_rate, config.b1, config.b2, config.adam_eps, weight_decay=0.0),
    )

    def loss_fn(p):
        logp = sequence_logprobs(model.logits(p, tokens), tokens)
        return grpo_loss(logp, logp, logp_rollout, advantages, mask, **config.loss_kwargs())

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, _ = tx.update(grads, tx.init(params), params)
    return optax.apply_updates(params, updates), dict(metrics, loss=loss)


def test_one_epoch_of_one_minibatch_is_the_on_policy_update(warm_params):
    config = GRPOConfig(num_prompts=4, group_size=4, learning_rate=1e-3)
    model, _ = transformer_models(LM, config)
    batch = _batch(model, warm_params)
    state, metrics = train_step(model, config, init_state(warm_params, config), *batch)
    ref_params, ref_metrics = _old_update(warm_params, *batch)
    assert int(state.step) == 1 and set(metrics) == set(ref_metrics)
    for name, value in metrics.items():
        assert value.shape == (1,)
        np.testing.assert_allclose(value[0], ref_metrics[name], rtol=1e-6, atol=1e-9, err_msg=name)
    assert float(metrics["ppo_clip_frac"][0]) == 0.0 and float(metrics["ratio_mean"][0]) == 1.0
    for new, ref in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(new, ref, rtol=1e-6, atol=1e-8)


def test_minibatch_indices_shuffle_each_epoch_deterministically():
    config = GRPOConfig(num_prompts=4, group_size=4, ppo_epochs=3, num_minibatches=4)
    indices = np.asarray(minibatch_indices(jax.random.key(7), config))
    assert indices.shape == (12, 4) and indices.dtype == np.int32
    epochs = indices.reshape(3, 16)
    assert all(sorted(epoch) == list(range(16)) for epoch in epochs)  # every sequence once per epoch
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[0], np.arange(16))
    np.testing.assert_array_equal(minibatch_indices(jax.random.key(7), config), indices)
    assert not np.array_equal(minibatch_indices(jax.random.key(8), config), indices)
    whole = GRPOConfig(num_prompts=4, group_size=4, ppo_epochs=2)
    np.testing.assert_array_equal(minibatch_indices(None, whole), np.tile(np.arange(16), (2, 1)))


@pytest.mark.parametrize("epochs, minibatches", [(2, 1), (2, 2), (1, 4)])
def test_ppo_epochs_and_minibatches_start_on_policy_then_clip(epochs, minibatches, warm_params):
    config = GRPOConfig(num_prompts=4, group_size=4, learning_rate=1e-2, ppo_epochs=epochs, num_minibatches=minibatches)
    model, _ = transformer_models(LM, config)
    batch = _batch(model, warm_params)
    key = jax.random.key(3)
    state, metrics = train_step(model, config, init_state(warm_params, config), *batch, key)
    steps = epochs * minibatches
    assert int(state.step) == 1 and all(v.shape == (steps,) for v in metrics.values())
    assert all(np.all(np.isfinite(v)) for v in metrics.values())
    # first gradient step: at the rollout's parameters, logp_new = logp_old up to rounding, nothing clipped
    assert float(metrics["ppo_clip_frac"][0]) == 0.0
    np.testing.assert_allclose(metrics["ratio_mean"][0], 1.0, atol=1e-5)
    # ... and it is the on-policy update of its minibatch
    rows = np.asarray(minibatch_indices(key, config))[0]
    on_policy = GRPOConfig(num_prompts=rows.size // 4, group_size=4, learning_rate=1e-2)
    _, first = train_step(model, on_policy, init_state(warm_params, on_policy), *(x[rows] for x in batch))
    for name in ("loss", "pg_loss", "tis_weight_mean", "mismatch_kl", "num_tokens"):
        np.testing.assert_allclose(metrics[name][0], first[name][0], rtol=1e-5, atol=1e-7, err_msg=name)
    # later steps are off-policy: the parameters moved, and the clip stops some tokens' gradients
    assert np.max(metrics["ppo_clip_frac"][1:]) > 0
    assert np.all(np.abs(metrics["ratio_mean"][1:] - 1.0) > 1e-4)


def test_minibatches_need_a_key(warm_params):
    config = GRPOConfig(num_prompts=4, group_size=4, num_minibatches=2)
    model, _ = transformer_models(LM, config)
    with pytest.raises(ValueError, match="pass key"):
        train_step(model, config, init_state(warm_params, config), *_batch(model, warm_params))


def test_fp16_learner_with_loss_scaling_stays_finite_and_reports_its_scale(warm_params):
    methods = PrecisionMethods(hadam=True, loss_scaling=True, kahan_gradients=True)
    config = GRPOConfig(
        num_prompts=4,
        group_size=4,
        max_new_tokens=NEW,
        learning_rate=3e-4,
        policy="fp16",
        methods=methods,
        rollout=RolloutConfig("fp16", "fp16"),
        ppo_epochs=2,
        num_minibatches=2,
    )
    train_model, rollout_model = transformer_models(LM, config)
    shapes = jax.eval_shape(train_model.init, jax.random.key(0), jnp.zeros((1, TASK.seq_len), jnp.int32))
    params = jax.tree.map(lambda p, s: p.astype(s.dtype), warm_params, shapes)
    assert params["params"]["block_0"]["attn"]["query"]["kernel"].dtype == jnp.float16
    engine = _engine(rollout_model, params)
    state, rng = init_state(params, config), np.random.default_rng(0)
    for i in range(10):
        state, metrics = iteration(train_model, engine, TASK, config, state, rng, jax.random.key(i))
        assert all(np.isfinite(v) for v in metrics.values()), metrics
        # every skipped gradient step halved the scale (no growth within 10 iterations)
        assert metrics["loss_scale"] == config.methods.init_scale / 2 ** metrics["skipped_steps"] >= 1.0
    assert int(state.step) == 10 and metrics["ppo_clip_frac_last"] >= 0
    assert jax.tree.map(lambda p: p.dtype, state.params) == jax.tree.map(lambda p: p.dtype, params)
    assert all(bool(jnp.all(jnp.isfinite(p))) for p in jax.tree.leaves(state.params))
    assert not jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), state.params, params))
