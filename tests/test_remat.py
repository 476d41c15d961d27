"""Tests for `model.remat` (models/dit.py REMAT_POLICIES, docs/method.md §4.6): rematerialising
the DiT blocks changes neither the parameter tree (names, shapes, initial values) nor the values
of the outputs and gradients, and it really puts jax.checkpoint into the differentiated program
(with each policy's own rule); 'none' leaves no trace of it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax import models
from hmdlm_jax.models import dit
from tests.model_helpers import L, build, inputs, model_cfg, random_params

POLICIES = ('block', 'dots')
# Two trunk blocks and one block of the level pathway: every block the DiT builds is wrapped.
SIZE = dict(num_layers=2, hier_layers=1)
BLOCKS = 3


def _model(remat: str, dtype: str = 'float32', **over):
  return build(model_cfg(remat=remat, dtype=dtype, **SIZE, **over))


def _loss_fn(model, train: bool):
  """(params, rng) -> (a scalar of both heads, the outputs), the gradient's function."""
  tokens, levels, t = inputs()

  def f(params, rng):
    out = models.make_apply_fn(model, params, train=train, rng=rng)(
        tokens, levels, t, heads=('hier', 'token'))
    loss = (jnp.mean(jax.nn.log_softmax(out['token'])[..., 0])
            + jnp.mean(jax.nn.log_softmax(out['hier'])[..., 0]))
    return loss, out

  return f


def test_policies_match_the_schema():
  assert tuple(dit.REMAT_POLICIES) == config_lib.schema.REMAT_POLICIES
  assert dit.BLOCK_CLASSES['none'] is dit.DDiTBlock
  assert all(dit.BLOCK_CLASSES[p] is not dit.DDiTBlock for p in POLICIES)


@functools.lru_cache(maxsize=None)
def _init(remat: str):
  return jax.device_get(models.init_params(_model(remat), jax.random.key(3), L))


@pytest.mark.parametrize('remat', POLICIES)
def test_parameter_tree_and_init_are_unchanged(remat):
  """Same paths, shapes and initial values: checkpoints load with remat on or off."""
  ref, got = _init('none'), _init(remat)
  flat_ref = jax.tree_util.tree_flatten_with_path(ref)[0]
  flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
  assert [jax.tree_util.keystr(p) for p, _ in flat_got] == [
      jax.tree_util.keystr(p) for p, _ in flat_ref]
  assert any('blocks_1' in jax.tree_util.keystr(p) for p, _ in flat_ref)
  for (path, a), (_, b) in zip(flat_ref, flat_got):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  assert models.logical_specs(_model(remat), L) == models.logical_specs(_model('none'), L)


# The recomputed forward is the same arithmetic, so values agree to float32 rounding (XLA may
# fuse the recomputation differently; on XLA:CPU the gradients differ by ~1e-7 of each leaf's
# largest entry, in both dtypes). bfloat16 allows for such a difference flipping the bfloat16
# rounding of an intermediate (2^-8 relative); a different dropout mask or a lost gradient path
# is O(1) either way.
TOLERANCE = {'float32': dict(rtol=1e-5, atol=1e-6), 'bfloat16': dict(rtol=1e-2, atol=1e-3)}


@functools.lru_cache(maxsize=None)
def _value_and_grad(remat: str, dtype: str):
  """(loss, outputs, parameter gradients) in training mode (dropout on, one key), as numpy; the
  same parameters for every policy (the trees are equal). Cached: one compile per program."""
  params = random_params(_model('none', dtype), L, seed=1)
  f = jax.jit(jax.value_and_grad(_loss_fn(_model(remat, dtype), True), has_aux=True))
  return jax.device_get(f(params, jax.random.key(7)))


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('remat', POLICIES)
def test_outputs_and_gradients_equal(remat, dtype):
  """The remat program draws the same dropout masks and gives the same outputs and parameter
  gradients as the plain one."""
  (l_ref, out_ref), g_ref = _value_and_grad('none', dtype)
  (l_got, out_got), g_got = _value_and_grad(remat, dtype)
  tol = TOLERANCE[dtype]
  np.testing.assert_allclose(l_got, l_ref, **tol)
  for k in out_ref:
    np.testing.assert_allclose(out_got[k], out_ref[k], **tol)
  norms = []
  for (path, a), (_, b) in zip(jax.tree_util.tree_flatten_with_path(g_ref)[0],
                               jax.tree_util.tree_flatten_with_path(g_got)[0]):
    scale = float(np.max(np.abs(a))) or 1.0  # atol relative to the leaf's largest entry
    np.testing.assert_allclose(b, a, rtol=tol['rtol'], atol=tol['atol'] + tol['rtol'] * scale,
                               err_msg=jax.tree_util.keystr(path))
    norms.append(float(np.linalg.norm(a)))
  assert sum(n > 0 for n in norms) > len(norms) // 2  # informative gradients, not all zero


def _checkpoints(model) -> list[jax.core.JaxprEqn]:
  """The jax.checkpoint equations of the gradient's jaxpr (nested jaxprs included)."""
  params = random_params(_model('none'), L, seed=2)
  grad = jax.grad(lambda p, r: _loss_fn(model, True)(p, r)[0])
  jaxpr = jax.make_jaxpr(grad)(params, jax.random.key(0))
  found = []

  def walk(jx):
    for eqn in jx.eqns:
      if eqn.primitive.name in ('checkpoint', 'remat', 'remat2'):
        found.append(eqn)
      for sub in jax.core.jaxprs_in_params(eqn.params):
        walk(sub)

  walk(jaxpr.jaxpr)
  return found


def test_remat_is_in_the_program_only_when_on():
  assert _checkpoints(_model('none')) == []
  want = {'block': jax.checkpoint_policies.nothing_saveable,
          'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
  for remat in POLICIES:
    eqns = _checkpoints(_model(remat))
    assert len(eqns) == BLOCKS, (remat, len(eqns))  # every block, each once (forward)
    assert all(e.params['policy'] is want[remat] for e in eqns), remat


def test_gpt2_does_not_take_remat_and_bad_values_are_refused():
  with pytest.raises(ValueError, match=r"model\.remat='all' is invalid: allowed"):
    config_lib.ModelConfig.from_section(model_cfg(remat='all'))
  with pytest.raises(ValueError, match=r"model\.remat='block' is invalid: .*backbone='dit'"):
    config_lib.ModelConfig.from_section(model_cfg(remat='block', backbone='gpt2'))
  assert config_lib.ModelConfig.from_section(model_cfg()).remat == 'none'
  assert build(model_cfg()).remat == 'none'


def test_aot_set_overrides_reach_the_config_and_the_record():
  """benchmarks/aot.py `--set model.remat=block`: applied before compiling, part of the cell's id
  (cells without overrides keep their ids) and of its table label."""
  from benchmarks import aot  # pylint: disable=g-import-not-at-top
  sets = ('model.remat=block',)
  cell = aot.tpu_plan(['tiny_test.py'], ['v5e:2x2'], ['train'], 'data', 0, 0, sets)[0]
  plain = aot.tpu_plan(['tiny_test.py'], ['v5e:2x2'], ['train'], 'data', 0)[0]
  assert cell['overrides'] == ['model.remat=block'] and plain['overrides'] == []
  assert aot.cell_id(plain) == 'tiny_test.py|train|v5e:2x2|data|accum=0|batch=0'
  assert aot.cell_id(cell) == aot.cell_id(plain) + '|model.remat=block'
  assert aot.config_label(cell) == 'tiny_test.py (model.remat=block)'
  assert aot.config_label(plain) == 'tiny_test.py'
  # Lowered only (no compile), on this host's CPU device: the override is in the program.
  _, config, _ = aot.build_tpu_step('tiny_test.py', 'train', jax.devices()[:1], 'data', 0, 0,
                                    sets)
  assert config.model.remat == 'block'


@pytest.mark.parametrize('value', ['model.remat', 'remat=block', 'model.remat='])
def test_aot_bad_set_is_one_error_line(capsys, value):
  from benchmarks import aot  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as e:
    aot.main(['--platform=tpu', '--set', value])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f'python -m benchmarks.aot: error: --set={value}')
