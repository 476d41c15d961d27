"""MDLM's PyTorch DiT weights -> our Flax DiT parameters (paper section 5.1.2: HMDLM from MDLM-OWT).

Reads the state dict of kuleshov-group/mdlm's `models/dit.py` DIT from a safetensors file (e.g.
the Hugging Face release, hf://kuleshov-group/mdlm-owt: hmdlm_jax/hub.py) or a Lightning `.ckpt`
(`load_mdlm_state_dict`), maps it onto models/dit.py's parameter names (`convert_state_dict` lists
the key map) and writes a `.npz` of the converted tree ('/'-joined paths, float32), read by
`load_params`. HMDLM's own
parameters (level_embed, hier_layer, token_level_embed) do not exist in MDLM and keep their fresh
initialisation (`merge_pretrained`); `init_from_mdlm(params, path)` serves `init.mdlm_checkpoint`,
which accepts that `.npz` or the MDLM file itself (converted on the fly). docs/method.md §6
(WikiHow) and §13.2 (continual adaptation) say where it is used.

CLI: python -m hmdlm_jax.convert_mdlm --src=model.safetensors --dst=mdlm_owt.npz [--use_ema]
     [--num_heads=12] [--allow_pickle]    (--src=hf://kuleshov-group/mdlm-owt: the release)
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import sys
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors import SafetensorError

from hmdlm_jax import hub
from hmdlm_jax import storage

ROTARY_BASE = 1e4
_ANCHOR = 'vocab_embed.embedding'
BUFFER = 'inv_freq'  # the only non-parameter tensor of a DiT state dict (rotary)
HMDLM_ONLY = ('level_embed', 'hier_layer', 'token_level_embed')  # freshly initialised
EVAL_INSTALL = 'pip install "hmdlm_jax[eval]"'  # torch: the `eval` extra (pyproject.toml)


# ----------------------------------------------------------------------------- reading


def _to_numpy(x: Any) -> np.ndarray:
  if hasattr(x, 'detach'):  # a torch tensor; bf16 has no numpy dtype
    return x.detach().float().cpu().numpy()
  return np.asarray(x, dtype=np.float32)


def read_safetensors(path: str | pathlib.Path) -> dict[str, np.ndarray]:
  """All tensors of a safetensors file as float32 numpy (bf16 goes through torch)."""
  out = {}
  try:
    with safe_open(str(path), framework='np') as f:
      for k in f.keys():
        out[k] = np.asarray(f.get_tensor(k), np.float32)
    return out
  except SafetensorError as e:  # truncated or not a safetensors file at all
    raise ValueError(f'{path}: not a readable safetensors file ({e}); re-download it.') from e
  except (TypeError, ValueError) as e:  # e.g. bfloat16, which numpy cannot hold
    try:
      import torch  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      raise ValueError(f'{path}: cannot read with numpy ({e}); converting it needs torch: '
                       f'{EVAL_INSTALL}') from e
    with safe_open(str(path), framework='pt') as f:
      return {k: _to_numpy(f.get_tensor(k)) for k in f.keys()}


def torch_load(path: str | pathlib.Path, *, allow_pickle: bool = False) -> Mapping[str, Any]:
  """A Lightning checkpoint as a dict (torch.load on the CPU; pickled objects only if allowed)."""
  try:
    import torch  # pylint: disable=g-import-not-at-top  (optional: only .ckpt files need it)
  except ImportError as e:
    raise ValueError(f'{path}: reading a Lightning .ckpt needs torch ({EVAL_INSTALL}), or '
                     'convert the release\'s model.safetensors instead.') from e
  try:
    ckpt = torch.load(str(path), map_location='cpu', weights_only=not allow_pickle)
  except Exception as e:  # pylint: disable=broad-except
    if allow_pickle:
      raise
    raise ValueError(
        f'{path}: torch.load(weights_only=True) failed ({type(e).__name__}: {e}). Lightning '
        'checkpoints may pickle config objects; if you trust the file, pass --allow_pickle.') from e
  if not isinstance(ckpt, Mapping) or 'state_dict' not in ckpt:
    raise ValueError(f'{path}: not a Lightning checkpoint (no "state_dict" entry).')
  return ckpt


def lightning_state(ckpt: Mapping[str, Any], path: str | pathlib.Path, *, use_ema: bool,
                    ema_modules: Sequence[str] = ()) -> dict[str, np.ndarray]:
  """`ckpt['state_dict']` as float32 numpy, with the EMA weights if `use_ema`.

  `ckpt['ema']['shadow_params']` lists the parameters of the modules the EMA was built on, in
  that order (`ema_modules`: their state-dict prefixes; default the MDLM backbone's), each module's
  in registration order = its state-dict order without buffers (rotary inv_freq).
  """
  state = dict(ckpt['state_dict'])
  out = {k: _to_numpy(v) for k, v in state.items()}
  if not use_ema:
    return out
  if 'ema' not in ckpt or 'shadow_params' not in ckpt['ema']:
    raise ValueError(f'{path}: --use_ema given but the checkpoint holds no ema.shadow_params.')
  names = [k for prefix in (ema_modules or (_prefix(state),)) for k in state
           if k.startswith(prefix) and not k.endswith(BUFFER)]
  shadow = list(ckpt['ema']['shadow_params'])
  if len(shadow) != len(names):
    raise ValueError(f'{path}: {len(shadow)} EMA tensors for {len(names)} network parameters.')
  for k, v in zip(names, shadow):
    if tuple(v.shape) != tuple(state[k].shape):
      raise ValueError(f'{path}: EMA tensor for {k} has shape {tuple(v.shape)}, parameter '
                       f'{tuple(state[k].shape)}.')
    out[k] = _to_numpy(v)
  return out


def read_lightning_ckpt(path: str | pathlib.Path, *, use_ema: bool = False,
                        allow_pickle: bool = False) -> dict[str, np.ndarray]:
  """The backbone state dict of an MDLM Lightning checkpoint (EMA weights if `use_ema`)."""
  return lightning_state(torch_load(path, allow_pickle=allow_pickle), path, use_ema=use_ema)


def load_mdlm_state_dict(path: str | pathlib.Path, *, use_ema: bool = False,
                         allow_pickle: bool = False) -> dict[str, np.ndarray]:
  """MDLM DiT state dict from `.safetensors` or a Lightning `.ckpt`.

  A safetensors file holds keys 'backbone.*' (the Hugging Face release); a Lightning `.ckpt` holds
  them under 'state_dict', prefixed 'backbone.'; `use_ema=True` takes the EMA weights from
  `checkpoint['ema']['shadow_params']` (MDLM evaluates with them), which list the backbone's
  parameters in registration order. Any common prefix before 'vocab_embed.embedding' is stripped
  later (`convert_state_dict`).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise ValueError(f'MDLM checkpoint {path} does not exist.')
  if path.suffix == '.safetensors':
    if use_ema:
      raise ValueError(f'{path}: --use_ema applies to Lightning .ckpt files only (safetensors '
                       'releases hold one set of weights).')
    return read_safetensors(path)
  if path.suffix in ('.ckpt', '.pt', '.pth'):
    return read_lightning_ckpt(path, use_ema=use_ema, allow_pickle=allow_pickle)
  raise ValueError(f'{path}: unknown checkpoint type {path.suffix!r}; expected .safetensors or a '
                   'Lightning .ckpt.')


# ----------------------------------------------------------------------------- conversion


def _prefix(state: Mapping[str, Any]) -> str:
  hits = [k for k in state if k.endswith(_ANCHOR)]
  if len(hits) != 1:
    raise ValueError(f'expected exactly one key ending in {_ANCHOR!r} (MDLM DiT), found {hits}.')
  return hits[0][:-len(_ANCHOR)]


class StateReader:
  """The tensors of one torch module's state dict under `prefix`, taken by name with their shapes
  checked; `unused()` lists what was never taken (the caller refuses or names them)."""

  def __init__(self, state: Mapping[str, np.ndarray], prefix: str, what: str):
    self.sd = {k[len(prefix):]: np.asarray(v, np.float32) for k, v in state.items()
               if k.startswith(prefix)}
    self.prefix, self.what = prefix, what
    self.used: set[str] = set()

  def take(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    if name not in self.sd:
      raise ValueError(f'{self.what} state dict lacks {self.prefix}{name}.')
    if shape is not None and self.sd[name].shape != shape:
      raise ValueError(f'{self.prefix}{name} has shape {self.sd[name].shape}, expected {shape}.')
    self.used.add(name)
    return self.sd[name]

  def linear(self, name: str, n_in: int, n_out: int) -> dict[str, np.ndarray]:
    """A torch nn.Linear with bias: weight [out, in] -> kernel [in, out], bias [out]."""
    return {'kernel': self.take(f'{name}.weight', (n_out, n_in)).T,
            'bias': self.take(f'{name}.bias', (n_out,))}

  def block_indices(self) -> list[int]:
    layers = sorted({int(m.group(1)) for k in self.sd if (m := re.match(r'blocks\.(\d+)\.', k))})
    if layers != list(range(len(layers))) or not layers:
      raise ValueError(f'{self.what} state dict has blocks {layers} under {self.prefix!r}; '
                       'expected 0..N-1.')
    return layers

  def unused(self) -> list[str]:
    return sorted(set(self.sd) - self.used)


def rotary_heads(r: StateReader, h: int, num_heads: int | None) -> int:
  """The head count: from rotary_emb.inv_freq [hd/2] (checked to be base 1e4, our rotary
  embedding's) when present, else `num_heads`."""
  if 'rotary_emb.inv_freq' in r.sd:
    inv = r.take('rotary_emb.inv_freq')
    hd = 2 * inv.shape[0]
    want = 1.0 / ROTARY_BASE**(np.arange(0, hd, 2, dtype=np.float64) / hd)
    if not np.allclose(inv, want, rtol=1e-5):
      raise ValueError(f'{r.prefix}rotary_emb.inv_freq is not base {ROTARY_BASE:g}; our rotary '
                       'embedding cannot reproduce it.')
    heads_from_rotary = h // hd
    if num_heads is not None and num_heads != heads_from_rotary:
      raise ValueError(f'num_heads={num_heads} but {r.prefix}rotary_emb.inv_freq implies '
                       f'{heads_from_rotary}.')
    num_heads = heads_from_rotary
  if num_heads is None:
    raise ValueError('the state dict has no rotary_emb.inv_freq; pass --num_heads.')
  if h % num_heads:
    raise ValueError(f'hidden size {h} is not divisible by num_heads={num_heads}.')
  return num_heads


def dit_layers(r: StateReader, dims: Mapping[str, int], out: str = ''
               ) -> dict[str, Any]:
  """sigma_map, blocks.i and output_layer of an MDLM-style DiT -> {out}sigma_map,
  {out}blocks_i, {out}output_layer (dims: vocab_size, hidden_size, cond_dim, mlp_dim, num_heads;
  the key map: `convert_state_dict`)."""
  v, h, c, mlp, nh = (dims[k] for k in ('vocab_size', 'hidden_size', 'cond_dim', 'mlp_dim',
                                        'num_heads'))
  hd = h // nh
  params: dict[str, Any] = {f'{out}sigma_map': {'mlp_0': r.linear('sigma_map.mlp.0', 256, c),
                                                'mlp_2': r.linear('sigma_map.mlp.2', c, c)}}
  for i in r.block_indices():
    p = f'blocks.{i}'
    params[f'{out}blocks_{i}'] = {
        'norm1': {'weight': r.take(f'{p}.norm1.weight', (h,))},
        'attn_qkv': {'kernel': r.take(f'{p}.attn_qkv.weight', (3 * h, h)).T.reshape(h, 3, nh, hd)},
        'attn_out': {'kernel': r.take(f'{p}.attn_out.weight', (h, h)).T.reshape(nh, hd, h)},
        'norm2': {'weight': r.take(f'{p}.norm2.weight', (h,))},
        'mlp_0': r.linear(f'{p}.mlp.0', h, mlp),
        'mlp_2': r.linear(f'{p}.mlp.2', mlp, h),
        'adaLN_modulation': r.linear(f'{p}.adaLN_modulation', c, 6 * h),
    }
  params[f'{out}output_layer'] = {
      'norm_final': {'weight': r.take('output_layer.norm_final.weight', (h,))},
      'adaLN_modulation': r.linear('output_layer.adaLN_modulation', c, 2 * h),
      'linear': r.linear('output_layer.linear', h, v),
  }
  return params


def convert_state_dict(state: Mapping[str, np.ndarray], *,
                       num_heads: int | None = None) -> tuple[dict[str, Any], dict[str, int]]:
  """MDLM DiT state dict -> (Flax params tree of the MDLM part, dims).

  Key map (torch nn.Linear weight is [out, in]; our kernels are [in, out]; H width, C cond width,
  nh heads, hd = H / nh, M MLP width, V vocabulary):
    vocab_embed.embedding [V, H]            -> vocab_embed/embedding [V, H]
    sigma_map.mlp.{0,2}.{weight,bias}       -> sigma_map/mlp_{0,2}/{kernel (ᵀ), bias}
    blocks.i.norm{1,2}.weight [H]           -> blocks_i/norm{1,2}/weight
    blocks.i.attn_qkv.weight [3H, H]        -> blocks_i/attn_qkv/kernel [H, 3, nh, hd]
          (MDLM splits the output as 'b s (three h d)')
    blocks.i.attn_out.weight [H, H]         -> blocks_i/attn_out/kernel [nh, hd, H]
    blocks.i.mlp.{0,2}.{weight,bias}        -> blocks_i/mlp_{0,2}/{kernel (ᵀ), bias}
    blocks.i.adaLN_modulation.{weight,bias} -> blocks_i/adaLN_modulation/{kernel (ᵀ), bias}
    output_layer.{norm_final,linear,adaLN_modulation} -> output_layer/... (same rule)
    rotary_emb.inv_freq [hd/2]              -> not a parameter; gives nh and is checked to be
                                               base 1e4 (our rotary embedding's)

  Args:
    state: torch-named tensors (numpy), with or without a common prefix such as 'backbone.'.
    num_heads: number of attention heads; read from rotary_emb.inv_freq when None.

  Returns:
    (params, dims) with dims = {vocab_size, hidden_size, cond_dim, mlp_dim, num_layers, num_heads}.
    Raises ValueError on missing, unexpected or mis-shaped keys.
  """
  if any(k.endswith('vocab_embed.0.weight') for k in state):  # ADLM's denoiser input map
    raise ValueError('this is an ADLM checkpoint (a denoiser beside the DiT); convert it with '
                     'python -m hmdlm_jax.convert_adlm.')
  r = StateReader(state, _prefix(state), 'MDLM')
  emb = r.take('vocab_embed.embedding')
  v, h = emb.shape
  dims = {'vocab_size': v, 'hidden_size': h, 'cond_dim': r.take('sigma_map.mlp.0.weight').shape[0],
          'mlp_dim': r.take('blocks.0.mlp.0.weight').shape[0],
          'num_layers': len(r.block_indices()), 'num_heads': rotary_heads(r, h, num_heads)}
  params = {'vocab_embed': {'embedding': emb}, **dit_layers(r, dims)}
  if r.unused():
    raise ValueError(f'MDLM state dict has keys the DiT conversion does not know: '
                     f'{r.unused()[:8]}.')
  return as_float32(params), dims


def as_float32(tree: Any) -> Any:
  """A nested dict of arrays as contiguous float32 numpy (what `save_params` writes)."""
  if isinstance(tree, Mapping):
    return {k: as_float32(v) for k, v in tree.items()}
  return np.ascontiguousarray(tree, np.float32)


# ----------------------------------------------------------------------------- files


def flatten(tree: Mapping[str, Any], prefix: str = '') -> dict[str, np.ndarray]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, Mapping):
      out.update(flatten(v, f'{prefix}{k}/'))
    else:
      out[f'{prefix}{k}'] = np.asarray(v)
  return out


def unflatten(flat: Mapping[str, np.ndarray]) -> dict[str, Any]:
  tree: dict[str, Any] = {}
  for path, v in flat.items():
    node = tree
    *parents, leaf = path.split('/')
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = np.asarray(v)
  return tree


def save_params(path: str | pathlib.Path, params: Mapping[str, Any]) -> None:
  """Writes a params tree as a `.npz` of '/'-joined paths."""
  with open(path, 'wb') as f:
    np.savez(f, **flatten(params))


def load_params(path: str | pathlib.Path) -> dict[str, Any]:
  """Reads `save_params`' `.npz` back into a nested dict of numpy arrays."""
  try:
    with storage.open_file(os.fspath(path), 'rb') as f, np.load(f, allow_pickle=False) as z:
      return unflatten({k: z[k] for k in z.files})
  except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
    raise ValueError(f'{path}: not a parameter file written by hmdlm_jax.convert_mdlm '
                     f'({type(e).__name__}: {e}); convert the MDLM checkpoint again.') from e


def _local(path: str | pathlib.Path) -> str:
  """`path`, or the local copy of a Hub file (hf://ORG/NAME[/FILE], hmdlm_jax/hub.py)."""
  path = os.fspath(path)
  return hub.download(path) if hub.is_ref(path) else path


def load_pretrained(path: str | pathlib.Path, *, use_ema: bool = False,
                    allow_pickle: bool = False) -> dict[str, Any]:
  """A converted `.npz` (a local path or URL), or a local MDLM safetensors / .ckpt converted on
  the fly; either may be a Hub file (hf://ORG/NAME[/FILE])."""
  path = _local(path)
  if path.endswith('.npz'):
    if not storage.isfile(path):
      raise ValueError(f'init.mdlm_checkpoint={path!r} does not exist.')
    return load_params(path)
  state = load_mdlm_state_dict(path, use_ema=use_ema, allow_pickle=allow_pickle)
  return convert_state_dict(state)[0]


def check_shapes(model: Mapping[str, tuple[int, ...]], pretrained: Mapping[str, tuple[int, ...]],
                 fresh: Sequence[str] = HMDLM_ONLY) -> None:
  """Raises ValueError unless `pretrained` fits `model` ('/'-joined path -> shape, both).

  Top-level entries named in `fresh` (HMDLM's level table and heads) must be absent from
  `pretrained`; every other model leaf must be provided with its shape.
  """
  is_fresh = lambda k: k.split('/')[0] in fresh  # pylint: disable=unnecessary-lambda-assignment
  extra = sorted(k for k in pretrained if k not in model or is_fresh(k))
  if extra:
    raise ValueError(f'pretrained parameters not in the model (or HMDLM-only): {extra[:8]}.')
  missing = sorted(k for k in model if k not in pretrained and not is_fresh(k))
  if missing:
    raise ValueError(f'the model has parameters the checkpoint lacks: {missing[:8]} (is '
                     'config.model the MDLM DiT of the checkpoint?).')
  for k, shape in model.items():
    if k in pretrained and tuple(pretrained[k]) != tuple(shape):
      raise ValueError(f'{k}: checkpoint shape {tuple(pretrained[k])} != model shape '
                       f'{tuple(shape)} (check config.model.vocab_size / hidden_size / num_heads / '
                       'mlp_dim).')


def pretrained_shapes(path: str | pathlib.Path) -> dict[str, tuple[int, ...]]:
  """'/'-joined path -> shape of what `load_pretrained(path)` gives, read cheaply when possible.

  A converted `.npz` is checked whole (zip CRCs) and its array headers are read, no array is
  loaded; other files are converted (as `load_pretrained` does). Raises ValueError naming the file.
  """
  path = _local(path)
  if not path.endswith('.npz'):
    return {k: tuple(v.shape) for k, v in flatten(load_pretrained(path)).items()}
  try:
    with storage.open_file(path, 'rb') as raw, zipfile.ZipFile(raw) as z:
      bad = z.testzip()
      if bad is not None:
        raise ValueError(f'member {bad} fails its CRC check')
      shapes = {}
      for name in z.namelist():
        with z.open(name) as f:
          version = np.lib.format.read_magic(f)
          read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                  else np.lib.format.read_array_header_2_0)
          shapes[name[:-len('.npy')] if name.endswith('.npy') else name] = tuple(read(f)[0])
      return shapes
  except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
    raise ValueError(f'{path}: not a parameter file written by hmdlm_jax.convert_mdlm '
                     f'({type(e).__name__}: {e}); convert the MDLM checkpoint again.') from e


def merge_pretrained(params: Mapping[str, Any], pretrained: Mapping[str, Any],
                     fresh: Sequence[str] = HMDLM_ONLY) -> dict[str, Any]:
  """`params` with every leaf of `pretrained` copied in (`check_shapes` first).

  Entries named in `fresh` keep their values from `params`. Returns a new tree; leaves keep the
  dtype of `params`.
  """
  flat_p = flatten(params)
  flat_q = flatten(pretrained)
  check_shapes({k: v.shape for k, v in flat_p.items()}, {k: v.shape for k, v in flat_q.items()},
               fresh)
  merged = {k: np.asarray(flat_q[k], dtype=v.dtype) if k in flat_q else np.asarray(v)
            for k, v in flat_p.items()}
  return unflatten(merged)


def init_from_mdlm(params: Mapping[str, Any], path: str) -> dict[str, Any]:
  """Fresh model params -> MDLM backbone weights from `path` (config `init.mdlm_checkpoint`).

  The level table and hierarchy head (and the single-pass token-level table) keep `params`'
  values. Returns numpy arrays; put them on devices with the state's shardings.
  """
  return merge_pretrained(params, load_pretrained(path))


def check_destination(dst: str) -> pathlib.Path:
  """The output path, checked before any reading: its folder exists and is writable."""
  out = pathlib.Path(dst)
  if out.is_dir():
    raise ValueError(f'--dst={dst} is a directory; give a file name such as mdlm_owt.npz.')
  if out.suffix != '.npz':
    raise ValueError(f'--dst={dst} must end in .npz (the converted parameters).')
  folder = out.parent if str(out.parent) else pathlib.Path('.')
  if not folder.is_dir():
    raise ValueError(f'--dst={dst}: the folder {folder} does not exist; create it first.')
  if not os.access(folder, os.W_OK):
    raise ValueError(f'--dst={dst}: the folder {folder} is not writable.')
  return out


def write_params(out: pathlib.Path, params: Mapping[str, Any]) -> int:
  """Writes `params` to `out` atomically (an existing file is replaced only by a complete one, a
  failed write such as a full disk leaves nothing behind); returns the parameter count."""
  tmp = out.with_name(out.name + '.tmp')
  try:
    save_params(tmp, params)
    os.replace(tmp, out)
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise
  return sum(x.size for x in flatten(params).values())


def convert(src: str, dst: str, *, use_ema: bool = False, num_heads: int | None = None,
            allow_pickle: bool = False) -> str:
  """Converts `src` into `dst` (validated first, written atomically); returns a summary line."""
  out = check_destination(dst)
  if hub.is_ref(src):
    try:
      src = hub.download(src)
    except ValueError as e:
      raise ValueError(f'--src={src}: {e}') from None
  if not pathlib.Path(src).is_file():
    raise ValueError(f'--src={src}: no such file; give the MDLM model.safetensors (Hugging Face '
                     'kuleshov-group/mdlm-owt) or a Lightning .ckpt.')
  state = load_mdlm_state_dict(src, use_ema=use_ema, allow_pickle=allow_pickle)
  params, dims = convert_state_dict(state, num_heads=num_heads)
  n = write_params(out, params)
  return (f'{src} -> {dst}: {n:,} parameters; set config.model to {dims} '
          '(and config.model.time_conditioning as the checkpoint was trained).')


def cli(convert_fn: Any, doc: str, src_help: str, argv: Sequence[str] | None) -> None:
  """The converters' command line: `convert_fn(src, dst, use_ema=, num_heads=, allow_pickle=)`'s
  summary line, or one `hmdlm_jax: error:` line and exit status 1."""
  parser = argparse.ArgumentParser(description=doc.split('\n')[0])
  parser.add_argument('--src', required=True, help=src_help)
  parser.add_argument('--dst', required=True, help='output .npz')
  parser.add_argument('--use_ema', action='store_true', help='EMA weights of a Lightning .ckpt')
  parser.add_argument('--num_heads', type=int, default=None,
                      help='attention heads (default: from rotary_emb.inv_freq)')
  parser.add_argument('--allow_pickle', action='store_true',
                      help='torch.load with weights_only=False (trusted files only)')
  args = parser.parse_args(argv)
  try:
    print(convert_fn(args.src, args.dst, use_ema=args.use_ema, num_heads=args.num_heads,
                     allow_pickle=args.allow_pickle))
  except (ValueError, OSError) as e:
    print(f'hmdlm_jax: error: {" ".join(str(e).split())}', file=sys.stderr, flush=True)
    sys.exit(1)


def main(argv: Sequence[str] | None = None) -> None:
  cli(convert, __doc__, 'MDLM .safetensors or Lightning .ckpt, or hf://ORG/NAME[/FILE]', argv)


if __name__ == '__main__':
  main()
