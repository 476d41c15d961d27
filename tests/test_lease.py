"""One writer per directory (hmdlm_jax/lease.py), and eval / sample beside a live training run.

Fast: the lease taken, refused (a fresh heartbeat of another host; a dead pid of another PID
namespace or boot, or of a lease that does not say), taken over when stale (a dead process of this
host, boot and namespace; an old heartbeat of another host), released only while it is ours;
fenced (a lost lease stops every writer first); O_CREAT|O_EXCL where link(2) is refused; the
atomic create-if-absent locally and on the GCS emulator (tests/gcs_emulator.py, which honours
`ifGenerationMatch=0` as GCS does); a checkpoint deleted between its choice and its read; SIGTERM
inside `hold` releases the lease.
Real processes: a second training run on a live run's workdir exits 1 with one line and changes
nothing; eval and sample of a live run that keeps one checkpoint (slow).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

from hmdlm_jax import checkpoint as ckpt_lib
from hmdlm_jax import lease
from hmdlm_jax import storage
from tests import gcs_emulator
from tests.conftest import (REPO, dir_hash, main_cmd, read_jsonl, subprocess_env,
                            train_losses)

PREFIX = 'hmdlm_jax: error:'
PUZZLE = '000000010400000000020000000000050407008000300001090000300400200050100000000806000'


def _lease_file(directory: Any, **fields: Any) -> str:
  path = os.path.join(str(directory), lease.TRAIN_LEASE)
  record = {'host': socket.gethostname(), 'pid': os.getpid(), 'token': 'theirs',
            'started': time.time(), 'heartbeat': time.time(), **lease.identity()}
  record.update(fields)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(record, f)
  os.utime(path, (record['heartbeat'], record['heartbeat']))  # a local lease's mtime beats too
  return path


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  return proc.pid


def test_taken_refused_released(tmp_path):
  held = lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir')
  path = os.path.join(tmp_path, lease.TRAIN_LEASE)
  record = json.loads(open(path, encoding='utf-8').read())
  assert record['pid'] == os.getpid() and record['host'] == socket.gethostname()
  with pytest.raises(lease.LeaseError, match=r"--workdir='.*' is in use by another run \(host "
                     rf"{socket.gethostname()}, pid {os.getpid()}, heartbeat \d+ s ago"):
    lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir')
  held.release()
  assert os.listdir(tmp_path) == []
  held.release()  # idempotent


def test_refused_while_another_host_beats(tmp_path, capsys):
  path = _lease_file(tmp_path, host='other-host', pid=1, heartbeat=time.time() - 5)
  before = dir_hash(str(tmp_path))
  with pytest.raises(lease.LeaseError) as e:
    lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir')
  assert 'host other-host, pid 1, heartbeat 5 s ago' in str(e.value)
  assert 'wait for it to end, or use another --workdir' in str(e.value)
  assert dir_hash(str(tmp_path)) == before and os.path.exists(path)
  assert capsys.readouterr().err == ''


@pytest.mark.parametrize('fields,why', [
    (lambda: {'pid': _dead_pid()}, 'on this host is gone'),
    (lambda: {'host': 'other-host', 'pid': 1, 'heartbeat': time.time() - lease.STALE_S - 60},
     f'its heartbeat is {lease.STALE_S + 60:.0f} s old'),
], ids=['dead_pid_here', 'old_heartbeat_elsewhere'])
def test_stale_lease_is_taken_over_with_one_line(tmp_path, capsys, fields, why):
  _lease_file(tmp_path, **fields())
  held = lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir')
  try:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith('hmdlm_jax: taking over the stale lease')
    assert why in err[0]
    assert held.ours()
  finally:
    held.release()


@pytest.mark.parametrize('fields', [
    {'pid_ns': 'pid:[1]'}, {'boot_id': 'another-boot'}, {'boot_id': None, 'pid_ns': None},
], ids=['other_pid_namespace', 'other_boot', 'old_lease_without_identity'])
def test_a_dead_pid_elsewhere_proves_nothing(tmp_path, capsys, fields):
  """A pid of another PID namespace or boot (a container sharing the host name), or of a lease
  that does not say: its absence here is no proof, the fresh heartbeat keeps the lease."""
  _lease_file(tmp_path, pid=_dead_pid(), **fields)
  before = dir_hash(str(tmp_path))
  with pytest.raises(lease.LeaseError, match='is in use by another run'):
    lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir')
  assert dir_hash(str(tmp_path)) == before and capsys.readouterr().err == ''


def test_a_lost_lease_fences_every_writer(tmp_path, capsys):
  """Taken over while this run stalled: the heartbeat marks it lost, and the metrics writer,
  the run record, a checkpoint save and the eval / sample outputs (reports, samples, pictures)
  raise LeaseLost before writing anything."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import visualize  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax.evaluation import reports  # pylint: disable=g-import-not-at-top
  with lease.hold(str(tmp_path), lease.TRAIN_LEASE, '--workdir') as held:
    writer = metrics_lib.MetricsWriter(str(tmp_path), tensorboard=False)
    writer.write(1, 'train', {'loss': 1.0})
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), ml_collections.ConfigDict(
        {'keep_last': 1, 'keep_period': 0, 'async_checkpoint': False}))
    _lease_file(tmp_path, host='other-host', pid=7)  # another run took it over
    before = dir_hash(str(tmp_path))
    with pytest.raises(lease.LeaseLost) as e:  # read directly: no beat has run yet
      ckpt.save(2, {'x': 1}, None)  # lease.check_held_everywhere: process 0's outcome for all
    assert held.lost is not None
    assert ("lost its lease to another run (host other-host, pid 7, heartbeat 0 s ago; "
            f"{held.path}): stopped before writing;") in str(e.value)
    with pytest.raises(lease.LeaseLost):
      writer.write(2, 'train', {'loss': 1.0})
    with pytest.raises(lease.LeaseLost):
      workdir_lib.start_run(ml_collections.ConfigDict({'seed': 0}), str(tmp_path), 'train',
                            workdir=str(tmp_path), step=0, write_config=True)
    # An eval / sample run's outputs: its report, its samples, its pictures.
    with pytest.raises(lease.LeaseLost):
      reports.write_json(str(tmp_path / 'eval_2.json'), {'x': 1.0})
    with pytest.raises(lease.LeaseLost):
      reports.write_jsonl(str(tmp_path / 'samples_2.jsonl'), [{'x': 1}])
    with pytest.raises(lease.LeaseLost):
      visualize.write_bytes(str(tmp_path / 'pictures' / 'a.png'), b'png')
    assert dir_hash(str(tmp_path)) == before
    writer.close()
    ckpt.close()
  assert json.loads(open(held.path, encoding='utf-8').read())['token'] == 'theirs'
  assert capsys.readouterr().err == ''
  lease.check_held()  # no lease held any more: writers outside a run are not fenced


def test_heartbeat_flags_a_takeover(tmp_path):
  held = lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir', heartbeat_s=0.05)
  try:
    held.check()
    _lease_file(tmp_path, host='other-host')
    deadline = time.monotonic() + 10
    while held.lost is None and time.monotonic() < deadline:
      time.sleep(0.02)
    assert held.lost and held.lost['token'] == 'theirs'
    with pytest.raises(lease.LeaseLost, match='host other-host'):
      held.check()
  finally:
    held.release()
  assert json.loads(open(held.path, encoding='utf-8').read())['token'] == 'theirs'


def test_a_beat_suspended_after_its_read_never_replaces_a_takers_lease(tmp_path, monkeypatch):
  """The race of a run suspended inside its heartbeat: it read its own token, then a taker
  replaced the lease. The beat's write must leave the taker's token; the next check stops."""
  held = lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir', heartbeat_s=3600)
  path, mine = held.path, held.holder()
  try:
    read_at = []

    def suspended_read() -> dict[str, Any] | None:
      read_at.append(time.monotonic())
      _lease_file(tmp_path, host='other-host', pid=1, heartbeat=time.time() - 5)  # the taker
      return mine  # what the beat had read before it was suspended

    monkeypatch.setattr(held, 'holder', suspended_read)
    held._beat_once()  # pylint: disable=protected-access
    monkeypatch.undo()
    # Confirmed as of the read, not of the touch: a suspension there (modelled by moving the
    # read back by STALE_S) leaves the trust window, so the next write reads the file first.
    assert held._confirmed <= read_at[0]  # pylint: disable=protected-access
    held._confirmed -= lease.STALE_S  # pylint: disable=protected-access
    record = lease._read(path)  # pylint: disable=protected-access
    assert record['token'] == 'theirs' and record['host'] == 'other-host'
    assert time.time() - lease.heartbeat(record) < 2  # touched: the taker's heartbeat, refreshed
    with pytest.raises(lease.LeaseLost, match='host other-host, pid 1'):
      held.check()
  finally:
    held.release()
  assert lease._read(path)['token'] == 'theirs'  # pylint: disable=protected-access


def test_no_hard_links_falls_back_to_an_exclusive_create(tmp_path, monkeypatch):
  """link(2) refused (FAT, gcsfuse, s3fs, SMB): O_CREAT|O_EXCL on the final name, still one
  holder; a lease seen empty (being written) is read again, not judged stale. The real filesystem
  case, through an LD_PRELOAD shim: tests/test_lease_fencing.py."""
  import errno  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top

  def refuse(src: str, dst: str) -> None:
    raise OSError(errno.EPERM, 'Operation not permitted', src, None, dst)

  monkeypatch.setattr(os, 'link', refuse)
  held = lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir')
  try:
    assert os.listdir(tmp_path) == [lease.TRAIN_LEASE] and held.ours()
    with pytest.raises(lease.LeaseError, match='is in use by another run'):
      lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir')
  finally:
    held.release()
  assert os.listdir(tmp_path) == []
  path = os.path.join(tmp_path, lease.TRAIN_LEASE)
  open(path, 'w', encoding='utf-8').close()  # created, not yet written
  threading.Timer(0.3, lambda: _lease_file(tmp_path, host='other-host')).start()
  with pytest.raises(lease.LeaseError, match='host other-host'):
    lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir')


def test_heartbeat_and_release_only_while_ours(tmp_path):
  path = os.path.join(tmp_path, lease.TRAIN_LEASE)
  held = lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir', heartbeat_s=0.05)
  first = held.record['heartbeat']
  stored = open(path, 'rb').read()
  time.sleep(0.5)
  assert lease.heartbeat(lease._read(path)) > first + 0.3  # pylint: disable=protected-access
  assert open(path, 'rb').read() == stored  # touched, not rewritten: never over a taker's lease
  held.release()
  assert not os.path.exists(path)
  held = lease.acquire(str(tmp_path), lease.TRAIN_LEASE, '--workdir')  # no beat in this test
  _lease_file(tmp_path, host='other-host')  # taken over while this run stalled
  held.release()
  assert json.loads(open(path, encoding='utf-8').read())['token'] == 'theirs'


def test_sigterm_inside_hold_unwinds_and_releases(tmp_path):
  """A program that imports main.run (no stopping.install): SIGTERM inside the block exits 143
  through it, the lease released and the previous handler back (the command line's own handling:
  tests/test_sigterm_phases.py)."""
  previous = signal.getsignal(signal.SIGTERM)
  with pytest.raises(SystemExit) as e:
    with lease.hold(str(tmp_path), lease.TRAIN_LEASE, '--workdir'):
      assert os.path.exists(os.path.join(tmp_path, lease.TRAIN_LEASE))
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(10)
  assert e.value.code == 143
  assert os.listdir(tmp_path) == []
  assert signal.getsignal(signal.SIGTERM) is previous


def test_local_create_is_exclusive(tmp_path):
  path = str(tmp_path / 'x')
  storage.create_exclusive(path, b'one')
  with pytest.raises(FileExistsError):
    storage.create_exclusive(path, b'two')
  assert open(path, 'rb').read() == b'one' and os.listdir(tmp_path) == ['x']  # no temporary


@pytest.fixture(scope='module')
def gcs(tmp_path_factory) -> Iterator[gcs_emulator.Emulator]:
  with gcs_emulator.running(tmp_path_factory.mktemp('gcs_emulator')) as emulator:
    yield emulator


def test_gs_create_is_exclusive_and_the_lease_holds(gcs, monkeypatch):
  for k, v in gcs.env().items():
    monkeypatch.setenv(k, v)
  base = f'gs://{gcs_emulator.BUCKET}/lease'
  path = storage.join(base, 'x')
  storage.create_exclusive(path, b'one')
  with pytest.raises(FileExistsError):  # GCS's 412 to ifGenerationMatch=0
    storage.create_exclusive(path, b'two')
  assert gcs.read('lease/x') == b'one'
  held = lease.acquire(base, lease.OUTPUTS_LEASE, '--out')
  with pytest.raises(lease.LeaseError, match='is in use by another run'):
    lease.acquire(base, lease.OUTPUTS_LEASE, '--out')
  held.release()
  assert gcs.objects('lease/') == {'lease/x': 3}


def test_a_step_deleted_meanwhile_is_reselected(tmp_path, caplog):
  """A live run's retention deletes the step chosen before it is read: the latest is chosen
  again; a step that exists and fails is raised at once; no message names --step."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  ckpts = tmp_path / 'checkpoints'
  for step in (4, 6):
    (ckpts / str(step)).mkdir(parents=True)
  ckpt = ckpt_lib.Checkpointer(str(tmp_path), ml_collections.ConfigDict(
      {'keep_last': 1, 'keep_period': 0, 'async_checkpoint': False}), read_only=True)
  read = []

  def reader(step: int) -> int:
    read.append(step)
    if step == 6:
      os.rmdir(ckpts / '6')  # retention, while we read it
      raise ckpt_lib.CheckpointError('gone')
    return step

  assert ckpt.read_latest(None, reader) == 4 and read == [6, 4]
  assert 'step 6 was replaced while being read' in caplog.text

  def broken(step: int) -> int:
    raise ckpt_lib.CheckpointError(f'step {step} is corrupt')

  with pytest.raises(ckpt_lib.CheckpointError, match='step 4 is corrupt'):
    ckpt.read_latest(None, broken)

  def vanishing(step: int) -> int:
    (ckpts / str(step + 2)).mkdir()  # the run saves the next one; this one is being deleted
    raise ckpt_lib.CheckpointError('half deleted')

  with pytest.raises(ckpt_lib.CheckpointError) as e:
    ckpt.read_latest(None, vanishing)
  assert 'was replaced while being read 5 times' in str(e.value) and '--step' not in str(e.value)
  ckpt.close()


def test_a_live_run_is_refused_before_its_checkpoints_are_read(tmp_path):
  """Training into a workdir a live run holds is refused by the lease alone: the checkpoints
  (here a step the live run is deleting, no longer a directory) are not read first."""
  from configs import tiny_test  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import preflight  # pylint: disable=g-import-not-at-top
  (tmp_path / 'checkpoints' / '20').mkdir(parents=True)  # being written or deleted
  config = config_lib.resolve(tiny_test.get_config())
  with pytest.raises(ValueError, match='checkpoints/20') as e:
    preflight.check('train', config, str(tmp_path))  # the mutation: no live lease
  assert not isinstance(e.value, lease.LeaseError)
  _lease_file(tmp_path, host='other-host', pid=1)
  with pytest.raises(lease.LeaseError, match='is in use by another run .host other-host, pid 1'):
    preflight.check('train', config, str(tmp_path))
  stale = time.time() - lease.STALE_S - 60
  _lease_file(tmp_path, host='other-host', pid=1, heartbeat=stale)
  with pytest.raises(ValueError, match='checkpoints/20'):  # stale: no refusal, acquire takes it
    preflight.check('train', config, str(tmp_path))


def test_a_step_deleted_while_orbax_lists_is_listed_again(tmp_path, monkeypatch):
  """Orbax lists the steps, then reads each: a step a live run deletes in between raises
  NotADirectoryError inside CheckpointManager; opening lists again, and gives up after three."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  (tmp_path / 'checkpoints' / '4').mkdir(parents=True)
  real, calls = ckpt_lib.ocp.CheckpointManager, []

  def flaky(*args: Any, **kwargs: Any) -> Any:
    calls.append(1)
    if len(calls) <= failures:
      raise NotADirectoryError(f'Path is not a directory: {tmp_path}/checkpoints/2')
    return real(*args, **kwargs)

  monkeypatch.setattr(ckpt_lib.ocp, 'CheckpointManager', flaky)
  train_cfg = ml_collections.ConfigDict({'keep_last': 1, 'keep_period': 0,
                                         'async_checkpoint': False})
  failures = 2
  ckpt_lib.Checkpointer(str(tmp_path), train_cfg, read_only=True).close()
  assert len(calls) == 3
  failures, calls[:] = 3, []
  with pytest.raises(ckpt_lib.CheckpointError, match='Path is not a directory'):
    ckpt_lib.Checkpointer(str(tmp_path), train_cfg, read_only=True)
  assert len(calls) == 3


# ----------------------------------------------------------------------------- real processes


def _wait_for(predicate: Any, proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
  deadline = time.monotonic() + timeout
  while not predicate():
    assert proc.poll() is None, f'the training run ended before {what}'
    assert time.monotonic() < deadline, f'no {what} within {timeout} s'
    time.sleep(0.05)


def _popen(cmd: list[str], jax_cache: str, log: Any) -> subprocess.Popen:
  with open(log, 'w', encoding='utf-8') as err:  # a file: no pipe to fill
    return subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(jax_cache),
                            stdout=subprocess.DEVNULL, stderr=err)


def _stop(proc: subprocess.Popen) -> int:
  if proc.poll() is None:
    proc.send_signal(signal.SIGTERM)
  try:
    return proc.wait(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()


def test_second_training_run_on_a_live_workdir_is_refused(tmp_path, puzzle_cache, jax_cache,
                                                          reference_run):
  workdir = str(tmp_path / 'run')
  first = _popen(main_cmd(workdir, puzzle_cache, '--config.seed=0',
                          '--config.train.num_steps=100000'), jax_cache, tmp_path / 'first.err')
  try:
    _wait_for(lambda: os.path.exists(os.path.join(workdir, 'metrics.jsonl')), first,
              'training')
    second = subprocess.run(main_cmd(workdir, puzzle_cache, '--config.seed=1'), cwd=REPO,
                            env=subprocess_env(jax_cache), capture_output=True, text=True,
                            timeout=180, check=False)
    assert first.poll() is None, 'the first run ended before the second was refused'
  finally:
    assert _stop(first) == 0, (tmp_path / 'first.err').read_text()[-3000:]
  errors = [line for line in second.stderr.splitlines() if line.startswith(PREFIX)]
  assert second.returncode == 1 and len(errors) == 1, second.stderr[-3000:]
  assert f"--workdir='{workdir}' is in use by another run (host {socket.gethostname()}, pid " \
         f'{first.pid}, heartbeat' in errors[0]
  assert 'Traceback' not in second.stderr
  # The first run's files alone: its config, its one runs.jsonl line, its losses once per step.
  assert json.load(open(os.path.join(workdir, 'config.json'), encoding='utf-8'))['seed'] == 0
  runs = read_jsonl(os.path.join(workdir, 'runs.jsonl'))
  assert [r['config']['seed'] for r in runs] == [0]
  steps = [r['step'] for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
           if r['split'] == 'train']
  assert steps == list(range(1, len(steps) + 1)), steps
  reference = train_losses(reference_run['workdir'])
  losses = train_losses(workdir)
  assert {s: losses[s] for s in reference if s in losses} == \
         {s: reference[s] for s in reference if s in losses}
  assert not os.path.exists(os.path.join(workdir, lease.TRAIN_LEASE))  # released at the stop


@pytest.mark.slow
def test_eval_and_sample_of_a_live_run_that_keeps_one_checkpoint(tmp_path, puzzle_cache,
                                                                  jax_cache):
  workdir = str(tmp_path / 'run')
  train = _popen(main_cmd(workdir, puzzle_cache, '--config.train.num_steps=100000',
                          '--config.train.ckpt_every=2', '--config.train.keep_last=1'),
                 jax_cache, tmp_path / 'train.err')
  runs = []
  try:
    _wait_for(lambda: any(n.isdigit() for n in os.listdir(os.path.join(workdir, 'checkpoints'))
                          ) if os.path.isdir(os.path.join(workdir, 'checkpoints')) else False,
              train, 'a checkpoint')
    for i, mode in enumerate(('eval', 'eval', 'eval', 'sample')):
      out = str(tmp_path / f'out{i}')
      flags = [f'--mode={mode}', f'--out={out}'] + ([f'--inputs={PUZZLE}'] if mode == 'sample'
                                                    else [])
      runs.append((mode, out, subprocess.Popen(
          main_cmd(workdir, puzzle_cache, *flags), cwd=REPO, env=subprocess_env(jax_cache),
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    results = [(mode, out, *proc.communicate(timeout=300), proc.returncode)
               for mode, out, proc in runs]
    assert train.poll() is None, 'training ended before the evaluations'
  finally:
    for *_, proc in runs:
      if proc.poll() is None:
        proc.kill()
    assert _stop(train) == 0, (tmp_path / 'train.err').read_text()[-3000:]
  logged = set(train_losses(workdir))
  for mode, out, stdout, stderr, rc in results:
    assert rc == 0 and PREFIX not in stderr, f'{mode}: {stderr[-3000:]}'
    assert '--step' not in stderr
    (name,) = [n for n in os.listdir(out) if n.startswith(('eval_', 'samples_'))]
    step = int(name.split('_')[1].split('.')[0])
    assert step % 2 == 0 and step in logged, (name, sorted(logged)[-5:])
    (record,) = read_jsonl(os.path.join(out, 'runs.jsonl'))
    assert record['step'] == step
    if mode == 'eval':
      assert f'Evaluation of step {step} ' in stdout


@pytest.mark.slow
def test_every_process_of_a_second_job_is_refused(tmp_path, puzzle_cache, jax_cache):
  """Two jax.distributed processes on a workdir another host's live run holds: process 0 reads
  the lease, and both exit 1 with its line (no process waits in a collective)."""
  import portpicker  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  workdir.mkdir()
  _lease_file(workdir, host='other-host', pid=1)
  before = dir_hash(str(workdir))
  port = portpicker.pick_unused_port()
  procs = [subprocess.Popen(
      main_cmd(str(workdir), puzzle_cache, '--config.distributed.enabled=True',
               f'--config.distributed.coordinator_address=localhost:{port}',
               '--config.distributed.num_processes=2', f'--config.distributed.process_id={i}'),
      cwd=REPO, env=subprocess_env(jax_cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
      text=True) for i in range(2)]
  try:
    results = [(p.communicate(timeout=240)[1], p.returncode) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  lines = []
  for stderr, rc in results:
    errors = [line for line in stderr.splitlines() if line.startswith(PREFIX)]
    assert rc == 1 and len(errors) == 1, stderr[-3000:]
    lines.append(errors[0])
  assert lines[0] == lines[1] and 'is in use by another run (host other-host, pid 1' in lines[0]
  assert dir_hash(str(workdir)) == before


def test_the_save_check_is_agreed_by_every_process(tmp_path, monkeypatch):
  """check_held_everywhere broadcasts process 0's outcome (lease._agree, one collective): a peer,
  which holds no lease, raises process 0's LeaseLost; while the lease is held nobody raises."""
  sent: list[str] = []  # what process 0 broadcast; a peer receives the last of it

  def agree(message: str) -> str:
    if lease.jax.process_index() == 0:
      sent.append(message)
    return sent[-1]

  monkeypatch.setattr(lease, '_agree', agree)
  with lease.hold(str(tmp_path), lease.TRAIN_LEASE, '--workdir'):
    lease.check_held_everywhere()
    assert sent == ['', '']  # the lease taken (hold), then the save's check: both fine
    _lease_file(tmp_path, host='other-host', pid=7)
    with pytest.raises(lease.LeaseLost, match='host other-host, pid 7'):
      lease.check_held_everywhere()
    monkeypatch.setattr(lease.jax, 'process_index', lambda: 1)  # a peer: no lease of its own
    with pytest.raises(lease.LeaseLost, match='host other-host, pid 7'):
      lease.check_held_everywhere()
    monkeypatch.undo()
