"""Packed parameters of lpjax.quant.packing: exact fp32, fp16-rounded and int8 (within scale / 2) round trips,
the self-describing header, ~4x smaller int8 broadcasts of an ActorQ 3x2048 actor, and clear errors.

Malformed blobs always raise ``ValueError`` (never another exception, never other values): every byte flip of
the prefix and header, every bit flip of a small payload and sampled ones of a larger payload (checksum), every
truncation, and crafted headers with a valid checksum (structural checks), case by case and fuzzed by
hypothesis (derandomized, so the tests cannot fail by chance)."""

from __future__ import annotations

import functools
import itertools
import json
import struct
import zlib

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpjax import quant
from lpjax.quant import Int8Weight
from lpjax.quant.packing import FORMAT_VERSION, MAGIC, MAX_HEADER_BYTES, SCHEMES

PREFIX = struct.Struct("<8sIIQI")  # magic, header length, version, data length, CRC-32

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


def test_prefix_checksum_and_header_describe_every_buffer():
    blob = quant.pack_params(_tree(), "int8")
    magic, header_len, version, data_len, crc = PREFIX.unpack_from(blob)
    assert magic == MAGIC and version == FORMAT_VERSION == 2
    assert len(blob) == PREFIX.size + header_len + data_len
    assert crc == zlib.crc32(blob[PREFIX.size :], zlib.crc32(blob[:24]))
    header = json.loads(blob[PREFIX.size : PREFIX.size + header_len])
    assert list(header) == ["scheme", "leaves", "empty_dicts"]
    assert header["scheme"] == "int8" and header["empty_dicts"] == [[8, ["empty"]]]
    offsets = [(b["offset"], b["nbytes"]) for leaf in header["leaves"] for b in leaf["buffers"]]
    assert offsets[0][0] == 0 and all(a + n == b for (a, n), (b, _) in itertools.pairwise(offsets))
    assert offsets[-1][0] + offsets[-1][1] == data_len
    assert _seal(*_split(blob)) == blob  # the tests' resealing writes what pack_params writes


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
    with pytest.raises(ValueError, match="Padded"):
        quant.unpack_params(blob + b"\0")
    with pytest.raises(ValueError, match="shorter than the 28-byte prefix"):
        quant.unpack_params(blob[:5])
    with pytest.raises(ValueError, match="takes bytes"):
        quant.unpack_params("not bytes")
    with pytest.raises(ValueError, match="checksum mismatch"):
        quant.unpack_params(blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(ValueError, match="version 99: this lpjax reads version 2 only"):
        quant.unpack_params(_seal(*_split(blob), version=99))
    with pytest.raises(ValueError, match="over the 16777216-byte limit"):
        quant.unpack_params(blob[:8] + struct.pack("<I", MAX_HEADER_BYTES + 1) + blob[12:])


def test_a_version_1_blob_is_refused_as_version_1():
    """Version 1 had a uint64 header length after the magic and the version in its JSON header."""
    header = {"format": "lpjax.quant.packing", "version": 1, "scheme": "fp32", "data_nbytes": 4}
    header["leaves"] = [
        {"path": ["b"], "shape": [1], "dtype": "float32", "encoding": "fp32", "buffers": []},
    ]
    header["empty_dicts"] = []
    text = json.dumps(header, separators=(",", ":")).encode()
    with pytest.raises(ValueError, match="format version 1: this lpjax reads version 2 only"):
        quant.unpack_params(struct.pack("<8sQ", MAGIC, len(text)) + text + bytes(4))


# Malformed blobs. Random corruption is caught by the checksum; crafted blobs (resealed with a valid checksum
# by _seal) reach the structural checks. Either way unpack_params raises ValueError and nothing else.


def _small(scheme="int8"):
    """A small blob with an int8 (or float) weight, a bias, a 0-d leaf and an empty dict."""
    params = {
        "layer": {"kernel": np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5, "bias": np.ones(4, np.float32)},
        "log_alpha": np.float32(-2.5),
        "empty": {},
    }
    return quant.pack_params(params, scheme)


def _split(blob):
    """``(header as a dict, data section)`` of a blob."""
    _, header_len, _, _, _ = PREFIX.unpack_from(blob)
    return json.loads(blob[PREFIX.size : PREFIX.size + header_len]), blob[PREFIX.size + header_len :]


def _seal(header, data, version=FORMAT_VERSION):
    """A blob of ``header`` (a JSON value, or raw bytes) and ``data`` with a valid prefix and checksum."""
    raw = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    fields = struct.pack("<8sIIQ", MAGIC, len(raw), version, len(data))
    return fields + struct.pack("<I", zlib.crc32(data, zlib.crc32(raw, zlib.crc32(fields)))) + raw + data


def _stored(tree):
    """The stored arrays of an unpacked tree, in leaf order, as bytes."""
    if isinstance(tree, dict):
        return [chunk for value in tree.values() for chunk in _stored(value)]
    return [np.asarray(part).tobytes() for part in (tree if isinstance(tree, Int8Weight) else (tree,))]


def _raises_value_error(blob, match=None):
    """Asserts that unpack_params raises ValueError (any other exception propagates and fails the test) with a
    one-line message."""
    with pytest.raises(ValueError, match=match) as error:
        quant.unpack_params(blob)
    assert "\n" not in str(error.value), str(error.value)


@pytest.mark.parametrize("scheme", ["int8", "fp32"])
def test_every_byte_flip_of_the_prefix_and_header_raises(scheme):
    blob = _small(scheme)
    _, header_len, _, _, _ = PREFIX.unpack_from(blob)
    for position in range(PREFIX.size + header_len):
        for mask in range(1, 256):
            flipped = bytearray(blob)
            flipped[position] ^= mask
            with pytest.raises(ValueError):
                quant.unpack_params(bytes(flipped))


@pytest.mark.parametrize("scheme", ["int8", "fp16"])
def test_every_payload_bit_flip_of_a_small_blob_is_a_checksum_mismatch(scheme):
    blob = _small(scheme)
    start = len(blob) - PREFIX.unpack_from(blob)[3]
    for position in range(start, len(blob)):
        for bit in range(8):
            flipped = bytearray(blob)
            flipped[position] ^= 1 << bit
            _raises_value_error(bytes(flipped), "checksum mismatch")


@functools.cache
def _large_blob(scheme):
    return quant.pack_params(_mlp([24, 256, 256, 12]), scheme)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(scheme=st.sampled_from(["int8", "fp32"]), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_a_bit_flip_anywhere_in_the_payload_of_a_larger_blob_is_a_checksum_mismatch(scheme, where, bit):
    blob = _large_blob(scheme)
    start = len(blob) - PREFIX.unpack_from(blob)[3]
    flipped = bytearray(blob)
    flipped[start + int(where * (len(blob) - start))] ^= 1 << bit
    _raises_value_error(bytes(flipped), "checksum mismatch")


def test_truncation_at_every_length_raises():
    blob = _small()
    for length in range(len(blob)):
        _raises_value_error(blob[:length], "Truncated")


@pytest.mark.parametrize("scheme", ["int8", "fp16"])
def test_header_bit_flips_with_a_valid_checksum_raise_or_keep_the_stored_arrays(scheme):
    """With the checksum recomputed, a flipped header bit must be caught by the structural checks, or describe
    the same arrays (a renamed key, a moved empty dict): never another exception, never other values."""
    blob = _small(scheme)
    _, header_len, _, _, _ = PREFIX.unpack_from(blob)
    raw, data = blob[PREFIX.size : PREFIX.size + header_len], blob[PREFIX.size + header_len :]
    expected = _stored(quant.unpack_params(blob)[0])
    decoded = 0
    for position in range(len(raw)):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[position] ^= 1 << bit
            try:
                params, info = quant.unpack_params(_seal(bytes(flipped), data))
            except ValueError as error:
                assert "\n" not in str(error)
                continue
            decoded += 1
            assert _stored(params) == expected and [leaf["shape"] for leaf in info["leaves"]] == [[3, 4], [4], []]
    assert 0 < decoded < 8 * len(raw) / 4  # only a few flips (in key strings) keep a valid header


def _header_cases():
    """``(id, mutate(header, data) -> blob, message)``: each a blob with a valid checksum and one defect."""

    def edit(change):
        def mutate(header, data):
            change(header)
            return _seal(header, data)

        return mutate

    def leaf(index, **fields):
        return edit(lambda header: header["leaves"][index].update(fields))

    def buffer(index, number, **fields):
        return edit(lambda header: header["leaves"][index]["buffers"][number].update(fields))

    def reshaped(index, shape, nbytes):  # the leaf and its one buffer
        def change(header):
            header["leaves"][index]["shape"] = shape
            header["leaves"][index]["buffers"][0].update(shape=shape, nbytes=nbytes)

        return edit(change)

    def raw(text):
        return lambda header, data: _seal(text if isinstance(text, bytes) else text.encode(), data)

    kernel, bias = 0, 1  # leaves of _small(): layer/kernel (int8), layer/bias, log_alpha
    return [
        ("deep JSON", raw(b"[" * 100_000 + b"]" * 100_000), "nests too deeply"),
        ("deep JSON, unclosed", raw(b'{"a":' * 100_000), "nests too deeply"),
        ("nested lists as a path", leaf(kernel, path=functools.reduce(lambda x, _: [x], range(500), "a")), "path"),
        ("not UTF-8", raw(b"\xff\xfe{}"), "not valid JSON"),
        ("not JSON", raw("{'scheme': 'int8'}"), "not valid JSON"),
        ("empty header", raw(b""), "not valid JSON"),
        ("a 5000-digit integer", raw('{"scheme":' + "9" * 5000 + "}"), "not valid JSON"),
        ("a repeated key", raw('{"scheme":"int8","scheme":"fp32","leaves":[],"empty_dicts":[]}'), "twice"),
        ("a list header", raw("[]"), "header must be an object with the keys scheme, leaves, empty_dicts"),
        ("a missing key", edit(lambda header: header.pop("empty_dicts")), "keys scheme, leaves, empty_dicts"),
        ("an extra key", edit(lambda header: header.update(version=2)), "keys scheme, leaves, empty_dicts"),
        ("unknown scheme", edit(lambda header: header.update(scheme="int4")), "unknown scheme 'int4'"),
        ("scheme of a wrong type", edit(lambda header: header.update(scheme=["int8"])), "unknown scheme a list"),
        ("leaves not a list", edit(lambda header: header.update(leaves={})), "'leaves' must be a list"),
        ("a leaf not an object", edit(lambda header: header["leaves"].__setitem__(0, 7)), "leaf 0 must be an object"),
        ("a leaf without encoding", edit(lambda header: header["leaves"][0].pop("encoding")), "leaf 0 must be"),
        ("a string path", leaf(kernel, path="layer/kernel"), "path of leaf 0 must be a non-empty list of strings"),
        ("an empty path", leaf(kernel, path=[]), "non-empty list of strings"),
        ("a path of numbers", leaf(kernel, path=[1, 2]), "list of strings"),
        ("leaf shape != buffer shape", leaf(kernel, shape=[4, 3]), r"shape \[3, 4\], but a leaf of shape \[4, 3\]"),
        ("leaf shape != buffer size", leaf(bias, shape=[5]), r"shape \[4\], but a leaf of shape \[5\] needs"),
        ("both shapes off the size", reshaped(bias, [5], 16), r"has 16 bytes, but \[5\] float32 takes 20"),
        ("a string dimension", leaf(kernel, shape=["3", 4]), "dimension of the shape .* must be an integer"),
        ("a negative dimension", leaf(bias, shape=[-4]), "integer in"),
        ("a float dimension", leaf(bias, shape=[4.0]), "integer in"),
        ("a boolean dimension", leaf(bias, shape=[True]), "integer in"),
        ("65 dimensions", leaf(bias, shape=[1] * 65), "65 dimensions"),
        ("an overflowing size", reshaped(bias, [0, 2**62], 0), "too large for an array"),
        ("int8 scales of the wrong shape", buffer(kernel, 1, shape=[3], nbytes=12), r"'scales' .* needs \[4\]"),
        ("int8 scales of a 2-d shape", buffer(kernel, 1, shape=[4, 1]), r"'scales' .* needs \[4\]"),
        ("int8 scales missing", edit(lambda h: h["leaves"][0]["buffers"].pop()), "1 buffers, expected 2"),
        ("buffers swapped", edit(lambda h: h["leaves"][0]["buffers"].reverse()), "named 'scales' where 'codes'"),
        (
            "a weight stored as fp32",
            leaf(kernel, encoding="fp32"),
            r"encoding 'fp32', but scheme 'int8' stores a leaf of shape \[3, 4\] as 'int8'",
        ),
        ("a bias stored as int8", leaf(bias, encoding="int8"), "encoding 'int8'"),
        ("unknown buffer dtype", buffer(bias, 0, dtype="float64"), "unknown dtype 'float64'"),
        ("wrong buffer dtype", buffer(bias, 0, dtype="int8"), "dtype int8, expected float32"),
        ("unknown original dtype", leaf(bias, dtype="int32"), "unknown original dtype 'int32'"),
        ("original dtype of a wrong type", leaf(bias, dtype=None), "unknown original dtype None"),
        ("a negative offset", buffer(bias, 0, offset=-1), "offset .* must be an integer in"),
        ("an offset of 2**64", buffer(bias, 0, offset=2**64), "offset .* must be an integer in"),
        ("a float offset", buffer(bias, 0, offset=16.0), "offset .* must be an integer in"),
        ("a NaN byte count", buffer(bias, 0, nbytes=float("nan")), "byte count .* must be an integer in"),
        ("overlapping buffers", buffer(bias, 0, offset=0), "starts at byte 0, expected 28 .* overlaps"),
        ("a gap between buffers", buffer(bias, 0, offset=30), "starts at byte 30, expected 28"),
        ("an offset out of range", buffer(bias, 0, offset=10**9), "starts at byte 1000000000"),
        ("a buffer past the data", lambda header, data: _seal(header, data[:-2]), "past the 46-byte data section"),
        ("unused data", lambda header, data: _seal(header, data + bytes(4)), "cover 48 bytes of the 52-byte"),
        ("duplicate paths", leaf(bias, path=["layer", "kernel"]), r"path \['layer', 'kernel'\] is given twice"),
        ("a path through a leaf", leaf(bias, path=["layer", "kernel", "b"]), "leads through the entry"),
        ("a leaf above a leaf", leaf(bias, path=["layer"]), r"path \['layer'\] is both an entry and the parent"),
        ("an empty dict at a leaf", edit(lambda h: h.update(empty_dicts=[[3, ["log_alpha"]]])), "given twice"),
        ("a leaf in an empty dict", edit(lambda h: h.update(empty_dicts=[[0, ["layer"]]])), "parent of others"),
        ("an empty root next to leaves", edit(lambda h: h.update(empty_dicts=[[3, []]])), "empty root"),
        ("an empty dict out of place", edit(lambda h: h.update(empty_dicts=[[4, ["e"]]])), "position 4, outside"),
        ("empty dicts out of order", edit(lambda h: h.update(empty_dicts=[[2, ["e"]], [1, ["f"]]])), "outside"),
        ("an empty dict not a pair", edit(lambda h: h.update(empty_dicts=[["empty"]])), r"\[position, path\] pair"),
        ("an empty dict path of a string", edit(lambda h: h.update(empty_dicts=[[3, "empty"]])), "list of strings"),
    ]


@pytest.mark.parametrize("mutate, message", [case[1:] for case in _header_cases()], ids=[c[0] for c in _header_cases()])
def test_each_malformed_header_with_a_valid_checksum_raises_a_clear_value_error(mutate, message):
    header, data = _split(_small())
    _raises_value_error(mutate(header, data), message)


def test_the_unmodified_small_blob_decodes():
    """The baseline of the malformed-header cases: _small()'s header and data, resealed, decode."""
    header, data = _split(_small())
    params, info = quant.unpack_params(_seal(header, data))
    assert list(params) == ["layer", "log_alpha", "empty"] and info["version"] == FORMAT_VERSION
    assert len(data) == 48 and [b["offset"] for b in header["leaves"][1]["buffers"]] == [28]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _locations(value, found=None):
    """Every ``(container, key or index)`` of a parsed JSON value."""
    found = [] if found is None else found
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        found.append((value, key))
        _locations(child, found)
    return found


@settings(max_examples=400, deadline=None, derandomize=True)
@given(scheme=st.sampled_from(SCHEMES), data=st.data())
def test_random_header_edits_with_a_valid_checksum_raise_or_keep_the_stored_arrays(scheme, data):
    """Any value of the header replaced by random JSON (checksum recomputed): ValueError, or the same arrays."""
    blob = _small(scheme)
    header, payload = _split(blob)
    container, key = data.draw(st.sampled_from(_locations(header)))
    container[key] = data.draw(_JSON)
    try:
        params, _ = quant.unpack_params(_seal(header, payload))
    except ValueError as error:
        assert "\n" not in str(error)
        return
    assert _stored(params) == _stored(quant.unpack_params(blob)[0])


_TREES = st.recursive(
    st.lists(st.integers(0, 3), max_size=3).map(lambda shape: np.random.default_rng(0).standard_normal(shape)),
    lambda children: st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=6,
).filter(lambda tree: isinstance(tree, dict))


@settings(max_examples=100, deadline=None, derandomize=True)
@given(tree=_TREES, scheme=st.sampled_from(SCHEMES))
def test_every_packed_tree_passes_the_checks_and_round_trips(tree, scheme):
    """The checks accept whatever pack_params writes: any keys, empty dicts, 0-d and zero-size leaves."""
    restored, info = quant.unpack_params(quant.pack_params(tree, scheme))
    assert info["version"] == FORMAT_VERSION and _paths(restored) == _paths(tree)
    for path in _paths(tree):
        original = _get(tree, path)
        if isinstance(original, dict):
            assert _get(restored, path) == {}
            continue
        value = _get(restored, path)
        if scheme == "fp32" or (scheme == "int8" and original.ndim < 2):
            np.testing.assert_array_equal(value, original.astype(np.float32))
        elif scheme == "fp16":
            np.testing.assert_array_equal(value, original.astype(np.float32).astype(np.float16))
        else:
            assert value.codes.shape == original.shape and value.scales.shape == original.shape[-1:]
