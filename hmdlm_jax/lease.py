"""A run's lease on the directory it writes, so two runs never write one directory at once.

A training run holds DIR/TRAIN_LEASE for its whole run; an eval / sample run holds
OUT/OUTPUTS_LEASE (so a live training run can still be evaluated). A lease is a small JSON file:
host, pid, a random token, start time and heartbeat (Unix seconds). It is created atomically
(storage.create_exclusive: link(2) locally and on NFS, a create-only upload on gs://) and a daemon
thread refreshes its heartbeat every HEARTBEAT_S. A lease whose holder is a dead process of this
host, or whose heartbeat is older than STALE_S, is taken over with one stderr line; a live one is
a LeaseError naming the holder. It is deleted on release, only while it still holds our token.
Several processes (jax.distributed): process 0 holds the lease and tells every process the outcome
in one collective, so all of a second job fail alike (docs/design.md, "Leases").
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from typing import Any, Iterator

import jax
import numpy as np

from hmdlm_jax import stopping
from hmdlm_jax import storage

TRAIN_LEASE = '.hmdlm_train.lease'
OUTPUTS_LEASE = '.hmdlm_outputs.lease'
HEARTBEAT_S = 30.0
# A live holder refreshes every HEARTBEAT_S; this much silence means it is gone (killed on another
# host, or its host is down). Long enough for a slow shared filesystem or bucket to lag.
STALE_S = 300.0
_MESSAGE_BYTES = 1024  # the refusal line as broadcast from process 0


class LeaseError(ValueError):
  """The directory is leased by another live run."""


def _read(path: str) -> dict[str, Any] | None:
  """The lease at `path`, None when there is none; an unreadable one reads as {} (stale)."""
  try:
    record = json.loads(storage.read_text(path))
  except FileNotFoundError:
    return None
  except (OSError, ValueError):  # half-visible or foreign: no heartbeat, so stale
    return {}
  return record if isinstance(record, dict) else {}


def _pid_alive(pid: int) -> bool:
  if pid <= 0:  # os.kill would address a process group
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # someone else's live process
    return True
  return True


def stale_reason(record: dict[str, Any], now: float, stale_s: float) -> str | None:
  """Why the lease `record` may be taken over (its holder is gone), None while it is live."""
  age = now - float(record.get('heartbeat', 0.0))
  if record.get('host') == socket.gethostname() and not _pid_alive(int(record.get('pid', -1))):
    return f'its process {record.get("pid")} on this host is gone'
  if age > stale_s:
    return f'its heartbeat is {age:.0f} s old (over {stale_s:g} s)'
  return None


class Lease:
  """One held lease file; `release()` (idempotent) stops the heartbeat and deletes it."""

  def __init__(self, path: str, heartbeat_s: float = HEARTBEAT_S) -> None:
    self.path = path
    self.token = uuid.uuid4().hex
    self.record = {'host': socket.gethostname(), 'pid': os.getpid(), 'token': self.token,
                   'started': time.time(), 'heartbeat': time.time()}
    self._stop = threading.Event()
    self._heartbeat_s = heartbeat_s
    self._thread: threading.Thread | None = None

  def encoded(self) -> bytes:
    return json.dumps(self.record, sort_keys=True).encode('utf-8')

  def ours(self) -> bool:
    return (_read(self.path) or {}).get('token') == self.token

  def start_heartbeat(self) -> None:
    self._thread = threading.Thread(target=self._beat, name='lease-heartbeat', daemon=True)
    self._thread.start()

  def _beat(self) -> None:
    while not self._stop.wait(self._heartbeat_s):
      try:
        if not self.ours():  # taken over after we stalled past STALE_S: never write over it
          print(f'hmdlm_jax: warning: the lease {self.path} was taken over by another run; this '
                'run no longer holds it.', file=sys.stderr, flush=True)
          return
        self.record['heartbeat'] = time.time()
        storage.write_bytes(self.path, self.encoded())
      except OSError:  # a filesystem hiccup: the next beat retries, STALE_S leaves room for it
        pass

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None and self._thread is not threading.current_thread():
      self._thread.join(timeout=10)
    with contextlib.suppress(OSError):
      if self.ours():
        storage.remove(self.path)


def acquire(directory: str, name: str, flag: str, *, heartbeat_s: float = HEARTBEAT_S,
            stale_s: float = STALE_S) -> Lease:
  """Takes the lease DIRECTORY/NAME (the directory is created); LeaseError when a live run holds
  it. `flag` names the directory in messages (e.g. '--workdir')."""
  storage.makedirs(directory)
  lease = Lease(storage.join(directory, name), heartbeat_s)
  for _ in range(3):  # a takeover raced by another taker: look again
    try:
      storage.create_exclusive(lease.path, lease.encoded())
      lease.start_heartbeat()
      return lease
    except FileExistsError:
      pass
    held = _read(lease.path)
    if held is None:  # released in between
      continue
    why = stale_reason(held, time.time(), stale_s)
    if why is None:
      age = time.time() - float(held.get('heartbeat', 0.0))
      raise LeaseError(
          f'{flag}={directory!r} is in use by another run (host {held.get("host")}, pid '
          f'{held.get("pid")}, heartbeat {age:.0f} s ago; {lease.path}): wait for it to end, or '
          f'use another {flag}. A lease whose heartbeat is over {stale_s:g} s old is taken over.')
    # Delete the stale lease only if it is still the one judged stale (not a new taker's).
    if (_read(lease.path) or {}).get('token') == held.get('token'):
      with contextlib.suppress(FileNotFoundError):
        storage.remove(lease.path)
      print(f'hmdlm_jax: taking over the stale lease {lease.path} of host {held.get("host")} '
            f'pid {held.get("pid")}: {why}.', file=sys.stderr, flush=True)
  raise LeaseError(f'{flag}={directory!r}: its lease {lease.path} keeps changing hands; another '
                   f'run is starting there. Wait for it, or use another {flag}.')


def _agree(message: str) -> str:
  """Process 0's `message` ('' = lease taken) on every process (one collective)."""
  if jax.process_count() == 1:
    return message
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  data = np.zeros(_MESSAGE_BYTES, np.uint8)
  raw = message.encode('utf-8')[:_MESSAGE_BYTES]
  data[:len(raw)] = np.frombuffer(raw, np.uint8)
  out = np.asarray(multihost_utils.broadcast_one_to_all(data))
  return bytes(out.astype(np.uint8)).rstrip(b'\0').decode('utf-8', 'replace')


def _terminate(signum: int, frame: Any) -> None:
  """SIGTERM in a program that imports `run` (no stopping.install): unwind through `hold`."""
  del frame
  raise stopping.Interrupted(signum)


@contextlib.contextmanager
def hold(directory: str, name: str, flag: str) -> Iterator[Lease | None]:
  """The lease DIRECTORY/NAME for the `with` block (process 0 holds it; others get None).

  Raises LeaseError on every process when a live run holds it. Inside the block SIGTERM exits
  (code 143) through the block's end, so the lease is released; training's own handler
  (checkpoint.StopSignal) replaces this one while the loop runs. Under the command line
  (stopping.install) the stopping module handles the signals, and its watchdog also releases the
  lease when it ends a process whose main thread did not unwind (docs/design.md, "Stopping").
  """
  lease, message = None, ''
  if jax.process_index() == 0:
    try:
      lease = acquire(directory, name, flag)
    except LeaseError as e:
      message = str(e)
  message = _agree(message)
  if message:
    if lease is not None:
      lease.release()
    raise LeaseError(message)
  main = (threading.current_thread() is threading.main_thread()) and not stopping.installed()
  # None: a handler installed outside Python (jax.distributed's), which cannot be put back.
  previous = signal.signal(signal.SIGTERM, _terminate) if main else None
  try:
    with stopping.on_exit(lease.release) if lease is not None else contextlib.nullcontext():
      yield lease
  finally:
    if main and previous is not None:
      signal.signal(signal.SIGTERM, previous)
    if lease is not None:
      lease.release()
