"""The Hugging Face Hub: off by default, on with the environment variable HMDLM_HUB=1.

Off (the default, and what every test runs): weights come from local files and the local Hugging
Face cache only (`local_files_only=True`), so nothing is ever downloaded. On: `hf://ORG/NAME[/FILE]`
checkpoints (init.mdlm_checkpoint, convert_mdlm --src; FILE defaults to model.safetensors, MDLM-OWT
is hf://kuleshov-group/mdlm-owt), the generative-perplexity scorer (eval.gen_ppl_model) and Hub
tokenizers (data.tokenizer) are fetched into that cache where the network allows;
huggingface_hub's own HF_HUB_OFFLINE=1 / HF_HUB_CACHE still apply. An environment variable rather
than a config field: the converter's command line, warm starts and evaluation read the same
switch, and network access is a property of where a run goes, not of the experiment (config.json
stays the same on both).
"""

from __future__ import annotations

import os

ENV = 'HMDLM_HUB'
PREFIX = 'hf://'
DEFAULT_FILE = 'model.safetensors'


def enabled() -> bool:
  """Whether downloads from the Hub are allowed (HMDLM_HUB=1)."""
  return os.environ.get(ENV, '') == '1'


def local_files_only() -> bool:
  """`from_pretrained(..., local_files_only=...)`: True unless the Hub is enabled."""
  return not enabled()


def how_to_enable() -> str:
  return f'set {ENV}=1 to download it from the Hugging Face Hub where the network allows'


def is_ref(path: str) -> bool:
  """Whether `path` names a file on the Hub (hf://ORG/NAME[/FILE])."""
  return str(path).startswith(PREFIX)


def download(ref: str) -> str:
  """The local path of hf://ORG/NAME[/FILE] (the Hugging Face cache), fetched when enabled.

  Raises ValueError naming `ref` and what to do when it is neither cached nor downloadable.
  """
  parts = ref[len(PREFIX):].strip('/').split('/')
  if len(parts) < 2 or not all(parts):
    raise ValueError(f'{ref!r} is not a Hub file: write hf://ORG/NAME or hf://ORG/NAME/FILE.')
  repo, filename = '/'.join(parts[:2]), '/'.join(parts[2:]) or DEFAULT_FILE
  import huggingface_hub  # pylint: disable=g-import-not-at-top  (only Hub references need it)
  from huggingface_hub import errors  # pylint: disable=g-import-not-at-top
  try:
    return huggingface_hub.hf_hub_download(repo, filename, local_files_only=local_files_only())
  except (OSError, ValueError, errors.EntryNotFoundError) as e:
    if not enabled():
      raise ValueError(f'{filename} of {repo} is not in the local Hugging Face cache; '
                       f'{how_to_enable()} (or give a local file).') from e
    first = (str(e).splitlines() or [''])[0][:120]
    raise ValueError(f'{filename} of {repo} could not be fetched from the Hugging Face Hub '
                     f'({type(e).__name__}: {first}); check the name, the network and '
                     'HF_HUB_OFFLINE.') from e
