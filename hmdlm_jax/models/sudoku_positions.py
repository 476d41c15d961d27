"""Sudoku-aware positions for 9×9 grids (position_embedding 'sudoku' and 'sudoku_rel').

'sudoku': learned row, column and 3×3-box tables ([9, H] each, summed) added to the input in place
of one row per position ('learned'). 'sudoku_rel' adds, in every DiT attention layer, a learned
per-head bias for each of the 8 relation classes of a pair of cells (`SudokuRelationBias`).
Parameter names: position/{row,col,box}_embed/embedding and blocks_{i}/relation/relation_bias.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax.models import layers

Array = jax.Array

SUDOKU_LEN = 81
SUDOKU_KINDS = ('sudoku', 'sudoku_rel')


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


class SudokuPositionEmbedding(nn.Module):
  """Learned row, column and 3×3-box tables [9, H] each, summed per cell -> float32 [81, H]."""
  seq_len: int
  features: int
  embedding_init: layers.Init | None = None
  kind: str = 'sudoku'  # 'sudoku' | 'sudoku_rel': only named in errors

  @nn.compact
  def __call__(self, length: int) -> Array:
    """Returns float32 [length, H]; `length` must be 81."""
    layers.check_position_length(length, self.seq_len)
    if length != SUDOKU_LEN:
      raise ValueError(f'position_embedding={self.kind!r} needs inputs of length 81, got '
                       f'{length}')
    row, col, box = sudoku_cells(self.seq_len)
    out = 0.0
    for nm, ids in (('row_embed', row), ('col_embed', col), ('box_embed', box)):
      out = out + layers.Embed(9, self.features, (None, 'embed'), self.embedding_init, name=nm)(
          jnp.asarray(ids))
    return out


class SudokuRelationBias(nn.Module):
  """Learned per-head attention bias for each Sudoku relation class (position_embedding =
  'sudoku_rel'): scores[h, i, j] += table[rel(i, j), h]. Zero-init, so training starts from the
  plain attention; it lets every head find a cell's row, column and box peers at once instead of
  discovering them from position embeddings (the "sudden jump" of Sudoku training)."""
  num_heads: int

  @nn.compact
  def __call__(self) -> Array:
    """Returns float32 [nh, 81, 81]."""
    table = self.param('relation_bias',
                       nn.with_logical_partitioning(layers.zeros_init, (None, 'heads')),
                       (8, self.num_heads), jnp.float32)
    return jnp.transpose(table[jnp.asarray(sudoku_relations())], (2, 0, 1))
