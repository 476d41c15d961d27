"""Print the givens histogram and hierarchy-level distribution of Sudoku puzzles (docs/method.md §6).

Generates puzzles (timing the generator) or reads a puzzle file (one puzzle per line, or a Palm
`quiz,solution` CSV):

  python -m scripts.sudoku_levels --count 2048 --seed 0
  python -m scripts.sudoku_levels --csv ~/data/sudoku-hard/train.csv
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hmdlm_jax.data import sudoku
from hmdlm_jax.data import sudoku_csv
from hmdlm_jax.data import sudoku_generator


def _bar(frac: float, width: int = 40) -> str:
  return '#' * int(round(frac * width))


def report(quiz: np.ndarray) -> str:
  """Text report for `uint8 [N, 81]` quizzes: givens histogram and level shares of blank cells."""
  lines = []
  givens = (quiz > 0).sum(-1)
  n = quiz.shape[0]
  lines.append(f'puzzles: {n}   givens: min {givens.min()}  mean {givens.mean():.2f}  '
               f'max {givens.max()}')
  lines.append('givens histogram:')
  values, counts = np.unique(givens, return_counts=True)
  for v, c in zip(values, counts):
    lines.append(f'  {v:2d}: {c:7d}  {c / n:6.2%}  {_bar(c / n)}')
  levels = sudoku.hierarchy_levels(quiz)
  blank = quiz == 0
  shares = np.bincount(levels[blank], minlength=sudoku.NUM_LEVELS) / blank.sum()
  lines.append('share of blank cells per level (5 = first round of singles, 0 = round >= 6 or '
               'never):')
  for k in range(sudoku.NUM_LEVELS - 1, -1, -1):
    lines.append(f'  level {k}: {shares[k]:6.2%}  {_bar(shares[k])}')
  # Puzzles whose blanks all fall within five rounds of singles.
  easy = ((levels > 0) | ~blank).all(-1).mean()
  lines.append(f'puzzles fully determined within 5 rounds of singles: {easy:.2%}')
  return '\n'.join(lines)


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument('--csv', default='', help='read this puzzle file instead of generating')
  p.add_argument('--count', type=int, default=1024)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--split', default='train', choices=sudoku.SPLITS)
  p.add_argument('--min_givens', type=int, default=17)
  p.add_argument('--max_givens', type=int, default=34)
  p.add_argument('--attempts', type=int, default=8)
  p.add_argument('--processes', type=int, default=1)
  args = p.parse_args(argv)
  if args.csv:
    quiz, _ = sudoku_csv.read_puzzles(args.csv)
    print(f'read {args.csv}')
  else:
    cpu = time.process_time()
    quiz, _, stats = sudoku_generator.generate_dataset(
        args.seed, args.count, args.split, min_givens=args.min_givens, max_givens=args.max_givens,
        attempts=args.attempts, processes=args.processes)
    print(f'generated {stats.count} puzzles in {stats.seconds:.1f} s: '
          f'{stats.puzzles_per_s:.1f} puzzles/s ({args.processes} process(es), '
          f'targets U{{{args.min_givens}..{args.max_givens}}}, attempts={args.attempts})')
    if args.processes == 1:
      cpu = time.process_time() - cpu
      print(f'  CPU time {cpu:.1f} s: {stats.count / cpu:.1f} puzzles per CPU-second')
  print(report(quiz))


if __name__ == '__main__':
  main()
