"""Text rows and hierarchy labels of the language tasks (docs/method.md §6); the 'text' kind.

Every language pipeline (this 'text' kind, 'lm1b', 'wikihow') runs the same Grain chain
(`batched_dataset`; split semantics of data/pipeline.py): `EncodeRows` tokenises ONE example into
ONE row of length L (no packing; BERT style `[CLS] text [SEP] [PAD]...` or GPT-2 style
`BOS prompt summary body EOS EOS...`), recording each position's segment, and truncates or drops
an overlong example (`data.overlong`); `AssignLevels` applies the hierarchy rule named by
`data.hierarchy` ('frequency', 'position' or 'none') and emits the batch contract of
docs/design.md plus the row's `weight`. The rules, the givens and the padding: docs/method.md §6.

The offline 'text' kind reads the user's files, `data.train_path` / `data.test_path` (plain text,
a folder of `.txt` / `.jsonl` files, or JSON lines of `{"text": ...}`), one example per line or
paragraph (`data.text_unit`); with only `train_path`, `data.test_fraction` > 0 splits it by a hash
of each example's text (docs/method.md §6, "Offline text").
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

from etils import epath
import grain
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax import storage
from hmdlm_jax.data import pipeline
from hmdlm_jax.data import text_encode
from hmdlm_jax.data import tokenizers as tokenizers_lib

# Segment of each row position (an internal field between EncodeRows and AssignLevels).
SEG_PAD = 0
SEG_PROMPT = 1
SEG_SUMMARY = 2
SEG_BODY = 3

OVERLONG = ('truncate', 'drop')
TEXT_UNITS = ('line', 'paragraph')
SPLITS = ('train', 'test')
BATCH_KEYS = ('tokens', 'levels', 'given', 'loss_mask', 'weight')


# ----------------------------------------------------------------------------- hierarchy rules


def frequency_levels(tokens: np.ndarray, real: np.ndarray, tau: int) -> np.ndarray:
  """Frequency rule (docs/method.md §6): level 1 iff the token occurs <= τ times in its row.

  Only the row's real (non-padding) tokens are counted.

  Args:
    tokens: int [..., L].
    real: bool [..., L], False at padding (padding is neither counted nor labelled: level 0).
    tau: τ >= 1 (τ=1: tokens occurring exactly once).

  Returns:
    int32 [..., L] levels in {0, 1}.
  """
  tokens, real = np.asarray(tokens), np.asarray(real, dtype=bool)
  if tokens.shape != real.shape:
    raise ValueError(f'tokens {tokens.shape} and real {real.shape} must have the same shape.')
  if tokens.size == 0:
    return np.zeros(tokens.shape, np.int32)
  length = tokens.shape[-1]
  flat = tokens.reshape(-1, length).astype(np.int64)
  flat_r = real.reshape(-1, length)
  # Vectorised over rows: padding gets distinct negative ids (never counted with real tokens);
  # each row is sorted, runs of equal ids are counted, the counts scattered back.
  flat = np.where(flat_r, flat, -1 - np.arange(length))
  order = np.argsort(flat, axis=-1, kind='stable')
  srt = np.take_along_axis(flat, order, axis=-1)
  new_run = np.ones(srt.shape, bool)
  new_run[:, 1:] = srt[:, 1:] != srt[:, :-1]
  run = np.cumsum(new_run.reshape(-1)) - 1  # run id of every sorted position, over all rows
  counts = np.bincount(run)[run].reshape(srt.shape)
  out = np.zeros(flat.shape, np.int32)
  np.put_along_axis(out, order, (counts <= tau).astype(np.int32), axis=-1)
  return (out * flat_r).reshape(tokens.shape)


def position_levels(segments: np.ndarray) -> np.ndarray:
  """Position rule (docs/method.md §6, WikiHow-P): summary and given title -> 1, else 0.

  Args:
    segments: int [..., L] of SEG_* values.

  Returns:
    int32 [..., L].
  """
  segments = np.asarray(segments)
  return ((segments == SEG_SUMMARY) | (segments == SEG_PROMPT)).astype(np.int32)


def _rule_frequency(tokens: np.ndarray, segments: np.ndarray, tau: int) -> np.ndarray:
  return frequency_levels(tokens, segments != SEG_PAD, tau)


def _rule_position(tokens: np.ndarray, segments: np.ndarray, tau: int) -> np.ndarray:
  del tokens, tau
  return position_levels(segments)


def _rule_none(tokens: np.ndarray, segments: np.ndarray, tau: int) -> np.ndarray:
  del segments, tau
  return np.zeros(np.shape(tokens), np.int32)


# name -> (rule(tokens [L], segments [L], tau) -> levels [L], number of levels K it produces).
HIERARCHY_RULES: dict[str, tuple[Callable[[np.ndarray, np.ndarray, int], np.ndarray], int]] = {
    'frequency': (_rule_frequency, 2),
    'position': (_rule_position, 2),
    'none': (_rule_none, 1),
}


# ----------------------------------------------------------------------------- rows


def build_row(tok: tokenizers_lib.TextTokenizer, pieces: Sequence[tuple[Sequence[int], int]],
              seq_len: int, *, overlong: str) -> tuple[np.ndarray, np.ndarray] | None:
  """BOS + pieces + EOS + padding -> (tokens [L] int32, segments [L] int8), or None if dropped.

  BOS takes the first piece's segment and EOS the last one's. Overlong rows are cut at the end of
  the content (EOS kept) for `overlong='truncate'`, or dropped (None) for `'drop'`.
  """
  if not pieces:
    raise ValueError('build_row needs at least one piece.')
  content = [int(i) for ids, _ in pieces for i in ids]
  segs = [s for ids, s in pieces for _ in ids]
  if len(content) + 2 > seq_len:
    if overlong == 'drop':
      return None
    if overlong != 'truncate':
      raise ValueError(f'config.data.overlong={overlong!r}; allowed: {OVERLONG}.')
    content, segs = content[:seq_len - 2], segs[:seq_len - 2]
  ids = [tok.bos_id] + content + [tok.eos_id]
  seg = [pieces[0][1]] + segs + [pieces[-1][1]]
  n = len(ids)
  tokens = np.full((seq_len,), tok.pad_id, np.int32)
  segments = np.full((seq_len,), SEG_PAD, np.int8)
  tokens[:n] = ids
  segments[:n] = seg
  return tokens, segments


class EncodeRows(grain.transforms.Map):
  """Grain map: one raw record -> {'tokens' [L], 'segments' [L]} or None (dropped overlong row).

  `to_pieces(record)` returns [(text, SEG_*), ...] in row order; each piece is tokenised on its own
  (pieces should end with a separator such as '\\n' so that this equals joint tokenisation). A
  piece may also be token ids already (an int array: the 'text' kind encodes its corpus once).
  A row longer than L is truncated (`overlong='truncate'`: the content is cut, the closing
  [SEP]/EOS kept, as MDLM's `truncation=True` does for LM1B) or dropped (`'drop'`: the paper's
  WikiHow filtering).
  """

  def __init__(self, tok: tokenizers_lib.TextTokenizer,
               to_pieces: Callable[[Any], Sequence[tuple[str, int]]], seq_len: int,
               overlong: str):
    if overlong not in OVERLONG:
      raise ValueError(f'config.data.overlong={overlong!r}; allowed: {list(OVERLONG)}.')
    self._tok = tok
    self._to_pieces = to_pieces
    self.seq_len = seq_len
    self.may_drop = overlong == 'drop'
    self._overlong = overlong

  def map(self, record: Any) -> dict[str, np.ndarray] | None:
    pieces = [(self._tok.encode(p) if isinstance(p, str) else p, seg)
              for p, seg in self._to_pieces(record)]
    row = build_row(self._tok, pieces, self.seq_len, overlong=self._overlong)
    if row is None:
      return None
    return {'tokens': row[0], 'segments': row[1]}


def labelled_row(tokens: np.ndarray, segments: np.ndarray, rule: str, tau: int,
                 valid: bool = True) -> dict[str, np.ndarray]:
  """Row + segments -> the batch contract: tokens, levels, given, loss_mask [L]; weight [].

  `valid=False` marks an eval padding row (pipeline.pad_for_eval): no loss anywhere, weight 0.
  """
  fn, _ = HIERARCHY_RULES[rule]
  given = segments == SEG_PROMPT
  return {
      'tokens': np.asarray(tokens, np.int32),
      'levels': fn(tokens, segments, tau).astype(np.int32),
      'given': given,
      'loss_mask': (segments != SEG_PAD) & ~given & bool(valid),
      'weight': np.float32(bool(valid)),
  }


class AssignLevels(grain.transforms.Map):
  """Grain map: {'tokens', 'segments'[, 'valid']} -> `labelled_row` (tokens, levels, given,
  loss_mask [L], weight [])."""

  def __init__(self, rule: str, tau: int):
    if rule not in HIERARCHY_RULES:
      raise ValueError(f'config.data.hierarchy={rule!r}; allowed: {sorted(HIERARCHY_RULES)}.')
    self._rule = rule
    self._tau = tau

  def map(self, row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return labelled_row(row['tokens'], row['segments'], self._rule, self._tau,
                        bool(row.get('valid', True)))


# ----------------------------------------------------------------------------- config checks


def data_seq_len(config: Any) -> int:
  """config.data.seq_len, checked against config.model.seq_len."""
  seq_len = config.data.seq_len
  if seq_len != config.model.seq_len:
    raise ValueError(f'config.data.seq_len={seq_len} differs from config.model.seq_len='
                     f'{config.model.seq_len}; the model must see rows of the data length.')
  if not isinstance(seq_len, int) or seq_len < 3:
    raise ValueError(f'config.data.seq_len={seq_len!r} must be an int >= 3 (BOS, token, EOS).')
  return seq_len


def checked_tokenizer(config: Any) -> tokenizers_lib.TextTokenizer:
  """data.tokenizer, checked against model.vocab_size / mask_id (the process's noise rows and
  derived extra rows included)."""
  tok = tokenizers_lib.tokenizer_from_config(config.data)
  tokenizers_lib.check_vocab(config.model, tok, num_masks=config_lib.num_noise_rows(config))
  return tok


def text_tokenizer(config: Any, *, allowed_rules: Sequence[str]) -> tokenizers_lib.TextTokenizer:
  """The checks every text kind makes first (`check_text_config`, then `checked_tokenizer`);
  returns the tokenizer."""
  check_text_config(config, allowed_rules=allowed_rules)
  return checked_tokenizer(config)


def check_local_paths(config: Any) -> None:
  """data.train_path (required) and data.test_path (optional) exist; raises ValueError."""
  d = config.data
  if not d.train_path:
    raise ValueError(f'config.data.train_path is empty; data.kind={d.kind!r} reads local files.')
  for field in ('train_path', 'test_path'):
    path = getattr(d, field)
    if path and not storage.as_path(path).exists():
      raise ValueError(f'config.data.{field}={path!r}: no such file or folder.')
    # The test split is read only at the first evaluation, after training has written the
    # workdir: an empty file is refused here, before anything is written.
    if path and not _has_text(path):
      raise ValueError(no_examples(field, path))


def no_examples(field: str, path: str) -> str:
  return (f'config.data.{field}={path!r} holds no examples (empty, or blank lines only): point it '
          'at a file (or folder) with text in it.')


def _has_text(path: str) -> bool:
  """Whether the file, or one of the folder's .txt/.jsonl/.json files, has a non-blank byte;
  reads up to the first one (the first block of a real corpus)."""
  p = storage.as_path(path)
  files = (sorted(f for f in p.iterdir() if f.is_file() and f.suffix in ('.txt', '.jsonl', '.json'))
           if p.is_dir() else [p])
  for f in files:
    with storage.open_file(os.fspath(f), 'rb') as fh:
      while block := fh.read(1 << 16):
        if block.strip():
          return True
  return not files  # a folder without such files gets read_text_files' own error


def check_text_config(config: Any, *, allowed_rules: Sequence[str]) -> None:
  """Validates the data fields shared by the text kinds; raises ValueError naming the field."""
  d = config.data
  rule = d.hierarchy
  if rule not in allowed_rules:
    raise ValueError(f'config.data.hierarchy={rule!r}; allowed for data.kind={d.kind!r}: '
                     f'{list(allowed_rules)}.')
  _, k = HIERARCHY_RULES[rule]
  if config.model.num_levels != k:
    raise ValueError(f'config.data.hierarchy={rule!r} produces {k} level(s) but '
                     f'config.model.num_levels={config.model.num_levels}.')
  tau = d.tau
  if rule == 'frequency' and (not isinstance(tau, int) or isinstance(tau, bool) or tau < 1):
    raise ValueError(f'config.data.tau={tau!r} must be an int >= 1.')
  overlong = d.overlong
  if overlong not in OVERLONG:
    raise ValueError(f'config.data.overlong={overlong!r}; allowed: {list(OVERLONG)}.')
  data_seq_len(config)


# ----------------------------------------------------------------------------- pipeline


def is_row(row: dict[str, np.ndarray] | None) -> bool:
  return row is not None  # a module-level function: worker processes pickle the pipeline


def _finalize_train(ds: grain.MapDataset, config: Any, batch: int) -> grain.IterDataset:
  """Unbatched, possibly filtered MapDataset -> IterDataset of batches (threads or processes).

  Batching happens after `to_iter_dataset` so that rows dropped by the overlong filter are skipped
  instead of leaving holes; options as `pipeline.finalize` (data.read_threads,
  data.prefetch_batches, data.num_workers).
  """
  workers, threads, buffer = pipeline.loader_options(config)
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads,
                                            prefetch_buffer_size=buffer * batch))
  return pipeline.worker_prefetch(it.batch(batch, drop_remainder=True), workers)


def batched_dataset(records: Sequence[Any], encode: EncodeRows, config: Any, split: str, *,
                    seed: int, process_index: int, process_count: int) -> grain.IterDataset:
  """The shared Grain chain of every language pipeline -> IterDataset of per-process batches.

  Batches: tokens, levels [B, L] int32; given, loss_mask [B, L] bool; weight [B] float32 (the
  split semantics of hmdlm_jax/data/pipeline.py). Train: this process's shard
  (`records[process_index::process_count]`), reshuffled every epoch, repeated forever, overlong
  rows dropped lazily when data.overlong='drop', last partial batch dropped. Test: one pass in
  order, padded to the same number of batches on every process with weight-0, loss-free copies of
  the shard's first row; with data.overlong='drop' the test rows are encoded up front, since the
  padding needs the number of surviving rows.
  """
  if split not in SPLITS:
    raise ValueError(f'split={split!r}; allowed: {SPLITS}.')
  train = split == 'train'
  field = 'data.batch_size' if train else 'data.eval_batch_size'
  batch = pipeline.local_batch_size(config.data.batch_size if train else
                                    config.data.eval_batch_size, process_count, field)
  label = AssignLevels(config.data.hierarchy, config.data.tau)
  if len(records) < process_count:
    raise ValueError(f'The {split} split of data.kind={config.data.kind!r} has {len(records)} '
                     f'examples, fewer than the {process_count} processes.')
  if train:
    if encode.may_drop:  # a stream whose every row is dropped would never yield a batch
      probe = [records[i] for i in range(process_index, len(records), process_count)[:256]]
      if not any(encode.map(r) is not None for r in probe):
        raise ValueError(f'None of the first {len(probe)} train examples fits data.seq_len='
                         f'{encode.seq_len} (data.overlong=\'drop\'); raise data.seq_len.')
    (shuffle_seed,) = pipeline.derive_seeds(seed, split, 1)
    ds = grain.MapDataset.source(records)[process_index::process_count]
    ds = ds.shuffle(seed=shuffle_seed).repeat()
    ds = ds.map(encode).filter(is_row).map(label)
    return _finalize_train(ds, config, batch)
  if encode.may_drop:
    rows = [row for row in map(encode.map, records) if row is not None]
    if len(rows) < process_count:
      raise ValueError(f'Only {len(rows)} test examples fit data.seq_len={encode.seq_len} '
                       f'(data.overlong=\'drop\'), fewer than the {process_count} processes.')
    ds = grain.MapDataset.source(rows)[process_index::process_count]
    total = len(rows)
  else:
    ds = grain.MapDataset.source(records)[process_index::process_count].map(encode)
    total = len(records)
  ds = pipeline.pad_for_eval(ds, total=total, batch=batch, process_count=process_count)
  return pipeline.finalize(ds.map(label).batch(batch, drop_remainder=False), config)


# ----------------------------------------------------------------------------- the 'text' kind


def _paragraphs(lines: Sequence[str]) -> list[str]:
  out, cur = [], []
  for line in list(lines) + ['']:
    if line.strip():
      cur.append(line.strip())
    elif cur:
      out.append(' '.join(cur))
      cur = []
  return out


def read_text_file(path: str | epath.Path, unit: str = 'line', *,
                   field: str = 'data.train_path') -> list[str]:
  """Examples of one file: JSON-lines (`.jsonl`/`.json`, objects with a string 'text') or text."""
  path = storage.as_path(path)
  if unit not in TEXT_UNITS:
    raise ValueError(f'config.data.text_unit={unit!r}; allowed: {list(TEXT_UNITS)}.')
  raw = pipeline.read_utf8(path, prefix=f'config.{field}: {path} is ', hint=(
      'give UTF-8 plain text, .jsonl or .json files (convert with iconv -t utf-8).'))
  if path.suffix in ('.jsonl', '.json'):
    out = []
    for n, obj in pipeline.json_lines(raw, path):
      if not isinstance(obj, dict) or not isinstance(obj.get('text'), str):
        raise ValueError(f'{path}:{n}: expected an object with a string field "text".')
      out.append(obj['text'])
    return out
  lines = raw.splitlines()
  if unit == 'paragraph':
    return _paragraphs(lines)
  return [line.strip() for line in lines if line.strip()]


def read_text_source(path: str, unit: str = 'line', *, field: str = 'data.train_path') -> list[str]:
  """Examples of a file or of a folder's `.txt`/`.jsonl`/`.json` files (sorted by name)."""
  return [x for _, xs in read_text_files(path, unit, field=field) for x in xs]


def read_text_files(path: str, unit: str = 'line', *, field: str = 'data.train_path'
                    ) -> list[tuple[epath.Path, list[str]]]:
  """`read_text_source`, file by file: [(file, its examples), ...]."""
  p = storage.as_path(path)
  if p.is_dir():
    suffixes = ('.txt', '.jsonl', '.json')
    files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in suffixes)
    if not files:
      raise ValueError(f'config.{field}={path!r}: folder holds no .txt/.jsonl/.json files.')
  elif p.is_file():
    files = [p]
  else:
    raise ValueError(f'config.{field}={path!r}: no such file or folder.')
  return [(f, read_text_file(f, unit, field=field)) for f in files]


def in_test_split(key: str, fraction: float) -> bool:
  """Deterministic split: the example is in the test split iff hash(key) / 2^64 < fraction."""
  h = int.from_bytes(hashlib.blake2b(key.encode('utf-8'), digest_size=8).digest(), 'little')
  return h / 2.0**64 < fraction


def split_examples(examples: Sequence[Any], split: str, fraction: float,
                   key: Callable[[Any], str] = str) -> list[Any]:
  """The `split` part of `examples` under `in_test_split` (data.test_fraction)."""
  if not 0.0 < fraction < 1.0:
    raise ValueError(f'config.data.test_fraction={fraction} must lie in (0, 1) to split one file.')
  return [x for x in examples if in_test_split(key(x), fraction) == (split == 'test')]


def split_records(config: Any, split: str, read: Callable[[str, str], list[Any]],
                  key: Callable[[Any], str]) -> list[Any]:
  """Records of `split` from data.train_path / data.test_path, or one path + data.test_fraction.
  An empty one is refused here, naming field and file (later: "0 examples, fewer than ...")."""
  d = config.data
  if split not in SPLITS:
    raise ValueError(f'split={split!r}; allowed: {SPLITS}.')
  if not d.train_path:
    raise ValueError(f'config.data.train_path is empty; data.kind={d.kind!r} reads local files.')
  fraction = d.test_fraction

  def read_some(field: str) -> list[Any]:
    if not (records := read(getattr(d, field), f'data.{field}')):
      raise ValueError(no_examples(field, getattr(d, field)))
    return records

  if d.test_path:
    if fraction:
      raise ValueError('Set either config.data.test_path or config.data.test_fraction, not both.')
    return read_some('train_path' if split == 'train' else 'test_path')
  if not fraction:
    if split == 'train':
      return read_some('train_path')  # no held-out part: train on everything
    raise ValueError('config.data.test_path is empty and config.data.test_fraction is 0: there is '
                     'no test split; set one of them.')
  records = read_some('train_path')
  part = split_examples(records, split, fraction, key)
  if not part:
    raise ValueError(f'config.data.test_fraction={fraction} leaves the {split} split of '
                     f'config.data.train_path={d.train_path!r} ({len(records)} examples) empty: '
                     'change data.test_fraction, add examples, or set data.test_path.')
  return part


def ids_pieces(ids: np.ndarray) -> list[tuple[np.ndarray, int]]:
  """The one body piece of an already tokenised 'text' example."""
  return [(ids, SEG_BODY)]


def check_text_kind(config: Any) -> tokenizers_lib.TextTokenizer:
  """What the offline 'text' kind checks before reading its files; returns the tokenizer."""
  tok = text_tokenizer(config, allowed_rules=('frequency', 'none'))
  check_local_paths(config)
  return tok


def make_text_dataset(config: Any, split: str, *, seed: int, process_index: int,
                      process_count: int) -> grain.IterDataset:
  """The offline 'text' kind: local files -> frequency (or 'none') labelled rows -> batches.

  The split's examples are tokenised once, up front, with a report per file of what
  data.overlong cuts (hmdlm_jax/data/text_encode.py).
  """
  tok = check_text_kind(config)
  unit = config.data.text_unit
  seq_len, overlong = data_seq_len(config), config.data.overlong

  def read(path: str, field: str) -> list[tuple[str, str]]:
    return [(f'config.{field}: {f}', x) for f, xs in read_text_files(path, unit, field=field)
            for x in xs]

  examples = split_records(config, split, read, lambda e: e[1])
  records = text_encode.encode_examples(tok, examples, seq_len, overlong, split=split)
  encode = EncodeRows(tok, ids_pieces, seq_len, overlong)
  return batched_dataset(records, encode, config, split, seed=seed, process_index=process_index,
                         process_count=process_count)
