"""ADLM: the anchored diffusion LM (Rout, Caramanis, Shakkottai, NeurIPS 2025) as a `Process`.

The forward process, its corruption, the reported bound and the sampler are MDLM's (the K = 1
`hmdlm.HMDLM`), applied to the composite network x_ψ(y_φ(z_t)) that the model's 'token' head is
(models/anchor.py). Training adds the anchor term of the ANELBO, as the authors' code runs it:
  loss = Σ_l w(t) (-log x_ψ^l[x^l] · 1{z_t^l = MASK} + γ_k A_l · -log softmax(y_φ^l)[x^l]) / N
with w(t) the MDLM weight (1/t for the log-linear schedule), A_l the anchor mask (x^l occurs
<= τ times in its row, `prepare_batch` on the host: batch['anchors']), the anchor term at every
anchor loss position, masked or not, and γ_k = min(γ, k / R). γ = 0 is MDLM's loss exactly;
the reported bound is the denoiser's NELBO alone. docs/method.md §13.4 states the method, the
anchor rule and every decision.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax.config import ADLMConfig
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.data import text as text_data
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import hmdlm_terms
from hmdlm_jax.processes import parameterization
from hmdlm_jax.processes import schedules

ApplyFn = base.ApplyFn
HEADS = ('anchor', 'token')


def anchor_mask(tokens: np.ndarray, real: np.ndarray, tau: int) -> np.ndarray:
  """The anchor rule, host side: bool [..., L], True where the token occurs <= τ times among the
  row's real (non-padding) positions; the data's frequency rule (data/text.py), so HMDLM's
  level 1 and ADLM's anchors are one definition (docs/method.md §6, §13.4)."""
  return text_data.frequency_levels(tokens, real, tau).astype(bool)


def anchor_weight(cfg: ADLMConfig, step: jax.Array | None) -> jax.Array:
  """γ_k = min(γ, k / R) at optimiser step k (R = 0 or step None: γ), float32 []."""
  gamma = jnp.asarray(cfg.gamma, jnp.float32)
  if step is None or cfg.ramp_steps == 0:
    return gamma
  return jnp.minimum(gamma, jnp.asarray(step, jnp.float32) / cfg.ramp_steps)


def objective_terms(anchor_logits: jax.Array, token_logits: jax.Array, tokens: jax.Array,
                    anchors: jax.Array, masked: jax.Array, loss_mask: jax.Array,
                    hazard: jax.Array, *, mask_id: int) -> dict[str, jax.Array]:
  """The two ANELBO terms per example, normalised per loss position (docs/method.md §13.4).

  Args:
    anchor_logits, token_logits: [B, L, V] raw y_φ(z_t) and x_ψ(y_φ(z_t)) logits.
    tokens: [B, L] clean x; anchors, masked, loss_mask: [B, L] bool.
    hazard: [B, 1] the MDLM weight w(t) (schedules.Schedule.hazard with K = 1).
  Returns:
    'lm' [B] (MDLM's NELBO term, masked loss positions), 'anchor' [B] (w(t) Σ A_l c_l over anchor
    loss positions, c_l = -log softmax(y_φ^l)[x^l] over every column, MASK included), 'anchor_ce'
    [B, L] (c_l, meaningful at anchors).
  """
  chex.assert_rank((anchor_logits, token_logits), 3)
  chex.assert_equal_shape((tokens, anchors, masked, loss_mask))
  levels = jnp.zeros_like(tokens)
  nll = parameterization.token_nll(token_logits, tokens, mask_id=mask_id)
  lm = hmdlm_terms.lm_term(nll, levels, masked, loss_mask, hazard)['lm']
  logits = parameterization.f32(anchor_logits)
  ce = (jax.nn.logsumexp(logits, axis=-1)
        - jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0])
  sel = anchors.astype(bool) & loss_mask.astype(bool)
  n = jnp.maximum(loss_mask.astype(bool).sum(-1), 1).astype(hazard.dtype)
  # Select before multiplying so that a non-finite value off the anchors cannot leak (0 * inf).
  anchor = (hazard[:, :1] * jnp.where(sel, ce, 0.0)).sum(-1) / n
  return {'lm': lm, 'anchor': anchor, 'anchor_ce': ce}


@dataclasses.dataclass(frozen=True)
class ADLM(base.Process):
  """ADLM behind the `Process` interface; hashable (a static jit argument).

  Attributes:
    mdlm: the K = 1 HMDLM: corruption, the reported bound, the sampler.
    cfg: the `process.adlm` view (γ, τ, the γ ramp, t_min, MASK).
  """
  mdlm: hmdlm.HMDLM
  cfg: ADLMConfig

  name: ClassVar[str] = 'adlm'

  def __post_init__(self) -> None:
    if self.mdlm.num_levels != 1 or self.mdlm.cfg.mask_id != self.cfg.mask_id:
      raise ValueError('ADLM needs the one-level MDLM process with its MASK id.')

  @property
  def heads(self) -> tuple[str, ...]:
    return HEADS

  @property
  def kinks(self) -> tuple[float, ...]:
    return self.mdlm.kinks

  @property
  def extra_batch_keys(self) -> dict[str, Any]:
    return {'anchors': jnp.bool_}

  # ------------------------------------------------------------------------ forward process

  def prepare_batch(self, batch: base.Batch) -> dict[str, np.ndarray]:
    """MDLM's contract keys (levels 0) plus 'anchors' bool [B, L] (`anchor_mask` with τ over the
    row's non-padding positions: loss and given ones)."""
    out = self.mdlm.prepare_batch(batch)
    real = out['loss_mask'].astype(bool) | out['given'].astype(bool)
    out['anchors'] = anchor_mask(out['tokens'], real, self.cfg.tau)
    return out

  def corrupt(self, key: jax.Array, batch: base.Batch, t: jax.Array) -> base.NoisyState:
    return self.mdlm.corrupt(key, _mdlm_batch(batch), t)

  def log_marginal(self, state: base.NoisyState, clean: base.NoisyState,
                   t: jax.Array) -> jax.Array:
    return self.mdlm.log_marginal(state, clean, t)

  def state_candidates(self, clean: base.NoisyState) -> base.NoisyState:
    return self.mdlm.state_candidates(clean)

  # --------------------------------------------------------------------------- loss and bound

  def anelbo_from_state(self, apply_fn: ApplyFn, batch: base.Batch, state: base.NoisyState,
                        t: jax.Array, gamma: float | jax.Array | None = None
                        ) -> dict[str, jax.Array]:
    """The training objective at a given z_t, per example: 'lm', 'anchor', 'total' = lm +
    γ · anchor (γ = `gamma`, default the config's), 'num_tokens'. Deterministic."""
    tokens, _, _, loss_mask = base.unpack(batch)
    chex.assert_equal_shape((tokens, state.tokens))
    masked = state.tokens == self.cfg.mask_id
    out = apply_fn(state.tokens, state.levels, t, heads=HEADS)
    terms = objective_terms(out['anchor'], out['token'], tokens, _anchors(batch), masked,
                            loss_mask, self.mdlm.schedule.hazard(t), mask_id=self.cfg.mask_id)
    gamma = self.cfg.gamma if gamma is None else gamma
    return {'lm': terms['lm'], 'anchor': terms['anchor'],
            'total': terms['lm'] + gamma * terms['anchor'],
            'num_tokens': loss_mask.sum(-1).astype(terms['lm'].dtype)}

  def loss(self, apply_fn: ApplyFn, batch: base.Batch, key: jax.Array, *,
           step: jax.Array | None = None, target_apply_fn: ApplyFn | None = None
           ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """t ~ U(t_min, 1) (stratified), z_t ~ q as MDLM's loss draws them (same key split), one
    network call for both heads, the token-weighted mean of lm + γ_k · anchor."""
    del target_apply_fn
    tokens, _, given, loss_mask = base.unpack(batch)
    anchors = _anchors(batch)
    k_t, k_mask, _ = jax.random.split(key, 3)
    t = base.sample_times(k_t, tokens.shape[0], t_min=self.cfg.t_min,
                          antithetic=self.cfg.antithetic)
    levels = jnp.zeros_like(tokens)
    xt, ht, masked = hmdlm.corrupt(k_mask, tokens, levels, given, t, self.mdlm.schedule,
                                   mask_id=self.cfg.mask_id)
    out = apply_fn(xt, ht, t, heads=HEADS)
    terms = objective_terms(out['anchor'], out['token'], tokens, anchors, masked, loss_mask,
                            self.mdlm.schedule.hazard(t), mask_id=self.cfg.mask_id)
    lm = base.token_weighted_mean(terms['lm'], loss_mask)
    anchor = base.token_weighted_mean(terms['anchor'], loss_mask)
    gamma = anchor_weight(self.cfg, step)
    loss = lm + gamma * anchor
    sel, at_anchor = masked & loss_mask, anchors & loss_mask
    n_loss = loss_mask.sum().astype(jnp.float32)
    n_anchor = jnp.maximum(at_anchor.sum(), 1).astype(jnp.float32)
    metrics = dict(
        loss=loss, lm=lm, anchor=anchor, nelbo=lm, anchor_weight=gamma,
        anchor_ce=jnp.where(at_anchor, terms['anchor_ce'], 0.0).sum() / n_anchor,
        anchor_rate=at_anchor.sum().astype(jnp.float32) / jnp.maximum(n_loss, 1.0),
        mask_rate=sel.sum().astype(jnp.float32) / jnp.maximum(n_loss, 1.0),
        num_loss_tokens=n_loss)
    metrics['finite'] = jnp.all(jnp.isfinite(jnp.stack([loss, lm, anchor]))).astype(jnp.float32)
    return loss.astype(jnp.float32), {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

  def bound_from_state(self, apply_fn: ApplyFn, batch: base.Batch, state: base.NoisyState,
                       t: jax.Array, key: jax.Array) -> dict[str, jax.Array]:
    """The reported bound: MDLM's NELBO of x_ψ(y_φ(z_t)), no anchor term (as the authors
    evaluate); 'lm' = 'total' (nats per loss position), 'num_tokens'."""
    out = self.mdlm.bound_from_state(apply_fn, _mdlm_batch(batch), state, t, key)
    return {'lm': out['lm'], 'total': out['lm'], 'num_tokens': out['num_tokens']}

  # --------------------------------------------------------------------------------- sampling

  def check_sampling(self, cfg: SampleConfig) -> None:
    self.mdlm.check_sampling(cfg)

  def sampler_init(self, apply_fn: ApplyFn, cfg: SampleConfig, *, batch_size: int,
                   seq_len: int, given_tokens: jax.Array | None = None,
                   given_levels: jax.Array | None = None,
                   given_mask: jax.Array | None = None) -> base.SamplerState:
    return self.mdlm.sampler_init(apply_fn, cfg, batch_size=batch_size, seq_len=seq_len,
                                  given_tokens=given_tokens, given_levels=given_levels,
                                  given_mask=given_mask)

  def reverse_step(self, apply_fn: ApplyFn, cfg: SampleConfig, key: jax.Array,
                   state: base.SamplerState, n: jax.Array) -> base.SamplerState:
    """MDLM's step with x_ψ(y_φ(z_t)): locked-in (the anchored step with σ_t = 0), or ReMDM's
    remasking step with σ_t > 0 for `sample.ordering='remdm'` (docs/method.md §13.5)."""
    return self.mdlm.reverse_step(apply_fn, cfg, key, state, n)


def _mdlm_batch(batch: base.Batch) -> dict[str, jax.Array]:
  """The batch as the one-level MDLM reads it: levels 0 (ADLM's anchors are no levels)."""
  out = {k: batch[k] for k in base.BATCH_KEYS}
  out['levels'] = jnp.zeros_like(jnp.asarray(batch['levels']))
  return out


def _anchors(batch: base.Batch) -> jax.Array:
  if 'anchors' not in batch:
    raise ValueError("ADLM reads batch['anchors'] (bool [B, L]): pass the pipeline batch through "
                     'process.prepare_batch first.')
  anchors = jnp.asarray(batch['anchors']).astype(bool)
  chex.assert_rank(anchors, 2)
  return anchors


def build(config: config_lib.Config) -> ADLM:
  """The ADLM process of a resolved config (its MDLM part from `schedule` and `loss`)."""
  cfg = ADLMConfig._view(config)  # pylint: disable=protected-access
  schedule = schedules.schedule_from_config(config.schedule, 1)
  loss_cfg = dataclasses.replace(config_lib.LossConfig.from_config(config), token_rows='all')
  return ADLM(hmdlm.HMDLM(schedule, loss_cfg, check_ordering=config.schedule.check_ordering), cfg)


def make(schedule: schedules.Schedule, *, mask_id: int, **kw: float) -> ADLM:
  """A process without an experiment config (tests, toys): ADLMConfig fields as keywords."""
  loss_cfg = config_lib.LossConfig(mask_id=mask_id, num_levels=1, token_rows='all',
                                   t_min=kw.get('t_min', 1e-3))
  return ADLM(hmdlm.HMDLM(schedule, loss_cfg), ADLMConfig(mask_id=mask_id, **kw))


__all__ = ['ADLM', 'HEADS', 'anchor_mask', 'anchor_weight', 'build', 'make', 'objective_terms']
