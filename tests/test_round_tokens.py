"""The per-round token loss of issue 11 (`loss.beta_rounds`, docs/method.md §5.1).

* model: `pathway.round_tokens` adds one zero-init Linear ('hier_round_token_head') on the LN features
  of each repeat; its logits [B, L, R, V] equal a numpy product with the captured features, and the
  level output is the same as without the head;
* loss: L_rounds equals a numpy re-derivation (round r reads the masked loss positions of level
  >= K - r), enters the training loss as β_rounds L_rounds for both variants and leaves the bound's
  terms unchanged; the default log has no 'round_tokens';
* config: model.pathway.round_tokens is derived from loss.beta_rounds, and the errors name the field.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
import pytest

from hmdlm_jax.configs import sudoku_base as sudoku_config
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes.schedules import Schedule
from tests import model_helpers as mh
from tests.test_losses import B, L, MASK, V, make_batch, np_log_softmax
from tests.config_helpers import resolved

K = 3  # R = K - 1 = 2 rounds
ROUNDS = dict(hier_layers=1, hier_repeats=K - 1, hier_readout='rounds')


@functools.lru_cache(maxsize=None)
def _model(round_tokens: bool, variant: str = 'two_pass'):
  cfg = mh.model_cfg(num_levels=K, vocab_size=V, mask_id=-1, seq_len=L, dropout=0.0,
                     hier_round_tokens=round_tokens, variant=variant, **ROUNDS)
  model = models.build_model(cfg)
  return model, mh.random_params(model, L, seed=3, scale=0.3)


def _inputs(seed: int):
  r = np.random.default_rng(seed)
  return (jnp.asarray(r.integers(0, V, (B, L)), jnp.int32),
          jnp.asarray(r.integers(0, K + 1, (B, L)), jnp.int32),
          jnp.asarray(r.uniform(0.05, 1.0, (B,)), jnp.float32))


def test_round_token_head_reads_each_rounds_features():
  model, params = _model(True)
  plain, plain_params = _model(False)
  assert set(params) - set(plain_params) == {'hier_round_token_head'}
  head = params['hier_round_token_head']
  assert head['kernel'].shape == (16, V) and head['bias'].shape == (V,)
  tokens, levels, t = _inputs(1)
  out, state = jax.jit(lambda p: model.apply(
      {'params': p}, tokens, levels, t, heads=('hier', 'hier_round_tokens'),
      capture_intermediates=lambda mdl, _: mdl.name == 'hier_round_norm',
      mutable=['intermediates']))(params)
  feats = state['intermediates']['hier_round_norm']['__call__']
  assert len(feats) == K - 1
  ref = np.stack([np.asarray(f, np.float64) @ np.asarray(head['kernel'], np.float64)
                  + np.asarray(head['bias'], np.float64) for f in feats], axis=2)
  got = np.asarray(out['hier_round_tokens'])
  assert got.shape == (B, L, K - 1, V)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
  assert np.abs(got[:, :, 0] - got[:, :, 1]).max() > 1e-2  # two rounds, two different readings
  # The level output does not depend on the extra head (same shared parameters).
  shared = {k: v for k, v in params.items() if k != 'hier_round_token_head'}
  want = jax.jit(lambda p: plain.apply({'params': p}, tokens, levels, t, heads=('hier',)))(shared)
  np.testing.assert_allclose(np.asarray(out['hier']), np.asarray(want['hier']), rtol=1e-6,
                             atol=1e-6)
  with pytest.raises(ValueError, match='hier_round_tokens'):
    plain.apply({'params': plain_params}, tokens, levels, t, heads=('hier_round_tokens',))
  init = models.init_params(model, jax.random.key(0), L)['hier_round_token_head']
  assert not np.any(np.asarray(init['kernel'])) and not np.any(np.asarray(init['bias']))


def _np_round_loss(round_logits, tokens, levels, sel):
  """L_rounds written out: for r = 1..R, the mean NLL of round r over sel & level >= K - r."""
  logp = np_log_softmax(np.asarray(round_logits, np.float64))
  total = 0.0
  for r in range(1, K):
    w = sel & (levels >= K - r)
    nll = -np.take_along_axis(logp[:, :, r - 1], tokens[..., None], -1)[..., 0]
    total += nll[w].sum() / max(w.sum(), 1)
  return total / (K - 1)


@pytest.mark.parametrize('variant', ['two_pass', 'single_pass'])
def test_round_token_loss_matches_numpy(variant):
  model, params = _model(True, variant)
  net = models.make_apply_fn(model, params, train=False)
  batch = make_batch(4, K)
  sched = Schedule('loglinear', (0.0, 0.25, 0.5))
  key = jax.random.key(5)

  def run(beta):
    cfg = config_lib.LossConfig(mask_id=MASK, num_levels=K, beta_rounds=beta, variant=variant,
                                train_steps_T=8)
    return jax.jit(lambda b: hmdlm.diffusion_loss(net, b, key, sched, cfg))(batch)

  loss, m = run(0.6)
  loss0, m0 = run(0.0)
  assert 'round_tokens' not in m0 and 'round_tokens' in m
  for name in ('lm', 'hier', 'cons', 'nelbo', 'level_acc'):  # the bound's terms do not move
    np.testing.assert_allclose(float(m[name]), float(m0[name]), rtol=1e-6, err_msg=name)
  # Replay the loss's corruption (its documented key split) and read the rounds' logits.
  k_t, k_mask, _ = jax.random.split(key, 3)
  t = base.sample_times(k_t, B)
  xt, ht, masked = hmdlm.corrupt(k_mask, jnp.asarray(batch['tokens']),
                                 jnp.asarray(batch['levels']), jnp.asarray(batch['given']), t,
                                 sched, mask_id=MASK)
  heads = ('hier_round_tokens',)
  extra = {'token_levels': jnp.where(masked, batch['levels'], ht)} if variant == 'single_pass' \
      else {}
  logits = jax.jit(lambda: net(xt, ht, t, heads=heads, **extra))()['hier_round_tokens']
  sel = np.asarray(masked) & batch['loss_mask']
  want = _np_round_loss(logits, batch['tokens'], batch['levels'], sel)
  assert want > 0.5  # random heads: far from a perfect prediction
  np.testing.assert_allclose(float(m['round_tokens']), want, rtol=1e-5)
  np.testing.assert_allclose(float(loss), float(loss0) + 0.6 * want, rtol=1e-5)


def test_round_tokens_config_is_derived_and_checked():
  c = sudoku_config.get_config()
  assert c.loss.beta_rounds == 0.0 and not config_lib.resolve(c).model.pathway.round_tokens
  c.model.pathway.update(layers=1, repeats=c.model.num_levels - 1, readout='rounds')
  c.loss.beta_rounds = 0.5
  r = config_lib.resolve(c)
  assert r.model.pathway.round_tokens and config_lib.resolve(ml_collections.ConfigDict(config_lib.to_dict(r))).model.pathway.round_tokens
  assert config_lib.LossConfig.from_config(resolved(c)).beta_rounds == 0.5
  assert resolved(c).model.pathway.round_tokens
  bad = sudoku_config.get_config()
  bad.loss.beta_rounds = 0.5  # the default level head: no rounds to read
  with pytest.raises(ValueError, match="loss.beta_rounds.*pathway.readout='rounds'"):
    config_lib.resolve(bad)
  bad = sudoku_config.get_config()
  bad.model.pathway.round_tokens = True
  with pytest.raises(ValueError, match='model.pathway.round_tokens=True is derived from '
                                       'loss.beta_rounds'):
    config_lib.resolve(bad)
  bad = sudoku_config.get_config()
  bad.loss.beta_rounds = -1.0
  with pytest.raises(ValueError, match=r'loss.beta_rounds=-1.0 must lie in'):
    config_lib.resolve(bad)
