"""Per-level schedules (docs/method.md §2): numpy re-derivations, MDLM reduction, Appendix D, validation."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax.configs.base import get_base_config
from hmdlm_jax.processes import schedules
from hmdlm_jax.processes.schedules import Schedule

EPS = 1e-3
ETA = 1e-8

CASES = [
    ('loglinear', (0.0,)),
    ('loglinear', (0.0, 0.25)),
    ('loglinear', (0.0, 0.25, 0.5)),
    ('power', (1.0,)),
    ('power', (1.0, 2.0)),
    ('power', (0.5, 1.0, 3.0)),
]


def reference(kind, params, t, s):
  """Plain numpy float64 formulas of docs/method.md §2 / eq. 103-107: (α, α', λ', λ(s, t)), each [n, K]."""
  t = np.asarray(t, np.float64)[:, None]
  s = np.asarray(s, np.float64)[:, None]
  p = np.asarray(params, np.float64)[None, :]

  def alpha(x):
    if kind == 'loglinear':
      return 1 - (1 - EPS) * np.clip((x - p) / (1 - p), 0, 1)
    return 1 - (1 - EPS) * x ** p

  if kind == 'loglinear':
    da = np.where(t > p, -(1 - EPS) / (1 - p), 0.0) * np.ones_like(t)
  else:
    da = -(1 - EPS) * p * t ** (p - 1)
  def one_minus_alpha(x):
    return (1 - EPS) * (np.clip((x - p) / (1 - p), 0, 1) if kind == 'loglinear' else x ** p)

  a_t = alpha(t)
  om, om_s = one_minus_alpha(t), one_minus_alpha(s)
  np.testing.assert_allclose(om, 1 - a_t, atol=1e-15)
  haz = np.where(om > 0, -da / np.maximum(om, ETA), 0.0)
  # α(s) - α(t) written as (1 - α(t)) - (1 - α(s)): avoids float64 cancellation when α ≈ 1.
  lam = np.where(om > 0, (om - om_s) / np.where(om > 0, om, 1.0), 0.0)
  return a_t, da, haz, lam


@pytest.mark.parametrize('kind,params', CASES)
def test_matches_numpy_rederivation(kind, params):
  rng = np.random.default_rng(0)
  t32 = rng.uniform(1e-3, 1.0, 4096).astype(np.float32)
  s32 = (t32 * rng.uniform(0.0, 1.0, 4096)).astype(np.float32)
  sched = Schedule(kind, params, eps=EPS, eta=ETA)
  ref = reference(kind, params, t32, s32)
  got = [sched.alpha(t32), sched.dalpha(t32), sched.hazard(t32), sched.reveal_prob(s32, t32)]
  for name, g, r in zip(['alpha', 'dalpha', 'hazard', 'reveal_prob'], got, ref):
    assert g.dtype == jnp.float32 and g.shape == (4096, len(params)), name
    np.testing.assert_allclose(np.asarray(g, np.float64), r, rtol=1e-6, atol=1e-6, err_msg=name)
  # float64 end to end (x64): same formulas to round-off.
  with jax.enable_x64(True):
    t64, s64 = jnp.asarray(t32, jnp.float64), jnp.asarray(s32, jnp.float64)
    got = [sched.alpha(t64), sched.dalpha(t64), sched.hazard(t64), sched.reveal_prob(s64, t64)]
    for name, g, r in zip(['alpha', 'dalpha', 'hazard', 'reveal_prob'], got, ref):
      assert g.dtype == jnp.float64, name
      np.testing.assert_allclose(np.asarray(g), r, rtol=1e-12, atol=1e-13, err_msg=name)


def test_closed_form_hazards():
  """λ'_k = 1/(t - δ_k) for t > δ_k, else 0 (eq. 107); power: ω_k / t (Appendix D)."""
  t = np.linspace(0.01, 1.0, 397)
  haz = Schedule('loglinear', (0.0, 0.25)).hazard(t, np)
  np.testing.assert_allclose(haz[:, 0], 1 / t, rtol=1e-12)
  np.testing.assert_allclose(haz[:, 1], np.where(t > 0.25, 1 / np.maximum(t - 0.25, 1e-300), 0),
                             rtol=1e-9)
  np.testing.assert_allclose(Schedule('power', (1.0, 2.0)).hazard(t, np), np.stack(
      [1 / t, 2 / t], -1), rtol=1e-12)


@pytest.mark.parametrize('sched', [Schedule('loglinear', (0.0,)), Schedule('power', (1.0,))])
def test_k1_is_mdlm_loglinear(sched):
  """MDLM: move chance (1-ε)t, σ = -log(1-(1-ε)t), loss weight dσ/expm1(σ) = 1/t."""
  t = np.random.default_rng(1).uniform(1e-3, 1.0, 1000).astype(np.float32)
  sigma = -np.log1p(-(1 - EPS) * t.astype(np.float64))
  dsigma = (1 - EPS) / (1 - (1 - EPS) * t.astype(np.float64))
  np.testing.assert_allclose(np.asarray(sched.one_minus_alpha(t))[:, 0], (1 - EPS) * t, rtol=1e-7)
  np.testing.assert_allclose(np.asarray(sched.alpha(t))[:, 0], 1 - (1 - EPS) * t, atol=1e-7)
  np.testing.assert_allclose(np.asarray(sched.hazard(t))[:, 0], dsigma / np.expm1(sigma),
                             rtol=1e-6)
  np.testing.assert_allclose(np.asarray(sched.hazard(t))[:, 0], 1 / t, rtol=1e-6)


def test_shapes_follow_t():
  sched = Schedule('loglinear', (0.0, 0.25, 0.5))
  t = jnp.full((2, 5, 3), 0.7)
  assert sched.alpha(t).shape == (2, 5, 3, 3)
  assert sched.hazard(0.7).shape == (3,)
  assert sched.reveal_prob(t - 0.1, t).shape == (2, 5, 3, 3)
  assert jax.jit(sched.hazard)(t).shape == (2, 5, 3, 3)


def test_endpoints_and_inactive_levels():
  sched = Schedule('loglinear', (0.0, 0.25), eps=EPS)
  a = sched.alpha(np.array([0.0, 0.25, 1.0]), np)
  np.testing.assert_allclose(a[0], [1, 1])
  np.testing.assert_allclose(a[1], [1 - (1 - EPS) * 0.25, 1])
  np.testing.assert_allclose(a[2], [EPS, EPS])
  # Inactive level (α = 1): zero hazard and zero reveal probability.
  assert sched.hazard(np.array([0.2]), np)[0, 1] == 0
  assert sched.reveal_prob(np.array([0.1]), np.array([0.2]), np)[0, 1] == 0
  # Reveal probability to s = 0 is 1 for every active level.
  np.testing.assert_allclose(sched.reveal_prob(np.array([0.0]), np.array([0.6]), np), [[1, 1]])


# ---- Appendix D ordering ---------------------------------------------------------------------


@pytest.mark.parametrize('num_steps', [20, 256, 1000])
@pytest.mark.parametrize('sched', [Schedule('loglinear', (0.0, 0.25)),
                                   Schedule('power', (1.0, 2.0))])
def test_ordering_holds_for_paper_schedules(sched, num_steps):
  assert schedules.ordering_violations(sched, num_steps) == []
  assert schedules.check_ordering(sched, num_steps, 'error') == []


def test_paper_claim_64_inactive_steps_at_t256():
  """Appendix D: at T=256 the only steps with λ_0 > λ_1 are the 64 with t_n <= δ_1 = 0.25."""
  n = np.arange(1, 257)
  lam = Schedule('loglinear', (0.0, 0.25)).reveal_prob((n - 1) / 256, n / 256, np)
  bad = n[lam[:, 0] > lam[:, 1]]
  np.testing.assert_array_equal(bad, np.arange(1, 65))


@pytest.mark.parametrize('num_steps', [20, 1000])
def test_reversed_schedule_is_reported_with_steps(num_steps):
  # δ = (0.25, 0): level 1 (δ=0) has λ_1 = 1/n, level 0 has λ_0 = 1/(n - T/4) or 1 for
  # t_n > 0.25 (larger) -> violations exactly at the steps n > T/4.
  sched = Schedule('loglinear', (0.25, 0.0))
  viol = schedules.ordering_violations(sched, num_steps)
  steps = sorted(v.step for v in viol)
  assert steps == list(range(num_steps // 4 + 1, num_steps + 1))
  assert all(v.k == 0 and v.k_prime == 1 and v.lam_k > v.lam_k_prime for v in viol)
  v = next(v for v in viol if v.step == num_steps)
  np.testing.assert_allclose([v.lam_k, v.lam_k_prime], [1 / (0.75 * num_steps), 1 / num_steps])
  with pytest.raises(ValueError, match=f'n={num_steps}: λ_0='):
    schedules.check_ordering(sched, num_steps, 'error')
  with pytest.warns(UserWarning, match='violates the reveal ordering'):
    got = schedules.check_ordering(sched, num_steps, 'warn')
  assert got == viol
  assert schedules.check_ordering(sched, num_steps, 'off') == []
  with pytest.raises(ValueError, match='schedule.check_ordering'):
    schedules.check_ordering(sched, num_steps, 'loud')


# ---- validation ------------------------------------------------------------------------------


def _cfg(**kw):
  c = get_base_config().schedule
  for k, v in kw.items():
    c[k] = v
  return c


def test_from_config_defaults():
  s = schedules.schedule_from_config(_cfg(), 2)
  assert s == Schedule('loglinear', (0.0, 0.25), eps=1e-3)
  assert hash(s) == hash(Schedule('loglinear', (0.0, 0.25), eps=1e-3))
  s = schedules.schedule_from_config(_cfg(kind='power'), 2)
  assert s == Schedule('power', (1.0, 2.0), eps=1e-3)
  assert schedules.schedule_from_config(_cfg(offsets=(0.0,)), 1).num_levels == 1


@pytest.mark.parametrize('kw,num_levels,pattern', [
    (dict(offsets=(0.0, 1.0)), 2, r'schedule\.offsets\[1\]=1\.0 is outside \[0, 1\)'),
    (dict(offsets=(-0.1, 0.25)), 2, r'schedule\.offsets\[0\]=-0\.1 is outside'),
    (dict(kind='power', exponents=(1.0, 0.0)), 2, r'schedule\.exponents\[1\]=0\.0 must be > 0'),
    (dict(kind='power', exponents=(-1.0, 2.0)), 2, r'schedule\.exponents\[0\]'),
    (dict(), 1, r'schedule\.offsets has 2 values but model\.num_levels=1'),
    (dict(kind='power'), 3, r'schedule\.exponents has 2 values but model\.num_levels=3'),
    (dict(kind='cosine'), 2, r"schedule\.kind='cosine' is not one of \('loglinear', 'power'\)"),
    (dict(eps=0.0), 2, r'schedule\.eps=0\.0 must lie in \(0, 1\)'),
    (dict(eps=1.0), 2, r'schedule\.eps=1\.0'),
])
def test_bad_config_names_the_field(kw, num_levels, pattern):
  with pytest.raises(ValueError, match=pattern):
    schedules.schedule_from_config(_cfg(**kw), num_levels)


def test_direct_construction_validates():
  with pytest.raises(ValueError, match=r'Schedule\.params\[0\]'):
    Schedule('loglinear', (1.5,))
  with pytest.raises(ValueError, match=r'Schedule\.kind'):
    Schedule('linear', (0.0,))
  with pytest.raises(ValueError, match=r'Schedule\.eta'):
    Schedule('power', (1.0,), eta=-1.0)
  Schedule('power', (1.0,), eps=0.0, eta=0.0)  # allowed for exactness tests


def test_non_monotone_levels_warn():
  with pytest.warns(UserWarning, match='should be masked more slowly'):
    schedules.schedule_from_config(_cfg(offsets=(0.25, 0.0)), 2)
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    schedules.schedule_from_config(_cfg(offsets=(0.0, 0.25)), 2)
