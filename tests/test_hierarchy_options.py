"""The hierarchy pathway options of issue 11 (docs/method.md §4.7, §5.1; docs/design.md).

* model: hierarchy trunk (`pathway.layers`, weight-tied `pathway.repeats`), `pathway.time_conditioning`,
  `pathway.input_embed`, `given_state` (givens enter as h_g = K+1): every part starts as the identity,
  only 'hier_*' parameters are added, stop-gradient isolates the backbone, R repeats share weights;
* process: the given state reaches every network call of the loss, the bound and the sampler, and
  nothing else; `loss.hier_objective='cross_entropy'` equals a numpy re-derivation and the default
  is the bound's terms; the level-hidden LM term equals its numpy re-derivation;
* optim: `optim.hier_grad_clip` clips each group to its own norm and a huge head gradient leaves
  the backbone's update unchanged; `optim.hier_lr_scale` multiplies the hierarchy group's AdamW
  update exactly and leaves the backbone's;
* config: `loss.train_steps_T = 0` resolves to `sample.num_steps`;
* `model.pathway.num_heads`: the pathway's blocks attend with that many heads (numpy re-derivation).
The parameter trees of existing configs are pinned by tests/test_models.py (fixtures).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import flops
from hmdlm_jax.configs.base import get_base_config
from hmdlm_jax.configs import sudoku_base as sudoku_config
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax import optim
from hmdlm_jax.processes import base
from hmdlm_jax.processes import hmdlm
from hmdlm_jax.processes import hmdlm_sampler
from hmdlm_jax.processes.schedules import Schedule
from tests import model_helpers as mh
from tests.test_losses import B, L, MASK, V, make_batch, make_net, np_log_softmax, np_schedule
from tests.test_models_reference import _np64, _np_ddit_block
from tests.config_helpers import resolved

K = 3


def _model_cfg(**over):
  return config_lib.ModelConfig.from_section(mh.model_cfg(
      **{'num_levels': K, 'vocab_size': V, 'mask_id': -1, 'seq_len': L, 'dropout': 0.0, **over}))


def _perturbed(params, seed, scale=0.1):
  """params + N(0, scale²) noise, drawn and added in numpy (eager jnp ops compile per shape)."""
  r = np.random.default_rng(seed)
  return jax.tree.map(lambda x: jnp.asarray(np.asarray(x) + scale * r.normal(size=x.shape),
                                            jnp.float32), params)


@functools.lru_cache(maxsize=None)
def _model(**over):
  cfg = _model_cfg(**over)
  model = models.build_model(cfg)
  return model, models.abstract_params(model, L)


def _inputs(seed=0, num_states=K + 1):
  r = np.random.default_rng(seed)
  return (jnp.asarray(r.integers(0, V, (B, L)), jnp.int32),
          jnp.asarray(r.integers(0, num_states, (B, L)), jnp.int32),
          jnp.asarray(r.uniform(0.05, 1.0, (B,)), jnp.float32))


@functools.lru_cache(maxsize=None)
def _hier_fn(model):
  return jax.jit(lambda p, x, h, t: model.apply({'params': p}, x, h, t, heads=('hier',))['hier'])


def _hier(model, params, tokens, levels, t):
  """The hier logits, jitted once per model (eager apply compiles every op separately)."""
  return np.asarray(_hier_fn(model)(params, tokens, levels, t))


ALL_ON = dict(hier_layers=2, hier_repeats=2, hier_time_conditioning=True, hier_input_embed=True,
              hier_width=8)


@pytest.mark.parametrize('backbone,options', [
    ('dit', ALL_ON),  # adaLN-zero blocks: the identity at init
    ('gpt2', dict(hier_time_conditioning=True, hier_input_embed=True)),  # its blocks are not
])
def test_pathway_adds_only_hier_params_and_starts_as_identity(backbone, options):
  pe = 'rotary' if backbone == 'dit' else 'learned'
  off, off_abs = _model(backbone=backbone, position_embedding=pe)
  on, on_abs = _model(backbone=backbone, position_embedding=pe, **options)
  extra = set(on_abs) - set(off_abs)
  assert extra and all(optim.hierarchy.is_hierarchy_param(n) for n in extra), extra
  assert {'hier_time_embed', 'hier_time_proj', 'hier_level_embed'} <= extra
  if options.get('hier_layers'):
    assert {'hier_blocks_0', 'hier_blocks_1', 'hier_in_proj', 'hier_out_proj'} <= extra
    assert on_abs['hier_blocks_0']['mlp_0']['kernel'].shape == (8, 16)  # width 8, MLP 32·8/16
    assert 'hier_blocks_2' not in extra  # R = 2 repeats the SAME two blocks
  # Shared parameters random; the pathway at its real init (zero tables / gates / projections).
  shared = _perturbed(models.init_params(off, jax.random.key(0), L), 1)
  on_init = models.init_params(on, jax.random.key(2), L)
  params_on = {**on_init, **shared}
  args = _inputs(3)
  np.testing.assert_allclose(_hier(on, params_on, *args), _hier(off, shared, *args), atol=1e-5)
  # Perturbed, the pathway changes the logits (the test can fail).
  moved = {**params_on, **_perturbed({n: on_init[n] for n in extra}, 4, 0.3)}
  assert np.abs(_hier(on, moved, *args) - _hier(off, shared, *args)).max() > 1e-3


def test_pathway_heads_option_runs_single_head_attention():
  """model.pathway.num_heads: the pathway's block attends with that many heads (numpy re-derivation
  of the block on the inputs it received), the token trunk keeps model.num_heads."""
  model, abstract = _model(hier_layers=1, hier_width=8, hier_num_heads=1)
  assert abstract['hier_blocks_0']['attn_qkv']['kernel'].shape == (8, 3, 1, 8)
  assert abstract['blocks_0']['attn_qkv']['kernel'].shape == (16, 3, 2, 8)
  assert _model(hier_layers=1, hier_width=8)[1]['hier_blocks_0']['attn_qkv']['kernel'].shape == (
      8, 3, 2, 4)  # 0 = num_heads
  params = mh.random_params(model, L, 8, scale=0.3)
  seen = {}

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.module.name == 'hier_blocks_0' and context.method_name == '__call__':
      seen['x'], seen['c'], seen['out'] = args[0], args[1], out
    return out

  with nn.intercept_methods(record):
    model.apply({'params': params}, *_inputs(9), heads=('hier',))
  want = _np_ddit_block(_np64(params['hier_blocks_0']), np.asarray(seen['x'], np.float64),
                        np.asarray(seen['c'], np.float64))
  np.testing.assert_allclose(np.asarray(seen['out']), want, atol=1e-4, rtol=1e-4)
  for bad, match in ((dict(hier_width=8, hier_num_heads=3), 'divisible'),
                     (dict(hier_width=6, hier_num_heads=2), 'even head dimension'),
                     (dict(hier_num_heads=-1), 'model.pathway.num_heads')):
    with pytest.raises(ValueError, match=match):
      _model_cfg(hier_layers=1, **bad)


def test_repeats_share_weights_and_act():
  one, abs1 = _model(hier_layers=1)
  four, abs4 = _model(hier_layers=1, hier_repeats=4)
  assert jax.tree.map(lambda x: x.shape, abs1) == jax.tree.map(lambda x: x.shape, abs4)
  params = _perturbed(models.init_params(one, jax.random.key(0), L), 5, 0.3)
  args = _inputs(6)
  assert np.abs(_hier(one, params, *args) - _hier(four, params, *args)).max() > 1e-3
  with pytest.raises(ValueError, match='model.pathway.repeats'):
    _model_cfg(hier_repeats=2)


@pytest.mark.slow  # CI time (2026-12-01): nightly
def test_stop_gradient_isolates_the_backbone():
  model, _ = _model(hier_layers=1, hier_input_embed=True, hier_stop_gradient=True)
  params = _perturbed(models.init_params(model, jax.random.key(0), L), 7, 0.3)
  tokens, levels, t = _inputs(8)
  grads = jax.grad(lambda p: jnp.sum(model.apply({'params': p}, tokens, levels, t,
                                                 heads=('hier',))['hier'] ** 2))(params)
  norms = {n: float(optim.group_norms({n: g})['hier'] + optim.group_norms({n: g})['backbone'])
           for n, g in grads.items()}
  for n, v in norms.items():
    if optim.hierarchy.is_hierarchy_param(n):
      assert v > 0, n
    else:
      assert v == 0, n


def test_given_state_table_rows_and_wrapper():
  model, abstract = _model(given_state=True, variant='single_pass')
  assert abstract['level_embed']['embedding'].shape == (K + 2, 16)
  assert abstract['token_level_embed']['embedding'].shape == (K + 2, 16)
  calls = []

  def spy(tokens, levels, t, *, heads, token_levels=None):
    calls.append((np.asarray(levels), None if token_levels is None else np.asarray(token_levels)))
    return {}

  given = np.zeros((B, L), bool)
  given[:, :3] = True
  levels = np.zeros((B, L), np.int32)
  base.with_given_state(spy, given, K)(levels, levels, jnp.ones(B), heads=('hier',),
                                       token_levels=levels + 1)
  (lv, tl), = calls
  np.testing.assert_array_equal(lv, np.where(given, K + 1, 0))
  np.testing.assert_array_equal(tl, np.where(given, K + 1, 1))


class Spy:
  def __init__(self, fn):
    self.fn, self.calls = fn, []

  def __call__(self, tokens, levels, t, *, heads, token_levels=None):
    if not isinstance(levels, jax.core.Tracer):  # eval_shape's abstract call records nothing
      self.calls.append(dict(levels=np.asarray(levels), tokens=np.asarray(tokens), heads=heads))
    return self.fn(tokens, levels, t, heads=heads, token_levels=token_levels)


def _net_with_given_row(seed):
  params, net = make_net(seed, K + 1)  # K+2 level rows: room for h_g = K+1
  return params, lambda p, *a, **kw: {
      h: (v[..., :K] if h == 'hier' else v) for h, v in net(p, *a, **kw).items()}


def test_given_state_reaches_every_loss_and_bound_call():
  params, net = _net_with_given_row(1)
  batch = make_batch(2, K)
  sched = Schedule('loglinear', (0.0, 0.25, 0.5))
  for cfg in (config_lib.LossConfig(mask_id=MASK, num_levels=K, given_state=True, train_steps_T=4),
              config_lib.LossConfig(mask_id=MASK, num_levels=K, given_state=True,
                                    variant='single_pass')):
    proc = hmdlm.HMDLM(sched, cfg)
    spy = Spy(functools.partial(net, params))
    proc.loss(spy, batch, jax.random.key(0))
    t = jnp.full((B,), 0.6)
    state = proc.corrupt(jax.random.key(1), batch, t)
    assert not np.any(np.asarray(state.levels) == K + 1)  # states keep the data's levels
    proc.bound_from_state(spy, batch, state, t, jax.random.key(2))
    proc.estimates_from_state(spy, batch, state, t)
    assert len(spy.calls) >= 4
    for c in spy.calls:
      np.testing.assert_array_equal(c['levels'] == K + 1, batch['given'])


@pytest.mark.slow  # CI time (2026-12-01): nightly
def test_given_state_in_the_sampler_keeps_output_levels():
  params, net = _net_with_given_row(3)
  sched = Schedule('loglinear', (0.0, 0.25, 0.5))
  given = np.zeros((B, L), bool)
  given[:, ::4] = True
  g_tok = np.where(given, 2, MASK).astype(np.int32)
  g_lvl = np.where(given, K - 1, K).astype(np.int32)
  for ordering, ctx in (('ancestral', 'candidates'), ('confidence', 'none')):
    cfg = config_lib.SampleConfig(num_steps=6, num_levels=K, mask_id=MASK, ordering=ordering,
                                  level_context=ctx, given_state=True, use_cache=False)
    spy = Spy(functools.partial(net, params))
    with jax.disable_jit():  # the spy records concrete arrays (the chain is a lax.scan)
      out = hmdlm_sampler.sample(spy, jax.random.key(0), sched, cfg, batch_size=B, seq_len=L,
                                 given_tokens=g_tok, given_levels=g_lvl, given_mask=given)
    np.testing.assert_array_equal(np.asarray(out.levels)[given], K - 1)
    assert np.all(np.asarray(out.levels)[~given] < K)
    assert len(spy.calls) >= 6
    for c in spy.calls:
      np.testing.assert_array_equal(c['levels'] == K + 1, given)


def _loss_and_pass1(objective, beta_hier=0.7):
  params, net = make_net(4, K)
  spy = Spy(functools.partial(net, params))
  batch = make_batch(5, K)
  sched = Schedule('loglinear', (0.0, 0.25, 0.5))
  cfg = config_lib.LossConfig(mask_id=MASK, num_levels=K, beta_hier=beta_hier, beta_cons=1.3,
                              hier_objective=objective)
  loss, m = hmdlm.diffusion_loss(spy, batch, jax.random.key(6), sched, cfg)
  return float(loss), m, spy, batch, net, params


def test_hier_objective_default_is_the_bound_terms():
  assert get_base_config().loss.hier_objective == 'bound'
  assert config_lib.LossConfig().hier_objective == 'bound'
  loss, m, *_ = _loss_and_pass1('bound')
  np.testing.assert_allclose(loss, float(m['lm'] + 0.7 * m['hier'] + 1.3 * m['cons']), rtol=1e-6)


def test_cross_entropy_objective_matches_numpy():
  loss, m, spy, batch, net, params = _loss_and_pass1('cross_entropy')
  _, m_bound, *_ = _loss_and_pass1('bound')
  assert 'level_ce' not in m_bound  # the default log is unchanged
  for name in ('lm', 'hier', 'cons', 'nelbo'):  # reported terms do not change
    np.testing.assert_allclose(float(m[name]), float(m_bound[name]), rtol=1e-6, err_msg=name)
  p1 = spy.calls[0]  # pass 1 on (x_t, h_t)
  t = np.asarray(base.sample_times(jax.random.split(jax.random.key(6), 3)[0], B), np.float64)
  logits = np.asarray(net(params, p1['tokens'], p1['levels'], jnp.asarray(t, jnp.float32),
                          heads=('hier',))['hier'], np.float64)
  om, _ = np_schedule((0.0, 0.25, 0.5), t)
  with np.errstate(divide='ignore'):
    logg = np_log_softmax(logits + np.log(om)[:, None, :])  # prior-corrected head
  sel = (p1['tokens'] == MASK) & batch['loss_mask']
  nll = -np.take_along_axis(logg, batch['levels'][..., None], -1)[..., 0]
  ce = nll[sel].mean()
  np.testing.assert_allclose(float(m['level_ce']), ce, rtol=1e-5)
  np.testing.assert_allclose(loss, float(m['lm']) + 0.7 * ce, rtol=1e-5)
  assert abs(loss - float(m['lm'] + 0.7 * m['hier'] + 1.3 * m['cons'])) > 1e-3


def test_lm_hidden_level_matches_numpy():
  params, net = make_net(7, K)
  spy = Spy(functools.partial(net, params))
  batch = make_batch(8, K)
  sched = Schedule('loglinear', (0.0, 0.25, 0.5))
  proc = hmdlm.HMDLM(sched, config_lib.LossConfig(mask_id=MASK, num_levels=K))
  assert proc.estimate_names == ('appendix_e', 'lm_hidden_level')
  t = jnp.asarray(np.random.default_rng(9).uniform(0.3, 1.0, B), jnp.float32)
  state = proc.corrupt(jax.random.key(10), batch, t)
  got = proc.estimates_from_state(spy, batch, state, t)
  p2 = spy.calls[-1]
  assert p2['heads'] == ('token',)
  np.testing.assert_array_equal(p2['levels'], np.asarray(state.levels))  # level hidden: h_t
  logits = np.asarray(net(params, p2['tokens'], p2['levels'], t, heads=('token',))['token'],
                      np.float64)
  logits[..., MASK] = -np.inf
  nll = -np.take_along_axis(np_log_softmax(logits), batch['tokens'][..., None], -1)[..., 0]
  _, haz = np_schedule((0.0, 0.25, 0.5), np.asarray(t, np.float64))
  sel = (np.asarray(state.tokens) == MASK) & batch['loss_mask']
  ref = np.where(sel, np.take_along_axis(haz, batch['levels'], 1) * nll, 0).sum(1)
  ref /= batch['loss_mask'].sum(1)
  np.testing.assert_allclose(np.asarray(got['lm_hidden_level']), ref, rtol=1e-5)
  k1 = hmdlm.HMDLM(Schedule('loglinear', (0.0,)), config_lib.LossConfig(mask_id=MASK,
                                                                         num_levels=1))
  assert k1.estimate_names == ('appendix_e',)


def _grads(head_scale):
  r = np.random.default_rng(0)
  return {'blocks_0': {'kernel': jnp.asarray(r.normal(size=(4, 5)), jnp.float32)},
          'level_embed': {'embedding': jnp.asarray(r.normal(size=(3, 5)), jnp.float32)},
          'hier_layer': {'kernel': head_scale * jnp.asarray(r.normal(size=(5, 2)), jnp.float32)},
          'hier_blocks_0': {'kernel': head_scale * jnp.asarray(r.normal(size=(5, 5)),
                                                                jnp.float32)}}


def test_group_clip_limits_each_group():
  g = _grads(1e3)
  assert optim.param_groups(g)['level_embed']['embedding'] == 'backbone'
  clip = optim.clip_by_group_global_norm({'backbone': 0.5, 'hier': 2.0})
  out, _ = clip.update(g, clip.init(g))
  before, after = optim.group_norms(g), optim.group_norms(out)
  np.testing.assert_allclose(float(after['backbone']), 0.5, rtol=1e-5)
  np.testing.assert_allclose(float(after['hier']), 2.0, rtol=1e-5)
  # Direction kept: u_g scaled by limit / ||u_g||.
  np.testing.assert_allclose(np.asarray(out['hier_layer']['kernel']),
                             np.asarray(g['hier_layer']['kernel']) * 2.0 / float(before['hier']),
                             rtol=1e-5)
  small = _grads(1e-4)  # under its limits: untouched
  out, _ = optim.clip_by_group_global_norm({'backbone': 100.0, 'hier': 2.0}).update(small, None)
  jax.tree.map(np.testing.assert_array_equal, out, small)


def _updates(head_scale, **optim_fields):
  cfg = get_base_config().optim
  cfg.update(dict(lr=1e-2, warmup_steps=0, grad_clip=1.0, **optim_fields))
  tx = optim.make_optimizer(cfg, 10)
  g = _grads(head_scale)
  params = jax.tree.map(jnp.zeros_like, g)
  updates, _ = tx.update(g, tx.init(params), params)
  return updates


def _backbone_update(hier_grad_clip, head_scale):
  return np.asarray(_updates(head_scale, hier_grad_clip=hier_grad_clip)['blocks_0']['kernel'])


def test_hier_lr_scale_multiplies_the_hierarchy_group_update_only():
  base = _updates(1.0, hier_grad_clip=1.0)
  scaled = _updates(1.0, hier_grad_clip=1.0, hier_lr_scale=3.0)
  for name in ('blocks_0', 'level_embed'):  # the backbone group: bit-identical
    jax.tree.map(np.testing.assert_array_equal, scaled[name], base[name])
  for name in ('hier_layer', 'hier_blocks_0'):  # AdamW's first update is -lr·sign(g): exact ×3
    np.testing.assert_allclose(np.asarray(scaled[name]['kernel']),
                               3.0 * np.asarray(base[name]['kernel']), rtol=1e-6)
    np.testing.assert_allclose(np.abs(np.asarray(scaled[name]['kernel'])), 3e-2, rtol=1e-4)
  bad = get_base_config()
  bad.optim.hier_lr_scale = 0.0
  with pytest.raises(ValueError, match='optim.hier_lr_scale'):
    config_lib.resolve(bad)


def test_backbone_update_unchanged_by_a_huge_head_gradient():
  np.testing.assert_array_equal(_backbone_update(1.0, 1.0), _backbone_update(1.0, 1e6))
  # With the one global clip the head's gradient throttles the backbone (the problem).
  assert not np.allclose(_backbone_update(0.0, 1.0), _backbone_update(0.0, 1e6))
  bad = get_base_config()
  bad.optim.hier_grad_clip = -1.0
  with pytest.raises(ValueError, match='optim.hier_grad_clip'):
    config_lib.resolve(bad)


def test_train_steps_T_defaults_to_the_sampling_grid():
  c = get_base_config()
  assert c.loss.train_steps_T == 0
  assert config_lib.LossConfig.from_config(resolved(c)).train_steps_T == c.sample.num_steps == 128
  c.loss.train_steps_T = 1000
  assert config_lib.LossConfig.from_config(resolved(c)).train_steps_T == 1000
  assert config_lib.LossConfig.from_config(resolved(sudoku_config.get_config())).train_steps_T == 81
  c = get_base_config()
  c.loss.hier_objective = 'mse'
  with pytest.raises(ValueError, match='loss.hier_objective'):
    config_lib.resolve(c)
  c = get_base_config()
  c.model.pathway.time_conditioning = True  # t reaches the network: no pass-1 logit reuse
  assert config_lib.SampleConfig.from_config(resolved(c)).time_conditioning


def test_round_readout_is_stick_breaking():
  model, abstract = _model(hier_layers=1, hier_repeats=K - 1, hier_readout='rounds')
  assert 'hier_layer' not in abstract and 'hier_round_readout' in abstract
  params = _perturbed(models.init_params(model, jax.random.key(0), L), 11, 0.3)
  tokens, levels, t = _inputs(12)
  logp, state = jax.jit(lambda p: model.apply({'params': p}, tokens, levels, t, heads=('hier',),
                                               capture_intermediates=True,
                                               mutable=['intermediates']))(params)
  # The hazard logits s_r of the R = K-1 rounds, as the readout computed them.
  s = np.concatenate([np.asarray(v, np.float64) for v in
                      state['intermediates']['hier_round_readout']['__call__']], -1)
  assert s.shape == (B, L, K - 1)
  p = 1 / (1 + np.exp(-s))
  ref = np.empty((B, L, K))
  ref[..., 0] = np.prod(1 - p, -1)
  for r in range(1, K):  # round r -> level K - r
    ref[..., K - r] = p[..., r - 1] * np.prod(1 - p[..., :r - 1], -1)
  np.testing.assert_allclose(np.exp(np.asarray(logp['hier'], np.float64)), ref, rtol=1e-5,
                             atol=1e-7)
  with pytest.raises(ValueError, match='model.pathway.readout'):
    _model_cfg(hier_layers=1, hier_repeats=1, hier_readout='rounds')


@pytest.mark.parametrize('backbone', ['dit', 'gpt2'])
def test_hier_source_input_reads_the_embedded_input(backbone):
  """hier_source='input': the pathway reads the input before the trunk, so the level output
  ignores the backbone's blocks (it moves with them for 'features'); the parameter tree is the
  same. GPT-2 (learned positions, time added inside its trunk) as the DiT (rotary)."""
  over = dict(hier_layers=1, hier_repeats=2, hier_input_embed=True, num_layers=2,
              backbone=backbone)
  if backbone == 'gpt2':
    over.update(position_embedding='learned', time_conditioning=True)
  block = 'blocks' if backbone == 'dit' else 'h'
  model, abstract = _model(hier_source='input', **over)
  feats, feats_abstract = _model(**over)
  assert jax.tree.structure(abstract) == jax.tree.structure(feats_abstract)
  params = _perturbed(models.init_params(model, jax.random.key(0), L), 13, 0.3)
  moved = dict(params, **{f'{block}_1': _perturbed(params[f'{block}_1'], 14, 0.5)})
  tokens, levels, t = _inputs(15)
  for m, same in ((model, True), (feats, False)):
    a, b = _hier(m, params, tokens, levels, t), _hier(m, moved, tokens, levels, t)
    assert np.allclose(a, b, atol=1e-6) == same, m.pathway.source
  if backbone == 'dit':
    # ... and it is the 'features' model whose trunk is the identity (both blocks' gates at 0;
    # GPT-2's blocks are not the identity at init).
    identity = dict(params, **{f'blocks_{i}': models.init_params(
        model, jax.random.key(0), L)[f'blocks_{i}'] for i in range(2)})
    np.testing.assert_allclose(_hier(model, params, tokens, levels, t),
                               _hier(feats, identity, tokens, levels, t), rtol=1e-5, atol=1e-6)
  # Pass 1 alone does not run the trunk: its matmuls are the pathway's only (2 blocks: 2x fewer).
  hier_flops = lambda m: flops.jaxpr_matmul_flops(
      lambda p: m.apply({'params': p}, tokens, levels, t, heads=('hier',)), params)
  pathway = hier_flops(_model(hier_source='input', **dict(over, num_layers=1))[0])
  assert hier_flops(model) == pathway and hier_flops(feats) > pathway
  with pytest.raises(ValueError, match='model.pathway.source'):
    _model_cfg(hier_source='trunk')
