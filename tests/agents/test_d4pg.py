"""D4PG learner: shapes and dtypes, learning on a tiny fixed problem, target updates, fp16 with the methods,
the methods are the identity in float64, exploration, and clear errors."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from lpjax.agents import d4pg
from lpjax.methods import PrecisionMethods
from lpjax.nn import MLP

METHODS = PrecisionMethods(hadam=True, loss_scaling=True, kahan_gradients=True, kahan_momentum=True)
OBS_DIM, ACTION_DIM = 5, 2
SMALL = dict(actor_hidden=(32, 32), critic_hidden=(32, 32), batch_size=16)
# One config per compiled update: each test reuses one of these where it can (compiles dominate the runtime).
FP16 = d4pg.D4PGConfig(policy="fp16", **SMALL, methods=METHODS)
LEARN = d4pg.D4PGConfig(**SMALL, num_atoms=11, v_min=-1.0, v_max=1.0, critic_lr=3e-3, actor_lr=1e-3, tau=0.5)


def _batch(n: int, seed: int, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    return {
        "obs": jnp.asarray(rng.normal(size=(n, OBS_DIM)), dtype),
        "action": jnp.asarray(rng.uniform(-1, 1, (n, ACTION_DIM)), dtype),
        "reward": jnp.asarray(rng.uniform(0, 5, n), dtype),
        "discount": jnp.asarray((rng.uniform(size=n) > 0.1) * 0.99**5, dtype),
        "next_obs": jnp.asarray(rng.normal(size=(n, OBS_DIM)), dtype),
    }


def _train(config: d4pg.D4PGConfig, steps: int, dtype=jnp.float32, batch=None):
    state = d4pg.init(jax.random.key(0), jnp.zeros(OBS_DIM, dtype), ACTION_DIM, config)
    history = []
    for i in range(steps):
        state, metrics = d4pg.update(state, _batch(config.batch_size, i, dtype) if batch is None else batch)
        history.append({k: float(v) for k, v in metrics.items()})
    return state, history


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_fp16_with_methods_keeps_shapes_and_dtypes_and_stays_finite():
    config = FP16
    state = d4pg.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, config)
    for tree in (state.actor.params, state.critic.params, state.target_actor, state.target_critic):
        assert {x.dtype for x in jax.tree.leaves(tree)} == {jnp.dtype(jnp.float16)}
    assert state.critic.params["params"]["MLP_0"]["Dense_2"]["kernel"].shape == (32, config.num_atoms)
    assert state.target_compensation is not None
    for a, b in zip(_leaves(state.actor.params), _leaves(state.target_actor)):
        np.testing.assert_array_equal(a, b)
    structure = jax.tree.map(lambda x: (x.shape, x.dtype), state)
    state, metrics = d4pg.update(state, _batch(16, 0))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == structure
    assert set(metrics) == {
        "critic_loss",
        "actor_loss",
        "q_mean",
        "target_q_mean",
        "critic_loss_scale",
        "actor_loss_scale",
        "critic_skipped_steps",
        "actor_skipped_steps",
    }
    assert all(v.dtype == jnp.float32 and v.shape == () for v in metrics.values())
    assert int(state.step) == 1
    history = []
    for i in range(1, 20):
        state, metrics = d4pg.update(state, _batch(16, i))
        history.append({k: float(v) for k, v in metrics.items()})
    assert all(np.isfinite(v) for h in history for v in h.values())
    assert history[-1]["critic_loss_scale"] == 1e4 and history[-1]["actor_loss_scale"] == 1e4
    assert history[-1]["critic_skipped_steps"] == history[-1]["actor_skipped_steps"] == 0


def _one_step_problem():
    batch = _batch(16, 0)
    return dict(batch, reward=jnp.round(batch["action"][:, 0] * 5) / 5, discount=jnp.zeros(16))


def test_critic_and_actor_learn_a_fixed_one_step_problem():
    """Terminal transitions whose reward is the first action coordinate, on the atoms: the critic's
    distribution becomes the reward's (loss falls towards 0, Q to the reward) and the actor pushes a_0 to 1."""
    config = LEARN
    batch = _one_step_problem()
    state, history = _train(config, 150, batch=batch)
    reward = batch["reward"]
    assert history[-1]["critic_loss"] < 0.3 * history[0]["critic_loss"]
    np.testing.assert_allclose(history[-1]["q_mean"], float(jnp.mean(reward)), atol=0.05)
    np.testing.assert_allclose(history[-1]["target_q_mean"], float(jnp.mean(reward)), atol=1e-6)
    assert history[-1]["actor_loss"] < history[0]["actor_loss"] - 0.3
    actions = d4pg.act(state.actor.params, batch["obs"], jax.random.key(0), 0.0, config, ACTION_DIM)
    assert float(jnp.mean(actions[:, 0])) > 0.5
    assert "critic_loss_scale" not in history[0]  # loss scales only with loss_scaling


def test_polyak_targets_move_every_step_and_hard_copies_every_period():
    state, _ = _train(LEARN, 1, batch=_one_step_problem())
    initial = d4pg.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, LEARN)
    for now, before, online in [
        (state.target_actor, initial.actor.params, state.actor.params),
        (state.target_critic, initial.critic.params, state.critic.params),
    ]:
        for t, b, p in zip(_leaves(now), _leaves(before), _leaves(online)):
            np.testing.assert_allclose(t, b + 0.5 * (p - b), rtol=1e-6, atol=1e-7)

    config = d4pg.D4PGConfig(**SMALL, tau=1.0, target_update_period=3, methods=METHODS)
    state = d4pg.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, config)
    assert state.target_compensation is None  # hard copies need no Kahan compensation
    copied = []
    for i in range(4):
        before = _leaves((state.target_actor, state.target_critic))
        state, _ = d4pg.update(state, _batch(16, i))
        now, online = (
            _leaves((state.target_actor, state.target_critic)),
            _leaves((state.actor.params, state.critic.params)),
        )
        if all(np.array_equal(a, b) for a, b in zip(now, online)):
            copied.append(True)
        else:
            assert all(np.array_equal(a, b) for a, b in zip(now, before))
            copied.append(False)
    assert copied == [True, False, False, True]


def test_all_methods_are_the_identity_in_float64():
    f64 = "params=float64,compute=float64,output=float64"
    base = d4pg.D4PGConfig(**SMALL, policy=f64, adam_eps=1e-3, methods=PrecisionMethods(init_scale=64.0), tau=0.1)
    with jax.enable_x64(True):
        plain, plain_history = _train(base, 4, jnp.float64)
        fixed, fixed_history = _train(
            dataclasses.replace(base, methods=dataclasses.replace(METHODS, init_scale=64.0)), 4, jnp.float64
        )
        for name in ("actor", "critic"):
            for a, b in zip(_leaves(getattr(plain, name).params), _leaves(getattr(fixed, name).params)):
                np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)
        for a, b in zip(
            _leaves((plain.target_actor, plain.target_critic)), _leaves((fixed.target_actor, fixed.target_critic))
        ):
            np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)
        assert {x.dtype for x in jax.tree.leaves(fixed.actor.params)} == {jnp.dtype(jnp.float64)}
    np.testing.assert_allclose(plain_history[-1]["critic_loss"], fixed_history[-1]["critic_loss"], rtol=1e-6)
    assert fixed_history[-1]["critic_loss_scale"] == 64.0


def test_act_adds_clipped_gaussian_noise_with_per_row_sigma():
    config = d4pg.D4PGConfig(**SMALL)
    state = d4pg.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, config)
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(4, OBS_DIM)), jnp.float32)
    mean = d4pg.actor_network(config, ACTION_DIM).apply(state.actor.params, obs)
    greedy = d4pg.act(state.actor.params, obs, jax.random.key(1), 0.0, config, ACTION_DIM)
    np.testing.assert_array_equal(np.asarray(greedy), np.asarray(mean))
    sigma = jnp.array([0.0, 0.0, 0.2, 5.0])
    noisy = np.asarray(d4pg.act(state.actor.params, obs, jax.random.key(1), sigma, config, ACTION_DIM))
    np.testing.assert_array_equal(noisy[:2], np.asarray(mean)[:2])
    assert not np.array_equal(noisy[2], np.asarray(mean)[2])
    assert noisy.dtype == np.float32 and np.abs(noisy).max() <= 1.0 and np.abs(noisy[3]).max() == 1.0
    single = d4pg.act(state.actor.params, obs[0], jax.random.key(1), 0.1, config, ACTION_DIM)
    assert single.shape == (ACTION_DIM,)


def test_actor_parameters_are_a_plain_mlp_with_tanh():
    """So actors can run (and quantize) the policy as an MLP: ``{"params": {"Dense_0", ...}}``."""
    config = d4pg.D4PGConfig(**SMALL)
    state = d4pg.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, config)
    assert sorted(state.actor.params["params"]) == ["Dense_0", "Dense_1", "Dense_2"]
    obs = jnp.ones((3, OBS_DIM))
    mlp = MLP(config.actor_hidden, ACTION_DIM)
    np.testing.assert_array_equal(
        np.asarray(jnp.tanh(mlp.apply(state.actor.params, obs))),
        np.asarray(d4pg.actor_network(config, ACTION_DIM).apply(state.actor.params, obs)),
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gamma=0.0), "gamma"),
        (dict(n_step=0), "n_step"),
        (dict(num_atoms=1), "num_atoms"),
        (dict(v_min=1.0, v_max=1.0), "v_min must be < v_max"),
        (dict(tau=1.5), "tau"),
        (dict(target_update_period=0), "target_update_period"),
        (dict(actor_hidden=()), "actor_hidden"),
        (dict(critic_lr=0.0), "learning rates"),
        (dict(batch_size=0), "batch_size"),
        (dict(methods=dict(init_scale=0.5)), "init_scale"),
        (dict(policy="fp12"), "Unknown precision policy"),
        (dict(matmul_impl="cuda"), "impl must be one of"),
    ],
)
def test_bad_configs_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        d4pg.D4PGConfig(**kwargs)


def test_from_mapping_and_init_checks():
    with pytest.raises(ValueError, match="Unknown D4PG config keys \\['lr'\\]"):
        d4pg.D4PGConfig.from_mapping({"gamma": 0.9, "lr": 1e-3})
    config = d4pg.D4PGConfig.from_mapping(
        ml_collections.ConfigDict(dict(dataclasses.asdict(d4pg.D4PGConfig()), actor_hidden=[8, 8]))
    )
    assert config.actor_hidden == (8, 8) and config == d4pg.D4PGConfig(actor_hidden=(8, 8))
    hash(config)  # a static argument of jit
    with pytest.raises(ValueError, match="flat observations"):
        d4pg.init(jax.random.key(0), jnp.zeros((4, 4)), 2, d4pg.D4PGConfig(**SMALL))
    with pytest.raises(ValueError, match="action_dim"):
        d4pg.init(jax.random.key(0), jnp.zeros(4), 0, d4pg.D4PGConfig(**SMALL))
