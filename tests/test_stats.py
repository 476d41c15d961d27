"""benchmarks/stats.py against closed forms and scipy's own paired t test."""

from __future__ import annotations

import math

import pytest
from scipy import stats as scipy_stats

from benchmarks import stats


def test_mean_se_closed_form():
  r = stats.mean_se([1.0, 2.0, 3.0])
  assert (r.mean, r.n) == (2.0, 3)
  assert r.se == pytest.approx(1 / math.sqrt(3))
  assert stats.mean_se([4.0]).se is None
  with pytest.raises(ValueError):
    stats.mean_se([])


@pytest.mark.parametrize('t', [0.0, 0.5, 1.0, 3.6, 12.0, -2.0])
def test_two_sided_p_closed_forms(t):
  # df = 1 (Cauchy): 1 − 2/π·atan|t|; df = 2: 1 − |t| / √(2 + t²).
  assert stats.t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(abs(t)))
  assert stats.t_two_sided_p(t, 2) == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t))


def test_paired_closed_form():
  # d = (2, 3, 2): mean 7/3, s.d. √(1/3), s.e. 1/3, t = 7 on 2 degrees of freedom.
  r = stats.paired([3.0, 5.0, 4.0], [1.0, 2.0, 2.0])
  assert r.diff.mean == pytest.approx(7 / 3)
  assert r.diff.se == pytest.approx(1 / 3)
  assert r.t == pytest.approx(7.0)
  assert r.df == 2
  assert r.p == pytest.approx(1 - 7 / math.sqrt(51))
  assert (r.positive, r.negative, r.same_sign, r.n) == (3, 0, 3, 3)
  assert r.a.mean == pytest.approx(4.0) and r.b.mean == pytest.approx(5 / 3)


def test_paired_matches_scipy_ttest_rel():
  a = [0.656, 0.65, 0.618, 0.61, 0.7]
  b = [0.54, 0.504, 0.57, 0.63, 0.61]
  r = stats.paired(a, b)
  ref = scipy_stats.ttest_rel(a, b)
  assert r.t == pytest.approx(ref.statistic)
  assert r.p == pytest.approx(ref.pvalue)
  assert (r.positive, r.negative) == (4, 1)


def test_verdict_words_follow_p():
  strong = stats.paired([3.0, 5.0, 4.0, 6.0, 5.0], [1.0, 2.0, 2.0, 3.0, 2.0])  # t ≈ 10.6, 4 df
  assert stats.verdict(strong) == 'holds (p < 0.001)'
  # d = (1, 2, 6): every seed positive, t = 3 / √(7/3) ≈ 1.96 on 2 df, p ≈ 0.19: no "holds".
  same = stats.paired([2.0, 3.0, 7.0], [1.0, 1.0, 1.0])
  assert same.p == pytest.approx(1 - same.t / math.sqrt(2 + same.t ** 2))
  assert stats.verdict(same) == 'same sign in 3 of 3 seeds (p = 0.19)'
  mixed = stats.paired([3.0, 5.0, 4.0], [1.0, 2.0, 4.5])  # one seed the other way
  assert stats.verdict(mixed) == 'same sign in 2 of 3 seeds (p = 0.29)'
  assert stats.t_cell(same) == 't = 2.0, p = 0.19, 3/3'
  negative = stats.paired([1.0, 1.0, 1.0], [2.0, 3.0, 7.0])
  assert (negative.same_sign, stats.verdict(negative)) == (3, stats.verdict(same))


def test_paired_rejects_unequal_arms_and_handles_zero_spread():
  with pytest.raises(ValueError):
    stats.paired([1.0, 2.0], [1.0])
  r = stats.paired([2.0, 3.0], [1.0, 2.0])  # every difference 1: s.e. 0, no t
  assert r.t is None and r.p is None
  assert stats.verdict(r).startswith('same sign in 2 of 2 seeds')
