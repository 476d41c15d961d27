"""Session settings and shared fixtures of the tests.

The tests' own JAX runs at XLA backend optimisation level 0 (compile-bound tests; the compute-bound
ones ask for `OPTIMISED`), and the files that read the reference run share one xdist worker.
Training runs go through subprocesses (`python -m hmdlm_jax.main`), which share one persistent
JAX compilation cache for the whole session: every run of configs/tiny_test.py on one CPU device
compiles the same program, so only the first one pays for XLA.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from typing import Any

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The tests' own JAX (set before any test module initialises a backend): XLA backend optimisation
# level 0. Most tests compile a small program once and run it a few times, and XLA:CPU compiles
# ~2x faster at level 0; the few compute-bound programs (samplers drawing 10-20k sequences over
# T = 1000 steps, Monte-Carlo bounds) pass `compiler_options=OPTIMISED` to jax.jit instead, which
# runs them 2-3x faster than at level 0 (CI time, 2026-12-02; the suite passes at either level).
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_backend_optimization_level=0').strip()
OPTIMISED = {'xla_backend_optimization_level': 3}  # XLA's default level

# libtpu is in the test lock (tests/test_aot_tpu.py compiles for TPU topologies through its
# compile-only client on this host). JAX itself stays on the CPU, and libtpu must never ask the
# GCE metadata server for a TPU that is not there: set before any backend starts, inherited by
# every subprocess.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')

# The files that read the session's reference run (below). Under the README's `-n 2 --dist
# loadfile` they are scheduled as one unit, so the run is made once rather than once per worker;
# every other file is its own unit, as loadfile has it. (xdist's loadgroup marks cannot do this
# with pytest 9, whose node ids xdist can no longer suffix.)
REFERENCE_RUN_FILES = ('test_checkpoint.py', 'test_disk_full.py', 'test_distributed.py',
                       'test_faults.py', 'test_train.py', 'test_trained.py')


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
  if config.getvalue('dist') != 'loadfile':
    return None
  from xdist import scheduler  # pylint: disable=g-import-not-at-top  (only with pytest-xdist)

  class ReferenceRunTogether(scheduler.LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str:
      path = super()._split_scope(nodeid)
      return 'reference_run' if os.path.basename(path) in REFERENCE_RUN_FILES else path

  return ReferenceRunTogether(config, log)


# The reference run: configs/tiny_test.py for REF_STEPS steps, a checkpoint every REF_CKPT steps.
REF_STEPS = 100
REF_CKPT = 20


@pytest.fixture(scope='session')
def puzzle_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
  """Generated-puzzle cache shared by every run of the session (data.cache_dir)."""
  return str(tmp_path_factory.mktemp('sudoku_cache'))


@pytest.fixture(scope='session')
def jax_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
  return str(tmp_path_factory.mktemp('jax_compilation_cache'))


def subprocess_env(jax_cache: str, devices: int = 1) -> dict[str, str]:
  """Environment of a JAX subprocess: CPU, `devices` fake devices, the shared compile cache."""
  env = dict(os.environ)
  env.update(
      JAX_PLATFORMS='cpu',
      # Backend optimisation level 0: XLA:CPU compiles ~2.5x faster; every run of the session
      # uses the same flags, so runs still agree bit for bit.
      XLA_FLAGS=(f'--xla_force_host_platform_device_count={devices} '
                 '--xla_backend_optimization_level=0'),
      JAX_COMPILATION_CACHE_DIR=jax_cache,
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='-1',
      PYTHONPATH=REPO + os.pathsep + env.get('PYTHONPATH', ''),
      TF_CPP_MIN_LOG_LEVEL='2',
  )
  return env


def main_cmd(workdir: str, puzzle_cache: str, *flags: str,
             config: str = 'configs/tiny_test.py') -> list[str]:
  """`python -m hmdlm_jax.main` on `config` with the reference-run settings plus `flags`."""
  return [sys.executable, '-m', 'hmdlm_jax.main', f'--config={config}', f'--workdir={workdir}',
          f'--config.data.cache_dir={puzzle_cache}', f'--config.train.num_steps={REF_STEPS}',
          f'--config.train.ckpt_every={REF_CKPT}', *flags]


def run_cmd(cmd: list[str], jax_cache: str, *, devices: int = 1, timeout: float = 120.0
            ) -> subprocess.CompletedProcess:
  return subprocess.run(cmd, cwd=REPO, env=subprocess_env(jax_cache, devices), timeout=timeout,
                        capture_output=True, text=True, check=False)


def dir_hash(path: str) -> str | None:
  """SHA-256 over every file's relative path and bytes (and every directory name) under `path`;
  None when `path` does not exist."""
  if not os.path.exists(path):
    return None
  h = hashlib.sha256()
  for root, dirs, files in os.walk(path):
    dirs.sort()
    h.update(os.path.relpath(root, path).encode())
    for name in sorted(files):
      p = os.path.join(root, name)
      h.update(os.path.relpath(p, path).encode())
      with open(p, 'rb') as f:
        h.update(f.read())
  return h.hexdigest()


def read_jsonl(path: str) -> list[dict[str, Any]]:
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()]


def train_losses(workdir: str) -> dict[int, float]:
  """step -> loss of the split='train' records of DIR/metrics.jsonl (last record per step)."""
  out = {}
  for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl')):
    if r['split'] == 'train':
      out[int(r['step'])] = float(r['loss'])
  return out


def load_checkpoint_state(workdir: str, step: int) -> dict[str, Any]:
  """The saved TrainState of DIR/checkpoints/<step> as a nested dict of numpy arrays."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, 'checkpoints', str(step), 'state')
  with ocp.StandardCheckpointer() as ckptr:
    return ckptr.restore(path)


@pytest.fixture(scope='session')
def reference_run(tmp_path_factory: pytest.TempPathFactory, puzzle_cache: str,
                  jax_cache: str) -> dict[str, Any]:
  """configs/tiny_test.py (HMDLM, K=6) for REF_STEPS steps, uninterrupted, on one CPU device."""
  workdir = str(tmp_path_factory.mktemp('reference_run'))
  proc = run_cmd(main_cmd(workdir, puzzle_cache), jax_cache, timeout=240)
  assert proc.returncode == 0, f'reference run failed:\n{proc.stderr[-4000:]}'
  return {'workdir': workdir, 'stdout': proc.stdout, 'stderr': proc.stderr,
          'cmd_flags': main_cmd(workdir, puzzle_cache)[3:]}
