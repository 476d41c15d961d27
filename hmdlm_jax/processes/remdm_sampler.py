"""ReMDM's remasking sampler for the K = 1 processes (`sample.ordering='remdm'`; MDLM, ADLM).

Wang et al., "Remasking Discrete Diffusion Models with Inference-Time Scaling" (2025), as ADLM's
remasking results run it (docs/method.md §13.5). Step t -> s on MDLM's grid, per non-given
position, with the remasking probability σ_t ∈ [0, σ_max], σ_max = min(1, (1 - α_s)/α_t):
a decoded token becomes MASK w.p. σ_t; a MASK becomes a token v w.p.
(α_s - (1 - σ_t) α_t)/(1 - α_t) · p_θ(v | z_t). σ_t = 0 is MDLM's locked-in step, with the same
key use, so η = 0 draws MDLM's samples exactly. The state is MDLM's (`hmdlm_sampler.init`).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from hmdlm_jax.config import SampleConfig
from hmdlm_jax.processes import base
from hmdlm_jax.processes import parameterization
from hmdlm_jax.processes.schedules import Schedule

ApplyFn = base.ApplyFn


def check_config(schedule: Schedule, cfg: SampleConfig) -> None:
  """ReMDM's step is written for one level: refuse K > 1 (ValueError naming the field)."""
  if cfg.num_levels != 1 or schedule.num_levels != 1:
    raise ValueError(f"sample.ordering='remdm' remasks MDLM's one-level chain: it needs "
                     f'model.num_levels=1 (got {cfg.num_levels}); use ancestral or confidence '
                     'ordering for K > 1.')


def loop_one_minus_alpha(t: jax.Array, cfg: SampleConfig) -> jax.Array:
  """1 - α(t) of the 'loop' schedule (elementwise, float32): α rises linearly from 0 at t = 1 to
  α_on at t_on, is held at α_on down to t_off, then rises linearly to 1 at t = 0 (§13.5)."""
  t = jnp.asarray(t, jnp.float32)
  a_on, t_on, t_off = cfg.remdm_alpha_on, cfg.remdm_t_on, cfg.remdm_t_off
  early = 1.0 - (1.0 - t) * (a_on / (1.0 - t_on))
  late = t * ((1.0 - a_on) / t_off)
  return jnp.where(t > t_on, early, jnp.where(t > t_off, 1.0 - a_on, late))


def one_minus_alpha(t: jax.Array, schedule: Schedule, cfg: SampleConfig) -> jax.Array:
  """1 - α(t) the step uses: the loop's own α for 'loop', else the process's schedule (K = 1)."""
  if cfg.remdm_schedule == 'loop':
    return loop_one_minus_alpha(t, cfg)
  return schedule.one_minus_alpha(jnp.asarray(t, jnp.float32))[..., 0]


def sigma(s: jax.Array, t: jax.Array, schedule: Schedule, cfg: SampleConfig) -> jax.Array:
  """σ_t of the step t -> s (float32, the shape of t): 'cap' min(η, σ_max), 'rescale' η·σ_max,
  'loop' min(η, σ_max) for t in (t_off, t_on] and 0 elsewhere (σ_max = η there when
  η ≤ (1 - α_on)/α_on, which the config checks)."""
  om_s, om_t = one_minus_alpha(s, schedule, cfg), one_minus_alpha(t, schedule, cfg)
  alpha_t = 1.0 - om_t
  # α_t = 0 (nothing decoded yet): any σ is allowed; ReMDM's code takes σ_max = 1 there.
  sigma_max = jnp.where(alpha_t > 0, jnp.minimum(1.0, om_s / jnp.where(alpha_t > 0, alpha_t, 1.0)),
                        1.0)
  eta = jnp.float32(cfg.remdm_eta)
  if cfg.remdm_schedule == 'rescale':
    return eta * sigma_max
  capped = jnp.minimum(eta, sigma_max)
  if cfg.remdm_schedule == 'cap':
    return capped
  t = jnp.asarray(t, jnp.float32)
  return jnp.where((t > cfg.remdm_t_off) & (t <= cfg.remdm_t_on), capped, 0.0)


def step_probs(s: jax.Array, t: jax.Array, schedule: Schedule, cfg: SampleConfig
               ) -> tuple[jax.Array, jax.Array]:
  """(p_remask, p_fill) of the step t -> s: a decoded position becomes MASK w.p. p_remask = σ_t, a
  masked one is filled from p_θ w.p. p_fill = (α_s - (1 - σ_t) α_t)/(1 - α_t), in [0, 1]."""
  om_s, om_t = one_minus_alpha(s, schedule, cfg), one_minus_alpha(t, schedule, cfg)
  sig = sigma(s, t, schedule, cfg)
  safe = jnp.where(om_t > 0, om_t, 1.0)
  # (1 - α_t) - (1 - α_s) + σ α_t: at σ = 0 the same float operations as MDLM's reveal
  # probability (schedules.reveal_prob), so η = 0 reproduces its draws bit for bit.
  fill = jnp.where(om_t > 0, (om_t - om_s + sig * (1.0 - om_t)) / safe, 0.0)
  return sig, jnp.clip(fill, 0.0, 1.0)


def reverse_step(apply_fn: ApplyFn, schedule: Schedule, cfg: SampleConfig, key: jax.Array,
                 state: base.SamplerState, n: jax.Array) -> base.SamplerState:
  """One ReMDM step t = n/T -> s = (n-1)/T on MDLM's state (module docstring).

  The network is called on z_t (at the grid time t, as ReMDM's code) only when a masked position
  is filled (with `cfg.use_cache`; every step without). Nothing is cached across steps, so a
  remasked token is never read from a stale call. At n = 1, α_s = 1: σ = 0 and every masked
  position is drawn from p_θ, MDLM's last step (§7).
  """
  x, h, reveal, nfe, nan_calls = state[:5]
  chex.assert_rank((x, h, reveal), 2)
  batch_size = x.shape[0]
  given = reveal == cfg.num_steps + 1
  masked = (h == cfg.num_levels) & ~given
  step_key = jax.random.fold_in(key, n)
  k_fill, k_token = jax.random.split(step_key)  # MDLM's split (hmdlm_sampler.reverse_step)
  k_remask = jax.random.fold_in(step_key, 1)
  t = n.astype(jnp.float32) / cfg.num_steps
  s = (n - 1).astype(jnp.float32) / cfg.num_steps
  p_remask, p_fill = step_probs(s, t, schedule, cfg)

  # Fill or stay, per masked position, drawn as MDLM draws its reveal (one uniform by inverse CDF
  # over (fill, stay), the stay mass from the exponentiated log) so that σ = 0 is its chain.
  log_fill = base.log0(p_fill)
  log_stay = base.log0(1.0 - jnp.clip(jnp.exp(log_fill), 0.0, 1.0))
  logits = jnp.broadcast_to(jnp.stack([log_fill, log_stay]), x.shape + (2,))
  fill = masked & (base.categorical_icdf(k_fill, logits) == 0)
  remask = ~masked & ~given & (jax.random.uniform(k_remask, x.shape) < p_remask)

  t_b = jnp.full((batch_size,), t, jnp.float32)

  def draw() -> tuple[jax.Array, jax.Array]:
    logits_tok = apply_fn(x, h, t_b, heads=('token',))['token']
    chex.assert_rank(logits_tok, 3)
    nan = jnp.any(jnp.isnan(logits_tok))
    token_logp = parameterization.token_log_probs(logits_tok, x, mask_id=cfg.mask_id)
    return base.draw_tokens(k_token, token_logp, cfg), nan

  if cfg.use_cache:
    called = jnp.any(fill)
    new_tok, nan = jax.lax.cond(called, draw, lambda: (x, jnp.zeros((), bool)))
  else:
    called = jnp.ones((), bool)
    new_tok, nan = draw()
  new_x = jnp.where(remask, cfg.mask_id, jnp.where(fill, new_tok, x)).astype(jnp.int32)
  new_h = jnp.where(remask, cfg.num_levels, jnp.where(fill, 0, h)).astype(jnp.int32)
  reveal = jnp.where(remask, 0, jnp.where(fill, n, reveal)).astype(jnp.int32)
  return base.SamplerState(new_x, new_h, reveal, nfe + called.astype(jnp.int32),
                           nan_calls + nan.astype(jnp.int32), state.extra)


__all__ = ['check_config', 'loop_one_minus_alpha', 'one_minus_alpha', 'reverse_step', 'sigma',
           'step_probs']
