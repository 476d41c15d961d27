"""Running a benchmark module in a fresh process, printing tables, reading experiment overrides,
and the one way a benchmark or script checks its flags and where it writes (`Parser`, `check`,
`add_output_flags`, `output_path`).

Every measurement runs in its own Python process: XLA flags and the fake-device count must be set
before JAX starts, and the process's peak RSS is then the peak of that configuration alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, NoReturn, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


RESULTS = os.path.join('benchmarks', 'results')


class Parser(argparse.ArgumentParser):
  """argparse whose every mistake is one line `<prog>: error: <message>` and exit code 2 (argparse's
  own code), so a bad flag stops the tool before it measures or writes anything."""

  def error(self, message: str) -> NoReturn:  # type: ignore[override]
    print(f'{self.prog}: error: {message}', file=sys.stderr)
    sys.exit(2)


def check(parser: argparse.ArgumentParser, ok: bool, flag: str, value: Any, why: str) -> None:
  """`parser.error('--flag=value: why')` unless `ok`."""
  if not ok:
    parser.error(f'{flag}={value}: {why}')


def is_tracked(path: str) -> bool:
  """Whether `path` is a file git tracks in this repository; outside a git checkout (an unpacked
  copy), every file under benchmarks/results counts as tracked, since those are the published
  results."""
  rel = os.path.relpath(os.path.abspath(path), REPO)
  if rel.startswith(os.pardir + os.sep) or rel == os.pardir:
    return False
  try:
    inside = subprocess.run(['git', 'rev-parse', '--is-inside-work-tree'], cwd=REPO,
                            capture_output=True, check=False).returncode == 0
  except FileNotFoundError:  # no git on this machine
    inside = False
  if not inside:
    return rel.startswith(RESULTS + os.sep)
  return subprocess.run(['git', 'ls-files', '--error-unmatch', rel], cwd=REPO,
                        capture_output=True, check=False).returncode == 0


def add_output_flags(parser: argparse.ArgumentParser, default: str) -> None:
  """--json=PATH and --update_results; `default` (relative to the repository) is named in help."""
  parser.add_argument('--json', default=None,
                      help=f'output path (default {default}; a tracked file needs --update_results)')
  parser.add_argument('--update_results', action='store_true',
                      help='allow replacing a tracked results file')


def output_path(parser: argparse.ArgumentParser, args: argparse.Namespace, default: str) -> str:
  """The output path of `args` (--json, else `default` relative to the repository); a tracked
  file is the parser's error unless --update_results, so a rerun never silently replaces the
  published numbers."""
  path = os.path.abspath(args.json) if args.json else os.path.join(REPO, default)
  if not args.update_results and is_tracked(path):
    flag = f'--json={args.json}' if args.json else f'--json={default} (the default)'
    parser.error(f'{flag}: a tracked results file; give --json=ANOTHER_PATH, or '
                 '--update_results to replace it')
  return path


class BenchmarkError(RuntimeError):
  """A benchmark subprocess failed; the message holds its command and the end of its stderr."""


def run_module(module: str, args: Sequence[str], *, devices: int = 1, xla_flags: str = '',
               timeout_s: float = 3600.0) -> Any:
  """`python -m module args --json=TMP` on CPU with `devices` fake devices; returns the JSON."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, 'out.json')
    env = dict(os.environ)
    flags = [f for f in env.get('XLA_FLAGS', '').split() if 'device_count' not in f]
    flags.append(f'--xla_force_host_platform_device_count={devices}')
    if xla_flags:
      flags.extend(xla_flags.split())
    env.update(XLA_FLAGS=' '.join(flags), PYTHONPATH=REPO + os.pathsep + env.get('PYTHONPATH', ''),
               TF_CPP_MIN_LOG_LEVEL='2')
    env.setdefault('JAX_PLATFORMS', 'cpu')
    cmd = [sys.executable, '-m', module, *args, f'--json={out}']
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if proc.returncode != 0:
      raise BenchmarkError(f'{" ".join(cmd)} (XLA_FLAGS={env["XLA_FLAGS"]!r}) failed with code '
                           f'{proc.returncode} after {time.perf_counter() - t0:.0f}s:\n'
                           f'{proc.stderr[-3000:]}')
    with open(out, encoding='utf-8') as f:
      return json.load(f)


def experiment(name: str, overrides: Sequence[str] = ()) -> Any:
  """configs/<name> of this repository (`lm1b.py`, or `multimdm_sudoku.py:cont`) with
  `--config.section.field=value` overrides: `hmdlm_jax.config.load`, the one loader (not yet
  resolved: change it before `config_lib.resolve`, never after)."""
  from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  return config_lib.load(os.path.join(REPO, 'configs', name), list(overrides))


def parse_with_overrides(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
  """A tool's own flags plus the experiment overrides `--config.section.field=value`, in order.

  The overrides are the dialect of `python -m hmdlm_jax.main` and are read by
  `hmdlm_jax.config.load(spec, overrides)`, the one loader; any other unknown argument is the
  parser's usage error (exit 2).
  """
  from hmdlm_jax.config import loading  # pylint: disable=g-import-not-at-top  (no JAX import)
  args, rest = parser.parse_known_args(argv)
  bad = [a for a in rest if not a.startswith(loading.OVERRIDE_PREFIXES)]
  if bad:
    parser.error(f'unrecognized arguments: {" ".join(bad)} (experiment fields are overridden as '
                 '--config.section.field=value)')
  return args, rest


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A plain-text table (also valid Markdown)."""

  def fmt(v: Any) -> str:
    if v is None:
      return '—'
    if isinstance(v, float):
      if v == 0 or 0.01 <= abs(v) < 1e5:
        return f'{v:.3g}' if abs(v) < 100 else f'{v:.0f}'
      return f'{v:.3g}'
    return str(v)

  cells = [[fmt(v) for v in r] for r in rows]
  widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
            for i, h in enumerate(header)]
  line = lambda r: '| ' + ' | '.join(s.ljust(w) for s, w in zip(r, widths)) + ' |'
  out = [f'\n### {title}\n', line(header), '|' + '|'.join('-' * (w + 2) for w in widths) + '|']
  out += [line(r) for r in cells]
  return '\n'.join(out)
