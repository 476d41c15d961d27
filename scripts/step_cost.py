r"""Cost of one training step of a Sudoku config with overrides: matmul FLOPs, and wall time.

  python -m scripts.step_cost [--config=configs/sudoku_learned_hierarchy.py] \
      [--config.model.pathway.num_heads=1 ...] [--wall_rounds=5 --wall_steps=10] [--loop]

(from the repository root; the overrides are those of `python -m hmdlm_jax.main`, read by
`hmdlm_jax.config.load`)

prints the matrix FLOPs of one training step (loss + gradient) of the config and of its MDLM twin
(`model.num_levels=1`), and their ratios to the default demo's step. FLOPs turn a wall budget into
step budgets that do not depend on how loaded the machine is (scripts/twin_budget.py). They are a
fair proxy only where the step's time is its matmuls: on a CPU the attention softmax and the
elementwise ops of narrow blocks are not (docs/experiments/hierarchy_log.md item 18), so --wall_rounds=N
also times the real jitted training step (hmdlm_jax/train.py, a synthetic batch) of the config and
of its twin in N interleaved rounds of --wall_steps steps each (default 5), on this machine, and
prints the medians per round, the time ratio and the twin's step budget at equal wall time. Each
model runs in a child process of its own in every round: two models in one process slow each
other (the twin's step read 0.35 s beside the config against 0.31-0.33 s alone;
docs/experiments/hierarchy_log.md items 29-30). With
--loop the rounds time the training loop itself instead (`python -m hmdlm_jax.main` for
--wall_steps steps, no evaluation; seconds per step between its first and last logged step, so
compilation is left out): what a training run pays, host batches and logging included. Pass the
twin's budget it prints to `scripts.twin_budget --twin_steps`. Run it on a quiet machine: one
machine drifts by 15-30% between rounds. Both timings run under the allocator the entry point
uses (hmdlm_jax/runtime.py: on a CPU-only host by default, else as `HMDLM_ALLOCATOR` says): the
default glibc malloc adds page-fault time to every step of both models and so pulls their ratio
towards 1 (item 29).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from hmdlm_jax import runtime

# As hmdlm_jax/main.py: the allocator acts at process start only, so re-execute once, before JAX.
if __name__ == '__main__':
  runtime.set_up_entry_point()

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp

from benchmarks import flops
from benchmarks import train_step as bench_step
from hmdlm_jax import config as config_lib
from benchmarks import common
from hmdlm_jax import models
from hmdlm_jax import processes
from hmdlm_jax import tasks

DEFAULT_CONFIG = 'configs/sudoku.py'  # relative to the repository root, where the tools run


def step_flops(config) -> int:
  config = config_lib.resolve(config)
  model = tasks.build_model(config)
  process = processes.build(config)
  params = models.abstract_params(model, 81)
  b = config.data.batch_size
  batch = {'tokens': jnp.zeros((b, 81), jnp.int32), 'levels': jnp.zeros((b, 81), jnp.int32),
           'given': jnp.zeros((b, 81), bool), 'loss_mask': jnp.ones((b, 81), bool)}

  def loss(p):
    return process.loss(models.make_apply_fn(model, p, train=False), batch, jax.random.key(0))[0]

  params = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), params)
  return flops.jaxpr_matmul_flops(jax.value_and_grad(loss), params)


def bare_seconds(config, steps: int) -> float:
  """Median seconds of `steps` real training steps of `config` (a synthetic batch, blocked on
  each step), after one compiling step, in this process."""
  step, state, batch = bench_step.real_step(config_lib.resolve(config))
  state = jax.block_until_ready(step(state, batch)[0])
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def step_seconds(config_path: str, variants: dict[str, list[str]], rounds: int, steps: int,
                 loop: bool = False) -> dict[str, list[float]]:
  """Seconds per step for each named list of `--config.section.field=value` overrides of
  `config_path`, interleaved in
  each of `rounds` rounds, every (round, variant) in a child process of its own: the bare step
  (`bare_seconds`, the median of `steps`) or, with `loop`, the training loop (`hmdlm_jax.main`
  for `steps` steps, no evaluation: (time of the last logged step - time of the first) / the
  steps between them)."""
  if loop:
    for sets in variants.values():
      log_every = int(config_lib.load(config_path, sets).train.log_every)
      if steps < 2 * log_every:
        raise SystemExit(f'--wall_steps={steps}: the loop logs every train.log_every={log_every} '
                         f'steps; give at least {2 * log_every} so that two logged steps follow '
                         'compilation')
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out: dict[str, list[float]] = {name: [] for name in variants}
  for _ in range(rounds):
    for name, sets in variants.items():
      with tempfile.TemporaryDirectory() as wd:
        if loop:
          cmd = ([sys.executable, '-m', 'hmdlm_jax.main', f'--config={config_path}',
                  f'--workdir={wd}'] + list(sets)
                 # last, so that they win over an override of train.num_steps (the budget timed)
                 + [f'--config.train.num_steps={steps}', '--config.train.final_eval=False'])
        else:
          cmd = ([sys.executable, '-m', 'scripts.step_cost', f'--config={config_path}',
                  f'--wall_steps={steps}', f'--bare_child={wd}/seconds.json'] + list(sets))
        r = subprocess.run(cmd, cwd=repo, check=False, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode:  # e.g. a bad override value: the child's own one-line error
          last = (r.stderr.strip().splitlines() or ['(no output)'])[-1]
          raise SystemExit(f'--wall_rounds: the {"training run" if loop else "timed step"} '
                           f'{name!r} failed: {last}')
        if loop:
          with open(os.path.join(wd, 'metrics.jsonl'), encoding='utf-8') as f:
            out[name].append(logged_seconds_per_step([json.loads(line) for line in f]))
        else:
          with open(os.path.join(wd, 'seconds.json'), encoding='utf-8') as f:
            out[name].append(float(json.load(f)))
  return out


def logged_seconds_per_step(rows: list[dict[str, Any]]) -> float:
  """Seconds per step between the first and the last logged training step of metrics.jsonl rows
  (the first log follows compilation)."""
  t = {r['step']: r['time'] for r in rows if r.get('split') == 'train'}
  first, last = min(t), max(t)
  return (t[last] - t[first]) / (last - first)


def equal_wall_steps(steps: int, config_s: list[float], twin_s: list[float]
                     ) -> tuple[list[float], int]:
  """Per-round time ratios config / twin and the twin's step budget at the wall time of `steps`
  config steps (by the median ratio, rounded down)."""
  ratios = [a / b for a, b in zip(config_s, twin_s, strict=True)]
  return ratios, int(steps * statistics.median(ratios))


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--config', default=DEFAULT_CONFIG,
                  help='a Sudoku configs/*.py file; --config.section.field=value overrides it, '
                  'e.g. --config.model.pathway.width=32')
  ap.add_argument('--wall_rounds', type=int, default=0, help='0 = FLOPs only')
  ap.add_argument('--wall_steps', type=int, default=5, help='timed steps per round and config')
  ap.add_argument('--loop', action='store_true',
                  help='time the training loop (hmdlm_jax.main) instead of the bare step')
  ap.add_argument('--bare_child', default='', help=argparse.SUPPRESS)  # step_seconds' child
  args, overrides = common.parse_with_overrides(ap, argv)
  if args.wall_rounds < 0 or args.wall_steps < 1:
    ap.error(f'--wall_rounds={args.wall_rounds} must be >= 0 and --wall_steps={args.wall_steps} '
             '>= 1')
  mine = lambda extra=(): config_lib.load(args.config, overrides + list(extra))
  try:
    mine()  # the file and every override checked first: one line naming the mistake
  except ValueError as e:
    raise SystemExit(f'step_cost: error: {e}') from None
  if args.bare_child:  # one (round, model) of step_seconds: write the median seconds and stop
    with open(args.bare_child, 'w', encoding='utf-8') as f:
      json.dump(bare_seconds(mine(), args.wall_steps), f)
    return
  base = step_flops(config_lib.load(DEFAULT_CONFIG))
  for name, c in (('config', mine()), ('twin', mine(['--config.model.num_levels=1']))):
    f = step_flops(c)
    print(f'{name}: {f / 1e9:.2f} GFLOP per step; {f / base:.3f} x the default demo '
          f'({base / 1e9:.2f} GFLOP)')
  if args.wall_rounds > 0:
    secs = step_seconds(args.config, {'config': overrides,
                                      'twin': overrides + ['--config.model.num_levels=1']},
                        args.wall_rounds, args.wall_steps, loop=args.loop)
    steps = int(mine().train.num_steps)
    ratios, twin_steps = equal_wall_steps(steps, secs['config'], secs['twin'])
    print(f'seconds per {"loop" if args.loop else "bare"} step, {args.wall_rounds} interleaved '
          f'round(s) ({jax.device_count()} '
          f'{jax.default_backend()} device(s), {os.cpu_count()} CPUs, allocator '
          f'{os.environ.get(runtime.MARKER) or "default"}): config '
          + ' '.join(f'{s:.3f}' for s in secs['config']) + '; twin '
          + ' '.join(f'{s:.3f}' for s in secs['twin']))
    print('config / twin per step: ' + ' '.join(f'{r:.2f}' for r in ratios)
          + f' (median {statistics.median(ratios):.2f}): at equal wall time the twin trains '
          f'{twin_steps:,} steps against {steps:,}')


if __name__ == '__main__':
  main()
