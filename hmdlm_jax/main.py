r"""Command line: train, evaluate or sample.

  python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=/tmp/hmdlm_sudoku
  python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=DIR --mode=eval
  python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=DIR --mode=sample \
      --puzzles=..3.2.6..9..3.5..1..18.64....81.29..7.......8..67.82....26.95..8..2.3..9..5.1.3..

Any config field can be overridden: `--config.train.num_steps=200 --config.model.num_levels=1`
(ml_collections rejects unknown keys and values of the wrong type). `--config` defaults to
configs/sudoku.py and `--workdir` to /tmp/hmdlm_sudoku. Every run writes the resolved config to
DIR/config.json and DIR/config.yaml (eval/sample runs: DIR/config_<mode>.json/.yaml, so that they
never overwrite the training record). Rerunning a train command resumes from DIR's latest
checkpoint. Multi-host: add `--config.distributed.enabled=True` (see launch/). A bad config
override, a bad value or an unusable checkpoint directory ends with one clear `hmdlm_jax: error:`
line and exit code 1.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Sequence

from hmdlm_jax import runtime

# The allocator that keeps XLA:CPU's buffers resident (hmdlm_jax/runtime.py: page faults and kernel
# time per step) acts at process start only, so the command re-executes itself once, before JAX
# is imported. HMDLM_ALLOCATOR=none|glibc|tcmalloc|auto (default auto) chooses.
ALLOCATOR = os.environ.get('HMDLM_ALLOCATOR', 'auto')
if __name__ == '__main__' and ALLOCATOR != 'none':
  runtime.reexec_with_allocator(ALLOCATOR)
  runtime.configure_allocator()

from absl import app  # pylint: disable=wrong-import-position
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

import configs
from hmdlm_jax import config as config_lib
from hmdlm_jax import sharding
from hmdlm_jax import tasks
from hmdlm_jax import train
from hmdlm_jax import workdir as workdir_lib
from hmdlm_jax.evaluation import run as eval_run

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(configs.__file__)), 'sudoku.py')
DEFAULT_WORKDIR = '/tmp/hmdlm_sudoku'
MODES = ('train', 'eval', 'sample')

_CONFIG = config_flags.DEFINE_config_file(
    'config', DEFAULT_CONFIG, 'Experiment config file (a Python file with get_config()).',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', DEFAULT_WORKDIR,
                               'Run directory: checkpoints, metrics.jsonl, tb/, eval results.')
_MODE = flags.DEFINE_enum('mode', 'train', MODES, 'What to do.')
_PUZZLES = flags.DEFINE_list('puzzles', None, 'sample mode: comma-separated 81-character '
                             "Sudoku strings, '.' or '0' for blanks.")
_PUZZLE_FILE = flags.DEFINE_string('puzzle_file', None, 'sample mode: file with one puzzle per '
                                   'line, or a quiz,solution CSV.')
_OUT = flags.DEFINE_string('out', None, 'sample mode: output JSON-lines file '
                           '(default DIR/samples_<step>.jsonl).')
_STEP = flags.DEFINE_integer('step', None, 'eval/sample mode: checkpoint step (default: latest).')


def run(mode: str, config: Any, workdir: str, *, step: int | None = None,
        puzzles: Sequence[str] | None = None, puzzle_file: str | None = None,
        out: str | None = None) -> Any:
  """Dispatches one mode (importable: tests and notebooks call this instead of the CLI).

  Args:
    mode: 'train' | 'eval' | 'sample'.
    config: the experiment ConfigDict (resolved here by hmdlm_jax/config.py).
    workdir: the run directory.
    step: eval/sample: checkpoint step (None = latest).
    puzzles, puzzle_file, out: sample mode (see the flags).
  Returns:
    train: train.train_and_evaluate's dict; eval: evaluation.run.run_eval's report; sample:
    the records.
  """
  config = config_lib.resolve(config)
  task = tasks.get(config)
  sharding.maybe_initialize_distributed(config.distributed)
  workdir_lib.write_config(config, workdir, 'config' if mode == 'train' else f'config_{mode}')
  if mode == 'train':
    train_iter = task.dataset(config, 'train', seed=int(config.seed),
                              process_index=jax.process_index(),
                              process_count=jax.process_count())
    return train.train_and_evaluate(config, workdir, train_iter=iter(train_iter),
                                    eval_fn=eval_run.TrainingEvaluator(config, task))
  if mode == 'eval':
    return eval_run.run_eval(config, workdir, step=step)
  if mode == 'sample':
    return eval_run.run_sample(config, workdir, puzzles=puzzles, puzzle_file=puzzle_file,
                               out=out, step=step)
  raise ValueError(f'--mode={mode!r} is not one of {MODES}.')


class _QuietLibraries:
  """absl-handler filter: drops the INFO chatter of Orbax/Grain/TensorStore (warnings pass)."""

  _NOISY = (f'{os.sep}orbax{os.sep}', f'{os.sep}grain{os.sep}', f'{os.sep}etils{os.sep}')

  def filter(self, record) -> bool:
    if record.levelno > 20 or logging.get_verbosity() > logging.INFO:
      return True
    return not any(n in record.pathname for n in self._NOISY)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.get_absl_handler().addFilter(_QuietLibraries())
  try:
    run(_MODE.value, _CONFIG.value, _WORKDIR.value, step=_STEP.value, puzzles=_PUZZLES.value,
        puzzle_file=_PUZZLE_FILE.value, out=_OUT.value)
  except (ValueError, train.NonFiniteLossError) as e:
    # Config/data/checkpoint problems and the NaN guard: a clear message, no traceback.
    logging.debug('Fatal error', exc_info=True)
    print(f'hmdlm_jax: error: {e}\n(--verbosity=1 prints the traceback)', file=sys.stderr,
          flush=True)
    sys.exit(1)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a clear message for a `--config.*` override ml_collections rejects.

  ml_collections raises AttributeError/KeyError (with a traceback) for an unknown field; we print
  which override is wrong and exit 1 instead. Bad values already give absl's one-line error.
  """
  try:
    return app.parse_flags_with_usage(argv)
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    key = str(e).strip('"\'').split('\n')[0].strip('"\'')
    overrides = [a.split('=')[0] for a in argv[1:] if a.startswith('--config.')]
    culprits = [o for o in overrides if key and key in o.split('.')] or overrides
    print(f'hmdlm_jax: error: invalid config override {", ".join(culprits)}: '
          f'{type(e).__name__}: {str(e).strip()} (unknown field? the schema is configs/base.py)',
          file=sys.stderr, flush=True)
    sys.exit(1)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
