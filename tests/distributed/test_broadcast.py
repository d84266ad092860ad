"""The parameter quantizer: int8 broadcasts are ~4x smaller and rebuild a policy close to the fp32 one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.distributed import build_policy, decode_policy, encode_policy
from lpjax.distributed.broadcast import policy_mlp_params
from lpjax.inference import Fp32MLP, Int8MLP
from lpjax.nn import MLP


@pytest.fixture(scope="module")
def actor_params():
    """Flax variables of a tanh(MLP) actor, nested one level like a head module's."""
    params = MLP((256, 256, 256), 6).init(jax.random.key(0), jnp.zeros((1, 24)))
    return {"params": {"MLP_0": params["params"]}}


def test_int8_broadcast_is_4x_smaller_and_close_to_fp32(actor_params):
    int8, fp32 = encode_policy(actor_params, "int8"), encode_policy(actor_params, "fp32")
    assert 3.6 < len(fp32) / len(int8) < 4.0  # float32 biases and per-channel scales stay, plus a header
    obs = np.random.default_rng(0).normal(size=(8, 24)).astype(np.float32)
    exact = np.tanh(np.asarray(MLP((256, 256, 256), 6).apply({"params": policy_mlp_params(actor_params)}, obs)))
    fp32_policy = build_policy(decode_policy(fp32), "fp32")
    int8_policy = build_policy(decode_policy(int8), "int8")
    assert isinstance(fp32_policy, Fp32MLP) and isinstance(int8_policy, Int8MLP)
    # the broadcast carries lpjax's int8 weights unchanged: the same runtime as quantizing the parameters directly
    np.testing.assert_array_equal(int8_policy(obs), Int8MLP.from_params(policy_mlp_params(actor_params))(obs))
    np.testing.assert_allclose(fp32_policy(obs), exact, atol=1e-5)
    error = np.abs(int8_policy(obs) - exact).max()
    assert 0 < error < 0.05


def test_scheme_mismatch_and_foreign_trees_are_refused(actor_params):
    with pytest.raises(ValueError, match="packed as 'fp32'"):
        build_policy(decode_policy(encode_policy(actor_params, "fp32")), "int8")
    with pytest.raises(ValueError, match="runtime must be one of"):
        encode_policy(actor_params, "int4")
    with pytest.raises(ValueError, match="exactly one MLP"):
        encode_policy({"params": {"a": {"Dense_0": {}}, "b": {"Dense_0": {}}}}, "int8")
