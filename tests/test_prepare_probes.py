"""Bad input to `python -m hmdlm_jax.data.prepare` (issue 67): one line, exit 1, nothing written.

Each probe calls the command line's own `prepare.main(argv)` in this process (no start-up cost)
or, where a kill, another user or a full disk is the point, one short subprocess. Each asserts
exit code 1, exactly one stderr line `hmdlm_jax: error: ...` (<= 300 characters) holding the
words that name the file / flag and what to do, no traceback, and that the output and input
folders are byte-identical before and after (tests/conftest.py's dir_hash; a folder that did not
exist still does not). A killed run with two workers resumes to shards byte-identical to an
uninterrupted run's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import pytest

from hmdlm_jax.data import prepare
from hmdlm_jax.data import tokenizers
from tests.conftest import REPO, dir_hash

PREFIX = 'hmdlm_jax: error: '
BERT = tokenizers.OFFLINE_BERT
NOBODY = 65534


def _lines(n: int, offset: int = 0) -> str:
  """n distinct plain-text lines (documents)."""
  return ''.join(f'line {i + offset} of the probe corpus, with some words in it\n'
                 for i in range(n))


def _one_line(rc: int, err: str, *words: str) -> str:
  """The error line, checked: exit 1, the only line of stderr, no traceback, <= 300 chars."""
  assert rc == 1, (rc, err[-3000:])
  assert 'Traceback' not in err, err[-3000:]
  lines = err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(PREFIX), err[-3000:]
  assert len(lines[0]) <= 300, lines[0]
  for w in words:
    assert w in lines[0], (w, lines[0])
  return lines[0]


def _main(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
  capsys.readouterr()
  rc = prepare.main(list(argv))
  return rc, capsys.readouterr().err


@pytest.fixture
def inputs(tmp_path) -> dict[str, str]:
  """Input files of every kind the probes need, in tmp_path/in."""
  d = tmp_path / 'in'
  d.mkdir()
  (d / 'empty.txt').write_bytes(b'')
  (d / 'binary.txt').write_bytes(bytes(range(256)) * 64)
  (d / 'ok.txt').write_text(_lines(50), encoding='utf-8')
  (d / 'nothing_known').mkdir()
  (d / 'nothing_known' / 'table.csv').write_text('a,b\n', encoding='utf-8')
  (d / 'a_file').write_text('not a folder\n', encoding='utf-8')
  return {p.name.split('.')[0]: str(p) for p in d.iterdir()}


@pytest.mark.parametrize('name, flags, words', [
    ('empty', ['--input={empty}'], ('--input:', 'empty.txt is empty', 'no documents')),
    ('binary', ['--input={binary}'], ('--input:', 'binary.txt is not UTF-8 text',
                                          'at offset 128', 'iconv -t utf-8')),
    ('no_matching_files', ['--input={nothing_known}'],
     ("--input='", 'nothing_known', 'no .txt/.text/.jsonl/.json/.parquet files there')),
    ('no_such_glob', ['--input={nothing_known}/*.txt'], ('no such file',)),
    ('split_escape', ['--input={ok}', '--split=../../escape'],
     ("--split='../../escape'; allowed: ['train', 'test']",)),
    ('workers_zero', ['--input={ok}', '--workers=0'], ('--workers=0 must be >= 1',)),
    ('workers_not_int', ['--input={ok}', '--workers=two'],
     ('argument --workers: invalid int value', "'two'")),
    ('shard_mb_zero', ['--input={ok}', '--shard_mb=0'], ('--shard_mb=0.0 must be > 0',)),
    ('output_below_a_file', ['--input={ok}', '--output={a_file}/corpus'],
     ('a_file', 'not a directory (ENOTDIR)', 'choose another --output')),
])
def test_bad_input_is_one_line_and_writes_nothing(inputs, tmp_path, capsys, name, flags, words):
  """Validate first: the refusal comes before the output folder is created."""
  del name
  out = str(tmp_path / 'out')
  argv = [f.format(**inputs) for f in flags]
  if not any(f.startswith('--output') for f in argv):
    argv.append(f'--output={out}')
  before = dir_hash(str(tmp_path))
  rc, err = _main(capsys, *argv, f'--tokenizer={BERT}')
  _one_line(rc, err, *words)
  assert dir_hash(str(tmp_path)) == before  # no output folder, no plan.json, inputs unchanged


@pytest.mark.parametrize('premade', [False, True], ids=['new_output', 'empty_output_folder'])
def test_a_fixed_input_is_then_prepared(inputs, tmp_path, capsys, premade):
  """A file whose bad byte lies past the up-front check (SNIFF_BYTES) fails while its shard is
  written: one line, and the output as it was (no plan.json, no partial shard, no new folder).
  Its fixed version is then prepared into the same --output (the plan left by such a failure
  made the rerun refuse it as 'prepared from other inputs'), whether or not the output folder
  was there before."""
  del inputs
  src = tmp_path / 'late_binary.txt'
  good = _lines(2000).encode()
  assert len(good) > prepare.SNIFF_BYTES
  src.write_bytes(good + b'\xff\n' + _lines(3).encode())
  out = str(tmp_path / 'out')
  if premade:
    os.makedirs(os.path.join(out, 'train'))
  before = dir_hash(out)
  argv = (f'--input={src}', f'--output={out}', f'--tokenizer={BERT}')
  rc, err = _main(capsys, *argv)
  _one_line(rc, err, f'--input: {src} is not UTF-8 text', f'at offset {len(good):,}')
  assert dir_hash(out) == before
  src.write_bytes(good + _lines(3).encode())
  rc, err = _main(capsys, *argv)
  assert rc == 0 and not err, err
  assert prepare.plan([str(src)], 128.0, 'line')[0]['name'] + '.json' in os.listdir(
      os.path.join(out, 'train'))


def test_a_30_mb_line_stays_one_document(tmp_path):
  """A 30 MB line with --shard_mb=1: every work unit starts at a line start, the line is one
  unit's one document, whole (tokenising it takes ~45 s on 2 cores: not done here)."""
  path = tmp_path / 'long.txt'
  long_line = 'a' * (30 << 20)
  path.write_text(f'first\n{long_line}\nlast\n', encoding='utf-8')
  units = prepare.plan([str(path)], 1.0, 'line')
  data = path.read_bytes()
  assert units[0]['start'] == 0 and units[-1]['stop'] == len(data)
  assert all(a['stop'] == b['start'] for a, b in zip(units, units[1:]))
  assert all(u['start'] == 0 or data[u['start'] - 1:u['start']] == b'\n' for u in units)
  docs = [d for u in units for d in prepare.documents(u, 'text')]
  assert docs == ['first', long_line, 'last']


def _world_folder() -> str:
  """A folder that uid 65534 can reach and write (pytest's tmp_path is root's, mode 0700)."""
  d = tempfile.mkdtemp(prefix='hmdlm_prepare_probe_', dir='/tmp')
  os.chmod(d, 0o777)
  return d


def _cmd(*argv: str) -> list[str]:
  return [sys.executable, '-m', 'hmdlm_jax.data.prepare', *argv]


def _env() -> dict[str, str]:
  return dict(os.environ, PYTHONPATH=REPO, TOKENIZERS_PARALLELISM='false')


# Run as root in a fresh interpreter (no JAX threads to fork): imports what prepare needs, then
# becomes uid/gid 65534 (the venv's interpreter may be readable by root only) and runs the CLI.
_AS_NOBODY = f'''
import os, sys
from hmdlm_jax.data import prepare, tokenizers
tokenizers.load_tokenizer({BERT!r})
if os.geteuid() == 0:
  try:
    os.setgroups([])
    os.setgid({NOBODY})
    os.setuid({NOBODY})
  except OSError as e:
    print(f'cannot change to uid {NOBODY}: {{e}}', file=sys.stderr)
    sys.exit(77)
sys.exit(prepare.main(sys.argv[1:]))
'''


def _as_nobody(argv: list[str]) -> tuple[int, str]:
  """`prepare.main(argv)` as uid 65534 (when root): (exit code, stderr); 77: cannot change."""
  proc = subprocess.run([sys.executable, '-c', _AS_NOBODY, *argv], cwd=REPO, env=_env(),
                        capture_output=True, text=True, timeout=120, check=False)
  return proc.returncode, proc.stderr


def test_unreadable_input_as_another_user():
  """A 0600 input of another user (root's, read as uid 65534): one line naming it and what to
  do, nothing written."""
  world = _world_folder()
  try:
    src = os.path.join(world, 'secret.txt')
    with open(src, 'w', encoding='utf-8') as f:
      f.write(_lines(3))
    os.chmod(src, 0o600 if os.geteuid() == 0 else 0o000)
    before = dir_hash(world)
    rc, err = _as_nobody([f'--input={src}', f'--output={world}/out', f'--tokenizer={BERT}'])
    if rc == 77:
      pytest.skip(err.strip())
    _one_line(rc, err, f'--input: cannot read {src}', 'permission denied (EACCES)',
              'fix its permissions')
    assert dir_hash(world) == before
  finally:
    shutil.rmtree(world, ignore_errors=True)


@pytest.fixture
def tmpfs(tmp_path) -> Any:
  """mount(name, size) -> a tmpfs folder under tmp_path (root only: skipped elsewhere)."""
  mounted: list[str] = []

  def mount(name: str, size: str) -> str:
    path = str(tmp_path / name)
    os.makedirs(path)
    if os.geteuid() != 0:
      pytest.skip('mounting a tmpfs needs root')
    proc = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'none', path],
                          capture_output=True, text=True, check=False)
    if proc.returncode:
      pytest.skip(f'cannot mount a tmpfs here: {proc.stderr.strip()}')
    mounted.append(path)
    return path

  yield mount
  for path in reversed(mounted):
    subprocess.run(['umount', '-l', path], check=False)


def test_full_output_disk_then_rerun(tmp_path, tmpfs, capsys):
  """A 64 kB disk with 8 kB free: the first shard does not fit. One line naming the path and
  ENOSPC, the disk as it was (no plan.json, no partial shard); with space, the same command
  writes the shards an uninterrupted run writes."""
  src = tmp_path / 'in.txt'
  src.write_text(_lines(1500), encoding='utf-8')  # ~90 kB of text, ~30k tokens
  disk = tmpfs('disk', '64k')
  with open(os.path.join(disk, 'filler'), 'wb') as f:
    f.write(bytes(56 * 1024))
  before = dir_hash(disk)
  argv = (f'--input={src}', f'--output={disk}/corpus', f'--tokenizer={BERT}', '--shard_mb=0.05')
  rc, err = _main(capsys, *argv)
  _one_line(rc, err, f'{disk}/corpus', 'no space left on device (ENOSPC)',
            'rerun the same command')
  assert dir_hash(disk) == before
  os.remove(os.path.join(disk, 'filler'))
  subprocess.run(['mount', '-o', 'remount,size=4m', disk], check=True)
  rc, err = _main(capsys, *argv)
  assert rc == 0, err
  reference = str(tmp_path / 'reference')
  prepare.prepare(str(src), reference, BERT, shard_mb=0.05)
  assert dir_hash(os.path.join(disk, 'corpus')) == dir_hash(reference)


def test_kill_9_with_two_workers_then_resume_is_byte_identical(tmp_path):
  """SIGKILL to `prepare --workers=2` once its first shard is finished; the rerun skips the
  finished shards, and every shard, lengths file and sidecar equals an uninterrupted run's."""
  src = tmp_path / 'in.txt'
  src.write_text(_lines(4000), encoding='utf-8')  # ~240 kB: 12 shards of 20 kB
  out = str(tmp_path / 'killed')
  argv = (f'--input={src}', f'--output={out}', f'--tokenizer={BERT}', '--shard_mb=0.02',
          '--workers=2')
  proc = subprocess.Popen(_cmd(*argv), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)
  split = os.path.join(out, 'train')
  deadline = time.monotonic() + 120
  try:
    while not (os.path.isdir(split) and any(
        n.startswith('shard-') and n.endswith('.json') for n in os.listdir(split))):
      assert proc.poll() is None, proc.communicate()[1][-3000:]
      assert time.monotonic() < deadline, 'no shard finished in 120 s'
      time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # kill -9 PID: the workers end with it (parent_watch)
    proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  assert proc.returncode == -signal.SIGKILL
  assert not os.path.exists(os.path.join(split, prepare.MANIFEST_FILE)), 'killed too late'
  # The rerun: the same command in this process, one worker (the shards do not depend on it).
  manifest = prepare.prepare(str(src), out, BERT, shard_mb=0.02)
  assert manifest['skipped_shards'] >= 1, manifest['skipped_shards']
  reference = str(tmp_path / 'reference')
  prepare.prepare(str(src), reference, BERT, shard_mb=0.02)
  ref_split = os.path.join(reference, 'train')
  assert sorted(os.listdir(split)) == sorted(os.listdir(ref_split))
  for name in os.listdir(ref_split):
    if name == prepare.MANIFEST_FILE:
      continue  # it counts the shards the rerun skipped
    with open(os.path.join(split, name), 'rb') as a, open(os.path.join(ref_split, name),
                                                          'rb') as b:
      assert a.read() == b.read(), name
