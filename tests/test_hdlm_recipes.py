"""The HDLM authors' recipes as configs (configs/hdlm_lm1b.py, configs/hdlm_owt.py and options):
the settings are the authors' (their released configs, docs/method.md §13.1), and each config,
shrunk to a tiny model and vocabulary with everything else kept, trains a few steps through
`train.make_train_step` with a finite, changing loss. An HDLM starts from an MDLM checkpoint
(`init.mdlm_checkpoint`): words and MASK take its rows, each cluster row the mean of its words'."""

from __future__ import annotations

import importlib

import jax
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax import convert_mdlm
from hmdlm_jax import preflight
from hmdlm_jax import processes
from hmdlm_jax import sharding
from hmdlm_jax import tasks
from hmdlm_jax import train

CASES = [('hdlm_lm1b', ''), ('hdlm_lm1b', 'mdlm'), ('hdlm_owt', ''), ('hdlm_owt', 'xi0.9'),
         ('hdlm_owt', 'n128'), ('hdlm_owt', 'base'), ('hdlm_owt', 'mdlm')]

# (lr, warm-up, decay, betas, eps, weight decay, EMA, clip range, steps) of the authors' configs.
AUTHORS = {'hdlm_lm1b': (3e-4, 2500, 'constant', (0.9, 0.99), 1e-9, 0.02, 0.0, (0.0, 10.0),
                         1_000_000),
           'hdlm_owt': (5e-4, 10_000, 'cosine', (0.9, 0.99), 1e-9, 0.02, 0.0, (0.0, 2.0),
                        500_000)}


def _config(name: str, option: str):
  return importlib.import_module(f'hmdlm_jax.configs.{name}').get_config(option)


@pytest.mark.parametrize('name,option', CASES, ids=[f'{n}:{o}' for n, o in CASES])
def test_recipe_settings_are_the_authors(name, option):
  c = _config(name, option)
  o, h, m = c.optim, c.process.hdlm, c.model
  lr, warm, decay, betas, eps, wd, ema, clip, steps = AUTHORS[name]
  assert (o.lr, o.warmup_steps, o.decay, (o.b1, o.b2), o.eps, o.weight_decay, o.ema_decay) == (
      lr, warm, decay, betas, eps, wd, ema)
  assert m.time_conditioning and c.sample.num_steps == 512 and c.sample.temperature == 1.0
  assert (h.sampler, h.final_step, h.gamma) == ('first_order', 'argmax', 1.0)
  if option == 'mdlm':
    assert h.num_clusters == 1 and not h.clip_weights
  else:
    assert h.clip_weights and (h.weight_min, h.weight_max) == clip
    assert c.train.num_steps == steps
  assert h.num_clusters == {'n128': 128, 'base': 128, 'mdlm': 1}.get(option, 64)
  if option == 'xi0.9':
    assert (h.xi, h.xi_loss, h.force) == (0.9, 'approx', 'within')
  if option == 'base':
    assert (m.num_layers, m.hidden_size, m.num_heads) == (24, 1024, 16)
  if name == 'hdlm_owt':
    assert c.data.packing == 'truncate' and (m.dropout, m.seq_len) == (0.0, 512)
  else:
    assert (m.dropout, m.seq_len, m.mask_id) == (0.1, 128, 103)


def _tiny(name: str, option: str, words: int = 40, **init: str):
  """The config with a tiny DiT, `words` word ids and at most 4 'id' clusters (rest unchanged)."""
  c = _config(name, option)
  for k, v in init.items():
    c.init[k] = v
  h, m, d = c.process.hdlm, c.model, c.data
  n = min(int(h.num_clusters), 4)
  h.num_clusters, h.clusters, h.fallback = n, '', 'id'
  m.vocab_size = words + 1 + (0 if n == 1 else n)
  m.mask_id = words
  m.seq_len = d.seq_len = 8
  m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim, m.cond_dim = 1, 32, 2, 64, 16
  m.dtype = 'float32'
  d.batch_size = 4
  c.train.num_steps = 3
  c.optim.warmup_steps = 1
  c.mesh.data = 1
  return config_lib.resolve(c)


# ':n128' and ':base' differ from '' only in sizes that `_tiny` replaces: not trained again.
TRAIN_CASES = [case for case in CASES if case[1] not in ('n128', 'base')]


@pytest.mark.parametrize('name,option', TRAIN_CASES, ids=[f'{n}:{o}' for n, o in TRAIN_CASES])
def test_recipe_trains_a_few_steps(name, option):
  c = _tiny(name, option)
  model = tasks.get(c).build_model(c)
  mesh = sharding.make_mesh(c.mesh)
  state, sh = train.create_train_state(c, mesh, model)
  step = train.make_train_step(c, model, processes.build(c), mesh, sh)
  rng = np.random.default_rng(0)
  losses = []
  initial = [np.asarray(x).copy() for x in jax.tree.leaves(state.params)]
  with sharding.mesh_context(mesh):
    for _ in range(3):
      tokens = rng.integers(0, 40, (4, 8)).astype(np.int32)
      batch = dict(tokens=tokens, levels=np.zeros_like(tokens), given=np.zeros((4, 8), bool),
                   loss_mask=np.ones((4, 8), bool))
      state, metrics = step(state, jax.device_put(batch, sharding.batch_sharding(mesh)))
      losses.append(float(metrics['loss']))
      assert bool(metrics['update_ok'])
  final = [np.asarray(x) for x in jax.tree.leaves(state.params)]
  assert any(not np.allclose(a, b) for a, b in zip(initial, final))
  assert np.all(np.isfinite(losses)) and len(set(losses)) == 3, losses


def test_hdlm_starts_from_an_mdlm_checkpoint(tmp_path):
  src_cfg = _tiny('hdlm_owt', 'mdlm')  # MDLM: 40 words + MASK (id 40)
  src_model = tasks.get(src_cfg).build_model(src_cfg)
  src, _ = train.create_train_state(src_cfg, sharding.make_mesh(src_cfg.mesh), src_model)
  path = str(tmp_path / 'mdlm.npz')
  src_flat = convert_mdlm.flatten(jax.tree.map(np.asarray, src.ema_params))
  convert_mdlm.save_params(path, convert_mdlm.unflatten(src_flat))
  c = _tiny('hdlm_owt', '', mdlm_checkpoint=path)  # HDLM: 40 words, MASK 40, clusters 41..44
  model = tasks.get(c).build_model(c)
  preflight.check_init(c, model)
  state, _ = train.create_train_state(c, sharding.make_mesh(c.mesh), model)
  lay = processes.build(c).layout
  for k, v in convert_mdlm.flatten(jax.tree.map(np.asarray, state.params)).items():
    s = src_flat[k]
    if k == 'vocab_embed/embedding':
      np.testing.assert_array_equal(v[:41], s[:41])
      for cl in range(4):
        np.testing.assert_allclose(v[41 + cl], s[:40][lay.cluster_of[:40] == cl].mean(0),
                                   rtol=1e-6, atol=1e-7)
    elif v.shape != s.shape:  # the token head: its word and MASK columns are the source's
      np.testing.assert_array_equal(v[..., :41], s[..., :41], err_msg=k)
    else:
      np.testing.assert_array_equal(v, s, err_msg=k)
