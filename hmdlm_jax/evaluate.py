"""Evaluation and sampling entry points (SPEC 7, 8): Sudoku solving, perplexity, text samples.

Importable pieces (a notebook can call them on any `apply_fn` of the denoiser contract, design.md):

* `evaluate_sudoku(apply_fn, key, schedule, sample_cfg, batches)`: solve rate, cell accuracy on the
  blanks, cell accuracy per labeller level, constraint validity, drawn-vs-labeller level
  disagreement and NFE, for greedy and stochastic decoding and every sampling seed (reported
  separately, then mean and std over seeds). The sampler is jitted once per decoding for the batch
  shape; a short last batch is padded and the padded rows are dropped from every count.
* `evaluate_perplexity(apply_fn, schedule, loss_cfg, batches, time_seed=, num_t_samples=)`: the
  rigorous bound of SPEC 8 per token and PPL = exp(bound), split into lm / hier / cons, the
  Appendix E *estimate* (`ppl_appendix_e_estimate`, not comparable with MDLM's bound), MDLM's bound
  for K = 1 (the same function), token count and a standard error. Sums are float64 on the host.
* `sample_rows` + `text_sample_metrics`: text samples (unconditional, or conditioned on prompts'
  given positions) and their entropy, gen PPL, MAUVE (generative_metrics.py; None with a reason
  when the scorer / featuriser is not available locally) and drawn-vs-recomputed level
  disagreement; cut at the first [SEP] / EOS.
* `sudoku_metrics`, `parse_puzzle`, `read_puzzle_file`, `check_quiz`, `format_sudoku`: numpy
  helpers.

Entry points of main.py: `run_eval(config, workdir, step=None)` (DIR/eval_<step>.json + a printed
summary), `run_sample(config, workdir, puzzles=, puzzle_file=, out=)` (printed grids / texts +
DIR/samples_<step>.jsonl with every token's reveal step) and, for the training loop,
`evaluate_during_training(config, state, step, workdir)` (the same evaluators on
config.eval.num_examples, flat scalars returned). Task-specific code lives in small "task
adapters" registered in `TASKS` under `config.eval.kind` ('sudoku', 'perplexity'). Config fields
read with defaults (not in configs/base.py): eval.num_samples (text samples per seed, 0 = none),
eval.decodings (('greedy', 'stochastic')), eval.gen_ppl_model and eval.mauve_featurizer
('gpt2-large').

Perplexity protocol (SPEC 8). For batch j and t-sample r the key is
`fold_in(fold_in(PRNGKey(time_seed), j), r)`. t is stratified over the batch's real rows (MDLM's
antithetic sampler, `corruption.sample_times`) and then randomly permuted over them, so every
example's t is marginally U(t_min, 1) -- a fixed row->stratum assignment would give an example in
row i always a t from stratum i -- while the batch still covers [t_min, 1) evenly. Each example
contributes `value_i · n_i` nats (the loss functions divide by the example's n_i loss positions,
SPEC 5); the corpus value is Σ nats / Σ n_i, summed in numpy float64 (JAX computes the per-example
values in float32; a float32 running sum over a test set drifts visibly). Non-finite per-example
values raise `FloatingPointError` naming the batch, row, term and t; they are never averaged away.
The standard error treats examples as independent units (ratio estimator); stratifying t only lowers
the true variance, so it is conservative. The offset schedule's per-sample variance is heavy-tailed
(SPEC 8): read the standard error with that in mind.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax import generative_metrics
from hmdlm_jax import processes
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.data import sudoku as sudoku_data
from hmdlm_jax.processes import base as process_base
from hmdlm_jax.processes.base import Process

ApplyFn = Callable[..., dict]
Batch = Mapping[str, np.ndarray]

DECODINGS = ('greedy', 'stochastic')
# Field a pipeline may add to mark real rows of a padded eval batch (bool [B]); checked in order.
VALID_FIELDS = ('weight', 'valid')  # data/pipeline.py: weight float32 [B], 1 real / 0 padding


# ----------------------------------------------------------------------------------------------
# Jitting an apply_fn: parameters as traced arguments when we know them.


@dataclasses.dataclass(frozen=True, eq=False)
class ParamsApply:
  """An apply_fn `builder(params)` that keeps its parameters apart from the function.

  It is itself a valid apply_fn. Evaluators jit `builder(params)` with `params` as a traced argument
  and cache the compiled function on `builder` (hashable), so one compilation serves every
  checkpoint / training step of the same model. A plain apply_fn closure works too; it is simply
  recompiled per call of an evaluator.
  """
  builder: Callable[[Any], ApplyFn]
  params: Any = dataclasses.field(repr=False)

  def __call__(self, tokens: jax.Array, levels: jax.Array, t: jax.Array, **kwargs: Any) -> dict:
    return self.builder(self.params)(tokens, levels, t, **kwargs)


@dataclasses.dataclass(frozen=True)
class FlaxApplyBuilder:
  """`params -> models.make_apply_fn(model, params, train=False)`; hashable through the module."""
  model: Any

  def __call__(self, params: Any) -> ApplyFn:
    from hmdlm_jax import models  # pylint: disable=g-import-not-at-top
    return models.make_apply_fn(self.model, params, train=False)


_COMPILED: dict[Any, Callable[..., Any]] = {}
_COMPILED_MAX = 32


def _jit_apply(apply_fn: ApplyFn, make: Callable[[ApplyFn], Callable[..., Any]],
               static: tuple[Any, ...]) -> Callable[..., Any]:
  """`jax.jit(make(apply_fn))`, with the parameters traced (and the result cached) if possible.

  `static` must identify everything `make` closes over besides apply_fn (schedule, configs, shapes).
  """
  if isinstance(apply_fn, ParamsApply):
    try:
      cache_key = (apply_fn.builder, static)
      hash(cache_key)
    except TypeError:
      cache_key = None
    fn = _COMPILED.get(cache_key) if cache_key is not None else None
    if fn is None:
      builder = apply_fn.builder
      fn = jax.jit(lambda params, *args: make(builder(params))(*args))
      if cache_key is not None:
        if len(_COMPILED) >= _COMPILED_MAX:
          _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[cache_key] = fn
    return functools.partial(fn, apply_fn.params)
  return jax.jit(make(apply_fn))


# ----------------------------------------------------------------------------------------------
# Batches: fixed shape, padded rows marked.


def _row_validity(batch: Batch) -> np.ndarray:
  """bool [B]: the pipeline's per-row validity field if present, else all True."""
  b = np.asarray(batch['tokens']).shape[0]
  for name in VALID_FIELDS:
    if name in batch:
      v = np.asarray(batch[name]) > 0
      if v.shape != (b,):
        raise ValueError(f'batch[{name!r}] must have shape [B]=({b},), got {v.shape}')
      return v
  return np.ones((b,), bool)


def _check_batch(batch: Batch, where: str) -> None:
  for name in ('tokens', 'levels', 'given', 'loss_mask'):
    if name not in batch:
      raise ValueError(f'{where}: batch has no field {name!r} (fields: {sorted(batch)}); the '
                       'pipeline must provide tokens, levels, given, loss_mask (design.md)')
  shape = np.asarray(batch['tokens']).shape
  if len(shape) != 2:
    raise ValueError(f'{where}: tokens must be [B, L], got shape {shape}')
  for name in ('levels', 'given', 'loss_mask'):
    if np.asarray(batch[name]).shape != shape:
      raise ValueError(f'{where}: {name} has shape {np.asarray(batch[name]).shape}, tokens {shape}')


def _fixed_batches(batches: Iterable[Batch], *, max_examples: int | None = None,
                   what: str = 'batches') -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
  """Yields (batch with the first batch's row count, valid [B]); stops after `max_examples` rows.

  A shorter batch is padded by repeating its first row (finite values everywhere); padded and
  beyond-`max_examples` rows are marked invalid.
  """
  size = None
  seen = 0
  for j, batch in enumerate(batches):
    if max_examples is not None and seen >= max_examples:
      return
    _check_batch(batch, f'{what}[{j}]')
    valid = _row_validity(batch)
    core = {k: np.asarray(batch[k]) for k in ('tokens', 'levels', 'given', 'loss_mask')}
    b = core['tokens'].shape[0]
    if size is None:
      size = b
    if b > size:
      raise ValueError(f'{what}[{j}] has {b} rows, more than the first batch ({size}); batches '
                       'must not grow (pad the last one, or use a fixed eval_batch_size)')
    if b < size:
      pad = size - b
      core = {k: np.concatenate([v, np.repeat(v[:1], pad, axis=0)]) for k, v in core.items()}
      valid = np.concatenate([valid, np.zeros((pad,), bool)])
    if max_examples is not None:
      room = max_examples - seen
      valid = valid & (np.cumsum(valid) <= room)
    seen += int(valid.sum())
    if valid.any():
      yield core, valid


def _progress(iterable: Iterable[Any] | None, *, desc: str, enabled: bool,
              total: int | None = None) -> Any:
  """tqdm over `iterable` (or a manual bar when None); the iterable itself (or None) if disabled."""
  if not enabled:
    return iterable
  import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm.tqdm(iterable, desc=desc, total=total, unit='batch', leave=False)


# ----------------------------------------------------------------------------------------------
# Sudoku metrics (SPEC 8): pure numpy on token grids (digits 1..9 -> tokens 0..8, MASK = 9).


def sudoku_counts(pred: np.ndarray, solution: np.ndarray, given: np.ndarray, levels: np.ndarray,
                  num_levels: int, *, drawn_levels: np.ndarray | None = None,
                  valid: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Integer counts behind the Sudoku metrics, for summing over batches.

  Args:
    pred: int [N, 81] predicted tokens (0..8; anything else, e.g. MASK, counts as wrong).
    solution: int [N, 81] solution tokens 0..8.
    given: bool [N, 81] clue cells.
    levels: int [N, 81] labeller levels (SPEC 6) of the cells.
    num_levels: K.
    drawn_levels: int [N, 81] levels the sampler drew, or None.
    valid: bool [N] rows to count (padding excluded), or None for all.

  Returns:
    dict of int64 arrays: puzzles, solved, valid_grid, givens_kept, blanks, blanks_correct,
    level_count [K], level_correct [K], level_checked (blanks with a drawn level),
    level_disagree, unfilled.
  """
  pred, solution = np.asarray(pred), np.asarray(solution)
  given, levels = np.asarray(given, bool), np.asarray(levels)
  n = pred.shape[0]
  for name, a in (('pred', pred), ('solution', solution), ('given', given), ('levels', levels)):
    if a.shape != (n, sudoku_data.NUM_CELLS):
      raise ValueError(f'sudoku_counts: {name} must be [N, 81] with N={n}, got {a.shape}')
  rows = np.ones((n,), bool) if valid is None else np.asarray(valid, bool)
  if levels.size and (levels.min() < 0 or levels.max() >= num_levels):
    raise ValueError(f'sudoku_counts: levels must lie in 0..{num_levels - 1}')
  blank = ~given & rows[:, None]
  correct = pred == solution
  digits = np.where((pred >= 0) & (pred <= 8), pred + 1, 0)  # tokens -> digits, else blank
  givens_kept = np.all(~given | correct, axis=-1)
  valid_grid = sudoku_data.is_valid_solution(digits) & givens_kept
  level_onehot = levels[..., None] == np.arange(num_levels)  # [N, 81, K]
  out = {
      'puzzles': rows.sum(),
      'solved': (np.all(correct, axis=-1) & rows).sum(),
      'valid_grid': (valid_grid & rows).sum(),
      'givens_kept': (givens_kept & rows).sum(),
      'blanks': blank.sum(),
      'blanks_correct': (blank & correct).sum(),
      'level_count': (blank[..., None] & level_onehot).sum((0, 1)),
      'level_correct': ((blank & correct)[..., None] & level_onehot).sum((0, 1)),
      'unfilled': (blank & (digits == 0)).sum(),
      'level_checked': np.int64(0),
      'level_disagree': np.int64(0),
  }
  if drawn_levels is not None:
    out['level_checked'] = blank.sum()
    out['level_disagree'] = (blank & (np.asarray(drawn_levels) != levels)).sum()
  return {k: np.asarray(v, np.int64) for k, v in out.items()}


def _ratio(num: float, den: float) -> float | None:
  return float(num) / float(den) if den > 0 else None


def sudoku_metrics_from_counts(c: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """Rates from `sudoku_counts` (summed): None where the denominator is 0 (nothing to measure)."""
  out: dict[str, Any] = {
      'num_puzzles': int(c['puzzles']),
      'solve_rate': _ratio(c['solved'], c['puzzles']),  # whole grid exact
      'cell_accuracy': _ratio(c['blanks_correct'], c['blanks']),  # blanks only
      'valid_rate': _ratio(c['valid_grid'], c['puzzles']),  # valid Sudoku agreeing with the clues
      'givens_kept_rate': _ratio(c['givens_kept'], c['puzzles']),
      # drawn level (sampler) vs labeller level of the blanks; None without drawn levels
      'level_disagreement': _ratio(c['level_disagree'], c['level_checked']),
      'unfilled_rate': _ratio(c['unfilled'], c['blanks']),
  }
  for k in range(len(c['level_count'])):
    out[f'cell_accuracy_level_{k}'] = _ratio(c['level_correct'][k], c['level_count'][k])
    out[f'num_cells_level_{k}'] = int(c['level_count'][k])
  return out


def sudoku_metrics(pred: np.ndarray, solution: np.ndarray, given: np.ndarray, levels: np.ndarray,
                   num_levels: int, *, drawn_levels: np.ndarray | None = None,
                   valid: np.ndarray | None = None) -> dict[str, Any]:
  """`sudoku_metrics_from_counts(sudoku_counts(...))` for one set of predictions."""
  return sudoku_metrics_from_counts(sudoku_counts(pred, solution, given, levels, num_levels,
                                                  drawn_levels=drawn_levels, valid=valid))


def _add_counts(acc: dict[str, np.ndarray] | None,
                c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return dict(c) if acc is None else {k: acc[k] + c[k] for k in acc}


def _mean_std(per_seed: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
  """Mean and (population) std over seeds of every numeric metric; None if any seed has None."""
  mean, std = {}, {}
  for k in per_seed[0]:
    vals = [d[k] for d in per_seed]
    if all(isinstance(v, str) for v in vals):  # reasons / names: kept per seed only
      continue
    if any(v is None or isinstance(v, (str, bool)) for v in vals):
      mean[k] = std[k] = None
      continue
    a = np.asarray(vals, np.float64)
    mean[k], std[k] = float(a.mean()), float(a.std())
  return mean, std


def _sudoku_sampler(apply_fn: ApplyFn, process: Process, cfg: SampleConfig,
                    batch_size: int) -> Callable[..., process_base.SampleOutput]:
  """Jitted `(key, given_tokens, given_levels, given_mask) -> SampleOutput` for [B, 81]."""
  process.check_sampling(cfg)

  def make(a: ApplyFn) -> Callable[..., process_base.SampleOutput]:
    def run(key, given_tokens, given_levels, given_mask):
      return process.sample(a, key, cfg, batch_size=batch_size, seq_len=sudoku_data.NUM_CELLS,
                            given_tokens=given_tokens, given_levels=given_levels,
                            given_mask=given_mask)
    return run

  return _jit_apply(apply_fn, make, ('sudoku_sample', process, cfg, batch_size))


def model_levels(levels: np.ndarray, num_levels: int, *, where: str = 'batch') -> np.ndarray:
  """The data's levels as the model sees them (the rule of `train.model_batch`).

  K = 1 is MDLM (SPEC 2): every level is 0, so an HMDLM data pipeline (e.g. the Sudoku labeller's
  0..5) feeds its MDLM twin; evaluation metrics keep the data's levels. For K > 1 a level outside
  0..K-1 is a config/data mismatch and raises.
  """
  levels = np.asarray(levels)
  if num_levels == 1:
    return np.zeros_like(levels, dtype=np.int32)
  if levels.size and (levels.min() < 0 or levels.max() >= num_levels):
    raise ValueError(f'{where}: hierarchy levels in [{levels.min()}, {levels.max()}] but '
                     f'model.num_levels={num_levels}; levels must lie in 0..K-1 (or K = 1, MDLM)')
  return levels.astype(np.int32)


def _given_inputs(batch: Mapping[str, np.ndarray], cfg: SampleConfig
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Sampler conditioning [B, L]: given tokens/levels; elsewhere MASK / h_m, so no answer leaks."""
  given = np.asarray(batch['given'], bool)
  tokens = np.where(given, batch['tokens'], cfg.mask_id).astype(np.int32)
  levels = model_levels(batch['levels'], cfg.num_levels, where='given levels')
  levels = np.where(given, levels, cfg.num_levels).astype(np.int32)
  return tokens, levels, given


def evaluate_sudoku(apply_fn: ApplyFn, key: jax.Array, process: Process,
                    sample_cfg: SampleConfig, batches: Iterable[Batch], *,
                    seeds: Sequence[int] = (0,), decodings: Sequence[str] = DECODINGS,
                    max_examples: int | None = None, progress: bool = True) -> dict[str, Any]:
  """Solves every puzzle of `batches` once per (decoding, seed) and scores the grids (SPEC 8).

  Args:
    apply_fn: denoiser (design.md); a `ParamsApply` compiles once for all checkpoints.
    key: base PRNG key; (seed, batch j) use `fold_in(fold_in(key, seed), j)` for every decoding.
    process: the model's forward process.
    sample_cfg: sampler settings; `greedy` is overridden per decoding, the rest is kept
      (ordering, T, temperature, cache).
    batches: iterable of pipeline batches: tokens = solution tokens [B, 81], levels = labeller
      levels, given = clue cells, loss_mask (+ optional per-row validity field, VALID_FIELDS).
    seeds: sampling seeds; each is reported, then mean and std over seeds.
    decodings: subset of ('greedy', 'stochastic').
    max_examples: evaluate only the first this many puzzles.
    progress: tqdm bar over batches.

  Returns:
    {'num_puzzles', 'seeds', '<decoding>': {'per_seed': {seed: metrics}, 'mean': ..., 'std': ...,
     'seconds': ...}}; metrics as `sudoku_metrics` plus 'nfe' (mean network calls per batch).
  """
  bad = [d for d in decodings if d not in DECODINGS]
  if bad or not decodings:
    raise ValueError(f'evaluate_sudoku: decodings must be a non-empty subset of {DECODINGS}, got '
                     f'{tuple(decodings)}')
  if not seeds:
    raise ValueError('evaluate_sudoku: config.sample.seeds is empty; give at least one seed')
  data = list(_fixed_batches(batches, max_examples=max_examples, what='sudoku batches'))
  if not data:
    raise ValueError('evaluate_sudoku: no puzzles to evaluate (empty batches)')
  if data[0][0]['tokens'].shape[1] != sudoku_data.NUM_CELLS:
    raise ValueError(f'evaluate_sudoku: batches must have 81 cells per row, got '
                     f'{data[0][0]["tokens"].shape[1]}')
  batch_size = data[0][0]['tokens'].shape[0]
  # Per-level metrics use the labeller's levels, whatever the model's K (an MDLM, K = 1, is scored
  # per labeller level too, as in the paper's Table 8); drawn levels exist only for K > 1.
  label_levels = max(sudoku_data.NUM_LEVELS, sample_cfg.num_levels)
  hier = sample_cfg.num_levels > 1
  result: dict[str, Any] = {'num_puzzles': int(sum(v.sum() for _, v in data)),
                            'seeds': [int(s) for s in seeds]}
  for decoding in decodings:
    cfg = dataclasses.replace(sample_cfg, greedy=decoding == 'greedy')
    run = _sudoku_sampler(apply_fn, process, cfg, batch_size)
    start = time.perf_counter()
    per_seed = {}
    for seed in seeds:
      counts, nfe = None, []
      seed_key = jax.random.fold_in(key, int(seed))
      # Dispatch every batch first (asynchronous), then fetch: host scoring overlaps decoding.
      outs = [run(jax.random.fold_in(seed_key, j), *_given_inputs(batch, cfg))
              for j, (batch, _) in enumerate(data)]
      it = _progress(zip(data, outs), desc=f'sudoku {decoding} seed {seed}', enabled=progress,
                     total=len(data))
      for (batch, valid), out in it:
        out = jax.device_get(out)
        counts = _add_counts(counts, sudoku_counts(
            out.tokens, batch['tokens'], batch['given'], batch['levels'], label_levels,
            drawn_levels=out.levels if hier else None, valid=valid))
        nfe.append(int(out.nfe))
      metrics = sudoku_metrics_from_counts(counts)
      metrics['nfe'] = float(np.mean(nfe))
      per_seed[str(int(seed))] = metrics
    mean, std = _mean_std(list(per_seed.values()))
    result[decoding] = {'per_seed': per_seed, 'mean': mean, 'std': std,
                        'seconds': time.perf_counter() - start}
  return result


# ----------------------------------------------------------------------------------------------
# Perplexity (SPEC 8).


class NatsAccumulator:
  """Float64 host sums for a token-weighted corpus average and its standard error.

  `add(nats, tokens)` takes per-example totals (nats summed over the example's loss positions,
  float [N]) for each named term and the examples' token counts [N]. The corpus value of a term is
  Σ nats / Σ tokens; its standard error is the ratio estimator's
  `sqrt(N/(N-1) · Σ (nats_i - R tokens_i)^2) / Σ tokens` with examples as independent units.
  """

  def __init__(self, names: Sequence[str]) -> None:
    self.names = tuple(names)
    self.tokens = np.float64(0.0)
    self.tokens_sq = np.float64(0.0)
    self.count = 0
    self.sum = {n: np.float64(0.0) for n in self.names}
    self.sum_sq = {n: np.float64(0.0) for n in self.names}
    self.sum_cross = {n: np.float64(0.0) for n in self.names}

  def add(self, nats: Mapping[str, np.ndarray], tokens: np.ndarray) -> None:
    tok = np.asarray(tokens, np.float64)
    self.tokens += tok.sum()
    self.tokens_sq += (tok * tok).sum()
    self.count += tok.size
    for n in self.names:
      v = np.asarray(nats[n], np.float64)
      if v.shape != tok.shape:
        raise ValueError(f'NatsAccumulator: {n} has shape {v.shape}, tokens {tok.shape}')
      self.sum[n] += v.sum()
      self.sum_sq[n] += (v * v).sum()
      self.sum_cross[n] += (v * tok).sum()

  def mean(self, name: str) -> float:
    if self.tokens <= 0:
      raise ValueError('NatsAccumulator: no tokens accumulated (every loss_mask empty?)')
    return float(self.sum[name] / self.tokens)

  def stderr(self, name: str) -> float:
    if self.count < 2:
      return float('nan')
    r = self.sum[name] / self.tokens
    ss = self.sum_sq[name] - 2.0 * r * self.sum_cross[name] + r * r * self.tokens_sq
    return float(math.sqrt(max(ss, 0.0) * self.count / (self.count - 1)) / self.tokens)


def _perplexity_step(apply_fn: ApplyFn, process: Process) -> Callable[..., dict[str, jax.Array]]:
  """Jitted `(batch, key, t) -> {bound terms..., 'bound', estimates...}`, per-example [B].

  One noisy state z_t per example serves both the bound and the process's further estimates
  (common random numbers: their difference is less noisy than two independent draws); the pair
  (corruption key, process key) is split exactly as `Process.bound` splits its key.
  """

  def make(a: ApplyFn) -> Callable[..., dict[str, jax.Array]]:
    def run(batch, key, t):
      chex.assert_rank(batch['tokens'], 2)
      chex.assert_shape(t, (batch['tokens'].shape[0],))
      k_state, k_own = jax.random.split(key)
      state = process.corrupt(k_state, batch, t)
      bound = process.bound_from_state(a, batch, state, t, k_own)
      # The terms add up to the bound: summed on the host in float64 (`evaluate_perplexity`).
      out = {n: v for n, v in bound.items() if n not in ('total', 'num_tokens')}
      out.update(process.estimates_from_state(a, batch, state, t))
      chex.assert_shape(list(out.values()), t.shape)  # per-example values [B]
      return out
    return run

  return _jit_apply(apply_fn, make, ('perplexity', process))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _stratified_valid_times(key: jax.Array, n: int, t_min: float) -> jax.Array:
  k_t, k_perm = jax.random.split(key)
  t = process_base.sample_times(k_t, n, t_min=t_min, antithetic=True)
  return jax.random.permutation(k_perm, t)


def _stratified_times(key: jax.Array, valid: np.ndarray, t_min: float) -> np.ndarray:
  """t [B] float32: stratified over the valid rows, randomly permuted over them (module doc)."""
  t = np.full(valid.shape, 0.5, np.float32)  # padded rows: any finite time, never counted
  t[valid] = np.asarray(_stratified_valid_times(key, int(valid.sum()), float(t_min)))
  return t


def _raise_non_finite(values: Mapping[str, np.ndarray], valid: np.ndarray, t: np.ndarray,
                      batch_index: int, r: int) -> None:
  bad = valid & ~np.all([np.isfinite(v) for v in values.values()], axis=0)  # [B]
  if bad.any():
    i = int(np.argmax(bad))
    terms = ', '.join(f'{n}={values[n][i]}' for n in values if not np.isfinite(values[n][i]))
    raise FloatingPointError(
        f'evaluate_perplexity: non-finite per-example value(s) {terms} for batch {batch_index}, '
        f'row {i} (t = {t[i]:.6g}, t-sample {r}); {int(bad.sum())} such rows in this batch. '
        'Refusing to average a NaN/Inf; check the model (e.g. a hierarchy head without prior '
        'correction near t = δ_k, docs/method.md §4) or the data.')


def _exp(x: float) -> float:
  """exp that overflows to inf (an untrained model's PPL can exceed float64) instead of raising."""
  return math.exp(x) if x < 709.0 else math.inf


def evaluate_perplexity(apply_fn: ApplyFn, process: Process, batches: Iterable[Batch], *,
                        time_seed: int, num_t_samples: int = 1, t_min: float = 1e-3,
                        max_examples: int | None = None, progress: bool = True
                        ) -> dict[str, Any]:
  """Rigorous bound, PPL and Appendix E estimate over the whole split (SPEC 8; module doc).

  Args:
    apply_fn: denoiser (design.md); pass a `ParamsApply` to compile once per model.
    process: the model's forward process (static: hashable).
    batches: pipeline batches (+ optional per-row validity field, VALID_FIELDS).
    time_seed: fixed seed of t and of the masks (config.eval.time_seed).
    num_t_samples: t draws per example (config.eval.num_t_samples); averaged per example.
    t_min: lower end of t ~ U(t_min, 1) (config.loss.t_min).
    max_examples: only the first this many examples.
    progress: tqdm bar.

  Returns:
    dict: bound_nats_per_token, bound_stderr, ppl (= exp bound), lm/hier/cons_nats_per_token,
    appendix_e_nats_per_token_estimate, ppl_appendix_e_estimate, num_tokens, num_sequences,
    num_t_samples, time_seed, t_min, bound_kind ('mdlm' for K = 1, else 'hmdlm').
  """
  if isinstance(num_t_samples, bool) or not isinstance(num_t_samples, int) or num_t_samples < 1:
    raise ValueError(f'eval.num_t_samples must be an integer >= 1, got {num_t_samples!r}')
  step = _perplexity_step(apply_fn, process)
  acc = names = None
  base = jax.random.PRNGKey(int(time_seed))
  it = _fixed_batches(batches, max_examples=max_examples, what='perplexity batches')
  for j, (batch, valid) in enumerate(_progress(it, desc='perplexity', enabled=progress)):
    batch = process.prepare_batch(batch)
    device_batch = {k: jnp.asarray(v) for k, v in batch.items()}
    n_tok = (batch['loss_mask'] & valid[:, None]).sum(-1).astype(np.float64)  # [B]
    batch_key = jax.random.fold_in(base, j)
    pending = []  # dispatch every t-sample of the batch before fetching any (async dispatch)
    for r in range(num_t_samples):
      k_t, k_mask = jax.random.split(jax.random.fold_in(batch_key, r))
      t = _stratified_times(k_t, valid, t_min)
      pending.append((t, step(device_batch, k_mask, jnp.asarray(t))))
    for r, (t, out) in enumerate(pending):
      values = {n: np.asarray(v, np.float64) for n, v in jax.device_get(out).items()}
      _raise_non_finite(values, valid, t, j, r)
      terms = [n for n in values if n not in process.estimate_names]
      values['bound'] = sum(values[n] for n in terms)
      if acc is None:
        names = tuple(values)
        acc = NatsAccumulator(names)
      if r == 0:
        totals = {n: np.zeros(valid.shape, np.float64) for n in names}
      for n in names:
        # Per-example value = nats / n_i (SPEC 5) -> nats; averaged over the t-samples.
        totals[n] += np.where(valid, values[n], 0.0) * n_tok / num_t_samples
    acc.add({n: v[valid] for n, v in totals.items()}, n_tok[valid])
  if acc is None or acc.count == 0:
    raise ValueError('evaluate_perplexity: no examples to evaluate (empty batches)')
  bound = acc.mean('bound')
  out = {'bound_nats_per_token': bound, 'bound_stderr': acc.stderr('bound'), 'ppl': _exp(bound)}
  terms = [n for n in names if n != 'bound' and n not in process.estimate_names]
  out.update({f'{n}_nats_per_token': acc.mean(n) for n in terms})
  for n in process.estimate_names:
    est = acc.mean(n)
    out[f'{n}_nats_per_token_estimate'] = est
    out[f'ppl_{n}_estimate'] = _exp(est)
  out.update(num_tokens=int(acc.tokens), num_sequences=acc.count, num_t_samples=num_t_samples,
             time_seed=int(time_seed), t_min=float(t_min), bound_kind=process.bound_kind)
  return out


# ----------------------------------------------------------------------------------------------
# Sudoku puzzles as text: parsing and printing.

_BLANKS = '.0'


def parse_puzzle(text: str, *, where: str = 'puzzle') -> np.ndarray:
  """81-character puzzle -> digits uint8 [81] (0 = blank). Blanks are '.' or '0'.

  Whitespace is ignored. Raises ValueError naming `where` for a wrong length or bad characters.
  """
  s = ''.join(str(text).split())
  bad = sorted({c for c in s if not (c.isascii() and (c.isdigit() or c in _BLANKS))})
  if bad:
    pos = [i for i, c in enumerate(s) if c in bad][:5]
    raise ValueError(f'{where}: invalid character(s) {bad} at position(s) {pos}; allowed are the '
                     "digits 1-9 and '.' or '0' for a blank")
  if len(s) != sudoku_data.NUM_CELLS:
    raise ValueError(f'{where}: a puzzle has 81 cells, got {len(s)} characters: {s[:30]!r}'
                     f'{"..." if len(s) > 30 else ""}')
  return np.array([0 if c in _BLANKS else int(c) for c in s], np.uint8)


def read_puzzle_file(path: str) -> tuple[np.ndarray, np.ndarray | None]:
  """Puzzles from a file: one 81-char puzzle per line, or the Palm `quiz,solution` CSV.

  Blank lines and lines starting with '#' are skipped; a first line `quiz,solution` (any case) is a
  header. Returns (quiz uint8 [N, 81], solution uint8 [N, 81] or None when no line has one). A file
  where only some lines carry a solution is rejected.
  """
  quizzes, sols, linenos = [], [], []
  with open(path, encoding='utf-8') as f:
    for lineno, line in enumerate(f, start=1):
      s = line.strip()
      if not s or s.startswith('#'):
        continue
      fields = [x.strip() for x in s.split(',')]
      if lineno == 1 and [x.lower() for x in fields] in (['quiz', 'solution'],
                                                          ['quizzes', 'solutions']):
        continue
      where = f'{path}, line {lineno}'
      if len(fields) > 2:
        raise ValueError(f'{where}: expected "quiz" or "quiz,solution", got {len(fields)} fields')
      quizzes.append(parse_puzzle(fields[0], where=where + ' (quiz)'))
      sols.append(parse_puzzle(fields[1], where=where + ' (solution)') if len(fields) == 2
                  else None)
      linenos.append(lineno)
  if not quizzes:
    raise ValueError(f'{path}: no puzzles found')
  have = [s is not None for s in sols]
  if any(have) and not all(have):
    raise ValueError(f'{path}: some lines have a solution and some do not; give all or none')
  quiz = np.stack(quizzes)
  solution = np.stack(sols) if all(have) else None
  if solution is not None:
    bad = (solution == 0).any(-1) | ~sudoku_data.is_valid_solution(solution) | (
        ((quiz != 0) & (quiz != solution)).any(-1))
    if bad.any():
      raise ValueError(f'{path}, line {linenos[int(np.argmax(bad))]}: the solution is not a '
                       'complete valid grid agreeing with the quiz')
  return quiz, solution


def format_sudoku(digits: np.ndarray, given: np.ndarray | None = None,
                  solution: np.ndarray | None = None) -> str:
  """A 9x9 grid with box separators. Givens print as `[5]`, filled cells as ` 5 `, blanks ` . `.

  With `solution`, a filled cell that disagrees with it prints as `*5*`.

  Args:
    digits: [81] digits 0..9 (0 = blank).
    given: [81] bool clue cells (None: no cell marked as a given).
    solution: [81] digits 1..9, or None.
  """
  d = np.asarray(digits).reshape(-1)
  if d.shape != (sudoku_data.NUM_CELLS,):
    raise ValueError(f'format_sudoku: need 81 cells, got shape {np.asarray(digits).shape}')
  g = np.zeros(81, bool) if given is None else np.asarray(given, bool).reshape(-1)
  sep = '+' + '+'.join(['-' * 9] * 3) + '+'
  lines = [sep]
  for r in range(9):
    row = '|'
    for c in range(9):
      i = 9 * r + c
      v = int(d[i])
      if v == 0:
        cell = ' . '
      elif g[i]:
        cell = f'[{v}]'
      elif solution is not None and int(np.asarray(solution).reshape(-1)[i]) != v:
        cell = f'*{v}*'
      else:
        cell = f' {v} '
      row += cell + ('|' if c % 3 == 2 else '')
    lines.append(row)
    if r % 3 == 2:
      lines.append(sep)
  return '\n'.join(lines)


def sudoku_batch(quiz: np.ndarray, solution: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """A pipeline-style batch from digit grids [N, 81] (labeller levels; tokens = solution if any).

  Without a solution the blank cells hold MASK in `tokens` (they are never shown to the sampler).
  """
  quiz = np.asarray(quiz)
  given = quiz > 0
  if solution is None:
    tokens = np.where(given, quiz.astype(np.int32) - 1, sudoku_data.MASK_ID)
  else:
    tokens = sudoku_data.to_tokens(solution)
  return {'tokens': tokens.astype(np.int32), 'levels': sudoku_data.hierarchy_levels(quiz),
          'given': given, 'loss_mask': ~given}


# ----------------------------------------------------------------------------------------------
# Text samples (SPEC 7, 8).


@dataclasses.dataclass
class TextSamples:
  """Generated rows on the host: tokens/levels/reveal_step int [N, L], given bool [N, L]; nfe of
  every sampler call."""
  tokens: np.ndarray
  levels: np.ndarray
  reveal_step: np.ndarray
  given: np.ndarray
  nfe: list[int]


def sample_rows(apply_fn: ApplyFn, key: jax.Array, process: Process,
                sample_cfg: SampleConfig, *, num_samples: int, seq_len: int,
                batch_size: int, prompts: Iterable[Batch] | None = None,
                progress: bool = False) -> TextSamples:
  """`num_samples` rows from the reverse process, in batches of `batch_size` (one compilation).

  With `prompts` (pipeline batches whose `given` positions are e.g. WikiHow titles), sample n is
  conditioned on the given positions of the n-th prompt row; otherwise sampling is unconditional.
  Batch j uses `fold_in(key, j)`.
  """
  if num_samples < 1 or batch_size < 1:
    raise ValueError(f'sample_rows: num_samples and batch_size must be >= 1, got {num_samples}, '
                     f'{batch_size}')
  conditional = prompts is not None
  process.check_sampling(sample_cfg)

  def make(a: ApplyFn) -> Callable[..., process_base.SampleOutput]:
    def run(k, given_tokens=None, given_levels=None, given_mask=None):
      return process.sample(a, k, sample_cfg, batch_size=batch_size, seq_len=seq_len,
                            given_tokens=given_tokens, given_levels=given_levels,
                            given_mask=given_mask)
    return run

  run = _jit_apply(apply_fn, make, ('rows', process, sample_cfg, batch_size, seq_len, conditional))
  prompt_iter = None
  if conditional:
    rows = (dict(b, weight=v.astype(np.float32)) for b, v in _rebatch(prompts, batch_size))
    prompt_iter = iter(rows)
  parts: dict[str, list[np.ndarray]] = {'tokens': [], 'levels': [], 'reveal_step': [], 'given': []}
  nfe, done, j = [], 0, 0
  bar = _progress(None, desc='sampling', enabled=progress, total=-(-num_samples // batch_size))
  while done < num_samples:
    k = jax.random.fold_in(key, j)
    if prompt_iter is not None:
      try:
        batch = next(prompt_iter)
      except StopIteration:
        raise ValueError(f'sample_rows: only {done} prompt rows for {num_samples} '
                         'samples') from None
      take = int((batch['weight'] > 0).sum())
      gt, gl, gm = _given_inputs(batch, sample_cfg)
      out = jax.device_get(run(k, gt, gl, gm))
      given = gm
    else:
      take = batch_size
      out = jax.device_get(run(k))
      given = np.zeros((batch_size, seq_len), bool)
    take = min(take, num_samples - done)
    for name, arr in (('tokens', out.tokens), ('levels', out.levels),
                      ('reveal_step', out.reveal_step), ('given', given)):
      parts[name].append(np.asarray(arr)[:take])
    nfe.append(int(out.nfe))
    done += take
    j += 1
    if bar is not None:
      bar.update()
  if bar is not None:
    bar.close()
  return TextSamples(**{n: np.concatenate(v) for n, v in parts.items()}, nfe=nfe)


def _rebatch(batches: Iterable[Batch], size: int) -> Iterator[tuple[dict[str, np.ndarray],
                                                                    np.ndarray]]:
  """Real rows of `batches` regrouped into batches of exactly `size` rows (last one padded)."""
  buf: dict[str, list[np.ndarray]] = {}
  count = 0

  def flush(n_pad: int):
    core = {k: np.concatenate(v) for k, v in buf.items()}
    valid = np.ones(core['tokens'].shape[0], bool)
    if n_pad:
      core = {k: np.concatenate([v, np.repeat(v[:1], n_pad, axis=0)]) for k, v in core.items()}
      valid = np.concatenate([valid, np.zeros(n_pad, bool)])
    return core, valid

  for j, batch in enumerate(batches):
    _check_batch(batch, f'prompts[{j}]')
    valid = _row_validity(batch)
    for k in ('tokens', 'levels', 'given', 'loss_mask'):
      buf.setdefault(k, []).append(np.asarray(batch[k])[valid])
    count += int(valid.sum())
    while count >= size:
      core = {k: np.concatenate(v) for k, v in buf.items()}
      yield {k: v[:size] for k, v in core.items()}, np.ones(size, bool)
      buf = {k: [v[size:]] for k, v in core.items()}
      count -= size
  if count:
    yield flush(size - count)


def content_mask(tokens: np.ndarray, bos_id: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Row extents of generated text, as `TextTokenizer.cut` sees them (SPEC 6: cut at the first
  EOS / [SEP]).

  Args:
    tokens: int [N, L] generated rows (`BOS text EOS pad...`).
    bos_id, eos_id: the tokenizer's row delimiters ([CLS]/[SEP], or <|endoftext|> twice).

  Returns:
    real bool [N, L]: the row as the data labeller sees it: positions up to and including the
      first EOS that is not the opening BOS (everything when no EOS was generated);
    text bool [N, L]: the content only: `real` without the opening BOS and without that EOS.
  """
  tokens = np.asarray(tokens)
  pos = np.arange(tokens.shape[1])
  start = (tokens[:, :1] == bos_id).astype(np.int64)  # [N, 1]: 1 if the row opens with BOS
  is_eos = (tokens == eos_id) & (pos >= start)
  first = np.where(is_eos.any(-1), is_eos.argmax(-1), tokens.shape[1])[:, None]  # [N, 1]
  real = pos <= first
  text = (pos >= start) & (pos < first)
  return real, text


def recomputed_text_levels(tokens: np.ndarray, real: np.ndarray, rule: str, tau: int
                           ) -> np.ndarray | None:
  """Levels the data labeller would give the generated tokens, or None if the rule needs more
  than tokens (the 'position' rule needs the summary/body segments)."""
  from hmdlm_jax.data import text as text_data  # pylint: disable=g-import-not-at-top
  if rule == 'frequency':
    return text_data.frequency_levels(tokens, real, tau)
  if rule == 'none':
    return np.zeros(np.shape(tokens), np.int32)
  return None


def text_sample_metrics(samples: TextSamples, tokenizer: Any, *, level_rule: str | None = None,
                        tau: int = 1, references: Callable[[], list[str]] | None = None,
                        scorer: generative_metrics.ARScorer | None = None,
                        gen_ppl_model: str = generative_metrics.DEFAULT_SCORER,
                        gen_ppl_unavailable: str | None = None,
                        featurizer: generative_metrics.TransformersFeaturizer | None = None,
                        mauve_featurizer: str = generative_metrics.DEFAULT_FEATURIZER,
                        mauve_unavailable: str | None = None
                        ) -> tuple[dict[str, Any], list[str]]:
  """Entropy, gen PPL, MAUVE and level disagreement of decoded samples -> (metrics, texts).

  `tokenizer` is a `data.tokenizers.TextTokenizer` (cut at the first EOS/[SEP], decode). Entropy
  counts the generated content (prompt excluded); level disagreement compares the drawn levels
  with the data rule (`level_rule`, e.g. 'frequency') applied to the generated row. `references`
  (reference texts for MAUVE) is called only when MAUVE can run. Scorer / featuriser: given, or
  loaded from `gen_ppl_model` / `mauve_featurizer`, unless a `*_unavailable` reason is passed.
  Unavailable metrics are None with a reason.
  """
  real, text = content_mask(samples.tokens, tokenizer.bos_id, tokenizer.eos_id)
  texts = [tokenizer.decode(row) for row in samples.tokens]
  metrics: dict[str, Any] = {'num_samples': int(samples.tokens.shape[0]),
                             'nfe': float(np.mean(samples.nfe))}
  metrics.update(generative_metrics.entropy_report(samples.tokens, text & ~samples.given))
  generated = real & ~samples.given
  if level_rule is not None:
    rec = recomputed_text_levels(samples.tokens, real, level_rule, tau)
    if rec is None:
      metrics['level_disagreement'] = None
      metrics['level_disagreement_unavailable_reason'] = (
          f'data.hierarchy={level_rule!r} levels cannot be recomputed from tokens alone')
    else:
      metrics['level_disagreement'] = _ratio((generated & (rec != samples.levels)).sum(),
                                             generated.sum())
  metrics.update(generative_metrics.gen_ppl_report(
      texts, scorer=scorer, model_name=gen_ppl_model, unavailable_reason=gen_ppl_unavailable))
  metrics.update(generative_metrics.mauve_report(
      texts, references if references is not None else [], featurizer=featurizer,
      featurize_model_name=mauve_featurizer, unavailable_reason=mauve_unavailable))
  return metrics, texts


# ----------------------------------------------------------------------------------------------
# Task adapters and entry points (main.py).


@dataclasses.dataclass
class EvalContext:
  """What an adapter needs: the config, the model as a `ParamsApply`, its process and the step."""
  config: Any
  apply_fn: ParamsApply
  process: Process
  step: int
  workdir: str
  progress: bool = True


@dataclasses.dataclass(frozen=True)
class TaskAdapter:
  """Dataset-specific evaluation and sampling, registered in `TASKS` under config.eval.kind.

  evaluate(ctx, max_examples, with_samples) -> results dict (JSON-able)
  sample(ctx, puzzles, puzzle_file) -> (records for JSON lines, printable text)
  summary(results) -> short human-readable lines
  """
  evaluate: Callable[[EvalContext, int | None, bool], dict[str, Any]]
  sample: Callable[[EvalContext, Sequence[str] | None, str | None],
                   tuple[list[dict[str, Any]], str]]
  summary: Callable[[Mapping[str, Any]], list[str]]


def _test_batches(config: Any) -> Iterable[Batch]:
  from hmdlm_jax import data  # pylint: disable=g-import-not-at-top
  # The whole test split on this process (every host evaluates everything; results are equal).
  return data.get_dataset(config, 'test', seed=int(config.seed), process_index=0, process_count=1)


def _seeds(config: Any) -> tuple[int, ...]:
  seeds = config.sample.get('seeds', (0,))
  seeds = (seeds,) if isinstance(seeds, int) else tuple(seeds)
  if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
    raise ValueError(f'config.sample.seeds must be a non-empty tuple of ints, got {seeds!r}')
  return seeds


def _sudoku_evaluate(ctx: EvalContext, max_examples: int | None, with_samples: bool
                     ) -> dict[str, Any]:
  del with_samples  # solving IS sampling for Sudoku
  config = ctx.config
  decodings = tuple(config.eval.get('decodings', DECODINGS))
  return evaluate_sudoku(ctx.apply_fn, jax.random.PRNGKey(int(config.seed)), ctx.process,
                         SampleConfig.from_config(config), _test_batches(config),
                         seeds=_seeds(config), decodings=decodings, max_examples=max_examples,
                         progress=ctx.progress)


def check_quiz(quiz: np.ndarray, *, where: str = 'puzzle') -> None:
  """Raises ValueError naming `where` if a quiz (digits [81], 0 = blank) has no clue, a digit twice
  in a row / column / box, or clues from which the labeller's deduction reaches a contradiction."""
  q = np.asarray(quiz).reshape(-1)
  if not (q > 0).any():
    raise ValueError(f'{where}: no givens')
  for u, cells in enumerate(sudoku_data.UNIT_CELLS):
    digits = q[cells][q[cells] > 0]
    if len(set(digits.tolist())) != len(digits):
      kind, idx = ('row', 'column', 'box')[u // 9], u % 9 + 1
      dup = sorted({int(d) for d in digits if (digits == d).sum() > 1})
      raise ValueError(f'{where}: digit(s) {dup} appear twice in {kind} {idx}')
  try:
    sudoku_data.hierarchy_levels(q)
  except ValueError as e:
    raise ValueError(f'{where}: {e}') from e


def _sudoku_sample(ctx: EvalContext, puzzles: Sequence[str] | None, puzzle_file: str | None
                   ) -> tuple[list[dict[str, Any]], str]:
  quizzes, names, sols = [], [], []  # sols: the file's solution of a puzzle, else None
  for n, p in enumerate(puzzles or ()):
    names.append(f'puzzle {n + 1} on the command line')
    quizzes.append(parse_puzzle(p, where=names[-1]))
    sols.append(None)
  if puzzle_file:
    q, file_sols = read_puzzle_file(puzzle_file)
    names.extend(f'{puzzle_file}, puzzle {n + 1}' for n in range(len(q)))
    quizzes.extend(q)
    sols.extend(file_sols if file_sols is not None else [None] * len(q))
  if not quizzes:
    raise ValueError('run_sample (sudoku): give puzzles (81 characters, "." or "0" for a blank) '
                     'on the command line or a --puzzle_file')
  for q, name in zip(quizzes, names):
    check_quiz(q, where=name)
  quiz = np.stack(quizzes)
  batch = sudoku_batch(quiz)  # tokens: clues, MASK elsewhere (the sampler sees only the clues)
  cfg = SampleConfig.from_config(ctx.config)
  size = min(len(quiz), int(ctx.config.data.eval_batch_size))
  run = _sudoku_sampler(ctx.apply_fn, ctx.process, cfg, size)
  key = jax.random.fold_in(jax.random.PRNGKey(int(ctx.config.seed)), _seeds(ctx.config)[0])
  records, lines = [], []
  batches = [{k: v[i:i + size] for k, v in batch.items()} for i in range(0, len(quiz), size)]
  for j, (b, valid) in enumerate(_fixed_batches(batches, what='puzzles')):
    out = jax.device_get(run(jax.random.fold_in(key, j), *_given_inputs(b, cfg)))
    for r in np.flatnonzero(valid):
      n = j * size + int(r)
      digits = sudoku_data.from_tokens(out.tokens[r])
      valid_grid = bool(sudoku_data.is_valid_solution(digits)) and bool(
          np.all(digits[quiz[n] > 0] == quiz[n][quiz[n] > 0]))
      sol = sols[n]
      rec = {'index': n, 'quiz': ''.join(map(str, quiz[n])),
             'prediction': ''.join(map(str, digits)), 'valid': valid_grid,
             'solved': None if sol is None else bool(np.all(digits == sol)),
             'levels': np.asarray(out.levels[r]).tolist(),
             'labeller_levels': b['levels'][r].tolist(),
             'reveal_step': np.asarray(out.reveal_step[r]).tolist(), 'nfe': int(out.nfe)}
      records.append(rec)
      status = 'valid' if valid_grid else 'INVALID'
      if sol is not None:
        status += ', solved' if rec['solved'] else ', NOT the stored solution'
      lines.append(f'Puzzle {n + 1} ({status}; [d] = given, *d* = wrong):' if sol is not None
                   else f'Puzzle {n + 1} ({status}; [d] = given):')
      lines.append(format_sudoku(digits, quiz[n] > 0, sol))
      lines.append('')
  return records, '\n'.join(lines)


def _sudoku_summary(res: Mapping[str, Any]) -> list[str]:
  lines = [f'Sudoku: {res["num_puzzles"]} puzzles, seeds {res["seeds"]}']
  for d in DECODINGS:
    if d not in res:
      continue
    m, s = res[d]['mean'], res[d]['std']

    def pct(k: str) -> str:
      return 'n/a' if m.get(k) is None else f'{100 * m[k]:.2f}% ± {100 * s[k]:.2f}'
    levels = ' '.join(f'L{k}={pct(f"cell_accuracy_level_{k}")}'
                      for k in range(sudoku_data.NUM_LEVELS) if f'cell_accuracy_level_{k}' in m)
    lines.append(f'  {d:10s} solve {pct("solve_rate")}  cell acc {pct("cell_accuracy")}  valid '
                 f'{pct("valid_rate")}  level disagreement {pct("level_disagreement")}  nfe '
                 f'{m["nfe"]:.1f}')
    lines.append(f'  {"":10s} per level: {levels}')
  return lines


def _text_samples(ctx: EvalContext, num: int, seed: int, tok: Any) -> TextSamples:
  """`num` samples with sampling seed `seed`, in batches of data.eval_batch_size (one compile)."""
  config = ctx.config
  cfg = SampleConfig.from_config(config)
  prompts = None
  if config.data.get('hierarchy', None) == 'position' or config.data.kind == 'wikihow':
    prompts = _test_batches(config)  # WikiHow: condition on the test titles (given positions)
  key = jax.random.fold_in(jax.random.PRNGKey(int(config.seed)), int(seed))
  return sample_rows(ctx.apply_fn, key, ctx.process, cfg, num_samples=num,
                     seq_len=int(config.model.seq_len),
                     batch_size=min(int(config.data.eval_batch_size), num), prompts=prompts,
                     progress=ctx.progress)


def _tokenizer(config: Any) -> Any:
  from hmdlm_jax.data import tokenizers as tokenizers_lib  # pylint: disable=g-import-not-at-top
  tok = tokenizers_lib.tokenizer_from_config(config.data)
  tokenizers_lib.check_vocab(config.model, tok, num_masks=config_lib.num_noise_rows(config))
  return tok


def _text_evaluate(ctx: EvalContext, max_examples: int | None, with_samples: bool
                   ) -> dict[str, Any]:
  """Perplexity over the test split; with config.eval.num_samples > 0 (and `with_samples`) also
  that many samples per seed of config.sample.seeds, scored per seed, then mean and std."""
  config = ctx.config
  res: dict[str, Any] = {'perplexity': evaluate_perplexity(
      ctx.apply_fn, ctx.process, _test_batches(config), time_seed=int(config.eval.time_seed),
      num_t_samples=int(config.eval.num_t_samples), t_min=float(config.loss.t_min),
      max_examples=max_examples, progress=ctx.progress)}
  num = int(config.eval.get('num_samples', 0) or 0)
  if not (with_samples and num > 0):
    return res
  gm = generative_metrics
  tok = _tokenizer(config)
  # GPT-2 Large (scorer, MAUVE featuriser) is loaded once for all seeds, or reported unavailable.
  gen_ppl_model = config.eval.get('gen_ppl_model', gm.DEFAULT_SCORER)
  scorer, scorer_reason = gm.load_or_reason(gm.TransformersGPT2Scorer, gen_ppl_model)
  mauve_model = config.eval.get('mauve_featurizer', gm.DEFAULT_FEATURIZER)
  featurizer, mauve_reason = None, gm.mauve_unavailable()
  if mauve_reason is None:
    featurizer, mauve_reason = gm.load_or_reason(gm.TransformersFeaturizer, mauve_model)
  refs: list[str] = []

  def references() -> list[str]:  # decoded test rows, read once, only if MAUVE runs
    if not refs:
      for b, v in _fixed_batches(_test_batches(config), max_examples=num):
        refs.extend(tok.decode(row) for row in b['tokens'][v])
    return refs

  level_rule = config.data.get('hierarchy', None) if int(config.model.num_levels) > 1 else None
  per_seed, records = {}, []
  for seed in _seeds(config):
    samples = _text_samples(ctx, num, seed, tok)
    metrics, texts = text_sample_metrics(
        samples, tok, level_rule=level_rule, tau=int(config.data.get('tau', 1)),
        references=references, scorer=scorer, gen_ppl_model=gen_ppl_model,
        gen_ppl_unavailable=scorer_reason, featurizer=featurizer, mauve_featurizer=mauve_model,
        mauve_unavailable=mauve_reason)
    per_seed[str(seed)] = metrics
    records.extend(dict(r, seed=seed) for r in _text_records(samples, texts))
  mean, std = _mean_std(list(per_seed.values()))
  path = os.path.join(ctx.workdir, f'samples_{ctx.step}.jsonl')
  _write_jsonl(path, records)
  res['samples'] = {'per_seed': per_seed, 'mean': mean, 'std': std, 'path': path,
                    'gen_ppl_unavailable_reason': scorer_reason,
                    'mauve_unavailable_reason': mauve_reason}
  return res


def _text_records(samples: TextSamples, texts: Sequence[str]) -> list[dict[str, Any]]:
  return [{'index': n, 'text': texts[n], 'tokens': samples.tokens[n].tolist(),
           'levels': samples.levels[n].tolist(), 'reveal_step': samples.reveal_step[n].tolist(),
           'given': samples.given[n].astype(int).tolist()} for n in range(len(texts))]


def _text_sample(ctx: EvalContext, puzzles: Sequence[str] | None, puzzle_file: str | None
                 ) -> tuple[list[dict[str, Any]], str]:
  if puzzles or puzzle_file:
    raise ValueError(f'puzzles / --puzzle_file are for eval.kind=sudoku, not '
                     f'{ctx.config.eval.kind!r}')
  tok = _tokenizer(ctx.config)
  seed = _seeds(ctx.config)[0]
  samples = _text_samples(ctx, int(ctx.config.sample.num_samples), seed, tok)
  texts = [tok.decode(row) for row in samples.tokens]
  text = '\n'.join(f'[{n}] {t}' for n, t in enumerate(texts))
  return [dict(r, seed=seed) for r in _text_records(samples, texts)], text


def _text_summary(res: Mapping[str, Any]) -> list[str]:
  p = res['perplexity']
  # The process's own terms (HMDLM: lm, hier, cons; MultiMDM: recon, ident) and estimates.
  terms = ', '.join(f'{k[:-15]} {v:.4f}' for k, v in p.items()
                    if k.endswith('_nats_per_token') and k != 'bound_nats_per_token')
  lines = [
      f'Bound ({p["bound_kind"]}): {p["bound_nats_per_token"]:.4f} ± {p["bound_stderr"]:.4f} '
      f'nats/token  PPL {p["ppl"]:.3f}  ({terms}) over '
      f'{p["num_tokens"]} tokens / {p["num_sequences"]} sequences',
  ] + [f'{k[4:-9].replace("_", " ")} estimate (not a bound): PPL {v:.3f}'
       for k, v in p.items() if k.startswith('ppl_') and k.endswith('_estimate')]
  s = res.get('samples')
  if s:
    m, sd = s['mean'], s['std']

    def show(k: str) -> str:
      if m.get(k) is None:
        return f'n/a ({s.get(k + "_unavailable_reason") or "undefined"})'
      return f'{m[k]:.4f} ± {sd[k]:.4f}'
    n = next(iter(s['per_seed'].values()))['num_samples']
    lines.append(f'Samples: {n} per seed x {len(s["per_seed"])} seeds  entropy {show("entropy")}  '
                 f'gen PPL {show("gen_ppl")}  MAUVE {show("mauve")}  level disagreement '
                 f'{show("level_disagreement")}')
  return lines


TASKS: dict[str, TaskAdapter] = {
    'sudoku': TaskAdapter(_sudoku_evaluate, _sudoku_sample, _sudoku_summary),
    'perplexity': TaskAdapter(_text_evaluate, _text_sample, _text_summary),
}


def _adapter(config: Any) -> TaskAdapter:
  kind = config.eval.kind
  if kind not in TASKS:
    raise ValueError(f'config.eval.kind={kind!r} is not one of {sorted(TASKS)}')
  return TASKS[kind]


def _context(config: Any, params: Any, step: int, workdir: str, *, progress: bool
             ) -> EvalContext:
  from hmdlm_jax import models  # pylint: disable=g-import-not-at-top
  apply_fn = ParamsApply(FlaxApplyBuilder(models.build_model(config.model)), params)
  return EvalContext(config=config, apply_fn=apply_fn, process=processes.build(config), step=int(step),
                     workdir=workdir, progress=progress)


def _eval_params(config: Any, state: Any) -> Any:
  """EMA parameters when config.eval.use_ema (and the state has them), else the raw ones."""
  if config.eval.get('use_ema', True):
    ema = getattr(state, 'ema_params', None)
    if ema is None:
      raise ValueError('config.eval.use_ema=True but the train state has no ema_params; set '
                       '--config.eval.use_ema=False')
    return ema
  return state.params


class _DiscardIteratorState:
  """Receives the input-pipeline state stored with a checkpoint and drops it: evaluation reads
  its own test split, so only the train state of `checkpoint.Checkpointer.restore` is used."""

  def set_state(self, state: Any) -> None:
    del state

  def start_prefetch(self) -> None:
    pass


def _restore(config: Any, workdir: str, step: int | None) -> tuple[Any, int]:
  """(evaluation params, step) of checkpoint `step` (latest if None) in DIR/checkpoints.

  The whole TrainState is restored with `checkpoint.Checkpointer.restore` into the shardings the
  training code uses on this machine's devices (`train.state_shardings`), then EMA or raw params
  are taken (config.eval.use_ema). The checkpoint must come from the same process count (Grain
  stores its iterator state per process).
  """
  from hmdlm_jax import checkpoint  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import models  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import sharding  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import train  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(os.path.join(workdir, 'checkpoints')):
    raise checkpoint.CheckpointError(f'No checkpoints in {workdir!r} (expected '
                                     f'{os.path.join(workdir, "checkpoints")}); train first or '
                                     'pass the --workdir of a training run.')
  mesh = sharding.make_mesh(config.mesh)
  abstract, _ = train.state_shardings(config, models.build_model(config.model), mesh)
  ckpt = checkpoint.Checkpointer(workdir, config.train)
  try:
    state, meta = ckpt.restore(abstract, _DiscardIteratorState(), step)
  finally:
    ckpt.close()
  restored = int(meta.get('step', jax.device_get(state.step)))
  return _eval_params(config, state), restored


def _resolved(config: Any) -> Any:
  return config_lib.resolve(config)  # idempotent: derived fields (schedule offsets)


def _json_safe(o: Any) -> Any:
  """Non-finite floats -> 'nan' / 'inf' / '-inf' strings (JSON has no NaN; as metrics.py)."""
  if isinstance(o, Mapping):
    return {str(k): _json_safe(v) for k, v in o.items()}
  if isinstance(o, (list, tuple)):
    return [_json_safe(v) for v in o]
  if isinstance(o, (float, np.floating)) and not math.isfinite(float(o)):
    return 'nan' if math.isnan(float(o)) else ('inf' if o > 0 else '-inf')
  return o


def _write_json(path: str, obj: Any) -> None:
  """Atomic JSON write (temp file + rename); only process 0 writes on multi-host runs."""
  if jax.process_index() != 0:
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(_json_safe(obj), f, indent=2, allow_nan=False, default=_json_default)
  os.replace(tmp, path)


def _write_jsonl(path: str, records: Iterable[Mapping[str, Any]]) -> None:
  if jax.process_index() != 0:
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    for r in records:
      f.write(json.dumps(r, allow_nan=False, default=_json_default) + '\n')


def _json_default(o: Any) -> Any:
  if isinstance(o, np.generic):
    return o.item()
  if isinstance(o, np.ndarray):
    return o.tolist()
  raise TypeError(f'not JSON serialisable: {type(o).__name__}')


def run_eval(config: Any, workdir: str, step: int | None = None, *,
             progress: bool = True) -> dict[str, Any]:
  """Evaluates checkpoint `step` (default: latest) of workdir with the `config.eval.kind` adapter.

  Writes DIR/eval_<step>.json ({'step', 'kind', 'use_ema', 'results'}) and prints a summary.
  """
  config = _resolved(config)
  adapter = _adapter(config)
  params, step = _restore(config, workdir, step)
  ctx = _context(config, params, step, workdir, progress=progress)
  start = time.perf_counter()
  results = adapter.evaluate(ctx, None, True)
  report = {'step': step, 'kind': config.eval.kind, 'use_ema': bool(config.eval.use_ema),
            'seconds': time.perf_counter() - start, 'results': results}
  path = os.path.join(workdir, f'eval_{step}.json')
  _write_json(path, report)
  _print_summary(config, adapter, results, f'Evaluation of step {step}', path)
  return report


def _print_summary(config: Any, adapter: TaskAdapter, results: Mapping[str, Any], what: str,
                   path: str) -> None:
  """'<what> (<kind>, EMA|raw params) -> <path>' and the adapter's summary lines, on stdout."""
  print(f'{what} ({config.eval.kind}, {"EMA" if config.eval.use_ema else "raw"} params) -> '
        f'{path}', flush=True)
  for line in adapter.summary(results):
    print(line, flush=True)


def flatten_metrics(tree: Mapping[str, Any], prefix: str = '') -> dict[str, float]:
  """Nested results -> {'a/b/c': float} of the finite numbers only (for metrics.jsonl / TB)."""
  out: dict[str, float] = {}
  for k, v in tree.items():
    name = f'{prefix}{k}'
    if isinstance(v, Mapping):
      out.update(flatten_metrics(v, name + '/'))
    elif isinstance(v, (int, float, np.number)) and not isinstance(v, bool):
      if math.isfinite(float(v)):
        out[name] = float(v)
  return out


def evaluate_during_training(config: Any, state: Any, step: int, workdir: str) -> dict[str, float]:
  """The `config.eval.kind` evaluation of the live train state on `config.eval.num_examples`.

  Uses EMA params when config.eval.use_ema. No samples for text (gen PPL / MAUVE are run by
  `run_eval`). Compilations are cached per model, so repeated calls do not recompile. Returns the
  flat scalars (`flatten_metrics`) for the training loop's metrics writer; the full nested report
  goes to DIR/eval_train_<step>.json.
  """
  adapter = _adapter(config)
  num = int(config.eval.get('num_examples', 0) or 0)
  ctx = _context(config, _eval_params(config, state), step, workdir, progress=False)
  results = adapter.evaluate(ctx, num if num > 0 else None, False)
  path = os.path.join(workdir, f'eval_train_{int(step)}.json')
  _write_json(path, {'step': int(step), 'kind': config.eval.kind, 'num_examples': num,
                     'results': results})
  if jax.process_index() == 0:  # the same readable summary as --mode=eval
    _print_summary(config, adapter, results, f'Evaluation at step {step}', path)
  return flatten_metrics(results)


def run_sample(config: Any, workdir: str, puzzles: Sequence[str] | None = None,
               puzzle_file: str | None = None, out: str | None = None, *,
               step: int | None = None) -> list[dict[str, Any]]:
  """Samples from checkpoint `step` (latest) of workdir, prints them and saves JSON lines.

  Sudoku: solves `puzzles` (81-character strings, '.' or '0' = blank) and/or the puzzles of
  `puzzle_file` (one per line, or the `quiz,solution` CSV) and prints each grid (givens `[d]`).
  Text: `config.sample.num_samples` samples (WikiHow: conditioned on test titles), decoded and cut
  at the first [SEP]/EOS. Every record holds the tokens' reveal steps. Default output:
  DIR/samples_<step>.jsonl.
  """
  config = _resolved(config)
  adapter = _adapter(config)
  params, step = _restore(config, workdir, step)
  ctx = _context(config, params, step, workdir, progress=False)
  records, text = adapter.sample(ctx, puzzles, puzzle_file)
  path = out or os.path.join(workdir, f'samples_{step}.jsonl')
  _write_jsonl(path, records)
  print(text)
  print(f'{len(records)} samples of step {step} -> {path}', file=sys.stderr)
  if config.sample.get('pictures', True):
    from hmdlm_jax import visualize  # pylint: disable=g-import-not-at-top
    pictures = visualize.save_record_pictures(config, workdir, records)
    print(f'reveal-order pictures -> {os.path.join(workdir, "pictures")} ({pictures})',
          file=sys.stderr)
  return records
