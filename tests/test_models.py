"""Tests for hmdlm_jax.models (docs/method.md §4): gradient flow through both passes, the heads
contract, precision, config errors and the recorded parameter trees
(tests/fixtures/model_param_trees.json). Exact parameter counts and the numpy re-derivations of
the forward passes are in tests/test_models_reference.py; shared helpers in tests/model_helpers.py.

adaLN-zero: every DiT block's modulation Linear and both heads' output Linears start at zero, so at
initialisation the logits are exactly 0 and the gradient of every block-internal weight is exactly
0 (the zero gates cut the path). Tests that need informative outputs or gradients therefore
use a perturbed init (`random_params`); `test_grads_zero_at_adaln_zero_init_then_flow_after_sgd`
checks both the zero-gradient fact at the real init and that two SGD steps from it open every path.
"""

from __future__ import annotations

import json
import math
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax.configs.base import get_base_config
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax import sharding as shd
from hmdlm_jax.models import hierarchy
from hmdlm_jax.models import features
from hmdlm_jax.models import layers
from hmdlm_jax.tasks import sudoku_model
from tests.model_helpers import B, L, V, build, fwd, inputs, model_cfg, setup

# ----------------------------------------------------------------------------- gradients / passes


def _two_pass_loss(apply_fn, tokens, levels, ht, hs, t):
  """Pass 1 (hier head on (x_t, h_t)) + pass 2 (token head on (x_t, h_s)): CE on gold labels."""
  hier = apply_fn(tokens, ht, t, heads=('hier',))['hier']
  tok = apply_fn(tokens, hs, t, heads=('token',))['token']
  l1 = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(hier), levels[..., None], -1))
  l2 = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(tok), tokens[..., None], -1))
  return l1, l2


@pytest.mark.parametrize('backbone', ['dit', 'gpt2'])
def test_gradients_reach_both_heads_and_every_block(backbone):
  cfg, model, params = setup(backbone=backbone, num_layers=2, tie_embeddings=backbone == 'gpt2')
  tokens, _, t = inputs()
  levels = jnp.asarray(np.random.default_rng(2).integers(0, 3, (B, L)), jnp.int32)
  ht = jnp.full_like(levels, 3)  # all h_m
  hs = jnp.where(jnp.arange(L) % 2 == 0, levels, 3)

  def losses(p):
    return _two_pass_loss(models.make_apply_fn(model, p, train=False), tokens, levels, ht, hs, t)

  # jacrev of (pass-1 loss, pass-2 loss): one vmapped backward pass, one compile.
  g1, g2 = jax.device_get(jax.jit(jax.jacrev(losses))(params))
  g = jax.tree_util.tree_map(np.add, g1, g2)  # gradient of the summed two-pass loss
  norm = lambda tree: float(sum(np.sum(x ** 2) for x in jax.tree_util.tree_leaves(tree)))
  hier_name, tok_name = ('hier_layer', 'output_layer') if backbone == 'dit' else (
      'hier_head', 'wte')
  blocks = [n for n in params if n.startswith(('blocks_', 'h_'))]
  assert len(blocks) == 2
  # One parameter tree: both passes differentiate into the same shared blocks.
  for name in blocks:
    assert norm(g1[name]) > 0 and norm(g2[name]) > 0
  assert norm(g1[hier_name]) > 0 and norm(g2[hier_name]) == 0  # hier head only via pass 1
  assert norm(g2[tok_name]) > 0
  if backbone == 'dit':
    assert norm(g1['output_layer']) == 0  # token head only via pass 2
  for path, leaf in jax.tree_util.tree_leaves_with_path(g):
    assert float(np.sum(leaf ** 2)) > 0, jax.tree_util.keystr(path)


def test_residual_grad_boundary_is_the_identity_bit_for_bit():
  # No subnormal cotangent: XLA:CPU flushes them to zero in every arithmetic op (FTZ). The forward
  # does no arithmetic, so x keeps one.
  x = jnp.asarray([0.0, -0.0, 1.5, -2.25e30, 3e-42, np.inf, -np.inf, np.nan], jnp.float32)
  g = jnp.asarray([-0.0, 0.0, 7.0, 1e38, -1.2e-38, np.inf, -np.inf, np.nan], jnp.float32)
  y, vjp = jax.vjp(layers.residual_grad_boundary, x)
  (gx,) = vjp(g)
  # Bits, so that -0.0 and NaN payloads count too.
  np.testing.assert_array_equal(np.asarray(y).view(np.uint32), np.asarray(x).view(np.uint32))
  np.testing.assert_array_equal(np.asarray(gx).view(np.uint32), np.asarray(g).view(np.uint32))


def _max_fusion_operands(backbone, num_layers):
  """The most operands of any fusion in the compiled backward of a `num_layers` model."""
  _, model, params = setup(backbone=backbone, num_layers=num_layers)
  tokens, levels, t = inputs()

  def loss(p):
    out = models.make_apply_fn(model, p, train=False)(tokens, levels, t, heads=('token',))
    return jnp.sum(out['token'] ** 2)

  text = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
  entry = text[text.rfind('ENTRY'):]
  return max(m.group(1).count('%') for m in re.finditer(r'= \S+ fusion\((.*?)\), kind', entry))


@pytest.mark.parametrize('backbone', ['dit', 'gpt2'])
def test_backward_fusions_do_not_grow_with_depth(backbone):
  # Without layers.residual_grad_boundary XLA:CPU fuses the residual gradient of every block above
  # into each block's weight-gradient copy: 53 / 94 / 177 operands at 2 / 4 / 8 DiT layers (a
  # quadratic backward, ~1.4x the step at the LM1B shape); with it the largest fusion stays put.
  shallow, deep = _max_fusion_operands(backbone, 2), _max_fusion_operands(backbone, 6)
  assert deep <= shallow + 4, (shallow, deep)


@pytest.mark.parametrize('backbone', ['dit', 'gpt2'])
def test_hier_stop_gradient_trains_the_hierarchy_head_only(backbone):
  """model.hier_stop_gradient: same outputs; pass 1's gradient reaches the hierarchy head (and,
  for GPT-2, the final LayerNorm it shares with the token head) and nothing else."""
  tied = backbone == 'gpt2'
  _, model, params = setup(backbone=backbone, num_layers=2, tie_embeddings=tied)
  _, detached, _ = setup(backbone=backbone, num_layers=2, tie_embeddings=tied,
                          hier_stop_gradient=True)
  tokens, levels, t = inputs()
  for heads in (('hier',), ('token',)):
    a = fwd(model, params, tokens, levels, t, heads=heads)
    b = fwd(detached, params, tokens, levels, t, heads=heads)
    np.testing.assert_array_equal(a[heads[0]], b[heads[0]])
  gold = jnp.asarray(np.random.default_rng(2).integers(0, 3, (B, L)), jnp.int32)

  def pass1(p):
    hier = models.make_apply_fn(detached, p, train=False)(tokens, levels, t, heads=('hier',))
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(hier['hier']), gold[..., None], -1))

  g = jax.device_get(jax.jit(jax.grad(pass1))(params))
  head = {'hier_layer'} if backbone == 'dit' else {'hier_head', 'ln_f'}
  for path, leaf in jax.tree_util.tree_leaves_with_path(g):
    name = jax.tree_util.keystr(path[:1])[2:-2]
    assert (float(np.sum(leaf ** 2)) > 0) == (name in head), jax.tree_util.keystr(path)


def test_grads_zero_at_adaln_zero_init_then_flow_after_sgd():
  cfg = model_cfg(num_layers=2)
  model = models.build_model(cfg)
  params = models.init_params(model, jax.random.key(0), L)
  leaves = jax.tree_util.tree_leaves(params)
  assert all(isinstance(x, jax.Array) and x.dtype == jnp.float32 for x in leaves)  # unboxed
  tokens, _, t = inputs()
  gold = jnp.asarray(np.random.default_rng(2).integers(0, 3, (B, L)), jnp.int32)
  ht = jnp.full_like(gold, 3)

  @jax.jit
  def sgd(p):
    loss = lambda q: sum(_two_pass_loss(models.make_apply_fn(model, q, train=False), tokens,
                                        gold, ht, gold, t))
    value, g = jax.value_and_grad(loss)(p)
    return value, g, jax.tree_util.tree_map(lambda a, d: a - 0.5 * d, p, g)

  value, g, params = sgd(params)
  g = jax.device_get(g)
  # Zero-init heads: all logits 0, so each CE is log(#classes) exactly.
  np.testing.assert_allclose(float(value), math.log(3) + math.log(V), rtol=1e-6)
  assert float(np.abs(g['blocks_0']['attn_qkv']['kernel']).max()) == 0  # gate = 0 cuts it
  assert float(np.abs(g['output_layer']['linear']['kernel']).max()) > 0
  for _ in range(2):
    value, g, params = sgd(params)
  g = jax.device_get(g)
  for path, leaf in jax.tree_util.tree_leaves_with_path(g):
    assert float(np.abs(leaf).max()) > 0, jax.tree_util.keystr(path)


@pytest.mark.parametrize('backbone', ['dit', 'gpt2'])
def test_head_selection_does_not_change_outputs(backbone):
  cfg, model, params = setup(backbone=backbone)
  tokens, levels, t = inputs()
  both = fwd(model, params, tokens, levels, t)
  only_tok = fwd(model, params, tokens, levels, t, heads=('token',))
  only_hier = fwd(model, params, tokens, levels, t, heads=('hier',))
  assert set(only_tok) == {'token'} and set(only_hier) == {'hier'}
  np.testing.assert_allclose(only_tok['token'], both['token'], atol=1e-6)
  np.testing.assert_allclose(only_hier['hier'], both['hier'], atol=1e-6)
  assert both['hier'].shape == (B, L, 3) and both['token'].shape == (B, L, V)
  assert both['token'].dtype == both['hier'].dtype == jnp.float32
  f = models.make_apply_fn(model, params, train=False)
  with pytest.raises(ValueError, match='heads'):
    f(tokens, levels, t, heads=('logits',))
  with pytest.raises(ValueError, match='heads'):
    f(tokens, levels, t, heads=())


@pytest.mark.parametrize('backbone', ['dit', 'gpt2'])
def test_time_conditioning_on_off(backbone):
  tokens, levels, t = inputs()
  t2 = jnp.asarray([0.9, 0.1], jnp.float32)
  for tc in (False, True):
    cfg, model, params = setup(backbone=backbone, time_conditioning=tc)
    a = fwd(model, params, tokens, levels, t)
    b = fwd(model, params, tokens, levels, t2)
    diff = max(float(np.abs(a[h] - b[h]).max()) for h in a)
    if tc:
      assert diff > 1e-4
    else:
      assert diff == 0.0


@pytest.mark.parametrize('backbone', ['dit', 'gpt2'])
def test_single_pass_token_levels(backbone):
  cfg, model, params = setup(backbone=backbone, variant='single_pass')
  tokens, levels, t = inputs()
  tl = jnp.zeros((B, L), jnp.int32)
  tl2 = tl.at[1, 5].set(2)
  a = fwd(model, params, tokens, levels, t, token_levels=tl)
  b = fwd(model, params, tokens, levels, t, token_levels=tl2)
  np.testing.assert_array_equal(a['hier'], b['hier'])  # hierarchy head does not see it
  changed = np.asarray(np.abs(a['token'] - b['token']).max(-1) > 1e-6)
  want = np.zeros((B, L), bool)
  want[1, 5] = True
  np.testing.assert_array_equal(changed, want)  # only the position whose level changed
  f = models.make_apply_fn(model, params, train=False)
  with pytest.raises(ValueError, match='token_levels'):
    f(tokens, levels, t, heads=('token',))
  _, m2, p2 = setup(backbone=backbone, variant='two_pass')
  with pytest.raises(ValueError, match='token_levels'):
    models.make_apply_fn(m2, p2, train=False)(tokens, levels, t, heads=('token',),
                                               token_levels=tl)


def test_levels_input_and_k1():
  cfg, model, params = setup()
  tokens, levels, t = inputs()
  a = fwd(model, params, tokens, levels, t, heads=('token',))['token']
  b = fwd(model, params, tokens, (levels + 1) % 4, t, heads=('token',))['token']
  assert float(np.abs(a - b).max()) > 1e-4
  # K = 1 (MDLM): no level table, no hierarchy head; levels are ignored; 'hier' is log g = 0.
  cfg1, model1, params1 = setup(num_levels=1)
  assert 'level_embed' not in params1 and 'hier_layer' not in params1
  a1 = fwd(model1, params1, tokens, levels * 0, t)
  b1 = fwd(model1, params1, tokens, levels, t)
  np.testing.assert_array_equal(a1['token'], b1['token'])
  np.testing.assert_array_equal(a1['hier'], np.zeros((B, L, 1)))


def test_no_subs_in_model_and_bad_ids_are_loud():
  # SUBS (MASK logit -inf, revealed positions copy their token) belongs to parameterization.py.
  cfg, model, params = setup()
  mask_id = config_lib.ModelConfig.from_section(cfg).mask_id
  assert mask_id == V - 1
  tokens, levels, t = inputs()
  tokens = tokens.at[:, ::2].set(mask_id)
  tok = np.asarray(fwd(model, params, tokens, levels, t, heads=('token',))['token'])
  assert np.all(np.isfinite(tok))
  revealed = tok[:, 1::2]  # not a one-hot copy of the input token
  assert np.all(revealed.max(-1) - revealed.min(-1) < 50)
  assert np.abs(tok[..., mask_id]).max() > 0
  # Out-of-range ids give NaN rows (loud) instead of jnp's silent clamping.
  bad = fwd(model, params, tokens.at[0, 0].set(V), levels, t, heads=('token',))['token']
  assert bool(np.isnan(bad[0]).any()) and bool(np.isfinite(bad[1]).all())


# ----------------------------------------------------------------------------- dropout / precision


def test_dropout_rng_and_pass_salts():
  cfg, model, params = setup(dropout=0.3)
  tokens, levels, t = inputs()
  key = jax.random.key(7)
  run = lambda rng, heads, train=True: fwd(model, params, tokens, levels, t, heads=heads,
                                            train=train, rng=rng)['token']
  np.testing.assert_array_equal(run(key, ('token',)), run(key, ('token',)))
  assert float(np.abs(run(key, ('token',)) - run(jax.random.key(8), ('token',))).max()) > 1e-4
  # Different heads tuples fold different salts into the key: different dropout masks.
  assert models.heads_salt(('hier',)) != models.heads_salt(('token',))
  assert float(np.abs(run(key, ('token',)) - run(key, ('hier', 'token'))).max()) > 1e-4
  ev = run(None, ('token',), train=False)
  np.testing.assert_allclose(ev, run(None, ('hier', 'token'), train=False), atol=1e-6)
  assert float(np.abs(ev - run(key, ('token',))).max()) > 1e-4
  with pytest.raises(ValueError, match='rng'):
    models.make_apply_fn(model, params, train=True)


@pytest.mark.parametrize('backbone', ['dit', 'gpt2'])
def test_bf16_logits_close_to_float32(backbone):
  # bf16 keeps 8 mantissa bits (relative step 2^-8 ≈ 0.4%). Stated tolerance: max |Δlogit| below
  # 2% of max |logit| (observed 0.2–0.6% for 1–4 blocks of these tiny models), and not exactly 0
  # (so the bf16 path really ran in bf16).
  cfg, model, params = setup(backbone=backbone)
  model16 = models.build_model(model_cfg(backbone=backbone, dtype='bfloat16'))
  tokens, levels, t = inputs()
  a = fwd(model, params, tokens, levels, t)
  b = fwd(model16, params, tokens, levels, t)
  for h in a:
    assert b[h].dtype == jnp.float32
    scale = float(np.abs(a[h]).max())
    err = float(np.abs(a[h] - b[h]).max())
    assert 0 < err < 0.02 * scale, (h, err, scale)


# ----------------------------------------------------------------------------- sharding / config


def test_logical_specs_and_rules():
  cfg, model, params = setup(variant='single_pass')
  specs = models.logical_specs(model, L)
  allowed = {'vocab', 'embed', 'mlp', 'heads', 'kv', 'qkv', 'levels', 'cond', 'norm', None}
  flat_p = jax.tree_util.tree_leaves_with_path(params)
  flat_s = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(
      x, jax.sharding.PartitionSpec))
  assert len(flat_p) == len(flat_s)
  for (path, p), s in zip(flat_p, flat_s):
    assert len(s) == p.ndim and set(s) <= allowed, (jax.tree_util.keystr(path), s)
  qkv = specs['blocks_0']['attn_qkv']['kernel']
  P = jax.sharding.PartitionSpec
  assert nn.logical_to_mesh_axes(qkv, shd.LOGICAL_RULES) == P('fsdp', None, 'tensor', None)
  assert nn.logical_to_mesh_axes(specs['vocab_embed']['embedding'],
                                 shd.LOGICAL_RULES) == P('tensor', 'fsdp')
  # Activations: 'fsdp' is taken by 'batch', so 'embed' stays unsharded.
  assert nn.logical_to_mesh_axes(('batch', 'length', 'embed'),
                                 shd.LOGICAL_RULES) == P(('data', 'fsdp'), None, None)


_TREES = os.path.join(os.path.dirname(__file__), 'fixtures', 'model_param_trees.json')


def test_param_trees_unchanged():
  """Parameter paths, shapes and logical axes equal the trees recorded before the hierarchy parts
  moved to models/hierarchy.py: convert_mdlm.py and existing checkpoints address them by name."""
  with open(_TREES) as f:
    recorded = json.load(f)
  for name, want in recorded['trees'].items():
    cfg = config_lib.ModelConfig.from_section(dict(recorded['base'], **want['overrides']))
    model = build(cfg)
    flat = jax.tree_util.tree_flatten_with_path(models.abstract_params(model, cfg.seq_len))[0]
    specs = jax.tree.leaves(models.logical_specs(model, cfg.seq_len),
                            is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    got = [['/'.join(k.key for k in path), list(x.shape), list(s)]
           for (path, x), s in zip(flat, specs)]
    assert got == want['leaves'], name


def test_backbones_share_the_hierarchy_code_path():
  """The level tables, K = 1 shortcut, stop-gradient and head selection are written once
  (HierarchicalBackbone.__call__); a backbone only supplies its trunk and its two head forms."""
  for cls in models.BACKBONES.values():
    assert issubclass(cls, hierarchy.HierarchicalBackbone)
    assert {'__call__', 'trunk', 'make_heads'} & set(vars(cls)) == {'trunk', 'make_heads'}
  for backbone in models.BACKBONES:
    _, _, params = setup(backbone=backbone, variant='single_pass')
    assert params['level_embed']['embedding'].shape == (4, 16)
    assert params['token_level_embed']['embedding'].shape == (4, 16)


@pytest.mark.parametrize('field,value', [
    ('backbone', 'mamba'), ('num_levels', 0), ('hidden_size', 15), ('mask_id', V),
    ('mask_id', -2), ('variant', 'three_pass'), ('position_embedding', 'alibi'),
    ('dtype', 'float16'), ('dropout', 1.0), ('vocab_size', 1),
])
def test_bad_settings_name_the_field(field, value):
  with pytest.raises(ValueError, match=f'model.{field}'):
    models.build_model(model_cfg(**{field: value}))


def test_sudoku_positions_need_81():
  with pytest.raises(ValueError, match='model.seq_len'):
    models.build_model(model_cfg(position_embedding='sudoku', seq_len=80))
  with pytest.raises(ValueError, match='config.model'):
    models.build_model(get_base_config())


def test_sudoku_relation_bias():
  """'sudoku_rel': 8 relation classes per head, zero-init (== 'sudoku' at init), and the bias
  reaches the attention scores exactly as table[rel(i, j), h]."""
  rel = sudoku_model.sudoku_relations()
  for i, j in ((0, 1), (0, 9), (0, 10), (0, 80), (40, 40), (0, 20)):
    ri, ci, rj, cj = i // 9, i % 9, j // 9, j % 9
    want = (ri == rj) + 2 * (ci == cj) + 4 * ((ri // 3, ci // 3) == (rj // 3, cj // 3))
    assert rel[i, j] == want
  assert np.bincount(rel.ravel(), minlength=8).tolist() == [
      81 * 60, 81 * 6, 81 * 6, 0, 81 * 4, 81 * 2, 81 * 2, 81]
  cfg_r, model_r, params_r = setup(seq_len=81, position_embedding='sudoku_rel')
  cfg_s, model_s, _ = setup(seq_len=81, position_embedding='sudoku')
  extra = (models.count_params(params_r)
           - models.param_count_breakdown(cfg_s, sudoku_model.model_features(cfg_s))['total'])
  assert extra == cfg_r.num_layers * 8 * cfg_r.num_heads
  tokens, levels, t = inputs(length=81)
  # With a zero table (its init) the model is exactly the 'sudoku' one; a nonzero one changes it.
  zeroed = dict(params_r, blocks_0=dict(params_r['blocks_0'], relation={
      'relation_bias': jnp.zeros((8, cfg_r.num_heads), jnp.float32)}))
  plain = dict(params_r, blocks_0={k: v for k, v in params_r['blocks_0'].items()
                                   if k != 'relation'})
  out_r = fwd(model_r, zeroed, tokens, levels, t)['token']
  np.testing.assert_allclose(out_r, fwd(model_s, plain, tokens, levels, t)['token'], atol=1e-6)
  moved = dict(params_r, blocks_0=dict(params_r['blocks_0'], relation={
      'relation_bias': jnp.ones((8, cfg_r.num_heads), jnp.float32).at[0].set(-5.0)}))
  assert np.abs(fwd(model_r, moved, tokens, levels, t)['token'] - out_r).max() > 1e-4
  table = np.zeros((8, cfg_r.num_heads), np.float32)
  table[0, 0] = 3.0
  bias = features.RelationBias(cfg_r.num_heads, sudoku_model.RELATIONS).apply(
      {'params': {'relation_bias': table}}, 81)
  np.testing.assert_array_equal(np.asarray(bias)[0], np.where(rel == 0, 3.0, 0.0))
  np.testing.assert_array_equal(np.asarray(bias)[1], 0.0)
  with pytest.raises(ValueError, match="model.position_embedding='sudoku_rel'"):
    models.build_model(model_cfg(position_embedding='sudoku_rel', seq_len=81, backbone='gpt2'))


def test_config_lists_what_the_models_implement():
  """config.py validates model fields without importing the models: the registries must agree."""
  assert set(config_lib.BACKBONES) == set(models.BACKBONES)
  assert set(config_lib.COMPUTE_DTYPES) == set(layers.COMPUTE_DTYPES)
  assert config_lib.SUDOKU_CELLS == sudoku_model.SUDOKU_LEN


def test_task_positions_need_the_task():
  """A model section asking for a task's positions builds only with that task's features
  (tasks.build_model); the generic build names the field and what to do."""
  cfg = model_cfg(position_embedding='sudoku', seq_len=81)
  with pytest.raises(ValueError, match="model.position_embedding='sudoku' is a task's"):
    models.build_model(cfg)
  assert 'position' in models.abstract_params(build(cfg), 81)
  with pytest.raises(ValueError, match="relation attention bias needs model.backbone='dit'"):
    models.build_model(model_cfg(backbone='gpt2', position_embedding='learned'),
                       features.ModelFeatures(relations=sudoku_model.RELATIONS))


def test_models_and_processes_name_no_task():
  """The generic model and processes hold no task's name: a task's features reach them through
  models/features.py (tasks/sudoku_model.py supplies Sudoku's)."""
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'hmdlm_jax')
  for sub in ('models', 'processes'):
    for name in sorted(os.listdir(os.path.join(root, sub))):
      path = os.path.join(root, sub, name)
      assert 'sudoku' not in name.lower(), path
      if name.endswith('.py'):
        with open(path, encoding='utf-8') as f:
          assert 'sudoku' not in f.read().lower(), path
