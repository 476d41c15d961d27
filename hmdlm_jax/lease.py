"""A run's lease on the directory it writes, so two runs never write one directory at once.

A training run holds DIR/TRAIN_LEASE for its whole run; an eval / sample run holds
OUT/OUTPUTS_LEASE (so a live training run can still be evaluated). A lease is a small JSON file:
host, boot id, PID namespace, pid, a random token, start time and heartbeat (Unix seconds). It is
created atomically (storage.create_exclusive: link(2) locally and on NFS, a create-only upload on
gs://; O_CREAT|O_EXCL where the filesystem has no hard links); a daemon thread refreshes its
heartbeat every HEARTBEAT_S (a local one by touching it, so never over a taker's). A lease whose heartbeat is older than STALE_S is taken over with one
stderr line, as is one whose holder is a dead process of this host, boot and PID namespace (a pid
means nothing elsewhere); a live one is a LeaseError naming the holder. It is deleted on release,
only while it still holds our token. A run whose lease was taken over (it stalled past STALE_S)
is fenced: every write of the run checks `check_held()` first and it stops with LeaseLost.
Several processes (jax.distributed): process 0 holds the lease and tells every process the outcome
in one collective, so all of a second job fail alike (docs/design.md, "Leases").
"""

from __future__ import annotations

import contextlib
import errno
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
# Tests shorten both (a suspended run taken over within seconds); unset in real use.
STALE_ENV, HEARTBEAT_ENV = 'HMDLM_LEASE_STALE_S', 'HMDLM_LEASE_HEARTBEAT_S'
# An O_CREAT|O_EXCL lease (no hard links) is briefly empty or part-written: readers retry this long.
SETTLE_S = 2.0
# link(2) failing with these means the filesystem has no hard links (FAT/exFAT, gcsfuse, s3fs, SMB).
_NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS,
                       errno.EMLINK})
_MESSAGE_BYTES = 1024  # the refusal line as broadcast from process 0


class LeaseError(ValueError):
  """The directory is leased by another live run."""


class LeaseLost(ValueError):
  """This run's lease was taken over by another run: it must not write any more."""


def _env_seconds(name: str, default: float) -> float:
  value = os.environ.get(name)
  return float(value) if value else default


def _read(path: str, settle_s: float = SETTLE_S) -> dict[str, Any] | None:
  """The lease at `path`, None when there is none; one still unreadable after `settle_s` (a
  part-written O_EXCL lease is retried) reads as {}: no heartbeat, so stale. A local lease's
  modification time is its heartbeat too (`touched`: the holder touches it, `Lease._beat`)."""
  deadline = time.monotonic() + settle_s
  while True:
    try:
      record = json.loads(storage.read_text(path))
      if not isinstance(record, dict):
        return {}
      if not storage.is_url(path):
        record['touched'] = os.stat(path).st_mtime
      return record
    except FileNotFoundError:
      return None
    except (OSError, ValueError):  # half-visible, part-written or foreign
      if time.monotonic() >= deadline:
        return {}
    time.sleep(0.05)


def _read_text(path: str) -> str | None:
  try:
    # Bytes, decoded by the built-in ASCII codec: a text-mode open would look the codec up, which
    # imports a module, and a run that dropped its privileges may no longer read the library.
    with open(path, 'rb') as f:
      return f.read().decode('ascii', 'replace').strip() or None
  except OSError:
    return None


def identity() -> dict[str, str | None]:
  """What makes a pid meaningful: this boot of this machine and this PID namespace (containers
  that share a host name, e.g. Docker --network=host, do not share pids). None where unknown."""
  try:
    pid_ns: str | None = os.readlink('/proc/self/ns/pid')  # 'pid:[4026531836]'
  except OSError:
    pid_ns = None
  return {'boot_id': _read_text('/proc/sys/kernel/random/boot_id'), 'pid_ns': pid_ns}


def _create(path: str, data: bytes) -> None:
  """storage.create_exclusive, falling back to O_CREAT|O_EXCL where link(2) is refused (no hard
  links): still exclusive, but briefly visible empty, which readers retry (`_read`)."""
  try:
    storage.create_exclusive(path, data)
    return
  except FileExistsError:
    raise
  except OSError as e:
    if storage.is_url(path) or e.errno not in _NO_LINKS:
      raise
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # FileExistsError: held
  try:
    view = memoryview(data)
    while view:
      view = view[os.write(fd, view):]
    os.fsync(fd)
  except OSError:
    os.close(fd)
    with contextlib.suppress(OSError):
      os.remove(path)
    raise
  os.close(fd)


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


def pid_meaningful(record: dict[str, Any]) -> bool:
  """Whether the holder's pid names a process this one can see: same host name, boot id and PID
  namespace (a lease without these fields, or a host without /proc: never)."""
  mine = identity()
  return (record.get('host') == socket.gethostname() and None not in mine.values()
          and all(record.get(k) == v for k, v in mine.items()))


def heartbeat(record: dict[str, Any]) -> float:
  """The holder's last sign of life (Unix seconds): its record's heartbeat or the file's mtime."""
  return max(float(record.get('heartbeat', 0.0)), float(record.get('touched', 0.0)))


def stale_reason(record: dict[str, Any], now: float, stale_s: float) -> str | None:
  """Why the lease `record` may be taken over (its holder is gone), None while it is live. A dead
  pid is proof only where the pid is ours to judge (`pid_meaningful`); elsewhere the heartbeat
  alone decides (docs/design.md, "Leases")."""
  age = now - heartbeat(record)
  if pid_meaningful(record) and not _pid_alive(int(record.get('pid', -1))):
    return f'its process {record.get("pid")} on this host is gone'
  if age > stale_s:
    return f'its heartbeat is {age:.0f} s old (over {stale_s:g} s)'
  return None


class Lease:
  """One held lease file; `release()` (idempotent) stops the heartbeat and deletes it.

  Fencing: `check()` raises LeaseLost once the lease is known to be another run's. The heartbeat
  thread sets `lost` at its next beat; a write that comes when no beat confirmed the lease for a
  while (the process was suspended, or the thread starved) reads the file itself first, so a run
  resumed after a takeover stops before its next write (docs/design.md, "Leases").
  """

  def __init__(self, path: str, heartbeat_s: float = HEARTBEAT_S, stale_s: float = STALE_S,
               flag: str = '--workdir') -> None:
    self.path = path
    self.flag = flag
    self.token = uuid.uuid4().hex
    self.record = {'host': socket.gethostname(), 'pid': os.getpid(), 'token': self.token,
                   'started': time.time(), 'heartbeat': time.time(), **identity()}
    self.lost: dict[str, Any] | None = None  # the record found instead of ours ({}: none)
    self._reported = False
    self._stop = threading.Event()
    self._heartbeat_s = heartbeat_s
    self._stale_s = stale_s
    # Within this long of a confirmed beat no other run can have taken the lease over (it needs
    # STALE_S of silence), so the in-memory flag suffices; later, a write reads the file.
    self._trust_s = min(2.0 * heartbeat_s, 0.5 * stale_s)
    self._confirmed = time.monotonic()
    self._thread: threading.Thread | None = None

  def encoded(self) -> bytes:
    return json.dumps(self.record, sort_keys=True).encode('utf-8')

  def holder(self) -> dict[str, Any] | None:
    return _read(self.path)

  def ours(self) -> bool:
    return (self.holder() or {}).get('token') == self.token

  def start_heartbeat(self) -> None:
    self._confirmed = time.monotonic()
    self._thread = threading.Thread(target=self._beat, name='lease-heartbeat', daemon=True)
    self._thread.start()

  def _beat(self) -> None:
    while not self._stop.wait(self._heartbeat_s) and self._beat_once():
      pass

  def _beat_once(self) -> bool:
    """One heartbeat; False once the lease is lost (the thread ends)."""
    try:
      read_at = time.monotonic()
      held = self.holder()
      if held == {}:  # unreadable for SETTLE_S: neither ours to refresh nor proof of a loss
        return True
      if held is None or held.get('token') != self.token:  # taken over while we stalled
        self.lost = held or {}  # never write over it; the run's next write stops (`check`)
        return False
      if not storage.is_url(self.path):
        # Touched, never rewritten: a run suspended since the read touches at worst a taker's new
        # file (refreshing its heartbeat) and finds the taker's token at its next beat; until
        # then `check` trusts only the read, so a late write reads the file first.
        os.utime(self.path)
        self._confirmed = read_at
        return True
      if time.monotonic() - read_at > 0.25 * self._stale_s:
        return True  # suspended since the read: it may be stale now; read again, never overwrite
      self.record['heartbeat'] = time.time()
      storage.write_bytes(self.path, self.encoded())
      if time.monotonic() - read_at > 0.25 * self._stale_s:
        # Suspended between the read and the rename: this write may have replaced a taker's
        # lease, and no rename can be undone. Fail-stop: this run stops before its next write,
        # and the taker, finding this token, stops too; neither writes twice.
        self.lost = {}
        return False
      self._confirmed = time.monotonic()
    except OSError:  # a filesystem hiccup: the next beat retries, STALE_S leaves room for it
      pass
    return True

  def check(self, *, direct: bool = False) -> None:
    """LeaseLost when another run holds the lease now; `direct` always reads the file (before a
    checkpoint save), else only when no beat confirmed it within the trust window."""
    if self.lost is None and (direct or time.monotonic() - self._confirmed > self._trust_s):
      held = self.holder()
      if held is None or (held and held.get('token') != self.token):
        self.lost = held or {}
      elif held:  # ours ({}: unreadable, the heartbeat decides)
        self._confirmed = time.monotonic()
    if self.lost is not None:
      self._reported = True
      raise LeaseLost(self.lost_message())

  def lost_message(self) -> str:
    held = self.lost or {}
    if held:
      age = time.time() - heartbeat(held)
      who = (f'another run (host {held.get("host")}, pid {held.get("pid")}, heartbeat '
             f'{age:.0f} s ago; {self.path})')
    else:
      who = f'another run (its lease file {self.path} is gone or replaced)'
    return (f'this run (pid {os.getpid()}) on {self.flag}={os.path.dirname(self.path)!r} lost its '
            f'lease to {who}: stopped before writing; its heartbeat lapsed for over '
            f'{self._stale_s:g} s (a suspended or stalled process), so that run took the directory '
            'over. Let that run finish (or stop it), then rerun this command to resume from the '
            'latest checkpoint.')

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None and self._thread is not threading.current_thread():
      self._thread.join(timeout=10)
    if self.lost is not None and not self._reported:  # lost, but no write came to say so
      self._reported = True
      print(f'hmdlm_jax: warning: {self.lost_message()}', file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
      if self.lost is None and self.ours():
        storage.remove(self.path)


_HELD: list[Lease] = []  # the leases `hold` holds in this process: `check_held` consults them


def check_held(*, direct: bool = False) -> None:
  """Raises LeaseLost when this process's run has lost a lease it holds (see Lease.check); called
  by every writer before it writes (checkpoint, metrics, run records). No lease held: a no-op."""
  for held in list(_HELD):
    held.check(direct=direct)


def _in_use(directory: str, flag: str, path: str, held: dict[str, Any], stale_s: float) -> str:
  age = time.time() - heartbeat(held)
  return (f'{flag}={directory!r} is in use by another run (host {held.get("host")}, pid '
          f'{held.get("pid")}, heartbeat {age:.0f} s ago; {path}): wait for it to end, or use '
          f'another {flag}. A lease whose heartbeat is over {stale_s:g} s old is taken over.')


def refuse_if_held(directory: str, name: str, flag: str) -> None:
  """LeaseError on every process when a live run holds DIRECTORY/NAME now, taking nothing: a
  preflight calls it before it reads what that run may be rewriting (its checkpoints)."""
  message = ''
  if jax.process_index() == 0:
    path = storage.join(directory, name)
    stale_s = _env_seconds(STALE_ENV, STALE_S)
    held = _read(path)
    if held is not None and stale_reason(held, time.time(), stale_s) is None:
      message = _in_use(directory, flag, path, held, stale_s)
  message = _agree(message)
  if message:
    raise LeaseError(message)


def check_held_everywhere() -> None:
  """`check_held(direct=True)` on process 0, its outcome on every process (one collective, which
  every process must reach: a checkpoint save): LeaseLost on all of them alike."""
  message = ''
  if jax.process_index() == 0:
    try:
      check_held(direct=True)
    except LeaseLost as e:
      message = str(e)
  message = _agree(message)
  if message:
    raise LeaseLost(message)


def acquire(directory: str, name: str, flag: str, *, heartbeat_s: float | None = None,
            stale_s: float | None = None) -> Lease:
  """Takes the lease DIRECTORY/NAME (the directory is created); LeaseError when a live run holds
  it. `flag` names the directory in messages (e.g. '--workdir'). The times default to
  HEARTBEAT_S / STALE_S, or the environment's HMDLM_LEASE_HEARTBEAT_S / HMDLM_LEASE_STALE_S."""
  heartbeat_s = _env_seconds(HEARTBEAT_ENV, HEARTBEAT_S) if heartbeat_s is None else heartbeat_s
  stale_s = _env_seconds(STALE_ENV, STALE_S) if stale_s is None else stale_s
  storage.makedirs(directory)
  lease = Lease(storage.join(directory, name), heartbeat_s, stale_s, flag)
  for _ in range(3):  # a takeover raced by another taker: look again
    try:
      _create(lease.path, lease.encoded())
      lease.start_heartbeat()
      return lease
    except FileExistsError:
      pass
    held = _read(lease.path)
    if held is None:  # released in between
      continue
    why = stale_reason(held, time.time(), stale_s)
    if why is None:
      raise LeaseError(_in_use(directory, flag, lease.path, held, stale_s))
    # Delete the stale lease only if it is still the one judged stale (not a new taker's).
    if (_read(lease.path) or {}).get('token') == held.get('token'):
      with contextlib.suppress(FileNotFoundError):
        storage.remove(lease.path)
      print(f'hmdlm_jax: taking over the stale lease {lease.path} of host {held.get("host")} '
            f'pid {held.get("pid")}: {why}. If that run still lives (suspended or stalled), it '
            'stops before its next write, but it may still write one more checkpoint or metrics '
            'line before it notices.', file=sys.stderr, flush=True)
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
  if lease is not None:
    _HELD.append(lease)
  try:
    with stopping.on_exit(lease.release) if lease is not None else contextlib.nullcontext():
      yield lease
  finally:
    if main and previous is not None:
      signal.signal(signal.SIGTERM, previous)
    if lease is not None:
      with contextlib.suppress(ValueError):
        _HELD.remove(lease)
      lease.release()
