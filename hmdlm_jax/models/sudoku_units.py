"""Attention over the units of a 9×9 Sudoku grid (`model.hier_attention='sudoku_units'`).

Each cell attends to the 27 slots of its row, column and 3×3 box (itself once per unit), with one
softmax over the 27: the constraint graph of Sudoku, which is what a round of propagation reads
(docs/method.md §4.7). Against full attention over 81 cells it computes a third of the scores
and softmax, but on a CPU regrouping q, k and v costs about what that saves, so the step is no
faster (docs/results/sudoku.md). Only reshapes and transposes regroup the cells (no gathers, whose
gradients are scatters).

Layout: a row-major grid, cell i = 9 r + c. View 0 = rows (unit r, slot c), view 1 = columns
(unit c, slot r), view 2 = boxes (unit 3 (r // 3) + c // 3, slot 3 (r % 3) + c % 3).
"""

from __future__ import annotations

import math
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from hmdlm_jax.models import layers

Array = jax.Array

NUM_VIEWS = 3  # rows, columns, boxes


def _box_swap(g: Array) -> Array:
  """[B, 9, 9, ...] grid (r, c) <-> box view (unit, slot): the same swap both ways."""
  b, rest = g.shape[0], g.shape[3:]
  return g.reshape((b, 3, 3, 3, 3) + rest).swapaxes(2, 3).reshape((b, 9, 9) + rest)


def to_units(x: Array) -> Array:
  """Cells [B, 81, ...] -> the three views [B, 3, 9 units, 9 slots, ...]."""
  b, rest = x.shape[0], x.shape[2:]
  g = x.reshape((b, 9, 9) + rest)
  return jnp.stack([g, g.swapaxes(1, 2), _box_swap(g)], axis=1)


def from_units(y: Array) -> Array:
  """Views [B, 3, 9, 9, ...] -> each view back in cell order [B, 3, 81, ...]."""
  b, rest = y.shape[0], y.shape[4:]
  cells = [y[:, 0], y[:, 1].swapaxes(1, 2), _box_swap(y[:, 2])]
  return jnp.stack(cells, axis=1).reshape((b, NUM_VIEWS, 81) + rest)


def unit_attention(q: Array, k: Array, v: Array, dtype: Any, bias: Array | None = None) -> Array:
  """Softmax attention of each cell over its row, column and box.

  q, k, v [B, 81, nh, d] -> [B, 81, nh, d] in `dtype`; scores and softmax in float32.
  bias: optional float32 [3, 2, nh]: added to the scores of view u's other slots ([u, 0]) and of
  the cell itself ([u, 1]).
  out_i = Σ_u Σ_{j ∈ unit_u(i)} softmax_{27}(s_ij + bias[u, i == j]) v_j, s = q·k / √d.
  """
  chex.assert_equal_shape([q, k, v])
  chex.assert_axis_dimension(q, 1, 81)
  scale = 1.0 / math.sqrt(q.shape[-1])
  qu, ku, vu = (to_units(a.astype(dtype)) for a in (q, k, v))  # [B, 3, 9, 9, nh, d]
  s = jnp.einsum('bpusnd,bputnd->bpusnt', qu, ku,
                 preferred_element_type=jnp.float32) * scale  # [B, 3, 9, 9 (query), nh, 9 (key)]
  if bias is not None:
    self_slot = jnp.eye(9, dtype=jnp.float32)[:, None, :]  # [9 (query), 1, 9 (key)]
    s = s + (bias[:, 0, None, None, :, None]
             + (bias[:, 1] - bias[:, 0])[:, None, None, :, None] * self_slot)
  # One softmax over a cell's 27 slots: each view's log-sum-exp, brought to cell order, summed
  # over the views, and taken back into each view (only [B, 81, nh] tensors move between views).
  lse = jax.nn.logsumexp(from_units(jax.nn.logsumexp(s, axis=-1)), axis=1)  # [B, 81, nh]
  probs = jnp.exp(s - to_units(lse)[..., None])
  out = jnp.einsum('bpusnt,bputnd->bpusnd', probs.astype(dtype), vu,
                   preferred_element_type=jnp.float32)
  return from_units(out).sum(axis=1).astype(dtype)


class SudokuUnitBias(nn.Module):
  """Learned per-head bias [3, 2, nh] of each unit's other slots and of the cell itself (the
  relation bias of `position_embedding='sudoku_rel'` in unit attention). Zero-init."""
  num_heads: int

  @nn.compact
  def __call__(self) -> Array:
    return self.param('unit_bias', nn.with_logical_partitioning(layers.zeros_init,
                                                                (None, None, 'heads')),
                      (NUM_VIEWS, 2, self.num_heads), jnp.float32)
