"""scripts/twin_budget.py (issue 11): reading runs, the seed table, the commands, the twin of a
pathway setting."""

import json
import math
import os

import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from scripts import twin_budget

load = config_lib.load  # the one loader: configs/*.py plus --config.a.b=value overrides


def _write_run(wd, step, greedy, stochastic, wall):
  os.makedirs(wd)
  with open(os.path.join(wd, 'train_summary.json'), 'w') as f:
    json.dump({'step': step, 'wall_time_s': wall, 'stop_reason': 'num_steps'}, f)
  res = {'num_puzzles': 500}
  for name, (solve, cells) in (('greedy', greedy), ('stochastic', stochastic)):
    res[name] = {'mean': {'solve_rate': solve, 'cell_accuracy': cells}}
  with open(os.path.join(wd, 'config.json'), 'w') as f:
    json.dump({'eval': {'num_examples': 500}, 'sample': {'seeds': [0]}}, f)
  with open(os.path.join(wd, 'eval_{}_test_500rows_seeds0_in_training.json'.format(step)),
            'w') as f:
    json.dump({'step': step, 'results': res}, f)


def test_read_run_and_paired_table(tmp_path):
  figs = {('hmdlm', 0): ((0.60, 0.83), (0.50, 0.78)), ('twin', 0): ((0.55, 0.81), (0.40, 0.72)),
          ('hmdlm', 1): ((0.62, 0.84), (0.52, 0.79)), ('twin', 1): ((0.59, 0.82), (0.45, 0.75)),
          ('hmdlm', 2): ((0.58, 0.82), (0.49, 0.77)), ('twin', 2): ((0.60, 0.83), (0.43, 0.74))}
  runs = {m: {} for m in twin_budget.MODELS}
  for (m, s), (g, st) in figs.items():
    wd = str(tmp_path / f'{m}_s{s}')
    _write_run(wd, 1200 if m == 'hmdlm' else 1600, g, st, 100.0 + s)
    runs[m][s] = twin_budget.read_run(wd)
  assert runs['twin'][1] == {'steps': 1600, 'train_wall_s': 101.0, 'num_puzzles': 500,
                             'greedy_solve': 0.59, 'greedy_cells': 0.82,
                             'stochastic_solve': 0.45, 'stochastic_cells': 0.75}
  os.makedirs(tmp_path / 'unfinished')
  assert twin_budget.read_run(str(tmp_path / 'unfinished')) is None
  text = twin_budget.table(runs, [0, 1, 2, 3])  # seed 3 has no runs: left out
  assert 'seeds with every run: [0, 1, 2]' in text
  diff = np.array([figs[('hmdlm', s)][0][0] - figs[('twin', s)][0][0] for s in range(3)])
  expect = f'{100 * diff.mean():.1f} ± {100 * diff.std(ddof=1) / math.sqrt(3):.1f}'
  paired = [line for line in text.splitlines() if line.startswith('| HMDLM − twin')][0]
  cells = [c.strip() for c in paired.split('|')]  # '', name, steps, greedy solve, ...
  assert cells[3] == expect  # greedy solve, paired over the seeds


def test_commands_differ_only_in_the_twin_flags():
  h = twin_budget.command('/w/h', 1, 500, ['--config.model.sudoku_candidates=True'], None)
  t = twin_budget.command('/w/t', 1, 500, ['--config.model.sudoku_candidates=True'], 1600)
  assert h[1:4] == ['-m', 'hmdlm_jax.main', '--config=configs/sudoku.py']
  assert '--config.model.sudoku_candidates=True' in h and '--config.seed=1' in h
  assert [a for a in t if a not in h] == ['--workdir=/w/t', '--config.model.num_levels=1',
                                          '--config.train.num_steps=1600']


def test_the_twin_of_a_pathway_setting_is_the_demos_twin():
  """`model.num_levels=1` turns any hierarchy setting into its twin: the per-round token loss is
  derived off, and with the candidates fed to the pathway only the twin's step has exactly the
  plain demo twin's matrix FLOPs (the pathway was its only extra)."""
  setting = ['--config.model.given_state=True', '--config.model.sudoku_candidates=True',
             '--config.model.candidates_pathway_only=True', '--config.model.pathway.input_embed=True',
             '--config.model.pathway.layers=1', '--config.model.pathway.repeats=5',
             '--config.model.pathway.readout=rounds', '--config.loss.beta_rounds=1.0',
             '--config.model.pathway.source=input']
  cfg = lambda over: load(twin_budget.DEFAULT_CONFIG, over)
  twin = config_lib.resolve(cfg(setting + [twin_budget.TWIN]))
  assert twin.loss.beta_rounds == 0.0 and not twin.model.pathway.round_tokens
  assert (twin_budget.step_cost.step_flops(cfg(setting + [twin_budget.TWIN]))
          == twin_budget.step_cost.step_flops(cfg([twin_budget.TWIN])))


def test_the_learned_hierarchy_config_and_its_twin_budget():
  """--config names any Sudoku config: configs/sudoku_learned_hierarchy.py's twin is the demo's
  twin (same step FLOPs), so it gets the step budget of its pathway setting. The command line is
  hmdlm_jax.main's: a missing file, a misspelt field, a value of the wrong type or the retired
  `--set` stop the script with one line naming it, before anything is written."""
  path = 'configs/sudoku_learned_hierarchy.py'
  own = load(path)
  demo_twin = load(twin_budget.DEFAULT_CONFIG, [twin_budget.TWIN])
  flops = twin_budget.step_cost.step_flops
  steps = twin_budget.twin_steps(own.train.num_steps, [], path)
  assert steps == own.train.num_steps * flops(own) // flops(demo_twin)
  assert steps > 1.5 * own.train.num_steps  # the pathway is 40% of HMDLM's step (46 G vs 27 G)
  cmd = twin_budget.command('/w/t', 0, 500, [], steps, path)
  assert cmd[3] == f'--config={path}' and f'--config.train.num_steps={steps}' in cmd
  assert load(twin_budget.DEFAULT_CONFIG,
              ['--config.optim.hier_lr_scale=3.0']).optim.hier_lr_scale == 3.0
  never = lambda *args, **kwargs: pytest.fail(f'ran a command: {args}')
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(twin_budget.subprocess, 'run', never)
    for bad, says in ((['--config=configs/nope.py'], 'configs/nope.py: no such file'),
                      (['--config.optim.hier_lr_scal=3'], 'optim.hier_lr_scal'),
                      (['--config.nope.lr=1'], 'config.nope.lr'),
                      (['--config.optim.hier_lr_scale=fast'], 'hier_lr_scale')):
      with pytest.raises(SystemExit, match=f'twin_budget: error: .*{says}'):
        twin_budget.main(['--workdir=/nonexistent/twin_budget', '--seeds=0', *bad])
    with pytest.raises(SystemExit):  # argparse: exit 2, usage on stderr
      twin_budget.main(['--workdir=/nonexistent/twin_budget', '--set', 'optim.lr=1'])
  assert not os.path.exists('/nonexistent/twin_budget')


def test_pathway_heads_keep_the_flops_and_equal_wall_budget():
  """`model.pathway.num_heads` changes no matmul FLOPs (same projections, the attention's scores and
  values split over fewer heads), so the FLOPs budget cannot see it: the wall budget's arithmetic
  (scripts/step_cost.py --wall_rounds) is the median per-round ratio, rounded down."""
  path = 'configs/sudoku_learned_hierarchy.py'
  cfg = lambda over: load(path, over)
  tiny = ['--config.model.num_layers=1', '--config.model.hidden_size=32',
          '--config.model.num_heads=2', '--config.model.mlp_dim=32', '--config.data.batch_size=2',
          '--config.model.pathway.width=16']
  flops = twin_budget.step_cost.step_flops
  assert flops(cfg(tiny + ['--config.model.pathway.num_heads=1'])) == flops(cfg(tiny)) > 0
  ratios, steps = twin_budget.step_cost.equal_wall_steps(2000, [0.6, 0.9, 0.5], [0.3, 0.3, 0.2])
  np.testing.assert_allclose(ratios, [2.0, 3.0, 2.5])
  assert steps == 5000
  with pytest.raises(ValueError):
    twin_budget.step_cost.equal_wall_steps(2000, [0.6], [0.3, 0.3])


@pytest.mark.slow
def test_the_step_timer_runs_each_config_in_a_child():
  """The wall budget's timer (scripts/step_cost.py --wall_rounds) runs each config's real step in
  a child process of its own; a child's failure stops it with the child's own error line."""
  path = 'configs/sudoku_learned_hierarchy.py'
  tiny = ['--config.model.num_layers=1', '--config.model.hidden_size=32',
          '--config.model.num_heads=2', '--config.model.mlp_dim=32', '--config.data.batch_size=2',
          '--config.model.pathway.width=16']
  secs = twin_budget.step_cost.step_seconds(path, {'a': tiny, 'b': tiny + [twin_budget.TWIN]},
                                            rounds=1, steps=1)
  assert list(secs) == ['a', 'b'] and all(len(v) == 1 and all(0 < x < 5 for x in v)
                                          for v in secs.values())
  with pytest.raises(SystemExit, match="--wall_rounds: the timed step 'a' failed: .*hier_lr_scale"):
    twin_budget.step_cost.step_seconds(path, {'a': tiny + ['--config.optim.hier_lr_scale=0.0']},
                                       rounds=1, steps=1)


def test_the_loop_timer_reads_seconds_per_step_after_compilation():
  """scripts/step_cost.py --loop: seconds per step between the first and the last logged training
  step (the first log comes after compilation; eval rows are ignored)."""
  rows = [{'step': 25, 'split': 'train', 'time': 100.0},
          {'step': 50, 'split': 'train', 'time': 106.0},
          {'step': 50, 'split': 'eval', 'time': 200.0},
          {'step': 100, 'split': 'train', 'time': 121.0}]
  assert twin_budget.step_cost.logged_seconds_per_step(rows) == pytest.approx(21.0 / 75)


@pytest.mark.slow
def test_the_loop_timer_runs_the_real_loop():
  """One round of a tiny config runs the real training loop; too few logged steps and a failing
  run are refused."""
  tiny = ['--config.model.num_layers=1', '--config.model.hidden_size=32',
          '--config.model.num_heads=2', '--config.model.mlp_dim=32', '--config.data.batch_size=2',
          '--config.train.log_every=2', '--config.data.num_test_puzzles=4']
  with pytest.raises(SystemExit, match='--wall_steps=3.*train.log_every=2'):
    twin_budget.step_cost.step_seconds(twin_budget.DEFAULT_CONFIG, {'a': tiny}, rounds=1, steps=3,
                                       loop=True)
  secs = twin_budget.step_cost.step_seconds(twin_budget.DEFAULT_CONFIG, {'a': tiny}, rounds=1,
                                            steps=4, loop=True)
  assert list(secs) == ['a'] and len(secs['a']) == 1 and 0 < secs['a'][0] < 5
  with pytest.raises(SystemExit,
                     match="--wall_rounds: the training run 'a' failed: .*hier_lr_scale"):
    twin_budget.step_cost.step_seconds(twin_budget.DEFAULT_CONFIG,
                                       {'a': tiny + ['--config.optim.hier_lr_scale=0.0']},
                                       rounds=1, steps=4, loop=True)


def test_a_given_twin_budget_is_used_and_a_run_of_another_budget_is_refused(tmp_path):
  """--twin_steps sets the twin's budget (recorded as 'given'); a finished run in the workdir
  whose step count is not the one this comparison needs stops the script with one line, before
  any run trains and without touching what is there."""
  demo = int(load(twin_budget.DEFAULT_CONFIG).train.num_steps)
  _write_run(str(tmp_path / 'hmdlm_s0'), demo, (0.6, 0.8), (0.5, 0.7), 100.0)
  _write_run(str(tmp_path / 'twin_s0'), 2000, (0.5, 0.8), (0.4, 0.7), 100.0)
  r = twin_budget.main([f'--workdir={tmp_path}', '--seeds=0', '--twin_steps=2000'])
  assert (r['twin_steps'], r['twin_budget'], r['hmdlm_steps']) == (2000, 'given', demo)
  assert json.load(open(tmp_path / 'results.json'))['twin_budget'] == 'given'
  flops_steps = twin_budget.twin_steps(demo, [])
  results = (tmp_path / 'results.json').read_text()
  never = lambda *args, **kwargs: pytest.fail(f'trained before refusing: {args}')
  with pytest.MonkeyPatch.context() as mp:  # hmdlm_s1 is unfinished: refused before it trains
    mp.setattr(twin_budget.subprocess, 'run', never)
    with pytest.raises(SystemExit,
                       match=f'twin_s0: a finished run of 2000 steps.*needs {flops_steps}'):
      twin_budget.main([f'--workdir={tmp_path}', '--seeds=1,0'])
  assert (tmp_path / 'results.json').read_text() == results  # nothing written is changed
  assert not (tmp_path / 'hmdlm_s1').exists()
  with pytest.raises(SystemExit):
    twin_budget.main([f'--workdir={tmp_path}', '--seeds=0', '--twin_steps=-1'])


def test_mgdm_baseline_is_the_twin_with_mgdms_loss_and_decoding():
  """The baseline's command is the twin's plus MGDM's process and decoding flags, its training
  grid the config's T; the resolved config is MGDM on the twin's network."""
  flags = twin_budget.baseline_flags('mgdm', [])
  t = twin_budget.command('/w/t', 1, 500, [], 1600)
  g = twin_budget.command('/w/t', 1, 500, [], 1600, baseline=flags)
  assert g[:len(t)] == t and g[len(t):] == flags
  cfg = config_lib.resolve(config_lib.load(twin_budget.DEFAULT_CONFIG, [twin_budget.TWIN, *flags]))
  assert (cfg.process.kind, cfg.sample.ordering, cfg.model.num_levels) == ('mgdm', 'remask', 1)
  assert cfg.process.mgdm.diffusion_steps == cfg.sample.num_steps == 81
  with pytest.raises(ValueError, match="'adlm' is not one of"):
    twin_budget.baseline_flags('adlm', [])
