"""HDLM's reverse process: MASK -> cluster -> word jumps on the time grid (docs/method.md §13.1).

The chain runs n = T..1 with t = n/T, s = (n-1)/T inside ONE `jax.lax.scan` (`base.run_chain` over
`reverse_step`), one network call per step. Whether a position moves is decided by uniforms
before the call, since the jump probabilities ('first_order', the authors' default, or the exact
per-position 'posterior') do not depend on the network; what it moves to comes from the token
head: a MASK position draws a cluster (from P_θ, from Q_θ with `cluster_draw='perturbed'`, or from
the auxiliary head with 'aux'), a cluster position a word from the forced law. The last step turns
every MASK and cluster position into a word (`final_step` 'argmax' or 'sample'). Decoded words are
never changed; given positions start as words. With `use_cache` a step in which no position of
the batch moves skips the call (exact); `nfe` counts the calls that ran. The jump probabilities,
the draws and the temperature: docs/method.md §13.1 ("Sampler").
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.config import HDLMConfig
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hdlm_core
from hmdlm_jax.processes.hdlm_core import ClusterLayout
from hmdlm_jax.processes.hdlm_core import HDLMSchedule

ApplyFn = base.ApplyFn


def check_config(layout: ClusterLayout, cfg: SampleConfig) -> None:
  """The sampler settings must fit HDLM (ValueError naming the field)."""
  if cfg.num_levels != 1:
    raise ValueError(f'HDLM has no position levels: model.num_levels must be 1, got '
                     f'{cfg.num_levels}.')
  if cfg.mask_id != layout.mask_id:
    raise ValueError(f'model.mask_id={cfg.mask_id} but the HDLM layout has MASK = '
                     f'{layout.mask_id}.')
  if cfg.ordering != 'ancestral':
    raise ValueError(f"sample.ordering={cfg.ordering!r}: HDLM samples by its jump probabilities "
                     "only ('ancestral').")


def _check_int(field: str, value: Any, *, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f'{field} must be an integer >= {minimum}, got {value!r}.')


def init(layout: ClusterLayout, cfg: SampleConfig, *, batch_size: int, seq_len: int,
         given_tokens: jax.Array | None = None,
         given_mask: jax.Array | None = None) -> base.SamplerState:
  """All MASK (given positions: their words, `reveal_step` T + 1); no process-specific carry."""
  check_config(layout, cfg)
  _check_int('batch_size', batch_size, minimum=1)
  _check_int('seq_len', seq_len, minimum=1)
  shape = (batch_size, seq_len)
  x = jnp.full(shape, layout.mask_id, jnp.int32)
  given = jnp.zeros(shape, bool)
  if given_mask is not None:
    if given_tokens is None:
      raise ValueError('sample: given_mask needs given_tokens [B, L] int32.')
    chex.assert_shape([given_tokens, given_mask], shape)
    if not any(isinstance(a, jax.core.Tracer) for a in (given_tokens, given_mask)):
      gt = np.asarray(given_tokens)[np.asarray(given_mask, bool)]
      if gt.size and (gt.min() < 0 or gt.max() >= layout.vocab_size
                      or np.any(layout.cluster_of[gt] < 0)):
        raise ValueError('sample: given_tokens must be words (not MASK or cluster tokens) at '
                         'given positions.')
    given = jnp.asarray(given_mask, bool)
    x = jnp.where(given, jnp.asarray(given_tokens, jnp.int32), x)
  elif given_tokens is not None:
    raise ValueError('sample: given_tokens needs given_mask [B, L] bool.')
  reveal = jnp.where(given, cfg.num_steps + 1, 0).astype(jnp.int32)
  zero = jnp.zeros((), jnp.int32)
  return base.SamplerState(x, jnp.zeros(shape, jnp.int32), reveal, zero, zero, ())


def jump_probs(schedule: HDLMSchedule, s: jax.Array, t: jax.Array, sampler: str,
               is_last: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(MASK -> cluster, MASK -> word, cluster -> word) probabilities of one step t -> s."""
  mt, ms = schedule.marginals(t), schedule.marginals(s)
  safe = lambda v: jnp.where(v > 0, v, 1.0)
  if sampler == 'first_order':
    p_mc = jnp.where(mt.beta_m > 0, (mt.beta_m - ms.beta_m) / safe(mt.beta_m), 0.0)
    p_mw = jnp.zeros_like(p_mc)
    p_cw = jnp.where(mt.beta_c > 0, (ms.alpha - mt.alpha) / safe(mt.beta_c), 1.0)
  else:
    stay_c = ms.beta_c * schedule.cluster_survival(s, t)
    p_mc = jnp.where(mt.beta_m > 0, (ms.beta_c - stay_c) / safe(mt.beta_m), 0.0)
    p_mw = jnp.where(mt.beta_m > 0, (mt.beta_m - ms.beta_m - ms.beta_c + stay_c)
                     / safe(mt.beta_m), 0.0)
    p_cw = jnp.where(mt.beta_c > 0, 1.0 - stay_c / safe(mt.beta_c), 1.0)
  clip = lambda p: jnp.clip(p, 0.0, 1.0)
  p_mc, p_mw, p_cw = clip(p_mc), clip(p_mw), clip(p_cw)
  one, zero = jnp.ones_like(p_mc), jnp.zeros_like(p_mc)
  return (jnp.where(is_last, zero, p_mc), jnp.where(is_last, one, p_mw),
          jnp.where(is_last, one, p_cw))


def reverse_step(apply_fn: ApplyFn, schedule: HDLMSchedule, layout: ClusterLayout,
                 hcfg: HDLMConfig, cfg: SampleConfig, key: jax.Array, state: base.SamplerState,
                 n: jax.Array) -> base.SamplerState:
  """One step t = n/T -> s = (n-1)/T (module docstring)."""
  x, levels, reveal, nfe, nan_calls = state[:5]
  batch_size = x.shape[0]
  k_move, k_tok, k_pert = jax.random.split(jax.random.fold_in(key, n), 3)
  t = n.astype(jnp.float32) / cfg.num_steps
  s = (n - 1).astype(jnp.float32) / cfg.num_steps
  is_last = n == 1
  p_mc, p_mw, p_cw = jump_probs(schedule, s, t, hcfg.sampler, is_last)
  r = jax.random.uniform(k_move, x.shape, jnp.float32)
  is_m, is_c = layout.is_mask(x), layout.is_cluster(x)
  to_cluster = is_m & (r < p_mc)
  to_word = (is_m & (r >= p_mc) & (r < p_mc + p_mw)) | (is_c & (r < p_cw))
  final_argmax = is_last & (hcfg.final_step == 'argmax')

  aux = hcfg.cluster_draw == 'aux'

  def move() -> tuple[jax.Array, jax.Array]:
    out = apply_fn(x, levels, jnp.full((batch_size,), t, jnp.float32),
                   heads=('token', 'cluster') if aux else ('token',))
    logits = out['token']
    chex.assert_shape(logits, x.shape + (layout.vocab_size,))
    nan = jnp.any(jnp.isnan(logits))
    log_xhat = hdlm_core.word_log_probs(logits, layout)
    p = hdlm_core.cluster_probs(log_xhat, layout)
    forced = hdlm_core.forced_log_probs(log_xhat, layout.state_cluster(x), layout,
                                        force=hcfg.force, xi=hcfg.xi)
    law = jnp.where(is_c[..., None], forced, log_xhat)  # [B, L, V]
    v = jnp.where(final_argmax, jnp.argmax(law, axis=-1).astype(jnp.int32),
                  base.draw_tokens(k_tok, law, cfg))
    if aux:
      aux_logits = out['cluster']
      chex.assert_shape(aux_logits, x.shape + (layout.num_clusters,))
      nan = nan | jnp.any(jnp.isnan(aux_logits))
      c_new = base.draw_tokens(k_pert, jax.nn.log_softmax(aux_logits, axis=-1), cfg)
    elif cfg.greedy:
      c_new = jnp.argmax(p, axis=-1).astype(jnp.int32)
    else:
      c_new = jnp.maximum(layout.word_cluster(v), 0)
      if hcfg.cluster_draw == 'perturbed' and hcfg.xi < 1.0:
        num = layout.num_clusters
        w = jax.random.uniform(k_pert, x.shape, jnp.float32)
        j = jnp.clip(jnp.floor((w - hcfg.xi) / (1.0 - hcfg.xi) * (num - 1)), 0, num - 2)
        j = j.astype(jnp.int32)
        c_new = jnp.where(w < hcfg.xi, c_new, j + (j >= c_new))
    new_x = jnp.where(to_cluster, layout.cluster_token(c_new), jnp.where(to_word, v, x))
    return new_x.astype(jnp.int32), nan

  if cfg.use_cache:
    any_move = jnp.any(to_cluster | to_word)
    new_x, nan = jax.lax.cond(any_move, move, lambda: (x, jnp.zeros((), bool)))
    nfe = nfe + any_move.astype(jnp.int32)
  else:
    new_x, nan = move()
    nfe = nfe + 1
  reveal = jnp.where(to_word, n, reveal)
  return base.SamplerState(new_x, levels, reveal, nfe, nan_calls + nan.astype(jnp.int32),
                           state.extra)
