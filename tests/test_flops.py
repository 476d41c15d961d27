"""benchmarks/flops.py: the explicit train-step FLOP count, against a hand count and the jaxpr."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from benchmarks import flops
from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import hmdlm
from hmdlm_jax import models
from hmdlm_jax.processes import schedules

# A 1-layer model small enough to count by hand: H=8, 2 heads, M=16, C=4, V=11, K=3, L=5, B=2.
H, HEADS, M, C, V, K, L, B = 8, 2, 16, 4, 11, 3, 5, 2


def _model_cfg(backbone: str, num_levels: int, variant: str = 'two_pass'
               ) -> ml_collections.ConfigDict:
  from hmdlm_jax.configs import base  # pylint: disable=g-import-not-at-top
  m = base.get_base_config().model
  m.backbone = backbone
  m.num_levels = num_levels
  m.vocab_size = V
  m.seq_len = L
  m.num_layers = 1
  m.hidden_size = H
  m.num_heads = HEADS
  m.mlp_dim = M
  m.cond_dim = C
  m.dropout = 0.0
  m.variant = variant
  m.position_embedding = 'rotary' if backbone == 'dit' else 'learned'
  m.tie_embeddings = backbone == 'gpt2'
  return m


def test_hand_count_dit_one_layer():
  # Per token: qkv 3·8·8 = 192, out 8·8 = 64, MLP 2·8·16 = 256 -> 512 block parameters;
  # token head 8·11 = 88, hierarchy head 8·3 = 24; attention 4·L·H = 4·5·8 = 160.
  # Per sequence: time embedding 256·4 + 4·4 = 1040, block adaLN 6·8·4 = 192, head adaLN 2·8·4 = 64.
  tok_hier = 2 * (512 + 24) + 160  # 1232
  tok_token = 2 * (512 + 88) + 160  # 1360
  seq = 2 * (1040 + 192 + 64)  # 2592, one adaLN head per pass
  hmdlm = flops.train_step_flops(_model_cfg('dit', K), B)
  assert hmdlm.per_token_forward == (1232, 1360) == (tok_hier, tok_token)
  assert hmdlm.per_sequence_forward == (2592, 2592) == (seq, seq)
  assert hmdlm.num_passes == 2
  assert hmdlm.forward == 36288 == B * L * (tok_hier + tok_token) + B * 2 * seq
  assert hmdlm.train_step == 108864
  mdlm = flops.train_step_flops(_model_cfg('dit', 1), B)
  assert mdlm.num_passes == 1 and mdlm.per_token_forward == (1360,)
  assert mdlm.train_step == 3 * (B * L * 1360 + B * 2592) == 56352
  single = flops.train_step_flops(_model_cfg('dit', K, 'single_pass'), B)
  # One backbone, both heads and both adaLN head modulations.
  assert single.per_token_forward == (2 * (512 + 88 + 24) + 160,)
  assert single.per_sequence_forward == (2 * (1040 + 192 + 2 * 64),)


def test_hand_count_gpt2_one_layer():
  # Same blocks (512), tied token head 88, hierarchy head 24; no conditioning (F_seq = 0).
  hmdlm = flops.train_step_flops(_model_cfg('gpt2', K), B)
  assert hmdlm.per_token_forward == (1232, 1360)
  assert hmdlm.per_sequence_forward == (0, 0)
  assert hmdlm.train_step == 3 * B * L * (1232 + 1360) == 77760


@pytest.mark.parametrize('backbone', ['dit', 'gpt2'])
@pytest.mark.parametrize('heads', [('hier',), ('token',), ('hier', 'token')])
def test_forward_matches_jaxpr_exactly(backbone, heads):
  """The formula's forward count equals the dot_general FLOPs of the real model, exactly."""
  cfg = _model_cfg(backbone, K)
  model = models.build_model(cfg)
  params = models.abstract_params(model, L)  # shapes only: nothing is compiled
  tokens = jnp.zeros((B, L), jnp.int32)
  t = jnp.full((B,), 0.5, jnp.float32)
  fn = lambda p: model.apply({'params': p}, tokens, tokens, t, heads=heads)
  assert flops.jaxpr_matmul_flops(fn, params) == flops.forward_flops(cfg, B, L, heads)


def _batch() -> dict[str, jax.Array]:
  rng = np.random.default_rng(0)
  return {'tokens': jnp.asarray(rng.integers(0, V - 1, (B, L)), jnp.int32),
          'levels': jnp.asarray(rng.integers(0, K, (B, L)), jnp.int32),
          'given': jnp.zeros((B, L), bool), 'loss_mask': jnp.ones((B, L), bool)}


@pytest.mark.parametrize('backbone,num_levels', [('dit', K), ('dit', 1), ('gpt2', K),
                                                 ('gpt2', 1)])
def test_train_step_matches_gradient_jaxpr(backbone, num_levels):
  """3 × forward equals the dot FLOPs of value_and_grad of the real loss, up to one known term.

  The backward pass computes two products per forward product, except that no gradient flows
  into the DiT time embedding's input (a sinusoid of t, not a function of the parameters): the
  formula's ×3 overcounts exactly 2·B·256·C per pass there. GPT-2 (no conditioning) is exact.
  """
  cfg = _model_cfg(backbone, num_levels)
  model = models.build_model(cfg)
  params = models.abstract_params(model, L)  # shapes only: nothing is compiled
  offsets = (0.0, 0.1, 0.2)[:num_levels]
  sched = schedules.Schedule('loglinear', offsets)
  loss_cfg = config_lib.LossConfig(num_levels=num_levels, mask_id=V - 1, train_steps_T=10)
  batch = _batch()
  if num_levels == 1:
    batch['levels'] = jnp.zeros_like(batch['levels'])

  def loss(p):
    apply_fn = models.make_apply_fn(model, p, train=False)
    return hmdlm.diffusion_loss(apply_fn, batch, jax.random.PRNGKey(1), sched, loss_cfg)[0]

  counted = flops.jaxpr_matmul_flops(jax.value_and_grad(loss), params)
  step = flops.train_step_flops(cfg, B)
  no_input_grad = 2 * B * flops.TIME_FREQ_DIM * C * step.num_passes if backbone == 'dit' else 0
  assert counted == step.train_step - no_input_grad
  assert step.num_passes == (2 if num_levels > 1 else 1)


def test_jaxpr_counter_scan_and_cond():
  x = jnp.ones((3, 4), jnp.float32)
  w = jnp.ones((4, 5), jnp.float32)

  def scanned(x, w):
    return jax.lax.scan(lambda c, _: (c, x @ w), 0.0, None, length=7)[1]

  assert flops.jaxpr_matmul_flops(scanned, x, w) == 7 * 2 * 3 * 4 * 5
  big = jnp.ones((4, 50), jnp.float32)

  def branchy(p, x):
    return jax.lax.cond(p, lambda: (x @ big).sum(), lambda: (x @ w).sum())

  assert flops.jaxpr_matmul_flops(branchy, True, x) == 2 * 3 * 4 * 50  # the larger branch
