"""The 'corpus' kind: a corpus tokenised once by `prepare` (data/prepare.py), read with Grain.

`data.corpus_dir`/{train,test}/ holds ArrayRecord shards (one record = one document's token ids)
and manifest.json. Each process reads its share of the documents (`[process_index::process_count]`
of the shards' global index). `data.packing='wrap'` (MDLM's OpenWebText rows; docs/method.md §6,
"Prepared corpora and packed rows"): each document followed by EOS, concatenated, cut into chunks
of L - 2 tokens, each row `BOS chunk EOS` (grain's ConcatThenSplitIterDataset in training);
`'truncate'`: one row per document, as the 'text' kind (`data.overlong`), a long training document
cut at its start or, with `data.crop='random'`, at a random offset (`RandomCrop`). Levels: the
`data.hierarchy` rule of data/text.py on each packed row. Batches: the contract of
data/pipeline.py; the iterator state is checkpointable. `data.corpus_dir` is a local path or a
gs:// URL (`prepare --output=gs://...`): each process then reads a local copy of every shard of the
split, fetched once into `data.corpus_cache_dir` and checked against the manifest
(data/corpus_cache.py); the batches are those of the same corpus read from a path.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np
from etils import epath

from hmdlm_jax import storage
from hmdlm_jax.data import corpus_cache
from hmdlm_jax.data import pipeline
from hmdlm_jax.data import prepare
from hmdlm_jax.data import text as text_lib
from hmdlm_jax.data import tokenizers as tokenizers_lib

FORMAT = prepare.FORMAT
MANIFEST_FILE = prepare.MANIFEST_FILE
SHARD_SUFFIX = prepare.SHARD_SUFFIX
LENGTHS_SUFFIX = prepare.LENGTHS_SUFFIX
tokenizer_hash = prepare.tokenizer_hash
PACKINGS = ('wrap', 'truncate')
CROPS = ('start', 'random')
PREPARE_HINT = ('prepare it once with `python -m hmdlm_jax.data.prepare --input=FILES '
                '--output=DIR --tokenizer=TOKENIZER --split=SPLIT --workers=N`')


def read_manifest(corpus_dir: str, split: str) -> tuple[epath.Path, dict[str, Any]]:
  """(DIR/SPLIT, its manifest.json); ValueError naming data.corpus_dir and what to do."""
  root = epath.Path(corpus_dir) / split
  path = root / MANIFEST_FILE
  if not path.exists():
    raise ValueError(f'config.data.corpus_dir={corpus_dir!r} holds no prepared {split} split '
                     f'({path} is missing, or the preparation did not finish); {PREPARE_HINT}.')
  manifest = json.loads(path.read_text())
  if manifest.get('format') != FORMAT:
    raise ValueError(f'{path}: format {manifest.get("format")!r}, expected {FORMAT!r}; prepare '
                     'the corpus again.')
  return root, manifest


def check_corpus_config(config: Any) -> tokenizers_lib.TextTokenizer:
  """What the 'corpus' kind checks before reading (fields, tokenizer, the folder); the tokenizer."""
  tok = text_lib.text_tokenizer(config, allowed_rules=('frequency', 'none'))
  d = config.data
  if d.packing not in PACKINGS:
    raise ValueError(f'config.data.packing={d.packing!r}; allowed: {list(PACKINGS)}.')
  if d.crop not in CROPS:
    raise ValueError(f'config.data.crop={d.crop!r}; allowed: {list(CROPS)}.')
  if d.crop == 'random' and (d.packing, d.overlong) != ('truncate', 'truncate'):
    raise ValueError(f"config.data.crop='random' crops documents longer than a row, which needs "
                     f"data.packing='truncate' and data.overlong='truncate' (got "
                     f'{d.packing!r}, {d.overlong!r}); set them, or data.crop=\'start\'.')
  if not d.corpus_dir:
    raise ValueError(f'config.data.corpus_dir is empty: data.kind=\'corpus\' reads a prepared '
                     f'corpus; {PREPARE_HINT}, then set config.data.corpus_dir=DIR.')
  if storage.is_url(d.corpus_dir):  # fetched into data.corpus_cache_dir (data/corpus_cache.py)
    if storage.is_url(d.corpus_cache_dir):
      raise ValueError(f'config.data.corpus_cache_dir={d.corpus_cache_dir!r}: the shards of a '
                       'gs:// corpus are copied to a local folder for reading; give a local '
                       "path, or '' for ~/.cache/hmdlm_jax/corpus.")
    if not storage.exists(d.corpus_dir):
      raise ValueError(f'config.data.corpus_dir={d.corpus_dir!r}: nothing there (or no such '
                       f'bucket); {PREPARE_HINT}.')
    return tok
  mount = missing_mount(d.corpus_dir)
  if mount:
    url = storage.join(f'gs://{os.path.basename(mount)}',
                       os.path.relpath(os.path.abspath(d.corpus_dir), mount)).removesuffix('/.')
    raise ValueError(f'config.data.corpus_dir={d.corpus_dir!r}: {mount} is not mounted on this '
                     f'host; read the corpus from its bucket instead (e.g. config.data.corpus_dir='
                     f'{url}), or mount the bucket there on every host.')
  if not epath.Path(d.corpus_dir).exists():
    raise ValueError(f'config.data.corpus_dir={d.corpus_dir!r}: no such folder; {PREPARE_HINT}.')
  return tok


MOUNT_ROOTS = ('/mnt', '/media', '/gcs')  # where a bucket is mounted by custom (gcsfuse)


def missing_mount(path: str) -> str | None:
  """ROOT/NAME when the missing local `path` lies under ROOT/NAME (a `MOUNT_ROOTS` folder) that
  does not exist, or is an empty folder and no mount point (a bucket not mounted); else None."""
  path = os.path.abspath(os.path.expanduser(path))
  if os.path.exists(path):
    return None
  for root in MOUNT_ROOTS:
    if path.startswith(root + os.sep):
      mount = os.path.join(root, path[len(root) + 1:].split(os.sep, 1)[0])
      if not os.path.exists(mount):
        return mount
      if os.path.isdir(mount) and not os.path.ismount(mount) and not os.listdir(mount):
        return mount
  return None


class Documents(Sequence):
  """Random access to the documents of a prepared split: item i -> int32 [n_i] token ids."""

  def __init__(self, root: epath.Path, manifest: dict[str, Any]):
    self._paths = [str(root / f'{s["name"]}{SHARD_SUFFIX}') for s in manifest['shards']
                   if s['documents']]
    self._dtype = np.dtype(manifest['dtype'])
    self._source = grain.sources.ArrayRecordDataSource(self._paths) if self._paths else []

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
    return np.frombuffer(self._source[i], self._dtype).astype(np.int32)

  def __getstate__(self) -> dict[str, Any]:  # worker processes reopen the files
    return {'paths': self._paths, 'dtype': self._dtype}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self._paths, self._dtype = state['paths'], state['dtype']
    self._source = grain.sources.ArrayRecordDataSource(self._paths) if self._paths else []


def document_lengths(root: epath.Path, manifest: dict[str, Any]) -> np.ndarray:
  """int64 [documents]: every document's token count, in the global index order."""
  parts = []
  for s in manifest['shards']:
    if s['documents']:
      with (root / f'{s["name"]}{LENGTHS_SUFFIX}').open('rb') as f:
        parts.append(np.load(f))
  return np.concatenate(parts) if parts else np.zeros((0,), np.int64)


# ----------------------------------------------------------------------------- wrap rows


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
  """int64 [n]: the order of a share's n documents in `epoch` (a fresh permutation per epoch)."""
  return np.random.default_rng([seed, epoch]).permutation(n)


class ShuffledEpochs(Sequence):
  """Item i -> the documents of a share, epoch after epoch, each epoch in `epoch_permutation`
  order (one lookup per read: cheaper than a per-index shuffle for short documents). The length
  is `epochs` passes: a train stream that does not end in practice."""

  def __init__(self, docs: Documents, indices: np.ndarray, seed: int, epochs: int = 2**30):
    self._docs, self._indices, self._seed, self._epochs = docs, indices, seed, epochs
    self._cache: dict[int, np.ndarray] = {}

  def __len__(self) -> int:
    return len(self._indices) * self._epochs

  @property
  def epoch_size(self) -> int:
    """Documents per epoch (the share's size): item i is position i % epoch_size of epoch
    i // epoch_size."""
    return len(self._indices)

  def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
    epoch, j = divmod(int(i), len(self._indices))
    perm = self._cache.get(epoch)
    if perm is None:
      perm = epoch_permutation(len(self._indices), self._seed, epoch)
      self._cache = {epoch: perm}  # reads move through the epochs in order
    return self._docs[int(self._indices[perm[j]])]

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, '_cache': {}}


class LabelBatch(text_lib.AssignLevels):
  """Grain map on a batch of wrap rows {'tokens', 'segments'} [B, L] -> the batch contract:
  `text.labelled_row` over the batch (its rules are vectorised over rows), weight [B] float32."""

  def map(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    row = text_lib.labelled_row(batch['tokens'], batch['segments'], self._rule, self._tau)
    return {**row, 'weight': np.ones(batch['tokens'].shape[:1], np.float32)}


class AppendEos(grain.transforms.Map):
  """Grain map: document ids [n] -> {'tokens': [n + 1]} with EOS appended (the wrap stream)."""

  def __init__(self, eos_id: int):
    self._eos = eos_id

  def map(self, ids: np.ndarray) -> dict[str, np.ndarray]:
    return {'tokens': np.append(ids, np.int32(self._eos)).astype(np.int32)}


class ConcatThenSplit(grain.IterDataset):
  """grain.experimental.ConcatThenSplitIterDataset over {'tokens'} whose state survives JSON.

  A checkpoint stores iterator state as JSON, which turns the state's (start, stop) slice tuples
  into lists; grain 0.2.18 compares them with a tuple sentinel, so a restored iterator with no
  remainder would read one document too many. The wrapper turns them back into tuples.
  """

  def __init__(self, parent: grain.IterDataset, length: int):
    super().__init__(parent)
    self._length = length

  def __iter__(self) -> grain.DatasetIterator:
    return _TupleSlices(iter(grain.experimental.ConcatThenSplitIterDataset(
        self._parent, length_struct={'tokens': self._length})))


class _TupleSlices(grain.DatasetIterator):

  def __init__(self, inner: grain.DatasetIterator):
    super().__init__(inner)
    self._inner = inner

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._inner)

  def get_state(self) -> dict[str, Any]:
    return self._inner.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    slices = {k: tuple(v) for k, v in state['remainder_slices'].items()}
    self._inner.set_state({**state, 'remainder_slices': slices})


class FrameChunk(grain.transforms.Map):
  """Grain map: a chunk of the stream (ConcatThenSplit's {'tokens' [L - 2], 'tokens_segment_ids'},
  0 = past the end) -> {'tokens', 'segments'} [L] = BOS chunk EOS (+ padding past the end)."""

  def __init__(self, tok: tokenizers_lib.TextTokenizer, seq_len: int):
    self._tok = tok
    self._seq_len = seq_len

  def map(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ids = chunk['tokens']
    if 'tokens_segment_ids' in chunk:
      ids = ids[chunk['tokens_segment_ids'] > 0]
    tokens, segments = wrap_row(self._tok, ids, self._seq_len)
    return {'tokens': tokens, 'segments': segments}


def wrap_row(tok: tokenizers_lib.TextTokenizer, chunk: np.ndarray, seq_len: int
             ) -> tuple[np.ndarray, np.ndarray]:
  """chunk [<= L - 2] -> (tokens int32 [L] = BOS chunk EOS pad..., segments int8 [L]): the row
  `text.build_row` makes of one body piece, built with numpy (docs/method.md §6, wrap)."""
  n = len(chunk)
  if n > seq_len - 2:
    raise ValueError(f'a wrap chunk of {n} tokens does not fit data.seq_len={seq_len}.')
  tokens = np.full((seq_len,), tok.pad_id, np.int32)
  tokens[0], tokens[1:n + 1], tokens[n + 1] = tok.bos_id, chunk, tok.eos_id
  segments = np.full((seq_len,), text_lib.SEG_PAD, np.int8)
  segments[:n + 2] = text_lib.SEG_BODY
  return tokens, segments


class TruncateRow(grain.transforms.Map):
  """Grain map: document ids [n] -> {'tokens', 'segments'} [L] = BOS doc EOS pad..., the document
  cut to L - 2 tokens (`data.overlong='truncate'`) or None (`'drop'`): `text.EncodeRows`'s row of
  one body piece, built with numpy."""

  def __init__(self, tok: tokenizers_lib.TextTokenizer, seq_len: int, overlong: str):
    if overlong not in text_lib.OVERLONG:
      raise ValueError(f'config.data.overlong={overlong!r}; allowed: {list(text_lib.OVERLONG)}.')
    self._tok, self._seq_len, self._drop = tok, seq_len, overlong == 'drop'

  def map(self, ids: np.ndarray) -> dict[str, np.ndarray] | None:
    if len(ids) > self._seq_len - 2:
      if self._drop:
        return None
      ids = ids[:self._seq_len - 2]
    tokens, segments = wrap_row(self._tok, ids, self._seq_len)
    return {'tokens': tokens, 'segments': segments}


def crop_offset(n: int, room: int, seed: int, epoch: int, position: int) -> int:
  """Start of the `room`-token window of an n-token document: 0 if it fits, else uniform in
  [0, n - room], drawn from (seed, epoch, position in the epoch) alone (docs/method.md §6)."""
  if n <= room:
    return 0
  return int(np.random.default_rng([seed, epoch, position]).integers(0, n - room + 1))


class RandomCrop(grain.transforms.MapWithIndex):
  """Grain map on `ShuffledEpochs` items: document ids [n] at item i -> ids [min(n, room)], the
  window at `crop_offset` (epoch, position = divmod(i, epoch_size)). A function of the item index:
  a resumed iterator (the index in its state) draws the same windows."""

  def __init__(self, room: int, seed: int, epoch_size: int):
    self._room, self._seed, self._epoch_size = room, seed, epoch_size

  def map_with_index(self, index: int, ids: np.ndarray) -> np.ndarray:
    epoch, position = divmod(int(index), self._epoch_size)
    start = crop_offset(len(ids), self._room, self._seed, epoch, position)
    return ids[start:start + self._room]


def wrap_stream(docs: Sequence[np.ndarray], eos_id: int) -> np.ndarray:
  """The wrap stream of documents in order: doc_0 EOS doc_1 EOS ... (int32 [sum(n_i + 1)])."""
  parts = [np.append(np.asarray(d, np.int32), np.int32(eos_id)) for d in docs]
  return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


class PackedRows(Sequence):
  """Random access to the wrap rows of a process's share (test split): row r holds the stream's
  tokens [r (L - 2), (r + 1)(L - 2)), found from the documents' cumulative lengths; the last row
  is short (padded) unless the stream divides evenly."""

  def __init__(self, docs: Documents, indices: np.ndarray, lengths: np.ndarray,
               tok: tokenizers_lib.TextTokenizer, seq_len: int):
    self._docs, self._indices, self._tok, self._seq_len = docs, indices, tok, seq_len
    self._ends = np.cumsum(lengths + 1)  # stream end of each of this share's documents
    self._room = seq_len - 2

  def __len__(self) -> int:
    total = int(self._ends[-1]) if len(self._ends) else 0
    return -(-total // self._room)

  def __getitem__(self, r: int) -> dict[str, np.ndarray]:  # type: ignore[override]
    lo, hi = r * self._room, (r + 1) * self._room
    first = int(np.searchsorted(self._ends, lo, side='right'))
    last = int(np.searchsorted(self._ends, hi, side='left'))
    last = min(last, len(self._ends) - 1)
    start = int(self._ends[first - 1]) if first else 0
    stream = wrap_stream([self._docs[int(self._indices[j])] for j in range(first, last + 1)],
                         self._tok.eos_id)
    tokens, segments = wrap_row(self._tok, stream[lo - start:hi - start], self._seq_len)
    return {'tokens': tokens, 'segments': segments}


def wrap_row_counts(lengths: np.ndarray, process_count: int, seq_len: int) -> list[int]:
  """Rows of each process's share under wrap packing (test split): ceil(sum(n_i + 1) / (L - 2))."""
  return [int(-(-int(np.sum(lengths[p::process_count] + 1)) // (seq_len - 2)))
          for p in range(process_count)]


# ----------------------------------------------------------------------------- the pipeline


def make_corpus_dataset(config: Any, split: str, *, seed: int, process_index: int,
                        process_count: int) -> grain.IterDataset:
  """Batches {tokens, levels [B, L] int32; given, loss_mask [B, L] bool; weight [B]} of a prepared
  corpus (module docstring). Train: this process's documents in a fresh order every epoch
  (`ShuffledEpochs`), packed (or truncated) into rows, last partial batch dropped. Test: one pass
  in order, padded to the same number of batches on every process (data/pipeline.py)."""
  tok = check_corpus_config(config)
  if split not in text_lib.SPLITS:
    raise ValueError(f'split={split!r}; allowed: {text_lib.SPLITS}.')
  d = config.data
  seq_len = text_lib.data_seq_len(config)
  root, manifest = read_manifest(d.corpus_dir, split)
  want = tokenizer_hash(tok)
  if manifest['tokenizer_hash'] != want:
    raise ValueError(f'{root / MANIFEST_FILE}: prepared with tokenizer {manifest["tokenizer"]!r} '
                     f'(hash {manifest["tokenizer_hash"][:12]}), but config.data.tokenizer='
                     f'{d.tokenizer!r} has hash {want[:12]}; prepare the corpus with this '
                     'tokenizer or set data.tokenizer to the one it was prepared with.')
  if storage.is_url(d.corpus_dir):  # the shards are read from a local copy (corpus_cache.py)
    root = epath.Path(corpus_cache.materialise(d.corpus_dir, split, manifest,
                                               d.corpus_cache_dir))
  docs = Documents(root, manifest)
  if len(docs) < process_count:
    raise ValueError(f'config.data.corpus_dir={d.corpus_dir!r}: its {split} split ({root}) holds '
                     f'{len(docs)} documents, fewer than the {process_count} processes; prepare '
                     'it from a larger corpus (python -m hmdlm_jax.data.prepare).')
  train = split == 'train'
  if d.packing == 'truncate' and not train:
    encode = text_lib.EncodeRows(tok, text_lib.ids_pieces, seq_len, d.overlong)
    return text_lib.batched_dataset(docs, encode, config, split, seed=seed,
                                    process_index=process_index, process_count=process_count)
  field = 'data.batch_size' if train else 'data.eval_batch_size'
  batch = pipeline.local_batch_size(d.batch_size if train else d.eval_batch_size, process_count,
                                    field)
  if train:
    shuffle_seed, crop_seed = pipeline.derive_seeds(seed, split, 2)  # the first is n-independent
    workers, threads, buffer = pipeline.loader_options(config)
    share = ShuffledEpochs(docs, np.arange(len(docs))[process_index::process_count], shuffle_seed)
    ds = grain.MapDataset.source(share)
    if d.packing == 'truncate':
      probe = [len(docs[int(i)]) for i in share._indices[:256]]  # pylint: disable=protected-access
      if d.overlong == 'drop' and min(probe) > seq_len - 2:  # the stream would never yield
        raise ValueError(f'None of the first {len(probe)} train documents fits data.seq_len='
                         f'{seq_len} (data.overlong=\'drop\'); raise data.seq_len.')
      if d.crop == 'random':  # training only: test rows keep the start (docs/method.md §6)
        ds = ds.map_with_index(RandomCrop(seq_len - 2, crop_seed, share.epoch_size))
      ds = ds.map(TruncateRow(tok, seq_len, d.overlong)).filter(text_lib.is_row)
    else:
      ds = ds.map(AppendEos(tok.eos_id))
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=buffer))
    if d.packing == 'wrap':
      it = ConcatThenSplit(it, seq_len - 2).map(FrameChunk(tok, seq_len))
    it = it.batch(batch, drop_remainder=True).map(LabelBatch(d.hierarchy, d.tau))
    return pipeline.worker_prefetch(it, workers)
  lengths = document_lengths(root, manifest)
  counts = wrap_row_counts(lengths, process_count, seq_len)
  indices = np.arange(len(docs))[process_index::process_count]
  rows = grain.MapDataset.source(PackedRows(docs, indices, lengths[indices], tok, seq_len))
  ds = pipeline.pad_for_eval(rows, total=max(counts) * process_count, batch=batch,
                             process_count=process_count)
  ds = ds.map(text_lib.AssignLevels(d.hierarchy, d.tau))
  return pipeline.finalize(ds.batch(batch, drop_remainder=False), config)
