"""MDLM PyTorch DiT -> Flax conversion: our forward pass equals a PyTorch one on the same weights.

The reference below re-implements the equations of kuleshov-group/mdlm's `models/dit.py` in plain
PyTorch (attention written out instead of flash-attn), with the same module names, so its
`state_dict()` has MDLM's exact key names and shapes. Sizes are tiny and all weights random (the
adaLN and output layers too, which MDLM zero-initialises, so that every path is exercised).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import safetensors.torch
import torch
import torch.nn.functional as F

from hmdlm_jax.configs.base import get_base_config
from hmdlm_jax import convert_mdlm
from hmdlm_jax import models

V, H, NH, C, M, NB, L, B = 37, 32, 4, 16, 64, 2, 12, 3


# ----------------------------------------------------------------------------- torch reference


class _Norm(torch.nn.Module):

  def __init__(self, dim: int):
    super().__init__()
    self.weight = torch.nn.Parameter(torch.ones(dim))

  def forward(self, x: torch.Tensor) -> torch.Tensor:  # LayerNorm without bias, eps 1e-5
    return F.layer_norm(x, [x.shape[-1]]) * self.weight


class _Embedding(torch.nn.Module):

  def __init__(self, vocab: int, dim: int):
    super().__init__()
    self.embedding = torch.nn.Parameter(torch.randn(vocab, dim))


class _TimeEmbed(torch.nn.Module):

  def __init__(self, cond: int, freq_dim: int = 256):
    super().__init__()
    self.freq_dim = freq_dim
    self.mlp = torch.nn.Sequential(torch.nn.Linear(freq_dim, cond), torch.nn.SiLU(),
                                   torch.nn.Linear(cond, cond))

  def forward(self, t: torch.Tensor) -> torch.Tensor:
    half = self.freq_dim // 2
    freqs = torch.exp(-math.log(1e4) * torch.arange(half, dtype=t.dtype) / half)
    args = t[:, None] * freqs[None]
    return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class _Rotary(torch.nn.Module):

  def __init__(self, head_dim: int):
    super().__init__()
    self.register_buffer('inv_freq', 1.0 / 1e4**(torch.arange(0, head_dim, 2).float() / head_dim))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
  half = x.shape[-1] // 2
  rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # rotate-half
  return x * cos + rot * sin


class _Block(torch.nn.Module):

  def __init__(self):
    super().__init__()
    self.norm1 = _Norm(H)
    self.attn_qkv = torch.nn.Linear(H, 3 * H, bias=False)
    self.attn_out = torch.nn.Linear(H, H, bias=False)
    self.norm2 = _Norm(H)
    self.mlp = torch.nn.Sequential(torch.nn.Linear(H, M), torch.nn.GELU(approximate='tanh'),
                                   torch.nn.Linear(M, H))
    self.adaLN_modulation = torch.nn.Linear(C, 6 * H)

  def forward(self, x, cos, sin, c):
    sh1, sc1, g1, sh2, sc2, g2 = self.adaLN_modulation(c)[:, None].chunk(6, dim=2)
    y = self.norm1(x) * (1 + sc1) + sh1
    qkv = self.attn_qkv(y).view(x.shape[0], x.shape[1], 3, NH, H // NH)  # (three h d)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, nh, L, hd]
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(H // NH), dim=-1) @ v
    x = x + g1 * self.attn_out(att.transpose(1, 2).reshape(x.shape))
    return x + g2 * self.mlp(self.norm2(x) * (1 + sc2) + sh2)


class _Final(torch.nn.Module):

  def __init__(self):
    super().__init__()
    self.norm_final = _Norm(H)
    self.linear = torch.nn.Linear(H, V)
    self.adaLN_modulation = torch.nn.Linear(C, 2 * H)

  def forward(self, x, c):
    shift, scale = self.adaLN_modulation(c)[:, None].chunk(2, dim=2)
    return self.linear(self.norm_final(x) * (1 + scale) + shift)


class RefDIT(torch.nn.Module):
  """MDLM's DIT equations; forward(indices [B, L], sigma [B]) -> logits [B, L, V].

  With `logits_input` it is the ADLM authors' denoiser instead (models/denoiser.py there): the
  input is logits [B, L, V] through `vocab_embed = Sequential(Linear(V, H))`, the rest the same.
  """

  def __init__(self, num_blocks: int = NB, logits_input: bool = False):
    super().__init__()
    self.vocab_embed = (torch.nn.Sequential(torch.nn.Linear(V, H)) if logits_input
                        else _Embedding(V, H))
    self.sigma_map = _TimeEmbed(C)
    self.rotary_emb = _Rotary(H // NH)
    self.blocks = torch.nn.ModuleList([_Block() for _ in range(num_blocks)])
    self.output_layer = _Final()

  def forward(self, indices: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    if isinstance(self.vocab_embed, _Embedding):
      x = self.vocab_embed.embedding[indices]
    else:
      x = self.vocab_embed(indices)
    c = F.silu(self.sigma_map(sigma))
    pos = torch.arange(indices.shape[1], dtype=x.dtype)
    freqs = pos[:, None] * self.rotary_emb.inv_freq.to(x.dtype)[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    for block in self.blocks:
      x = block(x, cos, sin, c)
    return self.output_layer(x, c)


def randomize(ref: torch.nn.Module) -> torch.nn.Module:
  """Random everything (MDLM zero-inits adaLN / output), norms near 1; in float64."""
  with torch.no_grad():
    for name, p in ref.named_parameters():
      if name.endswith('norm1.weight') or name.endswith('norm2.weight') or 'norm_final' in name:
        p.copy_(1 + 0.1 * torch.randn_like(p))
      elif 'adaLN_modulation' in name:
        p.copy_(0.3 * torch.randn_like(p))
  return ref.double()


def make_reference(seed: int = 0) -> RefDIT:
  torch.manual_seed(seed)
  return randomize(RefDIT())


def model_config(num_levels: int, time_conditioning: bool) -> ml_collections.ConfigDict:
  m = get_base_config().model
  m.num_levels, m.vocab_size, m.seq_len = num_levels, V, L
  m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim, m.cond_dim = NB, H, NH, M, C
  m.dropout, m.time_conditioning = 0.0, time_conditioning
  return m


def fresh_params(cfg_model, seed: int = 0):
  """Random numpy params with the model's tree and shapes (eval_shape: no jitted init, fast)."""
  rng = np.random.default_rng(seed)
  abstract = models.abstract_params(models.build_model(cfg_model), L)
  return jax.tree_util.tree_map(lambda s: rng.normal(0, 0.1, s.shape).astype(s.dtype), abstract)


def inputs(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(seed)
  return rng.integers(0, V, (B, L)).astype(np.int32), rng.uniform(0.05, 1.0, B).astype(np.float32)


def flax_logits(cfg_model, params, tokens, t, levels=None) -> np.ndarray:
  model = models.build_model(cfg_model)
  levels = np.zeros_like(tokens) if levels is None else levels
  apply = jax.jit(lambda p, x, h, s: model.apply({'params': p}, x, h, s, heads=('token',),
                                                 train=False))  # eager would compile every op
  out = apply(params, jnp.asarray(tokens), jnp.asarray(levels), jnp.asarray(t))
  return np.asarray(out['token'])


def torch_logits(ref: RefDIT, tokens, sigma) -> np.ndarray:
  with torch.no_grad():
    return ref(torch.as_tensor(tokens, dtype=torch.long),
               torch.as_tensor(sigma, dtype=torch.float64)).numpy()


@pytest.fixture(scope='module')
def reference():
  return make_reference()


@pytest.fixture(scope='module')
def safetensors_file(reference, tmp_path_factory):
  path = tmp_path_factory.mktemp('mdlm') / 'model.safetensors'
  # The Hugging Face release stores the DIT under 'backbone.'.
  sd = {f'backbone.{k}': v.float().contiguous() for k, v in reference.state_dict().items()}
  safetensors.torch.save_file(sd, str(path))
  return path


def test_reference_has_mdlm_key_names(reference):
  keys = set(reference.state_dict())
  for k in ('vocab_embed.embedding', 'sigma_map.mlp.0.weight', 'sigma_map.mlp.2.bias',
            'rotary_emb.inv_freq', 'blocks.1.norm1.weight', 'blocks.1.attn_qkv.weight',
            'blocks.1.attn_out.weight', 'blocks.1.norm2.weight', 'blocks.1.mlp.0.weight',
            'blocks.1.mlp.2.bias', 'blocks.1.adaLN_modulation.weight',
            'output_layer.norm_final.weight', 'output_layer.linear.weight',
            'output_layer.adaLN_modulation.bias'):
    assert k in keys, k
  assert reference.state_dict()['blocks.0.attn_qkv.weight'].shape == (3 * H, H)
  assert not any('attn_qkv.bias' in k or 'norm1.bias' in k for k in keys)


@pytest.mark.parametrize('time_conditioning', [False, True])
def test_forward_matches_pytorch(reference, safetensors_file, time_conditioning):
  state = convert_mdlm.load_mdlm_state_dict(safetensors_file)
  params, dims = convert_mdlm.convert_state_dict(state)
  assert dims == {'vocab_size': V, 'hidden_size': H, 'cond_dim': C, 'mlp_dim': M,
                  'num_layers': NB, 'num_heads': NH}
  tokens, t = inputs()
  cfg = model_config(1, time_conditioning)
  # MDLM feeds σ = 0 without time conditioning; with it our model feeds t (dit.py docstring).
  sigma = t if time_conditioning else np.zeros_like(t)
  ours = flax_logits(cfg, params, tokens, t)
  theirs = torch_logits(reference, tokens, sigma)
  scale = np.abs(theirs).max()
  print(f'max |logit| {scale:.3f}, max |diff| {np.abs(ours - theirs).max():.2e}')
  assert scale > 1.0  # a non-trivial output
  np.testing.assert_allclose(ours, theirs, atol=2e-5 * scale, rtol=0)


def test_converted_tree_matches_model_tree(safetensors_file):
  params, _ = convert_mdlm.convert_state_dict(convert_mdlm.load_mdlm_state_dict(safetensors_file))
  abstract = models.abstract_params(models.build_model(model_config(1, False)), L)
  assert (jax.tree_util.tree_map(np.shape, params) ==
          jax.tree_util.tree_map(np.shape, abstract))


def test_hmdlm_init_keeps_fresh_level_parts(reference, safetensors_file, tmp_path):
  dst = tmp_path / 'mdlm.npz'
  convert_mdlm.main(['--src', str(safetensors_file), '--dst', str(dst)])
  cfg = model_config(2, False)
  fresh = fresh_params(cfg, 3)
  merged = convert_mdlm.init_from_mdlm(fresh, str(dst))
  for name in ('level_embed', 'hier_layer'):
    leaves = zip(jax.tree_util.tree_leaves(merged[name]), jax.tree_util.tree_leaves(fresh[name]))
    for a, b in leaves:
      np.testing.assert_array_equal(a, b)
  # With the level table zeroed the HMDLM token pass is MDLM's network exactly.
  merged['level_embed']['embedding'] = np.zeros_like(merged['level_embed']['embedding'])
  tokens, t = inputs(2)
  levels = np.random.default_rng(0).integers(0, 3, tokens.shape).astype(np.int32)
  ours = flax_logits(cfg, merged, tokens, t, levels)
  theirs = torch_logits(reference, tokens, np.zeros_like(t))
  np.testing.assert_allclose(ours, theirs, atol=2e-5 * np.abs(theirs).max(), rtol=0)
  # The on-the-fly path (safetensors given directly) gives the same tree.
  direct = convert_mdlm.init_from_mdlm(fresh, str(safetensors_file))
  for a, b in zip(jax.tree_util.tree_leaves(direct['blocks_1']),
                  jax.tree_util.tree_leaves(merged['blocks_1'])):
    np.testing.assert_array_equal(a, b)


def test_lightning_ckpt_with_ema(reference, tmp_path):
  sd = reference.state_dict()
  params = [p.detach().float() for p in reference.parameters()]
  shadow = [2.0 * p for p in params]  # distinguishable EMA weights
  ckpt = {'state_dict': {f'backbone.{k}': v.float() for k, v in sd.items()},
          'ema': {'decay': 0.9999, 'num_updates': 10, 'shadow_params': shadow}}
  path = tmp_path / 'last.ckpt'
  torch.save(ckpt, str(path))
  raw = convert_mdlm.load_mdlm_state_dict(path)
  ema = convert_mdlm.load_mdlm_state_dict(path, use_ema=True)
  k = 'backbone.blocks.1.mlp.0.weight'
  np.testing.assert_array_equal(raw[k], sd['blocks.1.mlp.0.weight'].float().numpy())
  np.testing.assert_array_equal(ema[k], 2.0 * sd['blocks.1.mlp.0.weight'].float().numpy())
  np.testing.assert_array_equal(ema['backbone.rotary_emb.inv_freq'],
                                sd['rotary_emb.inv_freq'].float().numpy())  # a buffer, no EMA


def test_errors(reference, tmp_path):
  state = {k: v.float().numpy() for k, v in reference.state_dict().items()}
  bad = dict(state)
  bad['blocks.0.attn_out.weight'] = np.zeros((H, H + 1), np.float32)
  with pytest.raises(ValueError, match=r'blocks.0.attn_out.weight has shape'):
    convert_mdlm.convert_state_dict(bad)
  extra = dict(state, **{'blocks.0.attn_qkv.bias': np.zeros(3 * H, np.float32)})
  with pytest.raises(ValueError, match='does not know'):
    convert_mdlm.convert_state_dict(extra)
  missing = {k: v for k, v in state.items() if k != 'output_layer.linear.bias'}
  with pytest.raises(ValueError, match='lacks output_layer.linear.bias'):
    convert_mdlm.convert_state_dict(missing)
  no_rot = {k: v for k, v in state.items() if 'inv_freq' not in k}
  with pytest.raises(ValueError, match='--num_heads'):
    convert_mdlm.convert_state_dict(no_rot)
  assert convert_mdlm.convert_state_dict(no_rot, num_heads=NH)[1]['num_heads'] == NH
  with pytest.raises(ValueError, match='implies 4'):
    convert_mdlm.convert_state_dict(state, num_heads=2)
  # A model whose vocabulary differs from the checkpoint's.
  params, _ = convert_mdlm.convert_state_dict(state)
  cfg = model_config(2, False)
  cfg.vocab_size = V + 1
  fresh = fresh_params(cfg)
  with pytest.raises(ValueError, match=r'checkpoint shape \(37,\) != model shape \(38,\)'):
    convert_mdlm.merge_pretrained(fresh, params)
  with pytest.raises(ValueError, match='does not exist'):
    convert_mdlm.load_mdlm_state_dict(tmp_path / 'nope.safetensors')


def test_wikihow_config_starts_from_converted_checkpoint(reference, safetensors_file, tmp_path):
  """configs/wikihow.py with init.mdlm_checkpoint: the trainer's initial state holds MDLM's weights."""
  from hmdlm_jax.configs import wikihow  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import sharding, tasks, train  # pylint: disable=g-import-not-at-top
  dst = tmp_path / 'mdlm.npz'
  convert_mdlm.main(['--src', str(safetensors_file), '--dst', str(dst)])
  config = wikihow.get_config('256,position')
  tiny = model_config(2, False)
  with config.unlocked():
    for k in ('num_levels', 'vocab_size', 'seq_len', 'num_layers', 'hidden_size', 'num_heads',
              'mlp_dim', 'cond_dim', 'dropout', 'time_conditioning'):
      config.model[k] = tiny[k]
    config.model.mask_id = -1
    config.model.dtype = 'float32'
    config.init.mdlm_checkpoint = str(dst)
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 1, 1
  mesh = sharding.make_mesh(config.mesh)
  state, _ = train.create_train_state(config, mesh, tasks.build_model(config))
  params = jax.device_get(state.params)
  # The fresh level table is zero-initialised, so the token pass is MDLM's network exactly,
  # whatever the levels.
  np.testing.assert_array_equal(params['level_embed']['embedding'], 0.0)
  tokens, t = inputs(4)
  levels = np.random.default_rng(1).integers(0, 3, tokens.shape).astype(np.int32)
  ours = flax_logits(tiny, params, tokens, t, levels)
  theirs = torch_logits(reference, tokens, np.zeros_like(t))
  np.testing.assert_allclose(ours, theirs, atol=2e-5 * np.abs(theirs).max(), rtol=0)
  for a, b in zip(jax.tree_util.tree_leaves(jax.device_get(state.ema_params)['blocks_0']),
                  jax.tree_util.tree_leaves(params['blocks_0'])):
    np.testing.assert_array_equal(a, b)
