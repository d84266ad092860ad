"""TransformerLM: KV-cache decoding equals full recomputation, the fp8 KV cache, calibration, masking, errors.

Tolerances (logits are O(1) at these random initializations, max |logit| ~ 3):

* float32, and bf16 compute with a bf16 cache: ``1e-5`` absolute. Decoding and the full forward do the same
  per-row arithmetic: every Dense row is rounded to the compute dtype from the same float32 accumulation, a bf16
  cache stores bf16 keys/values losslessly, and the float32 attention core only adds masked zeros in another
  order (measured: ~5e-7).
* fp8 (E4M3) KV cache: each key and value is rounded with a relative error of at most ``2^-4`` (3 mantissa bits;
  ~3% RMS measured). At random init the residual stream is dominated by the blocks' outputs, so the logits
  inherit that relative error, once through the keys (softmax) and once through the values: we allow
  ``max|dlogits| <= 2 * 2^-4 * max|logits|`` (measured 0.065-0.078). Under the ``"fp8"`` policy the perturbed
  activations are re-rounded by the downstream fp8 GEMMs (their per-token scales move too), about one more E4M3
  rounding: ``3 * 2^-4`` (measured ~0.10). A lower bound checks the cache really is quantized.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax import rollout
from lpjax.nn import (
    CausalLM,
    KVCache,
    KVScales,
    TransformerLM,
    calibrate_kv_scales,
    recomputing_causal_lm,
    transformer_causal_lm,
)
from lpjax.nn.transformer import KV_CACHE_DTYPES, kv_cache_dtype_of
from lpjax.precision import DTYPE_NAMES

V, L, H, D, FF, MAX = 15, 2, 2, 32, 64, 16
FP8_TOL = 2 * 2.0**-4


def make(policy="fp32"):
    return TransformerLM(V, L, H, D, FF, MAX, policy=policy)


def tokens(seed=0, batch=3, length=12):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, V)


@functools.cache
def jitted(lm):
    """``(forward, step)`` of ``lm`` under jit, shared by the tests (eager Flax is far slower here)."""
    forward = jax.jit(lambda p, t: lm.apply(p, t)[0])
    step = jax.jit(lambda p, t, c, n=None: lm.apply(p, t, c, n))
    return forward, step


@functools.cache
def float32_params():
    """One set of float32 parameters: the fp32, mixed_bf16 and fp8 policies all keep float32 parameters."""
    return jax.jit(make().init)(jax.random.key(1), tokens())


def setup(policy="fp32"):
    lm = make(policy)
    return (lm, float32_params(), tokens()) + jitted(lm)


def decode(lm, params, toks, kv_cache_dtype="float32", scales=None, chunks=(4, 4)):
    """Logits of ``toks`` decoded through the cache: prefill/chunks of the given sizes, then one token at a time."""
    cache = lm.init_cache(toks.shape[0], kv_cache_dtype=kv_cache_dtype, kv_scales=scales)
    step = jitted(lm)[1]
    outs, start = [], 0
    for size in list(chunks) + [1] * (toks.shape[1] - sum(chunks)):
        logits, cache = step(params, toks[:, start : start + size], cache)
        outs.append(logits)
        start += size
    np.testing.assert_array_equal(cache.index, toks.shape[1])
    return jnp.concatenate(outs, axis=1), cache


@pytest.mark.parametrize(
    "policy, kv_cache_dtype", [("fp32", "float32"), ("mixed_bf16", "bfloat16"), ("fp8", "float32")]
)
def test_kv_cache_decoding_equals_full_recomputation(policy, kv_cache_dtype):
    """A 4-token prefill, a 4-token chunk, then single tokens: the logits of one full forward pass."""
    lm, params, toks, forward, _ = setup(policy)
    full = forward(params, toks)
    assert full.shape == (3, 12, V) and full.dtype == jnp.float32
    inc, cache = decode(lm, params, toks, kv_cache_dtype)
    assert cache.k.dtype == jnp.dtype(kv_cache_dtype) and cache.k.shape == (L, 3, MAX, H, D // H)
    np.testing.assert_allclose(inc, full, atol=1e-5, rtol=0)


def materialized_producers(hlo: str, shape: str) -> list[str]:
    """``name opcode`` of every instruction of the compiled ``hlo`` that yields an array of ``shape`` (any element
    type) into a buffer: instructions inside fused computations are left out, they write nothing."""
    fused = set(re.findall(r"calls=(%[\w.-]+)", hlo))
    found, inside_fusion = [], False
    for line in hlo.splitlines():
        header = re.match(r"(?:ENTRY )?(%[\w.-]+) .*\{$", line.rstrip())
        if header:
            inside_fusion = header.group(1) in fused
        elif not inside_fusion:
            found += [" ".join(m) for m in re.findall(rf"(%[\w.-]+) = \w+{re.escape(shape)}\S* ([\w-]+)\(", line)]
    return found


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "bfloat16", "float8_e4m3fn"])
def test_decode_loop_writes_the_new_entries_in_place(kv_cache_dtype):
    """In a compiled decode loop (:func:`lpjax.rollout.sample`) the stacked cache is updated by scatters of each
    step's new entries, which XLA does in place: nothing concatenates the layers' caches per token (that copy of
    every layer's cache per token made decoding memory-bound on the copy). A float32 cache is not copied or
    converted at all; narrower ones may be, by XLA:CPU's emulation of float8 (and, before jax 0.12, bfloat16)."""
    lm = make("mixed_bf16")
    params, toks = float32_params(), tokens()
    model = transformer_causal_lm(lm, kv_cache_dtype=kv_cache_dtype)
    scales = model.calibrate_kv(params, toks)
    settings = rollout.SamplingSettings(max_new_tokens=MAX - toks.shape[1], eos_id=-1)
    sample = jax.jit(lambda p, prompts, key: rollout.sample(model, p, prompts, key, settings, scales))
    hlo = sample.lower(params, toks, jax.random.key(0)).compile().as_text()
    producers = materialized_producers(hlo, f"[{L},{toks.shape[0]},{MAX},{H},{D // H}]")
    assert any("scatter" in p for p in producers), producers
    assert not [p for p in producers if "concatenate" in p], producers
    if kv_cache_dtype == "float32":
        moved = [p for p in producers if "convert" in p or p.endswith(" copy")]
        assert len(moved) <= 2, producers  # k's and v's initial zeros, before the loop


def test_fp8_kv_cache_within_tolerance():
    lm, params, toks, forward, step = setup()
    full = forward(params, toks)
    scales = calibrate_kv_scales(params, lm, toks)
    inc, cache = decode(lm, params, toks, "float8_e4m3fn", scales)
    assert cache.k.dtype == jnp.float8_e4m3fn and cache.v.dtype == jnp.float8_e4m3fn
    err = float(jnp.max(jnp.abs(inc - full)))
    assert 1e-3 < err <= FP8_TOL * float(jnp.max(jnp.abs(full))), err
    # A prefill and token-by-token steps read the same quantized keys/values: they agree to float32 rounding.
    prefill = step(params, toks, lm.init_cache(3, kv_cache_dtype="fp8", kv_scales=scales))[0]
    np.testing.assert_allclose(inc, prefill, atol=1e-5, rtol=0)


def test_fp8_policy_with_fp8_kv_cache():
    """W8A8 fp8 GEMMs and an fp8 KV cache together (one prefill: it reads the cache as the steps do)."""
    lm, params, toks, forward, step = setup("fp8")
    full = forward(params, toks)
    scales = calibrate_kv_scales(params, lm, toks)
    logits = step(params, toks, lm.init_cache(3, kv_cache_dtype="fp8", kv_scales=scales))[0]
    err = float(jnp.max(jnp.abs(logits - full)))
    assert 1e-3 < err <= 3 * 2.0**-4 * float(jnp.max(jnp.abs(full))), err


def test_fp8_cache_holds_clipped_codes_of_calibrated_scales():
    """Codes are e4m3(clip(x / s)) with s = amax / 448 per layer and head: calibration data reaches +-448 exactly."""
    lm, params, toks, _, step = setup()
    scales = calibrate_kv_scales(params, lm, toks)
    assert isinstance(scales, KVScales) and scales.k.shape == (L, H) and scales.k.dtype == jnp.float32
    exact = step(params, toks, lm.init_cache(3))[1]
    quant = step(params, toks, lm.init_cache(3, kv_cache_dtype="fp8", kv_scales=scales))[1]
    for codes, scale, ref in [(quant.k, scales.k, exact.k), (quant.v, scales.v, exact.v)]:
        np.testing.assert_allclose(jnp.max(jnp.abs(ref), axis=(1, 2, 4)) / 448, scale, rtol=1e-6)
        # Layer 0 sees the same input either way (deeper layers read dequantized keys/values below them).
        expected = jnp.clip(ref[0] / scale[0][None, None, :, None], -448, 448).astype(jnp.float8_e4m3fn)
        np.testing.assert_array_equal(codes[0].astype(jnp.float32), expected.astype(jnp.float32))
        assert float(jnp.max(jnp.abs(expected.astype(jnp.float32)))) == 448.0
        deq = codes[0].astype(jnp.float32) * scale[0][None, None, :, None]
        assert float(jnp.max(jnp.abs(deq - ref[0]))) <= 2.0**-4 * float(jnp.max(jnp.abs(ref[0])))
    # Values beyond the calibrated range saturate at +-448 instead of turning into NaN.
    small = KVScales(scales.k / 4, scales.v / 4)
    logits, clipped = step(params, toks, lm.init_cache(3, kv_cache_dtype="fp8", kv_scales=small))
    assert bool(jnp.all(jnp.isfinite(logits))) and float(jnp.max(jnp.abs(clipped.k.astype(jnp.float32)))) == 448.0
    per_layer = calibrate_kv_scales(params, lm, toks, per_head=False)
    np.testing.assert_allclose(per_layer.k, jnp.broadcast_to(jnp.max(scales.k, 1, keepdims=True), (L, H)))
    headroom = calibrate_kv_scales(params, lm, toks, headroom=2.0)
    np.testing.assert_allclose(headroom.v, 2 * scales.v, rtol=1e-6)


def test_recalibrated_scales_follow_the_parameters():
    """Scaling layer 0's key projection by 2 doubles exactly its K scales; V scales do not move."""
    lm, params, toks, _, _ = setup()
    before = calibrate_kv_scales(params, lm, toks)
    changed = jax.tree.map(lambda x: x, params)
    key = params["params"]["block_0"]["attn"]["key"]
    changed["params"]["block_0"]["attn"]["key"] = jax.tree.map(lambda x: 2 * x, key)
    after = calibrate_kv_scales(changed, lm, toks)
    np.testing.assert_allclose(after.k[0], 2 * before.k[0], rtol=1e-6)
    np.testing.assert_allclose(after.v[0], before.v[0], rtol=1e-6)
    assert not np.allclose(after.k[1], before.k[1])  # layer 1 sees a different input


def test_future_tokens_do_not_change_earlier_logits():
    lm, params, a, forward, step = setup()
    b = a.at[:, 6:].set((a[:, 6:] + 1) % V)
    for run in (lambda t: forward(params, t), lambda t: step(params, t, lm.init_cache(3))[0]):
        la, lb = run(a), run(b)
        np.testing.assert_array_equal(la[:, :6], lb[:, :6])
        assert not np.allclose(la[:, 6:], lb[:, 6:])


def test_right_padded_prompts_with_lengths():
    """Rows of different prompt lengths share a prefill; `lengths` rewinds each row so pads get overwritten."""
    lm, params, toks, forward, step = setup()
    full = forward(params, toks)
    lengths = jnp.array([3, 5, 4])
    padded = jnp.where(jnp.arange(5)[None] < lengths[:, None], toks[:, :5], 0)
    logits, cache = step(params, padded, lm.init_cache(3), lengths)
    np.testing.assert_array_equal(cache.index, lengths)
    rows = jnp.arange(3)
    np.testing.assert_allclose(logits[rows, lengths - 1], full[rows, lengths - 1], atol=1e-5)
    logits, cache = step(params, toks[rows, lengths][:, None], cache)
    np.testing.assert_allclose(logits[:, 0], full[rows, lengths], atol=1e-5)


def test_causal_lm_adapters():
    config = dict(vocab_size=V, num_layers=L, num_heads=H, d_model=D, d_ff=FF, max_len=MAX, kv_cache_dtype="fp8")
    model = transformer_causal_lm(config)
    assert isinstance(model, CausalLM) and model.kv_cache_dtype == jnp.float8_e4m3fn and model.max_len == MAX
    assert model.module == make()
    params, toks = float32_params(), tokens()
    full = model.logits(params, toks)
    cache = model.init_cache(3, model.calibrate_kv(params, toks))
    assert isinstance(cache, KVCache) and cache.k.dtype == jnp.float8_e4m3fn

    @jax.jit
    def greedy(params, cache):  # a jitted decode loop: prefill, then scan one-token steps
        logits, cache = model.apply(params, toks[:, :4], cache)

        def body(carry, _):
            token, cache = carry
            logits, cache = model.apply(params, token, cache)
            return (jnp.argmax(logits[:, -1:], -1).astype(jnp.int32), cache), logits[:, 0]

        _, out = jax.lax.scan(body, (jnp.argmax(logits[:, -1:], -1).astype(jnp.int32), cache), length=3)
        return out, logits

    out, prefill = greedy(params, cache)
    assert out.shape == (3, 3, V) and bool(jnp.all(jnp.isfinite(out)))
    assert float(jnp.max(jnp.abs(prefill - full[:, :4]))) <= FP8_TOL * float(jnp.max(jnp.abs(full)))
    assert transformer_causal_lm(make()).calibrate_kv(params, toks) is None  # float32 cache: nothing to calibrate
    # A user's model with only init + logits plugs in through the recomputing adapter, exactly.
    user = recomputing_causal_lm(model.init, model.logits, V, MAX)
    c_user = user.init_cache(3)
    for t0, t1 in [(0, 4), (4, 5), (5, 6)]:
        logits, c_user = user.apply(params, toks[:, t0:t1], c_user)
        np.testing.assert_allclose(logits, full[:, t0:t1], atol=1e-5)
    assert user.calibrate_kv(params, toks) is None


@pytest.mark.slow
def test_fp8_policy_trains():
    """The fp8 policy's logits are differentiable (straight-through fp8 GEMMs) with finite, nonzero gradients.

    Slow tier: ~5 s of compilation; the straight-through gradients themselves are tested in tests/kernels and
    tests/nn/test_dense.py."""
    lm = TransformerLM(V, 1, H, D, FF, MAX, policy="fp8")
    toks = tokens(length=6)
    params = jax.jit(lm.init)(jax.random.key(1), toks)
    assert params["params"]["block_0"]["fc1"]["kernel"].dtype == jnp.float32
    loss = lambda p: jnp.mean(jax.nn.log_softmax(lm.apply(p, toks)[0])[..., 0])
    leaves = jax.tree.leaves(jax.jit(jax.grad(loss))(params))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves) and all(float(jnp.max(jnp.abs(g))) > 0 for g in leaves)


def test_clear_errors():
    lm, params, toks, _, step = setup()
    with pytest.raises(ValueError, match="max_len"):
        lm.apply(params, tokens(length=MAX + 1))
    with pytest.raises(ValueError, match="max_len"):
        lm.apply(params, toks[:, :6], lm.init_cache(3, max_len=5))
    cache = lm.init_cache(3)._replace(index=jnp.array([0, 14, 0], jnp.int32))
    with pytest.raises(ValueError, match="overflows"):
        lm.apply(params, toks[:, :4], cache)
    with pytest.raises(ValueError, match="overflows"):
        transformer_causal_lm(lm).apply(params, toks[:, :4], cache)
    logits, _ = step(params, toks[:, :4], cache)  # under jit: the overflowing row gets loud NaNs
    assert bool(jnp.all(jnp.isnan(logits[1]))) and bool(jnp.all(jnp.isfinite(logits[0])))
    with pytest.raises(ValueError, match="kv_scales"):
        lm.init_cache(3, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="KV"):
        lm.init_cache(3, kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="max_len"):
        lm.init_cache(3, max_len=MAX + 1)
    with pytest.raises(ValueError, match="max_len"):
        calibrate_kv_scales(params, lm, tokens(length=MAX + 1))
    with pytest.raises(ValueError, match="divide"):
        TransformerLM(V, 1, 3, 32, 64, 8).init(jax.random.key(0), tokens(length=4))
    with pytest.raises(ValueError, match="config keys"):
        transformer_causal_lm(dict(vocab_size=V, num_layers=1, num_heads=1, d_model=8, d_ff=8, max_len=4, dim=3))


def test_kv_cache_dtype_names_are_lpjax_precision_dtype_names():
    """Every name of lpjax.precision.DTYPE_NAMES for a KV dtype is accepted (one table, no aliases of its own)."""
    names = {name: np.dtype(dtype) for name, dtype in DTYPE_NAMES.items() if np.dtype(dtype).name in KV_CACHE_DTYPES}
    assert set(names) >= {"fp32", "float32", "bf16", "fp16", "f16", "fp8", "e4m3", "float8_e4m3fn"}
    for name, dtype in names.items():
        assert kv_cache_dtype_of(name) == kv_cache_dtype_of(name.upper()) == kv_cache_dtype_of(dtype) == dtype
    assert (
        kv_cache_dtype_of("fp8") == jnp.float8_e4m3fn
        and make().init_cache(1, kv_cache_dtype="bf16").dtype == jnp.bfloat16
    )
    for bad, message in [
        ("int8", "Unknown KV-cache dtype"),
        ("float8_e5m2", "A KV cache stores one of"),
        (jnp.int8, "A KV cache stores one of"),
        ("float64", "A KV cache stores one of"),
    ]:
        with pytest.raises(ValueError, match=message):
            kv_cache_dtype_of(bad)
