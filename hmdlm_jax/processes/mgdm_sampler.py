"""MGDM's top-k mask-predict decoding (`sample.ordering='remask'`, docs/method.md §13.3).

Ye et al. (ICLR 2025), "Beyond Autoregression": every step predicts the argmax token at every
non-given position, then re-masks the `floor(N · rate)` positions of lowest confidence, with
Gumbel noise of scale `remask_noise · rate` on the confidences unless `greedy` (its
'deterministic' mode). rate = k/T ('linear') or cos(π(T-k)/(2T)) ('cosine') with k = n - 1; the
last step re-masks nothing. `remask_decoded='repredict'` (MGDM's code) predicts every
non-given position afresh, so a decoded cell the network doubts is re-masked; 'carry' keeps
revealed tokens certain by the SUBS parameterisation (log f = 0 at their token), so a decoded
token changes only after it was re-masked, which never happens greedily (§13.3).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from hmdlm_jax.config import SampleConfig
from hmdlm_jax.processes import base
from hmdlm_jax.processes import parameterization

ApplyFn = base.ApplyFn


def remask_rate(n: jax.Array, cfg: SampleConfig) -> jax.Array:
  """The share of the non-given positions left masked after step n (float32 []); 0 at n = 1."""
  k = (jnp.asarray(n) - 1).astype(jnp.float32)
  steps = float(cfg.num_steps)
  if cfg.remask_schedule == 'linear':
    return k / steps
  return jnp.where(k > 0, jnp.cos((steps - k) / steps * jnp.pi * 0.5), 0.0)


def remask_choice(score: jax.Array, free: jax.Array, rate: jax.Array) -> jax.Array:
  """The positions re-masked: bool [B, L] from scores [B, L] and the non-given positions `free`.

  As MGDM's `topk_masking`: count = floor(N_b · rate) with N_b = free positions of the row, and
  the positions whose score is strictly below the row's count-th smallest score (0-based) are
  re-masked; ties at that cut-off re-mask fewer, as there. Given positions are never chosen.
  """
  chex.assert_equal_shape((score, free))
  score = jnp.where(free, score, jnp.inf)
  count = jnp.floor(free.sum(-1).astype(jnp.float32) * rate).astype(jnp.int32)  # [B]
  cutoff = jnp.take_along_axis(jnp.sort(score, axis=-1), count[:, None], axis=-1)  # [B, 1]
  return free & (score < cutoff)


def reverse_step(apply_fn: ApplyFn, cfg: SampleConfig, key: jax.Array, state: base.SamplerState,
                 n: jax.Array) -> base.SamplerState:
  """One step n of the top-k mask-predict chain (module docstring); one network call."""
  x, h, reveal, nfe, nan_calls = state[:5]
  batch_size = x.shape[0]
  given = reveal == cfg.num_steps + 1
  t_b = jnp.full((batch_size,), n.astype(jnp.float32) / cfg.num_steps, jnp.float32)
  logits = apply_fn(x, h, t_b, heads=('token',))['token']
  nan = jnp.any(jnp.isnan(logits))
  # 'repredict': every position read as masked, so decoded cells get no SUBS carry-over.
  seen = jnp.full_like(x, cfg.mask_id) if cfg.remask_decoded == 'repredict' else x
  logp = parameterization.token_log_probs(logits, seen, mask_id=cfg.mask_id)  # MASK has no mass
  x_hat = jnp.where(given, x, jnp.argmax(logp, axis=-1).astype(jnp.int32))
  score = jnp.max(logp, axis=-1)  # log-confidence of the argmax
  rate = remask_rate(n, cfg)
  if not cfg.greedy:
    gumbel = jax.random.gumbel(jax.random.fold_in(key, n), score.shape, score.dtype)
    score = score + cfg.remask_noise * rate * gumbel
  remask = remask_choice(score, ~given, rate)
  masked_before = x == cfg.mask_id
  new_x = jnp.where(remask, cfg.mask_id, x_hat).astype(jnp.int32)
  new_h = jnp.where(remask, cfg.num_levels, jnp.where(given, h, 0)).astype(jnp.int32)
  reveal = jnp.where(remask, 0, jnp.where(masked_before & ~given, n, reveal)).astype(jnp.int32)
  return base.SamplerState(new_x, new_h, reveal, nfe + 1, nan_calls + nan.astype(jnp.int32),
                           state.extra)
