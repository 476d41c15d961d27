"""Grain helpers shared by every data kind, and the split semantics they all follow.

A data kind's builder `make_<kind>_dataset(config, split, *, seed, process_index, process_count)`
(data/sudoku_pipeline.py, text.py, lm1b.py, wikihow.py; tasks/ picks one by `config.data.kind`)
returns a `grain.IterDataset` of this process's share of each global batch (B_local = global
batch // process_count): a dict of numpy arrays in the batch contract of docs/design.md, plus
`weight float32 [B_local]` (1 = real example, 0 = padding row). Its iterators are checkpointable
(`it.get_state()` / `it.set_state(state)`). Split semantics:
  'train': infinite; each process reads a disjoint shard (`source[process_index::process_count]`),
    reshuffled every epoch, augmented per record when `data.augment`; last partial batch dropped
    (the stream never ends). `weight` is all ones.
  'test': one pass in file order, no augmentation; every process yields the same number of batches
    (collectives stay in step), the last ones padded with copies of the shard's first example that
    have `weight == 0` and `loss_mask` all False. Evaluators must weight by `weight`.
"""

from __future__ import annotations

from collections.abc import Iterator
import json
import os
from typing import Any

import grain
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax import parent_watch
from hmdlm_jax import storage


def read_utf8(path: Any, *, prefix: str, hint: str) -> str:
  """The text of a UTF-8 file (a local path or URL); a non-UTF-8 file raises `not_utf8`'s
  ValueError."""
  try:
    return storage.read_text(os.fspath(path))
  except UnicodeDecodeError:
    raise not_utf8(path, prefix=prefix, hint=hint) from None


def not_utf8(path: Any, *, prefix: str, hint: str) -> ValueError:
  """The one error for a file that is not UTF-8: '<prefix>not UTF-8 text (byte b'..' at offset
  N); <hint>', N the first bad byte's offset in the file. Read from the bytes again because a
  streaming reader's UnicodeDecodeError (csv over a text file) counts from its buffer's start."""
  with storage.open_file(os.fspath(path), 'rb') as f:
    data = f.read()
  try:
    data.decode('utf-8')
  except UnicodeDecodeError as e:
    return ValueError(f'{prefix}not UTF-8 text (byte {data[e.start:e.start + 1]!r} at offset '
                      f'{e.start:,}); {hint}')
  return ValueError(f'{prefix}not UTF-8 text when read, UTF-8 now (changed meanwhile?); {hint}')


def json_lines(text: str, path: Any) -> Iterator[tuple[int, Any]]:
  """(line number, parsed value) of each non-blank line of the JSON-lines `text` of file `path`;
  a line that is not JSON raises one ValueError '<path>:<n>: not valid JSON (...)'. Lines end at
  '\n' only: a JSON string may hold a raw U+2028 or U+0085, which str.splitlines would cut."""
  for n, line in enumerate(text.split('\n'), start=1):
    if not line.strip():
      continue
    try:
      yield n, json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f'{path}:{n}: not valid JSON ({e.msg}).') from e


def local_batch_size(global_batch: int, process_count: int, field: str) -> int:
  """Per-process batch; ValueError naming `field` unless it divides evenly."""
  if global_batch <= 0 or global_batch % process_count:
    raise ValueError(f'{field}={global_batch} must be a positive multiple of the process count '
                     f'{process_count}')
  return global_batch // process_count


def derive_seeds(seed: int, split: str, n: int) -> list[int]:
  """`n` independent uint32 seeds for the random transforms of one split's pipeline."""
  state = np.random.SeedSequence([seed, *split.encode()]).generate_state(n)
  return [int(s) for s in state]


def loader_options(config: config_lib.Config) -> tuple[int, int, int]:
  """(data.num_workers, data.read_threads, data.prefetch_batches), checked to be >= 0."""
  d = config.data
  workers = int(d.num_workers)
  threads = int(d.read_threads)
  buffer = int(d.prefetch_batches)
  if workers < 0 or threads < 0 or buffer < 0:
    raise ValueError(f'data.num_workers, data.read_threads, data.prefetch_batches must be >= 0, '
                     f'got {workers}, {threads}, {buffer}')
  return workers, threads, buffer


def finalize(ds: grain.MapDataset, config: config_lib.Config) -> grain.IterDataset:
  """MapDataset of batches -> IterDataset with thread prefetch, or worker processes.

  `data.num_workers > 0` uses that many worker processes (`mp_prefetch`); otherwise
  `data.read_threads` threads prefetch `data.prefetch_batches` batches.
  """
  workers, threads, buffer = loader_options(config)
  it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=buffer))
  return worker_prefetch(it_ds, workers)


def worker_prefetch(it_ds: grain.IterDataset, workers: int) -> grain.IterDataset:
  """`it_ds` run by `workers` Grain worker processes (`mp_prefetch`; they exit with this
  process, hmdlm_jax/parent_watch.py); unchanged when 0."""
  if workers > 0:
    from absl import flags  # pylint: disable=g-import-not-at-top
    if not flags.FLAGS.is_parsed():
      # Grain's worker processes read its absl flags.
      raise ValueError(f'data.num_workers={workers} needs absl flags parsed (run under '
                       'absl.app.run); use data.num_workers=0 otherwise')
    it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers),
                              worker_init_fn=parent_watch.initializer())
  return it_ds


def pad_for_eval(ds: grain.MapDataset, *, total: int, batch: int,
                 process_count: int) -> grain.MapDataset:
  """One-pass eval shard of a `total`-record source, padded to the common number of batches.

  Adds `valid` (bool scalar) to each dict record: padding rows copy the shard's first record.
  Every process gets ceil(ceil(total / process_count) / batch) batches.
  """
  if total < process_count:
    raise ValueError(f'eval set has {total} examples, fewer than the {process_count} processes')
  num_batches = -(-(-(-total // process_count)) // batch)
  real = ds.map(_MarkValid(True))
  pad = num_batches * batch - len(ds)
  if pad == 0:
    return real
  filler = ds[:1].repeat(pad).map(_MarkValid(False))
  return grain.MapDataset.concatenate([real, filler])


class _MarkValid(grain.transforms.Map):

  def __init__(self, valid: bool):
    self.valid = valid

  def map(self, element: dict[str, Any]) -> dict[str, Any]:
    return {**element, 'valid': np.bool_(self.valid)}
