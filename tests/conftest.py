"""Session settings and shared fixtures of the tests.

The tests' own JAX runs at XLA backend optimisation level 0 (compile-bound tests; the compute-bound
ones ask for `OPTIMISED`), and the files that read the reference run share one xdist worker.
Training runs go through subprocesses (`python -m hmdlm_jax.main`), which share one persistent
JAX compilation cache for the whole session, both xdist workers included: every run of
configs/tiny_test.py on one CPU device compiles the same program, so only the first one pays for
XLA. The xdist scheduler starts the longest files first (tests/fixtures/ci_file_seconds.json).
(The tests' own in-process JAX has no persistent cache: measured on test_hdlm.py and
test_sampling.py, 16 of 460 compilations hit it, 3% of their compile time.)
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Any, Callable

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# JAX locks its compilation cache (below) with the filelock package, which torch brings.
_HAVE_FILELOCK = importlib.util.find_spec('filelock') is not None

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

  seconds = _file_seconds()

  class ReferenceRunTogether(scheduler.LoadFileScheduling):
    """loadfile, the reference-run files as one unit, and the longest unit first."""

    def _split_scope(self, nodeid: str) -> str:
      path = super()._split_scope(nodeid)
      return 'reference_run' if os.path.basename(path) in REFERENCE_RUN_FILES else path

    def _assign_work_unit(self, node: Any) -> None:
      # Longest processing time first (tests/fixtures/ci_file_seconds.json): the files that take
      # minutes start at once, and the short ones fill in at the end on whichever worker is
      # free, so both workers finish together. (xdist's own order is by number of tests.)
      if self.workqueue:
        def weight(scope: str) -> float:
          names = (REFERENCE_RUN_FILES if scope == 'reference_run' else
                   (os.path.basename(scope),))
          return sum(seconds.get(n, DEFAULT_FILE_SECONDS) for n in names)
        heaviest = max(self.workqueue, key=weight)  # the first of equals: the usual order
        self.workqueue.move_to_end(heaviest, last=False)
      super()._assign_work_unit(node)

  return ReferenceRunTogether(config, log)


# A file not in tests/fixtures/ci_file_seconds.json (a new one): scheduled as a short file.
DEFAULT_FILE_SECONDS = 5.0


def _file_seconds() -> dict[str, float]:
  """file name -> seconds its tests took in a CI-like run (setup, call and teardown summed);
  written by tests/fixtures/file_seconds.py from `pytest --durations=0` output."""
  path = os.path.join(REPO, 'tests', 'fixtures', 'ci_file_seconds.json')
  try:
    with open(path, encoding='utf-8') as f:
      return {k: float(v) for k, v in json.load(f)['seconds'].items()}
  except (OSError, ValueError, KeyError):
    return {}


# The reference run: configs/tiny_test.py for REF_STEPS steps, a checkpoint every REF_CKPT steps.
REF_STEPS = 100
REF_CKPT = 20


def session_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  """The session's temporary folder that every xdist worker shares: under xdist each worker's
  basetemp is <session>/popen-gwN, so its parent; without xdist the basetemp itself."""
  base = tmp_path_factory.getbasetemp()
  return base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base


def once_per_session(tmp_path_factory: pytest.TempPathFactory, name: str,
                     make: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
  """`make(folder)` once for the whole session, whichever xdist worker asks first.

  The first caller makes <session>/<name>/ under a file lock and records make's (JSON) result
  next to it; a caller on another worker waits for the lock and reads the record. A `make` that
  raises records nothing: the next caller starts again from an empty folder (and fails the same
  way, so every test that needs it reports the failure).
  """
  root = session_dir(tmp_path_factory)
  folder, record = root / name, root / f'{name}.json'
  with open(root / f'{name}.lock', 'a', encoding='utf-8') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if record.is_file():
      return json.loads(record.read_text(encoding='utf-8'))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    result = make(str(folder))
    record.write_text(json.dumps(result), encoding='utf-8')
    return result


@pytest.fixture(scope='session')
def puzzle_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
  """Generated-puzzle cache shared by every run of the session (data.cache_dir)."""
  return str(tmp_path_factory.mktemp('sudoku_cache'))


@pytest.fixture(scope='session')
def jax_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
  """The persistent JAX compilation cache of every subprocess of the session, shared by the xdist
  workers: a program that one worker's runs compiled is read, not compiled, by the other's."""
  path = session_dir(tmp_path_factory) / 'jax_compilation_cache'
  path.mkdir(exist_ok=True)
  return str(path)


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
      # A size limit turns on JAX's file lock around every cache read and write, so a process
      # never reads an entry that another (the other worker's, or a second process of the same
      # test) is still writing. 8 GiB: never reached by the session (about 0.5 MB an entry).
      **({'JAX_COMPILATION_CACHE_MAX_SIZE': str(8 << 30)} if _HAVE_FILELOCK else {}),
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
  def make(workdir: str) -> dict[str, Any]:
    proc = run_cmd(main_cmd(workdir, puzzle_cache), jax_cache, timeout=240)
    assert proc.returncode == 0, f'reference run failed:\n{proc.stderr[-4000:]}'
    return {'workdir': workdir, 'stdout': proc.stdout, 'stderr': proc.stderr,
            'cmd_flags': main_cmd(workdir, puzzle_cache)[3:]}
  # Made once for the session: the files that read it without REFERENCE_RUN_FILES's grouping
  # (tests/test_lease.py) read the same run on the other worker. Every reader leaves it as it is.
  return once_per_session(tmp_path_factory, 'reference_run', make)
