"""Tests for hmdlm_jax.models (docs/method.md §4): exact parameter counts, numpy re-derivations of
the forward passes, gradient flow through both passes, the heads contract, precision, config errors
and the recorded parameter trees (tests/fixtures/model_param_trees.json).

adaLN-zero: every DiT block's modulation Linear and both heads' output Linears start at zero, so at
initialisation the logits are exactly 0 and the gradient of every block-internal weight is exactly
0 (the zero gates cut the path). Tests that need informative outputs or gradients therefore
use a perturbed init: every parameter gets N(0, 0.1²) noise (`_random_params`);
`test_grads_zero_at_adaln_zero_init_then_flow_after_sgd` checks both the zero-gradient fact at the
real init and that two SGD steps from it open every path.

Speed (2 shared CPU cores): parameters come from jax.eval_shape plus numpy draws, and every forward
is jitted once per (model, heads) and cached, so the file compiles a few dozen small programs.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.base import get_base_config
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax import sharding as shd
from hmdlm_jax.models import hierarchy
from hmdlm_jax.models import layers
from hmdlm_jax.models import sudoku_positions
from hmdlm_jax.models.dit import DDiTBlock

B, L, V = 2, 8, 11


def _cfg(**over):
  """A tiny model config section (configs/base.py schema)."""
  c = get_base_config().model
  c.update(dict(num_levels=3, vocab_size=V, seq_len=L, num_layers=1, hidden_size=16, num_heads=2,
                mlp_dim=32, cond_dim=8, dropout=0.1))
  c.update(over)
  return c


def _random_params(model, seq_len, seed, scale=0.1):
  """Parameters of the real shapes (eval_shape, nothing compiled) with random values: the init
  (adaLN-zero) plus N(0, scale²) noise, i.e. LayerNorm weights 1 + noise, everything else noise.
  numpy draws keep the 2-core test machine from compiling one random kernel per shape."""
  r = np.random.default_rng(seed)
  abstract = models.abstract_params(model, seq_len)

  def draw(path, x):
    base = 1.0 if jax.tree_util.keystr(path).endswith("['weight']") else 0.0
    return jnp.asarray(base + scale * r.normal(size=x.shape), jnp.float32)

  return jax.tree_util.tree_map_with_path(draw, abstract)


@functools.lru_cache(maxsize=None)
def _setup_cached(items):
  over = dict(items)
  seed = over.pop('_seed')
  cfg = _cfg(**over)
  model = models.build_model(cfg)
  return cfg, model, _random_params(model, cfg.seq_len, seed)


def _setup(seed=0, **over):
  return _setup_cached(tuple(sorted(over.items())) + (('_seed', seed),))


@functools.lru_cache(maxsize=None)
def _jitted_apply(model, heads, train):
  def f(params, tokens, levels, t, token_levels, rng):
    return models.make_apply_fn(model, params, train=train, rng=rng)(
        tokens, levels, t, heads=heads, token_levels=token_levels)
  return jax.jit(f)


def _fwd(model, params, tokens, levels, t, heads=('hier', 'token'), token_levels=None,
         train=False, rng=None):
  """The apply_fn of make_apply_fn, jitted once per (model, heads, train); numpy outputs (eager
  jnp ops on the results would compile one kernel per shape)."""
  out = _jitted_apply(model, tuple(heads), train)(params, tokens, levels, t, token_levels, rng)
  return jax.device_get(out)


def _inputs(seed=0, k=3, length=L):
  r = np.random.default_rng(seed)
  tokens = jnp.asarray(r.integers(0, V, (B, length)), jnp.int32)
  levels = jnp.asarray(r.integers(0, k + 1, (B, length)), jnp.int32)
  t = jnp.asarray(r.uniform(0.05, 1.0, (B,)), jnp.float32)
  return tokens, levels, t


# ----------------------------------------------------------------------------- parameter counts
# Hand-written closed forms (not read off the code). H width, C cond width, M MLP width.


def _dit_block(h, c, m):
  return 2 * h + 3 * h * h + h * h + (h * m + m + m * h + h) + (6 * h * c + 6 * h)


def _adaln_head(h, c, out):
  return h + (2 * h * c + 2 * h) + (h * out + out)


def _dit_total(v, h, c, m, n, k):
  time_embed = 256 * c + c + c * c + c
  base = v * h + time_embed + n * _dit_block(h, c, m) + _adaln_head(h, c, v)
  extra = (k + 1) * h + _adaln_head(h, c, k) if k > 1 else 0
  return base, extra


def _gpt2_total(v, h, m, n, k, positions):
  block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * m + m + m * h + h)
  base = v * h + positions * h + n * block + 2 * h
  extra = (k + 1) * h + (h * k + k) if k > 1 else 0
  return base, extra


def _lm1b_cfg(k):
  # MDLM LM1B: bert-base-uncased, whose own [MASK] (id 103) is the mask token: V = 30522.
  return _cfg(num_levels=k, vocab_size=30522, mask_id=103, seq_len=128, num_layers=12,
              hidden_size=768, num_heads=12, mlp_dim=3072, cond_dim=128)


def test_mdlm_lm1b_param_count_exact():
  counts = models.param_count_breakdown(_lm1b_cfg(1))
  assert _dit_total(30522, 768, 128, 3072, 12, 1) == (139_292_986, 0)
  assert counts['total'] == 139_292_986
  assert counts['hmdlm extras'] == 0
  assert counts['token head'] == 768 + 2 * 768 * 128 + 2 * 768 + 768 * 30522 + 30522
  assert '139,292,986' in models.param_count_report(_lm1b_cfg(1))


def test_hmdlm_k2_adds_level_table_and_hier_head():
  c1 = models.param_count_breakdown(_lm1b_cfg(1))
  c2 = models.param_count_breakdown(_lm1b_cfg(2))
  closed_form = 3 * 768 + (768 + 2 * 768 * 128 + 2 * 768) + (768 * 2 + 2)
  assert closed_form == 202_754  # ≈ 0.2M (paper section 5.1)
  assert c2['total'] - c1['total'] == closed_form
  assert c2['level table'] == 3 * 768
  assert c2['mdlm backbone'] == c1['total']


@pytest.mark.parametrize('vocab', [10, 11])
def test_sudoku_25m_pair(vocab):
  def cfg(k):
    return _cfg(num_levels=k, vocab_size=vocab, seq_len=81, num_layers=12, hidden_size=384,
                num_heads=6, mlp_dim=1536, cond_dim=128)
  mdlm, hmdlm = (models.param_count_breakdown(cfg(k))['total'] for k in (1, 6))
  base, extra = _dit_total(vocab, 384, 128, 1536, 12, 6)
  assert (mdlm, hmdlm) == (base, base + extra)
  assert extra == 104_454  # ≈104K (paper App. F)
  assert abs(mdlm - 24.99e6) < 0.01e6 and abs(hmdlm - 25.10e6) < 0.01e6


def test_gpt2_6m_count():
  def cfg(k, **over):
    kw = dict(backbone='gpt2', num_levels=k, vocab_size=31, seq_len=81, num_layers=3,
              hidden_size=384, num_heads=12, mlp_dim=1536, cond_dim=128,
              position_embedding='learned', tie_embeddings=True)
    return _cfg(**{**kw, **over})
  mdlm, hmdlm = (models.param_count_breakdown(cfg(k))['total'] for k in (1, 6))
  base, extra = _gpt2_total(31, 384, 1536, 3, 6, positions=81)
  assert (mdlm, hmdlm) == (base, base + extra)
  assert extra == 4_998  # "about 5K extra parameters" (paper App. F)
  assert abs(mdlm - 5.5e6) < 0.2e6  # the paper's "6M" model is 5.5M
  # Sudoku positions: 3 tables of 9 rows instead of 81 rows.
  sud = models.param_count_breakdown(cfg(6, position_embedding='sudoku'))['total']
  assert sud == hmdlm - 81 * 384 + 27 * 384
  # Untied head adds V·H; time conditioning adds the embedder and the cond -> H projection.
  untied = models.param_count_breakdown(cfg(6, tie_embeddings=False))['total']
  assert untied == hmdlm + 31 * 384
  tc = models.param_count_breakdown(cfg(6, time_conditioning=True))['total']
  assert tc == hmdlm + (256 * 128 + 128 + 128 * 128 + 128) + (128 * 384 + 384)


def test_dit_time_conditioning_keeps_param_count():
  # MDLM builds sigma_map even with time conditioning off (it then feeds σ = 0).
  on = models.param_count_breakdown(_cfg(time_conditioning=True))['total']
  off = models.param_count_breakdown(_cfg(time_conditioning=False))['total']
  base, extra = _dit_total(V, 16, 8, 32, 1, 3)
  assert on == off == base + extra


# ----------------------------------------------------------------------------- numpy references


def _np_ln(x, w, b=None):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  y = (x - mu) / np.sqrt(var + 1e-5) * w
  return y if b is None else y + b


def _np_gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _np_silu(x):
  return x / (1 + np.exp(-x))


def _np_rotary(x, base=1e4):
  """x [B, L, nh, d]: rotate the pairs (i, i + d/2) by angle l · base^(-2i/d)."""
  d = x.shape[-1]
  out = np.empty_like(x)
  for l in range(x.shape[1]):
    for i in range(d // 2):
      th = l * base ** (-2 * i / d)
      a, b = x[:, l, :, i], x[:, l, :, i + d // 2]
      out[:, l, :, i] = a * np.cos(th) - b * np.sin(th)
      out[:, l, :, i + d // 2] = b * np.cos(th) + a * np.sin(th)
  return out


def _np_attention(q, k, v):
  s = np.einsum('bqhd,bkhd->bhqk', q, k) / math.sqrt(q.shape[-1])
  s = np.exp(s - s.max(-1, keepdims=True))
  p = s / s.sum(-1, keepdims=True)
  return np.einsum('bhqk,bkhd->bqhd', p, v)


def _np64(tree):
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)


def _np_ddit_block(p, x, c, rotary=True):
  mod = c @ p['adaLN_modulation']['kernel'] + p['adaLN_modulation']['bias']
  sh1, sc1, g1, sh2, sc2, g2 = np.split(mod, 6, axis=-1)
  y = _np_ln(x, p['norm1']['weight']) * (1 + sc1[:, None]) + sh1[:, None]
  qkv = np.einsum('blh,htnd->bltnd', y, p['attn_qkv']['kernel'])
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  if rotary:
    q, k = _np_rotary(q), _np_rotary(k)
  o = np.einsum('blnd,ndh->blh', _np_attention(q, k, v), p['attn_out']['kernel'])
  x = x + g1[:, None] * o
  y = _np_ln(x, p['norm2']['weight']) * (1 + sc2[:, None]) + sh2[:, None]
  y = _np_gelu_tanh(y @ p['mlp_0']['kernel'] + p['mlp_0']['bias'])
  y = y @ p['mlp_2']['kernel'] + p['mlp_2']['bias']
  return x + g2[:, None] * y


def _np_final(p, x, c):
  mod = c @ p['adaLN_modulation']['kernel'] + p['adaLN_modulation']['bias']
  shift, scale = np.split(mod, 2, axis=-1)
  z = _np_ln(x, p['norm_final']['weight']) * (1 + scale[:, None]) + shift[:, None]
  return z @ p['linear']['kernel'] + p['linear']['bias']


def _np_time(p, t):
  half = 128
  freqs = np.exp(-math.log(1e4) * np.arange(half) / half)
  args = t[:, None] * freqs[None]
  e = np.concatenate([np.cos(args), np.sin(args)], -1)
  h = _np_silu(e @ p['mlp_0']['kernel'] + p['mlp_0']['bias'])
  return _np_silu(h @ p['mlp_2']['kernel'] + p['mlp_2']['bias'])  # outer SiLU of DIT.forward


def test_rotary_matches_numpy_rotate_half():
  x = np.random.default_rng(0).normal(size=(2, 7, 3, 8)).astype(np.float32)
  cos, sin = layers.rotary_cos_sin(7, 8)
  got = np.asarray(layers.apply_rotary(jnp.asarray(x), cos, sin))
  np.testing.assert_allclose(got, _np_rotary(x.astype(np.float64)), atol=1e-5)
  # Relative-position property: <R_m q, R_n k> depends on n - m only.
  q, k = x[:1, :1, :1], x[1:, :1, :1]
  tiled = lambda a: np.broadcast_to(a, (1, 7, 1, 8))
  rq = np.asarray(layers.apply_rotary(jnp.asarray(tiled(q)), cos, sin))[0, :, 0]
  rk = np.asarray(layers.apply_rotary(jnp.asarray(tiled(k)), cos, sin))[0, :, 0]
  np.testing.assert_allclose(rq[1] @ rk[3], rq[4] @ rk[6], rtol=1e-5)
  assert abs(rq[1] @ rk[3] - rq[1] @ rk[4]) > 1e-3


def test_ddit_block_matches_numpy():
  h, c_dim = 16, 8
  block = DDiTBlock(num_heads=2, mlp_dim=32, dropout=0.1)
  r = np.random.default_rng(1)
  x = r.normal(size=(2, 6, h)).astype(np.float32)
  c = r.normal(size=(2, c_dim)).astype(np.float32)
  rope = layers.rotary_cos_sin(6, h // 2)
  abstract = jax.eval_shape(lambda: block.init(jax.random.key(0), x, c, rope))['params']
  params = jax.tree_util.tree_map(
      lambda a: jnp.asarray(0.3 * r.normal(size=a.shape), jnp.float32), nn.meta.unbox(abstract))
  got = jax.jit(lambda p: block.apply({'params': p}, x, c, rope, train=False))(params)
  want = _np_ddit_block(_np64(params), x.astype(np.float64), c.astype(np.float64))
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


def test_dit_forward_matches_numpy_single_pass():
  cfg, model, params = _setup(time_conditioning=True, variant='single_pass')
  tokens, levels, t = _inputs()
  token_levels = jnp.asarray(np.random.default_rng(5).integers(0, 4, (B, L)), jnp.int32)
  out = _fwd(model, params, tokens, levels, t, token_levels=token_levels)
  p = _np64(params)
  x = p['vocab_embed']['embedding'][np.asarray(tokens)] + p['level_embed']['embedding'][
      np.asarray(levels)]
  c = _np_time(p['sigma_map'], np.asarray(t, np.float64))
  x = _np_ddit_block(p['blocks_0'], x, c)
  hier = _np_final(p['hier_layer'], x, c)
  tok = _np_final(p['output_layer'], x + p['token_level_embed']['embedding'][
      np.asarray(token_levels)], c)
  np.testing.assert_allclose(np.asarray(out['hier']), hier, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(out['token']), tok, atol=1e-5, rtol=1e-5)


def test_gpt2_forward_matches_numpy():
  cfg, model, params = _setup(backbone='gpt2', position_embedding='learned', tie_embeddings=True)
  tokens, levels, t = _inputs()
  out = _fwd(model, params, tokens, levels, t)
  p = _np64(params)
  wte = p['wte']['embedding']
  x = wte[np.asarray(tokens)] + p['level_embed']['embedding'][np.asarray(levels)]
  x = x + p['position']['pos_embed']['embedding'][None, :L]
  b = p['h_0']
  y = _np_ln(x, b['ln_1']['weight'], b['ln_1']['bias'])
  qkv = np.einsum('blh,htnd->bltnd', y, b['attn_qkv']['kernel']) + b['attn_qkv']['bias']
  o = _np_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
  x = x + np.einsum('blnd,ndh->blh', o, b['attn_out']['kernel']) + b['attn_out']['bias']
  y = _np_ln(x, b['ln_2']['weight'], b['ln_2']['bias'])
  y = _np_gelu_tanh(y @ b['mlp_0']['kernel'] + b['mlp_0']['bias'])
  x = x + y @ b['mlp_2']['kernel'] + b['mlp_2']['bias']
  z = _np_ln(x, p['ln_f']['weight'], p['ln_f']['bias'])
  np.testing.assert_allclose(np.asarray(out['token']), z @ wte.T, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(out['hier']),
                             z @ p['hier_head']['kernel'] + p['hier_head']['bias'],
                             atol=1e-5, rtol=1e-5)


def test_sudoku_position_embedding_row_col_box():
  cfg, model, params = _setup(seq_len=81, position_embedding='sudoku')
  pos = sudoku_positions.SudokuPositionEmbedding(81, 16).apply({'params': params['position']}, 81)
  p = _np64(params['position'])
  for i in (0, 10, 40, 80, 33):
    r, c = divmod(i, 9)
    want = (p['row_embed']['embedding'][r] + p['col_embed']['embedding'][c]
            + p['box_embed']['embedding'][(r // 3) * 3 + c // 3])
    np.testing.assert_allclose(np.asarray(pos[i]), want, atol=1e-6)
  assert not np.allclose(np.asarray(pos[0]), np.asarray(pos[80]))  # share no row/col/box
  # The model adds it to the input: permuting two cells' tokens is not an output permutation.
  tokens, levels, t = _inputs(length=81)
  out = _fwd(model, params, tokens, levels, t, heads=('token',))['token']
  swapped = _fwd(model, params, tokens[:, ::-1], levels[:, ::-1], t, heads=('token',))['token']
  assert float(np.abs(out[:, ::-1] - swapped).max()) > 1e-4


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
  cfg, model, params = _setup(backbone=backbone, num_layers=2, tie_embeddings=backbone == 'gpt2')
  tokens, _, t = _inputs()
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
  _, model, params = _setup(backbone=backbone, num_layers=num_layers)
  tokens, levels, t = _inputs()

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
  _, model, params = _setup(backbone=backbone, num_layers=2, tie_embeddings=tied)
  _, detached, _ = _setup(backbone=backbone, num_layers=2, tie_embeddings=tied,
                          hier_stop_gradient=True)
  tokens, levels, t = _inputs()
  for heads in (('hier',), ('token',)):
    a = _fwd(model, params, tokens, levels, t, heads=heads)
    b = _fwd(detached, params, tokens, levels, t, heads=heads)
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
  cfg = _cfg(num_layers=2)
  model = models.build_model(cfg)
  params = models.init_params(model, jax.random.key(0), L)
  leaves = jax.tree_util.tree_leaves(params)
  assert all(isinstance(x, jax.Array) and x.dtype == jnp.float32 for x in leaves)  # unboxed
  tokens, _, t = _inputs()
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
  cfg, model, params = _setup(backbone=backbone)
  tokens, levels, t = _inputs()
  both = _fwd(model, params, tokens, levels, t)
  only_tok = _fwd(model, params, tokens, levels, t, heads=('token',))
  only_hier = _fwd(model, params, tokens, levels, t, heads=('hier',))
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
  tokens, levels, t = _inputs()
  t2 = jnp.asarray([0.9, 0.1], jnp.float32)
  for tc in (False, True):
    cfg, model, params = _setup(backbone=backbone, time_conditioning=tc)
    a = _fwd(model, params, tokens, levels, t)
    b = _fwd(model, params, tokens, levels, t2)
    diff = max(float(np.abs(a[h] - b[h]).max()) for h in a)
    if tc:
      assert diff > 1e-4
    else:
      assert diff == 0.0


@pytest.mark.parametrize('backbone', ['dit', 'gpt2'])
def test_single_pass_token_levels(backbone):
  cfg, model, params = _setup(backbone=backbone, variant='single_pass')
  tokens, levels, t = _inputs()
  tl = jnp.zeros((B, L), jnp.int32)
  tl2 = tl.at[1, 5].set(2)
  a = _fwd(model, params, tokens, levels, t, token_levels=tl)
  b = _fwd(model, params, tokens, levels, t, token_levels=tl2)
  np.testing.assert_array_equal(a['hier'], b['hier'])  # hierarchy head does not see it
  changed = np.asarray(np.abs(a['token'] - b['token']).max(-1) > 1e-6)
  want = np.zeros((B, L), bool)
  want[1, 5] = True
  np.testing.assert_array_equal(changed, want)  # only the position whose level changed
  f = models.make_apply_fn(model, params, train=False)
  with pytest.raises(ValueError, match='token_levels'):
    f(tokens, levels, t, heads=('token',))
  _, m2, p2 = _setup(backbone=backbone, variant='two_pass')
  with pytest.raises(ValueError, match='token_levels'):
    models.make_apply_fn(m2, p2, train=False)(tokens, levels, t, heads=('token',),
                                               token_levels=tl)


def test_levels_input_and_k1():
  cfg, model, params = _setup()
  tokens, levels, t = _inputs()
  a = _fwd(model, params, tokens, levels, t, heads=('token',))['token']
  b = _fwd(model, params, tokens, (levels + 1) % 4, t, heads=('token',))['token']
  assert float(np.abs(a - b).max()) > 1e-4
  # K = 1 (MDLM): no level table, no hierarchy head; levels are ignored; 'hier' is log g = 0.
  cfg1, model1, params1 = _setup(num_levels=1)
  assert 'level_embed' not in params1 and 'hier_layer' not in params1
  a1 = _fwd(model1, params1, tokens, levels * 0, t)
  b1 = _fwd(model1, params1, tokens, levels, t)
  np.testing.assert_array_equal(a1['token'], b1['token'])
  np.testing.assert_array_equal(a1['hier'], np.zeros((B, L, 1)))


def test_no_subs_in_model_and_bad_ids_are_loud():
  # SUBS (MASK logit -inf, revealed positions copy their token) belongs to parameterization.py.
  cfg, model, params = _setup()
  mask_id = config_lib.ModelConfig.from_section(cfg).mask_id
  assert mask_id == V - 1
  tokens, levels, t = _inputs()
  tokens = tokens.at[:, ::2].set(mask_id)
  tok = np.asarray(_fwd(model, params, tokens, levels, t, heads=('token',))['token'])
  assert np.all(np.isfinite(tok))
  revealed = tok[:, 1::2]  # not a one-hot copy of the input token
  assert np.all(revealed.max(-1) - revealed.min(-1) < 50)
  assert np.abs(tok[..., mask_id]).max() > 0
  # Out-of-range ids give NaN rows (loud) instead of jnp's silent clamping.
  bad = _fwd(model, params, tokens.at[0, 0].set(V), levels, t, heads=('token',))['token']
  assert bool(np.isnan(bad[0]).any()) and bool(np.isfinite(bad[1]).all())


# ----------------------------------------------------------------------------- dropout / precision


def test_dropout_rng_and_pass_salts():
  cfg, model, params = _setup(dropout=0.3)
  tokens, levels, t = _inputs()
  key = jax.random.key(7)
  run = lambda rng, heads, train=True: _fwd(model, params, tokens, levels, t, heads=heads,
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
  cfg, model, params = _setup(backbone=backbone)
  model16 = models.build_model(_cfg(backbone=backbone, dtype='bfloat16'))
  tokens, levels, t = _inputs()
  a = _fwd(model, params, tokens, levels, t)
  b = _fwd(model16, params, tokens, levels, t)
  for h in a:
    assert b[h].dtype == jnp.float32
    scale = float(np.abs(a[h]).max())
    err = float(np.abs(a[h] - b[h]).max())
    assert 0 < err < 0.02 * scale, (h, err, scale)


# ----------------------------------------------------------------------------- sharding / config


def test_logical_specs_and_rules():
  cfg, model, params = _setup(variant='single_pass')
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
    model = models.build_model(cfg)
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
    _, _, params = _setup(backbone=backbone, variant='single_pass')
    assert params['level_embed']['embedding'].shape == (4, 16)
    assert params['token_level_embed']['embedding'].shape == (4, 16)


@pytest.mark.parametrize('field,value', [
    ('backbone', 'mamba'), ('num_levels', 0), ('hidden_size', 15), ('mask_id', V),
    ('mask_id', -2), ('variant', 'three_pass'), ('position_embedding', 'alibi'),
    ('dtype', 'float16'), ('dropout', 1.0), ('vocab_size', 1),
])
def test_bad_settings_name_the_field(field, value):
  with pytest.raises(ValueError, match=f'model.{field}'):
    models.build_model(_cfg(**{field: value}))


def test_sudoku_positions_need_81():
  with pytest.raises(ValueError, match='model.seq_len'):
    models.build_model(_cfg(position_embedding='sudoku', seq_len=80))
  with pytest.raises(ValueError, match='config.model'):
    models.build_model(get_base_config())


def test_sudoku_relation_bias():
  """'sudoku_rel': 8 relation classes per head, zero-init (== 'sudoku' at init), and the bias
  reaches the attention scores exactly as table[rel(i, j), h]."""
  rel = sudoku_positions.sudoku_relations()
  for i, j in ((0, 1), (0, 9), (0, 10), (0, 80), (40, 40), (0, 20)):
    ri, ci, rj, cj = i // 9, i % 9, j // 9, j % 9
    want = (ri == rj) + 2 * (ci == cj) + 4 * ((ri // 3, ci // 3) == (rj // 3, cj // 3))
    assert rel[i, j] == want
  assert np.bincount(rel.ravel(), minlength=8).tolist() == [
      81 * 60, 81 * 6, 81 * 6, 0, 81 * 4, 81 * 2, 81 * 2, 81]
  cfg_r, model_r, params_r = _setup(seq_len=81, position_embedding='sudoku_rel')
  cfg_s, model_s, _ = _setup(seq_len=81, position_embedding='sudoku')
  extra = models.count_params(params_r) - models.param_count_breakdown(cfg_s)['total']
  assert extra == cfg_r.num_layers * 8 * cfg_r.num_heads
  tokens, levels, t = _inputs(length=81)
  # With a zero table (its init) the model is exactly the 'sudoku' one; a nonzero one changes it.
  zeroed = dict(params_r, blocks_0=dict(params_r['blocks_0'], relation={
      'relation_bias': jnp.zeros((8, cfg_r.num_heads), jnp.float32)}))
  plain = dict(params_r, blocks_0={k: v for k, v in params_r['blocks_0'].items()
                                   if k != 'relation'})
  out_r = _fwd(model_r, zeroed, tokens, levels, t)['token']
  np.testing.assert_allclose(out_r, _fwd(model_s, plain, tokens, levels, t)['token'], atol=1e-6)
  moved = dict(params_r, blocks_0=dict(params_r['blocks_0'], relation={
      'relation_bias': jnp.ones((8, cfg_r.num_heads), jnp.float32).at[0].set(-5.0)}))
  assert np.abs(_fwd(model_r, moved, tokens, levels, t)['token'] - out_r).max() > 1e-4
  table = np.zeros((8, cfg_r.num_heads), np.float32)
  table[0, 0] = 3.0
  bias = sudoku_positions.SudokuRelationBias(cfg_r.num_heads).apply(
      {'params': {'relation_bias': table}})
  np.testing.assert_array_equal(np.asarray(bias)[0], np.where(rel == 0, 3.0, 0.0))
  np.testing.assert_array_equal(np.asarray(bias)[1], 0.0)
  with pytest.raises(ValueError, match="model.position_embedding='sudoku_rel'"):
    models.build_model(_cfg(position_embedding='sudoku_rel', seq_len=81, backbone='gpt2'))


def test_config_lists_what_the_models_implement():
  """config.py validates model fields without importing the models: the registries must agree."""
  assert set(config_lib.BACKBONES) == set(models.BACKBONES)
  assert set(config_lib.COMPUTE_DTYPES) == set(layers.COMPUTE_DTYPES)
  assert config_lib.SUDOKU_CELLS == sudoku_positions.SUDOKU_LEN
