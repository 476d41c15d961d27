"""Metric sinks of the training loop: DIR/metrics.jsonl, TensorBoard (DIR/tb), Weights & Biases
(optional, `train.wandb`) and a progress bar.

metrics.jsonl holds one JSON object per line and per logged step:
  {"step": int, "split": "train" | "eval", "time": unix seconds, <scalar name>: float, ...}
Train lines carry at least `loss`, `lr`, `grad_norm`, `steps_per_s`, `tokens_per_s`, the loss terms
returned by `losses.diffusion_loss` (e.g. `lm`, `hier`, `cons`) and the NaN-guard counters
`bad_steps` (consecutive skipped steps) and `skipped_steps` (total). Only process 0 writes.
Non-finite values are written as the strings "nan" / "inf" / "-inf" (JSON has no NaN).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import socket
import struct
import time
from typing import Any, Mapping

import jax
import numpy as np

from hmdlm_jax import lease as lease_lib
from hmdlm_jax import storage

REQUIRED_TRAIN_KEYS: tuple[str, ...] = ('step', 'split', 'loss', 'lr', 'grad_norm', 'steps_per_s',
                                        'tokens_per_s')
_TB_ILLEGAL = re.compile(r'[^-/\w.]')  # characters a TensorBoard tag may not hold
WANDB_INSTALL = 'pip install "hmdlm_jax[wandb]"'  # the `wandb` extra (pyproject.toml)


def tb_tag(name: str) -> str:
  """The TensorBoard tag of a metric name: illegal characters (e.g. '=' in 't=1.0') -> '_'.

  The same tag tensorboardX would make, without its log line for every such scalar.
  """
  return _TB_ILLEGAL.sub('_', name).lstrip('/')


def to_scalars(tree: Mapping[str, Any]) -> dict[str, float]:
  """Host floats from a flat dict of scalar (device or numpy) values; fetches in one transfer."""
  host = jax.device_get(dict(tree))
  out = {}
  for k, v in host.items():
    a = np.asarray(v)
    if a.size != 1:
      raise ValueError(f'metric {k!r} has shape {a.shape}; only scalars can be logged.')
    out[k] = float(a.reshape(()))
  return out


def json_value(v: Any) -> Any:
  """A float as JSON can hold it: non-finite values become "nan" / "inf" / "-inf"."""
  if isinstance(v, float) and not math.isfinite(v):
    return 'nan' if math.isnan(v) else ('inf' if v > 0 else '-inf')
  return v


class TensorBoardEvents:
  """One TensorBoard event file, written in the caller's thread, one whole append per step.

  tensorboardX's SummaryWriter writes from a thread of its own and flushes again at exit, where a
  write the disk refuses can only print a traceback; here every write raises in the training loop
  (storage.Appended). The events are tensorboardX's protos in its record framing.
  """

  def __init__(self, directory: str) -> None:
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    self._event = event_pb2.Event
    storage.makedirs(directory)
    now = time.time()
    name = f'events.out.tfevents.{int(now)}.{socket.gethostname()}'
    self._file = storage.open_append(storage.join(directory, name))
    self._append([self._event(wall_time=now, file_version='brain.Event:2')])

  def _append(self, events: list[Any]) -> None:
    from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
    out = bytearray()
    for event in events:
      data = event.SerializeToString()
      header = struct.pack('Q', len(data))
      out += header + struct.pack('I', record_writer.masked_crc32c(header))
      out += data + struct.pack('I', record_writer.masked_crc32c(data))
    self._file.write(bytes(out))
    self._file.flush()

  def scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    from tensorboardX import summary  # pylint: disable=g-import-not-at-top
    now = time.time()
    self._append([self._event(wall_time=now, step=int(step), summary=summary.scalar(k, float(v)))
                  for k, v in scalars.items()])

  def close(self) -> None:
    self._file.close()


def check_wandb(spec: str) -> None:
  """Raises ValueError unless `train.wandb` is '' (off) or 'PROJECT[/RUN_NAME]' with wandb
  installed (preflight: before anything is written)."""
  if not spec:
    return
  parts = spec.split('/')
  if len(parts) > 2 or not all(p.strip() for p in parts):
    raise ValueError(f"train.wandb={spec!r} must be 'PROJECT' or 'PROJECT/RUN_NAME' ('' = off).")
  if importlib.util.find_spec('wandb') is None:
    raise ValueError(f"train.wandb={spec!r} needs the wandb package, which is not installed: "
                     f"{WANDB_INSTALL} (or set train.wandb='').")


def start_wandb(spec: str, workdir: str, record: Mapping[str, Any] | None = None) -> Any:
  """A wandb run for `train.wandb` = 'PROJECT[/RUN_NAME]' holding the config `record`.

  Its files go to WANDB_DIR when set, else into a local workdir (DIR/wandb). Every start is a new
  wandb run under the same name: a resumed run repeats the steps after its last checkpoint, which
  one wandb run would refuse (its steps must increase).
  """
  import wandb  # pylint: disable=g-import-not-at-top  (optional: the `wandb` extra)
  project, _, name = spec.partition('/')
  local = 'WANDB_DIR' not in os.environ and not storage.is_url(workdir)
  return wandb.init(project=project, name=name or os.path.basename(workdir.rstrip('/')),
                    config=dict(record or {}), dir=workdir if local else None)


class MetricsWriter:
  """Appends metrics to DIR/metrics.jsonl and TensorBoard event files in DIR/tb (process 0 only),
  and to a Weights & Biases run when `wandb` = 'PROJECT[/RUN_NAME]' (`start_wandb`).

  Appending (not truncating) lets a resumed run continue the same file; a resumed run may repeat
  steps after the last checkpoint, and readers should keep the last line per (split, step). Every
  write is flushed, so a killed run loses no logged line; on a URL each flush uploads the whole
  file again (storage.Rewritten). A write the disk refuses raises write_errors.WriteError and
  leaves no part of its line.
  """

  def __init__(self, workdir: str, *, enabled: bool = True, tensorboard: bool = True,
               wandb: str = '', record: Mapping[str, Any] | None = None) -> None:
    self.workdir = workdir
    self.enabled = enabled
    self.path = storage.join(workdir, 'metrics.jsonl')
    self._tb = None
    self._wandb = None
    if not enabled:
      return
    storage.makedirs(workdir)
    self._file = storage.open_append(self.path)
    if tensorboard:
      self._tb = TensorBoardEvents(storage.join(workdir, 'tb'))
    if wandb:
      self._wandb = start_wandb(wandb, workdir, record)

  def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
    """Writes one record; `scalars` maps names to host floats."""
    if not self.enabled:
      return
    lease_lib.check_held()  # fenced: a run whose lease was taken over writes no line (lease.py)
    record: dict[str, Any] = {'step': int(step), 'split': str(split), 'time': time.time()}
    for k, v in scalars.items():
      record[k] = json_value(float(v))
    self._file.write(json.dumps(record, sort_keys=False) + '\n')
    self._file.flush()
    if self._tb is not None:
      self._tb.scalars(step, {tb_tag(f'{split}/{k}'): v for k, v in scalars.items()})
    if self._wandb is not None:
      self._wandb.log({f'{split}/{k}': float(v) for k, v in scalars.items()}, step=int(step))

  def close(self) -> None:
    if not self.enabled:
      return
    self.enabled = False
    self._file.close()  # flushed already: closing writes nothing
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """All records of DIR/metrics.jsonl (raises ValueError naming the line that is not JSON)."""
  path = storage.join(workdir, 'metrics.jsonl')
  out = []
  for i, line in enumerate(storage.read_text(path).splitlines(), 1):
    if not line.strip():
      continue
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError as e:
      raise ValueError(f'{path}:{i} is not valid JSON: {e}') from e
  return out


class RateMeter:
  """Steps/s and tokens/s between two log points (host wall clock)."""

  def __init__(self, tokens_per_step: int, start_step: int) -> None:
    self.tokens_per_step = int(tokens_per_step)
    self._t = time.perf_counter()
    self._step = int(start_step)

  def update(self, step: int) -> dict[str, float]:
    now = time.perf_counter()
    dt = max(now - self._t, 1e-9)
    steps = max(int(step) - self._step, 0)
    self._t, self._step = now, int(step)
    sps = steps / dt
    return {'steps_per_s': sps, 'tokens_per_s': sps * self.tokens_per_step}
