"""HMDLM losses (SPEC 5, paper eq. 11 / 73-76, Algorithm 1) and the rigorous bound (SPEC 8).

Per masked loss position i, with λ'_k(t) the hazard of level k (schedules.py):
  L_LM   = λ'_{h0^i}(t) · (-log f^i[x0^i])                  (eq. 73, pass 2)
  L_hier = λ'_{h0^i}(t) · (-log g^i[h0^i])                  (eq. 74, pass 1)
  L_cons = Σ_k g^i_k λ'_k(t) − λ'_{h0^i}(t)                  (eq. 75, pass 1)
summed over positions that are masked AND in `loss_mask`, divided by the number of loss positions
(never by the number that happen to be masked, which would bias the bound). K = 1 is MDLM exactly:
g ≡ 1, so L_hier = L_cons = 0 and pass 1 is skipped.

Batch reduction: per-example values (normalised by their own loss-position count N_b) are averaged
with weights N_b / Σ_b N_b, i.e. Σ_b Σ_i terms / Σ_b N_b — MDLM's token-weighted batch mean
(identical to the plain mean when every example has the same N_b).

Pass-2 context (SPEC 5, 8): training follows Algorithm 1 (gold level shown on the reveal set R
only) for 'two_pass', which is a surrogate; the bound needs each position's OWN level only:
`bound_per_example` shows one uniformly chosen masked position's level and reweights (two_pass,
unbiased) or feeds every position's own level at once (single_pass, exact).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax import corruption
from hmdlm_jax import parameterization
from hmdlm_jax.schedules import Schedule

ApplyFn = Callable[..., Mapping[str, jax.Array]]
VARIANTS = ('two_pass', 'single_pass')


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Static loss settings (hashable: a valid static jit argument).

  Attributes:
    beta_hier, beta_cons: weights of L_hier and L_cons (1, 1 = tied weights = the bound).
    t_min: t ~ U(t_min, 1).
    antithetic: stratified times across the batch (MDLM's default).
    train_steps_T: T_train of Algorithm 1 line 15, s = max(t - 1/T_train, 0).
    variant: 'two_pass' (paper) | 'single_pass' (SPEC 4 extension).
    prior_corrected: prior-corrected hierarchy head (SPEC 4).
    mask_id: MASK token id (resolved, >= 0).
    num_levels: K.
  """
  beta_hier: float = 1.0
  beta_cons: float = 1.0
  t_min: float = 1e-3
  antithetic: bool = True
  train_steps_T: int = 1000
  variant: str = 'two_pass'
  prior_corrected: bool = True
  mask_id: int = 0
  num_levels: int = 2

  def __post_init__(self) -> None:
    for name in ('beta_hier', 'beta_cons'):
      v = getattr(self, name)
      if not (math.isfinite(v) and v >= 0):
        raise ValueError(f'loss.{name}={v} must be a finite number >= 0.')
    if not 0.0 <= self.t_min < 1.0:
      raise ValueError(f'loss.t_min={self.t_min} must lie in [0, 1).')
    if int(self.train_steps_T) != self.train_steps_T or self.train_steps_T < 1:
      raise ValueError(f'loss.train_steps_T={self.train_steps_T} must be an integer >= 1.')
    if self.variant not in VARIANTS:
      raise ValueError(f'model.variant={self.variant!r} is not one of {VARIANTS}.')
    if self.mask_id < 0:
      raise ValueError(f'mask_id={self.mask_id} must be resolved to a token id >= 0.')
    if self.num_levels < 1:
      raise ValueError(f'model.num_levels={self.num_levels} must be >= 1.')

  @classmethod
  def from_config(cls, config: Any) -> LossConfig:
    """Reads `config.loss` and `config.model` (configs/base.py); mask_id -1 -> vocab_size - 1."""
    m, l = config.model, config.loss
    mask_id = int(m.mask_id)
    if mask_id == -1:
      mask_id = int(m.vocab_size) - 1
    if not 0 <= mask_id < int(m.vocab_size):
      raise ValueError(f'model.mask_id={m.mask_id} is outside [0, model.vocab_size={m.vocab_size}) '
                       '(use -1 for vocab_size - 1).')
    return cls(beta_hier=float(l.beta_hier), beta_cons=float(l.beta_cons), t_min=float(l.t_min),
               antithetic=bool(l.antithetic), train_steps_T=int(l.train_steps_T),
               variant=str(m.variant), prior_corrected=bool(m.prior_corrected_head),
               mask_id=mask_id, num_levels=int(m.num_levels))


def loss_terms(tok_nll: jax.Array, level_logp: jax.Array, levels: jax.Array, masked: jax.Array,
               loss_mask: jax.Array, hazard: jax.Array) -> dict[str, jax.Array]:
  """The three per-example loss terms (eq. 73-75), normalised per loss position (SPEC 5).

  Args:
    tok_nll: [B, L] -log f^i[x0^i].
    level_logp: [B, L, K] log g (zeros [B, L, 1] for K = 1).
    levels: [B, L] gold levels h0.
    masked: [B, L] bool.
    loss_mask: [B, L] bool (not given, not padding).
    hazard: [B, K] λ'_k(t).
  Returns:
    dict 'lm', 'hier', 'cons' of [B]: sums over masked loss positions / max(#loss positions, 1).
  """
  chex.assert_rank((tok_nll, levels, masked, loss_mask), 2)
  chex.assert_equal_shape((tok_nll, levels, masked, loss_mask))
  chex.assert_rank((level_logp, hazard), (3, 2))
  chex.assert_equal_shape_prefix((tok_nll, level_logp), 2)
  chex.assert_axis_dimension(level_logp, 2, hazard.shape[-1])
  sel = masked.astype(bool) & loss_mask.astype(bool)
  n = jnp.maximum(loss_mask.astype(bool).sum(-1), 1).astype(hazard.dtype)  # [B]
  lam0 = jnp.take_along_axis(hazard, levels, axis=1)  # [B, L]: λ'_{h0^i}(t)
  zero = jnp.zeros_like(lam0)
  # Select before multiplying so a non-finite value at an unused position cannot leak (0 * inf).
  lm = lam0 * jnp.where(sel, tok_nll, zero)
  hier_nll = -jnp.take_along_axis(level_logp, levels[..., None], axis=-1)[..., 0]
  hier = lam0 * jnp.where(sel, hier_nll, zero)
  g = jnp.exp(level_logp)
  cons = jnp.where(sel, (g * hazard[:, None, :]).sum(-1) - lam0, zero)
  return dict(lm=lm.sum(-1) / n, hier=hier.sum(-1) / n, cons=cons.sum(-1) / n)


def _unpack(batch: Mapping[str, Any]) -> tuple[jax.Array, ...]:
  tokens = jnp.asarray(batch['tokens'])
  levels = jnp.asarray(batch['levels'])
  given = jnp.asarray(batch['given']).astype(bool)
  loss_mask = jnp.asarray(batch['loss_mask']).astype(bool)
  chex.assert_rank((tokens, levels, given, loss_mask), 2)
  chex.assert_equal_shape((tokens, levels, given, loss_mask))
  chex.assert_type((tokens, levels), int)
  return tokens, levels, given, loss_mask


def _pass1(apply_fn: ApplyFn, xt: jax.Array, ht: jax.Array, t: jax.Array, schedule: Schedule,
           cfg: LossConfig) -> jax.Array:
  """log g [B, L, K] from pass 1 on (x_t, h_t); K = 1: zeros [B, L, 1], no network call."""
  if cfg.num_levels == 1:
    return jnp.zeros(xt.shape + (1,), jnp.float32)
  out = apply_fn(xt, ht, t, heads=('hier',))
  return parameterization.level_log_probs(out['hier'], t, schedule,
                                          prior_corrected=cfg.prior_corrected)


def _check(schedule: Schedule, cfg: LossConfig) -> None:
  if schedule.num_levels != cfg.num_levels:
    raise ValueError(f'the schedule has {schedule.num_levels} levels but model.num_levels='
                     f'{cfg.num_levels}.')


def diffusion_loss(apply_fn: ApplyFn, batch: Mapping[str, Any], key: jax.Array,
                   schedule: Schedule, cfg: LossConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The training loss L = L_LM + β_hier L_hier + β_cons L_cons (eq. 76, Algorithm 1).

  two_pass: pass 1 on (x_t, h_t) -> g; pass 2 on (x_t, h_s) -> f with h_s from `reveal_levels`
  (Algorithm 1 lines 15-21). single_pass: one call on (x_t, h_t) with token_levels = h0 at masked
  positions (own-level context, SPEC 4). K = 1: a single token call on (x_t, h_t) = MDLM.

  Args:
    apply_fn: denoiser (docs/design.md contract).
    batch: dict tokens, levels [B, L] int; given, loss_mask [B, L] bool.
    key: PRNG key, split as `k_t, k_mask, k_reveal = jax.random.split(key, 3)` for
      `sample_times`, `corrupt` and `reveal_levels`.
    schedule: K-level schedule.
    cfg: LossConfig.
  Returns:
    (loss scalar float32, metrics dict of float32 scalars): 'loss', 'lm', 'hier', 'cons',
    'nelbo' (= lm + hier + cons, tied weights; per loss token), 'token_nll' (unweighted -log f per
    masked loss token), 'level_acc' (argmax g == h0 on masked loss tokens), 'mask_rate' (masked
    share of loss tokens), 'num_loss_tokens', 'finite' (1.0 iff loss and all terms are finite).
    NaN/Inf propagate into 'loss' on purpose (never averaged away); see `raise_if_nonfinite`.
  """
  _check(schedule, cfg)
  tokens, levels, given, loss_mask = _unpack(batch)
  k_t, k_mask, k_rev = jax.random.split(key, 3)
  t = corruption.sample_times(k_t, tokens.shape[0], t_min=cfg.t_min, antithetic=cfg.antithetic)
  xt, ht, masked = corruption.corrupt(k_mask, tokens, levels, given, t, schedule,
                                      mask_id=cfg.mask_id)
  hazard = schedule.hazard(t)  # [B, K]
  if cfg.num_levels == 1:
    level_logp = jnp.zeros(tokens.shape + (1,), jnp.float32)
    token_logits = apply_fn(xt, ht, t, heads=('token',))['token']
  elif cfg.variant == 'two_pass':
    level_logp = _pass1(apply_fn, xt, ht, t, schedule, cfg)
    hs = corruption.reveal_levels(k_rev, levels, ht, masked, t, schedule,
                                  step=1.0 / cfg.train_steps_T)
    token_logits = apply_fn(xt, hs, t, heads=('token',))['token']
  else:
    out = apply_fn(xt, ht, t, heads=('hier', 'token'),
                   token_levels=jnp.where(masked, levels, ht))
    level_logp = parameterization.level_log_probs(out['hier'], t, schedule,
                                                  prior_corrected=cfg.prior_corrected)
    token_logits = out['token']
  tok_nll = parameterization.token_nll(token_logits, tokens, mask_id=cfg.mask_id)
  terms = loss_terms(tok_nll, level_logp, levels, masked, loss_mask, hazard)

  n_b = loss_mask.sum(-1).astype(jnp.float32)  # [B]
  w = n_b / jnp.maximum(n_b.sum(), 1.0)  # token-weighted batch mean (MDLM)

  def mean(x: jax.Array) -> jax.Array:
    return (w * x.astype(jnp.float32)).sum()

  lm, hier, cons = mean(terms['lm']), mean(terms['hier']), mean(terms['cons'])
  loss = lm + cfg.beta_hier * hier + cfg.beta_cons * cons
  sel = masked & loss_mask
  n_sel = jnp.maximum(sel.sum(), 1).astype(jnp.float32)
  level_ok = jnp.argmax(level_logp, axis=-1) == levels
  metrics = dict(
      loss=loss, lm=lm, hier=hier, cons=cons, nelbo=lm + hier + cons,
      token_nll=jnp.where(sel, tok_nll, 0.0).sum().astype(jnp.float32) / n_sel,
      level_acc=(level_ok & sel).sum().astype(jnp.float32) / n_sel,
      mask_rate=sel.sum().astype(jnp.float32) / jnp.maximum(n_b.sum(), 1.0),
      num_loss_tokens=n_b.sum(),
  )
  metrics['finite'] = jnp.all(jnp.isfinite(jnp.stack([loss, lm, hier, cons]))).astype(jnp.float32)
  return loss.astype(jnp.float32), {k: v.astype(jnp.float32) for k, v in metrics.items()}


def raise_if_nonfinite(metrics: Mapping[str, Any], *, where: str = '') -> None:
  """Host-side check: raises FloatingPointError naming every NaN/Inf metric (e.g. 'hier=nan')."""
  bad = {k: float(v) for k, v in metrics.items()
         if np.ndim(v) == 0 and not np.isfinite(float(v))}
  if bad:
    detail = ', '.join(f'{k}={v}' for k, v in sorted(bad.items()))
    raise FloatingPointError(f'non-finite loss terms{" at " + where if where else ""}: {detail}')


def bound_per_example(apply_fn: ApplyFn, batch: Mapping[str, Any], key: jax.Array, t: jax.Array,
                      schedule: Schedule, cfg: LossConfig) -> dict[str, jax.Array]:
  """One-sample estimate of the rigorous bound at times t (SPEC 8), per example.

  L_hier and L_cons are exact for all positions (pass 1 on (x_t, h_t)). The token term needs
  each position's OWN level as pass-2 context:
  * single_pass: exact for every position at once (token_levels = h0 at masked positions);
  * two_pass: one masked loss position j is picked uniformly, pass 2 sees h_t with h0^j shown at
    j, and its term is weighted by the number of masked loss positions (unbiased);
  * K = 1: pass 2 on (x_t, h_t) for all positions: MDLM's NELBO.
  Its expectation over t ~ U(0, 1) and the corruption is >= -log p(x) per loss token up to the ε
  terms (equality for the exact posterior when ε = 0).

  Args:
    apply_fn: denoiser; batch: as in `diffusion_loss`; t: [B] times.
    key: PRNG key, split as `k_mask, k_pick = jax.random.split(key)` (corruption, choice of j).
  Returns:
    dict of [B] float32 (float64 if t is float64): 'lm', 'hier', 'cons', 'total' (per loss token)
    and 'num_tokens' (loss positions N_b; aggregate a data set as Σ total·N / Σ N).
  """
  _check(schedule, cfg)
  tokens, levels, given, _ = _unpack(batch)
  chex.assert_shape(t, (tokens.shape[0],))
  k_mask, k_pick = jax.random.split(key)
  xt, ht, masked = corruption.corrupt(k_mask, tokens, levels, given, t, schedule,
                                      mask_id=cfg.mask_id)
  return bound_from_state(apply_fn, batch, xt, ht, masked, t, k_pick, schedule, cfg)


def bound_from_state(apply_fn: ApplyFn, batch: Mapping[str, Any], xt: jax.Array, ht: jax.Array,
                     masked: jax.Array, t: jax.Array, key: jax.Array, schedule: Schedule,
                     cfg: LossConfig) -> dict[str, jax.Array]:
  """`bound_per_example` at a given corruption (xt, ht, masked [B, L]); `key` picks j (two_pass).

  Deterministic for single_pass and K = 1, which the exact enumeration tests rely on.
  """
  _check(schedule, cfg)
  tokens, levels, _, loss_mask = _unpack(batch)
  chex.assert_equal_shape((tokens, xt, ht, masked))
  hazard = schedule.hazard(t)
  sel = masked & loss_mask
  if cfg.num_levels == 1:
    level_logp = jnp.zeros(tokens.shape + (1,), hazard.dtype)
    token_logits = apply_fn(xt, ht, t, heads=('token',))['token']
    weight = jnp.ones(tokens.shape, hazard.dtype)
  elif cfg.variant == 'single_pass':
    out = apply_fn(xt, ht, t, heads=('hier', 'token'), token_levels=jnp.where(masked, levels, ht))
    level_logp = parameterization.level_log_probs(out['hier'], t, schedule,
                                                  prior_corrected=cfg.prior_corrected)
    token_logits = out['token']
    weight = jnp.ones(tokens.shape, hazard.dtype)
  else:
    level_logp = _pass1(apply_fn, xt, ht, t, schedule, cfg)
    score = jnp.where(sel, jax.random.uniform(key, tokens.shape), -1.0)
    pick = jax.nn.one_hot(jnp.argmax(score, axis=-1), tokens.shape[1], dtype=bool) & sel
    token_logits = apply_fn(xt, jnp.where(pick, levels, ht), t, heads=('token',))['token']
    weight = jnp.where(pick, sel.sum(-1, keepdims=True), 0).astype(hazard.dtype)
  nll = parameterization.token_nll(token_logits, tokens, mask_id=cfg.mask_id)
  tok_nll = jnp.where(weight > 0, nll, 0.0) * weight
  terms = loss_terms(tok_nll, level_logp, levels, masked, loss_mask, hazard)
  terms['total'] = terms['lm'] + terms['hier'] + terms['cons']
  terms['num_tokens'] = loss_mask.sum(-1).astype(terms['total'].dtype)
  return terms


def appendix_e_per_example(apply_fn: ApplyFn, batch: Mapping[str, Any], key: jax.Array,
                           t: jax.Array, schedule: Schedule, cfg: LossConfig) -> jax.Array:
  """Appendix E's perplexity estimate (eq. 108-109) at times t, per example: [B].

  Σ_{masked loss i} r_i(t) · (-log f^i[x0^i]) / N_b with r_i = Σ_k g^i_k λ'_k(t) (pass 1 on
  (x_t, h_t)) and pass 2 on (x_t, h_t): no level information. An estimate, not a bound (SPEC 8).
  For K = 1, r_i = λ'_0(t) and this is MDLM's NELBO. `key` drives `corrupt` directly.
  """
  _check(schedule, cfg)
  tokens, levels, given, _ = _unpack(batch)
  chex.assert_shape(t, (tokens.shape[0],))
  xt, ht, masked = corruption.corrupt(key, tokens, levels, given, t, schedule,
                                      mask_id=cfg.mask_id)
  return appendix_e_from_state(apply_fn, batch, xt, ht, masked, t, schedule, cfg)


def appendix_e_from_state(apply_fn: ApplyFn, batch: Mapping[str, Any], xt: jax.Array,
                          ht: jax.Array, masked: jax.Array, t: jax.Array, schedule: Schedule,
                          cfg: LossConfig) -> jax.Array:
  """`appendix_e_per_example` at a given corruption (xt, ht, masked [B, L]): [B]."""
  _check(schedule, cfg)
  tokens, _, _, loss_mask = _unpack(batch)
  chex.assert_equal_shape((tokens, xt, ht, masked))
  hazard = schedule.hazard(t)  # [B, K]
  level_logp = _pass1(apply_fn, xt, ht, t, schedule, cfg).astype(hazard.dtype)
  r = (jnp.exp(level_logp) * hazard[:, None, :]).sum(-1)  # [B, L]
  # No level information at masked positions: h_t (h_m there); single_pass reads it as the token
  # head's own-level input too.
  extra = {'token_levels': ht} if cfg.variant == 'single_pass' and cfg.num_levels > 1 else {}
  token_logits = apply_fn(xt, ht, t, heads=('token',), **extra)['token']
  sel = masked & loss_mask
  nll = jnp.where(sel, parameterization.token_nll(token_logits, tokens, mask_id=cfg.mask_id), 0.0)
  n = jnp.maximum(loss_mask.sum(-1), 1).astype(hazard.dtype)
  return (r * nll).sum(-1) / n
