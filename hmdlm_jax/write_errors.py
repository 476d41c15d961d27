"""A write that the disk refuses (full, over quota, over the file-size limit, not permitted).

`WriteError` is the one error line main.py prints for it: the path, what the system said and what
to do; rerunning the command resumes from the last checkpoint (every file is written atomically or
appended whole, hmdlm_jax/storage.py). `from_exception` recognises such a failure in an OSError or
in the message of a TensorStore error (Orbax's checkpoint writes).

The libraries report the same failure on their own as well, from their threads: Orbax logs it with
its traceback, asyncio logs the tasks that Orbax's event loop abandoned, and TensorStore's writes
that end after that loop closed print 'Event loop is closed' (writes nothing awaits any more).
`quiet_library_reports` drops exactly those reports, so the program's line is the only one.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
import threading
import traceback
from typing import Any

# errno -> (what the system said, what to do)
_KINDS = {
    errno.ENOSPC: ('no space left on device', 'free space on that disk'),
    errno.EDQUOT: ('disk quota exceeded', 'raise the quota or free space in it'),
    errno.EFBIG: ('file larger than the file-size limit', 'raise the file-size limit (ulimit -f)'),
    errno.EACCES: ('permission denied', 'fix the permissions'),
    errno.EPERM: ('operation not permitted', 'fix the permissions'),
    errno.EROFS: ('read-only file system', 'make it writable'),
}
_TS_CODE = re.compile(r"\[os_error_code='(\d+)'\]")


class WriteError(OSError):
  """A refused write: `str()` is the error line's message (path, reason, what to do)."""

  def __init__(self, code: int, path: str) -> None:
    what, todo = _KINDS[code]
    super().__init__(code, what, path)
    self.message = (f'cannot write {path}: {what} ({errno.errorcode[code]}); {todo} or choose '
                    'another --workdir / --out, then rerun the same command (training resumes '
                    'from its last checkpoint).')

  def __str__(self) -> str:
    return self.message


def _code(e: BaseException) -> int | None:
  if isinstance(e, OSError) and e.errno in _KINDS:
    return e.errno
  match = _TS_CODE.search(str(e))
  return int(match.group(1)) if match and int(match.group(1)) in _KINDS else None


def from_exception(e: BaseException, path: str) -> WriteError | None:
  """The WriteError naming `path` when `e` (or an exception it was raised from) is a refused
  write; None otherwise."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, WriteError):
      return e
    code = _code(e)
    if code is not None:
      return WriteError(code, path)
    e = e.__cause__ or e.__context__
  return None


# ------------------------------------------------------------------------- the libraries' reports

_OWN = f'{os.sep}hmdlm_jax{os.sep}'
_seen = threading.Event()  # a refused write was reported by a library in this process


def _is_refused(exc: BaseException | None) -> bool:
  return exc is not None and from_exception(exc, '') is not None


def _closed_loop(exc: BaseException | None) -> bool:
  """Asyncio's answer to a TensorStore write that ended after the event loop awaiting it closed
  (Orbax closes it when one write of a checkpoint fails): nothing awaits that write any more."""
  if not isinstance(exc, RuntimeError) or str(exc) != 'Event loop is closed':
    return False
  frames = traceback.extract_tb(exc.__traceback__)
  return any(f.name == 'call_soon_threadsafe' for f in frames)


class _DropRefusedWrites(logging.Filter):
  """Drops a library's log record of a refused write (its traceback included), and asyncio's
  records of the tasks abandoned after one."""

  def filter(self, record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    if _OWN in record.pathname:  # this program's records (its --verbosity=1 traceback) pass
      return True
    if _is_refused(exc):
      _seen.set()
      return False
    return not (_seen.is_set() and record.name == 'asyncio')


def quiet_library_reports(handler: logging.Handler) -> None:
  """Installs the filter on `handler` (absl's) and the unraisable / thread hooks (idempotent)."""
  if not any(isinstance(f, _DropRefusedWrites) for f in handler.filters):
    handler.addFilter(_DropRefusedWrites())
  if getattr(sys.unraisablehook, '_hmdlm', False):
    return
  previous_unraisable, previous_thread = sys.unraisablehook, threading.excepthook

  def unraisable(info: Any) -> None:
    if _is_refused(info.exc_value) or _closed_loop(info.exc_value):
      _seen.set()
      return
    previous_unraisable(info)

  def thread_hook(args: Any) -> None:
    if _is_refused(args.exc_value):
      _seen.set()
      return
    previous_thread(args)

  unraisable._hmdlm = True  # type: ignore[attr-defined]
  sys.unraisablehook, threading.excepthook = unraisable, thread_hook
