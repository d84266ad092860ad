"""Precision policies: which dtype parameters are stored in, computed in, and returned in.

A :class:`Policy` is a tiny immutable, hashable value (it can be a static argument of ``jax.jit``) holding four
dtypes, after jmp's policy:

* ``param_dtype``: storage of the parameters (and, by default, of the optimizer state);
* ``compute_dtype``: dtype of activations and of the matmuls' inputs;
* ``output_dtype``: dtype of what a network returns to its caller (losses, logits, actions);
* ``matmul_dtype``: dtype the dense layers' matmul operands are quantized to (defaults to ``compute_dtype``).
  ``float8_e4m3fn`` selects the blockwise W8A8 fp8 matmul of :mod:`kernels` in :class:`lpjax.nn.Dense`, while
  activations between layers stay in ``compute_dtype`` (the ``"fp8"`` policy: bf16 activations, fp8 GEMMs).

The named policies follow Björck et al. (2021): ``"fp16"`` is *pure* half precision (parameters, activations,
gradients and optimizer state all in float16), the setting in which the paper's methods are needed, while
``"mixed_fp16"`` is the usual mixed-precision recipe (float32 master weights, float16 compute).

>>> policy = get_policy("p=f32,c=f16")          # jmp's syntax: the output follows the compute dtype
>>> policy.compute_dtype, policy.output_dtype
(dtype('float16'), dtype('float16'))
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

DTYPE_NAMES: dict[str, Any] = {
    "float64": jnp.float64,
    "f64": jnp.float64,
    "fp64": jnp.float64,
    "double": jnp.float64,
    "float32": jnp.float32,
    "f32": jnp.float32,
    "fp32": jnp.float32,
    "single": jnp.float32,
    "full": jnp.float32,
    "float16": jnp.float16,
    "f16": jnp.float16,
    "fp16": jnp.float16,
    "half": jnp.float16,
    "bfloat16": jnp.bfloat16,
    "bf16": jnp.bfloat16,
    "float8_e4m3fn": jnp.float8_e4m3fn,
    "fp8_e4m3": jnp.float8_e4m3fn,
    "e4m3": jnp.float8_e4m3fn,
    "float8_e5m2": jnp.float8_e5m2,
    "fp8_e5m2": jnp.float8_e5m2,
    "e5m2": jnp.float8_e5m2,
    "fp8": jnp.float8_e4m3fn,
}
"""The one table of dtype names of lpjax (policies, moment dtypes, KV caches): lower-case name -> dtype.
``"fp8"`` alone is float8_e4m3fn, the format of the forward pass (weights, activations, KV caches)."""

_FIELD_ALIASES = {
    "params": "param_dtype",
    "param": "param_dtype",
    "p": "param_dtype",
    "compute": "compute_dtype",
    "c": "compute_dtype",
    "output": "output_dtype",
    "out": "output_dtype",
    "o": "output_dtype",
    "matmul": "matmul_dtype",
    "m": "matmul_dtype",
}


def dtype_of(dtype: Any) -> np.dtype:
    """The numpy dtype of a dtype object or of a name in :data:`DTYPE_NAMES` (case-insensitive).

    Raises:
      ValueError: for an unknown name; the message lists the valid ones.
    """
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        if key not in DTYPE_NAMES:
            raise ValueError(f"Unknown dtype name {dtype!r}; valid names: {', '.join(sorted(DTYPE_NAMES))}.")
        dtype = DTYPE_NAMES[key]
    return np.dtype(dtype)


def _canonical_dtype(dtype: Any) -> np.dtype:
    """:func:`dtype_of`, restricted to floating-point dtypes (what a policy holds)."""
    result = dtype_of(dtype)
    if not jnp.issubdtype(result, jnp.floating):
        raise ValueError(f"A precision policy holds floating-point dtypes, got {result}.")
    return result


def _cast_floating(tree: Any, dtype: np.dtype) -> Any:
    """Casts every floating-point array leaf of ``tree`` to ``dtype``; integer and boolean leaves are kept."""

    def cast(x):
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return jnp.asarray(x).astype(dtype)
        return x

    return jax.tree.map(cast, tree)


@dataclasses.dataclass(frozen=True)
class Policy:
    """Parameter, compute and output dtypes of a model. Immutable and hashable.

    Attributes:
      param_dtype: dtype the parameters are stored (and updated) in.
      compute_dtype: dtype activations and matmul inputs are cast to.
      output_dtype: dtype the model's outputs are cast to before they leave the model.
      matmul_dtype: dtype of the dense layers' matmul operands; ``None`` (the default) resolves to
        ``compute_dtype`` at construction, so ``Policy(p, c, o)`` equals ``Policy(p, c, o, c)``.
    """

    param_dtype: np.dtype = np.dtype(np.float32)
    compute_dtype: np.dtype = np.dtype(np.float32)
    output_dtype: np.dtype = np.dtype(np.float32)
    matmul_dtype: np.dtype | None = None

    def __post_init__(self):
        if self.matmul_dtype is None:
            object.__setattr__(self, "matmul_dtype", self.compute_dtype)
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, _canonical_dtype(getattr(self, field.name)))

    def cast_to_param(self, tree: Any) -> Any:
        """Casts the floating-point leaves of ``tree`` to ``param_dtype``."""
        return _cast_floating(tree, self.param_dtype)

    def cast_to_compute(self, tree: Any) -> Any:
        """Casts the floating-point leaves of ``tree`` to ``compute_dtype``."""
        return _cast_floating(tree, self.compute_dtype)

    def cast_to_output(self, tree: Any) -> Any:
        """Casts the floating-point leaves of ``tree`` to ``output_dtype``."""
        return _cast_floating(tree, self.output_dtype)

    def with_output_dtype(self, dtype: Any) -> Policy:
        """Returns a copy of this policy with another output dtype."""
        return dataclasses.replace(self, output_dtype=dtype)

    @property
    def is_low_precision(self) -> bool:
        """True when parameters or compute use fewer than 32 bits."""
        return min(self.param_dtype.itemsize, self.compute_dtype.itemsize, self.matmul_dtype.itemsize) < 4

    def __str__(self) -> str:
        text = f"params={self.param_dtype.name},compute={self.compute_dtype.name},output={self.output_dtype.name}"
        if self.matmul_dtype != self.compute_dtype:
            text += f",matmul={self.matmul_dtype.name}"
        return text


POLICIES: dict[str, Policy] = {
    "fp32": Policy("float32", "float32", "float32"),
    "fp16": Policy("float16", "float16", "float16"),
    "bf16": Policy("bfloat16", "bfloat16", "bfloat16"),
    "mixed_fp16": Policy("float32", "float16", "float32"),
    "mixed_bf16": Policy("float32", "bfloat16", "float32"),
    "fp8": Policy("float32", "bfloat16", "float32", "float8_e4m3fn"),
}
"""Named policies. ``fp16``/``bf16`` are pure low precision (the paper's setting); ``mixed_*`` keep fp32 params;
``fp8`` keeps fp32 params and bf16 activations and runs the dense layers' GEMMs as blockwise W8A8 fp8."""


_BARE_DTYPES = {name for name, dtype in DTYPE_NAMES.items() if np.dtype(dtype).itemsize >= 2}


def get_policy(spec: str | Policy) -> Policy:
    """Returns the :class:`Policy` described by ``spec``, accepting jmp's policy strings with jmp's meaning.

    Args:
      spec: a :class:`Policy` (returned as is); a name from :data:`POLICIES` (``"fp32"``, ``"fp16"``, ``"bf16"``,
        ``"mixed_fp16"``, ``"mixed_bf16"``, ``"fp8"``); a dtype name (``"half"``, ``"full"``, ``"f16"``,
        ``"bfloat16"``, ...), meaning that dtype for parameters, compute and output; or ``key=dtype`` items
        such as ``"p=f32,c=f16,o=f32"`` or ``"c=f16"`` (keys ``params``/``p``, ``compute``/``c``,
        ``output``/``o``, ``matmul``/``m``). As in jmp, an omitted ``params`` is float32, an omitted ``compute``
        follows ``params`` and an omitted ``output`` follows ``compute``: ``"c=f16"`` is
        ``params=float32,compute=float16,output=float16``. An omitted ``matmul`` follows ``compute``.

    Where lpjax differs from ``jmp.get_policy``:

    * ``"half"`` is float16 on every platform (jmp's is bfloat16 on TPU): a config that says float16 trains in
      float16 wherever it runs, which is what the fp16 methods are about.
    * the ``matmul`` key, the fp8 dtype names (``e4m3``, ``float8_e5m2``, ...) and the named policies are
      lpjax's; a bare fp8 name is not a policy (fp8 parameters and activations are not supported).

    Raises:
      ValueError: for an unknown name, an unknown key or dtype, or a repeated key; the message lists valid values.
    """
    if isinstance(spec, Policy):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"get_policy expects a str or Policy, got {type(spec).__name__}.")
    text = spec.strip()
    if "=" not in text:
        name = text.lower()
        if name in POLICIES:
            return POLICIES[name]
        if name in _BARE_DTYPES:
            dtype = _canonical_dtype(name)
            return Policy(dtype, dtype, dtype)
        raise ValueError(
            f"Unknown precision policy {spec!r}. Valid names: {', '.join(POLICIES)}; a dtype name "
            f"({', '.join(sorted(_BARE_DTYPES))}); or key=dtype items such as 'params=float32,compute=float16,"
            "output=float32' or 'p=f32,c=f16'."
        )
    fields: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in _FIELD_ALIASES:
            raise ValueError(
                f"Bad policy item {item.strip()!r} in {spec!r}; expected key=dtype with key in "
                f"{', '.join(sorted(_FIELD_ALIASES))}."
            )
        field = _FIELD_ALIASES[key]
        if field in fields:
            raise ValueError(f"Policy {spec!r} sets {field} twice.")
        fields[field] = value
    fields.setdefault("param_dtype", "float32")
    fields.setdefault("compute_dtype", fields["param_dtype"])
    fields.setdefault("output_dtype", fields["compute_dtype"])
    return Policy(**fields)
