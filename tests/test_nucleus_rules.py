"""The two nucleus rules (sample.nucleus; docs/method.md §8.5) against their closed forms.

'inclusive' keeps v iff the tokens more probable than v hold less than top_p (the token crossing
top_p stays); 'exclusive' keeps v iff they and v hold at most top_p (ReMDM's and ADLM's code: a
sorted cumulative sum <= top_p, the first token always kept), re-derived here in float64 numpy
from that sorted-cumsum code and, on a four-token law, by hand.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from hmdlm_jax import config as config_lib
from hmdlm_jax.processes import base


def _exclusive_reference(logits: np.ndarray, top_p: float) -> np.ndarray:
  """bool [..., V]: the authors' rule: sort descending, keep cumsum <= top_p, keep the first."""
  x = logits.astype(np.float64)
  p = np.exp(x - x.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  order = np.argsort(-p, axis=-1, kind='stable')
  cum = np.cumsum(np.take_along_axis(p, order, -1), -1)
  keep_sorted = cum <= top_p
  keep_sorted[..., 0] = True
  out = np.zeros(p.shape, bool)
  np.put_along_axis(out, order, keep_sorted, -1)
  return out


@pytest.mark.parametrize('vocab', [12, 300])
@pytest.mark.parametrize('top_p', [0.05, 0.5, 0.9, 0.999])
def test_exclusive_keeps_exactly_the_authors_set(vocab, top_p):
  logits = np.random.default_rng(vocab).normal(0.0, 2.0, (5, 7, vocab)).astype(np.float32)
  got = np.isfinite(np.asarray(base.nucleus_logits(jnp.asarray(logits), top_p, exclusive=True)))
  want = _exclusive_reference(logits, top_p)
  np.testing.assert_array_equal(got, want)
  inclusive = np.isfinite(np.asarray(base.nucleus_logits(jnp.asarray(logits), top_p)))
  assert (inclusive >= want).all()  # exclusive is inside inclusive
  assert ((inclusive.sum(-1) - want.sum(-1)) <= 1).all()  # at most the crossing token differs
  if 0.1 < top_p < 0.999:
    assert (inclusive.sum(-1) > want.sum(-1)).any()  # and it does differ


@pytest.mark.parametrize('top_p,inclusive,exclusive', [
    (0.65, [1, 1, 0, 0], [1, 0, 0, 0]),  # 0.4 + 0.3 crosses 0.65: kept, dropped
    (0.3, [1, 0, 0, 0], [1, 0, 0, 0]),  # 0.4 alone crosses 0.3: kept by both (the top token)
    (0.95, [1, 1, 1, 1], [1, 1, 1, 0]),
])
def test_both_rules_on_a_law_by_hand(top_p, inclusive, exclusive):
  logits = jnp.log(jnp.asarray([[0.4, 0.3, 0.2, 0.1]], jnp.float32))
  for flag, want in ((False, inclusive), (True, exclusive)):
    got = np.isfinite(np.asarray(base.nucleus_logits(logits, top_p, exclusive=flag)))
    np.testing.assert_array_equal(got, [np.asarray(want, bool)], err_msg=f'exclusive={flag}')


def test_the_rule_reaches_the_draws_and_is_validated():
  """A law whose crossing token is the second: exclusive draws only the first."""
  logp = jnp.log(jnp.asarray([[[0.6, 0.3, 0.1]]], jnp.float32))
  import jax  # pylint: disable=g-import-not-at-top
  keys = jax.random.split(jax.random.key(0), 200)
  for rule, allowed in (('inclusive', {0, 1}), ('exclusive', {0})):
    cfg = config_lib.SampleConfig(num_steps=1, num_levels=1, mask_id=3, top_p=0.8, nucleus=rule)
    draws = {int(base.draw_tokens(k, logp, cfg)[0, 0]) for k in keys}
    assert draws == allowed, (rule, draws)
  with pytest.raises(ValueError, match="sample.nucleus must be one of .'inclusive', 'exclusive'."):
    config_lib.SampleConfig(num_steps=1, num_levels=1, mask_id=3, nucleus='hf')
