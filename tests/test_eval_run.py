"""Tests of the evaluation entry points (hmdlm_jax/evaluation/run.py) and the task registry.

run_sample / run_eval / TrainingEvaluator on a real (untrained) tiny checkpoint: printed grids and
summaries, the records, the one eval_<step>.json schema, and one compilation across the
evaluations of a training run.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from benchmarks import compile_count
from hmdlm_jax.configs import base as base_config
from hmdlm_jax.configs import tiny_test
from hmdlm_jax import checkpoint
from hmdlm_jax import config as config_lib
from hmdlm_jax import metrics as metrics_lib
from hmdlm_jax import sharding
from hmdlm_jax import tasks
from hmdlm_jax import train
from hmdlm_jax.evaluation import reports
from hmdlm_jax.evaluation import run as eval_run
from tests.eval_helpers import puzzle_set
from tests.config_helpers import resolved

SCHEMA = {'step', 'kind', 'use_ema', 'num_examples', 'seconds', 'results', 'scalars'}


def test_flatten_metrics():
  flat = reports.flatten_metrics({'a': {'b': 1, 'c': None, 'd': float('nan'), 'e': True},
                                  'f': 2.5, 'g': 'text'})
  assert flat == {'a/b': 1.0, 'f': 2.5}


def test_tensorboard_tags_are_legal_without_a_log_line(tmp_path, caplog):
  from tensorboardX import summary  # pylint: disable=g-import-not-at-top
  names = ['hierarchy/level_accuracy/t=1.0/prior', 'greedy/per_seed/0/solve_rate', 'a b(c)']
  for name in names:  # tensorboardX's own cleaning is the oracle
    assert metrics_lib.tb_tag(name) == summary._clean_tag(name)  # pylint: disable=protected-access
  writer = metrics_lib.MetricsWriter(str(tmp_path))
  with caplog.at_level('INFO'):
    writer.write(3, 'eval', {name: 0.5 for name in names})
  writer.close()
  assert not [r for r in caplog.records if 'illegal' in r.getMessage()]
  assert metrics_lib.read_metrics(str(tmp_path))[0]['hierarchy/level_accuracy/t=1.0/prior'] == 0.5


@pytest.mark.parametrize('config_file', ['configs/tiny_test.py', 'configs/text.py'])
@pytest.mark.parametrize('num_examples', [0, 4])
def test_training_and_eval_mode_reports_never_share_a_name(config_file, num_examples):
  """Training's evaluations (eval.num_examples rows, no samples; 0 = all rows) and --mode=eval
  (every row, samples) write different files, whose names say the rows and the seeds."""
  config = config_lib.resolve(config_lib.load(config_file, [
      f'--config.eval.num_examples={num_examples}', '--config.sample.seeds=(0,1)',
      '--config.eval.num_samples=2']))
  task = tasks.get(config)
  training = task.report_name(config, 20, num_examples or None, in_training=True)
  outputs = task.outputs(config, 'eval', 20)
  assert training not in outputs and outputs[0].startswith('eval_20_test_allrows_seeds0-1')
  assert training.startswith(f'eval_20_test_{num_examples or "all"}rows')
  assert training.endswith('_in_training.json')
  if config_file.endswith('text.py'):  # text draws samples only in --mode=eval, beside the report
    assert outputs == ('eval_20_test_allrows_seeds0-1.json',
                       'eval_20_test_allrows_seeds0-1_samples.jsonl')
    assert '_seeds' not in training


def test_registry_keys_and_eval_kind_check():
  config = base_config.get_base_config()
  assert sorted(tasks.TASKS) == ['corpus', 'lm1b', 'sudoku', 'text', 'wikihow']
  assert tasks.get(resolved(config)).eval_kind == 'sudoku'
  assert tasks.TASKS['wikihow'].prompted and not tasks.TASKS['lm1b'].prompted
  config.data.kind = 'text'
  with pytest.raises(ValueError, match=r"config.eval.kind='sudoku' does not fit data.kind='text'"
                                       r".*--config.eval.kind=perplexity"):
    tasks.get(resolved(config))
  config.data.kind = 'nonsense'
  with pytest.raises(ValueError,
                     match=r"config.data.kind='nonsense' is not one of \['corpus', 'lm1b'"):
    tasks.get(resolved(config))


class _FakeIterator:
  """Stands in for the Grain train iterator whose state a checkpoint stores."""

  def get_state(self) -> bytes:
    return b'{}'


def _read_json(path: str) -> dict:
  with open(path, encoding='utf-8') as f:
    return json.load(f)


@pytest.mark.slow  # CI time (2026-12-01): nightly
def test_entry_points_from_a_checkpoint(tmp_path, capsys):
  config = tiny_test.get_config()
  config.data.cache_dir = str(tmp_path / 'cache')
  config.data.num_test_puzzles = 6
  config.data.eval_batch_size = 4  # 6 puzzles: the second batch is padded by the pipeline
  config.eval.num_examples = 4
  config.eval.decodings = ('greedy',)  # = the config's sampler (greedy): one compilation in all
  config.train.async_checkpoint = False
  config = config_lib.resolve(config)
  workdir = str(tmp_path / 'run')
  state, _ = train.create_train_state(config, sharding.make_mesh(config.mesh),
                                     tasks.build_model(config))
  ck = checkpoint.Checkpointer(workdir, config.train)
  ck.save(7, state, _FakeIterator())
  ck.close()

  quiz, _ = puzzle_set(4)  # 4 = eval_batch_size: run_sample's batch shape is run_eval's
  strings = [''.join(str(d) if d else '.' for d in q) for q in quiz]
  records = eval_run.run_sample(config, workdir, inputs=strings)
  out = capsys.readouterr().out
  assert out.count('Puzzle ') == 4 and out.count('+---------+---------+---------+') == 16
  with open(os.path.join(workdir, 'samples_7.jsonl')) as f:
    saved = [json.loads(line) for line in f]
  assert saved == records and len(saved) == 4
  num_steps = config.sample.num_steps
  for q, rec in zip(quiz, saved):
    pred = np.array([int(c) for c in rec['prediction']])
    assert (pred[q > 0] == q[q > 0]).all()  # clues kept
    steps = np.asarray(rec['reveal_step'])
    assert (steps[q > 0] == num_steps + 1).all()
    assert ((steps[q == 0] >= 1) & (steps[q == 0] <= num_steps)).all()
    assert f'[{q[0]}]' in out or q[0] == 0
    assert rec['solved'] is None  # no solution given on the command line
  assert os.path.exists(os.path.join(workdir, 'pictures', 'sudoku_reveal_0.png'))
  # The same puzzles from a quiz,solution CSV, to another output directory: 'solved' is filled in.
  quiz_sol = puzzle_set(4)
  csv_path = tmp_path / 'puzzles.csv'
  csv_path.write_text('quiz,solution\n' + ''.join(
      ''.join(map(str, q)) + ',' + ''.join(map(str, a)) + '\n' for q, a in zip(*quiz_sol)))
  with pytest.raises(ValueError, match='samples_7.jsonl exists .* --overwrite'):
    eval_run.run_sample(config, workdir, input_file=str(csv_path))  # never replaced silently
  out_path = str(tmp_path / 'solved' / 'samples_7.jsonl')
  from_file = eval_run.run_sample(config, workdir, input_file=str(csv_path),
                                  out_dir=str(tmp_path / 'solved'))
  assert os.path.exists(out_path) and [r['prediction'] for r in from_file] == [
      r['prediction'] for r in records]  # same key, same puzzles -> same grids
  for rec, a in zip(from_file, quiz_sol[1]):
    assert rec['solved'] == (rec['prediction'] == ''.join(map(str, a)))
  # Bad input fails before the checkpoint is read, naming the flag.
  with pytest.raises(ValueError, match='needs --inputs'):
    eval_run.run_sample(config, str(tmp_path / 'no_run_here'))
  capsys.readouterr()

  report = eval_run.run_eval(config, workdir, progress=False)
  saved = _read_json(os.path.join(workdir, 'eval_7_test_allrows_seeds0.json'))
  assert set(saved) == SCHEMA and saved['results']['num_puzzles'] == 6
  assert saved['step'] == 7 and saved['kind'] == 'sudoku' and saved['use_ema']
  assert saved['num_examples'] is None  # the whole test split
  assert saved['scalars'] == reports.flatten_metrics(saved['results'])
  assert report['step'] == 7 and report['scalars'] == saved['scalars']
  m = report['results']['greedy']['mean']
  assert 0.0 <= m['cell_accuracy'] <= 1.0 and m['num_puzzles'] == 6
  printed = capsys.readouterr().out
  assert printed.startswith(f'Evaluation of step 7 (sudoku, EMA params) -> '
                            f'{workdir}/eval_7_test_allrows_seeds0.json')

  # The training hook: the same schema on eval.num_examples, compiled once for all its calls.
  evaluator = eval_run.TrainingEvaluator(config, tasks.get(resolved(config)))
  flat = evaluator(config, state, 7, workdir)
  assert flat['num_puzzles'] == 4 and 0.0 <= flat['greedy/mean/cell_accuracy'] <= 1.0
  assert all(isinstance(v, float) for v in flat.values())
  saved = _read_json(os.path.join(workdir, 'eval_7_test_4rows_seeds0_in_training.json'))
  assert set(saved) == SCHEMA and saved['num_examples'] == 4 and saved['scalars'] == flat
  printed = capsys.readouterr().out  # the demo prints its figures at the end of training
  pct = f'{100 * flat["greedy/mean/cell_accuracy"]:.2f}%'
  assert 'greedy     solve' in printed and f'cell acc {pct}' in printed
  assert 'per level: L0=' in printed
  moved = state.replace(ema_params=jax.tree.map(lambda x: 0.5 * x, state.ema_params))
  counter = compile_count.compile_counter()
  n0 = len(counter.events)
  evaluator(config, moved, 8, workdir)
  assert [n for n, _ in counter.events[n0:]] == []  # new parameters, no new compilation
  saved = _read_json(os.path.join(workdir, 'eval_8_test_4rows_seeds0_in_training.json'))
  assert set(saved) == SCHEMA


# A child that writes one output and is killed part-way through it: its files may not grow past
# LIMIT bytes, and the write past that gets SIGXFSZ, whose default action ends the process like
# SIGKILL (Python ignores SIGXFSZ unless told otherwise). The kill point is exact, not a race.
_KILLED_WRITER = '''
import resource, signal, sys
from hmdlm_jax import visualize
from hmdlm_jax.evaluation import reports
what, path, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
if what == 'samples':
  reports.write_jsonl(path, [{'i': i, 'text': 'x' * 100} for i in range(2000)])
else:
  visualize.write_bytes(path, bytes(4 * limit))
'''


def _write_and_kill(what: str, path: str, limit: int = 64 * 1024) -> None:
  import signal  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, '-c', _KILLED_WRITER, what, path, str(limit)], cwd=repo,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == -signal.SIGXFSZ, (proc.returncode, proc.stderr[-2000:])


def _outputs(directory) -> list[str]:
  """Names under `directory` (relative), less hidden ones: a killed write may leave its hidden
  temporary file, never a visible name."""
  return sorted(os.path.relpath(os.path.join(d, n), directory)
                for d, _, names in os.walk(directory) for n in names if not n.startswith('.'))


def test_a_kill_mid_write_leaves_the_old_file_or_none_and_the_rerun_runs(tmp_path):
  """samples_<step>.jsonl killed mid-write keeps the earlier run's file whole; a picture killed
  mid-write leaves no file in pictures/, and the same command is then not refused."""
  from hmdlm_jax import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  old = tmp_path / 'old'
  old.mkdir()
  reports.write_jsonl(str(old / 'samples_20.jsonl'), [{'i': 0}])
  before = (old / 'samples_20.jsonl').read_bytes()
  _write_and_kill('samples', str(old / 'samples_20.jsonl'))
  assert (old / 'samples_20.jsonl').read_bytes() == before
  assert _outputs(old) == ['samples_20.jsonl']

  fresh = tmp_path / 'fresh'
  (fresh / 'pictures').mkdir(parents=True)
  _write_and_kill('picture', str(fresh / 'pictures' / 'reveal_0.png'))
  assert _outputs(fresh) == []
  workdir_lib.check_outputs(str(fresh), ['samples_20.jsonl', 'pictures'], overwrite=False)


def test_a_failed_output_write_leaves_no_part(tmp_path, monkeypatch):
  """A record that fails to serialise, or a write that fails before its rename, leaves the old
  file and nothing else at all (no temporary file either)."""
  from hmdlm_jax import storage  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / 'samples_20.jsonl')
  reports.write_jsonl(path, [{'i': 0}])
  before = open(path, 'rb').read()
  real = reports.json_safe
  calls = []

  def fails_midway(obj):
    calls.append(obj)
    if len(calls) == 3:
      raise ValueError('not serialisable')
    return real(obj)

  with monkeypatch.context() as m:
    m.setattr(reports, 'json_safe', fails_midway)
    with pytest.raises(ValueError, match='not serialisable'):
      reports.write_jsonl(path, [{'i': i} for i in range(5)])

  def no_rename(src, dst):
    raise OSError('disk gone')

  monkeypatch.setattr(storage.os, 'replace', no_rename)
  with pytest.raises(OSError, match='disk gone'):
    reports.write_jsonl(path, [{'i': i} for i in range(5)])
  assert open(path, 'rb').read() == before
  assert os.listdir(tmp_path) == ['samples_20.jsonl']
