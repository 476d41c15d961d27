"""Training: TrainState, sharded init, the jitted train step, and the train/eval loop.

Flow (nanodo's habits): `jax.eval_shape` of the init gives the state's shapes -> logical axis names
give its shardings -> `jax.jit(init, out_shardings=...)` materialises it already sharded. The train
step is one `jax.jit` with explicit in/out shardings and the state donated; the host loop reads the
metrics of step n only after step n+1 has been dispatched, so the device never waits for Python.
A step whose loss or gradient norm is not finite is skipped inside the step (`make_train_step`
says how it is counted and when the loop stops); `train.debug_nan_steps` injects such steps for
tests without changing the compiled program.

Precision: parameters, optimiser state and EMA are float32; `model.dtype` sets the compute dtype of
the network (bfloat16 on accelerators), and the losses are computed in float32 (processes/).
What the run writes into DIR: `train_and_evaluate`; the modules and their contracts:
docs/design.md ("Training").
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any, Callable, Mapping

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from hmdlm_jax import accumulate
from hmdlm_jax import checkpoint as ckpt_lib
from hmdlm_jax import config as config_lib
from hmdlm_jax import lease as lease_lib
from hmdlm_jax import metrics as metrics_lib
from hmdlm_jax import models
from hmdlm_jax import optim
from hmdlm_jax import processes
from hmdlm_jax import progress
from hmdlm_jax import sharding as shd
from hmdlm_jax import storage
from hmdlm_jax import warm_start
from hmdlm_jax import workdir as workdir_lib
from hmdlm_jax import write_errors

BATCH_KEYS = processes.base.BATCH_KEYS
# train.debug_nan_steps is passed to the step as an int32 [MAX_FAULT_STEPS] array (padded with -1),
# so fault injection never changes the compiled program.
MAX_FAULT_STEPS = 16
PyTree = Any


class NonFiniteLossError(RuntimeError):
  """Raised by the loop after `train.max_bad_steps` consecutive non-finite steps."""


@flax.struct.dataclass
class TrainState:
  """Everything a step changes; saved whole in every checkpoint.

  step:          int32 [] — batches consumed (applied + skipped updates).
  params:        float32 parameter tree.
  ema_params:    EMA of params (optim.ema_update), same tree.
  opt_state:     optax state (its count = applied updates; drives the lr schedule).
  rng:           uint32 [2] — base key; the key of step n is fold_in(rng, n) (never changes).
  bad_steps:     int32 [] — consecutive non-finite steps (0 after a good one).
  skipped_steps: int32 [] — total non-finite (skipped) steps.
  """
  step: jax.Array
  params: PyTree
  ema_params: PyTree
  opt_state: PyTree
  rng: jax.Array
  bad_steps: jax.Array
  skipped_steps: jax.Array


# ----------------------------------------------------------------------------- config


def validate_config(config: config_lib.Config) -> None:
  """What the config alone cannot tell: the batch against the process count (ValueError)."""
  t = config.train
  b = int(config.data.batch_size)
  if b % (t.grad_accum * jax.process_count()):
    raise ValueError(f'data.batch_size={b} must be a positive multiple of train.grad_accum='
                     f'{t.grad_accum} times the process count {jax.process_count()}.')
  if len(t.debug_nan_steps) > MAX_FAULT_STEPS:
    raise ValueError(f'train.debug_nan_steps holds {len(t.debug_nan_steps)} steps; at most '
                     f'{MAX_FAULT_STEPS} are allowed.')


# ----------------------------------------------------------------------------- state


def _init_state(config: config_lib.Config, model: nn.Module,
                optimizer: optax.GradientTransformation) -> TrainState:
  """The initial state from config.seed (traced under jit / eval_shape)."""
  root = jax.random.PRNGKey(int(config.seed))
  params = models.init_params(model, jax.random.fold_in(root, 0), int(config.model.seq_len))
  return TrainState(
      step=jnp.zeros((), jnp.int32), params=params,
      ema_params=jax.tree.map(jnp.copy, params), opt_state=optimizer.init(params),
      rng=jax.random.fold_in(root, 1), bad_steps=jnp.zeros((), jnp.int32),
      skipped_steps=jnp.zeros((), jnp.int32))


def state_shardings(config: config_lib.Config, model: nn.Module, mesh: jax.sharding.Mesh,
                    optimizer: optax.GradientTransformation | None = None
                    ) -> tuple[TrainState, TrainState]:
  """(abstract state with shardings attached, sharding tree) for `TrainState`.

  Parameters (and EMA, Adam moments) follow the models' logical axis names mapped by
  sharding.LOGICAL_RULES; counters and keys are replicated.
  """
  optimizer = optimizer or optim.for_run(config)
  seq_len = int(config.model.seq_len)
  abstract = jax.eval_shape(lambda: _init_state(config, model, optimizer))
  abs_params = models.abstract_params(model, seq_len)
  p_sh = shd.param_shardings(models.logical_specs(model, seq_len), abs_params, mesh)
  rep = shd.replicated(mesh)
  sh = TrainState(
      step=rep, params=p_sh, ema_params=p_sh,
      opt_state=shd.shardings_like_params(abstract.opt_state, p_sh, abs_params, mesh),
      rng=rep, bad_steps=rep, skipped_steps=rep)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, sh)
  return abstract, sh


def create_train_state(config: config_lib.Config, mesh: jax.sharding.Mesh,
                       model: nn.Module) -> tuple[TrainState, TrainState]:
  """Initial TrainState of `model` (the task's: tasks.build_model), created directly in its
  shardings (eval_shape -> shardings -> jit).

  Returns:
    (state, sharding tree).
  """
  optimizer = optim.for_run(config)
  _, sh = state_shardings(config, model, mesh, optimizer)
  with shd.mesh_context(mesh):
    state = jax.jit(lambda: _init_state(config, model, optimizer), out_shardings=sh)()
  if warm_start.requested(config):  # init.workdir / init.mdlm_checkpoint (docs/method.md §13.2)
    state = warm_start.apply(config, state, sh, model)
  return state, sh


def restore_for_eval(config: config_lib.Config, workdir: str, step: int | None = None,
                     *, model: nn.Module) -> tuple[TrainState, int]:
  """(TrainState, step) of checkpoint `step` (default latest) of DIR, for evaluation/sampling.

  `model`: the run's network (tasks.build_model). Restores on the config's mesh (`config.mesh`,
  all devices); nothing in DIR is written. With `step` None the latest step is re-selected when a
  training run still writing DIR deletes the one chosen (checkpoint.Checkpointer.read_latest).
  """
  mesh = shd.make_mesh(config.mesh)
  abstract, _ = state_shardings(config, model, mesh)
  ckpt = ckpt_lib.Checkpointer(workdir, config.train, read_only=True)
  try:
    state, meta = ckpt.restore(abstract, None, step)
  finally:
    ckpt.close()
  return state, int(meta['step'])


# ----------------------------------------------------------------------------- step


def make_train_step(config: config_lib.Config, model: nn.Module,
                    process: processes.Process, mesh: jax.sharding.Mesh,
                    shardings: TrainState | None = None) -> Callable[..., Any]:
  """The jitted step `(state, batch) -> (state, metrics)`; `state` is donated.

  batch: dict tokens, levels [B, L] int32; given, loss_mask [B, L] bool — global arrays sharded by
  `sharding.batch_sharding(mesh)`. metrics: dict of float32 scalars (replicated): the loss terms of
  `process.loss` plus grad_norm (before clipping), hier_grad_norm (with optim.hier_grad_clip > 0:
  its share on the 'hier_*' parameters, optim.group_norms), lr, update_ok, bad_steps, skipped_steps.

  With train.grad_accum = A > 1 the batch is split into A strided micro-batches inside the step
  (`lax.scan`); each micro-batch's gradient is weighted by its share of loss tokens, which makes the
  accumulated gradient that of the token-weighted batch mean (the loss' own batch reduction).
  The returned callable has `.jitted` (the `jax.jit` object, e.g. for `_cache_size()`).

  NaN/Inf guard (inside the step): when the loss or the gradient norm is not finite (a finite
  gradient norm keeps Adam's moments and the update finite), the update is skipped — params, EMA
  and optimiser state keep their values — while `step` still advances (the batch is consumed and
  the per-step key is fold_in(rng, step), so the data order and the random stream go on exactly
  as without the bad step), and `bad_steps` (consecutive) and `skipped_steps` (total) count it.
  `step` therefore counts batches consumed, and the optimiser's own count (which drives the lr
  schedule) counts applied updates. Fault injection for tests: `train.debug_nan_steps` lists
  (0-based) steps whose loss is multiplied by NaN; it is passed to the step as a fixed-size
  array, so it never changes the compiled program.
  """
  optimizer = optim.for_run(config)
  process = process.for_devices(mesh.size)  # e.g. loss.token_rows='auto' -> this mesh's choice
  if shardings is None:
    _, shardings = state_shardings(config, model, mesh, optimizer)
  accum = int(config.train.grad_accum)
  nan_steps = tuple(int(s) for s in config.train.debug_nan_steps)
  fault_steps = np.full((MAX_FAULT_STEPS,), -1, np.int32)
  fault_steps[:len(nan_steps)] = nan_steps
  optim_cfg, target_every = config.optim, config_lib.multimdm.steps_per_round(config)  # 0: EMA

  def loss_fn(params: PyTree, batch: Mapping[str, jax.Array], key: jax.Array,
              poison: jax.Array, step: jax.Array, target_params: PyTree
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
    loss_key, dropout_key = jax.random.split(key)
    apply_fn = models.make_apply_fn(model, params, train=True, rng=dropout_key)
    # Consistency distillation reads θ̄ (EMA or frozen round), without gradient.
    target = (models.make_apply_fn(model, jax.lax.stop_gradient(target_params), train=False)
              if process.uses_target else None)
    loss, aux = process.loss(apply_fn, batch, loss_key, step=step, target_apply_fn=target)
    # poison is 1.0, or NaN at a train.debug_nan_steps step: loss and gradients become NaN.
    return loss * poison, aux

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step_fn(state: TrainState, batch: Mapping[str, jax.Array], faults: jax.Array
              ) -> tuple[TrainState, dict[str, jax.Array]]:
    chex.assert_rank([batch[k] for k in BATCH_KEYS], 2)
    chex.assert_equal_shape([batch[k] for k in BATCH_KEYS])
    chex.assert_type([batch['tokens'], batch['levels'], batch['given'], batch['loss_mask']],
                     [jnp.int32, jnp.int32, jnp.bool_, jnp.bool_])
    key = jax.random.fold_in(state.rng, state.step)
    # Fault injection for tests of the guard (train.debug_nan_steps; faults = -1 when unused).
    poison = jnp.where(jnp.any(faults == state.step), jnp.float32(jnp.nan), jnp.float32(1.0))
    target = (optim.round_target(state.opt_state, state.params, target_every) if target_every
              else state.ema_params)  # θ̄ of docs/method.md §13.2
    loss, aux, grads = accumulate.value_and_grad(grad_fn, state.params, batch, key, accum,
                                                 poison, state.step, target)
    grad_norm = optax.global_norm(grads)
    # A finite gradient norm bounds every g², so Adam's moments and the update stay finite; the
    # skip is one lax.cond, so AdamW + EMA run as their own fused loops with no where(ok, new, old)
    # pass (benchmarks/README.md, "the NaN guard as one `lax.cond`").
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    decay = optim.ema_decay_at(optim_cfg, state.step - state.skipped_steps)  # n applied before

    def apply(old: tuple[PyTree, PyTree, PyTree]) -> tuple[PyTree, PyTree, PyTree]:
      params, ema_params, opt_state = old
      updates, new_opt = optimizer.update(grads, opt_state, params)
      new_params = optax.apply_updates(params, updates)
      return new_params, optim.ema_update(ema_params, new_params, decay), new_opt

    new_params, new_ema, new_opt = jax.lax.cond(
        ok, apply, lambda old: old, (state.params, state.ema_params, state.opt_state))
    bad = jnp.where(ok, 0, state.bad_steps + 1).astype(jnp.int32)
    skipped = (state.skipped_steps + jnp.where(ok, 0, 1)).astype(jnp.int32)
    new_state = TrainState(
        step=state.step + 1, params=new_params, ema_params=new_ema, opt_state=new_opt,
        rng=state.rng, bad_steps=bad, skipped_steps=skipped)
    out = {k: jnp.asarray(v, jnp.float32) for k, v in aux.items()}
    out.update(loss=loss.astype(jnp.float32), grad_norm=grad_norm.astype(jnp.float32),
               lr=optim.current_lr(new_opt), update_ok=ok.astype(jnp.float32),
               bad_steps=bad.astype(jnp.float32), skipped_steps=skipped.astype(jnp.float32))
    if float(optim_cfg.hier_grad_clip) > 0:  # logged only then: the default log is unchanged
      out['hier_grad_norm'] = optim.group_norms(grads)['hier']
    return new_state, out

  rep, extra = shd.replicated(mesh), tuple(process.extra_batch_keys)  # e.g. ADLM's anchors
  jitted = jax.jit(step_fn, in_shardings=(shardings, shd.batch_sharding(mesh), rep),
                   out_shardings=(shardings, rep), donate_argnums=0)
  faults: list[jax.Array] = []  # on the devices at the first call: building touches no device

  def train_step(state: TrainState, batch: Mapping[str, jax.Array]
                 ) -> tuple[TrainState, dict[str, jax.Array]]:
    if not faults:
      faults.append(jax.device_put(fault_steps, rep))
    with shd.mesh_context(mesh):
      return jitted(state, {k: batch[k] for k in BATCH_KEYS + extra}, faults[0])  # extra: anchors

  train_step.jitted = jitted  # type: ignore[attr-defined]
  return train_step


def _scalar_items(d: Mapping[str, Any]) -> dict[str, float]:
  out = {}
  for k, v in d.items():
    try:
      a = np.asarray(jax.device_get(v))
    except Exception:  # pylint: disable=broad-except
      continue
    if a.size == 1 and np.issubdtype(a.dtype, np.number):
      out[k] = float(a.reshape(()))
  return out


EvalFn = Callable[[config_lib.Config, TrainState, int, str], Mapping[str, Any]]


def run_evaluation(config: config_lib.Config, state: TrainState, step: int, workdir: str,
                   writer: metrics_lib.MetricsWriter, hook: EvalFn | None) -> dict[str, Any]:
  """Calls the evaluation hook and logs its scalars (+ eval_time_s) with split='eval'."""
  if hook is None:
    return {}
  logging.info('Evaluating at step %d ...', step)
  t0 = time.perf_counter()
  result = hook(config, state, step, workdir) or {}
  result = dict(result)
  scalars = _scalar_items(result)
  scalars['eval_time_s'] = time.perf_counter() - t0
  writer.write(step, 'eval', scalars)
  logging.info('Evaluation at step %d: %d scalars in %.1fs -> %s', step, len(scalars),
               scalars['eval_time_s'], writer.path)
  return scalars


def _write_summary(workdir: str, step: int, stop_reason: str, train_step: Any,
                   t_start: float) -> dict[str, Any]:
  """DIR/train_summary.json: where and why the run stopped, and how often the step compiled."""
  summary = {'step': int(step), 'stop_reason': stop_reason,
             'step_compilations': int(train_step.jitted._cache_size()),  # pylint: disable=protected-access
             'wall_time_s': time.monotonic() - t_start}
  if summary['step_compilations'] > 1:
    logging.warning('The train step was compiled %d times (expected once).',
                    summary['step_compilations'])
  if jax.process_index() == 0:
    storage.write_text(storage.join(workdir, 'train_summary.json'), json.dumps(summary, indent=2))
  return summary


def _close_after_failure(bar: metrics_lib.Progress, writer: metrics_lib.MetricsWriter,
                         ckpt: ckpt_lib.Checkpointer) -> None:
  """Ends the outputs (bar, metric files, the save in flight) before a refused write's line."""
  bar.close()
  writer.close()
  ckpt.close_after_failure()


# ----------------------------------------------------------------------------- the loop


def train_and_evaluate(config: config_lib.Config, workdir: str, *, model: nn.Module,
                       train_iter: Any, eval_fn: EvalFn | None = None) -> dict[str, Any]:
  """Trains (resuming from DIR/checkpoints when present) and evaluates; returns final metrics.

  The caller (main.py) resolves the config (hmdlm_jax/config.py), initialises multi-host JAX and
  injects the task's network, data and evaluation: `model` is the network (tasks.build_model),
  `train_iter` this process's checkpointable iterator of training batches, `eval_fn(config, state,
  step, workdir)` the task's evaluation (None: none).

  Stops at train.num_steps; after train.time_budget_s of wall time in the loop (start-up such as
  puzzle generation excluded; checkpoint, final evaluation); on SIGTERM to any one process (every
  process stops at the same step, at most two steps later: checkpoint, return normally: exit code
  0); or after train.max_bad_steps consecutive non-finite steps (checkpoint,
  raise NonFiniteLossError). Rerunning the same command resumes from the latest checkpoint.
  The returned dict has step, stop_reason, step_compilations, wall_time_s (also written to
  DIR/train_summary.json), the last logged train metrics, the eval results and the final state.

  After train.max_bad_steps consecutive bad steps the loop logs the step already dispatched after
  the last bad one and saves a checkpoint of it (so every update the checkpoint holds has its line
  in metrics.jsonl; its parameters are those of the last good update unless that step was good)
  before raising. Likewise a checkpoint or an evaluation at step n waits for step n's metrics
  line, so a run killed at any point resumes with no step missing from metrics.jsonl.

  Outputs in DIR: metrics.jsonl + TensorBoard tb/ (hmdlm_jax/metrics.py); train_summary.json;
  checkpoints/ (hmdlm_jax/checkpoint.py); the scalars of each evaluation in metrics.jsonl with
  split='eval' (the evaluation hook writes its own report, evaluation/run.py). config.json/.yaml
  and runs.jsonl are written by main.py before this starts (hmdlm_jax/workdir.py).
  """
  t_start = time.monotonic()
  validate_config(config)
  is_main = jax.process_index() == 0
  tc = config.train
  num_steps = int(tc.num_steps)

  mesh = shd.make_mesh(config.mesh)
  micro = int(config.data.batch_size) // int(tc.grad_accum)
  if micro % shd.num_batch_shards(mesh):
    raise ValueError(f'data.batch_size={config.data.batch_size} / train.grad_accum='
                     f'{tc.grad_accum} = {micro} rows per micro-batch must be divisible by '
                     f'mesh.data * mesh.fsdp = {shd.num_batch_shards(mesh)}.')
  process = processes.build(config)
  optimizer = optim.for_run(config)
  abstract, shardings = state_shardings(config, model, mesh, optimizer)
  logging.info('Mesh %s; model:\n%s', dict(mesh.shape),
               models.param_count_report(config.model, model.features))

  ckpt = ckpt_lib.Checkpointer(workdir, tc)
  if ckpt.latest_step() is not None:
    state, _ = ckpt.restore(abstract, train_iter)
    logging.info('Resumed from %s', ckpt.step_dir(int(state.step)))
  else:
    state, _ = create_train_state(config, mesh, model)
  train_step = make_train_step(config, model, process, mesh, shardings)

  writer = metrics_lib.MetricsWriter(workdir, enabled=is_main, wandb=tc.wandb,
                                     record=workdir_lib.config_to_dict(config))
  step = int(jax.device_get(state.step))
  last_saved = step if ckpt.latest_step() == step else None
  tokens_per_step = int(config.data.batch_size) * int(config.model.seq_len)
  rate = metrics_lib.RateMeter(tokens_per_step, step)
  log_every, ckpt_every, eval_every = int(tc.log_every), int(tc.ckpt_every), int(tc.eval_every)
  budget = float(tc.time_budget_s)
  bar = progress.TrainBar(num_steps, step, budget_s=budget, enabled=is_main)
  max_bad = int(tc.max_bad_steps)
  last_train: dict[str, float] = {}
  eval_result: dict[str, Any] = {}
  stop_reason = 'num_steps'

  def save(at: int) -> None:
    nonlocal last_saved
    if last_saved != at:
      ckpt.save(at, state, train_iter, {'config': workdir_lib.config_to_dict(config)})
      last_saved = at

  def on_host(done_step: int, m: dict[str, jax.Array], *, force_log: bool = False) -> None:
    """Host side of step `done_step` (its metrics), run after the next step was dispatched."""
    nonlocal last_train
    bad = int(jax.device_get(m['bad_steps']))
    if bad:
      host = metrics_lib.to_scalars(m)
      logging.warning('Step %d: non-finite loss/gradients (loss=%s, grad_norm=%s): update '
                      'skipped (%d consecutive, %d in total).', done_step, host['loss'],
                      host['grad_norm'], bad, int(host['skipped_steps']))
    if done_step % log_every == 0 or done_step == num_steps or bad >= max_bad or force_log:
      host = metrics_lib.to_scalars(m)
      host.update(rate.update(done_step))
      writer.write(done_step, 'train', host)
      bar.postfix(done_step, loss=host['loss'], tok_s=host['tokens_per_s'])
      last_train = host
    if bad >= max_bad and not force_log:
      raise NonFiniteLossError(done_step)

  pending: tuple[int, dict[str, jax.Array]] | None = None
  # (signal number, over budget), the maximum over the processes: every process stops at the same
  # step, at most two steps after any one of them is signalled, whatever train.log_every is.
  vote = ckpt_lib.StopVote(num_flags=2)
  t_loop = time.monotonic()  # the time budget counts the loop, not start-up (data, init)
  try:
    with ckpt_lib.StopSignal() as stop_signal:
      while step < num_steps:
        local = process.prepare_batch(next(train_iter))
        batch = shd.make_global_batch(local, mesh)
        state, m = train_step(state, batch)
        step += 1
        bar.update()
        previous, pending = pending, (step, m)
        if previous is not None:
          on_host(*previous)
        ckpt_now = step % ckpt_every == 0 and step < num_steps
        eval_now = eval_every and step % eval_every == 0 and step < num_steps
        if ckpt_now or eval_now:  # never save or evaluate a step whose metrics are not written
          on_host(*pending)
          pending = None
        if ckpt_now:
          save(step)
        if eval_now:
          eval_result = run_evaluation(config, state, step, workdir, writer, eval_fn)
        signum, over_budget = vote.exchange(
            (stop_signal.received or 0, int(bool(budget) and time.monotonic() - t_loop > budget)))
        if signum:
          stop_reason = f'signal {signal.Signals(signum).name}'
          break
        if over_budget:
          stop_reason = f'time budget {budget:g}s'
          break
      if pending is not None:
        on_host(*pending)
        pending = None
  except write_errors.WriteError:
    _close_after_failure(bar, writer, ckpt)
    raise
  except NonFiniteLossError as e:
    if pending is not None and pending[0] != e.args[0]:  # the step dispatched after the bad one
      on_host(*pending, force_log=True)  # logged, as it is in the checkpoint saved now
    save(step)
    ckpt.close()
    bar.close()
    writer.close()
    _write_summary(workdir, step, 'non-finite loss', train_step, t_start)
    raise NonFiniteLossError(
        f'Training stopped at step {e.args[0]}: {max_bad} consecutive steps had a non-finite '
        f'loss or gradient (train.max_bad_steps={max_bad}); every one was skipped. The last good '
        f'state (step counter {step}) is saved in {ckpt.step_dir(step)}. Lower optim.lr, raise '
        'optim.warmup_steps or check the data.') from None

  bar.close()
  try:
    save(step)
    ckpt.wait()
    if stop_reason.startswith('signal'):
      msg = (f'Received {stop_reason[7:]} at step {step}: checkpoint saved to '
             f'{ckpt.step_dir(step)}; exiting cleanly. Rerun the same command to resume.')
      logging.warning(msg)
      print(msg, flush=True)
    else:
      if stop_reason != 'num_steps':
        logging.warning('Stopping at step %d: %s reached.', step, stop_reason)
      if tc.final_eval:
        eval_result = run_evaluation(config, state, step, workdir, writer, eval_fn)
    ckpt.close()
    writer.close()
    lease_lib.check_held()  # fenced: no summary from a run whose lease was taken over (lease.py)
    summary = _write_summary(workdir, step, stop_reason, train_step, t_start)
  except write_errors.WriteError:
    _close_after_failure(bar, writer, ckpt)
    raise
  return dict(summary, train=last_train, eval=eval_result, state=state)
