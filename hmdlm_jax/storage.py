"""Where a run's files live: local paths and URLs (gs://bucket/...) behind one set of functions.

Every file the program reads or writes goes through here (or through Orbax / etils.epath, which
take the same strings). A path is a str: a URL is kept as written (os.path.abspath would turn
gs://b/x into ./gs:/b/x), a local path is made absolute. URLs go through etils.epath (gcsfs for
gs:// when TensorFlow is absent); local paths keep the plain os calls they always used.

Object stores have no folders, no appending and no rename. So `makedirs` does nothing on a URL,
`write_text` / `write_bytes` are one upload there (an upload is atomic: readers see the old object
or the new one) and write-then-rename locally, and a growing file (metrics.jsonl, runs.jsonl,
TensorBoard events) is rewritten whole on each flush (`open_append`, `Rewritten`). A write the disk
refuses (full, quota, file-size limit, permission) raises write_errors.WriteError naming the path
and leaves no part of what it wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import uuid
from typing import IO, Any, Iterator

from etils import epath

from hmdlm_jax import write_errors

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


def file_sizes(directory: str) -> dict[str, int]:
  """'sub/name' -> size in bytes of every file under `directory` (relative paths, '/' joined)."""
  out = {}
  if is_url(directory):  # by hand: epath's recursive glob is refused on GCS, its walk drops gs://
    todo = [(as_path(directory), '')]
    while todo:
      folder, prefix = todo.pop()
      for path in folder.iterdir():
        if path.is_dir():
          todo.append((path, f'{prefix}{path.name}/'))
        else:
          out[prefix + path.name] = int(path.stat().length)
    return out
  for parent, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(parent, name)
      out[os.path.relpath(path, directory).replace(os.sep, '/')] = os.path.getsize(path)
  return out


def makedirs(path: str) -> None:
  """Creates the local directory `path`; nothing for a URL (objects need no folder, and gcsfs
  would create a missing bucket)."""
  if not is_url(path):
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as e:
      raise _refused(e, path)


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


def _refused(e: OSError, path: str) -> OSError:
  """`e` as the WriteError naming `path` when the disk refused the write (full, quota, file-size
  limit, permission), else `e` itself."""
  return write_errors.from_exception(e, path) or e


def is_partial(name: str) -> bool:
  """Whether `name` is a temporary file of `write_bytes` (left only by a killed process)."""
  return name.startswith('.') and name.endswith(TMP_SUFFIX)


def write_bytes(path: str, data: bytes) -> None:
  """Atomic write: readers see the old file or the new one, never a part, even after a kill.

  Locally the data goes to a hidden temporary file in the same folder (a rename is atomic only
  within one file system), is flushed to disk (so a crash cannot leave the new name pointing at
  unwritten blocks), and is renamed over `path`. The temporary name is unique, so two writers never
  share one; a failed write removes it, and one left by a kill (`is_partial`) is no output. A write
  the disk refuses raises write_errors.WriteError naming `path`.
  """
  if is_url(path):
    as_path(path).write_bytes(data)  # one upload: atomic on an object store
    return
  with _replacing(path) as f:
    f.write(data)


@contextlib.contextmanager
def _replacing(path: str, *, source_errors: bool = False) -> Iterator[IO[bytes]]:
  """The hidden temporary file of an atomic local write of `path` (write_bytes' rules): on a normal
  exit it is flushed to disk and renamed over `path`; on any exception it is removed, and an
  OSError becomes write_errors.WriteError naming `path` (with `source_errors`, a
  FileNotFoundError stays itself: a missing source is not a refused write)."""
  folder, name = os.path.split(path)
  tmp = os.path.join(folder, f'.{name}.{uuid.uuid4().hex}{TMP_SUFFIX}')
  try:
    with open(tmp, 'xb') as f:  # the umask's permissions, like the file it replaces
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException as e:
    try:
      os.remove(tmp)
    except FileNotFoundError:
      pass
    if isinstance(e, OSError) and not (source_errors and isinstance(e, FileNotFoundError)):
      raise _refused(e, path) from e
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
  try:
    with open(tmp, 'xb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:  # a full disk or a read-only folder: one line naming the file
    if os.path.exists(tmp):
      os.remove(tmp)
    raise _refused(e, path) from e
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

  def write(self, data: bytes | str) -> None:
    self._data += data.encode('utf-8') if isinstance(data, str) else data

  def flush(self) -> None:
    if self._uploaded != len(self._data):
      self._path.write_bytes(bytes(self._data))
      self._uploaded = len(self._data)

  def close(self) -> None:
    self.flush()


class Appended:
  """A local file that grows by whole writes (unbuffered): a write the disk refuses is cut off
  again, so the file keeps only whole lines / records, and raises WriteError naming the file."""

  def __init__(self, path: str) -> None:
    self._path = path
    try:
      self._file = open(path, 'ab', buffering=0)  # pylint: disable=consider-using-with
    except OSError as e:
      raise _refused(e, path) from e

  def write(self, data: bytes | str) -> None:
    view = memoryview(data.encode('utf-8') if isinstance(data, str) else data)
    end = self._file.seek(0, os.SEEK_END)
    try:
      while view:
        view = view[self._file.write(view):]
    except OSError as e:
      try:
        self._file.truncate(end)
      except OSError:
        pass  # the refused bytes stay; a reader skips a cut last line
      raise _refused(e, self._path) from e

  def flush(self) -> None:
    pass  # unbuffered: every write is in the file when it returns

  def close(self) -> None:
    self._file.close()


def open_append(path: str) -> Appended | Rewritten:
  """A file to append whole lines (str) or records (bytes) to: local, `Appended`; a URL, a
  Rewritten copy of the object (its current content first)."""
  if is_url(path):
    p = as_path(path)
    return Rewritten(path, p.read_bytes() if p.exists() else b'')
  return Appended(path)


def append_text(path: str, text: str) -> None:
  """Appends `text` to `path` (a URL: rewrites the object with it appended)."""
  f = open_append(path)
  try:
    f.write(text)
  finally:
    f.close()


# ------------------------------------------------------------------------------- local copies


COPY_CHUNK = 8 * 2**20  # bytes per read of a download (and of a local digest)


def sha256_file(path: str) -> tuple[int, str]:
  """(size in bytes, sha256 hex digest) of the file `path` (local or a URL), read in chunks."""
  h, n = hashlib.sha256(), 0
  with open_file(path, 'rb') as f:
    while chunk := f.read(COPY_CHUNK):
      h.update(chunk)
      n += len(chunk)
  return n, h.hexdigest()


def download(url: str, path: str, *, expect_size: int | None = None,
             expect_sha256: str | None = None) -> tuple[int, str]:
  """Copies `url` (or any path) to the local file `path` atomically; returns (size, sha256).

  The bytes go to a hidden `.<name>.<random>.partial` beside `path` (`is_partial`), hashed on the
  way, flushed to disk, and are renamed over `path` only when the size and digest match what is
  expected (ValueError otherwise, nothing left behind): a killed or short download never leaves a
  file that looks whole. A write the disk refuses raises write_errors.WriteError naming `path`.
  """
  h, n = hashlib.sha256(), 0
  with _replacing(path, source_errors=True) as dst, open_file(url, 'rb') as src:
    while chunk := src.read(COPY_CHUNK):
      h.update(chunk)
      n += len(chunk)
      dst.write(chunk)
    digest = h.hexdigest()  # checked before the rename: a mismatch leaves nothing behind
    if expect_size is not None and n != expect_size:
      raise ValueError(f'{url}: read {n:,} bytes, expected {expect_size:,}')
    if expect_sha256 is not None and digest != expect_sha256:
      raise ValueError(f'{url}: sha256 {digest[:12]}..., expected {expect_sha256[:12]}...')
  return n, digest
