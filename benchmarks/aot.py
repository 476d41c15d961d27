r"""The pod-scale path, proven by compilation: AOT-compile the LM1B train steps on fake CPU meshes.

  python -m benchmarks.aot                       # default plan (see PLAN), < 10 min on 2 cores
  python -m benchmarks.aot --devices=64 --meshes=data,fsdp_tp4 --modes=mdlm,hmdlm

For every (device count N, mesh, mode) a fresh process with
XLA_FLAGS=--xla_force_host_platform_device_count=N lowers and compiles (never runs) the project's
real train step (`train.make_train_step`: loss, grad, clipped AdamW, EMA, NaN guard, donated
state) of configs/lm1b.py (HMDLM, K = 2, two-pass) or configs/lm1b_mdlm.py (MDLM) at the paper's
global batch 512, bf16 compute (the configs' model.dtype), on abstract inputs
(jax.ShapeDtypeStruct with the project's shardings: parameters, EMA and Adam moments by the
models' logical axes, the batch over ('data', 'fsdp')). From the compiled executable it records:

  memory   compiled.memory_analysis(): per-device argument / output / temporary bytes, and
           peak = argument + output + temporary - aliased (donation)
  flops    compiled.cost_analysis()['flops'] (per device: the partitioned program) and
           'bytes accessed'
  comms    every collective in the compiled HLO text (all-reduce, all-gather, reduce-scatter,
           all-to-all, collective-permute; async -start forms included), its shape(s) and
           replica-group size; bytes moved per device by the ring algorithm:
           all-reduce 2(n-1)/n·S, all-gather (n-1)/n·S_out, reduce-scatter (n-1)/n·S_in,
           all-to-all (n-1)/n·S, collective-permute S

and the ROOFLINE ESTIMATE (an estimate, not a measurement) per accelerator of HARDWARE:
  t_compute = flops / peak,  t_memory = bytes accessed / HBM bandwidth,
  t_comm = comm bytes / link bandwidth,  step ≈ max(t_compute, t_memory, t_comm) (perfect
  overlap; `step_no_overlap` is their sum),  MFU = model FLOPs / (N · peak · step), model FLOPs =
  benchmarks/flops.py's count at B = 512 (matmuls only).
XLA:CPU's cost model counts the CPU program (bf16 dots may be upcast to f32 there, element-wise work
is counted), so flops and bytes are the CPU program's, used as a proxy for the accelerator's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

from benchmarks import common

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GLOBAL_BATCH = 512
# (devices, mesh name, (data, fsdp, tensor)); mesh name 'data' = pure data parallelism.
MESHES: dict[str, Any] = {
    'data': lambda n: (n, 1, 1),
    'fsdp': lambda n: (1, n, 1),
    'data_fsdp8': lambda n: (n // 8, 8, 1),
    'fsdp_tp4': lambda n: (1, n // 4, 4),
}
# (devices, meshes, modes): MDLM on every mesh kind at 8, 64 and 256 devices, HMDLM on every mesh
# at 8 (does the README's 8×A100 configuration fit?) and on pure data parallelism at 64 and 256
# (HMDLM's FSDP/tensor cells at 64 and 256 add ~6 minutes of compiling on 2 cores: `--modes=hmdlm
# --devices=64,256 --meshes=fsdp,fsdp_tp4`); MDLM on 16 (TPU v4-32). The whole plan compiles in
# < 10 min on 2 CPU cores (benchmarks/README.md).
PLAN = ((8, ('data', 'fsdp', 'fsdp_tp4'), ('mdlm', 'hmdlm')), (16, ('data',), ('mdlm',)),
        (64, ('data', 'fsdp', 'fsdp_tp4'), ('mdlm',)), (64, ('data',), ('hmdlm',)),
        (256, ('data', 'fsdp', 'fsdp_tp4'), ('mdlm',)), (256, ('data',), ('hmdlm',)))
MODES = ('mdlm', 'hmdlm')
# Published peak dense bf16 FLOP/s, HBM bytes/s, per-device interconnect bytes/s (one direction
# of the ring), HBM capacity. Sources in benchmarks/README.md ("AOT").
HARDWARE: dict[str, dict[str, float]] = {
    '8xA100-80GB': dict(devices=8, flops=312e12, hbm=2.039e12, link=300e9, mem=80e9),
    '8xH100-SXM': dict(devices=8, flops=989e12, hbm=3.35e12, link=450e9, mem=80e9),
    'TPUv4-32': dict(devices=16, flops=275e12, hbm=1.2e12, link=1.1e15 / 4096, mem=32 * 2**30),
    'TPUv5e-64': dict(devices=64, flops=197e12, hbm=819e9, link=51.2e12 / 256, mem=16e9),
    'TPUv5e-256': dict(devices=256, flops=197e12, hbm=819e9, link=51.2e12 / 256, mem=16e9),
}
_DTYPE_BYTES = {'f32': 4, 'bf16': 2, 'f16': 2, 's32': 4, 'u32': 4, 'pred': 1, 's8': 1, 'u8': 1,
                'f64': 8, 's64': 8, 'u64': 8, 's16': 2, 'u16': 2}
_COLL = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute')


# ----------------------------------------------------------------------------- HLO parsing


def _shape_bytes(text: str) -> int:
  """Bytes of an HLO result type: 'f32[768,3072]{1,0}' or a tuple '(f32[2]{0}, bf16[4,4])'."""
  total = 0
  for dt, dims in re.findall(r'\b([a-z]+\d*)\[([\d,]*)\]', text):
    if dt not in _DTYPE_BYTES:
      continue
    n = 1
    for d in (x for x in dims.split(',') if x):
      n *= int(d)
    total += n * _DTYPE_BYTES[dt]
  return total


def _group_size(line: str, num_devices: int) -> int:
  m = re.search(r'replica_groups=\[(\d+),(\d+)\]<=', line)  # iota form [groups, size]<=[...]
  if m:
    return int(m.group(2))
  m = re.search(r'replica_groups=\{\{([\d,]+)\}', line)
  if m:
    return len(m.group(1).split(','))
  m = re.search(r'source_target_pairs=', line)
  return 2 if m else num_devices


def parse_collectives(hlo: str, num_devices: int) -> dict[str, Any]:
  """Every collective of the compiled HLO: count, result bytes and ring bytes per device by op."""
  by_op: dict[str, dict[str, float]] = {}
  for line in hlo.splitlines():
    m = re.match(r'\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.+?)\s+(' + '|'.join(_COLL) +
                 r')(-start)?\(', line)
    if not m:
      continue
    op = m.group(2)
    out_bytes = _shape_bytes(m.group(1))
    if m.group(3):  # async start: result tuple holds (operand, output[, scratch]); take output
      parts = re.findall(r'[a-z]+\d*\[[\d,]*\]', m.group(1))
      out_bytes = _shape_bytes(parts[1]) if len(parts) > 1 else out_bytes
    n = max(_group_size(line, num_devices), 1)
    if op == 'all-reduce':
      ring = 2.0 * (n - 1) / n * out_bytes
    elif op == 'all-gather':
      ring = (n - 1) / n * out_bytes
    elif op == 'reduce-scatter':
      ring = (n - 1) * out_bytes  # input = n × output
    elif op == 'all-to-all':
      ring = (n - 1) / n * out_bytes
    else:
      ring = float(out_bytes)
    e = by_op.setdefault(op, {'count': 0, 'result_bytes': 0, 'ring_bytes_per_device': 0.0})
    e['count'] += 1
    e['result_bytes'] += out_bytes
    e['ring_bytes_per_device'] += ring
  return {'by_op': by_op,
          'ring_bytes_per_device': sum(e['ring_bytes_per_device'] for e in by_op.values()),
          'count': sum(e['count'] for e in by_op.values())}


# ----------------------------------------------------------------------------- child


def _compile_adapter(mode: str, mesh_shape: tuple[int, int, int]) -> tuple[Any, Any]:
  """THE one place that touches the package's training API (re-point it after a refactor).

  Returns (compiled executable, resolved config) of the real train step on abstract inputs.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import processes, tasks, train  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  data, fsdp, tensor = mesh_shape
  config = common.experiment('lm1b_mdlm.py' if mode == 'mdlm' else 'lm1b.py', [
      f'--config.data.batch_size={GLOBAL_BATCH}', f'--config.mesh.data={data}',
      f'--config.mesh.fsdp={fsdp}', f'--config.mesh.tensor={tensor}'])
  config = config_lib.resolve(config)
  train.validate_config(config)
  mesh = shd.make_mesh(config.mesh)
  model = tasks.build_model(config)
  process = processes.build(config)
  abstract, shardings = train.state_shardings(config, model, mesh)
  b, l = GLOBAL_BATCH, int(config.model.seq_len)
  bsh = shd.batch_sharding(mesh)
  batch = {'tokens': jax.ShapeDtypeStruct((b, l), jnp.int32, sharding=bsh),
           'levels': jax.ShapeDtypeStruct((b, l), jnp.int32, sharding=bsh),
           'given': jax.ShapeDtypeStruct((b, l), jnp.bool_, sharding=bsh),
           'loss_mask': jax.ShapeDtypeStruct((b, l), jnp.bool_, sharding=bsh)}
  faults = jax.ShapeDtypeStruct((train.MAX_FAULT_STEPS,), jnp.int32,
                                sharding=shd.replicated(mesh))
  step = train.make_train_step(config, model, process, mesh, shardings)
  with shd.mesh_context(mesh):
    lowered = step.jitted.lower(abstract, batch, faults)
  return lowered.compile(), config


def run_child(mode: str, mesh_name: str) -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import flops as flops_lib  # pylint: disable=g-import-not-at-top
  n = jax.device_count()
  mesh_shape = MESHES[mesh_name](n)
  t0 = time.perf_counter()
  compiled, config = _compile_adapter(mode, mesh_shape)
  compile_s = time.perf_counter() - t0
  ma = compiled.memory_analysis()
  mem = {k: int(getattr(ma, k)) for k in ('argument_size_in_bytes', 'output_size_in_bytes',
                                           'alias_size_in_bytes', 'temp_size_in_bytes')}
  mem['peak_bytes'] = (mem['argument_size_in_bytes'] + mem['output_size_in_bytes']
                       + mem['temp_size_in_bytes'] - mem['alias_size_in_bytes'])
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  hlo = compiled.as_text()
  coll = parse_collectives(hlo, n)
  model_flops = flops_lib.train_step_flops(config.model, GLOBAL_BATCH,
                                           int(config.model.seq_len)).train_step
  return {'mode': mode, 'mesh': mesh_name, 'devices': n,
          'mesh_shape': dict(zip(('data', 'fsdp', 'tensor'), mesh_shape)),
          'dtype': str(config.model.dtype), 'global_batch': GLOBAL_BATCH, 'compile_s': compile_s,
          'memory': mem, 'xla_flops_per_device': float(cost.get('flops', 0.0)),
          'xla_bytes_accessed_per_device': float(cost.get('bytes accessed', 0.0)),
          'model_flops_per_step': float(model_flops), 'collectives': coll}


# ----------------------------------------------------------------------------- parent


def roofline(rec: dict[str, Any], hw: dict[str, float]) -> dict[str, float]:
  t_c = rec['xla_flops_per_device'] / hw['flops']
  t_m = rec['xla_bytes_accessed_per_device'] / hw['hbm']
  t_n = rec['collectives']['ring_bytes_per_device'] / hw['link']
  step = max(t_c, t_m, t_n)
  step_cc = max(t_c, t_n)
  mfu = lambda t: rec['model_flops_per_step'] / (hw['devices'] * hw['flops'] * t)
  return {'t_compute_s': t_c, 't_memory_s': t_m, 't_comm_s': t_n, 'step_s': step,
          'step_no_overlap_s': t_c + t_m + t_n, 'mfu': mfu(step),
          # without the HBM term: XLA:CPU's 'bytes accessed' counts the CPU program's fusions
          # (and f32 upcasts of bf16 dots), which overstates an accelerator's HBM traffic.
          'step_compute_comm_s': step_cc, 'mfu_compute_comm': mfu(step_cc),
          'fits_memory': rec['memory']['peak_bytes'] <= hw['mem'],
          'tokens_per_s': GLOBAL_BATCH * 128 / step}


def spawn(devices: int, mode: str, mesh: str, timeout_s: float) -> dict[str, Any]:
  env = dict(os.environ)
  flags = [f for f in env.get('XLA_FLAGS', '').split() if 'device_count' not in f]
  # The CPU program is never run, so LLVM need not optimise it: the HLO, its buffer assignment and
  # cost analysis are the same without that work (benchmarks/README.md compares every record).
  env['XLA_FLAGS'] = ' '.join(flags + [f'--xla_force_host_platform_device_count={devices}',
                                       '--xla_backend_optimization_level=0'])
  env['JAX_PLATFORMS'] = 'cpu'
  env['PYTHONPATH'] = _REPO + os.pathsep + env.get('PYTHONPATH', '')
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  cmd = [sys.executable, '-m', 'benchmarks.aot', f'--child={mode}:{mesh}']
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=_REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
  except subprocess.TimeoutExpired:
    return {'mode': mode, 'mesh': mesh, 'devices': devices, 'error': f'timeout {timeout_s}s'}
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
  if proc.returncode != 0 or not lines:
    return {'mode': mode, 'mesh': mesh, 'devices': devices, 'error': f'exit {proc.returncode}',
            'log_tail': proc.stderr[-2000:]}
  rec = json.loads(lines[-1])
  rec['process_s'] = time.perf_counter() - t0
  return rec


def table(records: list[dict[str, Any]]) -> str:
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  rows = []
  for r in records:
    if 'error' in r:
      rows.append([r['devices'], r['mesh'], r['mode'], r['error']] + [None] * 7)
      continue
    c = r['collectives']
    ops = ', '.join(f"{k} {v['count']}×" for k, v in sorted(c['by_op'].items()))
    ms = r['mesh_shape']
    rows.append([r['devices'], f"{r['mesh']} ({ms['data']}·{ms['fsdp']}·{ms['tensor']})",
                 r['mode'], r['memory']['peak_bytes'] / 1e9,
                 r['memory']['argument_size_in_bytes'] / 1e9,
                 r['memory']['temp_size_in_bytes'] / 1e9, r['xla_flops_per_device'] / 1e12,
                 c['ring_bytes_per_device'] / 1e9, ops, r['compile_s'], r.get('process_s')])
  t1 = common.table('AOT compile: per-device memory, FLOPs, collectives (LM1B, global batch 512, '
                    'bf16)', ['N', 'mesh (data·fsdp·tensor)', 'mode', 'peak GB', 'args GB',
                              'temp GB', 'TFLOP/dev', 'comm GB/dev', 'collectives',
                              'compile s', 'process s'], rows)
  rows2 = []
  for r in records:
    if 'error' in r:
      continue
    for name, hw in HARDWARE.items():
      if hw['devices'] != r['devices']:
        continue
      e = r['roofline'][name]
      rows2.append([name, r['mesh'], r['mode'], e['t_compute_s'] * 1e3, e['t_memory_s'] * 1e3,
                    e['t_comm_s'] * 1e3, e['step_s'] * 1e3, e['mfu'], e['mfu_compute_comm'],
                    'yes' if e['fits_memory'] else 'NO', e['tokens_per_s']])
  t2 = common.table('Roofline ESTIMATE (not measured): step time and MFU', [
      'hardware', 'mesh', 'mode', 'compute ms', 'HBM ms (CPU count)', 'comm ms',
      'step ms (max of 3)', 'MFU', 'MFU (compute, comm only)', 'fits', 'tokens/s'], rows2)
  return t1 + '\n' + t2


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = common.Parser(prog='python -m benchmarks.aot', description=__doc__.split('\n\n')[0])
  p.add_argument('--devices', default=None, help='comma-separated device counts (default PLAN)')
  p.add_argument('--meshes', default=None, help=f'comma-separated subset of {sorted(MESHES)}')
  p.add_argument('--modes', default=None, help='comma-separated (default: PLAN\'s)')
  p.add_argument('--timeout_s', type=float, default=600)
  p.add_argument('--jobs', type=int, default=2, help='children compiling at once')
  common.add_output_flags(p, os.path.join(common.RESULTS, 'aot.json'))
  p.add_argument('--child', default=None, help=argparse.SUPPRESS)
  p.add_argument('--from_json', default=None,
                 help='rebuild the roofline and tables from a saved aot.json (no compiling)')
  a = p.parse_args(argv)
  if not a.child:
    common.check(p, a.timeout_s > 0, '--timeout_s', a.timeout_s, 'must be > 0')
    common.check(p, a.jobs > 0, '--jobs', a.jobs, 'must be > 0')
    common.check(p, not a.meshes or set(a.meshes.split(',')) <= set(MESHES), '--meshes',
                 a.meshes, f'a comma-separated subset of {",".join(sorted(MESHES))}')
    common.check(p, not a.modes or set(a.modes.split(',')) <= {'mdlm', 'hmdlm'}, '--modes',
                 a.modes, 'a comma-separated subset of mdlm,hmdlm')
    common.check(p, a.devices is None or all(d.isdigit() and int(d) > 0
                                             for d in a.devices.split(',')),
                 '--devices', a.devices, 'comma-separated device counts > 0')
    path = common.output_path(p, a, os.path.join(common.RESULTS, 'aot.json'))
  if a.from_json:
    with open(a.from_json, encoding='utf-8') as f:
      out = json.load(f)
    for rec in out['records']:
      if 'error' not in rec:
        rec['roofline'] = {k: roofline(rec, hw) for k, hw in HARDWARE.items()}
    out['table'] = table(out['records'])
    out['hardware'] = HARDWARE
    print(out['table'])
    with open(path, 'w', encoding='utf-8') as f:
      json.dump(out, f, indent=1)
    return out
  if a.child:
    mode, mesh = a.child.split(':')
    print(json.dumps(run_child(mode, mesh)), flush=True)
    return {}
  if a.devices:
    meshes = tuple(a.meshes.split(',')) if a.meshes else ('data', 'fsdp')
    plan = [(int(n), meshes, tuple((a.modes or 'mdlm,hmdlm').split(',')))
            for n in a.devices.split(',')]
  else:
    plan = [(n, tuple(m for m in ms if not a.meshes or m in a.meshes.split(',')),
             tuple(a.modes.split(',')) if a.modes else modes) for n, ms, modes in PLAN]
  t0 = time.perf_counter()
  cells = [(n, mode, mesh) for n, meshes, modes in plan for mesh in meshes for mode in modes]
  # Longest compiles first (more devices, FSDP, HMDLM's two passes): the jobs finish together.
  order = sorted(range(len(cells)), key=lambda i: (cells[i][0], cells[i][2] == 'fsdp',
                                                    cells[i][1] == 'hmdlm'), reverse=True)

  def one(cell: tuple[int, str, str]) -> dict[str, Any]:
    rec = spawn(*cell, a.timeout_s)
    if 'error' not in rec:
      rec['roofline'] = {k: roofline(rec, hw) for k, hw in HARDWARE.items()}
    print(json.dumps({k: rec.get(k) for k in ('devices', 'mesh', 'mode', 'compile_s', 'error')}),
          flush=True)
    return rec

  # XLA:CPU compiles on about one core, so `--jobs` children run at once (2 on 2 cores).
  with concurrent.futures.ThreadPoolExecutor(max_workers=max(a.jobs, 1)) as pool:
    done = dict(zip(order, pool.map(one, [cells[i] for i in order])))
  records = [done[i] for i in range(len(cells))]
  text = table(records)
  print(text)
  out = {'records': records, 'hardware': HARDWARE, 'table': text,
         'duration_s': time.perf_counter() - t0, 'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'),
         'command': ' '.join(['python -m benchmarks.aot'] + (argv or sys.argv[1:]))}
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(out, f, indent=1)
  print(f'wrote {path} in {out["duration_s"]:.0f}s')
  return out


if __name__ == '__main__':
  main()
