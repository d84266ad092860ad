"""Serialization of policy parameters for broadcast (ActorQ): fp32, fp16 or per-channel int8, as one ``bytes``.

ActorQ's learner quantizes the policy before broadcasting it to the actors, which makes the broadcast 4x
smaller in int8. :func:`pack_params` turns a nested-dict parameter tree (Flax ``params``) into a self-describing
blob and :func:`unpack_params` reads it back, either as int8 codes and scales (for a CPU int8 runtime) or as
dequantized float32 parameters.

**Schemes.**

* ``"fp32"``: every leaf as little-endian float32 (bit-exact round trip for float32 params).
* ``"fp16"``: every leaf rounded to float16 (round to nearest even; ``|x - fp16(x)| <= 2^-11 |x|`` in the
  normal range, magnitudes above 65504 become inf).
* ``"int8"``: every leaf with ``ndim >= 2`` (weights) as symmetric absmax int8 with one float32 scale per output
  channel (the last axis), i.e. :func:`lpjax.quant.quantize_int8_weight` of the leaf reshaped to
  ``(prod(shape[:-1]), shape[-1])``: ``scales[n] = amax(|w[..., n]|) / 127``, ``codes = round(w / scales)``,
  so ``|w - codes * scales| <= scales / 2``. Leaves with ``ndim < 2`` (biases) stay float32.

**Blob layout.** ``b"LPJXPACK"`` (8 bytes), the header length as a little-endian uint64, the header (UTF-8
JSON), then the raw buffers back to back (little-endian, C order). The header holds the format version, the
scheme, the data section's length, the paths of empty sub-dicts (with their position among the leaves, so
the key order survives) and, per leaf: its path (the list of dict keys from the root), shape,
original dtype, encoding (``"fp32"``, ``"fp16"`` or ``"int8"``) and buffers (name, dtype, shape, offset into the
data section, byte count). Nothing is pickled, so a blob from an untrusted source can only describe arrays.

**Trees.** Nested mappings (dict, Flax ``FrozenDict``) with string keys and array leaves (NumPy or JAX arrays
or Python/NumPy numbers) of a floating dtype; empty sub-dicts are kept. Anything else (lists, tuples,
NamedTuples, ``None``, strings) raises a ``TypeError`` naming the path, a non-floating array (e.g. int32) a
``ValueError``. Unpacked trees are
plain dicts of NumPy arrays.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.int8 import Int8Weight, quantize_int8_weight

MAGIC = b"LPJXPACK"
FORMAT_VERSION = 1
SCHEMES = ("fp32", "fp16", "int8")
_PREFIX = struct.Struct("<8sQ")
_DTYPES = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2"), "int8": np.dtype("i1")}


def _check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"Unknown packing scheme {scheme!r}; valid: {', '.join(SCHEMES)}.")
    return scheme


def _flatten(tree: Any, path: tuple[str, ...] = ()) -> tuple[list, list]:
    """``([(path, array)], [[position, path] of each empty dict])`` of a nested-dict tree, in insertion order;
    ``position`` is the number of leaves before the empty dict."""
    if isinstance(tree, Mapping):
        leaves, empty = [], [] if tree else [[0, list(path)]]
        for key, value in tree.items():
            if not isinstance(key, str):
                raise TypeError(f"params{_display(path)}: dict keys must be strings, got {key!r}.")
            sub_leaves, sub_empty = _flatten(value, path + (key,))
            empty += [[len(leaves) + position, sub_path] for position, sub_path in sub_empty]
            leaves += sub_leaves
        return leaves, empty
    if isinstance(tree, bool) or not isinstance(tree, (np.ndarray, np.generic, jax.Array, float)):
        raise TypeError(
            f"params{_display(path)}: pack_params takes nested dicts of arrays, got a "
            f"{type(tree).__name__} (lists, tuples, NamedTuples and None are not supported)."
        )
    array = np.asarray(tree)
    if not np.issubdtype(array.dtype, np.floating) and array.dtype.name != "bfloat16":
        raise ValueError(f"params{_display(path)}: leaves must have a floating dtype, got {array.dtype}.")
    return [(path, array)], []


def _display(path) -> str:
    return "".join(f"[{key!r}]" for key in path)


def _encode(array: np.ndarray, scheme: str) -> tuple[str, list[tuple[str, np.ndarray]]]:
    """``(encoding, [(buffer name, buffer)])`` of one leaf."""
    if scheme == "fp16":
        return "fp16", [("values", array.astype(np.float32).astype(_DTYPES["float16"]))]
    if scheme == "int8" and array.ndim >= 2:
        qw = quantize_int8_weight(jnp.asarray(array).reshape(-1, array.shape[-1]))
        return "int8", [
            ("codes", np.asarray(qw.codes).reshape(array.shape)),
            ("scales", np.asarray(qw.scales, _DTYPES["float32"])),
        ]
    return "fp32", [("values", array.astype(_DTYPES["float32"]))]


def _pack(params: Any, scheme: str) -> tuple[bytes, dict]:
    scheme = _check_scheme(scheme)
    if not isinstance(params, Mapping):
        raise TypeError(f"pack_params takes a nested dict of arrays (e.g. Flax params), got a {type(params).__name__}.")
    leaves, empty = _flatten(params)
    entries, chunks, offset = [], [], 0
    counts = {"weights": 0, "biases": 0, "scales": 0}
    for path, array in leaves:
        encoding, buffers = _encode(array, scheme)
        described = []
        for name, buffer in buffers:
            data = np.ascontiguousarray(buffer).tobytes()
            described.append(
                {
                    "name": name,
                    "dtype": buffer.dtype.name,
                    "shape": list(buffer.shape),
                    "offset": offset,
                    "nbytes": len(data),
                }
            )
            chunks.append(data)
            offset += len(data)
            counts["scales" if name == "scales" else "weights" if array.ndim >= 2 else "biases"] += len(data)
        entries.append(
            {
                "path": list(path),
                "shape": list(array.shape),
                "dtype": array.dtype.name,
                "encoding": encoding,
                "buffers": described,
            }
        )
    header = {
        "format": "lpjax.quant.packing",
        "version": FORMAT_VERSION,
        "scheme": scheme,
        "data_nbytes": offset,
        "leaves": entries,
        "empty_dicts": empty,
    }
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob = b"".join([_PREFIX.pack(MAGIC, len(header_bytes)), header_bytes, *chunks])
    counts["header"] = _PREFIX.size + len(header_bytes)
    counts["total"] = len(blob)
    return blob, counts


def pack_params(params: Any, scheme: str = "int8") -> bytes:
    """Serializes a nested-dict parameter tree with ``scheme`` (``"fp32"``, ``"fp16"`` or ``"int8"``).

    See the module docstring for the schemes and the layout. With ``"int8"``, weights (``ndim >= 2``) take
    1 byte per element plus 4 bytes per output channel, biases 4 bytes per element: about 4x smaller than
    ``"fp32"`` for an MLP.

    Raises:
      ValueError: for an unknown scheme or a leaf without a floating dtype.
      TypeError: for a tree that is not nested dicts (string keys) of arrays; the message names the path.
    """
    return _pack(params, scheme)[0]


def packed_nbytes(params: Any, scheme: str = "int8") -> dict[str, int]:
    """Byte counts of ``pack_params(params, scheme)``.

    Returns:
      ``{"total", "weights", "biases", "scales", "header"}``: ``weights`` the payload of the ``ndim >= 2``
      leaves (int8 codes or floats), ``biases`` that of the other leaves, ``scales`` the int8 scales (0 for the
      float schemes), ``header`` the magic, length and JSON header; ``total = len(blob)`` is their sum.
    """
    return _pack(params, scheme)[1]


def _read_header(blob: bytes) -> tuple[dict, memoryview]:
    try:
        blob = memoryview(blob).cast("B")
    except TypeError as error:
        raise ValueError(f"unpack_params takes bytes, got a {type(blob).__name__}.") from error
    if len(blob) < _PREFIX.size:
        raise ValueError(f"Not an lpjax packed-params blob: {len(blob)} bytes is shorter than the prefix.")
    magic, header_len = _PREFIX.unpack_from(blob)
    if magic != MAGIC:
        raise ValueError(f"Not an lpjax packed-params blob: magic {bytes(magic)!r}, expected {MAGIC!r}.")
    start = _PREFIX.size + header_len
    if len(blob) < start:
        raise ValueError("Truncated packed-params blob: the header is incomplete.")
    try:
        header = json.loads(bytes(blob[_PREFIX.size : start]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"Corrupt packed-params header: {error}.") from error
    if header.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"Unsupported packed-params version {header.get('version')!r} (this lpjax reads {FORMAT_VERSION})."
        )
    data = blob[start:]
    if len(data) != header["data_nbytes"]:
        raise ValueError(
            f"Truncated or padded packed-params blob: {len(data)} data bytes, header says {header['data_nbytes']}."
        )
    return header, data


def _buffer(data: memoryview, spec: dict) -> np.ndarray:
    if spec["dtype"] not in _DTYPES:
        raise ValueError(f"Corrupt packed-params header: buffer dtype {spec['dtype']!r}.")
    dtype, shape = _DTYPES[spec["dtype"]], tuple(spec["shape"])
    start, nbytes = spec["offset"], spec["nbytes"]
    if nbytes != dtype.itemsize * int(np.prod(shape)) or start < 0 or start + nbytes > len(data):
        raise ValueError(f"Corrupt packed-params header: buffer {spec['name']!r} of shape {shape}.")
    return np.frombuffer(data[start : start + nbytes], dtype).reshape(shape).astype(dtype.newbyteorder("="))


def _insert(tree: dict, path: list[str], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def unpack_params(blob: bytes, dequantize: bool = False) -> tuple[dict, dict]:
    """Reads a blob of :func:`pack_params` back into a nested dict of NumPy arrays.

    Args:
      blob: the bytes (or any buffer) written by :func:`pack_params`.
      dequantize: if False, leaves come back as stored: float32 arrays (``"fp32"`` leaves), float16 arrays
        (``"fp16"``) and :class:`lpjax.quant.Int8Weight` ``(codes int8 of the leaf's shape, scales float32
        (N,))`` (``"int8"``), ready for an int8 runtime (``codes.reshape(-1, N)`` is the ``(K, N)`` matrix of
        :func:`lpjax.quant.quantize_int8_weight`). If True, every leaf is float32: ``codes * scales`` for int8
        (as :func:`lpjax.quant.dequantize_int8`), the float16 values cast up for fp16.

    Returns:
      ``(params, info)``: the tree, and ``info = {"scheme", "version", "nbytes", "leaves"}`` with ``leaves``
      one ``{"path", "shape", "dtype" (original), "encoding"}`` per leaf. Original dtypes other than float32
      (e.g. bfloat16) are reported in ``info`` but the arrays are float32 / float16 / int8 as above.

    Raises:
      ValueError: if the blob is not a packed-params blob, is truncated, or has a corrupt header.
    """
    header, data = _read_header(blob)
    params: dict = {}
    empty = sorted(header.get("empty_dicts", []), key=lambda item: item[0])
    infos = []
    for index, leaf in enumerate(header["leaves"] + [None]):
        while empty and empty[0][0] <= index:  # empty dicts go back where they were in the key order
            path = empty.pop(0)[1]
            if path:
                _insert(params, path, {})
        if leaf is None:
            break
        buffers = {spec["name"]: _buffer(data, spec) for spec in leaf["buffers"]}
        encoding = leaf["encoding"]
        if encoding == "int8":
            value = Int8Weight(buffers["codes"], buffers["scales"])
            if dequantize:
                value = value.codes.astype(np.float32) * value.scales
        elif encoding in ("fp16", "fp32"):
            value = buffers["values"].astype(np.float32) if dequantize else buffers["values"]
        else:
            raise ValueError(f"Corrupt packed-params header: encoding {encoding!r}.")
        if not leaf["path"]:
            raise ValueError("Corrupt packed-params header: a leaf with an empty path.")
        _insert(params, leaf["path"], value)
        infos.append({key: leaf[key] for key in ("path", "shape", "dtype", "encoding")})
    info = {
        "scheme": header["scheme"],
        "version": header["version"],
        "nbytes": len(memoryview(blob).cast("B")),
        "leaves": infos,
    }
    return params, info
