"""Summaries of a generative sweep (docs/method.md §8.5): mean ± s.e. over seeds, the GenPPL–entropy
front. Pure numpy on plain dicts; hmdlm_jax/front.py draws and scores the samples.

Lower generative perplexity is better and, at equal quality, higher entropy is (a sampler can buy
a low GenPPL with repetition, i.e. low entropy). The front of a set of (entropy, GenPPL) points
is the set no other point beats on both: models are compared along it, at equal entropy.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from hmdlm_jax.evaluation import reports


def summarise(per_seed: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
  """(mean, se) dicts over the seeds of every numeric metric (keys of the first seed's dict)."""
  rows = list(per_seed.values())
  if not rows:
    raise ValueError('summarise: no seed to summarise.')
  mean, se = {}, {}
  for key, first in rows[0].items():
    if isinstance(first, bool) or not (first is None or isinstance(first, (int, float))):
      continue
    mean[key], se[key] = reports.mean_se([r.get(key) for r in rows])
  return mean, se


def pareto_front(entropy: Sequence[float | None], gen_ppl: Sequence[float | None]) -> list[int]:
  """Indices of the points no other point dominates, by increasing entropy.

  Point j dominates i when entropy_j >= entropy_i and gen_ppl_j <= gen_ppl_i, one of them
  strictly. Points with a missing or non-finite coordinate are left out.
  """
  if len(entropy) != len(gen_ppl):
    raise ValueError(f'pareto_front: {len(entropy)} entropies for {len(gen_ppl)} GenPPLs.')
  ok = [i for i, (e, g) in enumerate(zip(entropy, gen_ppl))
        if e is not None and g is not None and math.isfinite(e) and math.isfinite(g)]

  def dominated(i: int) -> bool:
    return any(entropy[j] >= entropy[i] and gen_ppl[j] <= gen_ppl[i]
               and (entropy[j] > entropy[i] or gen_ppl[j] < gen_ppl[i]) for j in ok)

  return sorted((i for i in ok if not dominated(i)), key=lambda i: (entropy[i], gen_ppl[i]))


def fronts(points: Sequence[Mapping[str, Any]], metric: str) -> dict[str, list[int]]:
  """Per step count ('K' as a string) the front of the points at that K on the seed means of
  'entropy' and `metric` (indices into `points`)."""
  out: dict[str, list[int]] = {}
  for k in sorted({int(p['steps']) for p in points}):
    idx = [i for i, p in enumerate(points) if int(p['steps']) == k]
    front = pareto_front([points[i]['mean'].get('entropy') for i in idx],
                         [points[i]['mean'].get(metric) for i in idx])
    out[str(k)] = [idx[j] for j in front]
  return out


def at_entropy(points: Sequence[Mapping[str, Any]], front: Sequence[int], metric: str,
               entropy: float) -> float | None:
  """`metric` on the front at `entropy`: linear in log GenPPL between the two front points whose
  mean entropies bracket it (the point itself when one matches); None outside the front's range."""
  xs = [float(points[i]['mean']['entropy']) for i in front]
  ys = [math.log(float(points[i]['mean'][metric])) for i in front]
  if not xs or not xs[0] <= entropy <= xs[-1]:
    return None
  if len(xs) == 1:
    return math.exp(ys[0])
  return float(math.exp(np.interp(entropy, xs, ys)))
