"""hmdlm_jax/runtime.py: allocator settings (issue 14, item 3; who gets them: issue 51). No JAX:
fast."""

import os
import subprocess
import sys

import pytest

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


def _entry_point(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
  """A fresh `python -c` running set_up_entry_point(); prints the marker and the tunables. The
  allocator variables of this process are removed first, then `env_extra` is added."""
  code = ('from hmdlm_jax import runtime; import os; runtime.set_up_entry_point();'
          f'print(os.environ.get({runtime.MARKER!r}), os.environ.get("GLIBC_TUNABLES", ""))')
  base = {k: v for k, v in os.environ.items()
          if k not in ('LD_PRELOAD', 'GLIBC_TUNABLES', runtime.MARKER, runtime.CHOICE,
                       'JAX_PLATFORMS', *runtime.TPU_VARIABLES)}
  return subprocess.run([sys.executable, '-c', code], cwd=REPO, env=dict(base, **env_extra),
                        capture_output=True, text=True, timeout=60, check=True)


def test_set_up_entry_point_follows_hmdlm_allocator():
  """The entry points' set-up: HMDLM_ALLOCATOR=glibc re-executes with the tunables on any host
  (here: one that says it runs on CUDA) and says so in ONE stderr line naming the way to turn it
  off; none does nothing (no marker, no tunables, no line) even on a CPU-only host."""
  glibc = _entry_point({'HMDLM_ALLOCATOR': 'glibc', 'JAX_PLATFORMS': 'cuda'})
  none = _entry_point({'HMDLM_ALLOCATOR': 'none', 'JAX_PLATFORMS': 'cpu'})
  assert none.stdout.strip() == 'None' and none.stderr == ''
  if runtime._is_glibc_linux():  # pylint: disable=protected-access
    assert glibc.stdout.strip() == f'glibc {runtime.GLIBC_TUNABLES}'
    lines = glibc.stderr.splitlines()
    assert len(lines) == 1, glibc.stderr
    assert lines[0].startswith('hmdlm_jax: restarting this command once with glibc malloc')
    assert 'HMDLM_ALLOCATOR=glibc' in lines[0] and 'HMDLM_ALLOCATOR=none turns this off' in lines[0]
  else:
    assert glibc.stdout.strip() == 'None' and glibc.stderr == ''


def test_default_re_executes_on_a_cpu_only_host_only():
  """HMDLM_ALLOCATOR unset: JAX_PLATFORMS=cpu is a CPU-only process (re-executed once with
  'auto', one stderr line giving the reason); JAX_PLATFORMS=cuda is an accelerator host, left as
  it is (no marker, nothing printed)."""
  cpu = _entry_point({'JAX_PLATFORMS': 'cpu'})
  gpu = _entry_point({'JAX_PLATFORMS': 'cuda'})
  tpu = _entry_point({'TPU_NAME': 'my-v4-32'})
  assert gpu.stdout.strip() == 'None' and gpu.stderr == ''
  assert tpu.stdout.strip() == 'None' and tpu.stderr == ''
  if runtime._is_glibc_linux():  # pylint: disable=protected-access
    assert cpu.stdout.split()[0] == 'auto'
    lines = cpu.stderr.splitlines()
    assert len(lines) == 1 and '(CPU-only host;' in lines[0], cpu.stderr
  else:
    assert cpu.stdout.strip() == 'None'


def test_a_parents_choice_is_not_re_executed():
  """The marker (a launch script's exports, a benchmark's child) means the parent chose: no
  re-execution and no line, whatever the host."""
  out = _entry_point({runtime.MARKER: 'default', 'JAX_PLATFORMS': 'cpu'})
  assert out.stdout.strip() == 'default' and out.stderr == ''


def test_accelerator_evidence_from_environment_and_device_nodes():
  """The CPU-host test, with the environment and the file system given: JAX_PLATFORMS decides when
  set (only 'cpu' is CPU-only, even with a GPU present), else TPU VM variables and GPU/TPU device
  nodes make an accelerator host."""
  nothing = lambda path: False
  only = lambda *paths: (lambda path: path in paths)
  assert runtime.cpu_only_host({}, nothing)
  assert runtime.cpu_only_host({'JAX_PLATFORMS': ''}, nothing)
  assert runtime.cpu_only_host({'JAX_PLATFORMS': 'cpu'}, only('/dev/nvidia0'))
  assert runtime.cpu_only_host({'JAX_PLATFORMS': 'CPU'}, nothing)
  assert runtime.accelerator_evidence({'JAX_PLATFORMS': 'cuda'}, nothing) == 'JAX_PLATFORMS=cuda'
  assert not runtime.cpu_only_host({'JAX_PLATFORMS': 'cuda,cpu'}, nothing)
  assert not runtime.cpu_only_host({'JAX_PLATFORMS': 'tpu'}, nothing)
  for path in ('/dev/nvidia0', '/dev/nvidiactl', '/dev/kfd', '/dev/accel0', '/dev/vfio'):
    assert runtime.accelerator_evidence({}, only(path)) == f'{path} exists'
  assert runtime.cpu_only_host({}, only('/dev/null', '/dev/accel'))  # not a device of ours
  assert runtime.accelerator_evidence({'TPU_NAME': 'pod'}, nothing) == 'TPU_NAME is set'
  assert runtime.cpu_only_host({'TPU_NAME': ''}, nothing)


def test_requested_allocator_by_choice_and_host():
  cpu, gpu = (lambda path: False), (lambda path: path == '/dev/nvidia0')
  assert runtime.requested_allocator({}, cpu) == ('auto', 'CPU-only host')
  assert runtime.requested_allocator({}, gpu) == (None, 'accelerator host (/dev/nvidia0 exists)')
  for kind in ('glibc', 'tcmalloc', 'auto'):
    for host in (cpu, gpu):
      assert runtime.requested_allocator({'HMDLM_ALLOCATOR': kind}, host) == (
          kind, f'HMDLM_ALLOCATOR={kind}')
  for host in (cpu, gpu):
    assert runtime.requested_allocator({'HMDLM_ALLOCATOR': 'none'}, host)[0] is None
  assert runtime.requested_allocator({'HMDLM_ALLOCATOR': ' None '}, cpu)[0] is None
  with pytest.raises(ValueError, match='HMDLM_ALLOCATOR=.jemalloc.*none, glibc'):
    runtime.requested_allocator({'HMDLM_ALLOCATOR': 'jemalloc'}, cpu)


def test_startup_line_names_the_allocator_and_the_way_out():
  tc = runtime.startup_line({'LD_PRELOAD': '/usr/lib/libtcmalloc_minimal.so.4:/x.so',
                             'TCMALLOC_RELEASE_RATE': '0'}, 'CPU-only host')
  assert tc == ('hmdlm_jax: restarting this command once with tcmalloc (LD_PRELOAD='
                '/usr/lib/libtcmalloc_minimal.so.4, TCMALLOC_RELEASE_RATE=0) to keep XLA:CPU '
                'buffers resident (CPU-only host; speed only, same results); HMDLM_ALLOCATOR=none '
                'turns this off.')
  gl = runtime.startup_line({'GLIBC_TUNABLES': runtime.GLIBC_TUNABLES}, 'HMDLM_ALLOCATOR=glibc')
  assert 'glibc malloc tunables' in gl and '\n' not in gl


def test_launch_scripts_choose_the_allocator_explicitly():
  """launch/: the fake-CPU-device script keeps the allocator ('auto'), the GPU and TPU scripts
  default to none; each passes HMDLM_ALLOCATOR on, so the entry point never decides by itself."""
  launch = os.path.join(REPO, 'launch')
  want = {'local_fake_devices.sh': 'auto', 'slurm_gpu.sh': 'none', 'tpu_pod.sh': 'none'}
  assert sorted(os.listdir(launch)) == sorted(want)
  for name, default in want.items():
    with open(os.path.join(launch, name), encoding='utf-8') as f:
      text = f.read()
    assert f'HMDLM_ALLOCATOR:-{default}' in text, name
    assert 'HMDLM_ALLOCATOR:-auto' not in text or default == 'auto', name
