"""The memory and disk preflight (hmdlm_jax/resources.py): exact state bytes, a real lower bound of
the step's memory, the largest fitting batch, and the command-line refusals (one line, nothing
written, within seconds)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax import processes
from hmdlm_jax import resources
from hmdlm_jax import sharding
from hmdlm_jax import tasks
from hmdlm_jax import train
from hmdlm_jax.configs import tiny_test
from tests.conftest import dir_hash, main_cmd, run_cmd

PREFIX = 'hmdlm_jax: error:'


def _setup(**overrides):
  c = tiny_test.get_config()
  for key, value in overrides.items():
    section, field = key.split('__')
    c[section][field] = value
  c = config_lib.resolve(c)
  model = tasks.get(c).build_model(c)
  mesh = sharding.make_mesh(c.mesh)
  return c, model, mesh, train.state_shardings(c, model, mesh)[0]


def test_state_bytes_is_the_sum_of_the_abstract_leaves():
  c, model, mesh, abstract = _setup()
  leaves = jax.tree_util.tree_leaves(abstract)
  expected = sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize for a in leaves)
  assert resources.state_bytes(abstract) == expected
  assert resources.device_bytes(abstract) == expected  # one device holds everything
  same, abstract_mesh = resources.abstract_state(c, model)  # what preflight uses: no devices
  assert resources.device_bytes(same) == expected and abstract_mesh.size == mesh.size
  state, _ = train.create_train_state(c, mesh, model)
  assert sum(x.nbytes for x in jax.tree_util.tree_leaves(state)) == expected


@pytest.mark.parametrize('overrides', [
    # Dense logits [B, L, V] in micro-batches: the fast case, both parts of the bound.
    dict(data__batch_size=32, loss__token_rows='all', train__grad_accum=2),
    # One device's default, the selected-rows token loss (no dense logits); CI time: nightly.
    pytest.param(dict(data__batch_size=32), marks=pytest.mark.slow),
], ids=['dense_accum', 'selected'])
def test_lower_bound_is_below_the_compiled_step(overrides):
  c, model, mesh, abstract = _setup(**overrides)
  mem = resources.train_memory(c, model, abstract, mesh)
  b = int(c.data.batch_size)
  process = processes.build(c)
  step = train.make_train_step(c, model, process, mesh)
  batch = {k: jax.ShapeDtypeStruct((b, int(c.model.seq_len)), d,
                                   sharding=sharding.batch_sharding(mesh))
           for k, d in resources.BATCH_DTYPES.items()}
  with sharding.mesh_context(mesh):
    stats = step.jitted.lower(abstract, batch).compile().memory_analysis()
  total = stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes
  assert mem.bytes(b) <= total, (mem, stats)
  # Piece by piece: the state and the batch are the arguments; the gradient and the activations
  # are held in the step's temporaries.
  state_and_batch = resources.device_bytes(abstract) + b * mem.row_batch
  assert state_and_batch <= stats.argument_size_in_bytes
  assert mem.bytes(b) - state_and_batch <= stats.temp_size_in_bytes, (mem, stats)
  if overrides.get('loss__token_rows') == 'all':  # the dense logits are counted
    assert mem.row_act >= 4 * int(c.model.seq_len) * int(c.model.vocab_size)


@pytest.mark.parametrize('accum', [1, 2])
def test_largest_suggested_batch_fits_and_one_more_does_not(accum):
  c, model, mesh, abstract = _setup(train__grad_accum=accum, data__batch_size=10**9)
  mem = resources.train_memory(c, model, abstract, mesh)
  limit = mem.fixed + 123_456_789
  with pytest.raises(ValueError, match=r'^data\.batch_size=1000000000 needs at least') as e:
    resources.check_train(c, model, abstract, mesh, limit=(limit, 'the test'))
  best = int(re.search(r'use data\.batch_size=(\d+) or less', str(e.value)).group(1))
  assert best > 0 and best % accum == 0
  assert mem.bytes(best) <= limit < mem.bytes(best + accum)
  if accum == 1:
    assert limit < mem.bytes(best + 1)
  c, model, mesh, abstract = _setup(train__grad_accum=accum, data__batch_size=best)
  resources.check_train(c, model, abstract, mesh, limit=(limit, 'the test'))  # no error
  # Not even the state fits: the message says so instead of suggesting a batch of 0.
  with pytest.raises(ValueError, match='the model alone does not fit'):
    resources.check_train(c, model, abstract, mesh, limit=(mem.fixed - 1, 'the test'))


def test_eval_batch_refused_with_the_largest_that_fits():
  c, _, mesh, abstract = _setup(data__eval_batch_size=10**9, eval__num_examples=10**9)
  mem = resources.eval_memory(c, abstract, mesh)
  limit = mem.fixed + 10**7
  rows = resources.eval_rows(c, 'eval', None)
  assert rows == 10**9
  with pytest.raises(ValueError, match=r'^data\.eval_batch_size=1000000000 \(1000000000 rows\) '
                     'needs') as e:
    resources.check_eval(c, abstract, mesh, rows, limit=(limit, 'the test'))
  best = int(re.search(r'use data\.eval_batch_size=(\d+) or less', str(e.value)).group(1))
  assert mem.bytes(best) <= limit < mem.bytes(best + 1)
  # The test split's batches are padded to data.eval_batch_size rows however few examples are
  # evaluated (tests/test_probes.py builds one): few examples do not make a large batch fit.
  c, _, mesh, abstract = _setup(data__eval_batch_size=10**9, eval__num_examples=8)
  assert resources.eval_rows(c, 'eval', None) == 10**9
  # Sampling: at most sample.num_samples rows, and no more than the inputs given.
  c, _, mesh, abstract = _setup(data__eval_batch_size=10**9, sample__num_samples=10**9)
  assert resources.eval_rows(c, 'sample', None) == 10**9
  assert resources.eval_rows(c, 'sample', 3) == 3


def test_disk_check_url_skipped_and_local_refused():
  _, _, _, abstract = _setup()
  size = resources.state_bytes(abstract)
  resources.check_disk('gs://bucket/run', abstract, free=lambda p: 0)  # not checked
  resources.check_disk('/nonexistent/a/b', abstract, free=lambda p: size)  # exactly fits
  with pytest.raises(ValueError, match=r"^--workdir='/nonexistent/a/b' has .* free \(on '/'\)"):
    resources.check_disk('/nonexistent/a/b', abstract, free=lambda p: size - 1)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
  lines = [l for l in proc.stderr.splitlines() if l.startswith(PREFIX)]
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert len(lines) == 1 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  return lines[0]


def test_huge_batch_refused_before_anything_is_written(tmp_path, puzzle_cache, jax_cache):
  workdir = str(tmp_path / 'run')
  start = time.monotonic()
  proc = run_cmd(main_cmd(workdir, puzzle_cache, '--config.data.batch_size=1000000000'),
                 jax_cache, timeout=60)
  line = _one_error_line(proc)
  assert time.monotonic() - start < 60
  m = re.search(r'data\.batch_size=1000000000 needs at least .* use data\.batch_size=(\d+) or '
                r'less', line)
  assert m and 0 < int(m.group(1)) < 10**9, line
  assert not os.path.exists(workdir)
  assert os.listdir(tmp_path) == []  # nothing else appeared either


def test_checkpoint_larger_than_the_disk_refused(puzzle_cache, jax_cache):
  mount = tempfile.mkdtemp(prefix='res_tmpfs_')
  try:
    done = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m', 'none', mount],
                          capture_output=True, text=True, check=False)
  except OSError as e:
    done = None
    why = str(e)
  if done is None or done.returncode:
    os.rmdir(mount)
    pytest.skip('a 1 MB tmpfs cannot be mounted here (needs root and mount permission): '
                + (why if done is None else done.stderr.strip()))
  try:
    workdir = os.path.join(mount, 'run')
    before = dir_hash(mount)
    # Width 128: the train state is several MB, more than the 1 MB filesystem.
    proc = run_cmd(main_cmd(workdir, puzzle_cache, '--config.model.hidden_size=128',
                            '--config.model.mlp_dim=256'), jax_cache, timeout=60)
    line = _one_error_line(proc)
    assert f"--workdir={workdir!r} has" in line and 'one checkpoint needs about' in line, line
    assert dir_hash(mount) == before and not os.path.exists(workdir)
  finally:
    subprocess.run(['umount', mount], check=False)
    os.rmdir(mount)

