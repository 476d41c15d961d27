"""Progress of long loops: a tqdm bar on a terminal or notebook, plain log lines in a file.

A bar redrawn into a file (SLURM's .out, nohup.out, a pipe) is a run of '\r'-separated frames no
one can read, so when stderr is not a terminal each display is one absl INFO line instead, at most
one per `INTERVAL_S` (tqdm's own rate limit), plus a last one when a kept bar closes. `bar` is
every loop's bar (puzzle generation, evaluation batches); `TrainBar` the training loop's: steps
and ETA, or with train.time_budget_s the elapsed and remaining wall time (the step count of a
budgeted run is a ceiling it may never reach).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable

from absl import logging
from tqdm import auto as tqdm_auto
from tqdm import autonotebook
from tqdm import std as tqdm_std

INTERVAL_S = 30.0  # plain lines: often enough to see a run move, rare enough to read the log
_STEPS = ('{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]',
          '{desc}: {n_fmt}/{total_fmt} {unit}, {rate_fmt}, {elapsed} elapsed, '
          'ETA {remaining}{postfix}')
_TRAIN = (_STEPS[0], '{desc}: step {n_fmt}/{total_fmt}, {rate_fmt}, {elapsed} elapsed, '
          'ETA {remaining}{postfix}')
_COUNT = ('{desc}: {n_fmt} {unit} [{elapsed}, {rate_fmt}{postfix}]',
          '{desc}: {n_fmt} {unit}, {rate_fmt}, {elapsed} elapsed{postfix}')
_BUDGET = ('{desc}: {percentage:3.0f}%|{bar}| {elapsed} elapsed, {remaining} left{postfix}',
           '{desc}: {elapsed} elapsed, {remaining} left{postfix}')


def interactive() -> bool:
  """Whether a redrawn bar can be seen: stderr is a terminal, or a notebook runs the code."""
  return sys.stderr.isatty() or autonotebook.tqdm is not tqdm_std.tqdm  # notebook: its widget


class _Nowhere:
  """tqdm's output file in log-line mode: the lines go to absl logging, not to tqdm's writes."""

  def write(self, s: str) -> None:
    del s

  def flush(self) -> None:
    pass


class LogLines(tqdm_std.tqdm):
  """tqdm whose every display is one log line (never '\r'): a bar for logs that are files."""

  _logged = False

  def display(self, msg: str | None = None, pos: int | None = None) -> bool:
    del pos
    msg = self.__str__() if msg is None else msg
    if msg.strip():  # tqdm clears a bar that is not kept with an empty display
      logging.info('%s', ' '.join(msg.split()))  # tqdm pads numbers to a fixed width
      self._logged = True
    return True

  def close(self) -> None:
    if self._logged:  # tqdm skips the last display of a bar shown only by an explicit refresh
      self.delay = 0
    super().close()


class _Seconds:
  """Mixin of a bar that counts elapsed seconds: its rate is 1 by definition, so the time left is
  exact (tqdm's estimate of the rate is noise at the start)."""

  @property
  def format_dict(self) -> dict[str, Any]:
    return dict(super().format_dict, rate=1.0)  # type: ignore[misc]


def bar(iterable: Iterable[Any] | None = None, *, desc: str, unit: str, enabled: bool = True,
        total: float | None = None, initial: float = 0, leave: bool = True,
        formats: tuple[str, str] | None = None, seconds: bool = False,
        steady: bool = False) -> tqdm_std.tqdm:
  """A progress bar over `iterable` (a manual one when None; disabled: the bare loop).

  `formats` is (bar_format on a terminal, the plain line's format); default: count to `total`.
  `seconds`: the count is elapsed wall time (`update` adds seconds). `steady`: the rate is the
  bar's `steady_rate`, set by its owner (TrainBar), not tqdm's estimate.
  """
  fmt = formats or (_STEPS if total else _COUNT)
  kwargs = dict(total=total, initial=initial, desc=desc, unit=unit, leave=leave,
                disable=not enabled, smoothing=0.1)
  if interactive():
    cls, kwargs = tqdm_auto.tqdm, dict(kwargs, bar_format=fmt[0], dynamic_ncols=True)
  else:  # the first line after INTERVAL_S (`delay`): a loop shorter than that logs one at most
    cls, kwargs = LogLines, dict(kwargs, bar_format=fmt[1], file=_Nowhere(),
                                 mininterval=INTERVAL_S, miniters=1, delay=INTERVAL_S)
  if seconds or steady:
    cls = type(cls.__name__, (_Seconds if seconds else _Steady, cls), {})
  return cls(iterable, **kwargs)


class _Steady:
  """Mixin of the training bar: its rate, hence its ETA, is the one `TrainBar.finished` measures
  over the finished steps after the first (which compiles); none ('?') until it exists."""

  steady_rate: float = 0.0

  @property
  def format_dict(self) -> dict[str, Any]:
    return dict(super().format_dict, rate=self.steady_rate)  # type: ignore[misc]


class TrainBar:
  """The training loop's progress on process 0; `finished` shows each finished step's loss.

  Without a budget it counts steps to train.num_steps, its rate and ETA over the finished steps
  after the first; with train.time_budget_s > 0 it counts the budget's seconds (step in the
  postfix). Plain lines start when the first step has finished, whatever train.log_every is.
  """

  def __init__(self, num_steps: int, step: int, *, budget_s: float, enabled: bool,
               tokens_per_step: int = 0) -> None:
    self._budget = float(budget_s)
    self._t0 = time.monotonic()
    self._shown = interactive()
    self._tokens_per_step = int(tokens_per_step)
    self._first: tuple[int, float] | None = None  # (step, time) of the first finished step
    if self._budget:
      self._bar = bar(desc=f'train (budget {self._budget:g}s)', unit='s', total=self._budget,
                      enabled=enabled, formats=_BUDGET, seconds=True)
    else:
      self._bar = bar(desc='train', unit='step', total=int(num_steps), initial=int(step),
                      enabled=enabled, formats=_TRAIN, steady=True)

  def finished(self, step: int, loss: float) -> None:
    """Step `step` has finished with this loss (the loop fetches it one step late)."""
    now = time.monotonic()
    values = {'loss': loss}
    if self._first is None:
      self._first = (step, now)
    elif step > self._first[0] and now > self._first[1]:
      rate = (step - self._first[0]) / (now - self._first[1])
      if not self._budget:
        self._bar.steady_rate = rate
      if self._tokens_per_step:
        values['tok_s'] = rate * self._tokens_per_step
    self.postfix(step, **values)

  def update(self) -> None:
    """One step done."""
    if not self._budget:
      self._bar.update()
      return
    # The bar's count is the elapsed time, held below the total: past it tqdm drops the total.
    self._bar.update(min(time.monotonic() - self._t0, self._budget - 1e-3) - self._bar.n)

  def postfix(self, step: int, **values: float) -> None:
    shown = {'step': str(step)} if self._budget else {}
    self._bar.set_postfix(shown | {k: f'{v:.4g}' for k, v in values.items()}, refresh=False)
    if not self._shown:  # the first finished step: the first loss, when the compilation is over
      self._shown = True
      self._bar.refresh()
      self._bar.last_print_t = time.time()  # tqdm's clock: the next line INTERVAL_S later

  def close(self) -> None:
    self._bar.close()
