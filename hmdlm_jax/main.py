r"""Command line: train, evaluate or sample.

  python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=/tmp/hmdlm_sudoku
  python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=DIR --mode=eval [--out=OUT]
  python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=DIR --mode=sample \
      --puzzles=..3.2.6..9..3.5..1..18.64....81.29..7.......8..67.82....26.95..8..2.3..9..5.1.3..

Any config field can be overridden: `--config.train.num_steps=200 --config.model.num_levels=1`
(unknown keys and values of the wrong type are rejected). `--config` defaults to configs/sudoku.py
and `--workdir` to /tmp/hmdlm_sudoku. Rerunning a train command resumes from DIR's latest
checkpoint. Multi-host: add `--config.distributed.enabled=True` (see launch/).

Every run is checked whole before it writes anything (hmdlm_jax/preflight.py): a bad config file,
override or value, data that does not fit the model, an unusable workdir or checkpoint, bad puzzles
or an output that an earlier run wrote end the run with ONE line `hmdlm_jax: error: ...` naming
the file or field and what to do, exit code 1, no traceback (`--verbosity=1` prints it), and
leave every file as it was. A run that starts records itself (hmdlm_jax/workdir.py): training
writes DIR/config.json (fresh runs only) and a line of DIR/runs.jsonl; eval / sample write only
into their output directory (`--out`, default DIR when it is writable): eval_<step>.json,
samples_<step>.jsonl, pictures/ and a runs.jsonl line, never replacing an earlier run's outputs
without `--overwrite`. README.md's "Troubleshooting" lists the common errors.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Sequence

from hmdlm_jax import runtime

# The allocator that keeps XLA:CPU's buffers resident (hmdlm_jax/runtime.py: page faults and kernel
# time per step) acts at process start only, so the command re-executes itself once, before JAX
# is imported. HMDLM_ALLOCATOR=none|glibc|tcmalloc|auto (default auto) chooses.
if __name__ == '__main__':
  runtime.set_up_entry_point()

from absl import app  # pylint: disable=wrong-import-position
from absl import flags
from absl import logging
import jax
import ml_collections
from ml_collections import config_flags

import configs
from hmdlm_jax import config as config_lib
from hmdlm_jax import preflight
from hmdlm_jax import sharding
from hmdlm_jax import train
from hmdlm_jax import workdir as workdir_lib
from hmdlm_jax.evaluation import run as eval_run

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(configs.__file__)), 'sudoku.py')
DEFAULT_WORKDIR = '/tmp/hmdlm_sudoku'
MODES = preflight.MODES
PREFIX = 'hmdlm_jax: error: '

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
_OUT = flags.DEFINE_string('out', None, 'eval/sample mode: output directory (default: the '
                           'workdir, when it is writable).')
_STEP = flags.DEFINE_integer('step', None, 'eval/sample mode: checkpoint step (default: latest).')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'eval/sample mode: replace the outputs of an '
                               'earlier run (eval_<step>.json, samples_<step>.jsonl, pictures/).')
_RESUME_WITH_CHANGES = flags.DEFINE_bool(
    'resume_with_changes', False, 'train mode: resume although the model / process / optimiser '
    'config differs from the checkpoint\'s (a changed parameter shape still fails).')


def run(mode: str, config: Any, workdir: str, *, step: int | None = None,
        puzzles: Sequence[str] | None = None, puzzle_file: str | None = None,
        out: str | None = None, overwrite: bool = False, resume_with_changes: bool = False,
        argv: Sequence[str] | None = None) -> Any:
  """Checks, records and runs one mode (importable: tests and notebooks call this, not the CLI).

  Args:
    mode: 'train' | 'eval' | 'sample'.
    config: the experiment ConfigDict (resolved here by hmdlm_jax/config.py).
    workdir: the run directory.
    step: eval/sample: checkpoint step (None = latest).
    puzzles, puzzle_file: sample mode (see the flags).
    out: eval/sample: output directory (None: the workdir, when writable).
    overwrite: eval/sample: replace the outputs of an earlier run.
    resume_with_changes: train: resume despite config changes (preflight.check_resume).
    argv: the command line, for the run's record (None for a programmatic call).
  Returns:
    train: train.train_and_evaluate's dict; eval: evaluation.run.run_eval's report; sample:
    the records.
  Raises:
    ValueError naming the field / file and what to do, before anything is written.
  """
  config = config_lib.resolve(config)
  sharding.maybe_initialize_distributed(config.distributed)
  plan = preflight.check(mode, config, workdir, step=step, puzzles=puzzles,
                         puzzle_file=puzzle_file, out=out, overwrite=overwrite,
                         resume_with_changes=resume_with_changes)
  config, task, workdir = plan.config, plan.task, plan.workdir
  if mode == 'train':
    train_iter = task.dataset(config, 'train', seed=int(config.seed),
                              process_index=jax.process_index(),
                              process_count=jax.process_count())  # reads the data: may fail
    workdir_lib.start_run(config, workdir, mode, workdir=workdir, step=plan.step or 0,
                          write_config=plan.step is None, argv=argv)
    return train.train_and_evaluate(config, workdir, train_iter=iter(train_iter),
                                    eval_fn=eval_run.TrainingEvaluator(config, task))
  workdir_lib.start_run(config, plan.out_dir, mode, workdir=workdir, step=plan.step,
                        write_config=False, argv=argv)
  if mode == 'eval':
    return eval_run.run_eval(config, workdir, step=plan.step, out_dir=plan.out_dir,
                             overwrite=overwrite)
  return eval_run.run_sample(config, workdir, puzzles=puzzles, puzzle_file=puzzle_file,
                             step=plan.step, out_dir=plan.out_dir, overwrite=overwrite)


class _QuietLibraries:
  """absl-handler filter: drops the INFO chatter of Orbax/Grain/TensorStore (warnings pass)."""

  _NOISY = (f'{os.sep}orbax{os.sep}', f'{os.sep}grain{os.sep}', f'{os.sep}etils{os.sep}')

  def filter(self, record) -> bool:
    if record.levelno > 20 or logging.get_verbosity() > logging.INFO:
      return True
    return not any(n in record.pathname for n in self._NOISY)


def _fail(message: Any, hint: str = '') -> None:
  """Prints the one error line (`PREFIX` + the message on one line) and exits with code 1."""
  print(PREFIX + ' '.join(str(message).split()) + hint, file=sys.stderr, flush=True)
  sys.exit(1)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]}: flags are written --name=value.')
  logging.get_absl_handler().addFilter(_QuietLibraries())
  try:
    run(_MODE.value, _CONFIG.value, _WORKDIR.value, step=_STEP.value, puzzles=_PUZZLES.value,
        puzzle_file=_PUZZLE_FILE.value, out=_OUT.value, overwrite=_OVERWRITE.value,
        resume_with_changes=_RESUME_WITH_CHANGES.value, argv=sys.argv)
  except (ValueError, OSError, train.NonFiniteLossError) as e:
    # Config/data/workdir/checkpoint problems, a failing disk and the NaN guard: one clear line.
    logging.debug('Fatal error', exc_info=True)
    what = '' if isinstance(e, (ValueError, train.NonFiniteLossError)) else f'{type(e).__name__}: '
    _fail(what + str(e), ' (--verbosity=1 prints the traceback)')


# ---------------------------------------------------------------------------- the config file


def _config_spec(argv: Sequence[str]) -> str:
  """The value of the last --config flag (`--config=X` or `--config X`), else the default."""
  spec = DEFAULT_CONFIG
  for i, a in enumerate(argv):
    if a.startswith('--config='):
      spec = a[len('--config='):]
    elif a == '--config' and i + 1 < len(argv):
      spec = argv[i + 1]
  return spec


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """`get_config()` of the file `spec` (or of `path:arg`, as ml_collections reads it), checked.

  Raises:
    ValueError naming the file: missing, a syntax error, failing to import, no get_config(), or
    get_config() raising or not returning an ml_collections.ConfigDict.
  """
  path, arg = spec, None
  if not os.path.isfile(path) and ':' in spec and os.path.isfile(spec.rsplit(':', 1)[0]):
    path, arg = spec.rsplit(':', 1)
  flag = f'--config={spec}'
  if not os.path.isfile(path):
    raise ValueError(f'{flag}: no such file; give an experiment file with get_config(), e.g. '
                     '--config=configs/sudoku.py (the experiments are in configs/).')
  try:
    module_spec = importlib.util.spec_from_file_location('_hmdlm_checked_config', path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ValueError(f'{flag}: syntax error at line {e.lineno}: {e.msg} '
                     f'({(e.text or "").strip()!r}); fix the file.') from None
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'{flag}: importing it failed: {type(e).__name__}: {e}') from None
  if not callable(getattr(module, 'get_config', None)):
    raise ValueError(f'{flag} defines no get_config(); an experiment file returns its '
                     'ml_collections.ConfigDict from get_config() (see configs/sudoku.py).')
  try:
    config = module.get_config() if arg is None else module.get_config(arg)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'{flag}: get_config() raised {type(e).__name__}: {e}') from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(f'{flag}: get_config() returned {type(config).__name__}, not an '
                     'ml_collections.ConfigDict; build it from configs.base.get_base_config().')
  return config


def _unknown_overrides(config: ml_collections.ConfigDict, argv: Sequence[str]) -> list[str]:
  """The --config.a.b overrides of `argv` that name no field of `config`."""
  bad = []
  for a in argv:
    name = a.split('=', 1)[0]
    for prefix in ('--config.', '--noconfig.'):
      if name.startswith(prefix):
        node: Any = config
        for part in name[len(prefix):].split('.'):
          if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
            bad.append(name)
            break
          node = node[part]
  return bad


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with one `hmdlm_jax: error:` line (exit 1) for every mistake.

  The config file is loaded and checked first (`load_config_file`); an override that
  ml_collections rejects is reported by name (only the unknown ones), a bad value with absl's
  message.
  """
  try:
    config = load_config_file(_config_spec(argv[1:]))
  except ValueError as e:
    _fail(e)
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    _fail(e)
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    bad = _unknown_overrides(config, argv[1:])
    if bad:
      _fail(f'unknown config field{"s" if len(bad) > 1 else ""} {", ".join(bad)}: no such key in '
            f'{_config_spec(argv[1:])} (the schema of every field is configs/base.py).')
    _fail(f'invalid config override: {type(e).__name__}: {e}')
  return rest


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
