"""The package as `pip install` gets it: pyproject.toml's metadata, the wheel, the lock.

* The wheel built from this checkout holds one top-level package, hmdlm_jax (no `configs`), with
  every module of the source, every experiment config (hmdlm_jax/configs/) and every file of the
  configs' default data (hmdlm_jax/assets/).
* Installed alone into a fresh virtual environment (the test environment's dependencies reached
  through a .pth file), it trains configs/text.py and configs/hdlm_text.py from an empty directory
  with an empty HOME: `--config=configs/NAME.py` names the installed config, whose default data is
  the installed copy.
* Its Requires-Dist are ranges (no `==`), the extras eval / tpu / cuda / aot / text / test exist,
  and every pin of the lock (requirements.txt, requirements-test.txt) lies in the range
  pyproject.toml declares.
* Without the `eval` extra, the code that needs torch or mauve-text says which extra to install.
* The notebooks' install cell (colabs/cells_shared.py) installs only when a requirement is outside
  its range: this environment (the lock) passes, an out-of-range or absent package does not.
"""

from __future__ import annotations

import email.message
import email.parser
import importlib.util
import json
import os
import pathlib
import shutil
import site
import subprocess
import sys
import venv
import zipfile

import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax import convert_mdlm
from hmdlm_jax.evaluation import generative

packaging_requirements = pytest.importorskip('packaging.requirements')
packaging_utils = pytest.importorskip('packaging.utils')
packaging_version = pytest.importorskip('packaging.version')

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'hmdlm_jax'
LOCKS = {'': ROOT / 'requirements.txt', 'test': ROOT / 'requirements-test.txt'}
# Not copied into the build: version control, environments, build outputs, run outputs.
SKIP_ANYWHERE = ('.git', '__pycache__', '.pytest_cache')
SKIP_AT_ROOT = ('.venv', 'venv', 'build', 'dist', 'runs', '.whl', '.gl')
TINY = ['--config.model.num_layers=1', '--config.model.hidden_size=32',
        '--config.model.num_heads=2', '--config.model.mlp_dim=64', '--config.model.cond_dim=32',
        '--config.data.batch_size=2', '--config.data.eval_batch_size=2',
        '--config.eval.num_examples=2', '--config.eval.num_t_samples=1',
        '--config.train.log_every=1']


def _ignore(directory: str, names: list[str]) -> set[str]:
  at_root = pathlib.Path(directory).resolve() == ROOT
  return {n for n in names
          if n in SKIP_ANYWHERE or n.endswith('.egg-info')
          or (at_root and (n in SKIP_AT_ROOT or n.startswith('workdir')))}


@pytest.fixture(scope='module')
def wheel(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  """The wheel of this checkout, built offline from a copy (the build writes into its source)."""
  tmp = tmp_path_factory.mktemp('wheel')
  src = tmp / 'src'
  shutil.copytree(ROOT, src, symlinks=True, ignore=_ignore)
  out = tmp / 'dist'
  proc = subprocess.run(
      [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '--no-index',
       '-q', '-w', str(out), str(src)], capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, f'pip wheel failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}'
  wheels = sorted(out.glob('hmdlm_jax-*.whl'))
  assert len(wheels) == 1, f'expected one hmdlm_jax wheel in {out}: {os.listdir(out)}'
  return wheels[0]


def _metadata(wheel: pathlib.Path) -> email.message.Message:
  with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))
    return email.parser.Parser().parsestr(z.read(name).decode('utf-8'))


def _clean_env(home: pathlib.Path) -> dict[str, str]:
  """A child's environment that sees nothing of this checkout: no PYTHONPATH, an empty HOME."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(('PYTHON', 'JAX_', 'XLA_'))}
  env.update(HOME=str(home), JAX_PLATFORMS='cpu', TF_CPP_MIN_LOG_LEVEL='2',
             XLA_FLAGS='--xla_backend_optimization_level=0', HMDLM_ALLOCATOR='none')
  return env


@pytest.fixture(scope='module')
def installed(wheel: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
  """A fresh virtual environment holding the wheel alone, the test environment's dependencies
  reached through a .pth file (a path line: .pth files there, such as an editable install's
  finder of this checkout, are not run)."""
  tmp = tmp_path_factory.mktemp('wheel_venv')
  env_dir = tmp / 'venv'
  venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
  python = str(env_dir / 'bin' / 'python')
  proc = subprocess.run(
      [sys.executable, '-m', 'pip', '--python', python, 'install', '--no-deps', '--no-index', '-q',
       str(wheel)], capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, f'pip install of the wheel failed:\n{proc.stderr[-3000:]}'
  home, cwd = tmp / 'home', tmp / 'cwd'
  home.mkdir()
  cwd.mkdir()
  env = _clean_env(home)
  purelib = subprocess.run(
      [python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'], cwd=cwd,
      env=env, capture_output=True, text=True, check=True).stdout.strip()
  deps = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
  pathlib.Path(purelib, '_test_environment.pth').write_text('\n'.join(deps) + '\n')
  return {'python': python, 'purelib': purelib, 'home': str(home), 'cwd': str(cwd),
          'package': os.path.join(purelib, 'hmdlm_jax')}


def _lock(extra: str) -> dict[str, str]:
  """name -> pinned version of a lock file (its `-r` includes followed)."""
  pins = {}
  lines = list(LOCKS[extra].read_text(encoding='utf-8').splitlines())
  while lines:
    line = lines.pop(0).split('#')[0].strip()
    if not line:
      continue
    if line.startswith('-r '):
      included = LOCKS[extra].parent / line[3:].strip()
      lines = included.read_text(encoding='utf-8').splitlines() + lines
      continue
    req = packaging_requirements.Requirement(line)
    (spec,) = req.specifier
    assert spec.operator == '==', f'{LOCKS[extra].name}: {line!r} is not an exact pin'
    pins[packaging_utils.canonicalize_name(req.name)] = spec.version
  return pins


def _declared(wheel: pathlib.Path) -> dict[str, list]:
  """extra ('' for the core) -> the wheel's Requires-Dist of that extra."""
  out: dict[str, list] = {}
  for line in _metadata(wheel).get_all('Requires-Dist') or []:
    req = packaging_requirements.Requirement(line)
    extra = ''
    if req.marker is not None:
      extras = [e for e in ('eval', 'wandb', 'tpu', 'cuda', 'cuda12', 'aot', 'text', 'test')
                if req.marker.evaluate({'extra': e})]
      assert len(extras) == 1 and not req.marker.evaluate({'extra': ''}), line
      extra = extras[0]
    out.setdefault(extra, []).append(req)
  return out


def test_wheel_holds_the_package_its_configs_and_their_data(wheel):
  with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
  top = {n.split('/')[0] for n in names}
  assert {t for t in top if not t.endswith('.dist-info')} == {'hmdlm_jax'}, (
      f'the wheel installs other top-level names than hmdlm_jax: {sorted(top)}')
  assert not any(n.startswith('configs/') for n in names)
  sources = {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob('*.py')
             if '__pycache__' not in p.parts}
  assert {f'hmdlm_jax/configs/{n}.py' for n in ('base', 'text', 'hdlm_text', 'sudoku')} <= sources
  assert sources - names == set(), f'modules missing from the wheel: {sorted(sources - names)}'
  assets = {p.relative_to(ROOT).as_posix() for p in (PACKAGE / 'assets').rglob('*') if p.is_file()}
  assert {'hmdlm_jax/assets/text/britannica_1911_shakespeare_sentences.txt',
          'hmdlm_jax/assets/hdlm_clusters/bert-base-uncased_minilm-l6_n64.npz'} <= assets
  assert assets - names == set(), f'default data missing from the wheel: {sorted(assets - names)}'


def test_requirements_are_ranges_that_hold_the_lock(wheel):
  declared = _declared(wheel)
  extras = set(_metadata(wheel).get_all('Provides-Extra') or [])
  assert {'eval', 'wandb', 'tpu', 'cuda', 'aot', 'text', 'test'} <= extras, sorted(extras)
  for extra, reqs in declared.items():
    for req in reqs:
      ops = {s.operator for s in req.specifier}
      assert '==' not in ops and '===' not in ops, f'[{extra}] {req}: a pin, not a range'
      assert '>=' in ops and '<' in ops, f'[{extra}] {req}: give a lower and an upper bound'
  names = lambda reqs: {packaging_utils.canonicalize_name(r.name): r for r in reqs}
  core, test = names(declared['']), names(declared['test'])
  assert {'torch', 'mauve-text'} <= set(names(declared['eval']))
  for extra, jax_extra in (('tpu', 'tpu'), ('cuda', 'cuda13')):
    (req,) = declared[extra]
    assert req.name == 'jax' and req.extras == {jax_extra}, f'[{extra}] {req}'
    assert req.specifier == core['jax'].specifier, f'[{extra}] {req} against core {core["jax"]}'
  runtime_pins, test_pins = _lock(''), _lock('test')
  assert set(core) == set(runtime_pins), (
      'requirements.txt (the lock) and pyproject.toml (the ranges) name different packages: '
      f'{sorted(set(core) ^ set(runtime_pins))}')
  test_only = {n: v for n, v in test_pins.items() if n not in runtime_pins}
  assert set(test) == set(test_only), (
      'requirements-test.txt and the test extra name different packages: '
      f'{sorted(set(test) ^ set(test_only))}')
  for name, version in test_pins.items():
    req = core.get(name) or test[name]
    assert req.specifier.contains(packaging_version.Version(version), prereleases=True), (
        f'the lock pins {name}=={version}, outside the declared range {req}')


def _run(installed: dict[str, str], *args: str, timeout: float = 240
         ) -> subprocess.CompletedProcess:
  return subprocess.run([installed['python'], *args], cwd=installed['cwd'],
                        env=_clean_env(pathlib.Path(installed['home'])), capture_output=True,
                        text=True, timeout=timeout, check=False)


def test_the_installed_package_is_the_wheel(installed):
  proc = _run(installed, '-c', 'import hmdlm_jax, hmdlm_jax.configs.text as t; '
              'import hmdlm_jax.configs.hdlm_text as h; '
              'print(hmdlm_jax.__file__); print(t.FIXTURE); print(h.BERT_N64)')
  assert proc.returncode == 0, proc.stderr[-3000:]
  package_file, *data = proc.stdout.split()
  assert package_file == os.path.join(installed['package'], '__init__.py')
  for path in data:  # the text fixture and HDLM's committed clusters ship in the wheel
    assert path.startswith(installed['package'] + os.sep) and os.path.isfile(path), path


@pytest.mark.parametrize('config,steps,data_field', [
    ('configs/text.py', 2, ('data', 'train_path')),
    pytest.param('configs/hdlm_text.py', 1, ('process', 'hdlm', 'clusters'),
                 marks=pytest.mark.slow),  # CI: its cluster file ships (test above)
])
def test_the_installed_package_trains_a_text_config_from_an_empty_directory(
    installed, tmp_path, config, steps, data_field):
  workdir = tmp_path / 'run'
  proc = _run(installed, '-m', 'hmdlm_jax.main', f'--config={config}', f'--workdir={workdir}',
              f'--config.train.num_steps={steps}', f'--config.train.ckpt_every={steps}', *TINY)
  assert proc.returncode == 0, f'{config} failed in the wheel install:\n{proc.stderr[-4000:]}'
  record = json.loads((workdir / 'config.json').read_text())
  data = record
  for k in data_field:
    data = data[k]
  assert data.startswith(installed['package'] + os.sep) and os.path.isfile(data), (
      f'{".".join(data_field)}={data}: not the installed default data')
  summary = json.loads((workdir / 'train_summary.json').read_text())
  assert summary['step'] == steps
  assert (workdir / 'checkpoints' / str(steps)).is_dir()
  assert len(list(workdir.glob(f'eval_{steps}_test_2rows*_in_training.json'))) == 1
  assert not os.listdir(installed['cwd']), 'the run wrote into its working directory'


def test_configs_path_names_the_installed_config_outside_a_checkout(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert config_lib.load('configs/text.py', ['--config.model.num_layers=1']).model.num_layers == 1
  wikihow = config_lib.load('configs/wikihow.py:256,position')
  assert wikihow.model.seq_len == 256
  with pytest.raises(ValueError, match='no such file'):
    config_lib.load('configs/no_such_config.py')


def test_a_missing_eval_extra_names_it(tmp_path, monkeypatch):
  for module in ('torch', 'mauve'):
    monkeypatch.setitem(sys.modules, module, None)  # `import` raises ImportError, find_spec None
  hint = 'pip install "hmdlm_jax[eval]"'
  ckpt = tmp_path / 'last.ckpt'
  ckpt.write_bytes(b'not read')
  with pytest.raises(ValueError) as e:
    convert_mdlm.read_lightning_ckpt(ckpt)
  assert 'needs torch' in str(e.value) and hint in str(e.value)
  with pytest.raises(generative.ScorerUnavailableError) as e:
    generative.TransformersGPT2Scorer('gpt2')
  assert hint in str(e.value)
  assert hint in generative.mauve_unavailable()


def test_the_notebooks_install_only_what_is_outside_its_range(tmp_path):
  spec = importlib.util.spec_from_file_location('cells_shared', ROOT / 'colabs' / 'cells_shared.py')
  cells = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(cells)
  # The cell's definitions (what follows them is IPython: `!pip ...`).
  namespace = {'pathlib': pathlib, 'ACCELERATOR': 'gpu'}
  exec(cells.INSTALL.split('\nMISSING =')[0], namespace)  # pylint: disable=exec-used
  assert namespace['EXTRA'] == '[cuda]'
  missing = namespace['missing_requirements']
  assert missing(ROOT / 'pyproject.toml') == []
  fake = tmp_path / 'pyproject.toml'
  fake.write_text('[project]\ndependencies = ["numpy>=99", "jax>=0.10.2,<0.11", '
                  '"no-such-package-hmdlm>=1"]\n')
  assert missing(fake) == ['numpy>=99', 'no-such-package-hmdlm>=1']
