"""Helpers shared by the evaluation and task tests: a Sudoku grid, puzzle sets, fixed denoisers.

Every model here follows the apply_fn contract of docs/design.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax.data import sudoku as sudoku_data
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes.schedules import Schedule

# A valid grid (digits), row by row.
GRID = ('534678912' '672195348' '198342567' '859761423' '426853791' '713924856' '961537284'
        '287419635' '345286179')
S = np.array([int(c) for c in GRID], np.uint8)  # [81] digits
S_TOK = S.astype(np.int32) - 1  # tokens 0..8
SCHED2 = Schedule('loglinear', (0.0, 0.25))
SUDOKU_SCHEDULE = Schedule('loglinear', (0.0, 0.1, 0.2, 0.3, 0.4, 0.5))


def puzzle_set(n: int, seed: int = 0):
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


def lookup_model(quiz: np.ndarray, solution: np.ndarray, num_levels: int, *, scale: float = 30.0):
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


def uniform_model(num_levels: int):
  def apply_fn(tokens, levels, t, *, heads, token_levels=None):
    b, l = tokens.shape
    out = {}
    if 'token' in heads:
      out['token'] = jnp.zeros((b, l, sudoku_data.VOCAB_SIZE))
    if 'hier' in heads:
      out['hier'] = jnp.zeros((b, l, num_levels))
    return out
  return apply_fn


def make_process(schedule: Schedule, cfg) -> hmdlm.HMDLM:
  """HMDLM on `schedule` with the K, mask id and head settings of a Sample/LossConfig."""
  loss_cfg = config_lib.LossConfig(mask_id=cfg.mask_id, num_levels=cfg.num_levels,
                                   prior_corrected=cfg.prior_corrected, variant=cfg.variant)
  return hmdlm.HMDLM(schedule, loss_cfg)


def random_logit_model(vocab: int, num_levels: int, seed: int = 0, single_pass: bool = False):
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
