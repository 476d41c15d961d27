"""An enumerable toy problem and its exact posterior oracle (tests only).

Sequences of length L over V real tokens (ids 0..V-1, MASK id V, so the model vocabulary has V+1
rows) with a fixed distribution p(x) over all V^L sequences (a Dirichlet draw). Levels follow the
frequency rule of SPEC 6: a token that occurs at most τ times in its own sequence gets level 1,
otherwise level 0 (all levels are 0 when K = 1); h is therefore a function of x.

`make_oracle(p, schedule)` returns an `apply_fn` (the denoiser contract of docs/design.md) whose raw
logits are exact log posteriors under the forward process of SPEC 3 at time t:

  P(x0 | state) ∝ p(x0) · Π_{revealed j} α_{h(x0)_j}(t) 1[x0_j = x_j] 1[h(x0)_j = h_j]
                        · Π_{masked j} (1 - α_{h(x0)_j}(t))
                        · Π_{masked j with a shown level} 1[h(x0)_j = h_j]

'hier' logits are log P(h_i(x0) = k | state) and 'token' logits log P(x0_i = v | state) (MASK -inf).
With `token_levels`, position i's token logits are additionally conditioned on h_i(x0) =
token_levels_i, each position separately (the "own level" context of SPEC 5/8). Use the oracle with
`prior_corrected=False` (its hierarchy logits already are the exact posterior).

States the forward process cannot produce (the sampler can create them, SPEC 7: drawn levels that
disagree with the drawn tokens) have zero posterior mass; the oracle then drops the level evidence
and the schedule factors and conditions on the revealed tokens only, so it stays finite. Likewise a
`token_levels` value with zero conditional mass falls back to that position's unconditional
posterior. Neither fallback is reached from states of the forward process.

Everything follows the dtype of `t` (float64 under `jax.enable_x64(True)`), which the exactness
tests need.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.schedules import Schedule

ApplyFn = Callable[..., dict]


def all_sequences(num_tokens: int, seq_len: int) -> np.ndarray:
  """All V^L sequences in lexicographic order: [V^L, L] int32."""
  return np.array(list(itertools.product(range(num_tokens), repeat=seq_len)), dtype=np.int32)


def frequency_levels(seqs: np.ndarray, tau: int = 1, num_levels: int = 2) -> np.ndarray:
  """SPEC 6 frequency rule: count(x_i in x) <= τ -> level 1, else 0; zeros when K = 1. [N,L]."""
  if num_levels == 1:
    return np.zeros_like(seqs, dtype=np.int32)
  counts = (seqs[:, :, None] == seqs[:, None, :]).sum(-1)  # [N, L]
  return (counts <= tau).astype(np.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class Toy:
  """The enumerable problem: p over all sequences, with their levels."""
  probs: np.ndarray  # [N] float64, N = V^L
  seqs: np.ndarray  # [N, L] int32
  levels: np.ndarray  # [N, L] int32
  num_tokens: int  # V real tokens
  num_levels: int  # K
  tau: int

  @property
  def seq_len(self) -> int:
    return self.seqs.shape[1]

  @property
  def mask_id(self) -> int:
    return self.num_tokens

  @property
  def vocab_size(self) -> int:  # including the MASK row
    return self.num_tokens + 1

  def neg_log_prob(self) -> np.ndarray:
    """-log p(x) for every sequence: [N] float64."""
    with np.errstate(divide='ignore'):
      return -np.log(self.probs)

  def entropy(self) -> float:
    """H(p) in nats."""
    p = self.probs[self.probs > 0]
    return float(-(p * np.log(p)).sum())

  def batch(self, idx: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The pipeline batch dict (docs/design.md) for sequences `idx` (default: all)."""
    idx = np.arange(len(self.probs)) if idx is None else np.asarray(idx)
    tokens = self.seqs[idx]
    return dict(tokens=tokens, levels=self.levels[idx], given=np.zeros(tokens.shape, bool),
                loss_mask=np.ones(tokens.shape, bool))


def make_toy(seed: int = 0, *, num_tokens: int = 3, seq_len: int = 3, num_levels: int = 2,
             tau: int = 1, concentration: float = 1.0) -> Toy:
  """A Dirichlet(concentration) distribution over the V^L sequences, with frequency levels."""
  seqs = all_sequences(num_tokens, seq_len)
  probs = np.random.default_rng(seed).dirichlet(np.full(len(seqs), concentration))
  return Toy(probs, seqs, frequency_levels(seqs, tau, num_levels), num_tokens, num_levels, tau)


def mask_patterns(seq_len: int) -> np.ndarray:
  """All 2^L mask patterns: [2^L, L] bool (True = masked)."""
  return np.array(list(itertools.product([False, True], repeat=seq_len)), dtype=bool)


def pattern_probs(levels: np.ndarray, t: np.ndarray, schedule: Schedule) -> np.ndarray:
  """Forward-process probability of every mask pattern (numpy float64, SPEC 3).

  Args:
    levels: [..., L] gold levels.
    t: [...] times.
  Returns:
    [..., 2^L] probabilities (sum to 1 over the last axis).
  """
  levels = np.asarray(levels)
  om = schedule.one_minus_alpha(np.asarray(t, np.float64), np)  # [..., K]
  om_pos = np.take_along_axis(om, levels, axis=-1)  # [..., L]
  pats = mask_patterns(levels.shape[-1])  # [P, L]
  pr = np.where(pats, om_pos[..., None, :], 1.0 - om_pos[..., None, :])  # [..., P, L]
  return pr.prod(-1)


def make_oracle(p: Any, schedule: Schedule, *, num_tokens: int = 3, seq_len: int = 3,
                tau: int = 1, num_levels: int | None = None) -> ApplyFn:
  """Exact-posterior denoiser for the toy with data distribution `p` (see module docstring).

  Args:
    p: [V^L] probabilities of the sequences of `all_sequences(num_tokens, seq_len)`.
    schedule: the forward schedule (K = schedule.num_levels levels).
    num_tokens, seq_len, tau: the toy's V, L and frequency threshold.
    num_levels: K; defaults to schedule.num_levels (must agree).
  Returns:
    apply_fn(tokens [B,L], levels [B,L], t [B], *, heads, token_levels=None) -> dict with
    'hier' [B,L,K] and/or 'token' [B,L,V+1] raw logits (exact log posteriors).
  """
  big_k = schedule.num_levels if num_levels is None else num_levels
  if big_k != schedule.num_levels:
    raise ValueError(f'num_levels={big_k} but the schedule has {schedule.num_levels} levels.')
  seqs_np = all_sequences(num_tokens, seq_len)
  p = np.asarray(p, np.float64)
  if p.shape != (len(seqs_np),):
    raise ValueError(f'p has shape {p.shape}; expected ({len(seqs_np)},) = V^L sequences.')
  with np.errstate(divide='ignore'):
    logp_np = np.log(p)
  levels_np = frequency_levels(seqs_np, tau, big_k)
  mask_id = num_tokens
  vocab = num_tokens + 1
  seq_x = jnp.asarray(seqs_np)  # [N, L]
  seq_h = jnp.asarray(levels_np)  # [N, L]
  onehot_x = jax.nn.one_hot(seq_x, vocab, dtype=jnp.float32)  # [N, L, V+1]
  onehot_h = jax.nn.one_hot(seq_h, big_k, dtype=jnp.float32)  # [N, L, K]

  def apply_fn(tokens: jax.Array, levels: jax.Array, t: jax.Array, *,
               heads: tuple[str, ...] = ('hier', 'token'),
               token_levels: jax.Array | None = None) -> dict[str, jax.Array]:
    t = jnp.asarray(t)
    dtype = jnp.promote_types(t.dtype, jnp.float32)
    t = t.astype(dtype)
    neg_inf = jnp.asarray(-jnp.inf, dtype)
    logp = jnp.asarray(logp_np, dtype)  # [N]
    log_a = jnp.log(schedule.alpha(t))  # [B, K]
    log_om = jnp.log(schedule.one_minus_alpha(t))  # [B, K]
    la = jnp.take(log_a, seq_h, axis=1)  # [B, N, L]: log α_{h(x0)_j}(t)
    lom = jnp.take(log_om, seq_h, axis=1)
    revealed = (tokens != mask_id)[:, None, :]  # [B, 1, L]
    shown = (levels < big_k)[:, None, :]
    tok_ok = seq_x[None] == tokens[:, None, :]  # [B, N, L]
    lvl_ok = (seq_h[None] == levels[:, None, :]) | ~shown
    hard = jnp.where(revealed, jnp.where(tok_ok & lvl_ok, la, neg_inf),
                     jnp.where(lvl_ok, lom, neg_inf)).sum(-1) + logp  # [B, N]
    soft = jnp.where(revealed & ~tok_ok, neg_inf, 0.0).sum(-1) + logp  # tokens-only fallback
    lse = jax.nn.logsumexp(hard, axis=-1, keepdims=True)
    logw = jnp.where(jnp.isfinite(lse), hard, soft)
    post = jnp.exp(logw - jax.nn.logsumexp(logw, axis=-1, keepdims=True))  # [B, N]
    out = {}
    if 'hier' in heads:
      out['hier'] = jnp.log(jnp.einsum('bn,nlk->blk', post, onehot_h.astype(dtype)))
    if 'token' in heads:
      ox = onehot_x.astype(dtype)
      marg = jnp.einsum('bn,nlv->blv', post, ox)  # [B, L, V+1]
      if token_levels is not None:
        cond = post[:, :, None] * (seq_h[None] == token_levels[:, None, :]).astype(dtype)
        num = jnp.einsum('bnl,nlv->blv', cond, ox)
        den = cond.sum(1)[..., None]  # [B, L, 1]
        marg = jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), marg)
      out['token'] = jnp.log(marg)  # MASK column: log 0 = -inf
    return out

  return apply_fn


def make_toy_oracle(toy: Toy, schedule: Schedule, probs: np.ndarray | None = None) -> ApplyFn:
  """`make_oracle` for a `Toy` (optionally for another distribution `probs`, e.g. a wrong one)."""
  return make_oracle(toy.probs if probs is None else probs, schedule, num_tokens=toy.num_tokens,
                     seq_len=toy.seq_len, tau=toy.tau, num_levels=toy.num_levels)
