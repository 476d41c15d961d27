"""The Sudoku Grain pipeline, through its task: batches, determinism, sharding, iterator state."""

from __future__ import annotations

import os

import grain
import numpy as np
import pytest

from hmdlm_jax.configs.base import get_base_config
from hmdlm_jax import tasks
from hmdlm_jax.data import sudoku
from hmdlm_jax.data import sudoku_csv
from hmdlm_jax.data import sudoku_generator
from tests.config_helpers import resolved

N_TRAIN, N_TEST = 60, 21


@pytest.fixture(scope='module')
def csv_paths(tmp_path_factory) -> tuple[str, str]:
  rng = np.random.default_rng(77)
  quiz, sol, _ = sudoku_generator.generate_puzzles(rng, N_TRAIN + N_TEST, min_givens=24,
                                                   max_givens=34, attempts=1)
  folder = tmp_path_factory.mktemp('sudoku_csv')
  train, test = str(folder / 'train.csv'), str(folder / 'test.csv')
  sudoku_csv.write_csv(train, quiz[:N_TRAIN], sol[:N_TRAIN])
  sudoku_csv.write_csv(test, quiz[N_TRAIN:], sol[N_TRAIN:])
  return train, test


def _config(paths: tuple[str, str], *, batch: int = 6, eval_batch: int = 4, augment: bool = True):
  c = get_base_config()
  c.data.kind = 'sudoku'
  c.data.train_path, c.data.test_path = paths
  c.data.batch_size, c.data.eval_batch_size = batch, eval_batch
  c.data.augment = augment
  return c


def _dataset(config, split: str, **kw):
  return tasks.get(resolved(config)).dataset(config, split, **kw)


def _take(it, n: int) -> list[dict[str, np.ndarray]]:
  return [next(it) for _ in range(n)]


def _quizzes(batches) -> list[bytes]:
  """Quiz of each real row (tokens where given, 0 elsewhere) as bytes."""
  out = []
  for b in batches:
    quiz = np.where(b['given'], b['tokens'] + 1, 0).astype(np.uint8)
    out += [q.tobytes() for q, w in zip(quiz, b['weight']) if w > 0]
  return out


def _assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_batch_format_and_labels(csv_paths):
  ds = _dataset(_config(csv_paths), 'train', seed=0, process_index=0, process_count=1)
  assert isinstance(ds, grain.IterDataset)
  for b in _take(iter(ds), 3):
    assert set(b) == {'tokens', 'levels', 'given', 'loss_mask', 'weight'}
    for k, dtype in [('tokens', np.int32), ('levels', np.int32), ('given', np.bool_),
                     ('loss_mask', np.bool_)]:
      assert b[k].shape == (6, 81) and b[k].dtype == dtype, k
    assert b['weight'].shape == (6,) and (b['weight'] == 1).all()
    assert b['tokens'].min() >= 0 and b['tokens'].max() <= 8  # no MASK in clean data
    np.testing.assert_array_equal(b['loss_mask'], ~b['given'])
    # Augmented rows are still valid, uniquely solvable puzzles, labelled as their quiz says.
    sol = (b['tokens'] + 1).astype(np.uint8)
    quiz = np.where(b['given'], sol, 0).astype(np.uint8)
    assert sudoku.is_valid_solution(sol).all()
    count, found = sudoku.count_solutions(quiz)
    np.testing.assert_array_equal(count, 1)
    np.testing.assert_array_equal(found, sol)
    np.testing.assert_array_equal(b['levels'], sudoku.hierarchy_levels(quiz))
    assert (b['levels'][b['given']] == sudoku.GIVEN_LEVEL).all()


def test_train_epochs_cover_data_and_reshuffle(csv_paths):
  ds = _dataset(_config(csv_paths, augment=False), 'train', seed=3, process_index=0,
                   process_count=1)
  batches = _take(iter(ds), 2 * N_TRAIN // 6)  # two epochs exactly
  seen = _quizzes(batches)
  src = sudoku_csv.PalmCsvSource(csv_paths[0])
  everything = sorted(q.tobytes() for q in src.quiz)
  first, second = seen[:N_TRAIN], seen[N_TRAIN:]
  assert sorted(first) == everything and sorted(second) == everything
  assert first != second  # each epoch reshuffled
  assert first != [q.tobytes() for q in src.quiz]  # and not file order


def test_augmentation_varies_per_epoch(csv_paths):
  ds = _dataset(_config(csv_paths), 'train', seed=3, process_index=0, process_count=1)
  batches = _take(iter(ds), 2 * N_TRAIN // 6)
  seen = _quizzes(batches)
  src_set = {q.tobytes() for q in sudoku_csv.PalmCsvSource(csv_paths[0]).quiz}
  assert sum(q in src_set for q in seen) <= 2  # almost surely every row was transformed
  assert len(set(seen)) == len(seen)


def test_determinism_and_seed(csv_paths):
  cfg = _config(csv_paths)
  a = _take(iter(_dataset(cfg, 'train', seed=5, process_index=0, process_count=1)), 4)
  b = _take(iter(_dataset(cfg, 'train', seed=5, process_index=0, process_count=1)), 4)
  c = _take(iter(_dataset(cfg, 'train', seed=6, process_index=0, process_count=1)), 4)
  _assert_batches_equal(a, b)
  assert not np.array_equal(a[0]['tokens'], c[0]['tokens'])


def test_iterator_state_round_trip(csv_paths):
  cfg = _config(csv_paths)
  it = iter(_dataset(cfg, 'train', seed=1, process_index=0, process_count=1))
  _take(it, 5)
  state = it.get_state()
  after = _take(it, 3)
  fresh = iter(_dataset(cfg, 'train', seed=1, process_index=0, process_count=1))
  fresh.set_state(state)
  _assert_batches_equal(_take(fresh, 3), after)
  # Again across the epoch boundary (10 batches per epoch): batches 8..11.
  state = it.get_state()
  after = _take(it, 4)
  fresh = iter(_dataset(cfg, 'train', seed=1, process_index=0, process_count=1))
  fresh.set_state(state)
  _assert_batches_equal(_take(fresh, 4), after)


def test_train_sharding_disjoint_and_covering(csv_paths):
  cfg = _config(csv_paths, augment=False)
  shards = []
  for pi in range(2):
    ds = _dataset(cfg, 'train', seed=0, process_index=pi, process_count=2)
    batches = _take(iter(ds), N_TRAIN // 6)  # one epoch of this shard: 30 rows of 3
    assert batches[0]['tokens'].shape == (3, 81)
    shards.append(_quizzes(batches))
  assert not set(shards[0]) & set(shards[1])
  everything = sorted(q.tobytes() for q in sudoku_csv.PalmCsvSource(csv_paths[0]).quiz)
  assert sorted(shards[0] + shards[1]) == everything


def test_eval_one_pass_padded_and_sharded(csv_paths):
  cfg = _config(csv_paths, eval_batch=4)
  src = sudoku_csv.PalmCsvSource(csv_paths[1])
  per_process = []
  for pi in range(2):
    ds = _dataset(cfg, 'test', seed=0, process_index=pi, process_count=2)
    batches = list(ds)
    # Shards of 11 and 10 rows; both yield ceil(11 / 2) = 6 batches of 2.
    assert len(batches) == 6 and all(b['tokens'].shape == (2, 81) for b in batches)
    weight = np.concatenate([b['weight'] for b in batches])
    assert weight.sum() == (11 if pi == 0 else 10) and (weight[:int(weight.sum())] == 1).all()
    for b in batches:
      np.testing.assert_array_equal(b['loss_mask'], ~b['given'] & (b['weight'] > 0)[:, None])
    per_process.append(_quizzes(batches))
    # No augmentation, file order within the shard.
    assert per_process[-1] == [q.tobytes() for q in src.quiz[pi::2]]
    assert len(list(ds)) == 6  # a fresh pass each time it is iterated
  assert not set(per_process[0]) & set(per_process[1])
  assert sorted(per_process[0] + per_process[1]) == sorted(q.tobytes() for q in src.quiz)


def test_eval_labels_single_process(csv_paths):
  cfg = _config(csv_paths, eval_batch=7)
  batches = list(_dataset(cfg, 'test', seed=0, process_index=0, process_count=1))
  assert len(batches) == 3 and all(b['weight'].all() for b in batches)
  src = sudoku_csv.PalmCsvSource(csv_paths[1])
  levels = np.concatenate([b['levels'] for b in batches])
  np.testing.assert_array_equal(levels, sudoku.hierarchy_levels(src.quiz))
  tokens = np.concatenate([b['tokens'] for b in batches])
  np.testing.assert_array_equal(tokens, src.solution.astype(np.int32) - 1)


def test_generated_source_via_config(tmp_path):
  c = get_base_config()
  c.data.cache_dir = str(tmp_path)
  c.data.num_train_puzzles = 12
  c.data.min_givens, c.data.max_givens, c.data.gen_attempts = 30, 34, 1
  c.data.batch_size = 4
  b = next(iter(_dataset(c, 'train', seed=0, process_index=0, process_count=1)))
  assert b['tokens'].shape == (4, 81)
  path = sudoku_generator.cache_path(str(tmp_path), 0, 12, 'train', 30, 34, 1)
  assert os.listdir(tmp_path) == [os.path.basename(path)]
  givens = (sudoku_csv.read_puzzles(path)[0] > 0).sum(-1)
  assert ((givens >= 30) & (givens <= 34)).all()


def test_default_process_from_jax(csv_paths):
  import jax  # pylint: disable=g-import-not-at-top
  cfg = _config(csv_paths)
  a = _take(iter(_dataset(cfg, 'train', seed=2)), 1)
  b = _take(iter(_dataset(cfg, 'train', seed=2, process_index=jax.process_index(),
                             process_count=jax.process_count())), 1)
  _assert_batches_equal(a, b)


@pytest.mark.parametrize('field,value,split,match', [
    ('batch_size', 7, 'train', 'data.batch_size=7'),
    ('eval_batch_size', 5, 'test', 'data.eval_batch_size=5'),
    ('kind', 'nonsense', 'train', "data.kind='nonsense'.*sudoku"),
    ('train_path', '/does/not/exist.csv', 'train', 'data.train_path'),
])
def test_config_errors(csv_paths, field, value, split, match):
  cfg = _config(csv_paths)
  cfg.data[field] = value
  with pytest.raises(ValueError, match=match):
    _dataset(cfg, split, seed=0, process_index=0, process_count=2)


def test_bad_split_and_process(csv_paths):
  cfg = _config(csv_paths)
  with pytest.raises(ValueError, match="'train', 'test'"):
    _dataset(cfg, 'validation', seed=0, process_index=0, process_count=1)
  with pytest.raises(ValueError, match='process_index'):
    _dataset(cfg, 'train', seed=0, process_index=2, process_count=2)
  with pytest.raises(ValueError, match='seed'):
    _dataset(cfg, 'train', seed=-1, process_index=0, process_count=1)
