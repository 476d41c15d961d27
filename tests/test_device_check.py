"""benchmarks/device_check.sh --dry: the accelerator check's code paths on CPU (issue 14)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import subprocess_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_FIELDS = ('batch_size', 'grad_accum', 'median_step_s', 'tokens_per_s',
                'model_flops_per_step', 'achieved_tflops', 'mfu', 'loss_finite', 'dtype')


@pytest.mark.slow  # nightly: each item compiles and runs a real step
def test_device_check_dry_writes_every_item(tmp_path, jax_cache):
  # The test sessions' subprocess settings (tests/conftest.py): CPU, XLA backend optimisation
  # level 0 (the dry run is compile-bound: two steps per item) and the shared compile cache.
  env = dict(subprocess_env(jax_cache), PYTHON=sys.executable)
  proc = subprocess.run(['bash', os.path.join(REPO, 'benchmarks', 'device_check.sh'), '--dry',
                         str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / 'device_check.json', encoding='utf-8') as f:
    result = json.load(f)
  assert result['dry'] is True and result['backend'] == 'cpu'
  items = {r['item']: r for r in result['items']}
  assert set(items) == {'lm1b_mdlm', 'lm1b_hmdlm', 'sudoku_25m_hmdlm', 'sudoku_25m_mdlm',
                        'sampling_alg2'}
  for name in ('lm1b_mdlm', 'lm1b_hmdlm', 'sudoku_25m_hmdlm', 'sudoku_25m_mdlm'):
    rec = items[name]
    for field in TRAIN_FIELDS:
      assert field in rec, (name, field)
    assert rec['loss_finite'] and rec['median_step_s'] > 0 and rec['tokens_per_s'] > 0
    assert rec['mfu'] is None  # no published peak for a CPU
  assert items['lm1b_hmdlm']['num_levels'] == 2 and items['lm1b_mdlm']['num_levels'] == 1
  assert items['sudoku_25m_hmdlm']['num_levels'] == 6
  s = items['sampling_alg2']
  assert s['tokens_valid'] and s['sequences_per_s'] > 0 and s['nfe'] >= 1


def test_peak_table_matches_device_kinds():
  from benchmarks import device_check  # pylint: disable=g-import-not-at-top

  class Dev:
    def __init__(self, kind):
      self.device_kind = kind

  assert device_check.peak_flops(Dev('NVIDIA H100 80GB HBM3')) == 989e12
  assert device_check.peak_flops(Dev('NVIDIA A100-SXM4-80GB')) == 312e12
  assert device_check.peak_flops(Dev('cpu')) is None
