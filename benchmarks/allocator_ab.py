r"""Whole-command A/B of the allocator settings of hmdlm_jax/runtime.py (issue 14, item 3).

  python -m benchmarks.allocator_ab --runs=3 --allocators=default,glibc,mallopt -- \
      python -m hmdlm_jax.main --config=configs/sudoku.py --workdir=/tmp/x \
      --config.train.num_steps=100 --config.train.final_eval=False

Allocators: default (none), glibc (GLIBC_TUNABLES), tcmalloc (LD_PRELOAD), mallopt (the command
`python -m M ARGS` is run as `python -m hmdlm_jax.runtime run M ARGS`: mallopt() in the process
before M starts, what `runtime.configure_allocator()` at the top of main.py will do).
Runs the command `--runs` times under each allocator, interleaved (default glibc tcmalloc default
...), each run in a fresh work directory (a `--workdir=` argument gets a per-run suffix, so no
run resumes another's checkpoint), and reports per run the wall time and the child's user and
system CPU seconds, minor page faults and peak RSS (getrusage of the finished child), then the
medians per allocator. Writes benchmarks/results/allocator_ab.json (or --json).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from hmdlm_jax import runtime  # pylint: disable=g-import-not-at-top  (no JAX import)


def env_for(allocator: str) -> dict[str, str]:
  env = dict(os.environ)
  for k in ('GLIBC_TUNABLES', 'LD_PRELOAD', runtime.MARKER):
    env.pop(k, None)
  if allocator not in ('default', 'mallopt'):
    extra = runtime.allocator_env(allocator)
    if not extra:
      raise SystemExit(f'allocator {allocator!r} is not available here')
    env.update(extra)
  env[runtime.MARKER] = allocator  # the entry point must not re-exec/re-tune
  return env


def run_once(cmd: list[str], allocator: str, tag: str) -> dict[str, Any]:
  cmd = [c + tag if c.startswith('--workdir=') else c for c in cmd]
  if allocator == 'mallopt':  # python -m M ... -> python -m hmdlm_jax.runtime run M ...
    if len(cmd) < 3 or cmd[1] != '-m':
      raise SystemExit("allocator 'mallopt' needs a 'python -m MODULE ...' command")
    cmd = [cmd[0], '-m', 'hmdlm_jax.runtime', 'run'] + cmd[2:]
  for c in cmd:
    if c.startswith('--workdir='):
      shutil.rmtree(c.split('=', 1)[1], ignore_errors=True)
  r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=_REPO, env=env_for(allocator), capture_output=True, text=True,
                        check=False)
  wall = time.perf_counter() - t0
  r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
  rec = {'allocator': allocator, 'returncode': proc.returncode, 'wall_s': wall,
         'user_s': r1.ru_utime - r0.ru_utime, 'sys_s': r1.ru_stime - r0.ru_stime,
         'minflt': r1.ru_minflt - r0.ru_minflt, 'majflt': r1.ru_majflt - r0.ru_majflt,
         'max_rss_mb': r1.ru_maxrss / 1024}  # max over children so far (monotone)
  rec['sys_share'] = rec['sys_s'] / max(rec['user_s'] + rec['sys_s'], 1e-9)
  if proc.returncode:
    rec['stderr_tail'] = proc.stderr[-2000:]
  return rec


def main(argv: list[str] | None = None) -> dict[str, Any]:
  argv = sys.argv[1:] if argv is None else argv
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  p = common.Parser(prog='python -m benchmarks.allocator_ab',
                    description=__doc__.split('\n\n')[0])
  p.add_argument('--runs', type=int, default=3)
  p.add_argument('--allocators', default='default,glibc,mallopt')
  common.add_output_flags(p, os.path.join(common.RESULTS, 'allocator_ab.json'))
  if '--' not in argv:
    p.error('-- COMMAND ...: missing (the command to time follows --)')
  i = argv.index('--')
  a = p.parse_args(argv[:i])
  cmd = argv[i + 1:]
  allocs = a.allocators.split(',')
  common.check(p, a.runs > 0, '--runs', a.runs, 'must be > 0')
  common.check(p, all(allocs), '--allocators', a.allocators, 'a comma-separated non-empty list')
  common.check(p, bool(cmd), '--', '', 'give the COMMAND to run')
  path = common.output_path(p, a, os.path.join(common.RESULTS, 'allocator_ab.json'))
  recs = []
  t0 = time.perf_counter()
  for r in range(a.runs):
    for al in allocs:
      rec = run_once(cmd, al, f'_{al}_{r}')
      rec['run'] = r
      recs.append(rec)
      print(json.dumps(rec), flush=True)
  summary = {}
  for al in allocs:
    ok = [x for x in recs if x['allocator'] == al and x['returncode'] == 0]
    if ok:
      summary[al] = {k: statistics.median(x[k] for x in ok)
                     for k in ('wall_s', 'user_s', 'sys_s', 'sys_share', 'minflt')}
      summary[al]['runs'] = len(ok)
  text = common.table('Allocator A/B (medians over runs)',
                      ['allocator', 'runs', 'wall s', 'user s', 'sys s', 'sys share',
                       'minor faults'],
                      [[al, s['runs'], s['wall_s'], s['user_s'], s['sys_s'], s['sys_share'],
                        float(s['minflt'])] for al, s in summary.items()])
  print(text)
  out = {'command': cmd, 'runs': recs, 'summary': summary, 'table': text,
         'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'), 'duration_s': time.perf_counter() - t0,
         'load_average_end': os.getloadavg()}
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(out, f, indent=1)
  return out


if __name__ == '__main__':
  main()
