"""Sudoku core (docs/method.md §6): encoding, solver, hierarchy labels, symmetries.

Grids are flat `uint8 [..., 81]` in row-major order, digits 1..9 and 0 = blank (Palm et al. 2018's
`quiz,solution` CSV format). Model tokens are `digit - 1` and the MASK token is 9: the model config
uses `vocab_size = VOCAB_SIZE = 10`, `mask_id = MASK_ID = 9` and `num_levels = NUM_LEVELS = 6`.
Puzzle text (the one parser) lives in data/sudoku_csv.py, the generator in
data/sudoku_generator.py, the Grain pipeline in data/sudoku_pipeline.py.

The solver works on candidate bitmasks `uint16 [N, 81]` (bit d-1 set = digit d still possible),
vectorised over N puzzles (`propagate`, `search`). The hierarchy labels (`hierarchy_levels`) are
rounds of naked + hidden singles from the givens: round r gives level max(0, 6 - r), givens level
5 (docs/method.md §6). The symmetries (digit relabelling, row / column permutations within bands /
stacks, band and stack permutations, transpose) map units onto units, so they preserve validity,
the number of solutions and the levels.
"""

from __future__ import annotations

import dataclasses

import numpy as np

VOCAB_SIZE = 10  # tokens 0..8 = digits 1..9, plus MASK
MASK_ID = 9
NUM_LEVELS = 6  # K (docs/method.md §6)
GIVEN_LEVEL = NUM_LEVELS - 1  # givens carry the level-5 embedding
NUM_CELLS = 81
ALL_DIGITS = np.uint16(0x1FF)
SPLITS = ('train', 'test')


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

  One round of naked singles + hidden singles is a handful of numpy ops on [N, 81] / [N, 27, 9]
  arrays.

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

  One node per puzzle per iteration, with an explicit stack per puzzle. Each node propagates
  (naked + hidden singles) and branches on a cell with the fewest candidates: 'cell = d' is
  explored before 'cell != d', where d is the lowest candidate, or a uniformly random one when
  `rng` is given (used to draw random full grids).

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
# Hierarchy labels (docs/method.md §6).

def hierarchy_levels(quiz: np.ndarray) -> np.ndarray:
  """Level of every cell of `[..., 81]` quizzes (0 = blank) -> `int32 [..., 81]` in 0..5.

  Rounds of simultaneous naked + hidden singles from the givens (docs/method.md §6): each round
  works on the grid at its START (givens + cells filled in earlier rounds), where a blank cell is
  determined when it is a naked single (exactly one digit is absent from its row, column and box)
  or a hidden single (some digit not yet placed in one of its units has this cell as its only
  candidate cell in that unit; candidates as for naked singles). All cells determined in round r
  are filled together and get level max(0, 6 - r); givens get level 5 (the level whose embedding
  they carry); cells not determined within five rounds get level 0 (rounds >= 6 all map to level
  0, so five rounds suffice).
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
    levels[determined] = NUM_LEVELS - r  # round r -> level 6 - r (docs/method.md §6)
    vals = np.where(determined, np.where(naked, cand, hidden), vals)
    filled = filled | determined
  return levels.reshape(shape)


# ----------------------------------------------------------------------------------------------
# Symmetries (docs/method.md §6).

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


def to_tokens(digits: np.ndarray) -> np.ndarray:
  """Solution digits 1..9 `[..., 81]` -> tokens 0..8 `int32`."""
  return np.asarray(digits).astype(np.int32) - 1


def from_tokens(tokens: np.ndarray) -> np.ndarray:
  """Tokens 0..8 -> digits 1..9 `uint8`; MASK (9) -> 0 (blank)."""
  t = np.asarray(tokens)
  return np.where(t == MASK_ID, 0, t + 1).astype(np.uint8)
