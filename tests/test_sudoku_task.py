"""Tests of the Sudoku task (hmdlm_jax/tasks/sudoku.py): metrics, solving, grid printing.

Reference values are hand-computed (metrics, the grid printer) or follow from fixed denoisers (a
lookup model that knows every answer, a uniform one).
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax.data import sudoku as sudoku_data
from hmdlm_jax.data import sudoku_pipeline
from hmdlm_jax.evaluation import compiled
from hmdlm_jax.evaluation import samples
from hmdlm_jax.processes.schedules import Schedule
from hmdlm_jax.tasks import sudoku as sudoku_task
from tests.eval_helpers import S, S_TOK, SUDOKU_SCHEDULE
from tests.eval_helpers import lookup_model, make_process, puzzle_set, uniform_model

# Cells of S holding digit 1 or 2 (read off the grid by hand).
ONE_TWO = [7, 8, 11, 12, 18, 23, 32, 34, 37, 44, 46, 49, 56, 60, 63, 67, 75, 78]


# ------------------------------------------------------------------------------ metrics


def _constructed_predictions():
  """Three real puzzles on S plus one padding row (see the hand computation in the test)."""
  cells = np.arange(81)
  given = np.zeros((4, 81), bool)
  given[0, :27] = True  # A: first three rows given, 54 blanks
  given[1, :72] = True  # B: all but the last row, 9 blanks
  given[2] = ~np.isin(cells, ONE_TWO)  # C: the 18 cells holding 1 or 2 are blank
  given[3, :40] = True  # padding row
  levels = np.where(given, 5, cells % 3).astype(np.int32)  # blanks: level = cell % 3
  solution = np.tile(S_TOK, (4, 1))
  pred = solution.copy()
  pred[0, 30] = 7  # A: S[30] = 7 (token 6) -> token 7 (digit 8), wrong
  pred[0, 31] = 7  # A: S[31] = 6 -> digit 8, wrong; grid invalid
  swap = {0: 1, 1: 0}  # C: digits 1 <-> 2 everywhere: a valid grid, agrees with the givens
  pred[2] = np.vectorize(lambda v: swap.get(v, v))(S_TOK)
  pred[3] = 0  # padding row: garbage that must not count
  drawn = levels.copy()
  drawn[0, [27, 28, 29]] = 4  # three blank cells of A drawn at another level
  valid = np.array([True, True, True, False])
  return pred, solution, given, levels, drawn, valid


def test_sudoku_metrics_hand_computed():
  pred, solution, given, levels, drawn, valid = _constructed_predictions()
  m = sudoku_task.sudoku_metrics(pred, solution, given, levels, 6, drawn_levels=drawn, valid=valid)
  # Blanks: A 54 (52 right), B 9 (9 right), C 18 (0 right) = 81 blanks, 61 right.
  assert m['num_puzzles'] == 3
  assert m['solve_rate'] == pytest.approx(1 / 3)  # only B
  assert m['cell_accuracy'] == pytest.approx(61 / 81)
  assert m['valid_rate'] == pytest.approx(2 / 3)  # B, and C (valid, not the stored solution)
  assert m['givens_kept_rate'] == pytest.approx(1.0)
  assert m['level_disagreement'] == pytest.approx(3 / 81)
  assert m['unfilled_rate'] == 0.0
  # Per level (blank cells by cell % 3): A 18/18/18, B 3/3/3, C 6/6/6 (C's cells listed by hand);
  # A's wrong cells 30 (level 0) and 31 (level 1), C wrong everywhere.
  assert (m['num_cells_level_0'], m['num_cells_level_1'], m['num_cells_level_2']) == (27, 27, 27)
  assert m['cell_accuracy_level_0'] == pytest.approx(20 / 27)
  assert m['cell_accuracy_level_1'] == pytest.approx(20 / 27)
  assert m['cell_accuracy_level_2'] == pytest.approx(21 / 27)
  for k in (3, 4, 5):  # no blank cell at these levels: undefined, not 0
    assert m[f'cell_accuracy_level_{k}'] is None and m[f'num_cells_level_{k}'] == 0


def test_sudoku_metrics_mask_and_changed_givens():
  pred, solution, given, levels, _, _ = _constructed_predictions()
  pred = pred[:2].copy()
  pred[1, 80] = 9  # a MASK left in B
  pred[1, 0] = 0  # a changed clue in B (S[0] = 5): the grid can no longer count as valid
  m = sudoku_task.sudoku_metrics(pred, solution[:2], given[:2], levels[:2], 6)
  assert m['solve_rate'] == 0.0
  assert m['unfilled_rate'] == pytest.approx(1 / 63)
  assert m['givens_kept_rate'] == pytest.approx(0.5)
  assert m['valid_rate'] == 0.0
  assert m['level_disagreement'] is None  # no drawn levels given: nothing to compare


def test_sudoku_metrics_rejects_bad_shapes_and_levels():
  pred, solution, given, levels, _, _ = _constructed_predictions()
  with pytest.raises(ValueError, match='pred must be'):
    sudoku_task.sudoku_metrics(pred[:, :80], solution, given, levels, 6)
  with pytest.raises(ValueError, match='levels must lie in 0..2'):
    sudoku_task.sudoku_metrics(pred, solution, given, levels, 3)


# ------------------------------------------------------------------------------ evaluate_sudoku


def _sudoku_cfg(**kw) -> config_lib.SampleConfig:
  base = dict(num_steps=12, num_levels=6, mask_id=sudoku_data.MASK_ID, prior_corrected=False,
              time_conditioning=False)
  base.update(kw)
  return config_lib.SampleConfig(**base)


def _batches(quiz, sol, size, weight_field=True):
  full = {k: v for k, v in sudoku_pipeline.sudoku_batch(quiz, sol).items() if k != 'weight'}
  out = []
  for i in range(0, len(quiz), size):
    b = {k: v[i:i + size] for k, v in full.items()}
    if weight_field:  # the pipeline's convention: pad to full batches, weight 0 on padding
      n = b['tokens'].shape[0]
      if n < size:
        b = {k: np.concatenate([v, np.repeat(v[:1], size - n, 0)]) for k, v in b.items()}
      b['weight'] = (np.arange(size) < n).astype(np.float32)
    out.append(b)
  return out


def _solve(apply_fn, seed, batches, cfg=None, schedule=SUDOKU_SCHEDULE, **kw):
  """`evaluate_sudoku` with HMDLM on `schedule` and the sampler settings `cfg`."""
  cfg = cfg or _sudoku_cfg()
  return sudoku_task.evaluate_sudoku(apply_fn, jax.random.PRNGKey(seed),
                                     make_process(schedule, cfg), cfg, batches, **kw)


def test_evaluate_sudoku_perfect_model_and_padding():
  quiz, sol = puzzle_set(5)
  model = lookup_model(quiz, sol, 6)
  # Bound to a Network, the compiled sampler is kept: the second call below reuses it.
  apply_fn = compiled.Network(lambda params: model).bind(None)
  res = _solve(apply_fn, 0, _batches(quiz, sol, 4), seeds=(0, 1), progress=False)
  assert res['num_puzzles'] == 5  # the 3 padding rows of the second batch are not counted
  for d in ('greedy', 'stochastic'):
    assert set(res[d]['per_seed']) == {'0', '1'}
    for m in list(res[d]['per_seed'].values()) + [res[d]['mean']]:
      assert m['solve_rate'] == 1.0 and m['cell_accuracy'] == 1.0 and m['valid_rate'] == 1.0
      assert m['level_disagreement'] == 0.0  # levels drawn from a head peaked on the labeller's
      assert 1 <= m['nfe'] <= 2 * 12
    assert res[d]['std']['solve_rate'] == 0.0
  # Without a validity field, a short last batch is padded by the evaluator itself.
  res2 = _solve(apply_fn, 0, _batches(quiz, sol, 4, weight_field=False), seeds=(0,),
                decodings=('greedy',), max_examples=3, progress=False)
  assert res2['num_puzzles'] == 3 and 'stochastic' not in res2
  # K = 1 (MDLM): the model sees level 0 everywhere; metrics still per labeller level; no drawn
  # levels to compare.
  res1 = _solve(lookup_model(quiz, sol, 1), 0, _batches(quiz, sol, 4),
                _sudoku_cfg(num_levels=1), Schedule('loglinear', (0.0,)), seeds=(0,),
                decodings=('greedy',), progress=False)
  m1 = res1['greedy']['mean']
  assert m1['solve_rate'] == 1.0 and m1['level_disagreement'] is None
  levels = sudoku_data.hierarchy_levels(quiz)
  for k in range(6):
    assert m1[f'num_cells_level_{k}'] == int(((quiz == 0) & (levels == k)).sum())


def test_evaluate_sudoku_uniform_model_accuracy_is_one_ninth():
  quiz, sol = puzzle_set(8, seed=1)
  res = _solve(uniform_model(6), 3, _batches(quiz, sol, 8), seeds=(0, 1, 2),
               decodings=('stochastic',), progress=False)
  per_seed = res['stochastic']['per_seed']
  n_cells = 8 * 41 * 3  # blanks x seeds, every cell an independent uniform draw over 9 digits
  acc = res['stochastic']['mean']['cell_accuracy']
  assert abs(acc - 1 / 9) < 4 * math.sqrt((1 / 9) * (8 / 9) / n_cells)
  assert res['stochastic']['mean']['solve_rate'] == 0.0
  # Different seeds give different draws; the mean is the mean of the per-seed values.
  accs = [per_seed[s]['cell_accuracy'] for s in ('0', '1', '2')]
  assert len(set(accs)) > 1
  assert acc == pytest.approx(np.mean(accs))
  assert res['stochastic']['std']['cell_accuracy'] == pytest.approx(np.std(accs))


def test_evaluate_sudoku_rejects_bad_arguments():
  quiz, sol = puzzle_set(1)
  with pytest.raises(ValueError, match='decodings'):
    _solve(uniform_model(6), 0, _batches(quiz, sol, 1), decodings=('beam',))
  with pytest.raises(ValueError, match='no puzzles'):
    _solve(uniform_model(6), 0, [], progress=False)


# ------------------------------------------------------------------------------ puzzles as text


def test_format_sudoku_exact():
  digits = S.copy()
  digits[9] = 0  # a blank
  digits[18] = 2  # a wrong filled cell (S[18] = 1)
  given = np.zeros(81, bool)
  given[:9] = True  # first row given
  want = '\n'.join([
      '+---------+---------+---------+',
      '|[5][3][4]|[6][7][8]|[9][1][2]|',
      '| .  7  2 | 1  9  5 | 3  4  8 |',
      '|*2* 9  8 | 3  4  2 | 5  6  7 |',
      '+---------+---------+---------+',
      '| 8  5  9 | 7  6  1 | 4  2  3 |',
      '| 4  2  6 | 8  5  3 | 7  9  1 |',
      '| 7  1  3 | 9  2  4 | 8  5  6 |',
      '+---------+---------+---------+',
      '| 9  6  1 | 5  3  7 | 2  8  4 |',
      '| 2  8  7 | 4  1  9 | 6  3  5 |',
      '| 3  4  5 | 2  8  6 | 1  7  9 |',
      '+---------+---------+---------+',
  ])
  assert sudoku_task.format_sudoku(digits, given, S) == want
  # Without a solution, wrong cells are not marked.
  assert '*' not in sudoku_task.format_sudoku(digits, given)
  with pytest.raises(ValueError, match='need 81 cells'):
    sudoku_task.format_sudoku(digits[:80])


def test_check_quiz_names_the_problem():
  quiz = np.where(np.arange(81) < 30, S, 0).astype(np.uint8)
  sudoku_task.check_quiz(quiz)  # fine
  with pytest.raises(ValueError, match='puzzle 2 on the command line: no givens'):
    sudoku_task.check_quiz(np.zeros(81, np.uint8), where='puzzle 2 on the command line')
  dup = quiz.copy()
  dup[[36, 37]] = 2  # row 5 (cells 36..44) holds 2 twice; its columns and box hold no other 2
  with pytest.raises(ValueError, match=r'p: digit\(s\) \[2\] appear twice in row 5'):
    sudoku_task.check_quiz(dup, where='p')


def test_sudoku_batch_hides_blanks_from_the_sampler():
  quiz = np.where(np.arange(81) < 30, S, 0)[None].astype(np.uint8)
  b = sudoku_pipeline.sudoku_batch(quiz, S[None])
  np.testing.assert_array_equal(b['tokens'][0], S_TOK)
  np.testing.assert_array_equal(b['levels'], sudoku_data.hierarchy_levels(quiz))
  gt, gl, gm_ = samples.given_inputs(b, make_process(SUDOKU_SCHEDULE, _sudoku_cfg()),
                                     _sudoku_cfg())
  assert (gt[0, 30:] == sudoku_data.MASK_ID).all() and (gl[0, 30:] == 6).all()
  assert (gt[0, :30] == S_TOK[:30]).all() and gm_[0, :30].all() and not gm_[0, 30:].any()
  assert b['weight'].tolist() == [1.0] and b['loss_mask'][0, 30:].all()
  # Without a solution, tokens hold MASK at the blanks; a padding row carries no loss.
  b = sudoku_pipeline.sudoku_batch(quiz, valid=np.array([False]))
  assert (b['tokens'][0, 30:] == sudoku_data.MASK_ID).all()
  assert b['weight'].tolist() == [0.0] and not b['loss_mask'].any()
