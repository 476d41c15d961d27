"""The language tasks (kinds text, lm1b, wikihow, corpus; docs/method.md §6, §8): perplexity, samples.

Evaluation: the rigorous bound over the test split (evaluation/perplexity.py); with
config.eval.num_samples > 0 (and samples wanted, i.e. not during training) also that many samples
per seed of config.sample.seeds, scored per seed (entropy, gen PPL, MAUVE -- None with a reason
when the scorer / featuriser is not available locally -- and drawn-vs-recomputed level
disagreement), then mean and std; the samples go beside the report (`reports.eval_samples_file`).
Samples are cut at the first [SEP] / EOS. A prompted task (WikiHow) conditions its samples on the
test rows' given positions (the titles); the others sample unconditionally, or complete / infill
the user's texts (sample mode's --prompt / --infill, hmdlm_jax.load's model; tasks/text_given.py).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hmdlm_jax import config as config_lib
from hmdlm_jax.config import SampleConfig
from hmdlm_jax.data import text as text_data
from hmdlm_jax.evaluation import batches as batches_lib
from hmdlm_jax.evaluation import generative
from hmdlm_jax.evaluation import perplexity
from hmdlm_jax.evaluation import reports
from hmdlm_jax.evaluation import samples as samples_lib
from hmdlm_jax.tasks import base
from hmdlm_jax.tasks import text_given
from hmdlm_jax.tasks import text_pictures


def content_mask(tokens: np.ndarray, bos_id: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Row extents of generated text, as `TextTokenizer.cut` sees them (docs/method.md §6: cut at
  the first EOS / [SEP]).

  Args:
    tokens: int [N, L] generated rows (`BOS text EOS pad...`).
    bos_id, eos_id: the tokenizer's row delimiters ([CLS]/[SEP], or <|endoftext|> twice).

  Returns:
    real bool [N, L]: the row as the data labeller sees it: positions up to and including the
      first EOS that is not the opening BOS (everything when no EOS was generated);
    text bool [N, L]: the content only: `real` without the opening BOS and without that EOS.
  """
  tokens = np.asarray(tokens)
  pos = np.arange(tokens.shape[1])
  start = (tokens[:, :1] == bos_id).astype(np.int64)  # [N, 1]: 1 if the row opens with BOS
  is_eos = (tokens == eos_id) & (pos >= start)
  first = np.where(is_eos.any(-1), is_eos.argmax(-1), tokens.shape[1])[:, None]  # [N, 1]
  real = pos <= first
  text = (pos >= start) & (pos < first)
  return real, text


def recomputed_text_levels(tokens: np.ndarray, real: np.ndarray, rule: str, tau: int
                           ) -> np.ndarray | None:
  """Levels the data labeller would give the generated tokens, or None if the rule needs more
  than tokens (the 'position' rule needs the summary/body segments)."""
  if rule == 'frequency':
    return text_data.frequency_levels(tokens, real, tau)
  if rule == 'none':
    return np.zeros(np.shape(tokens), np.int32)
  return None


def text_sample_metrics(samples: samples_lib.SampledRows, tokenizer: Any, *,
                        level_rule: str | None = None, tau: int = 1,
                        references: Callable[[], list[str]] | None = None,
                        scorer: generative.ARScorer | None = None,
                        gen_ppl_model: str = generative.DEFAULT_SCORER,
                        gen_ppl_unavailable: str | None = None,
                        featurizer: generative.TransformersFeaturizer | None = None,
                        mauve_featurizer: str = generative.DEFAULT_FEATURIZER,
                        mauve_unavailable: str | None = None
                        ) -> tuple[dict[str, Any], list[str]]:
  """Entropy, gen PPL, MAUVE and level disagreement of decoded samples -> (metrics, texts).

  `tokenizer` is a `data.tokenizers.TextTokenizer` (cut at the first EOS/[SEP], decode). Entropy
  counts the generated content (prompt excluded); level disagreement compares the drawn levels
  with the data rule (`level_rule`, e.g. 'frequency') applied to the generated row. `references`
  (reference texts for MAUVE) is called only when MAUVE can run. Scorer / featuriser: given, or
  loaded from `gen_ppl_model` / `mauve_featurizer`, unless a `*_unavailable` reason is passed.
  Unavailable metrics are None with a reason.
  """
  real, text = content_mask(samples.tokens, tokenizer.bos_id, tokenizer.eos_id)
  texts = [tokenizer.decode(row) for row in samples.tokens]
  metrics: dict[str, Any] = {'num_samples': int(samples.tokens.shape[0]),
                             'nfe': float(np.mean(samples.nfe))}
  metrics.update(generative.entropy_report(samples.tokens, text & ~samples.given))
  generated = real & ~samples.given
  if level_rule is not None:
    rec = recomputed_text_levels(samples.tokens, real, level_rule, tau)
    if rec is None:
      metrics['level_disagreement'] = None
      metrics['level_disagreement_unavailable_reason'] = (
          f'data.hierarchy={level_rule!r} levels cannot be recomputed from tokens alone')
    else:
      metrics['level_disagreement'] = reports.ratio(
          (generated & (rec != samples.levels)).sum(), generated.sum())
  metrics.update(generative.gen_ppl_report(
      texts, scorer=scorer, model_name=gen_ppl_model, unavailable_reason=gen_ppl_unavailable))
  metrics.update(generative.mauve_report(
      texts, references if references is not None else [], featurizer=featurizer,
      featurize_model_name=mauve_featurizer, unavailable_reason=mauve_unavailable))
  return metrics, texts


def _records(rows: samples_lib.SampledRows, texts: Sequence[str]) -> base.Records:
  return [{'index': n, 'text': texts[n], 'tokens': rows.tokens[n].tolist(),
           'levels': rows.levels[n].tolist(), 'reveal_step': rows.reveal_step[n].tolist(),
           'given': rows.given[n].astype(int).tolist(), 'nfe': int(rows.nfe[n])}
          for n in range(len(texts))]


@dataclasses.dataclass(frozen=True)
class TextTask(base.Task):
  """A language task over one data/ pipeline; `check_data(config)` is that pipeline's check
  before it reads anything (fields, tokenizer against the model, paths); `prompted`: samples are
  conditioned on the test rows' given positions (WikiHow titles)."""
  check_data: Callable[[config_lib.Config], Any]
  prompted: bool = False
  eval_kind = 'perplexity'
  library_calls = ('sample', 'complete', 'infill', 'score')
  library_refusal = 'a text task (use complete, infill or sample)'

  def validate(self, config: config_lib.Config) -> None:
    self.check_data(config)

  def check_restorable(self, config: config_lib.Config) -> None:
    text_data.checked_tokenizer(config)  # the vocabulary must be here before restoring

  def eval_seeds(self, config: config_lib.Config, with_samples: bool) -> tuple[int, ...]:
    return base.sample_seeds(config) if with_samples and int(config.eval.num_samples) else ()

  def outputs(self, config: config_lib.Config, mode: str, step: int) -> tuple[str, ...]:
    names = super().outputs(config, mode, step)
    if mode == 'eval' and config.eval.num_samples:
      names += (reports.eval_samples_file(names[0]),)
    return names

  def _samples(self, ctx: base.EvalContext, num: int, seed: int,
               given: text_given.GivenRows | None = None) -> samples_lib.SampledRows:
    """`num` samples with sampling seed `seed`, in batches of `base.sample_batch_size` rows (one
    compile per power-of-two bucket up to data.eval_batch_size; padding rows dropped);
    conditioned on `given`'s rows (one sample each), else on the test rows' given positions for a
    prompted task."""
    config = ctx.config
    key = jax.random.fold_in(jax.random.PRNGKey(int(config.seed)), int(seed))
    prompts = [given.batch] if given is not None else (
        self.test_batches(config) if self.prompted else None)
    return samples_lib.sample_rows(
        ctx.apply_fn, key, ctx.process, SampleConfig.from_config(config), num_samples=num,
        seq_len=int(config.model.seq_len),
        batch_size=base.sample_batch_size(num, int(config.data.eval_batch_size)),
        prompts=prompts, progress=ctx.progress)

  def generate(self, ctx: base.EvalContext, num: int, seed: int,
               given: text_given.GivenRows | None = None) -> tuple[base.Records, str]:
    """(records, printable text) of `num` samples (`given`: one per row) -- what sample mode
    saves and prints, and what hmdlm_jax.load's model returns."""
    tok = text_data.checked_tokenizer(ctx.config)
    rows = self._samples(ctx, len(given) if given is not None else num, seed, given)
    texts = [tok.decode(row) for row in rows.tokens]
    records = [dict(r, seed=seed) for r in _records(rows, texts)]
    if given is not None:
      for r, kind, text in zip(records, given.kinds, given.inputs):
        r[kind] = text
    return records, '\n'.join(f'[{n}] {t}' for n, t in enumerate(texts))

  def draw(self, ctx: base.EvalContext, num: int, seed: int,
           given: text_given.GivenRows | None = None) -> base.Samples:
    """`generate`'s samples as hmdlm_jax.load's `Model` returns them."""
    records, _ = self.generate(ctx, num, seed, given)
    field = functools.partial(base.record_field, records)
    return base.Samples(tuple(r['text'] for r in records), field('tokens'), field('levels'),
                        field('reveal_step'), field('given').astype(bool), tuple(records), seed)

  def perplexity(self, ctx: base.EvalContext, batches: Iterable[batches_lib.Batch],
                 max_examples: int | None = None) -> dict[str, Any]:
    """The bound and estimates over `batches` with the config's evaluation settings (what
    --mode=eval reports on the test split)."""
    config = ctx.config
    return perplexity.evaluate_perplexity(
        ctx.apply_fn, ctx.process, batches, time_seed=int(config.eval.time_seed),
        num_t_samples=int(config.eval.num_t_samples), t_min=float(config.loss.t_min),
        max_examples=max_examples, progress=ctx.progress)

  def per_text_scores(self, ctx: base.EvalContext, batches: Sequence[batches_lib.Batch]
                      ) -> list[dict[str, Any]]:
    """Each valid row's bound (nats/token, PPL, num_tokens), in order, from the draws `perplexity`
    makes on the same `batches` (its t, masks and keys: evaluation/perplexity.py), so their
    token-weighted mean is its bound_nats_per_token. A row's t is stratified over its batch's
    rows, so a text's numbers depend on the texts scored with it (both are unbiased)."""
    config, process = ctx.config, ctx.process
    # perplexity.py's own step and times (one compile shared with `perplexity`); the test that the
    # weighted mean equals its aggregate keeps this loop's keys in step with evaluate_perplexity.
    step = perplexity._perplexity_step(ctx.apply_fn, process)  # pylint: disable=protected-access
    num_t, t_min = int(config.eval.num_t_samples), float(config.loss.t_min)
    base_key = jax.random.PRNGKey(int(config.eval.time_seed))
    rows = []
    for j, (batch, valid) in enumerate(batches_lib.fixed_batches(batches, what='texts')):
      batch = process.prepare_batch(batch)
      n_tok = (batch['loss_mask'] & valid[:, None]).sum(-1)  # [B]
      device_batch = {k: jnp.asarray(v) for k, v in batch.items()}
      nats = np.zeros(valid.shape, np.float64)  # [B] bound nats/token, averaged over t-samples
      for r in range(num_t):
        k_t, k_mask = jax.random.split(jax.random.fold_in(jax.random.fold_in(base_key, j), r))
        t = perplexity._stratified_times(k_t, valid, t_min)  # pylint: disable=protected-access
        values = jax.device_get(step(device_batch, k_mask, jnp.asarray(t)))
        nats += sum(np.asarray(v, np.float64) for n, v in values.items()
                    if n not in process.estimate_names) / num_t
      rows.extend({'bound_nats_per_token': float(nats[i]),
                   'ppl': perplexity._exp(float(nats[i])),  # pylint: disable=protected-access
                   'num_tokens': int(n_tok[i])} for i in np.flatnonzero(valid))
    return rows

  def evaluate(self, ctx: base.EvalContext, max_examples: int | None, with_samples: bool
               ) -> dict[str, Any]:
    config = ctx.config
    res: dict[str, Any] = {'perplexity': self.perplexity(ctx, self.test_batches(config),
                                                         max_examples)}
    num = int(config.eval.num_samples)
    if with_samples and num > 0:
      name = self.report_name(config, ctx.step, max_examples, in_training=False)
      res['samples'] = self._scored_samples(ctx, num, reports.eval_samples_file(name))
    return res

  def _scored_samples(self, ctx: base.EvalContext, num: int, name: str) -> dict[str, Any]:
    """`num` samples per seed, scored per seed, then mean and std; written to OUT/`name`."""
    config = ctx.config
    tok = text_data.checked_tokenizer(config)
    # GPT-2 Large (scorer, MAUVE featuriser) is loaded once for all seeds, or reported unavailable.
    gen_ppl_model = config.eval.gen_ppl_model
    scorer, scorer_reason = generative.load_or_reason(generative.TransformersGPT2Scorer,
                                                      gen_ppl_model)
    mauve_model = config.eval.mauve_featurizer
    featurizer, mauve_reason = None, generative.mauve_unavailable()
    if mauve_reason is None:
      featurizer, mauve_reason = generative.load_or_reason(generative.TransformersFeaturizer,
                                                           mauve_model)
    refs: list[str] = []

    def references() -> list[str]:  # decoded test rows, read once, only if MAUVE runs
      if not refs:
        for b, v in batches_lib.fixed_batches(self.test_batches(config), max_examples=num):
          refs.extend(tok.decode(row) for row in b['tokens'][v])
      return refs

    level_rule = config.data.hierarchy if int(config.model.num_levels) > 1 else None
    per_seed, records = {}, []
    for seed in base.sample_seeds(config):
      rows = self._samples(ctx, num, seed)
      metrics, texts = text_sample_metrics(
          rows, tok, level_rule=level_rule, tau=int(config.data.tau), references=references,
          scorer=scorer, gen_ppl_model=gen_ppl_model, gen_ppl_unavailable=scorer_reason,
          featurizer=featurizer, mauve_featurizer=mauve_model, mauve_unavailable=mauve_reason)
      per_seed[str(seed)] = metrics
      records.extend(dict(r, seed=seed) for r in _records(rows, texts))
    mean, std = reports.mean_std(list(per_seed.values()))
    path = os.path.join(ctx.workdir, name)
    reports.write_jsonl(path, records)
    return {'per_seed': per_seed, 'mean': mean, 'std': std, 'path': path,
            'gen_ppl_unavailable_reason': scorer_reason, 'mauve_unavailable_reason': mauve_reason}

  def prepare_sample(self, config: config_lib.Config, inputs: Sequence[str] | None,
                     input_file: str | None, *, prompts: Sequence[str] = (),
                     infills: Sequence[str] = ()) -> text_given.GivenRows | None:
    if inputs or input_file:
      raise ValueError(f'--inputs / --input_file: data.kind={config.data.kind!r} takes --prompt '
                       '(a prefix to complete) or --infill (text with [MASK] / [MASK*n] spans).')
    if not prompts and not infills:
      return None
    # stacklevel=1: the [UNK] warning is issued here whoever calls (the preflight check, then the
    # run), so Python shows each one once.
    return text_given.given_rows(
        config, text_data.checked_tokenizer(config), prompts, infills,
        prompt_names=[f'--prompt #{i + 1}' for i in range(len(prompts))],
        infill_names=[f'--infill #{i + 1}' for i in range(len(infills))], stacklevel=1)

  def sample(self, ctx: base.EvalContext, inputs: text_given.GivenRows | None
             ) -> tuple[base.Records, str]:
    return self.generate(ctx, int(ctx.config.sample.num_samples),
                         base.sample_seeds(ctx.config)[0], inputs)

  def summary(self, results: Mapping[str, Any]) -> list[str]:
    p = results['perplexity']
    # The process's own terms (HMDLM: lm, hier, cons; HDLM: cluster, word; MultiMDM: recon,
    # ident) and its estimates.
    terms = ', '.join(f'{k[:-len("_nats_per_token")]} {v:.4f}' for k, v in p.items()
                      if k.endswith('_nats_per_token') and k != 'bound_nats_per_token')
    bound = reports.mean_pm(p['bound_nats_per_token'], p['bound_stderr'], digits=4,
                            count=p['num_sequences'])
    lines = [
        f'Bound ({p["bound_kind"]}): {bound} '
        f'nats/token  PPL {p["ppl"]:.3f}  ({terms}) over '
        f'{p["num_tokens"]} tokens / {p["num_sequences"]} sequences',
    ] + [f'{k[len("ppl_"):-len("_estimate")].replace("_", " ")} estimate (not a bound): '
         f'PPL {v:.3f}' for k, v in p.items() if k.startswith('ppl_') and k.endswith('_estimate')]
    s = results.get('samples')
    if s:
      m, sd = s['mean'], s['std']

      def show(k: str) -> str:
        if m.get(k) is None:
          return f'n/a ({s.get(k + "_unavailable_reason") or "undefined"})'
        return reports.mean_pm(m[k], sd[k], digits=4, count=len(s['per_seed']))
      n = next(iter(s['per_seed'].values()))['num_samples']
      lines.append(f'Samples: {n} per seed x {len(s["per_seed"])} seeds  entropy '
                   f'{show("entropy")}  gen PPL {show("gen_ppl")}  MAUVE {show("mauve")}  level '
                   f'disagreement {show("level_disagreement")}')
    return lines

  def pictures(self, config: config_lib.Config, workdir: str,
               records: base.Records) -> list[str]:
    return text_pictures.save_record_pictures(config, workdir, records)
