"""Regenerates the pictures in docs/images/ from a real (tiny) trained Sudoku model.

  python colabs/make_docs_images.py --workdir=/tmp/hmdlm_sudoku            # the demo run
  python colabs/make_docs_images.py --workdir=/tmp/hmdlm_sudoku --minutes=0  # sample only

Trains `--config` (default configs/sudoku.py, the ~10-minute CPU demo) in WORKDIR for the config's
time budget or `--minutes` of wall time (resuming when WORKDIR already holds a checkpoint, e.g. the
demo's `python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=/tmp/hmdlm_sudoku`;
`--minutes=0` only samples), solves one puzzle with the configured sampler (T = 81, confidence
ordering) and writes
  docs/images/sudoku_reveal.png   reveal order of the solve (colour = step, outline = drawn level)
  docs/images/sudoku_reveal.json  the solve it is drawn from (tests/test_docs_images.py redraws it)
  docs/images/sudoku_reveal.gif   the solving process, one frame per reveal step
  docs/images/schedules_lm1b.png  α_k and hazards of the LM1B schedule δ = (0, 0.25)
  docs/images/ordering_lm1b.png   per-step reveal probabilities on T = 256 (Appendix D)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import schedules
from hmdlm_jax import main as hmdlm_main
from hmdlm_jax import visualize
from hmdlm_jax.data import sudoku as sudoku_data
from hmdlm_jax.data import sudoku_csv
from hmdlm_jax.data import sudoku_generator
from hmdlm_jax.tasks import sudoku_pictures

# Example 1 of the paper's Appendix F (unique solution; a sudoku-hard puzzle, mostly level-0 cells).
PAPER_PUZZLE = '506070800400000016000000000002000003070050400000900020960000500030002007000100000'


def pick_puzzle(choice: str) -> str:
  """'paper': Appendix F's Example 1. 'easiest': of 64 generated test puzzles (seed 0), the one with
  the most givens (the first on ties): a puzzle a briefly trained model can mostly solve. Else the
  81-character puzzle itself."""
  if choice == 'paper':
    return PAPER_PUZZLE
  if choice == 'easiest':
    quiz, _, _ = sudoku_generator.generate_dataset(0, 64, 'test', progress=False)
    return ''.join(map(str, quiz[int(np.argmax((quiz > 0).sum(-1)))]))
  return choice


def draw_reveal(record: dict, out: pathlib.Path) -> int:
  """Draws out/sudoku_reveal.png and .gif from a solve record (docs/images/sudoku_reveal.json,
  which tests/test_docs_images.py redraws to keep the README's picture current); returns the
  number of wrong cells."""
  tokens, solution = np.asarray(record['tokens']), np.asarray(record['solution'])
  levels, steps = np.asarray(record['levels']), np.asarray(record['reveal_step'])
  num_steps, num_levels = record['num_steps'], record['num_levels']
  wrong = int(np.sum(tokens + 1 != solution))
  title = (f"{record['num_layers']}-layer HMDLM (K = {num_levels}), T = {num_steps}, "
           f'{wrong} wrong cell(s)')
  sudoku_pictures.plot_sudoku_reveal(record['quiz'], tokens, levels, steps, num_steps,
                                     title=title, num_levels=num_levels, solution=solution,
                                     path=out / 'sudoku_reveal.png')
  sudoku_pictures.sudoku_reveal_gif(record['quiz'], tokens, steps, levels,
                                    out / 'sudoku_reveal.gif', fps=3, num_steps=num_steps,
                                    num_levels=num_levels, solution=solution,
                                    dpi=60)  # keeps the GIF small for the docs
  return wrong


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', default='/tmp/hmdlm_sudoku')
  parser.add_argument('--config', default='configs/sudoku.py')
  parser.add_argument('--minutes', type=float, default=None,
                      help="training wall time; default: the config's train.time_budget_s")
  parser.add_argument('--puzzle', default='easiest',
                      help="'easiest' (generated test set), 'paper' (Appendix F) or 81 characters")
  parser.add_argument('--out', default=str(ROOT / 'docs' / 'images'))
  args = parser.parse_args(argv)

  config = config_lib.load(args.config)  # as `python -m hmdlm_jax.main --config=...` reads it
  workdir = pathlib.Path(args.workdir)
  if args.minutes is not None:
    config.train.num_steps = 10_000_000  # the time budget stops training
    config.train.time_budget_s = 60.0 * args.minutes
  config.train.final_eval = False  # the pictures need no test-set evaluation
  if args.minutes != 0:
    result = hmdlm_main.run('train', config, str(workdir))
    print('trained to step', result['step'], '-', result['stop_reason'])

  puzzle = pick_puzzle(args.puzzle)
  rec = hmdlm_main.run('sample', config, str(workdir), inputs=[puzzle], overwrite=True)[0]
  _, solution = sudoku_data.count_solutions(sudoku_csv.parse_puzzle(puzzle))
  record = {'quiz': rec['quiz'], 'tokens': [int(c) - 1 for c in rec['prediction']],
            'levels': [int(v) for v in rec['levels']],
            'reveal_step': [int(v) for v in rec['reveal_step']],
            'solution': [int(v) for v in np.asarray(solution).reshape(-1)],
            'num_steps': int(config.sample.num_steps), 'num_levels': int(config.model.num_levels),
            'num_layers': int(config.model.num_layers), 'config': args.config}
  out = pathlib.Path(args.out)
  (out / 'sudoku_reveal.json').write_text(json.dumps(record, indent=1) + '\n', encoding='utf-8')
  wrong = draw_reveal(record, out)
  lm1b = schedules.Schedule('loglinear', (0.0, 0.25))
  visualize.plot_schedules(lm1b, path=out / 'schedules_lm1b.png')
  visualize.plot_reveal_ordering(lm1b, 256, path=out / 'ordering_lm1b.png')
  print(f'wrote {out}/sudoku_reveal.png (+ .gif, schedules_lm1b.png, ordering_lm1b.png); '
        f'{wrong} of {int(np.sum(sudoku_csv.parse_puzzle(puzzle) == 0))} blanks wrong')
  return 0


if __name__ == '__main__':
  sys.exit(main())
