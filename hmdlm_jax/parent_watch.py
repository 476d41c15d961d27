"""Helper processes end with the process that started them, even when it is killed (SIGKILL).

Grain's data workers (`mp_prefetch`) and the puzzle / shard pools are spawned children. A parent
killed without cleanup leaves them running under PID 1, holding memory and the run's output pipes
(a caller reading them never sees end of file). Neither Grain nor multiprocessing ends them, and
prctl(PR_SET_PDEATHSIG) fires when the creating *thread* exits (Grain starts its workers from a
thread pool), so each helper runs a daemon thread that exits the process once its parent is gone.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any, Callable

POLL_S = 0.25


def exit_with_parent(parent_pid: int, *unused: Any) -> None:
  """In a helper process: exit as soon as `parent_pid` is no longer its parent (extra arguments,
  e.g. Grain's worker index and count, are ignored)."""
  del unused

  def watch() -> None:
    while os.getppid() == parent_pid:
      time.sleep(POLL_S)
    os._exit(1)  # the parent is gone: nobody reads what this process would produce

  threading.Thread(target=watch, name='exit-with-parent', daemon=True).start()


def initializer(then: Callable[[], None] | None = None) -> Callable[..., None]:
  """A picklable initializer for a helper started from this process: `exit_with_parent` on this
  process, then `then()` when given."""
  watch = functools.partial(exit_with_parent, os.getpid())
  return watch if then is None else functools.partial(_run_both, watch, then)


def _run_both(first: Callable[..., None], then: Callable[[], None], *args: Any) -> None:
  first(*args)
  then()
