"""Hierarchy diagnostics of the Sudoku evaluation (hmdlm_jax/tasks/sudoku_hierarchy.py).

Fixed denoisers give exact references: a head that knows the labeller's levels scores 1 at every
t; a constant head answers level 0 everywhere, so its accuracy at t = 1 (every blank masked) is
the share of level-0 blanks, counted in numpy. Decoding with the labeller's levels replaces the
head: the drawn levels then agree with the labeller's on every blank, which they do not with a
constant head; replacing it on the cells of one labeller level only changes exactly those cells'
levels, and on no cell (or every cell) it reproduces the head's (the labeller's) decoding.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax.data import sudoku as sudoku_data
from hmdlm_jax.data import sudoku_pipeline
from hmdlm_jax.evaluation import samples
from hmdlm_jax.tasks import sudoku as sudoku_task
from hmdlm_jax.tasks import sudoku_hierarchy
from tests.eval_helpers import SUDOKU_SCHEDULE, lookup_model, make_process, puzzle_set
from tests.eval_helpers import random_logit_model, uniform_model

CFG = config_lib.SampleConfig(num_steps=12, num_levels=6, mask_id=sudoku_data.MASK_ID,
                              prior_corrected=False, time_conditioning=False,
                              ordering='confidence')


def _data(n=8, seed=2):
  quiz, sol = puzzle_set(n, seed=seed)
  batch = {k: v for k, v in sudoku_pipeline.sudoku_batch(quiz, sol).items() if k != 'weight'}
  return quiz, sol, [batch]


def test_level_accuracy_exact_for_known_heads():
  quiz, sol, batches = _data()
  proc = make_process(SUDOKU_SCHEDULE, CFG)
  perfect = sudoku_hierarchy.level_accuracy(lookup_model(quiz, sol, 6), proc, batches,
                                            t_min=1e-3)
  assert set(perfect) == {'t=random', 't=1.0', 't=0.75', 't=0.5'}
  for r in perfect.values():
    assert r['accuracy'] == 1.0 and r['cells'] > 0
    assert all(a is None or a == 1.0 for a in r['per_level'] + r['precision'])
    assert np.trace(r['confusion']) == r['cells'] == np.sum(r['confusion'])
  levels = sudoku_data.hierarchy_levels(quiz)[quiz == 0]
  counts = np.bincount(levels, minlength=6)
  const = sudoku_hierarchy.level_accuracy(uniform_model(6), proc, batches, t_min=1e-3)['t=1.0']
  assert const['cells'] == len(levels)  # t = 1: every blank is masked (ε = 1e-3: almost surely)
  assert const['accuracy'] == pytest.approx(counts[0] / len(levels))
  assert const['prior'] == pytest.approx(counts.max() / len(levels))
  assert const['per_level'][0] == 1.0
  assert all(a in (None, 0.0) for a in const['per_level'][1:])
  # It predicts level 0 for every cell: precision there is the share of level 0, none elsewhere.
  assert const['precision'][0] == pytest.approx(counts[0] / len(levels))
  assert const['precision'][1:] == [None] * 5
  np.testing.assert_array_equal(np.asarray(const['confusion'])[:, 0], counts)
  line = sudoku_hierarchy.summary_lines({'level_accuracy': {'t=1.0': const}}, ())[0]
  assert f'precision {100 * counts[0] / len(levels):.0f} - - - - -' in line


def test_labeller_levels_replace_the_head_in_decoding():
  _, _, batches = _data()
  proc = make_process(SUDOKU_SCHEDULE, CFG)
  cfg, labeller = sudoku_hierarchy.mode_config(CFG, 'labeller_order')
  assert labeller == tuple(range(6)) and cfg.hierarchy_weight == 1.0
  assert cfg.level_context == 'none'
  kw = dict(seeds=(0,), decodings=('greedy', 'stochastic'), progress=False)
  with_labeller = sudoku_task.evaluate_sudoku(uniform_model(6), jax.random.PRNGKey(0), proc, cfg,
                                              batches, labeller_at=labeller, **kw)
  with_head = sudoku_task.evaluate_sudoku(uniform_model(6), jax.random.PRNGKey(0), proc, cfg,
                                          batches, **kw)
  for kind in ('greedy', 'stochastic'):  # both decodings take the labeller's levels
    assert with_labeller[kind]['mean']['level_disagreement'] == 0.0
    assert with_head[kind]['mean']['level_disagreement'] > 0.3
  diag = {'level_accuracy': {}, 'decodings': {'labeller_order': with_labeller,
                                              'head_ignored': with_head}}
  lines = sudoku_hierarchy.summary_lines(diag, sudoku_task.DECODINGS)
  assert len(lines) == 4 and all('reference' in x for x in lines[:2])
  assert not any('reference' in x for x in lines[2:])
  assert 'greedy' in lines[0] and 'stochastic' in lines[1]
  assert f"solve {100 * with_labeller['stochastic']['mean']['solve_rate']:.1f}%" in lines[1]
  with pytest.raises(ValueError, match='eval.hierarchy_decodings'):
    sudoku_hierarchy.check_modes(('head_ignored', 'oracle'))


def test_fixed_levels_on_some_cells_keep_the_head_elsewhere():
  quiz, _, batches = _data()
  levels = np.asarray(batches[0]['levels'], np.int32)
  head = jax.random.normal(jax.random.PRNGKey(3), levels.shape + (6,))
  apply_fn = lambda x, h, t, *, heads, token_levels=None: {'hier': head}
  where = levels == 2
  out = samples.with_fixed_levels(apply_fn, levels, 6, where)(None, None, None, heads=('hier',))
  np.testing.assert_array_equal(out['hier'][~where], head[~where])
  onehot = np.where(levels[..., None] == np.arange(6), 0.0, -1e4)
  np.testing.assert_array_equal(out['hier'][where], onehot[where])

  proc = make_process(SUDOKU_SCHEDULE, CFG)
  cfg = sudoku_hierarchy.mode_config(CFG, 'labeller_order_at_2')[0]
  net = random_logit_model(sudoku_data.VOCAB_SIZE, 6, seed=4)  # an order that matters
  run = samples.sampler(net, proc, cfg, batch_size=len(quiz), seq_len=81, fixed_levels=True)
  head_only = samples.sampler(net, proc, cfg, batch_size=len(quiz), seq_len=81)
  given = samples.given_inputs(batches[0], proc, cfg)
  key = jax.random.PRNGKey(5)
  blank = quiz == 0
  same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(a, b))
  mixed, alone = run(key, *given, levels, where), head_only(key, *given)
  assert np.all(np.asarray(mixed.levels)[blank & where] == 2)
  assert np.any(np.asarray(alone.levels)[blank & where] != 2)  # the head alone draws others
  assert same(run(key, *given, levels, np.zeros_like(where)), alone)
  assert not same(mixed, alone)
  every = run(key, *given, levels, np.ones_like(where))
  assert same(every, run(key, *given, levels))
  np.testing.assert_array_equal(np.asarray(every.levels)[blank], levels[blank])
  line = sudoku_hierarchy.summary_lines(
      {'decodings': {'labeller_order_at_2': {'greedy': {'mean': {
          'solve_rate': 0.5, 'cell_accuracy': 0.5}}}}}, ('greedy',))[0]
  assert 'diagnostic: labeller levels on level-2 cells' in line


@pytest.mark.parametrize('field', ['decodings', 'hierarchy_sampling'])
@pytest.mark.parametrize('value', [(), ('greedy', 'beam')])
def test_decoding_kinds_are_checked(field, value):
  from hmdlm_jax.configs import sudoku_learned_hierarchy  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(sudoku_learned_hierarchy.get_config()).replace(
      **{f'eval.{field}': value})
  with pytest.raises(ValueError, match=rf'eval\.{field}=.*subset'):
    sudoku_task.SudokuTask().validate(config)
