"""Runs many command-line probes of hmdlm_jax.main / convert_mdlm for tests/test_faults.py.

  python -m tests.fault_driver PROBES.json RESULTS.json

The package is imported once; every probe then runs in a forked child exactly as the command line
runs it (`app.run(main.main, flags_parser=main.parse_flags)`, or `convert_mdlm.main`), with fresh
flags, its stdout / stderr captured at the file-descriptor level and its real exit status, so a
probe costs no Python start-up and no JAX import. JAX has not initialised a backend or started a
thread when the children fork (checked).

A probe (JSON object): name; entry ('main' | 'convert'); argv (argv[0] first); watch (paths whose
tree hash is taken before and after); nobody (run as uid/gid 65534 when the driver is root, so that
chmod-made read-only folders bind); block_modules (module names made unimportable, e.g. torch).
A result: rc, stdout, stderr, before / after (path -> tree hash or None), seconds, skipped (a reason
when the probe could not be set up, e.g. no permission to change user).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from typing import Any

from absl import app
import jax
from jax._src import xla_bridge

from hmdlm_jax import convert_mdlm
from hmdlm_jax import main as main_lib
from tests.conftest import REPO, dir_hash

NOBODY = 65534
SKIP_CODE = 77
TIMEOUT_S = 600.0


def _child(probe: dict[str, Any], out_path: str, err_path: str) -> None:
  """Runs one probe in this (forked) process and leaves with its exit status."""
  for fd, path in ((1, out_path), (2, err_path)):
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(target, fd)
    os.close(target)
  code = 0
  try:
    for name in probe.get('block_modules', ()):
      sys.modules[name] = None  # `import name` raises ImportError
    if probe.get('nobody') and os.geteuid() == 0:
      jax.config.update('jax_enable_compilation_cache', False)  # the cache folder is root's
      try:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
      except OSError as e:
        print(f'cannot change to uid {NOBODY}: {e}', file=sys.stderr)
        code = SKIP_CODE
        return
    os.chdir(probe.get('cwd', REPO))
    sys.argv = list(probe['argv'])
    if probe['entry'] == 'main':
      app.run(main_lib.main, argv=sys.argv, flags_parser=main_lib.parse_flags)
    else:
      convert_mdlm.main(sys.argv[1:])
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    code = 70
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access


def run_probe(probe: dict[str, Any], scratch: str) -> dict[str, Any]:
  out_path = os.path.join(scratch, f'{probe["name"]}.out')
  err_path = os.path.join(scratch, f'{probe["name"]}.err')
  watch = list(probe.get('watch', ()))
  before = {p: dir_hash(p) for p in watch}
  start = time.monotonic()
  sys.stdout.flush()
  sys.stderr.flush()
  pid = os.fork()
  if pid == 0:
    _child(probe, out_path, err_path)
  deadline = start + TIMEOUT_S
  status = None
  while status is None:
    done, st = os.waitpid(pid, os.WNOHANG)
    if done:
      status = st
    elif time.monotonic() > deadline:
      os.kill(pid, 9)
      status = os.waitpid(pid, 0)[1]
    else:
      time.sleep(0.02)
  rc = os.waitstatus_to_exitcode(status)
  with open(out_path, encoding='utf-8', errors='replace') as f:
    stdout = f.read()
  with open(err_path, encoding='utf-8', errors='replace') as f:
    stderr = f.read()
  return {'rc': rc, 'stdout': stdout, 'stderr': stderr, 'before': before,
          'after': {p: dir_hash(p) for p in watch}, 'seconds': time.monotonic() - start,
          'skipped': stderr.strip() if rc == SKIP_CODE else None}


def main(argv: list[str]) -> None:
  with open(argv[1], encoding='utf-8') as f:
    probes = json.load(f)
  if xla_bridge._backends:  # pylint: disable=protected-access
    raise RuntimeError('a JAX backend was initialised before forking the probes')
  results = {}
  with tempfile.TemporaryDirectory() as scratch:
    for probe in probes:
      results[probe['name']] = run_probe(probe, scratch)
      print(f'{probe["name"]}: rc={results[probe["name"]]["rc"]} '
            f'{results[probe["name"]]["seconds"]:.1f}s', flush=True)
  with open(argv[2], 'w', encoding='utf-8') as f:
    json.dump(results, f, indent=1)


if __name__ == '__main__':
  main(sys.argv)
