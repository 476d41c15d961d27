"""Training: the jitted train step and the train/eval loop (the state: train_state.py, whose
`TrainState`, `state_shardings`, `create_train_state` and `restore_for_eval` are re-exported here).

The train step is one `jax.jit` with explicit in/out shardings and the state donated; the host
loop reads the metrics of step n only after step n+1 has been dispatched, so the device never
waits for Python.
A step whose loss or gradient norm is not finite is skipped inside the step (`_guarded_update`
says how it is counted, `train_and_evaluate` when the loop stops); `train.debug_nan_steps` injects
such steps for tests (hmdlm_jax/faults.py, applied by `train_and_evaluate` to the process).

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
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from hmdlm_jax import accumulate
from hmdlm_jax import checkpoint as ckpt_lib
from hmdlm_jax import config as config_lib
from hmdlm_jax import faults
from hmdlm_jax import lease as lease_lib
from hmdlm_jax import metrics as metrics_lib
from hmdlm_jax import models
from hmdlm_jax import optim
from hmdlm_jax import processes
from hmdlm_jax import progress
from hmdlm_jax import sharding as shd
from hmdlm_jax import storage
from hmdlm_jax import train_state
from hmdlm_jax import workdir as workdir_lib
from hmdlm_jax import write_errors

BATCH_KEYS = processes.base.BATCH_KEYS
PyTree = Any
TrainState = train_state.TrainState
state_shardings = train_state.state_shardings
create_train_state = train_state.create_train_state
restore_for_eval = train_state.restore_for_eval


class NonFiniteLossError(RuntimeError):
  """Raised by the loop after `train.max_bad_steps` consecutive non-finite steps."""


# ----------------------------------------------------------------------------- config


def validate_config(config: config_lib.Config) -> None:
  """What the config alone cannot tell: the batch against the process count (ValueError)."""
  t = config.train
  b = int(config.data.batch_size)
  if b % (t.grad_accum * jax.process_count()):
    raise ValueError(f'data.batch_size={b} must be a positive multiple of train.grad_accum='
                     f'{t.grad_accum} times the process count {jax.process_count()}.')
  faults.check_steps(t.debug_nan_steps)


# ----------------------------------------------------------------------------- step


def _guarded_update(state: TrainState, grads: PyTree, ok: jax.Array,
                    optimizer: optax.GradientTransformation, optim_cfg: Any) -> TrainState:
  """The NaN/Inf guard: the state after one step, its update applied only when `ok`.

  `ok` is False when the loss or the gradient norm is not finite (a finite gradient norm keeps
  Adam's moments and the update finite). Then the update is skipped — params, EMA and optimiser
  state keep their values — while `step` still advances (the batch is consumed and the per-step
  key is fold_in(rng, step), so the data order and the random stream go on exactly as without the
  bad step), and `bad_steps` (consecutive) and `skipped_steps` (total) count it. `step` therefore
  counts batches consumed, and the optimiser's own count (which drives the lr schedule) counts
  applied updates. The skip is one lax.cond, so AdamW + EMA run as their own fused loops with no
  where(ok, new, old) pass (benchmarks/README.md, "the NaN guard as one `lax.cond`").
  """
  decay = optim.ema_decay_at(optim_cfg, state.step - state.skipped_steps)  # n applied before

  def apply(old: tuple[PyTree, PyTree, PyTree]) -> tuple[PyTree, PyTree, PyTree]:
    params, ema_params, opt_state = old
    updates, new_opt = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    return new_params, optim.ema_update(ema_params, new_params, decay), new_opt

  new_params, new_ema, new_opt = jax.lax.cond(
      ok, apply, lambda old: old, (state.params, state.ema_params, state.opt_state))
  return TrainState(
      step=state.step + 1, params=new_params, ema_params=new_ema, opt_state=new_opt,
      rng=state.rng, bad_steps=jnp.where(ok, 0, state.bad_steps + 1).astype(jnp.int32),
      skipped_steps=(state.skipped_steps + jnp.where(ok, 0, 1)).astype(jnp.int32))


def make_train_step(config: config_lib.Config, model: nn.Module,
                    process: processes.Process, mesh: jax.sharding.Mesh,
                    shardings: TrainState | None = None) -> Callable[..., Any]:
  """The jitted step `(state, batch) -> (state, metrics)`; `state` is donated.

  batch: BATCH_KEYS + `process.extra_batch_keys`, [B, L] global arrays sharded by
  `sharding.batch_sharding(mesh)`. metrics: float32 scalars (replicated): the loss terms of
  `process.loss`, `optim.grad_metrics`, lr, update_ok, bad_steps, skipped_steps. The loss reads
  the target network at `process.target_params` when `process.uses_target`. A step whose loss or
  gradient norm is not finite is skipped and counted (`_guarded_update`). train.grad_accum > 1
  splits the batch into micro-batches inside the step (`accumulate.value_and_grad`). The
  returned callable has `.jitted` (the `jax.jit` object, e.g. for `_cache_size()`).
  """
  optimizer = optim.for_run(config)
  process = process.for_devices(mesh.size)  # e.g. loss.token_rows='auto' -> this mesh's choice
  if shardings is None:
    _, shardings = state_shardings(config, model, mesh, optimizer)
  accum, optim_cfg = int(config.train.grad_accum), config.optim

  def loss_fn(params: PyTree, batch: Mapping[str, jax.Array], key: jax.Array, step: jax.Array,
              target_params: PyTree) -> tuple[jax.Array, dict[str, jax.Array]]:
    loss_key, dropout_key = jax.random.split(key)
    apply_fn = models.make_apply_fn(model, params, train=True, rng=dropout_key)
    target = (models.make_apply_fn(model, jax.lax.stop_gradient(target_params), train=False)
              if process.uses_target else None)
    return process.loss(apply_fn, batch, loss_key, step=step, target_apply_fn=target)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step_fn(state: TrainState, batch: Mapping[str, jax.Array]
              ) -> tuple[TrainState, dict[str, jax.Array]]:
    chex.assert_rank([batch[k] for k in BATCH_KEYS], 2)
    chex.assert_equal_shape([batch[k] for k in BATCH_KEYS])
    chex.assert_type([batch['tokens'], batch['levels'], batch['given'], batch['loss_mask']],
                     [jnp.int32, jnp.int32, jnp.bool_, jnp.bool_])
    key = jax.random.fold_in(state.rng, state.step)
    target = process.target_params(state.params, state.ema_params, state.opt_state)
    loss, aux, grads = accumulate.value_and_grad(grad_fn, state.params, batch, key, accum,
                                                 state.step, target)
    grad_metrics = optim.grad_metrics(optim_cfg, grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_metrics['grad_norm'])
    new = _guarded_update(state, grads, ok, optimizer, optim_cfg)
    out = {k: jnp.asarray(v, jnp.float32) for k, v in dict(aux, **grad_metrics).items()}
    out.update(loss=loss.astype(jnp.float32), lr=optim.current_lr(new.opt_state),
               update_ok=ok.astype(jnp.float32), bad_steps=new.bad_steps.astype(jnp.float32),
               skipped_steps=new.skipped_steps.astype(jnp.float32))
    return new, out

  keys, rep = BATCH_KEYS + tuple(process.extra_batch_keys), shd.replicated(mesh)
  jitted = jax.jit(step_fn, in_shardings=(shardings, shd.batch_sharding(mesh)),
                   out_shardings=(shardings, rep), donate_argnums=0)

  def train_step(state: TrainState, batch: Mapping[str, jax.Array]
                 ) -> tuple[TrainState, dict[str, jax.Array]]:
    with shd.mesh_context(mesh):
      return jitted(state, {k: batch[k] for k in keys})

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
  Fault injection for tests of that guard: `train.debug_nan_steps` lists (0-based) steps whose
  loss is multiplied by NaN; the process is wrapped here (faults.with_nan_steps), not in the step.
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
  train_step = make_train_step(config, model, faults.with_nan_steps(process, tc.debug_nan_steps),
                               mesh, shardings)

  writer = metrics_lib.MetricsWriter(workdir, enabled=is_main, wandb=tc.wandb,
                                     record=workdir_lib.config_to_dict(config))
  step = int(jax.device_get(state.step))
  last_saved = step if ckpt.latest_step() == step else None
  tokens_per_step = int(config.data.batch_size) * int(config.model.seq_len)
  rate = metrics_lib.RateMeter(tokens_per_step, step)
  log_every, ckpt_every, eval_every = int(tc.log_every), int(tc.ckpt_every), int(tc.eval_every)
  budget = float(tc.time_budget_s)
  bar = progress.TrainBar(num_steps, step, budget_s=budget, enabled=is_main,
                          tokens_per_step=tokens_per_step)
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
    bad, loss = jax.device_get((m['bad_steps'], m['loss']))  # one fetch: the step has finished
    bad = int(bad)
    bar.finished(done_step, float(loss))
    if bad:
      host = metrics_lib.to_scalars(m)
      logging.warning('Step %d: non-finite loss/gradients (loss=%s, grad_norm=%s): update '
                      'skipped (%d consecutive, %d in total).', done_step, host['loss'],
                      host['grad_norm'], bad, int(host['skipped_steps']))
    if done_step % log_every == 0 or done_step == num_steps or bad >= max_bad or force_log:
      host = metrics_lib.to_scalars(m)
      host.update(rate.update(done_step))
      writer.write(done_step, 'train', host)
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
