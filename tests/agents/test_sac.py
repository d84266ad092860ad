"""SAC learner: the methods are the identity in float64, fp16 with them stays finite where naive fp16 does not,
update semantics (periods, targets), pixels, and clear errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.agents import sac
from lpjax.methods import PrecisionMethods

METHODS = PrecisionMethods.paper()
OBS_DIM, ACTION_DIM = 5, 2


def _batch(n: int, seed: int, dtype=jnp.float32, obs_scale: float = 1.0):
    rng = np.random.default_rng(seed)
    return {
        "obs": jnp.asarray(rng.normal(size=(n, OBS_DIM)) * obs_scale, dtype),
        "action": jnp.asarray(rng.uniform(-1, 1, (n, ACTION_DIM)), dtype),
        "reward": jnp.asarray(rng.uniform(0, 1, n), dtype),
        "discount": jnp.asarray(rng.uniform(size=n) > 0.1, dtype),
        "next_obs": jnp.asarray(rng.normal(size=(n, OBS_DIM)) * obs_scale, dtype),
    }


def _train(config: sac.SACConfig, steps: int, dtype=jnp.float32, obs_scale: float = 1.0):
    state = sac.init(jax.random.key(0), jnp.zeros(OBS_DIM, dtype), ACTION_DIM, config)
    history = []
    for i in range(steps):
        state, metrics = sac.update(state, _batch(config.batch_size, i, dtype, obs_scale))
        history.append({k: float(v) for k, v in metrics.items()})
    return state, history


def test_all_methods_are_the_identity_in_float64():
    f64 = "params=float64,compute=float64,output=float64"
    base = sac.SACConfig(
        hidden_dims=(32, 32), batch_size=16, policy=f64, adam_eps=1e-3, methods=PrecisionMethods(init_scale=64.0)
    )
    with jax.enable_x64(True):
        plain, plain_history = _train(base, 6, jnp.float64)
        fixed, fixed_history = _train(
            dataclasses.replace(base, methods=PrecisionMethods.paper(init_scale=64.0)), 6, jnp.float64
        )
        for name in ("actor", "critic"):
            for a, b in zip(jax.tree.leaves(getattr(plain, name).params), jax.tree.leaves(getattr(fixed, name).params)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-7, atol=1e-9)
        for a, b in zip(jax.tree.leaves(plain.target_critic), jax.tree.leaves(fixed.target_critic)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(plain_history[-1]["critic_loss"], fixed_history[-1]["critic_loss"], rtol=1e-6)
        assert fixed_history[-1]["critic_loss_scale"] == 64.0


def test_stochastic_rounding_and_8bit_moments_are_the_identity_in_float64():
    """float64 parameters are updated by plain addition (stochastic rounding rounds to 16-bit dtypes only), and
    8-bit moments with blocks of one element are float32 values: the agent is the plain one to float32 precision."""
    f64 = "params=float64,compute=float64,output=float64"
    base = sac.SACConfig(
        hidden_dims=(32, 32), batch_size=16, policy=f64, adam_eps=1e-3, methods=PrecisionMethods(hadam=True)
    )
    beyond = PrecisionMethods(hadam=True, stochastic_rounding=True, moment_dtype="fp8", moment_block_size=1)
    with jax.enable_x64(True):
        plain, _ = _train(base, 6, jnp.float64)
        fixed, _ = _train(dataclasses.replace(base, methods=beyond), 6, jnp.float64)
        for a, b in zip(jax.tree.leaves((plain.actor.params, plain.critic.params, plain.target_critic)),
                        jax.tree.leaves((fixed.actor.params, fixed.critic.params, fixed.target_critic))):  # fmt: skip
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "methods",
    [
        PrecisionMethods.paper(init_scale=2.0**14, growth_interval=3),
        PrecisionMethods.paper(kahan_gradients=False, kahan_momentum=False, stochastic_rounding=True),
        pytest.param(
            PrecisionMethods.paper(
                kahan_gradients=False, kahan_momentum=False, stochastic_rounding=True, moment_dtype="int8"
            ),
            marks=pytest.mark.slow,  # tests/optim/test_flat.py covers the 8-bit moments' fused bits
        ),
    ],
    ids=["paper", "stochastic_rounding", "8bit_moments"],
)
def test_the_fused_optimizer_trains_bit_for_bit_as_per_leaf(methods):
    """fp16 SAC with its optimizers and target update over flat buffers (the default) and per leaf: every parameter,
    moment, compensation and metric is identical after steps that include skipped ones (large observations)."""
    config = sac.SACConfig(hidden_dims=(32, 32), batch_size=16, policy="fp16", methods=methods)
    fused, fused_history = _train(config, 8, obs_scale=300.0)
    per_leaf, leaf_history = _train(dataclasses.replace(config, fused_optimizer=False), 8, obs_scale=300.0)
    assert fused_history == leaf_history
    assert any(h["critic_skipped_steps"] for h in fused_history) or methods.stochastic_rounding
    for name in ("actor", "critic"):
        for a, b in zip(jax.tree.leaves(getattr(fused, name).params), jax.tree.leaves(getattr(per_leaf, name).params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(fused.target_critic), jax.tree.leaves(per_leaf.target_critic)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_rematerialize_computes_the_same_update_and_holds_fewer_residuals():
    """``rematerialize`` recomputes the networks' activations in the backward passes: float32 training follows the
    plain one to rounding, and the critic loss's backward pass holds less."""
    config = sac.SACConfig(hidden_dims=(32, 32), batch_size=16)
    plain, plain_history = _train(config, 5)
    remat, remat_history = _train(dataclasses.replace(config, rematerialize=True), 5)
    for a, b in zip(
        jax.tree.leaves((plain.actor.params, plain.critic.params)),
        jax.tree.leaves((remat.actor.params, remat.critic.params)),
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(plain_history[-1]["critic_loss"], remat_history[-1]["critic_loss"], rtol=1e-5)

    def residual_bytes(state):
        _, critic_net = sac.networks(state.config, state.action_dim)
        batch = _batch(16, 0)
        features = critic_net.apply(state.critic.params, batch["next_obs"], method=sac.SACCritic.encode)
        loss = lambda p: sac.critic_loss(p, state, batch, features, jax.random.key(1))[0]
        return sum(x.nbytes for x in jax.tree.leaves(jax.vjp(loss, state.critic.params)[1]))

    assert residual_bytes(remat) < residual_bytes(plain) / 2


def test_fp16_with_stochastic_rounding_trains_finite_and_its_keys_advance():
    methods = PrecisionMethods.paper(
        kahan_gradients=False, kahan_momentum=False, stochastic_rounding=True, moment_dtype="fp8"
    )
    config = sac.SACConfig(hidden_dims=(64, 64), batch_size=64, policy="fp16", methods=methods)
    start = sac.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, config)
    state, history = _train(config, 20)
    assert all(np.isfinite(h["critic_loss"]) and np.isfinite(h["actor_loss"]) for h in history)
    assert not np.array_equal(np.asarray(state.target_compensation.key), np.asarray(start.target_compensation.key))
    moved = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
             zip(jax.tree.leaves(start.target_critic), jax.tree.leaves(state.target_critic))]  # fmt: skip
    assert all(moved)  # every target leaf follows its critic (tau (p - t) is far below half an ulp for most)


def test_fp16_with_methods_stays_finite_where_naive_fp16_does_not():
    small = dict(hidden_dims=(64, 64), batch_size=64)
    _, fixed = _train(sac.SACConfig(policy="fp16", **small, methods=METHODS), 20)
    _, naive = _train(sac.SACConfig(policy="fp16", **small), 20)
    assert all(np.isfinite(h["critic_loss"]) and np.isfinite(h["actor_loss"]) for h in fixed)
    assert fixed[-1]["critic_loss_scale"] == 1e4
    assert fixed[-1]["critic_skipped_steps"] == fixed[-1]["actor_skipped_steps"] == 0
    assert not all(np.isfinite(h["critic_loss"]) for h in naive)
    assert {h["critic_skipped_steps"] for h in naive} == {0.0}  # no loss scaler: nothing is skipped, nan or not


def test_skipped_steps_are_logged_and_each_halved_the_scale():
    """A loss scale of 2^40 overflows fp16's gradients: the scalers skip and halve until the gradients fit."""
    config = sac.SACConfig(
        policy="fp16", hidden_dims=(32, 32), batch_size=16, methods=dataclasses.replace(METHODS, init_scale=2.0**40)
    )
    _, history = _train(config, 40)
    for name in ("critic", "actor"):
        skipped = [h[f"{name}_skipped_steps"] for h in history]
        assert skipped == sorted(skipped) and 0 < skipped[-1] < 40
        scales = np.array([h[f"{name}_loss_scale"] for h in history])
        np.testing.assert_array_equal(np.log2(2.0**40 / scales), skipped)  # no growth in 40 steps: one halving each


def test_fp16_state_dtypes_follow_the_policy_and_survive_updates():
    config = sac.SACConfig(hidden_dims=(16, 16), batch_size=8, policy="fp16", methods=METHODS)
    state = sac.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, config)
    dtypes = jax.tree.map(lambda x: x.dtype, state)
    assert {x.dtype for x in jax.tree.leaves(state.actor.params)} == {jnp.dtype(jnp.float16)}
    assert state.temperature.params.dtype == jnp.float32
    state, _ = sac.update(state, _batch(8, 0))
    assert jax.tree.map(lambda x: x.dtype, state) == dtypes


def test_target_critic_moves_every_target_update_period_steps():
    config = sac.SACConfig(hidden_dims=(16, 16), batch_size=8, target_update_period=3, tau=0.5)
    state = sac.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, config)
    moved = []
    for i in range(6):
        before = jax.tree.map(np.asarray, state.target_critic)
        state, _ = sac.update(state, _batch(8, i))
        moved.append(
            any(
                not np.array_equal(a, np.asarray(b))
                for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.target_critic))
            )
        )
    assert moved == [True, False, False, True, False, False]
    assert int(state.step) == 6


def test_actor_updates_every_actor_update_period_steps():
    config = sac.SACConfig(hidden_dims=(16, 16), batch_size=8, actor_update_period=2)
    _, history = _train(config, 4)
    assert [np.isfinite(h["actor_loss"]) for h in history] == [True, False, True, False]
    assert all(np.isfinite(h["critic_loss"]) for h in history)


def test_act_is_deterministic_when_asked_and_bounded():
    config = sac.SACConfig(hidden_dims=(16, 16), batch_size=8)
    state = sac.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, config)
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(4, OBS_DIM)), jnp.float32)
    a = sac.act(state, obs, jax.random.key(1), deterministic=True)
    b = sac.act(state, obs, jax.random.key(2), deterministic=True)
    c = sac.act(state, obs, jax.random.key(1))
    d = sac.act(state, obs, jax.random.key(2))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(c), np.asarray(d))
    assert a.shape == (4, ACTION_DIM) and float(jnp.max(jnp.abs(c))) <= 1.0


def test_pixels_update_runs_and_actor_sees_detached_encoder_features():
    config = sac.SACConfig(
        hidden_dims=(32,),
        batch_size=4,
        pixels=True,
        policy="fp16",
        log_std_bounds=(-10, 2),
        sigma_eps=1e-4,
        weight_standardization=True,
        encoder_clip=10.0,
        methods=PrecisionMethods.paper(kahan_momentum_scale=1e2),
    )
    rng = np.random.default_rng(0)
    images = lambda: jnp.asarray(rng.integers(0, 256, (4, 84, 84, 9)), jnp.uint8)
    batch = {
        "obs": images(),
        "action": jnp.asarray(rng.uniform(-1, 1, (4, 3)), jnp.float32),
        "reward": jnp.ones(4),
        "discount": jnp.ones(4),
        "next_obs": images(),
    }
    state = sac.init(jax.random.key(0), batch["obs"][0], 3, config)
    encoder_before = jax.tree.map(np.asarray, state.critic.params["params"]["encoder"])
    state, metrics = sac.update(state, batch)
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert "encoder" not in state.actor.params["params"]
    changed = [
        not np.array_equal(a, np.asarray(b))
        for a, b in zip(jax.tree.leaves(encoder_before), jax.tree.leaves(state.critic.params["params"]["encoder"]))
    ]
    assert any(changed)  # the critic trains the encoder
    assert sac.act(state, batch["obs"], jax.random.key(0)).shape == (4, 3)


def test_random_shift_crops_a_padded_image():
    images = jnp.arange(2 * 6 * 6 * 1, dtype=jnp.float32).reshape(2, 6, 6, 1)
    np.testing.assert_array_equal(np.asarray(sac.random_shift(jax.random.key(0), images, 0)), np.asarray(images))
    shifted = np.asarray(sac.random_shift(jax.random.key(0), images, 2))
    padded = np.pad(np.asarray(images), [(0, 0), (2, 2), (2, 2), (0, 0)], mode="edge")
    for i in range(2):
        assert any(np.array_equal(shifted[i], padded[i, y : y + 6, x : x + 6]) for y in range(5) for x in range(5))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gamma=1.5), "gamma"),
        (dict(tau=0.0), "tau"),
        (dict(batch_size=0), "batch_size"),
        (dict(policy="fp12"), "Unknown precision policy"),
        (dict(log_std_bounds=(2, -5)), "log_std_bounds"),
        (dict(hidden_dims=()), "hidden_dims"),
        (dict(methods=dict(init_scale=0.5)), "init_scale"),
        (dict(methods=dict(hadm=True)), "Unknown precision method keys"),
        (dict(matmul_impl="cuda"), "impl must be one of"),
        (dict(matmul_impl="pallas"), "matmul dtype is float32"),
    ],
)
def test_bad_configs_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sac.SACConfig(**kwargs)


def test_from_mapping_rejects_unknown_keys_and_init_checks_observations():
    with pytest.raises(ValueError, match="Unknown SAC config keys"):
        sac.SACConfig.from_mapping({"gamma": 0.9, "lr": 1e-3})
    assert sac.SACConfig.from_mapping({"hidden_dims": [8, 8]}).hidden_dims == (8, 8)
    with pytest.raises(ValueError, match="pixels needs uint8"):
        sac.init(jax.random.key(0), jnp.zeros(5), 2, sac.SACConfig(pixels=True))
    with pytest.raises(ValueError, match="flat observations"):
        sac.init(jax.random.key(0), jnp.zeros((4, 4)), 2, sac.SACConfig())


@pytest.mark.parametrize("matmul_impl", ["xla", "pallas"])
def test_fp8_policy_trains_through_the_blockwise_kernels(matmul_impl):
    """The "fp8" policy (fp32 params, bf16 activations, W8A8 GEMMs) updates SAC with finite losses, and the
    Pallas kernel (interpret mode here) gives the same first update as the XLA reference path."""
    config = sac.SACConfig(hidden_dims=(32, 32), batch_size=16, policy="fp8", matmul_impl=matmul_impl)
    state, history = _train(config, 3)
    assert all(np.isfinite(v) for h in history for v in h.values())
    assert jax.tree.leaves(state.actor.params)[0].dtype == jnp.float32
    if matmul_impl == "pallas":
        _, reference = _train(dataclasses.replace(config, matmul_impl="xla"), 3)
        np.testing.assert_allclose(history[0]["critic_loss"], reference[0]["critic_loss"], rtol=1e-2)
