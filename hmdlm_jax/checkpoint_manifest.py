"""A checkpoint step's manifest: every file's size (and small files' SHA-256), checked at start.

Orbax checks a step's metadata when it is read, but not that its array files are whole: a truncated
data file surfaces only mid-restore, after the run has begun writing. So the Checkpointer writes
MANIFEST into a step while Orbax commits it (its post-finalisation callback, before the step's
directory gets its final name: a committed step holds its manifest), and `problem` compares the
files with it before a run writes anything. Files up to HASH_LIMIT bytes (metadata, JSON, small
array files) are also hashed; larger ones (the array data) are checked by size only, so a start
never reads a multi-GB checkpoint. The data iterator's JSON files are parsed in any case. A step
without a manifest (written before it existed) gets the data-iterator check only.
"""

from __future__ import annotations

import hashlib
import json

from hmdlm_jax import storage

MANIFEST = 'hmdlm_manifest.json'
HASH_LIMIT = 1 << 20
DATA_ITER = 'data_iter'


def _sha256(path: str) -> str:
  with storage.open_file(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def _item_files(step_dir: str) -> dict[str, int]:
  # The items' files only: Orbax rewrites the step's own _CHECKPOINT_METADATA and writes its
  # commit marker after the manifest, when it commits the step.
  return {k: v for k, v in storage.file_sizes(step_dir).items() if '/' in k}


def write(step_dir: str) -> None:
  """Writes `step_dir`/MANIFEST: size of every item file, SHA-256 of those up to HASH_LIMIT."""
  files = {}
  for name, size in sorted(_item_files(step_dir).items()):
    entry = {'size': size}
    if size <= HASH_LIMIT:
      entry['sha256'] = _sha256(storage.join(step_dir, name))
    files[name] = entry
  storage.write_text(storage.join(step_dir, MANIFEST),
                     json.dumps({'version': 1, 'files': files}, indent=1, sort_keys=True))


def _data_iter_problem(step_dir: str, sizes: dict[str, int]) -> str | None:
  for name in sorted(sizes):
    if not (name.startswith(DATA_ITER + '/') and name.endswith('.json')):
      continue
    if sizes[name] == 0:
      return f'{name} is empty'
    try:
      json.loads(storage.read_text(storage.join(step_dir, name)))
    except (ValueError, UnicodeDecodeError):
      return f'{name} is not valid JSON'
  return None


def problem(step_dir: str) -> str | None:
  """What is wrong with the files of `step_dir` (a file named, relative to it), None if whole."""
  sizes = _item_files(step_dir)
  found = _data_iter_problem(step_dir, sizes)
  path = storage.join(step_dir, MANIFEST)
  if found is None and storage.exists(path):
    try:
      files = json.loads(storage.read_text(path))['files']
      expected = {str(k): (int(v['size']), v.get('sha256')) for k, v in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
      return f'{MANIFEST} is unreadable'
    for name, (size, digest) in sorted(expected.items()):
      if name not in sizes:
        return f'{name} is missing'
      if sizes[name] != size:
        return f'{name} is {sizes[name]:,} bytes, {size:,} when saved'
      if digest and _sha256(storage.join(step_dir, name)) != digest:
        return f'{name} changed since it was saved'
  return found
