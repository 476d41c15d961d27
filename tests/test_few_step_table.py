"""scripts/few_step.py's Sudoku tables: means over seeds and differences paired by seed."""

from __future__ import annotations

import math

import numpy as np

from scripts import few_step

NFES = (4, 81)


def _results(solve: dict[str, list[float]], seeds: int = 3) -> dict:
  """Per seed, every run's confidence rows: solve rate `solve[run][seed] + nfe / 1000`, cell
  accuracy twice that."""
  out: dict = {'seeds': {}}
  for s in range(seeds):
    per = out['seeds'].setdefault(str(s), {})
    for run, vals in solve.items():
      if vals[s] is None:
        continue
      for n in NFES:
        r = vals[s] + n / 1000
        per[few_step._key(run, 'confidence', n)] = {'solve_rate': r, 'cell_accuracy': 2 * r}
  return out


def _pm(values: list[float]) -> str:
  a = 100 * np.asarray(values, np.float64)
  return f'{a.mean():.1f} ± {a.std(ddof=1) / math.sqrt(a.size):.1f}'


def _row(table: list[str], start: str, metric: str) -> list[str]:
  hits = [l for l in table if l.startswith(f'| {start} | confidence | {metric} |')]
  assert len(hits) == 1, (start, metric, table)
  return [c.strip() for c in hits[0].strip('|').split('|')[3:]]


def test_means_and_paired_differences_are_the_per_seed_arithmetic():
  solve = {'mdlm': [0.50, 0.60, 0.64], 'mdlm_more': [0.56, 0.61, 0.70],
           'mm_cont': [0.52, 0.50, 0.64], 'mdlm_more_cont': [0.55, 0.62, 0.66]}
  rows = [(r, 'confidence') for r in solve]
  table = few_step.sudoku_table(_results(solve), rows, NFES)
  for run, vals in solve.items():
    for i, n in enumerate(NFES):
      assert _row(table, few_step.LABELS[run], 'solve rate')[i] == _pm([v + n / 1000 for v in vals])
      assert _row(table, few_step.LABELS[run], 'cell accuracy')[i] == _pm(
          [2 * (v + n / 1000) for v in vals])
  # Paired: the per-seed differences' s.e., not the two runs' spreads (first minus second).
  diff = [a - b for a, b in zip(solve['mm_cont'], solve['mdlm_more_cont'])]
  pair = f"{few_step.LABELS['mm_cont']} − {few_step.LABELS['mdlm_more_cont']}"
  assert _row(table, pair, 'solve rate') == [_pm(diff)] * len(NFES)
  assert _row(table, pair, 'cell accuracy') == [_pm([2 * d for d in diff])] * len(NFES)
  assert _pm(diff) != _pm([-d for d in diff])
  control = f"{few_step.LABELS['mdlm_more']} − {few_step.LABELS['mdlm']}"
  assert _row(table, control, 'solve rate')[0] == _pm(
      [a - b for a, b in zip(solve['mdlm_more'], solve['mdlm'])])
  # A pair whose control was not asked for has no row.
  assert not [l for l in table if l.startswith(f"| {few_step.LABELS['mdlm_cd']} −")]


def test_a_pair_uses_only_the_seeds_holding_both_runs():
  solve = {'mdlm_cd': [0.40, 0.45, 0.47], 'mdlm_more': [0.42, None, 0.50]}
  table = few_step.sudoku_table(_results(solve), [(r, 'confidence') for r in solve], NFES)
  pair = f"{few_step.LABELS['mdlm_cd']} − {few_step.LABELS['mdlm_more']}"
  assert _row(table, pair, 'solve rate')[0] == _pm([0.40 - 0.42, 0.47 - 0.50])
  assert _row(table, few_step.LABELS['mdlm_more'], 'solve rate')[1] == _pm(
      [0.42 + 0.081, 0.50 + 0.081])
