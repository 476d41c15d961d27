"""The Sudoku Grain pipeline: Palm CSV (given or generated) -> symmetries -> model batches.

Split semantics as hmdlm_jax/data/pipeline.py; batches are `[B_local, 81]`.
"""

from __future__ import annotations


import chex
import grain
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax import storage
from hmdlm_jax.data import pipeline
from hmdlm_jax.data import sudoku
from hmdlm_jax.data import sudoku_csv
from hmdlm_jax.data import sudoku_generator


def sudoku_batch(quiz: np.ndarray, solution: np.ndarray | None = None,
                 valid: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """The model batch of digit grids (docs/design.md batch contract).

  Args:
    quiz: digits [N, 81] (0 = blank).
    solution: digits [N, 81], or None: the blanks then hold MASK in `tokens` (the sampler never
      sees them).
    valid: bool [N] real rows (False = eval padding), or None for all.

  Returns:
    tokens int32 [N, 81] (solution digit - 1); levels int32 [N, 81] (`sudoku.hierarchy_levels`,
    givens level 5); given bool [N, 81] (quiz != 0); loss_mask bool [N, 81] (~given on real
    rows, all False on padding rows); weight float32 [N] (valid as 1 / 0).
  """
  quiz = np.asarray(quiz)
  chex.assert_rank(quiz, 2)
  chex.assert_axis_dimension(quiz, 1, sudoku.NUM_CELLS)
  valid = np.ones(quiz.shape[0], bool) if valid is None else np.asarray(valid, bool)
  given = quiz > 0
  if solution is None:
    tokens = np.where(given, quiz.astype(np.int32) - 1, sudoku.MASK_ID)
  else:
    chex.assert_equal_shape([quiz, solution])
    tokens = sudoku.to_tokens(solution)
  return {
      'tokens': tokens.astype(np.int32),
      'levels': sudoku.hierarchy_levels(quiz),
      'given': given,
      'loss_mask': ~given & valid[:, None],
      'weight': valid.astype(np.float32),
  }


class SudokuAugment(grain.transforms.RandomMap):
  """Per-record random symmetry applied jointly to quiz and solution (docs/method.md §6)."""

  def random_map(self, element: dict[str, np.ndarray],
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    quiz, solution = sudoku.augment(element['quiz'], element['solution'], rng)
    return {**element, 'quiz': quiz, 'solution': solution}


class SudokuToBatch(grain.transforms.Map):
  """Batched records {quiz, solution[, valid]} `[B, 81]` -> `sudoku_batch` (labels made here)."""

  def map(self, element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return sudoku_batch(element['quiz'], element['solution'], element.get('valid'))


def sudoku_source(config: config_lib.Config, split: str,
                  progress: bool = True) -> sudoku_csv.PalmCsvSource:
  """The split's Palm CSV: `data.train_path` / `data.test_path`, else the cached generated set.

  Generated sets read `data.gen_seed`, `data.num_train_puzzles`, `data.num_test_puzzles`,
  `data.min_givens`, `data.max_givens`, `data.gen_attempts`, `data.gen_processes` and
  `data.cache_dir`.
  """
  if split not in sudoku.SPLITS:
    raise ValueError(f'split must be one of {sudoku.SPLITS} for data.kind=sudoku, got {split!r}')
  d = config.data
  path = getattr(d, f'{split}_path')
  if path:
    if not storage.isfile(path):
      raise ValueError(f'data.{split}_path={path!r} is not a file')
    return sudoku_csv.PalmCsvSource(path)
  count_field = f'num_{split}_puzzles'
  count = int(getattr(d, count_field))
  if count <= 0:
    raise ValueError(f'data.{count_field} must be positive, got {count}')
  path = sudoku_generator.generated_csv(
      int(d.gen_seed), count, split, cache_dir=d.cache_dir, min_givens=int(d.min_givens),
      max_givens=int(d.max_givens), attempts=int(d.gen_attempts),
      processes=int(d.gen_processes), progress=progress)
  return sudoku_csv.PalmCsvSource(path)


def make_sudoku_dataset(config: config_lib.Config, split: str, *, seed: int,
                        process_index: int, process_count: int) -> grain.IterDataset:
  """Sudoku batches `[B_local, 81]` (split semantics of hmdlm_jax/data/pipeline.py)."""
  source = sudoku_source(config, split)
  d = config.data
  train = split == 'train'
  field = 'data.batch_size' if train else 'data.eval_batch_size'
  batch = pipeline.local_batch_size(d.batch_size if train else d.eval_batch_size, process_count,
                                    field)
  ds = grain.MapDataset.source(source)
  if len(source) < process_count:
    raise ValueError(f'{source!r} has fewer examples than the {process_count} processes')
  shard = ds[process_index::process_count]  # disjoint per-process shards
  if train:
    shuffle_seed, augment_seed = pipeline.derive_seeds(seed, split, 2)
    # shuffle folds the epoch into its seed, so every epoch is reshuffled.
    ds = shard.shuffle(seed=shuffle_seed).repeat()
    if d.augment:
      # The record rng depends on (seed, global index), so each epoch sees new symmetries.
      ds = ds.random_map(SudokuAugment(), seed=augment_seed)
    ds = ds.batch(batch, drop_remainder=True)
  else:
    ds = pipeline.pad_for_eval(shard, total=len(source), batch=batch, process_count=process_count)
    ds = ds.batch(batch, drop_remainder=False)
  return pipeline.finalize(ds.map(SudokuToBatch()), config)
