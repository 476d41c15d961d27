"""Forward corruption (docs/method.md §3, Algorithm 1 lines 4-21): statistics and invariants.

Statistical checks use a tolerance of 5 standard errors of a binomial / uniform mean, with fixed
seeds (so they are deterministic; the tolerance says how unlikely a correct implementation is to
fail with a different seed: ~6e-7 per check).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes.schedules import Schedule

SCHED = Schedule('loglinear', (0.0, 0.25, 0.5))
K = SCHED.num_levels
MASK = 7


def _data(seed: int, b: int, l: int, given_rate: float = 0.0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, MASK, (b, l)).astype(np.int32)
  levels = rng.integers(0, K, (b, l)).astype(np.int32)
  given = rng.random((b, l)) < given_rate
  return tokens, levels, given


def _binom_ok(count: int, n: int, p: float) -> bool:
  se = np.sqrt(max(p * (1 - p), 1e-12) / n)
  return abs(count / n - p) < 5 * se


@pytest.mark.parametrize('t_value', [0.1, 0.3, 0.6, 0.95])
def test_mask_rate_per_level_matches_one_minus_alpha(t_value):
  tokens, levels, given = _data(0, 512, 64)
  t = jnp.full((512,), t_value, jnp.float32)
  _, _, masked = hmdlm.corrupt(jax.random.key(1), tokens, levels, given, t, SCHED,
                                    mask_id=MASK)
  masked = np.asarray(masked)
  p = np.asarray(SCHED.one_minus_alpha(jnp.float32(t_value)), np.float64)
  for k in range(K):
    sel = levels == k
    if p[k] == 0:
      assert not masked[sel].any(), f'level {k} is inactive at t={t_value} but was masked'
    else:
      assert _binom_ok(masked[sel].sum(), sel.sum(), p[k]), (k, masked[sel].mean(), p[k])


def test_mask_rate_with_per_example_times():
  tokens, levels, given = _data(2, 4096, 16)
  t = base.sample_times(jax.random.key(3), 4096)
  _, _, masked = hmdlm.corrupt(jax.random.key(4), tokens, levels, given, t, SCHED,
                                    mask_id=MASK)
  p = np.take_along_axis(np.asarray(SCHED.one_minus_alpha(t), np.float64), levels, axis=1)
  # Sum of independent Bernoullis with known p: compare the count with its mean and variance.
  m = np.asarray(masked)
  assert abs(m.sum() - p.sum()) < 5 * np.sqrt((p * (1 - p)).sum())


def test_token_and_level_masked_together_and_given_never_masked():
  tokens, levels, given = _data(5, 256, 32, given_rate=0.3)
  eps0 = Schedule('loglinear', (0.0, 0.25, 0.5), eps=0.0)
  for t_value, sched in [(0.5, SCHED), (1.0, eps0)]:
    t = jnp.full((256,), t_value)
    xt, ht, masked = jax.jit(hmdlm.corrupt, static_argnames=('schedule', 'mask_id'))(
        jax.random.key(6), tokens, levels, given, t, schedule=sched, mask_id=MASK)
    xt, ht, masked = map(np.asarray, (xt, ht, masked))
    assert masked.dtype == bool and xt.dtype == tokens.dtype and ht.dtype == levels.dtype
    np.testing.assert_array_equal(xt == MASK, masked)
    np.testing.assert_array_equal(ht == K, masked)
    np.testing.assert_array_equal(xt[~masked], tokens[~masked])
    np.testing.assert_array_equal(ht[~masked], levels[~masked])
    assert not (masked & given).any()
    if t_value == 1.0:  # α(1) = 0: every non-given position is masked
      np.testing.assert_array_equal(masked, ~given)


def test_antithetic_times_cover_the_interval_evenly():
  b, t_min = 1000, 1e-3
  t = np.asarray(base.sample_times(jax.random.key(0), b, t_min=t_min), np.float64)
  assert t.shape == (b,) and t.min() >= t_min and t.max() <= 1.0
  # Exactly one time per stratum of width (1 - t_min)/B.
  stratum = np.floor((t - t_min) / (1 - t_min) * b).astype(int)
  np.testing.assert_array_equal(np.sort(stratum), np.arange(b))
  # Unbiased: the mean over many batches is (1 + t_min)/2; stratification shrinks its spread far
  # below i.i.d. sampling (whose batch-mean sd is (1 - t_min)/sqrt(12 B)).
  means = np.asarray(jax.vmap(lambda k: base.sample_times(k, b, t_min=t_min).mean())(
      jax.random.split(jax.random.key(1), 400)), np.float64)
  iid_sd = (1 - t_min) / np.sqrt(12 * b)
  assert abs(means.mean() - (1 + t_min) / 2) < 5 * means.std(ddof=1) / np.sqrt(len(means))
  assert means.std() < 0.1 * iid_sd


def test_iid_times_are_uniform():
  t_min = 0.2
  t = np.asarray(base.sample_times(jax.random.key(2), 100_000, t_min=t_min,
                                         antithetic=False), np.float64)
  assert t.min() >= t_min and t.max() <= 1.0
  # Each of 10 equal bins holds 1/10 of the mass.
  counts = np.histogram(t, bins=10, range=(t_min, 1.0))[0]
  for c in counts:
    assert _binom_ok(c, len(t), 0.1)
  with pytest.raises(ValueError, match='loss.t_min'):
    base.sample_times(jax.random.key(0), 4, t_min=1.0)


@pytest.mark.parametrize('t_value,step', [(0.3, 0.05), (0.8, 0.1), (0.55, 0.2)])
def test_reveal_levels_rate_matches_lambda(t_value, step):
  tokens, levels, given = _data(7, 512, 64)
  t = jnp.full((512,), t_value, jnp.float32)
  _, ht, masked = hmdlm.corrupt(jax.random.key(8), tokens, levels, given, t, SCHED,
                                     mask_id=MASK)
  hs = np.asarray(hmdlm.reveal_levels(jax.random.key(9), levels, ht, masked, t, SCHED,
                                           step=step))
  masked, ht = np.asarray(masked), np.asarray(ht)
  # Revealed positions keep their level; masked ones are either h_m or their gold level.
  np.testing.assert_array_equal(hs[~masked], levels[~masked])
  in_r = masked & (hs != K)
  np.testing.assert_array_equal(hs[in_r], levels[in_r])
  lam = np.asarray(SCHED.reveal_prob(jnp.float32(max(t_value - step, 0.0)),
                                     jnp.float32(t_value)), np.float64)
  for k in range(K):
    sel = masked & (levels == k)
    if sel.sum() == 0:
      continue
    assert _binom_ok(in_r[sel].sum(), sel.sum(), lam[k]), (k, in_r[sel].mean(), lam[k])


def test_reveal_levels_clamps_s_at_zero():
  # s = max(t - step, 0) = 0: every masked position joins R (λ_k(0, t) = 1 for active levels).
  tokens, levels, given = _data(10, 64, 16)
  t = jnp.full((64,), 0.6)
  _, ht, masked = hmdlm.corrupt(jax.random.key(11), tokens, levels, given, t, SCHED,
                                     mask_id=MASK)
  hs = hmdlm.reveal_levels(jax.random.key(12), levels, ht, masked, t, SCHED, step=0.9)
  np.testing.assert_array_equal(np.asarray(hs), levels)
