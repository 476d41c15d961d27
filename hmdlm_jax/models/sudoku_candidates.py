"""Sudoku candidate features of the input grid (`model.sudoku_candidates`, docs/method.md §4.7).

The Sudoku levels are rounds of naked + hidden singles from the clues (docs/method.md §6). A
transformer must find which digits a blank cell's 20 peers hold before it can recognise even
round 1; without that step the level head did little better than the majority level. These
features hand it that step, computed exactly from the revealed digits it is given (tokens 0..8;
the mask token 9 counts as blank), with no labels and no search:

  cand[c, d]   = 1 if digit d is in none of cell c's peers (same row, column or box) and c is blank
  count[c]     = Σ_d cand[c, d] (one-hot over 0..9: count 1 is a naked single)
  hidden[c, d] = cand[c, d] and c is the only cell of one of its three units with candidate d

A blank cell is decided in round 1 exactly when count[c] == 1 or any hidden[c, :]
(tests/test_sudoku_candidates.py); later rounds are the network's to compute (models/hierarchy.py).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.data import sudoku

Array = jax.Array

NUM_DIGITS = 9
BLANK = NUM_DIGITS  # any token >= 9 is blank (9 is the Sudoku MASK)
NUM_FEATURES = NUM_DIGITS + (NUM_DIGITS + 1) + NUM_DIGITS  # cand | one-hot count | hidden


def _tables() -> tuple[np.ndarray, np.ndarray]:
  """Units [27, 81] and peers [81, 81] (0/1), from the labeller's own unit table."""
  units = np.zeros((len(sudoku.UNIT_CELLS), sudoku.NUM_CELLS), np.float32)
  np.put_along_axis(units, sudoku.UNIT_CELLS, 1.0, axis=1)
  peers = ((units.T @ units) > 0) & ~np.eye(sudoku.NUM_CELLS, dtype=bool)
  return units, peers.astype(np.float32)


_UNITS, _PEERS = _tables()


def candidate_features(tokens: Array) -> Array:
  """tokens int [B, 81] (0..8 = digits 1..9, anything else = blank) -> float32 [B, 81, 28]."""
  chex.assert_rank(tokens, 2)
  if tokens.shape[1] != sudoku.NUM_CELLS:
    raise ValueError(f'model.sudoku_candidates needs 81 cells per grid, got {tokens.shape[1]}')
  peers, units = jnp.asarray(_PEERS), jnp.asarray(_UNITS)
  placed = jax.nn.one_hot(tokens, NUM_DIGITS, dtype=jnp.float32)  # [B, 81, 9]; blanks -> 0
  blank = 1.0 - jnp.sum(placed, axis=-1, keepdims=True)  # [B, 81, 1]
  seen = jnp.einsum('cp,bpd->bcd', peers, placed)  # how many peers hold digit d
  cand = jnp.where(seen > 0, 0.0, 1.0) * blank
  count = jnp.sum(cand, axis=-1).astype(jnp.int32)  # [B, 81]
  per_unit = jnp.einsum('uc,bcd->bud', units, cand)  # [B, 27, 9]: cells of unit u with cand d
  only = jnp.einsum('uc,bud->bcd', units, (per_unit == 1).astype(jnp.float32))
  hidden = cand * (only > 0)
  return jnp.concatenate([cand, jax.nn.one_hot(count, NUM_DIGITS + 1, dtype=jnp.float32),
                          hidden], axis=-1)
