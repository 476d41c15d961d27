"""Sudoku data (SPEC 6): encoding, solver, generator, Palm CSV source, hierarchy labels, symmetries.

Grids are flat `uint8 [..., 81]` in row-major order, digits 1..9 and 0 = blank (Palm et al. 2018's
`quiz,solution` CSV format). Model tokens are `digit - 1`, so digits 1..9 become tokens 0..8 and the
MASK token is 9: the model config uses `vocab_size = VOCAB_SIZE = 10`, `mask_id = MASK_ID = 9`, and
`num_levels = NUM_LEVELS = 6`.

Solver and propagation work on candidate bitmasks `uint16 [N, 81]` (bit d-1 set = digit d still
possible), vectorised over N puzzles: one round of naked singles + hidden singles is a handful of
numpy ops on [N, 81] / [N, 27, 9] arrays, and the depth-first search runs all N searches in lockstep,
one node per puzzle per iteration, with an explicit stack per puzzle.

Hierarchy labels (SPEC 6, K = 6), see `hierarchy_levels`:
  round r = 1, 2, ...: from the grid at the START of the round (givens + cells filled in earlier
  rounds), a blank cell is determined when it is a naked single (exactly one digit is absent from its
  row, column and box) or a hidden single (some digit that is not yet placed in one of its units has
  this cell as its only candidate cell in that unit; candidates as for naked singles). All cells
  determined in round r are filled together and get level max(0, 6 - r). Round 1 -> level 5, ...,
  round 5 -> level 1; cells first determined in round >= 6, or never, get level 0. Givens get level 5
  (the level whose embedding they carry); they are never masked and carry no loss.

Generated puzzles (`generate_puzzles`): random full grid, target given count t ~ U{17..34} (Palm et
al.'s 'sudoku-hard' spans 17-34 givens), clues removed in random order while the solution stays
unique. Random removal ends at minimal puzzles of 21-28 givens (mode 24), so targets below that are
missed; 8 removal orders per missed puzzle (`attempts`) bring most of them to 22-23 givens. Reached
distribution for the defaults (2048 puzzles, seed 0): 21: 0.2%, 22: 8.6%, 23: 23.8%, 24: 11.2%,
25..34: about 5.5% each; no puzzle below 21 (17-20-clue puzzles need dedicated searches). Blank
cells by level: 5: 14.4%, 4: 11.2%, 3: 9.2%, 2: 7.6%, 1: 6.5%, 0: 51.1%
(`scripts/sudoku_levels.py` prints these). Speed on one CPU core: about 130-150 puzzles/s with
attempts=8, 500-800 puzzles/s with attempts=1; the result is identical for any number of worker
processes. Because generation costs minutes for ~20k puzzles, sets are cached as Palm CSVs, and
training streams an effectively infinite set by applying a fresh random symmetry (1.2e12 of them)
to every base puzzle in every epoch.

Symmetries (SPEC 6): digit relabelling, row permutations within bands, column permutations within
stacks, band permutations, stack permutations, transpose. They map rows/columns/boxes onto
rows/columns/boxes, so they preserve validity, the number of solutions and the hierarchy levels.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import tempfile
import time
from typing import Iterable

import numpy as np
import tqdm

VOCAB_SIZE = 10  # tokens 0..8 = digits 1..9, plus MASK
MASK_ID = 9
NUM_LEVELS = 6  # K (SPEC 6)
GIVEN_LEVEL = NUM_LEVELS - 1  # givens carry the level-5 embedding
NUM_CELLS = 81
ALL_DIGITS = np.uint16(0x1FF)
SPLITS = ('train', 'test')
# Bump when the generator's algorithm changes: it is part of the cache key.
GENERATOR_VERSION = 1
# Puzzles per independently seeded generation chunk; fixed so that a (seed, count, split) always
# yields the same puzzles whatever the number of worker processes.
_CHUNK = 256


# ----------------------------------------------------------------------------------------------
# Geometry tables.

def _build_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  cells = np.arange(NUM_CELLS)
  row, col = cells // 9, cells % 9
  box = (row // 3) * 3 + col // 3
  unit_cells = np.concatenate([
      np.stack([np.flatnonzero(row == i) for i in range(9)]),
      np.stack([np.flatnonzero(col == i) for i in range(9)]),
      np.stack([np.flatnonzero(box == i) for i in range(9)]),
  ])  # [27, 9]: rows 0..8, columns 9..17, boxes 18..26
  cell_units = np.stack([row, 9 + col, 18 + box], axis=1)  # [81, 3]
  popcount = np.array([bin(m).count('1') for m in range(512)], np.int8)
  return unit_cells, cell_units, popcount


UNIT_CELLS, CELL_UNITS, _POPCOUNT = _build_tables()
_DIGIT_BITS = np.array([0] + [1 << d for d in range(9)], np.uint16)  # digit 0..9 -> its bit
# Bit value (1 << d) -> digit d + 1; zero elsewhere (only used on single-bit masks).
_BIT_TO_DIGIT = np.zeros(512, np.uint8)
_BIT_TO_DIGIT[1 << np.arange(9)] = np.arange(1, 10)
# k-th set bit of each mask, for random branching: [512, 9] (garbage past popcount).
_NTH_BIT = np.zeros((512, 9), np.uint16)
for _m in range(512):
  _bits = [1 << d for d in range(9) if _m >> d & 1]
  _NTH_BIT[_m, :len(_bits)] = _bits


def popcount(masks: np.ndarray) -> np.ndarray:
  """Number of candidate digits in each 9-bit mask (any shape, uint16)."""
  return _POPCOUNT[masks]


def digits_to_masks(grid: np.ndarray) -> np.ndarray:
  """`[..., 81]` digits (0 = blank) -> candidate bitmasks `uint16 [..., 81]` (blank = all nine)."""
  grid = np.asarray(grid)
  return np.where(grid > 0, _DIGIT_BITS[grid.astype(np.intp)], ALL_DIGITS).astype(np.uint16)


def masks_to_digits(masks: np.ndarray) -> np.ndarray:
  """Single-bit masks -> digits `uint8`; cells with 0 or >1 candidates become 0."""
  return np.where(popcount(masks) == 1, _BIT_TO_DIGIT[masks], 0).astype(np.uint8)


def _once_twice(unit_masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """`[..., 27, 9]` masks -> (bits set in >= 1 cell, bits set in >= 2 cells), each `[..., 27]`.

  Pairwise tree over the nine cells: (o, t) of two halves combine to (o1|o2, t1|t2|(o1&o2)).
  """
  a, b = unit_masks[..., 0:8:2], unit_masks[..., 1:8:2]
  o, t = a | b, a & b  # 4 pairs
  o1, o2, t1, t2 = o[..., 0:4:2], o[..., 1:4:2], t[..., 0:4:2], t[..., 1:4:2]
  o, t = o1 | o2, t1 | t2 | (o1 & o2)  # 2 quads
  o1, o2, t1, t2 = o[..., 0], o[..., 1], t[..., 0], t[..., 1]
  o, t = o1 | o2, t1 | t2 | (o1 & o2)  # cells 0..7
  x = unit_masks[..., 8]
  return o | x, t | (o & x)


def _per_cell(unit_values: np.ndarray) -> np.ndarray:
  """OR of a `[..., 27]` per-unit mask over each cell's three units -> `[..., 81]`."""
  u = unit_values[..., CELL_UNITS]  # [..., 81, 3]
  return u[..., 0] | u[..., 1] | u[..., 2]


# ----------------------------------------------------------------------------------------------
# Propagation and search.

def propagate(masks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Naked + hidden singles to a fixpoint, vectorised over puzzles.

  Args:
    masks: candidate bitmasks `uint16 [N, 81]`.
  Returns:
    (masks `uint16 [N, 81]` at the fixpoint, dead `bool [N]` (a contradiction was found: an empty
    cell, a digit twice or nowhere in a unit, or a cell that must take two digits),
    solved `bool [N]` (every cell single and no contradiction)).
  """
  masks = np.array(masks, np.uint16, copy=True)
  n = masks.shape[0]
  dead = np.zeros(n, bool)
  todo = np.arange(n)
  while todo.size:
    x = masks[todo]
    single = np.where(_POPCOUNT[x] == 1, x, np.uint16(0))
    placed = np.bitwise_or.reduce(single[:, UNIT_CELLS], axis=-1)  # [m, 27]
    # A placed digit leaves all peers; a cell's own single survives.
    x2 = x & ~(_per_cell(placed) & ~single)
    c_once, c_twice = _once_twice(x2[:, UNIT_CELLS])
    hidden = (x2 & _per_cell(c_once & ~c_twice)
              & np.where(_POPCOUNT[x2] > 1, ALL_DIGITS, np.uint16(0)))
    hid_pc = _POPCOUNT[hidden]
    x3 = np.where(hid_pc > 0, hidden, x2)
    # A placed digit still present twice in a unit means two cells hold it (the others lost it).
    bad = (((placed & c_twice) != 0).any(-1) | (c_once != ALL_DIGITS).any(-1)
           | (hid_pc > 1).any(-1) | (x3 == 0).any(-1))
    changed = (x3 != x).any(-1)
    masks[todo] = x3
    dead[todo] |= bad
    todo = todo[changed & ~bad]
  solved = ~dead & (_POPCOUNT[masks] == 1).all(-1)
  return masks, dead, solved


def search(masks: np.ndarray, *, limit: int = 2, rng: np.random.Generator | None = None,
           max_nodes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Depth-first search for up to `limit` solutions of each puzzle, all puzzles in lockstep.

  Each node propagates (naked + hidden singles) and branches on a cell with the fewest candidates:
  'cell = d' is explored before 'cell != d', where d is the lowest candidate, or a uniformly random
  one when `rng` is given (used to draw random full grids).

  Args:
    masks: candidate bitmasks `uint16 [N, 81]`.
    limit: stop a puzzle's search once this many solutions are found.
    rng: optional generator for random branching digits.
    max_nodes: optional cap on search iterations (raises RuntimeError when exceeded).
  Returns:
    (count `int32 [N]` = min(#solutions, limit), first solution found `uint8 [N, 81]`, 0 if none).
  """
  masks = np.asarray(masks, np.uint16)
  if masks.ndim != 2 or masks.shape[1] != NUM_CELLS:
    raise ValueError(f'search expects masks of shape [N, 81], got {masks.shape}')
  n = masks.shape[0]
  depth = 16
  stack = np.zeros((n, depth, NUM_CELLS), np.uint16)
  stack[:, 0] = masks
  sp = np.ones(n, np.int64)  # stack sizes
  count = np.zeros(n, np.int32)
  first = np.zeros((n, NUM_CELLS), np.uint8)
  it = 0
  while True:
    idx = np.flatnonzero((sp > 0) & (count < limit))
    if not idx.size:
      break
    it += 1
    if max_nodes is not None and it > max_nodes:
      raise RuntimeError(f'sudoku search exceeded max_nodes={max_nodes}')
    sp[idx] -= 1
    x, dead, solved = propagate(stack[idx, sp[idx]])
    s_idx = idx[solved]
    new_first = s_idx[count[s_idx] == 0]
    first[new_first] = masks_to_digits(x[solved][count[s_idx] == 0])
    count[s_idx] += 1
    open_ = ~dead & ~solved
    if not open_.any():
      continue
    o_idx, xo = idx[open_], x[open_]
    pc = _POPCOUNT[xo].astype(np.int16)
    cell = np.argmin(np.where(pc > 1, pc, 99), axis=-1)
    rows = np.arange(o_idx.size)
    cand = xo[rows, cell]
    if rng is None:
      bit = cand & (~cand + np.uint16(1))  # lowest set bit
    else:
      k = np.floor(rng.random(o_idx.size) * pc[rows, cell]).astype(np.int64)
      bit = _NTH_BIT[cand, k]
    take, skip = xo.copy(), xo
    take[rows, cell] = bit
    skip[rows, cell] = cand & ~bit
    if sp.max() + 2 > depth:
      stack = np.concatenate([stack, np.zeros_like(stack)], axis=1)
      depth *= 2
    stack[o_idx, sp[o_idx]] = skip
    stack[o_idx, sp[o_idx] + 1] = take  # explored first
    sp[o_idx] += 2
  return count, first


def count_solutions(quizzes: np.ndarray, limit: int = 2) -> tuple[np.ndarray, np.ndarray]:
  """Number of solutions (capped at `limit`) of `[N, 81]` (or one `[81]`) quizzes, 0 = blank.

  Returns (count `int32 [N]`, a solution `uint8 [N, 81]` where count >= 1, else zeros).
  """
  q = np.asarray(quizzes)
  one = q.ndim == 1
  q = np.atleast_2d(q)
  _check_digits(q, 'quizzes', allow_blank=True)
  count, sol = search(digits_to_masks(q), limit=limit)
  return (count[0], sol[0]) if one else (count, sol)


# ----------------------------------------------------------------------------------------------
# Validation helpers.

def _check_digits(grid: np.ndarray, name: str, *, allow_blank: bool) -> None:
  if grid.shape[-1] != NUM_CELLS:
    raise ValueError(f'{name} must have 81 cells in the last axis, got shape {grid.shape}')
  lo = 0 if allow_blank else 1
  if grid.size and (grid.min() < lo or grid.max() > 9):
    raise ValueError(f'{name} digits must lie in {lo}..9')


def is_valid_solution(grid: np.ndarray) -> np.ndarray:
  """`[..., 81]` digits -> `bool [...]`: every row, column and box holds 1..9 exactly once."""
  g = np.asarray(grid)
  ok_digit = ((g >= 1) & (g <= 9)).all(-1)
  bits = _DIGIT_BITS[np.clip(g, 0, 9).astype(np.intp)]  # 0 (blank / out of range) -> no bit
  once, _ = _once_twice(bits[..., UNIT_CELLS])  # nine cells covering nine digits: all distinct
  return ok_digit & (once == ALL_DIGITS).all(-1)


# ----------------------------------------------------------------------------------------------
# Hierarchy labels (SPEC 6).

def hierarchy_levels(quiz: np.ndarray) -> np.ndarray:
  """Level of every cell of `[..., 81]` quizzes (0 = blank) -> `int32 [..., 81]` in 0..5.

  Rounds of simultaneous naked + hidden singles from the givens (module docstring): a cell first
  determined in round r gets level max(0, 6 - r); givens get level 5; cells not determined within
  five rounds get level 0 (rounds >= 6 all map to level 0, so five rounds suffice).
  Raises ValueError when the givens, or the digits a round deduces, repeat a digit in a unit or
  force one cell to two digits (the quiz has no solution).
  """
  quiz = np.asarray(quiz)
  _check_digits(quiz, 'quiz', allow_blank=True)
  shape = quiz.shape
  q = quiz.reshape(-1, NUM_CELLS)
  filled = q > 0
  vals = np.where(filled, digits_to_masks(q), np.uint16(0))
  levels = np.where(filled, GIVEN_LEVEL, 0).astype(np.int32)
  for r in range(1, NUM_LEVELS + 1):
    used, repeated = _once_twice(vals[:, UNIT_CELLS])  # [N, 27]
    if (repeated != 0).any():
      raise ValueError('quiz is contradictory: a digit repeats in a row, column or box'
                       + ('' if r == 1 else f' after round {r - 1} of singles'))
    if r == NUM_LEVELS:
      break  # the last pass only checks round 5's digits
    cand = np.where(filled, np.uint16(0), ~_per_cell(used) & ALL_DIGITS)
    naked = ~filled & (_POPCOUNT[cand] == 1)
    once, twice = _once_twice(cand[:, UNIT_CELLS])
    hidden = cand & _per_cell(once & ~twice)  # ⊆ cand, so it agrees with a naked single
    if (_POPCOUNT[hidden] > 1).any():
      raise ValueError(f'quiz is contradictory: round {r} of singles forces a cell to two digits')
    determined = naked | (hidden != 0)
    levels[determined] = NUM_LEVELS - r  # round r -> level 6 - r (SPEC 6)
    vals = np.where(determined, np.where(naked, cand, hidden), vals)
    filled = filled | determined
  return levels.reshape(shape)


# ----------------------------------------------------------------------------------------------
# Symmetries (SPEC 6).

@dataclasses.dataclass(frozen=True)
class Symmetry:
  """A Sudoku symmetry: `new[k] = digit_perm[old[cell_perm[k]]]` on flat `[81]` grids."""
  cell_perm: np.ndarray  # int64 [81]
  digit_perm: np.ndarray  # uint8 [10], digit_perm[0] == 0

  def apply_grid(self, grid: np.ndarray) -> np.ndarray:
    """Relabel digits and move cells of `[..., 81]` digit grids (0 stays blank)."""
    return self.digit_perm[np.asarray(grid)[..., self.cell_perm]]

  def apply_cells(self, values: np.ndarray) -> np.ndarray:
    """Move per-cell values `[..., 81]` (levels, masks) without relabelling."""
    return np.asarray(values)[..., self.cell_perm]


def random_symmetry(rng: np.random.Generator) -> Symmetry:
  """Uniform over the 9!·(3!)^8·2 ≈ 1.2e12 relabel/row/column/band/stack/transpose combinations."""
  band, stack = rng.permutation(3), rng.permutation(3)
  rows = np.concatenate([3 * band[b] + rng.permutation(3) for b in range(3)])
  cols = np.concatenate([3 * stack[s] + rng.permutation(3) for s in range(3)])
  idx = rows[:, None] * 9 + cols[None, :]  # new (i, j) <- old (rows[i], cols[j])
  if rng.random() < 0.5:
    idx = idx.T
  digit_perm = np.concatenate([[0], rng.permutation(9) + 1]).astype(np.uint8)
  return Symmetry(cell_perm=idx.reshape(-1).astype(np.int64), digit_perm=digit_perm)


def augment(quiz: np.ndarray, solution: np.ndarray,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """Apply one random symmetry jointly to a `[81]` quiz and its `[81]` solution."""
  sym = random_symmetry(rng)
  return sym.apply_grid(quiz), sym.apply_grid(solution)


# ----------------------------------------------------------------------------------------------
# Generator.

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
  masks = np.full((n, NUM_CELLS), ALL_DIGITS, np.uint16)
  for b in (0, 4, 8):
    cells = UNIT_CELLS[18 + b]
    perms = rng.permuted(np.tile(np.arange(9), (n, 1)), axis=1)
    masks[:, cells] = (np.uint16(1) << perms.astype(np.uint16)).astype(np.uint16)
  count, grid = search(masks, limit=1, rng=rng)
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
  given = np.ones((n, NUM_CELLS), bool)
  num_given = np.full(n, NUM_CELLS)
  sol_bits = digits_to_masks(solution)
  for j in range(NUM_CELLS):
    idx = np.flatnonzero(num_given > target)
    if not idx.size:
      break
    cell = order[idx, j]
    rows = np.arange(idx.size)
    masks = np.where(given[idx], sol_bits[idx], ALL_DIGITS)
    masks[rows, cell] = ALL_DIGITS & ~sol_bits[idx, cell]
    other, _ = search(masks, limit=1)
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
  order = rng.permuted(np.tile(np.arange(NUM_CELLS), (n, 1)), axis=1)
  given = _remove_clues(solution, target, order)
  idx = np.flatnonzero(given.sum(-1) > target)
  if idx.size and attempts > 1:
    # The other attempts of all missed puzzles run side by side: one lockstep pass, not many.
    rep = np.repeat(idx, attempts - 1)
    order = rng.permuted(np.tile(np.arange(NUM_CELLS), (rep.size, 1)), axis=1)
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
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
  if count <= 0:
    raise ValueError(f'puzzle count must be positive, got {count}')
  if processes < 1:
    raise ValueError(f'data.gen_processes must be >= 1, got {processes}')
  split_id = SPLITS.index(split)
  jobs = [(seed, split_id, c, min(_CHUNK, count - c * _CHUNK), min_givens, max_givens, attempts)
          for c in range(-(-count // _CHUNK))]
  start = time.perf_counter()
  quizzes, sols = [], []
  with contextlib.ExitStack() as stack:
    bar = stack.enter_context(_progress(total=count, desc=f'generating {split} sudoku',
                                        enabled=progress))
    if processes > 1:
      pool = stack.enter_context(multiprocessing.get_context('spawn').Pool(processes))
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


def _progress(total: int, desc: str, enabled: bool) -> tqdm.tqdm:
  return tqdm.tqdm(total=total, desc=desc, unit='puzzle', disable=not enabled)


# ----------------------------------------------------------------------------------------------
# Palm CSV format.

def _to_ascii(grid: np.ndarray) -> np.ndarray:
  return (np.asarray(grid, np.uint8) + ord('0')).astype(np.uint8)


def write_csv(path: str, quiz: np.ndarray, solution: np.ndarray) -> None:
  """Write `quiz,solution` rows atomically (temp file in the same folder + os.replace)."""
  quiz, solution = np.asarray(quiz), np.asarray(solution)
  if quiz.shape != solution.shape or quiz.ndim != 2 or quiz.shape[1] != NUM_CELLS:
    raise ValueError(f'quiz and solution must both be [N, 81], got {quiz.shape}, {solution.shape}')
  n = quiz.shape[0]
  rows = np.concatenate([_to_ascii(quiz), np.full((n, 1), ord(','), np.uint8),
                         _to_ascii(solution), np.full((n, 1), ord('\n'), np.uint8)], axis=1)
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix='.tmp_sudoku_', suffix='.csv')
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(b'quiz,solution\n')
      f.write(rows.tobytes())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def _line_error(line: str, where: str) -> str:
  """Why a data line is not `<81 digits>,<81 digits>`."""
  fields = line.split(',')
  if len(fields) != 2:
    return f'{where}: expected 2 fields "quiz,solution", got {len(fields)}'
  for name, val in zip(('quiz', 'solution'), fields):
    if len(val) != NUM_CELLS or not (val.isascii() and val.isdigit()):
      return f'{where}: {name} must be 81 digits 0-9, got {len(val)} characters {val[:20]!r}...'
  return f'{where}: malformed line'


def read_csv(path: str) -> tuple[np.ndarray, np.ndarray]:
  """Parse and validate a Palm `quiz,solution` CSV -> (quiz, solution) `uint8 [N, 81]`.

  A header line `quiz,solution` is optional; blank lines are skipped; `\r\n` line ends are fine.
  Raises ValueError naming the file and 1-based line number for: a wrong field count, a field that
  is not exactly 81 digits, a solution with a 0 or that is not a valid grid, or a quiz digit that
  disagrees with the solution.
  """
  with open(path, 'rb') as f:
    raw = f.read().split(b'\n')
  linenos, lines = [], []
  for i, line in enumerate(raw, start=1):
    line = line.rstrip(b'\r')
    if not line.strip():
      continue
    if i == 1 and line.strip().lower() == b'quiz,solution':
      continue
    linenos.append(i), lines.append(line)
  if not lines:
    raise ValueError(f'{path}: no puzzles found')
  width = 2 * NUM_CELLS + 1
  for i, line in zip(linenos, lines):  # cheap shape check; details only for a bad line
    if len(line) != width or line[NUM_CELLS] != ord(','):
      raise ValueError(_line_error(line.decode('utf-8', 'replace'), f'{path}, line {i}'))
  arr = np.frombuffer(b''.join(lines), np.uint8).reshape(-1, width)
  text = np.delete(arr, NUM_CELLS, axis=1)
  not_digit = ((text < ord('0')) | (text > ord('9'))).any(-1)
  if not_digit.any():
    i = int(np.argmax(not_digit))
    raise ValueError(_line_error(lines[i].decode('utf-8', 'replace'), f'{path}, line {linenos[i]}'))
  quiz = arr[:, :NUM_CELLS] - ord('0')
  sol = arr[:, NUM_CELLS + 1:] - ord('0')
  checks = [
      ((sol == 0).any(-1), 'solution contains a 0 (blank)'),
      (~is_valid_solution(sol), 'solution is not a valid Sudoku grid'),
      (((quiz != 0) & (quiz != sol)).any(-1), 'a quiz digit disagrees with the solution'),
  ]
  for bad, msg in checks:
    if bad.any():
      i = int(np.argmax(bad))
      raise ValueError(f'{path}, line {linenos[i]}: {msg}')
  return np.ascontiguousarray(quiz), np.ascontiguousarray(sol)


class PalmCsvSource:
  """Grain RandomAccessDataSource over a Palm `quiz,solution` CSV, loaded and validated eagerly.

  `source[i]` -> dict(quiz=uint8[81], solution=uint8[81]).
  """

  def __init__(self, path: str):
    self.path = path
    self.quiz, self.solution = read_csv(path)

  def __len__(self) -> int:
    return self.quiz.shape[0]

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return {'quiz': self.quiz[index], 'solution': self.solution[index]}

  def __repr__(self) -> str:
    return f'PalmCsvSource({self.path!r}, n={len(self)})'


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
    write_csv(path, quiz, sol)
  return path


def to_tokens(digits: np.ndarray) -> np.ndarray:
  """Solution digits 1..9 `[..., 81]` -> tokens 0..8 `int32`."""
  return np.asarray(digits).astype(np.int32) - 1


def from_tokens(tokens: np.ndarray) -> np.ndarray:
  """Tokens 0..8 -> digits 1..9 `uint8`; MASK (9) -> 0 (blank)."""
  t = np.asarray(tokens)
  return np.where(t == MASK_ID, 0, t + 1).astype(np.uint8)
