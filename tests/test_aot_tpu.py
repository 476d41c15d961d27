"""TPU compilation on a host without a TPU (benchmarks/aot.py, `--platform=tpu`).

libtpu's compile-only client compiles for a named TPU topology; the package's public builders
(`train.make_train_step`, `evaluation.samples.sampler`) must build their programs without touching
a device, or they cannot be compiled this way. These tests FAIL (never skip) when that breaks or
when libtpu is missing (it is in the test lock, requirements-test.txt). The environment that keeps
JAX on the CPU and libtpu off the GCE metadata server is set in tests/conftest.py.
"""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import aot
from benchmarks import flops as flops_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The compile-only client in this process: the background `benchmarks.aot --platform=tpu` run
# may hold libtpu's lock file at the same time.
os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
os.environ.setdefault('TPU_ACCELERATOR_TYPE', 'v5litepod-4')


@pytest.fixture(scope='module')
def tiny_cells() -> dict[str, dict]:
  """configs/tiny_test.py's train step and sampler program compiled for a 4-chip v5e slice."""
  out = {}
  for step in ('train', 'sample'):
    rec = aot.tpu_child({'config': 'tiny_test.py', 'step': step, 'topology': 'v5e:2x2',
                         'mesh': 'data'})
    rec['roofline'] = aot.tpu_roofline(rec)
    out[step] = rec
  return out


def test_the_train_step_is_built_without_a_device():
  """make_train_step itself (not only its `.jitted`) builds under the compile-only client, which
  refuses any transfer ('MakeArraysFromHostBufferShards not available with compile-only
  client'): building the step transfers nothing (fault injection wraps the process's loss,
  hmdlm_jax/faults.py, instead of passing an array)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  topo = aot.tpu_topology('v5e:2x2')
  lowered, _, facts = aot.build_tpu_step('tiny_test.py', 'train', list(topo.devices), 'data')
  assert facts['mesh_shape'] == {'data': 4, 'fsdp': 1, 'tensor': 1}
  assert 'mhlo.num_partitions = 4' in lowered.as_text()
  # The transfer the builder used to make while building is what the client refuses.
  mesh = jax.sharding.Mesh(np.array(topo.devices), ('d',))
  with pytest.raises(Exception, match='compile-only'):
    jax.device_put(np.full((4,), -1, np.int32), NamedSharding(mesh, P()))


@pytest.mark.parametrize('step', ['train', 'sample'])
def test_tiny_steps_compile_for_a_v5e_slice(tiny_cells, step):
  rec = tiny_cells[step]
  assert rec['devices'] == 4 and rec['device_kind'].startswith('TPU v5')
  mem, rf = rec['memory'], rec['roofline']
  assert 0 < mem['peak_bytes'] < rf['device_hbm_bytes'] and rf['fits']
  assert mem['argument_size_in_bytes'] > 0 and mem['temp_size_in_bytes'] > 0
  if step == 'train':  # the state is donated: its buffers alias the output's
    assert mem['alias_size_in_bytes'] > 0
  # XLA's count holds element-wise work too, so it lies above the matmul-only model count per
  # device, by less than half of it at this size (an independent count, benchmarks/flops.py).
  per_device = rec['model_flops_per_step'] / rec['devices']
  assert 1.0 <= rec['xla_flops_per_device'] / per_device < 1.5, (rec['xla_flops_per_device'],
                                                                  per_device)
  assert rec['xla_bytes_accessed_per_device'] > 0
  assert rf['step_s'] > 0 and 0 < rf['mfu'] < 1


def test_the_model_flops_are_the_configs_count(tiny_cells):
  from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(common.experiment('tiny_test.py'))
  b, l = int(config.data.batch_size), int(config.model.seq_len)
  assert tiny_cells['train']['model_flops_per_step'] == flops_lib.train_step_flops(
      config.model, b, l).train_step
  assert tiny_cells['sample']['model_flops_per_step'] == sum(
      flops_lib.forward_flops(config.model, int(config.data.eval_batch_size), l, p)
      for p in flops_lib.loss_passes(config.model))


def test_the_roofline_is_the_hand_computation():
  """t = max(flops / peak, bytes / HBM bandwidth) per device from the published per-chip peaks;
  a v4 device is a whole chip (megacore); a non-positive optimal_seconds is dropped."""
  rec = {'topology': 'v5e:2x4', 'devices': 8, 'batch': 512, 'seq_len': 128,
         'xla_flops_per_device': 1.97e12, 'xla_bytes_accessed_per_device': 16.38e9,
         'xla_optimal_seconds': -3.0, 'model_flops_per_step': 8 * 0.5 * 1.97e12,
         'memory': {'peak_bytes': 8 * 2**30}}
  rf = aot.tpu_roofline(rec)
  assert rf['t_compute_s'] == pytest.approx(0.010)  # 1.97e12 / 197e12
  assert rf['t_memory_s'] == pytest.approx(0.020)  # 16.38e9 / 819e9
  assert rf['step_s'] == pytest.approx(0.020) and rf['bound'] == 'memory'
  assert rf['mfu'] == pytest.approx(0.25)  # half the XLA count is model FLOPs, at half the peak
  assert rf['tokens_per_s_per_chip'] == pytest.approx(512 * 128 / 0.020 / 8)
  assert rf['optimal_seconds'] is None
  assert rf['peak_fraction'] == pytest.approx(0.5) and rf['fits']
  rec.update(topology='v4:2x2x2', devices=8, xla_optimal_seconds=0.5,
             memory={'peak_bytes': 30 * 2**30})
  rf = aot.tpu_roofline(rec)
  assert rf['t_compute_s'] == pytest.approx(1.97e12 / 275e12)
  assert rf['t_memory_s'] == pytest.approx(16.38e9 / 1.2e12)
  assert rf['device_hbm_bytes'] == 32 * 2**30 and not rf['fits']  # 30 of 32 GiB: < 10% free
  assert rf['optimal_seconds'] == 0.5
  assert rf['tokens_per_s_per_chip'] == pytest.approx(512 * 128 / rf['step_s'] / 8)
  # XLA counts a micro-batch loop's body once: no roofline for train.grad_accum > 1
  rec.update(step='train', grad_accum=4)
  rf = aot.tpu_roofline(rec)
  assert rf['step_s'] is None and 'mfu' not in rf and rf['device_hbm_bytes'] == 32 * 2**30


def test_topology_names_and_meshes():
  assert aot.topology_devices('v5e:16x16') == 256 and aot.topology_devices('v5p:4x8x8') == 256
  assert aot.topology_devices('v4:2x2x2') == 8  # megacore: one device per chip
  assert aot.mesh_shape('data', 8) == (8, 1, 1) and aot.mesh_shape('1.2.4', 8) == (1, 2, 4)
  with pytest.raises(ValueError):
    aot.mesh_shape('2.2.1', 8)
  with pytest.raises(ValueError):
    aot.topology_devices('v9:2x2')


@pytest.mark.parametrize('flags, flag', [
    (['--topologies=v9:2x2'], '--topologies=v9:2x2'),
    (['--steps=train,eval'], '--steps=train,eval'),
    (['--topologies=v5e:2x4', '--mesh=3.1.1'], '--mesh=3.1.1'),
    (['--configs=nope.py'], '--configs=nope.py'),
])
def test_bad_tpu_flags_are_one_error_line(capsys, flags, flag):
  with pytest.raises(SystemExit) as e:
    aot.main(['--platform=tpu', *flags])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f'python -m benchmarks.aot: error: {flag}'), err


def test_the_page_is_generated_from_the_committed_json():
  """docs/results/performance.md's TPU table is `python -m benchmarks.aot --table` of
  benchmarks/results/aot_tpu.json (regenerate with `--table --update_results`)."""
  with open(os.path.join(REPO, aot.TPU_RESULTS), encoding='utf-8') as f:
    out = json.load(f)
  with open(os.path.join(REPO, aot.PAGE), encoding='utf-8') as f:
    page = f.read()
  assert aot.page_with_table(page, aot.tpu_table(out)) == page


@pytest.mark.slow
def test_the_lm1b_mdlm_step_compiles_for_eight_v5e_chips():
  """The paper's LM1B MDLM step (global batch 512, bf16) fits a v5e-8 slice with data
  parallelism (minutes of compiling on 2 cores: nightly)."""
  rec = aot.tpu_child({'config': 'lm1b_mdlm.py', 'step': 'train', 'topology': 'v5e:2x4',
                       'mesh': 'data'})
  rf = aot.tpu_roofline(rec)
  assert rec['batch'] == 512 and rec['dtype'] == 'bfloat16'
  assert rf['fits'], rec['memory']
  per_device = rec['model_flops_per_step'] / rec['devices']
  assert 1.0 <= rec['xla_flops_per_device'] / per_device < 1.5


def test_the_table_marks_the_choice_and_lists_refused_and_missing_cells():
  def row(mesh: str, accum: int, peak_gib: float, flops: float) -> dict:
    spec = {'config': 'lm1b.py', 'step': 'train', 'topology': 'v5e:2x4', 'mesh': mesh,
            'grad_accum': accum, 'batch': 0}
    rec = {**spec, 'id': aot.cell_id(spec), 'devices': 8, 'batch': 512, 'seq_len': 128,
           'mesh_shape': dict(zip(('data', 'fsdp', 'tensor'), aot.mesh_shape(mesh, 8))),
           'compile_s': 1.0, 'xla_flops_per_device': flops, 'xla_bytes_accessed_per_device': 1e9,
           'xla_optimal_seconds': -1.0, 'model_flops_per_step': flops,
           'memory': {'peak_bytes': int(peak_gib * 2**30)}}
    rec['grad_accum'] = max(accum, 1)
    rec['roofline'] = aot.tpu_roofline(rec)
    return rec
  refused = {'config': 'multimdm_owt.py', 'step': 'sample', 'topology': 'v5e:2x4', 'mesh': 'data',
             'grad_accum': 0, 'batch': 0}
  refused.update(id=aot.cell_id(refused), fits=False,
                 error='does not fit: Ran out of memory on HBM')
  out = {'records': [row('data', 0, 15.0, 2e12), row('fsdp', 0, 9.0, 1.5e12),
                     row('data', 4, 8.0, 2e12), refused]}
  text = aot.tpu_table(out)
  lines = [ln for ln in text.splitlines() if ln.startswith('| lm1b.py')]
  # the config's own mesh does not fit (15 of 16 GiB); of the two that do, the shorter step
  assert [('**yes**' in ln, '| NO |' in ln) for ln in lines] == [
      (False, True), (True, False), (False, False)], lines
  assert 'Ran out of memory on HBM' in text and 'Failed cells: none.' in text
  missing = text.split('Missing cells')[1]
  assert 'v5e:2x4: lm1b.py sample, lm1b_mdlm.py train' in missing
  assert 'multimdm_owt.py sample' not in missing.split(';')[0]
