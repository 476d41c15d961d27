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


REMDM_SCHEDULES = ('loop', 'cap', 'rescale')


def check_remdm(schedule: Any, eta: Any, t_on: Any, t_off: Any, alpha_on: Any) -> None:
  """The `sample.remdm_*` fields of ReMDM's sampler (docs/method.md §13.5).

  η ∈ [0, 1] (a probability); 'loop' needs 0 < t_off < t_on < 1, α_on ∈ (0, 1) and
  η ≤ (1 - α_on)/α_on, else its held phase would fill a masked position with probability
  η·α_on/(1 - α_on) > 1.
  """
  if schedule not in REMDM_SCHEDULES:
    raise ValueError(f'sample.remdm_schedule must be one of {REMDM_SCHEDULES}, got {schedule!r}.')
  eta = check_number('sample.remdm_eta', eta, lo=0.0, hi=1.0, hi_open=False)
  if schedule != 'loop':
    return
  t_on = check_number('sample.remdm_t_on', t_on, lo=0.0, hi=1.0, lo_open=True)
  check_number('sample.remdm_t_off', t_off, lo=0.0, hi=t_on, lo_open=True)
  alpha_on = check_number('sample.remdm_alpha_on', alpha_on, lo=0.0, hi=1.0, lo_open=True)
  if eta * alpha_on > 1.0 - alpha_on:
    raise ValueError(f'sample.remdm_eta={eta!r} must be <= (1 - sample.remdm_alpha_on) / '
                     f'remdm_alpha_on = {(1.0 - alpha_on) / alpha_on:.4g} for the loop schedule.')
