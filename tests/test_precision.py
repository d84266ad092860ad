"""Precision policies (lpjax.precision): parsing, validation, hashing, and dtype casting of pytrees."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lpjax import precision
from lpjax.precision import Policy, get_policy

F32, F16, BF16, F64 = (np.dtype(d) for d in (jnp.float32, jnp.float16, jnp.bfloat16, jnp.float64))

NAMED = {
    "fp32": (F32, F32, F32),
    "fp16": (F16, F16, F16),
    "bf16": (BF16, BF16, BF16),
    "mixed_fp16": (F32, F16, F32),
    "mixed_bf16": (F32, BF16, F32),
    "fp8": (F32, BF16, F32),
}


def dtypes(policy: Policy):
    return policy.param_dtype, policy.compute_dtype, policy.output_dtype


# --- names ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,expected", NAMED.items())
def test_named_policies_have_the_documented_dtypes(name, expected):
    policy = get_policy(name)
    assert dtypes(policy) == expected
    assert all(isinstance(d, np.dtype) for d in dtypes(policy))
    assert get_policy(f"  {name.upper()} ") == policy  # case and surrounding blanks are ignored


def test_policies_registry_is_exactly_the_named_policies():
    assert set(precision.POLICIES) == set(NAMED)


@pytest.mark.parametrize(
    "name,low",
    [("fp32", False), ("fp16", True), ("bf16", True), ("mixed_fp16", True), ("mixed_bf16", True), ("fp8", True)],
)
def test_is_low_precision(name, low):
    assert get_policy(name).is_low_precision is low


def test_get_policy_returns_a_policy_argument_unchanged():
    policy = Policy("float16", "bfloat16", "float32")
    assert get_policy(policy) is policy


@pytest.mark.parametrize("name", ["fp8_e4m3", "e4m3", "mixed", "", "fp16_mixed", "float17"])
def test_unknown_policy_name_raises_value_error_listing_valid_names(name):
    with pytest.raises(ValueError) as info:
        get_policy(name)
    message = str(info.value)
    for valid in NAMED:
        assert valid in message
    assert "params=" in message  # and mentions the explicit form


@pytest.mark.parametrize("spec", [None, 16, jnp.float16])
def test_get_policy_rejects_non_string_specs(spec):
    with pytest.raises(TypeError):
        get_policy(spec)


# --- jmp's policy strings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("half", (F16, F16, F16)),  # jmp: every component in the half dtype (lpjax: float16 on every platform)
        ("full", (F32, F32, F32)),
        ("f16", (F16, F16, F16)),
        ("bfloat16", (BF16, BF16, BF16)),
        ("p=f32,c=f16,o=f32", (F32, F16, F32)),
        ("c=f16", (F32, F16, F16)),  # params default to float32, output follows compute
        ("p=f16", (F16, F16, F16)),  # compute follows params
        ("p=f16,c=bf16", (F16, BF16, BF16)),
        ("params=half,compute=half,output=full", (F16, F16, F32)),
    ],
)
def test_jmp_policy_strings_have_jmps_meaning(spec, expected):
    policy = get_policy(spec)
    assert dtypes(policy) == expected
    assert policy.matmul_dtype == policy.compute_dtype


# --- explicit strings ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("params=float32,compute=float16,output=float32", (F32, F16, F32)),
        ("compute=float16,output=float32,params=float32", (F32, F16, F32)),  # any order
        ("p=f32,c=f16,o=f32", (F32, F16, F32)),  # key and dtype abbreviations
        ("param=fp16,compute=half,out=bf16", (F16, F16, BF16)),
        ("Params = Float16 , Compute = BF16 ", (F16, BF16, BF16)),  # case, blanks; output follows compute
        ("compute=bfloat16", (F32, BF16, BF16)),  # jmp: params float32, output follows
        ("p=single,c=full,o=double", (F32, F32, F64)),
        ("c=e4m3,o=e5m2", (F32, np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2))),
    ],
)
def test_explicit_policy_strings(spec, expected):
    assert dtypes(get_policy(spec)) == expected


@pytest.mark.parametrize(
    "spec,fragment",
    [
        ("params=float32,weights=float16", "weights"),  # unknown key
        ("params=float32,compute", "compute"),  # item without '='
        ("params=float32,,compute=float16", "key=dtype"),  # empty item
        ("=float16", "key=dtype"),  # empty key
    ],
)
def test_bad_policy_keys_raise_value_error_listing_valid_keys(spec, fragment):
    with pytest.raises(ValueError) as info:
        get_policy(spec)
    message = str(info.value)
    assert fragment in message
    for key in ("params", "compute", "output"):
        assert key in message


@pytest.mark.parametrize("spec", ["params=float17", "compute=", "output=fp16x", "c=float16,o=int"])
def test_bad_policy_dtype_names_raise_value_error_listing_valid_dtypes(spec):
    with pytest.raises(ValueError) as info:
        get_policy(spec)
    message = str(info.value)
    for valid in ("float32", "float16", "bfloat16", "bf16", "half"):
        assert valid in message


@pytest.mark.parametrize(
    "spec", ["params=float32,params=float16", "p=f16,params=f16", "c=f16,compute=bf16", "o=f32,out=f32"]
)
def test_repeated_policy_keys_raise_value_error(spec):
    with pytest.raises(ValueError, match="twice"):
        get_policy(spec)


@pytest.mark.parametrize("dtype", [jnp.int32, np.int8, jnp.uint8, np.bool_, np.complex64, "int8", "int32", "bool"])
def test_non_floating_dtypes_are_rejected(dtype):
    with pytest.raises(ValueError):
        Policy(param_dtype=dtype)
    if isinstance(dtype, str):
        with pytest.raises(ValueError):
            get_policy(f"compute={dtype}")


def test_policy_accepts_dtype_objects_and_names_alike():
    policies = [
        Policy(np.float16, jnp.bfloat16, "f32"),
        Policy("half", "bf16", np.dtype("float32")),
        get_policy("p=float16,c=bfloat16,o=float32"),
    ]
    assert all(p == policies[0] for p in policies)
    assert len({hash(p) for p in policies}) == 1
    assert Policy() == get_policy("fp32")


# --- str round trip ------------------------------------------------------------------------------------------

_DTYPE_NAMES = ["float64", "float32", "float16", "bfloat16", "f16", "half", "bf16", "fp32", "float8_e4m3fn", "e5m2"]


@given(p=st.sampled_from(_DTYPE_NAMES), c=st.sampled_from(_DTYPE_NAMES), o=st.sampled_from(_DTYPE_NAMES))
def test_str_round_trips_through_get_policy(p, c, o):
    policy = get_policy(f"params={p},compute={c},output={o}")
    text = str(policy)
    assert get_policy(text) == policy
    assert str(get_policy(text)) == text
    assert text.startswith(f"params={policy.param_dtype.name},")


@pytest.mark.parametrize("name", NAMED)
def test_str_of_named_policies_round_trips(name):
    assert get_policy(str(get_policy(name))) == get_policy(name)


# --- immutability, hashing, jit ------------------------------------------------------------------------------


def test_policy_is_immutable_and_with_output_dtype_copies():
    policy = get_policy("fp16")
    with pytest.raises(AttributeError):
        policy.compute_dtype = F32
    other = policy.with_output_dtype("float32")
    assert dtypes(other) == (F16, F16, F32)
    assert dtypes(policy) == (F16, F16, F16)
    with pytest.raises(ValueError):
        policy.with_output_dtype("int8")


def test_policy_is_hashable_and_equal_policies_hash_equal():
    table = {get_policy(name): name for name in NAMED}
    assert len(table) == len(NAMED)
    assert table[Policy("float32", "float16", "float32")] == "mixed_fp16"
    assert table[get_policy("p=f32,c=bf16,o=f32")] == "mixed_bf16"
    assert get_policy("fp16") != get_policy("mixed_fp16")


def test_policy_is_a_jit_static_argument_and_equal_policies_share_the_cache():
    traces = []

    def impl(x, policy):
        traces.append(policy)  # runs once per trace
        return policy.cast_to_output(policy.cast_to_compute(x) * 2)

    f = jax.jit(impl, static_argnums=1)
    x = jnp.ones((3,), jnp.float32)
    out = f(x, get_policy("mixed_fp16"))
    assert out.dtype == F32
    f(x, Policy("f32", "f16", "f32"))  # equal policy: cache hit, no retrace
    assert len(traces) == 1
    out = f(x, get_policy("fp16"))
    assert out.dtype == F16
    assert len(traces) == 2


# --- casting -------------------------------------------------------------------------------------------------


def _tree():
    return {
        "w": jnp.ones((2, 3), jnp.float32),
        "b": np.zeros((3,), np.float64),  # numpy floating leaves are cast too
        "h": jnp.ones((2,), jnp.bfloat16),
        "step": jnp.array(7, jnp.int32),
        "mask": jnp.array([True, False]),
        "ids": np.arange(4, dtype=np.int64),
        "nested": [(jnp.full((1,), 0.5, jnp.float16), jnp.array([1, 2], jnp.uint8)), None],
        "name": "actor",
    }


@pytest.mark.parametrize(
    "method,attr",
    [("cast_to_param", "param_dtype"), ("cast_to_compute", "compute_dtype"), ("cast_to_output", "output_dtype")],
)
@pytest.mark.parametrize("name", ["fp16", "bf16", "mixed_fp16"])
def test_cast_helpers_cast_only_floating_leaves_of_nested_pytrees(name, method, attr):
    policy = get_policy(name)
    target = getattr(policy, attr)
    tree = _tree()
    out = getattr(policy, method)(tree)
    assert jax.tree.structure(out) == jax.tree.structure(tree)
    for key in ("w", "b", "h"):
        assert out[key].dtype == target
        np.testing.assert_array_equal(np.asarray(out[key], np.float64), np.asarray(tree[key], np.float64))
    assert out["nested"][0][0].dtype == target
    # Non-floating leaves are returned untouched (same object, same dtype).
    assert out["step"] is tree["step"] and out["step"].dtype == jnp.int32
    assert out["mask"] is tree["mask"] and out["mask"].dtype == jnp.bool_
    assert out["ids"] is tree["ids"]
    assert out["nested"][0][1] is tree["nested"][0][1]
    assert out["nested"][1] is None and out["name"] == "actor"


def test_cast_leaves_already_in_the_target_dtype_unchanged():
    tree = {"a": jnp.ones((2,), jnp.float16)}
    assert get_policy("fp16").cast_to_compute(tree)["a"] is tree["a"]


def test_cast_inside_jit_and_grad():
    policy = get_policy("mixed_fp16")

    def loss(params, x):
        p = policy.cast_to_compute(params)
        y = p["w"] * policy.cast_to_compute(x) + p["b"]
        return jnp.sum(policy.cast_to_output(y))

    params = {"w": jnp.full((3,), 2.0, jnp.float32), "b": jnp.zeros((3,), jnp.float32)}
    value, grads = jax.jit(jax.value_and_grad(loss))(params, jnp.arange(3.0))
    assert value.dtype == F32 and float(value) == 6.0
    assert grads["w"].dtype == F32  # gradients come back in the param dtype
    np.testing.assert_array_equal(np.asarray(grads["w"]), [0.0, 1.0, 2.0])


def test_matmul_dtype_defaults_to_compute_and_parses():
    assert Policy("f32", "f16", "f32") == Policy("f32", "f16", "f32", "f16")
    assert str(Policy("f32", "f16", "f32")) == "params=float32,compute=float16,output=float32"
    fp8 = get_policy("fp8")
    assert (fp8.param_dtype, fp8.compute_dtype, fp8.matmul_dtype) == (
        np.dtype("float32"),
        np.dtype(jnp.bfloat16),
        np.dtype(jnp.float8_e4m3fn),
    )
    assert get_policy(str(fp8)) == fp8 and fp8.is_low_precision
    assert get_policy("p=f32,c=bf16,o=f32,m=e4m3") == fp8
    with pytest.raises(ValueError, match="matmul_dtype twice"):
        get_policy("matmul=e4m3,m=e4m3")


# --- set_policy: flax models nobody here wrote ---------------------------------------------------------------------


def _matmul_operand_dtypes(fn, *args) -> list[tuple[str, ...]]:
    """The operand dtypes of every dot and convolution ``fn(*args)`` traces to."""
    jaxpr = jax.make_jaxpr(fn)(*args)
    return [
        tuple(str(v.aval.dtype) for v in eqn.invars)
        for eqn in jaxpr.jaxpr.eqns
        if eqn.primitive.name in ("dot_general", "conv_general_dilated")
    ]


def _variable_dtypes(model, variable_type) -> dict[str, np.dtype]:
    from flax import nnx

    state = nnx.state(model, variable_type)
    return {jax.tree_util.keystr(path): leaf.dtype for path, leaf in jax.tree_util.tree_leaves_with_path(state)}


def _mnist_cnn(seed=0):
    from flax import nnx

    from experiments.ports.flax_mnist import CNN

    return CNN(rngs=nnx.Rngs(seed))


@pytest.fixture
def no_warnings():
    """Turns every warning into an error (dtype promotion warnings are FutureWarnings)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.mark.usefixtures("no_warnings")
def test_set_policy_puts_flax_mnist_cnn_in_float16_with_batchnorm_in_float32():
    from flax import nnx

    reference = _mnist_cnn()
    model = precision.set_policy(_mnist_cnn(), "fp16")
    params = _variable_dtypes(model, nnx.Param)
    assert {k for k, d in params.items() if d == F32} == {
        f"['batch_norm{i}']['{name}'].value" for i in (1, 2) for name in ("scale", "bias")
    }
    assert {k for k, d in params.items() if d == F16} == {
        f"['{layer}']['{name}'].value"
        for layer in ("conv1", "conv2", "linear1", "linear2")
        for name in ("kernel", "bias")
    }
    assert set(_variable_dtypes(model, nnx.BatchStat).values()) == {F32}
    # The model's own initial values, rounded once.
    np.testing.assert_array_equal(
        np.asarray(model.linear1.kernel.get_value()), np.asarray(reference.linear1.kernel.get_value(), np.float16)
    )
    model.eval()
    x = jax.random.uniform(jax.random.key(0), (4, 28, 28, 1))
    out = model(x, None)
    assert out.dtype == F16 and out.shape == (4, 10)
    operands = _matmul_operand_dtypes(lambda x: model(x, None), x)
    assert len(operands) == 4 and set(operands) == {("float16", "float16")}
    # Same classes for isinstance, same variables and paths (checkpoints of the fp32 model still fit).
    assert isinstance(model, type(reference)) and isinstance(model.batch_norm1, nnx.BatchNorm)
    assert jax.tree.structure(nnx.state(model)) == jax.tree.structure(nnx.state(reference))


@pytest.mark.usefixtures("no_warnings")
def test_set_policy_batchnorm_statistics_are_float32_sums_of_the_float16_activations():
    from flax import nnx

    model = precision.set_policy(_mnist_cnn(), "fp16")
    norm, reference = model.batch_norm1, nnx.BatchNorm(32, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (8, 26, 26, 32), jnp.float16) * 3 + 1
    y = norm(x)
    expected = reference(x.astype(jnp.float32))
    assert y.dtype == F16 and norm.mean.get_value().dtype == F32
    np.testing.assert_allclose(np.asarray(norm.mean.get_value()), np.asarray(reference.mean.get_value()), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(norm.var.get_value()), np.asarray(reference.var.get_value()), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(expected.astype(jnp.float16)))


@pytest.mark.usefixtures("no_warnings")
def test_set_policy_trains_flax_mnist_cnn_with_flax_train_step_and_no_dtype_warning():
    """flax's own train step (nnx.value_and_grad, nnx.Optimizer, nnx.MultiMetric) on the model under the policy:
    casting its state by hand instead raises jax's FutureWarning about scatter dtypes (the BatchNorm statistics)."""
    import optax
    from flax import nnx

    from experiments.ports import flax_mnist

    batch = {"image": jax.random.uniform(jax.random.key(0), (16, 28, 28, 1)), "label": jnp.arange(16) % 10}
    for keep in (None, ()):
        model = precision.set_policy(_mnist_cnn(), "fp16", keep_float32=keep)
        optimizer = nnx.Optimizer(model, optax.sgd(0.05, 0.9), wrt=nnx.Param)
        metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
        for _ in range(3):
            flax_mnist.train_step(model, optimizer, metrics, batch, nnx.Rngs(1))
        assert np.isfinite(float(metrics.compute()["loss"]))
        assert set(_variable_dtypes(model, nnx.BatchStat).values()) == {F32}  # as flax computes them
        norm_params = {d for k, d in _variable_dtypes(model, nnx.Param).items() if "batch_norm" in k}
        assert norm_params == ({F32} if keep is None else {F16})


def test_set_policy_keeps_the_types_it_is_given_and_follows_mixed_policies():
    from flax import nnx

    model = precision.set_policy(_mnist_cnn(), "mixed_fp16")  # float32 parameters, float16 compute and output f32
    params = _variable_dtypes(model, nnx.Param)
    assert set(params.values()) == {F32}
    model.eval()
    x = jnp.ones((2, 28, 28, 1))
    assert model(x, None).dtype == F32
    assert set(_matmul_operand_dtypes(lambda x: model(x, None), x)) == {("float16", "float16")}

    kept = precision.set_policy(_mnist_cnn(), "fp16", keep_float32=(nnx.Linear,))  # replaces the default
    params = _variable_dtypes(kept, nnx.Param)
    assert {k.split("'")[1] for k, d in params.items() if d == F32} == {"linear1", "linear2"}
    kept.eval()
    assert _matmul_operand_dtypes(lambda x: kept(x, None), x) == [
        ("float16", "float16"),
        ("float16", "float16"),
        ("float32", "float32"),
        ("float32", "float32"),
    ]
    assert {d for k, d in _variable_dtypes(kept, nnx.Param).items() if "batch_norm" in k} == {F16}  # not kept

    again = precision.set_policy(kept, "fp32")  # a new policy replaces the old one
    assert set(_variable_dtypes(again, nnx.Param).values()) == {F32}
    assert again(x, None).dtype == F32 and type(again).__mro__[1] is type(_mnist_cnn())


@pytest.mark.usefixtures("no_warnings")
def test_set_policy_overrides_a_linen_model_that_fixes_float32():
    from tests.flax_examples import AtariActorCritic

    network = precision.set_policy(AtariActorCritic(num_outputs=4), "fp16")
    x = jnp.zeros((2, 84, 84, 4), jnp.uint8)
    variables = network.init(jax.random.key(0), x)
    assert {leaf.dtype for leaf in jax.tree.leaves(variables)} == {F16}
    reference = AtariActorCritic(num_outputs=4).init(jax.random.key(0), x)
    np.testing.assert_array_equal(
        np.asarray(variables["params"]["hidden"]["kernel"]), np.asarray(reference["params"]["hidden"]["kernel"], F16)
    )
    log_probs, value = jax.jit(network.apply)(variables, x)
    assert log_probs.dtype == F16 and value.dtype == F16
    assert set(_matmul_operand_dtypes(network.apply, variables, x)) == {("float16", "float16")}
    assert isinstance(network, AtariActorCritic) and network.num_outputs == 4


@pytest.mark.usefixtures("no_warnings")
def test_set_policy_linen_resnet_keeps_batchnorm_and_its_statistics_in_float32():
    from tests.flax_examples import ResNet1

    network = precision.set_policy(ResNet1(num_classes=10, num_filters=8), "fp16")
    x = jax.random.normal(jax.random.key(0), (4, 32, 32, 3))
    variables = network.init(jax.random.key(1), x)
    params = {jax.tree_util.keystr(p): leaf.dtype for p, leaf in jax.tree_util.tree_leaves_with_path(variables)}
    norms = {k: d for k, d in params.items() if "bn_" in k or "BatchNorm" in k or "norm_proj" in k}
    assert norms and set(norms.values()) == {F32}
    assert {d for k, d in params.items() if k not in norms} == {F16}
    logits, updated = network.apply(variables, x, mutable=["batch_stats"])
    assert logits.dtype == F16 and {leaf.dtype for leaf in jax.tree.leaves(updated)} == {F32}
    assert set(_matmul_operand_dtypes(lambda v, x: network.apply(v, x, train=False), variables, x)) == {
        ("float16", "float16")
    }


def test_set_policy_refuses_what_is_not_a_flax_module():
    with pytest.raises(TypeError, match="flax linen or nnx Module, got dict"):
        precision.set_policy({"w": jnp.ones(3)}, "fp16")
