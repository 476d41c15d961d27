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
import re
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
  line = _one_error_line(proc, 'no space left on device (ENOSPC)', 'free space',
                         'rerun the same command')
  # Which write meets the full disk first (the step-30 checkpoint, the metrics append or the
  # event file beside it) depends on the asynchronous save's timing; each is named by its path.
  assert re.search(rf'cannot write {re.escape(workdir)}/(checkpoints/|metrics|tb/)', line), line
  assert len(line.replace(workdir, 'WORKDIR')) <= 300, line  # the user's path is theirs
  assert os.path.isdir(os.path.join(workdir, 'checkpoints', '20'))  # it failed mid-run
  subprocess.run(['mount', '-o', 'remount,size=64m', disk], check=True)
  _resumes_bit_identically(cmd, workdir, jax_cache, reference_run)


def _file_size_limit(limit: int) -> Callable[[], None]:
  def preexec() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
  return preexec


@pytest.mark.slow
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


@pytest.mark.slow
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


# A child whose files may not grow past 1050 bytes appends 100-byte lines to one file.
_APPENDER = '''
import sys
from hmdlm_jax import storage
for i in range(20):
  try:
    storage.append_text(sys.argv[1], f'{i:99d}\\n')
  except OSError as e:
    print(e)
    break
'''


def test_a_refused_append_leaves_whole_lines(tmp_path):
  """The 11th line fits only in part: it is cut off again, and the error names the file."""
  path = str(tmp_path / 'metrics.jsonl')
  proc = subprocess.run([sys.executable, '-c', _APPENDER, path], cwd=REPO, timeout=120,
                        capture_output=True, text=True, check=False,
                        preexec_fn=_file_size_limit(1050))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert os.path.getsize(path) == 1000
  assert proc.stdout.startswith(f'cannot write {path}: file larger than the file-size limit '
                                '(EFBIG); raise the file-size limit (ulimit -f)'), proc.stdout


def test_refused_writes_are_recognised():
  from hmdlm_jax import write_errors  # pylint: disable=g-import-not-at-top
  e = write_errors.from_exception(PermissionError(13, 'Permission denied', '/x/y'), '/x')
  assert str(e).startswith('cannot write /x: permission denied (EACCES); fix the permissions')
  ts = ValueError('OUT_OF_RANGE: Error writing "a/0" in OCDBT database: Failed writing: "/c/d": '
                  "Failed to write 167634 bytes to file 8: No space left on device "
                  "[os_error_code='28']")
  try:
    try:
      raise ts
    except ValueError as inner:
      raise RuntimeError('wrapped') from inner
  except RuntimeError as outer:
    e = write_errors.from_exception(outer, '/w/checkpoints/30')
  assert 'cannot write /w/checkpoints/30: no space left on device (ENOSPC)' in str(e)
  assert write_errors.from_exception(ValueError('bad value'), '/x') is None
  assert write_errors.from_exception(OSError(5, 'I/O error'), '/x') is None


def test_only_the_libraries_reports_of_a_refused_write_are_dropped(monkeypatch):
  import logging  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import write_errors  # pylint: disable=g-import-not-at-top
  shown = []
  monkeypatch.setattr(sys, 'unraisablehook', lambda info: shown.append(info.exc_value))
  monkeypatch.setattr(threading, 'excepthook', lambda args: shown.append(args.exc_value))
  handler = logging.Handler()
  write_errors.quiet_library_reports(handler)

  def record(path: str, exc: BaseException | None, name: str = 'absl') -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, path, 1, 'failed', None,
                             (type(exc), exc, None) if exc else None)

  full = OSError(28, 'No space left on device')
  orbax = '/site-packages/orbax/checkpoint/_src/futures/future.py'
  assert not handler.filter(record(orbax, full))
  assert handler.filter(record(orbax, ValueError('another failure')))
  assert handler.filter(record(os.path.join(REPO, 'hmdlm_jax', 'main.py'), full))  # our own
  assert not handler.filter(record('/asyncio/base_events.py', None, 'asyncio'))  # after one

  def call_soon_threadsafe() -> None:
    raise RuntimeError('Event loop is closed')

  for exc_value in (full, ValueError('kept')):
    sys.unraisablehook(type('Info', (), {'exc_value': exc_value})())
  try:
    call_soon_threadsafe()
  except RuntimeError as closed:
    sys.unraisablehook(type('Info', (), {'exc_value': closed})())
  threading.excepthook(type('Args', (), {'exc_value': full})())
  threading.excepthook(type('Args', (), {'exc_value': KeyError('kept')})())
  assert [str(e) for e in shown] == ['kept', "'kept'"]


def test_tensorboard_events_are_whole_records(tmp_path):
  """The event file written in the loop: TFRecord framing with valid CRCs, tensorboardX's protos."""
  import struct  # pylint: disable=g-import-not-at-top
  from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  writer = metrics_lib.MetricsWriter(str(tmp_path))
  writer.write(1, 'train', {'loss': 2.5, 't=1.0': 0.5})
  writer.write(2, 'eval', {'loss': 1.5})
  writer.close()
  (name,) = os.listdir(tmp_path / 'tb')
  data, events = (tmp_path / 'tb' / name).read_bytes(), []
  while data:
    header, (crc,) = data[:8], struct.unpack('I', data[8:12])
    (n,) = struct.unpack('Q', header)
    body, (body_crc,) = data[12:12 + n], struct.unpack('I', data[12 + n:16 + n])
    assert crc == record_writer.masked_crc32c(header)
    assert body_crc == record_writer.masked_crc32c(body)
    events.append(event_pb2.Event.FromString(body))
    data = data[16 + n:]
  assert events[0].file_version == 'brain.Event:2'
  assert [(e.step, v.tag, v.simple_value) for e in events[1:] for v in e.summary.value] == [
      (1, 'train/loss', 2.5), (1, 'train/t_1.0', 0.5), (2, 'eval/loss', 1.5)]
