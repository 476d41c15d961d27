"""Reads one tensor saved by `torch.save` (the zip format) without torch, into numpy.

The HDLM authors release their clusters as such files: `semantic_cluster_dict_*.pt` holds an
integer tensor [N] with the cluster of token id 0..N-1 (ids 0..n-1, or offset by their vocabulary
size), `semantic_centroids_*.pt` a float tensor [n, D] (docs/method.md §13.1). The pickle inside
is read with an unpickler that knows only the tensor-rebuild function and the storage types, so
nothing else in the file can run.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from typing import Any

import numpy as np

_DTYPES = {'LongStorage': np.int64, 'IntStorage': np.int32, 'ShortStorage': np.int16,
           'CharStorage': np.int8, 'ByteStorage': np.uint8, 'BoolStorage': np.bool_,
           'FloatStorage': np.float32, 'DoubleStorage': np.float64, 'HalfStorage': np.float16}


class _StorageType:
  def __init__(self, name: str) -> None:
    self.name = name


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple[int, ...],
                    stride: tuple[int, ...], *_: Any) -> np.ndarray:
  """torch._utils._rebuild_tensor_v2: a strided view of the flat storage, copied."""
  item = storage.itemsize
  view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                         strides=tuple(s * item for s in stride))
  return np.array(view)


class _Unpickler(pickle.Unpickler):
  """Resolves only the globals a saved plain tensor needs (anything else is an error)."""

  def __init__(self, data: io.BytesIO, archive: zipfile.ZipFile, prefix: str) -> None:
    super().__init__(data)
    self.archive, self.prefix = archive, prefix

  def find_class(self, module: str, name: str) -> Any:
    if module == 'torch._utils' and name == '_rebuild_tensor_v2':
      return _rebuild_tensor
    if module == 'torch' and name in _DTYPES:
      return _StorageType(name)
    if module == 'collections' and name == 'OrderedDict':
      return dict
    raise pickle.UnpicklingError(f'unsupported object {module}.{name} (only a plain tensor is '
                                 'read)')

  def persistent_load(self, pid: Any) -> np.ndarray:
    kind, storage_type, key, _, numel = pid[:5]
    if kind != 'storage' or not isinstance(storage_type, _StorageType):
      raise pickle.UnpicklingError(f'unsupported storage {pid!r}')
    raw = self.archive.read(f'{self.prefix}data/{key}')
    return np.frombuffer(raw, dtype=np.dtype(_DTYPES[storage_type.name]).newbyteorder('<'),
                         count=int(numel))


def load(data: bytes) -> np.ndarray:
  """The tensor in the bytes of a `torch.save` zip file (ValueError if it is not one)."""
  try:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
      pkl = [n for n in archive.namelist() if n.endswith('data.pkl')]
      if len(pkl) != 1:
        raise ValueError('no single data.pkl inside (not a torch.save zip file)')
      prefix = pkl[0][:-len('data.pkl')]
      out = _Unpickler(io.BytesIO(archive.read(pkl[0])), archive, prefix).load()
  except (zipfile.BadZipFile, pickle.UnpicklingError, KeyError, EOFError) as e:
    raise ValueError(f'not a readable torch.save tensor file ({e})') from e
  if not isinstance(out, np.ndarray):
    raise ValueError(f'the file holds a {type(out).__name__}, not a tensor')
  return out
