"""A write the disk refuses (full, file-size limit, read-only) is ONE error line, then a resume.

Each command-line run asserts: exit code 1, the last line of the output is the one
`hmdlm_jax: error:` line naming the path and the reason, no 'Traceback' anywhere (Orbax's threads,
asyncio, TensorStore and tensorboardX used to print several), and, once the space / limit /
permission is back, the same command resumes and its losses are bit-identical to the session's
uninterrupted reference run (tests/conftest.py). Tiny file systems are tmpfs mounts (root only:
skipped with the reason elsewhere); the file-size limit is RLIMIT_FSIZE set in the child (Python
ignores SIGXFSZ, so the write fails with EFBIG).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from typing import Any, Callable

import pytest

from tests.conftest import REPO, main_cmd, run_cmd, subprocess_env, train_losses

PREFIX = 'hmdlm_jax: error: '
STEPS = 40
PUZZLE = '000000010400000000020000000000050407008000300001090000300400200050100000000806000'


def _mount(path: str, options: str) -> None:
  os.makedirs(path, exist_ok=True)
  if os.geteuid() != 0:
    pytest.skip('mounting a tmpfs needs root')
  proc = subprocess.run(['mount', '-t', 'tmpfs', '-o', options, 'none', path],
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    pytest.skip(f'cannot mount a tmpfs here: {proc.stderr.strip()}')


@pytest.fixture
def tmpfs(tmp_path) -> Any:
  """mount(name, options) -> a tmpfs folder under tmp_path; unmounted at the end."""
  mounted: list[str] = []

  def mount(name: str, options: str) -> str:
    path = str(tmp_path / name)
    _mount(path, options)
    mounted.append(path)
    return path

  yield mount
  for path in reversed(mounted):
    subprocess.run(['umount', '-l', path], check=False)


def _one_error_line(proc: subprocess.CompletedProcess, *words: str) -> str:
  """The error line, checked: exit 1, the last line of stderr, the only one, no traceback."""
  everything = proc.stdout + proc.stderr
  assert proc.returncode == 1, (proc.returncode, everything[-3000:])
  assert 'Traceback' not in everything, everything[-6000:]
  assert everything.count(PREFIX) == 1, everything[-3000:]
  last = proc.stderr.rstrip('\n').split('\n')[-1]
  assert last.startswith(PREFIX) and not proc.stdout.strip().endswith(PREFIX), everything[-3000:]
  for w in words:
    assert w in last, (w, last)
  return last


def _cmd(workdir: str, puzzle_cache: str, *flags: str) -> list[str]:
  """The reference run's command, stopped at STEPS with a checkpoint every 10 steps: the
  constant learning rate of configs/tiny_test.py makes its losses the reference's first ones."""
  return main_cmd(workdir, puzzle_cache, f'--config.train.num_steps={STEPS}',
                  '--config.train.ckpt_every=10', *flags)


def _resumes_bit_identically(cmd: list[str], workdir: str, jax_cache: str,
                             reference_run: dict[str, Any]) -> None:
  proc = run_cmd(cmd, jax_cache, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  ref = {s: v for s, v in train_losses(reference_run['workdir']).items() if s <= STEPS}
  assert train_losses(workdir) == ref  # every step, the last line of each, bit for bit


def test_disk_full_mid_run_then_resume(reference_run, tmpfs, puzzle_cache, jax_cache):
  """A 2 MB disk holds the first two checkpoints (~0.8 MB each) but not the third (step 30)."""
  disk = tmpfs('disk', 'size=2m')
  workdir = os.path.join(disk, 'run')
  cmd = _cmd(workdir, puzzle_cache, '--config.train.keep_last=10')
  proc = run_cmd(cmd, jax_cache, timeout=300)
  line = _one_error_line(proc, f'{workdir}/checkpoints/', 'no space left on device (ENOSPC)',
                         'free space', 'rerun the same command')
  assert len(line) <= 300, line
  assert os.path.isdir(os.path.join(workdir, 'checkpoints', '20'))  # it failed mid-run
  subprocess.run(['mount', '-o', 'remount,size=64m', disk], check=True)
  _resumes_bit_identically(cmd, workdir, jax_cache, reference_run)


def _file_size_limit(limit: int) -> Callable[[], None]:
  def preexec() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
  return preexec


def test_file_size_limit_then_resume(reference_run, tmp_path, puzzle_cache, jax_cache):
  """RLIMIT_FSIZE of 100 kB: metrics and events fit, the first checkpoint's data file (step 10)
  does not."""
  workdir = str(tmp_path / 'run')
  cmd = _cmd(workdir, puzzle_cache)
  proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(jax_cache), timeout=300,
                        capture_output=True, text=True, check=False,
                        preexec_fn=_file_size_limit(100 * 1024))
  _one_error_line(proc, f'{workdir}/checkpoints/10', 'file-size limit (EFBIG)', 'ulimit -f')
  assert train_losses(workdir)  # it trained before the checkpoint failed
  _resumes_bit_identically(cmd, workdir, jax_cache, reference_run)


def test_read_only_event_folder_then_resume(reference_run, tmpfs, tmp_path, puzzle_cache,
                                            jax_cache):
  """tb/ on a read-only mount (root ignores permission bits, not a read-only file system)."""
  workdir = str(tmp_path / 'run')
  tb = tmpfs('run/tb', 'ro,size=1m')
  cmd = _cmd(workdir, puzzle_cache)
  proc = run_cmd(cmd, jax_cache, timeout=300)
  _one_error_line(proc, f'{tb}/events.out.tfevents.', 'read-only file system (EROFS)')
  subprocess.run(['mount', '-o', 'remount,rw', tb], check=True)
  _resumes_bit_identically(cmd, workdir, jax_cache, reference_run)


def test_read_only_checkpoints_refused_before_writing(reference_run, tmpfs, tmp_path,
                                                      puzzle_cache, jax_cache):
  """checkpoints/ read-only: Orbax would open it read-only and wait for every save to time out;
  the preflight refuses it before anything is written."""
  workdir = str(tmp_path / 'run')
  ckpts = tmpfs('run/checkpoints', 'ro,size=1m')
  proc = run_cmd(main_cmd(workdir, puzzle_cache), jax_cache, timeout=120)
  _one_error_line(proc, repr(ckpts), 'is not writable')
  assert sorted(os.listdir(workdir)) == ['checkpoints']


def test_eval_and_sample_on_a_full_disk_leave_nothing(reference_run, tmpfs, puzzle_cache,
                                                      jax_cache):
  """--out on a full disk: one line naming the output file, and no file (partial or not) left."""
  out = tmpfs('out', 'size=64k')
  with open(os.path.join(out, 'filler'), 'wb') as f:  # fills it: 16 pages of 4 kB
    try:
      f.write(bytes(64 * 1024))
    except OSError:
      pass
  run = reference_run['workdir']
  flags = reference_run['cmd_flags']
  base = [sys.executable, '-m', 'hmdlm_jax.main'] + [f for f in flags
                                                     if not f.startswith('--workdir')]
  for mode in ('eval', 'sample'):
    extra = [f'--inputs={PUZZLE}'] if mode == 'sample' else []
    proc = run_cmd(base + [f'--workdir={run}', f'--mode={mode}', f'--out={out}', *extra],
                   jax_cache, timeout=300)
    _one_error_line(proc, f'cannot write {out}/', 'no space left on device (ENOSPC)')
    left = sorted(os.listdir(out))
    assert left in (['filler'], ['filler', 'runs.jsonl']), left
    if 'runs.jsonl' in left:  # the record of the run: whole lines only
      assert all(json.loads(line) for line in open(os.path.join(out, 'runs.jsonl')))
