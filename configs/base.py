"""The config schema every experiment file fills in (ml_collections).

Experiment files (`configs/sudoku.py`, `configs/lm1b.py`, ...) call `get_base_config()` and override
fields; this file lists every field that any code reads, so experiment files never add fields.
Unknown keys given with `--config.a.b=...` are rejected by ml_collections itself; values are
validated before anything is written (hmdlm_jax/config.py resolves and checks the config once).
"""

from __future__ import annotations

import ml_collections


def get_base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  # The forward process (hmdlm_jax/processes): 'hmdlm' | 'mdlm' (= 'hmdlm' with num_levels=1) |
  # 'hdlm' (word -> cluster -> MASK, docs/method.md §13.1) | 'multimdm' (§13.2).
  c.process = p = ml_collections.ConfigDict()
  p.kind = 'hmdlm'
  # HDLM (process.kind='hdlm'; needs model.num_levels=1). The token table is words, MASK, then
  # the num_clusters cluster tokens as its LAST rows: model.vocab_size = words + 1 + num_clusters
  # (one cluster is identified with MASK: vocab_size = words + 1, exactly MDLM for gamma = 1).
  p.hdlm = h = ml_collections.ConfigDict()
  h.num_clusters = 64  # n; the paper's best are 64-128 for GPT-2's 50k tokens
  h.gamma = 1.0  # α_t = (1 - t)^γ (γ = 1: the paper's OWT runs)
  h.eps = 1e-4  # time floor: the process runs on τ = (1 - eps) t, so α(1) = eps^γ
  h.xi = 1.0  # stochastic perturbation: own cluster w.p. ξ, each other w.p. (1-ξ)/(n-1)
  h.clusters = ''  # token -> cluster .npz (python -m hmdlm_jax.data.clusters); '' = fallback
  h.fallback = 'id'  # without `clusters`: 'id' (contiguous id blocks) | 'error'
  h.force = 'auto'  # cluster positions: 'auto' (within for ξ = 1, between for ξ < 1) | 'within'
  #                   | 'between' | 'none'
  h.xi_loss = 'elbo'  # ξ < 1 training loss: 'elbo' (exact) | 'approx' (the authors' simplified)
  h.hard_training = False  # ablation: word CE instead of cluster CE at MASK positions
  h.clip_weights = False  # training only: clip w_m, w_c to [weight_min, weight_max]
  h.weight_min = 0.0  # (γ = 1 with weight_max = 2: both weights are always 2)
  h.weight_max = 2.0
  h.sampler = 'first_order'  # 'first_order' (the authors' jumps) | 'posterior' (exact posterior)
  h.final_step = 'argmax'  # last reverse step: 'argmax' (the authors') | 'sample'
  h.cluster_draw = 'clean'  # MASK -> cluster from 'clean' P_θ (authors') | 'perturbed' Q_θ (ξ < 1)
  #                           | 'aux' the auxiliary cluster head (needs aux_weight > 0)
  h.aux_weight = 0.0  # > 0: an auxiliary cluster head [B, L, n] trained by this weight × its
  #                     cross-entropy at MASK positions (the authors' option; off in every config)
  # MultiMDM (process.kind='multimdm'; model.num_levels=1). Ids: words 0..V-1, masks V..V+M-1 with
  # V = model.vocab_size - num_masks; model.mask_id must be one of the mask ids (-1: the last).
  p.multimdm = mm = ml_collections.ConfigDict()
  mm.num_masks = 50  # M (the paper's LM1B/OWT value); M = 1 is MDLM
  mm.designated = 'mod'  # m_x = x mod M, or a .npy / .txt file of V ints in [0, M) (e.g. clusters)
  mm.alpha = 'linear'  # α_t: 'linear' (1 - t) | 'power' ((1 - t)^p) | 'cosine'
  mm.alpha_power = 1.0
  mm.beta = 'linear'  # β_t: the same curves or 'alpha_power' (β = α^ρ, ρ = beta_power)
  mm.beta_power = 1.0
  # Curriculum: weight of the identification term (3.6) = 0 before curriculum_start, then a linear
  # ramp to 1 over curriculum_steps optimiser steps (0 = full weight from curriculum_start).
  mm.curriculum_start = 0
  mm.curriculum_steps = 0
  # Consistency distillation (Algorithm 3): the loss becomes (3.11) against the EMA network.
  mm.distill = False
  mm.distill_kl = 'reverse'  # 'reverse' KL(f_t || f̄_s) (App. C.2, the paper's runs) | 'forward' (3.11)
  # Step size δ_k = min(delta_init · 2^floor(k / delta_double_every), delta_max) (App. C.2).
  mm.delta_init = 2.0 ** -9
  mm.delta_double_every = 10_000
  mm.delta_max = 2.0 ** -5

  # Model (docs/method.md §4). vocab_size counts the MASK row; mask_id = vocab_size - 1 when -1.
  c.model = m = ml_collections.ConfigDict()
  m.backbone = 'dit'  # 'dit' | 'gpt2'
  m.num_levels = 2  # K; 1 = MDLM
  m.vocab_size = 30523
  m.mask_id = -1
  m.extra_vocab_rows = 0  # derived by hmdlm_jax/config.py: rows after MASK (HDLM's clusters)
  m.cluster_head = 0  # derived: outputs of HDLM's auxiliary cluster head (process.hdlm.aux_weight)
  m.seq_len = 128
  m.num_layers = 12
  m.hidden_size = 768
  m.num_heads = 12
  m.mlp_dim = 3072
  m.cond_dim = 128
  m.dropout = 0.1
  m.time_conditioning = False
  m.variant = 'two_pass'  # 'two_pass' (paper) | 'single_pass' (docs/method.md §4)
  m.prior_corrected_head = True
  m.position_embedding = 'rotary'  # 'rotary' | 'learned' | 'sudoku' (row/col/box + rotary-free)
  m.tie_embeddings = False
  # True: L_hier / L_cons train the hierarchy head only, on detached backbone features (the
  # backbone learns from L_LM alone; pass 1 then has no backward through the backbone).
  m.hier_stop_gradient = False
  # The hierarchy pathway between the backbone's features and the level head (docs/method.md
  # §4.7); the defaults build exactly the paper's head (same parameter tree). All its parameters
  # are named 'hier_*' and only the hierarchy terms train them.
  m.hier_layers = 0  # N blocks of the backbone's own kind (the hierarchy trunk); 0 = none
  m.hier_repeats = 1  # apply the N blocks R times with tied weights (R > 1: recurrent, RRN-style)
  m.hier_time_conditioning = False  # the pathway reads its own embedding of t
  m.hier_input_embed = False  # the pathway adds its own table of input states (level, h_m, h_g)
  # 'head': the backbone's level head on the pathway's output; 'rounds': one hazard readout per
  # repeat, levels by stick-breaking (needs hier_repeats = num_levels - 1; models/pathway.py).
  m.hier_readout = 'head'
  m.hier_width = 0  # width of the trunk's blocks (0 = hidden_size); narrower = cheaper pass 1
  m.hier_num_heads = 0  # attention heads of the trunk's blocks (0 = num_heads); fewer = cheaper
  # What the pathway reads: 'features' (the backbone's final hidden state, the paper) | 'input'
  # (the embedded input before the backbone's blocks: a level network of its own beside it).
  m.hier_source = 'features'
  # Given cells (Sudoku clues, prompts) carry their own input state h_g = K+1 instead of their
  # level: the level tables get a (K+2)-th row (docs/design.md). False: givens show their level.
  m.given_state = False
  # Sudoku only: add each cell's candidate digits, candidate count and hidden singles, computed
  # from the revealed digits of the input grid, through zero-init projections (to the input and,
  # with hier_input_embed, to the hierarchy pathway; tasks/sudoku_model.py).
  m.sudoku_candidates = False
  # True: those features feed the hierarchy pathway only (needs hier_input_embed); the token
  # network, and so an MDLM twin, never sees them.
  m.candidates_pathway_only = False
  m.hier_round_tokens = False  # derived: loss.beta_rounds > 0 (a token head on each round)
  m.dtype = 'float32'  # compute dtype: 'float32' | 'bfloat16'; parameters stay float32

  # Per-level schedule (docs/method.md §2).
  c.schedule = s = ml_collections.ConfigDict()
  s.kind = 'loglinear'  # 'loglinear' | 'power'
  s.offsets = (0.0, 0.25)  # δ_k, loglinear only
  s.exponents = (1.0, 2.0)  # ω_k, power only
  s.eps = 1e-3
  s.check_ordering = 'error'  # 'error' | 'warn' | 'off', checked on the sampling grid
  # >= 0: derive the offsets from K (hmdlm_jax/config.py): δ_k = offsets_max·k/(K-1), δ=(0,) for
  # K=1, so --config.model.num_levels=1 alone gives the MDLM twin; -1 = use `offsets` as given.
  s.offsets_max = -1.0

  # Loss (docs/method.md §3, §5).
  c.loss = l = ml_collections.ConfigDict()
  l.beta_hier = 1.0
  l.beta_cons = 1.0
  l.t_min = 1e-3
  l.antithetic = True
  # T_train of Algorithm 1: s = max(t - 1/T_train, 0); 0 = the sampling grid, sample.num_steps
  # (resolved in hmdlm_jax/config.py).
  l.train_steps_T = 0
  # What trains the hierarchy head (docs/method.md §5.1): 'bound' = β_hier L_hier + β_cons L_cons
  # (the bound's terms, λ'-weighted); 'cross_entropy' = β_hier × the mean −log g[h0] over the
  # masked loss positions (same optimum, no 1/(t − δ_k) tail). The bound's terms are reported
  # (and evaluated) either way.
  l.hier_objective = 'bound'
  # > 0: adds β_rounds × the per-round token loss (training only): with hier_readout='rounds',
  # repeat r of the hierarchy trunk reads the tokens of the masked positions whose level rounds
  # 1..r decide (level >= K - r), so each round learns what it should know (docs/method.md §5.1).
  l.beta_rounds = 0.0
  # Where the loss evaluates the token head (hmdlm_jax/models/token_head.py): 'selected' = only at
  # the masked loss positions (same values, about half the head's cost; one device only), 'all'
  # = dense logits at every position, 'auto' = 'selected' when the train step runs on one device.
  l.token_rows = 'auto'

  # Data; `kind` selects the task (hmdlm_jax/tasks): its pipeline, evaluation and sample mode.
  c.data = d = ml_collections.ConfigDict()
  d.kind = 'sudoku'
  d.batch_size = 64  # global batch
  d.eval_batch_size = 64
  d.train_path = ''
  d.test_path = ''
  d.cache_dir = ''
  d.num_workers = 0  # > 0: Grain worker processes
  d.read_threads = 1  # Grain read threads (num_workers = 0)
  d.prefetch_batches = 4
  d.augment = True  # Sudoku symmetries on the train split
  # Sudoku: generated puzzles (when train_path / test_path are empty), cached in cache_dir.
  d.num_train_puzzles = 20000
  d.num_test_puzzles = 2000
  d.gen_seed = 0
  d.min_givens = 17
  d.max_givens = 34
  d.gen_attempts = 8
  d.gen_processes = 1
  # Text kinds ('text', 'lm1b', 'wikihow').
  d.seq_len = 128  # tokens per row, BOS/EOS included; must equal model.seq_len
  d.tokenizer = ''  # HF name / directory / vocab.txt / 'offline:bert-base-uncased'
  d.tokenizer_allow_download = False
  d.mask_token = 'append'  # 'append' (a new last row) | 'tokenizer' (reuse its [MASK])
  d.hierarchy = 'none'  # 'none' | 'frequency' | 'position' (WikiHow); 'none' when num_levels=1
  d.tau = 1  # frequency rule: at most tau occurrences in the row -> level 1
  d.overlong = 'truncate'  # 'truncate' | 'drop' rows longer than seq_len
  d.text_unit = 'line'  # plain text: 'line' | 'paragraph' records
  d.test_fraction = 0.0  # plain text without test_path: hold out this share of the records
  d.tfds_data_dir = ''  # LM1B: a prepared TFDS data directory

  # Optimiser (docs/method.md §9).
  c.optim = o = ml_collections.ConfigDict()
  o.lr = 3e-4
  o.warmup_steps = 2500
  o.decay = 'constant'  # 'constant' | 'cosine'
  o.b1 = 0.9
  o.b2 = 0.999
  o.weight_decay = 0.0
  o.grad_clip = 1.0
  # > 0: the hierarchy-only parameters ('hier_*', models/hierarchy.py) are clipped to this global
  # norm as a group of their own, and `grad_clip` applies to the rest; 0 = one clip over all.
  o.hier_grad_clip = 0.0
  # The hierarchy-only parameters' learning rate is hier_lr_scale · lr (optim.scale_by_group).
  o.hier_lr_scale = 1.0
  o.eps = 1e-8  # Adam's ε
  o.decay_floor = 0.0  # cosine decay ends at decay_floor · lr (HDLM's OWT runs: 0.1)
  o.ema_decay = 0.9999
  o.ema_warmup = False  # True: decay min(ema_decay, (1+n)/(10+n)) at update n (short runs)

  # Training loop.
  c.train = t = ml_collections.ConfigDict()
  t.num_steps = 1000
  t.grad_accum = 1
  t.log_every = 50
  t.eval_every = 0  # 0 = only at the end
  t.ckpt_every = 500
  t.keep_last = 3
  t.keep_period = 0  # also keep every k-th step forever; 0 = off
  t.max_bad_steps = 10  # consecutive NaN/Inf steps before stopping
  t.time_budget_s = 0.0  # stop (and checkpoint) after this wall time; 0 = off
  t.final_eval = True  # evaluate once more after the last step
  t.async_checkpoint = True  # Orbax writes in the background (always waited for at exit)
  t.debug_nan_steps = ()  # fault injection: steps whose loss/grads are NaN (tests only)

  # Device mesh: product must equal the device count; -1 = all remaining devices.
  c.mesh = mesh = ml_collections.ConfigDict()
  mesh.data = -1
  mesh.fsdp = 1
  mesh.tensor = 1

  # Multi-host.
  c.distributed = dist = ml_collections.ConfigDict()
  dist.enabled = False
  dist.coordinator_address = ''
  dist.num_processes = 0
  dist.process_id = -1

  # Sampling (docs/method.md §7).
  c.sample = sm = ml_collections.ConfigDict()
  sm.num_steps = 128
  sm.temperature = 1.0
  sm.greedy = False
  sm.ordering = 'ancestral'  # 'ancestral' (Algorithm 2) | 'confidence'
  sm.use_cache = True
  sm.level_context = 'candidates'  # 'candidates' | 'none': levels pass 2 sees (confidence ordering)
  sm.hierarchy_weight = 1.0  # confidence score = w · log π + log max f (1: the ancestral move)
  sm.num_samples = 16
  sm.seeds = (0,)
  sm.pictures = True  # --mode=sample writes reveal-order pictures into DIR/pictures

  # Initialisation from a converted MDLM checkpoint (hmdlm_jax/convert_mdlm.py); '' = random init.
  c.init = ini = ml_collections.ConfigDict()
  ini.mdlm_checkpoint = ''
  # The MASK row of that checkpoint when a MultiMDM starts from it (-1 = its last row; LM1B: 103).
  ini.mdlm_mask_id = -1
  # Warm start from a run directory of this project (hmdlm_jax/warm_start.py): its latest
  # checkpoint's EMA (or raw) parameters; MDLM -> MultiMDM copies the MASK row into every mask row.
  ini.workdir = ''
  ini.use_ema = True

  # Evaluation; `kind` must be the task's: 'sudoku' (Sudoku) | 'perplexity' (text kinds).
  c.eval = e = ml_collections.ConfigDict()
  e.kind = 'sudoku'
  e.num_examples = 500
  e.use_ema = True
  e.time_seed = 1234
  e.num_t_samples = 1
  e.decodings = ('greedy', 'stochastic')  # Sudoku: decodings evaluated
  # Sudoku, K > 1 (tasks/sudoku_hierarchy.py): level accuracy of the head against the prior, and
  # the same checkpoint decoded (greedy, first seed) in each of these modes: 'head_ignored',
  # 'head_order', 'head_context', and the reference modes 'labeller_order', 'labeller_context'
  # (levels computed by the labeller from the givens instead of the head) and the diagnostic
  # 'labeller_order_at_<k>', k = 0..5 (the labeller's levels on level-k cells only). Off by
  # default: it adds one evaluation pass and one decoding per mode to every Sudoku evaluation.
  e.hierarchy_diagnostics = False
  e.hierarchy_decodings = ('head_ignored', 'head_order', 'labeller_order')
  # How each of those modes decodes (first sampling seed): a non-empty subset of eval.decodings'
  # kinds ('greedy', 'stochastic'); the modes' w and level context, the rest from `sample`.
  e.hierarchy_sampling = ('greedy',)
  e.num_samples = 0  # text: unconditional samples for generative metrics (0 = none)
  e.gen_ppl_model = 'gpt2-large'  # AR scorer of generative perplexity (local cache only)
  e.mauve_featurizer = 'gpt2-large'
  return c
