"""The Sudoku task (docs/method.md §6, §8): data, solving metrics, sample mode, summary, pictures.

Metrics (numpy on token grids: digits 1..9 -> tokens 0..8, MASK = 9) for greedy and stochastic
decoding and every sampling seed (reported separately, then mean and std over seeds): solve rate,
cell accuracy on the blanks, cell accuracy per labeller level, constraint validity, drawn-vs-
labeller level disagreement and NFE. The sampler compiles once per decoding for the batch shape; a
short last batch is padded and the padded rows are dropped from every count.

Sample mode solves the grids given on the command line and / or in an input file (one parser:
data/sudoku_csv.py), prints each grid (givens `[d]`) and saves every cell's reveal step.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax import progress as progress_lib
from hmdlm_jax import storage
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.data import sudoku
from hmdlm_jax.data import sudoku_csv
from hmdlm_jax.data import sudoku_pipeline
from hmdlm_jax.evaluation import batches as batches_lib
from hmdlm_jax.evaluation import compiled
from hmdlm_jax.evaluation import reports
from hmdlm_jax.evaluation import samples
from hmdlm_jax.models import features
from hmdlm_jax.processes import base as process_base
from hmdlm_jax.tasks import base
from hmdlm_jax.tasks import sudoku_hierarchy
from hmdlm_jax.tasks import sudoku_model
from hmdlm_jax.tasks import sudoku_pictures

DECODINGS = ('greedy', 'stochastic')


# ----------------------------------------------------------------------------------------------
# Metrics.


def sudoku_counts(pred: np.ndarray, solution: np.ndarray, given: np.ndarray, levels: np.ndarray,
                  num_levels: int, *, drawn_levels: np.ndarray | None = None,
                  valid: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Integer counts behind the Sudoku metrics, for summing over batches.

  Args:
    pred: int [N, 81] predicted tokens (0..8; anything else, e.g. MASK, counts as wrong).
    solution: int [N, 81] solution tokens 0..8.
    given: bool [N, 81] clue cells.
    levels: int [N, 81] labeller levels (docs/method.md §6) of the cells.
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
    if a.shape != (n, sudoku.NUM_CELLS):
      raise ValueError(f'sudoku_counts: {name} must be [N, 81] with N={n}, got {a.shape}')
  rows = np.ones((n,), bool) if valid is None else np.asarray(valid, bool)
  if levels.size and (levels.min() < 0 or levels.max() >= num_levels):
    raise ValueError(f'sudoku_counts: levels must lie in 0..{num_levels - 1}')
  blank = ~given & rows[:, None]
  correct = pred == solution
  digits = np.where((pred >= 0) & (pred <= 8), pred + 1, 0)  # tokens -> digits, else blank
  givens_kept = np.all(~given | correct, axis=-1)
  valid_grid = sudoku.is_valid_solution(digits) & givens_kept
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


def sudoku_metrics_from_counts(c: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """Rates from `sudoku_counts` (summed): None where the denominator is 0 (nothing to measure)."""
  out: dict[str, Any] = {
      'num_puzzles': int(c['puzzles']),
      'solve_rate': reports.ratio(c['solved'], c['puzzles']),  # whole grid exact
      'cell_accuracy': reports.ratio(c['blanks_correct'], c['blanks']),  # blanks only
      # a valid Sudoku agreeing with the clues
      'valid_rate': reports.ratio(c['valid_grid'], c['puzzles']),
      'givens_kept_rate': reports.ratio(c['givens_kept'], c['puzzles']),
      # drawn level (sampler) vs labeller level of the blanks; None without drawn levels
      'level_disagreement': reports.ratio(c['level_disagree'], c['level_checked']),
      'unfilled_rate': reports.ratio(c['unfilled'], c['blanks']),
  }
  for k in range(len(c['level_count'])):
    out[f'cell_accuracy_level_{k}'] = reports.ratio(c['level_correct'][k], c['level_count'][k])
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


def _labeller_args(batch: Mapping[str, np.ndarray], labeller_at: Sequence[int]
                   ) -> tuple[np.ndarray, np.ndarray]:
  """The sampler's fixed levels int32 [B, 81] and where they replace the head, bool [B, 81]."""
  levels = np.asarray(batch['levels'], np.int32)
  return levels, np.isin(levels, np.asarray(labeller_at, np.int32))


def evaluate_sudoku(apply_fn: compiled.ApplyFn, key: jax.Array, process: process_base.Process,
                    sample_cfg: SampleConfig, batches: Iterable[batches_lib.Batch], *,
                    seeds: Sequence[int] = (0,), decodings: Sequence[str] = DECODINGS,
                    max_examples: int | None = None, progress: bool = True,
                    labeller_at: Sequence[int] = ()) -> dict[str, Any]:
  """Solves every puzzle of `batches` once per (decoding, seed) and scores the grids.

  Args:
    apply_fn: denoiser (design.md); a `compiled.Bound` compiles once per network.
    key: base PRNG key; (seed, batch j) use `fold_in(fold_in(key, seed), j)` for every decoding.
    process: the model's forward process.
    sample_cfg: sampler settings; `greedy` is overridden per decoding, the rest is kept
      (ordering, T, temperature, cache).
    batches: iterable of pipeline batches: tokens = solution tokens [B, 81], levels = labeller
      levels, given = clue cells, loss_mask (+ optional per-row validity field).
    seeds: sampling seeds; each is reported, then mean and std over seeds.
    decodings: subset of ('greedy', 'stochastic').
    max_examples: evaluate only the first this many puzzles.
    progress: show a progress bar over batches (hmdlm_jax/progress.py).
    labeller_at: the hierarchy head is replaced by the batch's labeller levels, which the
      labeller computes from the givens alone (a reference decoding, docs/method.md §10; K > 1),
      on the cells whose labeller level is one of these (all levels: every cell).

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
  data = list(batches_lib.fixed_batches(batches, max_examples=max_examples,
                                        what='sudoku batches'))
  if not data:
    raise ValueError('evaluate_sudoku: no puzzles to evaluate (empty batches)')
  if data[0][0]['tokens'].shape[1] != sudoku.NUM_CELLS:
    raise ValueError(f'evaluate_sudoku: batches must have 81 cells per row, got '
                     f'{data[0][0]["tokens"].shape[1]}')
  batch_size = data[0][0]['tokens'].shape[0]
  # Per-level metrics use the labeller's levels, whatever the model's K (an MDLM, K = 1, is scored
  # per labeller level too, as in the paper's Table 8); drawn levels exist only for K > 1.
  label_levels = max(sudoku.NUM_LEVELS, sample_cfg.num_levels)
  hier = sample_cfg.num_levels > 1
  result: dict[str, Any] = {'num_puzzles': int(sum(v.sum() for _, v in data)),
                            'seeds': [int(s) for s in seeds]}
  for decoding in decodings:
    cfg = dataclasses.replace(sample_cfg, greedy=decoding == 'greedy')
    run = samples.sampler(apply_fn, process, cfg, batch_size=batch_size,
                          seq_len=sudoku.NUM_CELLS, fixed_levels=bool(labeller_at))
    start = time.perf_counter()
    per_seed = {}
    for seed in seeds:
      counts, nfe = None, []
      seed_key = jax.random.fold_in(key, int(seed))
      # Dispatch every batch first (asynchronous), then fetch: host scoring overlaps decoding.
      outs = [run(jax.random.fold_in(seed_key, j), *samples.given_inputs(batch, process, cfg),
                  *(_labeller_args(batch, labeller_at) if labeller_at else ()))
              for j, (batch, _) in enumerate(data)]
      it = progress_lib.bar(zip(data, outs), desc=f'sudoku {decoding} seed {seed}',
                            unit='batch', enabled=progress, total=len(data), leave=False)
      for (batch, valid), out in it:
        out = jax.device_get(out)
        counts = _add_counts(counts, sudoku_counts(
            out.tokens, batch['tokens'], batch['given'], batch['levels'], label_levels,
            drawn_levels=out.levels if hier else None, valid=valid))
        nfe.append(int(out.nfe))
      metrics = sudoku_metrics_from_counts(counts)
      metrics['nfe'] = float(np.mean(nfe))
      per_seed[str(int(seed))] = metrics
    mean, std = reports.mean_std(list(per_seed.values()))
    result[decoding] = {'per_seed': per_seed, 'mean': mean, 'std': std,
                        'seconds': time.perf_counter() - start}
  return result


# ----------------------------------------------------------------------------------------------
# Puzzles as text.


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
  if d.shape != (sudoku.NUM_CELLS,):
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


def check_quiz(quiz: np.ndarray, *, where: str = 'puzzle') -> None:
  """Raises ValueError naming `where` if a quiz (digits [81], 0 = blank) has no clue, a digit twice
  in a row / column / box, or clues from which the labeller's deduction reaches a contradiction."""
  q = np.asarray(quiz).reshape(-1)
  if not (q > 0).any():
    raise ValueError(f'{where}: no givens')
  for u, cells in enumerate(sudoku.UNIT_CELLS):
    digits = q[cells][q[cells] > 0]
    if len(set(digits.tolist())) != len(digits):
      kind, idx = ('row', 'column', 'box')[u // 9], u % 9 + 1
      dup = sorted({int(d) for d in digits if (digits == d).sum() > 1})
      raise ValueError(f'{where}: digit(s) {dup} appear twice in {kind} {idx}')
  try:
    sudoku.hierarchy_levels(q)
  except ValueError as e:
    raise ValueError(f'{where}: {e}') from e


@dataclasses.dataclass(frozen=True)
class _Puzzles:
  """Validated sample-mode inputs: quiz digits [N, 81] and each puzzle's solution from the file
  (digits [81]), else None."""
  quiz: np.ndarray
  solutions: list[np.ndarray | None]


@dataclasses.dataclass(frozen=True)
class SudokuTask(base.Task):
  """Sudoku: data/sudoku_pipeline.py batches, solved and scored by `evaluate_sudoku`."""
  build_dataset: base.DatasetBuilder = sudoku_pipeline.make_sudoku_dataset
  eval_kind = 'sudoku'
  library_calls = ('sample', 'solve')
  library_refusal = 'not a text task (a Sudoku model solves puzzles: solve)'

  def model_features(self, config: config_lib.Config) -> features.ModelFeatures:
    """Grid positions, relations and candidate features as config.model asks (sudoku_model.py)."""
    return sudoku_model.model_features(config.model)

  def validate(self, config: config_lib.Config) -> None:
    m, d = config.model, config.data
    if m.seq_len != sudoku.NUM_CELLS:
      raise ValueError(f'model.seq_len={m.seq_len}, but a Sudoku row is the grid\'s 81 cells '
                       '(data.kind=\'sudoku\'): set --config.model.seq_len=81.')
    # The digits 0..8, then the process's noise rows: MASK = 9, or MultiMDM's M masks 9..8+M.
    rows = config_lib.num_noise_rows(config)
    if m.vocab_size != sudoku.MASK_ID + rows or not sudoku.MASK_ID <= m.mask_id < m.vocab_size:
      raise ValueError(f'model.vocab_size={m.vocab_size} / model.mask_id={m.mask_id}, but Sudoku '
                       f'has the tokens 0..8 (digits 1..9) and {rows} noise row(s) from '
                       f'{sudoku.MASK_ID}: set --config.model.vocab_size='
                       f'{sudoku.MASK_ID + rows} and model.mask_id=-1.')
    k = m.num_levels
    if k != 1 and k < sudoku.NUM_LEVELS:
      raise ValueError(f'model.num_levels={k}, but the Sudoku labeller gives levels 0..'
                       f'{sudoku.NUM_LEVELS - 1}: use {sudoku.NUM_LEVELS} (HMDLM) or 1 (MDLM).')
    for field, example in (('decodings', 'greedy'), ('hierarchy_sampling', 'stochastic')):
      kinds = tuple(getattr(config.eval, field))
      if not kinds or any(x not in DECODINGS for x in kinds):
        raise ValueError(f'eval.{field}={kinds!r} must be a non-empty subset of {DECODINGS}; '
                         f"write it --config.eval.{field}=\"('{example}',)\".")
    if not isinstance(config.eval.hierarchy_diagnostics, bool):
      raise ValueError(f'eval.hierarchy_diagnostics={config.eval.hierarchy_diagnostics!r} must be '
                       'True or False.')
    sudoku_hierarchy.check_modes(tuple(config.eval.hierarchy_decodings))
    for field in ('num_train_puzzles', 'num_test_puzzles', 'gen_attempts', 'gen_processes'):
      if not isinstance(getattr(d, field), int) or getattr(d, field) < 1:
        raise ValueError(f'data.{field}={getattr(d, field)!r} must be an integer >= 1.')
    if not 17 <= d.min_givens <= d.max_givens <= sudoku.NUM_CELLS:
      raise ValueError(f'data.min_givens={d.min_givens} and data.max_givens={d.max_givens} must '
                       'satisfy 17 <= min_givens <= max_givens <= 81.')
    for split in sudoku.SPLITS:
      path = getattr(d, f'{split}_path')
      if path and not storage.isfile(path):
        raise ValueError(f'data.{split}_path={path!r} is not a file (a quiz,solution CSV); fix '
                         'the path or set it to \'\' for generated puzzles.')

  def eval_seeds(self, config: config_lib.Config, with_samples: bool) -> tuple[int, ...]:
    del with_samples  # solving IS sampling for Sudoku: every evaluation draws with the seeds
    return base.sample_seeds(config)

  def evaluate(self, ctx: base.EvalContext, max_examples: int | None, with_samples: bool
               ) -> dict[str, Any]:
    del with_samples  # solving IS sampling for Sudoku
    config = ctx.config
    key, cfg = jax.random.PRNGKey(int(config.seed)), SampleConfig.from_config(config)
    seeds = base.sample_seeds(config)
    result = evaluate_sudoku(ctx.apply_fn, key, ctx.process, cfg, self.test_batches(config),
                             seeds=seeds, decodings=tuple(config.eval.decodings),
                             max_examples=max_examples, progress=ctx.progress)
    if cfg.num_levels > 1 and config.eval.hierarchy_diagnostics:
      result['hierarchy'] = self._hierarchy(ctx, key, cfg, seeds[0], max_examples)
    return result

  def _hierarchy(self, ctx: base.EvalContext, key: jax.Array, cfg: SampleConfig, seed: int,
                 max_examples: int | None) -> dict[str, Any]:
    """Level accuracy of the head and the decoding modes of tasks/sudoku_hierarchy.py."""
    config = ctx.config
    out = {'level_accuracy': sudoku_hierarchy.level_accuracy(
        ctx.apply_fn, ctx.process, self.test_batches(config), t_min=float(config.loss.t_min),
        seed=int(config.eval.time_seed), max_examples=max_examples), 'decodings': {}}
    for mode in sudoku_hierarchy.check_modes(tuple(config.eval.hierarchy_decodings)):
      mode_cfg, labeller = sudoku_hierarchy.mode_config(cfg, mode)
      out['decodings'][mode] = evaluate_sudoku(
          ctx.apply_fn, key, ctx.process, mode_cfg, self.test_batches(config), seeds=(seed,),
          decodings=tuple(config.eval.hierarchy_sampling), max_examples=max_examples,
          progress=ctx.progress, labeller_at=labeller)
    return out

  def prepare_sample(self, config: config_lib.Config, inputs: Sequence[str] | None,
                     input_file: str | None, *, prompts: Sequence[str] = (),
                     infills: Sequence[str] = ()) -> _Puzzles:
    """The puzzles of `inputs` (81-character grids, '.' or '0' = blank) and `input_file` (one
    per line, or a quiz,solution CSV), checked solvable."""
    if prompts or infills:
      raise ValueError('--prompt / --infill apply to the text tasks; a Sudoku config takes '
                       '--inputs (grids of 81 characters) or --input_file.')
    quizzes, names, sols = [], [], []  # sols: the file's solution of a puzzle, else None
    for n, p in enumerate(inputs or ()):
      names.append(f'puzzle {n + 1} on the command line')
      quizzes.append(sudoku_csv.parse_puzzle(p, where=names[-1]))
      sols.append(None)
    if input_file:
      q, file_sols = sudoku_csv.read_puzzles(input_file)
      names.extend(f'{input_file}, puzzle {n + 1}' for n in range(len(q)))
      quizzes.extend(q)
      sols.extend(file_sols if file_sols is not None else [None] * len(q))
    if not quizzes:
      raise ValueError('--mode=sample with a Sudoku config needs --inputs (grids of 81 characters, '
                       '"." or "0" for a blank) or --input_file.')
    for q, name in zip(quizzes, names):
      check_quiz(q, where=name)
    quiz = np.stack(quizzes)
    count, _ = sudoku.count_solutions(quiz, limit=1)
    if not count.all():
      bad = [n for n, c in zip(names, count) if not c]
      raise ValueError(f'{bad[0]} has no solution (no digit repeats, but the givens contradict '
                       f'each other); {len(bad)} of {len(names)} puzzles are unsolvable; fix or '
                       'remove them.')
    return _Puzzles(quiz, sols)

  def sample(self, ctx: base.EvalContext, inputs: _Puzzles) -> tuple[base.Records, str]:
    quiz = inputs.quiz
    batch = sudoku_pipeline.sudoku_batch(quiz)  # tokens: clues, MASK elsewhere
    cfg = SampleConfig.from_config(ctx.config)
    size = base.sample_batch_size(len(quiz), int(ctx.config.data.eval_batch_size))
    run = samples.sampler(ctx.apply_fn, ctx.process, cfg, batch_size=size,
                          seq_len=sudoku.NUM_CELLS)
    key = jax.random.fold_in(jax.random.PRNGKey(int(ctx.config.seed)),
                             base.sample_seeds(ctx.config)[0])
    records, lines = [], []
    # Batches of exactly `size` rows, the last padded (one compile per bucket; padding dropped).
    for j, (b, valid) in enumerate(batches_lib.rebatch([batch], size)):
      given = samples.given_inputs(b, ctx.process, cfg)
      out = jax.device_get(run(jax.random.fold_in(key, j), *given))
      for r in np.flatnonzero(valid):
        n = j * size + int(r)
        digits = sudoku.from_tokens(out.tokens[r])
        valid_grid = bool(sudoku.is_valid_solution(digits)) and bool(
            np.all(digits[quiz[n] > 0] == quiz[n][quiz[n] > 0]))
        sol = inputs.solutions[n]
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

  def draw(self, ctx: base.EvalContext, num: int, seed: int, given: None = None) -> base.Samples:
    """`num` unconditional grids with sampling seed `seed` (hmdlm_jax.load's `Model.sample`), in
    batches of `base.sample_batch_size` rows (padding dropped)."""
    del given
    key = jax.random.fold_in(jax.random.PRNGKey(int(ctx.config.seed)), seed)
    rows = samples.sample_rows(
        ctx.apply_fn, key, ctx.process, SampleConfig.from_config(ctx.config), num_samples=num,
        seq_len=sudoku.NUM_CELLS,
        batch_size=base.sample_batch_size(num, int(ctx.config.data.eval_batch_size)))
    grids = [''.join(map(str, sudoku.from_tokens(t))) for t in rows.tokens]
    records = [{'index': i, 'prediction': g, 'levels': rows.levels[i].tolist(),
                'reveal_step': rows.reveal_step[i].tolist(), 'seed': seed}
               for i, g in enumerate(grids)]
    return base.Samples(tuple(grids), rows.tokens, rows.levels, rows.reveal_step, rows.given,
                        tuple(records), seed)

  def solve(self, ctx: base.EvalContext, puzzles: Sequence[str]) -> base.Samples:
    """The grids of `puzzles` solved as sample mode's --inputs (hmdlm_jax.load's `Model.solve`);
    records hold 'valid' (a valid grid keeping the givens)."""
    records, _ = self.sample(ctx, self.prepare_sample(ctx.config, puzzles, None))
    quiz = np.asarray([[int(c) for c in r['quiz']] for r in records])
    digits = np.asarray([[int(c) for c in r['prediction']] for r in records])
    return base.Samples(tuple(r['prediction'] for r in records), digits,
                        base.record_field(records, 'levels'),
                        base.record_field(records, 'reveal_step'), quiz > 0, tuple(records),
                        base.sample_seeds(ctx.config)[0])

  def summary(self, results: Mapping[str, Any]) -> list[str]:
    lines = [f'Sudoku: {results["num_puzzles"]} puzzles, seeds {results["seeds"]}']
    count = len(results['seeds'])
    for d in DECODINGS:
      if d not in results:
        continue
      m, s = results[d]['mean'], results[d]['std']

      def pct(k: str) -> str:
        return reports.mean_pm(m.get(k), s.get(k), digits=2, count=count, scale=100, suffix='%')
      levels = ' '.join(f'L{k}={pct(f"cell_accuracy_level_{k}")}'
                        for k in range(sudoku.NUM_LEVELS) if f'cell_accuracy_level_{k}' in m)
      lines.append(f'  {d:10s} solve {pct("solve_rate")}  cell acc {pct("cell_accuracy")}  valid '
                   f'{pct("valid_rate")}  level disagreement {pct("level_disagreement")}  nfe '
                   f'{m["nfe"]:.1f}')
      lines.append(f'  {"":10s} per level: {levels}')
    if 'hierarchy' in results:
      lines.extend(sudoku_hierarchy.summary_lines(results['hierarchy'], DECODINGS))
    return lines

  def pictures(self, config: config_lib.Config, workdir: str,
               records: base.Records) -> list[str]:
    return sudoku_pictures.save_record_pictures(config, workdir, records)
