"""HMDLM: per-level schedules, joint token+level corruption, the loss and the bound.

A position is either revealed (x0, h0) or masked (MASK, h_m = K), ONE Bernoulli per position
deciding both (eq. 5); given positions are never masked, and with `model.given_state` the network
sees them as h_g = K+1 (`base.with_given_state`, at every call here). The per-position terms are
in `hmdlm_terms`, the training-only level objectives in `level_objectives`.

- Corruption and Algorithm 1's reveal set: docs/method.md §3.
- The loss, its normalisation and its pass-2 context (Algorithm 1's surrogate for 'two_pass',
  the own-level context for 'single_pass'); `loss.hier_objective`, `loss.beta_rounds`:
  docs/method.md §5, §5.1.
- The bound (`bound_from_state`: one masked position's own level shown and reweighted for
  'two_pass', every position's own level at once for 'single_pass') and Appendix E's estimate:
  docs/method.md §8.1, §8.2, §8.4. MDLM is the K = 1 case of the same code (§12).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, Mapping

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.config import LossConfig
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.models import token_head
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm_sampler
from hmdlm_jax.processes import hmdlm_terms
from hmdlm_jax.processes import level_objectives
from hmdlm_jax.processes import parameterization
from hmdlm_jax.processes import remdm_sampler
from hmdlm_jax.processes import schedules
from hmdlm_jax.processes.schedules import Schedule

ApplyFn = base.ApplyFn


def corrupt(key: jax.Array, tokens: jax.Array, levels: jax.Array, given: jax.Array,
            t: jax.Array, schedule: Schedule, *, mask_id: int
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Samples s_t ~ q(s_t | s_0) (eq. 6, Algorithm 1 lines 6-9).

  Args:
    key: PRNG key.
    tokens, levels: [B, L] int clean tokens x0 and gold levels h0 in 0..K-1.
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
  p_mask = hmdlm_terms.per_position(schedule.one_minus_alpha(t), levels)  # [B, L]: 1 - α_{h0}(t)
  u = jax.random.uniform(key, tokens.shape, p_mask.dtype)
  masked = (u < p_mask) & ~given.astype(bool)  # ONE Bernoulli for token and level (eq. 5)
  xt = jnp.where(masked, jnp.asarray(mask_id, tokens.dtype), tokens)
  ht = jnp.where(masked, jnp.asarray(schedule.num_levels, levels.dtype), levels)
  return xt, ht, masked


def reveal_levels(key: jax.Array, levels: jax.Array, ht: jax.Array, masked: jax.Array,
                  t: jax.Array, schedule: Schedule, *, step: float) -> jax.Array:
  """Pass-2 level context of Algorithm 1 (lines 15-21): hs [B, L] int.

  s = max(t - step, 0); each masked position joins the reveal set R with probability
  λ_{h0}(s, t); h_s = h0 on R and h_t elsewhere. `step` = 1 / T_train.
  """
  chex.assert_equal_shape((levels, ht, masked))
  chex.assert_rank(t, 1)
  s = jnp.maximum(t - step, 0.0)
  lam = hmdlm_terms.per_position(schedule.reveal_prob(s, t), levels)  # [B, L]: λ_{h0}(s, t)
  in_r = masked & (jax.random.uniform(key, levels.shape, lam.dtype) < lam)
  return jnp.where(in_r, levels, ht)


def _check(schedule: Schedule, cfg: LossConfig) -> None:
  if schedule.num_levels != cfg.num_levels:
    raise ValueError(f'the schedule has {schedule.num_levels} levels but model.num_levels='
                     f'{cfg.num_levels}.')


def _network(apply_fn: ApplyFn, given: jax.Array, cfg: LossConfig) -> ApplyFn:
  """The network as the loss calls it: given positions read h_g = K+1 with model.given_state."""
  if cfg.given_state and cfg.num_levels > 1:
    return base.with_given_state(apply_fn, given, cfg.num_levels)
  return apply_fn


def pass1_heads(beta_rounds: float) -> tuple[str, ...]:
  """The heads a loss reads in pass 1: the level head, and the per-round token head beside it
  when its loss is on (loss.beta_rounds > 0; docs/method.md §5.1). The process decides this;
  the backbone builds whichever heads it is asked for (models/hierarchy.py)."""
  return ('hier', 'hier_round_tokens') if beta_rounds > 0 else ('hier',)


def _pass1(apply_fn: ApplyFn, xt: jax.Array, ht: jax.Array, t: jax.Array, schedule: Schedule,
           cfg: LossConfig) -> jax.Array:
  """log g [B, L, K] from pass 1 on (x_t, h_t); K = 1: zeros [B, L, 1], no network call."""
  if cfg.num_levels == 1:
    return jnp.zeros(xt.shape + (1,), jnp.float32)
  out = apply_fn(xt, ht, t, heads=('hier',))
  return parameterization.level_log_probs(out['hier'], t, schedule,
                                          prior_corrected=cfg.prior_corrected)


def diffusion_loss(apply_fn: ApplyFn, batch: Mapping[str, Any], key: jax.Array,
                   schedule: Schedule, cfg: LossConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The training loss L = L_LM + β_hier L_hier + β_cons L_cons (eq. 76, Algorithm 1)
  (+ β_rounds L_rounds with loss.beta_rounds > 0).

  two_pass: pass 1 on (x_t, h_t) -> g; pass 2 on (x_t, h_s) -> f with h_s from `reveal_levels`.
  single_pass: one call on (x_t, h_t) with token_levels = h0 at masked positions (own-level
  context). K = 1: a single token call on (x_t, h_t) = MDLM.

  Args:
    apply_fn: denoiser (docs/design.md contract).
    batch: dict tokens, levels [B, L] int; given, loss_mask [B, L] bool.
    key: split as `k_t, k_mask, k_reveal = jax.random.split(key, 3)`.
    schedule, cfg: the K-level schedule and the loss settings.
  Returns:
    (loss scalar float32, metrics dict of float32 scalars): 'loss', 'lm', 'hier', 'cons',
    'nelbo' (= lm + hier + cons), 'token_nll' (unweighted -log f per masked loss token),
    'level_ce' (mean -log g[h0] per masked loss token; only with hier_objective='cross_entropy'),
    'round_tokens' (L_rounds; only with beta_rounds > 0),
    'level_acc' (argmax g == h0 on masked loss tokens), 'mask_rate', 'num_loss_tokens',
    'finite'. NaN/Inf propagate into 'loss' on purpose (never averaged away).
  """
  _check(schedule, cfg)
  tokens, levels, given, loss_mask = base.unpack(batch)
  apply_fn = _network(apply_fn, given, cfg)
  k_t, k_mask, k_rev = jax.random.split(key, 3)
  t = base.sample_times(k_t, tokens.shape[0], t_min=cfg.t_min, antithetic=cfg.antithetic)
  xt, ht, masked = corrupt(k_mask, tokens, levels, given, t, schedule, mask_id=cfg.mask_id)
  hazard = schedule.hazard(t)  # [B, K]
  sel = masked & loss_mask
  # The token head's reading: -log f[x0] at every position from dense logits, or at `sel` only.
  if cfg.token_rows == 'selected':
    token_head_name, query = 'token_nll', token_head.TokenQuery(tokens, sel, cfg.mask_id)
  else:
    token_head_name, query = 'token', None
  token_call = functools.partial(apply_fn, token_query=query) if query is not None else apply_fn
  # The per-round token head is read beside the level head (pass 1), only for its loss.
  level_heads = pass1_heads(cfg.beta_rounds)
  round_logits = None
  if cfg.num_levels == 1:
    level_logp = jnp.zeros(tokens.shape + (1,), jnp.float32)
    token_out = token_call(xt, ht, t, heads=(token_head_name,))[token_head_name]
  else:
    if cfg.variant == 'two_pass':
      out = apply_fn(xt, ht, t, heads=level_heads)  # pass 1 on (x_t, h_t)
      hs = reveal_levels(k_rev, levels, ht, masked, t, schedule, step=1.0 / cfg.train_steps_T)
      token_out = token_call(xt, hs, t, heads=(token_head_name,))[token_head_name]
    else:
      out = token_call(xt, ht, t, heads=level_heads + (token_head_name,),
                       token_levels=jnp.where(masked, levels, ht))
      token_out = out[token_head_name]
    level_logp = parameterization.level_log_probs(out['hier'], t, schedule,
                                                  prior_corrected=cfg.prior_corrected)
    round_logits = out.get('hier_round_tokens')
  tok_nll = (token_out if query is not None
             else parameterization.token_nll(token_out, tokens, mask_id=cfg.mask_id))
  lm = hmdlm_terms.lm_term(tok_nll, levels, masked, loss_mask, hazard)['lm']
  lm = base.token_weighted_mean(lm, loss_mask)
  lvl = hmdlm_terms.level_terms(level_logp, levels, masked, loss_mask, hazard)
  hier, cons = (base.token_weighted_mean(lvl[k], loss_mask) for k in ('hier', 'cons'))
  level_ce = level_objectives.level_cross_entropy(level_logp, levels, sel)
  if cfg.hier_objective == 'cross_entropy':
    loss = lm + cfg.beta_hier * level_ce
  else:
    loss = lm + cfg.beta_hier * hier + cfg.beta_cons * cons
  if round_logits is not None:
    l_rounds = level_objectives.round_token_loss(round_logits, tokens, levels, sel)
    loss = loss + cfg.beta_rounds * l_rounds
  n_sel = jnp.maximum(sel.sum(), 1).astype(jnp.float32)
  n_loss = loss_mask.sum().astype(jnp.float32)
  level_ok = jnp.argmax(level_logp, axis=-1) == levels
  metrics = dict(
      loss=loss, lm=lm, hier=hier, cons=cons, nelbo=lm + hier + cons,
      token_nll=jnp.where(sel, tok_nll, 0.0).sum().astype(jnp.float32) / n_sel,
      level_acc=((level_ok & sel).sum().astype(jnp.float32)
                 / jnp.maximum(sel.sum(), 1).astype(jnp.float32)),
      mask_rate=sel.sum().astype(jnp.float32) / jnp.maximum(n_loss, 1.0),
      num_loss_tokens=n_loss,
  )
  if cfg.hier_objective == 'cross_entropy':  # reported only then: the default log is unchanged
    metrics['level_ce'] = level_ce
  if round_logits is not None:  # likewise only with loss.beta_rounds > 0
    metrics['round_tokens'] = l_rounds
  metrics['finite'] = jnp.all(jnp.isfinite(jnp.stack([loss, lm, hier, cons]))).astype(jnp.float32)
  return loss.astype(jnp.float32), {k: v.astype(jnp.float32) for k, v in metrics.items()}


def bound_from_state(apply_fn: ApplyFn, batch: Mapping[str, Any], xt: jax.Array, ht: jax.Array,
                     masked: jax.Array, t: jax.Array, key: jax.Array, schedule: Schedule,
                     cfg: LossConfig) -> dict[str, jax.Array]:
  """The rigorous bound at a given corruption (xt, ht, masked [B, L]), per example.

  L_hier and L_cons are exact for all positions (pass 1 on (x_t, h_t)). The token term needs
  each position's OWN level as pass-2 context:
  * single_pass: exact for every position at once (token_levels = h0 at masked positions);
  * two_pass: one masked loss position j is picked uniformly (`key`), pass 2 sees h_t with h0^j
    shown at j, and its term is weighted by the number of masked loss positions (unbiased);
  * K = 1: pass 2 on (x_t, h_t) for all positions: MDLM's NELBO.
  Deterministic for single_pass and K = 1, which the exact enumeration tests rely on.

  Returns:
    dict of [B] (float64 if t is): 'lm', 'hier', 'cons', 'total' (per loss token) and
    'num_tokens' (loss positions N_b).
  """
  _check(schedule, cfg)
  tokens, levels, given, loss_mask = base.unpack(batch)
  chex.assert_equal_shape((tokens, xt, ht, masked))
  apply_fn = _network(apply_fn, given, cfg)
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
  terms = hmdlm_terms.loss_terms(tok_nll, level_logp, levels, masked, loss_mask, hazard)
  terms['total'] = terms['lm'] + terms['hier'] + terms['cons']
  terms['num_tokens'] = loss_mask.sum(-1).astype(terms['total'].dtype)
  return terms


def level_blind_from_state(apply_fn: ApplyFn, batch: Mapping[str, Any], xt: jax.Array,
                           ht: jax.Array, masked: jax.Array, t: jax.Array, schedule: Schedule,
                           cfg: LossConfig) -> dict[str, jax.Array]:
  """The token term with no level information at masked positions, per example (dict of [B]).

  Pass 2 on (x_t, h_t) (single_pass: token_levels = h_t, h_m at masked positions), i.e. every
  masked position's level hidden, then two weightings of the same -log f^i[x0^i]:
  * 'appendix_e': Appendix E's estimate (eq. 108-109), weight r_i = Σ_k g^i_k λ'_k(t) (pass 1 on
    (x_t, h_t)). An estimate, not a bound (docs/method.md §8.4). K = 1: MDLM's NELBO.
  * 'lm_hidden_level' (K > 1 only): the gold weight λ'_{h0^i}(t), i.e. the bound's L_LM with the
    level hidden. The hierarchy can pay (docs/method.md §8.4) only where the bound's L_LM, which
    shows each position its own level, is below this term by more than L_hier + L_cons.
  Both are Σ_{masked loss i} weight_i · nll_i / N_b.
  """
  _check(schedule, cfg)
  tokens, levels, given, loss_mask = base.unpack(batch)
  chex.assert_equal_shape((tokens, xt, ht, masked))
  apply_fn = _network(apply_fn, given, cfg)
  hazard = schedule.hazard(t)  # [B, K]
  level_logp = _pass1(apply_fn, xt, ht, t, schedule, cfg).astype(hazard.dtype)
  r = (jnp.exp(level_logp) * hazard[:, None, :]).sum(-1)  # [B, L]
  # No level information at masked positions: h_t (h_m there), also as single_pass's own level.
  extra = {'token_levels': ht} if cfg.variant == 'single_pass' and cfg.num_levels > 1 else {}
  token_logits = apply_fn(xt, ht, t, heads=('token',), **extra)['token']
  sel = masked & loss_mask
  nll = jnp.where(sel, parameterization.token_nll(token_logits, tokens, mask_id=cfg.mask_id), 0.0)
  n = jnp.maximum(loss_mask.sum(-1), 1).astype(hazard.dtype)
  out = {'appendix_e': (r * nll).sum(-1) / n}
  if cfg.num_levels > 1:
    out['lm_hidden_level'] = (hmdlm_terms.per_position(hazard, levels) * nll).sum(-1) / n
  return out


def appendix_e_from_state(apply_fn: ApplyFn, batch: Mapping[str, Any], xt: jax.Array,
                          ht: jax.Array, masked: jax.Array, t: jax.Array, schedule: Schedule,
                          cfg: LossConfig) -> jax.Array:
  """Appendix E's perplexity estimate (eq. 108-109) at a given corruption, per example: [B].

  Σ_{masked loss i} r_i(t) · (-log f^i[x0^i]) / N_b with r_i = Σ_k g^i_k λ'_k(t) (pass 1 on
  (x_t, h_t)) and pass 2 on (x_t, h_t): no level information. An estimate, not a bound
  (docs/method.md §8). For K = 1, r_i = λ'_0(t) and this is MDLM's NELBO.
  """
  return level_blind_from_state(apply_fn, batch, xt, ht, masked, t, schedule, cfg)['appendix_e']


@dataclasses.dataclass(frozen=True)
class HMDLM(base.Process):
  """HMDLM (MDLM for K = 1) behind the `Process` interface (hashable: a static jit argument).

  Attributes:
    schedule: the K per-level schedules.
    cfg: the loss settings.
    check_ordering: the config's schedule.check_ordering ('error' | 'warn' | 'off'): Appendix D's
      reveal ordering is checked on every sampling grid (`check_sampling`).
  """
  schedule: Schedule
  cfg: LossConfig
  check_ordering: str = 'error'

  name: ClassVar[str] = 'hmdlm'
  # sample.ordering values; 'remdm' (ReMDM's remasking, docs/method.md §13.5) for K = 1 only.
  orderings: ClassVar[tuple[str, ...]] = ('ancestral', 'confidence', 'remdm')

  def __post_init__(self) -> None:
    _check(self.schedule, self.cfg)

  def for_devices(self, num_devices: int) -> HMDLM:
    """`loss.token_rows` resolved: 'auto' -> 'selected' on one device, 'all' on more."""
    rows = self.cfg.token_rows
    if rows == 'selected' and num_devices > 1:
      raise ValueError(f"loss.token_rows='selected' sorts the rows of the whole batch and runs on "
                       f'one device; this mesh has {num_devices}: set loss.token_rows to '
                       "'auto' or 'all'.")
    if rows != 'auto':
      return self
    rows = 'selected' if num_devices == 1 else 'all'
    return dataclasses.replace(self, cfg=dataclasses.replace(self.cfg, token_rows=rows))

  @property
  def num_levels(self) -> int:
    return self.cfg.num_levels

  @property
  def heads(self) -> tuple[str, ...]:
    return ('hier', 'token') if self.num_levels > 1 else ('token',)

  @property
  def bound_kind(self) -> str:
    return 'mdlm' if self.num_levels == 1 else 'hmdlm'

  @property
  def estimate_names(self) -> tuple[str, ...]:
    return ('appendix_e', 'lm_hidden_level') if self.num_levels > 1 else ('appendix_e',)

  @property
  def kinks(self) -> tuple[float, ...]:
    return self.schedule.params if self.schedule.kind == 'loglinear' else ()

  def prepare_batch(self, batch: base.Batch) -> dict[str, np.ndarray]:
    """The contract keys with the levels checked against K (K = 1: the labels become 0).

    K = 1 is MDLM: there is one level, so the data's hierarchy labels are replaced by 0 (this is
    what makes an HMDLM data pipeline feed its MDLM twin). For K > 1 a level outside 0..K-1 is a
    config/data mismatch and raises.
    """
    out = {k: np.asarray(batch[k]) for k in base.BATCH_KEYS}
    levels = out['levels']
    if self.num_levels == 1:
      out['levels'] = np.zeros_like(levels)
    elif levels.size and (levels.min() < 0 or levels.max() >= self.num_levels):
      raise ValueError(f'The data pipeline produced hierarchy levels in [{levels.min()}, '
                       f'{levels.max()}] but model.num_levels={self.num_levels}; the data\'s '
                       'levels must lie in 0..K-1 (or use K=1 for MDLM).')
    return out

  def corrupt(self, key: jax.Array, batch: base.Batch, t: jax.Array) -> base.NoisyState:
    tokens, levels, given, _ = base.unpack(batch)
    xt, ht, _ = corrupt(key, tokens, levels, given, t, self.schedule, mask_id=self.cfg.mask_id)
    return base.NoisyState(xt, ht)

  def log_marginal(self, state: base.NoisyState, clean: base.NoisyState,
                   t: jax.Array) -> jax.Array:
    """log q of a position's state: revealed (x0, h0) w.p. α_{h0}(t), (MASK, ·) w.p. 1 - α_{h0}.

    A masked position whose level input is not h_m (Algorithm 1's pass-2 context, a candidate
    level of the sampler) carries its level as evidence: the factor 1[h0 = level].
    """
    t = jnp.asarray(t)
    log_a = jnp.log(self.schedule.alpha(t))  # [..., K]
    log_om = jnp.log(self.schedule.one_minus_alpha(t))
    la = jnp.take_along_axis(log_a[..., None, :], clean.levels[..., None], axis=-1)[..., 0]
    lom = jnp.take_along_axis(log_om[..., None, :], clean.levels[..., None], axis=-1)[..., 0]
    revealed = state.tokens != self.cfg.mask_id
    level_ok = (state.levels == clean.levels) | (state.levels == self.num_levels)
    ok = level_ok & (~revealed | (state.tokens == clean.tokens))
    return jnp.where(ok, jnp.where(revealed, la, lom), -jnp.inf)

  def state_candidates(self, clean: base.NoisyState) -> base.NoisyState:
    mask = jnp.full_like(clean.tokens, self.cfg.mask_id)
    h_m = jnp.full_like(clean.levels, self.num_levels)
    return base.NoisyState(jnp.stack([clean.tokens, mask], -1), jnp.stack([clean.levels, h_m], -1))

  def loss(self, apply_fn: ApplyFn, batch: base.Batch, key: jax.Array, *,
           step: jax.Array | None = None, target_apply_fn: ApplyFn | None = None
           ) -> tuple[jax.Array, dict[str, jax.Array]]:
    del step, target_apply_fn  # neither a curriculum nor a target network
    return diffusion_loss(apply_fn, batch, key, self.schedule, self.cfg)

  def bound_from_state(self, apply_fn: ApplyFn, batch: base.Batch, state: base.NoisyState,
                       t: jax.Array, key: jax.Array) -> dict[str, jax.Array]:
    masked = state.levels == self.num_levels
    return bound_from_state(apply_fn, batch, state.tokens, state.levels, masked, t, key,
                            self.schedule, self.cfg)

  def estimates_from_state(self, apply_fn: ApplyFn, batch: base.Batch, state: base.NoisyState,
                           t: jax.Array) -> dict[str, jax.Array]:
    masked = state.levels == self.num_levels
    return level_blind_from_state(apply_fn, batch, state.tokens, state.levels, masked, t,
                                  self.schedule, self.cfg)

  def level_log_probs(self, apply_fn: ApplyFn, batch: base.Batch, state: base.NoisyState,
                      t: jax.Array) -> jax.Array:
    """Pass 1's log g [B, L, K] at a noisy state (prior correction and given state as in the
    loss); K = 1: zeros [B, L, 1]. Used by the level-accuracy diagnostics of tasks/."""
    _, _, given, _ = base.unpack(batch)
    return _pass1(_network(apply_fn, given, self.cfg), state.tokens, state.levels, t,
                  self.schedule, self.cfg)

  def check_sampling(self, cfg: SampleConfig) -> None:
    base.check_ordering(cfg, self.orderings, self.name)
    schedules.check_ordering(self.schedule, cfg.num_steps, self.check_ordering)
    hmdlm_sampler.check_config(self.schedule, cfg)
    if cfg.ordering == 'remdm':
      remdm_sampler.check_config(self.schedule, cfg)

  def sampler_init(self, apply_fn: ApplyFn, cfg: SampleConfig, *, batch_size: int,
                   seq_len: int, given_tokens: jax.Array | None = None,
                   given_levels: jax.Array | None = None,
                   given_mask: jax.Array | None = None) -> base.SamplerState:
    return hmdlm_sampler.init(apply_fn, self.schedule, cfg, batch_size=batch_size,
                              seq_len=seq_len, given_tokens=given_tokens,
                              given_levels=given_levels, given_mask=given_mask)

  def reverse_step(self, apply_fn: ApplyFn, cfg: SampleConfig, key: jax.Array,
                   state: base.SamplerState, n: jax.Array) -> base.SamplerState:
    if cfg.ordering == 'remdm':
      return remdm_sampler.reverse_step(apply_fn, self.schedule, cfg, key, state, n)
    return hmdlm_sampler.reverse_step(apply_fn, self.schedule, cfg, key, state, n)
