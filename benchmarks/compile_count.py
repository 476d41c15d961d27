"""Counting XLA compilations (JAX's backend-compile event) by function name.

Used by the benchmarks (compilations seen during timed steps must be 0) and by the tests that
check that the train and evaluation steps compile once.
"""

from __future__ import annotations

from typing import Any

import jax
from jax._src import dispatch  # BACKEND_COMPILE_EVENT: the name of JAX's compile event


class CompileCounter:
  """Counts XLA compilations (JAX's backend-compile event) by function name."""

  def __init__(self) -> None:
    self.events: list[tuple[str, float]] = []
    jax.monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
    if event == dispatch.BACKEND_COMPILE_EVENT:
      self.events.append((str(kwargs.get('fun_name', '?')), float(duration)))

  def count(self, name_contains: str = '') -> int:
    return sum(1 for n, _ in self.events if name_contains in n)


_COUNTER: CompileCounter | None = None


def compile_counter() -> CompileCounter:
  """The process-wide counter (listeners cannot be unregistered, so there is one)."""
  global _COUNTER
  if _COUNTER is None:
    _COUNTER = CompileCounter()
  return _COUNTER
