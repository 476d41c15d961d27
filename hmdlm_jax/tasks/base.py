"""What a task provides: its data, model features, evaluation, sampling, summary and pictures.

A task is one kind of data and what is measured on it (tasks/sudoku.py, tasks/text.py); the
registry in tasks/__init__.py picks it by `config.data.kind`. main.py trains on `task.dataset`;
evaluation/run.py restores a checkpoint, builds an `EvalContext` and calls the rest;
hmdlm_jax.load's `Model` (trained.py) offers the task's `library_calls` and draws with `draw`.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

import flax.linen as nn
import grain
import jax
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax.evaluation import batches as batches_lib
from hmdlm_jax.evaluation import compiled
from hmdlm_jax.evaluation import reports
from hmdlm_jax.models import features as model_features
from hmdlm_jax.processes import base as process_base

# The data/ builder of a task: (config, split, *, seed, process_index, process_count) -> batches.
DatasetBuilder = Callable[..., grain.IterDataset]
Records = list[dict[str, Any]]


@dataclasses.dataclass
class EvalContext:
  """What a task's evaluation and sampling read: the config, the network with its parameters
  (a `compiled.Bound`: its programs compile once per network), the process, the checkpoint step
  and `workdir`, the directory its outputs go to (the run directory, or --out)."""
  config: config_lib.Config
  apply_fn: compiled.Bound
  process: process_base.Process
  step: int
  workdir: str
  progress: bool = True


@dataclasses.dataclass(frozen=True)
class Samples(Sequence[str]):
  """Generated rows: a sequence of their texts (Sudoku: 81-digit grids), with per position
  `tokens`, `levels`, `reveal_step` (the sampler step that revealed it; T + 1 = given) and
  `given` arrays [N, L], `records`, the rows as sample mode saves them (samples_<step>.jsonl),
  and `seed`, the sampling seed they were drawn with (passing it back draws the same rows)."""
  texts: tuple[str, ...]
  tokens: np.ndarray
  levels: np.ndarray
  reveal_step: np.ndarray
  given: np.ndarray
  records: tuple[dict[str, Any], ...]
  seed: int | None = None

  def __getitem__(self, i: Any) -> Any:
    return self.texts[i]

  def __len__(self) -> int:
    return len(self.texts)


def record_field(records: Sequence[Mapping[str, Any]], name: str) -> np.ndarray:
  """Field `name` of every record, stacked."""
  return np.asarray([r[name] for r in records])


def sample_batch_size(num: int, eval_batch_size: int) -> int:
  """The rows of one sampler batch drawing `num` rows: the smallest power of two >= `num`, at
  most `eval_batch_size` (more rows run in batches of it). The sampler compiles once per batch
  shape, so any `num` reuses one of ~log2(eval_batch_size) + 1 programs; the padding rows are
  dropped, and they change no kept row: a row's noise is its slice of [B, ...] draws, which
  under JAX's partitionable threefry (the default) does not depend on B."""
  if num < 1 or eval_batch_size < 1:
    raise ValueError(f'sample_batch_size: num={num} and eval_batch_size={eval_batch_size} must '
                     'be >= 1')
  return min(1 << (num - 1).bit_length(), eval_batch_size)


def sample_seeds(config: config_lib.Config) -> tuple[int, ...]:
  """config.sample.seeds as a non-empty tuple of ints."""
  seeds = config.sample.seeds
  seeds = (seeds,) if isinstance(seeds, int) else tuple(seeds)
  if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
    raise ValueError(f'config.sample.seeds must be a non-empty tuple of ints, got {seeds!r}')
  return seeds


@dataclasses.dataclass(frozen=True)
class Task(abc.ABC):
  """A task: `build_dataset` is its Grain pipeline (data/); subclasses add the rest.

  eval_kind: the `config.eval.kind` the task evaluates with (a consistency check of the config).
  library_calls: the methods of hmdlm_jax.load's `Model` (trained.py) a run of the task offers;
    `library_refusal` ends the one-line error of any other ("..., not a text task (...)").
  """
  build_dataset: DatasetBuilder
  eval_kind: ClassVar[str]
  library_calls: ClassVar[tuple[str, ...]] = ('sample',)
  library_refusal: ClassVar[str] = ''

  def dataset(self, config: config_lib.Config, split: str, *, seed: int,
              process_index: int | None = None,
              process_count: int | None = None) -> grain.IterDataset:
    """This process's batches of `split` (data/pipeline.py); process defaults from JAX."""
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
    if process_count < 1 or not 0 <= process_index < process_count:
      raise ValueError(f'need 0 <= process_index < process_count, got {process_index}, '
                       f'{process_count}')
    if not 0 <= seed < 2**32:
      raise ValueError(f'dataset seed must lie in [0, 2**32), got {seed}')
    return self.build_dataset(config, split, seed=seed, process_index=process_index,
                              process_count=process_count)

  def model_features(self, config: config_lib.Config) -> model_features.ModelFeatures:
    """What the task adds to the model (positions, relations, input features;
    models/features.py): none by default. Every model of a run is built with them."""
    del config
    return model_features.ModelFeatures()

  def build_model(self, config: config_lib.Config) -> nn.Module:
    """The network of a run of this task: `models.build_model` with `model_features`."""
    return models.build_model(config.model, self.model_features(config))

  def check_restorable(self, config: config_lib.Config) -> None:
    """Raises ValueError when something a restored model of this task needs is missing (the text
    tasks: the tokenizer's vocabulary); hmdlm_jax.load calls it before restoring. None by
    default."""
    del config

  def draw(self, ctx: EvalContext, num: int, seed: int, given: Any = None) -> Samples:
    """`num` samples with sampling seed `seed` (`given`: rows to complete, one sample each),
    for hmdlm_jax.load's `Model.sample` and the calls in `library_calls`."""
    raise NotImplementedError(f'{type(self).__name__} does not draw samples')

  @abc.abstractmethod
  def validate(self, config: config_lib.Config) -> None:
    """Raises ValueError naming the field when the (resolved) config does not fit the task's
    data (row length, vocabulary, levels, paths); reads no data, writes nothing."""

  def eval_seeds(self, config: config_lib.Config, with_samples: bool) -> tuple[int, ...]:
    """The sampling seeds an evaluation draws with (`evaluate`'s `with_samples`); none by
    default. They name its report (`report_name`)."""
    del config, with_samples
    return ()

  def report_name(self, config: config_lib.Config, step: int, rows: int | None, *,
                  in_training: bool) -> str:
    """The file name of an evaluation of checkpoint `step` on `rows` test rows (None: all), by
    the training loop (no samples) or --mode=eval (samples): `reports.eval_file`, which says the
    split, the rows, the seeds and which of the two it was."""
    return reports.eval_file(step, rows, self.eval_seeds(config, not in_training),
                             in_training=in_training)

  def outputs(self, config: config_lib.Config, mode: str, step: int) -> tuple[str, ...]:
    """What an eval / sample run of checkpoint `step` writes into its output directory (files
    and folders; a later run refuses to replace them without --overwrite)."""
    if mode == 'eval':
      return (self.report_name(config, step, None, in_training=False),)
    return (reports.samples_file(step),) + ((reports.PICTURES_DIR,) if config.sample.pictures
                                             else ())

  def test_batches(self, config: config_lib.Config) -> Iterable[batches_lib.Batch]:
    """The whole test split on this process (every host evaluates everything; equal results)."""
    return self.dataset(config, 'test', seed=int(config.seed), process_index=0, process_count=1)

  @abc.abstractmethod
  def evaluate(self, ctx: EvalContext, max_examples: int | None, with_samples: bool
               ) -> dict[str, Any]:
    """Results (JSON-able, nested) on the first `max_examples` test examples (None: all);
    `with_samples` adds sample-based metrics that are too slow for evaluations in training."""

  @abc.abstractmethod
  def prepare_sample(self, config: config_lib.Config, inputs: Sequence[str] | None,
                     input_file: str | None, *, prompts: Sequence[str] = (),
                     infills: Sequence[str] = ()) -> Any:
    """The validated inputs of `sample` (before any checkpoint is restored) from the command
    line's `inputs` (--inputs: Sudoku grids) and / or an `input_file` (--input_file), or text
    `prompts` (--prompt) and `infills` (--infill)."""

  @abc.abstractmethod
  def sample(self, ctx: EvalContext, inputs: Any) -> tuple[Records, str]:
    """(records for OUT/samples_<step>.jsonl, printable text) of sample mode."""

  @abc.abstractmethod
  def summary(self, results: Mapping[str, Any]) -> list[str]:
    """Short human-readable lines of `evaluate`'s results."""

  @abc.abstractmethod
  def pictures(self, config: config_lib.Config, workdir: str,
               records: Records) -> list[str]:
    """Reveal-order pictures of sample-mode records in DIR/pictures; the written paths."""
