"""Sudoku data (docs/method.md §6): solver, generator, puzzle text, Palm CSV, labels, symmetries."""

from __future__ import annotations

import itertools
import os

import grain
import numpy as np
import pytest

from hmdlm_jax.data import sudoku
from hmdlm_jax.data import sudoku_csv
from hmdlm_jax.data import sudoku_generator

# Published puzzles with their published solutions (Wikipedia's example; Arto Inkala's 2012 one).
KNOWN = [
    ('530070000600195000098000060800060003400803001700020006060000280000419005000080079',
     '534678912672195348198342567859761423426853791713924856961537284287419635345286179'),
    ('800000000003600000070090200050007000000045700000100030001000068008500010090000400',
     '812753649943682175675491283154237896369845721287169534521974368438526917796318452'),
]


def _grid(s: str) -> np.ndarray:
  return np.array([int(c) for c in s], np.uint8)


@pytest.fixture(scope='module')
def puzzles() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """240 generated puzzles with targets spread over 17..40 givens (one removal order each)."""
  rng = np.random.default_rng(1234)
  return sudoku_generator.generate_puzzles(rng, 240, min_givens=17, max_givens=40, attempts=1)


# ---------------------------------------------------------------------------------------------
# Independent references.

def _units() -> list[list[int]]:
  rows = [[9 * r + c for c in range(9)] for r in range(9)]
  cols = [[9 * r + c for r in range(9)] for c in range(9)]
  boxes = [[9 * (3 * br + i) + 3 * bc + j for i in range(3) for j in range(3)]
           for br in range(3) for bc in range(3)]
  return rows + cols + boxes


UNITS = _units()


def _candidates(grid: list[int], cell: int) -> set[int]:
  """Digits absent from the cell's row, column and box, by direct enumeration."""
  r, c = divmod(cell, 9)
  seen = {grid[9 * r + j] for j in range(9)} | {grid[9 * i + c] for i in range(9)}
  seen |= {grid[9 * (3 * (r // 3) + i) + 3 * (c // 3) + j] for i in range(3) for j in range(3)}
  return set(range(1, 10)) - seen


def brute_levels(quiz: np.ndarray) -> list[int]:
  """docs/method.md §6 labels with Python sets: rounds of naked + hidden singles from the grid at
  the start of each round."""
  grid = [int(v) for v in quiz]
  level = [5 if v else 0 for v in grid]
  for rnd in range(1, 6):
    cands = {c: _candidates(grid, c) for c in range(81) if grid[c] == 0}
    found: dict[int, int] = {c: next(iter(s)) for c, s in cands.items() if len(s) == 1}
    for unit in UNITS:
      placed = {grid[c] for c in unit}
      for d in range(1, 10):
        if d in placed:
          continue
        spots = [c for c in unit if grid[c] == 0 and d in cands[c]]
        if len(spots) == 1:
          found[spots[0]] = d
    for c, d in found.items():
      grid[c] = d
      level[c] = 6 - rnd
  return level


def brute_count(quiz: np.ndarray) -> int:
  """Number of completions of a quiz with few blanks, by enumerating every assignment."""
  grid = [int(v) for v in quiz]
  blanks = [c for c in range(81) if grid[c] == 0]
  options = [sorted(_candidates(grid, c)) for c in blanks]
  total = 0
  for combo in itertools.product(*options):
    g = list(grid)
    for c, d in zip(blanks, combo):
      g[c] = d
    total += all(sorted(g[c] for c in unit) == list(range(1, 10)) for unit in UNITS)
  return total


# ---------------------------------------------------------------------------------------------
# Encoding and solver.

def test_token_encoding():
  assert (sudoku.VOCAB_SIZE, sudoku.MASK_ID, sudoku.NUM_LEVELS) == (10, 9, 6)
  digits = np.arange(1, 10, dtype=np.uint8)
  np.testing.assert_array_equal(sudoku.to_tokens(digits), np.arange(9))
  np.testing.assert_array_equal(sudoku.from_tokens(sudoku.to_tokens(digits)), digits)
  assert sudoku.from_tokens(np.array([sudoku.MASK_ID]))[0] == 0


@pytest.mark.parametrize('quiz,solution', KNOWN)
def test_solver_known_puzzles(quiz, solution):
  count, sol = sudoku.count_solutions(_grid(quiz))
  assert count == 1
  assert ''.join(map(str, sol)) == solution


def test_solver_counts_match_enumeration():
  rng = np.random.default_rng(0)
  full = sudoku_generator.random_full_grids(rng, 12)
  quizzes = []
  for g in full:
    q = g.copy()
    q[rng.choice(81, size=rng.integers(6, 11), replace=False)] = 0
    quizzes.append(q)
  # A deadly rectangle (a b / b a in two rows of one band, columns in two stacks) leaves exactly
  # the two completions when blanked.
  for g in full:
    sq = g.reshape(9, 9)
    rects = [(r1, r2, c1, c2) for r1, r2 in itertools.combinations(range(9), 2)
             for c1, c2 in itertools.combinations(range(9), 2)
             if r1 // 3 == r2 // 3 and c1 // 3 != c2 // 3
             and sq[r1, c1] == sq[r2, c2] and sq[r1, c2] == sq[r2, c1]]
    if rects:
      r1, r2, c1, c2 = rects[0]
      q = g.copy()
      q[[9 * r1 + c1, 9 * r1 + c2, 9 * r2 + c1, 9 * r2 + c2]] = 0
      quizzes.append(q)
      break
  quizzes = np.stack(quizzes)
  count, sol = sudoku.search(sudoku.digits_to_masks(quizzes), limit=1000)
  expected = np.array([brute_count(q) for q in quizzes])
  np.testing.assert_array_equal(count, expected)
  assert (expected > 1).any() and (expected == 1).any()
  assert sudoku.is_valid_solution(sol).all()
  assert ((quizzes == 0) | (quizzes == sol)).all()


def test_solver_unsolvable_and_empty():
  empty = np.zeros(81, np.uint8)
  assert sudoku.count_solutions(empty)[0] == 2  # capped at limit
  clash = empty.copy()
  clash[[0, 5]] = 7  # same digit twice in row 0
  assert sudoku.count_solutions(clash)[0] == 0
  # Givens consistent pairwise, but cell 0 sees all nine digits: no solution.
  stuck = empty.copy()
  stuck[[1, 2, 3, 4, 5, 9, 18, 27, 36]] = [1, 2, 3, 4, 5, 6, 7, 8, 9]
  assert sudoku.count_solutions(stuck)[0] == 0
  with pytest.raises(ValueError, match='81'):
    sudoku.count_solutions(np.zeros(80, np.uint8))


# ---------------------------------------------------------------------------------------------
# Generator.

def test_random_full_grids_valid_and_distinct():
  grids = sudoku_generator.random_full_grids(np.random.default_rng(3), 64)
  assert sudoku.is_valid_solution(grids).all()
  assert len({g.tobytes() for g in grids}) == 64


def test_generated_puzzles_unique_and_in_range(puzzles):
  quiz, sol, target = puzzles
  count, found = sudoku.count_solutions(quiz)
  np.testing.assert_array_equal(count, 1)
  np.testing.assert_array_equal(found, sol)
  assert ((quiz == 0) | (quiz == sol)).all()
  givens = (quiz > 0).sum(-1)
  # Removal stops at the target, or earlier at a minimal puzzle.
  assert (givens >= target).all() and (givens <= 40).all() and givens.min() >= 17
  missed = givens > target
  assert (givens[target >= 30] == target[target >= 30]).all()
  # Puzzles that missed their target are minimal: removing any given breaks uniqueness.
  for i in np.flatnonzero(missed)[:4]:
    cells = np.flatnonzero(quiz[i])
    reduced = np.repeat(quiz[i][None], cells.size, axis=0)
    reduced[np.arange(cells.size), cells] = 0
    assert (sudoku.count_solutions(reduced)[0] == 2).all()


def test_generator_attempts_lower_givens():
  quiz1, _, _ = sudoku_generator.generate_puzzles(np.random.default_rng(5), 24, min_givens=17,
                                        max_givens=17, attempts=1)
  quiz4, sol4, _ = sudoku_generator.generate_puzzles(np.random.default_rng(5), 24, min_givens=17,
                                           max_givens=17, attempts=4)
  g1, g4 = (quiz1 > 0).sum(-1), (quiz4 > 0).sum(-1)
  # Same rng stream up to the retries: attempt 1 is shared, so extra attempts never add givens.
  assert (g4 <= g1).all() and (g4 < g1).any()
  assert (sudoku.count_solutions(quiz4)[0] == 1).all()
  assert ((quiz4 == 0) | (quiz4 == sol4)).all()


def test_generator_rejects_bad_range():
  with pytest.raises(ValueError, match='min_givens'):
    sudoku_generator.generate_puzzles(np.random.default_rng(0), 2, min_givens=10, max_givens=20)
  with pytest.raises(ValueError, match='split'):
    sudoku_generator.generate_dataset(0, 2, 'validation')


def test_generate_dataset_deterministic():
  gen = lambda split: sudoku_generator.generate_dataset(7, 6, split, min_givens=30, max_givens=34,
                                                        progress=False)
  a, b, c = gen('train'), gen('train'), gen('test')
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  assert not np.array_equal(a[1], c[1])
  assert sum(a[2].givens_hist.values()) == 6


def test_generated_csv_cache(tmp_path, monkeypatch):
  kw = dict(cache_dir=str(tmp_path), min_givens=31, max_givens=34, attempts=1)
  path = sudoku_generator.generated_csv(3, 5, 'test', progress=False, **kw)
  assert os.path.dirname(path) == str(tmp_path)
  assert os.listdir(tmp_path) == [os.path.basename(path)]  # no temp file left behind
  quiz, sol = sudoku_csv.read_puzzles(path, need_solution=True)
  ref_quiz, ref_sol, _ = sudoku_generator.generate_dataset(3, 5, 'test', min_givens=31,
                                                           max_givens=34, attempts=1,
                                                           progress=False)
  np.testing.assert_array_equal(quiz, ref_quiz)
  np.testing.assert_array_equal(sol, ref_sol)

  def boom(*a, **k):
    raise AssertionError('cache miss')

  monkeypatch.setattr(sudoku_generator, 'generate_dataset', boom)
  assert sudoku_generator.generated_csv(3, 5, 'test', **kw) == path
  with pytest.raises(AssertionError, match='cache miss'):  # another key is another file
    sudoku_generator.generated_csv(3, 6, 'test', **kw)


# ---------------------------------------------------------------------------------------------
# Palm CSV.

def _row(q: np.ndarray, s: np.ndarray) -> str:
  return ''.join(map(str, q)) + ',' + ''.join(map(str, s))


def test_csv_round_trip_with_and_without_header(tmp_path, puzzles):
  quiz, sol, _ = puzzles
  path = str(tmp_path / 'a.csv')
  sudoku_csv.write_csv(path, quiz[:7], sol[:7])
  src = sudoku_csv.PalmCsvSource(path)
  assert isinstance(src, grain.sources.RandomAccessDataSource)
  assert len(src) == 7
  item = src[3]
  assert item['quiz'].dtype == np.uint8 and item['quiz'].shape == (81,)
  np.testing.assert_array_equal(item['quiz'], quiz[3])
  np.testing.assert_array_equal(item['solution'], sol[3])
  plain = tmp_path / 'b.csv'
  plain.write_text('\n'.join(_row(q, s) for q, s in zip(quiz[:3], sol[:3])) + '\n')
  q2, s2 = sudoku_csv.read_puzzles(str(plain), need_solution=True)
  np.testing.assert_array_equal(q2, quiz[:3])
  np.testing.assert_array_equal(s2, sol[:3])


def _corrupt_quiz_digit(q: np.ndarray, s: np.ndarray) -> str:
  q = q.copy()
  c = int(np.flatnonzero(q)[0])
  q[c] = q[c] % 9 + 1
  return _row(q, s)


def _swap_solution_cells(q: np.ndarray, s: np.ndarray) -> str:
  s = s.copy()
  s[[0, 1]] = s[[1, 0]]  # row still a permutation, but columns now repeat digits
  q = np.where(np.isin(np.arange(81), [0, 1]), 0, q)
  return _row(q, s)


@pytest.mark.parametrize('make_bad,message', [
    (lambda q, s: _row(q, s)[1:], r'\(quiz\): a puzzle has 81 cells, got 80'),
    (lambda q, s: _row(q, s).replace(',', ',x', 1)[:-1],
     r"\(solution\): invalid character\(s\) \['x'\]"),
    (lambda q, s: _row(q, s) + ',' + '1' * 81, 'expected "quiz,solution", got 3 field'),
    (lambda q, s: _row(q, np.where(np.arange(81) == 5, 0, s)), 'contains a blank'),
    (_swap_solution_cells, 'not a valid Sudoku grid'),
    (_corrupt_quiz_digit, 'disagrees with the solution'),
])
def test_csv_errors_name_file_and_line(tmp_path, puzzles, make_bad, message):
  quiz, sol, _ = puzzles
  lines = ['quiz,solution', _row(quiz[0], sol[0]), make_bad(quiz[1], sol[1]),
           _row(quiz[2], sol[2])]
  path = tmp_path / 'bad.csv'
  path.write_text('\n'.join(lines) + '\n')
  with pytest.raises(ValueError, match=message) as err:
    sudoku_csv.PalmCsvSource(str(path))
  assert f'{path}, line 3' in str(err.value)


def test_csv_empty_file(tmp_path):
  path = tmp_path / 'empty.csv'
  path.write_text('quiz,solution\n')
  with pytest.raises(ValueError, match='no puzzles'):
    sudoku_csv.read_puzzles(str(path), need_solution=True)


def test_parse_puzzle_and_errors_name_the_input(tmp_path):
  grid = KNOWN[0][1]
  sol = _grid(grid)
  text = grid[:40].replace('5', '.') + '0' * 41
  q = sudoku_csv.parse_puzzle(text)
  assert q.shape == (81,) and q.dtype == np.uint8
  np.testing.assert_array_equal(q[:40], [0 if c == '5' else int(c) for c in grid[:40]])
  assert (q[40:] == 0).all()
  np.testing.assert_array_equal(sudoku_csv.parse_puzzle(' '.join(text)), q)  # whitespace ignored
  with pytest.raises(ValueError, match=r'puzzle 3: a puzzle has 81 cells, got 80'):
    sudoku_csv.parse_puzzle(grid[:80], where='puzzle 3')
  with pytest.raises(ValueError, match=r"puzzle 2: invalid character\(s\) \['x'\] at position"):
    sudoku_csv.parse_puzzle('x' + grid[1:], where='puzzle 2')
  with pytest.raises(ValueError, match=r"invalid character\(s\) \['é'\] at position\(s\) \[0\]"):
    sudoku_csv.parse_puzzle('é' + grid[1:])
  # Arrays are checked, strings parsed, by the same entry point the pictures use.
  np.testing.assert_array_equal(sudoku_csv.as_digits(q.reshape(9, 9)), q)
  np.testing.assert_array_equal(sudoku_csv.as_digits(text), q)
  with pytest.raises(ValueError, match='81 integers'):
    sudoku_csv.as_digits(q[:80])
  # Files: plain lines with a comment, CSV with header; errors name file and line.
  f = tmp_path / 'p.txt'
  f.write_text('# my puzzles\n' + text + '\n\n' + grid[:80] + '\n')
  with pytest.raises(ValueError, match=rf'{f}, line 4 \(quiz\): a puzzle has 81 cells, got 80'):
    sudoku_csv.read_puzzles(str(f))
  f.write_text('# my puzzles\n' + text + '\n' + text.replace('.', '0') + '\n')
  quiz, solution = sudoku_csv.read_puzzles(str(f))
  assert quiz.shape == (2, 81) and solution is None
  with pytest.raises(ValueError, match=rf'{f}, line 2: expected "quiz,solution", got 1 field'):
    sudoku_csv.read_puzzles(str(f), need_solution=True)
  quiz_s = ''.join(str(int(d)) if g else '0' for d, g in zip(sol, np.arange(81) < 30))
  c = tmp_path / 'p.csv'
  c.write_text(f'Quizzes,Solutions\n{quiz_s},{grid}\n')
  quiz, solution = sudoku_csv.read_puzzles(str(c))
  np.testing.assert_array_equal(solution[0], sol)
  c.write_text(f'quiz,solution\n{quiz_s},{grid}\n{quiz_s}\n')
  with pytest.raises(ValueError, match='some lines have a solution and some do not'):
    sudoku_csv.read_puzzles(str(c))


# ---------------------------------------------------------------------------------------------
# Hierarchy labels.

def test_levels_match_brute_force(puzzles):
  quiz, _, _ = puzzles
  levels = sudoku.hierarchy_levels(quiz)
  assert levels.dtype == np.int32 and levels.shape == quiz.shape
  expected = np.array([brute_levels(q) for q in quiz])
  np.testing.assert_array_equal(levels, expected)
  blank = quiz == 0
  # Every level occurs among the blanks, so the comparison covered all rounds.
  assert (np.bincount(levels[blank], minlength=6) > 0).all()
  assert (levels[~blank] == sudoku.GIVEN_LEVEL).all()


def test_levels_hand_cases():
  solution = _grid(KNOWN[0][1])
  one_blank = solution.copy()
  one_blank[40] = 0
  np.testing.assert_array_equal(sudoku.hierarchy_levels(one_blank), np.full(81, 5))
  np.testing.assert_array_equal(sudoku.hierarchy_levels(np.zeros(81, np.uint8)), np.zeros(81))
  # Row 0 and column 0 blank: (0, j) and (i, 0) are naked singles (full column / row); (0, 0)
  # keeps 5 candidates (its box holds 4 digits) but is the only place for its digit in row 0,
  # a hidden single: every blank is level 5.
  q = solution.reshape(9, 9).copy()
  q[0, :] = 0
  q[:, 0] = 0
  q = q.reshape(-1)
  assert len(_candidates([int(v) for v in q], 0)) == 5
  np.testing.assert_array_equal(sudoku.hierarchy_levels(q), np.full(81, 5))


def test_levels_batched_shape(puzzles):
  quiz, _, _ = puzzles
  batched = sudoku.hierarchy_levels(quiz[:6].reshape(2, 3, 81))
  np.testing.assert_array_equal(batched.reshape(6, 81), sudoku.hierarchy_levels(quiz[:6]))


def test_levels_reject_contradiction():
  # Pairwise consistent givens that make (0, 0) the only place for 1 in row 0 and the only place
  # for 2 in column 0: one cell forced to two digits in round 1.
  q = np.zeros((9, 9), np.uint8)
  for (r, c), d in {(1, 3): 1, (2, 6): 1, (4, 1): 1, (7, 2): 1,
                    (4, 2): 2, (8, 1): 2, (1, 5): 2, (2, 8): 2}.items():
    q[r, c] = d
  with pytest.raises(ValueError, match='round 1 of singles forces a cell to two digits'):
    sudoku.hierarchy_levels(q.reshape(-1))
  # Row 0 holds 1..7; columns 0 and 1 each hold a 9: both blanks are naked singles for 8.
  q = np.zeros((9, 9), np.uint8)
  q[0, 2:] = [1, 2, 3, 4, 5, 6, 7]
  q[3, 0] = q[6, 1] = 9
  with pytest.raises(ValueError, match='repeats .* after round 1'):
    sudoku.hierarchy_levels(q.reshape(-1))
  q[0, 0] = 1  # repeated given
  with pytest.raises(ValueError, match='repeats in a row, column or box$'):
    sudoku.hierarchy_levels(q.reshape(-1))


# ---------------------------------------------------------------------------------------------
# Symmetries.

def test_augmentation_preserves_validity_uniqueness_and_levels(puzzles):
  quiz, sol, _ = puzzles
  rng = np.random.default_rng(9)
  qs, ss, syms = [], [], []
  for i in range(40):
    sym = sudoku.random_symmetry(rng)
    qs.append(sym.apply_grid(quiz[i])), ss.append(sym.apply_grid(sol[i])), syms.append(sym)
  aq, asol = np.stack(qs), np.stack(ss)
  assert sudoku.is_valid_solution(asol).all()
  assert ((aq == 0) | (aq == asol)).all()
  np.testing.assert_array_equal((aq > 0).sum(-1), (quiz[:40] > 0).sum(-1))
  count, found = sudoku.count_solutions(aq)
  np.testing.assert_array_equal(count, 1)
  np.testing.assert_array_equal(found, asol)
  base_levels = sudoku.hierarchy_levels(quiz[:40])
  expected = np.stack([s.apply_cells(l) for s, l in zip(syms, base_levels)])
  np.testing.assert_array_equal(sudoku.hierarchy_levels(aq), expected)
  assert not np.array_equal(aq, quiz[:40])


def test_augment_matches_random_symmetry(puzzles):
  quiz, sol, _ = puzzles
  q, s = sudoku.augment(quiz[0], sol[0], np.random.default_rng(4))
  sym = sudoku.random_symmetry(np.random.default_rng(4))
  np.testing.assert_array_equal(q, sym.apply_grid(quiz[0]))
  np.testing.assert_array_equal(s, sym.apply_grid(sol[0]))


def test_symmetry_distribution():
  """Transpose half the time, digit relabelling uniform, rows stay in bands (±5 sigma bounds)."""
  rng = np.random.default_rng(11)
  n = 3000
  syms = [sudoku.random_symmetry(rng) for _ in range(n)]
  cell_rows = np.stack([s.cell_perm.reshape(9, 9) // 9 for s in syms])  # old row of each new cell
  transposed = np.array([len(set(r[0])) > 1 for r in cell_rows])  # a new row spans old rows
  assert abs(transposed.mean() - 0.5) < 5 * np.sqrt(0.25 / n)
  fixed = np.mean([s.digit_perm[1] == 1 for s in syms])
  assert abs(fixed - 1 / 9) < 5 * np.sqrt((1 / 9) * (8 / 9) / n)
  for s, t in zip(syms[:200], transposed[:200]):
    perm = s.cell_perm.reshape(9, 9)
    old_rows = perm[:, 0] // 9 if not t else perm[0, :] // 9
    # New rows 3b..3b+2 come from one old band.
    assert all(len(set(old_rows[3 * b:3 * b + 3] // 3)) == 1 for b in range(3))
    assert sorted(s.digit_perm[1:]) == list(range(1, 10)) and s.digit_perm[0] == 0
