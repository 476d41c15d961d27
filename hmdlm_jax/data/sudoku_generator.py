"""Sudoku puzzle generator (docs/method.md §6) and the cache of generated Palm CSVs.

Generated puzzles (`generate_puzzles`): random full grid, target given count t ~ U{17..34} (Palm et
al.'s 'sudoku-hard' spans 17-34 givens), clues removed in random order while the solution stays
unique. Random removal ends at minimal puzzles, so low targets are missed; several removal orders
per missed puzzle (`attempts`) bring most of them closer, and the fewest-clue puzzles would need
dedicated searches. The reached distribution of givens and of blank cells by level
(`scripts/sudoku_levels.py` prints both) and the generation speed: docs/method.md §6. The result
is identical for any number of worker processes. Generation is slow enough that sets are cached
as Palm CSVs, and training streams an effectively infinite set by applying a fresh random
symmetry to every base puzzle in every epoch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import time
from typing import Iterable

import numpy as np

from hmdlm_jax import parent_watch
from hmdlm_jax import progress as progress_lib
from hmdlm_jax.data import sudoku
from hmdlm_jax.data import sudoku_csv

# Bump when the generator's algorithm changes: it is part of the cache key.
GENERATOR_VERSION = 1
# Puzzles per independently seeded generation chunk; fixed so that a (seed, count, split) always
# yields the same puzzles whatever the number of worker processes.
_CHUNK = 256


@dataclasses.dataclass(frozen=True)
class GenStats:
  """What a generation run reached (for the docs and scripts/sudoku_levels.py)."""
  count: int
  seconds: float
  givens_hist: dict[int, int]

  @property
  def puzzles_per_s(self) -> float:
    return self.count / max(self.seconds, 1e-9)


def random_full_grids(rng: np.random.Generator, n: int) -> np.ndarray:
  """`uint8 [n, 81]` random complete grids: random diagonal boxes, then randomised search.

  The three diagonal boxes never constrain each other, so they are drawn as independent random
  permutations; the rest is completed by search with uniformly random branching digits.
  Not exactly uniform over all 6.7e21 grids, but every grid has positive probability.
  """
  masks = np.full((n, sudoku.NUM_CELLS), sudoku.ALL_DIGITS, np.uint16)
  for b in (0, 4, 8):
    cells = sudoku.UNIT_CELLS[18 + b]
    perms = rng.permuted(np.tile(np.arange(9), (n, 1)), axis=1)
    masks[:, cells] = (np.uint16(1) << perms.astype(np.uint16)).astype(np.uint16)
  count, grid = sudoku.search(masks, limit=1, rng=rng)
  if not (count == 1).all():
    raise RuntimeError('random grid completion failed (a diagonal-box fill is always completable)')
  return grid


def _remove_clues(solution: np.ndarray, target: np.ndarray, order: np.ndarray) -> np.ndarray:
  """Remove cells of full grids `[n, 81]` in `order` `[n, 81]` while the puzzle stays unique.

  Stops at `target` `[n]` givens or after every cell was tried (the puzzle is then minimal: a cell
  whose removal broke uniqueness would break it again after further removals). Removing cell c keeps
  uniqueness iff no solution has a digit other than the known solution's at c, so each check is one
  search for a single solution with that digit struck from c's candidates.
  Returns the given mask `bool [n, 81]`.
  """
  n = solution.shape[0]
  given = np.ones((n, sudoku.NUM_CELLS), bool)
  num_given = np.full(n, sudoku.NUM_CELLS)
  sol_bits = sudoku.digits_to_masks(solution)
  for j in range(sudoku.NUM_CELLS):
    idx = np.flatnonzero(num_given > target)
    if not idx.size:
      break
    cell = order[idx, j]
    rows = np.arange(idx.size)
    masks = np.where(given[idx], sol_bits[idx], sudoku.ALL_DIGITS)
    masks[rows, cell] = sudoku.ALL_DIGITS & ~sol_bits[idx, cell]
    other, _ = sudoku.search(masks, limit=1)
    ok = other == 0  # no solution that differs at `cell` -> still unique
    given[idx[ok], cell[ok]] = False
    num_given[idx[ok]] -= 1
  return given


def generate_puzzles(rng: np.random.Generator, n: int, *, min_givens: int = 17,
                     max_givens: int = 34,
                     attempts: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`n` uniquely solvable puzzles -> (quiz `uint8 [n, 81]`, solution `uint8 [n, 81]`, target `[n]`).

  For each puzzle: a random full grid and a target given count t ~ U{min_givens..max_givens}; cells
  are removed in a random order while the puzzle stays uniquely solvable, until t givens remain
  (`_remove_clues`). When the removal ends at a minimal puzzle with more than t givens, it is
  repeated from the full grid with `attempts - 1` fresh random orders, and the first puzzle with
  the fewest givens is kept. Random removal yields minimal puzzles with 21-28 givens
  (mode 24), so targets below ~22 end above the target: see scripts/sudoku_levels.py.
  """
  if not 17 <= min_givens <= max_givens <= 81:
    raise ValueError(f'need 17 <= data.min_givens <= data.max_givens <= 81, got '
                     f'{min_givens}, {max_givens}')
  if attempts < 1:
    raise ValueError(f'data.gen_attempts must be >= 1, got {attempts}')
  solution = random_full_grids(rng, n)
  target = rng.integers(min_givens, max_givens + 1, size=n)
  order = rng.permuted(np.tile(np.arange(sudoku.NUM_CELLS), (n, 1)), axis=1)
  given = _remove_clues(solution, target, order)
  idx = np.flatnonzero(given.sum(-1) > target)
  if idx.size and attempts > 1:
    # The other attempts of all missed puzzles run side by side: one lockstep pass, not many.
    rep = np.repeat(idx, attempts - 1)
    order = rng.permuted(np.tile(np.arange(sudoku.NUM_CELLS), (rep.size, 1)), axis=1)
    tries = _remove_clues(solution[rep], target[rep], order).reshape(idx.size, attempts - 1, -1)
    tries = np.concatenate([given[idx, None], tries], axis=1)  # [m, attempts, 81]
    best = np.argmin(tries.sum(-1), axis=1)  # first attempt with the fewest givens
    given[idx] = tries[np.arange(idx.size), best]
  quiz = np.where(given, solution, 0).astype(np.uint8)
  return quiz, solution, target


def _generate_chunk(args: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
  seed, split_id, chunk, n, lo, hi, attempts = args
  rng = np.random.default_rng(np.random.SeedSequence([seed, split_id, chunk, GENERATOR_VERSION]))
  quiz, sol, _ = generate_puzzles(rng, n, min_givens=lo, max_givens=hi, attempts=attempts)
  return quiz, sol


def generate_dataset(seed: int, count: int, split: str, *, min_givens: int = 17,
                     max_givens: int = 34, attempts: int = 8, processes: int = 1,
                     progress: bool = True) -> tuple[np.ndarray, np.ndarray, GenStats]:
  """Deterministic puzzle set for (seed, count, split, givens range, attempts), in chunks of 256.

  Chunk c is seeded with SeedSequence([seed, split index, c, GENERATOR_VERSION]), so the result does
  not depend on `processes`; train and test use independent seed streams (a puzzle in both is
  astronomically unlikely).
  Returns (quiz `uint8 [count, 81]`, solution `uint8 [count, 81]`, stats).
  """
  if split not in sudoku.SPLITS:
    raise ValueError(f'split must be one of {sudoku.SPLITS}, got {split!r}')
  if count <= 0:
    raise ValueError(f'puzzle count must be positive, got {count}')
  if processes < 1:
    raise ValueError(f'data.gen_processes must be >= 1, got {processes}')
  split_id = sudoku.SPLITS.index(split)
  jobs = [(seed, split_id, c, min(_CHUNK, count - c * _CHUNK), min_givens, max_givens, attempts)
          for c in range(-(-count // _CHUNK))]
  start = time.perf_counter()
  quizzes, sols = [], []
  with contextlib.ExitStack() as stack:
    bar = stack.enter_context(progress_lib.bar(desc=f'generating {split} sudoku',
                                               unit='puzzle', total=count, enabled=progress))
    if processes > 1:
      pool = stack.enter_context(multiprocessing.get_context('spawn').Pool(
          processes, initializer=parent_watch.initializer()))
      results: Iterable[tuple[np.ndarray, np.ndarray]] = pool.imap(_generate_chunk, jobs)
    else:
      results = map(_generate_chunk, jobs)
    for q, s in results:
      quizzes.append(q)
      sols.append(s)
      bar.update(len(q))
  quiz, sol = np.concatenate(quizzes), np.concatenate(sols)
  givens = (quiz > 0).sum(-1)
  hist = {int(k): int(v) for k, v in zip(*np.unique(givens, return_counts=True))}
  return quiz, sol, GenStats(count, time.perf_counter() - start, hist)



def cache_path(cache_dir: str, seed: int, count: int, split: str, min_givens: int,
               max_givens: int, attempts: int) -> str:
  """Cache file of a generated set: every argument of `generate_dataset` that changes it."""
  name = (f'sudoku_v{GENERATOR_VERSION}_{split}_seed{seed}_n{count}'
          f'_givens{min_givens}-{max_givens}_att{attempts}.csv')
  return os.path.join(os.path.expanduser(cache_dir), name)


def default_cache_dir() -> str:
  return os.path.join(os.path.expanduser('~'), '.cache', 'hmdlm_jax', 'sudoku')


def generated_csv(seed: int, count: int, split: str, *, cache_dir: str = '', min_givens: int = 17,
                  max_givens: int = 34, attempts: int = 8, processes: int = 1,
                  progress: bool = True) -> str:
  """Path of the cached Palm CSV of a generated set, generating and writing it if absent."""
  path = cache_path(cache_dir or default_cache_dir(), seed, count, split, min_givens, max_givens,
                    attempts)
  if not os.path.exists(path):
    quiz, sol, _ = generate_dataset(seed, count, split, min_givens=min_givens,
                                    max_givens=max_givens, attempts=attempts,
                                    processes=processes, progress=progress)
    sudoku_csv.write_csv(path, quiz, sol)
  return path
