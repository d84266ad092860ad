"""Packed parameters of lpjax.quant.packing: exact fp32, fp16-rounded and int8 (within scale / 2) round trips,
the self-describing header, ~4x smaller int8 broadcasts of an ActorQ 3x2048 actor, and clear errors."""

from __future__ import annotations

import itertools
import json
import struct

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import quant
from lpjax.quant import Int8Weight
from lpjax.quant.packing import MAGIC

SLACK = 1.0 + 2.0**-20


def _mlp(sizes, seed=0):
    """Flax-style params of an MLP ``sizes[0] -> ... -> sizes[-1]``."""
    key, layers = jax.random.key(seed), {}
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        key, k_w, k_b = jax.random.split(key, 3)
        layers[f"Dense_{i}"] = {
            "kernel": jax.random.normal(k_w, (fan_in, fan_out)) / np.sqrt(fan_in),
            "bias": 0.1 * jax.random.normal(k_b, (fan_out,)),
        }
    return {"params": layers}


def _tree():
    params = _mlp([5, 16, 16, 3])
    params["params"]["Conv_0"] = {"kernel": np.random.default_rng(0).standard_normal((3, 3, 2, 4)).astype(np.float32)}
    params["params"]["log_alpha"] = np.float32(-2.3)  # a 0-d leaf
    params["params"]["Dense_1"]["kernel"] = params["params"]["Dense_1"]["kernel"].at[:, 2].set(0.0)  # zero column
    params["empty"] = {}
    return params


def _paths(tree, prefix=()):
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in _paths(v, prefix + (k,))] or [prefix]
    return [prefix]


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def test_fp32_round_trip_is_exact():
    params = _tree()
    blob = quant.pack_params(params, "fp32")
    restored, info = quant.unpack_params(blob)
    assert _paths(restored) == _paths(params) and restored["empty"] == {}
    for path in _paths(params)[:-1]:
        original, value = np.asarray(_get(params, path)), _get(restored, path)
        assert isinstance(value, np.ndarray) and value.dtype == np.float32 and value.flags.writeable
        np.testing.assert_array_equal(value, original)
    assert info["scheme"] == "fp32" and info["nbytes"] == len(blob)
    assert {tuple(leaf["path"]) for leaf in info["leaves"]} == set(_paths(params)[:-1])
    assert all(leaf["encoding"] == "fp32" and leaf["dtype"] == "float32" for leaf in info["leaves"])
    # Key order survives, empty dicts included.
    middle = {"z": np.ones(1, np.float32), "mid": {"deeper": {}}, "a": np.zeros(1, np.float32), "end": {}}
    restored, _ = quant.unpack_params(quant.pack_params(middle, "int8"))
    assert list(restored) == ["z", "mid", "a", "end"] and restored["mid"] == {"deeper": {}}


def test_fp16_round_trip_is_fp16_rounding():
    params = _tree()
    stored, _ = quant.unpack_params(quant.pack_params(params, "fp16"))
    floats, _ = quant.unpack_params(quant.pack_params(params, "fp16"), dequantize=True)
    for path in _paths(params)[:-1]:
        original = np.asarray(_get(params, path), np.float32)
        assert _get(stored, path).dtype == np.float16 and _get(floats, path).dtype == np.float32
        np.testing.assert_array_equal(_get(stored, path), original.astype(np.float16))
        np.testing.assert_array_equal(_get(floats, path), original.astype(np.float16).astype(np.float32))
        assert np.all(np.abs(_get(floats, path) - original) <= 2.0**-11 * np.abs(original) + 2.0**-25)


def test_int8_round_trip_gives_codes_scales_and_floats_within_half_a_scale():
    params = _tree()
    blob = quant.pack_params(params, "int8")
    stored, info = quant.unpack_params(blob)
    floats, _ = quant.unpack_params(blob, dequantize=True)
    encodings = {tuple(leaf["path"]): leaf["encoding"] for leaf in info["leaves"]}
    for path in _paths(params)[:-1]:
        original = np.asarray(_get(params, path), np.float32)
        value = _get(stored, path)
        if original.ndim < 2:  # biases and scalars stay float32, exactly
            assert encodings[path] == "fp32"
            np.testing.assert_array_equal(value, original)
            np.testing.assert_array_equal(_get(floats, path), original)
            continue
        assert encodings[path] == "int8" and isinstance(value, Int8Weight)
        assert value.codes.dtype == np.int8 and value.codes.shape == original.shape
        assert value.scales.dtype == np.float32 and value.scales.shape == (original.shape[-1],)
        expected = quant.quantize_int8_weight(jnp.asarray(original.reshape(-1, original.shape[-1])))
        np.testing.assert_array_equal(value.codes.reshape(-1, original.shape[-1]), np.asarray(expected.codes))
        np.testing.assert_array_equal(value.scales, np.asarray(expected.scales))
        deq = _get(floats, path)
        assert deq.dtype == np.float32
        np.testing.assert_array_equal(
            deq.reshape(-1, original.shape[-1]), np.asarray(quant.dequantize_int8(expected.codes, expected.scales))
        )
        assert np.all(np.abs(deq - original) <= 0.5 * value.scales * SLACK)
    zero_column = _get(floats, ("params", "Dense_1", "kernel"))[:, 2]
    assert np.all(zero_column == 0.0)


def test_int8_blob_of_an_actorq_actor_is_about_4x_smaller_than_fp32():
    params = _mlp([24, 2048, 2048, 2048, 12])  # ActorQ's 3x2048 actor MLP
    sizes = {scheme: quant.packed_nbytes(params, scheme) for scheme in ("fp32", "fp16", "int8")}
    for counts in sizes.values():
        assert counts["total"] == counts["weights"] + counts["biases"] + counts["scales"] + counts["header"]
        assert counts["header"] < 4096
    assert sizes["fp32"]["total"] == len(quant.pack_params(params, "fp32"))
    assert sizes["fp32"]["scales"] == sizes["fp16"]["scales"] == 0
    n_weights = 24 * 2048 + 2 * 2048 * 2048 + 2048 * 12
    assert sizes["int8"]["weights"] == n_weights and sizes["fp32"]["weights"] == 4 * n_weights
    assert sizes["int8"]["scales"] == 4 * (3 * 2048 + 12)
    ratio = sizes["fp32"]["total"] / sizes["int8"]["total"]
    assert 3.95 < ratio < 4.0, ratio
    assert 1.99 < sizes["fp32"]["total"] / sizes["fp16"]["total"] <= 2.0


def test_header_is_json_and_describes_every_buffer():
    blob = quant.pack_params(_tree(), "int8")
    magic, length = struct.unpack_from("<8sQ", blob)
    assert magic == MAGIC
    header = json.loads(blob[16 : 16 + length])
    assert header["scheme"] == "int8" and header["version"] == 1 and header["empty_dicts"] == [[8, ["empty"]]]
    assert header["data_nbytes"] == len(blob) - 16 - length
    offsets = [(b["offset"], b["nbytes"]) for leaf in header["leaves"] for b in leaf["buffers"]]
    assert offsets[0][0] == 0 and all(a + n == b for (a, n), (b, _) in itertools.pairwise(offsets))
    assert offsets[-1][0] + offsets[-1][1] == header["data_nbytes"]


def test_accepts_jax_numpy_bfloat16_and_frozendict_leaves():
    params = flax.core.freeze(
        {"a": {"w": jnp.ones((3, 2), jnp.bfloat16), "b": np.arange(2, dtype=np.float64)}, "c": 1.5}
    )
    restored, info = quant.unpack_params(quant.pack_params(params, "fp32"))
    np.testing.assert_array_equal(restored["a"]["w"], np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(restored["a"]["b"], [0.0, 1.0])
    assert restored["c"].shape == () and float(restored["c"]) == 1.5
    assert [leaf["dtype"] for leaf in info["leaves"]] == ["bfloat16", "float64", "float64"]
    restored, _ = quant.unpack_params(bytearray(quant.pack_params(params, "int8")), dequantize=True)
    np.testing.assert_array_equal(restored["a"]["w"], np.ones((3, 2), np.float32))


@pytest.mark.parametrize(
    "params, error, message",
    [
        ({"a": [np.ones(2)]}, TypeError, r"\['a'\].*list"),
        ({"a": (np.ones(2),)}, TypeError, "tuple"),
        ({"a": {"b": None}}, TypeError, r"\['a'\]\['b'\].*NoneType"),
        ({"a": "weights"}, TypeError, "str"),
        ({"a": np.arange(3)}, ValueError, "floating dtype"),
        ({1: np.ones(2)}, TypeError, "keys must be strings"),
        ([np.ones(2)], TypeError, "nested dict"),
        (np.ones(2), TypeError, "nested dict"),
    ],
)
def test_unsupported_trees_raise_naming_the_leaf(params, error, message):
    with pytest.raises(error, match=message):
        quant.pack_params(params, "fp32")


def test_bad_scheme_and_corrupt_blobs_raise():
    params = _mlp([3, 4])
    with pytest.raises(ValueError, match="valid: fp32, fp16, int8"):
        quant.pack_params(params, "int4")
    with pytest.raises(ValueError, match="valid: fp32, fp16, int8"):
        quant.packed_nbytes(params, "bf16")
    blob = quant.pack_params(params, "int8")
    with pytest.raises(ValueError, match="magic"):
        quant.unpack_params(b"NOTLPJAX" + blob[8:])
    with pytest.raises(ValueError, match="Truncated"):
        quant.unpack_params(blob[:-1])
    with pytest.raises(ValueError, match="shorter than the prefix"):
        quant.unpack_params(blob[:5])
    with pytest.raises(ValueError, match="takes bytes"):
        quant.unpack_params("not bytes")
    _, length = struct.unpack_from("<8sQ", blob)
    header = json.loads(blob[16 : 16 + length])
    header["version"] = 99
    text = json.dumps(header).encode()
    with pytest.raises(ValueError, match="version 99"):
        quant.unpack_params(struct.pack("<8sQ", MAGIC, len(text)) + text + blob[16 + length :])
