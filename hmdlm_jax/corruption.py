"""Forward corruption for training (SPEC 3; paper eq. 5-6, Algorithm 1 lines 4-21).

A position is either revealed ``(x0, h0)`` or masked ``(MASK, h_m)`` with ``h_m = K``: one shared
Bernoulli per position decides both (eq. 5). Given positions (clues, prompts) are never masked.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from hmdlm_jax.schedules import Schedule


def sample_times(key: jax.Array, batch_size: int, *, t_min: float = 1e-3,
                 antithetic: bool = True) -> jax.Array:
  """t ~ U(t_min, 1) per example: [B] float32 (SPEC 3).

  antithetic=True is MDLM's low-discrepancy (stratified) sampler: example i draws u_i ~ U(0, 1)
  inside its own stratum, ``v_i = (i + u_i) / B``, so the batch holds exactly one time per stratum
  of width 1/B. The batch mean of any f(t) stays unbiased for E_t f(t), with lower variance than
  i.i.d. draws (t_i itself is uniform on its stratum only). Then ``t = t_min + (1 - t_min) v``.

  Returns:
    t [B] float32.
  """
  if not 0.0 <= t_min < 1.0:
    raise ValueError(f'loss.t_min={t_min} must lie in [0, 1).')
  u = jax.random.uniform(key, (batch_size,), jnp.float32)
  if antithetic:
    u = (jnp.arange(batch_size, dtype=jnp.float32) + u) / batch_size
    u = jnp.minimum(u, 1.0)  # guards (B-1+u)/B rounding up to 1 in float32 (t <= 1 anyway)
  return t_min + (1.0 - t_min) * u


def _per_position(table: jax.Array, levels: jax.Array) -> jax.Array:
  """table [B, K] indexed by levels [B, L] -> [B, L]."""
  return jnp.take_along_axis(table, levels, axis=1)


def corrupt(key: jax.Array, tokens: jax.Array, levels: jax.Array, given: jax.Array,
            t: jax.Array, schedule: Schedule, *, mask_id: int
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Samples s_t ~ q(s_t | s_0) (eq. 6, Algorithm 1 lines 6-9).

  Args:
    key: PRNG key.
    tokens: [B, L] int clean tokens x0.
    levels: [B, L] int gold levels h0 in 0..K-1.
    given: [B, L] bool, never masked.
    t: [B] times.
    schedule: K-level schedule.
    mask_id: MASK token id.
  Returns:
    xt [B, L] (MASK where masked), ht [B, L] (K where masked), masked [B, L] bool.
  """
  chex.assert_rank((tokens, levels, given), 2)
  chex.assert_equal_shape((tokens, levels, given))
  chex.assert_rank(t, 1)
  chex.assert_equal_shape_prefix((tokens, t), 1)
  chex.assert_type((tokens, levels), int)
  p_mask = _per_position(schedule.one_minus_alpha(t), levels)  # [B, L]: 1 - α_{h0}(t)
  u = jax.random.uniform(key, tokens.shape, p_mask.dtype)
  masked = (u < p_mask) & ~given.astype(bool)  # ONE Bernoulli for token and level (eq. 5)
  xt = jnp.where(masked, jnp.asarray(mask_id, tokens.dtype), tokens)
  ht = jnp.where(masked, jnp.asarray(schedule.num_levels, levels.dtype), levels)
  return xt, ht, masked


def reveal_levels(key: jax.Array, levels: jax.Array, ht: jax.Array, masked: jax.Array,
                  t: jax.Array, schedule: Schedule, *, step: float) -> jax.Array:
  """Pass-2 level context of Algorithm 1 (lines 15-21).

  s = max(t - step, 0); each masked position joins the reveal set R with probability
  λ_{h0}(s, t); h_s = h0 on R and h_t elsewhere (h_m at the other masked positions, the gold level
  at revealed ones).

  Args:
    key: PRNG key.
    levels: [B, L] gold levels h0.
    ht: [B, L] corrupted levels (K where masked).
    masked: [B, L] bool.
    t: [B] times.
    step: 1 / T_train.
  Returns:
    hs [B, L] int.
  """
  chex.assert_equal_shape((levels, ht, masked))
  chex.assert_rank(t, 1)
  s = jnp.maximum(t - step, 0.0)
  lam = _per_position(schedule.reveal_prob(s, t), levels)  # [B, L]: λ_{h0}(s, t)
  in_r = masked & (jax.random.uniform(key, levels.shape, lam.dtype) < lam)
  return jnp.where(in_r, levels, ht)
