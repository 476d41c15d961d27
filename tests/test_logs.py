"""What a run prints when nobody watches it: short lines, plain progress lines, no noise.

A tiny Sudoku run (train with its final evaluation, then --mode=eval and --mode=sample), each with
stdout and stderr to pipes as under SLURM or nohup; the training evaluation's log line, the time
budget's progress and the one `±` helper are also checked in-process.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import REPO, main_cmd, read_jsonl, subprocess_env

MAX_LINE = 300
STEPS = 3
PUZZLE = '53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79'


@pytest.fixture(scope='module')
def outputs(tmp_path_factory: pytest.TempPathFactory, puzzle_cache: str,
            jax_cache: str) -> dict[str, str]:
  """{mode: stdout + stderr} of a 3-step train with its final evaluation (every Sudoku metric),
  then --mode=eval and --mode=sample on its checkpoint."""
  tmp = tmp_path_factory.mktemp('logs')
  workdir = str(tmp / 'run')
  out = {}
  for mode, extra in (('train', ('--config.train.final_eval=True',)), ('eval', ()),
                      ('sample', (f'--inputs={PUZZLE}',))):
    env = subprocess_env(jax_cache)
    if mode == 'eval':  # as on a host that never set JAX_PLATFORMS (JAX looks for libtpu)
      del env['JAX_PLATFORMS']
    cmd = main_cmd(workdir, puzzle_cache, f'--config.train.num_steps={STEPS}',
                   f'--config.train.ckpt_every={STEPS}', f'--mode={mode}', *extra,
                   *(() if mode == 'train' else (f'--out={tmp / mode}',)))
    proc = subprocess.run(cmd, cwd=REPO, env=env, timeout=180, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, f'{mode} failed:\n{proc.stderr[-3000:]}'
    out[mode] = proc.stdout + proc.stderr
  return out


def test_no_line_is_long(outputs: dict[str, str]) -> None:
  for mode, text in outputs.items():
    longest = max(text.split('\n'), key=len)  # a bar's '\r' redraws are one line in a file
    assert len(longest) <= MAX_LINE, f'{mode}: a line of {len(longest)} characters: {longest[:200]}'


def test_progress_is_plain_lines_without_a_terminal(outputs: dict[str, str]) -> None:
  for mode, text in outputs.items():
    assert '\r' not in text, f'{mode} redraws a progress bar into a pipe'
  steps = re.findall(rf'train: step (\d+)/{STEPS}, .* elapsed, ETA [\d:]+, loss=[\d.]+, '
                     'tok_s=', outputs['train'])
  assert steps and steps[-1] == str(STEPS), outputs['train'][-3000:]


def test_one_seed_shows_no_error_bar(outputs: dict[str, str]) -> None:
  for mode in ('train', 'eval'):
    assert 'seeds [0]' in outputs[mode] and 'cell acc ' in outputs[mode]
    assert '±' not in outputs[mode]


def test_the_training_evaluation_logs_one_short_line(tmp_path, caplog) -> None:
  """Every metric goes to metrics.jsonl; the log says how many, not what they are."""
  from hmdlm_jax import metrics  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import train  # pylint: disable=g-import-not-at-top
  scalars = {f'greedy/per_seed/{s}/cell_accuracy_level_{k}': 0.5 for s in range(4)
             for k in range(40)}
  writer = metrics.MetricsWriter(str(tmp_path), tensorboard=False)
  with caplog.at_level('INFO', logger='absl'):
    train.run_evaluation(None, None, 7, str(tmp_path), writer, lambda *_: scalars)
  writer.close()
  assert len(read_jsonl(str(tmp_path / 'metrics.jsonl'))[0]) == 3 + len(scalars) + 1
  lines = [r.getMessage() for r in caplog.records]
  assert lines and max(len(line) for line in lines) <= MAX_LINE, lines
  assert any(f'{len(scalars) + 1} scalars' in line for line in lines), lines


def test_library_noise_is_filtered(outputs: dict[str, str]) -> None:
  for mode in ('eval', 'sample'):
    text = outputs[mode]
    assert f'of step {STEPS}' in text
    for noise in ('read_only=True', 'Given directory is read only', 'libtpu'):
      assert noise not in text, f'{mode}: {noise!r} in\n{text}'


def test_time_budget_shows_the_time_left(caplog: pytest.LogCaptureFixture) -> None:
  from hmdlm_jax import progress  # pylint: disable=g-import-not-at-top
  assert not progress.interactive()  # pytest captures stderr
  with caplog.at_level('INFO', logger='absl'):
    bar = progress.TrainBar(10_000_000, 0, budget_s=3600.0, enabled=True)
    bar.update()
    bar.postfix(1, loss=2.5, tok_s=1000.0)
    bar.close()
  lines = [r.getMessage() for r in caplog.records if 'train' in r.getMessage()]
  assert lines and all('10000000' not in line for line in lines), lines
  assert re.fullmatch(r'train \(budget 3600s\): 00:0\d elapsed, (59:5\d|1:00:00) left, step=1, '
                      r'loss=2.5, tok_s=1000', lines[0]), lines


@pytest.mark.parametrize('count, expect', [(1, '81.25%'), (3, '81.25% ± 1.50')])
def test_error_bar_only_over_several_values(count: int, expect: str) -> None:
  from hmdlm_jax.evaluation import reports  # pylint: disable=g-import-not-at-top
  assert reports.mean_pm(0.8125, 0.015, digits=2, count=count, scale=100, suffix='%') == expect
  assert reports.mean_pm(None, 0.1, digits=2, count=count) == 'n/a'
  assert reports.mean_pm(1.0, float('nan'), digits=1, count=count) == '1.0'
