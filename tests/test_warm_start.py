"""Warm starts (hmdlm_jax/warm_start.py): MDLM -> MultiMDM and MultiMDM -> distillation.

A real 2-step MDLM run of configs/tiny_test.py (K = 1) is the source; MultiMDM (M = 3) starts from
its workdir and from the same parameters written as a converted-checkpoint .npz. Checked: every
non-vocabulary leaf equals the source's EMA parameters, word rows of the embedding and of the
token head are the source's rows, every mask row is a copy of the source's MASK row, and the EMA
starts equal to the parameters. A MultiMDM workdir feeds its distillation run unchanged.
"""

from __future__ import annotations

import os

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest

from hmdlm_jax.configs import tiny_test
from hmdlm_jax import config as config_lib
from hmdlm_jax import convert_mdlm
from hmdlm_jax import main
from hmdlm_jax import preflight
from hmdlm_jax import sharding as shd
from hmdlm_jax import tasks
from hmdlm_jax import train
from hmdlm_jax import warm_start
from hmdlm_jax import workdir as workdir_lib
from tests.config_helpers import resolved

WORDS, MASK, M = 9, 9, 3  # Sudoku digits 0..8, MDLM's MASK = 9


def _mdlm_config(cache: str) -> ml_collections.ConfigDict:
  c = tiny_test.get_config()
  c.model.num_levels = 1
  c.schedule.offsets = (0.0,)
  c.data.cache_dir = cache
  c.train.num_steps = 2
  c.train.ckpt_every = 2
  c.train.log_every = 1
  return c


def _multimdm_config(cache: str, **init: str) -> ml_collections.ConfigDict:
  c = _mdlm_config(cache)
  c.process.kind = 'multimdm'
  c.process.multimdm.num_masks = M
  c.model.vocab_size = WORDS + M
  c.sample.ordering = 'ancestral'
  for k, v in init.items():
    c.init[k] = v
  return c


@pytest.fixture(scope='module')
def mdlm_run(tmp_path_factory: pytest.TempPathFactory) -> str:
  workdir = str(tmp_path_factory.mktemp('mdlm_run'))
  cache = str(tmp_path_factory.mktemp('puzzles'))
  main.run('train', _mdlm_config(cache), workdir)
  return workdir


def _state(config: ml_collections.ConfigDict | config_lib.Config):
  config = resolved(config)
  return train.create_train_state(config, shd.make_mesh(config.mesh),
                                  tasks.build_model(config))[0]


def _check_init(config: ml_collections.ConfigDict | config_lib.Config) -> None:
  config = resolved(config)
  preflight.check_init(config, tasks.build_model(config))


def _flat(tree):
  return convert_mdlm.flatten(jax.tree.map(np.asarray, tree))


def _check_mdlm_to_multimdm(src: dict, dst: dict) -> None:
  for k, v in dst.items():
    s = src[k]
    if k == 'vocab_embed/embedding':
      np.testing.assert_array_equal(v[:WORDS], s[:WORDS])
      np.testing.assert_array_equal(v[WORDS:], np.repeat(s[MASK:MASK + 1], M, axis=0))
    elif k.startswith('output_layer/linear/'):
      np.testing.assert_array_equal(v[..., :WORDS], s[..., :WORDS])
      np.testing.assert_array_equal(v[..., WORDS:], np.repeat(s[..., MASK:MASK + 1], M, axis=-1))
    else:
      np.testing.assert_array_equal(v, s, err_msg=k)


def test_multimdm_from_an_mdlm_workdir(mdlm_run, tmp_path):
  src, layout, step = warm_start.read_workdir(mdlm_run)
  assert step == 2 and layout == warm_start.Layout(10, (MASK,))
  state = _state(_multimdm_config(str(tmp_path), workdir=mdlm_run))
  dst = _flat(state.params)
  _check_mdlm_to_multimdm(_flat(src), dst)
  for k, v in _flat(state.ema_params).items():
    np.testing.assert_array_equal(v, dst[k])
  raw, _, _ = warm_start.read_workdir(mdlm_run, use_ema=False)
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(raw),
                                                       jax.tree.leaves(src)))


def test_multimdm_from_a_converted_mdlm_checkpoint(mdlm_run, tmp_path):
  src, _, _ = warm_start.read_workdir(mdlm_run)
  path = str(tmp_path / 'mdlm.npz')
  convert_mdlm.save_params(path, src)
  _check_init(_multimdm_config(str(tmp_path), mdlm_checkpoint=path))
  state = _state(_multimdm_config(str(tmp_path), mdlm_checkpoint=path))
  _check_mdlm_to_multimdm(_flat(src), _flat(state.params))


def test_one_mask_multimdm_loads_a_converted_checkpoint_as_mdlm(mdlm_run, tmp_path):
  # M = 1 is MDLM's own layout (words, then MASK): the file is loaded as for MDLM, every leaf as is.
  src, _, _ = warm_start.read_workdir(mdlm_run)
  path = str(tmp_path / 'mdlm.npz')
  convert_mdlm.save_params(path, src)
  cfg = _multimdm_config(str(tmp_path), mdlm_checkpoint=path)
  cfg.process.multimdm.num_masks = 1
  cfg.model.vocab_size = WORDS + 1
  assert not warm_start.maps_rows(config_lib.resolve(cfg))
  state = _state(cfg)
  for k, v in _flat(src).items():
    np.testing.assert_array_equal(_flat(state.params)[k], v, err_msg=k)
    np.testing.assert_array_equal(_flat(state.ema_params)[k], v, err_msg=k)


@pytest.mark.slow  # CI time (2026-12-01): nightly
def test_distillation_from_a_multimdm_workdir(mdlm_run, tmp_path):
  # A MultiMDM run directory (its state written as Checkpointer writes it), then distillation.
  source_cfg = config_lib.resolve(_multimdm_config(str(tmp_path), workdir=mdlm_run))
  source = _state(source_cfg)
  source = source.replace(ema_params=jax.tree.map(lambda x: x + 1.0, source.ema_params))
  run = tmp_path / 'multimdm_run'
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(str(run / 'checkpoints' / '7' / 'state'), source)
  workdir_lib.start_run(source_cfg, str(run), 'train', workdir=str(run), step=0,
                        write_config=True)
  cfg = _multimdm_config(str(tmp_path), workdir=str(run))
  cfg.process.multimdm.distill = True
  state = _state(cfg)
  for k, v in _flat(source.ema_params).items():
    np.testing.assert_array_equal(_flat(state.params)[k], v)
    np.testing.assert_array_equal(_flat(state.ema_params)[k], v)


def test_bad_warm_starts_are_reported(mdlm_run, tmp_path):
  with pytest.raises(ValueError, match='config.json'):
    config_lib.resolve(_multimdm_config(str(tmp_path), workdir=str(tmp_path)))
  with pytest.raises(ValueError, match='both set'):
    config_lib.resolve(_multimdm_config(str(tmp_path), workdir=mdlm_run,
                                        mdlm_checkpoint=__file__))
  _check_init(_multimdm_config(str(tmp_path), workdir=mdlm_run))
  wide = _multimdm_config(str(tmp_path), workdir=mdlm_run)
  wide.model.hidden_size = 64
  # preflight says so from the shapes alone (Orbax metadata), before anything is initialised
  with pytest.raises(ValueError, match=r"init.workdir=.*shape"):
    _check_init(wide)
  with pytest.raises(ValueError, match='shape'):
    _state(wide)
  assert os.path.isdir(os.path.join(mdlm_run, 'checkpoints', '2'))
