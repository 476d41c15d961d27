r"""Sampler throughput: sequences/s and network evaluations, text (Algorithm 2 / MDLM) and Sudoku.

  python -m benchmarks.sampling --task=text --shape=tiny --modes=mdlm,hmdlm --steps=64,128 \
      --batches=1,64 [--max_run_s=300] [--json=OUT.json]
  python -m benchmarks.sampling --task=sudoku --shape=sudoku_6m --modes=mdlm,hmdlm --batches=64

text: unconditional generation of [B, L] with `Process.sample` (ancestral ordering:
Algorithm 2 for HMDLM K = 2, MDLM's sampler for K = 1; the cache on, as configured by default), for
every T in --steps and B in --batches. sudoku: confidence ordering, greedy, T = 81, on generated
puzzles (their clues given), reported as puzzles/s.

Each configuration is compiled once (timed separately), then run `repeats` times (median). `nfe` is
the number of network calls the sampler actually made for the whole batch (`SampleOutput.nfe`; one
call evaluates every sequence of the batch, so it is also the evaluations per sequence). The
parameters are the random initialisation (throughput does not depend on their values except
through the cache, whose skipping depends on the reveal draws).

A configuration whose predicted run time (the time per reverse step measured at the previous,
smaller T of the same mode and batch, × T) exceeds --max_run_s is not run: its record carries
`extrapolated: true` and the predicted figures, and tables mark it with '~'.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np

from benchmarks import train_step as ts
from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import base
from hmdlm_jax import models
from hmdlm_jax import processes
from hmdlm_jax import tasks
from hmdlm_jax.data import sudoku as sudoku_data
from hmdlm_jax.data import sudoku_generator

TASKS = ('text', 'sudoku')


def _sampler(config: Any, ordering: str, num_steps: int, batch_size: int, greedy: bool
             ) -> tuple[Any, Any, config_lib.SampleConfig]:
  m = config.model
  model = tasks.build_model(config)
  params = models.init_params(model, jax.random.PRNGKey(0), int(m.seq_len))
  process = processes.build(config)
  cfg = config_lib.SampleConfig(
      num_steps=num_steps, num_levels=int(m.num_levels),
      mask_id=config_lib.ModelConfig.from_section(m).mask_id,
      temperature=1.0, greedy=greedy, ordering=ordering, use_cache=bool(config.sample.use_cache),
      prior_corrected=bool(m.prior_corrected_head), variant=str(m.variant),
      time_conditioning=bool(m.time_conditioning))

  @jax.jit
  def run(params: Any, key: jax.Array, given_tokens: Any = None, given_levels: Any = None,
          given_mask: Any = None) -> base.SampleOutput:
    apply_fn = models.make_apply_fn(model, params, train=False)
    return process.sample(apply_fn, key, cfg, batch_size=batch_size, seq_len=int(m.seq_len),
                          given_tokens=given_tokens, given_levels=given_levels,
                          given_mask=given_mask)

  return run, params, cfg


def _time_sampler(run: Any, params: Any, repeats: int, given: tuple[Any, ...] = ()
                  ) -> dict[str, Any]:
  key = jax.random.PRNGKey(1)
  t0 = time.perf_counter()
  compiled = run.lower(params, key, *given).compile()
  compile_s = time.perf_counter() - t0
  times, nfes = [], []
  for r in range(repeats):
    k = jax.random.fold_in(key, r)
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(params, k, *given))
    times.append(time.perf_counter() - t0)
    nfes.append(int(out.nfe))
    if (np.asarray(out.tokens) == -1).any():
      raise AssertionError('sampler returned invalid tokens')
  return {'compile_s': compile_s, 'run_times_s': times, 'median_run_s': statistics.median(times),
          'nfe': nfes, 'nfe_median': float(statistics.median(nfes)), 'out': out}


def text_benchmarks(shape: str, modes: list[str], steps: list[int], batches: list[int],
                    repeats: int, max_run_s: float) -> list[dict[str, Any]]:
  recs = []
  for mode in modes:
    config = ts.shape_config(shape, mode, 'float32', batch_size=1)
    for b in batches:
      last: tuple[int, float] | None = None  # (T, seconds) of the last measured run
      for t in sorted(steps):
        rec: dict[str, Any] = {'task': 'text', 'shape': shape, 'mode': mode, 'T': t,
                               'batch_size': b, 'seq_len': int(config.model.seq_len),
                               'num_levels': int(config.model.num_levels),
                               'sampler': 'algorithm2' if mode == 'hmdlm' else 'mdlm'}
        predicted = None if last is None else last[1] / last[0] * t
        if predicted is not None and predicted > max_run_s:
          rec.update(extrapolated=True, median_run_s=predicted, sequences_per_s=b / predicted,
                     nfe_median=None, note=f'predicted {predicted:.0f}s > --max_run_s='
                     f'{max_run_s:g}: not run (time per step at T={last[0]} × T)')
          recs.append(rec)
          print(json.dumps({k: rec[k] for k in ('mode', 'T', 'batch_size', 'median_run_s')}),
                flush=True)
          continue
        run, params, _ = _sampler(config, 'ancestral', t, b, greedy=False)
        res = _time_sampler(run, params, repeats)
        res.pop('out')
        rec.update(res, extrapolated=False, sequences_per_s=b / res['median_run_s'],
                   seconds_per_nfe=res['median_run_s'] / max(res['nfe_median'], 1.0))
        last = (t, res['median_run_s'])
        recs.append(rec)
        print(json.dumps({k: rec[k] for k in ('mode', 'T', 'batch_size', 'median_run_s',
                                              'nfe_median', 'compile_s')}), flush=True)
  return recs


def sudoku_benchmarks(shape: str, modes: list[str], batches: list[int], repeats: int
                      ) -> list[dict[str, Any]]:
  recs = []
  for mode in modes:
    config = ts.shape_config(shape, mode, 'float32', batch_size=1)
    k = int(config.model.num_levels)
    for b in batches:
      quiz, solution, _ = sudoku_generator.generate_puzzles(np.random.default_rng(0), b, attempts=1)
      given = quiz > 0
      levels = sudoku_data.hierarchy_levels(quiz) if k > 1 else np.zeros(quiz.shape, np.int32)
      cfg_steps = int(config.sample.num_steps)
      run, params, cfg = _sampler(config, 'confidence', cfg_steps, b, greedy=True)
      g_tokens = jnp.asarray(np.where(given, sudoku_data.to_tokens(quiz * given), cfg.mask_id),
                             jnp.int32)
      g_levels = jnp.asarray(np.where(given, levels, k), jnp.int32)
      res = _time_sampler(run, params, repeats, (g_tokens, g_levels, jnp.asarray(given)))
      out = res.pop('out')
      pred = np.asarray(out.tokens)
      kept = bool((pred[given] == np.asarray(g_tokens)[given]).all())
      rec = {'task': 'sudoku', 'shape': shape, 'mode': mode, 'T': cfg_steps, 'batch_size': b,
             'num_levels': k, 'sampler': 'confidence, greedy', **res, 'extrapolated': False,
             'puzzles_per_s': b / res['median_run_s'], 'sequences_per_s': b / res['median_run_s'],
             'clues_kept': kept,
             'mean_givens': float(given.sum(-1).mean())}
      if not kept:
        raise AssertionError('the sampler changed a given clue')
      recs.append(rec)
      print(json.dumps({k_: rec[k_] for k_ in ('shape', 'mode', 'batch_size', 'median_run_s',
                                               'nfe_median', 'puzzles_per_s')}), flush=True)
  return recs


def _ints(s: str) -> list[int]:
  return [int(x) for x in s.split(',') if x]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--task', default='text', choices=TASKS)
  p.add_argument('--shape', default='tiny', choices=ts.SHAPES)
  p.add_argument('--modes', default='mdlm,hmdlm')
  p.add_argument('--steps', default='64,128,256,1024', help='text: comma-separated T values')
  p.add_argument('--batches', default='1,64')
  p.add_argument('--repeats', type=int, default=2)
  p.add_argument('--max_run_s', type=float, default=float('inf'))
  p.add_argument('--json', default=None)
  a = p.parse_args(argv)
  modes = [m for m in a.modes.split(',') if m]
  for m in modes:
    if m not in ts.MODES:
      raise ValueError(f'--modes: {m!r} is not one of {ts.MODES}')
  if a.task == 'text':
    recs = text_benchmarks(a.shape, modes, _ints(a.steps), _ints(a.batches), a.repeats,
                           a.max_run_s)
  else:
    recs = sudoku_benchmarks(a.shape, modes, _ints(a.batches), a.repeats)
  if a.json:
    with open(a.json, 'w', encoding='utf-8') as f:
      json.dump(recs, f, indent=2)
  return recs


if __name__ == '__main__':
  main()
