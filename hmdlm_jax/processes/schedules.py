"""Per-level masking schedules α_k(t) of HMDLM (docs/method.md §2; paper eq. 6, Appendices B, D, E).

`α_k(t)` is the probability that a level-k position is still revealed at time t ∈ [0, 1]; higher
levels are masked more slowly. Two families, vectorised over the K levels: 'loglinear' with
offsets δ_k (LM1B, eq. 103) and 'power' with exponents ω_k (WikiHow). Each gives α_k, α'_k, the
hazard λ'_k(t) = -α'_k / max(1 - α_k, η) (the ELBO weight, eq. 104; 0 where α_k = 1) and the
reveal probability λ_k(s, t) (eq. 7); `ordering_violations` / `check_ordering` test Appendix D's
condition on the sampling grid. `1 - α_k` is computed directly, never as a difference, which
cancels catastrophically in float32 near t = δ_k. K = 1 with δ = 0 (or ω = 1) is MDLM's
log-linear schedule exactly (docs/method.md §12).

All methods follow the floating dtype of `t` (float32 at least; float64 under x64), so the same
code serves bf16 training (promoted to float32) and float64 exactness tests. The private `_xp`
argument lets the host-side checks run the very same formulas in numpy float64.
"""

from __future__ import annotations

import dataclasses
import math
import types
import warnings
from typing import Any, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

KINDS = ('loglinear', 'power')
ORDERING_MODES = ('error', 'warn', 'off')


def _as_float(t: Any, xp: types.ModuleType) -> Any:
  """Returns ``t`` as a floating array of at least float32 precision (follows float64)."""
  t = xp.asarray(t)
  if xp.issubdtype(t.dtype, xp.floating):
    return t.astype(xp.promote_types(t.dtype, xp.float32))
  return t.astype(xp.float32)


def _validate(kind: str, params: Sequence[float], eps: float, eta: float, *,
              kind_name: str, params_name: str, eps_name: str, num_levels: int | None = None,
              num_levels_name: str = 'num_levels', eps_open: bool = False) -> None:
  """Raises ValueError naming the offending field; shared by `Schedule` and the config builder."""
  if kind not in KINDS:
    raise ValueError(f'{kind_name}={kind!r} is not one of {KINDS}.')
  if len(params) == 0:
    raise ValueError(f'{params_name} is empty; it needs one value per hierarchy level.')
  if num_levels is not None and len(params) != num_levels:
    raise ValueError(f'{params_name} has {len(params)} values but {num_levels_name}={num_levels}; '
                     'give exactly one value per hierarchy level (the MDLM twin, '
                     f'{num_levels_name}=1, takes {params_name}='
                     f"{'(1.0,)' if kind == 'power' else '(0.0,)'}).")
  for k, p in enumerate(params):
    if not math.isfinite(p):
      raise ValueError(f'{params_name}[{k}]={p} is not finite.')
    if kind == 'loglinear' and not 0.0 <= p < 1.0:
      raise ValueError(f'{params_name}[{k}]={p} is outside [0, 1) (offsets δ_k of the log-linear '
                       'schedule).')
    if kind == 'power' and not p > 0.0:
      raise ValueError(f'{params_name}[{k}]={p} must be > 0 (exponents ω_k of the power schedule).')
  lo_ok = eps > 0.0 if eps_open else eps >= 0.0
  if not (math.isfinite(eps) and lo_ok and eps < 1.0):
    interval = '(0, 1)' if eps_open else '[0, 1)'
    raise ValueError(f'{eps_name}={eps} must lie in {interval} (α_k(1) = eps).')
  if not (math.isfinite(eta) and eta >= 0.0):
    raise ValueError(f'Schedule.eta={eta} must be a finite number >= 0 (hazard floor).')


@dataclasses.dataclass(frozen=True)
class Schedule:
  """K per-level schedules; hashable, so it can be a static argument of `jax.jit`.

  Attributes:
    kind: 'loglinear' | 'power'.
    params: δ_k (loglinear, in [0, 1)) or ω_k (power, > 0); one per level, len == K.
    eps: α_k(1) = eps, in [0, 1) (0 is allowed for exactness tests; configs require > 0).
    eta: floor of the hazard denominator 1 - α_k (>= 0).
  """
  kind: str
  params: tuple[float, ...]
  eps: float = 1e-3
  eta: float = 1e-8

  def __post_init__(self) -> None:
    params = tuple(float(p) for p in self.params)
    object.__setattr__(self, 'params', params)
    object.__setattr__(self, 'eps', float(self.eps))
    object.__setattr__(self, 'eta', float(self.eta))
    _validate(self.kind, params, self.eps, self.eta, kind_name='Schedule.kind',
              params_name='Schedule.params', eps_name='Schedule.eps')

  @property
  def num_levels(self) -> int:
    return len(self.params)

  def _p(self, dtype: Any, xp: types.ModuleType) -> Any:
    return xp.asarray(self.params, dtype=dtype)  # [K]

  def one_minus_alpha(self, t: Any, _xp: types.ModuleType = jnp) -> Any:
    """1 - α_k(t), the mask probability of a level-k position, without cancellation.

    Args:
      t: times, any shape [...].
    Returns:
      [..., K] in the dtype of t (at least float32).
    """
    xp = _xp
    t = _as_float(t, xp)[..., None]  # [..., 1]
    p = self._p(t.dtype, xp)  # [K]
    if self.kind == 'loglinear':
      t_eff = xp.clip((t - p) / (1.0 - p), 0.0, 1.0)  # eq. 103
    else:
      t_eff = xp.power(xp.clip(t, 0.0, 1.0), p)
    return (1.0 - self.eps) * t_eff

  def alpha(self, t: Any, _xp: types.ModuleType = jnp) -> Any:
    """α_k(t): [...] -> [..., K]."""
    return 1.0 - self.one_minus_alpha(t, _xp)

  def dalpha(self, t: Any, _xp: types.ModuleType = jnp) -> Any:
    """dα_k/dt: [...] -> [..., K] (one-sided at the kinks: 0 at t = δ_k, right limit at t = 0)."""
    xp = _xp
    t = _as_float(t, xp)[..., None]
    p = self._p(t.dtype, xp)
    if self.kind == 'loglinear':
      active = (t > p) & (t <= 1.0)
      return xp.where(active, -(1.0 - self.eps) / (1.0 - p), xp.zeros_like(t * p))
    tc = xp.clip(t, 0.0, 1.0)
    with np.errstate(divide='ignore'):  # 0 ** (ω - 1) for ω < 1: the (infinite) right limit
      d = -(1.0 - self.eps) * p * xp.power(tc, p - 1.0)
    return xp.where(t <= 1.0, d, xp.zeros_like(d))

  def hazard(self, t: Any, _xp: types.ModuleType = jnp) -> Any:
    """λ'_k(t) = -α'_k / max(1 - α_k, η), 0 where α_k(t) = 1 (eq. 104, 107): [...] -> [..., K]."""
    xp = _xp
    om = self.one_minus_alpha(t, xp)
    den = xp.maximum(om, self.eta)
    den = xp.where(om > 0, den, xp.ones_like(den))  # keeps the unused branch finite
    return xp.where(om > 0, -self.dalpha(t, xp) / den, xp.zeros_like(om))

  def reveal_prob(self, s: Any, t: Any, _xp: types.ModuleType = jnp) -> Any:
    """λ_k(s, t) = (α_k(s) - α_k(t)) / (1 - α_k(t)), 0 where α_k(t) = 1 (eq. 7).

    Args:
      s: earlier times (s <= t), broadcastable with t.
      t: times [...].
    Returns:
      [..., K] probabilities in [0, 1].
    """
    xp = _xp
    om_t = self.one_minus_alpha(t, xp)
    om_s = self.one_minus_alpha(s, xp).astype(om_t.dtype)
    safe = xp.where(om_t > 0, om_t, xp.ones_like(om_t))
    lam = xp.where(om_t > 0, (om_t - om_s) / safe, xp.zeros_like(om_t))
    return xp.clip(lam, 0.0, 1.0)


def schedule_from_config(cfg_schedule: Any, num_levels: int) -> Schedule:
  """Builds and validates a `Schedule` from the config's `schedule` section (docs/method.md §2).

  Args:
    cfg_schedule: object with fields kind, offsets, exponents, eps (config/schema.py).
    num_levels: K, the config's `model.num_levels`.
  Returns:
    The schedule. Raises ValueError naming the field on bad values; warns when a higher level
    would not mask more slowly (parameters not non-decreasing in k).
  """
  kind = getattr(cfg_schedule, 'kind')
  if kind not in KINDS:
    raise ValueError(f'schedule.kind={kind!r} is not one of {KINDS}.')
  field = 'offsets' if kind == 'loglinear' else 'exponents'
  raw = getattr(cfg_schedule, field)
  if isinstance(raw, (int, float)):
    raw = (raw,)
  try:
    params = tuple(float(p) for p in raw)
  except (TypeError, ValueError) as e:
    raise ValueError(f'schedule.{field}={raw!r} must be a sequence of numbers.') from e
  eps = float(getattr(cfg_schedule, 'eps'))
  if not isinstance(num_levels, int) or num_levels < 1:
    raise ValueError(f'model.num_levels={num_levels!r} must be an integer >= 1.')
  _validate(kind, params, eps, 1e-8, kind_name='schedule.kind', params_name=f'schedule.{field}',
            eps_name='schedule.eps', num_levels=num_levels, num_levels_name='model.num_levels',
            eps_open=True)
  sched = Schedule(kind, params, eps=eps)
  # α_k must decrease in t for every level (checked numerically on a fine grid, float64).
  grid = np.linspace(0.0, 1.0, 2049)
  a = sched.alpha(grid, np)  # [2049, K]
  for k in range(num_levels):
    if np.any(np.diff(a[:, k]) > 0) or not a[-1, k] < a[0, k]:
      raise ValueError(f'schedule.{field}[{k}]={params[k]} gives an α_{k}(t) that does not '
                       'decrease in t.')
  if any(b < a_ for a_, b in zip(params, params[1:])):
    warnings.warn(f'schedule.{field}={params} is not non-decreasing in the level: higher levels '
                  'should be masked more slowly (docs/method.md §1-2, Appendix D).', stacklevel=2)
  return sched


class Violation(NamedTuple):
  """One failure of Appendix D's ordering (eq. 102) on the sampling grid."""
  step: int  # n, the reverse step t_n = n/T -> s = (n-1)/T
  k: int  # lower level
  k_prime: int  # higher level k' > k, still active at t_n
  lam_k: float
  lam_k_prime: float


def ordering_violations(schedule: Schedule, num_steps: int, *, atol: float = 1e-12
                        ) -> list[Violation]:
  """Appendix D (eq. 102): λ_k(t_n) <= λ_k'(t_n) for k < k' wherever α_k'(t_n) < 1.

  Evaluated in numpy float64 on the grid t_n = n/T, s = (n-1)/T, n = T..1.

  Args:
    schedule: the schedule.
    num_steps: T (>= 1).
    atol: slack for float64 rounding.
  Returns:
    Violations ordered by step (descending n), then k, k'.
  """
  if not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
    raise ValueError(f'sample.num_steps={num_steps!r} must be an integer >= 1.')
  n = np.arange(num_steps, 0, -1)
  t = n / num_steps
  s = (n - 1) / num_steps
  lam = schedule.reveal_prob(s, t, np)  # [T, K]
  active = schedule.one_minus_alpha(t, np) > 0  # [T, K]
  out = []
  big_k = schedule.num_levels
  for row in range(num_steps):
    for k in range(big_k):
      for kp in range(k + 1, big_k):
        if active[row, kp] and lam[row, k] > lam[row, kp] + atol:
          out.append(Violation(int(n[row]), k, kp, float(lam[row, k]), float(lam[row, kp])))
  return out


def check_ordering(schedule: Schedule, num_steps: int, mode: str = 'error') -> list[Violation]:
  """Validates Appendix D's ordering; `mode` is the config field `schedule.check_ordering`.

  Returns the violations ('warn' / 'off' never raise; 'off' checks nothing and returns []).
  """
  if mode not in ORDERING_MODES:
    raise ValueError(f'schedule.check_ordering={mode!r} is not one of {ORDERING_MODES}.')
  if mode == 'off':
    return []
  viol = ordering_violations(schedule, num_steps)
  if viol:
    shown = '; '.join(f'n={v.step}: λ_{v.k}={v.lam_k:.6g} > λ_{v.k_prime}={v.lam_k_prime:.6g}'
                      for v in viol[:3])
    steps = len({v.step for v in viol})
    msg = (f'schedule {schedule.kind} {schedule.params} violates the reveal ordering of Appendix D '
           f'(a lower level revealed with a higher probability than a higher one) at {steps} of '
           f'the {num_steps} steps of the sampling grid (t_n = n/{num_steps}, sample.num_steps), '
           f'{len(viol)} (step, level pair) violations, e.g. {shown}. Make the schedule '
           'non-decreasing in the level, or set schedule.check_ordering to "warn" or "off" to '
           'proceed anyway.')
    if mode == 'error':
      raise ValueError(msg)
    warnings.warn(msg, stacklevel=2)
  return viol
