"""Regenerates the pictures in docs/images/ from a real (tiny) trained Sudoku model.

  python colabs/make_docs_images.py --workdir=/tmp/hmdlm_docs --minutes=10

Trains `--config` (default configs/tiny_test.py, on `--puzzles` generated puzzles) for `--minutes`
of wall time in WORKDIR (resuming when WORKDIR already holds a checkpoint; `--minutes=0` only
samples), solves Example 1 of the paper's Appendix F with the configured sampler and writes
  docs/images/sudoku_reveal.png   reveal order of the solve (colour = step, outline = drawn level)
  docs/images/sudoku_reveal.gif   the solving process, one frame per reveal step
  docs/images/schedules_lm1b.png  α_k and hazards of the LM1B schedule δ = (0, 0.25)
  docs/images/ordering_lm1b.png   per-step reveal probabilities on T = 256 (Appendix D)
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from hmdlm_jax import evaluate  # noqa: E402
from hmdlm_jax import schedules  # noqa: E402
from hmdlm_jax import train  # noqa: E402
from hmdlm_jax import visualize  # noqa: E402
from hmdlm_jax.data import sudoku as sudoku_data  # noqa: E402

# Example 1 of the paper's Appendix F (unique solution).
PUZZLE = '506070800400000016000000000002000003070050400000900020960000500030002007000100000'


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--workdir', default='/tmp/hmdlm_docs')
  parser.add_argument('--config', default='configs/tiny_test.py')
  parser.add_argument('--minutes', type=float, default=10.0)
  parser.add_argument('--puzzles', type=int, default=4096, help='generated training puzzles')
  parser.add_argument('--batch_size', type=int, default=64)
  parser.add_argument('--num_steps', type=int, default=81, help='sampling steps T (paper: 81)')
  parser.add_argument('--out', default=str(ROOT / 'docs' / 'images'))
  args = parser.parse_args(argv)

  config = importlib.import_module(args.config.removesuffix('.py').replace('/', '.')).get_config()
  workdir = pathlib.Path(args.workdir)
  config.data.cache_dir = str(workdir / 'sudoku_cache')
  config.data.num_train_puzzles = args.puzzles
  config.data.batch_size = args.batch_size
  config.sample.num_steps = args.num_steps
  if args.minutes > 0:
    config.train.num_steps = 10_000_000  # the time budget stops training
    config.train.time_budget_s = 60.0 * args.minutes
    config.train.log_every = 100
    config.train.ckpt_every = 1000
    result = train.train_and_evaluate(config, str(workdir / 'run'))
    print('trained to step', result['step'], '-', result['stop_reason'])

  rec = evaluate.run_sample(config, str(workdir / 'run'), puzzles=[PUZZLE])[0]
  _, solution = sudoku_data.count_solutions(evaluate.parse_puzzle(PUZZLE))
  tokens = np.array([int(c) for c in rec['prediction']]) - 1
  levels, steps = np.array(rec['levels']), np.array(rec['reveal_step'])
  num_steps, num_levels = int(config.sample.num_steps), int(config.model.num_levels)
  wrong = int(np.sum(tokens + 1 != solution))
  out = pathlib.Path(args.out)
  title = (f'{config.model.num_layers}-layer HMDLM (K = {num_levels}), T = {num_steps}, '
           f'{wrong} wrong cell(s)')
  visualize.plot_sudoku_reveal(rec['quiz'], tokens, levels, steps, num_steps, title=title,
                               num_levels=num_levels, solution=solution,
                               path=out / 'sudoku_reveal.png')
  visualize.sudoku_reveal_gif(rec['quiz'], tokens, steps, levels, out / 'sudoku_reveal.gif', fps=3,
                              num_steps=num_steps, num_levels=num_levels, solution=solution)
  lm1b = schedules.Schedule('loglinear', (0.0, 0.25))
  visualize.plot_schedules(lm1b, path=out / 'schedules_lm1b.png')
  visualize.plot_reveal_ordering(lm1b, 256, path=out / 'ordering_lm1b.png')
  print(f'wrote {out}/sudoku_reveal.png (+ .gif, schedules_lm1b.png, ordering_lm1b.png); '
        f'{wrong} of {int(np.sum(evaluate.parse_puzzle(PUZZLE) == 0))} blanks wrong')
  return 0


if __name__ == '__main__':
  sys.exit(main())
