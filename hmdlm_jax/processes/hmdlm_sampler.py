"""HMDLM's reverse process: Algorithm 2 (ancestral), confidence ordering, MDLM as K == 1.

The chain runs n = T..1 with t = n/T, s = (n-1)/T inside ONE `jax.lax.scan` (`base.run_chain`
over `reverse_step`). Everything is a pure function of the PRNG key, so the caller jits the whole
sampler (`base.make_sampler`); `schedule` and `cfg` are frozen dataclasses (static). A masked
position is `(mask_id, K)`; given positions start revealed and keep `reveal_step` T + 1.

- Ancestral ordering, the last step's renormalisation and guards, greedy decoding, the pass-2
  context of each variant and the cache: docs/method.md §7.
- Confidence ordering (grids): the count k_n, the score w · log π + log max f, the candidate
  level ĥ and `level_context`: docs/method.md §10.
- MDLM (K == 1): no pass 1, one network call per step (docs/method.md §12).
The returned levels are the drawn ones; `level_disagreement` is the share that differs from the
levels recomputed from the tokens (docs/method.md §7).
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.config import SampleConfig
from hmdlm_jax.processes import base
from hmdlm_jax.processes import parameterization
from hmdlm_jax.processes.schedules import Schedule

ApplyFn = base.ApplyFn


def check_config(schedule: Schedule, cfg: SampleConfig) -> None:
  """The sampler settings must fit the schedule (ValueError naming the field)."""
  if schedule.num_levels != cfg.num_levels:
    raise ValueError(f'schedule has {schedule.num_levels} levels but model.num_levels='
                     f'{cfg.num_levels}.')


def _check_int(field: str, value: Any, *, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f'{field} must be an integer >= {minimum}, got {value!r}.')


def _step_level_weights(log_g: jax.Array, lam: jax.Array, active: jax.Array,
                        is_last: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Log reveal weights log(λ_k g^i_k) of one step and the log stay-masked mass.

  Args:
    log_g: [B, L, K] float32, log g (levels of a masked position).
    lam: [K], λ_k(s, t) (Algorithm 2 line 10).
    active: [K] bool, α_k(t) < 1 (level k can still be masked at t).
    is_last: [] bool, s == 0: everyone is revealed, g renormalised over the active levels.

  Returns:
    log_w: [B, L, K] log reveal weight per level (sums to <= 1 over k; == 1 at the last step).
    log_stay: [B, L] log(1 - Σ_k w_k) (-inf at the last step).
  """

  def regular() -> tuple[jax.Array, jax.Array]:
    log_w = log_g + base.log0(lam)  # Algorithm 2 line 11
    pi = jnp.clip(jnp.sum(jnp.exp(log_w), axis=-1), 0.0, 1.0)
    return log_w, base.log0(1.0 - pi)

  def last() -> tuple[jax.Array, jax.Array]:
    # Allowed = active levels (all levels if none is active at t = 1/T).
    allowed = jnp.where(jnp.any(active), active, True)
    log_allowed = jnp.where(allowed, 0.0, -jnp.inf)
    log_w = log_g + log_allowed
    # All mass lost (g ≈ 0 on every allowed level): uniform over the allowed levels.
    lost = ~jnp.isfinite(jax.nn.logsumexp(log_w, axis=-1, keepdims=True))
    log_w = jnp.where(lost, log_allowed, log_w)
    log_w = log_w - jax.nn.logsumexp(log_w, axis=-1, keepdims=True)
    return log_w, jnp.full(log_w.shape[:-1], -jnp.inf, log_w.dtype)

  return jax.lax.cond(is_last, last, regular)


def _validate_given(given_tokens, given_levels, given_mask, batch_size: int, seq_len: int,
                    cfg: SampleConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Initial (x, h, given) [B, L]; all masked when nothing is given."""
  shape = (batch_size, seq_len)
  if given_mask is None:
    if given_tokens is not None or given_levels is not None:
      raise ValueError('sample: given_tokens/given_levels need given_mask [B, L] bool.')
    x = jnp.full(shape, cfg.mask_id, jnp.int32)
    h = jnp.full(shape, cfg.num_levels, jnp.int32)
    return x, h, jnp.zeros(shape, bool)
  if given_tokens is None:
    raise ValueError('sample: given_mask needs given_tokens [B, L] int32.')
  if given_levels is None:
    if cfg.num_levels > 1:
      raise ValueError('sample: given_mask with K > 1 needs given_levels [B, L] (the level '
                       'embedding of given positions, e.g. K-1 for the clues of a grid, '
                       'docs/method.md §6).')
    given_levels = jnp.zeros(shape, jnp.int32)
  chex.assert_shape([given_tokens, given_levels, given_mask], shape)
  if not any(isinstance(a, jax.core.Tracer) for a in (given_tokens, given_levels, given_mask)):
    # Concrete inputs: check the values too (traced ones are the caller's responsibility).
    gm = np.asarray(given_mask, bool)
    gt, gl = np.asarray(given_tokens)[gm], np.asarray(given_levels)[gm]
    if np.any(gt == cfg.mask_id) or np.any(gt < 0):
      raise ValueError(f'sample: given_tokens must be real tokens (>= 0, != mask_id='
                       f'{cfg.mask_id}) at given positions.')
    if np.any((gl < 0) | (gl >= cfg.num_levels)):
      raise ValueError(f'sample: given_levels must lie in 0..{cfg.num_levels - 1} (model.num_levels'
                       f'={cfg.num_levels}) at given positions.')
  given_mask = jnp.asarray(given_mask, bool)
  x = jnp.where(given_mask, jnp.asarray(given_tokens, jnp.int32), cfg.mask_id)
  h = jnp.where(given_mask, jnp.asarray(given_levels, jnp.int32), cfg.num_levels)
  return x, h, given_mask


def _fused(cfg: SampleConfig) -> bool:
  """Confidence ordering with level_context 'none': pass 2 sees exactly pass 1's inputs (x, h),
  so ONE network call computes both heads (exact; half the calls of two separate passes)."""
  return cfg.num_levels > 1 and cfg.ordering == 'confidence' and cfg.level_context == 'none'


class _Heads:
  """The network calls of one step with their post-processing (float32, SUBS, NaN flags)."""

  def __init__(self, apply_fn: ApplyFn, cfg: SampleConfig, shape: tuple[int, int]) -> None:
    self.apply_fn, self.cfg, self.shape = apply_fn, cfg, shape

  def hier_out(self, logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw hierarchy logits -> float32 [B, L, K] and whether any is NaN."""
    chex.assert_shape(logits, self.shape + (self.cfg.num_levels,))
    logits = logits.astype(jnp.float32)
    return logits, jnp.any(jnp.isnan(logits))

  def token_out(self, logits: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw token logits -> log f [B, L, V] (SUBS) and whether any logit is NaN."""
    chex.assert_rank(logits, 3)
    chex.assert_axis_dimension(logits, 0, self.shape[0])
    chex.assert_axis_dimension(logits, 1, self.shape[1])
    nan = jnp.any(jnp.isnan(logits))
    return parameterization.token_log_probs(logits, x, mask_id=self.cfg.mask_id), nan

  def pass1(self, x: jax.Array, h: jax.Array, t_b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw hierarchy logits [B, L, K] float32 and whether any is NaN."""
    return self.hier_out(self.apply_fn(x, h, t_b, heads=('hier',))['hier'])

  def pass2(self, x: jax.Array, h_in: jax.Array, own_levels: jax.Array,
            t_b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """log f [B, L, V] (SUBS) and whether any logit is NaN.

    h_in: the backbone's levels; own_levels: h with the drawn / candidate levels (two_pass: the
    backbone input; single_pass: `token_levels` over the pass-1 inputs).
    """
    hier = self.cfg.num_levels > 1
    if hier and self.cfg.variant == 'single_pass':
      out = self.apply_fn(x, h_in, t_b, heads=('token',), token_levels=own_levels)
    else:
      out = self.apply_fn(x, own_levels if hier else h_in, t_b, heads=('token',))
    return self.token_out(out['token'], x)

  def both(self, x: jax.Array, h: jax.Array, t_b: jax.Array
           ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Raw hierarchy logits [B, L, K], log f [B, L, V] and NaN flag from one call on (x, h)."""
    extra = {'token_levels': h} if self.cfg.variant == 'single_pass' else {}
    out = self.apply_fn(x, h, t_b, heads=('hier', 'token'), **extra)
    logits, nan1 = self.hier_out(out['hier'])
    token_logp, nan2 = self.token_out(out['token'], x)
    return logits, token_logp, nan1 | nan2


def init(apply_fn: ApplyFn, schedule: Schedule, cfg: SampleConfig, *, batch_size: int,
         seq_len: int, given_tokens: jax.Array | None = None,
         given_levels: jax.Array | None = None,
         given_mask: jax.Array | None = None) -> base.SamplerState:
  """The all-masked start (given positions revealed, `reveal_step` T + 1) and empty caches.

  extra = (hier_cache [B, L, K], tok_cache [B, L, V] (fused calls only, else [B, L, 1]),
  cache_valid []).
  """
  check_config(schedule, cfg)
  _check_int('batch_size', batch_size, minimum=1)
  _check_int('seq_len', seq_len, minimum=1)
  x0, h0, given = _validate_given(given_tokens, given_levels, given_mask, batch_size, seq_len, cfg)
  reveal0 = jnp.where(given, cfg.num_steps + 1, 0).astype(jnp.int32)
  if cfg.given_state and cfg.num_levels > 1:
    apply_fn = base.with_given_state(apply_fn, given, cfg.num_levels)
  # The token cache (fused calls only) needs the vocabulary size: read it off an abstract call.
  heads = _Heads(apply_fn, cfg, (batch_size, seq_len))
  vocab = jax.eval_shape(lambda: heads.both(x0, h0, jnp.zeros((batch_size,), jnp.float32))
                         )[1].shape[-1] if _fused(cfg) else 1
  zero = jnp.zeros((), jnp.int32)
  extra = (jnp.zeros((batch_size, seq_len, cfg.num_levels), jnp.float32),
           jnp.zeros((batch_size, seq_len, vocab), jnp.float32), jnp.zeros((), bool))
  return base.SamplerState(x0, h0, reveal0, zero, zero, extra)


def reverse_step(apply_fn: ApplyFn, schedule: Schedule, cfg: SampleConfig, key: jax.Array,
                 state: base.SamplerState, n: jax.Array) -> base.SamplerState:
  """One step t = n/T -> s = (n-1)/T of Algorithm 2 or of confidence ordering (module doc)."""
  x, h, reveal, nfe, nan_calls = state[:5]
  hier_cache, tok_cache, cache_valid = state.extra
  batch_size, seq_len = x.shape
  num_steps, num_levels = cfg.num_steps, cfg.num_levels
  hier, fused = num_levels > 1, _fused(cfg)
  if cfg.given_state and hier:
    apply_fn = base.with_given_state(apply_fn, reveal == num_steps + 1, num_levels)
  heads = _Heads(apply_fn, cfg, (batch_size, seq_len))
  k_level, k_token = jax.random.split(jax.random.fold_in(key, n))
  t = n.astype(jnp.float32) / num_steps
  s = (n - 1).astype(jnp.float32) / num_steps
  t_b = jnp.full((batch_size,), t, jnp.float32)
  lam = schedule.reveal_prob(s, t).astype(jnp.float32)  # [K]
  active = schedule.one_minus_alpha(t) > 0  # [K]: α_k(t) < 1, as in reveal_prob
  is_last = n == 1
  masked = h == num_levels
  any_masked = jnp.any(masked)

  # Pass 1 -> log g [B, L, K] (K == 1: g ≡ 1, no call); fused: both heads in this call.
  if hier:
    if fused:
      call = lambda: heads.both(x, h, t_b)
    else:
      def call():
        logits, nan = heads.pass1(x, h, t_b)
        return logits, tok_cache, nan
    cached = lambda: (hier_cache, tok_cache, jnp.zeros((), bool))
    if cfg.use_cache:
      reuse = cache_valid & (not cfg.time_conditioning)
      call1 = any_masked & ~reuse
      hier_logits, tok_cache, nan1 = jax.lax.cond(call1, call, cached)
      nfe = nfe + call1.astype(jnp.int32)
      cache_valid = cache_valid | call1
    else:
      hier_logits, tok_cache, nan1 = call()
      nfe = nfe + 1
    nan_calls = nan_calls + nan1.astype(jnp.int32)
    log_g = parameterization.level_log_probs(hier_logits, t_b, schedule,
                                             prior_corrected=cfg.prior_corrected)
  else:
    hier_logits = hier_cache
    log_g = jnp.zeros((batch_size, seq_len, 1), jnp.float32)
  log_w, log_stay = _step_level_weights(log_g, lam, active, is_last)

  if cfg.ordering == 'ancestral':
    # Algorithm 2 line 11: Cat(λ_0 g_0, …, λ_{K-1} g_{K-1}, stay) per masked position.
    logits = jnp.concatenate([log_w, log_stay[..., None]], axis=-1)
    drawn = base.categorical_icdf(k_level, logits)
    reveal_now = masked & (drawn < num_levels)  # the set R
    pass2_levels = jnp.where(reveal_now, drawn, h)  # Algorithm 2 line 17: drawn levels at R
  else:
    pi = jnp.where(masked, jnp.sum(jnp.exp(log_w), axis=-1), 0.0)  # [B, L]
    cand = jnp.argmax(log_w, axis=-1).astype(jnp.int32)  # ĥ = argmax_k λ_k g_k
    eligible = masked & (pi > 0)
    n_elig = jnp.sum(eligible, axis=-1)
    planned = jnp.round(jnp.sum(pi, axis=-1)).astype(jnp.int32)
    count = jnp.where(is_last, jnp.sum(masked, axis=-1), jnp.maximum(planned, 1))
    count = jnp.minimum(count, n_elig)  # [B]
    reveal_now = None  # chosen after pass 2 (it needs the token confidence)
    pass2_levels = jnp.where(masked, cand, h)

  # Pass 2 -> tokens (and, for confidence ordering, the choice of positions).
  def tokens_and_reveal():
    if fused:
      token_logp, nan2 = tok_cache, jnp.zeros((), bool)
    else:
      token_logp, nan2 = heads.pass2(x, h, pass2_levels, t_b)
    if cfg.ordering == 'ancestral':
      chosen = reveal_now
    else:
      conf = jnp.max(token_logp, axis=-1)  # log max_v f^i(v), untempered
      score = jnp.where(eligible, cfg.hierarchy_weight * base.log0(pi) + conf, -jnp.inf)
      order = jnp.argsort(-score, axis=-1, stable=True)
      rank = jnp.argsort(order, axis=-1)
      chosen = eligible & (rank < count[:, None])
    new_tok = base.draw_tokens(k_token, token_logp, cfg)
    return jnp.where(chosen, new_tok, x), chosen, nan2

  if fused:  # no call of its own
    new_x, chosen, nan2 = tokens_and_reveal()
  elif cfg.use_cache:
    need2 = jnp.any(reveal_now) if cfg.ordering == 'ancestral' else jnp.any(count > 0)
    new_x, chosen, nan2 = jax.lax.cond(
        need2, tokens_and_reveal, lambda: (x, jnp.zeros_like(masked), jnp.zeros((), bool)))
    nfe = nfe + need2.astype(jnp.int32)
  else:
    new_x, chosen, nan2 = tokens_and_reveal()
    nfe = nfe + 1
  nan_calls = nan_calls + nan2.astype(jnp.int32)
  # Freeze the revealed pairs (Algorithm 2 line 21); pass2_levels: drawn / candidate levels.
  new_h = jnp.where(chosen, pass2_levels, h)
  reveal = jnp.where(chosen, n, reveal)
  # (x, h) changed -> the cached pass-1 logits are stale.
  cache_valid = cache_valid & ~jnp.any(chosen)
  return base.SamplerState(new_x, new_h, reveal, nfe, nan_calls,
                           (hier_logits, tok_cache, cache_valid))


def sample(apply_fn: ApplyFn, key: jax.Array, schedule: Schedule, cfg: SampleConfig, *,
           batch_size: int, seq_len: int, given_tokens: jax.Array | None = None,
           given_levels: jax.Array | None = None,
           given_mask: jax.Array | None = None) -> base.SampleOutput:
  """Draws `batch_size` sequences of length `seq_len` from the reverse process.

  Args:
    apply_fn: the denoiser contract of docs/design.md (`heads`, `token_levels`).
    key: PRNG key.
    schedule: per-level schedule with `schedule.num_levels == cfg.num_levels`.
    cfg: `SampleConfig`.
    batch_size, seq_len: B, L (static).
    given_tokens: int32 [B, L], tokens of the given positions (ignored elsewhere).
    given_levels: int32 [B, L], their levels (required when K > 1 and something is given).
    given_mask: bool [B, L], True where the position is given (never resampled).

  Returns:
    SampleOutput (tokens, levels, reveal_step [B, L] int32; nfe, nan_calls [] int32).
  """
  state = init(apply_fn, schedule, cfg, batch_size=batch_size, seq_len=seq_len,
               given_tokens=given_tokens, given_levels=given_levels, given_mask=given_mask)
  step = lambda st, n: reverse_step(apply_fn, schedule, cfg, key, st, n)
  return base.run_chain(step, state, cfg.num_steps)


def level_disagreement(drawn_levels: jax.Array, recomputed_levels: jax.Array,
                       where: jax.Array | None = None) -> jax.Array:
  """Share of positions whose drawn level differs from the level recomputed from the tokens.

  Args:
    drawn_levels, recomputed_levels: int [B, L].
    where: optional bool [B, L], positions to count (e.g. not given, not padding).

  Returns:
    float32 [] share in [0, 1] (0 when `where` selects nothing).
  """
  chex.assert_equal_shape([drawn_levels, recomputed_levels])
  diff = drawn_levels != recomputed_levels
  where = jnp.ones_like(diff) if where is None else jnp.asarray(where, bool)
  chex.assert_equal_shape([diff, where])
  return (jnp.sum(diff & where) / jnp.maximum(jnp.sum(where), 1)).astype(jnp.float32)
