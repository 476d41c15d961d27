"""ADLM authors' checkpoint -> our ADLM model: the converted Flax forward equals a PyTorch one.

The reference holds the authors' two networks under their attribute names (`backbone`: MDLM's
DIT, `denoiser`: their models/denoiser.py DIT, whose input is a Linear(V, H) on the anchor logits)
built from tests/test_convert_mdlm.py's plain-PyTorch DiT, so its `state_dict()` has their exact
keys. Tiny sizes, every weight random (adaLN and output layers too, which they zero-initialise),
saved as a Lightning-style .ckpt with EMA shadow parameters in their EMA's order.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from hmdlm_jax import convert_adlm
from hmdlm_jax import convert_mdlm
from hmdlm_jax import models
from hmdlm_jax import preflight
from hmdlm_jax import processes
from hmdlm_jax import sharding
from hmdlm_jax import tasks
from hmdlm_jax import train
from hmdlm_jax.configs import adlm_owt
from hmdlm_jax.processes import base
from hmdlm_jax.processes import parameterization
from tests.config_helpers import resolved
from tests.test_convert_mdlm import B, C, H, L, M, NH, V, RefDIT, randomize

NA, ND = 4, 2  # blocks of the anchor network and of the denoiser (half, the authors' rule)
MASK = V - 1  # the authors append [MASK] after GPT-2's words: the last row
HPARAMS = {'config': {'parameterization': 'subs', 'time_conditioning': False, 'backbone': 'dit',
                      'model': {'n_blocks': NA}}}


class RefADLM(torch.nn.Module):
  """The authors' `Diffusion` networks: forward(x [B, L], sigma [B]) -> (denoiser logits,
  anchor logits), both raw [B, L, V] (SUBS is applied after, `subs_log_probs`)."""

  def __init__(self):
    super().__init__()
    self.backbone = RefDIT(NA)
    self.denoiser = RefDIT(ND, logits_input=True)

  def forward(self, x: torch.Tensor, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    anchor = self.backbone(x, sigma)
    return self.denoiser(anchor, sigma), anchor


def subs_log_probs(logits: torch.Tensor, xt: torch.Tensor) -> torch.Tensor:
  """The authors' `_subs_parameterization` (MASK logit -1e6, log-softmax, revealed rows copied)."""
  logits = logits.clone()
  logits[:, :, MASK] += -1e6
  logits = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
  revealed = xt != MASK
  logits[revealed] = -1e6
  logits[revealed, xt[revealed]] = 0
  return logits


@pytest.fixture(scope='module')
def reference():
  torch.manual_seed(0)
  return randomize(RefADLM())


def lightning_ckpt(ref: RefADLM, *, denoiser: str = 'denoiser', ema_scale: float = 2.0,
                   hparams: dict | None = None) -> dict:
  """A Lightning checkpoint dict as theirs: state_dict, EMA shadow params (backbone, noise (none),
  denoiser: their EMA's order) distinguishable from the raw ones, hyper_parameters."""
  sd = {k.replace('denoiser.', f'{denoiser}.', 1): v.float() for k, v in ref.state_dict().items()}
  shadow = [ema_scale * p.detach().float()
            for p in itertools.chain(ref.backbone.parameters(), ref.denoiser.parameters())]
  return {'state_dict': sd, 'ema': {'decay': 0.9999, 'num_updates': 7, 'shadow_params': shadow},
          'hyper_parameters': HPARAMS if hparams is None else hparams}


@pytest.fixture(scope='module')
def ckpt_file(reference, tmp_path_factory):
  path = tmp_path_factory.mktemp('adlm') / 'adlm-medium.ckpt'
  torch.save(lightning_ckpt(reference), str(path))
  return path


def tiny_config(**changes):
  """configs/adlm_owt.py at the reference's sizes (float32, no dropout)."""
  sizes = {'model.num_layers': NA, 'model.hidden_size': H, 'model.num_heads': NH,
           'model.mlp_dim': M, 'model.cond_dim': C, 'model.vocab_size': V, 'model.seq_len': L,
           'data.seq_len': L, 'model.dtype': 'float32', 'model.dropout': 0.0, 'mesh.data': 1,
           'data.batch_size': B + 1, 'data.eval_batch_size': B + 1, 'train.num_steps': 10,
           'optim.warmup_steps': 1}
  return resolved(adlm_owt.get_config(), **sizes, **changes)


def inputs(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """z_t [B, L] with about half the positions MASK, t [B]."""
  rng = np.random.default_rng(seed)
  x = rng.integers(0, V - 1, (B, L))
  x = np.where(rng.random((B, L)) < 0.5, MASK, x).astype(np.int32)
  return x, rng.uniform(0.05, 1.0, B).astype(np.float32)


def ours(params, xt, t) -> dict[str, np.ndarray]:
  model = models.build_model(tiny_config().model)
  fn = jax.jit(lambda p, x, s: model.apply({'params': p}, x, jnp.zeros_like(x), s,
                                            heads=('anchor', 'token'), train=False))
  return jax.tree.map(np.asarray, fn(params, jnp.asarray(xt), jnp.asarray(t)))


def theirs(ref: RefADLM, xt) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(denoiser logits, anchor logits, SUBS log-probs); σ = 0 (time_conditioning=False)."""
  x = torch.as_tensor(xt, dtype=torch.long)
  with torch.no_grad():
    token, anchor = ref(x, torch.zeros(x.shape[0], dtype=torch.float64))
    return token.numpy(), anchor.numpy(), subs_log_probs(token, x).numpy()


def test_reference_has_the_authors_key_names(reference):
  sd = reference.state_dict()
  for k in ('backbone.vocab_embed.embedding', 'backbone.blocks.3.attn_qkv.weight',
            'backbone.rotary_emb.inv_freq', 'backbone.output_layer.linear.bias',
            'denoiser.vocab_embed.0.weight', 'denoiser.vocab_embed.0.bias',
            'denoiser.sigma_map.mlp.0.weight', 'denoiser.rotary_emb.inv_freq',
            'denoiser.blocks.1.adaLN_modulation.weight', 'denoiser.output_layer.norm_final.weight'):
    assert k in sd, k
  assert tuple(sd['denoiser.vocab_embed.0.weight'].shape) == (H, V)
  assert not any(k.startswith('denoiser.blocks.2') for k in sd)


@pytest.mark.parametrize('denoiser', ['denoiser', 'replica'])
def test_forward_matches_pytorch(reference, tmp_path, denoiser):
  path = tmp_path / 'a.ckpt'
  torch.save(lightning_ckpt(reference, denoiser=denoiser), str(path))
  state, notes = convert_adlm.read_ckpt(path)
  params, dims = convert_adlm.convert_state_dict(state)
  assert dims == {'vocab_size': V, 'hidden_size': H, 'cond_dim': C, 'mlp_dim': M,
                  'num_layers': NA, 'num_heads': NH, 'denoiser_layers': ND}
  assert notes == {}  # no tokenizer saved: the MASK id is not known from the file
  xt, t = inputs()
  got = ours(params, xt, t)
  token, anchor, logp = theirs(reference, xt)
  for name, want in (('anchor', anchor), ('token', token)):
    scale = np.abs(want).max()
    assert scale > 1.0, name  # a non-trivial output
    np.testing.assert_allclose(got[name], want, atol=2e-5 * scale, rtol=0, err_msg=name)
  # SUBS at the masked positions: ours (processes/parameterization.py) is theirs.
  mine = np.asarray(parameterization.token_log_probs(jnp.asarray(got['token']), jnp.asarray(xt),
                                                     mask_id=MASK))
  masked = xt == MASK
  np.testing.assert_allclose(mine[masked][:, :MASK], logp[masked][:, :MASK], atol=1e-4, rtol=0)


def test_converted_tree_matches_the_model_tree(ckpt_file):
  params, _ = convert_adlm.convert_state_dict(convert_adlm.read_ckpt(ckpt_file)[0])
  abstract = models.abstract_params(models.build_model(tiny_config().model), L)
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, abstract)
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))


def test_use_ema_takes_the_shadow_weights(reference, ckpt_file, tmp_path):
  raw = convert_adlm.read_ckpt(ckpt_file)[0]
  ema = convert_adlm.read_ckpt(ckpt_file, use_ema=True)[0]
  sd = reference.state_dict()
  for k in ('backbone.blocks.2.mlp.0.weight', 'denoiser.vocab_embed.0.bias',
            'denoiser.blocks.1.attn_out.weight', 'denoiser.output_layer.linear.weight'):
    np.testing.assert_array_equal(raw[k], sd[k].float().numpy())
    np.testing.assert_array_equal(ema[k], 2.0 * sd[k].float().numpy())
  for k in ('backbone.rotary_emb.inv_freq', 'denoiser.rotary_emb.inv_freq'):  # buffers: no EMA
    np.testing.assert_array_equal(ema[k], sd[k].float().numpy())
  # The CLI's --use_ema file is the conversion of the shadow weights.
  dst = tmp_path / 'ema.npz'
  convert_adlm.main(['--src', str(ckpt_file), '--dst', str(dst), '--use_ema'])
  flat = convert_mdlm.flatten(convert_mdlm.load_params(dst))
  want = convert_mdlm.flatten(convert_adlm.convert_state_dict(ema)[0])
  assert flat.keys() == want.keys()
  for k, v in want.items():
    np.testing.assert_array_equal(flat[k], v)
  np.testing.assert_array_equal(flat['denoiser_in/kernel'],
                                2.0 * sd['denoiser.vocab_embed.0.weight'].float().numpy().T)


def _expect(fn, pattern: str) -> None:
  with pytest.raises(ValueError, match=pattern):
    fn()


def test_bad_input_is_refused(reference, tmp_path, capsys):
  state = {k: v.float().numpy() for k, v in reference.state_dict().items()}
  conv = convert_adlm.convert_state_dict
  _expect(lambda: conv({k: v for k, v in state.items() if not k.startswith('denoiser.')}),
          'not an ADLM checkpoint.*convert_mdlm')
  _expect(lambda: convert_mdlm.convert_state_dict(state), 'ADLM checkpoint.*convert_adlm')
  no_bias = {k: v for k, v in state.items() if k != 'denoiser.output_layer.linear.bias'}
  _expect(lambda: conv(no_bias), 'lacks denoiser.output_layer.linear.bias')
  _expect(lambda: conv(dict(state, **{'denoiser.vocab_embed.0.weight': np.zeros((H, V + 1))})),
          r"input map \[H, V\] is \(32, 38\)")
  _expect(lambda: conv(dict(state, **{'denoiser.blocks.0.norm1.bias': np.zeros(H)})),
          'does not know.*norm1.bias')
  _expect(lambda: conv(dict(state, **{'noise.sigma_max': np.zeros(())})), "outside.*noise")
  _expect(lambda: conv(dict(state, **{f'replica.{k[9:]}': v for k, v in state.items()
                                      if k.startswith('denoiser.')})), 'both denoiser')
  wide = {k: (np.zeros((2 * C, 256)) if k == 'denoiser.sigma_map.mlp.0.weight' else v)
          for k, v in state.items()}
  _expect(lambda: conv(wide), 'cond width is 32 but')
  assert conv(dict(state, **{'valid_metrics.nll.mean_value': np.zeros(())}))[1]['num_layers'] == NA
  # Files: a setting our network cannot reproduce, an EMA of other modules, the wrong kind.
  for name, ckpt, pattern in (
      ('tc.ckpt', lightning_ckpt(reference, hparams={'config': dict(HPARAMS['config'],
                                                                    time_conditioning=True)}),
       'time_conditioning=True'),
      ('ema.ckpt', dict(lightning_ckpt(reference), ema={'shadow_params': [torch.zeros(1)]}),
       '1 EMA tensors for')):
    torch.save(ckpt, str(tmp_path / name))
    _expect(lambda n=name: convert_adlm.read_ckpt(tmp_path / n, use_ema=True), pattern)
  (tmp_path / 'x.safetensors').write_bytes(b'0')
  _expect(lambda: convert_adlm.read_ckpt(tmp_path / 'x.safetensors'), "Lightning .ckpt")
  # The CLI: one error line naming the problem, exit status 1, nothing written.
  with pytest.raises(SystemExit):
    convert_adlm.main(['--src', str(tmp_path / 'tc.ckpt'), '--dst', str(tmp_path / 'o.npz')])
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('hmdlm_jax: error:') and 'time_conditioning' in err[0]
  assert not (tmp_path / 'o.npz').exists()


def test_hparams_give_the_mask_id_and_refuse_what_we_cannot_run():
  """check_hparams reads their pickled config and tokenizer (OmegaConf / a tokenizer object in the
  release; plain stand-ins here)."""
  def tok(mask):
    return type('Tok', (), {'mask_token_id': mask})()
  assert convert_adlm.check_hparams({'hyper_parameters': dict(HPARAMS, tokenizer=tok(None))},
                                    'f') == {'mask_id': -1}  # GPT-2: MASK appended, the last row
  assert convert_adlm.check_hparams({'hyper_parameters': {'tokenizer': tok(103)}}, 'f') == {
      'mask_id': 103}  # bert-base-uncased (LM1B): its own [MASK]
  assert convert_adlm.check_hparams({}, 'f') == {}
  for field, value in (('parameterization', 'sedd'), ('backbone', 'dimamba')):
    hp = {'config': dict(HPARAMS['config'], **{field: value})}
    _expect(lambda h=hp: convert_adlm.check_hparams({'hyper_parameters': h}, 'f'),
            f'trained with {field}={value!r}')


def test_init_field_is_checked(ckpt_file, tmp_path):
  npz = str(tmp_path / 'a.npz')
  convert_adlm.main(['--src', str(ckpt_file), '--dst', npz])
  for changes, pattern in (
      ({'process.kind': 'mdlm', 'process.adlm.gamma': 3e-3}, "set process.kind='adlm'"),
      ({'init.mdlm_checkpoint': npz}, 'has no ADLM denoiser'),
      ({'init.workdir': str(tmp_path)}, 'init.adlm_checkpoint and init.workdir are both set'),
      ({'init.adlm_checkpoint': str(tmp_path / 'none.npz')}, 'must be an existing .npz'),
      ({'init.adlm_checkpoint': str(ckpt_file)}, 'must be an existing .npz: convert')):
    changes = {'init.adlm_checkpoint': npz, **changes}
    _expect(lambda c=changes: tiny_config(**c), pattern)
  small = tiny_config(**{'init.adlm_checkpoint': npz, 'process.adlm.denoiser_layers': 1})
  _expect(lambda: preflight.check_init(small, tasks.build_model(small)),
          r"init.adlm_checkpoint=.*not in the model.*denoiser_blocks_1")


@pytest.fixture(scope='module')
def started(ckpt_file, tmp_path_factory):
  """configs/adlm_owt.py (tiny) with init.adlm_checkpoint: (config, model, mesh, initial state
  (the training test donates it), its shardings, the initial params and EMA on the host)."""
  npz = tmp_path_factory.mktemp('init') / 'adlm.npz'
  convert_adlm.main(['--src', str(ckpt_file), '--dst', str(npz)])
  config = tiny_config(**{'init.adlm_checkpoint': str(npz)})
  model = tasks.build_model(config)
  mesh = sharding.make_mesh(config.mesh)
  state, sh = train.create_train_state(config, mesh, model)
  return config, model, mesh, state, sh, jax.device_get((state.params, state.ema_params))


def test_adlm_config_from_the_converted_file_evaluates(reference, started):
  """The initial state is the authors' network (EMA too); its reported bound at a fixed z_t is
  the authors' NELBO term."""
  config, model, _, _, _, (params, ema) = started
  xt, t = inputs(5)
  token, _, logp = theirs(reference, xt)
  np.testing.assert_allclose(ours(params, xt, t)['token'], token,
                             atol=2e-5 * np.abs(token).max(), rtol=0)
  for a, b in zip(jax.tree.leaves(ema), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)
  # The reported bound at this z_t is MDLM's term of the authors' network,
  # Σ_masked w(t) · -log p(x^l) / L with w(t) = 1/t (log-linear schedule).
  proc = processes.build(config)
  rng = np.random.default_rng(6)
  x0 = np.where(xt == MASK, rng.integers(0, V - 1, xt.shape), xt).astype(np.int32)
  batch = proc.prepare_batch(dict(tokens=x0, levels=np.zeros_like(x0),
                                  given=np.zeros(x0.shape, bool),
                                  loss_mask=np.ones(x0.shape, bool)))
  noisy = base.NoisyState(tokens=jnp.asarray(xt), levels=jnp.asarray(xt == MASK, jnp.int32))
  bound = jax.jit(lambda p, b: proc.bound_from_state(models.make_apply_fn(model, p, train=False),
                                                     b, noisy, jnp.asarray(t),
                                                     jax.random.key(0))['lm'])
  got = bound(params, batch)
  nll = -np.take_along_axis(logp, x0[..., None], -1)[..., 0] * (xt == MASK)
  hazard = np.asarray(proc.mdlm.schedule.hazard(jnp.asarray(t)))[:, 0]
  np.testing.assert_allclose(hazard, 1.0 / t, rtol=2e-3)  # 1/t up to the schedule's ε
  np.testing.assert_allclose(np.asarray(got), hazard * nll.sum(-1) / L, rtol=1e-4)


def test_adlm_config_from_the_converted_file_trains(started):
  """Step 1 has lr 0 (warm-up): the weights stay the authors' (the evaluation recipe of
  docs/usage.md: train.num_steps=1, then its final evaluation); step 2 moves them."""
  config, model, mesh, state, sh, (params, _) = started
  proc = processes.build(config)
  step = train.make_train_step(config, model, proc, mesh, sh)
  rng = np.random.default_rng(7)
  for n in (1, 2):
    tokens = rng.integers(0, V - 1, (B + 1, L)).astype(np.int32)
    raw = proc.prepare_batch(dict(tokens=tokens, levels=np.zeros_like(tokens),
                                  given=np.zeros(tokens.shape, bool),
                                  loss_mask=np.ones(tokens.shape, bool)))
    with sharding.mesh_context(mesh):
      state, metrics = step(state, jax.device_put(raw, sharding.batch_sharding(mesh)))
    assert bool(metrics['update_ok']) and np.isfinite(float(metrics['loss']))
    now = jax.device_get(state.params)
    if n == 1:
      assert float(metrics['lr']) == 0.0 and float(metrics['grad_norm']) > 0.0
      for a, b, e in zip(jax.tree.leaves(now), jax.tree.leaves(params),
                         jax.tree.leaves(jax.device_get(state.ema_params))):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(e, b, rtol=1e-6, atol=1e-7)
  assert float(metrics['lr']) > 0.0
  assert not np.allclose(now['denoiser_in']['kernel'], params['denoiser_in']['kernel'])
