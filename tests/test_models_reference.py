"""hmdlm_jax.models against references written independently of the code (docs/method.md §4):
exact parameter counts from hand-written closed forms, and numpy (float64) re-derivations of the
rotary embedding, the DDiT block, the DiT and GPT-2 forward passes and the Sudoku position
embedding. Split from tests/test_models.py; helpers in tests/model_helpers.py.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import models
from hmdlm_jax.models import layers
from hmdlm_jax.models.dit import DDiTBlock
from hmdlm_jax.tasks import sudoku_model
from tests.model_helpers import B, L, V, fwd, inputs, model_cfg, setup


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
  return model_cfg(num_levels=k, vocab_size=30522, mask_id=103, seq_len=128, num_layers=12,
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
    return model_cfg(num_levels=k, vocab_size=vocab, seq_len=81, num_layers=12, hidden_size=384,
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
    return model_cfg(**{**kw, **over})
  mdlm, hmdlm = (models.param_count_breakdown(cfg(k))['total'] for k in (1, 6))
  base, extra = _gpt2_total(31, 384, 1536, 3, 6, positions=81)
  assert (mdlm, hmdlm) == (base, base + extra)
  assert extra == 4_998  # "about 5K extra parameters" (paper App. F)
  assert abs(mdlm - 5.5e6) < 0.2e6  # the paper's "6M" model is 5.5M
  # Sudoku positions: 3 tables of 9 rows instead of 81 rows.
  grid = cfg(6, position_embedding='sudoku')
  sud = models.param_count_breakdown(grid, sudoku_model.model_features(grid))['total']
  assert sud == hmdlm - 81 * 384 + 27 * 384
  # Untied head adds V·H; time conditioning adds the embedder and the cond -> H projection.
  untied = models.param_count_breakdown(cfg(6, tie_embeddings=False))['total']
  assert untied == hmdlm + 31 * 384
  tc = models.param_count_breakdown(cfg(6, time_conditioning=True))['total']
  assert tc == hmdlm + (256 * 128 + 128 + 128 * 128 + 128) + (128 * 384 + 384)


def test_dit_time_conditioning_keeps_param_count():
  # MDLM builds sigma_map even with time conditioning off (it then feeds σ = 0).
  on = models.param_count_breakdown(model_cfg(time_conditioning=True))['total']
  off = models.param_count_breakdown(model_cfg(time_conditioning=False))['total']
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
  cfg, model, params = setup(time_conditioning=True, variant='single_pass')
  tokens, levels, t = inputs()
  token_levels = jnp.asarray(np.random.default_rng(5).integers(0, 4, (B, L)), jnp.int32)
  out = fwd(model, params, tokens, levels, t, token_levels=token_levels)
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
  cfg, model, params = setup(backbone='gpt2', position_embedding='learned', tie_embeddings=True)
  tokens, levels, t = inputs()
  out = fwd(model, params, tokens, levels, t)
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
  cfg, model, params = setup(seq_len=81, position_embedding='sudoku')
  pos = sudoku_model.SudokuPositionEmbedding(81, 16).apply({'params': params['position']}, 81)
  p = _np64(params['position'])
  for i in (0, 10, 40, 80, 33):
    r, c = divmod(i, 9)
    want = (p['row_embed']['embedding'][r] + p['col_embed']['embedding'][c]
            + p['box_embed']['embedding'][(r // 3) * 3 + c // 3])
    np.testing.assert_allclose(np.asarray(pos[i]), want, atol=1e-6)
  assert not np.allclose(np.asarray(pos[0]), np.asarray(pos[80]))  # share no row/col/box
  # The model adds it to the input: permuting two cells' tokens is not an output permutation.
  tokens, levels, t = inputs(length=81)
  out = fwd(model, params, tokens, levels, t, heads=('token',))['token']
  swapped = fwd(model, params, tokens[:, ::-1], levels[:, ::-1], t, heads=('token',))['token']
  assert float(np.abs(out[:, ::-1] - swapped).max()) > 1e-4
