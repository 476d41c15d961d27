"""benchmarks/side_by_side.py, bare_step.py, aot.py, profile.py: the parts that need no long run
(issue 14)."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from benchmarks import aot
from benchmarks import bare_step
from benchmarks import profile
from benchmarks import references
from benchmarks import side_by_side

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HLO = """
  %all-reduce.3 = f32[768,3072]{1,0} all-reduce(f32[768,3072]{1,0} %x), channel_id=1, replica_groups=[1,8]<=[8], to_apply=%add
  %ag = bf16[64,128]{1,0} all-gather(bf16[8,128]{1,0} %y), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %rs = f32[96]{0} reduce-scatter(f32[768]{0} %z), channel_id=3, replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add
  ROOT %t = (f32[2]{0}, s32[]) all-reduce(f32[2]{0} %a, s32[] %b), replica_groups=[4,2]<=[8], to_apply=%add
  %cp = f32[10]{0} collective-permute(f32[10]{0} %w), source_target_pairs={{0,1},{1,0}}
"""


def test_collective_bytes_from_hlo_text():
  c = aot.parse_collectives(HLO, 8)
  ar = c['by_op']['all-reduce']
  assert ar['count'] == 2
  assert ar['result_bytes'] == 768 * 3072 * 4 + 2 * 4 + 4
  np.testing.assert_allclose(ar['ring_bytes_per_device'],
                             2 * 7 / 8 * 768 * 3072 * 4 + 2 * 1 / 2 * 12)
  assert c['by_op']['all-gather']['result_bytes'] == 64 * 128 * 2
  np.testing.assert_allclose(c['by_op']['all-gather']['ring_bytes_per_device'], 7 / 8 * 16384)
  np.testing.assert_allclose(c['by_op']['reduce-scatter']['ring_bytes_per_device'], 3 * 96 * 4)
  assert c['by_op']['collective-permute']['ring_bytes_per_device'] == 40
  assert c['count'] == 5


def test_roofline_is_the_max_of_its_terms():
  rec = {'xla_flops_per_device': 312e12, 'xla_bytes_accessed_per_device': 2.039e12 / 2,
         'collectives': {'ring_bytes_per_device': 600e9}, 'model_flops_per_step': 8 * 156e12,
         'memory': {'peak_bytes': 90e9}}
  e = aot.roofline(rec, aot.HARDWARE['8xA100-80GB'])
  assert e['t_compute_s'] == pytest.approx(1.0) and e['t_comm_s'] == pytest.approx(2.0)
  assert e['step_s'] == pytest.approx(2.0) and e['mfu'] == pytest.approx(0.25)
  assert not e['fits_memory']


def test_features_parse():
  f = bare_step.Features.parse('clip,dropout,attn=bhqd')
  assert f.clip and f.dropout == 0.1 and f.attn == 'bhqd' and not f.ema
  a = bare_step.Features.parse('all')
  assert a.clip and a.ema and a.guard_cond and a.donate and a.fused_nll and a.layout == '4d'
  with pytest.raises(ValueError):
    bare_step.Features.parse('nonsense')


@pytest.mark.slow
def test_bare_step_fused_nll_and_layouts_agree():
  """The bisection's variants compute the same loss (one step, tiny dims)."""
  d = bare_step.Dims(num_layers=1, hidden=32, heads=2, mlp=64, cond=16, vocab=50, batch=2,
                     length=8, mask_id=3)
  losses = {}
  for spec in ('', 'fused_nll', 'attn=bhqd', 'attn=xla', 'rotary=complex', 'clip,ema,nan_guard'):
    state, step, batch = bare_step.make(d, bare_step.Features.parse(spec))
    _, loss = step(state, batch, jax.random.PRNGKey(0))
    losses[spec] = float(loss)
  ref = losses['']
  assert np.isfinite(ref) and ref > 0
  for spec, v in losses.items():
    assert v == pytest.approx(ref, rel=1e-5), spec


@pytest.mark.slow  # nightly: compiles the benchmark's bare steps
def test_bare_step_guards_agree():
  """The guard as where(ok, new, old) and as one lax.cond give the same state after good steps."""
  d = bare_step.Dims(num_layers=1, hidden=32, heads=2, mlp=64, cond=16, vocab=50, batch=2,
                     length=8, mask_id=3)
  states = {}
  for spec in ('clip,ema', 'clip,ema,nan_guard', 'clip,ema,guard_cond'):
    state, step, batch = bare_step.make(d, bare_step.Features.parse(spec))
    for i in range(2):
      state, _ = step(state, batch, jax.random.PRNGKey(i))
    states[spec] = state
  for spec in ('clip,ema,nan_guard', 'clip,ema,guard_cond'):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 states[spec], states['clip,ema'])


def test_summary_ratios_are_per_round():
  recs = []
  for rd, (ours, ref) in enumerate(((200.0, 100.0), (150.0, 100.0))):
    for lb, tps in (('ours_mdlm', ours), ('bare', ref), ('md4', ref / 2)):
      recs.append({'label': lb, 'round': rd, 'tokens_per_s': tps, 'median_step_s': 1.0,
                   'tokens_per_step': tps,
                   'user_s_per_step': 1.0, 'sys_s_per_step': 0.1, 'minflt_per_step': 10,
                   'majflt_per_step': 0, 'peak_rss_bytes': 2**20, 'compile_s': 1.0})
  s = side_by_side.summarise(recs, ['ours_mdlm', 'bare', 'md4'], 'bare')
  assert s['ours_mdlm']['ratio_to_best_reference_rounds'] == [2.0, 1.5]
  assert s['ours_mdlm']['ratio_to_best_reference'] == pytest.approx(1.75)
  assert s['md4']['ratio_to_baseline'] == pytest.approx(0.5)
  assert s['ours_mdlm']['sys_share'] == pytest.approx(0.1 / 1.1)


def test_profile_sums_ops_by_module():
  rows = [{'source': 'transpose(jvp(DiT))/DiT.trunk/blocks_3/mlp_0/dot_general',
           'ms_per_step': 2.0},
          {'source': 'transpose(jvp(DiT))/DiT.trunk/blocks_0/attn_qkv/dot_general',
           'ms_per_step': 1.5},
          {'source': 'jvp(DiT)/DiT.trunk/blocks_1/reduce_max', 'ms_per_step': 1.0},
          {'source': 'jvp(DiT)/DiT._hier_trunk/hier_blocks_1/reduce_max', 'ms_per_step': 0.25},
          {'source': 'jvp(jit(_uniform))/while', 'ms_per_step': 0.5},
          {'source': "state.params['blocks_2']['attn_out']['kernel']", 'ms_per_step': 0.125},
          {'source': '', 'ms_per_step': 0.125}]
  assert profile.by_module(rows) == [
      {'module': 'backward DiT/DiT.trunk', 'ms_per_step': 3.5, 'ops': 2},
      {'module': 'forward DiT/DiT.trunk', 'ms_per_step': 1.0, 'ops': 1},
      {'module': 'forward other', 'ms_per_step': 0.75, 'ops': 3},
      {'module': 'forward DiT/DiT._hier_trunk', 'ms_per_step': 0.25, 'ops': 1}]
  assert profile.module_of('GPT2/blocks_11/attn/dot_general') == 'forward GPT2/blocks_N'


def test_profile_overrides_need_a_config(capsys):
  """--config.a.b=value overrides (hmdlm_jax.main's dialect, hmdlm_jax.config.load) apply to a
  --config experiment only; a missing file, a misspelt field and the retired --set are refused
  with a line naming them, before anything is traced."""
  with pytest.raises(SystemExit):
    profile.main(['--config.model.pathway.width=32'])
  assert ('--config.model.pathway.width=32 overrides a --config experiment'
          in capsys.readouterr().err)
  with pytest.raises(SystemExit):
    profile.main(['--set', 'model.pathway.width=32'])
  assert 'unrecognized arguments: --set model.pathway.width=32' in capsys.readouterr().err
  with pytest.raises(SystemExit):
    profile.main(['--config=configs/sudoku.py', '--config.model.hier_widht=32'])
  assert 'model.hier_widht' in capsys.readouterr().err
  with pytest.raises(ValueError, match='--config=sudoku.py: no such file'):
    profile.experiment_config('sudoku.py', [])
  config = profile.experiment_config('configs/sudoku.py', ['--config.model.pathway.width=32',
                                                           '--config.data.batch_size=4'])
  assert config.model.pathway.width == 32 and config.data.batch_size == 4


def test_before_runners_need_a_before_tree(capsys, tmp_path):
  """before/NAME without --before_tree, or with a folder that is not this project, stops with one
  line before any child runs; the child is started in the before tree with it on PYTHONPATH."""
  for extra in ([], [f'--before_tree={tmp_path}']):
    with pytest.raises(SystemExit):
      side_by_side.main(['--shape=tiny', '--runners=ours_mdlm,before/ours_mdlm'] + extra)
    assert 'need --before_tree=PATH, a checkout of this project' in capsys.readouterr().err
  env = side_by_side._child_env('default', str(tmp_path))
  assert env['PYTHONPATH'].split(os.pathsep)[0] == str(tmp_path)


def test_reference_children_import_the_tree_from_pythonpath(tmp_path):
  """A reference runner's child gets its checkout on PYTHONPATH (after this project), never by
  sys.path; references.py refuses a module of that name found anywhere else."""
  tree = tmp_path / 'mdlm'
  tree.mkdir()
  (tree / 'noise_schedule_probe.py').write_text('X = 1\n')
  env = side_by_side._child_env('default', '/repo', str(tree))
  assert env['PYTHONPATH'].split(os.pathsep)[:2] == ['/repo', str(tree)]
  assert side_by_side.REFERENCE_TREES['mdlm_eager'] == 'mdlm'
  code = ('from benchmarks import references; '
          f'print(references._import_from_tree("noise_schedule_probe", {str(tree)!r}).X)')
  out = subprocess.run([sys.executable, '-c', code], cwd=REPO,
                       env=side_by_side._child_env('default', REPO, str(tree)),
                       capture_output=True, text=True, timeout=60, check=False)
  assert out.returncode == 0 and out.stdout.strip() == '1', out.stderr[-2000:]
  with pytest.raises(RuntimeError, match="'json' was imported from .*not from the reference tree"):
    references._import_from_tree('json', str(tree))


def test_runner_options_are_config_overrides_applied_before_resolve():
  """side_by_side's `ours_mdlm:section.field=value` options reach the step as --config overrides
  of the shape's experiment (hmdlm_jax.config.load, before resolve), after the shape's own
  settings; a misspelt field is an error naming it."""
  from benchmarks import train_step  # pylint: disable=g-import-not-at-top
  c = train_step.shape_config('tiny', 'mdlm', 'float32', batch_size=2,
                              overrides=['--config.model.dropout=0', '--config.model.num_layers=1'])
  assert (c.model.dropout, c.model.num_layers, c.model.hidden_size) == (0.0, 1, 256)
  assert c.data.batch_size == 2 and c.model.num_levels == 1
  with pytest.raises(ValueError, match='model.dropuot'):
    train_step.shape_config('tiny', 'mdlm', 'float32', overrides=['--config.model.dropuot=0'])


@pytest.mark.parametrize('shape', sorted(side_by_side.SHAPES))
def test_ceiling_gemms_are_the_steps_matmul_flops(shape):
  """benchmarks/ceiling.py's product list carries exactly the step's matrix FLOPs: the explicit
  count of benchmarks/flops.py with the token head at half of the rows plus its backward
  recompute (models/token_head.py), so the floor it prints times every product once."""
  from benchmarks import ceiling  # pylint: disable=g-import-not-at-top
  from benchmarks import flops  # pylint: disable=g-import-not-at-top
  from benchmarks import train_step  # pylint: disable=g-import-not-at-top
  _, h, _, _, _, v, b, length = side_by_side.SHAPES[shape]
  config = train_step.shape_config(shape, 'mdlm', 'float32', batch_size=b)
  assert config.model.vocab_size == v
  dense = flops.train_step_flops(config.model, b).train_step
  head = 2 * h * v  # one row of the token head's product
  expected = dense - 3 * b * length * head + 4 * (b * length // 2) * head
  assert ceiling.gemm_flops(ceiling.gemms(shape)) == expected


def test_ceiling_per_product_lines_rank_by_count_times_difference():
  """The per-product report ranks shapes by count × (JAX − PyTorch) seconds, not by the time of
  one product: a small product run 36 times outranks a large one run once."""
  from benchmarks import ceiling  # pylint: disable=g-import-not-at-top
  table = {(1, 512, 768, 30522): 1, (96, 128, 128, 64): 36, (1, 8, 128, 128): 2}
  jax_s = {'1x512x768x30522': 0.0780, '96x128x128x64': 0.0018, '1x8x128x128': 0.0001}
  torch_s = {'1x512x768x30522': 0.0670, '96x128x128x64': 0.0007, '1x8x128x128': 0.0002}
  lines = ceiling.per_product_lines(table, jax_s, torch_s, top=2)
  assert lines == ['  96x128x128x64 x36: 1.80 / 0.70 ms, +0.040 s',
                   '  1x512x768x30522 x1: 78.00 / 67.00 ms, +0.011 s']
