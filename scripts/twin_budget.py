r"""HMDLM against its MDLM twin at equal compute on Sudoku, over seeds (issue 11).

  python -m scripts.twin_budget --workdir=/tmp/twin_budget --seeds=0,1,2 [--num_puzzles=500] \
      [--config=configs/sudoku_learned_hierarchy.py] [--config.model.sudoku_candidates=True ...] \
      [--twin_steps=N] [--baselines=mgdm]

(from the repository root; `--config.section.field=value` overrides are those of
`python -m hmdlm_jax.main`, applied to both models and read by `hmdlm_jax.config.load`)

Per seed s, two runs of the README demo command (`python -m hmdlm_jax.main
--config=configs/sudoku.py`, or the Sudoku config given by --config; train + final evaluation),
in WORKDIR/{hmdlm,twin}_s<s>:
  hmdlm   the config's HMDLM, its train.num_steps
  twin    `--config.model.num_levels=1`, with train.num_steps scaled so that both runs do the
          same matrix FLOPs (scripts/step_cost.py; for configs/sudoku_base.py the twin's step
          is 0.750× HMDLM's, so 1,600 steps against 1,200) — an equal wall budget that does
          not depend on how loaded the machine is; or --twin_steps=N, e.g. the equal-wall
          budget that `python -m scripts.step_cost --loop --wall_rounds=2 --wall_steps=100`
          measures on a quiet machine (where FLOPs are not wall time).
  mgdm    with `--baselines=mgdm`: the twin's network and steps trained with MGDM's loss and
          decoded by its re-masking (docs/method.md §13.3), in WORKDIR/mgdm_s<s>.
All evaluate on the first --num_puzzles generated test puzzles (the same set for every run),
greedy and stochastic (the demo's two decodings). A finished run is reused; an unfinished one
resumes from its checkpoint.

Results: WORKDIR/results.json (every run's figures, training wall time, the commands) and a table
of mean ± standard error over the seeds, with the paired difference HMDLM − twin (and − each baseline) per seed (same
seed: same test puzzles, same data order).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from typing import Any

from benchmarks import common
from hmdlm_jax import config as config_lib
from hmdlm_jax.evaluation import reports
from scripts import step_cost

_REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
DEFAULT_CONFIG = step_cost.DEFAULT_CONFIG
TWIN = '--config.model.num_levels=1'
MODELS = ('hmdlm', 'twin')
# Baselines on the twin's network and budget (`--baselines`): MGDM's loss and its re-masking
# decoding (docs/method.md §13.3), its training grid the config's T (`sample.num_steps`).
BASELINES = ('mgdm',)
DECODINGS = ('greedy', 'stochastic')


def twin_steps(hmdlm_steps: int, overrides: list[str], config_path: str = DEFAULT_CONFIG) -> int:
  """The twin's step budget at (at most) the HMDLM run's matrix FLOPs (`overrides`:
  `--config.section.field=value`)."""
  base = step_cost.step_flops(config_lib.load(config_path, overrides))
  twin = step_cost.step_flops(config_lib.load(config_path, list(overrides) + [TWIN]))
  return int(hmdlm_steps * base // twin)  # never more than the HMDLM run


def baseline_flags(name: str, overrides: list[str], config_path: str = DEFAULT_CONFIG
                   ) -> list[str]:
  """The flags that turn the twin into baseline `name` (BASELINES)."""
  if name != 'mgdm':
    raise ValueError(f'--baselines: {name!r} is not one of {list(BASELINES)}')
  num_steps = int(config_lib.load(config_path, overrides).sample.num_steps)
  return ['--config.process.kind=mgdm', f'--config.process.mgdm.diffusion_steps={num_steps}',
          '--config.sample.ordering=remask']


def command(workdir: str, seed: int, num_puzzles: int, overrides: list[str],
            steps: int | None, config_path: str = DEFAULT_CONFIG,
            baseline: list[str] | None = None) -> list[str]:
  """The run's command: HMDLM (`steps` None), its twin with `steps` steps, or a baseline on the
  twin (`baseline`: its `baseline_flags`)."""
  cmd = [sys.executable, '-m', 'hmdlm_jax.main', f'--config={config_path}',
         f'--workdir={workdir}', f'--config.seed={seed}',
         f'--config.data.num_test_puzzles={num_puzzles}',
         f'--config.eval.num_examples={num_puzzles}']
  cmd += list(overrides)
  if steps is not None:  # the twin, or a baseline on it
    cmd += [TWIN, f'--config.train.num_steps={steps}', *(baseline or [])]
  return cmd


def read_run(workdir: str) -> dict[str, Any] | None:
  """Figures of a finished run (its final evaluation), or None."""
  summary = os.path.join(workdir, 'train_summary.json')
  if not os.path.isfile(summary):
    return None
  with open(summary, encoding='utf-8') as f:
    s = json.load(f)
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    config = json.load(f)
  rows = int(config['eval']['num_examples']) or None
  path = os.path.join(workdir, reports.eval_file(s['step'], rows, config['sample']['seeds'],
                                                 in_training=True))
  if not os.path.isfile(path):
    return None
  with open(path, encoding='utf-8') as f:
    ev = json.load(f)['results']
  out = {'steps': s['step'], 'train_wall_s': s['wall_time_s'], 'num_puzzles': ev['num_puzzles']}
  for dec in DECODINGS:
    out[f'{dec}_solve'] = ev[dec]['mean']['solve_rate']
    out[f'{dec}_cells'] = ev[dec]['mean']['cell_accuracy']
  return out


def table(runs: dict[str, dict[int, dict[str, Any]]], seeds: list[int]) -> str:
  models = [m for m in (*MODELS, *BASELINES) if m in runs]
  done = [s for s in seeds if all(runs[m].get(s) for m in models)]
  pct = lambda ms: reports.mean_pm(*ms, digits=1, count=len(done), scale=100)
  keys = [f'{d}_{k}' for d in DECODINGS for k in ('solve', 'cells')]
  lines = [f'seeds with every run: {done}',
           '| model | steps | ' + ' | '.join(keys) + ' | train wall s |',
           '|---' * (len(keys) + 3) + '|']
  for m in models:
    rows = [runs[m][s] for s in done]
    if rows:
      lines.append(f'| {m} | {rows[0]["steps"]} | '
                   + ' | '.join(pct(reports.mean_se([r[k] for r in rows])) for k in keys)
                   + f' | {reports.mean_se([r["train_wall_s"] for r in rows])[0]:.0f} |')
  for other in (models[1:] if done else []):
    diff = {k: reports.mean_se([runs['hmdlm'][s][k] - runs[other][s][k] for s in done])
            for k in keys}
    lines.append(f'| HMDLM − {other} (paired) | | ' + ' | '.join(pct(diff[k]) for k in keys)
                 + ' | |')
  return '\n'.join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--workdir', required=True)
  p.add_argument('--seeds', default='0,1,2')
  p.add_argument('--num_puzzles', type=int, default=500)
  p.add_argument('--config', default=DEFAULT_CONFIG,
                 help='a Sudoku configs/*.py file; --config.section.field=value overrides it '
                 'for both models')
  p.add_argument('--twin_steps', type=int, default=0,
                 help="the twin's train.num_steps (0 = equal matrix FLOPs)")
  p.add_argument('--baselines', default='',
                 help=f'comma-separated baselines trained on the twin\'s network and budget, of '
                 f'{list(BASELINES)}')
  a, overrides = common.parse_with_overrides(p, argv)
  if a.twin_steps < 0:
    p.error(f'--twin_steps={a.twin_steps} must be >= 0 (0 = equal matrix FLOPs)')
  seeds = [int(s) for s in a.seeds.split(',')]
  try:
    hmdlm_steps = int(config_lib.load(a.config, overrides).train.num_steps)
    budget = 'given' if a.twin_steps else 'equal matrix FLOPs'
    steps = {'hmdlm': None, 'twin': a.twin_steps or twin_steps(hmdlm_steps, overrides, a.config)}
    baselines = {b: baseline_flags(b, overrides, a.config) for b in a.baselines.split(',') if b}
  except ValueError as e:  # the loader's one line naming the file or field; nothing written
    raise SystemExit(f'twin_budget: error: {e}') from None
  models = (*MODELS, *baselines)
  steps.update({b: steps['twin'] for b in baselines})
  workdirs = {(m, s): os.path.join(a.workdir, f'{m}_s{s}') for s in seeds for m in models}
  finished = {key: read_run(wd) for key, wd in workdirs.items()}
  for (m, s), done in finished.items():  # before anything trains: another budget is not reused
    want = steps[m] or hmdlm_steps
    if done is not None and done['steps'] != want:
      raise SystemExit(f'{workdirs[m, s]}: a finished run of {done["steps"]} steps, this '
                       f'comparison needs {want}; give another --workdir or move that run away')
  os.makedirs(a.workdir, exist_ok=True)
  runs: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in models}
  commands = {}
  for (m, s), wd in workdirs.items():
    cmd = command(wd, s, a.num_puzzles, overrides, steps[m], a.config, baselines.get(m))
    commands[f'{m}_s{s}'] = ' '.join(cmd[1:])
    if finished[m, s] is None:
      print(f'[{datetime.datetime.now():%H:%M:%S}] {m} seed {s}: {" ".join(cmd[1:])}',
            flush=True)
      with open(wd + '.log', 'a', encoding='utf-8') as log:
        subprocess.run(cmd, cwd=_REPO, stdout=log, stderr=subprocess.STDOUT, check=True)
    runs[m][s] = finished[m, s] or read_run(wd)
    print(f'{m} seed {s}: {runs[m][s]}', flush=True)
  text = table(runs, seeds)
  print(text)
  result = {'date': datetime.datetime.now(datetime.timezone.utc).isoformat(),
            'machine': f'{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs',
            'config': a.config, 'twin_steps': steps['twin'], 'twin_budget': budget,
            'hmdlm_steps': hmdlm_steps,
            'overrides': overrides,
            'commands': commands,
            'runs': {m: {str(s): r for s, r in rs.items()} for m, rs in runs.items()},
            'table': text}
  with open(os.path.join(a.workdir, 'results.json'), 'w', encoding='utf-8') as f:
    json.dump(result, f, indent=1)
  return result


if __name__ == '__main__':
  main()
