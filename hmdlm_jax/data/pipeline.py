"""Grain input pipelines: a registry keyed by `config.data.kind`, and the Sudoku pipeline.

`get_dataset(config, split, *, seed, process_index, process_count)` returns a `grain.IterDataset`
whose iterator yields this process's share of each global batch as a dict of numpy arrays
(docs/design.md): `tokens int32 [B_local, L]`, `levels int32 [B_local, L]`, `given bool [B_local, L]`,
`loss_mask bool [B_local, L]`, plus `weight float32 [B_local]` (1 = real example, 0 = padding row),
with `B_local = global batch // process_count`. Its iterators are checkpointable with
`it.get_state()` / `it.set_state(state)`.

Split semantics (every kind should follow them):
  'train': infinite; each process reads a disjoint shard (`source[process_index::process_count]`),
    reshuffled every epoch, augmented per record when `data.augment`; last partial batch dropped
    (the stream never ends). `weight` is all ones.
  'test': one pass in file order, no augmentation; every process yields the same number of batches
    (collectives stay in step), the last ones padded with copies of the shard's first example that
    have `weight == 0` and `loss_mask` all False. Evaluators must weight by `weight`.

Other kinds register a builder from their own module with `@register('kind')`; `_LAZY_MODULES`
names the module to import on first use, so that e.g. Sudoku never imports a tokenizer library.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol

import chex
import grain
import ml_collections
import numpy as np

from hmdlm_jax.data import sudoku


class Builder(Protocol):

  def __call__(self, config: ml_collections.ConfigDict, split: str, *, seed: int,
               process_index: int, process_count: int) -> grain.IterDataset:
    ...


_BUILDERS: dict[str, Builder] = {}
# kind -> module that registers it when imported (imported lazily by get_dataset).
_LAZY_MODULES: dict[str, str] = {
    'text': 'hmdlm_jax.data.text',
    'lm1b': 'hmdlm_jax.data.text',
    'wikihow': 'hmdlm_jax.data.text',
}


def register(kind: str) -> Callable[[Builder], Builder]:
  """Decorator: `@register('lm1b')` makes `get_dataset` use the builder for `data.kind == 'lm1b'`."""

  def deco(fn: Builder) -> Builder:
    if kind in _BUILDERS and _BUILDERS[kind] is not fn:
      raise ValueError(f'data kind {kind!r} is already registered by {_BUILDERS[kind]!r}')
    _BUILDERS[kind] = fn
    return fn

  return deco


def register_lazy(kind: str, module: str) -> None:
  """Declare that importing `module` registers `kind` (imported on first `get_dataset`)."""
  _LAZY_MODULES[kind] = module


def registered_kinds() -> list[str]:
  return sorted(set(_BUILDERS) | set(_LAZY_MODULES))


def get_dataset(config: ml_collections.ConfigDict, split: str, *, seed: int,
                process_index: int | None = None,
                process_count: int | None = None) -> grain.IterDataset:
  """Grain dataset of per-process batches for `config.data.kind` (module docstring)."""
  kind = config.data.kind
  if kind not in _BUILDERS and kind in _LAZY_MODULES:
    module = _LAZY_MODULES[kind]
    try:
      importlib.import_module(module)
    except ModuleNotFoundError as e:
      if e.name != module:
        raise  # the module exists but one of its own imports is missing
      raise ValueError(f'data.kind={kind!r} is provided by module {module!r}, which does not '
                       'exist') from e
  if kind not in _BUILDERS:
    raise ValueError(f'data.kind={kind!r} is not registered; allowed: {registered_kinds()}')
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f'need 0 <= process_index < process_count, got {process_index}, '
                     f'{process_count}')
  if not 0 <= seed < 2**32:
    raise ValueError(f'dataset seed must lie in [0, 2**32), got {seed}')
  return _BUILDERS[kind](config, split, seed=seed, process_index=process_index,
                         process_count=process_count)


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


def finalize(ds: grain.MapDataset, config: ml_collections.ConfigDict) -> grain.IterDataset:
  """MapDataset of batches -> IterDataset with thread prefetch, or worker processes.

  `data.num_workers > 0` uses that many worker processes (`mp_prefetch`); otherwise
  `data.read_threads` threads prefetch `data.prefetch_batches` batches.
  """
  d = config.data
  workers = int(d.get('num_workers', 0))
  threads = int(d.get('read_threads', 1))
  buffer = int(d.get('prefetch_batches', 4))
  if workers < 0 or threads < 0 or buffer < 0:
    raise ValueError(f'data.num_workers, data.read_threads, data.prefetch_batches must be >= 0, '
                     f'got {workers}, {threads}, {buffer}')
  it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=buffer))
  if workers > 0:
    from absl import flags  # pylint: disable=g-import-not-at-top
    if not flags.FLAGS.is_parsed():
      # Grain's worker processes read its absl flags.
      raise ValueError(f'data.num_workers={workers} needs absl flags parsed (run under '
                       'absl.app.run); use data.num_workers=0 otherwise')
    it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
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


# ----------------------------------------------------------------------------------------------
# Sudoku.

class SudokuAugment(grain.transforms.RandomMap):
  """Per-record random symmetry applied jointly to quiz and solution (SPEC 6)."""

  def random_map(self, element: dict[str, np.ndarray],
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    quiz, solution = sudoku.augment(element['quiz'], element['solution'], rng)
    return {**element, 'quiz': quiz, 'solution': solution}


class SudokuToBatch(grain.transforms.Map):
  """Batched records {quiz, solution[, valid]} `[B, 81]` -> model batch (labels computed here).

  tokens = solution digit - 1; given = quiz != 0; levels = `sudoku.hierarchy_levels(quiz)` (givens
  level 5); loss_mask = ~given on real rows, all False on padding rows; weight = valid as float32.
  """

  def map(self, element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    quiz, solution = element['quiz'], element['solution']
    chex.assert_rank(quiz, 2)
    chex.assert_equal_shape([quiz, solution])
    chex.assert_axis_dimension(quiz, 1, sudoku.NUM_CELLS)
    valid = element.get('valid', np.ones(quiz.shape[0], bool))
    given = quiz > 0
    return {
        'tokens': sudoku.to_tokens(solution),
        'levels': sudoku.hierarchy_levels(quiz),
        'given': given,
        'loss_mask': ~given & valid[:, None],
        'weight': valid.astype(np.float32),
    }


def sudoku_source(config: ml_collections.ConfigDict, split: str,
                  progress: bool = True) -> sudoku.PalmCsvSource:
  """The split's Palm CSV: `data.train_path` / `data.test_path`, else the cached generated set.

  Generated sets read `data.gen_seed` (0), `data.num_train_puzzles` (20000),
  `data.num_test_puzzles` (2000), `data.min_givens` (17), `data.max_givens` (34),
  `data.gen_attempts` (8), `data.gen_processes` (1) and `data.cache_dir`.
  """
  if split not in sudoku.SPLITS:
    raise ValueError(f'split must be one of {sudoku.SPLITS} for data.kind=sudoku, got {split!r}')
  d = config.data
  field = f'data.{split}_path'
  path = d.get(f'{split}_path', '')
  if path:
    import os  # pylint: disable=g-import-not-at-top
    if not os.path.isfile(path):
      raise ValueError(f'{field}={path!r} is not a file')
    return sudoku.PalmCsvSource(path)
  count_field = f'num_{split}_puzzles'
  count = int(d.get(count_field, 20000 if split == 'train' else 2000))
  if count <= 0:
    raise ValueError(f'data.{count_field} must be positive, got {count}')
  path = sudoku.generated_csv(
      int(d.get('gen_seed', 0)), count, split, cache_dir=d.get('cache_dir', ''),
      min_givens=int(d.get('min_givens', 17)), max_givens=int(d.get('max_givens', 34)),
      attempts=int(d.get('gen_attempts', 8)), processes=int(d.get('gen_processes', 1)),
      progress=progress)
  return sudoku.PalmCsvSource(path)


@register('sudoku')
def sudoku_dataset(config: ml_collections.ConfigDict, split: str, *, seed: int,
                   process_index: int, process_count: int) -> grain.IterDataset:
  """Sudoku batches `[B_local, 81]` (module docstring for the split semantics)."""
  source = sudoku_source(config, split)
  d = config.data
  train = split == 'train'
  field = 'data.batch_size' if train else 'data.eval_batch_size'
  batch = local_batch_size(d.batch_size if train else d.eval_batch_size, process_count, field)
  ds = grain.MapDataset.source(source)
  if len(source) < process_count:
    raise ValueError(f'{source!r} has fewer examples than the {process_count} processes')
  shard = ds[process_index::process_count]  # disjoint per-process shards
  if train:
    shuffle_seed, augment_seed = derive_seeds(seed, split, 2)
    # shuffle folds the epoch into its seed, so every epoch is reshuffled.
    ds = shard.shuffle(seed=shuffle_seed).repeat()
    if d.get('augment', True):
      # The record rng depends on (seed, global index), so each epoch sees new symmetries.
      ds = ds.random_map(SudokuAugment(), seed=augment_seed)
    ds = ds.batch(batch, drop_remainder=True)
  else:
    ds = pad_for_eval(shard, total=len(source), batch=batch, process_count=process_count)
    ds = ds.batch(batch, drop_remainder=False)
  return finalize(ds.map(SudokuToBatch()), config)
