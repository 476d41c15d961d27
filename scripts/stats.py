"""Summaries over seeds, shared by the experiment scripts."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def mean_se(values: Sequence[float]) -> tuple[float, float]:
  """(mean, standard error of the mean); the error is NaN below two values."""
  a = np.asarray(values, np.float64)
  se = float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else math.nan
  return float(a.mean()), se
