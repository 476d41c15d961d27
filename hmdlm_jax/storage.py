"""Where a run's files live: local paths and URLs (gs://bucket/...) behind one set of functions.

Every file the program reads or writes goes through here (or through Orbax / etils.epath, which
take the same strings). A path is a str: a URL is kept as written (os.path.abspath would turn
gs://b/x into ./gs:/b/x), a local path is made absolute. URLs go through etils.epath (gcsfs for
gs:// when TensorFlow is absent); local paths keep the plain os calls they always used.

Object stores have no folders, no appending and no rename. So `makedirs` does nothing on a URL,
`write_text` / `write_bytes` are one upload there (an upload is atomic: readers see the old object
or the new one) and write-then-rename locally, and a growing file (metrics.jsonl, runs.jsonl,
TensorBoard events) is rewritten whole on each flush (`open_append`, `Rewritten`).
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import uuid
from typing import IO, Any

from etils import epath

_URL = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*://')


def is_url(path: str | os.PathLike[str]) -> bool:
  """Whether `path` is a URL (gs://..., s3://...) rather than a local path."""
  return bool(_URL.match(os.fspath(path)))


def absolute(path: str | os.PathLike[str]) -> str:
  """`path` as the run records and uses it: a URL unchanged, a local path absolute."""
  path = os.fspath(path)
  return path if is_url(path) else os.path.abspath(path)


def join(path: str, *names: str) -> str:
  """`path`/name/...; a URL keeps its scheme's double slash (os.path.normpath would not)."""
  return os.path.join(path, *names)


def as_path(path: str | os.PathLike[str]) -> epath.Path:
  """The etils.epath.Path of `path` (a local one with ~ expanded): globbing, reading, pictures."""
  path = os.fspath(path)
  return epath.Path(path if is_url(path) else os.path.expanduser(path))


# ------------------------------------------------------------------------------------ queries


def exists(path: str) -> bool:
  return as_path(path).exists() if is_url(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  """A local directory, or a URL prefix that holds objects."""
  return as_path(path).is_dir() if is_url(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  return as_path(path).is_file() if is_url(path) else os.path.isfile(path)


def listdir(path: str) -> list[str]:
  """Names in the directory `path` (unsorted, like os.listdir)."""
  if is_url(path):
    return [p.name for p in as_path(path).iterdir()]
  return os.listdir(path)


def makedirs(path: str) -> None:
  """Creates the local directory `path`; nothing for a URL (objects need no folder, and gcsfs
  would create a missing bucket)."""
  if not is_url(path):
    os.makedirs(path, exist_ok=True)


def open_file(path: str, mode: str = 'r', **kwargs: Any) -> IO[Any]:
  """open() for reading (or writing a file in one go); `encoding` etc. pass through locally."""
  if is_url(path):
    return as_path(path).open(mode, **({} if 'b' in mode else {'encoding': 'utf-8'}))
  return open(path, mode, **kwargs)  # pylint: disable=unspecified-encoding


def read_text(path: str) -> str:
  with open_file(path, encoding='utf-8') as f:
    return f.read()


def probe_writable(directory: str) -> str | None:
  """None if a file can be created in the existing `directory` (or under the URL), else why not.

  Creates and at once removes a probe (a folder locally, an object on a URL): permission bits
  alone cannot tell (root ignores them; read-only mounts and buckets refuse anyway).
  """
  if is_url(directory):
    probe = as_path(join(directory, f'.hmdlm_write_probe_{uuid.uuid4().hex}'))
    try:
      probe.write_bytes(b'')
      probe.unlink()
    except FileNotFoundError:  # gcsfs's answer to an upload into a missing bucket
      return 'the bucket does not exist'
    except Exception as e:  # pylint: disable=broad-except  # gcsfs raises HttpError, OSError, ...
      return f'writing there fails: {type(e).__name__}: {" ".join(str(e).split())[:300]}'
    return None
  if not os.access(directory, os.W_OK | os.X_OK):
    return 'permission denied'
  try:
    os.rmdir(tempfile.mkdtemp(prefix='.hmdlm_write_probe_', dir=directory))
  except OSError as e:
    return f'creating a folder there fails: {e.strerror or type(e).__name__}'
  return None


# ------------------------------------------------------------------------------------ writing


TMP_SUFFIX = '.partial'  # write_bytes' temporary files: '.<name>.<random>.partial'


def is_partial(name: str) -> bool:
  """Whether `name` is a temporary file of `write_bytes` (left only by a killed process)."""
  return name.startswith('.') and name.endswith(TMP_SUFFIX)


def write_bytes(path: str, data: bytes) -> None:
  """Atomic write: readers see the old file or the new one, never a part, even after a kill.

  Locally the data goes to a hidden temporary file in the same folder (a rename is atomic only
  within one file system), is flushed to disk (so a crash cannot leave the new name pointing at
  unwritten blocks), and is renamed over `path`. The temporary name is unique, so two writers never
  share one; a failed write removes it, and one left by a kill (`is_partial`) is no output.
  """
  if is_url(path):
    as_path(path).write_bytes(data)  # one upload: atomic on an object store
    return
  folder, name = os.path.split(path)
  tmp = os.path.join(folder, f'.{name}.{uuid.uuid4().hex}{TMP_SUFFIX}')
  try:
    with open(tmp, 'xb') as f:  # the umask's permissions, like the file it replaces
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    try:
      os.remove(tmp)
    except FileNotFoundError:
      pass
    raise


def create_exclusive(path: str, data: bytes) -> None:
  """Creates `path` holding `data` unless it exists (FileExistsError), atomically: of two writers
  racing, one wins and the other sees its whole file.

  Locally: a fully written hidden temporary is hard-linked to `path` (link(2) fails when the name
  exists, also on NFS, and the file is never seen part-written). A URL: one upload under a
  create-only precondition (fsspec mode 'xb'; gcsfs sends GCS `ifGenerationMatch=0`).
  """
  if is_url(path):
    import fsspec  # pylint: disable=g-import-not-at-top  # etils' URL backend depends on it
    fs, key = fsspec.core.url_to_fs(path)
    with fs.open(key, 'xb') as f:
      f.write(data)
    return
  folder, name = os.path.split(path)
  tmp = os.path.join(folder, f'.{name}.{uuid.uuid4().hex}{TMP_SUFFIX}')
  with open(tmp, 'xb') as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  try:
    os.link(tmp, path)
  finally:
    os.remove(tmp)


def remove(path: str) -> None:
  """Deletes the file `path` (FileNotFoundError when it is absent)."""
  if is_url(path):
    as_path(path).unlink()
  else:
    os.remove(path)


def write_text(path: str, text: str) -> None:
  """Atomic write of `text` (UTF-8)."""
  write_bytes(path, text.encode('utf-8'))


class Rewritten:
  """A growing object on a URL: writes collect in memory, and each flush uploads all of it.

  Objects cannot be appended to, so a flush costs an upload of the whole file so far (metrics.jsonl
  of a long run: a few MB per flush). GCS also allows about one write per second per object;
  faster flushes are retried by gcsfs, so log at most about once a second (train.log_every).
  """

  def __init__(self, path: str, data: bytes = b'') -> None:
    self._path = as_path(path)
    self._data = bytearray(data)
    self._uploaded = -1  # bytes in the object; -1: not written yet
    # tensorboardX flushes from its own thread too: a snapshot and its length change together.
    self._lock = threading.Lock()

  def write(self, data: bytes | str) -> None:
    with self._lock:
      self._data += data.encode('utf-8') if isinstance(data, str) else data

  def flush(self) -> None:
    with self._lock:
      if self._uploaded != len(self._data):
        self._path.write_bytes(bytes(self._data))
        self._uploaded = len(self._data)

  def close(self) -> None:
    self.flush()


def open_append(path: str) -> IO[str] | Rewritten:
  """A text file to append lines to and flush: local, open(path, 'a'); a URL, a Rewritten copy
  of the object (its current content first)."""
  if is_url(path):
    p = as_path(path)
    return Rewritten(path, p.read_bytes() if p.exists() else b'')
  return open(path, 'a', encoding='utf-8')  # pylint: disable=consider-using-with


def append_text(path: str, text: str) -> None:
  """Appends `text` to `path` (a URL: rewrites the object with it appended)."""
  f = open_append(path)
  try:
    f.write(text)
  finally:
    f.close()


class _TensorBoardObjects:
  """tensorboardX record-writer factory for a URL scheme: event files as Rewritten objects."""

  def open(self, path: str) -> Rewritten:
    return Rewritten(path)

  def directory_check(self, path: str) -> None:
    del path  # objects need no folder


def register_tensorboard(path: str) -> None:
  """Makes tensorboardX write the event files under the URL `path` through this module (its own
  gs:// writer needs google-cloud-storage credentials and ignores gcsfs's)."""
  if is_url(path):
    from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
    record_writer.register_writer_factory(path.split(':', 1)[0], _TensorBoardObjects())
