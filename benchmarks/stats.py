"""Honest statistics for paired per-seed results (issue 69): one helper for every results page.

`paired(a, b)` takes two arms measured on the same seeds and gives each arm's mean ± standard
error, the paired difference's mean ± standard error, the paired t on n − 1 degrees of freedom,
its two-sided p (Student's t, scipy.stats) and the exact sign count. `verdict` turns them into the
only words the pages use: "holds (p = …)" where p < 0.05, otherwise "same sign in k of n seeds
(p = …)", k the seeds whose difference has the mean's sign.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import stats as scipy_stats

ALPHA = 0.05


@dataclasses.dataclass(frozen=True)
class MeanSE:
  """Mean and standard error of the mean (s.d. with ddof = 1 / √n; None below two values)."""
  mean: float
  se: float | None
  n: int


@dataclasses.dataclass(frozen=True)
class Paired:
  """Two arms on the same seeds and their difference a − b."""
  a: MeanSE
  b: MeanSE
  diff: MeanSE
  t: float | None       # mean / s.e. of the differences; None below two seeds or at s.e. 0
  df: int               # n − 1
  p: float | None       # two-sided, Student's t on df degrees of freedom
  positive: int         # seeds with a − b > 0
  negative: int         # seeds with a − b < 0
  n: int

  @property
  def same_sign(self) -> int:
    """Seeds whose difference has the sign of the mean difference (0 when the mean is 0)."""
    if self.diff.mean > 0:
      return self.positive
    return self.negative if self.diff.mean < 0 else 0


def mean_se(values: Sequence[float]) -> MeanSE:
  """Mean and standard error of `values` (at least one)."""
  x = np.asarray(values, np.float64)
  if x.size == 0:
    raise ValueError('mean_se of no values')
  se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else None
  return MeanSE(float(x.mean()), se, int(x.size))


def t_two_sided_p(t: float, df: int) -> float:
  """P(|T| ≥ |t|) for Student's T with `df` degrees of freedom."""
  if df < 1:
    raise ValueError(f'df={df}: a t test needs at least 2 values')
  return float(2.0 * scipy_stats.t.sf(abs(t), df))


def paired(a: Sequence[float], b: Sequence[float]) -> Paired:
  """The paired comparison of arms `a` and `b` (a[i] and b[i] from the same seed)."""
  if len(a) != len(b) or not len(a):
    raise ValueError(f'paired needs equal, non-empty arms (got {len(a)} and {len(b)})')
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  diff = mean_se(d)
  t = p = None
  if diff.se is not None and diff.se > 0:
    t = diff.mean / diff.se
    p = t_two_sided_p(t, d.size - 1)
  return Paired(mean_se(a), mean_se(b), diff, t, d.size - 1, p, int((d > 0).sum()),
                int((d < 0).sum()), int(d.size))


def fmt_p(p: float) -> str:
  """p to two significant figures ('p < 0.001' below that)."""
  return 'p < 0.001' if p < 1e-3 else f'p = {p:.2g}'


def verdict(r: Paired) -> str:
  """The words p allows: 'holds (p = …)' only where p < ALPHA, else the exact sign count."""
  if r.p is None:
    return f'same sign in {r.same_sign} of {r.n} seeds (no t: s.e. 0 or one seed)'
  if r.p < ALPHA:
    return f'holds ({fmt_p(r.p)})'
  return f'same sign in {r.same_sign} of {r.n} seeds ({fmt_p(r.p)})'


def t_cell(r: Paired) -> str:
  """'t = …, p = …, k/n' of a paired comparison (a table cell)."""
  if r.t is None:
    return f'–, {r.same_sign}/{r.n}'
  return f't = {r.t:.1f}, {fmt_p(r.p)}, {r.same_sign}/{r.n}'
