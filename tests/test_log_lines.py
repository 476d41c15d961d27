"""The training loop's plain progress lines tell the truth (hmdlm_jax/progress.py TrainBar).

Each line carries the loss of the latest finished step (not of the last log point), a rate and an
ETA over the finished steps after the first (which compiles), and the first line comes when the
first step has finished, whatever train.log_every is. Clocks are replaced by a fake one.
"""

from __future__ import annotations

import re

import pytest

from hmdlm_jax import progress


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
  return [r.getMessage() for r in caplog.records if r.getMessage().startswith('train: step')]


def test_lines_show_the_latest_loss_and_a_rate_without_the_compilation(monkeypatch, caplog):
  assert not progress.interactive()  # pytest captures stderr: plain log lines
  clock = [1000.0]
  monkeypatch.setattr(progress.time, 'monotonic', lambda: clock[0])
  with caplog.at_level('INFO', logger='absl'):
    bar = progress.TrainBar(101, 0, budget_s=0.0, enabled=True, tokens_per_step=64)
    bar.update()
    clock[0] += 90.0  # the first step compiles
    bar.finished(1, 7.25)
    first = _lines(caplog)
    assert len(first) == 1, first  # at once, not INTERVAL_S or a log point later
    assert re.search(r'train: step 1/101, \?step/s, .* ETA \?, loss=7\.25$', first[0]), first
    for step in range(2, 12):
      bar.update()
      clock[0] += 0.5
      bar.finished(step, 7.25 - 0.1 * step)
    bar._bar.refresh()  # pylint: disable=protected-access  # the next 30-second line
    bar.close()
  line = _lines(caplog)[-1]
  # 10 steps in 5 s after the first: 2 steps/s, 90 steps left: 45 s; loss of step 11.
  assert re.search(r'train: step 11/101, 2\.00step/s, .* ETA 00:45, loss=6\.15, tok_s=128$',
                   line), line


def test_a_resumed_run_measures_from_its_own_first_step(monkeypatch, caplog):
  clock = [0.0]
  monkeypatch.setattr(progress.time, 'monotonic', lambda: clock[0])
  with caplog.at_level('INFO', logger='absl'):
    bar = progress.TrainBar(1000, 500, budget_s=0.0, enabled=True)
    for step in range(501, 505):
      bar.update()
      clock[0] += 60.0 if step == 501 else 0.25  # restore + compile, then 4 steps/s
      bar.finished(step, 1.0)
    bar._bar.refresh()  # pylint: disable=protected-access
    bar.close()
  line = _lines(caplog)[-1]
  assert re.search(r'train: step 504/1000, 4\.00step/s, .* ETA 02:04, loss=1$', line), line
