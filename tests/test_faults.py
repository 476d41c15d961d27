"""Fault injection (issue 15): every bad input gives ONE clear line and leaves every file as it was.

Each command-line probe asserts: exit code 1, exactly one stderr line starting with
`hmdlm_jax: error:` that names the file / field (`EXPECT`), no 'Traceback', and a tree hash of the
directories it could touch that is the same before and after (a directory that did not exist still
does not). The probes run through tests/fault_driver.py: one subprocess imports the package once
and forks a child per probe, so ~30 command lines cost about one JAX start-up. Trained workdirs are
copies of the session's reference run (tests/conftest.py).

Read-only workdirs: chmod makes them read-only for a normal user; root ignores permission bits, so
when the tests run as root those probes run as uid 65534 (nobody) in a world-readable temporary
folder, and are skipped (with the reason) where the user cannot be changed.

The SIGKILL campaign (slow): ≥ 5 trials, a seed each, kill a training run at a random step or in
the middle of a checkpoint save, resume with the same command, and compare with the uninterrupted
reference run: every loss bit-identical, every step 1..N in metrics.jsonl, the final state equal.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import numpy as np
import pytest

from hmdlm_jax.configs import text as text_config
from hmdlm_jax.configs import tiny_test
from hmdlm_jax import config as config_lib
from hmdlm_jax import preflight
from hmdlm_jax import workdir as workdir_lib
from hmdlm_jax.data import text as text_data
from hmdlm_jax.data import text_encode
from tests.conftest import (REF_STEPS, REPO, dir_hash, load_checkpoint_state, main_cmd,
                            read_jsonl, run_cmd, subprocess_env, train_losses)

PREFIX = 'hmdlm_jax: error:'
OFFSETS = ('--config.schedule.offsets_max=-1.0',
           '--config.schedule.offsets=(0.5,0.4,0.3,0.2,0.1,0.0)')
UNSOLVABLE = '12345678.' + '........9' + '.' * 63  # no repeated digit; cell 9 has no candidate
PUZZLE = ('000000010400000000020000000000050407008000300001090000300400200050100000000806000')

# probe -> substrings its error line must contain (None: the probe must succeed).
EXPECT: dict[str, tuple[str, ...] | None] = {}
PROBES: list[dict[str, Any]] = []


def _probe(name: str, expect: tuple[str, ...] | None, argv: list[str], watch: list[str], *,
           entry: str = 'main', **kw: Any) -> None:
  EXPECT[name] = expect
  PROBES.append(dict(name=name, entry=entry, argv=argv, watch=watch, **kw))


def _read_only(path: str) -> None:
  for root, dirs, files in os.walk(path):
    for f in files:
      os.chmod(os.path.join(root, f), 0o444)
  for root, dirs, _ in os.walk(path, topdown=False):
    for d in dirs:
      os.chmod(os.path.join(root, d), 0o555)
  os.chmod(path, 0o555)


def _writable(path: str) -> None:
  for root, dirs, files in os.walk(path):
    os.chmod(root, 0o755)
    for d in dirs:
      os.chmod(os.path.join(root, d), 0o755)


def _define_probes(d: dict[str, str], cache: str, world_cache: str) -> None:
  """The probes of issue 15 (d: the paths of the fixture)."""
  t = [sys.executable, '--config=configs/tiny_test.py', f'--config.data.cache_dir={cache}',
       f'--config.train.num_steps={REF_STEPS}', '--config.train.ckpt_every=20']
  txt = [sys.executable, '--config=configs/text.py']
  run, new = d['run'], d['new']
  # 1. A rejected run never touches the record (config.json, checkpoints, metrics).
  _probe('resume_with_changed_model',
         ('holds checkpoints', 'model.hidden_size: 32 -> 64', '--resume_with_changes'),
         t + [f'--workdir={run}', '--config.model.hidden_size=64', '--config.train.num_steps=120'],
         [run])
  _probe('bad_lr_on_trained_workdir', ('optim.lr=-0.001 must lie in (0, inf)',),
         t + [f'--workdir={run}', '--config.optim.lr=-1e-3'], [run])
  _probe('eval_with_changed_model', ('holds another model', 'model.hidden_size: 32 -> 48'),
         t + [f'--workdir={run}', '--mode=eval', '--config.model.hidden_size=48'], [run])
  # 2. Appendix D's ordering with schedule.check_ordering='error' (the default).
  _probe('ordering_error_train', ('violates the reveal ordering', 'schedule.check_ordering'),
         t + [f'--workdir={new}', *OFFSETS], [new])
  _probe('ordering_error_eval', ('violates the reveal ordering', 'schedule.check_ordering'),
         t + [f'--workdir={run}', '--mode=eval', *OFFSETS], [run])
  # 3. The data's shape against the model.
  _probe('sudoku_seq_len', ('model.seq_len=64', '81'),
         t + [f'--workdir={new}', '--config.model.seq_len=64',
              '--config.model.position_embedding=rotary'], [new])
  _probe('sudoku_vocab', ('model.vocab_size=12', 'vocab_size=10'),
         t + [f'--workdir={new}', '--config.model.vocab_size=12'], [new])
  _probe('sudoku_levels', ('model.num_levels=3',),
         t + [f'--workdir={new}', '--config.model.num_levels=3'], [new])
  _probe('text_seq_len', ('data.seq_len=64', 'model.seq_len=32'),
         txt + [f'--workdir={new}', '--config.model.seq_len=32'], [new])
  _probe('text_vocab', ('model.vocab_size=100', 'tokenizer', '--config.model.vocab_size=30523'),
         txt + [f'--workdir={new}', '--config.model.vocab_size=100'], [new])
  # 4. Unusable workdirs and output folders.
  _probe('workdir_in_proc', ("--workdir='/proc/hmdlm_faults/run' cannot be created",
                             "'/proc' is not writable"),
         t + ['--workdir=/proc/hmdlm_faults/run'], [])
  _probe('workdir_below_a_file', (f"{d['file']!r} is a file",),
         t + [f'--workdir={d["file"]}/run'], [d['file']])
  _probe('workdir_read_only_train', ('is not writable',),
         t + [f'--workdir={d["ro_run"]}', f'--config.data.cache_dir={world_cache}'],
         [d['ro_run']], nobody=True)
  _probe('eval_read_only_without_out', ('is not writable', '--out=DIR'),
         t + [f'--workdir={d["ro_run"]}', '--mode=eval', f'--config.data.cache_dir={world_cache}'],
         [d['ro_run']], nobody=True)
  _probe('eval_read_only_with_out', None,
         t + [f'--workdir={d["ro_run"]}', '--mode=eval', f'--out={d["ro_out"]}',
              f'--config.data.cache_dir={world_cache}', "--config.eval.decodings=('greedy',)"],
         [d['ro_run']], nobody=True)
  _probe('eval_again_same_out', ('eval_100_test_allrows_seeds0.json exists', '--overwrite', '--out=ANOTHER_DIR'),
         t + [f'--workdir={d["ro_run"]}', '--mode=eval', f'--out={d["ro_out"]}',
              f'--config.data.cache_dir={world_cache}', "--config.eval.decodings=('greedy',)"],
         [d['ro_run'], d['ro_out']], nobody=True)
  _probe('out_below_a_file', (f"{d['file']!r} is a file",),
         t + [f'--workdir={run}', '--mode=eval', f'--out={d["file"]}/out'], [run, d['file']])
  _probe('eval_missing_workdir', ('does not exist: train first',),
         t + [f'--workdir={new}', '--mode=eval'], [new])
  # 6. The config file itself.
  for name, expect in (('missing', ('no such file', 'configs/sudoku.py')),
                       ('syntax', ('syntax error at line 2',)),
                       ('wrong_type', ('get_config() returned dict', 'ConfigDict')),
                       ('returns_none', ('get_config() returned NoneType',)),
                       ('import_error', ('importing it failed', 'ModuleNotFoundError')),
                       ('no_get_config', ('defines no get_config()',))):
    path = d[f'cfg_{name}']
    _probe(f'config_file_{name}', (f'--config={path}',) + expect,
           [sys.executable, f'--config={path}', f'--workdir={run}'], [run])
  _probe('unknown_override_beside_valid', ('--config.model.nonexistent',),
         t + [f'--workdir={run}', '--config.model.nonexistent=1', '--config.model.num_levels=6'],
         [run])
  _probe('bad_override_value', ('--config.model.num_levels=abc',),
         t + [f'--workdir={run}', '--config.model.num_levels=abc'], [run])
  # 7. Binary corpus.
  _probe('binary_corpus', (f'config.data.train_path: {d["binary"]} is not UTF-8 text',),
         txt + [f'--workdir={new}', f'--config.data.train_path={d["binary"]}'], [new])
  # 8. --step of a step that does not exist.
  _probe('missing_step', ('--step=15', 'holds steps [60, 80, 100]'),
         t + [f'--workdir={run}', '--mode=eval', '--step=15'], [run])
  # 9. init.mdlm_checkpoint and convert_mdlm.
  _probe('init_checkpoint_missing', ('init.mdlm_checkpoint=', 'does not exist'),
         t + [f'--workdir={new}', f'--config.init.mdlm_checkpoint={d["dir"]}/none.npz'], [new])
  _probe('init_checkpoint_corrupt', ('init.mdlm_checkpoint=', 'not a parameter file'),
         t + [f'--workdir={new}', f'--config.init.mdlm_checkpoint={d["corrupt_npz"]}'], [new])
  _probe('init_checkpoint_wrong_shapes', ('init.mdlm_checkpoint=', 'checkpoint lacks'),
         t + [f'--workdir={new}', f'--config.init.mdlm_checkpoint={d["small_npz"]}'], [new])
  # Off by default (hmdlm_jax/hub.py): a Hub checkpoint that is not cached says how to allow it.
  _probe('init_checkpoint_hub_off', ('init.mdlm_checkpoint=', 'hmdlm-test/absent',
                                     'set HMDLM_HUB=1'),
         t + [f'--workdir={new}', '--config.init.mdlm_checkpoint=hf://hmdlm-test/absent'], [new])
  conv = [sys.executable]
  _probe('convert_hub_off', ('--src=hf://hmdlm-test/absent', 'set HMDLM_HUB=1'),
         conv + ['--src', 'hf://hmdlm-test/absent', '--dst', f'{d["dst"]}/x.npz'], [d['dst']],
         entry='convert')
  _probe('convert_missing_source', ('--src=', 'no such file'),
         conv + ['--src', f'{d["dir"]}/none.safetensors', '--dst', f'{d["dst"]}/x.npz'],
         [d['dst']], entry='convert')
  _probe('convert_corrupt_safetensors', ('not a readable safetensors file',),
         conv + ['--src', d['corrupt_st'], '--dst', f'{d["dst"]}/x.npz'], [d['dst']],
         entry='convert')
  _probe('convert_ckpt_without_torch', ('needs torch',),
         conv + ['--src', d['ckpt'], '--dst', f'{d["dst"]}/x.npz'], [d['dst']],
         entry='convert', block_modules=['torch'])
  # 10. Puzzles, outputs of earlier runs, the wrong flags for the mode.
  _probe('unsolvable_puzzle', ('puzzle 1 on the command line has no solution',),
         t + [f'--workdir={run}', '--mode=sample', f'--inputs={UNSOLVABLE}'], [run])
  _probe('binary_input_file', (f'{d["binary"]}: not UTF-8 text',),
         t + [f'--workdir={run}', '--mode=sample', f'--input_file={d["binary"]}'], [run])
  _probe('sample_again', ('samples_100.jsonl exists', '--overwrite'),
         t + [f'--workdir={d["sampled"]}', '--mode=sample', f'--inputs={PUZZLE}'],
         [d['sampled']])
  _probe('sample_pictures_taken', ('pictures exists', '--overwrite'),
         t + [f'--workdir={run}', '--mode=sample', f'--inputs={PUZZLE}',
              f'--out={d["pictured"]}'], [run, d['pictured']])
  _probe('wandb_not_installed', ("train.wandb='hmdlm-test'", 'pip install "hmdlm_jax[wandb]"'),
         t + [f'--workdir={new}', '--config.train.wandb=hmdlm-test'], [new],
         block_modules=['wandb'])
  _probe('step_flag_in_train', ('--step apply to --mode=eval',),
         t + [f'--workdir={run}', '--step=20'], [run])


@pytest.fixture(scope='module')
def probe_results(reference_run, tmp_path_factory, puzzle_cache, jax_cache) -> dict[str, Any]:
  base = str(tmp_path_factory.mktemp('faults'))
  d = {'dir': base, 'run': os.path.join(base, 'run'), 'new': os.path.join(base, 'new', 'run'),
       'file': os.path.join(base, 'a_file'), 'binary': os.path.join(base, 'corpus.txt'),
       'dst': os.path.join(base, 'dst'), 'sampled': os.path.join(base, 'sampled'),
       'pictured': os.path.join(base, 'pictured')}
  shutil.copytree(reference_run['workdir'], d['run'])
  shutil.copytree(reference_run['workdir'], d['sampled'])
  with open(os.path.join(d['sampled'], 'samples_100.jsonl'), 'w', encoding='utf-8') as f:
    f.write('{"index": 0}\n')
  os.makedirs(os.path.join(d['pictured'], 'pictures'))
  with open(os.path.join(d['pictured'], 'pictures', 'sudoku_reveal_0.png'), 'wb') as f:
    f.write(b'an earlier picture')
  with open(d['file'], 'w', encoding='utf-8') as f:
    f.write('not a directory')
  with open(d['binary'], 'wb') as f:
    f.write(bytes(range(256)) * 64)
  os.makedirs(d['dst'])
  for name, data in (('corrupt_npz', b'PK\x03\x04 truncated'), ('corrupt_st', b'\x00' * 64),
                     ('ckpt', b'not really a checkpoint')):
    ext = {'corrupt_npz': '.npz', 'corrupt_st': '.safetensors', 'ckpt': '.ckpt'}[name]
    d[name] = os.path.join(base, name + ext)
    with open(d[name], 'wb') as f:
      f.write(data)
  d['small_npz'] = os.path.join(base, 'small.npz')
  np.savez(d['small_npz'], **{'vocab_embed/embedding': np.zeros((10, 32), np.float32)})
  bodies = {'missing': None, 'syntax': 'def get_config():\n  return (\n', 'wrong_type':
            'def get_config():\n  return {"model": {}}\n', 'returns_none':
            'def get_config():\n  return None\n', 'import_error':
            'import no_such_module_hmdlm\n', 'no_get_config': 'CONFIG = 1\n'}
  for name, body in bodies.items():
    d[f'cfg_{name}'] = os.path.join(base, f'cfg_{name}.py')
    if body is not None:
      with open(d[f'cfg_{name}'], 'w', encoding='utf-8') as f:
        f.write(body)
  # A world-readable folder for the read-only probes (run as nobody when we are root).
  world = tempfile.mkdtemp(prefix='hmdlm_faults_', dir='/tmp')
  os.chmod(world, 0o755)
  d['ro_run'] = os.path.join(world, 'run')
  shutil.copytree(reference_run['workdir'], d['ro_run'])
  world_cache = os.path.join(world, 'cache')
  shutil.copytree(puzzle_cache, world_cache)
  outs = os.path.join(world, 'outs')
  os.makedirs(outs)
  for p in (world_cache, outs):
    os.chmod(p, 0o777)
  d['ro_out'] = os.path.join(outs, 'eval')
  _read_only(d['ro_run'])
  EXPECT.clear()
  PROBES.clear()
  _define_probes(d, puzzle_cache, world_cache)
  spec, result = os.path.join(base, 'probes.json'), os.path.join(base, 'results.json')
  with open(spec, 'w', encoding='utf-8') as f:
    json.dump(PROBES, f)
  try:
    proc = run_cmd([sys.executable, '-m', 'tests.fault_driver', spec, result], jax_cache,
                   timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(result, encoding='utf-8') as f:
      results = json.load(f)
  finally:
    _writable(world)
    runs = os.path.join(d['ro_out'], workdir_lib.RUNS_FILE)
    run_record = read_jsonl(runs) if os.path.exists(runs) else []
    shutil.rmtree(world, ignore_errors=True)
  results['_paths'] = d
  results['_ro_out_runs'] = run_record
  return results


def _names() -> list[str]:
  _define_probes({k: f'/x/{k}' for k in (
      'run', 'new', 'file', 'binary', 'dst', 'sampled', 'pictured', 'dir', 'ro_run', 'ro_out',
      'corrupt_npz', 'corrupt_st', 'ckpt', 'small_npz', *(f'cfg_{n}' for n in (
          'missing', 'syntax', 'wrong_type', 'returns_none', 'import_error', 'no_get_config')))},
                 '/x/cache', '/x/world_cache')
  names = [p['name'] for p in PROBES]
  EXPECT.clear()
  PROBES.clear()
  return names


@pytest.mark.parametrize('name', _names())
def test_probe(probe_results, name):
  r = probe_results[name]
  if r['skipped']:
    pytest.skip(r['skipped'])
  expect = EXPECT[name]
  err = r['stderr']
  assert 'Traceback' not in err, err[-3000:]
  if expect is None:
    assert r['rc'] == 0, err[-3000:]
  else:
    lines = [line for line in err.splitlines() if line.startswith(PREFIX)]
    assert r['rc'] == 1, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    assert 'hmdlm_jax: error' not in err.replace(lines[0], ''), err[-3000:]
    for s in expect:
      assert s in lines[0], (s, lines[0])
    if name == 'unknown_override_beside_valid':
      assert 'num_levels' not in lines[0]  # only the bad key is named
  for path, before in r['before'].items():
    assert r['after'][path] == before, f'{path} changed'


def test_read_only_eval_writes_only_to_out(probe_results):
  r = probe_results['eval_read_only_with_out']
  if r['skipped']:
    pytest.skip(r['skipped'])
  assert 'Evaluation of step 100' in r['stdout']
  (record,) = probe_results['_ro_out_runs']
  assert record['mode'] == 'eval' and record['step'] == 100
  assert record['out'].endswith('/outs/eval') and record['workdir'].endswith('/run')
  assert '--mode=eval' in record['argv'] and record['config']['eval']['decodings'] == ['greedy']


def test_probe_driver_is_fast_enough(probe_results):
  """Most probes fail in the checks, long before any training or compilation."""
  quick = [r['seconds'] for n, r in probe_results.items()
           if not n.startswith('_') and EXPECT.get(n) is not None and not r['skipped']]
  assert np.median(quick) < 30, sorted(quick)


# ----------------------------------------------------------------------------- in-process checks


def test_config_changes_name_only_real_changes():
  config = config_lib.resolve(tiny_test.get_config())
  stored = workdir_lib.config_to_dict(config)
  stored['train']['num_steps'] = 5  # not a resume field
  assert workdir_lib.config_changes(stored, config) == []
  stored['model']['hidden_size'] = 48
  stored['optim']['lr'] = 0.5
  assert workdir_lib.config_changes(stored, config) == [
      'model.hidden_size: 48 -> 32', 'optim.lr: 0.5 -> 0.02']


def test_check_outputs(tmp_path):
  (tmp_path / 'pictures').mkdir()
  workdir_lib.check_outputs(str(tmp_path), ['eval_3.json', 'pictures'], False)  # empty folder
  (tmp_path / 'pictures' / 'a.png').write_bytes(b'x')
  with pytest.raises(ValueError, match='pictures exists'):
    workdir_lib.check_outputs(str(tmp_path), ['eval_3.json', 'pictures'], False)
  workdir_lib.check_outputs(str(tmp_path), ['pictures'], True)


@pytest.mark.parametrize('mode', ['error', 'warn', 'off'])
def test_check_ordering_modes_in_preflight(tmp_path, mode):
  config = tiny_test.get_config()
  config.schedule.offsets_max = -1.0
  config.schedule.offsets = (0.5, 0.4, 0.3, 0.2, 0.1, 0.0)
  config.schedule.check_ordering = mode
  workdir = str(tmp_path / 'run')
  if mode == 'error':
    with pytest.raises(ValueError, match='violates the reveal ordering'):
      preflight.check('train', config_lib.resolve(config), workdir)
  else:
    with pytest.warns(UserWarning):
      plan = preflight.check('train', config_lib.resolve(config), workdir)
    assert plan.step is None and plan.config.schedule.check_ordering == mode
  assert not os.path.exists(workdir)


def test_selected_token_rows_on_several_devices_is_refused_before_writing(tmp_path, monkeypatch):
  # The count of devices preflight sees (the mesh resolves to all of them): 8, as on a pod host.
  monkeypatch.setattr(preflight.jax, 'device_count', lambda: 8)
  config = tiny_test.get_config()
  config.mesh.data = 8
  workdir = str(tmp_path / 'run')
  config.loss.token_rows = 'auto'  # resolves to 'all' on 8 devices
  assert preflight.check('train', config_lib.resolve(config), workdir).step is None
  config.loss.token_rows = 'selected'
  with pytest.raises(ValueError, match="loss.token_rows='selected'.*this mesh has 8"):
    preflight.check('train', config_lib.resolve(config), workdir)
  assert not os.path.exists(workdir)


def _long_line_corpus(tmp_path, words: int) -> tuple[Any, str]:
  corpus = tmp_path / 'corpus.txt'
  normal = [f'line number {i} of a small corpus about shakespeare' for i in range(40)]
  corpus.write_text('\n'.join(normal[:7] + ['lorem ipsum dolor ' * (words // 3)] + normal[7:])
                    + '\n', encoding='utf-8')
  config = text_config.get_config()
  config.data.train_path = str(corpus)
  config.data.test_fraction = 0.0
  config.data.num_workers = 0
  return config_lib.resolve(config), str(corpus)


def _report_lines(monkeypatch) -> list[str]:
  lines: list[str] = []
  monkeypatch.setattr(text_encode.logging, 'warning', lambda fmt, msg: lines.append(msg))
  monkeypatch.setattr(text_encode.logging, 'info', lambda fmt, msg: lines.append(msg))
  return lines


def test_a_report_with_a_long_path_keeps_its_name_within_300_characters():
  stats = text_encode.FileStats()
  for n in (10, 500, 20):
    stats.add(n, 62)
  label = 'config.data.train_path: /' + 'deep/' * 80 + 'corpus_file.txt'
  line = stats.message(label, 'train', 64, 'drop')
  assert len(line) <= 300 and line.startswith('config.data.train_path: /deep/')
  assert '…' in line and 'corpus_file.txt (train split): 1 of 3 examples exceed' in line
  assert line.endswith("data.overlong='drop' drops their rows: 500 of 530 tokens (94.3%); the "
                       'longest is example #2 (500 tokens).')
  assert stats.message('f: a.txt', 'test', 64, 'drop').startswith('f: a.txt (test split): ')


@pytest.mark.parametrize('words', [
    30_000, pytest.param(600_000, marks=pytest.mark.slow, id='3.5MB')])
def test_overlong_line_is_reported_per_file(tmp_path, monkeypatch, words):
  config, corpus = _long_line_corpus(tmp_path, words)
  lines = _report_lines(monkeypatch)
  start = time.perf_counter()
  ds = text_data.make_text_dataset(config, 'train', seed=0, process_index=0, process_count=1)
  batches = [next(iter(ds)) for _ in range(1)]
  (line,) = lines
  label, body = line.split(' (train split): ')
  assert len(line) <= 300 and label.startswith('config.data.train_path: ')
  assert label.endswith(os.path.basename(corpus))  # a long path loses its middle, not its name
  assert label == f'config.data.train_path: {corpus}' or '…' in label
  assert body.startswith('1 of 41 examples exceed data.seq_len=64 (62 tokens + BOS/EOS); '
                         "data.overlong='truncate' cuts ")
  assert re.search(r'the longest is example #8 \([\d,]+ tokens\)\.$', body), body
  assert batches[0]['tokens'].shape == (16, 64)
  # Tokenised once: a batch costs no re-tokenisation of the long line (~10 tokens/s before).
  t0 = time.perf_counter()
  it = iter(ds)
  for _ in range(5):
    next(it)
  assert time.perf_counter() - t0 < 0.5 * (t0 - start) + 5.0


def test_binary_corpus_names_file_and_field(tmp_path):
  config, _ = _long_line_corpus(tmp_path, 3)
  (tmp_path / 'corpus.txt').write_bytes(b'ok\n\x86\xff\x00binary')
  with pytest.raises(ValueError, match=r'config.data.train_path: .*corpus.txt is not UTF-8 text '
                                       r"\(byte b'\\x86' at offset 3\)"):
    text_data.make_text_dataset(config, 'train', seed=0, process_index=0, process_count=1)


@pytest.mark.parametrize('field', ['train_path', 'test_path'])
def test_empty_corpus_names_field_and_file(tmp_path, jax_cache, field):
  # It was "0 examples, fewer than the 1 processes", naming neither.
  paths = {'train_path': tmp_path / 'train.txt', 'test_path': tmp_path / 'test.txt'}
  paths['train_path'].write_text('a line of text\n' * 8, encoding='utf-8')
  paths['test_path'].write_text('another line\n' * 8, encoding='utf-8')
  paths[field].write_text('\n  \n', encoding='utf-8')  # blank lines only: no example
  workdir = tmp_path / 'run'
  before = dir_hash(str(tmp_path))
  done = run_cmd([sys.executable, '-m', 'hmdlm_jax.main', '--config=configs/text.py',
                  f'--workdir={workdir}', f'--config.data.train_path={paths["train_path"]}',
                  f'--config.data.test_path={paths["test_path"]}',
                  '--config.data.test_fraction=0.0', '--config.data.num_workers=0'], jax_cache)
  assert done.returncode == 1, done.stderr[-3000:]
  errors = [l for l in done.stderr.splitlines() if l.startswith(PREFIX)]
  assert len(errors) == 1 and 'Traceback' not in done.stderr, done.stderr[-3000:]
  assert f"config.data.{field}='{paths[field]}' holds no examples" in errors[0], errors[0]
  assert not workdir.exists() and dir_hash(str(tmp_path)) == before


# ----------------------------------------------------------------------------- SIGKILL campaign

KILL_TRIALS = 6


def _tmp_steps(workdir: str) -> list[str]:
  d = os.path.join(workdir, 'checkpoints')
  return [n for n in os.listdir(d) if '.orbax-checkpoint-tmp' in n] if os.path.isdir(d) else []


def _logged_steps(workdir: str) -> int:
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return 0
  with open(path, encoding='utf-8') as f:
    return sum(1 for line in f if line.endswith('\n'))


def _kill_at_random(cmd: list[str], jax_cache: str, workdir: str, seed: int) -> str:
  """Starts `cmd`, SIGKILLs it at a seeded random point; returns where it was killed."""
  rng = random.Random(seed)
  during_save = seed % 2 == 1
  target = rng.choice([20, 40, 60, 80]) if during_save else rng.randint(3, REF_STEPS - 3)
  proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(jax_cache), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 300
  try:
    while True:
      if proc.poll() is not None or time.monotonic() > deadline:
        pytest.fail(f'trial {seed}: run ended (rc={proc.returncode}) before the kill point')
      if during_save:
        tmp = [n for n in _tmp_steps(workdir) if n.startswith(f'{target}.')]
        if tmp or _logged_steps(workdir) >= target + 2:
          time.sleep(rng.uniform(0.0, 0.02))
          where = f'during the save of step {target}' if tmp else f'after the save of {target}'
          break
      elif _logged_steps(workdir) >= target:
        where = f'at step {target}'
        break
      time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  if during_save:
    left = [n for n in _tmp_steps(workdir) if n.startswith(f'{target}.')]
    where += ' (a partial save was left behind)' if left else ' (the save had completed)'
  return where


@pytest.mark.slow
@pytest.mark.parametrize('seed', range(KILL_TRIALS))
def test_sigkill_then_resume_is_bit_identical(reference_run, tmp_path, puzzle_cache, jax_cache,
                                              seed):
  workdir = str(tmp_path / 'run')
  cmd = main_cmd(workdir, puzzle_cache)
  where = _kill_at_random(cmd, jax_cache, workdir, seed)
  first_config = dir_hash(os.path.join(workdir, 'config.json'))
  resumed = run_cmd(cmd, jax_cache, timeout=600)
  assert resumed.returncode == 0, (where, resumed.stderr[-3000:])
  ref = train_losses(reference_run['workdir'])
  got = train_losses(workdir)  # the last line of each step
  assert sorted(got) == list(range(1, REF_STEPS + 1)), (where, sorted(set(ref) - set(got)))
  assert got == ref, where  # bit-identical floats (JSON round-trips float32 exactly)
  a, tree_a = jax.tree.flatten(load_checkpoint_state(reference_run['workdir'], REF_STEPS))
  b, tree_b = jax.tree.flatten(load_checkpoint_state(workdir, REF_STEPS))
  assert tree_a == tree_b, where
  for x, y in zip(a, b):  # params, EMA, optimiser state, step, key, counters: bit for bit
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), where
  if first_config is not None:  # a resume keeps the first run's record
    assert dir_hash(os.path.join(workdir, 'config.json')) == first_config
  modes = [r['mode'] for r in read_jsonl(os.path.join(workdir, workdir_lib.RUNS_FILE))]
  assert modes in (['train'], ['train', 'train']), (where, modes)
  print(f'trial {seed}: killed {where}; resumed bit-identically', file=sys.stderr)
