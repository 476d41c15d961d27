"""`loss.hier_batch_stride` (processes/level_objectives.py): pass 1 of the training loss on every
k-th example, re-derived in numpy.

With the same key, a stride-k loss draws the same times, corruption and reveal set as the stride-1
loss, so its token terms equal the stride-1 loss's and pass 1 sees rows o, o + k, ... of the
stride-1 pass-1 inputs; its level terms (L_hier, L_cons, the level cross-entropy, L_rounds, the
level accuracy) equal a numpy re-derivation on those rows. The offset is uniform over 0..k-1. The
config rejects a stride that thins nothing or does not divide the batch, and the MDLM twin of a
strided config resolves to stride 1.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import sudoku_base as sudoku_config
from configs.base import get_base_config
from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import level_objectives
from hmdlm_jax.processes.schedules import Schedule
from tests.test_losses import B, MASK, make_batch, make_net, np_log_softmax, np_schedule
from tests.config_helpers import resolved

K = 3
OFFSETS = (0.0, 0.25, 0.5)
ROUNDS = K - 1


class Spy:
  """The network with a per-round token head (R = K - 1 rounds of token logits) and given rows
  (h_g = K+1); records every call's inputs."""

  def __init__(self, seed: int):
    self.params, self.net = make_net(seed, K + 1)  # K+2 level rows: room for h_g = K+1
    self.calls = []

  def __call__(self, tokens, levels, t, *, heads, token_levels=None):
    self.calls.append(dict(tokens=np.asarray(tokens), levels=np.asarray(levels),
                           t=np.asarray(t), heads=heads))
    out = self.net(self.params, tokens, levels, t, heads=tuple(set(heads) | {'token'}),
                   token_levels=token_levels)
    res = {}
    if 'hier' in heads:
      res['hier'] = out['hier'][..., :K]
    if 'hier_round_tokens' in heads:
      res['hier_round_tokens'] = jnp.stack([(r + 1.5) * out['token'] for r in range(ROUNDS)], 2)
    if 'token' in heads:
      res['token'] = out['token']
    return res


def _loss(stride: int, objective: str, key: int = 3):
  spy = Spy(4)
  batch = make_batch(5, K)
  cfg = config_lib.LossConfig(mask_id=MASK, num_levels=K, beta_hier=0.7, beta_cons=1.3,
                              beta_rounds=0.4, hier_objective=objective, given_state=True,
                              train_steps_T=4, hier_batch_stride=stride)
  loss, m = hmdlm.diffusion_loss(spy, batch, jax.random.key(key), Schedule('loglinear', OFFSETS),
                                 cfg)
  return float(loss), {k: float(v) for k, v in m.items()}, spy, batch


def _np_level_terms(spy: Spy, call: dict, rows: np.ndarray, batch: dict) -> dict[str, float]:
  """The level terms of pass 1 on `rows`, in float64 numpy from the network's logits."""
  out = spy(jnp.asarray(call['tokens']), jnp.asarray(call['levels']), jnp.asarray(call['t']),
            heads=('hier', 'hier_round_tokens'))
  t = call['t'].astype(np.float64)
  om, haz = np_schedule(OFFSETS, t)
  with np.errstate(divide='ignore'):
    logg = np_log_softmax(np.asarray(out['hier'], np.float64) + np.log(om)[:, None, :])
  lv, tok = batch['levels'][rows], batch['tokens'][rows]
  loss_mask = batch['loss_mask'][rows]
  sel = (call['tokens'] == MASK) & loss_mask
  nll = -np.take_along_axis(logg, lv[..., None], -1)[..., 0]
  lam0 = np.take_along_axis(haz, lv, 1)
  n_b = np.maximum(loss_mask.sum(-1), 1)
  w_b = loss_mask.sum(-1) / loss_mask.sum()
  hier = (w_b * ((lam0 * np.where(sel, nll, 0)).sum(-1) / n_b)).sum()
  cons_i = (np.exp(logg) * haz[:, None, :]).sum(-1) - lam0
  cons = (w_b * (np.where(sel, cons_i, 0).sum(-1) / n_b)).sum()
  rl = np_log_softmax(np.asarray(out['hier_round_tokens'], np.float64))  # [b, L, R, V]
  per_round = []
  for r in range(1, ROUNDS + 1):
    w = sel & (lv >= K - r)
    per_round.append(-np.take_along_axis(rl[:, :, r - 1], tok[..., None], -1)[..., 0][w].mean())
  return dict(hier=hier, cons=cons, level_ce=nll[sel].mean(), round_tokens=np.mean(per_round),
              level_acc=(logg.argmax(-1) == lv)[sel].mean())


@pytest.mark.parametrize('stride', [2, 4])
@pytest.mark.parametrize('objective', ['cross_entropy', 'bound'])
def test_strided_pass1_matches_numpy_on_its_rows(stride, objective):
  _, m1, spy1, batch = _loss(1, objective)
  loss, m, spy, _ = _loss(stride, objective)
  # The token terms keep the whole batch: the same draws as the stride-1 loss.
  for name in ('lm', 'token_nll', 'mask_rate', 'num_loss_tokens'):
    np.testing.assert_allclose(m[name], m1[name], rtol=1e-6, err_msg=name)
  full1, p2 = spy1.calls[0], spy.calls[1]
  np.testing.assert_array_equal(p2['tokens'], spy1.calls[1]['tokens'])  # pass 2: whole batch
  np.testing.assert_array_equal(p2['levels'], spy1.calls[1]['levels'])
  p1 = spy.calls[0]
  assert p1['heads'] == ('hier', 'hier_round_tokens') and p1['tokens'].shape[0] == B // stride
  hits = [o for o in range(stride)
          if np.array_equal(p1['tokens'], full1['tokens'][o::stride])
          and np.array_equal(p1['levels'], full1['levels'][o::stride])
          and np.array_equal(p1['t'], full1['t'][o::stride])]
  assert len(hits) == 1, hits
  rows = np.arange(hits[0], B, stride)
  np.testing.assert_array_equal(p1['levels'] == K + 1, batch['given'][rows])  # given rows follow
  want = _np_level_terms(spy, p1, rows, batch)
  for name, value in want.items():
    if name == 'level_ce' and objective == 'bound':
      assert name not in m  # reported with the cross-entropy objective only
      continue
    np.testing.assert_allclose(m[name], value, rtol=2e-5, atol=1e-6, err_msg=name)
  np.testing.assert_allclose(m['nelbo'], m['lm'] + want['hier'] + want['cons'], rtol=2e-5)
  level_part = (0.7 * want['level_ce'] if objective == 'cross_entropy'
                else 0.7 * want['hier'] + 1.3 * want['cons'])
  np.testing.assert_allclose(loss, m['lm'] + level_part + 0.4 * want['round_tokens'], rtol=2e-5)
  assert abs(m['hier'] - m1['hier']) > 1e-4  # not the whole batch's level terms


def test_offsets_are_uniform():
  # 400 draws at k = 4: each count is Binomial(400, 1/4), mean 100, sd 8.7; ±35 is 4 sd.
  take = [level_objectives.strided_rows(jax.random.key(i), 4) for i in range(400)]
  offsets = np.array([int(f(jnp.arange(8))[0]) for f in take])
  counts = np.bincount(offsets, minlength=4)
  assert np.all(np.abs(counts - 100) <= 35), counts


def test_strided_rows_mean_over_offsets_is_the_batch_mean():
  x = np.random.default_rng(0).normal(size=(12, 3))
  for k in (1, 2, 3, 4):  # k = 1: the identity
    means = [x[o::k].mean(0) for o in range(k)]  # what each offset's rows give
    np.testing.assert_allclose(np.mean(means, 0), x.mean(0), rtol=1e-12)
    key = jax.random.key(k)
    o = int(level_objectives.strided_rows(key, k)(jnp.arange(12))[0])
    got = level_objectives.strided_rows(key, k)(jnp.asarray(x, jnp.float32))
    np.testing.assert_array_equal(got, x[o::k].astype(np.float32))


def test_config_checks_and_the_twin():
  assert get_base_config().loss.hier_batch_stride == 1
  assert config_lib.LossConfig().hier_batch_stride == 1
  c = sudoku_config.get_config()
  c.loss.hier_batch_stride = 4
  assert config_lib.LossConfig.from_config(resolved(c)).hier_batch_stride == 4
  c.model.num_levels = 1  # the MDLM twin has no pass 1 to thin
  assert config_lib.resolve(c).loss.hier_batch_stride == 1
  bad = [('loss.hier_batch_stride=3 must divide the batch', dict(hier_batch_stride=3)),
         ('loss.hier_batch_stride must be an integer >= 1', dict(hier_batch_stride=0)),
         ("thins pass 1 of model.variant='two_pass'", dict(hier_batch_stride=2),
          'single_pass')]
  for case in bad:
    msg, fields = case[0], case[1]
    c = sudoku_config.get_config()
    for k, v in fields.items():
      c.loss[k] = v
    if len(case) > 2:
      c.model.variant = case[2]
    with pytest.raises(ValueError, match=msg.replace('(', r'\(').replace(')', r'\)')):
      config_lib.resolve(c)
  with pytest.raises(ValueError, match='loss.hier_batch_stride must be an integer >= 1'):
    config_lib.LossConfig(num_levels=K, hier_batch_stride=1.5)  # ConfigDict refuses it earlier


def test_strided_loss_trains_under_jit():
  # One jitted gradient: the strided rows compile (dynamic offset) and every parameter the
  # level head reads gets a gradient.
  spy = Spy(7)
  batch = {k: jnp.asarray(v) for k, v in make_batch(8, K).items()}
  cfg = config_lib.LossConfig(mask_id=MASK, num_levels=K, hier_objective='cross_entropy',
                              hier_batch_stride=2, train_steps_T=4)

  def f(params, key):
    net = functools.partial(spy.net, params)
    return hmdlm.diffusion_loss(lambda *a, **kw: {h: (v[..., :K] if h == 'hier' else v)
                                                  for h, v in net(*a, **kw).items()},
                                batch, key, Schedule('loglinear', OFFSETS), cfg)[0]

  g = jax.jit(jax.grad(f))(spy.params, jax.random.key(0))
  assert np.all(np.isfinite(np.asarray(g['out_hier']))) and np.abs(g['out_hier']).sum() > 0
  loss_jit = float(jax.jit(f)(spy.params, jax.random.key(0)))
  np.testing.assert_allclose(loss_jit, float(f(spy.params, jax.random.key(0))), rtol=1e-5)
