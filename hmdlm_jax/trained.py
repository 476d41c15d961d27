"""`hmdlm_jax.load(DIR)`: a trained run, used from Python (docs/usage.md, "From Python").

`load` reads the config the run recorded (DIR/config.json, `overrides` on top), checks and
restores a checkpoint as --mode=eval / --mode=sample do, and returns a `Model`: `sample(n)`, for
text `complete(prompts)`, `infill(texts)` and `score(texts)`, for Sudoku `solve(puzzles)` (the
task says which: `Task.library_calls`). They run the code of sample and eval mode (tasks/), so
the same rows and seed give those modes' tokens and numbers. Nothing is written or printed but
a warning on input text the tokenizer cannot represent; every mistake is one ValueError of one
line naming the argument.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
from typing import Any, Iterator, Sequence

import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax import preflight
from hmdlm_jax import processes
from hmdlm_jax import storage
from hmdlm_jax import tasks
from hmdlm_jax import train
from hmdlm_jax import workdir as workdir_lib
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.data import text as text_data
from hmdlm_jax.evaluation import compiled
from hmdlm_jax.evaluation import run as eval_run
from hmdlm_jax.tasks import base as tasks_base
from hmdlm_jax.tasks import text_given
from hmdlm_jax.tasks.base import Samples

PARAMS = ('ema', 'raw')


def _strings(value: Any, name: str) -> list[str]:
  if isinstance(value, str) or not isinstance(value, Sequence) or not value:
    raise ValueError(f'{name} must be a non-empty list of strings, got {value!r:.60}')
  return list(value)


class Model:
  """A restored checkpoint with its config (`load`); `step` is the checkpoint's step."""

  def __init__(self, config: config_lib.Config, task: tasks_base.Task,
               ctx: tasks_base.EvalContext) -> None:
    self.config, self.step = config, ctx.step
    self._task, self._ctx = task, ctx

  def _seed(self, seed: int | None) -> int:
    if seed is None:  # a fresh seed per call (returned as Samples.seed): calls share no noise
      return secrets.randbits(32)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
      raise ValueError(f'seed={seed!r} must be an int in [0, 2**32) (or None: a fresh seed)')
    return seed

  def _drawing(self, num_steps: int | None, temperature: float | None, top_p: float | None
               ) -> Model:
    """This model with a call's sampling options (`with_sampling`; None keeps the config's)."""
    fields = {k: v for k, v in (('num_steps', num_steps), ('temperature', temperature),
                                ('top_p', top_p)) if v is not None}
    return self.with_sampling(**fields) if fields else self

  def with_sampling(self, **fields: Any) -> Model:
    """This model drawing with other `sample.*` fields (e.g. num_steps=8, temperature=0.9,
    top_p=0.95); the weights are shared, nothing is read again (hmdlm_jax/front.py's sweep)."""
    config = self.config.replace(**{f'sample.{k}': v for k, v in fields.items()})
    SampleConfig.from_config(config)  # a bad value is refused here, naming the field
    return Model(config, self._task, dataclasses.replace(self._ctx, config=config))

  def offers(self, call: str) -> bool:
    """Whether this run's task offers the method `call` (e.g. 'solve': Sudoku; 'score': text)."""
    return call in self._task.library_calls

  def _task_for(self, call: str) -> Any:
    """The task, once it offers `call` (its methods are the task's own: tasks/)."""
    if not self.offers(call):
      raise ValueError(f'{call}: this run is data.kind={self.config.data.kind!r}, '
                       f'{self._task.library_refusal}')
    return self._task

  def sample(self, n: int, seed: int | None = None, *, num_steps: int | None = None,
             temperature: float | None = None, top_p: float | None = None) -> Samples:
    """`n` samples (a prompted task's are conditioned on its test rows' given positions, as in
    sample mode).

    `seed`: None draws a fresh one per call, returned as `Samples.seed` (and each record's
    'seed'); passing it back draws the same rows, and config.sample.seeds[0] gives sample mode's.
    `num_steps`, `temperature`, `top_p`: this call's sample.* settings (None: the config's), as
    `with_sampling`. Rows are drawn in power-of-two batches up to data.eval_batch_size (one
    compile per batch size and settings); row i is the same whatever `n` (tasks/base.py's
    `sample_batch_size`).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      raise ValueError(f'n={n!r} must be an int >= 1')
    model = self._drawing(num_steps, temperature, top_p)
    return model._task_for('sample').draw(model._ctx, n, self._seed(seed))

  def complete(self, prompts: Sequence[str], seed: int | None = None, *,
               num_steps: int | None = None, temperature: float | None = None,
               top_p: float | None = None) -> Samples:
    """One continuation of each prompt (`BOS prompt` given; tasks/text_given.py); `seed` and the
    sampling options as `sample`'s.

    Its text begins with the decoded tokenized prompt, not the prompt verbatim: for
    bert-base-uncased lower-cased and accent-stripped ('Café' -> 'cafe'), and without the pieces
    the vocabulary lacks, which become `[UNK]` (decoded as nothing); a prompt holding such pieces
    gets one `text_given.UnknownPiecesWarning` naming them.
    """
    task = self._task_for('complete')
    model = self._drawing(num_steps, temperature, top_p)
    given = text_given.given_rows(self.config, self._tokenizer(),
                                  _strings(prompts, 'prompts'), stacklevel=2)
    return task.draw(model._ctx, len(given), self._seed(seed), given)

  def infill(self, texts: Sequence[str], seed: int | None = None, *,
             num_steps: int | None = None, temperature: float | None = None,
             top_p: float | None = None) -> Samples:
    """Each text with its `[MASK]` (one token) and `[MASK*n]` (n tokens) spans generated and
    every other token kept (tasks/text_given.py), as tokenized: as `complete`'s prompt, the kept
    text is decoded lower-cased / accent-stripped for bert-base-uncased, pieces outside the
    vocabulary become `[UNK]` and a text holding any gets one `UnknownPiecesWarning`. `seed` and
    the sampling options as `sample`'s."""
    task = self._task_for('infill')
    model = self._drawing(num_steps, temperature, top_p)
    given = text_given.given_rows(self.config, self._tokenizer(),
                                  infills=_strings(texts, 'texts'), stacklevel=2)
    return task.draw(model._ctx, len(given), self._seed(seed), given)

  def solve(self, puzzles: Sequence[str]) -> Samples:
    """Sudoku: the grids of `puzzles` (81 characters, '.' or '0' = blank), as sample mode's
    --inputs; records hold 'valid' (a valid grid keeping the givens)."""
    return self._task_for('solve').solve(self._ctx, _strings(puzzles, 'puzzles'))

  def score(self, texts: Sequence[str], *, truncate: bool = False) -> dict[str, Any]:
    """The bound (nats/token, PPL) and the process's estimates over `texts`, each one row of the
    data: --mode=eval's numbers, by its code and settings (eval.time_seed, num_t_samples);
    'per_text' lists each text's bound_nats_per_token, ppl and num_tokens from the same draws
    (their num_tokens-weighted mean is bound_nats_per_token). A text's t is stratified over the
    rows of its batch, as in --mode=eval, so its numbers depend on the texts scored with it.

    A text longer than a row holds (model.seq_len - 2 tokens) is refused: one ValueError naming
    it, its token count and model.seq_len. `truncate=True` scores only its first model.seq_len - 2
    tokens, as --mode=eval does with data.overlong='truncate' (`num_tokens` counts what was
    scored); with it the numbers on the test split's rows, in order, equal --mode=eval's under
    that setting.
    Texts are not scored in windows: each window would be a row of its own (BOS ... EOS), so the
    windows' bounds do not add up to the text's.
    """
    task = self._task_for('score')
    if not isinstance(truncate, bool):
      raise ValueError(f'truncate={truncate!r} must be True or False')
    batches = _padded(text_given.score_batches(self.config, self._tokenizer(),
                                               _strings(texts, 'texts'), truncate=truncate),
                      int(self.config.data.eval_batch_size))
    # A second pass over the same draws: evaluate_perplexity returns only the aggregate.
    return {**task.perplexity(self._ctx, batches),
            'per_text': task.per_text_scores(self._ctx, batches)}

  def _tokenizer(self) -> Any:
    return text_data.checked_tokenizer(self.config)


def _padded(batches: list[dict[str, np.ndarray]], eval_batch_size: int
            ) -> list[dict[str, np.ndarray]]:
  """`batches` [B, L] with a short first batch padded to `sample_batch_size` rows of weight 0
  (not scored): the perplexity program then compiles once per power-of-two bucket. The numbers
  do not change: t is stratified over the valid rows, a row's noise does not depend on B."""
  first = batches[0]
  n = len(first['tokens'])
  size = tasks_base.sample_batch_size(n, eval_batch_size)
  if size == n:
    return batches
  padded = {k: np.concatenate([v, np.repeat(v[:1], size - n, axis=0)]) for k, v in first.items()}
  padded['weight'] = (np.arange(size) < n).astype(np.float32)  # batches.VALID_FIELDS: validity
  return [padded, *batches[1:]]


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
  """Drops Orbax's notes on a read-only checkpoint directory (warnings on the 'absl' logger): a
  library call prints nothing unless something is wrong."""
  def quiet(record: logging.LogRecord) -> bool:
    return record.levelno > logging.WARNING or f'{os.sep}orbax{os.sep}' not in record.pathname
  logger = logging.getLogger('absl')
  logger.addFilter(quiet)
  try:
    yield
  finally:
    logger.removeFilter(quiet)


def _model_overrides(workdir: str, step: int | None, overrides: Sequence[str],
                     use_ema: Sequence[str], config: config_lib.Config) -> str | None:
  """The one short message for `overrides` that change the model a checkpoint holds, or None if
  they are not the cause: the checkpoint check's own message lists every mismatched array (long,
  and about a resume), while here dropping the overrides is the whole fix. They are the cause when
  the same checkpoint passes with the recorded config."""
  if not overrides:
    return None
  recorded = config_lib.resolve(config_lib.load(workdir, list(use_ema)))
  changes = [c for c in workdir_lib.config_changes(workdir_lib.config_to_dict(recorded), config)
             if c.startswith('model.')]
  if not changes:
    return None
  try:
    found = preflight.check_checkpoint(recorded, workdir, step,
                                       tasks.get(recorded).build_model(recorded))
  except ValueError:
    return None
  fields = {c.split(':', 1)[0] for c in changes}
  named = [o for o in overrides
           if o.split('=', 1)[0].removeprefix('--config.').removeprefix('--noconfig.') in fields]
  message = (f'overrides {_few(named or overrides, 2)} change the model of checkpoint {found} '
             f'({_few(changes, 2)}): its weights fit only the recorded model; drop them (fields '
             'outside model.*, e.g. sample.*, may be overridden)')
  return message if len(message) <= 300 else message[:297] + '...'


def _few(items: Sequence[str], n: int) -> str:
  """The first `n` of `items` (each cut to 60 characters), '; '-joined, then how many more."""
  shown = '; '.join(i if len(i) <= 60 else i[:57] + '...' for i in items[:n])
  return shown + (f' and {len(items) - n} more' if len(items) > n else '')


def load(workdir: str | os.PathLike[str], step: int | None = None, params: str | None = None,
         overrides: Sequence[str] = ()) -> Model:
  """The trained run in `workdir` (local or gs://): its recorded config, checkpoint `step`
  (None: the latest), EMA or raw parameters (`params`; None: config.eval.use_ema, as
  --mode=eval), `overrides` (e.g. '--config.sample.num_steps=64') on the recorded config."""
  workdir = os.fspath(workdir)
  if params is not None and params not in PARAMS:
    raise ValueError(f'params={params!r} must be one of {PARAMS} (or None: config.eval.use_ema)')
  if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
    raise ValueError(f'step={step!r} must be an int >= 0 (or None: the latest checkpoint)')
  if isinstance(overrides, str) or not isinstance(overrides, Sequence) or not all(
      isinstance(o, str) for o in overrides):
    raise ValueError(f'overrides={overrides!r:.80} must be a list of --config.a.b=value strings')
  overrides = list(overrides)
  if not storage.isfile(storage.join(workdir, 'config.json')):
    raise ValueError(f'workdir={workdir!r} holds no config.json: give the --workdir of a '
                     'training run')
  use_ema = [] if params is None else [f'--config.eval.use_ema={params == "ema"}']
  config = config_lib.resolve(config_lib.load(workdir, [*overrides, *use_ema]))
  task = tasks.get(config)
  task.check_restorable(config)
  model = task.build_model(config)
  with _quiet_orbax():
    try:
      checked = preflight.check_checkpoint(config, workdir, step, model)
    except ValueError as e:
      message = _model_overrides(workdir, step, overrides, use_ema, config)
      if message is None:
        raise
      raise ValueError(message) from e
    state, step = train.restore_for_eval(config, workdir, checked, model=model)
  apply_fn = compiled.flax_network(model).bind(eval_run.eval_params(config, state))
  ctx = tasks_base.EvalContext(config=config, apply_fn=apply_fn, process=processes.build(config),
                               step=step, workdir=workdir, progress=False)
  return Model(config, task, ctx)
