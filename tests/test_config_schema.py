"""The typed config (hmdlm_jax/config): one schema with the only defaults, resolved once per run.

* configs/base.py is the schema's ConfigDict, field for field and value for value, and the views
  the jitted code takes (LossConfig, SampleConfig, HDLMConfig, MultiMDMConfig) default to the
  schema wherever they share a field with it;
* `resolve` turns a ConfigDict into a frozen `Config`; below the entry point nothing resolves
  again (counted over a whole training run, and checked on the source);
* `load` reads the same `--config.a.b=` overrides as the command line.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re

import ml_collections
import pytest

from hmdlm_jax.configs import base
from hmdlm_jax.configs import tiny_test
from hmdlm_jax import config as config_lib
from hmdlm_jax.config import derive
from hmdlm_jax.config import schema

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _flat(tree: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flat(v, f'{prefix}{k}.'))
    else:
      out[prefix + k] = v
  return out


def test_base_config_is_the_schema():
  """Every field of configs/base.py is the schema's, with the schema's value and type."""
  from_base = _flat(base.get_base_config().to_dict())
  from_schema = _flat(schema.to_dict(schema.Config()))
  assert from_base.keys() == from_schema.keys()
  for k, v in from_schema.items():
    assert from_base[k] == v and type(from_base[k]) is type(v), k
  # base.py sets no value of its own: its only source of defaults is the schema.
  text = (ROOT / 'configs' / 'base.py').read_text(encoding='utf-8')
  assert not re.search(r'^\s+\w+\.\w+ = ', text, re.M)


@pytest.mark.parametrize('view, section, renamed', [
    (config_lib.LossConfig, schema.LossSection, {}),
    (config_lib.SampleConfig, schema.SampleSection, {}),
    (config_lib.LossConfig, schema.ModelConfig, {'prior_corrected': 'prior_corrected_head'}),
    (config_lib.SampleConfig, schema.ModelConfig, {'prior_corrected': 'prior_corrected_head'}),
    (config_lib.HDLMConfig, schema.HDLMSection, {}),
    (config_lib.MultiMDMConfig, schema.MultiMDMSection, {}),
])
def test_view_defaults_are_the_schemas(view, section, renamed):
  own = {'LossConfig': {'train_steps_T', 'mask_id', 't_min', 'antithetic'},
         'SampleConfig': {'time_conditioning'},
         'HDLMConfig': {'force', 't_min', 'antithetic', 'mask_id', 'vocab_size'},
         'MultiMDMConfig': {'t_min', 'antithetic'}}[view.__name__]
  if section is schema.LossSection:
    own = own - {'t_min', 'antithetic'}  # the loss section's own fields
  fields = {f.name: f.default for f in dataclasses.fields(section)}
  shared = 0
  for f in dataclasses.fields(view):
    name = renamed.get(f.name, f.name)
    if f.name in own or name not in fields or f.default is dataclasses.MISSING:
      continue
    assert f.default == fields[name], f'{view.__name__}.{f.name}'
    shared += 1
  assert shared >= 2


def test_resolve_gives_a_frozen_typed_tree():
  config = config_lib.resolve(tiny_test.get_config())
  assert isinstance(config, config_lib.Config)
  assert isinstance(config.model, config_lib.ModelConfig)
  assert config.model.mask_id == config.model.vocab_size - 1  # -1 resolved
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.train.num_steps = 3  # type: ignore[misc]
  changed = config.replace(**{'train.num_steps': 3})
  assert changed.train.num_steps == 3 and config.train.num_steps != 3
  with pytest.raises(ValueError, match='already resolved'):
    config_lib.resolve(config)


def test_views_refuse_an_unresolved_config():
  with pytest.raises(ValueError, match='resolved config'):
    config_lib.SampleConfig.from_config(tiny_test.get_config())


def test_unknown_field_is_named():
  c = tiny_test.get_config()
  with c.unlocked():
    c.train.not_a_field = 1
  with pytest.raises(ValueError, match=r'train\.not_a_field'):
    config_lib.resolve(c)


def test_record_tolerates_fields_of_other_versions():
  record = schema.to_dict(config_lib.resolve(tiny_test.get_config()))
  record['model']['retired_option'] = True
  del record['eval']['num_samples']
  config = config_lib.from_record(record)
  assert config.eval.num_samples == schema.EvalSection.num_samples
  with pytest.raises(ValueError, match='retired_option'):
    schema.build(schema.Config, record)


def test_records_of_the_flat_pathway_names_read_as_the_pathway_section():
  """config.json files written before model.pathway held model.hier_<field>: a warm start and a
  resume read them under today's names."""
  from hmdlm_jax import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax.configs import sudoku_learned_hierarchy  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(sudoku_learned_hierarchy.get_config())
  record = workdir_lib.config_to_dict(config)
  old = dict(record, model=dict(record['model']))
  for name, value in old['model'].pop('pathway').items():
    old['model'][f'hier_{name}'] = value
  assert config_lib.from_record(old) == config_lib.from_record(record) == config
  assert workdir_lib.config_changes(old, config) == []
  old['model']['hier_width'] = 16
  assert workdir_lib.config_changes(old, config) == [
      f'model.pathway.width: 16 -> {config.model.pathway.width}']


def test_load_reads_the_command_line_dialect():
  loaded = config_lib.load('configs/tiny_test.py', ['--config.train.num_steps=7',
                                                   '--config.sample.seeds=(0,1)'])
  assert isinstance(loaded, ml_collections.ConfigDict)
  assert loaded.train.num_steps == 7 and tuple(loaded.sample.seeds) == (0, 1)
  with pytest.raises(ValueError, match=r'--config\.train\.nope'):
    config_lib.load('configs/tiny_test.py', ['--config.train.nope=1'])
  with pytest.raises(ValueError, match='--config.section.field=value'):
    config_lib.load('configs/tiny_test.py', ['train.num_steps=1'])


def test_only_the_entry_points_resolve():
  """Below the entry points (main.py, ar_judge's own command line and hmdlm_jax.load) no module
  resolves."""
  callers = set()
  for path in (ROOT / 'hmdlm_jax').rglob('*.py'):
    rel = path.relative_to(ROOT).as_posix()
    if rel.startswith('hmdlm_jax/config/'):
      continue
    if re.search(r'(?<![.\w])resolve\(|config_lib\.resolve\(', path.read_text(encoding='utf-8')):
      callers.add(rel)
  assert callers == {'hmdlm_jax/main.py', 'hmdlm_jax/ar_judge.py', 'hmdlm_jax/trained.py'}


def test_resolve_runs_once_per_run(tmp_path, monkeypatch, puzzle_cache):
  """A whole training run (data, model, process, train loop, final evaluation) resolves once."""
  from hmdlm_jax import main  # pylint: disable=g-import-not-at-top
  calls = []
  real = derive.resolve

  def counting(config):
    calls.append(1)
    return real(config)

  monkeypatch.setattr(config_lib, 'resolve', counting)
  monkeypatch.setattr(derive, 'resolve', counting)
  c = tiny_test.get_config()
  c.data.cache_dir = puzzle_cache
  c.train.num_steps = 2
  c.train.log_every = 1
  c.eval.num_examples = 2
  c.sample.num_steps = 4
  main.run('train', c, str(tmp_path / 'w'))
  assert len(calls) == 1


@pytest.mark.parametrize('name', sorted(
    p.stem for p in (ROOT / 'hmdlm_jax' / 'configs').glob('*.py')
    if p.stem not in ('__init__', 'base')))
def test_a_run_directory_is_its_recorded_config(tmp_path, name):
  """`--config=DIR` reads DIR/config.json (what training records) back into the same Config,
  for every shipped experiment: resolving a resolved config changes nothing."""
  from hmdlm_jax import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(config_lib.load(f'configs/{name}.py', ['--config.seed=3']))
  (tmp_path / 'config.json').write_text(json.dumps(workdir_lib.config_to_dict(config)))
  assert config_lib.resolve(config_lib.load(str(tmp_path))) == config
  assert config_lib.resolve(config_lib.load(str(tmp_path / 'config.json'))) == config
  again = config_lib.resolve(config_lib.load(str(tmp_path), ['--config.train.num_steps=7']))
  assert again == dataclasses.replace(
      config, train=dataclasses.replace(config.train, num_steps=7))


def test_a_run_directory_without_its_config_is_named(tmp_path):
  with pytest.raises(ValueError, match=r'no run config .*config\.json.*--config=DIR takes a run'):
    config_lib.load(str(tmp_path))
  (tmp_path / 'config.json').write_text('{not json')
  with pytest.raises(ValueError, match=r'is not a readable run config \(JSONDecodeError'):
    config_lib.load(str(tmp_path))
