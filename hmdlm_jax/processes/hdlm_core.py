"""HDLM's schedule, its word / cluster / MASK id layout and its parameterisation.

Shared by the process (processes/hdlm.py) and its sampler (processes/hdlm_sampler.py); every
formula is stated and derived in docs/method.md §13.1. In short, with τ = (1 - ε) t, u = 1 - τ:
    α = u^γ (word),   β_c = γ (u - u^γ) / (γ - 1) (cluster; γ = 1: -u log u),   β_m = 1 - α - β_c
    w_m = β_m'/β_m = (1-ε) β_c / (u β_m),     w_c = -α'/β_c = (1-ε) γ α / (u β_c)
β_c and β_m are computed without cancellation (exprel, and a power series for τ < 1/4). One
cluster (n = 1) is merged with MASK, which gives MDLM's process and NELBO.

Id layout: words, MASK (`mask_id`, anywhere before the clusters), then the n cluster tokens as the
LAST n rows of the table (`vocab_size - n + c`; for n = 1 the cluster token is `mask_id`).
Parameterisation (one token head): x̂ over the words; P_θ(c) = Σ_{v∈c} x̂(v); the perturbed
cluster law Q_θ; and the word law at a cluster position, forced 'within', 'between' or 'none'.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.processes import parameterization

_SERIES_TAU = 0.25  # β_m by its power series below this τ (ratio of terms < τ)
_SERIES_TERMS = 32  # τ^30 < 1e-18 at τ = 1/4


class Marginals(NamedTuple):
  """q(z_t | x) of one position: word α, cluster β_c, MASK β_m, and u = 1 - τ; each [...]."""
  alpha: jax.Array
  beta_c: jax.Array
  beta_m: jax.Array
  u: jax.Array


def _float(t: Any) -> jax.Array:
  t = jnp.asarray(t)
  if not jnp.issubdtype(t.dtype, jnp.floating):
    t = t.astype(jnp.float32)
  return t.astype(jnp.promote_types(t.dtype, jnp.float32))


def _exprel(a: jax.Array) -> jax.Array:
  """(e^a - 1) / a with its limit 1 at a = 0 (stable for small |a|)."""
  small = jnp.abs(a) < 1e-4
  safe = jnp.where(small, 1.0, a)
  return jnp.where(small, 1.0 + a / 2.0 + a * a / 6.0, jnp.expm1(safe) / safe)


@dataclasses.dataclass(frozen=True)
class HDLMSchedule:
  """α_t = (1 - τ)^γ with τ = (1 - ε) t and its cluster / MASK terms (docs/method.md §13.1).

  Attributes:
    gamma: γ > 0.
    eps: time floor ε in [0, 1) (0: exact endpoints, α(1) = 0, for the exact-oracle tests).
    merged: n = 1: the single cluster is MASK (β_m ≡ 0, β_c = 1 - α).
  """
  gamma: float = 1.0
  eps: float = 0.0
  merged: bool = False

  def __post_init__(self) -> None:
    object.__setattr__(self, 'gamma', float(self.gamma))
    object.__setattr__(self, 'eps', float(self.eps))
    if not (np.isfinite(self.gamma) and self.gamma > 0):
      raise ValueError(f'process.hdlm.gamma={self.gamma} must be a finite number > 0.')
    if not 0.0 <= self.eps < 1.0:
      raise ValueError(f'process.hdlm.eps={self.eps} must lie in [0, 1).')

  def tau(self, t: Any) -> jax.Array:
    """τ = (1 - ε) t, clipped to [0, 1]; the dtype of t (float32 at least)."""
    return (1.0 - self.eps) * jnp.clip(_float(t), 0.0, 1.0)

  def marginals(self, t: Any) -> Marginals:
    """α, β_c, β_m, u at times t [...] (each [...]); exact endpoints (u = 0: α = β_c = 0)."""
    g = self.gamma
    tau = self.tau(t)
    u = 1.0 - tau
    pos = u > 0
    log_u = jnp.log1p(-jnp.where(pos, tau, 0.0))  # finite placeholder at u = 0
    alpha = jnp.where(pos, jnp.exp(g * log_u), 0.0)
    if self.merged:
      om = tau if g == 1.0 else -jnp.expm1(g * log_u)
      om = jnp.where(pos, om, 1.0)
      return Marginals(alpha, om, jnp.zeros_like(om), u)
    beta_c = g * u * (-log_u) * _exprel((g - 1.0) * log_u)
    beta_c = jnp.where(pos, beta_c, 0.0)
    # β_m = Σ_{k≥2} c_k τ^k with c_2 = γ/2 and c_{k+1} = -c_k (γ - k) / (k + 1) for small τ.
    ts = jnp.minimum(tau, _SERIES_TAU)
    term = 0.5 * g * ts * ts
    series = term
    for k in range(2, _SERIES_TERMS):
      term = -term * (g - k) / (k + 1) * ts
      series = series + term
    beta_m = jnp.where(tau < _SERIES_TAU, series, 1.0 - alpha - beta_c)
    return Marginals(alpha, beta_c, jnp.maximum(beta_m, 0.0), u)

  def one_minus_alpha(self, t: Any) -> jax.Array:
    """1 - α without cancellation: [...]."""
    tau = self.tau(t)
    if self.gamma == 1.0:
      return tau
    return -jnp.expm1(self.gamma * jnp.log1p(-tau))

  def weights(self, t: Any) -> tuple[jax.Array, jax.Array]:
    """ELBO weights (w_m, w_c) at t [...] (docs/method.md §13.1); w_m = 0 when merged.

    Where a state has zero probability (t = 0, or u = 0) its weight is set to 0 (the loss selects
    positions before multiplying, so these values are never used with a positive probability).
    """
    m = self.marginals(t)
    scale = 1.0 - self.eps
    if self.merged:
      om = self.one_minus_alpha(t)
      ok = (om > 0) & (m.u > 0)
      # -α'/(1 - α) = (1-ε) γ u^(γ-1) / (1 - u^γ); for γ = 1 this is 1/t (MDLM's weight).
      if self.gamma == 1.0:
        num = jnp.full_like(om, scale)
      else:
        num = scale * self.gamma * (m.alpha / jnp.where(m.u > 0, m.u, 1.0))
      w_c = jnp.where(ok, num / jnp.where(ok, om, 1.0), 0.0)
      return jnp.zeros_like(w_c), w_c
    ok_c = (m.beta_c > 0) & (m.u > 0)
    ok_m = (m.beta_m > 0) & (m.u > 0)
    u = jnp.where(m.u > 0, m.u, 1.0)
    w_c = jnp.where(ok_c, scale * self.gamma * m.alpha / (u * jnp.where(ok_c, m.beta_c, 1.0)),
                    0.0)
    w_m = jnp.where(ok_m, scale * m.beta_c / (u * jnp.where(ok_m, m.beta_m, 1.0)), 0.0)
    return w_m, w_c

  def cluster_survival(self, s: Any, t: Any) -> jax.Array:
    """P(a cluster state at s is still one at t) = u_t / u_s (1 when merged: it is absorbing)."""
    if self.merged:
      return jnp.ones_like(_float(t))
    u_s, u_t = 1.0 - self.tau(s), 1.0 - self.tau(t)
    return jnp.where(u_s > 0, u_t / jnp.where(u_s > 0, u_s, 1.0), 0.0)


@dataclasses.dataclass(frozen=True, eq=False)
class ClusterLayout:
  """Which ids are words, MASK and cluster tokens, and each word's cluster (module docstring).

  Identity-hashed (it holds an array): one layout object per process.

  Attributes:
    cluster_of: int32 [V], the cluster 0..n-1 of each word id; -1 at MASK and cluster ids.
    num_clusters: n.
    mask_id: the MASK id.
  """
  cluster_of: np.ndarray
  num_clusters: int
  mask_id: int

  def __post_init__(self) -> None:
    c = np.asarray(self.cluster_of, np.int32)
    object.__setattr__(self, 'cluster_of', c)
    n, v = self.num_clusters, c.shape[0]
    if c.ndim != 1 or n < 1 or not 0 <= self.mask_id < v - self.cluster_rows:
      raise ValueError(f'ClusterLayout: mask_id={self.mask_id} must lie before the '
                       f'{self.cluster_rows} cluster rows of a table of {v} rows.')
    words = np.ones(v, bool)
    words[self.mask_id] = False
    words[v - self.cluster_rows:] = False
    if np.any(c[~words] != -1) or np.any((c[words] < 0) | (c[words] >= n)):
      raise ValueError(f'ClusterLayout: every word id needs a cluster in 0..{n - 1} and MASK / '
                       'cluster ids must map to -1.')
    empty = np.setdiff1d(np.arange(n), c[words])
    if empty.size:
      raise ValueError(f'ClusterLayout: clusters {empty[:8].tolist()} have no word; every cluster '
                       'needs at least one.')

  @property
  def merged(self) -> bool:
    return self.num_clusters == 1

  @property
  def cluster_rows(self) -> int:
    return 0 if self.num_clusters == 1 else self.num_clusters

  @property
  def vocab_size(self) -> int:
    return int(self.cluster_of.shape[0])

  @property
  def cluster_offset(self) -> int:
    """Id of cluster 0 (MASK when merged)."""
    return self.mask_id if self.merged else self.vocab_size - self.num_clusters

  def word_mask(self) -> jax.Array:
    """bool [V]: True at word ids."""
    return jnp.asarray(self.cluster_of >= 0)

  def cluster_token(self, c: jax.Array) -> jax.Array:
    """Token id of cluster index c (any shape)."""
    if self.merged:
      return jnp.full_like(c, self.mask_id)
    return (self.cluster_offset + c).astype(jnp.int32)

  def is_mask(self, tokens: jax.Array) -> jax.Array:
    """MASK state (never when merged: then MASK is the cluster state)."""
    if self.merged:
      return jnp.zeros(tokens.shape, bool)
    return tokens == self.mask_id

  def is_cluster(self, tokens: jax.Array) -> jax.Array:
    if self.merged:
      return tokens == self.mask_id
    return tokens >= self.cluster_offset

  def state_cluster(self, tokens: jax.Array) -> jax.Array:
    """The cluster index of cluster-state tokens (0 elsewhere): int32 [...]."""
    if self.merged:
      return jnp.zeros(tokens.shape, jnp.int32)
    return jnp.where(self.is_cluster(tokens), tokens - self.cluster_offset, 0).astype(jnp.int32)

  def word_cluster(self, tokens: jax.Array) -> jax.Array:
    """c(v) of word tokens (-1 elsewhere): int32 [...]."""
    return jnp.asarray(self.cluster_of)[tokens]

  def membership(self, dtype: Any = jnp.float32) -> jax.Array:
    """One-hot [V, n] of the words' clusters (zero rows at MASK / cluster ids)."""
    return jax.nn.one_hot(jnp.asarray(self.cluster_of), self.num_clusters, dtype=dtype)


# ------------------------------------------------------------------------- parameterisation


def word_log_probs(token_logits: jax.Array, layout: ClusterLayout) -> jax.Array:
  """log x̂ [B, L, V]: log_softmax over the word columns, -inf at MASK and cluster columns."""
  chex.assert_rank(token_logits, 3)
  chex.assert_axis_dimension(token_logits, 2, layout.vocab_size)
  logits = parameterization.f32(token_logits)
  logits = jnp.where(layout.word_mask(), logits, -jnp.inf)
  return jax.nn.log_softmax(logits, axis=-1)


def cluster_probs(log_xhat: jax.Array, layout: ClusterLayout) -> jax.Array:
  """P_θ(c) = Σ_{v∈c} x̂(v): [B, L, V] -> [B, L, n], clipped to [0, 1]."""
  p = jnp.exp(log_xhat) @ layout.membership(log_xhat.dtype)
  return jnp.clip(p, 0.0, 1.0)


def perturbed(p: jax.Array, xi: float, num_clusters: int) -> jax.Array:
  """Q(c) = ξ P(c) + κ (1 - P(c)), κ = (1-ξ)/(n-1): the cluster law of a perturbed jump."""
  if xi == 1.0:
    return p
  kappa = (1.0 - xi) / (num_clusters - 1)
  return xi * p + kappa * (1.0 - p)


def log1mexp(a: jax.Array) -> jax.Array:
  """log(1 - e^a) for a <= 0 (-inf at a = 0), stable on both sides of log 2."""
  a = jnp.minimum(a, 0.0)
  near = a > -0.6931471805599453
  return jnp.where(near, jnp.log(-jnp.expm1(jnp.where(near, a, -1.0))),
                   jnp.log1p(-jnp.exp(jnp.where(near, -1.0, a))))


class GoldNLL(NamedTuple):
  """Per-position cross-entropies of the gold word x, each [B, L] (module docstring).

  word:    -log x̂(x) (full vocabulary).
  cluster: -log P_θ(r) for the reference cluster r.
  within:  -log x̂(x | r) = -log x̂(x) + log P_θ(r).
  """
  word: jax.Array
  cluster: jax.Array
  within: jax.Array


def gold_nll(token_logits: jax.Array, tokens: jax.Array, ref_cluster: jax.Array,
             layout: ClusterLayout) -> GoldNLL:
  """-log x̂(x), -log P_θ(r), -log x̂(x | r) from logits [B, L, V] for words x and clusters r [B, L].

  One masked logsumexp over the members of r (exact, no underflow of a cluster's mass) and one
  over all words; nothing else of size [B, L, V] is materialised.
  """
  chex.assert_rank((tokens, ref_cluster), 2)
  chex.assert_equal_shape((tokens, ref_cluster))
  chex.assert_equal_shape_prefix((token_logits, tokens), 2)
  logits = parameterization.f32(token_logits)
  words = layout.word_mask()
  lse_all = jax.nn.logsumexp(jnp.where(words, logits, -jnp.inf), axis=-1)
  member = jnp.asarray(layout.cluster_of) == ref_cluster[..., None]  # [B, L, V]
  lse_ref = jax.nn.logsumexp(jnp.where(member, logits, -jnp.inf), axis=-1)
  gold = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
  return GoldNLL(word=lse_all - gold, cluster=lse_all - lse_ref, within=lse_ref - gold)


def forced_log_probs(log_xhat: jax.Array, state_cluster: jax.Array, layout: ClusterLayout, *,
                     force: str, xi: float) -> jax.Array:
  """The word law at a cluster position in state c [B, L]: log [B, L, V] (module docstring).

  'within': x̂ renormalised over c; 'between': mass ξ inside c and 1 - ξ outside, each part
  proportional to x̂; 'none': x̂. Normalised in log space (a logsumexp over the members of c), so
  a cluster whose mass P_θ(c) underflows in float32 still gets its exact within-cluster law.
  """
  if force == 'none':
    return log_xhat
  member = jnp.asarray(layout.cluster_of) == state_cluster[..., None]  # [B, L, V]
  inside = jnp.where(member, log_xhat, -jnp.inf)
  log_pc = jax.nn.logsumexp(inside, axis=-1, keepdims=True)  # [B, L, 1] log P_θ(c)
  if force == 'within' or xi == 1.0:
    return inside - log_pc
  log_out = jax.nn.logsumexp(jnp.where(member, -jnp.inf, log_xhat), axis=-1, keepdims=True)
  return jnp.where(member, np.log(xi) + log_xhat - log_pc, np.log1p(-xi) + log_xhat - log_out)
