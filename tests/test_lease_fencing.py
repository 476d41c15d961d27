"""One writer, fenced (hmdlm_jax/lease.py; docs/design.md, "Leases"), with real training runs.

* A run in another PID namespace (`unshare --pid --fork --mount-proc`, as a container sharing the
  host name) cannot take a live run's lease over: the pid it cannot see proves nothing.
* A run suspended (SIGSTOP) past the stale time is taken over; resumed, it stops with one line
  and exit code 1 before its next write.
* A filesystem without hard links (an LD_PRELOAD shim makes link/linkat fail with EPERM): the
  lease is created with O_CREAT|O_EXCL, training runs, and a second writer is still refused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Callable

import pytest

from hmdlm_jax import lease
from tests.conftest import REPO, dir_hash, main_cmd, read_jsonl, subprocess_env

PREFIX = 'hmdlm_jax: error:'
LONG = '--config.train.num_steps=100000'


def _env(jax_cache: str, **extra: str) -> dict[str, str]:
  env = subprocess_env(jax_cache)
  env.update(extra)
  return env


def _popen(cmd: list[str], env: dict[str, str], log: Any) -> subprocess.Popen:
  with open(log, 'w', encoding='utf-8') as err:  # a file: no pipe to fill
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)


def _wait_for(predicate: Callable[[], bool], proc: subprocess.Popen, what: str,
              timeout: float = 180) -> None:
  deadline = time.monotonic() + timeout
  while not predicate():
    assert proc.poll() is None, f'the run ended before {what}'
    assert time.monotonic() < deadline, f'no {what} within {timeout} s'
    time.sleep(0.02)


def _stop(proc: subprocess.Popen) -> int:
  for sig in (signal.SIGCONT, signal.SIGTERM):
    if proc.poll() is None:
      proc.send_signal(sig)
  try:
    return proc.wait(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()


def _lines(path: str) -> list[dict[str, Any]]:
  """The whole lines of a JSON-lines file a live run appends to (none when it is absent)."""
  if not os.path.exists(path):
    return []
  with open(path, encoding='utf-8') as f:
    text = f.read()
  return [json.loads(line) for line in text[:text.rfind('\n') + 1].splitlines() if line.strip()]


def _assert_refused(second: subprocess.CompletedProcess, first: subprocess.Popen,
                    workdir: str) -> None:
  """The second run was refused in one line naming the live first run, which alone wrote runs."""
  errors = _errors(second.stderr)
  assert second.returncode == 1 and len(errors) == 1, second.stderr[-3000:]
  assert f'is in use by another run (host {socket.gethostname()}, pid {first.pid}, ' \
         'heartbeat' in errors[0]
  assert len(read_jsonl(os.path.join(workdir, 'runs.jsonl'))) == 1  # the first run's alone


def _errors(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith(PREFIX)]


def test_another_pid_namespace_cannot_take_a_live_lease(tmp_path, puzzle_cache, jax_cache):
  unshare = shutil.which('unshare')
  if unshare is None:
    pytest.skip('no unshare(1) on this host')
  probe = subprocess.run([unshare, '--pid', '--fork', '--mount-proc', 'true'],
                         capture_output=True, text=True, check=False)
  if probe.returncode:
    pytest.skip(f'unshare --pid --fork --mount-proc fails here: {probe.stderr.strip()}')
  workdir = str(tmp_path / 'run')
  path = os.path.join(workdir, lease.TRAIN_LEASE)
  first = _popen(main_cmd(workdir, puzzle_cache, LONG), _env(jax_cache), tmp_path / 'first.err')
  try:
    _wait_for(lambda: os.path.exists(os.path.join(workdir, 'metrics.jsonl')), first, 'training')
    token = lease._read(path)['token']  # pylint: disable=protected-access
    second = subprocess.run([unshare, '--pid', '--fork', '--mount-proc',
                             *main_cmd(workdir, puzzle_cache)],
                            cwd=REPO, env=_env(jax_cache), capture_output=True, text=True,
                            timeout=180, check=False)
    assert first.poll() is None, 'the first run ended before the second was refused'
    now = lease._read(path) or {}  # pylint: disable=protected-access
    assert now.get('token') == token, f'the lease was taken over: {now}'
  finally:
    assert _stop(first) == 0, (tmp_path / 'first.err').read_text()[-3000:]
  _assert_refused(second, first, workdir)
  assert 'taking over' not in second.stderr and 'Traceback' not in second.stderr


def test_a_suspended_run_taken_over_stops_before_its_next_write(tmp_path, puzzle_cache,
                                                               jax_cache):
  workdir = str(tmp_path / 'run')
  metrics, runs = os.path.join(workdir, 'metrics.jsonl'), os.path.join(workdir, 'runs.jsonl')
  ckpts = os.path.join(workdir, 'checkpoints')
  stale_s = 4.0
  env = _env(jax_cache, **{lease.STALE_ENV: str(stale_s), lease.HEARTBEAT_ENV: '0.2'})
  # Saves in the loop's own thread: once the line of step 5k+1 is written the save of step 5k is
  # complete, so A is suspended with no save in flight (one would finish on resume, as the
  # takeover line warns).
  cmd = main_cmd(workdir, puzzle_cache, LONG, '--config.train.ckpt_every=5',
                 '--config.train.async_checkpoint=False')
  a = _popen(cmd, env, tmp_path / 'a.err')
  b = None
  try:
    while True:  # suspend A between saves, after its first checkpoint
      _wait_for(lambda: len(_lines(metrics)) >= 6, a, 'training')
      a.send_signal(signal.SIGSTOP)
      a_lines = _lines(metrics)
      if a_lines[-1]['step'] % 5:
        break
      a.send_signal(signal.SIGCONT)
      time.sleep(0.05)
    a_metrics = open(metrics, 'rb').read()
    time.sleep(stale_s + 0.5)  # its heartbeat goes stale
    b = _popen(cmd, env, tmp_path / 'b.err')
    _wait_for(lambda: len(_lines(runs)) == 2 and len(_lines(metrics)) > len(a_lines) + 2, b,
              'the second run training')
    b.send_signal(signal.SIGSTOP)  # the directory holds still while A resumes
    time.sleep(0.2)
    watched = {p: dir_hash(p) for p in (metrics, runs, ckpts,
                                        os.path.join(workdir, 'train_summary.json'))}
    a.send_signal(signal.SIGCONT)
    rc_a = a.wait(timeout=60)
    assert {p: dir_hash(p) for p in watched} == watched  # A wrote nothing after it resumed
    b.send_signal(signal.SIGCONT)
  finally:
    if a.poll() is None:
      a.kill()
    if b is not None:
      assert _stop(b) == 0, (tmp_path / 'b.err').read_text()[-3000:]
  a_err, b_err = (tmp_path / 'a.err').read_text(), (tmp_path / 'b.err').read_text()
  errors = _errors(a_err)
  assert rc_a == 1 and len(errors) == 1, a_err[-3000:]
  assert f'lost its lease to another run (host {socket.gethostname()}, pid {b.pid}, ' \
         'heartbeat' in errors[0] and ': stopped before writing;' in errors[0]
  assert 'Traceback' not in a_err and 'warning: the lease' not in a_err
  taking = [line for line in b_err.splitlines() if 'taking over the stale lease' in line]
  assert len(taking) == 1 and f'pid {a.pid}: its heartbeat is' in taking[0], b_err[-3000:]
  assert 'it may still write one more checkpoint or metrics line' in taking[0]
  # One runs.jsonl line per run that held the lease; A's metrics lines are those written before
  # it was suspended, then B's from the checkpoint it resumed (readers keep the last per step).
  resumed = [r['step'] for r in read_jsonl(runs)]
  assert len(resumed) == 2 and resumed[0] == 0 and resumed[1] % 5 == 0 and resumed[1] > 0
  assert open(metrics, 'rb').read().startswith(a_metrics)
  steps = [r['step'] for r in read_jsonl(metrics) if r['split'] == 'train']
  a_steps, b_steps = steps[:len(a_lines)], steps[len(a_lines):]
  assert a_steps == list(range(1, len(a_steps) + 1))
  assert b_steps == list(range(resumed[1] + 1, resumed[1] + 1 + len(b_steps)))
  assert resumed[1] == max(s for s in a_steps if s % 5 == 0)  # A's last checkpoint
  assert not os.path.exists(os.path.join(workdir, lease.TRAIN_LEASE))  # B released it


_SHIM = r'''
#include <errno.h>
int link(const char *from, const char *to) { (void)from; (void)to; errno = EPERM; return -1; }
int linkat(int a, const char *from, int b, const char *to, int flags) {
  (void)a; (void)from; (void)b; (void)to; (void)flags; errno = EPERM; return -1;
}
'''


def test_a_filesystem_without_hard_links(tmp_path, puzzle_cache, jax_cache):
  cc = shutil.which('cc') or shutil.which('gcc')
  if cc is None:
    pytest.skip('no C compiler (cc / gcc) to build the link(2)-refusing LD_PRELOAD shim')
  (tmp_path / 'nolink.c').write_text(_SHIM, encoding='utf-8')
  shim = str(tmp_path / 'nolink.so')
  subprocess.run([cc, '-shared', '-fPIC', '-o', shim, str(tmp_path / 'nolink.c')], check=True)
  env = _env(jax_cache, LD_PRELOAD=shim)
  check = subprocess.run([sys.executable, '-c', 'import os; os.link(os.devnull, "x")'], env=env,
                         cwd=tmp_path, capture_output=True, text=True, check=False)
  assert 'PermissionError' in check.stderr, check.stderr  # the shim binds
  workdir = str(tmp_path / 'run')
  first = _popen(main_cmd(workdir, puzzle_cache, LONG), env, tmp_path / 'first.err')
  try:
    _wait_for(lambda: len(_lines(os.path.join(workdir, 'metrics.jsonl'))) >= 3, first,
              'training')
    held = lease._read(os.path.join(workdir, lease.TRAIN_LEASE))  # pylint: disable=protected-access
    assert held and held['pid'] == first.pid
    second = subprocess.run(main_cmd(workdir, puzzle_cache), cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=180, check=False)
    assert first.poll() is None, 'the first run ended before the second was refused'
  finally:
    assert _stop(first) == 0, (tmp_path / 'first.err').read_text()[-3000:]
  _assert_refused(second, first, workdir)
  assert any(n.isdigit() for n in os.listdir(os.path.join(workdir, 'checkpoints')))
  assert not os.path.exists(os.path.join(workdir, lease.TRAIN_LEASE))
  assert 'Traceback' not in (tmp_path / 'first.err').read_text()
