"""Tests for hmdlm_jax.models.token_head: the token head read at selected rows only.

References: the dense logits followed by `parameterization.token_nll` (the loss's reading before
this module existed), values and gradients; and the whole diffusion loss with
`loss.token_rows='all'` against 'selected' on real DiT / GPT-2 models (K = 1, two-pass and
single-pass K = 2). Unselected rows must cost nothing: a NaN planted in them never reaches the
result, where the dense reading's gradient turns NaN.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax.models import token_head
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import parameterization
from hmdlm_jax.processes.schedules import Schedule
from tests import model_helpers as mh

B, L, H, V = 3, 10, 8, 13
MASK = V - 1


def _dense(z, proj, query):
  logits = token_head.logits(z, proj, jnp.float32)
  nll = parameterization.token_nll(logits, query.targets, mask_id=query.exclude)
  return jnp.where(query.rows, nll, 0.0)


def _selected(z, proj, query):
  return token_head.selected_nll(z, proj, query, jnp.float32)


def _arrays(seed: int, p_rows: float):
  r = np.random.default_rng(seed)
  z = jnp.asarray(r.normal(size=(B, L, H)), jnp.float32)
  kernel = jnp.asarray(r.normal(size=(H, V)), jnp.float32)
  bias = jnp.asarray(r.normal(size=(V,)), jnp.float32)
  targets = jnp.asarray(r.integers(0, MASK, size=(B, L)), jnp.int32)
  rows = jnp.asarray(r.random((B, L)) < p_rows)
  cot = jnp.asarray(r.normal(size=(B, L)), jnp.float32)
  return z, kernel, bias, targets, rows, cot


@pytest.mark.parametrize('vocab_major,with_bias,p_rows', [
    (False, True, 0.4), (True, False, 0.4), (False, False, 0.0), (True, True, 1.0)])
def test_selected_nll_equals_dense_reading(vocab_major, with_bias, p_rows):
  # B·L = 30 rows in chunks of 4 (NUM_CHUNKS = 8): the last chunk is padded.
  z, kernel, bias, targets, rows, cot = _arrays(int(p_rows * 10) + 2 * vocab_major, p_rows)
  kernel = kernel.T if vocab_major else kernel
  bias = bias if with_bias else None
  query = token_head.TokenQuery(targets, rows, MASK)

  def loss(fn, z, kernel, bias):
    return (fn(z, token_head.Projection(kernel, bias, vocab_major), query) * cot).sum()

  want_v, want_g = jax.value_and_grad(functools.partial(loss, _dense), (0, 1, 2))(z, kernel, bias)
  got_v, got_g = jax.value_and_grad(functools.partial(loss, _selected),
                                    (0, 1, 2))(z, kernel, bias)
  np.testing.assert_allclose(got_v, want_v, rtol=1e-6, atol=1e-6)
  for got, want in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  per_row = _selected(z, token_head.Projection(kernel, bias, vocab_major), query)
  assert np.all(np.asarray(per_row)[~np.asarray(rows)] == 0.0)


def test_unselected_rows_are_never_computed():
  z, kernel, bias, targets, rows, cot = _arrays(7, 0.5)
  rows = rows.at[0].set(False)
  # Row (0, 3) is unselected. Sorted (selected first, then the unselected in order), it sits at
  # position n_sel + 3 (row 0 has no selected position), in the chunk that starts at
  # ceil(n_sel / chunk) * chunk >= n_sel: a chunk without selected rows, which is skipped.
  z = z.at[0, 3].set(jnp.nan)
  query = token_head.TokenQuery(targets, rows, MASK)
  proj = token_head.Projection(kernel, bias)
  g_sel = jax.grad(lambda k: (_selected(z, proj._replace(kernel=k), query)
                              * cot).sum())(kernel)
  g_dense = jax.grad(lambda k: (_dense(z, proj._replace(kernel=k), query) * cot).sum())(kernel)
  assert np.isnan(np.asarray(g_dense)).any()  # the dense reading touches every row
  assert np.isfinite(np.asarray(g_sel)).all()


# ----------------------------------------------------------------------------- the loss


def _model_cfg(backbone: str, num_levels: int, variant: str, tie: bool):
  return mh.model_cfg(backbone=backbone, num_levels=num_levels, variant=variant, vocab_size=V,
                      seq_len=L, dropout=0.0, tie_embeddings=tie)


@pytest.mark.parametrize('backbone,num_levels,variant,tie', [
    ('dit', 1, 'two_pass', False), ('dit', 2, 'two_pass', True),
    ('gpt2', 2, 'single_pass', False), ('gpt2', 1, 'two_pass', True)])
def test_loss_selected_rows_equals_all_rows(backbone, num_levels, variant, tie):
  model = models.build_model(_model_cfg(backbone, num_levels, variant, tie))
  params = mh.random_params(model, L, 0, scale=0.3)
  offsets = (0.0,) if num_levels == 1 else (0.0, 0.5)
  schedule = Schedule('loglinear', offsets)
  r = np.random.default_rng(1)
  batch = dict(tokens=jnp.asarray(r.integers(0, MASK, (B, L)), jnp.int32),
               levels=jnp.asarray(r.integers(0, num_levels, (B, L)), jnp.int32),
               given=jnp.asarray(r.random((B, L)) < 0.2),
               loss_mask=jnp.asarray(r.random((B, L)) < 0.9))
  base_cfg = config_lib.LossConfig(mask_id=MASK, num_levels=num_levels, variant=variant,
                                   train_steps_T=4)

  def loss(p, rows):
    apply_fn = models.make_apply_fn(model, p, train=False)
    cfg = dataclasses.replace(base_cfg, token_rows=rows)
    return hmdlm.diffusion_loss(apply_fn, batch, jax.random.key(3), schedule, cfg)

  grad = {rows: jax.jit(jax.value_and_grad(functools.partial(loss, rows=rows), has_aux=True))
          for rows in ('all', 'selected')}
  (v_all, m_all), g_all = grad['all'](params)
  (v_sel, m_sel), g_sel = grad['selected'](params)
  assert 0.0 < float(m_all['mask_rate']) < 1.0
  np.testing.assert_allclose(v_sel, v_all, rtol=1e-5)
  for k in m_all:
    np.testing.assert_allclose(m_sel[k], m_all[k], rtol=1e-5, atol=1e-6, err_msg=k)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_all), jax.tree.leaves(g_sel)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_token_rows_resolved_by_the_mesh():
  process = hmdlm.HMDLM(Schedule('loglinear', (0.0,)),
                        config_lib.LossConfig(mask_id=MASK, num_levels=1, token_rows='auto'))
  assert process.for_devices(1).cfg.token_rows == 'selected'
  assert process.for_devices(8).cfg.token_rows == 'all'
  sel = dataclasses.replace(process, cfg=dataclasses.replace(process.cfg, token_rows='selected'))
  assert sel.for_devices(1) is sel
  with pytest.raises(ValueError, match="loss.token_rows='selected'.*this mesh has 8"):
    sel.for_devices(8)
  with pytest.raises(ValueError, match='loss.token_rows'):
    config_lib.LossConfig(mask_id=MASK, num_levels=1, token_rows='some')


def test_token_nll_head_needs_its_query():
  model = models.build_model(_model_cfg('dit', 1, 'two_pass', False))
  apply_fn = models.make_apply_fn(model, mh.random_params(model, L, 0, scale=0.3), train=False)
  x = jnp.zeros((B, L), jnp.int32)
  with pytest.raises(ValueError, match="'token_nll' head and token_query go together"):
    apply_fn(x, x, jnp.ones((B,)), heads=('token_nll',))
