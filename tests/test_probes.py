"""Every probe as a test (issue 67): command-line probes not covered by another test file.

Each probe asserts the project's rule for bad input: exit code 1, exactly one stderr line
`hmdlm_jax: error: ...` (<= 300 characters once the test's own folder names are shortened) that
names the file / field and holds the words below, no traceback, and a tree hash (dir_hash) of
every folder the probe could touch that is the same before and after.

One short training run (configs/tiny_test.py, STEPS steps) is shared: it runs with HOME on a path
no user can create (/proc) and TMPDIR full (a full tmpfs, root only) or missing, and must simply
succeed. The `hmdlm_jax.main` probes on it run through tests/fault_driver.py (one subprocess, a
forked child per probe, no JAX start-up each). Ctrl-C twice is one real process stopped at
start-up; a full TensorBoard disk is one resumed run; `python -m hmdlm_jax.front` is called in
this process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from typing import Any

import pytest

from hmdlm_jax import front
from hmdlm_jax import lease
from hmdlm_jax import stopping
from hmdlm_jax.config import loading as config_loading
from hmdlm_jax.configs import text as text_config
from hmdlm_jax import config as config_lib
from hmdlm_jax import workdir as workdir_lib
from tests.conftest import REPO, dir_hash, main_cmd, run_cmd, subprocess_env
from tests.test_sigterm_phases import _run_signalled, _stopped_line

PREFIX = 'hmdlm_jax: error: '
STEPS = 4
TRAIN = (f'--config.train.num_steps={STEPS}', '--config.train.ckpt_every=2',
         '--config.train.final_eval=False')
NO_HOME = '/proc/hmdlm_no_home'  # not creatable, not writable, by any user
PUZZLE = '000000010400000000020000000000050407008000300001090000300400200050100000000806000'


def _one_line(rc: int, stdout: str, stderr: str, *words: str, short: str = '') -> str:
  """The error line, checked: exit 1, one `PREFIX` line, the last of stderr, no traceback."""
  everything = stdout + stderr
  assert rc == 1, (rc, everything[-3000:])
  assert 'Traceback' not in everything, everything[-3000:]
  assert everything.count(PREFIX) == 1, everything[-3000:]
  line = stderr.rstrip('\n').split('\n')[-1]
  assert line.startswith(PREFIX), everything[-3000:]
  assert len(line.replace(short, 'T') if short else line) <= 300, line
  for w in words:
    assert w in line, (w, line)
  return line


def _mount_tmpfs(path: str, size: str) -> str | None:
  """Mounts a tmpfs of `size` at `path`; None when it cannot (not root): the reason."""
  os.makedirs(path, exist_ok=True)
  if os.geteuid() != 0:
    return 'mounting a tmpfs needs root'
  proc = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'none', path],
                        capture_output=True, text=True, check=False)
  return f'cannot mount a tmpfs here: {proc.stderr.strip()}' if proc.returncode else None


def _fill(path: str) -> None:
  """Fills the file system of `path` (a small tmpfs) to its last byte."""
  with open(os.path.join(path, 'filler'), 'wb', buffering=0) as f:
    try:
      while True:
        f.write(bytes(4096))
    except OSError:
      pass


@pytest.fixture(scope='module')
def trained(tmp_path_factory, puzzle_cache, jax_cache) -> dict[str, Any]:
  """A STEPS-step run, trained with HOME unwritable and TMPDIR full (or missing)."""
  base = str(tmp_path_factory.mktemp('probes'))
  workdir = os.path.join(base, 'run')
  tmpdir = os.path.join(base, 'full_tmp')
  why_not = _mount_tmpfs(tmpdir, '64k')
  if why_not is not None:
    os.rmdir(tmpdir)  # then TMPDIR is missing instead
  env = dict(subprocess_env(jax_cache), HOME=NO_HOME, TMPDIR=tmpdir)
  try:
    if why_not is None:
      _fill(tmpdir)
    tmp_before = dir_hash(tmpdir)
    proc = subprocess.run(main_cmd(workdir, puzzle_cache, *TRAIN), cwd=REPO, env=env,
                          timeout=240, capture_output=True, text=True, check=False)
    tmp_after = dir_hash(tmpdir)
  finally:
    if why_not is None:
      subprocess.run(['umount', '-l', tmpdir], check=False)
  yield {'base': base, 'workdir': workdir, 'proc': proc, 'tmpdir_full': why_not is None,
         'tmpdir_why_not': why_not, 'tmp_unchanged': tmp_before == tmp_after}


def test_home_unwritable_and_tmpdir_full_or_missing(trained):
  """Training needs neither a writable HOME nor a usable TMPDIR: it succeeds, says nothing of
  them (Matplotlib, imported by the entry point, used to warn twice that it could not create
  HOME/.config/matplotlib), and writes nothing into TMPDIR."""
  proc = trained['proc']
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'Traceback' not in proc.stderr and PREFIX not in proc.stderr, proc.stderr[-3000:]
  assert NO_HOME not in proc.stderr and 'matplotlib' not in proc.stderr.lower(), (
      proc.stderr[-3000:])
  assert os.path.isdir(os.path.join(trained['workdir'], 'checkpoints', str(STEPS)))
  assert trained['tmp_unchanged']
  if not trained['tmpdir_full']:
    pytest.skip(f'TMPDIR was missing, not full: {trained["tmpdir_why_not"]}')


# ------------------------------------------------------------------ hmdlm_jax.main probes (driver)

PATHS_NEVER_CREATED = ('out', 'new_parent')  # no probe may create them
EXPECT: dict[str, tuple[str, ...]] = {}
PROBES: list[dict[str, Any]] = []


def _probe(name: str, expect: tuple[str, ...], argv: list[str], watch: list[str],
           **kw: Any) -> None:
  EXPECT[name] = expect
  PROBES.append(dict(name=name, entry='main', argv=argv, watch=watch, **kw))


def _define_probes(d: dict[str, str], cache: str) -> None:
  t = [sys.executable, '--config=configs/tiny_test.py', f'--config.data.cache_dir={cache}',
       *TRAIN]
  run, new, out = d['run'], d['new'], d['out']
  ev = [sys.executable, f'--workdir={run}', '--mode=eval', f'--out={out}',
        f'--config.data.cache_dir={cache}']
  # --config=DIR: no config.json, a truncated one, another task's.
  _probe('config_dir_without_config_json',
         (f"--config={d['empty']}: no run config", 'config.json', 'or give an experiment file'),
         ev + [f'--config={d["empty"]}'], [run, d['empty']])
  _probe('config_dir_truncated',
         (f"--config={d['truncated']}:", 'is not a readable run config', 'JSONDecodeError'),
         ev + [f'--config={d["truncated"]}'], [run, d['truncated']])
  _probe('config_dir_of_another_task',
         ('holds another model', 'model.hidden_size: 32 -> 128', f'--config={run}'),
         ev + [f'--config={d["other_task"]}'], [run, d['other_task']])
  # --prompt / --infill where they do not apply.
  _probe('prompt_on_a_sudoku_run', ('--prompt / --infill apply to the text tasks', '--inputs'),
         t + [f'--workdir={run}', '--mode=sample', f'--out={out}', '--prompt=The king'],
         [run])
  _probe('infill_on_a_sudoku_run', ('--prompt / --infill apply to the text tasks', '--inputs'),
         t + [f'--workdir={run}', '--mode=sample', f'--out={out}', '--infill=a [MASK] b'],
         [run])
  # Memory preflight: seq_len = 10^6 (text: it does not fit; Sudoku: the grid is 81 cells),
  # a model that cannot fit, an eval batch that cannot.
  _probe('text_seq_len_million', ('data.batch_size=1024 needs at least', 'per device',
                                  'use data.batch_size='),
         [sys.executable, '--config=configs/text.py', f'--workdir={new}',
          '--config.data.seq_len=1000000', '--config.model.seq_len=1000000',
          '--config.data.batch_size=1024'], [d['new_parent']])
  _probe('sudoku_seq_len_million', ('model.seq_len=1000000', "81 cells",
                                    '--config.model.seq_len=81'),
         t + [f'--workdir={new}', '--config.model.seq_len=1000000',
              '--config.model.position_embedding=rotary'], [d['new_parent']])
  _probe('model_cannot_fit', ('data.batch_size=8 needs at least', 'the model alone does not fit',
                              'mesh.fsdp'),
         t + [f'--workdir={new}', '--config.model.hidden_size=65536',
              '--config.model.mlp_dim=262144'], [d['new_parent']])
  _probe('eval_batch_cannot_fit', ('data.eval_batch_size=1000000000',
                                   'use data.eval_batch_size='),
         t + [f'--workdir={run}', '--mode=eval', f'--out={out}',
              '--config.data.eval_batch_size=1000000000',
              '--config.eval.num_examples=1000000000'], [run])
  # Two evals into one --out: the other one (this test) holds its outputs lease.
  _probe('second_eval_into_one_out', (f"--out='{d['busy']}' is in use by another run",
                                      'use another --out'),
         ev[:3] + [f'--out={d["busy"]}', f'--config={run}'], [run, d['busy']])


@pytest.fixture(scope='module')
def probe_results(trained, tmp_path_factory, puzzle_cache, jax_cache) -> dict[str, Any]:
  assert trained['proc'].returncode == 0, trained['proc'].stderr[-3000:]
  base = str(tmp_path_factory.mktemp('probe_dirs'))
  d = {'run': trained['workdir'], 'out': os.path.join(base, 'out'),
       'new_parent': os.path.join(base, 'new'), 'new': os.path.join(base, 'new', 'run')}
  for name in ('empty', 'truncated', 'other_task', 'busy'):
    d[name] = os.path.join(base, name)
    os.makedirs(d[name])
  with open(os.path.join(d['run'], 'config.json'), 'rb') as f:
    recorded = f.read()
  with open(os.path.join(d['truncated'], 'config.json'), 'wb') as f:
    f.write(recorded[:len(recorded) // 2])
  other = config_lib.resolve(text_config.get_config())
  with open(os.path.join(d['other_task'], 'config.json'), 'w', encoding='utf-8') as f:
    json.dump(workdir_lib.config_to_dict(other), f)
  held = lease.acquire(d['busy'], lease.OUTPUTS_LEASE, '--out', heartbeat_s=3600.0)
  EXPECT.clear()
  PROBES.clear()
  _define_probes(d, puzzle_cache)
  spec, result = os.path.join(base, 'probes.json'), os.path.join(base, 'results.json')
  with open(spec, 'w', encoding='utf-8') as f:
    json.dump(PROBES, f)
  try:
    proc = run_cmd([sys.executable, '-m', 'tests.fault_driver', spec, result], jax_cache,
                   timeout=600)
  finally:
    held.release()
  assert proc.returncode == 0, proc.stderr[-4000:]
  with open(result, encoding='utf-8') as f:
    results = json.load(f)
  results['_paths'] = d
  results['_base'] = str(tmp_path_factory.getbasetemp())  # shortened in the line-length check
  return results


def _names() -> list[str]:
  _define_probes({k: f'/x/{k}' for k in ('run', 'new', 'new_parent', 'out', 'empty', 'truncated',
                                         'other_task', 'busy')}, '/x/cache')
  names = [p['name'] for p in PROBES]
  EXPECT.clear()
  PROBES.clear()
  return names


@pytest.mark.parametrize('name', _names())
def test_main_probe(probe_results, name):
  r = probe_results[name]
  if r['skipped']:
    pytest.skip(r['skipped'])
  _one_line(r['rc'], r['stdout'], r['stderr'], *EXPECT[name], short=probe_results['_base'])
  for path, before in r['before'].items():
    assert r['after'][path] == before, f'{path} changed'
  for path in PATHS_NEVER_CREATED:
    assert not os.path.exists(probe_results['_paths'][path]), path


def test_newer_schema_config_json_drops_the_unknown_fields(trained, tmp_path):
  """A config.json from a newer version (a field and a section this one lacks) loads: the
  unknown fields are left out (schema.from_record's rule for records of other versions), the
  rest is the run's config."""
  with open(os.path.join(trained['workdir'], 'config.json'), encoding='utf-8') as f:
    record = json.load(f)
  record['model']['a_future_field'] = 7
  record['a_future_section'] = {'x': 1}
  (tmp_path / 'config.json').write_text(json.dumps(record), encoding='utf-8')
  newer = config_loading.load(str(tmp_path))
  assert 'a_future_section' not in newer and 'a_future_field' not in newer.model
  assert newer.to_dict() == config_loading.load(trained['workdir']).to_dict()


def test_eval_memory_bound_covers_the_padded_eval_batch(puzzle_cache):
  """The memory preflight's row count of an eval-mode batch is at least the rows of the batches
  --mode=eval really builds (here 64 rows for 8 test puzzles)."""
  from hmdlm_jax import resources  # pylint: disable=g-import-not-at-top
  from hmdlm_jax import tasks  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(config_loading.load('configs/tiny_test.py', [
      '--config.data.eval_batch_size=64', f'--config.data.cache_dir={puzzle_cache}']))
  rows = next(iter(tasks.get(config).test_batches(config)))['tokens'].shape[0]
  assert rows == 64
  assert resources.eval_rows(config, 'eval', None) >= rows


# ----------------------------------------------------------------------------- real processes


def test_ctrl_c_twice_ends_at_once_with_one_line(tmp_path, puzzle_cache, jax_cache):
  """Ctrl-C while a phase ignores it, then Ctrl-C again: exit 130 at once, one stop line, no
  workdir (the start-up writes nothing)."""
  workdir = str(tmp_path / 'run')
  env = subprocess_env(jax_cache)
  env[stopping.GRACE_ENV] = '60'  # the second signal, not the watchdog, ends it
  result = _run_signalled(main_cmd(workdir, puzzle_cache, *TRAIN), str(tmp_path / 'log'), env,
                          'startup:stuck', (signal.SIGINT, signal.SIGINT), gap_s=0.3,
                          timeout=120)
  line = _stopped_line(result, 128 + signal.SIGINT, bound_s=10)
  assert line.startswith('hmdlm_jax: stopped: SIGINT again: ended at once'), line
  assert not os.path.exists(workdir)


def test_full_disk_for_the_event_file(trained, tmp_path, puzzle_cache, jax_cache):
  """tb/ on a full disk while a copy of the run resumes: one line naming the event file and
  ENOSPC; its checkpoints and config are unchanged."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(trained['workdir'], workdir)
  tb = os.path.join(workdir, 'tb')
  shutil.rmtree(tb)
  why_not = _mount_tmpfs(tb, '64k')
  if why_not:
    pytest.skip(why_not)
  try:
    _fill(tb)
    watched = [os.path.join(workdir, 'checkpoints'), os.path.join(workdir, 'config.json')]
    before = [dir_hash(p) for p in watched]
    proc = run_cmd(main_cmd(workdir, puzzle_cache, *TRAIN, f'--config.train.num_steps={STEPS + 2}'),
                   jax_cache, timeout=240)
    _one_line(proc.returncode, proc.stdout, proc.stderr, f'cannot write {tb}/events.out.tfevents',
              'no space left on device (ENOSPC)', 'rerun the same command', short=str(tmp_path))
    assert [dir_hash(p) for p in watched] == before
  finally:
    subprocess.run(['umount', '-l', tb], check=False)


# ------------------------------------------------------------------- python -m hmdlm_jax.front


@pytest.mark.parametrize('flags, words', [
    ([], ('the following arguments are required: --workdirs', '--help')),
    (['--workdirs=A', '--steps=a'], ('argument --steps: invalid', "'a'")),
    (['--workdirs=A', '--steps=0'], ('--steps=0 must be a non-empty', 'step counts >= 1')),
    (['--workdirs=A', '--steps='], ('--steps= must be a non-empty',)),
    (['--workdirs=A', '--top_p=1.5'], ('--top_p=1.5 must be', 'nucleus masses in (0, 1]')),
    (['--workdirs=A', '--temperatures=0'], ('--temperatures=0.0 must be', 'temperatures > 0')),
    (['--workdirs=A', '--num_samples=0'], ('--num_samples=0 must be >= 1',)),
    (['--workdirs=A', '--params=best'], ("argument --params: invalid choice: 'best'",)),
    (['--workdirs=A', '--out={file}/x.json'], ('is a file, not a folder', 'another --out')),
    (['--workdirs={tmp}/no_such_run'], ('no_such_run', 'holds no config.json')),
])
def test_front_bad_input_is_one_line(tmp_path, capsys, flags, words):
  """Validate first: every refusal comes before a run is read or anything is written."""
  (tmp_path / 'a_file').write_text('not a folder\n', encoding='utf-8')
  argv = [f.format(file=tmp_path / 'a_file', tmp=tmp_path) for f in flags]
  if not any(a.startswith('--out') for a in argv) and argv:
    argv.append(f'--out={tmp_path / "front" / "x.json"}')
  before = dir_hash(str(tmp_path))
  capsys.readouterr()
  with pytest.raises(SystemExit) as e:
    front.main(argv)
  err = capsys.readouterr().err + ('' if isinstance(e.value.code, int) else str(e.value.code))
  rc = e.value.code if isinstance(e.value.code, int) else 1
  _one_line(rc, '', err + '\n', *words)
  assert dir_hash(str(tmp_path)) == before


def test_front_refuses_a_sudoku_run(trained, tmp_path):
  with pytest.raises(SystemExit) as e:
    front.main([f'--workdirs={trained["workdir"]}', f'--out={tmp_path / "x.json"}'])
  assert str(e.value.code).startswith(f'{PREFIX}--workdirs: {trained["workdir"]} is a '
                                      "data.kind='sudoku' run; the sweep scores text")
  assert not list(tmp_path.iterdir())
