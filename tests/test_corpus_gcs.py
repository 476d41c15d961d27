"""A prepared corpus on gs:// (tests/gcs_emulator.py): `prepare --output=gs://...` writes it, the
'corpus' loader reads it through a local cache (hmdlm_jax/data/corpus_cache.py).

The same inputs are prepared into a local folder and into the emulator's bucket; the batches read
from the URL must equal those read from the folder, array for array. The cache is checked for
reuse (no download on a second start, files untouched), for a truncated shard (fetched again,
alone), for a manifest that predates sizes and digests, for a full disk (one line naming the cache
folder and the bytes needed), and a few training steps run on the URL through the entry point.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Iterator

import numpy as np
import pytest

from hmdlm_jax import storage
from hmdlm_jax.data import corpus
from hmdlm_jax.data import corpus_cache
from hmdlm_jax.data import prepare
from tests import gcs_emulator
from tests.conftest import REPO, subprocess_env
from tests.gcs_emulator import BUCKET, Emulator
from tests.test_corpus import BERT, L, _config, _make_inputs, _take

URL = f'gs://{BUCKET}/owt_like'


@pytest.fixture(scope='module')
def gcs(tmp_path_factory) -> Iterator[Emulator]:
  """The emulator, with this process's gcsfs pointed at it for the module."""
  with gcs_emulator.running(tmp_path_factory.mktemp('gcs_emulator')) as emulator:
    with pytest.MonkeyPatch.context() as mp:
      for k, v in emulator.env().items():
        mp.setenv(k, v)
      yield emulator


@pytest.fixture(scope='module')
def corpora(gcs, tmp_path_factory) -> tuple[str, str]:
  """(local corpus folder, its gs:// twin): the same inputs prepared into each, train and test."""
  root = tmp_path_factory.mktemp('corpus_gcs')
  _make_inputs(root / 'in')
  _make_inputs(root / 'held_out', offset=200)
  local = str(root / 'local')
  for out in (local, URL):
    prepare.prepare(str(root / 'in'), out, BERT, shard_mb=0.004)
    prepare.prepare(str(root / 'held_out'), out, BERT, split='test', shard_mb=0.004)
  return local, URL


class Fetches:
  """storage.download, counted: the names it fetched."""

  def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
    self.names: list[str] = []
    real = storage.download

    def spy(url: str, path: str, **kwargs):
      self.names.append(url.rsplit('/', 1)[1])
      return real(url, path, **kwargs)

    monkeypatch.setattr(storage, 'download', spy)


def _batches(config, split: str, n: int | None, process_index: int) -> list[dict[str, np.ndarray]]:
  ds = corpus.make_corpus_dataset(config, split, seed=5, process_index=process_index,
                                  process_count=2)
  return _take(iter(ds), n) if n else list(ds)


def _assert_same(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> None:
  assert len(a) == len(b) and a
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def test_prepare_to_gs_and_batches_equal_the_local_corpus(corpora, gcs, tmp_path, monkeypatch):
  local, url = corpora
  for split in ('train', 'test'):  # the bucket holds what the folder holds, byte for byte
    names = {k.rsplit('/', 1)[1]: v for k, v in gcs.objects(f'owt_like/{split}/').items()}
    assert names == storage.file_sizes(os.path.join(local, split))
    assert gcs.read(f'owt_like/{split}/manifest.json') == pathlib.Path(
        local, split, 'manifest.json').read_bytes()
  cache = str(tmp_path / 'cache')
  fetches = Fetches(monkeypatch)
  for changes in ({}, {'data.packing': 'truncate'}):
    here, there = _config(local, **changes), _config(url, **changes, **{
        'data.corpus_cache_dir': cache})
    corpus.check_corpus_config(there)
    for p in (0, 1):
      _assert_same(_batches(there, 'train', 40, p), _batches(here, 'train', 40, p))
      _assert_same(_batches(there, 'test', None, p), _batches(here, 'test', None, p))
  manifests = [json.loads(pathlib.Path(local, s, 'manifest.json').read_text()) for s in
               ('train', 'test')]
  assert sorted(fetches.names) == sorted(n for m in manifests for n, _, _ in
                                         corpus_cache.wanted_files(m))  # each file once
  folders = sorted(os.listdir(cache))
  assert len(folders) == 2 and folders[0].startswith('owt_like-test-')


def test_second_start_reuses_the_cache_and_a_truncated_shard_is_fetched_again(
    corpora, tmp_path, monkeypatch):
  local, url = corpora
  config = _config(url, **{'data.corpus_cache_dir': str(tmp_path / 'cache')})
  want = _batches(_config(local), 'train', 30, 0)
  fetches = Fetches(monkeypatch)
  _assert_same(_batches(config, 'train', 30, 0), want)
  first = list(fetches.names)
  (folder,) = (tmp_path / 'cache').iterdir()
  stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
  assert sorted(stamps) == sorted(first) and len(first) > 4
  _assert_same(_batches(config, 'train', 30, 0), want)  # a second start: nothing fetched
  assert fetches.names == first
  assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
  # A shard cut short (a copy made by hand, a disk error) and a download killed long ago.
  shard = sorted(n for n in first if n.endswith(corpus.SHARD_SUFFIX))[1]
  data = (folder / shard).read_bytes()
  (folder / shard).write_bytes(data[:len(data) // 2])
  stale = folder / f'.{shard}.0123{storage.TMP_SUFFIX}'
  stale.write_bytes(b'half')
  os.utime(stale, (0, 0))
  _assert_same(_batches(config, 'train', 30, 0), want)
  assert fetches.names == first + [shard]  # that shard alone, whole again
  assert (folder / shard).read_bytes() == data and not stale.exists()


def test_old_manifest_damaged_upload_and_full_disk(corpora, gcs, tmp_path, monkeypatch):
  """A manifest without sizes is checked against the objects' sizes; a download that does not
  match the manifest leaves nothing; a disk without room is one line naming the folder."""
  local, url = corpora
  manifest = json.loads(pathlib.Path(local, 'test', 'manifest.json').read_text())
  old = {**manifest, 'shards': [{k: v for k, v in s.items() if k not in (
      'bytes', 'sha256', 'lengths_bytes', 'lengths_sha256')} for s in manifest['shards']]}
  folder = corpus_cache.materialise(url, 'test', old, str(tmp_path / 'old'))
  assert storage.file_sizes(folder) == {n: s for n, s, _ in corpus_cache.wanted_files(manifest)}
  bad = {**manifest, 'shards': [dict(manifest['shards'][0], sha256='0' * 64)]}
  with pytest.raises(ValueError, match=r'config.data.corpus_dir: gs://.*array_record: sha256 '
                     r'.*, expected 000000000000\.\.\.: the corpus changed while it was read'):
    corpus_cache.materialise(url, 'test', bad, str(tmp_path / 'bad'))
  assert not any(n.endswith(corpus.SHARD_SUFFIX) or storage.is_partial(n) for n in
                 os.listdir(next((tmp_path / 'bad').iterdir())))
  for shard in (manifest['shards'][0], old['shards'][0]):  # with a size, and without
    gone = {**manifest, 'shards': [dict(shard, name='shard-09999-of-09999')]}
    with pytest.raises(ValueError, match=r'corpus_dir: gs://.*/test/shard-09999-of-09999.* is '
                       r'missing.*prepare the corpus again'):
      corpus_cache.materialise(url, 'test', gone, str(tmp_path / 'gone'))
  usage = shutil.disk_usage(tmp_path)._replace(free=1000)
  monkeypatch.setattr(corpus_cache.shutil, 'disk_usage', lambda _: usage)
  need = sum(s for _, s, _ in corpus_cache.wanted_files(manifest))
  cache = str(tmp_path / 'full')
  with pytest.raises(ValueError) as e:
    corpus.make_corpus_dataset(_config(url, **{'data.corpus_cache_dir': cache}), 'test', seed=0,
                               process_index=0, process_count=1)
  msg = str(e.value)
  assert msg.startswith(f'config.data.corpus_cache_dir={cache!r}: fetching the test split of '
                        f'{url}/test needs {need:,} bytes') and cache in msg, msg
  assert 'that disk has 1,000 (0.0 MB) free; free space there or set' in msg, msg
  with pytest.raises(ValueError, match=r"corpus_dir='gs://test-bucket/nothing': nothing there "
                     r'\(or no such bucket\); prepare it once'):
    corpus.check_corpus_config(_config(f'gs://{BUCKET}/nothing'))
  with pytest.raises(ValueError, match=r"corpus_cache_dir='gs://x/c': the shards of a gs:// corpus "
                     r'are copied to a local folder'):
    corpus.check_corpus_config(_config(url, **{'data.corpus_cache_dir': 'gs://x/c'}))


def test_training_reads_a_gs_corpus(corpora, gcs, tmp_path, jax_cache):
  """Two steps of configs/text.py with data.corpus_dir=gs://... through the entry point (the
  batches are checked above; no final evaluation, to keep it short); the log says what it
  fetched."""
  _, url = corpora
  cache = tmp_path / 'cache'
  cmd = [sys.executable, '-m', 'hmdlm_jax.main', '--config=configs/text.py',
         f'--workdir={tmp_path / "run"}', '--config.data.kind=corpus',
         f'--config.data.corpus_dir={url}', f'--config.data.corpus_cache_dir={cache}',
         f'--config.data.seq_len={L}', f'--config.model.seq_len={L}',
         '--config.model.num_layers=1', '--config.model.hidden_size=32',
         '--config.model.num_heads=2', '--config.model.mlp_dim=64', '--config.model.cond_dim=16',
         '--config.data.batch_size=4', '--config.train.num_steps=2',
         '--config.train.ckpt_every=2', '--config.train.log_every=1',
         '--config.train.final_eval=False']
  proc = subprocess.run(cmd, cwd=REPO, env={**subprocess_env(jax_cache), **gcs.env()},
                        timeout=300, capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f'corpus {url}/train: fetching' in proc.stderr, proc.stderr[-3000:]
  assert [p.name.split('-')[1] for p in cache.iterdir()] == ['train']
  with open(tmp_path / 'run' / 'metrics.jsonl', encoding='utf-8') as f:
    recs = [json.loads(line) for line in f]
  assert [r['step'] for r in recs if r['split'] == 'train'] == [1, 2]
  assert os.path.isdir(tmp_path / 'run' / 'checkpoints' / '2')
