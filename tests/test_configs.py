"""Every shipped experiment passes the checks that preflight runs before anything is written.

A config that a task or process rejects is only found when a user runs it (issue 13's MultiMDM
Sudoku configs were refused by the Sudoku task's vocabulary check for a day); here every
configs/*.py file, with every option it accepts, goes through `config.resolve`, its task's
`validate`, `processes.build` and `train.validate_config` (no data, checkpoint or device touched).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pathlib

import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax import processes
from hmdlm_jax import tasks
from hmdlm_jax import train
from hmdlm_jax.data import clusters
from hmdlm_jax.data import tokenizers

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAMES = sorted(p.stem for p in (ROOT / 'configs').glob('*.py')
               if p.stem not in ('__init__', 'base'))


@dataclasses.dataclass
class _PublishedVocab:
  """What the row layout reads of a hub tokenizer (its published sizes and special ids): the hub
  tokenizers of the LM1B / OWT configs are not available offline."""
  size: int
  cls_token_id: int | None = None
  sep_token_id: int | None = None
  pad_token_id: int | None = None
  mask_token_id: int | None = None
  eos_token_id: int | None = None
  bos_token_id: int | None = None

  def __len__(self) -> int:
    return self.size


PUBLISHED = {'bert-base-uncased': _PublishedVocab(30522, cls_token_id=101, sep_token_id=102,
                                                  pad_token_id=0, mask_token_id=103),
             'gpt2': _PublishedVocab(50257, eos_token_id=50256, bos_token_id=50256)}


def _cases() -> list[tuple[str, str]]:
  out = []
  for name in NAMES:
    options = getattr(importlib.import_module(f'configs.{name}'), 'OPTIONS', ('',))
    out += [(name, opt) for opt in options]
  return out


@pytest.mark.parametrize('name,option', _cases())
def test_shipped_config_passes_validation(name, option, monkeypatch, tmp_path):
  real = tokenizers._load_hf  # pylint: disable=protected-access
  monkeypatch.setattr(tokenizers, '_load_hf',
                      lambda path, allow: PUBLISHED.get(path) or real(path, allow))
  module = importlib.import_module(f'configs.{name}')
  config = module.get_config(option) if option else module.get_config()
  # The data locations a user sets on the command line (the configs leave them empty).
  (tmp_path / 'train.txt').write_text('a line\n', encoding='utf-8')
  for field, value in (('train_path', str(tmp_path / 'train.txt')),
                       ('tfds_data_dir', str(tmp_path)), ('corpus_dir', str(tmp_path))):
    if field in config.data and not config.data[field]:
      config.data[field] = value
  h = config.process.hdlm
  if config.process.kind == 'hdlm' and not os.path.exists(h.clusters):  # a user-built artefact
    words = PUBLISHED[config.data.tokenizer].size
    h.clusters = str(tmp_path / 'clusters.npz')
    n = int(h.num_clusters)
    clusters.save(h.clusters, clusters.ClusterArtefact(
        token_to_cluster=clusters.fallback_clusters(words, n), centroids=np.zeros((n, 2)),
        source='test', metric='cosine'))
  config = config_lib.resolve(config)
  tasks.get(config).validate(config)
  processes.build(config)
  train.validate_config(config)


def test_sudoku_vocabulary_error_names_the_fields():
  from hmdlm_jax.configs import multimdm_sudoku  # pylint: disable=g-import-not-at-top
  config = multimdm_sudoku.get_config()
  config.model.vocab_size = 10  # M = 3 masks need 9 + 3 rows
  with pytest.raises(ValueError, match=r'model\.vocab_size=10 .*vocab_size=12 '):
    config = config_lib.resolve(config)
    tasks.get(config).validate(config)
