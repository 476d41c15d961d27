"""`model.hier_attention='sudoku_units'` (models/sudoku_units.py): attention over a cell's row,
column and box, one softmax over its 27 slots.

* the views regroup the cells exactly (numpy index oracle) and `from_units` inverts `to_units`;
* `unit_attention` equals a numpy re-derivation that lists each cell's 27 slots by loops, with and
  without the per-unit self / other bias, and its gradient is finite;
* the pathway's blocks use it (their relation table becomes the [3, 2, nh] unit bias), the token
  trunk keeps full attention, and the step's matrix FLOPs fall;
* the setting is refused off a 9×9 DiT with one line naming the field.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import sudoku_learned_hierarchy
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax.models import sudoku_units
from scripts import step_cost
from tests import model_helpers as mh
from tests.config_helpers import resolved


def _np_units() -> list[list[list[int]]]:
  """units[view][unit] = the 9 cells of that row / column / box, in slot order."""
  rows = [[9 * r + c for c in range(9)] for r in range(9)]
  cols = [[9 * r + c for r in range(9)] for c in range(9)]
  boxes = [[9 * (3 * (u // 3) + s // 3) + 3 * (u % 3) + s % 3 for s in range(9)]
           for u in range(9)]
  return [rows, cols, boxes]


def test_views_regroup_the_cells():
  x = np.arange(2 * 81).reshape(2, 81)
  views = np.asarray(sudoku_units.to_units(jnp.asarray(x)))
  for p, units in enumerate(_np_units()):
    np.testing.assert_array_equal(views[:, p], x[:, np.asarray(units)])
  back = np.asarray(sudoku_units.from_units(jnp.asarray(views)))
  for p in range(3):
    np.testing.assert_array_equal(back[:, p], x)


def _np_unit_attention(q, k, v, bias):
  """q, k, v [B, 81, nh, d] float64; bias [3, 2, nh] -> [B, 81, nh, d], by loops over slots."""
  b, l, nh, d = q.shape
  out = np.zeros_like(q)
  units = _np_units()
  for i in range(l):
    slots = [(p, j) for p in range(3) for unit in units[p] if i in unit for j in unit]
    assert len(slots) == 27
    js = np.asarray([j for _, j in slots])
    s = np.einsum('bnd,bjnd->bnj', q[:, i], k[:, js]) / np.sqrt(d)
    s = s + np.stack([bias[p, int(j == i)] for p, j in slots], axis=-1)[None]
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out[:, i] = np.einsum('bnj,bjnd->bnd', w, v[:, js])
  return out


@pytest.mark.parametrize('with_bias', [False, True])
def test_unit_attention_matches_numpy(with_bias):
  r = np.random.default_rng(0)
  q, k, v = (r.normal(size=(2, 81, 2, 4)) for _ in range(3))
  bias = r.normal(size=(3, 2, 2)) if with_bias else np.zeros((3, 2, 2))
  got = sudoku_units.unit_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)),
                                    jnp.float32, jnp.asarray(bias, jnp.float32)
                                    if with_bias else None)
  np.testing.assert_allclose(np.asarray(got), _np_unit_attention(q, k, v, bias),
                             atol=1e-5, rtol=1e-5)
  grad = jax.grad(lambda a: sudoku_units.unit_attention(a, a, a, jnp.float32).sum())(
      jnp.asarray(q, jnp.float32))
  assert np.isfinite(np.asarray(grad)).all() and np.abs(np.asarray(grad)).max() > 0


def _cfg(**over):
  c = sudoku_learned_hierarchy.get_config()
  c.data.batch_size = 2
  m = c.model
  m.hidden_size, m.num_heads, m.mlp_dim, m.num_layers, m.hier_width = 16, 2, 32, 1, 8
  for key, value in over.items():
    setattr(m, key, value)
  return c


def test_pathway_blocks_attend_over_units(monkeypatch):
  """The pathway's blocks read a unit bias and no [81, 81] relation table; the token trunk
  keeps its relation table; the pathway's output equals the blocks' re-derivation through
  the numpy oracle (one block, one repeat)."""
  cfg = resolved(_cfg(hier_attention='sudoku_units')).model
  model = models.build_model(cfg)
  abstract = models.abstract_params(model, 81)
  assert abstract['hier_blocks_0']['relation']['unit_bias'].shape == (3, 2, 2)
  assert abstract['blocks_0']['relation']['relation_bias'].shape == (8, 2)
  full = models.abstract_params(
      models.build_model(resolved(_cfg()).model), 81)
  assert full['hier_blocks_0']['relation']['relation_bias'].shape == (8, 2)
  # The block's attention output, intercepted, equals the numpy oracle on its q, k, v.
  params = mh.random_params(model, 81, 8, scale=0.3)
  seen = {}
  orig = sudoku_units.unit_attention

  def spy(q, k, v, dtype, bias=None):
    out = orig(q, k, v, dtype, bias)
    seen.setdefault('args', (q, k, v, bias, out))
    return out

  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 10, size=(2, 81)), jnp.int32)
  levels = jnp.full((2, 81), cfg.num_levels, jnp.int32)
  monkeypatch.setattr(sudoku_units, 'unit_attention', spy)
  model.apply({'params': params}, tokens, levels, jnp.asarray([0.3, 0.7]), heads=('hier',))
  q, k, v, bias, out = (np.asarray(a, np.float64) for a in seen['args'])
  np.testing.assert_allclose(out, _np_unit_attention(q, k, v, bias), atol=1e-4, rtol=1e-4)


def test_unit_attention_cuts_matrix_flops():
  full = step_cost.step_flops(_cfg())
  units = step_cost.step_flops(_cfg(hier_attention='sudoku_units'))
  assert 0 < units < full


@pytest.mark.parametrize('over, match', [
    (dict(hier_attention='rows'), 'model.hier_attention'),
    (dict(hier_attention='sudoku_units', backbone='gpt2', position_embedding='rotary'),
     'model.hier_attention'),
])
def test_bad_settings_are_refused(over, match):
  with pytest.raises(ValueError, match=match):
    resolved(_cfg(**over)).model
