"""What a causal language model must provide for lpjax's GRPO learner and rollout engine: :class:`CausalLM`.

A :class:`CausalLM` is a frozen bundle of pure functions (hashable, so it can be a static argument of
``jax.jit``; build it once and reuse it). ``params`` and ``cache`` are opaque pytrees to the learner::

    model.init(key, tokens) -> params                         tokens (B, T) int32, T <= max_len
    model.logits(params, tokens) -> (B, T, V) float32         full sequence from position 0, causal;
                                                              differentiable (training log-probs)
    model.calibrate_kv(params, tokens) -> kv_scales | None    call after every parameter update
    model.init_cache(batch_size, kv_scales=None, max_len=None) -> cache   empty, max_len slots per row
    model.apply(params, tokens, cache, lengths=None) -> (logits (B, T, V) float32, cache)

``apply`` continues each row where its cache stops: it handles a prompt prefill (``T > 1``) and one-token steps
(``T = 1``) alike, and ``lengths (B,)`` (default ``T``) says how many of the ``T`` tokens each row really
advances by (right-padded prompts; the pad slots are overwritten by the next call). Its logits must equal
``logits(params, all tokens so far)`` at the same positions, up to the rounding of a quantized cache.
``calibrate_kv`` returns the scales of a quantized (fp8) KV cache computed from ``params`` on sample tokens, or
``None`` when the cache is not quantized; the learner passes the result to ``init_cache`` of the next rollout.

Two constructors: :func:`transformer_causal_lm` for lpjax's :class:`~lpjax.nn.transformer.TransformerLM`
(with a float32, bfloat16 or fp8 KV cache), and :func:`recomputing_causal_lm` for a user's own model given only
``init`` and ``logits``: its "cache" keeps the tokens and each ``apply`` recomputes the whole sequence (slow,
but exact and enough to plug any causal model into the learner).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lpjax.nn.transformer import (
    KVCache,
    TransformerLM,
    calibrate_kv_scales,
    kv_cache_dtype_of,
)

_FLOAT32 = np.dtype(np.float32)


@dataclasses.dataclass(frozen=True)
class CausalLM:
    """A causal LM as pure functions: the interface the GRPO learner and the rollout engine use.

    Attributes:
      init: ``(key, tokens (B, T)) -> params``.
      logits: ``(params, tokens (B, T)) -> (B, T, V)`` float32 next-token logits for the whole sequence (positions
        ``0..T-1``); causal: position ``t`` depends on ``tokens[:, :t+1]`` only.
      init_cache: ``(batch_size, kv_scales=None, max_len=None) -> cache``, empty, ``max_len`` (default: the
        model's) positions per row. ``kv_scales`` is what ``calibrate_kv`` returned (required by an fp8 cache).
      apply: ``(params, tokens (B, T), cache, lengths=None) -> (logits (B, T, V) float32, cache)``: decodes
        ``tokens`` after what the cache holds and appends them to it (``lengths (B,)`` of them per row).
      calibrate_kv: ``(params, tokens (B, T)) -> kv_scales or None``; KV-cache scales for these parameters.
      vocab_size: ``V``.
      max_len: the longest sequence ``logits`` accepts and the largest cache.
      kv_cache_dtype: storage dtype of the KV cache (informational; float32 for recomputing models).
      module: the underlying Flax module, if any (e.g. to count parameters or clone it with another policy).
    """

    init: Callable[[jax.Array, jax.Array], Any]
    logits: Callable[[Any, jax.Array], jax.Array]
    init_cache: Callable[..., Any]
    apply: Callable[..., tuple[jax.Array, Any]]
    calibrate_kv: Callable[[Any, jax.Array], Any]
    vocab_size: int
    max_len: int
    kv_cache_dtype: np.dtype = _FLOAT32
    module: Any = None


_LM_FIELDS = (
    "vocab_size",
    "num_layers",
    "num_heads",
    "d_model",
    "d_ff",
    "max_len",
    "policy",
    "matmul_impl",
    "activation",
)


def transformer_causal_lm(config: TransformerLM | Mapping[str, Any], kv_cache_dtype: Any = None) -> CausalLM:
    """A :class:`CausalLM` backed by :class:`~lpjax.nn.transformer.TransformerLM` and its KV cache.

    Args:
      config: a ``TransformerLM``, or a mapping (dict, ``ml_collections.ConfigDict``) of its fields
        ``vocab_size, num_layers, num_heads, d_model, d_ff, max_len`` and optionally ``policy, matmul_impl, activation``
        and ``kv_cache_dtype``.
      kv_cache_dtype: KV-cache storage, ``"float32"`` (default), ``"bfloat16"``, ``"float16"`` or ``"float8_e4m3fn"``
        (``"fp8"``); overrides ``config["kv_cache_dtype"]``. With fp8, ``calibrate_kv`` returns per-layer, per-head
        :class:`~lpjax.nn.transformer.KVScales` (``amax / 448`` on the given tokens) and ``init_cache`` requires
        them; otherwise ``calibrate_kv`` returns ``None``.

    The returned ``logits``/``apply`` are jitted; ``apply`` raises ``ValueError`` eagerly when the tokens would
    overflow the cache (inside a caller's ``jit`` the overflowing rows get NaN logits instead).
    """
    if isinstance(config, TransformerLM):
        lm, cfg_kv = config, None
    else:
        cfg = dict(config.to_dict() if hasattr(config, "to_dict") else config)
        cfg_kv = cfg.pop("kv_cache_dtype", None)
        unknown = sorted(set(cfg) - set(_LM_FIELDS))
        if unknown:
            raise ValueError(f"Unknown TransformerLM config keys {unknown}; valid: {_LM_FIELDS + ('kv_cache_dtype',)}.")
        lm = TransformerLM(**cfg)
    lm._check_config()
    dtype = kv_cache_dtype_of(
        kv_cache_dtype if kv_cache_dtype is not None else cfg_kv if cfg_kv is not None else "float32"
    )
    quantized = dtype == np.dtype(jnp.float8_e4m3fn)

    logits_fn = jax.jit(lambda params, tokens: lm.apply(params, tokens)[0])
    apply_jit = jax.jit(lambda params, tokens, cache, lengths: lm.apply(params, tokens, cache, lengths))

    def apply(params: Any, tokens: jax.Array, cache: KVCache, lengths: jax.Array | None = None):
        tokens = jnp.asarray(tokens)
        if tokens.ndim == 2 and not isinstance(cache.index, jax.core.Tracer):
            end = int(jnp.max(cache.index)) + tokens.shape[1]
            if end > cache.max_len:
                raise ValueError(
                    f"Decoding {tokens.shape[1]} tokens after {end - tokens.shape[1]} overflows the "
                    f"KV cache (max_len {cache.max_len})."
                )
        return apply_jit(params, tokens, cache, lengths)

    def init_cache(batch_size: int, kv_scales: Any = None, max_len: int | None = None) -> KVCache:
        return lm.init_cache(batch_size, max_len, dtype, kv_scales)

    def calibrate_kv(params: Any, tokens: jax.Array):
        return calibrate_kv_scales(params, lm, tokens) if quantized else None

    return CausalLM(
        init=jax.jit(lm.init),
        logits=logits_fn,
        init_cache=init_cache,
        apply=apply,
        calibrate_kv=calibrate_kv,
        vocab_size=lm.vocab_size,
        max_len=lm.max_len,
        kv_cache_dtype=dtype,
        module=lm,
    )


class TokenCache(NamedTuple):
    """The "cache" of :func:`recomputing_causal_lm`: the tokens so far.

    Attributes:
      tokens: ``(B, S)`` int32, positions ``>= index`` are padding.
      index: ``(B,)`` int32, tokens written per row.
    """

    tokens: jax.Array
    index: jax.Array


def recomputing_causal_lm(
    init: Callable[[jax.Array, jax.Array], Any],
    logits: Callable[[Any, jax.Array], jax.Array],
    vocab_size: int,
    max_len: int,
) -> CausalLM:
    """A :class:`CausalLM` for any causal model from its ``init`` and full-sequence ``logits`` alone.

    The cache (:class:`TokenCache`) stores the tokens; ``apply`` writes the new ones and recomputes
    ``logits(params, all S slots)``, returning the ``T`` positions just written. That is exact for a causal model
    (padding after a position cannot change it) and costs a full forward per step; implement a real KV cache for
    speed. ``logits`` must accept ``(B, S)`` tokens for ``S <= max_len`` and return ``(B, S, V)``.
    """

    limit = int(max_len)

    def init_cache(batch_size: int, kv_scales: Any = None, max_len: int | None = None) -> TokenCache:
        size = limit if max_len is None else max_len
        if not 0 < size <= limit:
            raise ValueError(f"cache max_len must be in [1, {limit}], got {size}.")
        return TokenCache(jnp.zeros((batch_size, size), jnp.int32), jnp.zeros((batch_size,), jnp.int32))

    def apply(params: Any, tokens: jax.Array, cache: TokenCache, lengths: jax.Array | None = None):
        tokens = jnp.asarray(tokens, jnp.int32)
        t, size = tokens.shape[1], cache.tokens.shape[1]
        if t > size:
            raise ValueError(f"{t} tokens do not fit the cache's max_len = {size}.")
        if not isinstance(cache.index, jax.core.Tracer) and int(jnp.max(cache.index)) + t > size:
            raise ValueError(f"Decoding {t} tokens overflows the token cache (max_len {size}).")
        write = jax.vmap(lambda row, new, i: jax.lax.dynamic_update_slice(row, new, (i,)))
        buffer = write(cache.tokens, tokens, cache.index)
        full = logits(params, buffer)
        out = jax.vmap(lambda row, i: jax.lax.dynamic_slice_in_dim(row, i, t, axis=0))(full, cache.index)
        overflow = cache.index + t > size
        out = jnp.where(overflow[:, None, None], jnp.nan, out.astype(jnp.float32))
        advance = t if lengths is None else jnp.asarray(lengths, jnp.int32)
        return out, TokenCache(buffer, cache.index + advance)

    return CausalLM(
        init=init,
        logits=logits,
        init_cache=init_cache,
        apply=apply,
        calibrate_kv=lambda params, tokens: None,
        vocab_size=int(vocab_size),
        max_len=limit,
    )


def as_causal_lm(model: CausalLM | TransformerLM | Mapping[str, Any]) -> CausalLM:
    """``model`` itself if it is a :class:`CausalLM`, else :func:`transformer_causal_lm` of it."""
    return model if isinstance(model, CausalLM) else transformer_causal_lm(model)
