"""SIGTERM / SIGINT end every phase of a command within a bounded time (docs/design.md, "Stopping").

The training loop stops itself on a signal (checkpoint.StopSignal: save, exit 0). Every other phase
(start-up, restore, the final evaluation, --mode=eval / --mode=sample) is ended here, two ways, the
second not needing the first: the main thread's handler raises `Interrupted` (a SystemExit), so
`finally` blocks release the lease and main.py prints one `hmdlm_jax: stopped: ...` line; one that
Python swallows (raised in a gc callback or a __del__) reaches `sys.unraisablehook`, and the signal
is sent to the main thread again. A watchdog thread, woken through `signal.set_wakeup_fd` also while
the main thread waits in XLA, ends a process still alive GRACE_S after the signal: lease released,
the line, os._exit(128 + signal). A second signal ends it at once. Phases marked `defer` (the loop
and its last save) only record a first signal. No JAX here; only the command line installs it (a
notebook's Ctrl-C must not end its kernel).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import select
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator

# A stopping phase's main thread usually ends in well under a second; this leaves room for an XLA
# compilation or collective to return, for jax.distributed's shutdown barrier at exit, and still
# ends the process (with RELEASE_S for the lease) well inside SLURM's 120 s of SIGTERM lead.
GRACE_S = 30.0
RELEASE_S = 10.0  # at most this long for the lease's release when the watchdog ends the process
GRACE_ENV = 'HMDLM_STOP_GRACE_S'  # overrides GRACE_S (tests)
REDELIVER_S = 0.05  # a swallowed signal is sent to the main thread again this often
ECHO_S = 0.5        # wake-up bytes this soon after such a delivery are its own
# Test-only (tests/test_sigterm_phases.py): HMDLM_DEBUG_PAUSE_AT=POINT[:gc|:stuck] makes the
# command print `hmdlm_jax: debug: paused at POINT` on stdout and sleep at POINT (`debug_pause`).
PAUSE_ENV = 'HMDLM_DEBUG_PAUSE_AT'
PAUSE_S = 60.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)
PREFIX = 'hmdlm_jax: stopped: '


class Interrupted(SystemExit):
  """Raised in the main thread by a signal outside the training loop; code = 128 + signal."""

  def __init__(self, signum: int) -> None:
    super().__init__(128 + signum)
    self.signum = signum


@dataclasses.dataclass
class Phase:
  what: str   # e.g. 'the final evaluation at step 20'
  then: str   # e.g. 'checkpoint 20 is saved; rerun the same command to evaluate'
  defer: bool = False  # a first signal is recorded only: the phase stops by itself
  loop: bool = False   # the training loop (checkpoint.StopSignal)


_START = Phase('start-up', 'nothing of this run is kept; rerun the same command')


class _State:
  """The process's one stopping state (module singleton `_S`)."""

  def __init__(self) -> None:
    self.lock = threading.RLock()  # re-entrant: the main thread's handler may fire inside it
    self.exit_lock = threading.Lock()
    self.installed = False
    self.grace_s = GRACE_S
    self.phases: list[Phase] = [_START]
    self.on_exit: dict[int, Callable[[], None]] = {}
    self.first: int | None = None   # the first signal
    self.count = 0                  # signals seen by the watchdog
    self.raised = False             # Interrupted was raised in the main thread
    self.redeliver = False          # a swallowed Interrupted waits to be raised again
    self.in_hook = False            # _unraisable runs (a raise there would be swallowed too)
    self.last_kill = -1e9           # when the watchdog last sent the signal to the main thread
    self.deadline: float | None = None
    self.announced = False
    self.stopped: Phase | None = None  # the phase the signal stopped (named in the line)
    self.wakeup: tuple[int, int] | None = None
    self.previous_hook: Callable[[Any], None] | None = None


_S = _State()


def message(signum: int, phase: Phase, *, again: bool = False, forced_s: float | None = None
            ) -> str:
  """The one stderr line for `signum` during `phase` (pure)."""
  name = signal.Signals(signum).name
  how = (' again: ended at once' if again else
         f' (ended after {forced_s:g} s: the phase did not stop by itself)' if forced_s else '')
  return f'{PREFIX}{name}{how} during {phase.what}; {phase.then}.'


def current() -> Phase:
  with _S.lock:
    return _S.phases[-1]


def in_loop() -> bool:
  """Whether the training loop (checkpoint.StopSignal) is running."""
  with _S.lock:
    return any(p.loop for p in _S.phases)


def installed() -> bool:
  return _S.installed


def signalled() -> int | None:
  """The first signal received, None before any."""
  return _S.first


def raised() -> bool:
  """Whether Interrupted was raised in the main thread (it is unwinding from a signal)."""
  return _S.raised


def _poke() -> None:
  """Wakes the watchdog (byte 0 is no signal) to re-read the deadline."""
  if _S.wakeup is not None:
    with contextlib.suppress(OSError):
      os.write(_S.wakeup[1], b'\0')


def _arm() -> None:
  with _S.lock:
    if _S.deadline is None and _S.installed:
      _S.deadline = time.monotonic() + _S.grace_s
      _poke()


def _handler(signum: int, frame: Any) -> None:
  """The main thread's handler outside the training loop (see the module docstring)."""
  del frame
  with _S.lock:
    if _S.first is None:
      _S.first = signum
    if _S.in_hook:  # would be swallowed again: the watchdog delivers it again
      return
    redeliver, _S.redeliver = _S.redeliver, False
    if _S.phases[-1].defer or (_S.raised and not redeliver):
      return  # deferred, or already unwinding (a second signal is the watchdog's)
    _S.raised = True
    _S.stopped = _S.stopped or _S.phases[-1]
    first = _S.first
  _arm()
  raise Interrupted(first)


def _unraisable(unraisable: Any) -> None:
  """sys.unraisablehook: a swallowed Interrupted is delivered again, silently, by the watchdog
  (from another thread, so that it is raised once this callback context has returned)."""
  if isinstance(unraisable.exc_value, Interrupted) and _S.installed:
    _S.in_hook = True
    try:
      with _S.lock:
        _S.redeliver = True
      _poke()
    finally:
      _S.in_hook = False
    return
  (_S.previous_hook or sys.__unraisablehook__)(unraisable)


def _release_all() -> None:
  with _S.lock:
    callbacks = list(_S.on_exit.values())
  for release in callbacks:
    with contextlib.suppress(Exception):
      release()
  for stream in (sys.stdout, sys.stderr):  # what the run printed, before the line
    with contextlib.suppress(Exception):
      stream.flush()


def announce(signum: int, **kwargs: Any) -> None:
  """Writes the one line to stderr (only the first call writes). Straight to the file descriptor:
  the watchdog must not wait for a stream lock that a stuck main thread holds."""
  with _S.lock:
    if _S.announced:
      return
    _S.announced = True
    line = message(signum, _S.stopped or _S.phases[-1], **kwargs)
  with contextlib.suppress(OSError):
    os.write(2, (line + '\n').encode('utf-8', 'replace'))


def _end_now(signum: int, **kwargs: Any) -> None:
  """From the watchdog: release the leases and flush the output (at most RELEASE_S), write the
  line, os._exit(128 + signum)."""
  if not _S.exit_lock.acquire(blocking=False):
    return
  releasing = threading.Thread(target=_release_all, name='stop-release', daemon=True)
  releasing.start()
  releasing.join(RELEASE_S)
  announce(signum, **kwargs)
  os._exit(128 + signum)  # pylint: disable=protected-access


def _watch(read_fd: int) -> None:
  """The watchdog thread (see the module docstring)."""
  while True:
    with _S.lock:
      deadline, redeliver = _S.deadline, _S.redeliver and not _S.in_hook
      if redeliver and _S.first is not None:
        # A real signal to the main thread (not _thread.interrupt_main, which does not cut a
        # sleep short), sent again until its handler has raised (REDELIVER_S apart).
        _S.last_kill = time.monotonic()
        signal.pthread_kill(threading.main_thread().ident or 0, _S.first)
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    if _S.redeliver:
      timeout = REDELIVER_S if timeout is None else min(timeout, REDELIVER_S)
    ready, _, _ = select.select([read_fd], [], [], timeout)
    if not ready:
      if _S.deadline is not None and time.monotonic() >= _S.deadline:
        _end_now(_S.first or signal.SIGTERM, forced_s=_S.grace_s)
      continue
    for signum in os.read(read_fd, 256):
      with _S.lock:
        # 0: a poke. The echo of our own delivery is no new signal (a real second signal in that
        # moment is missed; the grace still ends the process).
        if signum == 0 or _S.redeliver or time.monotonic() - _S.last_kill < ECHO_S:
          continue
        _S.count += 1
        if _S.first is None:
          _S.first = signum
        again = _S.count > 1
        defer = _S.phases[-1].defer
        if not defer and _S.stopped is None:
          _S.stopped = _S.phases[-1]
      if again:
        _end_now(signum, again=True)
      elif not defer:
        _arm()


def _set_handlers() -> None:
  for s in SIGNALS:
    signal.signal(s, _handler)
  if _S.wakeup is not None:
    signal.set_wakeup_fd(_S.wakeup[1], warn_on_full_buffer=False)


def install(grace_s: float | None = None) -> None:
  """Takes over SIGTERM and SIGINT for the whole command (main thread; main.main calls it)."""
  if _S.installed or threading.current_thread() is not threading.main_thread():
    return
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)  # set_wakeup_fd's requirement
  _S.wakeup = (read_fd, write_fd)
  _S.grace_s = GRACE_S if grace_s is None else grace_s
  with contextlib.suppress(ValueError):
    _S.grace_s = float(os.environ.get(GRACE_ENV) or _S.grace_s)
  _S.previous_hook = sys.unraisablehook
  sys.unraisablehook = _unraisable
  _S.installed = True
  _set_handlers()
  threading.Thread(target=_watch, args=(read_fd,), name='stop-watchdog', daemon=True).start()


def reinstall() -> None:
  """Puts the handlers back: jax.distributed.initialize installs its own C-level SIGTERM handler,
  which would hold the signal for JAX's preemption service (docs/design.md, "Stopping")."""
  if _S.installed and threading.current_thread() is threading.main_thread():
    with _S.lock:
      loop = _S.phases[-1].loop
    if not loop:
      _set_handlers()


@contextlib.contextmanager
def phase(what: str, then: str, *, defer: bool = False, loop: bool = False) -> Iterator[Phase]:
  """Names the phase for the stop line; phases pushed inside are dropped at its end.

  Entering a phase that does not defer, after a deferred signal: raises Interrupted now."""
  entered = Phase(what, then, defer=defer, loop=loop)
  if _S.wakeup is not None and threading.current_thread() is threading.main_thread():
    signal.set_wakeup_fd(_S.wakeup[1], warn_on_full_buffer=False)  # in case a library took it
  with _S.lock:
    depth = len(_S.phases)
    _S.phases.append(entered)
    pending = (_S.installed and not defer and _S.first is not None and not _S.raised)
    if pending:
      _S.raised = True
      _S.stopped = _S.stopped or entered
  try:
    if pending:
      _arm()
      raise Interrupted(_S.first or signal.SIGTERM)
    yield entered
  finally:
    with _S.lock:
      del _S.phases[depth:]


def push(what: str, then: str, *, defer: bool = False, loop: bool = False) -> Phase:
  """A phase left open (ended by an enclosing `phase`, or `pop`)."""
  entered = Phase(what, then, defer=defer, loop=loop)
  with _S.lock:
    _S.phases.append(entered)
    if loop and not _S.raised:
      # A signal whose handler has not run yet (the main thread was in XLA) is the loop's now:
      # its handler gets it, and the loop saves and exits 0 as for any signal in it.
      _S.deadline, _S.stopped = None, None
  return entered


def pop(entered: Phase) -> None:
  """Ends `entered` and every phase pushed after it."""
  with _S.lock:
    for i in range(len(_S.phases) - 1, 0, -1):
      if _S.phases[i] is entered:
        del _S.phases[i:]
        return


@contextlib.contextmanager
def on_exit(release: Callable[[], None]) -> Iterator[None]:
  """`release` is called (at most RELEASE_S waited for) if the watchdog ends the process inside
  the block (lease.hold: the lease)."""
  key = id(release)
  with _S.lock:
    _S.on_exit[key] = release
  try:
    yield
  finally:
    with _S.lock:
      _S.on_exit.pop(key, None)


def exit_stopped(signum: int | None = None) -> None:
  """After the main thread unwound from a signal: the one line, then SystemExit(128 + signal).
  The watchdog stays armed: a hang at interpreter exit still ends within the grace."""
  signum = signum or _S.first or signal.SIGTERM
  _arm()
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  announce(signum)
  raise SystemExit(128 + signum)


def debug_pause(point: str) -> None:
  """Test-only hook (PAUSE_ENV=POINT[:how], tests/test_sigterm_phases.py): prints a marker on
  stdout and sleeps up to PAUSE_S at POINT, so a test can signal that phase. how='gc': the sleep
  runs inside a gc callback, where Python swallows exceptions; how='stuck': the sleep swallows
  Interrupted, like a library that catches everything. Unset (always outside tests): nothing."""
  name, _, how = os.environ.get(PAUSE_ENV, '').partition(':')
  if name != point:
    return
  marker = f'hmdlm_jax: debug: paused at {point}'
  end = time.monotonic() + PAUSE_S
  if how == 'gc':
    def sleep_in_gc(stage: str, info: Any) -> None:
      del info
      if stage == 'start':
        print(marker, flush=True)  # from inside the callback: the signal lands there
        time.sleep(max(0.0, end - time.monotonic()))
    gc.callbacks.append(sleep_in_gc)
    try:
      gc.collect()
    finally:
      gc.callbacks.remove(sleep_in_gc)
    return
  print(marker, flush=True)
  while time.monotonic() < end:
    try:
      time.sleep(max(0.0, end - time.monotonic()))
    except Interrupted:
      if how != 'stuck':
        raise
