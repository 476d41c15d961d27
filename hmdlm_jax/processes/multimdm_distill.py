"""MultiMDM consistency distillation: the shared-Gumbel coupling (3.8) and the loss (3.11).

Paper: "Multi-Mask Diffusion Language Models for Few-Step Generation", Section 3.3, Algorithms
3–4, Appendices B and C.2; docs/method.md §13.2 states the method and our decisions. The distilled
network is the same clean-token head, f_{t,θ}(· | x̃_t) = x_θ(· | x̃_t); its few-step generator
(Algorithm 4, (3.12)) is the ancestral sampler of `multimdm.MultiMDM` with the distilled weights,
so this process only changes `loss` (and reads a target network θ̄: `target_params`).

One step (Algorithm 3, lines 4–7): δ = δ_k (`delta_at(step)`), t ~ U(δ, 1) stratified, s = t - δ;
the coupled pair (x̃_s, x̃_t) from one draw of Gumbels per example (clean token and M masks only);
the student f_t = x_θ(· | x̃_t) against the target f̄_s = x_θ̄(· | x̃_s) under stop-gradient:
a KL (forward or reverse) where x̃_s is still masked, -log f_t(x0) where it is a word, 0 where x̃_t
is visible. Normalised per loss position, with the token-weighted batch mean.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import chex
import jax
import jax.numpy as jnp

from hmdlm_jax import config as config_lib
from hmdlm_jax import optim
from hmdlm_jax.config import MultiMDMConfig
from hmdlm_jax.processes import base
from hmdlm_jax.processes import multimdm
from hmdlm_jax.processes import multimdm_math as mm

ApplyFn = base.ApplyFn


def delta_at(step: jax.Array | None, cfg: MultiMDMConfig) -> jax.Array:
  """δ_k = min(δ_0 · 2^floor(k / K_R), δ_max) (App. C.2's dyadic schedule; δ_max when step is
  None, e.g. evaluation of the loss outside training)."""
  if step is None:
    return jnp.asarray(cfg.delta_max, jnp.float32)
  rounds = jnp.floor_divide(jnp.asarray(step, jnp.int32), cfg.delta_double_every)
  delta = cfg.delta_init * jnp.exp2(jnp.minimum(rounds, 60).astype(jnp.float32))
  return jnp.minimum(delta, cfg.delta_max).astype(jnp.float32)


def coupled_pair(key: jax.Array, tokens: jax.Array, given: jax.Array, s: jax.Array,
                 t: jax.Array, sched: mm.MaskSchedule, des: mm.Designation
                 ) -> tuple[jax.Array, jax.Array]:
  """(x̃_s, x̃_t) [B, L] on one shared-Gumbel path per example ((3.8)); given positions stay."""
  chex.assert_rank((tokens, given), 2)
  keys = jax.random.split(key, tokens.shape[0])
  g_clean, g_masks = jax.vmap(lambda k: mm.draw_gumbels(k, tokens.shape[1:], des.num_masks))(
      keys)
  xs = mm.coupled_state(sched, des, tokens, g_clean, g_masks, s)
  xt = mm.coupled_state(sched, des, tokens, g_clean, g_masks, t)
  given = given.astype(bool)
  return jnp.where(given, tokens, xs), jnp.where(given, tokens, xt)


def consistency_terms(student_logits: jax.Array, target_logits: jax.Array, tokens: jax.Array,
                      xs: jax.Array, xt: jax.Array, loss_mask: jax.Array, num_words: int,
                      direction: str) -> dict[str, jax.Array]:
  """Per-example (3.11) terms (docs/method.md §13.2), normalised per loss position.

  Args:
    student_logits, target_logits: [B, L, V + M] at (x̃_t, t) and (x̃_s, s).
    tokens: [B, L] clean words; xs, xt: [B, L] coupled states; loss_mask [B, L] bool.
    direction: 'forward' | 'reverse'.
  Returns:
    'kl' (both masked), 'ce' (masked at t, revealed at s) [B] and 'jumped' [B, L] bool.
  """
  chex.assert_equal_shape((tokens, xs, xt, loss_mask))
  log_f = multimdm.word_log_probs(student_logits, num_words)
  log_g = jax.lax.stop_gradient(multimdm.word_log_probs(target_logits, num_words))
  masked_t = (xt >= num_words) & loss_mask.astype(bool)
  both = masked_t & (xs >= num_words)
  jumped = masked_t & (xs < num_words)
  if direction == 'forward':
    kl = jnp.sum(jnp.exp(log_g) * (log_g - log_f), axis=-1)
  else:
    kl = jnp.sum(jnp.exp(log_f) * (log_f - log_g), axis=-1)
  ce = multimdm.word_nll(student_logits, tokens, num_words)
  n = jnp.maximum(loss_mask.astype(bool).sum(-1), 1).astype(log_f.dtype)
  zero = jnp.zeros_like(kl)
  return dict(kl=jnp.where(both, kl, zero).sum(-1) / n,
              ce=jnp.where(jumped, ce, zero).sum(-1) / n, jumped=jumped)


@dataclasses.dataclass(frozen=True)
class MultiMDMDistill(multimdm.MultiMDM):
  """MultiMDM (M = 1: MDLM) under consistency distillation (Algorithm 3); sampling, bound and
  forward process are MultiMDM's."""

  name: ClassVar[str] = 'multimdm'

  @property
  def uses_target(self) -> bool:
    return True

  def target_params(self, params: Any, ema_params: Any, opt_state: Any) -> Any:
    """θ̄ of `process.multimdm.target` (docs/method.md §13.2): the EMA, or with 'frozen_rounds'
    the round's copy of the student that `optim.frozen_target` keeps in the optimiser state."""
    if self.cfg.steps_per_round:
      return optim.round_target(opt_state, params, self.cfg.steps_per_round)
    return ema_params

  def loss(self, apply_fn: ApplyFn, batch: base.Batch, key: jax.Array, *,
           step: jax.Array | None = None, target_apply_fn: ApplyFn | None = None
           ) -> tuple[jax.Array, dict[str, Any]]:
    """(3.11) on the shared-Gumbel pair at step size δ_k (Algorithm 3 lines 4-7)."""
    if target_apply_fn is None:
      raise ValueError('MultiMDM distillation needs the target network (target_apply_fn); '
                       'the train step passes it when process.uses_target is True.')
    tokens, levels, given, loss_mask = base.unpack(batch)
    k_t, k_g = jax.random.split(key)
    delta = delta_at(step, self.cfg)
    u = base.sample_times(k_t, tokens.shape[0], t_min=0.0, antithetic=self.cfg.antithetic)
    t = delta + (1.0 - delta) * u
    s = jnp.maximum(t - delta, 0.0)
    xs, xt = coupled_pair(k_g, tokens, given, s, t, self.sched, self.des)
    zeros = jnp.zeros_like(levels)
    student = apply_fn(xt, zeros, t, heads=('token',))['token']
    target = jax.lax.stop_gradient(target_apply_fn(xs, zeros, s, heads=('token',))['token'])
    terms = consistency_terms(student, target, tokens, xs, xt, loss_mask, self.num_words,
                              self.cfg.distill_kl)
    kl = base.token_weighted_mean(terms['kl'], loss_mask)
    ce = base.token_weighted_mean(terms['ce'], loss_mask)
    loss = kl + ce
    n_loss = jnp.maximum(loss_mask.sum(), 1).astype(jnp.float32)
    metrics = dict(loss=loss, kl=kl, ce=ce, delta=delta,
                   mask_rate=((xt >= self.num_words) & loss_mask).sum() / n_loss,
                   jump_rate=terms['jumped'].sum() / n_loss,
                   num_loss_tokens=loss_mask.sum().astype(jnp.float32))
    metrics['finite'] = jnp.all(jnp.isfinite(jnp.stack([loss, kl, ce]))).astype(jnp.float32)
    return loss.astype(jnp.float32), {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


def build(config: config_lib.Config) -> multimdm.MultiMDM:
  """MultiMDM of a resolved config: the distillation process when `process.multimdm.distill`."""
  proc = multimdm.build(config)
  if not proc.cfg.distill:
    return proc
  return MultiMDMDistill(proc.sched, proc.des, proc.cfg)


def make(num_words: int, num_masks: int, **kw: Any) -> multimdm.MultiMDM:
  """`multimdm.make` that honours `distill=True` (tests, toys)."""
  proc = multimdm.make(num_words, num_masks, **kw)
  return MultiMDMDistill(proc.sched, proc.des, proc.cfg) if proc.cfg.distill else proc
