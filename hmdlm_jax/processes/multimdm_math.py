"""MultiMDM's closed forms: schedules, marginal, kernels, objective terms and the Gumbel coupling.

Paper: "Multi-Mask Diffusion Language Models for Few-Step Generation" (MultiMDM), Section 3 and
Appendices A–B; docs/method.md §13.2 states what the code computes, (3.1)–(3.4) included, and why.

State space per position: the V words (ids 0..V-1) and M mask tokens (ids V..V+M-1, mask j has
id V + j). Every word x has a designated mask m_x ∈ {0..M-1} (`Designation`). With schedules
α_t, β_t (decreasing, α_0 = β_0 = 1, α_1 = β_1 = 0) and c_t = (1 - β_t) / M:
  r_t^{x0}(k) = β_t 1{k = m_{x0}} + c_t,      p_t(z | x0) = α_t 1{z = x0} + (1 - α_t) r_t^{x0}(z).

Everything depends on a word only through its designated mask, so the kernels below take the
class m = m_{x0} (an int array) rather than the word. Shapes: [...] any leading shape; M masks;
floating dtypes follow t (float32 at least, float64 under x64) so exactness tests run in float64.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

CURVES = ('linear', 'power', 'cosine')
BETA_CURVES = CURVES + ('alpha_power',)
DESIGNATIONS = ('mod',)  # or an explicit array of classes (`Designation.classes`)
_SERIES_X = 1e-3  # φ(x) = h(x)/x by its Taylor series below this |x|


def _f(t: Any) -> jax.Array:
  t = jnp.asarray(t)
  dt = jnp.promote_types(t.dtype, jnp.float32) if jnp.issubdtype(t.dtype, jnp.floating) else (
      jnp.float32)
  return t.astype(dt)


def _curve(kind: str, power: float, t: jax.Array
           ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(value, 1 - value, d value / dt, log value) of a decreasing curve on [0, 1], all computed
  without cancellation (1 - value and log value stay accurate near t = 0 and t = 1)."""
  if kind == 'linear':
    return 1.0 - t, t, -jnp.ones_like(t), jnp.log1p(-t)
  if kind == 'power':  # (1 - t)^p
    log_v = power * jnp.log1p(-jnp.minimum(t, 1.0))
    deriv = -power * jnp.power(jnp.maximum(1.0 - t, 0.0), power - 1.0)
    return jnp.exp(log_v), -jnp.expm1(log_v), deriv, log_v
  if kind == 'cosine':  # cos(π t / 2)
    half = 0.5 * jnp.pi * t
    val = jnp.cos(half)
    return (val, 2.0 * jnp.sin(0.5 * half) ** 2, -0.5 * jnp.pi * jnp.sin(half),
            jnp.log1p(-2.0 * jnp.sin(0.5 * half) ** 2))
  raise ValueError(f'unknown schedule curve {kind!r}; allowed {CURVES}.')


@dataclasses.dataclass(frozen=True)
class MaskSchedule:
  """α_t and β_t of (3.1)-(3.2): a small family with exact derivatives; hashable.

  Attributes:
    alpha: 'linear' (1 - t, the paper's), 'power' ((1 - t)^p) or 'cosine' (cos(πt/2)).
    alpha_power: p of 'power'.
    beta: a curve of the same family, or 'alpha_power' (β = α^ρ, the paper's App. C.1).
    beta_power: p of 'power' or ρ of 'alpha_power'.
  """
  alpha: str = 'linear'
  alpha_power: float = 1.0
  beta: str = 'linear'
  beta_power: float = 1.0

  def __post_init__(self) -> None:
    if self.alpha not in CURVES:
      raise ValueError(f'process.multimdm.alpha={self.alpha!r} is not one of {CURVES}.')
    if self.beta not in BETA_CURVES:
      raise ValueError(f'process.multimdm.beta={self.beta!r} is not one of {BETA_CURVES}.')
    for name in ('alpha_power', 'beta_power'):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
        raise ValueError(f'process.multimdm.{name}={v!r} must be a finite number > 0.')
      object.__setattr__(self, name, float(v))

  def alpha_terms(self, t: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(α_t, 1 - α_t, α̇_t) [...]."""
    return _curve(self.alpha, self.alpha_power, _f(t))[:3]

  def beta_terms(self, t: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(β_t, 1 - β_t, β̇_t) [...]."""
    t = _f(t)
    if self.beta != 'alpha_power':
      return _curve(self.beta, self.beta_power, t)[:3]
    a, _, da, log_a = _curve(self.alpha, self.alpha_power, t)
    rho = self.beta_power
    pos = a > 0
    log_a = jnp.where(pos, log_a, 0.0)
    val = jnp.where(pos, jnp.exp(rho * log_a), 0.0)
    one_minus = jnp.where(pos, -jnp.expm1(rho * log_a), 1.0)
    deriv = jnp.where(pos, rho * jnp.exp((rho - 1.0) * log_a) * da, 0.0)
    return val, one_minus, deriv

  def alpha_at(self, t: Any) -> jax.Array:
    return self.alpha_terms(t)[0]

  def beta_at(self, t: Any) -> jax.Array:
    return self.beta_terms(t)[0]


@dataclasses.dataclass(frozen=True)
class Designation:
  """The designated map x ↦ m_x (the assignment matrix T of Section 3.1); hashable.

  Attributes:
    num_words: V.
    num_masks: M.
    classes: None for the paper's m_x = x mod M, else a tuple of V ints in [0, M) (e.g. HDLM's
      clusters, read from a file by `processes.multimdm.designation_from_config`).
  """
  num_words: int
  num_masks: int
  classes: tuple[int, ...] | None = None

  def __post_init__(self) -> None:
    if self.num_words < 1 or self.num_masks < 1:
      raise ValueError(f'MultiMDM needs >= 1 word and >= 1 mask, got V={self.num_words}, '
                       f'M={self.num_masks}.')
    if self.classes is not None:
      c = np.asarray(self.classes)
      if c.shape != (self.num_words,) or c.min() < 0 or c.max() >= self.num_masks:
        raise ValueError(f'process.multimdm.designated: need {self.num_words} classes in '
                         f'[0, {self.num_masks}), got shape {c.shape} in [{c.min()}, {c.max()}].')

  def of(self, words: jax.Array) -> jax.Array:
    """m_x of word ids [...] -> int32 [...] (ids outside 0..V-1 give meaningless classes)."""
    words = jnp.clip(jnp.asarray(words), 0, self.num_words - 1)
    if self.classes is None:
      return (words % self.num_masks).astype(jnp.int32)
    return jnp.asarray(self.classes, jnp.int32)[words]

  def group(self, probs: jax.Array) -> jax.Array:
    """m_θ = T x_θ: [..., V] word probabilities -> [..., M] class masses."""
    chex.assert_axis_dimension(probs, -1, self.num_words)
    m = self.num_masks
    if self.classes is None:
      pad = (-self.num_words) % m
      p = jnp.pad(probs, [(0, 0)] * (probs.ndim - 1) + [(0, pad)])
      return p.reshape(p.shape[:-1] + (p.shape[-1] // m, m)).sum(-2)
    onehot = jax.nn.one_hot(jnp.asarray(self.classes), m, dtype=probs.dtype)  # [V, M]
    return probs @ onehot


# ------------------------------------------------------------------------------- marginal (3.2)


def mask_side(beta: jax.Array, om_beta: jax.Array, m_cls: jax.Array, num_masks: int
              ) -> jax.Array:
  """r_t^{x0}(k) of (3.1) for every k: β, 1 - β [...], class m_{x0} int [...] -> [..., M]."""
  c = om_beta / num_masks
  onehot = jax.nn.one_hot(m_cls, num_masks, dtype=beta.dtype)
  return beta[..., None] * onehot + c[..., None]


def log_marginal(sched: MaskSchedule, des: Designation, state: jax.Array, clean: jax.Array,
                 t: jax.Array) -> jax.Array:
  """log p_t(state | clean) of (3.2) per position: state, clean int [..., L], t [...] -> [..., L].

  -inf off the support (another word than the clean one, or a mask at t = 0).
  """
  t = _f(t)[..., None]
  a, om_a, _ = sched.alpha_terms(t)
  b, om_b, _ = sched.beta_terms(t)
  v, m = des.num_words, des.num_masks
  is_word = state < v
  k = jnp.clip(state - v, 0, m - 1)
  r_k = jnp.where(k == des.of(clean), b + om_b / m, om_b / m)
  lp_mask = log0(om_a * r_k)
  lp_word = jnp.where(state == clean, log0(a), -jnp.inf)
  return jnp.where(is_word, lp_word, lp_mask)


def log0(p: jax.Array) -> jax.Array:
  """log with log 0 = -inf (no warnings); round-off negatives count as 0."""
  p = jnp.maximum(p, 0.0)
  return jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), -jnp.inf)


# ----------------------------------------------------------------------- kernels (3.3) and (3.4)


def forward_kernel(sched: MaskSchedule, des: Designation, s: Any, t: Any) -> np.ndarray:
  """The two-time kernel (3.3) as a numpy matrix P[z_s, z_t] over the V + M states (tests, toys)."""
  v, m = des.num_words, des.num_masks
  a_s, a_t = float(sched.alpha_at(s)), float(sched.alpha_at(t))
  b_s, b_t = float(sched.beta_at(s)), float(sched.beta_at(t))
  a_ts = a_t / a_s if a_s > 0 else 0.0
  b_ts = b_t / b_s if b_s > 0 else 0.0
  cls = np.asarray(des.of(jnp.arange(v)))
  out = np.zeros((v + m, v + m))
  for x in range(v):
    r = np.full(m, (1.0 - b_t) / m)
    r[cls[x]] += b_t
    out[x, x] = a_ts
    out[x, v:] = (1.0 - a_ts) * r
  out[v:, v:] = (1.0 - b_ts) / m
  out[v:, v:] += b_ts * np.eye(m)
  return out


def posterior_kernel(sched: MaskSchedule, m_cls: jax.Array, k: jax.Array, s: jax.Array,
                     t: jax.Array, num_masks: int) -> jax.Array:
  """p_{s|t}(· | x_t = mask k, x0) of (3.4), for a clean token of class m_cls, over [word, masks].

  Args:
    sched: α, β.
    m_cls: int [...], the class m_{x0} of the clean token (the kernel depends on x0 only
      through it; index 0 of the output is x0 itself).
    k: int [...], the current mask index in 0..M-1.
    s, t: times broadcasting against [...], 0 <= s < t <= 1.
    num_masks: M.
  Returns:
    [..., 1 + M] probabilities: P(x_s = x0), P(x_s = mask j) for j = 0..M-1 (they sum to 1).
  """
  s, t = _f(s), _f(t)
  m_cls, k = jnp.broadcast_arrays(jnp.asarray(m_cls), jnp.asarray(k))
  a_s, om_a_s, _ = sched.alpha_terms(s)
  a_t, om_a_t, _ = sched.alpha_terms(t)
  b_s, om_b_s, _ = sched.beta_terms(s)
  b_t, om_b_t, _ = sched.beta_terms(t)
  b_ts = jnp.where(b_s > 0, b_t / jnp.where(b_s > 0, b_s, 1.0), 0.0)  # β_{t|s}
  p_word = (a_s - a_t) / om_a_t  # (α_s - α_t) / (1 - α_t)
  ones = jnp.ones(m_cls.shape, b_s.dtype)
  r_s = mask_side(b_s * ones, om_b_s * ones, m_cls, num_masks)  # [..., M]
  r_t_k = jnp.where(k == m_cls, b_t + om_b_t / num_masks, om_b_t / num_masks)
  q = (1.0 - b_ts)[..., None] / num_masks + b_ts[..., None] * jax.nn.one_hot(
      k, num_masks, dtype=b_s.dtype)  # p_{t|s}(k | j) for every j
  p_mask = (om_a_s / om_a_t)[..., None] * r_s * q / r_t_k[..., None]
  return jnp.concatenate([jnp.broadcast_to(p_word, m_cls.shape)[..., None], p_mask], axis=-1)


# ------------------------------------------------------------------------- objective (3.5)-(3.6)


def phi(x: jax.Array) -> jax.Array:
  """φ(x) = (x - log(1 + x)) / x for x > -1, φ(0) = 0; Taylor series near 0 (no cancellation)."""
  small = jnp.abs(x) < _SERIES_X
  xs = jnp.where(small, x, 0.0)
  series = xs * (0.5 + xs * (-1.0 / 3.0 + xs * (0.25 - xs * 0.2)))
  xb = jnp.where(small, 1.0, x)
  return jnp.where(small, series, 1.0 - jnp.log1p(xb) / xb)


def identification_term(mu: jax.Array, k: jax.Array, m0: jax.Array, beta: jax.Array,
                        om_beta: jax.Array, dbeta: jax.Array, num_masks: int) -> jax.Array:
  """The intra-mask identification term of (3.6) at a masked position (Thm. A.12), [...].

    (-β̇ / (M β)) Σ_{j ≠ k} [ψ(j|k) log(ψ(j|k) / ψ_θ(j|k)) + ψ_θ(j|k) - ψ(j|k)]

  with the exact ratio ψ(j|k) = r_t^{x0}(j) / r_t^{x0}(k) (Prop. A.4) and the model's
  ψ_θ(j|k) = 1 - β/(β + c) μ_k + (β/c) μ_j (A.16), c = (1 - β)/M, μ = T x_θ. Each summand is
  ψ · h(δ/ψ) with h(x) = x - log(1 + x) and δ = ψ_θ - ψ = β e_j, where
      e_j = μ_j / c - μ_k / (β + c) - (1{j = m0} - 1{k = m0}) / r_t^{x0}(k)
  has no cancellation; the summand times the weight is (-β̇/M) e_j φ(β e_j / ψ), finite at β = 0.

  Args:
    mu: [..., M] class masses m_θ(· | x_t) of the model's clean-token prediction.
    k: int [...], the observed mask index; m0: int [...], the class of the clean token.
    beta, om_beta, dbeta: β_t, 1 - β_t (exact), β̇_t broadcasting against [...].
    num_masks: M (M = 1: identically 0).
  Returns:
    [...] the weighted term, >= 0.
  """
  if num_masks == 1:
    return jnp.zeros(mu.shape[:-1], mu.dtype)
  beta = jnp.broadcast_to(beta, k.shape).astype(mu.dtype)
  dbeta = jnp.broadcast_to(dbeta, k.shape).astype(mu.dtype)
  c = jnp.broadcast_to(om_beta, k.shape).astype(mu.dtype) / num_masks
  d = beta + c
  at_m0 = k == m0
  r_k = jnp.where(at_m0, d, c)  # r_t^{x0}(k)
  j = jnp.arange(num_masks)
  is_m0 = j == m0[..., None]  # [..., M]
  mu_k = jnp.take_along_axis(mu, k[..., None], axis=-1)  # [..., 1]
  e = (mu / c[..., None] - mu_k / d[..., None]
       - (is_m0.astype(mu.dtype) - at_m0[..., None].astype(mu.dtype)) / r_k[..., None])
  psi = jnp.where(is_m0, beta[..., None] + c[..., None], c[..., None]) / r_k[..., None]
  x = beta[..., None] * e / psi
  summand = e * phi(jnp.maximum(x, -1.0 + jnp.finfo(x.dtype).eps))
  summand = jnp.where(j == k[..., None], 0.0, summand)
  return (-dbeta / num_masks) * summand.sum(-1)


# --------------------------------------------------------------------- shared-Gumbel path (3.8)


def coupled_state(sched: MaskSchedule, des: Designation, clean: jax.Array, g_clean: jax.Array,
                  g_masks: jax.Array, t: jax.Array) -> jax.Array:
  """x̃_t = argmax_z {log p_t(z | x0) + g_z} of (3.8), with the Gumbels fixed across t.

  Only the clean token and the M masks have positive probability, so only their Gumbels enter:
  g_clean is the Gumbel of the clean token (g_{x0}) and g_masks those of the masks.

  Args:
    clean: int [..., L] clean words x0.
    g_clean: [..., L] Gumbel(0, 1) of the clean token.
    g_masks: [..., L, M] Gumbel(0, 1) of the masks.
    t: [...] times (broadcast over L).
  Returns:
    int32 [..., L]: x0 where the clean branch wins, else the winning mask id V + j.
  """
  chex.assert_equal_shape((clean, g_clean))
  chex.assert_equal_shape_prefix((clean, g_masks), clean.ndim)
  t = _f(t)[..., None]
  a, om_a, _ = sched.alpha_terms(t)
  b, om_b, _ = sched.beta_terms(t)
  r = mask_side(jnp.broadcast_to(b, clean.shape), jnp.broadcast_to(om_b, clean.shape),
                des.of(clean), des.num_masks)  # [..., L, M]
  score_masks = log0(om_a[..., None] * r) + g_masks.astype(r.dtype)
  score_clean = log0(a) + g_clean.astype(r.dtype)
  j = jnp.argmax(score_masks, axis=-1)
  best = jnp.max(score_masks, axis=-1)
  return jnp.where(score_clean >= best, clean, des.num_words + j).astype(jnp.int32)


def draw_gumbels(key: jax.Array, shape: tuple[int, ...], num_masks: int
                 ) -> tuple[jax.Array, jax.Array]:
  """(g_clean [*shape], g_masks [*shape, M]) i.i.d. Gumbel(0, 1) from one key (float32)."""
  g = jax.random.gumbel(key, tuple(shape) + (1 + num_masks,), jnp.float32)
  return g[..., 0], g[..., 1:]
