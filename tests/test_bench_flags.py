"""Benchmarks check their flags and their output path before they measure or write anything:
one error line `<prog>: error: --flag=value: ...`, exit code 2 (argparse's), and a tracked results
file is never replaced without --update_results (benchmarks/common.py: Parser, check,
output_path). No benchmark runs here: every case stops before work starts."""

import hashlib
import os
import subprocess
import sys

import pytest

from benchmarks import aot
from benchmarks import common
from benchmarks import corpus_loader
from benchmarks import side_by_side

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _results_digest() -> dict[str, str]:
  """sha256 of every file under benchmarks/results (tracked or not)."""
  root = os.path.join(REPO, 'benchmarks', 'results')
  return {n: hashlib.sha256(open(os.path.join(root, n), 'rb').read()).hexdigest()
          for n in sorted(os.listdir(root))}


@pytest.mark.parametrize('flags, flag', [
    (['--runners=bogus'], '--runners=bogus: unknown runner'),
    (['--rounds=0'], '--rounds=0: must be > 0'),
    (['--steps=-1'], '--steps=-1: must be > 0'),
    (['--runners=md4'], '--runners=md4: runner md4 needs --reference_tree=md4:PATH'),
])
def test_side_by_side_rejects_nonsense_flags_before_writing(flags, flag):
  """The issue's probes: `--runners=bogus` and `--rounds=0` exited 0 and rewrote the results."""
  before = _results_digest()
  proc = subprocess.run([sys.executable, '-m', 'benchmarks.side_by_side', '--shape=small', *flags],
                        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      f'python -m benchmarks.side_by_side: error: {flag}'), proc.stderr
  assert not proc.stdout
  assert _results_digest() == before


def test_a_tracked_results_file_is_not_replaced_without_update_results(capsys):
  """Each tool whose default output is a published (tracked) result refuses it, with one line."""
  tracked = os.path.join(REPO, 'benchmarks', 'results', 'side_by_side_small_dec01.json')
  assert common.is_tracked(tracked)
  before = _results_digest()
  for main, argv in ((side_by_side.main, ['--shape=small', '--tag=dec01']),
                     (side_by_side.main, ['--shape=small', f'--json={tracked}']),
                     (aot.main, []),
                     (corpus_loader.main, [])):
    with pytest.raises(SystemExit) as e:
      main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'a tracked results file' in err[0] and '--update_results' in err[0]
  assert _results_digest() == before
  assert not common.is_tracked(os.path.join(REPO, 'benchmarks', 'results', 'no_such_run.json'))


def test_outside_a_git_checkout_results_count_as_tracked(monkeypatch):
  """An unpacked copy (no git, or not a work tree) still protects benchmarks/results."""

  def no_git(*args, **kwargs):
    raise FileNotFoundError('git')

  monkeypatch.setattr(common.subprocess, 'run', no_git)
  assert common.is_tracked(os.path.join(REPO, 'benchmarks', 'results', 'anything.json'))
  assert not common.is_tracked(os.path.join(REPO, 'elsewhere.json'))
  assert not common.is_tracked('/tmp/out.json')
