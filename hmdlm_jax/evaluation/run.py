"""Entry points of main.py: --mode=eval, --mode=sample, and the evaluation hook of training.

`run_eval(config, workdir, step=None)` evaluates a checkpoint with its task (tasks/) on the whole
test split, samples included; `TrainingEvaluator(config, task)` is `train.train_and_evaluate`'s
`eval_fn`: the same evaluation of the live train state on `config.eval.num_examples` examples, no
samples, compiled once for the whole training run (the evaluator owns its `compiled.Network`).
Both print the task's summary and write a report in one schema (`write_report`), named by what it
measured (`reports.eval_file`: step, split, rows, seeds), so the two never replace each other.
`run_sample` prints the task's samples (Sudoku grids, texts) for its `inputs`, saves them with
every token's reveal step, and their reveal-order pictures with `config.sample.pictures`.

Eval and sample runs write only into their output directory OUT (`out_dir`, default DIR; nothing
else is written into DIR), and refuse to replace an output of an earlier run (`task.outputs`)
unless `overwrite` (hmdlm_jax/workdir.py).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax

from hmdlm_jax import config as config_lib
from hmdlm_jax import processes
from hmdlm_jax import tasks
from hmdlm_jax import train
from hmdlm_jax import workdir as workdir_lib
from hmdlm_jax.evaluation import compiled
from hmdlm_jax.evaluation import reports
from hmdlm_jax.tasks import base as tasks_base


def eval_params(config: config_lib.Config, state: train.TrainState) -> Any:
  """EMA parameters when config.eval.use_ema, else the raw ones."""
  return state.ema_params if config.eval.use_ema else state.params


def _context(config: config_lib.Config, network: compiled.Network, params: Any,
             step: int, workdir: str, *, progress: bool) -> tasks_base.EvalContext:
  return tasks_base.EvalContext(config=config, apply_fn=network.bind(params),
                                process=processes.build(config), step=int(step),
                                workdir=workdir, progress=progress)


def write_report(config: config_lib.Config, workdir: str, name: str, step: int,
                 results: Mapping[str, Any], *, num_examples: int | None,
                 seconds: float) -> tuple[dict[str, Any], str]:
  """(report, path) of `workdir`/`name` (`Task.report_name`), whose schema is (docs/design.md,
  "Evaluation")

    step          int: the checkpoint / training step
    kind          config.eval.kind ('sudoku' | 'perplexity')
    use_ema       bool: EMA (True) or raw parameters (config.eval.use_ema)
    num_examples  int, or null for the whole test split
    seconds       float: wall time of the evaluation
    results       the task's nested results
    scalars       the finite numbers of `results`, flat ('greedy/mean/cell_accuracy': float); the
                  training loop also logs them to metrics.jsonl / TensorBoard (split 'eval')
  """
  report = {'step': int(step), 'kind': config.eval.kind, 'use_ema': bool(config.eval.use_ema),
            'num_examples': num_examples, 'seconds': seconds, 'results': dict(results),
            'scalars': reports.flatten_metrics(results)}
  path = os.path.join(workdir, name)
  reports.write_json(path, report)
  return report, path


def _print_summary(config: config_lib.Config, task: tasks_base.Task,
                   results: Mapping[str, Any], what: str, path: str) -> None:
  """'<what> (<eval kind>, EMA|raw params) -> <path>' and the task's summary, on stdout."""
  print(f'{what} ({config.eval.kind}, {"EMA" if config.eval.use_ema else "raw"} params) -> '
        f'{path}', flush=True)
  for line in task.summary(results):
    print(line, flush=True)


def _restore(config: config_lib.Config, task: tasks_base.Task, model: nn.Module,
             mode: str, workdir: str, step: int | None, out_dir: str, overwrite: bool,
             on_restored: Callable[[int], None] | None) -> tuple[Any, int]:
  """(evaluation params, step) of `model`'s checkpoint `step` (None: the latest) of DIR, once
  the run's outputs are known not to replace an earlier run's (unless `overwrite`); then
  `on_restored(step read)` (main.py records the run with it)."""
  state, step = train.restore_for_eval(config, workdir, step, model=model)
  workdir_lib.check_outputs(out_dir, task.outputs(config, mode, step), overwrite)
  if on_restored is not None:
    on_restored(step)
  return eval_params(config, state), step


def run_eval(config: config_lib.Config, workdir: str, step: int | None = None, *,
             out_dir: str | None = None, overwrite: bool = False, progress: bool = True,
             on_restored: Callable[[int], None] | None = None) -> dict[str, Any]:
  """Evaluates checkpoint `step` (default: the latest) of DIR on the whole test split; returns
  the report (written to `out_dir`, default DIR, named after the step read) and prints the task's
  summary. `on_restored(step)` is called once the checkpoint is read."""
  task = tasks.get(config)
  out_dir = out_dir or workdir
  model = task.build_model(config)
  params, step = _restore(config, task, model, 'eval', workdir, step, out_dir, overwrite,
                          on_restored)
  network = compiled.flax_network(model)
  ctx = _context(config, network, params, step, out_dir, progress=progress)
  start = time.perf_counter()
  results = task.evaluate(ctx, None, True)
  name = task.report_name(config, step, None, in_training=False)
  report, path = write_report(config, out_dir, name, step, results, num_examples=None,
                              seconds=time.perf_counter() - start)
  _print_summary(config, task, results, f'Evaluation of step {step}', path)
  return report


class TrainingEvaluator:
  """`train.EvalFn`: the task's evaluation of the live train state, on config.eval.num_examples.

  Uses EMA params when config.eval.use_ema; no samples (gen PPL / MAUVE are for `run_eval`). Its
  network keeps the compiled programs, so evaluations after the first one do not recompile.
  Returns the flat scalars for the training loop's metrics writer.
  """

  def __init__(self, config: config_lib.Config, task: tasks_base.Task) -> None:
    self._task = task
    self._network = compiled.flax_network(task.build_model(config))

  def __call__(self, config: config_lib.Config, state: train.TrainState, step: int,
               workdir: str) -> dict[str, float]:
    num = int(config.eval.num_examples)
    limit = num if num > 0 else None
    ctx = _context(config, self._network, eval_params(config, state), step, workdir,
                   progress=False)
    start = time.perf_counter()
    results = self._task.evaluate(ctx, limit, False)
    name = self._task.report_name(config, step, limit, in_training=True)
    report, path = write_report(config, workdir, name, step, results, num_examples=limit,
                                seconds=time.perf_counter() - start)
    if jax.process_index() == 0:  # the same readable summary as --mode=eval
      _print_summary(config, self._task, results, f'Evaluation at step {step}', path)
    return report['scalars']


def run_sample(config: config_lib.Config, workdir: str,
               inputs: Sequence[str] | None = None, input_file: str | None = None, *,
               step: int | None = None, out_dir: str | None = None, overwrite: bool = False,
               prompts: Sequence[str] = (), infills: Sequence[str] = (),
               on_restored: Callable[[int], None] | None = None) -> tasks_base.Records:
  """Samples from checkpoint `step` (default: the latest) of DIR; prints and saves them.

  Sudoku: solves the grids of `inputs` (81-character strings, '.' or '0' = blank) and/or of
  `input_file` (one per line, or the `quiz,solution` CSV). Text: one sample per prompt of
  `prompts` / text of `infills` (tasks/text_given.py), else `config.sample.num_samples` samples
  (WikiHow: conditioned on test titles). Every record holds the tokens' reveal steps.
  Output: `out_dir` (default DIR)/samples_<step>.jsonl and, with config.sample.pictures, the
  reveal-order pictures in pictures/. `on_restored(step)` is called once the checkpoint is read.
  """
  task = tasks.get(config)
  # bad input fails before restoring
  prepared = task.prepare_sample(config, inputs, input_file, prompts=prompts, infills=infills)
  out_dir = out_dir or workdir
  model = task.build_model(config)
  params, step = _restore(config, task, model, 'sample', workdir, step, out_dir, overwrite,
                          on_restored)
  network = compiled.flax_network(model)
  records, text = task.sample(_context(config, network, params, step, out_dir, progress=False),
                              prepared)
  path = os.path.join(out_dir, reports.samples_file(step))
  reports.write_jsonl(path, records)
  print(text)
  print(f'{len(records)} samples of step {step} -> {path}', file=sys.stderr)
  if config.sample.pictures:
    pictures = task.pictures(config, out_dir, records)
    print(f'{len(pictures)} reveal-order pictures -> '
          f'{os.path.join(out_dir, reports.PICTURES_DIR)}', file=sys.stderr)
  return records
