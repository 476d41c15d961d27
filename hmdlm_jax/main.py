r"""Command line: train, evaluate or sample one experiment (docs/usage.md).

  python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=/tmp/hmdlm_sudoku
  python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=DIR --mode=eval [--out=OUT]
  python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=DIR --mode=sample --inputs=...
  python -m hmdlm_jax.main --config=DIR --workdir=DIR --mode=sample --prompt='The king'

Any field of hmdlm_jax/config/schema.py can be overridden (`--config.train.num_steps=200`). The
config is loaded and resolved here, once (hmdlm_jax/config); the run is checked whole before it
writes anything (hmdlm_jax/preflight.py): a mistake ends it with ONE line `hmdlm_jax: error: ...`
naming the file or field, exit code 1, every file left as it was; so does a second run on a
directory a live run writes (hmdlm_jax/lease.py). Rerunning a train command resumes; SIGTERM and
Ctrl-C checkpoint and exit during training, and end any other phase with one line, within a bounded
time (docs/design.md, "Stopping").
"""

from __future__ import annotations

import logging as std_logging
import os
import signal
import sys
import warnings
from typing import Any, Sequence

from hmdlm_jax import runtime

# The allocator that keeps XLA:CPU's buffers resident (hmdlm_jax/runtime.py: page faults and kernel
# time per step) acts at process start only, so on a CPU-only host the command re-executes itself
# once, before JAX is imported, and says so in one stderr line; an accelerator host is left alone.
# HMDLM_ALLOCATOR=none|glibc|tcmalloc|auto overrides (unset: by the host).
if __name__ == '__main__':
  runtime.set_up_entry_point()


class _NoMatplotlibHome:
  """Filter of the 'matplotlib' logger: with HOME unwritable (a service account, a read-only
  home) Matplotlib warns twice, in long lines, that it caches fonts in a temporary folder, which
  it removes at exit; pictures are drawn all the same, so the run says nothing of it."""

  _STARTS = ('mkdir -p failed for path ', 'Matplotlib created a temporary cache directory at ')

  def filter(self, record: Any) -> bool:
    return not str(record.msg).startswith(self._STARTS)


def quiet_matplotlib_home() -> None:
  """Installs `_NoMatplotlibHome` (idempotent; before Matplotlib is first imported)."""
  logger = std_logging.getLogger('matplotlib')
  if not any(isinstance(f, _NoMatplotlibHome) for f in logger.filters):
    logger.addFilter(_NoMatplotlibHome())


quiet_matplotlib_home()  # the modules below import Matplotlib

from absl import app  # pylint: disable=wrong-import-position
from absl import flags
from absl import logging
import jax

from hmdlm_jax import config as config_lib
from hmdlm_jax.config import loading as config_loading
from hmdlm_jax import lease
from hmdlm_jax import preflight
from hmdlm_jax import sharding
from hmdlm_jax import stopping
from hmdlm_jax import train
from hmdlm_jax import workdir as workdir_lib
from hmdlm_jax import write_errors
from hmdlm_jax.evaluation import run as eval_run
from hmdlm_jax.tasks import text_given

DEFAULT_CONFIG = config_loading.DEFAULT_CONFIG
DEFAULT_WORKDIR = '/tmp/hmdlm_sudoku'
MODES = preflight.MODES
PREFIX = 'hmdlm_jax: error: '

_CONFIG = config_loading.define_config_flag(flags.FLAGS)
_WORKDIR = flags.DEFINE_string('workdir', DEFAULT_WORKDIR,
                               'Run directory, local or gs://bucket/path: checkpoints, '
                               'metrics.jsonl, tb/, eval results.')
_MODE = flags.DEFINE_enum('mode', 'train', MODES, 'What to do.')
_INPUTS = flags.DEFINE_list('inputs', None, 'sample mode: comma-separated task inputs: Sudoku '
                            "grids of 81 characters ('.' or '0' for blanks).")
_PROMPT = flags.DEFINE_multi_string('prompt', None, 'sample mode, text: a prefix to complete '
                                     '(repeat the flag for more).')
_INFILL = flags.DEFINE_multi_string('infill', None, 'sample mode, text: a text whose [MASK] (one '
                                    'token) and [MASK*n] (n tokens) spans are generated (repeat '
                                    'the flag for more).')
_INPUT_FILE = flags.DEFINE_string('input_file', None, 'sample mode: file of task inputs, one per '
                                  'line (Sudoku: or a quiz,solution CSV).')
_OUT = flags.DEFINE_string('out', None, 'eval/sample mode: output directory (default: the '
                           'workdir, when it is writable).')
_STEP = flags.DEFINE_integer('step', None, 'eval/sample mode: checkpoint step (default: latest).')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'eval/sample mode: replace the outputs of an '
                               'earlier run (eval_<step>_test_allrows*.json, samples_<step>.jsonl, '
                               'pictures/).')
_RESUME_WITH_CHANGES = flags.DEFINE_bool(
    'resume_with_changes', False, 'train mode: resume although the model / process / optimiser '
    'config differs from the checkpoint\'s (a changed parameter shape still fails).')


def run(mode: str, config: Any, workdir: str, *, step: int | None = None,
        inputs: Sequence[str] | None = None, input_file: str | None = None,
        out: str | None = None, overwrite: bool = False, resume_with_changes: bool = False,
        argv: Sequence[str] | None = None, prompts: Sequence[str] = (),
        infills: Sequence[str] = ()) -> Any:
  """Checks, records and runs one mode (importable: tests and notebooks call this, not the CLI).

  Args:
    mode: 'train' | 'eval' | 'sample'.
    config: the experiment ConfigDict (hmdlm_jax.config.load), resolved here once.
    workdir: the run directory.
    step: eval/sample: checkpoint step (None = latest).
    inputs, input_file: sample mode: the task's inputs (see the flags).
    out: eval/sample: output directory (None: the workdir, when writable).
    overwrite: eval/sample: replace the outputs of an earlier run.
    resume_with_changes: train: resume despite config changes (preflight.check_resume).
    argv: the command line, for the run's record (None for a programmatic call).
    prompts, infills: sample mode, text: prefixes to complete, texts to infill (the flags).
  Returns:
    train: train.train_and_evaluate's dict; eval: evaluation.run.run_eval's report; sample:
    the records.
  Raises:
    ValueError naming the field / file and what to do, before anything is written.
  """
  config = config_lib.resolve(config)
  sharding.maybe_initialize_distributed(config.distributed)
  stopping.reinstall()  # jax.distributed.initialize replaced the SIGTERM handler
  stopping.debug_pause('startup')
  plan = preflight.check(mode, config, workdir, step=step, inputs=inputs,
                         input_file=input_file, out=out, overwrite=overwrite,
                         resume_with_changes=resume_with_changes, prompts=prompts,
                         infills=infills)
  config, task, workdir = plan.config, plan.task, plan.workdir
  if mode == 'train':
    train_iter = task.dataset(config, 'train', seed=int(config.seed),
                              process_index=jax.process_index(),
                              process_count=jax.process_count())  # reads the data: may fail
    with lease.hold(workdir, lease.TRAIN_LEASE, '--workdir'):
      # Checked again under the lease: a run that ended just before it was taken may have
      # written the checkpoints this one would now resume.
      if preflight.check_resume(config, workdir, plan.model,
                                resume_with_changes=resume_with_changes) != plan.step:
        raise ValueError(f'--workdir={workdir!r} changed while this run started (another run '
                         'wrote checkpoints there); rerun the command to resume them.')
      workdir_lib.start_run(config, workdir, mode, workdir=workdir, step=plan.step or 0,
                            write_config=plan.step is None, argv=argv)
      # Until the loop starts (checkpoint.StopSignal): restore or initialisation, compilation.
      with stopping.phase(*_start_of_training(plan.step)):
        stopping.debug_pause('restore')
        return train.train_and_evaluate(
            config, workdir, model=plan.model, train_iter=iter(train_iter),
            eval_fn=_final_eval_phase(eval_run.TrainingEvaluator(config, task)))

  what = 'evaluate' if mode == 'eval' else 'sample from'

  def record(read: int) -> None:  # the step read: with no --step, the latest when it was read
    workdir_lib.start_run(config, plan.out_dir, mode, workdir=workdir, step=read,
                          write_config=False, argv=argv)
    stopping.push(*_eval_or_sample(mode, read, plan.out_dir))  # ended with the phase below
    stopping.debug_pause(mode)

  # `step` as given: with none, the run reads the latest again (a live run may delete plan.step).
  with lease.hold(plan.out_dir, lease.OUTPUTS_LEASE, '--out' if out else '--workdir'), \
      stopping.phase(f'the restore of the checkpoint to {what}',
                     'nothing was written; rerun the same command'):
    if mode == 'eval':
      return eval_run.run_eval(config, workdir, step=step, out_dir=plan.out_dir,
                               overwrite=overwrite, on_restored=record)
    return eval_run.run_sample(config, workdir, inputs=inputs, input_file=input_file,
                               step=step, out_dir=plan.out_dir, overwrite=overwrite,
                               prompts=prompts, infills=infills, on_restored=record)


def _start_of_training(step: int | None) -> tuple[str, str]:
  """(phase, what the stop line says of the outputs) before the loop (stopping.phase)."""
  if step is None:
    return ('the start of training (initialisation, compilation)',
            'no checkpoint was written; rerun the same command to start again')
  return (f'the start of training from checkpoint {step} (restore, compilation)',
          f'checkpoint {step} is unchanged; rerun the same command to resume')


def _eval_or_sample(mode: str, step: int, out_dir: str) -> tuple[str, str]:
  """(phase, what the stop line says of the outputs) once checkpoint `step` is read."""
  if mode == 'eval':
    return (f'the evaluation of checkpoint {step}',
            f'no report was written to {out_dir}; rerun the same command')
  # samples_<step>.jsonl is one atomic write; pictures/ follow it, each file whole.
  return (f'sampling from checkpoint {step}',
          f'every file written to {out_dir} is whole; rerun the same command (with --overwrite '
          'when it refuses an earlier output)')


def _final_eval_phase(evaluate: train.EvalFn) -> train.EvalFn:
  """`evaluate`, named as the final evaluation phase when it runs after the loop (periodic
  evaluations run inside it, where the loop handles signals): a signal ends that phase."""

  def phased(config: Any, state: Any, step: int, workdir: str) -> Any:
    if stopping.in_loop():
      return evaluate(config, state, step, workdir)
    # train.train_and_evaluate saved checkpoint `step` and waited for it before this call.
    with stopping.phase(f'the final evaluation at step {step}',
                        f'checkpoint {step} is saved; rerun the same command to evaluate'):
      stopping.debug_pause('final_eval')
      return evaluate(config, state, step, workdir)

  return phased


class _QuietLibraries:
  """absl-handler filter: drops the INFO chatter of Orbax/Grain/epath/gcsfs, and the few lines of
  other levels that every eval or CPU-only start prints and that ask nothing of the user."""

  _NOISY = tuple(f'{os.sep}{lib}{os.sep}' for lib in ('orbax', 'grain', 'etils', 'gcsfs', 'fsspec'))
  # (record attribute, what it holds, what the message starts with, what it also holds). Orbax
  # warns twice that a checkpoint opened for reading is read-only; JAX says at INFO that a host
  # without libtpu has no TPU (a TPU host missing its backend still gets JAX's own warning).
  _POINTLESS = (
      ('pathname', f'{os.sep}orbax{os.sep}', 'CheckpointManagerOptions.read_only=True', ''),
      ('pathname', f'{os.sep}orbax{os.sep}', 'Given directory is read only=', ''),
      ('name', 'jax._src.xla_bridge', "Unable to initialize backend 'tpu'", 'libtpu.so'),
  )

  def filter(self, record) -> bool:
    for attr, where, start, holds in self._POINTLESS:
      if where in getattr(record, attr):
        message = record.getMessage()
        if message.startswith(start) and holds in message:
          return False
    if record.levelno > 20 or logging.get_verbosity() > logging.INFO:
      return True
    return not any(n in record.pathname for n in self._NOISY)


MAX_LINE = 300  # the error line's length, at most (the hint is left out where it does not fit)


def _fail(message: Any, hint: str = '') -> None:
  """Prints the one error line (`PREFIX` + the message on one line) and exits with code 1."""
  line = PREFIX + ' '.join(str(message).split())
  print(line + (hint if len(line) + len(hint) <= MAX_LINE else ''), file=sys.stderr, flush=True)
  sys.exit(1)


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, line: str | None = None) -> str:
  """The input warnings of the command line are one line, as its errors are."""
  if issubclass(category, text_given.UnknownPiecesWarning):
    return f'hmdlm_jax: warning: {message}\n'
  return _FORMAT_WARNING(message, category, filename, lineno, line)


_FORMAT_WARNING = warnings.formatwarning


def main(argv: list[str]) -> None:
  warnings.formatwarning = _one_line_warning
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]}: flags are written --name=value.')
  logging.get_absl_handler().addFilter(_QuietLibraries())
  # A refused write (disk full, quota, file-size limit, permission) is this program's one line:
  # the libraries' own reports of it (Orbax's threads, asyncio, TensorStore) are dropped.
  write_errors.quiet_library_reports(logging.get_absl_handler())
  # SIGTERM / SIGINT in every phase: one line, a bounded time, the lease released.
  stopping.install()
  try:
    result = run(_MODE.value, _CONFIG.value, _WORKDIR.value, step=_STEP.value,
                 inputs=_INPUTS.value, input_file=_INPUT_FILE.value, out=_OUT.value,
                 overwrite=_OVERWRITE.value, resume_with_changes=_RESUME_WITH_CHANGES.value,
                 argv=sys.argv, prompts=_PROMPT.value or (), infills=_INFILL.value or ())
  except stopping.Interrupted as e:
    stopping.exit_stopped(e.signum)
  except write_errors.WriteError as e:
    _stopped_first()
    logging.debug('Fatal error', exc_info=True)
    _fail(e)
  except (ValueError, OSError, train.NonFiniteLossError) as e:
    _stopped_first()
    # Config/data/workdir/checkpoint problems, a failing disk and the NaN guard: one clear line.
    logging.debug('Fatal error', exc_info=True)
    what = '' if isinstance(e, (ValueError, train.NonFiniteLossError)) else f'{type(e).__name__}: '
    _fail(what + str(e), ' (--verbosity=1 prints the traceback)')
  except Exception:  # pylint: disable=broad-except
    _stopped_first()
    raise
  # Ctrl-C stopped training after a checkpoint: exit as an interrupted command does (128 + 2), so
  # a shell script or `make` stops too; SIGTERM (a scheduler's preemption) exits 0.
  if _MODE.value == 'train' and result['stop_reason'] == f'signal {signal.SIGINT.name}':
    sys.exit(128 + signal.SIGINT)


def _stopped_first() -> None:
  """An error raised while unwinding from a signal (a library turned the Interrupted into its
  own error) is the stop, not an error: its line and code instead."""
  if stopping.raised():
    stopping.exit_stopped()


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with one `hmdlm_jax: error:` line (exit 1) for every mistake
  (hmdlm_jax/config/loading.py checks the config file first and names unknown overrides)."""
  # --config's overrides are read from sys.argv by ml_collections, which refuses one before
  # --config=FILE: the file goes first (in place: `argv` is sys.argv), so the order is free.
  sys.argv[:] = config_loading.config_first(sys.argv)
  try:
    return config_loading.parse(flags.FLAGS, argv)
  except ValueError as e:
    _fail(e)
    raise  # unreachable: _fail exits


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
