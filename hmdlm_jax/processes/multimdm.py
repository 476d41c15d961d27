"""MultiMDM: the multi-mask forward process, its objective (3.5)/(3.6) and ancestral sampler (3.7).

Paper: "Multi-Mask Diffusion Language Models for Few-Step Generation" (Section 3, Algorithms 1–2,
Appendix A); docs/method.md §13.2 states the method, derives the objective and lists our
decisions. The closed forms live in `multimdm_math`; consistency distillation (Algorithm 3) in
`multimdm_distill`.

Ids: words 0..V-1, masks V..V+M-1 (the network's vocab_size counts V + M rows; the word head is the
log-softmax over the first V columns). No hierarchy levels: the level input is 0 everywhere. M = 1
is MDLM exactly (same draws, same loss: tests/test_multimdm.py). The loss is (3.6)'s
reconstruction term plus its identification term under the curriculum's weight, per loss position
with the token-weighted batch mean; the bound always weighs identification by 1. The sampler
draws a clean-token hypothesis, then moves by the kernel (3.4); `sample.ordering='confidence'`
reveals the most confident masked positions instead (docs/method.md §13.2).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax import storage
from hmdlm_jax.config import MultiMDMConfig
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.processes import base
from hmdlm_jax.processes import multimdm_math as mm
from hmdlm_jax.processes.multimdm_math import Designation
from hmdlm_jax.processes.multimdm_math import MaskSchedule

ApplyFn = base.ApplyFn
_ICDF_MAX = 64


# ------------------------------------------------------------------------------------ head


def word_nll(token_logits: jax.Array, tokens: jax.Array, num_words: int) -> jax.Array:
  """-log x_θ(x0): [B, L, V + M] logits, [B, L] words -> [B, L] float32 (fused, as SUBS's).

  logsumexp over the word columns (mask columns removed by an additive -inf bias) minus the gold
  logit; for M = 1 this is `parameterization.token_nll` with mask_id = V, operation for operation.
  """
  chex.assert_rank(token_logits, 3)
  chex.assert_equal_shape_prefix((token_logits, tokens), 2)
  logits = token_logits.astype(jnp.promote_types(token_logits.dtype, jnp.float32))
  bias = jnp.where(jnp.arange(logits.shape[-1]) >= num_words, -jnp.inf, 0.0).astype(logits.dtype)
  lse = jax.nn.logsumexp(logits + bias, axis=-1)
  gold = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
  return lse - gold


def word_log_probs(token_logits: jax.Array, num_words: int) -> jax.Array:
  """log x_θ over the words: [B, L, V + M] logits -> [B, L, V] float32 (float64 stays)."""
  chex.assert_rank(token_logits, 3)
  logits = token_logits[..., :num_words]
  return jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)


# --------------------------------------------------------------------------------- corruption


def corrupt(key: jax.Array, tokens: jax.Array, given: jax.Array, t: jax.Array,
            sched: MaskSchedule, des: Designation) -> tuple[jax.Array, jax.Array]:
  """x_t ~ p_t(· | x0) of (3.2) per position (Algorithm 1 line 4); given positions stay clean.

  One uniform per position decides masked (u < 1 - α_t, drawn from `key` itself exactly as
  HMDLM's corruption, so M = 1 reproduces MDLM's masks); the mask index is drawn from r_t^{x0}
  of (3.1) with `fold_in(key, 1)`.

  Returns:
    (x_t int32 [B, L], masked bool [B, L]).
  """
  chex.assert_rank((tokens, given), 2)
  chex.assert_equal_shape((tokens, given))
  chex.assert_rank(t, 1)
  _, om_a, _ = sched.alpha_terms(t)
  b, om_b, _ = sched.beta_terms(t)
  p_mask = jnp.broadcast_to(om_a[:, None], tokens.shape)
  u = jax.random.uniform(key, tokens.shape, p_mask.dtype)
  masked = (u < p_mask) & ~given.astype(bool)
  r = mm.mask_side(jnp.broadcast_to(b[:, None], tokens.shape),
                   jnp.broadcast_to(om_b[:, None], tokens.shape), des.of(tokens), des.num_masks)
  k = _draw(jax.random.fold_in(key, 1), jnp.log(r))
  xt = jnp.where(masked, des.num_words + k, tokens).astype(jnp.int32)
  return xt, masked


def _draw(key: jax.Array, log_p: jax.Array) -> jax.Array:
  """One draw per row of a categorical [..., C] (inverse CDF for small C, else Gumbel-max)."""
  if log_p.shape[-1] == 1:
    return jnp.zeros(log_p.shape[:-1], jnp.int32)
  if log_p.shape[-1] <= _ICDF_MAX:
    return base.categorical_icdf(key, log_p - jnp.max(log_p, axis=-1, keepdims=True))
  return jax.random.categorical(key, log_p, axis=-1).astype(jnp.int32)


# ------------------------------------------------------------------------------ objective (3.6)


def loss_terms(token_logits: jax.Array, tokens: jax.Array, xt: jax.Array, masked: jax.Array,
               loss_mask: jax.Array, t: jax.Array, sched: MaskSchedule,
               des: Designation) -> dict[str, jax.Array]:
  """The two terms of (3.6) per example, normalised per loss position.

  Args:
    token_logits: [B, L, V + M] network logits at x_t.
    tokens: [B, L] clean words x0; xt: [B, L] the noisy state; masked, loss_mask: [B, L] bool.
    t: [B] times.
  Returns:
    'recon', 'ident' [B] (Σ over masked loss positions / max(#loss positions, 1)) and
    'token_nll' [B, L] (-log x_θ(x0), meaningful at masked positions).
  """
  chex.assert_rank((tokens, xt, masked, loss_mask), 2)
  chex.assert_equal_shape((tokens, xt, masked, loss_mask))
  _, om_a, da = sched.alpha_terms(t)
  b, om_b, db = sched.beta_terms(t)
  sel = masked & loss_mask.astype(bool)
  n = jnp.maximum(loss_mask.astype(bool).sum(-1), 1).astype(om_a.dtype)
  nll = word_nll(token_logits, tokens, des.num_words)
  w_alpha = -da / om_a  # [B]: -α̇/(1 - α), 1/t for α = 1 - t
  zero = jnp.zeros_like(nll)
  recon = w_alpha[:, None] * jnp.where(sel, nll, zero)  # select first: no 0 * inf leaks
  if des.num_masks > 1:
    mu = des.group(jnp.exp(word_log_probs(token_logits, des.num_words)))  # [B, L, M]
    k = jnp.clip(xt - des.num_words, 0, des.num_masks - 1)
    ident = mm.identification_term(mu, k, des.of(tokens), b[:, None], om_b[:, None],
                                   db[:, None], des.num_masks)
    ident = jnp.where(sel, ident, zero)
  else:
    ident = zero
  return dict(recon=recon.sum(-1) / n, ident=ident.sum(-1) / n, token_nll=nll)


def curriculum_weight(step: jax.Array | None, start: int, ramp: int) -> jax.Array:
  """Weight of the identification term at an optimiser step: 0 before `start`, then a linear
  ramp to 1 over `ramp` steps (ramp = 0: a switch at `start`); 1 when step is None."""
  if step is None or (start == 0 and ramp == 0):
    return jnp.ones((), jnp.float32)
  k = jnp.asarray(step, jnp.float32) - start
  if ramp == 0:
    return (k >= 0).astype(jnp.float32)
  return jnp.clip((k + 1.0) / ramp, 0.0, 1.0)


# ------------------------------------------------------------------------------------ process


@dataclasses.dataclass(frozen=True)
class MultiMDM(base.Process):
  """MultiMDM (MDLM for M = 1) behind the `Process` interface; hashable (a static jit argument).

  Attributes:
    sched: α_t, β_t.
    des: the designated map (V words, M masks).
    cfg: the `process.multimdm` view (curriculum, t_min, distillation settings).
  """
  sched: MaskSchedule
  des: Designation
  cfg: MultiMDMConfig

  name: ClassVar[str] = 'multimdm'

  def __post_init__(self) -> None:
    if (self.cfg.num_masks, self.cfg.num_words) != (self.des.num_masks, self.des.num_words):
      raise ValueError(f'MultiMDM: designation has V={self.des.num_words}, M='
                       f'{self.des.num_masks} but the config V={self.cfg.num_words}, M='
                       f'{self.cfg.num_masks}.')

  @property
  def num_words(self) -> int:
    return self.des.num_words

  @property
  def num_masks(self) -> int:
    return self.des.num_masks

  @property
  def heads(self) -> tuple[str, ...]:
    return ('token',)

  @property
  def bound_kind(self) -> str:
    return 'mdlm' if self.num_masks == 1 else 'multimdm'

  # ------------------------------------------------------------------------ forward process

  def corrupt(self, key: jax.Array, batch: base.Batch, t: jax.Array) -> base.NoisyState:
    tokens, levels, given, _ = base.unpack(batch)
    xt, _ = corrupt(key, tokens, given, t, self.sched, self.des)
    return base.NoisyState(xt, jnp.zeros_like(levels))

  def log_marginal(self, state: base.NoisyState, clean: base.NoisyState,
                   t: jax.Array) -> jax.Array:
    """log p_t(z | x0) of (3.2) per position; the level input must be 0 (no levels)."""
    lp = mm.log_marginal(self.sched, self.des, state.tokens, clean.tokens, t)
    return jnp.where(state.levels == 0, lp, -jnp.inf)

  def state_candidates(self, clean: base.NoisyState) -> base.NoisyState:
    """x0 and the M masks: [..., L, 1 + M]."""
    masks = self.num_words + jnp.arange(self.num_masks, dtype=clean.tokens.dtype)
    masks = jnp.broadcast_to(masks, clean.tokens.shape + (self.num_masks,))
    tokens = jnp.concatenate([clean.tokens[..., None], masks], axis=-1)
    return base.NoisyState(tokens, jnp.zeros_like(tokens))

  # --------------------------------------------------------------------------- loss and bound

  def loss(self, apply_fn: ApplyFn, batch: base.Batch, key: jax.Array, *,
           step: jax.Array | None = None, target_apply_fn: ApplyFn | None = None
           ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Algorithm 1: t ~ U(t_min, 1) (stratified), x_t ~ (3.2), the loss (3.6) with the
    curriculum weight on the identification term. Key split as HMDLM's (t, mask, unused)."""
    del target_apply_fn
    tokens, levels, given, loss_mask = base.unpack(batch)
    k_t, k_mask, _ = jax.random.split(key, 3)
    t = base.sample_times(k_t, tokens.shape[0], t_min=self.cfg.t_min,
                          antithetic=self.cfg.antithetic)
    xt, masked = corrupt(k_mask, tokens, given, t, self.sched, self.des)
    logits = apply_fn(xt, jnp.zeros_like(levels), t, heads=('token',))['token']
    terms = loss_terms(logits, tokens, xt, masked, loss_mask, t, self.sched, self.des)
    recon = base.token_weighted_mean(terms['recon'], loss_mask)
    ident = base.token_weighted_mean(terms['ident'], loss_mask)
    w = curriculum_weight(step, self.cfg.curriculum_start, self.cfg.curriculum_steps)
    loss = recon + w * ident
    sel = masked & loss_mask
    n_sel = jnp.maximum(sel.sum(), 1).astype(jnp.float32)
    n_loss = loss_mask.sum().astype(jnp.float32)
    metrics = dict(
        loss=loss, recon=recon, ident=ident, nelbo=recon + ident, ident_weight=w,
        token_nll=jnp.where(sel, terms['token_nll'], 0.0).sum() / n_sel,
        mask_rate=sel.sum().astype(jnp.float32) / jnp.maximum(n_loss, 1.0),
        num_loss_tokens=n_loss)
    metrics['finite'] = jnp.all(jnp.isfinite(jnp.stack([loss, recon, ident]))).astype(
        jnp.float32)
    return loss.astype(jnp.float32), {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

  def bound_from_state(self, apply_fn: ApplyFn, batch: base.Batch, state: base.NoisyState,
                       t: jax.Array, key: jax.Array) -> dict[str, jax.Array]:
    """(3.6) at a given x_t, per example: 'recon', 'ident', 'total' (nats per loss position),
    'num_tokens'. Deterministic (the exactness tests integrate it by quadrature)."""
    del key
    tokens, _, _, loss_mask = base.unpack(batch)
    chex.assert_equal_shape((tokens, state.tokens))
    masked = state.tokens >= self.num_words
    logits = apply_fn(state.tokens, state.levels, t, heads=('token',))['token']
    terms = loss_terms(logits, tokens, state.tokens, masked, loss_mask, t, self.sched, self.des)
    out = {'recon': terms['recon'], 'ident': terms['ident']}
    out['total'] = out['recon'] + out['ident']
    out['num_tokens'] = loss_mask.sum(-1).astype(out['total'].dtype)
    return out

  # --------------------------------------------------------------------------------- sampling

  def check_sampling(self, cfg: SampleConfig) -> None:
    base.check_ordering(cfg, ('ancestral', 'confidence'), 'multimdm')
    if cfg.num_levels != 1:
      raise ValueError(f'MultiMDM has no levels: model.num_levels must be 1, got '
                       f'{cfg.num_levels}.')

  def sampler_init(self, apply_fn: ApplyFn, cfg: SampleConfig, *, batch_size: int,
                   seq_len: int, given_tokens: jax.Array | None = None,
                   given_levels: jax.Array | None = None,
                   given_mask: jax.Array | None = None) -> base.SamplerState:
    """Given positions revealed (`reveal_step` T + 1), the others the placeholder mask V (the
    uniform draw x_1 ~ u_M^L happens at the first reverse step, which has a key)."""
    del apply_fn, given_levels
    self.check_sampling(cfg)
    shape = (batch_size, seq_len)
    x = jnp.full(shape, self.num_words, jnp.int32)
    if given_mask is not None:
      if given_tokens is None:
        raise ValueError('sample: given_mask needs given_tokens [B, L] int32.')
      chex.assert_shape([given_tokens, given_mask], shape)
      given_mask = jnp.asarray(given_mask, bool)
      if not isinstance(given_tokens, jax.core.Tracer) and not isinstance(given_mask,
                                                                          jax.core.Tracer):
        gt = np.asarray(given_tokens)[np.asarray(given_mask)]
        if gt.size and (gt.min() < 0 or gt.max() >= self.num_words):
          raise ValueError(f'sample: given_tokens must be words (0..{self.num_words - 1}) at '
                           'given positions.')
      x = jnp.where(given_mask, jnp.asarray(given_tokens, jnp.int32), x)
      reveal = jnp.where(given_mask, cfg.num_steps + 1, 0).astype(jnp.int32)
    else:
      reveal = jnp.zeros(shape, jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    return base.SamplerState(x, jnp.zeros(shape, jnp.int32), reveal, zero, zero, ())

  def reverse_step(self, apply_fn: ApplyFn, cfg: SampleConfig, key: jax.Array,
                   state: base.SamplerState, n: jax.Array) -> base.SamplerState:
    """One step t = n/T -> s = (n-1)/T of (3.7) (Algorithm 2; Algorithm 4 with a distilled f)."""
    x, levels, reveal, nfe, nan_calls = state[:5]
    v, m = self.num_words, self.num_masks
    key_n = jax.random.fold_in(key, n)
    k_init, k_tok, k_move = jax.random.split(key_n, 3)
    is_first = n == cfg.num_steps
    terminal = v + jax.random.randint(k_init, x.shape, 0, m, jnp.int32)  # x_1 ~ u_M^L
    x = jnp.where(is_first & (x >= v), terminal, x)
    masked = x >= v
    t = n.astype(jnp.float32) / cfg.num_steps
    s = (n - 1).astype(jnp.float32) / cfg.num_steps
    t_b = jnp.full((x.shape[0],), t, jnp.float32)

    def call() -> tuple[jax.Array, jax.Array]:
      logits = apply_fn(x, levels, t_b, heads=('token',))['token']
      chex.assert_rank(logits, 3)
      return word_log_probs(logits, v).astype(jnp.float32), jnp.any(jnp.isnan(logits))

    if cfg.use_cache:
      need = jnp.any(masked)
      skip = lambda: (jnp.zeros(x.shape + (v,), jnp.float32), jnp.zeros((), bool))
      logp, nan = jax.lax.cond(need, call, skip)
      nfe = nfe + need.astype(jnp.int32)
    else:
      logp, nan = call()
      nfe = nfe + 1
    a = base.draw_tokens(k_tok, logp, cfg)  # clean-token hypothesis â ~ x_θ(· | x_t)
    kern = mm.posterior_kernel(self.sched, self.des.of(a), jnp.clip(x - v, 0, m - 1), s, t, m)
    if cfg.ordering == 'confidence':
      # Which positions become words: the k_n most confident masked ones (k_n = the expected
      # number of reveals, all at the last step); the others move among the masks by (3.4)
      # conditioned on staying masked (their draft follows the hypothesis â).
      p_rev = kern[..., 0]
      planned = jnp.round(jnp.sum(jnp.where(masked, p_rev, 0.0), -1)).astype(jnp.int32)
      count = jnp.where(n == 1, masked.sum(-1), jnp.maximum(planned, 1))
      score = jnp.where(masked, jnp.max(logp, -1), -jnp.inf)
      rank = jnp.argsort(jnp.argsort(-score, axis=-1, stable=True), axis=-1)
      chosen = masked & (rank < count[:, None])
      j = _draw(k_move, mm.log0(kern[..., 1:]))
      idx = jnp.where(chosen | (n == 1), 0, 1 + j)
    else:
      idx = _draw(k_move, mm.log0(kern))
    moved = jnp.where(idx == 0, a, v + idx - 1)
    new_x = jnp.where(masked, moved, x).astype(jnp.int32)
    reveal = jnp.where(masked & (idx == 0), n, reveal)
    return base.SamplerState(new_x, levels, reveal, nfe, nan_calls + nan.astype(jnp.int32), ())


# -------------------------------------------------------------------------------- construction


def designation_from_config(config: config_lib.Config) -> Designation:
  """The designated map of `process.multimdm.designated`: 'mod' or a .npy / .txt file of V ints."""
  cfg = MultiMDMConfig._view(config)  # pylint: disable=protected-access
  spec = cfg.designated
  if spec == 'mod':
    return Designation(cfg.num_words, cfg.num_masks)
  if not storage.isfile(spec):
    raise ValueError(f"process.multimdm.designated={spec!r} is neither 'mod' nor a file.")
  try:
    with storage.open_file(spec, 'rb') as f:
      classes = np.load(f) if spec.endswith('.npy') else np.loadtxt(f, dtype=np.int64)
  except (OSError, ValueError) as e:
    raise ValueError(f'process.multimdm.designated={spec!r}: unreadable ({e}).') from e
  return Designation(cfg.num_words, cfg.num_masks, tuple(int(c) for c in np.ravel(classes)))


def schedule_from_config(cfg: MultiMDMConfig) -> MaskSchedule:
  return MaskSchedule(cfg.alpha, cfg.alpha_power, cfg.beta, cfg.beta_power)


def build(config: config_lib.Config) -> MultiMDM:
  """The pretraining process of a resolved config (distillation: `multimdm_distill.build`)."""
  cfg = MultiMDMConfig._view(config)  # pylint: disable=protected-access
  return MultiMDM(schedule_from_config(cfg), designation_from_config(config), cfg)


def make(num_words: int, num_masks: int, **kw: Any) -> MultiMDM:
  """A process without an experiment config (tests, toys): MultiMDMConfig fields as keywords,
  plus `alpha`, `beta`, ... for the schedule and `classes` for the designation."""
  classes = kw.pop('classes', None)
  cfg = MultiMDMConfig(num_masks=num_masks, num_words=num_words, **kw)
  return MultiMDM(schedule_from_config(cfg), Designation(num_words, num_masks, classes), cfg)


__all__ = ['MultiMDM', 'build', 'corrupt', 'curriculum_weight', 'designation_from_config',
           'loss_terms', 'make', 'word_log_probs', 'word_nll']
