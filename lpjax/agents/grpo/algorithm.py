"""GRPO with a rollout-mismatch correction (token-level TIS by default, or sequence-level MIS, or geometric-mean
rejection), as small pure functions of log-probabilities.

Nothing here knows the model: a learner computes per-token log-probabilities (:func:`sequence_logprobs` turns
logits into them) and passes them with the rewards, so the same maths serves any policy network.

Shapes and conventions (``B`` sequences, ``T`` token positions, ``B = num_prompts * G``):

* the ``G`` responses to one prompt are **contiguous** rows: sequences ``[g*G, (g+1)*G)`` form group ``g``;
* a per-token array ``x[b, t]`` refers to ``tokens[b, t]`` (see :func:`sequence_logprobs`), and ``mask[b, t]``
  is nonzero exactly for the response tokens that enter the loss (not prompt, not padding);
* three log-probabilities of each sampled token are involved:

  - ``logp_rollout``: under the rollout (inference) engine that sampled it, e.g. fp8 W8A8 or an fp8 KV cache;
  - ``logp_old``: under the training engine with the parameters *before* this update (no gradient);
  - ``logp_new``: under the training engine with the parameters being optimised (the gradient flows here).

  Without a precision mismatch ``logp_rollout == logp_old``; at the first minibatch ``logp_new == logp_old``.
  ``logp_old`` is stopped inside :func:`grpo_loss`, so a single on-policy update may pass ``logp_new`` itself
  as ``logp_old`` (one training forward pass instead of two).

The objective (token-mean over the ``N = sum(mask)`` response tokens of the whole batch, DAPO-style)::

    r_t   = exp(logp_new_t - logp_old_t)                          PPO ratio
    w_t   = sg(min(exp(logp_old_t - logp_rollout_t), C))          TIS weight, C = 2 (FP8-RL, token level)
    pg_t  = -w_t * min(r_t A_b, clip(r_t, 1 - eps_low, 1 + eps_high) A_b)
    kl_t  = exp(logp_ref_t - logp_new_t) - (logp_ref_t - logp_new_t) - 1       (k3, only if beta > 0)
    loss  = (1 / N) sum_{b,t} mask_bt (pg_t + beta kl_t)

with ``A_b`` the group-normalised advantage of sequence ``b`` (:func:`group_advantages`) and ``sg`` the stop
gradient. So ``d loss / d logp_new_t = -w_t r_t A_b / N`` for a token PPO does not clip and ``0`` for one it
clips (``r_t A_b`` beyond the clipped value).

``w_t`` is the chosen rollout correction (:data:`ROLLOUT_CORRECTIONS`): the TIS weight above (the default), ``1``
(none), the sequence-level masked importance weight of :func:`mis_weights`, or the 0/1 acceptance of
:func:`geometric_rejection_weights`; a rejected token (``w_t = 0``) still counts in ``N``.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

MAX_LOG_RATIO = 20.0
"""Log-ratios are clipped to ``[-20, 20]`` before ``exp`` (``e^20 ~ 4.9e8``), so no ratio is ``inf`` in float32
(``exp`` overflows above ~88.7); a token that far off-policy is clipped by PPO (or by TIS) anyway."""

CLIP_HIGHER_EPS = 0.28
"""DAPO's clip-higher upper clip range ``eps_high`` (with ``eps_low = 0.2``)."""

ROLLOUT_CORRECTIONS = ("none", "tis", "mis", "geo_reject")
"""The rollout-mismatch corrections :func:`grpo_loss` applies: none, token-level truncated IS (:func:`tis_weights`),
sequence-level masked IS (:func:`mis_weights`) and geometric-mean rejection with a veto
(:func:`geometric_rejection_weights`)."""

LOSS_NORMALIZATIONS = ("all_tokens", "kept_tokens")
"""The token counts :func:`grpo_loss` may average over: every response token (lpjax's default: a rejected token
counts with weight 0), or only the tokens the correction keeps (verl's rollout correction, which removes the
rejected tokens from the response mask)."""

ADVANTAGE_EPS = 1e-6
"""``eps`` of ``(r - mean) / (std + eps)``: as in DeepSeekMath's GRPO (docs/design.md, "GRPO objective")."""


def sequence_logprobs(logits: chex.Array, tokens: chex.Array, *, temperature: float = 1.0) -> chex.Array:
    """Log-probability of every token given its prefix, aligned with ``tokens``: ``(B, T, V), (B, T) -> (B, T)``.

    Shift convention: the logits at position ``t`` predict the token at position ``t + 1`` (a causal LM run on
    ``tokens``), so::

        out[b, t] = log_softmax(logits[b, t - 1] / temperature)[tokens[b, t]]    for t >= 1
        out[b, 0] = 0                                                            (nothing predicts token 0)

    The output is aligned with ``tokens``, so the response mask over ``tokens`` applies to it as it is (token 0
    is always part of the prompt, so its placeholder never enters a loss). The last position's logits predict
    beyond the sequence and are unused.

    Computed in float32 whatever the logits' dtype (``log_softmax`` of bf16 logits would round the log-probs to
    ~3 significant digits, larger than the mismatch TIS corrects). ``temperature`` must be the rollout's
    sampling temperature, so that training and rollout log-probs describe the same distribution.
    """
    chex.assert_rank(logits, 3)
    chex.assert_rank(tokens, 2)
    chex.assert_equal_shape_prefix([logits, tokens], 2)
    logits = logits[:, :-1].astype(jnp.float32)
    if temperature != 1.0:
        logits = logits / temperature
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))


def group_advantages(rewards: chex.Array, group_size: int, *, eps: float = ADVANTAGE_EPS) -> chex.Array:
    """GRPO advantages: each reward normalised within its group of ``group_size`` responses to one prompt.

    ``rewards`` is flat ``(N,)`` with ``N = num_prompts * group_size`` and each group contiguous. Per group ``g``::

        A_i = (r_i - mean_g) / (std_g + eps),   std_g = sqrt(mean_g((r - mean_g)^2))

    with the *population* standard deviation (``ddof = 0``, as DeepSeekMath; docs/design.md): a group of two
    rewards ``{0, 1}`` gives ``{-1, +1}`` (up to ``eps``). A group whose rewards are all equal carries no
    learning signal and gets advantages of exactly ``0`` (not merely ``~0``: the float mean of equal values
    may differ from them by an ulp, which ``/ (std + eps)`` would blow up to ~1e-3), never NaN.

    Returns float32 ``(N,)``. Raises ``ValueError`` if ``rewards`` is not 1-D, ``group_size < 1`` or ``N`` is
    not a multiple of ``group_size`` (shapes are static, so this is checked at trace time).
    """
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}.")
    if jnp.ndim(rewards) != 1:
        raise ValueError(f"rewards must be flat (N,) with groups contiguous, got shape {jnp.shape(rewards)}.")
    n = jnp.shape(rewards)[0]
    if n % group_size:
        raise ValueError(f"The number of rewards ({n}) is not a multiple of group_size ({group_size}).")
    grouped = jnp.asarray(rewards, jnp.float32).reshape(n // group_size, group_size)
    mean = jnp.mean(grouped, axis=1, keepdims=True)
    std = jnp.std(grouped, axis=1, keepdims=True)
    constant = jnp.max(grouped, axis=1, keepdims=True) == jnp.min(grouped, axis=1, keepdims=True)
    centred = jnp.where(constant, 0.0, grouped - mean)
    return (centred / (std + eps)).reshape(n)


def tis_weights(logp_train: chex.Array, logp_rollout: chex.Array, cap: float = 2.0) -> chex.Array:
    """Token-level truncated importance-sampling weights ``w = sg(min(exp(logp_train - logp_rollout), cap))``.

    Reweights each token sampled by the rollout engine (``pi_rollout``, e.g. fp8) towards the training engine's
    policy (``pi_train``): ``E_{pi_rollout}[w f] ~ E_{pi_train}[f]``, with the ratio truncated at ``cap``
    (FP8-RL: C = 2) to bound the variance that rare tokens would add. Example: ``p_rollout = [0.20, 0.05, 0.01]``,
    ``p_train = [0.22, 0.04, 0.03]`` give ratios ``[1.1, 0.8, 3.0]`` and weights ``[1.1, 0.8, 2.0]``.

    The weights are constants of the loss (``jax.lax.stop_gradient``): they correct *which* distribution the
    samples come from; the gradient flows through the PPO ratio only.

    The exponent is computed as ``exp(min(logp_train - logp_rollout, log(cap)))``, equal to
    ``min(exp(.), cap)`` but never ``inf`` (a token the rollout gave probability ~0 would overflow ``exp``).
    Inputs are cast to float32; they must be finite (``-inf - -inf`` is NaN: mask padding before, as
    :func:`grpo_loss` does).
    """
    if isinstance(cap, (int, float)) and not cap > 0:
        raise ValueError(f"The TIS cap must be > 0, got {cap}.")
    log_ratio = jnp.asarray(logp_train, jnp.float32) - jnp.asarray(logp_rollout, jnp.float32)
    return jax.lax.stop_gradient(jnp.exp(jnp.minimum(log_ratio, jnp.log(jnp.float32(cap)))))


def _masked_log_ratio(logp_train: chex.Array, logp_rollout: chex.Array, mask: chex.Array):
    """``(valid, d)``: ``valid = mask != 0`` and ``d = logp_train - logp_rollout`` in float32 on valid tokens, 0
    elsewhere (padding's ``-inf`` or garbage gives no NaN)."""
    valid = jnp.asarray(mask) != 0
    train = jnp.broadcast_to(jnp.asarray(logp_train, jnp.float32), valid.shape)
    rollout = jnp.broadcast_to(jnp.asarray(logp_rollout, jnp.float32), valid.shape)
    return valid, jnp.where(valid, train, 0.0) - jnp.where(valid, rollout, 0.0)


def mis_weights(logp_train: chex.Array, logp_rollout: chex.Array, mask: chex.Array, cap: float = 2.0) -> chex.Array:
    """Sequence-level masked importance-sampling (MIS) weights: ``(B, T), (B, T), (B, T) -> (B, T)`` float32.

    Per sequence ``b`` the importance ratio of the whole response, over its valid tokens (``mask != 0``)::

        log rho_b = sum_t mask_bt (logp_train_bt - logp_rollout_bt)
        w_b       = rho_b   if rho_b <= cap
                    0       if rho_b >  cap        (masked out, not truncated)

    and ``w_bt = sg(w_b)`` on every valid token of the sequence, ``0`` on padding. ``rho_b`` is the exact
    likelihood ratio of the sampled response, so ``E_{pi_rollout}[rho f] = E_{pi_train}[f]`` without the bias of
    a per-token correction; dropping the rare sequences with ``rho_b > cap`` (rather than truncating them to
    ``cap``) bounds the variance and discards the responses the two engines disagree on most. Example with
    ``cap = 2``: token ratios ``[1.1, 0.8]`` (plus a padding token) give ``rho = 0.88`` and weights
    ``[0.88, 0.88, 0]``; token ratios ``[1.5, 1.6]`` give ``rho = 2.4 > 2`` and weights ``[0, 0]`` (TIS would
    give ``[1.5, 1.6]``, a truncated sequence ratio ``[2, 2]``).

    Computed in float32 in log space: ``log rho_b`` is compared with ``log(cap)`` and only a kept ``rho_b <= cap``
    is exponentiated, so a long sequence never overflows. A row without valid tokens has ``rho = 1`` and all
    weights 0 (no token to weight). A NaN ratio masks its sequence. The weights are constants
    (``jax.lax.stop_gradient``). Inputs must be finite on valid tokens; ``cap`` must be > 0.
    """
    return _mis(logp_train, logp_rollout, mask, cap)[0]


def _mis(logp_train, logp_rollout, mask, cap) -> tuple[chex.Array, chex.Array]:
    """:func:`mis_weights` and the tokens it keeps (valid tokens of sequences with ``rho_b <= cap``, whatever their
    weight: a kept ``rho_b`` may underflow float32 to a weight of 0)."""
    if isinstance(cap, (int, float)) and not cap > 0:
        raise ValueError(f"The MIS cap must be > 0, got {cap}.")
    valid, d = _masked_log_ratio(logp_train, logp_rollout, mask)
    log_rho = jnp.sum(d, axis=-1, keepdims=True)
    log_cap = jnp.log(jnp.float32(cap))
    kept = valid & (log_rho <= log_cap)  # False for NaN
    rho = jnp.exp(jnp.minimum(log_rho, log_cap))
    return jax.lax.stop_gradient(jnp.where(kept, rho, 0.0)), kept


def geometric_rejection_weights(
    logp_train: chex.Array,
    logp_rollout: chex.Array,
    mask: chex.Array,
    threshold: float = 1.5,
    veto_threshold: float = 1e-4,
) -> chex.Array:
    """Geometric-mean rejection with a per-token veto: 0/1 weights ``(B, T), (B, T), (B, T) -> (B, T)`` float32.

    Per sequence ``b``, with ``n_b = sum_t mask_bt`` valid tokens and ``d_bt = logp_train_bt - logp_rollout_bt``::

        g_b = exp((1 / n_b) sum_t mask_bt d_bt)                  geometric mean of the token ratios
        reject b  if  g_b < 1 / threshold  or  g_b > threshold   (|log g_b| > log threshold)
                  or  some valid t has exp(d_bt) < veto_threshold
        w_bt = 0 if b is rejected, else 1                        (and 0 on padding)

    The geometric mean is a per-token average of the mismatch, so its band does not widen with the response's
    length as the product ratio of :func:`mis_weights` does; accepted sequences are used as sampled, unweighted.
    The veto catches a single token the training engine finds far less likely than the rollout engine did,
    which the mean of a long sequence would dilute. ``veto_threshold = 0`` disables the veto. Example with
    ``threshold = 1.5``, ``veto_threshold = 1e-4``: token ratios ``[1.2, 0.9, 1.1]`` give ``g = 1.188^(1/3) =
    1.059`` (kept, weights ``[1, 1, 1]``); ``[2, 2, 1]`` give ``g = 4^(1/3) = 1.587 > 1.5`` (rejected);
    ``[1e-5, 300, 400]`` give ``g = 1.2^(1/3) = 1.063`` inside the band but are vetoed by ``1e-5 < 1e-4``
    (rejected).

    Computed in float32 in log space (``log g_b`` against ``log threshold``, each ``d_bt`` against
    ``log veto_threshold``), so nothing overflows. A row without valid tokens has mean ``0`` (``g = 1``, not
    NaN) and all weights 0 (no token to weight). A NaN ratio rejects its sequence. The weights are constants
    (``jax.lax.stop_gradient``). Inputs must be finite on valid tokens; ``threshold`` must be > 1 and
    ``veto_threshold`` in ``[0, 1)``.
    """
    return _geometric_rejection(logp_train, logp_rollout, mask, threshold, veto_threshold)[0]


def _geometric_rejection(logp_train, logp_rollout, mask, threshold, veto_threshold) -> tuple[chex.Array, chex.Array]:
    """:func:`geometric_rejection_weights` and the tokens it keeps (where the weight is 1)."""
    if isinstance(threshold, (int, float)) and not threshold > 1:
        raise ValueError(f"The geometric rejection threshold must be > 1, got {threshold}.")
    if isinstance(veto_threshold, (int, float)) and not 0 <= veto_threshold < 1:
        raise ValueError(f"The veto threshold must be in [0, 1), got {veto_threshold}.")
    valid, d = _masked_log_ratio(logp_train, logp_rollout, mask)
    n = jnp.sum(valid, axis=-1, keepdims=True, dtype=jnp.float32)
    log_g = jnp.sum(d, axis=-1, keepdims=True) / jnp.maximum(n, 1.0)
    in_band = jnp.abs(log_g) <= jnp.log(jnp.float32(threshold))  # False for NaN
    vetoed = jnp.any(valid & ~(d >= jnp.log(jnp.float32(veto_threshold))), axis=-1, keepdims=True)
    accept = valid & in_band & ~vetoed
    return jax.lax.stop_gradient(accept.astype(jnp.float32)), accept


def _correction(
    correction: str, mismatch: chex.Array, valid: chex.Array, tis_cap, mis_cap, geo_threshold, geo_veto
) -> tuple[chex.Array, chex.Array]:
    """``(w, kept)`` of a rollout correction on the per-token ``mismatch = logp_old - logp_rollout`` (0 off
    ``valid``): the detached weights and the valid tokens the correction keeps (all of them, but for MIS and the
    geometric rejection)."""
    if correction == "none":
        return jnp.ones_like(mismatch), valid
    if correction == "tis":
        return tis_weights(mismatch, 0.0, tis_cap), valid
    if correction == "mis":
        return _mis(mismatch, 0.0, valid, mis_cap)
    return _geometric_rejection(mismatch, 0.0, valid, geo_threshold, geo_veto)


def _k3(log_ratio: chex.Array) -> chex.Array:
    """``exp(x) - x - 1 >= 0``; with ``x = log(q/p)`` of a sample of ``p``, an unbiased estimate of KL(p || q)."""
    x = jnp.clip(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO)
    return jnp.expm1(x) - x


def grpo_loss(
    logp_new: chex.Array,
    logp_old: chex.Array,
    logp_rollout: chex.Array | None,
    advantages: chex.Array,
    mask: chex.Array,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    correction: str = "tis",
    tis_cap: float = 2.0,
    beta: float = 0.0,
    logp_ref: chex.Array | None = None,
    mis_cap: float = 2.0,
    geo_threshold: float = 1.5,
    geo_veto: float = 1e-4,
    loss_normalization: str = "all_tokens",
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """GRPO's clipped surrogate with a rollout-mismatch correction and an optional KL penalty, averaged over
    response tokens.

    Per token (``b`` the sequence, ``t`` the position; see the module docstring)::

        r_t  = exp(logp_new - logp_old)
        w_t  = correction weight of (logp_old, logp_rollout)    detached, see below
        pg_t = -w_t min(r_t A_b, clip(r_t, 1 - eps_low, 1 + eps_high) A_b)
        kl_t = exp(logp_ref - logp_new) - (logp_ref - logp_new) - 1
        loss = sum(m (pg + beta kl)) / max(sum(m), 1)

    with ``m`` the response tokens (``mask``), or with ``loss_normalization="kept_tokens"`` the response tokens the
    correction keeps (verl's convention, see below).

    * ``correction`` (:data:`ROLLOUT_CORRECTIONS`) chooses ``w_t``:

      - ``"none"``: ``w_t = 1`` (plain GRPO);
      - ``"tis"``: ``w_t = min(exp(logp_old_t - logp_rollout_t), tis_cap)`` (:func:`tis_weights`);
      - ``"mis"``: the sequence ratio ``rho_b = exp(sum_t mask (logp_old - logp_rollout))`` on every token of
        sequence ``b``, or 0 if ``rho_b > mis_cap`` (:func:`mis_weights`);
      - ``"geo_reject"``: 1, or 0 for a sequence whose geometric-mean ratio is outside
        ``[1 / geo_threshold, geo_threshold]`` or that holds a token with ratio ``< geo_veto``
        (:func:`geometric_rejection_weights`).
    * ``loss_normalization`` (:data:`LOSS_NORMALIZATIONS`) decides what a token rejected by MIS or the geometric
      rejection counts for. ``"all_tokens"`` (the default): it contributes nothing but still counts in the token
      mean's ``N``, as any weight does, so the loss's scale does not depend on how much was rejected.
      ``"kept_tokens"``: it leaves the token mean altogether, ``N`` counts the kept tokens and the KL penalty skips
      it too, as verl's rollout correction does by removing rejected tokens from the response mask; the loss is
      then ``1 / kept fraction`` times the ``"all_tokens"`` loss (without KL). TIS and no correction reject
      nothing, so both normalizations agree there.
    * Every correction uses ``logp_old`` as the training policy (verl's rollout correction): the weight corrects
      the rollout-vs-training *engine* mismatch of the sampled data and stays fixed over the PPO epochs, while
      ``r_t`` handles the policy's own change since the rollout. It multiplies the policy-gradient term only;
      the KL penalty is a regulariser towards the reference, not an expectation under the training policy.
    * ``eps_high > eps_low`` is DAPO's clip-higher (0.28 vs 0.2): low-probability tokens with positive
      advantage can grow more before the clip stops their gradient.
    * KL uses Schulman's k3 estimator of KL(pi_new || pi_ref) (non-negative, unbiased on samples of pi_new,
      zero with zero gradient when ``logp_ref == logp_new``), as DeepSeekMath's GRPO. It needs ``logp_ref``
      when ``beta != 0`` (a ``ValueError`` if ``beta`` is a nonzero Python number; a traced ``beta`` without
      ``logp_ref`` has no term to scale); with ``beta = 0`` a given ``logp_ref`` is only reported (``ref_kl``).
    * Token-mean over every unmasked token of the batch (DAPO): each token counts equally, so long responses
      are not down-weighted as by a per-sequence mean.

    Args:
      logp_new: ``(B, T)`` log-probs under the parameters being optimised (differentiated).
      logp_old: ``(B, T)`` log-probs under the training engine before this update (treated as constants).
      logp_rollout: ``(B, T)`` log-probs under the rollout engine, or ``None`` (no mismatch: ``logp_old``).
      advantages: ``(B,)`` per sequence (broadcast to its tokens) or ``(B, T)`` per token.
      mask: ``(B, T)``, nonzero for response tokens. Masked positions may hold anything finite or ``-inf``.
      eps_low, eps_high: PPO clip range ``[1 - eps_low, 1 + eps_high]`` of ``r_t``.
      correction: one of :data:`ROLLOUT_CORRECTIONS` (default ``"tis"``).
      tis_cap: the TIS truncation ``C`` (> 0) of ``"tis"``.
      beta: KL coefficient (>= 0).
      logp_ref: ``(B, T)`` log-probs under the reference policy, or ``None``.
      mis_cap: the MIS sequence-ratio cap (> 0) of ``"mis"``.
      geo_threshold, geo_veto: the geometric-mean band (> 1) and the per-token veto ratio (in ``[0, 1)``; 0: no
        veto) of ``"geo_reject"``.

    Returns:
      ``(loss, metrics)``; metrics are float32 scalars, token means over unmasked tokens (0 with no tokens):

      * ``pg_loss``, ``ref_kl`` (k3 to the reference, 0 without ``logp_ref``), ``ppo_clip_frac`` (tokens whose
        gradient the PPO clip stops), ``ratio_mean`` (of ``r_t``), each over the tokens the loss averages;
        ``num_tokens`` (response tokens) and ``loss_tokens`` (the tokens the loss averages over);
      * ``tis_weight_mean/min/max`` (the TIS weights: all 1 with another correction or none) and
        ``tis_clip_frac`` (tokens with ``exp(logp_old - logp_rollout) > tis_cap``; 0 without TIS);
      * ``correction/weight_mean`` (the weights ``w_t`` applied, whichever the correction) and
        ``correction/rejected_fraction`` (the response tokens MIS or the geometric rejection drop: a kept token
        whose MIS weight underflows float32 to 0 is not rejected), both over every response token;
      * ``mismatch_kl``: KL(pi_rollout || pi_train) per token by the k3 estimator ``rho - 1 - log rho``,
        ``rho = exp(logp_old - logp_rollout)``. The tokens are samples of pi_rollout and only their own
        log-probs are known, so this direction is the one with an unbiased Monte-Carlo estimate
        (``E_rollout[rho] = 1``); k3 is >= 0 per token and, for close policies, of far lower variance than k1;
        ``mismatch_kl_k1`` is the plain ``mean(logp_rollout - logp_old)`` (unbiased, may be negative).
        ``pi_train`` is the pre-update training policy, as for TIS.
    """
    _check_loss_arguments(tis_cap, beta, logp_ref, correction, loss_normalization)
    chex.assert_equal_shape([logp_new, logp_old, mask])
    if logp_rollout is None:
        logp_rollout = logp_old
    chex.assert_equal_shape([logp_new, logp_rollout])
    if logp_ref is not None:
        chex.assert_equal_shape([logp_new, logp_ref])
    advantages = _per_token(advantages, logp_new.shape)
    valid = jnp.asarray(mask) != 0

    def log_ratio(a, b):  # a - b on valid tokens, 0 elsewhere: padding's -inf gives neither NaN nor NaN grads
        a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
        return jnp.where(valid, a, 0.0) - jnp.where(valid, b, 0.0)

    logp_old = jax.lax.stop_gradient(logp_old)
    ratio = jnp.exp(jnp.clip(log_ratio(logp_new, logp_old), -MAX_LOG_RATIO, MAX_LOG_RATIO))
    mismatch = jax.lax.stop_gradient(log_ratio(logp_old, logp_rollout))  # log(pi_train / pi_rollout)
    weights, kept = _correction(correction, mismatch, valid, tis_cap, mis_cap, geo_threshold, geo_veto)
    num_tokens, masked_mean = _token_mean(valid)
    loss_tokens, loss_mean = _token_mean(kept if loss_normalization == "kept_tokens" else valid)

    unclipped_obj = ratio * advantages
    clipped_obj = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    pg_loss = loss_mean(-weights * jnp.minimum(unclipped_obj, clipped_obj))
    if logp_ref is None:
        ref_kl = jnp.zeros((), jnp.float32)
        loss = pg_loss
    else:
        ref_kl = loss_mean(_k3(log_ratio(logp_ref, logp_new)))
        loss = pg_loss + beta * ref_kl

    metrics = {
        "pg_loss": pg_loss,
        "ref_kl": ref_kl,
        "ppo_clip_frac": loss_mean((clipped_obj < unclipped_obj).astype(jnp.float32)),
        "ratio_mean": loss_mean(ratio),
        "num_tokens": num_tokens,
        "loss_tokens": loss_tokens,
        **_mismatch_metrics(correction, weights, kept, mismatch, valid, tis_cap, masked_mean),
    }
    return loss, jax.tree.map(lambda m: jax.lax.stop_gradient(jnp.asarray(m, jnp.float32)), metrics)


def _check_loss_arguments(tis_cap, beta, logp_ref, correction: str, loss_normalization: str) -> None:
    """:func:`grpo_loss`'s argument errors (concrete values only: a traced ``beta`` or cap is not checked)."""
    if logp_ref is None and isinstance(beta, (int, float)) and beta != 0:
        raise ValueError("grpo_loss: beta != 0 needs logp_ref (the reference policy's log-probs).")
    if correction not in ROLLOUT_CORRECTIONS:
        raise ValueError(f"grpo_loss: correction must be one of {ROLLOUT_CORRECTIONS}, got {correction!r}.")
    if correction == "tis" and isinstance(tis_cap, (int, float)) and not tis_cap > 0:
        raise ValueError(f"grpo_loss: tis_cap must be > 0, got {tis_cap}.")
    if loss_normalization not in LOSS_NORMALIZATIONS:
        raise ValueError(
            f"grpo_loss: loss_normalization must be one of {LOSS_NORMALIZATIONS}, got {loss_normalization!r}."
        )


def _per_token(advantages: chex.Array, shape: tuple[int, ...]) -> chex.Array:
    """Advantages ``(B,)`` per sequence or ``(B, T)`` per token, as float32 ``(B, T)``."""
    advantages = jnp.asarray(advantages, jnp.float32)
    if advantages.ndim == 1:
        chex.assert_axis_dimension(advantages, 0, shape[0])
        advantages = advantages[:, None]
    else:
        chex.assert_shape(advantages, shape)
    return jnp.broadcast_to(advantages, shape)


def _token_mean(over: chex.Array):
    """``(count, mean)``: the number of tokens ``over`` selects and the float32 mean over them of a ``(B, T)``
    array (0 when there are none)."""
    count = jnp.sum(over, dtype=jnp.float32)
    return count, lambda x: jnp.sum(jnp.where(over, x, 0.0)) / jnp.maximum(count, 1.0)


def _mismatch_metrics(correction, weights, kept, mismatch, valid, tis_cap, masked_mean) -> dict[str, chex.Array]:
    """The rollout correction's and the engine mismatch's metrics of :func:`grpo_loss`, over every response
    token."""
    tis = correction == "tis"
    tis_w = weights if tis else jnp.ones_like(weights)
    tis_clipped = mismatch > jnp.log(jnp.float32(tis_cap)) if tis else jnp.zeros_like(valid)
    any_token = jnp.any(valid)

    def extreme(x, reduce, fill):
        return jnp.where(any_token, reduce(jnp.where(valid, x, fill)), 0.0)

    return {
        "tis_weight_mean": masked_mean(tis_w),
        "tis_weight_min": extreme(tis_w, jnp.min, jnp.inf),
        "tis_weight_max": extreme(tis_w, jnp.max, -jnp.inf),
        "tis_clip_frac": masked_mean(tis_clipped.astype(jnp.float32)),
        "correction/weight_mean": masked_mean(weights),
        "correction/rejected_fraction": masked_mean((valid & ~kept).astype(jnp.float32)),
        "mismatch_kl": masked_mean(_k3(mismatch)),
        "mismatch_kl_k1": masked_mean(-mismatch),
    }
