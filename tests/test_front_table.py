"""scripts/front_table.py: merging sweeps, the equal-entropy table and paired differences."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scripts import front_table


def _sweep(path, groups: dict[str, list[list[float | None]]], entropies=(3.0, 3.4),
           nats: float = 3.79) -> str:
  """A sweep JSON with `groups` {name: per_run GenPPLs at each entropy} at K = 8."""
  out = {'settings': {'steps': [8], 'entropies': list(entropies), 'seeds': [0],
                      'num_samples': 64},
         'judge': {'test_nats_per_token': nats}, 'runs': {}, 'groups': {}}
  for g, per_run in groups.items():
    names = [f'{g}/s{i}' for i in range(len(per_run))]
    for n in names:
      out['runs'][n] = {'points': []}
    cols = list(zip(*per_run))
    stats = [(float(np.mean([v for v in c if v is not None])),
              float(np.std([v for v in c if v is not None], ddof=1) / np.sqrt(len(c))))
             if all(v is not None for v in c) else (None, None) for c in cols]
    out['groups'][g] = {'runs': names, 'equal_entropy': {'gen_ppl_judge': {'8': {
        'per_run': per_run, 'mean': [m for m, _ in stats], 'se': [s for _, s in stats],
        'n': [sum(v is not None for v in c) for c in cols]}}}}
  path.write_text(json.dumps(out), encoding='utf-8')
  return str(path)


def test_merge_table_and_paired_differences(tmp_path):
  a = _sweep(tmp_path / 'a.json', {'mdlm': [[500.0, 700.0], [400.0, 650.0], [450.0, None]]})
  b = _sweep(tmp_path / 'b.json', {'mdlm': [[300.0, 520.0], [380.0, 600.0], [350.0, 590.0]]})
  merged = front_table.merge([a, b + ':t3_'])
  assert sorted(merged['groups']) == ['mdlm', 't3_mdlm']
  assert merged['groups']['t3_mdlm']['runs'] == ['t3_mdlm/s0', 't3_mdlm/s1', 't3_mdlm/s2']
  diff = front_table.paired(merged, 't3_mdlm', 'mdlm')['8']
  d0 = np.array([300.0 - 500, 380 - 400, 350 - 450])
  assert diff[0][0] == pytest.approx(d0.mean(), rel=1e-12)
  assert diff[0][1] == pytest.approx(d0.std(ddof=1) / np.sqrt(3), rel=1e-12)
  assert diff[0][2] == 3
  d1 = np.array([520.0 - 700, 600 - 650])  # seed 2 of 'mdlm' does not reach H = 3.4
  assert diff[1][0] == pytest.approx(d1.mean(), rel=1e-12) and diff[1][2] == 2
  lines = front_table.table(merged, {'mdlm': 'MDLM'})
  assert lines[2] == '| MDLM | 8 | 450 ± 29 | – |'
  assert lines[3].startswith('| t3_mdlm | 8 | 343 ± 23 | 570 ± 25 |')


def test_sweeps_that_cannot_be_merged_are_refused(tmp_path):
  a = _sweep(tmp_path / 'a.json', {'mdlm': [[1.0, 2.0]]})
  with pytest.raises(ValueError, match='PREFIX'):
    front_table.merge([a, a])
  c = _sweep(tmp_path / 'c.json', {'x': [[1.0, 2.0]]}, entropies=(3.0, 3.6))
  with pytest.raises(ValueError, match='sweep them alike'):
    front_table.merge([a, c])
  d = _sweep(tmp_path / 'd.json', {'x': [[1.0, 2.0]]}, nats=4.0)
  with pytest.raises(ValueError, match='another judge'):
    front_table.merge([a, d])
