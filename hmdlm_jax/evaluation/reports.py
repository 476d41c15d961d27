"""What evaluation reports are made of: rates, seed statistics, flat scalars and JSON files.

JSON files are written by process 0 only; non-finite floats become the strings 'nan' / 'inf' /
'-inf' (JSON has no NaN), as in metrics.jsonl (hmdlm_jax/metrics.py).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np

from hmdlm_jax import lease
from hmdlm_jax import metrics as metrics_lib
from hmdlm_jax import storage


PICTURES_DIR = 'pictures'  # reveal-order pictures of --mode=sample


def eval_file(step: int, rows: int | None, seeds: Sequence[int] = (), *,
              in_training: bool = False) -> str:
  """Name of an evaluation report (evaluation/run.py's schema) of checkpoint `step` on the test
  split's first `rows` rows (None: all of them), sampling with `seeds` (none: no samples drawn),
  by the training loop or not:
  `eval_<step>_test_<rows|all>rows[_seeds<s>-<s>...][_in_training].json`. Training's evaluations
  and --mode=eval's never share a name."""
  name = f'eval_{int(step)}_test_{"all" if rows is None else int(rows)}rows'
  if seeds:
    name += '_seeds' + '-'.join(str(int(s)) for s in seeds)
  return name + ('_in_training' if in_training else '') + '.json'


def eval_samples_file(report: str) -> str:
  """Name of the samples an evaluation drew, beside its report `report` (eval_file's name)."""
  return report[:-len('.json')] + '_samples.jsonl'


def samples_file(step: int) -> str:
  """Name of --mode=sample's samples (JSON lines, every token's reveal step) of checkpoint
  `step`."""
  return f'samples_{int(step)}.jsonl'


def ratio(num: float, den: float) -> float | None:
  """num / den, or None when den is 0 (nothing to measure)."""
  return float(num) / float(den) if den > 0 else None


def mean_std(per_seed: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
  """Mean and (population) std over seeds of every numeric metric; None if any seed has None.

  Metrics that are strings for every seed (reasons, names) are kept per seed only.
  """
  mean, std = {}, {}
  for k in per_seed[0]:
    vals = [d[k] for d in per_seed]
    if all(isinstance(v, str) for v in vals):
      continue
    if any(v is None or isinstance(v, (str, bool)) for v in vals):
      mean[k] = std[k] = None
      continue
    a = np.asarray(vals, np.float64)
    mean[k], std[k] = float(a.mean()), float(a.std())
  return mean, std


def mean_se(values: Sequence[float | None]) -> tuple[float | None, float | None]:
  """(mean, standard error of the mean = s.d. with ddof = 1 / √n) of the values.

  None when a value is None or not finite (a metric unavailable for a seed); the s.e. is None
  below two values.
  """
  if not values or any(v is None or not math.isfinite(float(v)) for v in values):
    return None, None
  a = np.asarray(values, np.float64)
  se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else None
  return float(a.mean()), se


def mean_pm(mean: float | None, spread: float | None, *, digits: int, count: int,
            scale: float = 1.0, suffix: str = '') -> str:
  """'m<suffix> ± s' of a mean over `count` values (seeds), 'm<suffix>' alone when there is no
  spread to show (one value: a population std of 0 is no error bar; None or NaN), 'n/a' when
  `mean` is None. `scale` multiplies both (100: percent)."""
  if mean is None:
    return 'n/a'
  text = f'{scale * mean:.{digits}f}{suffix}'
  if count < 2 or spread is None or not math.isfinite(spread):
    return text
  return f'{text} ± {scale * spread:.{digits}f}'


def flatten_metrics(tree: Mapping[str, Any], prefix: str = '') -> dict[str, float]:
  """Nested results -> {'a/b/c': float} of the finite numbers only (for metrics.jsonl / TB)."""
  out: dict[str, float] = {}
  for k, v in tree.items():
    name = f'{prefix}{k}'
    if isinstance(v, Mapping):
      out.update(flatten_metrics(v, name + '/'))
    elif isinstance(v, (int, float, np.number)) and not isinstance(v, bool):
      if math.isfinite(float(v)):
        out[name] = float(v)
  return out


def json_safe(o: Any) -> Any:
  """A nested structure with non-finite floats as strings and numpy values as Python ones."""
  if isinstance(o, Mapping):
    return {str(k): json_safe(v) for k, v in o.items()}
  if isinstance(o, (list, tuple)):
    return [json_safe(v) for v in o]
  if isinstance(o, np.ndarray):
    return json_safe(o.tolist())
  if isinstance(o, np.generic):
    o = o.item()
  if isinstance(o, float):
    return metrics_lib.json_value(o)
  return o


def write_json(path: str, obj: Any) -> None:
  """Atomic JSON write (storage.write_text); process 0 only; fenced (lease.check_held)."""
  if jax.process_index() != 0:
    return
  lease.check_held()
  storage.makedirs(os.path.dirname(storage.absolute(path)))
  storage.write_text(path, json.dumps(json_safe(obj), indent=2, allow_nan=False))


def write_jsonl(path: str, records: Iterable[Mapping[str, Any]]) -> None:
  """One JSON object per line, written atomically; process 0 only; fenced (lease.check_held)."""
  if jax.process_index() != 0:
    return
  lease.check_held()
  storage.makedirs(os.path.dirname(storage.absolute(path)))
  storage.write_text(path, ''.join(json.dumps(json_safe(r), allow_nan=False) + '\n'
                                   for r in records))
