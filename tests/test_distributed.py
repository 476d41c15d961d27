"""Meshes, shardings and multi-process training (hmdlm_jax/sharding.py).

The 8-device run uses XLA's fake CPU devices (the device count is fixed when JAX starts, so it runs
in a subprocess, through launch/local_fake_devices.sh); the two-process run starts two JAX
processes that meet through jax.distributed.initialize on localhost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

from tests.conftest import (REPO, main_cmd, read_jsonl, subprocess_env, train_losses)

from hmdlm_jax import sharding as shd


def _mesh_cfg(data: int, fsdp: int, tensor: int) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(data=data, fsdp=fsdp, tensor=tensor))


def test_resolve_mesh_shape():
  assert shd.resolve_mesh_shape(_mesh_cfg(-1, 1, 1), 8) == (8, 1, 1)
  assert shd.resolve_mesh_shape(_mesh_cfg(4, -1, 1), 8) == (4, 2, 1)
  assert shd.resolve_mesh_shape(_mesh_cfg(2, 2, 2), 8) == (2, 2, 2)
  with pytest.raises(ValueError, match=r'mesh.data=3, mesh.fsdp=1, mesh.tensor=1 multiply to 3 '
                     r'but there are 8 devices'):
    shd.resolve_mesh_shape(_mesh_cfg(3, 1, 1), 8)
  with pytest.raises(ValueError, match='does not divide the 8 available devices'):
    shd.resolve_mesh_shape(_mesh_cfg(-1, 3, 1), 8)
  with pytest.raises(ValueError, match='At most one mesh axis may be -1'):
    shd.resolve_mesh_shape(_mesh_cfg(-1, -1, 1), 8)
  with pytest.raises(ValueError, match='positive or -1'):
    shd.resolve_mesh_shape(_mesh_cfg(0, 1, 1), 8)


def test_shardings_like_params_follow_param_paths():
  mesh = shd.make_mesh(_mesh_cfg(-1, 1, 1), jax.devices()[:1])
  params = {'a': {'kernel': jax.ShapeDtypeStruct((4, 6), np.float32)},
            'b': jax.ShapeDtypeStruct((6,), np.float32)}
  specs = {'a': {'kernel': jax.sharding.PartitionSpec('embed', 'mlp')},
           'b': jax.sharding.PartitionSpec('mlp')}
  p_sh = shd.param_shardings(specs, params, mesh,
                             rules=(('embed', 'fsdp'), ('mlp', 'tensor')))
  assert p_sh['a']['kernel'].spec == jax.sharding.PartitionSpec('fsdp', 'tensor')
  opt = ({'count': jax.ShapeDtypeStruct((), np.int32),
          'mu': params, 'nu': {'a': {'kernel': jax.ShapeDtypeStruct((4, 6), np.float32)},
                               'b': jax.ShapeDtypeStruct((7,), np.float32)}},)
  o_sh = shd.shardings_like_params(opt, p_sh, params, mesh)
  assert o_sh[0]['mu']['a']['kernel'] == p_sh['a']['kernel']
  assert o_sh[0]['nu']['a']['kernel'] == p_sh['a']['kernel']
  assert o_sh[0]['mu']['b'] == p_sh['b']
  # Same path but another shape, and scalars: replicated.
  assert o_sh[0]['nu']['b'].spec == jax.sharding.PartitionSpec()
  assert o_sh[0]['count'].spec == jax.sharding.PartitionSpec()


def test_mesh_context_sets_mesh_and_logical_rules():
  mesh = shd.make_mesh(_mesh_cfg(-1, 1, 1), jax.devices()[:1])
  with shd.mesh_context(mesh) as m:
    assert m is mesh
    assert tuple(nn.get_logical_axis_rules()) == shd.LOGICAL_RULES
    assert dict(jax.sharding.get_abstract_mesh().shape) == dict(mesh.shape)
  assert not nn.get_logical_axis_rules()


def test_make_global_batch_single_process():
  mesh = shd.make_mesh(_mesh_cfg(-1, 1, 1), jax.devices()[:1])
  local = {'tokens': np.arange(12, dtype=np.int32).reshape(4, 3)}
  out = shd.make_global_batch(local, mesh)
  assert out['tokens'].shape == (4, 3)
  np.testing.assert_array_equal(np.asarray(out['tokens']), local['tokens'])


def test_eight_fake_devices_match_one_device(reference_run, tmp_path, puzzle_cache, jax_cache):
  """data=4 × fsdp=2 on 8 CPU devices: the same 5 steps as the 1-device reference run.

  Same data and keys (threefry is partitionable, so random draws do not depend on the sharding);
  only reduction orders differ. Tolerance: 1e-5 relative on every step's loss.
  """
  workdir = str(tmp_path)
  flags = main_cmd(workdir, puzzle_cache, '--config.mesh.data=4', '--config.mesh.fsdp=2',
                   '--config.train.num_steps=5')[3:]
  env = subprocess_env(jax_cache, devices=8)
  env['PYTHON'] = sys.executable
  proc = subprocess.run(['bash', os.path.join(REPO, 'launch', 'local_fake_devices.sh'), '8',
                         *flags], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=240, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got, ref = train_losses(workdir), train_losses(reference_run['workdir'])
  assert sorted(got) == [1, 2, 3, 4, 5]
  np.testing.assert_allclose([got[s] for s in range(1, 6)], [ref[s] for s in range(1, 6)],
                             rtol=1e-5, atol=0)
  # The saved arrays were sharded: an ('embed', 'mlp') kernel over ('fsdp', 'tensor').
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  meta = ocp.StandardCheckpointer().metadata(os.path.join(workdir, 'checkpoints', '5', 'state'))
  tree = getattr(meta, 'item_metadata', meta)
  tree = getattr(tree, 'tree', tree)
  kernel = tree['params']['blocks_0']['mlp_0']['kernel']
  assert 'fsdp' in str(kernel.sharding), kernel.sharding


_DRIVER = r'''
import json, sys
import jax
from hmdlm_jax.configs import tiny_test
from hmdlm_jax import main
c = tiny_test.get_config()
c.data.cache_dir = {cache!r}
c.train.num_steps = 4
c.train.ckpt_every = 100
c.distributed.enabled = True
c.distributed.coordinator_address = {address!r}
c.distributed.num_processes = 2
c.distributed.process_id = int(sys.argv[1])
out = main.run('train', c, {workdir!r})
print('RESULT ' + json.dumps({{'process': jax.process_index(), 'count': jax.process_count(),
                              'devices': jax.device_count(), 'loss': out['train']['loss'],
                              'step': out['step']}}), flush=True)
'''


def test_two_processes_agree(tmp_path, puzzle_cache, jax_cache):
  """Two JAX processes (one CPU device each) each feed half of the global batch of 8."""
  import portpicker  # pylint: disable=g-import-not-at-top
  port = portpicker.pick_unused_port()
  workdir = str(tmp_path / 'run')
  script = _DRIVER.format(repo=REPO, cache=puzzle_cache, address=f'localhost:{port}',
                          workdir=workdir)
  env = subprocess_env(jax_cache, devices=1)
  procs = [subprocess.Popen([sys.executable, '-c', script, str(i)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  results = []
  try:
    for p in procs:
      out, err = p.communicate(timeout=240)
      assert p.returncode == 0, err[-3000:]
      results.append(json.loads(out.split('RESULT ', 1)[1].splitlines()[0]))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  assert sorted(r['process'] for r in results) == [0, 1]
  assert all(r['count'] == 2 and r['devices'] == 2 and r['step'] == 4 for r in results)
  assert np.isfinite(results[0]['loss'])
  assert results[0]['loss'] == results[1]['loss']  # one global value, bit for bit
  # Process 0 logged every step; the checkpoint holds one iterator state per process.
  assert sorted(r['step'] for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'))) == [
      1, 2, 3, 4]
  it_dir = os.path.join(workdir, 'checkpoints', '4', 'data_iter')
  assert sorted(f for f in os.listdir(it_dir) if f.endswith('.json')) == [
      'process_0-of-2.json', 'process_1-of-2.json']
