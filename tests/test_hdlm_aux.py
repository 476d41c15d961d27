"""HDLM's optional auxiliary cluster head (process.hdlm.aux_weight, docs/method.md §13.1).

Off (weight 0): no head, no parameters, the loss unchanged. On (weight w): the backbones grow a
head [B, L, n], the training loss is the weight-0 loss + w × a numpy re-derivation of the head's
cross-entropy at MASK positions, the bound ('nelbo') is unchanged, and the 'aux' sampler draws
MASK -> cluster from that head: with the exact cluster law as the head it matches the data law.
The toy and the oracle are tests/test_hdlm.py's.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
import pytest

from hmdlm_jax.configs.base import get_base_config
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.processes import hdlm_core
from tests import oracle
from tests.test_hdlm import MASK
from tests.test_hdlm import WORD_CLUSTERS
from tests.test_hdlm import make_process
from tests.test_hdlm import toy
from tests.test_hdlm import _hdlm_config as _config
from tests.test_hdlm import _memo
from tests.config_helpers import resolved

B, L, N = 4, 6, 2
VOCAB = MASK + 1 + N


def _fake_net(seed: int, calls: list):
  """apply_fn with fixed random token [B, L, VOCAB] and cluster [B, L, N] logits; records calls."""
  rng = np.random.default_rng(seed)
  tok = jnp.asarray(rng.normal(size=(B, L, VOCAB)) * 2, jnp.float32)
  clu = jnp.asarray(rng.normal(size=(B, L, N)) * 2, jnp.float32)

  def apply_fn(tokens, levels, t, *, heads, token_levels=None):
    del levels, t, token_levels
    calls.append((heads, np.asarray(tokens)))
    out = {'token': tok}
    if 'cluster' in heads:
      out['cluster'] = clu
    return out

  return apply_fn, np.asarray(tok), np.asarray(clu)


def _batch(seed: int) -> dict[str, jnp.ndarray]:
  rng = np.random.default_rng(seed)
  loss_mask = rng.random((B, L)) < 0.8
  loss_mask[0] = False  # an example without loss positions
  return dict(tokens=jnp.asarray(rng.integers(0, MASK, (B, L)), jnp.int32),
              levels=jnp.zeros((B, L), jnp.int32), given=jnp.asarray(rng.random((B, L)) < 0.2),
              loss_mask=jnp.asarray(loss_mask))


def _numpy_aux(clu: np.ndarray, tokens: np.ndarray, z: np.ndarray, loss_mask: np.ndarray):
  log_p = clu - np.log(np.exp(clu).sum(-1, keepdims=True))
  gold = np.asarray(WORD_CLUSTERS)[tokens]
  ce = -np.take_along_axis(log_p, gold[..., None], -1)[..., 0]
  sel = loss_mask & (z == MASK)
  n_b = loss_mask.sum(-1)
  per_example = (ce * sel).sum(-1) / np.maximum(n_b, 1)
  return float((n_b * per_example).sum() / n_b.sum())


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_aux_loss_is_the_weight_zero_loss_plus_weighted_cross_entropy(seed):
  batch = _batch(seed)
  key = jax.random.key(10 + seed)
  calls0, calls1 = [], []
  net0, _, _ = _fake_net(seed, calls0)
  net1, _, clu = _fake_net(seed, calls1)
  loss0, m0 = make_process().loss(net0, batch, key)
  loss1, m1 = make_process(aux_weight=0.3).loss(net1, batch, key)
  assert [c[0] for c in calls0] == [('token',)] and 'aux' not in m0
  assert [c[0] for c in calls1] == [('token', 'cluster')]
  z = calls1[0][1]
  np.testing.assert_array_equal(z, calls0[0][1])  # the same noisy state
  assert (z == MASK).any() and not np.all(z == MASK)
  aux = _numpy_aux(clu, np.asarray(batch['tokens']), z, np.asarray(batch['loss_mask']))
  assert aux > 0.05
  np.testing.assert_allclose(float(m1['aux']), aux, rtol=1e-5)
  np.testing.assert_allclose(float(loss1), float(loss0) + 0.3 * aux, rtol=1e-5)
  for k in ('cluster', 'word', 'nelbo'):  # the bound and the bound's terms never read the head
    assert float(m1[k]) == float(m0[k])


def _tiny(backbone: str, cluster_head: int):
  c = get_base_config().model
  c.backbone, c.num_levels, c.vocab_size, c.seq_len = backbone, 1, VOCAB, L
  c.num_layers, c.hidden_size, c.num_heads, c.mlp_dim, c.cond_dim = 1, 16, 2, 32, 8
  c.cluster_head = cluster_head
  c.position_embedding = 'rotary' if backbone == 'dit' else 'learned'
  return c


@pytest.mark.parametrize('backbone,name', [('dit', 'cluster_layer'), ('gpt2', 'cluster_head')])
def test_backbones_grow_the_head_only_when_asked(backbone, name):
  plain = models.build_model(_tiny(backbone, 0))
  p0 = models.init_params(plain, jax.random.key(0), L)
  assert name not in p0
  tokens = jnp.zeros((2, L), jnp.int32)
  t = jnp.full((2,), 0.5)
  with pytest.raises(ValueError, match='no auxiliary cluster head'):
    jax.jit(lambda p: plain.apply({'params': p}, tokens, tokens, t, heads=('token', 'cluster')))(p0)
  model = models.build_model(_tiny(backbone, 5))
  p1 = models.init_params(model, jax.random.key(0), L)
  # Jitted: an eager apply compiles every op of the model separately.
  out = jax.jit(lambda p: model.apply({'params': p}, tokens, tokens, t,
                                      heads=('token', 'cluster')))(p1)
  assert out['cluster'].shape == (2, L, 5) and out['cluster'].dtype == jnp.float32
  # The head is the only new part: the rest of the tree is the plain model's, value for value.
  assert jax.tree.structure({k: v for k, v in p1.items() if k != name}) == jax.tree.structure(p0)
  h, cond = 16, 8
  expect = {'dit': (cond * 2 * h + 2 * h) + h + (h * 5 + 5),  # adaLN (zero), LN scale, Linear
            'gpt2': h * 5 + 5}[backbone]
  counts = models.param_count_breakdown(_tiny(backbone, 5))
  assert counts['cluster head'] == expect == models.count_params(p1[name])
  assert counts['total'] == models.count_params(p0) + expect
  if backbone == 'dit':  # adaLN-zero: the head starts at logits 0
    np.testing.assert_array_equal(np.asarray(out['cluster']), 0.0)


def test_gradient_reaches_the_head_through_the_real_backbone():
  c = _tiny('dit', N)
  model = models.build_model(c)
  params = models.init_params(model, jax.random.key(0), L)
  proc = make_process(aux_weight=0.5)
  batch = _batch(0)

  def loss_fn(p):
    return proc.loss(models.make_apply_fn(model, p, train=False), batch, jax.random.key(1))[0]

  grads = jax.jit(jax.grad(loss_fn))(params)
  g = grads['cluster_layer']['linear']['kernel']
  assert np.all(np.isfinite(g)) and float(jnp.abs(g).sum()) > 0


@pytest.mark.slow  # CI time (2026-12-01): nightly
def test_aux_sampler_with_the_exact_cluster_law_matches_the_data_law():
  tt = toy()
  proc = make_process(aux_weight=1.0, cluster_draw='aux')
  memo = _memo(tt, proc)

  def with_head(tokens, levels, t, *, heads, token_levels=None):
    out = dict(memo(tokens, levels, t, heads=('token',)))
    if 'cluster' in heads:  # the exact P(c | z_t) = Σ_{v∈c} x̂(v) as the auxiliary head's logits
      p = hdlm_core.cluster_probs(hdlm_core.word_log_probs(out['token'], proc.layout), proc.layout)
      out['cluster'] = jnp.log(p)
    return out

  cfg = SampleConfig(num_steps=1000, num_levels=1, mask_id=MASK, use_cache=False)
  tv, out = oracle.sampler_total_variation(tt, proc, with_head, cfg, num_samples=20_000)
  print(f"'aux' cluster draws with the exact head, T = 1000: TV = {tv:.4f}")
  assert tv < 0.03 and int(out.nan_calls) == 0


def test_aux_sampler_follows_the_head_not_the_token_law():
  """A uniform token head and a head that says cluster 1 (logits 0, 5). First-order jumps: a
  position still MASK at the last step (probability β_m(1/T) / β_m(1)) becomes the argmax word 0
  (greedy) or a uniform word; every other one went through a cluster drawn from the head, and
  its word is inside that cluster. The fraction of cluster-0 words is checked against that
  closed form within 4 standard errors."""
  proc = make_process(aux_weight=1.0, cluster_draw='aux')

  def net(tokens, levels, t, *, heads, token_levels=None):
    del levels, t, token_levels
    b, l = tokens.shape
    out = {'token': jnp.zeros((b, l, VOCAB))}
    if 'cluster' in heads:
      out['cluster'] = jnp.broadcast_to(jnp.asarray([0.0, 5.0]), (b, l, N))
    return out

  steps, rows, length = 16, 512, 3
  m1, mt = proc.schedule.marginals(jnp.asarray(1.0)), proc.schedule.marginals(
      jnp.asarray(1.0 / steps))
  stay = float(mt.beta_m / m1.beta_m)
  head0 = 1.0 / (1.0 + np.exp(5.0))  # the head's probability of cluster 0
  for greedy, expect in ((True, stay), (False, stay * 0.5 + (1 - stay) * head0)):
    cfg = SampleConfig(num_steps=steps, num_levels=1, mask_id=MASK, greedy=greedy,
                       use_cache=False)
    out = jax.tree.map(np.asarray, proc.sample(net, jax.random.key(0), cfg, batch_size=rows,
                                               seq_len=length))
    frac0 = float((np.asarray(WORD_CLUSTERS)[out.tokens] == 0).mean())
    se = np.sqrt(expect * (1 - expect) / (rows * length))
    print(f'greedy={greedy}: cluster-0 words {frac0:.4f}, expected {expect:.4f} ± {se:.4f}')
    assert abs(frac0 - expect) < 4 * se + 1e-9


def test_config_derives_the_head_and_names_bad_fields():
  assert config_lib.resolve(_config()).model.cluster_head == 0
  r = config_lib.resolve(_config(aux_weight=0.1))
  assert r.model.cluster_head == 8 and config_lib.resolve(ml_collections.ConfigDict(config_lib.to_dict(r))).model.cluster_head == 8
  assert config_lib.hdlm_config(resolved(_config(aux_weight=0.1))).aux_weight == 0.1
  assert resolved(_config(aux_weight=0.1)).model.cluster_head == 8
  for kw, match in ((dict(aux_weight=-1.0), 'process.hdlm.aux_weight'),
                    (dict(aux_weight=0.1, num_clusters=1), 'one cluster is MASK'),
                    (dict(cluster_draw='aux'), "cluster_draw='aux'")):
    c = _config(**kw)
    if kw.get('num_clusters') == 1:
      c.model.vocab_size = 101
    with pytest.raises(ValueError, match=match):
      config_lib.resolve(c)
  c = _config()
  c.model.cluster_head = 5
  with pytest.raises(ValueError, match='model.cluster_head=5 is derived'):
    config_lib.resolve(c)
  c = get_base_config()  # any other process: no head
  assert config_lib.resolve(c).model.cluster_head == 0
  assert dataclasses.replace(make_process(aux_weight=0.2).cfg).aux_weight == 0.2
