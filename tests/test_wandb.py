"""The optional Weights & Biases writer (`train.wandb`), in wandb's offline mode: no network.

A tiny training run with train.wandb='hmdlm-test/tiny', WANDB_MODE=offline and WANDB_DIR=tmp
writes an offline run (WANDB_DIR/wandb/offline-run-*/run-*.wandb) whose history records hold the
values of DIR/metrics.jsonl (nightly); `MetricsWriter` alone is checked the same way in CI. The
.wandb file is a LevelDB-style log of protobuf `Record`s (32 KiB blocks of [crc32 4 | length 2 |
type 1 | data] chunks after a 7-byte header); wandb has no public reader for it, so `_records`
reads it here with wandb's own protobuf classes.
"""

from __future__ import annotations

import json
import pathlib
import struct
import time

import pytest

from hmdlm_jax import metrics as metrics_lib
from tests.conftest import main_cmd, read_jsonl, run_cmd

wandb = pytest.importorskip('wandb')

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(path: pathlib.Path) -> list[object]:
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top
  data = path.read_bytes()
  assert data[:4] == b':W&B', f'{path} is not a wandb log'
  out, pos, pending = [], 7, b''
  while pos + 7 <= len(data):
    if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
      pos += BLOCK - pos % BLOCK
      continue
    _, length, kind = struct.unpack('<IHB', data[pos:pos + 7])
    chunk = data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (FULL, FIRST):
      pending = chunk
    elif kind in (MIDDLE, LAST):
      pending += chunk
    if kind in (FULL, LAST):
      rec = wandb_internal_pb2.Record()
      rec.ParseFromString(pending)
      out.append(rec)
    if kind == 0 and length == 0:  # zero padding at the end of the file
      break
  return out


def _history(run_dir: pathlib.Path, steps: set[int]) -> dict[int, dict[str, float]]:
  """step -> the values logged at it, once the log holds every step of `steps`.

  wandb's service writes the offline log in the background: `finish()` may return before the
  records reach the file, so the file is read again until they are there (or 60 s passed).
  """
  (log,) = run_dir.glob('run-*.wandb')
  deadline = time.monotonic() + 60
  while True:
    out: dict[int, dict[str, float]] = {}
    for rec in _records(log):
      if rec.WhichOneof('record_type') != 'history':
        continue
      row = {'/'.join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item}
      out.setdefault(int(row['_step']), {}).update(row)
    if steps <= set(out) or time.monotonic() > deadline:
      return out
    time.sleep(0.2)


@pytest.mark.slow  # a training subprocess (~30 s on 2 cores); the writer itself: the test below
def test_train_logs_its_metrics_to_an_offline_wandb_run(tmp_path, puzzle_cache, jax_cache,
                                                        monkeypatch):
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_DIR', str(tmp_path / 'wandb_dir'))
  monkeypatch.setenv('WANDB_SILENT', 'true')
  (tmp_path / 'wandb_dir').mkdir()
  workdir = tmp_path / 'run'
  proc = run_cmd(main_cmd(str(workdir), puzzle_cache, '--config.train.num_steps=2',
                          '--config.train.log_every=1', '--config.train.ckpt_every=2',
                          '--config.train.final_eval=false',
                          '--config.train.wandb=hmdlm-test/tiny'), jax_cache)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (run_dir,) = (tmp_path / 'wandb_dir' / 'wandb').glob('offline-run-*')
  logged = [r for r in read_jsonl(str(workdir / 'metrics.jsonl')) if r['split'] == 'train']
  history = _history(run_dir, {r['step'] for r in logged})
  assert [r['step'] for r in logged] == [1, 2]
  for r in logged:
    for key in ('loss', 'lr', 'grad_norm'):
      assert history[r['step']][f'train/{key}'] == pytest.approx(r[key], rel=1e-6), (r, key)
  assert not (workdir / 'wandb').exists()  # WANDB_DIR set: nothing of wandb's in the workdir


def test_metrics_writer_logs_to_an_offline_wandb_run(tmp_path, monkeypatch):
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_SILENT', 'true')
  monkeypatch.delenv('WANDB_DIR', raising=False)
  workdir = tmp_path / 'my_run'
  writer = metrics_lib.MetricsWriter(str(workdir), tensorboard=False, wandb='hmdlm-test',
                                     record={'train': {'num_steps': 3}, 'seed': 7})
  writer.write(1, 'train', {'loss': 2.5, 'lr': 1e-3})
  writer.write(2, 'train', {'loss': 2.25, 'lr': 2e-3})
  writer.write(2, 'eval', {'ppl': 9.5})
  writer.close()
  # No WANDB_DIR: the offline run lies in the (local) workdir, named after it.
  (run_dir,) = (workdir / 'wandb').glob('offline-run-*')
  history = _history(run_dir, {1, 2})
  assert history[1]['train/loss'] == 2.5 and history[1]['train/lr'] == 1e-3
  assert history[2]['train/loss'] == 2.25 and history[2]['eval/ppl'] == 9.5
  (run,) = [r.run for r in _records(next(run_dir.glob('run-*.wandb')))
            if r.WhichOneof('record_type') == 'run']
  assert run.project == 'hmdlm-test' and run.display_name == 'my_run'
  config = {i.key: json.loads(i.value_json) for i in run.config.update}
  assert config['seed'] == 7 and config['train'] == {'num_steps': 3}


def test_wandb_field_is_checked_before_anything_is_written(monkeypatch):
  metrics_lib.check_wandb('')  # off: nothing to check
  metrics_lib.check_wandb('project/name')
  with pytest.raises(ValueError, match="must be 'PROJECT' or 'PROJECT/RUN_NAME'"):
    metrics_lib.check_wandb('a/b/c')
  monkeypatch.setitem(__import__('sys').modules, 'wandb', None)  # find_spec -> None
  with pytest.raises(ValueError) as e:
    metrics_lib.check_wandb('project')
  assert str(e.value) == ("train.wandb='project' needs the wandb package, which is not installed: "
                          "pip install \"hmdlm_jax[wandb]\" (or set train.wandb='').")
