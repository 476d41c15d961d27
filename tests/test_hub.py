"""The Hugging Face Hub switch (hmdlm_jax/hub.py), offline: a fake Hub cache, never the network.

The test builds a cache in huggingface_hub's layout (models--ORG--NAME/refs/main naming a
snapshot, models--ORG--NAME/snapshots/REV/<files>) holding a tiny GPT-2 (the gen-PPL scorer) and a
tiny MDLM release (model.safetensors, keys under 'backbone.'), and runs one child Python with
HF_HUB_CACHE / HF_HOME pointing at it and HF_HUB_OFFLINE=1: huggingface_hub reads those variables
when it is imported, so a child process is the only faithful way to set them.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import REPO

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
safetensors_torch = pytest.importorskip('safetensors.torch')

REV = '0123456789abcdef0123456789abcdef01234567'

CHILD = r'''
import json, os, sys
import numpy as np
from hmdlm_jax import convert_mdlm
from hmdlm_jax.evaluation import generative as gm

local_st = sys.argv[1]
out = {}
os.environ['HMDLM_HUB'] = '1'
scorer = gm.TransformersGPT2Scorer('tiny-org/tiny-gpt2')
out['gpt2_on'] = gm.gen_ppl_report(['a b c d', 'e f'], scorer=scorer)
got = convert_mdlm.flatten(convert_mdlm.load_pretrained('hf://tiny-org/tiny-mdlm'))
want = convert_mdlm.flatten(convert_mdlm.load_pretrained(local_st))
out['mdlm_same'] = (sorted(got) == sorted(want)
                    and all(np.array_equal(got[k], want[k]) for k in want))
out['mdlm_shapes'] = (convert_mdlm.pretrained_shapes('hf://tiny-org/tiny-mdlm/model.safetensors')
                      == {k: v.shape for k, v in want.items()})
try:
  convert_mdlm.load_pretrained('hf://tiny-org/absent-mdlm')
except ValueError as e:
  out['mdlm_absent_on'] = str(e)
del os.environ['HMDLM_HUB']
out['gpt2_off_cached'] = gm.gen_ppl_report(['a b'], model_name='tiny-org/tiny-gpt2')['gen_ppl']
out['gpt2_off_absent'] = gm.gen_ppl_report(['a b'], model_name='tiny-org/absent-gpt2')
try:
  convert_mdlm.load_pretrained('hf://tiny-org/absent-mdlm')
except ValueError as e:
  out['mdlm_absent_off'] = str(e)
print('RESULT', json.dumps(out))
'''


def _snapshot(cache: pathlib.Path, repo: str) -> pathlib.Path:
  root = cache / ('models--' + repo.replace('/', '--'))
  (root / 'refs').mkdir(parents=True)
  (root / 'refs' / 'main').write_text(REV)
  snap = root / 'snapshots' / REV
  snap.mkdir(parents=True)
  return snap


def _tiny_gpt2(path: pathlib.Path) -> None:
  tokenizers = pytest.importorskip('tokenizers')
  words = ['<eos>', 'a', 'b', 'c', 'd', 'e', 'f']
  tk = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                        unk_token='<eos>'))
  tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token='<eos>',
                                       bos_token='<eos>').save_pretrained(path)
  torch.manual_seed(0)
  transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=len(words), n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
      eos_token_id=0)).save_pretrained(path)


def test_hub_switch_resolves_from_a_local_hub_cache(tmp_path):
  from tests.test_convert_mdlm import make_reference  # pylint: disable=g-import-not-at-top
  cache = tmp_path / 'hub'
  _tiny_gpt2(_snapshot(cache, 'tiny-org/tiny-gpt2'))
  sd = {f'backbone.{k}': v.float().contiguous() for k, v in make_reference().state_dict().items()}
  local_st = tmp_path / 'model.safetensors'
  safetensors_torch.save_file(sd, str(local_st))
  (_snapshot(cache, 'tiny-org/tiny-mdlm') / 'model.safetensors').write_bytes(local_st.read_bytes())
  env = {k: v for k, v in os.environ.items() if not k.startswith(('HF_', 'HMDLM_HUB'))}
  env.update(HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / 'hf_home'), HF_HUB_OFFLINE='1',
             TRANSFORMERS_OFFLINE='1', PYTHONPATH=str(REPO), JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-c', CHILD, str(local_st)], env=env, cwd=tmp_path,
                        capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.split('RESULT ', 1)[1])
  # Hub on: GPT-2 and the MDLM release both resolve from the cache, the scorer says where it ran.
  on = out['gpt2_on']
  assert on['gen_ppl'] > 1.0 and on['gen_ppl_scorer'] == 'tiny-org/tiny-gpt2'
  assert on['gen_ppl_device'] == ('cuda' if torch.cuda.is_available() else 'cpu')
  assert out['mdlm_same'] and out['mdlm_shapes']
  assert 'model.safetensors of tiny-org/absent-mdlm could not be fetched from the Hugging Face' in (
      out['mdlm_absent_on']) and 'HF_HUB_OFFLINE' in out['mdlm_absent_on']
  # Hub off (the default): what is cached still loads, what is not is unavailable with a reason.
  assert out['gpt2_off_cached'] > 1.0
  off = out['gpt2_off_absent']
  assert off['gen_ppl'] is None
  assert "'tiny-org/absent-gpt2' is not available locally" in off['gen_ppl_unavailable_reason']
  assert 'set HMDLM_HUB=1' in off['gen_ppl_unavailable_reason']
  assert out['mdlm_absent_off'].startswith(
      'model.safetensors of tiny-org/absent-mdlm is not in the local Hugging Face cache; set '
      'HMDLM_HUB=1 to download it')


def test_hub_refs_and_the_switch(monkeypatch):
  from hmdlm_jax import hub  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv(hub.ENV, raising=False)
  assert not hub.enabled() and hub.local_files_only()  # offline is the default
  from hmdlm_jax.data import tokenizers  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv(tokenizers.ALLOW_DOWNLOAD_ENV, raising=False)
  assert not tokenizers._allow_download(None)  # pylint: disable=protected-access
  monkeypatch.setenv(hub.ENV, '1')
  assert hub.enabled() and not hub.local_files_only()
  assert tokenizers._allow_download(None)  # one switch for every Hub download
  assert hub.is_ref('hf://kuleshov-group/mdlm-owt') and not hub.is_ref('/tmp/model.safetensors')
  with pytest.raises(ValueError, match='write hf://ORG/NAME'):
    hub.download('hf://just-a-name')
