"""model.sudoku_candidates (tasks/sudoku_model.py): the candidate features of a Sudoku grid, the
input features the Sudoku task hands the model (models/features.py).

* exact oracle: on generated puzzles, a blank cell is a naked or hidden single of the features
  exactly when the labeller of data/sudoku.py determines it in round 1 (level 5, not a given);
* numpy re-derivation of every feature (peers and units by explicit loops) on random partial
  grids with masked cells;
* the model option: zero-init (the logits equal the model without it), only the expected
  parameters added, the features reach both heads once trained; a non-Sudoku model is refused;
  with `candidates_pathway_only` the token output is exactly the model's without them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax.configs.base import get_base_config
from tests import model_helpers as mh
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax.data import sudoku
from hmdlm_jax.data import sudoku_generator
from hmdlm_jax.tasks import sudoku_model as sc

MASK = 9


def _np_features(tokens: np.ndarray) -> np.ndarray:
  """Loops over cells, peers and units: [B, 81] tokens -> [B, 81, 28]."""
  out = np.zeros(tokens.shape + (sc.NUM_FEATURES,), np.float32)
  r, c = np.divmod(np.arange(81), 9)
  box = (r // 3) * 3 + c // 3
  units = [np.flatnonzero(r == i) for i in range(9)] + [np.flatnonzero(c == i) for i in range(9)] \
      + [np.flatnonzero(box == i) for i in range(9)]
  for b, grid in enumerate(tokens):
    cand = np.zeros((81, 9), bool)
    for i in range(81):
      if grid[i] < 9:
        continue
      peers = [j for j in range(81)
               if j != i and (r[j] == r[i] or c[j] == c[i] or box[j] == box[i])]
      held = {int(grid[j]) for j in peers if grid[j] < 9}
      cand[i] = [d not in held for d in range(9)]
    hidden = np.zeros((81, 9), bool)
    for u in units:
      for d in range(9):
        where = [i for i in u if cand[i, d]]
        if len(where) == 1:
          hidden[where[0], d] = True
    out[b, :, :9] = cand
    out[b, np.arange(81), 9 + cand.sum(-1)] = 1.0
    out[b, :, 19:] = hidden
  return out


def test_features_match_a_loop_re_derivation():
  rng = np.random.default_rng(0)
  quiz, solution, _ = sudoku_generator.generate_puzzles(rng, 3)
  tokens = sudoku.to_tokens(solution)
  # Givens plus a random share of the other cells revealed (as in a noisy training state).
  keep = (quiz > 0) | (rng.uniform(size=quiz.shape) < 0.3)
  tokens = np.where(keep, tokens, MASK).astype(np.int32)
  tokens[0] = MASK  # an empty grid: every digit a candidate everywhere
  got = np.asarray(sc.candidate_features(jnp.asarray(tokens)))
  np.testing.assert_array_equal(got, _np_features(tokens))
  assert got[0, :, :9].all() and (got[0, :, 18] == 1).all()


def test_round_one_singles_are_the_labellers_level_five():
  rng = np.random.default_rng(1)
  quiz, _, _ = sudoku_generator.generate_puzzles(rng, 8)
  levels = sudoku.hierarchy_levels(quiz)
  tokens = np.where(quiz > 0, sudoku.to_tokens(quiz), MASK).astype(np.int32)
  f = np.asarray(sc.candidate_features(jnp.asarray(tokens)))
  single = (f[..., 10] == 1) | f[..., 19:].any(-1)  # count == 1 or a hidden single
  round_one = (quiz == 0) & (levels == sudoku.NUM_LEVELS - 1)
  assert round_one.sum() > 20  # the test has cells to check
  np.testing.assert_array_equal(single, round_one)


def _cfg(**over):
  c = get_base_config().model
  c.update(dict(num_levels=3, vocab_size=10, mask_id=-1, seq_len=81, num_layers=1,
                hidden_size=16, num_heads=2, mlp_dim=32, cond_dim=8, dropout=0.0,
                position_embedding='sudoku', given_state=True))
  mh.set_pathway(c, over)
  c.update(over)
  return config_lib.ModelConfig.from_section(c)


def _build(cfg):
  """The model of `cfg` with the Sudoku task's features (as tasks.build_model builds it)."""
  return models.build_model(cfg, sc.model_features(cfg))


def test_option_starts_as_identity_and_adds_two_projections():
  off_cfg, on_cfg = _cfg(hier_input_embed=True), _cfg(hier_input_embed=True,
                                                       sudoku_candidates=True)
  off, on = _build(off_cfg), _build(on_cfg)
  p_off = models.init_params(off, jax.random.key(0), 81)
  p_on = models.init_params(on, jax.random.key(0), 81)
  assert set(p_on) - set(p_off) == {'candidate_proj', 'hier_candidate_proj'}
  # The parameter report counts the input projection with the backbone (an MDLM twin has it
  # too) and the pathway's with the hierarchy trunk.
  groups = models.param_count_breakdown(on_cfg, sc.model_features(on_cfg))
  groups_off = models.param_count_breakdown(off_cfg, sc.model_features(off_cfg))
  assert groups['input features'] == sc.NUM_FEATURES * 16 + 16
  assert groups['hierarchy trunk'] - groups_off['hierarchy trunk'] == sc.NUM_FEATURES * 16 + 16
  assert groups['total'] - groups_off['total'] == 2 * (sc.NUM_FEATURES * 16 + 16)
  rng = np.random.default_rng(2)
  quiz, solution, _ = sudoku_generator.generate_puzzles(rng, 2)
  tokens = jnp.asarray(np.where(quiz > 0, sudoku.to_tokens(solution), MASK), jnp.int32)
  levels = jnp.asarray(np.where(quiz > 0, 4, 3), jnp.int32)  # h_g = K+1 = 4, h_m = 3
  t = jnp.full((2,), 0.5)
  # Random shared parameters, the new projections at their (zero) init: the same outputs.
  r = np.random.default_rng(3)
  shared = jax.tree.map(lambda x: x + 0.1 * r.normal(size=x.shape).astype(np.float32), p_off)
  heads = ('hier', 'token')
  # Jitted: an eager apply compiles every op of the model separately.
  apply_off = jax.jit(lambda p: off.apply({'params': p}, tokens, levels, t, heads=heads))
  apply_on = jax.jit(lambda p: on.apply({'params': p}, tokens, levels, t, heads=heads))
  a = apply_off(shared)
  b = apply_on({**p_on, **shared})
  for h in heads:
    np.testing.assert_allclose(np.asarray(b[h]), np.asarray(a[h]), atol=1e-5)
  # Trained projections move both heads (the features reach them).
  moved = dict(p_on, **shared)
  for n in ('candidate_proj', 'hier_candidate_proj'):
    moved[n] = jax.tree.map(lambda x: x + 0.5 * r.normal(size=x.shape).astype(np.float32),
                            p_on[n])
  c = apply_on(moved)
  for h in heads:
    assert np.abs(np.asarray(c[h]) - np.asarray(a[h])).max() > 1e-3


def test_a_grid_that_is_not_sudoku_is_refused():
  with pytest.raises(ValueError, match='model.sudoku_candidates'):
    _cfg(sudoku_candidates=True, seq_len=64, position_embedding='rotary')


def test_the_level_pathway_reads_the_givens_only():
  """With given_state, the pathway's candidates come from the givens (as the labeller's levels
  do); the input's from every revealed cell. Revealing a non-given cell changes only the latter."""
  cfg = _cfg(hier_input_embed=True, sudoku_candidates=True)
  model = _build(cfg)
  r = np.random.default_rng(4)
  params = jax.tree.map(lambda x: x + 0.1 * r.normal(size=x.shape).astype(np.float32),
                        models.init_params(model, jax.random.key(0), 81))
  quiz, solution, _ = sudoku_generator.generate_puzzles(np.random.default_rng(5), 1)
  tokens = np.where(quiz > 0, sudoku.to_tokens(solution), MASK).astype(np.int32)
  levels = np.where(quiz > 0, 4, 3).astype(np.int32)
  blank = int(np.flatnonzero(quiz[0] == 0)[0])
  more_t, more_l = tokens.copy(), levels.copy()
  more_t[0, blank], more_l[0, blank] = sudoku.to_tokens(solution)[0, blank], 0  # revealed, level 0

  @jax.jit  # one compile for both calls (an eager apply compiles every op separately)
  def captured(tok, lev):
    _, state = model.apply({'params': params}, tok, lev, jnp.full((1,), 0.5),
                           heads=('hier', 'token'),
                           capture_intermediates=lambda m, _: 'candidate_proj' in (m.name or ''),
                           mutable=['intermediates'])
    return state['intermediates']

  def proj_inputs(tok, lev):
    got = captured(jnp.asarray(tok), jnp.asarray(lev))
    return {n: np.asarray(got[n]['__call__'][0]) for n in ('candidate_proj', 'hier_candidate_proj')}

  a, b = proj_inputs(tokens, levels), proj_inputs(more_t, more_l)
  np.testing.assert_array_equal(a['hier_candidate_proj'], b['hier_candidate_proj'])
  assert np.abs(a['candidate_proj'] - b['candidate_proj']).max() > 1e-3


@pytest.mark.parametrize('source', ['features', 'input'])
def test_pathway_only_features_never_reach_the_token_network(source):
  """model.candidates_pathway_only: the token output is the no-candidates model's exactly (same
  parameters), while the pathway's projection moves the level output; K = 1 (the MDLM twin)
  has no candidate parameters at all."""
  base = dict(hier_input_embed=True, hier_layers=1, hier_source=source)
  off, on = _build(_cfg(**base)), _build(
      _cfg(**base, sudoku_candidates=True, candidates_pathway_only=True))
  p_off = models.init_params(off, jax.random.key(0), 81)
  p_on = models.init_params(on, jax.random.key(0), 81)
  assert set(p_on) - set(p_off) == {'hier_candidate_proj'}
  r = np.random.default_rng(6)
  params = {k: jax.tree.map(lambda x: x + 0.3 * r.normal(size=x.shape).astype(np.float32), v)
            for k, v in p_on.items()}  # every projection trained (non-zero)
  quiz, solution, _ = sudoku_generator.generate_puzzles(np.random.default_rng(7), 2)
  tokens = jnp.asarray(np.where(quiz > 0, sudoku.to_tokens(solution), MASK), jnp.int32)
  levels = jnp.asarray(np.where(quiz > 0, 4, 3), jnp.int32)
  t = jnp.full((2,), 0.7)
  heads = ('hier', 'token')
  a = jax.jit(lambda p: off.apply({'params': p}, tokens, levels, t, heads=heads))(
      {k: v for k, v in params.items() if k != 'hier_candidate_proj'})
  b = jax.jit(lambda p: on.apply({'params': p}, tokens, levels, t, heads=heads))(params)
  np.testing.assert_allclose(np.asarray(b['token']), np.asarray(a['token']), atol=1e-5)
  assert np.abs(np.asarray(b['hier']) - np.asarray(a['hier'])).max() > 1e-3
  twin = _cfg(**base, num_levels=1, given_state=False, sudoku_candidates=True,
              candidates_pathway_only=True)
  assert 'input features' not in models.param_count_breakdown(twin, sc.model_features(twin))
  with pytest.raises(ValueError, match='model.candidates_pathway_only'):
    _cfg(candidates_pathway_only=True, sudoku_candidates=True)  # no pathway.input_embed
