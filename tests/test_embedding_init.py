"""`init.embedding` (hmdlm_jax/warm_start.py, docs/method.md §13.1): the HDLM authors' start of
the input embedding alone. Word rows equal the table's, each cluster row the mean of its member
words' rows, the MASK row zero, every other parameter the fresh initialisation of the same seed
(bitwise); a wrong width, too few rows or a second source is one clear error."""

from __future__ import annotations

import sys

import jax
import numpy as np
import pytest

from hmdlm_jax import convert_mdlm
from hmdlm_jax import preflight
from hmdlm_jax import processes
from hmdlm_jax import sharding
from hmdlm_jax import tasks
from hmdlm_jax import train
from tests.conftest import run_cmd
from tests.test_hdlm_recipes import _tiny

WORDS, HIDDEN = 40, 32  # _tiny's vocabulary: words 0..39, MASK 40, clusters 41..44 (n = 4)
ERROR = 'hmdlm_jax: error: '


def _params(c) -> dict[str, np.ndarray]:
  model = tasks.get(c).build_model(c)
  preflight.check_init(c, model)
  state, _ = train.create_train_state(c, sharding.make_mesh(c.mesh), model)
  flat = convert_mdlm.flatten(jax.tree.map(np.asarray, state.params))
  ema = convert_mdlm.flatten(jax.tree.map(np.asarray, state.ema_params))
  for k, v in flat.items():
    np.testing.assert_array_equal(ema[k], v, err_msg=k)
  return flat


@pytest.mark.parametrize('option,key', [('', 'vocab_embed/embedding'), ('mdlm', 'table')])
def test_embedding_rows_and_the_rest_fresh(tmp_path, option, key):
  """n = 4 (a converted checkpoint's key, beside another array) and n = 1 (an .npz of one array
  under any name): the table has more rows than words; those beyond are ignored."""
  table = np.random.default_rng(0).normal(size=(WORDS + 7, HIDDEN)).astype(np.float32)
  path = str(tmp_path / 'table.npz')
  extra = {'other': np.zeros(3)} if key == 'vocab_embed/embedding' else {}
  np.savez(path, **{key: table}, **extra)
  fresh = _params(_tiny('hdlm_owt', option))
  got = _params(_tiny('hdlm_owt', option, embedding=path))
  assert got.keys() == fresh.keys()
  for k, v in got.items():
    if k != 'vocab_embed/embedding':
      np.testing.assert_array_equal(v, fresh[k], err_msg=k)  # the output head included
  emb = got['vocab_embed/embedding']
  np.testing.assert_array_equal(emb[:WORDS], table[:WORDS])
  np.testing.assert_array_equal(emb[WORDS], np.zeros(HIDDEN, np.float32))  # MASK
  if option == 'mdlm':
    assert emb.shape[0] == WORDS + 1  # n = 1: no cluster rows
    return
  lay = processes.build(_tiny('hdlm_owt', '')).layout
  cluster_of = lay.cluster_of[:WORDS]

  def centroids(assign: np.ndarray) -> np.ndarray:
    return np.stack([table[:WORDS][assign == c].astype(np.float64).mean(0) for c in range(4)])

  assert all((cluster_of == c).any() for c in range(4))
  np.testing.assert_allclose(emb[WORDS + 1:], centroids(cluster_of), rtol=1e-6, atol=1e-7)
  # Mutation: centroids of another assignment (every word in the next cluster) are not these rows.
  wrong = centroids((cluster_of + 1) % 4)
  assert not np.allclose(emb[WORDS + 1:], wrong, rtol=1e-3, atol=1e-4)


def test_tables_that_do_not_fit_are_refused(tmp_path):
  wide = str(tmp_path / 'wide.npz')
  np.savez(wide, t=np.zeros((WORDS, 16), np.float32))
  c = _tiny('hdlm_owt', '', embedding=wide)
  with pytest.raises(ValueError, match=r"init.embedding=.*wide.npz': the table has dimension 16 "
                     r'but model.hidden_size=32'):
    preflight.check_init(c, tasks.get(c).build_model(c))
  short = str(tmp_path / 'short.npz')
  np.savez(short, t=np.zeros((WORDS - 1, HIDDEN), np.float32))  # word 39 has no row
  c = _tiny('hdlm_owt', '', embedding=short)
  with pytest.raises(ValueError, match=r'the table has 39 rows but the word ids go up to 39'):
    preflight.check_init(c, tasks.get(c).build_model(c))
  two = str(tmp_path / 'two.npz')
  np.savez(two, a=np.zeros((WORDS, HIDDEN)), b=np.zeros((WORDS, HIDDEN)))
  c = _tiny('hdlm_owt', '', embedding=two)
  with pytest.raises(ValueError, match=r"holds no 'vocab_embed/embedding' array but 2 others"):
    preflight.check_init(c, tasks.get(c).build_model(c))
  with pytest.raises(ValueError, match=r'init.embedding=.* must be an existing .npz'):
    _tiny('hdlm_owt', '', embedding=str(tmp_path / 'none.npz'))


def test_cli_errors_are_one_line(tmp_path, jax_cache):
  """Through the entry point: a table of another width (preflight, before training) and a second
  init source (config resolution) each end the run with one `hmdlm_jax: error:` line, exit 1."""
  wide = str(tmp_path / 'wide.npz')
  np.savez(wide, t=np.zeros((4, 16), np.float32))
  base = [sys.executable, '-m', 'hmdlm_jax.main', '--config=configs/hdlm_text.py',
          '--config.model.num_layers=1', f'--config.model.hidden_size={HIDDEN}',
          '--config.model.num_heads=2', '--config.model.mlp_dim=64', '--config.model.cond_dim=16',
          '--config.data.batch_size=4', '--config.train.num_steps=1',
          f'--config.init.embedding={wide}']
  cases = [([f'--workdir={tmp_path / "a"}'], ('the table has dimension 16 but '
                                             f'model.hidden_size={HIDDEN}',)),
           ([f'--workdir={tmp_path / "b"}', f'--config.init.mdlm_checkpoint={wide}'],
            ('init.embedding and init.mdlm_checkpoint are both set',))]
  for flags, words in cases:
    proc = run_cmd(base + flags, jax_cache, timeout=300)
    lines = [l for l in proc.stderr.splitlines() if l.startswith(ERROR)]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    assert 'init.embedding' in lines[0] and all(w in lines[0] for w in words), lines[0]
    assert 'Traceback' not in proc.stderr
    assert not (tmp_path / flags[0].split('/')[-1]).exists()  # nothing written
