"""PrecisionMethods (validation, switches, the paper's set, mappings), the learner configs that nest it (round
trips, hashing, command-line overrides) and method_optimizer against optax's optimizers."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from absl import flags
from ml_collections import config_flags

from experiments.cli import REPO_ROOT
from lpjax import optim
from lpjax.agents import PrecisionMethods as ExportedPrecisionMethods
from lpjax.agents.d4pg import D4PGConfig
from lpjax.agents.sac import SACConfig
from lpjax.methods import PrecisionMethods, method_optimizer
from tests.optim.helpers import max_relative_error, random_tree, run_steps

PAPER = ("hadam", "loss_scaling", "kahan_gradients", "kahan_momentum", "softplus_fix", "normal_fix")
CONFIGS = (SACConfig, D4PGConfig)


# ------------------------------------------------------------------------------------------- PrecisionMethods


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(hadam=1), "hadam must be True or False"),
        (dict(normal_fix="yes"), "normal_fix must be True or False"),
        (dict(moment_dtype="float12"), "Unknown dtype name 'float12'"),
        (dict(init_scale=0.5), "init_scale must be >= 1"),
        (dict(growth_interval=0), "growth_interval must be >= 1"),
        (dict(kahan_momentum_scale=0.0), "kahan_momentum_scale must be > 0"),
        (
            dict(stochastic_rounding=True, kahan_gradients=True, kahan_momentum=True),
            "kahan_gradients and kahan_momentum are both on",
        ),
    ],
)
def test_invalid_methods_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrecisionMethods(**kwargs)


def test_switches_are_the_boolean_fields_in_declaration_order_and_all_off_by_default():
    booleans = tuple(f.name for f in dataclasses.fields(PrecisionMethods) if type(f.default) is bool)
    assert PrecisionMethods.switches() == booleans
    assert set(PAPER) | {"stochastic_rounding"} == set(booleans)
    assert not any(getattr(PrecisionMethods(), name) for name in booleans)
    assert PrecisionMethods(moment_dtype="BF16").moment_numpy_dtype == jnp.dtype(jnp.bfloat16)
    assert PrecisionMethods().moment_numpy_dtype is None
    assert ExportedPrecisionMethods is PrecisionMethods


def test_paper_turns_on_the_six_methods_and_nothing_else():
    paper = PrecisionMethods.paper()
    assert {name for name in PrecisionMethods.switches() if getattr(paper, name)} == set(PAPER)
    assert dataclasses.replace(paper, **dict.fromkeys(PAPER, False)) == PrecisionMethods()
    changed = PrecisionMethods.paper(init_scale=64.0, normal_fix=False)
    assert changed.init_scale == 64.0 and not changed.normal_fix and changed.softplus_fix
    with pytest.raises(ValueError, match="stochastic_rounding replaces a Kahan buffer"):
        PrecisionMethods.paper(stochastic_rounding=True)


def test_from_mapping_converts_dicts_and_config_dicts_and_names_the_valid_keys():
    assert PrecisionMethods.from_mapping({"hadam": True, "init_scale": 8.0}) == PrecisionMethods(
        hadam=True, init_scale=8.0
    )
    cd = ml_collections.ConfigDict(dataclasses.asdict(PrecisionMethods.paper()))
    assert PrecisionMethods.from_mapping(cd) == PrecisionMethods.paper()
    paper = PrecisionMethods.paper()
    assert PrecisionMethods.from_mapping(paper) is paper
    with pytest.raises(ValueError, match=r"Unknown precision method keys \['hadm'\]; valid keys: hadam, "):
        PrecisionMethods.from_mapping({"hadm": True})


# ------------------------------------------------------------------------------------------ learner configs


@pytest.mark.parametrize("config_class", CONFIGS)
def test_a_config_round_trips_through_asdict_and_stays_hashable(config_class):
    config = config_class(
        policy="fp16", methods=PrecisionMethods.paper(init_scale=128.0, moment_dtype="fp32"), gamma=0.95
    )
    values = dataclasses.asdict(config)
    assert isinstance(values["methods"], dict)
    assert config_class.from_mapping(values) == config
    assert config_class.from_mapping(ml_collections.ConfigDict(values)) == config
    from_dict = config_class(policy="fp16", methods=values["methods"], gamma=0.95)  # a mapping is converted
    assert isinstance(from_dict.methods, PrecisionMethods) and from_dict == config
    assert hash(from_dict) == hash(config)  # a static argument of jax.jit
    with pytest.raises(ValueError, match="Unknown precision method keys"):
        config_class.from_mapping({"methods": {"kahan": True}})
    with pytest.raises(ValueError, match="config keys \\['hadam', 'lr'\\]"):  # methods belong in ``methods``
        config_class.from_mapping({"lr": 1e-3, "hadam": True})


def _parse(config_file: str, *overrides: str) -> ml_collections.ConfigDict:
    argv = ["prog", f"--config={REPO_ROOT / 'experiments' / 'configs' / config_file}", *overrides]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, lock_config=True, sys_argv=argv)
    flag_values(argv)
    return flag_values.config


@pytest.mark.parametrize(
    "config_file, config_class", [("sac/fp16.py", SACConfig), ("sac/fp32.py", SACConfig), ("d4pg/fp16.py", D4PGConfig)]
)
def test_method_fields_are_overridden_on_the_command_line(config_file, config_class):
    default = config_class.from_mapping(_parse(config_file).agent.to_dict())
    assert default.methods.moment_dtype is None
    config = _parse(
        config_file,
        "--config.agent.methods.moment_dtype=bf16",
        "--config.agent.methods.hadam=False",
        "--config.agent.methods.init_scale=64",
    )
    agent = config_class.from_mapping(config.agent.to_dict())
    assert agent.methods == dataclasses.replace(default.methods, moment_dtype="bf16", hadam=False, init_scale=64.0)
    assert config_class.from_mapping(config.agent) == agent  # the ConfigDict itself, as the D4PG loop passes it


# ------------------------------------------------------------------------------------------ method_optimizer


def _assert_bitwise_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_all_methods_off_is_optax_adam_bit_for_bit():
    params, grads = random_tree(0), [random_tree(i, scale=0.1) for i in range(1, 21)]
    ref, ref_state, ref_updates = run_steps(optax.adam(1e-3, b1=0.8, b2=0.99, eps=1e-6), params, grads)
    got, state, updates = run_steps(
        method_optimizer(1e-3, PrecisionMethods(), b1=0.8, b2=0.99, eps=1e-6), params, grads
    )
    _assert_bitwise_equal(updates, ref_updates)
    _assert_bitwise_equal(got, ref)
    _assert_bitwise_equal(state, ref_state)


def test_moment_dtype_is_optax_adams_mu_dtype():
    params, grads = random_tree(0), [random_tree(i, scale=0.1) for i in range(1, 6)]
    ref, _, _ = run_steps(optax.adam(1e-3, mu_dtype=jnp.bfloat16), params, grads)
    got, state, _ = run_steps(method_optimizer(1e-3, PrecisionMethods(moment_dtype="bf16")), params, grads)
    _assert_bitwise_equal(got, ref)
    assert {x.dtype for x in jax.tree.leaves(state[0].mu)} == {jnp.dtype(jnp.bfloat16)}


def test_all_methods_off_with_weight_decay_is_optax_adamw_bit_for_bit():
    params, grads = random_tree(0), [random_tree(i, scale=0.1) for i in range(1, 21)]
    ref, _, ref_updates = run_steps(optax.adamw(1e-3, b1=0.8, eps=1e-6, weight_decay=1e-2), params, grads)
    got, _, updates = run_steps(
        method_optimizer(1e-3, PrecisionMethods(), b1=0.8, eps=1e-6, weight_decay=1e-2), params, grads
    )
    _assert_bitwise_equal(updates, ref_updates)
    _assert_bitwise_equal(got, ref)


@pytest.mark.parametrize("hadam", [True, False])
def test_loss_scaled_methods_with_decay_and_clipping_equal_the_unscaled_reference_in_float64(hadam):
    with jax.enable_x64(True):
        params = random_tree(0, jnp.float64)
        grads = [random_tree(i, jnp.float64) for i in range(1, 51)]  # global norm ~5: the clip at 1 acts
        ref, _, _ = run_steps(
            optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, eps=1e-3, weight_decay=1e-2)), params, grads
        )
        methods = PrecisionMethods(
            hadam=hadam, loss_scaling=True, kahan_gradients=True, init_scale=256.0, growth_interval=20
        )
        tx = method_optimizer(1e-2, methods, eps=1e-3, weight_decay=1e-2, max_grad_norm=1.0)
        got, state, _ = run_steps(tx, params, grads, loss_scale_fn=optim.loss_scale)
        assert float(optim.loss_scale(state)) == 1024.0  # grew twice in 50 steps: the scale changed mid-run
        assert max_relative_error(got, ref) < 1e-9


def test_stochastic_rounding_ends_the_chain_in_place_of_kahan():
    config = SACConfig(methods=PrecisionMethods(hadam=True, loss_scaling=True, stochastic_rounding=True))
    state = method_optimizer(1e-3, config.methods).init({"w": jnp.ones((2,), jnp.float16)})
    assert isinstance(state[-1], optim.StochasticRoundingState)
    assert not any(isinstance(s, optim.KahanSummationState) for s in state)
