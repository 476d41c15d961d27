"""Network outputs -> distributions: the SUBS token head (every process) and HMDLM's level head.

Both functions compute in float32 at least (float64 inputs stay float64), whatever the network's
compute dtype, because the losses are taken in float32 (docs/method.md §5).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from hmdlm_jax.processes.schedules import Schedule


def f32(x: jax.Array) -> jax.Array:
  """x in float32, or wider if it already is (float64 under x64)."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _token_logits(token_logits: jax.Array, per_position: jax.Array, mask_id: int) -> jax.Array:
  """Checks [B, L, V] logits against a [B, L] int array and mask_id; float32 (or wider) logits."""
  chex.assert_rank(token_logits, 3)
  chex.assert_rank(per_position, 2)
  chex.assert_equal_shape_prefix((token_logits, per_position), 2)
  vocab = token_logits.shape[-1]
  if not 0 <= mask_id < vocab:
    raise ValueError(f'mask_id={mask_id} is outside the vocabulary [0, {vocab}).')
  return f32(token_logits)


def token_log_probs(token_logits: jax.Array, xt: jax.Array, *, mask_id: int) -> jax.Array:
  """MDLM's SUBS parameterisation: log f [B, L, V].

  The MASK logit is set to -inf before the log-softmax (zero mass on MASK); revealed positions
  (xt != mask_id) copy their token: log f = 0 at xt and -inf elsewhere ("carry-over unmasking").
  Their distribution never enters a loss; it makes f directly usable by samplers.

  Args:
    token_logits: [B, L, V] raw logits (any float dtype).
    xt: [B, L] int current tokens.
    mask_id: the MASK token id.
  Returns:
    [B, L, V] log-probabilities in float32 (float64 if the logits are float64).
  """
  logits = _token_logits(token_logits, xt, mask_id)
  vocab = logits.shape[-1]
  is_mask_col = jnp.arange(vocab) == mask_id  # [V]
  logits = jnp.where(is_mask_col, -jnp.inf, logits)
  logp = jax.nn.log_softmax(logits, axis=-1)
  copy = jnp.where(jnp.arange(vocab) == xt[..., None], 0.0, -jnp.inf).astype(logp.dtype)
  return jnp.where((xt != mask_id)[..., None], copy, logp)


def token_nll(token_logits: jax.Array, tokens: jax.Array, *, mask_id: int) -> jax.Array:
  """-log f[x0] under SUBS at masked positions, fused: [B, L, V] logits, [B, L] tokens -> [B, L].

  Equals `-take(token_log_probs(logits, xt), tokens)` wherever xt is MASK (the only positions a
  loss reads; there the gold token is never MASK): logsumexp over the non-MASK columns minus the
  gold logit. It never builds the [B, L, V] log-softmax nor the carry-over tensor, and removes
  the MASK column with an additive [V] bias (0 / -inf) whose gradient is the identity, so the
  backward pass has no [B, L, V] select either (a faster step at the text vocabulary,
  docs/method.md §4.3). Values at revealed positions are meaningless; callers mask them.
  """
  logits = _token_logits(token_logits, tokens, mask_id)
  vocab = logits.shape[-1]
  mask_bias = jnp.where(jnp.arange(vocab) == mask_id, -jnp.inf, 0.0).astype(logits.dtype)
  lse = jax.nn.logsumexp(logits + mask_bias, axis=-1)
  gold = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
  return lse - gold


def level_log_probs(hier_logits: jax.Array, t: jax.Array, schedule: Schedule, *,
                    prior_corrected: bool) -> jax.Array:
  """Pass-1 hierarchy distribution log g [B, L, K] float32 (docs/method.md §4).

  prior_corrected: ``log g = log_softmax(logits + log(1 - α_k(t)))`` — the Bayes factor that a
  level-k position is masked at all at time t; -inf for levels with α_k(t) = 1. Where every level
  has α_k(t) = 1 (then no position can be masked, so g is never used) the plain log-softmax is
  returned instead of NaN. Otherwise ``log g = log_softmax(logits)``. For K = 1, zeros [B, L, 1].
  """
  chex.assert_rank(hier_logits, 3)
  chex.assert_rank(t, 1)
  chex.assert_equal_shape_prefix((hier_logits, t), 1)
  big_k = schedule.num_levels
  chex.assert_axis_dimension(hier_logits, 2, big_k)
  logits = f32(hier_logits)
  if big_k == 1:
    return jnp.zeros_like(logits)
  if not prior_corrected:
    return jax.nn.log_softmax(logits, axis=-1)
  om = schedule.one_minus_alpha(t.astype(logits.dtype))  # [B, K]
  log_om = jnp.where(om > 0, jnp.log(jnp.where(om > 0, om, 1.0)), -jnp.inf)  # [B, K]
  # No active level at all: a zero correction (all -inf would make NaN gradients behind a where).
  any_active = jnp.any(om > 0, axis=-1, keepdims=True)  # [B, 1]
  log_om = jnp.where(any_active, log_om, 0.0)
  return jax.nn.log_softmax(logits + log_om[:, None, :], axis=-1)
