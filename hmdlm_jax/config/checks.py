"""Field checks shared by the config views (hmdlm_jax/config/).

Each raises ValueError naming the field and what is allowed. A leaf module: it imports nothing of
the package, so every view module can use it without an import cycle.
"""

from __future__ import annotations

import math
from typing import Any


def is_int(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def check_int(field: str, value: Any, *, minimum: int) -> None:
  if not is_int(value) or value < minimum:
    raise ValueError(f'{field} must be an integer >= {minimum}, got {value!r}.')


def check_bool(field: str, value: Any) -> None:
  if not isinstance(value, bool):
    raise ValueError(f'{field} must be True or False, got {value!r}.')


def check_number(field: str, value: Any, *, lo: float, hi: float = math.inf,
                  lo_open: bool = False, hi_open: bool = True) -> float:
  """A finite real in the interval; the message names the field and the interval."""
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise ValueError(f'{field} must be a finite number, got {value!r}.')
  ok_lo = value > lo if lo_open else value >= lo
  ok_hi = value < hi if hi_open else value <= hi
  if not (ok_lo and ok_hi):
    interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    raise ValueError(f'{field}={value!r} must lie in {interval}.')
  return float(value)

