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

**Blob layout** (format version 2). A 28-byte prefix, the header, then the data section:

* ``b"LPJXPACK"`` (8 bytes), then little-endian: the header length (uint32, at most :data:`MAX_HEADER_BYTES`),
  the format version (uint32), the data section's length (uint64) and a CRC-32 (uint32, :func:`zlib.crc32`) of
  the blob's other bytes (the first 24 bytes of the prefix, the header and the data section);
* the header: UTF-8 JSON ``{"scheme", "leaves", "empty_dicts"}``, with ``leaves`` one
  ``{"path", "shape", "dtype", "encoding", "buffers"}`` per leaf in key order (``path`` the list of dict keys
  from the root, ``dtype`` the original dtype, ``encoding`` ``"fp32"``, ``"fp16"`` or ``"int8"``) and each buffer
  ``{"name", "dtype", "shape", "offset", "nbytes"}`` (offset into the data section); ``empty_dicts`` holds
  ``[position, path]`` of each empty sub-dict, ``position`` being the number of leaves before it, so the key
  order survives;
* the data section: the raw buffers back to back in leaf order (little-endian, C order).

Nothing is pickled, so a blob from an untrusted source can only describe arrays, and :func:`unpack_params`
checks the whole blob before building anything: the exact length, the checksum (so a flipped bit anywhere,
data included, is caught), then the header's structure, which must be exactly what :func:`pack_params` writes
for some tree: the encoding and buffers (names, dtypes, shapes) that the scheme gives a leaf of that shape
(``scales`` of an int8 leaf of shape ``(..., N)`` has shape ``(N,)``), byte counts matching the shapes,
buffers back to back covering the whole data section (so none is out of range or overlaps another), and no
path given twice or both as a leaf and as a parent. Any violation raises one ``ValueError`` with a one-line
message. The checksum guards against corruption, not tampering: a crafted blob with a valid CRC still has to
pass the structural checks, so at worst it yields other arrays of the described shapes.

**Versions.** Blobs are transient broadcasts between a learner and its actors, which run the same lpjax, so
only the current version is read and older blobs are refused with a clear message rather than converted. A
version-1 blob (a uint64 header length after the magic, the version inside its JSON, no checksum) reads as
version 0, since the version field overlaps the zero high half of that length, and is refused as version 1.

**Trees.** Nested mappings (dict, Flax ``FrozenDict``) with string keys and array leaves (NumPy or JAX arrays
or Python/NumPy numbers) of a floating dtype; empty sub-dicts are kept. Anything else (lists, tuples,
NamedTuples, ``None``, strings) raises a ``TypeError`` naming the path, a non-floating array (e.g. int32) a
``ValueError``. Unpacked trees are plain dicts of NumPy arrays.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.quant.int8 import Int8Weight, quantize_int8_weight

MAGIC = b"LPJXPACK"
FORMAT_VERSION = 2
MAX_HEADER_BYTES = 1 << 24
"""The longest header written or read (16 MiB, about 50,000 leaves); a longer length field is corruption."""
SCHEMES = ("fp32", "fp16", "int8")
_PREFIX = struct.Struct("<8sIIQI")  # magic, header length, version, data length, CRC-32
_CHECKED = struct.calcsize("<8sIIQ")  # the prefix bytes before the CRC, which it covers
_DTYPES = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2"), "int8": np.dtype("i1")}
_SOURCE_DTYPES = frozenset(
    {"bfloat16", *(np.dtype(t).name for t in (np.float16, np.float32, np.float64, np.longdouble))}
)
_MAX_INT = 2**63 - 1  # offsets, byte counts and dimensions are int64 on the reading side
_MAX_NDIM = 64  # NumPy's limit
_LEAF_KEYS = ("path", "shape", "dtype", "encoding", "buffers")
_BUFFER_KEYS = ("name", "dtype", "shape", "offset", "nbytes")
_END = object()  # a path's last node in _check_paths


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
        qw = quantize_int8_weight(jnp.asarray(array).reshape(math.prod(array.shape[:-1]), array.shape[-1]))
        return "int8", [
            ("codes", np.asarray(qw.codes).reshape(array.shape)),
            ("scales", np.asarray(qw.scales, _DTYPES["float32"])),
        ]
    return "fp32", [("values", array.astype(_DTYPES["float32"]))]


def _crc(parts: Iterable) -> int:
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return crc


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
    header = {"scheme": scheme, "leaves": entries, "empty_dicts": empty}
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if len(header_bytes) > MAX_HEADER_BYTES:
        raise ValueError(
            f"The packed-params header of {len(entries)} leaves takes {len(header_bytes)} bytes, over the "
            f"{MAX_HEADER_BYTES}-byte limit."
        )
    fields = _PREFIX.pack(MAGIC, len(header_bytes), FORMAT_VERSION, offset, 0)[:_CHECKED]
    checksum = struct.pack("<I", _crc([fields, header_bytes, *chunks]))
    blob = b"".join([fields, checksum, header_bytes, *chunks])
    counts["header"] = _PREFIX.size + len(header_bytes)
    counts["total"] = len(blob)
    return blob, counts


def pack_params(params: Any, scheme: str = "int8") -> bytes:
    """Serializes a nested-dict parameter tree with ``scheme`` (``"fp32"``, ``"fp16"`` or ``"int8"``).

    See the module docstring for the schemes and the layout. With ``"int8"``, weights (``ndim >= 2``) take
    1 byte per element plus 4 bytes per output channel, biases 4 bytes per element: about 4x smaller than
    ``"fp32"`` for an MLP.

    Raises:
      ValueError: for an unknown scheme, a leaf without a floating dtype, or a header over
        :data:`MAX_HEADER_BYTES`.
      TypeError: for a tree that is not nested dicts (string keys) of arrays; the message names the path.
    """
    return _pack(params, scheme)[0]


def packed_nbytes(params: Any, scheme: str = "int8") -> dict[str, int]:
    """Byte counts of ``pack_params(params, scheme)``.

    Returns:
      ``{"total", "weights", "biases", "scales", "header"}``: ``weights`` the payload of the ``ndim >= 2``
      leaves (int8 codes or floats), ``biases`` that of the other leaves, ``scales`` the int8 scales (0 for the
      float schemes), ``header`` the prefix (magic, lengths, version, checksum) and the JSON header;
      ``total = len(blob)`` is their sum.
    """
    return _pack(params, scheme)[1]


def _split(blob: Any) -> tuple[int, int, bytes, memoryview]:
    """``(version, blob length, header bytes, data section)`` of a blob whose prefix, length and checksum hold."""
    try:
        view = memoryview(blob).cast("B")
    except TypeError as error:
        raise ValueError(f"unpack_params takes bytes, got a {type(blob).__name__}.") from error
    if len(view) < _PREFIX.size:
        raise ValueError(
            f"Truncated packed-params blob: {len(view)} bytes, shorter than the {_PREFIX.size}-byte prefix."
        )
    magic, header_len, version, data_len, checksum = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise ValueError(f"Not a packed-params blob: magic {magic!r}, expected {MAGIC!r}.")
    if version != FORMAT_VERSION:
        if version == 0 and bytes(view[16:64]).startswith(b'{"format":"lpjax.quant.packing"'):
            version = 1  # version 1: a uint64 header length (high half 0 where version 2 has its version), JSON
        raise ValueError(
            f"Unsupported packed-params format version {version}: this lpjax reads version {FORMAT_VERSION} only "
            "(blobs are transient broadcasts: pack and unpack them with the same lpjax)."
        )
    if header_len > MAX_HEADER_BYTES:
        raise ValueError(
            f"Corrupt packed-params blob: a header length of {header_len} bytes, over the {MAX_HEADER_BYTES}-byte "
            "limit."
        )
    expected = _PREFIX.size + header_len + data_len
    if len(view) != expected:
        raise ValueError(
            f"{'Truncated' if len(view) < expected else 'Padded'} packed-params blob: {len(view)} bytes where its "
            f"prefix gives {expected} ({header_len} header bytes, {data_len} data bytes)."
        )
    computed = _crc([view[:_CHECKED], view[_PREFIX.size :]])
    if computed != checksum:
        raise ValueError(
            f"Corrupt packed-params blob: checksum mismatch (stored CRC-32 {checksum:#010x}, computed "
            f"{computed:#010x})."
        )
    start = _PREFIX.size + header_len
    return version, len(view), bytes(view[_PREFIX.size : start]), view[start:]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """``object_pairs_hook`` of the header: an object with a repeated key is ambiguous, hence corrupt."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        repeated = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"the key {_clip(repeated)} appears twice in an object")
    return obj


def _parse_header(raw: bytes) -> Any:
    """The header's JSON; a ``ValueError`` for bytes that are not UTF-8 JSON or nest too deeply."""
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("Corrupt packed-params header: its JSON nests too deeply.") from None
    except ValueError as error:  # bad UTF-8 or JSON, an integer of over 4300 digits, a repeated key
        raise ValueError(f"Corrupt packed-params header: not valid JSON ({error}).") from None


def _fail(message: str) -> ValueError:
    return ValueError(f"Corrupt packed-params header: {message}.")


def _clip(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(value: Any) -> str:
    """A short one-line description of a parsed JSON value (never the repr of a deep container)."""
    if isinstance(value, dict):
        return f"an object with the keys {_clip(sorted(value))}"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    return _clip(value)


def _fields(value: Any, keys: tuple[str, ...], what: str) -> dict:
    if not isinstance(value, dict) or value.keys() != set(keys):
        raise _fail(f"{what} must be an object with the keys {', '.join(keys)}, got {_describe(value)}")
    return value


def _list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise _fail(f"{what} must be a list, got {_describe(value)}")
    return value


def _count(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_INT:
        raise _fail(f"{what} must be an integer in [0, 2**63), got {_describe(value)}")
    return value


def _keys(value: Any, what: str, allow_empty: bool) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(key, str) for key in value) or not (value or allow_empty):
        raise _fail(f"{what} must be a {'' if allow_empty else 'non-empty '}list of strings, got {_describe(value)}")
    return tuple(value)


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if len(_list(value, what)) > _MAX_NDIM:
        raise _fail(f"{what} has {len(value)} dimensions, over NumPy's {_MAX_NDIM}")
    shape = tuple(_count(n, f"a dimension of {what}") for n in value)
    if math.prod(n for n in shape if n) * 8 > _MAX_INT:
        raise _fail(f"{what} is too large for an array: {_clip(list(shape))}")
    return shape


def _layout(encoding: str, shape: tuple[int, ...]) -> list[tuple[str, str, tuple[int, ...]]]:
    """``[(name, dtype, shape)]`` of the buffers of a leaf of ``shape`` stored as ``encoding``."""
    if encoding == "int8":
        return [("codes", "int8", shape), ("scales", "float32", shape[-1:])]
    return [("values", "float32" if encoding == "fp32" else "float16", shape)]


def _check_leaf(leaf: Any, index: int, scheme: str, start: int, data_len: int) -> tuple:
    """``(path, info, {name: (dtype, shape, offset, nbytes)})`` of the ``index``-th leaf, whose buffers must start
    at byte ``start`` of the data section and lie back to back."""
    leaf = _fields(leaf, _LEAF_KEYS, f"leaf {index}")
    path = _keys(leaf["path"], f"the path of leaf {index}", allow_empty=False)
    what = f"leaf {_clip(list(path))}"
    shape = _shape(leaf["shape"], f"the shape of {what}")
    if not isinstance(leaf["dtype"], str) or leaf["dtype"] not in _SOURCE_DTYPES:
        raise _fail(f"{what} has the unknown original dtype {_describe(leaf['dtype'])}")
    encoding = ("int8" if len(shape) >= 2 else "fp32") if scheme == "int8" else scheme
    if leaf["encoding"] != encoding:
        raise _fail(
            f"{what} has the encoding {_describe(leaf['encoding'])}, but scheme {scheme!r} stores a leaf of "
            f"shape {list(shape)} as {encoding!r}"
        )
    specs, layout = _list(leaf["buffers"], f"the buffers of {what}"), _layout(encoding, shape)
    if len(specs) != len(layout):
        raise _fail(f"{what} has {len(specs)} buffers, expected {len(layout)} ({', '.join(n for n, *_ in layout)})")
    buffers, end = {}, start
    for spec, (name, dtype, expected_shape) in zip(specs, layout, strict=True):
        spec = _fields(spec, _BUFFER_KEYS, f"a buffer of {what}")
        if spec["name"] != name:
            raise _fail(f"{what} has a buffer named {_describe(spec['name'])} where {name!r} belongs")
        if not isinstance(spec["dtype"], str) or spec["dtype"] not in _DTYPES:
            raise _fail(f"buffer {name!r} of {what} has the unknown dtype {_describe(spec['dtype'])}")
        if spec["dtype"] != dtype:
            raise _fail(f"buffer {name!r} of {what} has the dtype {spec['dtype']}, expected {dtype}")
        buffer_shape = _shape(spec["shape"], f"the shape of buffer {name!r} of {what}")
        if buffer_shape != expected_shape:
            raise _fail(
                f"buffer {name!r} of {what} has the shape {list(buffer_shape)}, but a leaf of shape {list(shape)} "
                f"needs {list(expected_shape)}"
            )
        offset = _count(spec["offset"], f"the offset of buffer {name!r} of {what}")
        nbytes = _count(spec["nbytes"], f"the byte count of buffer {name!r} of {what}")
        size = _DTYPES[dtype].itemsize * math.prod(buffer_shape)
        if nbytes != size:
            raise _fail(f"buffer {name!r} of {what} has {nbytes} bytes, but {list(buffer_shape)} {dtype} takes {size}")
        if offset != end:
            raise _fail(
                f"buffer {name!r} of {what} starts at byte {offset}, expected {end} (buffers lie back to back in "
                "leaf order, without gaps or overlaps)"
            )
        if end + nbytes > data_len:
            raise _fail(f"buffer {name!r} of {what} ends at byte {end + nbytes}, past the {data_len}-byte data section")
        buffers[name] = (_DTYPES[dtype], buffer_shape, offset, nbytes)
        end += nbytes
    info = {"path": list(path), "shape": list(shape), "dtype": leaf["dtype"], "encoding": encoding}
    return path, info, buffers


def _check_paths(paths: list[tuple[str, ...]]) -> None:
    """Raises unless every path is distinct and none leads through another (a leaf or an empty dict has no
    children): the paths must be those of one tree."""
    if () in paths and len(paths) > 1:
        raise _fail("an empty root dict next to other entries")
    trie: dict = {}
    for path in paths:
        node = trie
        for depth, key in enumerate(path[:-1]):
            node = node.setdefault(key, {})
            if node is _END:
                raise _fail(f"the path {_clip(list(path))} leads through the entry {_clip(list(path[: depth + 1]))}")
        if path and path[-1] in node:
            clash = "is given twice" if node[path[-1]] is _END else "is both an entry and the parent of others"
            raise _fail(f"the path {_clip(list(path))} {clash}")
        if path:
            node[path[-1]] = _END


def _check_header(header: Any, data_len: int) -> tuple[str, list[tuple], list[tuple[int, tuple[str, ...]]]]:
    """``(scheme, leaves as _check_leaf gives them, [(position, path)] of the empty dicts)`` of a parsed header,
    which must describe a tree and a data section of ``data_len`` bytes exactly as :func:`_pack` does."""
    header = _fields(header, ("scheme", "leaves", "empty_dicts"), "the header")
    scheme = header["scheme"]
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        raise _fail(f"the unknown scheme {_describe(scheme)}")
    leaves, end = [], 0
    for index, leaf in enumerate(_list(header["leaves"], "'leaves'")):
        leaves.append(_check_leaf(leaf, index, scheme, end, data_len))
        end += sum(nbytes for *_, nbytes in leaves[-1][2].values())
    if end != data_len:
        raise _fail(f"the buffers cover {end} bytes of the {data_len}-byte data section")
    empties, previous = [], 0
    for index, item in enumerate(_list(header["empty_dicts"], "'empty_dicts'")):
        if not isinstance(item, list) or len(item) != 2:
            raise _fail(f"empty dict {index} must be a [position, path] pair, got {_describe(item)}")
        position = _count(item[0], f"the position of empty dict {index}")
        if not previous <= position <= len(leaves):
            raise _fail(
                f"empty dict {index} is at position {position}, outside [{previous}, {len(leaves)}] (positions "
                "count the leaves before it, in order)"
            )
        previous = position
        empties.append((position, _keys(item[1], f"the path of empty dict {index}", allow_empty=True)))
    _check_paths([path for path, *_ in leaves] + [path for _, path in empties])
    return scheme, leaves, empties


def _insert(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def unpack_params(blob: bytes, dequantize: bool = False) -> tuple[dict, dict]:
    """Reads a blob of :func:`pack_params` back into a nested dict of NumPy arrays.

    The whole blob is checked first (length, version, checksum, then the header's structure: see the module
    docstring), so a corrupt or malformed blob raises before any array is built.

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
      ValueError: with a one-line message, for anything but an intact blob of this format version: not a
        buffer, a wrong magic, another version, a truncated or padded blob, a checksum mismatch, a header that is
        not UTF-8 JSON, nests too deeply or does not describe the data section exactly as :func:`pack_params`
        would (types, dtypes, shapes, offsets and byte counts, int8 scales, paths).
    """
    version, nbytes, raw, data = _split(blob)
    scheme, leaves, empties = _check_header(_parse_header(raw), len(data))
    params: dict = {}
    pending = iter(empties)
    empty = next(pending, None)
    for index in range(len(leaves) + 1):
        while empty is not None and empty[0] == index:  # empty dicts go back where they were in the key order
            if empty[1]:
                _insert(params, empty[1], {})
            empty = next(pending, None)
        if index == len(leaves):
            break
        path, info, buffers = leaves[index]
        arrays = {
            name: np.frombuffer(data[offset : offset + size], dtype).reshape(shape).astype(dtype.newbyteorder("="))
            for name, (dtype, shape, offset, size) in buffers.items()
        }
        if info["encoding"] == "int8":
            value = Int8Weight(arrays["codes"], arrays["scales"])
            if dequantize:
                value = value.codes.astype(np.float32) * value.scales
        else:
            value = arrays["values"].astype(np.float32) if dequantize else arrays["values"]
        _insert(params, path, value)
    info = {"scheme": scheme, "version": version, "nbytes": nbytes, "leaves": [info for _, info, _ in leaves]}
    return params, info
