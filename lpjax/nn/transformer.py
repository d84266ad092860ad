"""A small decoder-only transformer LM whose linear layers follow a precision policy, with a functional KV cache.

:class:`TransformerLM` is a GPT-style causal language model: learned token and position embeddings, ``num_layers``
pre-LayerNorm blocks ``x += attn(LN(x)); x += mlp(LN(x))``, a final LayerNorm and a separate lm_head. The
q/k/v/o and MLP projections are :class:`lpjax.nn.Dense` layers, so ``policy`` and ``matmul_impl`` pick their matmul
(``"fp8"``: blockwise W8A8 E4M3 GEMMs with bf16 activations). Embeddings, LayerNorms, the residual stream, the
attention core (``q k^T``, softmax, ``p v``) and the lm_head are float32, as in the FP8-RL recipe
(docs/design.md, "FP8 rollouts"); the logits are float32 whatever the policy.

Interface (what :mod:`lpjax.nn.causal_lm` wraps for the GRPO learner; ``params`` is the dict ``lm.init``
returns, ``{"params": ...}``)::

    lm = TransformerLM(vocab_size, num_layers, num_heads, d_model, d_ff, max_len, policy="fp32", matmul_impl="auto")
    params = lm.init(key, tokens)                            # tokens (B, T) int32, any T <= max_len
    logits, _ = lm.apply(params, tokens)                     # full sequence: (B, T, V) float32, positions 0..T-1
    scales = calibrate_kv_scales(params, lm, calib_tokens)   # KVScales; only needed for an fp8 cache
    cache = lm.init_cache(batch, max_len=None, kv_cache_dtype="float8_e4m3fn", kv_scales=scales)
    logits, cache = lm.apply(params, prompt, cache)          # prefill: prompt (B, P)
    logits, cache = lm.apply(params, next_token, cache)      # one step: next_token (B, 1)

The cache is a :class:`KVCache` pytree of fixed-shape arrays (jit-friendly; nothing is a Flax mutable
collection): ``k``/``v`` of shape ``(num_layers, B, S, num_heads, head_dim)`` in ``kv_cache_dtype`` (float32,
bfloat16, float16 or float8_e4m3fn), their float32 per-layer, per-head scales ``(num_layers, num_heads)`` and
``index (B,)`` int32, the number of positions already written for each row. ``lm.apply(params, tokens, cache)``
with ``tokens (B, T)``:

* embeds ``tokens[b, t]`` at absolute position ``index[b] + t``;
* writes its keys and values into slots ``index[b] .. index[b] + T - 1`` of the cache;
* lets position ``p`` attend to cache slots ``j <= p`` (slots not yet written, or written by a later token of
  the same call, are masked out); the attention always reads the cache *after* the write, so a prefill and
  token-by-token steps see the same (for fp8: the same quantized) keys and values;
* returns ``(logits (B, T, V) float32, cache)`` with ``index += lengths`` (``lengths (B,)`` defaults to ``T``).

``lengths`` serves right-padded prompts of different lengths: prefill the padded ``(B, P)`` prompts with
``lengths = prompt_lengths``, read row ``b``'s next-token logits at ``prompt_lengths[b] - 1``, and the next call
overwrites the pad slots (which no later position can see, being masked from ``index`` on).

Writing past ``S`` is an error: a static ``T > S`` raises ``ValueError``; so does ``index + T > S`` when the index
is a concrete value (eager calls); under ``jit`` the rows that would overflow get NaN logits (never silently
wrong ones), so size ``S >= prompt length + new tokens``.

FP8 (E4M3) KV cache. Keys and values enter the cache as ``codes = e4m3(clip(x / s, -448, 448))`` (the division
as a product with ``f32(1/s)``, as in :mod:`lpjax.quant.fp8`) and are read back as ``x ~= codes * s``, with one
float32 scale ``s`` per layer and head for K and one for V. The scales come
from :func:`calibrate_kv_scales`: a forward pass on calibration tokens with an *unquantized* (float32) cache,
``s = headroom * amax(|K|) / 448`` (same for V); values beyond the calibrated range saturate at ``+-448 s``.
They are tied to the parameters, so the learner recalibrates after every policy update ("K/V scales are
recalibrated after every policy update", docs/design.md) and passes the new scales to :meth:`TransformerLM.init_cache`
for the next rollout. What the fp8 cache adds is a rounding error of at most ``max(2^-4 |x|, 2^-10 s)`` per
key/value element (3 mantissa bits; ~3% RMS); tests/nn/test_transformer.py bounds its effect on the logits.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lpjax.nn.dense import Dense
from lpjax.precision import Policy, dtype_of, get_policy
from lpjax.quant.fp8 import E4M3_MAX

KV_CACHE_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn")
"""Dtypes a :class:`KVCache` can store keys and values in (named by any of their names in
:data:`lpjax.precision.DTYPE_NAMES`: ``"fp32"``, ``"bf16"``, ``"fp16"``, ``"fp8"``, ...)."""

_FP8 = np.dtype(jnp.float8_e4m3fn)
_TINY = float(np.finfo(np.float32).tiny)
_MASKED = -1e30


class KVScales(NamedTuple):
    """Float32 dequantization scales of an fp8 KV cache (a pytree).

    Attributes:
      k: ``(num_layers, num_heads)``: ``key ~= code * k[layer, head]``.
      v: ``(num_layers, num_heads)``: ``value ~= code * v[layer, head]``.
    """

    k: jax.Array
    v: jax.Array


class KVCache(NamedTuple):
    """Keys and values of the positions decoded so far, for every layer (a pytree of fixed-shape arrays).

    Attributes:
      k: ``(num_layers, B, S, num_heads, head_dim)`` keys in the cache dtype (float8_e4m3fn: codes).
      v: ``(num_layers, B, S, num_heads, head_dim)`` values, like ``k``.
      k_scale: ``(num_layers, num_heads)`` float32; ``key = k * k_scale`` per layer and head (ones unless fp8).
      v_scale: ``(num_layers, num_heads)`` float32, likewise for ``v``.
      index: ``(B,)`` int32, positions written so far per row; the next token of row ``b`` goes to
        ``index[b]``.
    """

    k: jax.Array
    v: jax.Array
    k_scale: jax.Array
    v_scale: jax.Array
    index: jax.Array

    @property
    def max_len(self) -> int:
        """``S``, the number of positions the cache holds."""
        return int(self.k.shape[2])

    @property
    def dtype(self) -> np.dtype:
        """Storage dtype of keys and values."""
        return np.dtype(self.k.dtype)


def kv_cache_dtype_of(name: Any) -> np.dtype:
    """The numpy dtype of a KV cache from a dtype or a name of :data:`lpjax.precision.DTYPE_NAMES`.

    Raises:
      ValueError: for an unknown name or a dtype not in :data:`KV_CACHE_DTYPES`.
    """
    try:
        dtype = dtype_of(name)
    except (TypeError, ValueError) as error:
        raise ValueError(f"Unknown KV-cache dtype {name!r}; a KV cache stores one of {KV_CACHE_DTYPES}.") from error
    if dtype.name not in KV_CACHE_DTYPES:
        raise ValueError(f"A KV cache stores one of {KV_CACHE_DTYPES}, got {dtype.name}.")
    return dtype


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _to_cache(x: jax.Array, scale: jax.Array, dtype: np.dtype) -> jax.Array:
    """``x (B, T, H, D)`` as cache entries: e4m3 codes of ``clip(x / scale)`` for fp8, else a plain cast."""
    if dtype == _FP8:
        x = x.astype(jnp.float32) * (1.0 / scale)[None, None, :, None]
        return jnp.clip(x, -E4M3_MAX, E4M3_MAX).astype(dtype)
    return x.astype(dtype)


def _from_cache(entries: jax.Array, scale: jax.Array) -> jax.Array:
    """Float32 keys/values ``(B, S, H, D)`` from cache entries (codes times scale for fp8)."""
    x = entries.astype(jnp.float32)
    if entries.dtype == _FP8:
        x = x * scale[None, None, :, None]
    return x


def _write_rows(cache: jax.Array, layer: int, new: jax.Array, index: jax.Array) -> jax.Array:
    """``cache[layer, b, index[b]:index[b] + T] = new[b]`` for every row ``b`` of the stacked ``(num_layers, B, S,
    H, D)`` cache; slots past ``S`` are dropped (their logits are NaN).

    One scatter of the ``T`` new entries, which XLA does in place: every read of the cache's previous value (the
    attention of earlier layers) is an ancestor of ``new``, so a decode loop moves the new entries, not the cache.
    An fp8 cache is scattered as its bit patterns (``uint8``): XLA:CPU emulates float8 and would otherwise convert
    the whole cache to float16 and back around the scatter.
    """
    b, t = new.shape[:2]
    where = (layer, jnp.arange(b)[:, None], index[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :])
    if cache.dtype != _FP8:
        return cache.at[where].set(new, mode="drop")
    codes = jax.lax.bitcast_convert_type(cache, jnp.uint8).at[where]
    codes = codes.set(jax.lax.bitcast_convert_type(new, jnp.uint8), mode="drop")
    return jax.lax.bitcast_convert_type(codes, cache.dtype)


class SelfAttention(nn.Module):
    """Causal multi-head self-attention; q/k/v/o are :class:`lpjax.nn.Dense`, the attention core is float32.

    ``__call__(x (B, T, D), positions (B, T), cache: KVCache | None, layer: int) -> (y (B, T, D), cache)``: without
    a cache the keys are the ``T`` inputs themselves; with one, the new keys/values are written into layer
    ``layer`` of the stacked cache at ``cache.index`` and the attention reads that layer, masked to slots
    ``j <= position``.
    """

    num_heads: int
    policy: Policy | str = "fp32"
    matmul_impl: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, cache: KVCache | None, layer: int):
        policy = get_policy(self.policy)
        b, t, d = x.shape
        h = self.num_heads
        q, k, v = (
            Dense(d, policy, self.matmul_impl, name=name)(x).reshape(b, t, h, d // h)
            for name in ("query", "key", "value")
        )
        if cache is None:
            keys, values = k.astype(jnp.float32), v.astype(jnp.float32)
        else:
            k_scale, v_scale = cache.k_scale[layer], cache.v_scale[layer]
            cache = cache._replace(
                k=_write_rows(cache.k, layer, _to_cache(k, k_scale, cache.dtype), cache.index),
                v=_write_rows(cache.v, layer, _to_cache(v, v_scale, cache.dtype), cache.index),
            )
            keys, values = _from_cache(cache.k[layer], k_scale), _from_cache(cache.v[layer], v_scale)
        mask = jnp.arange(keys.shape[1])[None, None, :] <= positions[:, :, None]  # (B, T, S)
        scores = jnp.einsum("bthd,bshd->bhts", q.astype(jnp.float32), keys) / math.sqrt(d // h)
        scores = jnp.where(mask[:, None], scores, _MASKED)
        weights = jax.nn.softmax(scores, axis=-1)
        y = jnp.einsum("bhts,bshd->bthd", weights, values).reshape(b, t, d)
        return Dense(d, policy, self.matmul_impl, name="out")(y.astype(policy.compute_dtype)), cache


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x += attn(LN(x)); x += mlp(LN(x))`` with a float32 residual stream."""

    num_heads: int
    d_ff: int
    policy: Policy | str = "fp32"
    matmul_impl: str = "auto"
    activation: str = "gelu"

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, cache: KVCache | None, layer: int):
        policy = get_policy(self.policy)
        ln = lambda name: nn.LayerNorm(dtype=jnp.float32, param_dtype=jnp.float32, name=name)
        y, cache = SelfAttention(self.num_heads, policy, self.matmul_impl, name="attn")(
            ln("ln_attn")(x), positions, cache, layer
        )
        x = x + y.astype(jnp.float32)
        y = ln("ln_mlp")(x)
        if self.activation == "relu":
            y = Dense(self.d_ff, policy, self.matmul_impl, activation="relu", name="fc1")(y)
        else:
            y = jax.nn.gelu(Dense(self.d_ff, policy, self.matmul_impl, name="fc1")(y))
        y = Dense(x.shape[-1], policy, self.matmul_impl, name="fc2")(y)
        return x + y.astype(jnp.float32), cache


class TransformerLM(nn.Module):
    """Decoder-only transformer LM with a functional KV cache (see the module docstring for the interface).

    Attributes:
      vocab_size: number of token ids ``V``.
      num_layers: number of blocks.
      num_heads: attention heads; must divide ``d_model``.
      d_model: width of the residual stream.
      d_ff: hidden width of the MLPs.
      max_len: number of learned positions: sequences and caches hold at most ``max_len`` tokens.
      policy: precision policy of the q/k/v/o and MLP :class:`lpjax.nn.Dense` layers (a name or a
        :class:`lpjax.precision.Policy`); embeddings, norms, attention core and lm_head are float32.
      matmul_impl: matmul implementation of those layers: ``"auto"``, ``"xla"``, ``"pallas"`` or ``"reference"``.
      activation: MLP activation, ``"gelu"`` (tanh approximation) or ``"relu"``.

    ``__call__(tokens (B, T) int, cache: KVCache | None = None, lengths (B,) | None = None)`` returns
    ``(logits (B, T, V) float32, new cache or None)``.
    """

    vocab_size: int
    num_layers: int
    num_heads: int
    d_model: int
    d_ff: int
    max_len: int
    policy: Policy | str = "fp32"
    matmul_impl: str = "auto"
    activation: str = "gelu"

    def _check_config(self) -> None:
        for name in ("vocab_size", "num_layers", "num_heads", "d_model", "d_ff", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"TransformerLM.{name} must be a positive int, got {value!r}.")
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide d_model={self.d_model}.")
        if self.activation not in ("gelu", "relu"):
            raise ValueError(f"activation must be 'gelu' or 'relu', got {self.activation!r}.")
        get_policy(self.policy)

    @property
    def head_dim(self) -> int:
        """``d_model // num_heads``."""
        return self.d_model // self.num_heads

    def init_cache(
        self,
        batch_size: int,
        max_len: int | None = None,
        kv_cache_dtype: Any = "float32",
        kv_scales: KVScales | None = None,
    ) -> KVCache:
        """An empty :class:`KVCache` (``index = 0``) for ``batch_size`` rows of up to ``max_len`` positions.

        Args:
          batch_size: ``B``.
          max_len: ``S``, the positions the cache holds; ``None`` for ``self.max_len`` (it cannot be larger).
          kv_cache_dtype: storage of keys and values, one of :data:`KV_CACHE_DTYPES` as a dtype or a name of
            :data:`lpjax.precision.DTYPE_NAMES` (``"fp8"``, ``"bf16"``, ...).
          kv_scales: required for float8_e4m3fn (from :func:`calibrate_kv_scales`): :class:`KVScales` whose ``k``
            and ``v`` are ``(num_layers, num_heads)`` or ``(num_layers,)`` (one scale per layer). Ignored, and
            stored as ones, for the other dtypes.
        """
        self._check_config()
        max_len = self.max_len if max_len is None else max_len
        if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or not 0 < max_len <= self.max_len:
            raise ValueError(
                f"cache max_len must be an int in [1, {self.max_len}] (the model's max_len), got {max_len!r}."
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
        dtype = kv_cache_dtype_of(kv_cache_dtype)
        shape = (self.num_layers, self.num_heads)
        if dtype == _FP8:
            if kv_scales is None:
                raise ValueError(
                    "An fp8 KV cache needs kv_scales: pass calibrate_kv_scales(params, lm, tokens), "
                    "recomputed after every parameter update."
                )
            k_scale, v_scale = (
                jnp.broadcast_to(jnp.asarray(s, jnp.float32).reshape(self.num_layers, -1), shape) for s in kv_scales
            )
        else:
            k_scale = v_scale = jnp.ones(shape, jnp.float32)
        entries = jnp.zeros((self.num_layers, batch_size, max_len, self.num_heads, self.head_dim), dtype)
        return KVCache(entries, entries, k_scale, v_scale, jnp.zeros((batch_size,), jnp.int32))

    @nn.compact
    def __call__(
        self, tokens: jax.Array, cache: KVCache | None = None, lengths: jax.Array | None = None
    ) -> tuple[jax.Array, KVCache | None]:
        self._check_config()
        tokens = jnp.asarray(tokens)
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"tokens must be an integer array (batch, time), got {tokens.dtype}{tokens.shape}.")
        b, t = tokens.shape
        limit = self.max_len if cache is None else cache.max_len
        if t > limit:
            what = "the model's max_len" if cache is None else "the cache's max_len"
            raise ValueError(f"{t} tokens do not fit {what} = {limit}.")
        if cache is None:
            if lengths is not None:
                raise ValueError("lengths only applies to decoding with a cache; pass cache=lm.init_cache(...).")
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
            overflow = None
        else:
            if cache.k.shape[:2] != (self.num_layers, b) or cache.k.shape[3:] != (self.num_heads, self.head_dim):
                raise ValueError(
                    f"cache of shape {cache.k.shape} does not match this model and a batch of {b}: "
                    f"expected ({self.num_layers}, {b}, S, {self.num_heads}, {self.head_dim})."
                )
            index = cache.index.astype(jnp.int32)
            if _is_concrete(index) and int(jnp.max(index)) + t > cache.max_len:
                raise ValueError(
                    f"Writing {t} tokens at cache index {int(jnp.max(index))} overflows the cache "
                    f"(max_len {cache.max_len})."
                )
            positions = index[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
            overflow = index + t > cache.max_len
        embed = nn.Embed(
            self.vocab_size,
            self.d_model,
            embedding_init=nn.initializers.normal(0.02),
            dtype=jnp.float32,
            param_dtype=jnp.float32,
            name="embed",
        )
        pos_embed = self.param("pos_embed", nn.initializers.normal(0.02), (self.max_len, self.d_model), jnp.float32)
        x = embed(tokens) + jnp.take(pos_embed, jnp.minimum(positions, self.max_len - 1), axis=0)
        for layer in range(self.num_layers):
            x, cache = Block(
                self.num_heads, self.d_ff, self.policy, self.matmul_impl, self.activation, name=f"block_{layer}"
            )(x, positions, cache, layer)
        x = nn.LayerNorm(dtype=jnp.float32, param_dtype=jnp.float32, name="ln_final")(x)
        logits = nn.Dense(self.vocab_size, use_bias=False, dtype=jnp.float32, param_dtype=jnp.float32, name="lm_head")(
            x
        )
        if cache is None:
            return logits, None
        logits = jnp.where(overflow[:, None, None], jnp.nan, logits)
        advance = t if lengths is None else jnp.asarray(lengths, jnp.int32)
        cache = cache._replace(index=cache.index + advance)
        return logits, cache


def kv_scales_from_amax(k_amax: jax.Array, v_amax: jax.Array, headroom: float = 1.0) -> KVScales:
    """``KVScales`` with ``s = headroom * amax / 448`` (1 where ``amax == 0``, at least float32's ``tiny``)."""

    def scale(amax):
        amax = jnp.asarray(amax, jnp.float32)
        return jnp.where(amax > 0, jnp.maximum(amax * (headroom / E4M3_MAX), _TINY), 1.0).astype(jnp.float32)

    return KVScales(scale(k_amax), scale(v_amax))


def calibrate_kv_scales(
    params: Any, lm: TransformerLM, calibration_tokens: jax.Array, headroom: float = 1.0, per_head: bool = True
) -> KVScales:
    """Fp8 KV-cache scales ``amax(|K|) / 448`` and ``amax(|V|) / 448`` per layer (and head) on calibration data.

    Runs ``lm`` on ``calibration_tokens`` (as a prefill from position 0 into a float32 cache, so with the model's
    own policy but no KV quantization), takes the largest magnitude of every layer's keys and values, and maps
    it onto E4M3's largest finite value 448. Call it after every parameter update (the scales belong to the
    parameters) and pass the result to ``lm.init_cache(..., kv_cache_dtype="float8_e4m3fn", kv_scales=...)``. To
    calibrate with float32 projections under a low-precision policy: ``calibrate_kv_scales(params,
    lm.clone(policy="fp32"), tokens)`` (works whenever the parameters are float32, as in the ``"fp8"`` policy).

    Args:
      params: ``lm``'s parameters (``lm.init``'s dict).
      lm: the model.
      calibration_tokens: ``(B, T)`` int token ids, ``T <= lm.max_len``, e.g. the last rollout batch.
      headroom: factor >= 1 on the amax: values up to ``headroom`` times the calibrated range are not clipped,
        at the price of coarser codes.
      per_head: one scale per layer and head (default) or one per layer (repeated over heads).

    Returns:
      :class:`KVScales` with ``k`` and ``v`` of shape ``(num_layers, num_heads)``, float32.
    """
    if not headroom >= 1.0:
        raise ValueError(f"headroom must be >= 1, got {headroom!r}.")
    tokens = jnp.asarray(calibration_tokens)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"calibration_tokens must be int (batch, time), got {tokens.dtype}{tokens.shape}.")
    k_amax, v_amax = _kv_amax(params, lm, tokens)
    if not per_head:
        k_amax, v_amax = (jnp.broadcast_to(jnp.max(a, axis=1, keepdims=True), a.shape) for a in (k_amax, v_amax))
    return kv_scales_from_amax(k_amax, v_amax, headroom)


@functools.partial(jax.jit, static_argnames=("lm",))
def _kv_amax(params: Any, lm: TransformerLM, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``amax(|K|)`` and ``amax(|V|)`` per layer and head, ``(num_layers, num_heads)``, of a float32-cache prefill."""
    cache = lm.init_cache(tokens.shape[0], tokens.shape[1], "float32")
    _, cache = lm.apply(params, tokens, cache)
    return jnp.max(jnp.abs(cache.k), axis=(1, 2, 4)), jnp.max(jnp.abs(cache.v), axis=(1, 2, 4))
