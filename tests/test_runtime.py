"""hmdlm_jax/runtime.py: allocator settings (issue 14, item 3). No JAX: fast."""

import os
import subprocess
import sys

from hmdlm_jax import runtime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_glibc_env_sets_the_three_tunables_and_keeps_others(monkeypatch):
  monkeypatch.setattr(runtime, '_is_glibc_linux', lambda: True)
  monkeypatch.setenv('GLIBC_TUNABLES', 'glibc.malloc.tcache_count=0:glibc.malloc.mmap_max=7')
  env = runtime.allocator_env('glibc')
  parts = env['GLIBC_TUNABLES'].split(':')
  assert 'glibc.malloc.tcache_count=0' in parts
  assert 'glibc.malloc.mmap_max=0' in parts and 'glibc.malloc.mmap_max=7' not in parts
  assert 'glibc.malloc.arena_max=1' in parts
  assert any(p.startswith('glibc.malloc.trim_threshold=') for p in parts)


def test_noop_off_glibc_linux(monkeypatch):
  monkeypatch.setattr(runtime, '_is_glibc_linux', lambda: False)
  assert runtime.allocator_env('glibc') == {}
  assert runtime.allocator_env('auto') == {}
  assert runtime.configure_allocator() == {}
  assert runtime.shell_exports('glibc') == ''
  runtime.reexec_with_allocator('glibc')  # returns (no exec) off Linux/glibc


def test_unknown_kind_is_rejected():
  try:
    runtime.allocator_env('jemalloc')
  except ValueError as e:
    assert 'jemalloc' in str(e)
  else:
    raise AssertionError('expected ValueError')


def test_configure_allocator_in_a_fresh_process():
  code = ('from hmdlm_jax import runtime; import platform, sys; d = runtime.configure_allocator();'
          'ok = d == {"M_MMAP_MAX": 0, "M_ARENA_MAX": 1, "M_TRIM_THRESHOLD": -1} '
          'if platform.libc_ver()[0] == "glibc" and sys.platform.startswith("linux") else d == {};'
          'sys.exit(0 if ok else 1)')
  env = {k: v for k, v in os.environ.items() if k not in ('LD_PRELOAD', 'GLIBC_TUNABLES')}
  proc = subprocess.run([sys.executable, '-c', code], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=60, check=False)
  assert proc.returncode == 0, proc.stderr


def test_shell_exports_are_evaluable(monkeypatch):
  monkeypatch.setattr(runtime, '_is_glibc_linux', lambda: True)
  monkeypatch.delenv('GLIBC_TUNABLES', raising=False)
  text = runtime.shell_exports('glibc')
  out = subprocess.run(['bash', '-c', text + '\necho "$GLIBC_TUNABLES|$HMDLM_JAX_ALLOCATOR"'],
                       capture_output=True, text=True, timeout=30, check=True).stdout.strip()
  assert out == f'{runtime.GLIBC_TUNABLES}|glibc'


def test_reexec_applies_the_environment_once():
  code = ('from hmdlm_jax import runtime; import os; runtime.reexec_with_allocator("glibc");'
          'print(os.environ.get("HMDLM_JAX_ALLOCATOR"), os.environ.get("GLIBC_TUNABLES", ""))')
  env = {k: v for k, v in os.environ.items()
         if k not in ('LD_PRELOAD', 'GLIBC_TUNABLES', runtime.MARKER)}
  out = subprocess.run([sys.executable, '-c', code], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=60, check=True).stdout.strip()
  if runtime._is_glibc_linux():  # pylint: disable=protected-access
    assert out == f'glibc {runtime.GLIBC_TUNABLES}'
  else:
    assert out.startswith('None')


def test_set_up_entry_point_follows_hmdlm_allocator():
  """The entry points' set-up: HMDLM_ALLOCATOR=glibc re-executes with the tunables, none does
  nothing (no marker, no tunables)."""
  code = ('from hmdlm_jax import runtime; import os; runtime.set_up_entry_point();'
          f'print(os.environ.get({runtime.MARKER!r}), os.environ.get("GLIBC_TUNABLES", ""))')
  base = {k: v for k, v in os.environ.items()
          if k not in ('LD_PRELOAD', 'GLIBC_TUNABLES', runtime.MARKER, 'HMDLM_ALLOCATOR')}
  out = {kind: subprocess.run([sys.executable, '-c', code], cwd=REPO,
                              env=dict(base, HMDLM_ALLOCATOR=kind), capture_output=True,
                              text=True, timeout=60, check=True).stdout.strip()
         for kind in ('glibc', 'none')}
  assert out['none'] == 'None'
  if runtime._is_glibc_linux():  # pylint: disable=protected-access
    assert out['glibc'] == f'glibc {runtime.GLIBC_TUNABLES}'
  else:
    assert out['glibc'] == 'None'
