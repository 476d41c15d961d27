r"""Train-step throughput, model FLOP utilisation and memory of one (shape, mode, dtype).

  python -m benchmarks.train_step --shape=tiny --mode=hmdlm --dtype=float32 --steps=5 \
      [--variant=real|bare] [--patch=subs_nll] [--profile] [--json=OUT.json]

Runs the project's real training step (`hmdlm_jax.train.make_train_step`: loss, gradient, clipped
AdamW, EMA, NaN guard, donated state) on a synthetic batch, `warmup` untimed steps (the first one
compiles) then `steps` timed steps; reports the median step time, tokens/s, the explicit FLOP
count of benchmarks/flops.py, achieved FLOP/s, XLA's cost analysis and memory analysis of the
compiled step, the process's peak RSS and the compilations seen during the timed steps (must be 0).

`--variant=bare` times the reference definition "loss + grad + AdamW" (the same loss and optimiser,
without EMA, NaN guard and metrics), for comparison with MDLM's / MD4's figures.
`--patch=NAME` applies a candidate optimisation as a monkeypatch (benchmarks/patches.py) so its effect can
be measured before the owner of the patched module adopts it.
`--profile` also times the step's parts as separately jitted programs (forward loss, loss +
gradient, optimiser update, EMA update).

Shapes (SHAPES): tiny (4 × 256, 4 heads, L=128, V=30522, batch 32), small (configs/lm1b.py, the
LM1B DiT 12 × 768; batch 8 on CPU, 512 on an accelerator), sudoku_6m / sudoku_25m
(configs/sudoku_6m.py, configs/sudoku_25m.py; batch 32 on CPU, the configs' 256 on an accelerator).
Mode 'mdlm' is the K = 1 twin (δ = (0,)), 'hmdlm' the config's K (2 on text, 6 on Sudoku).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import common
from benchmarks import compile_count
from benchmarks import flops as flops_lib
from benchmarks.patches import PATCHES
from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax import optim
from hmdlm_jax import processes
from hmdlm_jax import sharding as shd
from hmdlm_jax import tasks
from hmdlm_jax import train

SHAPES = ('tiny', 'small', 'sudoku_6m', 'sudoku_25m')
MODES = ('mdlm', 'hmdlm')
DTYPES = ('float32', 'bfloat16')
VARIANTS = ('real', 'bare')
# (CPU batch, accelerator batch) per shape.
BATCH = {'tiny': (32, 32), 'small': (8, 512), 'sudoku_6m': (32, 256), 'sudoku_25m': (32, 256)}


# ----------------------------------------------------------------------------- configs


def shape_config(shape: str, mode: str, dtype: str, *, batch_size: int | None = None,
                 seq_len: int | None = None, dropout: float | None = None,
                 overrides: Sequence[str] = ()) -> config_lib.Config:
  """The resolved experiment config of a benchmark shape (see the module docstring).

  The shape's settings are `--config.section.field=value` overrides of its configs/*.py file,
  read by `hmdlm_jax.config.load`; `overrides` (same dialect) come last and win.
  """
  if shape not in SHAPES:
    raise ValueError(f'--shape={shape!r}: allowed {SHAPES}')
  if mode not in MODES:
    raise ValueError(f'--mode={mode!r}: allowed {MODES}')
  if dtype not in DTYPES:
    raise ValueError(f'--dtype={dtype!r}: allowed {DTYPES}')
  accel = jax.default_backend() != 'cpu'
  sets = []
  if shape == 'tiny':  # the tiny shape: V = 30,522 (MASK = the last row)
    sets += ['--config.model.num_layers=4', '--config.model.hidden_size=256',
             '--config.model.num_heads=4', '--config.model.mlp_dim=1024',
             '--config.model.vocab_size=30522']
  sets += [f'--config.data.batch_size={int(batch_size or BATCH[shape][1 if accel else 0])}',
           f'--config.model.dtype={dtype}']
  if seq_len is not None:
    sets.append(f'--config.model.seq_len={int(seq_len)}')
  if dropout is not None:
    sets.append(f'--config.model.dropout={float(dropout)}')
  if mode == 'mdlm':
    sets += ['--config.model.num_levels=1', '--config.schedule.offsets=(0.0,)']
  sets += ['--config.train.num_steps=1000',  # the lr schedule only
           '--config.train.grad_accum=1']
  c = common.experiment('lm1b.py' if shape in ('tiny', 'small') else f'{shape}.py',
                        sets + list(overrides))
  if seq_len is not None and c.model.position_embedding == 'sudoku':
    raise ValueError(f'--seq_len: shape {shape!r} has fixed Sudoku positions (L = 81)')
  c = config_lib.resolve(c)
  train.validate_config(c)
  return c


def synthetic_batch(config: config_lib.Config, seed: int = 0) -> dict[str, np.ndarray]:
  """A host batch of the pipeline contract (docs/design.md): random tokens and levels.

  Text shapes: every position carries loss. Sudoku shapes: ~30% given cells (clues, no loss).
  """
  m = config.model
  b, l = int(config.data.batch_size), int(m.seq_len)
  v, k = int(m.vocab_size), int(m.num_levels)
  mask_id = config.model.mask_id
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, v - 1, (b, l)).astype(np.int32)
  tokens = np.where(tokens >= mask_id, tokens + 1, tokens).astype(np.int32)  # never MASK
  levels = rng.integers(0, k, (b, l)).astype(np.int32)
  if config.data.kind == 'sudoku':
    given = rng.random((b, l)) < 0.3
  else:
    given = np.zeros((b, l), bool)
  return processes.build(config).prepare_batch({'tokens': tokens, 'levels': levels,
                                                'given': given, 'loss_mask': ~given})


def real_step(config: config_lib.Config) -> tuple[Callable[..., Any], Any, Any]:
  """The package's real jitted train step (hmdlm_jax/train.py) on a synthetic batch of `config`
  (a resolved config): (step(state, batch) -> (state, metrics), initial state, global batch).
  Nothing is compiled until the first call."""
  train.validate_config(config)
  mesh = shd.make_mesh(config.mesh)
  model = tasks.build_model(config)
  state, shardings = train.create_train_state(config, mesh, model)
  step = train.make_train_step(config, model, processes.build(config), mesh, shardings)
  return step, state, shd.make_global_batch(synthetic_batch(config), mesh)


# ----------------------------------------------------------------------------- patch check


def patch_check(config: config_lib.Config, patches: list[str]) -> dict[str, float]:
  """Loss and gradient with and without `patches` at the initial parameters (exactness check).

  Returns the loss difference and the relative L2 difference of the gradients; the parameters
  are perturbed (N(0, 0.02) added) so that the zero-initialised heads give non-trivial logits.
  """
  m = config.model
  model = tasks.build_model(config)
  process = processes.build(config)
  params = models.init_params(model, jax.random.PRNGKey(0), int(m.seq_len))
  leaves, tdef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  params = jax.tree.unflatten(tdef, [x + 0.02 * jax.random.normal(k, x.shape, x.dtype)
                                     for x, k in zip(leaves, keys)])
  batch = {k: jnp.asarray(v) for k, v in synthetic_batch(config).items()}

  def loss_fn(p: Any) -> jax.Array:
    apply_fn = models.make_apply_fn(model, p, train=False)
    return process.loss(apply_fn, batch, jax.random.PRNGKey(2))[0]

  ref_loss, ref_grad = jax.jit(jax.value_and_grad(loss_fn))(params)
  with contextlib.ExitStack() as stack:
    for name in patches:
      stack.enter_context(PATCHES[name]())
    new_loss, new_grad = jax.jit(jax.value_and_grad(loss_fn))(params)
  diff = optax.global_norm(jax.tree.map(lambda a, b: a - b, new_grad, ref_grad))
  return {'loss': float(ref_loss), 'loss_abs_diff': float(abs(new_loss - ref_loss)),
          'grad_rel_diff': float(diff / optax.global_norm(ref_grad))}


# ----------------------------------------------------------------------------- steps


def _bare_step(config: config_lib.Config, model: Any, process: processes.Process
               ) -> Callable[..., Any]:
  """jit((params, opt_state, batch, key) -> (params, opt_state, loss)): loss + grad + AdamW."""
  optimizer = optim.make_optimizer(config.optim, config.train.num_steps)

  def step(params: Any, opt_state: Any, batch: Mapping[str, jax.Array], key: jax.Array
           ) -> tuple[Any, Any, jax.Array]:
    loss_key, dropout_key = jax.random.split(key)

    def loss_fn(p: Any) -> jax.Array:
      apply_fn = models.make_apply_fn(model, p, train=True, rng=dropout_key)
      return process.loss(apply_fn, batch, loss_key)[0]

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return jax.jit(step, donate_argnums=(0, 1))


def _median_seconds(fn: Callable[[], Any], steps: int, warmup: int,
                    before_each: Callable[[], Any] | None = None
                    ) -> tuple[float, list[float]]:
  """Median wall time of `fn` over `steps` calls after `warmup` calls; `before_each` (untimed)
  runs before every timed call."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(steps):
    if before_each is not None:
      before_each()
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times), times


class AdjacentPeak:
  """The machine peak (benchmarks/machine.py) measured right before every timed step.

  On a machine shared with other work, a step and the matmuls next to it see about the same
  share of the cores, so (step FLOP/s) / (adjacent peak) estimates the utilisation the step would
  reach on a quiet machine better than a peak measured once per run.
  """

  def __init__(self) -> None:
    from benchmarks import machine  # pylint: disable=g-import-not-at-top
    self._measure = lambda: machine.matmul_peak(repeats=3, with_torch=False)['peak_gflops']
    self.gflops: list[float] = []

  def __call__(self) -> None:
    self.gflops.append(self._measure())


def _memory(compiled: Any) -> dict[str, int] | None:
  try:
    ma = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except  (not every backend has it)
    return None
  if ma is None:
    return None
  out = {k: int(getattr(ma, k)) for k in ('argument_size_in_bytes', 'output_size_in_bytes',
                                           'alias_size_in_bytes', 'temp_size_in_bytes')}
  out['peak_bytes'] = (out['argument_size_in_bytes'] + out['output_size_in_bytes']
                       + out['temp_size_in_bytes'] - out['alias_size_in_bytes'])
  return out


def _device_peak_bytes() -> int | None:
  stats = jax.devices()[0].memory_stats()
  return int(stats['peak_bytes_in_use']) if stats and 'peak_bytes_in_use' in stats else None


def _profile_parts(config: config_lib.Config, model: Any, process: processes.Process,
                   state: train.TrainState, batch: Mapping[str, jax.Array], steps: int
                   ) -> dict[str, float]:
  """Median seconds of the step's parts, each jitted on its own."""
  optimizer = optim.make_optimizer(config.optim, config.train.num_steps)
  key = jax.random.PRNGKey(0)

  def loss_fn(p: Any) -> jax.Array:
    k1, k2 = jax.random.split(key)
    apply_fn = models.make_apply_fn(model, p, train=True, rng=k2)
    return process.loss(apply_fn, batch, k1)[0]

  fwd = jax.jit(loss_fn)
  vg = jax.jit(jax.value_and_grad(loss_fn))
  upd = jax.jit(lambda g, s, p: optax.apply_updates(p, optimizer.update(g, s, p)[0]))
  ema = jax.jit(lambda e, p: optim.ema_update(e, p, jnp.float32(0.999)))
  p, s = state.params, state.opt_state
  out = {}
  out['forward_loss_s'] = _median_seconds(lambda: fwd(p), steps, 1)[0]
  out['loss_and_grad_s'] = _median_seconds(lambda: vg(p), steps, 1)[0]
  out['optimizer_update_s'] = _median_seconds(lambda: upd(p, s, p), steps, 1)[0]
  out['ema_update_s'] = _median_seconds(lambda: ema(p, p), steps, 1)[0]
  return out


def run(config: config_lib.Config, *, steps: int = 5, warmup: int = 1,
        variant: str = 'real', profile: bool = False, adjacent_peak: bool = False
        ) -> dict[str, Any]:
  """Times `steps` train steps after `warmup` (>= 1; the first compiles). Returns the record."""
  if variant not in VARIANTS:
    raise ValueError(f'--variant={variant!r}: allowed {VARIANTS}')
  if steps < 1 or warmup < 1:
    raise ValueError(f'--steps={steps} and --warmup={warmup} must be >= 1')
  counter = compile_count.compile_counter()
  m = config.model
  b, l = int(config.data.batch_size), int(m.seq_len)
  mesh = shd.make_mesh(config.mesh)
  model = tasks.build_model(config)
  process = processes.build(config)
  state, shardings = train.create_train_state(config, mesh, model)
  batch = shd.make_global_batch(synthetic_batch(config), mesh)
  n_params = models.count_params(state.params)

  t0 = time.perf_counter()
  with shd.mesh_context(mesh):
    if variant == 'real':
      step = train.make_train_step(config, model, process, mesh, shardings)
      compiled = step.jitted.lower(state, {k: batch[k] for k in train.BATCH_KEYS}).compile()
    else:
      bare = _bare_step(config, model, process)
      key0 = jax.random.PRNGKey(0)
      compiled = bare.lower(state.params, state.opt_state, batch, key0).compile()
  compile_s = time.perf_counter() - t0
  peak = AdjacentPeak() if adjacent_peak else None
  if peak is not None:
    peak()  # compiles the matmul now, not during the timed steps
    peak.gflops.clear()
  n_compiles_before = len(counter.events)

  holder: dict[str, Any] = {'state': state, 'params': state.params, 'opt': state.opt_state}
  metrics: dict[str, Any] = {}

  def one() -> Any:
    if variant == 'real':
      holder['state'], m_ = step(holder['state'], batch)
      metrics.update(m_)
      return holder['state'], m_
    with shd.mesh_context(mesh):
      holder['params'], holder['opt'], loss = bare(holder['params'], holder['opt'], batch,
                                                   jax.random.PRNGKey(len(metrics)))
    metrics['loss'] = loss
    return holder['params'], loss

  median_s, times = _median_seconds(one, steps, warmup, peak)
  step_compiles = len(counter.events) - n_compiles_before
  loss = float(metrics['loss'])
  if not np.isfinite(loss):
    raise FloatingPointError(f'non-finite loss {loss} in the benchmark run of {m.backbone}')

  f = flops_lib.train_step_flops(m, b, l)
  xla = flops_lib.xla_flops(compiled)
  tokens = b * l
  rec: dict[str, Any] = {
      'backbone': m.backbone, 'num_levels': int(m.num_levels), 'variant_model': m.variant,
      'dtype': m.dtype, 'batch_size': b, 'seq_len': l, 'vocab_size': int(m.vocab_size),
      'num_layers': int(m.num_layers), 'hidden_size': int(m.hidden_size),
      'num_params': n_params, 'devices': jax.device_count(), 'step_variant': variant,
      'warmup_steps': warmup, 'timed_steps': steps, 'step_times_s': times,
      'median_step_s': median_s, 'tokens_per_s': tokens / median_s,
      'compile_s': compile_s, 'compilations_during_steps': step_compiles,
      'flops': f.as_dict(), 'flops_per_step': f.train_step,
      'achieved_gflops': f.train_step / median_s / 1e9,
      'xla_cost_analysis_flops': xla,
      'xla_over_formula': (xla / f.train_step) if xla else None,
      'memory_analysis': _memory(compiled), 'device_peak_bytes': _device_peak_bytes(),
      'peak_rss_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      'final_loss': loss,
  }
  if peak is not None:
    rec['adjacent_peak_gflops'] = peak.gflops
    rec['mfu_adjacent'] = statistics.median(
        f.train_step / t / 1e9 / g for t, g in zip(times, peak.gflops))
  if profile:
    live = holder['state'] if variant == 'real' else train.TrainState(
        step=state.step, params=holder['params'], ema_params=holder['params'],
        opt_state=holder['opt'], rng=state.rng, bad_steps=state.bad_steps,
        skipped_steps=state.skipped_steps)
    with shd.mesh_context(mesh):
      rec['profile'] = _profile_parts(config, model, process, live, batch, steps)
  return rec


def _option_value(v: str) -> Any:
  """XLA compiler option value from text: true/false -> bool, an integer -> int, else the text."""
  if v.lower() in ('true', 'false'):
    return v.lower() == 'true'
  try:
    return int(v)
  except ValueError:
    return v


def parse_candidate(spec: str) -> tuple[tuple[str, ...], dict[str, Any]]:
  """'subs_nll,xla_cpu_x=V' -> (('subs_nll',), {'xla_cpu_x': V}): patches and XLA options."""
  patches, options = [], {}
  for tok in (t for t in spec.split(',') if t):
    if '=' in tok:
      k, v = tok.split('=', 1)
      options[k] = _option_value(v)
    elif tok in PATCHES:
      patches.append(tok)
    else:
      raise ValueError(f'--compare: {tok!r} is neither a patch {sorted(PATCHES)} nor an XLA '
                       'option KEY=VALUE')
  return tuple(patches), options


def compare(config: config_lib.Config,
            candidates: list[tuple[tuple[str, ...], dict[str, Any]]], rounds: int
            ) -> dict[str, Any]:
  """Real steps built under each (patches, XLA compiler options), timed interleaved.

  Round r times one step of every candidate in turn (each has its own state), so a drifting
  machine load hits all alike. XLA options are per-compilation `compiler_options` (e.g.
  {'xla_cpu_experimental_ynn_fusion_type': ''}), so flag variants share one process too.
  Returns {'candidates', 'median_step_s', 'step_times_s', 'ratio_to_first'}.
  """
  mesh = shd.make_mesh(config.mesh)
  model = tasks.build_model(config)
  process = processes.build(config)
  batch = shd.make_global_batch(synthetic_batch(config), mesh)
  batch = {k: batch[k] for k in train.BATCH_KEYS}
  runs = []
  for patches, options in candidates:
    with contextlib.ExitStack() as stack:
      for name in patches:
        stack.enter_context(PATCHES[name]())
      state, shardings = train.create_train_state(config, mesh, model)
      step = train.make_train_step(config, model, process, mesh, shardings)
      with shd.mesh_context(mesh):
        compiled = step.jitted.lower(state, batch).compile(compiler_options=options)
    state, _ = compiled(state, batch)  # warm-up
    jax.block_until_ready(state)
    runs.append({'step': compiled, 'state': state, 'times': []})
  for _ in range(rounds):
    for r in runs:
      t0 = time.perf_counter()
      r['state'], m_ = r['step'](r['state'], batch)
      jax.block_until_ready((r['state'], m_))
      r['times'].append(time.perf_counter() - t0)
  med = [statistics.median(r['times']) for r in runs]
  names = ['+'.join(list(p) + [f'{k}={v}' for k, v in o.items()]) or 'real' for p, o in candidates]
  return {'candidates': names, 'median_step_s': med, 'step_times_s': [r['times'] for r in runs],
          'ratio_to_first': [m / med[0] for m in med]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--shape', default='tiny', choices=SHAPES)
  p.add_argument('--mode', default='hmdlm', choices=MODES)
  p.add_argument('--dtype', default='float32', choices=DTYPES)
  p.add_argument('--batch_size', type=int, default=None)
  p.add_argument('--seq_len', type=int, default=None)
  p.add_argument('--dropout', type=float, default=None, help="override the config's dropout")
  p.add_argument('--steps', type=int, default=5)
  p.add_argument('--warmup', type=int, default=1)
  p.add_argument('--variant', default='real', choices=VARIANTS)
  p.add_argument('--patch', action='append', default=[], choices=sorted(PATCHES))
  p.add_argument('--profile', action='store_true')
  p.add_argument('--adjacent_peak', action='store_true',
                 help='measure the matmul peak before every timed step (MFU on a loaded machine)')
  p.add_argument('--check_patch', action='store_true',
                 help='also compare loss and gradient with and without --patch')
  p.add_argument('--compare', action='append', default=None,
                 help='interleaved comparison of the real step against each candidate, a '
                 'comma-separated list of patches and XLA options KEY=VALUE (repeatable); '
                 '--steps rounds')
  p.add_argument('--json', default=None, help='write the record here')
  a = p.parse_args(argv)
  t0 = time.perf_counter()
  config = shape_config(a.shape, a.mode, a.dtype, batch_size=a.batch_size, seq_len=a.seq_len,
                        dropout=a.dropout)
  if a.compare:
    rec = compare(config, [((), {})] + [parse_candidate(c) for c in a.compare], a.steps)
    rec.update(shape=a.shape, mode=a.mode, dtype=a.dtype, batch_size=int(config.data.batch_size),
               wall_s=time.perf_counter() - t0, xla_flags=os.environ.get('XLA_FLAGS', ''))
    if a.json:
      with open(a.json, 'w', encoding='utf-8') as f:
        json.dump(rec, f, indent=2)
    print(json.dumps({k: rec[k] for k in ('candidates', 'median_step_s', 'ratio_to_first')}))
    return rec
  with contextlib.ExitStack() as stack:
    for name in a.patch:
      stack.enter_context(PATCHES[name]())
    rec = run(config, steps=a.steps, warmup=a.warmup, variant=a.variant, profile=a.profile,
              adjacent_peak=a.adjacent_peak)
  if a.check_patch and a.patch:
    rec['patch_check'] = patch_check(config, a.patch)
  rec.update(shape=a.shape, mode=a.mode, patches=a.patch, wall_s=time.perf_counter() - t0,
             xla_flags=os.environ.get('XLA_FLAGS', ''))
  if a.json:
    with open(a.json, 'w', encoding='utf-8') as f:
      json.dump(rec, f, indent=2)
  print(json.dumps({k: rec[k] for k in ('shape', 'mode', 'dtype', 'median_step_s',
                                        'tokens_per_s', 'achieved_gflops', 'compile_s',
                                        'compilations_during_steps')}))
  return rec


if __name__ == '__main__':
  main()
