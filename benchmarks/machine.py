"""Machine peak: the larger of a jitted JAX and a numpy float32 N³ matmul, measured in this run.

    peak = max(2·N³ / t_jax, 2·N³ / t_numpy),   t = median of `repeats` timed products (N = 2048)

Also the facts a reader needs to compare runs: CPU model, core count, load average, versions.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from typing import Any

import numpy as np


def _median_time(fn: Any, repeats: int) -> float:
  fn()  # warm-up (and, for JAX, compilation)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def matmul_peak(n: int = 2048, repeats: int = 5, with_torch: bool = True) -> dict[str, Any]:
  """GFLOP/s of float32 [n, n] @ [n, n]: jitted JAX, numpy, and their maximum ('peak')."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  a = rng.standard_normal((n, n), dtype=np.float32)
  b = rng.standard_normal((n, n), dtype=np.float32)
  flop = 2.0 * n ** 3
  ja, jb = jnp.asarray(a), jnp.asarray(b)
  mm = jax.jit(jnp.matmul)
  t_jax = _median_time(lambda: mm(ja, jb).block_until_ready(), repeats)
  t_np = _median_time(lambda: np.matmul(a, b), repeats)
  out = {'n': n, 'repeats': repeats, 'jax_gflops': flop / t_jax / 1e9,
         'numpy_gflops': flop / t_np / 1e9}
  out['peak_gflops'] = max(out['jax_gflops'], out['numpy_gflops'])
  if with_torch:
    out['torch_gflops'] = _torch_gflops(a, b, flop, repeats)  # context only: not in the peak
  return out


def _torch_gflops(a: np.ndarray, b: np.ndarray, flop: float, repeats: int) -> float | None:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  ta, tb = torch.from_numpy(a), torch.from_numpy(b)
  return flop / _median_time(lambda: torch.matmul(ta, tb), repeats) / 1e9


def load_average() -> tuple[float, float, float]:
  return os.getloadavg()


def git_commit(repo: str) -> str:
  try:
    sha = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=repo, capture_output=True, text=True,
                         check=True, timeout=10).stdout.strip()
    dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=repo,
                           capture_output=True, text=True, check=True, timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return 'unknown'
  return sha + ('+uncommitted' if dirty else '')


def cpu_model() -> str:
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or 'unknown'


def machine_info(repo: str) -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top
  import flax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  return {
      'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'), 'commit': git_commit(repo),
      'cpu': cpu_model(), 'cpu_count': os.cpu_count(), 'load_average': load_average(),
      'backend': jax.default_backend(), 'devices': [str(d) for d in jax.devices()],
      'jax': jax.__version__, 'flax': flax.__version__, 'optax': optax.__version__,
      'numpy': np.__version__, 'python': platform.python_version(),
      'xla_flags': os.environ.get('XLA_FLAGS', ''),
  }
