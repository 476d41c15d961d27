r"""The pod-scale path, proven by compilation: AOT-compile the LM1B train steps on fake CPU meshes,
or (`--platform=tpu`) the configs' train and sampler steps for named TPU topologies.

  python -m benchmarks.aot                       # default plan (see PLAN), < 10 min on 2 cores
  python -m benchmarks.aot --devices=64 --meshes=data,fsdp_tp4 --modes=mdlm,hmdlm
  python -m benchmarks.aot --platform=tpu --json=OUT.json      # TPU plan (see TPU section below)
  python -m benchmarks.aot --table [--update_results]          # results/aot_tpu.json as Markdown
  python -m benchmarks.aot --platform=tpu --set model.remat=block ...  # config overrides per cell

--platform=tpu compiles with libtpu's compile-only client (the `aot` extra; no TPU needed), one
process per cell, resumable: per-device peak HBM, compile time, XLA's flops / bytes accessed, a
roofline from published per-chip peaks (benchmarks/README.md, "TPU AOT").

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
  step = train.make_train_step(config, model, process, mesh, shardings)
  with shd.mesh_context(mesh):
    lowered = step.jitted.lower(abstract, batch)
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


# ----------------------------------------------------------------------------- TPU (compile-only)

# Published per-chip peak dense bf16 FLOP/s, HBM bandwidth (bytes/s) and HBM capacity (bytes);
# sources in benchmarks/README.md ("TPU AOT"). v4 is compiled in megacore mode, one device per chip
# as JAX runs it (jax.make_mesh refuses a v4 mesh of TensorCores).
TPU_CHIPS: dict[str, dict[str, float]] = {
    'v4': dict(flops=275e12, hbm=1.2e12, mem=32 * 2**30, devices_per_chip=1),
    'v5e': dict(flops=197e12, hbm=819e9, mem=16 * 2**30, devices_per_chip=1),
    'v5p': dict(flops=459e12, hbm=2.765e12, mem=95 * 2**30, devices_per_chip=1),
    'v6e': dict(flops=918e12, hbm=1.64e12, mem=32 * 2**30, devices_per_chip=1),
}
# A cell fits when its per-device peak leaves this share of the device's HBM free.
HEADROOM = 0.10
# The environment of every TPU child: the compile-only client on this host. JAX itself stays on
# the CPU, and libtpu must never look for a real TPU (no GCE metadata-server query).
TPU_ENV = {'JAX_PLATFORMS': 'cpu', 'TPU_SKIP_MDS_QUERY': '1', 'TPU_WORKER_HOSTNAMES': 'localhost',
           'TPU_ACCELERATOR_TYPE': 'v5litepod-4', 'ALLOW_MULTIPLE_LIBTPU_LOAD': '1',
           'TF_CPP_MIN_LOG_LEVEL': '2'}
TPU_CONFIGS = ('lm1b.py', 'lm1b_mdlm.py', 'hdlm_lm1b.py', 'multimdm_owt.py', 'adlm_lm1b.py',
               'sudoku_25m.py')
TPU_TOPOLOGIES_8 = ('v5e:2x4', 'v4:2x2x2', 'v5p:2x2x2', 'v6e:2x4')
TPU_TOPOLOGIES_256 = ('v5e:16x16', 'v5p:4x8x8')
TPU_RESULTS = os.path.join(common.RESULTS, 'aot_tpu.json')


def tpu_generation(topology: str) -> str:
  gen = topology.split(':')[0]
  if gen not in TPU_CHIPS or ':' not in topology:
    raise ValueError(f'topology {topology!r}: expected GEN:AxB[xC] with GEN in {sorted(TPU_CHIPS)}')
  return gen


def topology_devices(topology: str) -> int:
  """Devices of a topology name without libtpu: chips (the product of its dims) × devices/chip."""
  dims = topology.split(':')[1].split('x')
  n = 1
  for d in dims:
    n *= int(d)
  return n * int(TPU_CHIPS[tpu_generation(topology)]['devices_per_chip'])


def mesh_shape(mesh: str, n: int) -> tuple[int, int, int]:
  """A named mesh of MESHES over n devices, or an explicit 'data.fsdp.tensor' (e.g. '2.4.1')."""
  if mesh in MESHES:
    return tuple(MESHES[mesh](n))
  parts = tuple(int(x) for x in mesh.split('.'))
  if len(parts) != 3 or parts[0] * parts[1] * parts[2] != n:
    raise ValueError(f'mesh {mesh!r}: not one of {sorted(MESHES)} nor data.fsdp.tensor of {n}')
  return parts  # type: ignore[return-value]


def cell_id(c: dict[str, Any]) -> str:
  """The key of a cell in the results JSON (resume skips cells whose key is present)."""
  key = (f"{c['config']}|{c['step']}|{c['topology']}|{c['mesh']}|accum={c.get('grad_accum', 0)}"
         f"|batch={c.get('batch', 0)}")
  # --set overrides make another cell; the keys of cells without them stay as they were.
  return key + ''.join(f'|{o}' for o in c.get('overrides') or ())


def tpu_topology(topology: str) -> Any:
  """The compile-only devices of a named TPU topology (needs libtpu and TPU_ENV)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  kw = {}
  if topology_devices(topology) < 4:  # libtpu's default host bounds are 2x2x1 chips
    kw['chips_per_host_bounds'] = [int(x) for x in (topology.split(':')[1].split('x') + ['1'])[:3]]
  if tpu_generation(topology) == 'v4':
    kw['chip_config_name'] = 'megacore'  # one device per chip (MaxText's setting for v4)
  return topologies.get_topology_desc(platform='tpu', topology_name=topology, **kw)


def build_tpu_step(config_name: str, step: str, devices: list[Any], mesh: str,
                   grad_accum: int = 0, batch: int = 0,
                   sets: tuple[str, ...] = ()) -> tuple[Any, Any, dict[str, Any]]:
  """(lowered program, resolved config, facts) of a config's real train step or sampler program
  on abstract inputs over `devices`: built by the package's public builders
  (`train.make_train_step`, `evaluation.samples.sampler`), which must touch no device.

  grad_accum / batch: 0 keeps the config's train.grad_accum / batch size. sets: 'a.b=value'
  overrides of the config (`--set`), applied before the mesh, accumulation and batch.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import processes, resources, tasks, train  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  from hmdlm_jax.evaluation import compiled as compiled_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax.evaluation import samples  # pylint: disable=g-import-not-at-top
  data, fsdp, tensor = mesh_shape(mesh, len(devices))
  overrides = [f'--config.{o}' for o in sets] + [
      f'--config.mesh.data={data}', f'--config.mesh.fsdp={fsdp}', f'--config.mesh.tensor={tensor}']
  if grad_accum:
    overrides.append(f'--config.train.grad_accum={grad_accum}')
  if batch:
    overrides += [f'--config.data.batch_size={batch}', f'--config.data.eval_batch_size={batch}']
  config = config_lib.resolve(common.experiment(config_name, overrides))
  train.validate_config(config)
  jmesh = shd.make_mesh(config.mesh, devices=devices)
  model = tasks.build_model(config)
  process = processes.build(config)
  abstract, shardings = train.state_shardings(config, model, jmesh)
  seq_len = int(config.model.seq_len)
  rep = shd.replicated(jmesh)
  if step == 'train':
    b = int(config.data.batch_size)
    bsh = shd.batch_sharding(jmesh)
    dtypes = {**resources.BATCH_DTYPES, **process.extra_batch_keys}
    batch_sds = {k: jax.ShapeDtypeStruct((b, seq_len), d, sharding=bsh) for k, d in dtypes.items()}
    fn = train.make_train_step(config, model, process, jmesh, shardings)
    with shd.mesh_context(jmesh):
      lowered = fn.jitted.lower(abstract, batch_sds)
  else:
    # The evaluation's program: EMA parameters in the state's shardings, the key and any
    # conditioning replicated (a numpy input follows the parameters' devices), one batch of
    # data.eval_batch_size rows.
    b = int(config.data.eval_batch_size)
    cfg = config_lib.SampleConfig.from_config(config)
    run = samples.sampler(compiled_lib.flax_network(model).bind(abstract.ema_params), process,
                          cfg, batch_size=b, seq_len=seq_len)
    args = [jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep)]
    if str(config.model.position_embedding) == 'sudoku':  # Sudoku decodes given its clues
      args += [jax.ShapeDtypeStruct((b, seq_len), d, sharding=rep)
               for d in (jnp.int32, jnp.int32, jnp.bool_)]
    with shd.mesh_context(jmesh):
      lowered = run.func.lower(*run.args, *args)
  facts = {'mesh_shape': {'data': data, 'fsdp': fsdp, 'tensor': tensor}, 'batch': b,
           'seq_len': seq_len, 'grad_accum': int(config.train.grad_accum),
           'dtype': str(config.model.dtype), 'sample_steps': int(config.sample.num_steps)}
  return lowered, config, facts


def tpu_child(spec: dict[str, Any]) -> dict[str, Any]:
  """Compile one cell (run in its own process with TPU_ENV); the record without the roofline."""
  from benchmarks import flops as flops_lib  # pylint: disable=g-import-not-at-top
  topo = tpu_topology(spec['topology'])
  devices = list(topo.devices)
  t0 = time.perf_counter()
  lowered, config, facts = build_tpu_step(spec['config'], spec['step'], devices, spec['mesh'],
                                          int(spec.get('grad_accum', 0)),
                                          int(spec.get('batch', 0)),
                                          tuple(spec.get('overrides') or ()))
  lower_s = time.perf_counter() - t0
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0 - lower_s
  ma = compiled.memory_analysis()
  mem = {k: int(getattr(ma, k)) for k in ('argument_size_in_bytes', 'output_size_in_bytes',
                                           'alias_size_in_bytes', 'temp_size_in_bytes',
                                           'generated_code_size_in_bytes')}
  mem['peak_bytes'] = (mem['argument_size_in_bytes'] + mem['output_size_in_bytes']
                       + mem['temp_size_in_bytes'] - mem['alias_size_in_bytes'])
  cost = compiled.cost_analysis()
  cost = (cost[0] if cost else {}) if isinstance(cost, (list, tuple)) else (cost or {})
  m = config.model
  b, seq_len = facts['batch'], facts['seq_len']
  if spec['step'] == 'train':
    model_flops = flops_lib.train_step_flops(m, b, seq_len).train_step
  else:  # one denoising step: the network passes of the loss, forward only
    model_flops = sum(flops_lib.forward_flops(m, b, seq_len, p) for p in flops_lib.loss_passes(m))
  return {**spec, 'id': cell_id(spec), 'devices': len(devices),
          'device_kind': devices[0].device_kind, **facts, 'lower_s': lower_s,
          'compile_s': compile_s, 'memory': mem,
          'xla_flops_per_device': float(cost.get('flops', 0.0)),
          'xla_bytes_accessed_per_device': float(cost.get('bytes accessed', 0.0)),
          'xla_optimal_seconds': float(cost.get('optimal_seconds', 0.0)),
          'model_flops_per_step': float(model_flops),
          'collectives': parse_collectives(compiled.as_text(), len(devices))}


def tpu_roofline(rec: dict[str, Any]) -> dict[str, Any]:
  """Per-device roofline of a compiled TPU cell from the published per-chip peaks: a model of the
  step, not a measurement. t = max(flops / peak, bytes accessed / HBM bandwidth).

  None (no roofline) for a train step with train.grad_accum > 1: XLA's cost analysis counts the
  micro-batch loop's body once, so its flops and bytes are not the step's.
  """
  chip = TPU_CHIPS[tpu_generation(rec['topology'])]
  per = float(chip['devices_per_chip'])
  peak, hbm, mem = chip['flops'] / per, chip['hbm'] / per, chip['mem'] / per
  t_c = rec['xla_flops_per_device'] / peak
  t_m = rec['xla_bytes_accessed_per_device'] / hbm
  step = max(t_c, t_m)
  chips = rec['devices'] / per
  out = {'t_compute_s': t_c, 't_memory_s': t_m, 'step_s': step,
         'bound': 'compute' if t_c >= t_m else 'memory',
         'device_hbm_bytes': mem, 'peak_fraction': rec['memory']['peak_bytes'] / mem,
         'fits': rec['memory']['peak_bytes'] <= (1 - HEADROOM) * mem,
         'optimal_seconds': rec['xla_optimal_seconds'] if rec['xla_optimal_seconds'] > 0 else None}
  if rec.get('step') == 'train' and int(rec.get('grad_accum') or 1) > 1:
    out.update(t_compute_s=None, t_memory_s=None, step_s=None, bound='– (loop counted once)',
               optimal_seconds=None)
  elif step > 0:
    out['mfu'] = rec['model_flops_per_step'] / (rec['devices'] * peak * step)
    out['tokens_per_s_per_chip'] = rec['batch'] * rec['seq_len'] / step / chips
  return out


def spawn_tpu(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
  env = dict(os.environ, **TPU_ENV)
  env['PYTHONPATH'] = _REPO + os.pathsep + env.get('PYTHONPATH', '')
  cmd = [sys.executable, '-m', 'benchmarks.aot', '--tpu_child=' + json.dumps(spec)]
  t0 = time.perf_counter()
  base = {**spec, 'id': cell_id(spec)}
  try:
    proc = subprocess.run(cmd, cwd=_REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
  except subprocess.TimeoutExpired:
    return {**base, 'error': f'timeout {timeout_s:.0f}s'}
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
  if proc.returncode != 0 or not lines:
    # The TPU compiler refuses a program whose buffers exceed the chip's HBM: a result (the cell
    # does not fit), not a failure of the tool.
    oom = re.search(r'RESOURCE_EXHAUSTED: ([^\n]*)', proc.stderr)
    if oom:
      return {**base, 'error': 'does not fit: ' + oom.group(1)[:300], 'fits': False,
              'process_s': time.perf_counter() - t0}
    return {**base, 'error': f'exit {proc.returncode}', 'log_tail': proc.stderr[-2000:]}
  rec = json.loads(lines[-1])
  rec['process_s'] = time.perf_counter() - t0
  rec['roofline'] = tpu_roofline(rec)
  return rec


def tpu_plan(configs: list[str], topologies: list[str], steps: list[str], mesh: str,
             grad_accum: int, batch: int = 0,
             overrides: tuple[str, ...] = ()) -> list[dict[str, Any]]:
  """The cells, most valuable first: 8-chip v5e, then >= 256 chips, then the other 8-chip
  slices (the order `--topologies` gives within each group). `overrides` (`--set`): recorded
  in each cell (its 'overrides', its id and its table row)."""
  def rank(t: str) -> int:
    return 0 if t == 'v5e:2x4' else (1 if topology_devices(t) >= 256 else 2)
  cells = []
  for topo in sorted(topologies, key=rank):
    for cfg in configs:
      for st in steps:
        cells.append({'config': cfg, 'step': st, 'topology': topo, 'mesh': mesh,
                      'grad_accum': grad_accum, 'batch': batch, 'overrides': list(overrides)})
  return cells


def load_results(path: str) -> dict[str, Any]:
  if os.path.exists(path):
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  return {'records': []}


def save_results(path: str, out: dict[str, Any]) -> None:
  out['records'].sort(key=lambda r: r['id'])
  for r in out['records']:
    if 'error' not in r:
      r['roofline'] = tpu_roofline(r)
  out['hardware'] = TPU_CHIPS
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(out, f, indent=1, sort_keys=True)
    f.write('\n')
  os.replace(tmp, path)


def run_tpu_cells(cells: list[dict[str, Any]], path: str, timeout_s: float,
                  retry_errors: bool = False) -> dict[str, Any]:
  """Compile every cell not yet in `path` (one child at a time), saving after each. The file is
  read again before each cell and each save merges into it, so `--table` or another run may use
  it meanwhile."""
  out = load_results(path)
  for spec in cells:
    key = cell_id(spec)
    have = [r for r in load_results(path)['records'] if r['id'] == key]
    if have and not (retry_errors and 'error' in have[0]):
      print(f'skip {key} (in {path})', flush=True)
      continue
    rec = spawn_tpu(spec, timeout_s)
    out = load_results(path)
    out['records'] = [r for r in out['records'] if r['id'] != key] + [rec]
    save_results(path, out)
    brief = {k: rec.get(k) for k in ('compile_s', 'error')}
    if 'roofline' in rec:
      brief.update(peak_gb=rec['memory']['peak_bytes'] / 1e9, fits=rec['roofline']['fits'])
    print(key, json.dumps(brief), flush=True)
  return out


PAGE = os.path.join('docs', 'results', 'performance.md')
TABLE_BEGIN = '<!-- aot_tpu table: generated by `python -m benchmarks.aot --table`; do not edit -->'
TABLE_END = '<!-- end aot_tpu table -->'


def _fmt(x: float | None, digits: int = 3) -> str:
  return '–' if x is None else f'{x:.{digits}g}'


def config_label(r: dict[str, Any]) -> str:
  """A row's config as compiled: the file, then its `--set` overrides (e.g. model.remat=block)."""
  sets = r.get('overrides') or ()
  return r['config'] + (f" ({', '.join(sets)})" if sets else '')


def _chosen(ok: list[dict[str, Any]]) -> set[str]:
  """The recorded choice per (config, step, topology): the config's own mesh and accumulation
  when they fit, else the fitting row with the shortest roofline step."""
  groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
  for r in ok:
    if r.get('batch_search') is None and r['roofline']['fits']:
      groups.setdefault((r['config'], r['step'], r['topology']), []).append(r)
  out = set()
  for rows in groups.values():
    own = [r for r in rows if r['mesh'] == 'data' and r['id'].endswith('|accum=0|batch=0')]
    out.add((own or sorted(rows, key=lambda r: (r['roofline']['step_s'] is None,
                                                 r['roofline']['step_s'] or 0.0)))[0]['id'])
  return out


def tpu_table(out: dict[str, Any]) -> str:
  """The Markdown of the results JSON (docs/results/performance.md, between the markers)."""
  for r in out['records']:  # from the raw counts: the model may have changed since the compile
    if 'error' not in r:
      r['roofline'] = tpu_roofline(r)
  recs = [r for r in out['records'] if r.get('batch_search') is None]
  ok = [r for r in recs if 'error' not in r]
  lines = ['| config | step | topology (devices) | mesh d·f·t | accum | batch | peak GB / HBM GB '
           '| fits (≤ 90%) | compile s | XLA TFLOP/dev | XLA GB/dev | roofline ms | bound '
           '| optimal_seconds ms | tokens/s/chip | MFU |',
           '|' + '---|' * 16]
  chosen = _chosen(ok)
  for r in ok:
    rf, ms = r['roofline'], r['mesh_shape']
    opt = rf['optimal_seconds']
    lines.append(
        f"| {config_label(r)} | {r['step']} | {r['topology']} ({r['devices']}) "
        f"| {ms['data']}·{ms['fsdp']}·{ms['tensor']} | {r['grad_accum']} | {r['batch']} "
        f"| {r['memory']['peak_bytes'] / 1e9:.2f} / {rf['device_hbm_bytes'] / 1e9:.2f} "
        f"| {('**yes**' if r['id'] in chosen else 'yes') if rf['fits'] else 'NO'} "
        f"| {r['compile_s']:.0f} "
        f"| {_fmt(r['xla_flops_per_device'] / 1e12)} "
        f"| {_fmt(r['xla_bytes_accessed_per_device'] / 1e9)} "
        f"| {_fmt(None if rf['step_s'] is None else rf['step_s'] * 1e3)} "
        f"| {rf['bound']} | {_fmt(None if opt is None else opt * 1e3)} "
        f"| {_fmt(rf.get('tokens_per_s_per_chip'))} | {_fmt(rf.get('mfu'), 2)} |")
  # HMDLM against MDLM: the same step, topology and mesh.
  by = {(r['config'], r['step'], r['topology'], r['mesh'], r['grad_accum'],
         tuple(r.get('overrides') or ())): r for r in ok}
  cmp_lines = []
  for (cfg, st, topo, mesh, acc, sets), h in sorted(by.items()):
    m = by.get(('lm1b_mdlm.py', st, topo, mesh, acc, sets)) if cfg == 'lm1b.py' else None
    if m:
      hs, ms_ = h['roofline']['step_s'], m['roofline']['step_s']
      cmp_lines.append(
          f"| {st} | {topo} | {mesh} | {h['memory']['peak_bytes'] / m['memory']['peak_bytes']:.2f} "
          f"| {h['xla_flops_per_device'] / m['xla_flops_per_device']:.2f} "
          f"| {_fmt(hs / ms_ if hs and ms_ else None)} |")
  if cmp_lines:
    lines += ['', 'HMDLM (configs/lm1b.py) over MDLM (configs/lm1b_mdlm.py), same step, topology, '
              'mesh:', '',
              '| step | topology | mesh | peak memory × | XLA FLOPs × | roofline step × |',
              '|---|---|---|---|---|---|'] + cmp_lines
  probes: dict[tuple[str, str], list[dict[str, Any]]] = {}
  for r in out['records']:
    if r.get('batch_search') is not None:
      probes.setdefault((r['config'], r['topology']), []).append(r)
  if probes:
    lines += ['', 'Largest global batch whose train step fits the slice with 10% of HBM free '
              '(`--max_batch`: every probe a full compile; "searching" while the bracket is '
              'still wider than an eighth of the batch):', '',
              '| config | topology | largest fitting batch | peak GB / HBM GB '
              '| smallest batch that does not fit | probes | search |',
              '|---|---|---|---|---|---|---|']
    for (cfg, topo), rows in sorted(probes.items()):
      good = [r for r in rows if 'error' not in r and r['roofline']['fits']]
      best = max(good, key=lambda r: r['batch']) if good else None
      above = [r['batch'] for r in rows if r not in good and (best is None or
                                                               r['batch'] > best['batch'])]
      done = any('largest_fitting' in r['batch_search'] for r in rows)
      peak = ('–' if best is None else f"{best['memory']['peak_bytes'] / 1e9:.2f} / "
              f"{best['roofline']['device_hbm_bytes'] / 1e9:.2f}")
      lines.append(f"| {cfg} | {topo} | {best['batch'] if best else 'none'} | {peak} "
                   f"| {min(above) if above else '–'} | {len(rows)} "
                   f"| {'done' if done else 'searching'} |")
  bad = [r for r in recs if 'error' in r and r.get('fits') is not False]
  refused = [r for r in recs if 'error' in r and r.get('fits') is False]
  have = {r['id'] for r in out['records']}
  missing: dict[str, list[str]] = {}
  for c in default_tpu_cells(['train', 'sample'], 'data', 0):
    if cell_id(c) not in have:
      missing.setdefault(c['topology'], []).append(f"{c['config']} {c['step']}")
  lines += ['', 'Cells the TPU compiler refuses for want of HBM (they do not fit): ' + (
      'none' if not refused else '; '.join(f"{r['id']} ({r['error'][len('does not fit: '):]})"
                                           for r in refused)) + '.']
  lines += ['', 'Failed cells: ' + ('none' if not bad else '; '.join(
      f"{r['id']} ({r['error']})" for r in bad)) + '.',
            'Missing cells (planned, not compiled yet): ' + ('none' if not missing else '; '.join(
                f"{t}: {', '.join(v)}" for t, v in missing.items())) + '.']
  return '\n'.join(lines) + '\n'


def page_with_table(page: str, table_md: str) -> str:
  """`page` with the text between TABLE_BEGIN and TABLE_END replaced by `table_md`."""
  i, j = page.find(TABLE_BEGIN), page.find(TABLE_END)
  if i < 0 or j < i:
    raise ValueError(f'{PAGE}: the markers {TABLE_BEGIN!r} ... {TABLE_END!r} are missing')
  return page[:i + len(TABLE_BEGIN)] + '\n' + table_md + page[j:]


def default_tpu_cells(steps: list[str], mesh: str, grad_accum: int,
                      overrides: tuple[str, ...] = ()) -> list[dict[str, Any]]:
  """The published table: every config's steps on the 8-chip slices, and the LM1B HMDLM / MDLM
  and OpenWebText train steps on >= 256 chips of v5e and v5p."""
  cells = tpu_plan(list(TPU_CONFIGS), ['v5e:2x4'], steps, mesh, grad_accum, 0, overrides)
  cells += tpu_plan(['lm1b.py', 'lm1b_mdlm.py', 'multimdm_owt.py'], list(TPU_TOPOLOGIES_256),
                    [s for s in steps if s == 'train'], mesh, grad_accum, 0, overrides)
  cells += tpu_plan(list(TPU_CONFIGS), [t for t in TPU_TOPOLOGIES_8 if t != 'v5e:2x4'], steps,
                    mesh, grad_accum, 0, overrides)
  return cells


def bisect_batch(config: str, topology: str, path: str, timeout_s: float,
                 lo: int = 0, hi: int = 0) -> dict[str, Any]:
  """The largest train batch of `config` that fits `topology` (every probe is a cell of the
  JSON, so an interrupted search resumes): from 64 rows per device, doubling up (or halving
  down) to a bracket, then halving the gap until it is at most an eighth of the batch (each
  probe is a full compile, minutes on 2 cores), in multiples of the device count."""
  n = topology_devices(topology)

  def fits(b: int) -> bool:
    spec = {'config': config, 'step': 'train', 'topology': topology, 'mesh': 'data',
            'grad_accum': 1, 'batch': b, 'batch_search': {}}
    out = run_tpu_cells([spec], path, timeout_s)
    rec = next(r for r in out['records'] if r['id'] == cell_id(spec))
    return 'error' not in rec and rec['roofline']['fits']

  lo = lo or 64 * n  # largest known to fit (0: none yet)
  while lo and not fits(lo):
    lo, hi = (lo // 2 // n * n), lo
  while lo and not hi:
    if fits(2 * lo):
      lo *= 2
    else:
      hi = 2 * lo
  while lo and hi - lo > max(n, lo // 8):
    mid = (lo + hi) // 2 // n * n
    if fits(mid):
      lo = mid
    else:
      hi = mid
  out = load_results(path)
  for r in out['records']:
    if r.get('batch_search') is not None and r['config'] == config and r['topology'] == topology:
      r['batch_search'] = ({'largest_fitting': lo, 'smallest_failing': hi}
                           if r['batch'] == lo else {'probe': True})
  save_results(path, out)
  return {'config': config, 'topology': topology, 'largest_fitting': lo, 'smallest_failing': hi}


def tpu_main(p: argparse.ArgumentParser, a: argparse.Namespace) -> dict[str, Any]:
  """--platform=tpu (compile cells into the results JSON) and --table (render it)."""
  steps = a.steps.split(',')
  common.check(p, a.timeout_s > 0, '--timeout_s', a.timeout_s, 'must be > 0')
  common.check(p, set(steps) <= {'train', 'sample'} and bool(steps), '--steps', a.steps,
               'a comma-separated subset of train,sample')
  common.check(p, a.grad_accum >= 0, '--grad_accum', a.grad_accum, 'must be >= 0')
  common.check(p, a.batch >= 0, '--batch', a.batch, 'must be >= 0')
  sets = tuple(a.set or ())
  for o in sets:
    common.check(p, re.fullmatch(r'[a-z_]\w*(\.\w+)+=\S+', o) is not None, '--set', o,
                 'a config override SECTION.FIELD=VALUE (e.g. model.remat=block)')
  topos = a.topologies.split(',') if a.topologies else []
  for t in topos:
    try:
      topology_devices(t)
    except ValueError as e:
      common.check(p, False, '--topologies', a.topologies, str(e))
  for t in topos:
    try:
      mesh_shape(a.mesh, topology_devices(t))
    except ValueError as e:
      common.check(p, False, '--mesh', a.mesh, str(e))
  configs = a.configs.split(',') if a.configs else list(TPU_CONFIGS)
  for c in configs + ([a.max_batch] if a.max_batch else []):
    common.check(p, os.path.exists(os.path.join(_REPO, 'configs', c.split(':')[0])),
                 '--configs' if c != a.max_batch else '--max_batch', c, 'no such file in configs/')
  if a.table:
    path = a.json or os.path.join(_REPO, TPU_RESULTS)
    out = load_results(path)
    text = tpu_table(out)
    print(text, end='')
    if a.update_results:
      page_path = os.path.join(_REPO, PAGE)
      with open(page_path, encoding='utf-8') as f:
        page = f.read()
      with open(page_path, 'w', encoding='utf-8') as f:
        f.write(page_with_table(page, text))
    return out
  path = common.output_path(p, a, TPU_RESULTS)
  if a.max_batch:
    res = bisect_batch(a.max_batch, topos[0] if topos else 'v5e:1x1', path, a.timeout_s)
    print(json.dumps(res))
    return res
  if a.configs or a.topologies:
    cells = tpu_plan(configs, topos or list(TPU_TOPOLOGIES_8), steps, a.mesh, a.grad_accum,
                     a.batch, sets)
  else:
    cells = default_tpu_cells(steps, a.mesh, a.grad_accum, sets)
  out = run_tpu_cells(cells, path, a.timeout_s, a.retry_errors)
  return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = common.Parser(prog='python -m benchmarks.aot', description=__doc__.split('\n\n')[0])
  p.add_argument('--devices', default=None, help='comma-separated device counts (default PLAN)')
  p.add_argument('--meshes', default=None, help=f'comma-separated subset of {sorted(MESHES)}')
  p.add_argument('--modes', default=None, help='comma-separated (default: PLAN\'s)')
  p.add_argument('--timeout_s', type=float, default=600)
  p.add_argument('--jobs', type=int, default=2, help='children compiling at once')
  common.add_output_flags(p, os.path.join(common.RESULTS, 'aot.json'))
  p.add_argument('--child', default=None, help=argparse.SUPPRESS)
  p.add_argument('--tpu_child', default=None, help=argparse.SUPPRESS)
  p.add_argument('--platform', default='cpu', choices=('cpu', 'tpu'),
                 help='cpu: fake CPU meshes (PLAN); tpu: named TPU topologies through the '
                 'compile-only client (needs the `aot` extra: libtpu)')
  p.add_argument('--configs', default=None,
                 help=f'tpu: comma-separated configs/ files (default {",".join(TPU_CONFIGS)})')
  p.add_argument('--topologies', default=None,
                 help='tpu: comma-separated topologies GEN:AxB[xC] (default the 8-chip slices '
                 f'{",".join(TPU_TOPOLOGIES_8)})')
  p.add_argument('--steps', default='train,sample', help='tpu: train,sample or one of them')
  p.add_argument('--mesh', default='data',
                 help=f'tpu: one of {sorted(MESHES)} or data.fsdp.tensor (e.g. 1.8.1)')
  p.add_argument('--grad_accum', type=int, default=0,
                 help='tpu: train.grad_accum of every cell (0: the config\'s)')
  p.add_argument('--batch', type=int, default=0,
                 help='tpu: global batch of every cell (data.batch_size and data.eval_batch_size; '
                 '0: the config\'s)')
  p.add_argument('--set', action='append', default=None, metavar='SECTION.FIELD=VALUE',
                 help='tpu: a config override of every cell (repeatable), applied before '
                 '--mesh/--grad_accum/--batch and recorded in the cell (e.g. model.remat=block)')
  p.add_argument('--retry_errors', action='store_true', help='tpu: recompile cells that failed')
  p.add_argument('--max_batch', default=None, metavar='CONFIG',
                 help='tpu: bisect the largest global batch (a power of two) of CONFIG whose '
                 'train step fits the first of --topologies with the headroom')
  p.add_argument('--table', action='store_true',
                 help='tpu: print the Markdown table of the results JSON (no compiling); with '
                 '--update_results also rewrite it into docs/results/performance.md')
  p.add_argument('--from_json', default=None,
                 help='rebuild the roofline and tables from a saved aot.json (no compiling)')
  a = p.parse_args(argv)
  if a.tpu_child:
    print(json.dumps(tpu_child(json.loads(a.tpu_child))), flush=True)
    return {}
  if a.platform == 'tpu' or a.table:
    return tpu_main(p, a)
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
