"""Process start-up settings: keep XLA:CPU's large buffers resident (docs/results/performance.md).

XLA:CPU allocates every buffer of a step with the C library's malloc; glibc serves large requests
by mmap and unmaps them on free, so each step faults the same gigabytes in again. tcmalloc (never
releasing spans) or glibc tunables (no mmap, no trim, one arena) keep them resident. Nothing
computed changes: the allocator decides where buffers live, never what is computed in them.

The entry points call `set_up_entry_point()` before JAX is imported. By default it re-executes
once only on a CPU-only host (`cpu_only_host`), saying so in one line on stderr;
`HMDLM_ALLOCATOR=auto|tcmalloc|glibc` asks for it on any host, `none` turns it off. The launch
scripts set it explicitly. Measurements: docs/results/performance.md. No-op off Linux / glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import runpy
import shlex
import sys
from typing import Callable, Mapping, Sequence

MARKER = 'HMDLM_JAX_ALLOCATOR'  # set in a re-executed process (and by the benchmarks' children)
CHOICE = 'HMDLM_ALLOCATOR'  # the user's choice: none|glibc|tcmalloc|auto (unset: by the host)
# glibc mallopt() parameter numbers (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
TRIM_THRESHOLD = 64 << 30  # 64 GiB: never trim
GLIBC_TUNABLES = (f'glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold={TRIM_THRESHOLD}:'
                  'glibc.malloc.arena_max=1')
TCMALLOC_PATHS = ('/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4',
                  '/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4',
                  '/usr/lib64/libtcmalloc_minimal.so.4', '/usr/lib/libtcmalloc_minimal.so.4')
KINDS = ('glibc', 'tcmalloc', 'auto')
CHOICES = ('none',) + KINDS
# What makes a host an accelerator host, seen before JAX is imported: the device nodes of NVIDIA
# GPUs, AMD GPUs (ROCm), TPUs (v4 and older: /dev/accel*; v5e and newer: /dev/vfio), and the
# variables of a Cloud TPU VM.
ACCELERATOR_PATHS = ('/dev/nvidia0', '/dev/nvidiactl', '/dev/kfd', '/dev/accel0', '/dev/vfio')
TPU_VARIABLES = ('TPU_NAME', 'TPU_ACCELERATOR_TYPE', 'TPU_WORKER_ID', 'TPU_WORKER_HOSTNAMES',
                 'TPU_CHIPS_PER_HOST_BOUNDS', 'CLOUD_TPU_TASK_ID')


def _is_glibc_linux() -> bool:
  return sys.platform.startswith('linux') and platform.libc_ver()[0] == 'glibc'


def tcmalloc_path() -> str | None:
  """The tcmalloc shared library, if installed (apt-get install libtcmalloc-minimal4)."""
  found = next((p for p in TCMALLOC_PATHS if os.path.exists(p)), None)
  return found or ctypes.util.find_library('tcmalloc_minimal')


def allocator_env(kind: str = 'glibc') -> dict[str, str]:
  """Environment variables that apply the allocator settings to a NEW process.

  'glibc': GLIBC_TUNABLES (merged after any tunables already in the environment);
  'tcmalloc': LD_PRELOAD of tcmalloc ({} when it is not installed); 'auto': tcmalloc when
  installed, else glibc. {} on non-Linux or non-glibc systems.
  """
  if kind not in KINDS:
    raise ValueError(f'allocator kind {kind!r}: allowed {KINDS}')
  if not _is_glibc_linux():
    return {}
  if kind in ('tcmalloc', 'auto'):
    path = tcmalloc_path()
    if path:
      pre = os.environ.get('LD_PRELOAD', '')
      # RELEASE_RATE=0: never hand free spans back to the kernel (the default rate 1 madvises
      # them away gradually, and the next step faults them in again).
      return {'LD_PRELOAD': path if not pre else f'{path}:{pre}', 'TCMALLOC_RELEASE_RATE': '0'}
    if kind == 'tcmalloc':
      return {}
  old = os.environ.get('GLIBC_TUNABLES', '')
  kept = [t for t in old.split(':') if t and not t.startswith(
      ('glibc.malloc.mmap_max=', 'glibc.malloc.trim_threshold=', 'glibc.malloc.arena_max='))]
  return {'GLIBC_TUNABLES': ':'.join(kept + [GLIBC_TUNABLES])}


def configure_allocator() -> dict[str, int]:
  """Applies the glibc settings to THIS process with mallopt(); returns {parameter: value} set.

  Call it before JAX (or anything that starts threads) allocates: allocations made afterwards
  stay in the process; arenas created before it by other threads keep their own heaps. Returns {}
  (and does nothing) off glibc/Linux or when tcmalloc is preloaded. Applying it on top of the
  GLIBC_TUNABLES of `allocator_env('glibc')` is harmless (and measured to be needed: the
  tunables alone halve the page faults, mallopt() removes them).
  """
  if not _is_glibc_linux():
    return {}
  if 'tcmalloc' in os.environ.get('LD_PRELOAD', ''):
    return {}
  try:
    libc = ctypes.CDLL(None)
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return {}
  mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  done = {}
  # mallopt takes an int; glibc converts it to size_t, so -1 means SIZE_MAX ("never trim").
  # (2**31 - 1 would be too small: the temporaries freed at the end of a step exceed 2 GiB.)
  trim = -1
  for name, param, value in (('M_MMAP_MAX', _M_MMAP_MAX, 0), ('M_ARENA_MAX', _M_ARENA_MAX, 1),
                             ('M_TRIM_THRESHOLD', _M_TRIM_THRESHOLD, trim)):
    if mallopt(param, value) == 1:
      done[name] = value
  return done


def accelerator_evidence(environ: Mapping[str, str] | None = None,
                         exists: Callable[[str], bool] = os.path.exists) -> str:
  """What says this host computes on an accelerator ('' on a CPU-only host), before JAX starts.

  JAX_PLATFORMS decides when set: only 'cpu' is a CPU-only process (even on a GPU machine: XLA:CPU
  holds the buffers), anything else (cuda, rocm, tpu, 'cuda,cpu') is not. Unset, a GPU/TPU device
  node (`ACCELERATOR_PATHS`) or a Cloud TPU VM variable (`TPU_VARIABLES`) makes it an accelerator
  host. `environ` and `exists` are os.environ and os.path.exists unless given (tests).
  """
  env = os.environ if environ is None else environ
  platforms = [p.strip().lower() for p in env.get('JAX_PLATFORMS', '').split(',') if p.strip()]
  if platforms:
    others = [p for p in platforms if p != 'cpu']
    return f'JAX_PLATFORMS={",".join(platforms)}' if others else ''
  for name in TPU_VARIABLES:
    if env.get(name):
      return f'{name} is set'
  for path in ACCELERATOR_PATHS:
    if exists(path):
      return f'{path} exists'
  return ''


def cpu_only_host(environ: Mapping[str, str] | None = None,
                  exists: Callable[[str], bool] = os.path.exists) -> bool:
  """True when nothing says this process computes on an accelerator (`accelerator_evidence`)."""
  return not accelerator_evidence(environ, exists)


def requested_allocator(environ: Mapping[str, str] | None = None,
                        exists: Callable[[str], bool] = os.path.exists) -> tuple[str | None, str]:
  """(allocator kind the entry point applies, or None to leave the process as it is; why).

  HMDLM_ALLOCATOR=none: None. HMDLM_ALLOCATOR=glibc|tcmalloc|auto: that kind, on any host.
  Unset (or empty): 'auto' on a CPU-only host, None on an accelerator host.

  Raises:
    ValueError: HMDLM_ALLOCATOR names no allocator (allowed: `CHOICES`).
  """
  env = os.environ if environ is None else environ
  choice = env.get(CHOICE, '').strip().lower()
  if choice:
    if choice not in CHOICES:
      raise ValueError(f'{CHOICE}={env.get(CHOICE)!r}: allowed {", ".join(CHOICES)}')
    return (None if choice == 'none' else choice), f'{CHOICE}={choice}'
  evidence = accelerator_evidence(env, exists)
  if evidence:
    return None, f'accelerator host ({evidence})'
  return 'auto', 'CPU-only host'


def startup_line(env: Mapping[str, str], reason: str) -> str:
  """The one stderr line of a re-execution with the variables `env` (`allocator_env`)."""
  if 'LD_PRELOAD' in env:
    what = (f'tcmalloc (LD_PRELOAD={env["LD_PRELOAD"].split(":")[0]}, '
            f'TCMALLOC_RELEASE_RATE={env.get("TCMALLOC_RELEASE_RATE", "")})')
  else:
    what = 'glibc malloc tunables (GLIBC_TUNABLES)'
  return (f'hmdlm_jax: restarting this command once with {what} to keep XLA:CPU buffers '
          f'resident ({reason}; speed only, same results); {CHOICE}=none turns this off.')


def reexec_with_allocator(kind: str = 'auto', argv: Sequence[str] | None = None,
                          reason: str = '') -> None:
  """Re-executes this Python command once with `allocator_env(kind)` (needed for LD_PRELOAD).

  Does nothing when the marker variable is set (already re-executed, or a parent chose the
  allocator), when there is nothing to set, or off glibc/Linux. Otherwise prints
  `startup_line(..., reason)` to stderr (one line) and does not return.
  """
  if os.environ.get(MARKER) or not _is_glibc_linux():
    return
  env = allocator_env(kind)
  if not env:
    return
  os.environ.update(env)
  os.environ[MARKER] = kind
  args = list(sys.argv if argv is None else argv)
  if args and args[0] in ('-m', '-c'):  # not expected from sys.argv, kept for completeness
    args = args[1:]
  orig = getattr(sys, 'orig_argv', None)  # Python >= 3.10: the interpreter's own argv
  cmd = list(orig) if orig and argv is None else [sys.executable] + args
  sys.stdout.flush()
  print(startup_line(env, reason or f'allocator {kind!r}'), file=sys.stderr, flush=True)
  os.execv(sys.executable, cmd)


def set_up_entry_point() -> None:
  """What a command's `if __name__ == '__main__':` calls before importing JAX.

  A process whose parent already chose (the marker variable: a launch script's exports, a
  benchmark's child, or this command after its re-execution) only adds mallopt() (no-op under
  tcmalloc; nothing for the benchmarks' 'default' arm or with HMDLM_ALLOCATOR=none). Otherwise the
  allocator `requested_allocator()` names: re-execution (may not return, one stderr line) and
  mallopt(); None leaves the process as it is.
  """
  kind, reason = requested_allocator()
  marker = os.environ.get(MARKER)
  if marker:
    if marker != 'default' and os.environ.get(CHOICE, '').strip().lower() != 'none':
      configure_allocator()
    return
  if kind is None:
    return
  reexec_with_allocator(kind, reason=reason)
  configure_allocator()


def shell_exports(kind: str = 'auto') -> str:
  """`export NAME=VALUE` lines of `allocator_env(kind)` plus the marker (for launch scripts)."""
  env = allocator_env(kind)
  if not env:
    return ''
  env[MARKER] = kind
  return '\n'.join(f'export {k}={shlex.quote(v)}' for k, v in env.items())


def run_module_with_allocator(module: str, args: Sequence[str]) -> None:
  """configure_allocator(), then runs `python -m module args` in this process."""
  configure_allocator()
  os.environ.setdefault(MARKER, 'mallopt')
  sys.argv = [module] + list(args)
  runpy.run_module(module, run_name='__main__', alter_sys=True)


if __name__ == '__main__':
  # eval "$(python -m hmdlm_jax.runtime [glibc|tcmalloc|auto])"   (launch scripts)
  # python -m hmdlm_jax.runtime run MODULE [ARGS...]   (mallopt() first, then python -m MODULE)
  if len(sys.argv) > 2 and sys.argv[1] == 'run':
    run_module_with_allocator(sys.argv[2], sys.argv[3:])
  else:
    print(shell_exports(sys.argv[1] if len(sys.argv) > 1 else 'auto'))
