"""scripts/front_table.py: merging sweeps, the equal-entropy table and paired differences."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scripts import front_table


def _points(table: list[tuple[float, float]]) -> list[dict]:
  """Points at K = 8 with these (entropy, judge GenPPL) seed means, by rising temperature."""
  return [{'steps': 8, 'temperature': 0.5 + 0.1 * i, 'top_p': 1.0,
           'mean': {'entropy': e, 'gen_ppl_judge': g, 'gen_ppl_gpt2': None}}
          for i, (e, g) in enumerate(table)]


def _sweep(path, groups: dict[str, list[list[tuple[float, float]]]], entropies=(3.0, 3.4),
           nats: float = 3.79) -> str:
  """A sweep JSON: per group, per run (training seed) its points (entropy, GenPPL)."""
  out = {'settings': {'steps': [8], 'entropies': list(entropies), 'seeds': [0],
                      'num_samples': 64},
         'judge': {'test_nats_per_token': nats}, 'runs': {}, 'groups': {}}
  for g, runs in groups.items():
    names = [f'{g}/s{i}' for i in range(len(runs))]
    for n, table in zip(names, runs):
      out['runs'][n] = {'points': _points(table)}
    out['groups'][g] = {'runs': names}
  path.write_text(json.dumps(out), encoding='utf-8')
  return str(path)


def test_merge_table_and_paired_differences(tmp_path):
  a = _sweep(tmp_path / 'a.json', {'mdlm': [[(3.0, 500.0), (3.4, 700.0)],
                                            [(3.0, 400.0), (3.4, 650.0)],
                                            [(3.0, 450.0), (3.2, 600.0)]]})
  b = _sweep(tmp_path / 'b.json', {'mdlm': [[(3.0, 300.0), (3.4, 520.0)],
                                            [(3.0, 380.0), (3.4, 600.0)],
                                            [(3.0, 350.0), (3.4, 590.0)]]})
  merged = front_table.merge([a, b + ':t3_'])
  assert sorted(merged['groups']) == ['mdlm', 't3_mdlm']
  assert merged['groups']['t3_mdlm']['runs'] == ['t3_mdlm/s0', 't3_mdlm/s1', 't3_mdlm/s2']
  diff = front_table.paired(merged, 't3_mdlm', 'mdlm')['8']
  d0 = np.array([300.0 - 500, 380 - 400, 350 - 450])
  assert diff[0][0] == pytest.approx(d0.mean(), rel=1e-9)
  assert diff[0][1] == pytest.approx(d0.std(ddof=1) / np.sqrt(3), rel=1e-9)
  assert diff[0][2] == 3
  d1 = np.array([520.0 - 700, 600 - 650])  # seed 2 of 'mdlm' does not reach H = 3.4
  assert diff[1][0] == pytest.approx(d1.mean(), rel=1e-9) and diff[1][2] == 2
  lines = front_table.table(merged, {'mdlm': 'MDLM'})
  assert lines[2] == '| MDLM | 8 | 450 ± 29 | – |'
  assert lines[3] == '| t3_mdlm | 8 | 343 ± 23 | 570 ± 25 |'


def test_a_run_in_two_sweeps_pools_its_points_and_is_read_at_new_entropies(tmp_path):
  a = _sweep(tmp_path / 'a.json', {'g': [[(3.0, 300.0), (3.4, 500.0)],
                                         [(3.2, 350.0), (3.5, 550.0)]]})
  b = _sweep(tmp_path / 'b.json', {'g': [[(3.8, 900.0)], [(3.6, 2000.0), (3.1, 900.0)]]})
  merged = front_table.merge([a, b], [3.3, 3.7])
  assert [len(r['points']) for r in merged['runs'].values()] == [3, 4]
  cell = merged['groups']['g']['equal_entropy']['gen_ppl_judge']['8']
  # Linear in log GenPPL between the bracketing front points; s1's (3.1, 900) is dominated by
  # (3.2, 350) and its front ends at 3.6.
  want0 = np.exp(np.interp(3.3, [3.0, 3.4], np.log([300.0, 500.0])))
  want1 = np.exp(np.interp(3.3, [3.2, 3.5], np.log([350.0, 550.0])))
  assert cell['per_run'][0][0] == pytest.approx(want0, rel=1e-12)
  assert cell['per_run'][1][0] == pytest.approx(want1, rel=1e-12)
  assert cell['mean'][0] == pytest.approx((want0 + want1) / 2, rel=1e-12)
  assert cell['per_run'][0][1] == pytest.approx(np.exp(np.interp(3.7, [3.4, 3.8],
                                                                 np.log([500.0, 900.0]))))
  assert cell['per_run'][1][1] is None and cell['mean'][1] is None and cell['n'] == [2, 1]
  assert merged['settings']['entropies'] == [3.3, 3.7]


def test_sweeps_that_cannot_be_merged_are_refused(tmp_path):
  a = _sweep(tmp_path / 'a.json', {'mdlm': [[(3.0, 1.0)]]})
  b = _sweep(tmp_path / 'b.json', {'mdlm': [[(3.0, 1.0)], [(3.0, 2.0)]]})
  with pytest.raises(ValueError, match='PREFIX'):
    front_table.merge([a, b])
  c = _sweep(tmp_path / 'c.json', {'x': [[(3.0, 1.0)]]}, entropies=(3.0, 3.6))
  with pytest.raises(ValueError, match='sweep them alike'):
    front_table.merge([a, c])
  assert front_table.merge([a, c], [3.0])['settings']['entropies'] == [3.0]
  d = _sweep(tmp_path / 'd.json', {'x': [[(3.0, 1.0)]]}, nats=4.0)
  with pytest.raises(ValueError, match='another judge'):
    front_table.merge([a, d])
