"""GRPO maths: TIS weights (FP8-RL's hand example, detached, capped), group advantages, the clipped token-mean
loss and its gradients on hand-built cases, metrics, sequence log-probs, and the config's validation."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.agents import grpo
from lpjax.precision import get_policy

P_ROLLOUT = np.array([0.20, 0.05, 0.01])
P_TRAIN = np.array([0.22, 0.04, 0.03])


def _log32(p):
    return jnp.asarray(np.log(p), jnp.float32)


# --- TIS ------------------------------------------------------------------------------------------------------


def test_tis_matches_the_papers_hand_example():
    w = jax.jit(grpo.tis_weights)(_log32(P_TRAIN), _log32(P_ROLLOUT))
    assert w.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(w), [1.10, 0.80, 2.00], rtol=0, atol=1e-6)


def test_tis_weights_are_detached():
    lt, lr = _log32(P_TRAIN), _log32(P_ROLLOUT)
    g_train, g_rollout = jax.grad(lambda a, b: jnp.sum(grpo.tis_weights(a, b)), argnums=(0, 1))(lt, lr)
    np.testing.assert_array_equal(np.asarray(g_train), 0.0)
    np.testing.assert_array_equal(np.asarray(g_rollout), 0.0)


def test_tis_cap_truncates_and_never_overflows():
    log_ratio = jnp.array([-3.0, 0.0, 0.5, 2.0, 200.0, jnp.inf])
    for cap in (1.0, 2.0, 5.0):
        w = grpo.tis_weights(log_ratio, jnp.zeros(6), cap)
        expected = np.minimum(np.exp(np.array([-3.0, 0.0, 0.5, 2.0, 88.0, 88.0])), cap)
        np.testing.assert_allclose(np.asarray(w), expected, rtol=1e-6)
        assert np.all(np.isfinite(np.asarray(w)))
    with pytest.raises(ValueError, match="cap must be > 0"):
        grpo.tis_weights(log_ratio, log_ratio, 0.0)


# --- advantages -----------------------------------------------------------------------------------------------


def test_group_advantages_hand_example():
    # Groups (contiguous) [1, 0, 0, 1] and [3, 1, 2, 2]: means 0.5 and 2, population stds 0.5 and sqrt(0.5).
    rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0, 2.0])
    adv = jax.jit(grpo.group_advantages, static_argnums=1)(rewards, 4)
    s = np.sqrt(0.5)
    expected = [
        0.5 / 0.500001,
        -0.5 / 0.500001,
        -0.5 / 0.500001,
        0.5 / 0.500001,
        1 / (s + 1e-6),
        -1 / (s + 1e-6),
        0.0,
        0.0,
    ]
    assert adv.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-6)


def test_equal_rewards_give_exact_zeros_without_nan():
    # 0.1 * 7 / 7 != 0.1 in float32, so a naive (r - mean) / (std + eps) gives ~-7e-3 here, not 0.
    rewards = jnp.concatenate([jnp.full(7, 0.1), jnp.zeros(7), jnp.array([0.0, 1, 0, 0, 0, 0, 0])])
    adv = np.asarray(grpo.group_advantages(rewards, 7))
    np.testing.assert_array_equal(adv[:14], 0.0)
    assert np.all(np.isfinite(adv)) and adv[15] > 0 and np.all(adv[[14, 16, 17, 18, 19, 20]] < 0)
    np.testing.assert_allclose(adv[14:].sum(), 0.0, atol=1e-5)


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="not a multiple"):
        grpo.group_advantages(jnp.zeros(10), 4)
    with pytest.raises(ValueError, match="group_size"):
        grpo.group_advantages(jnp.zeros(4), 0)
    with pytest.raises(ValueError, match="flat"):
        grpo.group_advantages(jnp.zeros((2, 4)), 4)


# --- loss -----------------------------------------------------------------------------------------------------


_grad_new = jax.jit(jax.grad(lambda logp_new, *args, **kwargs: grpo.grpo_loss(logp_new, *args, **kwargs)[0]))


def test_gradient_is_minus_advantage_times_tis_weight_over_token_count():
    # Two sequences, three positions; position 0 of each is prompt (masked), plus one padded token.
    # First minibatch: logp_new == logp_old, so r = 1 and nothing is PPO-clipped.
    logp_old = jnp.log(jnp.array([[0.5, 0.22, 0.04], [0.5, 0.03, 0.3]]))
    logp_rollout = jnp.log(jnp.array([[0.5, 0.20, 0.05], [0.5, 0.01, 0.3]]))
    mask = jnp.array([[0, 1, 1], [0, 1, 0]])
    adv = jnp.array([1.5, -0.5])
    w = np.array([[1.0, 1.1, 0.8], [1.0, 2.0, 1.0]])  # the paper's ratios 1.1, 0.8, 3 -> 2
    n = 3
    g = _grad_new(logp_old, logp_old, logp_rollout, adv, mask)
    expected = -np.asarray(adv)[:, None] * w / n * np.asarray(mask)
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-5, atol=1e-7)

    # logp_old is stopped inside: a single on-policy update may pass logp_new as logp_old.
    g_same = jax.grad(lambda x: grpo.grpo_loss(x, x, logp_rollout, adv, mask)[0])(logp_old)
    np.testing.assert_allclose(np.asarray(g_same), expected, rtol=1e-5, atol=1e-7)

    loss, metrics = grpo.grpo_loss(logp_old, logp_old, logp_rollout, adv, mask)
    np.testing.assert_allclose(float(loss), -(1.5 * 1.1 + 1.5 * 0.8 - 0.5 * 2.0) / 3, rtol=1e-5)
    assert float(metrics["num_tokens"]) == 3


def test_clipped_tokens_have_zero_gradient_and_others_minus_r_a_w_over_n():
    # Ratios r = exp(new - old) per token: 1.1 (in range), 1.3 (A > 0: clipped), 1.3 (A < 0: not clipped),
    # 0.7 (A < 0: clipped), 0.7 (A > 0: not clipped).
    r = np.array([[1.1, 1.3, 1.3, 0.7, 0.7]])
    adv_tok = np.array([[2.0, 2.0, -1.0, -1.0, 3.0]])
    logp_old = jnp.log(jnp.full((1, 5), 0.3))
    logp_new = logp_old + jnp.log(jnp.asarray(r, jnp.float32))
    mask = jnp.ones((1, 5))
    g = _grad_new(logp_new, logp_old, None, jnp.asarray(adv_tok), mask)
    unclipped = np.array([[1, 0, 1, 0, 1]])
    np.testing.assert_allclose(np.asarray(g), -r * adv_tok * unclipped / 5, rtol=1e-5, atol=1e-7)
    _, metrics = grpo.grpo_loss(logp_new, logp_old, None, jnp.asarray(adv_tok), mask)
    np.testing.assert_allclose(float(metrics["ppo_clip_frac"]), 2 / 5, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["ratio_mean"]), r.mean(), rtol=1e-5)


def test_clip_higher_is_asymmetric():
    # r = 1.25 with A > 0: clipped at eps_high = 0.2, not at DAPO's 0.28. r = 0.75 with A < 0: clipped by eps_low
    # = 0.2 in both.
    logp_old = jnp.zeros((2, 1)) - 1.0
    logp_new = logp_old + jnp.log(jnp.array([[1.25], [0.75]]))
    adv, mask = jnp.array([1.0, -1.0]), jnp.ones((2, 1))
    g_sym = _grad_new(logp_new, logp_old, None, adv, mask, eps_high=0.2)
    g_dapo = _grad_new(logp_new, logp_old, None, adv, mask, eps_high=grpo.CLIP_HIGHER_EPS)
    np.testing.assert_array_equal(np.asarray(g_sym), 0.0)
    np.testing.assert_allclose(np.asarray(g_dapo), [[-1.25 / 2], [0.0]], rtol=1e-5)


def test_token_mean_over_the_whole_batch_ignores_masked_values():
    rng = np.random.default_rng(0)
    logp_new = jnp.asarray(np.log(rng.uniform(0.05, 1, (3, 6))), jnp.float32)
    logp_old = logp_new + jnp.asarray(rng.normal(0, 0.05, (3, 6)), jnp.float32)
    logp_rollout = logp_old + jnp.asarray(rng.normal(0, 0.05, (3, 6)), jnp.float32)
    lengths = np.array([5, 2, 4])
    mask = jnp.asarray(np.arange(6)[None] < lengths[:, None])
    adv = jnp.array([1.0, -0.5, 0.25])
    loss, _ = grpo.grpo_loss(logp_new, logp_old, logp_rollout, adv, mask)
    # Garbage (-inf, huge) at masked positions changes neither loss nor gradients, and gives no NaN.
    junk = lambda x, v: jnp.where(mask, x, v)
    args = (junk(logp_old, -jnp.inf), junk(logp_rollout, 1e30), adv, mask)
    loss_junk, metrics = grpo.grpo_loss(junk(logp_new, -jnp.inf), *args)
    np.testing.assert_allclose(float(loss_junk), float(loss), rtol=1e-6)
    assert all(np.isfinite(float(v)) for v in metrics.values())
    g = _grad_new(junk(logp_new, -jnp.inf), *args)
    assert np.all(np.isfinite(np.asarray(g))) and np.all(np.asarray(g)[~np.asarray(mask)] == 0)
    # Token mean, not a mean of per-sequence means: every token has weight 1 / 11.
    w = np.asarray(grpo.tis_weights(logp_old, logp_rollout))
    r, a = np.exp(np.asarray(logp_new - logp_old)), np.asarray(adv)[:, None]
    objective = w * np.minimum(r * a, np.clip(r, 0.8, 1.2) * a)
    np.testing.assert_allclose(float(loss), -objective[np.asarray(mask)].sum() / 11, rtol=1e-5)
    # Empty mask: loss 0, no NaN.
    loss0, m0 = grpo.grpo_loss(logp_new, logp_old, logp_rollout, adv, jnp.zeros((3, 6)))
    assert float(loss0) == 0.0 and all(float(v) == 0.0 for v in m0.values())


def test_tis_off_is_plain_grpo_and_tis_without_mismatch_is_the_identity():
    rng = np.random.default_rng(1)
    logp_old = jnp.asarray(np.log(rng.uniform(0.05, 1, (4, 5))), jnp.float32)
    logp_new = logp_old + jnp.asarray(rng.normal(0, 0.2, (4, 5)), jnp.float32)
    logp_rollout = logp_old + jnp.asarray(rng.normal(0, 0.5, (4, 5)), jnp.float32)
    adv, mask = jnp.array([1.0, -1.0, 0.5, -0.5]), jnp.ones((4, 5))
    plain = grpo.grpo_loss(logp_new, logp_old, None, adv, mask, correction="none")[0]
    off = grpo.grpo_loss(logp_new, logp_old, logp_rollout, adv, mask, correction="none")
    on_matched = grpo.grpo_loss(logp_new, logp_old, logp_old, adv, mask)[0]
    on = grpo.grpo_loss(logp_new, logp_old, logp_rollout, adv, mask)[0]
    assert float(off[0]) == float(plain) == float(on_matched)
    assert float(on) != float(plain)
    assert float(off[1]["tis_weight_min"]) == float(off[1]["tis_weight_max"]) == 1.0
    assert float(off[1]["tis_clip_frac"]) == 0.0 and float(off[1]["mismatch_kl"]) > 0


def test_kl_penalty_vanishes_at_the_reference_and_pulls_towards_it():
    logp_new = jnp.log(jnp.array([[0.2, 0.5, 0.3]]))
    adv, mask = jnp.array([1.0]), jnp.ones((1, 3))
    base = grpo.grpo_loss(logp_new, logp_new, None, adv, mask)[0]
    with_kl, m = grpo.grpo_loss(logp_new, logp_new, None, adv, mask, beta=0.5, logp_ref=logp_new)
    assert float(with_kl) == float(base) and float(m["ref_kl"]) == 0.0
    g_base = _grad_new(logp_new, logp_new, None, adv, mask)
    g_kl = _grad_new(logp_new, logp_new, None, adv, mask, beta=0.5, logp_ref=logp_new)
    np.testing.assert_allclose(np.asarray(g_kl), np.asarray(g_base), atol=1e-7)
    # k3 = exp(d) - d - 1 with d = ref - new; d/dnew = (1 - exp(d)) * beta / N.
    d = np.array([[0.3, -0.2, 0.0]])
    logp_ref = logp_new + jnp.asarray(d, jnp.float32)
    _, m = grpo.grpo_loss(logp_new, logp_new, None, adv, mask, beta=0.5, logp_ref=logp_ref)
    np.testing.assert_allclose(float(m["ref_kl"]), np.mean(np.exp(d) - d - 1), rtol=1e-5)
    g = _grad_new(logp_new, logp_new, None, adv, mask, beta=0.5, logp_ref=logp_ref)
    np.testing.assert_allclose(np.asarray(g - g_base), 0.5 * (1 - np.exp(d)) / 3, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="logp_ref"):
        grpo.grpo_loss(logp_new, logp_new, None, adv, mask, beta=0.1)


def test_metrics_on_the_papers_hand_example():
    lt, lr = _log32(P_TRAIN)[None], _log32(P_ROLLOUT)[None]
    loss, m = jax.jit(grpo.grpo_loss)(lt, lt, lr, jnp.array([1.0]), jnp.ones((1, 3)))
    rho = P_TRAIN / P_ROLLOUT
    np.testing.assert_allclose(float(loss), -(1.1 + 0.8 + 2.0) / 3, rtol=1e-6)
    np.testing.assert_allclose(float(m["tis_weight_mean"]), 3.9 / 3, rtol=1e-6)
    np.testing.assert_allclose(float(m["tis_weight_min"]), 0.8, rtol=1e-6)
    np.testing.assert_allclose(float(m["tis_weight_max"]), 2.0, rtol=1e-6)
    np.testing.assert_allclose(float(m["tis_clip_frac"]), 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(float(m["mismatch_kl"]), np.mean(rho - 1 - np.log(rho)), rtol=1e-5)
    np.testing.assert_allclose(float(m["mismatch_kl_k1"]), np.mean(-np.log(rho)), rtol=1e-5)
    assert float(m["ppo_clip_frac"]) == 0.0 and float(m["ratio_mean"]) == 1.0 and float(m["ref_kl"]) == 0.0


def test_loss_jits_with_config_kwargs():
    config = grpo.GRPOConfig(clip_higher=True)
    fn = jax.jit(functools.partial(grpo.grpo_loss, **config.loss_kwargs()))
    x = jnp.log(jnp.full((2, 3), 0.5))
    loss, metrics = fn(x, x, x, jnp.array([1.0, -1.0]), jnp.ones((2, 3)))
    assert loss.shape == () and set(metrics) >= {"mismatch_kl", "tis_weight_mean", "ppo_clip_frac"}


# --- log-probs ------------------------------------------------------------------------------------------------


def test_sequence_logprobs_shift_convention():
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.normal(size=(2, 4, 5)), jnp.bfloat16)
    tokens = jnp.asarray(rng.integers(0, 5, (2, 4)))
    out = jax.jit(grpo.sequence_logprobs, static_argnames="temperature")(logits, tokens, temperature=0.7)
    assert out.shape == (2, 4) and out.dtype == jnp.float32
    ref = jax.nn.log_softmax(np.asarray(logits, np.float32) / 0.7, axis=-1)
    for b in range(2):
        assert float(out[b, 0]) == 0.0
        for t in range(1, 4):
            np.testing.assert_allclose(float(out[b, t]), float(ref[b, t - 1, tokens[b, t]]), rtol=1e-5)


# --- config ---------------------------------------------------------------------------------------------------


def test_config_defaults_and_derived_values():
    c = grpo.GRPOConfig()
    assert (c.group_size, c.eps_low, c.effective_eps_high, c.tis_cap, c.beta, c.ppo_epochs) == (8, 0.2, 0.2, 2, 0, 1)
    assert c.loss_kwargs() == dict(
        eps_low=0.2, eps_high=0.2, correction="tis", tis_cap=2.0, beta=0.0, loss_normalization="all_tokens"
    )
    assert grpo.GRPOConfig(clip_higher=True).effective_eps_high == 0.28
    assert "tis_cap" not in grpo.GRPOConfig(rollout_correction="none").loss_kwargs()
    assert c.rollout == grpo.ROLLOUT_PRESETS["bf16"] and c.precision == get_policy("fp32")
    assert c.batch_size == 64 and c.minibatch_size == 64 and hash(c) == hash(dataclasses.replace(c))
    assert grpo.GRPOConfig(num_minibatches=4).minibatch_size == 16
    assert grpo.GRPOConfig.from_mapping({"group_size": 4, "rollout_correction": "none"}).group_size == 4
    with pytest.raises(ValueError, match="Unknown GRPO config keys"):
        grpo.GRPOConfig.from_mapping({"gruop_size": 4})


@pytest.mark.parametrize(
    "name, policy, kv_cache_dtype",
    [
        ("fp32", "fp32", jnp.float32),
        ("bf16", "mixed_bf16", jnp.bfloat16),
        ("fp8", "fp8", jnp.bfloat16),
        ("fp8_kv", "fp32", jnp.float8_e4m3fn),
    ],
)
def test_rollout_presets_map_to_their_policy_and_kv_cache_dtype(name, policy, kv_cache_dtype):
    preset = grpo.RolloutConfig.preset(name)
    assert preset == grpo.ROLLOUT_PRESETS[name] == grpo.RolloutConfig.from_value(name)
    assert preset.policy == policy and preset.precision == get_policy(policy)
    assert preset.kv_cache_dtype == np.dtype(kv_cache_dtype).name  # the canonical name
    assert grpo.GRPOConfig(rollout=name).rollout == preset
    assert grpo.GRPOConfig(rollout=dataclasses.asdict(preset)).rollout == preset
    assert grpo.RolloutConfig.preset(name, kv_cache_dtype="fp16").kv_cache_dtype == "float16"


def test_rollout_presets_build_models_of_that_precision():
    lm = dict(vocab_size=8, num_layers=1, num_heads=2, d_model=16, d_ff=32, max_len=8)
    config = grpo.GRPOConfig(policy="fp16", rollout="fp8_kv")
    train, rollout = grpo.transformer_models(lm, config)
    assert train.module.policy == get_policy("fp16") and train.kv_cache_dtype == jnp.float32  # parsed once
    assert rollout.module.policy == get_policy("fp32") and rollout.kv_cache_dtype == jnp.float8_e4m3fn
    params = train.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    assert params["params"]["block_0"]["fc1"]["kernel"].dtype == jnp.float16  # the training policy's params


def test_from_mapping_reads_nested_configs_and_refuses_unknown_keys():
    c = grpo.GRPOConfig.from_mapping(dict(group_size=4, rollout=dict(policy="fp8", kv_cache_dtype="fp8")))
    assert c.rollout == grpo.RolloutConfig("fp8", "fp8") and c.group_size == 4
    with pytest.raises(ValueError, match=r"Unknown GRPO config keys \['rollout_precision'\]"):
        grpo.GRPOConfig.from_mapping(dict(rollout_precision="fp8"))
    with pytest.raises(ValueError, match="Unknown rollout config keys"):
        grpo.GRPOConfig.from_mapping(dict(rollout=dict(precision="fp8")))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(group_size=1), "group_size"),
        (dict(eps_low=0.0), "eps_low"),
        (dict(eps_low=1.0), "eps_low"),
        (dict(eps_high=-0.1), "eps_high"),
        (dict(clip_higher=True, eps_high=0.1), "clip_higher"),
        (dict(tis_cap=0.0), "tis_cap"),
        (dict(beta=-1.0), "beta"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(temperature=0.0), "temperature"),
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(max_grad_norm=0.0), "max_grad_norm"),
        (dict(num_minibatches=3), "num_minibatches"),
        (dict(ppo_epochs=0), "ppo_epochs"),
        (dict(b1=1.0), "b1 and b2"),
        (dict(rollout="int8"), "Unknown rollout preset"),
        (dict(rollout=dict(policy="fp7")), "RolloutConfig: Unknown precision policy"),
        (dict(rollout=dict(kv_cache_dtype="int8")), "RolloutConfig: Unknown KV-cache dtype"),
        (dict(rollout=dict(kv_cache_dtype="fp8_e5m2")), "RolloutConfig: A KV cache stores one of"),
        (dict(policy="fp7"), "Unknown precision policy"),
    ],
)
def test_config_validation_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        grpo.GRPOConfig(**kwargs)
    assert grpo.GRPOConfig(rollout_correction="none", tis_cap=0.0).loss_kwargs()["correction"] == "none"
