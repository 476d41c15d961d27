"""Training loop, train step, optimiser and metrics (hmdlm_jax/train.py, optim.py, metrics.py).

Whole-run checks use the session's reference run (tests/conftest.py): configs/tiny_test.py, HMDLM
K=6, trained in a subprocess by `python -m hmdlm_jax.main`. Unit checks run in-process on tiny
pure functions.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests.conftest import REF_STEPS, main_cmd, read_jsonl, run_cmd, train_losses
from tests.config_helpers import resolved

from hmdlm_jax import accumulate
from hmdlm_jax import config as config_lib
from hmdlm_jax import metrics as metrics_lib
from hmdlm_jax import optim
from hmdlm_jax import processes
from hmdlm_jax import sharding as shd
from hmdlm_jax import tasks
from hmdlm_jax import train


def _tiny_config() -> ml_collections.ConfigDict:
  from hmdlm_jax.configs import tiny_test  # pylint: disable=g-import-not-at-top
  return tiny_test.get_config()


def _assert_loss_falls(losses: dict[int, float], margin: float) -> tuple[float, float]:
  steps = sorted(losses)
  assert steps == list(range(1, REF_STEPS + 1)), 'one train record per step expected'
  first = float(np.mean([losses[s] for s in steps[:5]]))
  last = float(np.mean([losses[s] for s in steps[-5:]]))
  assert np.isfinite(first) and np.isfinite(last)
  assert last < (1.0 - margin) * first, (first, last)
  return first, last


# ----------------------------------------------------------------------------- whole runs


def test_hmdlm_loss_falls(reference_run):
  # Fixed seed, 4 memorisable puzzles: measured 3.64 -> 0.52 nats (first vs last 5 of 100 steps);
  # demand a 25% drop.
  _assert_loss_falls(train_losses(reference_run['workdir']), margin=0.25)
  recs = read_jsonl(os.path.join(reference_run['workdir'], 'metrics.jsonl'))
  # The hierarchy terms are active for K = 6.
  assert max(abs(r['hier']) for r in recs) > 0.1


@pytest.mark.slow  # CI time (2026-12-01): nightly
def test_mdlm_twin_loss_falls(tmp_path, puzzle_cache, jax_cache):
  """`--config.model.num_levels=1` alone gives MDLM: offsets derived as (0,), no hierarchy loss."""
  workdir = str(tmp_path)
  proc = run_cmd(main_cmd(workdir, puzzle_cache, '--config.model.num_levels=1'), jax_cache,
                 timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    cfg = json.load(f)
  assert cfg['model']['num_levels'] == 1 and cfg['schedule']['offsets'] == [0.0]
  recs = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  assert all(r['hier'] == 0.0 and r['cons'] == 0.0 for r in recs if r['split'] == 'train')
  _assert_loss_falls(train_losses(workdir), margin=0.15)  # measured 2.04 -> 1.44


def test_train_step_compiles_once(reference_run):
  with open(os.path.join(reference_run['workdir'], 'train_summary.json'), encoding='utf-8') as f:
    summary = json.load(f)
  assert summary['step'] == REF_STEPS and summary['stop_reason'] == 'num_steps'
  assert summary['step_compilations'] == 1


def test_metrics_jsonl_and_tensorboard(reference_run):
  workdir = reference_run['workdir']
  recs = metrics_lib.read_metrics(workdir)  # raises on a line that is not JSON
  train_recs = [r for r in recs if r['split'] == 'train']
  # tiny_test logs every step: exactly one record per step.
  assert [r['step'] for r in train_recs] == list(range(1, REF_STEPS + 1))
  for r in train_recs:
    for k in metrics_lib.REQUIRED_TRAIN_KEYS + ('lm', 'hier', 'cons', 'bad_steps',
                                                'skipped_steps'):
      assert k in r, k
    assert r['lr'] == pytest.approx(2e-2, rel=1e-6)  # tiny_test: constant lr, no warm-up
    assert r['grad_norm'] > 0 and r['steps_per_s'] > 0
    assert r['tokens_per_s'] == pytest.approx(r['steps_per_s'] * 8 * 81, rel=1e-6)
    assert r['bad_steps'] == 0 and r['skipped_steps'] == 0
  events = os.listdir(os.path.join(workdir, 'tb'))
  assert any(e.startswith('events.out.tfevents') for e in events)
  assert os.path.getsize(os.path.join(workdir, 'tb', events[0])) > 0
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    cfg = json.load(f)
  assert cfg['schedule']['offsets'] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
  assert cfg['train']['num_steps'] == REF_STEPS


# ----------------------------------------------------------------------------- NaN guard


def test_nan_steps_are_skipped_and_run_stops(tmp_path, puzzle_cache, jax_cache):
  """debug_nan_steps poisons the loss of steps 3.. (0-based): 3 good updates, then skipped steps.

  With max_bad_steps=2 the loop sees the second consecutive bad step (5) while step 6 is in
  flight: it logs step 6 too, saves a checkpoint of it whose parameters and optimiser state equal
  those of the last good step (checkpoint 3, saved by ckpt_every=3), and exits 1 with one clear
  line. Every step the checkpoint holds has its metrics line (issue 15).
  """
  workdir = str(tmp_path)
  cmd = main_cmd(workdir, puzzle_cache, '--config.train.debug_nan_steps=(3,4,5,6,7,8,9)',
                 '--config.train.max_bad_steps=2', '--config.train.ckpt_every=3')
  proc = run_cmd(cmd, jax_cache, timeout=180)
  assert proc.returncode == 1, proc.stderr[-3000:]
  (line,) = [x for x in proc.stderr.splitlines() if x.startswith('hmdlm_jax: error:')]
  assert 'consecutive' in line and 'max_bad_steps=2' in line and 'Traceback' not in proc.stderr
  recs = {r['step']: r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'))}
  assert sorted(recs) == list(range(1, 7))  # step 6, in flight when the guard stopped, logged
  assert [recs[s]['update_ok'] for s in (1, 2, 3)] == [1.0, 1.0, 1.0]
  assert [recs[s]['bad_steps'] for s in (4, 5, 6)] == [1.0, 2.0, 3.0]
  assert recs[6]['skipped_steps'] == 3.0 and recs[6]['loss'] == 'nan'
  from tests.conftest import load_checkpoint_state  # pylint: disable=g-import-not-at-top
  steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints')))
  assert steps == [3, 6], steps  # the last one: the logged step in flight at the stop
  good, last = load_checkpoint_state(workdir, 3), load_checkpoint_state(workdir, 6)
  assert int(last['step']) == 6 and int(last['bad_steps']) == 3
  assert int(last['skipped_steps']) == 3
  for name in ('params', 'ema_params', 'opt_state'):
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 good[name], last[name])
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(last['params']))


# ----------------------------------------------------------------------------- config errors


@pytest.mark.parametrize('flag, expected', [
    ('--config.model.nonexistent=1', 'nonexistent'),
    ('--config.model.num_levels=abc', 'num_levels'),
    ('--config.optim.decay=linear', "optim.decay='linear' is not one of"),
    ('--config.mesh.data=3', 'mesh.data=3'),
])
def test_bad_config_gives_clear_error(tmp_path, puzzle_cache, jax_cache, flag, expected):
  proc = run_cmd(main_cmd(str(tmp_path), puzzle_cache, flag), jax_cache, timeout=120)
  assert proc.returncode != 0
  assert expected in proc.stderr, proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr


def test_validate_config_names_fields():
  cfg = _tiny_config()
  cfg.train.grad_accum = 3  # batch 8 is not a multiple of 3
  with pytest.raises(ValueError, match='data.batch_size=8 must be a multiple of '
                     'train.grad_accum=3'):
    config_lib.resolve(cfg)
  cfg = _tiny_config()
  cfg.train.log_every = 0
  with pytest.raises(ValueError, match='train.log_every must be an integer >= 1, got 0'):
    config_lib.resolve(cfg)
  cfg = _tiny_config()
  cfg.optim.b2 = 1.0
  with pytest.raises(ValueError, match=r'optim.b2=1.0 must lie in \[0, 1\)'):
    config_lib.resolve(cfg)


def test_resolve_config_derives_offsets_from_k():
  cfg = _tiny_config()
  for k, want in [(6, (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)), (1, (0.0,)), (2, (0.0, 0.5)),
                  (3, (0.0, 0.25, 0.5))]:
    cfg.model.num_levels = k
    got = config_lib.resolve(cfg).schedule.offsets
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
  cfg.schedule.offsets_max = -1.0  # off: offsets stay as given
  cfg.schedule.offsets = (0.0, 0.3)
  assert tuple(config_lib.resolve(cfg).schedule.offsets) == (0.0, 0.3)


def test_prepare_batch_levels():
  batch = {'tokens': np.zeros((2, 3), np.int32), 'levels': np.array([[0, 5, 2], [1, 1, 4]]),
           'given': np.zeros((2, 3), bool), 'loss_mask': np.ones((2, 3), bool),
           'weight': np.ones(2, np.float32)}

  def prepare(k: int) -> dict[str, np.ndarray]:
    return processes.build(resolved(_tiny_config(), **{'model.num_levels': k})
                           ).prepare_batch(batch)

  out = prepare(1)  # MDLM: a single level
  assert set(out) == set(train.BATCH_KEYS) and not out['levels'].any()
  np.testing.assert_array_equal(prepare(6)['levels'], batch['levels'])
  with pytest.raises(ValueError, match='model.num_levels=3'):
    prepare(3)


def test_microbatches_are_strided():
  x = jnp.arange(12).reshape(6, 2)
  mb = accumulate._microbatches({'x': x}, 3)['x']  # pylint: disable=protected-access
  assert mb.shape == (3, 2, 2)
  np.testing.assert_array_equal(mb[0], x[0::3])
  np.testing.assert_array_equal(mb[2], x[2::3])


def _toy_grad_fn():
  """Token-weighted mean loss over the batch (like losses.diffusion_loss), key-independent."""

  def loss_fn(params, batch, key, poison):
    del key
    per_tok = (params['w'] * batch['tokens'].astype(jnp.float32) - 1.0) ** 2 + params['b']
    m = batch['loss_mask'].astype(jnp.float32)
    loss = (per_tok * m).sum() / jnp.maximum(m.sum(), 1.0) * poison
    return loss, {'num_loss_tokens': m.sum(), 'finite': jnp.isfinite(loss).astype(jnp.float32)}

  return jax.value_and_grad(loss_fn, has_aux=True)


def test_gradient_accumulation_equals_full_batch():
  rng = np.random.default_rng(0)
  batch = {'tokens': jnp.asarray(rng.integers(0, 9, (8, 5)), jnp.int32),
           'loss_mask': jnp.asarray(rng.random((8, 5)) < 0.6)}
  params = {'w': jnp.float32(0.3), 'b': jnp.float32(0.1)}
  key = jax.random.PRNGKey(0)
  one = jnp.float32(1.0)
  full = accumulate.value_and_grad(_toy_grad_fn(), params, batch, key, 1, one)
  for accum in (2, 4):
    loss, aux, grads = jax.jit(accumulate.value_and_grad, static_argnums=(0, 4))(
        _toy_grad_fn(), params, batch, key, accum, one)
    np.testing.assert_allclose(float(loss), float(full[0]), rtol=1e-6)
    for k in params:
      np.testing.assert_allclose(float(grads[k]), float(full[2][k]), rtol=1e-5)
    assert float(aux['num_loss_tokens']) == float(np.asarray(batch['loss_mask']).sum())
  # NaN anywhere makes the whole result non-finite (the step's guard then skips it).
  loss, aux, grads = accumulate.value_and_grad(_toy_grad_fn(), params, batch, key, 2,
                                                     jnp.float32(jnp.nan))
  assert np.isnan(float(loss)) and np.isnan(float(grads['w'])) and float(aux['finite']) == 0.0


@pytest.mark.parametrize('dtype, accum', [('bfloat16', 1), ('float32', 2)])
def test_step_traces_with_float32_state_and_loss(dtype, accum):
  """Abstract trace of the real train step (nothing is compiled): bf16 compute keeps float32
  params/EMA and a float32 loss; grad_accum=2 traces the scan over micro-batches."""
  cfg = resolved(_tiny_config(), **{'model.dtype': dtype, 'train.grad_accum': accum})
  mesh = shd.make_mesh(cfg.mesh, jax.devices()[:1])
  model = tasks.build_model(cfg)
  abstract, sh = train.state_shardings(cfg, model, mesh)
  step = train.make_train_step(cfg, model, processes.build(cfg), mesh, sh)
  batch = {'tokens': jax.ShapeDtypeStruct((8, 81), jnp.int32),
           'levels': jax.ShapeDtypeStruct((8, 81), jnp.int32),
           'given': jax.ShapeDtypeStruct((8, 81), jnp.bool_),
           'loss_mask': jax.ShapeDtypeStruct((8, 81), jnp.bool_)}
  with shd.mesh_context(mesh):
    new_state, metrics = jax.eval_shape(step.jitted, abstract, batch)
  for leaf in jax.tree.leaves((new_state.params, new_state.ema_params)):
    assert leaf.dtype == jnp.float32
  assert metrics['loss'].dtype == jnp.float32 and metrics['loss'].shape == ()
  assert jax.tree.structure(new_state) == jax.tree.structure(abstract)


# ----------------------------------------------------------------------------- optimiser


def _optim_cfg(**kw) -> config_lib.schema.OptimSection:
  fields = dict(lr=1e-3, warmup_steps=10, decay='constant', b1=0.9, b2=0.999, weight_decay=0.0,
                grad_clip=1.0, ema_decay=0.99, ema_warmup=False)
  fields.update(kw)
  return dataclasses.replace(config_lib.schema.OptimSection(), **fields)


def _rejected(**optim_fields) -> str:
  """resolve refuses the tiny config with these `optim` fields (the one place they are checked)."""
  with pytest.raises(ValueError) as e:
    resolved(_tiny_config(), **{f'optim.{k}': v for k, v in optim_fields.items()})
  return str(e.value)


def test_lr_schedule_exact():
  s = optim.make_lr_schedule(_optim_cfg(), num_steps=100)
  np.testing.assert_allclose([float(s(n)) for n in (0, 5, 10, 50, 99)],
                             [0.0, 5e-4, 1e-3, 1e-3, 1e-3], rtol=1e-6)
  c = optim.make_lr_schedule(_optim_cfg(decay='cosine'), num_steps=110)
  # After warm-up: lr · (1 + cos(π n/100)) / 2 for n = step - 10.
  for n in (0, 25, 50, 100):
    want = 1e-3 * 0.5 * (1 + np.cos(np.pi * n / 100))
    assert float(c(10 + n)) == pytest.approx(want, rel=1e-5, abs=1e-12)
  assert "optim.decay='linear'" in _rejected(decay='linear')


def test_cosine_to_a_floor_and_adam_eps():
  """optim.decay_floor: cosine from lr to floor · lr (HDLM's OWT recipe); optim.eps reaches Adam."""
  c = optim.make_lr_schedule(_optim_cfg(decay='cosine', decay_floor=0.1), num_steps=110)
  for n in (0, 25, 50, 100):
    want = 1e-3 * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * n / 100)))
    assert float(c(10 + n)) == pytest.approx(want, rel=1e-5)
  assert float(c(500)) == pytest.approx(1e-4, rel=1e-5)  # stays at the floor
  assert 'optim.decay_floor=1.5' in _rejected(decay='cosine', decay_floor=1.5)
  # A zero gradient moves a weight by lr · m̂ / (sqrt(v̂) + eps) = 0 whatever eps; a tiny one
  # shows eps: g = 1e-8 gives m̂ = g, sqrt(v̂) = g, so the step is lr · g / (g + eps).
  for eps in (1e-8, 1e-9):
    tx = optim.make_optimizer(_optim_cfg(warmup_steps=0, grad_clip=0.0, eps=eps), 10)
    params = {'b': jnp.zeros(())}
    upd, _ = tx.update({'b': jnp.full((), 1e-8)}, tx.init(params), params)
    assert float(upd['b']) == pytest.approx(-1e-3 * 1e-8 / (1e-8 + eps), rel=1e-4)
  cfg = _tiny_config()
  cfg.optim.eps = 0.0
  with pytest.raises(ValueError, match='optim.eps'):
    config_lib.resolve(cfg)


def test_optimizer_clips_and_matches_adamw_reference():
  """One update against a numpy AdamW re-derivation (bias-corrected, clipped gradient)."""
  cfg = _optim_cfg(warmup_steps=0, weight_decay=0.1, grad_clip=0.5)
  tx = optim.make_optimizer(cfg, 10)
  params = {'w': jnp.array([[1.0, -2.0], [0.5, 0.0]]), 'b': jnp.array([0.3, -0.1])}
  grads = {'w': jnp.array([[3.0, 0.0], [-4.0, 1.0]]), 'b': jnp.array([0.0, 2.0])}
  updates, state = tx.update(grads, tx.init(params), params)
  norm = np.sqrt(9 + 16 + 1 + 4)
  for k in params:
    g = np.asarray(grads[k]) * 0.5 / norm
    m, v = 0.1 * g, 0.001 * g * g
    mhat, vhat = m / 0.1, v / 0.001
    step = mhat / (np.sqrt(vhat) + 1e-8)
    if k == 'w':  # weight decay on matrices only
      step = step + 0.1 * np.asarray(params[k])
    np.testing.assert_allclose(np.asarray(updates[k]), -1e-3 * step, rtol=1e-5, atol=1e-9)
  assert float(optim.current_lr(state)) == pytest.approx(1e-3)


def test_grad_metrics_log_the_hier_group_only_with_its_clip():
  """optim.grad_metrics: the global norm always (the guard reads it); the 'hier_*' group's norm
  beside it only with optim.hier_grad_clip > 0, so the default log is unchanged."""
  grads = {'hier_head': {'w': jnp.array([3.0, 4.0])}, 'trunk': {'w': jnp.array([12.0])}}
  assert {k: float(v) for k, v in optim.grad_metrics(_optim_cfg(), grads).items()} == {
      'grad_norm': 13.0}
  m = optim.grad_metrics(_optim_cfg(hier_grad_clip=1.0), grads)
  assert {k: float(v) for k, v in m.items()} == {'grad_norm': 13.0, 'hier_grad_norm': 5.0}


def test_ema_update_and_warmup():
  ema = {'a': jnp.array([1.0, 2.0])}
  new = optim.ema_update(ema, {'a': jnp.array([3.0, 0.0])}, jnp.float32(0.75))
  np.testing.assert_allclose(np.asarray(new['a']), [1.5, 1.5])
  cfg = _optim_cfg(ema_decay=0.999, ema_warmup=True)
  assert float(optim.ema_decay_at(cfg, 0)) == pytest.approx(0.1)
  assert float(optim.ema_decay_at(cfg, 90)) == pytest.approx(0.91)
  assert float(optim.ema_decay_at(cfg, 10**6)) == pytest.approx(0.999)
  assert float(optim.ema_decay_at(_optim_cfg(ema_decay=0.999), 0)) == pytest.approx(0.999)
