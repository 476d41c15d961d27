"""The ADLM authors' Lightning checkpoints -> our ADLM parameters (docs/method.md §13.4).

The authors' `Diffusion` module holds the anchor network y_φ as `backbone` (MDLM's DIT: converted
by convert_mdlm's key map) and the denoiser x_ψ as `denoiser` (older files: `replica`): a dense
V -> H input map `vocab_embed.0` with bias, then MDLM's sigma_map, blocks and output layer, which
map onto models/anchor.py's 'denoiser_*' parameters (`convert_state_dict` lists the keys). Every
source key is converted or named in IGNORED; anything else, and any setting our network cannot
reproduce, is an error. Output: a `.npz` as convert_mdlm writes it, read by `init.adlm_checkpoint`
(`init_from_adlm`; the `.ckpt` itself is not: it needs --allow_pickle and the choice of --use_ema).

CLI: python -m hmdlm_jax.convert_adlm --src=adlm-medium.ckpt --dst=adlm_owt.npz [--use_ema]
     [--allow_pickle] [--num_heads=12]    (the release pickles its config: --allow_pickle)
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hmdlm_jax import convert_mdlm

ANCHOR = 'backbone.'
# The authors' load_state_dict renames an older file's 'replica.' to 'denoiser.'.
DENOISERS = ('denoiser.', 'replica.')
# torchmetrics states of the Lightning module: running means, no weights (and normally not saved).
IGNORED = ('train_metrics.', 'valid_metrics.', 'test_metrics.', 'gen_ppl_metric.')
# Their hyper-parameters our network must share: SUBS is how processes/ read the 'token' logits;
# our time embedding is fed t (or 0), theirs σ(t) (or 0), so only time_conditioning=False matches.
REQUIRED = (('parameterization', 'subs'), ('time_conditioning', False), ('backbone', 'dit'))


def _get(node: Any, key: str) -> Any:
  """`node[key]` of a dict or an OmegaConf config, None when absent."""
  try:
    return node.get(key) if hasattr(node, 'get') else getattr(node, key, None)
  except Exception:  # pylint: disable=broad-except  (a config missing a key may raise)
    return None


def check_hparams(ckpt: Mapping[str, Any], path: str | pathlib.Path) -> dict[str, Any]:
  """What the checkpoint's `hyper_parameters` say (config, tokenizer): refuses settings our
  network cannot reproduce (REQUIRED); returns {'mask_id': the tokenizer's [MASK] id or -1 (the
  appended last row, GPT-2)} when the tokenizer was saved, else {}."""
  hp = _get(ckpt, 'hyper_parameters')
  config = _get(hp, 'config') if hp is not None else None
  if config is not None:
    for field, want in REQUIRED:
      got = _get(config, field)
      if got is not None and got != want:
        raise ValueError(f'{path}: the checkpoint was trained with {field}={got!r}; our ADLM '
                         f'network reproduces {field}={want!r} only (docs/method.md §13.4).')
  tokenizer = _get(hp, 'tokenizer') if hp is not None else None
  if tokenizer is None:
    return {}
  mask = getattr(tokenizer, 'mask_token_id', None)
  return {'mask_id': -1 if mask is None else int(mask)}


def denoiser_prefix(state: Mapping[str, Any]) -> str:
  """'denoiser.' or 'replica.', after checking that every key is the anchor's, the denoiser's or
  IGNORED."""
  found = [p for p in DENOISERS if any(k.startswith(p) for k in state)]
  if not found:
    raise ValueError('the state dict has no denoiser.* keys: not an ADLM checkpoint (an MDLM one '
                     'converts with python -m hmdlm_jax.convert_mdlm).')
  if len(found) > 1:
    raise ValueError(f'the state dict has both {found[0]}* and {found[1]}* keys; expected one '
                     'denoiser.')
  other = sorted(k for k in state if not k.startswith((ANCHOR, found[0]) + IGNORED))
  if other:
    raise ValueError(f'ADLM state dict has keys outside {ANCHOR}* and {found[0]}*: {other[:8]}.')
  return found[0]


def read_ckpt(path: str | pathlib.Path, *, use_ema: bool = False, allow_pickle: bool = False
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """(state dict as float32 numpy, `check_hparams`' notes) of an ADLM Lightning `.ckpt`.

  With `use_ema` the weights are the EMA's: `ema.shadow_params` lists the parameters of
  `backbone`, the noise schedule (none: the log-linear one has no parameter) and the denoiser, in
  that order, each module's in registration order.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise ValueError(f'ADLM checkpoint {path} does not exist.')
  if path.suffix not in ('.ckpt', '.pt', '.pth'):
    raise ValueError(f'{path}: expected the authors\' Lightning .ckpt, got {path.suffix!r}.')
  ckpt = convert_mdlm.torch_load(path, allow_pickle=allow_pickle)
  notes = check_hparams(ckpt, path)
  prefix = denoiser_prefix(ckpt['state_dict'])
  state = convert_mdlm.lightning_state(ckpt, path, use_ema=use_ema, ema_modules=(ANCHOR, prefix))
  return state, notes


def convert_state_dict(state: Mapping[str, np.ndarray], *, num_heads: int | None = None
                       ) -> tuple[dict[str, Any], dict[str, int]]:
  """ADLM state dict -> (params of our ADLM model, dims).

  Key map (torch Linear weight [out, in] -> kernel [in, out]; D = 'denoiser.' or 'replica.'):
    backbone.*                         -> the anchor network: convert_mdlm's DiT map, unchanged
    D.vocab_embed.0.{weight [H, V], bias [H]} -> denoiser_in/{kernel [V, H], bias [H]}
    D.sigma_map.*, D.blocks.i.*, D.output_layer.* -> denoiser_sigma_map, denoiser_blocks_i,
                                          denoiser_output_layer (the DiT map)
    D.rotary_emb.inv_freq              -> checked: base 1e4, the anchor's head count
  Our denoiser shares V, H, the cond width, the MLP width and the head count with the anchor
  network (models/anchor.py), as the authors' does; a file where they differ is refused.

  Returns:
    (params, dims): dims = convert_mdlm's {vocab_size, hidden_size, cond_dim, mlp_dim, num_layers,
    num_heads} of the anchor network plus denoiser_layers.
  """
  prefix = denoiser_prefix(state)
  anchor, dims = convert_mdlm.convert_state_dict(
      {k: v for k, v in state.items() if k.startswith(ANCHOR)}, num_heads=num_heads)
  r = convert_mdlm.StateReader(state, prefix, 'ADLM denoiser')
  v, h = dims['vocab_size'], dims['hidden_size']
  w = r.take('vocab_embed.0.weight')
  widths = {'input map [H, V]': (w.shape, (h, v)),
            'cond width': (r.take('sigma_map.mlp.0.weight').shape[0], dims['cond_dim']),
            'MLP width': (r.take('blocks.0.mlp.0.weight').shape[0], dims['mlp_dim'])}
  for what, (got, want) in widths.items():
    if got != want:
      raise ValueError(f'the denoiser\'s {what} is {got} but the anchor network\'s gives {want}; '
                       'our denoiser shares V, H, cond and MLP widths with it (models/anchor.py).')
  convert_mdlm.rotary_heads(r, h, dims['num_heads'])
  den = {'denoiser_in': r.linear('vocab_embed.0', v, h),
         **convert_mdlm.dit_layers(r, dims, out='denoiser_')}
  if r.unused():
    raise ValueError(f'ADLM denoiser has keys the conversion does not know: {r.unused()[:8]}.')
  dims = dict(dims, denoiser_layers=len(r.block_indices()))
  return {**anchor, **convert_mdlm.as_float32(den)}, dims


def init_from_adlm(params: Mapping[str, Any], path: str) -> dict[str, Any]:
  """Fresh model params -> every leaf from the converted `.npz` at `path` (config
  `init.adlm_checkpoint`): it must fill the model's tree exactly, anchor network and denoiser (no
  leaf stays fresh)."""
  return convert_mdlm.merge_pretrained(params, convert_mdlm.load_params(path), fresh=())


def convert(src: str, dst: str, *, use_ema: bool = False, num_heads: int | None = None,
            allow_pickle: bool = False) -> str:
  """Converts `src` into `dst` (validated first, written atomically); returns a summary line."""
  out = convert_mdlm.check_destination(dst)
  if not pathlib.Path(src).is_file():
    raise ValueError(f'--src={src}: no such file; give the authors\' Lightning checkpoint '
                     '(adlm-medium.ckpt / adlm-large.ckpt).')
  state, notes = read_ckpt(src, use_ema=use_ema, allow_pickle=allow_pickle)
  params, dims = convert_state_dict(state, num_heads=num_heads)
  n = convert_mdlm.write_params(out, params)
  model = {k: v for k, v in dims.items() if k != 'denoiser_layers'}
  mask = (f'model.mask_id={notes["mask_id"]}' if 'mask_id' in notes else
          'model.mask_id to the tokenizer\'s [MASK] (-1: the appended last row, GPT-2)')
  return (f'{src} -> {dst}: {n:,} parameters ({"EMA" if use_ema else "raw"} weights); set '
          f'config.model to {model}, {mask}, model.time_conditioning=False, '
          f'process.adlm.denoiser_layers={dims["denoiser_layers"]} (configs/adlm_owt.py has '
          'them), then --config.init.adlm_checkpoint=' + dst)


def main(argv: Sequence[str] | None = None) -> None:
  convert_mdlm.cli(convert, __doc__, "the authors' Lightning .ckpt", argv)


if __name__ == '__main__':
  main()
