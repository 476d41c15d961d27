"""MGDM: MDLM trained with a token-level difficulty reweighting (docs/method.md §13.3).

Ye et al., "Beyond Autoregression: Discrete Diffusion for Complex Reasoning and Planning" (ICLR
2025), eq. 8: L = Σ w(t) · v · u over the masked positions, u = -log f[x0] the cross-entropy and
v = α (1 - e^{-u})^γ the focal factor (not detached: its gradient is part of the loss). The
forward process, the network, the rigorous bound (`bound_from_state`: MDLM's NELBO) and the
ancestral / confidence samplers are MDLM's (HMDLM with K = 1); only the training loss and the
'remask' decoding (`mgdm_sampler`) are MGDM's. Times, weights and normalisation: §13.3.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import chex
import jax
import jax.numpy as jnp

from hmdlm_jax import config as config_lib
from hmdlm_jax.config import LossConfig
from hmdlm_jax.config import MGDMConfig
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.models import token_head
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import mgdm_sampler
from hmdlm_jax.processes import parameterization
from hmdlm_jax.processes import schedules
from hmdlm_jax.processes.schedules import Schedule

ApplyFn = base.ApplyFn


def token_weight(nll: jax.Array, alpha: float, gamma: float) -> jax.Array:
  """MGDM's token-level weight v = α (1 - e^{-u})^γ = α (1 - p_correct)^γ, elementwise."""
  return alpha * jnp.maximum(-jnp.expm1(-nll), 0.0) ** gamma


def time_weight(t: jax.Array, hazard: jax.Array, cfg: MGDMConfig) -> jax.Array:
  """The sequence-level weight w(t) [B] (docs/method.md §13.3).

  'linear': 1 + T(1 - t), which is MGDM's T - k at t = (k + 1)/T; 'elbo': MDLM's λ'(t) =
  -α'/(1 - α) (`hazard`, [B]; 1/t for the log-linear schedule, T times MGDM's 'original'
  1/(k + 1)); 'none': 1.
  """
  chex.assert_equal_shape((t, hazard))
  if cfg.time_weighting == 'elbo':
    return hazard
  if cfg.time_weighting == 'linear':
    return 1.0 + cfg.diffusion_steps * (1.0 - t)
  return jnp.ones_like(t)


def draw_times(key: jax.Array, batch_size: int, loss_cfg: LossConfig,
               cfg: MGDMConfig) -> jax.Array:
  """t [B]: MDLM's stratified U(t_min, 1) when diffusion_steps = 0, else MGDM's grid t = (k + 1)/T
  with k ~ U{0..T-1} (stratified across the batch like MDLM's times when loss.antithetic)."""
  if cfg.diffusion_steps == 0:
    return base.sample_times(key, batch_size, t_min=loss_cfg.t_min,
                             antithetic=loss_cfg.antithetic)
  steps = cfg.diffusion_steps
  v = base.sample_times(key, batch_size, t_min=0.0, antithetic=loss_cfg.antithetic)
  k = jnp.minimum(jnp.floor(v * steps), steps - 1)
  return (k + 1.0) / steps


def weighted_sums(tok_nll: jax.Array, sel: jax.Array, t: jax.Array, hazard: jax.Array,
                  cfg: MGDMConfig) -> jax.Array:
  """Σ_{i in sel} w(t) · v_i · u_i per example: [B] from u = -log f[x0] [B, L], sel [B, L]."""
  chex.assert_equal_shape((tok_nll, sel))
  u = jnp.where(sel, tok_nll, 1.0)  # a finite u off `sel`: no NaN gradient through v there
  v = token_weight(u, cfg.alpha, cfg.gamma) if cfg.token_reweighting else jnp.ones_like(u)
  w = time_weight(t, hazard, cfg)[:, None]
  return jnp.where(sel, w * v * u, 0.0).sum(-1)


def token_nll(apply_fn: ApplyFn, tokens: jax.Array, xt: jax.Array, ht: jax.Array, t: jax.Array,
              sel: jax.Array, loss_cfg: LossConfig) -> jax.Array:
  """-log f[x0] [B, L] from one token call on (x_t, h_t), dense or at `sel` only (token_rows)."""
  if loss_cfg.token_rows == 'selected':
    query = token_head.TokenQuery(tokens, sel, loss_cfg.mask_id)
    return apply_fn(xt, ht, t, heads=('token_nll',), token_query=query)['token_nll']
  logits = apply_fn(xt, ht, t, heads=('token',))['token']
  return parameterization.token_nll(logits, tokens, mask_id=loss_cfg.mask_id)


def normaliser(sel: jax.Array, loss_mask: jax.Array, cfg: MGDMConfig) -> jax.Array:
  """The loss's denominator (float32 []): the batch's masked loss positions ('masked', MGDM's
  code) or all its loss positions ('positions', MDLM's token-weighted mean); at least 1."""
  den = sel.sum() if cfg.normalisation == 'masked' else loss_mask.sum()
  return jnp.maximum(den.astype(jnp.float32), 1.0)


def sums_from_state(apply_fn: ApplyFn, batch: Mapping[str, Any], xt: jax.Array, ht: jax.Array,
                    masked: jax.Array, t: jax.Array, schedule: Schedule, loss_cfg: LossConfig,
                    cfg: MGDMConfig) -> dict[str, jax.Array]:
  """MGDM's objective at a given corruption (xt, ht, masked [B, L]) and time t [B].

  Returns 'sums' [B] (Σ_{masked loss i} w v u), 'nll' [B, L] (u), 'sel' [B, L] (masked loss
  positions) and 'hazard' [B] (MDLM's λ'(t)).
  """
  tokens, _, _, loss_mask = base.unpack(batch)
  chex.assert_equal_shape((tokens, xt, ht, masked))
  sel = masked & loss_mask
  hazard = schedule.hazard(t)[:, 0]  # K = 1
  u = token_nll(apply_fn, tokens, xt, ht, t, sel, loss_cfg)
  return dict(sums=weighted_sums(u, sel, t, hazard, cfg), nll=u, sel=sel, hazard=hazard)


def mgdm_loss(apply_fn: ApplyFn, batch: Mapping[str, Any], key: jax.Array, schedule: Schedule,
              loss_cfg: LossConfig, cfg: MGDMConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
  """MGDM's training loss (eq. 8): Σ_b sums_b / `normaliser`, and metrics (float32 scalars).

  The key splits as MDLM's (`k_t, k_mask, _ = split(key, 3)`), so with token_reweighting off,
  time_weighting='elbo', normalisation='positions' and diffusion_steps=0 the loss is MDLM's on
  the same batch and key. Metrics: 'loss', 'nelbo' (MDLM's token term at the same z_t),
  'token_nll' (mean u over masked loss positions), 'token_weight' (mean v there), 'mask_rate',
  'num_loss_tokens', 'finite'.
  """
  tokens, levels, given, loss_mask = base.unpack(batch)
  k_t, k_mask, _ = jax.random.split(key, 3)
  t = draw_times(k_t, tokens.shape[0], loss_cfg, cfg)
  xt, ht, masked = hmdlm.corrupt(k_mask, tokens, levels, given, t, schedule,
                                 mask_id=loss_cfg.mask_id)
  out = sums_from_state(apply_fn, batch, xt, ht, masked, t, schedule, loss_cfg, cfg)
  u, sel = out['nll'], out['sel']
  loss = out['sums'].sum().astype(jnp.float32) / normaliser(sel, loss_mask, cfg)
  n_sel = jnp.maximum(sel.sum().astype(jnp.float32), 1.0)
  n_loss = loss_mask.sum().astype(jnp.float32)
  u_sel = jnp.where(sel, u, 0.0)
  v = (token_weight(jnp.where(sel, u, 1.0), cfg.alpha, cfg.gamma) if cfg.token_reweighting
       else jnp.ones_like(u))
  v = jnp.where(sel, v, 0.0)
  metrics = dict(
      loss=loss,
      nelbo=(out['hazard'][:, None] * u_sel).sum().astype(jnp.float32) / jnp.maximum(n_loss, 1.0),
      token_nll=u_sel.sum().astype(jnp.float32) / n_sel,
      token_weight=v.sum().astype(jnp.float32) / n_sel,
      mask_rate=sel.sum().astype(jnp.float32) / jnp.maximum(n_loss, 1.0), num_loss_tokens=n_loss)
  metrics['finite'] = jnp.isfinite(loss).astype(jnp.float32)
  return loss.astype(jnp.float32), {k: v.astype(jnp.float32) for k, v in metrics.items()}


@dataclasses.dataclass(frozen=True)
class MGDM(hmdlm.HMDLM):
  """MGDM behind the `Process` interface: HMDLM with K = 1 (MDLM) and MGDM's loss and decoding.

  Attributes (beyond HMDLM's): mgdm, the loss settings of `process.mgdm`.
  """
  mgdm: MGDMConfig = MGDMConfig()

  name: ClassVar[str] = 'mgdm'
  orderings: ClassVar[tuple[str, ...]] = ('ancestral', 'confidence', 'remask')

  def __post_init__(self) -> None:
    super().__post_init__()
    if self.num_levels != 1:
      raise ValueError(f"process.kind='mgdm' is MDLM with a reweighted loss: set "
                       f'model.num_levels=1 (got {self.num_levels}).')

  def loss(self, apply_fn: ApplyFn, batch: base.Batch, key: jax.Array, *,
           step: jax.Array | None = None, target_apply_fn: ApplyFn | None = None
           ) -> tuple[jax.Array, dict[str, jax.Array]]:
    del step, target_apply_fn
    return mgdm_loss(apply_fn, batch, key, self.schedule, self.cfg, self.mgdm)

  def reverse_step(self, apply_fn: ApplyFn, cfg: SampleConfig, key: jax.Array,
                   state: base.SamplerState, n: jax.Array) -> base.SamplerState:
    if cfg.ordering == 'remask':
      return mgdm_sampler.reverse_step(apply_fn, cfg, key, state, n)
    return super().reverse_step(apply_fn, cfg, key, state, n)


def from_config(config: config_lib.Config) -> MGDM:
  """The MGDM process of a resolved config (`process.mgdm`, `schedule`, `loss`, `model`)."""
  schedule = schedules.schedule_from_config(config.schedule, config.model.num_levels)
  return MGDM(schedule, LossConfig.from_config(config),
              check_ordering=config.schedule.check_ordering,
              mgdm=MGDMConfig.from_config(config))


__all__ = ['MGDM', 'from_config', 'mgdm_loss', 'normaliser', 'sums_from_state', 'time_weight',
           'token_weight', 'weighted_sums']
