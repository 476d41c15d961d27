r"""Where the train step's time goes: XLA ops ranked by time, with the JAX source op of each.

  python -m benchmarks.profile --shape=tiny --mode=mdlm --batch_size=8 [--patch=subs_nll] \
      [--top=25] [--json=OUT.json]
  python -m benchmarks.profile --config=configs/sudoku_learned_hierarchy.py \
      --config.model.pathway.width=32 --config.model.pathway.num_heads=1     # any experiment config

Traces `--steps` real train steps (hmdlm_jax/train.py) with `jax.profiler.trace`, reads the trace
back with `jax.profiler.ProfileData`, sums each XLA op's duration over all threads and steps, and
joins it with the compiled HLO (the op's shape and the `op_name` metadata: which JAX operation of
which module it came from). Durations are summed over threads, so with several threads the column
total exceeds the wall time; the share column is relative to that total. A second table sums
the ops by the module that made them (forward / backward, the first two levels of the Flax module
path, layer indices merged: `blocks_3` -> `blocks_N`), so a part of the network is one row; its
"ops" are distinct traced names (an op in a loop body counts once; the few executor events that
`_SKIP` keeps, e.g. `PjitFunction`, land in "forward other"). The
process starts under the allocator settings of `hmdlm_jax.main` (hmdlm_jax/runtime.py: on a
CPU-only host by default, else as HMDLM_ALLOCATOR says), which change the step's time (by 17% for
the Sudoku twin on the 2-core Intel VM). `--config` and its `--config.section.field=value`
overrides are those of `python -m hmdlm_jax.main` (read by `hmdlm_jax.config.load`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import json
import os
import re
import statistics
import tempfile
import time
from typing import Any

from hmdlm_jax import runtime  # pylint: disable=g-import-not-at-top

if __name__ == '__main__':  # as hmdlm_jax.main: the allocator acts at process start only
  runtime.set_up_entry_point()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

from benchmarks import common
from benchmarks import patches
from benchmarks import train_step as ts
from hmdlm_jax import processes
from hmdlm_jax import sharding as shd
from hmdlm_jax import config as config_lib
from hmdlm_jax import tasks
from hmdlm_jax import train

# Trace events that are not XLA ops (executor bookkeeping, Python frames).
_SKIP = re.compile(r'ThunkExecutor|^\$|PjRt|Execute|^end:|TraceMe')
_HLO_LINE = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) .*?(?:op_name="([^"]*)")?')


def hlo_index(hlo_text: str) -> dict[str, tuple[str, str]]:
  """HLO instruction name -> (result shape, op_name metadata) of the compiled module."""
  out = {}
  for line in hlo_text.splitlines():
    m = _HLO_LINE.match(line)
    if m:
      name, shape = m.group(1), m.group(2)
      op = re.search(r'op_name="([^"]*)"', line)
      out[name] = (shape, op.group(1) if op else '')
  return out


def module_of(source: str) -> str:
  """'transpose(jvp(DiT))/DiT.trunk/blocks_3/mlp_0/dot_general' -> 'backward DiT/DiT.trunk': the
  direction and the first two levels of an op's module path, layer indices merged; ops outside
  the model (optimizer, loss, sampling of the corruption) -> 'forward other'."""
  direction = 'backward' if 'transpose(' in source else 'forward'
  parts = re.sub(r'transpose\(|jvp\(|\)', '', source).split('/')
  if len(parts) < 2 or not parts[0][:1].isupper():  # a Flax module path starts with its class
    return f'{direction} other'
  path = re.sub(r'_\d+(?=/|$)', '_N', '/'.join(parts[:2]))
  return f'{direction} {path}'


def by_module(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """`profile`'s op rows summed by `module_of` their source: [{'module', 'ms_per_step', 'ops'}],
  largest first."""
  ms: collections.Counter[str] = collections.Counter()
  ops: collections.Counter[str] = collections.Counter()
  for r in rows:
    key = module_of(r['source'])
    ms[key] += r['ms_per_step']
    ops[key] += 1
  return [{'module': k, 'ms_per_step': v, 'ops': ops[k]} for k, v in ms.most_common()]


def experiment_config(path: str, overrides: list[str]) -> Any:
  """A configs/*.py experiment with `--config.section.field=value` overrides, resolved and
  validated as the entry point does. Raises ValueError naming the file or field."""
  config = config_lib.resolve(config_lib.load(path, overrides))
  train.validate_config(config)
  return config


def profile(shape: str, mode: str, batch_size: int, steps: int, top: int,
            config: Any = None) -> dict[str, Any]:
  """`config` (an `experiment_config`) replaces shape / mode / batch_size when given."""
  if config is None:
    config = ts.shape_config(shape, mode, 'float32', batch_size=batch_size)
  mesh = shd.make_mesh(config.mesh)
  model = tasks.build_model(config)
  process = processes.build(config)
  state, sh = train.create_train_state(config, mesh, model)
  step = train.make_train_step(config, model, process, mesh, sh)
  batch = shd.make_global_batch(ts.synthetic_batch(config), mesh)
  with shd.mesh_context(mesh):
    compiled = step.jitted.lower(state, {k: batch[k] for k in train.BATCH_KEYS}).compile()
  index = hlo_index(compiled.as_text())
  times = []
  for _ in range(steps + 1):  # the first call is a warm-up
    t0 = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready((state, m))
    times.append(time.perf_counter() - t0)
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp):
      for _ in range(steps):
        state, m = step(state, batch)
        jax.block_until_ready((state, m))
    path = glob.glob(os.path.join(tmp, '**', '*.xplane.pb'), recursive=True)[0]
    data = jax.profiler.ProfileData.from_file(path)
    total: collections.Counter[str] = collections.Counter()
    for plane in data.planes:
      for line in plane.lines:
        for ev in line.events:
          if not _SKIP.search(ev.name):
            total[ev.name] += ev.duration_ns
  all_ns = sum(total.values())
  rows = []
  for name, ns in total.most_common():
    shape_s, op = index.get(name, ('?', ''))
    rows.append({'op': name, 'ms_per_step': ns / steps / 1e6, 'share': ns / max(all_ns, 1),
                 'shape': shape_s, 'source': op.replace('jit(step_fn)/', '')})
  return {'shape': shape, 'mode': mode, 'batch_size': batch_size,
          'median_step_s': statistics.median(times[1:]), 'op_ms_per_step_all_threads':
          all_ns / steps / 1e6, 'ops_per_step': len(rows), 'by_module': by_module(rows),
          'top': rows[:top]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--shape', default='tiny', choices=ts.SHAPES)
  p.add_argument('--mode', default='mdlm', choices=ts.MODES)
  p.add_argument('--batch_size', type=int, default=8)
  p.add_argument('--steps', type=int, default=2)
  p.add_argument('--top', type=int, default=25)
  p.add_argument('--patch', action='append', default=[], choices=sorted(patches.PATCHES))
  p.add_argument('--json', default=None)
  p.add_argument('--config', default='',
                 help='a configs/*.py experiment instead of --shape/--mode/--batch_size; '
                 '--config.section.field=value overrides it')
  a, overrides = common.parse_with_overrides(p, argv)
  if overrides and not a.config:
    p.error(f'{overrides[0]} overrides a --config experiment: give --config=configs/NAME.py')
  try:
    config = experiment_config(a.config, overrides) if a.config else None
  except ValueError as e:
    p.error(str(e))
  with contextlib.ExitStack() as stack:
    for name in a.patch:
      stack.enter_context(patches.PATCHES[name]())
    rec = profile(a.shape, a.mode, a.batch_size, a.steps, a.top, config)
  rec.update(patches=a.patch, xla_flags=os.environ.get('XLA_FLAGS', ''), config=a.config,
             sets=overrides, allocator=os.environ.get(runtime.MARKER) or 'default')
  if config is not None:  # the shape arguments were not used
    rec.update(shape=None, mode=None, batch_size=int(config.data.batch_size))
  what = (f'{a.config} {" ".join(overrides)}' if a.config
          else f'{a.shape} {a.mode} B={a.batch_size}')
  print(f'{what} patches={a.patch} XLA_FLAGS={rec["xla_flags"]!r} allocator {rec["allocator"]}: '
        f'{rec["median_step_s"]:.3f} s/step (wall), {rec["ops_per_step"]} ops, '
        f'{rec["op_ms_per_step_all_threads"]:.0f} ms/step summed over threads')
  print(common.table('By module', ['module', 'ms/step', 'ops', 'us/op'],
                     [[r['module'][:70], r['ms_per_step'], r['ops'],
                       1e3 * r['ms_per_step'] / r['ops']] for r in rec['by_module'][:12]]))
  print(common.table('Top XLA ops', ['op', 'ms/step', 'share', 'shape', 'source'],
                     [[r['op'], r['ms_per_step'], r['share'], r['shape'][:40], r['source'][:90]]
                      for r in rec['top']]))
  if a.json:
    with open(a.json, 'w', encoding='utf-8') as f:
      json.dump(rec, f, indent=2)
  return rec


if __name__ == '__main__':
  main()
