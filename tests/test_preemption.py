"""Preemption of a multi-process run: SIGTERM on one process stops every process at one step.

Two JAX processes (one CPU device each, jax.distributed on localhost) train configs/tiny_test.py
with train.log_every larger than the run, so no logging step can carry the stop decision. Only
process 1 gets SIGTERM. Both must stop at the same step within a few steps, save it and exit 0;
rerunning the command then finishes the run bit for bit as an uninterrupted run does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.conftest import REPO, main_cmd, subprocess_env, train_losses

NUM_STEPS = 20
CKPT_EVERY = 5
# SIGTERM goes out once checkpoint CKPT_EVERY is on disk (saved synchronously, so the run is then
# a step or two past it); the stop must follow within this many steps of that checkpoint.
STOP_WITHIN = 8
NO_LOGGING = '--config.train.log_every=1000000'


def _finalized_steps(workdir: str) -> list[int]:
  d = os.path.join(workdir, 'checkpoints')
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def _run_pair(workdir: str, puzzle_cache: str, jax_cache: str, *flags: str,
              sigterm_process: int | None = None) -> list[tuple[int, str, str]]:
  """Runs the two processes of one training run; [(returncode, stdout, stderr)] by process.

  sigterm_process: send SIGTERM to that process alone once checkpoint CKPT_EVERY exists.
  """
  import portpicker  # pylint: disable=g-import-not-at-top
  port = portpicker.pick_unused_port()
  os.makedirs(workdir, exist_ok=True)
  logs = [(os.path.join(workdir, f'p{i}.out'), os.path.join(workdir, f'p{i}.err'))
          for i in range(2)]
  procs = []
  for i in range(2):
    cmd = main_cmd(workdir, puzzle_cache, f'--config.train.num_steps={NUM_STEPS}',
                   f'--config.train.ckpt_every={CKPT_EVERY}', '--config.distributed.enabled=True',
                   f'--config.distributed.coordinator_address=localhost:{port}',
                   '--config.distributed.num_processes=2', f'--config.distributed.process_id={i}',
                   *flags)
    with open(logs[i][0], 'w') as out, open(logs[i][1], 'w') as err:  # files: no pipe to fill
      procs.append(subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(jax_cache), stdout=out,
                                    stderr=err))
  try:
    if sigterm_process is not None:
      deadline = time.monotonic() + 180
      while CKPT_EVERY not in _finalized_steps(workdir):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
          break  # the assertions below report it
        time.sleep(0.005)
      procs[sigterm_process].send_signal(signal.SIGTERM)
    for p in procs:
      p.wait(timeout=240)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  results = []
  for p, (out, err) in zip(procs, logs):
    with open(out, encoding='utf-8') as f_out, open(err, encoding='utf-8') as f_err:
      results.append((p.returncode, f_out.read(), f_err.read()))
  return results


def _assert_ok(results: list[tuple[int, str, str]]) -> None:
  for i, (rc, _, err) in enumerate(results):
    assert rc == 0, f'process {i} exited with {rc}:\n{err[-3000:]}'


def _load_state(workdir: str, step: int) -> dict:
  """The saved TrainState of a two-process run, restored onto this process's one device."""
  dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  path = os.path.join(workdir, 'checkpoints', str(step), 'state')
  with ocp.StandardCheckpointer() as ckptr:
    meta = ckptr.metadata(path)
    tree = getattr(meta, 'item_metadata', meta)
    tree = getattr(tree, 'tree', tree)
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=dev), tree)
    return ckptr.restore(path, target)


def _assert_same_state(workdir_a: str, workdir_b: str, step: int) -> None:
  a, tree_a = jax.tree.flatten(_load_state(workdir_a, step))
  b, tree_b = jax.tree.flatten(_load_state(workdir_b, step))
  assert tree_a == tree_b
  for x, y in zip(a, b):  # params, EMA, optimiser state, step, key, counters: bit for bit
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


@pytest.fixture(scope='module')
def stopped_run(tmp_path_factory, puzzle_cache, jax_cache) -> dict:
  """The two-process run that gets SIGTERM on process 1 only, after step CKPT_EVERY."""
  workdir = str(tmp_path_factory.mktemp('preempted') / 'run')
  # Checkpoints written synchronously: checkpoint CKPT_EVERY on disk means the run is at that step.
  results = _run_pair(workdir, puzzle_cache, jax_cache, NO_LOGGING,
                      '--config.train.async_checkpoint=False', sigterm_process=1)
  return {'workdir': workdir, 'results': results}


def test_sigterm_on_one_process_stops_both_at_one_saved_step(stopped_run):
  workdir, results = stopped_run['workdir'], stopped_run['results']
  _assert_ok(results)
  with open(os.path.join(workdir, 'train_summary.json'), encoding='utf-8') as f:
    summary = json.load(f)
  step = summary['step']
  assert summary['stop_reason'] == 'signal SIGTERM', summary
  assert CKPT_EVERY < step <= CKPT_EVERY + STOP_WITHIN, (
      f'stopped at step {step}: SIGTERM was sent just after step {CKPT_EVERY}')
  for i, (_, out, _) in enumerate(results):  # both processes stopped at that step
    assert f'Received SIGTERM at step {step}: checkpoint saved' in out, (i, out[-2000:])
  assert _finalized_steps(workdir)[-1] == step
  assert int(_load_state(workdir, step)['step']) == step
  it_dir = os.path.join(workdir, 'checkpoints', str(step), 'data_iter')
  assert sorted(f for f in os.listdir(it_dir) if f.endswith('.json')) == [
      'process_0-of-2.json', 'process_1-of-2.json']
  print(f'SIGTERM on process 1 after step {CKPT_EVERY}: both stopped at step {step}',
        file=sys.stderr)


@pytest.mark.slow  # three more process pairs (~1 min on 2 idle cores): nightly
def test_resume_after_preemption_is_bit_identical(stopped_run, tmp_path, puzzle_cache, jax_cache):
  _assert_ok(stopped_run['results'])
  workdir = str(tmp_path / 'run')
  shutil.copytree(stopped_run['workdir'], workdir)
  step = _finalized_steps(workdir)[-1]
  assert step < NUM_STEPS
  # The same command, logging every step, finishes the run from that checkpoint ...
  resumed = _run_pair(workdir, puzzle_cache, jax_cache, '--config.train.log_every=1')
  _assert_ok(resumed)
  assert f'Resumed from {os.path.join(workdir, "checkpoints", str(step))}' in resumed[0][2]
  # ... exactly as a run that was never interrupted.
  reference = str(tmp_path / 'reference')
  _assert_ok(_run_pair(reference, puzzle_cache, jax_cache, '--config.train.log_every=1'))
  got, ref = train_losses(workdir), train_losses(reference)
  assert sorted(got) == list(range(step + 1, NUM_STEPS + 1))
  assert got == {s: ref[s] for s in got}  # bit-identical floats (JSON round-trips float32)
  _assert_same_state(workdir, reference, NUM_STEPS)
