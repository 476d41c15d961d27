"""The Sudoku task's features of the model (models/features.py), from the `model` config section.

* model.position_embedding='sudoku': learned row, column and 3×3-box tables ([9, H] each, summed;
  'position/{row,col,box}_embed/embedding') in place of one row per position;
  'sudoku_rel' adds, in every DiT attention layer, a learned per-head bias for each of the 8
  relation classes of a pair of cells ('blocks_i/relation/relation_bias').
* model.sudoku_candidates: each cell's candidate digits, candidate count and hidden singles from
  the revealed digits of the input grid (`candidate_features`), to the trunk's input and the
  level pathway's own view (model.candidates_pathway_only: the pathway's only). The levels are
  rounds of naked + hidden singles from the clues (docs/method.md §6): the features hand the
  network round 1 of that reasoning, computed exactly from the grid it is given.
`model_features(cfg_model)` is what `SudokuTask.model_features` hands `models.build_model`.
"""

from __future__ import annotations

from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.config import ModelConfig
from hmdlm_jax.data import sudoku
from hmdlm_jax.models import features
from hmdlm_jax.models import layers

Array = jax.Array

SUDOKU_LEN = 81
SUDOKU_KINDS = ('sudoku', 'sudoku_rel')  # the position embeddings of this module
NUM_DIGITS = 9
BLANK = NUM_DIGITS  # any token >= 9 is blank (9 is the Sudoku MASK)
NUM_FEATURES = NUM_DIGITS + (NUM_DIGITS + 1) + NUM_DIGITS  # cand | one-hot count | hidden


# ----------------------------------------------------------------------------- positions


def sudoku_cells(seq_len: int = SUDOKU_LEN) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Row, column and 3×3-box index [81] of each cell of a row-major 9×9 grid."""
  if seq_len != SUDOKU_LEN:
    raise ValueError(f"model.position_embedding='sudoku' needs model.seq_len == 81, got {seq_len}")
  i = np.arange(SUDOKU_LEN)
  row, col = i // 9, i % 9
  return row, col, (row // 3) * 3 + col // 3


def sudoku_relations(seq_len: int = SUDOKU_LEN) -> np.ndarray:
  """Relation class [81, 81] of each pair of cells: same row (1) | same column (2) | same box (4).

  The 8 classes (0 = unrelated, 7 = the cell itself) are the constraint graph of Sudoku.
  """
  row, col, box = sudoku_cells(seq_len)
  return ((row[:, None] == row[None]) * 1 + (col[:, None] == col[None]) * 2
          + (box[:, None] == box[None]) * 4).astype(np.int32)


RELATIONS = features.Relations(sudoku_relations, 8)


class SudokuPositionEmbedding(nn.Module):
  """Learned row, column and 3×3-box tables [9, H] each, summed per cell -> float32 [81, H]."""
  seq_len: int
  features: int
  embedding_init: layers.Init | None = None

  @nn.compact
  def __call__(self, length: int) -> Array:
    """Returns float32 [length, H]; `length` must be 81."""
    layers.check_position_length(length, self.seq_len)
    if length != SUDOKU_LEN:
      raise ValueError(f'the Sudoku position embedding needs inputs of length 81, got {length}')
    row, col, box = sudoku_cells(self.seq_len)
    out = 0.0
    for nm, ids in (('row_embed', row), ('col_embed', col), ('box_embed', box)):
      out = out + layers.Embed(9, self.features, (None, 'embed'), self.embedding_init, name=nm)(
          jnp.asarray(ids))
    return out


# ----------------------------------------------------------------------------- candidates


def _tables() -> tuple[np.ndarray, np.ndarray]:
  """Units [27, 81] and peers [81, 81] (0/1), from the labeller's own unit table."""
  units = np.zeros((len(sudoku.UNIT_CELLS), sudoku.NUM_CELLS), np.float32)
  np.put_along_axis(units, sudoku.UNIT_CELLS, 1.0, axis=1)
  peers = ((units.T @ units) > 0) & ~np.eye(sudoku.NUM_CELLS, dtype=bool)
  return units, peers.astype(np.float32)


_UNITS, _PEERS = _tables()


def candidate_features(tokens: Array) -> Array:
  """tokens int [B, 81] (0..8 = digits 1..9, anything else = blank) -> float32 [B, 81, 28].

  From the revealed digits (the mask token 9 counts as blank):
    cand[c, d]   = 1 if digit d is in none of cell c's peers (same row, column or box), c blank
    count[c]     = Σ_d cand[c, d] (one-hot over 0..9: count 1 is a naked single)
    hidden[c, d] = cand[c, d] and c is the only cell of one of its three units with candidate d
  -> [cand (9) | one-hot count (10) | hidden (9)]. A blank cell is determined in round 1 exactly
  when count[c] == 1 or any hidden[c, :] (tests/test_sudoku_candidates.py checks this against
  the labeller of data/sudoku.py); the later rounds are left to the network.
  """
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


# ----------------------------------------------------------------------------- the seam


def model_features(cfg_model: Any) -> features.ModelFeatures:
  """The features the `model` section asks for (ModelConfig or its ConfigDict section)."""
  cfg = ModelConfig.from_section(cfg_model)
  grid = cfg.position_embedding in SUDOKU_KINDS
  inputs = None
  if cfg.sudoku_candidates:
    inputs = features.InputFeatures(candidate_features, trunk=not cfg.candidates_pathway_only)
  return features.ModelFeatures(
      positions=SudokuPositionEmbedding if grid else None,
      relations=RELATIONS if cfg.position_embedding == 'sudoku_rel' else None, inputs=inputs)
