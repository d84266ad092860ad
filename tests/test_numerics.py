"""fp16-safe primitives of lpjax.numerics (Björck et al., 2021, Sec. 4 and appendix C).

For every primitive:

* float64: it equals the textbook formula (the paper's proofs say each fix is the identity in exact arithmetic);
* float16, with RUNTIME arrays (jit arguments; XLA would constant-fold Python constants in higher precision):
  the naive formula overflows / underflows / loses precision where the lpjax one matches a float64 reference;
* float16 error bounds, in float16 ulps of the float64 reference, over every input where the true result is
  representable (exhaustively over all 63,488 finite float16 values for the unary primitives, by hypothesis for
  the others), gradients included;
* bfloat16 spot checks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from lpjax import numerics

F16_MAX = 65504.0
F16_TINY = 2.0**-14  # smallest normal float16
F16_SUBNORMAL = 2.0**-24  # smallest subnormal float16 (spacing of the subnormals)
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

# Every finite float16 value (63,488 of them), as float16 and as exact float64.
_ALL = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
ALL_F16 = _ALL[np.isfinite(_ALL)]
ALL_F64 = ALL_F16.astype(np.float64)


def ulp16(ref) -> np.ndarray:
    """Spacing of float16 at |ref| (2^-24 in the subnormal range), computed in float64; no overflow at 65504."""
    r = np.abs(np.asarray(ref, np.float64))
    return 2.0 ** (np.floor(np.log2(np.maximum(r, F16_TINY))) - 10)


def ulp_bf16(ref) -> np.ndarray:
    """Spacing of bfloat16 (8 significant bits) at |ref|, for normal values."""
    r = np.abs(np.asarray(ref, np.float64))
    return 2.0 ** (np.floor(np.log2(np.maximum(r, 2.0**-126))) - 7)


def f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def fp16_floats(lo: float, hi: float):
    """Hypothesis strategy of finite float16 values in [lo, hi] (bounds must be float16-representable)."""
    return st.floats(lo, hi, width=16, allow_nan=False, allow_infinity=False)


# --- jitted functions: always called with runtime arrays, never closed-over constants ------------------------

normal_j = jax.jit(numerics.normal_log_prob)
tanh_ldj_j = jax.jit(numerics.tanh_log_det_jacobian)
standardize_j = jax.jit(numerics.weight_standardize)
hypot_j = jax.jit(numerics.hypot)

tanh_ldj_grad_j = jax.jit(jax.vmap(jax.grad(numerics.tanh_log_det_jacobian)))
hypot_grad_j = jax.jit(jax.vmap(jax.grad(numerics.hypot, argnums=(0, 1))))
normal_grad_j = jax.jit(jax.vmap(jax.grad(numerics.normal_log_prob, argnums=(0, 1, 2))))


# --- the naive (textbook / PyTorch-style) formulas the fixes replace ------------------------------------------


def naive_normal_log_prob(x, loc, scale):
    return -jnp.square(x - loc) / (2.0 * jnp.square(scale)) - jnp.log(scale) - HALF_LOG_2PI


def naive_tanh_ldj(u):
    return jnp.log(1.0 - jnp.square(jnp.tanh(u)))


def naive_tanh_ldj_eps(u):
    """The usual SAC implementation: log(1 - tanh(u)^2 + 1e-6)."""
    return jnp.log(1.0 - jnp.square(jnp.tanh(u)) + 1e-6)


def naive_hypot(x, y):
    return jnp.sqrt(x * x + y * y)


naive_normal_j = jax.jit(naive_normal_log_prob)
naive_normal_grad_j = jax.jit(jax.vmap(jax.grad(naive_normal_log_prob, argnums=(0, 1, 2))))
naive_tanh_ldj_j = jax.jit(naive_tanh_ldj)
naive_tanh_ldj_eps_j = jax.jit(naive_tanh_ldj_eps)
naive_tanh_ldj_grad_j = jax.jit(jax.vmap(jax.grad(naive_tanh_ldj)))
naive_hypot_j = jax.jit(naive_hypot)
naive_hypot_grad_j = jax.jit(jax.vmap(jax.grad(naive_hypot, argnums=(0, 1))))


# --- float64 references (numpy) --------------------------------------------------------------------------------


def ref_normal(x, loc, scale):
    x, loc, scale = f64(x), f64(loc), f64(scale)
    return -((x - loc) ** 2) / (2.0 * scale**2) - np.log(scale) - HALF_LOG_2PI


def ref_tanh_ldj(u):
    """log(1 - tanh(u)^2) = log(sech(u)^2) = -2 log cosh(u), evaluated without overflow for any u."""
    u = f64(u)
    return -2.0 * (np.logaddexp(u, -u) - math.log(2.0))


def ref_standardize(w, eps=1e-5):
    w = f64(w)
    axes = tuple(range(w.ndim - 1))
    return (w - w.mean(axis=axes)) / np.sqrt(w.std(axis=axes) ** 2 + eps)


# ======================================================================================================
# normal_log_prob
# ======================================================================================================


@given(x=st.floats(-1e6, 1e6), loc=st.floats(-1e6, 1e6), log_scale=st.floats(-20.0, 10.0))
def test_normal_log_prob_float64_equals_textbook(run_x64, x, loc, log_scale):
    scale = math.exp(log_scale)
    got = float(run_x64(normal_j, np.float64(x), np.float64(loc), np.float64(scale)))
    textbook = -((x - loc) ** 2) / (2 * scale**2) - math.log(scale) - 0.5 * math.log(2 * math.pi)
    # A sum of three terms: the rounding error is relative to the largest one.
    largest = max(0.5 * ((x - loc) / scale) ** 2, abs(log_scale), 1.0)
    assert abs(got - textbook) <= 1e-14 * largest


def test_normal_log_prob_float64_broadcasts_and_matches_textbook(x64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3)) * 10
    loc, scale = rng.normal(size=(3,)), np.exp(rng.uniform(-5, 2, size=(3,)))
    got = normal_j(x, loc, scale)
    assert got.shape == (5, 3) and got.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(got), ref_normal(x, loc, scale), rtol=1e-14)


@pytest.mark.parametrize("log_scale", [-10.0, -8.5])
def test_normal_log_prob_float16_small_sigma_naive_fails_fix_is_accurate(log_scale):
    """sigma^2 underflows float16 (to 0 at sigma = e^-10, the pixel-SAC lower bound; to a 1-bit subnormal at
    e^-8.5) while (x - mu) / sigma stays in range."""
    n = 64
    scale = np.full(n, math.exp(log_scale), np.float16)
    loc = np.full(n, 0.25, np.float16)
    z = np.linspace(-40.0, 40.0, n)
    x = (f64(loc) + z * f64(scale)).astype(np.float16)
    ref = ref_normal(x, loc, scale)
    got = f64(normal_j(x, loc, scale))
    largest = np.maximum(0.5 * ((f64(x) - f64(loc)) / f64(scale)) ** 2, abs(log_scale))
    assert np.all(np.abs(got - ref) <= 6 * ulp16(largest))
    naive = f64(naive_normal_j(x, loc, scale))
    if log_scale == -10.0:
        assert not np.any(np.isfinite(naive))  # x/0: -inf, and 0/0 = nan at x == mu
    else:
        assert np.nanmax(np.abs(naive - ref) / np.abs(ref)) > 0.25  # 25% off (one significant bit in sigma^2)


def test_normal_log_prob_float16_large_deviation_naive_overflows_fix_does_not():
    x = np.array([300.0, -300.0, 1000.0, 20000.0, -20000.0], np.float16)
    loc = np.array([0.0, 0.0, 10.0, 0.0, 5000.0], np.float16)
    scale = np.array([2.0, 2.0, 10.0, 100.0, 300.0], np.float16)
    naive = f64(naive_normal_j(x, loc, scale))
    assert not np.any(np.isfinite(naive))  # (x - mu)^2 > 65504: -inf (or inf/inf = nan when 2 sigma^2 > 65504)
    got = f64(normal_j(x, loc, scale))
    ref = ref_normal(x, loc, scale)
    assert np.all(np.isfinite(got))
    assert np.all(np.abs(got - ref) <= 4 * ulp16(ref))


@given(loc=fp16_floats(-100.0, 100.0), log_scale=st.floats(-10.0, 2.0), z=st.floats(-250.0, 250.0))
def test_normal_log_prob_float16_within_6_ulp_of_largest_term(loc, log_scale, z):
    """Bound: 6 float16 ulps of max(0.5 z^2, |log sigma|, 0.92) -- relative to the largest of the three summed
    terms, as any floating-point sum; when 0.5 z^2 dominates that is a relative error of a few ulps."""
    loc = np.float16(loc)
    scale = np.float16(math.exp(log_scale))
    x = np.float16(float(loc) + z * float(scale))
    assume(np.isfinite(x))
    zz = (float(x) - float(loc)) / float(scale)
    assume(abs(zz) <= 255.0)  # z^2 representable; see test_normal_log_prob_float16_finite_when_representable
    got = float(normal_j(x, loc, scale))
    ref = float(ref_normal(x, loc, scale))
    largest = max(0.5 * zz * zz, abs(math.log(float(scale))), HALF_LOG_2PI)
    assert abs(got - ref) <= 6 * float(ulp16(largest))


def test_normal_log_prob_float16_finite_when_representable():
    x = np.array([300.0, -300.0, 350.0], np.float16)
    loc = np.zeros(3, np.float16)
    scale = np.ones(3, np.float16)
    ref = ref_normal(x, loc, scale)  # -45000.9, -45000.9, -61250.9
    assert np.all(ref > -F16_MAX)
    got = f64(normal_j(x, loc, scale))
    assert np.all(np.abs(got - ref) <= 4 * ulp16(ref))


def test_normal_log_prob_float16_x_and_loc_gradients_finite_at_tiny_sigma_where_naive_is_not():
    scale = np.full(4, math.exp(-10.0), np.float16)
    loc = np.zeros(4, np.float16)
    x = np.array([0.0, 2e-5, -5e-5, 1e-4], np.float16)
    dx, dloc, _ = (f64(g) for g in normal_grad_j(x, loc, scale))
    X, S = f64(x), f64(scale)
    z = X / S
    np.testing.assert_allclose(dx, -z / S, rtol=4e-3, atol=1e-3)
    np.testing.assert_allclose(dloc, z / S, rtol=4e-3, atol=1e-3)
    naive = np.stack([f64(g) for g in naive_normal_grad_j(x, loc, scale)])
    assert not np.any(np.isfinite(naive))  # sigma^2 = 0: inf and 0/0 = nan


def test_normal_log_prob_float16_scale_gradient_accurate_down_to_sigma_e_minus_5():
    """d/dsigma = (z^2 - 1) / sigma; fine for sigma >= 2^-8 (the state-SAC bound e^-5 = 0.0067 included)."""
    scale = np.array([math.exp(-5.0), 0.01, 0.1, 1.0, 7.0], np.float16)
    loc = np.array([0.5, -1.0, 3.0, 0.0, -20.0], np.float16)
    z = np.array([0.0, 1.5, -3.0, 10.0, 2.0])
    x = (f64(loc) + z * f64(scale)).astype(np.float16)
    Z = (f64(x) - f64(loc)) / f64(scale)
    ref = (Z * Z - 1) / f64(scale)
    _, _, dscale = normal_grad_j(x, loc, scale)
    assert np.all(np.abs(f64(dscale) - ref) <= 4 * ulp16(ref) + 4 * ulp16(1 / f64(scale)))


def test_normal_log_prob_float16_scale_gradient_finite_at_tiny_sigma():
    scale = np.full(4, math.exp(-10.0), np.float16)
    loc = np.zeros(4, np.float16)
    x = np.array([0.0, 2e-5, -5e-5, 1e-4], np.float16)
    _, _, dscale = normal_grad_j(x, loc, scale)
    Z = f64(x) / f64(scale)
    ref = (Z * Z - 1) / f64(scale)  # -22017, -17736, 4675, 84750 (inf in fp16)
    rep = np.abs(ref) <= F16_MAX
    np.testing.assert_allclose(f64(dscale)[rep], ref[rep], rtol=1e-2)


def test_normal_log_prob_bfloat16_spot_check():
    loc = jnp.asarray([0.0, 1.0, -3.0], jnp.bfloat16)
    scale = jnp.asarray([math.exp(-10.0), 1.0, math.exp(2.0)], jnp.bfloat16)
    x = jnp.asarray([1e-4, 30.0, 50.0], jnp.bfloat16)
    got = normal_j(x, loc, scale)
    assert got.dtype == jnp.bfloat16
    ref = ref_normal(x, loc, scale)
    assert np.all(np.abs(f64(got) - ref) <= 4 * ulp_bf16(ref))


# ======================================================================================================
# tanh_log_det_jacobian
# ======================================================================================================


@given(u=st.floats(-5.0, 5.0))
def test_tanh_log_det_jacobian_float64_equals_log_one_minus_tanh_squared(run_x64, u):
    got = float(run_x64(tanh_ldj_j, np.float64(u)))
    textbook = math.log(1.0 - math.tanh(u) ** 2)
    # The textbook form itself is only accurate to ~eps / (1 - tanh^2) <= 2.5e-12 absolute at |u| = 5.
    assert got == pytest.approx(textbook, rel=0, abs=1e-11)


@given(u=st.one_of(st.floats(-30.0, 30.0), st.floats(-1e5, 1e5)))
def test_tanh_log_det_jacobian_float64_equals_minus_two_log_cosh(run_x64, u):
    got = float(run_x64(tanh_ldj_j, np.float64(u)))
    ref = float(ref_tanh_ldj(u))  # log(1 - tanh^2) = -2 log cosh(u), no overflow
    assert got <= 1e-15
    assert abs(got - ref) <= 1e-13 * abs(ref) + 1e-15


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tanh_log_det_jacobian_exact_in_float64_and_float32(run_x64, dtype):
    u = np.array([-5.01, -5.5, -6.0, -8.0])
    got = f64(run_x64(lambda: tanh_ldj_j(jnp.asarray(u, dtype))))
    mirrored = f64(run_x64(lambda: tanh_ldj_j(jnp.asarray(-u, dtype))))
    rtol = 1e-13 if dtype == "float64" else 1e-6
    np.testing.assert_allclose(got, ref_tanh_ldj(u), rtol=rtol)
    np.testing.assert_allclose(got, mirrored, rtol=rtol)


def test_tanh_log_det_jacobian_float16_naive_is_minus_inf_beyond_4_5_fix_is_accurate():
    u = ALL_F16[(np.abs(ALL_F64) >= 4.51) & (np.abs(ALL_F64) <= 30.0)]
    assert np.all(np.isneginf(f64(naive_tanh_ldj_j(u))))  # tanh rounds to +-1: log(0)
    assert np.all(np.isnan(f64(naive_tanh_ldj_grad_j(u))))
    far = u[np.abs(f64(u)) >= 8.0]
    # The "+ 1e-6" does not rescue it: the result saturates at one value (log of float16's 1e-6, or -inf where the
    # compiler drops the constant), while the exact one keeps falling by 2 per unit of |u|: off by 0.81 at |u| = 8.
    naive_eps = f64(naive_tanh_ldj_eps_j(far))
    assert len(np.unique(naive_eps)) == 1
    assert np.all(np.abs(naive_eps - ref_tanh_ldj(far)) > 0.8)
    got = f64(tanh_ldj_j(u))
    ref = ref_tanh_ldj(u)
    assert np.all(np.isfinite(got))
    assert np.all(np.abs(got - ref) <= 2 * ulp16(ref))


def test_tanh_log_det_jacobian_float16_error_bound_for_every_float16_input():
    """Bound: 4 ulps of the result + 2^-8 absolute. The absolute floor (8 ulps at 0.5) comes from the cancellation
    in 2 (log 2 - |u| - log1p(exp(-2|u|))) for small |u|, where the result is ~ -u^2."""
    got = f64(tanh_ldj_j(ALL_F16))
    ref = ref_tanh_ldj(ALL_F64)
    representable = ref >= -F16_MAX
    assert np.all(np.isfinite(got[representable]))
    err = np.abs(got - ref)
    assert np.all((err <= 4 * ulp16(ref) + 2.0**-8)[representable])
    # Away from zero the error is a few ulps, no floor needed.
    away = representable & (np.abs(ALL_F64) >= 2.0)
    assert np.all((err <= 3 * ulp16(ref))[away])


def test_tanh_log_det_jacobian_float16_gradient_finite_and_accurate_for_every_float16_input():
    u = ALL_F16
    got = f64(tanh_ldj_grad_j(u))
    ref = -2.0 * np.tanh(f64(u))
    assert np.all(np.isfinite(got))
    assert np.all(np.abs(got - ref) <= 4 * ulp16(ref) + 2.0**-8)


def test_tanh_log_det_jacobian_bfloat16_spot_check():
    u = jnp.asarray(np.linspace(-40.0, 40.0, 801), jnp.bfloat16)
    U = f64(u)
    assert not np.all(np.isfinite(f64(naive_tanh_ldj_j(u))[np.abs(U) >= 3.5]))  # bf16 tanh is 1 already at 3.5
    got = f64(tanh_ldj_j(u))
    ref = ref_tanh_ldj(u)
    assert np.all(np.isfinite(got))
    assert np.all(np.abs(got - ref) <= 4 * ulp_bf16(ref) + 2.0**-5)


# ======================================================================================================
# the tanh-squashed Gaussian: normal_log_prob(u) - tanh_log_det_jacobian(u), as SAC's policy composes them
# ======================================================================================================


def squashed_log_prob(u, loc, scale):
    """log p(tanh(u)) for u ~ N(loc, scale): the composition in lpjax.agents.sac.squashed_gaussian."""
    return numerics.normal_log_prob(u, loc, scale) - numerics.tanh_log_det_jacobian(u)


squashed_j = jax.jit(squashed_log_prob)


@given(u=st.floats(-50.0, 50.0), loc=st.floats(-20.0, 20.0), log_scale=st.floats(-10.0, 3.0))
def test_squashed_log_prob_float64_equals_textbook(run_x64, u, loc, log_scale):
    scale = math.exp(log_scale)
    got = float(run_x64(squashed_j, np.float64(u), np.float64(loc), np.float64(scale)))
    textbook = float(ref_normal(u, loc, scale) - ref_tanh_ldj(u))
    largest = max(0.5 * ((u - loc) / scale) ** 2, abs(log_scale), 2 * abs(u), 1.0)
    assert abs(got - textbook) <= 1e-14 * largest
    if abs(u) <= 5:  # literal log(1 - tanh(u)^2) is accurate enough here
        literal = -((u - loc) ** 2) / (2 * scale**2) - log_scale - HALF_LOG_2PI - math.log(1 - math.tanh(u) ** 2)
        assert abs(got - literal) <= 1e-14 * largest + 1e-11


def _sac_batch(seed: int, n: int):
    """Pre-tanh samples as SAC draws them: u = mu + sigma * eps, log sigma in [-5, 2], all float16."""
    rng = np.random.default_rng(seed)
    loc = rng.uniform(-8, 8, n).astype(np.float16)
    scale = np.exp(rng.uniform(-5, 2, n)).astype(np.float16)
    eps = rng.standard_normal(n).astype(np.float16)
    return loc, scale, eps


def test_squashed_log_prob_float16_sac_batch_fix_accurate_naive_not():
    loc, scale, eps = _sac_batch(0, 20000)
    u = jax.jit(lambda m, s, e: m + s * e)(loc, scale, eps)
    got = f64(squashed_j(u, loc, scale))
    U = f64(u)
    ref = ref_normal(U, loc, scale) - ref_tanh_ldj(U)
    zz = (U - f64(loc)) / f64(scale)
    largest = np.maximum.reduce([0.5 * zz**2, np.abs(np.log(f64(scale))), np.abs(ref_tanh_ldj(U)), np.ones_like(U)])
    assert np.all(np.isfinite(got))
    assert np.all(np.abs(got - ref) <= 6 * ulp16(largest) + 2.0**-8)
    naive = f64(naive_normal_j(u, loc, scale) - naive_tanh_ldj_eps_j(u))
    wrong = ~np.isfinite(naive) | (np.abs(naive - ref) > 1.0)
    assert wrong.mean() > 0.3  # every |u| > ~8 (and often |u| > 4.5)


def test_squashed_log_prob_float16_reparameterized_gradients_are_finite():
    """SAC differentiates log pi(tanh(mu + sigma eps)) w.r.t. mu and sigma; in fp16 the naive form gives nan."""
    loc, scale, eps = _sac_batch(1, 4096)

    def loss(fn, m, s, e):
        return jnp.sum(fn(m + s * e, m, s).astype(jnp.float32))

    ours = jax.jit(jax.grad(lambda m, s, e: loss(squashed_log_prob, m, s, e), argnums=(0, 1)))
    naive = jax.jit(
        jax.grad(
            lambda m, s, e: loss(lambda u, mm, ss: naive_normal_log_prob(u, mm, ss) - naive_tanh_ldj(u), m, s, e),
            argnums=(0, 1),
        )
    )
    g_ours = [f64(g) for g in ours(loc, scale, eps)]
    g_naive = [f64(g) for g in naive(loc, scale, eps)]
    assert all(np.all(np.isfinite(g)) for g in g_ours)
    assert any(np.any(np.isnan(g)) for g in g_naive)
    # d/dmu: the normal term does not depend on mu (u - mu = sigma eps); only -log(1 - tanh^2) does: 2 tanh(u).
    # In float16 the two +-z/sigma contributions of the normal term cancel only up to their rounding.
    U = f64(jax.jit(lambda m, s, e: m + s * e)(loc, scale, eps))
    tol = 4 * ulp16(np.abs(f64(eps)) / f64(scale)) + 2.0**-7
    assert np.all(np.abs(g_ours[0] - 2 * np.tanh(U)) <= tol)


# ======================================================================================================
# weight_standardize
# ======================================================================================================


@given(
    shape=st.sampled_from([(2, 1), (3, 5), (64, 8), (4, 4, 3, 6), (3, 3, 16, 2), (1000, 3)]),
    log10_scale=st.floats(-2.0, 4.0),
    offset=st.floats(-1e3, 1e3),
    eps=st.sampled_from([1e-5, 1e-3, 0.0]),
    seed=st.integers(0, 2**31),
)
def test_weight_standardize_float64_equals_numpy_per_output_column(run_x64, shape, log10_scale, offset, eps, seed):
    rng = np.random.default_rng(seed)
    w = offset + 10.0**log10_scale * rng.standard_normal(shape)
    got = run_x64(numerics.weight_standardize, w, eps)
    assert got.shape == shape and got.dtype == np.float64
    # (w - mean) cancels: absolute error ~ eps_64 * |offset| / std.
    atol = 1e-13 * (1.0 + abs(offset) / 10.0**log10_scale)
    np.testing.assert_allclose(np.asarray(got), ref_standardize(w, eps), rtol=1e-9, atol=atol)
    if eps == 0.0:
        axes = tuple(range(len(shape) - 1))
        np.testing.assert_allclose(np.asarray(got).mean(axis=axes), 0.0, atol=1e-9)
        np.testing.assert_allclose(np.asarray(got).std(axis=axes), 1.0, rtol=1e-9)


@pytest.mark.parametrize("shape", [(5,), ()])
def test_weight_standardize_rejects_kernels_with_fewer_than_2_dims(shape):
    with pytest.raises(ValueError, match="2 dims"):
        numerics.weight_standardize(jnp.ones(shape))


def test_weight_standardize_float16_large_weights_naive_overflows_fix_is_exact():
    rng = np.random.default_rng(0)
    w = (3000.0 + 1000.0 * rng.standard_normal((4096, 8))).astype(np.float16)

    @jax.jit
    def naive(k):  # everything in float16
        m = jnp.mean(k, axis=0)
        v = jnp.mean(jnp.square(k - m), axis=0)
        return (k - m) / jnp.sqrt(v + 1e-5)

    out_naive = f64(naive(w))
    assert np.all(np.abs(out_naive.std(axis=0) - 1.0) > 0.5)  # (k - m)^2 overflows: var = inf, output ~0
    got = standardize_j(w)
    assert got.dtype == jnp.float16
    ref = ref_standardize(w)
    assert np.all(np.abs(f64(got) - ref) <= ulp16(ref))
    np.testing.assert_allclose(f64(got).std(axis=0), 1.0, atol=1e-3)
    np.testing.assert_allclose(f64(got).mean(axis=0), 0.0, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_weight_standardize_low_precision_conv_kernel_and_constant_columns(dtype):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 3, 32, 4)) * np.array([1e-2, 1.0, 100.0, 0.0]) + np.array([0, 5, -50, 7.0])
    w = jnp.asarray(w, dtype)
    got = standardize_j(w)
    assert got.dtype == jnp.dtype(dtype)
    ref = ref_standardize(w)
    # float16 / bfloat16: one ulp of the output (the float32 statistics are exact enough); float32: 2e-6 absolute
    # (the cancellation in w - mean, with |mean| / std up to 5 here).
    tol = ulp16(ref) if dtype == "float16" else ulp_bf16(ref) if dtype == "bfloat16" else 2e-6
    assert np.all(np.abs(f64(got) - ref) <= tol)
    np.testing.assert_array_equal(f64(got)[..., 3], 0.0)  # constant column: 0, not nan


# ======================================================================================================
# hypot
# ======================================================================================================

_moderate_f64 = st.one_of(st.just(0.0), st.floats(1e-150, 1e150), st.floats(-1e150, -1e-150))


@given(x=_moderate_f64, y=_moderate_f64)
def test_hypot_float64_equals_sqrt_of_sum_of_squares(run_x64, x, y):
    got = float(run_x64(hypot_j, np.float64(x), np.float64(y)))
    assert got == pytest.approx(math.sqrt(x * x + y * y), rel=1e-15, abs=0.0)
    assert got == float(run_x64(hypot_j, np.float64(-y), np.float64(x)))  # symmetric, sign-blind


@given(x=st.floats(-1e300, 1e300), y=st.floats(-1e300, 1e300))
def test_hypot_float64_does_not_overflow_where_the_result_is_finite(run_x64, x, y):
    assume(abs(x) >= 1e-290 or x == 0.0)
    assume(abs(y) >= 1e-290 or y == 0.0)
    got = float(run_x64(hypot_j, np.float64(x), np.float64(y)))
    assert got == pytest.approx(math.hypot(x, y), rel=1e-15, abs=0.0)


_NAIVE_HYPOT_CASES = [  # (x, y): squares overflow (> 65504) or underflow (< 2^-24) in float16
    (300.0, 400.0),
    (-3e4, 4e4),
    (60000.0, 1.0),
    (256.0, 256.0),
    (1e-4, 1e-4),
    (3e-5, 4e-5),
    (-2e-4, 0.0),
    (6e-8, 6e-8),
]


@pytest.mark.parametrize("x,y", _NAIVE_HYPOT_CASES)
def test_hypot_float16_naive_overflows_or_underflows_fix_is_accurate(x, y):
    xs, ys = np.array([x], np.float16), np.array([y], np.float16)
    ref = math.hypot(float(xs[0]), float(ys[0]))
    naive = float(naive_hypot_j(xs, ys)[0])
    assert not math.isfinite(naive) or abs(naive - ref) > 0.1 * ref
    got = float(hypot_j(xs, ys)[0])
    assert abs(got - ref) <= 2 * float(ulp16(ref))


def test_hypot_float16_diagonal_naive_fails_outside_sqrt_range_fix_within_2_ulp():
    x = ALL_F16[(ALL_F64 >= 0) & (ALL_F64 <= 46000.0)]  # hypot(x, x) = 1.414 x <= 65054
    ref = math.sqrt(2.0) * f64(x)
    got = f64(hypot_j(x, x))
    assert np.all(np.abs(got - ref) <= 2 * ulp16(ref))
    naive = f64(naive_hypot_j(x, x))
    assert np.all(np.isposinf(naive[f64(x) > 182.0]))  # 2 x^2 > 65504
    tiny = (f64(x) > 0) & (f64(x) < 1e-4)
    assert np.all(np.abs(naive - ref)[tiny] > 0.1 * ref[tiny])  # x^2 underflows


@given(xy=st.lists(st.tuples(fp16_floats(-F16_MAX, F16_MAX), fp16_floats(-F16_MAX, F16_MAX)), min_size=32, max_size=32))
def test_hypot_float16_within_2_5_ulp_of_float64(xy):
    """Bound: 2.5 float16 ulps of the result when it is normal; 1.5 x 2^-24 absolute when it is subnormal."""
    x = np.array([a for a, _ in xy], np.float16)
    y = np.array([b for _, b in xy], np.float16)
    ref = np.hypot(f64(x), f64(y))
    got = f64(hypot_j(x, y))
    rep = ref <= 65000.0  # rounding to 65504 vs inf is ambiguous in the last half ulp
    err = np.abs(got - ref)
    assert np.all(np.isfinite(got[rep]))
    assert np.all((err <= np.where(ref >= F16_TINY, 2.5 * ulp16(ref), 1.5 * F16_SUBNORMAL))[rep])


def _normal_f64(bound: float):
    """0 or a normal float64 in [-bound, bound] (XLA's CPU backend flushes float64 subnormals to zero)."""
    return st.one_of(st.just(0.0), st.floats(1e-300, bound), st.floats(-bound, -1e-300))


@given(x=_normal_f64(1e100), y=_normal_f64(1e100), dx=_normal_f64(10.0), dy=_normal_f64(10.0))
def test_hypot_float64_jvp_is_x_over_h_dx_plus_y_over_h_dy(run_x64, x, y, dx, dy):
    assume(math.hypot(x, y) > 1e-100)
    h, t = run_x64(jax.jvp, numerics.hypot, (np.float64(x), np.float64(y)), (np.float64(dx), np.float64(dy)))
    H = math.hypot(x, y)
    assert float(h) == pytest.approx(H, rel=1e-15)
    # abs: cancellation between the two products, and results below the normal range (flushed to zero).
    assert float(t) == pytest.approx(x / H * dx + y / H * dy, rel=1e-12, abs=1e-12 * (abs(dx) + abs(dy)) + 1e-290)
    gx, gy = run_x64(jax.grad(numerics.hypot, argnums=(0, 1)), np.float64(x), np.float64(y))
    assert float(gx) == pytest.approx(x / H, rel=1e-14, abs=1e-290)
    assert float(gy) == pytest.approx(y / H, rel=1e-14, abs=1e-290)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_hypot_gradient_at_the_origin_is_zero_not_nan(run_x64, dtype):
    def grads():
        z = jnp.zeros((3,), dtype)
        eager = jax.grad(numerics.hypot, argnums=(0, 1))(z[0], z[0])
        return [f64(g) for g in (*hypot_grad_j(z, z), *eager)]

    for g in run_x64(grads):
        np.testing.assert_array_equal(g, 0.0)
    # The naive form gives 0/0:
    assert np.all(np.isnan(f64(naive_hypot_grad_j(np.zeros(3, np.float32), np.zeros(3, np.float32))[0])))


def test_hypot_float16_gradient_finite_where_naive_is_not():
    x = np.array([300.0, 3e4, 1e-4, 3e-5, 0.0, -5e-3], np.float16)
    y = np.array([400.0, -4e4, 1e-4, -4e-5, 0.0, 12e-3], np.float16)
    h = np.hypot(f64(x), f64(y))
    safe = np.where(h > 0, h, 1.0)
    gx, gy = (f64(g) for g in hypot_grad_j(x, y))
    np.testing.assert_allclose(gx, f64(x) / safe, atol=2.0**-9)
    np.testing.assert_allclose(gy, f64(y) / safe, atol=2.0**-9)
    ngx, ngy = (f64(g) for g in naive_hypot_grad_j(x, y))
    bad = ~np.isfinite(ngx) | ~np.isfinite(ngy) | (np.abs(ngx - f64(x) / safe) > 0.1)
    assert bad[:5].all()  # overflow (grad 0 = x/inf), overflow, underflow (x/0), underflow, origin (0/0)


@given(xy=st.lists(st.tuples(fp16_floats(-3e4, 3e4), fp16_floats(-3e4, 3e4)), min_size=32, max_size=32))
def test_hypot_float16_gradient_within_2_ulp_of_x_over_h(xy):
    """Bound: |d hypot / dx - x / h| <= 2^-9 (2 float16 ulps of values in [0.5, 1)) wherever h is a normal
    float16; the gradient is finite everywhere."""
    x = np.array([a for a, _ in xy], np.float16)
    y = np.array([b for _, b in xy], np.float16)
    h = np.hypot(f64(x), f64(y))
    gx, gy = (f64(g) for g in hypot_grad_j(x, y))
    assert np.all(np.isfinite(gx)) and np.all(np.isfinite(gy))
    normal = h >= F16_TINY
    safe = np.where(h > 0, h, 1.0)
    assert np.all((np.abs(gx - f64(x) / safe) <= 2.0**-9)[normal])
    assert np.all((np.abs(gy - f64(y) / safe) <= 2.0**-9)[normal])


def test_hypot_float64_second_derivative_through_custom_jvp(x64):
    hess = jax.hessian(numerics.hypot, argnums=(0, 1))(3.0, 4.0)
    # d2h/dx2 = y^2/h^3, d2h/dxdy = -xy/h^3, d2h/dy2 = x^2/h^3 at h = 5
    np.testing.assert_allclose(
        np.array(hess, dtype=np.float64), [[16 / 125, -12 / 125], [-12 / 125, 9 / 125]], rtol=1e-14
    )


def test_hypot_bfloat16_spot_check():
    x = jnp.asarray([1e20, 3e30, 1e-25, 3.0], jnp.bfloat16)
    y = jnp.asarray([1e20, -4e30, 1e-25, 4.0], jnp.bfloat16)
    ref = np.hypot(f64(x), f64(y))
    got = f64(hypot_j(x, y))
    assert np.all(np.abs(got - ref) <= ulp_bf16(ref))
    naive = f64(naive_hypot_j(x, y))
    assert not np.isfinite(naive[:2]).any()  # squares overflow bfloat16 (max 3.4e38)
    assert abs(naive[2] - ref[2]) > 0.1 * ref[2]  # squares underflow (1e-50)


# ======================================================================================================
# dtypes
# ======================================================================================================


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_every_primitive_computes_and_returns_in_its_input_dtype(dtype):
    x = jnp.linspace(-3, 3, 6, dtype=dtype)
    outs = {
        "normal_log_prob": numerics.normal_log_prob(x, 0.5, 2.0),  # Python-scalar loc/scale do not promote
        "tanh_log_det_jacobian": numerics.tanh_log_det_jacobian(x),
        "weight_standardize": numerics.weight_standardize(x.reshape(3, 2)),
        "hypot": numerics.hypot(x, x[::-1]),
        "grad hypot": jax.grad(lambda a: jnp.sum(numerics.hypot(a, 1.0)))(x),
    }
    for name, out in outs.items():
        assert out.dtype == jnp.dtype(dtype), name
