"""The HDLM authors' released cluster files (`semantic_cluster_dict_*.pt`, a torch.save integer
tensor) are read without torch: a small file written in that format (zip with data.pkl and the raw
storage, as torch.save writes it) gives the same token -> cluster map through `clusters.load` and
the process layout; files holding anything but a plain tensor are refused (docs/method.md §13.1).
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import sys
import types
import zipfile

import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax.configs.base import get_base_config
from hmdlm_jax.data import clusters
from hmdlm_jax.data import torch_tensor
from hmdlm_jax.processes import hdlm
from tests.config_helpers import resolved


def _fake_torch(monkeypatch) -> tuple[type, object]:
  """Stand-ins for torch.LongStorage and torch._utils._rebuild_tensor_v2 (pickled by name)."""
  torch, utils = types.ModuleType('torch'), types.ModuleType('torch._utils')
  storage_type = type('LongStorage', (), {'__module__': 'torch'})

  def rebuild(*args):
    return args

  rebuild.__module__, rebuild.__qualname__ = 'torch._utils', '_rebuild_tensor_v2'
  torch.LongStorage, utils._rebuild_tensor_v2, torch._utils = storage_type, rebuild, utils
  monkeypatch.setitem(sys.modules, 'torch', torch)
  monkeypatch.setitem(sys.modules, 'torch._utils', utils)
  return storage_type, rebuild


def write_torch_tensor(path: str, values: np.ndarray, monkeypatch, payload=None) -> None:
  """A 1-D int64 tensor in torch.save's zip layout: <stem>/data.pkl, <stem>/data/0."""
  storage_type, rebuild = _fake_torch(monkeypatch)
  values = np.asarray(values, '<i8')

  class Storage:
    pass

  class Tensor:
    def __reduce__(self):
      return rebuild, (Storage(), 0, (values.size,), (1,), False, collections.OrderedDict())

  class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
      if isinstance(obj, Storage):
        return ('storage', storage_type, '0', 'cpu', values.size)
      return None

  buf = io.BytesIO()
  Pickler(buf, protocol=2).dump(Tensor() if payload is None else payload)
  stem = os.path.splitext(os.path.basename(path))[0]
  with zipfile.ZipFile(path, 'w') as z:
    z.writestr(f'{stem}/data.pkl', buf.getvalue())
    z.writestr(f'{stem}/byteorder', 'little')
    z.writestr(f'{stem}/data/0', values.tobytes())
    z.writestr(f'{stem}/version', '3\n')


@pytest.mark.parametrize('offset', [0, 11], ids=['ids-from-0', 'ids-after-vocab'])
def test_authors_cluster_file_is_read(tmp_path, monkeypatch, offset):
  # The authors' layout: 10 token ids (their last one PAD), 3 clusters, ids 0..2 or V..V+2.
  mapping = np.array([2, 0, 1, 1, 0, 2, 2, 0, 1, 0])
  path = str(tmp_path / 'semantic_cluster_dict_toy_3.pt')
  write_torch_tensor(path, mapping + offset, monkeypatch)
  art = clusters.load(path)
  np.testing.assert_array_equal(art.token_to_cluster, mapping)
  assert art.num_clusters == 3 and art.sizes.tolist() == [4, 3, 3]
  c = get_base_config()
  c.process.kind = 'hdlm'
  c.model.num_levels = 1
  c.process.hdlm.num_clusters = 3
  c.process.hdlm.clusters = path
  c.model.vocab_size, c.model.mask_id = 10 + 1 + 3, -1  # words, MASK appended, 3 clusters
  lay = hdlm.layout_from_config(config_lib.hdlm_config(resolved(c)))
  np.testing.assert_array_equal(lay.cluster_of[:10], mapping)
  assert lay.mask_id == 10 and np.all(lay.cluster_of[10:] == -1)


def test_files_that_are_not_a_plain_tensor_are_refused(tmp_path, monkeypatch):
  path = str(tmp_path / 'evil.pt')
  write_torch_tensor(path, np.arange(3), monkeypatch, payload=os.getcwd)  # a global to call
  with pytest.raises(ValueError, match='unsupported object'):
    clusters.load(path)
  bad = tmp_path / 'not_zip.pt'
  bad.write_bytes(b'not a zip file')
  with pytest.raises(ValueError, match='not a readable torch.save tensor'):
    clusters.load(str(bad))
  gaps = str(tmp_path / 'gaps.pt')
  write_torch_tensor(gaps, np.array([0, 2, 2]), monkeypatch)
  with pytest.raises(ValueError, match='not contiguous'):
    clusters.load(gaps)
  assert torch_tensor.load((tmp_path / 'gaps.pt').read_bytes()).tolist() == [0, 2, 2]
