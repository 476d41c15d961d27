r"""Run the benchmark suite, print the tables and write the JSON record.

  python -m benchmarks.run --quick          # < 5 minutes on 2 CPU cores: tiny shapes only
  python -m benchmarks.run                  # the full suite (its duration is printed and saved)
  python -m benchmarks.run --sections=train,optim --shapes=tiny,small

Sections:
  train     train-step throughput, FLOP/s, model FLOP utilisation (MFU), memory; MDLM and HMDLM;
            float32 and bfloat16; the HMDLM/MDLM step-time ratio.
  sampling  Algorithm 2 / MDLM sampler throughput at T ∈ {64, 128, 256, 1024}, batch 1 and 64;
            Sudoku solving (confidence ordering) in puzzles/s.
  scaling   1/2/4/8 fake CPU devices at a fixed global batch; step time vs L.
  optim     candidate optimisations measured against the real step: the reference "bare" step
            (loss + grad + AdamW), the fused token NLL patch, XLA CPU flags, and a per-part profile.

Machine peak = max(jitted JAX, numpy) float32 2048³ matmul GFLOP/s, measured at the start and the
end of this run (the larger value is used); MFU = (benchmarks/flops.py FLOPs / median step time) /
peak. Each measurement runs in its own process (benchmarks/common.py). Results:
benchmarks/results/<tag>.json (tag: 'quick' or 'full' unless --tag is given).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

from benchmarks import common  # pylint: disable=g-import-not-at-top
from benchmarks import machine
from benchmarks import scaling

SECTIONS = ('train', 'sampling', 'scaling', 'optim')
# The targets (MDLM mode, float32, CPU) and the MDLM/MD4 reference figures.
MFU_TARGET = {'small': 0.64, 'tiny': 0.37}
RATIO_TARGET = 2.0
# Candidate XLA CPU flags measured in the optim section (each alone, against no flags).
# Candidates of the optim section, each timed interleaved with the unpatched real step in one
# process (`train_step --compare`): patches of benchmarks/train_step.py and XLA compiler options
# (KEY=VALUE, passed per compilation). YNNPACK fusion types of this XLA:CPU: dot, eltwise, reduce,
# individual_dot, individual_convolution; '' = no YNNPACK (Eigen dots).
# (--xla_cpu_use_thunk_runtime=false is no longer supported by this XLA: it only warns.)
_YNN = 'xla_cpu_experimental_ynn_fusion_type'
CANDIDATES = (
    'subs_nll',  # the step before parameterization.token_nll (ratio > 1 = the gain kept)
    'fused_nll_vjp',
    f'{_YNN}=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT',
    f'{_YNN}=',
    'xla_cpu_prefer_vector_width=512',
    'xla_cpu_use_fusion_emitters=false',
    'rbg_prng',
)


def _train_args(shape: str, mode: str, dtype: str, steps: int, warmup: int,
                extra: tuple[str, ...] = ()) -> list[str]:
  return [f'--shape={shape}', f'--mode={mode}', f'--dtype={dtype}', f'--steps={steps}',
          f'--warmup={warmup}', *extra]


def _safe(fn: Any, *args: Any, **kwargs: Any) -> Any:
  """Runs one measurement; a failure is recorded (and printed), not fatal for the suite."""
  try:
    return fn(*args, **kwargs)
  except (common.BenchmarkError, OSError) as e:
    print(f'  FAILED: {e}', flush=True)
    return {'error': str(e)[-2000:]}


def train_section(shapes: list[str], dtypes: list[str], steps: int, warmup: int,
                  xla_flags: str) -> list[dict[str, Any]]:
  recs = []
  for shape in shapes:
    for dtype in dtypes:
      for mode in ('mdlm', 'hmdlm'):
        print(f'train: {shape} {mode} {dtype} ...', flush=True)
        rec = _safe(common.run_module, 'benchmarks.train_step',
                    _train_args(shape, mode, dtype, steps, warmup, ('--adjacent_peak',)),
                    xla_flags=xla_flags)
        rec.setdefault('shape', shape)
        rec.setdefault('mode', mode)
        rec.setdefault('dtype', dtype)
        if 'error' not in rec:
          print(f'  {rec["median_step_s"]:.3f} s/step, {rec["tokens_per_s"]:.0f} tokens/s, '
                f'compile {rec["compile_s"]:.0f}s', flush=True)
        recs.append(rec)
  return recs


def sampling_section(quick: bool, xla_flags: str) -> list[dict[str, Any]]:
  if quick:
    text = ['--task=text', '--shape=tiny', '--steps=64', '--batches=1', '--repeats=1']
    sudoku = ['--task=sudoku', '--shape=sudoku_6m', '--batches=8', '--repeats=1']
    sudoku_shapes = [('sudoku_6m', sudoku)]
  else:
    text = ['--task=text', '--shape=tiny', '--steps=64,128,256,1024', '--batches=1,64',
            '--repeats=2', '--max_run_s=240']
    sudoku_shapes = [(s, ['--task=sudoku', f'--shape={s}', '--batches=64', '--repeats=2'])
                     for s in ('sudoku_6m', 'sudoku_25m')]
  print('sampling: text ...', flush=True)
  recs = _safe(common.run_module, 'benchmarks.sampling', text, xla_flags=xla_flags,
               timeout_s=7200)
  recs = recs if isinstance(recs, list) else [dict(recs, task='text')]
  for shape, args in sudoku_shapes:
    print(f'sampling: sudoku {shape} ...', flush=True)
    r = _safe(common.run_module, 'benchmarks.sampling', args, xla_flags=xla_flags)
    recs.extend(r if isinstance(r, list) else [dict(r, task='sudoku', shape=shape)])
  return recs


def optim_section(shapes: list[str], steps: int, xla_flags: str, quick_shapes: list[str]
                  ) -> list[dict[str, Any]]:
  """Candidate optimisations, MDLM and HMDLM float32.

  * CANDIDATES against the real step, built in ONE process and timed interleaved
    (`train_step --compare`), so a drifting machine load hits all alike (shapes in
    `quick_shapes` get every candidate, the others only 'subs_nll');
  * 'bare' (loss + grad + AdamW only) and the per-part profile: separate processes.
  """
  recs = []
  for shape in shapes:
    for mode in ('mdlm', 'hmdlm'):
      cands = CANDIDATES if shape in quick_shapes else CANDIDATES[:1]
      print(f'optim: {shape} {mode} real vs {len(cands)} candidates (interleaved) ...', flush=True)
      rec = _safe(common.run_module, 'benchmarks.train_step',
                  _train_args(shape, mode, 'float32', steps, 1,
                              tuple(f'--compare={c}' for c in cands)),
                  xla_flags=xla_flags, timeout_s=7200)
      rec.update(kind='compare', shape=shape, mode=mode)
      recs.append(rec)
      if 'error' not in rec:
        for c, r in zip(rec['candidates'], rec['ratio_to_first']):
          print(f'  {c}: {r:.3f}', flush=True)
      for name, extra in (('bare (loss+grad+AdamW)', ('--variant=bare',)),
                          ('real + profile', ('--profile',))):
        print(f'optim: {shape} {mode} {name} ...', flush=True)
        rec = _safe(common.run_module, 'benchmarks.train_step',
                    _train_args(shape, mode, 'float32', steps, 1, extra), xla_flags=xla_flags)
        rec.update(kind='variant', candidate=name, shape=shape, mode=mode)
        if 'error' not in rec:
          print(f'  {rec["median_step_s"]:.3f} s/step', flush=True)
        recs.append(rec)
  return recs


# ----------------------------------------------------------------------------- tables


def _mb(x: Any) -> float | None:
  return None if x is None else x / 2 ** 20


def train_tables(recs: list[dict[str, Any]], peak: float) -> tuple[str, dict[str, Any]]:
  rows, ratios, checks = [], [], {}
  ok = [r for r in recs if 'error' not in r]
  for r in ok:
    r['mfu'] = r['achieved_gflops'] / peak
    mem = (r.get('memory_analysis') or {}).get('peak_bytes')
    rows.append([r['shape'], r['mode'], r['dtype'], r['batch_size'], r['seq_len'],
                 r['median_step_s'], r['tokens_per_s'], r['flops_per_step'] / 1e9,
                 r['achieved_gflops'], r['mfu'], r.get('mfu_adjacent'), r['compile_s'],
                 _mb(mem), _mb(r['peak_rss_bytes']), r['compilations_during_steps']])
  for r in recs:
    if 'error' in r:
      rows.append([r['shape'], r['mode'], r['dtype']] + ['FAILED'] + [None] * 11)
  out = common.table(
      f'Train step (real step of hmdlm_jax/train.py; median of timed steps; MFU = GFLOP/s / '
      f'run peak {peak:.1f}; MFU adj. = vs the peak measured right before each step)',
      ['shape', 'mode', 'dtype', 'B', 'L', 's/step', 'tokens/s', 'GFLOP/step', 'GFLOP/s', 'MFU',
       'MFU adj.', 'compile s', 'XLA peak MB', 'RSS MB', 'compiles in steps'], rows)
  by = {(r['shape'], r['mode'], r['dtype']): r for r in ok}
  for (shape, mode, dtype), r in sorted(by.items()):
    if mode != 'hmdlm' or (shape, 'mdlm', dtype) not in by:
      continue
    ratio = r['median_step_s'] / by[(shape, 'mdlm', dtype)]['median_step_s']
    ratios.append([shape, dtype, ratio, r['flops_per_step'] / by[(shape, 'mdlm', dtype)][
        'flops_per_step'], 'yes' if ratio <= RATIO_TARGET else 'NO'])
    checks[f'ratio_{shape}_{dtype}'] = ratio
  out += common.table('HMDLM / MDLM step time', ['shape', 'dtype', 'time ratio', 'FLOP ratio',
                                                  f'<= {RATIO_TARGET}'], ratios)
  rows = []
  for shape, target in MFU_TARGET.items():
    r = by.get((shape, 'mdlm', 'float32'))
    if r is None:
      continue
    checks[f'mfu_{shape}'] = r['mfu']
    checks[f'mfu_adjacent_{shape}'] = r.get('mfu_adjacent')
    rows.append([shape, r['mfu'], r.get('mfu_adjacent'), target,
                 'yes' if r['mfu'] >= target else 'NO'])
  if rows:
    out += common.table('MFU targets (MDLM, float32)', ['shape', 'MFU', 'MFU adj.', 'target',
                                                        'met (MFU)'], rows)
  return out, checks


def sampling_tables(recs: list[dict[str, Any]]) -> str:
  text = [r for r in recs if r.get('task') == 'text' and 'error' not in r]
  sud = [r for r in recs if r.get('task') == 'sudoku' and 'error' not in r]
  rows = []
  for r in text:
    mark = '~' if r.get('extrapolated') else ''
    rows.append([r['sampler'], r['T'], r['batch_size'], f'{mark}{r["sequences_per_s"]:.3g}',
                 r.get('nfe_median'), f'{mark}{r["median_run_s"]:.3g}', r.get('compile_s')])
  out = common.table('Sampling, text (tiny model, L = 128; ~ = extrapolated, not run)',
                     ['sampler', 'T', 'B', 'sequences/s', 'NFE (calls)', 'run s', 'compile s'],
                     rows)
  rows = [[r['shape'], r['mode'], r['batch_size'], r['puzzles_per_s'], r['nfe_median'],
           r['median_run_s'], r['compile_s']] for r in sud]
  out += common.table('Sudoku solving (confidence ordering, greedy, T = 81)',
                      ['model', 'mode', 'B', 'puzzles/s', 'NFE (calls)', 'run s', 'compile s'],
                      rows)
  bad = [r for r in recs if 'error' in r]
  if bad:
    out += f'\n{len(bad)} sampling measurement(s) FAILED (see the JSON).'
  return out


def scaling_tables(recs: list[dict[str, Any]]) -> str:
  dev = [r for r in recs if r.get('sweep') == 'devices' and 'error' not in r]
  lens = [r for r in recs if r.get('sweep') == 'length' and 'error' not in r]
  out = ''
  if dev:
    base = dev[0]['median_step_s']
    rows = [[r['devices'], r['batch_size'], r['median_step_s'], r['median_step_s'] / base,
             r['compile_s']] for r in dev]
    out += common.table('Fake CPU devices (tiny HMDLM, fixed global batch, data parallel)',
                        ['devices', 'global B', 's/step', 'vs 1 device', 'compile s'], rows)
  if lens:
    base = lens[0]
    rows = [[r['seq_len'], r['batch_size'], r['median_step_s'],
             r['median_step_s'] / base['median_step_s'],
             r['flops_per_step'] / base['flops_per_step'],
             r['median_step_s'] / (r['batch_size'] * r['seq_len']) * 1e3] for r in lens]
    out += common.table('Step time vs L (tiny HMDLM, one device)',
                        ['L', 'B', 's/step', 'time ×', 'FLOP ×', 'ms/token'], rows)
  return out


def _round_ratios(rec: dict[str, Any]) -> list[float]:
  """Median over rounds of (candidate time / real time in the same round)."""
  base = rec['step_times_s'][0]
  return [statistics.median(t / b for t, b in zip(ts, base)) for ts in rec['step_times_s']]


def optim_tables(recs: list[dict[str, Any]], peak: float) -> str:
  rows = []
  for r in recs:
    if r.get('kind') != 'compare':
      continue
    if 'error' in r:
      rows.append([r['shape'], r['mode'], 'FAILED', None, None, None])
      continue
    for c, med, ratio, rr in zip(r['candidates'], r['median_step_s'], r['ratio_to_first'],
                                 _round_ratios(r)):
      rows.append([r['shape'], r['mode'], c, med, ratio, rr])
  out = common.table('Candidates, timed interleaved in one process (float32; ratio = s/step / '
                     'real step)', ['shape', 'mode', 'candidate', 's/step (median)',
                                    'ratio of medians', 'median of per-round ratios'], rows)
  rows, prof = [], []
  for r in recs:
    if r.get('kind') != 'variant':
      continue
    if 'error' in r:
      rows.append([r['shape'], r['mode'], r['candidate'], 'FAILED', None])
      continue
    rows.append([r['shape'], r['mode'], r['candidate'], r['median_step_s'],
                 r['achieved_gflops'] / peak])
    if 'profile' in r:
      p = r['profile']
      prof.append([r['shape'], r['mode'], r['median_step_s'], p['forward_loss_s'],
                   p['loss_and_grad_s'], p['optimizer_update_s'], p['ema_update_s'],
                   r['median_step_s'] - p['loss_and_grad_s']])
  out += common.table('Variants (float32; separate processes)',
                      ['shape', 'mode', 'variant', 's/step', 'MFU'], rows)
  if prof:
    out += common.table('Profile: parts of the step, each jitted alone (seconds)',
                        ['shape', 'mode', 'step', 'forward loss', 'loss+grad', 'AdamW update',
                         'EMA update', 'step − loss+grad'], prof)
  return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = common.Parser(prog='python -m benchmarks.run', description=__doc__.split('\n\n')[0])
  p.add_argument('--quick', action='store_true', help='tiny shapes, few steps (< 5 min)')
  p.add_argument('--sections', default=None,
                 help=f'comma-separated subset of {SECTIONS} (default: all but optim with '
                 '--quick, all without)')
  p.add_argument('--shapes', default=None, help='train/optim shapes (default: tiny with '
                 '--quick; tiny,small,sudoku_6m,sudoku_25m otherwise)')
  p.add_argument('--dtypes', default=None, help='default: float32 with --quick; both otherwise')
  p.add_argument('--steps', type=int, default=None, help='timed steps (default 2 quick, 5 full)')
  p.add_argument('--xla_flags', default='', help='extra XLA_FLAGS for every measurement')
  p.add_argument('--tag', default=None, help='results/<tag>.json (default quick / full)')
  common.add_output_flags(p, os.path.join(common.RESULTS, '<tag>.json'))
  a = p.parse_args(argv)
  common.check(p, a.steps is None or a.steps > 0, '--steps', a.steps, 'must be > 0')
  for flag, value in (('--sections', a.sections), ('--shapes', a.shapes), ('--dtypes', a.dtypes)):
    common.check(p, value is None or all(value.split(',')), flag, value,
                 'a comma-separated non-empty list')
  if a.sections:
    common.check(p, set(a.sections.split(',')) <= set(SECTIONS), '--sections', a.sections,
                 f'a comma-separated subset of {",".join(SECTIONS)}')
  path = common.output_path(p, a, os.path.join(
      common.RESULTS, f'{a.tag or ("quick" if a.quick else "full")}.json'))
  t_start = time.perf_counter()
  sections = (a.sections.split(',') if a.sections else
              (['train', 'sampling', 'scaling'] if a.quick else list(SECTIONS)))
  shapes = (a.shapes.split(',') if a.shapes else
            (['tiny'] if a.quick else ['tiny', 'small', 'sudoku_6m', 'sudoku_25m']))
  dtypes = a.dtypes.split(',') if a.dtypes else (['float32'] if a.quick else
                                                  ['float32', 'bfloat16'])
  steps = a.steps or (2 if a.quick else 5)
  tag = a.tag or ('quick' if a.quick else 'full')

  info = machine.machine_info(_REPO)
  print(f'benchmarks.run ({tag}): {info["date"]}, commit {info["commit"]}, {info["cpu"]} × '
        f'{info["cpu_count"]}, load {info["load_average"]}, jax {info["jax"]} '
        f'({info["backend"]})', flush=True)
  peak_start = machine.matmul_peak()
  print(f'machine peak (start): jax {peak_start["jax_gflops"]:.1f}, numpy '
        f'{peak_start["numpy_gflops"]:.1f} GFLOP/s', flush=True)

  result: dict[str, Any] = {'machine': info, 'tag': tag, 'quick': a.quick, 'sections': sections,
                            'steps': steps, 'xla_flags': a.xla_flags, 'peak_start': peak_start}
  train_recs: list[dict[str, Any]] = []
  if 'train' in sections:
    train_recs = train_section(shapes, dtypes, steps, 1, a.xla_flags)
    result['train'] = train_recs
  if 'sampling' in sections:
    result['sampling'] = sampling_section(a.quick, a.xla_flags)
  if 'scaling' in sections:
    print('scaling ...', flush=True)
    try:
      result['scaling'] = scaling.run(a.quick, a.xla_flags)
    except common.BenchmarkError as e:
      print(f'  FAILED: {e}', flush=True)
      result['scaling'] = [{'error': str(e)[-2000:]}]
  if 'optim' in sections:
    result['optim'] = optim_section([s for s in shapes if s in ('tiny', 'small')], steps,
                                    a.xla_flags, ['tiny'])

  peak_end = machine.matmul_peak()
  peak = max(peak_start['peak_gflops'], peak_end['peak_gflops'])
  result.update(peak_end=peak_end, peak_gflops=peak, load_average_end=machine.load_average())

  report = [f'\n## benchmarks.run ({tag}) — {info["date"]}, commit {info["commit"]}',
            f'{info["cpu"]}, {info["cpu_count"]} cores, jax {info["jax"]} on {info["backend"]}; '
            f'load average at start {tuple(round(x, 2) for x in info["load_average"])}, at end '
            f'{tuple(round(x, 2) for x in result["load_average_end"])}',
            common.table('Machine peak (float32 2048³ matmul, median of 5; torch for context '
                         'only)', ['when', 'jitted JAX GFLOP/s', 'numpy GFLOP/s',
                                   'torch GFLOP/s'],
                         [['start', peak_start['jax_gflops'], peak_start['numpy_gflops'],
                           peak_start.get('torch_gflops')],
                          ['end', peak_end['jax_gflops'], peak_end['numpy_gflops'],
                           peak_end.get('torch_gflops')]])
            + f'\npeak used for MFU: {peak:.1f} GFLOP/s']
  if train_recs:
    text, checks = train_tables(train_recs, peak)
    report.append(text)
    result['checks'] = checks
    ok = [r for r in train_recs if 'error' not in r]
    if ok:
      report.append(common.table(
          'FLOP count cross-check (formula of benchmarks/flops.py vs XLA cost analysis, which '
          'also counts element-wise work)', ['shape', 'mode', 'dtype', 'formula GFLOP',
                                             'XLA GFLOP', 'XLA / formula'],
          [[r['shape'], r['mode'], r['dtype'], r['flops_per_step'] / 1e9,
            None if r['xla_cost_analysis_flops'] is None else r['xla_cost_analysis_flops'] / 1e9,
            r['xla_over_formula']] for r in ok]))
  if 'sampling' in result:
    report.append(sampling_tables(result['sampling']))
  if 'scaling' in result:
    report.append(scaling_tables(result['scaling']))
  if 'optim' in result:
    report.append(optim_tables(result['optim'], peak))
  duration = time.perf_counter() - t_start
  result['duration_s'] = duration
  report.append(f'\nTotal duration: {duration:.0f} s ({duration / 60:.1f} min)')
  text = '\n'.join(report)
  print(text, flush=True)
  result['report'] = text

  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(result, f, indent=2, default=str)
  print(f'wrote {os.path.relpath(path, _REPO)}')
  return result


if __name__ == '__main__':
  main()
