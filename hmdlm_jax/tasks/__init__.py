"""The task registry, keyed by `config.data.kind`: the only place that branches on the task.

A task (tasks/base.py) owns its data pipeline, model features, evaluation, sample mode, printed
summary, pictures and what its trained model offers from Python; `build_model(config)` is the
network of a run, built with its task's features; elsewhere a task is asked, never named
(tests/test_layout.py). `config.eval.kind` names the evaluation the config expects; it must be
the task's ('sudoku' for Sudoku, 'perplexity' for the language tasks).
"""

from __future__ import annotations

import flax.linen as nn

from hmdlm_jax import config as config_lib
from hmdlm_jax.data import corpus
from hmdlm_jax.data import lm1b
from hmdlm_jax.data import text as text_data
from hmdlm_jax.data import wikihow
from hmdlm_jax.tasks import base
from hmdlm_jax.tasks import sudoku
from hmdlm_jax.tasks import text

TASKS: dict[str, base.Task] = {
    'sudoku': sudoku.SudokuTask(),
    'text': text.TextTask(text_data.make_text_dataset, text_data.check_text_kind),
    'lm1b': text.TextTask(lm1b.make_lm1b_dataset, lm1b.check_lm1b_config),
    'wikihow': text.TextTask(wikihow.make_wikihow_dataset, wikihow.check_wikihow_config,
                             prompted=True),
    'corpus': text.TextTask(corpus.make_corpus_dataset, corpus.check_corpus_config),
}


def kinds_offering(call: str) -> tuple[str, ...]:
  """The data kinds whose trained models offer `call` (e.g. 'score': the text tasks)."""
  return tuple(kind for kind, task in TASKS.items() if call in task.library_calls)


def get(config: config_lib.Config) -> base.Task:
  """The task of `config.data.kind`, checked against `config.eval.kind`."""
  kind = config.data.kind
  if kind not in TASKS:
    raise ValueError(f'config.data.kind={kind!r} is not one of {sorted(TASKS)}')
  task = TASKS[kind]
  if config.eval.kind != task.eval_kind:
    raise ValueError(f'config.eval.kind={config.eval.kind!r} does not fit data.kind={kind!r}: its '
                     f'evaluation is {task.eval_kind!r} (set --config.eval.kind={task.eval_kind})')
  return task


def build_model(config: config_lib.Config) -> nn.Module:
  """The network of `config`: `models.build_model` with its task's features (tasks/base.py)."""
  return get(config).build_model(config)
