"""GRPO's rollout-mismatch corrections beside TIS: sequence-level masked IS (MIS) and geometric-mean rejection with
a veto, on hand-computed examples; their use in grpo_loss; verl's conventions; the config's rollout_correction;
the fp8 experiment configs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.agents import grpo
from lpjax.agents.grpo import algorithm


def _logs(train_over_rollout):
    """``(logp_train, logp_rollout)`` whose token ratios are ``train_over_rollout`` (rollout log-probs -1)."""
    ratio = np.asarray(train_over_rollout, np.float64)
    logp_rollout = np.full(ratio.shape, -1.0)
    return jnp.asarray(logp_rollout + np.log(ratio), jnp.float32), jnp.asarray(logp_rollout, jnp.float32)


# --- MIS ------------------------------------------------------------------------------------------------------


def test_mis_hand_example_masks_over_the_cap_and_ignores_padding():
    # Rows: ratios [1.1, 0.8] + a padding token of ratio 100 (counted, it would give rho = 88 > 2);
    # [1.5, 1.6, 1.0]: rho = 2.4 > 2, masked (not truncated to 2); [1.5, 1.2, 1.0]: rho = 1.8 <= 2, kept as is.
    lt, lr = _logs([[1.1, 0.8, 100.0], [1.5, 1.6, 1.0], [1.5, 1.2, 1.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    w = jax.jit(algorithm.mis_weights)(lt, lr, mask)
    assert w.dtype == jnp.float32 and w.shape == (3, 3)
    np.testing.assert_allclose(np.asarray(w), [[0.88, 0.88, 0.0], [0.0, 0.0, 0.0], [1.8, 1.8, 1.8]], atol=1e-6)
    # A larger cap keeps the second row at its full ratio: masking, never truncation.
    w5 = algorithm.mis_weights(lt, lr, mask, cap=5.0)
    np.testing.assert_allclose(np.asarray(w5)[1], [2.4, 2.4, 2.4], rtol=1e-6)


def test_mis_never_overflows_and_empty_rows_are_zero():
    # log rho = +150 (exp overflows float32 above ~88.7): masked; log rho = -150: weight 0; no valid token: 0.
    lt = jnp.array([[50.0, 50.0, 50.0], [-50.0, -50.0, -50.0], [-jnp.inf, 7.0, 3.0]])
    lr = jnp.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-jnp.inf, -jnp.inf, 1e30]])
    mask = jnp.array([[1, 1, 1], [1, 1, 1], [0, 0, 0]])
    w = np.asarray(algorithm.mis_weights(lt, lr, mask))
    assert np.all(np.isfinite(w)) and np.all(w == 0.0)


# --- geometric rejection --------------------------------------------------------------------------------------


def test_geometric_rejection_hand_example():
    ratios = [
        [1.2, 0.9, 1.1],  # g = 1.188^(1/3) = 1.059: kept
        [2.0, 2.0, 1.0],  # g = 4^(1/3) = 1.587 > 1.5: rejected
        [0.6, 0.6, 0.6],  # g = 0.6 < 1 / 1.5: rejected
        [1e-5, 300.0, 400.0],  # g = 1.2^(1/3) = 1.063 in the band, but 1e-5 < 1e-4: vetoed
        [1.6, 1.6, 1.0],  # padding last: g = 1.6 over the 2 valid tokens (1.368 if the padding counted): rejected
        [1.2, 0.9, 1e-9],  # padding last: its tiny ratio neither vetoes nor moves the mean: kept
        [1.0, 1.0, 1.0],  # no valid token: weights 0, no NaN
    ]
    lt, lr = _logs(ratios)
    mask = jnp.array([[1, 1, 1]] * 4 + [[1, 1, 0]] * 2 + [[0, 0, 0]])
    w = jax.jit(algorithm.geometric_rejection_weights)(lt, lr, mask)
    assert w.dtype == jnp.float32 and w.shape == (7, 3)
    expected = np.zeros((7, 3))
    expected[0] = 1.0
    expected[5, :2] = 1.0
    np.testing.assert_array_equal(np.asarray(w), expected)
    # Without the veto (0) the fourth row's geometric mean alone decides: kept.
    w_no_veto = algorithm.geometric_rejection_weights(lt, lr, mask, veto_threshold=0.0)
    np.testing.assert_array_equal(np.asarray(w_no_veto)[3], [1.0, 1.0, 1.0])
    # A wider band keeps the second row (1.587 < 1.6).
    np.testing.assert_array_equal(np.asarray(algorithm.geometric_rejection_weights(lt, lr, mask, 1.6))[1], 1.0)
    # -inf / huge values at padding give no NaN.
    junk_lt = jnp.where(mask != 0, lt, -jnp.inf)
    junk_lr = jnp.where(mask != 0, lr, -jnp.inf)
    np.testing.assert_array_equal(np.asarray(algorithm.geometric_rejection_weights(junk_lt, junk_lr, mask)), expected)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b, m: algorithm.mis_weights(a, b, m),
        lambda a, b, m: algorithm.geometric_rejection_weights(a, b, m),
    ],
    ids=["mis", "geo_reject"],
)
def test_weights_are_detached(fn):
    lt, lr = _logs([[1.1, 0.8, 1.2], [1.05, 1.0, 0.95]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1]])
    g_train, g_rollout = jax.grad(lambda a, b: jnp.sum(fn(a, b, mask) * a), argnums=(0, 1))(lt, lr)
    # d/da sum(w * a) = w (the weights as constants), d/db = 0.
    np.testing.assert_array_equal(np.asarray(g_train), np.asarray(fn(lt, lr, mask)))
    np.testing.assert_array_equal(np.asarray(g_rollout), 0.0)
    g_only = jax.grad(lambda a: jnp.sum(fn(a, lr, mask)))(lt)
    np.testing.assert_array_equal(np.asarray(g_only), 0.0)


def test_identical_logprobs_give_weights_exactly_one_in_float64():
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        logp = jnp.asarray(np.log(rng.uniform(1e-6, 1.0, (4, 7))), jnp.float64)
        mask = jnp.ones((4, 7))
        for w in (
            algorithm.tis_weights(logp, logp),
            algorithm.mis_weights(logp, logp, mask),
            algorithm.geometric_rejection_weights(logp, logp, mask),
        ):
            np.testing.assert_array_equal(np.asarray(w), 1.0)
        adv = jnp.asarray(rng.normal(size=4), jnp.float64)
        logp_new = logp + jnp.asarray(rng.normal(0, 0.1, (4, 7)), jnp.float64)
        plain = grpo.grpo_loss(logp_new, logp, None, adv, mask, correction="none")[0]
        for correction in algorithm.ROLLOUT_CORRECTIONS:
            loss, m = grpo.grpo_loss(logp_new, logp, logp, adv, mask, correction=correction)
            assert float(loss) == float(plain), correction
            assert float(m["correction/weight_mean"]) == 1.0 and float(m["correction/rejected_fraction"]) == 0.0


def test_weight_function_argument_errors():
    lt, lr = _logs([[1.0, 1.0]])
    mask = jnp.ones((1, 2))
    with pytest.raises(ValueError, match="MIS cap"):
        algorithm.mis_weights(lt, lr, mask, 0.0)
    with pytest.raises(ValueError, match="threshold must be > 1"):
        algorithm.geometric_rejection_weights(lt, lr, mask, 1.0)
    with pytest.raises(ValueError, match="veto"):
        algorithm.geometric_rejection_weights(lt, lr, mask, 1.5, 1.0)


# --- grpo_loss ------------------------------------------------------------------------------------------------

# Three sequences; position 0 is prompt, the last token of row 2 is padding. Engine ratios exp(old - rollout) on
# the valid tokens: [1.1, 0.8], [1.5, 1.6], [1.3]; PPO ratios exp(new - old) in and out of the clip range.
_MASK = np.array([[0, 1, 1], [0, 1, 1], [0, 1, 0]])
_ENGINE = np.array([[1.0, 1.1, 0.8], [1.0, 1.5, 1.6], [1.0, 1.3, 1.0]])
_R = np.array([[1.0, 1.1, 1.3], [1.0, 0.9, 0.7], [1.0, 1.05, 1.0]])
_ADV = np.array([1.0, -1.0, 2.0])
_HAND_WEIGHTS = {
    "none": np.ones((3, 3)),
    "tis": np.array([[1, 1.1, 0.8], [1, 1.5, 1.6], [1, 1.3, 1]]),
    "mis": np.array([[1, 0.88, 0.88], [1, 0.0, 0.0], [1, 1.3, 1]]),  # rho: 0.88; 2.4 > 2; 1.3
    "geo_reject": np.array([[1, 1, 1], [1, 0, 0], [1, 1, 1]]),  # g: 0.938; 1.549 > 1.5; 1.3
}


@pytest.mark.parametrize("correction", algorithm.ROLLOUT_CORRECTIONS)
def test_grpo_loss_with_each_correction_is_the_hand_weighted_objective(correction):
    logp_old = jnp.asarray(np.log(np.full((3, 3), 0.3)), jnp.float32)
    logp_rollout = logp_old - jnp.asarray(np.log(_ENGINE), jnp.float32)
    logp_new = logp_old + jnp.asarray(np.log(_R), jnp.float32)
    # -inf at padding changes nothing
    logp_rollout = jnp.where(_MASK != 0, logp_rollout, -jnp.inf)
    mask, adv = jnp.asarray(_MASK), jnp.asarray(_ADV, jnp.float32)
    kwargs = grpo.GRPOConfig(rollout_correction=correction).loss_kwargs()
    loss, m = jax.jit(lambda *a: grpo.grpo_loss(*a, **kwargs))(logp_new, logp_old, logp_rollout, adv, mask)

    w, a = _HAND_WEIGHTS[correction], _ADV[:, None]
    objective = np.minimum(_R * a, np.clip(_R, 0.8, 1.2) * a)
    n = _MASK.sum()
    np.testing.assert_allclose(float(loss), -(_MASK * w * objective).sum() / n, rtol=1e-5)
    np.testing.assert_allclose(float(m["correction/weight_mean"]), (_MASK * w).sum() / n, rtol=1e-5)
    rejected = (_MASK * (w == 0)).sum() / n
    np.testing.assert_allclose(float(m["correction/rejected_fraction"]), rejected, rtol=1e-6)
    assert float(m["tis_weight_mean"]) == (pytest.approx(6.3 / 5) if correction == "tis" else 1.0)
    # gradient: -w r A / N where PPO does not clip, 0 where it does
    unclipped = _R * a <= np.clip(_R, 0.8, 1.2) * a
    g = jax.grad(lambda x: grpo.grpo_loss(x, logp_old, logp_rollout, adv, mask, **kwargs)[0])(logp_new)
    np.testing.assert_allclose(np.asarray(g), -_MASK * w * _R * a * unclipped / n, rtol=1e-5, atol=1e-7)


def test_grpo_loss_correction_argument():
    x = jnp.log(jnp.full((1, 2), 0.5))
    adv, mask = jnp.array([1.0]), jnp.ones((1, 2))
    with pytest.raises(ValueError, match="correction must be one of"):
        grpo.grpo_loss(x, x, x, adv, mask, correction="is")
    with pytest.raises(ValueError, match="tis_cap must be > 0"):
        grpo.grpo_loss(x, x, x, adv, mask, correction="tis", tis_cap=0.0)
    # the default is TIS at cap 2
    lt, lr = _logs([[3.0, 1.0]])
    tis = grpo.grpo_loss(lt, lt, lr, adv, mask)[1]
    off = grpo.grpo_loss(lt, lt, lr, adv, mask, correction="none")[1]
    assert float(tis["correction/weight_mean"]) == pytest.approx(1.5) and float(tis["tis_clip_frac"]) == 0.5
    assert float(off["correction/weight_mean"]) == 1.0 and float(off["tis_clip_frac"]) == 0.0


def test_rejected_fraction_counts_rejections_not_underflowed_weights():
    """A sequence MIS keeps with rho = e^-200 has weight 0 in float32, and is kept, not rejected (verl counts
    the rejection decision); one over the cap is rejected."""
    logp_rollout = jnp.zeros((2, 2))
    logp_old = jnp.array([[-100.0, -100.0], [1.0, 1.0]])  # rho = e^-200 (kept, weight 0); rho = e^2 > 2 (rejected)
    adv, mask = jnp.array([1.0, -1.0]), jnp.ones((2, 2))
    _, m = grpo.grpo_loss(logp_old, logp_old, logp_rollout, adv, mask, correction="mis")
    assert float(m["correction/weight_mean"]) == 0.0
    assert float(m["correction/rejected_fraction"]) == 0.5


def test_kept_tokens_normalization_reproduces_verl_on_a_worked_example():
    """verl's rollout correction removes the rejected tokens from the response mask and takes the token mean over
    what is left. Geometric rejection (band 1.5, no veto) on three sequences, on-policy (r = 1, so PPO's term is
    -A per token):

    * sequence 0, ratios [1.2, 0.9] (g = 1.039): kept, A = +1, 2 tokens;
    * sequence 1, ratios [2.0, 2.0, 1.0] (g = 1.587): rejected, A = -1, 3 tokens;
    * sequence 2, ratios [1.1, 1.1, 1.1] + padding (g = 1.1): kept, A = -0.5, 3 tokens.

    verl: loss = (2 * (-1) + 3 * (+0.5)) / 5 = -0.1 over the 5 kept tokens; lpjax's default averages the same sum
    over all 8 response tokens, -0.0625; the two differ by the kept fraction 5 / 8. With beta, the KL term of the
    rejected sequence is dropped too."""
    ratios = np.array([[1.2, 0.9, 1.0, 1.0], [2.0, 2.0, 1.0, 1.0], [1.1, 1.1, 1.1, 1.0]])
    mask = jnp.array([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]])
    lt, lr = _logs(ratios)
    adv = jnp.array([1.0, -1.0, -0.5])
    kwargs = dict(correction="geo_reject", geo_threshold=1.5, geo_veto=0.0)
    verl, vm = grpo.grpo_loss(lt, lt, lr, adv, mask, loss_normalization="kept_tokens", **kwargs)
    ours, om = grpo.grpo_loss(lt, lt, lr, adv, mask, **kwargs)
    assert float(verl) == pytest.approx(-0.1, abs=1e-7)
    assert float(ours) == pytest.approx(-0.0625, abs=1e-7)
    assert (float(vm["loss_tokens"]), float(om["loss_tokens"]), float(vm["num_tokens"])) == (5.0, 8.0, 8.0)
    assert float(vm["correction/rejected_fraction"]) == float(om["correction/rejected_fraction"]) == 3 / 8
    # KL to a reference: every kept token at k3(log 2) = 2 - log 2 - 1, the rejected sequence at k3(log 4): verl
    # averages the kept tokens only.
    logp_ref = lt + jnp.where(jnp.arange(3)[:, None] == 1, jnp.log(4.0), jnp.log(2.0))
    with_kl = grpo.grpo_loss(
        lt, lt, lr, adv, mask, beta=0.1, logp_ref=logp_ref, loss_normalization="kept_tokens", **kwargs
    )
    assert float(with_kl[1]["ref_kl"]) == pytest.approx(1.0 - np.log(2.0), rel=1e-5)
    assert float(with_kl[0]) == pytest.approx(-0.1 + 0.1 * (1.0 - np.log(2.0)), rel=1e-5)
    # TIS rejects nothing: the two normalizations agree.
    tis = [
        grpo.grpo_loss(lt, lt, lr, adv, mask, correction="tis", loss_normalization=n)[0]
        for n in algorithm.LOSS_NORMALIZATIONS
    ]
    assert float(tis[0]) == float(tis[1])
    with pytest.raises(ValueError, match="loss_normalization must be one of"):
        grpo.grpo_loss(lt, lt, lr, adv, mask, loss_normalization="kept")
    assert grpo.GRPOConfig(loss_normalization="kept_tokens").loss_kwargs()["loss_normalization"] == "kept_tokens"
    with pytest.raises(ValueError, match="loss_normalization must be one of"):
        grpo.GRPOConfig(loss_normalization="tokens")


# --- config ---------------------------------------------------------------------------------------------------


def test_config_rollout_correction_defaults_and_loss_arguments():
    c = grpo.GRPOConfig()
    assert (c.rollout_correction, c.tis_cap, c.mis_cap, c.geo_threshold, c.geo_veto) == ("tis", 2.0, 2.0, 1.5, 1e-4)
    for correction in algorithm.ROLLOUT_CORRECTIONS:  # written back and read again: the same config
        c = grpo.GRPOConfig(rollout_correction=correction)
        assert grpo.GRPOConfig.from_mapping(dataclasses.asdict(c)) == c
    base = dict(eps_low=0.2, eps_high=0.2, beta=0.0, loss_normalization="all_tokens")
    assert grpo.GRPOConfig().loss_kwargs() == dict(base, correction="tis", tis_cap=2.0)
    assert grpo.GRPOConfig(rollout_correction="none").loss_kwargs() == dict(base, correction="none")
    assert grpo.GRPOConfig(rollout_correction="mis", mis_cap=3.0).loss_kwargs() == dict(
        base, correction="mis", mis_cap=3.0
    )
    assert grpo.GRPOConfig(rollout_correction="geo_reject", geo_veto=0.0).loss_kwargs() == dict(
        base, correction="geo_reject", geo_threshold=1.5, geo_veto=0.0
    )
    with pytest.raises(ValueError, match=r"Unknown GRPO config keys \['tis'\]"):
        grpo.GRPOConfig.from_mapping({"tis": False})  # the correction is rollout_correction


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rollout_correction="is"), "rollout_correction must be one of none, tis, mis, geo_reject"),
        (dict(rollout_correction="mis", mis_cap=0.0), "mis_cap must be > 0"),
        (dict(rollout_correction="geo_reject", geo_threshold=1.0), "geo_threshold must be > 1"),
        (dict(rollout_correction="geo_reject", geo_veto=1.0), r"geo_veto must be in \[0, 1\)"),
        (dict(rollout_correction="geo_reject", geo_veto=-0.1), r"geo_veto must be in \[0, 1\)"),
        (dict(rollout_correction="tis", tis_cap=0.0), "tis_cap must be > 0"),
    ],
)
def test_config_validation_errors(kwargs, message):
    with pytest.raises(ValueError, match=f"^GRPOConfig: {message}"):
        grpo.GRPOConfig(**kwargs)


def test_thresholds_are_checked_only_for_their_correction():
    assert grpo.GRPOConfig(mis_cap=0.0, geo_threshold=0.5, geo_veto=2.0).rollout_correction == "tis"
    assert grpo.GRPOConfig(rollout_correction="mis", tis_cap=0.0).loss_kwargs()["mis_cap"] == 2.0


def test_fp8_experiment_configs():
    from experiments.configs.grpo import fp8_geo, fp8_mis, fp8_no_tis, fp8_tis

    for module, correction in [(fp8_tis, "tis"), (fp8_no_tis, "none"), (fp8_mis, "mis"), (fp8_geo, "geo_reject")]:
        agent = grpo.GRPOConfig.from_mapping(dict(module.get_config().agent))
        assert agent.rollout_correction == correction, module.__name__
        assert agent.rollout == grpo.RolloutConfig("fp8", "fp8"), module.__name__
    # only the correction differs from fp8_tis
    for module, correction in [(fp8_mis, "mis"), (fp8_geo, "geo_reject")]:
        tis = fp8_tis.get_config()
        tis.agent.rollout_correction = correction
        assert module.get_config().to_dict() == tis.to_dict(), module.__name__
