r"""Reference training steps from the public md4 and MDLM trees (benchmarks/side_by_side.py).

Nothing of either tree is copied here: the user points `--reference_tree=md4:PATH` /
`--reference_tree=mdlm:PATH` at a checkout, and this module imports THEIR code from it and times
THEIR step at our shape. The tree is importable because benchmarks/side_by_side.py starts the
reference's child process with it on PYTHONPATH (`_child_env`); nothing here changes sys.path, and
each of the tree's modules is checked to come from that tree (`_import_from_tree`). Modules that the trees import but that the training step never uses
(data pipelines, metric writers, Lightning/Hydra glue, CUDA-only kernels) are replaced by
stand-ins only when they cannot be imported, and each stand-in is named in the record
(`stand_ins`):

md4 (google-deepmind/md4): `md4.train.create_train_state` + `md4.train.train_step` under
  `jax.pmap(axis_name='batch', donate_argnums=0)` on one device, exactly as `md4.train` runs it;
  config `md4/configs/md4/openwebtext.py` with our shape (n_layers, num_heads, feature_dim = H /
  heads, so width H; its GLU MLP has MDLM's MLP FLOPs), vocab 30,522, sequence length L, batch B,
  dropout 0.1 (MDLM's; md4 also drops attention probabilities), its own schedule (linear), EMA
  0.9999 and no clipping (md4's defaults). Needs md4's dependencies (clu, distrax,
  tensorflow-probability); `md4.input_pipeline*` (TensorFlow) and `clu.metric_writers` are
  stand-ins when TensorFlow is absent, and tensorflow-probability / distrax (used by md4's
  samplers and image likelihoods only) when they do not import with this JAX.
mdlm (kuleshov-group/mdlm): its `models.dit.DIT` (small: 12 × 768, or our tiny width) and its
  `Diffusion._loss` (SUBS, log-linear noise, continuous time, antithetic t), AdamW (lr 3e-4, wd
  0), `clip_grad_norm_(1.0)` and its EMA (`models.ema.ExponentialMovingAverage`, 0.9999), as its
  Lightning trainer runs them; `mdlm_compile` wraps the loss in `torch.compile`. flash-attn is
  CUDA-only, so on CPU its two uses are stand-ins with the same semantics: the rotary
  `apply_rotary_emb_qkv_` (rotate-half on q and k in place) and
  `flash_attn_varlen_qkvpacked_func` (equal-length sequences: `F.scaled_dot_product_attention`).
  Hydra, Lightning, torchmetrics, timm, omegaconf, the Mamba kernels and `dataloader` are
  stand-ins when absent.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import time
import types
from typing import Any, Callable


class _AnyMeta(type):
  def __getattr__(cls, name: str) -> Any:
    if name.startswith('__'):
      raise AttributeError(name)
    return _Anything


class _Anything(metaclass=_AnyMeta):
  """A permissive stand-in class: any attribute (of the class too), call or subclassing works."""

  def __init__(self, *a: Any, **k: Any) -> None:
    pass

  def __call__(self, *a: Any, **k: Any) -> Any:
    return _Anything()

  def __getattr__(self, name: str) -> Any:
    return _Anything()


class _StubModule(types.ModuleType):
  def __getattr__(self, name: str) -> Any:
    if name.startswith('__'):
      raise AttributeError(name)
    return _Anything


def _stand_in(names: list[str], stubs: dict[str, types.ModuleType] | None = None) -> list[str]:
  """Installs a stand-in for every module in `names` that cannot be imported; returns them."""
  used = []
  for name in names:
    try:
      importlib.import_module(name)
      continue
    except Exception:  # pylint: disable=broad-except  (ImportError, or a broken optional dep)
      pass
    mod = (stubs or {}).get(name) or _StubModule(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)  # find_spec() must not fail
    sys.modules[name] = mod
    parent, _, child = name.rpartition('.')
    if parent and parent in sys.modules:
      setattr(sys.modules[parent], child, mod)
    used.append(name)
  return used


class _StubFinder:
  """Meta-path finder: every module under `roots` (absent packages) becomes a stand-in."""

  def __init__(self, roots: list[str]) -> None:
    self.roots = roots

  def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
    if name.split('.')[0] not in self.roots:
      return None
    return importlib.machinery.ModuleSpec(name, self, is_package=True)

  def create_module(self, spec: Any) -> types.ModuleType:
    mod = _StubModule(spec.name)
    mod.__path__ = []
    return mod

  def exec_module(self, module: types.ModuleType) -> None:
    pass


def _stand_in_packages(roots: list[str]) -> list[str]:
  """Stand-ins for every absent top-level package in `roots` and all its submodules."""
  absent = [r for r in roots if importlib.util.find_spec(r) is None]
  if absent:
    sys.meta_path.append(_StubFinder(absent))
  return absent


def _import_from_tree(name: str, tree: str) -> types.ModuleType:
  """`import name`, which must resolve inside the reference checkout `tree` (on this process's
  PYTHONPATH: benchmarks/side_by_side.py `_child_env`); anything else is an error naming both."""
  mod = importlib.import_module(name)
  where = os.path.realpath(getattr(mod, '__file__', None) or '')
  if not where.startswith(os.path.realpath(tree) + os.sep):
    raise RuntimeError(f'{name!r} was imported from {where or "(no file)"}, not from the reference '
                       f'tree {tree}: run the reference with the tree on PYTHONPATH (benchmarks/'
                       'side_by_side.py --reference_tree=NAME:PATH starts its child so).')
  return mod


# ----------------------------------------------------------------------------- md4


def _md4(d: Any, tree: str, warmup: int, steps: int, time_steps: Callable[..., Any]
         ) -> dict[str, Any]:
  _import_from_tree('md4', tree)
  import flax.jax_utils as flax_utils  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  # tensorflow_probability / distrax: only md4's samplers and image likelihoods use them.
  # A dotted stand-in alone fails when its top-level package is absent (`import a.b as x` imports
  # `a` first), so absent packages are stood in whole.
  stubs = _stand_in_packages(['tensorflow_probability', 'distrax', 'seaborn'])
  stubs += _stand_in(['clu.metric_writers', 'clu.periodic_actions', 'md4.input_pipeline',
                      'md4.input_pipeline_v2'])
  from md4 import train as md4_train  # pylint: disable=g-import-not-at-top
  from md4.configs.md4 import openwebtext  # pylint: disable=g-import-not-at-top
  cfg = openwebtext.get_config()
  cfg.vocab_size = d.vocab
  cfg.data_shape = (d.length,)
  cfg.n_layers, cfg.num_heads, cfg.feature_dim = d.num_layers, d.heads, d.hidden // d.heads
  cfg.dropout_rate = 0.1
  cfg.batch_size = d.batch
  schedule_fn = functools.partial(md4_train.get_learning_rate, base_learning_rate=3e-4,
                                  num_steps=1000, warmup_steps=100,
                                  schedule_type=cfg.learning_rate_schedule)
  model, optimizer, state, metrics_class = md4_train.create_train_state(
      cfg, jax.random.PRNGKey(0), input_shape=(d.batch, d.length), schedule_fn=schedule_fn)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  state = flax_utils.replicate(state)
  p_step = jax.pmap(functools.partial(
      md4_train.train_step, model=model, optimizer=optimizer, train_metrics_class=metrics_class,
      learning_rate_fn=schedule_fn, ema_rate=cfg.ema_rate, num_microbatches=None),
                    axis_name='batch', donate_argnums=(0,))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, d.vocab, (1, d.batch, d.length)).astype(np.int32)
  batch = {'text': jax.pmap(lambda x: x)(tokens)}  # [1 device, B, L], on the device
  holder = {'state': state}
  t0 = time.perf_counter()
  holder['state'], m = p_step(train_state=holder['state'], batch=batch)  # compiles
  jax.block_until_ready(m)
  compile_s = time.perf_counter() - t0

  def one() -> Any:
    holder['state'], m = p_step(train_state=holder['state'], batch=batch)
    return m

  rec = time_steps(one, jax.block_until_ready, max(warmup - 1, 0), steps)
  rec.update(compile_s=compile_s, stand_ins=stubs, num_params=n_params,
             tokens_per_step=d.batch * d.length,
             md4_config={k: cfg[k] for k in ('n_layers', 'num_heads', 'feature_dim', 'mlp_type',
                                              'dropout_rate', 'clip', 'ema_rate',
                                              'noise_schedule', 'cond_type')})
  return rec


# ----------------------------------------------------------------------------- mdlm


def _flash_attn_stand_ins() -> dict[str, types.ModuleType]:
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top

  def apply_rotary_emb_qkv_(qkv: Any, cos: Any, sin: Any) -> Any:
    """flash_attn's in-place rotary on q and k of qkv [B, L, 3, h, d]; cos/sin [L, d/2]
    (non-interleaved: rotate-half)."""
    c = torch.cat([cos, cos], -1)[None, :, None, :]
    s = torch.cat([sin, sin], -1)[None, :, None, :]
    half = qkv.shape[-1] // 2
    out = []
    for i in (0, 1):
      x = qkv[:, :, i]
      rot = torch.cat([-x[..., half:], x[..., :half]], -1)
      out.append(x * c + rot * s)
    return torch.stack(out + [qkv[:, :, 2]], dim=2)

  def flash_attn_varlen_qkvpacked_func(qkv: Any, cu_seqlens: Any, max_seqlen: int,
                                       dropout_p: float = 0.0, causal: bool = False) -> Any:
    """[(B L), 3, h, d] with equal lengths -> [(B L), h, d] (softmax attention)."""
    total, _, h, dh = qkv.shape
    b = total // max_seqlen
    q, k, v = qkv.view(b, max_seqlen, 3, h, dh).permute(2, 0, 3, 1, 4).unbind(0)
    o = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    return o.transpose(1, 2).reshape(total, h, dh)

  fa = types.ModuleType('flash_attn')
  layers = types.ModuleType('flash_attn.layers')
  rotary = types.ModuleType('flash_attn.layers.rotary')
  iface = types.ModuleType('flash_attn.flash_attn_interface')
  rotary.apply_rotary_emb_qkv_ = apply_rotary_emb_qkv_
  iface.flash_attn_varlen_qkvpacked_func = flash_attn_varlen_qkvpacked_func
  fa.layers, layers.rotary, fa.flash_attn_interface = layers, rotary, iface
  return {'flash_attn': fa, 'flash_attn.layers': layers, 'flash_attn.layers.rotary': rotary,
          'flash_attn.flash_attn_interface': iface}


class _Cfg(dict):
  """Attribute-access config (what OmegaConf gives MDLM's code)."""

  def __getattr__(self, k: str) -> Any:
    try:
      return self[k]
    except KeyError as e:
      raise AttributeError(k) from e


def _mdlm(name: str, d: Any, tree: str, warmup: int, steps: int,
          time_steps: Callable[..., Any]) -> dict[str, Any]:
  import torch  # pylint: disable=g-import-not-at-top
  fa = _flash_attn_stand_ins()
  stubs = _stand_in(list(fa), fa)
  lightning = types.ModuleType('lightning')
  lightning.LightningModule = torch.nn.Module  # Diffusion's base class: a plain Module here
  stubs += _stand_in(['lightning'], {'lightning': lightning})
  stubs += _stand_in_packages(['hydra', 'torchmetrics', 'timm', 'omegaconf', 'mamba_ssm',
                               'causal_conv1d'])
  stubs += _stand_in(['dataloader'])  # the tree's own data module (datasets, tokenizers)
  diffusion = _import_from_tree('diffusion', tree)
  models = _import_from_tree('models', tree)
  noise_schedule = _import_from_tree('noise_schedule', tree)
  torch.manual_seed(0)
  cfg = _Cfg(model=_Cfg(hidden_size=d.hidden, cond_dim=d.cond, length=d.length,
                        n_blocks=d.num_layers, n_heads=d.heads, scale_by_sigma=True, dropout=0.1))
  if d.mlp != 4 * d.hidden:
    raise ValueError('MDLM DiT has MLP ratio 4')
  diff = diffusion.Diffusion.__new__(diffusion.Diffusion)
  torch.nn.Module.__init__(diff)
  diff.backbone = models.dit.DIT(cfg, vocab_size=d.vocab)
  diff.config = cfg
  diff.mask_index, diff.neg_infinity = d.mask_id, -1000000.0
  diff.parameterization, diff.T, diff.time_conditioning = 'subs', 0, False
  diff.change_of_variables = diff.importance_sampling = False
  diff.antithetic_sampling, diff.sampling_eps = True, 1e-3
  diff.noise = noise_schedule.LogLinearNoise()
  diff.train()
  params = list(diff.backbone.parameters())
  n_params = sum(p.numel() for p in params)
  opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
  ema = models.ema.ExponentialMovingAverage(params, decay=0.9999)
  gen = torch.Generator().manual_seed(0)
  x0 = torch.randint(0, d.vocab, (d.batch, d.length), generator=gen)
  x0 = torch.where(x0 == d.mask_id, x0 + 1, x0)
  mask = torch.ones_like(x0)

  def loss_fn(x0: Any, mask: Any) -> Any:
    return diff._loss(x0, mask).loss  # pylint: disable=protected-access

  if name == 'mdlm_compile':
    # models/dit.py defines `modulate` twice; TorchScript bound `modulate_fused` to the first
    # (x·(1 + scale) + shift, what eager runs), but dynamo inlines the scripted function and
    # looks the name up at trace time, finding the second (which unsqueezes again: a wrong
    # [B, B, L, H] broadcast). Point the name at the definition eager mode uses.
    models.dit.modulate = lambda x, shift, scale: x * (1 + scale) + shift
    stubs.append('models.dit.modulate (torch.compile name clash)')
  fn = torch.compile(loss_fn) if name == 'mdlm_compile' else loss_fn

  def one() -> Any:
    loss = fn(x0, mask)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    ema.update(params)
    return loss

  t0 = time.perf_counter()
  one()  # compiles (torch.compile) / warms up
  compile_s = time.perf_counter() - t0
  rec = time_steps(one, lambda loss: float(loss.detach()), max(warmup - 1, 0), steps)
  rec.update(compile_s=compile_s, stand_ins=stubs, num_params=n_params,
             tokens_per_step=d.batch * d.length, torch=torch.__version__,
             torch_threads=torch.get_num_threads())
  return rec


def run(name: str, d: Any, tree: str, warmup: int, steps: int,
        time_steps: Callable[..., Any]) -> dict[str, Any]:
  if name == 'md4':
    return _md4(d, tree, warmup, steps, time_steps)
  if name in ('mdlm_eager', 'mdlm_compile'):
    return _mdlm(name, d, tree, warmup, steps, time_steps)
  raise ValueError(f'unknown reference {name!r}')
