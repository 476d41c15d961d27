r"""The accelerator check of issue 14 (run by benchmarks/device_check.sh; no downloads).

  python -m benchmarks.device_check --out=DIR          # on a GPU/TPU: the real shapes
  python -m benchmarks.device_check --out=DIR --dry    # on CPU, tiny shapes, same code paths

Measures, writing DIR/device_check.json (one record per item, plus the device facts):
  lm1b_mdlm, lm1b_hmdlm  the real train step of configs/lm1b_mdlm.py / configs/lm1b.py at global
                         batch 512, bf16 compute (model.dtype = bfloat16; losses in float32);
                         s/step, tokens/s, model FLOP/s (benchmarks/flops.py) and MFU against the
                         device's published dense bf16 peak (PEAK_BF16). If 512 does not fit in
                         one device's memory, train.grad_accum is raised (2, 4, 8): the global
                         batch stays 512, and the record says which accumulation ran.
  sudoku_25m             the real train step of configs/sudoku_25m.py (batch 256, the config's
                         float32 unless --sudoku_dtype) for HMDLM (K = 6) and MDLM.
  sampling_alg2          Algorithm 2 (ancestral, HMDLM K = 2, LM1B model, random weights):
                         sequences/s and network calls at T = 128, batch 64.
--dry: the same functions at tiny shapes (DiT 1 × 32, V = 30,522, B = 4, L = 32; Sudoku DiT 1 × 32,
B = 8; sampling T = 8, B = 2) on CPU, in well under a minute: CI runs it through
tests/test_device_check.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

# Published dense bf16 peak FLOP/s per device (NVIDIA data sheets; Cloud TPU docs).
PEAK_BF16 = {'A100': 312e12, 'H100': 989e12, 'H200': 989e12, 'GH200': 989e12, 'L4': 121e12,
             'A10': 125e12, 'L40S': 362e12, 'V100': 125e12, 'TPU v4': 275e12,
             'TPU v5 lite': 197e12, 'TPU v5e': 197e12, 'TPU v5p': 459e12, 'TPU v6': 918e12}
DRY_MODEL = dict(num_layers=1, hidden_size=32, num_heads=2, mlp_dim=64, cond_dim=16)


def peak_flops(device: Any) -> float | None:
  kind = str(getattr(device, 'device_kind', ''))
  hits = [v for k, v in PEAK_BF16.items() if k.lower() in kind.lower()]
  return max(hits) if hits else None


def _timed(fn: Callable[[], Any], steps: int, warmup: int) -> tuple[float, list[float]]:
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times), times


def _config(name: str, dry: bool, dtype: str | None) -> Any:
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  c = common.experiment({'lm1b_mdlm': 'lm1b_mdlm.py', 'lm1b_hmdlm': 'lm1b.py',
                         'sudoku_25m_hmdlm': 'sudoku_25m.py', 'sudoku_25m_mdlm': 'sudoku_25m.py',
                         'sampling_alg2': 'lm1b.py'}[name])
  if name == 'sudoku_25m_mdlm':
    c.model.num_levels = 1
    c.schedule.offsets = (0.0,)
  if dtype:
    c.model.dtype = dtype
  # The dense token head: the MFU below counts the model's dense FLOPs (benchmarks/flops.py), which
  # the selected-rows head ('auto' on one device) would skip in part.
  c.loss.token_rows = 'all'
  c.train.num_steps = 1000
  if dry:
    for k, v in DRY_MODEL.items():
      c.model[k] = v
    c.model.dtype = 'float32'
    if c.model.position_embedding != 'sudoku':
      c.model.seq_len = c.data.seq_len = 81 if 'sudoku' in name else 32
    c.data.batch_size = 8 if 'sudoku' in name else 4
  return c


def _step_adapter(config: Any, batch_size: int, accum: int) -> tuple[Callable[[], Any], Any]:
  """THE one place that touches the package's training API (re-point it after a refactor).

  Returns (one_step() -> metrics, resolved config): the real jitted train step on a synthetic
  batch of the pipeline contract, state carried between calls.
  """
  from benchmarks import train_step as ts  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  config.data.batch_size = batch_size
  config.train.grad_accum = accum
  config = config_lib.resolve(config)
  step, state, batch = ts.real_step(config)
  holder = {'state': state}

  def one() -> Any:
    holder['state'], m = step(holder['state'], batch)
    return m

  return one, config


def train_item(name: str, dry: bool, steps: int, dtype: str | None = None) -> dict[str, Any]:
  from benchmarks import flops as flops_lib  # pylint: disable=g-import-not-at-top
  config = _config(name, dry, dtype)
  b = int(config.data.batch_size)
  err = None
  for accum in (1, 2, 4, 8):
    if b % accum:
      continue
    try:
      t0 = time.perf_counter()
      one, rc = _step_adapter(config, b, accum)
      jax.block_until_ready(one())  # compiles
      compile_s = time.perf_counter() - t0
      med, times = _timed(one, steps, 1)
      break
    except Exception as e:  # pylint: disable=broad-except  (RESOURCE_EXHAUSTED: retry smaller)
      if 'RESOURCE_EXHAUSTED' not in str(e) and 'out of memory' not in str(e).lower():
        raise
      err = str(e)[:300]
      jax.clear_caches()
  else:
    return {'item': name, 'error': f'does not fit even with grad_accum=8: {err}'}
  m = rc.model
  f = flops_lib.train_step_flops(m, b, int(m.seq_len)).train_step
  peak = peak_flops(jax.devices()[0])
  loss = float(one()['loss'])
  return {'item': name, 'batch_size': b, 'grad_accum': accum, 'seq_len': int(m.seq_len),
          'num_levels': int(m.num_levels), 'dtype': str(m.dtype), 'compile_s': compile_s,
          'median_step_s': med, 'step_times_s': times, 'tokens_per_s': b * int(m.seq_len) / med,
          'model_flops_per_step': f, 'achieved_tflops': f / med / 1e12,
          'peak_tflops': peak / 1e12 if peak else None,
          'mfu': (f / med / peak) if peak else None, 'final_loss': loss,
          'loss_finite': bool(np.isfinite(loss))}


def sampling_item(dry: bool, repeats: int) -> dict[str, Any]:
  """Algorithm 2 throughput (ancestral ordering, K = 2): the package's public sampler."""
  from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import models, processes, tasks  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(_config('sampling_alg2', dry, None))
  m = config.model
  t_steps, batch = (8, 2) if dry else (128, 64)
  model = tasks.build_model(config)
  params = models.init_params(model, jax.random.PRNGKey(0), int(m.seq_len))
  process = processes.build(config)
  cfg = config_lib.SampleConfig(num_steps=t_steps, num_levels=int(m.num_levels),
                                mask_id=int(m.mask_id), ordering='ancestral',
                                prior_corrected=bool(m.prior_corrected_head),
                                variant=str(m.variant))

  @jax.jit
  def run(params: Any, key: jax.Array) -> Any:
    apply_fn = models.make_apply_fn(model, params, train=False)
    return process.sample(apply_fn, key, cfg, batch_size=batch, seq_len=int(m.seq_len))

  t0 = time.perf_counter()
  out = jax.block_until_ready(run(params, jax.random.PRNGKey(1)))
  compile_s = time.perf_counter() - t0
  keys = iter(range(2, 100))
  med, times = _timed(lambda: run(params, jax.random.PRNGKey(next(keys))), repeats, 0)
  return {'item': 'sampling_alg2', 'num_levels': int(m.num_levels), 'T': t_steps,
          'batch_size': batch, 'seq_len': int(m.seq_len), 'dtype': str(m.dtype),
          'compile_s': compile_s, 'median_run_s': med, 'run_times_s': times,
          'sequences_per_s': batch / med, 'nfe': int(out.nfe),
          'tokens_valid': bool((np.asarray(out.tokens) >= 0).all())}


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--out', default=os.environ.get('OUT', '.'))
  p.add_argument('--dry', action='store_true')
  p.add_argument('--steps', type=int, default=None)
  p.add_argument('--items', default='lm1b_mdlm,lm1b_hmdlm,sudoku_25m_hmdlm,sudoku_25m_mdlm,'
                 'sampling_alg2')
  p.add_argument('--sudoku_dtype', default=None, help='override configs/sudoku_25m.py dtype')
  a = p.parse_args(argv)
  steps = a.steps or (2 if a.dry else 10)
  dev = jax.devices()[0]
  t0 = time.perf_counter()
  result: dict[str, Any] = {
      'dry': a.dry, 'backend': jax.default_backend(), 'device_kind': str(dev.device_kind),
      'device_count': jax.device_count(), 'jax': jax.__version__,
      'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'), 'items': []}
  if not a.dry and jax.default_backend() == 'cpu':
    print('device_check: no accelerator found (use --dry on CPU)', file=sys.stderr)
  for item in a.items.split(','):
    ti = time.perf_counter()
    if item == 'sampling_alg2':
      rec = sampling_item(a.dry, 2 if a.dry else 3)
    else:
      rec = train_item(item, a.dry, steps, a.sudoku_dtype if 'sudoku' in item else None)
    rec['wall_s'] = time.perf_counter() - ti
    result['items'].append(rec)
    print(json.dumps({k: v for k, v in rec.items() if not k.endswith('times_s')}), flush=True)
  result['duration_s'] = time.perf_counter() - t0
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, 'device_check.json')
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(result, f, indent=1)
  print(f'wrote {path} ({result["duration_s"]:.0f}s)')
  return result


if __name__ == '__main__':
  main()
