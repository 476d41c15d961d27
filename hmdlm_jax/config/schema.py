"""The config schema: one frozen dataclass per section, with the only defaults (docs/design.md).

`configs/base.py` turns `Config()` into the ml_collections ConfigDict that experiment files
override; `hmdlm_jax.config.resolve` turns an overridden ConfigDict back into a `Config` with the
derived fields computed. Field comments say what each field means; docs/method.md the why.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping

import ml_collections

from hmdlm_jax.config import kinds as config_kinds
from hmdlm_jax.config.adlm import ADLMSection
from hmdlm_jax.config.checks import check_bool as _check_bool
from hmdlm_jax.config.checks import check_int as _check_int
from hmdlm_jax.config.checks import check_number as _check_number
from hmdlm_jax.config.hdlm import HDLMSection
from hmdlm_jax.config.mgdm import MGDMSection
from hmdlm_jax.config.multimdm import MultiMDMSection
from hmdlm_jax.config.pathway import PathwayConfig
from hmdlm_jax.config.pathway import check_pathway

VARIANTS = ('two_pass', 'single_pass')
# What hmdlm_jax/models implements (tests/test_models.py checks the registries agree).
BACKBONES = ('dit', 'gpt2')
POSITION_EMBEDDINGS = ('rotary', 'learned', 'sudoku', 'sudoku_rel')
COMPUTE_DTYPES = ('float32', 'bfloat16')
REMAT_POLICIES = ('none', 'block', 'dots')  # models/dit.py REMAT_POLICIES (same keys, tested)
SUDOKU_CELLS = 81


@dataclasses.dataclass(frozen=True)
class ProcessSection:
  """`process`: The forward process (hmdlm_jax/processes): 'hmdlm' | 'mdlm' (= 'hmdlm' with
  num_levels=1) | 'hdlm' (word -> cluster -> MASK, docs/method.md §13.1) | 'multimdm' (§13.2)
  | 'mgdm' (MDLM trained by MGDM's token-reweighted loss, §13.3) | 'adlm' (anchored diffusion,
  §13.4)."""
  kind: str = 'hmdlm'
  hdlm: HDLMSection = dataclasses.field(default_factory=HDLMSection)
  multimdm: MultiMDMSection = dataclasses.field(default_factory=MultiMDMSection)
  mgdm: MGDMSection = dataclasses.field(default_factory=MGDMSection)
  adlm: ADLMSection = dataclasses.field(default_factory=ADLMSection)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """`model`: the network (docs/method.md §4), hashable (a static argument of jax.jit).

  vocab_size counts the MASK row; mask_id = vocab_size - 1 when -1 (resolved: never -1).
  """
  backbone: str = 'dit'  # 'dit' | 'gpt2'
  num_levels: int = 2  # K; 1 = MDLM
  vocab_size: int = 30523
  mask_id: int = -1
  extra_vocab_rows: int = 0  # derived (config/derive.py): rows after MASK (HDLM's clusters)
  cluster_head: int = 0  # derived: outputs of HDLM's auxiliary head (process.hdlm.aux_weight)
  denoiser_layers: int = 0  # derived: blocks of ADLM's denoiser (process.adlm.denoiser_layers)
  seq_len: int = 128
  num_layers: int = 12
  hidden_size: int = 768
  num_heads: int = 12
  mlp_dim: int = 3072
  cond_dim: int = 128
  dropout: float = 0.1
  time_conditioning: bool = False
  variant: str = 'two_pass'  # 'two_pass' (paper) | 'single_pass' (docs/method.md §4)
  prior_corrected_head: bool = True
  position_embedding: str = 'rotary'  # 'rotary' | 'learned' | 'sudoku' (row/col/box + rotary-free)
  tie_embeddings: bool = False
  # True: L_hier / L_cons train the hierarchy head only, on detached backbone features (the
  # backbone learns from L_LM alone; pass 1 then has no backward through the backbone).
  hier_stop_gradient: bool = False
  # The hierarchy pathway between the backbone's features and the level head (docs/method.md
  # §4.7, hmdlm_jax/config/pathway.py); the defaults build exactly the paper's head.
  pathway: PathwayConfig = dataclasses.field(default_factory=PathwayConfig)
  # Given cells (Sudoku clues, prompts) carry their own input state h_g = K+1 instead of their
  # level: the level tables get a (K+2)-th row (docs/design.md). False: givens show their level.
  given_state: bool = False
  # Sudoku only: add each cell's candidate digits, candidate count and hidden singles, computed
  # from the revealed digits of the input grid, through zero-init projections (to the input and,
  # with pathway.input_embed, to the hierarchy pathway; tasks/sudoku_model.py).
  sudoku_candidates: bool = False
  # True: those features feed the hierarchy pathway only (needs pathway.input_embed); the token
  # network, and so an MDLM twin, never sees them.
  candidates_pathway_only: bool = False
  dtype: str = 'float32'  # compute dtype: 'float32' | 'bfloat16'; parameters stay float32
  # Rematerialisation of each DiT block in the backward pass (jax.checkpoint, docs/method.md
  # §4.6): 'none' | 'block' (keep only the blocks' inputs: least memory, one more forward of
  # the blocks) | 'dots' (also keep the blocks' weight matmuls). Same parameters and values.
  remat: str = 'none'

  @classmethod
  def from_section(cls, cfg_model: Any) -> ModelConfig:
    """Validates a `model` section; errors name the field and the allowed values."""
    if isinstance(cfg_model, ModelConfig):
      return cfg_model
    get = (cfg_model.get if isinstance(cfg_model, Mapping) or hasattr(cfg_model, 'get')
           else lambda k, d=None: getattr(cfg_model, k, d))
    if get('backbone', None) is None and get('model', None) is not None:
      raise ValueError('ModelConfig.from_section expects the `model` config section '
                       '(config.model), not the whole config.')
    values = {}
    for f in dataclasses.fields(cls):
      v = get(f.name, None)
      if v is None:
        v = f.default_factory() if f.default is dataclasses.MISSING else f.default
      values[f.name] = v
    for name, lo in (('num_levels', 1), ('vocab_size', 2), ('seq_len', 1), ('num_layers', 1),
                     ('hidden_size', 1), ('num_heads', 1), ('mlp_dim', 1), ('cond_dim', 1)):
      _check_int(f'model.{name}', values[name], minimum=lo)
    values['mask_id'] = config_kinds.resolve_mask_id(values['vocab_size'], values['mask_id'],
                                                     get('extra_vocab_rows', None) or 0)
    values['dropout'] = _check_number('model.dropout', values['dropout'], lo=0.0, hi=1.0)
    for name in ('time_conditioning', 'tie_embeddings', 'hier_stop_gradient', 'given_state',
                 'sudoku_candidates', 'candidates_pathway_only'):
      _check_bool(f'model.{name}', values[name])
    _check_int('model.cluster_head', values['cluster_head'], minimum=0)
    _check_int('model.denoiser_layers', values['denoiser_layers'], minimum=0)
    p = values['pathway']
    if not isinstance(p, PathwayConfig):
      items = p.items() if hasattr(p, 'items') else ()
      values['pathway'] = p = build(PathwayConfig, dict(items), 'model.pathway.')
    check_pathway(p, values)
    return cls(**values)

  def __post_init__(self) -> None:
    def bad(field: str, allowed: str) -> ValueError:
      return ValueError(f'model.{field}={getattr(self, field)!r} is invalid: {allowed}.')

    if self.backbone not in BACKBONES:
      raise bad('backbone', f'allowed {BACKBONES}')
    if self.hidden_size % self.num_heads:
      raise bad('hidden_size', f'must be divisible by model.num_heads={self.num_heads}')
    if self.variant not in VARIANTS:
      raise bad('variant', f'allowed {VARIANTS}')
    pe = self.position_embedding
    if pe not in POSITION_EMBEDDINGS:
      raise bad('position_embedding', f'allowed {POSITION_EMBEDDINGS}')
    if pe in ('sudoku', 'sudoku_rel') and self.seq_len != SUDOKU_CELLS:
      raise bad('seq_len', f'model.position_embedding={pe!r} needs model.seq_len == 81 '
                '(a 9×9 grid)')
    if pe == 'sudoku_rel' and self.backbone != 'dit':
      raise bad('position_embedding', "'sudoku_rel' (relation attention bias) needs "
                "model.backbone='dit'")
    if pe == 'rotary' and (self.hidden_size // self.num_heads) % 2:
      raise bad('num_heads', 'rotary embeddings need an even head dimension hidden_size / '
                'num_heads')
    if self.dtype not in COMPUTE_DTYPES:
      raise bad('dtype', f'allowed {COMPUTE_DTYPES}')
    if self.remat not in REMAT_POLICIES:
      raise bad('remat', f'allowed {REMAT_POLICIES}')
    if self.remat != 'none' and self.backbone != 'dit':
      raise bad('remat', "rematerialisation is implemented for model.backbone='dit' only")
    if self.sudoku_candidates and (self.seq_len, self.vocab_size, self.mask_id) != (
        SUDOKU_CELLS, 10, 9):
      raise bad('sudoku_candidates', 'the candidate features need a Sudoku grid: model.seq_len '
                '= 81, vocab_size = 10 and mask_id = 9 (tokens 0..8 = digits 1..9; '
                f'got {self.seq_len}, {self.vocab_size}, {self.mask_id})')
    if self.candidates_pathway_only and not (self.sudoku_candidates
                                             and self.pathway.input_embed):
      raise bad('candidates_pathway_only', 'the candidate features would feed nothing: set '
                'model.sudoku_candidates=True and model.pathway.input_embed=True')


@dataclasses.dataclass(frozen=True)
class ScheduleSection:
  """`schedule`: Per-level schedule (docs/method.md §2)."""
  kind: str = 'loglinear'  # 'loglinear' | 'power'
  offsets: tuple[float, ...] = (0.0, 0.25)  # δ_k, loglinear only
  exponents: tuple[float, ...] = (1.0, 2.0)  # ω_k, power only
  eps: float = 1e-3
  check_ordering: str = 'error'  # 'error' | 'warn' | 'off', checked on the sampling grid
  # >= 0: derive the offsets from K (hmdlm_jax/config/derive.py): δ_k = offsets_max·k/(K-1), δ=(0,) for
  # K=1, so --config.model.num_levels=1 alone gives the MDLM twin; -1 = use `offsets` as given.
  offsets_max: float = -1.0


@dataclasses.dataclass(frozen=True)
class LossSection:
  """`loss`: Loss (docs/method.md §3, §5)."""
  beta_hier: float = 1.0
  beta_cons: float = 1.0
  t_min: float = 1e-3
  antithetic: bool = True
  # T_train of Algorithm 1: s = max(t - 1/T_train, 0); 0 = the sampling grid, sample.num_steps
  # (resolved in hmdlm_jax/config/derive.py).
  train_steps_T: int = 0
  # What trains the hierarchy head (docs/method.md §5.1): 'bound' = β_hier L_hier + β_cons L_cons
  # (the bound's terms, λ'-weighted); 'cross_entropy' = β_hier × the mean −log g[h0] over the
  # masked loss positions (same optimum, no 1/(t − δ_k) tail). The bound's terms are reported
  # (and evaluated) either way.
  hier_objective: str = 'bound'
  # > 0: adds β_rounds × the per-round token loss (training only): with pathway.readout='rounds',
  # repeat r of the hierarchy trunk reads the tokens of the masked positions whose level rounds
  # 1..r decide (level >= K - r), so each round learns what it should know (docs/method.md §5.1).
  beta_rounds: float = 0.0
  # Where the loss evaluates the token head (hmdlm_jax/models/token_head.py): 'selected' = only at
  # the masked loss positions (same values, about half the head's cost; one device only), 'all'
  # = dense logits at every position, 'auto' = 'selected' when the train step runs on one device.
  token_rows: str = 'auto'


@dataclasses.dataclass(frozen=True)
class DataSection:
  """`data`: Data; `kind` selects the task (hmdlm_jax/tasks): its pipeline, evaluation and sample
  mode."""
  kind: str = 'sudoku'
  batch_size: int = 64  # global batch
  eval_batch_size: int = 64
  train_path: str = ''
  test_path: str = ''
  cache_dir: str = ''
  num_workers: int = 0  # > 0: Grain worker processes
  read_threads: int = 1  # Grain read threads (num_workers = 0)
  prefetch_batches: int = 4
  augment: bool = True  # Sudoku symmetries on the train split
  # Sudoku: generated puzzles (when train_path / test_path are empty), cached in cache_dir.
  num_train_puzzles: int = 20000
  num_test_puzzles: int = 2000
  gen_seed: int = 0
  min_givens: int = 17
  max_givens: int = 34
  gen_attempts: int = 8
  gen_processes: int = 1
  # Text kinds ('text', 'lm1b', 'wikihow', 'corpus').
  seq_len: int = 128  # tokens per row, BOS/EOS included; must equal model.seq_len
  tokenizer: str = ''  # HF name / directory / vocab.txt / 'offline:bert-base-uncased'
  tokenizer_allow_download: bool = False
  mask_token: str = 'append'  # 'append' (a new last row) | 'tokenizer' (reuse its [MASK])
  hierarchy: str = 'none'  # 'none' | 'frequency' | 'position' (WikiHow); 'none' when num_levels=1
  tau: int = 1  # frequency rule: at most tau occurrences in the row -> level 1
  overlong: str = 'truncate'  # 'truncate' | 'drop' rows longer than seq_len
  text_unit: str = 'line'  # plain text: 'line' | 'paragraph' records
  test_fraction: float = 0.0  # plain text without test_path: hold out this share of the records
  tfds_data_dir: str = ''  # LM1B: a prepared TFDS data directory
  # 'corpus': a folder written by `python -m hmdlm_jax.data.prepare` (train/ and test/ inside).
  corpus_dir: str = ''  # a path, or gs://BUCKET/DIR (read through a local copy, below)
  # 'corpus' on gs://: the local folder each process fetches the shards into ('': the default,
  # ~/.cache/hmdlm_jax/corpus); every process holds every shard (data/corpus_cache.py).
  corpus_cache_dir: str = ''
  packing: str = 'wrap'  # 'corpus': 'wrap' (documents packed into rows) | 'truncate' (one per row)
  # 'corpus', 'truncate', training: a document longer than a row keeps its 'start' or a window at
  # a 'random' offset drawn from (seed, epoch, position) (docs/method.md §6).
  crop: str = 'start'


@dataclasses.dataclass(frozen=True)
class OptimSection:
  """`optim`: Optimiser (docs/method.md §9)."""
  lr: float = 3e-4
  warmup_steps: int = 2500
  decay: str = 'constant'  # 'constant' | 'cosine'
  b1: float = 0.9
  b2: float = 0.999
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  # > 0: the hierarchy-only parameters ('hier_*', models/hierarchy.py) are clipped to this global
  # norm as a group of their own, and `grad_clip` applies to the rest; 0 = one clip over all.
  hier_grad_clip: float = 0.0
  # The hierarchy-only parameters' learning rate is hier_lr_scale · lr (optim.scale_by_group).
  hier_lr_scale: float = 1.0
  eps: float = 1e-8  # Adam's ε
  decay_floor: float = 0.0  # cosine decay ends at decay_floor · lr (HDLM's OWT runs: 0.1)
  ema_decay: float = 0.9999
  ema_warmup: bool = False  # True: decay min(ema_decay, (1+n)/(10+n)) at update n (short runs)


@dataclasses.dataclass(frozen=True)
class TrainSection:
  """`train`: Training loop."""
  num_steps: int = 1000
  grad_accum: int = 1
  log_every: int = 50
  eval_every: int = 0  # 0 = only at the end
  ckpt_every: int = 500
  keep_last: int = 3
  keep_period: int = 0  # also keep every k-th step forever; 0 = off
  max_bad_steps: int = 10  # consecutive NaN/Inf steps before stopping
  time_budget_s: float = 0.0  # stop (and checkpoint) after this wall time; 0 = off
  final_eval: bool = True  # evaluate once more after the last step
  async_checkpoint: bool = True  # Orbax writes in the background (always waited for at exit)
  debug_nan_steps: tuple[int, ...] = ()  # fault injection: steps whose loss/grads are NaN (tests only)
  # Also log every metrics line to Weights & Biases: 'PROJECT' or 'PROJECT/RUN_NAME' (default
  # name: the workdir's), '' = off. Needs the `wandb` extra; WANDB_MODE=offline keeps it local.
  wandb: str = ''


@dataclasses.dataclass(frozen=True)
class MeshSection:
  """`mesh`: Device mesh: product must equal the device count; -1 = all remaining devices."""
  data: int = -1
  fsdp: int = 1
  tensor: int = 1


@dataclasses.dataclass(frozen=True)
class DistributedSection:
  """`distributed`: Multi-host."""
  enabled: bool = False
  coordinator_address: str = ''
  num_processes: int = 0
  process_id: int = -1


@dataclasses.dataclass(frozen=True)
class SampleSection:
  """`sample`: Sampling (docs/method.md §7)."""
  num_steps: int = 128
  temperature: float = 1.0
  top_p: float = 1.0  # nucleus mass of the token draws (docs/method.md §8.5); 1 = the full law
  # 'inclusive' keeps the token whose cumulative mass crosses top_p (Hugging Face's rule);
  # 'exclusive' drops it (ReMDM's and ADLM's code), keeping at least the most probable token.
  nucleus: str = 'inclusive'
  greedy: bool = False
  # 'ancestral' (Algorithm 2) | 'confidence' | 'remask' (MGDM, §13.3) | 'remdm' (ReMDM, §13.5)
  ordering: str = 'ancestral'
  # 'remask' only: Gumbel noise of scale remask_noise·rate on the confidences unless greedy, and
  # the masked share after step n, rate = (n-1)/T ('linear') or cos(π(T-n+1)/(2T)) ('cosine').
  remask_noise: float = 0.5
  remask_schedule: str = 'linear'
  # 'remask' only: 'carry' keeps a decoded cell's token certain (SUBS), so it is never re-masked;
  # 'repredict' predicts every non-given cell afresh each step, as MGDM's code (§13.3).
  remask_decoded: str = 'carry'
  # 'remdm' only (K = 1: MDLM, ADLM; docs/method.md §13.5): the remasking probability σ_t is
  # min(eta, σ_max) ('cap'), eta·σ_max ('rescale') or, for 'loop' (ADLM's runs), 0 outside
  # (t_off, t_on] and eta inside, where α is held at alpha_on; σ_max = min(1, (1 - α_s)/α_t).
  remdm_schedule: str = 'loop'
  remdm_eta: float = 0.02
  remdm_t_on: float = 0.55
  remdm_t_off: float = 0.05
  remdm_alpha_on: float = 0.9
  use_cache: bool = True
  level_context: str = 'candidates'  # 'candidates' | 'none': levels pass 2 sees (confidence ordering)
  hierarchy_weight: float = 1.0  # confidence score = w · log π + log max f (1: the ancestral move)
  num_samples: int = 16
  seeds: tuple[int, ...] = (0,)
  pictures: bool = True  # --mode=sample writes reveal-order pictures into DIR/pictures


@dataclasses.dataclass(frozen=True)
class InitSection:
  """`init`: Initialisation from a converted MDLM checkpoint (hmdlm_jax/convert_mdlm.py); '' =
  random init."""
  mdlm_checkpoint: str = ''
  # process.kind='adlm': the ADLM authors' checkpoint as converted by hmdlm_jax/convert_adlm.py
  # (.npz); fills anchor network and denoiser (docs/method.md §13.4).
  adlm_checkpoint: str = ''
  # Input embedding only (hmdlm_jax/warm_start.py, docs/method.md §13.1): an .npz table whose rows
  # become the word rows, HDLM's cluster rows the mean of their words' rows, noise rows zero.
  embedding: str = ''
  # The MASK row of that checkpoint when a MultiMDM starts from it (-1 = its last row; LM1B: 103).
  mdlm_mask_id: int = -1
  # Warm start from a run directory of this project (hmdlm_jax/warm_start.py): its latest
  # checkpoint's EMA (or raw) parameters; MDLM -> MultiMDM copies the MASK row into every mask row.
  workdir: str = ''
  use_ema: bool = True


@dataclasses.dataclass(frozen=True)
class EvalSection:
  """`eval`: Evaluation; `kind` must be the task's: 'sudoku' (Sudoku) | 'perplexity' (text kinds)."""
  kind: str = 'sudoku'
  num_examples: int = 500
  use_ema: bool = True
  time_seed: int = 1234
  num_t_samples: int = 1
  decodings: tuple[str, ...] = ('greedy', 'stochastic')  # Sudoku: decodings evaluated
  # Sudoku, K > 1 (tasks/sudoku_hierarchy.py): level accuracy of the head against the prior, and
  # the same checkpoint decoded (greedy, first seed) in each of these modes: 'head_ignored',
  # 'head_order', 'head_context', and the reference modes 'labeller_order', 'labeller_context'
  # (levels computed by the labeller from the givens instead of the head) and the diagnostic
  # 'labeller_order_at_<k>', k = 0..5 (the labeller's levels on level-k cells only). Off by
  # default: it adds one evaluation pass and one decoding per mode to every Sudoku evaluation.
  hierarchy_diagnostics: bool = False
  hierarchy_decodings: tuple[str, ...] = ('head_ignored', 'head_order', 'labeller_order')
  # How each of those modes decodes (first sampling seed): a non-empty subset of eval.decodings'
  # kinds ('greedy', 'stochastic'); the modes' w and level context, the rest from `sample`.
  hierarchy_sampling: tuple[str, ...] = ('greedy',)
  num_samples: int = 0  # text: unconditional samples for generative metrics (0 = none)
  gen_ppl_model: str = 'gpt2-large'  # AR scorer of gen PPL (local cache; Hub: HMDLM_HUB=1)
  mauve_featurizer: str = 'gpt2-large'


@dataclasses.dataclass(frozen=True)
class Config:
  """The whole experiment, resolved (hmdlm_jax/config/derive.py): what every module reads."""
  seed: int = 0
  process: ProcessSection = dataclasses.field(default_factory=ProcessSection)
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  schedule: ScheduleSection = dataclasses.field(default_factory=ScheduleSection)
  loss: LossSection = dataclasses.field(default_factory=LossSection)
  data: DataSection = dataclasses.field(default_factory=DataSection)
  optim: OptimSection = dataclasses.field(default_factory=OptimSection)
  train: TrainSection = dataclasses.field(default_factory=TrainSection)
  mesh: MeshSection = dataclasses.field(default_factory=MeshSection)
  distributed: DistributedSection = dataclasses.field(default_factory=DistributedSection)
  sample: SampleSection = dataclasses.field(default_factory=SampleSection)
  init: InitSection = dataclasses.field(default_factory=InitSection)
  eval: EvalSection = dataclasses.field(default_factory=EvalSection)

  def replace(self, **changes: Any) -> Config:
    """A copy with dotted fields changed, e.g. `replace(**{'train.num_steps': 10})`; the result
    is not re-derived (use it for fields nothing derives from, as tests and tools do)."""
    config = self
    for dotted, value in changes.items():
      config = _replace_path(config, dotted.split('.'), value)
    return config


def _replace_path(node: Any, path: list[str], value: Any) -> Any:
  if not hasattr(node, path[0]):
    raise ValueError(f'no config field {path[0]!r} in {type(node).__name__}.')
  if len(path) == 1:
    return dataclasses.replace(node, **{path[0]: value})
  return dataclasses.replace(node, **{path[0]: _replace_path(getattr(node, path[0]), path[1:],
                                                             value)})


def defaults() -> ml_collections.ConfigDict:
  """The schema with its defaults as the ConfigDict an experiment file overrides."""
  return ml_collections.ConfigDict(to_dict(Config()))


def to_dict(config: Any) -> dict[str, Any]:
  """A (section of a) config as nested plain dicts, tuples kept (config.json stores it)."""
  return {f.name: (to_dict(getattr(config, f.name)) if dataclasses.is_dataclass(
      getattr(config, f.name)) else getattr(config, f.name)) for f in dataclasses.fields(config)}


def _coerce(name: str, kind: Any, value: Any) -> Any:
  """A value of the type the schema declares: ints where floats are declared, lists as tuples."""
  origin = typing.get_origin(kind)
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if (kind is tuple or origin is tuple) and isinstance(value, (list, tuple)):
    args = typing.get_args(kind)
    item = args[0] if args else None
    return tuple(_coerce(name, item, v) for v in value)
  return value


# Fields a record may hold under an earlier name: model.hier_<f> is now model.pathway.<f>.
_PATHWAY_FIELDS = tuple(f.name for f in dataclasses.fields(PathwayConfig))


def migrate_record(record: Mapping[str, Any]) -> dict[str, Any]:
  """A recorded config (config.json, a checkpoint's meta) with its fields under today's names."""
  record = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in record.items()}
  model = record.get('model')
  if isinstance(model, dict) and any(f'hier_{f}' in model for f in _PATHWAY_FIELDS):
    pathway = dict(model.get('pathway') or {})
    for f in _PATHWAY_FIELDS:
      if f'hier_{f}' in model:
        pathway[f] = model.pop(f'hier_{f}')
    model['pathway'] = pathway
  return record


def from_record(record: Mapping[str, Any]) -> Config:
  """The `Config` a run recorded (its config.json), fields under today's names
  (`migrate_record`): fields this version no longer has are left out, missing ones take their
  defaults (the record was resolved when it was written)."""
  return build(Config, migrate_record(record), strict=False)


def build(cls: Any, values: Mapping[str, Any], path: str = '', *, strict: bool = True) -> Any:
  """The dataclass `cls` from nested `values` (a ConfigDict's or config.json's dict).

  Missing fields take the schema's default; an unknown one is a ValueError naming it.
  """
  hints = typing.get_type_hints(cls)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - names)
  if not strict:
    values = {k: v for k, v in values.items() if k in names}
  elif unknown:
    raise ValueError(f'unknown config field{"s" if len(unknown) > 1 else ""} '
                     f'{", ".join(path + u for u in unknown)}: every field is listed in '
                     'hmdlm_jax/config/schema.py (configs/base.py builds from it).')
  kwargs = {}
  for name, value in values.items():
    kind = hints[name]
    if dataclasses.is_dataclass(kind):
      if not isinstance(value, Mapping):
        raise ValueError(f'{path}{name} is a config section, got {value!r}.')
      kwargs[name] = build(kind, value, f'{path}{name}.', strict=strict)
    else:
      kwargs[name] = _coerce(path + name, kind, value)
  return cls(**kwargs)
