r"""The results pages' tables from GenPPL–entropy sweeps (`python -m hmdlm_jax.front`, --groups).

  python -m scripts.front_table --fronts=A.json,B.json:t3_ --pairs=t3_hdlm-t3_mdlm,mm_cd-mdlm_more \
      [--entropies=3.3,3.5] [--labels=mdlm=MDLM,...] [--out=merged.json]

Each FILE[:PREFIX] is one sweep's JSON (its groups renamed PREFIX + name, so that two sweeps may
both have an 'mdlm'; the same PREFIX + name in two sweeps pools the run's points, e.g. a second
sweep at other temperatures); all must share K, seeds and rows per point. Every run's front is
drawn again on its points and read at --entropies (default: the sweeps' own). Printed (markdown):
per group and K the judge GenPPL at each entropy, mean ± s.e. over the group's runs (its training
seeds), '–' where a run's front does not reach that entropy; then per --pairs A-B the paired
differences A − B over runs of equal index (the same training seed when both groups list seeds in
order). --out writes the merged runs (per-seed points, fronts) and groups: the raw JSON beside a
results page.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from hmdlm_jax import front
from hmdlm_jax.evaluation import front as front_lib
from hmdlm_jax.evaluation import reports

METRIC = 'gen_ppl_judge'


def merge(specs: Sequence[str], entropies: Sequence[float] = ()) -> dict[str, Any]:
  """{'settings', 'judge', 'runs', 'groups'} of the sweeps FILE[:PREFIX] in `specs`.

  A run in several sweeps (PREFIX + name; e.g. a second sweep at other temperatures) gets the
  points of all; a group in several must list the same runs. Every run's front is drawn again on
  its points and read at `entropies` (default: the sweeps' own, which must then agree).
  """
  out: dict[str, Any] = {'settings': None, 'judge': None, 'runs': {}, 'groups': {}}
  members: dict[str, list[str]] = {}
  for spec in specs:
    path, _, prefix = spec.partition(':')
    with open(path, encoding='utf-8') as f:
      sweep = json.load(f)
    shared = {k: sweep['settings'][k] for k in ('steps', 'seeds', 'num_samples')}
    shared['entropies'] = list(entropies) or sweep['settings']['entropies']
    if out['settings'] not in (None, shared):
      raise ValueError(f'--fronts: {path} was swept with {shared}, the others with '
                       f'{out["settings"]}; sweep them alike.')
    judge = (sweep['judge'] or {}).get('test_nats_per_token')
    if out['judge'] is not None and judge != out['judge']['test_nats_per_token']:
      raise ValueError(f'--fronts: {path} was scored by another judge; score them with one.')
    out['settings'], out['judge'] = shared, sweep['judge']
    for name, run in sweep['runs'].items():
      have = out['runs'].setdefault(prefix + name, {**run, 'points': []})
      have['points'] = have['points'] + run['points']
    for g, group in sweep['groups'].items():
      runs = [prefix + r for r in group['runs']]
      if members.setdefault(prefix + g, runs) != runs:
        raise ValueError(f'--fronts: the group {prefix + g!r} lists other runs in {path}; give '
                         'one sweep a PREFIX.')
  for run in out['runs'].values():
    run['front'] = {m: front_lib.fronts(run['points'], m) for m in front.METRICS}
  out['groups'] = front.group_equal_entropy(
      front.equal_entropy(out['runs'], out['settings']['entropies']), members)
  return out


def _cell(m: float | None, se: float | None, n: int, of: int) -> str:
  if m is None:
    return '–'
  return reports.mean_pm(m, se, digits=0, count=n) + ('' if n == of else f' ({n}/{of})')


def table(merged: dict[str, Any], labels: dict[str, str], hide: Sequence[str] = ()) -> list[str]:
  """Per group x K: the judge GenPPL at each entropy, mean ± s.e. over the group's runs."""
  ents = merged['settings']['entropies']
  lines = ['| model | K | ' + ' | '.join(f'H = {e:g}' for e in ents) + ' |',
           '|---|---|' + '---|' * len(ents)]
  for g, group in merged['groups'].items():
    if g in hide:
      continue
    for k, cell in group['equal_entropy'][METRIC].items():
      of = len(cell['per_run'])
      vals = [_cell(cell['mean'][j], cell['se'][j], cell['n'][j], of) for j in range(len(ents))]
      lines.append(f'| {labels.get(g, g)} | {k} | ' + ' | '.join(vals) + ' |')
  return lines


def paired(merged: dict[str, Any], a: str, b: str) -> dict[str, list[tuple[float | None,
                                                                         float | None, int]]]:
  """{K: [(mean, s.e., n) of A − B at each entropy]}, over the runs of equal index that both
  reach that entropy."""
  ga, gb = (merged['groups'][g]['equal_entropy'][METRIC] for g in (a, b))
  out = {}
  for k in ga:
    rows = []
    for j in range(len(merged['settings']['entropies'])):
      d = [x[j] - y[j] for x, y in zip(ga[k]['per_run'], gb[k]['per_run'])
           if x[j] is not None and y[j] is not None]
      rows.append((*reports.mean_se(d), len(d)))
    out[k] = rows
  return out


def pair_table(merged: dict[str, Any], pairs: Sequence[tuple[str, str]],
               labels: dict[str, str]) -> list[str]:
  """Per pair A-B and K: A − B at each entropy, mean ± s.e. over the runs of equal index that
  both reach it ('(n/N)' when fewer than all N do)."""
  ents = merged['settings']['entropies']
  lines = ['| difference | K | ' + ' | '.join(f'H = {e:g}' for e in ents) + ' |',
           '|---|---|' + '---|' * len(ents)]
  for a, b in pairs:
    of = len(merged['groups'][a]['runs'])
    for k, rows in paired(merged, a, b).items():
      cells = [_cell(m, se, n, of) for m, se, n in rows]
      lines.append(f'| {labels.get(a, a)} − {labels.get(b, b)} | {k} | ' + ' | '.join(cells)
                   + ' |')
  return lines


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--fronts', required=True, help='comma-separated FILE[:PREFIX]')
  ap.add_argument('--pairs', default='', help='comma-separated A-B group pairs')
  ap.add_argument('--labels', default='', help='comma-separated GROUP=label')
  ap.add_argument('--entropies', default='', help='comma-separated entropies (nats) to read at')
  ap.add_argument('--out', default='', help='the merged JSON written')
  ap.add_argument('--hide', default='', help='comma-separated groups left out of the table')
  a = ap.parse_args(argv)
  try:
    merged = merge(a.fronts.split(','), [float(e) for e in a.entropies.split(',') if e])
    labels = dict(x.split('=', 1) for x in a.labels.split(',') if x)
    pairs = [tuple(p.split('-', 1)) for p in a.pairs.split(',') if p]
    for p in pairs:
      if len(p) != 2 or not set(p) <= set(merged['groups']):
        raise ValueError(f'--pairs: {"-".join(p)} must be A-B of the groups '
                         f'{sorted(merged["groups"])}.')
  except (ValueError, OSError, KeyError) as e:
    sys.exit(f'hmdlm_jax: error: {e}')
  print('\n'.join(table(merged, labels, a.hide.split(','))))
  if pairs:
    print('\n' + '\n'.join(pair_table(merged, pairs, labels)))
  if a.out:
    reports.write_json(a.out, merged)


if __name__ == '__main__':
  main()
