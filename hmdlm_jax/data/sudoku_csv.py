"""Sudoku puzzles as text: the one parser, puzzle files and the Palm CSV source.

A puzzle is written as 81 characters in row-major order, digits 1-9 and '.' or '0' for a blank
(whitespace inside is ignored). A puzzle file holds one puzzle per line, or `quiz,solution` pairs
(the CSV format of Palm et al. 2018, an optional `quiz,solution` header first); blank lines and
lines starting with '#' are skipped. Everything that reads puzzles (the training pipeline, sample
mode, the pictures) goes through `parse_puzzle` / `read_puzzles`; errors name the input (file and
line, or the caller's `where`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

from hmdlm_jax import storage
from hmdlm_jax.data import pipeline
from hmdlm_jax.data import sudoku

_BLANKS = '.0'
_HEADERS = (['quiz', 'solution'], ['quizzes', 'solutions'])
_NOT_A_DIGIT = np.uint8(255)
# Byte -> digit 0..9 ('.' = 0); every other byte -> _NOT_A_DIGIT.
_DIGIT_OF = np.full(256, _NOT_A_DIGIT, np.uint8)
_DIGIT_OF[ord('0'):ord('9') + 1] = np.arange(10)
_DIGIT_OF[ord('.')] = 0


def _raise_malformed(cells: str, where: str) -> None:
  """Raises the ValueError that says why `cells` (whitespace removed) is not a puzzle."""
  bad = sorted({c for c in cells if not (c.isascii() and (c.isdigit() or c in _BLANKS))})
  if bad:
    pos = [i for i, c in enumerate(cells) if c in bad][:5]
    raise ValueError(f'{where}: invalid character(s) {bad} at position(s) {pos}; allowed are the '
                     "digits 1-9 and '.' or '0' for a blank")
  raise ValueError(f'{where}: a puzzle has 81 cells, got {len(cells)} characters: {cells[:30]!r}'
                   f'{"..." if len(cells) > 30 else ""}')


def _parse(texts: Sequence[str], where: Callable[[int], str]) -> np.ndarray:
  """Puzzle strings -> digits uint8 [N, 81] (vectorised); the first bad one raises, naming
  `where(i)`."""
  cells = [''.join(str(t).split()) for t in texts]
  ok = np.array([len(c) == sudoku.NUM_CELLS for c in cells], bool)
  digits = np.zeros((len(cells), sudoku.NUM_CELLS), np.uint8)
  if ok.any():
    # 'replace' maps each non-ASCII character to one '?' byte, so rows keep 81 bytes.
    raw = ''.join(c for c, k in zip(cells, ok) if k).encode('ascii', 'replace')
    d = _DIGIT_OF[np.frombuffer(raw, np.uint8).reshape(-1, sudoku.NUM_CELLS)]
    digits[ok] = d
    ok[ok] = (d != _NOT_A_DIGIT).all(-1)
  if not ok.all():
    i = int(np.argmin(ok))
    _raise_malformed(cells[i], where(i))
  return digits


def parse_puzzle(text: str, *, where: str = 'puzzle') -> np.ndarray:
  """81-character puzzle -> digits uint8 [81] (0 = blank); ValueError naming `where` if bad."""
  return _parse([text], lambda _: where)[0]


def as_digits(quiz: str | np.ndarray | Sequence[int], *, where: str = 'quiz') -> np.ndarray:
  """A puzzle given as a string (`parse_puzzle`) or as 81 integers 0..9 ([81] or [9, 9]) ->
  digits uint8 [81] (0 = blank)."""
  if isinstance(quiz, str):
    return parse_puzzle(quiz, where=where)
  digits = np.asarray(quiz)
  if digits.size != sudoku.NUM_CELLS or not np.issubdtype(digits.dtype, np.integer):
    raise ValueError(f'{where} must hold 81 integers ([81] or [9, 9]); got shape '
                     f'{digits.shape}, dtype {digits.dtype}')
  if digits.min() < 0 or digits.max() > 9:
    raise ValueError(f'{where}: digits must lie in 0..9 (0 = blank); got '
                     f'{np.unique(digits[(digits < 0) | (digits > 9)]).tolist()}')
  return digits.reshape(sudoku.NUM_CELLS).astype(np.uint8)


def read_puzzles(path: str, *, need_solution: bool = False
                 ) -> tuple[np.ndarray, np.ndarray | None]:
  """Puzzles of a file: one per line, or `quiz,solution` lines (module docstring).

  Args:
    path: the file.
    need_solution: every line must be `quiz,solution` (training / test data).

  Returns:
    (quiz uint8 [N, 81], solution uint8 [N, 81] or None when no line has one).

  Raises:
    ValueError naming the file and 1-based line: a wrong field count, a malformed puzzle, some
    lines with a solution and some without, a solution with a blank or that is not a valid grid,
    or a quiz digit that disagrees with its solution.
  """
  lines = pipeline.read_utf8(path, prefix=f'{path}: ', hint=(
      'a puzzle file holds one 81-character puzzle per line, or quiz,solution lines')).splitlines()
  quizzes, solutions, linenos = [], [], []
  for lineno, line in enumerate(lines, start=1):
    s = line.strip()
    if not s or s.startswith('#'):
      continue
    fields = [x.strip() for x in s.split(',')]
    if lineno == 1 and [x.lower() for x in fields] in _HEADERS:
      continue
    if len(fields) > 2 or (need_solution and len(fields) != 2):
      want = '"quiz,solution"' if need_solution else '"quiz" or "quiz,solution"'
      raise ValueError(f'{path}, line {lineno}: expected {want}, got {len(fields)} field(s)')
    quizzes.append(fields[0])
    solutions.append(fields[1] if len(fields) == 2 else None)
    linenos.append(lineno)
  if not quizzes:
    raise ValueError(f'{path}: no puzzles found')
  have = [s is not None for s in solutions]
  if any(have) and not all(have):
    raise ValueError(f'{path}: some lines have a solution and some do not; give all or none')
  quiz = _parse(quizzes, lambda i: f'{path}, line {linenos[i]} (quiz)')
  if not all(have):
    return quiz, None
  solution = _parse(solutions, lambda i: f'{path}, line {linenos[i]} (solution)')
  checks = [
      ((solution == 0).any(-1), 'the solution contains a blank'),
      (~sudoku.is_valid_solution(solution), 'the solution is not a valid Sudoku grid'),
      (((quiz != 0) & (quiz != solution)).any(-1), 'a quiz digit disagrees with the solution'),
  ]
  for bad, msg in checks:
    if bad.any():
      raise ValueError(f'{path}, line {linenos[int(np.argmax(bad))]}: {msg}')
  return quiz, solution


def write_csv(path: str, quiz: np.ndarray, solution: np.ndarray) -> None:
  """Write `quiz,solution` rows atomically (storage.write_bytes)."""
  quiz, solution = np.asarray(quiz), np.asarray(solution)
  if quiz.shape != solution.shape or quiz.ndim != 2 or quiz.shape[1] != sudoku.NUM_CELLS:
    raise ValueError(f'quiz and solution must both be [N, 81], got {quiz.shape}, {solution.shape}')
  n = quiz.shape[0]
  ascii_digits = lambda g: (np.asarray(g, np.uint8) + ord('0')).astype(np.uint8)
  rows = np.concatenate([ascii_digits(quiz), np.full((n, 1), ord(','), np.uint8),
                         ascii_digits(solution), np.full((n, 1), ord('\n'), np.uint8)], axis=1)
  storage.makedirs(os.path.dirname(storage.absolute(path)))
  storage.write_bytes(path, b'quiz,solution\n' + rows.tobytes())


class PalmCsvSource:
  """Grain RandomAccessDataSource over a Palm `quiz,solution` CSV, loaded and validated eagerly.

  `source[i]` -> dict(quiz=uint8[81], solution=uint8[81]).
  """

  def __init__(self, path: str):
    self.path = path
    self.quiz, self.solution = read_puzzles(path, need_solution=True)

  def __len__(self) -> int:
    return self.quiz.shape[0]

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return {'quiz': self.quiz[index], 'solution': self.solution[index]}

  def __repr__(self) -> str:
    return f'PalmCsvSource({self.path!r}, n={len(self)})'
