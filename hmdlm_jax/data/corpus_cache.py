"""A prepared corpus on gs://, read through a local copy: each process fetches its shards once.

array_record's reader (C++, used by Grain) opens files by path, and a record read is a random
access: over an object store each read would be one request. So a `data.corpus_dir` URL is
materialised, split by split, into `data.corpus_cache_dir` (default ~/.cache/hmdlm_jax/corpus)
and read from there exactly as a local corpus (data/corpus.py; docs/usage.md, "prepared corpora").

Every process holds every shard: its share `[process_index::process_count]` of the documents
touches all of them, and the data order must not depend on where the files are. A download is
checked against the manifest's size and sha256 and renamed into place only then, so a killed
download or a truncated cached file is fetched again; free space is checked first. The rules in
full: docs/design.md ("Data").
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import time
from typing import Any

from absl import logging

from hmdlm_jax import storage
from hmdlm_jax.data import prepare

FIELD = 'config.data.corpus_cache_dir'
FETCH_THREADS = 8  # concurrent object downloads (GCS serves each object at a limited rate)
ABANDONED_S = 600  # a .partial untouched this long was left by a killed download
_REPORTED: set[str] = set()  # cache folders this process has logged as complete


def default_cache_dir() -> str:
  """$XDG_CACHE_HOME/hmdlm_jax/corpus, else ~/.cache/hmdlm_jax/corpus."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'hmdlm_jax', 'corpus')


def split_folder(cache_dir: str, corpus_dir: str, split: str, manifest: dict[str, Any]) -> str:
  """CACHE/<corpus name>-<split>-<hash of the URL, split and shards>: one folder per prepared
  split; other shards (the corpus prepared again) get a new one, a resumed `prepare` that
  rewrote the same manifest (only its count of skipped shards changes) keeps it."""
  url = corpus_dir.rstrip('/')
  what = [url, split, manifest.get('tokenizer_hash'), manifest.get('dtype'), manifest['shards']]
  key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
  name = re.sub(r'[^A-Za-z0-9._-]+', '_', url.rsplit('/', 1)[-1]) or 'corpus'
  root = os.path.abspath(os.path.expanduser(cache_dir)) if cache_dir else default_cache_dir()
  return os.path.join(root, f'{name}-{split}-{key}')


def wanted_files(manifest: dict[str, Any]) -> list[tuple[str, int | None, str | None]]:
  """(file name, size, sha256) of the files a split is read from: each shard holding documents
  and its lengths file; size and digest None where the manifest predates them."""
  out = []
  for s in manifest['shards']:
    if s['documents']:
      out.append((f'{s["name"]}{prepare.SHARD_SUFFIX}', s.get('bytes'), s.get('sha256')))
      out.append((f'{s["name"]}{prepare.LENGTHS_SUFFIX}', s.get('lengths_bytes'),
                  s.get('lengths_sha256')))
  return out


def _size(n: int) -> str:
  return f'{n / 1e9:.2f} GB' if n >= 1e9 else f'{n / 1e6:.1f} MB'


def _clear_abandoned(folder: str) -> None:
  """Removes the .partial files of downloads killed long ago (a live one is written steadily;
  another process on this host may be fetching into the same folder)."""
  now = time.time()
  for name in os.listdir(folder):
    if storage.is_partial(name):
      path = os.path.join(folder, name)
      try:
        if now - os.path.getmtime(path) > ABANDONED_S:
          os.remove(path)
      except FileNotFoundError:
        pass


def materialise(corpus_dir: str, split: str, manifest: dict[str, Any], cache_dir: str) -> str:
  """The local folder holding every file of CORPUS_DIR/SPLIT (a URL) that `manifest` (its
  manifest.json) lists, fetching those not cached whole; module docstring."""
  url_root = storage.join(corpus_dir, split)
  folder = split_folder(cache_dir, corpus_dir, split, manifest)
  where = f'{FIELD}={cache_dir!r}' + ('' if cache_dir else ' (the default cache)')
  storage.makedirs(folder)
  _clear_abandoned(folder)
  files = wanted_files(manifest)
  if any(size is None for _, size, _ in files):  # an older manifest: the objects' sizes
    remote = storage.file_sizes(url_root)
    files = [(n, remote.get(n) if size is None else size, h) for n, size, h in files]
    lost = [n for n, size, _ in files if size is None]
    if lost:
      raise ValueError(f'config.data.corpus_dir: {storage.join(url_root, lost[0])} is missing '
                       f'({len(lost)} of the files its manifest lists); prepare the corpus '
                       'again (python -m hmdlm_jax.data.prepare with the same --output resumes '
                       'it).')
  todo = []
  for name, size, digest in files:
    path = os.path.join(folder, name)
    if not (os.path.isfile(path) and os.path.getsize(path) == size):
      todo.append((name, size, digest))
  if not todo:
    if folder not in _REPORTED:  # once per process: the test split is read again at every eval
      logging.info('corpus %s: all %d files cached in %s', url_root, len(files), folder)
      _REPORTED.add(folder)
    return folder
  need = sum(size for _, size, _ in todo)
  free = shutil.disk_usage(folder).free
  if need > free:
    raise ValueError(f'{where}: fetching the {split} split of {url_root} needs {need:,} bytes '
                     f'({_size(need)}) in {folder}, and that disk has {free:,} '
                     f'({_size(free)}) free; free space there or set {FIELD} to a folder on a '
                     'disk with room (every process holds every shard of the split).')
  logging.info('corpus %s: fetching %d files (%s) into %s (%d already there)', url_root,
               len(todo), _size(need), folder, len(files) - len(todo))
  start = time.monotonic()

  def fetch(item: tuple[str, int, str | None]) -> None:
    name, size, digest = item
    try:
      storage.download(storage.join(url_root, name), os.path.join(folder, name),
                       expect_size=size, expect_sha256=digest)
    except ValueError as e:
      raise ValueError(f'config.data.corpus_dir: {e}: the corpus changed while it was read, or '
                       'its upload is damaged; prepare it again (python -m '
                       'hmdlm_jax.data.prepare).') from None
    except FileNotFoundError:
      raise ValueError(f'config.data.corpus_dir: {storage.join(url_root, name)} is missing, but '
                       'its manifest lists it; prepare the corpus again (python -m '
                       'hmdlm_jax.data.prepare with the same --output resumes it).') from None

  pool = concurrent.futures.ThreadPoolExecutor(min(FETCH_THREADS, len(todo)))
  try:
    for future in concurrent.futures.as_completed([pool.submit(fetch, t) for t in todo]):
      future.result()  # the first failure ends the fetch; what finished stays cached
  finally:
    pool.shutdown(wait=True, cancel_futures=True)
  took = max(time.monotonic() - start, 1e-6)
  logging.info('corpus %s: fetched %s in %.1f s (%.0f MB/s)', url_root, _size(need), took,
               need / took / 1e6)
  _REPORTED.add(folder)
  return folder
