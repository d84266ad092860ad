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
from collections.abc import Sequence
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


# --- flax models under a policy ----------------------------------------------------------------------------------


def _normalization_layers() -> tuple[type, ...]:
    """flax's normalization layers, linen and nnx: kept in float32 by :func:`set_policy` unless told otherwise."""
    from flax import linen, nnx

    names = ("BatchNorm", "LayerNorm", "GroupNorm", "RMSNorm", "InstanceNorm")
    return tuple(getattr(module, name) for module in (linen, nnx) for name in names if hasattr(module, name))


def _is_floating_dtype(dtype) -> bool:
    try:
        return dtype is not None and jnp.issubdtype(np.dtype(dtype), jnp.floating)
    except TypeError:
        return False


def _cast_inputs(tree: Any, dtype: np.dtype) -> Any:
    """:func:`_cast_floating` that leaves ``nnx`` objects (``nnx.Rngs``, modules) whole: they are references."""
    from flax import nnx

    is_node = nnx.graph.is_graph_node
    return jax.tree.map(lambda x: x if is_node(x) else _cast_floating(x, dtype), tree, is_leaf=is_node)


def _override_dtypes(module: Any, dtype: np.dtype, param_dtype: np.dtype | None, setter) -> None:
    """Sets ``module.dtype`` (and ``param_dtype``) where the module has them and they hold a floating dtype or
    ``None``: flax's layers compute in ``dtype`` (``None``: their inputs' and parameters' promoted dtype)."""
    for name, value in (("dtype", dtype), ("param_dtype", param_dtype)):
        if value is None or not hasattr(module, name):
            continue
        current = getattr(module, name)
        if current is None or _is_floating_dtype(current):
            setter(module, name, value)


_POLICY_CLASSES: dict[tuple, type] = {}


def _policy_class(base: type, role: str, policy: Policy) -> type:
    """A subclass of the nnx module class ``base`` whose ``__call__`` casts under ``policy``.

    ``role="model"``: floating inputs to the compute dtype, outputs to the output dtype (the model's boundary).
    ``role="float32"``: floating inputs to float32, outputs to the compute dtype (a layer kept in float32). The
    subclass has ``base``'s name and adds no state, so the module's variables, paths and checkpoints are unchanged.
    """
    base = getattr(base, "_lpjax_policy_base", base)
    key = (base, role, policy)
    if key not in _POLICY_CLASSES:
        into, out = (
            (policy.compute_dtype, policy.output_dtype)
            if role == "model"
            else (np.dtype("float32"), policy.compute_dtype)
        )

        def call(self, *args, **kwargs):
            result = super(cls, self).__call__(*_cast_inputs(args, into), **_cast_inputs(kwargs, into))
            return _cast_inputs(result, out)

        namespace = {
            "__call__": call,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "__doc__": base.__doc__,
            "_lpjax_policy_base": base,
            "_lpjax_policy": (role, policy),
        }
        cls = type(base)(base.__name__, (base,), namespace, pytree=base._pytree__is_pytree)
        _POLICY_CLASSES[key] = cls
    return _POLICY_CLASSES[key]


def _set_nnx_policy(model: Any, policy: Policy, keep: tuple[type, ...]) -> Any:
    from flax import nnx

    float32 = np.dtype("float32")
    nodes = [node for _, node in nnx.iter_graph(model)]
    modules = [node for node in nodes if isinstance(node, nnx.Module)]
    kept = [module for module in modules if isinstance(module, keep)]
    kept_variables = {id(v) for module in kept for _, v in nnx.iter_graph(module) if isinstance(v, nnx.Variable)}
    for variable in nodes:
        if not isinstance(variable, nnx.Variable):
            continue
        value = variable.get_value()
        if not (hasattr(value, "dtype") and jnp.issubdtype(value.dtype, jnp.floating)):
            continue
        if id(variable) in kept_variables:
            variable.set_value(value.astype(float32))  # parameters and statistics of a kept layer
        elif isinstance(variable, nnx.Param):
            variable.set_value(value.astype(policy.param_dtype))
    for module in modules:
        if isinstance(module, keep):
            _override_dtypes(module, float32, float32, setattr)
            module.__class__ = _policy_class(type(module), "float32", policy)
        else:
            _override_dtypes(module, policy.compute_dtype, policy.param_dtype, setattr)
    if not isinstance(model, keep):  # a kept model casts to float32 and back to compute already
        model.__class__ = _policy_class(type(model), "model", policy)
    return model


def _linen_interceptor(policy: Policy, keep: tuple[type, ...], kept_paths: list | None):
    """The method interceptor that puts every linen module of a call under ``policy`` (see :func:`set_policy`)."""
    float32 = np.dtype("float32")
    force = object.__setattr__  # linen modules are frozen dataclasses; each call binds fresh copies

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if not isinstance(module, keep):
            _override_dtypes(module, policy.compute_dtype, None, force)
            return next_fun(*args, **kwargs)
        _override_dtypes(module, float32, float32, force)
        if kept_paths is not None:
            kept_paths.append(tuple(module.path))
        out = next_fun(*_cast_floating(args, float32), **_cast_floating(kwargs, float32))
        return out if context.method_name == "setup" else _cast_floating(out, policy.compute_dtype)

    return interceptor


def _cast_params(variables: Any, dtype: np.dtype, kept_paths: list) -> Any:
    """``variables`` with its ``params`` collection cast to ``dtype``, except under the modules of ``kept_paths``."""

    def cast(path, x):
        names = tuple(getattr(key, "key", None) for key in path)
        if any(names[: len(kept)] == kept for kept in kept_paths):
            return x
        return _cast_floating(x, dtype)

    if "params" not in variables:
        return variables
    params = {"params": jax.tree_util.tree_map_with_path(cast, variables["params"])}
    return type(variables)({**variables, **params}) if isinstance(variables, dict) else variables.copy(params)


def _linen_policy_class(base: type, policy: Policy, keep: tuple[type, ...]) -> type:
    """A subclass of the linen module class ``base`` whose ``init``/``apply`` run under ``policy``."""
    from flax import linen

    base = getattr(base, "_lpjax_policy_base", base)
    key = (base, "linen", policy, keep)
    if key in _POLICY_CLASSES:
        return _POLICY_CLASSES[key]

    @linen.nowrap
    def init_with_output(self, rngs, *args, **kwargs):
        kept_paths: list = []
        with linen.intercept_methods(_linen_interceptor(policy, keep, kept_paths)):
            out, variables = super(cls, self).init_with_output(
                rngs, *_cast_floating(args, policy.compute_dtype), **kwargs
            )
        return _cast_floating(out, policy.output_dtype), _cast_params(variables, policy.param_dtype, kept_paths)

    @linen.nowrap
    def apply(self, variables, *args, **kwargs):
        with linen.intercept_methods(_linen_interceptor(policy, keep, None)):
            result = super(cls, self).apply(variables, *_cast_floating(args, policy.compute_dtype), **kwargs)
        if kwargs.get("mutable", False) is not False:
            out, state = result
            return _cast_floating(out, policy.output_dtype), state
        return _cast_floating(result, policy.output_dtype)

    namespace = {
        "init_with_output": init_with_output,
        "apply": apply,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        "_lpjax_policy_base": base,
        "_lpjax_policy": ("linen", policy),
    }
    cls = type(base.__name__, (base,), namespace)
    _POLICY_CLASSES[key] = cls
    return cls


def set_policy(model: Any, policy: str | Policy, keep_float32: Sequence[type] | None = None) -> Any:
    """Puts a flax model (linen or nnx) under a precision :class:`Policy`, in the spirit of Haiku's
    ``hk.mixed_precision.set_policy``, which flax lacks. Works on any model, not only lpjax's own modules.

    Under the policy:

    * parameters are stored in ``param_dtype``: the model's own initial values (float32 for flax's layers),
      rounded once. Batch statistics stay as flax stores them, in float32: flax computes them in float32 whatever
      a layer's dtype, and a narrower store would raise jax's scatter dtype warning at every update;
    * every module with a ``dtype`` attribute (all of flax's layers; ``None`` or a floating dtype) computes in
      ``compute_dtype``, even where the model's code says ``dtype=jnp.float32``; the model's floating inputs are
      cast to ``compute_dtype`` first, so functional code between layers (activations, pooling) follows;
    * the model's floating outputs are cast to ``output_dtype``;
    * the layers of ``keep_float32`` (flax's normalization layers by default: ``BatchNorm``, ``LayerNorm``,
      ``GroupNorm``, ``RMSNorm``, ``InstanceNorm``, linen's and nnx's) keep float32 parameters, normalize in
      float32 from float32 inputs (the statistics of a float16 normalization are float32 values rounded to
      float16 before they are used) and return ``compute_dtype``, as mixed-precision recipes keep them.

    No dtype promotion warning is raised (casting a model's state by hand raises jax's FutureWarning about
    scatter dtypes at every batch-statistics update).

    Args:
      model: an ``nnx.Module`` (changed in place: its variables cast, its layers' ``dtype``/``param_dtype`` set,
        and its class and the kept layers' classes replaced by same-named subclasses that cast at ``__call__``;
        variables, paths and checkpoints are unchanged) or a linen ``Module`` (returned as a copy whose
        ``init``/``init_with_output``/``apply`` run under the policy: ``init`` returns the parameters in
        ``param_dtype``, ``apply`` takes them; use it as the top-level module, e.g. as a ``TrainState``'s
        ``apply_fn``).
      policy: a :class:`Policy` or anything :func:`get_policy` reads (``"fp16"``, ``"mixed_bf16"``,
        ``"p=f32,c=f16,o=f32"``, ...).
      keep_float32: module types kept in float32 (instances of subclasses too); ``None`` for flax's
        normalization layers, ``()`` for none (every layer in the policy's dtypes).

    Returns:
      The model under the policy: the same nnx object, or a new linen module.

    Raises:
      TypeError: ``model`` is neither an nnx nor a linen module.

    Only ``__call__`` of an nnx model casts its inputs and outputs (call other methods with inputs of the compute
    dtype); code that reads parameters directly (``x @ self.w``) computes in the promotion of its operands'
    dtypes. Calling ``set_policy`` again replaces the policy.
    """
    from flax import linen, nnx

    policy = get_policy(policy)
    keep = _normalization_layers() if keep_float32 is None else tuple(keep_float32)
    if isinstance(model, nnx.Module):
        return _set_nnx_policy(model, policy, keep)
    if isinstance(model, linen.Module):
        cls = _linen_policy_class(type(model), policy, keep)
        fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.init and f.name != "parent"}
        return cls(**fields)
    raise TypeError(f"set_policy takes a flax linen or nnx Module, got {type(model).__name__}.")
