"""The run's helper processes end with it: `kill -9` of a run with data workers leaves none.

They were left under PID 1 (two Grain workers of ~265 MB each, one alive 12 minutes) holding the
run's output pipes open, so a caller reading them never saw end of file.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

import pytest

from tests.conftest import REPO, main_cmd, subprocess_env


def _children() -> dict[int, list[int]]:
  """ppid -> pids of the live (not zombie) processes, read from /proc."""
  out: dict[int, list[int]] = {}
  for name in os.listdir('/proc'):
    if name.isdigit():
      try:
        with open(f'/proc/{name}/stat', encoding='utf-8') as f:
          fields = f.read().rsplit(')', 1)[1].split()
      except OSError:  # ended meanwhile
        continue
      if fields[0] != 'Z':
        out.setdefault(int(fields[1]), []).append(int(name))
  return out


def _descendants(pid: int) -> set[int]:
  children, found, todo = _children(), set(), [pid]
  while todo:
    for c in children.get(todo.pop(), []):
      found.add(c)
      todo.append(c)
  return found


def _alive(pids: set[int]) -> set[int]:
  live = {p for ps in _children().values() for p in ps}
  return pids & live


def _read_to_eof(fd: int, timeout: float) -> bool:
  """Whether the pipe `fd` reaches end of file within `timeout` seconds (every writer gone)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    ready, _, _ = select.select([fd], [], [], 0.1)
    if ready and not os.read(fd, 1 << 16):
      return True
  return False


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='reads the process tree in /proc')
def test_kill_9_leaves_no_data_worker(tmp_path, puzzle_cache, jax_cache):
  workdir = tmp_path / 'run'
  cmd = main_cmd(str(workdir), puzzle_cache, '--config.data.num_workers=2',
                 '--config.train.num_steps=100000', '--config.train.ckpt_every=100000')
  proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(jax_cache), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
  helpers: set[int] = set()
  try:
    deadline = time.monotonic() + 120
    # A step has been logged: the two Grain workers (and multiprocessing's resource tracker) run,
    # past their start-up.
    metrics = workdir / 'metrics.jsonl'
    while len(helpers) < 2 or not (metrics.exists() and metrics.stat().st_size):
      assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
      assert time.monotonic() < deadline, f'no data worker started: {helpers}'
      time.sleep(0.2)
      helpers = _descendants(proc.pid)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 5  # hmdlm_jax/parent_watch.py polls 4 times a second
    while _alive(helpers) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not _alive(helpers), f'left running: {sorted(_alive(helpers))} of {sorted(helpers)}'
    assert _read_to_eof(proc.stdout.fileno(), 5), 'the output pipe is still held open'
  finally:
    for pid in _alive(helpers):
      os.kill(pid, signal.SIGKILL)  # this test's own leftovers, by id
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    proc.stdout.close()
